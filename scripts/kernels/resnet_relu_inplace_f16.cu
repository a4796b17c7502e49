// aten::relu_ on a contiguous fp16 tensor, in place: 8 halves (16 bytes) per thread.
#include <cuda_fp16.h>
extern "C" __global__ void relu8(__half* __restrict__ x, long long n8, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n8) {
    uint4 v = reinterpret_cast<uint4*>(x)[i];
    __half2* h = reinterpret_cast<__half2*>(&v);
    const __half2 z = __float2half2_rn(0.f);
    #pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = __hmax2(h[k], z);
    reinterpret_cast<uint4*>(x)[i] = v;
  }
  long long tail = n8 * 8 + i;  // leftovers when numel is not a multiple of 8
  if (i < 8 && tail < n) x[tail] = __hmax(x[tail], __float2half(0.f));
}
