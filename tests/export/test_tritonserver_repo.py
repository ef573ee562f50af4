"""Triton model repositories (vit-fast export tritonserver): every config.pbtxt written here is parsed
with Triton's own model-config schema (tritonclient.grpc.model_config_pb2; a misspelt field fails)
and its shapes and dtypes are checked against the artifact. Serving them is tested in tests/serve."""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
import torch

import vit_fast
from vit_fast.cli import tritonserver as cli
from vit_fast.export import tritonserver as ts

model_config_pb2 = pytest.importorskip(
    "tritonclient.grpc.model_config_pb2", reason="tritonclient[grpc] (the test extra) holds Triton's config schema"
)
text_format = pytest.importorskip("google.protobuf.text_format", reason="protobuf comes with tritonclient[grpc]")
onnx = pytest.importorskip("onnx", reason="the onnx extra is needed to export and read ONNX files")

TRITON_TO_ONNX = {"TYPE_FP32": 1, "TYPE_FP16": 10, "TYPE_BF16": 16, "TYPE_UINT8": 2}


def parse_config(folder: Path):
    """config.pbtxt parsed into Triton's ModelConfig message (raises on any field the schema lacks)."""
    return text_format.Parse((folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def type_name(value: int) -> str:
    return model_config_pb2.DataType.Name(value)


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="vit-fast export tritonserver")
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(list(argv)))


def assert_matches_onnx(config, onnx_path: Path) -> None:
    """Names, element types and non-batch dims of the config's inputs/outputs equal the ONNX graph's."""
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    for ours, theirs in ((config.input, graph.input), (config.output, graph.output)):
        assert [t.name for t in ours] == [t.name for t in theirs]
        for t, v in zip(ours, theirs, strict=True):
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim]
            assert dims[0] == -1, "the ONNX batch dimension must be symbolic"
            assert list(t.dims) == dims[1:]
            assert TRITON_TO_ONNX[type_name(t.data_type)] == v.type.tensor_type.elem_type


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> tuple[Path, str]:
    """`vit-fast export tritonserver default --out repo/ --entries onnx,python --instances 2 --verify-batch 1,3`
    (one ONNX export, verified at two batches), with progress on: (the repository, what it printed)."""
    repo = tmp_path_factory.mktemp("triton") / "repo"
    summary = repo.parent / "summary.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        assert run_cli("default", "--out", str(repo), "--entries", "onnx,python", "--instances", "2",
                       "--json", str(summary), "--seed", "0", "--verify-batch", "1,3") == 0  # fmt: skip
    return repo, printed.getvalue()


@pytest.fixture(scope="module")
def default_repo(default_run) -> Path:
    return default_run[0]


def test_default_onnx_entry_parses_and_matches_the_artifact(default_repo: Path) -> None:
    folder = default_repo / "default"
    config = parse_config(folder)
    assert config.name == "default" and config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 64
    assert list(config.dynamic_batching.preferred_batch_size) == [8, 64]
    assert config.dynamic_batching.max_queue_delay_microseconds == ts.DEFAULT_QUEUE_DELAY_US
    [group] = config.instance_group
    kind = "KIND_GPU" if torch.cuda.is_available() else "KIND_CPU"  # no --kind: what this machine has
    assert group.count == 2 and model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind) == kind
    assert_matches_onnx(config, folder / "1" / "model.onnx")
    cfg = vit_fast.load_model("default").cfg
    assert list(config.input[0].dims) == [cfg.in_chans, *cfg.img_hw]
    assert list(config.output[0].dims) == [cfg.num_classes]
    meta = json.loads((folder / "1" / "model.onnx.json").read_text())
    assert meta["batch"] == [1, 64] and meta["source"] == "default"
    record = json.loads((folder / "verification.json").read_text())
    assert record["passed"] is True and record["report"]["artifact"] == "1/model.onnx"
    assert record["worst_ratio"] <= 1.0
    # --verify-batch 1,3: what was verified; the served range (max_batch_size 64, the ONNX file's 1..64) is kept
    assert [r["batch"] for r in record["report"]["rows"]] == [1, 3]
    assert "verification: PASSED" in (folder / "config.pbtxt").read_text()


def test_the_command_names_published_paths_and_the_kind_it_wrote(default_run) -> None:
    """Every table and progress line names the files where they are published, never the staging folder they are
    built in; without --kind the command says which kind it wrote and why."""
    repo, printed = default_run
    assert ".vit-fast-repo.tmp" not in printed, printed
    table = [line for line in printed.splitlines() if "CPUExecutionProvider, fp32; seed 0" in line]
    assert table and table[0].startswith(f"{repo / 'default' / '1' / 'model.onnx'}  ("), printed
    assert f"wrote {repo / 'default' / 'config.pbtxt'} (verified)" in printed
    if torch.cuda.is_available():
        assert "instances: 2 x KIND_GPU (torch sees" in printed
    else:
        assert "instances: 2 x KIND_CPU (no CUDA GPU is visible to torch here; pass --kind gpu" in printed


def test_the_default_kind_is_what_the_machine_has(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ts.machine_kind()[0] == "cpu" and ts.machine_kind(engine=True)[0] == "gpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert ts.machine_kind() == ("gpu", "torch sees 2 CUDA GPUs here")


def test_default_python_entry_parses_and_carries_the_module(default_repo: Path) -> None:
    folder = default_repo / "default_python"
    config = parse_config(folder)
    assert config.backend == "python" and not config.platform
    assert config.max_batch_size == 64 and list(config.dynamic_batching.preferred_batch_size) == [8, 64]
    assert config.parameters[ts.DTYPE_PARAMETER].string_value == "fp32"
    model = vit_fast.load_model("default", backend="torch")
    images, logits = ts.model_io(model, torch.float32)
    assert [(t.name, list(t.dims), type_name(t.data_type)) for t in config.input] == [
        (images.name, list(images.dims), "TYPE_FP32")
    ]
    assert [(t.name, list(t.dims), type_name(t.data_type)) for t in config.output] == [
        (logits.name, list(logits.dims), "TYPE_FP32")
    ]
    assert (folder / "1" / "model.py").read_text() == ts.TEMPLATE.read_text()
    served = vit_fast.load_checkpoint(folder / "1" / ts.WEIGHTS, backend="torch")
    for (k, a), (k2, b) in zip(model.state_dict().items(), served.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(a, b), k


def test_entries_for_makes_what_a_source_can_make(tmp_path) -> None:
    """The one dispatch of the command and to_tritonserver: a model makes its ONNX and python entries (ONNX
    first, named as entry_names says); an artifact only its own entry; an unknown entry or source is refused."""
    model = vit_fast.load_model("default", backend="torch")
    made = ts.entries_for(model, "vit", ["python", "onnx"], kind="cpu", verify=False)
    assert [e.name for e in made] == ts.entry_names("vit", ["python", "onnx"]) == ["vit", "vit_python"]
    with pytest.raises(ValueError, match="entries must be some of onnx, python, got \\['tflite'\\]"):
        ts.entries_for(model, "vit", ["tflite"])
    with pytest.raises(ValueError, match="the python entry serves a model, not an artifact"):
        ts.entries_for(tmp_path / "m.onnx", "vit", ["onnx", "python"])
    with pytest.raises(ValueError, match="cannot tell what"):
        ts.entries_for(tmp_path / "m.bin", "vit")


def test_template_reads_the_names_the_entry_writes() -> None:
    """model.py cannot be imported outside Triton: read its constants from the source instead."""
    tree = ast.parse(ts.TEMPLATE.read_text())
    consts = {
        t.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for t in node.targets
    }
    assert consts["WEIGHTS"] == ts.WEIGHTS
    assert consts["DTYPE_PARAMETER"] == ts.DTYPE_PARAMETER


def test_repository_has_only_model_folders_and_a_summary(default_repo: Path) -> None:
    assert sorted(p.name for p in default_repo.iterdir()) == ["default", "default_python"]  # no staging left
    summary = json.loads((default_repo.parent / "summary.json").read_text())
    assert [m["name"] for m in summary["models"]] == ["default", "default_python"]
    assert summary["models"][0]["verified"] is True
    assert "1/model.onnx" in summary["models"][0]["files"]


def test_existing_model_folder_is_refused_before_work_and_force_keeps_the_users(default_repo: Path, tmp_path) -> None:
    repo = tmp_path / "repo"
    (repo / "default").mkdir(parents=True)
    (repo / "default" / "mine.txt").write_text("not vit-fast's")
    with pytest.raises(FileExistsError, match="--force"):
        run_cli("default", "--out", str(repo), "--quiet")
    assert (repo / "default" / "mine.txt").read_text() == "not vit-fast's"
    assert sorted(p.name for p in repo.iterdir()) == ["default"]
    onnx_file = default_repo / "default" / "1" / "model.onnx"
    assert run_cli(str(onnx_file), "--out", str(repo), "--name", "default", "--force", "--no-verify", "--quiet") == 0
    assert (repo / "default" / "mine.txt").read_text() == "not vit-fast's"  # --force keeps what it did not write
    assert parse_config(repo / "default").platform == "onnxruntime_onnx"
    assert sorted(p.name for p in repo.iterdir()) == ["default"]


def test_onnx_file_source_keeps_its_range_and_is_verified_against_its_metadata(default_repo: Path, tmp_path) -> None:
    onnx_file = default_repo / "default" / "1" / "model.onnx"
    repo = tmp_path / "repo"
    args = [str(onnx_file), "--out", str(repo), "--batch", "1,4,32", "--kind", "cpu", "--seed", "1", "--quiet"]
    assert run_cli(*args) == 0
    config = parse_config(repo / "model")  # named after the file's stem
    assert config.max_batch_size == 32 and list(config.dynamic_batching.preferred_batch_size) == [4, 32]
    assert model_config_pb2.ModelInstanceGroup.Kind.Name(config.instance_group[0].kind) == "KIND_CPU"
    assert_matches_onnx(config, repo / "model" / "1" / "model.onnx")
    assert json.loads((repo / "model" / "verification.json").read_text())["passed"] is True
    with pytest.raises(ValueError, match="exceeds the ONNX file"):
        run_cli(str(onnx_file), "--out", str(tmp_path / "other"), "--batch", "1,128", "--quiet")
    assert not (tmp_path / "other").exists()


def _fake_engine(tmp_path: Path, onnx_file: Path | None, profile=(1, 8, 32), **meta) -> Path:
    """An engine file with the metadata vit-fast export tensorrt writes beside it (no GPU here to build one)."""
    engine = tmp_path / "vit.plan"
    engine.write_bytes(b"not a real engine: the repository writer reads the metadata only")
    lo, opt, hi = profile
    data = {
        "format": "tensorrt",
        "onnx": str(onnx_file) if onnx_file else None,
        "config": vit_fast.load_model("default").cfg.to_dict(),
        "precision": "fp16",
        "strongly_typed": False,
        "profiles": [{"input": "images", "min": [lo, 1, 32, 32], "opt": [opt, 1, 32, 32], "max": [hi, 1, 32, 32]}],
        "batch": [lo, hi],
        "tensorrt_version": "10.0.0",
        "gpu_sm": "sm_90",
        "gpu_name": "NVIDIA H100",
        "verification": {"passed": True, "worst_ratio": 0.5},
    } | meta
    Path(str(engine) + ".json").write_text(json.dumps(data))
    return engine


def test_tensorrt_engine_entry_from_its_metadata(default_repo: Path, tmp_path) -> None:
    onnx_file = default_repo / "default" / "1" / "model.onnx"
    engine = _fake_engine(tmp_path, onnx_file)
    repo = tmp_path / "repo"
    assert run_cli(str(engine), "--out", str(repo), "--quiet") == 0
    config = parse_config(repo / "vit")
    assert config.platform == "tensorrt_plan"
    assert config.max_batch_size == 32 and list(config.dynamic_batching.preferred_batch_size) == [8, 32]
    assert [(t.name, list(t.dims), type_name(t.data_type)) for t in config.input] == [
        ("images", [1, 32, 32], "TYPE_FP32")
    ]
    assert [(t.name, list(t.dims)) for t in config.output] == [("logits", [10])]
    assert (repo / "vit" / "1" / "model.plan").read_bytes() == engine.read_bytes()
    assert json.loads((repo / "vit" / "verification.json").read_text())["passed"] is True
    # a strongly typed fp16 engine keeps fp16 I/O; without its ONNX file the output comes from the config
    engine16 = _fake_engine(tmp_path, None, strongly_typed=True)
    assert run_cli(str(engine16), "--out", str(repo), "--name", "vit16", "--batch", "1,16", "--quiet") == 0
    config = parse_config(repo / "vit16")
    assert type_name(config.input[0].data_type) == "TYPE_FP16" and type_name(config.output[0].data_type) == "TYPE_FP16"
    assert config.max_batch_size == 16 and [(t.name, list(t.dims)) for t in config.output] == [("logits", [10])]


def test_tensorrt_engine_refusals(tmp_path) -> None:
    repo = tmp_path / "repo"
    with pytest.raises(ValueError, match="GPU only"):
        run_cli(str(_fake_engine(tmp_path, None)), "--out", str(repo), "--kind", "cpu", "--quiet")
    with pytest.raises(ValueError, match="starts at 1"):
        run_cli(str(_fake_engine(tmp_path, None, profile=(2, 8, 32))), "--out", str(repo), "--quiet")
    with pytest.raises(ValueError, match="exceeds the engine"):
        run_cli(str(_fake_engine(tmp_path, None)), "--out", str(repo), "--batch", "1,64", "--quiet")
    bare = tmp_path / "bare.plan"
    bare.write_bytes(b"x")
    with pytest.raises(vit_fast.export.ArtifactError, match="no vit-fast metadata"):
        run_cli(str(bare), "--out", str(repo), "--quiet")
    assert not repo.exists() or not any(repo.iterdir())


def test_tensorrt_engine_of_pixels_and_outputs_from_its_metadata(default_repo: Path, tmp_path) -> None:
    """An engine built from a graph with a uint8 front takes uint8 pixels in its recorded layout; its outputs come
    from the ONNX file it was built from only where that lies beside it (looked up by its name: the recorded path
    is never followed), else from its recorded outputs and config."""
    cfg = vit_fast.load_model("default").cfg
    pixels = {"min": [1, 32, 32, 1], "opt": [8, 32, 32, 1], "max": [32, 32, 32, 1]}
    engine = _fake_engine(
        tmp_path,
        Path("/elsewhere/never/read.onnx"),
        input_dtype="uint8",
        input_layout="NHWC",
        profiles=[{"input": "images", **pixels}],
        outputs=["pooled", "last_hidden_state"],
        output_names=["feat", "tokens"],
    )
    repo = tmp_path / "repo"
    assert run_cli(str(engine), "--out", str(repo), "--quiet") == 0
    config = parse_config(repo / "vit")
    [inp] = config.input
    assert (type_name(inp.data_type), list(inp.dims)) == ("TYPE_UINT8", [32, 32, 1])
    assert model_config_pb2.ModelInput.Format.Name(inp.format) == "FORMAT_NHWC"
    assert [(t.name, list(t.dims), type_name(t.data_type)) for t in config.output] == [
        ("feat", [cfg.embed_dim], "TYPE_FP32"),
        ("tokens", [cfg.num_tokens, cfg.embed_dim], "TYPE_FP32"),
    ]
    # the ONNX file of that name beside the engine is read instead
    shutil.copy(default_repo / "default" / "1" / "model.onnx", tmp_path / "read.onnx")
    assert run_cli(str(engine), "--out", str(repo), "--name", "beside", "--quiet") == 0
    assert [(t.name, list(t.dims)) for t in parse_config(repo / "beside").output] == [("logits", [cfg.num_classes])]
    # ... but not through a link that leads out of the engine's folder
    (tmp_path / "read.onnx").unlink()
    (tmp_path / "read.onnx").symlink_to(default_repo / "default" / "1" / "model.onnx")
    with pytest.raises(vit_fast.export.ArtifactError, match=r"vit.plan.json': field 'onnx' \(its file name\) is "
                       r"'read.onnx', which leads out of its folder through a link"):  # fmt: skip
        run_cli(str(engine), "--out", str(repo), "--name", "linked", "--quiet")
    assert not (repo / "linked").exists()


@pytest.mark.parametrize(("location", "named"), [("ext.onnx.data", False), ("weights/ext.bin", False), ("w", True)])
def test_external_data_the_graph_names_travels_with_it(default_repo: Path, tmp_path, location, named) -> None:
    """A repository was published without its weights when the metadata did not name them (and the copy followed
    whatever the metadata named). The graph's own external data locations decide what travels, under the same
    names (a subfolder kept), whether or not the metadata names the file, and the copy runs on its own."""
    ort = pytest.importorskip("onnxruntime", reason="the onnx extra runs the repository's copy")
    src = default_repo / "default" / "1" / "model.onnx"
    art = tmp_path / "art"
    (art / "weights").mkdir(parents=True)
    onnx.save_model(onnx.load(str(src)), str(art / "ext.onnx"), save_as_external_data=True, location=location)
    meta = json.loads(Path(str(src) + ".json").read_text())
    meta.pop("external_data", None)
    (art / "ext.onnx.json").write_text(json.dumps(meta | ({"external_data": location} if named else {})))
    repo = tmp_path / "repo"
    assert run_cli(str(art / "ext.onnx"), "--out", str(repo), "--seed", "0", "--quiet") == 0
    version = repo / "ext" / "1"
    assert (version / location).read_bytes() == (art / location).read_bytes()
    assert json.loads((repo / "ext" / "verification.json").read_text())["passed"] is True  # run from the copy
    shutil.rmtree(art)  # nothing outside the model folder is needed
    session = ort.InferenceSession(str(version / "model.onnx"))
    assert session.get_inputs()[0].name == "images"


def test_external_data_that_would_replace_the_model_file_is_refused(default_repo: Path, tmp_path) -> None:
    src = default_repo / "default" / "1" / "model.onnx"
    onnx.save_model(onnx.load(str(src)), str(tmp_path / "ext.onnx"), save_as_external_data=True, location="model.onnx")
    with pytest.raises(vit_fast.export.ArtifactError, match=r"external data named 'model.onnx', the name of a file"):
        run_cli(str(tmp_path / "ext.onnx"), "--out", str(tmp_path / "repo"), "--no-verify", "--quiet")
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_uint8_artifact_entry_takes_pixels_in_its_layout(tmp_path, layout) -> None:
    """`export tritonserver` refused a graph with a uint8 front ("ONNX element type 2"). Its entry now declares a
    TYPE_UINT8 input with the graph's dims and its layout as the input's format, and the model file there runs on
    exactly what that input describes (what Triton's onnxruntime backend would feed it)."""
    ort = pytest.importorskip("onnxruntime", reason="the onnx extra runs the repository's copy")
    np = pytest.importorskip("numpy")
    model = vit_fast.load_model("default", backend="torch")
    front = dict(layout=layout, mean=0.5, std=0.25)
    art = vit_fast.export.to_onnx(
        model, tmp_path / "pp.onnx", batch=(1, 4), preprocess=front, source="default", progress=False, verify=False
    )
    repo = tmp_path / "repo"
    assert run_cli(str(art), "--out", str(repo), "--batch", "1,4", "--seed", "0", "--quiet") == 0
    config = parse_config(repo / "pp")
    assert_matches_onnx(config, repo / "pp" / "1" / "model.onnx")
    [inp] = config.input
    assert type_name(inp.data_type) == "TYPE_UINT8"
    assert model_config_pb2.ModelInput.Format.Name(inp.format) == f"FORMAT_{layout}"
    assert list(inp.dims) == ([32, 32, 1] if layout == "NHWC" else [1, 32, 32])
    assert [(t.name, type_name(t.data_type), list(t.dims)) for t in config.output] == [("logits", "TYPE_FP32", [10])]
    assert json.loads((repo / "pp" / "verification.json").read_text())["passed"] is True
    session = ort.InferenceSession(str(repo / "pp" / "1" / "model.onnx"))
    x = np.random.default_rng(0).integers(0, 256, (config.max_batch_size, *inp.dims), dtype=np.uint8)
    [y] = session.run(None, {inp.name: x})
    assert y.shape == (config.max_batch_size, *config.output[0].dims) and y.dtype == np.float32
    assert ts.dtype_of("TYPE_UINT8") == torch.uint8


@pytest.mark.parametrize(
    ("argv", "error", "match"),
    [
        # usage errors while parsing (exit 2; their messages: tests/cli/test_cli_flags.py)
        (["--batch", "1,x"], SystemExit, "^2$"),
        (["--batch", "0,8"], SystemExit, "^2$"),
        (["--instances", "0"], SystemExit, "^2$"),
        (["--queue-delay-us", "-1"], SystemExit, "^2$"),
        (["--name", "bad/name"], ValueError, "not usable by Triton"),
        (["--entries", "onnx,tensorrt"], ValueError, "--entries takes"),
        (["--entries", "python", "--dtype", "bf16"], ValueError, "fp32 or fp16"),
        (["--dtype", "bf16"], ValueError, "bf16 ONNX file cannot be verified"),
        (
            ["--batch", "1,8", "--verify-batch", "1,16"],
            ValueError,
            r"batch 16 is outside the artifact's batch range 1\.\.8",
        ),
        (["--verify-batch", "1", "--no-verify"], ValueError, "drop it or --no-verify"),
    ],
)
def test_bad_arguments_fail_before_any_file_is_written(tmp_path, argv, error, match) -> None:
    repo = tmp_path / "repo"
    with pytest.raises(error, match=match):
        run_cli("default", "--out", str(repo), "--quiet", *argv)
    assert not repo.exists() or not any(repo.iterdir())


def test_artifact_flags_that_do_not_apply_are_refused(default_repo: Path, tmp_path) -> None:
    onnx_file = str(default_repo / "default" / "1" / "model.onnx")
    with pytest.raises(ValueError, match="serves a model, not an artifact"):
        run_cli(onnx_file, "--out", str(tmp_path / "r"), "--entries", "python")
    with pytest.raises(ValueError, match="keeps the dtype"):
        run_cli(onnx_file, "--out", str(tmp_path / "r"), "--dtype", "fp16")


def test_a_failing_entry_publishes_nothing(tmp_path) -> None:
    model = vit_fast.load_model("default", backend="torch")
    good = ts.python_entry(model, "good", kind="cpu")

    def broken(folder: Path) -> ts.EntryConfig:
        (folder / "1").mkdir()
        (folder / "1" / "model.onnx").write_bytes(b"half written")
        raise RuntimeError("export failed half way")

    repo = tmp_path / "repo"
    with pytest.raises(RuntimeError, match="half way"):
        ts.write_repository(repo, [good, ts.ModelEntry("broken", broken)], progress=False)
    assert list(repo.iterdir()) == []


def test_force_swaps_a_model_folder_back_when_publishing_fails(tmp_path) -> None:
    model = vit_fast.load_model("default", backend="torch")
    repo = tmp_path / "repo"
    ts.write_repository(repo, [ts.python_entry(model, "vit", batch=[1, 4], kind="cpu")], progress=False)
    before = (repo / "vit" / "config.pbtxt").read_text()

    def fails(folder: Path) -> ts.EntryConfig:
        raise OSError("disk full")

    entries = [ts.python_entry(model, "vit", batch=[1, 16], kind="cpu"), ts.ModelEntry("other", fails)]
    with pytest.raises(OSError, match="disk full"):
        ts.write_repository(repo, entries, force=True, progress=False)
    assert (repo / "vit" / "config.pbtxt").read_text() == before
    assert sorted(p.name for p in repo.iterdir()) == ["vit"]


@pytest.mark.parametrize(
    ("batch", "limit", "opt", "expected"),
    [
        (None, None, None, (64, [8, 64])),
        (None, (1, 16), None, (16, [8, 16])),
        (None, (1, 4), None, (4, [4])),
        (None, (1, 32), 16, (32, [8, 16, 32])),
        (None, (1, 1), None, (1, [])),
        ([1, 8, 64], None, None, (64, [8, 64])),
        ([4], (1, 64), None, (4, [4])),
        ([1], None, None, (1, [])),
    ],
)
def test_batch_plan(batch, limit, opt, expected) -> None:
    assert ts.batch_plan(batch, limit, opt) == expected


def test_config_text_parses_for_every_dtype_and_kind() -> None:
    for dtype, name in ts.TRITON_TYPES.items():
        for kind in ts.KINDS:
            entry = ts.EntryConfig(
                name="m",
                platform="onnxruntime_onnx",
                inputs=[ts.TensorSpec("images", dtype, (3, -1, -1))],
                outputs=[ts.TensorSpec("features", dtype, (768,))],
                batching=ts.Batching(8, (), 0, 3, kind),
                parameters={"a key": 'a "quoted" value'},
                comments=["a comment"],
            )
            config = text_format.Parse(entry.to_pbtxt(), model_config_pb2.ModelConfig())
            assert type_name(config.input[0].data_type) == name and list(config.input[0].dims) == [3, -1, -1]
            assert model_config_pb2.ModelInstanceGroup.Kind.Name(config.instance_group[0].kind) == ts.KINDS[kind]
            assert config.parameters["a key"].string_value == 'a "quoted" value'
            assert not config.dynamic_batching.preferred_batch_size
