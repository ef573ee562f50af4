"""The export formats' registry (vit_fast.export.formats): every reader of a format reads it there, so a format
added to the table alone is built, opened, refused by suffix and benchmarked by the generic paths; ``to_onnx``
chooses its graph once and hands its options on by name."""

from __future__ import annotations

import dataclasses
import email.message
import json
import sys
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
        assert entry.extra in env.extras() and all(module_extra(m) == entry.extra for m in entry.modules)
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


# --------------------------------------------------------------------------- a format written in three places
#: the toy format's own module, as ``export/<name>.py`` would be: a build that needs its runtime, and a runner
TOY_MODULE = """
from pathlib import Path

from vit_fast.export import runners


def build(source, out, **options):
    import toyrt  # the runtime its extra installs, missing here

    return Path(out)


class ToyRunner(runners.Runner):
    def __init__(self, path):
        self.path = Path(path)

    @classmethod
    def unavailable(cls, cuda, dtype_name):
        return "toyrt is not installed"
"""
#: what its extra adds to pyproject.toml
TOY_PYPROJECT = '[project]\nname = "vit-fast"\n[project.optional-dependencies]\nonnx = ["onnx"]\ntoy = ["toyrt>=1"]\n'


@pytest.fixture
def toy_format(tmp_path, monkeypatch):
    """A format added as a developer adds one: its module (under tmp_path), its entry in the table (registered as the
    table registers its entries) and its extra in pyproject.toml (a stand-in checkout), nothing else."""
    (tmp_path / "toy_format").mkdir()
    (tmp_path / "toy_format" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "toy_format" / "toy.py").write_text(TOY_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = dataclasses.replace(
        FAKE, name="toy", what="toy file", suffixes=(".toy",), kind="toy", extra="toy", modules=("toyrt",)
    )
    entry = dataclasses.replace(entry, summary="build a toy file and verify it with toyrt")
    entry = dataclasses.replace(
        entry, build="toy_format.toy:build", runner="toy_format.toy:ToyRunner", bench_backend="toyb"
    )
    monkeypatch.setitem(formats.FORMATS, "toy", entry)
    monkeypatch.setitem(files.ARTIFACT_FORMATS, "toy", ())  # undone after the test
    files.register_artifact_format(entry.name, entry.suffixes)
    (tmp_path / "pyproject.toml").write_text(TOY_PYPROJECT, encoding="utf-8")
    monkeypatch.setattr(env, "SOURCE_ROOT", tmp_path)
    env.extras.cache_clear()
    yield tmp_path
    env.extras.cache_clear()
    for module in ("toy_format.toy", "toy_format"):
        sys.modules.pop(module, None)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="the checkout's pyproject.toml is read with tomllib (3.11+)")
def test_a_format_is_its_module_its_entry_and_its_extra(toy_format, monkeypatch, capsys):
    with pytest.raises(SystemExit) as done:
        main(["export", "--help"])
    assert done.value.code == 0 and "build a toy file and verify it with toyrt" in capsys.readouterr().out
    (toy_format / "m.toy").write_bytes(b"a toy artifact")
    opened = runners.open_artifact(toy_format / "m.toy")
    assert type(opened).__name__ == "ToyRunner" and opened.path == toy_format / "m.toy"
    assert files.is_artifact_metadata(toy_format / "m.toy.json")  # the file policy knows .toy
    assert env.extras() == ("onnx", "toy") and "'.[toy]'" in env.install_hint("toy")  # its extra exists
    out = toy_format / "new.toy"
    assert main(["export", "toy", "src", "--out", str(out), "--no-verify", "--quiet"]) == 1
    hint = f"No module named 'toyrt' (the toy extra: {env.install_hint('toy')})"
    assert hint in capsys.readouterr().err
    real = env.importable_version  # the other packages' imports are not what this test is about (and are slow)
    monkeypatch.setattr(env, "importable_version", lambda m: real(m) if m == "toyrt" else ("9.9", None))
    assert main(["info", "--json", "-"]) == 0
    text, report = capsys.readouterr()
    info = json.loads(text)
    assert info["backends"]["toyb"] == "no: toyrt is not installed" and "toyrt" in info and info["toyrt"] is None
    assert "  toyrt         not installed" in report and "  toyb          no: toyrt is not installed" in report


def test_outside_a_checkout_the_extras_are_the_installed_distributions(toy_format, monkeypatch):
    from importlib import metadata

    declared = email.message.Message()
    for extra in ("onnx", "tensorrt", "toy"):
        declared["Provides-Extra"] = extra
    monkeypatch.setattr(env, "SOURCE_ROOT", toy_format / "site-packages")  # no pyproject.toml: a wheel's install
    monkeypatch.setattr(metadata, "metadata", lambda name: declared if name == "vit-fast" else None)
    assert env.extras() == ("onnx", "tensorrt", "toy") and module_extra("toyrt") == "toy"
    with pytest.raises(ValueError, match=r"no extra 'gpu'; its extras are onnx, tensorrt, toy$"):
        env.install_hint("gpu")


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
