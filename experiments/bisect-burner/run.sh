#!/usr/bin/env bash
# Issue 66's check on this machine: a 4-commit range with a 20% slowdown (tokens/s x 0.8: every timed
# step 25% longer) at its 3rd commit, bisected while a CPU burner shares the 2 cores (a busy loop, on
# for 45 s and off for 15 s, over and over). From a clone of the commit named by BASE (default HEAD of
# $REPO), with the project's venv; what it prints goes to console.log beside this script.
set -e
BASE=${BASE:-$(git -C "${REPO:-/work/main}" rev-parse HEAD)}
rm -rf /tmp/bisb /tmp/bisb-out; git clone -q "${REPO:-/work/main}" /tmp/bisb; cd /tmp/bisb; git checkout -q "$BASE"
for k in 1 2 3 4; do
  if [ "$k" = 3 ]; then
    sed -i 's/os.environ.get("LLMBENCH_SLOWDOWN", "")/os.environ.get("LLMBENCH_SLOWDOWN", "0.25")/' harness/faults.py
    git -c user.name=x -c user.email=x@x commit -qam "exp $k: every step 25% longer (tokens/s x 0.8)"
  else
    echo "experiment commit $k" >> experiments/bisect-experiment.txt; git add experiments/bisect-experiment.txt
    git -c user.name=x -c user.email=x@x commit -qm "exp $k: a commit that changes no speed"
  fi
done
( while true; do timeout 45 python3 -c "while True: pass" || true; sleep 15; done ) &
BURNER=$!
trap 'kill $BURNER 2>/dev/null; pkill -f "while True: pass" || true' EXIT
"${PY:-/work/main/.venv/bin/python}" -m pytest tests/benchmarks -m cpu --strategy=ddp --world-size=1 \
    --seq-len=128 -k "not collectives" --llmbench-fail-below tokens_per_s:5% \
    --llmbench-bisect "$BASE..HEAD" --llmbench-output=/tmp/bisb-out -p no:cacheprovider
