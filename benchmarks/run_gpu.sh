#!/usr/bin/env bash
# One script for a GPU machine: the compiled test suite, the kernel benchmarks and the model
# benchmarks, with device name, driver, versions and commit recorded beside the results.
#
#   benchmarks/run_gpu.sh                 # every stage
#   benchmarks/run_gpu.sh tests kernels   # some stages: tests, kernels, bench
#
# Results go to benchmarks/results/<device>/ (one folder per GPU model). When $OUT is set (the
# device tool's output folder) they are also packed into $OUT/results-<device>.tar.gz, with
# $OUT/summary-<device>.md beside it, since only a few files come back from $OUT.
#
# Environment (all optional):
#   MODELS      presets to bench        (default: ViT-S/16, ViT-B/16, ViT-L/16 at 224)
#   DTYPES      default bf16,fp16       BATCHES   default 1,8,64,256
#   BACKENDS    default all             BENCH_ARGS  extra vit-fast bench flags (default: --graph --h2d)
#   ITERS       default 100             MAX_SECONDS per case, default 2
#   VIT_FAST_COMMIT  the commit to record where the copy has no .git folder
#   PYTHON      default python3
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET  # the kernels run compiled here, never in the interpreter

PY=${PYTHON:-python3}
MODELS=${MODELS:-vit_small_patch16_224 vit_base_patch16_224 vit_large_patch16_224}
DTYPES=${DTYPES:-bf16,fp16}
BATCHES=${BATCHES:-1,8,64,256}
BACKENDS=${BACKENDS:-all}
BENCH_ARGS=${BENCH_ARGS:---graph --h2d}
ITERS=${ITERS:-100}
MAX_SECONDS=${MAX_SECONDS:-2}

if [ "$#" -eq 0 ]; then
    set -- all
fi
STAGES=("$@")
want() {
    local stage
    for stage in "${STAGES[@]}"; do
        if [ "$stage" = all ] || [ "$stage" = "$1" ]; then
            return 0
        fi
    done
    return 1
}

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
device=$(printf '%s' "${gpu:-unknown-gpu}" | tr '[:upper:]' '[:lower:]' | tr -cs 'a-z0-9' '-' | sed 's/^-*//; s/-*$//')
results="benchmarks/results/${device}"
mkdir -p "$results"
echo "device: ${gpu:-none found}  ->  $results"

if [ -z "${VIT_FAST_COMMIT:-}" ]; then
    VIT_FAST_COMMIT=$(git rev-parse HEAD 2>/dev/null || echo "unknown (no .git in this copy; set VIT_FAST_COMMIT)")
fi
export VIT_FAST_COMMIT

if ! "$PY" -c "import vit_fast.kernels, vit_fast.export" 2>/dev/null; then
    "$PY" -m pip install -q --no-deps --no-build-isolation -e . \
        || "$PY" -m pip install -q --no-deps --no-build-isolation . \
        || { echo "could not install vit-fast" >&2; exit 1; }
fi

{
    echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $VIT_FAST_COMMIT"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
    "$PY" -m vit_fast info 2>&1
} > "$results/environment.txt"
cat "$results/environment.txt"

status=0
if want tests; then
    echo "== compiled test suite (pytest tests -m 'not slow')"
    "$PY" -m pytest tests -m "not slow" -q -p no:cacheprovider 2>&1 | tee "$results/tests.log"
    rc=${PIPESTATUS[0]}
    echo "tests exit code: $rc" | tee -a "$results/tests.log"
    [ "$rc" -eq 0 ] || status=1
fi

if want kernels; then
    echo "== kernel benchmarks"
    "$PY" -m pytest benchmarks/bench_kernels.py --benchmark-only -q -p no:cacheprovider \
        --benchmark-json="$results/kernels.json" --benchmark-columns=min,median,iqr,ops 2>&1 \
        | tee "$results/kernels.log"
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || status=1
fi

if want bench; then
    for model in $MODELS; do
        echo "== vit-fast bench $model"
        # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
        "$PY" -m vit_fast bench "$model" --batch "$BATCHES" --dtype "$DTYPES" --backends "$BACKENDS" \
            --iters "$ITERS" --max-seconds "$MAX_SECONDS" --out "$results" $BENCH_ARGS \
            2>&1 | tee "$results/bench_${model}.log"
        rc=${PIPESTATUS[0]}
        [ "$rc" -eq 0 ] || status=1
    done
fi

if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    tar -czf "$OUT/results-${device}.tar.gz" -C benchmarks/results "$device"
    {
        cat "$results/environment.txt"
        for md in "$results"/bench_*.md; do
            [ -e "$md" ] && { echo; cat "$md"; }
        done
        [ -e "$results/tests.log" ] && { echo; echo '## tests'; tail -n 30 "$results/tests.log"; }
    } > "$OUT/summary-${device}.md"
    echo "packed into $OUT/results-${device}.tar.gz and $OUT/summary-${device}.md"
fi
exit "$status"
