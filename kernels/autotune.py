"""The autotune policy every kernel follows: the row classes the autotuners key on, whether a launch tunes or takes
the heuristic's one config (:func:`tuning`, ``VIT_FAST_AUTOTUNE``), the per-card limits a prune compares its
candidates with (shared memory, tiles that fit where ``tl.dot`` is FMA), and when the GEMM may read through TMA.
Read per launch; importing it touches no GPU driver."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
import triton

from vit_fast.base.cards import card_for_arch, card_of, device_sm_count
from vit_fast.base.switches import switch


def shared_memory_limit(arch: int) -> int:
    """Shared memory per block (bytes) on compute capability ``arch`` (e.g. 90), from the card table."""
    return card_for_arch(arch).shared_memory


# ---------------------------------------------------------------------------------- autotuning
#: rows (M = batch * tokens) up to which the GEMMs' narrow tiles are candidates and their heuristic counts 64-row
#: tiles to fill the GPU (ViT-B/16 at batch 2 is 394 rows)
SMALL_M = 512
#: upper ends of the row-count classes the autotuners key on. Up to SMALL_M one class per 64-row tile count (what
#: the prunes and heuristics read there), above it coarse classes: a ViT-B/16 server seeing batches 1..256
#: (M 197..50k) tunes 5 times per GEMM shape (classes 256, 448, 2048, 16384, large), not once per batch size
M_CLASSES = (*range(64, SMALL_M + 1, 64), 2048, 16384)


def m_class(m: int) -> int:
    """The autotune key for ``m`` rows: the first of :data:`M_CLASSES` that holds it, else 2**20 (large). A prune
    reads rows only through this, so whatever it decides holds for its whole class (the key's promise)."""
    if m <= SMALL_M:
        return -(-m // 64) * 64
    for top in M_CLASSES[SMALL_M // 64 :]:
        if m <= top:
            return top
    return 1 << 20


#: set by :func:`tuning` for the block it wraps (this thread or task); None: the environment decides
_TUNING: contextvars.ContextVar[bool | None] = contextvars.ContextVar("vit_fast_tuning", default=None)


def autotune_enabled() -> bool:
    """Whether the kernels time their autotune candidates. Off by default (a warm start: each kernel compiles one
    heuristic config per shape, with no timing, so a first forward costs a handful of compilations rather than a
    hundred). On inside :func:`tuning` (``model.warmup(..., tune=True)``, ``vit-fast serve --tune``, the bench), or
    for the whole process with ``VIT_FAST_AUTOTUNE=1``. Read per call."""
    forced = _TUNING.get()
    if forced is not None:
        return forced
    return bool(switch("VIT_FAST_AUTOTUNE", False))


@contextlib.contextmanager
def tuning(enabled: bool = True) -> Iterator[None]:
    """Within the block (this thread or task only), kernels launched for a shape not seen before time their
    candidates (``enabled=True``) or take the heuristic config (``False``), whatever ``VIT_FAST_AUTOTUNE`` says."""
    token = _TUNING.set(enabled)
    try:
        yield
    finally:
        _TUNING.reset(token)


def tune_key() -> int:
    """The kernels' ``TUNE`` argument (never read by the kernel, one of its autotune keys): 1 where
    :func:`autotune_enabled`, else 0. So a cached heuristic pick never answers a later tuned request for the same
    shape, nor a tuned pick a heuristic one. Every launch asks: inside :func:`tuning` (a planned forward) one
    context-variable read."""
    forced = _TUNING.get()
    return int(autotune_enabled() if forced is None else forced)


def tuning_requested(named_args: dict) -> bool:
    """Whether a prune should keep every fitting candidate for timing: the launch's ``TUNE`` key argument, so the
    prune decides by what its cache entry is keyed on; :func:`autotune_enabled` for a prune asked directly
    (``tools/compile_check.py``, tests), which passes no ``TUNE``."""
    tune = named_args.get("TUNE")
    return autotune_enabled() if tune is None else bool(tune)


def config_mode() -> tuple[int, bool]:
    """What decides which config a launch runs besides its own arguments' shapes, dtypes, alignment and device,
    read now: the tuning mode (:func:`tune_key`) and the TMA switch (:func:`tma_enabled`). A cache that answers
    for launches without making them (the first-use net's cleared forwards, ``vit_fast.backend.triton_path``) keys on it,
    so a tuned config is never taken for the heuristic one it replaced."""
    return tune_key(), tma_enabled()


def autotune_cache_enabled() -> bool:
    """True unless ``VIT_FAST_AUTOTUNE_CACHE=0``: tuned configs are saved in Triton's cache directory
    (``TRITON_CACHE_DIR``, default ``~/.triton/cache``), so a second process starts tuned."""
    return bool(switch("VIT_FAST_AUTOTUNE_CACHE", True))


#: num_stages of the GEMM-like configs meant for cards without tensor cores (sm_75): every other config has more,
#: so a prune tells the two sets apart by it
FMA_STAGES = 2


def prune_target(named_args: dict, operand: str) -> tuple:
    """``(card, elem_bytes)`` a prune decides for: the :class:`~.cards.Card` of its ``ARCH`` key and the bytes per
    element of the tensor argument ``operand`` (2, a 16-bit launch, where no tensor is passed)."""
    tensor = named_args.get(operand)
    return card_for_arch(named_args["ARCH"]), tensor.element_size() if isinstance(tensor, torch.Tensor) else 2


def fma_tile_fits(block_m: int, block_n: int, elem_bytes: int) -> bool:
    """Whether a GEMM-like output tile (4 warps) is expected not to spill where ``tl.dot`` is FMA (sm_75):
    fp32 up to 64x64, 16-bit up to 2048 elements. From triton 3.9's compiles for sm_75 (linear with the
    LayerNorm + GELU and residual + LayerScale epilogues, patch embedding): 64x64x32 spilled 1.0-1.3 KB per
    thread in fp16 and none in fp32; 32x64x32 fp16 and 32x32x32 fp32 spilled nothing (64x32 holds as many
    accumulators as 32x64; not compiled)."""
    return block_m * block_n <= (64 * 64 if elem_bytes == 4 else 32 * 64)


def gemm_shared_bytes(card, config: triton.Config, block_m: int, block_n: int, block_k: int, elem_bytes: int) -> int:
    """Shared memory of a GEMM-like tile loop (``[block_m, block_k] @ [block_k, block_n]`` per step) on ``card``, as
    the prunes compare it with ``card.shared_memory``. On the wgmma / tcgen05 cards (sm_90, sm_100):
    ``num_stages - 1`` stages of both operand tiles, what Triton 3.9 lays out on sm_90. Other cards: every stage
    counted, an upper bound of what triton 3.9 reported for sm_86 and sm_75 (docs/kernels.md, section Shared memory
    and spills)."""
    stages = config.num_stages - 1 if card.dot in ("wgmma", "tcgen05") else config.num_stages
    return max(stages, 1) * (block_m + block_n) * block_k * elem_bytes


def gemm_prune_target(named_args: dict, operand: str, block_n: str) -> tuple:
    """``(card, elem_bytes, rows, fits)`` a GEMM-like prune (linear, patch embedding) decides for: its
    :func:`prune_target`, row class ``m_class(M)`` and ``fits(config)``, the rules both keep: configs for this kind of
    card (:data:`FMA_STAGES`), no spill on FMA (:func:`fma_tile_fits`), output tiles (``block_n``, the key of their
    width) narrower than 64 only for few rows, and within shared memory (:func:`gemm_shared_bytes`)."""
    card, elem_bytes = prune_target(named_args, operand)
    rows = m_class(named_args["M"])

    def fits(config: triton.Config) -> bool:
        block_m, width, block_k = config.kwargs["BLOCK_M"], config.kwargs[block_n], config.kwargs["BLOCK_K"]
        return (
            (config.num_stages > FMA_STAGES) == card.tensor_cores
            and (card.tensor_cores or fma_tile_fits(block_m, width, elem_bytes))
            and (width >= 64 or rows <= SMALL_M or not card.tensor_cores)
            and gemm_shared_bytes(card, config, block_m, width, block_k, elem_bytes) <= card.shared_memory
        )

    return card, elem_bytes, rows, fits


def closest_config(configs: list[triton.Config], want: dict, num_warps: int, num_stages: int) -> triton.Config:
    """The config of ``configs`` nearest ``want`` (block sizes; then warps and stages): how the heuristic
    of the no-autotune mode stays inside the autotune set (so the offline compile check covers it)."""

    def distance(config: triton.Config) -> tuple:
        blocks = sum(abs(config.kwargs[k].bit_length() - v.bit_length()) for k, v in want.items() if k in config.kwargs)
        return blocks, abs(config.num_warps - num_warps), abs(config.num_stages - num_stages)

    return min(configs, key=distance)


# ---------------------------------------------------------------------------------- TMA and persistent kernels
def tma_enabled() -> bool:
    """False when ``VIT_FAST_TMA=0``: the GEMM's persistent TMA configs are never candidates (read per tuning)."""
    return bool(switch("VIT_FAST_TMA", True))


def tma_usable(*operands: tuple[torch.Tensor, int]) -> bool:
    """Whether row-major 2-D operands, each given as ``(tensor, row stride in elements)``, can be read through
    TMA descriptors: ``VIT_FAST_TMA`` not off, a Hopper-class GPU (sm_90 or newer; a CPU tensor counts, for the
    interpreter and the offline compile check), 16-byte aligned bases and row strides (the hardware's rule)."""
    if not tma_enabled():
        return False
    for tensor, row_stride in operands:
        if not isinstance(tensor, torch.Tensor) or tensor.data_ptr() % 16 or row_stride * tensor.element_size() % 16:
            return False
        if not card_of(tensor.device).tma:
            return False
    return True


def persistent_programs(device: torch.device) -> int:
    """Programs a persistent kernel launches at most: one per SM of ``device`` on a GPU
    (:func:`~.cards.device_sm_count`); 3 in the interpreter, so the tests see each program walk several tiles."""
    return device_sm_count(device) if device.type == "cuda" else 3
