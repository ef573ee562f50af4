"""Launches per forward, counted on the CPU: benchmarks/host_overhead.py runs the triton path with
Triton's driver stubbed (nothing compiles or launches; every launch is recorded with its grid).

A ViT-B/16 forward is 2 + 5 * 12 = 62 launches with LayerNorm folded into the qkv and fc1 GEMMs
(86 unfused, 7 per block): the issue's bound is 64.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def _count(tmp_path, model: str, *flags: str, **env_overrides) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_DEFAULT_FP_FUSION="1", VIT_FAST_AUTOTUNE="0", **env_overrides)
    out = tmp_path / "launches.json"
    cmd = [sys.executable, "benchmarks/host_overhead.py", "--models", model, "--iters", "1", "--json", str(out)]
    cmd += flags
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]  # a JSON object: it carries its own digest
    return row


def test_vit_b16_batch1_launches(tmp_path):
    fused = _count(tmp_path, "vit_base_patch16_224")
    assert fused["launches"] == 2 + 5 * 12 <= 64
    names = [name for name, _ in fused["launch_sequence"]]
    assert names[:6] == ["_patch_embed_kernel", *["_linear_kernel", "_attention_kernel"], *["_linear_kernel"] * 3]
    unfused = _count(tmp_path, "vit_base_patch16_224", "--launch-hook", VIT_FAST_FUSE_LN="0")
    assert unfused["launches"] == 2 + 7 * 12
    # a launch hook registered (as a profiler registers one): every resolved launch hands it Triton's metadata
    assert unfused["hook_calls"] == unfused["hook_calls_with_metadata"] == 2 + 7 * 12
    assert "hook_calls" not in fused


_RESOLVED_SCRIPT = """
import json, sys
sys.path.insert(0, "benchmarks")
import host_overhead
launches = host_overhead.install_stub_driver()
import torch
from vit_fast.kernels import KERNELS
from vit_fast.kernels import linear as L

def described(args):
    return [[list(a.shape), str(a.dtype)] if isinstance(a, torch.Tensor) else a for a in args]

seen = []
for _ in range(3):  # first: Triton's own dispatch; then the resolved launch from the cache
    x, w = torch.randn(197, 64, dtype=torch.float16), torch.randn(96, 64, dtype=torch.float16)
    ln_w, ln_b = torch.randn(64, dtype=torch.float16), torch.randn(64, dtype=torch.float16)
    L.launch_linear(x, w, None, "gelu", ln_weight=ln_w, ln_bias=ln_b, ln_eps=1e-6)
    kernel = next(iter(KERNELS["linear"].kernel.fn.device_caches[0][0].values()))
    same_x = kernel.last_args[0].data_ptr() == x.data_ptr()
    seen.append({"args": described(kernel.last_args), "programs": launches[-1][1], "x": same_x})
print(json.dumps({"seen": seen, "cached": len(KERNELS["linear"].launches.cache)}))
"""


def test_resolved_launch_passes_what_triton_passes(tmp_path):
    """The cached launch hands the launcher the same arguments (the new call's tensors) and grid as Triton's
    own dispatch did on the first call."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_DEFAULT_FP_FUSION="1", VIT_FAST_AUTOTUNE="0", TRITON_CACHE_DIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", _RESOLVED_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    first, *later = result["seen"]
    assert result["cached"] == 1
    assert all(s == first for s in later) and first["x"] is True


def test_record_launches_under_the_interpreter():
    """Interpreted launches are recorded too (the peers' test runs count them): the kernel, its config and its
    programs as a compiled launch would be described; nothing compiled, so the compiler's numbers read None."""
    from vit_fast.kernels.launches import INTERPRETED, record_launches
    from vit_fast.kernels.layer_norm import launch_layer_norm

    assert INTERPRETED, "tests/conftest.py sets TRITON_INTERPRET=1"
    x, w, b = torch.randn(5, 32), torch.randn(32), torch.randn(32)
    launch_layer_norm(x, w, b, 1e-6)  # outside the block: not recorded
    with record_launches() as launches:
        launch_layer_norm(x, w, b, 1e-6)
        launch_layer_norm(x[:3], w, b, 1e-6)
    assert [r["kernel"] for r in launches] == ["_layer_norm_kernel"] * 2
    assert all(r["programs"] >= 1 and r["registers"] is None and r["num_warps"] is None for r in launches)
    launch_layer_norm(x, w, b, 1e-6)  # after the block: the list is closed
    assert len(launches) == 2
