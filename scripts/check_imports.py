"""Check the boundaries between RLinf packages (DESIGN.md §2, docs/architecture.md).

Parses every module under packages/*/src and apps/*/src and fails when

- a module imports a package of ours that its own package may not depend on;
- a module imports another package's private parts: a module whose dotted name has a
  ``_``-prefixed part (``rlinf.comm._internal.wire``, ``rlinf.sched._discovery``) or a
  ``_``-prefixed name (``from rlinf.sched import _files``); a package's own private
  modules are its business;
- a module shares its name with a public function its package's ``__init__`` exports
  (``rlinf/sched/plan.py`` beside the function ``rlinf.sched.plan``): after
  ``import rlinf.sched.plan`` the name means two things;
- a module imports a heavy dependency at module level that its package keeps optional.

Usage: python scripts/check_imports.py [--root DIR]
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator, Sequence
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
    """The offending file, relative to the checked root."""
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


class Tree:
    """The source files of one checkout and the dotted module names they define."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.src_roots = sorted(root.glob("packages/*/src")) + sorted(root.glob("apps/*/src"))
        self.files: list[Path] = []
        self._modules: dict[str, Path] = {}
        self._trees: dict[Path, ast.Module] = {}
        for src in self.src_roots:
            for path in sorted(src.rglob("*.py")):
                self.files.append(path)
                parts = list(path.relative_to(src).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                if parts:
                    self._modules[".".join(parts)] = path

    def parse(self, path: Path) -> ast.Module:
        if path not in self._trees:
            self._trees[path] = ast.parse(path.read_text(), filename=str(path))
        return self._trees[path]

    def module_file(self, name: str) -> Path | None:
        return self._modules.get(name)

    def module_name(self, path: Path) -> str:
        src = next(s for s in self.src_roots if path.is_relative_to(s))
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)

    def package_of(self, path: Path) -> str:
        """The key in ALLOWED: ``apps`` or the package name (``sched`` for rlinf-sched)."""
        parts = path.relative_to(self.root).parts
        if parts[0] == "apps":
            return "apps"
        # packages/rlinf-<pkg>/src/rlinf/<pkg>/...
        return parts[1].removeprefix("rlinf-")

    def owner(self, module: str) -> str | None:
        """Which distribution of ours defines `module` (``rlinf.comm``, ``rlinf_reasoning``)."""
        parts = module.split(".")
        if parts[0] == "rlinf":
            return f"rlinf.{parts[1]}" if len(parts) > 1 and parts[1] in OURS else None
        if any((src / parts[0]).is_dir() for src in self.src_roots):
            return parts[0]
        return None

    def relative(self, path: Path) -> Path:
        return path.relative_to(self.root)


def _imported_modules(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    return []


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


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


def _top_level(tree: ast.Module) -> Iterator[ast.stmt]:
    """Statements that bind module attributes, in order (if/try bodies included)."""
    stack: list[ast.stmt] = list(reversed(tree.body))
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, ast.If | ast.Try):
            nested = list(stmt.body) + list(stmt.orelse)
            if isinstance(stmt, ast.Try):
                nested += [s for h in stmt.handlers for s in h.body] + list(stmt.finalbody)
            stack.extend(reversed(nested))
        else:
            yield stmt


def _absolute(module: str, node: ast.ImportFrom, *, is_package: bool) -> str:
    """The absolute module an ``ImportFrom`` in `module` names (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _is_function(tree: Tree, module: str, name: str, depth: int = 0) -> bool:
    """Whether `module`'s attribute `name` is a function (following re-exports)."""
    path = tree.module_file(module)
    if path is None or depth > 8:
        return False
    verdict = False
    for stmt in _top_level(tree.parse(path)):
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.name == name:
            verdict = True
        elif isinstance(stmt, ast.ClassDef) and stmt.name == name:
            verdict = False
        elif isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if (alias.asname or alias.name) == name:
                    source = _absolute(module, stmt, is_package=path.name == "__init__.py")
                    verdict = _is_function(tree, source, alias.name, depth + 1)
        elif isinstance(stmt, ast.Import):
            if any((a.asname or a.name.split(".")[0]) == name for a in stmt.names):
                verdict = False
        elif isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                verdict = False
    return verdict


def _public_names(init: ast.Module) -> list[tuple[str, int]]:
    """Names an ``__init__`` exports, with the line that declares them: its ``__all__``, else
    every public name it binds."""
    for stmt in _top_level(init):
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets
        ):
            try:
                names = ast.literal_eval(stmt.value)
            except ValueError:
                break
            return [(str(n), stmt.lineno) for n in names]
    found: list[tuple[str, int]] = []
    for stmt in _top_level(init):
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.append((stmt.name, stmt.lineno))
        elif isinstance(stmt, ast.ImportFrom):
            found += [(a.asname or a.name, stmt.lineno) for a in stmt.names]
    return [(n, line) for n, line in found if not n.startswith("_")]


def check_boundaries(tree: Tree, path: Path) -> list[Violation]:
    """Dependency direction and other packages' private modules and names."""
    package = tree.package_of(path)
    own = tree.owner(tree.module_name(path))
    rel = tree.relative(path)
    violations: list[Violation] = []
    imports = [n for n in ast.walk(tree.parse(path)) if isinstance(n, ast.Import | ast.ImportFrom)]
    for node in imports:
        for module in _imported_modules(node):
            parts = module.split(".")
            if parts[0] == "rlinf" and len(parts) > 1 and parts[1] in OURS:
                target = parts[1]
                if target != package and target not in ALLOWED[package]:
                    violations.append(Violation(
                        rel, node.lineno,
                        f"rlinf.{package} may not import rlinf.{target} "
                        f"(allowed: {sorted(ALLOWED[package]) or 'none'})"))
            owner = tree.owner(module)
            if owner is None or owner == own:
                continue
            private = [p for p in parts if _is_private(p)]
            if isinstance(node, ast.ImportFrom):
                private += [a.name for a in node.names if _is_private(a.name)]
            if private:
                violations.append(Violation(
                    rel, node.lineno,
                    f"import of {owner}'s private {'/'.join(private)!r} (in {module!r}): "
                    f"use {owner}'s public API, or make what you need public there"))
    lazy = LAZY_ONLY.get(package, frozenset())
    for stmt in _module_level_imports(tree.parse(path)):
        for module in _imported_modules(stmt):
            if module.split(".")[0] in lazy:
                violations.append(Violation(
                    rel, stmt.lineno,
                    f"module-level import of optional dependency {module!r}; "
                    "import it inside the function that needs it"))
    return violations


def check_module_names(tree: Tree, init: Path) -> list[Violation]:
    """Modules of `init`'s package named like a public function the package exports."""
    package = tree.module_name(init)
    violations: list[Violation] = []
    for name, line in _public_names(tree.parse(init)):
        module = tree.module_file(f"{package}.{name}") if name.isidentifier() else None
        if module is not None and _is_function(tree, package, name):
            violations.append(Violation(
                tree.relative(module), 1,
                f"module {package}.{name} shares its name with the function {package}.{name} "
                f"exported by {tree.relative(init)}:{line}: rename the module"))
    return violations


def check_tree(root: Path) -> tuple[int, list[Violation]]:
    """Check every source module under `root`; the number of modules and the violations."""
    tree = Tree(root)
    violations: list[Violation] = []
    for path in tree.files:
        violations += check_boundaries(tree, path)
        if path.name == "__init__.py":
            violations += check_module_names(tree, path)
    return len(tree.files), violations


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout to check")
    args = parser.parse_args(argv)
    count, violations = check_tree(args.root.resolve())
    for violation in violations:
        print(violation)
    print(f"check_imports: {count} modules, {len(violations)} violations")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
