"""What communication hidden behind compute costs the compute, in the units it happens in.

A collective that runs beside the GEMMs is not free. NCCL runs it as one thread block (CTA) per channel,
each on an SM the GEMMs then cannot use, and it moves its bytes through HBM that the compute's kernels
also read. Both are facts of the part and of NCCL, not of a second of link time, so the cost carries
from an NVLink node to a 400 Gb/s fabric (where the same bytes take 8x longer but hold no more SMs):

    contention = hidden x channels / SMs                     the SM share NCCL holds while it runs
               + (hidden / communication) x HBM bytes / (HBM x FIT.memory)
                                                             the bytes it stages through HBM, at the rate
                                                             this model times every memory-bound byte

``hidden``: the seconds of communication compute covers (planner/step.py Overlap). Nothing here is
fitted: the channel count is read from NCCL's ring search and the bytes from its ring kernels.

**Channels** (NVIDIA/nccl at 5067397, Jun 2026). The ring search (src/graph/search.cc) takes the fastest
speed of the architecture's intra-node array that one GPU's NVLink (or PCI) bandwidth carries
(``sm90SpeedArrayIntra`` 60, 50, ... GB/s; ``speedArrayIntra`` 40, 30, ... before Hopper;
``sm100SpeedArrayIntra`` 90, 80, ...), as many channels of it as that bandwidth holds; then
``ncclTopoDupChannels`` doubles them when a channel runs at 25 GB/s or more (and, after Ampere, at
50 or more), and ``connectRings`` (src/graph/connect.cc) doubles them again, up to MAXCHANNELS 64. The
bandwidth in NCCL's units: NVLink links x the per-link figure of src/graph/topo.h (SM80 20.0, SM90 20.6,
SM100 40.1 GB/s) and PCI Gen4 x16 24 GB/s. An 8-GPU H100 node: 18 x 20.6 = 370.8 -> 6 channels at 60
-> 12 -> 24, 24 of 132 SMs. Across nodes the search uses the inter-node arrays and may settle on other
counts (16-32 on Hopper with a NIC a GPU); the intra-node count stands in for them. AMD parts: RCCL
stands in for NCCL with NVIDIA's rule on the part's links (named among the stand-ins).

**HBM bytes** per byte a rank sends (the ring kernels, src/device/*.h ``runRing``, Simple protocol):
all-gather ``directRecvCopyDirectSend``: the peer writes into this rank's output, which this rank reads
to forward, 2; reduce-scatter ``recvReduceSend``: the incoming chunk written to the FIFO, read back and
this rank's own input read, 3; all-reduce: a reduce-scatter then an all-gather over the same bytes,
(3 + 2) / 2 a byte sent. Across nodes NCCL stages through FIFOs for the NIC and touches more; the
NVLink counts stand in.

Lee et al. 2025 (arXiv 2507.03114) measured what overlap costs compute (about 0.61 s of compute a
hidden second on their NVLink nodes): a check on this model (docs/PLAN.md), not one of its constants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.bandwidth import bus_factor
from harness.devices import Device

MAXCHANNELS = 64  # src/include/device.h
# (per-link GB/s in NCCL's topology, the search's speed array): src/graph/topo.h, src/graph/search.cc
NVLINK_PER_LINK = {"sm80": 20.0, "sm90": 20.6, "sm100": 40.1}
PCI_GBPS = 24.0  # topo.h PCI_BW, Gen4 x16
SPEEDS = {
    "sm80": (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    "sm90": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    "sm100": (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
}
# NVLink bandwidth one way per GPU (devices.py nvlink_gbps) of one link, by generation: A100 12 links of
# 25, Hopper 18 of 25, Blackwell 18 of 50 GB/s (the parts' datasheets)
LINK_GBPS = {"sm80": 25.0, "sm90": 25.0, "sm100": 50.0}
# HBM bytes this rank touches per byte it sends, by collective (module docstring)
HBM_TOUCHES = {"all_gather": 2.0, "reduce_scatter": 3.0, "all_reduce": 2.5}


# NCCL's architecture class of each part, by the device table's name (its compute capability: the speed
# array the search reads). AMD's parts: RCCL, with NVIDIA's Hopper rule standing in.
ARCHITECTURE = {"a10": "sm80", "l40s": "sm80", "a100": "sm80", "h100": "sm90", "h200": "sm90", "mi3": "sm90",
                "b200": "sm100", "b300": "sm100", "gb200": "sm100"}


def architecture(device: Device) -> str:
    """NCCL's architecture class for the part (ARCHITECTURE, by the longest name prefix)."""
    prefixes = [p for p in ARCHITECTURE if device.name.startswith(p)]
    if not prefixes:
        raise ValueError(f"no NCCL architecture class for device {device.name!r}: add it to "
                         "planner/contention.py ARCHITECTURE")
    return ARCHITECTURE[max(prefixes, key=len)]


@dataclass(frozen=True)
class Channels:
    count: int
    said: str


def nccl_channels(device: Device) -> Channels:
    """The ring channels NCCL settles on inside a node of this part (module docstring)."""
    arch = architecture(device)
    if device.nvlink_gbps:
        links = round(device.nvlink_gbps / LINK_GBPS[arch])
        bandwidth = links * NVLINK_PER_LINK[arch]
        link = (f"{links} NVLinks x {NVLINK_PER_LINK[arch]:g} GB/s" if not device.name.startswith("mi")
                else f"RCCL stands in: NVIDIA's Hopper rule on {device.nvlink_gbps:g} GB/s of its fabric")
    else:
        bandwidth, link = PCI_GBPS, f"PCI {PCI_GBPS:g} GB/s"
    speed = next((s for s in SPEEDS[arch] if s <= bandwidth), SPEEDS[arch][-1])
    found = max(1, math.floor(bandwidth / speed))
    duplicate = speed >= 25.0 and not (arch != "sm80" and speed < 50.0 and found > 4)
    count = min(MAXCHANNELS, (2 * found if duplicate else found) * 2)
    return Channels(count, f"{link}: {found} ring channel(s) at {speed:g} GB/s"
                           f"{', doubled' if duplicate else ''}, doubled again: {count}")


def hbm_bytes(messages) -> float:
    """HBM bytes a rank touches for ``messages``: (op, collective size in bytes, ranks) each; it sends
    bus_factor(op, ranks) x size of each (harness/bandwidth.py) and touches HBM_TOUCHES[op] a byte sent."""
    return sum(HBM_TOUCHES[op] * bus_factor(op, n) * size for op, size, n in messages if n > 1)


def contention_s(hidden_s: float, communication_s: float, touched_bytes: float, device: Device,
                 memory_share: float) -> dict[str, float]:
    """Seconds the compute loses to ``hidden_s`` of communication run beside it: the SM share NCCL's
    channels hold and the HBM bytes it stages (of ``touched_bytes`` for all ``communication_s``)."""
    if hidden_s <= 0 or communication_s <= 0:
        return {"sm_share": 0.0, "hbm": 0.0}
    share = min(1.0, nccl_channels(device).count / device.sms)
    hbm = (hidden_s / communication_s) * touched_bytes / (device.hbm_gbps * 1e9 * memory_share)
    return {"sm_share": hidden_s * share, "hbm": hbm}
