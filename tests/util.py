"""Small models shared by tests, and the skip for a test whose command runs the kernels in a broken interpreter."""

from __future__ import annotations

import pytest
import torch

from vit_fast import VisionTransformer, ViTConfig
from vit_fast.kernels._interpret import interpreter_enabled, interpreter_version_problem


def interpreter_fault() -> str | None:
    """Why the kernels cannot run in Triton's interpreter where this suite runs them there (no GPU, or
    TRITON_INTERPRET set): the installed triton and numpy break it. None otherwise."""
    if torch.cuda.is_available() and not interpreter_enabled():
        return None
    return interpreter_version_problem()


# For a test that judges what a command reports after running the kernels in the interpreter: where the installed
# triton and numpy break it, the command reports that instead (tests/test_doctor.py and tests/test_versions.py
# check it), so the test is skipped with the reason. A test that meets the error itself is skipped by conftest.py.
#: the command runs the interpreter on any machine (``vit-fast doctor --device cpu``, the demo's verify child)
skip_if_interpreter_broken = pytest.mark.skipif(
    interpreter_version_problem() is not None, reason=str(interpreter_version_problem())
)
#: the command runs the kernels where the suite does: in the interpreter without a GPU (``vit-fast doctor``,
#: ``vit-fast verify MODEL triton``)
skip_if_interpreted_and_broken = pytest.mark.skipif(interpreter_fault() is not None, reason=str(interpreter_fault()))

TINY = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=7)


def tiny_model(seed: int = 0, **overrides) -> VisionTransformer:
    """A tiny ViT with random (non-trivial) weights: LayerNorm affine and biases are random too."""
    torch.manual_seed(seed)
    model = VisionTransformer(ViTConfig(**{**TINY, **overrides}), backend="torch").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def record_triton_forwards(monkeypatch) -> list[tuple[int, bool]]:
    """Replace the triton path's forward with one that records ``(batch, tuning on)`` per call and returns zeros:
    what a test of who tunes when (bench, serve) needs, without running the kernels."""
    from vit_fast import stages
    from vit_fast.kernels import _common

    seen: list[tuple[int, bool]] = []

    def features(model, x, grid):
        seen.append((x.shape[0], _common.autotune_enabled()))
        return torch.zeros(x.shape[0], model.cfg.num_tokens, model.cfg.embed_dim)

    monkeypatch.delenv("VIT_FAST_AUTOTUNE", raising=False)
    monkeypatch.setattr(stages, "features_triton", features)
    return seen


def check_first_use_net(monkeypatch, model, x: torch.Tensor, op: str, what: str) -> None:
    """The first-use safety net on the public op ``op`` of ``vit_fast.triton_path`` in a timm model patched in
    place: its first output is judged and recorded as passed; a wrong kernel (output + 0.5) then falls back to the
    eager reference with a RuntimeWarning, and the model still meets the numerics rule against itself in float64.
    (Patched timm blocks and heads call the public op, not the direct launcher.)"""
    import copy

    import pytest

    import vit_fast
    from vit_fast import first_use, triton_path

    from .numerics import assert_within_eager

    monkeypatch.setenv(first_use.ENV, "1")
    first_use.reset()
    with torch.no_grad():
        eager = model(x)
        expected = copy.deepcopy(model).double()(x.double())
    vit_fast.apply_vit_fast(model, backend="triton")
    try:
        with torch.no_grad():
            model(x)
        found = [f for f in first_use.report()["checked"] if f["op"] == op]
        assert len(found) == 1 and found[0]["passed"]
        first_use.reset()
        real_op = getattr(triton_path, op)
        monkeypatch.setattr(triton_path, op, lambda *a, **k: real_op(*a, **k) + 0.5)
        with pytest.warns(RuntimeWarning, match=f"'{op}' runs in eager PyTorch"), torch.no_grad():
            ours = model(x)
        assert first_use.failed_ops() == {op}
        assert_within_eager(ours, eager, expected, name=f"{what} after fallback")
    finally:
        first_use.reset()
