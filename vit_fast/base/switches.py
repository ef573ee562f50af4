"""The one parser for vit-fast's on/off environment switches (``VIT_FAST_*``) and for ``TRITON_INTERPRET``: every read
goes through :func:`environ_value`; a bad value raises :class:`SwitchError` (:func:`check_switches` at the CLI's
start); :data:`KNOWN` lists every ``VIT_FAST_*`` name and an unknown one is warned about once (:func:`warn_unknown`).
Imports nothing of ours, so the kernels read their switches through it too. The rules: docs/kernels.md, "Settings"."""

from __future__ import annotations

import difflib
import os
import warnings
from collections.abc import Mapping
from typing import Any

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")
ACCEPTED = "1 or 0 (also true/false, yes/no, on/off, any case)"

#: every switch vit-fast reads -> its value when unset (None: decided by the reader, e.g. the first-use check)
SWITCHES: dict[str, bool | None] = {
    "VIT_FAST_AUTOTUNE": False,
    "VIT_FAST_AUTOTUNE_CACHE": True,
    "VIT_FAST_CHECK_FINITE": False,
    "VIT_FAST_FIRST_USE_CHECK": None,
    "VIT_FAST_FUSE_LN": True,
    "VIT_FAST_TMA": True,
    "VIT_FAST_TRACEBACK": False,
}

#: what a switch whose default is None means when unset
UNSET_MEANS: dict[str, str] = {"VIT_FAST_FIRST_USE_CHECK": "on for compiled kernels, off under Triton's interpreter"}

#: the other ``VIT_FAST_*`` variables read (values, not switches) -> what they hold
SETTINGS: dict[str, str] = {
    "VIT_FAST_COMMIT": "the commit recorded in reports where the tree has no .git",
    "VIT_FAST_PEERS": "tools/peers (make peers-hf): none, apply or optimize",
    "VIT_FAST_PEERS_BACKEND": "tools/peers (make peers-hf): auto or triton",
    "VIT_FAST_PEERS_LAUNCHES": "tools/peers: the file a peers' test run writes its kernel launch counts to",
}

#: every ``VIT_FAST_*`` name vit-fast and its tools read; any other one set is named by :func:`warn_unknown`
KNOWN: tuple[str, ...] = (*SWITCHES, *SETTINGS)
PREFIX = "VIT_FAST_"


class UnknownSettingWarning(UserWarning):
    """A ``VIT_FAST_*`` variable is set that vit-fast does not read (a typo: the message names the closest one)."""


#: what Triton 3.x's ``getenv_bool`` reads as on (case-insensitive, the value exactly as set)
TRITON_ON = ("1", "true", "yes", "on", "y")
#: values Triton reads as off that are plainly meant as off
TRITON_OFF = ("", "0", "false", "no", "off", "n")

_PARSED: dict[tuple[str, str], bool | None] = {}  # (name, raw value) -> flag; reads run per launch


class SwitchError(ValueError):
    """An environment switch holds a value that is neither on nor off (the message names it and the fix)."""


def parse_switch(name: str, raw: str | None, default: bool | None = None) -> bool | None:
    """``raw`` (the variable's value, None when unset) as a flag: ``default`` when unset or blank."""
    if raw is None:
        return default
    value = raw.strip().lower()
    if not value:
        return default
    if value in ON:
        return True
    if value in OFF:
        return False
    raise SwitchError(f"{name}={raw!r} is not a switch: use {ACCEPTED}, or unset it")


def environ_value(name: str) -> str | None:
    """The value of environment variable ``name`` as ``os.environ`` holds it now (None: unset). Read at every call,
    so a user or a test may change a switch at any time; an unset name costs about 0.6 µs (a KeyError raised and
    caught inside ``os.environ.get``)."""
    return os.environ.get(name)


def switch(name: str, default: bool | None = None) -> bool | None:
    """The switch ``name`` read now from the environment (users and tests may change it at any time)."""
    raw = environ_value(name)
    if raw is None:
        return default
    key = (name, raw)
    flag = _PARSED.get(key, _PARSED)
    if flag is _PARSED:
        flag = parse_switch(name, raw, None)
        _PARSED[key] = flag
    return default if flag is None else flag


def parse_triton_interpret(raw: str | None) -> bool:
    """``TRITON_INTERPRET`` as Triton reads it; raises :class:`SwitchError` for a value Triton reads as off
    that is not plainly off (so the user's intent and Triton's reading may differ)."""
    if raw is None:
        return False
    value = raw.lower()
    if value in TRITON_ON:
        return True
    if value in TRITON_OFF:
        return False
    raise SwitchError(
        f"TRITON_INTERPRET={raw!r}: Triton reads it as off (its interpreter is on only for 1, true, yes, on or y, "
        "in any case and without spaces): set TRITON_INTERPRET=1 to run the kernels on the CPU, or 0 (or unset it) "
        "for the GPU"
    )


def check_switches(environ: dict[str, str] | None = None) -> None:
    """Raise :class:`SwitchError` naming every switch (and ``TRITON_INTERPRET``) whose value is not accepted."""
    environ = os.environ if environ is None else environ
    problems = []
    for name in SWITCHES:
        try:
            parse_switch(name, environ.get(name))
        except SwitchError as err:
            problems.append(str(err))
    try:
        parse_triton_interpret(environ.get("TRITON_INTERPRET"))
    except SwitchError as err:
        problems.append(str(err))
    if problems:
        raise SwitchError("; ".join(problems))


def unknown_settings(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """Every variable set that looks like one of ours (``VIT_FAST_*``, in any case) but is not in :data:`KNOWN`
    -> the closest known name (None when nothing is close)."""
    environ = os.environ if environ is None else environ
    unknown = {}
    for name in sorted(environ):
        if name.upper().startswith(PREFIX) and name not in KNOWN:
            # compared without the prefix they all share, so VIT_FAST_ZZZ is close to nothing
            tails = {known[len(PREFIX) :]: known for known in KNOWN}
            close = difflib.get_close_matches(name.upper()[len(PREFIX) :], tails, n=1, cutoff=0.6)
            unknown[name] = tails[close[0]] if close else None
    return unknown


_WARNED: set[str] = set()  # names already warned about in this process


def warn_unknown(environ: Mapping[str, str] | None = None) -> None:
    """Warn (:class:`UnknownSettingWarning`), once per name and process, about each ``VIT_FAST_*`` variable set
    that vit-fast does not read: ``VIT_FAST_AUTOTUNES=0`` would otherwise change nothing, silently. Runs when
    this module is first imported, which every part of vit-fast that reads a switch (and the CLI) does."""
    for name, close in unknown_settings(environ).items():
        if name in _WARNED:
            continue
        _WARNED.add(name)
        hint = f"did you mean {close}?" if close else f"vit-fast reads {', '.join(KNOWN)}"
        warnings.warn(
            f"{name} is set, but vit-fast reads no variable of that name: {hint} (vit-fast info lists them)",
            UnknownSettingWarning,
            stacklevel=2,
        )


def settings(environ: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every known ``VIT_FAST_*`` name with its value now (``value``: the text set, None when unset) and what it
    means (``effective``: on / off for a switch, with ``default`` True when unset or blank), then each unknown
    one set (``unknown``: True, ``closest``). Raises :class:`SwitchError` for a switch that is neither on nor off."""
    environ = os.environ if environ is None else environ
    rows: list[dict[str, Any]] = []
    for name, default in SWITCHES.items():
        raw = environ.get(name)
        flag = parse_switch(name, raw, None)
        if flag is None:
            effective = UNSET_MEANS[name] if default is None else ("on" if default else "off")
        else:
            effective = "on" if flag else "off"
        rows.append({"name": name, "value": raw, "effective": effective, "default": flag is None})
    for name, what in SETTINGS.items():
        raw = environ.get(name)
        rows.append({"name": name, "value": raw, "effective": raw or "unset", "default": not raw, "what": what})
    for name, close in unknown_settings(environ).items():
        rows.append({"name": name, "value": environ[name], "unknown": True, "closest": close})
    return rows


def format_settings(rows: list[dict[str, Any]]) -> str:
    """:func:`settings` as the lines ``vit-fast info`` prints."""
    lines = ["settings (VIT_FAST_*; a switch takes 1/0, true/false, yes/no or on/off):"]
    for row in rows:
        name, raw = row["name"], row["value"]
        if row.get("unknown"):
            close = f"; did you mean {row['closest']}?" if row["closest"] else ""
            lines.append(f"  {name:<26} {raw!r}: not read by vit-fast{close}")
        elif "what" in row:  # a value, not a switch
            lines.append(f"  {name:<26} {'unset' if raw is None else repr(raw)}  ({row['what']})")
        else:
            source = "default" if raw is None else f"{raw!r}" + (": blank, so the default" if row["default"] else "")
            lines.append(f"  {name:<26} {row['effective']} ({source})")
    return "\n".join(lines)


warn_unknown()
