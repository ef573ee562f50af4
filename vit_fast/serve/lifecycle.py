"""What a served Triton leaves and what happens when it dies: each server's private folder (PyTriton's workspaces and
Triton's logs), found and removed by the next server when its own was killed, and a bounded number of restarts of a
Triton that exited by itself, each said on stderr. Why: docs/deploy.md, "Refused requests"."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

#: the name of a server's private folder: a locked staging folder ``$TMPDIR/.vit-fast-serve.tmp-TOKEN``
WORKSPACE_NAME = "vit-fast-serve"
#: the longest path of a unix socket Linux takes (``sun_path`` is 108 bytes with its final NUL); PyTriton 0.7 makes
#: its sockets in its workspace, named after the model and its instances
SOCKET_PATH_MAX = 107
#: a Triton that exits by itself is restarted, at most RESTARTS times within RESTART_WINDOW_S seconds
RESTARTS, RESTART_WINDOW_S = 3, 600.0


def private_folder(stack: contextlib.ExitStack, socket: str, name: str = WORKSPACE_NAME) -> Path:
    """A private folder for one server (:func:`vit_fast.util.files.temp_staging`: mode 0700, its marker locked for
    this process's life), removed when ``stack`` closes; the folders of killed servers (the marker proves them
    vit-fast's, the free lock their run gone) are removed first, and named on stderr. An OSError where ``socket``
    (the longest socket path inside it) would be too long for a unix socket."""
    from vit_fast.util.files import clean_stale_staging, temp_staging

    removed = [p for p in clean_stale_staging(tempfile.gettempdir()) if name in p.name]
    if removed:
        print(
            f"[vit-fast serve] removed {len(removed)} folder(s) that killed vit-fast serve runs left: "
            + ", ".join(map(str, removed)),
            file=sys.stderr,
            flush=True,
        )
    folder = stack.enter_context(temp_staging(name))
    if len(os.fsencode(folder / socket)) > SOCKET_PATH_MAX:
        stack.close()
        raise OSError(
            f"the temporary folder {tempfile.gettempdir()} is too deep for the sockets of the server's python backend "
            f"({folder / socket} is over {SOCKET_PATH_MAX} bytes): set TMPDIR to a shorter folder (or a shorter --name)"
        )
    return folder


class Restarts:
    """How many times a Triton that exited by itself is started again: at most ``limit`` within ``window_s``
    seconds (then it keeps dying, and the server stops, saying why)."""

    def __init__(self, limit: int = RESTARTS, window_s: float = RESTART_WINDOW_S) -> None:
        self.limit = limit
        self.window_s = window_s
        self.times: list[float] = []

    def allow(self, why: str) -> bool:
        """Whether to restart now; says so, with ``why`` and the count, on stderr when it does."""
        now = time.monotonic()
        self.times = [t for t in self.times if now - t < self.window_s]
        if len(self.times) >= self.limit:
            return False
        self.times.append(now)
        print(
            f"[vit-fast serve] {why}; restarting it ({len(self.times)} of at most {self.limit} restarts in "
            f"{self.window_s:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
        return True


__all__ = ["RESTARTS", "RESTART_WINDOW_S", "SOCKET_PATH_MAX", "WORKSPACE_NAME", "Restarts", "private_folder"]
