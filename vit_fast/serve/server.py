"""``vit-fast serve``: one model behind a real Triton Inference Server, started through PyTriton.

PyTriton (the ``serve`` extra) bundles Triton Inference Server 2.51 and its python backend; the
model runs in this process (triton kernels on a GPU, torch on the CPU) and Triton in front of it
does the rest: dynamic batching, HTTP and gRPC endpoints, health (``/v2/health/ready``) and
Prometheus metrics (``/metrics``). Triton checks each request's shape and dtype against the model
config, so a malformed request gets an error response and never reaches the model.

Two traps are handled here rather than by hand:

- The python-backend stub links ``libpython3.X.so.1.0``, which the loader would take from the
  system even when this interpreter is another patch release (a venv on pyenv's 3.11.7 next to
  Debian's 3.11.2 fails at model load with ``'_thread.RLock' object has no attribute
  '_recursion_count'``): :func:`python_backend_env` puts this interpreter's own ``LIBDIR`` first on
  ``LD_LIBRARY_PATH`` before the server starts.
- PyTriton 0.7 needs numpy < 2, so it lives in an extra of its own; :func:`require_serve` says how
  to install it.
"""

from __future__ import annotations

import copy
import logging
import os
import signal
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vit_fast.dtypes import parse_dtype
from vit_fast.export.tritonserver import (
    DEFAULT_QUEUE_DELAY_US,
    check_model_name,
    model_io,
    plan_batching,
)
from vit_fast.model import VisionTransformer
from vit_fast.warmup import WarmupReport

SERVE_EXTRA = "pip install 'vit-fast[serve]'"
DEFAULT_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
#: the start-up race between PyTriton's model instances (see Server.start), and how often to try
HANDSHAKE_RACE = "get_config_from_handshake_server"
START_ATTEMPTS = 3
#: loopback by default: a server is reachable from other machines only when asked (--host 0.0.0.0)
DEFAULT_HOST = "127.0.0.1"


def require_serve() -> None:
    """An ImportError saying how to install the serve extra unless PyTriton, tritonclient and numpy < 2 are here."""
    try:
        import numpy
        import pytriton  # noqa: F401
        import tritonclient.grpc  # noqa: F401
        import tritonclient.http  # noqa: F401
    except ImportError as err:
        raise ImportError(
            f"vit-fast serve needs PyTriton and tritonclient: {SERVE_EXTRA} (it pins numpy < 2, so give it a "
            f"virtual environment of its own); import failed: {err}"
        ) from err
    if int(numpy.__version__.split(".")[0]) >= 2:
        raise ImportError(
            f"PyTriton 0.7 needs numpy < 2, and numpy {numpy.__version__} is installed here: {SERVE_EXTRA} in a "
            "virtual environment of its own (the extra pins numpy < 2)"
        )


def python_backend_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default ``os.environ``) with this interpreter's ``LIBDIR`` first on ``LD_LIBRARY_PATH``.

    Only where that folder holds this interpreter's shared ``libpython`` (a static build has none; the
    stub then needs a matching system libpython, and nothing here can help).
    """
    env = dict(os.environ if environ is None else environ)
    libdir = sysconfig.get_config_var("LIBDIR")
    soname = f"libpython{sys.version_info.major}.{sys.version_info.minor}.so.1.0"
    if not libdir or not (Path(libdir) / soname).exists():
        return env
    paths = [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p and p != libdir]
    env["LD_LIBRARY_PATH"] = os.pathsep.join([libdir, *paths])
    return env


@dataclass(frozen=True)
class Endpoints:
    """Where a running server answers: ``host:port`` for the clients, full URLs for health and metrics."""

    host: str
    http_port: int
    grpc_port: int
    metrics_port: int

    @property
    def http(self) -> str:
        return f"{self._client_host}:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"{self._client_host}:{self.grpc_port}"

    @property
    def health_url(self) -> str:
        return f"http://{self.http}/v2/health/ready"

    @property
    def metrics_url(self) -> str:
        return f"http://{self._client_host}:{self.metrics_port}/metrics"

    @property
    def _client_host(self) -> str:  # a server bound to every interface is reached on loopback from here
        return "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host


class Server:
    """A model served by Triton through PyTriton; ``start()`` returns once it answers, ``stop()`` ends it.

    - ``model``: a :class:`vit_fast.VisionTransformer`; it is served on CUDA with backend "auto" (our
      Triton kernels) where there is a GPU, else on the CPU with the torch backend, in ``dtype``.
    - ``batch``: batch sizes, e.g. ``(1, 8, 64)``: the largest is ``max_batch_size``, the others above 1
      the dynamic batcher's preferred sizes; ``queue_delay_us`` its ``max_queue_delay_microseconds``.
    - ``instances``: model instances Triton runs at once (each a thread calling the same module).
    - ``host`` and the ports: where HTTP, gRPC and metrics listen (loopback by default).
    - ``tune``: tune the kernels for the served batch sizes before serving, and serve tuned (see :meth:`warmup`).

    Use as a context manager, or ``start()`` / ``wait()`` / ``stop()``.
    """

    def __init__(
        self,
        model: VisionTransformer,
        name: str = "vit",
        batch: Sequence[int] | None = None,
        dtype: torch.dtype | str = torch.float32,
        instances: int = 1,
        queue_delay_us: int = DEFAULT_QUEUE_DELAY_US,
        host: str = DEFAULT_HOST,
        http_port: int = DEFAULT_PORTS["http"],
        grpc_port: int = DEFAULT_PORTS["grpc"],
        metrics_port: int = DEFAULT_PORTS["metrics"],
        verbose: bool = False,
        tune: bool = False,
    ) -> None:
        if not isinstance(model, VisionTransformer):
            raise TypeError(f"vit-fast serve serves a vit_fast.VisionTransformer, got {type(model).__name__}")
        self.name = check_model_name(name)
        # PyTriton's python-backend instances are CPU processes that hand each batch to this process
        self.batching = plan_batching(batch, instances, "cpu", queue_delay_us)
        ports = {"http": http_port, "grpc": grpc_port, "metrics": metrics_port}
        for what, port in ports.items():
            if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
                raise ValueError(f"{what} port must be an int in 1..65535, got {port!r}")
        if len(set(ports.values())) != len(ports):
            raise ValueError(f"HTTP, gRPC and metrics need three different ports, got {ports}")
        self.dtype = parse_dtype(dtype)
        if self.dtype == torch.bfloat16:
            raise ValueError(
                "vit-fast serve serves fp32 or fp16: Triton hands over numpy arrays, which have no bfloat16"
            )
        if not isinstance(tune, bool):
            raise TypeError(f"tune must be True or False, got {tune!r}")
        self.endpoints = Endpoints(host, http_port, grpc_port, metrics_port)
        self.verbose = verbose
        self.tune = tune
        #: what :meth:`warmup` did (None until the server starts)
        self.warmup_report: WarmupReport | None = None
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.backend = "auto" if self.device.type == "cuda" else "torch"
        self.model = copy.deepcopy(model).to(self.device, self.dtype).eval().set_backend(self.backend)
        self.input, self.output = model_io(model, self.dtype)
        self._triton: Any = None
        self._stop = threading.Event()
        #: Triton's own log (written by tritonserver; on stdout instead with ``verbose``)
        self.log_file: Path | None = None

    @property
    def description(self) -> str:
        where = "CUDA, triton kernels" if self.device.type == "cuda" else "CPU, torch backend"
        if self.device.type == "cuda" and self.tune:
            where += ", tuned"
        b = self.batching
        return (
            f"model {self.name!r} ({where}, {str(self.dtype).removeprefix('torch.')}): {self.input.name} "
            f"{list(self.input.dims)} -> {self.output.name} {list(self.output.dims)}, max batch {b.max_batch_size}, "
            f"preferred {list(b.preferred_batch_sizes) or '-'}, {b.instances} instance(s)"
        )

    @property
    def served_batch_sizes(self) -> list[int]:
        """The batch sizes warmed before serving: 1 (a lone request), the preferred sizes and the largest."""
        b = self.batching
        return sorted({1, *b.preferred_batch_sizes, b.max_batch_size})

    def warmup(self) -> WarmupReport:
        """Compile the kernels for every served batch size (tuned with ``tune``) before the server reports ready,
        so no first request of a batch size waits on it. Run once, in this thread, on the model every instance
        thread calls: the kernels' compiled and tuned configs are per process, and ``tune`` marks the model
        itself to run tuned (``model.autotune``), so the instance threads, whose tuning context is their own,
        find the same configs. Batch sizes between these are compiled when first formed (a few kernels,
        seconds; with ``tune`` a new shape class is tuned then)."""
        self.warmup_report = self.model.warmup(self.served_batch_sizes, tune=self.tune)
        return self.warmup_report

    def infer(self, images: Any) -> dict[str, Any]:
        """One batch as Triton's dynamic batcher formed it: ``images [B, C, H, W]`` -> ``{output: [B, N]}``."""
        import numpy as np

        want = (*self.input.dims,)
        if images.ndim != 4 or tuple(images.shape[1:]) != want or images.shape[0] < 1:
            # Triton checks shapes against the config first; this guards the model should that change
            raise ValueError(f"{self.input.name} must be [B >= 1, {', '.join(map(str, want))}], got {images.shape}")
        x = torch.from_numpy(np.ascontiguousarray(images)).to(self.device, self.dtype)
        with torch.inference_mode():
            y = self.model(x)
        return {self.output.name: y.cpu().numpy()}

    def start(self) -> Server:
        """Warm the model up (:meth:`warmup`), start Triton (in a process of its own), bind the model and wait
        until it answers.

        PyTriton 0.7 starts a model's instances in parallel, and a later instance may ask the first one
        for its configuration before that one listens (``ConnectionRefusedError`` in
        ``get_config_from_handshake_server``, seen here with 2 instances on a busy 2-core machine): that
        start-up is retried, up to ``START_ATTEMPTS`` times in all, and said so on stderr.
        """
        self.warmup()
        attempt = 1
        while True:
            try:
                return self._start_once()
            except Exception as err:
                if HANDSHAKE_RACE not in f"{err} {err.__cause__}" or attempt >= START_ATTEMPTS:
                    raise
                attempt += 1
                print(
                    f"[vit-fast serve] PyTriton's model instances raced at start-up ({HANDSHAKE_RACE}); "
                    f"starting again ({attempt}/{START_ATTEMPTS})",
                    file=sys.stderr,
                    flush=True,
                )

    def _start_once(self) -> Server:
        require_serve()
        import numpy as np
        from pytriton.decorators import batch
        from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
        from pytriton.triton import Triton, TritonConfig

        # the python-backend stub is started by tritonserver, which PyTriton starts with a copy of os.environ
        os.environ.update(python_backend_env())
        if not self.verbose:
            logging.getLogger("pytriton").setLevel(logging.WARNING)
            fd, log = tempfile.mkstemp(prefix=f"vit-fast-serve-{self.name}-", suffix=".log")
            os.close(fd)
            self.log_file = Path(log)
        np_dtype = np.float16 if self.dtype == torch.float16 else np.float32
        e = self.endpoints
        config = TritonConfig(
            http_address=e.host,
            http_port=e.http_port,
            grpc_address=e.host,
            grpc_port=e.grpc_port,
            metrics_address=e.host,
            metrics_port=e.metrics_port,
            allow_gpu_metrics=self.device.type == "cuda",
            log_verbose=1 if self.verbose else 0,
            log_file=self.log_file,
            exit_on_error=True,
        )
        infer = batch(self.infer)
        self._triton = Triton(config=config)
        try:
            self._triton.bind(
                model_name=self.name,
                infer_func=[infer] * self.batching.instances,
                inputs=[Tensor(name=self.input.name, dtype=np_dtype, shape=self.input.dims)],
                outputs=[Tensor(name=self.output.name, dtype=np_dtype, shape=self.output.dims)],
                config=ModelConfig(
                    max_batch_size=self.batching.max_batch_size,
                    batcher=DynamicBatcher(
                        preferred_batch_size=list(self.batching.preferred_batch_sizes) or None,
                        max_queue_delay_microseconds=self.batching.queue_delay_us,
                    ),
                ),
                strict=True,
            )
            self._triton.run()
        except BaseException as err:
            tail = self.log_tail()
            self.stop()
            if tail and not isinstance(err, KeyboardInterrupt):
                raise RuntimeError(f"Triton Inference Server did not start: {err}\nits log ends:\n{tail}") from err
            raise
        return self

    def alive(self) -> bool:
        return self._triton is not None and self._triton.is_alive()

    def wait(self, poll_s: float = 1.0) -> bool:
        """Block until SIGTERM / SIGINT (True: asked to stop) or until the server dies (False).

        Signal handlers can be installed only from the main thread; elsewhere it waits for :meth:`request_stop`.
        """
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda *_: self._stop.set())
        try:
            while not self._stop.wait(poll_s):
                if not self.alive():
                    return False
            return True
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def request_stop(self) -> None:
        """Make :meth:`wait` return (thread-safe; what the signal handlers call)."""
        self._stop.set()

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of Triton's log file ('' when it logs to stdout or wrote nothing)."""
        if self.log_file is None or not self.log_file.is_file():
            return ""
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, keep_log: bool = False) -> None:
        """Stop Triton and its python backend; waits for them to exit. Safe to call twice.

        Triton's log file is removed unless ``keep_log`` (kept to explain a failure)."""
        triton, self._triton = self._triton, None
        if triton is not None:
            triton.stop()
        if self.log_file is not None and not keep_log:
            self.log_file.unlink(missing_ok=True)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()


__all__ = ["DEFAULT_HOST", "DEFAULT_PORTS", "Endpoints", "SERVE_EXTRA", "Server", "python_backend_env", "require_serve"]
