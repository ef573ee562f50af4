"""How vit-fast says it is installed: every message, docstring and document names an install that works from a
checkout (vit-fast is not on PyPI), through the one helper ``vit_fast.backend.env.install_hint``, with extras that
exist; and the license is declared as pyproject.toml's SPDX string with its LICENSE file. The wheel itself, installed
beside a pinned torch, is checked by ``make wheel-check`` (.ci/check_wheel.sh): too slow for the suite."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vit_fast.backend.env import MODULE_EXTRAS, extras, install_hint

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
    assert set(extras()) == set(_pyproject()["project"]["optional-dependencies"])
    assert set(MODULE_EXTRAS.values()) <= set(extras())


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
    assert not {(name, extra) for name, extra in named if extra not in extras()}


def test_license_is_an_spdx_string_with_its_file():
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"] and "END OF TERMS AND CONDITIONS" in text
    requires = _pyproject()["build-system"]["requires"]
    assert requires == ["setuptools>=77"]  # the first setuptools that reads a license expression (PEP 639)


#: what each command of the README's command list needs beyond the core install (vit_fast.cli.module_extra
#: names the extra of each missing module; the demo exports and verifies an ONNX model)
COMMAND_EXTRAS = [
    ("demo", {"demo", "onnx"}),
    ("export onnx", {"onnx"}),
    ("bench", set()),
    ("serve", {"serve"}),
    ("serve", {"serve", "images"}),  # serve --encoded decodes image files
    ("predict", {"images"}),
]
#: what the core install brings (pyproject.toml's dependencies), as modules
CORE_MODULES = {"torch", "triton", "numpy", "safetensors", "vit_fast"}
TAKES_VALUE = {"--index-url", "--extra-index-url", "-i", "-c", "--constraint", "-r", "--requirement"}


def _readme_section(heading: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def _pip_lines(section: str) -> list[str]:
    code = "\n".join(re.findall(r"```bash\n(.*?)```", section, re.S))
    return [line.split("#")[0].strip() for line in code.splitlines() if re.match(r"pip3? install\b", line)]


def _requirements(line: str) -> set[str]:
    """The distributions a ``pip install`` line names besides the checkout: ``'transformers>=4.40'`` -> transformers."""
    words, names = line.split()[2:], set()
    for before, word in zip(["", *words], words, strict=False):
        word = word.strip("'\"")
        if word.startswith("-") or before in TAKES_VALUE or not word or word.startswith((".", "$")):
            continue
        names.add(re.match(r"[A-Za-z0-9_.-]+", word).group(0).lower())
    return names


def test_the_readmes_install_brings_what_its_quick_start_and_command_list_need():
    import sys

    lines = _pip_lines(_readme_section("Installing into the environment you have"))
    extras = {e.strip() for line in lines for group in CHECKOUT_EXTRAS.findall(line) for e in group.split(",")}
    named = {name for line in lines for name in _requirements(line)}
    quick = _readme_section("Quick start")
    code = "\n".join(re.findall(r"<!-- runnable -->\n```python\n(.*?)```", quick, re.S))
    imported = set(re.findall(r"^(?:import|from) (\w+)", code, re.M)) | ({"timm"} if "import_timm()" in code else set())
    assert {"torch", "vit_fast", "transformers", "timm"} <= imported  # the scan reads the blocks
    missing = imported - CORE_MODULES - set(sys.stdlib_module_names) - named
    assert not missing, f"the README's quick start imports {sorted(missing)}, which its install does not bring"
    commands = re.findall(r"^vit-fast (export onnx|\w+)(.*)$", quick, re.M)
    assert [c for c, _ in commands] == [c for c, _ in COMMAND_EXTRAS], "the command list changed: say what each needs"
    for (command, rest), (_, needs) in zip(commands, COMMAND_EXTRAS, strict=True):
        left = {extra for extra in needs if f"{extra} extra" not in rest} - extras
        assert not left, f"`vit-fast {command}` needs the extras {sorted(left)}: install them or name them on its line"


def test_timm_is_installed_beside_the_users_torch():
    """A plain ``pip install timm`` pulls PyPI's torchvision, which replaces a CPU torch with a CUDA one (gigabytes):
    every command in the documents that installs timm is ``--no-deps``; torchvision comes from the index of the user's
    torch."""
    lines = [
        (path.name, line)
        for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for line in _pip_lines(path.read_text(encoding="utf-8"))
    ]
    timm = [(name, line) for name, line in lines if "timm" in _requirements(line)]
    assert any(name == "README.md" for name, _ in timm)
    assert all("--no-deps" in line for _, line in timm), timm
    vision = [(name, line) for name, line in lines if "torchvision" in _requirements(line)]
    assert vision and all("--index-url" in line for _, line in vision), vision
    assert _requirements("pip install torchvision==0.28.0 --index-url https://x/cpu") == {"torchvision"}
