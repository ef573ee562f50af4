"""File names other files record, followed only inside their folder, and locks held for a process's life."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

try:  # POSIX; elsewhere a staging folder's run cannot be told gone, so none is cleaned
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]
from .base import O_NOFOLLOW, O_NONBLOCK


def contained_path(
    folder: str | os.PathLike,
    name: Any,
    *,
    source: str | os.PathLike,
    field: str,
    links_may_leave: bool = False,
) -> Path:
    """``folder / name`` for a file name that another file records (``source``: an artifact's metadata, an ONNX graph,
    a weights index; ``field``: where in it), kept inside ``folder``. A ValueError naming ``source``, ``field`` and the
    name for anything but a non-empty string, a NUL, an absolute path, a ``..`` part and, unless ``links_may_leave``
    (folders whose files are links by design), a name that resolves outside ``folder``. Nothing is opened or made;
    whether the file exists is the caller's check. The rule in full: docs/files.md."""
    folder = Path(folder)
    why = None
    if not isinstance(name, str) or not name.strip():
        why = "is not a file name"
    elif "\0" in name:
        why = "holds a NUL character"
    elif os.path.isabs(name) or name.startswith(("/", "\\")):
        why = "is an absolute path"
    elif ".." in re.split(r"[/\\]", name):
        why = "climbs out of its folder through '..'"
    elif not links_may_leave:
        root, target = os.path.realpath(folder), os.path.realpath(folder / name)
        if os.path.commonpath([root, target]) != root:
            why = f"leads out of its folder through a link (to {target!r})"
    if why is not None:
        raise ValueError(
            f"{str(source)!r}: {field} is {name!r}, which {why}; vit-fast follows only names of files "
            f"inside {str(folder) or '.'!r}: put the file there and name it relative to that folder"
        )
    return folder / name


# --------------------------------------------------------------------------- locks held for a process's life
def hold_lock(path: str | os.PathLike, note: str) -> int | None:
    """Lock the file at ``path`` for this process and write ``note`` in it (who holds it): an exclusive ``flock``,
    released when the returned descriptor is closed or the process dies (even by SIGKILL: the kernel drops it). None
    when another process holds it (its note: :func:`read_head`). The file is created with mode 0600 if missing,
    opened never through a symlink and never when it is not a regular file; it is left in place when released
    (removing a lock file lets two processes lock two files)."""
    if fcntl is None:  # pragma: no cover - Windows
        raise OSError(f"cannot lock {str(path)!r}: no flock on this platform")
    flags = os.O_RDWR | os.O_CREAT | O_NOFOLLOW | O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"lock file {str(path)!r} is not a regular file: remove it")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, note.encode(), 0)
    return fd
