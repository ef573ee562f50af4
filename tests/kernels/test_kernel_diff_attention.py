"""vit_fast::diff_attention (timm's DiffAttention) against a float64 reference, judged by eager PyTorch's own error,
and against timm's DiffAttention module itself. On a CPU machine the kernel runs in Triton's interpreter (bf16 as
the attention tests explain: fp32 dots, the store rounded by hand)."""

from __future__ import annotations

import math

import pytest
import torch

from vit_fast.base import cards
from vit_fast.kernels import diff_attention as diff_module
from vit_fast.kernels.diff_attention import diff_attention, diff_attention_ref, launch_diff_attention

from ..numerics import (
    assert_within_eager,
    max_err,
    no_tf32,  # noqa: F401  (autouse: TF32 off while comparing with torch on CUDA)
    poisoned,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _inputs(batch, tokens, heads, head_dim, dtype, device, lam=0.37):
    """qkv [B, T, 3 * H * 2 Dh], a 0-dim lambda in qkv's dtype (as timm casts it) and a sub_norm weight far from 1."""
    qkv = torch.randn(batch, tokens, 6 * heads * head_dim, device=device).to(dtype)
    weight = (1.0 + 0.5 * torch.randn(2 * head_dim, device=device)).to(dtype)
    return qkv, torch.tensor(lam, device=device).to(dtype), weight


def _check(qkv, lam, weight, heads, lambda_init=0.35, scale=None, eps=1e-5, name="diff_attention"):
    batch, tokens, width = qkv.shape
    out = poisoned((batch, tokens, width // 3), qkv.dtype, qkv.device)
    launch_diff_attention(qkv, lam, weight, heads, lambda_init, scale, eps, out=out)
    ref64 = diff_attention_ref(qkv.double(), lam.double(), weight.double(), heads, lambda_init, scale, eps)
    eager = diff_attention_ref(qkv, lam, weight, heads, lambda_init, scale, eps)
    assert_within_eager(out, eager, ref64, name)
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [1, 5, 50, 65, 197])
def test_token_counts(tokens, dtype, device):
    """Odd T: one query block, query and key tails, several key blocks (16-row query, 32-row key tiles)."""
    _check(*_inputs(2, tokens, 1, 32, dtype, device), heads=1, name=f"T={tokens} {dtype}")


# q/k head dims: the smallest (8, padded to 16), 16 (timm_family's shrunk models), padded ones (20, 40, 48) and the
# largest (128, v heads of 256)
@pytest.mark.parametrize(
    "head_dim, dtype",
    [(8, torch.float32), (16, torch.float16), (20, torch.float32), (40, torch.bfloat16), (48, torch.float16)]
    + [(64, torch.float32), (128, torch.float16)],
    ids=lambda v: str(v).replace("torch.", ""),
)
def test_head_dims(head_dim, dtype, device):
    """Two (and three) heads side by side: each head's q1|q2, k1|k2 and v are found at its own offset."""
    heads = 3 if head_dim <= 20 else 2
    _check(*_inputs(1, 50, heads, head_dim, dtype, device), heads=heads, name=f"Dh={head_dim} {dtype}")


@pytest.mark.parametrize("lam", [0.0, -1.3, 2.5])
def test_lambda_values(lam, device):
    """lambda 0 (plain attention, then the norm), negative, and above 1 (the two maps nearly cancel at ~1)."""
    qkv, lam_t, weight = _inputs(1, 65, 2, 16, torch.float32, device, lam=lam)
    _check(qkv, lam_t, weight, heads=2, lambda_init=0.8 - 0.6 * math.exp(-0.3 * 3), name=f"lambda={lam}")


def test_lambda_is_read_on_the_device(device):
    """Changing the lambda tensor in place changes the result with no re-launch argument changing: the kernel
    reads it (no .item() on the host, so CUDA-graph capture replays a new lambda)."""
    qkv, lam, weight = _inputs(1, 5, 1, 16, torch.float32, device)
    first = launch_diff_attention(qkv, lam, weight, 1, 0.2).clone()
    lam.fill_(-0.9)
    second = launch_diff_attention(qkv, lam, weight, 1, 0.2)
    assert not torch.equal(first, second)
    assert_within_eager(
        second, diff_attention_ref(qkv, lam, weight, 1, 0.2), diff_attention_ref(qkv.double(), lam, weight, 1, 0.2)
    )


def test_custom_scale_and_eps(device):
    _check(*_inputs(2, 50, 2, 16, torch.float32, device), heads=2, scale=0.3, eps=1e-3, name="scale, eps")


def test_strided_views_in_and_out(device):
    """qkv as a slice of a larger buffer and the output into a window of a poisoned canvas: nothing else written."""
    batch, tokens, heads, head_dim = 2, 50, 2, 16
    width = 6 * heads * head_dim
    big = torch.randn(2 * batch, tokens + 3, width + 40, device=device)
    qkv = big[::2, 1 : 1 + tokens, 8 : 8 + width]
    assert not qkv.is_contiguous() and qkv.stride(-1) == 1
    _, lam, weight = _inputs(1, 1, heads, head_dim, torch.float32, device)
    canvas = poisoned((batch, tokens + 2, width // 3 + 16), torch.float32, device)
    window = canvas[:, 1 : 1 + tokens, 4 : 4 + width // 3]
    launch_diff_attention(qkv, lam, weight, heads, 0.4, out=window)
    ref64 = diff_attention_ref(qkv.double(), lam.double(), weight.double(), heads, 0.4)
    assert_within_eager(window, diff_attention_ref(qkv, lam, weight, heads, 0.4), ref64, "strided")
    outside = torch.ones_like(canvas, dtype=torch.bool)
    outside[:, 1 : 1 + tokens, 4 : 4 + width // 3] = False
    assert canvas[outside].isnan().all(), "the kernel wrote outside its output window"


def test_public_op_matches_launcher(device):
    qkv, lam, weight = _inputs(2, 65, 2, 16, torch.float16, device)
    ours = diff_attention(qkv, lam, weight, 2, 0.5)
    assert ours.dtype == torch.float16 and ours.shape == (2, 65, 64)
    assert torch.equal(ours, launch_diff_attention(qkv, lam, weight, 2, 0.5))
    assert torch.equal(diff_attention(qkv, lam, weight, 2, 0.5, scale=16**-0.5, norm_eps=1e-5), ours)


# ------------------------------------------------------------------------------ against timm's module
timm_diff = pytest.importorskip("timm.layers.diff_attention", reason="timm is not installed (make setup installs it)")


@pytest.mark.parametrize("dual_lambda", [False, True], ids=["lambda_qk", "dual_lambda"])
@pytest.mark.parametrize("tokens", [1, 5, 50, 65])
def test_matches_timm_diff_attention(tokens, dual_lambda, device):
    """timm's DiffAttention (non-fused and SDPA paths) against ours fed by its own qkv Linear and followed by its
    proj, in float32, judged against the module in float64; its lambda parameters moved off their init."""
    torch.manual_seed(tokens)
    dim, heads = 64, 2
    module = timm_diff.DiffAttention(dim, num_heads=heads, qkv_bias=True, depth=3, dual_lambda=dual_lambda)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    module = module.to(device).eval()
    x = torch.randn(2, tokens, dim, device=device)
    with torch.no_grad():
        module.fused_attn = False
        eager = module(x)
        module.fused_attn = True
        eager_sdpa = module(x)
        ref64 = module.double()(x.double())
        module.float()
        qkv = module.qkv(x)
        lam = module._compute_lambda().type_as(qkv)
        a = diff_attention(
            qkv, lam, module.sub_norm.weight, heads, module.lambda_init, module.scale, module.sub_norm.eps
        )
        ours = module.proj(a)
    assert_within_eager(ours, eager, ref64, f"vs timm T={tokens}")
    assert_within_eager(ours, eager_sdpa, ref64, f"vs timm (SDPA) T={tokens}")


# ------------------------------------------------------------------------------ autograd, compile
def test_gradients(device):
    """Backward (recomputed through the reference) against float64 autograd, for qkv, lambda and the norm weight."""
    qkv, lam, weight = _inputs(2, 5, 2, 8, torch.float32, device)
    grad_out = torch.randn(2, 5, 32, device=device)

    def grads(q, lm, w, fn):
        leaves = [t.detach().requires_grad_(True) for t in (q, lm, w)]
        return torch.autograd.grad(fn(*leaves), leaves, grad_out.to(q.dtype))

    ours = grads(qkv, lam, weight, lambda q, lm, w: diff_attention(q, lm, w, 2, 0.3))
    eager = grads(qkv, lam, weight, lambda q, lm, w: diff_attention_ref(q, lm, w, 2, 0.3))
    ref64 = grads(qkv.double(), lam.double(), weight.double(), lambda q, lm, w: diff_attention_ref(q, lm, w, 2, 0.3))
    for name, o, e, r in zip(("qkv", "lambda", "weight"), ours, eager, ref64, strict=True):
        assert_within_eager(o, e, r, f"d {name}")


def test_torch_compile_fullgraph(device):
    qkv, lam, weight = _inputs(1, 5, 2, 8, torch.float32, device)

    def block(q):
        return diff_attention(q * 0.5, lam, weight, 2, 0.3).sum(dim=-1)

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(qkv), block(qkv))
    assert max_err(compiled(qkv), diff_attention_ref(qkv.double() * 0.5, lam, weight, 2, 0.3).sum(-1)) < 1e-5


# ------------------------------------------------------------------------------ input checks
def _bad(width=96, tokens=5, **overrides):
    def make(device):
        qkv = torch.randn(1, tokens, width, device=device)
        args = dict(qkv=qkv, lambda_full=torch.tensor(0.5, device=device), norm_weight=torch.ones(16, device=device))
        args.update({k: v(device) if callable(v) else v for k, v in overrides.items()})
        return args

    return make


# id -> (argument factory, extra kwargs, exception type, message pattern); 96 = 3 * 2 heads * 2 * Dh 8
BAD_INPUTS = {
    "2d": (_bad(qkv=lambda d: torch.randn(5, 96, device=d)), {}, ValueError, r"shape \[B, T, 3 \* num_heads"),
    "float64": (_bad(qkv=lambda d: torch.randn(1, 5, 96, device=d).double()), {}, TypeError, "float64 is not"),
    "indivisible": (_bad(width=100), {}, ValueError, r"not 3 \* num_heads \* 2 \* head_dim with num_heads=2"),
    "head-dim-4": (_bad(width=48), {}, ValueError, r"q/k head_dim 4 .* outside the supported range 8\.\.128"),
    "no-tokens": (_bad(tokens=0), {}, ValueError, "T = 0 tokens"),
    "lambda-vector": (_bad(lambda_full=lambda d: torch.ones(2, device=d)), {}, ValueError, "one-element float"),
    "weight-shape": (_bad(norm_weight=lambda d: torch.ones(8, device=d)), {}, ValueError, r"shape \(16,\), got \(8,\)"),
    "weight-dtype": (
        _bad(norm_weight=lambda d: torch.ones(16, device=d).half()),
        {},
        ValueError,
        "give it qkv's dtype",
    ),
    "nan-lambda-init": (_bad(), {"lambda_init": float("nan")}, ValueError, "lambda_init must be a finite float"),
    "negative-eps": (_bad(), {"norm_eps": -1.0}, ValueError, "norm_eps must be >= 0"),
}


@pytest.mark.parametrize("case", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_inputs_raise_clear_errors(case, device):
    make, kwargs, error, match = case
    with pytest.raises(error, match=match):
        diff_attention(**make(device), **{"num_heads": 2, "lambda_init": 0.2, **kwargs})


def test_cpu_tensor_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match=r"need a CUDA tensor.*TRITON_INTERPRET=1"):
        diff_attention(torch.randn(1, 5, 96), torch.tensor(0.5), torch.ones(16), 2, 0.2)


# ------------------------------------------------------------------------------ configs per card
@pytest.mark.parametrize("arch", sorted(cards.CARDS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_configs_fit_every_card(monkeypatch, arch, dtype):
    """For every card and q/k head dims 16..128: each config the prune keeps for tuning, and the one it picks
    without tuning, fits the card's shared memory by the kernel's own estimate (where none fits, sm_75 at Dh 128,
    the smallest alone), with the FMA set (1 stage) only where tl.dot has no tensor cores; fp32 on a card with
    tensor cores picks 32x32, 2 stages, 4 warps up to Dh 32 (8 warps spilled 24 B per thread on sm_80 at Dh 32:
    tools/compile_check.py --targets 80 --kernels diff_attention) and 8 above (4 spilled 124 B on sm_90 at Dh 64)."""
    monkeypatch.setattr(diff_module, "interpreter_enabled", lambda: False)
    configs = diff_module._diff_attention_configs()
    card = cards.CARDS[arch]
    for head_dim in (16, 32, 64, 128):
        block_d = diff_module.block_d_for(head_dim)
        qkv = torch.empty((8, 257, 3 * 4 * 2 * head_dim), dtype=dtype, device="meta")
        for tune in (1, 0):
            named = {"qkv_ptr": qkv, "ARCH": arch, "TUNE": tune}
            kept = diff_module._prune_diff_configs(configs, named, BLOCK_D=block_d)
            assert kept and (tune or len(kept) == 1)
            for config in kept:
                assert (config.num_stages <= diff_module.FMA_STAGES) == (not card.tensor_cores), str(config)
            same_kind = [c for c in configs if (c.num_stages > diff_module.FMA_STAGES) == card.tensor_cores]
            shared = {
                str(c): diff_module._diff_shared_bytes(c, block_d, qkv.element_size(), not card.tensor_cores)
                for c in same_kind
            }
            if min(shared.values()) > card.shared_memory:  # nothing fits (sm_75 at Dh 128): the smallest, alone
                assert [str(c) for c in kept] == [min(shared, key=shared.get)]
            else:
                assert all(shared[str(c)] <= card.shared_memory for c in kept), (head_dim, [str(c) for c in kept])
        (pick,) = kept
        if dtype == torch.float32 and card.tensor_cores and head_dim <= 64:  # Dh 128: what the prune keeps
            warps = 4 if head_dim <= 32 else 8
            picked = (pick.kwargs["BLOCK_M"], pick.kwargs["BLOCK_N"], pick.num_warps, pick.num_stages)
            assert picked == (32, 32, warps, 2), (head_dim, str(pick))
