// aten::mean.dim(self [N,C,H,W] contiguous fp16, dim=[-1,-2], keepdim=True): one warp per (n, c) plane,
// fp32 accumulation like eager, result rounded once to fp16.
#include <cuda_fp16.h>
extern "C" __global__ void plane_mean(const __half* __restrict__ x, __half* __restrict__ out,
                                      long long planes, int hw) {
  long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  if (warp >= planes) return;
  const __half* p = x + warp * hw;
  float acc = 0.f;
  for (int k = lane; k < hw; k += 32) acc += __half2float(p[k]);
  #pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) out[warp] = __float2half(acc / hw);
}
