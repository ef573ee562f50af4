"""Weights already in our (timm's) names loaded into a :class:`VisionTransformer`: their dtypes checked
(:func:`check_weights`), every key and shape checked against the model, a position embedding saved for another grid
resampled (:func:`load_converted`, :func:`grid_from_pos_embed`). The converters of foreign layouts
(``vit_fast.interop.convert``) and the checkpoint reader (``vit_fast.interop.checkpoints``) end in it."""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from vit_fast.backend.pos_embed import resample_pos_embed
from vit_fast.model.config import ViTConfig
from vit_fast.model.vit import VisionTransformer
from vit_fast.util.limits import check_model_fits

#: the dtypes a model's weights may come in (all of them in one)
WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check_weights(state: Mapping[str, torch.Tensor], source: str) -> None:
    """Refuse weights a model cannot be built from as they are, naming ``source``, the tensor and the fix, instead
    of changing them silently: a tensor that is not floating point (int8, bool: a quantised or damaged file), a mix
    of dtypes (an fp16 ``pos_embed`` beside fp32 weights would make the whole model fp16, or cast the fp16 values
    up without saying so), or a value that is NaN or infinite."""
    wrong = [(key, value.dtype) for key, value in state.items() if value.dtype not in WEIGHT_DTYPES]
    if wrong:
        (key, dtype), more = wrong[0], len(wrong) - 1
        raise ValueError(
            f"weights from {source}: {key} is {str(dtype).removeprefix('torch.')}"
            + (f" (and {more} more tensor{'s' if more > 1 else ''})" if more else "")
            + ", not a floating-point dtype vit-fast builds a model in (float32, float16, bfloat16, float64): a "
            "quantised or damaged checkpoint; dequantise it to floating point (or give the original weights) and "
            "save it again"
        )
    counts: dict[torch.dtype, int] = {}
    for value in state.values():
        counts[value.dtype] = counts.get(value.dtype, 0) + 1
    if len(counts) > 1:
        main = max(counts, key=counts.__getitem__)
        odd = [f"{key} is {str(v.dtype).removeprefix('torch.')}" for key, v in state.items() if v.dtype != main]
        shown = "; ".join(odd[:4]) + (f"; and {len(odd) - 4} more" if len(odd) > 4 else "")
        raise ValueError(
            f"weights from {source} mix dtypes: {shown}, the other {counts[main]} tensors are "
            f"{str(main).removeprefix('torch.')}. vit-fast builds a model in one dtype and does not pick one for "
            "you: cast every tensor to one dtype and save the weights again (a file: safetensors.torch.load_file, "
            "cast, save_file with the same metadata; a model: model.to(dtype) before converting or saving it)"
        )
    for key, value in state.items():
        if value.device.type == "meta" or bool(torch.isfinite(value).all()):
            continue
        nan = int(torch.isnan(value).sum())
        inf = int(torch.isinf(value).sum())
        what = " and ".join(part for part in (f"{nan} NaN" if nan else "", f"{inf} infinite" if inf else "") if part)
        raise ValueError(
            f"weights from {source}: {key} holds {what} value(s) of {value.numel()}: the weights are damaged (or "
            "training diverged) and every output would be NaN; vit-fast loads only finite weights: give another "
            "checkpoint, or an earlier one from the same training"
        )


#: the keys a mismatch message lists by name, per kind (missing, unexpected, wrong shape); the rest are counted
_LISTED_KEYS = 8


def _listed(keys: list[str]) -> str:
    """``keys`` for a message: the first :data:`_LISTED_KEYS` and how many more (a config 1000 blocks too deep
    misses 12000 keys: the line stays readable)."""
    shown = ", ".join(map(repr, keys[:_LISTED_KEYS]))
    return f"[{shown}{f', ... and {len(keys) - _LISTED_KEYS} more' if len(keys) > _LISTED_KEYS else ''}]"


def _check_depth(cfg: ViTConfig, state: Mapping[str, torch.Tensor], source: str, config_source: str) -> None:
    """Refuse, before the model is built, a config whose depth differs from the blocks the weights hold."""
    blocks = {int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k))}
    if blocks and len(blocks) != cfg.depth:
        raise ValueError(
            f"{config_source} says depth {cfg.depth}, but the weights from {source} hold {len(blocks)} blocks "
            f"(blocks.{min(blocks)} to blocks.{max(blocks)}): fix the field 'depth' ('num_hidden_layers' in a Hugging "
            "Face config.json), or give the config these weights were saved with"
        )


def load_converted(
    cfg: ViTConfig,
    state: Mapping[str, torch.Tensor],
    source: str,
    src_grid: tuple[int, int] | None = None,
    config_source: str = "the config",
) -> VisionTransformer:
    """Build a model for ``cfg`` and load a state dict already in timm names, checking every key.

    A position embedding made for another grid (``src_grid``) is resampled bicubically. ``config_source`` says
    where ``cfg`` came from (a file, a checkpoint's metadata), for the message when it does not fit the weights.
    """
    _check_depth(cfg, state, source, config_source)  # before building: 20000 blocks take minutes even on meta
    with torch.device("meta"):  # shapes only: the weights come from ``state``, no throwaway random init
        model = VisionTransformer(cfg, backend="auto")
    state = dict(state)
    given = dict(state)  # before resampling, which would cast an int8 pos_embed through float32 and back
    if "pos_embed" in state and src_grid is not None and tuple(src_grid) != tuple(cfg.grid_size):
        keep = 0 if cfg.no_embed_class else cfg.num_prefix_tokens
        state["pos_embed"] = resample_pos_embed(state["pos_embed"], cfg.grid_size, tuple(src_grid), keep)
    target = model.state_dict()
    missing = sorted(set(target) - set(state))
    unexpected = sorted(set(state) - set(target))
    wrong = [
        f"{k}: {tuple(state[k].shape)} in {source}, {tuple(target[k].shape)} expected"
        for k in sorted(set(state) & set(target))
        if tuple(state[k].shape) != tuple(target[k].shape)
    ]
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing keys: {_listed(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {_listed(unexpected)}")
        if wrong:
            more = f"; ... and {len(wrong) - _LISTED_KEYS} more" if len(wrong) > _LISTED_KEYS else ""
            parts.append("wrong shapes: " + "; ".join(wrong[:_LISTED_KEYS]) + more)
        raise ValueError(f"weights from {source} do not fit {config_source}, {cfg}: " + " | ".join(parts))
    check_weights(given, source)  # one floating-point dtype, finite values: never cast or loaded silently
    dtype = next(iter(given.values())).dtype  # the weights' one dtype
    check_model_fits(cfg, f"{config_source} for the weights from {source}", dtype.itemsize)  # the copies below
    # copies (never the caller's tensors) in the weights' dtype (a resampled pos_embed too), assigned in place of
    # the meta parameters
    state = {k: v.detach().to(dtype=dtype, copy=True) for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    return model


def grid_from_pos_embed(pos_embed: torch.Tensor, num_prefix: int) -> tuple[int, int] | None:
    """The square patch grid a position embedding was made for, or None when it is not square
    (then the shape check names the mismatch)."""
    n = pos_embed.shape[1] - num_prefix
    side = int(round(max(n, 0) ** 0.5))
    return (side, side) if n > 0 and side * side == n else None
