"""A look inside a few steps: ``torch.profiler`` on every rank, a Chrome trace per rank, and from
each trace the time a step spends computing, communicating, communicating under compute, and idle.

    record(run)   after the measured steps (traced steps are never measured steps): one profiler
                  warm-up step, then ``run.steps`` steps, each inside a ``llmbench.step`` range;
                  the trace is written to ``<case folder>/trace/rank<R>.json`` and analysed there.
    analyse(...)  the Chrome trace's events -> per-step seconds (standard library only).
    derive(...)   the traced steps' shares, mean over ranks: the trace_* metric rows.

What counts as what, per traced step (the ``llmbench.step`` range on the training thread; its
``gpu_user_annotation`` copies on CUDA streams are not steps):

- communication: on CUDA the NCCL kernels (``nccl`` in the kernel's name); on CPU/gloo the
  ``gloo:<op>`` ranges, which the profiler records on gloo's own worker threads from the moment
  the collective starts running until it is done (the ``c10d::<op>_`` op on the training thread
  only queues it and is not counted).
- compute: on CUDA every other kernel; on CPU the ``aten::`` ops of the training thread (nested
  ops counted once). Python between ops, hooks and waiting are not compute.
- hidden communication: communication while compute runs (the intersection of the two);
  exposed communication = communication - hidden: what the step waits for.
- idle: the step less the union of compute and communication (CUDA: no kernel running; CPU: the
  training thread in Python, in a hook or blocked, with no collective in flight).

The same split as Holistic Trace Analysis' ``get_comm_comp_overlap`` and temporal breakdown (which
read GPU kernels only); here it also reads CPU traces. On CPU, gloo's threads share the cores with
the compute threads: a collective "hidden" under compute still takes CPU from it.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

STEP_RANGE = "llmbench.step"
TOP_OPS = 10
Interval = tuple[float, float]


def record(run: Any) -> dict:
    """Trace ``run.steps`` steps (after one profiler warm-up step) of ``run.engine`` on this rank;
    the trace at ``<run.out_dir>/trace/rank<rank>.json`` and its analysis as a dict (``analyse``
    plus ``file``, ``top_ops`` and ``activities``). ``run``: the Run of harness/instruments/__init__.py."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from harness.dist import synchronize
    from harness.parallel.engine import train_step

    engine, device, traced = run.engine, run.device, run.steps
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    steps = run.step_batches(traced + 1)
    path = Path(run.out_dir) / "trace" / f"rank{run.rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    plan = schedule(wait=0, warmup=1, active=traced, repeat=1)
    with profile(activities=activities, schedule=plan,
                 on_trace_ready=lambda done: done.export_chrome_trace(str(path))) as prof:
        for micro_batches in steps:
            synchronize(device)
            with record_function(STEP_RANGE):
                train_step(engine, micro_batches)
                synchronize(device)
            prof.step()
    on_cuda = device.type == "cuda"
    with open(path) as handle:
        found = analyse(json.load(handle)["traceEvents"], cuda=on_cuda)
    key = "self_device_time_total" if on_cuda else "self_cpu_time_total"
    ours = (e for e in prof.key_averages() if e.key != STEP_RANGE and not e.key.startswith("ProfilerStep"))
    ops = sorted(ours, key=lambda e: getattr(e, key), reverse=True)[:TOP_OPS]
    found["top_ops"] = [{"name": e.key, "calls_per_step": e.count / traced,
                         "self_s_per_step": getattr(e, key) / 1e6 / traced} for e in ops]
    found["top_ops_by"] = "self device time" if on_cuda else "self CPU time"
    found["file"] = str(path)
    found["torch"] = torch.__version__
    return found


# metric row -> the analysis' share it is the mean over ranks of
SHARES = {"trace_exposed_comm": "exposed_comm_share", "trace_comm_hidden": "hidden_comm_share",
          "trace_idle": "idle_share"}


def derive(payloads: list[dict]) -> dict[str, float | None]:
    """The traced steps' shares, mean over ranks; None where no rank was traced (or, for
    trace_comm_hidden, where nothing was communicated)."""
    out: dict[str, float | None] = {}
    for metric, key in SHARES.items():
        values = [p[key] for p in payloads if p and p.get(key) is not None]
        out[metric] = statistics.fmean(values) if values else None
    return out


def analyse(events: Iterable[dict], *, cuda: bool) -> dict[str, Any]:
    """Per traced step, seconds of step, compute, comm, hidden comm, exposed comm and idle (see the
    module's definitions), and their means over the steps. ``events``: a Chrome trace's
    ``traceEvents`` as torch.profiler writes them (complete events: ts and dur in microseconds)."""
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    # the range on the training thread (cat "user_annotation"); on CUDA, Kineto also writes
    # "gpu_user_annotation" copies of it, one per stream that ran kernels inside it (partial, and
    # not steps: torch/profiler/_cupti_monitor_trace.py's _gpu_user_annotation_events)
    windows = sorted((e["ts"], e["ts"] + e["dur"], e["tid"]) for e in spans
                     if e.get("name") == STEP_RANGE and e.get("cat") == "user_annotation")
    if not windows:
        raise ValueError(f"no {STEP_RANGE!r} range in the trace: nothing to analyse")
    main_tids = {tid for _, _, tid in windows}
    comm, compute = [], []
    for e in spans:
        name, cat = str(e.get("name", "")), e.get("cat", "")
        span = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        if cuda:
            if cat == "kernel":
                (comm if "nccl" in name.lower() else compute).append(span)
        elif name.startswith("gloo:"):
            comm.append(span)
        elif cat == "cpu_op" and name.startswith("aten::") and e.get("tid") in main_tids:
            compute.append(span)
    comm_u, compute_u = union(comm), union(compute)
    steps = []
    for start, end, _ in windows:
        window = [(start, end)]
        c, m = intersect(compute_u, window), intersect(comm_u, window)
        hidden = length(intersect(c, m))
        busy = length(union(c + m))
        seconds = {"step_s": end - start, "compute_s": length(c), "comm_s": length(m),
                   "hidden_comm_s": hidden, "exposed_comm_s": length(m) - hidden,
                   "idle_s": (end - start) - busy}
        steps.append({k: v / 1e6 for k, v in seconds.items()})
    mean = {k: sum(s[k] for s in steps) / len(steps) for k in steps[0]}
    return {"steps": steps, **mean,
            "hidden_comm_share": mean["hidden_comm_s"] / mean["comm_s"] if mean["comm_s"] > 0 else None,
            "exposed_comm_share": mean["exposed_comm_s"] / mean["step_s"],
            "idle_share": mean["idle_s"] / mean["step_s"],
            "comm_source": "NCCL kernels" if cuda else "gloo:<op> ranges on gloo's threads"}


def union(spans: list[Interval]) -> list[Interval]:
    """Sorted, non-overlapping intervals covering exactly ``spans``."""
    out: list[Interval] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """The intersection of two unions (each sorted and non-overlapping)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def length(spans: list[Interval]) -> float:
    return sum(end - start for start, end in spans)
