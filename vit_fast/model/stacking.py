"""Several linears on the same input as one GEMM: :class:`LinearWeights` (what the ops read where they read an
``nn.Linear``), :func:`stack_linears` and :class:`StackedLinears`, a per-owner cache of stacks made again whenever
a stacked parameter changes (its version counter). transformers' separate q / k / v and gate / up, and timm's
``SwiGLU`` (``fc1_g`` over ``fc1_x``), run their GEMMs so."""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch
from torch import nn


class LinearWeights(NamedTuple):
    """A weight ``[N, K]`` and bias where the ops read an ``nn.Linear`` (``.weight``, ``.bias``): a slice of a packed
    projection's parameters, or several linears stacked into one GEMM."""

    weight: torch.Tensor
    bias: torch.Tensor | None


def stack_linears(linears: list[nn.Linear], detach: bool = True) -> LinearWeights:
    """The linears' weights (and biases, zeros standing in for a missing one) stacked along the outputs;
    ``detach=False`` keeps the stack in autograd's graph, so a gradient reaches each linear's parameters."""
    weight = torch.cat([lin.weight for lin in linears])
    biases = [lin.bias for lin in linears]
    bias = None
    if not all(b is None for b in biases):
        filled = [
            b if b is not None else torch.zeros_like(lin.weight[:, 0]) for b, lin in zip(biases, linears, strict=True)
        ]
        bias = torch.cat(filled)
    if detach:
        return LinearWeights(weight.detach(), None if bias is None else bias.detach())
    return LinearWeights(weight, bias)


class StackedLinears:
    """Stacks by name, each made on first use and again whenever one of its parameters changes (identity, storage,
    version, dtype, device). With autograd on a parameter that needs a gradient, or under torch.compile, a stack is
    made afresh in the call's graph (a cached one would hold an old graph, or none)."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[tuple, LinearWeights]] = {}

    def get(self, name: str, linears: list[nn.Linear]) -> LinearWeights:
        params = [p for lin in linears for p in (lin.weight, lin.bias) if p is not None]
        grads = torch.is_grad_enabled() and any(p.requires_grad for p in params)
        if grads or torch.compiler.is_compiling():  # compiling: stacked in the graph (a version key is untraceable)
            return stack_linears(linears, detach=not grads)
        # a stack made under torch.inference_mode() is an inference tensor, which autograd may not save for a
        # backward (a frozen model's input gradient): one made there serves inference mode only
        inference = torch.is_inference_mode_enabled()
        key = (inference, *((id(p), p.data_ptr(), p._version, p.dtype, p.device) for p in params))
        hit = self._cache.get(name)
        if hit is None or hit[0] != key:
            hit = (key, stack_linears(linears))
            self._cache[name] = hit
        return hit[1]


#: owner modules -> their stacks (:func:`stacked_for`); an owner's stacks go with it
_OWNED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def stacked_for(owner: nn.Module, name: str, linears: list[nn.Linear]) -> LinearWeights:
    """``linears`` stacked into one GEMM's weights, cached for ``owner`` (a timm SwiGLU's fc1_g over fc1_x, an Eva
    attention's q, k and v) by :class:`StackedLinears`; nothing is stored on the module (pickles stay as they were)."""
    stacks = _OWNED.get(owner)
    if stacks is None:
        stacks = _OWNED.setdefault(owner, StackedLinears())
    return stacks.get(name, linears)


__all__ = ["LinearWeights", "StackedLinears", "stack_linears", "stacked_for"]
