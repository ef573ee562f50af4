"""What every kernel file shares: supported dtypes, the autotune keys (row classes, the card, tuning on or off),
the interpreter's bf16 handling, the device check, the resolved launch (on the tensors' own device, tuning
serialised per kernel, fp fusion pinned, the config of each launch recorded per thread), and the backward that
recomputes through the eager reference.
Nothing here touches a GPU driver."""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
from collections.abc import Callable, Iterator

import torch
import triton
import triton.language as tl
from triton import knobs
from triton.runtime import _allocation
from triton.runtime.autotuner import Autotuner
from triton.runtime.driver import driver

from vit_fast.kernels._interpret import interpreter_enabled, interpreter_version_problem
from vit_fast.kernels._switches import parse_switch, switch
from vit_fast.kernels._versions import InterpreterVersionError
from vit_fast.kernels.cards import card_for_arch, card_of, device_sm_count

#: storage dtypes every kernel takes (accumulation is always fp32)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

#: Triton's ``enable_fp_fusion`` for every launch of our kernels: a * b + c contracted to one FMA, as triton <= 3.9
#: does by default and as every GPU measurement of these kernels so far ran. Passed per launch (a compile option,
#: so it is in Triton's kernel cache key), not read from ``TRITON_DEFAULT_FP_FUSION``: triton 3.9 warns that the
#: default will turn to off in 3.10, which would change our numerics; pinned here they do not move
FP_FUSION = True


def shared_memory_limit(arch: int) -> int:
    """Shared memory per block (bytes) on compute capability ``arch`` (e.g. 90), from the card table."""
    return card_for_arch(arch).shared_memory


# ---------------------------------------------------------------------------------- host arithmetic
def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for launchers and grids: ``triton.cdiv`` is a ConstexprFunction, 1.6 µs a call on the host."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` >= 1, as ``triton.next_power_of_2`` gives it, at host speed."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


# ---------------------------------------------------------------------------------- autotuning
#: rows (M = batch * tokens) up to which the GEMMs' narrow tiles are candidates and their heuristic counts 64-row
#: tiles to fill the GPU (ViT-B/16 at batch 2 is 394 rows)
SMALL_M = 512
#: upper ends of the row-count classes the autotuners key on. Up to SMALL_M one class per 64-row tile count (what
#: the prunes and heuristics read there), above it coarse classes: a ViT-B/16 server seeing batches 1..256
#: (M 197..50k) tunes 5 times per GEMM shape (classes 256, 448, 2048, 16384, large), not once per batch size
M_CLASSES = (*range(64, SMALL_M + 1, 64), 2048, 16384)


def m_class(m: int) -> int:
    """The autotune key for ``m`` rows: the first of :data:`M_CLASSES` that holds it, else 2**20 (large). A prune
    reads rows only through this, so whatever it decides holds for its whole class (the key's promise)."""
    if m <= SMALL_M:
        return 64 * cdiv(m, 64)
    for top in M_CLASSES[SMALL_M // 64 :]:
        if m <= top:
            return top
    return 1 << 20


#: set by :func:`tuning` for the block it wraps (this thread or task); None: the environment decides
_TUNING: contextvars.ContextVar[bool | None] = contextvars.ContextVar("vit_fast_tuning", default=None)
#: ``os.environ``'s own dict (encoded names and values) where CPython has one: every launch reads
#: ``VIT_FAST_AUTOTUNE`` (its ``TUNE`` key), and ``os.environ.get`` of an unset name raises and catches a KeyError
#: inside, several times the cost of this lookup
_ENVIRON_DATA = getattr(os.environ, "_data", None)
_AUTOTUNE_KEY = os.environ.encodekey("VIT_FAST_AUTOTUNE") if _ENVIRON_DATA is not None else None
_PARSED: dict = {}  # raw value -> flag


def _autotune_env() -> bool:
    """``VIT_FAST_AUTOTUNE`` as a flag, read now (tests and users may set it at any time); a value that is not a
    switch raises :class:`~._switches.SwitchError`."""
    if _ENVIRON_DATA is None:
        return bool(switch("VIT_FAST_AUTOTUNE", False))
    raw = _ENVIRON_DATA.get(_AUTOTUNE_KEY)
    if raw is None:
        return False
    flag = _PARSED.get(raw)
    if flag is None:
        flag = _PARSED[raw] = bool(parse_switch("VIT_FAST_AUTOTUNE", os.environ.decodevalue(raw), False))
    return flag


def autotune_enabled() -> bool:
    """Whether the kernels time their autotune candidates. Off by default (a warm start: each kernel compiles one
    heuristic config per shape, with no timing, so a first forward costs a handful of compilations rather than a
    hundred). On inside :func:`tuning` (``model.warmup(..., tune=True)``, ``vit-fast serve --tune``, the bench), or
    for the whole process with ``VIT_FAST_AUTOTUNE=1``. Read per call."""
    forced = _TUNING.get()
    if forced is not None:
        return forced
    return _autotune_env()


@contextlib.contextmanager
def tuning(enabled: bool = True) -> Iterator[None]:
    """Within the block (this thread or task only), kernels launched for a shape not seen before time their
    candidates (``enabled=True``) or take the heuristic config (``False``), whatever ``VIT_FAST_AUTOTUNE`` says."""
    token = _TUNING.set(enabled)
    try:
        yield
    finally:
        _TUNING.reset(token)


def tune_key() -> int:
    """The kernels' ``TUNE`` argument (never read by the kernel, one of its autotune keys): 1 where
    :func:`autotune_enabled`, else 0. So a cached heuristic pick never answers a later tuned request for the same
    shape, nor a tuned pick a heuristic one."""
    return int(autotune_enabled())


def tuning_requested(named_args: dict) -> bool:
    """Whether a prune should keep every fitting candidate for timing: the launch's ``TUNE`` key argument, so the
    prune decides by what its cache entry is keyed on; :func:`autotune_enabled` for a prune asked directly
    (``tools/compile_check.py``, tests), which passes no ``TUNE``."""
    tune = named_args.get("TUNE")
    return autotune_enabled() if tune is None else bool(tune)


def config_mode() -> tuple[int, bool]:
    """What decides which config a launch runs besides its own arguments' shapes, dtypes, alignment and device,
    read now: the tuning mode (:func:`tune_key`) and the TMA switch (:func:`tma_enabled`). A cache that answers
    for launches without making them (the first-use net's cleared forwards, ``vit_fast.backend.triton_path``) keys on it,
    so a tuned config is never taken for the heuristic one it replaced."""
    return tune_key(), tma_enabled()


def autotune_cache_enabled() -> bool:
    """True unless ``VIT_FAST_AUTOTUNE_CACHE=0``: tuned configs are saved in Triton's cache directory
    (``TRITON_CACHE_DIR``, default ``~/.triton/cache``), so a second process starts tuned."""
    return bool(switch("VIT_FAST_AUTOTUNE_CACHE", True))


#: num_stages of the GEMM-like configs meant for cards without tensor cores (sm_75): every other config has more,
#: so a prune tells the two sets apart by it
FMA_STAGES = 2


def fma_tile_fits(block_m: int, block_n: int, elem_bytes: int) -> bool:
    """Whether a GEMM-like output tile (4 warps) is expected not to spill where ``tl.dot`` is FMA (sm_75):
    fp32 up to 64x64, 16-bit up to 2048 elements. From triton 3.9's compiles for sm_75 (linear with the
    LayerNorm + GELU and residual + LayerScale epilogues, patch embedding): 64x64x32 spilled 1.0-1.3 KB per
    thread in fp16 and none in fp32; 32x64x32 fp16 and 32x32x32 fp32 spilled nothing (64x32 holds as many
    accumulators as 32x64; not compiled)."""
    return block_m * block_n <= (64 * 64 if elem_bytes == 4 else 32 * 64)


def gemm_shared_bytes(card, config: triton.Config, block_m: int, block_n: int, block_k: int, elem_bytes: int) -> int:
    """Shared memory of a GEMM-like tile loop (``[block_m, block_k] @ [block_k, block_n]`` per step) on ``card``,
    as the prunes compare it with ``card.shared_memory``. On the wgmma / tcgen05 cards (sm_90, sm_100):
    ``num_stages - 1`` stages of both operand tiles, what Triton 3.9 lays out on sm_90 (tools/compile_check.py).
    Other cards: every stage counted, an upper bound of what triton 3.9 reported for sm_86 (128x128x32 fp32,
    3 stages: 80.5 KB against 96 KB here; 64x32x64 fp32, 4 stages: 89.5 KB against 96 KB) and sm_75 (64x64x32
    fp16, 2 stages: 8 KB against 16 KB; sm_75 has no asynchronous copies to pipeline)."""
    stages = config.num_stages - 1 if card.dot in ("wgmma", "tcgen05") else config.num_stages
    return max(stages, 1) * (block_m + block_n) * block_k * elem_bytes


def closest_config(configs: list[triton.Config], want: dict, num_warps: int, num_stages: int) -> triton.Config:
    """The config of ``configs`` nearest ``want`` (block sizes; then warps and stages): how the heuristic
    of the no-autotune mode stays inside the autotune set (so the offline compile check covers it)."""

    def distance(config: triton.Config) -> tuple:
        blocks = sum(abs(config.kwargs[k].bit_length() - v.bit_length()) for k, v in want.items() if k in config.kwargs)
        return blocks, abs(config.num_warps - num_warps), abs(config.num_stages - num_stages)

    return min(configs, key=distance)


# ---------------------------------------------------------------------------------- TMA and persistent kernels
def tma_enabled() -> bool:
    """False when ``VIT_FAST_TMA=0``: the GEMM's persistent TMA configs are never candidates (read per tuning)."""
    return bool(switch("VIT_FAST_TMA", True))


def tma_usable(*operands: tuple[torch.Tensor, int]) -> bool:
    """Whether row-major 2-D operands, each given as ``(tensor, row stride in elements)``, can be read through
    TMA descriptors: ``VIT_FAST_TMA`` not off, a Hopper-class GPU (sm_90 or newer; a CPU tensor counts, for the
    interpreter and the offline compile check), 16-byte aligned bases and row strides (the hardware's rule)."""
    if not tma_enabled():
        return False
    for tensor, row_stride in operands:
        if not isinstance(tensor, torch.Tensor) or tensor.data_ptr() % 16 or row_stride * tensor.element_size() % 16:
            return False
        if not card_of(tensor.device).tma:
            return False
    return True


def persistent_programs(device: torch.device) -> int:
    """Programs a persistent kernel launches at most: one per SM of ``device`` on a GPU
    (:func:`~.cards.device_sm_count`); 3 in the interpreter, so the tests see each program walk several tiles."""
    return device_sm_count(device) if device.type == "cuda" else 3


def _torch_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")  # the caching allocator: 512-byte aligned


def ensure_scratch_allocator() -> None:
    """Give Triton an allocator for kernels' scratch memory (where device-side TMA descriptors live) unless one is
    set: Triton keeps it per thread (a ContextVar), so a launcher calls this before each launch that may need it
    (about 0.2 µs). A user's own ``triton.set_allocator`` is left alone."""
    if _INTERPRETED:
        return
    current = getattr(_allocation, "_allocator", None)
    if current is None or isinstance(current.get(), _allocation.NullAllocator):
        triton.set_allocator(_torch_scratch)


# ---------------------------------------------------------------------------------- host overhead
def eager_direct(x: torch.Tensor, *tensors: torch.Tensor | None) -> bool:
    """True when a public op may call its launcher directly rather than through its ``torch.library`` op:
    plain eager execution (not traced by torch.compile or export, no dispatch mode such as FakeTensorMode
    active, ``x`` a plain tensor with data, no input needing a gradient). The custom op's dispatch costs
    about 10 µs per call and buys nothing there; traced or differentiated, the op is what runs."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() or type(x) is not torch.Tensor:
        return False
    if x.is_meta:
        return False
    if torch.is_grad_enabled():
        return not any(t is not None and t.requires_grad for t in (x, *tensors))
    return True


#: which kinds of first use (False: compiling the heuristic configs, True: tuning) this process has announced
_ANNOUNCED: set[bool] = set()


def announce_first_compile(tune: bool, by: str | None = None) -> None:
    """Say once per process, on stderr, that the kernels are being compiled (or tuned) for a shape not seen
    before, and what that costs: the first forward of a new shape is otherwise seconds (minutes when tuning)
    with nothing shown. ``by``: a caller that has said it better already (``model.warmup``) marks it said.
    Silent under the interpreter (the test suite)."""
    if tune in _ANNOUNCED or _INTERPRETED:
        return
    _ANNOUNCED.add(tune)
    if by is not None:
        return
    if tune:
        text = (
            "tuning the Triton kernels for a new shape: every candidate config compiled and timed (about 100 "
            "compilations for a ViT-B/16 batch class: minutes on first use; saved in Triton's cache for next time)"
        )
    else:
        text = (
            "compiling the Triton kernels for a new shape (first use in this process: seconds per kernel, cached on "
            "disk for next time); model.warmup(batch_sizes) does this before real traffic"
        )
    print(f"vit-fast: {text}", file=sys.stderr, flush=True)


def config_label(config: triton.Config | None) -> str | None:
    """How a launch's config is named where it is recorded (:meth:`ResolvedLaunches.launched_config`, the first-use
    net's keys and findings): ``str(config)``, equal for equal configs (one reloaded from Triton's autotune cache on
    disk included); None for none (a kernel that is not autotuned)."""
    return None if config is None else str(config)


#: Triton's chain of launch hooks: ``knobs.runtime.launch_enter_hook`` and ``launch_exit_hook`` are one each in
#: triton 3.6 and 3.9, never None, and a profiler (proton, say) adds its hook to them (``.add``)
_HOOK_CHAIN = getattr(knobs, "HookChain", ())


def _calls_something(hook) -> bool:
    """Whether Triton's launcher would call anything through launch hook ``hook``: a chain with a hook in it, or
    a plain callable a user set in the chain's place. Triton's ``CompiledKernel.launch_metadata`` tests only
    ``hook is None``, which a chain never is, so Triton's own launch path builds the metadata on every launch
    (triton 3.6 and 3.9); torch's static launcher tests an empty chain this way too."""
    return bool(hook.calls) if isinstance(hook, _HOOK_CHAIN) else hook is not None


#: held by every interpreted launch of every kernel: Triton's interpreter keeps a launch's state in module globals
#: (one ``interpreter_builder`` holds the grid and the current program's ids, and each launch patches the
#: ``triton.language`` functions in place), so two launches at once in two threads, of one kernel or of two,
#: trample each other (``InterpreterError``: "x >= grid_dim[0]", "Did you forget to add @triton.jit").
#: Compiled launches take no such lock.
INTERPRETER_LOCK = threading.Lock()


class ResolvedLaunches:
    """A kernel's launches resolved once per shape: the compiled kernel, its grid and its constexprs
    (the autotuner's pick included), so a repeated call skips Triton's JIT dispatch (argument binding and
    specialisation, 16-18 µs) and the autotuner's lookup (about 12 µs) and goes straight to the launcher.

    The key holds every non-pointer argument by value, each pointer argument's dtype and whether its address
    is 16-byte aligned (what Triton specialises pointers on; the pointer parameters, ``*_ptr``, come first and
    always get tensors), the constexprs, the device and ``grid_key``
    (whatever else the grid depends on); anything else that changes misses the cache and goes through
    Triton's own path, which resolves it again. Under the interpreter (decided at import, as Triton decides
    its kernels' kind) every call goes through Triton, one at a time in the whole process
    (:data:`INTERPRETER_LOCK`), and raises :class:`~._versions.InterpreterVersionError` where the installed triton
    and numpy break the interpreter. Never touches a GPU driver before the first launch.

    Every launch runs on the device of the first tensor argument: Triton launches on the current device, so
    when the tensors live on another one the launch (Triton's path and the resolved one alike) runs under a
    ``torch.cuda.device`` guard for theirs; when they are on the current device (the usual case) that costs one
    ``get_device()`` and a comparison. A miss (Triton's own path: tuning, compiling) holds a lock per kernel,
    because Triton's Autotuner keeps per-call state on itself (``nargs``) and two threads tuning at once would
    trample it; the resolved path takes no lock. Every launch passes ``enable_fp_fusion`` (:data:`FP_FUSION`).

    Each launch records, for its own thread, the config it ran with (:meth:`launched_config`): a resolved launch
    replays its cache entry without the autotuner, so the autotuner's ``best_config`` names whatever config went
    through Triton last (another shape, the other tuning mode, another thread), not necessarily this launch's.

    A resolved launch builds Triton's launch metadata and hands the launcher the launch hooks only while a hook is
    registered (:func:`_calls_something`); Triton's own path builds it on every launch (about 0.7 µs on a 2-core
    CPU machine here, plus 0.1 µs for each empty hook chain the launcher calls).
    """

    def __init__(self, kernel) -> None:
        self.kernel = kernel  # @triton.autotune'd or @triton.jit'd
        self.enabled = not _INTERPRETED
        self.cache: dict[tuple, tuple] = {}  # key -> (compiled kernel, grid, trailing arguments, config label)
        self.lock = threading.Lock()  # held only on a miss: Triton's dispatch, the autotuner's state
        self.launched = threading.local()  # .config: the label of the config of this thread's latest launch
        jit_fn = kernel
        while isinstance(jit_fn, Autotuner):
            jit_fn = jit_fn.fn  # the autotuner's JITFunction (an InterpretedFunction under the interpreter)
        self.jit_fn = jit_fn
        self.arg_names: list[str] = list(jit_fn.arg_names)
        # a heuristic pick (TUNE key 0) is launched straight through the JIT function: see _triton
        self.prune = getattr(kernel, "early_config_prune", None) if "TUNE" in self.arg_names else None
        # the kernel template puts its pointer parameters (``*_ptr``, always given tensors) first: the key reads
        # their dtype and alignment by position, with no type test per argument
        self.num_pointers = next((i for i, n in enumerate(self.arg_names) if not n.endswith("_ptr")), 0)
        if any(n.endswith("_ptr") for n in self.arg_names[self.num_pointers :]):
            raise TypeError(f"{kernel}: pointer parameters (*_ptr) must come before every other parameter")

    def __call__(self, grid, grid_key: tuple, *args, **constexprs) -> None:
        """``kernel[grid](*args, **constexprs)`` on the tensors' device, from the cache when this shape was
        launched there before."""
        if not self.enabled:
            problem = interpreter_version_problem()
            if problem is not None:  # refused before any launch: only kernels with no runtime loop bound would run
                raise InterpreterVersionError(problem)
            with INTERPRETER_LOCK:  # one interpreted launch at a time in the process: its state is global
                _, config = self._triton(grid, args, constexprs)
                self.launched.config = config_label(config)
            if _RECORDED is not None:  # nothing compiled: the entry's kernel is None, the rest as resolved
                _RECORDED.append((self, self._entry(None, config, grid, args, constexprs)))
            return
        device = driver.active.get_current_device()
        tensors_device = args[0].get_device()  # -1 for a CPU tensor (the stubbed driver of the host-time benchmark)
        if tensors_device != device and tensors_device >= 0:
            with torch.cuda.device(tensors_device):
                self(grid, grid_key, *args, **constexprs)  # their device is current now: the path below
            return
        n = self.num_pointers
        key = (device, grid_key, *constexprs.values(), *args[n:], *[(t.dtype, not t.data_ptr() & 15) for t in args[:n]])
        entry = self.cache.get(key)
        if entry is None:
            with self.lock:
                if key not in self.cache:
                    self._resolve(key, grid, args, constexprs)
                    if _RECORDED is not None and key in self.cache:
                        _RECORDED.append((self, self.cache[key]))
                    return
            entry = self.cache[key]  # another thread resolved it while this one waited: launch as resolved
        if _RECORDED is not None:
            _RECORDED.append((self, entry))
        compiled, (g0, g1, g2), tail, self.launched.config = entry  # the config recorded for this thread
        stream = driver.active.get_current_stream(device)
        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        if _calls_something(enter) or _calls_something(leave):
            metadata = compiled.launch_metadata((g0, g1, g2), stream, *args, *tail)
        else:  # no hook to call: no metadata to build, nothing for the launcher to call
            metadata = enter = leave = None
        compiled.run(
            g0, g1, g2, stream, compiled.function, compiled.packed_metadata, metadata, enter, leave, *args, *tail
        )

    def launched_config(self) -> str | None:
        """The config this thread's latest launch of the kernel ran with, as :func:`config_label` names it (the
        heuristic's pick, the autotuner's, or the one a resolved launch replayed); None before this thread's first
        launch, and for a kernel that is not autotuned (its launcher passes its block sizes, read from the shape)."""
        return getattr(self.launched, "config", None)

    def _resolve(self, key: tuple, grid, args: tuple, constexprs: dict) -> None:
        """Triton's own path (tunes / compiles / launches), then the cache entry for ``key``. Under the lock."""
        compiled, config = self._triton(grid, args, constexprs)
        self.launched.config = config_label(config)
        if compiled is None or not hasattr(compiled, "packed_metadata"):
            return  # e.g. an asynchronous compile in flight: nothing to cache yet
        self.cache[key] = self._entry(compiled, config, grid, args, constexprs)

    def _entry(self, compiled, config, grid, args: tuple, constexprs: dict) -> tuple:
        """``(compiled kernel, grid as three ints, trailing arguments, config label)`` of a launch through Triton:
        what the cache holds and :meth:`describe` reads."""
        meta = {
            **dict(zip(self.arg_names, args, strict=False)),
            **constexprs,
            **(config.all_kwargs() if config else {}),
        }
        g = grid(meta) if callable(grid) else grid
        g = (*g, 1, 1)[:3]
        tail = tuple(meta[name] for name in self.arg_names[len(args) :])
        return compiled, g, tail, config_label(config)

    def _triton(self, grid, args: tuple, constexprs: dict) -> tuple:
        """Launch through Triton (compiling on first use); returns ``(compiled kernel, config or None)``. Under the
        lock. Not tuning (the ``TUNE`` key argument 0), the prune keeps the heuristic's one config, and that config
        goes straight to the JIT function: triton 3.6's Autotuner times even a lone config (a benchmark per new
        shape on the GPU; "0 active drivers" under the interpreter), 3.9's would not. The config is set as the
        autotuner's ``best_config`` too, as a launch through the autotuner leaves its pick there (which only a launch
        through Triton updates: :meth:`launched_config` is the config of a launch)."""
        named = dict(zip(self.arg_names, args, strict=False))
        announce_first_compile(bool(named.get("TUNE")))  # once per process; silent under the interpreter
        if self.prune is not None and not named["TUNE"]:
            (config,) = self.prune(self.kernel.configs, named, **constexprs)
            self.kernel.best_config = config
            run = self.jit_fn[grid](*args, **constexprs, **config.all_kwargs(), enable_fp_fusion=FP_FUSION)
            return run, config
        run = self.kernel[grid](*args, **constexprs, enable_fp_fusion=FP_FUSION)
        return run, getattr(self.kernel, "best_config", None)

    def describe(self, entry: tuple) -> dict:
        """A resolved launch (a cache entry, or an interpreted launch's, whose compiled kernel is None) as the
        evidence run records it: the kernel, the config it ran (its constexprs, warps, stages), its programs, and
        what the compiler gave it (registers and spills per thread, shared memory per program, in bytes; None where
        the compiled kernel does not say, e.g. a stub, or where nothing was compiled)."""
        compiled, grid, tail, _label = entry
        meta = getattr(compiled, "metadata", None)
        constexprs = dict(zip(self.arg_names[len(self.arg_names) - len(tail) :], tail, strict=True))
        return {
            "kernel": self.jit_fn.__name__,
            "config": {k: v for k, v in constexprs.items() if k.isupper()},
            "num_warps": getattr(meta, "num_warps", None),
            "num_stages": getattr(meta, "num_stages", None),
            "programs": grid[0] * grid[1] * grid[2],
            "registers": getattr(compiled, "n_regs", None),
            "spills": getattr(compiled, "n_spills", None),
            "shared_bytes": getattr(meta, "shared", None),
        }


#: the list :func:`record_launches` fills while it is active, else None (one global read per launch)
_RECORDED: list | None = None


@contextlib.contextmanager
def record_launches() -> Iterator[list[dict]]:
    """Within the block, every launch of our kernels in this process is described (see
    :meth:`ResolvedLaunches.describe`) in the list this yields, in launch order, once the block ends. For the GPU
    evidence run, the peers' test runs and diagnostics. Under the interpreter every launch is recorded too, with
    nothing compiled: what the compiler would give (warps, stages, registers, spills, shared memory) reads None.
    Not reentrant."""
    global _RECORDED
    seen: list[tuple] = []
    described: list[dict] = []
    _RECORDED = seen
    try:
        yield described
    finally:
        _RECORDED = None
        described.extend(launches.describe(entry) for launches, entry in seen)


# ---------------------------------------------------------------------------------- bf16 under the interpreter
@triton.jit
def to_bf16_rtne(x):
    """fp32 -> bf16, round to nearest even, by hand. Only for the interpreter: its fp32 -> bf16
    cast truncates (twice eager's error); compiled, ``.to(tl.bfloat16)`` already rounds."""
    bits = x.to(tl.uint32, bitcast=True)
    bits += 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def dot(a, b, acc, IN_FP32: tl.constexpr):
    """``a @ b`` accumulated in fp32, onto ``acc`` unless it is None. ``IN_FP32``: the operands go in as
    fp32 at IEEE precision
    (fp32 inputs: not TF32, to stay within 2x of eager; bf16 under the interpreter, whose bf16 tl.dot is
    garbage (triton issue 11584): products of bf16 values are exact in fp32, so this is the GPU's bf16 dot)."""
    if IN_FP32:
        result = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        result = tl.dot(a, b, acc)
    return result


@triton.jit
def online_softmax_step(s, v, m_i, l_i, acc, IN_FP32: tl.constexpr):
    """One key tile of the streaming (online) softmax shared by the attention kernels: ``s [M, N]`` the tile's
    logits in log2 units with masked keys at -inf, ``v [N, D]`` its values; returns the running max, the running
    denominator and the ``p @ v`` accumulator, what was summed under the old max rescaled to the new one."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, None, IN_FP32)
    return m_new, l_i, acc


#: Triton decides at import (when ``@triton.jit`` runs) whether the kernels are interpreted; the kernels' flags
#: follow that decision, read once rather than from the environment on every launch
_INTERPRETED = interpreter_enabled()


def interpret_bf16(dtype: torch.dtype) -> bool:
    """bf16 under the interpreter: the kernels' ``ROUND_BF16`` flag (bf16 stores rounded by hand)."""
    return dtype == torch.bfloat16 and _INTERPRETED


def dot_in_fp32(dtype: torch.dtype) -> bool:
    """The kernels' ``DOT_IN_FP32`` flag (see :func:`dot`): fp32 inputs, or bf16 under the interpreter."""
    return dtype == torch.float32 or interpret_bf16(dtype)


# ---------------------------------------------------------------------------------- checks


def output_buffer(op: str, out: torch.Tensor | None, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """A launcher's output: ``out`` when it is ``shape`` in ``like``'s dtype and device with a contiguous last dim
    (a ValueError naming ``op`` and what differs otherwise), or a new tensor when ``out`` is None."""
    if out is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    if tuple(out.shape) != shape or out.dtype != like.dtype or out.device != like.device or out.stride(-1) != 1:
        raise ValueError(
            f"{op}: out must be [{', '.join(map(str, shape))}] {like.dtype} on {like.device} with a contiguous last "
            f"dim, got {tuple(out.shape)} {out.dtype} on {out.device} stride {tuple(out.stride())}"
        )
    return out


def check_device(what: str, tensor: torch.Tensor) -> None:
    """Raise before launch unless ``tensor`` can reach a kernel: CUDA, or CPU under the interpreter.
    Meta tensors pass: fake implementations run the same checks as the launchers."""
    if tensor.is_cuda or tensor.is_meta:
        return
    if tensor.device.type == "cpu":
        if interpreter_enabled():
            return
        raise RuntimeError(
            f"{what}: got a CPU tensor, but Triton kernels need a CUDA tensor on a CUDA GPU: move the inputs with "
            ".cuda(), or set TRITON_INTERPRET=1 before triton is imported to run the kernels in the (slow) CPU "
            "interpreter"
        )
    raise RuntimeError(f"{what}: tensors on {tensor.device} are not supported; the Triton kernels run on CUDA")


# ---------------------------------------------------------------------------------- autograd
def register_recompute_backward(op: torch.library.CustomOpDef, reference: Callable) -> None:
    """Give ``op`` a backward that recomputes its forward through the eager ``reference``, autograd on,
    and differentiates that. No backward kernel: exact (eager's own backward, in the precision
    ``reference`` computes in) but not fused, so it costs one eager forward and backward per call.

    ``reference`` takes the op's arguments in the op's order and returns its output(s) in the op's
    order. Tensor inputs that need a gradient and are floating point get one (a uint8 image does
    not); every other argument gets None.
    """

    def setup_context(ctx, inputs, output) -> None:
        ctx.tensor_positions = [i for i, v in enumerate(inputs) if isinstance(v, torch.Tensor)]
        ctx.others = {i: v for i, v in enumerate(inputs) if not isinstance(v, torch.Tensor)}
        ctx.save_for_backward(*(inputs[i] for i in ctx.tensor_positions))

    def backward(ctx, *grads):
        args = dict(ctx.others)
        for i, t in zip(ctx.tensor_positions, ctx.saved_tensors, strict=True):
            args[i] = t.detach().requires_grad_(bool(ctx.needs_input_grad[i]) and t.is_floating_point())
        args = [args[i] for i in range(len(args))]
        wanted = [i for i in ctx.tensor_positions if args[i].requires_grad]
        result = [None] * len(args)
        if not wanted:
            return tuple(result)
        with torch.enable_grad():
            outs = reference(*args)
            outs = outs if isinstance(outs, tuple) else (outs,)
            pairs = [(o, g) for o, g in zip(outs, grads, strict=True) if g is not None and o.requires_grad]
            if pairs:
                got = torch.autograd.grad(
                    [o for o, _ in pairs], [args[i] for i in wanted], [g for _, g in pairs], allow_unused=True
                )
                for i, g in zip(wanted, got, strict=True):
                    result[i] = g
        return tuple(result)

    op.register_autograd(backward, setup_context=setup_context)
