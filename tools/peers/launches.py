"""Our kernels' launches in a peer's test run, counted per suite, and the report both peer runners print.

The pytest side (a plugin; ``make peers-hf`` copies this file into the transformers harness and loads it with
``-p``, tests/peers/timm_plugin.py registers it for timm's tests): every test runs inside
``vit_fast.kernels.launches.record_launches``, which sees every launch of our kernels, compiled or in Triton's
interpreter. The launches are added up per suite: the test's ``model_name`` parameter where it has one (timm's
tests/test_models.py), else its class (a tester class of transformers' mixin: ViTPeerTest, ...), else the models
it patched (timm's tests that build their own, named by the patching plugin), else the last part of its module's
name. A patching plugin calls :func:`note_patched` for each model it patches, so a suite says whether it had any.
At the session's end the counts go to the JSON file named by ``VIT_FAST_PEERS_LAUNCHES`` (through
``vit_fast.util.files``); without that variable the plugin counts nothing.

The runner side: :func:`read_counts` reads that file back, :func:`judge` compares a patched run with the
unpatched one suite by suite (tests lost, launches) and says what fails the run, :func:`table` prints the rows.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ENV = "VIT_FAST_PEERS_LAUNCHES"

_suites: dict[str, dict] = {}
_tests: dict[str, str] = {}  # test node id -> suite
_current: list[list | None] = [None]  # the running test's patched models: (model name or None, on meta)


def suite_of(item, patched: list[str] | tuple = ()) -> str:
    """The suite a test counts under: its ``model_name`` parameter, else its class, else the names of the models it
    patched (``patched``, joined by "+"), else its module's last name."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if isinstance(params.get("model_name"), str):
        return params["model_name"]
    if getattr(item, "cls", None) is not None:
        return item.cls.__name__
    if patched:
        return "+".join(patched)
    module = getattr(item, "module", None)
    return module.__name__.rsplit(".", 1)[-1] if module is not None else item.nodeid.split("::")[0]


def _suite(name: str) -> dict:
    return _suites.setdefault(
        name, {"tests": 0, "launches": 0, "patched": 0, "patched_meta": 0, "kernels": collections.Counter()}
    )


def note_patched(meta: bool = False, model: str | None = None) -> None:
    """Called by a patching plugin for each model it patched: the running test's suite had a patched model.
    ``meta``: the model lives on the meta device (timm's config tests build them there), where nothing is computed,
    so no kernel of ours can launch for it. ``model``: its name, the suite of a test that has no model parameter."""
    if _current[0] is not None:
        _current[0].append((model, meta))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not os.environ.get(ENV):
        return (yield)
    from vit_fast.kernels.launches import record_launches

    patched = _current[0] = []
    try:
        with record_launches() as launched:
            result = yield
    finally:
        _current[0] = None
    name = _tests[item.nodeid] = suite_of(item, sorted({model for model, _ in patched if model}))
    suite = _suite(name)
    suite["tests"] += 1
    suite["patched"] += sum(not meta for _, meta in patched)
    suite["patched_meta"] += sum(meta for _, meta in patched)
    suite["launches"] += len(launched)
    suite["kernels"].update(r["kernel"] for r in launched)
    return result


def pytest_sessionfinish(session, exitstatus) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    from vit_fast.util import files

    data = {name: {**s, "kernels": dict(s["kernels"])} for name, s in sorted(_suites.items())}
    files.write_json_atomic({"suites": data, "tests": dict(sorted(_tests.items()))}, path)


def read_counts(path: Path) -> tuple[dict[str, dict], dict[str, str]]:
    """What a run wrote: the per-suite counts ``{suite: {"tests", "launches", "patched", "kernels": {name: n}}}``
    and each test's suite ``{node id: suite}``."""
    from vit_fast.util import files

    data = files.loads_json(Path(path).read_text(), f"launch counts {path}")
    return data["suites"], data["tests"]


@dataclass
class Row:
    """One suite in one patched mode, against the same suite unpatched."""

    suite: str
    mode: str
    unpatched: int  # tests passed unpatched
    patched: int  # tests passed patched
    lost: list[str]  # tests that passed unpatched and not patched
    launches: int
    must_launch: bool
    failures: list[str] = field(default_factory=list)
    why_not: str = ""  # why launches are not required, where they are not


def judge(
    mode: str,
    base: dict[str, str],
    patched: dict[str, str],
    suite_of_test: dict[str, str],
    counts: dict[str, dict],
    must_launch: bool,
) -> list[Row]:
    """Rows for every suite of a patched run in ``mode``. ``base`` and ``patched``: test id -> outcome (PASSED,
    FAILED, ...); ``suite_of_test``: test id -> suite (a test missing there counts under ``"?"``); ``counts``: the
    patched run's :func:`read_counts`. With ``must_launch`` (a patched mode with backend triton) a suite that
    patched a model and launched nothing fails, as does a lost test anywhere."""
    by_suite: dict[str, list[str]] = {name: [] for name in counts}
    for test in sorted({*base, *patched}):
        by_suite.setdefault(suite_of_test.get(test, "?"), []).append(test)
    rows = []
    for suite, tests in sorted(by_suite.items()):
        count = counts.get(suite, {})
        asked = must_launch and count.get("patched", 0) > 0
        row = Row(
            suite,
            mode,
            sum(base.get(t) == "PASSED" for t in tests),
            sum(patched.get(t) == "PASSED" for t in tests),
            [t for t in tests if base.get(t) == "PASSED" and patched.get(t) != "PASSED"],
            count.get("launches", 0),
            asked,
            why_not="" if asked else _why_not_asked(count) if must_launch else "not required",
        )
        if row.lost:
            row.failures.append(f"{len(row.lost)} tests passed unpatched and not patched")
        if row.must_launch and row.launches == 0:
            row.failures.append("patched with backend triton and launched no kernel of ours")
        rows.append(row)
    return rows


def _why_not_asked(count: dict) -> str:
    if count.get("patched_meta", 0):
        return "patched on the meta device only: nothing computed"
    return "nothing patched"


def table(rows: list[Row]) -> str:
    """The report, one line a suite and mode: unpatched N passed, patched N passed, lost L, launches K."""
    width = max([len(r.suite) for r in rows] + [5])
    mode_width = max([len(r.mode) for r in rows] + [4])
    lines = [f"  {'suite':<{width}}  {'mode':<{mode_width}}  unpatched  patched  lost  launches"]
    for r in rows:
        launches = f"{r.launches}" + (f" ({r.why_not})" if r.why_not else "")
        lines.append(
            f"  {r.suite:<{width}}  {r.mode:<{mode_width}}  {r.unpatched:>9}  {r.patched:>7}  {len(r.lost):>4}  "
            f"{launches}" + "".join(f"\n    FAIL: {f}" for f in r.failures)
        )
        lines += [f"      lost: {t}" for t in r.lost]
    return "\n".join(lines)
