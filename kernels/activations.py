"""The GEMM epilogue's activations by name, plain and gated (GLU), and how a name reads: what the kernel's
``ACTIVATION`` and ``GATE`` constexprs get, and what the torch ops apply. No triton here: the torch backend reads
these names too, and the eager activation (:func:`activation_ref`) the references and the torch ops compute."""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: the epilogue's activations (``ACTIVATION_CODES``: the kernel's ``ACTIVATION``): exact (erf) GELU, tanh GELU,
#: QuickGELU (``y * sigmoid(1.702 y)``, OpenAI CLIP) and SiLU (``y * sigmoid(y)``)
_PLAIN = (None, "gelu", "gelu_tanh", "quick_gelu", "silu")
#: a gated (GLU) activation: the weight stacks two halves ``[2N, K]`` and the output is ``act(x1) * x2``
#: (``<act>_glu``, SwiGLU's ``silu_glu``) or ``x1 * act(x2)`` (``<act>_glu_last``, timm's GluMlp default), N columns
GATED = tuple(f"{a}_glu{last}" for a in _PLAIN[1:] for last in ("", "_last"))
ACTIVATIONS = _PLAIN + GATED
ACTIVATION_CODES = {**{a: i for i, a in enumerate(_PLAIN)}, **{g: _PLAIN.index(g.split("_glu")[0]) for g in GATED}}


def gate_code(activation: str | None) -> int:
    """The kernel's ``GATE``: 0 plain, 1 ``act(x1) * x2``, 2 ``x1 * act(x2)``."""
    if activation is None or "_glu" not in activation:
        return 0
    return 2 if activation.endswith("_glu_last") else 1


def gate_split(activation: str | None) -> tuple[str | None, int]:
    """``activation`` as (its plain activation, :func:`gate_code`)."""
    return (activation.split("_glu")[0] if gate_code(activation) else activation), gate_code(activation)


#: each plain activation in eager PyTorch
_EAGER = {
    None: lambda y: y,
    "gelu": F.gelu,
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
    "quick_gelu": lambda y: y * torch.sigmoid(1.702 * y),
    "silu": F.silu,
}


def activation_ref(activation: str | None, y: torch.Tensor) -> torch.Tensor:
    """``activation`` (one of :data:`ACTIVATIONS`; None: ``y`` as it is) in eager PyTorch; a gated one over the two
    halves of ``y``'s last dim (``[..., 2N] -> [..., N]``)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    plain, gate = gate_split(activation)
    if not gate:
        return _EAGER[plain](y)
    x1, x2 = y.chunk(2, dim=-1)
    return _EAGER[plain](x1) * x2 if gate == 1 else x1 * _EAGER[plain](x2)


__all__ = ["ACTIVATIONS", "ACTIVATION_CODES", "GATED", "activation_ref", "gate_code", "gate_split"]
