"""The one progress mechanism: named steps as lines on stderr, and a bar for counted work.

``Stages("vit-fast export").step("tracing")`` prints ``[vit-fast export] tracing ...`` and,
when the block ends, ``... done (6.2 s)``. ``bar(total)`` is a tqdm bar on a terminal (when tqdm
is installed) and elsewhere one line per piece of work (``[bench] 3/12 cases: fp32 torch batch 8;
about 2.5 min left``), so a log shows where a long run is.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any


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
    """``42 s``, ``3.5 min``, ``1.2 h``: how long, at the precision a person reads."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class Remaining:
    """How long is left, from the share of the (weighted) work done so far: ``advance(work)`` after each
    piece returns ``"; about 3.5 min left"`` (empty once everything is done)."""

    def __init__(self, total: float) -> None:
        self.total = float(total)
        self.done = 0.0
        self.start = time.perf_counter()

    def advance(self, work: float) -> str:
        self.done += work
        if self.done <= 0 or self.done >= self.total:
            return ""
        elapsed = time.perf_counter() - self.start
        return f"; about {duration(elapsed * (self.total - self.done) / self.done)} left"


#: work above this many GFLOP on a CPU is announced before it starts, with a smaller command to try (a ViT-B/16
#: image is 17.6 GFLOP; a loaded 2-core CPU runs some tens of GFLOP/s in fp32, a few in float64: a minute or more)
LONG_CPU_GFLOP = 1000.0


def long_cpu_note(gflop: float, what: str, smaller: str) -> str | None:
    """The line that says ``what`` (``gflop`` GFLOP in all) is GPU-sized work about to run on a CPU, and the
    smaller command to try; None when the work is small."""
    if gflop < LONG_CPU_GFLOP:
        return None
    return f"{what}: {gflop:,.0f} GFLOP on a CPU, sized for a GPU; this can take many minutes (try {smaller})"


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


class _LineBar:
    """The bar where there is no terminal (a log, a pipe) or no tqdm: a line on stderr as each unit starts."""

    def __init__(self, total: int, desc: str, unit: str) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.n = 0
        self.remaining = Remaining(total)
        self.left = ""

    def update(self, n: int = 1) -> None:
        self.n += n
        self.left = self.remaining.advance(n)

    def set_postfix_str(self, text: str) -> None:
        count = f"{min(self.n + 1, self.total)}/{self.total} {self.unit}s"
        print(f"[{self.desc}] {count}: {text}{self.left}", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


def bar(total: int, desc: str, enabled: bool | None = None, unit: str = "case") -> Any:
    """Progress over ``total`` units (``unit``): a tqdm bar on an interactive stderr when tqdm is installed,
    else a line per unit; nothing with ``enabled=False``."""
    if enabled is False:
        return _NoBar()
    if sys.stderr.isatty():
        try:
            from tqdm import tqdm
        except ImportError:
            pass
        else:
            return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False)
    return _LineBar(total, desc, unit)
