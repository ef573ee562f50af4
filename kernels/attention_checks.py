"""The attention kernels' input checks, run before any launch: ``qkv`` and the head count
(:func:`check_attention_inputs`), the masks of a padded or packed batch (:func:`check_mask`), and what the attention
pool and differential attention check alike: a fused projection (:func:`check_projection`), the scale."""

from __future__ import annotations

import math

import torch

from ._launch import check_device
from .launches import SUPPORTED_DTYPES

#: the head dims the kernel runs
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256


def check_attention_inputs(
    qkv: torch.Tensor,
    num_heads: int,
    scale: float | None,
    lengths: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
) -> None:
    """Raise a clear error, before any launch, when the inputs do not fit the kernel."""
    hint = "check num_heads, or that qkv is the fused [q | k | v] projection"
    check_projection("attention", "qkv", qkv, num_heads, 3, "3 * num_heads * head_dim", hint)
    check_scale("attention", scale)
    check_device("attention", qkv)
    if lengths is not None or cu_seqlens is not None or max_seqlen is not None:
        check_mask(qkv, lengths, cu_seqlens, max_seqlen)


def check_projection(
    what: str,
    name: str,
    proj: torch.Tensor,
    num_heads: int,
    parts: int,
    layout: str,
    hint: str,
    head_dims: tuple[int, int] = (MIN_HEAD_DIM, MAX_HEAD_DIM),
    head: str = "head_dim",
) -> int:
    """The checks every attention kernel makes on its fused projection ``proj [B, T, layout]`` before ``what``
    launches: its last dim ``parts * num_heads`` head dims (``hint``: what to check where it is not), each of
    ``head_dims[0]..head_dims[1]`` (``head`` names it); returns the head dim."""
    if not isinstance(proj, torch.Tensor):
        raise TypeError(f"{what}: {name} must be a torch.Tensor, got {type(proj).__name__}")
    if proj.dim() != 3:
        raise ValueError(
            f"{what}: {name} must have shape [B, T, {layout}], got {tuple(proj.shape)}; "
            f"pass the {name} GEMM output before any reshape"
        )
    if proj.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"{what}: {name} dtype {proj.dtype} is not supported; use float16, bfloat16 or float32 "
            f"(e.g. {name}.to(torch.float16))"
        )
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"{what}: num_heads must be a positive int, got {num_heads!r}")
    width = proj.shape[-1]
    if width % (parts * num_heads) != 0:
        raise ValueError(f"{what}: {name}'s last dim {width} is not {layout} with num_heads={num_heads}; {hint}")
    head_dim = width // (parts * num_heads)
    if not head_dims[0] <= head_dim <= head_dims[1]:
        raise ValueError(
            f"{what}: {head} {head_dim} (= {width} / ({parts} * {num_heads})) is outside the supported range "
            f"{head_dims[0]}..{head_dims[1]}; use the torch backend for this model"
        )
    if proj.shape[1] == 0:
        raise ValueError(f"{what}: {name} has T = 0 tokens; attention needs at least one token")
    if proj.stride(-1) != 1:
        raise ValueError(
            f"{what}: {name}'s last dim must be contiguous (stride 1), got stride {proj.stride(-1)}; "
            f"call {name}.contiguous() first"
        )
    return head_dim


def check_scale(what: str, scale: float | None) -> None:
    """``scale``: None or a finite float. Not while compiling: a scale that changed between compiled calls arrives
    as a symbolic float (automatic dynamic), and math.isfinite on it would break the graph."""
    if scale is not None and not torch.compiler.is_compiling():
        if not (isinstance(scale, (int, float)) and math.isfinite(scale)):
            raise ValueError(f"{what}: scale must be a finite float or None, got {scale!r}")


def check_mask(
    qkv: torch.Tensor, lengths: torch.Tensor | None, cu_seqlens: torch.Tensor | None, max_seqlen: int | None
) -> None:
    """The mask arguments: their kind, dtype, device and shape always; their values where they can be read
    (:func:`_values_readable`), which costs one device-to-host copy of ``lengths`` or ``cu_seqlens``."""
    batch, tokens = qkv.shape[0], qkv.shape[1]
    if lengths is not None and cu_seqlens is not None:
        raise ValueError("attention: pass lengths (a padded batch) or cu_seqlens (images packed into rows), not both")
    if max_seqlen is not None and cu_seqlens is None:
        raise ValueError("attention: max_seqlen goes with cu_seqlens (the longest packed segment); got no cu_seqlens")
    for name, mask in (("lengths", lengths), ("cu_seqlens", cu_seqlens)):
        if mask is None:
            continue
        if not isinstance(mask, torch.Tensor):
            raise ValueError(f"attention: {name} must be an int32 torch.Tensor, got {type(mask).__name__}")
        if mask.dtype != torch.int32:
            raise ValueError(f"attention: {name} must be int32, got {mask.dtype}; pass {name}.to(torch.int32)")
        if mask.device != qkv.device:
            raise ValueError(
                f"attention: {name} is on {mask.device} but qkv is on {qkv.device}; pass {name}.to(qkv.device)"
            )
    if lengths is not None and tuple(lengths.shape) != (batch,):
        raise ValueError(f"attention: lengths must have shape [B] = [{batch}], got {tuple(lengths.shape)}")
    if cu_seqlens is not None and (cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2):
        raise ValueError(
            f"attention: cu_seqlens must have shape [N + 1] with N >= 1 segments, got {tuple(cu_seqlens.shape)}"
        )
    if max_seqlen is not None and not torch.compiler.is_compiling():
        if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int) or max_seqlen < 0:
            raise ValueError(f"attention: max_seqlen must be an int >= 0 or None, got {max_seqlen!r}")
    if lengths is not None and _values_readable(lengths):
        values = lengths.tolist()
        for b, n in enumerate(values):
            if not 0 <= n <= tokens:
                raise ValueError(f"attention: lengths[{b}] = {n} is outside 0..T = 0..{tokens}")
    if cu_seqlens is not None and _values_readable(cu_seqlens):
        offsets = cu_seqlens.tolist()
        if offsets[0] != 0:
            raise ValueError(f"attention: cu_seqlens[0] must be 0, got {offsets[0]}")
        for i in range(1, len(offsets)):
            start, end = offsets[i - 1], offsets[i]
            if end < start:
                raise ValueError(
                    f"attention: cu_seqlens must be non-decreasing, got cu_seqlens[{i}] = {end} < "
                    f"cu_seqlens[{i - 1}] = {start}"
                )
            if end > batch * tokens:
                raise ValueError(
                    f"attention: cu_seqlens[{i}] = {end} is past the B * T = {batch} * {tokens} tokens of qkv"
                )
            if end > start and start // tokens != (end - 1) // tokens:
                raise ValueError(
                    f"attention: segment {i - 1} (tokens {start}..{end - 1} of the B * T) crosses from image row "
                    f"{start // tokens} into row {(end - 1) // tokens}; a segment must lie in one row of T = {tokens}"
                )
            if max_seqlen is not None and end - start > max_seqlen:
                raise ValueError(
                    f"attention: segment {i - 1} has {end - start} tokens, more than max_seqlen = {max_seqlen}"
                )


def _values_readable(mask: torch.Tensor) -> bool:
    """Whether a mask tensor's values can be checked on the host: a plain tensor with data, outside
    ``torch.compile`` tracing and CUDA-graph capture (where a host read is not possible). Elsewhere the kernel
    clamps what it reads, so a bad value gives a wrong answer but never a read or write outside the tensors."""
    if torch.compiler.is_compiling() or type(mask) is not torch.Tensor or mask.is_meta:
        return False
    return not (mask.is_cuda and torch.cuda.is_current_stream_capturing())


__all__ = ["MAX_HEAD_DIM", "MIN_HEAD_DIM", "check_attention_inputs", "check_mask", "check_projection", "check_scale"]
