"""Triton's process and its python backend as vit-fast serve runs them through PyTriton 0.7: the serve extra's
check, the environment the backend stub needs, how requests travel, the start-up handshake, a ragged input for
variable-size images, an error per request, model control closed, request blocks made private, and the stubs that
outlive Triton ended."""

from __future__ import annotations

import os
import signal
import stat
import sys
import sysconfig
import time
from glob import escape as glob_escape
from pathlib import Path
from typing import Any

from vit_fast.backend.env import install_hint
from vit_fast.serve.endpoints import wait_for_200
from vit_fast.serve.settings import BASE64_MAX_IMAGE_BYTES, REFUSED_KEY

SERVE_EXTRA = install_hint("serve")
#: PyTriton 0.7's switch from its shared-memory tensor store to base64 in its messages (see proxy_transport)
NO_TENSORSTORE = "PYTRITON_NO_TENSORSTORE"
#: the handshake's wait in the proxy code PyTriton 0.7 sends to Triton with each model, and how long ours waits
HANDSHAKE_WAIT = ("def get_config_from_handshake_server(socket_path: pathlib.Path, timeout_s: float = 1.0)", 60.0)
#: where PyTriton 0.7's stub turns each request's response into Triton's (its ``model.py``), and the lines put first
#: there so that a response carrying :data:`REFUSED_KEY` becomes that request's own error (see per_request_errors)
WRAP_RESPONSE = "def _wrap_response(response: Response, requested_outputs_names, model_outputs_dict):\n"
REFUSAL_LINES = (
    f"    if response.data is not None and {REFUSED_KEY!r} in response.data:  # vit-fast serve: this request's error\n"
    f"        message = response.data[{REFUSED_KEY!r}].tobytes().decode('utf-8', 'replace')\n"
    "        return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))\n"
)
#: seconds start() waits for /v2/models/NAME/ready after Triton started
READY_TIMEOUT_S = 120.0
#: where POSIX shared-memory blocks live on Linux (shm_open's folder)
SHM_DIR = Path("/dev/shm")


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
    """End the python-backend stubs Triton started for the models of process ``owner_pid`` (default: this one), with
    their children, when they outlive Triton: SIGTERM, then SIGKILL after ``grace_s`` seconds, then up to ``grace_s``
    more for their shared memory to go. Returns the pids of the stubs that had to be ended. Why and how ours are told
    apart: docs/deploy.md, section "How vit-fast serve adjusts PyTriton 0.7"."""
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
    """Let a model's later instances wait up to ``HANDSHAKE_WAIT[1]`` s (not 1 s) for the first one's handshake:
    wraps PyTriton 0.7's ``Model.generate_model`` so the ``communication.py`` it copies into the model store reads
    that default. Exact-text replacement (another PyTriton version's file goes unchanged); idempotent; only the model
    stores of this process change. Why: docs/deploy.md, section "How vit-fast serve adjusts PyTriton 0.7"."""
    from pytriton.models.model import Model

    from vit_fast.util.files import claim, write_atomic

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
    with model control "none": it loads its repository's models at start and refuses every load and unload request
    after that. A RuntimeError where PyTriton's server settings are not where 0.7 keeps them: never an open API
    silently. Why not PyTriton's way: docs/deploy.md, section "How vit-fast serve adjusts PyTriton 0.7"."""
    config = getattr(triton, "_triton_server_config", None)
    policy = getattr(triton, "_triton_lifecycle_policy", None)
    if config is None or not getattr(policy, "local_model_store", False):
        raise RuntimeError(
            "vit-fast serve cannot close Triton's model-control API with this PyTriton (its server settings are not "
            f"where PyTriton 0.7 keeps them): {SERVE_EXTRA} (it pins nvidia-pytriton 0.7.0)"
        )
    config["model-control-mode"] = "none"
    config["load-model"] = None  # Triton refuses --load-model outside "explicit": every model loads at start


def allow_ragged_batch(triton: Any, model_name: str, input_name: str) -> Path:
    """Declare ``input_name`` of ``model_name`` ragged (``allow_ragged_batch: true``) in the ``config.pbtxt`` PyTriton
    0.7 wrote to its local model store when the model was bound (call it after ``bind``, before Triton starts);
    returns that file. A RuntimeError where the store or the input is not where PyTriton 0.7 puts them: never
    variable-size requests served one shape at a time silently. Why: docs/deploy.md, section "How vit-fast serve
    adjusts PyTriton 0.7"."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from vit_fast.util.files import claim, write_atomic

    store = getattr(getattr(triton, "_workspace", None), "model_store_path", None)
    config = Path(store) / model_name / "config.pbtxt" if store is not None else None
    if config is None or not config.is_file():
        raise RuntimeError(
            f"vit-fast serve cannot declare {input_name!r} ragged with this PyTriton (no {model_name}/config.pbtxt "
            f"where PyTriton 0.7 keeps its model store): {SERVE_EXTRA} (it pins nvidia-pytriton 0.7.0)"
        )
    parsed = text_format.Parse(config.read_text(), model_config_pb2.ModelConfig())
    found = [spec for spec in parsed.input if spec.name == input_name]
    if len(found) != 1:
        raise RuntimeError(f"{config} declares no input {input_name!r} (inputs: {[s.name for s in parsed.input]})")
    found[0].allow_ragged_batch = True
    claim(config)  # PyTriton's copy in this server's own workspace, just read: that file may be replaced
    write_atomic(config, text_format.MessageToString(parsed))
    return config


def per_request_errors(triton: Any, model_name: str) -> Path:
    """Make the stub of ``model_name`` (the ``model.py`` PyTriton 0.7 copied to its local model store when the model
    was bound; call it after ``bind``, before Triton starts) answer a response carrying :data:`REFUSED_KEY` with that
    request's own error, so one refused request fails only itself in a batch; returns that file. Exact-text change;
    a RuntimeError where the file or the text is not what PyTriton 0.7 writes: never a refusal lost silently. Why:
    docs/deploy.md, section "Refused requests"."""
    from vit_fast.util.files import claim, write_atomic

    store = getattr(getattr(triton, "_workspace", None), "model_store_path", None)
    scripts = sorted(Path(store).glob(f"{glob_escape(model_name)}/[0-9]*/model.py")) if store is not None else []
    text = scripts[0].read_text() if len(scripts) == 1 else ""
    if text.count(WRAP_RESPONSE) != 1:
        raise RuntimeError(
            f"vit-fast serve cannot answer each request of a batch on its own with this PyTriton (no {model_name}/"
            f"VERSION/model.py with PyTriton 0.7's _wrap_response in its model store): {SERVE_EXTRA} (it pins "
            "nvidia-pytriton 0.7.0)"
        )
    if REFUSAL_LINES not in text:
        claim(scripts[0])  # PyTriton's copy in this server's own workspace, just read: that file may be replaced
        write_atomic(scripts[0], text.replace(WRAP_RESPONSE, WRAP_RESPONSE + REFUSAL_LINES))
    return scripts[0]


def make_shm_private(prefix: str, shm_dir: Path = SHM_DIR) -> list[Path]:
    """Give the shared-memory blocks in ``shm_dir`` whose names start with ``prefix`` mode 0600; returns them. Call it
    once Triton has loaded the model (which makes them) and before the first request. Only this user's regular files
    are touched (``lstat``, opened without following a link). Why: docs/deploy.md, section "How vit-fast serve
    adjusts PyTriton 0.7"."""
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


class _RequestedStop:
    """A logging filter that drops PyTriton 0.7's "Triton Inference Server exited with failure", which it logged on a
    requested stop too (seen after SIGTERM); vit-fast serve says itself when Triton exits without being asked
    (:class:`vit_fast.serve.lifecycle.Restarts`)."""

    def filter(self, record: Any) -> bool:
        return "exited with failure" not in str(record.msg)


def quiet_exit_warning() -> None:
    """Install :class:`_RequestedStop` on PyTriton's server logger (once)."""
    import logging

    logger = logging.getLogger("pytriton.server.triton_server")
    if not any(isinstance(f, _RequestedStop) for f in logger.filters):
        logger.addFilter(_RequestedStop())


def probe_model(http: str, name: str, input_name: str, image_dims: Any, fp16: bool, encoded: Any = None) -> None:
    """One request of one zero image (with ``encoded``: its :meth:`ready_input`) to model ``name`` at ``http``
    (``host:port``), through HTTP: the model path end to end; raises what tritonclient raises."""
    import numpy as np
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(http)
    try:
        image = np.zeros((1, *image_dims), dtype=np.float16 if fp16 else np.float32)
        request = httpclient.InferInput(input_name, list(image.shape), "FP16" if fp16 else "FP32")
        request.set_data_from_numpy(image)
        client.infer(name, [request if encoded is None else encoded.ready_input(httpclient)])
    finally:
        client.close()


def run_triton(triton: Any, health_url: str, verbose: bool) -> None:
    """Start tritonserver, wait until ``health_url`` answers (or fail at once with its log when it exits during its
    start: PyTriton would wait its full 120 s), connect PyTriton's side of the model, and make the request blocks
    private (:func:`make_shm_private`): PyTriton 0.7's ``run()`` is ``_run_server()`` then ``connect()``. Unless
    ``verbose``, tritonserver's stdout is not echoed to ours (docs/deploy.md, section "How vit-fast serve adjusts
    PyTriton 0.7")."""
    triton._run_server()
    process = getattr(triton, "_triton_server", None)
    if not verbose and process is not None and hasattr(process, "_verbose"):
        process._verbose = False
    wait_for_200(health_url, READY_TIMEOUT_S, "of Triton's start", alive=triton._triton_server.is_alive)
    triton.connect()
    prefix = triton._python_backend_config["shm-region-prefix-name"] or f"pytrtion{os.getpid()}-"
    make_shm_private(prefix)
