"""Helpers of the serve tests: loopback ports, `vit-fast serve` as a child process (`python -m vit_fast serve`: the
command line as users run it, its one-line errors included), and Triton's own
tritonserver binary (the one PyTriton bundles) started on a model repository."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

#: filled by the load tests, printed in the terminal summary so CI logs show the figures
LOAD_TEST_REPORTS: list[str] = []

NEEDS_SERVE = "needs the serve extra (pip install -e '.[serve]', numpy < 2): run `make test-serve`"

START_TIMEOUT_S = 180.0
#: issue 46's request: [1, 3, 60000, 60000] declared (43 GB as FP32), 12 values carried
LIE = {"inputs": [{"name": "images", "shape": [1, 3, 60000, 60000], "datatype": "FP32", "data": list(range(12))}]}


def post_json(url: str, body: dict, timeout_s: float = 60.0) -> tuple[int | None, str]:
    """(HTTP status, body) of a JSON POST; (None, why) when the connection broke."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as err:  # the server died on it: connection reset, or no answer
        return None, str(err)


def free_ports(n: int) -> list[int]:
    """n distinct TCP ports on 127.0.0.1 that nothing listens on right now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_is_free(port: int) -> bool:
    """Whether a listening socket can bind ``127.0.0.1:port`` now (a stopped server released it)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class Child:
    """A server process, its ports (http, grpc, metrics) and its combined output file."""

    proc: subprocess.Popen
    ports: list[int]
    log: Path

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.ports[0]}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.ports[1]}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports[2]}/metrics"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def terminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, then the exit status (SIGKILL and an AssertionError if it does not end in time)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired as err:
            self.proc.kill()
            self.proc.wait()
            msg = f"the server did not stop within {timeout_s} s of SIGTERM:\n{self.output()[-3000:]}"
            raise AssertionError(msg) from err


def ready_info(ready: Path) -> dict | None:
    """What a ready JSON says once `vit-fast serve` wrote it (None before: missing, or a file from before)."""
    try:
        info = json.loads(ready.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and "http" in info else None


def spawn_serve(tmp: Path, ports: list[int], *args: str, ready: Path | None = None, name: str = "serve") -> Child:
    """`python -m vit_fast serve ARGS --json READY` on ``ports`` (http, grpc, metrics), not waited for."""
    ready = ready or tmp / "ready.json"
    log = tmp / f"{name}.log"
    cmd = [sys.executable, "-m", "vit_fast", "serve", *args, "--json", str(ready)]
    cmd += ["--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])]
    with open(log, "wb") as out:  # a session of its own: Ctrl-C can be sent to its whole process group
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return Child(proc, ports, log)


def wait_ready(child: Child, ready: Path) -> dict:
    """The ready JSON ``child`` writes, once written (an AssertionError with its output if it exits first)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while (info := ready_info(ready)) is None:
        if child.proc.poll() is not None or time.monotonic() > deadline:
            child.terminate()
            raise AssertionError(
                f"vit-fast serve did not become ready (exit {child.proc.poll()}):\n{child.output()[-3000:]}"
            )
        time.sleep(0.2)
    assert info["http"] == child.http and info["grpc"] == child.grpc, info
    return info


def start_serve(tmp: Path, *args: str) -> Child:
    """`vit-fast serve ARGS` on three free loopback ports; returns once it wrote its ready JSON (tmp/ready.json,
    which may exist before: it counts once the server wrote its endpoints there)."""
    child = spawn_serve(tmp, free_ports(3), *args)
    wait_ready(child, tmp / "ready.json")
    return child


def tritonserver_pid(server_pid: int) -> int:
    """The pid of the tritonserver that the `vit-fast serve` process ``server_pid`` started."""
    from vit_fast.serve.backend import _processes

    found = [
        pid
        for pid, (ppid, cmd) in _processes().items()
        if ppid == server_pid and cmd.split(" ", 1)[0].endswith("/bin/tritonserver")
    ]
    assert len(found) == 1, f"tritonserver children of {server_pid}: {found}"
    return found[0]


def process_tree(pid: int) -> set[int]:
    """``pid`` and all its descendants."""
    from vit_fast.serve.backend import _processes

    procs, tree = _processes(), {pid}
    while more := {p for p, (ppid, _) in procs.items() if ppid in tree} - tree:
        tree |= more
    return tree


def start_tritonserver(tmp: Path, repo: Path, models: list[str]) -> Child:
    """Triton's tritonserver binary (bundled by PyTriton) on ``repo``, loading ``models`` only.

    Laid out as PyTriton lays it out for itself: the server's folder copied, with the python-backend
    stub built for this Python version; LD_LIBRARY_PATH from vit-fast's own start-up code (this
    interpreter's libpython first) plus PyTriton's bundled libraries; this interpreter's bin folder
    first on PATH, so the stub's embedded Python finds this environment's packages (vit-fast, torch).
    """
    import pytriton
    from pytriton.utils.distribution import get_libs_path, get_stub_path

    from vit_fast.serve.server import python_backend_env

    dist = tmp / "tritonserver"
    shutil.copytree(
        Path(pytriton.__file__).parent / "tritonserver", dist, ignore=shutil.ignore_patterns("python_backend_stubs")
    )
    shutil.copy(
        get_stub_path(f"{sys.version_info.major}.{sys.version_info.minor}"),
        dist / "backends" / "python" / "triton_python_backend_stub",
    )
    env = python_backend_env()
    env["LD_LIBRARY_PATH"] = f"{env.get('LD_LIBRARY_PATH', '')}:{get_libs_path()}".lstrip(":")
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    ports = free_ports(3)
    cmd = [
        str(dist / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        f"--backend-directory={dist / 'backends'}",
        "--model-control-mode=explicit",
        *(f"--load-model={m}" for m in models),
        "--http-address=127.0.0.1",
        f"--http-port={ports[0]}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={ports[1]}",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={ports[2]}",
        "--exit-timeout-secs=20",
    ]
    log = tmp / "tritonserver.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    child = Child(proc, ports, log)
    import tritonclient.http as http

    client = http.InferenceServerClient(child.http)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            try:
                if all(client.is_model_ready(m) for m in models):
                    return child
            except Exception:  # not listening yet
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                child.terminate()
                raise AssertionError(
                    f"tritonserver did not load {models} (exit {proc.poll()}):\n{child.output()[-4000:]}"
                )
            time.sleep(0.3)
    finally:
        client.close()


def counts_after(client, name: str, before: tuple[int, int], inferences: int, wait_s: float = 60.0) -> tuple[int, int]:
    """(inferences, executions) Triton counted for model ``name`` since ``before``, read once it has counted at least
    ``inferences``: Triton updates its statistics after the responses are sent, so a read right after the last
    answer may not see them yet (a loaded machine widens that gap). ``wait_s`` only guards a count that never comes."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        stats = client.get_inference_statistics(name)["model_stats"][0]
        now = int(stats["inference_count"]) - before[0], int(stats["execution_count"]) - before[1]
        if now[0] >= inferences or time.monotonic() > deadline:
            return now
        time.sleep(0.05)
