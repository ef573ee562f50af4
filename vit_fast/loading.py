"""The one place that resolves a model name: ``load_model("default" | preset | checkpoint | timm/HF name)``."""

from __future__ import annotations

from pathlib import Path

import torch

from .checkpoints import LOAD_SUFFIXES, load_checkpoint
from .config import PRESETS, ViTConfig
from .convert import from_timm, optimize
from .model import VisionTransformer


def load_model(spec: str, backend: str = "auto", seed: int = 0) -> VisionTransformer:
    """A model by name: ``"default"`` (the embedded model), a preset (random weights, fixed
    seed), a checkpoint path, or a timm / Hugging Face name where those libraries and the
    weights are available."""
    if spec in ("default", "embedded"):
        from .assets import load_default_model

        return load_default_model(backend=backend)
    if spec in PRESETS:
        with torch.random.fork_rng(devices=[]):  # seeded weights without touching the caller's RNG
            torch.manual_seed(seed)
            model = VisionTransformer(ViTConfig.from_name(spec), backend=backend)
        return model.eval()
    if Path(spec).suffix.lower() in LOAD_SUFFIXES or Path(spec).is_file():
        return load_checkpoint(spec, backend=backend).eval()
    errors = []
    try:
        import timm
    except ImportError:
        errors.append("timm is not installed")
    else:
        if spec in timm.list_models():
            return from_timm(timm.create_model(spec, pretrained=True), backend=backend).eval()
        errors.append("not a timm model name")
    if "/" in spec or Path(spec).is_dir():  # a Hugging Face hub id ("org/name") or a saved model folder
        try:
            from transformers import AutoConfig, AutoModel, AutoModelForImageClassification
        except ImportError:
            errors.append("transformers is not installed")
        else:
            # a classification checkpoint keeps its head; anything else loads as the bare encoder
            archs = getattr(AutoConfig.from_pretrained(spec), "architectures", None) or []
            loader = AutoModelForImageClassification if any("ImageClassification" in a for a in archs) else AutoModel
            return optimize(loader.from_pretrained(spec), backend=backend).eval()
    raise ValueError(
        f"cannot resolve model {spec!r}: it is not 'default', a preset ({', '.join(sorted(PRESETS))}), "
        f"or an existing checkpoint file; " + "; ".join(errors)
    )
