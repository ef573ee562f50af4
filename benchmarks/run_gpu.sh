#!/usr/bin/env bash
# The GPU session script, in stages that each finish in under 9 minutes and save their results as
# they end (a stage killed at its limit leaves its log and everything earlier stages wrote).
#
#   benchmarks/run_gpu.sh --dry-run             # print the stages and their commands (any machine)
#   benchmarks/run_gpu.sh                       # the default plan: env doctor tests-kernels tests-rest kernels b16
#   benchmarks/run_gpu.sh tests-kernels b16     # some stages, in the order given
#
# Stages (minutes are the budget each is held to by `timeout`, STAGE_SECONDS, default 530 s):
#   env            environment.txt: device, driver, versions, commit                           < 1
#   doctor         vit-fast doctor on ViT-B/16: every kernel vs float64, model, graph, timing  ~ 2
#   host           host µs per forward and launches (Triton's driver stubbed; no GPU work)     ~ 1
#   tests-kernels  compiled kernel + triton-backend + graph tests, VIT_FAST_AUTOTUNE=0          ~ 5
#   tests-rest     the rest of the compiled suite (-m "not slow"), VIT_FAST_AUTOTUNE=0          ~ 6
#   kernels        benchmarks/bench_kernels.py (autotuned; tuned configs kept in TRITON_CACHE_DIR) ~ 6
#   b16            vit-fast bench ViT-B/16, batch 1 and 256, bf16, LayerNorm fused              ~ 5
#   b16-unfused    the same with VIT_FAST_FUSE_LN=0 (7 launches per block), to compare          ~ 5
#   b16-notma      triton at batch 64 and 256 with VIT_FAST_TMA=0 (no persistent TMA GEMMs)     ~ 4
#   models         ViT-S/B/L at batches 1,8,64,256 (beyond the 25-minute plan)                  ~ 9
#
# Results go to benchmarks/results/<device>/<stage>.log (+ JSON/markdown from the benches). When
# $OUT is set (the device tool's output folder) they are packed into $OUT/results-<device>.tar.gz
# and $OUT/summary-<device>.md after EVERY stage, so a later stage killed by the session's limit
# loses nothing already done.
#
# Environment (all optional):
#   STAGE_SECONDS   limit per stage (default 530)     PYTHON  default python3
#   DTYPES (models stage, default bf16,fp16)          BACKENDS (default torch,triton,triton-graph,compile)
#   VIT_FAST_COMMIT the commit to record where the copy has no .git folder
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET  # the kernels run compiled here, never in the interpreter
export TRITON_DEFAULT_FP_FUSION=1

PY=${PYTHON:-python3}
STAGE_SECONDS=${STAGE_SECONDS:-530}
DTYPES=${DTYPES:-bf16,fp16}
BACKENDS=${BACKENDS:-torch,triton,triton-graph,compile}
DEFAULT_STAGES=(env doctor tests-kernels tests-rest kernels b16)
KERNEL_TESTS="tests/test_kernel_attention.py tests/test_kernel_layer_norm.py tests/test_kernel_linear.py \
tests/test_kernel_layer_norm_linear.py tests/test_kernel_patch_embed.py tests/test_kernel_opcheck.py \
tests/test_triton_backend.py tests/test_graphs.py tests/test_autotune_mode.py"

dry_run=0
stages=()
for arg in "$@"; do
    case "$arg" in
        --dry-run) dry_run=1 ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) stages+=("$arg") ;;
    esac
done
[ "${#stages[@]}" -eq 0 ] && stages=("${DEFAULT_STAGES[@]}")

# the command of each stage; "$R" is the results folder
stage_command() {
    case "$1" in
        env) echo "{ date -u +date_utc:%Y-%m-%dT%H:%M:%SZ; echo commit: \$VIT_FAST_COMMIT; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; $PY -m vit_fast info; } > \$R/environment.txt 2>&1; cat \$R/environment.txt" ;;
        doctor) echo "$PY -m vit_fast doctor --model vit_base_patch16_224 --out \$R/doctor --json \$R/doctor.json" ;;
        host) echo "$PY benchmarks/host_overhead.py --json \$R/host_overhead.json" ;;
        tests-kernels) echo "VIT_FAST_AUTOTUNE=0 $PY -m pytest $KERNEL_TESTS -m 'not slow' -q -p no:cacheprovider --junitxml=\$R/tests-kernels.xml" ;;
        tests-rest) echo "VIT_FAST_AUTOTUNE=0 $PY -m pytest tests -m 'not slow' -q -p no:cacheprovider $(for t in $KERNEL_TESTS; do printf -- '--ignore=%s ' "$t"; done)--junitxml=\$R/tests-rest.xml" ;;
        kernels) echo "$PY -m pytest benchmarks/bench_kernels.py --benchmark-only -q -p no:cacheprovider --benchmark-json=\$R/kernels.json --benchmark-columns=min,median,iqr,ops" ;;
        b16) echo "$PY -m vit_fast bench vit_base_patch16_224 --batch 1,256 --dtype bf16 --backends torch,triton,triton-graph --graph --min-samples 100 --max-samples 200 --min-time 0.5 --max-seconds 2 --out \$R/b16" ;;
        b16-unfused) echo "VIT_FAST_FUSE_LN=0 $PY -m vit_fast bench vit_base_patch16_224 --batch 1,256 --dtype bf16 --backends triton,triton-graph --graph --min-samples 100 --max-samples 200 --min-time 0.5 --max-seconds 2 --out \$R/b16-unfused" ;;
        b16-notma) echo "VIT_FAST_TMA=0 $PY -m vit_fast bench vit_base_patch16_224 --batch 64,256 --dtype bf16 --backends triton,triton-graph --graph --min-samples 100 --max-samples 200 --min-time 0.5 --max-seconds 2 --out \$R/b16-notma" ;;
        models) echo "for m in vit_small_patch16_224 vit_base_patch16_224 vit_large_patch16_224; do $PY -m vit_fast bench \$m --batch 1,8,64,256 --dtype $DTYPES --backends $BACKENDS --graph --min-samples 50 --max-samples 100 --min-time 0.3 --max-seconds 1 --out \$R/models || exit 1; done" ;;
        *) return 1 ;;
    esac
}

for stage in "${stages[@]}"; do
    if ! stage_command "$stage" > /dev/null; then
        echo "run_gpu.sh: unknown stage '$stage'; stages: env doctor host tests-kernels tests-rest kernels b16 b16-unfused b16-notma models" >&2
        exit 2
    fi
done

if [ "$dry_run" -eq 1 ]; then
    echo "stages (each limited to ${STAGE_SECONDS}s; results saved after each):"
    for stage in "${stages[@]}"; do
        printf '%-14s %s\n' "$stage" "$(stage_command "$stage")"
    done
    exit 0
fi

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
device=$(printf '%s' "${gpu:-unknown-gpu}" | tr '[:upper:]' '[:lower:]' | tr -cs 'a-z0-9' '-' | sed 's/^-*//; s/-*$//')
R="benchmarks/results/${device}"
mkdir -p "$R"
export R
echo "device: ${gpu:-none found}  ->  $R"

if [ -z "${VIT_FAST_COMMIT:-}" ]; then
    VIT_FAST_COMMIT=$(git rev-parse HEAD 2>/dev/null || echo "unknown (no .git in this copy; set VIT_FAST_COMMIT)")
fi
export VIT_FAST_COMMIT
# autotuned configs survive between stages (and sessions, if the folder is carried back)
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/benchmarks/results/triton-cache}

if ! "$PY" -c "import vit_fast.kernels, vit_fast.export" 2>/dev/null; then
    "$PY" -m pip install -q --no-deps --no-build-isolation -e . \
        || "$PY" -m pip install -q --no-deps --no-build-isolation . \
        || { echo "could not install vit-fast" >&2; exit 1; }
fi

save() {  # pack what exists now into $OUT: called after every stage
    [ -n "${OUT:-}" ] || return 0
    mkdir -p "$OUT"
    tar -czf "$OUT/results-${device}.tar.gz" -C benchmarks/results "$device"
    {
        cat "$R/environment.txt" 2>/dev/null
        cat "$R/stages.txt" 2>/dev/null
        find "$R" -name '*.md' -print0 | sort -z | xargs -0 -r -I{} sh -c 'echo; cat "{}"'
        for log in "$R"/tests-*.log; do
            [ -e "$log" ] && { echo; echo "## $(basename "$log")"; tail -n 15 "$log"; }
        done
    } > "$OUT/summary-${device}.md"
}

status=0
for stage in "${stages[@]}"; do
    cmd=$(stage_command "$stage")
    echo "== $stage (limit ${STAGE_SECONDS}s): $cmd"
    start=$(date +%s)
    timeout --signal=INT --kill-after=20 "$STAGE_SECONDS" bash -c "$cmd" 2>&1 | tee "$R/$stage.log"
    rc=${PIPESTATUS[0]}
    took=$(( $(date +%s) - start ))
    [ "$rc" -eq 124 ] && note="TIMED OUT" || note="exit $rc"
    echo "stage $stage: $note after ${took}s" | tee -a "$R/stages.txt"
    [ "$rc" -eq 0 ] || status=1
    save
done
exit "$status"
