"""vit_fast.util.lazy: a package's public names load from their submodules on first use, so its settings module
imports without torch, and each name it lists resolves to its submodule's object."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_PROBE = textwrap.dedent(
    """
    import importlib, sys
    importlib.import_module(PACKAGE + ".settings")
    assert "torch" not in sys.modules, "loading the settings imported torch"
    package = sys.modules[PACKAGE]
    for module, names in HOMES.items():
        for name in names:
            assert name in package.__all__ and name in dir(package), name
            assert getattr(package, name) is getattr(importlib.import_module(PACKAGE + "." + module), name), name
    assert package.base.__name__ == PACKAGE + ".base"  # a submodule by its name, loaded then
    try:
        package.no_such_name
    except AttributeError as err:
        assert "no_such_name" in str(err), err
    else:
        raise AssertionError("an unknown name resolved")
    print("ok")
    """
)


@pytest.mark.parametrize(
    ("package", "homes"),
    [
        ("vit_fast.doctor", {"settings": ["DoctorSettings"], "report": ["run_doctor"], "checks": ["kernel_checks"]}),
        ("vit_fast.demo", {"settings": ["DemoSettings"], "report": ["run_demo"], "steps": ["ACCURACY_TOLERANCE_PP"]}),
    ],
)
def test_names_load_on_first_use_from_their_submodule(package, homes):
    code = f"PACKAGE = {package!r}\nHOMES = {homes!r}\n{_PROBE}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
