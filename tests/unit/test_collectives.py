"""The collectives probe's arithmetic: nccl-tests' algbw and busbw (doc/PERFORMANCE.md), worked by hand."""

import pytest

from harness.bandwidth import OPS, algbw_gbps, bus_factor, busbw_gbps, element_count, message_sizes
from harness.collectives import probe_metrics, rows_from_times, sweep
from harness.spec import RunSpec, SpecError


def test_bus_factors_are_nccl_tests_own():
    assert bus_factor("all_reduce", 8) == 2 * 7 / 8 == 1.75
    assert bus_factor("all_gather", 8) == bus_factor("reduce_scatter", 8) == 7 / 8
    assert bus_factor("broadcast", 8) == 1.0
    assert bus_factor("all_reduce", 2) == 1.0  # two ranks: each sends half and receives half, twice
    with pytest.raises(ValueError, match="unknown collective 'alltoall'"):
        bus_factor("alltoall", 8)


def test_bandwidths_worked_by_hand():
    # 1 GB all_reduce on 8 ranks in 17.5 ms: algbw 1e9 / 0.0175 / 1e9 = 57.14 GB/s, busbw x 1.75 = 100 GB/s
    assert algbw_gbps(10**9, 0.0175) == pytest.approx(57.142857)
    assert busbw_gbps("all_reduce", 10**9, 0.0175, 8) == pytest.approx(100.0)
    # all_gather of a 64 MiB output on 4 ranks in 1 ms: algbw 67.1 GB/s, busbw x 3/4 = 50.33 GB/s
    assert busbw_gbps("all_gather", 64 * 2**20, 1e-3, 4) == pytest.approx(67.108864 * 0.75)
    assert busbw_gbps("broadcast", 10**9, 0.1, 16) == pytest.approx(10.0)


def test_the_sweep_and_the_element_counts():
    assert message_sizes(8, 64) == [8, 16, 32, 64]
    sweep = message_sizes(8, 2**30)  # nccl-tests' 8 B..1 GiB
    assert sweep[-1] == 2**30 and len(sweep) == 28
    # all_gather and reduce_scatter need a multiple of n elements (each rank's part): rounded down,
    # at least n; the other two take the size as it is (at least one float)
    assert element_count("all_reduce", 8, 3) == 2
    assert element_count("all_gather", 8, 3) == 3
    assert element_count("reduce_scatter", 40, 3) == 9
    assert element_count("broadcast", 2, 8) == 1


def test_rows_and_metrics_from_per_operation_times():
    spec = RunSpec(benchmark="collectives", world_size=2, comm_min_bytes=8, comm_max_bytes=16)
    times = [1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3, 7e-3, 8e-3]  # (op, size) in sweep order: 4 ops x 2 sizes
    rows = rows_from_times(spec, times)
    assert [(r["op"], r["size_bytes"]) for r in rows] == [(op, s) for op in OPS for s in (8, 16)]
    assert rows[1]["busbw_gbps"] == pytest.approx(16 / 2e-3 / 1e9 * 1.0)  # all_reduce on 2 ranks: x 1
    metrics = probe_metrics(rows, [0.002, 0.004])
    assert metrics["latency_s_reduce_scatter"] == 5e-3 and metrics["busbw_size_bytes"] == 16
    assert metrics["busbw_gbps_min"] == min(metrics[f"busbw_gbps_{op}"] for op in OPS)
    assert metrics["step_time_median_s"] == pytest.approx(0.003)


def test_a_size_that_rounds_to_one_already_measured_is_measured_once():
    """At ws4 all_gather and reduce_scatter need 4 elements: 8 B rounds up to 16 B, which the sweep
    then measures once (stored samples from before hold 16 B twice: the plot keeps the last)."""
    spec = RunSpec(benchmark="collectives", world_size=4, comm_min_bytes=8, comm_max_bytes=32)
    assert sweep(spec) == [("all_reduce", 8), ("all_reduce", 16), ("all_reduce", 32), ("all_gather", 8),
                           ("all_gather", 32), ("reduce_scatter", 8), ("reduce_scatter", 32),
                           ("broadcast", 8), ("broadcast", 16), ("broadcast", 32)]
    rows = rows_from_times(spec, [1e-3] * 10)
    assert [r["size_bytes"] for r in rows if r["op"] == "all_gather"] == [16, 32]


def test_probe_specs():
    assert RunSpec(benchmark="collectives", world_size=8).case_id == "collectives-ws8"
    with pytest.raises(SpecError, match="world_size: the collectives probe needs at least 2 ranks"):
        RunSpec(benchmark="collectives", world_size=1)
    with pytest.raises(SpecError, match="comm_max_bytes: 4 is below comm_min_bytes=8"):
        RunSpec(benchmark="collectives", world_size=2, comm_max_bytes=4)
    with pytest.raises(SpecError, match="benchmark: unknown value 'nccl'"):
        RunSpec(benchmark="nccl")
