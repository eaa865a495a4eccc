/* tests/cuda_math/div.cu: tgm_math.h's CUDA f32 division (div.full.f32)
 * against the IEEE quotient (__fdiv_rn) on the GPU: 2^26 random bit
 * patterns of each operand (every exponent, subnormals, infinities, NaN)
 * and every pair of special values. Prints the largest error in ulps of
 * the IEEE quotient, separately for normal quotients with normal operands
 * and for the rest, and every pair whose class (NaN, inf, zero, finite)
 * differs. Exit 1 when a normal quotient is off by more than 2 ulps or a
 * class differs. GPU machine only:
 *   nvcc -arch=sm_90 -O3 -I templates/runtime tests/cuda_math/div.cu -o div && ./div */
#include "tgm_math.h"
#include <cstdio>
#include <cstdint>
#include <cmath>

__device__ unsigned long long g_max_normal, g_max_other, g_bad_class;
__device__ unsigned g_first_bad[4];

__device__ uint32_t mix(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
  return (uint32_t)x;
}
__device__ int cls(float f) { return isnan(f) ? 0 : isinf(f) ? 1 : f == 0.0f ? 2 : 3; }
__device__ long long ord(float f) { /* ordered integer: consecutive floats differ by 1 */
  int32_t i = __float_as_int(f);
  return i < 0 ? -(long long)(i & 0x7fffffff) : (long long)i;
}
__device__ void check(float a, float b) {
  float q = tgm_div(a, b), e = __fdiv_rn(a, b);
  if (cls(q) != cls(e)) {
    if (atomicAdd(&g_bad_class, 1ULL) == 0)
      g_first_bad[0] = __float_as_uint(a), g_first_bad[1] = __float_as_uint(b), g_first_bad[2] = __float_as_uint(q),
      g_first_bad[3] = __float_as_uint(e);
    return;
  }
  if (cls(e) != 3)
    return;
  long long d = ord(q) - ord(e);
  unsigned long long u = d < 0 ? -d : d;
  bool normal = fabsf(e) >= 1.17549435e-38f && fabsf(a) >= 1.17549435e-38f && fabsf(b) >= 1.17549435e-38f;
  atomicMax(normal ? &g_max_normal : &g_max_other, u);
}
__global__ void random_pairs(uint64_t n, uint64_t seed) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
    check(__uint_as_float(mix(2 * i + seed)), __uint_as_float(mix(2 * i + 1 + seed)));
}
__global__ void special_pairs() {
  const float s[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1.0f, -1.0f, 3.0f, 1e-45f, -1e-45f, 1e-40f,
                     1.17549435e-38f, 3.40282347e38f, -3.40282347e38f, 2e38f, 9e37f, 1e-30f, 7.0e10f};
  const int n = sizeof s / sizeof s[0];
  int i = threadIdx.x / n, j = threadIdx.x % n;
  if (i < n)
    check(s[i], s[j]);
}
int main() {
  random_pairs<<<1024, 256>>>(1ULL << 26, 1);
  random_pairs<<<1024, 256>>>(1ULL << 26, 0x9e3779b97f4a7c15ULL);
  special_pairs<<<1, 1024>>>();
  if (cudaDeviceSynchronize() != cudaSuccess) {
    printf("CUDA error\n");
    return 2;
  }
  unsigned long long mn, mo, bc;
  unsigned fb[4];
  cudaMemcpyFromSymbol(&mn, g_max_normal, sizeof mn);
  cudaMemcpyFromSymbol(&mo, g_max_other, sizeof mo);
  cudaMemcpyFromSymbol(&bc, g_bad_class, sizeof bc);
  cudaMemcpyFromSymbol(fb, g_first_bad, sizeof fb);
  printf("tgm_div vs IEEE: max %llu ulp (normal operands and quotient), %llu ulp (subnormal operand or quotient), "
         "%llu pairs of another class\n", mn, mo, bc);
  if (bc)
    printf("first: bits %08x / %08x = %08x, IEEE %08x\n", fb[0], fb[1], fb[2], fb[3]);
  return mn > 2 || bc ? 1 : 0;
}
