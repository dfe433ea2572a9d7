"""What the run ran on: device, driver, library versions, host, commit."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
from typing import Any

import torch


def collect_env(device: torch.device, *, world_size: int, nnodes: int) -> dict[str, Any]:
    env: dict[str, Any] = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "deepspeed": _version("deepspeed"),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "world_size": world_size,
        "nnodes": nnodes,
        "git_commit": os.environ.get("LLMBENCH_GIT_COMMIT") or _git_commit(),
        "device_kind": device.type,
        "network_env": network_env(os.environ),
        "interfaces": _interfaces(),
    }
    if device.type == "cuda":
        env.update(
            device_name=torch.cuda.get_device_name(device),
            device_count=torch.cuda.device_count(),
            cuda=torch.version.cuda,
            nccl=".".join(map(str, torch.cuda.nccl.version())),
            driver=_nvidia_driver(),
        )
    else:
        env.update(device_name=env["cpu"], device_count=world_size)
    return env


# What chooses the ranks' network: NCCL's own settings, gloo's and the TCPStore's interface.
NETWORK_ENV_PREFIXES = ("NCCL_", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "MASTER_ADDR")


def network_env(environ) -> dict[str, str]:
    """The variables that chose this rank's interfaces and transports (NCCL_*, GLOO_SOCKET_IFNAME...),
    as the process ran with them: whichever of the profile and the shell set them."""
    return {k: environ[k] for k in sorted(environ) if k.startswith(NETWORK_ENV_PREFIXES)}


def _interfaces() -> list[str]:
    """This host's network interface names (what NCCL_SOCKET_IFNAME is matched against)."""
    try:
        return [name for _, name in socket.if_nameindex()]
    except OSError:
        return []


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=True)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _nvidia_driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlSystemGetDriverVersion()
    except Exception:  # noqa: BLE001 - NVML is optional; no driver info is not an error
        return None
