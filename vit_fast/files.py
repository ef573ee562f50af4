"""The one way to write files: all of it or nothing at the target path, and never over a file we did not make.

``write_atomic`` writes one file; ``staging_dir`` + ``publish`` write several (an artifact, its data,
its metadata, a report) in a private folder beside each target and move them into place only at the
end. A move replaces a previous file in one ``os.replace``; if a later move of the same set fails, the
previous files are put back, so a failure leaves every target as it was. Staging folders are named
``.NAME.tmp-*`` beside the target and hold a lock file (``.owner``) that their run keeps locked while
it lives: ``clean_stale_staging`` removes those whose run is gone (killed, even by SIGKILL) at once,
and unlocked ones of the same name after an hour.

``check_output_file`` is the one check of an output path made before any work: the suffix, a folder
in the way, a parent that is a file, a folder that cannot be written, and an existing file that vit-fast
did not write (``written_by_vit_fast`` reads the marker every JSON of ours carries).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

try:  # POSIX; elsewhere staging folders are cleaned by age only
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

STAGING_MARK = ".tmp-"
#: the lock file inside a staging folder, locked (flock) by the run that owns the folder
OWNER_FILE = ".owner"
#: the key every JSON file vit-fast writes carries (metadata beside an artifact, verify and bench reports)
MARKER_KEY = "vit_fast_version"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def finish_atomic(tmp: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Give ``tmp`` (written beside ``path``) ordinary permissions and rename it to ``path``."""
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)
    return Path(path)


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through a staging folder beside it, then rename it over ``path``.

    A failure (or a kill) leaves ``path`` as it was; the staging folder is removed (a killed run's by the
    next write). The result gets an ordinary file's permissions. Missing parent folders are made.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with staging_dir(path) as tmp:
        staged = tmp / path.name
        staged.write_bytes(data.encode() if isinstance(data, str) else data)
        publish_to([(staged, path)])
    return path


def json_text(data: Any) -> str:
    """``data`` as the indented, key-sorted JSON text every JSON file of ours holds (non-JSON values as text)."""
    return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"


def write_json_atomic(data: Any, path: str | os.PathLike) -> Path:
    """Write ``data`` as indented JSON (non-JSON values as text) to ``path``, atomically."""
    return write_atomic(path, json_text(data))


# --------------------------------------------------------------------------- staging
def _owner_gone(folder: Path) -> bool | None:
    """Whether the run that made staging ``folder`` is gone: True (its lock is free), False (held), None
    (no lock file, or no flock here: cannot tell)."""
    lock = folder / OWNER_FILE
    if fcntl is None or not lock.is_file():
        return None
    try:
        fd = os.open(lock, os.O_RDONLY)
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


def clean_stale_staging(folder: str | os.PathLike, name: str, older_than_s: float = 3600.0) -> list[Path]:
    """Remove staging folders in ``folder`` that a killed run left behind; returns those removed.

    Any ``.*.tmp-*`` folder whose ``.owner`` lock is free goes at once (its run is gone: the kernel drops
    a dead process's locks); one of ``name``'s without a lock file goes when older than ``older_than_s``.
    A folder whose run still holds its lock is never touched.
    """
    removed = []
    now = time.time()
    mine = set(glob.glob(os.path.join(glob.escape(str(folder)), f".{glob.escape(name)}{STAGING_MARK}*")))
    for p in glob.glob(os.path.join(glob.escape(str(folder)), f".*{STAGING_MARK}*")):
        path = Path(p)
        with contextlib.suppress(OSError):
            if not path.is_dir() or path.is_symlink():
                continue
            gone = _owner_gone(path)
            if gone or (gone is None and p in mine and now - path.stat().st_mtime > older_than_s):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def _take_ownership(folder: Path) -> int | None:
    """Lock ``folder/.owner`` for this process (the kernel releases it when the process dies).

    The lock file is made and locked under another name, then renamed, so a cleaner never finds an
    ``.owner`` that is not yet locked."""
    if fcntl is None:
        return None
    fd = os.open(folder / ".owner-init", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(folder / ".owner-init", folder / OWNER_FILE)
    except OSError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def staging_dir(target: str | os.PathLike) -> Iterator[Path]:
    """A private temporary folder beside ``target``, locked for this run; removed with everything in it on exit.

    Files are written there under their final names and moved into place with :func:`publish` /
    :func:`publish_to` (``os.replace`` within one file system). Stale folders of earlier, killed runs
    are cleaned first.
    """
    target = Path(target)
    clean_stale_staging(target.parent, target.name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}{STAGING_MARK}", dir=target.parent))
    fd = _take_ownership(tmp)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if fd is not None:
            os.close(fd)


def _keep_previous(dst: Path, staging: Path) -> Path | None:
    """A second name for the file at ``dst`` inside ``staging`` (a hard link, else a copy), or None when
    there is no file there; it lets a failed publish put the previous file back."""
    if not (dst.is_file() or dst.is_symlink()):
        return None
    keep = staging / f".previous-{dst.name}"
    try:
        os.link(dst, keep, follow_symlinks=False)
    except OSError:
        shutil.copy2(dst, keep, follow_symlinks=False)
    return keep


def publish_to(moves: Sequence[tuple[Path, Path]]) -> list[Path]:
    """Move each staged file over its target, in order (data first, the artifact, its metadata, reports last).

    Each staged file must lie in a staging folder beside its target (one file system). A target is
    replaced only by the move itself. If a move fails, the targets this call already replaced get their
    previous file back (or are removed where there was none), so no target is left half-updated.
    """
    done: list[tuple[Path, Path | None]] = []
    try:
        for src, dst in moves:
            src, dst = Path(src), Path(dst)
            previous = _keep_previous(dst, src.parent)
            finish_atomic(src, dst)
            done.append((dst, previous))
    except BaseException:
        for dst, previous in reversed(done):
            with contextlib.suppress(OSError):
                if previous is not None:
                    os.replace(previous, dst)
                else:
                    dst.unlink(missing_ok=True)
        raise
    return [dst for dst, _ in done]


def publish(staged: Sequence[Path], folder: str | os.PathLike) -> list[Path]:
    """Move staged files into ``folder`` under their own names, in order; see :func:`publish_to`."""
    return publish_to([(Path(src), Path(folder) / Path(src).name) for src in staged])


# --------------------------------------------------------------------------- output checks
def read_json_object(path: str | os.PathLike) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when it is not a readable JSON object (never raises)."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(64 * 2**20).decode())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def written_by_vit_fast(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a JSON file vit-fast wrote: an object with the ``vit_fast_version`` marker, or
    a report from before the marker (a verify report's ``artifact``/``rule``/``rows``, a bench report's
    ``schema``/``environment``/``rows``)."""
    data = read_json_object(path)
    if data is None:
        return False
    return (
        MARKER_KEY in data
        or {"artifact", "rule", "rows"} <= set(data)
        or {"schema", "environment", "rows"} <= set(data)
    )


def _nearest_existing(folder: Path) -> Path:
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def _check_folder(path: Path, what: str, make_parents: bool) -> None:
    folder = path.parent if str(path.parent) else Path(".")
    existing = _nearest_existing(folder)
    if existing.exists() and not existing.is_dir():
        raise ValueError(
            f"{what} {str(path)!r}: {str(existing)!r} is a file, not a folder, so nothing can be written under it; "
            "choose a path in a folder"
        )
    if existing != folder and not make_parents:
        raise ValueError(
            f"output folder {str(folder)!r} for {what} {str(path)!r} does not exist: "
            f"create it first (mkdir -p {folder})"
        )
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ValueError(
            f"output folder {str(existing)!r} for {what} {str(path)!r} cannot be written: {err.strerror or err}; "
            "choose a folder you can write to"
        ) from err


def check_output_file(
    path: str | os.PathLike,
    suffixes: Sequence[str],
    what: str,
    *,
    ours: Callable[[Path], bool] | None = written_by_vit_fast,
    overwrite: bool = False,
    make_parents: bool = False,
) -> Path:
    """The output ``path``, after every check that can be made before any work; a ValueError naming the
    path and the fix otherwise.

    Refused: a suffix not in ``suffixes`` (compared case-insensitively); a folder at ``path``; a parent
    that is a regular file; a missing folder (unless ``make_parents``: then the nearest existing folder
    must be writable); a folder that cannot be written; an existing file for which ``ours(path)`` is
    False, unless ``overwrite`` (``ours=None`` accepts any existing file).
    """
    path = Path(path)
    if path.is_dir():
        example = str(path / ("model" + suffixes[0]))
        raise ValueError(f"{what} {str(path)!r} is a folder; give a file path such as {example!r}")
    wanted = tuple(s.lower() for s in suffixes)
    if not path.name.lower().endswith(wanted):
        names = " or ".join(f"{path.stem}{s}" for s in suffixes)
        raise ValueError(
            f"{what} {str(path)!r} has the wrong suffix {path.suffix!r}: a {what} is written as "
            f"{'/'.join(suffixes)} (e.g. {names})"
        )
    _check_folder(path, what, make_parents)
    if (path.exists() or path.is_symlink()) and not overwrite and ours is not None and not ours(path):
        raise ValueError(
            f"{what} {str(path)!r} exists and was not written by vit-fast; refusing to replace it: choose another "
            "path, or allow replacing it (overwrite=True; --overwrite on the command line)"
        )
    return path


def check_output_dir(path: str | os.PathLike, what: str = "output folder") -> Path:
    """A folder to write into: an existing writable folder, or one that can be made (not yet made here)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} {str(path)!r} is a file, not a folder: give a folder path")
    _check_folder(path / "probe", what, make_parents=True)
    return path
