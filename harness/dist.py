"""The process group and the device of one rank: joining the group, the backend a case needs,
synchronising the device around a clock read, gathering every rank's record, naming the node.

Used by the measured run (harness/train.py), its trace (harness/instruments/trace.py) and the collectives
probe (harness/collectives.py); it imports none of them.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from harness.spec import RunSpec


def setup(spec: RunSpec, local_rank: int) -> torch.device:
    """Pick this rank's device (LOCAL_RANK) and join the process group."""
    offload = "offload" in spec.variant_parts()
    if spec.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if device.type == "cpu" or offload:  # offload's optimizer steps on the CPU: torchrun set 1 thread
        threads = spec.threads_per_rank or max(1, (os.cpu_count() or 1) // spec.nproc_per_node)
        torch.set_num_threads(threads)
    if not dist.is_initialized():  # a warm rank (harness/pool.py) keeps its group from case to case
        dist.init_process_group(process_group_backend(spec), timeout=timedelta(minutes=10))
    return device


def process_group_backend(spec: RunSpec) -> str:
    """gloo on CPU; NCCL on CUDA, with gloo beside it for CPU tensors when the variant offloads:
    FSDP2's CPUOffloadPolicy keeps the sharded gradients on the CPU, so clip_grad_norm_'s norm is a
    CPU collective, which an NCCL-only group refuses ("No backend type associated with device type
    cpu"). torchtitan's init_distributed does the same ("cuda:nccl,cpu:gloo" with CPU offload)."""
    if spec.device != "cuda":
        return "gloo"
    return "cuda:nccl,cpu:gloo" if "offload" in spec.variant_parts() else "nccl"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (one collective, outside any timed region)."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def node_name() -> str:
    """The node this rank runs on, as the scheduler names it: Slurm's node name, the Kubernetes node
    (``LLMBENCH_NODE``, from the pod's spec.nodeName), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or os.environ.get("LLMBENCH_NODE") or socket.gethostname()
