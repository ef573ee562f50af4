"""The one dtype map: the names a user may type, torch dtypes, and the type names of ONNX,
ONNX Runtime and TensorRT. Everything that turns a dtype into text or back goes through it."""

from __future__ import annotations

import torch

#: canonical short name -> torch dtype (the three floating dtypes vit-fast runs and exports)
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: torch dtype -> canonical short name
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
#: other spellings a user may type -> canonical short name
ALIASES: dict[str, str] = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
}
#: ONNX ``TensorProto`` element types (FLOAT=1, FLOAT16=10, BFLOAT16=16) -> torch dtype
ONNX_ELEM_TYPES: dict[int, torch.dtype] = {1: torch.float32, 10: torch.float16, 16: torch.bfloat16}
#: ONNX Runtime's type strings -> torch dtype
ORT_TYPES: dict[str, torch.dtype] = {
    "tensor(float)": torch.float32,
    "tensor(float16)": torch.float16,
    "tensor(bfloat16)": torch.bfloat16,
}
#: TensorRT ``DataType`` names -> torch dtype
TRT_TYPES: dict[str, torch.dtype] = {
    "FLOAT": torch.float32,
    "HALF": torch.float16,
    "BF16": torch.bfloat16,
    "INT32": torch.int32,
}

_CHOICES = "fp32, fp16 or bf16 (or torch.float32, torch.float16, torch.bfloat16)"


def canonical_name(name: str) -> str | None:
    """``"float16"`` / ``"FP16"`` / ``"torch.float16"`` -> ``"fp16"``; None for anything else."""
    key = str(name).strip().lower().removeprefix("torch.")
    key = ALIASES.get(key, key)
    return key if key in DTYPES else None


def parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A torch dtype from a torch dtype or a name; a ValueError naming the choices otherwise."""
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPE_NAMES:
            return dtype
    elif isinstance(dtype, str):
        name = canonical_name(dtype)
        if name is not None:
            return DTYPES[name]
    raise ValueError(f"dtype must be one of {_CHOICES}, got {dtype!r}")


def dtype_name(dtype: torch.dtype | str) -> str:
    """The canonical short name (``"fp16"``) of a torch dtype or any accepted spelling."""
    return DTYPE_NAMES[parse_dtype(dtype)]


def parse_dtype_list(text: str) -> list[str]:
    """``"bf16,fp16"`` -> ``["bf16", "fp16"]``: canonical names, duplicates dropped, order kept."""
    out: list[str] = []
    for item in str(text).split(","):
        name = canonical_name(item)
        if name is None:
            raise ValueError(f"unknown dtype {item.strip()!r} in {text!r}: choose from {', '.join(DTYPES)}")
        if name not in out:
            out.append(name)
    return out


# --------------------------------------------------------------------------- what a device runs natively
def bf16_native(device: torch.device | str) -> bool:
    """Whether the card of ``device`` computes bf16 in hardware (``base.cards``), never
    ``torch.cuda.is_bf16_supported()``, which says True on sm_75 through emulation and reads the current device.
    A CPU device reads as the cards table's CPU row (native) unless a test pretends a card."""
    from vit_fast.base import cards

    return cards.card_of(torch.device(device)).native_bf16


def native_dtype(device: torch.device | str) -> torch.dtype:
    """The dtype a run picks by default on ``device``: bf16 on a CUDA card with native bf16, fp16 on one without
    (sm_75: T4, RTX 20xx), fp32 on a CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if bf16_native(device) else torch.float16


def check_dtype_on_device(dtype: torch.dtype | str, device: torch.device | str, fix: str) -> None:
    """Raise a ValueError, before any compute, when ``dtype`` is bf16 and ``device``'s card has no native bf16.
    The message names the card and ends with ``fix`` (e.g. ``"use --dtype fp16 or fp32"``)."""
    from vit_fast.base import cards

    device = torch.device(device)
    if parse_dtype(dtype) != torch.bfloat16 or bf16_native(device):
        return
    card = cards.card_of(device)
    name = cards.device_name(device) if device.type == "cuda" else f"{device} (read as {card.name})"
    raise ValueError(
        f"bf16 is not native on {name}: {card.name} cards ({card.examples}) emulate bfloat16, which is slow and "
        f"not a path our kernels are built for; {fix}"
    )
