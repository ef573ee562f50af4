"""Stand-ins shared by the tests: a tiny Hugging Face classifier, a failing publish, a kernel launch counter."""

from __future__ import annotations

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
    """Make the move of a staged file (a path holding ``staging_mark``) onto a target ending in ``suffix`` fail with
    ENOSPC, however vit_fast.files moves it (a rename that cannot replace, an exchange, ``os.replace``); every
    other move goes through."""
    from vit_fast import files

    real = files.publishing._rename

    def rename(src: Any, dst: Any, mode: str) -> bool:
        if str(dst).endswith(suffix) and staging_mark in str(src):
            raise OSError(28, "No space left on device")
        return real(src, dst, mode)

    monkeypatch.setattr(files.publishing, "_rename", rename)


def count_launches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of every kernel our launchers run from now on (``ResolvedLaunches``), in order; in Triton's
    interpreter too, where ``record_launches`` sees nothing (no compiled launch)."""
    from vit_fast.kernels._common import ResolvedLaunches

    names: list[str] = []
    original = ResolvedLaunches.__call__

    def counted(self, *args, **kwargs):
        names.append(self.jit_fn.__name__)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ResolvedLaunches, "__call__", counted)
    return names
