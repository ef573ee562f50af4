"""The documents stay true and readable: the README's code blocks marked runnable run as pasted (on the CPU, in a
fresh interpreter of this checkout's Python), the README stays short, no document cites an issue number, a
date of its own making or "here", every relative link leads to a file (and a heading) that exists, every
``vit-fast`` command line a document shows uses flags the command has, and every docstring's pointer into docs/
(``docs/usage.md, section "..."``) names a heading that exists."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vit_fast import cli

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: the marker, alone on the line before a ```python fence, of a block the tests run
RUNNABLE = "<!-- runnable -->"
MAX_README_LINES = 200


def _documents() -> list[Path]:
    docs = [README, ROOT / "benchmarks" / "README.md", ROOT / "tools" / "README.md"]
    docs += sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "benchmarks" / "results").rglob("*.md"))
    return [p for p in docs if p.is_file()]


DOCUMENTS = _documents()
#: documents that describe the code as it is (the results' logs keep their measurements' dates)
CURRENT = [p for p in DOCUMENTS if (ROOT / "benchmarks" / "results") not in p.parents]


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _fences(text: str) -> list[tuple[int, str, str]]:
    """(line number of the opening fence, its info string, the block's text) for every fenced block."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^(```+)(.*)$", lines[i])
        if m:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(m.group(1))), len(lines))
            blocks.append((i + 1, m.group(2).strip(), "\n".join(lines[i + 1 : end])))
            i = end + 1
        else:
            i += 1
    return blocks


def _runnable_blocks(path: Path) -> list[tuple[int, str]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for number, info, code in _fences("\n".join(lines)):
        if number >= 2 and lines[number - 2].strip() == RUNNABLE:
            assert info == "python", f"{_name(path)}:{number - 1}: {RUNNABLE} marks a ```{info} block, not python"
            found.append((number, code))
    return found


def test_readme_has_runnable_blocks():
    text = README.read_text(encoding="utf-8")
    blocks = _runnable_blocks(README)
    assert len(blocks) >= 1 and text.count(RUNNABLE) == len(blocks), "every runnable marker precedes a python block"


@pytest.mark.parametrize("number, code", _runnable_blocks(README), ids=lambda v: str(v) if isinstance(v, int) else "")
def test_readme_block_runs_as_pasted(number, code, tmp_path):
    for package in ("transformers", "timm"):  # the optional block's peers: the test extra and make setup bring them
        if re.search(rf"\b{package}\b", code) and importlib.util.find_spec(package) is None:
            pytest.skip(f"README.md:{number} uses {package}, which is not installed (pip install -e '.[test]')")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIT_FAST_", "TRITON_"))}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH="", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, f"README.md:{number}: the block failed:\n{run.stdout}\n{run.stderr}"
    assert "Traceback" not in run.stderr


def test_readme_is_at_most_200_lines():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines: move detail into docs/"


def test_readme_says_how_to_count_the_suite_instead_of_a_figure_that_goes_stale():
    text = README.read_text(encoding="utf-8")
    stale = re.findall(r"(?:collects|suite of|holds) [\d,]+ tests?|collects [\d,]{3,}", text)
    assert not stale, f"a test count goes stale as tests are added: {stale}; say how to count (pytest --collect-only)"
    assert "python -m pytest --collect-only -q" in text


#: an issue or pull request of ours by number: "issue 19", "issues 3 and 4", "PR #12", "#23"
ISSUE = re.compile(r"\b(?:issues?|PRs?|pull requests?)\s+#?\d+|(?<![\w&/#])#\d+\b", re.IGNORECASE)
#: a date the text was written (2026-11-24, 2026-11)
DATE = re.compile(r"\b20\d\d-(?:0[1-9]|1[0-2])(?:-\d\d)?\b")
#: "here": which machine, which file, which session? Name it
HERE = re.compile(r"\bhere\b", re.IGNORECASE)


def test_the_scans_see_what_they_look_for():
    assert ISSUE.search("the card-aware prunes (issue 19)") and ISSUE.search("see #23.") and ISSUE.search("PR 4")
    assert not ISSUE.search("[the knobs](#the-triton-paths-knobs)") and not ISSUE.search("# Heading")
    assert not ISSUE.search("https://github.com/huggingface/transformers.js/issues/1402")
    assert DATE.search("Measured 2026-11-24 on") and DATE.search("(2026-11)") and not DATE.search("24.10-py3")
    assert HERE.search("Run here: torch") and not HERE.search("where there is one")


@pytest.mark.parametrize("path", DOCUMENTS, ids=_name)
def test_no_document_cites_an_issue_or_here(path):
    text = path.read_text(encoding="utf-8")
    found = [
        f"{_name(path)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
        for pattern in (ISSUE, HERE)
        for m in pattern.finditer(text)
    ]
    assert not found, "say what was done or measured, and where, not which issue or 'here':\n" + "\n".join(found)


@pytest.mark.parametrize("path", CURRENT, ids=_name)
def test_no_current_document_is_dated(path):
    text = path.read_text(encoding="utf-8")
    found = [f"{_name(path)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in DATE.finditer(text)]
    assert not found, "a measurement's date goes with it under benchmarks/results/:\n" + "\n".join(found)


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[`*_]{2,}|`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    fenced = {n for n, _, code in _fences(text) for n in range(n, n + code.count("\n") + 2)}
    return {
        _slug(line.lstrip("#"))
        for number, line in enumerate(text.splitlines(), 1)
        if line.startswith("#") and number not in fenced
    }


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("path", DOCUMENTS, ids=_name)
def test_links_lead_somewhere(path):
    text = path.read_text(encoding="utf-8")
    broken = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target):
            continue  # a URL
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{_name(path)}:{text.count(chr(10), 0, m.start()) + 1}: {target}"
        if not dest.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{where} (no such heading)")
    assert not broken, "\n".join(broken)


def _parsers() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every (sub)command's parser by its words: (), ("bench",), ("export", "onnx"), ..."""
    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
        found[words] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, (*words, name))

    walk(cli.build_parser(), ())
    return found


def _command_lines(text: str) -> list[str]:
    """Every ``vit-fast ...`` command a document shows: lines of code blocks (continuations joined) and inline
    code spans."""
    found = []
    for _, _, code in _fences(text):
        for line in re.sub(r"\\\n\s*", " ", code).splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("vit-fast "):
                found.append(" ".join(line.split("  #")[0].split("   ")[0].split()))
    found += [span for span in re.findall(r"`([^`\n]+)`", text) if span.startswith("vit-fast ")]
    return found


def test_the_command_scan_sees_flags():
    lines = _command_lines("```\nvit-fast bench m --out d \\\n    --tune   # tuned\n```\nand `vit-fast serve --x`")
    assert lines == ["vit-fast bench m --out d --tune", "vit-fast serve --x"]
    shown = [line for path in DOCUMENTS for line in _command_lines(path.read_text(encoding="utf-8"))]
    assert len(shown) > 30 and any("--tune" in line for line in shown)


def _wrong_flags(text: str) -> list[str]:
    parsers = _parsers()
    wrong = []
    for line in _command_lines(text):
        words = line.split()[1:]
        command: tuple[str, ...] = ()
        while words and (*command, words[0]) in parsers:
            command, words = (*command, words[0]), words[1:]
        options = set(parsers[command]._option_string_actions)
        for word in words:
            flag = re.match(r"^(--?[A-Za-z][\w-]*)", word)
            if flag and flag.group(1) not in options:
                wrong.append(f"`{line}`: vit-fast {' '.join(command)} has no {flag.group(1)}")
    return wrong


def test_the_flag_check_sees_a_wrong_flag():
    assert _wrong_flags("```\nvit-fast serve default --tunes --json -\n```") == [
        "`vit-fast serve default --tunes --json -`: vit-fast serve has no --tunes"
    ]
    assert _wrong_flags("`vit-fast export onnx m --out m.onnx --opset 18`") == []
    assert _wrong_flags("`vit-fast export tensorrt m.onnx --opset 18`") != []


@pytest.mark.parametrize("path", DOCUMENTS, ids=_name)
def test_every_flag_shown_is_the_commands(path):
    wrong = _wrong_flags(path.read_text(encoding="utf-8"))
    assert not wrong, f"{_name(path)}: check it against vit-fast <command> --help:\n" + "\n".join(wrong)


#: a docstring's pointer into docs/: ``docs/NAME.md, section "Heading"`` (or ``sections "A" and "B"``, or the heading
#: unquoted after ``section``), read from the docstring with its line breaks joined
POINTER = re.compile(r'docs/(\w+\.md),?\s+(?:sections?\s+)?((?:"[^"]+"(?:,\s*|\s+and\s+)?)+)')
UNQUOTED = re.compile(r"docs/(\w+\.md),?\s+section\s+(?!\")([^.;)]+)")


def _docstrings() -> list[tuple[str, str]]:
    """(where, docstring with whitespace runs joined) for every module, class and function under vit_fast/, kernels/
    and export/."""
    found = []
    for folder in ("vit_fast", "kernels", "export"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node, clean=False)
                    if doc:
                        found.append((f"{_name(path)}:{getattr(node, 'name', 'module')}", " ".join(doc.split())))
    return found


def _headings(name: str) -> list[str]:
    text = (ROOT / "docs" / name).read_text(encoding="utf-8")
    return [" ".join(line.lstrip("#").replace("`", "").split()) for line in text.splitlines() if line.startswith("#")]


def pointer_problems(docstrings: list[tuple[str, str]]) -> list[str]:
    """Each pointer whose page is missing or whose section is no heading of it (a quoted name is the heading, or
    the start of one; an unquoted one runs to the sentence's end, a heading or the start of one)."""
    problems = []
    for where, doc in docstrings:
        named = [
            (m.group(1), quoted, True) for m in POINTER.finditer(doc) for quoted in re.findall(r'"([^"]+)"', m.group(2))
        ]
        named += [(m.group(1), m.group(2), False) for m in UNQUOTED.finditer(doc)]
        for page, section, quoted in named:
            if not (ROOT / "docs" / page).is_file():
                problems.append(f"{where}: docs/{page} does not exist")
                continue
            section = " ".join(section.replace("`", "").split())
            heads = _headings(page)
            if quoted and not any(h.startswith(section) for h in heads):
                problems.append(f'{where}: docs/{page} has no section "{section}"')
            elif not quoted and not any(section.startswith(h) or h.startswith(section) for h in heads):
                problems.append(f"{where}: docs/{page} has no section starting {section!r}")
    return problems


def test_the_pointer_check_sees_a_wrong_section():
    docs = [("a", 'See docs/usage.md, section "No such heading".'), ("b", "See docs/kernels.md, section Nowhere.")]
    docs += [("c", 'docs/nothing.md, "x"'), ("d", 'docs/usage.md, section "Which backend runs".')]
    assert [p.split(":")[0] for p in pointer_problems(docs)] == ["a", "b", "c"]


def test_every_docstring_pointer_names_a_heading():
    docstrings = _docstrings()
    assert sum("docs/" in doc for _, doc in docstrings) > 50  # the scan reads the docstrings it should
    problems = pointer_problems(docstrings)
    assert not problems, "\n".join(problems)
