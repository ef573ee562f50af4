"""Serve tests: a real Triton Inference Server (PyTriton's bundled tritonserver 2.51) on loopback.

They need the serve extra (PyTriton pins numpy < 2), so they run in their own virtual environment
(`make test-serve`); in the main one each module is skipped, saying so. The load test's figures
are printed at the end of the run."""

from __future__ import annotations

from ._support import LOAD_TEST_REPORTS


def pytest_terminal_summary(terminalreporter) -> None:
    if LOAD_TEST_REPORTS:
        terminalreporter.section("vit-fast serve load test")
        for text in LOAD_TEST_REPORTS:
            terminalreporter.write_line(text)
