"""torch.compile as each stack's users apply it (variant compile), and what compiling cost the case.

    fsdp     each transformer block compiled in place before ``fully_shard`` (torchtitan's order: recompute,
             then compile, then FSDP; torchtitan/models/llama3/infra/parallelize.py ``apply_compile``
             compiles block by block), the root eager
    fsdp1    the FSDP1-wrapped model compiled whole, ``use_orig_params=True`` as FSDP1's docs require
             for torch.compile
    ddp      the DDP-wrapped model compiled whole: compiled DDP, dynamo's DDPOptimizer splitting the graph
             at the gradient buckets (torch._dynamo.config.optimize_ddp, on by default)
    zero2/3  DeepSpeed's own ``DeepSpeedEngine.compile()`` (deepspeed/runtime/engine.py), inductor backend

What the result records (``metrics``): ``compile_s``, the warm-up steps' time above the steady step
(first compiled steps minus steady steps, slowest rank; steady: the median of the measured steps no
rank compiled in); ``recompiles``, frames dynamo compiled during the measured steps (a recompile there
is timed as a step: the report names it); ``graph_breaks``
(dynamo's ``counters["graph_break"]``); ``compile_cache_hits``: the share of the graphs inductor's FX
graph cache served (1 every one, 0 none), so a warm cache's compile time is not read as a cold one's.
The ranks keep inductor's cache where ``TORCHINDUCTOR_CACHE_DIR`` points (a profile's [env] may set
it; torch's default is a folder under the system's temporary directory, shared by later sessions).
"""

from __future__ import annotations

import statistics
from typing import Any

ON = "compile"
NOT_COMPILED = "not compiled (the case's variant has no compile part)"


def wanted(spec) -> bool:
    return ON in spec.variant_parts()


def fresh() -> None:
    """Before a compiled case: drop the compiled code earlier cases left in this process (a warm rank
    runs case after case). Without it a new model of the same code reuses an earlier case's compiled
    code (tests/unit/test_compiled.py): the case compiles nothing and its compile time reads as zero;
    and dynamo's recompile limit (8 a code object) would at last run it eager, silently. Inductor's
    on-disk cache stays (``compile_cache_hits`` says how much it served)."""
    import torch._dynamo

    torch._dynamo.reset()


def check(record: dict[str, Any], rank: int) -> None:
    """Raises when this rank's case compiled no frame: it ran eager, never reported as compiled."""
    if record["frames"] <= 0:
        raise RuntimeError(f"variant compile: dynamo compiled no frame on rank {rank}: the case ran eager, "
                           f"and is not reported under the compiled name")


def blocks(model) -> None:
    """Compile every transformer block in place (``nn.Module.compile``: the module stays itself, so
    ``fully_shard`` and the recompute wrapper see the same objects)."""
    for block in model.blocks:
        block.compile()


def whole(module):
    """The module compiled whole (``torch.compile``): the callable the engine runs forward on."""
    import torch

    return torch.compile(module)


def frames() -> int:
    """Frames dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"])


def snapshot() -> dict[str, int]:
    """Dynamo's and inductor's counters this process has so far: what ``record`` subtracts."""
    from torch._dynamo.utils import counters

    return {"frames": int(counters["frames"]["ok"]),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "unique_graphs": int(counters["stats"]["unique_graphs"]),
            "cache_hits": int(counters["inductor"]["fxgraph_cache_hit"]),
            "cache_misses": int(counters["inductor"]["fxgraph_cache_miss"])}


def record(before: dict[str, int], per_step: list[int], warmup_steps: int) -> dict[str, Any]:
    """One rank's compile record over the case: counters since ``before``, and the frames compiled in
    each step (``per_step``)."""
    now = snapshot()
    delta = {k: now[k] - before[k] for k in now}
    return {**delta, "frames_per_step": per_step, "measured_frames": sum(per_step[warmup_steps:])}


def metrics(spec, per_rank: list[dict | None], warmup_s: list[float],
            measured_s: list[float]) -> tuple[dict[str, Any], dict[str, str]]:
    """(metrics, null reasons) of the compile variant from every rank's ``record``."""
    names = ("compile_s", "recompiles", "graph_breaks", "compile_cache_hits")
    if not wanted(spec):
        return dict.fromkeys(names), dict.fromkeys(names, NOT_COMPILED)
    records = [r for r in per_rank if r]
    if len(records) != len(per_rank) or not records:
        why = "a rank recorded no compile counters"
        return dict.fromkeys(names), dict.fromkeys(names, why)
    out: dict[str, Any] = {"recompiles": max(r["measured_frames"] for r in records),
                           "graph_breaks": max(r["graph_breaks"] for r in records)}
    nulls: dict[str, str] = {}
    # The steady step is the median of the measured steps no rank compiled in: a recompile there (a
    # step as slow as a compile) would otherwise raise "steady" and hide the warm-up's compile time.
    skip = len(warmup_s)
    clean = [t for i, t in enumerate(measured_s)
             if not any(r["frames_per_step"][skip + i:skip + i + 1] != [0] for r in records)]
    if clean and warmup_s:
        steady = statistics.median(clean)
        out["compile_s"] = max(0.0, sum(warmup_s) - steady * len(warmup_s))
    else:
        out["compile_s"] = None
        nulls["compile_s"] = "no warm-up step, or no measured step that compiled nothing, to compare"
    hits, misses = sum(r["cache_hits"] for r in records), sum(r["cache_misses"] for r in records)
    out["compile_cache_hits"] = hits / (hits + misses) if hits + misses else None
    if hits + misses == 0:
        nulls["compile_cache_hits"] = "inductor compiled no graph in this case (all served in memory)"
    return out, nulls
