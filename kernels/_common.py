"""Checks shared by every kernel launcher. Nothing here touches a GPU driver."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vit_fast.kernels._interpret import interpreter_enabled


@triton.jit
def to_bf16_rtne(x):
    """fp32 -> bf16, round to nearest even, by hand. Only for the interpreter: its fp32 -> bf16
    cast truncates (twice eager's error); compiled, ``.to(tl.bfloat16)`` already rounds."""
    bits = x.to(tl.uint32, bitcast=True)
    bits += 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


def interpret_bf16(dtype: torch.dtype) -> bool:
    """bf16 under the interpreter: dot operands go in as fp32 and bf16 stores are rounded by hand."""
    return dtype == torch.bfloat16 and interpreter_enabled()


def check_device(what: str, tensor: torch.Tensor) -> None:
    """Raise before launch unless ``tensor`` can reach a kernel: CUDA, or CPU under the interpreter."""
    if tensor.is_cuda or tensor.is_meta:
        return
    if tensor.device.type == "cpu":
        if interpreter_enabled():
            return
        raise RuntimeError(
            f"{what}: got a CPU tensor, but Triton kernels need a CUDA tensor on a CUDA GPU: move the inputs with "
            ".cuda(), or set TRITON_INTERPRET=1 before triton is imported to run the kernels in the (slow) CPU "
            "interpreter"
        )
    raise RuntimeError(f"{what}: tensors on {tensor.device} are not supported; the Triton kernels run on CUDA")
