"""The whole model on the triton backend against the torch backend, by flipping the flag on one module.

Judged by the project's rule: the triton backend's error against the same model run in float64
may be at most 2x the torch backend's error in the same dtype, plus a small floor.
Without a GPU the kernels run in Triton's interpreter, so the configs are tiny.
"""

from __future__ import annotations

import copy

import pytest
import torch

from vit_fast.backend import runtime
from vit_fast.model import stages

from ..fakes import tiny_model
from ..numerics import (
    assert_within_eager,
    max_err,
    no_tf32,  # noqa: F401  (autouse: TF32 off while comparing with torch on CUDA)
)

# name -> (ViTConfig overrides, input image (H, W))
CONFIGS = {
    # registers without a class token, average pooling (+ fc_norm), LayerScale, tanh GELU
    "reg4-avg-layerscale-gelutanh": (
        dict(class_token=False, reg_tokens=4, no_embed_class=True, global_pool="avg", init_values=0.1, act="gelu_tanh"),
        (32, 32),
    ),
    # pre-norm (CLIP-style: no patch bias), 48 px / 8 px patches = 36 patches + cls = 37 tokens, head_dim 16
    "prenorm-37tokens": (dict(img_size=48, embed_dim=32, num_heads=2, depth=1, pre_norm=True), (48, 48)),
    # dynamic image size at a non-native, non-square size: pos_embed resampled from 4x4 to 3x5
    "dynamic-24x40-cls-reg1": (
        dict(dynamic_img_size=True, embed_dim=64, num_heads=2, depth=1, reg_tokens=1, init_values=0.5),
        (24, 40),
    ),
    # head_dim 32, 4 px patches on 16 px: 17 tokens, class-token pooling
    "dim96-headdim32": (dict(img_size=16, patch_size=4, embed_dim=96, num_heads=3, depth=1), (16, 16)),
}


def _device() -> str:
    """The kernels run compiled on a GPU; without one, on CPU tensors in the interpreter (conftest)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def _model_and_input(name: str, batch: int = 2):
    overrides, (H, W) = CONFIGS[name]
    model = tiny_model(seed=sum(map(ord, name)), **overrides).to(_device())
    x = torch.randn(batch, model.cfg.in_chans, H, W, device=_device())
    return model, x


def _no_torch_fallback(model, monkeypatch):
    """Make sure a triton-backend call really runs the kernels and never the torch path."""

    def refuse(*args, **kwargs):
        raise AssertionError("the triton backend fell back to the torch path")

    monkeypatch.setattr(stages, "features_torch", refuse)


def _run_both(model, x):
    with torch.no_grad():
        model.set_backend("torch")
        eager_feats, eager_logits = _features_and_logits(model, x)
        model.set_backend("triton")
        assert model.resolved_backend(x) == "triton"
        feats, logits = _features_and_logits(model, x)
    return (feats, logits), (eager_feats, eager_logits)


def _features_and_logits(model, x):
    feats = model.forward_features(x)
    return feats, model.forward_head(feats)


@pytest.mark.parametrize("name", list(CONFIGS), ids=str)
def test_triton_matches_torch_fp32(name):
    model, x = _model_and_input(name)
    model64 = copy.deepcopy(model).double().set_backend("torch")
    with torch.no_grad():
        ref_feats, ref_logits = _features_and_logits(model64, x.double())
    (feats, logits), (eager_feats, eager_logits) = _run_both(model, x)
    print(f"\n{name} fp32: max|triton - torch| tokens {max_err(feats, eager_feats):.3e}")
    assert_within_eager(feats, eager_feats, ref_feats, f"{name} tokens")
    assert_within_eager(logits, eager_logits, ref_logits, f"{name} logits")


# bfloat16 is valid under the interpreter only because every kernel upcasts its dot operands to fp32 there
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["reg4-avg-layerscale-gelutanh", "prenorm-37tokens"], ids=str)
def test_triton_matches_torch_half(name, dtype):
    model, x = _model_and_input(name)
    with torch.no_grad():
        ref_feats, ref_logits = _features_and_logits(copy.deepcopy(model).double(), x.double())
    model, x = model.to(dtype), x.to(dtype)
    (feats, logits), (eager_feats, eager_logits) = _run_both(model, x)
    print(f"\n{name} {dtype}: max|triton - torch| tokens {max_err(feats, eager_feats):.3e}")
    assert feats.dtype == dtype
    assert_within_eager(feats, eager_feats, ref_feats, f"{name} tokens")
    assert_within_eager(logits, eager_logits, ref_logits, f"{name} logits")


def test_triton_path_does_not_fall_back(monkeypatch):
    model, x = _model_and_input("dim96-headdim32", batch=1)
    model.set_backend("triton")
    _no_torch_fallback(model, monkeypatch)
    with torch.no_grad():
        assert model(x).shape == (1, model.cfg.num_classes)


def test_torch_compile_fullgraph_on_triton_backend():
    """No graph breaks (fullgraph=True), the same output, and the same gradients through the compiled graph."""
    # a fresh Dynamo: compiles earlier in the process at other image sizes would make H and W symbolic
    # (automatic dynamic), and PyTorch's antialiased-bicubic backward then fails on symbolic sizes
    torch._dynamo.reset()
    model, x = _model_and_input("dynamic-24x40-cls-reg1")
    model.set_backend("triton")
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    results = []
    for fn in (model, compiled):
        model.zero_grad(set_to_none=True)
        inp = x.detach().clone().requires_grad_()
        out = fn(inp)
        out.square().sum().backward()
        results.append((out.detach(), inp.grad, {n: p.grad for n, p in model.named_parameters()}))
    (expected, dx, dparams), (got, dx_c, dparams_c) = results
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dx_c, dx, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dparams_c, dparams, rtol=1e-6, atol=1e-6)


def test_torch_compile_two_models_with_different_head_dims():
    """A second compiled model with another head_dim makes Dynamo treat the attention scale as a
    symbolic float; the kernels must still compile with no graph break (a regression seen in CI)."""
    torch._dynamo.reset()
    x = torch.randn(2, 3, 32, 32, device=_device())
    for heads in (3, 2, 1):  # head_dim 16, 24, 48 -> three different scales
        model = tiny_model(embed_dim=48, num_heads=heads).to(_device()).set_backend("triton")
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        with torch.no_grad():
            got = compiled(x)
            expected = model.set_backend("torch")(x)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_gradients_flow_like_torch_backend():
    model, x = _model_and_input("reg4-avg-layerscale-gelutanh")
    model.train()
    target = torch.randn(x.shape[0], model.cfg.num_classes, device=x.device)

    def grads(m, inp, backend):
        m.set_backend(backend)
        m.zero_grad(set_to_none=True)
        inp = inp.detach().clone().requires_grad_()
        loss = ((m(inp) - target.to(inp.dtype)) ** 2).sum()
        loss.backward()
        return {"x": inp.grad, **{n: p.grad for n, p in m.named_parameters()}}

    ours = grads(model, x, "triton")
    eager = grads(model, x, "torch")
    ref64 = grads(copy.deepcopy(model).double(), x.double(), "torch")
    assert set(ours) == set(ref64)
    for name in ref64:
        assert ours[name] is not None, f"no gradient reached {name} on the triton backend"
        assert_within_eager(ours[name], eager[name], ref64[name], f"d{name}")


def test_set_backend_triton_without_gpu_or_interpreter_says_why(monkeypatch):
    model, _ = _model_and_input("dim96-headdim32")
    monkeypatch.setattr(runtime, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(runtime, "cuda_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU.*TRITON_INTERPRET=1.*backend='torch'"):
        model.set_backend("triton")
    assert model.backend == "torch", "a refused set_backend must leave the backend as it was"


def test_set_backend_triton_rejects_unsupported_head_dim():
    model = tiny_model(embed_dim=48, num_heads=4)  # head_dim 12
    with pytest.raises(ValueError, match=r"head dims 16..256, this model's is 12 .*use backend='torch'"):
        model.set_backend("triton")
    assert model.backend == "torch"


@pytest.mark.parametrize("fused", [True, False], ids=["ln-fused", "ln-unfused"])
def test_forward_stages_match_torch_backend(fused):
    """forward_stages on the triton backend (LayerNorm fused into the next GEMM, or not) against the
    torch backend's stages, each judged against float64 by the numerics rule."""
    model, x = _model_and_input("reg4-avg-layerscale-gelutanh")
    model.fuse_layer_norm = fused
    with torch.no_grad():
        ref = dict(copy.deepcopy(model).double().set_backend("torch").forward_stages(x.double()))
        eager = dict(model.set_backend("torch").forward_stages(x))
        ours = dict(model.set_backend("triton").forward_stages(x))
    names = ["patch embedding", *(f"block {i}" for i in range(model.cfg.depth)), "final norm"]
    assert list(ours) == list(eager) == names
    for name in names:
        assert_within_eager(ours[name], eager[name], ref[name], f"stage {name} fused={fused}")


def test_unfused_layer_norm_env_matches(monkeypatch):
    """VIT_FAST_FUSE_LN=0 selects the unfused block (the GPU run compares both); it must agree too."""
    model, x = _model_and_input("prenorm-37tokens")
    with torch.no_grad():
        ref = copy.deepcopy(model).double().forward_features(x.double())
        eager = model.forward_features(x)
        fused = model.set_backend("triton").forward_features(x)
        monkeypatch.setenv("VIT_FAST_FUSE_LN", "0")
        unfused = model.forward_features(x)
    assert_within_eager(fused, eager, ref, "fused LN")
    assert_within_eager(unfused, eager, ref, "unfused LN")


def test_check_finite_on_triton_backend_names_the_stage():
    from vit_fast.model.validation import NonFiniteError

    model, x = _model_and_input("dim96-headdim32", batch=1)
    model.set_backend("triton").check_finite = True
    with torch.no_grad():
        assert torch.isfinite(model(x)).all()
        model.blocks[0].mlp.fc2.bias[0] = float("nan")
        with pytest.raises(NonFiniteError, match="block 0"):
            model(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_uint8_images_match_torch_backend(dtype):
    """Raw uint8 images with set_input_normalization: the triton backend normalises in the patch-embedding
    kernel, the torch backend in float32 first; both against the float64 model on the same pixels."""
    model, _ = _model_and_input("dim96-headdim32")
    model.set_input_normalization((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    pixels = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8, device=_device())
    with torch.no_grad():
        ref = copy.deepcopy(model).double().forward_features(pixels)
        model = model.to(dtype)
        eager = model.forward_features(pixels)
        ours = model.set_backend("triton").forward_features(pixels)
    assert ours.dtype == dtype
    assert_within_eager(ours, eager, ref, f"uint8 input {dtype}")


def test_parameter_changes_after_a_forward_are_still_refused():
    """The triton path checks the parameters in full once, then again only when their fingerprint changes
    (which tensors, their addresses, dtypes, shapes and strides): a dtype changed through ``.data``, a layer
    replaced, a square weight transposed at the same address, after a forward that passed, are each refused by
    name, and the model runs again once it is put right."""
    model, x = _model_and_input("dim96-headdim32", batch=1)
    model.set_backend("triton")
    block = model.blocks[0]
    qkv_weight, fc2, proj_weight = block.attn.qkv.weight.data, block.mlp.fc2, block.attn.proj.weight.data
    changes = [  # (break it, put it right, what the error names)
        (lambda: setattr(block.attn.qkv.weight, "data", qkv_weight.double()),
         lambda: setattr(block.attn.qkv.weight, "data", qkv_weight),
         r"blocks\.0\.attn\.qkv\.weight is torch\.float64"),
        (lambda: setattr(block.mlp, "fc2", torch.nn.Linear(fc2.in_features, fc2.out_features + 1)),
         lambda: setattr(block.mlp, "fc2", fc2),
         r"blocks\.0\.mlp\.fc2\.weight"),
        # the same address, another stride: a square weight transposed in place of itself
        (lambda: setattr(block.attn.proj.weight, "data", proj_weight.t()),
         lambda: setattr(block.attn.proj.weight, "data", proj_weight),
         r"blocks\.0\.attn\.proj\.weight .* \(stride \d+\)"),
    ]  # fmt: skip
    with torch.no_grad():
        expected = model(x)
        for break_it, put_right, named in changes:
            break_it()
            with pytest.raises(ValueError, match=named):
                model(x)
            put_right()
            assert torch.equal(model(x), expected)


# --------------------------------------------------------------------------- threads under the interpreter
# Triton's interpreter keeps a launch's state in module globals; with a lock per kernel, 7 of 8 threads running
# the triton backend at once raised InterpreterError ("x >= grid_dim[0]", "Did you forget to add @triton.jit").
# Interpreted launches now take one lock for the whole process (kernels.launches.INTERPRETER_LOCK).
interpreted = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's lock: kernels run compiled here")


def _in_threads(work, n: int) -> list:
    """``work(i)`` in ``n`` threads started together; each thread's result, or the exception it raised."""
    import threading

    results: list = [None] * n
    start = threading.Barrier(n)

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = work(i)
        except Exception as err:  # noqa: BLE001 - the test reports what each thread raised
            results[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    return results


@interpreted
def test_eight_threads_on_the_triton_backend_match_one_thread():
    model = tiny_model(seed=12, img_size=16, embed_dim=32, num_heads=2, depth=1).set_backend("triton")
    xs = [torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(i)) for i in range(8)]
    with torch.no_grad():
        alone = [model(x) for x in xs]
        results = _in_threads(lambda i: model(xs[i]), 8)
    failed = [r for r in results if isinstance(r, BaseException)]
    assert not failed, f"{len(failed)} of 8 threads failed: {failed[:2]}"
    for i, out in enumerate(results):  # the interpreter is deterministic: serialised runs give the same bits
        assert torch.equal(out, alone[i]), f"thread {i}"


@interpreted
def test_two_kernels_in_two_threads_at_once():
    """The interpreter's state is global, not per kernel: two different kernels launched together collided too."""
    from vit_fast.kernels.layer_norm import add_layer_norm_ref, layer_norm
    from vit_fast.kernels.linear import linear, linear_ref

    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(37, 32, generator=gen), torch.randn(48, 32, generator=gen), torch.randn(48, generator=gen)
    g, beta = torch.randn(32, generator=gen), torch.randn(32, generator=gen)
    calls = [lambda: linear(x, w, b, "gelu"), lambda: layer_norm(x, g, beta, 1e-6)] * 4
    results = _in_threads(lambda i: calls[i](), 8)
    assert not any(isinstance(r, BaseException) for r in results), results
    for r in results[0::2]:
        assert_within_eager(r, linear_ref(x, w, b, "gelu"), linear_ref(x.double(), w.double(), b.double(), "gelu"))
    ln_eager = add_layer_norm_ref(x, None, g, beta, 1e-6)[1]
    ln_ref = add_layer_norm_ref(x.double(), None, g.double(), beta.double(), 1e-6)[1]
    for r in results[1::2]:
        assert_within_eager(r, ln_eager, ln_ref)


@interpreted
def test_an_interpreted_launch_waits_for_the_process_wide_lock():
    """The lock is one for every kernel: while it is held, a launch of any kernel in another thread waits."""
    import threading

    from vit_fast.kernels.launches import INTERPRETER_LOCK
    from vit_fast.kernels.layer_norm import layer_norm

    x = torch.randn(4, 32)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (layer_norm(x, None, None, 1e-6), done.set()))
    with INTERPRETER_LOCK:
        worker.start()
        assert not done.wait(1.0), "a launch ran while another held the interpreter"
    worker.join(60)
    assert done.is_set()
