"""Named GPUs for dry runs without the device (`--gpu NAME`): their published figures as a `Hardware`.

A lane's `hello` is always the truth for a real run (`Hardware.from_hello`); a profile lets a user prepare
and compile kernels for a GPU they are not on (a DGX Spark from a laptop). Bandwidths here are published
peaks (`measured=False`), above what a copy reaches (the H200's measured copy is 4.2 of 4.8 TB/s).

Sources, per figure:
- Shared memory per block (opt-in maximum) and per SM, resident threads per SM: the CUDA C++ Programming
  Guide, "Technical Specifications per Compute Capability": 8.0: 163 KB / 164 KB, 2048 threads;
  8.6 and 8.9: 99 KB / 100 KB, 1536 threads; 9.0 and 10.0: 227 KB / 228 KB, 2048 threads; 12.x: 99 KB /
  100 KB, 1536 threads.
- Clusters: compute capability 9.0 and up has them; the cluster kernels here are only offered to 9.x and
  10.x (`engine.propose.base.arch_has_clusters`): GB10 lacks distributed shared memory and TMA multicast
  (NVIDIA/dgx-spark-playbooks #22), and nothing here was verified on 12.x clusters.
- SMs, L2, bandwidth: NVIDIA's datasheets and architecture whitepapers, noted on each entry; the H200 is
  what our own lane reported on one (docs/results/lane-h200/bench_lane.json: 132 SMs, 60 MiB L2).
"""

from __future__ import annotations

from engine.errors import UsageError
from engine.propose.base import Hardware

_KB = 1024
_MB = 1 << 20

# Per compute capability (CUDA Programming Guide table, see above): (smem per block opt-in, per SM, threads per SM)
_SM80 = dict(max_shared_per_block=163 * _KB, shared_per_sm=164 * _KB, max_threads_per_sm=2048)
_SM89 = dict(max_shared_per_block=99 * _KB, shared_per_sm=100 * _KB, max_threads_per_sm=1536)
_SM90 = dict(max_shared_per_block=227 * _KB, shared_per_sm=228 * _KB, max_threads_per_sm=2048)
_SM100 = dict(max_shared_per_block=227 * _KB, shared_per_sm=228 * _KB, max_threads_per_sm=2048)
_SM12X = dict(max_shared_per_block=99 * _KB, shared_per_sm=100 * _KB, max_threads_per_sm=1536)

PROFILES: dict[str, Hardware] = {
    # H200 SXM (Hopper GH100): 132 SMs, 4.8 TB/s HBM3e (NVIDIA H200 datasheet); L2 as our lane read it.
    "h200": Hardware("NVIDIA H200", "sm_90", 132, 60 * _MB, 4.8e12, measured=False, **_SM90),
    # H100 SXM5: 132 SMs, 50 MB L2, 3.35 TB/s HBM3 (NVIDIA H100 datasheet, Hopper whitepaper).
    "h100": Hardware("NVIDIA H100 SXM", "sm_90", 132, 50 * _MB, 3.35e12, measured=False, **_SM90),
    # A100 SXM4 80 GB: 108 SMs, 40 MB L2, 2.04 TB/s HBM2e (NVIDIA A100 datasheet, Ampere whitepaper).
    "a100": Hardware("NVIDIA A100-SXM4-80GB", "sm_80", 108, 40 * _MB, 2.039e12, measured=False, **_SM80),
    # L40S (AD102): 142 SMs, 96 MB L2, 864 GB/s GDDR6 (NVIDIA L40S datasheet, Ada whitepaper).
    "l40s": Hardware("NVIDIA L40S", "sm_89", 142, 96 * _MB, 8.64e11, measured=False, **_SM89),
    # GeForce RTX 4090 (AD102): 128 SMs, 72 MB L2, 1008 GB/s GDDR6X (Ada whitepaper).
    "rtx-4090": Hardware("NVIDIA GeForce RTX 4090", "sm_89", 128, 72 * _MB, 1.008e12, measured=False, **_SM89),
    # GeForce RTX 5090 (GB202): 170 SMs, 96 MB L2, 1792 GB/s GDDR7 (NVIDIA RTX Blackwell whitepaper).
    "rtx-5090": Hardware("NVIDIA GeForce RTX 5090", "sm_120", 170, 96 * _MB, 1.792e12, measured=False,
                         **_SM12X),
    # B200 (Blackwell DC, two dies): 148 SMs, 8 TB/s HBM3e (NVIDIA DGX B200 / HGX datasheets); L2 126 MB
    # as commonly reported by deviceQuery (not in the datasheet: the least certain figure here).
    "b200": Hardware("NVIDIA B200", "sm_100", 148, 126 * _MB, 8.0e12, measured=False, **_SM100),
    # DGX Spark (GB10): compute capability 12.1, 48 SMs, 273 GB/s LPDDR5X shared with the CPU, 99 KB shared
    # memory per block, no wgmma / tcgen05 / TMA multicast (../shared/reference/dgx-spark-and-scale-out.md:
    # HazyResearch/ThunderKittens PR #203, NVIDIA/dgx-spark-playbooks #22); L2 24 MB (NVIDIA GB10 figures).
    "dgx-spark": Hardware("NVIDIA GB10", "sm_121", 48, 24 * _MB, 2.73e11, measured=False, integrated=True,
                          **_SM12X),
}


def profile_names() -> list[str]:
    """The names `profile` accepts, in table order."""
    return list(PROFILES)


def profile(name: str) -> Hardware:
    """The named GPU's published figures; a UsageError naming the valid names for any other name."""
    key = name.strip().lower()
    if key not in PROFILES:
        raise UsageError(f"--gpu {name}: unknown GPU; use one of {', '.join(PROFILES)}")
    return PROFILES[key]
