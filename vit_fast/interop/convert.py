"""Weights from elsewhere: Hugging Face and timm models converted to a :class:`VisionTransformer`.

Every foreign layout is converted in this one place; each tensor's shape is checked against the target model and
any key that does not fit is named (the loading itself: ``vit_fast.interop.weights``; checkpoint files:
``vit_fast.interop.checkpoints``; model names: ``vit_fast.interop.loading``)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from vit_fast.interop.weights import load_converted
from vit_fast.model.config import HF_ACTIVATIONS, ViTConfig
from vit_fast.model.vit import VisionTransformer

# --------------------------------------------------------------------------- Hugging Face
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


#: the size keys of a Hugging Face ViT config, each an int >= 1
_HF_SIZE_KEYS = (
    "image_size",
    "patch_size",
    "num_channels",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
)


def hf_config_to_vit(hf_config: Any, num_classes: int) -> ViTConfig:
    """A :class:`ViTConfig` from a transformers ``ViTConfig``; a wrong value is named by the Hugging Face key that
    holds it (``intermediate_size``), never by the ViTConfig field it would become."""
    act = getattr(hf_config, "hidden_act", "gelu")
    if act not in HF_ACTIVATIONS:
        raise ValueError(f"hidden_act {act!r} is not supported; supported: {sorted(HF_ACTIVATIONS)}")
    for key in _HF_SIZE_KEYS:
        value = getattr(hf_config, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{key} must be an int >= 1, got {value!r}")
    if hf_config.hidden_size % hf_config.num_attention_heads:
        raise ValueError(
            f"hidden_size {hf_config.hidden_size} is not divisible by num_attention_heads "
            f"{hf_config.num_attention_heads}"
        )
    if hf_config.image_size % hf_config.patch_size:
        raise ValueError(f"image_size {hf_config.image_size} is not divisible by patch_size {hf_config.patch_size}")
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
        act=HF_ACTIVATIONS[act],
    )


_QKV_PART = {"q": 0, "k": 1, "v": 2}


def _ours_of_hf(key: str) -> tuple[str, str | None] | None:
    """Where the transformers ViT key ``key`` lives in a timm-named state dict: ``(our key, None)``, or
    ``(blocks.N.attn.qkv.KIND, "q" | "k" | "v")`` for the parts fused into qkv; None for the pooler (no timm
    counterpart). A ValueError for a key with no counterpart."""
    k = key[4:] if key.startswith("vit.") else key
    if k.startswith("pooler."):
        return None
    fixed = {"embeddings.cls_token": "cls_token", "embeddings.position_embeddings": "pos_embed"}
    if k in fixed:
        return fixed[k], None
    for prefix, ours in (
        ("embeddings.patch_embeddings.projection.", "patch_embed.proj."),
        ("layernorm.", "norm."),
        ("classifier.", "head."),
    ):
        if k.startswith(prefix):
            return ours + k.rsplit(".", 1)[1], None
    if m := _HF_LAYER_RE.match(k):
        idx, inner, kind = int(m.group(1)), m.group(2), m.group(3)
        if inner in _HF_LAYER_MAP:
            return f"blocks.{idx}.{_HF_LAYER_MAP[inner]}.{kind}", None
        if inner in _HF_QKV:
            return f"blocks.{idx}.attn.qkv.{kind}", _HF_QKV[inner]
    raise ValueError(key)


def convert_hf_state_dict(state: Mapping[str, torch.Tensor], depth: int | None = None) -> dict[str, torch.Tensor]:
    """Rename a transformers ViT state dict (4.x or 5.x names) to timm's, fusing q, k, v into qkv.

    Keys with a ``vit.`` prefix (``ViTForImageClassification``) and without (``ViTModel``) both
    work. The pooler (dense + tanh on the class token) has no timm counterpart and is dropped.
    """
    out: dict[str, torch.Tensor] = {}
    qkv: dict[str, dict[str, torch.Tensor]] = {}
    unknown = []
    for key, value in state.items():
        try:
            target = _ours_of_hf(key)
        except ValueError:
            unknown.append(key)
            continue
        if target is None:
            continue
        ours, part = target
        if part is None:
            out[ours] = value
        else:
            qkv.setdefault(ours, {})[part] = value
    if unknown:
        raise ValueError(f"Hugging Face ViT keys with no vit-fast counterpart: {unknown}")
    for ours, parts in qkv.items():
        layer, kind = ours.split(".")[1], ours.rsplit(".", 1)[1]
        if set(parts) != {"q", "k", "v"}:
            raise ValueError(f"layer {layer}: {kind} of {sorted(set('qkv') - set(parts))} missing")
        shapes = {n: tuple(t.shape) for n, t in parts.items()}
        if len(set(shapes.values())) != 1:
            raise ValueError(f"layer {layer}: q/k/v {kind} shapes differ: {shapes}")
        dtypes = {n: str(t.dtype).removeprefix("torch.") for n, t in parts.items()}
        if len(set(dtypes.values())) != 1:  # torch.cat would promote them to one silently
            raise ValueError(
                f"layer {layer}: q/k/v {kind} dtypes differ: {dtypes}; vit-fast builds a model in one dtype: cast "
                "every tensor to one dtype and save the weights again"
            )
        out[ours] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    return out


def hf_state_dict(state: Mapping[str, torch.Tensor], hf_keys: Iterable[str]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`convert_hf_state_dict`: a timm-named ``state`` (ours) under the transformers ViT names
    ``hf_keys`` (a transformers model's own ``state_dict().keys()``: 4.x or 5.x names, ``vit.`` prefix or not), q,
    k and v cut from qkv. A ValueError names a key with no counterpart in ``state``."""
    out: dict[str, torch.Tensor] = {}
    for key in hf_keys:
        try:
            target = _ours_of_hf(key)
        except ValueError:
            target = None
        if target is None or target[0] not in state:
            raise ValueError(f"transformers key {key!r} has no counterpart in this vit-fast state dict")
        ours, part = target
        out[key] = state[ours] if part is None else state[ours].chunk(3, dim=0)[_QKV_PART[part]]
    return out


def from_hf(
    hf_model: nn.Module, backend: str = "auto", img_size: int | tuple[int, int] | None = None
) -> VisionTransformer:
    """Convert a transformers ``ViTModel`` or ``ViTForImageClassification``, keeping its device and dtype. ``img_size``
    builds the model for another image size (the position embedding resampled bicubically, as timm does).
    ``forward_features`` equals the source's ``last_hidden_state``; for ``ViTForImageClassification``, ``forward``
    equals its logits. ``ViTModel``'s optional pooler (dense + tanh) is not part of a timm ViT and is not converted: the
    result returns the normalised class token (``num_classes=0``)."""
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
    try:
        converted = convert_hf_state_dict(state)
    except ValueError as err:
        raise ValueError(f"weights from {name} state_dict: {err}") from None
    model = load_converted(cfg, converted, f"{name} state_dict", src_grid)
    model.weights_source = {"kind": "hf", "name": getattr(hf_config, "_name_or_path", "") or name}
    ref = next(hf_model.parameters())
    return model.to(device=ref.device).set_backend(backend)


# --------------------------------------------------------------------------- timm
#: timm LayerScale's default initial gamma; a converted model's gammas come from its weights
TIMM_LAYER_SCALE_INIT = 1e-5


def _is_identity(module: Any) -> bool:
    return module is None or isinstance(module, nn.Identity)


def _timm_activation(act: Any) -> str | None:
    """Our name for a timm block's activation module, or None when we do not run it."""
    if isinstance(act, nn.GELU):
        return "gelu_tanh" if act.approximate == "tanh" else "gelu"
    names = {"GELU": "gelu", "GELUTanh": "gelu_tanh", "QuickGELU": "quick_gelu", "SiLU": "silu"}
    if type(act).__name__ in names and (isinstance(act, nn.SiLU) or type(act).__module__.startswith("timm.")):
        return names[type(act).__name__]
    return None


def _timm_unsupported(m: nn.Module) -> list[str]:
    """The timm features this model uses that vit-fast does not implement, by name (empty: convertible)."""
    out: list[str] = []
    name = type(m).__name__
    if name != "VisionTransformer":
        out.append(f"model class {name} (vit-fast converts timm's VisionTransformer)")
    blocks = list(getattr(m, "blocks", []) or [])
    if not blocks:
        return [*out, "no transformer blocks (model.blocks is missing or empty)"]
    block_types = sorted({type(b).__name__ for b in blocks})
    if block_types != ["Block"]:
        return [*out, f"block type {', '.join(block_types)} (vit-fast runs timm's plain Block; no parallel blocks)"]
    if getattr(m, "attn_pool", None) is not None:
        out.append("attention pooling (global_pool='map')")
    if getattr(m, "global_pool", None) not in ("token", "avg"):
        out.append(f"global_pool={getattr(m, 'global_pool', None)!r}")
    if getattr(m, "pos_embed", None) is None:
        out.append("no position embedding (pos_embed_type='none' or rope)")
    if getattr(m, "dist_token", None) is not None:
        out.append("distillation token")
    patch = getattr(m, "patch_embed", None)
    if type(patch).__name__ == "HybridEmbed":
        out.append("hybrid patch embedding HybridEmbed (a CNN backbone before the patch projection)")
    elif patch is None or not isinstance(getattr(patch, "proj", None), nn.Conv2d):
        out.append(f"patch embedding {type(patch).__name__} (vit-fast takes a Conv2d patch projection)")
    else:
        if not _is_identity(getattr(patch, "norm", None)):
            out.append("a norm after the patch embedding (embed_norm_layer)")
        if getattr(patch, "dynamic_img_pad", False):
            out.append("dynamic_img_pad")
        k, st = patch.proj.kernel_size, patch.proj.stride
        if k[0] != k[1] or tuple(k) != tuple(st):
            out.append(
                f"patch projection kernel {tuple(k)} / stride {tuple(st)} (vit-fast takes square, non-overlapping)"
            )
    if not _is_identity(getattr(m, "norm", None)) and not isinstance(m.norm, nn.LayerNorm):
        out.append(f"final norm {type(m.norm).__name__}")
    if _is_identity(getattr(m, "norm", None)) and _is_identity(getattr(m, "fc_norm", None)):
        out.append("no final norm (final_norm=False)")
    for i, b in enumerate(blocks):
        where = f"blocks.{i}"
        for norm in ("norm1", "norm2"):
            if not isinstance(getattr(b, norm, None), nn.LayerNorm):
                out.append(f"{where}.{norm} {type(getattr(b, norm, None)).__name__} (vit-fast takes LayerNorm)")
        attn, mlp = getattr(b, "attn", None), getattr(b, "mlp", None)
        if attn is None or not isinstance(getattr(attn, "qkv", None), nn.Linear):
            out.append(f"{where}.attn {type(attn).__name__} without a fused qkv Linear")
        else:
            for attr in ("q_norm", "k_norm", "norm"):
                if not _is_identity(getattr(attn, attr, None)):
                    out.append(f"{where}.attn.{attr} ({type(getattr(attn, attr)).__name__})")
            if getattr(attn, "qkv_bias_separate", False):
                out.append(f"{where}.attn qkv_bias_separate")
            if not isinstance(getattr(attn, "proj", None), nn.Linear) or attn.proj.bias is None:
                out.append(f"{where}.attn.proj without bias (proj_bias=False)")
        if mlp is None or not hasattr(mlp, "fc1") or not hasattr(mlp, "fc2"):
            out.append(f"{where}.mlp {type(mlp).__name__} (gated MLPs such as SwiGLU)")
        else:
            if not _is_identity(getattr(mlp, "norm", None)):
                out.append(f"{where}.mlp.norm (scale_mlp_norm)")
            if _timm_activation(getattr(mlp, "act", None)) is None:
                act_name = type(getattr(mlp, "act", None)).__name__
                out.append(f"{where}.mlp activation {act_name} (vit-fast runs GELU, tanh GELU, QuickGELU and SiLU)")
            if getattr(mlp.fc1, "bias", None) is None or getattr(mlp.fc2, "bias", None) is None:
                out.append(f"{where}.mlp without bias")
        for ls in ("ls1", "ls2"):
            mod = getattr(b, ls, None)
            if not _is_identity(mod) and not isinstance(getattr(mod, "gamma", None), torch.Tensor):
                out.append(f"{where}.{ls} {type(mod).__name__}")
        if i == 0:
            continue
        b0 = blocks[0]
        if _is_identity(getattr(b, "ls1", None)) != _is_identity(getattr(b0, "ls1", None)):
            out.append("LayerScale in some blocks only")
    return sorted(set(out), key=out.index)


def timm_config(timm_model: nn.Module) -> ViTConfig:
    """Read a :class:`ViTConfig` off a timm ``VisionTransformer``; a ValueError names every feature we lack."""
    m = timm_model
    unsupported = _timm_unsupported(m)
    if unsupported:
        raise ValueError(
            f"timm model {type(m).__name__} uses features vit-fast does not support: {'; '.join(unsupported)}. "
            "Run it with timm itself, or pick a plain ViT / DeiT / register variant"
        )
    blocks = list(m.blocks)
    b0 = blocks[0]
    proj = m.patch_embed.proj
    act = b0.mlp.act
    has_layer_scale = not _is_identity(getattr(b0, "ls1", None))
    return ViTConfig(
        img_size=tuple(int(v) for v in m.patch_embed.img_size),
        patch_size=int(proj.kernel_size[0]),
        in_chans=int(proj.in_channels),
        embed_dim=int(m.embed_dim),
        depth=len(blocks),
        num_heads=int(b0.attn.num_heads),
        mlp_ratio=b0.mlp.fc1.out_features / m.embed_dim,
        qkv_bias=b0.attn.qkv.bias is not None,
        class_token=m.cls_token is not None,
        reg_tokens=int(getattr(m, "num_reg_tokens", 0)),
        global_pool=m.global_pool,
        num_classes=int(m.num_classes),
        layer_norm_eps=float(b0.norm1.eps),
        # LayerScale's presence is the config's business; its trained per-channel (possibly negative)
        # gammas are weights and load with the state dict
        init_values=TIMM_LAYER_SCALE_INIT if has_layer_scale else None,
        pre_norm=not _is_identity(m.norm_pre),
        fc_norm=not _is_identity(m.fc_norm),
        act=_timm_activation(act),
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
    model = load_converted(cfg, state, f"timm {type(timm_model).__name__} state_dict", src_grid)
    name = getattr(getattr(timm_model, "pretrained_cfg", None) or {}, "get", lambda *_: None)("architecture")
    model.weights_source = {"kind": "timm", "name": name or type(timm_model).__name__}
    source_cfg = getattr(timm_model, "pretrained_cfg", None)
    if source_cfg:  # timm.data.resolve_data_config reads the source's mean, std and crop from here
        model.pretrained_cfg = {**source_cfg, "num_classes": model.cfg.num_classes}
    ref = next(timm_model.parameters())
    return model.to(device=ref.device).set_backend(backend)


# --------------------------------------------------------------------------- any model
def optimize(model: nn.Module, backend: str = "auto") -> nn.Module:
    """Any supported ViT (ours, timm, Hugging Face) as a drop-in on the same device and dtype, with the given backend
    (``"auto"``: our kernels on CUDA). A transformers model comes back as a patched copy, still of its own class
    (:func:`vit_fast.interop.hf_patch.optimize_hf`; ``backend`` "auto" or "triton"; the original is left as it was); a
    timm model as a :class:`VisionTransformer` that behaves as timm's; one of ours as it is, its backend set to
    ``backend``. See docs/usage.md, section "Hugging Face transformers: the drop-in"."""
    if isinstance(model, VisionTransformer):
        return model.set_backend(backend)
    module = type(model).__module__
    if module.startswith("transformers."):
        from vit_fast.interop.hf_patch import optimize_hf

        return optimize_hf(model, backend=backend)  # the user's own class, its layers on our kernels
    elif module.startswith("timm."):
        out = from_timm(model, backend=backend)
    else:
        raise TypeError(
            f"optimize() does not know {type(model).__module__}.{type(model).__name__}: "
            "it takes vit_fast, timm VisionTransformer and transformers ViT models"
        )
    out.train(model.training)
    return out
