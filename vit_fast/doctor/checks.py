"""Doctor's kernel, model and GPU-only checks: every kernel at the model's shapes against float64 (compiled
on a GPU, else in Triton's interpreter), the whole model through ``vit_fast.export.verify``, a CUDA graph's
replay, the first-use net's record and a brief timing."""

from __future__ import annotations

import copy
from typing import Any

import torch

from vit_fast.backend import first_use
from vit_fast.base.cards import card_of, device_name
from vit_fast.model.selfcheck import check_kernel, family_cases, model_cases
from vit_fast.util.dtypes import DTYPES
from vit_fast.util.progress import Stages

from .base import check_record, failed_record, note_check
from .settings import DoctorSettings

#: batches of the compiled kernel checks: M = B * T on both sides of the GEMMs' 512-row switch for any T > 64
GPU_KERNEL_BATCHES = (1, 8)
#: in Triton's interpreter: one image, at most this many heads (the head dim and token count stay the model's)
INTERPRETER_MAX_HEADS = 2
#: the interpreter runs the whole model only when one image costs at most this many FLOPs (the embedded default
#: model: 0.03 GFLOP, about a second per image); larger models are checked whole on a GPU
INTERPRETER_MODEL_FLOPS = 0.2e9
#: what a CPU runs by default: bf16 dots run through fp32 in the interpreter, so its bf16 path is not the GPU's
CPU_DTYPES = ("fp32", "fp16")
GPU_CHECKS = ("kernels, compiled", "model, compiled", "first-use check", "cuda graph", "timing")


def dtypes_for(s: DoctorSettings, device: torch.device) -> tuple[list[str], list[dict[str, Any]]]:
    """The dtypes to check on ``device`` and a skipped check for each one left out, with the reason."""
    cuda = device.type == "cuda"
    wanted = list(s.dtypes) if s.dtypes else (list(DTYPES) if cuda else list(CPU_DTYPES))
    skipped = []
    if cuda and "bf16" in wanted and not card_of(device).native_bf16:
        wanted.remove("bf16")
        why = f"{device_name(device)} emulates bf16 (no native bf16): use fp16 there"
        skipped.append(check_record("kernels", "bf16", "skipped", why))
    if not cuda and not s.dtypes:
        why = "the interpreter runs bf16 dots through fp32, so its bf16 path is not the GPU's (--dtype bf16 runs it)"
        skipped.append(check_record("kernels", "bf16", "skipped", why))
    return wanted, skipped


def doctor_cases(cfg: Any, batch: int, dtype: torch.dtype, max_heads: int | None) -> list[Any]:
    """What doctor checks per dtype and batch: every kernel of one forward of ``cfg`` (:func:`model_cases`), then
    the kernels only patched timm / Hugging Face models run (:func:`family_cases`: RmsNorm, RmsNorm + GEMM,
    differential attention, the attention-pool head), always, at their families' shapes. Always, since the model
    doctor loads is vit-fast's own: the models that run these kernels are the user's timm / transformers objects
    patched in place (``vit_fast.apply_vit_fast``), which no model name resolves to."""
    return model_cases(cfg, batch, dtype, max_heads) + family_cases(batch, dtype, max_heads)


def kernel_checks(cfg: Any, device: torch.device, dtypes: list[str], seed: int, stages: Stages) -> list[dict[str, Any]]:
    """Every kernel of one forward of ``cfg`` and those of the patched timm / HF families (:func:`doctor_cases`), in
    each of ``dtypes``, on ``device`` (compiled on a GPU, at batches 1 and 8; else in the interpreter, at batch 1
    with at most two heads)."""
    cuda = device.type == "cuda"
    batches = GPU_KERNEL_BATCHES if cuda else (1,)
    max_heads = None if cuda else INTERPRETER_MAX_HEADS
    runs = [
        (batch, case)
        for dtype_name in dtypes
        for batch in batches
        for case in doctor_cases(cfg, batch, DTYPES[dtype_name], max_heads)
    ]
    checks = []
    for i, (batch, case) in enumerate(runs, 1):
        record = check_kernel(case, device, seed)
        name = f"{record.pop('name')} b={batch}" if cuda else record.pop("name")
        checks.append(check_record("kernels", name, record.pop("status"), record.pop("summary"), **record))
        note_check(stages, checks[-1], f"[{i}/{len(runs)}] ")
    return checks


def model_checks(model: Any, device: torch.device, dtypes: list[str], seed: int, stages: Stages) -> list[dict]:
    """The whole model, triton backend against the torch backend and float64, per dtype (vit_fast.export.verify)."""
    from vit_fast.export import verify
    from vit_fast.model.vit import count_flops

    cuda = device.type == "cuda"
    if not cuda and count_flops(model.cfg) > INTERPRETER_MODEL_FLOPS:
        why = (
            f"{count_flops(model.cfg) / 1e9:.1f} GFLOP per image is minutes in Triton's interpreter (its kernels "
            "were checked above at its token count and head dim); run vit-fast doctor on a GPU to check it whole"
        )
        skipped = check_record("model", "model", "skipped", why)
        note_check(stages, skipped)
        return [skipped]
    checks = []
    for dtype_name in dtypes if cuda else dtypes[:1]:  # each interpreted launch takes up to a second
        name = f"model {dtype_name}"
        try:
            report = verify(
                model,
                "triton",
                batches=None if cuda else [1],
                dtype=dtype_name,
                seed=seed,
                print_table=False,
                raise_on_failure=False,
            ).to_dict()
        except Exception as err:
            checks.append(failed_record("model", name, err))
        else:
            worst = max(report["rows"], key=lambda r: r["max_abs_err"] / r["bound"] if r["bound"] else float("inf"))
            summary = (
                f"{report['runtime']}, batches {sorted({r['batch'] for r in report['rows']})}: worst max|err| "
                f"{worst['max_abs_err']:.2e} vs torch {worst['eager_max_abs_err']:.2e}, bound {worst['bound']:.2e}"
            )
            fields = {k: worst[k] for k in ("max_abs_err", "eager_max_abs_err", "bound")}
            checks.append(check_record("model", name, report["passed"], summary, seed=report["seed"], **fields))
        note_check(stages, checks[-1])
    return checks


# --------------------------------------------------------------------------- GPU only
def _median_ms(fn: Any, device: torch.device, iters: int = 20) -> float:
    from vit_fast.bench import summarize, time_callable

    return summarize(time_callable(fn, device, warmup=5, iters=iters))["median_ms"]


def cuda_graph_check(model: Any, device: torch.device, dtype_name: str) -> dict[str, Any]:
    """Capture one forward of the triton model at batch 1 and replay it: the replay must give the eager output."""
    from vit_fast.backend.graphs import CUDAGraphRunner
    from vit_fast.util.numerics import FLOOR, max_err, scale_of

    dtype = DTYPES[dtype_name]
    gpu = copy.deepcopy(model).to(device, dtype).eval().set_backend("triton")
    x = torch.randn(1, model.cfg.in_chans, *model.cfg.img_hw, device=device, dtype=dtype)
    with torch.no_grad():
        eager = gpu(x)
        graph = CUDAGraphRunner(gpu, x)
        out = graph(x)
        eager_ms, graph_ms = _median_ms(lambda: gpu(x), device), _median_ms(graph.replay, device)
    diff = max_err(out, eager)
    summary = (
        f"{dtype_name}, batch 1: captured and replayed; max|replay - eager| {diff:.1e}; eager {eager_ms:.3f} ms, "
        f"replay {graph_ms:.3f} ms"
    )
    ok = diff <= FLOOR[dtype] * scale_of(eager)
    return check_record("cuda graph", f"cuda graph {dtype_name}", ok, summary, eager_ms=eager_ms, graph_ms=graph_ms)


def timing_check(model: Any, device: torch.device, dtype_name: str) -> dict[str, Any]:
    """Median CUDA-event times: the triton backend against the torch backend (batch 1 and 8), and our attention
    kernel against torch's scaled_dot_product_attention at the model's attention shape. Informational."""
    from vit_fast.kernels.attention import attention

    dtype, cfg = DTYPES[dtype_name], model.cfg
    gpu = copy.deepcopy(model).to(device, dtype).eval()
    cases: dict[str, dict[str, float]] = {}
    with torch.no_grad():
        for batch in (1, 8):
            x = torch.randn(batch, cfg.in_chans, *cfg.img_hw, device=device, dtype=dtype)
            row = cases[f"model b={batch}"] = {}
            for backend in ("torch", "triton"):
                gpu.set_backend(backend)
                row[backend] = _median_ms(lambda x=x: gpu(x), device)
        B, T, H, Dh = 8, cfg.num_tokens, cfg.num_heads, cfg.head_dim
        qkv = torch.randn(B, T, 3 * H * Dh, device=device, dtype=dtype)
        q, k, v = qkv.view(B, T, 3, H, Dh).permute(2, 0, 3, 1, 4).unbind(0)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        cases[f"attention b={B}"] = {
            "sdpa": _median_ms(lambda: sdpa(q, k, v), device),
            "triton": _median_ms(lambda: attention(qkv, H), device),
        }
    parts = [f"{name}: {' vs '.join(f'{k} {v:.3f} ms' for k, v in row.items())}" for name, row in cases.items()]
    return check_record(
        "timing", f"timing {dtype_name}", True, f"{dtype_name}, median; " + "; ".join(parts), cases_ms=cases
    )


def compiled_checks(model: Any, device: torch.device, dtypes: list[str], seed: int, stages: Stages) -> list[dict]:
    """Kernels, the whole model, a CUDA graph and timings on the GPU ``device`` (made the current device for them:
    the whole-model check and the timings run on the current one)."""
    if not dtypes:
        skipped = gpu_skipped("no precision left to check on this card (see kernels: bf16)")
        for c in skipped:
            note_check(stages, c)
        return skipped
    with torch.cuda.device(device):
        stages.note(f"kernels of the model, compiled on {device_name(device)}, {', '.join(dtypes)}")
        checks = kernel_checks(model.cfg, device, dtypes, seed, stages)
        stages.note("the whole model, triton backend against the torch backend and float64")
        checks += model_checks(model, device, dtypes, seed, stages)
        checks.append(first_use_check())
        note_check(stages, checks[-1])
        first = next(d for d in ("fp16", "bf16", "fp32") if d in dtypes)
        for name, step in (("cuda graph", cuda_graph_check), ("timing", timing_check)):
            stages.note(f"{name}, {first}")
            try:
                checks.append(step(model, device, first))
            except Exception as err:
                checks.append(failed_record(name, f"{name} {first}", err))
            note_check(stages, checks[-1])
    return checks


def first_use_check() -> dict[str, Any]:
    """What the safety net at first use (vit_fast/backend/first_use.py) saw in this process: the whole-model check above
    ran each kernel's first compiled use through it. Failed when any kernel fell back to eager PyTorch."""
    seen = first_use.report()
    if not seen["enabled"]:
        return check_record("model", "first-use check", "skipped", f"switched off ({first_use.ENV}=0)")
    if seen["failed"]:
        named = "; ".join(
            f"{f['kernel']} ({f['config']}) on {f['device']} {f['dtype']}: "
            f"max|err| {f['max_err']:.3g} > {f['bound']:.3g}"
            for f in seen["failed"]
        )
        return check_record("model", "first-use check", False, f"fell back to eager PyTorch: {named}", first_use=seen)
    return check_record(
        "model",
        "first-use check",
        True,
        f"{len(seen['checked'])} first uses judged, all within the rule",
        first_use=seen,
    )


def gpu_skipped(reason: str) -> list[dict[str, Any]]:
    """A skipped row, saying ``reason``, for each check that needs a GPU."""
    sections = {"kernels, compiled": "kernels", "model, compiled": "model", "first-use check": "model"}
    sections["cuda graph"] = "cuda graph"
    return [check_record(sections.get(name, "timing"), name, "skipped", reason) for name in GPU_CHECKS]
