#!/usr/bin/env python3
"""What a softmax over few long rows ([4, 262144] fp32, issue 4's 10x target) can reach on this GPU, and
what each way of joining a row's blocks costs, timed with the lane's protocol.

    python scripts/probe_softmax_sync.py --out DIR                # timings, correctness, CUDA-graph checks
    ncu --clock-control none --cache-control all --csv --log-file DIR/ncu.csv \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
        python scripts/probe_softmax_sync.py --ncu                # kernel durations without launch gaps

A row's blocks each reduce a chunk held in registers to (max, sum of exp); the row's partials must meet
before any block can write. Ways of meeting, each a variant here:
  split      two launches (partials, then merge + write): what the builtin template does today.
  split+pdl  the same two launches with programmatic dependent launch (cuLaunchKernelEx): the second
             kernel starts early, loads its chunk, and waits (griddepcontrol.wait) only for the partials.
  coop       one cooperative launch (cuLaunchCooperativeKernel) with a grid-wide barrier (cg::grid.sync).
  tag        one ordinary launch; each block publishes its partial tagged with the launch's %gridid and
             spins until its row's tags all match. Needs every block resident (grid <= SMs) and a
             %gridid that differs between launches, also between CUDA-graph replays: checked here.
  cluster    the template's thread-block cluster per row (16 blocks, hardware cluster barrier).
Also timed: eager, PyTorch's copy of the input (the bytes alone) and of 4 bytes (the protocol's floor).
Writes DIR/probe_softmax_sync.json and .md. Needs a CUDA GPU of compute capability 9.0.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

ROWS, N = 4, 262144
MAGIC = 0x9E3779B97F4A7C15  # tags are %gridid ^ MAGIC: no stale or zeroed memory reads as a live tag

_SOURCE = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
constexpr int N = $N, C = $C, B = $B;
constexpr int PER = N / C, NV = PER / (4 * B);
static_assert(N % C == 0 && PER % (4 * B) == 0 && C <= B, "whole float4 per thread; a thread per partial");

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float block_max(float v, float* sh) {
  v = warp_max(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  v = (threadIdx.x & 31) < B / 32 ? sh[threadIdx.x & 31] : -INFINITY;
  return warp_max(v);
}
__device__ __forceinline__ float block_sum(float v, float* sh) {
  v = warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  v = (threadIdx.x & 31) < B / 32 ? sh[threadIdx.x & 31] : 0.f;
  return warp_sum(v);
}
__device__ __forceinline__ void load_chunk(const float* __restrict__ x, float4 (&v)[NV]) {
  const float4* p = reinterpret_cast<const float4*>(x + (size_t)(blockIdx.x / C) * N + (size_t)(blockIdx.x % C) * PER);
#pragma unroll
  for (int i = 0; i < NV; ++i) v[i] = p[i * B + threadIdx.x];
}
__device__ __forceinline__ float2 chunk_stats(const float4 (&v)[NV], float* sh) {
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < NV; ++i) m = fmaxf(fmaxf(fmaxf(m, v[i].x), fmaxf(v[i].y, v[i].z)), v[i].w);
  m = block_max(m, sh);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i) s += expf(v[i].x - m) + expf(v[i].y - m) + expf(v[i].z - m) + expf(v[i].w - m);
  return make_float2(m, block_sum(s, sh));
}
// The row's C partials (thread q holds partial q) merged by the same reduction tree in every block:
// the same bits everywhere.
__device__ __forceinline__ float2 merge_parts(float pm, float ps, float* sh) {
  const float m = block_max(pm, sh);
  return make_float2(m, block_sum(threadIdx.x < C ? ps * expf(pm - m) : 0.f, sh));
}
__device__ __forceinline__ float2 merge_row(const float2* __restrict__ part, float* sh) {
  const float2 p = threadIdx.x < C ? __ldcg(&part[threadIdx.x]) : make_float2(-INFINITY, 0.f);
  return merge_parts(p.x, p.y, sh);
}
__device__ __forceinline__ void write_chunk(float* __restrict__ y, const float4 (&v)[NV], float2 ms) {
  float4* p = reinterpret_cast<float4*>(y + (size_t)(blockIdx.x / C) * N + (size_t)(blockIdx.x % C) * PER);
#pragma unroll
  for (int i = 0; i < NV; ++i)
    p[i * B + threadIdx.x] = make_float4(expf(v[i].x - ms.x) / ms.y, expf(v[i].y - ms.x) / ms.y,
                                         expf(v[i].z - ms.x) / ms.y, expf(v[i].w - ms.x) / ms.y);
}

extern "C" __global__ void __launch_bounds__(B) pr_partial(const float* __restrict__ x, float2* __restrict__ ws) {
  __shared__ float sh[32];
  float4 v[NV];
  load_chunk(x, v);
  const float2 ms = chunk_stats(v, sh);
  if (threadIdx.x == 0) __stcg(&ws[blockIdx.x], ms);
}
extern "C" __global__ void __launch_bounds__(B) pr_finish(const float* __restrict__ x, float* __restrict__ y,
                                                         const float2* __restrict__ ws) {
  __shared__ float sh[32];
  float4 v[NV];
  load_chunk(x, v);  // from L2: kernel 1 just read it
  write_chunk(y, v, merge_row(ws + (blockIdx.x / C) * C, sh));
}
extern "C" __global__ void __launch_bounds__(B) pr_partial_pdl(const float* __restrict__ x, float2* __restrict__ ws) {
  __shared__ float sh[32];
  asm volatile("griddepcontrol.launch_dependents;");
  float4 v[NV];
  load_chunk(x, v);
  const float2 ms = chunk_stats(v, sh);
  if (threadIdx.x == 0) __stcg(&ws[blockIdx.x], ms);
}
extern "C" __global__ void __launch_bounds__(B) pr_finish_pdl(const float* __restrict__ x, float* __restrict__ y,
                                                             const float2* __restrict__ ws) {
  __shared__ float sh[32];
  float4 v[NV];
  load_chunk(x, v);  // x was complete before kernel 1 started: load while kernel 1 still runs
  asm volatile("griddepcontrol.wait;" ::: "memory");  // kernel 1 done, its partials visible
  write_chunk(y, v, merge_row(ws + (blockIdx.x / C) * C, sh));
}
extern "C" __global__ void __launch_bounds__(B) pr_coop(const float* __restrict__ x, float* __restrict__ y,
                                                       float2* __restrict__ ws) {
  __shared__ float sh[32];
  float4 v[NV];
  load_chunk(x, v);
  const float2 ms = chunk_stats(v, sh);
  if (threadIdx.x == 0) __stcg(&ws[blockIdx.x], ms);
  cg::this_grid().sync();
  write_chunk(y, v, merge_row(ws + (blockIdx.x / C) * C, sh));
}
struct Slot { float m, s; unsigned long long tag; };
__device__ __forceinline__ unsigned long long grid_tag() {
  unsigned long long g;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(g));
  return g ^ $MAGICull;
}
extern "C" __global__ void __launch_bounds__(B) pr_tag(const float* __restrict__ x, float* __restrict__ y,
                                                      Slot* __restrict__ slots) {
  __shared__ float sh[32];
  const unsigned long long tag = grid_tag();
  float4 v[NV];
  load_chunk(x, v);
  const float2 ms = chunk_stats(v, sh);
  Slot* row = slots + (blockIdx.x / C) * C;
  if (threadIdx.x == 0) {
    __stcg(&slots[blockIdx.x].m, ms.x);
    __stcg(&slots[blockIdx.x].s, ms.y);
    __threadfence();
    atomicExch(&slots[blockIdx.x].tag, tag);
  }
  if (threadIdx.x < C) {  // bounded: a row whose blocks are not all resident gives a wrong answer, not a hang
    for (unsigned spins = 0; atomicAdd(&row[threadIdx.x].tag, 0ull) != tag && spins < (1u << 22); ++spins)
      __nanosleep(32);
  }
  __threadfence();
  __syncthreads();
  const bool mine = threadIdx.x < C;
  write_chunk(y, v, merge_parts(mine ? __ldcg(&row[threadIdx.x].m) : -INFINITY,
                                mine ? __ldcg(&row[threadIdx.x].s) : 0.f, sh));
}
extern "C" __global__ void pr_gridid(unsigned long long* out, int i) {
  unsigned long long g;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(g));
  if (threadIdx.x == 0 && blockIdx.x == 0) out[i] = g;
}
"""


def log(msg: str) -> None:
    print(f"[probe_softmax_sync {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Kernels:
    """One NVRTC-compiled module of the probe's kernels for chunks-per-row C and block size B."""

    def __init__(self, c: int, b: int):
        from engine.compile import compile_source
        from engine.launch import cuda_driver as drv

        src = (_SOURCE.replace("$N", str(N)).replace("$C", str(c)).replace("$B", str(b))
               .replace("$MAGIC", hex(MAGIC)))
        res = compile_source(src, arch="sm_90", options=("-std=c++17", "-lineinfo"), contract=False)  # a probe's barriers read %gridid
        if not res.ok:
            raise RuntimeError(f"probe kernels (C={c}, B={b}) did not compile: {res.log[:2000]}")
        self.c, self.b, self.grid = c, b, ROWS * c
        self.module = drv.Module(res.cubin)
        self.drv = drv
        self._keep: list[Any] = []

    def _params(self, *vals: Any) -> int:
        boxes = [ctypes.c_void_p(v.data_ptr()) if isinstance(v, torch.Tensor) else ctypes.c_int32(v) for v in vals]
        arr = (ctypes.c_void_p * len(boxes))(*[ctypes.addressof(b) for b in boxes])
        self._keep = [boxes, arr]  # alive until the next launch is packed (the driver copies at launch)
        return ctypes.addressof(arr)

    def launch(self, name: str, *vals: Any, grid: int | None = None, how: str = "plain") -> None:
        from cuda.bindings import driver as cu

        f = self.module.function(name)
        stream = torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())
        g = self.grid if grid is None else grid
        params = self._params(*vals)
        if how == "plain":
            self.drv.launch(f, (g, 1, 1), (self.b, 1, 1), 0, stream, params)
        elif how == "coop":
            self.drv.check("cuLaunchCooperativeKernel",
                           cu.cuLaunchCooperativeKernel(f, g, 1, 1, self.b, 1, 1, 0, stream, params))
        elif how == "pdl":
            cfg = cu.CUlaunchConfig()
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = g, 1, 1
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = self.b, 1, 1
            cfg.sharedMemBytes = 0
            cfg.hStream = cu.CUstream(stream)
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            cfg.attrs = [attr]
            cfg.numAttrs = 1
            self.drv.check("cuLaunchKernelEx", cu.cuLaunchKernelEx(cfg, f, params, 0))
        else:
            raise ValueError(how)

    def occupancy(self, name: str) -> int:
        from cuda.bindings import driver as cu

        f = self.module.function(name)
        return int(self.drv.check("cuOccupancyMaxActiveBlocksPerMultiprocessor",
                                  cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(f, self.b, 0)))


def variants(x: torch.Tensor, configs: list[tuple[int, int]]) -> dict[str, Any]:
    """Label -> zero-argument callable returning the softmax of x (or a copy, for the floors)."""
    dev = x.device
    out: dict[str, Any] = {"eager": lambda: torch.softmax(x, -1), "copy of the input": lambda: x.clone()}
    tiny = torch.zeros(1, device=dev)
    out["copy of 4 bytes (floor)"] = lambda: tiny.clone()
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for c, b in configs:
        k = Kernels(c, b)

        def split(k=k, how="plain", names=("pr_partial", "pr_finish")):
            ws = torch.empty(k.grid * 2, device=dev)
            y = torch.empty_like(x)
            k.launch(names[0], x, ws, how="plain")
            k.launch(names[1], x, y, ws, how=how)
            return y

        def coop(k=k):
            ws = torch.empty(k.grid * 2, device=dev)
            y = torch.empty_like(x)
            k.launch("pr_coop", x, y, ws, how="coop")
            return y

        def tag(k=k):
            slots = torch.empty(k.grid * 2, dtype=torch.int64, device=dev)
            y = torch.empty_like(x)
            k.launch("pr_tag", x, y, slots)
            return y

        tagname = f"C={c} B={b}"
        out[f"split {tagname}"] = split
        out[f"split+pdl {tagname}"] = lambda k=k, split=split: split(k, "pdl", ("pr_partial_pdl", "pr_finish_pdl"))
        out[f"coop {tagname}"] = coop
        if k.grid <= sms * k.occupancy("pr_tag"):
            out[f"tag {tagname}"] = tag
    return out


def template_variants(x: torch.Tensor, tmp: Path) -> dict[str, Any]:
    """The builtin template's best split (the bench's pick) and its 16-block cluster, launched as the lane does."""
    from engine.capture.signature import signature_text
    from engine.cards import OperatorCard
    from engine.compile import compile_source
    from engine.launch import Env, parse_spec, resolve
    from engine.launch import cuda_driver as drv
    from engine.launch.launcher import CandidateLauncher
    from engine.propose.builtin.softmax import SoftmaxTemplate

    sys.path.insert(0, str(ROOT / "tests"))
    from gpu_harness import make_card

    ref = make_card(tmp, lambda: torch.softmax(x, -1), samples=1)
    card = OperatorCard(ref.card_id, ref.op, ref.signature, signature_text(ref.signature), ref.outputs)
    t = SoftmaxTemplate()
    out = {}
    for label, params in (("template split 64 x 256, 1-wide", {"strategy": "split", "chunks": 64, "block": 256, "vec": 1}),
                          ("template split 64 x 256, 4-wide", {"strategy": "split", "chunks": 64, "block": 256, "vec": 4}),
                          ("template cluster 16 x 512", {"strategy": "cluster", "cluster": 16, "block": 512, "vec": 4})):
        r = t.render(card, {**t.default(card), **params})
        res = compile_source(r.source, arch="sm_90")
        spec = resolve(parse_spec(r.spec), Env.from_card(card.signature, card.outputs))
        ln = CandidateLauncher(drv.Module(res.cubin), spec, card.op, card.outputs, x.device)
        out[label] = lambda ln=ln: ln.run([("self", x), ("dim", -1), ("half_to_float", False)])[0]
    return out


def gridid_checks(dev: torch.device) -> dict[str, Any]:
    """%gridid of plain launches and of one kernel node over CUDA-graph replays: the tag variant is safe
    only if every launch, replays included, sees a different value."""
    k = Kernels(32, 256)
    buf = torch.zeros(8, dtype=torch.int64, device=dev)
    k.launch("pr_gridid", buf, 0, grid=1)
    k.launch("pr_gridid", buf, 1, grid=1)
    torch.cuda.synchronize()
    plain = [int(buf[0]), int(buf[1])]
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        k.launch("pr_gridid", buf, 2, grid=1)  # warm-up on the side stream before capture
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        k.launch("pr_gridid", buf, 3, grid=1)
    replays = []
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        replays.append(int(buf[3]))
    return {"plain_launches": plain, "graph_replays": replays,
            "distinct_per_replay": len(set(replays)) == len(replays)}


def graph_correctness(fn: Any, x: torch.Tensor) -> dict[str, Any]:
    """Capture fn in a CUDA graph, replay it on three different inputs copied into x: each output must be
    the softmax of the input of its own replay."""
    saved = x.clone()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            y = fn()
    except Exception as e:  # noqa: BLE001
        x.copy_(saved)
        return {"captured": False, "error": f"{type(e).__name__}: {str(e)[:200]}"}
    worst = 0.0
    for i in range(3):
        x.copy_(torch.randn(x.shape, device=x.device, generator=torch.Generator(device=x.device).manual_seed(i)) * 3)
        g.replay()
        torch.cuda.synchronize()
        worst = max(worst, float(((y - torch.softmax(x, -1)).abs() / torch.softmax(x, -1).abs().clamp_min(1e-30)).max()))
    x.copy_(saved)
    return {"captured": True, "max_rel_err_over_replays": worst}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--ncu", action="store_true", help="run each variant a few times, untimed (under ncu)")
    ap.add_argument("--seconds", type=float, default=20.0, help="timing cap for all variants together")
    args = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        print("error: probe_softmax_sync needs a CUDA GPU of compute capability 9.0 or newer", file=sys.stderr)
        return 2
    if not args.ncu and args.out is None:
        print("error: probe_softmax_sync: --out DIR is required (or --ncu)", file=sys.stderr)
        return 2
    from engine.bench.stats import summarize
    from engine.bench.timing import L2Flusher, TimingConfig, time_calls

    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.randn(ROWS, N, device=dev, generator=torch.Generator(device=dev).manual_seed(0)) * 3
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="probe_softmax_"))
    calls = variants(x, [(32, 256), (16, 512), (32, 128), (64, 256), (32, 512)])
    try:
        calls.update(template_variants(x, tmp))
    except Exception as e:  # noqa: BLE001 - the probe's own kernels still say something
        log(f"template variants unavailable: {type(e).__name__}: {e}")
    ref = torch.softmax(x, -1)
    doc: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": [ROWS, N],
                           "variants": {}}
    good: dict[str, Any] = {}
    for label, fn in calls.items():
        try:
            y = fn()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            doc["variants"][label] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            log(f"{label}: {doc['variants'][label]['error']}")
            continue
        entry: dict[str, Any] = {}
        if y.shape == ref.shape and "copy" not in label:
            entry["max_rel_err"] = float(((y - ref).abs() / ref.abs().clamp_min(1e-30)).max())
            entry["correct"] = bool(torch.allclose(y, ref, rtol=1e-5, atol=1e-8))
        doc["variants"][label] = entry
        if entry.get("correct", True):
            good[label] = fn
    if args.ncu:
        for fn in good.values():
            for _ in range(3):
                fn()
        torch.cuda.synchronize()
        return 0
    doc["gridid"] = gridid_checks(dev)
    log(f"gridid: {doc['gridid']}")
    for label in [k for k in good if k.startswith(("tag", "coop"))][:4]:
        doc["variants"][label]["cuda_graph"] = graph_correctness(good[label], x)
        log(f"{label} under CUDA graphs: {doc['variants'][label]['cuda_graph']}")
    labels = list(good)
    flush = L2Flusher(dev)
    times, throttled, secs, _, _ = time_calls([good[k] for k in labels], flush,
                                              TimingConfig(max_seconds=args.seconds, max_reps=4000))
    eager = statistics.median(times[labels.index("eager")])
    for label, t in zip(labels, times):
        st = summarize(t)
        doc["variants"][label].update({"median_us": st.median, "iqr_us": [st.q1, st.q3], "n": len(t),
                                       "speedup": eager / st.median})
    doc["throttled_rounds"], doc["timing_seconds"] = throttled, secs
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_softmax_sync.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Softmax [4, 262144] fp32: ways of joining a row's blocks ({doc['gpu']}, torch {doc['torch']})", "",
             "Lane timing protocol (L2 flushed, GPU kept busy before each call, CUDA events per call), all variants "
             "alternated. `python scripts/probe_softmax_sync.py --out DIR`.", "",
             "| variant | median µs | speedup vs eager | max rel. err | note |", "|---|---:|---:|---:|---|"]
    for label, v in doc["variants"].items():
        note = v.get("error", "")
        if "cuda_graph" in v:
            cg = v["cuda_graph"]
            note = (f"CUDA graph: max rel. err {cg['max_rel_err_over_replays']:.1e} over 3 replays"
                    if cg.get("captured") else f"CUDA graph: {cg.get('error')}")
        if v.get("correct") is False:
            note = "WRONG: " + note
        med = f"{v['median_us']:.2f}" if "median_us" in v else "–"
        sp = f"{v['speedup']:.2f}×" if "speedup" in v else "–"
        err = f"{v['max_rel_err']:.1e}" if "max_rel_err" in v else "–"
        lines.append(f"| {label} | {med} | {sp} | {err} | {note} |")
    gi = doc["gridid"]
    lines += ["", f"%gridid: plain launches {gi['plain_launches']}; one graph node over replays {gi['graph_replays']} "
              f"({'distinct' if gi['distinct_per_replay'] else 'REPEATED: the tag variant is unsafe under CUDA graphs'})."]
    (args.out / "probe_softmax_sync.md").write_text("\n".join(lines) + "\n")
    log(f"wrote {args.out}/probe_softmax_sync.md")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
