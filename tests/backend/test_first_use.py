"""The safety net at first use (vit_fast/backend/first_use.py): a kernel's first output per (device, triton version,
dtype, config, shape class) is judged against eager PyTorch and float64; a kernel that fails falls back to eager
PyTorch for the process with one warning. Compiled kernels are checked by default; under the interpreter these tests
switch it on with VIT_FAST_FIRST_USE_CHECK=1, and break a kernel (or one config of it) on purpose to see the
fallback."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import triton

from vit_fast import doctor
from vit_fast.backend import first_use, triton_path
from vit_fast.base import interpret
from vit_fast.kernels import KERNELS, autotune, launches
from vit_fast.kernels import attention as attention_module

from ..fakes import tiny_model
from ..numerics import assert_within_eager


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv(first_use.ENV, "1")
    first_use.reset()
    yield
    first_use.reset()


def _model_and_input(batch: int = 2):
    model = tiny_model(seed=3, img_size=16, patch_size=4, embed_dim=32, num_heads=2, depth=2)
    return model, torch.randn(batch, 3, 16, 16)


def _triton_forward(model, x):
    model.set_backend("triton")
    with torch.no_grad():
        return model(x)


def test_every_kernel_is_checked_once_per_shape_class(monkeypatch):
    model, x = _model_and_input()
    judged = []
    real_check = first_use.check
    monkeypatch.setattr(first_use, "check", lambda key, *a, **k: judged.append(key) or real_check(key, *a, **k))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing fails, nothing warns
        _triton_forward(model, x)
    ops = {key[0] for key in judged}
    assert ops == {"patch_embed", "layer_norm_linear", "attention", "linear", "layer_norm"}
    report = first_use.report()
    assert report["enabled"] and not report["failed"]
    assert all(f["passed"] and f["max_err"] <= f["bound"] for f in report["checked"])
    assert doctor.first_use_check()["status"] == "ok"
    first = len(judged)
    _triton_forward(model, x)  # same shapes: the forward is cleared, nothing judged again
    _triton_forward(model, x[:1])  # batch 1 is the same row class here (m_class): no new check either
    assert len(judged) == first


def test_a_wrong_kernel_falls_back_to_eager_for_the_process(monkeypatch):
    model, x = _model_and_input()
    with torch.no_grad():
        eager = model(x)  # torch backend
        ref64 = copy.deepcopy(model).double()(x.double())
    real_launch = attention_module.launch_attention
    calls = []

    def broken_attention(*args, **kwargs):
        calls.append(1)
        return real_launch(*args, **kwargs) + 0.5  # a kernel that is wrong on this card

    monkeypatch.setattr(attention_module, "launch_attention", broken_attention)  # what the attention op launches
    with pytest.warns(RuntimeWarning, match=r"_attention_kernel .* on cpu .*'attention' runs in eager PyTorch"):
        out = _triton_forward(model, x)
    assert len(calls) == 1  # checked on its first call, in block 0; block 1 already ran eagerly
    assert first_use.failed_ops() == {"attention"}
    assert_within_eager(out, eager, ref64, "logits with attention fallen back")  # right despite the broken kernel
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning per process, not one per forward
        again = _triton_forward(model, x)
    assert len(calls) == 1 and torch.equal(again, out)
    (failed,) = first_use.report()["failed"]
    assert failed["op"] == "attention" and failed["max_err"] > failed["bound"] and failed["device"] == "cpu"
    seen_by_doctor = doctor.first_use_check()  # vit-fast doctor reports it
    assert seen_by_doctor["status"] == "failed" and "_attention_kernel" in seen_by_doctor["summary"]


#: what the GEMM's autotuner picks under tuning() in the tests below: a config other than the heuristic's (32x64x32
#: under the interpreter), as a GPU's timings may pick
TUNED = triton.Config({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "TMA": 0}, num_warps=4)
GEMM_OPS = {"linear", "layer_norm_linear"}


@pytest.fixture
def tuned_gemm(monkeypatch) -> str:
    """Under tuning() the GEMM's autotuner picks TUNED (the interpreter cannot time configs, and its prune keeps the
    heuristic's pick only); its cache starts empty and is put back afterwards. The heuristic path is untouched (it
    calls the prune directly). Returns TUNED's label, as findings name it."""
    kernel = KERNELS["linear"].kernel
    monkeypatch.setattr(kernel, "cache", {})
    monkeypatch.setattr(kernel, "early_config_prune", lambda configs, named_args, **kwargs: [TUNED])
    # triton 3.6 times even a lone config (3.9 does not): a stand-in benchmarker, so no GPU is asked for
    monkeypatch.setitem(vars(kernel), "do_bench", lambda fn, quantiles=None: [1.0, 1.0, 1.0])
    return str(TUNED)


def _judged(monkeypatch) -> list[tuple]:
    """The keys first_use.check is asked to judge, in order."""
    judged, real_check = [], first_use.check
    monkeypatch.setattr(first_use, "check", lambda key, *a, **k: judged.append(key) or real_check(key, *a, **k))
    return judged


def test_a_tuned_config_is_checked_after_the_heuristic_one(monkeypatch, tuned_gemm):
    """An untuned forward checks the heuristic configs; the same forward tuned runs the GEMMs with another config,
    which is checked in its turn (the forward cleared without tuning is not cleared with it), and the finding names
    it; the kernels whose tuned config is the heuristic's are not judged twice. Afterwards both modes are cleared."""
    model, x = _model_and_input()
    judged = _judged(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing fails, nothing warns
        _triton_forward(model, x)
        untuned = len(judged)
        heuristic = {f["config"] for f in first_use.report()["checked"] if f["op"] in GEMM_OPS}
        with autotune.tuning():
            _triton_forward(model, x)
    assert tuned_gemm not in heuristic
    tuned = judged[untuned:]
    assert {key[0] for key in tuned} == GEMM_OPS and all(key[4] == tuned_gemm for key in tuned)
    findings = [f for f in first_use.report()["checked"] if f["config"] == tuned_gemm]
    assert {f["op"] for f in findings} == GEMM_OPS and all(f["passed"] for f in findings)
    checked = len(judged)
    with autotune.tuning():
        _triton_forward(model, x)
    _triton_forward(model, x)
    assert len(judged) == checked
    with torch.no_grad():
        assert triton_path.ops_for(model, x) is triton_path._FORWARD[True]  # cleared: one lookup
        monkeypatch.setenv("VIT_FAST_TMA", "0")  # another switch that decides configs: under the net again
        assert triton_path.ops_for(model, x) is triton_path._FORWARD_NET[True]


def test_a_wrong_tuned_config_falls_back_to_eager(monkeypatch, tuned_gemm):
    """The GEMM is right with its heuristic config and wrong (output + 0.5) only with the tuned one: the untuned
    forward passes; the tuned forward's GEMMs are judged, fail, and fall back to eager PyTorch with a warning naming
    the tuned config, and the model's output still meets the numerics rule."""
    model, x = _model_and_input()
    with torch.no_grad():
        eager = model(x)  # torch backend
        ref64 = copy.deepcopy(model).double()(x.double())
    out_index = KERNELS["linear"].launches.arg_names.index("out_ptr")
    real_triton = launches.ResolvedLaunches._triton

    def wrong_when_tuned(self, grid, args, constexprs):
        run, config = real_triton(self, grid, args, constexprs)
        if self is KERNELS["linear"].launches and str(config) == tuned_gemm:
            args[out_index].add_(0.5)
        return run, config

    monkeypatch.setattr(launches.ResolvedLaunches, "_triton", wrong_when_tuned)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _triton_forward(model, x)  # the heuristic configs: right
    with pytest.warns(RuntimeWarning, match=r"_linear_kernel \(BLOCK_M: 16, .*runs in eager PyTorch"):
        with autotune.tuning():
            out = _triton_forward(model, x)
    assert first_use.failed_ops() == GEMM_OPS
    assert all(f["config"] == tuned_gemm for f in first_use.report()["failed"])
    assert_within_eager(out, eager, ref64, "logits with the tuned GEMM fallen back")


def test_off_switch(monkeypatch):
    monkeypatch.setenv(first_use.ENV, "0")
    model, x = _model_and_input()
    monkeypatch.setattr(first_use, "check", lambda *a, **k: pytest.fail("checked with the net switched off"))
    _triton_forward(model, x)
    assert first_use.report()["checked"] == []


@pytest.mark.parametrize("value, interpreted, on", [("", True, False), ("", False, True), ("off", False, False)])
def test_default_is_on_for_compiled_kernels_only(monkeypatch, value, interpreted, on):
    monkeypatch.setenv(first_use.ENV, value)
    monkeypatch.setattr(first_use, "interpreter_enabled", lambda: interpreted)
    assert first_use.enabled() is on
    assert interpret.interpreter_enabled()  # the suite itself still runs interpreted


def test_a_bad_switch_value_is_named(monkeypatch):
    monkeypatch.setenv(first_use.ENV, "banana")
    with pytest.raises(ValueError, match=r"VIT_FAST_FIRST_USE_CHECK='banana' .* use 1 or 0"):
        first_use.enabled()


def _input_grad(model, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.clone().requires_grad_()
    out = model(x)
    (grad,) = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum(), x)
    return out, grad


def test_checked_under_autograd_and_a_failed_op_keeps_its_gradient(monkeypatch):
    """An eval model called with autograd on (parameters requiring grad) runs the custom ops: they are judged on
    first use as in inference, with the side computations outside autograd's graph; an op that fails hands back its
    eager reference's output, whose gradient is eager's."""
    model, x = _model_and_input()
    with torch.no_grad():
        eager = model(x)  # torch backend
    ref64 = copy.deepcopy(model).double()
    _, eager_grad = _input_grad(model, x)
    _, grad64 = _input_grad(ref64, x.double())
    real = attention_module.launch_attention
    monkeypatch.setattr(  # what the op autograd goes through launches
        attention_module, "launch_attention", lambda *args, **kwargs: real(*args, **kwargs) + 0.5
    )
    model.set_backend("triton")
    with pytest.warns(RuntimeWarning, match=r"'attention' runs in eager PyTorch"):
        out, grad = _input_grad(model, x)
    assert first_use.failed_ops() == {"attention"}
    assert {f["op"] for f in first_use.report()["checked"]} >= {"attention", "layer_norm_linear", "linear"}
    assert out.requires_grad
    assert_within_eager(out.detach(), eager, ref64(x.double()).detach(), "logits with attention fallen back")
    assert_within_eager(grad, eager_grad, grad64, "input gradient with attention fallen back")
