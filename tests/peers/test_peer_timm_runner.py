"""tools/peer_timm.py without timm's tests: what fails the run (a test passing unpatched but not patched, a model
patched with backend "triton" that launched none of our kernels, an unpatched run that launched some) and what
does not (a model apply_vit_fast refused, which launches nothing)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from ..fakes import load_script

TOOL = Path(__file__).resolve().parents[2] / "tools" / "peer_timm.py"


@pytest.fixture(scope="module")
def peer_timm():
    return load_script(TOOL, "peer_timm_under_test")


def fetched(tmp_path: Path) -> Path:
    """A stand-in for the fetched file, of the installed timm's version."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "VERSION").write_text(importlib.metadata.version("timm") + "\n")
    return tmp_path / "tests" / "test_models.py"


BEFORE = {
    "f::test_forward[test_vit]": "PASSED",
    "f::test_backward[test_vit]": "PASSED",
    "f::test_forward[rel]": "PASSED",
}
SUITES = {
    "f::test_forward[test_vit]": "test_vit",
    "f::test_backward[test_vit]": "test_vit",
    "f::test_forward[rel]": "rel",
}


def counts(vit: int) -> dict:
    return {
        "test_vit": {"tests": 2, "launches": vit, "patched": 2, "kernels": {}},
        "rel": {"tests": 1, "launches": 0, "patched": 0, "kernels": {}},  # refused by name: nothing patched
    }


def fake(peer_timm, monkeypatch, after: dict, patched_counts: dict, base_counts: dict | None = None) -> list:
    calls = []

    def run(tests, models, backend, extra):
        calls.append(backend)
        if backend == "off":
            return BEFORE, base_counts or {}, SUITES
        return after, patched_counts, SUITES

    monkeypatch.setattr(peer_timm, "run", run)
    return calls


def test_passes_with_nothing_lost_and_the_patched_model_launching(peer_timm, tmp_path, monkeypatch, capsys):
    calls = fake(peer_timm, monkeypatch, BEFORE, counts(12))
    assert peer_timm.main(["--tests", str(fetched(tmp_path)), "test_vit"]) == 0
    assert calls == ["off", "triton"]
    out = capsys.readouterr().out
    assert "test_vit  apply/triton          2        2     0  12\n" in out
    assert "rel       apply/triton          1        1     0  0 (nothing patched)" in out


def test_fails_on_a_patched_model_that_launched_nothing(peer_timm, tmp_path, monkeypatch, capsys):
    fake(peer_timm, monkeypatch, BEFORE, counts(0))
    assert peer_timm.main(["--tests", str(fetched(tmp_path)), "test_vit"]) == 1
    out = capsys.readouterr().out
    assert "test_vit: patched with backend triton and launched no kernel of ours" in out
    # backend auto (timm's forwards on a CPU): no launch asked of anyone
    fake(peer_timm, monkeypatch, BEFORE, counts(0))
    (tmp_path / "auto").mkdir()
    assert peer_timm.main(["--tests", str(fetched(tmp_path / "auto")), "--backend", "auto", "test_vit"]) == 0


def test_fails_on_a_lost_test(peer_timm, tmp_path, monkeypatch, capsys):
    fake(peer_timm, monkeypatch, {**BEFORE, "f::test_backward[test_vit]": "FAILED"}, counts(12))
    assert peer_timm.main(["--tests", str(fetched(tmp_path)), "test_vit"]) == 1
    assert "REGRESSION f::test_backward[test_vit]: passed unpatched, failed patched" in capsys.readouterr().out


def test_fails_when_the_unpatched_run_launched_our_kernels(peer_timm, tmp_path, monkeypatch, capsys):
    fake(peer_timm, monkeypatch, BEFORE, counts(12), base_counts=counts(3))
    assert peer_timm.main(["--tests", str(fetched(tmp_path)), "test_vit"]) == 1
    assert "(all): launched our kernels" in capsys.readouterr().out
