"""Every script under benchmarks/ refuses a bad argument before any work as vit-fast does: one line naming the flag
and what is allowed, exit 2, no traceback (benchmarks/script_args.py; docs/benchmarks.md, "Script arguments")."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..fakes import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("script", "argv", "says"),
    [
        ("host_overhead", ["--batch", "0"], "argument --batch: must be an int from 1 to 4096, got '0'"),
        ("host_overhead", ["--dtype", "fp8"], "argument --dtype: unknown dtype 'fp8'"),
        ("host_overhead", ["--iters", "x"], "argument --iters: expected an int from 1 to 100000, got 'x'"),
        ("host_overhead", ["--models", "no_such_model"], "argument --models:"),
        ("host_overhead", ["--json", "r.txt"], "--json"),
        ("serve_perf", ["--concurrency", "1,0"], "argument --concurrency: must be an int from 1 to 1024, got '0'"),
        ("serve_perf", ["--batch", "a"], "argument --batch: expected an int from 1 to 4096"),
        ("serve_perf", ["--protocols", "udp"], "argument --protocols: 'udp': grpc, http or grpc,http"),
        ("serve_perf", ["--interval-ms", "5"], "argument --interval-ms: must be an int from 100 to 600000"),
        ("serve_perf", ["--repeats", "0"], "argument --repeats: must be an int from 1 to 100"),
        ("serve_perf", ["--plain-threads", "-1"], "argument --plain-threads: must be an int from 1 to 4096"),
    ],
)
def test_a_bad_argument_is_one_line_and_exit_2(script, argv, says, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    module = load_script(ROOT / "benchmarks" / f"{script}.py", f"{script}_script")
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and says in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bounded_refuses_what_is_not_a_finite_number_in_range():
    script_args = load_script(ROOT / "benchmarks" / "script_args.py", "script_args_module")
    half = script_args.bounded(float, 0, 1)
    assert half("0.5") == 0.5
    for text in ("nan", "inf", "-0.1", "1.5", "one"):
        with pytest.raises(Exception, match="number from 0 to 1"):
            half(text)
