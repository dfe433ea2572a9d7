"""What variant compile relies on in torch (harness/compiled.py), shown on CPU with dynamo's eager
backend (the same frames and guards as inductor's, without its C++ build): in one process a new module
object of the same code reuses the code an earlier one compiled (torch 2.13 inlines nn.Module
parameters as graph inputs), so a warm rank's second case would compile nothing and its compile time
read as zero; ``torch._dynamo.reset()`` before each case (``compiled.fresh``) makes every case compile
as a fresh process does. A rank that compiled no frame fails its case rather than pass as compiled."""

import pytest
import torch
import torch._dynamo

from harness import compiled


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x))


def frames_per_case(cases: int, *, fresh: bool) -> list[int]:
    """Frames dynamo compiled in each of ``cases`` cases, each a new module compiled in place."""
    torch._dynamo.reset()
    out = []
    for _ in range(cases):
        if fresh:
            compiled.fresh()
        block = Block()
        block.compile(backend="eager")
        before = compiled.frames()
        block(torch.randn(2, 8)).sum().backward()
        out.append(compiled.frames() - before)
    return out


def test_each_case_on_a_warm_rank_compiles_anew_only_when_fresh():
    assert frames_per_case(4, fresh=False) == [1, 0, 0, 0]  # the first case's code serves the others
    assert frames_per_case(4, fresh=True) == [1, 1, 1, 1]


def test_a_rank_that_compiled_nothing_fails_its_case():
    record = compiled.record(compiled.snapshot(), [0, 0, 0], warmup_steps=1)
    with pytest.raises(RuntimeError, match="compiled no frame on rank 1: the case ran eager"):
        compiled.check(record, 1)


def test_compile_metrics_name_what_they_are():
    from harness.spec import RunSpec

    eager, _ = RunSpec(), None
    values, nulls = compiled.metrics(eager, [None, None], [1.0], [0.5])
    assert set(values.values()) == {None} and set(nulls.values()) == {compiled.NOT_COMPILED}
    spec = RunSpec(variant="compile", world_size=2)
    ranks = [{"frames": 3, "graph_breaks": 1, "unique_graphs": 3, "cache_hits": 2, "cache_misses": 2,
              "frames_per_step": [3, 0, 0, 1], "measured_frames": 1}] * 2
    # the last measured step recompiled (9 s): the steady step is the one that compiled nothing
    values, nulls = compiled.metrics(spec, ranks, [10.0, 0.6], [0.5, 9.0])
    assert values == {"compile_s": pytest.approx(10.6 - 1.0), "recompiles": 1, "graph_breaks": 1,
                      "compile_cache_hits": 0.5}
    assert nulls == {}
    every = [{**ranks[0], "frames_per_step": [3, 0, 1, 1], "measured_frames": 2}] * 2
    values, nulls = compiled.metrics(spec, every, [10.0, 0.6], [9.0, 9.0])
    assert values["compile_s"] is None and "compiled nothing" in nulls["compile_s"]
