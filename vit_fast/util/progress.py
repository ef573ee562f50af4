"""The one progress mechanism: named steps as lines on stderr (``Stages("vit-fast export").step("tracing")``), and a
bar for counted work (``bar(total)``: tqdm on a terminal, else one line per piece of work with the time left,
:class:`Remaining`'s estimate from finished pieces of comparable cost). Examples: docs/development.md, "Progress"."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any


def about(seconds: float) -> str:
    """``about 42 s`` (``under 1 s`` below a second): an estimate of how long, as a person reads it."""
    text = duration(seconds)
    return text if text.startswith("under") else f"about {text}"


class Stages:
    """Progress as one line per step on stderr."""

    def __init__(self, prefix: str, enabled: bool = True) -> None:
        self.prefix = prefix
        self.enabled = enabled

    @contextlib.contextmanager
    def step(self, text: str) -> Iterator[None]:
        start = time.perf_counter()
        self.note(f"{text} ...")
        yield
        self.note(f"{text}: done ({time.perf_counter() - start:.1f} s)")

    def note(self, text: str) -> None:
        if self.enabled:
            print(f"[{self.prefix}] {text}", file=sys.stderr, flush=True)


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``n`` and ``noun`` in the number it takes: ``plural(1, "torch thread")`` is ``1 torch thread``, ``plural(2,
    "torch thread")`` is ``2 torch threads``; ``nouns`` where the plural is not ``noun`` + s (``"batches"``)."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"


def duration(seconds: float) -> str:
    """``42 s``, ``3.5 min``, ``1.2 h``: how long, at the precision a person reads (``under 1 s`` below that)."""
    if seconds < 0.5:
        return "under 1 s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


#: a piece of work left is predicted only from finished pieces whose expected cost lies within this factor of its own
COMPARABLE = 4.0


class Remaining:
    """How long is left, from the measured times of the finished pieces of work; ``costs``: each piece's expected cost
    in a unit of the caller's (only ratios matter). ``finished(i)`` after piece ``i``; ``skip(i)``, ``expect(i, cost)``;
    ``seconds_left()`` (None while nothing can be said); ``text()``: ``"; about 3.5 min left"`` or ``""``. ``clock``:
    seconds (``time.perf_counter``; tests give a fake one). How it predicts, and each method: docs/development.md,
    section "Progress (`progress.py`)"."""

    def __init__(self, costs: Sequence[float], clock: Callable[[], float] | None = None) -> None:
        self.costs = [self._checked(c) for c in costs]
        self.clock = clock or time.perf_counter
        self.seconds: dict[int, float] = {}
        self.skipped: set[int] = set()
        self.mark = self.clock()

    @staticmethod
    def _checked(cost: float) -> float:
        cost = float(cost)
        if not cost > 0 or math.isinf(cost):
            raise ValueError(f"a piece of work must have a finite cost > 0, got {cost}")
        return cost

    def expect(self, index: int, cost: float) -> None:
        """Piece ``index`` is now expected to cost ``cost``."""
        self.costs[index] = self._checked(cost)

    def finished(self, index: int, seconds: float | None = None, cost: float | None = None) -> None:
        """Piece ``index`` is done: it took ``seconds`` (default: the clock since the previous piece ended) and,
        where given, cost ``cost`` (what it turned out to be)."""
        now = self.clock()
        self.seconds[index] = max(0.0, now - self.mark if seconds is None else float(seconds))
        self.mark = now
        if cost is not None:
            self.expect(index, cost)

    def skip(self, index: int) -> None:
        """Piece ``index`` takes no time worth counting (it will not run, or it failed): it is neither predicted
        nor used to predict the others."""
        self.skipped.add(index)
        self.seconds.pop(index, None)
        self.mark = self.clock()

    def settled(self, index: int) -> bool:
        """Whether piece ``index`` has finished or was skipped."""
        return index in self.seconds or index in self.skipped

    def seconds_left(self) -> float | None:
        """Seconds the pieces not yet finished should take; None before every one of them has a finished piece of
        comparable cost (0.0 once all are done)."""
        total = 0.0
        for j, cost in enumerate(self.costs):
            if self.settled(j):
                continue
            near = [i for i in self.seconds if cost / COMPARABLE <= self.costs[i] <= cost * COMPARABLE]
            if not near:
                return None
            total += cost * sum(self.seconds[i] for i in near) / sum(self.costs[i] for i in near)
        return total

    def text(self) -> str:
        """``"; about 3.5 min left"``; empty while nothing can be said, and once everything is done."""
        left = self.seconds_left()
        return f"; {about(left)} left" if left else ""


#: work above this many GFLOP on a CPU is announced before it starts, with a smaller command to try (a ViT-B/16
#: image is 17.6 GFLOP; a loaded 2-core CPU runs some tens of GFLOP/s in fp32, a few in float64: a minute or more)
LONG_CPU_GFLOP = 1000.0


def long_cpu_note(gflop: float, what: str, smaller: str, expected: str | None = None) -> str | None:
    """The line that says ``what`` (``gflop`` GFLOP in all) is GPU-sized work about to run on a CPU, and the
    smaller command to try; None when the work is small. ``expected``: how long it should take and what that rests
    on (``"expected about 1.2 h (...)"``), where the caller measured it; else the line says only that it is long."""
    if gflop < LONG_CPU_GFLOP:
        return None
    how_long = expected or "this can take many minutes"
    return f"{what}: {gflop:,.0f} GFLOP on a CPU, sized for a GPU; {how_long} (try {smaller})"


class _NoBar:
    """No progress at all (``enabled=False``); the estimate is still kept, for a caller that reads it."""

    def __init__(self, total: int, costs: Sequence[float] | None = None) -> None:
        self.total, self.n = total, 0
        self.remaining = Remaining(costs if costs is not None else [1.0] * total)

    def update(self, n: int = 1) -> None:
        for _ in range(n):
            if not self.remaining.settled(self.n):  # the caller may have told its time (or skipped it) already
                self.remaining.finished(self.n)
            self.n += 1

    def set_postfix_str(self, text: str) -> None:
        pass

    def write(self, line: str) -> None:
        pass

    def close(self) -> None:
        pass


class _LineBar(_NoBar):
    """The bar where there is no terminal (a log, a pipe) or no tqdm: a line on stderr as each unit starts, with
    the time left once it can be estimated (:class:`Remaining`)."""

    def __init__(self, total: int, desc: str, unit: str, costs: Sequence[float] | None = None) -> None:
        super().__init__(total, costs)
        self.desc, self.unit = desc, unit

    def set_postfix_str(self, text: str) -> None:
        count = f"{min(self.n + 1, self.total)}/{self.total} {self.unit}s"
        print(f"[{self.desc}] {count}: {text}{self.remaining.text()}", file=sys.stderr, flush=True)

    def write(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)


class _TqdmBar(_NoBar):
    """A tqdm bar on stderr whose time left is :class:`Remaining`'s (tqdm's own extrapolates from the share of units
    done, which jumps when the units differ in size); ``write`` prints a line above the bar."""

    def __init__(self, tqdm: Any, total: int, desc: str, unit: str, costs: Sequence[float] | None = None) -> None:
        super().__init__(total, costs)
        self.tqdm = tqdm
        self.text = ""
        fmt = "{desc}: {n_fmt}/{total_fmt} " + unit + "s |{bar}| {elapsed}{postfix}"
        self.bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, bar_format=fmt)

    def _show(self) -> None:
        self.bar.set_postfix_str(f"{self.text}{self.remaining.text()}".lstrip("; "))

    def update(self, n: int = 1) -> None:
        super().update(n)
        self.bar.update(n)
        self._show()

    def set_postfix_str(self, text: str) -> None:
        self.text = text
        self._show()

    def write(self, line: str) -> None:
        self.tqdm.write(line, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


def bar(
    total: int, desc: str, enabled: bool | None = None, unit: str = "case", costs: Sequence[float] | None = None
) -> Any:
    """Progress over ``total`` units (``unit``): a tqdm bar on an interactive stderr when tqdm is installed, else a
    line per unit; nothing with ``enabled=False``. ``costs``: each unit's expected cost, for the time left
    (:class:`Remaining`; default: all alike), read and refined through the bar's ``remaining``. ``update(n)``
    after units finish, ``set_postfix_str(text)`` as one starts, ``write(line)`` for a line (a result) above it."""
    if enabled is False:
        return _NoBar(total, costs)
    if sys.stderr.isatty():
        try:
            from tqdm import tqdm
        except ImportError:
            pass
        else:
            return _TqdmBar(tqdm, total, desc, unit, costs)
    return _LineBar(total, desc, unit, costs)
