"""Each Triton kernel at a model's own shapes, judged against its float64 reference by the one numerics rule.

:func:`model_cases` (one forward's kernels) and :func:`family_cases` (those only patched timm / Hugging Face models
launch) list :class:`KernelCase` rows; :func:`check_kernel` runs one into a NaN-filled output, as ``vit-fast doctor``
and the tests do. Imports no kernel until a check runs. How: docs/cli.md, "The kernel self-check"."""

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
        """The input and output shapes, e.g. ``"[1, 65, 64] -> [1, 65, 192]"``."""
        d = self.dims
        B, T, D = d.get("batch"), d.get("tokens"), d.get("dim")
        if self.kernel == "patch_embed":
            return f"[{B}, {d['chans']}, {d['height']}, {d['width']}] -> [{B}, {T}, {D}]"
        if self.kernel in ("linear", "layer_norm_linear", "rms_norm_linear"):
            return f"[{B}, {T}, {d['k_in']}] -> [{B}, {T}, {d['n_out']}]"
        if self.kernel == "attention":
            return f"[{B}, {T}, {3 * D}] -> [{B}, {T}, {D}] ({d['heads']} heads of {D // d['heads']})"
        if self.kernel == "diff_attention":
            H = d["heads"]
            heads = f"{H} heads: q, k {2 * H} of {D // (2 * H)}, v {H} of {D // H}"
            return f"[{B}, {T}, {3 * D}] -> [{B}, {T}, {D}] ({heads})"
        if self.kernel == "attention_pool":
            L, H = d["latents"], d["heads"]
            return f"q [1, {L}, {D}], kv [{B}, {T}, {2 * D}] -> [{B}, {L}, {D}] ({H} heads of {D // H})"
        if self.kernel == "preprocess":
            H, W = d["crop"]
            return f"{B} uint8 images from [{d['src'][0]}, {d['src'][1]}, 3] -> [{B}, 3, {H}, {W}]"
        if d.get("heads"):  # a norm over each head's rows (qk-norm)
            return f"[{B}, {T}, {d['heads']}, {D}]"
        return f"[{B}, {T}, {D}]"


def model_cases(
    cfg: ViTConfig, batch: int = 1, dtype: torch.dtype = torch.float32, max_heads: int | None = None
) -> list[KernelCase]:
    """The launches of one forward of a model built from ``cfg`` at ``batch``, in ``dtype``.

    ``max_heads`` keeps at most that many heads (the head dim, token count, image and patch stay the model's):
    how a CPU runs a large model's kernels in Triton's interpreter in seconds rather than minutes.
    """
    heads = cfg.num_heads if max_heads is None else min(cfg.num_heads, max_heads)
    dim = heads * cfg.head_dim
    hidden = int(round(dim * cfg.mlp_ratio))
    height, width = cfg.img_hw
    base = dict(batch=batch, tokens=cfg.num_tokens, dim=dim, eps=cfg.layer_norm_eps)
    gamma = cfg.init_values is not None
    image = dict(
        chans=cfg.in_chans,
        height=height,
        width=width,
        patch=cfg.patch_size,
        class_token=cfg.class_token,
        reg_tokens=cfg.reg_tokens,
        no_embed_class=cfg.no_embed_class,
    )
    cases = [
        KernelCase("patch_embed", "patch embedding", {**base, **image}, dtype),
        KernelCase("layer_norm_linear", "qkv", {**base, "k_in": dim, "n_out": 3 * dim, "bias": cfg.qkv_bias}, dtype),
        KernelCase("attention", "attention", {**base, "heads": heads}, dtype),
        KernelCase("linear", "proj", {**base, "k_in": dim, "n_out": dim, "residual": True, "gamma": gamma}, dtype),
        KernelCase("layer_norm_linear", "fc1", {**base, "k_in": dim, "n_out": hidden, "act": cfg.act}, dtype),
        KernelCase("linear", "fc2", {**base, "k_in": hidden, "n_out": dim, "residual": True, "gamma": gamma}, dtype),
        KernelCase("layer_norm", "final norm", base, dtype),
        KernelCase("add_layer_norm", "residual + norm", base, dtype),
    ]
    if cfg.in_chans == 3:  # what predict and serve run before the forward: decoded images to the model's input
        src = (height * 9 // 7 + 1, width * 4 // 3 + 3)  # odd decoded sizes, downscaled (antialiased) and cropped
        resize = (height * 8 // 7, width * 8 // 7)
        pre = dict(batch=batch, src=src, resize=resize, crop=(height, width), interpolation="bicubic")
        cases.append(KernelCase("preprocess", "image preprocessing", pre, dtype))
    return cases


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

    def sizes(family: dict[str, Any], per_head: int = 1) -> tuple[dict[str, Any], str]:
        heads = family["heads"] if max_heads is None else min(family["heads"], max_heads)
        dims = dict(batch=batch, tokens=family["tokens"], dim=heads * per_head * family["head_dim"], heads=heads)
        return dims, family["model"]

    rms, model = sizes(RMS_FAMILY)
    dim, eps = rms.pop("dim"), RMS_FAMILY["eps"]
    gemm = dict(batch=batch, tokens=rms["tokens"], dim=dim, eps=eps, k_in=dim)
    hidden = int(round(dim * RMS_FAMILY["mlp_ratio"]))
    cases = [
        KernelCase("rms_norm_linear", f"fc1, {model}", {**gemm, "n_out": hidden, "act": "gelu"}, dtype),
        KernelCase("rms_norm_linear", f"qkv, {model}", {**gemm, "n_out": 3 * dim, "bias": False}, dtype),
        KernelCase("rms_norm", f"qk-norm, {model}", {**rms, "dim": RMS_FAMILY["head_dim"], "eps": eps}, dtype),
    ]
    diff, model = sizes(DIFF_FAMILY, per_head=2)  # v and the output: 2 * Dh per head
    diff["lambda_init"] = DIFF_FAMILY["lambda_init"]
    cases.append(KernelCase("diff_attention", f"attention, {model}", diff, dtype))
    pool, model = sizes(POOL_FAMILY)
    pool["latents"] = POOL_FAMILY["latents"]
    cases.append(KernelCase("attention_pool", f"map head, {model}", pool, dtype))
    return cases


def _inputs(case: KernelCase, device: torch.device, gen: torch.Generator) -> tuple[tuple, dict[str, Any]]:
    """Random inputs of ``case`` (drawn on the CPU in their own dtype, scaled in place, then moved): ``(args,
    kwargs)`` that its launcher and its reference both take."""
    d, dtype = case.dims, case.dtype

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        # no float32 draw to cast: a batch-256 fc2 input is 0.3 GB in bf16, and was 1.2 GB more in float32 copies
        drawn = torch.randn(shape, generator=gen, dtype=dtype)
        return (drawn if scale == 1.0 else drawn.mul_(scale)).to(device)

    if case.kernel == "preprocess":  # each image a little larger than the last: sizes differ within one launch
        h, w = d["src"]
        images = [
            torch.randint(0, 256, (h + i, w + 2 * i, 3), generator=gen, dtype=torch.uint8).to(device)
            for i in range(d["batch"])
        ]
        norm = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
        return (images,), dict(resize=d["resize"], crop=d["crop"], interpolation=d["interpolation"], **norm,
                               out_dtype=dtype)  # fmt: skip
    B, T, D = d["batch"], d["tokens"], d["dim"]
    if case.kernel == "patch_embed":
        C, p = d["chans"], d["patch"]
        patches = (d["height"] // p) * (d["width"] // p)
        L = patches + (0 if d["no_embed_class"] else int(d["class_token"]) + d["reg_tokens"])
        args = (rnd(B, C, d["height"], d["width"]), rnd(D, C, p, p, scale=(C * p * p) ** -0.5), rnd(D), rnd(1, L, D))
        tokens = dict(
            cls_token=rnd(1, 1, D) if d["class_token"] else None,
            reg_token=rnd(1, d["reg_tokens"], D) if d["reg_tokens"] else None,
            no_embed_class=d["no_embed_class"],
        )
        return args, tokens
    if case.kernel in ("linear", "layer_norm_linear", "rms_norm_linear"):
        K, N = d["k_in"], d["n_out"]
        x, weight = rnd(B, T, K), rnd(N, K, scale=K**-0.5)
        bias = rnd(N) if d.get("bias", True) else None
        if case.kernel == "layer_norm_linear":
            return (x, rnd(K), rnd(K), d["eps"], weight, bias, d.get("act")), {}
        if case.kernel == "rms_norm_linear":  # timm's RmsNorm: a weight, no bias
            return (x, rnd(K), None, d["eps"], weight, bias, d.get("act")), {}
        residual = rnd(B, T, N, scale=2.0) if d.get("residual") else None
        gamma = rnd(N) if d.get("gamma") else None
        return (x, weight, bias, d.get("act"), residual, gamma), {}
    if case.kernel == "attention":
        return (rnd(B, T, 3 * D), d["heads"]), {}
    if case.kernel == "diff_attention":
        # timm's lambda, exp(q1 . k1) - exp(q2 . k2) + lambda_init, lies near lambda_init (its vectors start at std
        # 0.1): drawn as lambda_init + 0.1 N(0, 1), a 0-dim tensor in qkv's dtype as timm_blocks passes it; the
        # sub_norm weight is over 2 * Dh
        lambda_full = (d["lambda_init"] + 0.1 * torch.randn((), generator=gen)).to(device=device, dtype=dtype)
        return (rnd(B, T, 3 * D), lambda_full, rnd(D // d["heads"]), d["heads"], d["lambda_init"]), {}
    if case.kernel == "attention_pool":  # one latent query for every image (batch 1), as the patched heads pass it
        return (rnd(1, d["latents"], D), rnd(B, T, 2 * D), d["heads"]), {}
    if case.kernel == "rms_norm":  # qk-norm: each head's row of Dh, [B, T, H, Dh]
        return (rnd(B, T, d["heads"], D, scale=2.0), rnd(D), None, d["eps"]), {}
    residual = rnd(B, T, D) if case.kernel == "add_layer_norm" else None
    return (rnd(B, T, D, scale=2.0), residual, rnd(D), rnd(D), d["eps"]), {}


def _launch(
    case: KernelCase, args: tuple, kwargs: dict[str, Any], outputs: Callable[..., torch.Tensor] | None = None
) -> torch.Tensor:
    """The kernel's launcher on ``args``, into outputs made by ``outputs(*shape)`` (default: NaN-filled new
    tensors, in the order the launcher takes them); the output that is judged."""
    launcher = OPS[case.kernel].launcher
    if case.kernel == "preprocess":
        images, (H, W) = args[0], case.dims["crop"]
        out = outputs(len(images), 3, H, W) if outputs is not None else None
        if out is None:
            out = torch.full((len(images), 3, H, W), float("nan"), dtype=case.dtype, device=images[0].device)
        return launcher(images, **kwargs, out=out)
    x, B, T, D = args[0], case.dims["batch"], case.dims["tokens"], case.dims["dim"]

    def poisoned(*shape: int) -> torch.Tensor:
        if outputs is not None:
            return outputs(*shape)
        return torch.full(shape, float("nan"), dtype=case.dtype, device=x.device)

    if case.kernel == "patch_embed":
        return launcher(*args, **kwargs, out=poisoned(B, T, D))
    if case.kernel in ("layer_norm_linear", "rms_norm_linear"):
        x, ln_weight, ln_bias, eps, weight, bias, act = args
        out = poisoned(B, T, weight.shape[0])
        rms = case.kernel == "rms_norm_linear"
        return launcher(x, weight, bias, act, ln_weight=ln_weight, ln_bias=ln_bias, ln_eps=eps, ln_rms=rms, out=out)
    if case.kernel == "linear":
        return launcher(*args, out=poisoned(B, T, args[1].shape[0]))
    if case.kernel in ("attention", "diff_attention"):
        return launcher(*args, out=poisoned(B, T, D))
    if case.kernel == "attention_pool":
        return launcher(*args, out=poisoned(B, case.dims["latents"], D))
    if case.kernel == "rms_norm":
        return launcher(*args, out=poisoned(*x.shape))
    x, residual, weight, bias, eps = args
    if case.kernel == "layer_norm":
        return launcher(x, weight, bias, eps, out=poisoned(B, T, D))
    summed, normed = launcher(
        x, residual, weight, bias, eps, summed_out=poisoned(B, T, D), normed_out=poisoned(B, T, D)
    )
    return torch.cat([summed, normed], dim=-1)  # both outputs judged at once


def _reference(case: KernelCase, args: tuple, kwargs: dict[str, Any]) -> torch.Tensor:
    """The kernel file's eager reference on ``args`` (in their dtype and device), shaped as :func:`_launch`'s."""
    reference = OPS[case.kernel].reference
    out = reference(*args, **kwargs)
    if case.kernel == "layer_norm":
        return out[1]
    if case.kernel == "add_layer_norm":
        return torch.cat(list(out), dim=-1)
    return out


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
