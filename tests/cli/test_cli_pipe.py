"""Output piped into something that closes early (``vit-fast info | head -1``) ends the command quietly with
exit 141 (128 + SIGPIPE, as for any Unix tool), handled once at the CLI's entry; a broken pipe that is not
stdout's reader going away stays a failure with its one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from vit_fast import cli


def _with_reader_gone(*argv: str) -> tuple[int, str]:
    """Run ``vit-fast ARGV`` with its stdout a pipe whose reading end is closed before the command writes."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "vit_fast.cli", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    proc.stdout.close()  # the reader is gone before the child has imported anything
    try:
        err = proc.stderr.read()
        return proc.wait(timeout=120), err
    finally:
        proc.kill()
        proc.wait()


def test_info_into_a_closed_pipe_exits_quietly():
    code, err = _with_reader_gone("info")
    assert err == ""  # no "Broken pipe", no BrokenPipeError from the flush at exit
    assert code == cli.READER_GONE == 141


def test_json_report_into_a_closed_pipe_exits_quietly():
    """``vit-fast info --json - | head -c 0``: the report meets the closed pipe; the text report went to stderr."""
    code, err = _with_reader_gone("info", "--json", "-")
    assert code == cli.READER_GONE and "versions:" in err
    assert "Broken pipe" not in err and "Traceback" not in err and "vit-fast info: error" not in err


def test_help_into_a_closed_pipe_says_nothing():
    code, err = _with_reader_gone("export", "--help")
    assert err == "" and code in (0, cli.READER_GONE)  # argparse itself ignores write errors while printing help


def test_a_broken_pipe_elsewhere_is_still_a_failure(monkeypatch, capsys):
    """A BrokenPipeError while stdout's reader is still there (a child process or server that went away) is
    the command failing, not the reader stopping."""

    def run(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("vit_fast.cli.info.run", run)
    assert cli.main(["info"]) == 1
    assert capsys.readouterr().err == "vit-fast info: error: [Errno 32] Broken pipe\n"


def test_the_reader_is_gone_only_for_a_closed_pipe(monkeypatch, tmp_path):
    import os

    read, write = os.pipe()
    with os.fdopen(write, "w") as stream:
        monkeypatch.setattr(sys, "stdout", stream)
        assert cli.stdout_reader_gone() is False  # a reader is there
        os.close(read)
        assert cli.stdout_reader_gone() is True
    with open(tmp_path / "out.txt", "w") as stream:
        monkeypatch.setattr(sys, "stdout", stream)
        assert cli.stdout_reader_gone() is False  # a file has no reader to lose


@pytest.mark.parametrize("argv", [["info"], ["--version"]])
def test_a_reader_that_stays_gets_everything(argv):
    result = subprocess.run([sys.executable, "-m", "vit_fast.cli", *argv], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stderr == "" and result.stdout.strip()


@pytest.mark.parametrize(("argv", "code"), [(["info"], 0), (["info", "--json", "-"], 1)])
def test_a_closed_stdout_is_no_traceback(argv, code):
    """Started with fd 1 closed (``vit-fast info >&-``): Python has no sys.stdout. The text has nowhere to go and
    is dropped; a report asked for on stdout is refused in one line before any work."""
    import os

    result = subprocess.run(
        [sys.executable, "-m", "vit_fast.cli", *argv],
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.close(1),
    )
    assert result.returncode == code and "Traceback" not in result.stderr, result.stderr
    if code:
        assert result.stderr == (
            f"vit-fast: note: stdout is closed; it now points at {os.devnull}: what goes there is lost\n"
            "vit-fast info: error: --json -: standard output is closed; give a file path such as report.json\n"
        )
