"""``make peers-hf``: transformers' released ModelTesterMixin (fetched from PyPI for the installed version, see
fetch_transformers_tests.py) on tiny ViT, DeiT, DINOv2, CLIP-vision, SigLIP-vision and SigLIP 2 models (our testers,
head dim 16; SigLIP 2's a padded batch of images at their own sizes), run unpatched and then patched: with
``apply_vit_fast`` and with ``optimize``, each with backend "triton" in Triton's interpreter (our kernels in every
eligible forward; the half-precision eager-vs-sdpa variants left out, named in ``left_out``) and with backend "auto"
(on a CPU every patched layer keeps transformers' forward: the path a CPU user of the default backend gets). Our
kernels' launches are counted per suite (a tester class) in every run (launches.py, a pytest plugin). ``-k EXPR``
selects among our testers (``-k Siglip2``) as among ``--model-tests`` files' tests.

Prints one row per suite and patched mode (tests passed unpatched and patched, tests lost, launches) and fails
(exit 1) on a test that passes unpatched and not patched, on a suite patched with backend "triton" that launched
none of our kernels, and on an unpatched run that launched any.

``--model-tests DIR``: transformers' own per-model test files, which the sdist lacks (so CI keeps our testers), run
instead of ours: DIR is laid out like transformers' ``tests/`` (``models/vit/test_modeling_vit.py``, ... and the
helpers the sdist lacks: ``utils/test_configuration_utils.py``, ``utils/tiny_model_summary.json``); each
``models/*/test_modeling_*.py`` runs unpatched, with ``apply_vit_fast`` and with ``optimize`` (backend "auto") and
is compared the same way. No triton run there: most of their tiny configs have head_dim 8 (hidden 32 / 4 heads),
under the attention kernel's 16, where backend "auto" keeps transformers' forward and "triton" refuses.

    python tools/peers/run_hf_peers.py [.peers] [--model-tests DIR] [-k EXPR] [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

sys.path.insert(0, str(Path(__file__).resolve().parent))
import launches  # noqa: E402
from fetch_transformers_tests import LAUNCH_PLUGIN  # noqa: E402
from fetch_transformers_tests import main as fetch  # noqa: E402

TEST_FILE = "tests/models/vit_fast_peers/test_vision_peers.py"
#: the patched modes of our testers' run, as (mode, backend): backend "triton" runs our kernels in Triton's
#: interpreter (each suite must launch them); "auto" on a CPU keeps transformers' forward in every patched layer
PATCHED = (("apply", "triton"), ("optimize", "triton"), ("apply", "auto"), ("optimize", "auto"))


#: testers whose model wraps the vision tower another tester runs whole (Siglip2VisionPeerTest): with backend
#: "triton" their eager-vs-sdpa variants are left out too (see left_out)
TOWER_WRAPPERS = ("Siglip2ForImageClassificationPeerTest", "Siglip2PeerTest")


def left_out(test: str, backend: str) -> bool:
    """Whether a test of our testers is left out of a patched run: with backend "triton", the fp16 and bf16
    variants of eager-vs-sdpa (about half of a triton run's time, the interpreter emulating half precision; the
    fp32 variants run the same padding and mask cases, and tests/ judges our kernels in half precision), and every
    eager-vs-sdpa variant of the ``TOWER_WRAPPERS`` (a third of SigLIP 2's triton time: their patched layers are
    Siglip2VisionModel's, whose fp32 variants run in Siglip2VisionPeerTest; what they add, the classifier and the
    text tower, is transformers' own code, and their variants run unpatched and with backend "auto")."""
    if backend != "triton" or "::test_eager_matches_sdpa_inference_" not in test:
        return False
    return re.search(r"_\d+_(fp16|bf16)_", test) is not None or suite_of(test) in TOWER_WRAPPERS


def node_id(test_file: str, test: str) -> str:
    """pytest's node id of a JUnit test id (``package.module.Class::test``) in ``test_file``."""
    classname, name = test.split("::")
    return f"{test_file}::{classname.rsplit('.', 1)[-1]}::{name}"


def run(
    root: Path,
    mode: str,
    backend: str = "auto",
    k: str | None = None,
    test_file: str = TEST_FILE,
    timeout: float = 3600,
    deselect: list[str] = (),
) -> tuple[dict[str, str], dict[str, dict]]:
    """One pytest run of ``test_file`` in the harness (less the node ids ``deselect``): ``(test id -> outcome,
    suite -> launch counts)``."""
    # per-test outcomes from pytest's JUnit XML, kept beside the harness for a look at the failures: -rA's summary
    # groups skips by reason ("SKIPPED [40] file:line: reason"), so it cannot count them; the launch counts beside
    report = root / "results" / f"{Path(test_file).stem}-{mode}-{backend}.xml"
    counted = report.with_suffix(".launches.json")
    report.parent.mkdir(exist_ok=True)
    report.unlink(missing_ok=True)
    counted.unlink(missing_ok=True)
    # HF_HUB_OFFLINE: only package registries are reachable; a download would retry with back-off for minutes
    env = {**os.environ, "VIT_FAST_PEERS": mode, "VIT_FAST_PEERS_BACKEND": backend, "HF_HUB_OFFLINE": "1"}
    env[launches.ENV] = str(counted)
    if backend == "triton":
        env["TRITON_INTERPRET"] = "1"
    cmd = [sys.executable, "-m", "pytest", "-q", "-W", "ignore", "-p", LAUNCH_PLUGIN, f"--junitxml={report}"]
    try:
        proc = subprocess.run(
            [*cmd, test_file, *(["-k", k] if k else []), *(f"--deselect={t}" for t in deselect)],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise SystemExit(f"peers-hf: the {mode} run of {test_file} ran past --timeout {timeout:g} s") from None
    outcomes = junit_outcomes(report) if report.exists() else {}
    if not outcomes or not counted.exists():
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        what = "collected nothing" if not outcomes else f"wrote no launch counts ({counted.name})"
        raise SystemExit(f"peers-hf: the {mode} run of {test_file} {what} (exit {proc.returncode})")
    return outcomes, launches.read_counts(counted)[0]


def suite_of(test: str) -> str:
    """A JUnit test id's suite as the launch counter names it: its class (the classname's last part)."""
    return test.split("::")[0].rsplit(".", 1)[-1]


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


def compare(
    root: Path, base: tuple[dict, dict], modes, k: str | None = None, test_file: str = TEST_FILE, timeout: float = 3600
) -> list[launches.Row]:
    """Each patched ``(mode, backend)`` of ``modes`` run and judged against the unpatched run ``base`` suite by
    suite (a lost test fails; with backend "triton" so does a suite that launched none of our kernels); an
    unpatched run that launched any of ours fails too (the baseline would not be transformers alone)."""
    outcomes, counts = base
    print(f"  unpatched: {summary(outcomes)}")
    if "PASSED" not in outcomes.values():  # a collection error would compare as nothing lost
        raise SystemExit(f"peers-hf: nothing in {test_file} passes unpatched; run it alone with pytest to see why")
    rows = []
    launched = sum(c["launches"] for c in counts.values())
    if launched:
        rows.append(launches.Row("(all)", "unpatched", 0, 0, [], launched, False, ["launched our kernels"]))
    for mode, backend in modes:
        out = sorted(t for t in outcomes if left_out(t, backend))
        deselect = [node_id(test_file, t) for t in out]
        patched, counted = run(root, mode, backend, k, test_file, timeout, deselect)
        print(f"  {mode}, backend {backend}: {summary(patched)}" + (f" ({len(out)} left out)" if out else ""))
        kept = {t: o for t, o in outcomes.items() if t not in out}
        suites = {t: suite_of(t) for t in (*kept, *patched)}
        rows += launches.judge(f"{mode}/{backend}", kept, patched, suites, counted, backend == "triton")
    return rows


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
    rows = []
    if source is not None:
        for rel in install_model_tests(root, source):
            print(rel)
            base = run(root, "none", k=k, test_file=rel, timeout=timeout)
            rows += compare(root, base, (("apply", "auto"), ("optimize", "auto")), k, rel, timeout)
    else:
        rows += compare(root, run(root, "none", k=k, timeout=timeout), PATCHED, k, timeout=timeout)
    print(launches.table(rows))
    failed = [r for r in rows if r.failures]
    print(f"peers-hf: {len(failed)} of {len(rows)} suite rows fail" if failed else "peers-hf: every suite row passes")
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="\n\n".join(__doc__.split("\n\n")[:2]))
    parser.add_argument("dest", nargs="?", default=".peers", help="folder for the fetched harness (default .peers)")
    parser.add_argument(
        "--model-tests",
        metavar="DIR",
        help="run transformers' own per-model test files instead of our testers: a folder laid out like "
        "transformers' tests/ (models/<model>/test_modeling_<model>.py, utils/...)",
    )
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one pytest run may take (default 3600)")
    parser.add_argument(
        "-k",
        metavar="EXPR",
        help="pytest's -k in every mode: within each --model-tests file, or among our testers (-k Siglip2)",
    )
    args = parser.parse_args()
    raise SystemExit(main(args.dest, args.model_tests, args.timeout, args.k))
