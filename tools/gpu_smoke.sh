#!/usr/bin/env bash
# tools/gpu_smoke.sh: docs/GPU.md's first steps as one command on ONE GPU, in under 8 minutes.
#
#     bash tools/gpu_smoke.sh [OUT]          (from the repository root; OUT default gpu-smoke/)
#
# Needs no package index: it runs with the first Python that has a CUDA torch, in this order:
# $PYTHON, the repository's .venv, the system python3 with PYTHONPATH=<repo> (a host with its own CUDA
# torch). The profile is the one whose parts include GPU 0 (h100's cases where none does,
# said in steps.log). What it runs, each step under its own timeout within BUDGET_S (420 s):
#   1. host facts (nvidia-smi, NICs) and the Python stack's versions
#   2. the profile's ddp and fsdp cases at world size 1, built as the plugin builds them
#      (pytest_llmbench.cases.make_spec) and run as a fresh case runs: torchrun -> python -m harness
#   3. llmbench-plan --time for the same cases, on the planner's part for this GPU
#   4. time allowing: zero2 at ws1 (if DeepSpeed imports), then the ddp case through pytest itself
#   5. the summary: measured beside predicted (step time, MFU, peak memory), NCCL's transports
# The whole run is held to BUDGET_S + 40 s (480 s) by `timeout`; the summary is written even then.
# OUT gets four files, nothing else: summary.txt, summary.json, steps.log and details.tar.gz (every
# case's spec, result and torchrun log, host.txt, versions.json, the plans, pytest's log and store).
# OUT must be a new or empty folder: nothing already there is overwritten. Without a GPU it says so,
# runs nothing, and exits 3. Send back the whole OUT folder (docs/GPU.md, step 7).
set -uo pipefail

BUDGET_S=${BUDGET_S:-420}
CASE_S=${CASE_S:-170}
REPO=$(cd "$(dirname "$0")/.." && pwd)
say() { echo "gpu_smoke: $*" >&2; }

if [ -z "${GPU_SMOKE_WORK:-}" ]; then
    # ---- the outer half: check OUT, run the steps under one enforced deadline, then always finish
    case "$BUDGET_S" in ''|*[!0-9]*) say "BUDGET_S=$BUDGET_S (env) is not a whole number of seconds"; exit 2 ;; esac
    case "$CASE_S" in ''|*[!0-9]*) say "CASE_S=$CASE_S (env) is not a whole number of seconds"; exit 2 ;; esac
    OUT=${1:-$REPO/gpu-smoke}
    if [ -e "$OUT" ] && [ ! -d "$OUT" ]; then say "OUT $OUT (argument) exists and is not a folder"; exit 2; fi
    if [ -L "$OUT" ]; then say "OUT $OUT (argument) is a symbolic link; name a real folder"; exit 2; fi
    if [ -d "$OUT" ] && [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then
        say "OUT $OUT (argument) is not empty; name a new folder (nothing there is overwritten)"; exit 2
    fi
    mkdir -p "$OUT" 2>/dev/null && [ -w "$OUT" ] || { say "OUT $OUT (argument) cannot be created or written"; exit 2; }
    OUT=$(cd "$OUT" && pwd)
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-smoke.XXXXXX") || { say "no temporary folder"; exit 2; }
    trap 'rm -rf "$WORK"' EXIT
    mkdir -p "$WORK/cases"
    : > "$WORK/steps.log"
    # GNU timeout makes its own process group and signals all of it: no step outlives the deadline.
    GPU_SMOKE_WORK=$WORK GPU_SMOKE_START=$(date +%s) timeout -k 10 $(( BUDGET_S + 30 )) bash "$0" "$OUT"
    rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "gpu_smoke: stopped at its total budget ($(( BUDGET_S + 30 )) s); the summary is of what finished" \
            | tee -a "$WORK/steps.log"
    fi
    if [ "$rc" -ne 3 ] && [ -d "$WORK/cases" ]; then  # 3: no GPU, nothing ran, nothing to summarise
        PY=$(cat "$WORK/python" 2>/dev/null || echo python3)
        PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" timeout -k 2 20 "$PY" "$REPO/tools/gpu_smoke.py" \
            summary "$WORK" 2>> "$WORK/steps.log" | tee -a "$WORK/steps.log"
        mv "$WORK/summary.txt" "$WORK/summary.json" "$OUT/" 2>/dev/null
    fi
    cp "$WORK/steps.log" "$OUT/steps.log"
    timeout -k 2 20 tar -czf "$OUT/details.tar.gz" -C "$WORK" --exclude=./steps.log . 2>> "$OUT/steps.log" \
        || echo "gpu_smoke: details.tar.gz could not be written (above)" >> "$OUT/steps.log"
    echo "gpu_smoke: exit $rc; send back $OUT ($(ls "$OUT" | tr '\n' ' '))"
    exit "$rc"
fi

# ---- the inner half: the steps, in $GPU_SMOKE_WORK, each under a timeout within what is left
W=$GPU_SMOKE_WORK
START=$GPU_SMOKE_START
cd "$REPO" || exit 2
elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET_S - $(elapsed) )); }
limit() {  # limit WANT: WANT seconds, or what the budget has left if less (at least 1)
    local l
    l=$(left)
    [ "$l" -lt "$1" ] && { [ "$l" -gt 1 ] && echo "$l" || echo 1; } || echo "$1"
}
log() { echo "[t+$(elapsed)s] $*" | tee -a "$W/steps.log"; }
no_gpu() { log "gpu_smoke: no usable NVIDIA GPU on this host: $*. Nothing was run; run it on a GPU host (docs/GPU.md)."; exit 3; }
SMI_S=${SMI_S:-20}
smi() { timeout -k 2 "$SMI_S" nvidia-smi "$@"; }  # a hung driver must not hang the script

# ---- 1. the host and the Python stack
command -v nvidia-smi >/dev/null || no_gpu "nvidia-smi is not installed"
smi -L > "$W/gpus.txt" 2>&1
case $? in 124|137) no_gpu "nvidia-smi -L did not answer within $SMI_S s" ;; esac
grep -q "^GPU " "$W/gpus.txt" || no_gpu "nvidia-smi lists no GPU ($(head -1 "$W/gpus.txt"))"
{
    date -u; smi; smi topo -m
    smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv
    ip -br link 2>/dev/null || ls /sys/class/net
    env | grep -E '^(NCCL_|CUDA_|PYTHONPATH)' || true
} > "$W/host.txt" 2>&1

cuda_python() {  # 0 when "$1" imports a torch that sees a GPU
    timeout -k 2 60 "$1" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" > /dev/null 2>&1
}
PY=""
for candidate in "${PYTHON:-}" "$REPO/.venv/bin/python"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ] && cuda_python "$candidate"; then PY=$candidate; break; fi
done
if [ -z "$PY" ] && command -v python3 >/dev/null && cuda_python "$(command -v python3)"; then
    PY=$(command -v python3)
fi
[ -n "$PY" ] || no_gpu "no Python here imports a torch that sees a GPU (\$PYTHON, .venv, python3 tried)"
echo "$PY" > "$W/python"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's harness and plugin, whichever Python
export PYTHONUNBUFFERED=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=${NCCL_DEBUG_SUBSYS:-INIT,NET,ENV}
log "1. python: $PY"
timeout -k 2 60 "$PY" "$REPO/tools/gpu_smoke.py" versions > "$W/versions.json" 2>> "$W/steps.log" \
    || log "   versions.json: failed (steps.log)"
GPU=$(sed -n 's/^GPU 0: \(.*\) (UUID.*$/\1/p; s/^GPU 0: \([^(]*\)$/\1/p' "$W/gpus.txt" | head -1)
PROFILE=$(timeout -k 2 60 "$PY" "$REPO/tools/gpu_smoke.py" profile "$GPU" 2>> "$W/steps.log")
if [ -z "$PROFILE" ]; then
    PROFILE=h100
    log "   no profile names '$GPU' among its parts: h100's cases are run, the pytest route would skip them"
fi
log "   GPU 0: $GPU -> profile $PROFILE"

# ---- 2. the cases, fresh, world size 1
run_case() {  # name strategy limit_s
    local dir="$W/cases/$1" t0
    mkdir -p "$dir"
    if ! timeout -k 2 60 "$PY" "$REPO/tools/gpu_smoke.py" spec "$PROFILE" "$2" "$dir/spec.json" >> "$W/steps.log" 2>&1; then
        log "   $1: no spec (steps.log)"; return 0
    fi
    t0=$(date +%s)
    (cd "$dir" && LLMBENCH_RUN_ID="smoke-$1" timeout -k 10 "$3" "$PY" -m torch.distributed.run --standalone \
        --nproc-per-node=1 -m harness --spec="$dir/spec.json" --out="$dir/result.json" --run-id="smoke-$1" \
        > "$dir/torchrun.log" 2>&1)
    log "   $1: exit $? in $(( $(date +%s) - t0 )) s (limit $3 s)"
}
log "2. $PROFILE profile: ddp and fsdp at ws1"
run_case ddp-ws1 ddp "$(limit "$CASE_S")"
[ "$(left)" -gt 60 ] && run_case fsdp-ws1 fsdp "$(limit "$CASE_S")" || log "   fsdp-ws1 skipped ($(left) s left)"

# ---- 3. the prediction of the same cases (on the CPU: the planner counts under FakeTensorMode)
DEVICE=$(timeout -k 2 60 "$PY" "$REPO/tools/gpu_smoke.py" device 2>> "$W/steps.log")
log "3. llmbench-plan --time --device ${DEVICE:-?} (the planner's part for this GPU's name)"
if [ -n "$DEVICE" ] && [ "$(left)" -gt 30 ]; then
    PLAN=(--profile "$PROFILE" --time --device "$DEVICE" --world-size 1 --strategy ddp,fsdp)
    echo "llmbench-plan ${PLAN[*]}" > "$W/plan.cmd"
    CUDA_VISIBLE_DEVICES= timeout -k 5 "$(limit 150)" "$PY" -m pytest_llmbench.planner.cli "${PLAN[@]}" --json \
        > "$W/plan.json" 2> "$W/plan.err" || log "   the plan failed (plan.err in details.tar.gz)"
fi

# ---- 4. time allowing
if timeout -k 2 60 "$PY" -c "import deepspeed" > /dev/null 2>&1 && [ "$(left)" -gt 120 ]; then
    log "4a. zero2 at ws1"
    run_case zero2-ws1 zero2 "$(limit $(( $(left) - 60 < CASE_S ? $(left) - 60 : CASE_S )))"
else
    log "4a. zero2 skipped (DeepSpeed does not import, or $(left) s left)"
fi
if timeout -k 2 60 "$PY" -c "import pytest, pytest_benchmark, pytest_llmbench.plugin" > /dev/null 2>&1 \
        && [ "$(left)" -gt 110 ]; then
    log "4b. the same ddp case through pytest and the plugin"
    PLUGIN=()  # an installed plugin loads by its entry point; from PYTHONPATH it is named
    timeout -k 2 60 "$PY" "$REPO/tools/gpu_smoke.py" installed > /dev/null 2>&1 || PLUGIN=(-p pytest_llmbench.plugin)
    timeout -k 10 $(( $(left) - 25 )) "$PY" -m pytest ${PLUGIN[@]+"${PLUGIN[@]}"} -p no:cacheprovider tests/benchmarks \
        -m "$PROFILE" --strategy=ddp --world-size=1 --llmbench-fresh --llmbench-output="$W/pytest-llmbench" \
        > "$W/pytest.log" 2>&1
    log "   pytest exit $? (pytest.log)"
else
    log "4b. pytest route skipped ($(left) s left, or pytest / pytest-benchmark / the plugin do not import)"
fi
log "done in $(elapsed) s of ${BUDGET_S} s"
