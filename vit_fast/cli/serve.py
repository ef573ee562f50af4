"""Serve a model through a real Triton Inference Server (PyTriton): dynamic batching, HTTP and gRPC,
health and Prometheus metrics, a clean stop on SIGTERM or Ctrl-C.

  vit-fast serve MODEL [--batch 1,8,64] [--instances 1] [--dtype fp32] [--host 127.0.0.1] [--tune]
                       [--http-port 8000] [--grpc-port 8001] [--metrics-port 8002] [--json ready.json]
  vit-fast serve MODEL --load-test [--clients 8] [--requests 100] [--json load.json]

MODEL is "default" (the embedded model), a preset name or a checkpoint path. It runs on the GPU
with our Triton kernels where there is one, else on the CPU with the torch backend. On a GPU it runs
the model once at each served batch size (1, the preferred sizes, the largest) before it reports ready,
so every kernel is compiled (with --tune: tuned, and served tuned) before the first request. Requests whose
shape or dtype do not fit get an error response; the server keeps serving. --load-test starts the
server, runs a bounded load test against it on loopback (HTTP and gRPC clients, mixed batch sizes,
every answer checked against the model), prints p50/p99 latency and throughput, and stops.
Needs the serve extra: pip install 'vit-fast[serve]' (it pins numpy < 2).
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from . import _args

EXAMPLE = "vit-fast serve default --batch 1,8,64 --instances 2   (then: curl 127.0.0.1:8000/v2/health/ready)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``vit-fast serve``'s arguments."""
    from vit_fast.cli.tritonserver import add_serving_arguments
    from vit_fast.serve.server import DEFAULT_HOST, DEFAULT_PORTS

    parser.add_argument("model", metavar="MODEL", help='"default", a preset name, or a checkpoint path')
    add_serving_arguments(parser, "MODEL", "8 and 64")
    parser.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32", help="weights and I/O dtype (fp32)")
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to listen on ({DEFAULT_HOST}; 0.0.0.0 for every interface)"
    )
    for what, port in DEFAULT_PORTS.items():
        parser.add_argument(f"--{what}-port", type=int, default=port, help=f"{what} port ({port})")
    parser.add_argument(
        "--tune",
        action="store_true",
        help="tune the Triton kernels for the served batch sizes before reporting ready, and serve tuned (minutes "
        "on first use, saved for the next start); without it each kernel compiles one heuristic config per shape",
    )
    parser.add_argument("--load-test", action="store_true", help="run a bounded load test on loopback, then stop")
    parser.add_argument("--clients", type=int, default=8, help="load test: concurrent clients (8)")
    parser.add_argument("--requests", type=int, default=100, help="load test: requests per client (100)")
    parser.add_argument(
        "--json",
        default=None,
        metavar="PATH",
        help="write a machine-readable summary: the endpoints once the server answers, or the load-test report",
    )
    parser.add_argument("--seed", type=_args.seed, default=0, help="load test: seed of the images and batch sizes (0)")
    parser.add_argument("--verbose", action="store_true", help="print Triton's own log")
    _args.add_overwrite(parser)


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    """Run ``vit-fast serve``; returns 0 after a clean stop (1 when the load test fails)."""
    from vit_fast.files import check_report_file
    from vit_fast.serve.server import require_serve

    # the one output policy first: before the extra's check, the model load and the server start
    json_path = None if args.json is None else check_report_file(args.json, "--json", overwrite=args.overwrite)
    require_serve()  # before the model loads: a missing extra is the first thing to hear about
    from vit_fast import __version__
    from vit_fast.export.tritonserver import model_name_for, parse_batch_sizes
    from vit_fast.files import MARKER_KEY, write_json_atomic
    from vit_fast.loading import load_model
    from vit_fast.serve.loadtest import load_test
    from vit_fast.serve.server import Server

    batch = parse_batch_sizes(args.batch) if args.batch is not None else None
    name = args.name or model_name_for(args.model)
    model = load_model(args.model, backend="torch")
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
    )
    e = server.endpoints
    # SIGTERM while Triton starts: unwind through the finally below, so its processes are stopped too
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        print(f"starting Triton Inference Server for {server.description}", flush=True)
        server.start()
        print(
            f"serving {name!r}: HTTP {e.http}, gRPC {e.grpc}, health {e.health_url}, metrics {e.metrics_url}",
            flush=True,
        )
        if args.load_test:
            sizes = [b for b in range(1, 9) if b <= server.batching.max_batch_size]
            report = load_test(
                server.model,
                name,
                e.http,
                e.grpc,
                clients=args.clients,
                requests=args.requests,
                batch_sizes=sizes,
                dtype=args.dtype,
                seed=args.seed,
            )
            print(report.format(), flush=True)
            if json_path is not None:
                write_json_atomic({MARKER_KEY: __version__, **report.to_dict()}, json_path)
            return 0 if report.passed else 1
        if json_path is not None:
            info = {MARKER_KEY: __version__, "model": name, "http": e.http, "grpc": e.grpc}
            info |= {"health": e.health_url, "metrics": e.metrics_url}
            write_json_atomic(info | {"description": server.description}, json_path)
        print("ready: Ctrl-C or SIGTERM stops it", flush=True)
        if not server.wait():
            tail = server.log_tail()
            raise RuntimeError(f"the Triton server for {name!r} stopped by itself; its log ends:\n{tail or '(empty)'}")
        print("stopping", flush=True)
        return 0
    except KeyboardInterrupt:
        print("interrupted: stopping", file=sys.stderr, flush=True)
        return 130
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)


__all__ = ["add_arguments", "run"]
