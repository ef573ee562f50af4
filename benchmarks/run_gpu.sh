#!/usr/bin/env bash
# The GPU machine's one command: preflight.txt first, vit-fast installed offline (or mapped onto PYTHONPATH), then
# benchmarks/gpu_evidence.py (every phase, each in a process of its own) under a timeout, then the end of its
# summary; all of it within EVIDENCE_SECONDS (570) of wall time from this script's start. Arguments go to the
# script (a later one wins over the defaults here).
#
#   bash benchmarks/run_gpu.sh             # the evidence run: every phase, budget 540 s less the install's seconds
#   bash benchmarks/run_gpu.sh --dry-run   # the plan with estimated seconds (any machine; nothing is written)
#
# $OUT (the device tool's output folder; default ./evidence-out) receives preflight.txt, results.json, summary.md,
# kernels.csv, perf.csv and run.log; results.json and run.log are also kept in $EVIDENCE_KEEP (default
# /tmp/vit-fast-evidence).
# Environment: PYTHON (python3), EVIDENCE_SECONDS (570: the wall time of this whole command), VIT_FAST_COMMIT (the
# commit sent, recorded where the copy is not vit-fast's own git checkout), EVIDENCE_INSTALL (auto; map: skip pip
# and map the checkout onto PYTHONPATH, the fallback, as the CPU test of this script exercises it).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
case "$PY" in /*) ;; */*) PY="$PWD/$PY" ;; esac # a relative path must survive the checks' cd
OUT=${OUT:-$PWD/evidence-out}
KEEP=${EVIDENCE_KEEP:-/tmp/vit-fast-evidence}
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET # compiled kernels here, never the interpreter

for arg in "$@"; do
    if [ "$arg" = "--dry-run" ] || [ "$arg" = "-h" ] || [ "$arg" = "--help" ]; then
        PYTHONPATH=${PYTHONPATH:-} exec "$PY" benchmarks/gpu_evidence.py "$@"
    fi
done
mkdir -p "$OUT" "$KEEP" || exit 1
# the commit: VIT_FAST_COMMIT, else this checkout's own git (never a repository this copy merely lies inside)
top=$(git rev-parse --show-toplevel 2>/dev/null || true)
if [ -n "${VIT_FAST_COMMIT:-}" ]; then
    commit=$VIT_FAST_COMMIT
elif [ -n "$top" ] && [ "$(cd "$top" && pwd -P)" = "$(pwd -P)" ]; then
    commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
else
    commit="unknown (not vit-fast's own git checkout; set VIT_FAST_COMMIT)"
fi

# what the machine has, written before anything can fail
{
    echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $commit"
    echo "== nvidia-smi"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.sm,power.limit --format=csv 2>&1
    echo "== python: $(command -v "$PY")"
    "$PY" -VV 2>&1
    echo "== C compiler"
    { ${CC:-gcc} --version 2>&1 || echo "no ${CC:-gcc}"; } | head -n 1
    echo "== Python.h"
    inc=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])" 2>&1)
    if [ -f "$inc/Python.h" ]; then echo "$inc/Python.h"; else echo "missing in $inc"; fi
    echo "== libcuda (ldconfig -p)"
    # libcuda.so itself: libcudart, libcudadevrt and the like are not the driver
    { ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>&1; } | grep -E '^[[:space:]]*libcuda\.so' \
        || echo "no libcuda in the linker cache"
    echo "== packages"
    "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|triton|numpy|timm|transformers|onnx|onnxruntime|safetensors|pytest|setuptools) '
} > "$OUT/preflight.txt" 2>&1

# vit-fast: installed already, else offline in editable mode, else kernels/ and export/ mapped into a copy of vit_fast
install=${EVIDENCE_INSTALL:-auto}
imports() { (cd / && "$PY" -c "import vit_fast.kernels, vit_fast.export") > /dev/null 2>&1; }  # not ./vit_fast
if [ "$install" = auto ] && imports; then
    echo "install: vit_fast.kernels and vit_fast.export import as they are" >> "$OUT/preflight.txt"
elif [ "$install" = auto ] && "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . >> "$OUT/preflight.txt" 2>&1 \
    && imports; then
    echo "install: pip install --no-index --no-deps --no-build-isolation -e ." >> "$OUT/preflight.txt"
else
    map=$(mktemp -d /tmp/vit-fast-path.XXXXXX)
    cp -r vit_fast "$map/" && ln -s "$PWD/kernels" "$map/vit_fast/kernels" && ln -s "$PWD/export" "$map/vit_fast/export"
    export PYTHONPATH="$map${PYTHONPATH:+:$PYTHONPATH}"
    echo "install: ${install}: PYTHONPATH=$map, a copy of vit_fast with kernels/ and export/ linked in" \
        >> "$OUT/preflight.txt"
fi
(cd / && "$PY" -c "import vit_fast, vit_fast.kernels; print('vit_fast', vit_fast.__version__, 'from', vit_fast.__file__)") \
    >> "$OUT/preflight.txt" 2>&1

# the script's budget: what the wall time leaves after the install, less 30 s for its last save and this summary;
# the timeout (the wall time left, less 10 s for this summary) is its last resort: the script's own watchdog ends a
# hung phase first
total=${EVIDENCE_SECONDS:-570}
budget=$((total - SECONDS - 30))
[ "$budget" -gt 540 ] && budget=540
[ "$budget" -lt 10 ] && budget=10
echo "budget: ${budget} s for gpu_evidence.py (${SECONDS} s used by the preflight and install)" >> "$OUT/preflight.txt"
timeout --signal=TERM --kill-after=10 $((total - SECONDS - 10)) \
    "$PY" benchmarks/gpu_evidence.py --out "$OUT" --budget "$budget" "$@"
rc=$?
for f in results.json run.log; do
    [ -f "$OUT/$f" ] && cp -f "$OUT/$f" "$KEEP/$f"
done
echo "== gpu_evidence.py exited $rc; from $OUT/summary.md (phases, targets, speed):"
awk '/^## Phases/ {p = 1} /^## (Launches|Kernels)/ {p = 0} p' "$OUT/summary.md" 2>/dev/null || echo "(no summary.md)"
exit "$rc"
