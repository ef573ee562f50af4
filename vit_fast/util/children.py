"""Child processes that die with the run that started them: the one way vit-fast starts a Python child (the demo and
the doctor run Triton's interpreter in one). A child started through :func:`guarded_python` runs :data:`GUARD` first:
it exits with 143 once its parent is gone (``PR_SET_PDEATHSIG`` where Linux has it, and a watch every second),
removing the folder it was given, then runs ``python -m MODULE ARGS``. How: docs/development.md, "Child processes"."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

#: the first code a guarded child runs (``python -c GUARD PARENT_PID CLEANUP MODULE ARGS...``); stdlib only, so it
#: is in place before the child spends seconds importing torch
GUARD = """
import os, signal, sys, threading
parent, cleanup = int(sys.argv[1]), sys.argv[2]
def leave(*_):
    import time
    for _ in range(200):  # a parent's other threads may still be exiting: it is gone once it is no longer the parent
        if os.getppid() != parent:
            if cleanup:
                import shutil
                shutil.rmtree(cleanup, ignore_errors=True)
            break
        time.sleep(0.05)
    os._exit(128 + signal.SIGTERM)
signal.signal(signal.SIGTERM, leave)
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != parent:
    leave()
def watch():
    import time
    while os.getppid() == parent:
        time.sleep(1.0)
    leave()
threading.Thread(target=watch, name="vit-fast-parent-watch", daemon=True).start()
import runpy
sys.argv = sys.argv[3:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def guarded_python(module_args: Sequence[str], cleanup: str | os.PathLike | None = None) -> list[str]:
    """The command line of a child that runs ``python -m MODULE ARGS`` (``module_args`` is ``[MODULE, *ARGS]``)
    and dies with this process (:data:`GUARD`); ``cleanup``: a folder it removes when this process is gone."""
    return [sys.executable, "-c", GUARD, str(os.getpid()), os.fspath(cleanup or ""), *module_args]
