#!/usr/bin/env bash
# The A/B gate's validation sessions (issue 42), interleaved so drift of this machine spreads over kinds.
# Run from /tmp/abexp, holding clones of the commit: base/, and slow10/, slow20/ with one more commit each
# that sets LLMBENCH_SLOWDOWN's default (harness/faults.py) to 0.1 and 0.2 (reports/README.md).
PY=/work/main/.venv/bin/python
LOG=/tmp/abexp/sessions.log
echo "env side file" > /dev/null
printf 'LLMBENCH_SLOWDOWN=0.1\n' > /tmp/abexp/slow-baseline.env
session() {  # kind dir side burn
    local kind=$1 dir=$2 side=$3 burn=$4 start=$(date +%s) out=/tmp/abexp/out-$kind-$RANDOM
    local bp=""
    if [ "$burn" = 1 ]; then ( sleep 40; exec $PY -c "while True: pass" ) & bp=$!; fi
    (cd /tmp/abexp/$dir && timeout 1500 $PY -m pytest tests/benchmarks -m cpu --strategy=ddp --world-size=1,2 \
        --seq-len=128 -k "not collectives" --llmbench-ab "$side" --llmbench-fail-below tokens_per_s:5% \
        --llmbench-output=$out -p no:cacheprovider > $out.log 2>&1)
    local rc=$?
    if [ -n "$bp" ]; then pkill -P $bp 2>/dev/null; kill $bp 2>/dev/null; pkill -f "while True: pass" 2>/dev/null; fi
    echo "$kind burn=$burn rc=$rc $(( $(date +%s) - start ))s $(grep -E 'tokens_per_s: A/B' $out.log | sed 's/^cpu-ddp-//' | tr '\n' ' ') out=$out" >> $LOG
}
block() {  # one of each kind, interleaved
    session aa base ref=HEAD 0
    session slow10 slow10 ref=HEAD~1 0
    session aa base ref=HEAD 1
    session slow20 slow20 ref=HEAD~1 0
}
for i in 1 2 3 4 5; do block; done
session env base env=/tmp/abexp/slow-baseline.env 0
for i in 1 2 3 4 5; do block; done  # stopped after its first three sessions (reports/README.md)
echo done >> $LOG
