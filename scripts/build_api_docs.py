"""Build the API reference of the four packages from their docstrings with pdoc.

    python scripts/build_api_docs.py [--out DIR]

Renders every public module (no leading underscore) of ``rlinf.comm``, ``rlinf.sched``,
``rlinf.envs`` and ``rlinf.workers`` into ``DIR`` (default ``build/api``) and fails (exit 1)
when a public module cannot be imported or a page is missing, so CI notices a module that
breaks the reference. Modules behind an optional extra that is not installed (vLLM, SGLang,
ManiSkill3) are listed and skipped.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import warnings
from pathlib import Path

PACKAGES = ("rlinf.comm", "rlinf.sched", "rlinf.envs", "rlinf.workers")
OPTIONAL = ("vllm", "sglang", "mani_skill", "libero")
"""Top-level imports of optional extras: a module that needs a missing one is skipped."""


def public_modules(package: str) -> list[str]:
    """`package` and every public module below it, depth first."""
    root = importlib.import_module(package)
    found = [package]
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            found.append(info.name)
    return found


def importable(names: list[str]) -> tuple[list[str], list[str]]:
    """Split `names` into modules that import and modules that need a missing extra; any
    other import error is raised (it would break the reference)."""
    ok, skipped = [], []
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.split(".")[0] not in OPTIONAL:
                raise
            skipped.append(f"{name} (needs {exc.name})")
            continue
        ok.append(name)
    return ok, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/api"),
                        help="output folder (default: build/api)")
    args = parser.parse_args(argv)
    import pdoc

    # Subpackages are named explicitly as well as found by pdoc's own walk (one page each);
    # the lazily imported names (module __getattr__) of rlinf.sched and of
    # rlinf.workers.{models,rollout,reasoning} are documented on their defining module's page.
    warnings.filterwarnings("ignore", message=".*adds a module named.*")
    warnings.filterwarnings(
        "ignore", message=r"Found '\w+' in rlinf\.(sched|workers\.(models|rollout|reasoning))"
                          r"\.__all__")
    modules, skipped = importable([m for p in PACKAGES for m in public_modules(p)])
    pdoc.pdoc(*modules, output_directory=args.out)
    missing = [m for m in modules if not (args.out / (m.replace(".", "/") + ".html")).is_file()]
    for name in skipped:
        print(f"skipped: {name}")
    if missing:
        print(f"error: no page for {missing}", file=sys.stderr)
        return 1
    print(f"API reference: {len(modules)} modules in {args.out}/index.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
