"""Fault injection for the launchers' tests: ``LLMBENCH_FAULT=<rank>:<kind>[,<rank>:<kind>...]``.

kind: ``raise`` (RuntimeError), ``oom`` (torch.OutOfMemoryError), ``hang`` (sleep
forever), ``stop`` (SIGSTOP to itself: frozen, deaf to SIGTERM), ``sigkill`` (SIGKILL to
itself, as an operator, a preemption or a watchdog would send), ``exit`` (os._exit(3), no
traceback). Triggered on that rank just before the
first training step, so every failure path of every launcher can be exercised with the
real harness; a comma list injects one fault per rank it names (``0:hang,1:stop``: one launch
that times out with a sleeping and a frozen rank). Unset in normal runs: then this does nothing.

``LLMBENCH_SLOWDOWN=<fraction>`` makes every timed step that much slower (0.25: each step sleeps a
quarter of its own time before its clock stops, so tokens/s falls by 1 - 1/1.25 = 20%): a known
regression for testing the regression gate end to end. ``LLMBENCH_SLOWDOWN=<rank>:<fraction>``
slows that rank only: a known straggler. Unset: no effect.

``LLMBENCH_RECOMPILE_AT=<step>`` (1-based) drops dynamo's compiled code before that step of a
compiled case (torch._dynamo.reset()), so it compiles again there: a known recompile inside the
measured steps, for the test that the result records and names one.
"""

from __future__ import annotations

import os
import signal
import time


def recompile_at(step: int) -> None:
    """Before 0-based ``step``: drop dynamo's compiled code when ``LLMBENCH_RECOMPILE_AT`` names it."""
    if os.environ.get("LLMBENCH_RECOMPILE_AT", "") == str(step + 1):
        import torch._dynamo

        torch._dynamo.reset()


def slowdown(rank: int) -> float:
    """The fraction of its own time each of this rank's timed steps sleeps (``LLMBENCH_SLOWDOWN``),
    0 when unset or when it names another rank."""
    value = os.environ.get("LLMBENCH_SLOWDOWN", "")
    target, _, text = value.rpartition(":")
    try:
        fraction = float(text) if text else 0.0
    except ValueError:
        fraction = -1.0
    if not 0 <= fraction <= 10 or (target and not target.isdigit()):
        raise ValueError(f"LLMBENCH_SLOWDOWN={value!r}: [<rank>:]<fraction>, a fraction of the step "
                         f"time between 0 and 10")
    return fraction if not target or int(target) == rank else 0.0


def maybe_inject(rank: int) -> None:
    value = os.environ.get("LLMBENCH_FAULT", "")
    kinds = [kind for target, _, kind in (item.partition(":") for item in value.split(",") if item)
             if target.isdigit() and int(target) == rank]
    if not kinds:
        return
    kind = kinds[0]
    print(f"llmbench fault injected on rank {rank}: {kind}", flush=True)
    if kind == "raise":
        raise RuntimeError(f"injected failure on rank {rank}")
    if kind == "oom":
        import torch

        raise torch.OutOfMemoryError(f"injected out of memory on rank {rank}")
    if kind == "hang":
        while True:
            time.sleep(60)
    if kind in ("stop", "sigkill"):
        os.kill(os.getpid(), signal.SIGSTOP if kind == "stop" else signal.SIGKILL)
        while True:  # SIGSTOP: resumed only to be killed
            time.sleep(60)
    if kind == "exit":
        os._exit(3)
    raise ValueError(f"LLMBENCH_FAULT={value!r}: unknown kind {kind!r} "
                     f"(raise, oom, hang, stop, sigkill, exit)")
