"""What a result ran on, read from its stored environment: the machine (``machine``: device part,
devices or cores a node, nodes, runner label) and the hardware the history keys its series by
(``hardware``: the machine with Python and torch). Never the hostname, which a pod or a batch job gets
anew each session. Standard library only: the gates read it on every case.
"""

from __future__ import annotations


def machine(env: dict) -> str:
    """What a result ran on, without its software: the device part as its driver names it, devices per
    node (cores for a CPU case), nodes and the runner label (--llmbench-runner). A stored session
    measured on another machine is not a baseline for this one (pytest_llmbench/compare_gate.py)."""
    return ", ".join(_parts(env))


def hardware(env: dict) -> str:
    """What a result ran on, as the history keys it: ``machine`` with Python and torch. Not the
    hostname, which a pod or a batch job gets anew each session."""
    return ", ".join(_parts(env, software=True))


def _parts(env: dict, software: bool = False) -> list[str]:
    cuda = env.get("device_kind") == "cuda"
    per_node = f"{env.get('device_count')} per node" if cuda else f"{env.get('cpu_count')} cores"
    parts = [str(env.get("device_name") or env.get("cpu") or "?"), per_node,
             f"{env.get('nnodes') or 1} node(s)"]
    if software:
        parts += [f"python {env.get('python') or '?'}", f"torch {env.get('torch') or '?'}"]
    return parts + ([f"runner {env['runner']}"] if env.get("runner") else [])
