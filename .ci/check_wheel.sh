#!/usr/bin/env bash
# Build the wheel with `pip wheel .`, check what it ships, install it into a fresh venv and import
# vit_fast.kernels and vit_fast.export from it (never from the source tree); then install it as the README tells a
# user to, into a fresh venv that already has its torch: pip must keep that torch, and `vit-fast info` must run.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
# the user's torch and the triton beside it. torch==2.13.0 is the CPU build on this machine's disk: an unpinned torch
# would pull gigabytes of CUDA packages. triton 3.6.0 is the oldest the kernels support (the GPU machines' pair)
BESIDE_TORCH=${BESIDE_TORCH:-torch==2.13.0}
BESIDE_TRITON=${BESIDE_TRITON:-triton==3.6.0}
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
# the license: Apache-2.0 as an SPDX expression (PEP 639), the LICENSE file beside the metadata
info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
assert f"{info}/licenses/LICENSE" in names, "LICENSE missing from the wheel"
metadata = zipfile.ZipFile(sys.argv[1]).read(f"{info}/METADATA").decode()
assert "License-Expression: Apache-2.0" in metadata.splitlines(), "METADATA has no License-Expression: Apache-2.0"
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

# the README's install beside your torch: a fresh venv with the torch pair first, then the wheel with its onnx extra,
# pip resolving every dependency (no bytecode compiled: for torch's files that is most of the time)
user=$work/user-venv
start=$(date +%s)
python3 -m venv "$user"
"$user/bin/python" -m pip install --quiet --no-compile "$BESIDE_TORCH" "$BESIDE_TRITON"
pair() {  # name, version and RECORD's mtime (pip rewrites it whenever it installs the package) of torch and triton
    "$user/bin/python" - <<'PY'
import importlib.metadata as m
for name in ("torch", "triton"):
    dist = m.distribution(name)
    record = next(f for f in dist.files if f.name == "RECORD" and f.parent.name.endswith(".dist-info"))
    print(name, dist.version, record.locate().stat().st_mtime_ns)
PY
}
before=$(pair)
(cd "$work" && "$user/bin/python" -m pip install --no-compile "$wheel[onnx]") > "$work/install.log" 2>&1 \
    || { cat "$work/install.log"; echo "installing the wheel beside $BESIDE_TORCH failed"; exit 1; }
after=$(pair)
if [ "$before" != "$after" ] || grep -qiE "uninstalling (torch|triton)-" "$work/install.log"; then
    grep -iE "torch|triton" "$work/install.log" || true
    printf 'pip replaced the torch or triton it found:\nbefore:\n%s\nafter:\n%s\n' "$before" "$after"
    exit 1
fi
if "$user/bin/python" -m pip list 2>/dev/null | grep -iE "^nvidia-"; then
    echo "installing the wheel pulled CUDA packages (above)"
    exit 1
fi
grep -E "^Successfully installed" "$work/install.log"
# vit-fast info as the user runs it (exit 0), then its JSON: the kept torch and triton, ONNX Runtime usable
cd "$work"
"$user/bin/vit-fast" info > info.txt || { cat info.txt; echo "vit-fast info failed beside $BESIDE_TORCH"; exit 1; }
"$user/bin/vit-fast" info --json info.json > /dev/null
BEFORE=$before "$user/bin/python" - <<'PY'
import json, os
info = json.load(open("info.json"))
kept = dict(line.split()[:2] for line in os.environ["BEFORE"].splitlines())
seen = {name: info[name] for name in kept}
assert seen == kept, f"vit-fast info reports {seen}, the venv had {kept}"
assert info["backends"]["onnxruntime"].startswith("yes"), info["backends"]["onnxruntime"]
print("vit-fast info:", ", ".join(f"{k} {v}" for k, v in seen.items()), "| onnxruntime", info["onnxruntime"])
PY
echo "installed beside $BESIDE_TORCH $BESIDE_TRITON, both kept, with the onnx extra ($(( $(date +%s) - start )) s)"
echo "wheel check passed"
