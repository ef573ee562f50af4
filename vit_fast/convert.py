"""Weights from elsewhere: Hugging Face and timm models, safetensors and .pth checkpoints.

Every foreign layout is converted here, in one place; each tensor's shape is checked against
the target model and any key that does not fit is named.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .config import PRESETS, ViTConfig
from .files import finish_atomic
from .model import VisionTransformer
from .pos_embed import resample_pos_embed

CONFIG_METADATA_KEY = "vit_fast_config"


# --------------------------------------------------------------------------- shared loading
def _load_converted(
    cfg: ViTConfig, state: Mapping[str, torch.Tensor], source: str, src_grid: tuple[int, int] | None = None
) -> VisionTransformer:
    """Build a model for ``cfg`` and load a state dict already in timm names, checking every key.

    A position embedding made for another grid (``src_grid``) is resampled bicubically.
    """
    with torch.device("meta"):  # shapes only: the weights come from ``state``, no throwaway random init
        model = VisionTransformer(cfg, backend="auto")
    state = dict(state)
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
            parts.append(f"missing keys: {missing}")
        if unexpected:
            parts.append(f"unexpected keys: {unexpected}")
        if wrong:
            parts.append("wrong shapes: " + "; ".join(wrong))
        raise ValueError(f"weights from {source} do not fit ViTConfig({cfg}): " + " | ".join(parts))
    dtype = state["pos_embed"].dtype
    # copies (never the caller's tensors), in one dtype, assigned in place of the meta parameters
    state = {k: v.detach().to(dtype=dtype, copy=True) for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    return model


def _grid_from_pos_embed(pos_embed: torch.Tensor, num_prefix: int) -> tuple[int, int] | None:
    """The square patch grid a position embedding was made for, or None when it is not square
    (then the shape check names the mismatch)."""
    n = pos_embed.shape[1] - num_prefix
    side = int(round(max(n, 0) ** 0.5))
    return (side, side) if n > 0 and side * side == n else None


# --------------------------------------------------------------------------- Hugging Face
_HF_ACTS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh"}

# transformers 5.x and 4.x names inside one layer, mapped to timm's; q/k/v are fused separately.
_HF_LAYER_MAP = {
    "layernorm_before": "norm1",
    "layernorm_after": "norm2",
    "attention.o_proj": "attn.proj",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
    "attention.output.dense": "attn.proj",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2",
}
_HF_QKV = {
    "attention.q_proj": "q",
    "attention.k_proj": "k",
    "attention.v_proj": "v",
    "attention.attention.query": "q",
    "attention.attention.key": "k",
    "attention.attention.value": "v",
}
_HF_LAYER_RE = re.compile(r"^(?:encoder\.layer|layers)\.(\d+)\.(.+)\.(weight|bias)$")


def hf_config_to_vit(hf_config: Any, num_classes: int) -> ViTConfig:
    """A :class:`ViTConfig` from a transformers ``ViTConfig``."""
    act = getattr(hf_config, "hidden_act", "gelu")
    if act not in _HF_ACTS:
        raise ValueError(f"hidden_act {act!r} is not supported; supported: {sorted(_HF_ACTS)}")
    if hf_config.intermediate_size % hf_config.hidden_size:
        mlp_ratio = hf_config.intermediate_size / hf_config.hidden_size
    else:
        mlp_ratio = float(hf_config.intermediate_size // hf_config.hidden_size)
    return ViTConfig(
        img_size=hf_config.image_size,
        patch_size=hf_config.patch_size,
        in_chans=hf_config.num_channels,
        embed_dim=hf_config.hidden_size,
        depth=hf_config.num_hidden_layers,
        num_heads=hf_config.num_attention_heads,
        mlp_ratio=mlp_ratio,
        qkv_bias=bool(getattr(hf_config, "qkv_bias", True)),
        class_token=True,
        global_pool="token",
        num_classes=num_classes,
        layer_norm_eps=hf_config.layer_norm_eps,
        act=_HF_ACTS[act],
    )


def convert_hf_state_dict(state: Mapping[str, torch.Tensor], depth: int | None = None) -> dict[str, torch.Tensor]:
    """Rename a transformers ViT state dict (4.x or 5.x names) to timm's, fusing q, k, v into qkv.

    Keys with a ``vit.`` prefix (``ViTForImageClassification``) and without (``ViTModel``) both
    work. The pooler (dense + tanh on the class token) has no timm counterpart and is dropped.
    """
    out: dict[str, torch.Tensor] = {}
    qkv: dict[int, dict[str, dict[str, torch.Tensor]]] = {}
    unknown = []
    for key, value in state.items():
        k = key[4:] if key.startswith("vit.") else key
        if k.startswith("pooler."):
            continue
        if k == "embeddings.cls_token":
            out["cls_token"] = value
        elif k == "embeddings.position_embeddings":
            out["pos_embed"] = value
        elif k.startswith("embeddings.patch_embeddings.projection."):
            out["patch_embed.proj." + k.rsplit(".", 1)[1]] = value
        elif k.startswith("layernorm."):
            out["norm." + k.rsplit(".", 1)[1]] = value
        elif k.startswith("classifier."):
            out["head." + k.rsplit(".", 1)[1]] = value
        elif m := _HF_LAYER_RE.match(k):
            idx, inner, kind = int(m.group(1)), m.group(2), m.group(3)
            if inner in _HF_LAYER_MAP:
                out[f"blocks.{idx}.{_HF_LAYER_MAP[inner]}.{kind}"] = value
            elif inner in _HF_QKV:
                qkv.setdefault(idx, {}).setdefault(kind, {})[_HF_QKV[inner]] = value
            else:
                unknown.append(key)
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(f"Hugging Face ViT keys with no vit-fast counterpart: {unknown}")
    for idx, kinds in qkv.items():
        for kind, parts in kinds.items():
            if set(parts) != {"q", "k", "v"}:
                raise ValueError(f"layer {idx}: {kind} of {sorted(set('qkv') - set(parts))} missing")
            shapes = {n: tuple(t.shape) for n, t in parts.items()}
            if len(set(shapes.values())) != 1:
                raise ValueError(f"layer {idx}: q/k/v {kind} shapes differ: {shapes}")
            out[f"blocks.{idx}.attn.qkv.{kind}"] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    return out


def from_hf(
    hf_model: nn.Module, backend: str = "auto", img_size: int | tuple[int, int] | None = None
) -> VisionTransformer:
    """Convert a transformers ``ViTModel`` or ``ViTForImageClassification``.

    ``img_size`` builds the model for another image size; the position embedding is then
    resampled bicubically, as timm does.

    The result keeps the source's device and dtype. ``forward_features`` equals the source's
    ``last_hidden_state``; for ``ViTForImageClassification``, ``forward`` equals its logits.
    ``ViTModel``'s optional pooler (dense + tanh) is not part of a timm ViT and is not converted:
    the converted model returns the normalised class token (``num_classes=0``).
    """
    name = type(hf_model).__name__
    if name not in ("ViTModel", "ViTForImageClassification"):
        raise TypeError(
            f"from_hf supports transformers ViTModel and ViTForImageClassification, got {name}"
            + (" (DeiT's distillation token has no vit-fast counterpart)" if "DeiT" in name else "")
        )
    hf_config = hf_model.config
    num_classes = hf_config.num_labels if name == "ViTForImageClassification" else 0
    cfg = hf_config_to_vit(hf_config, num_classes)
    src_grid = cfg.grid_size
    if img_size is not None:
        cfg = cfg.replace(img_size=img_size)
    state = {k: v for k, v in hf_model.state_dict().items() if not k.endswith("mask_token")}
    model = _load_converted(cfg, convert_hf_state_dict(state), f"{name} state_dict", src_grid)
    ref = next(hf_model.parameters())
    return model.to(device=ref.device).set_backend(backend)


# --------------------------------------------------------------------------- timm
def timm_config(timm_model: nn.Module) -> ViTConfig:
    """Read a :class:`ViTConfig` off a timm ``VisionTransformer`` (features we lack are named)."""
    m = timm_model
    blocks = list(m.blocks)
    if not blocks:
        raise ValueError("timm model has no blocks")
    b0 = blocks[0]
    unsupported = []
    if getattr(m, "attn_pool", None) is not None:
        unsupported.append("attention pooling (global_pool='map')")
    if m.global_pool not in ("token", "avg"):
        unsupported.append(f"global_pool={m.global_pool!r}")
    for attr in ("q_norm", "k_norm", "norm"):
        mod = getattr(b0.attn, attr, None)
        if mod is not None and not isinstance(mod, nn.Identity):
            unsupported.append(f"attn.{attr} ({type(mod).__name__})")
    if not isinstance(getattr(b0.mlp, "norm", nn.Identity()), nn.Identity):
        unsupported.append("mlp.norm (scale_mlp_norm)")
    if not hasattr(b0.mlp, "fc1"):
        unsupported.append(f"MLP {type(b0.mlp).__name__} (gated MLPs such as SwiGLU)")
    if type(b0).__name__ != "Block":
        unsupported.append(f"block type {type(b0).__name__}")
    act = getattr(b0.mlp, "act", None)
    if not isinstance(act, nn.GELU):
        unsupported.append(f"activation {type(act).__name__}")
    if unsupported:
        raise ValueError(f"timm model {type(m).__name__} uses features vit-fast does not support: {unsupported}")
    proj = m.patch_embed.proj
    norm = b0.norm1
    img_size = tuple(m.patch_embed.img_size)
    return ViTConfig(
        img_size=img_size,
        patch_size=proj.kernel_size[0],
        in_chans=proj.in_channels,
        embed_dim=m.embed_dim,
        depth=len(blocks),
        num_heads=b0.attn.num_heads,
        mlp_ratio=b0.mlp.fc1.out_features / m.embed_dim,
        qkv_bias=b0.attn.qkv.bias is not None,
        class_token=m.cls_token is not None,
        reg_tokens=getattr(m, "num_reg_tokens", 0),
        global_pool=m.global_pool,
        num_classes=m.num_classes,
        layer_norm_eps=norm.eps,
        init_values=float(b0.ls1.gamma.flatten()[0]) if hasattr(b0.ls1, "gamma") else None,
        pre_norm=not isinstance(m.norm_pre, nn.Identity),
        fc_norm=not isinstance(m.fc_norm, nn.Identity),
        act="gelu_tanh" if act.approximate == "tanh" else "gelu",
        dynamic_img_size=bool(getattr(m, "dynamic_img_size", False)),
        no_embed_class=bool(getattr(m, "no_embed_class", False)),
    )


def from_timm(
    timm_model: nn.Module, backend: str = "auto", img_size: int | tuple[int, int] | None = None
) -> VisionTransformer:
    """Convert a timm ``VisionTransformer`` (ViT, DeiT without distillation, register models).

    ``img_size`` builds the model for another image size; the position embedding is then
    resampled bicubically, as timm does.
    """
    cfg = timm_config(timm_model)
    src_grid = cfg.grid_size
    if img_size is not None:
        cfg = cfg.replace(img_size=img_size)
    state = dict(timm_model.state_dict())
    model = _load_converted(cfg, state, f"timm {type(timm_model).__name__} state_dict", src_grid)
    ref = next(timm_model.parameters())
    return model.to(device=ref.device).set_backend(backend)


# --------------------------------------------------------------------------- any model
def optimize(model: nn.Module, backend: str = "auto") -> VisionTransformer:
    """Any supported ViT (ours, timm, Hugging Face) as a :class:`VisionTransformer` on the same
    device and dtype, with the given backend (``"auto"``: our kernels on CUDA).

    timm and Hugging Face models are converted into a new module; one of ours is returned as it
    is, with its backend set to ``backend``."""
    if isinstance(model, VisionTransformer):
        return model.set_backend(backend)
    module = type(model).__module__
    if module.startswith("transformers."):
        out = from_hf(model, backend=backend)
    elif module.startswith("timm."):
        out = from_timm(model, backend=backend)
    else:
        raise TypeError(
            f"optimize() does not know {type(model).__module__}.{type(model).__name__}: "
            "it takes vit_fast, timm VisionTransformer and transformers ViT models"
        )
    out.train(model.training)
    return out


# --------------------------------------------------------------------------- checkpoints
def _looks_hf(keys: list[str]) -> bool:
    return any(k.startswith(("vit.", "embeddings.", "encoder.layer.", "layers.")) for k in keys)


def save_checkpoint(model: VisionTransformer, path: str | os.PathLike, extra: Mapping[str, str] | None = None) -> Path:
    """Write the weights as safetensors with the config in the file's metadata (atomically)."""
    from safetensors.torch import save_file

    path = Path(path)
    meta = {CONFIG_METADATA_KEY: model.cfg.to_json(), **(extra or {})}
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        save_file({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}, str(tmp), meta)
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
            for key in ("state_dict", "model", "module"):
                if isinstance(obj.get(key), Mapping):
                    obj = obj[key]
                    break
        if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise ValueError(f"{str(path)!r} does not hold a state dict of tensors")
        return dict(obj), meta
    raise ValueError(f"unsupported checkpoint type {suffix!r} for {str(path)!r}: use .safetensors (preferred) or .pth")


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
    if Path(spec).suffix.lower() in (".safetensors", ".pth", ".pt", ".bin", ".ckpt") or Path(spec).is_file():
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
