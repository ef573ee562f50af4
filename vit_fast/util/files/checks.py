"""The checks before any work: output files and folders (kind, links, suffix, writability, whose file it is),
each target claimed for the publish."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from .base import writing_in
from .claims import claim
from .proof import is_artifact_metadata, ownership_note, written_by_vit_fast
from .reading import special_kind


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
    with writing_in(folder, "make"):
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
    """The output ``path``, after every check that can be made before any work, then claimed (:func:`claim`: a
    publish there replaces only what was checked); a ValueError naming the path and the fix otherwise. Refused,
    among others: a special file, a final name without one of ``suffixes``, a folder, a missing folder (unless
    ``make_parents``), an existing file for which ``ours(path)`` is False unless ``overwrite`` (``ours=None``
    accepts any existing regular file). Every refusal: docs/files.md."""
    named_folder = os.fspath(path).endswith(("/", os.sep))  # "trail/": a folder, whether it exists or not
    path = Path(path)
    refuse_special(path, what)
    if named_folder or (path.is_dir() and not path.is_symlink()):
        example = str(path / ("model" + suffixes[0]))
        shown = str(path) + os.sep if named_folder else str(path)  # as the user wrote it
        raise ValueError(f"{what} {shown!r} is a folder; give a file path such as {example!r}")
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
