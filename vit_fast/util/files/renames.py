"""Renames that cannot replace: ``renameat2(RENAME_NOREPLACE)`` / ``RENAME_EXCHANGE`` on Linux, else a hard link
then an unlink (files) or an existence check then a rename."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import stat
import sys
from pathlib import Path
from typing import Any

_AT_FDCWD = -100


_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2


#: errno values that mean "this system or file system does not do that", not "that failed"
_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, getattr(errno, "ENOTSUP", -1), getattr(errno, "EOPNOTSUPP", -1)}


@functools.cache
def _renameat2() -> Any:
    """glibc's ``renameat2`` (glibc >= 2.28, Linux >= 3.15), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


def _renameat2_flags(src: str | os.PathLike, dst: str | os.PathLike, flags: int) -> bool:
    """``renameat2(src, dst, flags)``: True when done, False where this system or file system does not support
    it; any other failure raises (FileExistsError for RENAME_NOREPLACE onto something)."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in _UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), os.fspath(src), None, os.fspath(dst))


def rename_path(src: Path, dst: Path, mode: str) -> bool:
    """Every move vit_fast.util.files makes into or out of a target goes through here (one place for fault tests):
    ``mode`` "new" (never onto something: FileExistsError), "exchange" (swap ``src`` and ``dst``; False where
    unsupported, then nothing happened) or "replace" (``os.replace``)."""
    if mode == "exchange":
        return _renameat2_flags(src, dst, _RENAME_EXCHANGE)
    if mode == "replace":
        os.replace(src, dst)
        return True
    if _renameat2_flags(src, dst, _RENAME_NOREPLACE):
        return True
    if stat.S_ISDIR(os.lstat(src).st_mode):
        # a new empty folder is made exclusively, then renamed over: a rename replaces an empty folder only,
        # so whatever someone puts there in between makes it fail (ENOTEMPTY) instead of being lost
        os.mkdir(dst)
        try:
            os.rename(src, dst)
        except OSError:
            with contextlib.suppress(OSError):
                os.rmdir(dst)  # only while still empty
            raise
        return True
    try:
        os.link(src, dst, follow_symlinks=False)  # fails on anything at dst
    except FileExistsError:
        raise
    except OSError as err:
        if err.errno not in _UNSUPPORTED | {errno.EPERM, errno.EMLINK, errno.EXDEV}:
            raise
        # no hard links on this file system: check, then rename (a file made in between would be replaced)
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(dst)) from None
        os.rename(src, dst)
        return True
    os.unlink(src)
    return True
