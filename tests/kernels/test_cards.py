"""The card table: every generation a user may bring, read for the tensors' own device (faked here)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vit_fast.base import cards


@pytest.mark.parametrize(
    "arch, shared_kb, tensor_cores, tma, bf16",
    [
        (75, 64, False, False, False),
        (80, 163, True, False, True),
        (86, 99, True, False, True),
        (89, 99, True, False, True),
        (90, 227, True, True, True),
        (100, 227, True, True, True),
        (120, 99, True, True, True),
    ],
)
def test_listed_generations(arch, shared_kb, tensor_cores, tma, bf16):
    card = cards.card_for_arch(arch)
    assert card.arch == arch and card.shared_memory == shared_kb * 1024
    assert (card.tensor_cores, card.tma, card.native_bf16) == (tensor_cores, tma, bf16)
    assert card.name in card.describe() and f"{shared_kb} KB" in card.describe()


@pytest.mark.parametrize("arch, row", [(87, 86), (103, 100), (121, 120), (70, 75), (72, 75), (130, None)])
def test_unlisted_generations_read_conservatively(arch, row):
    card = cards.card_for_arch(arch)
    if row is not None:
        assert card == cards.CARDS[row]
    else:  # newer than the table: never more shared memory than the smallest listed card
        assert card.shared_memory == min(c.shared_memory for c in cards.CARDS.values())


def test_cpu_reads_as_the_interpreter_target_and_pretend_is_per_thread():
    assert cards.device_arch(torch.device("cpu")) == cards.CPU_ARCH
    with cards.pretend_arch(75):
        assert cards.card_of("cpu").arch == 75
        assert cards.card_of(torch.device("cuda", 1)).arch == 75  # no driver asked
    assert cards.device_arch("cpu") == cards.CPU_ARCH


def test_the_tensors_device_is_asked_not_the_current_one(monkeypatch):
    asked = []

    def capability(index):
        asked.append(index)
        return (7, 5) if index == 1 else (9, 0)

    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    cards._cuda_arch.cache_clear()
    try:
        assert cards.card_of(torch.device("cuda:1")).arch == 75
        assert cards.card_of(torch.device("cuda:0")).arch == 90
        assert asked == [1, 0]
    finally:
        cards._cuda_arch.cache_clear()


def test_tensor_arch_reads_the_tensors_device(monkeypatch):
    """The launchers' fast read: a CPU or meta tensor is CPU_ARCH, pretend_arch applies, a CUDA index is asked."""
    assert cards.tensor_arch(torch.empty(1)) == cards.CPU_ARCH
    assert cards.tensor_arch(torch.empty(1, device="meta")) == cards.CPU_ARCH
    with cards.pretend_arch(75):
        assert cards.tensor_arch(torch.empty(1)) == 75
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (8, 6) if index == 1 else (9, 0))
    cards._cuda_arch.cache_clear()
    try:
        assert cards.tensor_arch(torch.empty(1)) == 86
    finally:
        cards._cuda_arch.cache_clear()


def test_sm_count_is_asked_of_the_tensors_device(monkeypatch):
    """The SM count is a fact of the device (an H100 PCIe has 114, an SXM 132; both sm_90): asked of the tensors'
    own device once (cached per index), never of the current one; a CPU or meta tensor reads as CPU_SM_COUNT;
    ``pretend_arch(..., sm_count=)`` overrides it, a pretence without one leaves it alone."""
    assert cards.tensor_sm_count(torch.empty(1)) == cards.device_sm_count("cpu") == cards.CPU_SM_COUNT
    assert cards.tensor_sm_count(torch.empty(1, device="meta")) == cards.CPU_SM_COUNT
    with cards.pretend_arch(80, sm_count=108):
        assert cards.tensor_sm_count(torch.empty(1)) == cards.device_sm_count(torch.device("cuda", 1)) == 108
        with cards.pretend_arch(86):
            assert cards.tensor_sm_count(torch.empty(1)) == 108
    with cards.pretend_arch(75):
        assert cards.tensor_sm_count(torch.empty(1)) == cards.CPU_SM_COUNT
    asked = []

    def properties(index):
        asked.append(index)
        return SimpleNamespace(multi_processor_count=114 if index == 1 else 132)

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 1)
    cards._cuda_sm_count.cache_clear()
    try:
        assert cards.tensor_sm_count(torch.empty(1)) == cards.tensor_sm_count(torch.empty(2)) == 114
        assert cards.device_sm_count(torch.device("cuda:0")) == 132
        assert asked == [1, 0]
    finally:
        cards._cuda_sm_count.cache_clear()
