"""tools/forward_path.py, the measure of the image's path through our modules: its tracer on synthetic modules (a
lower module calling back up counts as a step back up, a loop counts once, nothing under a triton frame counts),
its module heights on a synthetic import graph, and one run on a tiny model with the torch backend, judged by the
path's structure, not by the targets."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "forward_path.py"


@pytest.fixture(scope="module")
def fp():
    spec = importlib.util.spec_from_file_location("forward_path_under_test", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # where its dataclasses are looked up
    spec.loader.exec_module(module)  # importing it runs nothing: only main() builds a model
    return module


def _module(name: str, source: str, **names) -> types.ModuleType:
    """A module named ``name`` (what the tracer reads from a frame's globals), made from ``source``."""
    module = types.ModuleType(name)
    module.__dict__.update(names)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


def _synthetic():
    high = _module("vit_fast.high", "def forward(x):\n    return low.run(x)\n\ndef helper(x):\n    return x + 1\n")
    kernel = _module("vit_fast.kernel_body", "def body(x):\n    return x\n")
    triton_runtime = _module("triton.runtime.fake_interpreter", "def launch(fn, x):\n    return fn(x)\n")
    low = _module(
        "vit_fast.low",
        "def run(x):\n"
        "    for _ in range(3):\n"
        "        x = high.helper(x)\n"  # back up to the higher module, three times: one edge
        "    x = inner(x)\n"
        "    return interpreter.launch(kernel.body, x)\n"  # under a triton frame: not ours to count
        "\ndef inner(x):\n"
        "    return x\n",
        high=high,
        kernel=kernel,
        interpreter=triton_runtime,
    )
    high.low = low
    return high


def test_tracer_counts_each_edge_once_and_a_call_back_up(fp):
    high = _synthetic()
    traced = fp.trace(lambda: high.forward(1))
    assert traced.roots == [("vit_fast.high", "forward")]
    assert traced.edges == [
        (("vit_fast.high", "forward"), ("vit_fast.low", "run")),
        (("vit_fast.low", "run"), ("vit_fast.high", "helper")),
    ]
    path = fp.ForwardPath("torch", traced, {"vit_fast.high": 1, "vit_fast.low": 0})
    numbers = path.numbers()
    assert (numbers["steps"], numbers["back_up"]) == (2, 1)
    assert numbers["entered"] == {"vit_fast.high": 1, "vit_fast.low": 1}
    assert path.tree_lines() == [
        "  vit_fast.high.forward [1]",
        "  - vit_fast.low.run [0]",
        "    ↑ vit_fast.high.helper [1]",
    ]
    assert path.offenders() == []


def test_offenders_name_the_module_entered_too_often(fp):
    a, b, c, m = ("vit_fast.a", "f"), ("vit_fast.b", "g"), ("vit_fast.c", "h"), ("vit_fast.m", "x")
    traced = fp.Trace(roots=[a], edges=[(a, m), (b, m), (c, m)], parent={(a, m): a, (b, m): a, (c, m): a})
    path = fp.ForwardPath("triton", traced, {})
    assert path.offenders() == [f"triton: vit_fast.m entered 3 times (at most {fp.MAX_ENTERED})"]
    up = fp.Trace(roots=[m], edges=[(m, a)] * (fp.MAX_BACK_UP + 1), parent={(m, a): m})
    assert (
        fp.ForwardPath("torch", up, {"vit_fast.a": 1})
        .offenders()[0]
        .startswith(
            f"torch: {fp.MAX_BACK_UP + 1} steps back up (at most {fp.MAX_BACK_UP}): vit_fast.m.x -> vit_fast.a.f"
        )
    )


def test_levels_count_the_height_and_break_cycles(fp):
    imports = {"top": {"mid", "low"}, "mid": {"low"}, "low": set(), "a": {"b"}, "b": {"a", "low"}}
    level, cycles = fp.levels(imports)
    assert level == {"low": 0, "mid": 1, "top": 2, "b": 1, "a": 2}
    assert cycles == [["a", "b", "a"]]


def test_the_tiny_model_on_torch_has_a_consistent_path(fp):
    from vit_fast.model.vit import VisionTransformer

    level, _ = fp.levels(fp.import_graph(fp.installed_packages()))
    assert VisionTransformer.__module__ in level and "vit_fast.kernels.cards" in level
    path = fp.tiny_model_path("torch", level)
    numbers = path.numbers()
    assert numbers["roots"] == [f"{VisionTransformer.__module__}.VisionTransformer.forward"]
    edges = path.trace.edges
    assert edges and len(set(edges)) == len(edges) == numbers["steps"]
    assert all(caller[0] != callee[0] for caller, callee in edges)
    assert all(m in level for edge in edges for m in (edge[0][0], edge[1][0]))
    assert numbers["back_up"] == sum(level[b[0]] > level[a[0]] for a, b in edges)
    assert sum(numbers["entered"].values()) == numbers["steps"]
    assert len(path.tree_lines()) == 1 + numbers["steps"]  # the root, then each edge once
    assert not any(callee[0].startswith("vit_fast.backend.triton_path") for _, callee in edges)
