"""The one way to write files: all of it or nothing at the target path, and never over a file we did not make.

The policy, the same for every writer (export, verify, bench, demo, serve, ``save_checkpoint``, the API):

- ``check_output_file`` runs before any work. A path that is not a regular file (a FIFO, a device, a
  socket) is refused from ``lstat`` alone, never opened. An existing file is replaced only when the file
  itself proves vit-fast wrote it (:func:`written_by_vit_fast`: the ``vit_fast_version`` marker in a JSON
  file, the ``Software`` text of a PNG, the closing comment of a Markdown report; callers pass their own
  proof for artifacts and checkpoints), never because of a neighbouring file or a name; anything else
  needs ``overwrite=True`` (``--overwrite``). A symlink at the path is replaced, never written through.
  ``check_report_file`` adds that a report never lands on an artifact's own metadata (``m.onnx.json``).
- ``write_atomic`` writes one file; ``staging_dir`` + ``publish`` write several (an artifact, its data,
  its metadata, a report) in a private folder beside each target and move them into place only at the
  end. A move replaces a previous file in one ``os.replace``; if a later move of the same set fails, the
  previous files are put back, so a failure leaves every target as it was.
- A staging folder is made exclusively (``mkdir``, mode 0700) as ``.NAME.tmp-TOKEN`` (NAME cut so the
  whole name fits NAME_MAX) and holds a marker (``.owner``) that carries TOKEN and is locked (flock) by
  its run while it lives. ``clean_stale_staging`` removes only folders whose marker proves they are ours
  (the token inside matches the name) and whose lock is free (their run is gone, even by SIGKILL): never
  by name pattern or age alone.
- A working folder that is not an output (the bench's exports, the interpreter child's files) is a staging
  folder in ``$TMPDIR`` (:func:`temp_staging`), under the same rules.
- Files written inside a staging folder go through ``write_new`` / ``copy_new`` / ``open_new``
  (``O_CREAT | O_EXCL | O_NOFOLLOW``): never through a planted file or symlink.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

try:  # POSIX; elsewhere a staging folder's run cannot be told gone, so none is cleaned
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

STAGING_MARK = ".tmp-"
#: the marker inside a staging folder: it holds the folder's token and is locked (flock) by the run that owns it
OWNER_FILE = ".owner"
#: what the marker holds before the token
OWNER_TEXT = "vit-fast staging folder "
#: the key every JSON file vit-fast writes carries (metadata beside an artifact, verify and bench reports)
MARKER_KEY = "vit_fast_version"
#: the PNG text key (and the start of its value) every picture vit-fast draws carries
PNG_KEY, PNG_VALUE = "Software", "vit-fast"
#: the comment every Markdown report of ours ends with (the version follows it)
MARKDOWN_MARK = "<!-- written by vit-fast"
#: the longest file name (bytes) most file systems take; staging names are cut to fit it
NAME_MAX = 255
_TOKEN_HEX = 16
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


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
        if getattr(sys, name) is None:  # Python found it closed at start-up
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))  # noqa: SIM115 (the process's own)
        done.append(f"{name} {problem}")
    return done


def finish_atomic(tmp: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Give ``tmp`` (written beside ``path``) ordinary permissions and rename it to ``path``."""
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)
    return Path(path)


# --------------------------------------------------------------------------- exclusive creation
@contextlib.contextmanager
def open_new(path: str | os.PathLike) -> Iterator[IO[bytes]]:
    """A new file at ``path`` opened for binary writing: created exclusively (``O_EXCL``), never through a
    symlink (``O_NOFOLLOW``); an existing file or link there is an error, never opened. For files written
    inside a staging folder (or a folder this run made)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW, 0o666)
    with os.fdopen(fd, "wb") as f:
        yield f


def write_new(path: str | os.PathLike, data: str | bytes, *, replace: bool = False) -> Path:
    """Write ``data`` to a new file at ``path`` (see :func:`open_new`); with ``replace``, a file this run
    wrote there before (in its own staging folder) is removed first."""
    if replace:
        os.unlink(path) if os.path.lexists(path) else None
    with open_new(path) as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return Path(path)


def copy_new(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Copy the bytes of ``src`` into a new file at ``dst`` (see :func:`open_new`)."""
    with open(src, "rb") as f, open_new(dst) as g:
        shutil.copyfileobj(f, g, 1 << 20)
    return Path(dst)


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through a staging folder beside it, then rename it over ``path``.

    A failure (or a kill) leaves ``path`` as it was; the staging folder is removed (a killed run's by the
    next write). The result gets an ordinary file's permissions. Missing parent folders are made. A
    symlink at ``path`` is replaced, never written through. Ownership is the caller's check
    (:func:`check_output_file`, made before any work).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with staging_dir(path) as tmp:
        staged = write_new(tmp / path.name, data)
        publish_to([(staged, path)])
    return path


def json_text(data: Any) -> str:
    """``data`` as the indented, key-sorted JSON text every JSON file of ours holds (non-JSON values as text)."""
    return json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"


def write_json_atomic(data: Any, path: str | os.PathLike) -> Path:
    """Write ``data`` as indented JSON (non-JSON values as text) to ``path``, atomically."""
    return write_atomic(path, json_text(data))


def markdown_mark(version: str) -> str:
    """The last line of every Markdown report vit-fast writes: the proof that it wrote the file."""
    return f"{MARKDOWN_MARK} {version} -->\n"


def png_metadata(version: str) -> dict[str, str]:
    """The ``metadata=`` for matplotlib's ``savefig`` that marks a PNG as vit-fast's."""
    return {PNG_KEY: f"{PNG_VALUE} {version}"}


# --------------------------------------------------------------------------- staging
def _staging_name(target_name: str, token: str) -> str:
    """``.NAME.tmp-TOKEN``, NAME cut (never the token) so that the name fits :data:`NAME_MAX` bytes."""
    room = NAME_MAX - len(f".{STAGING_MARK}{token}")
    stem = target_name
    while len(os.fsencode(stem)) > room:
        stem = stem[:-1]
    return f".{stem}{STAGING_MARK}{token}"


_STAGING_RE = re.compile(rf"^\..*{re.escape(STAGING_MARK)}([0-9a-f]{{{_TOKEN_HEX}}})$", re.DOTALL)


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
    return _marker_token(folder) == match.group(1)


def clean_stale_staging(folder: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Remove the staging folders in ``folder`` that a killed run of vit-fast left behind; returns those removed.

    A folder goes only when its marker proves vit-fast made it (:func:`is_our_staging`) and its lock is
    free (the kernel drops a dead process's locks). A folder whose run still holds its lock, or that merely
    looks like one of ours (by name, by an ``.owner`` file, by age), is never touched. ``name`` (the target
    a run writes) is accepted for callers that name it; every dead run's folder is cleaned either way.
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
    and the lock's descriptor (close it after removing the folder). Made exclusively, mode 0700."""
    while True:
        token = secrets.token_hex(_TOKEN_HEX // 2)
        folder = Path(parent) / _staging_name(target_name, token)
        try:
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

    Files are written there under their final names and moved into place with :func:`publish` /
    :func:`publish_to` (``os.replace`` within one file system). Stale folders of earlier, killed runs
    are cleaned first.
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


def _keep_previous(dst: Path, staging: Path) -> Path | None:
    """A second name for the file at ``dst`` inside ``staging`` (a hard link, else a copy), or None when
    there is no file there; it lets a failed publish put the previous file back."""
    if not (dst.is_file() or dst.is_symlink()):
        return None
    keep = staging / f".previous-{secrets.token_hex(8)}"
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


def publish_folder(staged: Path, target: Path) -> None:
    """Move a folder built in a staging folder to ``target`` (which must not exist), in one rename."""
    os.rename(staged, target)


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


def read_json_object(path: str | os.PathLike) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when it is not a readable JSON object in a regular file within the
    limits of :func:`read_json` (never raises)."""
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _png_marked(raw: bytes) -> bool:
    """Whether a PNG's ``tEXt`` chunks carry our ``Software`` text."""
    pos = 8
    while pos + 8 <= len(raw):
        length = int.from_bytes(raw[pos : pos + 4], "big")
        kind = raw[pos + 4 : pos + 8]
        data = raw[pos + 8 : pos + 8 + length]
        if kind == b"tEXt":
            key, _, value = data.partition(b"\0")
            if key == PNG_KEY.encode() and value.startswith(PNG_VALUE.encode()):
                return True
        if kind in (b"IDAT", b"IEND"):  # matplotlib writes its text chunks before the image data
            return False
        pos += 12 + length
    return False


def written_by_vit_fast(path: str | os.PathLike) -> bool:
    """Whether the file at ``path`` itself proves vit-fast wrote it: a JSON object with the
    ``vit_fast_version`` marker (or a report from before the marker: a verify report's
    ``artifact``/``rule``/``rows``, a bench report's ``schema``/``environment``/``rows``), a PNG whose
    ``Software`` text is vit-fast's, or a Markdown report ending with our comment. Nothing else counts:
    not a name, not a file beside it. Only regular files are read."""
    raw = read_head(path, 64 * 2**20)
    if raw is None:
        return False
    if raw.startswith(b"\x89PNG\r\n\x1a\n"):
        return _png_marked(raw)
    if raw.lstrip().startswith(b"{"):
        data = read_json_object(path)
        if data is None:
            return False
        return (
            MARKER_KEY in data
            or {"artifact", "rule", "rows"} <= set(data)
            or {"schema", "environment", "rows"} <= set(data)
        )
    lines = raw.rstrip().splitlines()
    return bool(lines) and lines[-1].decode("utf-8", "replace").startswith(MARKDOWN_MARK)


#: the suffixes of artifacts whose metadata goes to ``ARTIFACT.json``
ARTIFACT_SUFFIXES = (".onnx", ".plan", ".engine", ".trt")


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
    try:  # a short probe name: a legal 250-character target name must not make the probe's too long
        fd, probe = tempfile.mkstemp(prefix=".vit-fast-probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ValueError(
            f"output folder {str(existing)!r} for {what} {str(path)!r} cannot be written: {err.strerror or err}; "
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
        raise ValueError(
            f"{what} {str(path)!r} exists and was not written by vit-fast; refusing to replace it: choose another "
            "path, or allow replacing it (overwrite=True; --overwrite on the command line)"
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
    path and the fix otherwise.

    Refused: a FIFO, device or socket at ``path`` (never opened); a suffix not in ``suffixes`` (compared
    case-insensitively); a folder at ``path``; a parent that is a regular file; a missing folder (unless
    ``make_parents``: then the nearest existing folder must be writable); a folder that cannot be written;
    an existing file for which ``ours(path)`` (the file's own proof) is False, unless ``overwrite``
    (``ours=None`` accepts any existing regular file).
    """
    path = Path(path)
    refuse_special(path, what)
    if path.is_dir() and not path.is_symlink():
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
    refuse_foreign(path, what, ours, overwrite)
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
    """A folder to write into: an existing writable folder, or one that can be made (not yet made here)."""
    path = Path(path)
    refuse_special(path, what)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} {str(path)!r} is a file, not a folder: give a folder path")
    _check_folder(path / "probe", what, make_parents=True)
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
    is a FIFO, device, socket or folder."""
    folder = Path(folder)
    for name in names:
        path = folder / name
        refuse_special(path, f"{what} file")
        if path.is_dir() and not path.is_symlink():
            raise ValueError(f"{what} file {str(path)!r} is a folder: move it away or choose another {what} folder")
        refuse_foreign(path, f"{what} file", (ours or {}).get(name, written_by_vit_fast), overwrite)
