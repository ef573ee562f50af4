"""The command line starts fast: ``--help``, ``--version`` and argument errors never import torch (the
subcommand bodies import it when they run), and Ctrl-C while torch imports is one line and exit 130."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# runs the real entry point and says, on its last stderr line, whether torch was ever imported
_PROBE = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules, file=sys.stderr))\n"
    "from vit_fast.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def _cli(*argv: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=120, env=env, cwd=cwd
    )


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["--help"], 0, "COMMAND"),
        (["--version"], 0, "vit-fast "),
        (["no-such-command"], 2, "invalid choice"),
        (["export", "--help"], 0, "tritonserver"),
        (["export", "onnx", "--help"], 0, "--batch"),
        (["bench", "--help"], 0, "--backends"),
        (["verify", "--help"], 0, "ARTIFACT"),
        (["info", "--help"], 0, "--json"),
        (["export", "onnx", "default", "--out", "m.onnx", "--batch", "0,4"], 2, "must be >= 1"),
        (["export", "onnx", "default"], 2, "--out"),
        (["export", "onnx", "default", "--out", "m.onnx", "--batch", "64,1"], 2, "'64,1' is out of order"),
        (["export", "tensorrt", "m.onnx", "--out", "m.plan", "--batch", "1,64,8"], 2, "MIN <= OPT <= MAX"),
        (["bench", "default", "--out", "o", "--min-time", "-1"], 2, "must be > 0"),
        (["verify", "default"], 2, "ARTIFACT"),
        (["export", "tritonserver", "--help"], 0, "--queue-delay-us"),
        (["demo", "--help"], 0, "--subset"),
        (["doctor", "--help"], 0, "--timeout"),
        (["serve", "--help"], 0, "--protect"),
        (["demo", "--subset", "0"], 2, "--subset"),
        (["doctor", "--timeout", "-1"], 2, "--timeout"),
        (["serve", "default", "--http-port", "http"], 2, "--http-port"),
        # --json takes a .json file or - (stdout), refused while parsing, as every argument is
        (["info", "--json", "report.txt"], 2, "'report.txt' is not a .json file: give a path such as report.json"),
        (["bench", "default", "--out", "o", "--json", "r.csv"], 2, "or - for standard output"),
        (["verify", "default", "m.onnx", "--json", ""], 2, "--json: got an empty path"),
        (["export", "tensorrt", "m.onnx", "--out", "m.plan", "--json", "m.plan"], 2, "'m.plan' is not a .json file"),
        (["export", "tritonserver", "default", "--out", "repo", "--json", "s.jsn"], 2, "'s.jsn' is not a .json"),
        (["serve", "default", "--json", "ready"], 2, "'ready' is not a .json file"),
        (["demo", "--json", "d.JSON.bak"], 2, "--json"),
        (["doctor", "--json", "out/"], 2, "--json"),
    ],
)
def test_help_version_and_argument_errors_do_not_import_torch(argv, code, says, tmp_path):
    result = _cli(*argv, cwd=tmp_path)
    assert result.returncode == code, result.stderr
    assert says in result.stdout + result.stderr
    assert result.stderr.rstrip().splitlines()[-1] == "torch imported: False", result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_the_command_body_does_import_torch(tmp_path):
    """The probe above can fail: a command that runs imports torch, and the probe says so."""
    result = _cli("info", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.rstrip().splitlines()[-1] == "torch imported: True"


def test_queue_delay_help_names_the_real_default():
    """--queue-delay-us's default is read when the command runs; --help shows the same number."""
    from vit_fast.cli.tritonserver import QUEUE_DELAY_HELP_US
    from vit_fast.export.tritonserver import DEFAULT_QUEUE_DELAY_US

    assert QUEUE_DELAY_HELP_US == DEFAULT_QUEUE_DELAY_US


def test_import_vit_fast_is_lazy_but_complete():
    """``import vit_fast`` imports no torch; every public name still resolves, and so do submodules."""
    code = textwrap.dedent(
        """
        import sys
        import vit_fast
        assert "torch" not in sys.modules, "import vit_fast imported torch"
        for name in vit_fast.__all__:
            getattr(vit_fast, name)
        assert vit_fast.export.to_onnx is not None
        try:
            vit_fast.no_such_name
        except AttributeError as err:
            assert "no_such_name" in str(err)
        else:
            raise SystemExit("no AttributeError")
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_ctrl_c_while_torch_imports_is_one_line_and_130(tmp_path):
    """A real SIGINT delivered while ``torch`` is being imported (a stand-in torch that signals its own
    process and then waits, as a slow import would): one line on stderr, exit 130, no traceback."""
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(30)\n")
    import os
    import signal

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "vit_fast.cli", "info"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        # as a terminal delivers it: a job started in the background by a non-interactive shell (a CI script's
        # `cmd &`) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert result.returncode == 130, result.stderr
    assert result.stderr.strip() == "vit-fast info: interrupted"


def test_info_names_a_package_present_only_when_it_imports(monkeypatch):
    """An installed package whose import fails (timm without torchvision) is reported as not usable, with
    the reason, never by its version alone."""
    from vit_fast.backend import env

    real = env.module_version
    monkeypatch.setattr(env, "module_version", lambda m: "1.0.31" if m == "timm" else real(m))
    monkeypatch.setitem(sys.modules, "timm", None)  # ``import timm`` raises ModuleNotFoundError
    info = env.collect_info()
    assert info["timm"] is None
    assert "1.0.31 is installed, but `import timm` fails" in info["import_failures"]["timm"]
    line = next(x for x in env.format_info(info).splitlines() if x.strip().startswith("timm"))
    assert "not usable" in line and "1.0.31" in line
    assert env.importable_version("no_such_module_xyz") == (None, None)  # not installed
    monkeypatch.setattr(env, "module_version", lambda m: "2.0")
    assert env.importable_version("json") == ("2.0", None)


def test_timm_paths_work_where_torchvision_cannot_be_imported(tmp_path):
    """In a fresh process (no test stand-in), where torchvision does not import, vit-fast's timm paths still
    work: timm:NAME with --weights loads and matches timm, with one note saying why the stand-in is used.
    Where the real torchvision imports, the same calls use it and print no note."""
    code = textwrap.dedent(
        f"""
        import sys, torch
        torchvision_ok = True
        try:
            import torchvision
        except Exception:
            torchvision_ok = False
        from vit_fast.interop.timm_import import import_timm
        timm = import_timm()
        ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8).eval()
        path = {str(tmp_path / "w.pth")!r}
        torch.save(ref.state_dict(), path)
        from vit_fast.interop.loading import load_model
        model = load_model("timm:vit_tiny_patch16_224", backend="torch", weights=path)
        print("sha256" in model.weights_source, torchvision_ok)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "True"
    notes = [line for line in result.stderr.splitlines() if "torchvision stand-in" in line]
    assert len(notes) == (0 if result.stdout.split()[1] == "True" else 1), result.stderr
