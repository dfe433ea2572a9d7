#!/usr/bin/env bash
# Issue 52's on-machine A/B sessions at commit 9038216 (the gate's code as committed), interleaved so
# drift of this machine spreads over kinds: A/A, 10% tokens/s drop, A/A with a CPU burner from 40 s on.
# Run from WORK (default /tmp/abexp2) holding clones of the commit: base/, and slow10/ with one more commit that sets
# LLMBENCH_SLOWDOWN's default (harness/faults.py) to 0.1111 (each step 11.1% longer: tokens/s -10%).
PY=/work/main/.venv/bin/python
WORK=${WORK:-/tmp/abexp2}
LOG=$WORK/sessions.log
session() {  # kind dir side burn
    local kind=$1 dir=$2 side=$3 burn=$4 start=$(date +%s) out=$WORK/out-$kind-$RANDOM
    local bp=""
    if [ "$burn" = 1 ]; then ( sleep 40; exec $PY -c "while True: pass" ) & bp=$!; fi
    (cd $WORK/$dir && timeout 1500 $PY -m pytest tests/benchmarks -m cpu --strategy=ddp --world-size=1,2 \
        --seq-len=128 -k "not collectives" --llmbench-ab "$side" --llmbench-fail-below tokens_per_s:5% \
        --llmbench-output=$out -p no:cacheprovider > $out.log 2>&1)
    local rc=$?
    if [ -n "$bp" ]; then pkill -P $bp 2>/dev/null; kill $bp 2>/dev/null; pkill -f "while True: pass" 2>/dev/null; fi
    echo "$kind burn=$burn rc=$rc $(( $(date +%s) - start ))s $(grep -E 'tokens_per_s: A/B' $out.log | sed 's/^cpu-ddp-//' | tr '\n' ' ') out=$out" >> $LOG
}
# KINDS: the sessions to run, in order (aa, slow10, aa+burn); by default ten times the three.
KINDS=${KINDS:-$(for i in 1 2 3 4 5 6 7 8 9 10; do echo aa slow10 aa+burn; done)}
for kind in $KINDS; do
    case $kind in
        aa) session aa base ref=HEAD 0 ;;
        slow10) session slow10 slow10 ref=HEAD~1 0 ;;
        aa+burn) session aa base ref=HEAD 1 ;;
        *) echo "unknown session kind $kind" >&2; exit 2 ;;
    esac
done
echo done >> $LOG
