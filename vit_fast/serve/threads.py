"""How many torch intra-op threads the CPU forwards of a served model run with: chosen while serving, by measuring
which count moves the most images per second through the server under the load it has now.

:func:`plan_threads` gives the most threads and a :class:`ThreadTuner`, which keeps one count and runs short trials
among its neighbours (:func:`candidates`) on a new load and every :data:`EVERY_S` s. Why: docs/deploy.md."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: a trial epoch lasts at least this many forwards and this many seconds (long enough that a 5 % difference is not
#: lost in the noise of a few requests) ...
EPOCH_CALLS = 8
EPOCH_MIN_S = 0.1
#: ... and ends after this many seconds whatever the forwards (a stalling count ends its epoch early)
EPOCH_S = 0.5
#: epochs per count in a trial
ROUNDS = 6
#: seconds between the end of a trial and the next one under steady load
EVERY_S = 30.0
#: this long with no forward running is a pause between loads (clients stopped, then started): the next forward
#: starts a trial at once, and a running one is dropped (its epochs measured the pause). A stalled forward is not a
#: pause: it is running
IDLE_S = 1.0
#: a trial keeps more threads when their images/s come within this factor of the current count's, and moves to
#: fewer only when they win by it: measured (see above), where fewer threads won they won by 14-25 % (one client,
#: batch 1); where more won, often by 4-9 % (batch 1, 2-4 clients), which one trial cannot tell from noise
MARGIN = 1.08


def candidates(most: int) -> list[int]:
    """1, 2, 4, ... below ``most``, and ``most``."""
    if isinstance(most, bool) or not isinstance(most, int) or most < 1:
        raise ValueError(f"most must be an int >= 1, got {most!r}")
    out, t = [], 1
    while t < most:
        out.append(t)
        t *= 2
    return [*out, most]


class ThreadTuner:
    """Which torch thread count a served forward runs with now (docs/deploy.md, "Torch threads on the CPU").
    ``most``: the most threads one forward may take (the cores shared between the instances). ``timer`` is for
    tests. Thread-safe: the instances of a server share one tuner and call :meth:`threads_for` from their own
    threads, each setting its own count (torch's count is per thread)."""

    def __init__(
        self,
        most: int,
        timer: Callable[[], float] = time.perf_counter,
        on_trial: Callable[[str], object] | None = None,
    ) -> None:
        self.counts = candidates(most)
        self.most = most
        self._timer = timer
        self._current = len(self.counts) - 1  # an index into counts
        self._trial: list[int] | None = None  # epochs (indices) still to run in this trial
        self._scores: dict[int, list[tuple[int, float]]] = {}  # index -> (images, seconds) per epoch, round order
        self._epoch: int | None = None  # the index the running epoch measures
        self._epoch_start = self._epoch_images = self._epoch_calls = 0
        self._next_trial: float | None = None  # the first request starts one
        self._running = 0  # forwards started and not finished
        self._idle_since: float | None = None  # when the last running forward finished
        #: one entry per finished trial: when (the timer's seconds), the count kept, images/s per count tried
        self.trials: list[tuple[float, int, dict[int, float]]] = []
        #: called with one line per finished trial (``serve --verbose`` prints them)
        self.on_trial = on_trial
        self._lock = threading.Lock()

    @property
    def current(self) -> int:
        """The count forwards outside a trial run with."""
        return self.counts[self._current]

    def threads_for(self, batch: int) -> int:
        """Call at the start of every forward, with its batch size: the threads it runs with. Call
        :meth:`finished` when it ends."""
        now = self._timer()
        with self._lock:
            if self._running == 0 and self._idle_since is not None and now - self._idle_since >= IDLE_S:
                self._epoch, self._trial, self._next_trial = None, None, None
            self._running += 1
            elapsed = now - self._epoch_start
            full = self._epoch_calls >= EPOCH_CALLS and elapsed >= EPOCH_MIN_S
            if self._epoch is not None and (full or elapsed >= EPOCH_S):
                self._scores.setdefault(self._epoch, []).append((self._epoch_images, now - self._epoch_start))
                self._epoch = None
            if self._epoch is None:
                due = self._next_trial is None or now >= self._next_trial
                if self._trial is None and len(self.counts) > 1 and due:
                    self._trial, self._scores = self._schedule(), {}
                if self._trial:
                    self._epoch, self._epoch_start = self._trial.pop(0), now
                    self._epoch_images = self._epoch_calls = 0
                elif self._trial is not None:
                    self._finish(now)
            if self._epoch is None:
                return self.current
            self._epoch_images += batch
            self._epoch_calls += 1
            return self.counts[self._epoch]

    def finished(self) -> None:
        """Call when a forward that :meth:`threads_for` started has ended (also when it raised)."""
        with self._lock:
            self._running = max(0, self._running - 1)
            if self._running == 0:
                self._idle_since = self._timer()

    def _schedule(self) -> list[int]:
        """The current count and its neighbours, each :data:`ROUNDS` epochs, the order rotating every round (so
        none always follows the same count)."""
        tried = [i for i in (self._current - 1, self._current, self._current + 1) if 0 <= i < len(self.counts)]
        return [tried[(r + k) % len(tried)] for r in range(ROUNDS) for k in range(len(tried))]

    def _finish(self, now: float) -> None:
        """Fewer threads when they beat the current count by :data:`MARGIN` over the trial and in all rounds but one
        (a single lucky epoch does not move the count down: in 2-4 client loads a second thread won by 4-9 %,
        within the noise of one epoch); else more threads when they come within :data:`MARGIN` of it."""
        epochs = {i: [(n, t) for n, t in runs if t > 0] for i, runs in self._scores.items()}
        rates = {i: sum(n for n, _ in runs) / sum(t for _, t in runs) for i, runs in epochs.items() if runs}
        cur, up, down = self._current, self._current + 1, self._current - 1
        if cur in rates:
            pairs = list(zip(epochs.get(down, []), epochs[cur], strict=False))
            wins = sum(a / at > b / bt for (a, at), (b, bt) in pairs)
            if down in rates and rates[down] >= rates[cur] * MARGIN and wins >= len(pairs) - 1:
                self._current = down
            elif up in rates and rates[up] * MARGIN >= rates[cur]:
                self._current = up
        tried = {self.counts[i]: round(r, 1) for i, r in sorted(rates.items())}
        self.trials.append((now, self.current, tried))
        if self.on_trial is not None:
            said = ", ".join(f"{t}: {r:g}" for t, r in tried.items())
            self.on_trial(f"torch threads trial: images/s {said}; kept {self.current}")
        del self.trials[:-100]  # the last hundred are enough to see what it did
        self._trial, self._next_trial = None, now + EVERY_S

    def kept_summary(self) -> str:
        """How often each count was kept, over the trials still on record."""
        kept = [k for _, k, _ in self.trials]
        counts = ", ".join(f"{t}: {kept.count(t)}" for t in self.counts)
        return f"torch threads kept per trial (of the last {len(kept)}): {counts}"

    def describe(self) -> str:
        """One line for the server's description."""
        if len(self.counts) == 1:
            return f"{self.most} torch thread(s) each"
        return (
            f"torch threads {'/'.join(map(str, self.counts))} each, the count that serves the most images/s "
            f"kept (tried when a load starts and every {EVERY_S:g} s; --threads fixes one)"
        )


def plan_threads(
    threads: int | None, device: torch.device, instances: int, verbose: bool = False
) -> tuple[int, ThreadTuner | None]:
    """The most torch intra-op threads a served forward runs with, and the tuner that picks how many it takes under
    the load of the moment (None where the count is fixed). ``threads`` fixes it. Else on a GPU the cores left
    beside Triton's own processes, and on the CPU the cores shared between the ``instances``, tuned."""
    from vit_fast.backend import runtime

    if threads is not None:
        return threads, None
    if device.type == "cuda":
        return runtime.intra_op_threads(instances), None
    most = runtime.intra_op_threads(instances, reserve=0)
    if most <= 1:
        return most, None
    say = (lambda line: print(f"[vit-fast serve] {line}", file=sys.stderr, flush=True)) if verbose else None
    return most, ThreadTuner(most, on_trial=say)
