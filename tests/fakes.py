"""Stand-ins shared by the tests: a tiny Hugging Face classifier, trained-like weights for a timm model, the kernel
launches of a call counted, a failing publish."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
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


def trained_like(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """A timm model's weights as training leaves them, in place; returns it in eval mode: signed LayerScale gammas,
    norm scales far from 1 (a ResPostBlock's norms start at init_values), every other parameter (biases that start
    at zero included) perturbed."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".gamma"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif p.ndim == 1 and "norm" in name and name.endswith(".weight"):
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.5)
            else:
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model.eval()


def kernel_launches(call: Callable[[], Any]) -> tuple[Any, Counter]:
    """``call()``'s result and how many times each of our kernels launched in it, by kernel name
    (``vit_fast.kernels._common.record_launches``; under Triton's interpreter too): a fallback to eager PyTorch
    launches none."""
    from vit_fast.kernels._common import record_launches

    with record_launches() as launches:
        result = call()
    return result, Counter(launch["kernel"] for launch in launches)


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
