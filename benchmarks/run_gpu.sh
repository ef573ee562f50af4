#!/usr/bin/env bash
# The GPU machine's command: preflight.txt first, vit-fast installed offline (or mapped onto PYTHONPATH), then
# benchmarks/gpu_evidence.py under a timeout, then the end of its summary. Arguments go to the script (a later
# one wins over the defaults here).
#
#   bash benchmarks/run_gpu.sh          # the evidence run: phases env kernels model tma perf, budget 470 s
#   bash benchmarks/run_gpu.sh --phases compile,tuned --budget 220 --resume /tmp/vit-fast-evidence/results.json
#                                       # the follow-up, sent while the machine is still warm
#   bash benchmarks/run_gpu.sh --dry-run   # the plan with estimated seconds (any machine; nothing is written)
#
# $OUT (the device tool's output folder; default ./evidence-out) receives preflight.txt, results.json, summary.md,
# kernels.csv, perf.csv and run.log; results.json and run.log are also kept in $EVIDENCE_KEEP (default
# /tmp/vit-fast-evidence) for a follow-up's --resume, since the device tool empties $OUT before each command.
# Environment: PYTHON (python3), TIMEOUT (490: seconds the script may run), VIT_FAST_COMMIT (the commit sent,
# recorded where the copy has no .git), EVIDENCE_INSTALL (auto; map: skip pip and map the checkout onto PYTHONPATH,
# the fallback, as the CPU test of this script exercises it).
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
commit=${VIT_FAST_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo "unknown (no .git in this copy; set VIT_FAST_COMMIT)")}
export VIT_FAST_COMMIT=$commit

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
    { ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>&1; } | grep libcuda || echo "no libcuda in the linker cache"
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

timeout --signal=TERM --kill-after=15 "${TIMEOUT:-490}" "$PY" benchmarks/gpu_evidence.py --out "$OUT" --budget 470 "$@"
rc=$?
for f in results.json run.log; do
    [ -f "$OUT/$f" ] && cp -f "$OUT/$f" "$KEEP/$f"
done
echo "== gpu_evidence.py exited $rc; from $OUT/summary.md (phases, targets, speed):"
awk '/^## Phases/ {p = 1} /^## (Launches|Kernels)/ {p = 0} p' "$OUT/summary.md" 2>/dev/null || echo "(no summary.md)"
exit "$rc"
