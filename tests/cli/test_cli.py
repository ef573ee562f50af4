"""The command line: info runs, every subcommand has a truthful --help with an example, one error
policy (main maps exceptions to exit statuses), and one argument grammar shared by every subcommand."""

import argparse
import subprocess
import sys

import pytest

from vit_fast import cli
from vit_fast.cli import _args

SUBCOMMANDS = ["info", "demo", "export", "export onnx", "export tensorrt", "verify", "bench", "doctor", "predict"]


def test_info_runs(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    for name in ("torch", "triton", "onnx", "onnxruntime", "tensorrt", "backends:"):
        assert name in out
    assert "gpu" in out


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_help_with_an_example(command, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([*command.split(), "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert f"vit-fast {command}" in out
    example = out.split("example:\n", 1)[1].strip()
    assert example.startswith(f"vit-fast {command}")


def test_every_subcommand_module_is_registered():
    """A module in vit_fast/cli/ that defines run() is a subcommand: it must be listed in SUBCOMMANDS."""
    from pathlib import Path

    folder = Path(cli.__file__).parent
    modules = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")}
    # tritonserver is a target of `vit-fast export`, registered by cli/export.py
    assert modules - {"tritonserver"} == {m.rsplit(".", 1)[1] for m, _ in cli.SUBCOMMANDS.values()}
    parser = cli.build_parser()
    export = next(a for a in parser._subparsers._group_actions[0].choices["export"]._actions if a.dest == "target")
    assert set(export.choices) == {"onnx", "tensorrt", "tritonserver"}


def test_no_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_console_entry_point_runs_as_module():
    result = subprocess.run([sys.executable, "-m", "vit_fast.cli", "--version"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("vit-fast ")


# --------------------------------------------------------------------------- the one error policy
def _raising(monkeypatch, err: BaseException) -> None:
    def run(args):
        raise err

    monkeypatch.setattr("vit_fast.cli.info.run", run)


@pytest.mark.parametrize(
    ("err", "line"),
    [
        (ValueError("batch must be >= 1"), "batch must be >= 1"),
        (KeyError("unknown preset 'x'"), "unknown preset 'x'"),  # without KeyError's extra quotes
        (FileNotFoundError("checkpoint 'a.pth' does not exist"), "checkpoint 'a.pth' does not exist"),
        (RuntimeError("the triton backend needs a CUDA GPU;\n set TRITON_INTERPRET=1"), "needs a CUDA GPU; set"),
        (_args.CommandError("--out 'x' cannot be a folder"), "--out 'x' cannot be a folder"),
        (
            ModuleNotFoundError("No module named 'onnx'", name="onnx"),
            "(the onnx extra: pip install -e '.[onnx]' in a vit-fast checkout)",
        ),
    ],
)
def test_user_errors_are_one_line_and_exit_1(monkeypatch, capsys, err, line):
    _raising(monkeypatch, err)
    assert cli.main(["info"]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("vit-fast info: error: ") and line in captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_our_own_exception_classes_are_user_errors(monkeypatch, capsys):
    from vit_fast.export import VerificationError

    _raising(monkeypatch, VerificationError("verification of 'm.onnx' failed: worst is ...", None))
    assert cli.main(["info"]) == 1
    assert "vit-fast info: error: verification of 'm.onnx' failed" in capsys.readouterr().err


@pytest.mark.parametrize("err", [TypeError("bug"), AttributeError("bug"), AssertionError("bug"), NotImplementedError()])
def test_bugs_keep_their_traceback(monkeypatch, err):
    _raising(monkeypatch, err)
    with pytest.raises(type(err)):
        cli.main(["info"])


def test_traceback_on_request(monkeypatch):
    _raising(monkeypatch, ValueError("bad value"))
    monkeypatch.setenv("VIT_FAST_TRACEBACK", "1")
    with pytest.raises(ValueError, match="bad value"):
        cli.main(["info"])


def test_interrupt_exits_130(monkeypatch, capsys):
    _raising(monkeypatch, KeyboardInterrupt())
    assert cli.main(["info"]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_nested_command_is_named(capsys, tmp_path):
    missing = tmp_path / "none.onnx"
    assert cli.main(["export", "tensorrt", str(missing), "--out", str(tmp_path / "m.plan")]) == 1
    assert capsys.readouterr().err.startswith("vit-fast export tensorrt: error: ")


# --------------------------------------------------------------------------- the one grammar
def _parse_error(parse, text: str) -> str:
    with pytest.raises(argparse.ArgumentTypeError) as exc:
        parse(text)
    return str(exc.value)


def test_batch_list():
    sizes = _args.batch_list()
    assert sizes("1,8,64") == [1, 8, 64] and sizes(" 3 ") == [3]
    assert "'x' in '1,x' is not an int" in _parse_error(sizes, "1,x")
    assert "empty entry" in _parse_error(sizes, "1,,2")
    assert "batch size 0 in '0' must be >= 1" in _parse_error(sizes, "0")
    assert "batch size 2 appears twice" in _parse_error(sizes, "2,2")
    profile = _args.batch_list("MIN", "OPT", "MAX")
    assert profile("8,8,8") == [8, 8, 8]  # a range may repeat a size
    assert "has 2 item(s); give MIN,OPT,MAX, e.g. 1,8,64" in _parse_error(profile, "1,8")


def test_dtype_spellings():
    for text in ("fp16", "FP16", "float16", "half", "torch.float16"):
        assert _args.dtype_name(text) == "fp16"
    assert _args.dtype_names("bfloat16,fp32,bf16") == ["bf16", "fp32"]
    assert "unknown dtype 'fp8'" in _parse_error(_args.dtype_name, "fp8")
    assert "unknown dtype 'int8'" in _parse_error(_args.dtype_names, "fp16,int8")


def test_numbers_and_device():
    assert _args.positive_int("3") == 3 and _args.nonnegative_int("0") == 0 and _args.positive_float("0.5") == 0.5
    assert "must be >= 1, got 0" in _parse_error(_args.positive_int, "0")
    assert "expected an int >= 0, got 'x'" in _parse_error(_args.nonnegative_int, "x")
    assert "must be > 0" in _parse_error(_args.positive_float, "0")
    assert _args.device("auto") == "auto" and _args.device("cpu") == "cpu"
    assert "unknown device 'tpu'" in _parse_error(_args.device, "tpu")


def test_cuda_device_without_a_gpu_is_a_usage_error(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the message on a machine without a GPU")
    assert "no CUDA GPU is visible" in _parse_error(_args.device, "cuda")


def test_output_paths_are_checked_up_front_created_later_and_never_under_a_file(tmp_path):
    assert _args.output_folder(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert _args.output_file(tmp_path / "c" / "r.json", "--json") == tmp_path / "c" / "r.json"
    assert list(tmp_path.iterdir()) == []  # nothing made by a check: a run that fails early leaves no trace
    (tmp_path / "a").mkdir()
    (tmp_path / "f").write_text("")
    with pytest.raises(_args.CommandError, match=r"^--out '.*sub': '.*f' is a file, not a folder; choose another"):
        _args.output_folder(tmp_path / "f" / "sub")
    with pytest.raises(_args.CommandError, match=r"^--json '.*f.sub.r\.json': '.*f' is a file, not a folder"):
        _args.output_file(tmp_path / "f" / "sub" / "r.json", "--json")
    with pytest.raises(_args.CommandError, match="is a folder; give a file path"):
        _args.output_file(tmp_path / "a", "--json")
    assert _args.output_file(None, "--json") is None
