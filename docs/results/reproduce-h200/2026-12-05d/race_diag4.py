"""race_diag4: which streams run beside which, and race_diag3's cases with the side stream made one way or another
(argv[1]: "pool" = torch.cuda.Stream, taken first as the lane's old worker took it; "driver" = the stream the worker
picked: a cuStreamCreate(CU_STREAM_NON_BLOCKING) stream seen to overlap, or the last of 8 tried). g0f.sh runs it
with CUDA_DEVICE_MAX_CONNECTIONS unset, 1 and 32, each in its own process (the driver reads it when the context is
made). race_diag3 on an H100 showed a gate kernel on torch's default stream start only when the hog on a pool stream
ended, 0.4-0.6 us after it (device-side, not the host).

First an overlap table (_Hog.overlaps: the hog on one stream, released from another while it spins?), for 8 new
driver streams and 8 pool streams against the legacy default stream, and for 8 driver streams against another
non-blocking stream. How to read it:
- pool streams are non-blocking (c10 kDefaultFlags = cudaStreamNonBlocking), so the legacy stream's implicit sync
  does not apply to them; if pool and driver streams both overlap nothing against the legacy stream but driver
  streams overlap each other, the legacy stream itself is the wall;
- if a few of 8 new streams fail and the rest pass, and 32 connections make them pass, streams sharing a hardware
  queue with the default stream is the likely cause; if every stream fails with 1 connection and passes with 32,
  likewise;
- if nothing overlaps anything in any setting, the streams are not the cause (the machine or driver serializes).
Then the cases, 3 trials each (trial #0 may pay first-use costs: read #1-#2), the lane's own busy run forced on.

Class-7 race, with timestamps: when do the hog's blocks start relative to the candidate's? Old hog (1024-thread
blocks, 2 us sleep), the lane's current `_contend`, and a gated hog (blocks signal they are resident; a one-warp
gate on the candidate's stream waits for them), also with the candidate on a non-blocking stream."""
import contextlib
import ctypes
import sys

import torch

sys.path.insert(0, "tests")
from engine.compile import compile_nvrtc  # noqa: E402
from engine.lane.worker import Worker  # noqa: E402
from engine.launch import cuda_driver as drv  # noqa: E402

SRC = r'''
__device__ __forceinline__ unsigned long long now() {
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
extern "C" __global__ void hog(long long cycles, unsigned int* started, unsigned long long* ts) {
  if (threadIdx.x == 0) { ts[blockIdx.x] = now(); atomicAdd(started, 1u); }
  long long t0 = clock64();
  while (clock64() - t0 < cycles) { }
}
extern "C" __global__ void gate(unsigned int* started, unsigned int want, unsigned long long max_ns,
                                unsigned long long* ts) {
  unsigned long long t0 = now(), t = t0;
  while (*(volatile unsigned int*)started < want && t - t0 < max_ns) t = now();
  ts[0] = t0; ts[1] = t;
}
extern "C" __global__ void __launch_bounds__(256, 8)
pair_sum(const float* __restrict__ x, float* __restrict__ out, float* __restrict__ part, int rows, int cols,
         unsigned long long* ts) {
  __shared__ float warp_sums[8];
  if (threadIdx.x == 0) ts[blockIdx.x] = now();
  bool helper = blockIdx.x >= rows;
  int row = helper ? blockIdx.x - rows : blockIdx.x, half = cols / 2;
  const float* p = x + (long long)row * cols + (helper ? half : 0);
  float acc = 0.f;
  for (int c = threadIdx.x; c < half; c += 256) acc += p[c];
  for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x != 0) return;
  float total = 0.f;
  for (int w = 0; w < 8; ++w) total += warp_sums[w];
  if (helper) part[row] = total;
  unsigned long long t0 = now();
  while (now() - t0 < 5000) { }
  if (!helper) out[row] = total + *(volatile float*)&part[row];
}
'''

import os  # noqa: E402

from cuda.bindings import driver as cu  # noqa: E402

w = Worker(0)
dev = w.device
side_arg = sys.argv[1:] == ["pool"]
if side_arg:
    w._side = torch.cuda.Stream(dev)  # the first pool stream, as the old worker's torch.cuda.Stream
legacy = torch.cuda.current_stream(dev)
print("side", sys.argv[1:], "worker's self-test: contention", w.contention, "stream", w._side.cuda_stream,
      "default stream", legacy.cuda_stream, "torch", torch.__version__, "driver", cu.cuDriverGetVersion()[1],
      "loading", getattr(cu, "cuModuleGetLoadingMode", lambda: (0, "?"))()[1], "env",
      {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "NVIDIA_", "TORCH_CUDA"))}, flush=True)


def driver_stream():
    return torch.cuda.ExternalStream(drv.nonblocking_stream(), device=dev)


def table(label, sides, main):
    got = [w._hog.overlaps(s, main) for s in sides]
    print(f"overlap {label}: {''.join('T' if g else '.' for g in got)} {sum(got)}/{len(got)} "
          f"(outcome counter {w._hog.counters.tolist()})", flush=True)


other = driver_stream()
table("driver stream beside the legacy default stream", [driver_stream() for _ in range(8)], legacy)
table("pool stream beside the legacy default stream", [torch.cuda.Stream(dev) for _ in range(8)], legacy)
table("driver stream beside another non-blocking stream", [driver_stream() for _ in range(8)], other)
table("the side stream used below, beside the legacy default stream", [w._side] * 3, legacy)
w.contention = True  # the lane case below runs its blocks whatever the self-test said (its counters tell)

mod = drv.Module(compile_nvrtc(SRC, arch=w.arch, name="diag3.cu", want_ptx=False, pch=False).cubin)
f_hog, f_gate, f_sum = mod.function("hog"), mod.function("gate"), mod.function("pair_sum")
print("device", torch.cuda.get_device_name(), "sms", w._hog.sms, "clock", w._peak.clock_hz)
for name, f in [("hog", f_hog), ("pair_sum", f_sum), ("kf_hog", w._hog.fn)]:
    print(name, "regs", drv.function_attribute(f, "CU_FUNC_ATTRIBUTE_NUM_REGS"))

ROWS, COLS = 512, 4096
x = torch.randn(ROWS, COLS, device=dev)
want = x.sum(dim=1)
keep = []


def params(*vals):
    cs = []
    for v in vals:
        if isinstance(v, torch.Tensor):
            cs.append(ctypes.c_void_p(v.data_ptr()))
        else:
            cs.append(v)
    keep.append(cs)
    arr = (ctypes.c_void_p * len(cs))(*[ctypes.addressof(c) for c in cs])
    keep.append(arr)
    return ctypes.addressof(arr)


def candidate(ts_c):
    out = torch.full((ROWS,), float("nan"), device=dev)
    part = torch.zeros(ROWS, device=dev)
    torch.cuda.synchronize()

    def go():
        drv.launch(f_sum, (2 * ROWS, 1, 1), (256, 1, 1), 0, torch.cuda.current_stream().cuda_stream,
                   params(x, out, part, ctypes.c_int(ROWS), ctypes.c_int(COLS), ts_c))
        return out
    return go


def hogged(frac, threads, us, sleep, gated):
    @contextlib.contextmanager
    def ctx(info):
        main = torch.cuda.current_stream(dev)
        blocks = 2 * int(w._hog.sms * frac)
        started = torch.zeros(1, dtype=torch.int32, device=dev)
        ts_h = torch.zeros(blocks, dtype=torch.int64, device=dev)
        ts_g = torch.zeros(2, dtype=torch.int64, device=dev)
        cyc = ctypes.c_int64(int(us * 1e-6 * w._peak.clock_hz))
        w._side.wait_stream(main)
        drv.launch(f_hog, (blocks, 1, 1), (threads, 1, 1), 0, w._side.cuda_stream, params(cyc, started, ts_h))
        if gated:
            drv.launch(f_gate, (1, 1, 1), (32, 1, 1), 0, main.cuda_stream,
                       params(started, ctypes.c_uint32(blocks), ctypes.c_uint64(200_000), ts_g))
        if sleep:
            torch.cuda._sleep(sleep)
        try:
            yield
        finally:
            main.wait_stream(w._side)
            torch.cuda.synchronize()
            info.update(hog=ts_h, gate=ts_g if gated else None, started=int(started.item()), blocks=blocks)
    return ctx


def lane_ctx():
    @contextlib.contextmanager
    def ctx(info):
        before = w._hog.counters.tolist()
        with w._contend():
            info["beside"] = True
            yield
        torch.cuda.synchronize()
        info["lane"] = (before, w._hog.counters.tolist())
    return ctx


cases = [("alone", None, None), ("lane _contend", lane_ctx(), None),
         ("old hog 90% 1024thr 300us sleep4000", hogged(0.9, 1024, 300, 4000, False), None),
         ("gated hog 50% 992thr 300us", hogged(0.5, 992, 300, 0, True), None),
         ("gated hog 50% 992thr 300us, candidate on a non-blocking stream", hogged(0.5, 992, 300, 0, True), other)]
for name, ctx, on in cases:
    for trial in range(3):
        ts_c = torch.zeros(2 * ROWS, dtype=torch.int64, device=dev)
        go = candidate(ts_c)
        info = {}
        with (torch.cuda.stream(on) if on is not None else contextlib.nullcontext()):
            if ctx is None:
                out = go()
            else:
                with ctx(info):
                    out = w._launch_beside(go) if info.get("beside") else go()
        torch.cuda.synchronize()
        bad = int((~torch.isclose(out, want, rtol=1e-4, atol=1e-3)).sum())
        c0 = int(ts_c.min())
        cs = ts_c.double().sub(c0).div(1e3)
        line = f"{name} #{trial}: wrong rows {bad}; cand blocks start span {cs.max():.1f} us, " \
               f"leaders last {cs[:ROWS].max():.1f}, helpers first {cs[ROWS:].min():.1f}"
        if "hog" in info:
            h = info["hog"].double().sub(c0).div(1e3)
            line += f"; hog {info['started']}/{info['blocks']} started, from {h.min():.1f} to {h.max():.1f} us"
            if info["gate"] is not None:
                g = info["gate"].double().sub(c0).div(1e3)
                line += f"; gate {g[0]:.1f}->{g[1]:.1f} us"
        if "lane" in info:
            (_, _, _), (_, rel, outcome) = info["lane"]
            line += (f"; lane counters (started, released, outcome) {info['lane'][0]} -> {info['lane'][1]}: "
                     f"{'released while it spun' if outcome == rel else 'spun to its limit (no overlap)'}")
        print(line, flush=True)
