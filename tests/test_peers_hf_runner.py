"""tools/peers/run_hf_peers.py's ``--model-tests DIR`` (transformers' own per-model test files instead of our
testers), without the network or pytest runs: how DIR is laid into the harness, the one-line refusals, and that
a test passing unpatched but not patched, or an unpatched run where nothing passes, fails the run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "peers" / "run_hf_peers.py"


@pytest.fixture(scope="module")
def peers():
    spec = importlib.util.spec_from_file_location("run_hf_peers_under_test", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # importing fetches nothing: only main() does
    return module


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


def fake_runs(peers, monkeypatch, root, outcomes):
    """``run`` answers from ``outcomes[(mode, file name)]``; returns the calls made."""
    calls = []

    def run(root_, mode, backend="auto", k=None, test_file=peers.TEST_FILE, timeout=3600):
        calls.append((mode, Path(test_file).name, timeout, k))
        return outcomes[mode, Path(test_file).name]

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
        (mode, f"test_modeling_{name}.py", 60, "Vision")
        for name in ("clip", "vit")
        for mode in ("none", "apply", "optimize")
    ]
    outcomes["optimize", "test_modeling_vit.py"] = {**same, "t::a": "FAILED"}
    assert peers.main(str(tmp_path), source) == 1
    assert "FAILED t::a" in capsys.readouterr().out


def test_main_fails_when_nothing_passes_unpatched(peers, tmp_path, monkeypatch):
    # a collection error reads as one ERROR and nothing lost: it must not pass as "no test lost"
    root = harness(tmp_path)
    outcomes = {("none", "test_modeling_clip.py"): {"tests/models/clip/test_modeling_clip.py": "ERROR"}}
    fake_runs(peers, monkeypatch, root, outcomes)
    with pytest.raises(SystemExit, match="nothing in tests/models/clip/test_modeling_clip.py passes unpatched"):
        peers.main(str(tmp_path), str(model_tests(tmp_path)))


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
