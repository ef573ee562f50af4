"""What ``vit-fast doctor`` asks for, without importing torch: the command line builds its parser from these
defaults (``vit-fast doctor --help`` stays fast); :func:`vit_fast.doctor.run_doctor` runs the checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_OUT = "vit-fast-out/doctor"


@dataclass
class DoctorSettings:
    """What ``vit-fast doctor`` asks for (its ``--help`` says what each field does)."""

    model: str = "default"
    config: str | None = None
    weights: str | None = None
    out: Path = field(default_factory=lambda: Path(DEFAULT_OUT))
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtypes: list[str] | None = None  # None: fp32, fp16 and bf16 where the card has it natively (CPU: fp32, fp16)
    seed: int = 0
    timeout: float = 300.0  # seconds the interpreter child may take
