"""vit_fast/interop/timm_import.py: the torchvision stand-in lives only while timm imports. Afterwards no finder of ours
is on sys.meta_path and no stand-in module in sys.modules, so later imports see torchvision as it is here,
and timm still builds and runs a ViT. Run in a fresh process: the test session keeps its own stand-in
(tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

PROBE = textwrap.dedent(
    """
    import json, sys
    import torch
    from vit_fast.interop.timm_import import StandInFinder, import_timm

    try:
        import torchvision  # noqa: F401
        real = True
    except Exception:
        real = False
    timm = import_timm()
    after = {
        "real": real,
        "finders": sum(isinstance(f, StandInFinder) for f in sys.meta_path),
        "standins": sorted(n for n, m in sys.modules.items() if type(m).__name__ == "_StandInModule"),
        "again": import_timm() is timm,
    }
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8).eval()
    with torch.no_grad():
        after["logits"] = list(model(torch.randn(2, 3, 32, 32)).shape)
    try:
        import torchvision  # noqa: F401,F811
        after["later"] = "imported"
    except Exception as err:
        after["later"] = type(err).__name__
    print(json.dumps(after))
    """
)


def test_the_standin_is_gone_once_timm_is_imported_and_timm_still_works(tmp_path):
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["finders"] == 0 and seen["standins"] == [], seen
    assert seen["again"] is True and seen["logits"] == [2, 1000]
    notes = [line for line in result.stderr.splitlines() if "torchvision stand-in" in line]
    if seen["real"]:  # the real torchvision imports here: it is used, no stand-in, no note
        assert seen["later"] == "imported" and notes == []
    else:  # later imports of torchvision fail as they would without vit-fast: nothing answers for it
        assert seen["later"] in ("ModuleNotFoundError", "ImportError", "RuntimeError"), seen
        assert len(notes) == 1, result.stderr


def test_the_torchvision_note_comes_with_a_use_of_timm_not_with_an_unrelated_error(tmp_path):
    """``export onnx nosuchmodel`` looks the name up in timm (through the stand-in where torchvision cannot be
    imported): the error is about the name, with no note about torchvision. A use of timm's model code after a
    look-up says the note, once."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cli = [sys.executable, "-m", "vit_fast.cli", "export", "onnx", "nosuchmodel", "--out", "o.onnx"]
    result = subprocess.run(cli, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 1 and "cannot resolve model 'nosuchmodel'" in result.stderr, result.stderr
    assert "torchvision" not in result.stderr, result.stderr
    probe = textwrap.dedent(
        """
        import sys
        from vit_fast.interop.timm_import import import_timm
        import_timm(note=False)
        print("after the look-up", file=sys.stderr, flush=True)
        import_timm()
        import_timm()
        """
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    notes = [i for i, line in enumerate(lines) if "torchvision stand-in" in line]
    if _real_torchvision():  # nothing stands in: no note at all
        assert notes == []
    else:
        assert len(notes) == 1 and notes[0] > lines.index("after the look-up"), result.stderr


def _real_torchvision() -> bool:
    probe = "import torchvision"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=300).returncode == 0
