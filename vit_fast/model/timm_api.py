"""timm's model API on :class:`vit_fast.VisionTransformer`, so a converted model (``from_timm`` / ``optimize``) is
used as the timm model it replaces: ``num_features``, ``head_hidden_size``, ``pretrained_cfg`` (what
``timm.data.resolve_data_config`` reads: the source's own mean, std and crop), ``set_grad_checkpointing``,
``forward_intermediates`` and ``get_intermediate_layers`` with timm's arguments and return shapes."""

from __future__ import annotations

from typing import Any

import torch


def _take(indices: int | list[int] | tuple[int, ...] | None, depth: int) -> list[int]:
    """timm's rule: an int n means the last n blocks, a sequence the blocks named (negative from the end)."""
    if indices is None:
        return list(range(depth))
    if isinstance(indices, int):
        if not 0 < indices <= depth:
            raise ValueError(f"indices={indices}: this model has {depth} blocks, ask for 1..{depth} of the last ones")
        return list(range(depth - indices, depth))
    out = []
    for i in indices:
        j = i + depth if i < 0 else i
        if not 0 <= j < depth:
            raise ValueError(f"block index {i} is out of range for a model of {depth} blocks")
        out.append(j)
    return sorted(out)


class TimmModelAPI:
    """Mixed into :class:`vit_fast.model.vit.VisionTransformer`; reads ``cfg``, ``norm``, ``forward_stages``."""

    grad_checkpointing = False

    @property
    def num_features(self) -> int:
        """Width of the pooled features (timm's name)."""
        return self.cfg.embed_dim

    @property
    def head_hidden_size(self) -> int:
        """Width of what the classifier reads (timm's name; no pre-logits MLP here)."""
        return self.cfg.embed_dim

    @property
    def pretrained_cfg(self) -> dict[str, Any]:
        """timm's pretrained config: the source's (mean, std, crop_pct, interpolation ...) for a model converted from
        timm, else the input size only (timm's data defaults fill the rest)."""
        cfg = self.__dict__.get("_pretrained_cfg")
        if cfg is None:
            h, w = self.cfg.img_hw
            cfg = {"input_size": (self.cfg.in_chans, h, w), "num_classes": self.cfg.num_classes}
        return cfg

    @pretrained_cfg.setter
    def pretrained_cfg(self, value: dict[str, Any] | None) -> None:
        self.__dict__["_pretrained_cfg"] = dict(value) if value is not None else None

    default_cfg = pretrained_cfg  # timm's older name, still read by some code

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block in the backward pass instead of keeping its activations (torch backend, training
        with autograd), as timm's ``set_grad_checkpointing`` does."""
        self.grad_checkpointing = bool(enable)

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | tuple[int, ...] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """timm's ``forward_intermediates``: the outputs of the blocks ``indices`` names (an int n: the last n),
        each ``[B, D, H/p, W/p]`` (``output_fmt="NCHW"``) or ``[B, H/p * W/p, D]`` (``"NLC"``), the final norm
        applied with ``norm=True``, prefix tokens returned beside them with ``return_prefix_tokens=True``. Returns
        ``(final tokens [B, T, D], intermediates)``, or the intermediates only."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        depth = self.cfg.depth
        wanted = _take(indices, depth)
        grid = self.check_input(x)
        last = max(wanted) if (stop_early or intermediates_only) and wanted else depth - 1
        prefix_len = self.cfg.num_prefix_tokens
        intermediates, final = [], None
        for stage, tokens in self.forward_stages(x):
            if stage == "final norm":
                final = tokens
            if not stage.startswith("block "):
                continue
            i = int(stage.split()[1])
            if i in wanted:
                out = self.norm(tokens) if norm else tokens
                prefix, patches = out[:, :prefix_len], out[:, prefix_len:]
                if output_fmt == "NCHW":
                    patches = patches.reshape(x.shape[0], *grid, -1).permute(0, 3, 1, 2).contiguous()
                intermediates.append((patches, prefix) if return_prefix_tokens else patches)
            if i >= last and (stop_early or intermediates_only):
                final = self.norm(tokens)  # the blocks after ``last`` were not run (timm's stop_early)
                break
        if intermediates_only:
            return intermediates
        return final, intermediates

    def get_intermediate_layers(
        self,
        x: torch.Tensor,
        n: int | list[int] | tuple[int, ...] = 1,
        reshape: bool = False,
        return_prefix_tokens: bool = False,
        norm: bool = False,
    ) -> tuple:
        """timm's (and DINOv2's) ``get_intermediate_layers``: a tuple of block outputs without prefix tokens,
        ``[B, N, D]`` or, with ``reshape=True``, ``[B, D, H/p, W/p]``."""
        return tuple(
            self.forward_intermediates(
                x,
                n,
                return_prefix_tokens=return_prefix_tokens,
                norm=norm,
                output_fmt="NCHW" if reshape else "NLC",
                intermediates_only=True,
            )
        )
