"""Check the import direction between RLinf packages (DESIGN.md §2).

Parses every module under packages/*/src and apps/*/src and fails when a module imports a
package of ours that its own package may not depend on, or imports a heavy dependency at
module level that its package keeps optional.

Usage: python scripts/check_imports.py
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Which of our top-level packages each package may import.
ALLOWED: dict[str, frozenset[str]] = {
    "comm": frozenset(),
    "envs": frozenset(),
    "sched": frozenset({"comm"}),
    "workers": frozenset({"comm", "sched", "envs"}),
    "apps": frozenset({"comm", "sched", "envs", "workers"}),
}
OURS = frozenset(ALLOWED)

# Third-party modules a package must never import at module level (only lazily, inside a
# function), so that `import rlinf.<pkg>` works without the extra installed.
LAZY_ONLY: dict[str, frozenset[str]] = {
    "comm": frozenset({"torch", "cupy", "ray", "pynvml"}),
    "sched": frozenset({"torch", "cupy", "ray", "pynvml", "matplotlib"}),
    "envs": frozenset({"torch", "mani_skill", "libero", "robosuite", "math_verify"}),
    "workers": frozenset({"vllm", "sglang", "megatron", "cupy"}),
}


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {self.message}"


def _package_of(path: Path) -> str:
    parts = path.relative_to(ROOT).parts
    if parts[0] == "apps":
        return "apps"
    # packages/rlinf-<pkg>/src/rlinf/<pkg>/...
    return parts[1].removeprefix("rlinf-")


def _imported_modules(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    return []


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _module_level_imports(tree: ast.Module) -> list[ast.stmt]:
    """Imports executed at import time: top level, including try/if bodies."""
    found: list[ast.stmt] = []
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            found.append(stmt)
        elif isinstance(stmt, ast.If) and not _is_type_checking_block(stmt):
            stack.extend(stmt.body + stmt.orelse)
        elif isinstance(stmt, ast.Try):
            stack.extend(stmt.body)
    return found


def check_file(path: Path) -> list[Violation]:
    package = _package_of(path)
    tree = ast.parse(path.read_text(), filename=str(path))
    violations: list[Violation] = []
    for node in ast.walk(tree):
        for module in _imported_modules(node):
            parts = module.split(".")
            if parts[0] == "rlinf" and len(parts) > 1 and parts[1] in OURS:
                target = parts[1]
                if target != package and target not in ALLOWED[package]:
                    violations.append(Violation(
                        path, node.lineno,
                        f"rlinf.{package} may not import rlinf.{target} "
                        f"(allowed: {sorted(ALLOWED[package]) or 'none'})"))
    lazy = LAZY_ONLY.get(package, frozenset())
    for node in _module_level_imports(tree):
        for module in _imported_modules(node):
            if module.split(".")[0] in lazy:
                violations.append(Violation(
                    path, node.lineno,
                    f"module-level import of optional dependency {module!r}; "
                    "import it inside the function that needs it"))
    return violations


def main() -> int:
    files = sorted(ROOT.glob("packages/*/src/**/*.py")) + sorted(ROOT.glob("apps/*/src/**/*.py"))
    violations = [v for f in files for v in check_file(f)]
    for violation in violations:
        print(violation)
    print(f"check_imports: {len(files)} modules, {len(violations)} violations")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
