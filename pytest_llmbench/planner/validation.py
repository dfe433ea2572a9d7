"""The step-time predictor against published training measurements (tests/data/published_steps.json):
each row predicted as the planner predicts any model, the errors, and how the predicted MFU ranks the
rows against the published one. tools/fit_steptime.py fits the predictor's global values on them.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.variants import VARIANTS
from pytest_llmbench.planner import configs, timing
from pytest_llmbench.planner.steptime import FIT, Fit, Network, Prediction

# A row's "recompute" as the variant that runs it: the published runs' own words, on the variants' rows.
RECOMPUTES = {"none": "base"} | {word: v.name for v in VARIANTS.values() for word in v.recompute}


def row_variant(row: dict) -> str:
    """The variant of a row: its ``variant`` field, else its ``recompute`` ("none", "full",
    "selective-op", or every K-th block: "every<K>", "selective-layer-<K>"), with ``compile`` where the
    row says ``"compile": true``, ``bf16-reduce`` where it says ``"reduce_dtype": "bf16"`` (gradients
    reduced in bf16: Composer before 0.16.4, tests/data/published_steps.json's sources) and ``hsdp`` where
    it says ``"sharding": "HYBRID_SHARD"`` (FSDP1's word: sharded in the node, replicated across nodes;
    default FULL_SHARD). Raises ValueError naming a value it does not know."""
    if row.get("variant"):
        return row["variant"]
    parts = [_recompute_variant(row)]
    if row.get("compile"):
        parts.append("compile")
    reduce_dtype = row.get("reduce_dtype", "fp32")
    if reduce_dtype not in ("fp32", "bf16"):
        raise ValueError(f"row {row.get('model')!r}: reduce_dtype {reduce_dtype!r} is not fp32 or bf16")
    if reduce_dtype == "bf16":
        parts.append("bf16-reduce")
    sharding = row.get("sharding", "FULL_SHARD")
    if sharding not in ("FULL_SHARD", "HYBRID_SHARD"):
        raise ValueError(f"row {row.get('model')!r}: sharding {sharding!r} is not FULL_SHARD or HYBRID_SHARD")
    if sharding == "HYBRID_SHARD":
        parts.append("hsdp")
    return "+".join(p for p in parts if p != "base") or "base"


def _recompute_variant(row: dict) -> str:
    import re

    recompute = str(row.get("recompute", "none"))
    layer = re.fullmatch(r"(?:every|selective-layer-?)(\d+)", recompute)
    if layer:
        return f"ac-every{layer.group(1)}"
    if recompute not in RECOMPUTES:
        raise ValueError(f"row {row.get('model')!r}: recompute {recompute!r} is not one of "
                         f"{', '.join(RECOMPUTES)}, every<K>, selective-layer-<K>")
    return RECOMPUTES[recompute]


def predict_row(row: dict, fit: Fit = FIT) -> Prediction:
    """The prediction for one row of tests/data/published_steps.json (or any dict of its fields)."""
    from harness import devices

    spec = configs.spec_of_config(
        row["config"],
        row["model"],
        seq_len=row["seq_len"],
        micro_batch=row["micro_batch"],
        strategy=row["strategy"],
        dtype="bf16",
        world_size=row["world_size"],
        variant=row_variant(row),
    )
    network = Network(row["devices_per_node"], row.get("inter_node_gbps"))
    return timing.predict(spec, devices.get(row["device"]), network, world_size=row["world_size"],
                          grad_accum=row["grad_accum"], config=row["config"],
                          sync=timing.Sync(row.get("grad_sync", "micro_batch")), fit=fit)


@dataclass
class Validation:
    rows: list[dict]  # each row with "predicted", "error", "published_mfu", "predicted_mfu"
    mean_abs_error: float
    max_abs_error: float
    mfu_rank_correlation: float


def validate(rows: list[dict], fit: Fit = FIT) -> Validation:
    """Predicted against published tokens/s per device for each row; the MFU compared in the row's own
    convention (published MFU x predicted / published tokens/s; rows without a published MFU: harness/
    flops.py's), and Spearman's rank correlation of predicted with published MFU across rows."""
    out = []
    for row in rows:
        p = predict_row(row, fit)
        published = row["tokens_per_s_per_device"]
        ratio = p.tokens_per_s_per_device / published
        published_mfu = row["mfu"] if row.get("mfu") is not None else p.mfu / ratio
        out.append(
            {
                **row,
                "predicted": p.tokens_per_s_per_device,
                "error": ratio - 1,
                "published_mfu": published_mfu,
                "predicted_mfu": published_mfu * ratio,
                "terms": p.terms,
            }
        )
    return summarise(out)


def summarise(rows: list[dict]) -> Validation:
    """The errors and the rank correlation of validated rows (``validate``'s, or a subset of them)."""
    errors = [abs(r["error"]) for r in rows]
    rho = spearman([r["predicted_mfu"] for r in rows], [r["published_mfu"] for r in rows])
    return Validation(rows, sum(errors) / len(errors), max(errors), rho)


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""

    def ranks(xs: list[float]) -> list[float]:
        order = sorted(range(len(xs)), key=xs.__getitem__)
        r = [0.0] * len(xs)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else 0.0
