"""`vit-fast demo` end to end on the CPU: exit code, report files, sane values."""

from __future__ import annotations

import importlib.util
import json
import struct
import sys

import pytest

pytest.importorskip("sklearn", reason="the demo needs scikit-learn (pip install -e '.[demo]')")

from vit_fast.cli import main  # noqa: E402

HAVE_ORT = importlib.util.find_spec("onnxruntime") is not None and importlib.util.find_spec("onnx") is not None
HAVE_TRITON = importlib.util.find_spec("triton") is not None
HAVE_MPL = importlib.util.find_spec("matplotlib") is not None
PICTURES = ["patches.png", "attention.png", "confusion.png", "timing.png"]


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path.name} is not a PNG"
    return struct.unpack(">II", data[16:24])


def _report(out) -> dict:
    report = json.loads((out / "report.json").read_text())
    assert (out / "report.md").read_text().startswith("# vit-fast demo")
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    return report


@pytest.mark.slow
def test_demo_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    # --device cpu: the same steps on every machine (the GPU steps are code paths for GPU machines)
    code = main(["demo", "--out", str(out), "--device", "cpu", "--subset", "4", "--repeats", "3"])
    printed = capsys.readouterr()
    report = _report(out)
    steps = {s["name"]: s for s in report["steps"]}
    assert code == report["exit_code"]
    assert code == 0, printed.out + printed.err
    assert report["ok"] and report["failed"] == []
    assert set(steps) == {"accuracy", "triton", "onnx", "timing", "cuda graph", "vit-b/16 latency", "figures"}
    # the summary table went to stdout, progress to stderr
    assert "accuracy" in printed.out and "status" in printed.out
    assert "[vit-fast demo] 1/6" in printed.err

    acc = steps["accuracy"]
    assert acc["status"] == "ok" and acc["images"] == 360
    assert 0.95 <= acc["accuracy"] <= 1.0 and abs(acc["delta_pp"]) <= 0.5

    tri = steps["triton"]
    if HAVE_TRITON:  # judged by `vit-fast verify default triton` in a child process
        assert tri["status"] == "ok", tri["summary"]
        assert tri["mode"] == "interpreter" and tri["images"] == 4 and "Triton interpreter" in tri["runtime"]
        assert tri["top1_agreement"] == 1.0 and 0 <= tri["max_abs_err"] <= tri["bound"] < 1e-3
        assert tri["verify_passed"] is True and tri["batches"] == [1, 3]
    else:
        assert tri["status"] == "skipped"

    onnx = steps["onnx"]
    if HAVE_ORT:
        assert onnx["status"] == "ok", onnx["summary"]
        assert (out / "digits_vit.onnx").is_file()
        assert onnx["top1_agreement"] == 1.0 and onnx["max_abs_err"] < 1e-4 and abs(onnx["accuracy_delta_pp"]) < 1e-9
        assert onnx["verify_passed"] is True
    timing = steps["timing"]
    assert timing["status"] == "ok" and timing["clock"] == "CPU wall-clock"
    for batch in ("1", "360"):
        assert 0 < timing["cases"][batch]["torch"]["median_ms"] < 60_000
        if HAVE_ORT:
            assert 0 < timing["cases"][batch]["onnxruntime"]["median_ms"] < 60_000
    for name in ("cuda graph", "vit-b/16 latency"):
        assert steps[name]["status"] == "skipped"  # GPU steps are guarded by torch.cuda.is_available()

    # the pictures: PNG files of their stated size, drawn from the numbers the report prints
    figs = steps["figures"]
    if not HAVE_MPL:
        assert figs["status"] == "skipped" and "matplotlib" in figs["summary"]
        return
    assert figs["status"] == "ok", figs["summary"]
    assert figs["files"] == PICTURES
    md = (out / "report.md").read_text()
    for name, fig in figs["figures"].items():
        assert _png_size(out / fig["file"]) == (fig["width_px"], fig["height_px"])
        assert f"![{name}]({fig['file']})" in md
    conf = figs["figures"]["confusion"]["data"]
    assert sum(map(sum, conf["matrix"])) == acc["images"] == 360
    assert sum(conf["matrix"][i][i] for i in range(10)) / 360 == pytest.approx(acc["accuracy"], abs=1e-12)
    for head_rows in figs["figures"]["attention"]["data"]["class_token_attention"]:
        for row in head_rows:
            assert len(row) == report["model"]["tokens"] and sum(row) == pytest.approx(1.0, abs=1e-6)
    bars = figs["figures"]["timing"]["data"]["bars"]
    assert len(bars) == (4 if HAVE_ORT else 2)
    for bar in bars:
        stats = timing["cases"][str(bar["batch"])][bar["backend"]]
        assert all(bar[k] == stats[k] for k in ("n", "median_ms", "p10_ms", "p90_ms"))
        assert stats["min_ms"] <= stats["p10_ms"] <= stats["median_ms"] <= stats["p90_ms"]


def test_demo_skips_are_reported_and_exit_zero(tmp_path, capsys):
    out = tmp_path / "new" / "skip"  # missing folders are created
    copy = tmp_path / "copies" / "demo.json"
    code = main(["demo", "--out", str(out), "--skip-triton", "--skip-onnx", "--skip-timing", "--json", str(copy)])
    capsys.readouterr()
    report = _report(out)
    assert copy.read_text() == (out / "report.json").read_text()
    steps = {s["name"]: s for s in report["steps"]}
    assert code == 0
    assert steps["accuracy"]["status"] == "ok"
    assert steps["triton"] == {"name": "triton", "status": "skipped", "summary": "--skip-triton"}
    assert steps["onnx"]["status"] == steps["timing"]["status"] == "skipped"
    if HAVE_MPL:  # the pictures that need no timing are still drawn
        assert steps["figures"]["status"] == "ok", steps["figures"]["summary"]
        assert sorted(p.name for p in out.glob("*.png")) == ["attention.png", "confusion.png", "patches.png"]
        assert "no timing.png: the timing step is skipped" in steps["figures"]["summary"]
        assert "![timing]" not in (out / "report.md").read_text()


def test_demo_no_plots_draws_nothing(tmp_path, capsys):
    out = tmp_path / "quiet"
    code = main(["demo", "--out", str(out), "--skip-triton", "--skip-onnx", "--skip-timing", "--no-plots"])
    capsys.readouterr()
    figs = next(s for s in _report(out)["steps"] if s["name"] == "figures")
    assert code == 0 and figs == {"name": "figures", "status": "skipped", "summary": "--no-plots"}
    assert not list(out.glob("*.png")) and "## Figures" not in (out / "report.md").read_text()


def test_demo_without_matplotlib_notes_it_in_one_line_and_does_not_fail(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    out = tmp_path / "nompl"
    code = main(["demo", "--out", str(out), "--skip-triton", "--skip-onnx", "--skip-timing"])
    printed = capsys.readouterr()
    report = _report(out)
    figs = next(s for s in report["steps"] if s["name"] == "figures")
    assert code == 0 and report["ok"] and figs["status"] == "skipped"
    assert figs["summary"] == (
        "matplotlib is not installed, so no pictures were drawn: pip install -e '.[demo]' in a vit-fast checkout"
    )
    noted = [line.split() for line in printed.out.splitlines() if "matplotlib is not installed" in line]
    assert len(noted) == 1 and noted[0][:2] == ["figures", "skipped"]  # one table row, not a failure
    assert not list(out.glob("*.png"))


@pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")
def test_demo_reports_a_failed_triton_step_without_numbers_and_exits_nonzero(tmp_path, capsys):
    out = tmp_path / "fail"
    code = main(
        ["demo", "--out", str(out), "--device", "cpu", "--skip-onnx", "--skip-timing", "--triton-timeout", "0.01"]
    )
    capsys.readouterr()
    report = _report(out)
    tri = next(s for s in report["steps"] if s["name"] == "triton")
    assert code == 1 and report["exit_code"] == 1 and report["failed"] == ["triton"]
    assert tri["status"] == "failed" and "longer than" in tri["summary"]
    assert "max_abs_err" not in tri and "top1_agreement" not in tri


@pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")
def test_demo_reports_why_the_verify_child_could_not_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("vit_fast.demo.interpreter.INTERPRETER_BATCHES", "0")  # a command line the child rejects
    out = tmp_path / "child"
    code = main(["demo", "--out", str(out), "--device", "cpu", "--skip-onnx", "--skip-timing"])
    capsys.readouterr()
    tri = next(s for s in _report(out)["steps"] if s["name"] == "triton")
    assert code == 1 and tri["status"] == "failed"
    assert "vit-fast verify exited 2" in tri["summary"] and "argument --batch" in tri["summary"]


@pytest.mark.parametrize(("args", "message"), [(["--subset", "0"], "must be >= 1"), (["--device", "tpu"], "tpu")])
def test_demo_rejects_bad_arguments(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--out", str(tmp_path), *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_demo_refuses_an_output_folder_under_a_file(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert main(["demo", "--out", str(tmp_path / "file" / "demo"), "--skip-triton", "--skip-onnx"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("vit-fast demo: error: --out") and "is a file" in err
