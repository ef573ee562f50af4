"""tools/forward_path.py, the measure of the image's path through our modules: its tracer on synthetic modules (only a
call given an activation is a step, a frame without one passes its caller through, a lower-layer module calling a
higher one goes back up, a loop counts once, nothing under a triton frame counts), entered as fan-in by module, its
heights on a synthetic import graph (layer first, then the level among the layer's imports), and one run on a tiny
model with the torch backend, judged by the path's structure, not by the targets."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

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


NET, OPS, OTHER = "vit_fast.model.net", "vit_fast.kernels.ops", "vit_fast.kernels.other"
SETTINGS = "vit_fast.util.settings"


def _synthetic():
    """net.forward (model) -> ops.run (kernels), which calls back up to net.helper three times, gives other.scale only
    a parameter and other.shift only a buffer (no steps), reaches other.apply through settings.run_when (no tensor:
    not a step, passed through), other.pack through ``*args`` and other.unpack through ``**kwargs``, and runs a kernel
    body under a triton frame (not counted)."""
    net = _module(NET, "def forward(x):\n    return ops.run(x)\n\ndef helper(x):\n    return x + 1\n")
    other = _module(
        OTHER,
        "def scale(w):\n    return w\n\n"
        "def shift(b, eps=1.0):\n    return b\n\n"
        "def apply(x):\n    return (lambda: x)()\n\n"  # x is a cell variable: still read at the call
        "def pack(*tensors):\n    return tensors[0]\n\n"
        "def unpack(**named):\n    return named['x']\n\n"
        "def body(x):\n    return x\n",
    )
    settings = _module(SETTINGS, "def run_when(flag, fn):\n    return fn() if flag else None\n")
    triton_runtime = _module("triton.runtime.fake_interpreter", "def launch(fn, x):\n    return fn(x)\n")
    ops = _module(
        OPS,
        "def run(x):\n"
        "    for _ in range(3):\n"
        "        x = net.helper(x)\n"  # back up to the higher layer, three times: one edge
        "    other.scale(weight)\n"  # a parameter only: not on the path
        "    other.shift(buffer)\n"  # a buffer of the model only: not on the path
        "    x = settings.run_when(True, lambda: other.apply(x))\n"  # passed through to other.apply, from run
        "    x = other.pack(x, 2)\n"
        "    x = other.unpack(x=x)\n"
        "    return interpreter.launch(other.body, x)\n",  # under a triton frame: not ours to count
        net=net,
        other=other,
        settings=settings,
        interpreter=triton_runtime,
        weight=torch.nn.Parameter(torch.ones(2)),
        buffer=torch.zeros(2),
    )
    net.ops = ops
    return net, ops


def test_tracer_records_only_calls_given_an_activation_and_a_call_back_up(fp):
    net, ops = _synthetic()
    traced = fp.trace(lambda: net.forward(torch.ones(2)), weights={id(ops.buffer)})
    run = (OPS, "run")
    assert traced.roots == [(NET, "forward")]
    assert traced.edges == [
        ((NET, "forward"), run),
        (run, (NET, "helper")),
        (run, (OTHER, "apply")),
        (run, (OTHER, "pack")),
        (run, (OTHER, "unpack")),
    ]
    height = {
        NET: (fp.RANK["model"], 0),
        OPS: (fp.RANK["kernels"], 1),
        OTHER: (fp.RANK["kernels"], 0),
        SETTINGS: (fp.RANK["util"], 0),
    }
    path = fp.ForwardPath("torch", traced, height)
    numbers = path.numbers()
    assert (numbers["steps"], numbers["back_up"]) == (5, 1)
    assert numbers["entered"] == {OTHER: 1, OPS: 1, NET: 1}
    assert numbers["edges_into"] == {OPS: 1, NET: 1, OTHER: 3}
    assert path.tree_lines() == [
        f"  {NET}.forward [model:0]",
        f"  - {OPS}.run [kernels:1]",
        f"    ↑ {NET}.helper [model:0]",
        f"    - {OTHER}.apply [kernels:0]",
        f"    - {OTHER}.pack [kernels:0]",
        f"    - {OTHER}.unpack [kernels:0]",
    ]
    assert path.offenders() == []
    # without the buffer's id, the buffer is an activation like any other tensor
    unweighted = fp.trace(lambda: net.forward(torch.ones(2)))
    assert (run, (OTHER, "shift")) in unweighted.edges and (run, (OTHER, "scale")) not in unweighted.edges


def test_entered_counts_the_modules_stepping_in_not_the_functions(fp):
    a, a2, b = ("vit_fast.a", "f"), ("vit_fast.a", "g"), ("vit_fast.b", "h")
    m, m2 = ("vit_fast.m", "x"), ("vit_fast.m", "y")
    edges = [(a, m), (a2, m), (a, m2), (b, m)]
    others = [(f"vit_fast.c{i}", "k") for i in range(fp.MAX_ENTERED - 1)]  # with a and b: the most allowed
    height = {name: (0, 0) for name in ("vit_fast.a", "vit_fast.b", "vit_fast.m", *(c for c, _ in others))}
    path = fp.ForwardPath("triton", fp.Trace(roots=[a], edges=edges, parent=dict.fromkeys(edges, a)), height)
    numbers = path.numbers()
    assert numbers["entered"]["vit_fast.m"] == 2 and numbers["edges_into"]["vit_fast.m"] == 4
    assert numbers["entered_from"]["vit_fast.m"] == ["vit_fast.a", "vit_fast.b"]
    edges += [(c, m) for c in others[:-1]]
    path = fp.ForwardPath("triton", fp.Trace(roots=[a], edges=edges, parent=dict.fromkeys(edges, a)), height)
    assert path.numbers()["entered"]["vit_fast.m"] == fp.MAX_ENTERED and path.offenders() == []
    edges += [(others[-1], m)]
    path = fp.ForwardPath("triton", fp.Trace(roots=[a], edges=edges, parent=dict.fromkeys(edges, a)), height)
    callers = ", ".join(["vit_fast.a", "vit_fast.b", *(c for c, _ in others)])
    assert path.offenders() == [
        f"triton: vit_fast.m entered from {fp.MAX_ENTERED + 1} modules (at most {fp.MAX_ENTERED}): {callers}"
    ]


def test_offenders_name_each_step_back_up(fp):
    low, high = ("vit_fast.kernels.k", "f"), ("vit_fast.model.m", "g")
    edges = [(low, (high[0], f"g{i}")) for i in range(fp.MAX_BACK_UP + 1)]
    height = {low[0]: (fp.RANK["kernels"], 5), high[0]: (fp.RANK["model"], 0)}
    path = fp.ForwardPath("torch", fp.Trace(roots=[low], edges=edges, parent=dict.fromkeys(edges, low)), height)
    assert path.offenders() == [
        f"torch: {fp.MAX_BACK_UP + 1} steps back up (at most {fp.MAX_BACK_UP}): "
        + ", ".join(f"vit_fast.kernels.k.f -> vit_fast.model.m.g{i}" for i in range(fp.MAX_BACK_UP + 1))
    ]


def test_levels_count_the_height_and_break_cycles(fp):
    imports = {"top": {"mid", "low"}, "mid": {"low"}, "low": set(), "a": {"b"}, "b": {"a", "low"}}
    level, cycles = fp.levels(imports)
    assert level == {"low": 0, "mid": 1, "top": 2, "b": 1, "a": 2}
    assert cycles == [["a", "b", "a"]]


def test_heights_rank_the_layer_first_then_the_level_within_it(fp):
    k = [f"vit_fast.kernels.k{i}" for i in range(4)]
    imports = {
        k[0]: set(),
        k[1]: {k[0]},
        k[2]: {k[1]},
        k[3]: {k[2]},  # deep inside the lowest layer
        "vit_fast.util.u": {k[3]},  # imports from below do not raise its level
        "vit_fast.model.a": {"vit_fast.model.b", "vit_fast.util.u"},
        "vit_fast.model.b": {"vit_fast.model.a"},  # a cycle inside the model layer
        "vit_fast": {"vit_fast.model.a"},  # the package itself: interop
        "vit_fast.newthing": set(),  # in no layer: above every layer
    }
    height, cycles = fp.heights(imports)
    assert height == {
        k[0]: (fp.RANK["kernels"], 0),
        k[1]: (fp.RANK["kernels"], 1),
        k[2]: (fp.RANK["kernels"], 2),
        k[3]: (fp.RANK["kernels"], 3),
        "vit_fast.util.u": (fp.RANK["util"], 0),
        "vit_fast.model.a": (fp.RANK["model"], 1),  # b's import of a, closing the cycle, counts as absent
        "vit_fast.model.b": (fp.RANK["model"], 0),
        "vit_fast": (fp.RANK["interop"], 0),
        "vit_fast.newthing": (len(fp.LAYERS), 0),
    }
    assert cycles == [["vit_fast.model.a", "vit_fast.model.b", "vit_fast.model.a"]]
    labels = [fp.label(height[m]) for m in (k[3], "vit_fast", "vit_fast.newthing")]
    assert labels == ["kernels:3", "interop:0", "no layer:0"]
    up = fp.ForwardPath("torch", fp.Trace(), height)
    assert up.back_up(((k[3], "f"), ("vit_fast.util.u", "g")))  # a higher layer, whatever the levels
    assert not up.back_up((("vit_fast.util.u", "g"), (k[3], "f")))
    assert up.back_up((("vit_fast.model.b", "f"), ("vit_fast.model.a", "g")))  # the same layer, a higher level
    assert not up.back_up(((k[0], "f"), (k[0], "g")))


@pytest.fixture(scope="module")
def height(fp):
    return fp.heights(fp.import_graph(fp.installed_packages()))[0]


def test_the_tiny_model_on_torch_has_a_consistent_path(fp, height):
    from vit_fast.model.vit import VisionTransformer

    assert VisionTransformer.__module__ in height and "vit_fast.base.cards" in height
    assert height[VisionTransformer.__module__][0] == fp.RANK["model"] and height["vit_fast"][0] == fp.RANK["interop"]
    path = fp.tiny_model_path("torch", height)
    numbers = path.numbers()
    assert numbers["roots"] == [f"{VisionTransformer.__module__}.VisionTransformer.forward"]
    edges = path.trace.edges
    assert edges and len(set(edges)) == len(edges) == numbers["steps"]
    assert all(caller[0] != callee[0] for caller, callee in edges)
    assert all(m in height for edge in edges for m in (edge[0][0], edge[1][0]))
    assert numbers["back_up"] == sum(height[b[0]] > height[a[0]] for a, b in edges)
    assert sum(numbers["edges_into"].values()) == numbers["steps"]
    assert all(1 <= numbers["entered"][m] <= numbers["edges_into"][m] for m in numbers["entered"])
    assert len(path.tree_lines()) == 1 + numbers["steps"]  # the root, then each edge once
    # the torch backend's path runs no kernel launcher (of the kernels' files, only their eager references), and the
    # switches it reads are not on it
    assert not any(callee[0].startswith("vit_fast.backend.triton_path") for _, callee in edges)
    assert all(callee[1].endswith("_ref") for _, callee in edges if callee[0].startswith("vit_fast.kernels"))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_the_tiny_models_path_meets_the_targets(fp, height, backend):
    """The targets on the real forward (the triton backend's kernels in the interpreter): at most MAX_BACK_UP steps
    back up, no module entered from more than MAX_ENTERED modules; and the forward is planned once: the traced
    forward, the second of its shape, reads the plan the first resolved and picks no ops."""
    path = fp.tiny_model_path(backend, height)
    assert path.offenders() == []
    numbers = path.numbers()
    assert numbers["back_up"] <= fp.MAX_BACK_UP and max(numbers["entered"].values()) <= fp.MAX_ENTERED
    callees = {callee for _, callee in path.trace.edges}
    assert ("vit_fast.backend.triton_path", "ops_for") not in callees
    assert ("vit_fast.model.vit", "VisionTransformer.backend_for_call") not in callees
    if backend == "triton":  # the kernels ran, through the plan's ops
        assert any(module == "vit_fast.backend.triton_path" for module, _ in callees)
