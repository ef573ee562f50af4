"""Claims: what the check before the work saw at each target (nothing, or which file or folder tree), re-checked
at the moment of publishing."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple


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


def folder_tree(folder: str | os.PathLike) -> tuple:
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
        _claims[_key(path)] = _Claim(identity(path), False, folder_tree(path))


def claim_of(path: Path) -> _Claim | None:
    """What this process claimed at ``path`` (what it saw there before its work), or None."""
    with _claims_lock:
        return _claims.get(_key(path))


def claimed_now(paths: Iterable[Path]) -> None:
    """After a publish: the claims now name what was just put there (a second write of the same run replaces it)."""
    with _claims_lock:
        for path in paths:
            _claims[_key(path)] = _Claim(identity(path), False, folder_tree(path) if os.path.isdir(path) else ())
