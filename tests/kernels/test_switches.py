"""One parser for every environment switch (vit_fast/base/switches.py): each reader accepts the same words, refuses
anything else by name, TRITON_INTERPRET is read as Triton reads it, and the CLI refuses a bad switch up front."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from vit_fast.backend import first_use
from vit_fast.backend.triton_path import fuse_ln_from_env
from vit_fast.base import interpret, switches
from vit_fast.cli import main
from vit_fast.kernels import autotune
from vit_fast.model import validation

ROOT = Path(__file__).resolve().parents[2]

#: switch -> the function that reads it in the product
READERS = {
    "VIT_FAST_AUTOTUNE": autotune.autotune_enabled,
    "VIT_FAST_AUTOTUNE_CACHE": autotune.autotune_cache_enabled,
    "VIT_FAST_CHECK_FINITE": validation.finite_check_from_env,
    "VIT_FAST_FIRST_USE_CHECK": first_use.enabled,
    "VIT_FAST_FUSE_LN": fuse_ln_from_env,
    "VIT_FAST_TMA": autotune.tma_enabled,
    "VIT_FAST_TRACEBACK": lambda: switches.switch("VIT_FAST_TRACEBACK", False),
}
ON = ["1", "true", "TRUE", "Yes", "on", " ON ", "1\n"]
OFF = ["0", "false", "False", "no", "NO", "off", " Off "]
BAD = ["banana", "x", "2", "-1", "y", "enable", "t"]


def test_every_switch_has_a_reader_here():
    assert set(READERS) == set(switches.SWITCHES)


@pytest.mark.parametrize("name", sorted(READERS))
def test_each_reader_takes_the_same_words(monkeypatch, name):
    read = READERS[name]
    for value in ON:
        monkeypatch.setenv(name, value)
        assert read() is True, (name, value)
    for value in OFF:
        monkeypatch.setenv(name, value)
        assert read() is False, (name, value)
    for value in BAD:
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=rf"^{name}='{re.escape(value)}' is not a switch: use 1 or 0 \("):
            read()


@pytest.mark.parametrize("name, default", sorted((k, v) for k, v in switches.SWITCHES.items() if v is not None))
def test_unset_or_blank_takes_the_default(monkeypatch, name, default):
    monkeypatch.delenv(name, raising=False)
    assert READERS[name]() is default
    monkeypatch.setenv(name, "  ")
    assert READERS[name]() is default


def test_first_use_unset_follows_the_interpreter(monkeypatch):
    monkeypatch.delenv(first_use.ENV, raising=False)
    assert first_use.enabled() is False  # the suite runs interpreted (tests/conftest.py)


def test_triton_interpret_is_read_as_triton_reads_it(monkeypatch):
    """Every value we accept means what Triton's own getenv_bool makes of it; values it reads as off that are not
    plainly off are refused by name."""
    from triton._C.libtriton import getenv_bool

    for value in ["1", "true", "TRUE", "Yes", "on", "y", "Y", "0", "false", "no", "OFF", "n", ""]:
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert interpret.interpreter_enabled() is getenv_bool("TRITON_INTERPRET", False), value
    for value in ["banana", " 1", "1 ", "2", "t", "enable"]:
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert getenv_bool("TRITON_INTERPRET", False) is False  # what Triton would have done: silently off
        with pytest.raises(ValueError, match=r"TRITON_INTERPRET=.*Triton reads it as off.*set TRITON_INTERPRET=1"):
            interpret.interpreter_enabled()


def test_check_switches_names_every_bad_one():
    env = {"VIT_FAST_AUTOTUNE": "banana", "VIT_FAST_TMA": "x", "VIT_FAST_FUSE_LN": "off", "TRITON_INTERPRET": "z"}
    with pytest.raises(switches.SwitchError) as info:
        switches.check_switches(env)
    text = str(info.value)
    assert "VIT_FAST_AUTOTUNE='banana'" in text and "VIT_FAST_TMA='x'" in text and "TRITON_INTERPRET='z'" in text
    assert "FUSE_LN" not in text and "\n" not in text
    switches.check_switches({"VIT_FAST_CHECK_FINITE": "No", "TRITON_INTERPRET": "1", "VIT_FAST_COMMIT": "abc"})


@pytest.mark.parametrize(
    "name, value",
    [("VIT_FAST_AUTOTUNE", "banana"), ("VIT_FAST_TMA", "x"), ("VIT_FAST_TRACEBACK", "2"), ("TRITON_INTERPRET", "b")],
)
def test_the_cli_refuses_a_bad_switch_before_any_work(monkeypatch, capsys, tmp_path, name, value):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(name, value)
    called = []
    monkeypatch.setattr("vit_fast.cli.build_parser", lambda: called.append(1))
    assert main(["export", "onnx", "default", "--out", "m.onnx"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert re.match(rf"vit-fast: error: {name}='{value}'.*(use 1 or 0|set TRITON_INTERPRET=1)", err), err
    assert called == [] and list(tmp_path.iterdir()) == []


def test_traceback_zero_keeps_the_one_line(monkeypatch, capsys, tmp_path):
    """VIT_FAST_TRACEBACK=0 used to show tracebacks (any non-empty value did)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VIT_FAST_TRACEBACK", "0")
    assert main(["verify", "default", "missing.onnx"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "does not exist" in err
    monkeypatch.setenv("VIT_FAST_TRACEBACK", "on")
    with pytest.raises(FileNotFoundError):
        main(["verify", "default", "missing.onnx"])


def test_no_switch_is_read_around_the_parser():
    """No product module reads a VIT_FAST_* switch or TRITON_INTERPRET from the environment itself."""
    names = set(switches.SWITCHES) | {"TRITON_INTERPRET"}
    offenders = []
    for folder in ("kernels", "vit_fast", "export", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "switches.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    if node.func.attr in ("get", "getenv", "encodekey") and node.args:
                        arg = node.args[0]
                        if isinstance(arg, ast.Constant) and arg.value in names:
                            offenders.append(f"{path.relative_to(ROOT)} {arg.value}")
                if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                    if node.slice.value in names and "environ" in ast.unparse(node.value):
                        offenders.append(f"{path.relative_to(ROOT)} {node.slice.value}")
    assert offenders == [], offenders  # the per-launch reads too: vit_fast/base/switches.py's environ_value


def test_environ_value_follows_every_change_made_through_os_environ(monkeypatch):
    """The switches are read on every launch: whatever changes ``os.environ`` (set, delete, update, clear,
    mock.patch.dict) is seen at once."""
    import os
    from unittest import mock

    name = "VIT_FAST_TMA"
    monkeypatch.delenv(name, raising=False)
    assert switches.environ_value(name) is None and autotune.tma_enabled() is True
    monkeypatch.setenv(name, "0")
    assert switches.environ_value(name) == "0" and autotune.tma_enabled() is False
    os.environ[name] = "yes"
    assert autotune.tma_enabled() is True
    del os.environ[name]
    assert switches.environ_value(name) is None
    with mock.patch.dict(os.environ, {name: "off"}):
        assert autotune.tma_enabled() is False
    assert switches.environ_value(name) is None
    os.environ.update({name: "0"})
    assert autotune.tma_enabled() is False
