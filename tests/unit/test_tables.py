"""The strategy and metric tables are the one home of their facts: what a result carries is in the
metric table, an unknown strategy is an error wherever it is looked up, and the projection and
planner read a strategy's sends and shards from its row."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from harness import instruments, metrics, shapes, strategies
from harness.bandwidth import bus_factor
from harness.derive import derive_metrics
from harness.derive_after import with_cost, with_overhead_split, with_scaling, with_wall_time
from harness.result import BenchResult
from harness.spec import RunSpec, SpecError
from harness.strategies import Send, Strategy, StrategyError
from pytest_llmbench.planner import memory as plan
from pytest_llmbench.planner import projection
from pytest_llmbench.planner.projection import Group, Point


def finished(world_size: int) -> BenchResult:
    spec = RunSpec(world_size=world_size, steps=4, warmup_steps=1)
    values, nulls = derive_metrics(spec, n_params=1000, n_trainable=1000, step_times_s=[0.5, 0.6, 0.7],
                                   compute_only_step_times_s=[0.4], losses=[2.0, 1.0],
                                   memory_per_rank=[{"peak_rss_gib": 0.5}], device_name="cpu")
    values.update(instruments.derive({}))  # as harness/train.py summarises: every instrument's rows
    result = BenchResult(spec=spec, status="ok", run_id=f"ws{world_size}", metrics=values, null_reasons=nulls,
                         step_times_s=[0.5, 0.6, 0.7], compute_only_step_times_s=[0.4])
    return with_cost(result, 1.0)


def test_every_value_a_result_carries_is_a_row_of_the_metric_table_and_every_row_is_carried():
    base = finished(1)
    result = with_wall_time(with_overhead_split(with_scaling(finished(2), base), base), 12.0)
    carried = set(result.metrics)
    rows = set(metrics.names(on_result=False))
    assert carried - set(metrics.NOTES) == rows, (carried ^ rows) - set(metrics.NOTES)
    assert result.wall_time_s == 12.0 and metrics.names(on_result=True) == ["wall_time_s"]


def test_metric_rows_say_what_the_report_and_gate_need():
    for m in metrics.table():
        assert m.trials in (metrics.MEAN, metrics.LATEST) and m.definition and m.name.islower()
        if m.winner:
            assert m.higher is not None and m.fmt, m.name  # a ranking needs a direction and a format
    assert {"tokens_per_s", "peak_memory_gib", "step_time_median_s"} <= set(metrics.gated())
    assert "n_params" not in metrics.gated()  # no better direction: not a gate
    with pytest.raises(ValueError, match="already in the metric table"):
        metrics.register(dataclasses.replace(metrics.METRICS[0], derive=lambda r: 1.0))


def test_an_unknown_strategy_is_an_error_in_the_spec_projection_and_planner():
    with pytest.raises(SpecError, match="strategy: unknown value 'tp'; choose one of ddp, fsdp"):
        RunSpec(strategy="tp")
    group = Group(label="tp seq64", strategy="tp", variant_parts=frozenset(),
                  points=[Point(1, 1.0, 0.9, 64, 1)])
    with pytest.raises(ValueError, match="no strategy row"):  # the report resolves it, or leaves it out
        projection.op_scale(group, micro_batches=2)
    with pytest.raises(StrategyError, match="unknown strategy 'tp'"):
        plan.estimate("tp", plan.Shape.of(RunSpec()), 8)


def test_the_projection_and_planner_read_sends_and_shards_from_the_row(monkeypatch):
    monkeypatch.setattr(strategies, "_TABLE", dict(strategies._TABLE))  # the row leaves with the test
    # a row that all-reduces parameters twice per micro-batch and shards only the optimizer
    toy = strategies.register(Strategy("toy-row", "harness.parallel.ddp", "a table test", "#000000",
                                       frozenset({"optimizer"}),
                                       (Send("all_reduce", "params", "micro_batch", 2),), frozenset()))
    assert toy.stated_bytes(frozenset(), {"params": 400.0}, 3) == {"all_reduce": 2400.0}
    group = Group(label="toy", strategy=toy.name, variant_parts=frozenset(), points=[],
                  payloads={"params": 400.0}, row=toy)
    assert projection.op_scale(group, micro_batches=3) == {"all_reduce": 3.0}
    with pytest.raises(StrategyError, match="already registered"):
        strategies.register(dataclasses.replace(toy, color="#ffffff"))


def test_a_row_with_an_unknown_variant_or_shard_is_refused():
    with pytest.raises(StrategyError, match="unknown variant"):
        Strategy("x", "m", "", "#000", frozenset(), (), frozenset({"turbo"}))
    with pytest.raises(StrategyError, match="shards"):
        Strategy("x", "m", "", "#000", frozenset({"activations"}), (), frozenset())
    with pytest.raises(StrategyError, match="payload"):
        Send("all_reduce", "activations", "step")


def test_docs_metrics_holds_the_metric_table_as_it_is():
    """docs/METRICS.md is the table itself (tools/metrics_doc.py prints it): rerun the tool when a
    row changes."""
    root = Path(__file__).resolve().parents[2]
    tool = importlib.util.spec_from_file_location("metrics_doc", root / "tools" / "metrics_doc.py")
    module = importlib.util.module_from_spec(tool)
    tool.loader.exec_module(module)
    page = (root / "docs" / "METRICS.md").read_text()
    assert module.render() in page
    assert all(f"| `{name}` |" in page for name in metrics.names())


def test_docs_guide_holds_the_layout_as_the_modules_say_it():
    """docs/GUIDE.md's layout is every module with its docstring's first sentence
    (tools/layout_doc.py prints it): a module added, moved or redescribed shows here until the
    guide is regenerated, and every module has a docstring."""
    root = Path(__file__).resolve().parents[2]
    tool = importlib.util.spec_from_file_location("layout_doc", root / "tools" / "layout_doc.py")
    module = importlib.util.module_from_spec(tool)
    tool.loader.exec_module(module)
    block = module.render()
    assert "(no docstring)" not in block
    assert block in (root / "docs" / "GUIDE.md").read_text()
    assert block.count(".py ") >= 80  # every module, not a few


def test_docs_guide_holds_every_option_as_the_option_table_says_it():
    """docs/GUIDE.md's options table is generated (tools/options_doc.py) from settings.OPTIONS and every
    launcher's options: an option added or redescribed shows here until the guide is regenerated (the
    hand-written table lacked 5 of 20 options)."""
    from pytest_llmbench import launchers
    from pytest_llmbench.settings import OPTIONS

    root = Path(__file__).resolve().parents[2]
    tool = importlib.util.spec_from_file_location("options_doc", root / "tools" / "options_doc.py")
    module = importlib.util.module_from_spec(tool)
    tool.loader.exec_module(module)
    block = module.render()
    assert block in (root / "docs" / "GUIDE.md").read_text()
    every = [*OPTIONS, *(o for kind in launchers.kinds().values() for o in kind.options)]
    assert len(every) >= 20 and all(f"`--llmbench-{o.name}" in block and f"`{o.env}`" in block for o in every)


@pytest.mark.parametrize("m", [1, 2])
def test_what_each_strategy_moves_per_step_relative_to_ddp(m):
    """Bus bytes per step from each row's formula on gpt2-350m (the GPU profiles' model), at N = 8,
    with m micro-batches: FSDP (m(1+b)+1)/2 DDP's volume, b the blocks' share of the parameters
    (the root, kept gathered from forward, is not gathered again in backward); ZeRO-2 all-reduces
    every micro-batch, (2m+1)/2 (the old table's reduce-scatter said 1x at any m); ZeRO-3 below 1e9
    parameters gathers once per micro-batch, m (the old table said 3m/2). The report prints the
    measured bytes, not these ratios."""
    spec = RunSpec.from_preset("gpt2-350m")
    payloads = shapes.payloads(spec)

    def bus_bytes(strategy: str) -> float:
        sent = strategies.get(strategy).stated_bytes(frozenset(), payloads, m)
        return sum(size * bus_factor(op, 8) for op, size in sent.items())

    ddp = bus_bytes("ddp")
    b = payloads["blocks"] / payloads["params"]
    assert 0.8 < b < 0.9  # gpt2-350m's tied 50k x 1024 embedding is 15% of it
    assert bus_bytes("fsdp") / ddp == pytest.approx((m * (1 + b) + 1) / 2)
    assert bus_bytes("zero2") / ddp == pytest.approx((2 * m + 1) / 2)
    assert bus_bytes("zero3") / ddp == pytest.approx(m, rel=1e-3)
    parts = (Path(projection.__file__).parent / "templates").glob("**/*.j2")
    template = "".join(p.read_text() for p in parts)
    assert "times DDP's volume" not in template  # fixed ratios are no longer printed


def test_every_file_the_docs_and_code_name_exists():
    """A path of this repository named in the docs, a module docstring or a test (``harness/x.py``,
    ``docs/X.md``, ``harness/instruments/memory.HELD`` for a module's name) is a file that exists: prose that
    points at a file that moved or never existed fails here (37c90cc cited a DESIGN.md that is
    not in the repository)."""
    import re

    root = Path(__file__).resolve().parents[2]
    pattern = re.compile(r"(?<![\w/.-])((?:harness|pytest_llmbench|tests|tools|benchmarks|docs|docker|k8s|"
                         r"experiments|reports)/[\w./-]*\w)")
    sources = [*root.glob("*.md"), *root.glob("docs/*.md"), *root.glob("tests/**/*.py"),
               *root.glob("harness/**/*.py"), *root.glob("pytest_llmbench/**/*.py"), *root.glob("tools/*.py"),
               *root.glob("benchmarks/*.py"), root / "tests" / "README.md", root / "reports" / "README.md",
               *root.glob("experiments/**/*.md"), *root.glob("experiments/**/*.py"),
               root / "Makefile", root / ".ci" / "run", *root.glob("docker/*")]
    missing = set()
    here = Path(__file__)
    for source in (s for s in sources if s.is_file() and "__pycache__" not in s.parts and s != here):
        text = source.read_text(errors="replace")
        for match in pattern.finditer(text):
            if text[match.end():match.end() + 1] in "{<*":  # a pattern: zero{2,3}.json, rank<R>.json
                continue
            path = match.group(1).rstrip(".")
            module = root / (path.split(".")[0] + ".py")  # harness/x.NAME: a name in a module
            if not (root / path).exists() and not module.exists() and path != "tests/harness/shared":
                missing.add(f"{source.relative_to(root)}: {path}")
    assert not missing, sorted(missing)
    cites = [s.relative_to(root) for s in sources if s.is_file() and s.suffix in (".py", ".md") and s != here
             and "DESIGN.md" in s.read_text(errors="replace")]
    assert cites == []  # a design file users never have (docs/ARCHITECTURE.md is the project's own)
