"""Compile every Triton kernel variant ahead of time for one or more GPU targets, without a GPU.

    python tools/compile_check.py                                   # ViT-B/16's variants, sm_90 (H100), a table
    python tools/compile_check.py --targets all --jobs 1 --markdown t.md --summary-csv t.csv --csv rows.csv
    python tools/compile_check.py --targets 75,86 --kernels linear,attention      # some targets, some kernels
    python tools/compile_check.py --targets 75,80,90 --kernels diff_attention     # timm's DiffAttention kernel
    python tools/compile_check.py --kernels layer_norm --filter fp16   # a subset: variants whose label has "fp16"
    python tools/compile_check.py --targets 90,80 --kernels preprocess   # the fused image preprocessing
    python tools/compile_check.py --set picks --filter fp32 --targets 80,86,90   # the default picks, ViT-S/B
    python tools/compile_check.py --set sweep [--full]              # the wider sweep (head dims, flags; slow)

Targets are compute capabilities (75 = sm_75, T4 ... 120 = sm_120, RTX 50xx); ``all`` is every row of
``vit_fast.base.cards.CARDS``. Each target's limits and expectations come from that table (never a copy):
the shared memory one block may use, what ``tl.dot`` should compile to there (``Card.dot``: no tensor-core
instruction, ``mma.sync``, ``wgmma`` or ``tcgen05``) and whether the card has TMA (``Card.tma``).

Each variant goes through the real GPU pipeline (ttir -> ttgir -> llir -> ptx -> cubin with the
ptxas shipped in the triton wheel) via ``triton.compile(ASTSource(...), target=GPUTarget(...))``,
specialised exactly as a launch would specialise it: the kernel's launcher (``launch_<op>``) runs on
CPU tensors of the variant's shapes, dtypes and strides with its kernel swapped for a recorder, inside
``cards.pretend_arch(target)`` (every device reads as the target), and the kernel's own binder runs on
the recorded arguments (ints equal to 1 become constants, multiples of 16 get the divisibility hint).
Which configs are checked is asked of the kernel's own ``early_config_prune``, also inside
``pretend_arch(target)``, with autotuning on (every candidate it keeps) and off (the one heuristic pick,
marked ``H``); ``ARCH`` is in the named arguments it gets, as the autotuner will pass it.

Per variant it reports shared memory (``metadata.shared``, what the launcher asks the driver for),
registers and spill bytes (``ptxas -v`` on the kernel's PTX, the same flags Triton uses), the tensor-core
instruction in the PTX (``mma.sync``, ``wgmma.mma_async``, ``tcgen05.mma``) and TMA
(``cp.async.bulk.tensor``), and flags shared memory above the card's limit, spills, a tensor-core use other
than the card table says (16-bit dots: ``Card.dot``; fp32 dots run at IEEE precision, on FMA everywhere)
and TMA where the card has none (or a TMA config without it). A summary per target closes the output, and
can be written as Markdown and CSV.

Catches what the interpreter (TRITON_INTERPRET=1) cannot: type errors, constexpr misuse, dot
shapes the tensor cores reject, shared-memory overflow, register spills. It does not run
anything, so it says nothing about numerics or speed. Not collected by pytest (not test_*/bench_*);
needs no GPU and no driver. Exit status 1 if any variant fails or is flagged while its kernel's prune keeps
it. Written against triton 3.9; the one compile option 3.6 lacks, ``fpsan_homomorphic_casts``, is passed
only where triton has it.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import csv
import hashlib
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures.process import BrokenProcessPool

from vit_fast.base.interpret import interpreter_enabled
from vit_fast.kernels import KERNELS

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning

ALL_KERNELS = tuple(KERNELS)  # the kernel files, in the registry's order
DTYPES = ("fp32", "fp16", "bf16")
#: the vit-b16 set's "every kept config" for these dtypes; bf16 gets its heuristic pick only: its prunes keep the
#: same configs as fp16 (same element size) and it compiles to the same tiles, so it would double the time
EVERY_CONFIG_DTYPES = ("fp32", "fp16")
#: what ``--targets all`` means: every row of the card table
VARIANT_SETS = ("vit-b16", "picks", "sweep")
#: the picks set: (name, embed dim, heads of 64) of ViT-S/16 and ViT-B/16 at 224 px (197 tokens), and its batches
PICK_MODELS = (("vit-s16", 384, 6), ("vit-b16", 768, 12))
PICK_BATCHES = (1, 8, 64)


def _torch_dtype(name):
    import torch

    return {
        "fp32": torch.float32,
        "fp16": torch.float16,
        "bf16": torch.bfloat16,
        "u8": torch.uint8,
        "i32": torch.int32,
    }[name]


def _empty(shape, dtype):
    import torch

    return torch.empty(shape, dtype=_torch_dtype(dtype))


class _Recorder:
    """Stands in for a kernel while its launcher runs: keeps the launch's arguments, launches nothing."""

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.args, self.kwargs = args, kwargs

        return launch


def _recorded_launch(name: str, launcher, *args, **kwargs):
    """(JITFunction, positional args, keyword args) of the launch ``launcher(*args, **kwargs)`` makes, ``name`` the
    kernel file's entry in :data:`vit_fast.kernels.KERNELS`.

    The launcher itself runs on CPU tensors of the variant's shapes, dtypes and strides (its input
    checks skipped: they would refuse CPU tensors without the interpreter), with its kernel swapped
    for a recorder; so the kernel's argument list is written once, in the launcher. Call it inside
    ``cards.pretend_arch(target)``: whatever the launcher reads of the device is then the target's."""
    from vit_fast.kernels import KERNELS

    entry = KERNELS[name]
    module, kernel, launches = entry.module, entry.kernel, entry.launches
    recorder = _Recorder()
    # launchers launch through their ResolvedLaunches, which holds the kernel itself: both are swapped
    setattr(module, entry.kernel_name, recorder)
    setattr(module, entry.launches_name, lambda grid, grid_key, *a, **k: recorder[grid](*a, **k))
    try:
        launcher(*args, **kwargs, checked=True)
    finally:
        setattr(module, entry.kernel_name, kernel)
        setattr(module, entry.launches_name, launches)
    return kernel_fn(kernel), recorder.args, recorder.kwargs


def kernel_fn(kernel):
    """The JITFunction under an Autotuner (or the JITFunction itself: its own ``fn`` is the Python function)."""
    from triton.runtime.jit import JITFunction

    while not isinstance(kernel, JITFunction):
        kernel = kernel.fn
    return kernel


# ------------------------------------------------------------------------------ cases and variants
# A case is a kernel's launch at one shape / dtype / flag set: (kernel, label, params, which configs).
# A task is a case with one config on one target: (kernel, label, params, target); params are plain values,
# so tasks cross process boundaries. "which configs": "kept" (every config the prune keeps on the target),
# "ends" (the smallest and largest kept tile), "narrow" (the kept tiles narrower than 64 columns), "all"
# (every config, kept or not: --full) or "pick" (only the heuristic's); the heuristic's pick is always in.


def _config_label(cfg) -> str:
    blocks = ",".join(f"{k[6:] if k.startswith('BLOCK_') else k}={v}" for k, v in cfg.kwargs.items())
    return f"{blocks} w{cfg.num_warps} s{cfg.num_stages}"


def _config_params(cfg) -> dict:
    return {"meta": dict(cfg.kwargs), "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


def _same_config(a, b) -> bool:
    return (a.kwargs, a.num_warps, a.num_stages) == (b.kwargs, b.num_warps, b.num_stages)


def _pe_case(dtype, image, shape, bias, prefix, which, tag=""):
    C, p, D, B, _ = shape
    label = (
        f"{dtype} {image} C{C} p{p} D{D} b{B} | bias={int(bias)} cls={int(prefix[0])} reg={prefix[1]} "
        f"nec={int(prefix[2])}{tag}"
    )
    params = {"dtype": dtype, "image": image, "shape": shape, "bias": bias, "prefix": prefix}
    return ("patch_embed", label, params, which)


PE_PREFIXES = (  # (HAS_CLS, num_reg, no_embed_class)
    (False, 0, False),
    (True, 0, False),
    (True, 0, True),
    (True, 4, False),
    (True, 4, True),
    (False, 4, True),
)


def _vit_b16_which(dtype: str) -> str:
    return "kept" if dtype in _every_config_dtypes else "pick"


_every_config_dtypes = EVERY_CONFIG_DTYPES  # --every-config-dtypes


def patch_embed_cases(variant_set: str, full: bool):
    if variant_set == "picks":  # ViT-S/16 and ViT-B/16: the heuristic's pick per dtype and batch
        return [
            _pe_case(dtype, "float", (3, 16, D, b, 224), True, (True, 0, False), "pick")
            for dtype, (_, D, _), b in itertools.product(DTYPES, PICK_MODELS, PICK_BATCHES)
        ]
    if variant_set == "vit-b16":
        # ViT-B/16 at 224 px, batch 1 and 8: a float image, conv bias, the class token
        return [
            _pe_case(dtype, "float", (3, 16, 768, b, 224), True, (True, 0, False), _vit_b16_which(dtype))
            for dtype, b in itertools.product(DTYPES, (1, 8))
        ]
    # (C, p, D, B, H): ViT-B/16 at 224 px; the embedded digits model (8x8 grey, p=4, D=64)
    shapes = ((3, 16, 768, 8, 224), (1, 4, 64, 32, 8))
    cases = []
    for dtype, image, shape in itertools.product(DTYPES, ("float", "float+norm", "uint8+norm"), shapes):
        # every config: the heaviest flag set (bias, class + 4 register tokens) ...
        cases.append(_pe_case(dtype, image, shape, True, (True, 4, False), "all" if full else "kept"))
        # ... and the flag sweep (bias x prefix tokens x no_embed_class): with --full on every config and
        # shape, else on the largest tile (the most registers) at ViT-B/16's shape
        if full or shape is shapes[0]:
            for bias, prefix in itertools.product((False, True), PE_PREFIXES):
                if (bias, prefix) != (True, (True, 4, False)):
                    cases.append(_pe_case(dtype, image, shape, bias, prefix, "all" if full else "largest"))
    return cases


def patch_embed_launch(params):
    from vit_fast.kernels import patch_embed as pe

    C, p, D, B, H = params["shape"]
    dtype, image = params["dtype"], params["image"]
    has_cls, num_reg, no_embed_class = params["prefix"]
    num_patches = (H // p) ** 2
    num_prefix = int(has_cls) + num_reg
    normalize = image.endswith("+norm")
    return _recorded_launch(
        "patch_embed",
        pe.launch_patch_embed,
        _empty((B, C, H, H), "u8" if image.startswith("uint8") else dtype),
        _empty((D, C, p, p), dtype),
        _empty((D,), dtype) if params["bias"] else None,
        _empty((1, num_patches + (0 if no_embed_class else num_prefix), D), dtype),
        _empty((1, 1, D), dtype) if has_cls else None,
        _empty((1, num_reg, D), dtype) if num_reg else None,
        no_embed_class=no_embed_class,
        mean=_empty((C,), "fp32") if normalize else None,
        std=_empty((C,), "fp32") if normalize else None,
    )


def layer_norm_cases(variant_set: str, full: bool):
    cases = []
    if variant_set == "vit-b16":
        # the final norm (no residual) and the unfused add + LayerNorm, D 768, batch 1 and 8
        grid = itertools.product(DTYPES, (768,), (1, 8), (False, True), (True,), (True,))
    elif variant_set == "picks":
        grid = itertools.product(DTYPES, [D for _, D, _ in PICK_MODELS], PICK_BATCHES, (False, True), (True,), (True,))
    else:
        grid = itertools.product(DTYPES, (64, 768, 1024, 1280), (8,), (False, True), (False, True), (False, True))
    for dtype, D, b, res, weight, bias in grid:
        label = f"{dtype} D{D} b{b} | res={int(res)} weight={int(weight)} bias={int(bias)}"
        params = {"dtype": dtype, "D": D, "M": 197 * b, "res": res, "weight": weight, "bias": bias}
        cases.append(("layer_norm", label, params, "pick"))
    if variant_set == "sweep":
        # the RMS mode (timm's RmsNorm: a weight, no bias, no residual): the xp ViTs' widths, and qk-norm over
        # head dims 64 and 80 (rows: tokens x heads)
        for dtype, D in itertools.product(DTYPES, (64, 80, 768, 1024, 1280)):
            params = {"dtype": dtype, "D": D, "M": 197 * 8, "res": False, "weight": True, "bias": False, "rms": True}
            cases.append(("layer_norm", f"{dtype} D{D} b8 | rms weight=1", params, "pick"))
    return cases


def layer_norm_launch(params):
    from vit_fast.kernels import layer_norm as ln

    M, D, dtype = params["M"], params["D"], params["dtype"]
    # the launcher picks the compiled-mode block sizes and warps itself (TRITON_INTERPRET unset)
    return _recorded_launch(
        "layer_norm",
        ln.launch_add_layer_norm,
        _empty((M, D), dtype),
        _empty((M, D), dtype) if params["res"] else None,
        _empty((D,), dtype) if params["weight"] else None,
        _empty((D,), dtype) if params["bias"] else None,
        1e-6,
        rms=params.get("rms", False),
    )


ATTENTION_HEADS = {32: 12, 64: 12, 80: 16, 96: 12, 128: 16, 256: 4}  # head_dim -> num_heads (256: MAX_HEAD_DIM)


#: the attention kernel's masked variants (its HAS_LENGTHS / PACKED flags): a padded batch, packed images
ATTENTION_MASKS = ("lengths", "packed")


#: the attention kernel's rotary variants (its ROPE flag): timm's interleaved pairs with one table for every head
#: ('cat', EVA-02), the half layout with a table per head ('mixed' with rotate_half); a class token left unrotated
ATTENTION_ROPES = ("rope", "rope-half")


def _attention_case(dtype, head_dim, b, which, mask=None, heads=None):
    label = f"{dtype}{f' H{heads}' if heads else ''} Dh{head_dim} b{b}{f' | {mask}' if mask else ''}"
    params = {"dtype": dtype, "head_dim": head_dim, "B": b, **({"heads": heads} if heads else {})}
    return ("attention", label, {**params, **({"mask": mask} if mask else {})}, which)


def attention_cases(variant_set: str, full: bool):
    if variant_set == "picks":  # 6 (ViT-S/16) and 12 (ViT-B/16) heads of 64, 197 tokens
        return [
            _attention_case(dtype, 64, b, "pick", heads=H)
            for dtype, (_, _, H), b in itertools.product(DTYPES, PICK_MODELS, PICK_BATCHES)
        ]
    if variant_set == "vit-b16":  # 12 heads of 64, 197 tokens, batch 1 and 8; the masked variants at batch 8
        return [
            _attention_case(dtype, 64, b, _vit_b16_which(dtype)) for dtype, b in itertools.product(DTYPES, (1, 8))
        ] + [
            _attention_case(dtype, 64, 8, _vit_b16_which(dtype), mask)
            for dtype, mask in itertools.product(DTYPES, (*ATTENTION_MASKS, *ATTENTION_ROPES))
        ]
    cases = []
    for head_dim, dtype in itertools.product(ATTENTION_HEADS, DTYPES):
        # Dh 80 and 96 have the same tiles as Dh 128 (BLOCK_D 128), only the masks differ
        which = "all" if full else ("ends" if head_dim in (80, 96) else "kept")
        cases.append(_attention_case(dtype, head_dim, 8, which))
        # the masked variants: the smallest and largest kept tile (and the pick) unless --full
        cases += [_attention_case(dtype, head_dim, 8, "all" if full else "ends", mask) for mask in ATTENTION_MASKS]
        if head_dim in (64, 128):  # the rotary variants: every config of the set, so new tiles can be judged
            cases += [_attention_case(dtype, head_dim, 8, "all", rope) for rope in ATTENTION_ROPES]
    return cases


def attention_launch(params):
    from vit_fast.kernels import attention as at

    B, T, Dh = params.get("B", 8), 197, params["head_dim"]
    H = params.get("heads", ATTENTION_HEADS[Dh])
    mask = params.get("mask")
    # 196 patch tokens after the class token: one table [T - 1, Dh] for every head, or one per head [H, T - 1, Dh]
    rope = {
        "num_prefix": 1,
        "rope_cos": _empty((T - 1, Dh), params["dtype"]),
        "rope_sin": _empty((T - 1, Dh), params["dtype"]),
    }
    rope_half = {
        "num_prefix": 1,
        "rope_layout": "half",
        **{k: _empty((H, T - 1, Dh), params["dtype"]) for k in ("rope_cos", "rope_sin")},
    }
    masks = {
        "lengths": {"lengths": _empty((B,), "i32")},
        # four images in each row's 197 tokens; the launcher reads no values (checked=True)
        "packed": {"cu_seqlens": _empty((4 * B + 1,), "i32"), "max_seqlen": 64},
        "rope": rope,
        "rope-half": rope_half,
    }
    return _recorded_launch(
        "attention",
        at.launch_attention,
        _empty((B, T, 3 * H * Dh), params["dtype"]),
        H,
        **(masks[mask] if mask else {}),
    )


#: the attention-pool head: head_dim -> (num_heads, tokens); 64: SigLIP-B/16 at 224 (196 tokens), 72: SigLIP
#: so400m/14 at 384 (729 tokens), 80 and 128: padded and full 128 lanes, 256: MAX_HEAD_DIM
POOL_HEADS = {64: (12, 196), 72: (16, 729), 80: (16, 256), 128: (8, 256), 256: (4, 196)}


def attention_pool_cases(variant_set: str, full: bool):
    # the batch is only the grid's size (the kernel has no batch argument): one batch compiles what all would
    if variant_set == "picks":  # not in ViT-S/16 or ViT-B/16
        return []
    if variant_set == "vit-b16":  # SigLIP-B/16's head: one latent query, 12 heads of 64
        return [
            ("attention_pool", f"{dtype} Dh64 Lq1 b8", {"dtype": dtype, "head_dim": 64, "B": 8, "Lq": 1}, "kept")
            for dtype in DTYPES
        ]
    cases = []
    for head_dim, dtype in itertools.product(POOL_HEADS, DTYPES):
        which = "all" if full else ("ends" if head_dim in (80, 128) else "kept")
        params = {"dtype": dtype, "head_dim": head_dim, "B": 8, "Lq": 1}
        cases.append(("attention_pool", f"{dtype} Dh{head_dim} Lq1 b8", params, which))
    return cases


def attention_pool_launch(params):
    from vit_fast.kernels import attention_pool as ap

    B, Dh, Lq = params.get("B", 8), params["head_dim"], params.get("Lq", 1)
    H, T = POOL_HEADS[Dh]
    q, kv = _empty((1, Lq, H * Dh), params["dtype"]), _empty((B, T, 2 * H * Dh), params["dtype"])
    return _recorded_launch("attention_pool", ap.launch_attention_pool, q, kv, H)


#: q/k head dim -> heads of timm's differential attention (output heads are 2 x head dim wide); 32: vit_dwee /
#: vit_dlittle (4 and 5 heads of 2 x 32), 128: the kernel's MAX_HEAD_DIM (v heads of 256)
DIFF_ATTENTION_HEADS = {16: 2, 32: 4, 64: 6, 128: 2}


def diff_attention_cases(variant_set: str, full: bool):
    if variant_set == "picks":  # not in ViT-S/16 or ViT-B/16
        return []
    if variant_set == "vit-b16":  # not in ViT-B/16: vit_dwee_patch16_reg1_gap_256's (4 heads of 2 x 32, T 257)
        return [
            ("diff_attention", f"{dtype} Dh32 T257 b8", {"dtype": dtype, "head_dim": 32, "B": 8}, "pick")
            for dtype in DTYPES
        ]
    cases = []
    for head_dim, dtype in itertools.product(DIFF_ATTENTION_HEADS, DTYPES):
        which = "all" if full else ("kept" if dtype in EVERY_CONFIG_DTYPES else "pick")
        label = f"{dtype} Dh{head_dim} T257 b8"
        cases.append(("diff_attention", label, {"dtype": dtype, "head_dim": head_dim, "B": 8}, which))
    return cases


def diff_attention_launch(params):
    from vit_fast.kernels import diff_attention as da

    B, T, Dh, dtype = params.get("B", 8), 257, params["head_dim"], params["dtype"]
    H = DIFF_ATTENTION_HEADS[Dh]
    return _recorded_launch(
        "diff_attention",
        da.launch_diff_attention,
        _empty((B, T, 3 * H * 2 * Dh), dtype),
        _empty((), "fp32"),
        _empty((2 * Dh,), dtype),
        H,
        0.5,
    )


# (label, (M, N, K), activation, bias, residual, gamma): "ln+" labels have the LayerNorm prologue
# (layer_norm_linear: LN1 -> qkv, LN2 -> fc1)
def _vit_b16_gemms(b: int, D: int = 768, tag: str = ""):
    """A ViT block's four GEMMs at batch ``b`` (197 tokens) and width ``D`` (ViT-B/16's 768 by default);
    ``tag`` goes into the labels after the GEMM's name."""
    M = 197 * b
    return (
        (f"ln+qkv{tag} b{b} none+bias", (M, 3 * D, D), "none", True, False, False),
        (f"proj{tag} b{b} bias+res", (M, D, D), "none", True, True, False),
        (f"ln+fc1{tag} b{b} gelu+bias", (M, 4 * D, D), "gelu", True, False, False),
        (f"fc2{tag} b{b} bias+res", (M, D, 4 * D), "none", True, True, False),
    )


#: ViT-B/16's GEMMs whose every kept config is checked (the others: the heuristic's pick only): the LayerNorm
#: prologue with the erf GELU epilogue, the heaviest in registers (the prune reads shapes only, so it keeps the same
#: tiles for all four; each prologue / epilogue is tuned among them on its own: its flags are in the autotune key)
VIT_B16_EVERY_CONFIG = ("ln+fc1",)

# the sweep: the ViT-B/16 block's GEMMs at batch 8 with every epilogue, and batch 1's narrow tiles
LINEAR_VARIANTS = (
    ("qkv none+bias", (1576, 2304, 768), "none", True, False, False),
    ("ln+qkv none+bias", (1576, 2304, 768), "none", True, False, False),
    ("ln+fc1 gelu+bias", (1576, 3072, 768), "gelu", True, False, False),
    # batch 1 (197 rows): the narrow small-M tiles (BLOCK_N 16 / 32) are candidates only here
    ("ln+qkv b1 none+bias", (197, 2304, 768), "none", True, False, False),
    ("fc2 b1 bias+res+gamma", (197, 768, 3072), "none", True, True, True),
    ("fc1 gelu+bias", (1576, 3072, 768), "gelu", True, False, False),
    ("fc1 gelu_tanh+bias", (1576, 3072, 768), "gelu_tanh", True, False, False),
    # OpenAI CLIP's QuickGELU and SwiGLU's SiLU (timm / HF models patched in place run these epilogues)
    ("fc1 quick_gelu+bias", (1576, 3072, 768), "quick_gelu", True, False, False),
    ("fc1 silu+bias", (1576, 3072, 768), "silu", True, False, False),
    ("fc2 bias+res+gamma", (1576, 768, 3072), "none", True, True, True),
    # the RmsNorm prologue (LN_RMS: timm's xp ViTs, ParallelScalingBlock's in_proj as fc1 and qkv GEMMs; no qkv bias)
    ("rms+qkv none", (1576, 2304, 768), "none", False, False, False),
    ("rms+fc1 gelu+bias", (1576, 3072, 768), "gelu", True, False, False),
    ("rms+qkv b1 none", (197, 2304, 768), "none", False, False, False),
    # SwiGLU's gated epilogue (two accumulators: the register-heaviest GEMM; N is the output's width, the weight
    # stacks 2N rows): EVA-02 / AIMv2 fc1 behind a LayerNorm or RmsNorm, DINOv2 giant's GluMlp (gate last)
    ("ln+fc1 silu_glu+bias", (1576, 2048, 768), "silu_glu", True, False, False),
    ("rms+fc1 silu_glu", (1576, 2048, 768), "silu_glu", False, False, False),
    ("ln+fc1 b1 silu_glu_last+bias", (197, 2048, 768), "silu_glu_last", True, False, False),
)
# every config for the heaviest epilogues (erf GELU; residual + LayerScale); the others on two tiles unless --full
LINEAR_EVERY_CONFIG = ("fc1 gelu+bias", "fc2 bias+res+gamma", "ln+fc1 gelu+bias", "ln+fc1 silu_glu+bias")


def linear_cases(variant_set: str, full: bool):
    cases = []
    if variant_set == "picks":
        for dtype, (_, D, _), b in itertools.product(DTYPES, PICK_MODELS, PICK_BATCHES):
            for variant in _vit_b16_gemms(b, D, f" D{D}"):
                cases.append(("linear", f"{dtype} {variant[0]}", {"dtype": dtype, "variant": variant}, "pick"))
        return cases
    if variant_set == "vit-b16":
        for dtype, b in itertools.product(DTYPES, (1, 8)):
            for variant in _vit_b16_gemms(b):
                every = variant[0].split()[0] in VIT_B16_EVERY_CONFIG
                which = _vit_b16_which(dtype) if every else "pick"
                cases.append(("linear", f"{dtype} {variant[0]}", {"dtype": dtype, "variant": variant}, which))
        return cases
    for variant, dtype in itertools.product(LINEAR_VARIANTS, DTYPES):
        name = variant[0]
        if full:
            which = "all"
        elif " b1 " in name:
            which = "narrow"  # batch 1: the narrow tiles only batch 1-2 gets
        elif name in LINEAR_EVERY_CONFIG:
            which = "kept"
        else:
            which = "ends"  # epilogue-only variants: the smallest and largest tile
        cases.append(("linear", f"{dtype} {name}", {"dtype": dtype, "variant": variant}, which))
    return cases


def linear_launch(params):
    from vit_fast.kernels import linear as li

    name, (M, N, K), act, has_bias, has_res, has_gamma = params["variant"]
    dtype = params["dtype"]
    ln = {"ln_weight": _empty((K,), dtype), "ln_bias": _empty((K,), dtype), "ln_eps": 1e-6} if name[:3] == "ln+" else {}
    if name[:4] == "rms+":  # timm's RmsNorm: a weight, no bias
        ln = {"ln_weight": _empty((K,), dtype), "ln_eps": 1e-6, "ln_rms": True}
    rows = 2 * N if "_glu" in act else N  # a gated GEMM's weight and bias stack its two halves
    return _recorded_launch(
        "linear",
        li.launch_linear,
        _empty((M, K), dtype),
        _empty((rows, K), dtype),
        _empty((rows,), dtype) if has_bias else None,
        None if act == "none" else act,
        _empty((M, N), dtype) if has_res else None,
        _empty((N,), dtype) if has_gamma else None,
        **ln,
    )


#: preprocessing cases: (label, decoded image sizes in one launch, resize, crop, interpolation). vit-b16: photos
#: of two sizes to timm's eval input at 224 (short side to 248, centre 224); sweep: a 1080p frame downscaled 8x
#: (the most taps), the digits model's 8x8 upscaled to 32x32
PREPROCESS_VARIANTS = {
    "vit-b16": (("photos 500x375+640x480 -> 248x330 / 224", ((375, 500), (480, 640)), (248, 330), (224, 224)),),
    "sweep": (
        ("1080p -> 224", ((1080, 1920),), (224, 398), (224, 224)),
        ("digits 8x8 -> 32", ((8, 8),), (32, 32), (32, 32)),
    ),
}


def preprocess_cases(variant_set: str, full: bool):
    """Not in a ViT forward, so not in the picks set; every config it keeps for fp32 / fp16 (--every-config-dtypes),
    the pick for bf16, per interpolation."""
    cases = []
    for (name, sizes, resize, crop), dtype, interpolation in itertools.product(
        PREPROCESS_VARIANTS.get(variant_set, ()), DTYPES, ("bicubic", "bilinear")
    ):
        params = {"dtype": dtype, "sizes": sizes, "resize": resize, "crop": crop, "interpolation": interpolation}
        which = "all" if full else _vit_b16_which(dtype)
        cases.append(("preprocess", f"{dtype} {interpolation} {name}", params, which))
    return cases


def preprocess_launch(params):
    import torch

    from vit_fast.kernels import preprocess as pp

    # the launcher packs the images' pixels (a copy of up to a MB) with torch on the CPU: on one thread, or the
    # forked compile workers hang in an OpenMP pool the parent started (seen: every worker asleep on a futex)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _recorded_launch(
            "preprocess",
            pp.launch_preprocess,
            [_empty((h, w, 3), "u8") for h, w in params["sizes"]],
            resize=tuple(params["resize"]),
            crop=tuple(params["crop"]),
            interpolation=params["interpolation"],
            mean=(0.485, 0.456, 0.406),
            std=(0.229, 0.224, 0.225),
            out_dtype=_torch_dtype(params["dtype"]),
        )
    finally:
        torch.set_num_threads(threads)


CASES = {
    "patch_embed": patch_embed_cases,
    "layer_norm": layer_norm_cases,
    "attention": attention_cases,
    "attention_pool": attention_pool_cases,
    "diff_attention": diff_attention_cases,
    "linear": linear_cases,
    "preprocess": preprocess_cases,
}
LAUNCH = {
    "patch_embed": patch_embed_launch,
    "layer_norm": layer_norm_launch,
    "attention": attention_launch,
    "attention_pool": attention_pool_launch,
    "diff_attention": diff_attention_launch,
    "linear": linear_launch,
    "preprocess": preprocess_launch,
}


def _tuner(kernel: str):
    """The kernel's Autotuner, or None for a kernel that is not autotuned (its launcher picks the config)."""
    from vit_fast.kernels import KERNELS

    entry = KERNELS[kernel]
    return entry.kernel if entry.configs else None


def _named_args(fn, args, const, target: int) -> dict:
    """What the autotuner hands its prune: the launch's arguments by name, its constexprs, and ``ARCH``."""
    named = dict(zip(fn.arg_names, args, strict=False))
    named.update(const)
    named["ARCH"] = target  # the card-aware prunes read card_for_arch(named_args["ARCH"]); harmless before
    return named


def _prune(kernel: str, params: dict, target: int, tune: bool):
    """The configs the kernel's own early_config_prune keeps for this case on ``target``, with autotuning on
    (``tune``: every candidate) or off (the heuristic's one pick); None for a kernel that is not autotuned."""
    from vit_fast.base import cards
    from vit_fast.kernels.autotune import tuning

    tuner = _tuner(kernel)
    if tuner is None:
        return None
    with cards.pretend_arch(target), tuning(tune):
        fn, args, const = LAUNCH[kernel](params)
        prune = getattr(tuner, "early_config_prune", None)
        if not prune:
            return list(tuner.configs)
        return list(prune(tuner.configs, _named_args(fn, args, const, target), **const))


def _choose(kept, every, pick, which: str):
    if which == "all":
        chosen = list(every)
    elif which == "ends":
        chosen = [kept[0], kept[-1]]
    elif which == "largest":
        chosen = [kept[-1]]
    elif which == "narrow":
        chosen = [c for c in kept if c.kwargs.get("BLOCK_N", 64) < 64]
    elif which == "pick":
        chosen = []
    else:
        chosen = list(kept)
    if pick is not None and not any(_same_config(pick, c) for c in chosen):
        chosen.append(pick)
    return chosen


def tasks_for(kernels, target: int, variant_set: str = "vit-b16", full: bool = False, label_filter: str = ""):
    """The tasks for one target: each case's configs as its kernel's prune chooses them on that target."""
    tasks = []
    for kernel in kernels:
        for _, case_label, params, which in CASES[kernel](variant_set, full):
            tuner = _tuner(kernel)
            if tuner is None:
                label = f"{case_label}"
                if label_filter in label:
                    tasks.append((kernel, label, {**params, "heuristic": True}, target))
                continue
            kept = _prune(kernel, params, target, tune=True)
            picks = _prune(kernel, params, target, tune=False)
            pick = picks[0] if len(picks) == 1 else None
            for cfg in _choose(kept, tuner.configs, pick, which):
                label = f"{_config_label(cfg)} | {case_label}"
                if label_filter not in label:
                    continue
                heuristic = pick is not None and _same_config(cfg, pick)
                tasks.append((kernel, label, {**params, **_config_params(cfg), "heuristic": heuristic}, target))
    return tasks


# ------------------------------------------------------------------------------ compile one
_PTXAS_RE = {
    "regs": re.compile(r"Used (\d+) registers"),
    "spill_st": re.compile(r"(\d+) bytes spill stores"),
    "spill_ld": re.compile(r"(\d+) bytes spill loads"),
    "stack": re.compile(r"(\d+) bytes stack frame"),
}
#: PTX instructions of the tensor cores, newest first: a variant's "tc" is the first found
TENSOR_CORE_PTX = (("tcgen05", "tcgen05.mma"), ("wgmma", "wgmma.mma_async"), ("mma.sync", "mma.sync.aligned"))
#: TMA: the bulk tensor copy
TMA_PTX = "cp.async.bulk.tensor"
_USAGE_CACHE: dict[tuple, dict] = {}  # (arch, sha1 of the PTX) -> ptxas usage, per worker process


def tensor_core_of(ptx: str) -> str:
    """The tensor-core instruction family in ``ptx``: "tcgen05", "wgmma", "mma.sync", or "fma" (none)."""
    return next((name for name, needle in TENSOR_CORE_PTX if needle in ptx), "fma")


def ptxas_for(arch: int) -> str:
    """Which ptxas triton uses for ``arch`` and the architecture it names: ``path (version) --gpu-name=sm_90a``."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

        ptxas = get_ptxas(arch)
        return f"{ptxas.path} ({ptxas.version}) --gpu-name={sm_arch_from_capability(arch)}"
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        return f"no ptxas: {type(e).__name__}: {e}"


def _ptxas_usage(ptx: str, arch: int) -> dict:
    """Registers, spills and stack of the kernel's PTX, from ``ptxas -v`` with Triton's flags."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    key = (arch, hashlib.sha1(ptx.encode()).hexdigest())
    if key in _USAGE_CACHE:
        return _USAGE_CACHE[key]
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [
            get_ptxas(arch).path,
            "-lineinfo",
            "-v",
            "--regAllocOptLevel=2",
            f"--gpu-name={sm_arch_from_capability(arch)}",
        ]
        proc = subprocess.run([*cmd, src, "-o", os.path.join(tmp, "k.cubin")], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"ptxas -v failed: {proc.stderr.strip()[-500:]}")
    usage = {}
    for key_, rx in _PTXAS_RE.items():
        m = rx.search(proc.stderr)
        usage[key_] = int(m.group(1)) if m else None
    _USAGE_CACHE[key] = usage
    return usage


def _pruned_by_autotuner(kernel: str, params: dict, target: int) -> bool:
    """Whether the kernel's own early_config_prune (autotuning on, on ``target``) drops this config, so it never
    runs there."""
    if "meta" not in params:
        return False
    kept = _prune(kernel, params, target, tune=True)
    if kept is None:
        return False
    key = (params["meta"], params["num_warps"], params["num_stages"])
    return all((c.kwargs, c.num_warps, c.num_stages) != key for c in kept)


ROW_FIELDS = (
    "target",
    "kernel",
    "variant",
    "dtype",
    "heuristic",
    "ok",
    "pruned",
    "shared",
    "regs",
    "spills",
    "tc",
    "tma",
    "tma_config",
    "flags",
    "error",
    "seconds",
)


def _failed(task, error: str = "") -> dict:
    """The result row of a variant that has not compiled (yet)."""
    kernel, label, params, target = task
    return {
        "target": target,
        "kernel": kernel,
        "variant": label,
        "dtype": params.get("dtype"),
        "heuristic": bool(params.get("heuristic")),
        "ok": False,
        "pruned": False,
        "shared": None,
        "regs": None,
        "spills": None,
        "tc": None,
        "tma": None,
        "tma_config": bool(params.get("meta", {}).get("TMA")),
        "flags": "",
        "error": error,
        "seconds": None,
    }


def compile_one(task):
    """Compile one variant for its target; returns a result dict (never raises)."""
    warnings.simplefilter("ignore")
    kernel, label, params, target = task
    result = _failed(task)
    t0 = time.perf_counter()
    try:
        import triton
        from triton import knobs
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, make_backend
        from triton.runtime.jit import create_function_from_signature

        from vit_fast.base import cards
        from vit_fast.kernels.launches import FP_FUSION

        with cards.pretend_arch(target):
            fn, args, const = LAUNCH[kernel](params)
        result["pruned"] = _pruned_by_autotuner(kernel, params, target)
        kwargs = dict(const)
        kwargs.update(params.get("meta", {}))
        for opt in ("num_warps", "num_stages"):
            if opt in params:
                kwargs[opt] = params[opt]
        # the options JITFunction.run adds before binding. fpsan_homomorphic_casts is in triton 3.9's knobs
        # (and its run adds it) but not in 3.6's, whose run adds only the first two
        kwargs["enable_fp_fusion"] = FP_FUSION  # what every launch passes (ResolvedLaunches, not the launcher)
        kwargs["debug"] = False
        kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        if hasattr(knobs.compilation, "fpsan_homomorphic_casts"):
            kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
        gpu = GPUTarget("cuda", target, 32)
        backend = make_backend(gpu)
        binder = create_function_from_signature(fn.signature, fn.params, backend)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
        compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=gpu, options=options.__dict__)
        ptx = compiled.asm["ptx"]
        result["shared"] = compiled.metadata.shared
        usage = _ptxas_usage(ptx, target)
        result["regs"] = usage["regs"]
        result["spills"] = (usage["spill_st"] or 0) + (usage["spill_ld"] or 0)
        result["tc"] = tensor_core_of(ptx)
        result["tma"] = TMA_PTX in ptx
        result["ok"] = True
    except Exception as e:  # noqa: BLE001 - every failure is a row of the table
        msg = f"{type(e).__name__}: {e}"
        result["error"] = " ".join(msg.split())[:600]
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


# ------------------------------------------------------------------------------ flags and the per-target table
def expected_tc(row: dict, card) -> str:
    """What the card table says the row's dots compile to: ``Card.dot`` for 16-bit dots; "fma" for fp32 (the
    kernels run fp32 dots at IEEE precision, never TF32) and for LayerNorm and preprocessing (no dot). The attention
    pool's dots have 16 query rows, below wgmma's and tcgen05's 64-row minimum: mma.sync on those cards (as triton
    3.9 compiles them for sm_90)."""
    if row["kernel"] in ("layer_norm", "preprocess") or row.get("dtype") == "fp32":
        return "fma"
    if row["kernel"] == "attention_pool" and card.dot in ("wgmma", "tcgen05"):
        return "mma.sync"
    return card.dot


def flags(row: dict, card) -> list[str]:
    """What is wrong with a row on ``card``: FAIL; shared memory above the card's per-block limit; spills; a
    tensor-core instruction other than the card table's; TMA where the card has none, or a TMA config without it."""
    if not row["ok"]:
        return ["FAIL"]
    notes = []
    if row["shared"] is not None and row["shared"] > card.shared_memory:
        notes.append(f"SHARED>{card.shared_memory // 1024}KB")
    if row["spills"]:
        notes.append(f"SPILLS:{row['spills']}B")
    want = expected_tc(row, card)
    if row["tc"] is not None and row["tc"] != want:
        notes.append(f"TC:{row['tc']}!={want}")
    if row.get("tma_config") and not card.tma:
        notes.append("TMA-CONFIG-WITHOUT-TMA")
    elif row["tma"] is not None and bool(row["tma"]) != bool(row.get("tma_config") and card.tma):
        notes.append("TMA:" + ("unexpected" if row["tma"] else "missing"))
    return notes


def annotate(rows: list[dict]) -> list[dict]:
    """Fill each row's ``flags`` from the card of its target (in place); returns the rows."""
    from vit_fast.base.cards import card_for_arch

    for row in rows:
        row["flags"] = " ".join(flags(row, card_for_arch(int(row["target"]))))
    return rows


def bad(row: dict) -> bool:
    """Failed, or flagged and still kept by its kernel's prune (so it may run)."""
    return not row["ok"] or (bool(row["flags"]) and not row.get("pruned"))


SUMMARY_FIELDS = (
    ("target", "target"),
    ("cards", "cards"),
    ("variants", "variants"),
    ("compiled", "compiled"),
    ("failed", "failed"),
    ("over_shared", "over shared memory"),
    ("spilling", "spilling"),
    ("worst_spill", "worst spill (B)"),
    ("max_shared_kb", "max shared (KB) / limit"),
    ("mma_sync", "mma.sync"),
    ("wgmma", "wgmma"),
    ("tcgen05", "tcgen05"),
    ("tma", "TMA"),
    ("tc_mismatch", "tensor cores != card"),
    ("flagged", "flagged and kept"),
    ("heuristic_flagged", "of them heuristic picks"),
    ("seconds", "compile s"),
)


def summarize(rows: list[dict]) -> list[dict]:
    """One line per target, in target order, from annotated rows."""
    from vit_fast.base.cards import card_for_arch

    out = []
    for target in sorted({int(r["target"]) for r in rows}):
        card = card_for_arch(target)
        mine = [r for r in rows if int(r["target"]) == target]
        ok = [r for r in mine if r["ok"]]
        spilling = [r for r in ok if r["spills"]]
        tcs = [r["tc"] for r in ok]
        out.append(
            {
                "target": f"sm_{target}",
                "cards": card.examples,
                "variants": len(mine),
                "compiled": len(ok),
                "failed": len(mine) - len(ok),
                "over_shared": sum(1 for r in ok if r["shared"] is not None and r["shared"] > card.shared_memory),
                "spilling": len(spilling),
                "worst_spill": max((r["spills"] for r in spilling), default=0),
                "max_shared_kb": f"{max((r['shared'] or 0 for r in ok), default=0) / 1024:.1f} / "
                f"{card.shared_memory // 1024}",
                "mma_sync": tcs.count("mma.sync"),
                "wgmma": tcs.count("wgmma"),
                "tcgen05": tcs.count("tcgen05"),
                "tma": sum(1 for r in ok if r["tma"]),
                "tc_mismatch": sum(1 for r in ok if "TC:" in r["flags"]),
                "flagged": sum(1 for r in mine if bad(r)),
                "heuristic_flagged": sum(1 for r in mine if bad(r) and r.get("heuristic")),
                "seconds": round(sum(r["seconds"] or 0 for r in mine)),
            }
        )
    return out


def markdown_table(summary: list[dict]) -> str:
    lines = [
        "| " + " | ".join(title for _, title in SUMMARY_FIELDS) + " |",
        "|" + "---|" * len(SUMMARY_FIELDS),
    ]
    lines += ["| " + " | ".join(str(s[key]) for key, _ in SUMMARY_FIELDS) + " |" for s in summary]
    return "\n".join(lines)


def markdown_report(summary: list[dict], rows: list[dict], header: str = "") -> str:
    """The per-target table, then every flagged row (failed, or flagged and kept)."""
    parts = [header, markdown_table(summary), ""] if header else [markdown_table(summary), ""]
    flagged = [r for r in rows if bad(r)]
    if flagged:
        parts += [
            "Flagged variants (H: the no-autotune heuristic's pick):",
            "",
            "| target | kernel | variant | H | shared KB | regs | spill B | tensor cores | flags |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in flagged:
            shared = f"{r['shared'] / 1024:.1f}" if r["shared"] is not None else "-"
            text = r["flags"] + (f" ({r['error']})" if r["error"] else "")
            variant = r["variant"].replace("|", "\\|")  # labels hold " | ": escaped, or the table splits there
            parts.append(
                f"| sm_{r['target']} | {r['kernel']} | {variant} | {'H' if r.get('heuristic') else ''} | "
                f"{shared} | {r['regs'] if r['regs'] is not None else '-'} | "
                f"{r['spills'] if r['spills'] is not None else '-'} | {r['tc'] or '-'} | {text} |"
            )
    return "\n".join(parts) + "\n"


def read_rows(path: str) -> list[dict]:
    """Rows from a ``--csv`` file, typed back (ints, bools, None for empty cells)."""

    def value(key, text):
        if key in ("ok", "pruned", "heuristic", "tma", "tma_config"):
            return {"True": True, "False": False}.get(text)
        if key in ("target", "shared", "regs", "spills"):
            return int(text) if text else None
        if key == "seconds":
            return float(text) if text else None
        return text

    with open(path, newline="") as f:
        return [{k: value(k, v) for k, v in r.items()} for r in csv.DictReader(f)]


def write_summary_csv(path: str, summary: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[key for key, _ in SUMMARY_FIELDS])
        writer.writeheader()
        writer.writerows(summary)


# ------------------------------------------------------------------------------ driver
def _run_all(tasks, jobs: int, progress: bool, on_result=None):
    results = [None] * len(tasks)
    pending = list(range(len(tasks)))
    done = 0
    t0 = time.perf_counter()

    def finished(i, row):
        nonlocal done
        results[i] = row
        done += 1
        if on_result is not None:
            on_result(row)
        if progress and (done % 20 == 0 or done == len(tasks)):
            print(f"  {done}/{len(tasks)} compiled ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)

    retry = []
    with cf.ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(compile_one, tasks[i]): i for i in pending}
        for fut in cf.as_completed(futures):
            i = futures[fut]
            try:
                finished(i, fut.result())
            except BrokenProcessPool:
                retry.append(i)
    # a worker died (a compiler abort or a segfault): rerun the victims one by one, each alone
    for i in sorted(retry):
        with cf.ProcessPoolExecutor(max_workers=1) as pool:
            try:
                row = pool.submit(compile_one, tasks[i]).result()
            except BrokenProcessPool:
                row = _failed(tasks[i], "the compiler process crashed (abort or segfault)")
        finished(i, row)
    return results


def parse_targets(text: str) -> list[int]:
    """``"all"`` -> every capability of the card table; ``"75,80"`` or ``"sm_75,sm_80"`` -> [75, 80]."""
    from vit_fast.base.cards import CARDS, MIN_ARCH

    if text.strip().lower() == "all":
        return sorted(CARDS)
    targets = []
    for part in text.split(","):
        part = part.strip().lower().removeprefix("sm_").rstrip("a")
        if not part:
            continue
        if not part.isdigit() or int(part) < MIN_ARCH:
            raise ValueError(f"target {part!r}: give compute capabilities >= {MIN_ARCH} (e.g. 75,86,90) or 'all'")
        targets.append(int(part))
    if not targets:
        raise ValueError("no target given")
    return list(dict.fromkeys(targets))


def main(argv=None) -> int:
    if interpreter_enabled():
        sys.exit("compile_check: unset TRITON_INTERPRET: the compiled-mode autotune configs are the ones to check")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", default=",".join(ALL_KERNELS), help=f"comma list of {', '.join(ALL_KERNELS)}")
    parser.add_argument(
        "--targets",
        "--arch",
        dest="targets",
        default="90",
        help="compute capabilities, comma-separated (75,80,86,89,90,100,120), or 'all' (every row of "
        "vit_fast.base.cards.CARDS); default 90",
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiler processes")
    parser.add_argument(
        "--set",
        dest="variant_set",
        choices=VARIANT_SETS,
        default="vit-b16",
        help="vit-b16 (default): ViT-B/16's shapes at batch 1 and 8 in fp32/fp16/bf16, every config the prunes "
        "keep (the GEMMs: every kept config for ln+fc1, the heuristic's pick for the others); picks: only the "
        "no-autotune heuristic's pick (what a user gets by default) of every kernel of a ViT-S/16 and ViT-B/16 "
        "forward at batch 1, 8 and 64; sweep: more head dims, flag sets and epilogues, the digits model",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="with --set sweep: every config (kept or not) for every flag variant (slow)",
    )
    parser.add_argument(
        "--every-config-dtypes",
        default=",".join(EVERY_CONFIG_DTYPES),
        help="the vit-b16 set: dtypes whose every kept config is checked (the others: the heuristic's pick only); "
        f"default {','.join(EVERY_CONFIG_DTYPES)}",
    )
    parser.add_argument("--csv", help="write every row (one per target and variant) to this CSV file, as they finish")
    parser.add_argument("--summary-csv", help="write the per-target table to this CSV file")
    parser.add_argument("--markdown", help="write the per-target table and the flagged rows to this Markdown file")
    parser.add_argument("--filter", default="", help="keep variants whose label contains this string")
    parser.add_argument("--quiet", action="store_true", help="no per-variant table, only the per-target one")
    parser.add_argument(
        "--summarize",
        metavar="ROWS_CSV",
        help="compile nothing: rebuild the per-target table (and --markdown / --summary-csv) from a --csv file "
        "written earlier, even a partial one, re-flagged against today's card table",
    )
    args = parser.parse_args(argv)
    if args.summarize:
        rows = annotate(read_rows(args.summarize))
        summary = summarize(rows)
        print(markdown_table(summary))
        if args.summary_csv:
            write_summary_csv(args.summary_csv, summary)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(markdown_report(summary, rows, f"from {args.summarize}, {len(rows)} rows\n"))
        return 1 if any(bad(r) for r in rows) else 0

    global _every_config_dtypes
    _every_config_dtypes = tuple(d.strip() for d in args.every_config_dtypes.split(",") if d.strip())
    if any(d not in DTYPES for d in _every_config_dtypes):
        parser.error(f"--every-config-dtypes: choose from {', '.join(DTYPES)}")
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    for k in kernels:
        if k not in CASES:
            parser.error(f"unknown kernel {k!r}; choose from {', '.join(ALL_KERNELS)}")
    try:
        targets = parse_targets(args.targets)
    except ValueError as e:
        parser.error(str(e))
    import triton

    from vit_fast.base.cards import card_for_arch

    tasks = []
    for target in targets:
        mine = tasks_for(kernels, target, args.variant_set, args.full, args.filter)
        print(f"sm_{target}: {len(mine)} variants; {card_for_arch(target).describe()}", file=sys.stderr)
        print(f"  ptxas: {ptxas_for(target)}", file=sys.stderr)
        tasks += mine
    print(
        f"compiling {len(tasks)} variants for {', '.join(f'sm_{t}' for t in targets)} with {args.jobs} processes, "
        f"triton {triton.__version__}",
        file=sys.stderr,
    )
    t0 = time.perf_counter()
    sink, writer = None, None
    if args.csv:
        sink = open(args.csv, "w", newline="")  # noqa: SIM115 - closed below; rows land as they finish
        writer = csv.DictWriter(sink, fieldnames=ROW_FIELDS)
        writer.writeheader()

    def on_result(row):
        annotate([row])
        if writer is not None:
            writer.writerow(row)
            sink.flush()

    with contextlib.ExitStack() as stack:
        if sink is not None:
            stack.callback(sink.close)
        results = _run_all(tasks, args.jobs, progress=True, on_result=on_result)
    wall = time.perf_counter() - t0
    annotate(results)

    if not args.quiet and results:
        width = max(len(r["variant"]) for r in results)
        header = (
            f"{'target':<6} {'kernel':<12} {'variant':<{width}} {'H':<1} {'ok':<4} {'shared KB':>9} {'regs':>4} "
            f"{'spills':>6} {'tc':>8} {'tma':>3}  flags"
        )
        print(header)
        print("-" * len(header))
        for r in results:
            shared = f"{r['shared'] / 1024:.1f}" if r["shared"] is not None else "-"
            regs = r["regs"] if r["regs"] is not None else "-"
            spills = r["spills"] if r["spills"] is not None else "-"
            tma = {True: "yes", False: "no", None: "-"}[r["tma"]]
            note = r["flags"] + ("  (pruned by the autotuner: never runs)" if r["flags"] and r["pruned"] else "")
            print(
                f"sm_{r['target']:<3} {r['kernel']:<12} {r['variant']:<{width}} {'H' if r['heuristic'] else ' '} "
                f"{'ok' if r['ok'] else 'FAIL':<4} {shared:>9} {regs:>4} {spills:>6} {r['tc'] or '-':>8} {tma:>3}  "
                f"{note}"
            )
            if r["error"]:
                print(f"{'':<6}   error: {r['error']}")
        print()

    summary = summarize(results)
    print(markdown_table(summary))
    failed = sum(1 for r in results if not r["ok"])
    flagged = sum(1 for r in results if r["ok"] and bad(r))
    print(
        f"\n{failed} failed, {flagged} flagged and still kept by their prune (shared memory over the card's limit, "
        f"spills, tensor cores or TMA other than the card table says); triton {triton.__version__}, {wall:.0f} s"
    )
    if args.summary_csv:
        write_summary_csv(args.summary_csv, summary)
    if args.markdown:
        header = (
            f"`python tools/compile_check.py --targets {args.targets} --set {args.variant_set} "
            f"--every-config-dtypes {','.join(_every_config_dtypes)}"
            f"{' --full' if args.full else ''} --kernels {','.join(kernels)}`: triton {triton.__version__}, "
            f"{len(results)} variants, {wall:.0f} s\n"
        )
        with open(args.markdown, "w") as f:
            f.write(markdown_report(summary, results, header))
    return 1 if failed or flagged else 0


if __name__ == "__main__":
    sys.exit(main())
