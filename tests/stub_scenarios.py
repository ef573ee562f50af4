"""Scenarios run in a subprocess with Triton's driver stubbed (benchmarks/host_overhead.py): nothing compiles or
launches, every compile and launch is recorded. ``python tests/stub_scenarios.py <scenario> [args]`` prints one
JSON line; tests/kernels/test_launch_device_and_tuning.py runs them (without TRITON_INTERPRET) and judges the result.

The stub's benchmarker gives each config a fixed time of its own (a CRC of the config), so a tuned pick is a
function of the candidates alone: tuning the same candidates in any order picks the same config.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import threading
import time
import types
import warnings
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import host_overhead  # noqa: E402

warnings.simplefilter("always")
caught = warnings.catch_warnings(record=True)
WARNINGS = caught.__enter__()  # every warning of the process, from triton's import on

LAUNCHES = host_overhead.install_stub_driver()

import torch  # noqa: E402
import triton  # noqa: E402
from triton.runtime import _allocation, autotuner, jit  # noqa: E402

from vit_fast.base import cards  # noqa: E402
from vit_fast.kernels import KERNELS, attention, autotune, linear  # noqa: E402

STUB = triton.runtime.driver.active
COMPILES: list[dict] = []  # one per compilation: kernel, device, enable_fp_fusion
LAUNCH_DEVICES: list[int] = []  # the stub driver's current device at each launch
TIMED: list[str] = []  # one per config timed by the autotuner
BENCH_SLEEP: dict[str, float] = {}  # seconds each timing takes, per thread name

_stub_compile = jit.JITFunction._do_compile


def _recording_compile(self, key, signature, device, constexprs, options, attrs, warmup):
    COMPILES.append({"kernel": self.fn.__name__, "device": device, "fp_fusion": options.enable_fp_fusion})
    return _stub_compile(self, key, signature, device, constexprs, options, attrs, warmup)


jit.JITFunction._do_compile = _recording_compile

_stub_run = host_overhead._StubKernel.run


def _recording_run(self, *args):
    LAUNCH_DEVICES.append(STUB.get_current_device())
    return _stub_run(self, *args)


host_overhead._StubKernel.run = _recording_run

_real_bench = autotuner.Autotuner._bench


def _bench(self, *args, config, **meta):
    """Time ``config`` for these arguments as a CRC of both (after running it once through the stub): each
    problem (the non-tensor arguments and the constexpr flags: the kernel's variant) has its own fastest config,
    a function of the problem and the candidates alone. With PREFER_TMA the persistent TMA configs are the
    fastest."""
    _real_bench(self, *args, config=config, **meta)
    time.sleep(BENCH_SLEEP.get(threading.current_thread().name, 0.0))
    TIMED.append(str(config))
    flags = sorted((k, v) for k, v in meta.items() if isinstance(v, (bool, int, float)))  # not the grid function
    problem = [a for a in args if not isinstance(a, torch.Tensor)] + flags
    t = 1.0 + zlib.crc32(f"{config}|{problem}".encode()) / 2**32
    if PREFER_TMA[0] and config.kwargs.get("TMA"):
        t -= 1.0
    return [t, t, t]


PREFER_TMA = [False]


autotuner.Autotuner._bench = _bench


def _run_once(fn, quantiles=None, **kwargs):
    """The stub driver's benchmarker, but running the config once: so a timed config compiles, as on a GPU."""
    fn()
    return [1.0, 1.0, 1.0] if quantiles else 1.0


STUB.get_benchmarker = lambda: _run_once


def _vit_b16_gemms(batch: int, dtype=torch.float16) -> list[tuple]:
    M, D = 197 * batch, 768
    return [(name, M, N, K, dtype) for name, N, K in (("qkv", 3 * D, D), ("proj", D, D), ("fc1", 4 * D, D))]


def _gemm(M: int, N: int, K: int, dtype, misaligned: bool = False) -> None:
    x = torch.empty((M, K + 4), dtype=dtype)[:, :K] if misaligned else torch.empty((M, K), dtype=dtype)
    linear.launch_linear(x, torch.empty((N, K), dtype=dtype))


def tuning_order(batches: str) -> dict:
    """Tune the ViT-B/16 GEMMs (fp16) at each batch of ``batches`` ("1,2,8") in that order; the pick per shape."""
    picks = {}
    with autotune.tuning():
        for batch in map(int, batches.split(",")):
            for name, M, N, K, dtype in _vit_b16_gemms(batch):
                _gemm(M, N, K, dtype)
                picks[f"b{batch} {name}"] = str(KERNELS["linear"].kernel.best_config)
    return {"picks": picks, "timed": len(TIMED)}


def epilogues() -> dict:
    """Two GEMMs of one (M, N, K), 1576 x 768 x 768 fp16, with different code around the dot, tuned in turn: fc1
    with the LayerNorm prologue and the GELU epilogue, and fc2 with bias + residual + LayerScale. The pick per
    variant, how many configs were timed (so how many tunings ran), the autotuner's keys; then each variant again,
    replayed from the resolved-launch cache: the config each replay ran. A second process given the same
    TRITON_CACHE_DIR reads each variant's own tuning back from disk (and times nothing)."""
    M, N, K, dtype = 197 * 8, 768, 768, torch.float16
    x, w, vector = torch.empty((M, K), dtype=dtype), torch.empty((N, K), dtype=dtype), torch.empty(N, dtype=dtype)
    residual, norm = torch.empty((M, N), dtype=dtype), {"ln_weight": vector, "ln_bias": vector, "ln_eps": 1e-6}
    variants = {
        "ln+fc1 gelu": lambda: linear.launch_linear(x, w, vector, "gelu", **norm),
        "fc2 bias+res+gamma": lambda: linear.launch_linear(x, w, vector, None, residual, vector),
    }
    picks, replayed = {}, {}
    with autotune.tuning():
        for name, launch in variants.items():
            launch()
            picks[name] = str(KERNELS["linear"].kernel.best_config)
        for name, launch in variants.items():
            launch()
            replayed[name] = KERNELS["linear"].launches.launched_config()
    return {
        "picks": picks,
        "timed": len(TIMED),
        "keys": len(KERNELS["linear"].kernel.cache),
        "resolved": len(KERNELS["linear"].launches.cache),
        "replayed": replayed,
    }


def launched_config() -> dict:
    """One GEMM shape launched without tuning, tuned, then again without (replayed from the resolved-launch cache,
    never through the autotuner), and tuned again in a fresh thread (replayed too): the config each launch recorded
    for its thread, the autotuner's ``best_config`` after the replayed heuristic launch, and how many configs were
    timed in all."""
    M, N, K = 197 * 8, 768, 768
    x, w = torch.empty((M, K), dtype=torch.float16), torch.empty((N, K), dtype=torch.float16)
    launches = KERNELS["linear"].launches
    seen = {}
    linear.launch_linear(x, w)
    seen["heuristic"] = launches.launched_config()
    with autotune.tuning():
        linear.launch_linear(x, w)
    seen["tuned"] = launches.launched_config()
    linear.launch_linear(x, w)
    seen["heuristic replayed"] = launches.launched_config()
    seen["best_config then"] = str(KERNELS["linear"].kernel.best_config)
    other = []

    def tuned_in_a_thread() -> None:
        with autotune.tuning():
            linear.launch_linear(x, w)
        other.append(launches.launched_config())

    thread = threading.Thread(target=tuned_in_a_thread)
    thread.start()
    thread.join()
    seen["tuned replayed in another thread"] = other[0]
    seen["this thread's after it"] = launches.launched_config()
    seen["timed"] = len(TIMED)
    seen["configs"] = [str(c) for c in KERNELS["linear"].kernel.configs]
    return seen


def misaligned_tma() -> dict:
    """Many fp16 rows, tuned with TMA allowed (aligned operands first), then the same shape with a row stride
    TMA cannot read; then a misaligned base address. The TMA flag of each pick."""
    M, N, K = 197 * 8, 2304, 768
    PREFER_TMA[0] = True
    with autotune.tuning():
        _gemm(M, N, K, torch.float16)
        aligned = KERNELS["linear"].kernel.best_config.kwargs["TMA"]
        _gemm(M, N, K, torch.float16, misaligned=True)
        strided = KERNELS["linear"].kernel.best_config.kwargs["TMA"]
        x = torch.empty(M * K + 1, dtype=torch.float16)[1:].view(M, K)  # 2 bytes past an aligned address
        linear.launch_linear(x, torch.empty((N, K), dtype=torch.float16))
        offset = KERNELS["linear"].kernel.best_config.kwargs["TMA"]
    # the heuristic too
    _gemm(M, N, K, torch.float16, misaligned=True)
    heuristic = KERNELS["linear"].kernel.best_config.kwargs["TMA"]
    # a fresh thread (as a server instance is) launching the tuned TMA config: Triton's scratch allocator is per
    # thread, and the descriptors need one
    allocator = []

    def fresh_thread() -> None:
        with autotune.tuning():
            _gemm(M, N, K, torch.float16)  # resolved in the main thread: no autotuner call here
        tma = SEEN[-1][-1]  # the launch's last kernel parameter: TMA
        allocator.append((tma, not isinstance(_allocation._allocator.get(), _allocation.NullAllocator)))

    thread = threading.Thread(target=fresh_thread)
    thread.start()
    thread.join()
    return {
        "aligned": aligned,
        "strided": strided,
        "offset": offset,
        "heuristic": heuristic,
        "fresh_thread_tma_allocator": allocator,
    }


def threads() -> dict:
    """Two threads launch the same new GEMM shape at the same moment, tuning on; each timing sleeps, 10 ms in one
    thread and 30 ms in the other, so the two first calls overlap and one would finish while the other still
    tunes. Whether each succeeded and whether its launches got its own tensors."""
    BENCH_SLEEP.update({"tuner-0": 0.01, "tuner-1": 0.03})
    M, N, K = 197 * 8, 768, 768
    barrier = threading.Barrier(2)
    results = [None, None]

    def work(i: int) -> None:
        x, w = torch.empty((M, K), dtype=torch.float16), torch.empty((N, K), dtype=torch.float16)
        barrier.wait()
        try:
            with autotune.tuning():
                out = linear.launch_linear(x, w)
        except Exception as e:  # noqa: BLE001 - reported to the test
            results[i] = f"{type(e).__name__}: {e}"
            return
        launched = [args for args in SEEN if args[0].data_ptr() == x.data_ptr()]
        results[i] = {
            "out": list(out.shape),
            "launches": len(launched),
            "own_out": all(args[7].data_ptr() == out.data_ptr() for args in launched),
        }

    threads = [threading.Thread(target=work, args=(i,), name=f"tuner-{i}") for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"results": results, "timed": len(TIMED), "compiles": len(COMPILES)}


SEEN: list[tuple] = []  # the arguments of every launch (the threads scenario checks each got its own tensors)
_run_before_seen = host_overhead._StubKernel.run


def _seeing_run(self, *args):
    SEEN.append(args[9:])  # after grid (3), stream, function, metadata (2), hooks (2): the kernel's arguments
    return _run_before_seen(self, *args)


host_overhead._StubKernel.run = _seeing_run


class _FakeDeviceGuard:
    """``torch.cuda.device(index)`` for the stub: moves the stub driver's current device for the block."""

    def __init__(self, index) -> None:
        self.index = index.index if isinstance(index, torch.device) else index

    def __enter__(self) -> None:
        self.previous = STUB.device
        STUB.device = self.index

    def __exit__(self, *exc) -> None:
        STUB.device = self.previous


def _vit_b16(dtype=torch.bfloat16):
    from vit_fast import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer("vit_base_patch16_224", backend="torch").eval().to(dtype)
    model.set_backend("triton")
    return model, torch.randn(1, 3, 224, 224, dtype=dtype)


def device(tensor_device: str) -> dict:
    """A ViT-B/16 forward (direct launches) and one call of each custom op, with every tensor reporting
    ``tensor_device`` (its ``get_device()``) while the current device is 0. The device of every launch."""
    torch.cuda.device = _FakeDeviceGuard
    index = int(tensor_device)
    torch.Tensor.get_device = lambda self: index
    asked = []  # the devices whose compute capability the launchers asked for (the card of the tensors' device)
    torch.cuda.get_device_capability = lambda i=None: (asked.append(i), (9, 0))[1]
    torch.cuda.get_device_properties = lambda i: types.SimpleNamespace(multi_processor_count=132)
    cards._cuda_arch.cache_clear()
    cards._cuda_sm_count.cache_clear()
    model, x = _vit_b16()
    with torch.no_grad():
        for _ in range(2):  # Triton's own path, then the resolved launches
            model.forward_features(x)
    forward = list(LAUNCH_DEVICES)
    del LAUNCH_DEVICES[:]
    # the torch.library ops (what torch.compile and autograd run): inputs needing a gradient take them
    a = torch.randn(8, 197, 64, dtype=torch.float16, requires_grad=True)
    w = torch.randn(96, 64, dtype=torch.float16)
    linear.linear(a, w)
    attention.attention(torch.randn(2, 197, 3 * 64, dtype=torch.float16, requires_grad=True), 2)
    torch.ops.vit_fast.layer_norm(a, None, None, 1e-6)
    ops = list(LAUNCH_DEVICES)
    return {"forward": forward, "ops": ops, "current_after": STUB.get_current_device(), "capability_of": asked}


def sm_counts() -> dict:
    """Two sm_90 devices, 0 with 108 SMs (an A100's count) and 1 with 132 (an H100 SXM's), their properties faked;
    ViT-S/16's qkv GEMM at batch 2 (394 x 1152 from 384, fp16) launched with its tensors on each in turn, twice
    each (Triton's own path, then the resolved launch): the programs of every launch. Then the same under
    tuning(): the SM counts the autotuner's cache is keyed on. And which devices' properties were asked."""
    torch.cuda.device = _FakeDeviceGuard
    on = [0]
    torch.Tensor.get_device = lambda self: on[0]
    torch.cuda.get_device_capability = lambda i=None: (9, 0)
    sms, asked = {0: 108, 1: 132}, []

    def properties(index: int) -> types.SimpleNamespace:
        asked.append(index)
        return types.SimpleNamespace(multi_processor_count=sms[index])

    torch.cuda.get_device_properties = properties
    cards._cuda_arch.cache_clear()
    cards._cuda_sm_count.cache_clear()
    programs = {0: [], 1: []}
    for index in (0, 1, 0, 1):
        on[0] = index
        _gemm(394, 1152, 384, torch.float16)
        programs[index].append(LAUNCHES[-1][1])
    with autotune.tuning():
        for index in (0, 1, 0, 1):
            on[0] = index
            _gemm(394, 1152, 384, torch.float16)
    # each cache key: the key arguments' values in the order of ``keys``, then the tensors' dtypes
    position = KERNELS["linear"].kernel.keys.index("SM_COUNT")
    tuned_sm_counts = sorted(key[position] for key in KERNELS["linear"].kernel.cache)
    return {"programs": programs, "tuned_sm_counts": tuned_sm_counts, "asked": asked}


def warm_start() -> dict:
    """Compilations before the first ViT-B/16 output with the default (no tuning), per kernel; then a forward
    under tuning() twice: what the first compiled and timed, and that the second reused it all."""
    model, x = _vit_b16()
    said = io.StringIO()  # what the kernels announce on stderr, once per kind of first use
    with torch.no_grad(), contextlib.redirect_stderr(said):
        model.forward_features(x)
        default = [c["kernel"] for c in COMPILES]
        timed_default = len(TIMED)
        said_default = said.getvalue()
        with autotune.tuning():
            model.forward_features(x)
            tuned_compiles, tuned_timed = len(COMPILES) - len(default), len(TIMED)
            said_tuned = said.getvalue()[len(said_default) :]
            model.forward_features(x)
            again_compiles, again_timed = len(COMPILES) - len(default) - tuned_compiles, len(TIMED) - tuned_timed
        model.forward_features(x)  # back to the default: the heuristic picks, already compiled
        after = len(COMPILES) - len(default) - tuned_compiles - again_compiles
        model.forward_features(x[:1].expand(2, -1, -1, -1).contiguous())  # a new shape: compiled, not announced again
        said_after = said.getvalue()[len(said_default) + len(said_tuned) :]
    return {
        "said_default": said_default,
        "said_tuned": said_tuned,
        "said_after": said_after,
        "default": default,
        "timed_default": timed_default,
        "tuned_compiles": tuned_compiles,
        "tuned_timed": tuned_timed,
        "again_compiles": again_compiles,
        "again_timed": again_timed,
        "default_after_tuning_compiles": after,
        "linear_keys": [list(map(str, k)) for k in KERNELS["linear"].kernel.cache],
        "fp_fusion": sorted({c["fp_fusion"] for c in COMPILES}),
        "fp_fusion_warnings": [str(w.message)[:120] for w in WARNINGS if "FP_FUSION" in str(w.message)],
    }


def launch_hooks() -> dict:
    """A GEMM launched through Triton's own path, then resolved launches with no launch hook, with a hook in
    Triton's enter chain, in its exit chain only, with a plain function set in the enter chain's place, and with
    none again. Per phase: the launch metadata built (the stub's ``launch_metadata`` is Triton's
    ``CompiledKernel.launch_metadata``), the hooks the launcher was handed and the calls each hook got."""
    from triton import knobs
    from triton.compiler.compiler import CompiledKernel

    triton_own = host_overhead._StubKernel.launch_metadata is CompiledKernel.launch_metadata
    built, handed, called = [], [], []

    def counting_metadata(self, *args):
        built.append(self.name)
        return CompiledKernel.launch_metadata(self, *args)

    def handing_run(self, g0, g1, g2, stream, function, packed, metadata, enter, leave, *args):
        handed.append([enter is not None, leave is not None, metadata is not None])
        return _seeing_run(self, g0, g1, g2, stream, function, packed, metadata, enter, leave, *args)

    host_overhead._StubKernel.launch_metadata = counting_metadata
    host_overhead._StubKernel.run = handing_run

    def hook(where: str):
        def record(metadata) -> None:
            data = metadata.get() if metadata is not None else None
            called.append([where, data and data["name"], data and data["stream"]])

        return record

    enter_hook, exit_hook, plain_hook = hook("enter"), hook("exit"), hook("plain")
    chain = knobs.runtime.launch_enter_hook
    phases = {}

    def phase(name: str, launches: int = 2) -> None:
        del built[:], handed[:], called[:]
        for _ in range(launches):
            _gemm(197, 96, 64, torch.float16)
        phases[name] = {"built": list(built), "handed": list(handed), "called": list(called)}

    phase("triton", launches=1)  # a new shape: Triton's own dispatch, which builds metadata on every launch
    phase("none")
    chain.add(enter_hook)
    phase("enter")
    chain.remove(enter_hook)
    knobs.runtime.launch_exit_hook.add(exit_hook)
    phase("exit")
    knobs.runtime.launch_exit_hook.remove(exit_hook)
    knobs.runtime.launch_enter_hook = plain_hook
    phase("plain")
    knobs.runtime.launch_enter_hook = chain
    phase("none_again")
    return {"triton_own": triton_own, "cached": len(KERNELS["linear"].launches.cache), "phases": phases}


SCENARIOS = {
    "launch_hooks": launch_hooks,
    "tuning_order": tuning_order,
    "epilogues": epilogues,
    "launched_config": launched_config,
    "misaligned_tma": misaligned_tma,
    "threads": threads,
    "device": device,
    "sm_counts": sm_counts,
    "warm_start": warm_start,
}

if __name__ == "__main__":
    assert "TRITON_INTERPRET" not in os.environ or os.environ["TRITON_INTERPRET"] in ("", "0")
    result = SCENARIOS[sys.argv[1]](*sys.argv[2:])
    print(json.dumps(result))
