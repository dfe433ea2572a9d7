"""Estimated step time on a GPU nobody here has: the model's operators timed by the device's roofline.

    step = grad_accum x (compute + recompute of one micro-batch) + optimizer step + exposed communication

compute: every operator of one micro-batch, counted under FakeTensorMode on the real architecture
(harness/opcount.py), each timed on the device (harness/devices.py: vendor facts and
published microbenchmarks):
    gemm       max(FLOPs / (MAMF x FIT.gemm x waves), bytes / (HBM x FIT.memory)); MAMF: the part's measured
               maximum achievable matmul FLOP/s (devices.py); ``waves``: the busy share of the waves of
               128 x 128 output tiles over the SMs (wave quantisation)
    attention  one fused flash-attention kernel per layer, whatever the eager decomposition:
               forward 4 b h T^2 d x 1/2 (causal), backward 2.5 x forward (FlashAttention-2's five
               matmuls against two), at FlashAttention-2's published best on the part (devices.py
               flash_share x dense peak) x FIT.attention
    memory     bytes / (HBM x FIT.memory): element-wise, norms, embedding, loss, casts
    launch     FIT.launch_us per kernel (the eager launches a step issues)
recompute (harness/recompute.py): "full" on every K-th block (variants ac, ac-every<K>: the block's
    forward again), "op" (variant ac-op, torchtitan's op-level SAC: the matmuls it does not save, and the
    block's memory-bound operators, again), "none".
optimizer: AdamW over the rank's shard, 32 B per parameter (fp32 master, gradient, two moments read;
    master and moments written; the gradient norm read) at HBM x FIT.memory.
communication: the strategy table's sends (harness/strategies.py, held to measured bytes) per
    collective, each timed by NCCL's own ring model (src/graph/tuning.cc: Ring/Simple base latency
    8.4 us, 3.4 us a step over NVLink, 9.6 us over the network) at a bus bandwidth of the link it
    crosses x NCCL_LINK_EFFICIENCY: NVLink (or PCIe) inside a node, the node's NICs across nodes.
    Gathers and reduce-scatters run per block (one collective per block and one for the root).
overlap: communication runs beside compute (FSDP's prefetch, DDP's buckets, ZeRO's overlap_comm);
    exposed = max(0, communication - compute) + the one block's share that nothing hides
              + FIT.overlap x the communication hidden (what NCCL's kernels, sharing SMs and HBM,
              cost the compute beside them)

The FIT values are global, fitted jointly on two GPU generations in tests/data/published_steps.json
(tools/fit_steptime.py); no row, model or device has a constant of its own, and the device table holds
no fitted value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.bandwidth import bus_factor, ring_steps
from harness.devices import NCCL_LINK_EFFICIENCY, Device
from harness.recompute import Recompute

TILE = 128  # output tile edge of a tensor-core GEMM (CUTLASS/cuBLAS 128 x 128 and wider)
ADAMW_BYTES_PER_PARAM = 32
RING_BASE_US, RING_NVLINK_US, RING_NET_US = 8.4, 3.4, 9.6  # NCCL src/graph/tuning.cc, Ring/Simple


@dataclass(frozen=True)
class Fit:
    """The predictor's global parameters (shares of the device's vendor peaks, and what overlap costs)."""

    gemm: float  # of the part's MAMF, a training GEMM without wave loss
    attention: float  # of FlashAttention-2's published best on the part (forward and backward alike)
    memory: float  # of HBM bandwidth, memory-bound kernels
    launch_us: float  # per kernel (the joint fit's value on the H100 rows, then held: below)
    overlap: float = 0.0  # step seconds lost per second of communication hidden behind compute
    fitted_on: str = "tests/data/published_steps.json (tools/fit_steptime.py)"


# gemm, attention, memory and overlap: fitted jointly by tools/fit_steptime.py on the 97 rows of
# tests/data/published_steps.json, two GPU generations (52 llm-foundry H100 80GB BF16 rows and 43
# llm-foundry A100 80GB rows, MPT 760M-70B, seq 512-65536, 8-64 GPUs; 2 torchtitan Llama 3.1 8B FSDP rows
# on H100, 8 and 128 GPUs). Each source left out in turn: docs/PLAN.md (``--cross-validate``).
# launch_us is a fourth value of an earlier joint fit on the H100 rows (2.95 us, about a CUDA kernel
# launch), held since: fitted with the others it trades against ``memory`` (3 to 137 us across folds
# with no change in error). overlap is fitted, not measured: NCCL's kernels take SMs and HBM bandwidth
# from the GEMMs they run beside, and without it (0) the H100 rows' error was 6.9% mean, with it 2.8%.
FIT = Fit(gemm=0.959, attention=0.493, memory=0.397, launch_us=2.95, overlap=0.791)


@dataclass(frozen=True)
class Network:
    devices_per_node: int
    inter_node_gbps: float | None  # the node's NICs together, Gb/s (1600 = 8 x 200 Gb/s RoCE)
    inter_node_busbw_gbps: float | None = None  # or a declared bus bandwidth across nodes, GB/s (a profile's)
    source: str = ""

    def busbw_gbps(self, nodes: int, intra: float) -> float:
        """Bus bandwidth of a ring over ``nodes`` nodes: the intra-node link, or across nodes the node's
        NICs (every channel of the ring leaves a node through one NIC: all NICs together carry it)."""
        if nodes <= 1:
            return intra
        if self.inter_node_busbw_gbps:
            return min(intra, self.inter_node_busbw_gbps)
        return min(intra, self.inter_node_gbps / 8 * NCCL_LINK_EFFICIENCY)


@dataclass
class Prediction:
    strategy: str
    world_size: int
    step_time_s: float
    tokens_per_s_per_device: float
    mfu: float
    terms: dict[str, float] = field(default_factory=dict)  # seconds per step
    communication: dict[str, float] = field(default_factory=dict)  # op -> seconds (before overlap)

    def as_json(self) -> dict:
        return {
            "estimated": True,
            "step_time_s": self.step_time_s,
            "tokens_per_s_per_device": self.tokens_per_s_per_device,
            "mfu": self.mfu,
            "terms_s": self.terms,
            "communication_s": self.communication,
        }


def gemm_time(batch: int, m: int, n: int, k: int, moved: float, device: Device, fit: Fit) -> float:
    tiles = batch * math.ceil(m / TILE) * math.ceil(n / TILE)
    waves = tiles / (math.ceil(tiles / device.sms) * device.sms)
    flops = 2.0 * batch * m * n * k
    return max(
        flops / (device.matmul_tflops * 1e12 * fit.gemm * waves), moved / (device.hbm_gbps * 1e9 * fit.memory)
    )


def attention_flops(profile, micro_batch: int, seq_len: int) -> tuple[float, float]:
    """(forward, backward) FLOPs of one layer's fused causal flash attention."""
    forward = 4.0 * micro_batch * profile.heads * seq_len * seq_len * profile.head_dim / 2
    return forward, 2.5 * forward


def _part_time(
    phase_ops: dict, device: Device, fit: Fit, gemm_share: float = 1.0, memory_share: float = 1.0
) -> dict[str, float]:
    gemm = gemm_share * sum(gemm_time(*g[:4], g[4], device, fit) for g in phase_ops["gemm"].gemms)
    memory = memory_share * phase_ops["memory"].bytes / (device.hbm_gbps * 1e9 * fit.memory)
    kernels = gemm_share * len(phase_ops["gemm"].gemms) + memory_share * phase_ops["memory"].kernels
    return {"gemm": gemm, "memory": memory, "launch": kernels * fit.launch_us * 1e-6}


def compute_terms(
    profile, device: Device, fit: Fit, *, micro_batch: int, seq_len: int, recompute: Recompute,
    op_share: float = 0.5,
) -> dict[str, float]:
    """Seconds of one micro-batch's forward and backward by operator class, and its recompute."""
    peak = device.attention_tflops * 1e12
    fwd_attn, bwd_attn = attention_flops(profile, micro_batch, seq_len)
    terms = {"gemm": 0.0, "memory": 0.0, "launch": 0.0}
    for part, times in ((profile.block, profile.n_layer), (profile.outside, 1)):
        for phase in ("forward", "backward"):
            for key, value in _part_time(part.phases[phase], device, fit).items():
                terms[key] += times * value
    terms["attention"] = profile.n_layer * (fwd_attn + bwd_attn) / (peak * fit.attention)
    forward, blocks = profile.block.phases["forward"], recompute.blocks(profile.n_layer)
    if recompute.policy == "full":
        again = _part_time(forward, device, fit)
        terms["recompute"] = blocks * (sum(again.values()) + fwd_attn / (peak * fit.attention))
    elif recompute.policy == "op":
        again = _part_time(forward, device, fit, gemm_share=op_share)
        terms["recompute"] = blocks * sum(again.values())
    else:
        terms["recompute"] = 0.0
    return terms


def ring_time(op: str, size: float, n: int, network: Network, device: Device, messages: int) -> float:
    """Seconds of ``messages`` ring collectives ``op`` moving ``size`` bytes in all among ``n`` ranks."""
    if n <= 1 or size <= 0:
        return 0.0
    per_node = network.devices_per_node
    nodes = max(1, math.ceil(n / per_node))
    busbw = network.busbw_gbps(nodes, (device.nvlink_gbps or device.pcie_gbps) * NCCL_LINK_EFFICIENCY)
    steps, inter_steps = ring_steps(op, n), ring_steps(op, nodes)
    hop = RING_NVLINK_US if device.nvlink_gbps else RING_NVLINK_US * 5.7 / 3.4  # PCI: tuning.cc's 5.7 us
    latency = RING_BASE_US + (steps - inter_steps) * hop + inter_steps * RING_NET_US
    return messages * latency * 1e-6 + bus_factor(op, n) * size / (busbw * 1e9)


def predict(
    profile,
    device: Device,
    *,
    strategy: str,
    sends: dict[str, float],
    calls: dict[str, int],
    world_size: int,
    network: Network,
    micro_batch: int,
    seq_len: int,
    grad_accum: int,
    recompute: Recompute,
    shards_optimizer: bool,
    model_flops_per_token: float,
    fit: Fit = FIT,
    op_share: float = 0.5,
    across: tuple = (),
) -> Prediction:
    """The estimated step of one rank. ``sends``, ``calls``: bytes and whole-model collectives per op
    over the step (``sends_of``), each run as one collective per block and one for the root;
    ``model_flops_per_token``: the MFU numerator (harness/flops.py's convention); ``op_share``: the
    share of a block's matmul FLOPs the op-level recompute runs again; ``across``: further collectives
    (op, bytes, ranks, Network) once per step (HSDP's all-reduce across nodes).
    pytest_llmbench/planner/timing.py asks it about a case."""
    per_mb = compute_terms(
        profile, device, fit, micro_batch=micro_batch, seq_len=seq_len, recompute=recompute,
        op_share=op_share,
    )
    terms = {f"compute_{k}" if k != "recompute" else k: grad_accum * v for k, v in per_mb.items()}
    compute = sum(terms.values())
    shard = profile.params / (world_size if shards_optimizer else 1)
    terms["optimizer"] = shard * ADAMW_BYTES_PER_PARAM / (device.hbm_gbps * 1e9 * fit.memory)
    messages = profile.n_layer + 1
    comm = {
        op: ring_time(op, size, world_size, network, device, messages * calls[op])
        for op, size in sends.items()
    }
    for op, size, ranks, net in across:
        comm[f"{op} across nodes"] = ring_time(op, size, ranks, net, device, messages)
    total_comm = sum(comm.values())
    hidden = min(total_comm, compute)
    exposed = max(0.0, total_comm - compute) + total_comm / messages + fit.overlap * hidden
    terms["exposed_communication"] = exposed if world_size > 1 else 0.0
    step = sum(terms.values())
    tokens = micro_batch * seq_len * grad_accum
    tps = tokens / step
    mfu = model_flops_per_token * tps / (device.dense_bf16_tflops * 1e12)
    return Prediction(strategy, world_size, step, tps, mfu, terms, comm)
