"""What an exported graph computes, in one module that export traces and verification runs eagerly:
:class:`ExportGraph` (an optional uint8 preprocessing front, :class:`Normalize`, then the model, returning the
outputs asked for: ``logits``, ``pooled``, ``last_hidden_state``) and :func:`example_images`, the inputs every
caller feeds. Details: docs/development.md, "What a graph computes"."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

OUTPUTS = ("logits", "pooled", "last_hidden_state")
LAYOUTS = ("NCHW", "NHWC")
DEFAULT_INPUT_NAME = "images"


def default_outputs(num_classes: int) -> tuple[str, ...]:
    """``("logits",)`` for a model with a classifier head, ``("pooled",)`` without one."""
    return ("logits",) if num_classes else ("pooled",)


def check_outputs(outputs: Any, num_classes: int) -> tuple[str, ...]:
    """Validate an ``outputs`` request (a name or a sequence of names from :data:`OUTPUTS`, no repeats)."""
    if outputs is None:
        return default_outputs(num_classes)
    items = (outputs,) if isinstance(outputs, str) else tuple(outputs)
    if not items:
        raise ValueError(f"outputs must name at least one of {OUTPUTS}, got {outputs!r}")
    for item in items:
        if item not in OUTPUTS:
            raise ValueError(f"unknown output {item!r}: choose from {', '.join(OUTPUTS)}")
    if len(set(items)) != len(items):
        raise ValueError(f"outputs {items} name one output twice")
    if "logits" in items and not num_classes:
        raise ValueError("this model has no classifier head (num_classes=0), so no 'logits': ask for 'pooled'")
    return items


def check_io_names(input_name: Any, output_names: Any, outputs: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """Validate the graph's input name and output names (default: the output kinds); returns both."""
    names = (
        tuple(outputs)
        if output_names is None
        else ((output_names,) if isinstance(output_names, str) else tuple(output_names))
    )
    if len(names) != len(outputs):
        raise ValueError(f"output_names {names} must give one name for each of the outputs {tuple(outputs)}")
    for name in (input_name, *names):
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"input and output names must be non-empty strings, got {name!r}")
    if len(set(names)) != len(names) or input_name in names:
        raise ValueError(f"input name {input_name!r} and output names {names} must all differ")
    return input_name, names


def check_preprocess(spec: Any, in_chans: int) -> dict[str, Any] | None:
    """Validate an opt-in preprocessing front; returns its record or None. ``spec``: None, or a dict with ``mean``
    and ``std`` (one value per channel, or one for all), ``layout`` (``"NCHW"`` default, or ``"NHWC"``) and ``scale``
    (default ``1/255``). The graph then takes uint8 images and computes ``(x * scale - mean) / std`` per channel in
    the export dtype."""
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ValueError(f"preprocess must be None or a dict(layout=, mean=, std=, scale=), got {spec!r}")
    unknown = sorted(set(spec) - {"layout", "mean", "std", "scale", "input_dtype"})
    if unknown:
        raise ValueError(f"preprocess takes layout, mean, std and scale; unknown keys {unknown}")
    layout = spec.get("layout", "NCHW")
    if layout not in LAYOUTS:
        raise ValueError(f"preprocess layout must be one of {LAYOUTS}, got {layout!r}")
    if spec.get("input_dtype", "uint8") != "uint8":
        raise ValueError(f"preprocess takes uint8 images, got input_dtype {spec['input_dtype']!r}")
    out: dict[str, Any] = {"input_dtype": "uint8", "layout": layout}
    for key in ("mean", "std"):
        if key not in spec:
            raise ValueError(f"preprocess needs {key}= (one value per channel, e.g. (0.485, 0.456, 0.406))")
        values = spec[key]
        values = [values] if isinstance(values, (int, float)) else list(values)
        if len(values) == 1:
            values = values * in_chans
        if len(values) != in_chans or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            raise ValueError(f"preprocess {key} must be {in_chans} finite numbers (one per channel), got {spec[key]!r}")
        if key == "std" and not all(v > 0 for v in values):
            raise ValueError(f"preprocess std must be > 0, got {spec[key]!r}")
        out[key] = [float(v) for v in values]
    scale = spec.get("scale", 1 / 255)
    if not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"preprocess scale must be a positive number, got {scale!r}")
    out["scale"] = float(scale)
    return out


def image_axes(preprocess: dict[str, Any] | None) -> tuple[int, int, int]:
    """The (channel, height, width) axes of the graph's input."""
    return (3, 1, 2) if preprocess and preprocess["layout"] == "NHWC" else (1, 2, 3)


class Normalize(nn.Module):
    """uint8 images ``[B, C, H, W]`` or ``[B, H, W, C]`` -> the model's float input ``[B, C, H, W]``.

    ``x * (scale / std) + (-mean / std)`` per channel, the two constants folded in float64 and held in
    the module's dtype, so the reference (float64), eager and the exported graph compute the same thing.
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__()
        mean = torch.tensor(spec["mean"], dtype=torch.float64).view(1, -1, 1, 1)
        std = torch.tensor(spec["std"], dtype=torch.float64).view(1, -1, 1, 1)
        self.register_buffer("mul", spec["scale"] / std)
        self.register_buffer("add", -mean / std)
        self.nhwc = spec["layout"] == "NHWC"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.nhwc:
            x = x.permute(0, 3, 1, 2)
        return x.to(self.mul.dtype) * self.mul + self.add


class ExportGraph(nn.Module):
    """``model`` (a plain VisionTransformer) with an optional :class:`Normalize` front, returning ``outputs``
    (a tensor for one output, a tuple for several); see the module docstring."""

    def __init__(self, model: nn.Module, outputs: Sequence[str], preprocess: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.model = model
        self.outputs = tuple(outputs)
        self.pre = Normalize(preprocess) if preprocess else None

    def all_outputs(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{output: tensor}`` for every requested output (computed only as far as they need)."""
        if self.pre is not None:
            x = self.pre(x)
        tokens = self.model.forward_features(x)
        values = {"last_hidden_state": tokens}
        if "pooled" in self.outputs or "logits" in self.outputs:
            values["pooled"] = self.model.forward_head(tokens, pre_logits=True)
        if "logits" in self.outputs:
            values["logits"] = self.model.head(values["pooled"])
        return {k: values[k] for k in self.outputs}

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        outs = tuple(self.all_outputs(x).values())
        return outs[0] if len(outs) == 1 else outs


def example_images(
    batch: int,
    channels: int,
    height: int,
    width: int,
    dtype: torch.dtype,
    preprocess: dict[str, Any] | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Random inputs for a graph: normal floats ``[B, C, H, W]`` in ``dtype``, or, for a preprocessing
    front, uint8 pixels (0..255) in its layout."""
    if preprocess:
        shape = (batch, height, width, channels) if preprocess["layout"] == "NHWC" else (batch, channels, height, width)
        return torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)
    return torch.randn(batch, channels, height, width, generator=generator).to(dtype)
