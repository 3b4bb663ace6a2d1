#!/usr/bin/env bash
# Set up a development environment on a fresh machine: .venv with tox and every package of
# the monorepo installed editable. Idempotent; safe to run again.
#
# Usage: bash scripts/bootstrap.sh           .venv with tox and every package
#        bash scripts/bootstrap.sh --tests   .venv with tox only: the tests run in tox's own
#                                            envs, so the packages' install (minutes) is skipped
set -euo pipefail
case "${1:-}" in
  "") tests_only=0 ;;
  --tests) tests_only=1 ;;
  *) echo "bootstrap: unknown option '$1' (expected nothing, or --tests for tox alone)" >&2
     exit 2 ;;
esac
cd "$(dirname "$0")/.."
export PIP_CONSTRAINT="$PWD/constraints.txt" PIP_DISABLE_PIP_VERSION_CHECK=1
# pip caches wheels built from our local directories by URL; a stale one would shadow the tree.
export PIP_CACHE_DIR="$PWD/.venv/pip-cache"

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "tox>=4.20"
if [ "$tests_only" = 1 ]; then
  echo "bootstrap: .venv ready with tox ($(.venv/bin/python --version)); run .venv/bin/tox"
  exit 0
fi
# Two passes: a normal install resolves every dependency (sibling packages are direct
# references), then editable installs without dependencies put the source trees in place.
targets=()
for dir in packages/rlinf-comm packages/rlinf-sched packages/rlinf-envs packages/rlinf-workers apps/*; do
  [ -f "$dir/pyproject.toml" ] && targets+=("$dir")
done
.venv/bin/python -m pip install -q "${targets[@]/%/[dev]}"
for dir in "${targets[@]}"; do
  .venv/bin/python -m pip install -q --no-deps -e "$dir"
done
echo "bootstrap: .venv ready ($(.venv/bin/python --version))"
