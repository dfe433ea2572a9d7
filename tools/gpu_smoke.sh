#!/usr/bin/env bash
# tools/gpu_smoke.sh: docs/GPU.md's first steps as one command on ONE GPU, in under 8 minutes.
#
#     bash tools/gpu_smoke.sh [OUT]          (from the repository root; OUT default gpu-smoke/)
#
# Needs no package index: it runs with the first Python that has a CUDA torch, in this order:
# $PYTHON, the repository's .venv, the system python3 with PYTHONPATH=<repo> (a host with its own CUDA
# torch). What it runs, each step under its own timeout within BUDGET_S (450 s):
#   1. host facts (nvidia-smi, NICs) and the Python stack's versions        host.txt, versions.json
#   2. the h100 profile's ddp and fsdp cases at world size 1, built as the plugin builds them
#      (pytest_llmbench.cases.make_spec) and run as a fresh case runs: torchrun -> python -m harness
#                                                                            cases/<name>/{spec,result}.json
#   3. llmbench-plan --time for the same cases, on the planner's part for this GPU   plan.json, plan.txt
#   4. summary.txt/.json: measured beside predicted (step time, MFU, peak memory), NCCL's transport
#   5. time allowing: zero2 at ws1 (if DeepSpeed imports), then the ddp case through pytest itself
# Send back the whole OUT folder (docs/GPU.md, step 7). Without a GPU it says so and exits 3.
set -uo pipefail

START=$(date +%s)
BUDGET_S=${BUDGET_S:-450}
CASE_S=${CASE_S:-170}
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(mkdir -p "${1:-$REPO/gpu-smoke}" && cd "${1:-$REPO/gpu-smoke}" && pwd)
cd "$REPO" || exit 2
mkdir -p "$OUT/cases"
: > "$OUT/steps.log"

elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET_S - $(elapsed) )); }
log() { echo "[t+$(elapsed)s] $*" | tee -a "$OUT/steps.log"; }
no_gpu() { log "gpu_smoke: no usable NVIDIA GPU on this host: $*. Nothing was run; run it on a GPU host (docs/GPU.md)."; exit 3; }

# ---- 1. the host and the Python stack
command -v nvidia-smi >/dev/null || no_gpu "nvidia-smi is not installed"
nvidia-smi -L > "$OUT/gpus.txt" 2>&1 && grep -q "^GPU " "$OUT/gpus.txt" || no_gpu "nvidia-smi lists no GPU ($(head -1 "$OUT/gpus.txt"))"
{
    date -u; nvidia-smi; nvidia-smi topo -m
    nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv
    ip -br link 2>/dev/null || ls /sys/class/net
    env | grep -E '^(NCCL_|CUDA_|PYTHONPATH)' || true
} > "$OUT/host.txt" 2>&1

cuda_python() {  # 0 when "$1" imports a torch that sees a GPU
    "$1" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" > /dev/null 2>&1
}
PY=""
for candidate in "${PYTHON:-}" "$REPO/.venv/bin/python"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ] && cuda_python "$candidate"; then PY=$candidate; break; fi
done
if [ -z "$PY" ] && command -v python3 >/dev/null && cuda_python "$(command -v python3)"; then
    PY=$(command -v python3)
fi
[ -n "$PY" ] || no_gpu "no Python here imports a torch that sees a GPU (\$PYTHON, .venv, python3 tried)"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's harness and plugin, whichever Python
export PYTHONUNBUFFERED=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=${NCCL_DEBUG_SUBSYS:-INIT,NET,ENV}
log "1. python: $PY"
"$PY" "$REPO/tools/gpu_smoke.py" versions > "$OUT/versions.json" 2>> "$OUT/steps.log" \
    || log "   versions.json: failed (steps.log)"

# ---- 2. the cases, fresh, world size 1
run_case() {  # name strategy limit_s
    local dir="$OUT/cases/$1"
    mkdir -p "$dir"
    if ! "$PY" "$REPO/tools/gpu_smoke.py" spec "$2" "$dir/spec.json" >> "$OUT/steps.log" 2>&1; then
        log "   $1: no spec (steps.log)"; return 0
    fi
    local t0
    t0=$(date +%s)
    (cd "$dir" && LLMBENCH_RUN_ID="smoke-$1" timeout -k 10 "$3" "$PY" -m torch.distributed.run --standalone \
        --nproc-per-node=1 -m harness --spec="$dir/spec.json" --out="$dir/result.json" --run-id="smoke-$1" \
        > "$dir/torchrun.log" 2>&1)
    log "   $1: exit $? in $(( $(date +%s) - t0 )) s (limit $3 s)"
}
log "2. h100 profile: ddp and fsdp at ws1"
run_case ddp-ws1 ddp "$CASE_S"
run_case fsdp-ws1 fsdp "$CASE_S"

# ---- 3. the prediction of the same cases (on the CPU: the planner counts under FakeTensorMode)
DEVICE=$("$PY" "$REPO/tools/gpu_smoke.py" device 2>> "$OUT/steps.log")
log "3. llmbench-plan --time --device ${DEVICE:-?} (the planner's part for this GPU's name)"
if [ -n "$DEVICE" ]; then
    PLAN=(--profile h100 --time --device "$DEVICE" --world-size 1 --strategy ddp,fsdp)
    echo "llmbench-plan ${PLAN[*]}" > "$OUT/plan.cmd"
    CUDA_VISIBLE_DEVICES= timeout -k 5 150 "$PY" -m pytest_llmbench.planner.cli "${PLAN[@]}" > "$OUT/plan.txt" 2>&1
    CUDA_VISIBLE_DEVICES= timeout -k 5 150 "$PY" -m pytest_llmbench.planner.cli "${PLAN[@]}" --json \
        > "$OUT/plan.json" 2> "$OUT/plan.err"
fi

# ---- 5. time allowing
if "$PY" -c "import deepspeed" > /dev/null 2>&1 && [ "$(left)" -gt 120 ]; then
    log "5a. zero2 at ws1"
    run_case zero2-ws1 zero2 $(( $(left) - 60 < CASE_S ? $(left) - 60 : CASE_S ))
else
    log "5a. zero2 skipped (DeepSpeed importable? $("$PY" -c 'import deepspeed' > /dev/null 2>&1 && echo yes || echo no); $(left) s left)"
fi
if "$PY" -c "import pytest, pytest_benchmark, pytest_llmbench.plugin" > /dev/null 2>&1 && [ "$(left)" -gt 110 ]; then
    log "5b. the same ddp case through pytest and the plugin"
    PLUGIN=()  # an installed plugin loads by its entry point; from PYTHONPATH it is named
    "$PY" "$REPO/tools/gpu_smoke.py" installed > /dev/null 2>&1 || PLUGIN=(-p pytest_llmbench.plugin)
    timeout -k 10 $(( $(left) - 25 )) "$PY" -m pytest ${PLUGIN[@]+"${PLUGIN[@]}"} -p no:cacheprovider tests/benchmarks \
        -m h100 --strategy=ddp --world-size=1 --llmbench-fresh --llmbench-output="$OUT/pytest-llmbench" \
        > "$OUT/pytest.log" 2>&1
    log "   pytest exit $? (pytest.log)"
else
    log "5b. pytest route skipped ($(left) s left, or pytest / pytest-benchmark / the plugin do not import)"
fi

# ---- 4. the summary
"$PY" "$REPO/tools/gpu_smoke.py" summary "$OUT" 2>> "$OUT/steps.log" | tee -a "$OUT/steps.log"
log "done in $(elapsed) s of ${BUDGET_S} s; send back $OUT"
