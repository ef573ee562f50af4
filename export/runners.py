"""The one way to run an artifact: ONNX Runtime for ``.onnx``, TensorRT for engines, and our own model backends run the
same way, used by ``verify``, the benchmark and the demo. Every runner offers ``run_all``, ``run``, ``prepare`` (for
timing), ``dtype``, ``input_dtype``, ``batch_range``, ``check_batch`` and ``close`` (docs/development.md, "Running an
artifact"); :func:`open_artifact` picks one from the file's suffix and imports its runtime only then."""

from __future__ import annotations

import copy
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vit_fast.backend.env import importable_version, install_hint
from vit_fast.util.dtypes import ONNX_ELEM_TYPES, ORT_TYPES
from vit_fast.util.files import refuse_non_utf8

from ._common import (
    ArtifactError,
    check_readable_file,
    external_data_files,
    read_metadata,
)
from .formats import format_of, suffix_choices
from .trt_common import (
    check_batch_in_profile,
    check_engine_compat,
    gpu_sm,
    polygraphy_logging,
    require_polygraphy,
    require_tensorrt,
    torch_dtype,
)

CUDA_EP, CPU_EP = "CUDAExecutionProvider", "CPUExecutionProvider"
#: an image input may also be uint8 pixels (an artifact exported with a preprocessing front):
#: ONNX ``TensorProto.UINT8`` = 2 and ONNX Runtime's ``tensor(uint8)``, beside the float types
INPUT_ELEM_TYPES: dict[int, torch.dtype] = {**ONNX_ELEM_TYPES, 2: torch.uint8}
INPUT_ORT_TYPES: dict[str, torch.dtype] = {**ORT_TYPES, "tensor(uint8)": torch.uint8}


class Runner:
    """What every runner offers (see the module docstring); subclasses set the attributes and ``_bind``."""

    dtype: torch.dtype
    input_dtype: torch.dtype
    runtime: str
    output_names: list[str] = ["output"]  # noqa: RUF012  (a class default, replaced per instance)
    batch_range: tuple[int, int] | None = None
    threads: int | None = None

    @classmethod
    def open_file(cls, path: Path, provider: str | None = None, threads: int | None = None) -> Runner:
        """The runner for the artifact file ``path`` (what :func:`open_artifact` calls); ``provider`` and
        ``threads`` are for a runtime that takes them."""
        return cls(path)

    @classmethod
    def unavailable(cls, cuda: bool, dtype_name: str) -> str | None:
        """Why this runtime cannot be timed against GPU (``cuda``) or CPU backends in ``dtype_name``, known before
        any file is opened (a module missing, no GPU); None if it may run."""
        return None

    @classmethod
    def status(cls) -> tuple[str, dict[str, Any]]:
        """What ``vit-fast info`` says of this runtime here: its row under ``backends`` (yes, or no and why) and any
        fields it adds to the report."""
        why = cls.unavailable(torch.cuda.is_available(), "fp32")
        return ("yes" if why is None else f"no: {why}"), {}

    @property
    def output_name(self) -> str:
        return self.output_names[0]

    def check_batch(self, batch: int) -> None:
        """Raise an ArtifactError when this runner cannot run ``batch`` images; the default takes any."""

    def _bind(self, x: torch.Tensor) -> Callable[[], dict[str, torch.Tensor]]:
        """Bind ``x`` and the output buffers; the call returns every output, by name, on the runner's device."""
        raise NotImplementedError

    def prepare(self, x: torch.Tensor) -> Callable[[], torch.Tensor]:
        """Bind ``x`` and the output buffers; the call returns the first output on the runner's device."""
        bound, first = self._bind(x), self.output_name
        return lambda: bound()[first]

    def run_all(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """One forward of ``x``; every output, by name, on the CPU."""
        self.check_batch(int(x.shape[0]))
        return {name: t.cpu() for name, t in self._bind(x)().items()}

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """One forward of ``x``; the first output on the CPU."""
        return self.run_all(x)[self.output_name]

    def close(self) -> None:
        """Drop the session / engine / model so its memory can be freed."""


# --------------------------------------------------------------------------- ONNX Runtime
class OrtRunner(Runner):
    """An ONNX file on ONNX Runtime: the CUDA execution provider where present (inputs and outputs bound to torch's
    GPU buffers, I/O binding), else the CPU provider. ``provider``: an ONNX Runtime provider name (default CUDA when
    available, else CPU), afterwards the one the session really uses (ONNX Runtime falls back to the CPU when the
    CUDA provider cannot start); ``threads``: the CPU provider's intra-op threads (inter-op 1), default ONNX
    Runtime's own; ``device_id``: the GPU."""

    def __init__(
        self, path: str | os.PathLike, provider: str | None = None, threads: int | None = None, device_id: int = 0
    ) -> None:
        import onnx
        import onnxruntime as ort

        self.path = Path(path)
        try:
            proto = onnx.load(str(self.path), load_external_data=False)
        except Exception as err:
            msg = f"cannot read {str(self.path)!r} as an ONNX model: {type(err).__name__}: {err}"
            raise ArtifactError(msg) from err
        if not proto.graph.input or not proto.graph.output:
            raise ArtifactError(f"{str(self.path)!r} is not an ONNX model (a graph with inputs and outputs)")
        external_data_files(self.path, proto)  # each inside the file's folder and there, before ONNX Runtime opens it
        elem = proto.graph.input[0].type.tensor_type.elem_type
        if elem not in INPUT_ELEM_TYPES:
            raise ArtifactError(f"{str(self.path)!r}: input element type {elem} is not fp32, fp16, bf16 or uint8")
        out_elem = proto.graph.output[0].type.tensor_type.elem_type
        # the precision it computes in: the input's, or for uint8 pixels the outputs' (or the metadata's)
        self.dtype = INPUT_ELEM_TYPES[elem]
        if self.dtype == torch.uint8:
            meta_dtype = (read_metadata(self.path) or {}).get("dtype")
            self.dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}.get(
                str(meta_dtype), ONNX_ELEM_TYPES.get(out_elem, torch.float32)
            )
        available = ort.get_available_providers()
        provider = provider or (CUDA_EP if CUDA_EP in available else CPU_EP)
        if provider not in available:
            raise ArtifactError(f"ONNX Runtime provider {provider} is not available here; available: {available}")
        self._refuse_bf16_on_cpu(provider)
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        opts = ort.SessionOptions()
        if threads is not None:
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
        self.threads = threads
        self.device_id = device_id
        providers: list[Any] = [(CUDA_EP, {"device_id": device_id}), CPU_EP] if provider == CUDA_EP else [provider]
        try:
            self.session = ort.InferenceSession(str(self.path), opts, providers=providers)
        except Exception as err:
            raise ArtifactError(f"ONNX Runtime cannot load {str(self.path)!r}: {err}") from err
        self.provider = self.session.get_providers()[0]
        self._refuse_bf16_on_cpu(self.provider)
        inp, outs = self.session.get_inputs()[0], self.session.get_outputs()
        self.input_name, self.output_names = inp.name, [o.name for o in outs]
        if inp.type not in INPUT_ORT_TYPES:
            raise ArtifactError(f"{str(self.path)!r}: unsupported ONNX input type {inp.type}")
        for o in outs:
            if o.type not in ORT_TYPES:
                raise ArtifactError(f"{str(self.path)!r}: unsupported ONNX output type {o.type} of {o.name!r}")
        self.input_dtype = INPUT_ORT_TYPES[inp.type]
        self.output_dtypes = {o.name: ORT_TYPES[o.type] for o in outs}
        #: the input's dims after the batch, an int where fixed and a name where dynamic (read by verify's size check)
        self.image_shape = tuple(inp.shape[1:])
        self.fixed_batch = inp.shape[0] if isinstance(inp.shape[0], int) else None
        self.batch_range = (self.fixed_batch, self.fixed_batch) if self.fixed_batch else None
        threads_note = f" (intra_op_num_threads={threads})" if threads else ""
        self.runtime = f"onnxruntime {ort.__version__} {self.provider}{threads_note}"

    @classmethod
    def open_file(cls, path: Path, provider: str | None = None, threads: int | None = None) -> Runner:
        return cls(path, provider, threads)

    @classmethod
    def unavailable(cls, cuda: bool, dtype_name: str) -> str | None:
        if importlib.util.find_spec("onnxruntime") is None:
            return f"onnxruntime is not installed: {install_hint('onnx')}"
        import onnxruntime as ort

        providers = ort.get_available_providers()
        if cuda and CUDA_EP not in providers:
            return (
                f"onnxruntime has no CUDAExecutionProvider here (providers: {', '.join(providers)}): install "
                "onnxruntime-gpu; CPU-EP timings would not compare with GPU backends"
            )
        if dtype_name == "bf16" and not cuda:
            return "bf16 cannot be fed to the CPU execution provider (it takes numpy arrays; numpy has no bfloat16)"
        return None

    @classmethod
    def status(cls) -> tuple[str, dict[str, Any]]:
        providers: list[str] = []
        if importable_version("onnxruntime")[0]:
            import onnxruntime as ort

            providers = list(ort.get_available_providers())
        row = f"yes ({', '.join(providers)})" if providers else f"no: {install_hint('onnx')}"
        return row, {"onnxruntime_providers": providers}

    def _refuse_bf16_on_cpu(self, provider: str) -> None:
        if self.dtype == torch.bfloat16 and provider == CPU_EP:
            raise ArtifactError(
                f"{str(self.path)!r} is a bf16 model: ONNX Runtime's CPU provider has no bf16 Conv and its Python API "
                "no bf16 arrays, so vit-fast cannot verify bf16 ONNX files on ONNX Runtime; verify the TensorRT "
                "engine built from it instead (vit-fast export tensorrt ... --precision bf16), or export fp16/fp32"
            )

    @property
    def on_gpu(self) -> bool:
        return self.provider == CUDA_EP

    def check_batch(self, batch: int) -> None:
        if self.fixed_batch is not None and batch != self.fixed_batch:
            raise ArtifactError(f"{str(self.path)!r} has a fixed batch of {self.fixed_batch}; cannot run batch {batch}")

    def _bind(self, x: torch.Tensor) -> Callable[[], dict[str, torch.Tensor]]:
        session, names = self.session, list(self.output_names)
        if not self.on_gpu:
            feed = {self.input_name: x.detach().to(self.input_dtype).cpu().numpy()}
            return lambda: dict(zip(names, (torch.from_numpy(a) for a in session.run(names, feed)), strict=True))
        device = torch.device("cuda", self.device_id)
        xin = x.detach().to(device=device, dtype=self.input_dtype).contiguous()
        binding = session.io_binding()
        binding.bind_input(
            self.input_name, "cuda", self.device_id, _element_type(self.input_dtype), tuple(xin.shape), xin.data_ptr()
        )
        shapes = {n: self._output_shape(n, int(x.shape[0])) for n in names}
        if any(shape is None for shape in shapes.values()):
            # an output with a symbolic size other than the batch (tokens of a dynamic-size graph): ONNX Runtime
            # allocates the outputs, and they come back through host memory
            for n in names:
                binding.bind_output(n, "cuda", self.device_id)
            torch.cuda.current_stream(device).synchronize()

            def call_allocated() -> dict[str, torch.Tensor]:
                _ = xin  # keep the bound input alive
                session.run_with_iobinding(binding)
                arrays = binding.copy_outputs_to_cpu()
                return {n: torch.from_numpy(a).to(device) for n, a in zip(names, arrays, strict=True)}

            return call_allocated
        outs = {n: torch.full(shapes[n], float("nan"), dtype=self.output_dtypes[n], device=device) for n in names}
        for n, out in outs.items():
            binding.bind_output(n, "cuda", self.device_id, _element_type(out.dtype), tuple(out.shape), out.data_ptr())
        # ONNX Runtime reads the bound input on its own stream: let torch's writes of it land first
        torch.cuda.current_stream(device).synchronize()

        def call() -> dict[str, torch.Tensor]:
            _ = xin  # keep the bound input alive
            session.run_with_iobinding(binding)  # blocks until the outputs are written
            return outs

        return call

    def _output_shape(self, name: str, batch: int) -> tuple[int, ...] | None:
        """An output's shape at ``batch``, or None when another of its dimensions is symbolic."""
        shape = next(o.shape for o in self.session.get_outputs() if o.name == name)
        dims = [d if isinstance(d, int) else None for d in shape]
        dims[0] = batch
        return None if any(d is None for d in dims) else tuple(dims)

    def close(self) -> None:
        self.session = None


def _element_type(dtype: torch.dtype) -> Any:
    """The element type I/O binding takes: a numpy type, or the ONNX type number for bf16 (numpy has none)."""
    import numpy as np

    if dtype == torch.bfloat16:
        return next(k for k, v in ONNX_ELEM_TYPES.items() if v == dtype)
    return {torch.float16: np.float16, torch.float32: np.float32, torch.uint8: np.uint8}[dtype]


# --------------------------------------------------------------------------- TensorRT
class EngineRunner(Runner):
    """A serialized TensorRT engine, checked against its metadata and loaded by polygraphy (``EngineFromBytes``).
    ``run_all`` runs it with polygraphy's ``TrtRunner``; ``prepare`` binds torch buffers to an execution context
    of its own (see ``_bind``)."""

    @classmethod
    def unavailable(cls, cuda: bool, dtype_name: str) -> str | None:
        if importlib.util.find_spec("tensorrt") is None:
            return f"tensorrt is not installed ({install_hint('tensorrt')}; needs a CUDA GPU)"
        if importlib.util.find_spec("polygraphy") is None:
            return f"polygraphy is not installed ({install_hint('tensorrt')})"
        return None if cuda else "TensorRT needs a CUDA GPU"

    @classmethod
    def status(cls) -> tuple[str, dict[str, Any]]:
        usable = importable_version("tensorrt")[0] and torch.cuda.is_available()
        return ("yes" if usable else "no: needs the tensorrt package and a CUDA GPU"), {}

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        meta = read_metadata(self.path) or {}
        trt, pg = require_tensorrt(), require_polygraphy()
        if not torch.cuda.is_available():
            raise RuntimeError(f"running TensorRT engine {str(self.path)!r} needs a CUDA GPU; none is visible")
        check_engine_compat(meta, self.path, trt.__version__, gpu_sm())
        # a corrupt plan, or one from another TensorRT or GPU, deserializes to None: polygraphy raises then
        rebuild = "(corrupt, or built with another TensorRT version or GPU): rebuild it with vit-fast export tensorrt"
        with polygraphy_logging(ArtifactError, f"TensorRT cannot load engine {str(self.path)!r} {rebuild}"):
            self.engine = pg.EngineFromBytes(self.path.read_bytes())()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        if len(inputs) != 1 or not outputs:
            raise ArtifactError(
                f"engine {str(self.path)!r} has inputs {inputs} and outputs {outputs}; vit-fast engines have one "
                "image input and at least one output"
            )
        self.input_name = inputs[0]
        self.output_names = outputs
        self.input_dtype = torch_dtype(self.engine.get_tensor_dtype(self.input_name), self.input_name, self.path, True)
        self.output_dtypes = {n: torch_dtype(self.engine.get_tensor_dtype(n), n, self.path) for n in outputs}
        # the precision the engine computes in, which verify() runs eager in and judges by: an fp16 engine
        # built from an fp32 ONNX file keeps fp32 I/O but must be compared with eager fp16, not fp32
        precision = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(str(meta.get("precision")))
        io_dtype = self.output_dtypes[outputs[0]] if self.input_dtype == torch.uint8 else self.input_dtype
        self.dtype = precision or io_dtype
        # get_tensor_profile_shape(name, profile_index) -> [min, opt, max] (TensorRT 10 Python API)
        lo, opt, hi = (tuple(s) for s in self.engine.get_tensor_profile_shape(self.input_name, 0))
        self.profile = (lo[0], opt[0], hi[0])
        self.image_shape = opt[1:]
        self.batch_range = (lo[0], hi[0])
        # run_all's TrtRunner, and prepare's execution context and stream: each made when first used
        self.trt_runner: Any = None
        self.context: Any = None
        self.stream: Any = None
        self.runtime = f"tensorrt {trt.__version__} {torch.cuda.get_device_name()}"

    def check_batch(self, batch: int) -> None:
        check_batch_in_profile(batch, self.profile, self.path)

    def run_all(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """One forward through polygraphy's ``TrtRunner`` (activated on the first call, with an execution context of
        its own; ``close`` deactivates it): the input goes in from host memory, copied on the runner's stream, and
        the outputs come back as torch CPU tensors."""
        self.check_batch(int(x.shape[0]))
        feed = {self.input_name: x.detach().to(device="cpu", dtype=self.input_dtype).contiguous()}
        with polygraphy_logging(RuntimeError, f"TensorRT execution of {str(self.path)!r} failed"):
            if self.trt_runner is None:
                runner = require_polygraphy().TrtRunner(self.engine)
                runner.activate()
                self.trt_runner = runner
            outs = self.trt_runner.infer(feed)
        # views of the runner's host buffers, which its next call overwrites: copy them out
        return {name: outs[name].clone() for name in self.output_names}

    def _bind(self, x: torch.Tensor) -> Callable[[], dict[str, torch.Tensor]]:
        """Bind ``x`` and NaN-filled outputs (an element the engine leaves unwritten shows); one binding at a time.
        TensorRT directly, not ``TrtRunner``: ``execute_async_v3`` on our stream, ordered with torch's current stream
        both ways, on buffers bound once. Why: docs/development.md, section Running an artifact."""
        self.check_batch(int(x.shape[0]))
        if self.context is None:
            self.context = self.engine.create_execution_context()
            if self.context is None:
                raise ArtifactError(f"TensorRT could not create an execution context for {str(self.path)!r}")
            # enqueueV3 on the legacy default stream makes TensorRT add cudaStreamSynchronize calls (it warns
            # "Using default stream in enqueueV3() may lead to performance issues"): run on a stream of our own.
            self.stream = torch.cuda.Stream()
        device = self.stream.device
        xin = x.detach().to(device=device, dtype=self.input_dtype).contiguous()
        # set_input_shape / set_tensor_address / execute_async_v3 return False (with a logged error) on failure
        if not self.context.set_input_shape(self.input_name, tuple(xin.shape)):
            raise ArtifactError(
                f"engine {str(self.path)!r} rejects input shape {tuple(xin.shape)}: it was built for images "
                f"{self.image_shape} and batch min/opt/max {self.profile}"
            )
        buffers = {self.input_name: xin}
        for name in self.output_names:
            shape = tuple(self.context.get_tensor_shape(name))
            buffers[name] = torch.full(shape, float("nan"), dtype=self.output_dtypes[name], device=device)
        for name, t in buffers.items():
            if not self.context.set_tensor_address(name, t.data_ptr()):
                raise RuntimeError(f"TensorRT rejected the buffer for tensor {name!r} of {str(self.path)!r}")
        context, stream, path = self.context, self.stream, self.path
        outs = {n: buffers[n] for n in self.output_names}

        def call() -> dict[str, torch.Tensor]:
            _ = buffers  # keep the bound buffers alive
            current = torch.cuda.current_stream(device)
            stream.wait_stream(current)  # the input was written on the current stream
            if not context.execute_async_v3(stream.cuda_stream):
                raise RuntimeError(f"TensorRT execution of {str(path)!r} failed")
            current.wait_stream(stream)  # later work on the current stream (a copy, a timing event) waits for it
            return outs

        return call

    def close(self) -> None:
        if self.trt_runner is not None:
            self.trt_runner.deactivate()
        self.trt_runner = self.context = self.engine = self.stream = None


# --------------------------------------------------------------------------- our own backends
class ModelRunner(Runner):
    """One of our model's own backends (``"torch"`` or ``"triton"``) run like an artifact, so it is judged
    by the same rule. A copy of the model in ``dtype`` runs on CUDA when there is a GPU, else on the CPU (the
    triton backend then needs ``TRITON_INTERPRET=1`` set before triton is imported; ``set_backend`` says so).
    """

    BACKENDS = ("torch", "triton")

    def __init__(self, model: nn.Module, backend: str, dtype: torch.dtype, device: str | None = None) -> None:
        from vit_fast.backend.runtime import interpreter_enabled

        if backend not in self.BACKENDS:
            raise ValueError(f"backend must be one of {self.BACKENDS}, got {backend!r}")
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = self.input_dtype = dtype
        self.model = copy.deepcopy(model).to(device=self.device, dtype=dtype).eval().set_backend(backend)
        cuda = torch.device(self.device).type == "cuda"
        interpreted = backend == "triton" and interpreter_enabled()
        where = "CUDA" if cuda else "CPU" + (" (Triton interpreter)" if interpreted else "")
        self.runtime = f"vit_fast {backend} backend on {where}"

    def _bind(self, x: torch.Tensor) -> Callable[[], dict[str, torch.Tensor]]:
        model, xin, name = self.model, x.detach().to(device=self.device, dtype=self.dtype), self.output_name

        def call() -> dict[str, torch.Tensor]:
            with torch.no_grad():
                return {name: model(xin)}

        return call

    def close(self) -> None:
        self.model = None


def check_artifact_name(artifact: str | os.PathLike) -> None:
    """Refuse, before any work, an artifact whose name its runtime cannot open: ONNX Runtime takes UTF-8 paths
    only (its binding fails on any other with its own text)."""
    found = format_of(artifact)
    if found is not None and found.utf8_paths is not None:
        refuse_non_utf8(artifact, "artifact", found.verify)


def open_artifact(artifact: str | os.PathLike, provider: str | None = None, threads: int | None = None) -> Runner:
    """A runner for ``artifact``, chosen by its suffix (:mod:`.formats`): ONNX Runtime for ``.onnx`` (``provider``,
    CPU ``threads``), TensorRT for ``.plan`` / ``.engine`` / ``.trt``. A missing or unreadable file, or an unknown
    suffix, raises naming it."""
    path = check_readable_file(artifact, "artifact")
    found = format_of(path)
    if found is None:
        raise ArtifactError(
            f"cannot tell what {str(path)!r} is from its suffix {path.suffix.lower()!r}: use {suffix_choices()}"
        )
    check_artifact_name(path)
    return found.load("runner").open_file(path, provider, threads)


__all__ = [
    "EngineRunner",
    "ModelRunner",
    "OrtRunner",
    "Runner",
    "check_artifact_name",
    "open_artifact",
]
