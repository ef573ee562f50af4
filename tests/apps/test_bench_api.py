"""The Python benchmarking API (vit_fast.bench.benchmark), the sampling rule, timing existing artifacts,
the CSV, the plot, and report files that never replace an earlier run's. CPU, seconds."""

from __future__ import annotations

import csv
import io
import json
import re
import time

import pytest
import torch

import vit_fast
from vit_fast import bench, export
from vit_fast.bench import report as bench_report
from vit_fast.bench.timing import Sampling, sample

from ..fakes import TINY, tiny_hf_classifier

QUICK = dict(device="cpu", threads=1, ceilings=False, min_samples=20, min_time_s=0.05, warmup=1)


@pytest.fixture(scope="module")
def seeded_model() -> vit_fast.VisionTransformer:
    model = vit_fast.VisionTransformer(vit_fast.ViTConfig(**TINY), backend="torch")
    model.init_weights(seed=3)
    return model.eval()


@pytest.fixture(scope="module")
def result(seeded_model) -> bench.BenchResult:
    return bench.benchmark(
        seeded_model, batch="1,2", backends="torch,onnxruntime", onnx_exporter="torchscript", **QUICK
    )


# --------------------------------------------------------------------------- the Python API
def test_benchmark_returns_rows_and_writes_nothing(seeded_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = bench.benchmark(seeded_model, batch=[2], backends=["torch"], **QUICK)
    assert list(tmp_path.iterdir()) == []
    assert isinstance(res, bench.BenchResult) and len(res) == 1 and list(res) == res.rows
    (row,) = res.ok()
    assert row["backend"] == "torch" and row["batch"] == 2 and row["dtype"] == "fp32"
    assert row["n"] >= 20 and row["timed_s"] >= 0.05 and row["stopped_by"] == "target"
    assert row["p10_ms"] <= row["median_ms"] <= row["p90_ms"] <= row["p99_ms"]
    assert row["threads"] == 1 and row["weights"] == "random (seed 3)"
    assert row["weights_source"] == {"kind": "random", "seed": 3}
    assert res.report["weights"]["description"] == "random (seed 3)" and res.report["vit_fast_version"]


def test_threads_are_the_same_for_torch_and_onnxruntime(result):
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    rows = {(r["backend"], r["batch"]): r for r in result.ok()}
    assert rows[("onnxruntime", 1)]["threads"] == rows[("torch", 1)]["threads"] == 1
    assert "intra_op_num_threads=1" in rows[("onnxruntime", 1)]["notes"]
    assert result.report["settings"]["threads"] == 1
    assert all(r["max_abs_err_vs_torch"] < 1e-4 for r in result.ok())


def test_hugging_face_drop_in_is_benchmarked_as_the_plain_module():
    hf = tiny_hf_classifier(num_labels=3)
    res = bench.benchmark(vit_fast.optimize(hf), batch=1, backends="torch", **QUICK)
    (row,) = res.ok()  # timed: optimize(hf) is a ViTForImageClassification, the bench times vit_fast.from_hf of it
    assert row["model"].startswith("ViTForImageClassification") and row["weights_source"]["kind"] == "hf"


def test_bad_requests_are_bench_errors(seeded_model):
    with pytest.raises(bench.BenchError, match=r"unknown backend 'trition'"):
        bench.benchmark(seeded_model, backends="torch,trition", **QUICK)
    with pytest.raises(bench.BenchError, match=r"min_samples >= 1"):
        bench.benchmark(seeded_model, backends="torch", **{**QUICK, "min_samples": 0})
    with pytest.raises(bench.BenchError, match=r"is not an int"):
        bench.benchmark(seeded_model, batch="1,x", backends="torch", **QUICK)
    with pytest.raises(TypeError, match=r"bench takes a vit_fast.VisionTransformer, got Linear"):
        bench.benchmark(torch.nn.Linear(2, 2), backends="torch", **QUICK)


# --------------------------------------------------------------------------- the sampling rule
def test_sampling_stops_when_both_minimums_are_met():
    rule = Sampling(warmup=0, min_samples=100, min_time_s=1.0, max_samples=1000, max_seconds=30.0)
    assert rule.stop(100, 0.5, 0.5) is None  # enough calls, not enough time
    assert rule.stop(50, 2.0, 2.0) is None  # enough time, not enough calls
    assert rule.stop(100, 1.0, 1.1) == "target"
    assert rule.stop(1000, 0.1, 0.1) == "sample cap"
    assert rule.stop(10, 0.5, 30.0) == "time cap" and rule.stop(2, 0.5, 30.0) is None  # the cap keeps a floor
    assert rule.more(0, 0.0, 0.0, 0.001) == 1000  # 1 s at 1 ms per call, capped at 1000 calls
    assert rule.more(0, 0.0, 0.0, 1.0) == 30  # 30 s cap at 1 s per call, though 100 calls are wanted
    assert rule.more(100, 0.2, 0.2, 0.001) == 800  # 0.8 s more at 1 ms
    with pytest.raises(ValueError, match=r"min_samples >= 1"):
        Sampling(warmup=0, min_samples=0)


def test_expected_calls_follow_the_stopping_rule():
    """What the estimate of a case's time rests on: the calls sample() makes at a given time per call."""
    rule = Sampling(warmup=2, min_samples=100, min_time_s=1.0, max_samples=1000, max_seconds=30.0, floor=3)
    assert rule.expected_calls(0.0001) == 1000  # 1 s at 0.1 ms is 10000 calls: the sample cap
    assert rule.expected_calls(0.002) == 500  # 1 s of calls
    assert rule.expected_calls(0.05) == 100  # the minimum count
    assert rule.expected_calls(1.0) == 30  # the 30 s cap
    assert rule.expected_calls(20.0) == 3  # the cap keeps its floor
    calls = []
    times, why = sample(lambda: calls.append(1), torch.device("cpu"), Sampling(warmup=0, min_samples=40))
    assert len(times) == Sampling(warmup=0, min_samples=40).expected_calls(0.0) == 40


def test_sample_on_cpu_meets_the_minimums():
    calls = []
    times, why = sample(lambda: calls.append(1), torch.device("cpu"), Sampling(warmup=3, min_samples=50))
    assert len(times) == 50 and len(calls) == 53 and why == "target"
    times, why = sample(
        lambda: time.sleep(0.002), torch.device("cpu"), Sampling(warmup=0, min_samples=3, min_time_s=0.05)
    )
    assert sum(times) >= 50 and len(times) >= 3 and why == "target"
    times, why = sample(
        lambda: time.sleep(0.01), torch.device("cpu"), Sampling(warmup=0, min_samples=1000, max_seconds=0.05, floor=2)
    )
    assert 2 <= len(times) < 1000 and why == "time cap"
    times, why = sample(lambda: None, torch.device("cpu"), Sampling(warmup=0, min_samples=10**6, max_samples=7))
    assert len(times) == 7 and why == "sample cap"


def test_defaults_make_p99_rest_on_100_samples_on_cpu():
    cpu = bench.BenchSettings(model="x").resolved(torch.device("cpu"))
    assert cpu["min_samples"] >= 100 and cpu["min_time_s"] >= 1.0 and cpu["iters"] >= cpu["min_samples"]


# --------------------------------------------------------------------------- timing an artifact
@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory, seeded_model):
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    folder = tmp_path_factory.mktemp("artifact")
    return export.to_onnx(
        seeded_model,
        folder / "m.onnx",
        batch=(1, 4),
        exporter="torchscript",
        progress=False,
        verify=export.VerifyOptions(print_table=False),
    )


def test_an_onnx_artifact_is_timed_by_its_runtime(onnx_file):
    res = bench.benchmark(str(onnx_file), **QUICK)
    assert [(r["backend"], r["label"], r["batch"], r["status"]) for r in res.rows] == [
        ("onnxruntime", "m.onnx", 1, "ok"),
        ("onnxruntime", "m.onnx", 4, "ok"),  # defaults 1,8 on CPU: 8 is past the artifact's range, its max stands in
    ]
    row = res.rows[0]
    assert row["verified"] is True and row["weights"] == "random (seed 3)" and row["tokens"] == 17
    assert row["max_abs_err_vs_torch"] is None and row["n"] >= 20 and row["threads"] == 1
    assert res.report["artifact"] == str(onnx_file) and res.report["settings"]["dtypes"] == ["fp32"]
    assert "- artifact: " in res.markdown() and "verified: True" in res.markdown()


def test_artifact_requests_that_do_not_fit_are_refused(onnx_file):
    with pytest.raises(bench.BenchError, match=r"batch sizes \[8\] lie outside the artifact's range \[1, 4\]"):
        bench.benchmark(str(onnx_file), batch=8, **QUICK)
    with pytest.raises(bench.BenchError, match=r"computes in fp32, not fp16: leave the dtype unset"):
        bench.benchmark(str(onnx_file), dtypes="fp16", **QUICK)
    with pytest.raises(bench.BenchError, match=r"timed by onnxruntime, its own runtime"):
        bench.benchmark(str(onnx_file), backends="torch", **QUICK)


def test_an_artifact_without_metadata_is_timed_at_its_graph_shape(onnx_file, tmp_path):
    bare = tmp_path / "bare.onnx"
    bare.write_bytes(onnx_file.read_bytes())
    res = bench.benchmark(str(bare), batch=2, **QUICK)
    (row,) = res.ok()
    assert row["weights"] == "not recorded" and row["tokens"] is None and row["params"] is None
    assert "architecture unknown" in res.markdown()


def test_a_uint8_artifact_is_fed_uint8_images(seeded_model, tmp_path):
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    path = export.to_onnx(
        seeded_model,
        tmp_path / "u8.onnx",
        batch=(1, 2),
        exporter="torchscript",
        progress=False,
        preprocess=dict(layout="NHWC", mean=0.5, std=0.25),
    )
    seen = []
    real = export.runners.OrtRunner._bind

    def spy(self, x):
        seen.append((x.dtype, tuple(x.shape)))
        return real(self, x)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(export.runners.OrtRunner, "_bind", spy)
        (row,) = bench.benchmark(str(path), batch=2, **QUICK).ok()
    assert seen == [(torch.uint8, (2, 32, 32, 3))] and row["n"] >= 20


# --------------------------------------------------------------------------- files, CSV, plot
def test_a_second_run_never_replaces_the_first(result, tmp_path):
    first = result.write(tmp_path, "bench_tiny")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    second = result.write(tmp_path, "bench_tiny")
    assert sorted(first) == ["csv", "json", "markdown", "png"]
    assert second["json"].name == f"bench_tiny-{result.report['run_id']}.json"
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name in before} == before
    third = result.write(tmp_path, "bench_tiny")
    assert third["json"].name == f"bench_tiny-{result.report['run_id']}-2.json"
    replaced = result.write(tmp_path, "bench_tiny", overwrite=True)
    assert replaced["json"] == first["json"] and len(list(tmp_path.iterdir())) == 12


def test_run_benchmark_checks_its_folder_first(tmp_path):
    (tmp_path / "afile").write_text("x")
    settings = bench.BenchSettings(model="no_such_model", out_dir=tmp_path / "afile", backends=["torch"])
    with pytest.raises(bench.BenchError, match=r"bench output folder '.*afile' is a file, not a folder"):
        bench.run_benchmark(settings)


def test_the_reports_are_rewritten_after_each_case(seeded_model, tmp_path, monkeypatch):
    """run_benchmark writes the JSON, Markdown and CSV after every case (complete: false, the cases so far) and
    once more, with the picture, at the end; every write is this run's own files (one stem)."""
    from vit_fast.bench import api

    writes = []
    real = api.write_reports

    def spy(report, out_dir, stem, overwrite=False, png=True):
        writes.append((stem, report["complete"], report["cases"], len(report["rows"]), png))
        return real(report, out_dir, stem, overwrite, png)

    monkeypatch.setattr(api, "write_reports", spy)
    (tmp_path / "bench_tiny.json").write_text("{}")  # an earlier file of that name: this run's are named apart
    settings = bench.BenchSettings(
        model=seeded_model, out_dir=tmp_path, batches=[1, 2], backends=["torch"], device="cpu", threads=1,
        min_samples=5, min_time_s=0.0, warmup=1, measure_ceilings=False, progress=False,
    )  # fmt: skip
    report, paths = bench.run_benchmark(settings, name="tiny")
    stem = f"bench_tiny-{report['run_id']}"
    assert writes == [
        (stem, False, {"done": 1, "total": 2}, 1, False),
        (stem, False, {"done": 2, "total": 2}, 2, False),
        (stem, True, {"done": 2, "total": 2}, 2, True),
    ]
    assert report["complete"] and report["interrupted"] is None and paths["png"].name == f"{stem}.png"
    assert (tmp_path / "bench_tiny.json").read_text() == "{}"
    from vit_fast.util.files import written_by_vit_fast

    assert all(written_by_vit_fast(paths[kind]) for kind in ("json", "markdown", "png"))  # each carries the mark


def test_sigterm_while_the_last_files_are_written_leaves_them_whole(seeded_model, tmp_path, monkeypatch):
    """SIGTERM arrives inside the final write: it is held until the four files are written, then raised, with
    the complete report and its paths on it."""
    import os
    import signal

    from vit_fast.bench import api
    from vit_fast.util import interrupts

    real = api.write_reports

    def signalled(report, out_dir, stem, overwrite=False, png=True):
        if png:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        return real(report, out_dir, stem, overwrite, png)

    monkeypatch.setattr(api, "write_reports", signalled)
    settings = bench.BenchSettings(
        model=seeded_model, out_dir=tmp_path, batches=[1], backends=["torch"], device="cpu", threads=1,
        min_samples=5, min_time_s=0.0, warmup=1, measure_ceilings=False, progress=False,
    )  # fmt: skip
    with pytest.raises(interrupts.Terminated) as caught:
        bench.run_benchmark(settings, name="tiny")
    err = caught.value
    assert err.bench_report["complete"] and sorted(err.bench_paths) == ["csv", "json", "markdown", "png"]
    assert json.loads((tmp_path / "bench_tiny.json").read_text())["complete"] is True
    assert (tmp_path / "bench_tiny.png").is_file()


def test_a_cpu_run_sized_for_a_gpu_says_how_long_and_the_smaller_command(seeded_model, monkeypatch):
    """The model's FLOPs read as ViT-L/16's: the note comes before any case, with the time it expects from a
    forward timed here, and the smaller command with its own time."""
    monkeypatch.setattr("vit_fast.model.vit.count_flops", lambda cfg: 61.6e9)
    lines: list[str] = []
    bench.benchmark(seeded_model, batch="1,4", backends="torch", log=lines.append, **QUICK)
    (note,) = [line for line in lines if "sized for a GPU" in line]
    time_re = r"(about \d+(\.\d)? (s|min|h)|under 1 s)"
    assert re.search(rf"expected {time_re} from one batch-1 forward timed here in each dtype", note), note
    assert re.search(rf"\(try --batch 1 --backends torch: {time_re}; or vit-fast bench default", note), note
    assert note.startswith("2 cases at batches 1,4 (61.6 GFLOP an image")


def test_csv_has_timms_columns_first(result):
    rows = list(csv.DictReader(io.StringIO(result.csv())))
    assert list(rows[0])[:7] == list(bench_report.CSV_TIMM_COLUMNS)
    assert len(rows) == len(result.rows)
    for line, row in zip(rows, result.rows, strict=True):
        assert line["model"] == row["model"] and int(line["infer_batch_size"]) == row["batch"]
        assert float(line["infer_step_time"]) == round(row["mean_ms"], 3)
        assert float(line["infer_samples_per_sec"]) == round(row["batch"] / (row["mean_ms"] / 1e3), 2)
        assert float(line["param_count"]) == round(row["params"] / 1e6, 2) and line["infer_img_size"] == "32"
        assert int(line["n"]) == row["n"] and line["threads"] == "1" and line["weights"] == "random (seed 3)"


def test_csv_throughput_columns_say_their_statistic(result):
    """timm's infer_samples_per_sec is from the mean time (timm's own definition); ours is named for the median it
    comes from, as the Markdown's img/s, so two columns never disagree under one unexplained name."""
    lines = list(csv.DictReader(io.StringIO(result.csv())))
    throughput = [c for c in lines[0] if "per_s" in c]
    assert throughput == ["infer_samples_per_sec", "median_images_per_s"], throughput
    for line, row in zip(lines, result.rows, strict=True):
        if row["status"] != "ok":
            continue
        assert float(line["infer_samples_per_sec"]) == round(row["batch"] / (float(line["mean_ms"]) / 1e3), 2)
        assert float(line["median_images_per_s"]) == pytest.approx(row["batch"] / (float(line["median_ms"]) / 1e3))
        assert f"| {float(line['median_images_per_s']):.1f} |" in result.markdown()  # the Markdown's img/s


def test_markdown_shows_the_sample_count(result):
    md = result.markdown()
    assert "| median | p10 | p90 | p99 | n |" in md
    r = result.ok()[0]
    assert f"| {r['p99_ms']:.3f} | {r['n']} |" in md and "at least 20 runs and 0.05 s" in md


def test_plot_starts_latency_at_0_and_shows_spread(result):
    fig = bench_report.plot_figure(result.report)
    lat = fig.axes[0]
    assert lat.get_ylim()[0] == 0
    assert len(lat.containers) == len({(r["label"], r["dtype"]) for r in result.ok()})  # one errorbar per series
    one = json.loads(json.dumps(result.report))
    one["rows"] = [r for r in one["rows"] if r["batch"] == 1]
    fig = bench_report.plot_figure(one)
    bars = [p for p in fig.axes[0].patches]
    assert len(bars) == len(one["rows"]) and fig.axes[0].get_ylim()[0] == 0  # one bar per backend at one batch
    assert bench_report.plot_report(one)[:8] == b"\x89PNG\r\n\x1a\n"
