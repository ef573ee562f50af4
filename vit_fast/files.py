"""The one way to write files: all of it or nothing at the target path, and never over a file we did not make.

The policy, the same for every writer (export, verify, bench, demo, doctor, serve, ``save_checkpoint``, the API):

- ``check_output_file`` (``check_files_in``, ``check_report_file``, ``claim_folder``) runs before any work.
  A path that is not a regular file (a FIFO, a device, a socket) is refused from ``lstat`` alone, never
  opened. The folders on the way are found with ``lstat`` and their links resolved: a link that dangles
  (a drive not mounted) or loops is refused by name, as is a folder that cannot be written (a probe file
  is made and removed). A suffix rule sees the final name (``.onnx`` alone has no name before its suffix).
  An existing file is replaced only when the file itself proves vit-fast wrote it, as it wrote it
  (:func:`written_by_vit_fast`: a digest of the file's own bytes that the file carries, see below; callers
  pass their own proof for artifacts and checkpoints), never because of a marker alone, a neighbouring
  file or a name; anything else needs ``overwrite=True`` (``--overwrite``). A symlink at the path is
  replaced, never written through. ``check_report_file`` adds that a report never lands on an artifact's
  own metadata (``m.onnx.json``).
- The check *claims* each target: it remembers what was there (nothing, or which file by device, inode,
  type, size and mtime; for a folder, every entry below it). Publishing re-checks the claim at the moment
  of the move: a target that did not exist must still not exist (the move is a rename that cannot replace:
  ``renameat2(RENAME_NOREPLACE)`` on Linux, else a hard link then an unlink for files, or a new empty
  folder then a rename over it for folders; where a file system has neither, an existence check then a
  rename, which a file created in between would lose), and a file that was there must still be the same
  file (it is swapped out with ``renameat2(RENAME_EXCHANGE)`` and the file swapped out is compared, so
  exactly the file checked is replaced; without the exchange, it is compared just before the rename).
  Anything else refuses with :class:`OutputChanged`: the target stays as it is, the targets of the same
  set already moved are put back, and this run's files are kept in a folder beside the target that the
  message names (``NAME.unpublished-TOKEN``). A target published without a check first must be new, or
  prove itself vit-fast's by its digest at that moment. ``overwrite`` replaces whatever is there then.
- ``write_atomic`` writes one file; ``staging_dir`` + ``publish_to`` write several (an artifact, its data,
  its metadata, a report) in a private folder beside each target and move them into place only at the
  end; ``publish_folders`` does the same for whole folders (a Triton model repository's model folders).
  If a later move of the same set fails, the earlier ones are undone, so a failure leaves every target as
  it was.
- The proof a file carries: a JSON object's ``vit_fast_digest`` field, a Markdown report's closing comment
  (``<!-- written by vit-fast VERSION sha256:HEX -->``) and a PNG's ``vit-fast-sha256`` text chunk hold the
  SHA-256 of the file's bytes (for JSON and Markdown with the 64 digest characters read as zeros; for a PNG
  without that chunk). A file vit-fast wrote before files carried the digest, or one edited since (a report
  a user annotated, marker kept), proves nothing and is replaced only with ``overwrite``: a marker says who
  wrote a file once, not that its bytes are still theirs, and an annotation lost silently cannot be got back.
  Such files are still read as before; only replacing them asks.
- A staging folder is made exclusively (``mkdir``, mode 0700) as ``.NAME.tmp-TOKEN`` (NAME cut so the
  whole name fits NAME_MAX) and holds a marker (``.owner``) that carries TOKEN and is locked (flock) by
  its run while it lives. ``clean_stale_staging`` removes only folders whose marker proves they are ours
  (the token inside matches the name) and whose lock is free (their run is gone, even by SIGKILL): never
  by name pattern or age alone.
- A working folder that is not an output (the bench's exports, the interpreter child's files) is a staging
  folder in ``$TMPDIR`` (:func:`temp_staging`), under the same rules.
- Files written inside a staging folder go through ``write_new`` / ``copy_new`` / ``open_new``
  (``O_CREAT | O_EXCL | O_NOFOLLOW``): never through a planted file or symlink. Folders on the way to a
  target are made with ``make_folders`` (links checked as above).
- A file name that another file records (external data an ONNX graph or its metadata names, the shards of
  a weights index) is followed only inside that file's folder (:func:`contained_path`).
- A file that holds a secret is written with ``mode=0o600`` (``write_atomic``), never wider for a moment.
- ``hold_lock`` locks a file (flock, mode 0600) for a process's life: one owner of a resource at a time.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import glob
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import sys
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

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
_TOKEN_HEX = 16
_ZERO_DIGEST = "0" * 64
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class OutputChanged(FileExistsError):
    """A target changed between the check made before the work and the publish: something appeared where
    nothing was, or the file (folder) checked was replaced or edited. Nothing was replaced; the message
    says where this run's result was kept (or that it was removed)."""


class OutputNotWritable(PermissionError):
    """A folder or file cannot be written (permissions, an immutable attribute); the message names it and the fix."""


def _umask() -> int:
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
def _writable(folder: str | os.PathLike, doing: str = "write in") -> Iterator[None]:
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


# --------------------------------------------------------------------------- renames that cannot replace
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


def _rename(src: Path, dst: Path, mode: str) -> bool:
    """Every move files.py makes into or out of a target goes through here (one place for fault tests):
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


# --------------------------------------------------------------------------- claims: what a check saw
class Identity(NamedTuple):
    """What is at a path, by ``lstat``: the same file keeps all of these until it is replaced or written."""

    dev: int
    ino: int
    kind: int
    size: int
    mtime_ns: int


def identity(path: str | os.PathLike) -> Identity | None:
    """The :class:`Identity` of what is at ``path`` (a link itself, not its target), or None when nothing is."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return Identity(st.st_dev, st.st_ino, stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns)


def _tree(folder: str | os.PathLike) -> tuple:
    """Every entry below ``folder`` (links not followed) with its identity, in name order: the folder's content
    as a check saw it. The folder's own mtime is left out (a rename into another folder may change it)."""
    entries: list[tuple[str, Identity | None]] = []

    def walk(current: str, rel: str) -> None:
        with os.scandir(current) as it:
            for entry in sorted(it, key=lambda e: e.name):
                name = rel + entry.name
                entries.append((name, identity(entry.path)))
                if entry.is_dir(follow_symlinks=False):
                    walk(entry.path, name + "/")

    root = identity(folder)
    if root is None or not stat.S_ISDIR(root.kind):
        return ()
    walk(os.fspath(folder), "")
    return (root._replace(mtime_ns=0), *entries)


@dataclass(frozen=True)
class _Claim:
    seen: Identity | None  # what was at the path when checked (None: nothing)
    overwrite: bool  # replace whatever is there at publish (the user said so)
    tree: tuple = ()  # a folder's content when checked


_claims: dict[str, _Claim] = {}
_claims_lock = threading.Lock()


def _key(path: str | os.PathLike) -> str:
    return os.path.abspath(os.fspath(path))


def claim(path: str | os.PathLike, *, overwrite: bool = False) -> None:
    """Remember what is at ``path`` now (nothing, or which file) as what a later publish there may replace:
    exactly that, and nothing that appears or changes meanwhile (:class:`OutputChanged`). ``overwrite``:
    whatever is there then. The checks (:func:`check_output_file`, :func:`check_files_in`) claim their
    paths; a caller claims a path itself only after deciding on its own that what is there may be replaced."""
    with _claims_lock:
        _claims[_key(path)] = _Claim(identity(path), overwrite)


def claim_folder(path: str | os.PathLike) -> None:
    """Like :func:`claim`, for a folder :func:`publish_folders` will put in place: what it holds now, entry by
    entry, is what may be replaced; a folder that changed since (a file added, removed or edited anywhere
    below it) is never moved away."""
    with _claims_lock:
        _claims[_key(path)] = _Claim(identity(path), False, _tree(path))


def _claim_of(path: Path) -> _Claim | None:
    with _claims_lock:
        return _claims.get(_key(path))


def _claimed_now(paths: Iterable[Path]) -> None:
    """After a publish: the claims now name what was just put there (a second write of the same run replaces it)."""
    with _claims_lock:
        for path in paths:
            _claims[_key(path)] = _Claim(identity(path), False, _tree(path) if os.path.isdir(path) else ())


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


# --------------------------------------------------------------------------- exclusive creation
@contextlib.contextmanager
def open_new(path: str | os.PathLike, mode: int = 0o666) -> Iterator[IO[bytes]]:
    """A new file at ``path`` opened for binary writing: created exclusively (``O_EXCL``), never through a
    symlink (``O_NOFOLLOW``), with ``mode`` (less the umask); an existing file or link there is an error, never
    opened. For files written inside a staging folder (or a folder this run made)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        yield f


def write_new(path: str | os.PathLike, data: str | bytes, *, replace: bool = False, mode: int = 0o666) -> Path:
    """Write ``data`` to a new file at ``path`` (see :func:`open_new`); with ``replace``, a file this run
    wrote there before (in its own staging folder) is removed first."""
    if replace:
        os.unlink(path) if os.path.lexists(path) else None
    with open_new(path, mode) as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return Path(path)


def copy_new(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Copy the bytes of ``src`` into a new file at ``dst`` (see :func:`open_new`)."""
    with open(src, "rb") as f, open_new(dst) as g:
        shutil.copyfileobj(f, g, 1 << 20)
    return Path(dst)


def write_atomic(path: str | os.PathLike, data: str | bytes, *, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` through a staging folder beside it, then move it into place (:func:`publish_to`).

    A failure (or a kill) leaves ``path`` as it was; the staging folder is removed (a killed run's by the
    next write). The result gets an ordinary file's permissions, or ``mode`` (0o600: readable by this user
    only, whatever the file it replaces allowed; the staged file has it from its creation on). Missing parent
    folders are made (:func:`make_folders`). A symlink at ``path`` is replaced, never written through.
    Ownership is checked before any work (:func:`check_output_file`) and again here, as it is moved: a file
    that is not the one checked (or, for a path never checked, one that does not prove itself vit-fast's) is
    never replaced.
    """
    path = Path(path)
    make_folders(path.parent)
    with staging_dir(path) as tmp:
        staged = write_new(tmp / path.name, data, mode=0o666 if mode is None else mode)
        publish_to([(staged, path)], mode=mode)
    return path


def json_text(data: Any, *, sort_keys: bool = True, default: Callable[[Any], Any] = str) -> str:
    """``data`` as the indented JSON text every JSON file of ours holds (keys sorted unless ``sort_keys`` is
    False; non-JSON values through ``default``). A JSON object carries ``vit_fast_digest``: the SHA-256 of
    this very text with the digest's 64 characters read as zeros (:func:`written_by_vit_fast` checks it)."""
    if not isinstance(data, dict):
        return json.dumps(data, indent=2, sort_keys=sort_keys, default=default) + "\n"
    body = {k: v for k, v in data.items() if k != DIGEST_KEY}
    text = json.dumps({**body, DIGEST_KEY: _ZERO_DIGEST}, indent=2, sort_keys=sort_keys, default=default) + "\n"
    field = f'"{DIGEST_KEY}": "{_ZERO_DIGEST}"'
    if text.count(field) != 1:  # a nested object holding a zero digest: the field would not be found again
        raise ValueError(f"cannot seal JSON whose content already holds {field}")
    digest = hashlib.sha256(text.encode()).hexdigest()
    return text.replace(field, f'"{DIGEST_KEY}": "{digest}"')


def write_json_atomic(data: Any, path: str | os.PathLike, *, mode: int | None = None) -> Path:
    """Write ``data`` as :func:`json_text` to ``path``, atomically (``mode``: see :func:`write_atomic`)."""
    return write_atomic(path, json_text(data), mode=mode)


def seal_markdown(text: str, version: str) -> str:
    """``text`` (a newline added when it lacks one) and the closing comment that proves vit-fast wrote it:
    ``<!-- written by vit-fast VERSION sha256:HEX -->``, HEX the SHA-256 of the whole file with HEX read as zeros."""
    body = text if not text or text.endswith("\n") else text + "\n"
    unsealed = f"{body}{MARKDOWN_MARK} {version} sha256:{_ZERO_DIGEST} -->\n"
    digest = hashlib.sha256(unsealed.encode()).hexdigest()
    return unsealed[: -len(f"{_ZERO_DIGEST} -->\n")] + f"{digest} -->\n"


def png_metadata(version: str) -> dict[str, str]:
    """The ``metadata=`` for matplotlib's ``savefig`` that names vit-fast as the PNG's software (not a proof:
    :func:`seal_png` adds that)."""
    return {PNG_KEY: f"{PNG_VALUE} {version}"}


# --------------------------------------------------------------------------- staging
def _fitted_name(prefix: str, target_name: str, tail: str) -> str:
    """``PREFIX + NAME + TAIL``, NAME cut (never the tail) so that the name fits :data:`NAME_MAX` bytes."""
    room = NAME_MAX - len(os.fsencode(prefix + tail))
    stem = target_name
    while len(os.fsencode(stem)) > room:
        stem = stem[:-1]
    return f"{prefix}{stem}{tail}"


def _staging_name(target_name: str, token: str) -> str:
    """``.NAME.tmp-TOKEN``, NAME cut (never the token) so that the name fits :data:`NAME_MAX` bytes."""
    return _fitted_name(".", target_name, f"{STAGING_MARK}{token}")


_STAGING_RE = re.compile(rf"^\.(.*){re.escape(STAGING_MARK)}([0-9a-f]{{{_TOKEN_HEX}}})$", re.DOTALL)


def _marker_token(folder: Path) -> str | None:
    """The token in ``folder``'s marker, read without following a link or opening anything but a regular file."""
    marker = folder / OWNER_FILE
    try:
        if not stat.S_ISREG(os.lstat(marker).st_mode):
            return None
        fd = os.open(marker, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK)
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
        fd = os.open(lock, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK)
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
    match = _STAGING_RE.match(folder.name)
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
    """Remove the staging folders in ``folder`` that a killed run of vit-fast left behind; returns those removed.

    A folder goes only when its marker proves vit-fast made it (:func:`is_our_staging`) and its lock is
    free (the kernel drops a dead process's locks). A folder whose run still holds its lock, or that merely
    looks like one of ours (by name, by an ``.owner`` file, by age), is never touched; nor is a folder of
    kept results (``NAME.unpublished-TOKEN``). ``name`` (the target a run writes) is accepted for callers
    that name it; every dead run's folder is cleaned either way.
    """
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
    fd = os.open(init, os.O_CREAT | os.O_EXCL | os.O_RDWR | _O_NOFOLLOW, 0o600)
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
        token = secrets.token_hex(_TOKEN_HEX // 2)
        folder = Path(parent) / _staging_name(target_name, token)
        try:
            with _writable(parent):
                os.mkdir(folder, 0o700)
            break
        except FileExistsError:  # pragma: no cover - a 64-bit token taken: draw again
            continue
    try:
        return folder, _take_ownership(folder, token)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


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


# --------------------------------------------------------------------------- publishing
def _changed(target: Path, seen: Identity | None, now: Identity | None, kind: str = "file") -> str:
    if seen is None:
        return f"{str(target)!r} appeared while vit-fast was working (it did not exist when checked)"
    if now is None:
        return f"{str(target)!r} was removed while vit-fast was working"
    return f"{str(target)!r} changed while vit-fast was working (it is not the {kind} checked before the work)"


def _set_aside(folders: Iterable[Path]) -> list[Path]:
    """Turn each staging folder of ``folders`` into a kept folder of results beside it (``NAME.unpublished-TOKEN``,
    ordinary permissions, the marker removed so no cleaner takes it); returns the kept folders."""
    kept = []
    for folder in sorted(set(folders)):
        match = _STAGING_RE.match(folder.name)
        if match is None or not is_our_staging(folder):
            continue
        with contextlib.suppress(OSError):
            for leftover in folder.glob(".previous-*"):
                leftover.unlink()
            (folder / OWNER_FILE).unlink()
            target = folder.parent / _fitted_name("", match.group(1), f"{KEPT_MARK}{match.group(2)}")
            _rename(folder, target, "new")
            os.chmod(target, 0o777 & ~_umask())
            for f in target.iterdir():
                with contextlib.suppress(OSError):
                    os.chmod(f, 0o666 & ~_umask())
            kept.append(target)
    return kept


def _kept_text(kept: Sequence[Path]) -> str:
    if not kept:
        return "nothing of this run was published"
    where = ", ".join(repr(str(k)) for k in kept)
    return f"this run's files were kept in {where}: compare, and move them into place yourself, or remove them"


def _swap_in(src: Path, dst: Path, expected: Identity | None) -> Path | None:
    """Replace the file at ``dst`` with ``src`` only while it is ``expected`` (None: whatever it is); returns
    where the replaced file now lies (inside ``src``'s staging folder), or None when ``dst`` had gone meanwhile."""
    try:
        exchanged = _rename(src, dst, "exchange")
    except FileNotFoundError:  # removed since it was looked at: nothing to replace
        _rename(src, dst, "new")
        return None
    if exchanged:
        if expected is None or identity(src) == expected:  # exactly the file checked was swapped out
            return src
        _rename(dst, src, "exchange")  # another file: put it back
        raise OutputChanged(_changed(dst, expected, identity(dst)))
    # no exchange here: keep a second name for the file, compare it, then replace (a change in between is lost)
    keep = src.parent / f".previous-{secrets.token_hex(8)}"
    try:
        os.link(dst, keep, follow_symlinks=False)
        kept_is_it = expected is None or identity(keep) == expected
    except OSError:
        shutil.copy2(dst, keep, follow_symlinks=False)
        kept_is_it = expected is None or identity(dst) == expected
    if not kept_is_it:
        os.unlink(keep)
        raise OutputChanged(_changed(dst, expected, identity(dst)))
    _rename(src, dst, "replace")
    return keep


def _publish_file(src: Path, dst: Path) -> Path | None:
    """Move one staged file to its target under its claim; returns where the file it replaced now lies."""
    held = _claim_of(dst)
    now = identity(dst)
    if held is not None and held.overwrite:
        return _swap_in(src, dst, None) if now is not None else _publish_new(src, dst)
    if now is None:
        return _publish_new(src, dst)
    if held is not None:
        if held.seen != now:
            raise OutputChanged(_changed(dst, held.seen, now))
    elif not written_by_vit_fast(dst):  # never checked: only a file that proves itself ours now is replaced
        raise OutputChanged(
            f"{str(dst)!r} exists, was not checked before the work, and does not prove itself vit-fast's "
            f"({ownership_note(dst)})"
        )
    return _swap_in(src, dst, now)


def _publish_new(src: Path, dst: Path) -> None:
    try:
        _rename(src, dst, "new")
    except FileExistsError:
        raise OutputChanged(_changed(dst, None, identity(dst))) from None


def _take_back(src: Path, dst: Path, replaced: Path | None, published: Identity | None) -> None:
    """Undo one publish: the file that was at ``dst`` goes back, this run's returns to ``src``."""
    if replaced == src:  # swapped: swap again
        _rename(dst, src, "exchange")
    elif replaced is not None:  # a second name was kept: ours gets one too, for the kept results
        try:
            os.link(dst, src, follow_symlinks=False)
        except OSError:  # no hard links: ours moves back (the target is empty for that moment)
            _rename(dst, src, "new")
        _rename(replaced, dst, "replace")
    elif identity(dst) == published:  # nothing was there: take ours away, and only ours
        _rename(dst, src, "new")


def publish_to(moves: Sequence[tuple[Path, Path]], *, mode: int | None = None) -> list[Path]:
    """Move each staged file to its target, in order (data first, the artifact, its metadata, reports last),
    each with ordinary permissions or ``mode`` (less the umask, set before the move: 0o600 for a secret).

    Each staged file must lie in a staging folder beside its target (one file system). Each target is
    checked against its claim at the moment of its move (see the module's docstring): a target that
    appeared, or that is not the file checked, raises :class:`OutputChanged`, and this run's files are then
    kept beside it in ``NAME.unpublished-TOKEN`` (named in the message). If any move fails, the targets this
    call already moved get their previous file back (or are removed where there was none), so no target is
    left half-updated.
    """
    done: list[tuple[Path, Path, Path | None, Identity | None]] = []
    try:
        for src, dst in moves:
            src, dst = Path(src), Path(dst)
            os.chmod(src, (0o666 if mode is None else mode) & ~_umask())
            with _writable(dst.parent):
                replaced = _publish_file(src, dst)
            done.append((src, dst, replaced, identity(dst)))
    except BaseException as err:
        for src, dst, replaced, published in reversed(done):
            with contextlib.suppress(OSError):
                _take_back(src, dst, replaced, published)
        if isinstance(err, OutputChanged):
            kept = _set_aside(Path(src).parent for src, _ in moves)
            raise OutputChanged(f"{err}: it was left as it is, and {_kept_text(kept)}") from None
        raise
    _claimed_now(dst for _, dst, _, _ in done)
    return [dst for _, dst, _, _ in done]


def publish(staged: Sequence[Path], folder: str | os.PathLike) -> list[Path]:
    """Move staged files into ``folder`` under their own names, in order; see :func:`publish_to`."""
    return publish_to([(Path(src), Path(folder) / Path(src).name) for src in staged])


def _publish_one_folder(staged: Path, target: Path) -> Path | None:
    held = _claim_of(target)
    now = identity(target)
    if now is None:
        try:
            _rename(staged, target, "new")
        except OSError as err:
            if err.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise OutputChanged(_changed(target, None, identity(target))) from None
            raise
        return None
    if held is None or held.seen is None:
        raise OutputChanged(_changed(target, None, now))
    try:
        exchanged = _rename(staged, target, "exchange")
    except FileNotFoundError:  # removed since it was looked at: nothing to replace
        _rename(staged, target, "new")
        return None
    if not exchanged:
        # no exchange here: move the old folder aside, compare it, put it back if it changed
        aside = staged.parent / f".previous-{target.name}"
        _rename(target, aside, "new")
        if _tree(aside) != held.tree:
            _rename(aside, target, "new")
            raise OutputChanged(_changed(target, held.seen, now, "folder"))
        _rename(staged, target, "new")
        return aside
    if _tree(staged) == held.tree:  # ``staged`` now holds the folder that was at ``target``
        return staged
    _rename(target, staged, "exchange")
    raise OutputChanged(_changed(target, held.seen, now, "folder"))


def publish_folders(moves: Sequence[tuple[Path, Path]]) -> list[Path | None]:
    """Move each folder built in a staging folder to its target, all or none; returns, for each, where the
    folder it replaced now lies (inside the staging folder, removed with it), or None.

    A target that did not exist when claimed (:func:`claim_folder`) must still not exist; one that did is
    replaced only while every entry below it is as claimed (a user's file added meanwhile is never lost): otherwise
    :class:`OutputChanged`, and the folders already moved are put back. A folder's rename never replaces a
    non-empty folder, even without ``renameat2``. Nothing of a refused set is kept (the caller removes its
    staging folder; a Triton repository would take a kept folder for a model)."""
    done: list[tuple[Path, Path, Path | None]] = []
    try:
        for staged, target in moves:
            staged, target = Path(staged), Path(target)
            with _writable(target.parent):
                done.append((staged, target, _publish_one_folder(staged, target)))
    except BaseException as err:
        for staged, target, replaced in reversed(done):
            with contextlib.suppress(OSError):
                if replaced == staged:
                    _rename(target, staged, "exchange")
                elif replaced is not None:
                    _rename(target, staged, "new")
                    _rename(replaced, target, "new")
                else:
                    _rename(target, staged, "new")
        if isinstance(err, OutputChanged):
            raise OutputChanged(f"{err}: it was left as it is, and this run's folders were removed") from None
        raise
    _claimed_now(target for _, target, _ in done)
    return [replaced for _, _, replaced in done]


# --------------------------------------------------------------------------- proof that vit-fast wrote a file
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
        fd = os.open(path, os.O_RDONLY | _O_NONBLOCK)
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


# --------------------------------------------------------------------------- bounded JSON input
#: the largest JSON file vit-fast reads (a config, an artifact's metadata, a report: a few KB; a Hugging Face
#: config with 22k class names, about 1 MB); a larger one is refused from its size, never read
JSON_MAX_BYTES = 16 * 2**20
#: the deepest nesting of arrays and objects read (ours and transformers' files nest 4 levels at most); Python's
#: parser recurses once a level and fails near 1000 with a RecursionError
JSON_MAX_DEPTH = 64
#: the longest integer read, in digits (seeds have 20, sizes 10); Python's own limit is 4300 digits, whose
#: ValueError names neither the file nor the field, and whose parse time grows with the square of the length
JSON_MAX_INT_DIGITS = 40


class JSONInputError(ValueError):
    """A JSON file or text that vit-fast does not read: too large, nested too deep, an integer too long, not
    UTF-8, not JSON. The message names where it came from and, for an integer, the field."""


class _LongInt(str):
    """An integer literal over :data:`JSON_MAX_INT_DIGITS` digits, kept as its text until its field is named."""


def _parse_int(text: str) -> int | _LongInt:
    return _LongInt(text) if len(text.lstrip("-")) > JSON_MAX_INT_DIGITS else int(text)


def _long_int_field(value: Any, where: str = "") -> tuple[str, _LongInt] | None:
    """The first :class:`_LongInt` in ``value`` and its field (``a.b[2]``); ``value`` is at most
    :data:`JSON_MAX_DEPTH` deep, so the recursion is bounded."""
    if isinstance(value, _LongInt):
        return where or "(the whole document)", value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _long_int_field(item, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}".lstrip("."))
        if found is not None:
            return found
    return None


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # one string, escapes included
_JSON_INNERMOST = re.compile(rb"\[\]|\{\}")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_LONG_DIGITS = re.compile(rb"[0-9]{%d}" % (JSON_MAX_INT_DIGITS + 1))


def _json_depth_exceeds(unquoted: bytes, limit: int) -> bool:
    """Whether the arrays and objects in JSON text ``unquoted`` (its strings dropped: they may hold brackets)
    nest deeper than ``limit``: each pass removes the innermost empty pairs, so a document nested ``d`` deep is
    empty after ``d`` passes; each pass is one scan in C."""
    brackets = unquoted.translate(None, _NOT_BRACKETS)
    for _ in range(limit):
        if not brackets:
            return False
        brackets, removed = _JSON_INNERMOST.subn(b"", brackets)
        if not removed:  # unbalanced: the parser names the syntax error
            return False
    return bool(brackets) and _JSON_INNERMOST.search(brackets) is not None


def loads_json(text: str | bytes, source: str) -> Any:
    """Parse JSON ``text`` read from ``source`` (e.g. ``"config 'c.json'"``) within the limits above; a
    :class:`JSONInputError` naming ``source`` (and the field, for an integer too long) otherwise."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    if len(raw) > JSON_MAX_BYTES:
        raise JSONInputError(
            f"{source} is {_size_text(len(raw))}, more than the {_size_text(JSON_MAX_BYTES)} vit-fast reads as JSON "
            "(a config or metadata file is a few KB): give the right file"
        )
    unquoted = _JSON_STRING.sub(b"", raw)
    if _json_depth_exceeds(unquoted, JSON_MAX_DEPTH):
        raise JSONInputError(
            f"{source} nests arrays and objects more than {JSON_MAX_DEPTH} levels deep (a config or metadata file "
            "needs a few): give the right file"
        )
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise JSONInputError(f"{source} is not UTF-8 text (byte {err.start}): give a JSON file") from None
    try:
        # integers are checked one by one (to name the field) only when a long run of digits is there at all
        data = json.loads(decoded, parse_int=_parse_int if _LONG_DIGITS.search(unquoted) else None)
    except json.JSONDecodeError as err:
        raise JSONInputError(f"{source} cannot be read as JSON ({err}): fix the file or give another") from None
    except RecursionError:  # the depth check above keeps the parser far from this; the stack was deep already
        raise JSONInputError(f"{source} nests arrays and objects too deep for Python's JSON parser") from None
    found = _long_int_field(data)
    if found is not None:
        field, digits = found
        raise JSONInputError(
            f"{source}: field {field!r} holds a {len(digits.lstrip('-'))}-digit integer; vit-fast reads integers of "
            f"at most {JSON_MAX_INT_DIGITS} digits: fix that field"
        )
    return data


def _size_text(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def read_json(path: str | os.PathLike, what: str = "JSON file", where: str = "") -> Any:
    """The JSON value in the regular file ``path`` (``what`` names it in messages: ``"config"``, ``"metadata"``;
    ``where`` may follow the path: ``" beside 'm.onnx'"``), read within the limits above: a file over
    :data:`JSON_MAX_BYTES` is refused from its size without being read, anything that is not a regular file (a
    FIFO, a device) is never opened. Raises FileNotFoundError for a missing file, :class:`JSONInputError` (a
    ValueError) naming the file for everything else."""
    source = f"{what} {str(path)!r}{where}"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{source} does not exist") from None
    except OSError as err:
        raise JSONInputError(f"{source} cannot be read: {err.strerror or err}") from None
    if not stat.S_ISREG(st.st_mode):
        raise JSONInputError(f"{source} is not a regular file: give a JSON file")
    if st.st_size > JSON_MAX_BYTES:
        raise JSONInputError(
            f"{source} is {_size_text(st.st_size)}, more than the {_size_text(JSON_MAX_BYTES)} vit-fast reads as "
            "JSON (a config or metadata file is a few KB): give the right file"
        )
    raw = read_head(path, JSON_MAX_BYTES + 1)  # the size may change, or lie (a file in /proc): read at most this
    if raw is None:
        raise JSONInputError(f"{source} cannot be read as a regular file")
    return loads_json(raw, source)


#: the most bytes of a file read to judge it (a report, a picture); a longer file proves nothing
_PROOF_LIMIT = 64 * 2**20


def _parse_json_object(raw: bytes) -> dict[str, Any] | None:
    """The JSON object ``raw`` holds, read within :func:`loads_json`'s limits, or None."""
    try:
        data = loads_json(raw, "a JSON file")
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def read_json_object(path: str | os.PathLike) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when it is not a readable JSON object in a regular file within the
    limits of :func:`read_json` (never raises)."""
    raw = read_head(path, _PROOF_LIMIT)
    return None if raw is None else _parse_json_object(raw)


_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_chunks(raw: bytes) -> list[tuple[int, int, bytes, bytes]] | None:
    """``(start, end, type, data)`` of each chunk up to IEND; None when ``raw`` is not a whole PNG."""
    if not raw.startswith(_PNG_MAGIC):
        return None
    chunks, pos = [], len(_PNG_MAGIC)
    while pos + 12 <= len(raw):
        length = int.from_bytes(raw[pos : pos + 4], "big")
        end = pos + 12 + length
        if end > len(raw):
            return None
        kind = raw[pos + 4 : pos + 8]
        chunks.append((pos, end, kind, raw[pos + 8 : pos + 8 + length]))
        if kind == b"IEND":
            return chunks
        pos = end
    return None


def _png_text(data: bytes) -> tuple[bytes, bytes]:
    key, _, value = data.partition(b"\0")
    return key, value


def seal_png(raw: bytes) -> bytes:
    """The PNG ``raw`` with a ``vit-fast-sha256`` text chunk before IEND holding the SHA-256 of the PNG
    without that chunk: the proof :func:`written_by_vit_fast` checks."""
    chunks = _png_chunks(raw)
    if chunks is None:
        raise ValueError("not a whole PNG: nothing to seal")
    body = b"".join(
        raw[start:end]
        for start, end, kind, data in chunks
        if not (kind == b"tEXt" and _png_text(data)[0] == PNG_DIGEST_KEY.encode())
    )
    head = body[:-12]  # IEND (empty) is the last 12 bytes
    text = PNG_DIGEST_KEY.encode() + b"\0" + hashlib.sha256(_PNG_MAGIC + body).hexdigest().encode()
    chunk = len(text).to_bytes(4, "big") + b"tEXt" + text
    chunk += (zlib.crc32(b"tEXt" + text) & 0xFFFFFFFF).to_bytes(4, "big")
    return _PNG_MAGIC + head + chunk + body[-12:]


def _png_seal(raw: bytes) -> bool | None:
    """True: the digest chunk matches; False: it does not; None: the PNG has none."""
    chunks = _png_chunks(raw)
    if chunks is None:
        return None
    for start, end, kind, data in chunks:
        key, value = _png_text(data) if kind == b"tEXt" else (b"", b"")
        if key == PNG_DIGEST_KEY.encode():
            rest = raw[:start] + raw[end:]
            return hashlib.sha256(rest).hexdigest().encode() == value
    return None


def _png_marked(chunks: list[tuple[int, int, bytes, bytes]]) -> bool:
    """Whether a PNG's text chunks name vit-fast as its software (a marker, not a proof)."""
    return any(
        kind == b"tEXt" and _png_text(data)[0] == PNG_KEY.encode() and _png_text(data)[1].startswith(b"vit-fast")
        for _, _, kind, data in chunks
    )


_MARKDOWN_SEAL = re.compile(rb"<!-- written by vit-fast \S+ sha256:([0-9a-f]{64}) -->\n\Z")


def _zeroed(raw: bytes, start: int, end: int) -> bytes:
    return raw[:start] + _ZERO_DIGEST.encode() + raw[end:]


def _seal_state(raw: bytes) -> tuple[bool | None, bool]:
    """``(sealed, marked)``: ``sealed`` True when the file's digest matches its bytes, False when it carries one
    that does not, None when it carries none; ``marked`` when it carries vit-fast's marker of old."""
    if raw.startswith(_PNG_MAGIC):
        chunks = _png_chunks(raw)
        return _png_seal(raw), bool(chunks) and _png_marked(chunks)
    if raw.lstrip().startswith(b"{"):
        data = _parse_json_object(raw)
        if data is None:
            return None, False
        marked = (
            MARKER_KEY in data
            or {"artifact", "rule", "rows"} <= set(data)
            or {"schema", "environment", "rows"} <= set(data)
        )
        digest = data.get(DIGEST_KEY)
        if not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
            return (False if DIGEST_KEY in data else None), marked
        field = f'"{DIGEST_KEY}": "{digest}"'.encode()
        if raw.count(field) != 1:
            return False, marked
        at = raw.index(field) + len(field) - 65
        return hashlib.sha256(_zeroed(raw, at, at + 64)).hexdigest() == digest, marked
    match = _MARKDOWN_SEAL.search(raw)
    if match is not None:
        zeroed = _zeroed(raw, match.start(1), match.end(1))
        return hashlib.sha256(zeroed).hexdigest() == match.group(1).decode(), True
    lines = raw.rstrip().splitlines()
    return None, bool(lines) and lines[-1].decode("utf-8", "replace").startswith(MARKDOWN_MARK)


def written_by_vit_fast(path: str | os.PathLike) -> bool:
    """Whether the file at ``path`` itself proves vit-fast wrote it, as it is: a JSON object whose
    ``vit_fast_digest``, a Markdown report whose closing comment, or a PNG whose ``vit-fast-sha256`` chunk
    holds the SHA-256 of the file's bytes (see the module's docstring). A marker without a matching digest
    (a file of an older vit-fast, or one edited since) proves nothing; nor a name, nor a file beside it.
    Only regular files are read."""
    raw = read_head(path, _PROOF_LIMIT)
    return raw is not None and _seal_state(raw)[0] is True


def ownership_note(path: str | os.PathLike) -> str:
    """Why the file at ``path`` does not prove vit-fast wrote it, in words for a refusal."""
    raw = read_head(path, _PROOF_LIMIT)
    if raw is None:
        return "it is not a regular file vit-fast can read"
    sealed, marked = _seal_state(raw)
    if sealed is False:
        return "it carries vit-fast's digest, but its bytes no longer match it (edited since vit-fast wrote it)"
    if sealed is None and marked:
        return (
            "it carries vit-fast's marker but no digest of its bytes (written by an older vit-fast, or edited), so "
            "vit-fast cannot tell that it is unchanged"
        )
    return "it was not written by vit-fast"


#: the suffixes of the artifacts vit-fast writes (ONNX, TensorRT engines); their metadata goes to ``ARTIFACT.json``
ONNX_SUFFIXES = (".onnx",)
ENGINE_SUFFIXES = (".plan", ".engine", ".trt")
ARTIFACT_SUFFIXES = ONNX_SUFFIXES + ENGINE_SUFFIXES


def is_artifact_metadata(path: str | os.PathLike) -> bool:
    """Whether ``path`` is (or would be) the metadata JSON of an artifact: its content says so (vit-fast's
    marker and an artifact ``format``), or it is named ``ARTIFACT.json`` beside an existing artifact."""
    path = Path(path)
    data = read_json_object(path)
    if data is not None and MARKER_KEY in data and data.get("format") in ("onnx", "tensorrt"):
        return True
    if not path.name.lower().endswith(".json"):
        return False
    artifact = Path(str(path)[: -len(".json")])
    return artifact.name.lower().endswith(ARTIFACT_SUFFIXES) and (artifact.is_file() or artifact.is_symlink())


# --------------------------------------------------------------------------- output checks
def existing_folder(folder: str | os.PathLike, what: str = "output", *, named: str | os.PathLike | None = None) -> Path:
    """The nearest folder at or above ``folder`` that exists, found with ``lstat`` (a link is looked at, then
    resolved); ``folder`` itself when it exists. A ValueError naming it and the fix when that nearest entry is
    a link that dangles (``dang -> /nonexistent/results``: a drive not mounted) or loops, or is not a folder;
    the message starts with ``what`` and ``named`` (the path the user gave; default ``folder``)."""
    folder = Path(folder) if str(folder) else Path(".")
    prefix = f"{what} {str(named if named is not None else folder)!r}"
    found = next((p for p in (folder, *folder.parents) if _lexists(p)), Path("."))
    try:
        st = os.stat(found)
    except OSError as err:
        link = os.readlink(found) if os.path.islink(found) else None
        if err.errno == errno.ELOOP:
            raise ValueError(
                f"{prefix}: {str(found)!r} is a symbolic link that loops (it leads back to itself); "
                "fix the link, or choose another path"
            ) from None
        if link is not None and err.errno in (errno.ENOENT, errno.ENOTDIR):
            final = os.path.realpath(found)
            via = "" if final == os.path.join(os.path.dirname(os.path.abspath(found)), link) else f", then {final!r}"
            raise ValueError(
                f"{prefix}: {str(found)!r} is a symbolic link to {link!r}{via}, which does not exist "
                "(a drive not mounted, or a folder moved?); mount or create it, fix the link, or choose another path"
            ) from None
        raise ValueError(f"{prefix}: {str(found)!r} cannot be looked at: {err.strerror or err}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(
            f"{prefix}: {str(found)!r} is a file, not a folder; choose another path (nothing can be written under a "
            "file)"
        )
    return found


def _lexists(path: Path) -> bool:
    try:
        os.lstat(path)
    except OSError:  # missing, or a component above it is a file or a looping link: looked at higher up
        return False
    return True


def make_folders(folder: str | os.PathLike, what: str = "output folder") -> Path:
    """Make ``folder`` and its missing parents (an existing one is fine), after :func:`existing_folder`'s
    checks: a dangling or looping link on the way is named, not met as ``[Errno 17] File exists``."""
    folder = Path(folder) if str(folder) else Path(".")
    existing_folder(folder, what)
    with _writable(folder, "make"):
        os.makedirs(folder, exist_ok=True)
    return folder


def _check_folder(path: Path, what: str, make_parents: bool, named: Path | None = None) -> None:
    """The folder ``path`` goes into exists (or, with ``make_parents``, can be made) and can be written; ``named``:
    the path errors name (default ``path``)."""
    named = path if named is None else named
    folder = path.parent if str(path.parent) else Path(".")
    existing = existing_folder(folder, what, named=named)
    if existing != folder and not make_parents:
        raise ValueError(
            f"output folder {str(folder)!r} for {what} {str(named)!r} does not exist: "
            f"create it first (mkdir -p {folder})"
        )
    try:  # a short probe name: a legal 250-character target name must not make the probe's too long
        fd, probe = tempfile.mkstemp(prefix=".vit-fast-probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ValueError(
            f"output folder {str(existing)!r} for {what} {str(named)!r} cannot be written: {err.strerror or err}; "
            "choose a folder you can write to"
        ) from err


def refuse_non_utf8(path: str | os.PathLike, what: str, reader: str) -> None:
    """Refuse (ValueError) a ``path`` whose bytes are not UTF-8 (Python holds such a name with lone surrogates)
    before any work, naming it, when ``reader`` (e.g. "ONNX Runtime") takes UTF-8 paths only and would fail on it
    with its own binding's text. Everything vit-fast does itself takes any name."""
    raw = os.fsencode(path)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as err:
        fixed = raw.decode("utf-8", "replace").replace("\ufffd", "_")
        raise ValueError(
            f"{what} {raw!r} is not a UTF-8 path (byte {raw[err.start]:#04x} at {err.start}), and {reader} opens only "
            f"UTF-8 paths: rename it, e.g. {fixed!r}"
        ) from None


def refuse_special(path: str | os.PathLike, what: str) -> None:
    """Refuse (ValueError) a ``path`` that exists as a FIFO, device or socket, without opening it."""
    kind = special_kind(path)
    if kind is not None and kind != "a folder":
        raise ValueError(
            f"{what} {str(path)!r} is {kind}, not a regular file: vit-fast writes only regular files and does not "
            "open this one; choose a file path"
        )


def refuse_foreign(path: Path, what: str, ours: Callable[[Path], bool] | None, overwrite: bool) -> None:
    """Refuse an existing ``path`` that does not prove vit-fast wrote it (unless ``overwrite``)."""
    if overwrite or ours is None or not (path.exists() or path.is_symlink()):
        return
    if not ours(path):
        note = ownership_note(path) if ours is written_by_vit_fast else None
        foreign = note in (None, "it was not written by vit-fast")
        state = "was not written by vit-fast" if foreign else f"is not provably vit-fast's as written ({note})"
        raise ValueError(
            f"{what} {str(path)!r} exists and {state}; refusing to replace it: choose another "
            "path, or allow replacing it (overwrite=True; --overwrite on the command line)"
        )


def check_suffix(path: str | os.PathLike, suffixes: Sequence[str], what: str) -> Path:
    """``path`` when its final name ends in one of ``suffixes`` (case-insensitively) as a suffix; a ValueError
    naming the path and the fix otherwise. A name that is only the suffix (``.onnx``, ``..onnx``) is refused:
    it is a hidden file without a suffix to every reader (``Path('.onnx').suffix`` is empty)."""
    path = Path(path)
    problem = _suffix_problem(path, suffixes, what)
    if problem is not None:
        raise ValueError(problem)
    return path


def _suffix_problem(path: Path, suffixes: Sequence[str], what: str) -> str | None:
    name = path.name
    for suffix in suffixes:
        if not suffix:
            return None
        if name.lower().endswith(suffix.lower()):
            if name[: -len(suffix)].strip("."):
                return None
            return (
                f"{what} {str(path)!r} has no name before its suffix {suffix!r} (the suffix alone names a hidden "
                f"file without a suffix): give it a name, e.g. {str(path.with_name('model' + suffix))!r}"
            )
    names = " or ".join(f"{path.stem}{s}" for s in suffixes)
    return (
        f"{what} {str(path)!r} has the wrong suffix {path.suffix!r}: a {what} is written as "
        f"{'/'.join(suffixes)} (e.g. {names})"
    )


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
    path and the fix otherwise. The path is then claimed (:func:`claim`): a publish there replaces only
    what was checked.

    Refused: a FIFO, device or socket at ``path`` (never opened); a final name without one of ``suffixes``
    as its suffix (compared case-insensitively; the suffix alone is no name); a folder at ``path``; a
    parent that is a regular file, or a link that dangles or loops; a missing folder (unless
    ``make_parents``: then the nearest existing folder must be writable); a folder that cannot be written;
    an existing file for which ``ours(path)`` (the file's own proof) is False, unless ``overwrite``
    (``ours=None`` accepts any existing regular file).
    """
    path = Path(path)
    refuse_special(path, what)
    if path.is_dir() and not path.is_symlink():
        example = str(path / ("model" + suffixes[0]))
        raise ValueError(f"{what} {str(path)!r} is a folder; give a file path such as {example!r}")
    check_suffix(path, suffixes, what)
    _check_folder(path, what, make_parents)
    refuse_foreign(path, what, ours, overwrite)
    claim(path, overwrite=overwrite)
    return path


def check_report_file(
    path: str | os.PathLike,
    what: str = "report",
    *,
    overwrite: bool = False,
    artifacts: Sequence[str | os.PathLike] = (),
) -> Path:
    """A JSON report's path, checked before any work (:func:`check_output_file`, ``.json``, missing folders
    made when written), and never an artifact's own metadata: neither ``ARTIFACT.json`` of one of
    ``artifacts`` nor a file that is (or would be) some artifact's metadata, whatever ``overwrite`` says."""
    path = check_output_file(path, (".json",), what, overwrite=overwrite, make_parents=True)
    own = {os.path.abspath(str(a) + ".json") for a in artifacts}
    if os.path.abspath(path) in own or is_artifact_metadata(path):
        raise ValueError(
            f"{what} {str(path)!r} is the metadata of an artifact (it records the artifact's verification); a "
            "report never replaces it: choose another path, e.g. "
            f"{str(path.with_name(path.name[: -len('.json')] + '.report.json'))!r}"
        )
    return path


def check_output_dir(path: str | os.PathLike, what: str = "output folder") -> Path:
    """A folder to write into: an existing writable folder (a link to one is fine), or one that can be made
    (not yet made here); a link that dangles or loops on the way is refused."""
    path = Path(path)
    refuse_special(path, what)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} {str(path)!r} is a file, not a folder: give a folder path")
    _check_folder(path / "probe", what, make_parents=True, named=path)
    return path


def check_files_in(
    folder: str | os.PathLike,
    names: Sequence[str],
    what: str,
    *,
    overwrite: bool = False,
    ours: dict[str, Callable[[Path], bool]] | None = None,
) -> None:
    """Before any work: each of ``names`` that a run will write into ``folder`` is new, or proves vit-fast
    wrote it (``ours[name]`` where given, else :func:`written_by_vit_fast`), unless ``overwrite``; none
    is a FIFO, device, socket or folder. Each is then claimed (:func:`claim`)."""
    folder = Path(folder)
    for name in names:
        path = folder / name
        refuse_special(path, f"{what} file")
        if path.is_dir() and not path.is_symlink():
            raise ValueError(f"{what} file {str(path)!r} is a folder: move it away or choose another {what} folder")
        refuse_foreign(path, f"{what} file", (ours or {}).get(name, written_by_vit_fast), overwrite)
    for name in names:
        claim(folder / name, overwrite=overwrite)


# --------------------------------------------------------------------------- names read from files
def contained_path(
    folder: str | os.PathLike,
    name: Any,
    *,
    source: str | os.PathLike,
    field: str,
    links_may_leave: bool = False,
) -> Path:
    """``folder / name`` for a file name that another file records (``source``: an artifact's metadata, an
    ONNX graph, a weights index; ``field`` says where in it, e.g. ``field 'external_data'``), kept inside
    ``folder``: the one check every reader of such a name makes before it opens, copies or writes anything
    by it.

    Refused with a ValueError naming ``source``, ``field`` and the name: anything but a non-empty string, a
    NUL character, an absolute path, a ``..`` part and, unless ``links_may_leave``, a name whose location
    with every link resolved lies outside ``folder`` with every link resolved (ONNX Runtime's own rule for
    external data). ``links_may_leave`` is for folders whose files are links by design (a Hugging Face hub
    snapshot links each file into ``../../blobs``): there only the name itself is judged. Nothing is
    opened or made here; whether the file exists is the caller's check."""
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
    """Lock the file at ``path`` for this process and write ``note`` in it (who holds it); the lock is an
    exclusive ``flock``, released when the returned descriptor is closed or the process dies (even by SIGKILL:
    the kernel drops it). None when another process holds it (its note: :func:`read_head`).

    The file is created with mode 0600 if missing, opened never through a symlink and never when it is not a
    regular file; it is left in place when released (removing a lock file lets two processes lock two files)."""
    if fcntl is None:  # pragma: no cover - Windows
        raise OSError(f"cannot lock {str(path)!r}: no flock on this platform")
    flags = os.O_RDWR | os.O_CREAT | _O_NOFOLLOW | _O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
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
