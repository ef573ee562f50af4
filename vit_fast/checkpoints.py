"""Checkpoint files: ``save_checkpoint`` / ``load_checkpoint`` / ``read_state_dict``.

``.safetensors`` (preferred) keeps the config in the file's metadata; ``.pth`` / ``.pt`` hold
``{"state_dict": ..., "config": {...}}`` written with ``torch.save`` and are read back with
``weights_only=True``. Foreign key layouts (Hugging Face) are converted by ``vit_fast.convert``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch

from .config import PRESETS, ViTConfig
from .convert import _grid_from_pos_embed, _load_converted, convert_hf_state_dict
from .files import finish_atomic
from .model import VisionTransformer

CONFIG_METADATA_KEY = "vit_fast_config"
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


def load_checkpoint(
    path: str | os.PathLike, cfg: ViTConfig | str | None = None, backend: str = "auto"
) -> VisionTransformer:
    """A :class:`VisionTransformer` from a checkpoint in timm or Hugging Face names.

    The config comes from ``cfg`` (a :class:`ViTConfig` or preset name) or else from the
    file's metadata as written by :func:`save_checkpoint`. A position embedding saved for
    another image size is resampled to ``cfg``'s.
    """
    state, meta = read_state_dict(path)
    if isinstance(cfg, str):
        cfg = ViTConfig.from_name(cfg)
    if cfg is None:
        if CONFIG_METADATA_KEY not in meta:
            raise ValueError(
                f"{str(path)!r} carries no vit-fast config: pass cfg= (a ViTConfig or a preset name such as "
                f"'vit_base_patch16_224'); presets: {', '.join(sorted(PRESETS))}"
            )
        cfg = ViTConfig.from_dict(json.loads(meta[CONFIG_METADATA_KEY]))
    if _looks_hf(list(state)):
        state = convert_hf_state_dict(state)
    src_grid = None
    if "pos_embed" in state:
        keep = 0 if cfg.no_embed_class else cfg.num_prefix_tokens
        if state["pos_embed"].shape[1] != cfg.pos_embed_len:
            src_grid = _grid_from_pos_embed(state["pos_embed"], keep)
    return _load_converted(cfg, state, repr(str(path)), src_grid).set_backend(backend)
