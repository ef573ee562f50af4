"""vit_fast's imports read from its source: which of our modules each module imports, at module level or inside a
function (imports under ``if TYPE_CHECKING:`` are left out). Plain AST walking: nothing is imported.

Also the one place the layers are written (``LAYERS``, lowest first, and ``layer_of``). Shared by
tests/test_architecture.py (imports point down, no cycle) and tools/forward_path.py (each module's height: its layer,
then its level among its layer's imports).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: import package -> folder in the repository (the setuptools package-dir mapping)
PACKAGES = {"vit_fast": ROOT / "vit_fast", "vit_fast.kernels": ROOT / "kernels", "vit_fast.export": ROOT / "export"}


def _modules(*names: str) -> tuple[str, ...]:
    return tuple(f"vit_fast.{name}" for name in names)


#: the layers, lowest first, each a folder (vit_fast.kernels and vit_fast.export are installed from the top-level
#: folders kernels/ and export/); "x.*" stands for every module inside package x
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # settings, the card table, versions and the interpreter switch: below the kernels, needing nothing of ours
    ("base", _modules("base", "base.*")),
    ("kernels", _modules("kernels", "kernels.*")),
    ("util", _modules("util", "util.*")),
    ("backend", _modules("backend", "backend.*")),
    ("model", _modules("model", "model.*")),
    # the package itself is the public facade over the interop layer (its names load on first use); assets: the
    # embedded default model, loaded as a checkpoint
    ("interop", ("vit_fast",) + _modules("interop", "interop.*", "assets", "assets.*")),
    ("export", _modules("export", "export.*")),
    ("app", _modules("bench", "bench.*", "demo", "demo.*", "doctor", "doctor.*", "serve", "serve.*")),
    ("cli", _modules("cli", "cli.*", "__main__")),
]
#: layer name -> its rank, 0 the lowest
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}


def layer_of(module: str) -> str | None:
    """The layer ``module`` belongs to, or None when no pattern of ``LAYERS`` places it."""
    for name, patterns in LAYERS:
        for pattern in patterns:
            if module == pattern or (pattern.endswith(".*") and module.startswith(pattern[:-1])):
                return name
    return None


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    module_level: bool


def discover(packages: dict[str, Path]) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is_package) for every .py file under each package folder."""
    modules: dict[str, tuple[Path, bool]] = {}
    for package, folder in packages.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            modules[".".join([package, *parts])] = (path, is_package)
    return modules


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_from(node: ast.ImportFrom, package: str) -> str:
    """The module ``from X import ...`` reads, a relative ``X`` resolved against ``package`` (the importer's)."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, source: str, is_package: bool, known: set[str]) -> list[Import]:
    """Every import of a ``vit_fast`` module in ``source``, resolved to the module it loads."""
    found: list[Import] = []
    package = module if is_package else module.rpartition(".")[0]

    def target(name: str) -> str:
        # the longest known module that ``name`` is or lies in (a name imported from a module is that module)
        while name not in known and "." in name:
            name = name.rpartition(".")[0]
        return name

    def visit(node: ast.AST, module_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and is_type_checking(child.test):
                for other in child.orelse:
                    visit_stmt(other, module_level)
                continue
            visit_stmt(child, module_level)

    def visit_stmt(node: ast.AST, module_level: bool) -> None:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source_module = imported_from(node, package)
            names = [f"{source_module}.{alias.name}" for alias in node.names]
        for name in names:
            if name == "vit_fast" or name.startswith("vit_fast."):
                found.append(Import(module, target(name), node.lineno, module_level))
        inner = module_level and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        visit(node, inner)

    visit(ast.parse(source), True)
    return [i for i in found if i.imported != module]


def sources_of(packages: dict[str, Path]) -> dict[str, tuple[str, bool]]:
    """Module name -> (source, is_package) for every module under each package folder."""
    return {m: (path.read_text(encoding="utf-8"), pkg) for m, (path, pkg) in discover(packages).items()}
