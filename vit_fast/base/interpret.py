"""The one interpreter flag, and whether the interpreter can run our kernels in this environment. Imports nothing but
:mod:`.switches` and :mod:`.versions` (not even triton), so code that only asks whether the kernels would run in
Triton's CPU interpreter can ask without importing them."""

from __future__ import annotations

import functools

from .switches import environ_value, parse_triton_interpret
from .versions import interpreter_problem

_READ: dict[str | None, bool] = {}  # raw TRITON_INTERPRET -> flag (read on every launch)


def interpreter_enabled() -> bool:
    """True when ``TRITON_INTERPRET`` is on as Triton reads it (1, true, yes, on, y): Triton kernels run on the
    CPU through NumPy (read per call). Raises :class:`~.switches.SwitchError` for a value Triton would read as
    off that is not plainly off (``banana``, ``' 1'``)."""
    raw = environ_value("TRITON_INTERPRET")
    flag = _READ.get(raw)
    if flag is None:
        flag = _READ[raw] = parse_triton_interpret(raw)
    return flag


@functools.cache
def interpreter_version_problem() -> str | None:
    """Why Triton's interpreter cannot run our kernels with the installed triton and numpy, with the fix
    (:func:`.versions.interpreter_problem`); None when it can. Read once per process: installed versions do not
    change under it."""
    return interpreter_problem()
