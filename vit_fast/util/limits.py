"""How large a model or a batch may be, checked from a config's numbers alone before anything is built or allocated:
:data:`CEILINGS` (the largest value of each size field, far beyond every published ViT) and
:func:`check_model_fits` / :func:`check_batch_fits` (the bytes against :func:`available_bytes`). Every refusal is a
ValueError naming where the numbers came from and the field(s) to fix. Details: docs/development.md, "Size limits"."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

#: field -> (ceiling, why no real model comes near it)
CEILINGS: dict[str, tuple[int, str]] = {
    "depth": (1024, "the deepest published ViTs have 48 blocks; each block is built in Python, 20000 take minutes"),
    "embed_dim": (65536, "the widest published ViT, ViT-22B, has 6144"),
    "mlp_hidden_dim": (262144, "ViT-22B's MLP has 24576 units"),
    "img_size": (65536, "pixels a side"),
    "patch_size": (65536, "pixels a side, as the image"),
    "num_heads": (65536, "at most one head per channel of embed_dim"),
    "in_chans": (4096, "hyperspectral images have a few hundred channels"),
    "reg_tokens": (1024, "published models have up to 16 register tokens"),
    "num_classes": (2**24, "ImageNet-21k has 21843 classes"),
}


def number_text(value: Any) -> str:
    """``repr(value)``, except for an int too long to print whole (Python refuses past 4300 digits): its length."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value).bit_length() > 128:
        digits = int(abs(value).bit_length() * 0.30103) + 1
        return f"{'a negative' if value < 0 else 'an'} integer of about {digits} digits"
    return repr(value)


def above_ceiling(key: str, value: Any) -> str | None:
    """``"is 20000, above the largest vit-fast builds (1024; why)"`` when ``value`` is an int above the ceiling
    of the :data:`CEILINGS` field ``key``; None when it is not (the caller names the file and the field)."""
    ceiling, why = CEILINGS[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= ceiling:
        return None
    return f"is {number_text(value)}, above the largest vit-fast builds ({ceiling}; {why})"


# --------------------------------------------------------------------------- memory available here
def _meminfo_bytes() -> int | None:
    """MemAvailable + SwapFree from /proc/meminfo (Linux), in bytes; None where there is none."""
    try:
        with open("/proc/meminfo") as f:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:2]}
    except (OSError, ValueError, IndexError):
        return None
    if "MemAvailable" not in fields:
        return None
    return fields["MemAvailable"] + fields.get("SwapFree", 0)


def _cgroup_room() -> int | None:
    """What this process's cgroup (v2) still lets it take: ``memory.max - memory.current``; None without a limit."""
    try:
        with open("/proc/self/cgroup") as f:
            path = next((line.strip().split(":", 2)[2] for line in f if line.startswith("0::")), None)
        if path is None:
            return None
        folder = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
        with open(os.path.join(folder, "memory.max")) as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open(os.path.join(folder, "memory.current")) as f:
            return max(0, int(limit) - int(f.read().strip()))
    except (OSError, ValueError, StopIteration):
        return None


def available_bytes() -> int | None:
    """Bytes of memory a new allocation can take here: available RAM plus free swap (Linux's MemAvailable +
    SwapFree; elsewhere the free physical pages), capped by this process's cgroup limit; None where unknown."""
    found = _meminfo_bytes()
    if found is None:
        try:
            found = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            found = None
    room = _cgroup_room()
    if room is not None:
        found = room if found is None else min(found, room)
    return found


def size_text(n: int | float) -> str:
    """Bytes as people read them: ``40.0 GB``, ``812.3 MB`` (decimal units, as memory is sold)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{int(n)} bytes"


# --------------------------------------------------------------------------- a model's parameters
def parameter_parts(cfg: Any) -> dict[str, int]:
    """The parameters of :class:`~vit_fast.model.vit.VisionTransformer` for ``cfg``, by part (exact counts: the model
    holds their sum), from the config's numbers alone."""
    d, h, c = cfg.embed_dim, cfg.mlp_hidden_dim, cfg.num_classes
    block = 2 * d + 3 * d * d + (3 * d if cfg.qkv_bias else 0) + d * d + d  # norm1, qkv, proj
    block += 2 * d + d * h + h + h * d + d  # norm2, fc1, fc2
    block += 2 * d if cfg.init_values else 0  # ls1, ls2
    patch = cfg.in_chans * cfg.patch_size**2 * d + (2 * d if cfg.pre_norm else d)  # the conv's bias, or norm_pre
    return {
        "blocks": cfg.depth * block,
        "position embedding": cfg.pos_embed_len * d + cfg.num_prefix_tokens * d,
        "patch embedding": patch,
        "head": (d * c + c if c else 0) + 2 * d,  # and the final norm (norm or fc_norm)
    }


#: the config attributes each part of :func:`parameter_parts` grows with
_PART_FIELDS = {
    "blocks": ("depth", "embed_dim", "mlp_hidden_dim"),
    "position embedding": ("img_size", "patch_size", "embed_dim"),
    "patch embedding": ("in_chans", "patch_size", "embed_dim"),
    "head": ("num_classes", "embed_dim"),
}


def parameter_count(cfg: Any) -> int:
    """The number of parameters of the model ``cfg`` describes."""
    return sum(parameter_parts(cfg).values())


def check_model_fits(
    cfg: Any,
    source: str = "ViTConfig",
    element_size: int = 4,
    names: Mapping[str, str] | None = None,
    available: int | None = None,
) -> None:
    """Raise ValueError when the parameters of the model ``cfg`` describes, at ``element_size`` bytes each, need
    more memory than is available here (``available``, else :func:`available_bytes`; nothing is checked when
    that is unknown). The message names ``source``, the part that holds most of them and its fields (``names``
    maps ViTConfig's field names to the file's own, e.g. a Hugging Face config's ``hidden_size``)."""
    available = available_bytes() if available is None else available
    if available is None:
        return
    parts = parameter_parts(cfg)
    need = sum(parts.values()) * element_size
    if need <= available:
        return
    part = max(parts, key=parts.__getitem__)
    names = {"mlp_hidden_dim": "mlp_ratio", **(names or {})}
    fields = [names.get(f, f) for f in _PART_FIELDS[part]]
    values = ", ".join(
        f"{n}={cfg.mlp_ratio if n == 'mlp_ratio' else getattr(cfg, f)}"
        for n, f in zip(fields, _PART_FIELDS[part], strict=True)
    )
    raise ValueError(
        f"{source}: the model has {sum(parts.values()):,} parameters, {size_text(need)} at {element_size} bytes "
        f"each, more than the {size_text(available)} of memory available here; most are in its {part} ({values}): "
        f"fix {', '.join(fields[:-1])} or {fields[-1]}"
    )


# --------------------------------------------------------------------------- a forward's inputs and activations
def forward_bytes(cfg: Any, batch: int, height: int, width: int, element_size: int) -> int:
    """A lower bound on the bytes one eager forward of ``batch`` images of ``height`` x ``width`` pixels holds at
    once: the images, and inside a block its input, q/k/v, the attention scores of every head and the MLP's hidden
    units (the plain PyTorch path forms each)."""
    tokens = (height // cfg.patch_size) * (width // cfg.patch_size) + cfg.num_prefix_tokens
    per_image = cfg.in_chans * height * width + tokens * (4 * cfg.embed_dim + cfg.mlp_hidden_dim)
    per_image += cfg.num_heads * tokens * tokens
    return batch * per_image * element_size


def check_batch_fits(
    cfg: Any,
    batch: int,
    height: int,
    width: int,
    element_size: int,
    what: str,
    fix: str,
    available: int | None = None,
) -> None:
    """Raise ValueError when :func:`forward_bytes` for ``batch`` needs more than the memory available here
    (nothing is checked where that is unknown); ``what`` says where the batch came from and what runs it,
    ``fix`` what to give instead."""
    available = available_bytes() if available is None else available
    if available is None:
        return
    need = forward_bytes(cfg, batch, height, width, element_size)
    if need > available:
        raise ValueError(
            f"{what}: batch {batch} of {height}x{width} images needs at least {size_text(need)}, more than the "
            f"{size_text(available)} of memory available here: {fix}"
        )
