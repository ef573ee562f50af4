"""A newcomer can read every module: no file under vit_fast/, kernels/ or export/ is over 500 lines, and no docstring
(module, class or function) is over five lines (what it needs more for goes into docs/). Plain file reading."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("vit_fast", "kernels", "export")
MAX_LINES = 500
MAX_DOCSTRING_LINES = 5


#: CLI subcommands whose module docstring is their ``--help`` text (vit_fast/cli/__init__.py passes
#: ``module.__doc__`` to argparse as the description): exempt from the docstring rule only.
SUBCOMMANDS = ("bench", "demo", "doctor", "export", "info", "predict", "serve", "tritonserver", "verify")
HELP_TEXT = {f"vit_fast/cli/{name}.py" for name in SUBCOMMANDS}


def _files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def line_count(source: str) -> int:
    return len(source.splitlines())


def docstring_lines(source: str) -> int:
    """Lines of the module docstring as written (0 without one), blank lines inside it included."""
    doc = ast.get_docstring(ast.parse(source), clean=False)
    return len(doc.strip("\n").splitlines()) if doc else 0


FILES = {_name(p): p.read_text(encoding="utf-8") for p in _files()}


def _too_long(name: str) -> bool:
    return line_count(FILES[name]) > MAX_LINES


def _long_docstring(name: str) -> bool:
    return docstring_lines(FILES[name]) > MAX_DOCSTRING_LINES


def test_the_counts_see_what_they_look_for():
    assert line_count("a\n" * 501) == 501 and line_count("a\n" * 500) == 500
    assert docstring_lines('"""one\n\nthree\nfour\nfive\nsix"""\nx = 1\n') == 6
    assert docstring_lines('"""one\ntwo\nthree\nfour\nfive"""\n') == 5
    assert docstring_lines("x = 1\n") == 0 and "vit_fast/model/config.py" in FILES and "kernels/linear.py" in FILES


def test_no_file_is_over_500_lines():
    found = [f"{n}: {line_count(s)} lines" for n, s in FILES.items() if _too_long(n)]
    assert not found, f"split these by a real seam (one job per file) to at most {MAX_LINES} lines:\n" + "\n".join(
        found
    )


def test_no_module_docstring_is_over_five_lines():
    found = [f"{n}: {docstring_lines(s)} lines" for n, s in FILES.items() if n not in HELP_TEXT and _long_docstring(n)]
    assert not found, (
        f"a module docstring says what the module holds in at most {MAX_DOCSTRING_LINES} lines; move measurements "
        "and long explanations into docs/ and link them:\n" + "\n".join(found)
    )


def test_help_text_exemptions_name_files_that_exist():
    assert HELP_TEXT <= set(FILES), sorted(HELP_TEXT - set(FILES))


def long_definition_docstrings(source: str) -> list[str]:
    """``name (N lines)`` for each class or function whose docstring, as written, is over five lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            lines = len(doc.strip("\n").splitlines()) if doc else 0
            if lines > MAX_DOCSTRING_LINES:
                found.append(f"{node.name} ({lines} lines)")
    return found


def test_the_definition_scan_sees_a_long_docstring():
    source = 'class A:\n    def f(self):\n        """1\n2\n3\n4\n5\n6"""\n\n\ndef g():\n    """1\n2\n3\n4\n5"""\n'
    assert long_definition_docstrings(source) == ["f (6 lines)"]


def test_no_class_or_function_docstring_is_over_five_lines():
    found = [f"{n}: {', '.join(long)}" for n, s in FILES.items() if (long := long_definition_docstrings(s))]
    assert not found, (
        f"a docstring says what a caller needs in at most {MAX_DOCSTRING_LINES} lines; move measurements and long "
        "explanations into docs/ and point to the section:\n" + "\n".join(found)
    )
