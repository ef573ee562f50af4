"""Text from libraries as vit-fast passes it on: terminal escape sequences (colours, cursor moves) removed, so a
message reads the same in a terminal, a log file and a JSON report."""

from __future__ import annotations

import re

#: CSI sequences (``ESC [ ... letter``: colours, cursor moves), OSC sequences (``ESC ] ... BEL|ESC \\``) and
#: lone two-character escapes
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]|\x9b[0-?]*[ -/]*[@-~]")


def plain_text(text: str) -> str:
    """``text`` without terminal escape sequences (a library's coloured error, say)."""
    return _ESCAPES.sub("", text)


__all__ = ["plain_text"]
