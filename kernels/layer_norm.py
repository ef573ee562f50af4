"""Residual add + LayerNorm in one pass over the rows: ``summed = x + residual``, ``normed = LN(summed)``.

Read top to bottom: the Triton kernel, the launcher (input checks, reshape, allocate, grid), the
``torch.library`` custom ops with their fake implementations and autograd, then the eager
reference :func:`add_layer_norm_ref`.

Statistics (mean, variance) are taken in float32 on the float32 sum, whatever the storage dtype;
``summed`` is stored in the input dtype. Backward is not a kernel: it recomputes the forward
through the eager reference with autograd on (see ``_backward``), which is exact but costs an
eager forward + backward; training through this op is for correctness, not speed.

Importing this module never touches a GPU driver.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vit_fast.kernels._common import check_device, interpret_bf16, interpreter_enabled, to_bf16_rtne

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# the whole row lives in registers: beyond this the single-pass kernel would spill
_MAX_BLOCK_N = 16384


@triton.jit
def _add_layer_norm_fwd_kernel(
    X,  # [M, N] input rows, last dim contiguous
    RES,  # [M, N] residual added to X before the norm (read only if HAS_RESIDUAL)
    W,  # [N] LayerNorm weight (read only if HAS_WEIGHT)
    B,  # [N] LayerNorm bias (read only if HAS_BIAS)
    SUMMED,  # [M, N] out: X + RES in X's dtype (written only if HAS_RESIDUAL)
    NORMED,  # [M, N] out: LayerNorm(X + RES) in X's dtype
    stride_x,  # elements between rows of X
    stride_res,  # elements between rows of RES
    stride_summed,  # elements between rows of SUMMED
    stride_normed,  # elements between rows of NORMED
    M,  # number of rows (product of the leading dims)
    N,  # features per row: the normalised dim D
    eps,  # added to the variance; a Python float under the interpreter, so no .to() on it
    BLOCK_M: tl.constexpr,  # rows per program
    BLOCK_N: tl.constexpr,  # next power of two >= N: a whole row per program row
    HAS_RESIDUAL: tl.constexpr,  # RES is given and SUMMED is written
    HAS_WEIGHT: tl.constexpr,  # W is given
    HAS_BIAS: tl.constexpr,  # B is given
    ROUND_BF16: tl.constexpr,  # round bf16 stores by hand (interpreter: its fp32 -> bf16 cast truncates)
):
    # int64 row offsets: M * N can pass 2**31 at large batch
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]

    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        res = tl.load(RES + rows[:, None] * stride_res + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        x += res
        tl.store(
            SUMMED + rows[:, None] * stride_summed + cols[None, :],
            to_bf16_rtne(x) if ROUND_BF16 else x.to(SUMMED.dtype.element_ty),
            mask=mask,
        )

    # two-pass statistics on the registers (not E[x^2] - E[x]^2, which cancels badly)
    mean = tl.sum(x, axis=1) / N
    centred = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(centred * centred, axis=1) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    y = centred * rstd[:, None]
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = y * w[None, :]
    if HAS_BIAS:
        b = tl.load(B + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = y + b[None, :]
    y = to_bf16_rtne(y) if ROUND_BF16 else y.to(NORMED.dtype.element_ty)
    tl.store(NORMED + rows[:, None] * stride_normed + cols[None, :], y, mask=mask)


# ---------------------------------------------------------------------------------------- launcher
def _check_layer_norm_inputs(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    device_check: bool = True,
) -> None:
    """Raise a clear error, before any launch, when the inputs do not fit the kernel."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor [..., D], got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError("x must have at least one dim [..., D]; got a 0-d tensor")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; add_layer_norm supports float32, float16 and bfloat16: pass x.float()")
    D = x.shape[-1]
    if D == 0:
        raise ValueError(f"x has an empty last dim (shape {tuple(x.shape)}): nothing to normalise")
    if triton.next_power_of_2(D) > _MAX_BLOCK_N:
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
    if device_check:
        check_device("layer_norm", x)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as [M, D] with contiguous columns (a view whenever possible)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _blocks(M: int, N: int) -> tuple[int, int, int]:
    block_n = triton.next_power_of_2(N)
    if interpreter_enabled():
        # every program is a Python-level loop step: few, wide programs are fastest
        block_m = max(1, min(triton.next_power_of_2(M), 32768 // block_n))
        return block_m, block_n, 1
    # a few rows per program when D is narrow, so each program moves >= 4K elements
    block_m = max(1, min(16, 4096 // block_n))
    num_warps = min(max(block_m * block_n // 256, 1), 8)
    return block_m, block_n, num_warps


def add_layer_norm_fwd(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    *,
    summed_out: torch.Tensor | None = None,
    normed_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The launcher: check, reshape to rows, allocate (or fill the given buffers), launch.

    Returns ``(summed, normed)``, both shaped like ``x``; ``summed`` is None when ``residual`` is.
    ``summed_out`` / ``normed_out`` are optional contiguous output buffers (tests pass NaN-filled ones).
    """
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
    block_m, block_n, num_warps = _blocks(M, D)
    # unused pointers get x2: any valid tensor does, the constexpr flags keep the kernel off them
    _add_layer_norm_fwd_kernel[(triton.cdiv(M, block_m),)](
        x2,
        res2,
        weight if weight is not None else x2,
        bias if bias is not None else x2,
        summed2,
        normed2,
        x2.stride(0),
        res2.stride(0),
        summed2.stride(0),
        normed2.stride(0),
        M,
        D,
        float(eps),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        HAS_RESIDUAL=residual is not None,
        HAS_WEIGHT=weight is not None,
        HAS_BIAS=bias is not None,
        ROUND_BF16=interpret_bf16(x.dtype),
        num_warps=num_warps,
    )
    return summed, normed


# ---------------------------------------------------------------------------------- custom ops
@torch.library.custom_op("vit_fast::add_layer_norm", mutates_args=())
def _add_layer_norm_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    summed, normed = add_layer_norm_fwd(x, residual, weight, bias, eps)
    return summed, normed


@_add_layer_norm_op.register_fake
def _(x, residual, weight, bias, eps):
    _check_layer_norm_inputs(x, residual, weight, bias, eps, device_check=False)
    return x.new_empty(x.shape), x.new_empty(x.shape)


@torch.library.custom_op("vit_fast::layer_norm", mutates_args=())
def _layer_norm_op(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    return add_layer_norm_fwd(x, None, weight, bias, eps)[1]


@_layer_norm_op.register_fake
def _(x, weight, bias, eps):
    _check_layer_norm_inputs(x, None, weight, bias, eps, device_check=False)
    return x.new_empty(x.shape)


def _setup_context(ctx, inputs, output) -> None:
    *tensors, eps = inputs
    ctx.has_residual = len(tensors) == 4
    ctx.eps = eps
    ctx.save_for_backward(*tensors)


def _backward(ctx, *grads):
    """Recompute the forward through the eager reference, autograd on, and differentiate that.

    Exact (it is eager's own backward, in the inputs' dtype) but not fused: one eager forward
    and backward per call.
    """
    tensors = ctx.saved_tensors
    if not ctx.has_residual:
        tensors = (tensors[0], None, *tensors[1:])
    leaves = [
        t.detach().requires_grad_(need) if t is not None else None for t, need in zip(tensors, _needs(ctx), strict=True)
    ]
    with torch.enable_grad():
        summed, normed = add_layer_norm_ref(*leaves, ctx.eps)
        outs, out_grads = [], []
        for out, g in zip((summed, normed) if ctx.has_residual else (normed,), grads, strict=True):
            if g is not None and out.requires_grad:
                outs.append(out)
                out_grads.append(g)
        wanted = [t for t in leaves if t is not None and t.requires_grad]
        got = iter(torch.autograd.grad(outs, wanted, out_grads, allow_unused=True) if wanted and outs else ())
    result = [next(got) if t is not None and t.requires_grad else None for t in leaves]
    if not ctx.has_residual:
        del result[1]
    return (*result, None)


def _needs(ctx) -> list[bool]:
    needs = list(ctx.needs_input_grad[:-1])
    return needs if ctx.has_residual else [needs[0], False, *needs[1:]]


_add_layer_norm_op.register_autograd(_backward, setup_context=_setup_context)
_layer_norm_op.register_autograd(_backward, setup_context=_setup_context)


def _require_tensors(**named) -> None:
    # the dispatcher's own message for a non-tensor argument says nothing about the fix
    for name, t in named.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor{' or None' if name != 'x' else ''}, got {type(t).__name__}")


def add_layer_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``summed = x + residual``; ``normed = LayerNorm(summed)`` over the last dim, in one pass.

    Shapes ``[..., D]``; ``weight`` and ``bias`` ``[D]`` or None; all in one dtype (float32,
    float16 or bfloat16) on one device. With ``residual=None``, ``summed`` is ``x`` itself (no copy).
    """
    _require_tensors(x=x, residual=residual, weight=weight, bias=bias)
    if residual is None:
        return x, torch.ops.vit_fast.layer_norm(x, weight, bias, eps)
    return torch.ops.vit_fast.add_layer_norm(x, residual, weight, bias, eps)


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """LayerNorm over the last dim of ``x [..., D]``, statistics in float32."""
    _require_tensors(x=x, weight=weight, bias=bias)
    return torch.ops.vit_fast.layer_norm(x, weight, bias, eps)


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

    With ``upcast=True`` everything is computed in float32 and cast back to ``x``'s dtype; pass
    float64 tensors to get a float64 reference.
    """
    dtype = x.dtype
    if upcast:
        x = x.float()
        residual = residual.float() if residual is not None else None
        weight = weight.float() if weight is not None else None
        bias = bias.float() if bias is not None else None
    summed = x + residual if residual is not None else x
    normed = torch.nn.functional.layer_norm(summed, (x.shape[-1],), weight, bias, eps)
    return summed.to(dtype), normed.to(dtype)


__all__ = ["add_layer_norm", "layer_norm", "add_layer_norm_fwd", "add_layer_norm_ref"]
