"""What the contention form changes on a slow fabric: every multi-node published row predicted at its own
fabric and at 800 and 400 Gb/s a node, with the shipped values, under the shipped form (NCCL's SM share
and HBM bytes, planner/contention.py) and under the old one (0.791 s of compute a hidden second, the
same gemm/attention/memory values otherwise). No published run at these fabrics is among the rows, so
this shows the difference of the two forms, not which is right.

    .venv/bin/python experiments/steptime-contention/slow_fabric.py > experiments/steptime-contention/slow_fabric.txt
"""

import json
from pathlib import Path

from pytest_llmbench.planner import validation

ROOT = Path(__file__).resolve().parents[2]
OLD_RATE = 0.791  # the fitted per-second cost the form replaced (stop 68's FIT.overlap)
rows = json.loads((ROOT / "tests" / "data" / "published_steps.json").read_text())["rows"]
print("| model | device | N | Gb/s a node | comm s | compute s | step s (SM+HBM) | contention s | "
      "step s (0.791/s) | old/new |")
print("| --- " * 10 + "|")
for row in rows:
    if row["world_size"] <= row["devices_per_node"]:
        continue
    for gbps in (row["inter_node_gbps"], 800, 400):
        p = validation.predict_row({**row, "inter_node_gbps": gbps})
        comm = sum(p.communication.values())
        compute = sum(v for k, v in p.terms.items() if k.startswith("compute_") or k == "recompute")
        lost = p.terms["contention_sm_share"] + p.terms["contention_hbm"]
        old = p.step_time_s - lost + OLD_RATE * min(comm, compute)
        print(f"| {row['model']} | {row['device']} | {row['world_size']} | {gbps} | {comm:.3f} | {compute:.3f} | "
              f"{p.step_time_s:.3f} | {lost:.3f} | {old:.3f} | {old / p.step_time_s:.3f} |")
