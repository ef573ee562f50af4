"""The proof a file carries that vit-fast wrote it as it is: the SHA-256 of its own bytes in a JSON field, a
Markdown closing comment or a PNG text chunk (docs/files.md)."""

from __future__ import annotations

import hashlib
import os
import re
import zlib
from pathlib import Path
from typing import Any

from .base import DIGEST_KEY, MARKDOWN_MARK, MARKER_KEY, PNG_DIGEST_KEY, PNG_KEY, ZERO_DIGEST
from .json_input import loads_json
from .reading import read_head

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
    return raw[:start] + ZERO_DIGEST.encode() + raw[end:]


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


#: each artifact format vit-fast writes -> its files' suffixes, as the export formats' registry
#: (vit_fast.export.formats) registers them; an artifact's metadata goes to ``ARTIFACT.json``
ARTIFACT_FORMATS: dict[str, tuple[str, ...]] = {}


def register_artifact_format(name: str, suffixes: tuple[str, ...]) -> None:
    """Make the file policy know an artifact format's suffixes (called by the export formats' registry)."""
    ARTIFACT_FORMATS[name] = tuple(s.lower() for s in suffixes)


def is_artifact_metadata(path: str | os.PathLike) -> bool:
    """Whether ``path`` is (or would be) the metadata JSON of an artifact: its content says so (vit-fast's
    marker and a ``format`` field, which only an artifact's metadata has), or it is named ``ARTIFACT.json``
    beside an existing file with a registered artifact suffix."""
    path = Path(path)
    data = read_json_object(path)
    if data is not None and MARKER_KEY in data and isinstance(data.get("format"), str):
        return True
    if not path.name.lower().endswith(".json"):
        return False
    artifact = Path(str(path)[: -len(".json")])
    suffixes = tuple(s for found in ARTIFACT_FORMATS.values() for s in found)
    return artifact.name.lower().endswith(suffixes) and (artifact.is_file() or artifact.is_symlink())
