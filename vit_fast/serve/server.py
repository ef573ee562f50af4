"""``vit-fast serve``'s :class:`Server`: one model behind a real Triton Inference Server, started through PyTriton
(the ``serve`` extra), with dynamic batching, HTTP and gRPC endpoints, health and Prometheus metrics. Triton's
process and python backend: :mod:`vit_fast.serve.backend`; where it answers: :mod:`vit_fast.serve.endpoints`; what
only its owner may do, and the choices that make the CPU path fast: docs/deploy.md.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from vit_fast.export.tritonserver import (
    DEFAULT_QUEUE_DELAY_US,
    check_model_name,
    model_io,
    plan_batching,
)
from vit_fast.model.vit import VisionTransformer
from vit_fast.model.warmup import WarmupReport
from vit_fast.serve.answers import RefusalLog, answer_each, answer_ragged, answer_stacked, forward_stacked
from vit_fast.serve.backend import (
    NO_TENSORSTORE,
    READY_TIMEOUT_S,
    SERVE_EXTRA,
    SHM_DIR,
    allow_ragged_batch,
    close_model_control,
    make_shm_private,
    patient_handshake,
    per_request_errors,
    probe_model,
    proxy_transport,
    python_backend_env,
    quiet_exit_warning,
    reap_backend_stubs,
    require_serve,
    run_triton,
)
from vit_fast.serve.checks import check_server_args, parse_served_dtype
from vit_fast.serve.declared import model_limits
from vit_fast.serve.encoded import DEFAULT_TOP_K, ENCODED_INPUT, ENCODED_MAX_BYTES, EncodedImages
from vit_fast.serve.endpoints import ACCESS_HEADERS, Endpoints, is_loopback, port_in_use, wait_for_200
from vit_fast.serve.front_process import FrontProcess, loopback_port
from vit_fast.serve.lifecycle import Restarts, private_folder
from vit_fast.serve.ports import claim_free_ports, release_ports
from vit_fast.serve.settings import (
    CPU_PREFERRED_BATCH,
    CPU_QUEUE_DELAY_US,
    DEFAULT_HOST,
    DEFAULT_PORTS,
    PROTECT_CHOICES,
    warn_openmp_spin,
)
from vit_fast.serve.threads import plan_threads
from vit_fast.serve.variable import check_variable_size

#: the start-up race between PyTriton's model instances (see Server.start), and how often to try
HANDSHAKE_RACE = "get_config_from_handshake_server"
START_ATTEMPTS = 3
#: seconds SIGTERM / stop() leaves in-flight requests to finish before Triton ends them (Triton's default is 30)
DRAIN_TIMEOUT_S = 10


class Server:
    """A :class:`vit_fast.VisionTransformer` served by Triton through PyTriton, on CUDA with our kernels where there is
    a GPU, else on the CPU with the torch backend, in ``dtype``. ``batch`` (e.g. ``(1, 8, 64)``): the largest is the
    maximum batch, the others above 1 preferred sizes; ``instances``: model instances (threads calling one module);
    ``variable_size``: any size up to ``max_image_size`` px a side; ``encoded``: image files in, logits and ``top_k``
    labels out. A context manager or start() / wait() / stop(); each argument: docs/deploy.md, "Serving from Python"."""

    def __init__(
        self,
        model: VisionTransformer,
        name: str = "vit",
        batch: Sequence[int] | None = None,
        dtype: torch.dtype | str = torch.float32,
        instances: int = 1,
        queue_delay_us: int | None = None,
        host: str = DEFAULT_HOST,
        http_port: int = DEFAULT_PORTS["http"],
        grpc_port: int = DEFAULT_PORTS["grpc"],
        metrics_port: int = DEFAULT_PORTS["metrics"],
        verbose: bool = False,
        tune: bool = False,
        threads: int | None = None,
        protect: str = "auto",
        variable_size: bool = False,
        max_image_size: int | None = None,
        encoded: bool = False,
        top_k: int = DEFAULT_TOP_K,
    ) -> None:
        if not isinstance(model, VisionTransformer):
            raise TypeError(f"vit-fast serve serves a vit_fast.VisionTransformer, got {type(model).__name__}")
        self.name = check_model_name(name)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if queue_delay_us is None:
            queue_delay_us = DEFAULT_QUEUE_DELAY_US if self.device.type == "cuda" else CPU_QUEUE_DELAY_US
        # PyTriton's python-backend instances are CPU processes that hand each batch to this process
        self.batching = plan_batching(batch, instances, "cpu", queue_delay_us)
        if batch is None and self.device.type != "cuda":  # see CPU_PREFERRED_BATCH
            self.batching = dataclasses.replace(self.batching, preferred_batch_sizes=CPU_PREFERRED_BATCH)
        check_server_args(
            {"http": http_port, "grpc": grpc_port, "metrics": metrics_port},
            tune,
            threads,
            protect,
            variable_size,
            max_image_size,
        )
        self.dtype = parse_served_dtype(dtype)
        #: the most torch intra-op threads a forward runs with, and on the CPU the tuner that picks how many of them
        #: the forwards take under the load of the moment (:func:`vit_fast.serve.threads.plan_threads`)
        self.threads, self.thread_tuner = plan_threads(threads, self.device, self.batching.instances, verbose)
        #: whether Triton's statistics, shared-memory, trace and logging APIs need the token (close_model_control)
        self.protected = protect == "on" or (protect == "auto" and not is_loopback(host))
        self._threads_before: int | None = None
        self.endpoints = Endpoints(host, http_port, grpc_port, metrics_port)
        self.verbose = verbose
        self.tune = tune
        #: what :meth:`warmup` did (None until the server starts)
        self.warmup_report: WarmupReport | None = None
        self.backend = "auto" if self.device.type == "cuda" else "torch"
        self.model = copy.deepcopy(model).to(self.device, self.dtype).eval().set_backend(self.backend)
        self.input, self.output = model_io(model, self.dtype)
        #: one image of the model's own size (what the ready check sends; what decides the transport)
        self.image_dims = self.input.dims
        #: the largest side of a variable-size image, in pixels (None: images of the model's own size only)
        self.max_image_size: int | None = None
        if variable_size:
            self.max_image_size = check_variable_size(self.model, max_image_size, self.dtype.itemsize)
            self.input = dataclasses.replace(self.input, dims=(self.image_dims[0], -1, -1))
        if encoded and variable_size:
            raise ValueError("--encoded serves the model's own image size: leave out --variable-size")
        #: the encoded-images side (None: float images in)
        self.encoded = EncodedImages(self.model, self.output.name, top_k) if encoded else None
        #: what the HTTP front lets through to Triton (:mod:`vit_fast.serve.front`), and the front itself
        enc = self.encoded is not None
        name, dims = (ENCODED_INPUT, (1,)) if enc else (self.input.name, self.input.dims)
        datatype = "BYTES" if enc else ("FP16" if self.dtype == torch.float16 else "FP32")
        size = 4 + ENCODED_MAX_BYTES if enc else self.dtype.itemsize
        self.limits = model_limits(name, datatype, dims, self.batching.max_batch_size, self.max_image_size, size)
        self.front: FrontProcess | None = None
        #: how PyTriton carries requests between Triton and this process (see :func:`proxy_transport`)
        self.transport = proxy_transport(math.prod(self.image_dims) * self.dtype.itemsize)
        self._triton: Any = None
        self._stop = threading.Event()
        #: the port locks this server holds (see check_ports), released by stop()
        self._port_locks: list[int] = []
        #: Triton's own log (written by tritonserver; on stdout instead with ``verbose``)
        self.log_file: Path | None = None
        #: the refused requests, a console line each at most once a second
        self.refusals = RefusalLog()
        #: this server's private folder (PyTriton's workspaces, Triton's logs; see private_folder), and its restarts
        self._folder: contextlib.ExitStack | None = None
        self._workdir: Path | None = None
        self._restarts = Restarts()
        self._token: str | None = None
        self._triton_http_port: int | None = None

    @property
    def description(self) -> str:
        where = "CUDA, triton kernels" if self.device.type == "cuda" else "CPU, torch backend"
        if self.device.type == "cuda" and self.tune:
            where += ", tuned"
        b = self.batching
        return (
            f"model {self.name!r} ({where}, {str(self.dtype).removeprefix('torch.')}): {self.input.name} "
            f"{list(self.input.dims)} -> {self.output.name} {list(self.output.dims)}, max batch {b.max_batch_size}, "
            f"{f'preferred {list(b.preferred_batch_sizes)}' if b.preferred_batch_sizes else 'no preferred size'}, "
            f"{b.instances} instance(s), "
            + (f"{self.threads} torch thread(s) each" if self.thread_tuner is None else self.thread_tuner.describe())
            + f", requests handed over as {self.transport}, HTTP through a front that refuses shapes over these limits"
            + (
                ""
                if self.max_image_size is None
                else f", images of any size up to {self.max_image_size} px a side, batched ragged into one packed "
                "forward"
            )
            + ("" if self.encoded is None else f", {self.encoded.describe()}")
        )

    @property
    def access_token(self) -> str | None:
        """The token Triton's protected APIs want in the ``triton-access-token`` header (None when they are open,
        or before :meth:`start`)."""
        if not self.protected or self._triton is None:
            return None
        return self._triton.get_access_token()

    def check_ports(self) -> None:
        """Claim the three ports for this server (a lock per port, held until :meth:`stop`), then make sure nothing
        listens on them, before the model warms up and Triton starts. Raises PortTaken (naming the port and the
        holder's pid) where another server of this user holds one, else an OSError naming the first port something
        else listens on and the flag that moves it (the locks released again). Claiming twice keeps the locks."""
        e = self.endpoints
        ports = {"HTTP": e.http_port, "gRPC": e.grpc_port, "metrics": e.metrics_port}
        self._port_locks = claim_free_ports(ports, e.host, self._port_locks)

    @property
    def served_batch_sizes(self) -> list[int]:
        """The batch sizes warmed before serving: 1 (a lone request), the preferred sizes and the largest."""
        b = self.batching
        return sorted({1, *b.preferred_batch_sizes, b.max_batch_size})

    def warmup(self) -> WarmupReport:
        """Compile the kernels for every served batch size (tuned with ``tune``) before the server reports ready, so
        no first request of a batch size waits on it; returns what it did. Run once, in this thread, on the model
        every instance thread calls (why that suffices: docs/deploy.md, section "Serving from Python: Server").
        Batch sizes between these are compiled when first formed (a few kernels, seconds; with ``tune`` a new shape
        class is tuned then)."""
        self.warmup_report = self.model.warmup(self.served_batch_sizes, tune=self.tune)
        if self.model.backend != "torch":  # kernels (the interpreter in tests) do not run on torch's threads
            self.thread_tuner = None
        return self.warmup_report

    def infer(self, images: Any) -> dict[str, Any]:
        """One batch as Triton's dynamic batcher formed it: ``images [B, C, H, W]`` -> ``{output: [B, N]}``."""
        return forward_stacked(self.model, images, self.input, self.output.name, self.thread_tuner)

    def answer(self, requests: Sequence[Any]) -> list[dict[str, Any]]:
        """PyTriton's list of requests, as Triton's dynamic batcher batched them -> one response per request, in order
        (:mod:`vit_fast.serve.answers`): a request the model cannot take gets its own error and fails only itself; a
        batch that fails answers each request with a message, never a traceback."""
        io, encoded, log = (self.input.name, self.output.name), self.encoded, self.refusals
        if self.max_image_size is not None:
            return answer_each(requests, io[1], lambda: self.infer_requests(requests), log)
        if encoded is not None:
            return answer_each(requests, io[1], lambda: encoded.answer(requests, self.infer, log), log)
        return answer_each(requests, io[1], lambda: answer_stacked(requests, *io, self.infer), log)

    def infer_requests(self, requests: Sequence[Any]) -> list[dict[str, Any]]:
        """A ragged batch as Triton's dynamic batcher formed it (``variable_size``): PyTriton's list of requests, each
        ``{input: [B_r, C, H_r, W_r]}`` -> one response per request, in order: ``{output: [B_r, N]}``, or its own
        error where the model cannot take it (:func:`vit_fast.serve.answers.answer_ragged`)."""
        io = (self.input.name, self.output.name)
        return answer_ragged(self.model, requests, io, self.max_image_size, self.thread_tuner, self.refusals)

    def start(self) -> Server:
        """Claim the ports (:meth:`check_ports`), warm the model up (:meth:`warmup`), start Triton (in a process of its
        own), bind the model, and return once ``/v2/models/NAME/ready`` answers 200 and one request went through the
        whole path; ``torch.set_num_threads(threads)`` holds until :meth:`stop`. A start-up that fails in PyTriton's
        instance race is retried, up to ``START_ATTEMPTS`` times in all, and said so on stderr (docs/deploy.md,
        section "How vit-fast serve adjusts PyTriton 0.7")."""
        self.check_ports()
        if self.device.type == "cpu" and self.threads > 1:
            warn_openmp_spin()
        try:
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(self.threads)
            self.warmup()
            attempt = 1
            while True:
                try:
                    self._start_once()
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
                    # the failed attempt's stop() gave torch its threads back
                    self._threads_before = torch.get_num_threads()
                    torch.set_num_threads(self.threads)
                else:
                    break
            self._wait_ready()
        except BaseException:
            self.stop()  # Triton, the front, torch's threads and the ports as they were
            raise
        return self

    def _start_once(self) -> Server:
        require_serve()
        import numpy as np
        from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
        from pytriton.triton import Triton, TritonConfig, TritonLifecyclePolicy, TritonSecurityConfig

        # the python-backend stub is started by tritonserver, which PyTriton starts with a copy of os.environ
        os.environ.update(python_backend_env())
        quiet_exit_warning()
        if self._workdir is None:  # this server's private folder, removed by stop()
            self._folder = contextlib.ExitStack()
            self._workdir = private_folder(self._folder, f"w999/{self.name}_0_99-server.sock")
        attempt = len(list(self._workdir.glob("[!.]*"))) + 1  # a new number: each start leaves its log there
        if not self.verbose:
            logging.getLogger("pytriton").setLevel(logging.WARNING)
            self.log_file = self._workdir / f"triton-{attempt}.log"
        np_dtype = np.float16 if self.dtype == torch.float16 else np.float32
        e = self.endpoints
        config = TritonConfig(
            http_address="127.0.0.1",  # behind the front, which listens on e.http_port
            http_port=self.triton_http_port,
            grpc_address=e.host,
            grpc_port=e.grpc_port,
            metrics_address=e.host,
            metrics_port=e.metrics_port,
            allow_gpu_metrics=self.device.type == "cuda",
            log_verbose=1 if self.verbose else 0,
            log_file=self.log_file,
            exit_on_error=True,
            exit_timeout_secs=DRAIN_TIMEOUT_S,
        )
        # open: [] restricts nothing (PyTriton's default list protects statistics and shared memory with a token);
        # model control is closed to every client either way (close_model_control). A restarted Triton keeps the
        # first one's token: clients read it from the ready JSON
        open_ = TritonSecurityConfig(restricted_endpoints=[])
        security = TritonSecurityConfig(access_token=self._token) if self.protected else open_
        self._token = security.access_token
        patient_handshake()
        # the model's files go to PyTriton's private model store when it is bound, and Triton loads them when it
        # starts: no load request is ever needed
        policy = TritonLifecyclePolicy(launch_triton_on_startup=True, local_model_store=True)
        where = self._workdir / f"w{attempt}"
        self._triton = Triton(config=config, security_config=security, triton_lifecycle_policy=policy, workspace=where)
        close_model_control(self._triton)
        # PyTriton reads the switch when the model is bound (this process) and when its stubs start (Triton's copy
        # of os.environ): set for both, then put back, so another PyTriton server in this process is not touched
        switch = {NO_TENSORSTORE: "1"} if self.transport == "base64" and not os.environ.get(NO_TENSORSTORE) else {}
        os.environ.update(switch)
        inputs = [Tensor(name=self.input.name, dtype=np_dtype, shape=self.input.dims)]
        outputs = [Tensor(name=self.output.name, dtype=np_dtype, shape=self.output.dims)]
        if self.encoded is not None:
            inputs, outputs = self.encoded.tensors(np_dtype)
        try:
            self._triton.bind(
                model_name=self.name,
                infer_func=[self.answer] * self.batching.instances,
                inputs=inputs,
                outputs=outputs,
                config=ModelConfig(
                    max_batch_size=self.batching.max_batch_size,
                    batcher=DynamicBatcher(
                        preferred_batch_size=list(self.batching.preferred_batch_sizes) or None,
                        max_queue_delay_microseconds=self.batching.queue_delay_us,
                    ),
                ),
                strict=False,  # a refused request's response carries its message, not the outputs (per_request_errors)
            )
            per_request_errors(self._triton, self.name)  # before Triton starts and loads the model
            if self.max_image_size is not None:  # before Triton starts and reads the config
                allow_ragged_batch(self._triton, self.name, self.input.name)
            run_triton(self._triton, f"http://127.0.0.1:{self.triton_http_port}/v2/health/ready", self.verbose)
            if self.front is None:  # once per server: it outlives a restarted Triton
                self.front = FrontProcess(e.host, e.http_port, self.triton_http_port, self.limits)
            if not self.front.alive():
                self.front.start()
        except BaseException as err:
            tail = self.log_tail()
            self._stop_serving()
            if tail and not isinstance(err, KeyboardInterrupt):
                raise RuntimeError(f"Triton Inference Server did not start: {err}\nits log ends:\n{tail}") from err
            raise
        finally:
            for key in switch:
                os.environ.pop(key, None)
        return self

    def _wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait until ``/v2/models/NAME/ready`` answers 200, then send one request of one image through HTTP (the
        model path, end to end); a TimeoutError / RuntimeError naming the URL otherwise."""
        wait_for_200(f"http://{self.endpoints.http}/v2/models/{self.name}/ready", timeout_s, "after Triton started")
        fp16 = self.dtype == torch.float16
        probe_model(self.endpoints.http, self.name, self.input.name, self.image_dims, fp16, self.encoded)

    @property
    def triton_http_port(self) -> int:
        """Where Triton's own HTTP listens, on loopback, behind the front (chosen once per server)."""
        if self._triton_http_port is None:
            self._triton_http_port = loopback_port()
        return self._triton_http_port

    def alive(self) -> bool:
        """Whether Triton and the HTTP front both run."""
        triton = self._triton is not None and self._triton.is_alive()
        return triton and self.front is not None and self.front.alive()

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
                if not self.alive() and not self._stop.is_set() and not self._restart():
                    return False
            return True
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _restart(self) -> bool:
        """Start Triton (or the HTTP front) again after it exited by itself, saying so; False (no restart) once it
        keeps dying (:class:`vit_fast.serve.lifecycle.Restarts`). Why it may die: docs/deploy.md, "Refused requests"."""
        triton = self._triton is not None and self._triton.is_alive()
        last = (self.log_tail(1) or "(its log is empty)").strip()[-300:]
        what = "the HTTP front" if triton else "Triton Inference Server"
        if not self._restarts.allow(f"{what} exited by itself" + ("" if triton else f" (its log ends: {last})")):
            return False
        if not triton:
            self._stop_serving()
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(self.threads)
            self._start_once()  # and the front, where it died too
        elif self.front is not None:
            self.front.start()
        self._wait_ready()
        print(f"[vit-fast serve] {what} restarted: serving again", file=sys.stderr, flush=True)
        return True

    def request_stop(self) -> None:
        """Make :meth:`wait` return (thread-safe; what the signal handlers call)."""
        self._stop.set()

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of Triton's log file ('' when it logs to stdout or wrote nothing)."""
        if self.log_file is None or not self.log_file.is_file():
            return ""
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Stop Triton and its python backend; waits for them to exit; then release the ports and remove this server's
        private folder (PyTriton's workspaces, Triton's logs). Safe to call twice."""
        try:
            self._stop_serving()  # Triton first: the requests it drains answer through the front
        finally:
            if self.front is not None:
                self.front.stop()
            release_ports(self._port_locks)
            if self.encoded is not None:
                self.encoded.close()
            folder, self._folder, self._workdir = self._folder, None, None
            if folder is not None:
                folder.close()
                if summary := self.refusals.summary():
                    print(summary, file=sys.stderr, flush=True)

    def _stop_serving(self) -> None:
        """:meth:`stop` but for the port locks (a start-up that is retried keeps them)."""
        triton, self._triton = self._triton, None
        if triton is not None:
            triton.stop()
            if left := reap_backend_stubs():
                print(f"[vit-fast serve] Triton's python-backend stubs {left} outlived it; ended them", file=sys.stderr)
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None
        tuner = self.thread_tuner
        if triton is not None and tuner is not None and tuner.trials:
            print(f"[vit-fast serve] {tuner.kept_summary()}", file=sys.stderr, flush=True)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()


__all__ = [
    "ACCESS_HEADERS",
    "DEFAULT_HOST",
    "DEFAULT_PORTS",
    "DRAIN_TIMEOUT_S",
    "Endpoints",
    "PROTECT_CHOICES",
    "SHM_DIR",
    "SERVE_EXTRA",
    "Server",
    "allow_ragged_batch",
    "close_model_control",
    "is_loopback",
    "make_shm_private",
    "port_in_use",
    "proxy_transport",
    "python_backend_env",
    "reap_backend_stubs",
    "require_serve",
]
