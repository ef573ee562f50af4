"""A patched module's forward: how vit-fast puts its own forward on a user's module (a timm block, a transformers
encoder layer or attention-pool head), takes it off again, and when it steps aside for the module's own.

:func:`patch_forward` sets a :class:`PatchedForward` in the instance's ``__dict__`` (never a closure, so the model
pickles); :func:`original_forward` and :func:`drop_patch` give back the one before; :func:`step_aside` is the rule."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from vit_fast.backend import runtime
from vit_fast.interop.naflex import key_padding_lengths

#: the ``__dict__`` key of the forward a patched module had before (called where the kernels step aside)
_ORIGINAL = "_vit_fast_original_forward"
#: the model attribute (in its ``__dict__``) that records the backend a model was patched with, for
#: :func:`vit_fast.explain`
PATCHED_BACKEND = "_vit_fast_backend"


class PatchedForward:
    """What a patched module's ``forward`` is: ``run(module, backend, *args, **kwargs)``, with ``run`` a
    module-level function of vit-fast. It pickles by reference (``run`` by its qualified name, the module and
    the backend as arguments) and deep-copies onto the copy; a bound method of a closure, what a patch used to be,
    pickled as ``getattr(module, "fast_timm")``, which no module has, so a saved model could never load back."""

    __slots__ = ("module", "run", "backend")

    def __init__(self, module: nn.Module, run: Callable[..., Any], backend: str) -> None:
        self.module, self.run, self.backend = module, run, backend

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(self.module, self.backend, *args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (PatchedForward, (self.module, self.run, self.backend))


class ClassForward:
    """A module's own class ``forward``, bound to it: what a patched module falls back to. A bound method would
    pickle as ``getattr(module, "forward")``, an attribute the patched module answers with its patch."""

    __slots__ = ("module",)

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return type(self.module).forward(self.module, *args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ClassForward, (self.module,))


def patch_forward(module: nn.Module, run: Callable[..., Any], backend: str) -> None:
    """Make ``module.forward`` call ``run(module, backend, ...)`` (a module-level function), keeping the forward it
    had (its class's, or one set on the instance before) for :func:`original_forward`; a module already patched is
    left as it is."""
    if is_patched(module):
        return
    module.__dict__[_ORIGINAL] = module.__dict__.get("forward") or ClassForward(module)
    module.__dict__["forward"] = PatchedForward(module, run, backend)


def is_patched(module: nn.Module) -> bool:
    """Whether ``module``'s forward is vit-fast's (:func:`patch_forward`)."""
    return _ORIGINAL in module.__dict__


def original_forward(module: nn.Module) -> Callable[..., Any]:
    """The forward a patched ``module`` had before its patch (its class's, or one set on the instance before)."""
    return module.__dict__[_ORIGINAL]


def drop_patch(state: dict[str, Any]) -> bool:
    """Take a patch out of a module's ``__dict__`` (``state``): the forward it had before comes back (its class's,
    or one set on the instance before the patch). False when ``state`` holds no patch."""
    original = state.pop(_ORIGINAL, None)
    if original is None:
        return False
    if isinstance(original, ClassForward):
        state.pop("forward", None)
    else:
        state["forward"] = original
    return True


#: the ``__dict__`` key (on a patched model and on each of its patched modules, one dict shared) of the run-time
#: fallbacks already said: reason -> message
SAID = "_vit_fast_said"
#: why a patched module ran its own forward at run time for a reason the user chose: reason -> what is said
FALLBACKS = {
    "dtype": "{dtype} input: the patched {what} run their own forward (the kernels compute in float16, bfloat16 and "
    "float32); model.float() or model.half() runs the kernels",
    "training": "training mode: the patched {what} run their own forward (dropout, gradient checkpointing) until "
    "model.eval()",
    "attentions": "attentions requested (output_attentions): the patched {what} run transformers' own forward, "
    "whose attention probabilities come back",
}


def share_said(model: nn.Module, modules: list[nn.Module]) -> None:
    """Give ``model`` and its patched ``modules`` one record of the fallbacks said (:func:`say_fallback`), so each
    reason is said once per model; it pickles and deep-copies with the model."""
    said = model.__dict__.setdefault(SAID, {})
    for module in modules:
        module.__dict__[SAID] = said


def say_fallback(module: nn.Module, x: torch.Tensor, backend: str, reason: str, what: str = "layers") -> None:
    """Warn once per model and ``reason`` (a key of :data:`FALLBACKS`) that a patched ``module`` runs its own forward
    on ``x`` where, in float32, the kernels would run it; silent where they would not run anyway (``backend="auto"``
    on a CPU) and while torch.compile or torch.export trace."""
    said = module.__dict__.get(SAID)
    if said is None or reason in said or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return
    if not runtime.patched_runs_kernels(x.new_empty(0, dtype=torch.float32), backend):
        return
    said[reason] = FALLBACKS[reason].format(dtype=str(x.dtype).removeprefix("torch."), what=what)
    warnings.warn(f"vit-fast: {said[reason]}", UserWarning, stacklevel=4)  # past step_aside and its _fast_*


def fallbacks_said(model: nn.Module) -> list[str]:
    """What :func:`say_fallback` has said for ``model`` so far (for :func:`vit_fast.explain`)."""
    return list(model.__dict__.get(SAID, {}).values())


#: the call sites the step-aside policy (:func:`step_aside`) decides for: site -> what a fallback message calls them
SITES = {"timm_block": "blocks", "timm_pool": "blocks", "hf_layer": "layers", "hf_head": "layers"}
#: sites whose kernels torch.export records (our custom ops); the others export their library's own graph
_EXPORT_KERNELS = ("timm_block", "timm_pool")
#: sites whose key-padding mask torch.compile reads in the graph; the pool heads take their own forward instead
_MASK_TRACED = ("timm_block", "hf_layer")


def step_aside(
    module: nn.Module,
    site: str,
    x: torch.Tensor,
    backend: str,
    *,
    head_dim: int | None = None,
    foreign: bool = False,
    attentions: bool = False,
    mask: Any = None,
    ready: Callable[[], bool] | None = None,
    takes_lengths: bool = True,
) -> tuple[str | None, torch.Tensor | None]:
    """The one rule of when a patched ``module`` (a :data:`SITES` kind) runs our kernels on ``x``: ``(None,
    lengths)`` for the kernels (``lengths``: the key-padding mask's, or None), else ``(reason, None)`` for its own
    forward; a reason the user chose is said once (:func:`say_fallback`). The reasons, in order: docs/usage.md,
    "Patched in place: which path runs, and pickling"."""
    if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        return "recording", None  # a TorchScript or ONNX graph cannot hold a Triton kernel: the library's own
    if foreign:
        return "arguments", None  # is_causal, head_mask, a rope table by position: what the kernels do not take
    if attentions:
        say_fallback(module, x, backend, "attentions", SITES[site])
        return "attentions", None
    exporting = torch.compiler.is_exporting()
    if exporting and site not in _EXPORT_KERNELS:
        return "export", None  # torch.export records transformers' own graph
    reason = "training" if module.training else None
    if reason is None and not kernels_can_run(x, backend, head_dim):
        reason = "dtype"  # a dtype, device or head dim the kernels skip
    if reason is not None:
        if exporting and mask is None:
            say_export_runs_library(x, backend)
        elif not exporting:
            say_fallback(module, x, backend, reason, SITES[site])
        return reason, None
    if ready is not None and not ready():
        return "replaced or hooked", None  # a submodule replaced or hooked (vit_fast.explain names it)
    if mask is None:
        return None, None
    if exporting or not takes_lengths or (torch.compiler.is_compiling() and site not in _MASK_TRACED):
        return "mask", None  # whether a mask is key padding is the data's, which an exported graph cannot ask
    lengths = key_padding_lengths(mask, x.shape[0], x.shape[1])  # read only where the kernels would run: it syncs
    return ("mask", None) if lengths is None else (None, lengths)


def kernels_can_run(x: torch.Tensor, backend: str, head_dim: int | None = None) -> bool:
    """The model's rule (CUDA cards with tensor cores, a head dim our attention takes) and the kernels' dtypes."""
    return runtime.patched_runs_kernels(x, backend, head_dim)


def say_export_runs_library(x: torch.Tensor, backend: str) -> None:
    """torch.export of a patched model whose modules take timm's forward here: said once per device, dtype and
    backend, since the exported graph then holds none of our ops (the user may have exported to get them)."""
    key = (str(x.device), str(x.dtype), backend)
    if key in _EXPORT_WARNED:
        return
    _EXPORT_WARNED.add(key)
    warnings.warn(
        f"apply_vit_fast(backend={backend!r}): torch.export on {x.device} ({x.dtype}) records timm's own block "
        "forwards, none of vit-fast's kernels (they run for float16/bfloat16/float32 on CUDA cards with tensor "
        "cores under 'auto'); patch with backend='triton' to export our custom ops",
        UserWarning,
        stacklevel=5,  # past step_aside and its _fast_*
    )


_EXPORT_WARNED: set[tuple[str, str, str]] = set()
