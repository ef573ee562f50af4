"""Model configuration: one dataclass, named presets, and validation with clear messages."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from vit_fast.util.limits import above_ceiling, number_text

_GLOBAL_POOLS = ("token", "avg")
_ACTS = ("gelu", "gelu_tanh", "quick_gelu", "silu")
#: transformers' hidden_act names -> ours (a converted model's ``act``, a patched layer's kernel epilogue)
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh"}
#: ours -> the transformers hidden_act that computes it
HF_ACTIVATION_OF = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}


def _pair(value: int | tuple[int, int] | list[int], name: str) -> tuple[int, int]:
    if _is_int(value):
        return (int(value), int(value))
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(_is_int(v) for v in value):
        return (int(value[0]), int(value[1]))
    shown = f"({', '.join(map(number_text, value))})" if isinstance(value, (tuple, list)) else number_text(value)
    raise ValueError(f"{name} must be an int or a pair of ints (height, width), got {shown}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    try:  # an int too large for a float is no real number here
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    except OverflowError:
        return False


def _type_name(value: Any) -> str:
    return type(value).__name__


def _check_fields(cfg: ViTConfig) -> None:
    """Every constructor field's type and range, each message naming the field and what to pass."""
    for name in ("patch_size", "in_chans", "embed_dim", "depth", "num_heads"):
        value = getattr(cfg, name)
        if not _is_int(value) or value < 1:
            raise ValueError(f"ViTConfig.{name} must be an int >= 1, got {number_text(value)} ({_type_name(value)})")
    for name in ("reg_tokens", "num_classes"):
        value = getattr(cfg, name)
        if not _is_int(value) or value < 0:
            what = " (0 = pooled features)" if name == "num_classes" else ""
            raise ValueError(
                f"ViTConfig.{name} must be an int >= 0{what}, got {number_text(value)} ({_type_name(value)})"
            )
    for name in ("depth", "embed_dim", "num_heads", "patch_size", "in_chans", "reg_tokens", "num_classes"):
        too_large = above_ceiling(name, getattr(cfg, name))
        if too_large:
            raise ValueError(f"ViTConfig.{name} {too_large}")
    for name in ("qkv_bias", "class_token", "pre_norm", "dynamic_img_size", "no_embed_class"):
        value = getattr(cfg, name)
        if not isinstance(value, bool):
            raise ValueError(f"ViTConfig.{name} must be True or False, got {value!r} ({_type_name(value)})")
    if cfg.fc_norm is not None and not isinstance(cfg.fc_norm, bool):
        raise ValueError(f"ViTConfig.fc_norm must be True, False or None (timm's rule), got {cfg.fc_norm!r}")
    if not _is_real(cfg.mlp_ratio) or not cfg.mlp_ratio > 0:
        raise ValueError(
            f"ViTConfig.mlp_ratio must be a number > 0, got {number_text(cfg.mlp_ratio)} ({_type_name(cfg.mlp_ratio)})"
        )
    if int(cfg.embed_dim * cfg.mlp_ratio) < 1:
        raise ValueError(
            f"ViTConfig.mlp_ratio {cfg.mlp_ratio!r} gives an MLP of {int(cfg.embed_dim * cfg.mlp_ratio)} hidden units "
            f"(embed_dim {cfg.embed_dim} x mlp_ratio): use mlp_ratio >= {1 / cfg.embed_dim:.3g}"
        )
    too_large = above_ceiling("mlp_hidden_dim", int(cfg.embed_dim * cfg.mlp_ratio))
    if too_large:
        raise ValueError(
            f"ViTConfig.mlp_ratio {cfg.mlp_ratio!r} gives an MLP whose size (embed_dim x mlp_ratio) {too_large}"
        )
    if not _is_real(cfg.layer_norm_eps) or not cfg.layer_norm_eps > 0:
        raise ValueError(f"ViTConfig.layer_norm_eps must be a number > 0, got {number_text(cfg.layer_norm_eps)}")
    if cfg.init_values is not None and (not _is_real(cfg.init_values) or not cfg.init_values > 0):
        raise ValueError(
            f"ViTConfig.init_values must be None (no LayerScale) or a number > 0 (LayerScale's initial gamma; "
            f"trained gammas come from the weights), got {number_text(cfg.init_values)}"
        )
    for name, choices in (("global_pool", _GLOBAL_POOLS), ("act", _ACTS)):
        value = getattr(cfg, name)
        if value not in choices:
            raise ValueError(f"ViTConfig.{name} must be one of {choices}, got {value!r}")


@dataclass
class ViTConfig:
    """Architecture of a Vision Transformer, in timm's vocabulary. ``img_size`` and ``patch_size`` are pixels (an int
    means a square). ``num_classes=0`` makes the model return pooled features ``[B, embed_dim]``. ``init_values``
    enables LayerScale; ``fc_norm=None`` follows timm (a norm after pooling exactly when ``global_pool == "avg"``).
    ``no_embed_class=True`` means the position embedding covers the patches only, as in timm's register-token models.
    """

    img_size: int | tuple[int, int] = 224
    patch_size: int = 16
    in_chans: int = 3
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    class_token: bool = True
    reg_tokens: int = 0
    global_pool: str = "token"
    num_classes: int = 1000
    layer_norm_eps: float = 1e-6
    init_values: float | None = None
    pre_norm: bool = False
    fc_norm: bool | None = None
    act: str = "gelu"
    dynamic_img_size: bool = False
    no_embed_class: bool = False

    # derived in __post_init__
    grid_size: tuple[int, int] = field(init=False, repr=False)
    num_patches: int = field(init=False, repr=False)
    num_prefix_tokens: int = field(init=False, repr=False)
    num_tokens: int = field(init=False, repr=False)
    head_dim: int = field(init=False, repr=False)
    mlp_hidden_dim: int = field(init=False, repr=False)
    use_fc_norm: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        h, w = _pair(self.img_size, "ViTConfig.img_size")
        self.img_size = h if h == w else (h, w)
        _check_fields(self)
        if h < 1 or w < 1:
            raise ValueError(f"ViTConfig.img_size must be positive, got ({number_text(h)}, {number_text(w)})")
        too_large = above_ceiling("img_size", max(h, w))
        if too_large:
            raise ValueError(f"ViTConfig.img_size: its larger side {too_large}")
        if h % self.patch_size or w % self.patch_size:
            raise ValueError(
                f"img_size {h}x{w} is not divisible by patch_size {self.patch_size}: "
                f"use a multiple of {self.patch_size}, e.g. "
                f"{max(1, round(h / self.patch_size)) * self.patch_size}x"
                f"{max(1, round(w / self.patch_size)) * self.patch_size}"
            )
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads} "
                f"({self.embed_dim} / {self.num_heads} = {self.embed_dim / self.num_heads:.3g}); "
                "every head needs the same whole head_dim"
            )
        if self.global_pool == "token" and not self.class_token:
            raise ValueError(
                "global_pool='token' needs a class token, but class_token=False: "
                "use global_pool='avg' or class_token=True"
            )

        self.grid_size = (h // self.patch_size, w // self.patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.num_prefix_tokens = int(self.class_token) + int(self.reg_tokens)
        self.num_tokens = self.num_patches + self.num_prefix_tokens
        self.head_dim = self.embed_dim // self.num_heads
        self.mlp_hidden_dim = int(self.embed_dim * self.mlp_ratio)
        self.use_fc_norm = self.global_pool == "avg" if self.fc_norm is None else bool(self.fc_norm)

    @property
    def img_hw(self) -> tuple[int, int]:
        """Native image size as (height, width) in pixels."""
        return _pair(self.img_size, "img_size")

    @property
    def pos_embed_len(self) -> int:
        """Rows of the learned position embedding."""
        return self.num_patches if self.no_embed_class else self.num_tokens

    def replace(self, **changes: Any) -> ViTConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The constructor fields only, JSON-ready."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        if isinstance(out["img_size"], tuple):
            out["img_size"] = list(out["img_size"])
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ViTConfig:
        if not isinstance(data, dict):
            raise ValueError(f"a ViTConfig is read from a dict of its fields, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown ViTConfig field(s) {unknown}; known: {sorted(names)}")
        data = dict(data)
        if isinstance(data.get("img_size"), list):
            data["img_size"] = tuple(data["img_size"])
        return cls(**data)

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> ViTConfig:
        """A preset from :data:`PRESETS` by its timm name, with optional field overrides."""
        if name not in PRESETS:
            import difflib

            close = difflib.get_close_matches(name, PRESETS, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise KeyError(f"unknown preset {name!r}.{hint} Known presets: {', '.join(sorted(PRESETS))}")
        return cls(**{**PRESETS[name], **overrides})


def _vit(patch: int, dim: int, depth: int, heads: int, img: int = 224, **extra: Any) -> dict[str, Any]:
    return dict(img_size=img, patch_size=patch, embed_dim=dim, depth=depth, num_heads=heads, **extra)


#: Named architectures, keyed by timm's model names; values are ViTConfig keyword arguments.
PRESETS: dict[str, dict[str, Any]] = {
    "vit_tiny_patch16_224": _vit(16, 192, 12, 3),
    "vit_small_patch16_224": _vit(16, 384, 12, 6),
    "vit_base_patch16_224": _vit(16, 768, 12, 12),
    "vit_large_patch16_224": _vit(16, 1024, 24, 16),
    "vit_huge_patch14_224": _vit(14, 1280, 32, 16),
    "vit_base_patch32_224": _vit(32, 768, 12, 12),
    "vit_base_patch16_384": _vit(16, 768, 12, 12, img=384),
    "deit_tiny_patch16_224": _vit(16, 192, 12, 3),
    "deit_small_patch16_224": _vit(16, 384, 12, 6),
    "deit_base_patch16_224": _vit(16, 768, 12, 12),
    # register tokens, no class token, average pooling (timm's vit_base_patch16_reg4_gap_256)
    "vit_base_patch16_reg4_gap_256": _vit(
        16, 768, 12, 12, img=256, class_token=False, reg_tokens=4, no_embed_class=True, global_pool="avg"
    ),
    # DINOv2 with registers: LayerScale, class + 4 register tokens, pooled features
    "vit_small_patch14_reg4_dinov2": _vit(
        14, 384, 12, 6, img=518, reg_tokens=4, no_embed_class=True, init_values=1e-5, num_classes=0
    ),
}
