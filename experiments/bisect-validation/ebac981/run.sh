#!/usr/bin/env bash
# Issue 52's 12-commit bisect on this machine, as run on 2026-11-28 (ebac981's code, 2 cores).
# A clone of ebac981 gets 12 commits: the 8th (dd51b4f) sets LLMBENCH_SLOWDOWN's default in
# harness/faults.py to 0.1765 (every timed step 17.65% longer: tokens/s -15%), the 11 others change
# only a text file. Then the bisect, from the clone, with the project's venv:
set -e
rm -rf /tmp/bis; git clone -q "${REPO:-/work/main}" /tmp/bis; cd /tmp/bis; git checkout -q ebac981
for k in $(seq 1 12); do
  if [ "$k" = 8 ]; then
    sed -i 's/os.environ.get("LLMBENCH_SLOWDOWN", "")/os.environ.get("LLMBENCH_SLOWDOWN", "0.1765")/' harness/faults.py
    git -c user.name=x -c user.email=x@x commit -qam "exp $k: every step 17.65% longer (tokens/s -15%)"
  else
    echo "experiment commit $k" >> reports/bisect-experiment.txt; git add reports/bisect-experiment.txt
    git -c user.name=x -c user.email=x@x commit -qm "exp $k: a commit that changes no speed"
  fi
done
"${PY:-/work/main/.venv/bin/python}" -m pytest tests/benchmarks -m cpu --strategy=ddp --world-size=1,2 \
    --seq-len=128 -k "not collectives" --llmbench-fail-below tokens_per_s:5% \
    --llmbench-bisect "ebac981..HEAD" --llmbench-output=/tmp/bis-out -p no:cacheprovider
