"""pytest_llmbench/planner/opcount.py: the operators of one micro-batch, counted under FakeTensorMode."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from harness.spec import RunSpec
from pytest_llmbench.planner import opcount, opprofile

MPT = {
    "model_type": "mpt",
    "d_model": 128,
    "n_heads": 4,
    "n_layers": 3,
    "vocab_size": 512,
    "expansion_ratio": 4,
    "max_seq_len": 64,
}
LLAMA = {
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 64,
}


def _flops_by_torch(config: dict, depth: int, micro_batch: int, seq_len: int) -> float:
    """FlopCounterMode's total over one forward and backward of the same model, in bf16 (real tensors)."""
    import transformers

    cfg = opcount.hf_config(config)
    cfg.num_hidden_layers = depth
    torch.manual_seed(0)
    model = opprofile._Plain(transformers.AutoModelForCausalLM.from_config(cfg)).to(torch.bfloat16)
    idx = torch.randint(0, config["vocab_size"], (micro_batch, seq_len))
    with FlopCounterMode(display=False) as counter:
        model(idx, idx).backward()
    return float(counter.get_total_flops())


def _total(count: opcount.Count) -> float:
    return sum(ops.flops for classes in count.phases.values() for ops in classes.values())


def test_every_flop_torch_counts_is_counted_once():
    """The classes together hold exactly FlopCounterMode's total, on the eager (MPT) and SDPA (Llama)
    paths."""
    for config in (MPT, LLAMA):
        profile = opprofile.profile(config, micro_batch=2, seq_len=32)
        ours = _total(profile.outside) + 2 * _total(profile.block)  # the model at depth 2
        assert ours == _flops_by_torch(config, 2, 2, 32), config["model_type"]


def test_attention_is_found_whatever_its_decomposition():
    """MPT's eager attention (QK^T, alibi, softmax, PV) and Llama's SDPA both land in the attention class,
    and the block's GEMMs are its projections only: 4 linear layers (qkv, out, up, down) for MPT."""
    mpt = opprofile.profile(MPT, micro_batch=2, seq_len=32)
    forward = mpt.block.phases["forward"]
    assert forward["attention"].kernels >= 4 and forward["attention"].flops == 4 * 2 * 4 * 32 * 32 * 32
    assert sorted(g[1:4] for g in forward["gemm"].gemms) == [
        (64, 128, 128),
        (64, 128, 512),
        (64, 384, 128),
        (64, 512, 128),
    ]
    llama = opprofile.profile(LLAMA, micro_batch=2, seq_len=32)
    assert llama.block.phases["forward"]["attention"].kernels >= 1
    assert len(llama.block.phases["forward"]["gemm"].gemms) == 7  # q, k, v, o, gate, up, down
    assert (llama.heads, llama.kv_heads, llama.head_dim) == (4, 2, 32)


def test_parameters_and_views():
    """Parameters at full depth from two shallow models; a view moves no byte and is no kernel."""
    profile = opprofile.profile(MPT, micro_batch=1, seq_len=16)
    import transformers

    full = transformers.AutoModelForCausalLM.from_config(opcount.hf_config(MPT))
    assert profile.params == sum(p.numel() for p in full.parameters())
    count = opcount.count(lambda: _Views(), micro_batch=1, seq_len=16, vocab_size=8, heads=1)
    forward = count.phases["forward"]["memory"]
    assert forward.kernels == 1  # the sum; view, transpose and reshape are none


class _Views(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, idx, targets):
        return self.w.view(1, 1).transpose(0, 1).reshape(-1).sum()


def test_a_preset_is_counted_on_the_projects_own_model():
    spec = RunSpec.from_preset("tiny", seq_len=32, micro_batch=2)
    profile = opprofile.profile_spec(spec)
    assert profile.n_layer == 4 and profile.heads == 4
    assert len(profile.block.phases["forward"]["gemm"].gemms) == 4  # c_attn, c_proj, c_fc, c_proj


def test_a_sequence_longer_than_the_configs_positions_is_counted_as_run_there():
    """MPT's max_seq_len (64 here) is a run setting: at 128 tokens its alibi and the counted attention
    follow the sequence (issue 44's predictor once failed to broadcast the bias)."""
    profile = opprofile.profile(MPT, micro_batch=1, seq_len=128)
    assert profile.block.phases["forward"]["attention"].flops == 4 * 1 * 4 * 128 * 128 * 32
    assert opcount.with_positions({"max_seq_len": 64, "d_model": 128}, 128) == {"max_seq_len": 128,
                                                                              "d_model": 128}
