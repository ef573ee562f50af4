"""Each Triton kernel at a model's own shapes, judged against its float64 reference by the one numerics rule.

:func:`model_cases` (one forward's kernels) and :func:`family_cases` (those only patched timm / Hugging Face models
launch) list :class:`KernelCase` rows, as each op's spec gives them; :func:`check_kernel` runs one into a NaN-filled
output, as ``vit-fast doctor`` and the tests do. Imports no kernel until cases are listed. How: docs/cli.md."""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from vit_fast.base.versions import InterpreterVersionError
from vit_fast.kernels import OPS
from vit_fast.model.config import ViTConfig
from vit_fast.util.dtypes import DTYPE_NAMES
from vit_fast.util.numerics import compare


@dataclass(frozen=True)
class KernelCase:
    """One launch of one kernel: ``kernel`` (an op of :data:`vit_fast.kernels.OPS`), what it is in the model
    (``role``), its sizes and flags (``dims``), and the dtype it runs in."""

    kernel: str
    role: str
    dims: dict[str, Any] = field(hash=False)
    dtype: torch.dtype = torch.float32

    @property
    def name(self) -> str:
        """``"linear (fc2) fp16"``: how progress lines and reports name the check."""
        role = "" if self.role == self.kernel else f" ({self.role})"
        return f"{self.kernel}{role} {DTYPE_NAMES[self.dtype]}"

    def shape(self) -> str:
        """The input and output shapes, e.g. ``"[1, 65, 64] -> [1, 65, 192]"``, as the kernel's spec writes them."""
        return OPS[self.kernel].spec.selfcheck.shape(self.dims)


def model_cases(
    cfg: ViTConfig, batch: int = 1, dtype: torch.dtype = torch.float32, max_heads: int | None = None
) -> list[KernelCase]:
    """The launches of one forward of a model built from ``cfg`` at ``batch``, in ``dtype``.

    ``max_heads`` keeps at most that many heads (the head dim, token count, image and patch stay the model's):
    how a CPU runs a large model's kernels in Triton's interpreter in seconds rather than minutes.
    """
    heads = cfg.num_heads if max_heads is None else min(cfg.num_heads, max_heads)
    dim = heads * cfg.head_dim
    height, width = cfg.img_hw
    sizes = dict(
        batch=batch,
        tokens=cfg.num_tokens,
        dim=dim,
        eps=cfg.layer_norm_eps,
        heads=heads,
        hidden=int(round(dim * cfg.mlp_ratio)),
        act=cfg.act,
        gamma=cfg.init_values is not None,
        qkv_bias=cfg.qkv_bias,
        chans=cfg.in_chans,
        height=height,
        width=width,
        patch=cfg.patch_size,
        class_token=cfg.class_token,
        reg_tokens=cfg.reg_tokens,
        no_embed_class=cfg.no_embed_class,
    )
    cases = _cases([name for name, op in OPS.items() if op.family is None], sizes, dtype)
    return sorted(cases, key=lambda c: _IN_A_FORWARD.index(c.role) if c.role in _IN_A_FORWARD else len(_IN_A_FORWARD))


#: the order a report lists a forward's launches in (a role not named here comes after these, in OPS' order)
_IN_A_FORWARD = ("patch embedding", "qkv", "attention", "proj", "fc1", "fc2", "final norm", "residual + norm")


def _cases(ops: list[str], sizes: dict[str, Any], dtype: torch.dtype) -> list[KernelCase]:
    """Each op's launches at ``sizes``, as its spec lists them (``OPS[name].spec.selfcheck.cases``)."""
    return [KernelCase(name, role, dims, dtype) for name in ops for role, dims in OPS[name].spec.selfcheck.cases(sizes)]


#: timm models whose blocks or heads, run in place by :func:`vit_fast.apply_vit_fast`, launch the kernels that no
#: ``ViTConfig`` model does, with their sizes as timm builds them. transformers' SigLIP pooling head
#: (``SiglipMultiheadAttentionPoolingHead``, one probe query) launches the attention-pool kernel as timm's map
#: head does.
#: the sizes of the timm model each family kernel is checked at (:data:`vit_fast.kernels.OPS`' ``family``):
#: a ParallelScalingBlock ViT's RmsNorm GEMMs and qk-norm, DiffAttention, the attention-pool (map) head
RMS_FAMILY = OPS["rms_norm"].family
DIFF_FAMILY = OPS["diff_attention"].family
POOL_FAMILY = OPS["attention_pool"].family


def family_cases(batch: int = 1, dtype: torch.dtype = torch.float32, max_heads: int | None = None) -> list[KernelCase]:
    """The launches of the kernels only patched timm / Hugging Face models run: RmsNorm (qk-norm), the GEMM with
    RmsNorm in its prologue (fc1 and qkv), differential attention and the attention-pool head, at the shapes of
    :data:`RMS_FAMILY`, :data:`DIFF_FAMILY` and :data:`POOL_FAMILY` (head dims, token counts, latent length), at
    ``batch``, in ``dtype``. ``max_heads`` keeps at most that many heads, as in :func:`model_cases`."""
    cases = []
    for name, op in OPS.items():
        if op.family is not None:
            heads = op.family["heads"] if max_heads is None else min(op.family["heads"], max_heads)
            cases += _cases([name], {**op.family, "batch": batch, "heads": heads}, dtype)
    return cases


def _inputs(case: KernelCase, device: torch.device, gen: torch.Generator) -> tuple[tuple, dict[str, Any]]:
    """Random inputs of ``case`` (drawn on the CPU in their own dtype, scaled in place, then moved), as the kernel's
    spec (``OPS[name].spec.selfcheck``) lays them out: ``(args, kwargs)`` that its launcher and reference both take."""
    dtype = case.dtype

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        # no float32 draw to cast: a batch-256 fc2 input is 0.3 GB in bf16, and was 1.2 GB more in float32 copies
        drawn = torch.randn(shape, generator=gen, dtype=dtype)
        return (drawn if scale == 1.0 else drawn.mul_(scale)).to(device)

    return OPS[case.kernel].spec.selfcheck.inputs(case.dims, rnd, gen, device, dtype)


def _launch(
    case: KernelCase, args: tuple, kwargs: dict[str, Any], outputs: Callable[..., torch.Tensor] | None = None
) -> torch.Tensor:
    """The kernel's launcher on ``args``, into outputs made by ``outputs(*shape)`` (default: NaN-filled new
    tensors, in the order the launcher takes them); the output that is judged."""
    first = args[0][0] if isinstance(args[0], list) else args[0]  # preprocess takes a list of images

    def poisoned(*shape: int) -> torch.Tensor:
        if outputs is not None:
            return outputs(*shape)
        return torch.full(shape, float("nan"), dtype=case.dtype, device=first.device)

    return OPS[case.kernel].spec.selfcheck.launch(case.dims, args, kwargs, poisoned)


def _reference(case: KernelCase, args: tuple, kwargs: dict[str, Any]) -> torch.Tensor:
    """The kernel file's eager reference on ``args`` (in their dtype and device), shaped as :func:`_launch`'s."""
    return OPS[case.kernel].spec.selfcheck.judged(OPS[case.kernel].reference(*args, **kwargs))


def _float64(args: tuple, kwargs: dict[str, Any], device: torch.device) -> tuple[tuple, dict[str, Any]]:
    def up(v: Any) -> Any:
        if isinstance(v, list):  # preprocess's uint8 images: moved, not cast
            return [t.detach().to(device) for t in v]
        return v.detach().to(device, torch.float64) if isinstance(v, torch.Tensor) and v.is_floating_point() else v

    kwargs = {k: up(v) for k, v in kwargs.items()}
    if "out_dtype" in kwargs:  # preprocess: its float64 truth is computed and returned in float64
        kwargs.update(out_dtype=torch.float64, compute_dtype=torch.float64)
    return tuple(up(a) for a in args), kwargs


@contextlib.contextmanager
def no_tf32() -> Iterator[None]:
    """TF32 off for torch's CUDA matmuls and convolutions within the block: eager's fp32 error would otherwise be
    TF32's (~3e-4), and a bound of twice that would let a wrong fp32 kernel pass."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def prepared_launch(case: KernelCase, device: torch.device | str = "cpu", seed: int = 0) -> Callable[[], torch.Tensor]:
    """``case``'s launch with the random inputs :func:`check_kernel` draws, made once on ``device``: each call of
    the returned function launches the kernel again into the same outputs (NaN-filled before the first) and
    returns what it wrote, unjudged. For timing a case, and for compiling one without the references' cost (a
    warm-up; a count of compilations with Triton's driver stubbed)."""
    device = torch.device(device)
    guard = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with guard:
        args, kwargs = _inputs(case, device, torch.Generator().manual_seed(seed))
    outs: list[torch.Tensor] = []

    def launch() -> torch.Tensor:
        taken = 0

        def output(*shape: int) -> torch.Tensor:
            nonlocal taken
            if taken == len(outs):  # the first launch makes them
                outs.append(torch.full(shape, float("nan"), dtype=case.dtype, device=device))
            taken += 1
            return outs[taken - 1]

        with guard:
            return _launch(case, args, kwargs, output)

    return launch


def launch_case(case: KernelCase, device: torch.device | str = "cpu", seed: int = 0) -> torch.Tensor:
    """``case`` launched once (:func:`prepared_launch`): its output, unjudged."""
    return prepared_launch(case, device, seed)()


def check_kernel(
    case: KernelCase, device: torch.device | str = "cpu", seed: int = 0, reference_device: torch.device | str = "cpu"
) -> dict[str, Any]:
    """Run ``case`` on ``device`` and judge it against float64 on ``reference_device`` (docs/development.md, section
    "Kernel checks (`model/selfcheck.py`)"); never raises for the kernel's own failure; raises InterpreterVersionError
    (``vit_fast.base.versions``) where the installed triton and numpy break its interpreter. Returns ``{"name",
    "kernel", "role", "dtype", "shape", "status": "ok" | "failed", "summary", "seconds"}`` plus the numbers of
    :func:`vit_fast.util.numerics.compare` when the kernel ran, or ``error`` and ``traceback`` when it raised."""
    device = torch.device(device)
    record: dict[str, Any] = dict(
        name=case.name, kernel=case.kernel, role=case.role, dtype=DTYPE_NAMES[case.dtype], shape=case.shape()
    )
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    guard = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    try:
        with guard, no_tf32():  # launched on the inputs' device, whichever is current
            args, kwargs = _inputs(case, device, gen)
            out = _launch(case, args, kwargs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            eager = _reference(case, args, kwargs)
        ref64 = _reference(case, *_float64(args, kwargs, torch.device(reference_device)))
        result = compare(out, eager, ref64, case.dtype, logits=False)
    except InterpreterVersionError:
        raise
    except Exception as err:  # a launch that fails (compile error, out of resources) is a failed check
        first = (str(err).strip().splitlines() or [""])[0]
        record.update(
            status="failed",
            summary=f"{case.shape()}: {type(err).__name__}: {first}".rstrip(": "),
            error=f"{type(err).__name__}: {err}",
            traceback=traceback.format_exc(),
            seconds=time.perf_counter() - start,
        )
        return record
    verdict = "within" if result["passed"] else "OUTSIDE"
    record.update(
        result,
        status="ok" if result["passed"] else "failed",
        summary=(
            f"{case.shape()}: max|err| {result['max_abs_err']:.2e} vs torch {result['eager_max_abs_err']:.2e}, "
            f"{verdict} bound {result['bound']:.2e}"
        ),
        seconds=time.perf_counter() - start,
    )
    return record


__all__ = [
    "DIFF_FAMILY",
    "POOL_FAMILY",
    "RMS_FAMILY",
    "KernelCase",
    "check_kernel",
    "family_cases",
    "launch_case",
    "prepared_launch",
    "model_cases",
    "no_tf32",
]
