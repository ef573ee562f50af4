"""timm's own ``tests/test_models.py`` against vit-fast's drop-in: the released test file of the installed timm,
run for a set of models unpatched and patched (tests/peers/timm_plugin.py), test by test compared.

    python tools/peer_timm.py --tests .peers/timm/tests/test_models.py --backend triton test_vit test_vit2
    make test-peers-timm      # fetches the test file from the registry's timm sdist, then runs both model sets

Prints the outcome counts of both runs, then one row per model (tests passed unpatched and patched, tests lost, our
kernels' launches, counted by tools/peers/launches.py) and every test that passed unpatched and did not pass patched.
Exit status 1 when there is any, when a model patched with backend "triton" launched none of our kernels, when the
unpatched run launched any, or when the fetched tests are of another timm version than the installed one. (A test
in which every patched block keeps timm's forward, by the rules of vit_fast/interop/patching.py, launches nothing: a
model's count comes from its other tests.)
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "peers"))
import launches  # noqa: E402

_OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)")


def run(tests: Path, models: list[str], backend: str, extra: list[str]) -> tuple[dict[str, str], dict, dict]:
    """One pytest run of ``tests`` restricted to ``models``: ``(test id -> outcome, model -> launch counts, test
    id -> model)``; the counts are kept in ``results/`` beside the fetched ``tests/``."""
    counted = tests.parent.parent / "results" / f"{tests.stem}-{backend}.launches.json"
    counted.parent.mkdir(exist_ok=True)
    counted.unlink(missing_ok=True)
    cmd = [
        sys.executable, "-m", "pytest", str(tests), "-p", "tests.peers.timm_plugin", f"--vit-fast={backend}",
        "--import-mode=importlib", "-o", "addopts=", "-p", "no:cacheprovider", "-q", "-rA",
        "-k", " or ".join(models), *extra,
    ]  # fmt: skip
    print("$", " ".join(cmd), flush=True)
    # offline: the hub is not reachable from CI (only package registries are), and a test that downloads weights
    # would otherwise retry with back-off for minutes before failing the same way in both runs
    env = dict(os.environ, HF_HUB_OFFLINE="1", **{launches.ENV: str(counted)})
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    outcomes: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        if m := _OUTCOME.match(line):
            outcomes[m.group(2)] = m.group(1)
        elif line.startswith("vit-fast peer run:") or re.match(r"^=*\s*\d+ (passed|failed|skipped)", line):
            print("  ", line.strip("= "))
    if proc.returncode not in (0, 1):  # 1: some tests failed, which the comparison judges
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
        raise SystemExit(f"pytest exited with {proc.returncode} (not a test failure): see above")
    if not counted.exists():
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
        raise SystemExit(f"the --vit-fast={backend} run wrote no launch counts ({counted}): see above")
    return (outcomes, *launches.read_counts(counted))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[i] for i in (0, 2)))
    parser.add_argument("--tests", type=Path, required=True, help="timm's tests/test_models.py (released file)")
    parser.add_argument("--backend", choices=("auto", "triton"), default="triton", help="apply_vit_fast backend")
    parser.add_argument("models", nargs="+", help="timm model names (pytest -k terms)")
    args, extra = parser.parse_known_args(argv)
    import importlib.metadata

    installed = importlib.metadata.version("timm")
    fetched = (
        (args.tests.parent.parent / "VERSION").read_text().strip()
        if (args.tests.parent.parent / "VERSION").exists()
        else "?"
    )
    if fetched != installed:
        print(f"the tests at {args.tests} are timm {fetched}'s, the installed timm is {installed}: fetch them again "
              "(rm -rf .peers/timm; make test-peers-timm)")  # fmt: skip
        return 1
    before, base_counts, base_suites = run(args.tests, args.models, "off", extra)
    after, counts, suites = run(args.tests, args.models, args.backend, extra)
    for name, outcomes in (("unpatched", before), (f"patched ({args.backend})", after)):
        print(
            f"{name}: "
            + ", ".join(f"{n} {k.lower()}" for k, n in sorted(collections.Counter(outcomes.values()).items()))
        )
    rows = []
    launched = sum(c["launches"] for c in base_counts.values())
    if launched:
        rows.append(launches.Row("(all)", "unpatched", 0, 0, [], launched, False, ["launched our kernels"]))
    mode = f"apply/{args.backend}"
    rows += launches.judge(mode, before, after, {**base_suites, **suites}, counts, args.backend == "triton")
    print(launches.table(rows))
    lost = sorted(t for r in rows for t in r.lost)
    for test in lost:
        print(f"REGRESSION {test}: passed unpatched, {after.get(test, 'missing').lower()} patched")
    print(
        f"{len(lost)} tests that pass unpatched do not pass patched (timm {installed}, -k {' or '.join(args.models)})"
    )
    failed = [r for r in rows if r.failures]
    if failed:
        print(
            f"{len(failed)} of {len(rows)} rows fail: "
            + "; ".join(f"{r.suite}: {', '.join(r.failures)}" for r in failed)
        )
    return 1 if failed or not before else 0


if __name__ == "__main__":
    raise SystemExit(main())
