"""tools/peers/run_hf_peers.py and its launch counter (tools/peers/launches.py) without the network or the
harness: how ``--model-tests DIR`` is laid into the harness, the one-line refusals, the modes run, and what fails
the run (a test passing unpatched but not patched, an unpatched run where nothing passes, a suite patched with
backend "triton" that launched none of our kernels, an unpatched run that launched some); the counter's pytest
plugin on a small test file of its own, with kernels in Triton's interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..fakes import load_script

TOOL = Path(__file__).resolve().parents[2] / "tools" / "peers" / "run_hf_peers.py"
sys.path.insert(0, str(TOOL.parent))  # launches.py, as the runner imports it


@pytest.fixture(scope="module")
def peers():
    return load_script(TOOL, "run_hf_peers_under_test")  # loading fetches nothing: only main() does


def model_tests(tmp_path: Path) -> Path:
    source = tmp_path / "hf-tests"
    (source / "models" / "vit").mkdir(parents=True)
    (source / "models" / "vit" / "test_modeling_vit.py").write_text("# theirs\n")
    (source / "models" / "clip").mkdir()
    (source / "models" / "clip" / "test_modeling_clip.py").write_text("# theirs\n")
    (source / "utils").mkdir()
    (source / "utils" / "test_configuration_utils.py").write_text("config_common_kwargs = {}\n")
    (source / "utils" / "tiny_model_summary.json").write_text("{}\n")
    return source


def harness(tmp_path: Path) -> Path:
    root = tmp_path / "harness"
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "test_modeling_common.py").write_text("# the sdist's\n")
    return root


def test_install_lays_their_files_into_the_harness(peers, tmp_path):
    import transformers

    root = harness(tmp_path)
    rels = peers.install_model_tests(root, model_tests(tmp_path))
    assert rels == ["tests/models/clip/test_modeling_clip.py", "tests/models/vit/test_modeling_vit.py"]
    assert (root / "tests" / "models" / "vit" / "test_modeling_vit.py").read_text() == "# theirs\n"
    assert (root / "tests" / "utils" / "tiny_model_summary.json").exists()
    for package in ("utils", "models", "models/vit", "models/clip"):
        assert (root / "tests" / package / "__init__.py").exists(), package
    assert (root / "src" / "transformers").resolve() == Path(transformers.__file__).parent.resolve()
    assert (root / "tests" / "test_modeling_common.py").read_text() == "# the sdist's\n"


def test_install_refuses_a_folder_without_model_files(peers, tmp_path):
    (tmp_path / "empty" / "vit").mkdir(parents=True)
    (tmp_path / "empty" / "vit" / "test_modeling_vit.py").write_text("")  # not under models/
    with pytest.raises(SystemExit, match=r"no models/\*/test_modeling_\*\.py.*laid out like transformers' tests/"):
        peers.install_model_tests(harness(tmp_path), tmp_path / "empty")


def test_main_refuses_a_missing_folder_before_fetching(peers, tmp_path, monkeypatch):
    monkeypatch.setattr(peers, "fetch", lambda dest: pytest.fail("fetched before checking --model-tests"))
    with pytest.raises(SystemExit, match="is not a folder"):
        peers.main(str(tmp_path), str(tmp_path / "nowhere"))


def fake_runs(peers, monkeypatch, root, outcomes, counts=None):
    """``run`` answers from ``outcomes[(mode, file name)]`` (less the tests deselected) and ``counts[(mode,
    backend)]`` (no launches where absent); returns the calls made, each with the node ids it deselected."""
    calls = []

    def run(root_, mode, backend="auto", k=None, test_file=peers.TEST_FILE, timeout=3600, deselect=()):
        calls.append((mode, backend, Path(test_file).name, timeout, k, list(deselect)))
        ran = outcomes[mode, Path(test_file).name]
        ran = {t: o for t, o in ran.items() if not deselect or peers.node_id(test_file, t) not in deselect}
        return ran, (counts or {}).get((mode, backend), {})

    monkeypatch.setattr(peers, "fetch", lambda dest: root)
    monkeypatch.setattr(peers, "run", run)
    return calls


def test_main_runs_each_file_in_each_mode_and_fails_on_a_lost_test(peers, tmp_path, monkeypatch, capsys):
    root = harness(tmp_path)
    same = {"t::a": "PASSED", "t::b": "FAILED", "t::c": "SKIPPED"}
    outcomes = {(mode, name): same for mode in ("none", "apply", "optimize") for name in ("clip", "vit")}
    outcomes = {(m, f"test_modeling_{n}.py"): o for (m, n), o in outcomes.items()}
    calls = fake_runs(peers, monkeypatch, root, outcomes)
    source = str(model_tests(tmp_path))
    assert peers.main(str(tmp_path), source, timeout=60, k="Vision") == 0
    assert calls == [
        (mode, "auto", f"test_modeling_{name}.py", 60, "Vision", [])
        for name in ("clip", "vit")
        for mode in ("none", "apply", "optimize")
    ]
    outcomes["optimize", "test_modeling_vit.py"] = {**same, "t::a": "FAILED"}
    assert peers.main(str(tmp_path), source) == 1
    out = capsys.readouterr().out
    assert "lost: t::a" in out and "FAIL: 1 tests passed unpatched and not patched" in out


def test_main_fails_when_nothing_passes_unpatched(peers, tmp_path, monkeypatch):
    # a collection error reads as one ERROR and nothing lost: it must not pass as "no test lost"
    root = harness(tmp_path)
    outcomes = {("none", "test_modeling_clip.py"): {"tests/models/clip/test_modeling_clip.py": "ERROR"}}
    fake_runs(peers, monkeypatch, root, outcomes)
    with pytest.raises(SystemExit, match="nothing in tests/models/clip/test_modeling_clip.py passes unpatched"):
        peers.main(str(tmp_path), str(model_tests(tmp_path)))


OURS = {"m.ViTPeerTest::test_a": "PASSED", "m.ViTPeerTest::test_b": "SKIPPED", "m.CLIPVisionPeerTest::test_a": "PASSED"}


def launched(vit: int, clip: int) -> dict:
    return {
        "ViTPeerTest": {"tests": 2, "launches": vit, "patched": 2, "kernels": {}},
        "CLIPVisionPeerTest": {"tests": 1, "launches": clip, "patched": 1, "kernels": {}},
    }


def test_our_testers_run_every_patched_mode_and_fail_on_a_suite_that_launched_nothing(
    peers, tmp_path, monkeypatch, capsys
):
    outcomes = {(mode, "test_vision_peers.py"): OURS for mode in ("none", "apply", "optimize")}
    counts = {(mode, "triton"): launched(40, 12) for mode in ("apply", "optimize")}
    calls = fake_runs(peers, monkeypatch, harness(tmp_path), outcomes, counts)
    assert peers.main(str(tmp_path)) == 0
    assert [(mode, backend) for mode, backend, *_ in calls] == [("none", "auto"), *peers.PATCHED]
    assert all(deselect == [] for *_, deselect in calls)  # nothing there that a triton run leaves out
    out = capsys.readouterr().out
    assert "ViTPeerTest         apply/triton             1        1     0  40" in out
    assert "CLIPVisionPeerTest  optimize/auto            1        1     0  0 (not required)" in out
    # no launch in one suite of one triton mode: that row fails, the others stand
    counts["optimize", "triton"] = launched(40, 0)
    assert peers.main(str(tmp_path)) == 1
    out = capsys.readouterr().out
    assert out.count("FAIL:") == 1
    row = "CLIPVisionPeerTest  optimize/triton          1        1     0  0"
    assert f"{row}\n    FAIL: patched with backend triton and launched no kernel of ours" in out
    assert "1 of 8 suite rows fail" in out  # 2 suites x 4 patched modes


def test_triton_runs_leave_out_half_precision_eager_vs_sdpa_and_judge_what_ran(peers, tmp_path, monkeypatch, capsys):
    fp16 = "m.ViTPeerTest::test_eager_matches_sdpa_inference_01_fp16_pad_left"
    fp32 = "m.ViTPeerTest::test_eager_matches_sdpa_inference_11_fp32_pad_left_no_attn_mask"
    ours = {**OURS, fp16: "PASSED", fp32: "PASSED"}
    outcomes = {(mode, "test_vision_peers.py"): ours for mode in ("none", "apply", "optimize")}
    counts = {(mode, "triton"): launched(40, 12) for mode in ("apply", "optimize")}
    calls = fake_runs(peers, monkeypatch, harness(tmp_path), outcomes, counts)
    assert peers.main(str(tmp_path)) == 0  # the fp16 test, not run, is not lost
    node = f"{peers.TEST_FILE}::ViTPeerTest::test_eager_matches_sdpa_inference_01_fp16_pad_left"
    assert {(mode, backend): deselect for mode, backend, *_, deselect in calls} == {
        ("none", "auto"): [],
        ("apply", "triton"): [node],
        ("optimize", "triton"): [node],
        ("apply", "auto"): [],
        ("optimize", "auto"): [],
    }
    out = capsys.readouterr().out
    assert "ViTPeerTest         apply/triton             2        2     0  40" in out
    assert "ViTPeerTest         apply/auto               3        3     0  0 (not required)" in out
    # the fp32 variant runs under triton: lost there, it fails the run
    outcomes["apply", "test_vision_peers.py"] = {**ours, fp32: "FAILED"}
    assert peers.main(str(tmp_path)) == 1
    assert f"lost: {fp32}" in capsys.readouterr().out


def test_triton_runs_leave_out_eager_vs_sdpa_of_testers_that_wrap_another_testers_tower(peers):
    variant = "::test_eager_matches_sdpa_inference_11_fp32_pad_left_no_attn_mask"
    for wrapper in peers.TOWER_WRAPPERS:
        assert peers.left_out(f"m.{wrapper}{variant}", "triton")
        assert not peers.left_out(f"m.{wrapper}{variant}", "auto")
        assert not peers.left_out(f"m.{wrapper}::test_determinism", "triton")
    assert not peers.left_out(f"m.Siglip2VisionPeerTest{variant}", "triton")  # the tower's own run keeps them


def test_an_unpatched_run_that_launches_our_kernels_fails(peers, tmp_path, monkeypatch, capsys):
    outcomes = {(mode, "test_vision_peers.py"): OURS for mode in ("none", "apply", "optimize")}
    counts = {(mode, "triton"): launched(40, 12) for mode in ("apply", "optimize")}
    counts["none", "auto"] = launched(3, 0)
    fake_runs(peers, monkeypatch, harness(tmp_path), outcomes, counts)
    assert peers.main(str(tmp_path)) == 1
    assert "FAIL: launched our kernels" in capsys.readouterr().out


def test_judge_counts_per_suite_and_asks_launches_only_of_patched_suites():
    import launches

    base = {"a::t1": "PASSED", "a::t2": "PASSED", "b::t1": "PASSED", "c::t1": "FAILED"}
    patched = {"a::t1": "PASSED", "a::t2": "ERROR", "b::t1": "PASSED", "c::t1": "PASSED"}
    suites = {t: t.split("::")[0] for t in base}
    counts = {
        "a": {"launches": 7, "patched": 1},
        "b": {"launches": 0, "patched": 0},
        "c": {"launches": 0, "patched": 2},
        "d": {"launches": 0, "patched": 0, "patched_meta": 1},
    }
    base["d::t1"] = patched["d::t1"] = "PASSED"
    suites["d::t1"] = "d"
    rows = {r.suite: r for r in launches.judge("apply/triton", base, patched, suites, counts, must_launch=True)}
    # a model built on the meta device (timm's config tests) computes nothing: not asked to launch, and says why
    assert rows["d"].failures == [] and not rows["d"].must_launch
    assert rows["d"].why_not == "patched on the meta device only: nothing computed"
    assert (rows["a"].unpatched, rows["a"].patched, rows["a"].lost, rows["a"].launches) == (2, 1, ["a::t2"], 7)
    assert rows["a"].failures == ["1 tests passed unpatched and not patched"]
    assert rows["b"].failures == [] and not rows["b"].must_launch  # nothing patched there (refused by name)
    assert rows["c"].failures == ["patched with backend triton and launched no kernel of ours"]
    auto = launches.judge("apply/auto", base, base, suites, counts, must_launch=False)
    assert all(r.failures == [] for r in auto)


COUNTED_TESTS = """
import pytest
import torch

from vit_fast.kernels.layer_norm import launch_layer_norm
import launches


def norm():
    launch_layer_norm(torch.randn(4, 16), torch.ones(16), torch.zeros(16), 1e-6)


class TestTwice:
    def test_one(self):
        launches.note_patched()
        norm()

    def test_two(self):
        norm()


class TestNone:
    def test_nothing(self):
        pass


@pytest.mark.parametrize("model_name", ["tiny_a", "tiny_b"])
def test_model(model_name):
    for _ in range(3 if model_name == "tiny_a" else 0):
        norm()


def test_builds_its_own_model():
    launches.note_patched(model="tiny_c")
    norm()
    norm()


def test_builds_none():
    pass
"""


def test_the_counter_plugin_counts_each_suites_launches(tmp_path):
    """The pytest side for real: a run with the plugin loaded counts interpreted launches per class, per
    ``model_name`` parameter and, for a test with neither, per model it patched (else its module), and writes them
    where the runner reads them."""
    import launches

    (tmp_path / "test_counted.py").write_text(COUNTED_TESTS)
    out = tmp_path / "counts.json"
    env = {**os.environ, launches.ENV: str(out), "TRITON_INTERPRET": "1", "PYTHONPATH": str(TOOL.parent)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "launches", "-p", "no:cacheprovider", "test_counted.py"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    suites, tests = launches.read_counts(out)
    assert {name: (s["tests"], s["launches"], s["patched"]) for name, s in suites.items()} == {
        "TestTwice": (2, 2, 1),
        "TestNone": (1, 0, 0),
        "tiny_a": (1, 3, 0),
        "tiny_b": (1, 0, 0),
        "tiny_c": (1, 2, 1),
        "test_counted": (1, 0, 0),
    }
    assert suites["TestTwice"]["kernels"] == {"_layer_norm_kernel": 2}
    assert tests["test_counted.py::test_model[tiny_a]"] == "tiny_a"
    assert tests["test_counted.py::test_builds_its_own_model"] == "tiny_c"
    assert tests["test_counted.py::TestNone::test_nothing"] == "TestNone"


def test_the_counter_plugin_counts_nothing_unasked(tmp_path):
    (tmp_path / "test_counted.py").write_text(COUNTED_TESTS)
    env = {k: v for k, v in os.environ.items() if k != "VIT_FAST_PEERS_LAUNCHES"}
    env.update(TRITON_INTERPRET="1", PYTHONPATH=str(TOOL.parent))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "launches", "-p", "no:cacheprovider", "test_counted.py"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not list(tmp_path.rglob("*.json"))  # no counts written anywhere


def test_junit_outcomes_count_every_test(peers, tmp_path):
    # -rA's summary groups skips by reason, so the outcomes come from pytest's JUnit XML, one entry a test
    report = tmp_path / "r.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="m.T" name="test_ok" />'
        '<testcase classname="m.T" name="test_bad"><failure message="x" /></testcase>'
        '<testcase classname="m.T" name="test_teardown"><failure message="x" /><error message="y" /></testcase>'
        '<testcase classname="m.T" name="test_skip_a"><skipped message="same reason" /></testcase>'
        '<testcase classname="m.T" name="test_skip_b"><skipped message="same reason" /></testcase>'
        '<testcase classname="" name="tests.models.vit.test_modeling_vit"><error message="collection" /></testcase>'
        "</testsuite></testsuites>"
    )
    assert peers.junit_outcomes(report) == {
        "m.T::test_ok": "PASSED",
        "m.T::test_bad": "FAILED",
        "m.T::test_teardown": "ERROR",
        "m.T::test_skip_a": "SKIPPED",
        "m.T::test_skip_b": "SKIPPED",
        "::tests.models.vit.test_modeling_vit": "ERROR",
    }
