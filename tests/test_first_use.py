"""The safety net at first use (vit_fast/first_use.py): a kernel's first output per (device, triton version,
dtype, shape class) is judged against eager PyTorch and float64; a kernel that fails falls back to eager PyTorch for
the process with one warning. Compiled kernels are checked by default; under the interpreter these tests switch it
on with VIT_FAST_FIRST_USE_CHECK=1, and break a kernel on purpose to see the fallback."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from vit_fast import doctor, first_use, triton_path
from vit_fast.kernels import _interpret

from .numerics import assert_within_eager
from .util import tiny_model


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
    real_launch = triton_path.launch_attention
    calls = []

    def broken_attention(*args, **kwargs):
        calls.append(1)
        return real_launch(*args, **kwargs) + 0.5  # a kernel that is wrong on this card

    monkeypatch.setattr(triton_path, "launch_attention", broken_attention)
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
    assert _interpret.interpreter_enabled()  # the suite itself still runs interpreted


def test_a_bad_switch_value_is_named(monkeypatch):
    monkeypatch.setenv(first_use.ENV, "banana")
    with pytest.raises(ValueError, match=r"VIT_FAST_FIRST_USE_CHECK='banana' .* use 1 or 0"):
        first_use.enabled()


def test_not_under_autograd():
    model, x = _model_and_input()
    model.set_backend("triton")
    model(x.requires_grad_())
    assert first_use.report()["checked"] == []
