"""A bounded load test against a Triton server: concurrent clients, mixed batch sizes, every answer checked.

:func:`load_test` runs ``clients`` threads (half HTTP, half gRPC), each sending ``requests`` requests of random batch
sizes, judges every response by the numerics rule and times each one; :func:`load_test_in_child` runs it in a process
of its own; :class:`LoadTestReport` is the result. What is judged and why: docs/deploy.md."""

from __future__ import annotations

import copy
import dataclasses
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from vit_fast.export.tritonserver import model_io
from vit_fast.model.vit import VisionTransformer
from vit_fast.util.dtypes import dtype_name, parse_dtype
from vit_fast.util.numerics import RULE, compare

PROTOCOLS = ("http", "grpc")
POOL = 64  # distinct images the requests are drawn from
_NP_TYPES = {torch.float32: ("FP32", "float32"), torch.float16: ("FP16", "float16")}


@dataclass
class LoadTestReport:
    """What :func:`load_test` saw. Latencies in milliseconds, throughput per second of wall time."""

    model: str
    clients: int
    requests_per_client: int
    batch_sizes: list[int]
    dtype: str
    requests: int = 0
    answered: int = 0
    broken: int = 0  # requests sent with an image that does not decode (encoded load tests)
    refused: int = 0  # of those, the ones refused alone with a message that says why
    images: int = 0  # in answered requests
    within_rule: int = 0
    bit_exact: int = 0
    worst_ratio: float = 0.0
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    mean_ms: float = 0.0
    max_ms: float = 0.0
    requests_per_s: float = 0.0
    images_per_s: float = 0.0
    by_protocol: dict[str, dict[str, float]] = field(default_factory=dict)
    rule: str = RULE

    @property
    def passed(self) -> bool:
        """Every request answered within the numerics rule, or (a broken one) refused on its own, without error."""
        good = self.answered + self.broken == self.requests and self.within_rule == self.answered
        return self.requests > 0 and good and self.refused == self.broken and not self.errors

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"passed": self.passed}

    def format(self) -> str:
        lines = [
            f"load test of {self.model!r}: {self.clients} clients x {self.requests_per_client} requests, batch sizes "
            f"{self.batch_sizes}, {self.dtype}",
            f"  answered {self.answered}/{self.requests} requests ({self.images} images) in {self.wall_s:.2f} s; "
            f"within the rule {self.within_rule}, bit-exact {self.bit_exact}, worst error/bound {self.worst_ratio:.3g}",
            *([f"  broken requests sent {self.broken}, refused alone {self.refused}"] if self.broken else []),
            f"  latency p50 {self.p50_ms:.2f} ms, p99 {self.p99_ms:.2f} ms, mean {self.mean_ms:.2f} ms, "
            f"max {self.max_ms:.2f} ms",
            f"  throughput {self.requests_per_s:.1f} requests/s, {self.images_per_s:.1f} images/s",
        ]
        for proto, stats in self.by_protocol.items():
            n, p50, p99 = int(stats["requests"]), stats["p50_ms"], stats["p99_ms"]
            lines.append(f"  {proto}: {n} requests, p50 {p50:.2f} ms, p99 {p99:.2f} ms")
        lines.extend(f"  error: {e}" for e in self.errors[:5])
        lines.append(("PASSED" if self.passed else "FAILED") + f": every response within {self.rule}")
        return "\n".join(lines)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation between order statistics; 0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _client(protocol: str, url: str, timeout_s: float) -> tuple[Any, Any]:
    if protocol == "http":
        import tritonclient.http as client_module

        return client_module, client_module.InferenceServerClient(
            url, connection_timeout=timeout_s, network_timeout=timeout_s
        )
    import tritonclient.grpc as client_module

    return client_module, client_module.InferenceServerClient(url)


def load_test(
    model: VisionTransformer,
    name: str,
    http_url: str,
    grpc_url: str,
    clients: int = 8,
    requests: int = 100,
    batch_sizes: Sequence[int] = (1, 2, 3, 4, 5, 6, 7, 8),
    dtype: torch.dtype | str = torch.float32,
    seed: int = 0,
    timeout_s: float = 60.0,
    encoded: Sequence[bytes] | None = None,
    broken_every: int = 0,
    protocols: Sequence[str] = PROTOCOLS,
) -> LoadTestReport:
    """Send ``clients`` x ``requests`` requests to model ``name`` (``host:port`` URLs; the clients take turns on
    ``protocols``: even HTTP, odd gRPC), each answer checked against ``model``'s own outputs in ``dtype`` and float64;
    ``timeout_s`` bounds each request. ``encoded``: image files' bytes (``--encoded``); with ``broken_every`` N, every
    Nth request of a client carries one that does not decode and must be refused alone (docs/deploy.md, "Serving
    encoded images: --encoded"). Returns the report without raising (``report.passed``)."""
    dtype = parse_dtype(dtype)
    if dtype not in _NP_TYPES:
        raise ValueError(f"the load test sends fp32 or fp16 images, got {dtype_name(dtype)}")
    for what, n in (("clients", clients), ("requests", requests)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{what} must be an int >= 1, got {n!r}")
    sizes = list(batch_sizes)
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise ValueError(f"batch sizes must be ints >= 1, got {batch_sizes!r}")
    if not protocols or any(p not in PROTOCOLS for p in protocols):
        raise ValueError(f"protocols must be some of {PROTOCOLS}, got {protocols!r}")
    if isinstance(broken_every, bool) or not isinstance(broken_every, int) or broken_every < 0:
        raise ValueError(f"broken_every must be an int >= 0, got {broken_every!r}")
    images_spec, output_spec = model_io(model, dtype)
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randn(POOL, *images_spec.dims, generator=gen).to(dtype)
    if encoded is not None:
        from vit_fast.interop.image_transform import image_transform
        from vit_fast.serve.encoded import ENCODED_INPUT

        if not encoded:
            raise ValueError("an encoded load test needs at least one encoded image to send")
        blobs = np.array([bytes(b) for b in encoded], dtype=np.object_)[:, None]
        transform = image_transform(model)
        pool = torch.stack([transform(b) for b in blobs[:, 0]]).to(dtype)
        images_spec = dataclasses.replace(images_spec, name=ENCODED_INPUT, dims=(1,))
    with torch.no_grad():
        ref64 = copy.deepcopy(model).cpu().double().eval().set_backend("torch")(pool.double())
        eager = copy.deepcopy(model).cpu().to(dtype).eval().set_backend("torch")(pool)
    triton_type, np_name = _NP_TYPES[dtype]
    pool_np = pool.numpy()
    if encoded is not None:
        triton_type, pool_np = "BYTES", blobs
    logits = bool(model.cfg.num_classes)

    report = LoadTestReport(name, clients, requests, sizes, dtype_name(dtype))
    lock = threading.Lock()
    latencies: dict[str, list[float]] = {p: [] for p in PROTOCOLS}
    start_gate = threading.Barrier(clients + 1)

    def run_client(index: int) -> None:
        protocol = protocols[index % len(protocols)]
        rng = random.Random(seed * 1000 + index)
        try:
            module, client = _client(protocol, http_url if protocol == "http" else grpc_url, timeout_s)
        except Exception as err:  # a client that cannot even connect: every one of its requests failed
            with lock:
                report.requests += requests
                report.errors.append(f"client {index} ({protocol}): cannot connect: {err}")
            start_gate.wait()
            return
        start_gate.wait()
        try:
            for k in range(requests):
                b = rng.choice(sizes)
                idx = [rng.randrange(len(pool_np)) for _ in range(b)]
                x = pool_np[idx]
                if broken_every and k % broken_every == broken_every - 1:
                    _send_broken(module, client, name, images_spec.name, x, protocol, index, timeout_s, report, lock)
                    continue
                inp = module.InferInput(images_spec.name, list(x.shape), triton_type)
                inp.set_data_from_numpy(x)
                t0 = time.perf_counter()
                try:
                    kwargs = {"timeout": int(timeout_s)} if protocol == "http" else {"client_timeout": timeout_s}
                    result = client.infer(name, [inp], **kwargs)
                    out = result.as_numpy(output_spec.name)
                except Exception as err:
                    with lock:
                        report.requests += 1
                        report.errors.append(f"client {index} ({protocol}): {type(err).__name__}: {err}")
                    continue
                ms = (time.perf_counter() - t0) * 1e3
                got = torch.from_numpy(np.array(out, dtype=np_name))  # a writable copy
                verdict = compare(got, eager[idx], ref64[idx], dtype, logits) if got.shape == eager[idx].shape else None
                with lock:
                    report.requests += 1
                    report.images += b
                    report.answered += 1
                    latencies[protocol].append(ms)
                    if verdict is None:
                        report.errors.append(
                            f"client {index} ({protocol}): output shape {tuple(got.shape)}, expected "
                            f"{tuple(eager[idx].shape)}"
                        )
                        continue
                    report.within_rule += bool(verdict["passed"])
                    report.bit_exact += bool(torch.equal(got, eager[idx]))
                    if verdict["bound"] > 0:
                        report.worst_ratio = max(report.worst_ratio, verdict["max_abs_err"] / verdict["bound"])
        finally:
            client.close()

    threads = [threading.Thread(target=run_client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    start_gate.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    report.wall_s = time.perf_counter() - t0
    every = latencies["http"] + latencies["grpc"]
    report.p50_ms, report.p99_ms = percentile(every, 50), percentile(every, 99)
    report.mean_ms = sum(every) / len(every) if every else 0.0
    report.max_ms = max(every, default=0.0)
    report.requests_per_s = report.answered / report.wall_s if report.wall_s > 0 else 0.0
    report.images_per_s = report.images / report.wall_s if report.wall_s > 0 else 0.0
    report.by_protocol = {
        p: {"requests": float(len(v)), "p50_ms": percentile(v, 50), "p99_ms": percentile(v, 99)}
        for p, v in latencies.items()
        if v
    }
    return report


#: what a broken request carries in place of one image: bytes no decoder identifies
BROKEN_IMAGE = b"\x89PNG\r\n\x1a\n this is not the rest of a PNG file"


def _send_broken(module, client, name, input_name, x, protocol, index, timeout_s, report, lock) -> None:  # noqa: ANN001
    x = x.copy()
    x[len(x) // 2, 0] = BROKEN_IMAGE
    inp = module.InferInput(input_name, list(x.shape), "BYTES")
    inp.set_data_from_numpy(x)
    kwargs = {"timeout": int(timeout_s)} if protocol == "http" else {"client_timeout": timeout_s}
    try:
        client.infer(name, [inp], **kwargs)
        problem = "a broken image was answered, not refused"
    except Exception as err:  # the refusal: its message must say which image and why, and carry no traceback
        text = str(err)
        problem = None if f"image {len(x) // 2} of the request" in text and "Traceback" not in text else text
    with lock:
        report.requests += 1
        report.broken += 1
        report.refused += problem is None
        if problem is not None:
            report.errors.append(f"client {index} ({protocol}): broken request: {problem[:300]}")


def load_test_in_child(
    model: VisionTransformer, name: str, http_url: str, grpc_url: str, **options: Any
) -> LoadTestReport:
    """:func:`load_test` with its clients in a process of their own (spawned: a fresh interpreter), as
    perf_analyzer runs them: no client thread shares the server's interpreter lock or its cores' scheduler
    slices with the model's forwards, so the latencies are what an outside client sees. Same arguments and report.
    A child that dies is an error naming its exit, not a hang."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        future = pool.submit(load_test, model, name, http_url, grpc_url, **options)
        try:
            return future.result()
        except BrokenProcessPool as err:
            raise RuntimeError(f"the load test's client process died before it reported: {err}") from err


__all__ = ["BROKEN_IMAGE", "LoadTestReport", "load_test", "load_test_in_child", "percentile"]
