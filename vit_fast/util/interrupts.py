"""Stopping a long run without losing what it finished: :func:`handled` makes SIGTERM raise :class:`Terminated` (as
Ctrl-C raises ``KeyboardInterrupt``) so every ``finally`` runs; a long command writes where it was cut
(:func:`cut_note`) and exits 128 + the signal (:func:`exit_status`); :func:`held` keeps both signals out while files
are rewritten. Details: docs/development.md, "Interrupts"."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(BaseException):
    """SIGTERM, raised where the run is (a BaseException, as KeyboardInterrupt is: no step's own error handling
    swallows it)."""


#: what an interrupt raises: Ctrl-C (SIGINT) and SIGTERM
INTERRUPTS: tuple[type[BaseException], ...] = (KeyboardInterrupt, Terminated)

_held = 0
_pending: int | None = None
_depth = 0
#: the last signal :func:`handled`'s handler took in the outermost block now open (None: none yet)
_received: int | None = None


def _handler(signum: int, frame) -> None:
    global _pending, _received
    _received = signum  # remembered even when a library wraps or swallows what it raises (interrupt_behind)
    if _held:
        _pending = _pending or signum  # the first one decides how the run ends
        return
    _raise(signum)


def _raise(signum: int) -> None:
    if signum == signal.SIGTERM:
        raise Terminated("SIGTERM")
    raise KeyboardInterrupt


def _is_default(sig: int, current) -> bool:
    return current is signal.default_int_handler if sig == signal.SIGINT else current == signal.SIG_DFL


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Within the block, SIGINT raises KeyboardInterrupt and SIGTERM raises :class:`Terminated`, both held back
    inside :func:`held`. Installed only in the main thread and only over a signal's default handler; the
    previous handlers come back when the block ends. Blocks nest."""
    global _depth, _received
    if _depth == 0:
        _received = None
    _depth += 1
    installed = {}
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            current = signal.getsignal(sig)
            if _is_default(sig, current):
                installed[sig] = signal.signal(sig, _handler)
    try:
        yield
    finally:
        _depth -= 1
        for sig, previous in installed.items():
            signal.signal(sig, previous)


def interrupt_behind(err: BaseException) -> BaseException | None:
    """The interrupt that ``err`` really is, or None: a KeyboardInterrupt or :class:`Terminated` a library wrapped
    in its own error (found in ``err``'s causes and contexts), or a signal :func:`handled` took while the block is
    open, whatever the library made of it (torch's exporter reports Ctrl-C as a failed trace)."""
    seen: set[int] = set()
    link: BaseException | None = err
    while link is not None and id(link) not in seen:
        if isinstance(link, INTERRUPTS):
            return link
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    if _depth and _received is not None:
        return Terminated("SIGTERM") if _received == signal.SIGTERM else KeyboardInterrupt()
    return None


@contextlib.contextmanager
def held() -> Iterator[None]:
    """SIGINT and SIGTERM held back within the block (where :func:`handled` installed its handlers) and raised
    when the outermost held block ends: the files written inside change together or not at all."""
    global _held, _pending
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        if not _held and _pending is not None:
            signum, _pending = _pending, None
            _raise(signum)


def signal_name(err: BaseException) -> str:
    """``SIGTERM`` for :class:`Terminated`, ``SIGINT`` for KeyboardInterrupt (Ctrl-C)."""
    return "SIGTERM" if isinstance(err, Terminated) else "SIGINT"


def exit_status(err: BaseException) -> int:
    """The exit status of a run an interrupt ended: 128 + the signal (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + (signal.SIGTERM if isinstance(err, Terminated) else signal.SIGINT)


def cut_note(err: BaseException, done: int, total: int | None, unit: str) -> str:
    """``interrupted by SIGTERM after 5 of 18 cases`` (``after 5 checks`` where the total is not known up front):
    what a partial report records."""
    count = f"{done} of {total}" if total is not None else str(done)
    return f"interrupted by {signal_name(err)} after {count} {unit}{'' if (total or done) == 1 else 's'}"


__all__ = [
    "INTERRUPTS",
    "Terminated",
    "cut_note",
    "exit_status",
    "handled",
    "held",
    "interrupt_behind",
    "signal_name",
]
