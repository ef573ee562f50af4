"""The one progress mechanism: named steps as lines on stderr, and a bar for counted work.

``Stages("vit-fast export").step("tracing")`` prints ``[vit-fast export] tracing ...`` and,
when the block ends, ``... done (6.2 s)``. ``bar(total)`` is a tqdm bar on a terminal (when tqdm
is installed) and a no-op elsewhere, so logs stay clean.
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


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


def bar(total: int, desc: str, enabled: bool | None = None, unit: str = "case") -> Any:
    """A progress bar over ``total`` units (``unit``): tqdm on an interactive stderr (or ``enabled=True``)."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False)
