"""What vit-fast does to a model and what will run it: :func:`explain`, which returns an :class:`Explanation`.

For a model patched in place, each block, encoder layer and attention-pool head as patched or left alone, and why,
and what runs it on a device; for one not patched, what ``apply_vit_fast`` would patch or refuse; for vit-fast's own
module, its ``explain_backend``. The rows and their rule: docs/usage.md, "What explain reports"."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from vit_fast.backend import runtime
from vit_fast.backend.runtime import BackendChoice

#: the dtypes the kernels compute in (vit_fast.kernels.launches.SUPPORTED_DTYPES; kept here so that explaining a
#: model on a machine without triton imports no kernel)
_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
KERNELS, OWN, RAISES = "kernels", "own forward", "raises"


@dataclass(frozen=True)
class ModuleReport:
    """One block, encoder layer or attention-pool head of a model."""

    name: str  #: where it is in the model (``named_modules``): ``blocks.3``, ``vit.encoder.layer.0``, ``attn_pool``
    kind: str  #: its class name: ``Block``, ``ViTLayer``, ``AttentionPoolLatent``
    patched: bool  #: its forward is vit-fast's (``apply_vit_fast``)
    runs: str  #: ``"kernels"`` (vit-fast's Triton kernels), ``"own forward"``, or ``"raises"`` (a refused dtype)
    reason: str  #: why, in one line


@dataclass(frozen=True)
class Explanation:
    """:func:`explain`'s answer; ``str()`` of it is what ``print`` shows, and ``"..." + explanation`` (or ``in``)
    works on that text as on a str."""

    model: str  #: the model's library and class: ``timm VisionTransformer``, ``transformers ViTModel``, ...
    device: str  #: the device explained for: the one asked for, else where the weights are
    dtype: str
    patched_with: str | None  #: the backend ``apply_vit_fast`` was given ("auto", "triton"); None: not patched
    backend: BackendChoice  #: what runs the (patched) blocks on ``device`` and why
    modules: tuple[ModuleReport, ...] = ()
    notes: tuple[str, ...] = field(default=())
    weights_on: str | None = None  #: where the weights are, when ``device`` was asked for and differs; else None

    @property
    def patched(self) -> list[ModuleReport]:
        return [m for m in self.modules if m.patched]

    @property
    def left_alone(self) -> list[ModuleReport]:
        return [m for m in self.modules if not m.patched]

    def __str__(self) -> str:
        how = f"patched with backend={self.patched_with!r}" if self.patched_with else "not patched"
        where = f"on {self.device}"
        if self.weights_on is not None:
            where = f"with its weights on {self.weights_on}, explained for {self.device} as asked"
        lines = [f"{self.model} {where} ({self.dtype}), {how}", f"backend: {self.backend}"]
        for group in _runs(self.modules):
            first, last = group[0], group[-1]
            where = first.name if len(group) == 1 else f"{first.name} .. {last.name} ({len(group)})"
            state = "patched" if first.patched else "left alone"
            lines.append(f"  {where} [{first.kind}]: {state}, runs {_RUNS[first.runs]}: {first.reason}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __add__(self, other: object) -> str:  # "..." + explain(m), as with the str that print shows
        return str(self) + other if isinstance(other, str) else NotImplemented

    def __radd__(self, other: object) -> str:
        return other + str(self) if isinstance(other, str) else NotImplemented

    def __contains__(self, text: str) -> bool:
        return text in str(self)


_RUNS = {KERNELS: "vit-fast's kernels", OWN: "its own forward", RAISES: "nothing (a call raises)"}


def _blocked(name: str, module: nn.Module) -> ModuleReport | None:
    """The row of a patched HF layer or head whose kernels step aside now (training mode, or a submodule replaced or
    hooked since the patch), naming why; None when they run."""
    from vit_fast.interop.hf_patch import kernels_blocked

    if module.training:  # the patched forward hands a module in training mode to transformers' (dropout)
        return ModuleReport(
            name,
            type(module).__name__,
            True,
            OWN,
            "patched, but in training mode: transformers' forward runs it until model.eval()",
        )
    blocker = kernels_blocked(module)
    return None if not blocker else ModuleReport(name, type(module).__name__, True, OWN, f"patched, but {blocker}")


def _runs(modules: tuple[ModuleReport, ...]) -> list[list[ModuleReport]]:
    """Consecutive modules that read the same (kind, patched, runs, reason), grouped: twelve equal blocks, one line."""
    groups: list[list[ModuleReport]] = []
    for m in modules:
        last = groups[-1][-1] if groups else None
        if last is not None and (last.kind, last.patched, last.runs, last.reason) == (
            m.kind,
            m.patched,
            m.runs,
            m.reason,
        ):
            groups[-1].append(m)
        else:
            groups.append([m])
    return groups


def _weights(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    for p in model.parameters():
        if p.is_floating_point():
            return p.device, p.dtype
    return torch.device("cpu"), torch.float32


def _kernel_choice(device: torch.device, dtype: torch.dtype, head_dim: int | None, asked: str) -> BackendChoice:
    """What a patched block with ``head_dim`` runs on ``device`` for inputs of ``dtype``: ``choose_backend``'s
    answer for the device, then the kernels' dtypes (what ``runtime.patched_runs_kernels`` checks per call)."""
    choice = runtime.choose_backend(device, head_dim, asked=asked)
    if choice.backend != "triton":
        return choice
    if dtype not in _KERNEL_DTYPES:
        return BackendChoice(
            "torch", f"the weights are {dtype}, which the kernels do not compute in (fp16, bf16, fp32)"
        )
    if dtype == torch.bfloat16:
        from vit_fast.util.dtypes import check_dtype_on_device

        try:
            check_dtype_on_device(dtype, device, "use float16 or float32, or patch with backend='auto'")
        except ValueError as err:  # the patched forward raises this on the first call
            return BackendChoice("refused", str(err))
    return choice


def _row(name: str, module: nn.Module, patched: bool, choice: BackendChoice, detail: str) -> ModuleReport:
    if not patched:
        return ModuleReport(name, type(module).__name__, False, OWN, detail)
    if choice.backend == "triton":
        return ModuleReport(name, type(module).__name__, True, KERNELS, detail)
    return ModuleReport(
        name, type(module).__name__, True, RAISES if choice.backend == "refused" else OWN, choice.reason
    )


def _hf_row(
    name: str, module: nn.Module, choice: BackendChoice, on_kernels: tuple[str, str], unpatched: str | None
) -> ModuleReport:
    """One transformers layer or pool head: ``on_kernels`` is (the detail when patched, what apply_vit_fast would run
    it on); ``unpatched`` why it is not patched, or None when it could be."""
    from vit_fast.interop.forwards import is_patched

    patched = is_patched(module)
    blocked = _blocked(name, module) if patched else None
    if blocked is not None:
        return blocked
    if patched:
        detail = on_kernels[0]
    else:
        detail = unpatched or f"apply_vit_fast(model) would run it on {on_kernels[1]}"
    return _row(name, module, patched, choice, detail)


def _unpatched_choice(refusal: str | None) -> BackendChoice:
    if refusal:
        return BackendChoice("torch", f"not patched, and apply_vit_fast refuses this model: {refusal}")
    why = "not patched: the model runs its own code; apply_vit_fast(model) puts its blocks on vit-fast's kernels"
    return BackendChoice("torch", why + " where they help")


def _timm_refusal(model: nn.Module) -> str:
    """apply_vit_fast's own error for a timm model whose blocks or head it refuses (each feature named once)."""
    from vit_fast.interop.timm_reading import plan_attention_pool, plan_timm_model

    try:
        plan_timm_model(model, "auto")
        plan_attention_pool(model, "auto")
    except ValueError as err:
        return str(err).removeprefix("apply_vit_fast: ")
    return "it reads every block"  # not reached: the caller saw a refused feature


#: what a family's reader returns: the backend it was patched with (None: not patched), the backend on the device,
#: the rows, the notes
_Read = tuple[str | None, BackendChoice, list[ModuleReport], list[str]]


def _timm(model: nn.Module, device: torch.device, dtype: torch.dtype) -> _Read:
    from vit_fast.interop.forwards import PATCHED_BACKEND, is_patched
    from vit_fast.interop.timm_reading import BLOCK_INDEX, read_attention_pool, read_timm_blocks, timm_model_refusal

    asked = model.__dict__.get(PATCHED_BACKEND)
    names = {id(m): n for n, m in model.named_modules()}
    refusal = timm_model_refusal(model)
    if refusal is not None:
        blocks = list(getattr(model, "blocks", None) or [])
        rows = [_row(names[id(b)], b, False, BackendChoice("torch", ""), f"refused: {refusal}") for b in blocks]
        return asked, _unpatched_choice(refusal), rows, []
    read = read_timm_blocks(model)
    pool = read_attention_pool(model)
    refused = any(found for _, found in read) or bool(pool and pool[1])
    rows = []
    choice = None
    for block, (plan, found) in zip(model.blocks, read, strict=True):
        patched = is_patched(block)
        what = f"{plan.kind}, MLP {'/'.join(m.act for m in plan.mlps) or '?'}, head dim {plan.head_dim}"
        if patched and block.training:  # the patched forward hands a block in training mode to timm's
            choice = BackendChoice("torch", "in training mode: timm's forward runs it until model.eval()")
            detail = choice.reason
        elif patched:
            choice = _kernel_choice(device, dtype, plan.head_dim, asked or "auto")
            detail = f"on the kernels: {what}"
        elif found:  # the row names the block: its features without the 'blocks.N.' prefix
            detail = f"refused: {'; '.join(BLOCK_INDEX.sub('', p).lstrip('.') for p in found)}"
        elif refused:
            detail = "the kernels run this block, but apply_vit_fast refuses the model for what the others use"
        else:
            detail = f"apply_vit_fast(model) would run it on the kernels ({what})"
        rows.append(_row(names[id(block)], block, patched, choice or BackendChoice("torch", ""), detail))
    if pool is not None:
        plan, found = pool
        head = model.attn_pool
        patched = is_patched(head)
        head_choice = _kernel_choice(device, dtype, plan.head_dim, asked or "auto") if patched else None
        if patched and head.training:
            head_choice = BackendChoice("torch", "in training mode: timm's forward runs it until model.eval()")
            detail = head_choice.reason
        elif patched:
            detail = f"on the attention-pool kernel: head dim {plan.head_dim}"
        elif found:
            detail = f"refused: {'; '.join(found)}"
        else:
            detail = "apply_vit_fast(model) would run it on the attention-pool kernel"
        rows.append(_row(names[id(head)], head, patched, head_choice or BackendChoice("torch", ""), detail))
    if asked is None:
        choice = _unpatched_choice(_timm_refusal(model) if refused else None)
    notes = ["outside the blocks (patch embedding, position embedding, final norm, pooling, head) timm's own code runs"]
    if asked is not None:
        notes.append(
            "a call with an attention mask other than key padding at the end of each row (NaFlex's padding runs on the "
            "kernels) runs timm's forward; an eval-mode call with autograd on runs the kernels (gradients through "
            "their backward, recomputed in eager PyTorch)"
        )
    return asked, choice or _unpatched_choice(None), rows, notes


def _hf(model: nn.Module, device: torch.device, dtype: torch.dtype) -> _Read:
    from vit_fast.interop.forwards import PATCHED_BACKEND
    from vit_fast.interop.hf_classes import VLM_TOWERS
    from vit_fast.interop.hf_patch import LAYOUTS, head_dim_problem, hf_refusal, pool_heads, vision_layers

    asked = model.__dict__.get(PATCHED_BACKEND)
    names = {id(m): n for n, m in model.named_modules()}
    layers = vision_layers(model)
    refusal = hf_refusal(model) if asked is None else None
    head_dim_why = head_dim_problem(model, layers) if layers and refusal is None else None
    config = getattr(model.config, "vision_config", None) or model.config
    head_dim = config.hidden_size // config.num_attention_heads
    choice = _kernel_choice(device, dtype, head_dim, asked) if asked else _unpatched_choice(refusal or head_dim_why)
    unpatched = f"refused: {refusal}" if refusal else head_dim_why
    act = getattr(config, "hidden_act", None)
    on_kernels = (f"on the kernels: head dim {head_dim}, activation {act}", "the kernels")
    rows = [_hf_row(names[id(layer)], layer, choice, on_kernels, unpatched) for layer in layers]
    vision = {id(m) for m in layers}
    for name, module in model.named_modules():  # a CLIP / SigLIP dual model's text tower
        if type(module).__name__ in LAYOUTS and id(module) not in vision:
            rows.append(
                ModuleReport(name, type(module).__name__, False, OWN, "text tower: vit-fast patches vision towers")
            )
    on_pool = (f"on the attention-pool kernel: head dim {head_dim}", "the attention-pool kernel")
    unpatched_head = str(refusal or head_dim_why) if refusal or head_dim_why else None
    rows += [_hf_row(names[id(head)], head, choice, on_pool, unpatched_head) for head in pool_heads(model)]
    notes = ["the embeddings, the final layernorm and the heads outside the encoder run transformers' own code"]
    tower = VLM_TOWERS.get(type(model).__name__)
    if tower is not None:
        notes.append(
            f"a vision-language model: only its vision tower ({tower}) is vit-fast's to patch; the language model "
            "and the projector run transformers' own code, untouched"
        )
    if asked is not None:
        notes.append(
            "a call with an attention mask other than key padding at the end of each row (SigLIP 2's padding runs "
            "on the kernels), output_attentions, or in training mode runs transformers' forward; an eval-mode call "
            "with autograd on runs the kernels (gradients through their eager-recompute backward)"
        )
        if getattr(config, "output_attentions", False):
            why = "every call runs transformers' forward (the attentions come from the unfused path)"
            notes.append(f"config.output_attentions is set: {why}")
    return asked, choice, rows, notes


def explain(model: nn.Module, device: torch.device | str | None = None) -> Explanation:
    """What vit-fast did to ``model`` and what runs it on ``device`` (default: where its weights are), and why.
    ``model``: a timm ``VisionTransformer`` or a transformers vision model, patched in place or not, or vit-fast's own
    :class:`vit_fast.VisionTransformer`; a TypeError for any other. Returns an :class:`Explanation` for ``print``:
    ``.backend``, ``.modules`` (one :class:`ModuleReport` per block, encoder layer or attention-pool head, split as
    ``.patched`` and ``.left_alone``), ``.notes``. Reads the model only: nothing is patched, run or compiled."""
    from vit_fast.model.vit import VisionTransformer

    weights_device, dtype = _weights(model)
    device = weights_device if device is None else torch.device(device)
    same = device.type == weights_device.type and device.index in (None, weights_device.index)
    weights_on = None if same else str(weights_device)
    module = type(model).__module__
    if isinstance(model, VisionTransformer):
        return Explanation(
            model=f"vit_fast {type(model).__name__}",
            device=str(device),
            dtype=str(dtype).removeprefix("torch."),
            patched_with=None,
            backend=model.explain_backend(device),
            weights_on=weights_on,
            notes=(
                f"vit-fast's own module: nothing is patched; every block runs the backend above ({model.backend=})",
            ),
        )
    if module.startswith("timm."):
        asked, choice, rows, notes = _timm(model, device, dtype)
        library = "timm"
    elif module.startswith("transformers."):
        asked, choice, rows, notes = _hf(model, device, dtype)
        library = "transformers"
    else:
        raise TypeError(
            f"explain() does not know {module}.{type(model).__name__}: it explains timm VisionTransformer and "
            "transformers vision models (patched with vit_fast.apply_vit_fast or not) and vit-fast's own"
        )
    from vit_fast.interop.forwards import fallbacks_said

    notes += [f"said at run time: {said}" for said in fallbacks_said(model)]  # once per model and reason
    return Explanation(
        model=f"{library} {type(model).__name__}",
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        patched_with=asked,
        backend=choice,
        modules=tuple(rows),
        notes=tuple(notes),
        weights_on=weights_on,
    )


__all__ = ["Explanation", "ModuleReport", "explain"]
