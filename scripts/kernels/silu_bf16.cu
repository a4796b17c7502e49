// aten::silu on a contiguous bf16 tensor: x * sigmoid(x) computed in fp32, one rounding at the end.
#include <cuda_bf16.h>
extern "C" __global__ void silu(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y, long long n) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float v = __bfloat162float(x[i]);
    y[i] = __float2bfloat16(v / (1.f + __expf(-v)));
  }
}
