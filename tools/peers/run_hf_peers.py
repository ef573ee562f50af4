"""``make peers-hf``: transformers' released ModelTesterMixin (fetched from PyPI for the installed version, see
fetch_transformers_tests.py) on tiny ViT, DeiT, DINOv2, CLIP-vision and SigLIP-vision models, run unpatched, with
``apply_vit_fast`` and with ``optimize`` (backend "auto": on a CPU the layers keep transformers' forward, so this
checks the mechanism: classes, save/load, outputs, attentions, training), then a subset with backend="triton" in
Triton's interpreter (our kernels in every eligible forward). Fails when a test that passes unpatched does not pass
patched, and prints the counts.

``--model-tests DIR``: transformers' own per-model test files, which the sdist lacks (so CI keeps our testers), run
instead of ours: DIR is laid out like transformers' ``tests/`` (``models/vit/test_modeling_vit.py``, ... and the
helpers the sdist lacks: ``utils/test_configuration_utils.py``, ``utils/tiny_model_summary.json``); each
``models/*/test_modeling_*.py`` runs unpatched, with ``apply_vit_fast`` and with ``optimize`` (backend "auto") and
is compared the same way. No triton subset there: most of their tiny configs have head_dim 8 (hidden 32 / 4
heads), under the attention kernel's 16, where backend "auto" keeps transformers' forward and "triton" refuses.

    python tools/peers/run_hf_peers.py [.peers] [--model-tests DIR [-k EXPR]] [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fetch_transformers_tests import main as fetch  # noqa: E402

TEST_FILE = "tests/models/vit_fast_peers/test_vision_peers.py"
#: the triton subset (the interpreter is slow): forwards whose outputs the mixin compares, save/load, attentions
TRITON_K = (
    "(ViTPeer or CLIPVisionPeer or SiglipVisionPeer or Dinov2Peer) and (save_load or determinism or "
    "attention_outputs or hidden_states_output or batching_equivalence or model_forward_shapes)"
)


def run(
    root: Path,
    mode: str,
    backend: str = "auto",
    k: str | None = None,
    test_file: str = TEST_FILE,
    timeout: float = 3600,
) -> dict[str, str]:
    # HF_HUB_OFFLINE: only package registries are reachable; a download would retry with back-off for minutes
    env = {**os.environ, "VIT_FAST_PEERS": mode, "VIT_FAST_PEERS_BACKEND": backend, "HF_HUB_OFFLINE": "1"}
    if backend == "triton":
        env["TRITON_INTERPRET"] = "1"
    # per-test outcomes from pytest's JUnit XML, kept beside the harness for a look at the failures: -rA's summary
    # groups skips by reason ("SKIPPED [40] file:line: reason"), so it cannot count them
    report = root / "results" / f"{Path(test_file).stem}-{mode}-{backend}.xml"
    report.parent.mkdir(exist_ok=True)
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-q", "-W", "ignore", f"--junitxml={report}", test_file]
    try:
        proc = subprocess.run(
            [*cmd, *(["-k", k] if k else [])], cwd=root, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise SystemExit(f"peers-hf: the {mode} run of {test_file} ran past --timeout {timeout:g} s") from None
    outcomes = junit_outcomes(report) if report.exists() else {}
    if not outcomes:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"peers-hf: the {mode} run of {test_file} collected nothing (exit {proc.returncode})")
    return outcomes


def junit_outcomes(report: Path) -> dict[str, str]:
    """``{"module.Class::test": "PASSED" | "FAILED" | "ERROR" | "SKIPPED"}`` from a pytest JUnit XML report."""
    outcomes = {}
    for case in ElementTree.parse(report).iter("testcase"):
        tags = {child.tag for child in case}
        outcome = next((o for t, o in _JUNIT if t in tags), "PASSED")
        outcomes[f"{case.get('classname')}::{case.get('name')}"] = outcome
    return outcomes


_JUNIT = (("error", "ERROR"), ("failure", "FAILED"), ("skipped", "SKIPPED"))  # the first present wins


def summary(outcomes: dict[str, str]) -> str:
    counts = Counter(outcomes.values())
    return ", ".join(f"{counts[k]} {k.lower()}" for k in ("PASSED", "FAILED", "ERROR", "SKIPPED") if counts[k])


def compare(name: str, base: dict[str, str], patched: dict[str, str]) -> list[str]:
    lost = sorted(t for t, o in base.items() if o == "PASSED" and patched.get(t) != "PASSED")
    print(f"  {name}: {summary(patched)}; {len(lost)} passed unpatched but not patched")
    for t in lost:
        print(f"    {patched.get(t, 'MISSING')} {t}")
    return lost


def install_model_tests(root: Path, source: Path) -> list[str]:
    """Copy ``source``, laid out like transformers' ``tests/`` (``models/<model>/test_modeling_<model>.py`` and the
    helpers the sdist lacks, e.g. ``utils/test_configuration_utils.py``, which test_configuration_common.py
    imports), over the harness's ``tests/``; returns the per-model files' paths relative to the harness root."""
    files = sorted(source.glob("models/*/test_modeling_*.py"))
    if not files:
        raise SystemExit(
            f"peers-hf: --model-tests {source} holds no models/*/test_modeling_*.py: give a folder laid out like "
            "transformers' tests/ (models/vit/test_modeling_vit.py, ...)"
        )
    if (source / "models" / "vit_fast_peers").exists():
        raise SystemExit(f"peers-hf: --model-tests {source}/models/vit_fast_peers clashes with our testers; rename it")
    tests = root / "tests"
    for path in sorted(source.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            (tests / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, tests / path.relative_to(source))
    # their ``from ...test_modeling_common import`` needs every folder from tests/ down to be a package
    for folder in {d for p in tests.rglob("*.py") for d in p.parents if d == tests or tests in d.parents}:
        (folder / "__init__.py").touch()
    # test_pipeline_mixin.py imports transformers from the repository's src/ (in the sdist, not extracted): the
    # installed package is the same version
    import transformers

    link = root / "src" / "transformers"
    link.parent.mkdir(exist_ok=True)
    if not link.exists():
        link.symlink_to(Path(transformers.__file__).parent, target_is_directory=True)
    return [str((tests / f.relative_to(source)).relative_to(root)) for f in files]


def main(dest: str, model_tests: str | None = None, timeout: float = 3600, k: str | None = None) -> int:
    source = Path(model_tests).resolve() if model_tests else None
    if source is not None and not source.is_dir():
        raise SystemExit(
            f"peers-hf: --model-tests {model_tests} is not a folder: give a folder laid out like transformers' "
            "tests/ (models/vit/test_modeling_vit.py, ...)"
        )
    root = fetch(dest)
    import transformers

    print(f"peers-hf: transformers {transformers.__version__} ModelTesterMixin, harness in {root}")
    if source is not None:
        lost = []
        for rel in install_model_tests(root, source):
            base = run(root, "none", k=k, test_file=rel, timeout=timeout)
            print(f"{rel}\n  unpatched: {summary(base)}")
            if "PASSED" not in base.values():  # a collection error would compare as nothing lost
                raise SystemExit(f"peers-hf: nothing in {rel} passes unpatched; run it alone with pytest to see why")
            lost += compare("apply_vit_fast", base, run(root, "apply", k=k, test_file=rel, timeout=timeout))
            lost += compare("optimize", base, run(root, "optimize", k=k, test_file=rel, timeout=timeout))
        return 1 if lost else 0
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", nargs="?", default=".peers", help="folder for the fetched harness (default .peers)")
    parser.add_argument(
        "--model-tests",
        metavar="DIR",
        help="run transformers' own per-model test files instead of our testers: a folder laid out like "
        "transformers' tests/ (models/<model>/test_modeling_<model>.py, utils/...)",
    )
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one pytest run may take (default 3600)")
    parser.add_argument("-k", metavar="EXPR", help="with --model-tests: pytest's -k within each file, in every mode")
    args = parser.parse_args()
    if args.k and not args.model_tests:
        parser.error("-k selects within --model-tests files; our testers run whole, with their own triton subset")
    raise SystemExit(main(args.dest, args.model_tests, args.timeout, args.k))
