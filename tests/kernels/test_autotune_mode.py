"""Autotuning that does not re-tune in production: coarse row-count keys, the no-autotune mode
(``VIT_FAST_AUTOTUNE=0``: one heuristic config per shape, no timing) and tuned configs saved to disk
and reloaded by a second process (Triton's autotune cache, run here with Triton's driver stubbed)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vit_fast.base import cards
from vit_fast.kernels import KERNELS, attention_tiles, autotune, linear_tiles, patch_embed_tiles

ROOT = Path(__file__).resolve().parents[2]


def test_m_class_is_coarse():
    # ViT-B/16 (197 tokens) at batch 1..256 falls into 5 classes, not 9 powers of two
    classes = {autotune.m_class(197 * b) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)}
    assert classes == {256, 448, 2048, 16384, 1 << 20}
    assert autotune.m_class(1) == 64 and autotune.m_class(257) == 320


def test_m_classes_respect_what_the_prunes_read():
    """A class never straddles SMALL_M (narrow and TMA tiles are decided there) nor a 64-row tile count below it
    (the heuristics count 64-row tiles), so one class's tuning or heuristic pick holds for all of it."""
    for m in range(1, 3 * autotune.SMALL_M):
        top = autotune.m_class(m)
        assert m <= top and (m <= autotune.SMALL_M) == (top <= autotune.SMALL_M)
        if m <= autotune.SMALL_M:
            assert top // 64 == -(-m // 64)


AUTOTUNED = {
    "linear": KERNELS["linear"].kernel,
    "patch_embed": KERNELS["patch_embed"].kernel,
    "attention": KERNELS["attention"].kernel,
    "attention_pool": KERNELS["attention_pool"].kernel,
    "diff_attention": KERNELS["diff_attention"].kernel,
    "preprocess": KERNELS["preprocess"].kernel,
}


@pytest.mark.parametrize("kernel", AUTOTUNED.values(), ids=AUTOTUNED.keys())
def test_every_feature_flag_is_in_the_autotune_key(kernel):
    """A constexpr the configs do not set (a prologue, an epilogue, a dtype mode) is code of its own, with its own
    register pressure and best tile: every one is in the autotune key, so two variants of a kernel at one shape never
    share a tuning, in memory or in Triton's cache on disk (whose file is keyed on the same tuple). The key names
    only kernel arguments: triton 3.6 drops an unknown name from the key without a word."""
    params = inspect.signature(kernel.base_fn).parameters.values()  # annotations as written: "tl.constexpr"
    set_by_configs = {name for config in kernel.configs for name in config.kwargs}
    flags = {p.name for p in params if "constexpr" in str(p.annotation)} - set_by_configs
    assert flags, "a kernel with no flag: nothing to check"
    assert flags <= set(kernel.keys), sorted(flags - set(kernel.keys))
    assert set(kernel.keys) <= {p.name for p in params}
    assert not isinstance(KERNELS["layer_norm"].kernel, type(kernel))  # not autotuned: no tuning to share


@pytest.mark.parametrize("value, enabled", [("0", False), ("off", False), ("1", True), ("on", True), ("", False)])
def test_autotune_env(monkeypatch, value, enabled):
    monkeypatch.setenv("VIT_FAST_AUTOTUNE", value)
    assert autotune.autotune_enabled() is enabled
    with autotune.tuning():
        assert autotune.autotune_enabled() is True
    with autotune.tuning(False):
        assert autotune.autotune_enabled() is False
    assert autotune.autotune_enabled() is enabled


def test_autotune_is_off_by_default(monkeypatch):
    monkeypatch.delenv("VIT_FAST_AUTOTUNE", raising=False)
    assert autotune.autotune_enabled() is False


def _compiled_configs(monkeypatch, module, factory):
    """The compiled-mode autotune list (tests run under the interpreter, which gets one config)."""
    monkeypatch.setattr(module, "interpreter_enabled", lambda: False)
    return factory()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("M", [197, 197 * 256])
def test_no_autotune_picks_one_linear_config(monkeypatch, dtype, M):
    configs = _compiled_configs(monkeypatch, linear_tiles, linear_tiles.linear_configs)
    args = {"M": M, "N": 768, "K": 3072, "x_ptr": torch.empty(1, dtype=dtype), "ARCH": 90}
    monkeypatch.setenv("VIT_FAST_AUTOTUNE", "1")
    tuned = linear_tiles.prune_linear_configs(configs, args)
    assert len(tuned) > 1
    monkeypatch.setenv("VIT_FAST_AUTOTUNE", "0")
    (picked,) = linear_tiles.prune_linear_configs(configs, args)
    assert picked in tuned  # inside the autotune set: the offline compile check covers it
    assert picked.kwargs["BLOCK_M"] == (64 if M <= 512 else 128)
    assert picked.kwargs["BLOCK_K"] == (32 if dtype == torch.float32 and M > 512 else 64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("sm_count", [58, 108, 132, 148])
def test_no_autotune_fills_the_gpu_at_small_batch(monkeypatch, dtype, batch, sm_count):
    """Every ViT-B/16 GEMM at batch 1-2 launches at least one program per SM of the device (``SM_COUNT``: L4,
    A100, H100 SXM, B200) in the heuristic mode."""
    monkeypatch.setenv("VIT_FAST_AUTOTUNE", "0")
    configs = _compiled_configs(monkeypatch, linear_tiles, linear_tiles.linear_configs)
    M = 197 * batch
    for name, N, K in (("qkv", 2304, 768), ("proj", 768, 768), ("fc1", 3072, 768), ("fc2", 768, 3072)):
        named = {"M": M, "N": N, "K": K, "x_ptr": torch.empty(1, dtype=dtype), "ARCH": 90, "SM_COUNT": sm_count}
        (picked,) = linear_tiles.prune_linear_configs(configs, named)
        programs = -(-M // picked.kwargs["BLOCK_M"]) * -(-N // picked.kwargs["BLOCK_N"])
        assert programs >= sm_count, (name, picked, programs)


def test_no_autotune_picks_one_attention_and_patch_embed_config(monkeypatch):
    monkeypatch.setenv("VIT_FAST_AUTOTUNE", "0")
    configs = _compiled_configs(monkeypatch, attention_tiles, attention_tiles.attention_configs)
    (picked,) = attention_tiles.prune_attention_configs(
        configs, {"qkv_ptr": torch.empty(1, dtype=torch.bfloat16), "ARCH": 90}, BLOCK_D=64
    )
    assert (picked.kwargs["BLOCK_M"], picked.kwargs["BLOCK_N"], picked.num_warps) == (64, 64, 4)
    configs = _compiled_configs(monkeypatch, patch_embed_tiles, patch_embed_tiles.patch_embed_configs)
    (picked,) = patch_embed_tiles.prune_patch_embed_configs(configs, {"M": 197 * 64, "D": 768, "ARCH": 90})
    assert picked in configs and picked.kwargs == {"BLOCK_M": 64, "BLOCK_D": 128, "BLOCK_K": 64}
    # batch 1 of ViT-B/16: 197 x 768 from 768, at least one program per SM (a direct call: CPU_SM_COUNT)
    (picked,) = patch_embed_tiles.prune_patch_embed_configs(configs, {"M": 197, "D": 768, "ARCH": 90})
    assert 4 * -(-768 // picked.kwargs["BLOCK_D"]) >= cards.CPU_SM_COUNT


_TUNE_SCRIPT = """
import json, sys
sys.path.insert(0, "benchmarks")
import host_overhead
host_overhead.install_stub_driver()
import torch, triton
from vit_fast.kernels import KERNELS
from vit_fast.kernels.linear import launch_linear

calls = []
def bench(fn, quantiles=None, **kwargs):
    if sys.argv[1] == "reload":
        raise SystemExit("the autotuner timed configs again: the saved tuning was not reloaded")
    calls.append(1)
    t = 10.0 - 0.01 * len(calls)  # each later config a little faster: the last one wins, not the default first
    return [t, t, t]
triton.runtime.driver.active.get_benchmarker = lambda: bench
launch_linear(torch.randn(197, 256, dtype=torch.float16), torch.randn(512, 256, dtype=torch.float16))
print(json.dumps({"config": str(KERNELS["linear"].kernel.best_config), "timed": len(calls)}))
"""


def test_tuned_configs_are_saved_and_reloaded(tmp_path):
    """Process 1 tunes (a stubbed benchmarker makes the last config win) and Triton saves the result in
    its cache; process 2, whose benchmarker refuses to run, must start with the same config."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), VIT_FAST_AUTOTUNE="1", TRITON_DEFAULT_FP_FUSION="1")
    env.pop("VIT_FAST_AUTOTUNE_CACHE", None)
    results = []
    for mode in ("tune", "reload"):
        proc = subprocess.run(
            [sys.executable, "-c", _TUNE_SCRIPT, mode], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    (tuned, reloaded) = results
    assert tuned["timed"] > 1 and reloaded["timed"] == 0
    assert reloaded["config"] == tuned["config"]
