"""The one parser for vit-fast's on/off environment switches (``VIT_FAST_*``) and for ``TRITON_INTERPRET``.

A switch is on for 1, true, yes or on and off for 0, false, no or off, in any case, with surrounding spaces
ignored; unset or empty means its default. Any other value raises :class:`SwitchError` naming the variable and
the accepted values, on the first read in the Python API, and before any work at the CLI's entry
(:func:`check_switches`). Imports nothing of ours, so the kernels (the lowest layer) read their switches here too.

``TRITON_INTERPRET`` is Triton's, not ours: Triton turns its interpreter on for 1, true, yes, on or y in any
case, with no spaces, and reads every other value as off. A value meant as on that Triton reads as off (``' 1'``,
``banana``) would end in Triton's "0 active drivers" far from its cause, so it is named too.
"""

from __future__ import annotations

import os

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


def switch(name: str, default: bool | None = None) -> bool | None:
    """The switch ``name`` read now from the environment (users and tests may change it at any time)."""
    raw = os.environ.get(name)
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
        f"TRITON_INTERPRET={raw!r}: Triton reads it as off (its interpreter is on only for 1, true, yes, on or y, in any "
        "case and without spaces): set TRITON_INTERPRET=1 to run the kernels on the CPU, or 0 (or unset it) for the GPU"
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
