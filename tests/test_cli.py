"""The command line: info runs, every subcommand has a truthful --help, bad usage fails."""

import subprocess
import sys

import pytest

from vit_fast import cli


def test_info_runs(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    for name in ("torch", "triton", "onnx", "onnxruntime", "tensorrt", "backends:"):
        assert name in out
    assert "gpu" in out


@pytest.mark.parametrize("command", ["info", "demo", "export", "verify", "bench"])
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([command, "--help"])
    assert exc.value.code == 0
    assert f"vit-fast {command}" in capsys.readouterr().out


def test_no_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_console_entry_point_runs_as_module():
    result = subprocess.run([sys.executable, "-m", "vit_fast.cli", "--version"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("vit-fast ")
