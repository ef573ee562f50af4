"""The embedded default model: weights load, config and accuracy are as recorded, ONNX agrees."""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytest.importorskip("sklearn", reason="the embedded digits data needs scikit-learn (pip install -e '.[demo]')")

from vit_fast import VisionTransformer, ViTConfig, load_model  # noqa: E402
from vit_fast.assets import (  # noqa: E402
    DIGITS_MEAN,
    DIGITS_STD,
    SPLIT_SEED,
    WEIGHTS_FILE,
    default_model_info,
    load_default_eval_set,
    load_digits_split,
)
from vit_fast.interop.checkpoints import CONFIG_METADATA_KEY, read_state_dict  # noqa: E402
from vit_fast.interop.loading import load_default_model  # noqa: E402


@pytest.fixture(scope="module")
def info() -> dict:
    return default_model_info()


@pytest.fixture(scope="module")
def model() -> VisionTransformer:
    torch.manual_seed(0)
    return load_default_model(backend="torch")


@pytest.fixture(scope="module")
def eval_set() -> tuple[torch.Tensor, torch.Tensor]:
    return load_default_eval_set()


def test_weights_file_is_small_fp32_safetensors_with_config():
    assert WEIGHTS_FILE.is_file()
    assert WEIGHTS_FILE.stat().st_size < 4 * 2**20
    state, meta = read_state_dict(WEIGHTS_FILE)
    assert CONFIG_METADATA_KEY in meta
    assert all(t.dtype == torch.float32 for t in state.values())
    assert all(torch.isfinite(t).all() for t in state.values())


def test_model_loads_in_eval_mode_with_recorded_config(model, info):
    assert isinstance(model, VisionTransformer)
    assert not model.training
    assert model.backend == "torch"
    assert model.dtype == torch.float32
    assert model.cfg == ViTConfig.from_dict(info["config"])
    cfg = model.cfg
    assert (cfg.img_size, cfg.patch_size, cfg.in_chans, cfg.num_classes, cfg.global_pool) == (32, 4, 1, 10, "token")
    assert cfg.num_tokens == 65
    assert 16 <= cfg.head_dim <= 256
    assert info["num_params"] == sum(p.numel() for p in model.parameters())


def test_load_model_default_and_backend_auto():
    m = load_model("default")
    assert isinstance(m, VisionTransformer) and not m.training and m.backend == "auto"
    assert load_default_model().backend == "auto"


def test_info_records_training(info):
    for key in ("heldout_accuracy", "split", "command", "torch", "train_time_s", "preprocessing", "training"):
        assert key in info, key
    assert info["split"]["random_state"] == SPLIT_SEED
    assert info["preprocessing"]["mean"] == DIGITS_MEAN and info["preprocessing"]["std"] == DIGITS_STD
    assert info["command"].startswith("python -m vit_fast.interop.training")
    assert info["training"]["epochs"] >= 1
    assert info["heldout_accuracy"] >= 0.95


def test_eval_set_is_the_stratified_held_out_split(eval_set):
    images, labels = eval_set
    assert images.dtype == torch.float32 and labels.dtype == torch.int64
    assert images.shape == (360, 1, 32, 32) and labels.shape == (360,)
    assert torch.bincount(labels, minlength=10).min() >= 35  # stratified: every digit ~36 times
    # normalised as in training: the background pixel (0) maps to -mean/std
    assert images.min().item() == pytest.approx(-DIGITS_MEAN / DIGITS_STD, abs=1e-5)
    again, again_labels = load_default_eval_set()
    assert torch.equal(again, images) and torch.equal(again_labels, labels)
    split = load_digits_split()
    assert split["x_train"].shape == (1437, 1, 32, 32)
    assert abs(split["x_train"].mean().item()) < 0.01 and abs(split["x_train"].std().item() - 1) < 0.01


def test_held_out_accuracy_reproduces_the_recorded_value(model, eval_set, info):
    images, labels = eval_set
    with torch.no_grad():
        acc = (model(images).argmax(-1) == labels).double().mean().item()
    assert abs(acc - info["heldout_accuracy"]) * 100 <= 0.5, (acc, info["heldout_accuracy"])
    assert acc >= 0.95


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None, reason="onnxruntime is not installed")
def test_onnxruntime_fp32_matches_torch_top1_on_the_whole_held_out_split(model, eval_set, tmp_path):
    """Exported with vit_fast.export, verified, then every held-out image checked in ORT directly."""
    import onnxruntime as ort

    from vit_fast import export

    images, labels = eval_set
    path = tmp_path / "digits.onnx"
    export.to_onnx(
        model, path, batch=(1, len(images)), dtype=torch.float32, opset=18, exporter="dynamo", progress=False
    )
    report = export.verify(model, path, data=(images, labels), seed=0, print_table=False, raise_on_failure=False)
    assert report.passed, report.format_table()
    assert report.accuracy["top1_agreement"] == 1.0
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: images.numpy()})[0])
    with torch.no_grad():
        eager = model(images)
    assert torch.equal(out.argmax(-1), eager.argmax(-1))
    assert (out - eager).abs().max().item() < 1e-4


def test_missing_sklearn_names_the_extra(monkeypatch):
    import sys

    from vit_fast import assets

    for name in ("sklearn", "sklearn.datasets", "sklearn.model_selection"):
        monkeypatch.setitem(sys.modules, name, None)  # import of a None entry raises ImportError
    with pytest.raises(ImportError, match=r"scikit-learn: pip install -e '\.\[demo\]' in a vit-fast checkout"):
        assets._load_digits_raw()
    with pytest.raises(ImportError, match=r"scikit-learn: pip install -e '\.\[demo\]' in a vit-fast checkout"):
        assets.split_indices([0, 1] * 10)
