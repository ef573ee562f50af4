"""``vit-fast serve``'s defaults, without importing torch: the command line builds its parser from these
(``vit-fast serve --help`` stays fast); :mod:`vit_fast.serve.server` runs the server."""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

DEFAULT_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
#: the output name that carries a refused request's message (utf-8 bytes as uint8) to PyTriton's stub, which turns
#: it into that request's own error response (vit_fast.serve.backend.per_request_errors)
REFUSED_KEY = "vit_fast_refused"
#: loopback by default: a server is reachable from other machines only when asked (--host 0.0.0.0)
DEFAULT_HOST = "127.0.0.1"
#: ``protect``: "auto" opens the statistics and shared-memory APIs (what perf_analyzer and model-analyzer read) on
#: loopback only and keeps PyTriton's access token on any other interface; "on" / "off" force it. Loading and
#: unloading models is closed to every client whatever it says (vit_fast.serve.backend.close_model_control)
PROTECT_CHOICES = ("auto", "on", "off")
#: the dynamic batcher's max_queue_delay_microseconds when serving on the CPU: 0. One instance runs one forward at a
#: time, so requests that arrive meanwhile are batched anyway; waiting only adds latency (measured with perf_analyzer,
#: gRPC batch 1, concurrency 1-8: 0.81-0.97x the plain PyTriton script's inferences/s with 100 us, 0.93-1.01x with 0).
#: On a GPU the export default applies (vit_fast.export.tritonserver.DEFAULT_QUEUE_DELAY_US)
CPU_QUEUE_DELAY_US = 0
#: the dynamic batcher's preferred batch sizes when serving on the CPU without --batch: none (max batch 64). With a
#: preferred size the batcher sends a batch of that size whenever it can form one, even with more requests queued:
#: with 8 (the GPU default's smallest), 8 clients sending 8 images each were served 8 images per forward, where one
#: forward of 64 takes 25 ms against eight of 8 at 38 ms (default model, 2 threads). Without one it sends all that
#: is queued at once (measured with perf_analyzer against the plain PyTriton script, gRPC, batch 8 with 8 clients:
#: 0.96-0.99x its inferences/s with 8 and 64 preferred, 1.85-2.07x with none)
CPU_PREFERRED_BATCH: tuple[int, ...] = ()
#: ``--variable-size``: the default largest side, in pixels, of an image (``--max-image-size``). 1024 is 64x64 patches
#: of 16 px, 4,097 tokens with a class token: its attention costs about 430x that of a 224x224 image (197 tokens)
VARIABLE_MAX_SIDE = 1024
#: PyTriton hands each request from Triton's python-backend stub to the serving process and back either through its
#: shared-memory tensor store (a block allocated and released by a manager process, over a socket, per tensor) or as
#: base64 inside the message itself (``PYTRITON_NO_TENSORSTORE``). Base64 costs about 7 ms per MB of tensor; the
#: store's round trips cost about 0.3 ms per request in one process and more when they wake its processes on a busy
#: machine (measured on 2 cores against the plain PyTriton script at batch 1: 4 KB images over base64 0.91-1.37x its
#: inferences/s, median 1.10, against medians of 0.92-1.18x through the store). So base64 when
#: one image is at most this many bytes, the tensor store above it (a 3x224x224 fp32 image is 588 KiB: 8 ms over
#: base64 against 0.8 ms)
BASE64_MAX_IMAGE_BYTES = 16 * 1024
#: how many rounds torch's idle OpenMP threads spin, waiting for the next parallel op, before they sleep
#: (``GOMP_SPINCOUNT``; libgomp's default is 300,000, milliseconds of a core). Between ops of one forward they wait
#: microseconds, so 10,000 keeps them awake there; after a forward they would spin on, on the cores Triton's server,
#: stubs and clients need for the next request's trip (measured with perf_analyzer on 2 cores against the plain
#: PyTriton script: gRPC batch 1, one client, 1.13-1.26x its inferences/s with libgomp's default and the threads the
#: tuner chose, 1.41-1.51x with 10,000 on 2 threads; batch 8 0.93-1.25x, then 1.25-1.50x. OMP_WAIT_POLICY=PASSIVE, no
#: spinning at all, served 0.88-1.14x on 2 threads: every op then wakes a sleeping thread)
OPENMP_SPIN_COUNT = 10_000
#: the variables that decide the spinning: one set by the user is kept
OPENMP_SPIN_VARS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")


def limit_openmp_spin(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set ``GOMP_SPINCOUNT`` to :data:`OPENMP_SPIN_COUNT` in ``environ`` (default ``os.environ``) unless one of
    :data:`OPENMP_SPIN_VARS` is set already. libgomp reads it once, when torch loads it, so this is called before
    torch is imported; with torch imported already it sets nothing. True when the spinning is bounded (by this call
    or by the user's own setting), False when torch's OpenMP threads spin libgomp's default."""
    env = os.environ if environ is None else environ
    if any(env.get(var) for var in OPENMP_SPIN_VARS):
        return True
    if "torch" in sys.modules:
        return False
    env["GOMP_SPINCOUNT"] = str(OPENMP_SPIN_COUNT)
    return True


def warn_openmp_spin(environ: MutableMapping[str, str] | None = None) -> bool:
    """Say on stderr that torch's OpenMP threads spin libgomp's default where neither of :data:`OPENMP_SPIN_VARS` is
    set in ``environ`` (default ``os.environ``); True when it said so."""
    env = os.environ if environ is None else environ
    if any(env.get(var) for var in OPENMP_SPIN_VARS):
        return False
    print(
        f"[vit-fast serve] torch's OpenMP threads spin on after each op (GOMP_SPINCOUNT unset: libgomp's "
        f"300,000 rounds), on the cores Triton needs for the next request: set GOMP_SPINCOUNT="
        f"{OPENMP_SPIN_COUNT} before Python imports torch (vit-fast serve does), or serve with threads=1",
        file=sys.stderr,
        flush=True,
    )
    return True
