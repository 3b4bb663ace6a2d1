"""scripts/check_imports.py on small synthetic checkouts, and on this one."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "check_imports.py"



@pytest.fixture(scope="module")
def checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_imports", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while defining
    spec.loader.exec_module(module)
    return module


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


COMM = "packages/rlinf-comm/src/rlinf/comm"
SCHED = "packages/rlinf-sched/src/rlinf/sched"
WORKERS = "packages/rlinf-workers/src/rlinf/workers"


def base_tree() -> dict[str, str]:
    return {
        f"{COMM}/__init__.py": "from rlinf.comm._internal.wire import Connection\n"
                               "__all__ = ['Connection']\n",
        f"{COMM}/_internal/__init__.py": "",
        f"{COMM}/_internal/wire.py": "class Connection: ...\n",
        f"{COMM}/wire.py": "from rlinf.comm._internal.wire import Connection\n"
                           "__all__ = ['Connection']\n",
        f"{SCHED}/__init__.py": "",
        f"{SCHED}/_files.py": "def load(): ...\n",
        f"{SCHED}/uses_public.py": "from rlinf.comm.wire import Connection\n",
        f"{WORKERS}/__init__.py": "",
    }


def messages(checker: ModuleType, root: Path) -> list[str]:
    _, violations = checker.check_tree(root)
    return [str(v) for v in violations]


def test_a_clean_tree_passes(checker: ModuleType, tmp_path: Path) -> None:
    root = write_tree(tmp_path, base_tree())
    assert messages(checker, root) == []
    assert checker.main(["--root", str(root)]) == 0


def test_other_packages_private_modules_and_names_are_refused(
    checker: ModuleType, tmp_path: Path
) -> None:
    files = base_tree()
    files[f"{SCHED}/lock.py"] = """\
        from rlinf.comm._internal.wire import Connection
        from rlinf.comm import _internal
        from rlinf.sched._files import load  # its own private module: fine


        def token() -> None:
            import rlinf.comm._internal.wire  # lazily: still private
        """
    files[f"{WORKERS}/sync.py"] = "from rlinf.sched._files import load\n"
    root = write_tree(tmp_path, files)
    found = messages(checker, root)
    assert len(found) == 4, found
    assert all("private" in m for m in found)
    lock = [m for m in found if m.startswith(f"{SCHED}/lock.py:")]
    assert [int(m.split(":")[1]) for m in lock] == [1, 2, 7]
    assert "rlinf.comm's private '_internal'" in lock[0]
    assert any(m.startswith(f"{WORKERS}/sync.py:1:") and "rlinf.sched's private '_files'" in m
               for m in found)
    assert checker.main(["--root", str(root)]) == 1


def test_a_module_named_like_an_exported_function_is_refused(
    checker: ModuleType, tmp_path: Path
) -> None:
    files = base_tree()
    files[f"{SCHED}/__init__.py"] = """\
        from rlinf.sched.plan import ExecutionPlan
        from rlinf.sched.planner import plan
        from rlinf.sched.workflow import Workflow

        __all__ = ["ExecutionPlan", "Workflow", "plan"]
        """
    files[f"{SCHED}/plan.py"] = "class ExecutionPlan: ...\n"
    files[f"{SCHED}/planner/__init__.py"] = "from .search import plan\n"
    files[f"{SCHED}/planner/search.py"] = "def plan() -> None: ...\n"
    files[f"{SCHED}/workflow.py"] = "class Workflow: ...\n"
    root = write_tree(tmp_path, files)
    found = messages(checker, root)
    assert found == [
        f"{SCHED}/plan.py:1: module rlinf.sched.plan shares its name with the function "
        f"rlinf.sched.plan exported by {SCHED}/__init__.py:5: rename the module"
    ]
    # A class exported under its module's name (Workflow in workflow.py) is not the rule's
    # business, and a renamed module clears it.
    (root / SCHED / "plan.py").rename(root / SCHED / "execution_plan.py")
    (root / SCHED / "__init__.py").write_text(
        (root / SCHED / "__init__.py").read_text().replace("sched.plan ", "sched.execution_plan "))
    assert messages(checker, root) == []


def test_dependency_direction_and_lazy_extras_still_checked(
    checker: ModuleType, tmp_path: Path
) -> None:
    files = base_tree()
    files[f"{COMM}/bad.py"] = "import torch\nfrom rlinf.sched import uses_public\n"
    root = write_tree(tmp_path, files)
    found = messages(checker, root)
    assert len(found) == 2, found
    assert any("optional dependency 'torch'" in m for m in found)
    assert any("rlinf.comm may not import rlinf.sched" in m for m in found)


def test_this_checkout() -> None:
    # Runs as tox does: the repository itself has no violation.
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          timeout=120, check=False)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert lines and lines[-1].startswith("check_imports: "), proc.stdout
