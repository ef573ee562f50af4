"""How our kernels are launched and what a launch records: each kernel's launches resolved once per shape
(:class:`ResolvedLaunches`: on the tensors' own device, tuning serialised per kernel, fp fusion pinned, the config of
each launch recorded per thread), :func:`record_launches` for whoever wants to see them, the one lock of interpreted
launches, the dtypes every kernel takes, and direct launch or op (:func:`launches_directly`). No GPU driver touched."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

import torch
import triton
from triton.runtime.autotuner import Autotuner
from triton.runtime.driver import driver

from vit_fast.base.interpret import interpreter_enabled, interpreter_version_problem
from vit_fast.base.versions import InterpreterVersionError

from .triton_seam import installed_seam

#: storage dtypes every kernel takes (accumulation is always fp32)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

#: Triton's ``enable_fp_fusion`` for every launch of our kernels: a * b + c contracted to one FMA, as triton <= 3.9
#: does by default and as every GPU measurement of these kernels so far ran. Passed per launch (a compile option,
#: so it is in Triton's kernel cache key), not read from ``TRITON_DEFAULT_FP_FUSION``: triton 3.9 warns that the
#: default will turn to off in 3.10, which would change our numerics; pinned here they do not move
FP_FUSION = True

#: Triton decides at import (when ``@triton.jit`` runs) whether the kernels are interpreted; the kernels' flags
#: follow that decision, read once rather than from the environment on every launch
INTERPRETED = interpreter_enabled()


#: which kinds of first use (False: compiling the heuristic configs, True: tuning) this process has announced
_ANNOUNCED: set[bool] = set()


def announce_first_compile(tune: bool, by: str | None = None) -> None:
    """Say once per process, on stderr, that the kernels are being compiled (or tuned) for a shape not seen
    before, and what that costs: the first forward of a new shape is otherwise seconds (minutes when tuning)
    with nothing shown. ``by``: a caller that has said it better already (``model.warmup``) marks it said.
    Silent under the interpreter (the test suite)."""
    if tune in _ANNOUNCED or INTERPRETED:
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


#: held by every interpreted launch of every kernel: Triton's interpreter keeps a launch's state in module globals
#: (one ``interpreter_builder`` holds the grid and the current program's ids, and each launch patches the
#: ``triton.language`` functions in place), so two launches at once in two threads, of one kernel or of two,
#: trample each other (``InterpreterError``: "x >= grid_dim[0]", "Did you forget to add @triton.jit").
#: Compiled launches take no such lock.
INTERPRETER_LOCK = threading.Lock()


class ResolvedLaunches:
    """A kernel's launches resolved once per shape (the compiled kernel, its grid, its constexprs and the autotuner's
    pick), so a repeated call skips Triton's JIT dispatch and the autotuner's lookup. Keyed on what Triton
    specialises on, the device and ``grid_key``; a miss goes through Triton's own path under a lock per kernel. Runs
    on the tensors' device; never touches a GPU driver before the first launch. The key, the interpreter, threads,
    :meth:`launched_config` and launch hooks: docs/kernels.md, section Resolved launches."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel  # @triton.autotune'd or @triton.jit'd
        self.enabled = not INTERPRETED
        # Triton's private launch call, behind its version's adapter (an unknown triton is refused here, at import)
        self.seam = installed_seam() if self.enabled else None
        # key -> (compiled kernel, grid, trailing arguments, config label, the seam's bound launch)
        self.cache: dict[tuple, tuple] = {}
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
        _, _, tail, self.launched.config, launch = entry  # the config recorded for this thread
        launch(driver.active.get_current_stream(device), args, tail)

    def launched_config(self) -> str | None:
        """The config this thread's latest launch of the kernel ran with, as :func:`config_label` names it (the
        heuristic's pick, the autotuner's, or the one a resolved launch replayed); None before this thread's first
        launch, and for a kernel that is not autotuned (its launcher passes its block sizes, read from the shape)."""
        return getattr(self.launched, "config", None)

    def _resolve(self, key: tuple, grid, args: tuple, constexprs: dict) -> None:
        """Triton's own path (tunes / compiles / launches), then the cache entry for ``key``. Under the lock."""
        compiled, config = self._triton(grid, args, constexprs)
        self.launched.config = config_label(config)
        if not self.seam.replayable(compiled):
            return  # e.g. an asynchronous compile in flight: nothing to cache yet
        self.cache[key] = self._entry(compiled, config, grid, args, constexprs)

    def _entry(self, compiled, config, grid, args: tuple, constexprs: dict) -> tuple:
        """``(compiled kernel, grid as three ints, trailing arguments, config label, bound launch)`` of a launch
        through Triton: what the cache holds and :meth:`describe` reads (no launch for an interpreted one)."""
        meta = {
            **dict(zip(self.arg_names, args, strict=False)),
            **constexprs,
            **(config.all_kwargs() if config else {}),
        }
        g = grid(meta) if callable(grid) else grid
        g = (*g, 1, 1)[:3]
        tail = tuple(meta[name] for name in self.arg_names[len(args) :])
        launch = None if compiled is None else self.seam.bind(compiled, g)
        return compiled, g, tail, config_label(config), launch

    def _triton(self, grid, args: tuple, constexprs: dict) -> tuple:
        """Launch through Triton (compiling on first use), under the lock; returns
        ``(compiled kernel, config or None)``. Not tuning (the ``TUNE`` key argument 0), the heuristic's one config
        goes straight to the JIT function, not through triton 3.6's Autotuner, and is set as the autotuner's
        ``best_config`` too. Why: docs/kernels.md, section Resolved launches."""
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
        compiled, grid, tail, _label, _launch = entry
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


# ---------------------------------------------------------------------------------- direct launch or op
# bound once: every launch asks. Traced by dynamo (torch.compile, strict export) is_dynamo_compiling() is True;
# non-strict export and FakeTensorMode are dispatch modes, with tensors of other types
_compiling, _dispatch_modes, _grad_enabled = (
    torch.compiler.is_dynamo_compiling,
    torch._C._len_torch_dispatch_stack,
    torch.is_grad_enabled,
)


def launches_directly(x: object, args: tuple = (), others: tuple[int, ...] = ()) -> bool:
    """Direct launch (True) or the ``torch.library`` op (False) for a call whose activation is ``x`` and whose other
    tensor inputs are ``args[i]`` for ``i`` in ``others``, decided here and nowhere else: the launcher itself in plain
    eager where no input wants a gradient (the op's dispatch costs about 10 µs and buys nothing there); traced, under
    a dispatch mode, on meta or differentiated, the op (its fake, its recompute backward). See docs/kernels.md."""
    if type(x) is not torch.Tensor or _compiling() or _dispatch_modes() or x.is_meta:
        return False
    if not _grad_enabled():
        return True
    return not (x.requires_grad or any(args[i] is not None and args[i].requires_grad for i in others))


def forward_launches_directly(x: torch.Tensor) -> bool:
    """:func:`launches_directly` asked once for a whole forward on input ``x`` with autograd off, where no input's
    gradient matters: every call of that forward decides the same. With autograd on (a parameter may want its
    gradient) False: each call decides for itself."""
    return not _grad_enabled() and launches_directly(x)
