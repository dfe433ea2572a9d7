"""torch.compile's fused kernels as the step-time predictor counts them (planner/fusion.py), held to
inductor's own scheduler on a real Llama block, and the compiled step held to the published compiled runs
(tests/data/published_steps.json ``compiled_rows``: never fitted on)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from pytest_llmbench.planner import cli as plan_cli
from pytest_llmbench.planner import opcount, opprofile
from pytest_llmbench.planner.validation import validate

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = json.loads((ROOT / "tests" / "data" / "published_steps.json").read_text())
LLAMA = dict(model_type="llama", hidden_size=64, intermediate_size=172, num_hidden_layers=1,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
             tie_word_embeddings=False)


class Chain(torch.nn.Module):
    """embedding, two element-wise ops, a matmul, then an add and a sum: two kernels when compiled."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(32, 16)
        self.w = torch.nn.Parameter(torch.randn(16, 16))

    def forward(self, idx, targets):
        a = (self.emb(idx) * 2).relu()
        return ((a @ self.w) + a).sum()


def test_a_chain_fuses_until_a_matmul_reads_it():
    """Forward: embedding, mul and relu are one kernel (it reads the indices and the table, and writes
    only ``a``, which the matmul and the add read); the add after the matmul cannot join it (a cycle
    through the matmul) and starts the second kernel with the sum, which reads the matmul's output and
    ``a`` and writes the loss. Backward is its own graph: fewer kernels and bytes than eager."""
    count = opcount.count(Chain, micro_batch=2, seq_len=8, vocab_size=32, heads=1, dtype=torch.float32)
    tokens, f32 = 2 * 8, 4
    a = tokens * 16 * f32
    forward = count.fused["forward"]
    assert forward.kernels == 2
    # kernel 1: the int64 indices and the table read, a written; kernel 2: y and a read, the loss written
    assert forward.bytes == (tokens * 8 + 32 * 16 * f32 + a) + (a + a + f32)
    eager = count.phases["forward"]["memory"]
    assert eager.kernels >= 5 and eager.bytes > forward.bytes
    backward, eager_back = count.fused["backward"], count.phases["backward"]["memory"]
    assert 0 < backward.kernels < eager_back.kernels and 0 < backward.bytes < eager_back.bytes


def _inductor(block, x, pos) -> tuple[list[int], list[float]]:
    """(kernels, bytes) of each graph inductor generates for the block's forward and backward: the kernels
    in its output code, the bytes its scheduler estimates for them (``get_read_write_buffers_sizes``:
    each buffer a fused kernel reads or writes, once). Code is generated, never compiled (``get_code``)."""
    import torch._functorch.config as functorch_config
    from torch._inductor import config as inductor_config
    from torch._inductor import scheduler
    from torch._inductor.utils import get_code

    estimates: list[float] = []
    original = scheduler.Scheduler._init

    def _init(self, nodes):
        original(self, nodes)
        estimates.append(sum(n.get_read_write_buffers_sizes() for n in self.nodes
                             if not n.is_extern() and not isinstance(n, scheduler.NopKernelSchedulerNode)))

    try:
        scheduler.Scheduler._init = _init
        with functorch_config.patch(force_non_lazy_backward_lowering=True), \
                inductor_config.patch(force_disable_caches=True):
            compiled = torch.compile(lambda h: block(h, position_embeddings=pos, attention_mask=None))
            codes = get_code(compiled, x)
    finally:
        scheduler.Scheduler._init = original
        torch._dynamo.reset()
    kernels = [len(set(re.findall(r"(cpp_fused_\w+) = async_compile", code))) for code in codes]
    return [k for k in kernels if k], estimates


def test_fused_kernels_and_bytes_hold_to_inductors_own_scheduler():
    """The reference is inductor itself (torch 2.13's scheduler on this machine's C++ backend, which
    fuses by the same scheduler rules as the GPU's Triton one): one transformer block of transformers'
    Llama in bf16, compiled as torchtitan compiles it (the block alone). Measured here: inductor 5 and 7
    kernels, 210,176 and 302,080 bytes (forward, backward); fusion.py 5 and 6 kernels, 244,480 and 306,688
    bytes (+16% and +2%): its rules leave out inductor's horizontal fusion and min-cut recompute."""
    import transformers

    batch, seq = 2, 32
    model = transformers.AutoModelForCausalLM.from_config(opcount.hf_config(LLAMA)).to(torch.bfloat16)
    x = torch.randn(batch, seq, 64, requires_grad=True, dtype=torch.bfloat16)
    positions = torch.arange(seq)[None].expand(batch, -1)
    pos = tuple(p.to(torch.bfloat16) for p in model.model.rotary_emb(x, positions))
    kernels, estimates = _inductor(model.model.layers[0], x, pos)
    ours = opprofile.profile(LLAMA, micro_batch=batch, seq_len=seq).block
    mine = [ours.fused[p].kernels for p in ("forward", "backward")]
    moved = [ours.fused[p].bytes for p in ("forward", "backward")]
    eager = [ours.phases[p]["memory"].bytes for p in ("forward", "backward")]
    print(f"inductor: kernels {kernels}, bytes {estimates}; fusion.py: kernels {mine}, bytes {moved}; "
          f"eager bytes {eager}")
    assert len(kernels) == len(estimates) == 2  # a forward graph and a backward graph
    for theirs, counted in zip(kernels, mine, strict=True):
        assert abs(counted - theirs) <= 1
    for theirs, counted, unfused in zip(estimates, moved, eager, strict=True):
        assert theirs <= counted <= 1.2 * theirs  # an upper bound on inductor's, within 20%
        assert counted < 0.5 * unfused  # and far from eager's


def test_compiled_published_runs_are_predicted_without_being_fitted_on():
    """torchtitan's FSDP + torch.compile rows (8 and 128 H100s) predicted at the eager fit: within issue
    50's bounds for rows it was not shaped on (mean <= 10%, max <= 25%); measured +2.5% and +2.7%.
    Compile buys each row its published direction (faster than the same row eager)."""
    held = PUBLISHED["compiled_rows"]
    assert held and all(r["compile"] and r["source"] in PUBLISHED["sources"] for r in held)
    assert not any(r.get("compile") for r in PUBLISHED["rows"])  # the fit never saw one
    compiled = validate(held)
    eager = validate([{k: v for k, v in r.items() if k != "compile"} for r in held])
    print([f"{r['world_size']}: {r['error']:+.1%}" for r in compiled.rows])
    assert compiled.mean_abs_error <= 0.10 and compiled.max_abs_error <= 0.25
    for fast, slow in zip(compiled.rows, eager.rows, strict=True):
        assert fast["predicted"] > slow["predicted"]
        assert fast["terms"]["compute_memory"] < 0.5 * slow["terms"]["compute_memory"]


def test_the_issue_command_prints_a_compiled_step_and_its_fused_kernels(capsys):
    """Issue 51's command: a step time, and the memory-bound work as compiled against eager."""
    argv = ("--model mistral-7b --device h100-sxm --world-size 8 --seq-len 4096 --strategy fsdp "
            "--precision bf16 --variant compile --time --json").split()
    assert plan_cli.main(argv) == 0
    got = json.loads(capsys.readouterr().out)["plans"][0]["world_sizes"]["8"]
    assert got["estimated"] and got["step_time_s"] > 0 and got["tokens_per_s_per_device"] > 0
    fused = got["memory_bound_per_micro_batch"]
    assert 0 < fused["kernels"] < fused["eager_kernels"] and 0 < fused["gb"] < fused["eager_gb"]
    assert plan_cli.main(["base" if a == "compile" else a for a in argv]) == 0
    eager = json.loads(capsys.readouterr().out)["plans"][0]["world_sizes"]["8"]
    assert eager["step_time_s"] > got["step_time_s"]
    assert eager["memory_bound_per_micro_batch"]["kernels"] == fused["eager_kernels"]
