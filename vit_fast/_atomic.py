"""One way to write a file: all of it or nothing at the target path."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path``, then rename it over ``path``.

    A failure leaves neither a partial ``path`` nor the temporary file. The result gets an
    ordinary file's permissions (mkstemp would leave it 0600).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return path


def finish_atomic(tmp: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Give ``tmp`` (written by a library beside ``path``) ordinary permissions and rename it to ``path``."""
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)
    return Path(path)
