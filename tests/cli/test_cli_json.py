"""``--json -``: every command that has ``--json`` writes its JSON report to standard output, as ``gh --json`` and
``docker ... --format json`` do, and everything else it prints there (tables, progress, a child process's output)
goes to stderr, so stdout parses as JSON alone. ``info --json`` alone means the same. Bad ``--json`` values are
refused while parsing (tests/cli/test_cli_startup.py, tests/cli/test_catalogue.py); a closed stdout
(tests/cli/test_cli_pipe.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vit_fast.cli import _args, main
from vit_fast.util.files import MARKER_KEY, json_text


def _run(argv: list[str], capsys) -> tuple[int, dict, str]:
    """``vit-fast ARGV`` in this process: its exit status, stdout parsed as one JSON document, and stderr."""
    rc = main(argv)
    out, err = capsys.readouterr()
    try:
        return rc, json.loads(out), err
    except ValueError:
        pytest.fail(f"stdout of {argv} is not JSON alone:\n{out}")


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    import vit_fast
    from vit_fast import VisionTransformer, ViTConfig

    cfg = ViTConfig(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3)
    path = tmp_path_factory.mktemp("tiny") / "tiny.safetensors"
    vit_fast.save_checkpoint(VisionTransformer(cfg, backend="torch").eval(), path)
    return path


def test_info_json_dash_in_a_real_process(tmp_path):
    """As a user pipes it: fd 1 carries the JSON alone, the text report goes to stderr, no file is written."""
    result = subprocess.run(
        [sys.executable, "-m", "vit_fast.cli", "info", "--json", "-"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report[MARKER_KEY] and "settings" in report and "backends" in report
    assert "versions:" in result.stderr and "settings (VIT_FAST_*" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_info_json_alone_is_stdout(folder, capsys):
    rc, report, err = _run(["info", "--json"], capsys)
    assert rc == 0 and report[MARKER_KEY] and "versions:" in err
    assert "wrote" not in err and list(folder.iterdir()) == []
    rc, again, _ = _run(["info", "--json", "-", "--overwrite"], capsys)
    assert rc == 0 and again.keys() == report.keys()
    assert main(["info", "--json", "info.json"]) == 0  # a path still writes a file, and says so on stdout
    assert "wrote info.json" in capsys.readouterr().out
    assert json.loads((folder / "info.json").read_text()).keys() == report.keys()


def test_everything_but_the_json_goes_to_stderr_even_below_python(capfd, monkeypatch):
    """What a command prints, what a child process it starts writes to its inherited stdout, and what native code
    writes to fd 1 all reach stderr; stdout gets the report alone, and is stdout again once the command ends."""
    from vit_fast.cli import info

    def run(args):
        print("a table")
        subprocess.run([sys.executable, "-c", "print('a child process')"], check=True)
        os.write(1, b"native code\n")
        _args.write_json({"ok": 1}, _args.json_file(args.json))
        print("after the report")
        return 0

    monkeypatch.setattr(info, "run", run)
    assert main(["info", "--json", "-"]) == 0
    out, err = capfd.readouterr()
    assert out == json_text({"ok": 1})
    assert all(text in err for text in ("a table", "a child process", "native code", "after the report")), err
    print("stdout is back")
    assert capfd.readouterr().out == "stdout is back\n"


def test_a_failing_command_still_puts_its_error_on_stderr(capsys, monkeypatch):
    from vit_fast.cli import info

    def run(args):
        print("half a table")
        raise ValueError("the thing failed; fix it")

    monkeypatch.setattr(info, "run", run)
    assert main(["info", "--json", "-"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "half a table" in err and "vit-fast info: error: the thing failed; fix it" in err


def test_export_onnx_and_verify_json_dash(folder, capsys, tiny_checkpoint):
    pytest.importorskip("onnxruntime", reason="the onnx extra runs the exported file")
    argv = ["export", "onnx", str(tiny_checkpoint), "--out", "m.onnx", "--batch", "1,2", "--exporter", "torchscript"]
    rc, report, err = _run([*argv, "--seed", "0", "--json", "-"], capsys)
    assert rc == 0 and report["passed"] is True and report["artifact"] == "m.onnx" and report["rows"]
    assert "wrote m.onnx: verified" in err and "PASSED" in err  # the table and the last line went to stderr
    assert sorted(p.name for p in folder.iterdir()) == ["m.onnx", "m.onnx.json"]  # no report file
    rc, verified, err = _run(["verify", str(tiny_checkpoint), "m.onnx", "--batch", "1,2", "--json", "-"], capsys)
    assert rc == 0 and verified["passed"] is True and verified["rule"] == report["rule"]
    assert "recorded at export" in err and "PASSED" in err
    assert sorted(p.name for p in folder.iterdir()) == ["m.onnx", "m.onnx.json"]


def test_bench_json_dash_and_its_text(folder, capsys):
    argv = ["bench", "default", "--batch", "1", "--backends", "torch", "--device", "cpu", "--threads", "1"]
    argv += ["--min-samples", "3", "--max-samples", "3", "--min-time", "0.01", "--warmup", "1", "--out", "b"]
    rc, report, err = _run([*argv, "--json", "-"], capsys)
    assert rc == 0 and [r["status"] for r in report["rows"]] == ["ok"]
    assert report == json.loads((folder / "b" / "bench_default.json").read_text())  # the file's own text
    assert "| torch | - | fp32 | 1 |" in err and "wrote json:" in err  # the Markdown table went to stderr
    # labels and counts read right: one thread is "1 torch thread", the activation is named once
    assert "1 torch thread)" in err and "activation gelu" in err, err
    assert not re.search(r"\b1 [A-Za-z ]*?(thread|core|block|token)s\b", err) and "GELU gelu" not in err, err


def test_demo_json_dash(folder, capsys):
    pytest.importorskip(
        "sklearn",
        reason="the demo needs scikit-learn (the demo extra: pip install -e '.[demo]' in a vit-fast checkout)",
    )
    argv = ["demo", "--out", "d", "--skip-triton", "--skip-onnx", "--skip-timing", "--no-plots", "--json", "-"]
    rc, report, err = _run(argv, capsys)
    assert rc == 0 and report == json.loads((folder / "d" / "report.json").read_text())
    assert "step" in err and "accuracy" in err and "OK in" in err


def test_doctor_json_dash(folder, capsys):
    """A model that cannot load keeps doctor short: it exits 1, and the report still goes to stdout."""
    argv = ["doctor", "--model", "no_such_model", "--device", "cpu", "--out", "dd", "--json", "-"]
    rc, report, err = _run(argv, capsys)
    assert rc == 1 and report == json.loads((folder / "dd" / "report.json").read_text())
    assert report["failed"] == ["load"] and "FAILED: load" in err


def test_tritonserver_json_dash(folder, capsys):
    pytest.importorskip("onnxruntime", reason="the repository's ONNX file is verified on ONNX Runtime")
    argv = ["export", "tritonserver", "default", "--out", "repo", "--seed", "0", "--quiet", "--json", "-"]
    rc, summary, err = _run(argv, capsys)
    assert rc == 0 and [m["name"] for m in summary["models"]] == ["default"] and summary["models"][0]["verified"]
    assert "start Triton on it" in err


def test_serve_ready_json_dash(folder, capsys, monkeypatch):
    """The ready summary (with the model's own probe) goes to stdout as soon as it holds; Triton is a stand-in."""
    from vit_fast.serve import server as srv

    monkeypatch.setattr(srv, "require_serve", lambda: None)
    monkeypatch.setattr(srv.Server, "check_ports", lambda server: None)
    monkeypatch.setattr(srv.Server, "_start_once", lambda server: server)
    monkeypatch.setattr(srv.Server, "_wait_ready", lambda server: None)
    monkeypatch.setattr(srv.Server, "wait", lambda server, poll_s=1.0: True)  # as if asked to stop at once
    rc, ready, err = _run(["serve", "default", "--json", "-"], capsys)
    assert rc == 0 and ready["model"] == "default" and ready["ready"].endswith("/v2/models/default/ready")
    assert "serving 'default'" in err and "ready: Ctrl-C" in err


def test_a_failed_verification_still_reports_on_stdout(folder, capsys, monkeypatch):
    """As with a file (written before the failure is raised): the failed report goes to stdout, then exit 1."""
    import importlib

    verify_module = importlib.import_module("vit_fast.export.verify")  # the package's ``verify`` is the function

    class Report:
        def to_dict(self):
            return {"passed": False, "rows": ["the worst"]}

    def failing(*args, **kwargs):
        raise verify_module.VerificationError("verification of 'x' failed: worst is ...", Report())

    monkeypatch.setattr(verify_module, "verify", failing)
    rc, report, err = _run(["verify", "default", "triton", "--json", "-"], capsys)
    report.pop("vit_fast_digest")  # every JSON object vit-fast writes is sealed with the digest of its text
    assert rc == 1 and report == {"passed": False, "rows": ["the worst"]}
    assert "vit-fast verify: error: verification of 'x' failed" in err
