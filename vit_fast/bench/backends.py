"""The things the bench times, each built for one dtype and prepared for one input batch.

A :class:`Variant` names a backend, optionally in a CUDA graph of ours; ``static_unavailable`` says why one cannot run
on the device before anything is built; :func:`build_backend` builds it. PyTorch modules run through
:class:`ModuleBackend`; ONNX Runtime and TensorRT through ``vit_fast.export.runners``, I/O bound to device buffers."""

from __future__ import annotations

import copy
import functools
import gc
import importlib
import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vit_fast.export.formats import bench_format
from vit_fast.util.dtypes import DTYPES

from .settings import GRAPHABLE, BenchError, Unavailable

#: torch.compile mode of each compile backend
COMPILE_MODES = {"compile": None, "compile-max-autotune": "max-autotune", "compile-reduce-overhead": "reduce-overhead"}


@dataclass
class Variant:
    """One thing to time: a backend, optionally captured in a CUDA graph by us."""

    backend: str
    graph: bool = False

    @property
    def label(self) -> str:
        return f"{self.backend}+graph" if self.graph and self.backend != "triton-graph" else self.backend


def plan_variants(backends: Iterable[str], graph: bool) -> list[Variant]:
    """The variants to time: each backend as it is, and with ``graph`` also its CUDA-graph form."""
    backends = list(backends)
    out = [Variant(b, graph=(b == "triton-graph")) for b in backends]
    if graph:
        for b in backends:
            if b == "triton":
                if "triton-graph" not in backends:
                    out.append(Variant("triton-graph", graph=True))
            elif b in GRAPHABLE:
                out.append(Variant(b, graph=True))
    return out


def graph_mode(variant: Variant, device: torch.device) -> str:
    """How the variant's calls are graphed: by us (CUDAGraphRunner), by inductor, or not at all."""
    if variant.graph:
        return "cuda-graph (CUDAGraphRunner)"
    if device.type == "cuda" and variant.backend in ("compile-reduce-overhead", "compile-max-autotune"):
        return "cuda-graph (inductor cudagraph trees)"
    return "none"


def static_unavailable(variant: Variant, device: torch.device, dtype_name: str) -> str | None:
    """Why ``variant`` cannot run on ``device`` in ``dtype_name``, known without building it; None if it may run."""
    b = variant.backend
    cuda = device.type == "cuda"
    if variant.graph and not cuda:
        return "CUDA graphs need a CUDA GPU; none here"
    if b in ("triton", "triton-graph"):
        from vit_fast.backend import runtime

        if not runtime.triton_importable():
            return "the triton package is not installed"
        if not cuda:
            return (
                "needs a CUDA GPU: on CPU the kernels only run in Triton's interpreter (TRITON_INTERPRET=1), "
                "which is far too slow to time"
            )
    if b == "compile-reduce-overhead" and not cuda:
        return "mode='reduce-overhead' is CUDA graphs; needs a CUDA GPU"
    if b == "timm" and importlib.util.find_spec("timm") is None:
        return "timm is not installed: pip install timm"
    if b == "hf" and importlib.util.find_spec("transformers") is None:
        return "transformers is not installed: pip install transformers"
    artifact = bench_format(b)
    if artifact is not None:  # an export format's runtime (vit_fast.export.formats): its runner knows
        return artifact.load("runner").unavailable(cuda, dtype_name)
    return None


@dataclass
class Case:
    """A prepared call: ``run()`` computes one forward on the shared input; ``fetch(out)`` gives a torch tensor."""

    run: Callable[[], Any]
    fetch: Callable[[Any], torch.Tensor] = field(default=lambda out: out)
    notes: str = ""


class Backend:
    """A built backend for one dtype; ``prepare(x)`` returns the :class:`Case` for one input batch."""

    notes = ""

    def prepare(self, x: torch.Tensor) -> Case:
        raise NotImplementedError

    def close(self) -> None:
        pass


class ModuleBackend(Backend):
    """Any callable PyTorch module, eager or compiled; optionally captured with CUDAGraphRunner per batch."""

    def __init__(self, module: Any, graph: bool, mark_step: bool = False, notes: str = "") -> None:
        self.module = module
        self.graph = graph
        self.mark_step = mark_step  # inductor cudagraph trees: a new step each call
        self.notes = notes
        self.runners: list[Any] = []

    def prepare(self, x: torch.Tensor) -> Case:
        if self.graph:
            from vit_fast.backend.graphs import CUDAGraphRunner

            self.runners.clear()  # one graph alive at a time: free the previous batch's pool
            gc.collect()
            torch.cuda.empty_cache()
            runner = CUDAGraphRunner(self.module, x, warmup=3)
            self.runners.append(runner)
            return Case(run=runner.replay, fetch=lambda out: out.clone(), notes=self.notes)
        module = self.module
        if self.mark_step:

            def run() -> Any:
                torch.compiler.cudagraph_mark_step_begin()
                return module(x)

            return Case(run=run, fetch=lambda out: out.clone(), notes=self.notes)
        return Case(run=lambda: module(x), notes=self.notes)

    def close(self) -> None:
        self.runners.clear()
        self.module = None


def triton_tuning(tune: bool) -> str:
    """How the bench runs our triton backends, said in every report that times one."""
    if tune:
        return (
            "tuned (--tune): before each batch size is timed, model.warmup(tune=True) compiles and times every "
            "candidate config of each kernel and keeps the fastest (as torch.compile's max-autotune tunes its "
            "kernels); the tuning is not in the figures"
        )
    return (
        "untuned: the heuristic config of each kernel, what a user gets by default (model.warmup compiles them "
        "before timing); --tune times the tuned kernels"
    )


class TritonBackend(ModuleBackend):
    """Our model on the triton backend. The first :meth:`prepare` of a batch size runs ``warmup([batch])`` (tuned
    with ``tune``, see :func:`triton_tuning`), outside the timing. A case whose ops fell back to eager PyTorch at
    their first-use check (:mod:`vit_fast.backend.first_use`) is refused with :class:`FellBack`: it would time eager
    PyTorch under the triton label."""

    def __init__(self, module: Any, graph: bool, tune: bool = False, notes: str = "") -> None:
        super().__init__(module, graph, notes=notes)
        self.tune = tune

    def prepare(self, x: torch.Tensor) -> Case:
        from vit_fast.backend import first_use

        self.module.warmup([x.shape[0]], dtype=x.dtype, tune=self.tune)
        fell_back = first_use.failed_ops()
        if fell_back:
            raise FellBack(
                f"the first-use check failed for {', '.join(sorted(fell_back))} on this card: those ops run in eager "
                "PyTorch, so this is not timed as triton (vit-fast doctor --json doctor.json shows the check)"
            )
        return super().prepare(x)


class FellBack(Exception):
    """A triton case whose ops fell back to eager PyTorch at their first-use check (the message names them)."""


#: transformers' ViTConfig field -> ours, for the fields that carry over as they are
HF_FIELDS = {
    "hidden_size": "embed_dim",
    "num_hidden_layers": "depth",
    "num_attention_heads": "num_heads",
    "layer_norm_eps": "layer_norm_eps",
    "image_size": "img_size",
    "patch_size": "patch_size",
    "num_channels": "in_chans",
    "qkv_bias": "qkv_bias",
}
#: the fields of our ViTConfig that timm's VisionTransformer takes under the same names
TIMM_FIELDS = (
    "img_size",
    "patch_size",
    "in_chans",
    "num_classes",
    "global_pool",
    "embed_dim",
    "depth",
    "num_heads",
    "mlp_ratio",
    "qkv_bias",
    "init_values",
    "class_token",
    "reg_tokens",
    "no_embed_class",
    "pre_norm",
    "fc_norm",
    "dynamic_img_size",
)


def build_hf(model: Any) -> Any:
    """transformers' ``ViTForImageClassification`` (``ViTModel`` for a model without a head) with ``model``'s
    weights and SDPA attention: a plain class-token ViT only (no registers, LayerScale or average pooling)."""
    from transformers import ViTConfig as HFViTConfig
    from transformers import ViTForImageClassification, ViTModel

    from vit_fast.interop.convert import hf_state_dict
    from vit_fast.model.config import HF_ACTIVATION_OF

    cfg = model.cfg
    act = HF_ACTIVATION_OF.get(cfg.act)
    plain = cfg.class_token and not cfg.reg_tokens and cfg.init_values is None and cfg.global_pool == "token"
    if act is None or not plain or cfg.pre_norm or cfg.fc_norm or cfg.no_embed_class:
        raise Unavailable("transformers' ViT has no counterpart of this model (a plain class-token ViT only)")
    hf_cfg = HFViTConfig(
        **{hf_name: getattr(cfg, ours) for hf_name, ours in HF_FIELDS.items()},
        intermediate_size=int(round(cfg.embed_dim * cfg.mlp_ratio)),
        hidden_act=act,
        num_labels=max(cfg.num_classes, 1),
    )
    cls = ViTForImageClassification if cfg.num_classes else ViTModel
    kwargs = {} if cls is ViTForImageClassification else {"add_pooling_layer": False}
    hf_model = cls._from_config(hf_cfg, attn_implementation="sdpa", **kwargs)
    hf_model.load_state_dict(hf_state_dict(model.state_dict(), hf_model.state_dict().keys()), strict=True)
    return hf_model.to(device=model.device, dtype=model.dtype).eval()


class HFBackend(ModuleBackend):
    """transformers' ViT: logits (a classifier) or the final normalised class token (``ViTModel``), as our
    model's forward returns them."""

    def __init__(self, hf_model: Any, graph: bool, notes: str) -> None:
        head = hasattr(hf_model, "classifier")
        module = _HFOutput(hf_model, head)
        super().__init__(module, graph, notes=notes)


class _HFOutput(torch.nn.Module):
    def __init__(self, hf_model: Any, head: bool) -> None:
        super().__init__()
        self.hf_model, self.head = hf_model, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.hf_model(pixel_values=x)
        return out.logits if self.head else out.last_hidden_state[:, 0]


def build_timm(model: Any) -> Any:
    """timm's VisionTransformer for ``model.cfg`` with ``model``'s weights (timm uses fused SDPA attention)."""
    from vit_fast.interop.timm_import import import_timm

    import_timm()  # where torchvision cannot be imported: timm's model code through vit-fast's stand-in
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    cfg = model.cfg
    act = functools.partial(torch.nn.GELU, approximate="tanh") if cfg.act == "gelu_tanh" else torch.nn.GELU
    timm_model = TimmViT(
        **{name: getattr(cfg, name) for name in TIMM_FIELDS},
        act_layer=act,
        norm_layer=functools.partial(torch.nn.LayerNorm, eps=cfg.layer_norm_eps),
    )
    timm_model.load_state_dict(model.state_dict(), strict=True)
    return timm_model.to(device=model.device, dtype=model.dtype).eval()


def export_onnx(
    model: Any, path: Path, dtype_name: str, max_batch: int, exporter: str, source: str | None = None
) -> str:
    """Write ``model`` (torch backend) as ONNX with a dynamic batch; returns how it was exported."""
    from vit_fast.export import to_onnx

    to_onnx(
        model,
        str(path),
        batch=(1, max(2, max_batch)),
        dtype=DTYPES[dtype_name],
        opset=18,
        exporter=exporter,
        source=source,
        progress=False,
        verify=False,  # the harness checks every backend's output against the torch backend's itself
    )
    return f"vit_fast.export.to_onnx (exporter={exporter})"


class OnnxExports:
    """One ONNX export per dtype in ``workdir``, shared by the onnxruntime and tensorrt backends."""

    def __init__(self, workdir: Path, max_batch: int, exporter: str, source: str) -> None:
        self.workdir, self.max_batch, self.exporter, self.source = workdir, max_batch, exporter, source
        self.files: dict[str, tuple[Path, str]] = {}

    def get(self, ref_model: Any, dtype_name: str) -> tuple[Path, str]:
        """(the ONNX file, how it was exported) for ``ref_model`` in ``dtype_name``, exported on first use."""
        if dtype_name not in self.files:
            path = self.workdir / f"model_{dtype_name}.onnx"
            model = copy.deepcopy(ref_model).set_backend("torch")
            note = export_onnx(model, path, dtype_name, self.max_batch, self.exporter, source=self.source)
            self.files[dtype_name] = (path, note)
        return self.files[dtype_name]


class OnnxRuntimeBackend(Backend):
    """ONNX Runtime through ``OrtRunner``: the CUDA EP with I/O binding on torch's device buffers on a GPU,
    else the CPU EP with as many intra-op threads as torch uses, so the two compare."""

    def __init__(self, onnx_path: Path, device: torch.device, export_note: str) -> None:
        from vit_fast.export.runners import CPU_EP, CUDA_EP, OrtRunner

        cuda = device.type == "cuda"
        threads = None if cuda else torch.get_num_threads()
        self.runner = OrtRunner(onnx_path, CUDA_EP if cuda else CPU_EP, threads=threads, device_id=device.index or 0)
        if cuda and not self.runner.on_gpu:
            used = self.runner.session.get_providers()
            raise RuntimeError(f"onnxruntime did not enable the CUDA EP (session providers: {used})")
        if cuda:
            ep = "CUDA EP, I/O binding on torch's buffers (Run blocks until done)"
        else:
            ep = f"CPU EP (intra_op_num_threads={threads})"
        self.notes = f"{ep}; {export_note}"

    def prepare(self, x: torch.Tensor) -> Case:
        return Case(run=self.runner.prepare(x), fetch=lambda out: out.clone(), notes=self.notes)

    def close(self) -> None:
        self.runner.close()


class TensorRTBackend(Backend):
    """A TensorRT engine per batch size (min = opt = max = the batch), built by vit_fast.export.to_tensorrt
    and run by ``EngineRunner``."""

    def __init__(self, onnx_path: Path, workdir: Path, dtype_name: str, model: Any) -> None:
        from vit_fast.export.trt_common import require_tensorrt

        require_tensorrt()
        self.onnx_path, self.workdir, self.precision, self.model = onnx_path, workdir, dtype_name, model
        self.runner: Any = None
        self.notes = (
            f"engine per batch (min=opt=max), precision={dtype_name}, execute_async_v3 on its own "
            "stream, ordered with torch's current stream"
        )

    def prepare(self, x: torch.Tensor) -> Case:
        from vit_fast.export import to_tensorrt
        from vit_fast.export.runners import EngineRunner

        batch = int(x.shape[0])
        engine_path = self.workdir / f"model_b{batch}_{self.precision}.plan"
        if self.runner is not None:
            self.runner.close()  # one engine alive at a time
        # verify=False: every backend's output is already checked against the torch backend here, and
        # verify's float64 CPU reference would take minutes for ViT-L at batch 256
        to_tensorrt(
            str(self.onnx_path),
            str(engine_path),
            batch=(batch, batch, batch),
            precision=self.precision,
            model=self.model,
            progress=False,
            verify=False,
        )
        self.runner = EngineRunner(engine_path)
        return Case(run=self.runner.prepare(x), fetch=lambda out: out.clone(), notes=self.notes)

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()
        self.runner = self.model = None


def build_backend(
    variant: Variant,
    ref_model: Any,
    dtype_name: str,
    device: torch.device,
    onnx: OnnxExports,
    workdir: Path,
    tune: bool = False,
) -> Backend:
    """Build ``variant`` from ``ref_model`` (our model, torch backend, in the dtype, on the device); ``tune``: the
    triton backends are timed tuned (:func:`triton_tuning`).

    Raises :class:`Unavailable` when it turns out it cannot run here; other errors are the backend's failure.
    """
    b = variant.backend
    cuda = device.type == "cuda"
    if b == "torch":
        model = copy.deepcopy(ref_model).set_backend("torch")
        return ModuleBackend(model, variant.graph, notes="eager PyTorch (vit_fast torch backend)")
    if b in ("triton", "triton-graph"):
        try:
            importlib.import_module("vit_fast.backend.triton_path")
        except ImportError as err:
            raise Unavailable(f"vit_fast.backend.triton_path is not importable ({err})") from err
        model = copy.deepcopy(ref_model).set_backend("triton")
        notes = "vit_fast Triton kernels, " + ("tuned" if tune else "heuristic configs (untuned)")
        return TritonBackend(model, variant.graph, tune=tune, notes=notes)
    if b.startswith("compile"):
        import torch._dynamo as dynamo

        dynamo.reset()  # each compiled variant starts from empty caches
        mode = COMPILE_MODES[b]
        model = copy.deepcopy(ref_model).set_backend("torch")
        compiled = torch.compile(model, mode=mode, dynamic=False)
        graphed_by_inductor = cuda and mode in ("max-autotune", "reduce-overhead")
        return ModuleBackend(
            compiled,
            variant.graph,
            mark_step=graphed_by_inductor,
            notes=f"torch.compile(mode={mode!r}, dynamic=False) of the torch backend",
        )
    if b == "timm":
        timm_model = build_timm(ref_model)
        fused = getattr(getattr(timm_model.blocks[0], "attn", None), "fused_attn", "?")
        return ModuleBackend(timm_model, variant.graph, notes=f"timm VisionTransformer, fused_attn={fused}")
    if b == "hf":
        return HFBackend(build_hf(ref_model), variant.graph, notes="transformers ViT, attn_implementation='sdpa'")
    if b == "onnxruntime":
        onnx_path, note = onnx.get(ref_model, dtype_name)
        return OnnxRuntimeBackend(onnx_path, device, note)
    if b == "tensorrt":
        onnx_path, _ = onnx.get(ref_model, dtype_name)
        return TensorRTBackend(onnx_path, workdir, dtype_name, ref_model)
    raise BenchError(f"unknown backend {b!r}")
