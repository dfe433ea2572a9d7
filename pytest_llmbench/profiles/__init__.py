"""Hardware profiles: what to run on a kind of machine, and the thresholds to hold it to.

Built-in profiles are the ``*.toml`` files beside this module (cpu, a10, a100, h100,
h200); ``--llmbench-profile-file`` adds a user's own or replaces a built-in of the same
name (the file's stem is the profile name and its pytest marker). Every key is checked
on load; an error names the file and the key.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import strategies
from harness.spec import (
    DEVICES,
    DTYPES,
    MODEL_PRESETS,
    SCALINGS,
    WORKLOADS,
    SpecError,
    parse_variant,
)
from pytest_llmbench import launchers
from pytest_llmbench.profiles import tables as tables_
from pytest_llmbench.profiles.tables import finite, parse_list

BUILTIN_DIR = Path(__file__).resolve().parent


class ProfileError(ValueError):
    """A profile file is invalid; the message names the file and the key."""


@dataclass(frozen=True)
class Profile:
    name: str
    source: str
    description: str
    device: str
    dtype: str
    model: str
    micro_batch: int
    grad_accum: int
    steps: int
    warmup_steps: int
    strategies: tuple[str, ...]
    world_sizes: tuple[int, ...]
    seq_lens: tuple[int, ...]
    parts: tuple[str, ...] = ()  # cuda: rows of the device table (harness/devices.py) this profile is for
    device_names: tuple[str, ...] = ()  # cuda, a part not in the table: regexes matched against the GPU name
    baseline_world_size: int = 1
    devices_per_node: int = 0  # 0: all ranks on one host
    threads_per_rank: int = 0
    usd_per_device_hour: float | None = None
    timeout_s: float = 1800.0
    lr: float = 3e-4
    data_pool: int = 256
    compute_probe_steps: int = 3
    trials: int = 1  # launches of each case (--llmbench-trials overrides)
    variants: tuple[str, ...] = ("base",)  # strategies.VARIANTS parts joined by "+" (--variant overrides)
    workloads: tuple[str, ...] = ("pretrain",)  # harness.spec.WORKLOADS (--workload overrides)
    lora: dict[str, Any] = field(default_factory=dict)  # [lora] rank, alpha, dropout, targets
    markers: tuple[str, ...] = ()  # extra pytest markers of its cases, e.g. a10-qlora's "a10"
    env: dict[str, str] = field(default_factory=dict)
    max_peak_memory_gib: float | None = None
    min_scaling_efficiency: dict[int, float] = field(default_factory=dict)
    min_busbw_gbps: float | None = None  # every collective's busbw at the probe's largest size
    # trial-to-trial cv of a case's throughput, the spread the gate and the scaling floor assume
    # where no side has two trials (gate_rules.gate): a single run is never failed within it
    launch_noise_cv: float = 0.05
    # trial-to-trial cv of a case's peak memory, the spread the memory budget assumes with one trial
    # (CPU RSS moved 0.03-0.56% over three trials here; CUDA allocator peaks move less)
    memory_noise_cv: float = 0.01
    launch: dict[str, dict[str, Any]] = field(default_factory=dict)  # launcher name -> its profile table
    # the collectives probe: a case per world size of 2 and up, sizes 8 B to collectives_max_bytes
    collectives: bool = True
    collectives_max_bytes: int = 2**20
    # weak: the per-device batch stays (micro_batch x grad_accum); strong: global_batch_tokens stays
    scaling: str = "weak"
    global_batch_tokens: int = 0
    # projection and memory planner (report): where to project, the links' nominal busbw in GB/s
    # (labelled "declared" wherever used), the device memory and the models to plan for
    project_world_sizes: tuple[int, ...] = (8, 16, 32, 64, 128, 256)
    network: dict[str, float] = field(default_factory=dict)
    device_memory_gib: float | None = None
    plan_models: tuple[str, ...] = ()  # presets; () = the profile's own model

    def runs_on(self, gpu_name: str) -> bool:
        """Whether this profile is for a GPU of this name (as nvidia-smi reports it): the device table's
        one name-to-part function (devices.by_gpu_name) names one of its ``parts``; or, for a GPU the
        table does not hold, one of its ``device_names`` patterns matches."""
        from harness import devices

        part = devices.by_gpu_name(gpu_name)
        if part is not None and part.name in self.parts:
            return True
        return any(re.search(pattern, gpu_name, re.IGNORECASE) for pattern in self.device_names)

    @property
    def memory_gib(self) -> float | None:
        """The device memory a plan is held to: the stated ``device_memory_gib``, else the smallest of
        its parts' (the driver's figure, harness/devices.py), else None."""
        return parts_memory_gib(self.device_memory_gib, self.parts)

    def nnodes(self, world_size: int) -> int:
        if self.devices_per_node == 0 or world_size <= self.devices_per_node:
            return 1
        return -(-world_size // self.devices_per_node)


_INT = {"micro_batch", "grad_accum", "steps", "warmup_steps", "baseline_world_size",
        "devices_per_node", "threads_per_rank", "data_pool", "compute_probe_steps", "trials",
        "collectives_max_bytes", "global_batch_tokens"}
_FLOAT = {"usd_per_device_hour", "timeout_s", "lr", "device_memory_gib"}
_POSITIVE = {"timeout_s", "lr", "device_memory_gib"}  # 0 is meaningless for these
PROFILE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")  # a file's stem: the profile's name and marker
_STR = {"description", "device", "dtype", "model", "workload", "scaling"}
_BOOL = {"collectives"}
_LISTS = {"strategies": str, "world_sizes": int, "seq_lens": int, "device_names": str, "parts": str,
          "variants": str,
          "workloads": str, "markers": str, "project_world_sizes": int, "plan_models": str}
# Trials of one case: enough for a 10% drop at 5% noise with 80% power (about 40 a side), and a
# bound on what a typo (--llmbench-trials 100000) would collect and run.
MAX_TRIALS = 100
_TABLES = {"env", "thresholds", "lora", "network"}  # and each launcher's own table (launcher_tables)
_CHOICES = {"device": DEVICES, "dtype": DTYPES, "model": tuple(MODEL_PRESETS), "scaling": SCALINGS}


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    if not PROFILE_NAME.fullmatch(path.stem):
        raise ProfileError(f"profile file {path}: its name {path.stem!r} becomes the profile's name, marker "
                           f"and case ids: use letters, digits, _ and -, starting with a letter")
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise ProfileError(f"profile file {path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ProfileError(f"profile file {path}: not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"profile file {path}: not valid TOML: {exc}") from None
    return parse_profile(path.stem, data, source=str(path))


def parse_profile(name: str, data: dict[str, Any], *, source: str) -> Profile:
    def bad(key: str, why: str) -> ProfileError:
        return ProfileError(f"profile file {source}: key {key!r}: {why}")

    tables = launcher_tables()
    known = _INT | _FLOAT | _STR | _BOOL | set(_LISTS) | _TABLES | set(tables)
    for key in data:
        if key not in known:
            raise bad(key, f"unknown key; known keys: {', '.join(sorted(known))}")
    for key in ("device", "dtype", "model", "micro_batch", "grad_accum", "steps", "warmup_steps",
                "strategies", "world_sizes", "seq_lens"):
        if key not in data:
            raise bad(key, "required key is missing")
    kwargs: dict[str, Any] = {"name": name, "source": source}
    for key, value in data.items():
        if key not in _TABLES and key not in tables:
            kwargs[key] = _scalar(key, value, bad)
    for strategy in kwargs["strategies"]:
        if strategy not in strategies.names():
            raise bad("strategies", f"unknown strategy {strategy!r}; choose from "
                                    f"{', '.join(strategies.names())}")
    _check_device_names(kwargs, bad)
    _parse_workloads(kwargs, bad)
    for marker in kwargs.get("markers", ()):
        if not re.fullmatch(r"[A-Za-z_][\w-]*", marker):
            raise bad("markers", f"{marker!r} is not a marker name (letters, digits, _ and -)")
    kwargs["lora"] = tables_.parse_lora(data.get("lora", {}), bad)
    for variant in kwargs.get("variants", ()):
        try:
            parse_variant(variant)
        except SpecError as exc:
            raise bad("variants", str(exc).removeprefix("variant: ")) from None
    if not 1 <= kwargs.get("trials", 1) <= MAX_TRIALS:
        raise bad("trials", f"{kwargs['trials']} must be from 1 to {MAX_TRIALS}")
    if kwargs["steps"] <= kwargs["warmup_steps"]:
        raise bad("steps", f"{kwargs['steps']} must be greater than warmup_steps")
    kwargs["env"] = tables_.parse_env(data.get("env", {}), bad)
    kwargs.update(tables_.parse_thresholds(data.get("thresholds", {}), bad))
    budget = kwargs.get("max_peak_memory_gib")
    device = parts_memory_gib(kwargs.get("device_memory_gib"), kwargs.get("parts", ()))
    if budget is not None and device is not None and budget >= device:
        raise bad("thresholds.max_peak_memory_gib",
                  f"{budget:g} GiB is not below the device's {device:.1f} GiB (device_memory_gib, else its "
                  f"parts'): no run's peak exceeds the "
                  "device's memory, so this threshold could never fail")
    kwargs["launch"] = {name: parse(data.get(table, {}), bad) for table, (name, parse) in tables.items()}
    kwargs["network"] = tables_.parse_network(data.get("network", {}), bad)
    _check_scaling(kwargs, bad)
    for model in kwargs.get("plan_models", ()):
        if model not in MODEL_PRESETS:
            raise bad("plan_models", f"unknown model preset {model!r}; known: {', '.join(MODEL_PRESETS)}")
    kwargs.setdefault("description", name)
    return Profile(**kwargs)


def _scalar(key: str, value: Any, bad) -> Any:
    """A top-level key's value, checked by its kind (_INT, _FLOAT, _STR, _BOOL, _LISTS)."""
    if key in _INT:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad(key, f"{value!r} is not a non-negative integer")
    elif key in _FLOAT:
        if not finite(value) or value < 0 or (key in _POSITIVE and value == 0):
            sign = "positive" if key in _POSITIVE else "non-negative"
            raise bad(key, f"{value!r} is not a finite {sign} number")
        value = float(value)
    elif key in _STR:
        if not isinstance(value, str):
            raise bad(key, f"{value!r} is not a string")
        if key in _CHOICES and value not in _CHOICES[key]:
            raise bad(key, f"{value!r} is not one of {', '.join(_CHOICES[key])}")
    elif key in _BOOL:
        if not isinstance(value, bool):
            raise bad(key, f"{value!r} is not true or false")
    elif key in _LISTS:
        value = parse_list(value, _LISTS[key], lambda why: bad(key, why))
    return value


def _check_scaling(kwargs: dict[str, Any], bad) -> None:
    """strong scaling needs global_batch_tokens (the batch every world size splits); weak has none."""
    strong = kwargs.get("scaling") == "strong"
    if strong and not kwargs.get("global_batch_tokens"):
        raise bad("global_batch_tokens", 'required for scaling = "strong": the global batch in tokens that '
                                         'every world size splits into micro-batches')
    if not strong and kwargs.get("global_batch_tokens"):
        raise bad("global_batch_tokens", 'only for scaling = "strong" (weak scaling keeps the per-device '
                                         'batch, micro_batch x grad_accum)')


def _parse_workloads(kwargs: dict[str, Any], bad) -> None:
    """``workloads = [...]``, or ``workload = "qlora"`` for one; each a harness.spec.WORKLOADS name."""
    key = "workload" if "workload" in kwargs else "workloads"
    if "workload" in kwargs:
        if "workloads" in kwargs:
            raise bad("workload", "give workload (one) or workloads (a list), not both")
        kwargs["workloads"] = (kwargs.pop("workload"),)
    for workload in kwargs.get("workloads", ()):
        if workload not in WORKLOADS:
            raise bad(key, f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
    if set(kwargs.get("workloads", ())) - {"pretrain"} and MODEL_PRESETS[kwargs["model"]]["arch"] == "gpt":
        raise bad(key, f"lora and qlora fine-tune a Hugging Face architecture (a llama, mistral or qwen2 "
                       f"preset, e.g. tiny-mistral); model {kwargs['model']!r} is the GPT pre-training model")


def parts_memory_gib(stated: float | None, parts: tuple[str, ...]) -> float | None:
    """``device_memory_gib`` where stated, else the smallest memory of the parts (devices.py), else None."""
    from harness import devices

    if stated is not None or not parts:
        return stated
    return min(devices.DEVICES[name].memory_gib for name in parts)


def _check_device_names(kwargs: dict[str, Any], bad) -> None:
    from harness import devices

    names, parts = kwargs.get("device_names", ()), kwargs.get("parts", ())
    if kwargs["device"] == "cuda" and not names and not parts:
        raise bad("parts", "required for device = \"cuda\": the device table's parts this profile is for, "
                  f"e.g. [\"a10\"] (known: {', '.join(devices.DEVICES)}); for a GPU the table does not hold, "
                  "device_names: regular expressions matched against the name the driver reports")
    for key, given in (("parts", parts), ("device_names", names)):
        if kwargs["device"] != "cuda" and given:
            raise bad(key, f"only for device = \"cuda\" (this profile is {kwargs['device']!r})")
    for part in parts:
        if part not in devices.DEVICES:
            raise bad("parts", f"{part!r} is not a part of the device table; known: "
                               f"{', '.join(devices.DEVICES)}")
    for pattern in names:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise bad("device_names", f"{pattern!r} is not a regular expression: {exc}") from None


def launcher_tables() -> dict[str, tuple[str, Any]]:
    """{profile table: (launcher name, its parser)} of every registered launcher that reads one."""
    return {kind.profile_table: (name, kind.parse_table) for name, kind in launchers.kinds().items()
            if kind.profile_table and kind.parse_table}


def load_profiles(extra_files: list[str] | tuple[str, ...] = ()) -> dict[str, Profile]:
    """Built-in profiles, then the user's files (a same-named file replaces a built-in)."""
    profiles = {p.stem: load_profile(p) for p in sorted(BUILTIN_DIR.glob("*.toml"))}
    for file in extra_files:
        profile = load_profile(file)
        profiles[profile.name] = profile
    return profiles
