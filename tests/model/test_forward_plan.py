"""The forward planned once (``VisionTransformer.forward_plan``; docs/development.md, "The forward, planned once"):
one plan per call shape, kept while nothing that decides it changes and made again when something does; a forward
under the first-use net is planned again until its shapes are cleared; ``stages`` and ``packing`` read the plan,
never the model's methods."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import torch

from vit_fast.backend import first_use, triton_path
from vit_fast.kernels import autotune
from vit_fast.model import packing, stages
from vit_fast.model.layers import TORCH_FUNCTIONAL
from vit_fast.model.vit import VisionTransformer

from ..fakes import tiny_model

MODEL = Path(stages.__file__).parent


def test_stages_and_packing_call_no_method_of_the_model():
    """Whatever the model resolved comes in the plan: no ``model.<method>(...)`` of VisionTransformer (or what it
    inherits) in the two modules that run its forward."""
    methods = {
        name
        for cls in VisionTransformer.__mro__
        if cls.__module__.startswith("vit_fast")
        for name, value in vars(cls).items()
        if inspect.isfunction(value)
    }
    assert {"forward_plan", "backend_for_call", "tuning_mode", "check_input"} <= methods
    for module in (stages, packing):
        tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
        calls = [
            f"{module.__name__}:{node.lineno} model.{node.func.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "model"
            and node.func.attr in methods
        ]
        assert calls == []


def test_the_torch_plan_is_kept_per_call_shape():
    model = tiny_model(dynamic_img_size=True)
    x = torch.randn(2, 3, 32, 32)
    plan = model.forward_plan(x, first_token=True)
    assert (plan.backend, plan.ops, plan.first_token, plan.packed, plan.done) == (
        "torch",
        TORCH_FUNCTIONAL,
        True,
        False,
        None,
    )
    assert model.forward_plan(x, first_token=True) is plan
    assert model.forward_plan(torch.randn(2, 3, 32, 32), first_token=True) is plan  # the shape, not the tensor
    assert model.forward_plan(x) is not plan and not model.forward_plan(x).first_token
    assert model.forward_plan(torch.randn(1, 3, 32, 32), first_token=True) is not plan
    assert model.forward_plan(torch.randn(2, 3, 16, 32), first_token=True) is not plan
    assert tiny_model(dynamic_img_size=True).forward_plan(x, first_token=True) is not plan  # per model
    images = [torch.randn(3, 32, 32), torch.randn(3, 16, 32)]
    packed, layout = model._packed_plan(images)
    assert packed.packed and packed.ops.layout == layout and model._packed_plan(images)[0] is packed


def test_the_kernels_plan_is_made_again_when_what_decides_it_changes(monkeypatch):
    monkeypatch.delenv("VIT_FAST_FUSE_LN", raising=False)
    monkeypatch.delenv("VIT_FAST_AUTOTUNE", raising=False)
    monkeypatch.setenv(first_use.ENV, "0")
    model = tiny_model().set_backend("triton")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        plan = model.forward_plan(x)
        assert (plan.backend, plan.ops, plan.fused, plan.tune, plan.check_params) == (
            "triton",
            triton_path._FORWARD[True],  # autograd off: the forward launches directly, asked once
            True,
            False,
            True,
        )
        assert model.forward_plan(x) is plan
        monkeypatch.setenv("VIT_FAST_FUSE_LN", "0")
        assert not model.forward_plan(x).fused
        monkeypatch.delenv("VIT_FAST_FUSE_LN")
        assert model.forward_plan(x) is not plan and model.forward_plan(x).fused
        plan = model.forward_plan(x)
        model.fuse_layer_norm = False
        assert not model.forward_plan(x).fused
        model.fuse_layer_norm = True
        model.autotune = True
        assert model.forward_plan(x).tune
        with autotune.tuning():  # tuned by the caller: the forward runs tuned, read once for its plan
            assert model.forward_plan(x).tune
        model.autotune = False
        assert model.forward_plan(x) is plan
        with autotune.tuning():  # the kernels' configs differ: the pick is made again (the same ops here)
            tuned = model.forward_plan(x)
            assert tuned is not plan and tuned.tune and tuned.ops is plan.ops and model.forward_plan(x) is tuned
        with autotune.tuning(False):  # an enclosing tuning(False): a model that asked for tuning still tunes
            model.autotune = True
            assert model.forward_plan(x).tune
            model.autotune = False
            assert model.forward_plan(x).tune is False
    # autograd on: a plan of its own (grad mode decides it), the same kernel ops with the parameters checked once;
    # each call picks the torch.library op where autograd needs it (kernels.launches.launches_directly)
    grad_plan = model.forward_plan(x)
    assert grad_plan is not plan and grad_plan.ops is triton_path._FORWARD[False] and grad_plan.check_params
    assert model.forward_plan(x) is grad_plan
    needs_grad = model.forward_plan(x.requires_grad_())
    assert needs_grad is not grad_plan and needs_grad == grad_plan
    with torch.no_grad():
        assert model.set_backend("torch").forward_plan(x).backend == "torch"


def test_a_forward_under_the_first_use_net_is_planned_until_it_clears(monkeypatch):
    monkeypatch.setenv(first_use.ENV, "1")
    first_use.reset()
    try:
        model = tiny_model(depth=1).set_backend("triton")
        x = torch.randn(1, 3, 32, 32)
        with torch.no_grad():
            checked = model.forward_plan(x)
            assert checked.ops is triton_path._FORWARD_NET[True] and checked.done is not None
            assert model.forward_plan(x) is not checked  # not kept: the forward may clear its shapes
            model(x)  # every op judged and passed: the shapes are cleared
            assert not first_use.failed_ops()
            cleared = model.forward_plan(x)
            assert cleared.ops is triton_path._FORWARD[True] and cleared.done is None
            assert model.forward_plan(x) is cleared
    finally:
        first_use.reset()


def test_a_planned_forward_decides_direct_launch_and_tuning_once(monkeypatch):
    """Host time: with autograd off a planned forward asks direct launch or op once (its ops hold the launchers) and
    reads its tuning mode once, not at every launch; with autograd on each call asks (a parameter may want its
    gradient)."""
    from vit_fast.kernels import _launch
    from vit_fast.kernels import autotune as autotune_module
    from vit_fast.kernels.launches import record_launches

    monkeypatch.setenv(first_use.ENV, "0")
    monkeypatch.delenv("VIT_FAST_AUTOTUNE", raising=False)
    model = tiny_model(depth=2).set_backend("triton").requires_grad_(False)
    x = torch.randn(1, 3, 32, 32)
    asked, switches = [], []
    decide, switch = _launch.launches_directly, autotune_module.switch
    monkeypatch.setattr(_launch, "launches_directly", lambda *a: asked.append(1) or decide(*a))
    monkeypatch.setattr(autotune_module, "switch", lambda name, *a: switches.append(name) or switch(name, *a))
    with torch.no_grad():
        model(x)  # planned
        del asked[:], switches[:]
        with record_launches() as launched:
            model(x)
        read = switches.count("VIT_FAST_AUTOTUNE")  # once, for the kept plan's state: not per launch
        assert model.forward_plan(x).ops.direct and not asked
    assert len(launched) >= 10 and read == 1, switches
    with record_launches() as launched:
        model(x)  # autograd on, frozen parameters: each call asks, and launches directly
    assert not model.forward_plan(x).ops.direct and len(asked) == len(launched) >= 10
