"""The one step-aside policy (:func:`vit_fast.interop.forwards.step_aside`), table-driven: every reason at every
call-site kind (timm block, timm pool head, transformers layer and pooling head), what it answers and what it says
(the reasons the user chose said once per model; the others silent). Tiny stand-in modules; no kernel runs."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from vit_fast.interop import forwards
from vit_fast.interop.forwards import SITES, share_said, step_aside

PREFIX = torch.tensor([[True, True, False], [True, True, True]])  # key padding of a prefix of each row
HOLES = torch.tensor([[True, False, True], [True, True, True]])  # not a prefix: the library's own forward


def _module(training: bool = False) -> nn.Module:
    module = nn.Linear(4, 4).train(training)
    share_said(nn.Module(), [module])
    return module


# name -> (step_aside keyword arguments, training, dtype, backend, patched state, expected reason, said substring)
CASES = {
    "kernels": ({}, False, torch.float32, "triton", None, None, None),
    "torchscript trace": ({}, False, torch.float32, "triton", "jit", "recording", None),
    "onnx export (either exporter)": ({}, False, torch.float32, "triton", "onnx", "recording", None),
    "arguments": ({"foreign": True}, False, torch.float32, "triton", None, "arguments", None),
    "attentions": ({"attentions": True}, False, torch.float32, "triton", None, "attentions", "attentions requested"),
    "training": ({}, True, torch.float32, "triton", None, "training", "training mode"),
    "float64": ({}, False, torch.float64, "triton", None, "dtype", "float64 input"),
    "cpu under auto": ({}, False, torch.float32, "auto", None, "dtype", None),  # never the kernels: silent
    "float64 under auto on a cpu": ({}, False, torch.float64, "auto", None, "dtype", None),
    "replaced or hooked": ({"ready": lambda: False}, False, torch.float32, "triton", None, "replaced or hooked", None),
    "key padding": ({"mask": PREFIX}, False, torch.float32, "triton", None, None, None),
    "other mask": ({"mask": HOLES}, False, torch.float32, "triton", None, "mask", None),
    "mask, no lengths kernel": ({"mask": PREFIX, "takes_lengths": False}, False, torch.float32, "triton", None,
                                "mask", None),
}  # fmt: skip


def _patched_state(monkeypatch, state: str | None) -> None:
    if state == "jit":
        monkeypatch.setattr(torch.jit, "is_tracing", lambda: True)
    elif state == "onnx":
        monkeypatch.setattr(torch.onnx, "is_in_onnx_export", lambda: True)
    elif state == "export":
        monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    elif state == "compile":
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)


@pytest.mark.parametrize("site", list(SITES))
@pytest.mark.parametrize("case", list(CASES))
def test_each_reason_at_each_site(site, case, monkeypatch):
    kwargs, training, dtype, backend, state, expected, said = CASES[case]
    module = _module(training)
    x = torch.zeros(2, 3, 4, dtype=dtype)
    _patched_state(monkeypatch, state)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = step_aside(module, site, x, backend, **kwargs)
        again = step_aside(module, site, x, backend, **kwargs)
    assert first[0] == expected and again[0] == expected, (first, again)
    lengths = first[1]
    if case == "key padding":
        assert lengths is not None and lengths.tolist() == [2, 3]
    else:
        assert lengths is None
    messages = [str(w.message) for w in caught]
    if said is None:
        assert messages == [], messages
    else:  # said once per model, naming the site's modules
        assert len(messages) == 1 and said in messages[0] and SITES[site] in messages[0], messages


@pytest.mark.parametrize("site", list(SITES))
def test_each_exporter_at_each_site(site, monkeypatch):
    """TorchScript and ONNX (either exporter) record every site's library forward (the "torchscript trace" and
    "onnx export" rows above); torch.export records our ops at timm's sites and transformers' own graph at its
    sites, and keeps any mask (a data-dependent answer) on the library's forward."""
    module, x = _module(), torch.zeros(2, 3, 4)
    _patched_state(monkeypatch, "export")
    expected = None if site.startswith("timm") else "export"
    assert step_aside(module, site, x, "triton") == (expected, None)
    assert step_aside(module, site, x, "triton", mask=PREFIX)[0] == (expected or "mask")
    assert step_aside(module, site, x, "triton", foreign=True)[0] == "arguments"


def test_under_export_a_timm_site_on_its_own_forward_says_the_export_note(monkeypatch):
    """Not the run-time fallback: the exported graph holds none of our ops, said once per device and dtype."""
    monkeypatch.setattr(forwards, "_EXPORT_WARNED", set())
    _patched_state(monkeypatch, "export")
    module, x = _module(), torch.zeros(2, 3, 4, dtype=torch.float64)
    with pytest.warns(UserWarning, match=r"torch.export on cpu \(torch.float64\) records timm's own"):
        assert step_aside(module, "timm_pool", x, "triton")[0] == "dtype"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert step_aside(module, "timm_block", x, "triton")[0] == "dtype"  # said already
        assert step_aside(module, "hf_layer", x, "triton")[0] == "export"  # transformers' graph: nothing to say


@pytest.mark.parametrize("site", list(SITES))
def test_under_compile_a_pool_head_keeps_its_mask_on_its_own_forward(site, monkeypatch):
    """torch.compile reads a layer's key-padding mask in the graph; a pool head takes its own forward."""
    _patched_state(monkeypatch, "compile")
    monkeypatch.setattr(forwards, "key_padding_lengths", lambda mask, b, t: torch.tensor([2, 3]))
    reason, lengths = step_aside(_module(), site, torch.zeros(2, 3, 4), "triton", mask=PREFIX)
    assert (reason is None and lengths is not None) if site in ("timm_block", "hf_layer") else reason == "mask"
