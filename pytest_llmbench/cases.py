"""The benchmark matrix: profile x workload x strategy x variant x world size x sequence length
(x trial) -> Case."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from itertools import product
from typing import Any, TypeVar

from harness.identity import case_id
from harness.spec import RunSpec, SpecError
from pytest_llmbench import launchers
from pytest_llmbench.launchers import LauncherKind
from pytest_llmbench.profiles import Profile
from pytest_llmbench.settings import Settings, asked_instruments

T = TypeVar("T")
GPU_LINE = re.compile(r"GPU \d+: (.+?)(?: \(UUID: [^)]*\))?$")  # a line of nvidia-smi -L


@dataclass(frozen=True)
class Case:
    profile: Profile
    spec: RunSpec
    trial: int = 1  # which launch of the case (1-based)
    trials: int = 1  # how many launches the session plans

    @property
    def name(self) -> str:
        """The case without its trial, e.g. ``a10-zero2-ws4-seq2048``, ``a10-qlora-qlora-ddp-ws4-seq512``:
        what trials share."""
        return f"{self.profile.name}-{self.spec.case_id}"

    @property
    def id(self) -> str:
        """Readable test id: the name, plus ``-trial2`` when the case runs more than once."""
        return self.name + (f"-trial{self.trial}" if self.trials > 1 else "")

    @property
    def label(self) -> str:
        """For progress lines: ``a10-zero2-ws4-seq2048 trial 2/3``."""
        return self.name + (f" trial {self.trial}/{self.trials}" if self.trials > 1 else "")

    @property
    def group(self) -> str:
        """Cases that share a scaling baseline (RunSpec.scaling_identity) in this profile."""
        return self.profile.name + self.spec.scaling_identity()

    def at_world_size(self, world_size: int) -> Case:
        """The same case at another world size (RunSpec.at_world_size: every other axis kept)."""
        if self.spec.benchmark == "collectives":
            return Case(self.profile, make_probe_spec(self.profile, world_size), self.trial, self.trials)
        micro_batch, grad_accum = batch_split(self.profile, world_size, self.spec.seq_len)
        spec = self.spec.at_world_size(world_size, nnodes=self.profile.nnodes(world_size),
                                       micro_batch=micro_batch, grad_accum=grad_accum)
        return Case(self.profile, spec, self.trial, self.trials)

    def at_trial(self, trial: int) -> Case:
        return Case(self.profile, self.spec, trial, max(trial, self.trials))


def make_spec(profile: Profile, strategy: str, world_size: int, seq_len: int, *,
              steps: int | None = None, variant: str = "base", workload: str = "pretrain",
              instruments: dict[str, int] | None = None) -> RunSpec:
    lora = {f"lora_{key}": value for key, value in profile.lora.items()}
    micro_batch, grad_accum = batch_split(profile, world_size, seq_len)
    spec = RunSpec.from_preset(
        profile.model, seq_len=seq_len, strategy=strategy, world_size=world_size,
        nnodes=profile.nnodes(world_size), device=profile.device, dtype=profile.dtype,
        micro_batch=micro_batch, grad_accum=grad_accum, scaling=profile.scaling,
        steps=steps or profile.steps, warmup_steps=profile.warmup_steps,
        threads_per_rank=profile.threads_per_rank, lr=profile.lr, data_pool=profile.data_pool,
        compute_probe_steps=profile.compute_probe_steps, instruments=instruments or {}, variant=variant,
        workload=workload, **lora)
    problem = spec.depth_problem()
    if problem:
        raise SpecError(problem)
    return spec


def batch_split(profile: Profile, world_size: int, seq_len: int) -> tuple[int, int]:
    """(micro_batch, grad_accum) of each rank. Weak scaling: the profile's. Strong scaling: the
    global batch split evenly over the ranks, in micro-batches as large as the profile's
    micro_batch allows (the largest divisor of the rank's share not above it)."""
    if profile.scaling == "weak":
        return profile.micro_batch, profile.grad_accum
    tokens = profile.global_batch_tokens
    where = f"global_batch_tokens = {tokens} (profile {profile.source})"
    if tokens % seq_len:
        raise SpecError(f"{where} is not a whole number of sequences of seq_len {seq_len}")
    sequences = tokens // seq_len
    if sequences % world_size:
        raise SpecError(f"{where}: its {sequences} sequences of {seq_len} tokens do not split evenly "
                        f"over world_size {world_size}")
    share = sequences // world_size
    micro = max(d for d in range(1, min(profile.micro_batch, share) + 1) if share % d == 0)
    return micro, share // micro


def make_probe_spec(profile: Profile, world_size: int) -> RunSpec:
    """The collectives probe of a profile at a world size (harness/collectives.py)."""
    return RunSpec(benchmark="collectives", world_size=world_size, nnodes=profile.nnodes(world_size),
                   device=profile.device, threads_per_rank=profile.threads_per_rank,
                   comm_max_bytes=profile.collectives_max_bytes)


@dataclass(frozen=True)
class InvalidCase:
    """A case that the options make invalid for its profile (e.g. ``--llmbench-steps`` not above
    that profile's warm-up). It is an error only if it is selected: ``-m cpu --llmbench-steps=6``
    must not fail on the a10 profile's 10 warm-up steps."""

    profile: Profile
    id: str
    problem: str
    workload: str = "pretrain"


def build_cases(profiles: dict[str, Profile], settings: Settings) -> list[Case | InvalidCase]:
    """Every case of every profile, narrowed by --workload/--strategy/--variant/--world-size/--seq-len,
    once per trial (--llmbench-trials, else the profile's ``trials``). ``interleave`` orders the trials."""
    cases: list[Case | InvalidCase] = []
    for profile in profiles.values():
        # A/B: one test per case, whose rounds run both sides (gates.ab_rounds)
        trials = 1 if settings.values.get("ab") else settings.trials or profile.trials
        for workload, strategy, variant in product(settings.workload or profile.workloads,
                                                   settings.strategy or profile.strategies,
                                                   settings.variant or profile.variants):
            for world_size in sorted(settings.world_size or profile.world_sizes):
                for seq_len in settings.seq_len or profile.seq_lens:
                    try:
                        spec = make_spec(profile, strategy, world_size, seq_len, steps=settings.steps,
                                         variant=variant, workload=workload,
                                         instruments=asked_instruments(settings))
                    except SpecError as exc:
                        name = case_id(strategy=strategy, world_size=world_size, seq_len=seq_len,
                                       variant=variant, workload=workload)
                        cases.append(InvalidCase(profile, f"{profile.name}-{name}", str(exc), workload))
                        continue
                    cases.extend(Case(profile, spec, trial, trials) for trial in range(1, trials + 1))
        cases += probe_cases(profile, settings)
    return cases


def probe_cases(profile: Profile, settings: Settings) -> list[Case]:
    """The profile's collectives probe at each of its world sizes from 2 up (narrowed by
    --world-size; it has no strategy, sequence length, workload or variant). One trial."""
    if not profile.collectives:
        return []
    sizes = sorted(ws for ws in settings.world_size or profile.world_sizes if ws >= 2)
    return [Case(profile, make_probe_spec(profile, ws)) for ws in sizes]


def interleave(items: list[T], case_of: Callable[[T], Any] = lambda item: item) -> list[T]:
    """Trials in rounds: trial 1 of every case, then trial 2, ... so that slow drift of the
    machine hits every strategy alike. The groups (cases sharing a scaling baseline) run in the
    order ``round_orders`` gives each round, so that each group's mean slot within a round is the
    same over the session (a linear drift adds the same to every group). Within a group the world
    sizes run from the baseline up, except in the rounds ``baseline_last`` names, where they run
    from the top down to the baseline, so that the scaled case runs after its baseline in one round
    and before it in the next and the drift cancels in the paired efficiency too.
    Items whose case is not a Case (other tests, invalid cases) keep their places."""
    cases = {id(item): case for item in items if isinstance(case := case_of(item), Case)}
    if not cases:
        return items
    groups = list(dict.fromkeys(c.group for c in cases.values()))
    orders = round_orders(len(groups), max(c.trials for c in cases.values()))
    slot = {(k, groups[g]): place for k, order in enumerate(orders, 1) for place, g in enumerate(order)}
    down = baseline_last(list(cases.values()))

    def key(item: T) -> tuple:
        case = cases[id(item)]
        ws, base = case.spec.world_size, case.profile.baseline_world_size
        within = (ws == base, -ws) if (case.group, case.trial) in down else (ws != base, ws)
        return (case.trial, slot.get((case.trial, case.group), 0), *within)

    ordered = iter(sorted((item for item in items if id(item) in cases), key=key))
    return [next(ordered) if id(item) in cases else item for item in items]


def round_orders(groups: int, rounds: int) -> list[list[int]]:
    """The order of ``groups`` groups (0 .. groups - 1) in each of ``rounds`` rounds, such that
    every group's slots summed over the rounds are equal, or differ by at most one where no order
    can do better (an even number of groups in an odd number of rounds: the sum of all slots is
    then odd per pair of groups). A linear drift over the session then biases no group, or every
    group by at most half a slot.

    Pairs of rounds run forward then backward (ABBA for two groups: slots g - 1 a pair, for
    everyone). An odd count ends with a balanced triple of rounds (``_balanced_triple``). One
    round is forward."""
    if rounds <= 1 or groups <= 1:
        return [list(range(groups)) for _ in range(max(rounds, 0))]
    forward = list(range(groups))
    pairs = (rounds - 3) // 2 if rounds % 2 else rounds // 2
    orders = [order for _ in range(pairs) for order in (forward, forward[::-1])]
    return orders + (_balanced_triple(groups) if rounds % 2 else [])


def _balanced_triple(g: int) -> list[list[int]]:
    """Three orders of g groups in which every group's three slots sum to 3 (g - 1) / 2 (odd g: a
    3 x g magic rectangle) or to within one half of it (even g).

    Odd g, h = (g - 1) / 2: group i takes slot i, then slot (i + h) mod g, then 3h minus those two,
    which runs over the even slots for i <= h and the odd ones above: each row is an order.
    Even g: the odd triple for groups 0 .. g - 2, and group g - 1 put last, first, then at slot
    g / 2 - 1 (the others after it move up one): it sums to 3g/2 - 2, the others to 3g/2 - 2 or
    3g/2 - 1, around the mean 3g/2 - 3/2."""
    if g % 2 == 0:
        rows = _balanced_triple(g - 1)
        return [rows[0] + [g - 1], [g - 1] + rows[1], rows[2][:g // 2 - 1] + [g - 1] + rows[2][g // 2 - 1:]]
    h = (g - 1) // 2
    slots = [list(range(g)), [(i + h) % g for i in range(g)]]
    slots.append([3 * h - a - b for a, b in zip(*slots, strict=True)])
    return [sorted(range(g), key=row.__getitem__) for row in slots]


def baseline_last(cases: list[Case]) -> set[tuple[str, int]]:
    """(group, trial) of the rounds in which a group's world sizes run from the top down to its
    baseline: every other round counted back from the last, which runs baseline first (a case's
    thresholds are checked after its last trial, and then every round's pair must be complete);
    only rounds that hold the baseline and a scaled case (else the scaled case runs its baseline
    first, as it does with one trial)."""
    held: dict[tuple[str, int], set[int]] = {}
    for case in cases:
        held.setdefault((case.group, case.trial), set()).add(case.spec.world_size)
    return {(case.group, case.trial) for case in cases
            if (case.trials - case.trial) % 2 == 1
            and case.profile.baseline_world_size in held[(case.group, case.trial)]
            and len(held[(case.group, case.trial)]) > 1}


def skip_reason(case: Case, launcher: LauncherKind, gpus: list[str]) -> str | None:
    """Why this launcher cannot run the case (here), or None if it can. ``gpus``: this host's
    GPU names (``local_gpus()``, read once per session)."""
    problem = case.spec.problem()
    if problem:
        return f"{case.id}: {problem}"
    if case.spec.nnodes > 1 and not launcher.spans_nodes:
        return (f"{case.id} spans {case.spec.nnodes} nodes; run it with "
                + " or ".join(f"--llmbench-launcher={name}" for name in launchers.spanning()))
    if not launcher.on_this_host:
        return None  # the launcher's own placement (node selector, GPU requests) decides where it runs
    if case.spec.device != "cuda":
        return None
    usable = [name for name in gpus if case.profile.runs_on(name)]
    if gpus and not usable:
        said = " or ".join(case.profile.parts + case.profile.device_names)
        return (f"{case.id}: this host's GPU is {gpus[0]!r}; the {case.profile.name} profile is for "
                f"{said} (parts in {case.profile.source})")
    if len(usable) < case.spec.world_size:
        return (f"{case.id} needs {case.spec.world_size} CUDA device(s) on this host; "
                f"found {len(usable)} (profile {case.profile.name}: {case.profile.description})")
    return None


def host_profiles(profiles: dict[str, Profile], gpus: list[str]) -> list[str]:
    """The profiles made for this host: the CPU ones when it has no GPU, else those whose
    parts include its GPU (Profile.runs_on). ``pytest -m auto`` selects their cases."""
    if not gpus:
        return [name for name, p in profiles.items() if p.device == "cpu"]
    return [name for name, p in profiles.items() if p.device == "cuda" and p.runs_on(gpus[0])]


def local_gpus() -> list[str]:
    """Names of the NVIDIA GPUs a rank started here can use, as the driver reports them (e.g.
    "NVIDIA H100 80GB HBM3"), without importing torch: ``nvidia-smi -L``, narrowed by
    ``CUDA_VISIBLE_DEVICES`` when it is set (empty: none; indices pick those GPUs; UUIDs keep
    as many as are listed)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if (visible is not None and not visible.strip()) or not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    names = [GPU_LINE.match(line)[1] for line in out.stdout.splitlines() if GPU_LINE.match(line)]
    if visible is None:
        return names
    chosen = [d.strip() for d in visible.split(",") if d.strip()]
    if all(d.isdigit() for d in chosen):
        return [names[int(d)] for d in chosen if int(d) < len(names)]
    return names[:len(chosen)]
