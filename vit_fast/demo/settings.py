"""What ``vit-fast demo`` asks for, without importing torch: the command line builds its parser from these
defaults (``vit-fast demo --help`` stays fast); :func:`vit_fast.demo.run_demo` runs the steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_OUT = "vit-fast-out/demo"
#: the ONNX artifact and the verification report published with it (only once it passed) in --out
ONNX_NAME, ONNX_REPORT = "digits_vit.onnx", "digits_vit.verify.json"


@dataclass
class DemoSettings:
    """What ``vit-fast demo`` asks for (its ``--help`` says what each field does)."""

    out: Path = field(default_factory=lambda: Path(DEFAULT_OUT))
    device: str = "auto"  # auto | cpu | cuda
    subset: int = 16
    triton_timeout: float = 300.0
    skip_triton: bool = False
    skip_onnx: bool = False
    skip_timing: bool = False
    no_plots: bool = False
    exporter: str = "dynamo"
    opset: int = 18
    repeats: int = 15
    threads: int | None = None
    seed: int = 0
    overwrite: bool = False
