#!/usr/bin/env python3
"""Candidates per minute over Ray compile lanes (engine.lane.ray_lanes), for N = 1, 2, … compile actors.

    python scripts/bench_ray_lanes.py                 # N = 1, 2; 24 candidates each
    python scripts/bench_ray_lanes.py --lanes 1 2 4 --candidates 48

Each N gets a fresh local Ray instance with N CPUs and N compile actors (`num_cpus=1`), a warm-up compile
per actor (NVRTC's first load is not a candidate's cost), then distinct candidates (no cache hit) all
submitted at once, as the orchestrator's proposals in flight would be. Prints the rate per N and its ratio
to N times one actor's (issue 22's target: at least 0.8·N for N up to the cores available). Needs Ray and
NVRTC, no GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.lane.ray_lanes import RayLanes, require_ray  # noqa: E402

SOURCE = """extern "C" __global__ void cand_{tag}(float* __restrict__ y, const float* __restrict__ x, int n) {{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = x[i], acc = 0.0f;
  #pragma unroll
  for (int k = 0; k < 64; ++k) acc = fmaf(acc, {scale}f, __sinf(v + k));
  y[i] = acc;
}}
"""


def source(n: int, tag: int) -> str:
    return SOURCE.format(tag=f"{n}_{tag}", scale=1.0 + tag / 1000.0)


async def rate(n: int, candidates: int, arch: str) -> tuple[float, int]:
    """Candidates per minute with `n` compile actors; also how many came back 'compiled'."""
    lanes = await RayLanes.start(None, compile_only=True, arch=arch, max_lanes=n, poll_s=0)
    try:
        if len(lanes.lanes) != n:
            raise SystemExit(f"error: asked for {n} compile lanes, Ray started {len(lanes.lanes)}")
        await asyncio.gather(*(lane.compile_only(source(n, -1 - i)) for i, lane in enumerate(lanes.lanes)))
        t0 = time.perf_counter()
        evs = await asyncio.gather(*(lanes.compile_only(source(n, i)) for i in range(candidates)))
        wall = time.perf_counter() - t0
    finally:
        await lanes.close()
    return candidates / wall * 60.0, sum(e.status == "compiled" for e in evs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, nargs="+", default=[1, 2], help="compile actor counts to measure")
    ap.add_argument("--candidates", type=int, default=24, help="candidates per measurement")
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()
    ray = require_ray()
    cores = os.cpu_count() or 1
    print(f"# Ray compile lanes: {args.candidates} distinct candidates per N, NVRTC {args.arch}, {cores} cores")
    print(f"{'N':>3} {'cand/min':>10} {'vs N x one':>11} {'compiled':>9}")
    base = None
    for n in args.lanes:
        ray.init(num_cpus=n, include_dashboard=False, object_store_memory=200 * 2**20, log_to_driver=False)
        try:
            per_min, ok = asyncio.run(rate(n, args.candidates, args.arch))
        finally:
            ray.shutdown()
        base = base or per_min / n
        note = "" if n <= cores else "  (more lanes than cores)"
        print(f"{n:>3} {per_min:>10.1f} {per_min / (n * base):>10.2f}x {ok:>5}/{args.candidates}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
