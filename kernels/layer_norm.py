"""Residual add + LayerNorm in one pass over the rows (``summed = x + residual``, ``normed = LN(summed)``), and in
its ``RMS`` mode timm's RmsNorm: the block-size choice, the kernel, the launchers, the ``torch.library`` ops
(``add_layer_norm``, ``layer_norm``, ``rms_norm``) and the eager references :func:`add_layer_norm_ref` and
:func:`rms_norm_ref`. Statistics in fp32 whatever the storage dtype; design: docs/kernels.md, "LayerNorm"."""

from __future__ import annotations

import itertools

import torch
import triton
import triton.language as tl

from vit_fast.base.interpret import interpreter_enabled

from ._launch import SelfCheck, case_rows, cdiv, check_device, define_op, interpret_bf16, next_power_of_2, upcast_16bit
from ._tl import to_bf16_rtne
from .launches import SUPPORTED_DTYPES, ResolvedLaunches

# the whole row lives in registers: beyond this the single-pass kernel would spill
_MAX_BLOCK_N = 16384


def _layer_norm_configs(M: int, N: int) -> list[triton.Config]:
    """The one config for ``M`` rows of ``N`` (not autotuned): a whole row per program row. Built from
    the environment only, never a device query."""
    block_n = next_power_of_2(N)
    if interpreter_enabled():
        # every program is a Python-level loop step: few, wide programs are fastest
        block_m, num_warps = max(1, min(next_power_of_2(M), 32768 // block_n)), 1
    else:
        # a few rows per program when D is narrow, so each program moves >= 4K elements
        block_m = max(1, min(16, 4096 // block_n))
        num_warps = min(max(block_m * block_n // 256, 1), 8)
    return [triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=num_warps)]


@triton.jit
def _layer_norm_kernel(
    x_ptr,  # [M, N] input rows, unit stride along N
    residual_ptr,  # [M, N] residual added to x before the norm, read only when HAS_RESIDUAL
    w_ptr,  # [N] LayerNorm weight, read only when HAS_WEIGHT
    bias_ptr,  # [N] LayerNorm bias, read only when HAS_BIAS
    summed_ptr,  # [M, N] out: x + residual in x's dtype, written only when HAS_RESIDUAL
    normed_ptr,  # [M, N] out: LayerNorm(x + residual) in x's dtype
    M,  # number of rows (product of the leading dims)
    N,  # features per row: the normalised dim D
    stride_x_m,  # elements between rows of x
    stride_residual_m,  # elements between rows of residual
    stride_summed_m,  # elements between rows of summed
    stride_normed_m,  # elements between rows of normed
    eps,  # added to the variance; a Python float under the interpreter, so no .to() on it
    HAS_RESIDUAL: tl.constexpr,  # residual_ptr is given and summed_ptr is written
    HAS_WEIGHT: tl.constexpr,  # w_ptr is given
    HAS_BIAS: tl.constexpr,  # bias_ptr is given
    RMS: tl.constexpr,  # RmsNorm: normalise by the root mean square, no mean subtracted
    ROUND_BF16: tl.constexpr,  # round bf16 stores by hand (interpreter: its fp32 -> bf16 cast truncates)
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # next power of two >= N: a whole row per program row
):
    # int64 row offsets: M * N can pass 2**31 at large batch
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]

    x = tl.load(x_ptr + rows[:, None] * stride_x_m + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        res = tl.load(residual_ptr + rows[:, None] * stride_residual_m + cols[None, :], mask=mask, other=0.0)
        x += res.to(tl.float32)
        tl.store(
            summed_ptr + rows[:, None] * stride_summed_m + cols[None, :],
            to_bf16_rtne(x) if ROUND_BF16 else x.to(summed_ptr.dtype.element_ty),
            mask=mask,
        )

    if RMS:
        centred = x  # masked columns were loaded as 0: they add nothing to the mean square
    else:
        # two-pass statistics on the registers (not E[x^2] - E[x]^2, which cancels badly)
        mean = tl.sum(x, axis=1) / N
        centred = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(centred * centred, axis=1) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    y = centred * rstd[:, None]
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = y * w[None, :]
    if HAS_BIAS:
        b = tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = y + b[None, :]
    y = to_bf16_rtne(y) if ROUND_BF16 else y.to(normed_ptr.dtype.element_ty)
    tl.store(normed_ptr + rows[:, None] * stride_normed_m + cols[None, :], y, mask=mask)


_layer_norm_launches = ResolvedLaunches(_layer_norm_kernel)


# ---------------------------------------------------------------------------------- launchers
def _check_layer_norm_inputs(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> None:
    """Raise a clear error, before any launch, when the inputs do not fit the kernel."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor [..., D], got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError("x must have at least one dim [..., D]; got a 0-d tensor")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; add_layer_norm supports float32, float16 and bfloat16: pass x.float()")
    D = x.shape[-1]
    if D == 0:
        raise ValueError(f"x has an empty last dim (shape {tuple(x.shape)}): nothing to normalise")
    if D > _MAX_BLOCK_N:  # _MAX_BLOCK_N is a power of two: the same as next_power_of_2(D) > _MAX_BLOCK_N
        raise ValueError(f"D = {D} is too wide for the single-pass LayerNorm kernel (max {_MAX_BLOCK_N})")
    for name, t, shape in (("residual", residual, tuple(x.shape)), ("weight", weight, (D,)), ("bias", bias, (D,))):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
        if tuple(t.shape) != shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but x has shape {tuple(x.shape)}: {name} must be {shape}"
            )
        if t.dtype != x.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but x has {x.dtype}: pass {name}.to({x.dtype})")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}: put both on the same device")
    if not isinstance(eps, (float, int)) or isinstance(eps, bool) or not eps > 0:
        raise ValueError(f"eps must be a positive float, got {eps!r}")
    check_device("layer_norm", x)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as [M, D] with contiguous columns (a view whenever possible)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def launch_add_layer_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    *,
    summed_out: torch.Tensor | None = None,
    normed_out: torch.Tensor | None = None,
    rms: bool = False,
    checked: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Check the inputs, then run the kernel once (no autograd, no custom op); ``rms=True``: RmsNorm, not LayerNorm.
    Returns ``(summed, normed)``, both shaped like ``x``; ``summed`` is None when ``residual`` is. ``checked=True``
    skips the checks: only for the custom ops, whose callers (:func:`add_layer_norm`, :func:`layer_norm`) have just
    run them. ``summed_out`` / ``normed_out`` are optional contiguous output buffers (tests pass NaN-filled ones)."""
    if not checked:
        _check_layer_norm_inputs(x, residual, weight, bias, eps)
    D = x.shape[-1]
    for name, buf, needed in (("summed_out", summed_out, residual is not None), ("normed_out", normed_out, True)):
        if buf is None:
            continue
        if not needed:
            raise ValueError(f"{name} given but residual is None: there is no sum to write")
        if buf.shape != x.shape or buf.dtype != x.dtype or buf.device != x.device or not buf.is_contiguous():
            raise ValueError(f"{name} must be a contiguous {x.dtype} tensor of shape {tuple(x.shape)} on {x.device}")
    normed = normed_out if normed_out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    summed = None
    if residual is not None:
        summed = summed_out if summed_out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return summed, normed

    x2 = _rows(x)
    M = x2.shape[0]
    res2 = _rows(residual) if residual is not None else x2
    summed2 = summed.view(M, D) if summed is not None else x2
    normed2 = normed.view(M, D)
    (config,) = _layer_norm_configs(M, D)
    # unused pointers get x2: any valid tensor does, the constexpr flags keep the kernel off them
    _layer_norm_launches(
        (cdiv(M, config.kwargs["BLOCK_M"]),),
        (),
        x2,
        res2,
        weight if weight is not None else x2,
        bias if bias is not None else x2,
        summed2,
        normed2,
        M,
        D,
        x2.stride(0),
        res2.stride(0),
        summed2.stride(0),
        normed2.stride(0),
        float(eps),
        HAS_RESIDUAL=residual is not None,
        HAS_WEIGHT=weight is not None,
        HAS_BIAS=bias is not None,
        RMS=bool(rms),
        ROUND_BF16=interpret_bf16(x.dtype),
        **config.kwargs,
        num_warps=config.num_warps,
    )
    return summed, normed


def launch_layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    *,
    out: torch.Tensor | None = None,
    checked: bool = False,
) -> torch.Tensor:
    """:func:`launch_add_layer_norm` without a residual: returns ``normed``, shaped like ``x``."""
    return launch_add_layer_norm(x, None, weight, bias, eps, normed_out=out, checked=checked)[1]


def launch_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    *,
    out: torch.Tensor | None = None,
    checked: bool = False,
) -> torch.Tensor:
    """The kernel in its RmsNorm mode, no residual: returns ``rms_norm(x)``, shaped like ``x``."""
    return launch_add_layer_norm(x, None, weight, bias, eps, normed_out=out, rms=True, checked=checked)[1]


# ---------------------------------------------------------------------------------- custom ops
def _norm_inputs(d: dict, rnd, *_, residual: bool = False) -> tuple[tuple, dict]:
    res = rnd(d["batch"], d["tokens"], d["dim"]) if residual else None
    return (rnd(d["batch"], d["tokens"], d["dim"], scale=2.0), res, rnd(d["dim"]), rnd(d["dim"]), d["eps"]), {}


def _add_layer_norm_launch(d: dict, args: tuple, kwargs: dict, poisoned) -> torch.Tensor:
    shape = (d["batch"], d["tokens"], d["dim"])
    summed, normed = launch_add_layer_norm(*args, summed_out=poisoned(*shape), normed_out=poisoned(*shape))
    return torch.cat([summed, normed], dim=-1)  # both outputs judged at once


def _rows_shape(d: dict) -> str:
    return f"[{d['batch']}, {d['tokens']}, {d['dim']}]"


def _add_layer_norm_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_add_layer_norm(x, residual, weight, bias, eps, checked=True)


_add_layer_norm = define_op(
    _add_layer_norm_op,
    check=_check_layer_norm_inputs,
    empty=lambda x, *_: (x.new_empty(x.shape), x.new_empty(x.shape)),
    reference=lambda *args: add_layer_norm_ref(*args),
    selfcheck=SelfCheck(
        cases=lambda m: [("residual + norm", case_rows(m))],
        inputs=lambda d, rnd, *_: _norm_inputs(d, rnd, residual=True),
        launch=_add_layer_norm_launch,
        shape=_rows_shape,
        judged=lambda out: torch.cat(list(out), dim=-1),
    ),
)


def _check_norm(x, weight, bias, eps) -> None:
    _check_layer_norm_inputs(x, None, weight, bias, eps)


def _layer_norm_op(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    return launch_layer_norm(x, weight, bias, eps, checked=True)


_layer_norm = define_op(
    _layer_norm_op,
    check=_check_norm,
    empty=lambda x, *_: x.new_empty(x.shape),
    reference=lambda x, weight, bias, eps: add_layer_norm_ref(x, None, weight, bias, eps)[1],
    selfcheck=SelfCheck(  # the reference the check reads is add_layer_norm_ref's, residual None: (None, normed)
        cases=lambda m: [("final norm", case_rows(m))],
        inputs=_norm_inputs,
        launch=lambda d, args, _, poisoned: launch_layer_norm(
            args[0], *args[2:], out=poisoned(d["batch"], d["tokens"], d["dim"])
        ),
        shape=_rows_shape,
        judged=lambda out: out[1],
    ),
)


def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    return launch_rms_norm(x, weight, bias, eps, checked=True)


_rms_norm = define_op(
    _rms_norm_op,
    check=_check_norm,
    empty=lambda x, *_: x.new_empty(x.shape),
    reference=lambda *a: rms_norm_ref(*a),
    selfcheck=SelfCheck(  # qk-norm: each head's row of Dh, [B, T, H, Dh]
        cases=lambda m: [
            (f"qk-norm, {m['model']}", {**case_rows({**m, "dim": m["head_dim"]}), "heads": m["heads"]}),
        ],
        inputs=lambda d, rnd, *_: (
            (rnd(d["batch"], d["tokens"], d["heads"], d["dim"], scale=2.0), rnd(d["dim"]), None, d["eps"]),
            {},
        ),
        launch=lambda d, args, _, poisoned: launch_rms_norm(*args, out=poisoned(*args[0].shape)),
        shape=lambda d: f"[{d['batch']}, {d['tokens']}, {d['heads']}, {d['dim']}]",
    ),
)


def add_layer_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``summed = x + residual``; ``normed = LayerNorm(summed)`` over the last dim, in one pass. Shapes ``[..., D]``;
    ``weight`` and ``bias`` ``[D]`` or None; all in one dtype (float32, float16 or bfloat16) on one device. With
    ``residual=None``, ``summed`` is ``x`` itself (no copy). Custom ops ``vit_fast::add_layer_norm`` and
    ``vit_fast::layer_norm``; backward recomputes through ``add_layer_norm_ref`` (docs/kernels.md, section Backward)."""
    _check_layer_norm_inputs(x, residual, weight, bias, eps)
    if residual is None:
        return x, _layer_norm.op(x, weight, bias, eps)
    return _add_layer_norm.op(x, residual, weight, bias, eps)


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """LayerNorm over the last dim of ``x [..., D]``, statistics in float32 (see :func:`add_layer_norm`)."""
    return _layer_norm(x, weight, bias, eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RmsNorm over the last dim of ``x [..., D]``: ``x * rsqrt(mean(x^2) + eps) * weight (+ bias)``, one launch.
    ``weight`` / ``bias`` ``[D]`` or None (timm's ``RmsNorm`` has a weight and no bias); the mean square is taken in
    float32 and the result rounded once to x's dtype (what timm's ``RmsNormFp32`` computes; its ``RmsNorm`` rounds
    after each op in a 16-bit dtype). A custom op (``vit_fast::rms_norm``); backward recomputes via
    :func:`rms_norm_ref`."""
    return _rms_norm(x, weight, bias, eps)


# ---------------------------------------------------------------------------------- reference
def add_layer_norm_ref(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    upcast: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager PyTorch: ``x + residual`` then ``F.layer_norm``.

    With ``upcast=True`` float16 / bfloat16 are computed in float32 and cast back to ``x``'s dtype; pass
    float64 tensors to get a float64 reference.
    """
    dtype = x.dtype
    x, residual, weight, bias = upcast_16bit(upcast, x, residual, weight, bias)
    summed = x + residual if residual is not None else x
    normed = torch.nn.functional.layer_norm(summed, (x.shape[-1],), weight, bias, eps)
    return summed.to(dtype), normed.to(dtype)


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    upcast: bool = False,
) -> torch.Tensor:
    """Eager PyTorch RmsNorm as timm's ``rms_norm`` writes it: ``x * rsqrt(mean(x^2) + eps) * weight (+ bias)``.

    ``upcast=True`` computes float16 / bfloat16 in float32 and casts back to ``x``'s dtype; pass float64 tensors
    for a float64 reference.
    """
    dtype = x.dtype
    x, weight, bias = upcast_16bit(upcast, x, weight, bias)
    y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y.to(dtype)


# ---------------------------------------------------------------------------------- compile-check variants
# what tools/compile_check.py compiles of this kernel (KERNELS[name].compile_variants / .compile_launch): its
# cases (kernel, label, params, which configs) per variant set, and one launch per case recorded through v.record;
# ``v`` is the tool's vocabulary (DTYPES, PICK_MODELS, PICK_BATCHES, EVERY_CONFIG_DTYPES, which, empty, torch_dtype)
def compile_variants(v, variant_set: str, full: bool) -> list[tuple]:
    cases = []
    if variant_set == "vit-b16":
        # the final norm (no residual) and the unfused add + LayerNorm, D 768, batch 1 and 8
        grid = itertools.product(v.DTYPES, (768,), (1, 8), (False, True), (True,), (True,))
    elif variant_set == "picks":
        grid = itertools.product(
            v.DTYPES, [D for _, D, _ in v.PICK_MODELS], v.PICK_BATCHES, (False, True), (True,), (True,)
        )
    else:
        grid = itertools.product(v.DTYPES, (64, 768, 1024, 1280), (8,), (False, True), (False, True), (False, True))
    for dtype, D, b, res, weight, bias in grid:
        label = f"{dtype} D{D} b{b} | res={int(res)} weight={int(weight)} bias={int(bias)}"
        params = {"dtype": dtype, "D": D, "M": 197 * b, "res": res, "weight": weight, "bias": bias}
        cases.append(("layer_norm", label, params, "pick"))
    if variant_set == "sweep":
        # the RMS mode (timm's RmsNorm: a weight, no bias, no residual): the xp ViTs' widths, and qk-norm over
        # head dims 64 and 80 (rows: tokens x heads)
        for dtype, D in itertools.product(v.DTYPES, (64, 80, 768, 1024, 1280)):
            params = {"dtype": dtype, "D": D, "M": 197 * 8, "res": False, "weight": True, "bias": False, "rms": True}
            cases.append(("layer_norm", f"{dtype} D{D} b8 | rms weight=1", params, "pick"))
    return cases


def compile_launch(v, params: dict) -> tuple:
    M, D, dtype = params["M"], params["D"], params["dtype"]
    # the launcher picks the compiled-mode block sizes and warps itself (TRITON_INTERPRET unset)
    return v.record(
        launch_add_layer_norm,
        v.empty((M, D), dtype),
        v.empty((M, D), dtype) if params["res"] else None,
        v.empty((D,), dtype) if params["weight"] else None,
        v.empty((D,), dtype) if params["bias"] else None,
        1e-6,
        rms=params.get("rms", False),
    )


__all__ = [
    "add_layer_norm",
    "add_layer_norm_ref",
    "launch_add_layer_norm",
    "launch_layer_norm",
    "launch_rms_norm",
    "layer_norm",
    "rms_norm",
    "rms_norm_ref",
]
