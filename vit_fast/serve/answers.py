"""Each request of a served batch answered on its own: a request the model cannot take gets its own error response
(a message, never a traceback or a path) and fails only itself; the console gets one line per refused request, at
most one a second (the rest counted and named in the next line). How the error reaches Triton through PyTriton 0.7:
docs/deploy.md, "Refused requests"."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import torch

from vit_fast.model.vit import VisionTransformer
from vit_fast.serve.settings import REFUSED_KEY
from vit_fast.serve.threads import ThreadTuner
from vit_fast.serve.variable import forward_requests, request_problem

#: seconds between two console lines about refused requests
LINE_EVERY_S = 1.0


def refused(message: str) -> dict[str, Any]:
    """The response of one refused request: its error message, nothing else."""
    import numpy as np

    return {REFUSED_KEY: np.frombuffer(message.encode("utf-8", "replace"), dtype=np.uint8).copy()}


def failure_message(err: BaseException) -> str:
    """What a client is told when serving its batch failed on ``err``: our own checks' ValueError as it is, anything
    else by its type only (its text may name the server's files; the console has it)."""
    if isinstance(err, ValueError):
        return str(err)
    return f"the server failed to run this request's batch ({type(err).__name__}); its console says why"


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


def answer_each(
    requests: Sequence[Any], output_name: str, serve: Callable[[], list[dict[str, Any]]], log: RefusalLog
) -> list[dict[str, Any]]:
    """``serve()``'s answers for ``requests``, or, where it raises, each request answered with the failure's message
    (:func:`failure_message`; the console gets one line with its text, never a traceback)."""
    try:
        return serve()
    except Exception as err:
        log.note(f"a batch of {len(requests)} request(s) failed: {type(err).__name__}: {err}")
        return [refused(failure_message(err)) for _ in requests]


def answer_stacked(
    requests: Sequence[Any], input_name: str, output_name: str, infer: Callable[[Any], dict[str, Any]]
) -> list[dict[str, Any]]:
    """Requests of one image size (Triton checked each against the config): their images stacked into one batch
    for ``infer`` (``{input: [B, C, H, W]}`` -> ``{output: [B, N]}``), whose rows go back to each request in order."""
    import numpy as np

    arrays = [request[input_name] for request in requests]
    rows = infer(np.concatenate(arrays))[output_name]  # a copy: PyTriton's arrays are read-only
    bounds = np.cumsum([0, *(len(a) for a in arrays)])
    return [{output_name: rows[i:j]} for i, j in zip(bounds[:-1], bounds[1:], strict=True)]


def answer_ragged(
    model: VisionTransformer,
    requests: Sequence[Any],
    names: tuple[str, str],
    max_side: int,
    tuner: ThreadTuner | None,
    log: RefusalLog,
) -> list[dict[str, Any]]:
    """A ragged batch (``--variable-size``; ``names``: the input and the output): every request is checked before any
    work (:func:`vit_fast.serve.variable.request_problem`); one the model cannot take gets its own error response and
    a console line, and the others' images run as one packed forward on the tuner's threads."""
    if not requests:
        raise ValueError("empty batch: no request to serve")
    input_name, output_name = names
    arrays = [request[input_name] for request in requests]
    problems = [request_problem(model, a, input_name, max_side) for a in arrays]
    for problem in filter(None, problems):
        log.note(problem)
    taken = [a for a, problem in zip(arrays, problems, strict=True) if problem is None]
    rows: list[Any] = []
    if taken:
        counts = [len(a) for a in taken]
        threads = None if tuner is None else tuner.threads_for(sum(counts))
        try:
            if threads is not None and torch.get_num_threads() != threads:  # per thread: each instance sets its own
                torch.set_num_threads(threads)
            rows = forward_requests(model, taken, counts)
        finally:
            if tuner is not None:
                tuner.finished()
    rows.reverse()
    return [{output_name: rows.pop()} if problem is None else refused(problem) for problem in problems]


__all__ = [
    "LINE_EVERY_S",
    "REFUSED_KEY",
    "RefusalLog",
    "answer_each",
    "answer_ragged",
    "answer_stacked",
    "failure_message",
    "refused",
]
