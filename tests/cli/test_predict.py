"""``vit-fast predict``: files, a folder with a broken file, JSON lines (kept on an interrupt), features files."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

pytest.importorskip("PIL", reason="Pillow (the images extra) decodes the images")
pytest.importorskip("sklearn", reason="the digits come from scikit-learn (the demo extra)")
from PIL import Image  # noqa: E402

import vit_fast  # noqa: E402
from vit_fast.cli import main  # noqa: E402

#: held-out digits (indices into load_digits) the embedded model classifies right
DIGITS = (1496, 188, 413, 705, 744)


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory):
    """Held-out digits as 8x8 grayscale PNGs (0..16 scaled to 0..255), in a folder with a subfolder."""
    from sklearn.datasets import load_digits

    data = load_digits()
    folder = tmp_path_factory.mktemp("digits")
    (folder / "more").mkdir()
    for n, i in enumerate(DIGITS):
        where = folder / "more" if n >= 3 else folder
        pixels = np.round(data.images[i] * 255 / 16).astype(np.uint8)
        Image.fromarray(pixels, "L").save(where / f"d{n}_label{data.target[i]}.png")
    return folder


def _label(path: str) -> str:
    return path.rsplit("_label", 1)[1].split(".")[0]


def test_files_print_top_k_with_the_digits_as_labels(digits_folder, capsys):
    files = sorted(str(p) for p in digits_folder.glob("*.png"))
    assert main(["predict", "default", *files, "--top-k", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3
    for line, file in zip(lines, files, strict=True):
        name, tops = line.split(": ", 1)
        labels = tops.split()[::2]
        probs = [float(p) for p in tops.split()[1::2]]
        assert name == file and len(labels) == 3 and labels[0] == _label(file)  # top-1 is the digit drawn
        assert probs == sorted(probs, reverse=True) and 0.5 < probs[0] <= 1.0


def test_a_folder_with_a_broken_file_answers_the_rest_and_exits_1(digits_folder, tmp_path, capsys):
    folder = tmp_path / "mixed"
    folder.mkdir()
    for p in digits_folder.rglob("*.png"):
        (folder / p.name).write_bytes(p.read_bytes())
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n but then nothing")
    out_json = tmp_path / "rows.json"
    assert main(["predict", "default", str(folder), "--batch", "2", "--json", str(out_json)]) == 1
    captured = capsys.readouterr()
    assert "broken.png" in captured.err and "1 of 6 images could not be read" in captured.err
    assert "[predict] 3/6 images: 2 answered" in captured.err  # progress on a folder (a line per batch off a tty)
    answered = [line.split(": ")[0] for line in captured.out.strip().splitlines()]
    assert len(answered) == 5 and "broken.png" not in " ".join(answered)
    rows = [json.loads(line) for line in out_json.read_text().splitlines()]
    assert [r["file"].rsplit("/", 1)[1] for r in rows] == sorted(p.name for p in folder.iterdir())
    broken = next(r for r in rows if r["file"].endswith("broken.png"))
    assert "cannot be decoded" in broken["error"] or "not an image" in broken["error"]
    for row in rows:
        if "error" not in row:
            assert row["labels"][0] == _label(row["file"]) and len(row["probabilities"]) == 5


def test_json_to_stdout_is_json_lines_alone(digits_folder, capsys):
    assert main(["predict", "default", str(digits_folder), "--json", "-", "--top-k", "2"]) == 0
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.strip().splitlines()]
    assert len(rows) == len(DIGITS) and all(len(r["labels"]) == 2 for r in rows)
    assert "more/" in " ".join(r["file"] for r in rows)  # folders are walked through their subfolders
    assert "d0_label" in captured.err  # the readable lines went to stderr


def test_an_interrupt_keeps_every_finished_batch(digits_folder, tmp_path, capsys, monkeypatch):
    from vit_fast.interop import predicting

    real, calls = predicting.forward_batch, []

    def cut_after_first(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(predicting, "forward_batch", cut_after_first)
    out_json, features = tmp_path / "rows.json", tmp_path / "f.safetensors"
    argv = ["predict", "default", str(digits_folder), "--batch", "2", "--json", str(out_json)]
    assert main([*argv, "--features", str(features)]) == 130
    assert "interrupted" in capsys.readouterr().err
    rows = [json.loads(line) for line in out_json.read_text().splitlines()]
    assert len(rows) == 2 and all("error" not in r for r in rows)  # the first batch, whole
    from safetensors import safe_open

    with safe_open(str(features), "pt") as f:
        assert f.get_tensor("features").shape == (2, 64)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left behind


@pytest.mark.parametrize("suffix", [".safetensors", ".npy"])
def test_features_files_hold_pooled_features_and_names(suffix, digits_folder, tmp_path, capsys):
    path = tmp_path / f"features{suffix}"
    assert main(["predict", "default", str(digits_folder), "--features", str(path)]) == 0
    assert capsys.readouterr().out == ""  # features instead of labels
    if suffix == ".npy":
        table = np.load(path, allow_pickle=False)
        names, feats = list(table["file"]), torch.from_numpy(table["feature"])
    else:
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            names, feats = json.loads(f.metadata()["files"]), f.get_tensor("features")
    assert len(names) == len(DIGITS) and feats.shape == (len(DIGITS), 64)
    model = vit_fast.load_model("default", backend="torch")
    x = vit_fast.image_transform(model)(names[0])[None]
    with torch.inference_mode():
        expected = model.forward_head(model.forward_features(x), pre_logits=True)[0]
    torch.testing.assert_close(feats[0], expected, rtol=1e-5, atol=1e-5)


def test_a_hugging_face_folder_brings_its_processor_and_labels(tmp_path, capsys):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    from ..fakes import tiny_hf_classifier

    hf = tiny_hf_classifier(num_labels=4, image_size=32)
    hf.config.id2label = {0: "tench", 1: "goldfish", 2: "shark", 3: "ray"}
    hf.config.label2id = {v: k for k, v in hf.config.id2label.items()}
    hf.save_pretrained(tmp_path / "model")
    pil = getattr(transformers, "ViTImageProcessorPil", None) or transformers.ViTImageProcessor
    processor = pil(size={"height": 32, "width": 32})
    processor.save_pretrained(tmp_path / "model")
    pixels = np.asarray(Image.new("RGB", (45, 37), (200, 30, 90)), dtype=np.uint8).copy()
    pixels[::3] = 20  # stripes: something for the model to see
    Image.fromarray(pixels).save(tmp_path / "x.png")
    assert main(["predict", str(tmp_path / "model"), str(tmp_path / "x.png"), "--json", "-", "--top-k", "4"]) == 0
    row = json.loads(capsys.readouterr().out)
    with torch.inference_mode():
        logits = hf(pixel_values=processor(images=pixels, return_tensors="pt")["pixel_values"]).logits[0]
    probs = torch.softmax(logits.double(), -1)
    expected = [hf.config.id2label[int(i)] for i in probs.argsort(descending=True)]
    assert row["labels"] == expected  # transformers' own names, in transformers' order
    assert np.allclose(row["probabilities"], sorted(probs.tolist(), reverse=True), atol=2e-3)


def test_the_preprocessing_that_ran_is_named(digits_folder, capsys):
    """The torch backend and the grayscale default model run image_transform; the line on stderr says why."""
    file = str(next(digits_folder.glob("*.png")))
    assert main(["predict", "default", file, "--backend", "torch"]) == 0
    assert "preprocessing: image_transform (eager): the torch backend runs no Triton kernel" in capsys.readouterr().err
    assert main(["predict", "default", file, "--backend", "triton"]) == 0  # Triton's interpreter here
    captured = capsys.readouterr()
    assert "preprocessing: image_transform (eager): the kernel takes 3 channels, this model 1" in captured.err
    assert captured.out.split(": ")[1].split()[0] == _label(file)


def test_triton_backend_preprocesses_on_the_fused_kernel(tmp_path, capsys):
    """An RGB model on the triton backend (the interpreter here): two images of different sizes and aspects in one
    launch, answers as the torch backend's with image_transform gives them."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    from ..fakes import tiny_hf_classifier

    hf = tiny_hf_classifier(num_labels=4, image_size=32)
    hf.save_pretrained(tmp_path / "model")
    processor = {"image_processor_type": "BitImageProcessor", "size": {"shortest_edge": 36}, "resample": 3}
    processor.update(do_center_crop=True, crop_size={"height": 32, "width": 32})
    processor.update(image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
    (tmp_path / "model" / "preprocessor_config.json").write_text(json.dumps(processor))
    g = torch.Generator().manual_seed(0)
    for name, (h, w) in {"a.png": (37, 53), "b.png": (61, 29)}.items():
        smooth = torch.nn.functional.interpolate(torch.rand(1, 3, 4, 5, generator=g), size=(h, w), mode="bilinear")
        Image.fromarray((smooth[0].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()).save(tmp_path / name)
    files = [str(tmp_path / "a.png"), str(tmp_path / "b.png")]
    rows = {}
    for backend in ("torch", "triton"):
        assert main(["predict", str(tmp_path / "model"), *files, "--json", "-", "--backend", backend]) == 0
        captured = capsys.readouterr()
        rows[backend] = [json.loads(line) for line in captured.out.splitlines()]
    said = "preprocessing: fused kernel; BitImageProcessor: resize shorter side to 36 (bicubic), centre crop 32x32, "
    assert f"vit-fast predict: {said}mean (0.485, 0.456, 0.406)" in captured.err
    for backend, ran in (("torch", "image_transform"), ("triton", "fused kernel")):
        pre = rows[backend][0]["preprocessing"]
        assert pre["ran"] == ran and pre["source"] == "BitImageProcessor" and pre["uint8_passes"] is True
        assert (pre["size"], pre["crop"], pre["crop_rounding"]) == (36, [32, 32], "floor")
    for torch_row, triton_row in zip(rows["torch"], rows["triton"], strict=True):
        assert triton_row["labels"] == torch_row["labels"]
        assert np.allclose(triton_row["probabilities"], torch_row["probabilities"], atol=2e-3)


def test_json_rows_name_the_preprocessing_that_ran(digits_folder, capsys):
    """Each answered row says what preprocessed it (ran, why not the kernel) and with what parameters."""
    file = str(next(digits_folder.glob("*.png")))
    assert main(["predict", "default", file, "--json", "-", "--backend", "torch"]) == 0
    pre = json.loads(capsys.readouterr().out)["preprocessing"]
    assert pre["ran"] == "image_transform" and pre["why"] == "the torch backend runs no Triton kernel"
    assert pre["source"] == "vit-fast digits_vit.json" and pre["size"] == [32, 32] and pre["channels"] == 1
    assert pre["mean"] == [pytest.approx(0.3054, abs=1e-4)] and pre["antialias"] is False and pre["defaulted"] == []


def test_a_model_without_preprocessing_is_said_and_the_flags_set_it(tmp_path, capsys):
    """A preset carries no preprocessing: timm's defaults run, a warning line names them and the flags; with the
    flags, no warning, and the line and rows show what was given."""
    Image.new("RGB", (40, 30), (120, 30, 200)).save(tmp_path / "x.png")
    argv = ["predict", "vit_tiny_patch16_224", str(tmp_path / "x.png"), "--json", "-", "--top-k", "1"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    warned = r"warning: 'vit_tiny_patch16_224': the model carries no preprocessing of its own, so timm's defaults"
    assert re.search(warned + r".*mean \(0.485, 0.456, 0.406\) \(ImageNet's\).*--mean, --std", captured.err)
    assert json.loads(captured.out)["preprocessing"]["defaulted"] == ["interpolation", "crop_pct", "mean", "std"]
    flags = ["--mean", "0.5,0.5,0.5", "--std", "0.5", "--interpolation", "bilinear", "--crop-pct", "1"]
    assert main([*argv, *flags]) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err
    line = "timm pretrained_cfg (flags over it): resize shorter side to 224 (bilinear), centre crop 224x224, "
    assert line + "mean (0.5, 0.5, 0.5), std (0.5, 0.5, 0.5)" in captured.err
    pre = json.loads(captured.out)["preprocessing"]
    assert pre["defaulted"] == [] and pre["std"] == [0.5] * 3 and pre["size"] == 224
