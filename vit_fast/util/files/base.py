"""The names every file vit-fast writes carries, the errors a writer raises, the process's umask, and the
standard streams (closed or nulled at start) as a writer sees them."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import IO

try:  # POSIX; elsewhere a staging folder's run cannot be told gone, so none is cleaned
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


STAGING_MARK = ".tmp-"


#: what a staging folder becomes when its files could not be published: kept beside the target, named in the error
KEPT_MARK = ".unpublished-"


#: the marker inside a staging folder: it holds the folder's token and is locked (flock) by the run that owns it
OWNER_FILE = ".owner"


#: what the marker holds before the token
OWNER_TEXT = "vit-fast staging folder "


#: the key every JSON file vit-fast writes carries (metadata beside an artifact, verify and bench reports)
MARKER_KEY = "vit_fast_version"


#: the key of the SHA-256 every JSON object vit-fast writes carries: the file's bytes, this value read as zeros
DIGEST_KEY = "vit_fast_digest"


#: the PNG text key (and the start of its value) every picture vit-fast draws carries
PNG_KEY, PNG_VALUE = "Software", "vit-fast"


#: the PNG text key of the SHA-256 of the PNG's bytes without that chunk
PNG_DIGEST_KEY = "vit-fast-sha256"


#: the comment every Markdown report of ours ends with (the version and the digest follow it)
MARKDOWN_MARK = "<!-- written by vit-fast"


#: the longest file name (bytes) most file systems take; staging names are cut to fit it
NAME_MAX = 255


#: hex digits in a staging name's random token (``.NAME.tmp-TOKEN``)
TOKEN_HEX = 16


#: the digest field's value while a file's own sha256 is computed over it (the sealed file holds the real one)
ZERO_DIGEST = "0" * 64


#: ``os.O_NOFOLLOW`` where the platform has it, else 0 (no flag)
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


#: ``os.O_NONBLOCK`` where the platform has it, else 0 (no flag)
O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class OutputChanged(FileExistsError):
    """A target changed between the check made before the work and the publish: something appeared where
    nothing was, or the file (folder) checked was replaced or edited. Nothing was replaced; the message
    says where this run's result was kept (or that it was removed)."""


class OutputNotWritable(PermissionError):
    """A folder or file cannot be written (permissions, an immutable attribute); the message names it and the fix."""


def current_umask() -> int:
    """The process's umask (read by setting it, so it is set back at once)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def stdout_to_null(fd: int) -> None:
    """Point file descriptor ``fd`` (stdout, whose reader went away; or a standard stream that is closed) at the
    null device, so nothing later written or flushed there can fail and no file opened later takes its number;
    no file is written. (When ``fd`` is closed, opening the null device may take that number itself.)"""
    null = os.open(os.devnull, os.O_RDWR)
    if null == fd:
        return
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[IO[str] | None]:
    """While held, file descriptor 1 points where stderr (fd 2) does, so what a child process or native code writes
    to standard output goes to stderr; yields a text stream on the real standard output (a duplicate of fd 1 made
    first), or None where fd 1 or fd 2 cannot be duplicated (closed). On exit the stream is closed and fd 1 put
    back. No file is opened by name or written."""
    try:
        saved = os.dup(1)
    except OSError:
        yield None
        return
    try:
        os.dup2(2, 1)
    except OSError:
        os.close(saved)
        yield None
        return
    kept = open(saved, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 - closed below
    try:
        yield kept
    finally:
        try:
            with contextlib.suppress(OSError):  # a write that failed has raised already
                kept.close()
        finally:
            os.dup2(saved, 1)
            os.close(saved)


@contextlib.contextmanager
def writing_in(folder: str | os.PathLike, doing: str = "write in") -> Iterator[None]:
    """Turn a permission error met while writing in ``folder`` into one naming it and the fix."""
    try:
        yield
    except PermissionError as err:
        if isinstance(err, OutputNotWritable):
            raise
        raise OutputNotWritable(
            f"cannot {doing} folder {os.fspath(folder)!r}: {err.strerror or 'permission denied'} (its permissions, "
            "or an immutable or append-only attribute); choose a folder you can write to, or change its permissions"
        ) from err


_STREAMS = ((0, "stdin", os.O_RDONLY), (1, "stdout", os.O_WRONLY), (2, "stderr", os.O_WRONLY))


def _stream_flags(fd: int) -> int | None:
    """The status flags of ``fd``; None when it is closed; -1 where they cannot be read (no fcntl)."""
    try:
        if fcntl is None:  # pragma: no cover - Windows: only a closed stream is found
            os.fstat(fd)
            return -1
        return fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError:
        return None


#: the standard streams :func:`usable_standard_streams` pointed at the null device in this process
_NULLED: set[str] = set()


def nulled_streams() -> frozenset[str]:
    """The standard streams (``"stdout"``, ...) found closed or open the wrong way and pointed at the null device
    (:func:`usable_standard_streams`): what is written there is lost, so a report asked for there is refused."""
    return frozenset(_NULLED)


def usable_standard_streams() -> list[str]:
    """Point each standard stream that is closed (``>&-``), or open only the other way (stdout read-only,
    ``1</dev/null``), at the null device, and give Python a stream object for one it found closed at start-up;
    returns what was wrong, one phrase a stream (``"stdout is closed"``). Afterwards nothing written or flushed
    there fails, and no file opened later takes a standard stream's number (a child would print into it)."""
    import sys

    done = []
    for fd, name, mode in _STREAMS:
        flags = _stream_flags(fd)
        if flags is None:
            problem = "is closed"
        elif flags >= 0 and (flags & os.O_ACCMODE) not in (mode, os.O_RDWR):
            problem = f"is open for {'reading' if mode == os.O_WRONLY else 'writing'} only"
        else:
            continue
        stdout_to_null(fd)
        _NULLED.add(name)
        if getattr(sys, name) is None:  # Python found it closed at start-up
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))  # noqa: SIM115 (the process's own)
        done.append(f"{name} {problem}")
    return done
