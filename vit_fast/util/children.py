"""Child processes that die with the run that started them: the one way vit-fast starts a Python child.

The demo and the doctor run Triton's interpreter in a child (``TRITON_INTERPRET=1`` must be set before triton is
first imported). A child started through :func:`guarded_python` runs :data:`GUARD` before anything else, which:

- asks the kernel to send it SIGTERM when its parent dies, even by SIGKILL (``PR_SET_PDEATHSIG``, Linux; the
  kernel ties it to the parent *thread* that started the child: start children from the main thread);
- checks that its parent is still the process that started it (the parent may have died before that request),
  and checks again every second on a thread of its own (the only watch where there is no ``prctl``);
- on SIGTERM, or once its parent is gone, exits with 143; when its parent is gone, it first removes the folder it
  was given (the parent's temporary folder: nobody else would remove it now; a parent that lives removes its
  own, and a killed run's left over is removed by the next run, see :func:`vit_fast.util.files.temp_staging`). The
  kernel sends the signal when the parent's thread that started the child exits, which may be while the parent's
  other threads are still exiting (a SIGKILLed parent with torch's threads, slow on a loaded machine): the
  child waits up to 10 s for its parent to be gone for good before it decides;
- then runs ``python -m MODULE ARGS`` as Python would.
"""

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
