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

What only its owner may do stays with the owner:

- Triton runs with model control "none" (:func:`close_model_control`): no client can unload the model or load
  another one, token or not.
- Each port is locked for the server's life (:mod:`vit_fast.serve.ports`): a second ``vit-fast serve`` on the
  same port is refused before its warm-up and Triton's start, naming the owner's pid.
- The shared-memory blocks Triton's python backend makes for requests and responses are made private to this
  user once Triton started, before the first request (:func:`make_shm_private`).

Three choices make the CPU path as fast as it measured best (each measured with perf_analyzer against a plain
PyTriton script; see vit_fast.serve.settings): torch's OpenMP threads stop spinning soon after each op
(``GOMP_SPINCOUNT``, set by ``vit-fast serve`` before torch loads; a server started where it is unset says so), the
dynamic batcher has no preferred size, and small images travel inside PyTriton's messages (:func:`proxy_transport`).
"""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import logging
import math
import os
import signal
import socket
import stat
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from glob import escape as glob_escape
from pathlib import Path
from typing import Any

import torch

from vit_fast import runtime
from vit_fast.dtypes import parse_dtype
from vit_fast.env import install_hint
from vit_fast.export.tritonserver import (
    DEFAULT_QUEUE_DELAY_US,
    check_model_name,
    model_io,
    plan_batching,
)
from vit_fast.model import VisionTransformer
from vit_fast.serve.ports import claim_ports, release_ports
from vit_fast.serve.settings import (
    BASE64_MAX_IMAGE_BYTES,
    CPU_PREFERRED_BATCH,
    CPU_QUEUE_DELAY_US,
    DEFAULT_HOST,
    DEFAULT_PORTS,
    OPENMP_SPIN_COUNT,
    OPENMP_SPIN_VARS,
    PROTECT_CHOICES,
)
from vit_fast.serve.threads import ThreadTuner
from vit_fast.warmup import WarmupReport

SERVE_EXTRA = install_hint("serve")
#: PyTriton 0.7's switch from its shared-memory tensor store to base64 in its messages (see proxy_transport)
NO_TENSORSTORE = "PYTRITON_NO_TENSORSTORE"
#: the start-up race between PyTriton's model instances (see Server.start), and how often to try
HANDSHAKE_RACE = "get_config_from_handshake_server"
START_ATTEMPTS = 3
#: the handshake's wait in the proxy code PyTriton 0.7 sends to Triton with each model, and how long ours waits
HANDSHAKE_WAIT = ("def get_config_from_handshake_server(socket_path: pathlib.Path, timeout_s: float = 1.0)", 60.0)
#: the headers a client sends the token in (Triton's names; perf_analyzer passes ``-H`` on HTTP only)
ACCESS_HEADERS = {"http": "triton-access-token", "grpc": "triton-grpc-protocol-triton-access-token"}
#: seconds SIGTERM / stop() leaves in-flight requests to finish before Triton ends them (Triton's default is 30)
DRAIN_TIMEOUT_S = 10
#: seconds start() waits for /v2/models/NAME/ready after Triton started
READY_TIMEOUT_S = 120.0
#: where POSIX shared-memory blocks live on Linux (shm_open's folder)
SHM_DIR = Path("/dev/shm")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable from this machine only."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip()).is_loopback
    except ValueError:
        return False


def _processes() -> dict[int, tuple[int, str]]:
    """Every process this user can see: pid -> (parent pid, command line); empty where there is no /proc."""
    found = {}
    for entry in Path("/proc").glob("[0-9]*") if Path("/proc").is_dir() else ():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile, or not ours to read
        found[int(entry.name)] = (ppid, cmdline)
    return found


def reap_backend_stubs(owner_pid: int | None = None, grace_s: float = 3.0) -> list[int]:
    """End the python-backend stubs Triton started for this process's models, with their children, when they
    outlive Triton; returns the pids that had to be ended.

    Seen here: after SIGTERM under load, tritonserver exited but both stubs of a 2-instance model stayed (they
    ignore SIGTERM), with their shared-memory blocks (``/dev/shm/psm_*``) held. PyTriton names each stub's
    shared-memory region ``pytrtion<pid>-...`` after the process that started the server, which is how ours are
    told apart from any other server's. SIGTERM, then SIGKILL after ``grace_s``; once a stub is gone its
    ``multiprocessing`` resource tracker unlinks the blocks it tracked, and this waits (``grace_s`` more) for that.
    """
    marker = f"pytrtion{os.getpid() if owner_pid is None else owner_pid}-"
    procs = _processes()
    stubs = {pid for pid, (_, cmd) in procs.items() if "triton_python_backend_stub" in cmd and marker in cmd}
    doomed = set(stubs)
    while True:  # their descendants (PyTriton's proxy process, its resource tracker)
        more = {pid for pid, (ppid, _) in procs.items() if ppid in doomed} - doomed
        if not more:
            break
        doomed |= more
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in stubs:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in doomed):
            time.sleep(0.1)
    return sorted(stubs)


def patient_handshake() -> None:
    """Let a model's later instances wait up to ``HANDSHAKE_WAIT[1]`` s (not 1 s) for the first one's handshake.

    The cause of the start-up race (see :meth:`Server.start`): PyTriton 0.7 starts a model's instances at once,
    and every instance but the first asks the first, over ``NAME-config.sock``, for its configuration, giving up
    after 1 s (``get_config_from_handshake_server(..., timeout_s=1.0)`` in ``pytriton/proxy/communication.py``).
    On a busy machine the first instance takes longer than that to start (seen here: 3 failed starts in a row
    with 2 instances while other servers started). That code runs in Triton's python-backend stubs, which read it
    from the model's folder in PyTriton's model store, where ``Model.generate_model`` copies it when the model is
    bound; this wraps that method so the copy's default reads 60 s. Exact-text replacement: another PyTriton
    version's file goes unchanged (and the retry in :meth:`Server.start` remains). Idempotent; only the model
    stores of this process change."""
    from pytriton.models.model import Model

    from vit_fast.files import claim, write_atomic

    if getattr(Model.generate_model, "_vit_fast_patient", False):
        return
    original = Model.generate_model
    old, wait_s = HANDSHAKE_WAIT
    new = old.replace("timeout_s: float = 1.0", f"timeout_s: float = {wait_s}")

    def generate_model(self, model_repository: Path) -> None:
        original(self, model_repository)
        script = Path(model_repository) / self.model_name / str(self.model_version) / "communication.py"
        text = script.read_text()
        if old in text:
            claim(script)  # PyTriton's copy in this server's own workspace, just read: that file may be replaced
            write_atomic(script, text.replace(old, new))

    generate_model._vit_fast_patient = True
    generate_model.__wrapped__ = original
    Model.generate_model = generate_model


def close_model_control(triton: Any) -> None:
    """Make ``triton`` (PyTriton 0.7's ``Triton``, made with a local model store and not started yet) run Triton
    with model control "none": Triton loads the models in its repository when it starts and refuses every load
    and unload request after that, over HTTP and gRPC, with or without an access token ("explicit model load /
    unload is not allowed").

    Why not PyTriton's way: it runs Triton in "explicit" mode and loads each model through that API, which then
    stays open to every client that reaches the port (on loopback: every local user) unless an access token
    restricts it, and Triton takes its token on its command line only, where every local user reads it (``ps``).
    Open, the API takes the model down (unload, while the server runs on and answers "not ready") and loads
    models whose files come with the request: Triton's python backend runs such a model's code as this user.
    A RuntimeError where PyTriton's server settings are not where 0.7 keeps them: never an open API silently."""
    config = getattr(triton, "_triton_server_config", None)
    policy = getattr(triton, "_triton_lifecycle_policy", None)
    if config is None or not getattr(policy, "local_model_store", False):
        raise RuntimeError(
            "vit-fast serve cannot close Triton's model-control API with this PyTriton (its server settings are not "
            f"where PyTriton 0.7 keeps them): {SERVE_EXTRA} (it pins nvidia-pytriton 0.7.0)"
        )
    config["model-control-mode"] = "none"
    config["load-model"] = None  # Triton refuses --load-model outside "explicit": every model loads at start


def make_shm_private(prefix: str, shm_dir: Path = SHM_DIR) -> list[Path]:
    """Give the shared-memory blocks in ``shm_dir`` whose names start with ``prefix`` mode 0600; returns them.

    Triton's python backend makes one block per model instance (``pytrtion<pid>-...``, PyTriton's prefix) and
    carries every request and response through it between tritonserver and the instance's stub. It sets their
    mode itself (``fchmod`` to 0644 after ``shm_open``), so a umask cannot narrow them and PyTriton has no
    setting for it: they are narrowed here, once Triton has loaded the model (which makes them) and before the
    first request. Only this user's regular files are touched (``lstat``, opened without following a link)."""
    narrowed = []
    for path in sorted(shm_dir.glob(f"{glob_escape(prefix)}*")):
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                continue
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue  # gone meanwhile
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
        narrowed.append(path)
    return narrowed


def port_in_use(host: str, port: int) -> bool:
    """Whether a listening socket on ``host:port`` exists now (a socket left in TIME_WAIT does not count)."""
    bind_host = "" if host in ("0.0.0.0", "") else host
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((bind_host, port))
        except OSError:
            return True
    return False


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


def proxy_transport(image_bytes: int, environ: dict[str, str] | None = None) -> str:
    """How PyTriton carries each request between Triton's python-backend stub and this process, for images of
    ``image_bytes``: ``"base64"`` inside its messages when an image is at most ``BASE64_MAX_IMAGE_BYTES`` (or when
    ``PYTRITON_NO_TENSORSTORE`` is set in ``environ``, default ``os.environ``, already), else ``"tensor store"``
    (its shared memory). Why: see :data:`vit_fast.serve.settings.BASE64_MAX_IMAGE_BYTES`."""
    if isinstance(image_bytes, bool) or not isinstance(image_bytes, int) or image_bytes < 1:
        raise ValueError(f"image_bytes must be an int >= 1, got {image_bytes!r}")
    if (os.environ if environ is None else environ).get(NO_TENSORSTORE):
        return "base64"
    return "base64" if image_bytes <= BASE64_MAX_IMAGE_BYTES else "tensor store"


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


def _answers_200(url: str, timeout_s: float, since: str, alive: Any = None) -> None:
    """Poll ``url`` until it answers 200: a TimeoutError naming it after ``timeout_s`` seconds (``since``: from
    when, for the message), a RuntimeError at once when ``alive()`` (tritonserver's process) says it ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        if alive is not None and not alive():
            raise RuntimeError("tritonserver exited during its start-up")
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer 200 within {timeout_s:g} s {since}")
        time.sleep(0.2)


class Server:
    """A model served by Triton through PyTriton; ``start()`` returns once it answers, ``stop()`` ends it.

    - ``model``: a :class:`vit_fast.VisionTransformer`; it is served on CUDA with backend "auto" (our
      Triton kernels) where there is a GPU, else on the CPU with the torch backend, in ``dtype``.
    - ``batch``: batch sizes, e.g. ``(1, 8, 64)``: the largest is ``max_batch_size``, the others above 1
      the dynamic batcher's preferred sizes (default: 64 and none on the CPU, ``CPU_PREFERRED_BATCH``, so all
      that is queued goes into one forward; 8 and 64 on CUDA); ``queue_delay_us`` its
      ``max_queue_delay_microseconds`` (default: ``CPU_QUEUE_DELAY_US`` (0) on the CPU, where waiting only adds
      latency, the export default on CUDA).
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
        queue_delay_us: int | None = None,
        host: str = DEFAULT_HOST,
        http_port: int = DEFAULT_PORTS["http"],
        grpc_port: int = DEFAULT_PORTS["grpc"],
        metrics_port: int = DEFAULT_PORTS["metrics"],
        verbose: bool = False,
        tune: bool = False,
        threads: int | None = None,
        protect: str = "auto",
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
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be an int >= 1 (torch intra-op threads per instance), got {threads!r}")
        if protect not in PROTECT_CHOICES:
            raise ValueError(f"protect must be one of {PROTECT_CHOICES}, got {protect!r}")
        #: the most torch intra-op threads a forward runs with. ``threads`` fixes it. Else on the CPU the cores
        #: shared between the instances, and :attr:`thread_tuner` picks how many of them the forwards take under
        #: the load of the moment (see vit_fast.serve.threads); on a GPU the cores left beside Triton's own
        #: processes (see vit_fast.runtime.intra_op_threads)
        self.thread_tuner: ThreadTuner | None = None
        if threads is not None:
            self.threads = threads
        elif self.device.type == "cuda":
            self.threads = runtime.intra_op_threads(self.batching.instances)
        else:
            self.threads = runtime.intra_op_threads(self.batching.instances, reserve=0)
            if self.threads > 1:
                say = (lambda line: print(f"[vit-fast serve] {line}", file=sys.stderr, flush=True)) if verbose else None
                self.thread_tuner = ThreadTuner(self.threads, on_trial=say)
        #: whether Triton's statistics, shared-memory, trace and logging APIs need the token (model control is
        #: closed to every client either way: close_model_control)
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
        #: how PyTriton carries requests between Triton and this process (see :func:`proxy_transport`)
        self.transport = proxy_transport(math.prod(self.input.dims) * self.dtype.itemsize)
        self._triton: Any = None
        self._stop = threading.Event()
        #: the port locks this server holds (see check_ports), released by stop()
        self._port_locks: list[int] = []
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
            f"{f'preferred {list(b.preferred_batch_sizes)}' if b.preferred_batch_sizes else 'no preferred size'}, "
            f"{b.instances} instance(s), "
            + (f"{self.threads} torch thread(s) each" if self.thread_tuner is None else self.thread_tuner.describe())
            + f", requests handed over as {self.transport}"
        )

    @property
    def access_token(self) -> str | None:
        """The token Triton's protected APIs want in the ``triton-access-token`` header (None when they are open,
        or before :meth:`start`)."""
        if not self.protected or self._triton is None:
            return None
        return self._triton.get_access_token()

    def check_ports(self) -> None:
        """Claim the three ports for this server, then make sure nothing listens on them: before the model warms
        up and Triton starts (which would fail only after its start-up).

        The claim is a lock per port held until :meth:`stop` (:mod:`vit_fast.serve.ports`): of two servers of
        this user started at once on a port, one holds it and the other gets a PortTaken naming the port and
        the holder's pid. Then an OSError names the first port something else (another user's server, another
        program) listens on, and the flag that moves it; the locks are released again then. Claiming twice
        keeps the locks."""
        e = self.endpoints
        ports = {"HTTP": e.http_port, "gRPC": e.grpc_port, "metrics": e.metrics_port}
        if not self._port_locks:
            self._port_locks = claim_ports(ports)
        for what, port in ports.items():
            if port_in_use(e.host, port):
                release_ports(self._port_locks)
                flag = f"--{what.lower()}-port"
                raise OSError(
                    f"{what} port {port} on {e.host} is already in use (another server, or another program): stop "
                    f"it, or pick a free port with {flag}"
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
        if self.model.backend != "torch":  # kernels (the interpreter in tests) do not run on torch's threads
            self.thread_tuner = None
        return self.warmup_report

    def infer(self, images: Any) -> dict[str, Any]:
        """One batch as Triton's dynamic batcher formed it: ``images [B, C, H, W]`` -> ``{output: [B, N]}``."""
        import numpy as np

        want = (*self.input.dims,)
        if images.ndim == 4 and images.shape[0] == 0:
            raise ValueError(f"empty batch: {self.input.name} has 0 images (shape {list(images.shape)}); send >= 1")
        if images.ndim != 4 or tuple(images.shape[1:]) != want or images.shape[0] < 1:
            # Triton checks shapes against the config first; this guards the model should that change
            raise ValueError(f"{self.input.name} must be [B >= 1, {', '.join(map(str, want))}], got {images.shape}")
        x = torch.from_numpy(np.ascontiguousarray(images)).to(self.device, self.dtype)
        tuner = self.thread_tuner
        if tuner is None:
            with torch.inference_mode():
                y = self.model(x)
            return {self.output.name: y.cpu().numpy()}
        threads = tuner.threads_for(len(x))
        try:
            if torch.get_num_threads() != threads:  # torch's count is per thread: each instance sets its own
                torch.set_num_threads(threads)
            with torch.inference_mode():
                y = self.model(x)
        finally:
            tuner.finished()
        return {self.output.name: y.numpy()}

    def start(self) -> Server:
        """Warm the model up (:meth:`warmup`), start Triton (in a process of its own), bind the model and wait
        until it answers.

        PyTriton 0.7 starts a model's instances in parallel, and a later instance may ask the first one
        for its configuration before that one listens (``ConnectionRefusedError`` in
        ``get_config_from_handshake_server``, seen here with 2 instances on a busy 2-core machine): that
        start-up is retried, up to ``START_ATTEMPTS`` times in all, and said so on stderr.

        The ports are claimed and busy ones refused first (:meth:`check_ports`);
        ``torch.set_num_threads(threads)`` holds until :meth:`stop`. It returns only once ``/v2/models/NAME/ready``
        answers 200 (``/v2/health/ready`` answers before the model is loaded) and one request went through the
        whole path.
        """
        self.check_ports()
        if self.device.type == "cpu" and self.threads > 1 and not any(os.environ.get(v) for v in OPENMP_SPIN_VARS):
            print(
                f"[vit-fast serve] torch's OpenMP threads spin on after each op (GOMP_SPINCOUNT unset: libgomp's "
                f"300,000 rounds), on the cores Triton needs for the next request: set GOMP_SPINCOUNT="
                f"{OPENMP_SPIN_COUNT} before Python imports torch (vit-fast serve does), or serve with threads=1",
                file=sys.stderr,
                flush=True,
            )
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
            self.stop()  # Triton, torch's threads and the ports as they were
            raise
        return self

    def _start_once(self) -> Server:
        require_serve()
        import numpy as np
        from pytriton.decorators import batch
        from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
        from pytriton.triton import Triton, TritonConfig, TritonLifecyclePolicy, TritonSecurityConfig

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
            exit_timeout_secs=DRAIN_TIMEOUT_S,
        )
        # open: [] restricts nothing (PyTriton's default list protects statistics and shared memory with a token);
        # model control is closed to every client either way (close_model_control)
        security = TritonSecurityConfig() if self.protected else TritonSecurityConfig(restricted_endpoints=[])
        infer = batch(self.infer)
        patient_handshake()
        # the model's files go to PyTriton's private model store when it is bound, and Triton loads them when it
        # starts: no load request is ever needed
        local_store = TritonLifecyclePolicy(launch_triton_on_startup=True, local_model_store=True)
        self._triton = Triton(config=config, security_config=security, triton_lifecycle_policy=local_store)
        close_model_control(self._triton)
        # PyTriton reads the switch when the model is bound (this process) and when its stubs start (Triton's copy
        # of os.environ): set for both, then put back, so another PyTriton server in this process is not touched
        switch = {NO_TENSORSTORE: "1"} if self.transport == "base64" and not os.environ.get(NO_TENSORSTORE) else {}
        os.environ.update(switch)
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
            self._run_triton()
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

    def _run_triton(self) -> None:
        """Start tritonserver, wait until it answers (or fail at once with its log when it exits during its start:
        PyTriton would wait its full 120 s), connect PyTriton's side of the model, and make the request blocks
        private (:func:`make_shm_private`). PyTriton 0.7's ``run()`` is ``_run_server()`` then ``connect()``."""
        self._triton._run_server()
        self._quiet_triton_stdout()
        process = self._triton._triton_server
        _answers_200(self.endpoints.health_url, READY_TIMEOUT_S, "of Triton's start", alive=process.is_alive)
        self._triton.connect()
        prefix = self._triton._python_backend_config["shm-region-prefix-name"] or f"pytrtion{os.getpid()}-"
        make_shm_private(prefix)

    def _quiet_triton_stdout(self) -> None:
        """Triton logs to :attr:`log_file`; what tritonserver still writes on its stdout (the "Signal (2)
        received." of every stop) PyTriton 0.7 echoes to ours unless its server process is told otherwise (a
        private flag, ``TritonServer._verbose``: left alone where it is missing). PyTriton keeps the lines in its
        own record either way; ``verbose`` shows them as before."""
        process = getattr(self._triton, "_triton_server", None)
        if not self.verbose and process is not None and hasattr(process, "_verbose"):
            process._verbose = False

    def _wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait until ``/v2/models/NAME/ready`` answers 200, then send one request of one image through HTTP (the
        model path, end to end); a TimeoutError / RuntimeError naming the URL otherwise."""
        _answers_200(f"http://{self.endpoints.http}/v2/models/{self.name}/ready", timeout_s, "after Triton started")
        import numpy as np
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(self.endpoints.http)
        try:
            dtype = "FP16" if self.dtype == torch.float16 else "FP32"
            image = np.zeros((1, *self.input.dims), dtype=np.float16 if dtype == "FP16" else np.float32)
            request = httpclient.InferInput(self.input.name, list(image.shape), dtype)
            request.set_data_from_numpy(image)
            client.infer(self.name, [request])
        finally:
            client.close()

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
        """Stop Triton and its python backend; waits for them to exit; then release the ports. Safe to call twice.

        Triton's log file is removed unless ``keep_log`` (kept to explain a failure)."""
        try:
            self._stop_serving(keep_log)
        finally:
            release_ports(self._port_locks)

    def _stop_serving(self, keep_log: bool = False) -> None:
        """:meth:`stop` but for the port locks (a start-up that is retried keeps them)."""
        triton, self._triton = self._triton, None
        if triton is not None:
            triton.stop()
            left = reap_backend_stubs()
            if left:
                print(
                    f"[vit-fast serve] Triton's python-backend stubs {left} outlived it; ended them",
                    file=sys.stderr,
                    flush=True,
                )
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None
        tuner = self.thread_tuner
        if triton is not None and tuner is not None and tuner.trials:
            kept = [k for _, k, _ in tuner.trials]
            counts = ", ".join(f"{t}: {kept.count(t)}" for t in tuner.counts)
            print(
                f"[vit-fast serve] torch threads kept per trial (of the last {len(kept)}): {counts}",
                file=sys.stderr,
                flush=True,
            )
        if self.log_file is not None and not keep_log:
            self.log_file.unlink(missing_ok=True)

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
    "close_model_control",
    "is_loopback",
    "make_shm_private",
    "port_in_use",
    "proxy_transport",
    "python_backend_env",
    "reap_backend_stubs",
    "require_serve",
]
