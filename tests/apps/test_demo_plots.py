"""vit_fast.demo.plots: the data behind the demo's pictures is the model's (token order, attention) and the
report's (confusion, timings), and the pictures are PNG files of the size the module says."""

from __future__ import annotations

import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn", reason="the embedded digits data needs scikit-learn (pip install -e '.[demo]')")

from vit_fast.assets import load_default_eval_set  # noqa: E402
from vit_fast.demo import plots as demo_plots  # noqa: E402
from vit_fast.interop.loading import load_default_model  # noqa: E402


@pytest.fixture(scope="module")
def digits():
    model = load_default_model(backend="torch")
    images, labels = load_default_eval_set()
    return model, images, labels


def png_header_size(path) -> tuple[int, int]:
    """(width, height) read straight from the file's IHDR chunk, independently of demo_plots.png_size."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    assert data[12:16] == b"IHDR"
    assert data[-8:-4] == b"IEND", f"{path.name} is truncated"
    return struct.unpack(">II", data[16:24])


def expected_size(name: str) -> tuple[int, int]:
    w, h = demo_plots.SIZES_IN[name]
    return round(w * demo_plots.DPI), round(h * demo_plots.DPI)


def timing_step(with_ort: bool = True) -> dict:
    rng = np.random.default_rng(0)
    cases = {}
    for batch, scale in (("1", 1.5), ("360", 900.0)):
        cases[batch] = {}
        for backend in ("torch", "onnxruntime") if with_ort else ("torch",):
            t = scale * (1 + rng.random(20))
            p10, p50, p90 = np.percentile(t, [10, 50, 90])
            cases[batch][backend] = {"n": 20, "median_ms": p50, "p10_ms": p10, "p90_ms": p90, "mean_ms": t.mean()}
    return {"name": "timing", "status": "ok", "clock": "CPU wall-clock", "threads": 2, "cases": cases}


def test_patch_sequence_is_the_order_the_patch_embedding_reads(digits):
    model, images, _ = digits
    cfg = model.cfg
    x = images[:3]
    with torch.no_grad():
        tokens = model.patch_embed(x)  # [3, patches, D], the model's own order
        proj = model.patch_embed.proj
        weight = proj.weight.reshape(cfg.embed_dim, -1)  # [D, p*p] (one input channel)
        for i in range(len(x)):
            seq = demo_plots.patch_sequence(x[i, 0].numpy(), cfg.patch_size)
            assert seq.shape == (cfg.num_patches, cfg.patch_size, cfg.patch_size)
            flat = torch.from_numpy(seq.reshape(cfg.num_patches, -1).copy())
            torch.testing.assert_close(flat @ weight.T + proj.bias, tokens[i], rtol=1e-5, atol=1e-5)
    # and a mislabelled order would not pass: the grid transposed gives other tokens
    transposed = demo_plots.patch_sequence(x[0, 0].numpy().T.copy(), cfg.patch_size)
    assert not np.allclose(transposed, demo_plots.patch_sequence(x[0, 0].numpy(), cfg.patch_size))


def test_class_token_attention_is_the_last_blocks_and_sums_to_one(digits):
    model, images, _ = digits
    cfg = model.cfg
    x = images[:4]
    model.set_backend("auto")
    with torch.no_grad():
        before = model(x)
    cls = demo_plots.class_token_attention(model, x)
    assert cls.shape == (4, cfg.num_heads, cfg.num_tokens)
    assert (cls >= 0).all()
    torch.testing.assert_close(cls.sum(-1), torch.ones(4, cfg.num_heads), rtol=0, atol=1e-6)
    # the model is left as it was: its backend, no hook, the same outputs
    attn = model.blocks[-1].attn
    assert model.backend == "auto" and not attn._forward_hooks
    with torch.no_grad():
        torch.testing.assert_close(model(x), before, rtol=0, atol=0)

    # the probabilities are the ones the block uses: with v they give the attention module's own output
    seen = []
    handle = attn.register_forward_hook(lambda m, args, out: seen.append((args[0], out)))
    try:
        with torch.no_grad():
            model.set_backend("torch")(x)
    finally:
        handle.remove()
        model.set_backend("auto")
    inp, out = seen[0]
    with torch.no_grad():
        probs = attn.probabilities(inp)
        B, T, D = inp.shape
        v = attn.qkv(inp).reshape(B, T, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)[2]
        rebuilt = attn.proj((probs @ v).transpose(1, 2).reshape(B, T, D))
    torch.testing.assert_close(rebuilt, out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(probs[:, :, 0, :], cls, rtol=0, atol=0)


def test_confusion_matrix_counts_rows_true_columns_predicted():
    labels = torch.tensor([0, 0, 1, 2, 2, 2])
    predictions = torch.tensor([0, 1, 1, 2, 0, 2])
    m = demo_plots.confusion_matrix(labels, predictions, 3)
    assert m.tolist() == [[1, 1, 0], [0, 1, 0], [1, 0, 2]]
    assert m.sum() == len(labels) and np.trace(m) == int((labels == predictions).sum())


def test_pick_examples_takes_the_first_of_each_digit_and_names_a_missing_one():
    labels = torch.tensor([3, 0, 4, 0, 7, 4])
    assert demo_plots.pick_examples(labels, (0, 4, 7)) == [1, 2, 4]
    with pytest.raises(ValueError, match="label 9"):
        demo_plots.pick_examples(labels, (0, 9))


def test_timing_bars_carry_the_steps_numbers_unchanged():
    step = timing_step()
    bars = demo_plots.timing_bars(step)
    assert len(bars) == 4
    for bar in bars:
        stats = step["cases"][str(bar["batch"])][bar["backend"]]
        assert {k: bar[k] for k in ("n", "median_ms", "p10_ms", "p90_ms")} == {
            k: stats[k] for k in ("n", "median_ms", "p10_ms", "p90_ms")
        }


def test_matplotlib_missing_is_a_one_line_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    note = demo_plots.matplotlib_missing()
    assert note is not None and "\n" not in note and "pip install -e '.[demo]' in a vit-fast checkout" in note


def test_write_figures_writes_four_pngs_of_the_stated_size_from_the_given_numbers(digits, tmp_path):
    pytest.importorskip("matplotlib", reason="the pictures need matplotlib (pip install -e '.[demo]')")
    model, images, labels = digits
    with torch.no_grad():
        predictions = model(images).argmax(-1)
    accuracy = (predictions == labels).double().mean().item()
    step = timing_step()
    figures = demo_plots.write_figures(tmp_path, model, images, labels, predictions, accuracy, step)

    assert list(figures) == ["patches", "attention", "confusion", "timing"]
    for name, fig in figures.items():
        path = tmp_path / fig["file"]
        assert fig["file"] == f"{name}.png" and path.is_file()
        assert png_header_size(path) == (fig["width_px"], fig["height_px"]) == expected_size(name)
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]

    shown = figures["patches"]["data"]["images"]
    assert [int(labels[k]) for k in shown] == list(demo_plots.SHOWN_DIGITS)
    assert figures["attention"]["data"]["images"] == shown
    att = np.array(figures["attention"]["data"]["class_token_attention"])
    assert att.shape == (len(shown), model.cfg.num_heads, model.cfg.num_tokens)
    np.testing.assert_allclose(att.sum(-1), 1.0, rtol=0, atol=1e-6)
    conf = figures["confusion"]["data"]
    matrix = np.array(conf["matrix"])
    assert matrix.sum() == conf["images"] == len(labels) == 360
    assert np.trace(matrix) / matrix.sum() == pytest.approx(accuracy, abs=1e-12) and conf["accuracy"] == accuracy
    assert figures["timing"]["data"]["bars"] == demo_plots.timing_bars(step)


def test_write_figures_without_a_timing_step_draws_the_other_three(digits, tmp_path):
    pytest.importorskip("matplotlib", reason="the pictures need matplotlib (pip install -e '.[demo]')")
    model, images, labels = digits
    skipped = {"name": "timing", "status": "skipped", "summary": "--skip-timing"}
    predictions = labels.clone()  # any predictions will do: the picture draws what it is given
    figures = demo_plots.write_figures(tmp_path, model, images, labels, predictions, 1.0, skipped)
    assert figures["timing"] == {"file": None, "skipped": "the timing step is skipped"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attention.png", "confusion.png", "patches.png"]
    assert np.trace(np.array(figures["confusion"]["data"]["matrix"])) == len(labels)


def test_timing_picture_with_torch_only_and_a_wide_spread(tmp_path):
    pytest.importorskip("matplotlib", reason="the pictures need matplotlib (pip install -e '.[demo]')")
    step = timing_step(with_ort=False)
    step["cases"]["1"]["torch"]["p90_ms"] = 100 * step["cases"]["1"]["torch"]["p10_ms"]  # a busy machine: log axis
    png = demo_plots.draw_timing(demo_plots.timing_bars(step), step["clock"], step["threads"])
    assert demo_plots.png_size(png) == expected_size("timing")
    with pytest.raises(ValueError, match="not a PNG"):
        demo_plots.png_size(b"GIF89a" + bytes(30))


def test_importing_vit_fast_and_its_cli_does_not_import_matplotlib():
    modules = "vit_fast, vit_fast.demo.report, vit_fast.demo.plots, vit_fast.cli"
    code = f"import sys, {modules}; print('matplotlib' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
