"""A warm start: compile (and, on request, tune) the triton backend's kernels for the batch sizes a model will see,
before the first real input. :func:`warmup_model` is what ``VisionTransformer.warmup`` (and so the Hugging Face
drop-in) runs; nothing here imports triton unless the model runs on the triton backend. Compiling and tuning:
docs/kernels.md, "First use: compiling, and tuning on request".
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from vit_fast.util.dtypes import DTYPE_NAMES, parse_dtype
from vit_fast.util.progress import Stages, bar

#: seconds one compilation takes on a fast host (KERNELS.md: 0.35-2 s on triton 3.6-3.9), for the announced estimate
COMPILE_SECONDS = (0.35, 2.0)


@dataclass(frozen=True)
class WarmupReport:
    """What :func:`warmup_model` did: ``backend`` the warm-up inputs ran on (``"triton"``, or ``"torch"``: nothing was
    run); ``tuned``: the kernels timed their candidates (``tune=True``, or ``VIT_FAST_AUTOTUNE=1``); ``dtype``: the
    input dtype warmed (the model's float dtype, or uint8 for a model that normalises raw images); ``seconds``: batch
    size -> seconds its warm-up forward took (compilation and tuning included; empty when nothing ran);
    ``compilations``: the announced upper bound of compilations."""

    backend: str
    tuned: bool
    dtype: torch.dtype
    seconds: dict[int, float] = field(default_factory=dict)
    compilations: int = 0

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())


def check_batch_sizes(batch_sizes: Iterable[int] | int) -> list[int]:
    """The batch sizes, sorted and without repeats; a ValueError naming the bad value otherwise."""
    if isinstance(batch_sizes, int) and not isinstance(batch_sizes, bool):
        batch_sizes = [batch_sizes]
    if isinstance(batch_sizes, (str, bytes)) or not isinstance(batch_sizes, Iterable):
        raise TypeError(f"warmup takes a list of batch sizes, e.g. [1, 8, 64], got {batch_sizes!r}")
    sizes = list(batch_sizes)
    if not sizes:
        raise ValueError("warmup needs at least one batch size, e.g. model.warmup([1, 8, 64])")
    for b in sizes:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"batch sizes must be ints >= 1, got {b!r} in {sizes!r}")
    return sorted(set(sizes))


def input_dtype(model: nn.Module, dtype: torch.dtype | str | None) -> torch.dtype:
    """The dtype of the warm-up images: ``None`` gives uint8 for a model that normalises raw images
    (``set_input_normalization``), else the model's own; a float dtype must be the model's (its forward takes
    images in the weights' dtype); uint8 needs the model's input normalisation."""
    takes_uint8 = model.input_mean is not None
    if dtype is None:
        return torch.uint8 if takes_uint8 else model.dtype
    if dtype == torch.uint8 or (isinstance(dtype, str) and dtype.strip().lower().removeprefix("torch.") == "uint8"):
        if not takes_uint8:
            raise ValueError(
                "warmup(dtype=torch.uint8): this model takes float images; call "
                "model.set_input_normalization(mean, std) first to feed it raw uint8 images"
            )
        return torch.uint8
    wanted = parse_dtype(dtype)
    if wanted != model.dtype:
        have = DTYPE_NAMES.get(model.dtype, model.dtype)
        raise ValueError(
            f"warmup(dtype={DTYPE_NAMES[wanted]}): the model's weights are {have}, "
            f"and a forward runs in the weights' dtype: call model.to({wanted}) first, or leave dtype out"
        )
    return wanted


def kernel_shapes(model: nn.Module) -> dict[str, int]:
    """Kernel -> distinct shapes one triton forward at one batch size compiles (every block has the same
    shapes): the patch embedding, the four GEMMs of a block (qkv, proj, fc1, fc2), attention, and one LayerNorm
    shape where a norm runs on its own (norm_pre, the final norm, or LN1/LN2 when not folded into the GEMMs)."""
    from vit_fast.backend.triton_path import layer_norm_fused

    blocks = len(model.blocks)
    own_norms = [isinstance(m, torch.nn.LayerNorm) for m in (model.norm_pre, model.norm)]
    separate_ln = blocks and not layer_norm_fused(model)
    return {
        "patch_embed": 1,
        "linear": 4 if blocks else 0,
        "attention": 1 if blocks else 0,
        "layer_norm": 1 if any(own_norms) or separate_ln else 0,
    }


def _candidates(kernel: str) -> int:
    """Configs the autotuner of ``kernel`` starts from (before its prune): an upper bound of what tuning compiles."""
    from vit_fast.kernels import KERNELS

    return max(1, len(KERNELS[kernel].configs))


def estimate_compilations(model: nn.Module, batches: int, tune: bool) -> int:
    """At most how many kernel compilations warming ``batches`` batch sizes costs from a cold cache (a later batch
    size often reuses an earlier one's kernels, so fewer is usual)."""
    shapes = kernel_shapes(model)
    if not tune:
        return batches * sum(shapes.values())
    return batches * sum(n * _candidates(k) for k, n in shapes.items())  # 1 for a kernel that is not autotuned


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def announcement(model: nn.Module, sizes: list[int], dtype: torch.dtype, tuned: bool) -> tuple[str, int]:
    """The one line said before the warm-up, and the compilations it announces."""
    from vit_fast.kernels.autotune import autotune_cache_enabled

    n = estimate_compilations(model, len(sizes), tuned)
    lo, hi = (n * s for s in COMPILE_SECONDS)
    what = "tuning" if tuned else "compiling"
    name = "uint8" if dtype == torch.uint8 else DTYPE_NAMES.get(dtype, str(dtype))
    how = "compilations and timings" if tuned else "compilations (one heuristic config per kernel and shape)"
    if tuned:
        saved = "saved for next time" if autotune_cache_enabled() else "not saved (VIT_FAST_AUTOTUNE_CACHE=0)"
    else:
        saved = "kept in Triton's cache for next time"
    line = (
        f"{what} the Triton kernels for batch {', '.join(map(str, sizes))} ({name}): up to {n} {how}, "
        f"about {_duration(lo)} to {_duration(hi)} on first use; {saved}"
    )
    return line, n


def warmup_model(
    model: nn.Module,
    batch_sizes: Iterable[int] | int,
    dtype: torch.dtype | str | None = None,
    tune: bool = False,
    verbose: bool = True,
) -> WarmupReport:
    """Run one no-grad forward per batch size on the model's device with random images of its input shape, so
    every kernel and shape is compiled (and, with ``tune``, tuned) before real traffic. See
    :meth:`vit_fast.VisionTransformer.warmup`."""
    sizes = check_batch_sizes(batch_sizes)
    if not isinstance(tune, bool):
        raise TypeError(f"tune must be True or False, got {tune!r}")
    in_dtype = input_dtype(model, dtype)
    if model.pos_embed.is_meta:
        raise ValueError("warmup: the model's parameters are on the meta device; load its weights first")
    device = model.device
    cfg = model.cfg
    h, w = cfg.img_hw
    say = Stages("vit-fast warmup", enabled=verbose)

    def images(b: int) -> torch.Tensor:
        if in_dtype == torch.uint8:
            return torch.randint(0, 256, (b, cfg.in_chans, h, w), dtype=torch.uint8, device=device)
        return torch.randn(b, cfg.in_chans, h, w, device=device).to(in_dtype)

    probe = images(1)
    backend = model.resolved_backend(probe)
    if backend != "triton":
        # nothing is compiled or tuned on the torch backend, so no forward is run: a CPU server with a large
        # batch would otherwise spend seconds here for nothing. Said anyway: tune=True that does nothing, or a
        # GPU model that ended up on the torch backend, is worth one line
        say.note(f"nothing to compile: the model runs on the torch backend here ({probe.device.type} input)")
        return WarmupReport("torch", False, in_dtype)
    from vit_fast.kernels.autotune import autotune_enabled, tuning
    from vit_fast.kernels.launches import announce_first_compile

    tuned = tune or autotune_enabled()
    line, n = announcement(model, sizes, in_dtype, tuned)
    say.note(line)
    announce_first_compile(tuned, by="warmup")  # said above, with the batch sizes: the kernels need not say it again
    seconds: dict[int, float] = {}
    progress = bar(len(sizes), "vit-fast warmup", enabled=None if verbose else False, unit="batch size")
    try:
        with torch.no_grad(), tuning(True) if tune else contextlib.nullcontext():  # else: as the caller set it
            for b in sizes:
                progress.set_postfix_str(f"batch {b}")
                x = probe if b == 1 else images(b)
                start = time.perf_counter()
                model.forward_head(model.forward_features(x))
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                seconds[b] = time.perf_counter() - start
                progress.update(1)
    finally:
        progress.close()
    if tune:
        model.autotune = True  # its later forwards run tuned too (see VisionTransformer.autotune)
    say.note(f"done: {len(sizes)} batch size(s) in {sum(seconds.values()):.1f} s")
    return WarmupReport("triton", tuned, in_dtype, seconds, n)


__all__ = ["WarmupReport", "check_batch_sizes", "estimate_compilations", "input_dtype", "warmup_model"]
