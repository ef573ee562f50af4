"""The HTTP front's process as :class:`vit_fast.serve.server.Server` runs it: the user's HTTP port bound here and
handed to a child (:mod:`vit_fast.serve.front`, started by :func:`vit_fast.util.children.guarded_python`, so it dies
with this process), started again on the same socket when it dies, stopped after Triton. Why a process of its own:
docs/deploy.md, "The HTTP front"."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import time

from vit_fast.serve.declared import RequestLimits
from vit_fast.util.children import guarded_python

#: seconds the front may take to say it listens
START_S = 60.0
#: seconds it may take to stop on SIGTERM before it is killed
STOP_S = 10.0


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``0.0.0.0``: every IPv4 interface); an OSError naming the port and
    the flag that moves it where something else holds it."""
    bind_host = "" if host in ("0.0.0.0", "") else host
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind_host, port))
        sock.listen(1024)
    except OSError as err:
        sock.close()
        raise OSError(
            f"HTTP port {port} on {host} cannot be listened on ({err.strerror or err}): pick another with --http-port"
        ) from None
    return sock


def loopback_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now: where Triton's own HTTP listens, behind the front."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class FrontProcess:
    """The front on ``host:port`` for Triton's HTTP at ``127.0.0.1:upstream_port``, refusing what ``limits`` refuse.
    The listening socket is made once (:meth:`start`) and kept until :meth:`stop`, so a restarted front takes over
    the connections waiting on it."""

    def __init__(self, host: str, port: int, upstream_port: int, limits: RequestLimits) -> None:
        self.host, self.port, self.upstream_port, self.limits = host, port, upstream_port, limits
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = START_S) -> None:
        """Start the front (binding the port the first time); returns once it accepts connections. A RuntimeError
        with its exit status when it does not say so within ``timeout_s`` seconds."""
        if self._sock is None:
            self._sock = listen_socket(self.host, self.port)
        fd = self._sock.fileno()
        args = ["--fd", str(fd), "--upstream", f"127.0.0.1:{self.upstream_port}", "--limits", self.limits.to_json()]
        self._proc = proc = subprocess.Popen(
            guarded_python(["vit_fast.serve.front", *args]),
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
        )
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        line = b""
        while not line.endswith(b"\n") and time.monotonic() < deadline:
            readable, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not readable:
                break
            byte = os.read(proc.stdout.fileno(), 64)  # unbuffered: select sees what is left
            if not byte:
                break
            line += byte
        if line != b"ready\n":
            self._end()
            raise RuntimeError(
                f"vit-fast serve's HTTP front did not start (exit status {proc.poll()}; its output above says why)"
            )

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _end(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def stop(self) -> None:
        """Stop the front and close the port. Safe to call twice."""
        try:
            self._end()
        finally:
            sock, self._sock = self._sock, None
            if sock is not None:
                sock.close()


__all__ = ["START_S", "STOP_S", "FrontProcess", "listen_socket", "loopback_port"]
