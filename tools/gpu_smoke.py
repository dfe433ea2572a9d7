"""The Python half of tools/gpu_smoke.sh: each step it cannot do in bash, one subcommand each.

    python tools/gpu_smoke.py versions              the stack's versions (JSON on stdout)
    python tools/gpu_smoke.py profile GPU_NAME      the CUDA profile whose parts include the GPU
    python tools/gpu_smoke.py spec PROFILE STRATEGY FILE   the profile's case at ws1 as the plugin builds it
    python tools/gpu_smoke.py device                the planner's part whose name pattern matches GPU 0
    python tools/gpu_smoke.py installed             exit 0 when the plugin is installed (its entry point)
    python tools/gpu_smoke.py summary OUT           measured beside predicted: OUT/summary.{txt,json}

``summary`` reads only files (each case's result.json, plan.json, torchrun.log), so it runs, and is
tested, on a machine without a GPU (tests/unit/test_gpu_smoke.py).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

GIB = 2**30
# NCCL's channel lines name the transport each peer pair uses: "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC".
# (The "NET/Socket" plugin line is printed whatever the transport, so it says nothing.)
CHANNEL = re.compile(r"Channel \d+/\d+ : \d+\[\d+\] -> \d+\[\d+\] via (\S+)")


def versions() -> dict:
    import importlib.metadata as md

    import torch

    def version(dist: str) -> str | None:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    ok = torch.cuda.is_available()
    return {"python": sys.version.split()[0], "executable": sys.executable, "torch": torch.__version__,
            "cuda": torch.version.cuda, "nccl": ".".join(map(str, torch.cuda.nccl.version())) if ok else None,
            "device": torch.cuda.get_device_name(0) if ok else None,
            "device_count": torch.cuda.device_count(),
            **{dist: version(dist) for dist in ("deepspeed", "transformers", "peft", "bitsandbytes",
                                                "nvidia-ml-py", "pytest", "pytest-benchmark", "triton")}}


def profile(gpu_name: str) -> str | None:
    """The built-in CUDA profile made for a GPU of this name (as ``pytest -m auto`` picks it), or None."""
    from pytest_llmbench.cases import host_profiles
    from pytest_llmbench.profiles import load_profiles

    profiles = load_profiles()
    found = host_profiles(profiles, [gpu_name]) if gpu_name.strip() else []
    # the smoke runs ddp and fsdp pre-training: of several (a10, a10-qlora), the one that has them
    found.sort(key=lambda name: (not {"ddp", "fsdp"} <= set(profiles[name].strategies),
                                 "pretrain" not in profiles[name].workloads))
    return found[0] if found else None


def spec(profile_name: str, strategy: str, path: str) -> str:
    from pytest_llmbench.cases import make_spec
    from pytest_llmbench.profiles import load_profiles

    profile = load_profiles()[profile_name]
    case = make_spec(profile, strategy, 1, max(profile.seq_lens))
    Path(path).write_text(case.dumps())
    return (f"{strategy}: {case.model} micro-batch {case.micro_batch} x accum {case.grad_accum}, seq "
            f"{case.seq_len}, {case.dtype}, {case.steps} steps ({case.warmup_steps} warm-up)")


def device(name: str | None = None) -> str | None:
    """The device table's part for the GPU's name (torch.cuda.get_device_name), None if none matches."""
    from harness.devices import DEVICES

    if name is None:
        import torch

        name = torch.cuda.get_device_name(0)
    hits = [key for key, part in DEVICES.items() if part.gpu_name and re.search(part.gpu_name, name)]
    return hits[0] if hits else None


def installed() -> bool:
    import importlib.metadata as md

    return any(ep.name == "llmbench" for ep in md.entry_points(group="pytest11"))


def summary(out: Path) -> dict:
    """Each case's measurement beside the planner's prediction of it, and NCCL's transports."""
    predicted = {}
    plan_file = out / "plan.json"
    if plan_file.is_file():
        try:
            for plan in json.loads(plan_file.read_text())["plans"]:
                at1 = plan["world_sizes"].get("1", {})
                predicted[plan["strategy"]] = {"step_s": at1.get("step_time_s"), "mfu": at1.get("mfu"),
                                               "memory_gib": (at1.get("total_bytes") or 0) / GIB or None,
                                               "terms_s": at1.get("terms_s")}
        except (ValueError, KeyError, TypeError) as exc:
            predicted = {"error": f"plan.json: {exc}"}
    cases = []
    for result_file in sorted(out.glob("cases/*/result.json")):
        cases.append(_case(result_file, predicted))
    for folder in sorted(p for p in out.glob("cases/*") if not (p / "result.json").is_file()):
        log = folder / "torchrun.log"
        tail = log.read_text(errors="replace").splitlines()[-15:] if log.is_file() else []
        cases.append({"case": folder.name, "status": "no result", "log_tail": tail})
    return {"cases": cases, "prediction_error": predicted.get("error")}


def _case(path: Path, predicted: dict) -> dict:
    r = json.loads(path.read_text())
    m = r.get("metrics") or {}
    mem = (r.get("memory_per_rank") or [{}])[0]
    row = {"case": path.parent.name, "status": r.get("status"), "error": (r.get("error") or "")[:600],
           "step_s": m.get("step_time_mean_s"), "mfu": m.get("mfu"), "peak_gib": m.get("peak_memory_gib"),
           "tokens_per_s": m.get("tokens_per_s"), "step_overhead": m.get("step_overhead"),
           "outside_allocator_gib": mem.get("outside_allocator_gib"),
           "loss_first": m.get("loss_first"), "loss_last": m.get("loss_last")}
    guess = predicted.get((r.get("spec") or {}).get("strategy"), {})
    row.update({f"predicted_{k}": v for k, v in guess.items()})
    if row["step_s"] and guess.get("step_s"):
        row["measured_over_predicted_step"] = row["step_s"] / guess["step_s"]
    if row["peak_gib"] and guess.get("memory_gib"):
        row["measured_over_predicted_memory"] = row["peak_gib"] / guess["memory_gib"]
    log = path.parent / "torchrun.log"
    if log.is_file():
        row["nccl_transports"] = sorted(set(CHANNEL.findall(log.read_text(errors="replace"))))
    return row


def summary_text(data: dict) -> str:
    def f(value, spec: str) -> str:
        return format(value, spec) if isinstance(value, (int, float)) else "-"

    lines = [f"{'case':<12}{'status':<10}{'step s':>9}{'pred s':>9}{'meas/pred':>10}{'MFU':>7}{'pred MFU':>9}"
             f"{'peak GiB':>9}{'pred GiB':>9}{'overhead':>9}  NCCL transports"]
    for c in data["cases"]:
        cells = [(c.get("step_s"), ".4f", 9), (c.get("predicted_step_s"), ".4f", 9),
                 (c.get("measured_over_predicted_step"), ".2f", 10), (c.get("mfu"), ".3f", 7),
                 (c.get("predicted_mfu"), ".3f", 9), (c.get("peak_gib"), ".2f", 9),
                 (c.get("predicted_memory_gib"), ".2f", 9), (c.get("step_overhead"), ".3f", 9)]
        transports = ", ".join(c.get("nccl_transports") or []) or "-"
        numbers = "".join(f"{f(v, s):>{w}}" for v, s, w in cells)
        lines.append(f"{c['case']:<12}{str(c['status']):<10}{numbers}  {transports}")
        if c.get("error") or c.get("log_tail"):
            lines.append("  " + (c.get("error") or "\n  ".join(c["log_tail"])))
    if data.get("prediction_error"):
        lines.append(data["prediction_error"])
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    command, *args = argv or ["help"]
    if command == "versions":
        print(json.dumps(versions(), indent=1))
    elif command == "profile" and len(args) == 1:
        print(profile(args[0]) or "")
    elif command == "spec" and len(args) == 3:
        print(spec(*args))
    elif command == "device":
        print(device() or "")
    elif command == "installed":
        return 0 if installed() else 1
    elif command == "summary" and len(args) == 1:
        out = Path(args[0])
        data = summary(out)
        (out / "summary.json").write_text(json.dumps(data, indent=1))
        text = summary_text(data)
        (out / "summary.txt").write_text(text + "\n")
        print(text)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
