"""What code a workflow job executes, and a digest of what that code means.

A rule's job runs one adapter script (``workflow/scripts/<name>.py``), which imports modules of
this package, which import others. The job's output can change only if code in that import
closure changes in meaning, so the rules pass :func:`code_digest` of their adapter as a param:
Snakemake reruns a job when the digest changes, and not when a file merely got newer.

The digest hashes each module's syntax tree without its docstrings. A comment, a docstring, a
blank line or a reformatting changes nothing; any change to a statement or an expression,
however small, changes the digest of every job whose closure holds that module.

The closure is read statically from ``import`` statements anywhere in a module (functions'
lazy imports included, ``TYPE_CHECKING`` blocks too: a conservative superset), so nothing is
imported to compute it. Only this package is followed; third-party code is the software
environment's business (Snakemake's software-env trigger, DVC's lock of the environment files).
"""

from __future__ import annotations

import ast
import hashlib
from functools import cache
from pathlib import Path

PACKAGE = "coordgap"
# This package's folder. The workflow passes its own checkout's src/coordgap instead, so that
# the digest follows the code next to the Snakefile (a copy of the workflow, in tests).
PACKAGE_DIR = Path(__file__).resolve().parent


def module_file(module: str, package_dir: Path = PACKAGE_DIR) -> Path | None:
    """The source file of one of this package's modules, or None if it is not one.

    Args:
        module: A dotted module name, e.g. ``coordgap.env.table``.
        package_dir: The package's folder.

    Returns:
        ``<name>.py`` or ``<name>/__init__.py`` under the package, if it exists.
    """
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    base = package_dir.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_name(path: Path, package_dir: Path) -> str | None:
    """The dotted name of a file of this package, or None for a file outside it."""
    try:
        relative = path.resolve().relative_to(package_dir.resolve())
    except ValueError:
        return None
    parts = [PACKAGE, *relative.with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(path: Path, module: str | None) -> str | None:
    """The package relative imports in ``path`` resolve against."""
    if module is None:
        return None
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


@cache
def imported_modules(path: Path, package_dir: Path = PACKAGE_DIR) -> frozenset[str]:
    """This package's modules that one file imports, directly.

    ``from a.b import c`` imports ``a.b`` and, if ``c`` is a submodule, ``a.b.c``; importing any
    module also runs its parent packages' ``__init__``.

    Args:
        path: A Python source file (an adapter script or a module of this package).
        package_dir: The package's folder.

    Returns:
        Dotted names of the modules of this package it imports.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _package_of(path, _module_name(path, package_dir))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if package is None:
                    raise ValueError(f"{path}: a relative import outside the {PACKAGE} package")
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    modules = {name for name in names if module_file(name, package_dir) is not None}
    # Importing a.b.c runs a/__init__ and a/b/__init__ first.
    for name in list(modules):
        parts = name.split(".")
        modules.update(".".join(parts[:end]) for end in range(1, len(parts)))
    return frozenset(modules)


@cache
def import_closure(script: Path, package_dir: Path = PACKAGE_DIR) -> tuple[Path, ...]:
    """Every module of this package that running ``script`` may import, transitively.

    Args:
        script: An adapter script, e.g. ``workflow/scripts/generate_episodes.py``.
        package_dir: The package's folder.

    Returns:
        The modules' source files, sorted.
    """
    seen: set[str] = set()
    pending = set(imported_modules(Path(script), package_dir))
    while pending:
        module = pending.pop()
        seen.add(module)
        pending |= imported_modules(module_file(module, package_dir), package_dir) - seen
    return tuple(sorted(module_file(module, package_dir) for module in seen))


def _without_docstrings(tree: ast.AST) -> ast.AST:
    """The tree with every module, class and function docstring removed."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            first = body[0].value if body and isinstance(body[0], ast.Expr) else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                # An empty body is not valid Python; `pass` means the same.
                node.body = body[1:] or [ast.Pass()]
    return tree


@cache
def meaning(path: Path) -> str:
    """A module's code as its syntax tree: no comments, docstrings, layout or line numbers."""
    tree = ast.parse(Path(path).read_text(), filename=str(path))
    return ast.dump(_without_docstrings(tree), include_attributes=False)


@cache
def code_digest(script: Path, package_dir: Path = PACKAGE_DIR) -> str:
    """A digest of the meaning of every module a script's job may execute.

    Args:
        script: An adapter script.
        package_dir: The package's folder.

    Returns:
        A SHA-256 hex digest over the sorted modules' names and syntax trees.
    """
    digest = hashlib.sha256()
    for path in import_closure(Path(script), package_dir):
        digest.update(f"{_module_name(path, package_dir)}\n{meaning(path)}\n".encode())
    return digest.hexdigest()
