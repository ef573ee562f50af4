"""The test session's torchvision stand-in: vit-fast's own (vit_fast/interop/timm_import.py), put in place before any
test module imports timm, so timm's model code imports where the real torchvision cannot (CPU machines whose
torch is a CPU build; the GPU machine has the real one)."""

from __future__ import annotations

from vit_fast.interop.timm_import import install_standin, standin_installed


def install() -> bool:
    """Install the stand-in unless a real torchvision imports; True when the stand-in is in use."""
    install_standin()
    return standin_installed()
