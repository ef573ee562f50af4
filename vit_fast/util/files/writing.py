"""Exclusive creation (``O_CREAT | O_EXCL | O_NOFOLLOW``) inside a staging folder, one-file atomic writes, and the
JSON text, Markdown seal and PNG metadata every vit-fast file carries."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from .base import DIGEST_KEY, MARKDOWN_MARK, O_NOFOLLOW, PNG_KEY, PNG_VALUE, ZERO_DIGEST
from .checks import make_folders
from .publishing import publish_to
from .staging import staging_dir


@contextlib.contextmanager
def open_new(path: str | os.PathLike, mode: int = 0o666) -> Iterator[IO[bytes]]:
    """A new file at ``path`` opened for binary writing: created exclusively (``O_EXCL``), never through a
    symlink (``O_NOFOLLOW``), with ``mode`` (less the umask); an existing file or link there is an error, never
    opened. For files written inside a staging folder (or a folder this run made)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
    except OSError as err:  # a write's error (a full disk) carries no file name: it gets this one
        if err.filename is not None:
            raise
        raise OSError(err.errno, err.strerror, os.fspath(path)) from err


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
    """Write ``data`` to ``path`` through a staging folder beside it, then move it into place (:func:`publish_to`);
    returns ``path``. A failure (or a kill) leaves ``path`` as it was. The result gets an ordinary file's permissions,
    or ``mode`` from its creation on (0o600: this user only). Missing parent folders are made; a symlink at ``path``
    is replaced, never written through; a file that is not the one checked (or, never checked, does not prove itself
    vit-fast's) is never replaced (:class:`OutputChanged`). See docs/files.md."""
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
    text = json.dumps({**body, DIGEST_KEY: ZERO_DIGEST}, indent=2, sort_keys=sort_keys, default=default) + "\n"
    field = f'"{DIGEST_KEY}": "{ZERO_DIGEST}"'
    if text.count(field) != 1:  # a nested object holding a zero digest: the field would not be found again
        raise ValueError(f"cannot seal JSON whose content already holds {field}")
    digest = hashlib.sha256(text.encode()).hexdigest()
    return text.replace(field, f'"{DIGEST_KEY}": "{digest}"')


def npy_bytes(array: Any) -> bytes:
    """``array`` as the bytes of a ``.npy`` file, no pickle allowed (structured arrays included), for
    :func:`write_atomic`: numpy's own writer, into memory, never to a path."""
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def write_json_atomic(data: Any, path: str | os.PathLike, *, mode: int | None = None) -> Path:
    """Write ``data`` as :func:`json_text` to ``path``, atomically (``mode``: see :func:`write_atomic`)."""
    return write_atomic(path, json_text(data), mode=mode)


def seal_markdown(text: str, version: str) -> str:
    """``text`` (a newline added when it lacks one) and the closing comment that proves vit-fast wrote it:
    ``<!-- written by vit-fast VERSION sha256:HEX -->``, HEX the SHA-256 of the whole file with HEX read as zeros."""
    body = text if not text or text.endswith("\n") else text + "\n"
    unsealed = f"{body}{MARKDOWN_MARK} {version} sha256:{ZERO_DIGEST} -->\n"
    digest = hashlib.sha256(unsealed.encode()).hexdigest()
    return unsealed[: -len(f"{ZERO_DIGEST} -->\n")] + f"{digest} -->\n"


def png_metadata(version: str) -> dict[str, str]:
    """The ``metadata=`` for matplotlib's ``savefig`` that names vit-fast as the PNG's software (not a proof:
    :func:`seal_png` adds that)."""
    return {PNG_KEY: f"{PNG_VALUE} {version}"}
