"""Compile every Triton kernel variant ahead of time for a GPU target, without a GPU.

    python tools/compile_check.py                       # all kernels, sm_90 (H100), a table
    python tools/compile_check.py --kernels linear,attention --jobs 4 --csv out.csv
    python tools/compile_check.py --kernels layer_norm --filter fp16   # a subset: variants whose label has "fp16"
    python tools/compile_check.py --full                # every config x every flag variant (slow)

Each variant goes through the real GPU pipeline (ttir -> ttgir -> llir -> ptx -> cubin with the
ptxas shipped in the triton wheel) via ``triton.compile(ASTSource(...), target=GPUTarget(...))``,
specialised exactly as a launch would specialise it: the kernel's launcher (``launch_<op>``) runs on
CPU tensors of the variant's shapes, dtypes and strides with its kernel swapped for a recorder, and
the kernel's own binder runs on the recorded arguments (ints equal to 1 become constants, multiples
of 16 get the divisibility hint). Per variant it reports shared memory (``metadata.shared``, what the
launcher asks the driver for), registers and spill bytes (``ptxas -v`` on the kernel's PTX, the
same flags Triton uses), and flags shared memory above the target's per-block limit or spills.

Catches what the interpreter (TRITON_INTERPRET=1) cannot: type errors, constexpr misuse, dot
shapes the tensor cores reject, shared-memory overflow, register spills. It does not run
anything, so it says nothing about numerics or speed. Not collected by pytest (not test_*/bench_*);
needs no GPU and no driver. Exit status 1 if any variant fails or is flagged. Written against
triton 3.9; the one compile option 3.6 (the GPU machine's) lacks, ``fpsan_homomorphic_casts``, is
passed only where triton has it.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import csv
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures.process import BrokenProcessPool

from vit_fast.kernels._interpret import interpreter_enabled

if interpreter_enabled():
    sys.exit("compile_check: unset TRITON_INTERPRET: the compiled-mode autotune configs are the ones to check")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning

ALL_KERNELS = ("patch_embed", "layer_norm", "attention", "linear")
DTYPES = ("fp32", "fp16", "bf16")


def _torch_dtype(name):
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "u8": torch.uint8}[name]


def _empty(shape, dtype):
    import torch

    return torch.empty(shape, dtype=_torch_dtype(dtype))


class _Recorder:
    """Stands in for a kernel while its launcher runs: keeps the launch's arguments, launches nothing."""

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.args, self.kwargs = args, kwargs

        return launch


def _recorded_launch(module, kernel_name: str, launcher, *args, **kwargs):
    """(JITFunction, positional args, keyword args) of the launch ``launcher(*args, **kwargs)`` makes.

    The launcher itself runs on CPU tensors of the variant's shapes, dtypes and strides (its input
    checks skipped: they would refuse CPU tensors without the interpreter), with its kernel swapped
    for a recorder; so the kernel's argument list is written once, in the launcher."""
    kernel = getattr(module, kernel_name)
    recorder = _Recorder()
    # launchers launch through their ResolvedLaunches (``_<op>_launches``), which holds the kernel itself
    launches_name = kernel_name.replace("_kernel", "_launches")
    launches = getattr(module, launches_name, None)
    setattr(module, kernel_name, recorder)
    if launches is not None:
        setattr(module, launches_name, lambda grid, grid_key, *a, **k: recorder[grid](*a, **k))
    try:
        launcher(*args, **kwargs, checked=True)
    finally:
        setattr(module, kernel_name, kernel)
        if launches is not None:
            setattr(module, launches_name, launches)
    return kernel_fn(kernel), recorder.args, recorder.kwargs


def kernel_fn(kernel):
    """The JITFunction under an Autotuner (or the JITFunction itself: its own ``fn`` is the Python function)."""
    from triton.runtime.jit import JITFunction

    while not isinstance(kernel, JITFunction):
        kernel = kernel.fn
    return kernel


# ------------------------------------------------------------------------------ variants
# A task is (kernel, label, params); params are plain values so tasks cross process boundaries.


def _config_label(cfg) -> str:
    blocks = ",".join(f"{k[6:] if k.startswith('BLOCK_') else k}={v}" for k, v in cfg.kwargs.items())
    return f"{blocks} w{cfg.num_warps} s{cfg.num_stages}"


def _config_params(cfg) -> dict:
    return {"meta": dict(cfg.kwargs), "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


def patch_embed_tasks(full: bool):
    from vit_fast.kernels import patch_embed as pe

    # (C, p, D, B, H): ViT-B/16 at 224 px; the embedded digits model (8x8 grey, p=4, D=64)
    shapes = ((3, 16, 768, 8, 224), (1, 4, 64, 32, 8))
    images = ("float", "float+norm", "uint8+norm")
    # (HAS_CLS, num_reg, no_embed_class)
    prefixes = (
        (False, 0, False),
        (True, 0, False),
        (True, 0, True),
        (True, 4, False),
        (True, 4, True),
        (False, 4, True),
    )
    configs = pe._patch_embed_kernel.configs
    tasks = []
    for cfg, dtype, image, shape in itertools.product(configs, DTYPES, images, shapes):
        # every config: the heaviest flag set (bias, class + 4 register tokens) ...
        flag_sets = [(True, (True, 4, False))]
        # ... and the flag sweep (bias x prefix tokens x no_embed_class): with --full on every config and
        # shape, else on the largest tile (the most registers) at ViT-B/16's shape
        if full or (cfg is configs[-1] and shape is shapes[0]):
            flag_sets = list(itertools.product((False, True), prefixes))
        for bias, prefix in flag_sets:
            C, p, D, _, _ = shape
            label = (
                f"{_config_label(cfg)} | {dtype} {image} C{C} p{p} D{D} | bias={int(bias)} cls={int(prefix[0])} "
                f"reg={prefix[1]} nec={int(prefix[2])}"
            )
            tasks.append(
                (
                    "patch_embed",
                    label,
                    {
                        **_config_params(cfg),
                        "dtype": dtype,
                        "image": image,
                        "shape": shape,
                        "bias": bias,
                        "prefix": prefix,
                    },
                )
            )
    return tasks


def patch_embed_launch(params):
    from vit_fast.kernels import patch_embed as pe

    C, p, D, B, H = params["shape"]
    dtype, image = params["dtype"], params["image"]
    has_cls, num_reg, no_embed_class = params["prefix"]
    num_patches = (H // p) ** 2
    num_prefix = int(has_cls) + num_reg
    normalize = image.endswith("+norm")
    return _recorded_launch(
        pe,
        "_patch_embed_kernel",
        pe.launch_patch_embed,
        _empty((B, C, H, H), "u8" if image.startswith("uint8") else dtype),
        _empty((D, C, p, p), dtype),
        _empty((D,), dtype) if params["bias"] else None,
        _empty((1, num_patches + (0 if no_embed_class else num_prefix), D), dtype),
        _empty((1, 1, D), dtype) if has_cls else None,
        _empty((1, num_reg, D), dtype) if num_reg else None,
        no_embed_class=no_embed_class,
        mean=_empty((C,), "fp32") if normalize else None,
        std=_empty((C,), "fp32") if normalize else None,
    )


def layer_norm_tasks(full: bool):
    tasks = []
    for dtype, D, res, weight, bias in itertools.product(
        DTYPES, (64, 768, 1024, 1280), (False, True), (False, True), (False, True)
    ):
        label = f"{dtype} D{D} | res={int(res)} weight={int(weight)} bias={int(bias)}"
        tasks.append(("layer_norm", label, {"dtype": dtype, "D": D, "res": res, "weight": weight, "bias": bias}))
    return tasks


def layer_norm_launch(params):
    from vit_fast.kernels import layer_norm as ln

    M, D, dtype = 197 * 8, params["D"], params["dtype"]
    # the launcher picks the compiled-mode block sizes and warps itself (TRITON_INTERPRET unset)
    return _recorded_launch(
        ln,
        "_layer_norm_kernel",
        ln.launch_add_layer_norm,
        _empty((M, D), dtype),
        _empty((M, D), dtype) if params["res"] else None,
        _empty((D,), dtype) if params["weight"] else None,
        _empty((D,), dtype) if params["bias"] else None,
        1e-6,
    )


ATTENTION_HEADS = {32: 12, 64: 12, 80: 16, 96: 12, 128: 16, 256: 4}  # head_dim -> num_heads (256: MAX_HEAD_DIM)


def attention_tasks(full: bool):
    from vit_fast.kernels import attention as at

    kernel = at._attention_kernel
    tasks = []
    for head_dim, dtype in itertools.product(ATTENTION_HEADS, DTYPES):
        block_d = at.block_d_for(head_dim)
        # the autotuner's own early prune for the shape (fp16: nothing dropped for shared memory; each row
        # says whether the prune drops the config for its own dtype)
        kept = kernel.early_config_prune(kernel.configs, {"BLOCK_D": block_d}, BLOCK_D=block_d)
        if not full and head_dim in (80, 96):
            # same tiles as Dh 128 (BLOCK_D 128), only the masks differ: the smallest and largest tile
            kept = [kept[0], kept[-1]]
        for cfg in kept:
            label = f"{_config_label(cfg)} | {dtype} Dh{head_dim}"
            tasks.append(("attention", label, {**_config_params(cfg), "dtype": dtype, "head_dim": head_dim}))
    return tasks


def attention_launch(params):
    from vit_fast.kernels import attention as at

    B, T, Dh = 8, 197, params["head_dim"]
    H = ATTENTION_HEADS[Dh]
    return _recorded_launch(
        at, "_attention_kernel", at.launch_attention, _empty((B, T, 3 * H * Dh), params["dtype"]), H
    )


# (label, (M, N, K), activation, bias, residual, gamma): the ViT-B/16 block's GEMMs, batch 8; "ln+" labels
# have the LayerNorm prologue (layer_norm_linear: LN1 -> qkv, LN2 -> fc1)
LINEAR_VARIANTS = (
    ("qkv none+bias", (1576, 2304, 768), "none", True, False, False),
    ("ln+qkv none+bias", (1576, 2304, 768), "none", True, False, False),
    ("ln+fc1 gelu+bias", (1576, 3072, 768), "gelu", True, False, False),
    # batch 1 (197 rows): the narrow small-M tiles (BLOCK_N 16 / 32) are candidates only here
    ("ln+qkv b1 none+bias", (197, 2304, 768), "none", True, False, False),
    ("fc2 b1 bias+res+gamma", (197, 768, 3072), "none", True, True, True),
    ("fc1 gelu+bias", (1576, 3072, 768), "gelu", True, False, False),
    ("fc1 gelu_tanh+bias", (1576, 3072, 768), "gelu_tanh", True, False, False),
    ("fc2 bias+res+gamma", (1576, 768, 3072), "none", True, True, True),
)

# every config for the heaviest epilogues (erf GELU; residual + LayerScale); the others on two tiles unless --full
LINEAR_EVERY_CONFIG = ("fc1 gelu+bias", "fc2 bias+res+gamma", "ln+fc1 gelu+bias")


def linear_tasks(full: bool):
    from vit_fast.kernels import linear as li

    kernel = li._linear_kernel
    tasks = []
    for variant, dtype in itertools.product(LINEAR_VARIANTS, DTYPES):
        name, (M, N, K) = variant[0], variant[1]
        kept = kernel.early_config_prune(kernel.configs, {"M": M, "N": N, "K": K})
        if not full and " b1 " in name:
            kept = [c for c in kept if c.kwargs["BLOCK_N"] < 64]  # batch 1: the narrow tiles only batch 1-2 gets
        elif not full and name not in LINEAR_EVERY_CONFIG:
            kept = [kept[0], kept[-1]]  # epilogue-only variants: the smallest and largest tile
        for cfg in kept:
            tasks.append(
                (
                    "linear",
                    f"{_config_label(cfg)} | {dtype} {name}",
                    {**_config_params(cfg), "dtype": dtype, "variant": variant},
                )
            )
    return tasks


def linear_launch(params):
    from vit_fast.kernels import linear as li

    name, (M, N, K), act, has_bias, has_res, has_gamma = params["variant"]
    dtype = params["dtype"]
    ln = {"ln_weight": _empty((K,), dtype), "ln_bias": _empty((K,), dtype), "ln_eps": 1e-6} if name[:3] == "ln+" else {}
    return _recorded_launch(
        li,
        "_linear_kernel",
        li.launch_linear,
        _empty((M, K), dtype),
        _empty((N, K), dtype),
        _empty((N,), dtype) if has_bias else None,
        None if act == "none" else act,
        _empty((M, N), dtype) if has_res else None,
        _empty((N,), dtype) if has_gamma else None,
        **ln,
    )


TASKS = {
    "patch_embed": patch_embed_tasks,
    "layer_norm": layer_norm_tasks,
    "attention": attention_tasks,
    "linear": linear_tasks,
}
LAUNCH = {
    "patch_embed": patch_embed_launch,
    "layer_norm": layer_norm_launch,
    "attention": attention_launch,
    "linear": linear_launch,
}


# ------------------------------------------------------------------------------ compile one
_PTXAS_RE = {
    "regs": re.compile(r"Used (\d+) registers"),
    "spill_st": re.compile(r"(\d+) bytes spill stores"),
    "spill_ld": re.compile(r"(\d+) bytes spill loads"),
    "stack": re.compile(r"(\d+) bytes stack frame"),
}


def _ptxas_usage(ptx: str, arch: int) -> dict:
    """Registers, spills and stack of the kernel's PTX, from ``ptxas -v`` with Triton's flags."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [
            get_ptxas(arch).path,
            "-lineinfo",
            "-v",
            "--regAllocOptLevel=2",
            f"--gpu-name={sm_arch_from_capability(arch)}",
        ]
        proc = subprocess.run([*cmd, src, "-o", os.path.join(tmp, "k.cubin")], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"ptxas -v failed: {proc.stderr.strip()[-500:]}")
    usage = {}
    for key, rx in _PTXAS_RE.items():
        m = rx.search(proc.stderr)
        usage[key] = int(m.group(1)) if m else None
    return usage


def _pruned_by_autotuner(kernel, fn, args, const, params) -> bool:
    """Whether the kernel's own early_config_prune drops this config for these arguments (so it never runs)."""
    from vit_fast.kernels import attention, linear

    tuner = {"attention": attention._attention_kernel, "linear": linear._linear_kernel}.get(kernel)
    if tuner is None or not getattr(tuner, "early_config_prune", None) or "meta" not in params:
        return False
    named = dict(zip(fn.arg_names, args, strict=False))
    kept = tuner.early_config_prune(tuner.configs, named, **const)
    key = (params["meta"], params["num_warps"], params["num_stages"])
    return all((c.kwargs, c.num_warps, c.num_stages) != key for c in kept)


def _failed(task, error: str = "") -> dict:
    """The result row of a variant that has not compiled (yet)."""
    kernel, label, _ = task
    return {
        "kernel": kernel,
        "variant": label,
        "ok": False,
        "pruned": False,
        "shared": None,
        "regs": None,
        "spills": None,
        "wgmma": None,
        "tma": None,
        "error": error,
    }


def compile_one(task, arch: int):
    """Compile one variant; returns a result dict (never raises)."""
    warnings.simplefilter("ignore")
    kernel, label, params = task
    result = _failed(task)
    t0 = time.perf_counter()
    try:
        import triton
        from triton import knobs
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, make_backend
        from triton.runtime.jit import create_function_from_signature

        fn, args, const = LAUNCH[kernel](params)
        result["pruned"] = _pruned_by_autotuner(kernel, fn, args, const, params)
        kwargs = dict(const)
        kwargs.update(params.get("meta", {}))
        for opt in ("num_warps", "num_stages"):
            if opt in params:
                kwargs[opt] = params[opt]
        # the options JITFunction.run adds before binding. fpsan_homomorphic_casts is in triton 3.9's knobs
        # (and its run adds it) but not in 3.6's, whose run adds only the first two
        kwargs["debug"] = False
        kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        if hasattr(knobs.compilation, "fpsan_homomorphic_casts"):
            kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
        target = GPUTarget("cuda", arch, 32)
        backend = make_backend(target)
        binder = create_function_from_signature(fn.signature, fn.params, backend)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
        compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)
        result["shared"] = compiled.metadata.shared
        usage = _ptxas_usage(compiled.asm["ptx"], arch)
        result["regs"] = usage["regs"]
        result["spills"] = (usage["spill_st"] or 0) + (usage["spill_ld"] or 0)
        # Hopper's instructions in the PTX: warpgroup MMA, and the bulk tensor copy (TMA)
        result["wgmma"] = "wgmma.mma_async" in compiled.asm["ptx"]
        result["tma"] = "cp.async.bulk.tensor" in compiled.asm["ptx"]
        result["ok"] = True
    except Exception as e:  # noqa: BLE001 - every failure is a row of the table
        msg = f"{type(e).__name__}: {e}"
        result["error"] = " ".join(msg.split())[:600]
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


# ------------------------------------------------------------------------------ driver
def _run_all(tasks, arch: int, jobs: int, progress: bool):
    results = [None] * len(tasks)
    pending = list(range(len(tasks)))
    done = 0
    t0 = time.perf_counter()
    while pending:
        retry = []
        with cf.ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(compile_one, tasks[i], arch): i for i in pending}
            for fut in cf.as_completed(futures):
                i = futures[fut]
                try:
                    results[i] = fut.result()
                    done += 1
                    if progress and (done % 20 == 0 or done == len(tasks)):
                        print(f"  {done}/{len(tasks)} compiled ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
                except BrokenProcessPool:
                    retry.append(i)
        if not retry:
            break
        # a worker died (a compiler abort or a segfault): rerun the victims one by one, each alone
        for i in retry:
            with cf.ProcessPoolExecutor(max_workers=1) as pool:
                try:
                    results[i] = pool.submit(compile_one, tasks[i], arch).result()
                except BrokenProcessPool:
                    results[i] = _failed(tasks[i], "the compiler process crashed (abort or segfault)")
            done += 1
        pending = []
    return results


def _flags(r, max_shared: int) -> str:
    if not r["ok"]:
        return "FAIL"
    notes = []
    if r["shared"] is not None and r["shared"] > max_shared:
        notes.append(f"SHARED>{max_shared // 1024}KB")
    if r["spills"]:
        notes.append("SPILLS")
    if notes and r.get("pruned"):
        notes.append("(pruned by the autotuner for these arguments: never runs)")
    return " ".join(notes)


def _bad(r, max_shared: int) -> bool:
    """Failed, or flagged and still in the autotuner's list."""
    return not r["ok"] or (bool(_flags(r, max_shared)) and not r.get("pruned"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", default=",".join(ALL_KERNELS), help=f"comma list of {', '.join(ALL_KERNELS)}")
    parser.add_argument(
        "--arch", type=int, default=90, help="compute capability, e.g. 90 for H100 (default), 80 for A100"
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiler processes")
    parser.add_argument(
        "--full",
        action="store_true",
        help="every config for every flag variant (patch_embed: ~3000 variants); default: every config for the "
        "heaviest variants, the flag/epilogue sweeps on a subset",
    )
    parser.add_argument("--csv", help="also write the rows to this CSV file")
    parser.add_argument("--filter", default="", help="keep variants whose label contains this string")
    args = parser.parse_args(argv)

    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    for k in kernels:
        if k not in TASKS:
            parser.error(f"unknown kernel {k!r}; choose from {', '.join(ALL_KERNELS)}")
    tasks = [t for k in kernels for t in TASKS[k](args.full) if args.filter in t[1]]
    from vit_fast.kernels._common import shared_memory_limit

    max_shared = shared_memory_limit(args.arch)
    print(f"compiling {len(tasks)} variants for sm_{args.arch} with {args.jobs} processes", file=sys.stderr)
    t0 = time.perf_counter()
    results = _run_all(tasks, args.arch, args.jobs, progress=True)

    width = max(len(r["variant"]) for r in results) if results else 10
    header = (
        f"{'kernel':<12} {'variant':<{width}} {'ok':<4} {'shared KB':>9} {'regs':>4} {'spills':>6} {'wgmma':>5} "
        f"{'tma':>3}  flags"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        shared = f"{r['shared'] / 1024:.1f}" if r["shared"] is not None else "-"
        regs = r["regs"] if r["regs"] is not None else "-"
        spills = r["spills"] if r["spills"] is not None else "-"
        ok = "ok" if r["ok"] else "FAIL"
        wgmma, tma = ({True: "yes", False: "no", None: "-"}[r[k]] for k in ("wgmma", "tma"))
        print(
            f"{r['kernel']:<12} {r['variant']:<{width}} {ok:<4} {shared:>9} {regs:>4} {spills:>6} {wgmma:>5} {tma:>3}  "
            f"{_flags(r, max_shared)}"
        )
        if r["error"]:
            print(f"{'':<12}   error: {r['error']}")

    failed = [r for r in results if not r["ok"]]
    flagged = [r for r in results if r["ok"] and _bad(r, max_shared)]
    print()
    for k in kernels:
        rows = [r for r in results if r["kernel"] == k]
        ok = [r for r in rows if r["ok"]]
        if not rows:
            continue
        peak_shared = max((r["shared"] for r in ok), default=0) / 1024
        peak_regs = max((r["regs"] or 0 for r in ok), default=0)
        n_flag = sum(1 for r in ok if _bad(r, max_shared))
        n_pruned = sum(1 for r in ok if _flags(r, max_shared) and r.get("pruned"))
        n_spill = sum(1 for r in ok if r["spills"])
        n_wgmma = sum(1 for r in ok if r["wgmma"])
        n_tma = sum(1 for r in ok if r["tma"])
        print(
            f"{k}: {len(ok)}/{len(rows)} compile, {n_flag} flagged and autotuned, {n_pruned} flagged but pruned; "
            f"max shared {peak_shared:.1f} KB, max regs {peak_regs}, {n_spill} spill; wgmma in {n_wgmma}, "
            f"TMA (cp.async.bulk.tensor) in {n_tma}"
        )
    print(
        f"{len(failed)} failed, {len(flagged)} flagged and still autotuned (shared > {max_shared // 1024} KB or "
        f"spills), {time.perf_counter() - t0:.0f} s"
    )
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(
                f,
                fieldnames=[
                    "kernel",
                    "variant",
                    "ok",
                    "pruned",
                    "shared",
                    "regs",
                    "spills",
                    "wgmma",
                    "tma",
                    "error",
                    "seconds",
                ],
            )
            writer.writeheader()
            writer.writerows(results)
    return 1 if failed or flagged else 0


if __name__ == "__main__":
    sys.exit(main())
