"""Stopping a run: Ctrl-C (SIGINT) and SIGTERM (what ``timeout`` sends) raise where the run is, are held back while
files change, and end ``vit-fast`` with 130 or 143 (vit_fast.interrupts)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from vit_fast import interrupts


# ------------------------------------------------------------------------------ vit_fast.interrupts itself
def test_sigterm_raises_and_is_held_while_files_change():
    with interrupts.handled():
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        with pytest.raises(interrupts.Terminated):
            with interrupts.held():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # delivered, and held: the block runs to its end
                reached = True
        assert reached
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers it installed are gone again
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_handler_someone_else_set_is_kept():
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda *_: seen.append("theirs"))
    try:
        with interrupts.handled():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        assert seen == ["theirs"]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_exit_statuses_and_notes():
    assert interrupts.exit_status(KeyboardInterrupt()) == 130 and interrupts.exit_status(interrupts.Terminated()) == 143
    assert interrupts.cut_note(interrupts.Terminated(), 5, 18, "case") == "interrupted by SIGTERM after 5 of 18 cases"
    assert interrupts.cut_note(KeyboardInterrupt(), 1, None, "check") == "interrupted by SIGINT after 1 check"
