"""``make peers-hf``: transformers' released ModelTesterMixin (fetched from PyPI for the installed version, see
fetch_transformers_tests.py) on tiny ViT, DeiT, DINOv2, CLIP-vision and SigLIP-vision models, run unpatched, with
``apply_vit_fast`` and with ``optimize`` (backend "auto": on a CPU the layers keep transformers' forward, so this
checks the mechanism: classes, save/load, outputs, attentions, training), then a subset with backend="triton" in
Triton's interpreter (our kernels in every eligible forward). Fails when a test that passes unpatched does not pass
patched, and prints the counts.

    python tools/peers/run_hf_peers.py [.peers]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fetch_transformers_tests import main as fetch  # noqa: E402

TEST_FILE = "tests/models/vit_fast_peers/test_vision_peers.py"
#: the triton subset (the interpreter is slow): forwards whose outputs the mixin compares, save/load, attentions
TRITON_K = (
    "(ViTPeer or CLIPVisionPeer or SiglipVisionPeer or Dinov2Peer) and (save_load or determinism or "
    "attention_outputs or hidden_states_output or batching_equivalence or model_forward_shapes)"
)
_LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)")


def run(root: Path, mode: str, backend: str = "auto", k: str | None = None) -> dict[str, str]:
    # HF_HUB_OFFLINE: only package registries are reachable; a download would retry with back-off for minutes
    env = {**os.environ, "VIT_FAST_PEERS": mode, "VIT_FAST_PEERS_BACKEND": backend, "HF_HUB_OFFLINE": "1"}
    if backend == "triton":
        env["TRITON_INTERPRET"] = "1"
    cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "-W", "ignore", TEST_FILE, *(["-k", k] if k else [])]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    outcomes: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        if m := _LINE.match(line):
            outcomes[m.group(2)] = m.group(1)
    if not outcomes:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"peers-hf: the {mode} run collected nothing (exit {proc.returncode})")
    return outcomes


def summary(outcomes: dict[str, str]) -> str:
    counts = Counter(outcomes.values())
    return ", ".join(f"{counts[k]} {k.lower()}" for k in ("PASSED", "FAILED", "ERROR", "SKIPPED") if counts[k])


def compare(name: str, base: dict[str, str], patched: dict[str, str]) -> list[str]:
    lost = sorted(t for t, o in base.items() if o == "PASSED" and patched.get(t) != "PASSED")
    print(f"  {name}: {summary(patched)}; {len(lost)} passed unpatched but not patched")
    for t in lost:
        print(f"    {patched.get(t, 'MISSING')} {t}")
    return lost


def main(dest: str) -> int:
    root = fetch(dest)
    import transformers

    print(f"peers-hf: transformers {transformers.__version__} ModelTesterMixin, harness in {root}")
    base = run(root, "none")
    print(f"  unpatched: {summary(base)}")
    lost = compare("apply_vit_fast", base, run(root, "apply"))
    lost += compare("optimize", base, run(root, "optimize"))
    base_t = run(root, "none", k=TRITON_K)
    print(f"  triton subset unpatched: {summary(base_t)}")
    lost += compare("apply_vit_fast(backend='triton')", base_t, run(root, "apply", "triton", TRITON_K))
    lost += compare("optimize(backend='triton')", base_t, run(root, "optimize", "triton", TRITON_K))
    return 1 if lost else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else ".peers"))
