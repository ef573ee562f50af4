"""Serve a model through a real Triton Inference Server (PyTriton): dynamic batching, HTTP and gRPC,
health and Prometheus metrics, a clean stop on SIGTERM or Ctrl-C.

  vit-fast serve MODEL [--config PRESET] [--weights FILE] [--batch 1,8,64] [--instances 1] [--dtype fp32]
                       [--threads T] [--host 127.0.0.1] [--protect auto|on|off] [--tune]
                       [--variable-size [--max-image-size 1024]] [--encoded [--top-k 5]]
                       [--http-port 8000] [--grpc-port 8001] [--metrics-port 8002] [--json ready.json|-]
  vit-fast serve MODEL --load-test [--clients 8] [--requests 100] [--json load.json|-]
                       [--encoded [--images PATH...] [--broken N]]

MODEL is "default" (the embedded model), a preset name or a checkpoint path. It runs on the GPU
with our Triton kernels where there is one, else on the CPU with the torch backend. On a GPU it runs
the model once at each served batch size (1, the preferred sizes, the largest) before it reports ready,
so every kernel is compiled (with --tune: tuned, and served tuned) before the first request; it says ready
only once /v2/models/NAME/ready answers and one request went through. Wait on that probe: Triton's own
/v2/health/ready answers before the model is loaded. No client can unload the model or load another one
(Triton's model control is off), and each port is held by one vit-fast serve at a time: a second one on a
port in use is refused at once, naming the first one's pid. On loopback the statistics and
shared-memory APIs are open, so perf_analyzer and model-analyzer measure it as they are; on any other
interface they keep PyTriton's access token, printed (and written to --json, readable by you only) for clients
to send in the triton-access-token header (--protect on|off decides it yourself); Triton takes that token on its
command line, where other users of this machine can read it. Requests whose
shape or dtype do not fit get an error response, a message (never a traceback) of their own: a refused request fails
only itself in a batch, and the console gets one line per refused request (at most one a second). HTTP goes through
a front of vit-fast's own on --http-port (Triton's HTTP listens on a private loopback port): an inference request
whose declared shape exceeds the model's limits (its input, --batch, --max-image-size, --encoded's bounds) or does not
match the data it carries gets a 400 with a one-line message before Triton reads it (Triton 2.51 allocates what a
request declares), and a body over the largest valid request a 413, unread; gRPC refuses such requests itself. A
Triton (or the front) that dies while serving is restarted, saying so (at most 3 times in 10 minutes).
--variable-size serves images of any size (each side a multiple of the patch size, up to --max-image-size pixels)
for a model built with dynamic_img_size: requests of different sizes are batched together and run as one packed
forward. --encoded takes encoded images (JPEG, PNG, WebP, BMP bytes, a BYTES input image_bytes [1]), decodes them
with Pillow in a thread pool (JPEGs with nvJPEG on the GPU, one call per batch, where the model runs on CUDA and
torchvision 0.19+ is installed), preprocesses them with the model's own evaluation transform and answers logits,
labels and probabilities (the top k); an image over 16 MiB, or whose header declares over 4096x4096 pixels, or that
does not decode, fails only its own request. --load-test starts the
server, runs a bounded load test against it on loopback (HTTP and gRPC clients, mixed batch sizes,
every answer checked against the model), prints p50/p99 latency and throughput, and stops. With --json -
the summary goes to stdout (the endpoints as soon as the server is ready) and everything else to stderr.
Needs the serve extra: pip install -e '.[serve]' in a vit-fast checkout (it pins numpy < 2).
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from . import _args

EXAMPLE = "vit-fast serve default --batch 1,8,64 --instances 2   (then: curl 127.0.0.1:8000/v2/models/default/ready)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``vit-fast serve``'s arguments."""
    from vit_fast.cli.tritonserver import QUEUE_DELAY_HELP_US, add_serving_arguments
    from vit_fast.serve.settings import (
        CPU_QUEUE_DELAY_US,
        DEFAULT_HOST,
        DEFAULT_PORTS,
        PROTECT_CHOICES,
        VARIABLE_MAX_SIDE,
    )

    parser.add_argument("model", metavar="MODEL", help='"default", a preset name, or a checkpoint path')
    _args.add_model_source(parser)
    add_serving_arguments(
        parser,
        "MODEL",
        "64 on the CPU with no preferred size, so every queued request goes into one forward; 8 and 64 on a GPU",
        f"{CPU_QUEUE_DELAY_US} on the CPU, {QUEUE_DELAY_HELP_US} on a GPU",
    )
    parser.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32", help="weights and I/O dtype (fp32)")
    parser.add_argument(
        "--threads",
        type=_args.positive_int,
        default=None,
        metavar="T",
        help="torch CPU threads per forward, fixed (default on the CPU: 1, 2, 4, ... up to the cores shared "
        "between the instances, the count that serves the most images/s under the load of the moment, tried "
        "when a load starts and every 30 s; on a GPU: the cores less one for Triton's own processes, per instance)",
    )
    parser.add_argument(
        "--protect",
        choices=PROTECT_CHOICES,
        default="auto",
        help="Triton's statistics, shared-memory, trace and logging APIs behind an access token: auto (default) "
        "opens them on a loopback --host and protects them elsewhere, printing the token (Triton reads it from its "
        "command line, which every local user can see: it keeps other machines out). Loading and unloading models "
        "is closed to every client either way",
    )
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to listen on ({DEFAULT_HOST}; 0.0.0.0 for every interface)"
    )
    for what, port in DEFAULT_PORTS.items():
        parser.add_argument(f"--{what}-port", type=_args.port, default=port, help=f"{what} port ({port})")
    parser.add_argument(
        "--tune",
        action="store_true",
        help="tune the Triton kernels for the served batch sizes before reporting ready, and serve tuned (minutes "
        "on first use, saved for the next start); without it each kernel compiles one heuristic config per shape",
    )
    parser.add_argument(
        "--variable-size",
        action="store_true",
        help="serve images of any size the model takes (input images [C, -1, -1]; each request [B, C, H, W], B "
        "images of one size): requests of different sizes are batched together by Triton (a ragged input) and run as "
        "one packed forward. Only for a model built with dynamic_img_size (its position embedding resampled); "
        "another is refused at start",
    )
    parser.add_argument(
        "--max-image-size",
        type=_args.positive_int,
        default=None,
        metavar="PX",
        help=f"with --variable-size: the largest side of an image, in pixels ({VARIABLE_MAX_SIDE}); a larger image is "
        "refused with an error, before any work",
    )
    parser.add_argument(
        "--encoded",
        action="store_true",
        help="take encoded images (JPEG, PNG, WebP, BMP bytes; input image_bytes, BYTES [1] per image) instead of "
        "float tensors: decoded with Pillow in a thread pool (JPEGs with nvJPEG where the model runs on CUDA and "
        "torchvision 0.19+ is installed), preprocessed as the model's own evaluation transform "
        "(vit_fast.image_transform), answered with logits, labels and probabilities; needs the images extra",
    )
    parser.add_argument(
        "--top-k",
        type=_args.positive_int,
        default=None,
        metavar="K",
        help="with --encoded: how many labels and probabilities each image's answer carries (5)",
    )
    parser.add_argument(
        "--images",
        nargs="+",
        default=None,
        metavar="PATH",
        help="with --encoded --load-test: image files or folders the clients send (default: PNG files of random "
        "pixels, made in memory)",
    )
    parser.add_argument(
        "--broken",
        type=_args.nonnegative_int,
        default=0,
        metavar="N",
        help="with --encoded --load-test: every Nth request carries bytes that do not decode, and must be refused "
        "alone (0: none)",
    )
    parser.add_argument(
        "--load-test",
        action="store_true",
        help="run a bounded load test on loopback (its clients in a separate process), then stop",
    )
    parser.add_argument("--clients", type=_args.positive_int, default=8, help="load test: concurrent clients (8)")
    parser.add_argument("--requests", type=_args.positive_int, default=100, help="load test: requests per client (100)")
    _args.add_json(
        parser,
        "write a machine-readable summary: the endpoints (and the access token, if any) once the server answers, "
        "readable by you only (mode 0600), or the load-test report",
    )
    parser.add_argument("--seed", type=_args.seed, default=0, help="load test: seed of the images and batch sizes (0)")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="print Triton's own log (verbose: it slows every request) and each torch-threads trial as it ends",
    )
    _args.add_overwrite(parser)


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def _check_encoded_args(args: argparse.Namespace) -> list[bytes] | None:
    """The flags that go with --encoded, checked before the model loads; with --encoded --load-test, the encoded
    images its clients send (--images' files, read; else PNGs of random pixels)."""
    for flag, given in (("--top-k", args.top_k is not None), ("--images", args.images), ("--broken", args.broken)):
        if given and not args.encoded:
            raise ValueError(f"{flag} goes with --encoded: add --encoded, or leave {flag} out")
    for flag, given in (("--images", args.images), ("--broken", args.broken)):
        if given and not args.load_test:
            raise ValueError(f"{flag} is for the load test: add --load-test, or leave {flag} out")
    if not (args.encoded and args.load_test):
        return None
    from vit_fast.serve.encoded import encoded_files, random_pngs

    return encoded_files(args.images) if args.images else random_pngs(args.seed)


def run(args: argparse.Namespace) -> int:
    """Run ``vit-fast serve``; returns 0 after a clean stop (1 when the load test fails)."""
    from vit_fast.serve.settings import limit_openmp_spin

    limit_openmp_spin()  # before torch loads OpenMP: see vit_fast.serve.settings.OPENMP_SPIN_COUNT
    from vit_fast.serve.server import require_serve

    # the one output policy first: before the extra's check, the model load and the server start
    json_target = _args.json_file(args.json, overwrite=args.overwrite)
    encoded_files = _check_encoded_args(args)
    require_serve()  # before the model loads: a missing extra is the first thing to hear about
    from vit_fast import __version__
    from vit_fast.export.tritonserver import model_name_for, parse_batch_sizes
    from vit_fast.interop.loading import load_model
    from vit_fast.serve.lifecycle import RESTART_WINDOW_S, RESTARTS
    from vit_fast.serve.loadtest import load_test_in_child
    from vit_fast.serve.server import ACCESS_HEADERS, DRAIN_TIMEOUT_S, Server
    from vit_fast.util.files import MARKER_KEY

    batch = parse_batch_sizes(args.batch) if args.batch is not None else None
    name = args.name or model_name_for(args.model)
    model = load_model(args.model, backend="torch", config=args.config, weights=args.weights)
    server = Server(
        model,
        name=name,
        batch=batch,
        dtype=args.dtype,
        instances=args.instances,
        **({} if args.queue_delay_us is None else {"queue_delay_us": args.queue_delay_us}),
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        verbose=args.verbose,
        tune=args.tune,
        threads=args.threads,
        protect=args.protect,
        variable_size=args.variable_size,
        max_image_size=args.max_image_size,
        encoded=args.encoded,
        **({} if args.top_k is None else {"top_k": args.top_k}),
    )
    e = server.endpoints
    server.check_ports()  # before the warm-up and Triton's start-up: a busy port is named at once
    # SIGTERM while Triton starts: unwind through the finally below, so its processes are stopped too
    previous = signal.signal(signal.SIGTERM, _interrupt)
    previous_int = signal.getsignal(signal.SIGINT)
    try:
        print(f"starting Triton Inference Server for {server.description}", flush=True)
        server.start()
        print(
            f"serving {name!r}: HTTP {e.http}, gRPC {e.grpc}, ready http://{e.http}/v2/models/{name}/ready, "
            f"metrics {e.metrics_url}",
            flush=True,
        )
        token = server.access_token
        if token is not None:
            print(
                f"statistics, shared-memory, trace and logging APIs need the access token {token} in the header "
                f"{ACCESS_HEADERS['http']} (HTTP) or {ACCESS_HEADERS['grpc']} (gRPC); it keeps other machines out, "
                "not other users of this one (Triton reads it from its command line, which they can list)",
                flush=True,
            )
        if args.load_test:
            sizes = [b for b in range(1, 9) if b <= server.batching.max_batch_size]
            report = load_test_in_child(
                server.model,
                name,
                e.http,
                e.grpc,
                clients=args.clients,
                requests=args.requests,
                batch_sizes=sizes,
                dtype=args.dtype,
                seed=args.seed,
                **({} if not args.encoded else {"encoded": encoded_files, "broken_every": args.broken}),
            )
            print(report.format(), flush=True)
            _args.write_json({MARKER_KEY: __version__, **report.to_dict()}, json_target)
            return 0 if report.passed else 1
        # from here on, SIGTERM and Ctrl-C ask for a clean stop: a client may act on the ready JSON at once
        signal.signal(signal.SIGTERM, lambda *_: server.request_stop())
        signal.signal(signal.SIGINT, lambda *_: server.request_stop())
        if json_target is not None:
            info = {
                MARKER_KEY: __version__,
                "model": name,
                "http": e.http,
                "grpc": e.grpc,
                "health": e.health_url,
                "ready": f"http://{e.http}/v2/models/{name}/ready",
                "metrics": e.metrics_url,
                "threads": server.threads,
                "thread_counts": [server.threads] if server.thread_tuner is None else server.thread_tuner.counts,
                "protected": server.protected,
                "access_token": token,
            }
            # readable by this user only, whatever a file it replaces allowed: it may carry the access token
            _args.write_json(info | {"description": server.description}, json_target, mode=0o600)
        print(f"ready: Ctrl-C or SIGTERM stops it (in-flight requests get up to {DRAIN_TIMEOUT_S} s)", flush=True)
        if not server.wait():
            tail = server.log_tail()
            raise RuntimeError(
                f"the Triton server for {name!r} kept stopping by itself (restarted {RESTARTS} times within "
                f"{RESTART_WINDOW_S:.0f} s); its log ends:\n{tail or '(empty)'}"
            )
        print("stopping", flush=True)
        return 0
    except KeyboardInterrupt:
        print("interrupted: stopping", file=sys.stderr, flush=True)
        return 130
    finally:
        # a second SIGTERM while Triton drains must not leave its processes behind: stopping is bounded anyway
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        server.stop()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


__all__ = ["add_arguments", "run"]
