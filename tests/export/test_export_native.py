"""ONNX export of native-resolution towers (timm NaFlexVit, transformers Siglip2VisionModel): three inputs dynamic
in batch and tokens, verified on ONNX Runtime's CPU provider at three image-size mixes that the record names; a
failed verification publishes nothing; what cannot trace dynamically is refused by name. The position-table resize
the export copy of a NaFlexVit runs instead of timm's is judged against timm's by the numerics rule."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("onnx", reason="the onnx extra is not installed")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
timm = pytest.importorskip("timm", reason="timm is not installed (make setup installs it with --no-deps)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import onnx  # noqa: E402

import vit_fast  # noqa: E402
from vit_fast import export  # noqa: E402
from vit_fast.export import native  # noqa: E402
from vit_fast.export.onnx_checks import symbolic_dims  # noqa: E402

from ..fakes import trained_like  # noqa: E402
from ..numerics import assert_within_eager  # noqa: E402

TINY = dict(depth=1, embed_dim=32, num_heads=2)
#: the three mixes verified by default, as the record must name them (16 px patches, a 16 x 16 position table)
NAFLEX_MIXES = [[(32, 48), (48, 32)], [(16, 16), (64, 48), (40, 40)], [(288, 304)]]
SIGLIP_MIXES = [[(8, 12), (12, 8)], [(4, 4), (16, 12), (12, 12)], [(24, 28)]]  # 4 px patches, a 4 x 4 table


def _naflexvit(name: str = "naflexvit_base_patch16_gap", **kwargs):
    torch.manual_seed(0)
    return trained_like(timm.create_model(name, pretrained=False, num_classes=4, **TINY, **kwargs), 1)


def _siglip2():
    torch.manual_seed(0)
    config = transformers.Siglip2VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, patch_size=4, num_patches=16
    )
    model = transformers.Siglip2VisionModel(config)
    with torch.no_grad():  # HF zero-inits biases and LayerNorm; randomise so every parameter matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def _check_artifact(path, inputs, mixes):
    proto = onnx.load(str(path))
    assert [i.name for i in proto.graph.input] == list(inputs)
    for value in proto.graph.input:  # batch and tokens symbolic (spatial_shapes: batch, then its fixed 2)
        dims = symbolic_dims(value)
        assert dims[:2] == ([True, False] if value.name == "spatial_shapes" else [True, True]), (value.name, dims)
    record = export.read_metadata(path)["verification"]
    assert record["passed"] and record["size_mixes"] == [[list(s) for s in mix] for mix in mixes]
    assert "size mixes: {" in export.format_verification(record)
    return record


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_naflexvit_exports_dynamic_and_verifies_at_three_mixes(exporter, tmp_path, capsys):
    """bicubic antialiased position table (timm's default), registers, LayerScale, patched onto our kernels first:
    export traces PyTorch's forwards all the same."""
    model = _naflexvit()
    vit_fast.apply_vit_fast(model, backend="triton")
    out = export.to_onnx(
        model, tmp_path / "naflex.onnx", batch=(1, 4), exporter=exporter, report=tmp_path / "r.json", progress=False
    )
    record = _check_artifact(out, native.INPUTS["naflexvit"], NAFLEX_MIXES)
    assert record["outputs"] == ["logits"] and (tmp_path / "r.json").is_file()
    assert export.read_metadata(out)["exporter"] == exporter
    assert "images {16x16, 64x48, 40x40}" in capsys.readouterr().out
    assert vit_fast.remove_vit_fast(model) == 1  # the caller's model is still patched


def test_siglip2_exports_dynamic_and_verifies_at_three_mixes(tmp_path):
    out = export.to_onnx(_siglip2(), tmp_path / "siglip2.onnx", batch=(1, 4), progress=False)
    record = _check_artifact(out, native.INPUTS["siglip2"], SIGLIP_MIXES)
    assert record["outputs"] == ["last_hidden_state", "pooled"]


def test_failed_verification_publishes_nothing(tmp_path, monkeypatch):
    """A resize off by up to 0.01 at every token (not the same in every channel, which a LayerNorm would take
    away): the graph traces, its outputs are wrong, nothing is written."""
    resize = native.ResizeTable.forward

    def off(self, x, patch_coord):
        resize(self, x, patch_coord)
        x.add_(torch.linspace(0, 0.01, x.shape[-1]))

    monkeypatch.setattr(native.ResizeTable, "forward", off)
    with pytest.raises(export.VerificationError, match=r"at images 32x48"):
        export.to_onnx(
            _naflexvit(),
            tmp_path / "bad.onnx",
            batch=(1, 2),
            exporter="torchscript",  # the quicker trace
            verify=export.VerifyOptions(size_mixes=[[(32, 48)]], print_table=False),
            progress=False,
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "name", sorted({n for n in timm.list_models("naflexvit_*")} - {"naflexvit_base_patch16_parfac_gap"})
)
def test_resize_table_matches_timm(name):
    """Each learned position table's mode, antialias, align_corners and aspect-ratio rule, at grids smaller and
    larger than the table and not square: the export's resize against timm's, both fp32, by the rule against the
    same resize in float64."""
    model = _naflexvit(name)
    embeds = model.embeds
    table = native.ResizeTable(embeds, native.DEFAULT_MAX_GRID)
    from vit_fast.interop.naflex import pack_images

    sizes = [(16, 16), (48, 80), (16 * 20, 16 * 17)]
    coord = pack_images([torch.zeros(3, h, w) for h, w in sizes], 16)["patch_coord"]
    x = torch.randn(len(sizes), coord.shape[1], embeds.pos_embed.shape[-1])
    ours, theirs = x.clone(), x.clone()
    table(ours, coord)
    embeds._apply_learned_naflex_pos_embed(theirs, coord)
    reference = x.double()
    pos = embeds.pos_embed.permute(0, 3, 1, 2).double()
    for b, (h, w) in enumerate(sizes):
        gh, gw = -(-h // 16), -(-w // 16)
        size = (max(gh, gw),) * 2 if embeds.pos_embed_ar_preserving else (gh, gw)
        if size != tuple(pos.shape[2:]):
            grid = F.interpolate(
                pos,
                size=size,
                mode=embeds.pos_embed_interp_mode,
                align_corners=embeds.pos_embed_align_corners,
                antialias=embeds.pos_embed_antialias,
            )
        else:
            grid = pos
        flat = grid[0, :, :gh, :gw].flatten(1).T
        reference[b, : gh * gw] += flat
    assert_within_eager(ours, theirs, reference, name=f"{name} position table")
    # and the mixes verified by default fit the sides the export takes (RADIO's 128 table included)
    from vit_fast.export.verify_native import check_mixes

    assert len(check_mixes(model, None, native.max_grid_of(model, None))) == 3


def test_refused_by_name_before_any_work(tmp_path):
    model = _naflexvit()
    with pytest.raises(ValueError, match="Siglip2VisionModel on the TorchScript exporter: its tracer keeps"):
        export.to_onnx(_siglip2(), tmp_path / "a.onnx", exporter="torchscript", progress=False)
    with pytest.raises(ValueError, match=r"rotary position embeddings .* does not trace"):
        export.to_onnx(_naflexvit(rope_type="axial"), tmp_path / "a.onnx", progress=False)
    with pytest.raises(ValueError, match="factorized position embeddings"):
        export.to_onnx(_naflexvit("naflexvit_base_patch16_parfac_gap"), tmp_path / "a.onnx", progress=False)
    with pytest.raises(ValueError, match="70 patches a side, past the 64"):
        export.to_onnx(
            model, tmp_path / "a.onnx", verify=export.VerifyOptions(size_mixes=[[(16, 16 * 70)]]), progress=False
        )
    with pytest.raises(ValueError, match="image-size mixes"):
        export.to_onnx(model, tmp_path / "a.onnx", verify=export.VerifyOptions(batches=[1]), progress=False)
    assert list(tmp_path.iterdir()) == []


def test_cli_exports_a_siglip2_folder_at_the_mixes_given(tmp_path, capsys):
    from vit_fast.cli import main

    folder = tmp_path / "siglip2"
    _siglip2().save_pretrained(folder)
    out = tmp_path / "s.onnx"
    mixes = [[(4, 8), (8, 4)], [(12, 12)], [(4, 4), (8, 8), (16, 12)]]
    argv = ["export", "onnx", str(folder), "--out", str(out), "--batch", "1,3", "--quiet"]
    assert main([*argv, *(a for m in ("4x8,8x4", "12x12", "4x4,8x8,16x12") for a in ("--size-mix", m))]) == 0
    _check_artifact(out, native.INPUTS["siglip2"], mixes)


def test_cli_refusals(tmp_path, capsys):
    from vit_fast.cli import main

    out = str(tmp_path / "n.onnx")
    assert main(["export", "onnx", "timm:naflexvit_base_patch16_gap", "--out", out]) == 1
    assert "from a local weights file: pass --weights FILE" in capsys.readouterr().err
    assert main(["export", "onnx", "default", "--out", out, "--size-mix", "16x16"]) == 1
    assert "--size-mix verifies a native-resolution model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["export", "onnx", "default", "--out", out, "--size-mix", "16by16"])
    assert list(tmp_path.iterdir()) == []


def test_verify_points_a_native_model_to_verify_native(tmp_path):
    with pytest.raises(TypeError, match="verify_native"):
        export.verify(_siglip2(), tmp_path / "s.onnx")
