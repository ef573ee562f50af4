"""One output policy: no module of the package writes a file except through vit_fast/util/files.

An AST scan of every module (kernels/, vit_fast/, export/, benchmarks/) for the ways Python opens a path for
writing, moves a file into place or makes folders on the way to one: ``open(..., "w"/"a"/"x"/"+")``, ``os.open``
with a write flag, ``Path.write_text`` / ``write_bytes`` / ``rename``, ``torch.save`` / ``json.dump`` /
``np.save`` / safetensors' ``save_file`` to a path, ``shutil.copy*`` / ``move``, ``os.replace`` / ``os.rename`` /
``os.link`` / ``os.symlink``, ``os.makedirs`` / ``mkdir(parents=True)`` (a dangling link on the way fails there
as "[Errno 17] File exists"; files.make_folders names it), ``onnx.save*``, ``torch.onnx.export``. Only
vit_fast.util.files may do these, so every write meets its claim at publish; the few third-party writers that need a
path name (the ONNX exporters, which write into a staging folder that vit_fast.util.files made) are listed below with
why, so a new one fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = [ROOT / "kernels", ROOT / "vit_fast", ROOT / "export", ROOT / "benchmarks"]
HOME = ROOT / "vit_fast" / "util" / "files"

WRITE_ATTRS = {"write_text", "write_bytes", "rename"}
WRITE_CALLS = {
    ("torch", "save"),
    ("json", "dump"),
    ("np", "save"),
    ("numpy", "save"),
    ("shutil", "copy"),
    ("shutil", "copy2"),
    ("shutil", "copyfile"),
    ("shutil", "copytree"),
    ("shutil", "move"),
    ("os", "replace"),
    ("os", "rename"),
    ("os", "link"),
    ("os", "symlink"),
    ("os", "makedirs"),
    ("onnx", "save"),
    ("onnx", "save_model"),
    ("onnx", "export"),  # torch.onnx.export
}
WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"}

#: (file, function, call): third-party writers that take only a path, each writing into a staging folder
#: made by vit_fast.util.files.staging_dir (exclusive, marked, locked) and published through files.publish_to
ALLOWED = {
    (
        "export/onnx.py",
        "_run_exporter",
        "onnx.export",
    ): "torch.onnx.export writes the traced graph into the staging folder",
    ("export/onnx_checks.py", "write_metadata", "onnx.save_model"): "onnx rewrites the staged file's props in place",
    ("export/onnx_checks.py", "save_graph", "onnx.save_model"): "onnx writes the checked graph (and .data) staged",
    ("export/onnx_native.py", "_trace", "onnx.export"): "torch.onnx.export writes a native tower's graph staged",
}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def _mode(call: ast.Call) -> str | None:
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    return mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else None


def _finding(call: ast.Call, safe: set[str] = frozenset()) -> str | None:
    """What ``call`` writes, or None. ``safe``: names bound by ``with files.open_new(...) as NAME`` (a file
    created exclusively by vit_fast.util.files), which torch.save / json.dump may write into."""
    func = call.func
    if isinstance(func, ast.Name) and func.id == "save_file":  # safetensors' writer to a path
        return "save_file(...)"
    if (
        isinstance(func, ast.Attribute)
        and func.attr == "mkdir"
        and any(
            k.arg == "parents" and not (isinstance(k.value, ast.Constant) and k.value.value is False)
            for k in call.keywords
        )
    ):
        return ".mkdir(parents=True)"
    if isinstance(func, ast.Name) and func.id == "open":
        mode = _mode(call)
        if mode is None and (len(call.args) > 1 or any(k.arg == "mode" for k in call.keywords)):
            return "open(..., <computed mode>)"
        if mode is not None and set(mode) & set("wax+"):
            return f"open(..., {mode!r})"
        return None
    if not isinstance(func, ast.Attribute):
        return None
    name = _dotted(func)
    if name == "os.open":
        flags = {n.attr for n in ast.walk(call) if isinstance(n, ast.Attribute)} | {
            n.id for n in ast.walk(call) if isinstance(n, ast.Name)
        }
        return "os.open(<write flags>)" if flags & WRITE_FLAGS else None
    parts = name.split(".")
    if name in ("torch.save", "json.dump") and len(call.args) > 1 and _dotted(call.args[1]) in safe:
        return None
    if len(parts) >= 2 and (parts[-2], parts[-1]) in WRITE_CALLS:
        return ".".join(parts[-2:])
    if func.attr in WRITE_ATTRS and name not in {"str.replace"}:
        return f".{func.attr}()"
    return None


def _findings(path: Path) -> list[tuple[str, str, str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = path.relative_to(ROOT).as_posix()
    out = []
    safe = {
        item.optional_vars.id
        for node in ast.walk(tree)
        if isinstance(node, ast.With)
        for item in node.items
        if isinstance(item.context_expr, ast.Call)
        and _dotted(item.context_expr.func).endswith("open_new")
        and isinstance(item.optional_vars, ast.Name)
    }

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call):
                what = _finding(child, safe)
                if what is not None:
                    out.append((rel, function, what, child.lineno))
            visit(child, name)

    visit(tree, "<module>")
    return out


def scan() -> list[tuple[str, str, str, int]]:
    found = []
    for folder in PACKAGE:
        for path in sorted(folder.rglob("*.py")):
            if HOME not in path.parents:
                found += _findings(path)
    return found


def test_no_module_writes_a_file_outside_files_py():
    stray = [f for f in scan() if f[:3] not in ALLOWED]
    assert not stray, (
        "write through vit_fast/util/files (write_atomic, staging_dir + write_new, open_new):\n"
        + "\n".join(f"{rel}:{line} in {function}(): {what}" for rel, function, what, line in stray)
    )


def test_the_allowed_writers_still_exist():
    """An entry that no longer matches anything is stale: remove it, so the list stays the truth."""
    seen = {f[:3] for f in scan()}
    assert set(ALLOWED) <= seen, set(ALLOWED) - seen


def test_the_scan_finds_what_it_looks_for(tmp_path):
    """The scan itself can fail: each pattern it claims to catch is caught in a sample module."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import json, os, shutil, torch\n"
        "def f(p, d):\n"
        "    open(p, 'w'); open(p, mode='ab'); open(p, 'x'); open(p, 'r+')\n"
        "    p.write_text('x'); p.write_bytes(b'x'); p.rename('q')\n"
        "    torch.save(d, p); json.dump(d, open(p)); shutil.copyfile(p, 'q'); shutil.move(p, 'q')\n"
        "    os.replace(p, 'q'); os.rename(p, 'q'); os.open(p, os.O_WRONLY | os.O_CREAT)\n"
        "    os.link(p, 'q'); os.symlink(p, 'q'); os.makedirs(p); p.mkdir(parents=True); save_file(d, p)\n"
        "    p.mkdir(); p.mkdir(parents=False)\n"
        "    open(p); open(p, 'rb'); 'a'.replace('a', 'b'); os.open(p, os.O_RDONLY)\n"
        "    with files.open_new(p) as f:\n"
        "        torch.save(d, f)\n"
    )
    found = [what for _, _, what, _ in _findings_at(sample)]
    assert len(found) == 19, found


def _findings_at(path: Path) -> list[tuple[str, str, str, int]]:
    global ROOT
    saved, ROOT = ROOT, path.parent
    try:
        return _findings(path)
    finally:
        ROOT = saved
