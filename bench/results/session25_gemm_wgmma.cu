// Session 25's GEMMs of tgen's own on Hopper's wgmma with tgm_gemm's epilogue (bias, activation, residual) in
// their store, for what cuBLASLt cannot fuse (issue 9's ln -> linear -> gelu -> +x at 16384 x 512 x 512 f16:
// cuBLASLt's product with BIAS 20.5 us, then k_gemm_epilogue 19-20 us). Measured on the H100, not kept: none
// beats the old path (bench/results/h100_gpu_session25.txt). Kept here as the starting point of a next try.
//   k_gemm_h: 128 x 128 blocks of two warpgroups (m64n128k16, both operands in shared memory), 3 stages 2
//     ahead, 2 blocks an SM, the epilogue staged through shared memory for 16-byte residual loads and stores:
//     LLGR 41.4 us (old 40.5), the product alone 21.7 (cuBLASLt 17.5).
//   k_gemm_p: persistent, two warpgroups a block each owning 64 x 128 tiles and a 4-stage ring, handing the
//     tensor cores to each other by named barriers (CUTLASS's ping-pong): 57.6 us, the product 43.4: one
//     warpgroup's m64n128 products at a time do not keep the tensor cores busy.
//   k_gemm_w: persistent, two warpgroups run the products of 128 x 128 tiles into a staging tile, two more
//     run the epilogue from it: 39.2-40.5 us, the product 26.3: the products slower than k_gemm_h's four
//     warpgroups an SM, and two epilogue warpgroups cannot hide erf's arithmetic.
// All three give the old path's bits (the same rounding points: tgm_rt.h). What was learnt: the erf gelu costs
// ~7 us of ALU at this shape (session25_epilogue_bench.cu: 14.8 us with it, 7.7-8 without, L2-warm), which only
// overlapping it with another tile's products would hide, and that needs a mainloop at cuBLASLt's rate first
// (TMA, a producer warp, 128 x 256 tiles: the next step, not taken here).
// Build (device): nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -o /tmp/gemm \
//   bench/results/session25_gemm_wgmma.cu tgm_cpu.o -Xcompiler -fopenmp -lcublas -lcublasLt
#include "../../templates/runtime/tgm_cuda.cu"
#include "../../templates/runtime/tgm_init.c"
#include <cstdio>
#include <vector>
#include <algorithm>

namespace gh {
constexpr int kBM = 128, kBN = 128, kBK = 64, kStages = 3, kAhead = 2, kLdS = kBN + 8;
constexpr int kTileA = kBM * kBK, kTileB = kBN * kBK; /* elements a stage */
constexpr size_t kSmem = (size_t)kStages * (kTileA + kTileB) * 2 + 1024;
static_assert((size_t)kBM * kLdS * 2 <= (size_t)kStages * (kTileA + kTileB) * 2, "the staged outputs fit the stages");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GH_D64                                                                                                         \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),          \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),           \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),          \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),          \
      "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),          \
      "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),          \
      "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),          \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define GH_MMA(TY)                                                                                                     \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " "                \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "   \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "    \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
__device__ __forceinline__ void mma(float (&d)[64], uint64_t a, uint64_t b, int acc, bf16) {
  asm volatile(GH_MMA("bf16") : GH_D64 : "l"(a), "l"(b), "r"(acc));
}
__device__ __forceinline__ void mma(float (&d)[64], uint64_t a, uint64_t b, int acc, f16) {
  asm volatile(GH_MMA("f16") : GH_D64 : "l"(a), "l"(b), "r"(acc));
}
#undef GH_MMA
#undef GH_D64
__device__ __forceinline__ void hold(float (&x)[64]) {
#pragma unroll
  for (int i = 0; i < 64; i++)
    asm volatile("" : "+f"(x[i])::"memory");
}
/* rows r0.. of a [128, 64] tile of a matrix with n rows (row stride ld), columns k0..k0 + 63 (zeros past kmax), into
 * dst in the 128-byte swizzle; 256 threads, each one 16-byte piece of rows i / 8 + 32 j */
template <class T>
__device__ __forceinline__ void load128(T *dst, const T *src, int64_t ld, int r0, int n, int k0, int kmax) {
  const int c = threadIdx.x % 8, r = threadIdx.x / 8;
  const bool kok = k0 + c * 8 < kmax; /* K a multiple of 8 (the caller checks) */
  dst += r * 64 + ((c ^ (r % 8)) << 3);
  src += k0 + c * 8;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const int rr = r0 + r + j * 32, ok = rr < n && kok;
    fa::cp16(dst + j * 32 * 64, src + (int64_t)(ok ? rr : 0) * ld, ok ? 16 : 0);
  }
}
#endif
} // namespace gh

template <class T, int ACT, bool RES>
__global__ void __launch_bounds__(256, 2)
    k_gemm_h(const T *__restrict__ A, const T *__restrict__ B, int M, int N, int K, const T *__restrict__ bias,
             const T *__restrict__ res, T *__restrict__ C) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace gh;
  extern __shared__ __align__(1024) unsigned char gh_raw[];
  T *sA = fh::smem_base<T>(gh_raw), *sB = sA + kStages * kTileA;
  const int wg = threadIdx.x / 128, lane = threadIdx.x % 32, w = threadIdx.x / 32 % 4, g = lane / 4, t = lane % 4;
  const int m0 = blockIdx.y * kBM, n0 = blockIdx.x * kBN, nk = (K + kBK - 1) / kBK;
  for (int s = 0; s < kAhead; s++) {
    if (s < nk) {
      load128(sA + s * kTileA, A, K, m0, M, s * kBK, K);
      load128(sB + s * kTileB, B, K, n0, N, s * kBK, K);
    }
    fa::commit();
  }
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; i++)
    acc[i] = 0.0f;
  for (int kt = 0; kt < nk; kt++) {
    const int st = kt % kStages;
    fh::arrived<kAhead>(); /* tile kt in; every warpgroup done with tile kt - 1's stage */
    if (kt + kAhead < nk) {
      const int ns = (kt + kAhead) % kStages;
      load128(sA + ns * kTileA, A, K, m0, M, (kt + kAhead) * kBK, K);
      load128(sB + ns * kTileB, B, K, n0, N, (kt + kAhead) * kBK, K);
    }
    fa::commit();
    const T *a = sA + st * kTileA + wg * 64 * 64, *b = sB + st * kTileB;
    gh::hold(acc);
    fh::fence();
#pragma unroll
    for (int c = 0; c < 4; c++) /* k step c: 32 bytes into each row */
      mma(acc, fh::desc(a + c * 16), fh::desc(b + c * 16), 1, T());
    fh::commit();
    fh::wait<0>();
    gh::hold(acc);
  }
  fa::wait<0>();
  __syncthreads(); /* the stages become the outputs' staging tile [128, kLdS] */
  T *sC = sA;
  const int r = wg * 64 + w * 16 + g;
#pragma unroll
  for (int j = 0; j < 16; j++) {
    const int c = j * 8 + 2 * t;
    float b0 = 0.0f, b1 = 0.0f;
    if (bias && n0 + c < N) /* N a multiple of 8 (the caller checks) */
      b0 = to_f(bias[n0 + c]), b1 = to_f(bias[n0 + c + 1]);
#pragma unroll
    for (int h = 0; h < 2; h++) {
      float x[2] = {acc[4 * j + 2 * h] + b0, acc[4 * j + 2 * h + 1] + b1};
      if (ACT != TGM_ACT_NONE) {
        round_to<T>(x); /* the activation's input in C's dtype (tgm_rt.h) */
        for (int e = 0; e < 2; e++)
          x[e] = ACT == TGM_ACT_RELU ? (x[e] < 0.0f ? 0.0f : x[e]) : tgm_gelu(x[e], ACT == TGM_ACT_GELU_TANH);
      }
      *reinterpret_cast<uint32_t *>(sC + (r + 8 * h) * kLdS + c) = fa::pack<T>(x[0], x[1]);
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kBM * kBN / 8; e += 256) { /* 16-byte vectors: + residual, stored */
    const int rr = e / (kBN / 8), cc = e % (kBN / 8) * 8;
    if (m0 + rr >= M || n0 + cc >= N)
      continue;
    Vec<T, 8> v = *reinterpret_cast<const Vec<T, 8> *>(sC + rr * kLdS + cc);
    const int64_t o = (int64_t)(m0 + rr) * N + n0 + cc;
    if (RES) {
      Vec<T, 8> rv = *reinterpret_cast<const Vec<T, 8> *>(res + o);
#pragma unroll
      for (int k = 0; k < 8; k++)
        v.v[k] = from_f<T>(to_f(v.v[k]) + to_f(rv.v[k]));
    }
    *reinterpret_cast<Vec<T, 8> *>(C + o) = v;
  }
#endif
}


/* k_gemm_p: persistent, one block an SM of two warpgroups that take turns (CUTLASS's "ping-pong"): each owns
 * 64 x 128 tiles of C and a 4-stage ring of its own (A [64, 64] and B [128, 64] a stage, the 128-byte swizzle),
 * loads two k steps ahead across its tiles, keeps one wgmma group in flight; while one runs its products the
 * other runs its epilogue (ORDER: named barriers 1 and 2 hand the tensor cores over). */
namespace gp {
constexpr int kStages = 4, kTA = 64 * 64, kTB = 128 * 64;
constexpr size_t kSmem = (size_t)2 * kStages * (kTA + kTB) * 2 + 1024;
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* rows r0.. (of n) of a [R, 64] tile, columns k0.. (zeros past kmax), into dst swizzled; the warpgroup's 128
 * threads, each piece tid % 8 of rows tid / 8 + 16 j */
template <int R, class T>
__device__ __forceinline__ void load(T *dst, const T *src, int64_t ld, int r0, int n, int k0, int kmax, int tid) {
  const int c = tid % 8, r = tid / 8;
  const bool kok = k0 + c * 8 < kmax;
  dst += r * 64 + ((c ^ (r % 8)) << 3);
  src += k0 + c * 8;
#pragma unroll
  for (int j = 0; j < R / 16; j++) {
    const int rr = r0 + r + j * 16, ok = rr < n && kok;
    fa::cp16(dst + j * 16 * 64, src + (int64_t)(ok ? rr : 0) * ld, ok ? 16 : 0);
  }
}
#endif
} // namespace gp

template <class T, int ACT, bool RES, bool ORDER>
__global__ void __launch_bounds__(256, 1)
    k_gemm_p(const T *__restrict__ A, const T *__restrict__ B, int M, int N, int K, const T *__restrict__ bias,
             const T *__restrict__ res, T *__restrict__ C) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace gp;
  extern __shared__ __align__(1024) unsigned char gp_raw[];
  const int wg = __shfl_sync(0xffffffff, (int)threadIdx.x / 128, 0);
  T *sA = fh::smem_base<T>(gp_raw) + wg * kStages * (kTA + kTB), *sB = sA + kStages * kTA;
  const int tid = threadIdx.x % 128, lane = tid % 32, w = tid / 32, g = lane / 4, t = lane % 4;
  const int nN = (N + 127) / 128, tiles = (M + 63) / 64 * nN, nk = (K + 63) / 64;
  const int per = 2 * gridDim.x, iters = (tiles + per - 1) / per, steps = iters * nk;
  auto tile = [&](int it, int &m0, int &n0) {
    const int tt = it * per + blockIdx.x * 2 + wg;
    m0 = tt < tiles ? tt / nN * 64 : M, n0 = tt < tiles ? tt % nN * 128 : 0;
  };
  auto stage = [&](int s) {
    if (s < steps) {
      int m0, n0;
      tile(s / nk, m0, n0);
      const int st = s % kStages, k0 = s % nk * 64;
      load<64>(sA + st * kTA, A, K, m0, M, k0, K, tid);
      load<128>(sB + st * kTB, B, K, n0, N, k0, K, tid);
    }
    fa::commit();
  };
  stage(0);
  stage(1);
  float acc[64];
  for (int it = 0; it < iters; it++) {
    int m0, n0;
    tile(it, m0, n0);
    if (ORDER && (wg == 1 || it > 0))
      bar_sync(wg == 0 ? 2 : 1, 256); /* the other warpgroup is done with its products */
#pragma unroll
    for (int i = 0; i < 64; i++)
      acc[i] = 0.0f;
    for (int kt = 0; kt < nk; kt++) {
      const int s = it * nk + kt, st = s % kStages;
      fa::wait<1>(); /* step s in (groups: one a step, one newer) */
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      bar_sync(3 + wg, 128); /* every warp's copies in; every warp's wgmma of step s - 2 done */
      stage(s + 2);
      const T *a = sA + st * kTA, *b = sB + st * kTB;
      gh::hold(acc);
      fh::fence();
#pragma unroll
      for (int c = 0; c < 4; c++)
        gh::mma(acc, fh::desc(a + c * 16), fh::desc(b + c * 16), 1, T());
      fh::commit();
      fh::wait<1>();
      gh::hold(acc);
    }
    fh::wait<0>();
    gh::hold(acc);
    if (ORDER && (wg == 0 || it < iters - 1))
      bar_arrive(wg == 0 ? 1 : 2, 256);
    /* the epilogue: rows r, r + 8, columns j * 8 + 2 t, + 1 of the tile */
    const int r = m0 + w * 16 + g;
    uint32_t rv[16][2];
    if (RES) {
#pragma unroll
      for (int j = 0; j < 16; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const int rr = r + 8 * h, cc = n0 + j * 8 + 2 * t;
          rv[j][h] = rr < M && cc < N ? *reinterpret_cast<const uint32_t *>(res + (int64_t)rr * N + cc) : 0u;
        }
    }
#pragma unroll
    for (int j = 0; j < 16; j++) {
      const int cc = n0 + j * 8 + 2 * t;
      float b0 = 0.0f, b1 = 0.0f;
      if (bias && cc < N)
        b0 = to_f(bias[cc]), b1 = to_f(bias[cc + 1]);
#pragma unroll
      for (int h = 0; h < 2; h++) {
        float x[2] = {acc[4 * j + 2 * h] + b0, acc[4 * j + 2 * h + 1] + b1};
        if (ACT != TGM_ACT_NONE) {
          round_to<T>(x);
          for (int e = 0; e < 2; e++)
            x[e] = ACT == TGM_ACT_RELU ? (x[e] < 0.0f ? 0.0f : x[e]) : tgm_gelu(x[e], ACT == TGM_ACT_GELU_TANH);
        }
        uint32_t v = fa::pack<T>(x[0], x[1]);
        if (RES) {
          const T *pv = reinterpret_cast<const T *>(&v), *pr = reinterpret_cast<const T *>(&rv[j][h]);
          v = fa::pack<T>(to_f(from_f<T>(to_f(pv[0]) + to_f(pr[0]))), to_f(from_f<T>(to_f(pv[1]) + to_f(pr[1]))));
        }
        const int rr = r + 8 * h;
        if (rr < M && cc < N)
          *reinterpret_cast<uint32_t *>(C + (int64_t)rr * N + cc) = v;
      }
    }
  }
#endif
}


/* k_gemm_w: persistent, one block an SM: two warpgroups run the products of 128 x 128 tiles (m64n128k16 each, a
 * 4-stage ring two k steps ahead across tiles, one wgmma group in flight) and write round(acc + bias) into a
 * staging tile; a third warpgroup takes it from there (activation, + residual, 16-byte stores) while the first two
 * go on with the next tile. Named barriers: 1 "full" (staging written), 2 "empty" (staging read), 3 the ring. */
namespace gw {
constexpr int kT = 128 * 64, kLdS = 128 + 8;
constexpr size_t smem(int stages) { return (size_t)stages * 2 * kT * 2 + (size_t)128 * kLdS * 2 + 1024; }
}
template <class T, int ACT, bool RES, int kStages = 4, int kAhead = 2>
__global__ void __launch_bounds__(512, 1)
    k_gemm_w(const T *__restrict__ A, const T *__restrict__ B, int M, int N, int K, const T *__restrict__ bias,
             const T *__restrict__ res, T *__restrict__ C) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace gw;
  extern __shared__ __align__(1024) unsigned char gw_raw[];
  T *sA = fh::smem_base<T>(gw_raw), *sB = sA + kStages * kT, *sC = sB + kStages * kT;
  const int wg = __shfl_sync(0xffffffff, (int)threadIdx.x / 128, 0);
  const int nN = (N + 127) / 128, tiles = (M + 127) / 128 * nN, nk = (K + 63) / 64;
  const int iters = (tiles + (int)gridDim.x - 1) / (int)gridDim.x;
  auto tile = [&](int it, int &m0, int &n0) {
    const int tt = it * (int)gridDim.x + (int)blockIdx.x;
    m0 = tt < tiles ? tt / nN * 128 : M, n0 = tt < tiles ? tt % nN * 128 : 0;
  };
  if (wg >= 2) { /* the epilogue */
    const int tid = threadIdx.x - 256;
    for (int it = 0; it < iters; it++) {
      int m0, n0;
      tile(it, m0, n0);
      Vec<T, 8> rv[8];
      if (RES) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
          const int e = tid + 256 * i, rr = m0 + e / 16, cc = n0 + e % 16 * 8;
          if (rr < M && cc < N)
            rv[i] = *reinterpret_cast<const Vec<T, 8> *>(res + (int64_t)rr * N + cc);
        }
      }
      gp::bar_sync(1, 512); /* staging written */
#pragma unroll
      for (int i = 0; i < 8; i++) {
        const int e = tid + 256 * i, rr = e / 16, cc = e % 16 * 8;
        Vec<T, 8> v = *reinterpret_cast<const Vec<T, 8> *>(sC + rr * kLdS + cc);
#pragma unroll
        for (int k = 0; k < 8; k++) {
          float x = to_f(v.v[k]);
          if (ACT != TGM_ACT_NONE)
            x = to_f(from_f<T>(ACT == TGM_ACT_RELU ? (x < 0.0f ? 0.0f : x) : tgm_gelu(x, ACT == TGM_ACT_GELU_TANH)));
          if (RES)
            x += to_f(rv[i].v[k]);
          v.v[k] = from_f<T>(x);
        }
        const int gr = m0 + rr, gc = n0 + cc;
        if (gr < M && gc < N)
          *reinterpret_cast<Vec<T, 8> *>(C + (int64_t)gr * N + gc) = v;
      }
      if (it < iters - 1)
        gp::bar_arrive(2, 512); /* staging read */
    }
    return;
  }
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32 % 4, g = lane / 4, t = lane % 4, steps = iters * nk;
  auto stage = [&](int s) {
    if (s < steps) {
      int m0, n0;
      tile(s / nk, m0, n0);
      const int st = s % kStages, k0 = s % nk * 64;
      gh::load128(sA + st * kT, A, K, m0, M, k0, K);
      gh::load128(sB + st * kT, B, K, n0, N, k0, K);
    }
    fa::commit();
  };
  for (int s = 0; s < kAhead; s++)
    stage(s);
  float acc[64];
  for (int it = 0; it < iters; it++) {
    int m0, n0;
    tile(it, m0, n0);
    uint32_t bv[16];
#pragma unroll
    for (int j = 0; j < 16; j++) {
      const int cc = n0 + j * 8 + 2 * t;
      bv[j] = bias && cc < N ? *reinterpret_cast<const uint32_t *>(bias + cc) : 0u;
    }
#pragma unroll
    for (int i = 0; i < 64; i++)
      acc[i] = 0.0f;
    for (int kt = 0; kt < nk; kt++) {
      const int s = it * nk + kt, st = s % kStages;
      fa::wait<kAhead - 1>();
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      gp::bar_sync(3, 256); /* step s in for every thread; every warp's wgmma of step s - 2 done */
      stage(s + kAhead);
      const T *a = sA + st * kT + wg * 64 * 64, *b = sB + st * kT;
      gh::hold(acc);
      fh::fence();
#pragma unroll
      for (int c = 0; c < 4; c++)
        gh::mma(acc, fh::desc(a + c * 16), fh::desc(b + c * 16), 1, T());
      fh::commit();
      fh::wait<1>();
      gh::hold(acc);
    }
    fh::wait<0>();
    gh::hold(acc);
    if (it > 0)
      gp::bar_sync(2, 512); /* the epilogue is done with the last tile */
    const int r = wg * 64 + w * 16 + g;
#pragma unroll
    for (int j = 0; j < 16; j++) {
      const T *pb = reinterpret_cast<const T *>(&bv[j]);
#pragma unroll
      for (int h = 0; h < 2; h++)
        *reinterpret_cast<uint32_t *>(sC + (r + 8 * h) * kLdS + j * 8 + 2 * t) =
            fa::pack<T>(acc[4 * j + 2 * h] + to_f(pb[0]), acc[4 * j + 2 * h + 1] + to_f(pb[1]));
    }
    gp::bar_arrive(1, 512);
  }
#endif
}

static tgm_cuda_ctx *cx;
template <class F> static double timeit(F f, int it = 50) {
  for (int i = 0; i < 3; i++) f();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a, cx->stream);
  for (int i = 0; i < it; i++) f();
  cudaEventRecord(b, cx->stream);
  cudaEventSynchronize(b);
  float ms;
  cudaEventElapsedTime(&ms, a, b);
  return ms * 1000.0 / it;
}
int main() {
  char err[256];
  if (tgm_cuda_ctx_create(&cx, err, sizeof err)) { printf("ctx: %s\n", err); return 1; }
  if (!cx->hopper) { printf("not Hopper with the sm_90a image\n"); return 77; }
  const int64_t shapes[][3] = {{16384, 512, 512}, {4096, 512, 512}, {16384, 768, 768}, {16384, 3072, 768}, {16384, 768, 3072}};
  cudaFuncSetAttribute(k_gemm_h<f16, TGM_ACT_GELU, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gh::kSmem);
  cudaFuncSetAttribute(k_gemm_h<f16, TGM_ACT_NONE, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gh::kSmem);
  cudaFuncSetAttribute(k_gemm_p<f16, TGM_ACT_GELU, true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gp::kSmem);
  cudaFuncSetAttribute(k_gemm_p<f16, TGM_ACT_NONE, false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gp::kSmem);
  cudaFuncSetAttribute(k_gemm_p<f16, TGM_ACT_GELU, true, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gp::kSmem);
  cudaFuncSetAttribute(k_gemm_p<f16, TGM_ACT_NONE, false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gp::kSmem);
  cudaFuncSetAttribute(k_gemm_w<f16, TGM_ACT_GELU, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gw::smem(4));
  cudaFuncSetAttribute(k_gemm_w<f16, TGM_ACT_NONE, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gw::smem(4));
  cudaFuncSetAttribute(k_gemm_w<f16, TGM_ACT_GELU, true, 5, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gw::smem(5));
  cudaFuncSetAttribute(k_gemm_w<f16, TGM_ACT_NONE, false, 5, 3>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gw::smem(5));
  cudaFuncSetAttribute(k_gemm_w<f16, TGM_ACT_GELU, true, 6, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gw::smem(6));
  cudaFuncSetAttribute(k_gemm_w<f16, TGM_ACT_NONE, false, 6, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gw::smem(6));
  printf("smem 6 stages: %zu\n", gw::smem(6));
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  for (auto &sh : shapes) {
    int64_t M = sh[0], N = sh[1], K = sh[2];
    std::vector<uint16_t> h((size_t)M * std::max(K, N));
    for (size_t i = 0; i < h.size(); i++) h[i] = tgm_f32_to_f16(((i * 2654435761u) % 1000) / 1000.0f - 0.5f);
    void *A, *B, *C, *C2, *R, *bias;
    cudaMalloc(&A, M * K * 2); cudaMalloc(&B, N * K * 2); cudaMalloc(&C, M * N * 2); cudaMalloc(&C2, M * N * 2);
    cudaMalloc(&R, M * N * 2); cudaMalloc(&bias, N * 2);
    cudaMemcpy(A, h.data(), M * K * 2, cudaMemcpyHostToDevice); cudaMemcpy(B, h.data() + 7, N * K * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(R, h.data() + 3, M * N * 2, cudaMemcpyHostToDevice); cudaMemcpy(bias, h.data() + 11, N * 2, cudaMemcpyHostToDevice);
    tgm_gemm g = {};
    g.dt = TGM_F16; g.tb = 1; g.M = M; g.N = N; g.K = K; g.batch = 1; g.A = A; g.lda = K; g.B = B; g.ldb = K; g.C = C; g.ldc = N;
    g.bias = bias; g.act = TGM_ACT_GELU; g.residual = R;
    dim3 grid((unsigned)((N + gh::kBN - 1) / gh::kBN), (unsigned)((M + gh::kBM - 1) / gh::kBM));
    for (int epi = 1; epi >= 0; epi--) { /* with gelu and the residual (the old path: cuBLASLt's product + bias, then
                                            k_gemm_epilogue), then the product alone (cuBLASLt alone) */
      tgm_gemm o = g;
      if (!epi) o.bias = NULL, o.act = TGM_ACT_NONE, o.residual = NULL;
      double told = timeit([&] { tgm_cuda_gemm(cx, &o); });
      std::vector<uint16_t> ref((size_t)(M * N)), got((size_t)(M * N));
      tgm_cuda_gemm(cx, &o);
      cudaStreamSynchronize(cx->stream);
      cudaMemcpy(ref.data(), C, M * N * 2, cudaMemcpyDeviceToHost);
      for (int var : {0, 3, 4, 5}) {
      auto run = [&] {
        const int tiles = (int)((M + 63) / 64 * ((N + 127) / 128)), gp_grid = std::min(sms, (tiles + 1) / 2);
        if (var == 0 && epi)
          k_gemm_h<f16, TGM_ACT_GELU, true><<<grid, 256, gh::kSmem, cx->stream>>>((const f16 *)A, (const f16 *)B, (int)M, (int)N, (int)K, (const f16 *)bias, (const f16 *)R, (f16 *)C2);
        else if (var == 0)
          k_gemm_h<f16, TGM_ACT_NONE, false><<<grid, 256, gh::kSmem, cx->stream>>>((const f16 *)A, (const f16 *)B, (int)M, (int)N, (int)K, NULL, NULL, (f16 *)C2);
        else if (var == 3 && epi)
          k_gemm_w<f16, TGM_ACT_GELU, true><<<std::min(sms, tiles / 2), 512, gw::smem(4), cx->stream>>>((const f16 *)A, (const f16 *)B, (int)M, (int)N, (int)K, (const f16 *)bias, (const f16 *)R, (f16 *)C2);
        else if (var == 3)
          k_gemm_w<f16, TGM_ACT_NONE, false><<<std::min(sms, tiles / 2), 512, gw::smem(4), cx->stream>>>((const f16 *)A, (const f16 *)B, (int)M, (int)N, (int)K, NULL, NULL, (f16 *)C2);
        else if (var == 4 && epi)
          k_gemm_w<f16, TGM_ACT_GELU, true, 5, 3><<<std::min(sms, tiles / 2), 512, gw::smem(5), cx->stream>>>((const f16 *)A, (const f16 *)B, (int)M, (int)N, (int)K, (const f16 *)bias, (const f16 *)R, (f16 *)C2);
        else if (var == 4)
          k_gemm_w<f16, TGM_ACT_NONE, false, 5, 3><<<std::min(sms, tiles / 2), 512, gw::smem(5), cx->stream>>>((const f16 *)A, (const f16 *)B, (int)M, (int)N, (int)K, NULL, NULL, (f16 *)C2);
        else if (var == 5 && epi)
          k_gemm_w<f16, TGM_ACT_GELU, true, 6, 4><<<std::min(sms, tiles / 2), 512, gw::smem(6), cx->stream>>>((const f16 *)A, (const f16 *)B, (int)M, (int)N, (int)K, (const f16 *)bias, (const f16 *)R, (f16 *)C2);
        else if (var == 5)
          k_gemm_w<f16, TGM_ACT_NONE, false, 6, 4><<<std::min(sms, tiles / 2), 512, gw::smem(6), cx->stream>>>((const f16 *)A, (const f16 *)B, (int)M, (int)N, (int)K, NULL, NULL, (f16 *)C2);
        else if (var == 1 && epi)
          k_gemm_p<f16, TGM_ACT_GELU, true, true><<<gp_grid, 256, gp::kSmem, cx->stream>>>((const f16 *)A, (const f16 *)B, (int)M, (int)N, (int)K, (const f16 *)bias, (const f16 *)R, (f16 *)C2);
        else if (var == 1)
          k_gemm_p<f16, TGM_ACT_NONE, false, true><<<gp_grid, 256, gp::kSmem, cx->stream>>>((const f16 *)A, (const f16 *)B, (int)M, (int)N, (int)K, NULL, NULL, (f16 *)C2);
        else if (epi)
          k_gemm_p<f16, TGM_ACT_GELU, true, false><<<gp_grid, 256, gp::kSmem, cx->stream>>>((const f16 *)A, (const f16 *)B, (int)M, (int)N, (int)K, (const f16 *)bias, (const f16 *)R, (f16 *)C2);
        else
          k_gemm_p<f16, TGM_ACT_NONE, false, false><<<gp_grid, 256, gp::kSmem, cx->stream>>>((const f16 *)A, (const f16 *)B, (int)M, (int)N, (int)K, NULL, NULL, (f16 *)C2);
      };
      cudaMemset(C2, 0, M * N * 2);
      double tnew = timeit(run);
      run();
      cudaError_t e = cudaStreamSynchronize(cx->stream);
      cudaMemcpy(got.data(), C2, M * N * 2, cudaMemcpyDeviceToHost);
      double worst = 0;
      int64_t differ = 0;
      for (int64_t i = 0; i < M * N; i++) {
        float x = tgm_f16_to_f32(got[i]), y = tgm_f16_to_f32(ref[i]);
        differ += got[i] != ref[i];
        worst = std::max(worst, (double)fabsf(x - y) / std::max(1.0f, fabsf(y)));
      }
      static const char *vn[] = {"k_gemm_h", "k_gemm_p", "k_gemm_p unordered", "k_gemm_w 4/2", "k_gemm_w 5/3", "k_gemm_w 6/4"};
      printf("M=%lld N=%lld K=%lld %s: old %.1f us, %s %.1f us (%.0f TFLOP/s), %lld differ, worst %.2e%s\n",
             (long long)M, (long long)N, (long long)K, epi ? "bias+gelu+res" : "product", told, vn[var], tnew,
             2.0 * M * N * K / tnew * 1e-6, (long long)differ, worst, e ? " CUDA ERROR" : "");
      }
    }
    cudaFree(A); cudaFree(B); cudaFree(C); cudaFree(C2); cudaFree(R); cudaFree(bias);
  }
  return 0;
}
