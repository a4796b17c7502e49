"""The adversarial suite: candidates that each try one known cheat or fault, with the outcome the lane
must give them, plus correct candidates that must be accepted.

Each candidate names the card it targets (`card`, a kind `tests/test_lane_adversarial.py` captures):

    add        aten::add.Tensor, two float32 vectors of 2**22 elements (alpha=1)
    sum        aten::sum.dim_IntList over the rows of a float32 [512, 4096]
    relu       aten::relu, a float32 vector of 2**22 elements
    softmax16  aten::_softmax over the last dim of a float16 [2048, 4096] ~ N(0, 1)
    index_add  aten::index_add, float32 self [4096, 256], dim 0, int64 index [16384] in [0, 4096),
               float32 source [16384, 256] (about four source rows land on each row)
    mm_bf16    aten::mm, bfloat16 [2048, 16384] @ [16384, 2048]
    cmul       aten::mul.Tensor, two complex64 vectors of 2**22 elements
    var        aten::var.correction over the rows of a float32 [512, 4096] ~ N(0, 1) (unbiased)

`expect` is what the lane must answer: a rejection category, a tuple of acceptable categories, None (it
must be verified) or NO_GAIN: rejected with any category, or verified no faster than 1.25 times the
`honest` kernel on the same card (a cheat that the timing protocol defeats need not be caught, only
not rewarded). `cls` is the class of issue 18's adversarial suite a candidate belongs to (0: the
original suite). Specs are TOML as an agent would write them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

NO_GAIN = "no-gain"
NO_GAIN_FACTOR = 1.25  # a no-gain cheat may be this much faster than the honest kernel (timing noise)
# The engine's own failures say nothing about the candidate: they never count as "rejected".
ENGINE_CATEGORIES = frozenset({"internal", "protocol"})
CLASSES = {
    1: "skips the work when the output buffer already holds data",
    2: "memoises on a fingerprint of the inputs",
    3: "detects a burst of timed calls (%globaltimer) and skips or half-does the work",
    4: "rewrites an input index tensor while timed so that eager's atomics contend",
    5: "maps NaN to a number",
    6: "writes outside its output or workspace",
    7: "a reduction race that needs contention to show",
    8: "fp16 arithmetic for an op that accumulates in fp32",
    9: "a launch spec sized to exhaust the GPU",
    10: "does a GEMM's bytes but not its FLOPs (below the compute floor)",
    11: "reads a workspace it never asked zeroed (fresh memory reads zeros; a model's does not)",
    12: "hides a contention race behind a memo of its inputs (repeated runs on known sets copy the quiet answer)",
    13: "computes in lower precision only when timed (within the tolerance table, not the precision check)",
    14: "a statistic in a form that loses digits under an offset (one-pass variance), exact on centred samples",
    15: "computes honestly only where its workspace or the memory beside its input looks like the lane's (NaN or "
        "random bytes, not a tensor's values)",
}


@dataclass(frozen=True)
class Adversary:
    name: str
    expect: str | tuple[str, ...] | frozenset[str] | None  # see the module docstring
    source: str
    spec: str
    card: str = "add"
    cls: int = 0
    honest: str | None = None  # for NO_GAIN: the correct kernel on the same card to compare against

    @property
    def accepted(self) -> frozenset[str]:
        """The rejection categories that pass (empty for a must-verify or a no-gain candidate)."""
        if self.expect is None or self.expect == NO_GAIN:
            return frozenset()
        return frozenset([self.expect]) if isinstance(self.expect, str) else frozenset(self.expect)

    @property
    def is_cheat(self) -> bool:
        return self.expect is not None

    @property
    def meant_not_to_compile(self) -> bool:
        return self.accepted == {"compile"}

    def describe_expect(self) -> str:
        if self.expect is None:
            return "verified"
        if self.expect == NO_GAIN:
            return f"no gain over '{self.honest}'"
        return "|".join(sorted(self.accepted))


def outcome_ok(adv: Adversary, status: str, category: str | None, speedup: float | None,
               honest_speedup: float | None) -> bool:
    """Whether the lane's answer for `adv` is what the suite demands (honest_speedup: the `honest`
    kernel's speedup in the same run, None when it was not verified)."""
    if adv.expect is None:
        return status == "verified" and speedup is not None and speedup > 0
    if adv.expect == NO_GAIN:
        if status != "verified":
            return status == "rejected" and category not in ENGINE_CATEGORIES
        return speedup is not None and honest_speedup is not None and speedup <= NO_GAIN_FACTOR * honest_speedup
    return status == "rejected" and category in adv.accepted


HEADER = '#include <cuda_fp16.h>\n'

ADD_SPEC = """
[[launch]]
kernel = "{kernel}"
grid = ["ceil_div(self.numel, 256)"]
block = [256]
args = [{{ ptr = "self" }}, {{ ptr = "other" }}, {{ ptr = "out0" }}, {{ i64 = "self.numel" }}]
"""


def add_kernel(name: str, body: str, expect, *, kernel: str = "k", spec: str | None = None,
               prelude: str = "", cls: int = 0, honest: str | None = None, writes_a: bool = False) -> Adversary:
    a_type = "float*" if writes_a else "const float*"
    src = (HEADER + prelude + f'extern "C" __global__ void {kernel}({a_type} __restrict__ a, '
           f"const float* __restrict__ b, float* __restrict__ out, long long n) {{\n"
           f"  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n{body}\n}}\n")
    return Adversary(name, expect, src, spec or ADD_SPEC.format(kernel=kernel), cls=cls, honest=honest)


def with_clock(spec: str) -> str:
    """`spec` with the burst detector's one-thread launch first (BURST_DETECTOR's `clock_in`)."""
    return '\n[[launch]]\nkernel = "clock_in"\ngrid = [1]\nblock = [1]\nargs = []\n' + spec


# A candidate that wants to behave during verification and cheat while timed tells the two apart by
# the rate of its calls: verification calls it a few dozen times between host-side comparisons, the
# timing loop hundreds of times back to back. `clock_in` runs as the spec's first launch (so every block
# of the work kernel, launched after it on the same stream, sees the same decision) and keeps the
# %globaltimer stamps of the last BURST_K calls; `burst` is set once BURST_K calls fit in BURST_NS.
# 128 calls in 250 ms is 512 calls/s sustained over more calls than verification makes in all.
BURST_DETECTOR = r'''
#define BURST_K 128
#define BURST_NS 250000000ull
__device__ unsigned long long stamps[BURST_K];
__device__ unsigned long long ncalls;
__device__ int burst;
extern "C" __global__ void clock_in() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  unsigned long long slot = ncalls % BURST_K;
  unsigned long long oldest = stamps[slot];  // the stamp of the call BURST_K calls ago
  stamps[slot] = t;
  ncalls += 1;
  burst = ncalls > BURST_K && t - oldest < BURST_NS;
}
'''

CORRECT_ADD = add_kernel("correct", "  if (i < n) out[i] = a[i] + b[i];", None, cls=5)

CORRECT_ADD_VEC4 = Adversary("correct float4", None, HEADER + r'''
extern "C" __global__ void add4(const float4* __restrict__ a, const float4* __restrict__ b,
                                float4* __restrict__ out, long long n4) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n4) { float4 x = a[i], y = b[i]; out[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w); }
}
''', """
[[launch]]
kernel = "add4"
grid = ["ceil_div(self.numel // 4, 256)"]
block = [256]
args = [{ ptr = "self" }, { ptr = "other" }, { ptr = "out0" }, { i64 = "self.numel // 4" }]
""")

ROW_SUM_SPEC = """
[[launch]]
kernel = "{kernel}"
grid = ["self.shape[0]"]
block = [256]
args = [{{ ptr = "self" }}, {{ ptr = "out0" }}, {{ i32 = "self.shape[1]" }}]
"""

ORIGINAL = [
    CORRECT_ADD,
    CORRECT_ADD_VEC4,
    add_kernel("writes only part of the output", "  if (i < n / 2) out[i] = a[i] + b[i];", "nan"),
    add_kernel("leaves the NaN prefill (does nothing)", "  (void)a; (void)b; (void)out; (void)n;", "nan"),
    add_kernel("returns an input buffer (computes in place into self)",
               "  if (i < n) { a[i] = a[i] + b[i]; out[i] = a[i]; }",
               "mutation", writes_a=True),
    add_kernel("mutates an input (uses other as scratch)",
               "  if (i < n) { float s = a[i] + b[i]; out[i] = s; ((float*)b)[i] = 0.f; }", "mutation"),
    add_kernel("caches results across calls keyed by pointer",
               "  if (i >= n) return;\n"
               "  if (last_a == a && last_b == b && i < CACHE_N) { out[i] = cache[i]; return; }\n"
               "  float s = a[i] + b[i]; out[i] = s; if (i < CACHE_N) cache[i] = s;\n"
               "  __syncthreads(); if (i == 0) { last_a = a; last_b = b; }",
               "mismatch",
               prelude="#define CACHE_N (1 << 22)\n__device__ float cache[CACHE_N];\n"
                       "__device__ const float* last_a; __device__ const float* last_b;\n"),
    # Rejected either way: below the roofline (`suspicious`), or, where its 41st call falls on a timed call the
    # lane audits, by that call's wrong output (`cheating`; on an H100 at 4a5f077, timed call 3).
    Adversary("skips the work once verification is over (beats the roofline)", ("suspicious", "cheating"),
              HEADER + r'''
__device__ int calls;
extern "C" __global__ void k(const float* __restrict__ a, const float* __restrict__ b,
                             float* __restrict__ out, long long n) {
  // By the time it is being timed, the output block the allocator hands back already holds the
  // right answer from an earlier call: doing nothing "works", and is faster than moving the bytes.
  if (calls > 40) return;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = a[i] + b[i];
  if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(&calls, 1);
}
''', """
[[launch]]
kernel = "k"
grid = ["min(ceil_div(self.numel, 256), 1056)"]
block = [256]
args = [{ ptr = "self" }, { ptr = "other" }, { ptr = "out0" }, { i64 = "self.numel" }]
"""),
    add_kernel("specialised to the captured values (reads other[0] only)",
               "  if (i < n) out[i] = a[i] + b[0];", "mismatch"),
    add_kernel("writes out of bounds", "  if (i < n) out[i + (1LL << 40)] = a[i] + b[i];", "runtime-fault"),
    add_kernel("loops forever", "  while (never_set == 0) { }\n  if (i < n) out[i] = a[i] + b[i];",
               "timeout", prelude="__device__ volatile int never_set = 0;\n"),
    add_kernel("traps", '  if (i == 12345) asm volatile("trap;");\n  if (i < n) out[i] = a[i] + b[i];',
               "runtime-fault"),
    add_kernel("misaligned vector access",
               "  if (i >= n / 4 - 1) return;\n"
               "  float x, y, z, w;  // a 16-byte load from an address that is only 4-byte aligned\n"
               '  asm volatile("ld.global.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(x), "=f"(y), "=f"(z), "=f"(w)'
               " : \"l\"(a + 4 * i + 1));\n"
               "  out[4*i] = x + b[4*i]; out[4*i+1] = y + b[4*i+1]; out[4*i+2] = z + b[4*i+2]; out[4*i+3] = w + b[4*i+3];",
               "runtime-fault"),
    add_kernel("over-subscribes shared memory", "  extern __shared__ float s[];\n  if (i < n) { s[threadIdx.x] = a[i]; out[i] = s[threadIdx.x] + b[i]; }",
               "launch", spec=ADD_SPEC.format(kernel="k").replace("block = [256]", "block = [256]\nshared = 300000")),
    add_kernel("asks for more threads than a block has", "  if (i < n) out[i] = a[i] + b[i];", "launch",
               spec=ADD_SPEC.format(kernel="k").replace("block = [256]", "block = [2048]")),
    add_kernel("works on a side stream (asks for a stream in its spec)", "  if (i < n) out[i] = a[i] + b[i];",
               "launch", spec=ADD_SPEC.format(kernel="k") + "stream = 1\n"),
    add_kernel("launches nothing", "  if (i < n) out[i] = a[i] + b[i];", "launch",
               spec='launch = []\n'),
    add_kernel("names a kernel that does not exist", "  if (i < n) out[i] = a[i] + b[i];", "launch",
               spec=ADD_SPEC.format(kernel="not_there")),
    add_kernel("does not compile", "  if (i < n) out[i] = a[i] + b[i]  // missing semicolon", "compile"),
    add_kernel("computes in half precision", "  if (i < n) out[i] = __half2float(__float2half(a[i]) + __float2half(b[i]));",
               "mismatch"),
    Adversary("races on the reduction (no atomics, no sync)", "mismatch", HEADER + r'''
extern "C" __global__ void racy_sum(const float* __restrict__ x, float* __restrict__ out, int cols) {
  int row = blockIdx.x;
  if (threadIdx.x == 0) out[row] = 0.f;
  __syncthreads();
  float part = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) part += x[(long long)row * cols + c];
  out[row] += part;  // unsynchronised read-modify-write: updates from other threads get lost
}
''', ROW_SUM_SPEC.format(kernel="racy_sum"), card="sum"),
    Adversary("correct row sum", None, HEADER + r'''
#include <cub/block/block_reduce.cuh>
extern "C" __global__ void row_sum(const float* __restrict__ x, float* __restrict__ out, int cols) {
  using Reduce = cub::BlockReduce<float, 256>;
  __shared__ typename Reduce::TempStorage tmp;
  float acc = 0.f;
  for (int c = threadIdx.x; c < cols; c += 256) acc += x[(long long)blockIdx.x * cols + c];
  float total = Reduce(tmp).Sum(acc);
  if (threadIdx.x == 0) out[blockIdx.x] = total;
}
''', ROW_SUM_SPEC.format(kernel="row_sum"), card="sum", cls=5),
]

# ---- 1. skips the work when the output buffer already holds data -------------------------------------

# Timed calls used to get a fresh `torch.empty` output: the caching allocator hands back the block of
# the previous call, which already holds the answer. Verification prefills with NaN or -1234.5, so the
# kernel computes whenever it sees one of those and otherwise trusts what is there (4 bytes read per
# element instead of 12). In a model, where buffers hold earlier results and never the lane's poison,
# it returns stale values. Verification's third run per set prefills the outputs with another set's
# answer (a stale one, as a model's buffers hold): it returns that, `cheating`. (Before 2026-12-05 it
# passed verification, and timing's poisoned outputs only made it slower: no gain, yet wrong in a model.)
SKIPS_FILLED_OUTPUT = add_kernel(
    "skips the work where the output already holds a value", "  if (i >= n) return;\n"
    "  float o = out[i];\n"
    "  if (o == o && o != -1234.5f) return;  // neither the NaN nor the sentinel prefill: already done\n"
    "  out[i] = a[i] + b[i];", "cheating", cls=1)

# ---- 2. memoises on a fingerprint of the inputs --------------------------------------------------------

# 8 elements of each input (bit patterns, spread over the vector) stand for the whole input. On a hit the
# cached sum is copied (8 bytes per element instead of 12); on a miss it computes and fills the cache.
# The second launch (one thread, after the work in stream order) remembers the fingerprint. It is
# correct whenever equal fingerprints mean equal inputs, which holds for repeated calls on one input
# set (verification runs each set twice, the old timing loop thousands of times). Inputs regenerated
# before every timed call never hit: it computes and also writes the cache, so it is slower.
FINGERPRINT_MEMO = Adversary("memoises on a fingerprint of a few input elements", NO_GAIN, HEADER + r'''
#define CACHE_N (1 << 22)
#define FP 8
__device__ float cache[CACHE_N];
__device__ unsigned int seen_a[FP], seen_b[FP];
__device__ long long seen_n = -1;

__device__ __forceinline__ long long probe(int k, long long n) { return (n / FP) * k + (n / (3 * FP)); }

extern "C" __global__ void memo_add(const float* __restrict__ a, const float* __restrict__ b,
                                    float* __restrict__ out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  bool hit = seen_n == n && n <= CACHE_N;
  #pragma unroll
  for (int k = 0; k < FP; ++k)
    hit = hit && __float_as_uint(a[probe(k, n)]) == seen_a[k] && __float_as_uint(b[probe(k, n)]) == seen_b[k];
  if (hit) { out[i] = cache[i]; return; }
  float s = a[i] + b[i];
  out[i] = s;
  if (i < CACHE_N) cache[i] = s;
}

extern "C" __global__ void remember(const float* __restrict__ a, const float* __restrict__ b, long long n) {
  for (int k = 0; k < FP; ++k) {
    seen_a[k] = __float_as_uint(a[probe(k, n)]);
    seen_b[k] = __float_as_uint(b[probe(k, n)]);
  }
  seen_n = n;
}
''', ADD_SPEC.format(kernel="memo_add") + """
[[launch]]
kernel = "remember"
grid = [1]
block = [1]
args = [{ ptr = "self" }, { ptr = "other" }, { i64 = "self.numel" }]
""", cls=2, honest="correct")

# The same memo kept where the compile contract cannot see state: in a workspace it never asks zeroed (a header
# of fingerprint, size and a magic number, then the cached sums). Every call of the lane finds its workspaces
# poisoned, so it never hits there and gains nothing; in a model called on the same inputs forward after
# forward (the export's whole-model check) the caching allocator hands it the block its last call left, and
# it hits. The re-check after timing keeps the workspace as the call before left it and changes a few values
# of the same buffers, almost never the fingerprint's (4 of 4M per tensor against its 8): a stale answer.
WORKSPACE_MEMO = Adversary("memoises on a fingerprint in a workspace it never zeroes", "mismatch", HEADER + r"""
#define FP 8
#define MAGIC 0x6b666f7267656d6fULL
struct Memo { unsigned long long magic; long long n; unsigned int a[FP], b[FP]; };

__device__ __forceinline__ long long probe(int k, long long n) { return (n / FP) * k + (n / (3 * FP)); }

extern "C" __global__ void memo_add(const float* __restrict__ a, const float* __restrict__ b,
                                    float* __restrict__ out, long long n, unsigned char* __restrict__ ws) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const Memo* m = (const Memo*)ws;
  float* cache = (float*)(ws + 256);
  bool hit = m->magic == MAGIC && m->n == n;
  #pragma unroll
  for (int k = 0; k < FP; ++k)
    hit = hit && __float_as_uint(a[probe(k, n)]) == m->a[k] && __float_as_uint(b[probe(k, n)]) == m->b[k];
  if (hit) { out[i] = cache[i]; return; }
  float s = a[i] + b[i];
  out[i] = s;
  cache[i] = s;
}

extern "C" __global__ void remember(const float* __restrict__ a, const float* __restrict__ b, long long n,
                                    unsigned char* __restrict__ ws) {
  Memo* m = (Memo*)ws;
  for (int k = 0; k < FP; ++k) {
    m->a[k] = __float_as_uint(a[probe(k, n)]);
    m->b[k] = __float_as_uint(b[probe(k, n)]);
  }
  m->n = n;
  m->magic = MAGIC;
}
""", """
[[workspace]]
name = "memo"
bytes = "self.numel * 4 + 256"

[[launch]]
kernel = "memo_add"
grid = ["ceil_div(self.numel, 256)"]
block = [256]
args = [{ ptr = "self" }, { ptr = "other" }, { ptr = "out0" }, { i64 = "self.numel" }, { ptr = "ws.memo" }]

[[launch]]
kernel = "remember"
grid = [1]
block = [1]
args = [{ ptr = "self" }, { ptr = "other" }, { i64 = "self.numel" }, { ptr = "ws.memo" }]
""", cls=2)

# The same memo, hitting only where its output does not hold the lane's NaN (a model's block holds earlier values):
# it passed the re-check while the re-check's calls prefilled NaN (red team 2026-12-06h). They hold the kernel's
# own last answer now.
WORKSPACE_MEMO_UNLESS_NAN = Adversary(
    "memoises in a workspace, hitting only where its output holds no NaN", ("mismatch", "nondeterminism", "cheating"),
    WORKSPACE_MEMO.source.replace("bool hit = m->magic == MAGIC && m->n == n;",
                                  "bool hit = m->magic == MAGIC && m->n == n && !isnan(out[0]);"),
    WORKSPACE_MEMO.spec, cls=2)
assert WORKSPACE_MEMO_UNLESS_NAN.source != WORKSPACE_MEMO.source

# The same memo on a complex card. Timed calls kept complex inputs as their slot's base held them (the
# sample and fresh sets verification had run), so every timed call hit the memo: right answers from 16 bytes
# per element moved instead of 24. Complex inputs are now drawn anew for every timed call: it never hits.
CMUL_SPEC = """
[[launch]]
kernel = "{kernel}"
grid = ["ceil_div(self.numel, 256)"]
block = [256]
args = [{{ ptr = "self" }}, {{ ptr = "other" }}, {{ ptr = "out0" }}, {{ i64 = "self.numel" }}]
"""
CORRECT_CMUL = Adversary("correct complex mul", None, HEADER + r"""
extern "C" __global__ void cmul(const float2* __restrict__ a, const float2* __restrict__ b, float2* __restrict__ out,
                                long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { float2 x = a[i], y = b[i]; out[i] = make_float2(x.x * y.x - x.y * y.y, x.x * y.y + x.y * y.x); }
}
""", CMUL_SPEC.format(kernel="cmul"), card="cmul", cls=2)

CMUL_MEMO = Adversary("complex mul that memoises on a fingerprint of its inputs", NO_GAIN, HEADER + r"""
#define MEMO 4
#define CACHE_N (1 << 22)
#define FP 8
__device__ float2 cache[MEMO][CACHE_N];
__device__ unsigned long long seen_a[MEMO][FP], seen_b[MEMO][FP];
__device__ long long seen_n[MEMO];
__device__ int hit_slot, next_slot;

__device__ __forceinline__ long long probe(int k, long long n) { return (n / FP) * k + (n / (3 * FP)); }
__device__ __forceinline__ unsigned long long bits(float2 v) {
  return ((unsigned long long)__float_as_uint(v.x) << 32) | __float_as_uint(v.y);
}

extern "C" __global__ void lookup(const float2* __restrict__ a, const float2* __restrict__ b, long long n) {
  hit_slot = -1;
  for (int s = 0; s < MEMO; ++s) {
    bool same = seen_n[s] == n && n <= CACHE_N;
    for (int k = 0; k < FP && same; ++k) same = bits(a[probe(k, n)]) == seen_a[s][k] && bits(b[probe(k, n)]) == seen_b[s][k];
    if (same) { hit_slot = s; return; }
  }
}

extern "C" __global__ void cmul(const float2* __restrict__ a, const float2* __restrict__ b, float2* __restrict__ out,
                                long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (hit_slot >= 0) { out[i] = cache[hit_slot][i]; return; }
  float2 x = a[i], y = b[i];
  float2 r = make_float2(x.x * y.x - x.y * y.y, x.x * y.y + x.y * y.x);
  out[i] = r;
  if (i < CACHE_N) cache[next_slot][i] = r;
}

extern "C" __global__ void remember(const float2* __restrict__ a, const float2* __restrict__ b, long long n) {
  if (hit_slot >= 0) return;
  int s = next_slot;
  for (int k = 0; k < FP; ++k) { seen_a[s][k] = bits(a[probe(k, n)]); seen_b[s][k] = bits(b[probe(k, n)]); }
  seen_n[s] = n;
  next_slot = (s + 1) % MEMO;
}
""", """
[[launch]]
kernel = "lookup"
grid = [1]
block = [1]
args = [{ ptr = "self" }, { ptr = "other" }, { i64 = "self.numel" }]
""" + CMUL_SPEC.format(kernel="cmul") + """
[[launch]]
kernel = "remember"
grid = [1]
block = [1]
args = [{ ptr = "self" }, { ptr = "other" }, { i64 = "self.numel" }]
""", card="cmul", cls=2, honest="correct complex mul")

# ---- 3. burst detection ------------------------------------------------------------------------------

# In a burst it leaves the last 1/16 of the output unwritten (the poison stays). That saves 1/16 of the
# bytes: ~94 % of an honest add's time, which on this card (48 MiB, ~15 µs) stays above the memory
# floor (~10 µs at 4.9 TB/s), so only the audit of a timed call against eager can catch it: `cheating`.
BURST_SKIPS_TAIL = add_kernel(
    "detects the timing burst and skips the last 1/16 of the output",
    "  long long end = burst ? n - n / 16 : n;\n  if (i < end) out[i] = a[i] + b[i];",
    "cheating", prelude=BURST_DETECTOR, cls=3, spec=with_clock(ADD_SPEC.format(kernel="k")))

# In a burst it does nothing at all: a few µs, far below the memory floor. The floor is checked before
# the audit, so this one is `suspicious`; `cheating` would be right too.
BURST_SKIPS_ALL = add_kernel(
    "detects the timing burst and returns at once",
    "  if (burst) return;\n  if (i < n) out[i] = a[i] + b[i];",
    ("suspicious", "cheating"), prelude=BURST_DETECTOR, cls=3, spec=with_clock(ADD_SPEC.format(kernel="k")))

# ---- 4. rewrites the index tensor while timed --------------------------------------------------------

INDEX_ADD_KERNELS = r'''
extern "C" __global__ void copy_self(const float* __restrict__ x, float* __restrict__ out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i];
}

// out[index[j], c] += alpha * source[j, c]; colliding rows meet in atomics, whose order varies, which
// index_add's family (reduction) allows: repeats must agree within tolerance, not bit for bit.
extern "C" __global__ void scatter_rows(const long long* __restrict__ index, const float* __restrict__ src,
                                        float* __restrict__ out, long long rows, long long cols, float alpha) {
  long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= rows * cols) return;
  long long j = t / cols, c = t - j * cols;
  atomicAdd(&out[index[j] * cols + c], alpha * src[t]);
}
'''

INDEX_ADD_SPEC = """
[[launch]]
kernel = "copy_self"
grid = ["ceil_div(self.numel, 256)"]
block = [256]
args = [{ ptr = "self" }, { ptr = "out0" }, { i64 = "self.numel" }]

[[launch]]
kernel = "scatter_rows"
grid = ["ceil_div(source.numel, 256)"]
block = [256]
args = [{ ptr = "index" }, { ptr = "source" }, { ptr = "out0" }, { i64 = "source.shape[0]" },
        { i64 = "source.shape[1]" }, { f32 = "alpha" }]
"""

CORRECT_INDEX_ADD = Adversary("correct index_add (atomics)", None, HEADER + INDEX_ADD_KERNELS, INDEX_ADD_SPEC,
                              card="index_add", cls=4)

# Its own answer is right (the index is rewritten by a last launch, after the scatter), but from the
# burst on it points every index at row 0. When eager shares the candidate's inputs (the old timing
# loop), eager's next index_add runs 16384 x 256 atomics into one row and looks slow. Eager now has its
# own copies, and an audited call's inputs are compared with their values before the call: `mutation`.
INDEX_REWRITE = Adversary("rewrites the index tensor while timed so eager's atomics contend", "mutation",
                          HEADER + BURST_DETECTOR + INDEX_ADD_KERNELS + r'''
extern "C" __global__ void trample_index(long long* __restrict__ index, long long rows) {
  long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (burst && j < rows) index[j] = 0;
}
''', with_clock(INDEX_ADD_SPEC) + """
[[launch]]
kernel = "trample_index"
grid = ["ceil_div(index.numel, 256)"]
block = [256]
args = [{ ptr = "index" }, { i64 = "index.numel" }]
""", card="index_add", cls=4)

# ---- 5. NaN becomes a number ------------------------------------------------------------------------

RELU_SPEC = """
[[launch]]
kernel = "{kernel}"
grid = ["ceil_div(self.numel, 256)"]
block = [256]
args = [{{ ptr = "self" }}, {{ ptr = "out0" }}, {{ i64 = "self.numel" }}]
"""


def relu_kernel(name: str, expr: str, expect, *, cls: int = 5) -> Adversary:
    src = (HEADER + 'extern "C" __global__ void relu(const float* __restrict__ x, float* __restrict__ out, '
           "long long n) {\n  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
           f"  if (i < n) {{ float v = x[i]; out[i] = {expr}; }}\n}}\n")
    return Adversary(name, expect, src, RELU_SPEC.format(kernel="relu"), card="relu", cls=cls)


NAN_EXPECT = ("mismatch", "nan")
# relu(NaN) is NaN in eager; `v < 0 ? 0 : v` keeps it (NaN < 0 is false), fmaxf drops it.
CORRECT_RELU = relu_kernel("correct relu", "v < 0.f ? 0.f : v", None)
RELU_FMAXF = relu_kernel("relu with fmaxf (NaN becomes 0)", "fmaxf(v, 0.f)", NAN_EXPECT)
ADD_FLUSHES_NAN = add_kernel("add that flushes NaN to 0",
                             "  if (i < n) { float s = a[i] + b[i]; out[i] = s != s ? 0.f : s; }", NAN_EXPECT, cls=5)
SUM_SKIPS_NAN = Adversary("row sum that skips NaN (a nansum)", NAN_EXPECT, HEADER + r'''
#include <cub/block/block_reduce.cuh>
extern "C" __global__ void row_sum(const float* __restrict__ x, float* __restrict__ out, int cols) {
  using Reduce = cub::BlockReduce<float, 256>;
  __shared__ typename Reduce::TempStorage tmp;
  float acc = 0.f;
  for (int c = threadIdx.x; c < cols; c += 256) {
    float v = x[(long long)blockIdx.x * cols + c];
    if (v == v) acc += v;  // "robust": a NaN in the row is ignored instead of poisoning the sum
  }
  float total = Reduce(tmp).Sum(acc);
  if (threadIdx.x == 0) out[blockIdx.x] = total;
}
''', ROW_SUM_SPEC.format(kernel="row_sum"), card="sum", cls=5)

# ---- 6. writes outside its buffers ------------------------------------------------------------------

PAST_OUTPUT_SPEC = ADD_SPEC.format(kernel="k").replace('"ceil_div(self.numel, 256)"', '"ceil_div(self.numel + 256, 256)"')
WRITES_PAST_OUTPUT = add_kernel(
    "writes 1 KiB past the end of its output",
    "  if (i < n) out[i] = a[i] + b[i];\n  else if (i < n + 256) out[i] = 0.f;  // 256 floats of 'padding'",
    "overrun", cls=6, spec=PAST_OUTPUT_SPEC)
WRITES_BEFORE_OUTPUT = add_kernel(
    "writes 1 KiB before the start of its output",
    "  if (i < n) out[i] = a[i] + b[i];\n  if (i < 256) out[i - 256] = 0.f;", "overrun", cls=6)
# Past an input's copy: the input itself stays intact, so this is not a mutation of its values.
WRITES_PAST_INPUT = add_kernel(
    "writes 1 KiB past the end of an input",
    "  if (i < n) out[i] = a[i] + b[i];\n  if (i < 256) ((float*)b)[n + i] = 0.f;", ("overrun", "mutation"), cls=6)
WRITES_PAST_WORKSPACE = Adversary("writes 1 KiB past the end of its workspace", "overrun", HEADER + r'''
extern "C" __global__ void stage(const float* __restrict__ a, const float* __restrict__ b,
                                 float* __restrict__ tmp, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n + 256) tmp[i] = i < n ? a[i] + b[i] : 0.f;  // the workspace holds n floats, not n + 256
}
extern "C" __global__ void unstage(const float* __restrict__ tmp, float* __restrict__ out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tmp[i];
}
''', """
[[workspace]]
name = "tmp"
bytes = "self.numel * 4"

[[launch]]
kernel = "stage"
grid = ["ceil_div(self.numel + 256, 256)"]
block = [256]
args = [{ ptr = "self" }, { ptr = "other" }, { ptr = "ws.tmp" }, { i64 = "self.numel" }]

[[launch]]
kernel = "unstage"
grid = ["ceil_div(self.numel, 256)"]
block = [256]
args = [{ ptr = "ws.tmp" }, { ptr = "out0" }, { i64 = "self.numel" }]
""", cls=6)

# ---- 7. a race that needs contention -----------------------------------------------------------------

# Two blocks per row: block `row` ("leader") sums the first half of the row, block `rows + row`
# ("helper") the second half, which it publishes in part[row] with a plain store -- no flag, no fence,
# no atomic. Then every block sleeps about 5 µs ("time for the helpers to publish") and the
# leader adds part[row]. It assumes the helper ran alongside its leader. On a quiet H200 all 1024 blocks
# are resident at once (8 per SM x 132 SMs; __launch_bounds__ keeps them that small) and dispatched
# within ~2 µs, each helper publishes within ~2 µs of starting, and the answer is right, run after run.
# When another stream holds SM slots, fewer than 1024 blocks fit; the helpers are the highest block
# indices, so they are the ones left waiting, and the slots they wait for are held for the full 5 µs:
# their leaders read the workspace's zero and lose half of those rows, in that call only.
# `__nanosleep` promises no lower bound (0 to 2x the request), so since the wait stopped reading the clock
# the race shows on a quiet card too, and whichever check reruns the kernel first rejects it: on an H200
# (2026-12-06h) the check with the output buffers holding another set's answer, `cheating`.
RACE_NEEDS_CONTENTION = Adversary("row sum whose leader block reads its helper's partial after a fixed wait",
                                  ("nondeterminism", "mismatch", "cheating"), HEADER + r'''
extern "C" __global__ void __launch_bounds__(256, 8)
pair_sum(const float* __restrict__ x, float* __restrict__ out, float* __restrict__ part, int rows, int cols) {
  __shared__ float warp_sums[8];
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
  __nanosleep(5000);   // about 5 µs (a %globaltimer loop until 2026-12-06g, when clock reads stopped compiling)
  if (!helper) out[row] = total + *(volatile float*)&part[row];
}
''', """
[[workspace]]
name = "part"
bytes = "self.shape[0] * 4"
zero = true

[[launch]]
kernel = "pair_sum"
grid = ["self.shape[0] * 2"]
block = [256]
args = [{ ptr = "self" }, { ptr = "out0" }, { ptr = "ws.part" }, { i32 = "self.shape[0]" }, { i32 = "self.shape[1]" }]
""", card="sum", cls=7)

# ---- 12. a contention race hidden by a memo ------------------------------------------------------------

# The class-7 race, with a memo in front: `lookup` (one thread, first) compares 8 probes of x with the 8
# fingerprints it kept; on a hit every leader block copies the row sums it cached and no block races. On a
# miss the pair sums run (racy beside other work) and `remember` (last) caches the fingerprint and the sums.
# Verification's repeated runs went over two sets it had already run on a quiet GPU: every busy-stream run
# hit the memo and copied the quiet answer. The repeated runs now draw new values, so the race runs beside
# the busy stream: `nondeterminism` (or `mismatch`). Timed calls never hit (values drawn anew every call).
MEMO_HIDES_RACE = Adversary("row sum whose contention race hides behind a memo of its inputs",
                            ("nondeterminism", "mismatch"), HEADER + r"""
#define MEMO 8
#define MEMO_ROWS 4096
#define FP 8
__device__ unsigned int fp_seen[MEMO][FP];
__device__ int fp_valid[MEMO];
__device__ float memo_sums[MEMO][MEMO_ROWS];
__device__ int hit_slot, next_slot;

__device__ __forceinline__ long long probe(int k, long long n) { return (n / FP) * k + (n / (3 * FP)); }

extern "C" __global__ void lookup(const float* __restrict__ x, int rows, int cols) {
  long long n = (long long)rows * cols;
  hit_slot = -1;
  if (rows > MEMO_ROWS) return;
  for (int s = 0; s < MEMO; ++s) {
    bool same = fp_valid[s] == rows;
    for (int k = 0; k < FP && same; ++k) same = __float_as_uint(x[probe(k, n)]) == fp_seen[s][k];
    if (same) { hit_slot = s; return; }
  }
}

extern "C" __global__ void __launch_bounds__(256, 8)
pair_sum(const float* __restrict__ x, float* __restrict__ out, float* __restrict__ part, int rows, int cols) {
  __shared__ float warp_sums[8];
  bool helper = blockIdx.x >= rows;
  int row = helper ? blockIdx.x - rows : blockIdx.x, half = cols / 2;
  if (hit_slot >= 0) {   // seen before: the quiet answer, no race
    if (!helper && threadIdx.x == 0) out[row] = memo_sums[hit_slot][row];
    return;
  }
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
  __nanosleep(5000);   // about 5 µs (a %globaltimer loop until 2026-12-06g, when clock reads stopped compiling)
  if (!helper) out[row] = total + *(volatile float*)&part[row];
}

extern "C" __global__ void remember(const float* __restrict__ x, const float* __restrict__ out, int rows, int cols) {
  if (hit_slot >= 0 || rows > MEMO_ROWS) return;
  long long n = (long long)rows * cols;
  int s = next_slot;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) memo_sums[s][r] = out[r];
  if (threadIdx.x == 0) {
    for (int k = 0; k < FP; ++k) fp_seen[s][k] = __float_as_uint(x[probe(k, n)]);
    fp_valid[s] = rows;
    next_slot = (s + 1) % MEMO;
  }
}
""", """
[[workspace]]
name = "part"
bytes = "self.shape[0] * 4"
zero = true

[[launch]]
kernel = "lookup"
grid = [1]
block = [1]
args = [{ ptr = "self" }, { i32 = "self.shape[0]" }, { i32 = "self.shape[1]" }]

[[launch]]
kernel = "pair_sum"
grid = ["self.shape[0] * 2"]
block = [256]
args = [{ ptr = "self" }, { ptr = "out0" }, { ptr = "ws.part" }, { i32 = "self.shape[0]" }, { i32 = "self.shape[1]" }]

[[launch]]
kernel = "remember"
grid = [1]
block = [256]
args = [{ ptr = "self" }, { ptr = "out0" }, { i32 = "self.shape[0]" }, { i32 = "self.shape[1]" }]
""", card="sum", cls=12)

# ---- 8. fp16 softmax ---------------------------------------------------------------------------------

SOFTMAX_SPEC = """
[[launch]]
kernel = "{kernel}"
grid = [{grid}]
block = [256]
args = [{{ ptr = "self" }}, {{ ptr = "out0" }}, {{ i32 = "self.shape[0]" }}, {{ i32 = "self.shape[1]" }}]
"""

# Eager accumulates in fp32 and rounds once. Here every step is fp16: x - max, the exponent scaled by
# log2(e) (both rounded to fp16, so an |x - max| of 4..8 carries up to 2**-9 of error into the exponent),
# the native fp16 exp2, each lane's running sum of 128 terms, the reciprocal and the product. Emulated
# on this card's data it stays inside the fp16 reduction row of the table (its atol of 1e-5 is ~10 ulp
# of a typical output of 2.4e-4) but errs 4-6x more than eager against a float64 reference (max abs and
# RMS) and up to 10 ulp where eager errs 0.5: the rule against eager's own error must reject it.
SOFTMAX_ALL_FP16 = Adversary("fp16 softmax computed entirely in fp16", "mismatch", HEADER + r'''
extern "C" __global__ void softmax_h(const __half* __restrict__ x, __half* __restrict__ y, int rows, int cols) {
  int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= rows) return;
  const __half* p = x + (long long)row * cols;
  __half* q = y + (long long)row * cols;
  const __half log2e = __float2half(1.4426950408889634f);
  __half m = __ushort_as_half((unsigned short)0xfc00);  // -inf
  for (int c = lane; c < cols; c += 32) m = __hmax(m, p[c]);
  for (int o = 16; o; o >>= 1) m = __hmax(m, __shfl_xor_sync(0xffffffffu, m, o));
  __half s = __float2half(0.f);
  for (int c = lane; c < cols; c += 32) s = __hadd(s, hexp2(__hmul(__hsub(p[c], m), log2e)));
  for (int o = 16; o; o >>= 1) s = __hadd(s, __shfl_xor_sync(0xffffffffu, s, o));
  __half inv = hrcp(s);
  for (int c = lane; c < cols; c += 32) q[c] = __hmul(hexp2(__hmul(__hsub(p[c], m), log2e)), inv);
}
''', SOFTMAX_SPEC.format(kernel="softmax_h", grid='"ceil_div(self.shape[0], 8)"'), card="softmax16", cls=8)

# fp32 throughout, rounded to fp16 once, as eager does; fmaxf ignores a NaN but the NaN's exp then makes
# the sum (and the whole row) NaN, which is where eager's NaNs are too.
CORRECT_SOFTMAX16 = Adversary("correct fp16 softmax (fp32 accumulation)", None, HEADER + r'''
__device__ __forceinline__ float block_all(float v, bool take_max, float* sh) {
  for (int o = 16; o; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = take_max ? fmaxf(v, w) : v + w;
  }
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = sh[0];
  for (int k = 1; k < 8; ++k) r = take_max ? fmaxf(r, sh[k]) : r + sh[k];
  __syncthreads();  // sh is reused by the next reduction
  return r;
}

extern "C" __global__ void __launch_bounds__(256)
softmax_f32(const __half* __restrict__ x, __half* __restrict__ y, int rows, int cols) {
  __shared__ float sh[8];
  const __half* p = x + (long long)blockIdx.x * cols;
  __half* q = y + (long long)blockIdx.x * cols;
  float m = __int_as_float(0xff800000);  // -inf
  for (int c = threadIdx.x; c < cols; c += 256) m = fmaxf(m, __half2float(p[c]));
  m = block_all(m, true, sh);
  float s = 0.f;
  for (int c = threadIdx.x; c < cols; c += 256) s += expf(__half2float(p[c]) - m);
  s = block_all(s, false, sh);
  for (int c = threadIdx.x; c < cols; c += 256) q[c] = __float2half_rn(expf(__half2float(p[c]) - m) / s);
}
''', SOFTMAX_SPEC.format(kernel="softmax_f32", grid='"self.shape[0]"'), card="softmax16", cls=8)

# ---- 13. lower precision only when timed -----------------------------------------------------------------

# Verification sees the fp32-accumulating path; once the burst detector fires it switches to the all-fp16
# arithmetic of SOFTMAX_ALL_FP16 (warp 0 of each row's block). That stays inside the fp16 row of the tolerance
# table, which was all a timed call's audit held it to; the audits now also run the precision check (on a
# spread-out sample of them): `mismatch` (a precision failure on a timed call's values; `cheating` where an audit's
# tolerance check sees it first).
SOFTMAX_FP16_WHEN_TIMED = Adversary("fp16 softmax that drops to fp16 arithmetic once timed", ("mismatch", "cheating"),
                                    HEADER + BURST_DETECTOR + r"""
__device__ __forceinline__ float block_all(float v, bool take_max, float* sh) {
  for (int o = 16; o; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = take_max ? fmaxf(v, w) : v + w;
  }
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = sh[0];
  for (int k = 1; k < 8; ++k) r = take_max ? fmaxf(r, sh[k]) : r + sh[k];
  __syncthreads();
  return r;
}

extern "C" __global__ void __launch_bounds__(256)
softmax_switch(const __half* __restrict__ x, __half* __restrict__ y, int rows, int cols) {
  __shared__ float sh[8];
  const __half* p = x + (long long)blockIdx.x * cols;
  __half* q = y + (long long)blockIdx.x * cols;
  if (burst) {   // the whole grid agrees: clock_in ran first
    if (threadIdx.x >= 32) return;
    int lane = threadIdx.x;
    const __half log2e = __float2half(1.4426950408889634f);
    __half m = __ushort_as_half((unsigned short)0xfc00);
    for (int c = lane; c < cols; c += 32) m = __hmax(m, p[c]);
    for (int o = 16; o; o >>= 1) m = __hmax(m, __shfl_xor_sync(0xffffffffu, m, o));
    __half s = __float2half(0.f);
    for (int c = lane; c < cols; c += 32) s = __hadd(s, hexp2(__hmul(__hsub(p[c], m), log2e)));
    for (int o = 16; o; o >>= 1) s = __hadd(s, __shfl_xor_sync(0xffffffffu, s, o));
    __half inv = hrcp(s);
    for (int c = lane; c < cols; c += 32) q[c] = __hmul(hexp2(__hmul(__hsub(p[c], m), log2e)), inv);
    return;
  }
  float m = __int_as_float(0xff800000);
  for (int c = threadIdx.x; c < cols; c += 256) m = fmaxf(m, __half2float(p[c]));
  m = block_all(m, true, sh);
  float s = 0.f;
  for (int c = threadIdx.x; c < cols; c += 256) s += expf(__half2float(p[c]) - m);
  s = block_all(s, false, sh);
  for (int c = threadIdx.x; c < cols; c += 256) q[c] = __float2half_rn(expf(__half2float(p[c]) - m) / s);
}
""", with_clock(SOFTMAX_SPEC.format(kernel="softmax_switch", grid='"self.shape[0]"')), card="softmax16", cls=13)

# ---- 9. launch specs sized to exhaust the GPU -------------------------------------------------------

WORKSPACE_SPEC = """
[[workspace]]
name = "scratch"
bytes = {bytes}

[[launch]]
kernel = "k"
grid = ["ceil_div(self.numel, 256)"]
block = [256]
args = [{{ ptr = "self" }}, {{ ptr = "other" }}, {{ ptr = "out0" }}, {{ i64 = "self.numel" }}, {{ ptr = "ws.scratch" }}]
"""
ADD_WITH_SCRATCH = HEADER + r'''
extern "C" __global__ void k(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out,
                             long long n, unsigned char* __restrict__ scratch) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
  if (i == 0) scratch[0] = 1;  // touches the first byte only: the rest is there to be allocated
}
'''
# Allocating it fails (or, lazily mapped elsewhere, takes the GPU's memory from everyone else).
WORKSPACE_2_62 = Adversary("asks for a 2**62-byte workspace", "launch", ADD_WITH_SCRATCH,
                           WORKSPACE_SPEC.format(bytes="4611686018427387904"), cls=9)
# 1 GiB fits on the GPU, but it is 21 times this 48 MiB card, past max(256 MiB, 16 x card).
WORKSPACE_1_GIB = Adversary("asks for a workspace of 256 bytes per element (1 GiB)", "launch", ADD_WITH_SCRATCH,
                            WORKSPACE_SPEC.format(bytes='"self.numel * 256"'), cls=9)
# Within every per-dimension limit of the driver: 2**31-1 x 65535 blocks of 1024 threads (1.4e17
# threads), each of which returns at once; launched, it would run for years.
ASTRONOMICAL_GRID = add_kernel(
    "launches an astronomical grid of early-exiting blocks",
    "  i = ((long long)blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;\n"
    "  if (i < n) out[i] = a[i] + b[i];", "launch", cls=9, spec="""
[[launch]]
kernel = "k"
grid = [2147483647, 65535]
block = [1024]
args = [{ ptr = "self" }, { ptr = "other" }, { ptr = "out0" }, { i64 = "self.numel" }]
""")

# ---- 10. a GEMM's bytes without its FLOPs ---------------------------------------------------------

GEMM_TILE = r'''
#include <cuda_bf16.h>
// C[M,N] = A[M,K] @ B[K,N], row-major bf16, fp32 accumulation in K order. A 64x64 tile per block of
// 256 threads, each thread a 4x4 micro-tile (rows ty + 16 i, columns tx + 16 j); K in steps of 16
// through shared memory, held as float.
#define BM 64
#define BN 64
#define BK 16
__device__ __forceinline__ void tiled_gemm(const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ B,
                                           __nv_bfloat16* __restrict__ C, int M, int N, int K) {
  __shared__ float As[BK][BM + 4];
  __shared__ float Bs[BK][BN + 4];
  int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
  float acc[4][4];
  #pragma unroll
  for (int i = 0; i < 4; ++i)
    #pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int e = threadIdx.x; e < BM * BK; e += 256) {
      int m = e / BK, kk = e % BK, gr = row0 + m, gk = k0 + kk;
      As[kk][m] = gr < M && gk < K ? __bfloat162float(A[(long long)gr * K + gk]) : 0.f;
    }
    for (int e = threadIdx.x; e < BK * BN; e += 256) {
      int kk = e / BN, nn = e % BN, gk = k0 + kk, gc = col0 + nn;
      Bs[kk][nn] = gk < K && gc < N ? __bfloat162float(B[(long long)gk * N + gc]) : 0.f;
    }
    __syncthreads();
    #pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float a[4], b[4];
      #pragma unroll
      for (int i = 0; i < 4; ++i) { a[i] = As[kk][ty + 16 * i]; b[i] = Bs[kk][tx + 16 * i]; }
      #pragma unroll
      for (int i = 0; i < 4; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
  #pragma unroll
  for (int i = 0; i < 4; ++i)
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
      int r = row0 + ty + 16 * i, c = col0 + tx + 16 * j;
      if (r < M && c < N) C[(long long)r * N + c] = __float2bfloat16_rn(acc[i][j]);
    }
}
'''

MM_SPEC = """
[[launch]]
kernel = "{kernel}"
grid = ["ceil_div(mat2.shape[1], 64)", "ceil_div(self.shape[0], 64)"]
block = [256]
args = [{{ ptr = "self" }}, {{ ptr = "mat2" }}, {{ ptr = "out0" }}, {{ i32 = "self.shape[0]" }},
        {{ i32 = "mat2.shape[1]" }}, {{ i32 = "self.shape[1]" }}]
"""

CORRECT_MM = Adversary("correct bf16 GEMM (simple tiles, fp32 accumulation)", None, GEMM_TILE + r'''
extern "C" __global__ void __launch_bounds__(256)
gemm_bf16(const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ B, __nv_bfloat16* __restrict__ C,
          int M, int N, int K) {
  tiled_gemm(A, B, C, M, N, K);
}
''', MM_SPEC.format(kernel="gemm_bf16"), card="mm_bf16", cls=10)

# Correct (slowly) for its first 40 calls, as the add card's "skips the work once verification is over";
# a one-thread first launch counts calls, so all blocks of a call agree. Afterwards it streams A and B
# once (16-byte loads, folded into a checksum so the loads stay) and writes C from it: 136 MiB, ~35 µs
# on an H200, above the memory floor (~29 µs) but far below the 2*M*N*K = 1.4e11 FLOPs at ~990 TFLOP/s
# (~140 µs). The compute floor is checked before the audit: `suspicious`; an audited timed call that falls after
# its 40th call stops the timing first (`cheating`; on an H100 at 4a5f077, timed call 3).
MM_BYTES_NO_FLOPS = Adversary("bf16 GEMM that stops doing the FLOPs after 40 calls", ("suspicious", "cheating"),
                              GEMM_TILE + r'''
__device__ unsigned int calls;
extern "C" __global__ void count_call() { calls += 1; }

extern "C" __global__ void __launch_bounds__(256)
gemm_bf16(const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ B, __nv_bfloat16* __restrict__ C,
          int M, int N, int K) {
  if (calls <= 40) { tiled_gemm(A, B, C, M, N, K); return; }
  long long tid = ((long long)blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
  long long nthreads = (long long)gridDim.x * gridDim.y * blockDim.x;
  unsigned int h = 0;
  const uint4* a4 = (const uint4*)A;
  const uint4* b4 = (const uint4*)B;
  for (long long i = tid; i < (long long)M * K / 8; i += nthreads) { uint4 v = a4[i]; h ^= v.x ^ v.y ^ v.z ^ v.w; }
  for (long long i = tid; i < (long long)K * N / 8; i += nthreads) { uint4 v = b4[i]; h ^= v.x ^ v.y ^ v.z ^ v.w; }
  unsigned int word = (h & 0x3f7f3f7fu);  // two finite bf16 values
  uint4* c4 = (uint4*)C;
  for (long long i = tid; i < (long long)M * N / 8; i += nthreads) c4[i] = make_uint4(word, word, word, word);
}
''', """
[[launch]]
kernel = "count_call"
grid = [1]
block = [1]
args = []
""" + MM_SPEC.format(kernel="gemm_bf16"), card="mm_bf16", cls=10)

# ---- 11. reads a workspace it never asked zeroed ---------------------------------------------------------

# Adds into its workspace (`tmp[i] += ...`) as if it started at zero. Fresh device memory often reads zeros,
# so it passed; in a model the allocator hands back blocks holding earlier sums. Workspaces not marked
# `zero` are poisoned before every checked or timed call, unlike between runs: NaN, then another pattern.
ACCUMULATES_INTO_UNZEROED_WORKSPACE = Adversary(
    "adds into a workspace it never zeroed", ("nan", "mismatch", "nondeterminism"), HEADER + r'''
extern "C" __global__ void acc(const float* __restrict__ a, const float* __restrict__ b,
                               float* __restrict__ tmp, float* __restrict__ out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  tmp[i] += a[i] + b[i];   // assumes tmp starts at 0.f
  out[i] = tmp[i];
}
''', """
[[workspace]]
name = "tmp"
bytes = "self.numel * 4"

[[launch]]
kernel = "acc"
grid = ["ceil_div(self.numel, 256)"]
block = [256]
args = [{ ptr = "self" }, { ptr = "other" }, { ptr = "ws.tmp" }, { ptr = "out0" }, { i64 = "self.numel" }]
""", cls=11)

# ---- 15. honest only where its workspace looks poisoned ---------------------------------------------

# The lane's workspaces held 0xFF (NaN) or random bytes, whose floats are mostly huge, tiny or not finite; a
# model's hold an earlier tensor's values. This kernel reads 32 floats of a workspace it never writes and skips
# the second half of the output where at least 24 look like values (a model: half the work, a wrong answer).
# Since 2026-12-06h a call whose outputs hold stale answers finds the workspace holding the first one's bytes,
# and every check has such calls (`cheating`, or `mismatch` in an audit of a timed call).
HONEST_WHEN_POISONED = Adversary("computes only half where its workspace holds values, not poison",
                                 ("cheating", "mismatch"), HEADER + r"""
extern "C" __global__ void half_in_models(const float* __restrict__ a, const float* __restrict__ b,
                                          float* __restrict__ out, long long n, const float* __restrict__ ws) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int plausible = 0;
  #pragma unroll
  for (int k = 0; k < 32; ++k) {
    float v = fabsf(ws[k]);
    plausible += (v > 1e-6f && v < 1e6f) ? 1 : 0;
  }
  if (plausible >= 24 && i >= n / 2) return;
  out[i] = a[i] + b[i];
}
""", """
[[workspace]]
name = "probe"
bytes = "128"

[[launch]]
kernel = "half_in_models"
grid = ["ceil_div(self.numel, 256)"]
block = [256]
args = [{ ptr = "self" }, { ptr = "other" }, { ptr = "out0" }, { i64 = "self.numel" }, { ptr = "ws.probe" }]
""", cls=15)

# The same tell read beside an input: the lane's guard bands were uniform random bytes, a model's neighbouring
# memory another tensor's values. Since 2026-12-06h most canary sides hold normal values as float32, bfloat16
# or float16, so the kernel skips half its output in most verification runs.
HONEST_BESIDE_NOISE = Adversary("computes only half where the memory before its input holds values, not noise",
                                ("nan", "mismatch", "cheating"), HEADER + r"""
extern "C" __global__ void half_beside_values(const float* __restrict__ a, const float* __restrict__ b,
                                              float* __restrict__ out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int plausible = 0;
  #pragma unroll
  for (int k = 1; k <= 32; ++k) {
    float v = fabsf(a[-k]);
    plausible += (v > 1e-6f && v < 1e6f) ? 1 : 0;
  }
  if (plausible >= 24 && i >= n / 2) return;
  out[i] = a[i] + b[i];
}
""", ADD_SPEC.format(kernel="half_beside_values"), cls=15)

# ---- 14. a statistic that loses digits under an offset ------------------------------------------------

# A one-pass variance (sum of x and of x^2 in one sweep, var = (S2 - S1^2/n) / (n-1)) reads the row once where a
# two-pass one reads it twice: the faster kernel. On rows centred near zero, as the samples and every set drawn
# from them are (fresh draws keep their mean and std, the 'large' set scales the mean with the spread), its float32
# error is ~1e-7 and it passed; on rows that sit on an offset of 16 standard deviations it errs by ~1e-3 (and by
# 100 % at 1000), as in a model whose activations are not centred. The 'shifted' edge set catches it (mismatch).
VAR_SPEC = """
[[launch]]
kernel = "{kernel}"
grid = ["self.shape[0]"]
block = [256]
args = [{{ ptr = "self" }}, {{ ptr = "out0" }}, {{ i32 = "self.shape[1]" }}]
"""
VAR_KERNELS = r'''
#include <cub/block/block_reduce.cuh>
using Reduce = cub::BlockReduce<float, 256>;

extern "C" __global__ void var_two_pass(const float* __restrict__ x, float* __restrict__ out, int cols) {
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ float mean;
  const float* row = x + (long long)blockIdx.x * cols;
  float s = 0.f;
  for (int c = threadIdx.x; c < cols; c += 256) s += row[c];
  float total = Reduce(tmp).Sum(s);
  if (threadIdx.x == 0) mean = total / cols;
  __syncthreads();
  float m = mean, q = 0.f;
  for (int c = threadIdx.x; c < cols; c += 256) { float d = row[c] - m; q += d * d; }
  float sq = Reduce(tmp).Sum(q);
  if (threadIdx.x == 0) out[blockIdx.x] = sq / (cols - 1);
}

extern "C" __global__ void var_one_pass(const float* __restrict__ x, float* __restrict__ out, int cols) {
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ float s1;
  const float* row = x + (long long)blockIdx.x * cols;
  float s = 0.f, q = 0.f;
  for (int c = threadIdx.x; c < cols; c += 256) { float v = row[c]; s += v; q += v * v; }
  float t1 = Reduce(tmp).Sum(s);
  if (threadIdx.x == 0) s1 = t1;
  __syncthreads();
  float t2 = Reduce(tmp).Sum(q);
  if (threadIdx.x == 0) out[blockIdx.x] = (t2 - s1 * s1 / cols) / (cols - 1);
}
'''
CORRECT_VAR = Adversary("correct row variance (two-pass)", None, HEADER + VAR_KERNELS,
                        VAR_SPEC.format(kernel="var_two_pass"), card="var")
VAR_ONE_PASS = Adversary("row variance in one pass (E[x^2] - E[x]^2 in float32)", "mismatch", HEADER + VAR_KERNELS,
                         VAR_SPEC.format(kernel="var_one_pass"), card="var", cls=14)

# Since 2026-12-06g a module that writes a module-scope variable (or hands its address on) or reads a clock,
# %globaltimer or its shared-memory size does not compile (engine.compile.diagnostics.forbidden_state): the cheats
# that kept state from call to call (memos, call counters, burst detectors) are refused there, before any lane.
# Their sources stay what the lane once had to catch; the race of class 7 sleeps instead of reading the clock.
KEEPS_STATE = frozenset({
    "caches results across calls keyed by pointer",
    "skips the work once verification is over (beats the roofline)",
    "memoises on a fingerprint of a few input elements",
    "complex mul that memoises on a fingerprint of its inputs",
    "detects the timing burst and skips the last 1/16 of the output",
    "detects the timing burst and returns at once",
    "rewrites the index tensor while timed so eager's atomics contend",
    "row sum whose contention race hides behind a memo of its inputs",
    "fp16 softmax that drops to fp16 arithmetic once timed",
    "bf16 GEMM that stops doing the FLOPs after 40 calls",
})


def _refused_at_compile(a: Adversary) -> Adversary:
    return replace(a, expect="compile", honest=None) if a.name in KEEPS_STATE else a


ADVERSARIES = [
    *ORIGINAL,
    SKIPS_FILLED_OUTPUT,
    FINGERPRINT_MEMO,
    WORKSPACE_MEMO,
    WORKSPACE_MEMO_UNLESS_NAN,
    CORRECT_CMUL,
    CMUL_MEMO,
    BURST_SKIPS_TAIL,
    BURST_SKIPS_ALL,
    CORRECT_INDEX_ADD,
    INDEX_REWRITE,
    CORRECT_RELU,
    RELU_FMAXF,
    ADD_FLUSHES_NAN,
    SUM_SKIPS_NAN,
    WRITES_PAST_OUTPUT,
    WRITES_BEFORE_OUTPUT,
    WRITES_PAST_INPUT,
    WRITES_PAST_WORKSPACE,
    RACE_NEEDS_CONTENTION,
    MEMO_HIDES_RACE,
    SOFTMAX_ALL_FP16,
    CORRECT_SOFTMAX16,
    SOFTMAX_FP16_WHEN_TIMED,
    WORKSPACE_2_62,
    WORKSPACE_1_GIB,
    ASTRONOMICAL_GRID,
    CORRECT_MM,
    MM_BYTES_NO_FLOPS,
    ACCUMULATES_INTO_UNZEROED_WORKSPACE,
    HONEST_WHEN_POISONED,
    HONEST_BESIDE_NOISE,
    CORRECT_VAR,
    VAR_ONE_PASS,
]
ADVERSARIES = [_refused_at_compile(a) for a in ADVERSARIES]
assert {a.name for a in ADVERSARIES} >= KEEPS_STATE
