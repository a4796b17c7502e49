// aten::gelu(self, approximate='tanh') on a contiguous bf16 tensor: 8 values (16 bytes) per thread,
// computed in fp32 with the same formula as eager, rounded once to bf16.
#include <cuda_bf16.h>
__device__ __forceinline__ float gelu_tanh(float x) {
  const float k0 = 0.7978845608028654f, k1 = 0.044715f;
  return 0.5f * x * (1.f + tanhf(k0 * (x + k1 * x * x * x)));
}
extern "C" __global__ void gelu8(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y,
                                 long long n8, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n8) {
    uint4 v = reinterpret_cast<const uint4*>(x)[i];
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
    #pragma unroll
    for (int k = 0; k < 4; ++k) {
      float2 f = __bfloat1622float2(h[k]);
      h[k] = __floats2bfloat162_rn(gelu_tanh(f.x), gelu_tanh(f.y));
    }
    reinterpret_cast<uint4*>(y)[i] = v;
  }
  long long tail = n8 * 8 + i;
  if (i < 8 && tail < n) y[tail] = __float2bfloat16(gelu_tanh(__bfloat162float(x[tail])));
}
