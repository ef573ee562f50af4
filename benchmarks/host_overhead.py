"""Host (Python) time of the triton path per forward, measured on a CPU with Triton's GPU driver stubbed out.

What runs for real: the model's forward, our launchers and input checks, the ``torch.library``
custom ops, Triton's JIT dispatch (argument binding, specialisation, cache-key lookup), the
autotuner's key and config lookup, the grid functions, and every ``torch.empty``. What is
skipped: compilation (a stand-in kernel object is cached instead) and the C launcher with its
``cuLaunchKernel`` (published at about 3.4 µs per launch on top of what is measured here). What the
launcher does in Python's stead runs too: Triton's own ``CompiledKernel.launch_metadata`` wherever a
launch asks for metadata, and the launch hooks (``--launch-hook`` registers a trivial one).
Tensors live on the CPU, with glibc told to keep freed memory (``mallopt``), so a ``torch.empty``
reuses memory as a CUDA caching-allocator hit does instead of page-faulting fresh pages in.
Timed: ``forward_features`` (everything the triton path runs; the head is one torch GEMM). Counted in one more
forward: the Python frames entered and C functions called (``sys.setprofile``), which load does not move.
The stand-in kernel also records each launch's grid, so the same run counts launches
per forward and programs per launch.

    python benchmarks/host_overhead.py                       # ViT-S/B/L at batch 1, bf16
    python benchmarks/host_overhead.py --models vit_base_patch16_224 --json out.json
    python benchmarks/host_overhead.py --models vit_base_patch16_224 --launch-hook   # as under a profiler

Not a timed test: it prints a table (and optionally writes JSON). ``tests/kernels/test_launch_count.py``
runs it in a subprocess to count launches. Run it without ``TRITON_INTERPRET`` (it refuses).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # script_args beside this script, however it is loaded
    sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFAULT_MODELS = ("vit_small_patch16_224", "vit_base_patch16_224", "vit_large_patch16_224")


#: every stub kernel made, for :func:`forget_arguments`
_KERNELS: weakref.WeakSet = weakref.WeakSet()


def forget_arguments() -> None:
    """Drop the arguments each stub kernel keeps from its last launch (the dry run's batch-256 tensors would
    otherwise stay alive, one set per compiled kernel), and hand freed memory back to the system from then on: blocks
    over 1 MB come from mmap again and go back when freed. :func:`_keep_freed_memory` keeps them for timing; the dry
    run times nothing, and a kept heap split by small allocations grew past its address-space limit."""
    import ctypes
    import ctypes.util
    import gc

    for kernel in list(_KERNELS):
        kernel.last_args = ()
    gc.collect()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc


class _StubKernel:
    """What ``JITFunction.run`` needs from a compiled kernel; ``run`` records the launch instead of launching.
    ``launch_metadata`` and ``_init_handles`` are Triton's own ``CompiledKernel`` methods (set by
    :func:`install_stub_driver`), run on this object as on a loaded kernel, so building a launch's metadata costs
    here what it costs on a GPU; ``run`` calls the launch hooks as Triton's launcher does."""

    function = None
    packed_metadata = None
    module = "stub"  # loaded: CompiledKernel._init_handles returns at once, as for a kernel launched before

    def __init__(self, name: str, src, launches: list) -> None:
        self.name = name
        self.src = src  # the ASTSource Triton compiles from; launch_metadata reads its fn.launch_metadata
        self._launches = launches

    def run(self, grid_0, grid_1, grid_2, stream, function, packed_metadata, launch_metadata, enter, leave, *args):
        if enter is not None:  # what the C launcher does before cuLaunchKernel
            enter(launch_metadata)
        self._launches.append((self.name, grid_0 * grid_1 * grid_2))
        self.last_args = args  # every kernel parameter, constexprs included, as the C launcher gets them
        if leave is not None:
            leave(launch_metadata)


class _StubDriver:
    """Triton's active driver with no GPU behind it: current device ``self.device`` (0; a test's stand-in for
    ``torch.cuda.device`` may move it), stream 0, an sm_90 target, a benchmarker that returns the same time for
    every config (so the autotuner's first surviving config wins)."""

    def __init__(self) -> None:
        from triton.backends.compiler import GPUTarget

        self._target = GPUTarget("cuda", 90, 32)
        self.device = 0

    def get_current_device(self) -> int:
        return self.device

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self):
        return self._target

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")

    def get_benchmarker(self) -> Callable:
        def bench(fn, quantiles=None, **kwargs):
            return [1.0, 1.0, 1.0] if quantiles else 1.0

        return bench

    def is_active(self) -> bool:
        return True


def _keep_freed_memory() -> None:
    """glibc: serve large blocks from the heap and never hand freed memory back to the OS, so repeated
    activations of one size cost a free-list hit (as on CUDA's caching allocator), not fresh page faults."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass  # not glibc: allocation costs stay in the numbers


def install_stub_driver() -> list[tuple[str, int]]:
    """Replace Triton's driver and compiler with stand-ins; returns the list every launch is appended to
    as ``(kernel name, programs)``. Also lets CPU tensors past the kernels' device check and tells the model's
    backend check that there is a GPU (they would otherwise ask for a GPU or the interpreter)."""
    from vit_fast.base.interpret import interpreter_enabled  # the one reading of TRITON_INTERPRET

    if interpreter_enabled():
        raise SystemExit("host_overhead: unset TRITON_INTERPRET; this measures the compiled path's Python")
    # the stub cannot time configs: report the programs of the no-autotune heuristic, not of an arbitrary pick
    os.environ.setdefault("VIT_FAST_AUTOTUNE", "0")
    # nothing is computed (the stand-in launches write nothing): the first-use check would judge empty buffers and
    # send every op to eager PyTorch; its own steady-state cost is one lookup per forward
    # (vit_fast/backend/first_use.py)
    os.environ.setdefault("VIT_FAST_FIRST_USE_CHECK", "0")
    import triton
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime import jit

    _StubKernel.launch_metadata = CompiledKernel.launch_metadata
    _StubKernel._init_handles = CompiledKernel._init_handles
    launches: list[tuple[str, int]] = []
    triton.runtime.driver.set_active(_StubDriver())

    def do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
        kernel = _StubKernel(self.fn.__name__, self.ASTSource(self, signature, constexprs, attrs), launches)
        _KERNELS.add(kernel)
        self.device_caches[device][0][key] = kernel
        return kernel

    jit.JITFunction._do_compile = do_compile

    import vit_fast.backend.runtime
    from vit_fast.kernels import KERNELS

    def check_device(what, tensor) -> None:  # the real check's cost, with CPU standing in for CUDA
        if not (tensor.is_cuda or tensor.is_cpu or tensor.is_meta):  # the real check's first test: is_cuda
            raise RuntimeError(f"{what}: unexpected device {tensor.device}")

    for kernel in KERNELS.values():
        kernel.module  # noqa: B018 (imported, with the files whose checks it calls)
    # every kernel module that binds the device check: the kernel files, their checks files, the launch helpers
    kernel_modules = [m for name, m in list(sys.modules.items()) if name.startswith("vit_fast.kernels.")]
    for module in kernel_modules:
        if hasattr(module, "check_device"):
            module.check_device = check_device
    vit_fast.backend.runtime.cuda_available = lambda: True
    _keep_freed_memory()
    return launches


def add_launch_hook() -> list[bool]:
    """Register a trivial launch-enter hook in Triton's ``knobs.runtime.launch_enter_hook`` chain, as a profiler
    (proton, say) registers its own: every launch then builds its launch metadata and calls the hook. Returns the
    list each call appends to (whether it was given metadata)."""
    from triton import knobs

    calls: list[bool] = []

    def hook(metadata) -> None:
        calls.append(metadata is not None)

    knobs.runtime.launch_enter_hook.add(hook)
    return calls


def count_calls(fn: Callable[[], object]) -> tuple[int, int]:
    """Python frames entered (functions, and generators each time they resume) and C functions called in one
    ``fn()``, as ``sys.setprofile`` sees them: host work counted, which no load on the machine moves."""
    counts = [0, 0]

    def profile(frame, event: str, arg) -> None:
        if event == "call":
            counts[0] += 1
        elif event == "c_call":
            counts[1] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return counts[0], counts[1]


def measure(model_name: str, batch: int, dtype_name: str, iters: int, launches: list, hook_calls=None) -> dict:
    """Host µs per forward (median and min of ``iters``), launches per forward and programs per launch; with
    ``hook_calls`` (:func:`add_launch_hook`'s list), the hook's calls in the last forward and how many had
    metadata."""
    import torch

    from vit_fast import VisionTransformer
    from vit_fast.util.dtypes import parse_dtype

    dtype = parse_dtype(dtype_name)
    torch.manual_seed(0)
    model = VisionTransformer(model_name, backend="torch").eval().to(dtype)
    model.set_backend("triton")
    cfg = model.cfg
    x = torch.randn(batch, cfg.in_chans, cfg.img_size, cfg.img_size, dtype=dtype)
    times = []
    with torch.no_grad():
        for _ in range(3):  # warm-up: stand-in "compiles", autotuner picks, caches fill
            model.forward_features(x)
        python_calls, c_calls = count_calls(lambda: model.forward_features(x))  # one more, untimed
        for _ in range(iters):
            del launches[:]
            if hook_calls is not None:
                del hook_calls[:]
            start = time.perf_counter()
            model.forward_features(x)
            times.append(time.perf_counter() - start)
    per_forward_us = statistics.median(times) * 1e6
    programs: dict[str, list[int]] = {}
    for name, n in launches:
        programs.setdefault(name, []).append(n)
    row = {
        "model": model_name,
        "batch": batch,
        "dtype": dtype_name,
        "host_us_per_forward": round(per_forward_us, 1),
        "host_us_per_forward_min": round(min(times) * 1e6, 1),  # least disturbed by other load on the machine
        "launches": len(launches),
        "python_calls_per_forward": python_calls,  # sys.setprofile's "call" events: frames entered
        "c_calls_per_forward": c_calls,
        "host_us_per_launch": round(per_forward_us / max(len(launches), 1), 1),
        "programs_per_kernel": {name: sorted(set(ns)) for name, ns in programs.items()},
        "launch_sequence": launches[: 2 + 7 * 1],  # the patch embedding and the first block, in order
    }
    if hook_calls is not None:
        row["hook_calls"] = len(hook_calls)
        row["hook_calls_with_metadata"] = sum(hook_calls)
    return row


def main(argv: list[str] | None = None) -> int:
    from script_args import ScriptParser, bounded, dtype

    def preset(text: str) -> str:
        from vit_fast import ViTConfig

        try:
            ViTConfig.from_name(text)
        except (ValueError, KeyError) as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return text

    parser = ScriptParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", type=preset, default=list(DEFAULT_MODELS), help="preset names")
    parser.add_argument("--batch", type=bounded(int, 1, 4096), default=1)
    parser.add_argument("--dtype", type=dtype, default="bf16")
    parser.add_argument(
        "--iters", type=bounded(int, 1, 100000), default=30, help="timed forwards per model (median reported)"
    )
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument(
        "--launch-hook", action="store_true", help="register a trivial Triton launch hook (as a profiler does)"
    )
    args = parser.parse_args(argv)
    from vit_fast.util.files import check_report_file, write_json_atomic

    try:  # before any measurement
        json_path = None if args.json is None else check_report_file(args.json, "--json")
    except (ValueError, OSError) as err:
        parser.error(str(err))
    launches = install_stub_driver()
    hook_calls = add_launch_hook() if args.launch_hook else None
    rows = [measure(m, args.batch, args.dtype, args.iters, launches, hook_calls) for m in args.models]
    head = f"{'model':<26} {'batch':>5} {'us/fwd med':>11} {'min':>8} {'launches':>9} {'us/launch':>10} {'py calls':>9}"
    print(head + "  programs per kernel")
    for r in rows:
        progs = ", ".join(f"{k.strip('_')}: {v}" for k, v in r["programs_per_kernel"].items())
        print(
            f"{r['model']:<26} {r['batch']:>5} {r['host_us_per_forward']:>11.1f} {r['host_us_per_forward_min']:>8.1f} "
            f"{r['launches']:>9} "
            f"{r['host_us_per_launch']:>10.1f} {r['python_calls_per_forward']:>9}  {progs}"
        )
        if hook_calls is not None:
            calls, with_metadata = r["hook_calls"], r["hook_calls_with_metadata"]
            print(f"  launch hook: {calls} calls in the last forward, {with_metadata} with metadata")
    if json_path is not None:
        write_json_atomic({"rows": rows}, json_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
