"""harness/traffic.py's row arithmetic (standard library; the recording itself runs in
tests/harness/test_traffic.py), and traffic through a stored result."""

import pytest

from harness import traffic
from harness.result import BenchResult, ResultError
from harness.shapes import payloads, tensor_numels
from harness.spec import RunSpec

MESSAGES = [{"op": "all_gather", "group_size": 4, "dtype": "float32", "bytes": 800},
            {"op": "all_gather", "group_size": 4, "dtype": "float32", "bytes": 800},
            {"op": "reduce_scatter", "group_size": 4, "dtype": "bfloat16", "bytes": 400},
            {"op": "all_reduce", "group_size": 4, "dtype": "float32", "bytes": 4}]


def test_messages_are_counted_by_kind_and_scalars_kept_apart():
    rows = traffic.summarize(MESSAGES)
    assert rows[0] == {"op": "all_gather", "group_size": 4, "dtype": "float32", "bytes": 800, "count": 2}
    assert sum(r["count"] for r in rows) == len(MESSAGES)
    assert traffic.bytes_by_op(rows) == {"all_gather": 1600, "reduce_scatter": 400}  # the 4-byte norm apart
    # busbw convention at 4 ranks: (n-1)/n for both, 2(n-1)/n for the all_reduce
    assert traffic.bus_bytes(rows, 4) == pytest.approx(0.75 * 2000 + 1.5 * 4)


def test_traffic_survives_the_result_file_and_a_bad_one_is_refused():
    spec = RunSpec(world_size=4)
    r = BenchResult(spec=spec, status="ok", traffic=traffic.summarize(MESSAGES), traffic_step=3)
    back = BenchResult.loads(r.dumps())
    assert back.traffic == r.traffic and back.traffic_step == 3
    data = r.to_dict() | {"traffic": ["all_reduce"]}
    with pytest.raises(ResultError, match="traffic: not a list of objects"):
        BenchResult.from_dict(data)


def test_tensor_numels_are_the_built_models_tensors():
    import torch

    from harness.model import build_model

    for name in ("tiny", "tiny-llama", "tiny-qwen2", "tiny-mistral"):
        spec = RunSpec.from_preset(name, seq_len=64)
        model = build_model(spec, torch.device("cpu"))
        root, block = tensor_numels(spec)
        built = sorted(p.numel() for p in model.parameters())
        assert sorted(root + block * spec.n_layer) == built, name


def test_zero3_payloads_split_at_the_persistence_threshold():
    """tiny: only the 131,072-element embedding exceeds DeepSpeed's 1e5 threshold; llama3-8b: almost
    everything is partitioned, and beyond the 1e9 reuse distance backward gathers most of it again."""
    tiny = payloads(RunSpec.from_preset("tiny"))
    assert tiny["zero3_sharded"] == 4 * 1024 * 128 and tiny["zero3_regathered"] == 0
    assert tiny["zero3_sharded"] + tiny["zero3_persistent"] == tiny["params"]
    big = payloads(RunSpec.from_preset("llama3-8b"))
    assert big["zero3_persistent"] < 1e-4 * big["params"]
    assert 0.8 * big["params"] < big["zero3_regathered"] < big["params"]

def test_qlora_gathers_its_weights_packed():
    """Mistral-7B QLoRA: the quantised linear weights travel as packed NF4, 0.5 B each (the old
    projection counted 4 B: 6.3x too much); gradients are the adapters' alone, except FSDP1's, whose
    reduce-scatter carries its units' whole flat parameters."""
    qlora = RunSpec.from_preset("mistral-7b-v0.3", workload="qlora")
    sizes = payloads(qlora)
    fp32 = payloads(qlora.replace(workload="pretrain"))
    assert 5.5 < fp32["params"] / sizes["params"] < 7.0
    assert sizes["grads"] == 4 * 13_631_488 and sizes["unit_grads"] == sizes["blocks"]

