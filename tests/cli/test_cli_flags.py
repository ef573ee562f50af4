"""Every numeric flag of every subcommand goes through the one checked type (vit_fast/cli/_args.py): 0, a
negative, a value past its top or a word is a usage error while parsing (exit 2, before any work), one line
naming the flag, the value and what is allowed. The parsers are walked, so a flag added later with a bare
``type=int`` (or none) fails here."""

from __future__ import annotations

import argparse

import pytest

from vit_fast import cli
from vit_fast.cli import _args

#: a flag with one of these words in its name holds a number and must have a numeric type (a new kind of count
#: joins this list)
NUMERIC_WORDS = set(
    "batch instances threads port iters clients requests repeats subset samples opset seed limit warmup delay us "
    "timeout seconds time scale gib size count workers".split()
)


def _flags() -> list[tuple[list[str], argparse.Action]]:
    """(subcommand words, action) for every argument of every subcommand, nested ones (export onnx) included."""
    found = []

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, [*words, name])
            elif action.option_strings and action.nargs != 0 and action.dest != "help":
                found.append((words, action))

    walk(cli.build_parser(), [])
    return found


FLAGS = _flags()
NUMERIC = [(words, a) for words, a in FLAGS if isinstance(a.type, _args.Number) or hasattr(a.type, "items")]


def _bad_values(kind) -> list[str]:
    if hasattr(kind, "items"):  # a batch list: every item bad the same way, so the count is right
        n = max(1, len(kind.items))
        return [",".join([v] * n) for v in ("0", "-1", "x")]
    values = [str(kind.low) if kind.above else str(kind.low - 1), "-1", "x", "1e400" if kind.kind is float else "1.5"]
    if kind.high is not None:
        values.append(str(kind.high + 1))
    return list(dict.fromkeys(values))


def test_the_walk_finds_the_flags_it_should():
    names = {(" ".join(w), a.option_strings[0]) for w, a in NUMERIC}
    for expected in [
        ("serve", "--instances"),
        ("serve", "--threads"),
        ("serve", "--batch"),
        ("serve", "--http-port"),
        ("serve", "--clients"),
        ("bench", "--batch"),
        ("bench", "--warmup"),
        ("export onnx", "--batch"),
        ("export onnx", "--opset"),
        ("export tritonserver", "--queue-delay-us"),
        ("demo", "--subset"),
        ("doctor", "--timeout"),
    ]:
        assert expected in names, expected


@pytest.mark.parametrize("words, action", FLAGS, ids=[f"{' '.join(w)} {a.option_strings[0]}" for w, a in FLAGS])
def test_no_numeric_flag_skips_the_checked_types(words, action):
    flag = f"vit-fast {' '.join(words)} {action.option_strings[0]}"
    assert action.type not in (int, float), f"{flag}: type={action.type.__name__}; use a type from vit_fast.cli._args"
    numeric_default = isinstance(action.default, (int, float)) and not isinstance(action.default, bool)
    if action.type is None:
        assert not numeric_default, f"{flag} defaults to {action.default!r} but has no checked type"
        assert not NUMERIC_WORDS & set(action.dest.split("_")), f"{flag} reads as a number but has no checked type"


@pytest.mark.parametrize(
    "words, action, value",
    [(w, a, v) for w, a in NUMERIC for v in _bad_values(a.type)],
    ids=[f"{' '.join(w)} {a.option_strings[0]}={v}" for w, a in NUMERIC for v in _bad_values(a.type)],
)
def test_a_bad_number_is_a_one_line_usage_error(words, action, value, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    flag = action.option_strings[0]
    with pytest.raises(SystemExit) as exc:  # while parsing: no subcommand body runs
        cli.main([*words, f"{flag}={value}"])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.count("\n") == 1 and captured.out == "", err
    assert err.startswith(f"vit-fast {' '.join(words)}: error: argument {flag}"), err
    assert repr(value) in err or value in err, err  # what it got
    if isinstance(action.type, _args.Number):  # what is allowed
        assert action.type.bound in err, err
    else:
        assert "must be >= 1" in err or "has 1 item(s)" in err or "not an int" in err, err
    assert err.rstrip().endswith(f"see vit-fast {' '.join(words)} --help"), err
    assert list(tmp_path.iterdir()) == []


def test_numbers_take_their_whole_range():
    assert _args.positive_int("1") == 1 and _args.nonnegative_int("0") == 0 and _args.port("65535") == 65535
    assert _args.seed(str(_args.MAX_SEED)) == _args.MAX_SEED and _args.positive_float("1e-9") == 1e-9


def test_the_opset_floor_is_the_exporters():
    from vit_fast.export.onnx_checks import MIN_OPSET

    assert _args.opset.low == MIN_OPSET


def test_serve_instances_zero_names_the_flag_before_any_work(capsys, monkeypatch):
    """The case seen: ``vit-fast serve MODEL --instances 0`` exited 1 after the weights loaded."""

    def must_not_load(*args, **kwargs):
        raise AssertionError("the model loaded before the flag was checked")

    monkeypatch.setattr("vit_fast.interop.loading.load_model", must_not_load)
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "default", "--instances", "0"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        "vit-fast serve: error: argument --instances: must be >= 1, got 0; see vit-fast serve --help\n"
    )


JSON_FLAGS = [(words, a) for words, a in FLAGS if a.option_strings[0] == "--json"]


def test_every_command_with_a_report_has_the_one_json_flag():
    """Every --json is ``_args.add_json``'s: it takes ``-`` (stdout) and refuses a non-.json path while parsing;
    ``info --json`` alone means stdout (it has no positional argument a bare --json could swallow)."""
    commands = {" ".join(words) for words, _ in JSON_FLAGS}
    assert commands >= {"info", "demo", "export onnx", "export tensorrt", "export tritonserver", "verify", "bench"}
    assert commands >= {"serve", "doctor"}
    for words, action in JSON_FLAGS:
        assert action.type is _args.json_target, words
        assert action.type("-") == "-" and action.type("r.JSON") == "r.JSON"
        assert (action.nargs, action.const) == (("?", "-") if words == ["info"] else (None, None)), words


def test_a_bare_json_is_stdout_on_info_only(capsys):
    assert cli.build_parser().parse_args(["info", "--json"]).json == "-"
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["verify", "default", "m.onnx", "--json"])
    assert exc.value.code == 2 and "--json: expected one argument" in capsys.readouterr().err
