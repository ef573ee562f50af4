"""Stand-ins shared by the export and bench tests: a tiny Hugging Face classifier, a failing os.replace."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch


def tiny_hf_classifier(num_labels: int = 4, seed: int = 0) -> Any:
    """transformers' ViTForImageClassification, 32 px / 8 px patches, 32 wide, one block; every parameter random."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    torch.manual_seed(seed)
    config = transformers.ViTConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
        num_labels=num_labels,
    )
    model = transformers.ViTForImageClassification(config).eval()
    with torch.no_grad():  # HF zero-inits biases and LayerNorm; randomise so every parameter matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def fail_replace_onto(monkeypatch: pytest.MonkeyPatch, suffix: str, staging_mark: str) -> None:
    """Make ``os.replace`` fail with ENOSPC when it moves a staged file (a path holding ``staging_mark``) onto a
    target ending in ``suffix``; every other move goes through."""
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        if str(dst).endswith(suffix) and staging_mark in str(src):
            raise OSError(28, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
