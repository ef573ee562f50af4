"""Bounded JSON input: size, nesting depth and integer length limits checked before ``json`` parses a file."""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any

from .reading import read_head

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
