"""The compiled launch path on the CPU, with Triton's driver stubbed (tests/stub_scenarios.py, run in a
subprocess without TRITON_INTERPRET): launches on the tensors' own device, autotune keys that cannot collide,
tuning serialised per kernel, a warm start of a handful of compilations, fp fusion pinned, launch metadata built
only for a registered launch hook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _scenario(tmp_path, *argv: str) -> dict:
    """Run one scenario in a fresh process (its own Triton cache, so no tuning is reloaded from an earlier run)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_DEFAULT_FP_FUSION")}
    env.pop("VIT_FAST_AUTOTUNE", None)
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    proc = subprocess.run(
        [sys.executable, "tests/stub_scenarios.py", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("tensor_device", [1, 0])
def test_launches_run_on_the_tensors_device(tmp_path, tensor_device):
    """Tensors on device 1 while device 0 is current: every launch of a ViT-B/16 forward (Triton's own path on the
    first forward, the resolved launches on the second) and of the custom ops runs with device 1 current, and
    device 0 is current again afterwards; the card the prunes read is device 1's. Tensors on the current device
    launch there."""
    result = _scenario(tmp_path, "device", str(tensor_device))
    assert len(result["forward"]) == 2 * 62
    assert set(result["forward"]) == {tensor_device}
    assert result["ops"] == [tensor_device] * 3
    assert result["current_after"] == 0
    assert result["capability_of"] == [tensor_device]  # the card read is the tensors' device's, once (cached)


def test_the_heuristic_fills_the_sms_of_the_tensors_device(tmp_path):
    """The no-autotune heuristic counts the SMs of the tensors' own device (its properties, asked once per device),
    not one card's: ViT-S/16's qkv GEMM at batch 2 has 7 x 18 = 126 tiles of 64x64, one per SM on a 108-SM device,
    too few on a 132-SM one, which gets 64x32 tiles (252 programs), on Triton's path and on the resolved launch
    alike. The SM count is in the autotune key: tuning the shape on both devices tunes it twice, once per count."""
    result = _scenario(tmp_path, "sm_counts")
    assert result["programs"] == {"0": [126, 126], "1": [252, 252]}
    assert result["asked"] == [0, 1]
    assert result["tuned_sm_counts"] == [108, 132]


def test_launch_metadata_only_for_a_registered_hook(tmp_path):
    """A resolved launch builds Triton's launch metadata (and hands the launcher its hooks) only while a launch hook
    is registered: none with Triton's hook chains empty (triton >= 3.6 always has the chains, so a test of None
    builds it on every launch); with a hook in the enter or the exit chain, or a plain function set in the enter
    chain's place, every launch builds it and the hook gets it, naming the kernel and the stream."""
    result = _scenario(tmp_path, "launch_hooks")
    assert result["triton_own"] is True  # the stub builds metadata with Triton's own CompiledKernel.launch_metadata
    assert result["cached"] == 1
    phases = result["phases"]
    assert phases["triton"]["built"] == ["_linear_kernel"]  # Triton's own dispatch: its choice, not ours
    for quiet in ("none", "none_again"):
        assert phases[quiet] == {"built": [], "handed": [[False, False, False]] * 2, "called": []}
    for name, where in (("enter", "enter"), ("exit", "exit"), ("plain", "plain")):
        assert phases[name]["built"] == ["_linear_kernel"] * 2, name
        assert phases[name]["handed"] == [[True, True, True]] * 2, name
        assert phases[name]["called"] == [[where, "_linear_kernel", 0]] * 2, name


def test_tuning_order_does_not_change_the_picks(tmp_path):
    """ViT-B/16's GEMMs tuned at batch 1, 2 and 8 in either order pick what each batch picks alone (batch 2, 394
    rows, and batch 8, 1576, used to share a key although the prune treats them differently)."""
    forward = _scenario(tmp_path / "a", "tuning_order", "1,2,8")["picks"]
    backward = _scenario(tmp_path / "b", "tuning_order", "8,2,1")["picks"]
    alone = {}
    for batch in ("1", "2", "8"):
        alone.update(_scenario(tmp_path / f"alone{batch}", "tuning_order", batch)["picks"])
    assert forward == backward == alone
    assert len(set(alone.values())) > 1  # the stubbed timings make the picks differ between problems


def test_each_epilogue_has_its_own_tuning_in_memory_and_on_disk(tmp_path):
    """fc1 with the LayerNorm prologue and GELU, and fc2 with residual + LayerScale, at one (M, N, K): two tunings
    (22 candidates each for 1576 x 768 x 768 fp16 on sm_90) under two autotune keys, and with the stub's timings
    (a function of the problem, the kernel's flags included) two different picks; where the key held only the
    shapes, fc2 took fc1's tuning. The resolved launches keep them apart too: each replay runs its own pick. A second
    process with the same Triton cache reads each variant's own pick back and times nothing."""
    first = _scenario(tmp_path, "epilogues")
    assert first["timed"] == 2 * 22 and first["keys"] == 2
    assert len(set(first["picks"].values())) == 2
    assert first["resolved"] == 2 and first["replayed"] == first["picks"]
    again = _scenario(tmp_path, "epilogues")  # the same TRITON_CACHE_DIR
    assert again["timed"] == 0
    assert again["picks"] == first["picks"]


def test_each_launch_records_the_config_it_ran(tmp_path):
    """A shape launched with the heuristic config, then tuned (another config, here), then with the heuristic again:
    the replayed launch (from the resolved-launch cache, not through the autotuner, whose best_config still names
    the tuned pick) records the heuristic config; a tuned replay in another thread records the tuned one for that
    thread only. What the first-use net keys its checks on (vit_fast/backend/triton_path.py)."""
    seen = _scenario(tmp_path, "launched_config")
    assert seen["heuristic"] in seen["configs"] and seen["tuned"] in seen["configs"]
    assert seen["tuned"] != seen["heuristic"]
    assert seen["heuristic replayed"] == seen["heuristic"]
    assert seen["best_config then"] == seen["tuned"]  # why the autotuner's best_config cannot be asked
    assert seen["tuned replayed in another thread"] == seen["tuned"]
    assert seen["this thread's after it"] == seen["heuristic"]
    assert seen["timed"] == 22  # tuned once: every later launch was a replay


def test_misaligned_operands_never_get_a_tma_config(tmp_path):
    """A shape tuned to a persistent TMA config with aligned operands; the same shape with a row stride or a base
    TMA cannot read takes pointer tiles, tuned or heuristic. A fresh thread running the TMA config has Triton's
    scratch allocator set (its descriptors live there)."""
    result = _scenario(tmp_path, "misaligned_tma")
    assert result == {
        "aligned": 1,
        "strided": 0,
        "offset": 0,
        "heuristic": 0,
        "fresh_thread_tma_allocator": [[1, True]],
    }


def test_two_threads_tuning_the_same_new_shape(tmp_path):
    """Two threads launch the same new shape at once with tuning on: both succeed, the shape is tuned once (22
    candidates for 1576 x 768 x 768 fp16 on sm_90), and each thread's launches got its own tensors."""
    result = _scenario(tmp_path, "threads")
    for got in result["results"]:
        assert isinstance(got, dict), got  # a string is the exception the thread raised
        assert got["out"] == [1576, 768] and got["launches"] >= 1 and got["own_out"]
    assert result["timed"] == 22


def test_warm_start_and_tuning_cached_per_key(tmp_path):
    """Default (no tuning): at most 8 compilations before the first ViT-B/16 output and nothing timed. Under
    tuning() the same forward times its candidates (compiling each), the next tuned forward reuses every pick,
    and a default forward afterwards still finds its own heuristic picks (the TUNE key keeps the two apart: a
    heuristic pick goes straight to the JIT function and never reaches the autotuner, whose cache holds tuned
    picks only). Every compilation pins fp fusion, and triton's warning about its default never fires."""
    result = _scenario(tmp_path, "warm_start")
    assert len(result["default"]) <= 8, result["default"]
    assert set(result["default"]) == {
        "_patch_embed_kernel",
        "_linear_kernel",
        "_attention_kernel",
        "_layer_norm_kernel",
    }
    assert result["timed_default"] == 0
    assert result["tuned_timed"] > 0 and result["tuned_compiles"] > len(result["default"])
    assert result["again_compiles"] == 0 and result["again_timed"] == 0
    assert result["default_after_tuning_compiles"] == 0
    tune_flags = {key[5] for key in result["linear_keys"]}  # (M_CLASS, N, K, ARCH, TMA_OK, TUNE, SM_COUNT, flags...)
    assert tune_flags == {"1"}
    # the slow first uses are announced, once each per process (the warm start: seconds; tuning: minutes)
    assert result["said_default"].count("vit-fast: compiling the Triton kernels") == 1, result["said_default"]
    assert result["said_tuned"].count("vit-fast: tuning the Triton kernels") == 1, result["said_tuned"]
    assert result["said_after"] == ""
    assert result["fp_fusion"] == [True]
    assert result["fp_fusion_warnings"] == []
