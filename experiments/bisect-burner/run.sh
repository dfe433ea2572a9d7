#!/usr/bin/env bash
# Issue 66's check on this machine: an N-commit range (default 4) whose K-th commit (default 3) makes
# every timed step SLOW longer (default 0.25: tokens/s x 0.8), bisected while a CPU burner shares the 2
# cores (a busy loop, on for 45 s and off for 15 s, over and over). The other commits change a text
# file. From a clone of the commit named by BASE (default HEAD of $REPO), with the project's venv;
# OUT names the output folder (default /tmp/bisb-out).
#   4 commits, 20% drop:  bash run.sh > console.log
#   12 commits, 10% drop: N=12 K=7 SLOW=0.111 bash run.sh > console-12.log
set -e
N=${N:-4}; K=${K:-3}; SLOW=${SLOW:-0.25}; OUT=${OUT:-/tmp/bisb-out}
BASE=${BASE:-$(git -C "${REPO:-/work/main}" rev-parse HEAD)}
rm -rf /tmp/bisb "$OUT"; git clone -q "${REPO:-/work/main}" /tmp/bisb; cd /tmp/bisb; git checkout -q "$BASE"
for k in $(seq 1 "$N"); do
  if [ "$k" = "$K" ]; then
    sed -i "s/os.environ.get(\"LLMBENCH_SLOWDOWN\", \"\")/os.environ.get(\"LLMBENCH_SLOWDOWN\", \"$SLOW\")/" harness/faults.py
    git -c user.name=x -c user.email=x@x commit -qam "exp $k: every step $SLOW longer"
  else
    echo "experiment commit $k" >> experiments/bisect-experiment.txt; git add experiments/bisect-experiment.txt
    git -c user.name=x -c user.email=x@x commit -qm "exp $k: a commit that changes no speed"
  fi
done
git log --oneline "$BASE..HEAD"
( while true; do timeout 45 python3 -c "while True: pass" || true; sleep 15; done ) &
BURNER=$!
trap 'kill $BURNER 2>/dev/null; pkill -f "while True: pass" || true' EXIT
"${PY:-/work/main/.venv/bin/python}" -m pytest tests/benchmarks -m cpu --strategy=ddp --world-size=1 \
    --seq-len=128 -k "not collectives" --llmbench-fail-below tokens_per_s:5% \
    --llmbench-bisect "$BASE..HEAD" --llmbench-output="$OUT" -p no:cacheprovider
