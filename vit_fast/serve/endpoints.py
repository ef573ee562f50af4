"""Where a served model answers: its endpoints (HTTP, gRPC, metrics), whether a host is loopback, whether a port
is listened on already, and a URL polled until it answers 200."""

from __future__ import annotations

import ipaddress
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

#: the headers a client sends the token in (Triton's names; perf_analyzer passes ``-H`` on HTTP only)
ACCESS_HEADERS = {"http": "triton-access-token", "grpc": "triton-grpc-protocol-triton-access-token"}


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable from this machine only."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip()).is_loopback
    except ValueError:
        return False


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


def wait_for_200(url: str, timeout_s: float, since: str, alive: Any = None) -> None:
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
