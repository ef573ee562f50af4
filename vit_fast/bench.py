"""vit-fast bench: not built yet."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="(not built yet)")


def run(args: argparse.Namespace) -> int:
    print("vit-fast bench is not built yet in this version.", file=sys.stderr)
    return 2
