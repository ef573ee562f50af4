"""One name for a bench's files, whichever way it was started: a checkpoint by its stem, a Hugging Face folder by
its own name (never the path to it), hub names whole, and a loaded module (the command line's --config, or
BenchResult.write) by the model as named or described."""

from __future__ import annotations

import pytest

import vit_fast
from vit_fast.bench.api import model_slug, report_stem
from vit_fast.cli import main


@pytest.mark.parametrize(
    ("spec", "slug"),
    [
        ("vit_base_patch16_224", "vit_base_patch16_224"),
        ("/tmp/a/b/w.safetensors", "w"),
        ("rel/dir/m.pth", "m"),
        ("hf:google/vit-base-patch16-224", "hf_google_vit-base-patch16-224"),
        ("timm:vit_tiny_patch16_224.augreg_in21k", "timm_vit_tiny_patch16_224.augreg_in21k"),
        ("some/where/hf_vit", "hf_vit"),
    ],
)
def test_model_slug(spec, slug):
    assert model_slug(spec) == slug


def test_a_folder_is_named_by_itself(tmp_path):
    folder = tmp_path / "deep" / "hf_vit"
    folder.mkdir(parents=True)
    assert report_stem(str(folder)) == report_stem(str(folder) + "/") == "bench_hf_vit"


def test_the_command_line_names_a_loaded_model_as_typed(tmp_path, capsys):
    cfg = vit_fast.ViTConfig(img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3)
    model = vit_fast.VisionTransformer(cfg, backend="torch")
    ckpt = tmp_path / "plain.safetensors"
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt))  # no config inside
    config = tmp_path / "config.json"
    config.write_text(cfg.to_json())
    fast = ["--device", "cpu", "--max-samples", "3", "--warmup", "1", "--threads", "1", "--quiet", "--no-ceilings"]
    out = tmp_path / "out"
    argv = ["bench", str(ckpt), "--config", str(config), "--batch", "1", "--backends", "torch", "--out", str(out)]
    assert main([*argv, *fast]) == 0
    assert [p.name for p in out.iterdir() if p.suffix == ".json"] == ["bench_plain.json"]
