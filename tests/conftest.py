"""Test set-up. Without a GPU, Triton kernels run in the interpreter: that must be decided
before triton is first imported, so it happens here, before any test module loads. Where the real
torchvision cannot be imported (CPU machines), an import-time stand-in lets timm's model code
import (tests/torchvision_standin.py).

Where the installed triton and numpy break Triton's interpreter (triton < 3.7 with numpy >= 2.4:
``vit_fast.base.versions.interpreter_problem``), every interpreted launch of our kernels raises
``InterpreterVersionError`` before it runs; a test that meets it is skipped with that message (the cause and
the fix), not failed: the fault is triton's, and the same tests run wherever the pair works."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from vit_fast.base.interpret import interpreter_enabled, interpreter_version_problem  # noqa: E402
from vit_fast.base.versions import InterpreterVersionError  # noqa: E402

from .torchvision_standin import install as _install_torchvision_standin  # noqa: E402

TORCHVISION_STANDIN = _install_torchvision_standin()


def pytest_report_header(config) -> list[str]:
    problem = interpreter_version_problem()
    if problem is None:
        return []
    where = "the kernel tests run in it here" if interpreter_enabled() else "tests that start it"
    return [f"Triton's interpreter is broken here ({where} skip with this reason): {problem}"]


def _interpreter_fault(err: BaseException | None) -> InterpreterVersionError | None:
    """The InterpreterVersionError behind ``err``: itself, or one it was raised from or while handling (an
    ``opcheck`` or ``pytest.warns`` wraps what a kernel raised)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, InterpreterVersionError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    except BaseException as err:  # pytest.warns' "DID NOT WARN" is a BaseException
        fault = _interpreter_fault(err)
        if fault is None:
            raise
        pytest.skip(str(fault))


@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
