"""Manifests: the files vit-fast wrote in a folder it publishes whole (a Triton model folder), each with the
SHA-256 of its bytes, so that a later ``--force`` replaces exactly those and keeps everything else below it."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

from .base import MARKER_KEY, O_NOFOLLOW
from .proof import read_json_object, written_by_vit_fast
from .writing import json_text, write_new

#: the manifest's name inside the folder it describes
MANIFEST_NAME = "vit-fast-files.json"


def _digest(path: Path) -> str | None:
    """The SHA-256 of the regular file at ``path`` (never followed through a link), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        h = hashlib.sha256()
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _entries(folder: Path, rel: str = "") -> list[tuple[str, os.DirEntry]]:
    """Every entry below ``folder`` (links not followed) as (path relative to the top, entry), parents first."""
    out = []
    with os.scandir(folder) as it:
        for entry in sorted(it, key=lambda e: e.name):
            out.append((rel + entry.name, entry))
            if entry.is_dir(follow_symlinks=False):
                out += _entries(Path(entry.path), rel + entry.name + "/")
    return out


def write_manifest(folder: str | os.PathLike, version: str) -> Path:
    """Write the manifest of ``folder`` (built in a staging folder) into it: every regular file below it by
    relative path and SHA-256. See docs/files.md."""
    folder = Path(folder)
    files = {rel: _digest(Path(e.path)) for rel, e in _entries(folder) if e.is_file(follow_symlinks=False)}
    return write_new(folder / MANIFEST_NAME, json_text({MARKER_KEY: version, "files": files}))


def foreign_entries(folder: str | os.PathLike) -> list[tuple[str, str]]:
    """What below the existing ``folder`` vit-fast did not write as it is now, as (relative path, why), topmost
    only: a folder holding nothing of vit-fast's is one entry (``2/``). A file is vit-fast's only when the folder's
    manifest proves itself (:func:`written_by_vit_fast`) and lists the file with the digest of its bytes now."""
    folder = Path(folder)
    manifest = folder / MANIFEST_NAME
    data = read_json_object(manifest) if written_by_vit_fast(manifest) else None
    listed = data.get("files") if isinstance(data, dict) else None
    listed = listed if isinstance(listed, dict) else {}
    ours: set[str] = {MANIFEST_NAME} if data is not None else set()
    why: dict[str, str] = {}
    for rel, entry in _entries(folder):
        if rel in ours or entry.is_dir(follow_symlinks=False):
            continue
        if rel in listed and entry.is_file(follow_symlinks=False) and _digest(Path(entry.path)) == listed[rel]:
            ours.add(rel)
        else:
            why[rel] = "changed since vit-fast wrote it" if rel in listed else "not written by vit-fast"
    for rel, entry in _entries(folder):  # a folder with nothing of ours below it counts as one entry
        if entry.is_dir(follow_symlinks=False) and not any(o.startswith(rel + "/") for o in ours):
            why[rel + "/"] = "not written by vit-fast"
    top = [r for r in why if not any(r != p and p.endswith("/") and r.startswith(p) for p in why)]
    return [(r, why[r]) for r in sorted(top)]


def _second_name(src: str | os.PathLike, dst: Path) -> None:
    """``dst`` as a hard link to ``src`` (a link itself, not its target); a copy with its metadata where the file
    system has no hard links (the original then goes with the folder it is in, the copy stays)."""
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)


def link_entries(source: str | os.PathLike, target: str | os.PathLike, entries: list[str]) -> None:
    """Give each entry of ``entries`` (relative paths; a trailing ``/`` for a folder) below ``source`` a second
    name below ``target`` (a folder being built in a staging folder): hard links, the same files (copies only where
    the file system has none), so that publishing ``target`` over ``source`` keeps them as they are."""
    source, target = Path(source), Path(target)
    for rel in entries:
        src, dst = source / rel.rstrip("/"), target / rel.rstrip("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not rel.endswith("/"):
            _second_name(src, dst)
            continue
        dst.mkdir()
        for sub, entry in _entries(src):
            if entry.is_dir(follow_symlinks=False):
                (dst / sub).mkdir()
            else:
                _second_name(entry.path, dst / sub)
