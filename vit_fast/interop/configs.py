"""Configs from files: a :class:`ViTConfig` from a preset name, a dict, or a config.json (vit-fast's own, a Hugging
Face ViT's or timm's), every field's type and size checked before anything is built (:func:`resolve_config`)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from vit_fast.interop.convert import hf_config_to_vit
from vit_fast.model.config import PRESETS, ViTConfig
from vit_fast.util.files import read_json
from vit_fast.util.limits import above_ceiling, check_model_fits, number_text

#: fields a vit-fast config file (or a checkpoint's embedded config) must name: the ones whose defaults are
#: ViT-B/16's, which a file that lacks them would otherwise silently take
REQUIRED_FIELDS = ("img_size", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "num_classes")
#: a Hugging Face ViT config.json's fields read here -> the JSON types each may hold
_HF_FIELD_TYPES = {
    "image_size": "int",
    "patch_size": "int",
    "num_channels": "int",
    "hidden_size": "int",
    "num_hidden_layers": "int",
    "num_attention_heads": "int",
    "intermediate_size": "int",
    "num_labels": "int",
    "layer_norm_eps": "number",
    "qkv_bias": "bool",
    "hidden_act": "str",
}


#: a Hugging Face ViT config.json's size fields -> the vit_fast.util.limits ceiling each is held to
_HF_CEILINGS = {
    "hidden_size": "embed_dim",
    "num_hidden_layers": "depth",
    "num_attention_heads": "num_heads",
    "intermediate_size": "mlp_hidden_dim",
    "image_size": "img_size",
    "patch_size": "patch_size",
    "num_channels": "in_chans",
    "num_labels": "num_classes",
}
#: ViTConfig's names -> a Hugging Face config's, for messages about the size of the model it describes
_HF_NAMES = {
    "embed_dim": "hidden_size",
    "depth": "num_hidden_layers",
    "mlp_hidden_dim": "intermediate_size",
    "img_size": "image_size",
    "in_chans": "num_channels",
    "num_classes": "num_labels",
}


def check_hf_config_fields(data: dict, source: str) -> None:
    """Raise ValueError naming ``source`` and the first field of a Hugging Face ViT config.json whose JSON type is
    wrong (``"hidden_size": "768"``) or whose size is beyond what vit-fast builds (``vit_fast.util.limits.CEILINGS``),
    before any arithmetic on it and before transformers builds anything."""
    for name, kind in _HF_FIELD_TYPES.items():
        if name not in data or (name == "num_labels" and data[name] is None):
            continue
        value = data[name]
        ok = {
            "int": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, (int, float)) and not isinstance(value, bool),
            "bool": isinstance(value, bool),
            "str": isinstance(value, str),
        }[kind]
        if not ok:
            want = {"int": "an integer", "number": "a number", "bool": "true or false", "str": "a string"}[kind]
            raise ValueError(
                f"Hugging Face config {source}: field {name!r} is {number_text(value)} ({type(value).__name__}), "
                f"expected {want}: fix that field in the file"
            )
        too_large = above_ceiling(_HF_CEILINGS[name], value) if name in _HF_CEILINGS else None
        if too_large:
            raise ValueError(f"Hugging Face config {source}: field {name!r} {too_large}: fix that field in the file")
    labels = data.get("id2label")
    too_many = above_ceiling("num_classes", len(labels)) if isinstance(labels, (dict, list)) else None
    if too_many:
        raise ValueError(f"Hugging Face config {source}: field 'id2label' names {too_many}: fix that field")


#: the Hugging Face ``model_type`` vit-fast converts (transformers' ViTModel, ViTForImageClassification)
HF_MODEL_TYPES = ("vit",)


def check_hf_model_type(data: dict, source: str, also: tuple[str, ...] = ()) -> None:
    """Refuse, before anything is loaded, a Hugging Face config.json whose ``model_type`` is not one vit-fast takes
    (:data:`HF_MODEL_TYPES`, plus ``also``), naming it and the ones it takes. A config without one is let through."""
    kind = data.get("model_type")
    if kind is None or kind in HF_MODEL_TYPES or kind in also:
        return
    taken = ", ".join(repr(t) for t in (*HF_MODEL_TYPES, *also))
    raise ValueError(
        f"{source} is a {str(kind)[:80]!r} model (config.json's model_type), which vit-fast does not load: it takes "
        f"model_type {taken}; give a Hugging Face ViT model (ViTModel, ViTForImageClassification)"
    )


def hf_config_dict_to_vit(data: dict, source: str) -> ViTConfig:
    """A transformers ViT ``config.json`` (``model_type`` "vit") as a ViTConfig, without importing transformers."""
    check_hf_config_fields(data, source)
    labels = data.get("id2label") or {}
    num_classes = int(data.get("num_labels") or len(labels) or 0)
    archs = data.get("architectures") or []
    if archs and not any("ImageClassification" in a for a in archs):
        num_classes = 0
    fields = dict(image_size=224, patch_size=16, num_channels=3, hidden_size=768, num_hidden_layers=12)
    fields.update(num_attention_heads=12, intermediate_size=3072, layer_norm_eps=1e-12, hidden_act="gelu")
    fields.update(qkv_bias=True)
    fields.update({k: v for k, v in data.items() if k in fields})
    try:
        cfg = hf_config_to_vit(SimpleNamespace(**fields), num_classes)
    except (TypeError, ValueError) as err:
        raise ValueError(f"Hugging Face config {source}: {err}: fix that field in the file") from err
    # before anything is built (transformers' from_pretrained included); 2 bytes a parameter: the least it can take
    check_model_fits(cfg, f"Hugging Face config {source}", element_size=2, names=_HF_NAMES)
    return cfg


def config_from_fields(data: object, source: str, fix: str) -> ViTConfig:
    """A ViTConfig from the JSON object of a vit-fast config file or a checkpoint's embedded config: every
    field of :data:`REQUIRED_FIELDS` present (never a silent ViT-B/16 default), every error naming ``source``
    (where the config came from) and ending with ``fix``."""
    if not isinstance(data, dict):
        raise ValueError(f"{source} holds a {type(data).__name__}, expected a JSON object of ViTConfig fields; {fix}")
    missing = [k for k in REQUIRED_FIELDS if k not in data]
    if missing:
        raise ValueError(
            f"{source} lacks the field(s) {', '.join(missing)}: vit-fast does not guess an architecture "
            f"(it would be ViT-B/16's); {fix}"
        )
    try:
        cfg = ViTConfig.from_dict(data)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{source}: {err}; {fix}") from err
    check_model_fits(cfg, source, element_size=2)  # before anything is built; 2 bytes: the least a parameter takes
    return cfg


def resolve_config(config: ViTConfig | str | os.PathLike | dict) -> ViTConfig:
    """A ViTConfig from a ViTConfig, a preset name, a dict of its fields, or a JSON file: vit-fast's own
    (``ViTConfig.to_dict``; every field of :data:`REQUIRED_FIELDS` present), a Hugging Face ViT ``config.json``,
    or timm's (``architecture`` a preset name)."""
    if isinstance(config, ViTConfig):
        return config
    if isinstance(config, dict):
        return ViTConfig.from_dict(config)
    text = str(config)
    if text in PRESETS:
        return ViTConfig.from_name(text)
    path = Path(text)
    if path.exists() and not (path.is_file() or path.is_dir()):  # a FIFO, socket or device: never opened
        raise ValueError(f"config {text!r} is not a regular file: give a config.json file or a preset name")
    if path.suffix.lower() != ".json" and not path.is_file():
        return ViTConfig.from_name(text)  # a KeyError that lists the presets
    if path.is_dir():
        path = path / "config.json"
    if path.exists() and not path.is_file():
        raise ValueError(f"config {str(path)!r} is not a regular file: give a config.json file or a preset name")
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist")
    try:  # bounded: size, nesting and integer length, each refusal naming the file (and the field)
        data = read_json(path, "config")
    except OSError as err:
        raise ValueError(f"config {str(path)!r} cannot be read: {err.strerror or err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"config {str(path)!r} holds a {type(data).__name__}, expected a JSON object")
    if data.get("model_type") is not None or "hidden_size" in data:
        check_hf_model_type(data, f"Hugging Face config {str(path)!r}")
        return hf_config_dict_to_vit(data, repr(str(path)))
    if "architecture" in data:  # timm's config.json
        arch = str(data["architecture"])
        if arch not in PRESETS:
            raise ValueError(
                f"timm config {str(path)!r} names architecture {arch!r}, which is not a vit-fast preset: pass a "
                f"preset with the same architecture instead ({', '.join(sorted(PRESETS))})"
            )
        return ViTConfig.from_name(
            arch, num_classes=int(data.get("num_classes", PRESETS[arch].get("num_classes", 1000)))
        )
    return config_from_fields(
        data, f"config file {str(path)!r}", "fix the file, or give a preset name such as 'vit_base_patch16_224'"
    )
