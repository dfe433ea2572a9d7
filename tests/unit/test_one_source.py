"""One source for each fact (issue 48): the ring law lives in harness/bandwidth.py and every model of
a collective's time reads it there; no code outside the strategy table (harness/strategies.py) decides
anything by comparing a strategy's name, it reads the row. Read from the source with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness import bandwidth
from pytest_llmbench.planner import mfu, projection, step, steptime

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for package in ("harness", "pytest_llmbench") for p in (ROOT / package).rglob("*.py"))
BUILT_IN = ("ddp", "fsdp", "fsdp1", "zero2", "zero3")


def test_the_ring_law_is_defined_once_and_read_from_there():
    assert step.bus_factor is bandwidth.bus_factor and step.ring_steps is bandwidth.ring_steps
    laws = ("bus_factor", "ring_steps", "BUS_FACTOR")
    defined = [(path.relative_to(ROOT).as_posix(), getattr(node, "name", None) or node.id)
               for path in SOURCES for node in ast.walk(ast.parse(path.read_text()))
               if (isinstance(node, ast.FunctionDef) and node.name in laws)
               or (isinstance(node, ast.Name) and node.id in laws and isinstance(node.ctx, ast.Store))]
    assert defined == [("harness/bandwidth.py", "bus_factor"), ("harness/bandwidth.py", "ring_steps")]
    assert bandwidth.ring_steps("all_reduce", 8) == 14 and bandwidth.ring_steps("all_gather", 8) == 7


def test_one_step_model_times_every_estimate_and_its_links_alone_read_the_ring_law():
    """The stated-MFU step (mfu.py), the predictor (steptime.py) and the projection from measured
    points (projection.py) compose a step with planner/step.py's exposed time and sum its messages
    with step.comm_s; only step.py's links time a message by the ring law (harness/traffic.py reads
    the bus factor to total a step's traffic, planner/contention.py the HBM bytes it stages: neither
    times it)."""
    for model in (mfu, steptime, projection):
        source = Path(model.__file__).read_text()
        assert "Overlap(" in source and "comm_s(" in source, model.__name__
    callers = sorted({path.relative_to(ROOT).as_posix() for path in SOURCES
                      for node in ast.walk(ast.parse(path.read_text()))
                      if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("bus_factor",
                                                                                           "ring_steps")})
    assert callers == ["harness/bandwidth.py", "harness/traffic.py", "pytest_llmbench/planner/contention.py",
                       "pytest_llmbench/planner/step.py"]
    hides = step.Overlap(hides=0.5)
    assert hides.exposed_s(3.0, 4.0) == 1.0 and hides.exposed_s(1.0, 4.0) == 0.0
    predictor = step.Overlap(hides=1.0, unhidden_s=0.1)  # steptime's: one block unhidden
    assert predictor.exposed_s(3.0, 2.0) == pytest.approx(1.0 + 0.1)


def _name_comparisons(path: Path) -> list[str]:
    """``x == "ddp"``, ``strategy != "fsdp"``, ``name in ("zero2", "zero3")``: a comparison of an
    expression about a strategy with a built-in strategy's name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        names = [c.value for side in sides for c in ast.walk(side)
                 if isinstance(c, ast.Constant) and c.value in BUILT_IN]
        about = " ".join(ast.unparse(side) for side in sides)
        if names and ("strategy" in about or "name" in about):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_code_outside_the_strategy_table_compares_a_strategys_name():
    found = [hit for path in SOURCES if path != ROOT / "harness" / "strategies.py"
             for hit in _name_comparisons(path)]
    assert found == []


def test_the_name_check_finds_what_it_looks_for(tmp_path):
    """The walk itself: each spelling a caller used before is found; the row's own facts are not."""
    path = tmp_path / "x.py"
    path.write_text('a = spec.strategy != "ddp"\nb = name in ("zero2", "zero3")\n'
                    'c = row["strategy"] == "fsdp"\nd = "optimizer" in row.shards\ne = family == "zero3"\n')
    assert [hit.split(": ", 1)[1] for hit in _name_comparisons(path)] == [
        "spec.strategy != 'ddp'", "name in ('zero2', 'zero3')", "row['strategy'] == 'fsdp'"]


def test_what_a_row_shards_is_read_from_the_row_under_its_variant():
    from harness import strategies

    assert not strategies.get("ddp").sharded("optimizer") and strategies.get("zero2").sharded("optimizer")
    fsdp = strategies.get("fsdp")
    assert fsdp.sharded("params") and not fsdp.sharded("params", {"noreshard"})
    assert fsdp.sharded("optimizer", {"noreshard"})


def test_a_row_with_a_tracker_or_reference_the_table_does_not_know_is_refused_when_made():
    import dataclasses

    import pytest

    from harness import strategies

    ddp = strategies.get("ddp")
    with pytest.raises(strategies.StrategyError, match="tracker 'fsdp3' is not one of module, fsdp2"):
        dataclasses.replace(ddp, name="x", tracker="fsdp3")
    with pytest.raises(strategies.StrategyError, match="is not \\(name, function\\)"):
        dataclasses.replace(ddp, name="x", reference=("only a name",))
    with pytest.raises(strategies.StrategyError, match="sharded\\('weights'\\)"):
        ddp.sharded("weights")
    with pytest.raises(strategies.StrategyError, match="compiles 'layers' not one of"):
        dataclasses.replace(ddp, name="x", compiles="layers")


def test_what_compile_compiles_is_the_rows_fact_and_its_engine_does_that():
    """The step-time predictor fuses what the row's ``compiles`` says; the row's engine module compiles the
    blocks (harness/compiled.py ``blocks``) exactly where the row says "blocks", else the model whole."""
    from harness import strategies

    for row in strategies.BUILTIN:
        engine = (ROOT / (row.engine.replace(".", "/") + ".py")).read_text()
        assert ("compiled.blocks(" in engine) == (row.compiles == "blocks"), row.name
    assert strategies.get("fsdp").compiles == "blocks" and strategies.get("ddp").compiles == "model"


def test_each_device_fact_is_defined_once_and_read_from_the_device_table():
    """One table of GPU parts (harness/devices.py): measured MFU, the planner, the report and the CLI
    read it; no other module keeps a table of peaks or parts (harness/flops.py once kept its own, with
    other values: 989 against 989.4 TFLOP/s for an H100 SXM)."""
    from harness import devices, flops
    from pytest_llmbench.planner import cli as plan_cli
    from pytest_llmbench.planner import predicted, time_cli

    tables = [(path.relative_to(ROOT).as_posix(), target.id)
              for path in SOURCES for node in ast.parse(path.read_text()).body
              if isinstance(node, (ast.Assign, ast.AnnAssign))
              for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
              if isinstance(target, ast.Name) and ("PEAK" in target.id or target.id == "DEVICES")
              and isinstance(node.value, (ast.Dict, ast.DictComp, ast.List))]  # not spec's ("cpu", "cuda")
    assert tables == [("harness/devices.py", "DEVICES")]
    assert steptime.Device is devices.Device and predicted.devices is devices is time_cli.devices
    assert plan_cli.DEVICES is devices.DEVICES and flops.devices is devices
    for name, part in [("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
                       ("NVIDIA H200 NVL", "h200-nvl")]:
        row = devices.by_gpu_name(name)
        assert row.name == part and flops.peak_flops(name)[0] == row.dense_bf16_tflops * 1e12


@pytest.mark.parametrize(("reported", "part", "dense", "mamf", "memory_gib"), [
    ("NVIDIA B200", "b200", 2250.0, 1745.0, 167.6),
    ("NVIDIA B300 SXM6 AC", "b300", 2250.0, 1769.0, 268.2),
    ("NVIDIA GB200", "gb200", 2500.0, 1822.0, 173.2),
    ("AMD Instinct MI300X", "mi300x", 1307.4, 668.4, 192.0),
    ("AMD Instinct MI325X", "mi325x", 1307.4, 784.9, 256.0),
    ("AMD Instinct MI355X", "mi355x", 2516.6, 1565.0, 288.0),
])
def test_parts_in_use_now_are_rows_with_their_datasheet_and_measured_matmul(reported, part, dense, mamf,
                                                                            memory_gib):
    """Blackwell and AMD Instinct parts (issue 65 item 5): the name the driver reports finds the row (B200
    is not GB200), MFU's peak is the datasheet's dense bf16, the matmul ceiling the published MAMF, and what
    no one published stands in by name (the flash-attention ceiling; RCCL for NCCL on AMD parts)."""
    from harness import devices, flops

    row = devices.by_gpu_name(reported)
    assert row.name == part and flops.peak_flops(reported)[0] == dense * 1e12
    assert row.matmul_tflops == mamf and round(row.memory_gib, 1) == memory_gib
    assert any("flash-attention ceiling" in said for said in row.stand_ins())
    assert ("RCCL stands in for NCCL" in row.note) == part.startswith("mi")
