"""What each GPU generation gives our kernels, in one table (:data:`CARDS`), read for the tensors' own device
(:func:`card_of`, :func:`tensor_sm_count`), never the current device or one card's constant. A CPU tensor reads as an
H100 SXM (sm_90, 132 SMs) unless :func:`pretend_arch` says otherwise. Where the figures come from and how an unlisted
capability is read: docs/kernels.md, "The cards". Importing it touches no GPU driver."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Card:
    """One compute capability, as our kernels see it."""

    arch: int  #: compute capability as ``10 * major + minor`` (90 for sm_90)
    examples: str  #: cards with it
    shared_memory: int  #: shared memory one block may use (the opt-in maximum), bytes
    dot: str  #: what ``tl.dot`` compiles to: "fma" (no tensor cores), "mma.sync", "wgmma", "tcgen05"
    tma: bool  #: the tensor-memory accelerator (descriptor loads)
    native_bf16: bool  #: bf16 arithmetic in hardware (sm_75 emulates it)

    @property
    def tensor_cores(self) -> bool:
        """Whether Triton's ``tl.dot`` runs on tensor cores here: where our kernels are expected to help."""
        return self.dot != "fma"

    @property
    def name(self) -> str:
        return f"sm_{self.arch}"

    def describe(self) -> str:
        """One line: ``sm_75 (T4, RTX 20xx): 64 KB shared memory per block, tl.dot on FMA, no TMA, bf16 emulated``."""
        dot = "FMA (no tensor cores)" if self.dot == "fma" else self.dot
        return (
            f"{self.name} ({self.examples}): {self.shared_memory // 1024} KB shared memory per block, tl.dot on {dot}, "
            f"{'TMA' if self.tma else 'no TMA'}, bf16 {'native' if self.native_bf16 else 'emulated'}"
        )


#: every generation a user may bring; the rows of KERNELS.md's "cards users have"
CARDS: dict[int, Card] = {
    card.arch: card
    for card in (
        Card(75, "T4, RTX 20xx", 64 * 1024, "fma", tma=False, native_bf16=False),
        Card(80, "A100, A30", 163 * 1024, "mma.sync", tma=False, native_bf16=True),
        Card(86, "A10, A40, RTX 30xx", 99 * 1024, "mma.sync", tma=False, native_bf16=True),
        Card(89, "L4, L40S, RTX 40xx", 99 * 1024, "mma.sync", tma=False, native_bf16=True),
        Card(90, "H100, H200", 227 * 1024, "wgmma", tma=True, native_bf16=True),
        Card(100, "B200", 227 * 1024, "tcgen05", tma=True, native_bf16=True),
        Card(120, "RTX 50xx, RTX PRO 6000", 99 * 1024, "mma.sync", tma=True, native_bf16=True),
    )
}

#: the capability a CPU tensor reads as (the interpreter, the offline compile check's default target)
CPU_ARCH = 90
#: the SM count a CPU or meta tensor reads as (the interpreter, the offline compile check, tests on meta tensors):
#: an H100 SXM's, the CPU_ARCH card the project's GPU runs use. Only the no-autotune heuristics read it, for how
#: many narrow tiles keep every SM busy; there is no device to ask, so any choice is a stand-in
CPU_SM_COUNT = 132
#: below this Triton has no target at all
MIN_ARCH = 70


def card_for_arch(arch: int) -> Card:
    """The row for compute capability ``arch`` (e.g. 86): its own, else the nearest listed one below it in its
    generation, else the nearest listed one below it (older generations: the T4's row, the most conservative)."""
    if arch in CARDS:
        return CARDS[arch]
    below = [a for a in CARDS if a <= arch]
    same_generation = [a for a in below if a // 10 == arch // 10]
    if same_generation:
        return CARDS[max(same_generation)]
    if not below:
        return CARDS[min(CARDS)]
    # a generation newer than the table: the newest row's features, the smallest shared memory of them all
    nearest = CARDS[max(below)]
    if arch > max(CARDS):
        return Card(arch, "unlisted", min(c.shared_memory for c in CARDS.values()), nearest.dot, nearest.tma, True)
    return nearest


class _Pretended(threading.local):
    # class defaults: reading them never raises (an AttributeError costs microseconds)
    arch: int | None = None
    sm_count: int | None = None


_PRETEND = _Pretended()


@contextlib.contextmanager
def pretend_arch(arch: int, sm_count: int | None = None) -> Iterator[None]:
    """Within the block (this thread), every device reads as compute capability ``arch`` (and, given
    ``sm_count``, as a card with that many SMs; else each device's own count, :data:`CPU_SM_COUNT` for a CPU):
    how tests fake a card and how ``tools/compile_check.py`` asks the launchers and prunes what they would do on
    a given target."""
    previous = _PRETEND.arch, _PRETEND.sm_count
    _PRETEND.arch = arch
    if sm_count is not None:
        _PRETEND.sm_count = sm_count
    try:
        yield
    finally:
        _PRETEND.arch, _PRETEND.sm_count = previous


@functools.cache
def _cuda_arch(index: int) -> int:
    major, minor = torch.cuda.get_device_capability(index)
    return 10 * major + minor


def device_arch(device: torch.device | str | int) -> int:
    """Compute capability of ``device`` as ``10 * major + minor``: asked of that device (cached per index), not of
    the current one. A CPU or meta device reads as :data:`CPU_ARCH`."""
    pretended = _PRETEND.arch
    if pretended is not None:
        return pretended
    if not isinstance(device, torch.device):  # every launch asks with a tensor's .device: no new object then
        device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda":
        return CPU_ARCH
    return _cuda_arch(device.index if device.index is not None else torch.cuda.current_device())


def tensor_arch(tensor: torch.Tensor) -> int:
    """:func:`device_arch` of ``tensor.device``, for the launchers: read through ``get_device()`` (an int, no
    ``torch.device`` built), a few hundred nanoseconds a launch. :func:`pretend_arch` applies."""
    pretended = _PRETEND.arch
    if pretended is not None:
        return pretended
    index = tensor.get_device()
    return CPU_ARCH if index < 0 else _cuda_arch(index)


@functools.cache
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def device_sm_count(device: torch.device | str | int) -> int:
    """Streaming multiprocessors of ``device``: asked of that device (cached per index), not of the current one.
    A CPU or meta device reads as :data:`CPU_SM_COUNT`; ``pretend_arch(..., sm_count=)`` applies."""
    pretended = _PRETEND.sm_count
    if pretended is not None:
        return pretended
    if not isinstance(device, torch.device):
        device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda":
        return CPU_SM_COUNT
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


def tensor_sm_count(tensor: torch.Tensor) -> int:
    """:func:`device_sm_count` of ``tensor.device``, for the launchers (read through ``get_device()``, as
    :func:`tensor_arch`): the programs that keep every SM of the tensors' own device busy."""
    pretended = _PRETEND.sm_count
    if pretended is not None:
        return pretended
    index = tensor.get_device()
    return CPU_SM_COUNT if index < 0 else _cuda_sm_count(index)


def card_of(device: torch.device | str | int) -> Card:
    """The :class:`Card` of ``device`` (a tensor's ``.device``)."""
    return card_for_arch(device_arch(device))


def device_name(device: torch.device | str | int) -> str:
    """``"NVIDIA H100 80GB HBM3 (cuda:0, sm_90)"``, or ``"cpu"``: how messages name the device."""
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    arch = device_arch(device)
    if device.type != "cuda":
        return str(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        name = torch.cuda.get_device_name(index)
    except (RuntimeError, AssertionError):  # a faked card in a test: no driver behind it
        name = "GPU"
    return f"{name} (cuda:{index}, sm_{arch})"


__all__ = [
    "CARDS",
    "CPU_ARCH",
    "CPU_SM_COUNT",
    "MIN_ARCH",
    "Card",
    "card_for_arch",
    "card_of",
    "device_arch",
    "device_name",
    "device_sm_count",
    "pretend_arch",
    "tensor_arch",
    "tensor_sm_count",
]
