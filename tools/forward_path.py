"""The image's path from ``VisionTransformer.forward`` through vit_fast's modules to the kernels and back.

A tiny model runs once to warm up, once under ``sys.setprofile`` per backend (triton in Triton's interpreter). An
edge is a call between two vit_fast modules, from the nearest vit_fast frame (nothing under a triton frame); each
distinct edge counts once. level(m): 0 if m imports none of ours, else 1 + its imports' highest (cycles broken);
back up: an edge into a higher level; entered(m): distinct edges into m. Targets: back up <= 7, entered <= 2.

    python tools/forward_path.py                      # both backends: the path, the counts, entered per module
    python tools/forward_path.py --backend torch --json path.json --check
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported: the kernels run on the CPU

sys.path.insert(0, str(Path(__file__).resolve().parent))  # import_graph.py beside this file (tools/ is no package)
from import_graph import discover, imports_of  # noqa: E402

BACKENDS = ("torch", "triton")
#: the targets: at most this many steps back up to a higher module, each module entered at most this often
MAX_BACK_UP, MAX_ENTERED = 7, 2


def is_ours(module: str) -> bool:
    return module == "vit_fast" or module.startswith("vit_fast.")


def is_triton(module: str) -> bool:
    return module == "triton" or module.startswith("triton.")


def qualname(frame: FrameType) -> str:
    return getattr(frame.f_code, "co_qualname", frame.f_code.co_name)  # co_qualname: Python 3.11+


Site = tuple[str, str]  # (module, function qualname)
Edge = tuple[Site, Site]  # caller -> callee


@dataclass
class Trace:
    """What one traced call saw: the first frame(s) of ours with no caller of ours, and every distinct edge between
    two of our modules in first-seen order, each under the edge whose visit it was first seen in (None: a root)."""

    roots: list[Site] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    parent: dict[Edge, Edge | Site] = field(default_factory=dict)


def trace(run: Callable[[], Any], ours: Callable[[str], bool] = is_ours) -> Trace:
    """Run ``run()`` under ``sys.setprofile`` and return the calls between modules ``ours`` accepts (by the frame's
    ``__name__``). The caller of a frame is the nearest accepted frame above it; a frame with a triton frame between
    it and that caller (a ``@triton.jit`` body, a hook the autotuner calls) is not recorded, nor anything under it."""
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
        site = (module, qualname(frame))
        caller = frame.f_back
        while caller is not None and caller not in node_of:
            name = caller.f_globals.get("__name__", "")
            if is_triton(name) or (ours(name) and caller not in node_of):
                return  # inside a kernel run by triton, or under a frame of ours that is not recorded
            caller = caller.f_back
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
    level: dict[str, int]

    def back_up(self, edge: Edge) -> bool:
        (caller, _), (callee, _) = edge
        return self.level.get(callee, 0) > self.level.get(caller, 0)

    def entered(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _, (callee, _) in self.trace.edges:
            counts[callee] = counts.get(callee, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def numbers(self) -> dict[str, Any]:
        return {
            "steps": len(self.trace.edges),
            "back_up": sum(self.back_up(e) for e in self.trace.edges),
            "entered": self.entered(),
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
        for module, count in numbers["entered"].items():
            if count > MAX_ENTERED:
                found.append(f"{self.backend}: {module} entered {count} times (at most {MAX_ENTERED})")
        return found

    def tree_lines(self) -> list[str]:
        """The path as a call tree: each distinct edge once, under the edge (or root) whose visit it was first seen
        in; ``↑`` marks a step back up (``-`` any other), ``(from f)`` names the calling function where it is not
        the one above."""
        children: dict[Edge | Site, list[Edge]] = {}
        for edge in self.trace.edges:
            children.setdefault(self.trace.parent[edge], []).append(edge)
        lines: list[str] = []

        def show(node: Edge | Site, depth: int, entered_at: Site) -> None:
            for edge in children.get(node, []):
                caller, callee = edge
                mark = "↑" if self.back_up(edge) else "-"
                source = "" if caller == entered_at else f"  (from {caller[1]})"
                lines.append(f"{'  ' * depth}{mark} {callee[0]}.{callee[1]} [{self.level.get(callee[0], 0)}]{source}")
                show(edge, depth + 1, callee)

        for root in self.trace.roots:
            lines.append(f"  {root[0]}.{root[1]} [{self.level.get(root[0], 0)}]")
            show(root, 1, root)
        return lines

    def report(self) -> str:
        numbers = self.numbers()
        entered = "\n".join(f"  {count}  {module}" for module, count in numbers["entered"].items())
        return (
            f"backend {self.backend}: the path ([level], ↑ a step back up)\n"
            + "\n".join(self.tree_lines())
            + f"\nbackend {self.backend}: {numbers['steps']} steps, {numbers['back_up']} back up "
            f"(target <= {MAX_BACK_UP}), most entered {max(numbers['entered'].values(), default=0)} "
            f"(target <= {MAX_ENTERED})\nentered per module:\n{entered}"
        )


def tiny_model_path(backend: str, level: dict[str, int]) -> ForwardPath:
    """One traced forward of a tiny model on ``backend``, after one warm-up forward."""
    import torch

    import vit_fast

    torch.manual_seed(0)
    cfg = vit_fast.ViTConfig(img_size=32, patch_size=16, embed_dim=32, depth=2, num_heads=2, num_classes=10)
    model = vit_fast.VisionTransformer(cfg, backend=backend).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        model(x)
        traced = trace(lambda: model(x))
    return ForwardPath(backend, traced, level)


def measure(backends: Iterable[str]) -> tuple[list[ForwardPath], dict[str, int], list[list[str]]]:
    level, cycles = levels(import_graph(installed_packages()))
    return [tiny_model_path(b, level) for b in backends], level, cycles


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
    paths, level, cycles = measure(args.backend or BACKENDS)
    for path in paths:
        print(path.report(), end="\n\n")
    if cycles:
        print(f"import cycles, each counted without its last import ({len(cycles)}):")
        for cycle in cycles:
            print("  " + " -> ".join(cycle))
    if json_path is not None:
        from vit_fast.util.files import write_json_atomic

        write_json_atomic(
            {
                "targets": {"back_up": MAX_BACK_UP, "entered": MAX_ENTERED},
                "backends": {p.backend: p.numbers() for p in paths},
                "levels": dict(sorted(level.items())),
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
