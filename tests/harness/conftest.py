"""2-rank CPU runs of the real harness under torchrun (tiny model, a few steps)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.result import BenchResult
from harness.spec import RunSpec
from harness.strategies import BUILTIN
from pytest_llmbench.launchers.local import warm
from pytest_llmbench.launchers.local.launcher import LocalLauncher
from tests.procs import no_process_outlives_its_test  # noqa: F401 - autouse, every test

STRATEGIES = [s.name for s in BUILTIN]  # the built-in rows of the strategy table

# warmup_steps=3: the traffic of the last warm-up step is steady (harness/traffic.py)
TINY = dict(micro_batch=4, grad_accum=2, seq_len=64, steps=5, warmup_steps=3, world_size=2,
            threads_per_rank=1, compute_probe_steps=2, lr=3e-3, data_pool=16)


def tiny_spec(**changes) -> RunSpec:
    return RunSpec.from_preset("tiny", **{**TINY, **changes})


def launch(spec: RunSpec, run_dir: Path, *, timeout_s: float = 120, env: dict | None = None,
           pools: warm.Pools | None = None) -> BenchResult:
    """The case on the local launcher: one torchrun for it, or on ``pools``' warm ranks."""
    lines: list[str] = []
    result = LocalLauncher(pools=pools).run(spec, run_dir=run_dir, run_id=run_dir.name, timeout_s=timeout_s,
                                 env={"DS_ACCELERATOR": "cpu", **(env or {})}, progress=lines.append)
    return result


@pytest.fixture(scope="session")
def session_pools():
    """Warm ranks for the shared runs below, as the plugin runs cases by default (a pool per
    fixture: each sets its own TORCH_EXTENSIONS_DIR); ended with the session."""
    pools = warm.Pools()
    yield pools
    pools.close_all()


@pytest.fixture(scope="session")
def strategy_results(tmp_path_factory, session_pools) -> dict[str, BenchResult]:
    """One 2-rank run per strategy, shared by the tests of this folder; each traces two more steps
    (--llmbench-trace) after its measured ones and runs one under the memory tracker
    (--llmbench-memory)."""
    root = tmp_path_factory.mktemp("strategies")
    ext = {"TORCH_EXTENSIONS_DIR": str(root / "torch_extensions")}  # where DeepSpeed would build ops
    asked = {"trace": 2, "memory": 1, "bookkeeping": 1}
    return {s: launch(tiny_spec(strategy=s, instruments=asked), root / s, env=ext, pools=session_pools)
            for s in STRATEGIES}


# Each strategy at ws4 (counting on two cores is fine), for the traffic formulas: the GPT ones
# where ws2 runs above are GPT, tiny-llama (untied head, grouped-query attention) for the others.
WS4 = {"ddp": "tiny", "fsdp": "tiny", "zero2": "tiny", "fsdp1": "tiny-llama", "zero3": "tiny-llama"}


@pytest.fixture(scope="session")
def ws4_results(tmp_path_factory, session_pools) -> dict[str, BenchResult]:
    """One 4-rank run per strategy (no compute probe), shared by tests/harness/test_traffic.py."""
    root = tmp_path_factory.mktemp("ws4")
    ext = {"TORCH_EXTENSIONS_DIR": str(root / "torch_extensions")}
    return {s: launch(RunSpec.from_preset(preset, **{**TINY, "strategy": s, "world_size": 4, "steps": 4,
                                                     "compute_probe_steps": 0}), root / s, env=ext,
                   pools=session_pools)
            for s, preset in WS4.items()}


# Variants that run on CPU/gloo, combined so that one launch checks several: the exact ones
# (recompute, bucket sizes, no resharding) and the lossy ones (compression, bf16 reduction).
# Every part runs under at least one strategy, and every strategy runs a recompute policy (ac,
# ac-op, ac-every2); the FSDP1 and ZeRO-2/3 forms of bf16-reduce share their code paths with those
# run here (configs: tests/unit).
EXACT_VARIANTS = [("ddp", "ac+bucket1"), ("fsdp", "ac-op+noreshard"), ("fsdp1", "ac-every2+noreshard"),
                  ("zero3", "ac-op+bucket1")]
LOSSY_VARIANTS = [("ddp", "powersgd2"), ("fsdp", "bf16-reduce"), ("zero2", "ac-every2+bf16-reduce+bucket1")]


@pytest.fixture(scope="session")
def variant_results(tmp_path_factory, session_pools) -> dict[tuple[str, str], BenchResult]:
    """One 2-rank run per (strategy, variant) above, shared by tests/harness/test_variants.py."""
    root = tmp_path_factory.mktemp("variants")
    ext = {"TORCH_EXTENSIONS_DIR": str(root / "torch_extensions")}
    return {(s, v): launch(tiny_spec(strategy=s, variant=v), root / f"{s}+{v}", env=ext, pools=session_pools)
            for s, v in EXACT_VARIANTS + LOSSY_VARIANTS}


# The fine-tuning workloads, every strategy at ws2: a tiny Mistral (grouped-query attention,
# SwiGLU, untied head), LoRA r16 on q,k,v,o; qlora also quantises its linear layers to NF4.
WORKLOADS = ("lora", "qlora")


@pytest.fixture(scope="session")
def workload_results(tmp_path_factory, session_pools) -> dict[tuple[str, str], BenchResult]:
    """One 2-rank run per (strategy, workload), shared by tests/harness/test_workloads.py."""
    root = tmp_path_factory.mktemp("workloads")
    ext = {"TORCH_EXTENSIONS_DIR": str(root / "torch_extensions")}
    return {(s, w): launch(RunSpec.from_preset("tiny-mistral", **{**TINY, "strategy": s, "workload": w}),
                           root / f"{w}-{s}", env=ext, pools=session_pools)
            for w in WORKLOADS for s in STRATEGIES}


@pytest.fixture(params=["fresh", "warm"])
def pools(request):
    """Each test twice: one torchrun per case (None), and on warm ranks (closed after the test)."""
    if request.param == "fresh":
        yield None
        return
    pools = warm.Pools()
    yield pools
    pools.close_all()


def case_mark(result: BenchResult) -> str:
    """The LLMBENCH_RUN_ID every process of the case carried: its launch's mark (the run id and a
    token of that launch), or its pool's."""
    return result.launch.get("pool") or result.launch["mark"]


def run_harness(spec_data: dict | str, tmp_path: Path, env: dict | None = None):
    """``python -m harness`` without torchrun (for input validation)."""
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(spec_data if isinstance(spec_data, str) else json.dumps(spec_data))
    return subprocess.run([sys.executable, "-m", "harness", "--spec", str(spec_path),
                           "--out", str(tmp_path / "out.json")], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", **(env or {})}, timeout=120)


# dtype bf16 as each strategy's users run it (RunSpec.precision "native"; DDP autocast), every
# strategy at ws2, and FSDP2 with the variant autocast (every strategy computing alike), the parity
# reference the native runs are held to (tests/harness/test_precision.py).
BF16_CASES = [(s, "base") for s in STRATEGIES] + [("fsdp", "autocast")]


@pytest.fixture(scope="session")
def bf16_results(tmp_path_factory, session_pools) -> dict[tuple[str, str], BenchResult]:
    """One 2-rank bf16 run per case above (bf16 is ~10x slower than fp32 on this CPU: tiny model;
    a compute-only probe only where test_precision.py reads it: FSDP2's native bf16)."""
    root = tmp_path_factory.mktemp("bf16")
    ext = {"TORCH_EXTENSIONS_DIR": str(root / "torch_extensions")}
    probe = {("fsdp", "base"): 1}
    return {(s, v): launch(tiny_spec(strategy=s, variant=v, dtype="bf16", instruments={"bookkeeping": 1},
                                     compute_probe_steps=probe.get((s, v), 0)),
                           root / f"{s}+{v}", env=ext, timeout_s=300, pools=session_pools)
            for s, v in BF16_CASES}


# Variant compile at ws2 (inductor's C++ backend through the host's g++; tens of seconds cold): FSDP2,
# compiled block by block, and DDP, compiled whole, the latter told to compile again in its 5th step,
# a measured one (LLMBENCH_RECOMPILE_AT). ZeRO-2/3 (engine.compile()) and FSDP1 run too but take a
# minute or more each cold here: reports/compile/ holds their runs.
COMPILED = {"fsdp": {}, "ddp": {"LLMBENCH_RECOMPILE_AT": "5"}}


@pytest.fixture(scope="session")
def compiled_results(tmp_path_factory) -> dict[str, BenchResult]:
    """One 2-rank compiled run per strategy above, inductor's cache in the session's folder."""
    root = tmp_path_factory.mktemp("compiled")
    cache = {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "TORCH_EXTENSIONS_DIR": str(root / "ext")}
    return {s: launch(tiny_spec(strategy=s, variant="compile"), root / s, env={**cache, **env}, timeout_s=300)
            for s, env in COMPILED.items()}
