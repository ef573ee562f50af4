"""The one way to write files: all of it or nothing at the target path.

``write_atomic`` writes one file through a temporary file beside it. ``staging_dir`` +
``publish`` write several files (an artifact, its data and metadata) in a private folder and
move them into place only at the end, so a failure or a kill leaves the target as it was.
Staging folders are named ``.NAME.tmp-*`` beside the target; ``clean_stale_staging`` removes
those that a killed run left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

STAGING_MARK = ".tmp-"


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
    """Write ``data`` to a temporary file beside ``path``, then rename it over ``path``.

    A failure leaves neither a partial ``path`` nor the temporary file. The result gets an
    ordinary file's permissions (mkstemp would leave it 0600). Missing parent folders are made.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        finish_atomic(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return path


def write_json_atomic(data: Any, path: str | os.PathLike) -> Path:
    """Write ``data`` as indented JSON (non-JSON values as text) to ``path``, atomically."""
    return write_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def clean_stale_staging(folder: Path, name: str, older_than_s: float = 3600.0) -> list[Path]:
    """Remove staging folders for ``name`` in ``folder`` that a killed run left (older than an hour)."""
    removed = []
    now = time.time()
    for p in Path(folder).glob(f".{name}{STAGING_MARK}*"):
        with contextlib.suppress(OSError):
            if p.is_dir() and now - p.stat().st_mtime > older_than_s:
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed


@contextlib.contextmanager
def staging_dir(target: str | os.PathLike) -> Iterator[Path]:
    """A private temporary folder beside ``target``; removed with everything left in it on exit.

    Files are written there under their final names and moved into place with :func:`publish`
    (``os.replace`` within one file system).
    """
    target = Path(target)
    clean_stale_staging(target.parent, target.name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}{STAGING_MARK}", dir=target.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish(staged: Sequence[Path], folder: str | os.PathLike) -> list[Path]:
    """Move staged files into ``folder`` in order (data first, the artifact, its metadata last).

    A file at a target is replaced only by the move itself. If a move fails, the files this call
    already moved are removed again, so the target is never half-written.
    """
    moved: list[Path] = []
    try:
        for src in staged:
            dst = Path(folder) / src.name
            finish_atomic(src, dst)
            moved.append(dst)
    except BaseException:
        for dst in moved:
            dst.unlink(missing_ok=True)
        raise
    return moved
