"""The one definition of a case: which spec fields leave two runs the same case or the same scaling
group (docs/ARCHITECTURE.md, "Facts with one home"), and the readable names of a case and of a
strategy as run. Standard library only; harness/spec.py's RunSpec reads them.
"""

from __future__ import annotations

from typing import Any

# Spec fields that may differ between a case and its scaling baseline; under strong scaling the
# per-rank split of the global batch too.
SCALING_FREE = frozenset({"world_size", "nnodes", "threads_per_rank", "extra"})
STRONG_FREE = SCALING_FREE | {"micro_batch", "grad_accum"}


# Fields that leave a run the same case (RunSpec.identity): labels, and steps after the measured ones.
IDENTITY_FREE = frozenset({"extra", "instruments"})


def scaling_free(spec: Any) -> frozenset[str]:
    """The fields a spec's scaling group leaves free: the world size's, and under strong scaling the
    batch split."""
    return STRONG_FREE if spec.scaling == "strong" else SCALING_FREE


def run_as(*, strategy: str, variant: str = "base", workload: str = "pretrain") -> str:
    """See ``RunSpec.run_as``."""
    name = strategy if variant == "base" else f"{strategy}+{variant}"
    return name if workload == "pretrain" else f"{workload}-{name}"


def case_id(*, strategy: str, world_size: int, seq_len: int, variant: str = "base",
            workload: str = "pretrain", benchmark: str = "train") -> str:
    """See ``RunSpec.case_id``; also names a case whose spec is invalid (cases.InvalidCase)."""
    if benchmark == "collectives":
        return f"collectives-ws{world_size}"
    return f"{run_as(strategy=strategy, variant=variant, workload=workload)}-ws{world_size}-seq{seq_len}"
