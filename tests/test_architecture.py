"""Imports point down: every import of our own modules goes to the same layer or a lower one, and no
module-level imports form a cycle.

Layers, lowest first, are folders (vit_fast.kernels and vit_fast.export are installed from the top-level
folders kernels/ and export/); LAYERS in tools/import_graph.py is the one place they are written (this test and
tools/forward_path.py read it from there).

Every import counts for the layer check, at module level or inside a function; imports under
``if TYPE_CHECKING:`` are ignored. No cycle at module level, anywhere. Counting imports inside functions too, no
cycle across folders: the modules of one folder (vit_fast/model/, vit_fast/bench/, export/) may call on each other
lazily.

Only public names cross a file: no module uses another's ``_private`` name (``from m import _x`` or ``m._x``, at
module level or inside a function, typing-only imports included), and a private module (``export/_common.py``) is
imported only inside its own package (its siblings and the package's ``__init__``, which re-exports what is public).
tools/ and benchmarks/ are held to that rule too; tests/ is not: a test may reach into a private name to test it.

The checker is plain AST walking: nothing is imported. Which module imports which is read by tools/import_graph.py,
shared with tools/forward_path.py.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load_import_graph():
    """tools/import_graph.py, the import reader this check shares with tools/forward_path.py (tools/ is no
    package)."""
    spec = importlib.util.spec_from_file_location("import_graph_under_test", ROOT / "tools" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # where its dataclass is looked up
    spec.loader.exec_module(module)
    return module


_graph = _load_import_graph()
PACKAGES, discover, imported_from, imports_of, sources_of = (
    _graph.PACKAGES,
    _graph.discover,
    _graph.imported_from,
    _graph.imports_of,
    _graph.sources_of,
)
#: the layers, lowest first, their ranks and the module -> layer reader: written once, in tools/import_graph.py
LAYERS, RANK, layer_of = _graph.LAYERS, _graph.RANK, _graph.layer_of
#: scripts held to the private-name rule (they sit in no layer: nothing imports them)
SCRIPTS = {"tools": ROOT / "tools", "benchmarks": ROOT / "benchmarks"}


#: Known upward imports in files this check does not own yet, as (importer, imported). Each is a debt to pay,
#: not a permission: remove the entry with the import. Nothing else may be added here to make the test pass.
ALLOWED_UPWARD: set[tuple[str, str]] = set()

#: Private names that still cross a file, as (importer, "module.name" or the private module). Each is a debt that
#: another change is paying now, not a permission: remove the entry with the use (a stale entry fails
#: test_allowed_exceptions_are_still_needed). Nothing else may be added here to make the test pass.
ALLOWED_PRIVATE: set[tuple[str, str]] = set()


ORDER = " < ".join(RANK)


def check(
    sources: dict[str, tuple[str, bool]],
    allowed: set[tuple[str, str]] = frozenset(),
    private_allowed: set[tuple[str, str]] = frozenset(),
) -> list[str]:
    """Problems in a set of modules (name -> (source, is_package)): unplaced modules, upward imports, cycles (at
    module level anywhere; counting imports inside functions, across folders) and private names crossing a file."""
    known = set(sources)
    problems = [
        f"{m} is in no layer: add it to LAYERS in tools/import_graph.py ({ORDER}), at the lowest layer whose "
        "modules it may import"
        for m in sorted(known)
        if layer_of(m) is None
    ]
    edges: dict[str, set[str]] = {m: set() for m in known}
    every_edge: dict[str, set[str]] = {m: set() for m in known}
    for module, (source, is_package) in sorted(sources.items()):
        for imp in imports_of(module, source, is_package, known):
            low, high = layer_of(imp.importer), layer_of(imp.imported)
            if low and high and RANK[high] > RANK[low] and (imp.importer, imp.imported) not in allowed:
                problems.append(
                    f"upward import: {imp.importer} ({low}) imports {imp.imported} ({high}) at line {imp.line}; "
                    f"imports must point down ({ORDER})"
                )
            if imp.imported in edges:
                every_edge[module].add(imp.imported)
                if imp.module_level:
                    edges[module].add(imp.imported)
    problems += [f"import cycle between modules at module level: {' -> '.join(c)}" for c in cycles(edges)]
    at_module_level = [set(c) for c in components(edges)]  # reported above
    for component in components(every_edge):
        folders = {folder_of(m, sources[m][1]) for m in component}
        if set(component) in at_module_level or (len(folders) == 1 and folders != {"vit_fast"}):
            continue  # a sub-package's modules may call on each other lazily; vit_fast/ itself holds two layers
        problems.append(
            "import cycle between modules (counting imports inside functions): "
            f"{' -> '.join(cycle_in(component, every_edge))}; move what one needs from the other to its one home, "
            "so imports point one way"
        )
    problems += private_problems(sources, private_allowed)
    return problems


def folder_of(module: str, is_package: bool) -> str:
    """The package whose folder holds ``module``'s file (a package's own ``__init__`` is in its folder)."""
    return module if is_package else module.rpartition(".")[0]


def components(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

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
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def cycle_in(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """One cycle (``a -> b -> a``) through a strongly connected ``component``."""
    members = set(component)
    path, seen = [component[0]], {component[0]}
    while True:  # walk inside the component until a module repeats
        nxt = min(w for w in edges[path[-1]] if w in members)
        if nxt in seen:
            return path[path.index(nxt) :] + [nxt]
        path.append(nxt)
        seen.add(nxt)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``a -> b -> a``) through each strongly connected component of more than one module."""
    return [cycle_in(c, edges) for c in components(edges)]


# --------------------------------------------------------------------------- private names
def is_private(name: str) -> bool:
    """``_name`` (not ``__dunder__``): a name its file keeps to itself."""
    return name.startswith("_") and not name.endswith("__")


def private_module_in(module: str, importer: str) -> str | None:
    """The private module on ``module``'s dotted path that ``importer`` lies outside the package of (a package's
    ``_common`` is shared by its own modules and its ``__init__``, no one else's); None when there is none."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        owner = ".".join(parts[:i])
        if is_private(part) and importer != owner and not importer.startswith(owner + "."):
            return ".".join(parts[: i + 1])
    return None


@dataclass(frozen=True)
class PrivateUse:
    importer: str
    used: str  # "module.name", or the private module itself
    line: int


def private_uses(module: str, source: str, is_package: bool, known: set[str]) -> list[PrivateUse]:
    """Every private name of another of our modules that ``source`` uses, at module level or inside a function
    (``from m import _x``, ``m._x``), and every private module it imports from outside that module's package."""
    package = module if is_package else module.rpartition(".")[0]
    bound: dict[str, str] = {}  # local name -> the module of ours it is bound to (in any scope)
    found: list[PrivateUse] = []

    def target(name: str) -> str:
        while name not in known and "." in name:
            name = name.rpartition(".")[0]
        return name

    def note(used_module: str, name: str | None, line: int) -> None:
        if used_module == module:
            return
        private_module = private_module_in(used_module, module)
        if private_module is not None:
            found.append(PrivateUse(module, private_module, line))
        elif name is not None and is_private(name):
            found.append(PrivateUse(module, f"{used_module}.{name}", line))

    def module_of(node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        if isinstance(node, ast.Attribute):
            outer = module_of(node.value)
            return f"{outer}.{node.attr}" if outer is not None and f"{outer}.{node.attr}" in known else None
        return None

    def ours(name: str) -> bool:
        return name == "vit_fast" or name.startswith("vit_fast.")

    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if ours(alias.name):
                    note(target(alias.name), None, node.lineno)
                    bound[alias.asname or "vit_fast"] = alias.name if alias.asname else "vit_fast"
        elif isinstance(node, ast.ImportFrom):
            source_module = imported_from(node, package)
            if not ours(source_module):
                continue
            for alias in node.names:
                full = f"{source_module}.{alias.name}"
                if full in known:  # a module
                    note(full, None, node.lineno)
                    bound[alias.asname or alias.name] = full
                else:
                    note(target(source_module), alias.name, node.lineno)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            outer = module_of(node.value)
            if outer is not None and f"{outer}.{node.attr}" not in known:
                note(outer, node.attr, node.lineno)
    return found


def private_problems(sources: dict[str, tuple[str, bool]], allowed: set[tuple[str, str]] = frozenset()) -> list[str]:
    """A private name (or private module) of one file used by another, unless ``(importer, used)`` is allowed."""
    known = set(sources)
    problems = []
    for module, (source, is_package) in sorted(sources.items()):
        for use in private_uses(module, source, is_package, known):
            if (use.importer, use.used) in allowed:
                continue
            problems.append(
                f"private name crosses a file: {use.importer} uses {use.used} at line {use.line}; make it public "
                "where it is shared (a proper name, a docstring line) or move the code that needs it to its home"
            )
    return problems


def _tree() -> dict[str, tuple[str, bool]]:
    return sources_of(PACKAGES)


def _scripts() -> dict[str, tuple[str, bool]]:
    return sources_of(SCRIPTS)


# --------------------------------------------------------------------------- the tree
def test_imports_point_down_and_form_no_cycle():
    problems = check(_tree(), ALLOWED_UPWARD, ALLOWED_PRIVATE)
    assert not problems, "\n".join(problems)


def test_tools_and_benchmarks_use_only_public_names():
    tree, scripts = _tree(), _scripts()
    problems = private_problems({**tree, **scripts}, ALLOWED_PRIVATE)
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
    everything = {**tree, **_scripts()}
    used = {
        (use.importer, use.used)
        for module, (source, pkg) in everything.items()
        for use in private_uses(module, source, pkg, set(everything))
    }
    assert ALLOWED_PRIVATE <= used, f"remove from ALLOWED_PRIVATE: {sorted(ALLOWED_PRIVATE - used)}"


def test_every_folder_is_walked():
    modules = discover(PACKAGES)
    for name in ("vit_fast.kernels.attention", "vit_fast.export.verify", "vit_fast.cli", "vit_fast.demo"):
        assert name in modules
    assert not [m for m in modules if m.startswith(("vit_fast.vit_fast", "kernels", "export"))]


# --------------------------------------------------------------------------- the checker itself
SYNTHETIC = {
    "vit_fast": ("from .model.config import ViTConfig\n", True),
    "vit_fast.model.config": ("import torch\n", False),
    "vit_fast.kernels": ("", True),
    "vit_fast.kernels.attention": ("from vit_fast.model.vit import VisionTransformer\n", False),  # kernels -> model
    "vit_fast.model.vit": (
        "from typing import TYPE_CHECKING\n"
        "from .config import ViTConfig\n"
        "if TYPE_CHECKING:\n"
        "    from vit_fast.cli import main\n"  # ignored: typing only
        "def f():\n"
        "    from vit_fast import demo\n",  # model -> app, inside a function: still upward
        False,
    ),
    "vit_fast.demo": ("import vit_fast.export.verify\n", False),
    "vit_fast.export": ("from .verify import verify\n", True),
    "vit_fast.export.verify": ("from . import onnx\n", False),
    "vit_fast.export.onnx": ("from vit_fast.export import verify\n", False),  # the package's name, a module here
    "vit_fast.util.numerics": ("from . import limits\n", False),
    "vit_fast.util.limits": ("from .numerics import FLOOR\n", False),  # numerics <-> limits: a cycle, in one folder
    "vit_fast.util.files": ("def f():\n    from . import progress\n", False),
    "vit_fast.util.progress": ("from . import files\n", False),  # lazy, inside one folder: allowed
    "vit_fast.doctor.checks": ("def f():\n    from vit_fast.serve import server\n", False),
    "vit_fast.serve.server": ("from vit_fast.doctor import checks\n", False),  # lazy, across two folders: a cycle
    "vit_fast.bench.api": ("def f():\n    from .report import write\n", False),
    "vit_fast.bench.report": ("from vit_fast.bench import api\n", False),  # lazy, inside one sub-package: allowed
}


def test_checker_reports_upward_imports_cycles_and_unplaced_modules():
    sources = dict(SYNTHETIC, **{"vit_fast.brand_new": ("", False)})
    problems = check(sources)
    upward = [p for p in problems if p.startswith("upward")]
    assert len(upward) == 2, problems
    assert any("vit_fast.kernels.attention (kernels) imports vit_fast.model.vit (model) at line 1" in p for p in upward)
    assert any("vit_fast.model.vit (model) imports vit_fast.demo (app) at line 6" in p for p in upward)
    found = sorted(p for p in problems if "cycle" in p)
    assert found == [
        "import cycle between modules (counting imports inside functions): vit_fast.doctor.checks -> "
        "vit_fast.serve.server -> vit_fast.doctor.checks; move what one needs from the other to its one home, so "
        "imports point one way",
        "import cycle between modules at module level: vit_fast.export.onnx -> vit_fast.export.verify "
        "-> vit_fast.export.onnx",
        "import cycle between modules at module level: vit_fast.util.limits -> vit_fast.util.numerics "
        "-> vit_fast.util.limits",
    ], problems
    assert any(p.startswith("vit_fast.brand_new is in no layer: add it to LAYERS") for p in problems)
    assert len(problems) == 6, problems


def test_checker_reports_a_lazy_cycle_across_folders_but_not_inside_one():
    sources = {
        "vit_fast.model.vit": ("def forward():\n    from vit_fast.backend.triton_path import run\n", False),
        "vit_fast.backend.triton_path": ("from vit_fast.model.vit import PLAN\n", False),  # two folders
        "vit_fast.interop.convert": ("def optimize():\n    from .hf_patch import optimize_hf\n", False),
        "vit_fast.interop.hf_patch": ("from .convert import HF_ACTIVATIONS\n", False),  # one folder: allowed
        "vit_fast.export": ("", True),
        "vit_fast.export.verify": ("def f():\n    from vit_fast.bench import report\n", False),
        "vit_fast.bench": ("", True),
        "vit_fast.bench.report": ("from vit_fast.export import verify\n", False),  # export <-> bench: two folders
        "vit_fast.bench.api": ("def f():\n    from . import harness\n", False),
        "vit_fast.bench.harness": ("from . import api\n", False),  # one folder: allowed
    }
    cycles_found = sorted(p for p in check(sources) if "cycle" in p)
    assert len(cycles_found) == 2, cycles_found
    assert "vit_fast.backend.triton_path -> vit_fast.model.vit -> vit_fast.backend.triton_path" in cycles_found[0]
    assert "vit_fast.bench.report -> vit_fast.export.verify -> vit_fast.bench.report" in cycles_found[1]


PRIVATE_SYNTHETIC = {
    "vit_fast.model": ("", True),
    "vit_fast.model.config": ("_ACTS = ()\nHF = {}\n", False),
    "vit_fast.model.vit": ("from .config import HF\nfrom .config import _ACTS\n", False),  # a sibling's, line 2
    "vit_fast.interop.convert": ("def f():\n    from vit_fast.model.config import _ACTS\n", False),  # lazy, line 2
    "vit_fast.interop.loading": ("from vit_fast.model import config\n\nx = config._ACTS\n", False),  # attribute, line 3
    "vit_fast.interop.hf_patch": ("import vit_fast.model.config\ny = vit_fast.model.config._ACTS\n", False),  # line 2
    "vit_fast.export": ("from ._common import read_metadata\n", True),  # the package re-exports: fine
    "vit_fast.export._common": ("def read_metadata(): ...\n", False),
    "vit_fast.export.onnx": ("from ._common import read_metadata\n", False),  # a sibling: fine
    "vit_fast.bench.artifacts": ("def f():\n    from vit_fast.export._common import read_metadata\n", False),
    "vit_fast.bench.api": (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..model.config import _ACTS\n",
        False,
    ),
    "vit_fast.model.selfcheck": (
        "from vit_fast.model.config import __doc__, _ACTS as acts\n",
        False,
    ),  # dunder fine; _ACTS not
}


def test_checker_reports_private_names_crossing_a_file():
    problems = private_problems(PRIVATE_SYNTHETIC)
    found = sorted(p.split(": ", 1)[1].split(";")[0] for p in problems)
    assert found == [
        "vit_fast.bench.api uses vit_fast.model.config._ACTS at line 3",
        "vit_fast.bench.artifacts uses vit_fast.export._common at line 2",
        "vit_fast.interop.convert uses vit_fast.model.config._ACTS at line 2",
        "vit_fast.interop.hf_patch uses vit_fast.model.config._ACTS at line 2",
        "vit_fast.interop.loading uses vit_fast.model.config._ACTS at line 3",
        "vit_fast.model.selfcheck uses vit_fast.model.config._ACTS at line 1",
        "vit_fast.model.vit uses vit_fast.model.config._ACTS at line 2",
    ], problems
    allowed = {
        ("vit_fast.model.vit", "vit_fast.model.config._ACTS"),
        ("vit_fast.bench.artifacts", "vit_fast.export._common"),
    }
    assert len(private_problems(PRIVATE_SYNTHETIC, allowed)) == len(problems) - 2


def test_checker_honours_allowed_exceptions_only_for_the_named_pair():
    sources = {k: SYNTHETIC[k] for k in ("vit_fast.kernels", "vit_fast.kernels.attention", "vit_fast.model.vit")}
    sources["vit_fast.model.vit"] = ("", False)
    assert check(sources, {("vit_fast.kernels.attention", "vit_fast.model.vit")}) == []
    assert len(check(sources, {("vit_fast.kernels.attention", "vit_fast.model.config")})) == 1


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("vit_fast.kernels.linear", "kernels"),
        ("vit_fast.util.numerics", "util"),
        ("vit_fast.backend.triton_path", "backend"),
        ("vit_fast.model.vit", "model"),
        ("vit_fast.interop.convert", "interop"),
        ("vit_fast", "interop"),
        ("vit_fast.assets", "interop"),
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


def test_the_developers_guide_states_the_layers_as_written_here():
    """docs/development.md tells a newcomer the order; LAYERS is where it is decided, and the two never disagree."""
    guide = " ".join((ROOT / "docs" / "development.md").read_text().split())
    assert ORDER in guide, f"docs/development.md should state the layers as {ORDER}"
