"""The embedded default model: a small ViT trained on scikit-learn's handwritten digits, and its data.

``digits_vit.safetensors`` (weights; ``vit_fast.interop.loading.load_default_model`` loads them), ``digits_vit.json``
(training record), :func:`load_digits_split`, :func:`preprocess` (8x8 digits upsampled to 32x32, normalised by
``DIGITS_MEAN`` / ``DIGITS_STD``). Data and split: docs/cli.md, "The embedded default model".
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import torch

from vit_fast.backend.env import install_hint

ASSETS_DIR = Path(__file__).resolve().parent
WEIGHTS_FILE = ASSETS_DIR / "digits_vit.safetensors"
INFO_FILE = ASSETS_DIR / "digits_vit.json"

#: the input the model takes: [N, 1, 32, 32] float32, normalised
IMG_SIZE = 32
SRC_SIZE = 8
#: fixed normalisation constants (mean / std of the upsampled training split, in [0, 1] pixel units)
DIGITS_MEAN = 0.3054
DIGITS_STD = 0.3237
SPLIT_SEED = 0
TEST_SIZE = 0.2

_SKLEARN_HINT = f"the embedded digits data needs scikit-learn: {install_hint('demo')}"


def _load_digits_raw() -> tuple[Any, Any]:
    """``(pixels [1797, 64] float64 in 0..16, labels [1797] int)`` from scikit-learn."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:
        raise ImportError(_SKLEARN_HINT) from err
    digits = load_digits()
    return digits.data, digits.target


def split_indices(labels: Any, seed: int = SPLIT_SEED, test_size: float = TEST_SIZE) -> tuple[Any, Any]:
    """Stratified, seeded ``(train_idx, test_idx)`` over ``range(len(labels))``."""
    import numpy as np

    try:
        from sklearn.model_selection import train_test_split
    except ImportError as err:
        raise ImportError(_SKLEARN_HINT) from err
    idx = np.arange(len(labels))
    train_idx, test_idx = train_test_split(idx, test_size=test_size, stratify=labels, random_state=seed, shuffle=True)
    return np.asarray(train_idx), np.asarray(test_idx)


def upsample(pixels: Any) -> torch.Tensor:
    """Raw digits pixels (0..16; ``[N, 64]`` or ``[N, 8, 8]``) to ``[N, 1, 32, 32]`` float32 in [0, 1]."""
    import torch.nn.functional as F

    x = torch.as_tensor(pixels, dtype=torch.float32).reshape(-1, 1, SRC_SIZE, SRC_SIZE) / 16.0
    return F.interpolate(x, size=(IMG_SIZE, IMG_SIZE), mode="bilinear", align_corners=False).contiguous()


def normalize(x: torch.Tensor) -> torch.Tensor:
    """``(x - DIGITS_MEAN) / DIGITS_STD`` on upsampled [0, 1] images."""
    return (x - DIGITS_MEAN) / DIGITS_STD


def preprocess(pixels: Any) -> torch.Tensor:
    """Raw digits pixels (0..16) to model input ``[N, 1, 32, 32]`` float32, exactly as in training."""
    return normalize(upsample(pixels)).contiguous()


def load_digits_split(seed: int = SPLIT_SEED) -> dict[str, torch.Tensor]:
    """Train and held-out tensors: ``x_train, y_train, x_test, y_test`` (inputs preprocessed)."""
    pixels, labels = _load_digits_raw()
    train_idx, test_idx = split_indices(labels, seed=seed)
    x = preprocess(pixels)
    y = torch.as_tensor(labels, dtype=torch.int64)
    tr, te = torch.as_tensor(train_idx), torch.as_tensor(test_idx)
    return {
        "x_train": x[tr].contiguous(),
        "y_train": y[tr].contiguous(),
        "x_test": x[te].contiguous(),
        "y_test": y[te].contiguous(),
    }


@cache
def _eval_set() -> tuple[torch.Tensor, torch.Tensor]:
    split = load_digits_split()
    return split["x_test"], split["y_test"]


def load_default_eval_set() -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out split the recorded accuracy was measured on. Returns ``(images, labels)``: images float32
    ``[360, 1, 32, 32]`` normalised exactly as in training, labels int64 ``[360]``. Rebuilt deterministically from
    scikit-learn (an ImportError names the demo extra's install when it is missing). Fresh copies each call.
    """
    images, labels = _eval_set()
    return images.clone(), labels.clone()


@cache
def _eval_pixels() -> tuple[torch.Tensor, torch.Tensor]:
    pixels, labels = _load_digits_raw()
    _, test_idx = split_indices(labels)
    images = (upsample(pixels[test_idx]) * 255).round().to(torch.uint8)
    return images.contiguous(), torch.as_tensor(labels[test_idx], dtype=torch.int64)


def load_default_eval_pixels() -> tuple[torch.Tensor, torch.Tensor]:
    """The same held-out split as uint8 pixels, for artifacts that normalise pixels themselves (exported with a
    preprocessing front). Returns ``(images, labels)``: images uint8 ``[360, 1, 32, 32]`` (steps 1 and 2 of the
    preprocessing, times 255, rounded), labels int64 ``[360]``, in the order of :func:`load_default_eval_set`. A front
    with ``mean=DIGITS_MEAN, std=DIGITS_STD`` (scale 1/255) gives the model training's inputs up to that rounding. Fresh
    copies each call."""
    images, labels = _eval_pixels()
    return images.clone(), labels.clone()


def default_model_info() -> dict[str, Any]:
    """The training record ``digits_vit.json``: held-out accuracy, split seed, command, versions."""
    if not INFO_FILE.is_file():
        raise FileNotFoundError(
            f"{INFO_FILE} is missing: run `python -m vit_fast.interop.training --out vit_fast/assets`"
        )
    return json.loads(INFO_FILE.read_text())


__all__ = [
    "DIGITS_MEAN",
    "DIGITS_STD",
    "SPLIT_SEED",
    "IMG_SIZE",
    "WEIGHTS_FILE",
    "INFO_FILE",
    "default_model_info",
    "load_default_eval_set",
    "load_digits_split",
    "preprocess",
    "split_indices",
]
