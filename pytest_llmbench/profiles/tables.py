"""A profile file's tables ([network], [lora], [env], [thresholds]), each checked where it is read: a bad
value is a ProfileError naming the file, the table and the key (the caller's ``bad``)."""

from __future__ import annotations

import fnmatch
import math
from typing import Any

from pytest_llmbench import launchers
from pytest_llmbench.launchers.k8s import values as k8s_values

_NETWORK = ("intra_node_busbw_gbps", "inter_node_busbw_gbps")


def finite(value: Any) -> bool:
    """A real number, finite (TOML allows nan and inf)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def parse_network(table: Any, bad) -> dict[str, float]:
    """``[network]``: the links' nominal bus bandwidth in GB/s, as declared by the vendor."""
    if not isinstance(table, dict):
        raise bad("network", "must be a table")
    out = {}
    for key, value in table.items():
        if key not in _NETWORK:
            raise bad(f"network.{key}", f"unknown key; known: {', '.join(_NETWORK)}")
        if not finite(value) or value <= 0:
            raise bad(f"network.{key}", f"{value!r} is not a positive number (GB/s)")
        out[key] = float(value)
    return out


_LORA = {"rank": int, "alpha": int, "dropout": float, "targets": list}


def parse_lora(table: Any, bad) -> dict[str, Any]:
    """``[lora]``: rank and alpha (positive integers), dropout in [0, 1), targets (module names)."""
    if not isinstance(table, dict):
        raise bad("lora", "must be a table")
    out: dict[str, Any] = {}
    for key, value in table.items():
        where = f"lora.{key}"
        if key not in _LORA:
            raise bad(where, f"unknown key; known: {', '.join(_LORA)}")
        if key in ("rank", "alpha") and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise bad(where, f"{value!r} is not a positive integer")
        if key == "dropout" and (isinstance(value, bool) or not isinstance(value, (int, float))
                                 or not 0 <= value < 1):
            raise bad(where, f"{value!r} is not a number in [0, 1)")
        if key == "targets":
            value = tuple(parse_list(value, str, lambda why, w=where: bad(w, why)))
        out[key] = float(value) if key == "dropout" else value
    return out


# Kubeflow Trainer injects these into a TrainJob's pods (harness/trainer_status.py): the token file's
# contents go to the URL as a bearer token, so only Trainer may name them, never a profile or env= file.
TRAINER_ENV = ("KUBEFLOW_TRAINER_SERVER_*",)


def parse_env(env: Any, bad) -> dict[str, str]:
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise bad("env", "must be a table of string values")
    owned = launchers.owned_env()
    for name, value in env.items():
        key = f"env.{k8s_values.toml_key(name)}"
        rule = k8s_values.env_name(name)
        if rule:
            raise bad(key, f"{name!r} {rule}")
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in owned):
            raise bad(key, f"{name} is set by the launchers for every rank ({', '.join(owned)}); a profile "
                           f"cannot override it")
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in TRAINER_ENV):
            raise bad(key, f"{name} is Kubeflow Trainer's to inject into a TrainJob's pods (the harness "
                           f"sends the token file's contents to its URL); a profile or env= file cannot "
                           f"set it")
        if "\x00" in value:
            raise bad(key, "the value holds a NUL character, which no process environment can carry")
    return dict(env)


def parse_thresholds(table: Any, bad) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise bad("thresholds", "must be a table")
    unknown = set(table) - {"max_peak_memory_gib", "min_scaling_efficiency", "min_busbw_gbps",
                            "launch_noise_cv", "memory_noise_cv"}
    if unknown:
        raise bad(f"thresholds.{sorted(unknown)[0]}", "unknown threshold; known: max_peak_memory_gib, "
                  "min_scaling_efficiency, min_busbw_gbps, launch_noise_cv, memory_noise_cv")
    out: dict[str, Any] = {}
    for key in ("launch_noise_cv", "memory_noise_cv"):
        noise = table.get(key)
        if noise is None:
            continue
        if isinstance(noise, bool) or not finite(noise) or not 0 < noise < 1:
            raise bad(f"thresholds.{key}", f"{noise!r} is not a coefficient of variation in (0, 1), "
                      f"e.g. 0.05 for 5% trial-to-trial")
        out[key] = float(noise)
    busbw = table.get("min_busbw_gbps")
    if busbw is not None:
        if not finite(busbw) or busbw <= 0:
            raise bad("thresholds.min_busbw_gbps", f"{busbw!r} is not a positive number (GB/s)")
        out["min_busbw_gbps"] = float(busbw)
    mem = table.get("max_peak_memory_gib")
    if mem is not None:
        if not finite(mem) or mem <= 0:
            raise bad("thresholds.max_peak_memory_gib", f"{mem!r} is not a positive number")
        out["max_peak_memory_gib"] = float(mem)
    eff: dict[int, float] = {}
    floors = table.get("min_scaling_efficiency", {})
    if not isinstance(floors, dict):
        raise bad("thresholds.min_scaling_efficiency", f"{floors!r} is not a table of world size = "
                  f"efficiency, e.g. {{ 2 = 0.9, 4 = 0.85 }}")
    for ws, value in floors.items():
        key = f"thresholds.min_scaling_efficiency.{ws}"
        if not str(ws).isdigit():
            raise bad(key, "world size keys must be integers")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1.5:
            raise bad(key, f"{value!r} is not an efficiency in (0, 1.5]")
        eff[int(ws)] = float(value)
    out["min_scaling_efficiency"] = eff
    return out


def parse_list(value: Any, kind: type, bad) -> tuple:
    if not isinstance(value, list) or not value:
        raise bad(f"{value!r} must be a non-empty list")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, kind) or (kind is int and item < 1):
            raise bad(f"item {item!r} is not a {'positive integer' if kind is int else 'string'}")
    twice = sorted({repr(item) for item in value if value.count(item) > 1})
    if twice:
        raise bad(f"{', '.join(twice)} listed more than once")
    return tuple(value)
