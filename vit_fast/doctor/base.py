"""A doctor check as a dict (section, name, status, summary, any fields), the row it prints as, and
:class:`CheckLog`, which keeps each check as it is noted and hands the list so far on."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from vit_fast.util.progress import Stages


def check_record(section: str, name: str, status: str | bool, summary: str, **fields: Any) -> dict[str, Any]:
    """One check's row in the doctor's report; ``status`` True / False stands for "ok" / "failed"."""
    if not isinstance(status, str):
        status = "ok" if status else "failed"
    return {"section": section, "name": name, "status": status, "summary": summary, **fields}


def failed_record(section: str, name: str, err: BaseException) -> dict[str, Any]:
    """A failed check's row naming the exception ``err`` (its first line) and keeping its traceback."""
    first = (str(err).strip().splitlines() or [""])[0]
    return check_record(
        section, name, False, f"{type(err).__name__}: {first}".rstrip(": "), traceback=traceback.format_exc()
    )


def format_check(check: dict[str, Any], counter: str = "") -> str:
    """One check as the row doctor prints: status, name and summary (``counter``: ``"[3/26] "``)."""
    return f"  {counter}{check['status']:<7}  {check['name']}: {check['summary']}"


class CheckLog(Stages):
    """Doctor's progress lines, which also keep each check as it is noted and hand the list so far to ``saved``
    (the report files rewritten, or the interpreter child's progress file), so an interrupt loses none."""

    def __init__(self, saved: Callable[[list[dict[str, Any]]], None] | None = None) -> None:
        super().__init__("vit-fast doctor")
        self.checks: list[dict[str, Any]] = []
        self.saved = saved or (lambda checks: None)

    def record(self, check: dict[str, Any]) -> None:
        self.checks.append(check)
        self.saved(self.checks)


def note_check(stages: Stages, check: dict[str, Any], counter: str = "") -> None:
    """Print ``check`` as its row, once, when it is made (``stages`` off: nothing), and record it where ``stages``
    is a :class:`CheckLog` (the report files rewritten with it)."""
    if stages.enabled:
        print(format_check(check, counter), flush=True)
    if isinstance(stages, CheckLog):
        stages.record(check)
