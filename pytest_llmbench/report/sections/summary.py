"""The report's opening sections: what it covers, the winners, the recommendations (with "Does it
fit?"), the environment and what each strategy really ran."""

from __future__ import annotations

from datetime import UTC, datetime

from pytest_llmbench import stats
from pytest_llmbench.report.findings import MEMORY_TIE, recommendations, winners
from pytest_llmbench.report.load import Loaded
from pytest_llmbench.report.sections import Section, Variables, View

# strategy_config keys the "What each strategy really ran" table shows
DETAILS = ("compute_probe_precision", "wrap_policy", "sharding_strategy", "reshard_after_forward",
           "root_reshard_after_forward", "bucket_cap_mb", "comm_hook", "mp_policy", "mixed_precision",
           "offload_policy", "cpu_offload", "device_mesh")
# the environment rows: (label, env key)
ENVIRONMENT = [("device", "device_name"), ("devices", "device_count"), ("CPU", "cpu"), ("host", "host"),
               ("GPU driver", "driver"), ("CUDA", "cuda"), ("NCCL", "nccl"), ("torch", "torch"),
               ("DeepSpeed", "deepspeed"), ("Python", "python"), ("platform", "platform"),
               ("git commit", "git_commit")]


def header(view: View) -> Variables:
    frame = view.loaded.frame
    return {"generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "n_cases": len(frame),
            "n_failed": int((frame.status != "ok").sum()), "results_dir": view.output / "results",
            "first_run": frame.created_utc.min()[:19], "last_run": frame.created_utc.max()[:19]}


def winner_rows(view: View) -> Variables:
    return {"winners": winners(view.loaded.frame), "confidence": f"{stats.CONFIDENCE:.0%}",
            "noise": f"{stats.NOISE:.0%}", "ratio_method": stats.RATIO_METHOD,
            "memory_tie": f"{MEMORY_TIE:.0%}"}


def recommendation_lines(view: View) -> Variables:
    return {"recommendations": recommendations(view.loaded.frame),
            "scale": {"plan_lines": view.loaded.scale.plan_lines}}


def latest_ok(loaded: Loaded):
    ok = [r for r in loaded.results.values() if r.ok]
    return max(ok, key=lambda r: r.created_utc) if ok else None


def environment(view: View) -> Variables:
    latest = latest_ok(view.loaded) or next(iter(view.loaded.results.values()))
    e = latest.env
    return {"environment": [(label, str(e[key])) for label, key in ENVIRONMENT
                            if e.get(key) not in (None, "")]}


def strategies(view: View) -> Variables:
    return {"strategy_rows": strategy_rows(view.loaded), "shared_config": shared_config(view.loaded)}


def strategy_rows(loaded: Loaded) -> list[dict[str, str]]:
    """Per strategy as run, its wrapper, precision, sync and the config details that differ."""
    seen: dict[str, dict[str, str]] = {}
    for result in loaded.results.values():
        c, name = result.strategy_config, result.spec.run_as
        if not c or name in seen:
            continue
        seen[name] = {"strategy": name, "wrapper": c.get("wrapper", ""), "precision": c.get("precision", ""),
                      "sync": c.get("grad_sync_during_accumulation", ""),
                      "details": ", ".join(f"{k}={v}" for k, v in details(c).items()).replace("|", "/")}
    return [seen[k] for k in sorted(seen)]


def details(c: dict) -> dict:
    """What a strategy's config says beyond the table's columns."""
    out = {k: v for k, v in c.items() if k in DETAILS}
    if c.get("activation_checkpointing"):
        out["activation_checkpointing"] = c["activation_checkpointing"]
    ds = c.get("deepspeed_config", {})
    for key in ("zero_optimization", "communication_data_type"):
        if ds.get(key):
            out[key] = ds[key]
    work = c.get("workload", {})
    if work.get("lora"):
        out["lora"] = work["lora"]
    if work.get("quantization"):
        out["quantization"] = {k: v for k, v in work["quantization"].items() if k != "layers"}
    return out


def shared_config(loaded: Loaded) -> str:
    result = latest_ok(loaded)
    if result is None:
        return "no finished case"
    c, s = result.strategy_config, result.spec
    return (f"{c.get('optimizer')}, {c.get('lr_schedule')} lr, grad clip {c.get('grad_clip_max_norm')}, "
            f"grad accum {s.grad_accum}, micro-batch {s.micro_batch}, {s.steps} steps "
            f"({s.warmup_steps} warm-up), model {s.model} ({result.n_params:,} parameters), seed {s.seed}.")


SECTIONS = (Section("header", header), Section("winners", winner_rows),
            Section("recommendations", recommendation_lines), Section("environment", environment),
            Section("strategies", strategies))
