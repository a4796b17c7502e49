"""Runs generated CUDA on the CPU: g++ compiles the kernels against a small CUDA shim and runs them.

One fiber per CUDA thread (all of a launch's on one OS thread, each running until it waits, then the next);
the blocks of a thread-block cluster (or of a cooperative launch's whole grid) run together, clusters (or
single blocks) one after another. A barrier whose waiters yield (emu_barrier) stands in for __syncthreads,
warp shuffles and the cluster barrier (kf_cluster_sync); cp.async (kf_async_copy16) lands when waited for;
__nanosleep yields; a thread that returns drops out of the barriers, as exited threads do on the GPU.
AddressSanitizer is told of every stack switch, so it checks the fibers' stacks too (on x86-64: elsewhere
the fallback, swapcontext, leaves stack overflows of a fiber's frames unreported).
Every buffer is allocated at its exact size (AddressSanitizer reports any access outside it) at its
original offset modulo 16, and UBSan's alignment check reports misaligned accesses. Each launch's scalar arguments are
baked into the program, so a run only passes buffers. Used by the builtin template tests.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.capture.signature import storage_extent

SHIM = r"""
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <sys/mman.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __cluster_dims__(...)
using std::max;
using std::min;
// The CUDA threads of a launch are fibers on one OS thread (a thread per CUDA thread spent most of its time
// in the kernel's scheduler: a barrier of N threads on a few cores is N context switches). A fiber runs
// until it waits (a barrier, __nanosleep), then the next one in round-robin order; AddressSanitizer is told
// of every stack switch. Each fiber's stack is its own mapping under a guard page.
struct emu_dim3 { unsigned x = 0, y = 0, z = 0; };
struct emu_copy { void* dst; const void* src; };
struct emu_block;
struct emu_barrier;
#if defined(__x86_64__)
// Saves the callee-saved registers on the current stack, stores its pointer in *save, and continues on `to`.
extern "C" void emu_switch(void** save, void* to);
asm(R"(.text
.globl emu_switch
.type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size emu_switch, .-emu_switch
)");
struct emu_ctx { void* sp = nullptr; };
inline void emu_ctx_init(emu_ctx& c, char* stack, size_t size, void (*entry)()) {
  void** top = (void**)(stack + size - 16);  // `ret` enters `entry` at 8 mod 16, as after a call
  top[0] = (void*)entry;
  top[1] = nullptr;
  for (int i = 1; i <= 6; ++i) top[-i] = nullptr;  // rbp, rbx, r12-r15
  c.sp = top - 6;
}
inline void emu_ctx_switch(emu_ctx& from, emu_ctx& to) { emu_switch(&from.sp, to.sp); }
#else
struct emu_ctx { ucontext_t uc; };
inline void emu_ctx_init(emu_ctx& c, char* stack, size_t size, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
inline void emu_ctx_switch(emu_ctx& from, emu_ctx& to) { swapcontext(&from.uc, &to.uc); }
#endif
struct emu_fiber {  // one CUDA thread: its stack, and what the CUDA thread sees as its own
  emu_ctx ctx;
  char* map = nullptr;  // guard page, then the stack
  size_t stack_size = 0;
  bool done = false;
  void (*body)(void*, unsigned, unsigned) = nullptr;  // the launch's thread body, called (arg, q, t)
  void* arg = nullptr;
  unsigned q = 0, t = 0;
  emu_dim3 tid, bid;
  emu_block* me = nullptr;
  emu_barrier* cluster_bar = nullptr;
  unsigned shfl_round = 0;  // shuffles this thread made in its block (0 at its start)
  std::vector<std::vector<emu_copy>> groups;  // cp.async groups committed, oldest first
  std::vector<emu_copy> open;
};
inline emu_fiber* emu_cur = nullptr;
inline bool emu_reverse = false;  // the scheduler's order: every other run of a program walks the threads backwards
inline unsigned long long emu_events = 0;  // arrivals, exits and sleeps: a pass of the scheduler without any is a deadlock
inline emu_ctx emu_sched;  // the scheduler's context
inline const void* emu_main_bottom = nullptr;
inline size_t emu_main_size = 0;
#ifdef __SANITIZE_ADDRESS__
#define EMU_START_SWITCH(save, bottom, size) __sanitizer_start_switch_fiber(save, bottom, size)
#define EMU_FINISH_SWITCH(save, bottom, size) __sanitizer_finish_switch_fiber(save, bottom, size)
#else
#define EMU_START_SWITCH(save, bottom, size)
#define EMU_FINISH_SWITCH(save, bottom, size)
#endif
inline void emu_yield() {  // from a fiber: the scheduler runs the next one
  void* fake = nullptr;
  EMU_START_SWITCH(&fake, emu_main_bottom, emu_main_size);
  emu_ctx_switch(emu_cur->ctx, emu_sched);
  EMU_FINISH_SWITCH(fake, &emu_main_bottom, &emu_main_size);
}
inline void emu_entry() {
  EMU_FINISH_SWITCH(nullptr, &emu_main_bottom, &emu_main_size);
  emu_cur->body(emu_cur->arg, emu_cur->q, emu_cur->t);
  emu_cur->done = true;
  EMU_START_SWITCH(nullptr, emu_main_bottom, emu_main_size);  // this fiber's stack is done with
  emu_ctx_switch(emu_cur->ctx, emu_sched);
  std::abort();  // never resumed
}
inline void emu_resume(emu_fiber* f) {  // from the scheduler: f runs until it waits or returns
  void* fake = nullptr;
  emu_cur = f;
  EMU_START_SWITCH(&fake, f->map + 4096, f->stack_size);
  emu_ctx_switch(emu_sched, f->ctx);
  EMU_FINISH_SWITCH(fake, nullptr, nullptr);
}
// A barrier with std::barrier's arrive_and_wait / arrive_and_drop; a waiter yields until its phase ends.
struct emu_barrier {
  explicit emu_barrier(ptrdiff_t n) : expected(n), left(n) {}
  void arrive_and_wait() {
    const uint32_t mine = phase;
    if (arrive()) return;
    while (phase == mine) emu_yield();
  }
  void arrive_and_drop() {  // arrives for this phase and leaves the later ones
    --expected;
    arrive();
  }
 private:
  bool arrive() {  // true when this arrival completed the phase
    ++emu_events;
    if (--left > 0) return false;
    left = expected;
    ++phase;
    return true;
  }
  ptrdiff_t expected, left;
  uint32_t phase = 0;
};
struct emu_block {  // the synchronisation state of one running block
  std::vector<emu_barrier> bar, warps;  // one; one per warp
  std::vector<uint32_t> slots;
};
#define threadIdx (emu_cur->tid)
#define blockIdx (emu_cur->bid)
inline emu_dim3 blockDim, gridDim;
inline void __syncthreads() { emu_cur->me->bar[0].arrive_and_wait(); }
inline void kf_cluster_sync() { emu_cur->cluster_bar->arrive_and_wait(); }
// cp.async: a thread's copies land only when its kf_async_wait<N> retires their group (oldest first), so a
// kernel that reads its shared memory before waiting reads what was there before.
inline void kf_async_copy16(void* smem, const void* gmem) { emu_cur->open.push_back({smem, gmem}); }
inline void kf_async_commit() { emu_cur->groups.push_back(std::move(emu_cur->open)); emu_cur->open.clear(); }
template <int N> inline void kf_async_wait() {
  auto& groups = emu_cur->groups;
  while (groups.size() > (size_t)N) {
    for (const auto& c : groups.front()) std::memcpy(c.dst, c.src, 16);
    groups.erase(groups.begin());
  }
}
// 32-bit shuffles within the thread's warp, one warp barrier each: the slots of alternate shuffles are two
// halves of `slots`, so a thread writing shuffle k+2's value (past shuffle k+1's barrier, which every live
// thread of its warp reached after reading shuffle k's) never overwrites one still to be read.
template <class T> inline T emu_shfl(T v, int src) {
  static_assert(sizeof(T) == 4, "32-bit shuffles only");
  emu_block* me = emu_cur->me;
  const unsigned t = threadIdx.x, w = t / 32, half = (emu_cur->shfl_round++ & 1u) * blockDim.x;
  std::memcpy(&me->slots[half + t], &v, 4);
  me->warps[w].arrive_and_wait();
  T r;
  std::memcpy(&r, &me->slots[half + w * 32 + (src & 31)], 4);
  return r;
}
template <class T> inline T __shfl_sync(unsigned, T v, int src) { return emu_shfl(v, src); }
template <class T> inline T __shfl_xor_sync(unsigned, T v, int m) { return emu_shfl(v, (threadIdx.x % 32) ^ m); }
template <class T> inline T __shfl_down_sync(unsigned, T v, unsigned d) {
  const unsigned lane = threadIdx.x % 32;
  return emu_shfl(v, lane + d < 32 ? lane + d : lane);
}
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
// Atomics and fences (the stream kernels draw tickets and count finished tiles); blocks run one after
// another here, so a block never waits for one that has not run.
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __nanosleep(unsigned) {
  ++emu_events;
  emu_yield();
}
template <class R> inline R __ldcs(const R* p) { return *p; }
template <class R> inline R __ldg(const R* p) { return *p; }
template <class R> inline R __ldcg(const R* p) { return *p; }
template <class R> inline void __stcs(R* p, R v) { *p = v; }
template <class R> inline void __stcg(R* p, R v) { *p = v; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
// The fast intrinsics as the hardware computes them (PTX ISA): __fdividef is a * rcp.approx(b), 0 for
// 2^126 < |b| < 2^128; __expf is ex2.approx(x * log2 e), the product rounded to float first (its error grows
// with |x|). rcp.approx and ex2.approx themselves err ~1 ulp; the exact functions stand in for them.
inline float __fdividef(float a, float b) {
  const float m = std::fabs(b);
  if (m > 0x1p126f && m < INFINITY) return std::isinf(a) ? NAN : 0.0f * a;
  return a * (1.0f / b);
}
inline float __expf(float x) { return std::exp2(float(x * 1.44269504088896341f)); }
inline float emu_u2f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t emu_f2u(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
struct __half { uint16_t x; };
struct __nv_bfloat16 { uint16_t x; };
inline float __bfloat162float(__nv_bfloat16 h) { return emu_u2f(uint32_t(h.x) << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u = emu_f2u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {uint16_t(u >> 16)};
}
inline float __half2float(__half h) {
  const uint32_t s = h.x >> 15, e = (h.x >> 10) & 0x1f, m = h.x & 0x3ff;
  const float v = e == 0 ? std::ldexp(float(m), -24) : e == 31 ? (m ? NAN : INFINITY)
                                                             : std::ldexp(float(m | 0x400), int(e) - 25);
  return s ? -v : v;
}
inline __half __float2half_rn(float f) {
  const uint16_t sign = (emu_f2u(f) >> 16) & 0x8000;
  const float a = std::fabs(f);
  if (std::isnan(f)) return {uint16_t(sign | 0x7e00)};
  if (a >= 65520.0f) return {uint16_t(sign | 0x7c00)};
  if (a < std::ldexp(1.0f, -14)) return {uint16_t(sign | uint16_t(std::nearbyint(a * 16777216.0f)))};
  int e;
  float q = std::nearbyint(std::ldexp(std::frexp(a, &e), 11));
  if (q >= 2048.0f) { q /= 2; e += 1; }
  return {uint16_t(sign | ((e + 14) << 10) | (int(q) - 1024))};
}
// The raw bits, as cuda_fp16.h / cuda_bf16.h give them.
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return {u}; }
inline short __bfloat16_as_short(__nv_bfloat16 h) { return short(h.x); }
inline __nv_bfloat16 __short_as_bfloat16(short u) { return {uint16_t(u)}; }
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline __half __ushort_as_half(unsigned short u) { return {u}; }
inline short __half_as_short(__half h) { return short(h.x); }
inline __half __short_as_half(short u) { return {uint16_t(u)}; }
// Paired types as the CUDA headers lay them out (x in the low half), for kernels that move two at once.
struct alignas(4) __nv_bfloat162 { __nv_bfloat16 x, y; };
struct alignas(4) __half2 { __half x, y; };
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return {__bfloat162float(h.x), __bfloat162float(h.y)}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
inline __half2 __floats2half2_rn(float a, float b) { return {__float2half_rn(a), __float2half_rn(b)}; }
struct emu_ptr { void* p; template <class T> operator T*() const { return static_cast<T*>(p); } };
// Blocks run one cluster at a time; the `cluster` blocks of a cluster run together, block q of it
// calling kernel(q) (a separate copy of the code, so each has its own __shared__ statics). The threads
// of one cluster are made once and walk the clusters in turn, meeting between them.
template <class F> void emu_launch(F&& kernel, unsigned grid, unsigned block, unsigned cluster = 1) {
  constexpr size_t kStack = 256 * 1024, kGuard = 4096;
  gridDim = {grid, 1, 1};
  blockDim = {block, 1, 1};
  const unsigned groups = (grid + cluster - 1) / cluster;
  std::vector<emu_block> blocks(grid);
  for (auto& blk : blocks) {
    blk.bar.emplace_back(block);
    for (unsigned w = 0; w * 32 < block; ++w) blk.warps.emplace_back(std::min(32u, block - w * 32));
    blk.slots.assign(2 * block, 0u);
  }
  std::vector<emu_barrier> cbars;
  for (unsigned g = 0; g < groups; ++g) cbars.emplace_back(block * cluster);
  emu_barrier between(block * cluster);
  auto body = [&](unsigned q, unsigned t) {
    for (unsigned g = 0; g < groups; ++g) {
      const unsigned b = g * cluster + q;
      emu_cur->cluster_bar = &cbars[g];
      if (b < grid) {
        emu_cur->tid = {t, 0, 0};
        emu_cur->bid = {b, 0, 0};
        emu_cur->me = &blocks[b];
        emu_cur->shfl_round = 0;
        kernel(q);
        emu_cur->me->bar[0].arrive_and_drop();  // an exited thread leaves the barriers, as on the GPU
        emu_cur->me->warps[t / 32].arrive_and_drop();
      }
      emu_cur->cluster_bar->arrive_and_drop();
      between.arrive_and_wait();
    }
  };
  std::vector<emu_fiber> fs(size_t(cluster) * block);
  for (unsigned q = 0; q < cluster; ++q)
    for (unsigned t = 0; t < block; ++t) {
      emu_fiber& f = fs[size_t(q) * block + t];
      f.body = [](void* c, unsigned q, unsigned t) { (*static_cast<decltype(body)*>(c))(q, t); };
      f.arg = &body;
      f.q = q;
      f.t = t;
      void* m = mmap(nullptr, kGuard + kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (m == MAP_FAILED) { std::perror("mmap"); std::abort(); }
      mprotect(m, kGuard, PROT_NONE);  // a stack overflow faults
      f.map = (char*)m;
      f.stack_size = kStack;
      emu_ctx_init(f.ctx, f.map + kGuard, kStack, emu_entry);
    }
  for (size_t live = fs.size(); live;) {
    const unsigned long long before = emu_events;
    for (size_t k = 0; k < fs.size(); ++k)
      if (auto& f = fs[emu_reverse ? fs.size() - 1 - k : k]; !f.done) {
        emu_resume(&f);
        live -= f.done;
        emu_events += f.done;
      }
    if (live && emu_events == before) {  // every live thread waits at a barrier that none will reach
      std::fprintf(stderr, "emulation deadlock: %zu thread(s) wait at barriers no other thread reaches\n", live);
      std::abort();
    }
  }
  emu_cur = nullptr;
  for (auto& f : fs) {
#ifdef __SANITIZE_ADDRESS__
    __asan_unpoison_memory_region(f.map + kGuard, kStack);  // the frames left on it; the mapping may come back
#endif
    munmap(f.map, kGuard + kStack);
  }
}
"""

_MAIN = r"""
int main(int argc, char** argv) {
  // argv: case, then (buffer file, offset modulo 16) pairs: read, run, written back. Each buffer is
  // allocated exactly (AddressSanitizer catches any access outside it).
  const int which = atoi(argv[1]);
  emu_reverse = getenv("EMU_REVERSE") != nullptr;
  std::vector<void*> bufs;
  std::vector<size_t> sizes;
  for (int a = 2; a + 1 < argc; a += 2) {
    FILE* f = fopen(argv[a], "rb");
    fseek(f, 0, SEEK_END);
    const size_t n = ftell(f), pad = strtoull(argv[a + 1], nullptr, 10);
    fseek(f, 0, SEEK_SET);
    void* base = nullptr;
    if (posix_memalign(&base, 16, pad + n + 1)) return 3;
    if (fread((char*)base + pad, 1, n, f) != n) return 4;
    fclose(f);
    bufs.push_back((char*)base + pad);
    sizes.push_back(n);
  }
  void** P = bufs.data();
  switch (which) {
CASES
  }
  for (size_t i = 0; i < bufs.size(); ++i) {
    FILE* f = fopen(argv[2 + 2 * i], "wb");
    fwrite(bufs[i], 1, sizes[i], f);
    fclose(f);
  }
  return 0;
}
"""


def available() -> bool:
    """Whether the emulation can run here (it needs g++ with C++20)."""
    return shutil.which("g++") is not None


def _scalar(ctype: str, value: Any) -> str:
    if ctype == "f32":
        return f"(float){float(value).hex()}"
    if ctype == "f64":
        return f"(double){float(value).hex()}"
    return f"({ {'i32': 'int', 'i64': 'long long', 'u32': 'unsigned', 'u64': 'unsigned long long'}[ctype]}){int(value)}"


_RUNS: dict[tuple[Path, int], int] = {}   # (executable, case) -> its runs so far (the scheduler's order alternates)
_RUNS_LOCK = threading.Lock()


@dataclass(frozen=True)
class Program:
    """An emulation build: the executable, and per case the buffer keys its launches take, in order."""

    exe: Path
    keys: tuple[tuple[tuple[Any, ...], ...], ...]


_ASM_START = re.compile(r"\basm\s*(?:volatile\s*|__volatile__\s*)?\(")
# A global load or store of 1, 2 or 4 elements of 16, 32 or 64 bits, whatever its cache qualifiers (.nc,
# .cs, .L1::no_allocate, .L2::256B ...): to the CPU, plain memory accesses.
_LDST = re.compile(r"^\s*(ld|st)\.global((?:\.[\w:]+)*?)(?:\.v([24]))?\.([bsuf])(16|32|64)\s+(.*?);?\s*$", re.S)
_CTYPES = {("u", "16"): "unsigned short", ("b", "16"): "unsigned short", ("s", "16"): "short",
           ("u", "32"): "unsigned", ("b", "32"): "unsigned", ("s", "32"): "int", ("f", "32"): "float",
           ("u", "64"): "unsigned long long", ("b", "64"): "unsigned long long", ("s", "64"): "long long",
           ("f", "64"): "double"}


def _split_top(text: str, sep: str) -> list[str]:
    """`text` split at `sep` outside parentheses, brackets, braces and string literals."""
    parts, depth, cur, quote, i = [], 0, [], False, 0
    while i < len(text):
        ch = text[i]
        if quote:
            cur.append(ch)
            if ch == "\\" and i + 1 < len(text):
                cur.append(text[i + 1])
                i += 1
            elif ch == '"':
                quote = False
        elif ch == '"':
            quote = True
            cur.append(ch)
        elif ch in "([{":
            depth += 1
            cur.append(ch)
        elif ch in ")]}":
            depth -= 1
            cur.append(ch)
        elif ch == sep and depth == 0:   # asm's `::` (no outputs) splits twice; C++ scopes sit inside ( )
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return parts


def _operands(text: str) -> list[str]:
    """The expressions of an asm operand list (`"=r"(a), "l"(p)` -> ["a", "p"])."""
    out = []
    for op in _split_top(text, ","):
        m = re.match(r'\s*"[^"]*"\s*\((.*)\)\s*$', op, re.S)
        if m:
            out.append(m.group(1))
    return out


def _plain_asm(body: str) -> str:
    """Inline PTX the CPU can run: a global load or store with cache qualifiers becomes plain element
    accesses (what it computes; the hint is about caches). Any other asm is left, and fails to build."""
    out, pos = [], 0
    while True:
        m = _ASM_START.search(body, pos)
        if m is None:
            out.append(body[pos:])
            return "".join(out)
        depth, j = 1, m.end()
        while j < len(body) and depth:
            depth += {"(": 1, ")": -1}.get(body[j], 0)
            j += 1
        inner = body[m.end():j - 1]
        fields = _split_top(inner, ":")
        template = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', fields[0]))
        ops = [o for f in fields[1:3] for o in _operands(f)]
        ls = _LDST.match(template)
        code = None
        if ls is not None:
            kind, n, ctype = ls.group(1), int(ls.group(3) or 1), _CTYPES.get((ls.group(4), ls.group(5)))
            regs = [int(r) for r in re.findall(r"%(\d+)", ls.group(6))]
            addr = re.search(r"\[\s*%(\d+)\s*\]", ls.group(6))
            if ctype is not None and addr is not None and len(regs) == n + 1:
                a = int(addr.group(1))
                vals = [r for r in regs if r != a]
                ptr = f"(({'const ' if kind == 'ld' else ''}{ctype}*)({ops[a]}))"
                if kind == "ld":
                    code = "{ " + " ".join(f"({ops[r]}) = {ptr}[{k}];" for k, r in enumerate(vals)) + " }"
                else:
                    code = "{ " + " ".join(f"{ptr}[{k}] = ({ctype})({ops[r]});" for k, r in enumerate(vals)) + " }"
        out.append(body[pos:m.start()])
        if code is None:
            out.append(body[m.start():j])
            pos = j
        else:
            out.append(code)
            pos = j
            # the statement's own `;` stays after the block


def _translate(source: str) -> str:
    """CUDA source as C++ for the shim: no CUDA headers, the shim's cluster barrier, and every kernel a
    template over the block's rank in its cluster and the launch's dynamic shared memory, so that each
    block of a cluster has its own __shared__ statics (a static array of the launch's size stands in for
    dynamic shared memory)."""
    body = re.sub(r"#include <cuda_\w+\.h>\n", "", source)
    body = body.replace('extern "C" __global__', "template <int EMU_Q, int EMU_SHARED> __global__")
    body = re.sub(r"// kf-(cluster|async)-begin.*?// kf-\1-end\n", "", body, flags=re.S)
    body = _plain_asm(body)
    return re.sub(r"extern __shared__ __align__\((\d+)\) unsigned char (\w+)\[\];",
                  r"alignas(\1) static unsigned char \2[EMU_SHARED > 0 ? EMU_SHARED : 1];", body)


# -O0 with AddressSanitizer and UBSan's alignment check; ASan's checks as calls rather than inline code and no
# exception tables (the kernels throw nothing) build the same checks 25% faster, and run about as fast.
_FLAGS = ("-std=c++20", "-O0", "-w", "-pthread", "-fsanitize=address,alignment", "-fno-sanitize-recover=all",
          "--param", "asan-instrumentation-with-call-threshold=0", "-fno-exceptions", "-fno-asynchronous-unwind-tables")


def build(cases: Sequence[tuple[str, Any]], workdir: Path) -> Program:
    """One executable for every (source, resolved launch spec) case. Raises with g++'s errors."""
    parts, dispatch, keys = [SHIM], [], []
    for k, (source, resolved) in enumerate(cases):
        parts.append(f"namespace c{k} {{\n{_translate(source)}\n}}\n")
        found = re.search(r"__cluster_dims__\((\d+)", source)
        cluster = int(found.group(1)) if found else 1
        order: list[tuple[Any, ...]] = []
        calls = []
        for ln in resolved.launches:
            args = []
            for a in ln.args:
                if a.ctype != "ptr":
                    args.append(_scalar(a.ctype, a.value))
                elif a.value == ("null",):
                    args.append("emu_ptr{nullptr}")
                else:
                    if a.value not in order:
                        order.append(a.value)
                    args.append(f"emu_ptr{{P[{order.index(a.value)}]}}")
            call = ", ".join(args)
            together = ln.grid[0] if getattr(ln, "cooperative", False) else cluster  # cooperative: all at once
            slots = " ".join(f"case {q}: c{k}::{ln.kernel}<{q}, {ln.shared}>({call}); break;" for q in range(together))
            calls.append(f"emu_launch([&](unsigned q) {{ switch (q) {{ {slots} }} }}, {ln.grid[0]}, "
                         f"{ln.block[0]}, {together});")
        dispatch.append(f"    case {k}: {{ {' '.join(calls)} break; }}")
        keys.append(tuple(order))
    text = "\n".join(parts) + _MAIN.replace("CASES", "\n".join(dispatch))
    tag = hashlib.sha256(text.encode()).hexdigest()[:12]
    cpp, exe = workdir / f"emu_{tag}.cpp", workdir / f"emu_{tag}"
    cpp.write_text(text)
    done = subprocess.run(["g++", *_FLAGS, str(cpp), "-o", str(exe)], capture_output=True, text=True)
    if done.returncode:
        raise AssertionError(f"the emulation does not build:\n{done.stderr[-4000:]}")
    return Program(exe, tuple(keys))


def _storage_bytes(t: torch.Tensor) -> tuple[int, bytes]:
    lo, hi = storage_extent(t)
    raw = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
    return lo, raw[lo:hi].clone().numpy().tobytes()


def like(t: torch.Tensor, data: bytes) -> torch.Tensor:
    """A tensor with t's layout whose touched storage holds `data`."""
    lo, hi = storage_extent(t)
    store = torch.zeros(t.untyped_storage().nbytes(), dtype=torch.uint8)
    store[lo:hi] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return torch.empty(0, dtype=t.dtype).set_(store.untyped_storage(), t.storage_offset(), t.shape, t.stride())


def copy_of(t: torch.Tensor) -> torch.Tensor:
    """A copy of t with the same layout (strides, storage offset) and touched bytes."""
    return like(t, _storage_bytes(t)[1])


def output_like(desc: dict[str, Any], fill: float) -> torch.Tensor:
    """An output tensor as the card describes it, every element `fill` (NaN shows unwritten elements)."""
    out = torch.empty_strided(desc["shape"], desc["stride"], dtype=getattr(torch, desc["dtype"]))
    if out.numel():
        out.fill_(fill)
    return out


@dataclass
class Run:
    """What one emulated run left: every output, every input the kernels were given, or the crash."""

    outputs: list[torch.Tensor]
    inputs: dict[str, torch.Tensor]
    error: str | None = None


def run(program: Program, case: int, resolved: Any, inputs: dict[str, torch.Tensor],
        outputs: Sequence[torch.Tensor], workdir: Path) -> Run:
    """Run case `case` on copies of `inputs` and `outputs` (workspaces start as garbage, or zeros where
    the spec asks for them zeroed)."""
    ws = {name: (nbytes, zero) for name, nbytes, zero in resolved.workspaces}
    files, tensors = [], []
    for j, key in enumerate(program.keys[case]):
        kind, name = key[0], key[1]
        path = workdir / f"buf{case}_{j}"
        if kind == "workspace":
            nbytes, zero = ws[name]
            path.write_bytes(bytes(nbytes) if zero else b"\xab" * nbytes)
            files += [str(path), "0"]
            tensors.append(None)
            continue
        t = inputs[name] if kind == "input" else outputs[name]
        lo, data = _storage_bytes(t)
        path.write_bytes(data)
        files += [str(path), str(lo % 16)]
        tensors.append(t)
    env = {"ASAN_OPTIONS": "detect_leaks=0", "PATH": "/usr/bin:/bin"}
    # Threads run as fibers in a fixed order; every other run of a program walks them backwards, so that a kernel
    # whose result depends on which thread runs first (a missing barrier between a read and a later write) gives
    # two runs of a case different outputs, as thread interleavings on the GPU would.
    with _RUNS_LOCK:
        _RUNS[(program.exe, case)] = n = _RUNS.get((program.exe, case), 0) + 1
    if n % 2 == 0:
        env["EMU_REVERSE"] = "1"
    done = subprocess.run([str(program.exe), str(case), *files], capture_output=True, text=True, timeout=300,
                          env=env)
    if done.returncode:
        return Run([], {}, f"crashed (rc {done.returncode}): {done.stderr[-1500:]}")
    after = {key: like(t, Path(files[2 * j]).read_bytes())
             for j, (key, t) in enumerate(zip(program.keys[case], tensors)) if t is not None}
    return Run([after.get(("output", k), o) for k, o in enumerate(outputs)],
               {key[1]: t for key, t in after.items() if key[0] == "input"})
