"""tools/compile_check.py's per-target logic, on fake rows (no compile): the flags it raises against each card,
the per-target table, the targets it accepts, that launchers and prunes run as the target (``ARCH`` in the
prune's arguments), and that it refuses to run under the interpreter."""

from __future__ import annotations

import csv
import dataclasses
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vit_fast.base import cards
from vit_fast.kernels import KERNELS

from ..fakes import load_script

TOOL = Path(__file__).resolve().parents[2] / "tools" / "compile_check.py"


@pytest.fixture(scope="module")
def cc():
    return load_script(TOOL, "compile_check_under_test")  # safe under the interpreter: only main() refuses


def row(target=90, kernel="linear", dtype="fp16", ok=True, shared=64 * 1024, spills=0, tc="wgmma", tma=False, **kw):
    r = {
        "target": target,
        "kernel": kernel,
        "variant": kw.pop("variant", f"{kernel} {dtype}"),
        "dtype": dtype,
        "heuristic": False,
        "ok": ok,
        "pruned": False,
        "shared": shared if ok else None,
        "regs": 128 if ok else None,
        "spills": spills if ok else None,
        "tc": tc if ok else None,
        "tma": tma if ok else None,
        "tma_config": False,
        "flags": "",
        "error": "" if ok else "CompilationError: boom",
        "seconds": 2.0,
    }
    r.update(kw)
    return r


def test_flags_follow_the_card_of_the_target(cc):
    t4, h100, a10 = cards.CARDS[75], cards.CARDS[90], cards.CARDS[86]
    # a 96 KB, spilling 16-bit GEMM on a T4: over its 64 KB, and spills; FMA is what the table says for sm_75
    assert cc.flags(row(75, shared=96 * 1024, spills=1200, tc="fma"), t4) == ["SHARED>64KB", "SPILLS:1200B"]
    assert cc.flags(row(90, shared=96 * 1024, tc="wgmma"), h100) == []
    # tensor cores other than the table says: 16-bit dots must reach Card.dot; fp32 (IEEE) and LayerNorm none
    assert cc.flags(row(90, tc="mma.sync"), h100) == ["TC:mma.sync!=wgmma"]
    assert cc.flags(row(75, tc="mma.sync"), t4) == ["TC:mma.sync!=fma"]
    assert cc.flags(row(90, dtype="fp32", tc="fma"), h100) == []
    assert cc.flags(row(90, dtype="fp32", tc="wgmma"), h100) == ["TC:wgmma!=fma"]
    assert cc.flags(row(100, kernel="layer_norm", tc="fma"), cards.CARDS[100]) == []
    # TMA: a TMA config where the card has none; a TMA config that lost its bulk copies; a copy nobody asked for
    assert cc.flags(row(86, tc="mma.sync", tma_config=True), a10) == ["TMA-CONFIG-WITHOUT-TMA"]
    assert cc.flags(row(90, tma_config=True, tma=False), h100) == ["TMA:missing"]
    assert cc.flags(row(90, tma_config=True, tma=True), h100) == []
    assert cc.flags(row(90, tma=True), h100) == ["TMA:unexpected"]
    assert cc.flags(row(90, ok=False), h100) == ["FAIL"]
    # the expectation is the card's, not a copy: a card whose tl.dot is mma.sync accepts mma.sync
    assert cc.flags(row(90, tc="mma.sync"), dataclasses.replace(h100, dot="mma.sync")) == []


def test_attention_pool_expects_mma_sync_where_wgmma_needs_64_rows(cc):
    """The attention pool's 16-row dots are below wgmma's / tcgen05's 64-row minimum: mma.sync is right there,
    the card's own dot elsewhere, and fp32 stays FMA."""
    pool = {"kernel": "attention_pool"}
    assert cc.flags(row(90, tc="mma.sync", **pool), cards.CARDS[90]) == []
    assert cc.flags(row(100, tc="mma.sync", **pool), cards.CARDS[100]) == []
    assert cc.flags(row(90, tc="wgmma", **pool), cards.CARDS[90]) == ["TC:wgmma!=mma.sync"]
    assert cc.flags(row(86, tc="mma.sync", **pool), cards.CARDS[86]) == []
    assert cc.flags(row(75, tc="mma.sync", **pool), cards.CARDS[75]) == ["TC:mma.sync!=fma"]
    assert cc.flags(row(90, dtype="fp32", tc="fma", **pool), cards.CARDS[90]) == []
    assert {case[0] for case in cc.CASES["attention_pool"]("vit-b16", False)} == {"attention_pool"}


def test_summary_per_target(cc):
    rows = [
        row(75, tc="fma", shared=96 * 1024, spills=28800, heuristic=True),  # over 64 KB and spilling, the pick
        row(75, tc="fma", spills=1200),
        row(75, tc="fma", spills=4000, pruned=True),  # flagged, but its prune drops it: never runs
        row(75, ok=False),
        row(90, tc="wgmma", shared=112 * 1024),
        row(90, tc="wgmma", tma=True, tma_config=True),
        row(90, dtype="fp32", tc="fma"),
        row(120, tc="mma.sync", tma=True, tma_config=True),
    ]
    cc.annotate(rows)
    t4, h100, blackwell = cc.summarize(rows)
    assert (t4["target"], t4["cards"]) == ("sm_75", "T4, RTX 20xx")
    assert (t4["variants"], t4["compiled"], t4["failed"]) == (4, 3, 1)
    assert (t4["over_shared"], t4["spilling"], t4["worst_spill"], t4["max_shared_kb"]) == (1, 3, 28800, "96.0 / 64")
    assert (t4["mma_sync"], t4["wgmma"], t4["tcgen05"], t4["tma"], t4["tc_mismatch"]) == (0, 0, 0, 0, 0)
    assert (t4["flagged"], t4["heuristic_flagged"]) == (3, 1)  # the failure and two kept flagged rows
    assert (h100["variants"], h100["wgmma"], h100["tma"], h100["flagged"], h100["max_shared_kb"]) == (
        3,
        2,
        1,
        0,
        "112.0 / 227",
    )
    assert (blackwell["target"], blackwell["mma_sync"], blackwell["tma"], blackwell["flagged"]) == ("sm_120", 1, 1, 0)

    table = cc.markdown_table([t4, h100, blackwell]).splitlines()
    assert len(table) == 5 and table[0].startswith("| target | cards |") and table[2].startswith("| sm_75 |")
    report = cc.markdown_report([t4, h100, blackwell], rows)
    assert "SHARED>64KB SPILLS:28800B" in report and "CompilationError: boom" in report
    assert "SPILLS:4000B" not in report  # pruned rows are not listed as flagged
    rows[0]["variant"] = "M=64 w4 s2 | fp16 Dh64 b1"  # labels hold " | ": escaped in a Markdown cell
    assert "| M=64 w4 s2 \\| fp16 Dh64 b1 |" in cc.markdown_report([t4], rows[:1])


def test_summary_csv_round_trip(cc, tmp_path):
    rows = cc.annotate([row(86, tc="mma.sync", shared=115 * 1024)])
    path = tmp_path / "summary.csv"
    cc.write_summary_csv(str(path), cc.summarize(rows))
    (read,) = csv.DictReader(path.open())
    assert read["target"] == "sm_86" and read["over_shared"] == "1" and read["max_shared_kb"] == "115.0 / 99"


def test_tensor_core_instruction_of_ptx(cc):
    assert cc.tensor_core_of("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {...}") == "mma.sync"
    assert cc.tensor_core_of("wgmma.fence.sync.aligned; wgmma.mma_async.sync.aligned.m64n128k16") == "wgmma"
    assert cc.tensor_core_of("tcgen05.alloc ...; tcgen05.mma.cta_group::1.kind::f16") == "tcgen05"
    assert cc.tensor_core_of("fma.rn.f32 %f1, %f2, %f3, %f4;") == "fma"


def test_targets(cc):
    assert cc.parse_targets("all") == sorted(cards.CARDS) == [75, 80, 86, 89, 90, 100, 120]
    assert cc.parse_targets("sm_75, 120a,75") == [75, 120]
    for bad in ("60", "x", ","):
        with pytest.raises(ValueError):
            cc.parse_targets(bad)


def test_launchers_and_prunes_run_as_the_target(cc, monkeypatch):
    """tasks_for asks the kernel's own prune, inside pretend_arch(target) and with ARCH in its arguments, for the
    configs it keeps with autotuning on and for the heuristic's pick with it off; the pick is marked."""
    import triton

    from vit_fast.kernels.autotune import autotune_enabled

    configs = [triton.Config({"BLOCK_M": m}, num_warps=4, num_stages=2) for m in (16, 32, 64)]
    seen = []

    class Fn:
        arg_names = ["x_ptr", "M"]

    def launch(params):
        seen.append(("launch", cards.device_arch("cpu")))
        return Fn, ("x", 197), {"BLOCK_D": 64}

    def prune(configs, named_args, **const):
        seen.append(("prune", cards.device_arch("cpu"), named_args["ARCH"], named_args["M"], const["BLOCK_D"]))
        kept = [c for c in configs if c.kwargs["BLOCK_M"] <= 32]
        return kept if autotune_enabled() else [kept[-1]]

    class Tuner:
        pass

    tuner = Tuner()
    tuner.configs, tuner.early_config_prune = configs, prune
    monkeypatch.setattr(cc, "_tuner", lambda kernel: tuner)
    monkeypatch.setitem(cc.LAUNCH, "attention", launch)
    monkeypatch.setitem(cc.CASES, "attention", lambda variant_set, full: [("attention", "fp16 case", {}, "kept")])

    tasks = cc.tasks_for(["attention"], 75)
    assert [(t[1].split(" |")[0], t[2]["heuristic"], t[3]) for t in tasks] == [
        ("M=16 w4 s2", False, 75),
        ("M=32 w4 s2", True, 75),
    ]
    assert seen and all(s[1] == 75 for s in seen)
    assert {s[2:] for s in seen if s[0] == "prune"} == {(75, 197, 64)}
    assert cards.device_arch("cpu") == cards.CPU_ARCH  # the pretence ends with the call


def test_the_picks_set_is_every_default_pick_of_vit_s_and_vit_b(cc):
    """``--set picks``: the no-autotune heuristic's pick only, of every kernel of a ViT-S/16 and a ViT-B/16
    forward (patch embedding, LayerNorm with and without the residual add, attention, the block's four GEMMs) at
    batch 1, 8 and 64 in each dtype, with the model's own shapes."""
    cases = [case for kernel in cc.ALL_KERNELS for case in cc.CASES[kernel]("picks", False)]
    assert {case[3] for case in cases} == {"pick"}
    assert {case[0] for case in cases} == {"patch_embed", "layer_norm", "attention", "linear"}
    labels = {case[1]: case[2] for case in cases}
    assert len(labels) == len(cases) == 3 * 2 * 3 * (1 + 2 + 1 + 4)  # dtypes x models x batches x launches
    for dtype in ("fp32", "fp16", "bf16"):
        for (_, D, heads), b in itertools.product(cc.PICK_MODELS, (1, 8, 64)):
            M = 197 * b
            gemm = labels[f"{dtype} ln+fc1 D{D} b{b} gelu+bias"]["variant"]
            assert gemm[1:] == ((M, 4 * D, D), "gelu", True, False, False)
            assert labels[f"{dtype} fc2 D{D} b{b} bias+res"]["variant"][1] == (M, D, 4 * D)
            assert labels[f"{dtype} H{heads} Dh64 b{b}"] == {"dtype": dtype, "head_dim": 64, "heads": heads, "B": b}
            assert labels[f"{dtype} D{D} b{b} | res=1 weight=1 bias=1"]["M"] == M
            assert labels[f"{dtype} float C3 p16 D{D} b{b} | bias=1 cls=1 reg=0 nec=0"]["shape"] == (3, 16, D, b, 224)
    assert [(name, D, heads) for name, D, heads in cc.PICK_MODELS] == [("vit-s16", 384, 6), ("vit-b16", 768, 12)]


def test_rope_variants_launch_with_their_tables(cc, monkeypatch):
    """The attention kernel's RoPE variants in the default set (each dtype, Dh 64) and the sweep (Dh 64 and 128, every
    config): timm's interleaved pairs with one table for every head, and halves with a table per head, each after one
    unrotated class token, as the launcher passes them (the ROPE constexpr, the tables' strides and rows)."""
    default = {case[1]: case for case in cc.CASES["attention"]("vit-b16", False) if "rope" in case[1]}
    assert set(default) == {f"{d} Dh64 b8 | {r}" for d in ("fp32", "fp16", "bf16") for r in ("rope", "rope-half")}
    sweep = [case for case in cc.CASES["attention"]("sweep", False) if "rope" in case[1]]
    assert {case[2]["head_dim"] for case in sweep} == {64, 128} and {case[3] for case in sweep} == {"all"}
    from vit_fast.kernels import KERNELS

    monkeypatch.setattr(cc, "kernel_fn", lambda kernel: kernel)  # the interpreter's kernel has no JITFunction inside
    for rope, layout, head_stride in (("rope", 1, 0), ("rope-half", 2, 196 * 64)):
        _, args, constexprs = cc.LAUNCH["attention"](default[f"fp32 Dh64 b8 | {rope}"][2])
        named = dict(zip(KERNELS["attention"].kernel.arg_names, args, strict=False))
        assert constexprs["ROPE"] == layout and constexprs["BLOCK_D"] == 64
        assert (named["stride_rope_h"], named["stride_rope_t"]) == (head_stride, 64)
        assert (named["num_prefix"], named["num_rot"]) == (1, 196)


def test_refuses_under_the_interpreter(cc, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(SystemExit, match="unset TRITON_INTERPRET"):
        cc.main(["--targets", "90"])
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(TOOL), "--targets", "all"], capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and "unset TRITON_INTERPRET" in proc.stderr


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_every_kernel_brings_its_compile_variants_and_launch(cc, kernel, monkeypatch):
    """A kernel is one spec: its compile-check cases and launch are its own file's (``KERNELS[name].compile_variants``
    / ``.compile_launch``), never listed in the tool; each set's cases are that kernel's, the vit-b16 and sweep sets
    have some, and every case of them records a launch of that kernel (its launcher run with the kernel swapped out,
    as the target)."""
    entry = KERNELS[kernel]
    assert callable(entry.compile_variants) and callable(entry.compile_launch), kernel
    for variant_set in ("vit-b16", "sweep"):
        cases = cc.CASES[kernel](variant_set, False)
        assert cases and {case[0] for case in cases} == {kernel}, (kernel, variant_set)
    monkeypatch.setattr(cc, "kernel_fn", lambda kernel: kernel)  # the interpreter's kernels hold no JITFunction
    with cards.pretend_arch(90):
        for _, label, params, _ in cc.CASES[kernel]("vit-b16", False):
            fn, args, _ = cc.LAUNCH[kernel](params)
            assert fn is entry.kernel and args, label
