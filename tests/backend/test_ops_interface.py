"""The one interface between the model and the kernels (vit_fast/backend/ops.py): every ops class implements each of
its ops itself, with the interface's parameters (no ``__getattr__`` forwarding), attention's signature is written
once (each class implements ``attend``, the masks as one ``AttentionMasks``), and the checked kernel ops judge every
op."""

from __future__ import annotations

import inspect

import pytest
import torch

from vit_fast.backend import first_use, ops, triton_path
from vit_fast.model import layers, packing

OPS_CLASSES = [
    layers.TorchOps,
    triton_path._Ops,
    triton_path._CheckedOps,
    triton_path._WithLengths,
    packing.PackedOps,
    ops.ForwardingOps,
]


def test_the_interface_names_the_nine_ops():
    assert set(ops.OP_NAMES) == {
        "linear",
        "norm_linear",
        "rms_norm_linear",
        "layer_norm",
        "rms_norm",
        "attend",
        "diff_attention",
        "attention_pool",
        "patch_embed",
    }


@pytest.mark.parametrize("cls", OPS_CLASSES, ids=lambda c: c.__name__)
def test_every_ops_class_implements_every_op_with_its_parameters(cls):
    assert issubclass(cls, ops.Ops)
    assert not cls.__abstractmethods__, f"{cls.__name__} misses {sorted(cls.__abstractmethods__)}"
    assert "__getattr__" not in vars(cls), f"{cls.__name__} forwards through __getattr__"
    for name in ops.OP_NAMES:
        method = getattr(cls, name)
        assert method is not getattr(ops.Ops, name), f"{cls.__name__}.{name} is the interface's own"
        want = list(inspect.signature(getattr(ops.Ops, name)).parameters)
        got = list(inspect.signature(method).parameters)
        assert got == want, f"{cls.__name__}.{name}{got} is not the interface's {want}"
    assert cls.attention is ops.Ops.attention, f"{cls.__name__} restates attention's signature"


def test_attention_by_name_is_attend_with_the_masks_in_one_tuple():
    seen = []

    class Recorder(ops.ForwardingOps):
        def attend(self, qkv, num_heads, scale, masks):
            seen.append((num_heads, scale, masks))
            return qkv

    lengths, cos = torch.tensor([3]), torch.ones(1)
    Recorder(layers.TORCH_FUNCTIONAL).attention("qkv", 2, 0.5, lengths, rope=(cos, cos, 1, "half"), first_token=True)
    Recorder(layers.TORCH_FUNCTIONAL).attention("qkv", 4, 0.25)
    assert seen == [
        (2, 0.5, ops.AttentionMasks(lengths, None, None, (cos, cos, 1, "half"), True)),
        (4, 0.25, ops.NO_MASKS),
    ]
    assert ops.FIRST_TOKEN == ops.AttentionMasks(first_token=True)


def test_a_class_that_misses_an_op_cannot_be_made():
    class Partial(ops.ForwardingOps):
        pass

    del_one = type("MissingRms", (ops.Ops,), {name: lambda self: None for name in ops.OP_NAMES if name != "rms_norm"})
    with pytest.raises(TypeError, match="rms_norm"):
        del_one()
    Partial(layers.TORCH_FUNCTIONAL)  # the forwarding base is complete on its own


def test_the_checked_ops_judge_every_op():
    checked = triton_path._CheckedOps
    for name in ops.OP_NAMES:
        assert vars(checked)[name] is not vars(triton_path._Ops)[name]
        assert vars(checked)[name].__wrapped__ is vars(triton_path._Ops)[name]
        assert name in triton_path._CHECKS


def test_torch_ops_extra_ops_match_the_kernels_references():
    torch.manual_seed(0)
    torch_ops = layers.TORCH_FUNCTIONAL
    qkv = torch.randn(2, 5, 3 * 2 * 4, dtype=torch.float64)
    lengths = torch.tensor([5, 3], dtype=torch.int32)
    masked = torch_ops.attention(qkv, 2, 0.5, lengths)
    assert masked.shape == (2, 5, 8)
    first = torch_ops.attention(qkv, 2, 0.5, first_token=True)
    torch.testing.assert_close(first, torch_ops.attention(qkv, 2, 0.5)[:, :1])
    norm = torch.nn.LayerNorm(8, dtype=torch.float64)
    x = torch.randn(3, 8, dtype=torch.float64)
    lin = torch.nn.Linear(8, 6, dtype=torch.float64)
    torch.testing.assert_close(torch_ops.norm_linear(norm, x, lin, "gelu"), torch_ops.linear(norm(x), lin, "gelu"))


def test_kernel_first_token_attention_is_the_first_row(monkeypatch):
    monkeypatch.setenv(first_use.ENV, "1")
    first_use.reset()
    try:
        torch.manual_seed(1)
        qkv = torch.randn(2, 7, 3 * 2 * 16)
        with torch.no_grad():
            full = triton_path._FORWARD_NET[True].attention(qkv, 2, 0.25)
            first = triton_path._FORWARD_NET[True].attention(qkv, 2, 0.25, first_token=True)
        torch.testing.assert_close(first, full[:, :1])
        assert not first_use.failed_ops()
    finally:
        first_use.reset()
