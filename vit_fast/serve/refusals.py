"""The console's record of refused requests: one line per refused request, at most one a second, the rest counted.
Stdlib only: the model's answers (:mod:`vit_fast.serve.answers`) and the HTTP front (:mod:`vit_fast.serve.front`,
a process of its own) both keep one."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

#: seconds between two console lines about refused requests
LINE_EVERY_S = 1.0


class RefusalLog:
    """One console line per refused request, at most one each ``every_s`` seconds: the ones in between are counted
    and named in the next line, and :meth:`summary` sums up all of them. Thread-safe (instance threads share it)."""

    def __init__(self, stream: TextIO | None = None, every_s: float = LINE_EVERY_S) -> None:
        self.stream = stream
        self.every_s = every_s
        self.total = 0
        self._held = 0
        self._last = float("-inf")
        self._lock = threading.Lock()

    def note(self, message: str) -> None:
        """Count one refused request; print it unless a line went out less than ``every_s`` ago."""
        with self._lock:
            self.total += 1
            now = time.monotonic()
            if now - self._last < self.every_s:
                self._held += 1
                return
            held, self._held, self._last = self._held, 0, now
        more = f" (and {held} more refused since the last line)" if held else ""
        line = message.splitlines()[0] if message else ""
        print(f"[vit-fast serve] refused a request: {line}{more}", file=self.stream or sys.stderr, flush=True)

    def summary(self) -> str | None:
        """One line on how many requests were refused in all (None when none was)."""
        return f"[vit-fast serve] {self.total} request(s) refused while serving" if self.total else None


__all__ = ["LINE_EVERY_S", "RefusalLog"]
