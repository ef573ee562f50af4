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

ROOT = Path(__file__).resolve().parents[1]


def _count(tmp_path, model: str, **env_overrides) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_DEFAULT_FP_FUSION="1", VIT_FAST_AUTOTUNE="0", **env_overrides)
    out = tmp_path / "launches.json"
    cmd = [sys.executable, "benchmarks/host_overhead.py", "--models", model, "--iters", "1", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())
    return row


def test_vit_b16_batch1_launches(tmp_path):
    fused = _count(tmp_path, "vit_base_patch16_224")
    assert fused["launches"] == 2 + 5 * 12 <= 64
    names = [name for name, _ in fused["launch_sequence"]]
    assert names[:6] == ["_patch_embed_kernel", *["_linear_kernel", "_attention_kernel"], *["_linear_kernel"] * 3]
    unfused = _count(tmp_path, "vit_base_patch16_224", VIT_FAST_FUSE_LN="0")
    assert unfused["launches"] == 2 + 7 * 12
