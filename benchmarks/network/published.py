"""Published nccl-tests results to hold the presets against, each with its source.

Every number below was read from the cited page (GitHub issue threads, benchmark result files);
none was used to set a preset parameter, except where ``independent`` is False: then the preset's
efficiency factor comes from the same statement, and the row only checks the arithmetic.
Sizes follow nccl-tests' size column (bytes). A row gives a bus bandwidth, or a time for small
messages where the printed bandwidth has too few digits.
"""

from __future__ import annotations

import dataclasses

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

AZURE_A100 = (
    "Azure/AI-benchmarking-guide, Azure_Results/ND_A100_v4_results.md: ND A100 v4 "
    "(8x A100 SXM4 80GB, NVSwitch), NCCL 2.18.5, all_reduce in-place busbw"
)
AZURE_H200 = (
    "Azure/AI-benchmarking-guide, Azure_Results/ND_H200_v5_results.md: ND H200 v5 (8x H200), "
    "NCCL 2.20.5, all_reduce in-place busbw"
)
AZURE_GB200 = (
    "Azure/AI-benchmarking-guide, Azure_Results/ND_GB200_v6_results.md: ND GB200 v6 (one 4-GPU "
    "compute tray), NCCL 2.25.1, all_reduce Ring in-place busbw"
)
NCCL_TESTS_212 = (
    "NVIDIA/nccl-tests issue 212, NCCL maintainer (2024-05): H100 8 GPUs 'effective NVLink bandwidth "
    "of 370GB/s ... BusBw when running non-allreduce operations, or ... NCCL_ALGO=RING'; 'peak busBw "
    "of ~480GB/s' with NVLink SHARP"
)
NCCL_TESTS_290 = (
    "NVIDIA/nccl-tests issue 290, NCCL maintainer (2025-03): 'For NDR @ 400Gbps you should see "
    "46-48GB/s per NIC' (8 NICs per node; two nodes, NCCL_ALGO=RING)"
)
NCCL_812 = (
    "NVIDIA/nccl issue 812, NCCL maintainer (2023-03): 'On an Nvidia DGX-A100 system we have "
    "8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW' (ring; node count and size not stated)"
)
NCCL_1801 = (
    "NVIDIA/nccl issue 1801 (2025-08): GB200, three NVLink partitions in different racks joined "
    "only by InfiniBand, all_reduce 16 GiB, NCCL 2.27.3"
)
COREWEAVE_43 = (
    "coreweave/nccl-tests pull request 43 (2025-02): one full GB200 NVL72 rack, all_reduce out-of-place"
)
COREWEAVE_92 = (
    "coreweave/nccl-tests pull request 92 (2026-05): H100 8-GPU x 2-node, 8G all_reduce, default algorithm"
)
NCCL_TESTS_283 = (
    "NVIDIA/nccl-tests issue 283 (2025-01): 248 nodes of 8 H200, all_reduce 512 MiB, default "
    "algorithm, 'typically measuring around 350G' (user report, unstable run to run)"
)
DEEPEP_303 = (
    "deepseek-ai/DeepEP issue 303: 8x H20 in one node (NVLink 4 and NVSwitch as H100), "
    "all_reduce out-of-place time"
)
NCCL_1244 = (
    "NVIDIA/nccl issue 1244 (2024-04): 2 nodes of 8 H20 (NVLink 4, 8 ConnectX-7 NDR each), "
    "NCCL_ALGO=NVLSTree, NCCL 2.21.5, all_reduce out-of-place time"
)


@dataclasses.dataclass(frozen=True)
class Published:
    system: str  # preset name
    op: str  # nccl-tests program without _perf
    num_gpus: int
    gpus_per_node: int | None  # None: whole nodes of the preset
    size_bytes: int
    algorithm: str | None  # None: NCCL's default choice; else NCCL_ALGO (a candidate name prefix)
    source: str
    busbw_gb_per_s: float | None = None
    time_us: float | None = None
    independent: bool = True
    note: str = ""


ROWS = (
    Published("dgx-a100", "all_reduce", 8, None, 8 * GIB, None, AZURE_A100, busbw_gb_per_s=231.58),
    Published("dgx-a100", "all_reduce", 8, None, 16 * MIB, None, AZURE_A100, busbw_gb_per_s=109.22),
    Published("dgx-a100", "all_reduce", 8, None, 1 * MIB, None, AZURE_A100, busbw_gb_per_s=36.22),
    Published("dgx-a100", "all_reduce", 16, None, 8 * GIB, "ring", NCCL_812, busbw_gb_per_s=192.0),
    Published("dgx-h100", "all_reduce", 8, None, 8 * GIB, None, NCCL_TESTS_212, busbw_gb_per_s=480.0),
    Published(
        "dgx-h100",
        "all_reduce",
        8,
        None,
        8 * GIB,
        "ring",
        NCCL_TESTS_212,
        busbw_gb_per_s=370.0,
        independent=False,
        note="NVLink efficiency is NCCL's 20.6 GB/s per link, the figure behind this statement",
    ),
    Published(
        "dgx-h100",
        "all_gather",
        8,
        None,
        8 * GIB,
        None,
        NCCL_TESTS_212,
        busbw_gb_per_s=370.0,
        independent=False,
        note="NVLink efficiency is NCCL's 20.6 GB/s per link, the figure behind this statement",
    ),
    Published("dgx-h100", "all_reduce", 8, None, 1 * KIB, None, DEEPEP_303, time_us=16.38, note="H20 GPUs"),
    Published(
        "dgx-h100",
        "all_reduce",
        16,
        None,
        8 * GIB,
        "ring",
        NCCL_TESTS_290,
        busbw_gb_per_s=8 * 47.0,
        independent=False,
        note="NIC efficiency 0.94 is the middle of this statement's 46-48 GB/s",
    ),
    Published("dgx-h100", "all_reduce", 16, None, 8 * GIB, None, COREWEAVE_92, busbw_gb_per_s=440.58),
    Published(
        "dgx-h100",
        "all_reduce",
        16,
        None,
        4,
        "nvls_tree",
        NCCL_1244,
        time_us=47.54,
        note="H20 GPUs",
    ),
    Published("dgx-h200", "all_reduce", 8, None, 8 * GIB, None, AZURE_H200, busbw_gb_per_s=479.98),
    Published("dgx-h200", "all_reduce", 8, None, 16 * MIB, None, AZURE_H200, busbw_gb_per_s=240.41),
    Published("dgx-h200", "all_reduce", 8, None, 1 * MIB, None, AZURE_H200, busbw_gb_per_s=52.96),
    Published("dgx-h200", "all_reduce", 1984, None, 512 * MIB, None, NCCL_TESTS_283, busbw_gb_per_s=350.0),
    Published("gb200-nvl72", "all_reduce", 4, 4, 8 * GIB, "ring", AZURE_GB200, busbw_gb_per_s=679.61),
    Published("gb200-nvl72", "all_reduce", 4, 4, 16 * MIB, "ring", AZURE_GB200, busbw_gb_per_s=331.09),
    Published("gb200-nvl72", "all_reduce", 4, 4, 1 * MIB, "ring", AZURE_GB200, busbw_gb_per_s=80.48),
    Published("gb200-nvl72", "all_reduce", 72, None, 8 * GIB, None, COREWEAVE_43, busbw_gb_per_s=834.57),
    Published("gb200-nvl72", "all_reduce", 12, 4, 16 * GIB, "ring", NCCL_1801, busbw_gb_per_s=196.72),
    Published("gb200-nvl72", "all_reduce", 12, 4, 16 * GIB, "tree", NCCL_1801, busbw_gb_per_s=234.43),
    Published("gb200-nvl72", "all_reduce", 24, 8, 16 * GIB, "ring", NCCL_1801, busbw_gb_per_s=393.66),
    Published("gb200-nvl72", "all_reduce", 24, 8, 16 * GIB, "tree", NCCL_1801, busbw_gb_per_s=485.68),
)


# Whole all_reduce curves (8 GPUs, one node), for the calibration check: sizes 1 KiB x 2**k (the
# page labels them 1K, 2K, ... 65K, 132K, ... 8G), in-place bus bandwidth in GB/s.
CURVES = {
    "dgx-a100": (
        AZURE_A100,
        (
            0.04,
            0.08,
            0.17,
            0.33,
            0.67,
            1.37,
            2.70,
            5.15,
            10.11,
            19.24,
            36.22,
            53.54,
            71.43,
            89.99,
            109.22,
            132.77,
            166.63,
            174.18,
            213.87,
            221.58,
            228.10,
            230.22,
            230.48,
            231.58,
        ),
    ),
    "dgx-h200": (
        AZURE_H200,
        (
            0.06,
            0.12,
            0.23,
            0.47,
            0.93,
            1.84,
            3.72,
            7.39,
            14.75,
            29.38,
            52.96,
            88.78,
            138.44,
            181.94,
            240.41,
            300.91,
            368.11,
            412.45,
            432.24,
            442.72,
            467.58,
            472.57,
            477.41,
            479.98,
        ),
    ),
}
