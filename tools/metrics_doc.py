"""Print the metric table (harness/metrics.py) as the markdown table in docs/METRICS.md.

    python tools/metrics_doc.py > /tmp/table.md   # then paste between the markers in docs/METRICS.md

tests/unit/test_tables.py fails when docs/METRICS.md no longer holds this exact table.
"""

from __future__ import annotations

from harness.metrics import MEAN, table

BEGIN = "<!-- metric table: tools/metrics_doc.py -->"
END = "<!-- end of metric table -->"


def render() -> str:
    lines = [BEGIN, "", "| metric | unit | better | over trials | definition |", "|---|---|---|---|---|"]
    for m in table():
        better = {True: "higher", False: "lower", None: "-"}[m.higher]
        trials = "mean" if m.trials == MEAN else "latest"
        lines.append(f"| `{m.name}` | {m.unit or '-'} | {better} | {trials} | {m.definition} |")
    return "\n".join([*lines, "", END])


if __name__ == "__main__":
    print(render())
