"""The command-line rules of the scripts under benchmarks/, as ``vit-fast`` has them (vit_fast/cli/_args.py, whose
names are private to the CLI): a bad argument is one line naming the flag, the value and what is allowed, exit 2,
before any work. Rules: docs/benchmarks.md, "Script arguments"."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


class ScriptParser(argparse.ArgumentParser):
    """argparse's parser whose error is one line (``script: error: argument --x: why; see script --help``),
    exit 2, without the usage block."""

    def error(self, message: str):  # argparse's hook: must not return
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}; see {self.prog} --help\n")


def bounded(kind: type, low: float, high: float | None = None) -> Callable[[str], int | float]:
    """The ``type=`` of a numeric flag: ``kind`` (int or float), finite, from ``low`` up to ``high``."""
    noun = "an int" if kind is int else "a number"
    allowed = f"{noun} from {low} to {high}" if high is not None else f"{noun} >= {low}"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}") from None
        if not math.isfinite(value) or value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}")
        return value

    parse.__name__ = allowed  # argparse names a type by this in its own messages
    return parse


def dtype(text: str) -> str:
    """``--dtype``: any vit_fast.util.dtypes spelling -> ``fp32`` / ``fp16`` / ``bf16``."""
    from vit_fast.util.dtypes import DTYPES, canonical_name

    name = canonical_name(text)
    if name is None:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}: choose from {', '.join(DTYPES)}")
    return name


def device(text: str) -> str:
    """``--device``: ``cpu``, ``cuda`` or ``cuda:N``; a CUDA device must be visible."""
    spec = text.strip()
    kind, _, index = spec.partition(":")
    if spec == "cpu":
        return spec
    if kind != "cuda" or not (index == "" or index.isdigit()):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}: use cpu, cuda or cuda:N")
    import torch

    if not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{spec!r} asked for, but torch sees no CUDA GPU here: use cpu")
    if index and int(index) >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{spec!r} does not exist: {torch.cuda.device_count()} GPU(s) visible")
    return spec
