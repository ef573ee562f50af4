"""``vit-fast export`` and ``vit-fast verify`` through vit_fast.cli.main, on a saved tiny checkpoint."""

from __future__ import annotations

import json
import os
import sys
import types

import pytest
import torch

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")

import vit_fast  # noqa: E402
from vit_fast.cli import main  # noqa: E402

CFG = dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=5, reg_tokens=1)


def _model(seed: int) -> vit_fast.VisionTransformer:
    torch.manual_seed(seed)
    model = vit_fast.VisionTransformer(vit_fast.ViTConfig(**CFG), backend="torch").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny checkpoint, exported and verified through the CLI once: (folder, checkpoint, onnx, rc)."""
    folder = tmp_path_factory.mktemp("cli")
    ckpt = vit_fast.save_checkpoint(_model(0), folder / "tiny.safetensors")
    out = folder / "tiny.onnx"
    rc = main(
        [
            "export",
            "onnx",
            str(ckpt),
            "--out",
            str(out),
            "--exporter",
            "torchscript",
            "--batch",
            "1,4",
            "--json",
            str(folder / "export-report.json"),
            "--quiet",
        ]
    )
    return folder, ckpt, out, rc


def test_export_onnx(exported, capsys):
    folder, ckpt, out, rc = exported
    assert rc == 0
    assert sorted(os.listdir(folder)) == ["export-report.json", "tiny.onnx", "tiny.onnx.json", "tiny.safetensors"]
    report = json.loads((folder / "export-report.json").read_text())
    assert report["passed"] and [r["batch"] for r in report["rows"]] == [1, 3, 4]
    meta = json.loads((folder / "tiny.onnx.json").read_text())
    assert meta["source"] == str(ckpt.resolve()) and meta["batch"] == [1, 4]


def test_verify(exported, tmp_path, capsys):
    folder, ckpt, out, _ = exported
    assert main(["verify", str(ckpt), str(out), "--json", str(tmp_path / "v.json"), "--batch", "2,4"]) == 0
    assert "PASSED" in capsys.readouterr().out
    assert [r["batch"] for r in json.loads((tmp_path / "v.json").read_text())["rows"]] == [2, 4]


def test_verify_failure_exits_1(exported, tmp_path, capsys):
    folder, ckpt, out, _ = exported
    other = vit_fast.save_checkpoint(_model(1), tmp_path / "other.safetensors")
    assert main(["verify", str(other), str(out)]) == 1
    captured = capsys.readouterr()
    assert "FAILED" in captured.out and "worst is output 'logits' at batch" in captured.err


def test_verify_bad_artifact(exported, tmp_path, capsys):
    _, ckpt, _, _ = exported
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage")
    assert main(["verify", str(ckpt), str(bad)]) == 1
    assert "bad.onnx" in capsys.readouterr().err


def test_verify_default_reports_accuracy(exported, monkeypatch, capsys):
    """MODEL "default" loads the labelled held-out set lazily (stubbed here: the asset is not ours)."""
    _, ckpt, out, _ = exported
    model = vit_fast.load_checkpoint(ckpt, backend="torch").eval()
    images = torch.randn(6, 3, 32, 32)
    labels = model(images).argmax(-1)
    assets = types.ModuleType("vit_fast.assets")
    assets.load_default_eval_set = lambda: (images, labels)
    monkeypatch.setitem(sys.modules, "vit_fast.assets", assets)
    # verify imports load_model when it runs (the command line imports no torch before that)
    monkeypatch.setattr("vit_fast.interop.loading.load_model", lambda spec, backend="auto", seed=0, **kwargs: model)
    assert main(["verify", "default", str(out)]) == 0
    assert "labelled data (6 images): eager accuracy 100.00%, artifact accuracy 100.00%" in capsys.readouterr().out


def test_the_cpu_hint_keeps_the_artifact_and_verify_batch_verifies_only_those(exported, tmp_path, monkeypatch, capsys):
    """On a CPU, GPU-sized verification (the model's FLOPs read as ViT-L/16's) is announced with a quicker check that
    changes what is verified, never what is published: --verify-batch, not --batch (the artifact's range).
    Following it verifies only those batches; the artifact keeps its range."""
    _, ckpt, _, _ = exported
    monkeypatch.setattr("vit_fast.model.vit.count_flops", lambda cfg: 61.6e9)
    out = tmp_path / "m.onnx"
    assert main(["export", "onnx", str(ckpt), "--out", str(out), "--exporter", "torchscript", "--batch", "1,4"]) == 0
    [note] = [line for line in capsys.readouterr().err.splitlines() if "GFLOP on a CPU" in line]
    assert "(try --verify-batch 1,3 (batches=[1, 3]) for a quicker check" in note, note
    assert "the artifact keeps its batch range 1..4" in note and "--batch " not in note, note
    argv = ["export", "onnx", str(ckpt), "--out", str(out), "--exporter", "torchscript", "--batch", "1,4"]
    assert main([*argv, "--verify-batch", "2", "--json", str(tmp_path / "r.json"), "--quiet"]) == 0
    meta = json.loads((tmp_path / "m.onnx.json").read_text())
    assert meta["batch"] == [1, 4] and meta["verification"]["batches"] == [2]
    assert [r["batch"] for r in json.loads((tmp_path / "r.json").read_text())["rows"]] == [2]


def test_export_errors(exported, tmp_path, capsys):
    _, ckpt, _, _ = exported
    out = str(tmp_path / "m.onnx")
    with pytest.raises(SystemExit) as exc:  # a range out of order is an argument error: exit 2, as documented
        main(["export", "onnx", str(ckpt), "--out", out, "--batch", "4,2"])
    assert exc.value.code == 2
    assert "'4,2' is out of order: give MIN,MAX with MIN <= MAX, e.g. 2,4" in capsys.readouterr().err
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["export", "onnx", str(ckpt), "--out", str(blocker / "sub" / "m.onnx"), "--quiet"]) == 1
    assert f"{str(blocker)!r} is a file" in capsys.readouterr().err
    blocker.unlink()
    assert main(["export", "onnx", str(ckpt), "--out", out, "--dtype", "bf16"]) == 1
    assert "bf16 ONNX files cannot be verified on ONNX Runtime" in capsys.readouterr().err
    assert main(["export", "onnx", "no_such_preset", "--out", out]) == 1
    assert "cannot resolve model 'no_such_preset'" in capsys.readouterr().err
    assert main(["export", "onnx", str(ckpt), "--out", out, "--exporter", "torchscript", "--attention", "fused"]) == 1
    assert "needs exporter='dynamo'" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_export_that_fails_verification_is_removed(exported, tmp_path, monkeypatch, capsys):
    _, ckpt, _, _ = exported
    from vit_fast.export import VerificationError

    def failing(*args, **kwargs):
        raise VerificationError("verification of 'm.onnx' failed: worst is ...", None)

    import vit_fast.export.onnx as onnx_module

    monkeypatch.setattr(onnx_module, "verify_staged", failing)  # the staged file is judged before publishing
    out = tmp_path / "m.onnx"
    assert main(["export", "onnx", str(ckpt), "--out", str(out), "--exporter", "torchscript", "--quiet"]) == 1
    assert "error: verification of 'm.onnx' failed" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []  # nothing published, no staging left


def test_export_bf16_without_verification_into_a_new_folder(exported, tmp_path, capsys):
    _, ckpt, _, _ = exported
    out = tmp_path / "new" / "folder" / "m.onnx"  # missing folders are created, as for bench and demo
    args = ["export", "onnx", str(ckpt), "--out", str(out), "--dtype", "bfloat16", "--exporter", "torchscript"]
    assert main([*args, "--no-verify", "--quiet"]) == 0
    assert "not verified" in capsys.readouterr().out
    assert json.loads((out.parent / "m.onnx.json").read_text())["dtype"] == "bf16"


def test_export_tensorrt_checks_first(exported, tmp_path, capsys):
    _, _, out, _ = exported
    plan = str(tmp_path / "m.plan")
    with pytest.raises(SystemExit) as exc:  # a range out of order is an argument error: exit 2, as documented
        main(["export", "tensorrt", str(out), "--out", plan, "--batch", "4,2,8"])
    assert exc.value.code == 2
    assert "'4,2,8' is out of order: give MIN,OPT,MAX with MIN <= OPT <= MAX" in capsys.readouterr().err
    assert main(["export", "tensorrt", str(out), "--out", plan, "--batch", "1,2,8"]) == 1
    assert "outside the ONNX file's exported batch range [1, 4]" in capsys.readouterr().err
    assert main(["export", "tensorrt", str(tmp_path / "none.onnx"), "--out", plan]) == 1
    assert "none.onnx' does not exist" in capsys.readouterr().err
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        assert main(["export", "tensorrt", str(out), "--out", plan, "--batch", "1,2,4"]) == 1
        assert "TensorRT is not installed" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_help(capsys):
    for argv in (
        ["export", "--help"],
        ["export", "onnx", "--help"],
        ["export", "tensorrt", "--help"],
        ["verify", "--help"],
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 0
    assert "--attention" in capsys.readouterr().out


def test_export_whose_verification_cannot_run_is_removed(tmp_path, monkeypatch, capsys):
    """Not only a numeric mismatch: an artifact that verify cannot even run is not left behind either."""
    from vit_fast import save_checkpoint
    from vit_fast.export import ArtifactError

    from ..fakes import tiny_model

    ckpt = save_checkpoint(tiny_model(), tmp_path / "m.safetensors")
    out = tmp_path / "m.onnx"

    def cannot_run(*args, **kwargs):
        raise ArtifactError("ONNX Runtime cannot load it")

    import vit_fast.export.onnx as onnx_module

    monkeypatch.setattr(onnx_module, "verify_staged", cannot_run)
    assert main(["export", "onnx", str(ckpt), "--out", str(out), "--exporter", "torchscript", "--quiet"]) == 1
    assert "error: ONNX Runtime cannot load it" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch", "1,x"], "batch size 'x' in '1,x' is not an int"),
        (["--batch", "1,8,64"], "'1,8,64' has 3 item(s); give MIN,MAX"),
        (["--batch", "0,4"], "batch size 0 in '0,4' must be >= 1"),
        (["--dtype", "fp8"], "unknown dtype 'fp8'"),
    ],
)
def test_export_usage_errors_exit_2_naming_the_bad_item(args, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["export", "onnx", "default", "--out", str(tmp_path / "m.onnx"), *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_verify_json_under_a_file_is_refused_before_any_work(exported, tmp_path, capsys):
    _, ckpt, out, _ = exported
    blocker = tmp_path / "report"
    blocker.write_text("")
    assert main(["verify", str(ckpt), str(out), "--json", str(blocker / "v.json")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("vit-fast verify: error: --json") and "is a file" in err and "Traceback" not in err
