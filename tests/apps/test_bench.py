"""`vit-fast bench` and its harness (vit_fast.bench): runs on CPU, in seconds."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from vit_fast import bench as bm
from vit_fast.bench import backends as bench_backends
from vit_fast.bench import harness as bench_harness
from vit_fast.bench import report as bench_report
from vit_fast.cli import main

# every row, whatever its status, carries these; ok rows also carry RESULT_FIELDS
ROW_FIELDS = (
    "backend",
    "label",
    "status",
    "model",
    "dtype",
    "batch",
    "tokens",
    "gelu",
    "graph_mode",
    "device",
    "device_name",
    "driver_version",
    "torch",
    "triton",
    "onnxruntime",
    "tensorrt",
    "git_commit",
    "flops_per_image",
    "params",
    "timer",
    "floor_ms",
    "floor_bound",
    "threads",
    "weights",
    "weights_source",
)
RESULT_FIELDS = (
    "median_ms",
    "p90_ms",
    "p99_ms",
    "mean_ms",
    "p10_ms",
    "iters",
    "n",
    "stopped_by",
    "images_per_s",
    "tflops",
    "max_abs_err_vs_torch",
    "torch_max_abs_err_vs_fp32",
    "vs_best",
    "best_peer",
    "vs_floor",
)
FAST = ["--device", "cpu", "--max-samples", "3", "--warmup", "1", "--threads", "1", "--quiet"]  # CPU tests, GPU or not


def _load(out: Path, stem: str) -> tuple[dict, str, bytes]:
    report = json.loads((out / f"{stem}.json").read_text())
    return report, (out / f"{stem}.md").read_text(), (out / f"{stem}.png").read_bytes()


def _bench_tiny(checkpoint: Path, out: Path, *args: str) -> tuple[dict, str]:
    """``vit-fast bench CHECKPOINT --out OUT ARGS --no-ceilings`` on the CPU, quickly; it succeeds, and its JSON
    report and Markdown are returned."""
    rc = main(["bench", str(checkpoint), "--out", str(out), *args, "--no-ceilings", *FAST])
    assert rc == 0
    report, md, _ = _load(out, "bench_tiny")
    return report, md


def _torch_and_compile_rows(checkpoint: Path, out: Path) -> dict[str, dict]:
    """``vit-fast bench CHECKPOINT --backends torch,compile`` at batch 2; its JSON rows by backend."""
    report, _ = _bench_tiny(checkpoint, out, "--batch", "2", "--backends", "torch,compile")
    return {r["backend"]: r for r in report["rows"]}


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    import vit_fast

    cfg = vit_fast.ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=10)
    model = vit_fast.VisionTransformer(cfg, backend="torch")
    model.init_weights(seed=3)
    return vit_fast.save_checkpoint(model, tmp_path_factory.mktemp("ckpt") / "tiny.safetensors")


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory) -> tuple[int, Path]:
    """The CI command: vit_tiny at batch 1 and 2 on the torch backend."""
    out = tmp_path_factory.mktemp("bench")
    rc = main(["bench", "vit_tiny_patch16_224", "--batch", "1,2", "--backends", "torch", "--out", str(out), *FAST])
    return rc, out


def test_quiet_bench_still_names_its_files(tiny_checkpoint, tmp_path, capsys):
    """--quiet drops progress and the table, never the names of the files written (a rerun's carry a run id)."""
    args = ["bench", str(tiny_checkpoint), "--batch", "1", "--backends", "torch", "--no-ceilings", *FAST]
    for _ in range(2):
        assert main([*args, "--out", str(tmp_path)]) == 0
        captured = capsys.readouterr()
        named = [line.split(": ", 1)[1] for line in captured.err.splitlines() if line.startswith("wrote ")]
        assert named and all(Path(p).is_file() for p in named), captured.err
        assert captured.out == ""
        assert not any(line.startswith("[bench]") for line in captured.err.splitlines())
    assert len({p.name for p in tmp_path.iterdir() if p.suffix == ".json"}) == 2  # the second run's own names


# --------------------------------------------------------------------------- the CPU run
def test_each_case_is_printed_as_it_finishes(tiny_checkpoint, tmp_path, capsys):
    """Without --quiet (and no terminal: one line per case as it starts), each case's result is a line on stderr
    as soon as it ends, before the next one starts; the files are named last."""
    fast = [a for a in FAST if a != "--quiet"]
    argv = ["bench", str(tiny_checkpoint), "--batch", "1,2", "--backends", "torch,tensorrt", "--no-ceilings"]
    assert main([*argv, "--out", str(tmp_path), *fast]) == 0
    err = [
        re.sub(r"; (about .+|under 1 s) left$", "", line)  # said once a case of its size has been timed
        for line in capsys.readouterr().err.splitlines()
        if line.startswith(("[bench]", "wrote")) and not line.endswith(": building")
    ]
    rows = json.loads((tmp_path / "bench_tiny.json").read_text())["rows"]
    torch_rows = [r for r in rows if r["backend"] == "torch"]
    assert err[:4] == [
        "[bench] 1/4 cases: fp32 torch batch 1",
        f"[bench] 1/4 fp32 torch batch 1: median {torch_rows[0]['median_ms']:.3f} ms (p10 "
        f"{torch_rows[0]['p10_ms']:.3f}, p90 {torch_rows[0]['p90_ms']:.3f}; n 3), "
        f"{torch_rows[0]['images_per_s']:.1f} img/s, err 0",
        "[bench] 2/4 cases: fp32 torch batch 2",
        f"[bench] 2/4 fp32 torch batch 2: median {torch_rows[1]['median_ms']:.3f} ms (p10 "
        f"{torch_rows[1]['p10_ms']:.3f}, p90 {torch_rows[1]['p90_ms']:.3f}; n 3), "
        f"{torch_rows[1]['images_per_s']:.1f} img/s, err 0",
    ]
    assert err[4].startswith("[bench] 3/4 fp32 tensorrt batch 1: unavailable: ")  # said, with its reason
    assert err[5].startswith("[bench] 4/4 fp32 tensorrt batch 2: unavailable: ")
    assert [line.split(":")[0] for line in err[6:]] == ["wrote json", "wrote markdown", "wrote csv", "wrote png"]


def test_cpu_bench_writes_json_markdown_csv_png(cpu_run):
    rc, out = cpu_run
    assert rc == 0
    report, md, png = _load(out, "bench_vit_tiny_patch16_224")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "bench_vit_tiny_patch16_224.csv").read_text().startswith("model,infer_samples_per_sec,")
    assert report["weights"]["description"] == "random (seed 0)"  # a preset's random weights, said so
    rows = report["rows"]
    assert [(r["backend"], r["dtype"], r["batch"]) for r in rows] == [("torch", "fp32", 1), ("torch", "fp32", 2)]
    for r in rows:
        assert r["status"] == "ok", r
        missing = [f for f in (*ROW_FIELDS, *RESULT_FIELDS) if f not in r]
        assert not missing, f"row lacks {missing}"
        assert r["driver_version"] == "n/a" and r["device"] == "cpu"
        assert r["tokens"] == 197 and r["gelu"] == "gelu" and r["graph_mode"] == "none"
        assert r["timer"] == "perf_counter" and r["threads"] == 1 and r["weights"] == "random (seed 0)"
        assert r["n"] == r["iters"] == 3 and r["stopped_by"] == "sample cap"  # --max-samples 3 caps the samples
        assert r["median_ms"] > 0 and r["p90_ms"] >= r["median_ms"] and r["p99_ms"] >= r["p90_ms"]
        assert r["images_per_s"] == pytest.approx(r["batch"] / (r["median_ms"] / 1e3))
        assert r["tflops"] == pytest.approx(r["flops_per_image"] * r["batch"] / (r["median_ms"] / 1e3) / 1e12)
        assert r["max_abs_err_vs_torch"] == 0.0  # the torch backend against itself
        assert r["vs_best"] == pytest.approx(1.0)
        assert r["floor_ms"] is None and r["vs_floor"] is None  # a CPU run shows no floor (no measured peak)
    env = report["environment"]
    assert env["device_name"].startswith("CPU") and env["torch"] == torch.__version__
    assert report["ceilings"]["bandwidth"] is None and report["ceilings"]["matrix"] == {}
    assert "not shown" in report["ceilings"]["not_measured"]
    assert report["unavailable"] == []
    assert "| backend | graph | dtype | batch | median |" in md
    assert md.count("\n| torch | - | fp32 |") == 2
    assert "- floor: on a CPU the floor is not shown" in md and "measured bandwidth" not in md
    assert "CPU" in md and "- weights: random (seed 0)" in md


def test_cpu_bench_lists_unavailable_backends_with_reasons(tiny_checkpoint, tmp_path):
    report, md = _bench_tiny(
        tiny_checkpoint,
        tmp_path,
        "--batch",
        "1,2",
        "--graph",
        "--h2d",
        "--backends",
        "torch,triton,triton-graph,tensorrt,timm,compile-reduce-overhead",
    )
    by_label = {}
    for r in report["rows"]:
        by_label.setdefault(r["label"], []).append(r)
    assert {r["status"] for r in by_label["torch"]} == {"ok"}
    for label in ("triton", "triton-graph", "tensorrt", "compile-reduce-overhead", "torch+graph"):
        rows = by_label[label]
        assert [r["batch"] for r in rows] == [1, 2], label  # listed, never dropped
        assert all(r["status"] == "unavailable" and r["reason"] for r in rows), rows
    assert "GPU" in by_label["triton"][0]["reason"] and "interpreter" in by_label["triton"][0]["reason"]
    assert "tensorrt" in by_label["tensorrt"][0]["reason"].lower()
    assert "CUDA graphs" in by_label["torch+graph"][0]["reason"]
    listed = {u["label"] for u in report["unavailable"]}
    assert {"triton", "triton-graph", "tensorrt", "compile-reduce-overhead", "torch+graph"} <= listed
    assert "Not run:" in md and "**triton**" in md and "**tensorrt**" in md
    assert report["settings"]["triton_tuning"] == bench_backends.triton_tuning(False)  # how triton is timed, said
    assert "- triton backends: untuned: the heuristic config of each kernel, what a user gets by default" in md
    assert report["rows"][0]["floor_ms"] is None  # --no-ceilings: no floor, and no crash
    assert report["transfers"] and report["transfers"][0]["median_ms"] is None  # --h2d on CPU: n/a, said so


def test_triton_backend_is_timed_untuned_by_default(monkeypatch, capsys):
    """The bench times the triton backend as a user gets it: the heuristic configs. Preparing a batch size warms it
    with tuning off (outside the timing); the prepared call runs untuned."""
    from vit_fast.kernels import autotune

    from ..fakes import record_triton_forwards, tiny_model

    seen = record_triton_forwards(monkeypatch)
    built = bench_backends.build_backend(
        bench_backends.Variant("triton"), tiny_model(), "fp32", torch.device("cpu"), None, Path(".")
    )
    assert isinstance(built, bench_backends.TritonBackend) and "untuned" in built.notes
    case = built.prepare(torch.randn(2, 3, 32, 32))
    assert seen == [(2, False)]  # the warm-up, not tuning
    assert "compiling the Triton kernels for batch 2 (fp32)" in capsys.readouterr().err
    case.run()
    assert seen[-1] == (2, False) and autotune.autotune_enabled() is False


def test_triton_backend_is_timed_tuned_with_tune(monkeypatch, capsys):
    """--tune (BenchSettings.tune): the warm-up of each batch size tunes, and the prepared call then runs tuned, as
    torch.compile's max-autotune times inductor's kernels."""
    from vit_fast.kernels import autotune

    from ..fakes import record_triton_forwards, tiny_model

    seen = record_triton_forwards(monkeypatch)
    built = bench_backends.build_backend(
        bench_backends.Variant("triton"), tiny_model(), "fp32", torch.device("cpu"), None, Path("."), tune=True
    )
    assert "tuned" in built.notes and "untuned" not in built.notes
    case = built.prepare(torch.randn(2, 3, 32, 32))
    assert seen == [(2, True)]
    assert "tuning the Triton kernels for batch 2 (fp32)" in capsys.readouterr().err
    case.run()
    assert seen[-1] == (2, True) and autotune.autotune_enabled() is False


def test_triton_case_that_fell_back_is_marked_not_timed(monkeypatch):
    """A triton case whose ops fell back to eager PyTorch at their first-use check times eager PyTorch: the row says
    "fallback" with the ops, and no timing is taken under the triton label."""
    from vit_fast.backend import first_use

    from ..fakes import record_triton_forwards, tiny_model

    record_triton_forwards(monkeypatch)
    monkeypatch.setattr(first_use, "failed_ops", lambda: frozenset({"attention"}))
    built = bench_backends.build_backend(
        bench_backends.Variant("triton"), tiny_model(), "fp32", torch.device("cpu"), None, Path(".")
    )
    harness = bench_harness.Harness(bm.BenchSettings(model="default", device="cpu", min_samples=1))
    row = harness.measure(lambda: built.prepare(torch.randn(1, 3, 32, 32)), 1, None, None)
    assert row["status"] == "fallback" and "attention" in row["reason"] and "median_ms" not in row


def test_hf_backend_matches_the_torch_backend():
    """The transformers peer is built from our weights (every tensor placed by hf_state_dict, strict load) and
    computes what our model computes: logits with a head, the normalised class token without one."""
    from ..fakes import tiny_model

    for classes in (7, 0):
        model = tiny_model(num_classes=classes).double()
        x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
        built = bench_backends.build_backend(
            bench_backends.Variant("hf"), model, "fp32", torch.device("cpu"), None, Path(".")
        )
        with torch.no_grad():
            got, want = built.prepare(x).run(), model(x)
        assert got.shape == want.shape and (got - want).abs().max().item() < 1e-10, classes


def test_hf_backend_refuses_models_transformers_has_no_counterpart_of():
    from ..fakes import tiny_model

    with pytest.raises(bench_backends.Unavailable, match="plain class-token ViT"):
        bench_backends.build_hf(tiny_model(reg_tokens=2))


def test_onnxruntime_backend_runs_and_is_checked(tiny_checkpoint, tmp_path):
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    report, md = _bench_tiny(
        tiny_checkpoint,
        tmp_path,
        "--batch",
        "1,3",
        "--dtype",
        "fp32,bf16",
        "--backends",
        "torch,onnxruntime",
        "--onnx-exporter",
        "torchscript",
    )
    ort_rows = [r for r in report["rows"] if r["backend"] == "onnxruntime"]
    fp32 = [r for r in ort_rows if r["dtype"] == "fp32"]
    assert [r["status"] for r in fp32] == ["ok", "ok"], fp32
    assert all(r["max_abs_err_vs_torch"] < 1e-4 for r in fp32)
    assert "CPU EP" in fp32[0]["notes"]
    bf16 = [r for r in ort_rows if r["dtype"] == "bf16"]
    assert all(r["status"] == "unavailable" and "bfloat16" in r["reason"] for r in bf16)
    assert "| onnxruntime | - | fp32 | 1 |" in md


def test_backend_failure_is_reported_and_others_continue(tiny_checkpoint, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("exporter exploded")

    monkeypatch.setattr(bench_backends, "export_onnx", broken)
    report, md = _bench_tiny(tiny_checkpoint, tmp_path, "--batch", "1", "--backends", "onnxruntime,torch")
    status = {r["backend"]: r for r in report["rows"]}
    assert status["onnxruntime"]["status"] == "error"
    assert "exporter exploded" in status["onnxruntime"]["error"]
    assert status["torch"]["status"] == "ok"
    assert "exporter exploded" in md
    assert (
        main(
            [
                "bench",
                str(tiny_checkpoint),
                "--batch",
                "1",
                "--out",
                str(tmp_path),
                "--backends",
                "onnxruntime,torch",
                "--no-ceilings",
                "--strict",
                *FAST,
            ]
        )
        == 1
    )
    # the second run's reports sit beside the first's, which stay as they were
    assert len(list(tmp_path.glob("bench_tiny*.json"))) == 2
    assert json.loads((tmp_path / "bench_tiny.json").read_text())["rows"] == report["rows"]


def test_a_wrong_backend_output_is_visible(tiny_checkpoint, tmp_path, monkeypatch):
    original = bm.Harness._build

    def wrong(self, variant, ref_model, dtype_name, workdir):
        backend = original(self, variant, ref_model, dtype_name, workdir)
        if variant.backend == "compile":  # stand in a fast wrong model for torch.compile
            backend.module = lambda x: torch.zeros(x.shape[0], 10)
        return backend

    monkeypatch.setattr(bm.Harness, "_build", wrong)
    monkeypatch.setattr(torch, "compile", lambda model, **kw: model)
    rows = _torch_and_compile_rows(tiny_checkpoint, tmp_path)
    assert rows["compile"]["max_abs_err_vs_torch"] > 0.01
    assert rows["torch"]["max_abs_err_vs_torch"] == 0.0


@pytest.mark.slow
def test_torch_compile_on_cpu(tiny_checkpoint, tmp_path):
    rows = _torch_and_compile_rows(tiny_checkpoint, tmp_path)
    assert rows["compile"]["status"] == "ok", rows["compile"]
    assert rows["compile"]["max_abs_err_vs_torch"] < 1e-4


# --------------------------------------------------------------------------- bad arguments
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch", "1,x"], "'x'"),
        (["--batch", "1,,2"], "empty entry"),
        (["--batch", "0"], ">= 1"),
        (["--batch", "2,2"], "twice"),
        (["--backends", "torch,trition"], "unknown backend 'trition' (did you mean 'triton'?)"),
        (["--dtype", "fp8"], "unknown dtype 'fp8'"),
        (["--max-samples", "0"], "must be >= 1"),
    ],
)
def test_bad_arguments_give_clear_errors(args, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "vit_tiny_patch16_224", "--out", str(tmp_path), *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_unsupported_dtype_on_device_is_a_clear_error(tmp_path, capsys, monkeypatch):
    real = torch.nn.functional.conv2d

    def no_bf16(x, *args, **kwargs):
        if x.dtype == torch.bfloat16:
            raise RuntimeError("\"slow_conv2d_cpu\" not implemented for 'BFloat16'")
        return real(x, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "conv2d", no_bf16)
    rc = main(["bench", "vit_tiny_patch16_224", "--dtype", "bf16", "--out", str(tmp_path), "--device", "cpu", *FAST])
    assert rc == 1
    err = capsys.readouterr().err
    assert "bf16 is not supported on cpu" in err and "fp32" in err
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_cuda_device_without_gpu_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:  # rejected while parsing the command line
        main(["bench", "vit_tiny_patch16_224", "--out", str(tmp_path), *FAST, "--device", "cuda"])
    assert exc.value.code == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_unknown_model_is_a_clear_error(tmp_path, capsys):
    assert main(["bench", str(tmp_path / "missing.safetensors"), "--out", str(tmp_path), *FAST]) == 1
    assert "missing.safetensors" in capsys.readouterr().err


def test_help_describes_backends(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    for name in bm.BACKENDS:
        assert name in out
    assert "--flush-l2" in out and "--h2d" in out and "--graph" in out


# --------------------------------------------------------------------------- helpers
def test_percentiles_on_known_data():
    data = [float(v) for v in range(1, 11)]  # percentiles of 1..10 (linear interpolation): 5.5, 9.1, 9.91
    for order in (data, list(reversed(data))):
        s = bm.summarize(order)
        assert (s["median_ms"], s["p90_ms"], s["p99_ms"]) == pytest.approx((5.5, 9.1, 9.91))
        assert s["min_ms"] == 1.0 and s["max_ms"] == 10.0
    one = bm.summarize([7.0])
    assert one["median_ms"] == one["p99_ms"] == 7.0 and one["n"] == 1


def test_summarize_on_known_data():
    s = bm.summarize([3.0, 1.0, 2.0, 4.0, 100.0])
    assert s["n"] == 5 and s["median_ms"] == 3.0 and s["min_ms"] == 1.0 and s["max_ms"] == 100.0
    assert s["mean_ms"] == pytest.approx(22.0)
    assert s["p90_ms"] == pytest.approx(4.0 + 0.6 * 96.0)
    assert s["p99_ms"] == pytest.approx(4.0 + 0.96 * 96.0)
    assert s["std_ms"] == pytest.approx(math.sqrt(sum((v - 22.0) ** 2 for v in (3, 1, 2, 4, 100)) / 4))
    assert bm.summarize([2.0])["std_ms"] == 0.0
    with pytest.raises(ValueError):
        bm.summarize([])


def test_parsers():
    assert bm.parse_batches("1, 8,64") == [1, 8, 64]
    assert bm.parse_dtypes("bf16,float16,fp16") == ["bf16", "fp16"]
    assert bm.parse_backends("all") == list(bm.BACKENDS)
    assert bm.parse_backends("timm,torch") == ["timm", "torch"]
    with pytest.raises(bm.BenchError, match="not an int"):
        bm.parse_batches("1.5")


def test_time_callable_counts_and_caps():
    calls = []
    times = bm.time_callable(lambda: calls.append(1), torch.device("cpu"), warmup=2, iters=7)
    assert len(times) == 7 and len(calls) == 9 and all(t >= 0 for t in times)
    import time

    slow = bm.time_callable(
        lambda: time.sleep(0.01), torch.device("cpu"), warmup=0, iters=1000, max_seconds=0.05, min_iters=2
    )
    assert 2 <= len(slow) <= 10


def test_floor_and_ratios():
    ceilings = {"bandwidth": {"GBps": 1000.0}, "matrix": {"bf16": {"TFLOPs": 1000.0}}}
    assert bm.floor_ms(10**9, 2e12, ceilings, "bf16") == (pytest.approx(2.0), "compute")
    assert bm.floor_ms(4 * 10**9, 2e12, ceilings, "bf16") == (pytest.approx(4.0), "memory")
    assert bm.floor_ms(1, 1, ceilings, "fp16") is None
    rows = [
        {
            "status": "ok",
            "label": "a",
            "dtype": "bf16",
            "batch": 1,
            "median_ms": 2.0,
            "flops_per_image": 1e12,
            "floor_ms": 1.0,
        },
        {
            "status": "ok",
            "label": "b",
            "dtype": "bf16",
            "batch": 1,
            "median_ms": 1.0,
            "flops_per_image": 1e12,
            "floor_ms": 1.0,
        },
        {"status": "error", "label": "c", "dtype": "bf16", "batch": 1, "error": "boom", "backend": "c"},
    ]
    bm.add_ratios(rows)
    assert rows[0]["vs_best"] == 2.0 and rows[0]["best_peer"] == "b" and rows[1]["vs_best"] == 1.0
    assert rows[0]["vs_floor"] == 2.0 and rows[0]["tflops"] == pytest.approx(500.0)
    assert "vs_best" not in rows[2]


def test_plan_variants():
    labels = [v.label for v in bm.plan_variants(["torch", "triton", "onnxruntime"], graph=True)]
    assert labels == ["torch", "triton", "onnxruntime", "torch+graph", "triton-graph"]
    assert [v.label for v in bm.plan_variants(["torch"], graph=False)] == ["torch"]


def test_non_finite_outputs_are_flagged_not_hidden():
    check = bench_harness.max_abs_err_vs_torch
    assert math.isnan(check(torch.tensor([float("nan"), 1.0]), torch.zeros(2)))
    assert check(torch.tensor([1.0, -2.5]), torch.zeros(2)) == 2.5
    assert bench_report._json_clean({"a": [float("nan"), float("inf"), 1.5]}) == {"a": ["nan", "inf", 1.5]}
    with pytest.raises(RuntimeError, match="differs from the torch backend's"):
        check(torch.zeros(2, 3), torch.zeros(2, 4))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_bench_paths(tiny_checkpoint, tmp_path):
    """The CUDA paths: events, L2 flush, host-copy timing, CUDA graphs, the triton backend, inductor graphs."""
    rc = main(
        [
            "bench",
            str(tiny_checkpoint),
            "--device",
            "cuda",
            "--batch",
            "1,2",
            "--dtype",
            "fp16",
            "--backends",
            "torch,triton,triton-graph,compile-reduce-overhead,timm,onnxruntime",
            "--graph",
            "--h2d",
            "--flush-l2",
            "--max-samples",
            "20",
            "--warmup",
            "3",
            "--max-seconds",
            "0.5",
            "--out",
            str(tmp_path),
            "--onnx-exporter",
            "torchscript",
            "--quiet",
        ]
    )
    assert rc == 0
    report = json.loads((tmp_path / "bench_tiny.json").read_text())
    rows = {(r["label"], r["batch"]): r for r in report["rows"]}
    for label in ("torch", "triton", "triton-graph", "torch+graph"):
        for batch in (1, 2):
            r = rows[(label, batch)]
            assert r["status"] == "ok", r
            assert r["timer"] == "cuda-events" and r["driver_version"] != "n/a" and r["flush_l2"]
            assert r["max_abs_err_vs_torch"] < 5e-2
    assert rows[("triton-graph", 1)]["graph_mode"].startswith("cuda-graph")
    assert rows[("compile-reduce-overhead", 1)]["status"] == "ok", rows[("compile-reduce-overhead", 1)]
    assert rows[("compile-reduce-overhead", 2)]["status"] == "skipped"
    for label in ("timm", "onnxruntime"):
        assert rows[(label, 1)]["status"] in ("ok", "unavailable"), rows[(label, 1)]
    assert all(t["median_ms"] > 0 for t in report["transfers"])
    assert report["ceilings"]["bandwidth"]["GBps"] > 100 and report["ceilings"]["matrix"]["fp16"]["TFLOPs"] > 1
