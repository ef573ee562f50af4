"""The export formats' registry (vit_fast.export.formats): every reader of a format reads it there, so a format
added to the table alone is built, opened, refused by suffix and benchmarked by the generic paths; ``to_onnx``
chooses its graph once and hands its options on by name."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import vit_fast
from vit_fast.backend import env
from vit_fast.bench.backends import Variant, static_unavailable
from vit_fast.bench.settings import BACKENDS
from vit_fast.cli import main, module_extra
from vit_fast.export import formats, onnx_checks, runners
from vit_fast.export import onnx as onnx_export
from vit_fast.export.onnx_native import native_to_onnx
from vit_fast.util import files


def test_every_format_is_one_whole_entry_that_the_lower_layers_know():
    for name, entry in formats.FORMATS.items():
        assert (
            entry.name == name and entry.suffixes and all(s.startswith(".") and s == s.lower() for s in entry.suffixes)
        )
        assert callable(entry.load("build"))
        runner = entry.load("runner")
        assert issubclass(runner, runners.Runner) and runner.open_file is not runners.Runner.open_file
        assert files.ARTIFACT_FORMATS[name] == entry.suffixes  # the file policy's suffixes
        assert entry.extra in env.EXTRAS and all(module_extra(m) == entry.extra for m in entry.modules)
        assert entry.bench_backend in BACKENDS and formats.bench_format(entry.bench_backend) is entry
        assert formats.format_named(entry.kind) is entry
        for suffix in entry.suffixes:
            assert formats.format_of(f"M{suffix.upper()}") is entry
    assert formats.format_of("model.bin") is None
    with pytest.raises(ValueError, match="no export format 'coreml'; the formats are onnx, tensorrt"):
        formats.format_named("coreml")


def test_the_opener_and_the_file_policy_read_the_suffixes_from_the_table(tmp_path):
    (tmp_path / "m.engine").write_bytes(b"an engine")
    (tmp_path / "m.bin").write_bytes(b"not an artifact")
    assert files.is_artifact_metadata(tmp_path / "m.engine.json")  # would be its metadata, by the name
    assert not files.is_artifact_metadata(tmp_path / "m.bin.json")
    with pytest.raises(vit_fast.export.ArtifactError, match=r"cannot tell what .*m.bin.* use \.onnx for .*\.trt for"):
        runners.open_artifact(tmp_path / "m.bin")


# --------------------------------------------------------------------------- a format added to the table alone
BUILT: list[tuple[str, Path, dict]] = []


def fake_build(source, out, **options):
    """The stand-in format's build: records its call and writes the artifact through the one writer."""
    BUILT.append((source, Path(out), options))
    files.write_new(Path(out), b"a fake artifact")
    return Path(out)


class FakeRunner(runners.Runner):
    """The stand-in format's runner: opens the file only."""

    def __init__(self, path):
        self.path = Path(path)

    @classmethod
    def unavailable(cls, cuda, dtype_name):
        return None if cuda else f"the fake runtime needs a GPU (asked for {dtype_name})"


FAKE = formats.ArtifactFormat(
    name="fake",
    what="fake artifact",
    suffixes=(".fake",),
    kind="fake",
    extra="onnx",
    modules=("torch",),
    build=f"{__name__}:fake_build",
    runner=f"{__name__}:FakeRunner",
    verify="the fake runtime",
    bench_backend="fakebench",
    summary="build a fake artifact",
)


def test_a_format_added_to_the_table_is_built_opened_and_benchmarked_by_the_generic_paths(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(formats.FORMATS, "fake", FAKE)
    monkeypatch.setitem(files.ARTIFACT_FORMATS, "fake", FAKE.suffixes)
    BUILT.clear()
    out = tmp_path / "new" / "m.fake"
    assert main(["export", "fake", "src", "--out", str(out), "--batch", "2,5", "--no-verify", "--quiet"]) == 0
    assert BUILT == [("src", out, dict(batch=(2, 5), verify=False, report=None, overwrite=False, progress=False))]
    assert f"wrote {out} (not verified)" in capsys.readouterr().out
    assert main(["export", "fake", "src", "--out", str(tmp_path / "m.onnx"), "--no-verify"]) == 1
    assert "wrong suffix '.onnx': a --out is written as .fake" in capsys.readouterr().err
    assert isinstance(runners.open_artifact(out), FakeRunner)
    assert files.is_artifact_metadata(tmp_path / "new" / "m.fake.json")
    cpu = torch.device("cpu")
    assert static_unavailable(Variant("fakebench"), cpu, "fp16") == "the fake runtime needs a GPU (asked for fp16)"
    assert static_unavailable(Variant("fakebench"), torch.device("cuda"), "fp16") is None


# --------------------------------------------------------------------------- to_onnx: one choice, options by name
class NaFlexVit(torch.nn.Module):
    """Named as timm's, from a module named as timm's: what native_family reads."""


NaFlexVit.__module__ = "timm.models.naflexvit"


def test_to_onnx_chooses_the_graph_once_and_hands_every_option_on_by_name(monkeypatch, tmp_path):
    tiny = vit_fast.VisionTransformer(vit_fast.ViTConfig(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2))
    assert onnx_export.onnx_builder(tiny) is onnx_export.plain_to_onnx
    assert onnx_export.onnx_builder(NaFlexVit()) is native_to_onnx
    given = dict(
        batch=(2, 9),
        dtype="fp16",
        opset=19,
        exporter="torchscript",
        dynamic_size=True,
        attention="fused",
        source="src",
        progress=False,
        outputs=("pooled",),
        input_name="pixels",
        output_names=("p",),
        preprocess={"layout": "NHWC"},
        verify=False,
        report=tmp_path / "r.json",
        overwrite=True,
        max_grid=12,
    )
    seen = []
    monkeypatch.setattr(onnx_export, "plain_to_onnx", lambda model, path, options: seen.append(options) or path)
    assert onnx_export.to_onnx(tiny, tmp_path / "m.onnx", **given) == tmp_path / "m.onnx"
    assert seen == [onnx_checks.OnnxOptions(**given)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        seen[0].batch = (1, 1)
