"""Staging folders: made exclusively beside a target (``.NAME.tmp-TOKEN``, mode 0700) with a locked ``.owner``
marker, and cleaned only when the marker proves them ours and their run is gone."""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

try:  # POSIX; elsewhere a staging folder's run cannot be told gone, so none is cleaned
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]
from .base import NAME_MAX, O_NOFOLLOW, O_NONBLOCK, OWNER_FILE, OWNER_TEXT, STAGING_MARK, TOKEN_HEX, writing_in


def fitted_name(prefix: str, target_name: str, tail: str) -> str:
    """``PREFIX + NAME + TAIL``, NAME cut (never the tail) so that the name fits :data:`NAME_MAX` bytes."""
    room = NAME_MAX - len(os.fsencode(prefix + tail))
    stem = target_name
    while len(os.fsencode(stem)) > room:
        stem = stem[:-1]
    return f"{prefix}{stem}{tail}"


def _staging_name(target_name: str, token: str) -> str:
    """``.NAME.tmp-TOKEN``, NAME cut (never the token) so that the name fits :data:`NAME_MAX` bytes."""
    return fitted_name(".", target_name, f"{STAGING_MARK}{token}")


#: a staging name: ``.NAME.tmp-TOKEN``, groups (NAME as cut to fit, TOKEN)
STAGING_NAME_RE = re.compile(rf"^\.(.*){re.escape(STAGING_MARK)}([0-9a-f]{{{TOKEN_HEX}}})$", re.DOTALL)


def _marker_token(folder: Path) -> str | None:
    """The token in ``folder``'s marker, read without following a link or opening anything but a regular file."""
    marker = folder / OWNER_FILE
    try:
        if not stat.S_ISREG(os.lstat(marker).st_mode):
            return None
        fd = os.open(marker, os.O_RDONLY | O_NOFOLLOW | O_NONBLOCK)
    except OSError:
        return None
    try:
        text = os.read(fd, 256).decode("ascii", "replace")
    finally:
        os.close(fd)
    return text[len(OWNER_TEXT) :].strip() if text.startswith(OWNER_TEXT) else None


def _owner_gone(folder: Path) -> bool | None:
    """Whether the run that made staging ``folder`` is gone: True (its lock is free), False (held), None
    (no marker, or no flock here: cannot tell)."""
    lock = folder / OWNER_FILE
    if fcntl is None:
        return None
    try:
        fd = os.open(lock, os.O_RDONLY | O_NOFOLLOW | O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        return None
    finally:
        os.close(fd)  # closing drops the probe's own lock
    return True


def is_our_staging(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is a staging folder vit-fast made: a real folder (not a link) of this user named
    ``.*.tmp-TOKEN`` whose marker holds that same TOKEN. A name alone proves nothing."""
    folder = Path(folder)
    match = STAGING_NAME_RE.match(folder.name)
    if match is None:
        return False
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
        return False
    return _marker_token(folder) == match.group(2)


def clean_stale_staging(folder: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Remove the staging folders in ``folder`` that a killed run of vit-fast left behind; returns those removed. A
    folder goes only when its marker proves vit-fast made it (:func:`is_our_staging`) and its lock is free (the
    kernel drops a dead process's locks); one that merely looks like ours (name, ``.owner`` file, age) or holds
    kept results (``NAME.unpublished-TOKEN``) is never touched. ``name`` (the target a run writes) is accepted for
    callers that name it; every dead run's folder is cleaned either way."""
    removed = []
    for p in glob.glob(os.path.join(glob.escape(str(folder)), f".*{STAGING_MARK}*")):
        path = Path(p)
        with contextlib.suppress(OSError):
            if is_our_staging(path) and _owner_gone(path):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def _take_ownership(folder: Path, token: str) -> int | None:
    """Write ``folder``'s marker (holding ``token``) and lock it for this process (the kernel releases the
    lock when the process dies).

    The marker is made and locked under another name, then renamed, so a cleaner never finds a marker
    that is not yet locked."""
    init = folder / ".owner-init"
    fd = os.open(init, os.O_CREAT | os.O_EXCL | os.O_RDWR | O_NOFOLLOW, 0o600)
    try:
        os.write(fd, (OWNER_TEXT + token + "\n").encode())
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(init, folder / OWNER_FILE)
    except OSError:
        os.close(fd)
        raise
    return fd


def make_staging(parent: str | os.PathLike, target_name: str) -> tuple[Path, int]:
    """Make a new staging folder in ``parent`` for ``target_name`` with its marker locked; returns the folder
    and the lock's descriptor (close it after removing the folder). Made exclusively, mode 0700. A folder
    that cannot be written raises :class:`OutputNotWritable` naming it."""
    while True:
        token = secrets.token_hex(TOKEN_HEX // 2)
        folder = Path(parent) / _staging_name(target_name, token)
        try:
            with writing_in(parent):
                os.mkdir(folder, 0o700)
            break
        except FileExistsError:  # pragma: no cover - a 64-bit token taken: draw again
            continue
    try:
        return folder, _take_ownership(folder, token)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


#: the errors of a disk, not of a file: a message names the user's path where they strike inside a staging folder
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO)


@contextlib.contextmanager
def user_paths(staging: Path, target: Path) -> Iterator[None]:
    """Within the block, an OSError of the disk (a full disk, a quota) met inside ``staging`` names the user's path:
    ``staging/REL`` as the ``REL`` beside it (where the file is published), none (a write's error carries no name)
    as ``target``; never the staging folder's private name."""
    try:
        yield
    except OSError as err:
        if err.errno not in DISK_ERRNOS or not isinstance(err.filename, (str, os.PathLike, type(None))):
            raise
        name = None if err.filename is None else Path(os.fspath(err.filename))
        if name is not None and name != staging and staging not in name.parents:
            raise
        named = target if name is None or name == staging else staging.parent / name.relative_to(staging)
        raise OSError(err.errno, err.strerror or os.strerror(err.errno), str(named)) from err


@contextlib.contextmanager
def staging_dir(target: str | os.PathLike) -> Iterator[Path]:
    """A private temporary folder beside ``target``, locked for this run; removed with everything in it on exit.

    Files are written there under their final names and moved into place with :func:`publish_to`. Stale
    folders of earlier, killed runs are cleaned first.
    """
    target = Path(target)
    clean_stale_staging(target.parent)
    tmp, fd = make_staging(target.parent, target.name)
    try:
        with user_paths(tmp, target):
            yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(fd)


@contextlib.contextmanager
def temp_staging(name: str) -> Iterator[Path]:
    """A private working folder in the system's temporary folder (``$TMPDIR/.NAME.tmp-TOKEN``), made, locked and
    removed as :func:`staging_dir` does beside a target: removed on the way out (an exception, Ctrl-C, SIGTERM
    through the CLI), and one a killed run left behind is found and removed by the next run that makes one (its
    marker proves it vit-fast's, its free lock that its run is gone). For everything vit-fast writes that is
    not an output: the bench's exports, the interpreter child's files."""
    with staging_dir(Path(tempfile.gettempdir()) / name) as folder:
        yield folder
