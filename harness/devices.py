"""The device table: every GPU part's hardware facts, each with its source, in one place. Standard
library only: measured MFU on a rank (harness/flops.py ``peak_flops``, by the name the driver reports),
the step-time predictor and the memory planner (pytest_llmbench/planner/), the report's part of a run
and tools/gpu_smoke.py all read it. Adding a GPU part is one row here.

Nothing here is fitted to a training run. The predictor's efficiency terms, fitted on published
training measurements, are global and live in pytest_llmbench/planner/steptime.py (``FIT``).

    dense_bf16_tflops  tensor-core peak without sparsity (the MFU denominator, harness/flops.py)
    hbm_gbps           device memory bandwidth, GB/s
    memory_mib         device memory as the driver reports it (nvidia-smi memory.total, ECC on), MiB: the
                       "80GB" of an A100 or H100 is 80 GiB less what the driver keeps (81,920 and 81,559 MiB),
                       not 80e9 bytes (74.5 GiB, which would call a 77 GiB run too big). Read from public
                       nvidia-smi outputs of each part (A100-SXM4-40GB and A100-PCIE-40GB: 40,537 MiB).
    sms                streaming multiprocessors (what a GEMM's tiles are spread over: wave quantisation)
    nvlink_gbps        NVLink bandwidth one way per GPU, GB/s (0: none, PCIe between GPUs)
    pcie_gbps          PCIe one way per GPU, GB/s (the link between GPUs without NVLink)
    mamf_tflops        measured: the Maximum Achievable Matmul FLOP/s of a bf16 matmul (the best shape of a
                       brute-force search), published in stas00/ml-engineering compute/accelerator/README.md,
                       "Maximum Achievable Matmul FLOPS comparison table" (BF16, v2); None where that table
                       has no row for the part: then dense peak x MAMF_EFFICIENCY
    flash_share        published: the share of dense peak FlashAttention-2 reaches on the part's architecture
                       (Ampere and Ada: "50-73% of the theoretical maximum FLOPs/s on A100", Dao 2023,
                       arXiv 2307.08691; Hopper: "FlashAttention-2 achieving only 35% utilization on the
                       H100 GPU", Shah et al. 2024, arXiv 2407.08608): the kernel's own ceiling on the part
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    name: str
    label: str
    dense_bf16_tflops: float
    hbm_gbps: float
    memory_mib: int
    sms: int
    nvlink_gbps: float
    pcie_gbps: float
    source: str
    mamf_tflops: float | None = None
    mamf_source: str = ""
    flash_share: float = 0.0
    gpu_name: str = ""  # a regex of the names the driver reports for the part (torch.cuda.get_device_name)
    note: str = ""  # what stands in where no figure is published for the part (its MAMF, its links)

    @property
    def memory_gib(self) -> float:
        return self.memory_mib / 1024

    @property
    def attention_tflops(self) -> float:
        """What FlashAttention-2 reaches on the part at best (its published share of dense peak)."""
        return self.dense_bf16_tflops * self.flash_share

    def stand_ins(self) -> list[str]:
        """What stands in for a figure nobody published for this part (the predictor prints them)."""
        out = []
        if self.mamf_tflops is None:
            out.append(f"its MAMF: dense peak x {MAMF_EFFICIENCY:.0%}, the measured parts' mean "
                       "(no measurement)")
        if self.name not in FLASH_MEASURED:
            measured = "A100 80GB" if self.flash_share == AMPERE_FLASH else "H100 SXM"
            out.append(f"its flash-attention ceiling: FlashAttention-2's {measured} share of dense peak "
                       f"({self.flash_share:.0%}; no figure published for this part)")
        return out

    @property
    def matmul_tflops(self) -> float:
        """What a large bf16 matmul reaches: measured (MAMF), else dense peak x MAMF_EFFICIENCY."""
        return self.mamf_tflops or self.dense_bf16_tflops * MAMF_EFFICIENCY


_A10 = "NVIDIA A10 Tensor Core GPU datasheet (nvidia.com, 2021)"
_L40S = "NVIDIA L40S GPU datasheet (nvidia.com, 2023)"
_A100 = (
    "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com, 2021) and the NVIDIA A100 architecture "
    "whitepaper (108 SMs)"
)
_H100 = (
    "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com, 2023; dense = the sparse figure / 2: NVL 1,671 -> "
    "835.5, 94 GB, 3.9 TB/s) and the NVIDIA H100 architecture whitepaper (132 SMs SXM5 and NVL, 114 PCIe)"
)
_H200 = ("NVIDIA H200 Tensor Core GPU datasheet (nvidia.com, 2024): H100's SXM5 die with 141 GB HBM3e; the "
         "NVL card 1,671 TFLOPS bf16 with sparsity (835.5 dense)")
_BLACKWELL = (
    "NVIDIA DGX B200, DGX B300 and GB200 NVL72 datasheets (nvidia.com, 2024-2025), dense bf16 (the sparse "
    "figure / 2): B200 and B300 2,250 TFLOPS, GB200 2,500 per GPU; 180 GB (B200), 186 GB (GB200: 13.4 TB "
    "per 72 GPUs), 288 GB (B300) of HBM3e at 8 TB/s; fifth-generation NVLink, 1.8 TB/s per GPU both ways; "
    "B200 148 SMs")
_AMD = (
    "AMD Instinct MI300X, MI325X and MI355X specifications (amd.com): dense bf16 = clock x FMAs per Matrix "
    "Core x 2 x Matrix Cores: 2,100 MHz x 256 x 2 x 1,216 = 1,307.4 TFLOPS (MI300X, MI325X), 2,400 MHz x "
    "512 x 2 x 1,024 = 2,516.6 (MI355X, AMD's '2.5 PFLOPS'); 5.3, 6.0 and 8.0 TB/s; VRAM (192, 256, 288 "
    "GiB) and CUs (304, 304, 256) as the ROCm GPU specifications table gives them; seven Infinity Fabric "
    "links of 128 GB/s both ways to the node's other GPUs (MI300X, MI325X)")
_MAMF_NEW = "stas00/ml-engineering compute/accelerator/README.md, MAMF table (BF16)"
_NV_MEMORY = "memory: the datasheet's GB as 10^9 bytes (the driver's MiB figure is not published here); "
_RCCL = ("RCCL stands in for NCCL on AMD parts: the ring model and NCCL_LINK_EFFICIENCY are NCCL's; the "
         "link is the fully connected Infinity Fabric's seven links together, one way (RCCL's channels "
         "spread over them); CUs count as SMs")
_NO_MAMF = "no MAMF row for the part: dense peak x MAMF_EFFICIENCY stands in; "
_BRIDGED = "NVLink bridges join pairs only: PCIe is the ring's link"

AMPERE_FLASH, HOPPER_FLASH = 0.73, 0.35  # FlashAttention-2's best share of dense peak (flash_share above)
FLASH_MEASURED = {"a100-80gb", "h100-sxm"}  # the parts those papers measured (A100 80GB SXM4, H100 SXM5)
_MAMF = "stas00/ml-engineering compute/accelerator/README.md, MAMF table (BF16, v2)"
# The measured parts' MAMF / dense peak in that table: A100 SXM 86.9%, GH200 83.6%, A100 PCIe 81.1%,
# H100 SXM 80.3%. Their mean stands in for a part the table has no row for (A10, L40S, H100 PCIe).
MAMF_EFFICIENCY = (0.869 + 0.836 + 0.811 + 0.803) / 4

DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("a10", "NVIDIA A10", 125.0, 600.0, 23028, 72, 0.0, 32.0, _A10, flash_share=AMPERE_FLASH,
           gpu_name=r"\bA10$"),
    Device("l40s", "NVIDIA L40S", 362.05, 864.0, 46068, 142, 0.0, 32.0, _L40S, flash_share=AMPERE_FLASH,
           gpu_name=r"\bL40S\b"),
    Device("a100-40gb", "NVIDIA A100-SXM4-40GB", 312.0, 1555.0, 40537, 108, 300.0, 32.0, _A100,
           mamf_tflops=271.2, mamf_source=f"{_MAMF}: NVIDIA A100 SXM", flash_share=AMPERE_FLASH,
           gpu_name=r"\bA100-SXM4-40GB\b"),
    Device("a100-80gb", "NVIDIA A100-SXM4-80GB", 312.0, 2039.0, 81920, 108, 300.0, 32.0, _A100,
           mamf_tflops=271.2, mamf_source=f"{_MAMF}: NVIDIA A100 SXM", flash_share=AMPERE_FLASH,
           gpu_name=r"\bA100-SXM4-80GB\b"),
    Device("h100-sxm", "NVIDIA H100 80GB HBM3 (SXM5)", 989.4, 3350.0, 81559, 132, 450.0, 64.0, _H100,
           mamf_tflops=794.5, mamf_source=f"{_MAMF}: NVIDIA H100 SXM", flash_share=HOPPER_FLASH,
           gpu_name=r"\bH100 80GB HBM3$|\bH100 SXM"),
    Device("h100-pcie", "NVIDIA H100 PCIe", 756.0, 2000.0, 81559, 114, 0.0, 64.0, _H100,
           flash_share=HOPPER_FLASH, gpu_name=r"\bH100 PCIe\b"),
    # the H200 SXM runs the H100's die under the same 700 W limit: the table's H100 SXM row, noted "H200 is
    # the same" there (its GH200 row, 828.6, is that die at 900 W)
    Device("h200", "NVIDIA H200 (SXM)", 989.4, 4800.0, 143771, 132, 450.0, 64.0, _H200, mamf_tflops=794.5,
           mamf_source=f"{_MAMF}: NVIDIA H100 SXM, 'H200 is the same'",
           flash_share=HOPPER_FLASH, gpu_name=r"\bH200$"),
    # PCIe cards: NVLink bridges join pairs (H200 NVL: up to four), so a ring over a node's GPUs
    # crosses PCIe, which these rows give as the link between GPUs (nvlink_gbps 0)
    Device("a100-pcie-40gb", "NVIDIA A100-PCIE-40GB", 312.0, 1555.0, 40537, 108, 0.0, 32.0, _A100,
           flash_share=AMPERE_FLASH, gpu_name=r"\bA100-PCIE-40GB\b", note=_NO_MAMF + _BRIDGED),
    Device("a100-pcie-80gb", "NVIDIA A100 80GB PCIe", 312.0, 1935.0, 81920, 108, 0.0, 32.0, _A100,
           flash_share=AMPERE_FLASH, gpu_name=r"\bA100 80GB PCIe\b", note=_NO_MAMF + _BRIDGED),
    Device("h100-nvl", "NVIDIA H100 NVL", 835.5, 3900.0, 95830, 132, 0.0, 64.0, _H100,
           flash_share=HOPPER_FLASH, gpu_name=r"\bH100 NVL\b", note=_NO_MAMF + _BRIDGED),
    Device("h200-nvl", "NVIDIA H200 NVL", 835.5, 4800.0, 143771, 132, 0.0, 64.0, _H200,
           flash_share=HOPPER_FLASH, gpu_name=r"\bH200 NVL\b", note=_NO_MAMF + _BRIDGED),
    # Parts in use now, from their datasheets; what no one published for them stands in, named in the note
    # (their flash-attention ceiling: Hopper's share, printed by stand_ins(); the driver's memory figure).
    Device("b200", "NVIDIA B200 (HGX, 1,000 W)", 2250.0, 8000.0, 171661, 148, 900.0, 64.0, _BLACKWELL,
           mamf_tflops=1745.0, mamf_source=f"{_MAMF_NEW}: NVIDIA B200 SXM", flash_share=HOPPER_FLASH,
           gpu_name=r"\bB200\b", note=_NV_MEMORY.rstrip("; ")),
    Device("b300", "NVIDIA B300 (HGX, Blackwell Ultra)", 2250.0, 8000.0, 274658, 148, 900.0, 64.0,
           _BLACKWELL,
           mamf_tflops=1769.0, mamf_source=f"{_MAMF_NEW}: NVIDIA B300 SXM", flash_share=HOPPER_FLASH,
           gpu_name=r"\bB300\b", note=_NV_MEMORY + "its SMs: the B200's 148 (no figure verified here)"),
    Device("gb200", "NVIDIA GB200 (NVL72, a Blackwell GPU at 1,200 W)", 2500.0, 8000.0, 177383, 148, 900.0,
           64.0, _BLACKWELL, mamf_tflops=1822.0, mamf_source=f"{_MAMF_NEW}: NVIDIA GB200 SXM",
           flash_share=HOPPER_FLASH, gpu_name=r"\bGB200\b",
           note=_NV_MEMORY + "its SMs: the B200's 148"),
    Device("mi300x", "AMD Instinct MI300X", 1307.4, 5300.0, 196608, 304, 448.0, 64.0, _AMD,
           mamf_tflops=668.4, mamf_source=f"{_MAMF_NEW}: AMD MI300X", flash_share=HOPPER_FLASH,
           gpu_name=r"\bMI300X\b", note=_RCCL),
    Device("mi325x", "AMD Instinct MI325X", 1307.4, 6000.0, 262144, 304, 448.0, 64.0, _AMD,
           mamf_tflops=784.9, mamf_source=f"{_MAMF_NEW}: AMD MI325X (1,000 W)", flash_share=HOPPER_FLASH,
           gpu_name=r"\bMI325X\b", note=_RCCL),
    Device("mi355x", "AMD Instinct MI355X", 2516.6, 8000.0, 294912, 256, 448.0, 64.0, _AMD,
           mamf_tflops=1565.0,
           mamf_source=f"{_MAMF_NEW}: AMD MI355X", flash_share=HOPPER_FLASH, gpu_name=r"\bMI355X\b",
           note=_RCCL + "; its Infinity Fabric links: the MI325X's (no figure verified here)"),
)}

# NCCL reaches about 80% of the link's line rate in bus bandwidth (nccl-tests): ~370 of 450 GB/s on
# H100 NVLink with the ring algorithm, ~235 of 300 GB/s on A100 (NVIDIA/nccl-tests#212). A stated
# fact of NCCL's transports, not fitted here.
NCCL_LINK_EFFICIENCY = 0.8


class DeviceError(ValueError):
    pass


def by_gpu_name(name: str) -> Device | None:
    """The part whose ``gpu_name`` pattern matches the name the driver reports (case-insensitive), or
    None: MFU is then left empty, never guessed from another part."""
    return next((d for d in DEVICES.values() if d.gpu_name and re.search(d.gpu_name, name, re.IGNORECASE)),
                None)


def get(name: str) -> Device:
    try:
        return DEVICES[name]
    except KeyError:
        raise DeviceError(
            f"--device {name!r}: not in the device table; known: {', '.join(DEVICES)}"
        ) from None
