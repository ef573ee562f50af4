"""Reading a file's head without following it into a FIFO or device: the kind of a special file and its first bytes."""

from __future__ import annotations

import os
import stat

from .base import O_NONBLOCK

_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}


def special_kind(path: str | os.PathLike) -> str | None:
    """What ``path`` is when it exists and is neither a regular file nor a symlink ("a FIFO (named pipe)",
    "a character device", ...); None otherwise. Decided by ``lstat`` alone: nothing is opened."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
        return None
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def read_head(path: str | os.PathLike, limit: int) -> bytes | None:
    """Up to ``limit`` bytes of ``path`` when it is (or links to) a regular file; None otherwise (never raises).
    Anything that is not a regular file is never opened (``stat`` first, ``fstat`` again after opening)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)
