"""Fine-tuning workloads side by side: for each strategy (and variant) at one profile, sequence
length and world size, pretraining vs LoRA vs QLoRA of the same architecture: what trains, how
fast (tokens/s and samples/s), how much memory, at what MFU and cost per 1K samples.

MFU of lora/qlora uses the frozen-weight convention (harness/flops.py): 4 N_frozen + 6 N_trainable
+ attention FLOPs per token. Trainable counts are the model's own (peft's count), never a
document's.
"""

from __future__ import annotations

from typing import Any

from harness.identity import run_as
from pytest_llmbench.report.load import Loaded

ORDER = {"pretrain": 0, "lora": 1, "qlora": 2}


def workload_rows(loaded: Loaded) -> list[dict[str, Any]]:
    """Every finished case of a profile that ran a fine-tuning workload, grouped for comparison."""
    frame = loaded.frame
    tuned = set(frame[frame.workload != "pretrain"].profile)
    ok = frame[(frame.status == "ok") & frame.profile.isin(tuned)].copy()
    if ok.empty:
        return []
    ok["plain"] = [run_as(strategy=s, variant=v) for s, v in zip(ok.strategy_name, ok.variant, strict=True)]
    ok["order"] = ok.workload.map(ORDER)
    ok = ok.sort_values(["profile", "seq_len", "world_size", "plain", "order"])
    return [{**row, "trainable_share": row["n_trainable_params"] / row["n_params"]}
            for row in ok.to_dict("records")]
