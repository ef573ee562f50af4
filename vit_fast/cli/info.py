"""Print the versions of torch, triton, onnx, onnxruntime and tensorrt, the GPU's name and compute
capability, and which backends can run on this machine.

  vit-fast info
"""

from __future__ import annotations

import argparse

from vit_fast.env import collect_info, format_info

EXAMPLE = "vit-fast info"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``vit-fast info`` takes no arguments."""


def run(args: argparse.Namespace) -> int:
    print(format_info(collect_info()))
    return 0
