"""Checks shared by every kernel launcher. Nothing here touches a GPU driver."""

from __future__ import annotations

import torch

from vit_fast.runtime import interpreter_enabled


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
