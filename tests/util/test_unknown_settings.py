"""One list of the VIT_FAST_* names vit-fast reads (vit_fast/base/switches.py KNOWN): any other VIT_FAST_* variable
set is warned about once, with the closest known name, and ``vit-fast info`` lists every known one with its
value here."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from vit_fast.base import switches
from vit_fast.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_every_name_read_anywhere_is_known():
    """A VIT_FAST_* name written in the code (product, benchmarks, tools) is in the one list, so a new variable
    cannot be added without it (and then be warned about as unknown)."""
    found = set()
    for folder in ("kernels", "vit_fast", "export", "benchmarks", "tools", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            if path != Path(__file__).resolve():  # this file misspells names on purpose
                found |= set(re.findall(r"[\"'](VIT_FAST_[A-Z0-9_]+)[\"']", path.read_text()))
    assert found <= set(switches.KNOWN), found - set(switches.KNOWN)
    assert {"VIT_FAST_COMMIT", "VIT_FAST_PEERS", "VIT_FAST_PEERS_BACKEND"} <= found


def test_every_switch_without_a_default_says_what_unset_means():
    assert {n for n, d in switches.SWITCHES.items() if d is None} == set(switches.UNSET_MEANS)


def test_unknown_names_and_their_closest_known_one():
    env = {
        "VIT_FAST_AUTOTUNES": "0",  # the case seen
        "VIT_FAST_TMA": "1",
        "VIT_FAST_COMMIT": "abc",
        "vit_fast_fuse_ln": "0",  # right name, wrong case: the variable vit-fast reads is still unset
        "VIT_FAST_CHECK_FINTE": "1",
        "VIT_FAST_ZZZ": "1",
        "HOME": "/root",
    }
    assert switches.unknown_settings(env) == {
        "VIT_FAST_AUTOTUNES": "VIT_FAST_AUTOTUNE",
        "VIT_FAST_CHECK_FINTE": "VIT_FAST_CHECK_FINITE",
        "VIT_FAST_ZZZ": None,
        "vit_fast_fuse_ln": "VIT_FAST_FUSE_LN",
    }
    assert switches.unknown_settings({n: "1" for n in switches.KNOWN}) == {}


def test_each_unknown_name_is_warned_about_once(monkeypatch):
    monkeypatch.setattr(switches, "_WARNED", set())
    env = {"VIT_FAST_AUTOTUNES": "0", "VIT_FAST_ZZZ": "1", "VIT_FAST_TMA": "0"}
    with pytest.warns(switches.UnknownSettingWarning) as record:
        switches.warn_unknown(env)
    messages = [str(w.message) for w in record]
    assert len(messages) == 2
    assert re.match(r"VIT_FAST_AUTOTUNES is set, but vit-fast reads no variable of that name: did you mean "
                    r"VIT_FAST_AUTOTUNE\?", messages[0]), messages  # fmt: skip
    assert messages[1].startswith("VIT_FAST_ZZZ is set") and "VIT_FAST_TMA, VIT_FAST_TRACEBACK" in messages[1]
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        switches.warn_unknown(env)
    assert again == []


def test_first_use_warns_once_in_a_fresh_process(tmp_path):
    """The model (which reads switches) and then the CLI in one process: one warning, on stderr."""
    code = "import vit_fast\nvit_fast.VisionTransformer\nfrom vit_fast.cli import main\nmain(['--version'])\n"
    env = {"PATH": "/usr/bin:/bin", "VIT_FAST_AUTOTUNES": "0", "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "UnknownSettingWarning" in line]
    assert len(lines) == 1 and "VIT_FAST_AUTOTUNES is set" in lines[0] and "VIT_FAST_AUTOTUNE?" in lines[0]
    assert result.stdout.startswith("vit-fast ")


def test_info_lists_every_setting_with_its_value(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(switches, "_WARNED", {"VIT_FAST_AUTOTUNES"})  # warned about elsewhere; here: the listing
    monkeypatch.setenv("VIT_FAST_TMA", "0")
    monkeypatch.setenv("VIT_FAST_FUSE_LN", " ")
    monkeypatch.setenv("VIT_FAST_COMMIT", "abc123")
    monkeypatch.delenv("VIT_FAST_AUTOTUNE", raising=False)
    monkeypatch.setenv("VIT_FAST_AUTOTUNES", "0")
    assert main(["info", "--json", str(tmp_path / "info.json")]) == 0
    out = capsys.readouterr().out
    listing = out.split("settings (VIT_FAST_*", 1)[1]
    for name in switches.KNOWN:
        assert re.search(rf"^  {name} ", listing, re.M), name
    assert re.search(r"^  VIT_FAST_TMA +off \('0'\)$", listing, re.M), listing
    assert re.search(r"^  VIT_FAST_FUSE_LN +on \(' ': blank, so the default\)$", listing, re.M), listing
    assert re.search(r"^  VIT_FAST_AUTOTUNE +off \(default\)$", listing, re.M), listing
    assert re.search(r"^  VIT_FAST_COMMIT +'abc123'", listing, re.M), listing
    assert re.search(
        r"^  VIT_FAST_AUTOTUNES +'0': not read by vit-fast; did you mean VIT_FAST_AUTOTUNE\?$", listing, re.M
    )
    rows = {row["name"]: row for row in json.loads((tmp_path / "info.json").read_text())["settings"]}
    assert rows["VIT_FAST_TMA"] == {"name": "VIT_FAST_TMA", "value": "0", "effective": "off", "default": False}
    assert (
        rows["VIT_FAST_AUTOTUNES"]["unknown"] is True and rows["VIT_FAST_AUTOTUNES"]["closest"] == "VIT_FAST_AUTOTUNE"
    )
