#!/usr/bin/env bash
# Build the wheel with `pip wheel .`, check what it ships, install it into a fresh venv and import
# vit_fast.kernels and vit_fast.export from it (never from the source tree).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$VENV/bin/python" -m pip wheel --quiet --no-deps --no-build-isolation -w "$work/dist" .
wheel=$(ls "$work"/dist/vit_fast-*.whl)
echo "built $(basename "$wheel")"

# the wheel ships vit_fast/kernels and vit_fast/export, and no top-level kernels/ or export/ package
"$VENV/bin/python" - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
tops = sorted({n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")})
assert tops == ["vit_fast"], f"unexpected top-level entries in the wheel: {tops}"
for need in ("vit_fast/kernels/__init__.py", "vit_fast/export/__init__.py", "vit_fast/cli/__init__.py"):
    assert need in names, f"{need} missing from the wheel"
print("wheel contents ok:", len(names), "files")
PY

# a fresh venv with the wheel alone; its dependencies come from the dev venv's site-packages through
# a .pth file (a .pth inside that folder, such as the editable install's, is not processed from there)
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --no-deps --no-index "$wheel"
dev_site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
fresh_site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$dev_site" > "$fresh_site/zz_dev_deps.pth"
cd "$work"
FRESH_SITE=$fresh_site "$work/venv/bin/python" - <<'PY'
import importlib.util, os, vit_fast, vit_fast.kernels, vit_fast.export
for mod in (vit_fast, vit_fast.kernels, vit_fast.export):
    assert mod.__file__.startswith(os.environ["FRESH_SITE"]), f"{mod.__name__} imported from {mod.__file__}"
for name in ("kernels", "export"):
    assert importlib.util.find_spec(name) is None, f"a top-level {name!r} package is importable"
print("imported from the wheel:", vit_fast.__version__, vit_fast.kernels.__file__)
PY
"$work/venv/bin/vit-fast" --version
echo "wheel check passed"
