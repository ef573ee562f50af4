"""The Hugging Face drop-in: ``optimize(hf_vit)`` returns an :class:`HFViT`, called the way
transformers' ``ViTModel`` / ``ViTForImageClassification`` are called and returning the same
output classes, so Hugging Face code keeps working unchanged:

    model = vit_fast.optimize(ViTForImageClassification.from_pretrained(path))
    out = model(pixel_values=x)            # ImageClassifierOutput: .logits, .loss, .hidden_states
    model.config.id2label[out.logits.argmax(-1).item()]

``HFViT`` is a :class:`VisionTransformer` (timm parameter names, the torch / triton backends)
plus the Hugging Face ``config`` and, for ``ViTModel``, its pooler (dense + activation on the
class token). ``as_vit_fast()`` gives the plain module (export, verify and bench take that).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .config import ViTConfig
from .model import VisionTransformer

_POOLER_ACTS = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU}


class HFPooler(nn.Module):
    """transformers' ``ViTPooler``: ``act(dense(tokens[:, 0]))``."""

    def __init__(self, hidden: int, out: int, act: str) -> None:
        super().__init__()
        if act not in _POOLER_ACTS:
            raise ValueError(f"pooler_act {act!r} is not supported; supported: {sorted(_POOLER_ACTS)}")
        self.dense = nn.Linear(hidden, out)
        self.activation = _POOLER_ACTS[act]()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(tokens[:, 0]))


class HFViT(VisionTransformer):
    """A :class:`VisionTransformer` with Hugging Face's calling convention and outputs.

    ``task`` is ``"classification"`` (``ViTForImageClassification``: ``ImageClassifierOutput``) or
    ``"model"`` (``ViTModel``: ``BaseModelOutputWithPooling``).
    """

    def __init__(self, cfg: ViTConfig, hf_config: Any, task: str, pooler: bool, backend: str = "auto") -> None:
        if task not in ("classification", "model"):
            raise ValueError(f"task must be 'classification' or 'model', got {task!r}")
        super().__init__(cfg, backend=backend)
        self.config = hf_config
        self.task = task
        self.pooler = (
            HFPooler(
                cfg.embed_dim,
                getattr(hf_config, "pooler_output_size", None) or cfg.embed_dim,
                getattr(hf_config, "pooler_act", "tanh"),
            )
            if pooler
            else None
        )

    @property
    def id2label(self) -> dict[int, str]:
        return dict(getattr(self.config, "id2label", {}) or {})

    @property
    def num_labels(self) -> int:
        return self.cfg.num_classes

    def as_vit_fast(self) -> VisionTransformer:
        """The plain :class:`VisionTransformer` (its ``forward`` returns a tensor), sharing these parameters.

        The pooler is not part of it: for a ``ViTModel`` its ``forward`` is the normalised class token."""
        with torch.device("meta"):
            plain = VisionTransformer(self.cfg, backend="auto")
        state = {k: v for k, v in self.state_dict().items() if not k.startswith("pooler.")}
        plain.load_state_dict(state, strict=True, assign=True)  # the same storage, no copy
        plain.weights_source = dict(self.weights_source)
        plain.check_finite = self.check_finite
        plain.autotune = self.autotune
        return plain.train(self.training).set_backend(self.backend)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """transformers' image-classification loss: regression, single- or multi-label by ``problem_type``."""
        problem = getattr(self.config, "problem_type", None)
        if problem is None:
            if self.cfg.num_classes == 1:
                problem = "regression"
            elif labels.dtype in (torch.long, torch.int):
                problem = "single_label_classification"
            else:
                problem = "multi_label_classification"
        labels = labels.to(logits.device)
        if problem == "regression":
            return F.mse_loss(logits.squeeze(), labels.squeeze().to(logits.dtype))
        if problem == "single_label_classification":
            return F.cross_entropy(logits.view(-1, self.cfg.num_classes), labels.view(-1))
        return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))

    def forward(  # type: ignore[override]
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        from transformers.modeling_outputs import BaseModelOutputWithPooling, ImageClassifierOutput

        if pixel_values is None:
            raise ValueError("You have to specify pixel_values (images [B, C, H, W])")
        unsupported = sorted(k for k, v in kwargs.items() if v is not None and k not in ("attention_mask",))
        if kwargs.get("attention_mask") is not None:
            unsupported.append("attention_mask")
        if unsupported:
            raise ValueError(f"vit-fast's Hugging Face drop-in does not take {unsupported}")
        if output_attentions:
            raise ValueError(
                "output_attentions is not available: vit-fast's fused attention never materialises the "
                "attention probabilities; run the original transformers model for them"
            )
        if interpolate_pos_encoding and tuple(pixel_values.shape[-2:]) != self.cfg.img_hw:
            raise ValueError(
                "interpolate_pos_encoding: vit-fast resamples position embeddings timm's way (antialiased bicubic), "
                "which differs numerically from transformers'; convert for the size you run instead: "
                f"vit_fast.from_hf(model, img_size={tuple(pixel_values.shape[-2:])})"
            )
        if output_hidden_states is None:
            output_hidden_states = bool(getattr(self.config, "output_hidden_states", False))
        if return_dict is None:
            # config.return_dict, never use_return_dict: transformers 5 logs a deprecation for that property
            return_dict = bool(getattr(self.config, "return_dict", True))
        hidden = None
        if output_hidden_states:
            stages = list(self.forward_stages(pixel_values))
            hidden = tuple(t for name, t in stages if name != "final norm")
            tokens = stages[-1][1]
        else:
            tokens = self.forward_features(pixel_values)
        if self.task == "classification":
            logits = self.forward_head(tokens)
            loss = self._loss(logits, labels) if labels is not None else None
            out = ImageClassifierOutput(loss=loss, logits=logits, hidden_states=hidden)
        else:
            if labels is not None:
                raise ValueError("labels are for ViTForImageClassification; this is a ViTModel (no classifier)")
            pooled = self.pooler(tokens) if self.pooler is not None else None
            out = BaseModelOutputWithPooling(last_hidden_state=tokens, pooler_output=pooled, hidden_states=hidden)
        return out if return_dict else out.to_tuple()


def hf_dropin(hf_model: nn.Module, backend: str = "auto") -> HFViT:
    """An :class:`HFViT` with ``hf_model``'s weights, config, pooler, device and dtype."""
    from .convert import from_hf

    plain = from_hf(hf_model, backend=backend)
    name = type(hf_model).__name__
    task = "classification" if name == "ViTForImageClassification" else "model"
    hf_pooler = getattr(hf_model, "pooler", None) if task == "model" else None
    with torch.device("meta"):
        model = HFViT(plain.cfg, copy.deepcopy(hf_model.config), task, pooler=hf_pooler is not None, backend="auto")
    state = dict(plain.state_dict())
    if hf_pooler is not None:
        state.update({f"pooler.dense.{k}": v for k, v in hf_pooler.dense.state_dict().items()})
    model.load_state_dict({k: v.detach().clone() for k, v in state.items()}, strict=True, assign=True)
    model.weights_source = {"kind": "hf", "name": getattr(hf_model.config, "_name_or_path", "") or name}
    model.train(hf_model.training)
    return model.set_backend(backend)
