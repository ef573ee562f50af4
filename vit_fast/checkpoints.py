"""Checkpoint files: ``save_checkpoint`` / ``load_checkpoint`` / ``read_state_dict``.

``.safetensors`` (preferred) keeps the config in the file's metadata; ``.pth`` / ``.pt`` hold
``{"state_dict": ..., "config": {...}}`` written with ``torch.save`` and are read back with
``weights_only=True``. Foreign key layouts (Hugging Face) are converted by ``vit_fast.convert``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace

import torch

from .config import PRESETS, ViTConfig
from .convert import _grid_from_pos_embed, _load_converted, convert_hf_state_dict
from .files import finish_atomic
from .model import VisionTransformer

CONFIG_METADATA_KEY = "vit_fast_config"
#: set_input_normalization's per-channel mean and std (0..1 units) as JSON, when the model normalises uint8 input
NORMALIZATION_METADATA_KEY = "vit_fast_input_normalization"
#: suffixes save_checkpoint writes, and the format each gets
SAVE_FORMATS = {".safetensors": "safetensors", ".pth": "torch", ".pt": "torch"}
#: suffixes read_state_dict reads
LOAD_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt")


def _looks_hf(keys: list[str]) -> bool:
    return any(k.startswith(("vit.", "embeddings.", "encoder.layer.", "layers.")) for k in keys)


def save_checkpoint(model: VisionTransformer, path: str | os.PathLike, extra: Mapping[str, str] | None = None) -> Path:
    """Write the weights and the config (atomically) so that :func:`load_checkpoint` restores the model.

    ``.safetensors`` (preferred): safetensors, the config in the file's metadata. ``.pth`` / ``.pt``:
    ``torch.save({"state_dict": ..., "config": ..., "metadata": extra})``, readable with
    ``weights_only=True``. Any other suffix is refused before anything is written.
    """
    path = Path(path)
    fmt = SAVE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(
            f"save_checkpoint cannot tell the format of {str(path)!r} from its suffix {path.suffix!r}: "
            f"name it {path.stem}.safetensors (preferred) or {path.stem}.pth"
        )
    if not isinstance(model, VisionTransformer):
        raise TypeError(f"save_checkpoint saves a vit_fast.VisionTransformer, got {type(model).__name__}")
    if path.is_dir():
        raise ValueError(
            f"checkpoint path {str(path)!r} is a folder: give a file path such as {str(path / 'w.safetensors')!r}"
        )
    if not path.parent.is_dir():
        raise ValueError(f"folder {str(path.parent)!r} for checkpoint {str(path)!r} does not exist: create it first")
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    extra = dict(extra or {})
    if model.input_mean is not None:  # not in the state_dict (non-persistent buffers): saved beside the config
        extra[NORMALIZATION_METADATA_KEY] = json.dumps(
            {"mean": model.input_mean.tolist(), "std": model.input_std.tolist()}
        )
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        if fmt == "safetensors":
            from safetensors.torch import save_file

            save_file(tensors, str(tmp), {CONFIG_METADATA_KEY: model.cfg.to_json(), **(extra or {})})
        else:
            torch.save({"state_dict": tensors, "config": model.cfg.to_dict(), "metadata": dict(extra or {})}, tmp)
        finish_atomic(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_state_dict(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and string metadata from a .safetensors file, or a .pth/.pt/.bin loaded with weights_only."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist or is not a file")
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                meta = dict(f.metadata() or {})
                return {k: f.get_tensor(k) for k in f.keys()}, meta
        except Exception as err:  # safetensors raises its own types for corrupt headers
            raise ValueError(f"cannot read {str(path)!r} as safetensors: {err}") from err
    if suffix in (".pth", ".pt", ".bin", ".ckpt"):
        try:
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as err:
            raise ValueError(f"cannot load {str(path)!r} with torch.load(weights_only=True): {err}") from err
        meta: dict[str, str] = {}
        if isinstance(obj, Mapping):
            if isinstance(obj.get("config"), Mapping):
                meta[CONFIG_METADATA_KEY] = json.dumps(dict(obj["config"]))
            if isinstance(obj.get("metadata"), Mapping):
                meta.update({str(k): str(v) for k, v in obj["metadata"].items()})
            for key in ("state_dict", "model", "module"):
                if isinstance(obj.get(key), Mapping):
                    obj = obj[key]
                    break
        if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise ValueError(f"{str(path)!r} does not hold a state dict of tensors")
        return dict(obj), meta
    raise ValueError(
        f"unsupported checkpoint type {suffix!r} for {str(path)!r}: vit-fast reads {', '.join(LOAD_SUFFIXES)}"
    )


def file_sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes (read in 1 MiB chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _hf_config_dict_to_vit(data: dict, source: str) -> ViTConfig:
    """A transformers ViT ``config.json`` (``model_type`` "vit") as a ViTConfig, without importing transformers."""
    from .convert import hf_config_to_vit

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
        return hf_config_to_vit(SimpleNamespace(**fields), num_classes)
    except (TypeError, ValueError) as err:
        raise ValueError(f"Hugging Face config {source}: {err}") from err


def resolve_config(config: ViTConfig | str | os.PathLike | dict) -> ViTConfig:
    """A ViTConfig from a ViTConfig, a preset name, a dict of its fields, or a JSON file: vit-fast's own
    (``ViTConfig.to_dict``), a Hugging Face ViT ``config.json``, or timm's (``architecture`` a preset name)."""
    if isinstance(config, ViTConfig):
        return config
    if isinstance(config, dict):
        return ViTConfig.from_dict(config)
    text = str(config)
    if text in PRESETS:
        return ViTConfig.from_name(text)
    path = Path(text)
    if path.suffix.lower() != ".json" and not path.is_file():
        return ViTConfig.from_name(text)  # a KeyError that lists the presets
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"config {str(path)!r} cannot be read as JSON: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"config {str(path)!r} holds a {type(data).__name__}, expected a JSON object")
    if data.get("model_type") == "vit" or "hidden_size" in data:
        return _hf_config_dict_to_vit(data, repr(str(path)))
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
    return ViTConfig.from_dict(data)


def load_checkpoint(
    path: str | os.PathLike, cfg: ViTConfig | str | os.PathLike | None = None, backend: str = "auto"
) -> VisionTransformer:
    """A :class:`VisionTransformer` from a checkpoint in timm or Hugging Face names (detected).

    The config comes from ``cfg`` (a :class:`ViTConfig`, a preset name, or a config.json: vit-fast's,
    Hugging Face's or timm's) or else from the file's metadata as written by :func:`save_checkpoint`.
    A position embedding saved for another image size is resampled to ``cfg``'s. The model's
    ``weights_source`` records the file's name and SHA-256.
    """
    state, meta = read_state_dict(path)
    if cfg is not None:
        cfg = resolve_config(cfg)
    else:
        if CONFIG_METADATA_KEY not in meta:
            raise ValueError(
                f"{str(path)!r} carries no vit-fast config (a plain timm or Hugging Face state dict): give its "
                "config, a preset name such as 'vit_base_patch16_224' or a config.json "
                "(Python: load_model(..., config=...), or load_checkpoint(..., cfg=...); "
                f"command line: --config ...); presets: {', '.join(sorted(PRESETS))}"
            )
        cfg = ViTConfig.from_dict(json.loads(meta[CONFIG_METADATA_KEY]))
    layout = "timm"
    if _looks_hf(list(state)):
        state = convert_hf_state_dict(state)
        layout = "hf"
    src_grid = None
    if "pos_embed" in state:
        keep = 0 if cfg.no_embed_class else cfg.num_prefix_tokens
        if state["pos_embed"].shape[1] != cfg.pos_embed_len:
            src_grid = _grid_from_pos_embed(state["pos_embed"], keep)
    model = _load_converted(cfg, state, repr(str(path)), src_grid).set_backend(backend)
    model.weights_source = {"kind": "file", "file": Path(path).name, "sha256": file_sha256(path), "layout": layout}
    if NORMALIZATION_METADATA_KEY in meta:
        try:
            norm = json.loads(meta[NORMALIZATION_METADATA_KEY])
            model.set_input_normalization(norm["mean"], norm["std"])
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(
                f"{str(path)!r}: its input normalisation ({NORMALIZATION_METADATA_KEY}) cannot be read ({err}); "
                "re-save the model with save_checkpoint"
            ) from None
    return model
