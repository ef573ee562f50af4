"""The image's path from ``VisionTransformer.forward`` through vit_fast's modules to the kernels and back.

A tiny model runs a warm-up and a traced forward per backend (triton in Triton's interpreter). A call is on the path
when it is given an activation (a tensor that is no parameter or buffer of the model); a step: a distinct call between
two of our modules on it. Height: (layer rank in import_graph.LAYERS, level among that layer's imports); back up: a
step to a greater height; entered(m): how many modules step into m. Targets: back up <= 7, entered <= 4.

    python tools/forward_path.py                      # both backends: the path, the counts, entered per module
    python tools/forward_path.py --backend torch --json path.json --check
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import itertools
import os
import sys
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported: the kernels run on the CPU

sys.path.insert(0, str(Path(__file__).resolve().parent))  # import_graph.py beside this file (tools/ is no package)
from import_graph import LAYERS, RANK, discover, imports_of, layer_of  # noqa: E402

BACKENDS = ("torch", "triton")
#: the targets: at most this many steps back up to a higher module, each module entered at most this often
MAX_BACK_UP, MAX_ENTERED = 7, 4


def is_ours(module: str) -> bool:
    return module == "vit_fast" or module.startswith("vit_fast.")


def is_triton(module: str) -> bool:
    return module == "triton" or module.startswith("triton.")


def qualname(frame: FrameType) -> str:
    return getattr(frame.f_code, "co_qualname", frame.f_code.co_name)  # co_qualname: Python 3.11+


Site = tuple[str, str]  # (module, function qualname)
Edge = tuple[Site, Site]  # caller -> callee


def arguments(frame: FrameType) -> list[Any]:
    """What ``frame``'s function was called with (read at its 'call' event): its named arguments, and what its
    ``*args`` tuple and ``**kwargs`` dict hold (one level deep)."""
    code, local = frame.f_code, frame.f_locals
    named = code.co_argcount + code.co_kwonlyargcount
    values = [local[name] for name in code.co_varnames[:named] if name in local]
    if code.co_flags & inspect.CO_VARARGS:
        extra = local.get(code.co_varnames[named], ())
        values += extra if isinstance(extra, tuple) else []
        named += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        extra = local.get(code.co_varnames[named], {})
        values += extra.values() if isinstance(extra, dict) else []
    return values


@dataclass
class Trace:
    """What one traced call saw: the first frame(s) of ours on the path with none above, and every distinct edge
    between two of our modules in first-seen order, each under the edge whose visit it was first seen in (a root's
    site where it hangs on none)."""

    roots: list[Site] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    parent: dict[Edge, Edge | Site] = field(default_factory=dict)


def trace(run: Callable[[], Any], ours: Callable[[str], bool] = is_ours, weights: Collection[int] = ()) -> Trace:
    """Run ``run()`` under ``sys.setprofile`` and return the path's calls between modules ``ours`` accepts (by the
    frame's ``__name__``). A call is recorded when an argument is an activation: a ``torch.Tensor`` that is no
    ``nn.Parameter`` and whose id is not in ``weights`` (the model's parameters and buffers). Its caller is the nearest
    recorded frame above it (unrecorded frames between are passed through); a frame with a triton frame between it and
    that caller (a ``@triton.jit`` body, a hook the autotuner calls) is not recorded."""
    import torch

    def activation(value: Any) -> bool:
        return (
            isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) and id(value) not in weights
        )

    result = Trace()
    seen: set[Edge] = set()
    node_of: dict[FrameType, Edge | Site] = {}  # live recorded frame -> the tree node its module visit hangs on

    def on_event(frame: FrameType, event: str, arg: Any) -> None:
        if event == "return":
            node_of.pop(frame, None)
            return
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not ours(module):
            return
        caller = frame.f_back
        while caller is not None and caller not in node_of:
            if is_triton(caller.f_globals.get("__name__", "")):
                return  # inside a kernel run by triton, or a hook triton calls
            caller = caller.f_back
        if not any(activation(value) for value in arguments(frame)):
            return  # not on the image's path (a lookup, a switch, a property); what it calls may be
        site = (module, qualname(frame))
        if caller is None:
            if site not in result.roots:
                result.roots.append(site)
            node_of[frame] = site
            return
        parent_node = node_of[caller]
        caller_site = (caller.f_globals["__name__"], qualname(caller))
        if caller_site[0] == module:
            node_of[frame] = parent_node  # the same module: the same visit
            return
        edge = (caller_site, site)
        if edge not in seen:
            seen.add(edge)
            result.edges.append(edge)
            result.parent[edge] = parent_node
        node_of[frame] = edge

    previous = sys.getprofile()
    sys.setprofile(on_event)
    try:
        run()
    finally:
        sys.setprofile(previous)
    return result


# --------------------------------------------------------------------------- module heights
def levels(imports: dict[str, set[str]]) -> tuple[dict[str, int], list[list[str]]]:
    """Each module's height in the import graph (``module -> modules it imports``): 0 when it imports none, else 1 +
    the highest of its imports. An import back to a module still being measured closes a cycle: it counts as absent,
    and the cycle is returned (modules visited in sorted order, so the result is the same on every run)."""
    level: dict[str, int] = {}
    found: list[list[str]] = []
    path: list[str] = []

    def visit(module: str) -> int:
        if module in level:
            return level[module]
        path.append(module)
        height = 0
        for imported in sorted(imports.get(module, ())):
            if imported in path:
                found.append(path[path.index(imported) :] + [imported])
                continue
            height = max(height, 1 + visit(imported))
        path.pop()
        level[module] = height
        return height

    for module in sorted(imports):
        visit(module)
    return level, found


Height = tuple[int, int]  # (the rank of the module's layer, its level among its layer's imports)


def heights(imports: dict[str, set[str]]) -> tuple[dict[str, Height], list[list[str]]]:
    """Each module's height: (the rank of its layer in ``LAYERS``, its ``levels`` counting only the imports between
    modules of its layer), and the cycles broken there. A module in no layer ranks above every layer."""
    layer = {module: layer_of(module) for module in imports}
    within = {m: {i for i in imported if layer_of(i) == layer[m]} for m, imported in imports.items()}
    level, cycles = levels(within)
    return {m: (RANK.get(layer[m], len(RANK)), level[m]) for m in imports}, cycles


def label(height: Height) -> str:
    """``layer:level``, e.g. ``model:2``."""
    rank, level = height
    return f"{LAYERS[rank][0] if rank < len(LAYERS) else 'no layer'}:{level}"


def installed_packages() -> dict[str, Path]:
    """Import package -> folder, as this Python finds vit_fast (and vit_fast.kernels / vit_fast.export where they are
    installed from folders of their own)."""
    packages: dict[str, Path] = {}
    for name in ("vit_fast", "vit_fast.kernels", "vit_fast.export"):
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        folder = Path(next(iter(spec.submodule_search_locations))).resolve()
        if not any(folder.is_relative_to(other) for other in packages.values()):
            packages[name] = folder
    return packages


def import_graph(packages: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (module level and inside functions)."""
    modules = discover(packages)
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in modules.items():
        found = imports_of(module, path.read_text(encoding="utf-8"), is_package, known)
        graph[module] = {imp.imported for imp in found if imp.imported in known}
    return graph


# --------------------------------------------------------------------------- the report
@dataclass
class ForwardPath:
    backend: str
    trace: Trace
    height: dict[str, Height]

    def back_up(self, edge: Edge) -> bool:
        (caller, _), (callee, _) = edge
        return self.height[callee] > self.height[caller]

    def entered(self) -> dict[str, list[str]]:
        """Module -> the modules whose steps enter it (its fan-in), most entered first."""
        callers: dict[str, list[str]] = {}
        for (caller, _), (callee, _) in self.trace.edges:
            if caller not in callers.setdefault(callee, []):
                callers[callee].append(caller)
        return dict(sorted(callers.items(), key=lambda kv: (-len(kv[1]), kv[0])))

    def edges_into(self) -> dict[str, int]:
        """Module -> the distinct steps into it."""
        counts: dict[str, int] = {}
        for _, (callee, _) in self.trace.edges:
            counts[callee] = counts.get(callee, 0) + 1
        return counts

    def numbers(self) -> dict[str, Any]:
        entered = self.entered()
        return {
            "steps": len(self.trace.edges),
            "back_up": sum(self.back_up(e) for e in self.trace.edges),
            "entered": {module: len(callers) for module, callers in entered.items()},
            "entered_from": entered,
            "edges_into": self.edges_into(),
            "roots": [".".join(site) for site in self.trace.roots],
            "edges": [
                {"caller": ".".join(a), "callee": ".".join(b), "back_up": self.back_up((a, b))}
                for a, b in self.trace.edges
            ],
        }

    def offenders(self) -> list[str]:
        numbers = self.numbers()
        found = []
        if numbers["back_up"] > MAX_BACK_UP:
            ups = ", ".join(f"{e['caller']} -> {e['callee']}" for e in numbers["edges"] if e["back_up"])
            found.append(f"{self.backend}: {numbers['back_up']} steps back up (at most {MAX_BACK_UP}): {ups}")
        for module, callers in numbers["entered_from"].items():
            if len(callers) > MAX_ENTERED:
                found.append(
                    f"{self.backend}: {module} entered from {len(callers)} modules (at most {MAX_ENTERED}): "
                    + ", ".join(callers)
                )
        return found

    def tree_lines(self) -> list[str]:
        """The path as a call tree: each distinct edge once, under the edge (or root) whose visit it was first seen
        in, ``[layer:level]`` after it; ``↑`` marks a step back up (``-`` any other), ``(from f)`` names the calling
        function where it is not the one above."""
        children: dict[Edge | Site, list[Edge]] = {}
        for edge in self.trace.edges:
            children.setdefault(self.trace.parent[edge], []).append(edge)
        lines: list[str] = []

        def show(node: Edge | Site, depth: int, entered_at: Site) -> None:
            for edge in children.get(node, []):
                caller, callee = edge
                mark = "↑" if self.back_up(edge) else "-"
                source = "" if caller == entered_at else f"  (from {caller[1]})"
                lines.append(f"{'  ' * depth}{mark} {callee[0]}.{callee[1]} [{label(self.height[callee[0]])}]{source}")
                show(edge, depth + 1, callee)

        for root in self.trace.roots:
            lines.append(f"  {root[0]}.{root[1]} [{label(self.height[root[0]])}]")
            show(root, 1, root)
        return lines

    def report(self) -> str:
        numbers = self.numbers()
        entered = "\n".join(
            f"  {len(callers):6}  {numbers['edges_into'][module]:5}  {module}  <- {', '.join(callers)}"
            for module, callers in numbers["entered_from"].items()
        )
        return (
            f"backend {self.backend}: the path ([layer:level], ↑ a step back up)\n"
            + "\n".join(self.tree_lines())
            + f"\nbackend {self.backend}: {numbers['steps']} steps, {numbers['back_up']} back up "
            f"(target <= {MAX_BACK_UP}), most entered from {max(numbers['entered'].values(), default=0)} modules "
            f"(target <= {MAX_ENTERED})\nentered per module:\n  fan-in  edges  module  <- the modules that enter it\n"
            f"{entered}"
        )


def tiny_model_path(backend: str, height: dict[str, Height]) -> ForwardPath:
    """One traced forward of a tiny model on ``backend``, after one warm-up forward."""
    import torch

    import vit_fast

    torch.manual_seed(0)
    cfg = vit_fast.ViTConfig(img_size=32, patch_size=16, embed_dim=32, depth=2, num_heads=2, num_classes=10)
    model = vit_fast.VisionTransformer(cfg, backend=backend).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        model(x)
        weights = {id(t) for t in itertools.chain(model.parameters(), model.buffers())}
        traced = trace(lambda: model(x), weights=weights)
    return ForwardPath(backend, traced, height)


def measure(backends: Iterable[str]) -> tuple[list[ForwardPath], dict[str, Height], list[list[str]]]:
    height, cycles = heights(import_graph(installed_packages()))
    return [tiny_model_path(b, height) for b in backends], height, cycles


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--backend", choices=BACKENDS, action="append", help="one backend (repeat for more; default both)"
    )
    parser.add_argument("--json", help="also write the numbers to this JSON file")
    parser.add_argument("--check", action="store_true", help=f"exit 1 above the targets ({MAX_BACK_UP}, {MAX_ENTERED})")
    args = parser.parse_args(argv)
    json_path = None
    if args.json is not None:
        from vit_fast.util.files import check_report_file

        json_path = check_report_file(args.json, "--json")  # before any model is built
    paths, height, cycles = measure(args.backend or BACKENDS)
    for path in paths:
        print(path.report(), end="\n\n")
    if cycles:
        print(f"import cycles within a layer, each counted without its last import ({len(cycles)}):")
        for cycle in cycles:
            print("  " + " -> ".join(cycle))
    unplaced = sorted(m for m, (rank, _) in height.items() if rank == len(LAYERS))
    if unplaced:
        print(f"modules in no layer, ranked above every layer: {', '.join(unplaced)}")
    if json_path is not None:
        from vit_fast.util.files import write_json_atomic

        write_json_atomic(
            {
                "targets": {"back_up": MAX_BACK_UP, "entered": MAX_ENTERED},
                "backends": {p.backend: p.numbers() for p in paths},
                "heights": {m: [label(h), *h] for m, h in sorted(height.items())},
                "cycles": cycles,
            },
            json_path,
        )
    offenders = [line for p in paths for line in p.offenders()]
    if args.check and offenders:
        print("above the targets:\n  " + "\n  ".join(offenders), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
