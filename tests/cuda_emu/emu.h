/* emu.h: just enough of CUDA to run generated kernels on the CPU: one
 * std::thread per CUDA thread of a block, blocks one after another (in
 * blockIdx order), barriers for __syncthreads and the warp shuffles. */
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
#include <algorithm>
#include <map>
#include <mutex>
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
static std::barrier<> *blk_bar;
static std::vector<std::unique_ptr<std::barrier<>>> warp_bar;
static float xch[32][32];
#define __CUDACC__ 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
static void __syncthreads() { blk_bar->arrive_and_wait(); }
static void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
/* the lanes named in mask meet: the whole warp, or a group of lanes that
 * reduces on its own (short rows, several a warp), which may leave the loop
 * over rows before the warp's other groups do */
static std::mutex grp_mu;
static std::map<std::pair<unsigned, unsigned>, std::unique_ptr<std::barrier<>>> grp_bar;
static std::barrier<> &lanes_bar(unsigned w, unsigned mask) {
  if (mask == 0xffffffffu)
    return *warp_bar[w];
  std::lock_guard<std::mutex> g(grp_mu);
  auto &b = grp_bar[{w, mask}];
  if (!b)
    b.reset(new std::barrier<>(__builtin_popcount(mask)));
  return *b;
}
static float __shfl_xor_sync(unsigned mask, float v, int m) {
  unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
  std::barrier<> &bar = lanes_bar(w, mask);
  xch[w][l] = v;
  bar.arrive_and_wait();
  float r = xch[w][l ^ m];
  bar.arrive_and_wait();
  return r;
}
static float __ldcg(const float *p) { return *p; }
struct alignas(16) float4 { float x, y, z, w; };
static float4 __ldcg(const float4 *p) { return *p; }
/* CUDA's fast exp (glibc declares the name and exports none) */
extern "C" float __expf(float x) noexcept { return expf(x); }
/* cuda_fp16.h and cuda_bf16.h: the conversions tgm_math.h uses, in software */
#define __CUDA_FP16_H__
#define __CUDA_BF16_H__
struct __half { uint16_t x; };
struct __nv_bfloat16 { uint16_t x; };
static __half __ushort_as_half(uint16_t h) { return {h}; }
static uint16_t __half_as_ushort(__half h) { return h.x; }
static float __half2float(__half h) { _Float16 f; memcpy(&f, &h.x, 2); return (float)f; }
static __half __float2half_rn(float f) { _Float16 h = (_Float16)f; __half r; memcpy(&r.x, &h, 2); return r; }
static __nv_bfloat16 __ushort_as_bfloat16(uint16_t h) { return {h}; }
static uint16_t __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
static float __bfloat162float(__nv_bfloat16 h) { uint32_t u = (uint32_t)h.x << 16; float f; memcpy(&f, &u, 4); return f; }
static __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {(uint16_t)((u >> 16) | 0x40u)};
  return {(uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
static float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static unsigned atomicAdd(unsigned *p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
static unsigned long long atomicMin(unsigned long long *p, unsigned long long v) {
  std::atomic_ref<unsigned long long> a(*p);
  unsigned long long o = a.load();
  while (v < o && !a.compare_exchange_weak(o, v)) {}
  return o;
}
template <typename K, typename... A> static void launch(dim3 g, dim3 b, K k, A... args) {
  gridDim = g, blockDim = b;
  for (unsigned by = 0; by < g.y; by++)
    for (unsigned bx = 0; bx < g.x; bx++) {
      std::barrier<> bar(b.x);
      blk_bar = &bar;
      warp_bar.clear();
      grp_bar.clear();
      for (unsigned w = 0; w < (b.x + 31) / 32; w++)
        warp_bar.emplace_back(new std::barrier<>(32));
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < b.x; t++)
        ts.emplace_back([=] { threadIdx = dim3(t); blockIdx = dim3(bx, by); k(args...); });
      for (auto &t : ts) t.join();
    }
}
