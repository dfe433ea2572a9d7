"""The step-time model every estimate of this package shares, and the links its communication is timed on.

    step     = compute + other + exposed
    comm     = sum over the step's messages of  count x link.message_s(op, bytes, N)
    exposed  = comm - hidden + unhidden + cost x hidden,   hidden = min(comm, hides x compute)

``hides`` is the share of the compute that communication can run beside, ``unhidden`` what nothing
hides, ``cost`` the step seconds each hidden second still takes (Overlap). Three callers fill the
terms, from the least measured to the most:

    llmbench-plan --mfu   (mfu.py)       compute at a stated MFU; a declared bus bandwidth; a stated overlap
    llmbench-plan --time  (steptime.py)  compute from the device's roofline; NCCL's ring model (NcclRing);
                                         hides 1, one block's share unhidden, the fitted cost
    the report's projection (projection.py)  compute and wrapper measured; the collectives probe's
                                         measured times (Bandwidth); ``hides`` fitted on measured world
                                         sizes: the model calibrated by measured points

The ring law (bus factor, latency steps) is harness/bandwidth.py's, read here and nowhere else.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from harness.bandwidth import bus_factor, ring_steps
from harness.devices import NCCL_LINK_EFFICIENCY, Device

RING_BASE_US, RING_NVLINK_US, RING_NET_US = 8.4, 3.4, 9.6  # NCCL src/graph/tuning.cc, Ring/Simple
RING_PCI_US = 5.7  # tuning.cc's per-step latency over PCI


@dataclass(frozen=True)
class Overlap:
    """How a step's communication runs beside its compute (the module's ``exposed``)."""

    hides: float = 0.0  # share of the compute that communication can run beside: 0 nothing hidden
    unhidden_s: float = 0.0  # communication nothing hides (the last block's, with no compute after it)

    def exposed_s(self, comm_s: float, compute_s: float) -> float:
        """What compute cannot hide; what the hidden part costs the compute is planner/contention.py's."""
        hidden = min(comm_s, self.hides * compute_s)
        return comm_s - hidden + self.unhidden_s


class Link(Protocol):
    def message_s(self, op: str, size_bytes: float, n: int) -> float:
        """Seconds of one collective ``op`` over ``size_bytes`` in all among ``n`` ranks."""


def comm_s(messages: Iterable[tuple[str, float, float]], link: Link, n: int) -> dict[str, float]:
    """Seconds per op of ``messages`` (op, bytes of one message, how many) on ``n`` ranks."""
    out: dict[str, float] = {}
    for op, size, count in messages:
        out[op] = out.get(op, 0.0) + (count * link.message_s(op, size, n) if n > 1 and size > 0 else 0.0)
    return out


@dataclass(frozen=True)
class Bandwidth:
    """A link known by measurement or declaration: busbw (GB/s) per collective as a function of
    message size, from the rows of a collectives probe on ``world_size`` ranks, or one declared figure.

    A probe's time at size S on its Np ranks, carried to N ranks by the ring model's two parts:

        t(op, S, N) = lat x steps(op, N) / steps(op, Np)  +  (t_probe(S) - lat) x f(op, N) / f(op, Np)

    t_probe(S) = S x f(op, Np) / busbw(S) (busbw log-interpolated between measured sizes), lat its
    time of the smallest size, f the bus factor and steps the ring's latency steps. At N = Np it is
    the probe's measured time, size by size. A declared figure is bandwidth only: S x f(op, N) / busbw.
    """

    source: str  # e.g. "measured (probe ws2)" or "declared (profile [network])"
    rows: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # op -> [(size, busbw)]
    declared_gbps: float | None = None
    world_size: int = 2  # the probe's ranks

    def busbw_gbps(self, op: str, size_bytes: float) -> float:
        if self.declared_gbps is not None:
            return self.declared_gbps
        points = sorted(self.rows[op])
        if size_bytes <= points[0][0]:
            return points[0][1]
        for (s0, b0), (s1, b1) in zip(points, points[1:], strict=False):
            if size_bytes <= s1:
                x = (math.log(size_bytes) - math.log(s0)) / (math.log(s1) - math.log(s0))
                return b0 + x * (b1 - b0)
        return points[-1][1]

    def message_s(self, op: str, size_bytes: float, n: int) -> float:
        if n == 1:
            return 0.0
        if self.declared_gbps is not None:
            return size_bytes * bus_factor(op, n) / (self.declared_gbps * 1e9)
        np_ = self.world_size
        probe_s = size_bytes * bus_factor(op, np_) / (self.busbw_gbps(op, size_bytes) * 1e9)
        smallest = min(size for size, _ in self.rows[op])
        lat = min(probe_s, smallest * bus_factor(op, np_) / (self.busbw_gbps(op, smallest) * 1e9))
        return (lat * ring_steps(op, n) / ring_steps(op, np_)
                + (probe_s - lat) * bus_factor(op, n) / bus_factor(op, np_))


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


@dataclass(frozen=True)
class NcclRing:
    """A link known by its parts: NCCL's own ring model (src/graph/tuning.cc, Ring/Simple), base
    latency 8.4 us and 3.4 us a step over NVLink (5.7 us over PCI), 9.6 us a step across nodes, at
    the bus bandwidth of the link each ring crosses x NCCL_LINK_EFFICIENCY."""

    network: Network
    device: Device

    def message_s(self, op: str, size_bytes: float, n: int) -> float:
        if n <= 1 or size_bytes <= 0:
            return 0.0
        device, nodes = self.device, max(1, math.ceil(n / self.network.devices_per_node))
        intra = (device.nvlink_gbps or device.pcie_gbps) * NCCL_LINK_EFFICIENCY
        busbw = self.network.busbw_gbps(nodes, intra)
        steps, inter_steps = ring_steps(op, n), ring_steps(op, nodes)
        hop = RING_NVLINK_US if device.nvlink_gbps else RING_PCI_US
        latency = RING_BASE_US + (steps - inter_steps) * hop + inter_steps * RING_NET_US
        return latency * 1e-6 + bus_factor(op, n) * size_bytes / (busbw * 1e9)
