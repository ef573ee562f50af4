"""vit_fast.model.stacking: several linears as one GEMM's weight, cached per owner and remade when a parameter
changes; with autograd on, stacked in the call's graph so gradients reach each linear."""

from __future__ import annotations

import torch
from torch import nn

from vit_fast.model.stacking import StackedLinears, stack_linears


def _linears():
    torch.manual_seed(0)
    return [nn.Linear(8, 6), nn.Linear(8, 6, bias=False)]


def test_stack_order_and_missing_bias_as_zeros():
    gate, up = _linears()
    stacked = stack_linears([gate, up])
    assert torch.equal(stacked.weight, torch.cat([gate.weight, up.weight]))
    assert torch.equal(stacked.bias, torch.cat([gate.bias, torch.zeros(6)]))
    assert not stacked.weight.requires_grad


def test_cache_hits_until_a_parameter_changes():
    linears = _linears()
    stacks = StackedLinears()
    with torch.no_grad():
        first = stacks.get("fc1", linears)
        assert stacks.get("fc1", linears) is first
        linears[1].weight.mul_(2)  # an in-place update bumps the version counter
        second = stacks.get("fc1", linears)
    assert second is not first and torch.equal(second.weight[6:], linears[1].weight)


def test_gradients_reach_each_linear():
    linears = _linears()
    stacked = StackedLinears().get("fc1", linears)
    (stacked.weight.sum() + stacked.bias.sum()).backward()
    assert all(lin.weight.grad is not None for lin in linears) and linears[0].bias.grad is not None
