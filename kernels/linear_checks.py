"""The GEMM's input checks, run before any launch: :func:`check_linear_inputs` for every op of :mod:`.linear`,
:func:`check_input_norm` for the norm prologue of ``layer_norm_linear`` and ``rms_norm_linear``."""

from __future__ import annotations

import torch

from ._launch import check_device
from .activations import ACTIVATIONS, gate_code
from .launches import SUPPORTED_DTYPES


def check_linear_inputs(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    residual: torch.Tensor | None,
    gamma: torch.Tensor | None,
) -> None:
    """Raise a clear error, before any launch, when the inputs do not fit the kernel."""
    for name, tensor in (("x", x), ("weight", weight)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"linear: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"linear: x dtype {x.dtype} is not supported; use float16, bfloat16 or float32 (e.g. x.to(torch.float16))"
        )
    if x.dim() < 1:
        raise ValueError("linear: x must have at least one dim [..., K], got a scalar")
    if weight.dim() != 2:
        raise ValueError(
            f"linear: weight must be 2-D [N, K] (nn.Linear layout: out_features x in_features), "
            f"got shape {tuple(weight.shape)}"
        )
    n_out, k_in = weight.shape
    if x.shape[-1] != k_in:
        raise ValueError(
            f"linear: x's last dim {x.shape[-1]} != weight's in_features {k_in} (weight is {tuple(weight.shape)}); "
            "weight must be [out_features, in_features] as in nn.Linear (not transposed)"
        )
    if k_in == 0 or n_out == 0:
        raise ValueError(f"linear: weight {tuple(weight.shape)} has an empty dim")
    if activation not in ACTIVATIONS:
        raise ValueError(f"linear: activation must be one of {ACTIVATIONS}, got {activation!r}")
    stacked = n_out
    if gate_code(activation):
        if n_out % 2:
            raise ValueError(
                f"linear: a gated activation ({activation!r}) needs the two halves stacked, weight [2N, K]; "
                f"got {n_out} rows, an odd count"
            )
        n_out //= 2
    if gamma is not None and residual is None:
        raise ValueError("linear: gamma (LayerScale) is applied with the residual add only; pass residual= as well")
    optional = {"bias": (bias, (stacked,)), "residual": (residual, (*x.shape[:-1], n_out)), "gamma": (gamma, (n_out,))}
    for name, (tensor, shape) in optional.items():
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"linear: {name} must be a torch.Tensor or None, got {type(tensor).__name__}")
        if tuple(tensor.shape) != tuple(shape):
            raise ValueError(f"linear: {name} must have shape {tuple(shape)}, got {tuple(tensor.shape)}")
    named = {"x": x, "weight": weight, **{name: t for name, (t, _) in optional.items() if t is not None}}
    for name, tensor in named.items():
        if tensor.dtype != x.dtype:
            raise TypeError(
                f"linear: dtypes differ: x is {x.dtype} but {name} is {tensor.dtype}; "
                f"cast them to one dtype (e.g. {name}.to({x.dtype}) or model.to(dtype))"
            )
        if tensor.device != x.device:
            raise ValueError(f"linear: devices differ: x is on {x.device} but {name} is on {tensor.device}")
        if tensor.numel() > 0 and tensor.stride(-1) != 1:
            raise ValueError(
                f"linear: {name}'s last dim must be contiguous (stride 1), got stride {tensor.stride(-1)}; "
                f"call {name}.contiguous() first"
            )
    check_device("linear", x)


def check_input_norm(
    x: torch.Tensor, ln_weight: torch.Tensor | None, ln_bias: torch.Tensor | None, eps, op: str = "layer_norm_linear"
) -> None:
    """Raise before launch unless the input norm's parameters fit ``x [..., K]`` (``op`` names the caller)."""
    if not isinstance(eps, (float, int)) or isinstance(eps, bool) or not eps > 0:
        raise ValueError(f"{op}: eps must be a positive float, got {eps!r}")
    for name, t in (("ln_weight", ln_weight), ("ln_bias", ln_bias)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor or None, got {type(t).__name__}")
        if tuple(t.shape) != (x.shape[-1],):
            raise ValueError(f"{op}: {name} must have shape ({x.shape[-1]},), got {tuple(t.shape)}")
        if t.dtype != x.dtype:
            raise TypeError(f"{op}: {name} is {t.dtype} but x is {x.dtype}: pass {name}.to({x.dtype})")
        if t.device != x.device:
            raise ValueError(f"{op}: {name} is on {t.device} but x is on {x.device}")
        if t.stride(-1) != 1:
            raise ValueError(f"{op}: {name} must be contiguous; call {name}.contiguous() first")


__all__ = ["check_input_norm", "check_linear_inputs"]
