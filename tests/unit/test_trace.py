"""The trace analysis (harness/instruments/trace.py) on Chrome-trace events whose times are set by hand."""

import pytest

from harness.instruments.trace import analyse, intersect, union
from pytest_llmbench.settings import MEMORY_STEPS, TRACE_STEPS
from tests.unit.test_trials import matrix


def span(name, ts, dur, *, tid=1, cat="cpu_op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "cat": cat}


def test_intervals():
    assert union([(5, 7), (0, 2), (1, 3), (7, 8)]) == [(0, 3), (5, 8)]
    assert intersect([(0, 3), (5, 8)], [(2, 6)]) == [(2, 3), (5, 6)]
    assert intersect([(0, 1)], [(1, 2)]) == []


def test_a_cpu_step_split_by_hand():
    """A 100 us step on the training thread (tid 1): aten ops 0-40 (with a nested op counted once)
    and 60-80; gloo's thread (tid 9) all-reduces 30-70; the c10d op that queued it and an op on
    another thread are not compute. Compute 60, comm 40 of which 20 under compute, exposed 20,
    idle 100 - |0-80| = 20."""
    events = [span("llmbench.step", 1000, 100, cat="user_annotation"),
              span("aten::mm", 1000, 40), span("aten::add_", 1010, 5),
              span("c10d::allreduce_", 1030, 2), span("aten::mm", 1060, 20),
              span("gloo:all_reduce", 1030, 40, tid=9, cat="user_annotation"),
              span("aten::copy_", 1085, 10, tid=7),  # another thread (a data loader): not this step's compute
              span("aten::mm", 1200, 50)]  # outside any traced step
    found = analyse(events, cuda=False)
    assert found["steps"] == [pytest.approx({"step_s": 100e-6, "compute_s": 60e-6, "comm_s": 40e-6,
                                             "hidden_comm_s": 20e-6, "exposed_comm_s": 20e-6,
                                             "idle_s": 20e-6})]
    assert found["hidden_comm_share"] == pytest.approx(0.5)
    assert found["exposed_comm_share"] == pytest.approx(0.2)
    assert found["idle_share"] == pytest.approx(0.2)


def test_cuda_steps_read_kernels_and_average_over_steps():
    """Two steps; NCCL kernels are communication, every other kernel compute, CPU ops nothing."""
    events = [span("llmbench.step", 0, 100, cat="user_annotation"),
              span("llmbench.step", 200, 100, cat="user_annotation"),
              span("aten::mm", 0, 100),  # the CPU side of a CUDA step is not GPU time
              span("sm80_xmma_gemm", 10, 50, tid=7, cat="kernel"),
              span("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 40, 40, tid=8, cat="kernel"),
              span("sm80_xmma_gemm", 200, 100, tid=7, cat="kernel")]
    found = analyse(events, cuda=True)
    first, second = found["steps"]
    assert first == pytest.approx({"step_s": 100e-6, "compute_s": 50e-6, "comm_s": 40e-6,
                                   "hidden_comm_s": 20e-6, "exposed_comm_s": 20e-6, "idle_s": 30e-6})
    assert second["compute_s"] == pytest.approx(100e-6) and second["comm_s"] == 0
    assert found["comm_s"] == pytest.approx(20e-6) and found["hidden_comm_share"] == pytest.approx(0.5)


def test_cuda_copies_of_the_step_range_on_gpu_streams_are_not_steps():
    """Kineto writes the ``llmbench.step`` range again as ``gpu_user_annotation`` on each stream
    whose kernels ran inside it (torch/profiler/_cupti_monitor_trace.py): one step, not three. Counted
    as windows they made a step of 100 us with 15 us exposed and 15 idle read as exposed 20%, idle
    6.7% (the partial copies dilute the idle share and add exposed time)."""
    events = [span("llmbench.step", 0, 100, cat="user_annotation"),
              span("llmbench.step", 5, 80, tid=7, cat="gpu_user_annotation"),   # compute stream
              span("llmbench.step", 40, 50, tid=8, cat="gpu_user_annotation"),  # NCCL stream
              span("sm90_xmma_gemm", 5, 70, tid=7, cat="kernel"),
              span("ncclDevKernel_AllGather_RING_LL", 60, 30, tid=8, cat="kernel")]
    found = analyse(events, cuda=True)
    assert len(found["steps"]) == 1
    assert found["steps"][0] == pytest.approx({"step_s": 100e-6, "compute_s": 70e-6, "comm_s": 30e-6,
                                               "hidden_comm_s": 15e-6, "exposed_comm_s": 15e-6,
                                               "idle_s": 15e-6})
    assert found["exposed_comm_share"] == pytest.approx(0.15)
    assert found["idle_share"] == pytest.approx(0.15)


def test_a_trace_without_a_step_range_is_an_error():
    with pytest.raises(ValueError, match="no 'llmbench.step' range"):
        analyse([span("aten::mm", 0, 10)], cuda=False)


def test_llmbench_trace_traces_every_case_and_leaves_it_the_same_case():
    plain, traced = matrix(strategy=["ddp"]), matrix(strategy=["ddp"], trace=True)
    assert [c.spec.instruments for c in plain] == [{}, {}]
    assert [c.spec.instruments for c in traced] == [{"trace": TRACE_STEPS}] * 2
    assert [c.spec.identity() for c in traced] == [c.spec.identity() for c in plain]


def test_llmbench_memory_tracks_every_case_and_leaves_it_the_same_case():
    plain, tracked = matrix(strategy=["ddp"]), matrix(strategy=["ddp"], memory=True)
    assert [c.spec.instruments for c in plain] == [{}, {}]
    assert [c.spec.instruments for c in tracked] == [{"memory": MEMORY_STEPS}] * 2
    assert [c.spec.identity() for c in tracked] == [c.spec.identity() for c in plain]
