"""GEMM with fused epilogues: ``y = act(x @ W^T + b)``, then ``residual + gamma * y``, and with a LayerNorm or
RmsNorm prologue (:func:`layer_norm_linear`, :func:`rms_norm_linear`): every linear layer of a ViT block. The kernel,
the launcher :func:`launch_linear`, the ``torch.library`` ops and the eager references; the tiles in
:mod:`.linear_tiles`, the input checks in :mod:`.linear_checks`. Design: docs/kernels.md, "The GEMM"."""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from vit_fast.base.cards import tensor_arch, tensor_sm_count

from ._launch import (
    SelfCheck,
    case_rows,
    cdiv,
    define_op,
    dot_in_fp32,
    ensure_scratch_allocator,
    interpret_bf16,
    upcast_16bit,
)
from .activations import activation_ref
from .autotune import SMALL_M, autotune_cache_enabled, m_class, persistent_programs, tma_usable, tune_key
from .launches import ResolvedLaunches
from .layer_norm import add_layer_norm_ref, rms_norm_ref
from .linear_checks import check_input_norm, check_linear_inputs
from .linear_tiles import (
    ACTIVATION_CODES,
    ACTIVATIONS,
    gate_code,
    linear_configs,
    linear_tile,
    prune_linear_configs,
)


@triton.autotune(
    configs=linear_configs(),
    key=[
        # everything prune_linear_configs reads (the autotuner adds the tensors' dtypes itself)
        *("M_CLASS", "N", "K", "ARCH", "TMA_OK", "TUNE", "SM_COUNT"),
        # every constexpr the configs do not set: each prologue / epilogue is code of its own, with its own register
        # pressure and best tile, so each gets its own tuning, in memory and on disk (tests/kernels/test_autotune_mode.py)
        *("ACTIVATION", "GATE", "HAS_BIAS", "HAS_RESIDUAL", "HAS_GAMMA", "NORM_INPUT", "LN_HAS_WEIGHT", "LN_HAS_BIAS"),
        *("LN_RMS", "DOT_IN_FP32", "ROUND_BF16"),
    ],
    prune_configs_by={"early_config_prune": prune_linear_configs},
    cache_results=autotune_cache_enabled(),
)
@triton.jit(do_not_specialize=["M_CLASS", "ARCH", "TMA_OK", "TUNE", "SM_COUNT"])  # key-only: never specialised
def _linear_kernel(
    x_ptr,  # [M, K] activations; unit stride along K
    w_ptr,  # [N, K] weight in nn.Linear layout ([2N, K], two halves stacked, when GATE); unit stride along K
    bias_ptr,  # [N] bias ([2N] when GATE), read only when HAS_BIAS
    residual_ptr,  # [M, N] residual stream, read only when HAS_RESIDUAL; unit stride along N
    gamma_ptr,  # [N] LayerScale, read only when HAS_GAMMA
    ln_w_ptr,  # [K] LayerNorm weight of the input, read only when NORM_INPUT and LN_HAS_WEIGHT
    ln_b_ptr,  # [K] LayerNorm bias of the input, read only when NORM_INPUT and LN_HAS_BIAS
    out_ptr,  # [M, N] output, unit stride along N
    M,  # rows: all leading dims of x flattened (B * T: rarely a multiple of the tile)
    N,  # output features
    K,  # input features
    stride_x_m,  # elements between rows of x (TMA: a multiple of 16 bytes)
    stride_w_n,  # elements between rows of w (TMA: a multiple of 16 bytes)
    stride_residual_m,  # elements between rows of residual
    stride_out_m,  # elements between rows of out
    M_CLASS,  # autotune.m_class(M), never read: the autotune key, so a new batch size reuses its class's tuning
    ARCH,  # compute capability of the tensors' device (cards.tensor_arch), never read: the prune's card
    TMA_OK,  # 1 if a persistent TMA config may run here (many rows, 16-bit, TMA-readable operands), never read
    TUNE,  # autotune.tune_key(): 1 while tuning, never read: a heuristic pick never answers a tuned request
    SM_COUNT,  # SMs of the tensors' device (cards.tensor_sm_count), never read: the programs the heuristic fills
    ln_eps,  # LayerNorm epsilon, read only when NORM_INPUT (a Python float under the interpreter: no .to())
    ACTIVATION: tl.constexpr,  # 0: none, 1: exact (erf) GELU, 2: tanh GELU, 3: QuickGELU, 4: SiLU
    GATE: tl.constexpr,  # 0: plain; 1: out = act(x @ w[:N]^T) * (x @ w[N:]^T) (SwiGLU); 2: the act on the second
    HAS_BIAS: tl.constexpr,  # add bias before the activation
    HAS_RESIDUAL: tl.constexpr,  # out = residual + (gamma *) y
    HAS_GAMMA: tl.constexpr,  # scale y by gamma before the residual add
    NORM_INPUT: tl.constexpr,  # LayerNorm the rows of x first (prologue): the op is linear(LN(x))
    LN_HAS_WEIGHT: tl.constexpr,  # the LayerNorm has a weight (elementwise affine)
    LN_HAS_BIAS: tl.constexpr,  # the LayerNorm has a bias
    LN_RMS: tl.constexpr,  # the input norm is RmsNorm: no mean subtracted, normalised by the root mean square
    DOT_IN_FP32: tl.constexpr,  # dot operands as fp32 at IEEE precision (fp32, or bf16 under the interpreter)
    ROUND_BF16: tl.constexpr,  # round the bf16 store by hand (interpreter: its fp32 -> bf16 cast truncates)
    BLOCK_M: tl.constexpr,  # rows of the output tile
    BLOCK_N: tl.constexpr,  # columns of the output tile
    BLOCK_K: tl.constexpr,  # depth of one step along K
    GROUP_M: tl.constexpr,  # output-tile rows walked together, so a weight tile is reused from L2
    TMA: tl.constexpr,  # 1: persistent (each program walks tiles, grid <= SMs), x and w tiles loaded by TMA
):
    if TMA:
        # device-side descriptors (Triton keeps them in scratch memory: _launch.ensure_scratch_allocator); they
        # need 16-byte aligned bases and row strides, which prune_linear_configs checked
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[stride_x_m, 1], block_shape=[BLOCK_M, BLOCK_K])
        w_rows = 2 * N if GATE else N
        w_desc = tl.make_tensor_descriptor(
            w_ptr, shape=[w_rows, K], strides=[stride_w_n, 1], block_shape=[BLOCK_N, BLOCK_K]
        )
        num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
        for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0)):
            linear_tile(
                tile, x_desc, w_desc, x_ptr, w_ptr, bias_ptr, residual_ptr, gamma_ptr, ln_w_ptr, ln_b_ptr, out_ptr,
                M, N, K, stride_x_m, stride_w_n, stride_residual_m, stride_out_m, ln_eps,
                ACTIVATION, GATE, HAS_BIAS, HAS_RESIDUAL, HAS_GAMMA, NORM_INPUT, LN_HAS_WEIGHT, LN_HAS_BIAS, LN_RMS,
                DOT_IN_FP32, ROUND_BF16, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, True,
            )  # fmt: skip
    else:
        linear_tile(
            tl.program_id(0), None, None, x_ptr, w_ptr, bias_ptr, residual_ptr, gamma_ptr, ln_w_ptr, ln_b_ptr, out_ptr,
            M, N, K, stride_x_m, stride_w_n, stride_residual_m, stride_out_m, ln_eps,
            ACTIVATION, GATE, HAS_BIAS, HAS_RESIDUAL, HAS_GAMMA, NORM_INPUT, LN_HAS_WEIGHT, LN_HAS_BIAS, LN_RMS,
            DOT_IN_FP32, ROUND_BF16, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, False,
        )  # fmt: skip


_linear_launches = ResolvedLaunches(_linear_kernel)


# ---------------------------------------------------------------------------------- launcher
def launch_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    gamma: torch.Tensor | None = None,
    *,
    ln_weight: torch.Tensor | None = None,
    ln_bias: torch.Tensor | None = None,
    ln_eps: float | None = None,
    ln_rms: bool = False,
    out: torch.Tensor | None = None,
    checked: bool = False,
) -> torch.Tensor:
    """Check the inputs, then run the kernel once (no autograd, no custom op); returns ``[..., N]``. With ``ln_eps``
    given, the rows of ``x`` are LayerNormed first inside the kernel (``ln_weight`` / ``ln_bias`` ``[K]`` or None),
    with ``ln_rms=True`` as well RmsNormed instead. ``checked=True`` skips the checks: only for the custom op, whose
    one caller (:func:`linear`) has just run them. ``out``, if given, must be a contiguous ``[..., N]`` tensor in x's
    dtype and device (tests pass a NaN-filled one so an element the kernel leaves unwritten is caught)."""
    if not checked:
        check_linear_inputs(x, weight, bias, activation, residual, gamma)
        if ln_eps is not None:
            check_input_norm(x, ln_weight, ln_bias, ln_eps)
    gate = gate_code(activation)
    n_out, k_in = weight.shape
    n_out = n_out // 2 if gate else n_out
    out_shape = (*x.shape[:-1], n_out)
    if out is None:
        out = torch.empty(out_shape, dtype=x.dtype, device=x.device)
    elif tuple(out.shape) != out_shape or out.dtype != x.dtype or out.device != x.device or not out.is_contiguous():
        raise ValueError(
            f"linear: out must be a contiguous {out_shape} {x.dtype} tensor on {x.device}, "
            f"got {tuple(out.shape)} {out.dtype} on {out.device} (contiguous={out.is_contiguous()})"
        )
    rows = out.numel() // n_out
    if rows == 0:
        return out
    # flattening the leading dims is free for the usual [B, T, K] (a view); odd strides copy once
    x2d = x.reshape(rows, k_in)
    residual2d = residual.reshape(rows, n_out) if residual is not None else None

    def grid(meta):
        tiles = cdiv(rows, meta["BLOCK_M"]) * cdiv(n_out, meta["BLOCK_N"])
        return (min(tiles, persistent_programs(x.device)) if meta["TMA"] else tiles,)

    # whether a persistent TMA config may run (the prune's rule; few rows and fp32 never ask for the alignment)
    tma_ok = rows > SMALL_M and x.element_size() == 2 and tma_usable((x2d, x2d.stride(0)), (weight, weight.stride(0)))
    if tma_ok:  # its descriptors live in Triton's scratch memory, which needs an allocator in this thread
        ensure_scratch_allocator()
    _linear_launches(
        grid,
        (),
        x2d,
        weight,
        bias if bias is not None else x2d,  # never read: HAS_BIAS is False
        residual2d if residual2d is not None else x2d,  # never read: HAS_RESIDUAL is False
        gamma if gamma is not None else x2d,  # never read: HAS_GAMMA is False
        ln_weight if ln_weight is not None else x2d,  # never read: LN_HAS_WEIGHT is False
        ln_bias if ln_bias is not None else x2d,  # never read: LN_HAS_BIAS is False
        out,
        rows,
        n_out,
        k_in,
        x2d.stride(0),
        weight.stride(0),
        residual2d.stride(0) if residual2d is not None else 0,
        n_out,
        m_class(rows),
        tensor_arch(x),
        int(tma_ok),
        tune_key(),
        tensor_sm_count(x),
        float(ln_eps) if ln_eps is not None else 0.0,
        ACTIVATION=ACTIVATION_CODES[activation],
        GATE=gate,
        HAS_BIAS=bias is not None,
        HAS_RESIDUAL=residual is not None,
        HAS_GAMMA=gamma is not None,
        NORM_INPUT=ln_eps is not None,
        LN_HAS_WEIGHT=ln_weight is not None,
        LN_HAS_BIAS=ln_bias is not None,
        LN_RMS=bool(ln_rms),
        DOT_IN_FP32=dot_in_fp32(x.dtype),
        ROUND_BF16=interpret_bf16(x.dtype),
    )
    return out


# ---------------------------------------------------------------------------------- custom ops
def _gemm_output(x: torch.Tensor, weight: torch.Tensor, activation: str | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0] // 2 if gate_code(activation) else weight.shape[0]))


def _gemm_inputs(d: dict, rnd, norm: str | None) -> tuple[tuple, dict]:
    """A self-check's GEMM inputs: x [B, T, K], weight [N, K], bias [N] unless ``bias`` is False; a norm's weight
    (and bias: LayerNorm) [K] before them, or a residual [B, T, N] and LayerScale gamma [N] after them."""
    B, T, K, N = d["batch"], d["tokens"], d["k_in"], d["n_out"]
    x, weight = rnd(B, T, K), rnd(N, K, scale=K**-0.5)
    bias = rnd(N) if d.get("bias", True) else None
    if norm is not None:  # timm's RmsNorm: a weight, no bias
        return (x, rnd(K), rnd(K) if norm == "layer" else None, d["eps"], weight, bias, d.get("act")), {}
    residual = rnd(B, T, N, scale=2.0) if d.get("residual") else None
    return (x, weight, bias, d.get("act"), residual, rnd(N) if d.get("gamma") else None), {}


def _block_gemms(m: dict, norm: str | None) -> list[tuple[str, dict]]:
    """A ViT block's GEMMs of this kind: qkv and fc1 behind their LayerNorm, proj and fc2 with their residual (and
    LayerScale); the RmsNorm ones of a ParallelScalingBlock model (no qkv bias)."""
    if norm == "rms":
        dim = m["heads"] * m["head_dim"]
        gemm = dict(batch=m["batch"], tokens=m["tokens"], dim=dim, eps=m["eps"], k_in=dim)
        hidden = int(round(dim * m["mlp_ratio"]))
        fc1, qkv = dict(n_out=hidden, act="gelu"), dict(n_out=3 * dim, bias=False)
        return [(f"fc1, {m['model']}", {**gemm, **fc1}), (f"qkv, {m['model']}", {**gemm, **qkv})]
    rows, dim = case_rows(m), m["dim"]
    if norm == "layer":
        qkv, fc1 = dict(n_out=3 * dim, bias=m["qkv_bias"]), dict(n_out=m["hidden"], act=m["act"])
        return [("qkv", {**rows, "k_in": dim, **qkv}), ("fc1", {**rows, "k_in": dim, **fc1})]
    ends = dict(n_out=dim, residual=True, gamma=m["gamma"])
    return [("proj", {**rows, "k_in": dim, **ends}), ("fc2", {**rows, "k_in": m["hidden"], **ends})]


def _gemm_selfcheck(norm: str | None) -> SelfCheck:
    def launch(d: dict, args: tuple, kwargs: dict, poisoned) -> torch.Tensor:
        if norm is None:
            return launch_linear(*args, out=poisoned(d["batch"], d["tokens"], args[1].shape[0]))
        x, norm_weight, norm_bias, eps, weight, bias, act = args
        out = poisoned(d["batch"], d["tokens"], weight.shape[0])
        rms = norm == "rms"
        return launch_linear(x, weight, bias, act, ln_weight=norm_weight, ln_bias=norm_bias, ln_eps=eps, ln_rms=rms,
                             out=out)  # fmt: skip

    return SelfCheck(
        cases=lambda m: _block_gemms(m, norm),
        inputs=lambda d, rnd, *_: _gemm_inputs(d, rnd, norm),
        launch=launch,
        shape=lambda d: f"[{d['batch']}, {d['tokens']}, {d['k_in']}] -> [{d['batch']}, {d['tokens']}, {d['n_out']}]",
    )


def _linear_op(*args) -> torch.Tensor:
    return launch_linear(*args, checked=True)


# the schema torch.library reads: the checks' typed arguments, as the op takes them
_linear_op.__signature__ = inspect.signature(check_linear_inputs).replace(return_annotation="torch.Tensor")


_linear = define_op(
    _linear_op,
    check=check_linear_inputs,
    empty=lambda x, weight, _b, activation, *_: _gemm_output(x, weight, activation),
    reference=lambda x, weight, bias, activation, residual, gamma: linear_ref(
        x, weight, bias, activation, residual, gamma, upcast=True
    ),
    selfcheck=_gemm_selfcheck(None),
)


def _normed_checks(op: str):
    """The input checks of the GEMM with a norm prologue, in its ops' argument order."""

    def check(x, norm_weight, norm_bias, norm_eps, weight, bias, activation) -> None:
        check_linear_inputs(x, weight, bias, activation, None, None)
        check_input_norm(x, norm_weight, norm_bias, norm_eps, op)

    return check


def _layer_norm_linear_op(
    x: torch.Tensor,
    ln_weight: torch.Tensor | None,
    ln_bias: torch.Tensor | None,
    ln_eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
) -> torch.Tensor:
    return launch_linear(x, weight, bias, activation, ln_weight=ln_weight, ln_bias=ln_bias, ln_eps=ln_eps, checked=True)


_layer_norm_linear = define_op(
    _layer_norm_linear_op,
    check=_normed_checks("layer_norm_linear"),
    empty=lambda x, _w, _b, _eps, weight, _bias, activation: _gemm_output(x, weight, activation),
    reference=lambda *args: layer_norm_linear_ref(*args, upcast=True),
    selfcheck=_gemm_selfcheck("layer"),
)


def _rms_norm_linear_op(
    x: torch.Tensor,
    norm_weight: torch.Tensor | None,
    norm_bias: torch.Tensor | None,
    norm_eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
) -> torch.Tensor:
    return launch_linear(
        x, weight, bias, activation, ln_weight=norm_weight, ln_bias=norm_bias, ln_eps=norm_eps, ln_rms=True,
        checked=True,
    )  # fmt: skip


_rms_norm_linear = define_op(
    _rms_norm_linear_op,
    check=_normed_checks("rms_norm_linear"),
    empty=lambda x, _w, _b, _eps, weight, _bias, activation: _gemm_output(x, weight, activation),
    reference=lambda *args: rms_norm_linear_ref(*args, upcast=True),
    selfcheck=_gemm_selfcheck("rms"),
)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    gamma: torch.Tensor | None = None,
) -> torch.Tensor:
    """``act(x @ weight^T + bias)``, then ``residual + gamma * that`` when residual is given; returns ``[..., N]`` in
    x's dtype (fp32 accumulation and epilogue, one rounding). ``x [..., K]`` float16 / bfloat16 / float32 and
    ``weight [N, K]`` (nn.Linear layout, x's dtype and device), both unit stride along K; ``bias [N]``,
    ``residual [..., N]`` (added after the activation), ``gamma [N]`` (LayerScale, only with ``residual``) or None.
    ``activation``: one of ``ACTIVATIONS``, plain or gated (``"silu_glu"``: weight ``[2N, K]``, ``silu(x1) * x2``)."""
    return _linear(x, weight, bias, activation, residual, gamma)


def layer_norm_linear(
    x: torch.Tensor,
    ln_weight: torch.Tensor | None,
    ln_bias: torch.Tensor | None,
    ln_eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """``act(LayerNorm(x) @ weight^T + bias)`` in one launch: the GEMM takes each row's LayerNorm statistics (fp32,
    two passes) and normalises the tiles it feeds the dot; ``LayerNorm(x)`` is rounded to x's dtype before the dot,
    as the unfused ``layer_norm`` then ``linear`` would store it. ``x [..., K]``; ``ln_weight`` / ``ln_bias`` ``[K]``
    or None; ``ln_eps > 0``; the rest as in :func:`linear` (no residual: in a ViT block the LayerNormed GEMMs are qkv
    and fc1). A custom op; backward recomputes through :func:`layer_norm_linear_ref` in fp32."""
    return _layer_norm_linear(x, ln_weight, ln_bias, ln_eps, weight, bias, activation)


def rms_norm_linear(
    x: torch.Tensor,
    norm_weight: torch.Tensor | None,
    norm_bias: torch.Tensor | None,
    norm_eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
) -> torch.Tensor:
    """``act(RmsNorm(x) @ weight^T + bias)`` in one launch, as :func:`layer_norm_linear` with the prologue in its RMS
    mode: each row's mean square in fp32 over all of K, no mean subtracted, ``RmsNorm(x)`` rounded to x's dtype
    before the dot. ``norm_weight`` / ``norm_bias`` ``[K]`` or None (timm's RmsNorm: a weight, no bias). A custom op
    (``vit_fast::rms_norm_linear``); backward recomputes through :func:`rms_norm_linear_ref` in fp32."""
    return _rms_norm_linear(x, norm_weight, norm_bias, norm_eps, weight, bias, activation)


# ---------------------------------------------------------------------------------- reference
def rms_norm_linear_ref(
    x: torch.Tensor,
    norm_weight: torch.Tensor | None,
    norm_bias: torch.Tensor | None,
    norm_eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    upcast: bool = False,
) -> torch.Tensor:
    """Eager RmsNorm (:func:`.layer_norm.rms_norm_ref`, timm's ``rms_norm``) then :func:`linear_ref`; ``upcast`` as
    there."""
    h = rms_norm_ref(x, norm_weight, norm_bias, norm_eps, upcast=upcast)
    return linear_ref(h, weight, bias, activation, upcast=upcast)


def layer_norm_linear_ref(
    x: torch.Tensor,
    ln_weight: torch.Tensor | None,
    ln_bias: torch.Tensor | None,
    ln_eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    upcast: bool = False,
) -> torch.Tensor:
    """Eager ``F.layer_norm`` (:func:`.layer_norm.add_layer_norm_ref` without a residual) then :func:`linear_ref`
    (timm's ``mlp(norm2(x))``); ``upcast`` as there."""
    h = add_layer_norm_ref(x, None, ln_weight, ln_bias, ln_eps, upcast=upcast)[1]
    return linear_ref(h, weight, bias, activation, upcast=upcast)


def linear_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    gamma: torch.Tensor | None = None,
    upcast: bool = False,
) -> torch.Tensor:
    """Eager ``linear``, written as timm's block computes it (``x + ls(mlp(...))``). ``upcast=False`` computes in the
    inputs' dtype, rounding after every op as eager PyTorch does (the error a kernel is judged against);
    ``upcast=True`` computes float16 / bfloat16 inputs in float32 and casts the result back; float32 and float64
    inputs are computed as they are. For a float64 reference, pass float64 inputs."""
    dtype = x.dtype
    x, weight, bias, residual, gamma = upcast_16bit(upcast, x, weight, bias, residual, gamma)
    if activation not in ACTIVATIONS:
        raise ValueError(f"linear_ref: activation must be one of {ACTIVATIONS}, got {activation!r}")
    y = activation_ref(activation, F.linear(x, weight, bias))
    if residual is not None:
        y = residual + (y * gamma if gamma is not None else y)
    return y.to(dtype)


__all__ = [
    "linear",
    "linear_ref",
    "layer_norm_linear",
    "layer_norm_linear_ref",
    "rms_norm_linear",
    "rms_norm_linear_ref",
    "launch_linear",
    "activation_ref",
    "ACTIVATIONS",
]
