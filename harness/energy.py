"""Energy over the measured steps, read from the hardware's own cumulative counter, never estimated.

- NVIDIA GPUs: NVML's total energy of the rank's device (``nvmlDeviceGetTotalEnergyConsumption``,
  mJ since the driver loaded; Volta and newer), through ``pynvml`` (the ``nvidia-ml-py`` package).
  One GPU per rank: every rank reads its own.
- CPUs: RAPL through the powercap sysfs (``/sys/class/powercap/intel-rapl:<N>/energy_uj``, one per
  package; AMD's RAPL appears under the same name), in µJ, wrapping at ``max_energy_range_uj``. A
  package counts every process on it, so one reader per host (local rank 0) and the figure is the
  host's (``scope`` "host"), the other ranks' readings say so.

Where no counter is readable (no pynvml, an older GPU, no powercap as on VMs, files readable only by
root since Linux 5.10) the reading has ``joules`` None and the reason; the metrics stay empty with it.
``LLMBENCH_POWERCAP_ROOT`` points the RAPL reader at another tree (tests give it one they control).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

POWERCAP_ENV = "LLMBENCH_POWERCAP_ROOT"
POWERCAP_ROOT = "/sys/class/powercap"
PACKAGE = re.compile(r"intel-rapl:\d+$")  # a package domain; its subzones (core, dram) are inside it
NOT_THIS_RANK = "the host's RAPL counter is read by local rank 0"


class Unreadable(Exception):
    """No counter for this rank; the message says why."""


class Rapl:
    """The summed package counters of this host, in µJ, with each domain's wrap-around range."""

    def __init__(self, root: Path) -> None:
        self.domains = sorted(p for p in root.glob("intel-rapl:*") if PACKAGE.match(p.name))
        if not self.domains:
            raise Unreadable(f"no RAPL package domain under {root} (no powercap driver: common on VMs)")
        try:
            self.ranges = [int((d / "max_energy_range_uj").read_text()) for d in self.domains]
            self.read()
        except PermissionError:
            raise Unreadable(f"{self.domains[0] / 'energy_uj'} is readable only by root (since Linux 5.10)"
                             ) from None
        except (OSError, ValueError) as exc:
            raise Unreadable(f"RAPL under {root} unreadable: {exc}") from None
        self.source = f"RAPL {', '.join(d.name for d in self.domains)} (the host's packages)"

    def read(self) -> list[int]:
        return [int((d / "energy_uj").read_text()) for d in self.domains]

    def joules(self, before: list[int], after: list[int]) -> float:
        """µJ between two readings, each domain taken modulo its range (it may have wrapped once)."""
        return sum((b - a) % (top + 1) for a, b, top in zip(before, after, self.ranges, strict=True)) / 1e6


class Nvml:
    """The rank's GPU total-energy counter in mJ."""

    def __init__(self, device_index: int) -> None:
        try:
            import pynvml
        except ImportError:
            raise Unreadable("pynvml is not installed (pip install nvidia-ml-py)") from None
        try:
            self.handle = nvml_handle(pynvml, device_index)
            self.nvml = pynvml
            self.read()
        except Exception as exc:  # NVMLError_NotSupported on pre-Volta GPUs, a driver without NVML, ...
            raise Unreadable(f"NVML total energy of GPU {device_index}: {exc}") from None
        self.source = f"NVML total energy, GPU {device_index}"

    def read(self) -> list[int]:
        return [int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))]

    def joules(self, before: list[int], after: list[int]) -> float:
        return (after[0] - before[0]) / 1e3


class Meter:
    """``start()`` before the first measured step, ``stop()`` after the last: ``reading()`` is this
    rank's {"joules", "source", "scope", "reason"}."""

    def __init__(self, device_type: str, local_rank: int, device_index: int = 0) -> None:
        self.counter: Rapl | Nvml | None = None
        self.scope: str | None = None
        self.reason: str | None = None
        self._before: list[int] | None = None
        self._joules: float | None = None
        try:
            if device_type == "cuda":
                self.counter, self.scope = Nvml(device_index), "device"
            elif local_rank == 0:
                self.counter, self.scope = Rapl(Path(os.environ.get(POWERCAP_ENV) or POWERCAP_ROOT)), "host"
            else:
                self.scope, self.reason = "host", NOT_THIS_RANK
        except Unreadable as exc:
            self.reason = str(exc)

    def start(self) -> None:
        if self.counter is not None:
            self._before = self.counter.read()

    def stop(self) -> None:
        if self.counter is not None and self._before is not None:
            self._joules = self.counter.joules(self._before, self.counter.read())

    def reading(self) -> dict[str, Any]:
        return {"joules": self._joules, "source": getattr(self.counter, "source", None), "scope": self.scope,
                "reason": self.reason if self._joules is None else None}


def total(readings: list[dict[str, Any]]) -> tuple[float | None, str]:
    """(joules over the measured steps, what they are) from every rank's reading: device counters
    summed over ranks; host counters summed over the ranks that read one (one per host). None with
    the reason when a reading that should exist is missing."""
    counted = [r for r in readings if r["joules"] is not None]
    missing = [r for r in readings if r["joules"] is None and r["reason"] != NOT_THIS_RANK]
    if missing or not counted:
        why = next((r["reason"] for r in missing or readings if r["reason"]), "no energy counter was read")
        return None, why
    scope = counted[0]["scope"]
    what = ("the GPUs' own counters, summed over ranks" if scope == "device"
            else f"{len(counted)} host(s)' CPU packages (every process on them, not only this run's)")
    return sum(r["joules"] for r in counted), f"{what}: {counted[0]['source']}"


def nvml_handle(pynvml, device_index: int):
    """NVML's handle of torch's CUDA device ``device_index``, found by its UUID: NVML's own indices
    ignore CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER, so device 0 of a rank given GPU 3 is not
    NVML's GPU 0."""
    import torch

    pynvml.nvmlInit()
    uuid = str(torch.cuda.get_device_properties(device_index).uuid)
    return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
