"""The recompute policies really recompute (harness/recompute.py, applied by every strategy through
harness/parallel/engine.py apply_before_wrap): the matmuls backward runs again, counted on a real
forward and backward of the tiny Llama (two blocks, seven linear layers each, the last of which
backward never needs again), and the activation bytes PyTorch's MemTracker sees at the step's peak
(planner/memref.py, what the memory planner reads). The saved-tensor hooks of torch.autograd cannot
be the measure: the op-level policy keeps what it saves in its own cache, out of their sight."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.model import build_model
from harness.recompute import Recompute, apply
from harness.spec import RunSpec
from harness.spec_checks import SpecError

CPU = torch.device("cpu")


class MatmulCount(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            self.count += 1
        return func(*args, **(kwargs or {}))


def saved_and_recomputed(variant: str) -> tuple[int, int]:
    """(activation bytes at the peak of a step, matmuls run in backward) of one micro-batch."""
    from pytest_llmbench.planner.memref import activation_peak

    spec = RunSpec.from_preset("tiny-llama", seq_len=128, micro_batch=2, variant=variant)
    torch.manual_seed(0)
    model = build_model(spec, CPU)
    apply(model, Recompute.of(spec.variant_parts()))
    idx = torch.randint(0, spec.vocab_size, (spec.micro_batch, spec.seq_len))
    loss = model(idx, idx)
    with MatmulCount() as backward:
        loss.backward()
    return activation_peak(spec), backward.count


def test_each_policy_saves_less_and_recomputes_what_it_says():
    base_bytes, base_mm = saved_and_recomputed("base")
    full_bytes, full_mm = saved_and_recomputed("ac")
    op_bytes, op_mm = saved_and_recomputed("ac-op")
    every_bytes, every_mm = saved_and_recomputed("ac-every2")
    # two blocks: ac recomputes the first six linear layers of each, ac-every2 of the second block only,
    # ac-op the even-numbered mm of each but the last (k, o, up: three)
    assert full_mm - base_mm == 2 * 6
    assert every_mm - base_mm == 6
    assert op_mm - base_mm == 2 * 3
    # the activations held shrink with what is recomputed: op-level keeps the matmul outputs it saves
    assert full_bytes < op_bytes < every_bytes < base_bytes


def test_the_policy_of_a_variant():
    assert Recompute.of({}) == Recompute("none")
    assert Recompute.of({"ac": None}) == Recompute("full", 1)
    assert Recompute.of({"ac-every": 3, "bucket": 10}) == Recompute("full", 3)
    assert Recompute.of({"ac-op": None}) == Recompute("op")
    assert Recompute("full", 3).blocks(32) == 10 and Recompute("op").blocks(32) == 32
    assert Recompute().blocks(32) == 0


@pytest.mark.parametrize("variant, message", [("ac+ac-op", "ac and ac-op are recompute policies"),
                                              ("ac-every", "unknown part 'ac-every'"),
                                              ("ac-every0", "unknown part 'ac-every0'"),
                                              ("ac-op2", "unknown part 'ac-op2'")])
def test_policies_are_one_at_a_time_and_spelled_as_listed(variant, message):
    with pytest.raises(SpecError, match=message):
        RunSpec(variant=variant)
