"""Which triton the kernels need, whether torch and triton belong together, and dependency ranges that never make
pip replace the user's torch (vit_fast.base.versions, pyproject.toml, the Makefile's oldest pair)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.version import Version

from vit_fast.backend import runtime
from vit_fast.base import cards
from vit_fast.base import versions as kernel_versions
from vit_fast.base.interpret import interpreter_enabled

tomllib = pytest.importorskip("tomllib", reason="pyproject.toml is read with Python 3.11's tomllib")
ROOT = Path(__file__).resolve().parents[2]

#: torch minor -> the triton its Linux x86_64 wheels require exactly (``Requires-Dist: triton==X``), from each
#: release's metadata; KERNELS.md lists the same. A torch range that admits a minor missing here fails the test:
#: add the minor's pin first.
TORCH_PINS = {
    (2, 4): "3.0.0",
    (2, 5): "3.1.0",
    (2, 6): "3.2.0",
    (2, 7): "3.3.0",
    (2, 8): "3.4.0",
    (2, 9): "3.5.0",
    (2, 10): "3.6.0",
    (2, 11): "3.6.0",
    (2, 12): "3.7.0",
    (2, 14): "3.8.0",
}


def _fake_install(monkeypatch, versions: dict[str, str | None], torch_requires: list[str] | None) -> None:
    """What importlib.metadata reports: ``versions`` per distribution and torch's requirements."""
    monkeypatch.setattr(kernel_versions, "installed", lambda dist: versions.get(dist))

    def requires(dist: str):
        if dist != "torch" or torch_requires is None:
            raise kernel_versions.importlib.metadata.PackageNotFoundError(dist)
        return torch_requires

    monkeypatch.setattr(kernel_versions.importlib.metadata, "requires", requires)


TORCH_28_REQUIRES = [
    "filelock",
    "typing-extensions>=4.10.0",
    "nvidia-cuda-runtime-cu12==12.8.90; platform_system == 'Linux' and platform_machine == 'x86_64'",
    "triton==3.4.0; platform_system == 'Linux' and platform_machine == 'x86_64'",
    "optree>=0.13.0; extra == 'optree'",
]


# ------------------------------------------------------------------------------ reading torch's pin
def test_pin_read_from_torch_metadata(monkeypatch):
    _fake_install(monkeypatch, {"torch": "2.8.0", "triton": "3.4.0"}, TORCH_28_REQUIRES)
    assert kernel_versions.torch_pinned_triton() == "3.4.0"


@pytest.mark.parametrize(
    "requires, pin",
    [
        (["pytorch-triton==3.7.0+git1234; platform_system == 'Linux'"], "3.7.0+git1234"),  # a nightly
        (["filelock", "sympy>=1.13.3"], None),  # a CPU build pins none
        (["triton==3.6.0; extra == 'triton'"], None),  # an extra is no pin
    ],
)
def test_pin_variants(monkeypatch, requires, pin):
    _fake_install(monkeypatch, {"torch": "2.13.0"}, requires)
    assert kernel_versions.torch_pinned_triton() == pin


def test_no_torch_distribution_means_no_pin(monkeypatch):
    _fake_install(monkeypatch, {}, None)
    assert kernel_versions.torch_pinned_triton() is None


# ------------------------------------------------------------------------------ too old, mismatched
def test_too_old_triton_names_both_versions_and_the_fix(monkeypatch):
    _fake_install(monkeypatch, {"torch": "2.8.0", "triton": "3.4.0"}, TORCH_28_REQUIRES)
    problem = kernel_versions.triton_problem()
    assert problem is not None
    assert "triton 3.4.0 is installed" in problem and "torch 2.8.0 pins triton 3.4.0" in problem
    assert "triton >= 3.6" in problem and "pip install 'torch>=2.10'" in problem


@pytest.mark.parametrize("triton_version", ["3.6.0", "3.9.0", "4.0.0+git", None])
def test_new_enough_or_absent_triton_is_no_problem(monkeypatch, triton_version):
    _fake_install(monkeypatch, {"torch": "2.13.0", "triton": triton_version}, [])
    assert kernel_versions.triton_problem() is None


def test_mismatched_pair_detected(monkeypatch):
    _fake_install(monkeypatch, {"torch": "2.10.0", "triton": "3.9.0"}, ["triton==3.6.0; platform_system == 'Linux'"])
    problem = kernel_versions.pair_problem()
    assert problem is not None and "torch 2.10.0" in problem and "3.6.0" in problem and "3.9.0" in problem
    assert "pip install 'triton==3.6.0'" in problem


@pytest.mark.parametrize(
    "versions, requires",
    [
        ({"torch": "2.10.0", "triton": "3.6.0"}, ["triton==3.6.0"]),  # the pair torch was built with
        ({"torch": "2.13.0", "triton": "3.9.0"}, []),  # a CPU torch pins none: any triton
        ({"torch": "2.10.0", "triton": None}, ["triton==3.6.0"]),  # no triton: nothing to pair
    ],
)
def test_matching_pairs(monkeypatch, versions, requires):
    _fake_install(monkeypatch, versions, requires)
    assert kernel_versions.pair_problem() is None


# ------------------------------------------------------------------------------ the interpreter with numpy >= 2.4
@pytest.mark.parametrize(
    "triton_version, numpy_version, broken",
    [
        ("3.6.0", "2.4.0", True),  # the GPU box's triton with the numpy that made int() of a 1-D array an error
        ("3.6.0", "2.5.0", True),
        ("3.6.0+git1234", "2.4.6", True),
        ("3.6.0", "2.3.5", False),  # CI's oldest pair: numpy < 2.4
        ("3.7.0", "2.4.0", False),  # triton 3.7's interpreter squeezes the array first
        ("3.9.0", "2.5.0", False),
        ("3.6.0", None, False),
        (None, "2.4.0", False),
    ],
)
def test_interpreter_problem_by_versions(monkeypatch, triton_version, numpy_version, broken):
    _fake_install(monkeypatch, {"torch": "2.13.0", "triton": triton_version, "numpy": numpy_version}, [])
    problem = kernel_versions.interpreter_problem()
    assert (problem is not None) is broken
    if broken:
        assert f"triton {triton_version}" in problem and f"numpy {numpy_version}" in problem
        assert "only 0-dimensional arrays can be converted to Python scalars" in problem
        assert "pip install 'numpy<2.4'" in problem and "pip install 'triton>=3.7'" in problem  # a CPU torch


def test_interpreter_problem_keeps_the_torch_pair(monkeypatch):
    """Where torch pins triton 3.6.0 (torch 2.10 and 2.11), the triton fix is a torch that pins 3.7 or newer, not a
    bare triton upgrade that would break the pair."""
    _fake_install(monkeypatch, {"torch": "2.11.0", "triton": "3.6.0", "numpy": "2.5.0"}, ["triton==3.6.0"])
    problem = kernel_versions.interpreter_problem()
    assert "pip install 'numpy<2.4'" in problem and "pip install 'torch>=2.12'" in problem
    assert "torch 2.11.0 pins triton 3.6.0" in problem and "pip install 'triton" not in problem
    assert TORCH_PINS[kernel_versions.TORCH_FOR_INTERPRETER_FIX] == "3.7.0"
    assert Version(TORCH_PINS[(2, 11)]) < Version(".".join(map(str, kernel_versions.INTERPRETER_FIXED_TRITON)))


BROKEN = "Triton's interpreter in triton 3.6.0 cannot run vit-fast's kernels with numpy 2.5.0: (the fix)"


@pytest.mark.skipif(not interpreter_enabled(), reason="the refusal is on the interpreted launch path (no GPU here)")
def test_broken_interpreter_refuses_before_any_launch(monkeypatch):
    """With a triton and numpy that break the interpreter (faked), an interpreted launch raises
    InterpreterVersionError with the message before running anything, the triton backend refuses with it, and
    ``vit-fast info`` says so. (Met by a test that does not expect it, the error skips that test: conftest.)"""
    import vit_fast
    from vit_fast.kernels import launches, layer_norm

    ran = []
    monkeypatch.setattr(launches.ResolvedLaunches, "_triton", lambda self, *a: ran.append(a))
    monkeypatch.setattr(launches, "interpreter_version_problem", lambda: BROKEN)
    x = torch.randn(4, 32)
    with pytest.raises(kernel_versions.InterpreterVersionError, match=re.escape(BROKEN)):
        layer_norm.layer_norm(x, torch.ones(32), torch.zeros(32), 1e-6)
    assert ran == []
    monkeypatch.setattr(runtime, "interpreter_version_problem", lambda: BROKEN)
    assert not runtime.triton_available()
    with pytest.raises(kernel_versions.InterpreterVersionError, match=re.escape(BROKEN)):
        runtime.require_triton()
    model = vit_fast.VisionTransformer(
        vit_fast.ViTConfig(img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2)
    )
    with pytest.raises(RuntimeError, match=re.escape(BROKEN)):
        model.set_backend("triton")
    from vit_fast.backend.env import collect_info

    assert collect_info()["backends"]["triton"] == f"no: {BROKEN}"


# ------------------------------------------------------------------------------ what a too-old triton does
def test_triton_backend_refused_with_the_message(monkeypatch):
    """The triton backend says why it cannot run; backend='auto' stays on torch (nothing else breaks)."""
    import vit_fast

    message = "vit-fast's Triton kernels need triton >= 3.6, and triton 3.4.0 is installed (torch 2.8.0 pins it)"
    monkeypatch.setattr(runtime, "triton_version_problem", lambda: message)
    assert not runtime.triton_available()
    with pytest.raises(RuntimeError, match=re.escape(message)):
        runtime.require_triton()
    cfg = vit_fast.ViTConfig(img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2)
    model = vit_fast.VisionTransformer(cfg)
    with pytest.raises(RuntimeError, match="triton 3.4.0 is installed"):
        model.set_backend("triton")
    from vit_fast.backend.env import collect_info

    assert collect_info()["backends"]["triton"] == f"no: {message}"  # vit-fast info says so too
    monkeypatch.setattr(runtime, "cuda_available", lambda: True)
    with cards.pretend_arch(90):  # even on a card our kernels suit, auto stays on torch and says why
        assert runtime.auto_backend("cuda:0", 64) == "torch"
        assert str(runtime.choose_backend("cuda:0", 64)) == f"torch: {message}"


IMPORT_WITH_OLD_TRITON = """
import importlib.metadata as m, warnings
real_version, real_requires = m.version, m.requires
m.version = lambda d: {"triton": "3.4.0", "torch": "2.8.0"}.get(d) or real_version(d)
m.requires = lambda d: ["triton==3.4.0; platform_system == 'Linux'"] if d == "torch" else real_requires(d)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import vit_fast
    import vit_fast.kernels
names = [type(w.message).__name__ for w in caught if "triton" in str(w.message)]
print(names)
print([str(w.message) for w in caught if "triton" in str(w.message)][0])
model = vit_fast.VisionTransformer(vit_fast.ViTConfig(img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2))
print(model.resolved_backend(__import__("torch").zeros(1, 3, 16, 16)))
"""


def test_import_with_too_old_triton_warns_once_and_keeps_the_torch_backend():
    """``import vit_fast`` with torch 2.8's triton 3.4 (faked metadata, a fresh process): one warning that names
    both versions and the fix; the package imports and the model runs on the torch backend."""
    env = {"PATH": "/usr/bin:/bin", "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-c", IMPORT_WITH_OLD_TRITON], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    names, message, backend = run.stdout.strip().splitlines()
    assert names == "['TritonVersionWarning']"
    assert "triton 3.4.0 is installed (torch 2.8.0 pins triton 3.4.0)" in message and "torch>=2.10" in message
    assert backend == "torch"


# ------------------------------------------------------------------------------ dependency ranges
def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    texts = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        texts += extra
    return [Requirement(t) for t in texts]


def _specifier(name: str):
    found = [r for r in _requirements() if r.name in {name, "pytorch-" + name}]
    assert found, f"pyproject.toml names no {name}"
    spec = found[0].specifier
    for other in found[1:]:
        spec &= other.specifier
    return spec


def test_every_supported_torch_keeps_the_triton_it_pins():
    """The class of bug: a dependency that forces a torch swap. Every torch release that pyproject's torch range
    admits must be able to keep the triton it pins exactly, so pip never replaces an installed torch to satisfy
    us (a ``triton>=3.6`` replaced torch 2.8 and 2.9). The range's floor must be a torch whose pin is known."""
    torch_spec, triton_spec = _specifier("torch"), _specifier("triton")
    admitted = {minor: pin for minor, pin in TORCH_PINS.items() if f"{minor[0]}.{minor[1]}.0" in torch_spec}
    assert admitted, f"torch {torch_spec} admits no torch release this test knows"
    floor = min(admitted)
    assert f"{floor[0]}.{floor[1] - 1}.0" not in torch_spec or (floor[0], floor[1] - 1) in TORCH_PINS, (
        f"torch {torch_spec} admits releases older than torch {floor[0]}.{floor[1]}: add their triton pins here"
    )
    for (major, minor), pin in sorted(admitted.items()):
        assert pin in triton_spec, (
            f"triton {triton_spec} excludes triton {pin}, which torch {major}.{minor} pins: pip would replace that "
            "torch. Keep triton's floor at or below the oldest supported torch's pin"
        )
    # the users the issue names keep their torch
    assert "2.8.0" in torch_spec and "2.9.0" in torch_spec


def test_torch_floor_is_what_the_code_calls():
    """torch.library.custom_op (every kernel's op, the model's custom-op path) arrived in torch 2.4."""
    assert min(_specifier("torch"), key=lambda s: Version(s.version)).version == "2.4"


def test_kernel_floor_matches_the_pins_and_the_oldest_pair_ci_tests():
    """MIN_TORCH_FOR_KERNELS is the oldest torch whose pin reaches MIN_TRITON, and the Makefile's oldest pair
    installs exactly MIN_TRITON."""
    want = Version(".".join(map(str, kernel_versions.MIN_TRITON)))
    oldest = min(minor for minor, pin in TORCH_PINS.items() if Version(pin) >= want)
    assert oldest == kernel_versions.MIN_TORCH_FOR_KERNELS
    makefile = (ROOT / "Makefile").read_text()
    spec = re.search(r"^OLDEST_SPEC \?= (.*)$", makefile, re.M).group(1)
    assert f"triton=={want}.0" in spec.split()
