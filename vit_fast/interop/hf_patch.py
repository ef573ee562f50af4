"""Our kernels inside a user's own transformers vision model, the one mechanism behind ``apply_vit_fast(hf_model)``
(in place) and ``optimize(hf_model)`` (a patched copy): each encoder layer's ``forward`` (and SigLIP's pooling
head's) is replaced in the instance's ``__dict__`` by a :class:`vit_fast.interop.forwards.PatchedForward`, so the model
stays the user's class. Which layers, and when a layer keeps its own forward: docs/usage.md, "Hugging Face
transformers: the drop-in".
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from torch import nn

from vit_fast.backend import runtime
from vit_fast.interop.forwards import (
    PATCHED_BACKEND,
    is_patched,
    original_forward,
    patch_forward,
    share_said,
    step_aside,
)
from vit_fast.interop.hf_classes import LAYOUTS, class_refusal, vision_root
from vit_fast.interop.hf_dinov3 import ROPE_LAYERS, rope_tables, run_rope_view
from vit_fast.model.config import HF_ACTIVATIONS
from vit_fast.model.layers import run_block
from vit_fast.model.stacking import LinearWeights, StackedLinears

_STATE = "_vit_fast_view"  # the layer seen with timm's names (_LayerView, _HeadView)


_COLLECTOR: list[Any] = []  # found once; a list, which torch.compile reads where it would re-trace a functools.cache


def _active_collector() -> Any:
    """transformers 5.x records ``outputs.attentions`` with forward hooks on the attention modules, active while
    its ``capture_outputs`` collector is set (kwarg or config); None where this transformers has no such thing."""
    if not _COLLECTOR:
        _COLLECTOR.append(_find_collector())
    return _COLLECTOR[0]


def _find_collector() -> Any:
    try:
        from transformers.utils.output_capturing import _active_collector as collector
    except ImportError:
        try:
            from transformers.utils.generic import _active_collector as collector
        except ImportError:
            return None
    return collector


def attentions_requested(kwargs: dict[str, Any], collector: Any) -> bool:
    """Whether this call must produce attention probabilities: the kwarg (transformers 4.x passes it to each
    layer) or transformers 5.x's active output collector asking for ``attentions`` (kwarg or config)."""
    if kwargs.get("output_attentions"):
        return True
    collected = collector.get() if collector is not None else None
    return bool(collected) and "attentions" in collected


def _user_hooked(module: nn.Module) -> bool:
    """A forward (pre-)hook on a submodule that is not transformers' own output recorder: the fused path would
    skip it, so the layer's own forward runs."""
    for sub in module.modules():
        if sub is module:
            continue
        for hook in (*sub._forward_hooks.values(), *sub._forward_pre_hooks.values()):
            if getattr(hook, "__name__", "") != "output_capturing_hook":
                return True
    return False


class _Parts:
    """Named parts of a layer or head (``attn.qkv``, ``mlp.fc1``, ...), as timm's modules name them; a plain class,
    which torch.compile traces where it cannot build a ``types.SimpleNamespace``."""

    def __init__(self, **parts: Any) -> None:
        self.__dict__.update(parts)


class _LayerView:
    """A transformers encoder layer seen with timm's block names (``norm1``, ``attn.qkv``, ``attn.proj``,
    ``ls1``, ``norm2``, ``mlp.fc1``, ``mlp.fc2``, ``ls2``), read from the live modules on every call. q, k and v
    (and SwiGLU's gate and up) are fused into one GEMM on first use and again whenever one of them changes
    (tracked by the tensors' version counters)."""

    def __init__(self, layer: nn.Module, num_heads: int, hidden_act: str | None) -> None:
        self.layer, self.num_heads = layer, num_heads
        self.layout = LAYOUTS[type(layer).__name__]
        self.kernel_act = HF_ACTIVATIONS.get(hidden_act or "", None)
        self._stacks = StackedLinears()

    def __getstate__(self) -> dict[str, Any]:
        # a pickle or deep copy holds the layer and how to read it; what refresh() reads (and the fused copies of
        # q, k, v) is read again from the live modules on the next call, never saved beside the weights
        return {"layer": self.layer, "num_heads": self.num_heads, "layout": self.layout, "kernel_act": self.kernel_act}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._stacks = StackedLinears()

    def blocker(self) -> str | None:
        """Why the fused path cannot stand in for the layer's forward now (a submodule replaced by another type,
        e.g. PEFT's LoRA, or hooked by the user); None when it can."""
        layer = self.layer
        att_name, out_name, n1, n2, _, _ = self.layout
        att = getattr(layer, att_name)
        mlp = layer.mlp
        mlp_parts = ("gate_proj", "up_proj", "down_proj") if hasattr(mlp, "gate_proj") else ("fc1", "fc2")
        mlp_parts = ("up_proj", "down_proj") if mlp_parts == ("fc1", "fc2") and hasattr(mlp, "up_proj") else mlp_parts
        for owner, prefix, parts in (
            (att, att_name, ("q_proj", "k_proj", "v_proj", out_name)),
            (mlp, "mlp", mlp_parts),
        ):
            for part in parts:  # runs on every forward: text only for a refusal
                module = getattr(owner, part)
                if type(module) is not nn.Linear:
                    return (
                        f"{prefix}.{part} is a {type(module).__name__}, not an nn.Linear (replaced, e.g. by PEFT's "
                        "LoRA)"
                    )
        for where in (n1, n2):
            if type(getattr(layer, where)) is not nn.LayerNorm:
                return f"{where} is a {type(getattr(layer, where)).__name__}, not an nn.LayerNorm"
        if _user_hooked(layer):
            return "a submodule has a forward hook of the user's (the fused path would skip it)"
        return None

    def refresh(self) -> bool:
        """Read the layer's modules; False where the fused path cannot stand in for its forward
        (:meth:`blocker`)."""
        if self.blocker() is not None:
            return False
        layer = self.layer
        att_name, out_name, n1, n2, ls1, ls2 = self.layout
        att = getattr(layer, att_name)
        q, k, v, proj = att.q_proj, att.k_proj, att.v_proj, getattr(att, out_name)
        mlp = layer.mlp
        swiglu = hasattr(mlp, "gate_proj")
        norms = [getattr(layer, n1), getattr(layer, n2)]
        scale = (
            getattr(att, "scaling", None)
            or getattr(att, "scale", None)
            or (q.weight.shape[0] // self.num_heads) ** -0.5
        )
        self.norm1, self.norm2 = norms
        self.attn = _Parts(
            num_heads=self.num_heads, scale=float(scale), proj=proj, qkv=self._stacks.get("qkv", [q, k, v])
        )
        self.ls1 = _Parts(gamma=getattr(layer, ls1).lambda1) if ls1 else nn.Identity()
        self.ls2 = _Parts(gamma=getattr(layer, ls2).lambda1) if ls2 else nn.Identity()
        # SwiGLU's gate in the fc1 GEMM's epilogue (transformers' ACT2FN["silu"] is its SiLUActivation: F.silu)
        self.gated = swiglu and type(mlp.act_fn).__name__ in ("SiLU", "SiLUActivation")
        if swiglu:
            fc1 = self._stacks.get("gate_up", [mlp.gate_proj, mlp.up_proj])
            self.mlp = _Parts(fc1=fc1, fc2=mlp.down_proj)
            act_fn = mlp.act_fn
            self.torch_act = None if self.gated else lambda h: (lambda g, u: act_fn(g) * u)(*h.chunk(2, dim=-1))
        else:
            named = hasattr(mlp, "up_proj")  # DINOv3ViTMLP: up_proj, act_fn, down_proj
            self.mlp = _Parts(fc1=mlp.up_proj, fc2=mlp.down_proj) if named else _Parts(fc1=mlp.fc1, fc2=mlp.fc2)
            self.torch_act = None if self.kernel_act else mlp.act_fn if named else mlp.activation_fn
        return True


#: transformers' attention-pool heads run on the kernels (the attention-pool kernel), by class name
_POOL_HEADS = ("SiglipMultiheadAttentionPoolingHead", "Siglip2MultiheadAttentionPoolingHead")


class _HeadView:
    """SigLIP's pooling head (``probe``, ``attention`` an ``nn.MultiheadAttention``, ``layernorm``, ``mlp``) seen
    with timm's ``AttentionPoolLatent`` names, as :class:`vit_fast.interop.timm_blocks.PoolPlan` reads them: ``latent``,
    ``q`` and ``kv`` (row slices of the packed ``in_proj``: q rows ``[0:D]``, k and v rows ``[D:3D]``, views, no
    copy), ``proj``, ``norm``, ``mlp``; read from the live modules on every call."""

    def __init__(self, head: nn.Module, hidden_act: str | None) -> None:
        from vit_fast.interop.timm_blocks import MlpPlan, PoolPlan

        self.head = head
        att = head.attention
        heads = att.num_heads
        kernel_act = HF_ACTIVATIONS.get(hidden_act or "", None)
        self.plan = PoolPlan(heads, att.head_dim, att.head_dim**-0.5, MlpPlan(kernel_act or "torch"), "token")

    def __getstate__(self) -> dict[str, Any]:
        # as _LayerView: the head and its plan; the slices refresh() reads come from the live modules
        return {"head": self.head, "plan": self.plan}

    def blocker(self) -> str | None:
        """Why the kernels cannot stand in for the head's forward now (a submodule replaced by another type, or
        hooked by the user); None when they can."""
        head = self.head
        att, mlp = head.attention, head.mlp
        if type(att) is not nn.MultiheadAttention or type(head.layernorm) is not nn.LayerNorm:
            return "attention or layernorm replaced (nn.MultiheadAttention and nn.LayerNorm are expected)"
        for where, lin in (("attention.out_proj", att.out_proj), ("mlp.fc1", mlp.fc1), ("mlp.fc2", mlp.fc2)):
            if not isinstance(lin, nn.Linear) or type(lin).forward is not nn.Linear.forward:
                return f"{where} is a {type(lin).__name__} with a forward of its own (replaced)"
        if _user_hooked(head):
            return "a submodule has a forward hook of the user's (the kernels would skip it)"
        return None

    def refresh(self) -> bool:
        """Read the head's modules; False where the kernels cannot stand in for its forward (:meth:`blocker`)."""
        if self.blocker() is not None:
            return False
        head = self.head
        att, mlp = head.attention, head.mlp
        dim, weight, bias = att.embed_dim, att.in_proj_weight, att.in_proj_bias
        self.latent, self.proj, self.norm = head.probe, att.out_proj, head.layernorm
        self.q = LinearWeights(weight[:dim], None if bias is None else bias[:dim])
        self.kv = LinearWeights(weight[dim:], None if bias is None else bias[dim:])
        self.mlp = _Parts(fc1=mlp.fc1, fc2=mlp.fc2)
        self.torch_act = mlp.activation_fn
        return True


def _pool_head_problems(head: nn.Module) -> list[str]:
    """What of a SigLIP pooling head the kernels do not run (checked at patch time)."""
    att, problems = head.attention, []
    if type(att) is not nn.MultiheadAttention:
        return [f"head.attention {type(att).__name__} (nn.MultiheadAttention is expected)"]
    if not att._qkv_same_embed_dim or att.in_proj_weight is None:
        problems.append("head.attention with kdim / vdim other than embed_dim (separate q, k, v weights)")
    if att.bias_k is not None or att.add_zero_attn:
        problems.append("head.attention add_bias_kv / add_zero_attn")
    if not att.batch_first:
        problems.append("head.attention batch_first=False")
    if not hasattr(head, "probe") or head.probe.shape[1] != 1:
        problems.append("head.probe with other than one query")
    return problems


def _run_view(view: _LayerView, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """One layer on the kernels. With an activation the fc1 epilogue has, exactly what ``vit_fast.interop.patching``
    runs for a timm block; otherwise fc1 without activation, the layer's own activation in PyTorch, then fc2.
    ``lengths [B]``: a padded batch's valid tokens per sample (SigLIP 2, :mod:`vit_fast.interop.naflex`)."""
    from vit_fast.backend.triton_path import fuse_ln_from_env, patched_ops

    act = "silu" if view.gated else view.kernel_act if view.torch_act is None else None
    ops = patched_ops(x, lengths)
    return run_block(ops, view, x, act, fuse_ln_from_env(), gated=view.gated, torch_act=view.torch_act)


def vision_layers(model: nn.Module) -> list[nn.Module]:
    """The encoder layers of the vision tower (a CLIP / SigLIP dual model's text tower and a vision-language model's
    language model are left alone)."""
    return [m for m in vision_root(model).modules() if type(m).__name__ in LAYOUTS]


def pool_heads(model: nn.Module) -> list[nn.Module]:
    """The vision tower's attention-pool heads (SigLIP's ``vision_use_head``)."""
    root = vision_root(model)
    return [m for m in root.modules() if type(m).__name__ in _POOL_HEADS]


def kernels_blocked(module: nn.Module) -> str | None:
    """Why a patched encoder layer or attention-pool head runs its own forward now instead of the kernels (a
    submodule replaced by another type, e.g. PEFT's LoRA, or hooked by the user); None when the kernels run it.
    Training mode is not looked at here (the patched forward hands a module in training mode to transformers')."""
    return module.__dict__[_STATE].blocker()


def _vision_config(model: nn.Module) -> Any:
    config = model.config
    return getattr(config, "vision_config", None) or config


def layer_heads(layer: nn.Module, config: Any) -> int:
    """The attention heads of an encoder layer (ViTMAE's decoder has its own count; the vision config's otherwise)."""
    att = getattr(layer, LAYOUTS[type(layer).__name__][0])
    return getattr(att, "num_attention_heads", None) or getattr(att, "num_heads", None) or config.num_attention_heads


def head_dim_problem(model: nn.Module, layers: list[nn.Module]) -> str | None:
    """Why the attention kernel cannot run the vision ``layers`` (a head dim outside its range); None when it can."""
    if not runtime.triton_importable():
        return None  # no kernel runs at all: runtime.require_triton says why
    config = _vision_config(model)
    low, high = runtime.head_dim_range()
    for layer in layers:
        heads = layer_heads(layer, config)
        width = getattr(layer, LAYOUTS[type(layer).__name__][0]).q_proj.weight.shape[0]
        head_dim = width // heads
        if not low <= head_dim <= high:
            return (
                f"{type(model).__name__} has head_dim {head_dim} (hidden {width} / {heads} heads); the attention "
                f"kernel runs head dims {low}..{high}"
            )
    return None


def hf_refusal(model: nn.Module) -> str | None:
    """Why ``apply_vit_fast(model)`` refuses this transformers model as a whole (its class, no vision layers,
    transformers 4.x's layout, its attention-pool head), as the error says it; None when it patches it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the head-dim warning is the caller's to say
        try:
            check_supported(model, "auto")
        except (TypeError, ValueError) as err:
            return str(err)
    return None


def check_supported(model: nn.Module, backend: str) -> tuple[list[nn.Module], Any]:
    """The layers to patch and the vision config, or a one-line error naming what is not supported."""
    name = type(model).__name__
    refusal = class_refusal(model)
    if refusal is not None:
        raise TypeError(f"apply_vit_fast: {refusal}")
    config = _vision_config(model)
    layers = vision_layers(model)
    if not layers:
        raise TypeError(f"apply_vit_fast: {name} has no vision encoder layers ({', '.join(LAYOUTS)}) to patch")
    if not hasattr(getattr(layers[0], LAYOUTS[type(layers[0]).__name__][0]), "q_proj"):
        raise TypeError(
            f"apply_vit_fast: {name}'s layers have transformers 4.x's layout (attention.attention.query); the "
            "in-place patch reads 5.x's (q_proj, k_proj, v_proj): upgrade transformers, or use vit_fast.from_hf(model)"
        )
    problems = [p for head in pool_heads(model) for p in _pool_head_problems(head)]
    if problems:
        raise ValueError(
            f"apply_vit_fast: {name}'s attention-pool head uses what vit-fast's kernels do not run: "
            f"{'; '.join(problems)}: run this model as it is"
        )
    reason = head_dim_problem(model, layers)
    if reason is not None:
        if backend == "triton":
            raise ValueError(f"apply_vit_fast(backend='triton'): {reason}: run this model as it is")
        # backend "auto": said once, here; the layers keep transformers' forward
        warnings.warn(f"vit-fast: {reason}; its layers keep transformers' own forward", stacklevel=3)
        return [], config
    return layers, config


def _fast_hf(layer: nn.Module, backend: str, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """The forward of a patched encoder layer: :func:`_run_view` on the kernels, or the layer's own forward where
    :func:`vit_fast.interop.forwards.step_aside` says so."""
    mask = args[0] if args else kwargs.get("attention_mask")  # SigLIP 2's encoder passes it by position
    view = layer.__dict__[_STATE]
    reason, lengths = step_aside(
        layer, "hf_layer", hidden_states, backend,
        foreign=any(a is not None and a is not False for a in args[1:]) or kwargs.get("head_mask") is not None,
        attentions=attentions_requested(kwargs, _active_collector()), mask=mask, ready=view.refresh,
    )  # fmt: skip
    if reason is not None:
        return original_forward(layer)(hidden_states, *args, **kwargs)
    if type(layer).__name__ in ROPE_LAYERS:  # DINOv3: the RoPE tables rotated in the attention kernel
        rope = rope_tables(layer, hidden_states, mask, kwargs.get("position_embeddings"))
        if rope is None:
            return original_forward(layer)(hidden_states, *args, **kwargs)
        return run_rope_view(view, hidden_states, rope)
    hidden_states = hidden_states.contiguous()  # SigLIP's embeddings are a transposed view
    return _run_view(view, hidden_states) if lengths is None else _run_view(view, hidden_states, lengths)


def _fast_head(head: nn.Module, backend: str, hidden_state: torch.Tensor, *mask: Any) -> torch.Tensor:
    """The forward of a patched SigLIP pooling head: its :class:`vit_fast.interop.timm_blocks.PoolPlan` on the kernels,
    or its own forward where :func:`vit_fast.interop.forwards.step_aside` says so. SigLIP 2's head also takes the
    ``pixel_attention_mask`` ``[B, T]``: key padding, run as per-sample lengths."""
    view = head.__dict__[_STATE]
    reason, lengths = step_aside(
        head, "hf_head", hidden_state, backend, attentions=attentions_requested({}, _active_collector()),
        mask=mask[0] if mask else None, ready=view.refresh,
    )  # fmt: skip
    if reason is not None:
        return original_forward(head)(hidden_state, *mask)
    return view.plan.run(view, hidden_state) if lengths is None else view.plan.run(view, hidden_state, lengths)


def apply_hf(model: nn.Module, backend: str) -> nn.Module:
    """``apply_vit_fast`` for a transformers model (see the module docstring); in place, returns ``model``. Each
    layer's (and pooling head's) forward becomes a :class:`vit_fast.interop.forwards.PatchedForward` of :func:`_fast_hf`
    (:func:`_fast_head`), so the patched model pickles and deep-copies."""
    layers, config = check_supported(model, backend)
    hidden_act = getattr(config, "hidden_act", None)
    for layer in layers:
        if is_patched(layer):
            continue  # already patched
        layer.__dict__[_STATE] = _LayerView(layer, layer_heads(layer, config), hidden_act)
        patch_forward(layer, _fast_hf, backend)
    for head in pool_heads(model) if layers else ():  # no layers patched (head dim out of range): no head either
        if is_patched(head):
            continue
        head.__dict__[_STATE] = _HeadView(head, hidden_act)
        patch_forward(head, _fast_head, backend)
    share_said(model, [*layers, *(pool_heads(model) if layers else ())])  # each run-time fallback said once
    model.__dict__.setdefault(PATCHED_BACKEND, backend)  # a second call keeps the first's forwards
    return model


def optimize_hf(model: nn.Module, backend: str = "auto") -> nn.Module:
    """``vit_fast.optimize`` for a transformers model: a deep copy of ``model`` (same class, config, weights,
    device, dtype and train/eval mode) patched with :func:`apply_hf`; ``model`` itself is left as it was. Use
    ``apply_vit_fast(model)`` to patch in place without the copy, and ``vit_fast.from_hf(model)`` for vit-fast's
    own :class:`VisionTransformer` (what export, verify and bench take)."""
    if backend not in ("auto", "triton"):
        raise ValueError(
            f"optimize: backend {backend!r} for a transformers model: 'auto' or 'triton' (our kernels in your "
            "model); for vit-fast's own module on the torch backend use vit_fast.from_hf(model, backend='torch')"
        )
    if backend == "triton":
        runtime.require_triton()
    check_supported(model, backend)  # refuse before the copy
    return apply_hf(copy.deepcopy(model), backend)
