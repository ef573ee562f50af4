"""How vit-fast says it is installed: every message, docstring and document names an install that works from a
checkout (vit-fast is not on PyPI), through the one helper ``vit_fast.backend.env.install_hint``, with extras that
exist; and the license is declared as pyproject.toml's SPDX string with its LICENSE file. The wheel itself, installed
beside a pinned torch, is checked by ``make wheel-check`` (.ci/check_wheel.sh): too slow for the suite."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vit_fast.backend.env import EXTRAS, MODULE_EXTRAS, install_hint

tomllib = pytest.importorskip("tomllib", reason="tomllib (to read pyproject.toml) comes with Python >= 3.11")

ROOT = Path(__file__).resolve().parent.parent
#: what ships or is read by a user: the packages, the developer tools, CI, the documents and the tests
SCANNED = ("vit_fast", "kernels", "export", "tools", "benchmarks", "tests", ".ci", "docs")
SUFFIXES = {".py", ".md", ".sh", ".toml", ".txt"}
#: ``pip install vit-fast``, ``pip install -U 'vit-fast[onnx]'``, ``"vit_fast>=0.1"``: a package index install
INDEX_INSTALL = re.compile(r"pip3? install\s+(?:-{1,2}[\w-]+\s+)*['\"]?vit[-_]fast\b(?![-\w.]*\.whl)")
#: ``vit-fast[serve]``: the extra as a requirement of a distribution on an index
INDEX_EXTRA = re.compile(r"vit[-_]fast\[")
#: the extras a checkout install names: ``pip install -e '.[serve]'``, ``pip install '.[onnx,bench]'``
CHECKOUT_EXTRAS = re.compile(r"pip3? install\s+(?:-e\s+)?['\"]?\.\[([\w,\s]+)\]")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _texts() -> list[tuple[str, str]]:
    files = [ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml", ROOT / ".ci" / "run"]
    for top in SCANNED:
        files += [p for p in (ROOT / top).rglob("*") if p.is_file() and p.suffix in SUFFIXES]
    here = Path(__file__).resolve()  # this file spells the patterns out
    return [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")) for p in files if p.resolve() != here]


def test_extras_are_pyprojects():
    assert set(EXTRAS) == set(_pyproject()["project"]["optional-dependencies"])
    assert set(MODULE_EXTRAS.values()) <= set(EXTRAS)


def test_install_hint_names_a_checkout_install():
    assert install_hint("serve") == "pip install -e '.[serve]' in a vit-fast checkout"
    assert install_hint() == "pip install -e . in a vit-fast checkout"
    with pytest.raises(ValueError, match=r"no extra 'gpu'; its extras are onnx, tensorrt"):
        install_hint("gpu")


def test_the_scan_sees_the_old_wording():
    assert INDEX_INSTALL.search("needs `pip install vit-fast` in the Python") is not None
    assert INDEX_INSTALL.search("pip install --upgrade 'vit-fast[serve]'") is not None
    assert INDEX_EXTRA.search("pip install 'vit-fast[demo]'") is not None
    assert INDEX_INSTALL.search("pip install -e . in a vit-fast checkout") is None
    assert INDEX_INSTALL.search('pip install "dist/vit_fast-0.1.0-py3-none-any.whl[onnx]"') is None
    assert CHECKOUT_EXTRAS.findall("pip install -e '.[onnx,bench]'; pip install '.[demo]'") == ["onnx,bench", "demo"]


def test_nothing_says_to_install_vit_fast_from_an_index():
    texts = _texts()
    assert len(texts) > 100 and any(name == "README.md" for name, _ in texts)
    found = [
        f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
        for name, text in texts
        for pattern in (INDEX_INSTALL, INDEX_EXTRA)
        for m in pattern.finditer(text)
    ]
    advice = "vit-fast is not on PyPI: name a checkout install (vit_fast.backend.env.install_hint)"
    assert not found, "\n".join([advice, *found])


def test_every_checkout_install_names_extras_that_exist():
    named = {
        (name, extra.strip())
        for name, text in _texts()
        for group in CHECKOUT_EXTRAS.findall(text)
        for extra in group.split(",")
    }
    assert {extra for _, extra in named} >= {"onnx", "serve", "demo", "tensorrt"}  # the scan finds the messages
    assert not {(name, extra) for name, extra in named if extra not in EXTRAS}


def test_license_is_an_spdx_string_with_its_file():
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"] and "END OF TERMS AND CONDITIONS" in text
    requires = _pyproject()["build-system"]["requires"]
    assert requires == ["setuptools>=77"]  # the first setuptools that reads a license expression (PEP 639)
