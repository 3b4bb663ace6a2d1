#!/usr/bin/env bash
# Fetch Mesa's software Vulkan driver (lavapipe, Mesa 25 from Debian bookworm-backports)
# into a private prefix, without touching the system's packages, so ManiSkill3/SAPIEN can
# create its render device on a CPU-only Debian 12 machine (bookworm's own Mesa 22.3 fails
# with "failed to find a rendering device"; with no Vulkan driver at all SAPIEN fails with
# "vk::createInstanceUnique: ErrorIncompatibleDriver").
#
# Usage: bash packages/rlinf-envs/scripts/fetch-lavapipe.sh [PREFIX]   (default /tmp/lavapipe)
#        then export the two variables it prints before running ManiSkill.
# Needs network access to deb.debian.org and dpkg/apt-get (Debian 12). Uses its own apt
# lists under PREFIX, so the system's apt state is left as it was.
set -euo pipefail
prefix="${1:-/tmp/lavapipe}"
apt_dir="$prefix/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs" "$prefix/root"
cat > "$apt_dir/sources.list" <<'LIST'
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-backports main
LIST
opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
      -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
      -o "Debug::NoLocking=1")
apt-get "${opts[@]}" -qq update
cd "$apt_dir/debs"
apt-get "${opts[@]}" -qq download \
  mesa-vulkan-drivers/bookworm-backports mesa-libgallium/bookworm-backports \
  libdrm2/bookworm-backports libdrm-common/bookworm-backports libvulkan1
for deb in ./*.deb; do dpkg -x "$deb" "$prefix/root"; done
lib="$prefix/root/usr/lib/x86_64-linux-gnu"
icd="$prefix/root/usr/share/vulkan/icd.d/lvp_icd.json"
test -f "$icd" && test -f "$lib/libvulkan_lvp.so"
echo "export VK_ICD_FILENAMES=$icd"
echo "export LD_LIBRARY_PATH=$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
