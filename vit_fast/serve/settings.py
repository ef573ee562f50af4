"""``vit-fast serve``'s defaults, without importing torch: the command line builds its parser from these
(``vit-fast serve --help`` stays fast); :mod:`vit_fast.serve.server` runs the server."""

from __future__ import annotations

DEFAULT_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
#: loopback by default: a server is reachable from other machines only when asked (--host 0.0.0.0)
DEFAULT_HOST = "127.0.0.1"
#: ``protect``: "auto" opens the statistics and shared-memory APIs (what perf_analyzer and model-analyzer read) on
#: loopback only and keeps PyTriton's access token on any other interface; "on" / "off" force it
PROTECT_CHOICES = ("auto", "on", "off")
#: the dynamic batcher's max_queue_delay_microseconds when serving on the CPU: 0. One instance runs one forward at a
#: time, so requests that arrive meanwhile are batched anyway; waiting only adds latency (measured with perf_analyzer,
#: gRPC batch 1, concurrency 1-8: 0.81-0.97x the plain PyTriton script's inferences/s with 100 us, 0.93-1.01x with 0).
#: On a GPU the export default applies (vit_fast.export.triton_config.DEFAULT_QUEUE_DELAY_US)
CPU_QUEUE_DELAY_US = 0
