"""The adversarial suite: candidates that each try one known cheat or fault, with the category the lane
must reject them with, plus correct candidates that must be accepted.

Most target the card `aten::add.Tensor` on two float32 vectors of N elements (alpha=1); the race targets
`aten::sum.dim_IntList` over rows. Specs are TOML as an agent would write them.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Adversary:
    name: str
    expect: str | None  # category, or None when the candidate must be verified
    source: str
    spec: str
    card: str = "add"


HEADER = '#include <cuda_fp16.h>\n'

ADD_SPEC = """
[[launch]]
kernel = "{kernel}"
grid = ["ceil_div(self.numel, 256)"]
block = [256]
args = [{{ ptr = "self" }}, {{ ptr = "other" }}, {{ ptr = "out0" }}, {{ i64 = "self.numel" }}]
"""


def add_kernel(name: str, body: str, expect: str | None, *, kernel: str = "k", spec: str | None = None,
               prelude: str = "") -> Adversary:
    src = (HEADER + prelude + f'extern "C" __global__ void {kernel}(const float* __restrict__ a, '
           f"const float* __restrict__ b, float* __restrict__ out, long long n) {{\n"
           f"  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n{body}\n}}\n")
    return Adversary(name, expect, src, spec or ADD_SPEC.format(kernel=kernel))


CORRECT_ADD = add_kernel("correct", "  if (i < n) out[i] = a[i] + b[i];", None)

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

ADVERSARIES = [
    CORRECT_ADD,
    CORRECT_ADD_VEC4,
    add_kernel("writes only part of the output", "  if (i < n / 2) out[i] = a[i] + b[i];", "nan"),
    add_kernel("leaves the NaN prefill (does nothing)", "  (void)a; (void)b; (void)out; (void)n;", "nan"),
    add_kernel("returns an input buffer (computes in place into self)",
               "  if (i < n) { a[i] = a[i] + b[i]; out[i] = a[i]; }",
               "mutation"),
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
    Adversary("skips the work once verification is over (beats the roofline)", "suspicious", HEADER + r'''
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
''', """
[[launch]]
kernel = "racy_sum"
grid = ["self.shape[0]"]
block = [256]
args = [{ ptr = "self" }, { ptr = "out0" }, { i32 = "self.shape[1]" }]
""", card="sum"),
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
''', """
[[launch]]
kernel = "row_sum"
grid = ["self.shape[0]"]
block = [256]
args = [{ ptr = "self" }, { ptr = "out0" }, { i32 = "self.shape[1]" }]
""", card="sum"),
]

# The 'returns an input buffer' kernel writes into `a`, so it needs a non-const first parameter.
ADVERSARIES[4] = Adversary(
    ADVERSARIES[4].name, "mutation",
    ADVERSARIES[4].source.replace("const float* __restrict__ a", "float* __restrict__ a"), ADVERSARIES[4].spec)
