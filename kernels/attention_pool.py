"""Cross-attention with a short query (the attention-pool / "map" head of timm and transformers' SigLIP), reading the
kv GEMM output in place: ``q [1 or B, Lq, H * Dh]`` (Lq 1..16) against ``kv [B, T, 2 * H * Dh]``, written as
``[B, Lq, H * Dh]``. Top to bottom: the tiles, the kernel, the launcher :func:`launch_attention_pool`, the
``torch.library`` op, :func:`attention_pool` and the eager reference. Design: docs/kernels.md, "Attention pool"."""

from __future__ import annotations

import itertools

import torch
import triton
import triton.language as tl

from vit_fast.base.cards import Card, tensor_arch
from vit_fast.base.interpret import interpreter_enabled

from ._launch import SelfCheck, check_device, define_op, output_buffer
from ._tl import (
    attend_tile,
    head_tile,
    load_kv_tile,
    online_softmax_start,
    store_rounded,
)
from .attention import LOG2E
from .attention_checks import check_projection, check_scale
from .attention_tiles import block_d_for, dtype_flags, head_prune_target, head_split, row_strides
from .autotune import autotune_cache_enabled, closest_config, tune_key, tuning_requested
from .launches import ResolvedLaunches

#: the most latent queries one launch takes (they share one program's 16-row tile; SigLIP heads have 1)
MAX_QUERIES = 16
#: query rows of the kernel's tile: every query of the head at once, padded to the dot's minimum of 16 rows
BLOCK_Q = 16
#: num_stages of the configs meant for cards without tensor cores (sm_75): every other config has more
FMA_POOL_STAGES = 1


def _pool_configs() -> list[triton.Config]:
    """Autotune candidates: the key/value tile (BLOCK_N), warps and pipelining stages. Built from the environment
    only (never a device query); the prune keeps those that suit the card. The interpreter cannot time configs:
    it gets one, with BLOCK_N below some tested token counts so the loop over tiles and its tail both run."""
    if interpreter_enabled():
        return [triton.Config({"BLOCK_N": 32}, num_warps=4, num_stages=1)]
    return [
        triton.Config({"BLOCK_N": block_n}, num_warps=num_warps, num_stages=num_stages)
        for block_n in (16, 32, 64, 128)  # 16 keys: what fits 99 KB cards at Dh 256 in fp32
        for num_warps in (2, 4)
        for num_stages in (2, 3)
    ] + [
        # cards without tensor cores (sm_75): no asynchronous copies to pipeline, small tiles (the prune keeps
        # those not expected to spill, _fma_pool_fits; 16 keys: what fits 64 KB at Dh 256 in fp32)
        triton.Config({"BLOCK_N": block_n}, num_warps=4, num_stages=FMA_POOL_STAGES)
        for block_n in (16, 32, 64)
    ]


def _fma_pool_fits(config: triton.Config, block_d: int, elem_bytes: int) -> bool:
    """Whether a config is expected not to spill where ``tl.dot`` is FMA (sm_75): the self-attention kernel's
    bound on its q / accumulator and score tiles (``attention_tiles.fma_attention_fits``), here with 16 query rows, and in 16-bit
    at most 32 keys per tile (triton 3.9, sm_75, Dh 64: 64 keys spilled 680-700 B per thread in fp16 and bf16,
    32 and 16 none; fp32 none up to 64)."""
    block_n = config.kwargs["BLOCK_N"]
    if elem_bytes < 4 and block_n > 32:
        return False
    return BLOCK_Q * (block_d + block_n) <= (5120 if elem_bytes == 4 else 3072)


def _pool_tile_fits(config: triton.Config, block_d: int, elem_bytes: int) -> bool:
    """Whether a config is expected not to spill on a card with tensor cores: k and v tiles of at most
    ``1024 * num_warps`` elements each in fp32 (its dots run on FMA there too), ``2048 * num_warps`` in 16-bit. The
    compiles behind the bound: docs/kernels.md, section Shared memory and spills."""
    return config.kwargs["BLOCK_N"] * block_d <= (1024 if elem_bytes == 4 else 2048) * config.num_warps


def _pool_shared_bytes(config: triton.Config, block_d: int, elem_bytes: int, card: Card) -> int:
    """An upper bound of a config's shared memory on ``card``: k and v tiles apart at every stage, plus the q and
    p tiles padded by a column (the layout conversions into the dot's operands); on cards without tensor cores
    every tile counted as fp32, as the self-attention kernel's bound does (``attention_tiles.attention_shared_bytes``)."""
    block_n, stages = config.kwargs["BLOCK_N"], max(config.num_stages, 1)
    size = 4 if card.dot == "fma" else elem_bytes
    return 2 * stages * block_n * block_d * size + BLOCK_Q * (block_d + 1 + block_n + 1) * size


def _prune_pool_configs(configs, named_args, **kwargs):
    """The candidates for one launch, read only from its autotune key (T, the head dim, the card ``ARCH``, the
    dtype, ``TUNE``): the configs for this kind of card (tensor cores or not, :data:`FMA_POOL_STAGES`) that fit
    its shared memory; wide heads (Dh > 128) only with key tiles of at most 64 rows; only the tiles not expected
    to spill (:func:`_fma_pool_fits` without tensor cores, :func:`_pool_tile_fits` with). Without tuning one config: the fitting one nearest 64 keys, 4 warps,
    2 stages (a card without tensor cores: its own, nearest 32 keys)."""
    target = head_prune_target(named_args, kwargs, "kv_ptr", _pool_shared_bytes)
    if target is None:
        return configs
    block_d, card, elem_bytes, shared = target

    def fits(config: triton.Config) -> bool:
        if block_d > 128 and config.kwargs["BLOCK_N"] > 64:
            return False
        if not card.tensor_cores and not _fma_pool_fits(config, block_d, elem_bytes):
            return False
        if card.tensor_cores and not _pool_tile_fits(config, block_d, elem_bytes):
            return False
        return shared(config) <= card.shared_memory

    same_kind = [c for c in configs if (c.num_stages > FMA_POOL_STAGES) == card.tensor_cores] or configs
    kept = [c for c in same_kind if fits(c)] or [min(same_kind, key=shared)]
    if tuning_requested(named_args) or len(kept) == 1:
        return kept
    if not card.tensor_cores:
        return [closest_config(kept, {"BLOCK_N": 32}, 4, FMA_POOL_STAGES)]
    return [closest_config(kept, {"BLOCK_N": 64}, 4, 2)]


@triton.autotune(
    configs=_pool_configs(),
    key=[
        # everything _prune_pool_configs reads (the autotuner adds the dtypes itself)
        *("T", "HEAD_DIM", "ARCH", "TUNE"),
        # every constexpr the configs do not set (tests/kernels/test_autotune_mode.py); these follow the dtype and head dim
        *("DOT_IN_FP32", "ROUND_BF16", "BLOCK_D", "BLOCK_Q"),
    ],
    prune_configs_by={"early_config_prune": _prune_pool_configs},
    cache_results=autotune_cache_enabled(),
)
@triton.jit(do_not_specialize=["ARCH", "TUNE"])  # key-only: one compile whatever their values
def _attention_pool_kernel(
    q_ptr,  # [Bq, Lq, H * Dh] queries; unit stride along the last dim, batch stride 0 for a shared latent
    kv_ptr,  # [B, T, 2, H * Dh] fused k|v viewed by strides; unit stride along the last dim
    out_ptr,  # [B, Lq, H * Dh] attention output, unit stride along its last dim
    qk_scale,  # softmax scale * log2(e): exp2 of scaled logits equals exp of the unscaled ones
    T,  # tokens per image (rows of k and v)
    LQ,  # queries per image (rows of q), 1..16
    H,  # number of heads
    HEAD_DIM,  # Dh, the true head dim (BLOCK_D is it rounded up to a power of two)
    stride_q_b,  # elements between images in q (0: one latent for the whole batch)
    stride_q_l,  # elements between queries in q
    stride_kv_b,  # elements between images in kv
    stride_kv_t,  # elements between tokens in kv (2 * H * Dh when kv is contiguous)
    stride_out_b,  # elements between images in out
    stride_out_l,  # elements between queries in out
    ARCH,  # compute capability of the tensors' device (cards.tensor_arch), never read: the prune's card
    TUNE,  # autotune.tune_key(): 1 while tuning, never read: a heuristic pick never answers a tuned request
    DOT_IN_FP32: tl.constexpr,  # dot operands as fp32 at IEEE precision (fp32, or bf16 under the interpreter)
    ROUND_BF16: tl.constexpr,  # round the bf16 store by hand (interpreter: its fp32 -> bf16 cast truncates)
    BLOCK_D: tl.constexpr,  # head dim padded to a power of two >= 16; padding lanes are masked
    BLOCK_Q: tl.constexpr,  # query rows of the tile (>= LQ, >= 16: the dot's minimum)
    BLOCK_N: tl.constexpr,  # key/value rows per inner step
):
    pid = tl.program_id(0)  # one flat axis over image * head: axis 1 caps at 65535
    off_b = pid // H
    off_h = pid % H
    embed_dim = H * HEAD_DIM
    # int64 batch offsets: B * T * 2 * D overflows int32 for large serving batches
    q_base = q_ptr + off_b.to(tl.int64) * stride_q_b + off_h * HEAD_DIM
    k_base = kv_ptr + off_b.to(tl.int64) * stride_kv_b + off_h * HEAD_DIM
    v_base = k_base + embed_dim

    offs_q = tl.arange(0, BLOCK_Q)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    q_mask = offs_q < LQ

    # zero-filled padding rows / lanes of q and k add nothing to q k^T; padded query rows are never stored
    q = tl.load(
        q_base + offs_q[:, None] * stride_q_l + offs_d[None, :], mask=q_mask[:, None] & d_mask[None, :], other=0.0
    )
    if DOT_IN_FP32:
        q = q.to(tl.float32)

    m_i, l_i, acc = online_softmax_start(BLOCK_Q, BLOCK_D)
    for start_n in range(0, T, BLOCK_N):
        k, v, _, col_mask, _ = load_kv_tile(k_base, v_base, start_n, T, offs_n, stride_kv_t, offs_d, d_mask)
        m_i, l_i, acc = attend_tile(q, k, v, col_mask, qk_scale, m_i, l_i, acc, DOT_IN_FP32)  # key tail -> -inf

    out_ptrs = head_tile(out_ptr, off_b, stride_out_b, offs_q, stride_out_l, off_h * HEAD_DIM, offs_d)
    store_rounded(out_ptrs, acc / l_i[:, None], q_mask[:, None] & d_mask[None, :], ROUND_BF16)


_attention_pool_launches = ResolvedLaunches(_attention_pool_kernel)


# ---------------------------------------------------------------------------------- launcher
def _check_pool_inputs(q: torch.Tensor, kv: torch.Tensor, num_heads: int, scale: float | None) -> None:
    """Raise a clear error, before any launch, when the inputs do not fit the kernel."""
    hint = "check num_heads, or that kv is the fused [k | v] projection"
    check_projection("attention_pool", "kv", kv, num_heads, 2, "2 * num_heads * head_dim", hint)
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"attention_pool: q must be a torch.Tensor, got {type(q).__name__}")
    if q.dim() != 3:
        raise ValueError(
            f"attention_pool: q must have shape [1 or B, Lq, num_heads * head_dim], got {tuple(q.shape)}; "
            "pass the latent query projection (e.g. latent [1, Lq, D] through the q Linear)"
        )
    if q.dtype != kv.dtype:
        raise TypeError(f"attention_pool: q is {q.dtype} but kv is {kv.dtype}; cast q to kv's dtype")
    batch, width = kv.shape[0], kv.shape[-1]
    if q.shape[-1] != width // 2:
        raise ValueError(
            f"attention_pool: q's last dim {q.shape[-1]} is not kv's half ({width // 2} = num_heads * head_dim); "
            "q and kv must be projected to the same embed dim"
        )
    if q.shape[0] not in (1, batch):
        raise ValueError(
            f"attention_pool: q has batch {q.shape[0]}, kv has {batch}; q's batch must be 1 (one latent for every "
            "image) or kv's"
        )
    if not 1 <= q.shape[1] <= MAX_QUERIES:
        raise ValueError(
            f"attention_pool: q has {q.shape[1]} queries; the kernel takes 1..{MAX_QUERIES} (a latent pool's "
            "latent_len): use the attention kernel or the torch backend for longer queries"
        )
    if q.stride(-1) != 1:
        raise ValueError(
            f"attention_pool: q's last dim must be contiguous (stride 1), got stride {q.stride(-1)}; "
            "call q.contiguous() first"
        )
    if q.device != kv.device:
        raise ValueError(f"attention_pool: q is on {q.device} but kv is on {kv.device}; move both to one device")
    check_scale("attention_pool", scale)
    check_device("attention_pool", kv)


def launch_attention_pool(
    q: torch.Tensor,
    kv: torch.Tensor,
    num_heads: int,
    scale: float | None = None,
    *,
    out: torch.Tensor | None = None,
    checked: bool = False,
) -> torch.Tensor:
    """Check the inputs, then run the kernel once (no autograd, no custom op); returns ``[B, Lq, H * Dh]``.
    ``checked=True`` skips the checks: only for the custom op, whose one caller (:func:`attention_pool`) has just run
    them. ``out``, if given, must be ``[B, Lq, H * Dh]`` in kv's dtype and device with a unit-stride last dim; tests
    pass a NaN-filled one so an element the kernel leaves unwritten is caught."""
    if not checked:
        _check_pool_inputs(q, kv, num_heads, scale)
    batch, tokens, _ = kv.shape
    queries = q.shape[1]
    embed_dim, head_dim, scale = head_split(kv, 2, num_heads, scale)
    out = output_buffer("attention_pool", out, (batch, queries, embed_dim), kv)
    if batch == 0:
        return out
    grid = (batch * num_heads,)
    _attention_pool_launches(
        grid,
        (batch,),  # what the grid depends on beyond the arguments below
        q,
        kv,
        out,
        scale * LOG2E,
        tokens,
        queries,
        num_heads,
        head_dim,
        q.stride(0) if q.shape[0] == batch else 0,  # a batch-1 latent serves every image
        q.stride(1),
        *row_strides(kv, out),
        tensor_arch(kv),
        tune_key(),
        **dtype_flags(kv.dtype),
        BLOCK_D=block_d_for(head_dim),
        BLOCK_Q=BLOCK_Q,
    )
    return out


# ---------------------------------------------------------------------------------- custom op
def _attention_pool_op(q: torch.Tensor, kv: torch.Tensor, num_heads: int, scale: float) -> torch.Tensor:
    return launch_attention_pool(q, kv, num_heads, scale, checked=True)


def _default_scale(q, kv, num_heads, scale) -> tuple:
    head_dim = kv.shape[-1] // (2 * num_heads)
    return q, kv, num_heads, head_dim**-0.5 if scale is None else float(scale)


_attention_pool = define_op(
    _attention_pool_op,
    check=_check_pool_inputs,
    empty=lambda q, kv, *_: kv.new_empty((kv.shape[0], q.shape[1], kv.shape[-1] // 2)),
    reference=lambda q, kv, num_heads, scale: attention_pool_ref(q, kv, num_heads, scale, upcast=True),
    prepare=_default_scale,
    lead=1,  # kv, the activation: q is often a Parameter (timm's latent)
    selfcheck=SelfCheck(  # one latent query for every image (batch 1), as the patched heads pass it
        cases=lambda m: [
            (
                f"map head, {m['model']}",
                dict(
                    batch=m["batch"],
                    tokens=m["tokens"],
                    dim=m["heads"] * m["head_dim"],
                    heads=m["heads"],
                    latents=m["latents"],
                ),  # fmt: skip
            )
        ],
        inputs=lambda d, rnd, *_: (
            (rnd(1, d["latents"], d["dim"]), rnd(d["batch"], d["tokens"], 2 * d["dim"]), d["heads"]),
            {},
        ),
        launch=lambda d, args, _, poisoned: launch_attention_pool(
            *args, out=poisoned(d["batch"], d["latents"], d["dim"])
        ),
        shape=lambda d: (
            f"q [1, {d['latents']}, {d['dim']}], kv [{d['batch']}, {d['tokens']}, {2 * d['dim']}] -> "
            f"[{d['batch']}, {d['latents']}, {d['dim']}] ({d['heads']} heads of {d['dim'] // d['heads']})"
        ),
    ),
)


def attention_pool(q: torch.Tensor, kv: torch.Tensor, num_heads: int, scale: float | None = None) -> torch.Tensor:
    """Multi-head cross-attention of a few queries over the tokens' fused k|v projection, without copies.
    ``q [1 or B, Lq, H * Dh]`` (``Lq`` 1..16; batch 1 or batch stride 0: one latent for every image) in kv's dtype
    and device; ``kv [B, T, 2 * H * Dh]`` float16 / bfloat16 / float32, read as ``[B, T, 2, H, Dh]`` (k, then v);
    both unit-stride along the last dim. ``num_heads`` H (Dh in 16..256), ``scale`` (default ``Dh ** -0.5``). Returns
    ``[B, Lq, H * Dh]`` in kv's dtype. A custom op: docs/kernels.md, section Attention pool."""
    return _attention_pool(q, kv, num_heads, scale)


# ---------------------------------------------------------------------------------- reference
def attention_pool_ref(
    q: torch.Tensor, kv: torch.Tensor, num_heads: int, scale: float | None = None, upcast: bool = False
) -> torch.Tensor:
    """Eager cross-attention, written as timm's ``AttentionPoolLatent.forward`` (its unfused path):
    ``q [1 or B, Lq, HDh]``, ``kv [B, T, 2HDh]`` -> ``[B, Lq, HDh]``. ``upcast=False`` computes in kv's dtype (what
    eager PyTorch does: the error a kernel is judged against). ``upcast=True`` computes float16 / bfloat16 inputs in
    float32 and casts the result back. For a float64 reference, pass ``q.double()`` and ``kv.double()``."""
    batch, tokens, width = kv.shape
    queries = q.shape[1]
    head_dim = width // (2 * num_heads)
    scale = head_dim**-0.5 if scale is None else scale
    dtype = kv.dtype
    if upcast and dtype in (torch.float16, torch.bfloat16):
        q, kv = q.float(), kv.float()
    q = q.expand(batch, -1, -1).reshape(batch, queries, num_heads, head_dim).transpose(1, 2)
    k, v = kv.reshape(batch, tokens, 2, num_heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    attn = ((q * scale) @ k.transpose(-2, -1)).softmax(dim=-1)
    out = (attn @ v).transpose(1, 2).reshape(batch, queries, num_heads * head_dim)
    return out.to(dtype)


# ---------------------------------------------------------------------------------- compile-check variants
# what tools/compile_check.py compiles of this kernel (KERNELS[name].compile_variants / .compile_launch): its
# cases (kernel, label, params, which configs) per variant set, and one launch per case recorded through v.record;
# ``v`` is the tool's vocabulary (DTYPES, PICK_MODELS, PICK_BATCHES, EVERY_CONFIG_DTYPES, which, empty, torch_dtype)
#: the attention-pool head: head_dim -> (num_heads, tokens); 64: SigLIP-B/16 at 224 (196 tokens), 72: SigLIP
#: so400m/14 at 384 (729 tokens), 80 and 128: padded and full 128 lanes, 256: MAX_HEAD_DIM
_POOL_HEADS = {64: (12, 196), 72: (16, 729), 80: (16, 256), 128: (8, 256), 256: (4, 196)}


def compile_variants(v, variant_set: str, full: bool) -> list[tuple]:
    # the batch is only the grid's size (the kernel has no batch argument): one batch compiles what all would
    if variant_set == "picks":  # not in ViT-S/16 or ViT-B/16
        return []
    if variant_set == "vit-b16":  # SigLIP-B/16's head: one latent query, 12 heads of 64
        return [
            ("attention_pool", f"{dtype} Dh64 Lq1 b8", {"dtype": dtype, "head_dim": 64, "B": 8, "Lq": 1}, "kept")
            for dtype in v.DTYPES
        ]
    cases = []
    for head_dim, dtype in itertools.product(_POOL_HEADS, v.DTYPES):
        which = "all" if full else ("ends" if head_dim in (80, 128) else "kept")
        params = {"dtype": dtype, "head_dim": head_dim, "B": 8, "Lq": 1}
        cases.append(("attention_pool", f"{dtype} Dh{head_dim} Lq1 b8", params, which))
    return cases


def compile_launch(v, params: dict) -> tuple:
    B, Dh, Lq = params.get("B", 8), params["head_dim"], params.get("Lq", 1)
    H, T = _POOL_HEADS[Dh]
    q, kv = v.empty((1, Lq, H * Dh), params["dtype"]), v.empty((B, T, 2 * H * Dh), params["dtype"])
    return v.record(launch_attention_pool, q, kv, H)


__all__ = ["MAX_QUERIES", "attention_pool", "attention_pool_ref", "launch_attention_pool"]
