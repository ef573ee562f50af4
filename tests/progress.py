"""A pytest plugin for long runs: with ``--progress-every SECONDS`` it prints, at most that often, the tests done of
the total, the time so far and an estimate of the time left from the rate so far. ``make test`` loads it
(``-p tests.progress``); docs/development.md, "Tests"."""

from __future__ import annotations

import time

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--progress-every",
        type=float,
        default=None,
        metavar="SECONDS",
        help="print tests done / total, time so far and an estimate of the time left, at most every SECONDS (0: after "
        "each test)",
    )


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def progress_line(done: int, total: int, elapsed_s: float) -> str:
    """One progress line: ``done`` of ``total`` tests after ``elapsed_s`` seconds, and the time left if the rest
    go at the rate so far."""
    share = f"{100 * done // total} %" if total else "100 %"
    line = f"progress: {done:,} of {total:,} tests ({share}), {_duration(elapsed_s)} so far"
    if 0 < done < total:
        line += f", about {_duration(elapsed_s / done * (total - done))} left at this rate"
    return line


class Progress:
    def __init__(self, config: pytest.Config, every_s: float) -> None:
        self.config, self.every_s = config, every_s
        self.total = self.done = 0
        self.start = self.last = time.monotonic()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.total = len(session.items)
        self.start = self.last = time.monotonic()

    def pytest_runtest_logfinish(self) -> None:
        self.done += 1
        now = time.monotonic()
        if now - self.last < self.every_s and self.done < self.total:
            return
        self.last = now
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        if self.config.get_verbosity() <= 0:  # a line of dots ends without a file path for ensure_newline to see
            reporter.write("\n")
        reporter.write_line(progress_line(self.done, self.total, now - self.start))


def pytest_configure(config: pytest.Config) -> None:
    every_s = config.getoption("progress_every")
    if every_s is None:
        return
    if not every_s >= 0:  # also NaN
        raise pytest.UsageError(f"--progress-every must be a number of seconds >= 0, got {every_s}")
    config.pluginmanager.register(Progress(config, every_s), "vit-fast-progress")
