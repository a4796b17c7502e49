// aten::silu on a contiguous f32 tensor: x * sigmoid(x) computed in fp32, one rounding at the end.

extern "C" __global__ void silu(const float* __restrict__ x, float* __restrict__ y, long long n) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float v = x[i];
    y[i] = v / (1.f + expf(-v));
  }
}
