"""Instrument bookkeeping's rows for one strategy at ws2 on this CPU, grad_accum 1, 2 and 3, beside
harness/bookkeeping.py's stated terms (issue 65, item 2). Run from the repository root:

    .venv/bin/python experiments/bookkeeping-ws2/measure.py zero2 [dtype=bf16]

Prints each measured row (bytes per step, calls) and then each stated term with the measured bytes
under its key.
"""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness import bookkeeping, shapes, strategies  # noqa: E402
from tests.harness.conftest import launch, tiny_spec  # noqa: E402

strategy, extra = sys.argv[1], dict(arg.split("=") for arg in sys.argv[2:])
with tempfile.TemporaryDirectory() as tmp:
    for accum in (1, 2, 3):
        r = launch(tiny_spec(strategy=strategy, grad_accum=accum, instruments={"bookkeeping": 1}, **extra),
                   Path(tmp) / f"ga{accum}", timeout_s=300)
        assert r.ok, r.describe_failure()
        rows = r.instruments["bookkeeping"][0]["rows"]
        print(f"== {strategy} {r.spec.dtype} ({r.spec.precision}) ws{r.spec.world_size} grad_accum {accum}")
        for row in rows:
            print(f"  measured {row['bytes']:>12,.0f} B  x{row['count']:<4g} {row['op']:28} {row['where']}")
        root, block = shapes.tensor_numels(r.spec)
        sends = strategies.get(strategy).stated_bytes(r.spec.variant_parts(), shapes.payloads(r.spec), accum)
        rule = strategies.get(strategy).bookkeeping
        params = sum(root) + r.spec.n_layer * sum(block)
        sizes = bookkeeping.sizes(r.spec, rule, sends, params, max(root + block))
        got = {}
        for row in rows:
            got[(row["where"], row["op"])] = got.get((row["where"], row["op"]), 0) + row["bytes"]
        for term in bookkeeping.stated(rule, sizes) or []:
            print(f"  stated   {term.bytes:>12,.0f} B  {term.what:34} measured under its key "
                  f"{got.get((term.where, term.op), 0):,.0f} B")
