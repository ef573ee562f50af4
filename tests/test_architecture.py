"""Imports point down: every import of our own modules goes to the same layer or a lower one, and no
module-level imports form a cycle.

Layers, lowest first (vit_fast.kernels and vit_fast.export are installed from the top-level folders
kernels/ and export/):

  kernels  vit_fast.kernels.*
  base     vit_fast.version, dtypes, batches, files, lazy, progress, numerics, env, runtime, pos_embed, first_use
  model    vit_fast.config, layers, stages, model, triton_path, validation, convert, checkpoints, loading, hf,
           patching, naflex, explanation, assets, graphs, training, warmup, selfcheck,
           and vit_fast itself (the public facade over the model layer)
  export   vit_fast.export.*
  app      vit_fast.bench.*, vit_fast.demo.*, vit_fast.doctor.*, vit_fast.serve.*
  cli      vit_fast.cli.*, vit_fast.__main__

Every import counts for the layer check, at module level or inside a function; imports under
``if TYPE_CHECKING:`` are ignored. Only module-level imports count for cycles (an import inside a
function runs after both modules have loaded). The checker is plain AST walking: nothing is imported.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: import package -> folder in the repository (the setuptools package-dir mapping)
PACKAGES = {"vit_fast": ROOT / "vit_fast", "vit_fast.kernels": ROOT / "kernels", "vit_fast.export": ROOT / "export"}


def _modules(*names: str) -> tuple[str, ...]:
    return tuple(f"vit_fast.{name}" for name in names)


#: lowest first; "x.*" stands for every module inside package x
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("kernels", _modules("kernels", "kernels.*")),
    (
        "base",
        _modules("version", "dtypes", "batches", "files", "files.*", "lazy", "progress", "numerics", "env", "runtime")
        + _modules("pos_embed", "first_use", "timm_import", "interrupts", "limits", "children"),
    ),
    (
        "model",
        ("vit_fast",)  # the package itself: the public facade over the model layer
        + _modules(
            "config",
            "layers",
            "stages",
            "timm_api",
            "model",
            "triton_path",
            "validation",
            "convert",
            "assets",
            "assets.*",
        )
        + _modules(
            "checkpoints", "loading", "hf_patch", "patching", "timm_blocks", "graphs", "training", "warmup", "selfcheck"
        )
        + _modules("explanation", "naflex"),
    ),
    ("export", _modules("export", "export.*")),
    (
        "app",
        _modules("bench", "bench.*", "demo", "demo.*", "doctor", "doctor.*", "serve", "serve.*"),
    ),
    ("cli", _modules("cli", "cli.*", "__main__")),
]

#: Known upward imports in files this check does not own yet, as (importer, imported). Each is a debt to pay,
#: not a permission: remove the entry with the import. Nothing else may be added here to make the test pass.
ALLOWED_UPWARD: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    module_level: bool


def layer_of(module: str) -> str | None:
    for name, patterns in LAYERS:
        for pattern in patterns:
            if module == pattern or (pattern.endswith(".*") and module.startswith(pattern[:-1])):
                return name
    return None


RANK = {name: i for i, (name, _) in enumerate(LAYERS)}


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


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


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
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:
                    visit_stmt(other, module_level)
                continue
            visit_stmt(child, module_level)

    def visit_stmt(node: ast.AST, module_level: bool) -> None:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source_module = ".".join(base + ([node.module] if node.module else []))
            else:
                source_module = node.module or ""
            names = [f"{source_module}.{alias.name}" for alias in node.names]
        for name in names:
            if name == "vit_fast" or name.startswith("vit_fast."):
                found.append(Import(module, target(name), node.lineno, module_level))
        inner = module_level and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        visit(node, inner)

    visit(ast.parse(source), True)
    return [i for i in found if i.imported != module]


def check(sources: dict[str, tuple[str, bool]], allowed: set[tuple[str, str]] = frozenset()) -> list[str]:
    """Problems in a set of modules (name -> (source, is_package)): unplaced modules, upward imports, cycles."""
    known = set(sources)
    problems = [
        f"{m} is in no layer: add it to LAYERS in tests/test_architecture.py (kernels < base < model < export "
        "< app < cli), at the lowest layer whose modules it may import"
        for m in sorted(known)
        if layer_of(m) is None
    ]
    edges: dict[str, set[str]] = {m: set() for m in known}
    for module, (source, is_package) in sorted(sources.items()):
        for imp in imports_of(module, source, is_package, known):
            low, high = layer_of(imp.importer), layer_of(imp.imported)
            if low and high and RANK[high] > RANK[low] and (imp.importer, imp.imported) not in allowed:
                problems.append(
                    f"upward import: {imp.importer} ({low}) imports {imp.imported} ({high}) at line {imp.line}; "
                    "imports must point down (kernels < base < model < export < app < cli)"
                )
            if imp.module_level and imp.imported in edges:
                edges[module].add(imp.imported)
    problems += [f"import cycle between modules at module level: {' -> '.join(c)}" for c in cycles(edges)]
    return problems


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``a -> b -> a``) through each strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    found = []
    for component in components:
        members = set(component)
        path, seen = [component[0]], {component[0]}
        while True:  # walk inside the component until a module repeats
            nxt = min(w for w in edges[path[-1]] if w in members)
            if nxt in seen:
                found.append(path[path.index(nxt) :] + [nxt])
                break
            path.append(nxt)
            seen.add(nxt)
    return found


def _tree() -> dict[str, tuple[str, bool]]:
    return {m: (path.read_text(encoding="utf-8"), pkg) for m, (path, pkg) in discover(PACKAGES).items()}


# --------------------------------------------------------------------------- the tree
def test_imports_point_down_and_form_no_cycle():
    problems = check(_tree(), ALLOWED_UPWARD)
    assert not problems, "\n".join(problems)


def test_allowed_exceptions_are_still_needed():
    """An entry in ALLOWED_UPWARD whose import is gone must be removed, so the list only shrinks."""
    tree = _tree()
    present = {
        (imp.importer, imp.imported)
        for module, (source, pkg) in tree.items()
        for imp in imports_of(module, source, pkg, set(tree))
    }
    assert ALLOWED_UPWARD <= present, f"remove from ALLOWED_UPWARD: {sorted(ALLOWED_UPWARD - present)}"


def test_every_folder_is_walked():
    modules = discover(PACKAGES)
    for name in ("vit_fast.kernels.attention", "vit_fast.export.verify", "vit_fast.cli", "vit_fast.demo"):
        assert name in modules
    assert not [m for m in modules if m.startswith(("vit_fast.vit_fast", "kernels", "export"))]


# --------------------------------------------------------------------------- the checker itself
SYNTHETIC = {
    "vit_fast": ("from .config import ViTConfig\n", True),
    "vit_fast.config": ("import torch\n", False),
    "vit_fast.kernels": ("", True),
    "vit_fast.kernels.attention": ("from vit_fast.model import VisionTransformer\n", False),  # kernels -> model
    "vit_fast.model": (
        "from typing import TYPE_CHECKING\n"
        "from .config import ViTConfig\n"
        "if TYPE_CHECKING:\n"
        "    from vit_fast.cli import main\n"  # ignored: typing only
        "def f():\n"
        "    from . import demo\n",  # model -> app, inside a function: still upward
        False,
    ),
    "vit_fast.demo": ("import vit_fast.export.verify\n", False),
    "vit_fast.export": ("from .verify import verify\n", True),
    "vit_fast.export.verify": ("from . import onnx\n", False),
    "vit_fast.export.onnx": ("from vit_fast.export import verify\n", False),  # the package's name, a module here
    "vit_fast.numerics": ("from . import env\n", False),
    "vit_fast.env": ("from .numerics import FLOOR\n", False),  # numerics <-> env: a cycle
    "vit_fast.files": ("def f():\n    from . import progress\n", False),
    "vit_fast.progress": ("from . import files\n", False),  # not a cycle: files imports progress lazily
}


def test_checker_reports_upward_imports_cycles_and_unplaced_modules():
    sources = dict(SYNTHETIC, **{"vit_fast.brand_new": ("", False)})
    problems = check(sources)
    upward = [p for p in problems if p.startswith("upward")]
    assert len(upward) == 2, problems
    assert any("vit_fast.kernels.attention (kernels) imports vit_fast.model (model) at line 1" in p for p in upward)
    assert any("vit_fast.model (model) imports vit_fast.demo (app) at line 6" in p for p in upward)
    found = sorted(p for p in problems if "cycle" in p)
    assert found == [
        "import cycle between modules at module level: vit_fast.env -> vit_fast.numerics -> vit_fast.env",
        "import cycle between modules at module level: vit_fast.export.onnx -> vit_fast.export.verify "
        "-> vit_fast.export.onnx",
    ], problems
    assert any(p.startswith("vit_fast.brand_new is in no layer: add it to LAYERS") for p in problems)
    assert len(problems) == 5, problems


def test_checker_honours_allowed_exceptions_only_for_the_named_pair():
    sources = {k: SYNTHETIC[k] for k in ("vit_fast.kernels", "vit_fast.kernels.attention", "vit_fast.model")}
    sources["vit_fast.model"] = ("", False)
    assert check(sources, {("vit_fast.kernels.attention", "vit_fast.model")}) == []
    assert len(check(sources, {("vit_fast.kernels.attention", "vit_fast.config")})) == 1


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("vit_fast.kernels.linear", "kernels"),
        ("vit_fast.numerics", "base"),
        ("vit_fast", "model"),
        ("vit_fast.assets", "model"),
        ("vit_fast.export.runners", "export"),
        ("vit_fast.bench.timing", "app"),
        ("vit_fast.serve.triton", "app"),
        ("vit_fast.cli.demo", "cli"),
        ("vit_fast.kernelsx", None),
        ("vit_fast.newthing", None),
    ],
)
def test_layer_of(module, layer):
    assert layer_of(module) == layer
