"""vit_fast::attention_pool (the attention-pool head's cross-attention) against a float64 reference, judged by
eager PyTorch's own error. On a CPU machine these run in Triton's interpreter (one config: 32-key tiles, so the
token counts below cover one tile, a tail, and several tiles); bf16 is real there for the reasons
test_kernel_attention.py gives."""

from __future__ import annotations

import pytest
import torch

from vit_fast.base import cards
from vit_fast.kernels import KERNELS
from vit_fast.kernels import attention_pool as pool_module
from vit_fast.kernels.attention_pool import MAX_QUERIES, attention_pool, attention_pool_ref, launch_attention_pool

from ..numerics import (
    assert_within_eager,
    max_err,
    no_tf32,  # noqa: F401  (autouse: TF32 off while comparing with torch on CUDA)
    poisoned,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _inputs(batch, q_batch, queries, tokens, heads, head_dim, dtype, device):
    q = torch.randn(q_batch, queries, heads * head_dim, device=device).to(dtype)
    kv = torch.randn(batch, tokens, 2 * heads * head_dim, device=device).to(dtype)
    return q, kv


def _check(q, kv, heads, scale=None, name="attention_pool"):
    """Run the kernel into a NaN-poisoned buffer and hold it to 2x eager's error vs float64."""
    batch, _, width = kv.shape
    out = launch_attention_pool(q, kv, heads, scale, out=poisoned((batch, q.shape[1], width // 2), kv.dtype, kv.device))
    ref64 = attention_pool_ref(q.double(), kv.double(), heads, scale)
    eager = attention_pool_ref(q, kv, heads, scale)
    assert_within_eager(out, eager, ref64, name)
    return out


# ------------------------------------------------------------------------------ forward numerics
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("queries", [1, 3])
@pytest.mark.parametrize("tokens", [1, 5, 50, 65, 197, 257])
def test_token_counts(tokens, queries, dtype, device):
    """Odd T at head dim 64, one latent shared by a batch of 2 (q batch 1): one key tile, tails, several tiles."""
    q, kv = _inputs(2, 1, queries, tokens, 2, 64, dtype, device)
    _check(q, kv, heads=2, name=f"T={tokens} Lq={queries} {dtype}")


# padded head dims (40, 72 -> 64 / 128 lanes, 80 and 96 -> 128) and the range's ends, 65 tokens
HEAD_DIM_CASES = [(head_dim, dtype) for head_dim in (16, 40, 72, 80, 96, 128) for dtype in DTYPES] + [
    (256, torch.float16)
]


@pytest.mark.parametrize("head_dim, dtype", HEAD_DIM_CASES, ids=lambda v: str(v).replace("torch.", ""))
@pytest.mark.parametrize("queries", [1, 3])
def test_head_dims(head_dim, dtype, queries, device):
    q, kv = _inputs(2, 1, queries, 65, 3, head_dim, dtype, device)
    _check(q, kv, heads=3, name=f"Dh={head_dim} Lq={queries} {dtype}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_per_image_queries_and_the_most_queries(dtype, device):
    """q with its own batch (one query set per image), and MAX_QUERIES queries (a full 16-row tile)."""
    q, kv = _inputs(3, 3, 3, 50, 2, 32, dtype, device)
    _check(q, kv, heads=2, name=f"per-image q {dtype}")
    q, kv = _inputs(2, 1, MAX_QUERIES, 50, 2, 32, dtype, device)
    _check(q, kv, heads=2, name=f"Lq={MAX_QUERIES} {dtype}")


def test_expanded_latent_matches_batch_one(device):
    """A latent expanded over the batch (stride 0, as timm's latent.expand gives it) reads as a batch-1 q."""
    q, kv = _inputs(3, 1, 2, 50, 2, 32, torch.float32, device)
    expanded = q.expand(3, -1, -1)
    assert expanded.stride(0) == 0
    out = _check(expanded, kv, heads=2, name="expanded")
    assert torch.equal(out, launch_attention_pool(q, kv, 2))


def test_custom_scale_and_large_logits(device):
    """A scale other than Dh ** -0.5, and logits of a few hundred (exp without the running max overflows)."""
    q, kv = _inputs(2, 1, 3, 65, 2, 32, torch.float32, device)
    _check(q, kv, heads=2, scale=0.3, name="scale=0.3")
    q, kv = q * 6.0, kv * 6.0
    assert attention_pool_ref(q.double(), kv.double(), 2).isfinite().all()
    _check(q, kv, heads=2, name="large logits")


def test_strided_views_in_and_out(device):
    """kv as a slice of a larger buffer and the output written into a window of a larger poisoned buffer:
    strides are honoured, nothing outside the window is written."""
    batch, tokens, heads, head_dim, queries = 2, 50, 2, 32, 3
    width = 2 * heads * head_dim
    big = torch.randn(2 * batch, tokens + 3, width + 40, device=device)
    kv = big[::2, 1 : 1 + tokens, 8 : 8 + width]
    q = torch.randn(1, queries + 2, heads * head_dim + 8, device=device)[:, 1 : 1 + queries, 4 : 4 + heads * head_dim]
    assert not kv.is_contiguous() and not q.is_contiguous()
    canvas = poisoned((batch, queries + 2, heads * head_dim + 16), torch.float32, device)
    window = canvas[:, 1 : 1 + queries, 4 : 4 + heads * head_dim]
    launch_attention_pool(q, kv, heads, out=window)
    ref64 = attention_pool_ref(q.double(), kv.double(), heads)
    assert_within_eager(window, attention_pool_ref(q, kv, heads), ref64, "strided")
    outside = torch.ones_like(canvas, dtype=torch.bool)
    outside[:, 1 : 1 + queries, 4 : 4 + heads * head_dim] = False
    assert canvas[outside].isnan().all(), "the kernel wrote outside its output window"


def test_public_op_matches_launcher(device):
    q, kv = _inputs(2, 1, 1, 65, 2, 32, torch.float16, device)
    ours = attention_pool(q, kv, 2)
    assert ours.dtype == torch.float16 and ours.shape == (2, 1, 64)
    assert torch.equal(ours, launch_attention_pool(q, kv, 2))
    assert torch.equal(attention_pool(q, kv, 2, scale=32**-0.5), ours), "scale=None must mean head_dim ** -0.5"


# ------------------------------------------------------------------------------ autograd, compile
def test_gradients(device):
    """Backward (recomputed through the reference) against float64 autograd, a batch-1 q included."""
    q, kv = _inputs(2, 1, 3, 5, 2, 16, torch.float32, device)
    grad_out = torch.randn(2, 3, 32, device=device)

    def grads_of(fn, q_in, kv_in):
        leaves = [q_in.detach().requires_grad_(True), kv_in.detach().requires_grad_(True)]
        return torch.autograd.grad(fn(*leaves), leaves, grad_out.to(kv_in.dtype))

    ours = grads_of(lambda a, b: attention_pool(a, b, 2), q, kv)
    eager = grads_of(lambda a, b: attention_pool_ref(a, b, 2), q, kv)
    ref64 = grads_of(lambda a, b: attention_pool_ref(a, b, 2), q.double(), kv.double())
    for name, o, e, r in zip(("d q", "d kv"), ours, eager, ref64, strict=True):
        assert o.shape == e.shape
        assert_within_eager(o, e, r, name)


def test_torch_compile_fullgraph(device):
    """The custom op traces without graph breaks (fullgraph=True), forward and backward."""

    def head(q, kv):
        return attention_pool(q, kv * 0.5, 2).sum(dim=-1)

    q, kv = _inputs(2, 1, 1, 5, 2, 16, torch.float32, device)
    kv.requires_grad_(True)
    compiled = torch.compile(head, fullgraph=True, backend="aot_eager")
    out = compiled(q, kv)
    (grad,) = torch.autograd.grad(out.sum(), kv)
    eager_out = head(q, kv)
    (eager_grad,) = torch.autograd.grad(eager_out.sum(), kv)
    assert torch.equal(out, eager_out)
    assert max_err(grad, eager_grad.double()) < 1e-6


# ------------------------------------------------------------------------------ input checks
def _t(*shape, dtype=torch.float32):
    return lambda device: torch.randn(*shape, device=device).to(dtype)


# id -> (q factory, kv factory, extra kwargs, exception type, message pattern); defaults: 2 heads of 16
BAD_INPUTS = {
    "not-tensor": (lambda d: [[1.0]], _t(1, 5, 64), {}, TypeError, "q must be a torch.Tensor"),
    "kv-2d": (_t(1, 1, 32), _t(5, 64), {}, ValueError, r"kv must have shape \[B, T, 2 \* num_heads"),
    "q-2d": (_t(1, 32), _t(1, 5, 64), {}, ValueError, r"q must have shape \[1 or B, Lq"),
    "float64": (_t(1, 1, 32, dtype=torch.float64), _t(1, 5, 64, dtype=torch.float64), {}, TypeError, "float64"),
    "mixed-dtypes": (_t(1, 1, 32, dtype=torch.float16), _t(1, 5, 64), {}, TypeError, "cast q to kv's dtype"),
    "zero-heads": (_t(1, 1, 32), _t(1, 5, 64), {"num_heads": 0}, ValueError, "num_heads must be a positive int"),
    "indivisible": (_t(1, 1, 50), _t(1, 5, 100), {"num_heads": 3}, ValueError, r"not 2 \* num_heads \* head_dim"),
    "head-dim-8": (_t(1, 1, 16), _t(1, 5, 32), {}, ValueError, r"head_dim 8 .* outside the supported range"),
    "q-width": (_t(1, 1, 48), _t(1, 5, 64), {}, ValueError, r"q's last dim 48 is not kv's half \(32"),
    "q-batch": (_t(2, 1, 32), _t(3, 5, 64), {}, ValueError, "q has batch 2, kv has 3"),
    "too-many-queries": (_t(1, 17, 32), _t(1, 5, 64), {}, ValueError, r"q has 17 queries; the kernel takes 1\.\.16"),
    "no-queries": (_t(1, 0, 32), _t(1, 5, 64), {}, ValueError, "q has 0 queries"),
    "no-tokens": (_t(1, 1, 32), _t(1, 0, 64), {}, ValueError, "T = 0 tokens"),
    "strided-kv": (
        _t(1, 1, 32),
        lambda d: torch.randn(1, 64, 5, device=d).transpose(1, 2),
        {},
        ValueError,
        r"kv's last dim must be contiguous .* kv\.contiguous\(\)",
    ),
    "nan-scale": (_t(1, 1, 32), _t(1, 5, 64), {"scale": float("nan")}, ValueError, "scale must be a finite"),
}


@pytest.mark.parametrize("case", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_inputs_raise_clear_errors(case, device):
    make_q, make_kv, kwargs, error, match = case
    with pytest.raises(error, match=match):
        attention_pool(make_q(device), make_kv(device), **{"num_heads": 2, **kwargs})


def test_bad_out_buffer(device):
    q, kv = _inputs(1, 1, 1, 5, 2, 16, torch.float16, device)
    with pytest.raises(ValueError, match=r"out must be \[1, 1, 32\] torch.float16"):
        launch_attention_pool(q, kv, 2, out=torch.empty(1, 1, 32, device=device))  # float32


def test_cpu_tensor_without_interpreter(monkeypatch):
    """Without TRITON_INTERPRET a CPU tensor is refused before any launch, with both ways out."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match=r"need a CUDA tensor.*\.cuda\(\).*TRITON_INTERPRET=1"):
        attention_pool(torch.randn(1, 1, 32), torch.randn(1, 5, 64), 2)


# ------------------------------------------------------------------------------ configs per card
@pytest.mark.parametrize("arch", sorted(cards.CARDS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_configs_fit_every_card(monkeypatch, arch, dtype):
    """For every card, SigLIP-like heads (Dh 64, 72, 80) and the range's ends (16, 256): each config the prune keeps
    for tuning, and the one the heuristic picks, fits the card's shared memory by the kernel's own estimate; the
    FMA set (num_stages 1) runs only where tl.dot has no tensor cores, and there only tiles not expected to spill
    up to Dh 128 (16-bit Dh 256 has none: the prune falls back to the smallest tile, as the self-attention's does).
    The launcher runs on meta tensors under cards.pretend_arch, its kernel swapped for a recorder."""
    monkeypatch.setattr(pool_module, "interpreter_enabled", lambda: False)
    configs = pool_module._pool_configs()
    kernel = KERNELS["attention_pool"].kernel
    arg_names = KERNELS["attention_pool"].launches.arg_names
    card = cards.CARDS[arch]
    for head_dim, heads in ((16, 4), (64, 12), (72, 16), (80, 16), (256, 4)):
        q = torch.empty((1, 1, heads * head_dim), dtype=dtype, device="meta")
        kv = torch.empty((8, 729, 2 * heads * head_dim), dtype=dtype, device="meta")
        seen = {}

        def record(grid, grid_key, *args, seen=seen, **constexprs):
            seen["named"] = dict(zip(arg_names, args, strict=False))
            seen["constexprs"] = constexprs

        with monkeypatch.context() as m, cards.pretend_arch(arch):
            m.setattr(KERNELS["attention_pool"].module, KERNELS["attention_pool"].launches_name, record)
            launch_attention_pool(q, kv, heads, checked=True)
        assert seen["named"]["ARCH"] == arch
        block_d = seen["constexprs"]["BLOCK_D"]
        for tune in (1, 0):
            kept = kernel.early_config_prune(configs, {**seen["named"], "TUNE": tune}, **seen["constexprs"])
            assert kept and (tune or len(kept) == 1)
            for config in kept:
                shared = pool_module._pool_shared_bytes(config, block_d, kv.element_size(), card)
                assert shared <= card.shared_memory, (head_dim, str(config), shared)
                assert (config.num_stages <= pool_module.FMA_POOL_STAGES) == (not card.tensor_cores), str(config)
                if not card.tensor_cores and head_dim <= 128:  # 16-bit Dh 256 there: the smallest, may spill
                    assert pool_module._fma_pool_fits(config, block_d, kv.element_size()), str(config)
                if card.tensor_cores:
                    assert pool_module._pool_tile_fits(config, block_d, kv.element_size()), str(config)
