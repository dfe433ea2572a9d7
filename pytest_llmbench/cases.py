"""The benchmark matrix: profile x strategy x world size x sequence length -> Case."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from harness.spec import RunSpec
from pytest_llmbench.profiles import Profile
from pytest_llmbench.settings import Settings


@dataclass(frozen=True)
class Case:
    profile: Profile
    spec: RunSpec

    @property
    def id(self) -> str:
        """Readable test id, e.g. ``a10-zero2-ws4-seq2048``."""
        return f"{self.profile.name}-{self.spec.case_id}"

    def at_world_size(self, world_size: int) -> Case:
        return Case(self.profile, make_spec(self.profile, self.spec.strategy, world_size,
                                            self.spec.seq_len, steps=self.spec.steps))


def make_spec(profile: Profile, strategy: str, world_size: int, seq_len: int, *,
              steps: int | None = None) -> RunSpec:
    return RunSpec.from_preset(
        profile.model, seq_len=seq_len, strategy=strategy, world_size=world_size,
        nnodes=profile.nnodes(world_size), device=profile.device, dtype=profile.dtype,
        micro_batch=profile.micro_batch, grad_accum=profile.grad_accum,
        steps=steps or profile.steps, warmup_steps=profile.warmup_steps,
        threads_per_rank=profile.threads_per_rank, lr=profile.lr, data_pool=profile.data_pool,
        compute_probe_steps=profile.compute_probe_steps)


def build_cases(profiles: dict[str, Profile], settings: Settings) -> list[Case]:
    """Every case of every profile, narrowed by --strategy/--world-size/--seq-len."""
    cases = []
    for profile in profiles.values():
        for strategy in settings.strategy or profile.strategies:
            for world_size in sorted(settings.world_size or profile.world_sizes):
                for seq_len in settings.seq_len or profile.seq_lens:
                    cases.append(Case(profile, make_spec(profile, strategy, world_size, seq_len,
                                                         steps=settings.steps)))
    return cases


def skip_reason(case: Case, launcher: str) -> str | None:
    """Why this host cannot run the case with this launcher, or None if it can."""
    if launcher != "local":
        return None
    if case.spec.nnodes > 1:
        return (f"{case.id} spans {case.spec.nnodes} nodes; run it with --llmbench-launcher=k8s")
    if case.spec.device == "cuda":
        found = local_gpu_count()
        if found < case.spec.world_size:
            return (f"{case.id} needs {case.spec.world_size} CUDA device(s) on this host; "
                    f"found {found} (profile {case.profile.name}: {case.profile.description})")
    return None


def local_gpu_count() -> int:
    """NVIDIA GPUs visible here, without importing torch."""
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
