"""Text from libraries as vit-fast passes it on: terminal escape sequences (colours, cursor moves) removed, so a
message reads the same in a terminal, a log file and a JSON report."""

from __future__ import annotations

import re

#: CSI sequences (``ESC [ ... letter``: colours, cursor moves), OSC sequences (``ESC ] ... BEL|ESC \\``: links,
#: titles), and the other escapes (``ESC`` + intermediates + a final byte: ``ESC ( B`` picks a character set)
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC
    r"|\x1b[ -/]*[0-~]"  # the others
    r"|\x9b[0-?]*[ -/]*[@-~]"  # CSI as one 8-bit byte
)


def plain_text(text: str) -> str:
    """``text`` without terminal escape sequences (a library's coloured error, say)."""
    return _ESCAPES.sub("", text)


__all__ = ["plain_text"]
