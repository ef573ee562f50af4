"""timm's DiffAttention inside patched timm models, beyond the feature list of test_timm_patching.py: depth-dependent
lambda_init across blocks, torch.export recording vit_fast::diff_attention, the first-use safety net judging it,
and refusals of DiffAttention variants the kernel does not run."""

from __future__ import annotations

import pytest
import torch

timm = pytest.importorskip("timm", reason="timm is not installed (make setup installs it with --no-deps)")

import vit_fast  # noqa: E402
from vit_fast.interop.timm_blocks import BlockPlan  # noqa: E402

from ..fakes import check_first_use_net, count_calls, eager_and_float64, export_on_the_kernels, trained_like  # noqa: E402
from ..numerics import assert_within_eager  # noqa: E402

NAME = "vit_dwee_patch16_reg1_gap_256"


def _model(seed: int, **kwargs):
    torch.manual_seed(seed)
    return trained_like(timm.create_model(NAME, pretrained=False, **{"img_size": 32, "embed_dim": 64, **kwargs}), seed)


def test_lambda_init_follows_depth(monkeypatch):
    """Three blocks with three lambda_inits and their own lambdas, every block on the kernels, parity with float64."""
    model = _model(7, depth=3, num_heads=2)
    assert len({b.attn.lambda_init for b in model.blocks}) == 3
    x = torch.randn(2, 3, 32, 32)
    eager, expected = eager_and_float64(model, x)
    vit_fast.apply_vit_fast(model, backend="triton")
    runs = count_calls(monkeypatch, BlockPlan)
    with torch.no_grad():
        ours = model(x)
    assert len(runs) == 3
    assert_within_eager(ours, eager, expected, name="dwee depth 3")


def test_torch_export_records_the_diff_attention_op():
    model = _model(8, depth=1, num_heads=2)
    ops = export_on_the_kernels(model, torch.randn(1, 3, 32, 32), "exported dwee")
    assert "vit_fast.diff_attention.default" in ops and "vit_fast.attention.default" not in ops
    assert not any(".item" in op or "_local_scalar_dense" in op for op in ops), "lambda must stay on the device"


def test_first_use_check_judges_diff_attention(monkeypatch):
    """Under the first-use safety net the kernel's first output is judged and recorded as 'diff_attention'; a wrong
    kernel falls back to the eager reference (fed the same arguments) and the model still matches timm."""
    model = _model(9, depth=1, num_heads=2)
    x = torch.randn(1, 3, 32, 32)
    check_first_use_net(monkeypatch, model, x, "diff_attention", "dwee")


def test_scale_norm_is_refused_by_name():
    model = _model(10, depth=1, num_heads=2, scale_attn_norm=True)
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.norm \(scale_attn_norm in differential attention\)"):
        vit_fast.apply_vit_fast(model, backend="triton")
    assert vit_fast.remove_vit_fast(model) == 0
