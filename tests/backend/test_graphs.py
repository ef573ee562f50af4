"""vit_fast.CUDAGraphRunner: the CPU error and the input checks here; capture and replay on a GPU."""

from __future__ import annotations

import copy

import pytest
import torch

import vit_fast
from vit_fast.backend.graphs import CUDAGraphRunner, graph_input_mismatch

from ..numerics import no_tf32  # noqa: F401  (autouse: TF32 off while comparing with torch on CUDA)


def _small_model(backend: str = "torch", dtype: torch.dtype = torch.float32) -> vit_fast.VisionTransformer:
    cfg = vit_fast.ViTConfig(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=10)
    model = vit_fast.VisionTransformer(cfg, backend="torch")
    model.init_weights(seed=0)
    return model.to(device="cuda", dtype=dtype).set_backend(backend).eval()


def test_public_name():
    assert vit_fast.CUDAGraphRunner is CUDAGraphRunner


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_constructing_without_a_gpu_says_graphs_need_one():
    model = torch.nn.Linear(4, 4)
    with pytest.raises(RuntimeError, match="CUDA graphs need a GPU"):
        CUDAGraphRunner(model, torch.randn(2, 4))


def test_matching_input_passes():
    static = torch.empty(4, 3, 32, 32)
    assert graph_input_mismatch(torch.randn(4, 3, 32, 32), static) is None


def test_batch_mismatch_names_both_batches():
    msg = graph_input_mismatch(torch.randn(2, 3, 32, 32), torch.empty(4, 3, 32, 32))
    assert "batch 2 differs from the captured batch 4" in msg and "one runner per batch size" in msg


def test_shape_mismatch_names_both_shapes():
    msg = graph_input_mismatch(torch.randn(4, 3, 16, 32), torch.empty(4, 3, 32, 32))
    assert "(4, 3, 16, 32)" in msg and "(4, 3, 32, 32)" in msg


def test_dtype_and_device_mismatch_are_both_named():
    x = torch.randn(4, 3, 32, 32, dtype=torch.float16, device="meta")
    msg = graph_input_mismatch(x, torch.empty(4, 3, 32, 32))
    assert "dtype torch.float16 differs from the captured dtype torch.float32" in msg
    assert "device meta differs from the captured device cpu" in msg


def test_non_tensor_input():
    assert "expected a torch.Tensor, got list" in graph_input_mismatch([1, 2], torch.empty(2))


def test_check_input_raises_without_a_gpu():
    runner = object.__new__(CUDAGraphRunner)  # no capture: exercise the checks alone
    runner.static_input = torch.empty(4, 3, 32, 32)
    runner.check_input(torch.zeros(4, 3, 32, 32))
    with pytest.raises(ValueError, match="captured batch 4"):
        runner.check_input(torch.zeros(1, 3, 32, 32))
    with pytest.raises(TypeError, match="torch.Tensor"):
        runner.check_input("not a tensor")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_replay_matches_eager_and_returns_fresh_outputs():
    model = _small_model()
    x = torch.randn(4, 3, 32, 32, device="cuda")
    runner = CUDAGraphRunner(model, x)
    with torch.no_grad():
        expected = model(x)
    out = runner(x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    x2 = torch.randn_like(x)
    out2 = runner(x2)
    with torch.no_grad():
        torch.testing.assert_close(out2, model(x2), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)  # a clone: not overwritten by the replay
    assert out.data_ptr() != runner.static_output.data_ptr()
    assert runner.batch_size == 4 and "batch=4" in repr(runner)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_wrong_batch_dtype_or_device_is_refused():
    model = _small_model()
    runner = CUDAGraphRunner(model, torch.randn(4, 3, 32, 32, device="cuda"))
    with pytest.raises(ValueError, match="batch 2 differs from the captured batch 4"):
        runner(torch.randn(2, 3, 32, 32, device="cuda"))
    with pytest.raises(ValueError, match="dtype"):
        runner(torch.randn(4, 3, 32, 32, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match="device cpu"):
        runner(torch.randn(4, 3, 32, 32))
    with pytest.raises(ValueError, match="is on cpu"):
        CUDAGraphRunner(model, torch.randn(4, 3, 32, 32))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_backend_captures():
    model = _small_model("triton", torch.float16)
    x = torch.randn(2, 3, 32, 32, device="cuda", dtype=torch.float16)
    reference = copy.deepcopy(model).set_backend("torch")
    runner = CUDAGraphRunner(model, x)
    with torch.no_grad():
        ref = reference(x).float()
    assert (runner(x).float() - ref).abs().max().item() < 5e-2
