/* tgm_cuda.cu: the CUDA library calls of the runtime (the "CUDA kernels"
 * section of tgm_rt.h): the context, the GEMMs (matmul, linear, gemm),
 * attention, embedding and its backward, dropout, cast and fill; the
 * pointwise, reduction, view and loss kernels are generated per model
 * (NAME_cuda.cu).
 *
 * Template: copied into every emitted project as src/NAME_kernels_cuda.cu
 * with "tgm_" renamed; it needs only the CUDA Toolkit (cudart, cuBLAS,
 * cuBLASLt, and CUB's headers for embedding_backward's radix sort). Every
 * entry point checks its arguments, enqueues its work on the context's stream
 * and returns 0, or a CUDA/cuBLAS error code with "FUNCTION: what went wrong"
 * in the context (tgm_cuda_ctx_error); nothing here exits or aborts. Only
 * the sections of the library calls a model makes are copied (tgm_rt.h,
 * "Sections"); CUB's header is in embedding_backward's.
 *
 * Semantics are PyTorch's, as gen/interp.c computes them in double: storage
 * f32 / bf16 / f16 (and i32 / bool for cast and fill), arithmetic and
 * accumulation in f32, results rounded once to the storage dtype. No
 * fast-math: the GEMM epilogue's gelu is tgm_math.h's (the generated
 * kernels'), on CUDA's precise erfcf and tanhf.
 *
 * Layout of this file:
 *   the context, errors, scratch
 *   device helpers: dtype conversion, Philox, packed vectors, batch geometry
 *   kernels: cast, row copies, fill, the attention softmax, embedding_backward,
 *            dropout, the GEMM epilogue
 *   host helpers: geometry (broadcast strides, dim collapsing), GEMM,
 *                 cuBLASLt plans (tgm_cuda_gemm), attention
 *   the entry points, in the order of tgm_rt.h
 *
 * Batch geometry: a batched call over batch shape S reads operand p at
 * offset sum_k idx_k * st[p][k] (stride 0 = broadcast); the host collapses it
 * (drops size-1 dims, merges neighbours that are contiguous for every
 * operand), so that usually one strided-batched call covers the batch. */
#include "tgm_rt.h"
#include "tgm_math.h"

#include <cublasLt.h>
#include <cublas_v2.h>
/*@uses embedding_backward@*/
#include <cub/device/device_radix_sort.cuh>
/*@end embedding_backward@*/
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

/* ---------------------------------------------------------------- the context */

#define TGM_CUDA_BLAS_WS ((size_t)32 << 20)      /* cuBLAS workspace (Hopper: 32 MiB) */
#define TGM_CUDA_ATTN_BUDGET ((size_t)256 << 20) /* attention scores scratch per chunk */
#ifndef TGM_CUDA_GEMM_BUDGET
#define TGM_CUDA_GEMM_BUDGET ((size_t)256 << 20) /* tgm_cuda_gemm's f32 product scratch per piece */
#endif
#define TGM_CUDA_GEMM_PLANS 16                   /* cuBLASLt plans kept per context */
#define TGM_CUDA_TUNES 256                       /* autotuned GEMM choices kept per context */
#define TGM_CUDA_TUNE_CANDIDATES 8               /* the heuristic's algorithms timed per GEMM */

/* What identifies a cuBLASLt plan: the problem as cuBLASLt sees it (types,
 * transposes, sizes, leading dims, batch count and strides, epilogue, beta 0
 * or 1) and the alignment of each pointer (the heuristic's choice depends on
 * it). Zero-filled before use, compared with memcmp. */
struct tgm_cuda_gemm_key {
  int32_t dt, d_f32, ta, tb, batch, beta1;
  uint32_t epilogue;
  uint32_t align[6]; /* A, B, C, D, bias, aux (bytes, at most 256) */
  int64_t M, N, K, lda, ldb, ldd, sa, sb, sd;
};

/* A cached cuBLASLt plan: the matmul descriptor (transposes, epilogue, aux
 * leading dim and batch stride; the bias and aux pointers are set per call),
 * the four layouts, and the heuristic's algorithm (ok = 0: there was none). */
struct tgm_cuda_gemm_plan {
  int used, ok;
  int tuned; /* autotune: the algorithm is the timed or cached choice (or timing was not possible) */
  struct tgm_cuda_gemm_key key;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c, d;
  cublasLtMatmulAlgo_t algo;
};

/* An autotuned GEMM: its key, the fastest algorithm and the times of it
 * and of the heuristic's first choice (ms; 0 when read from the file). */
struct tgm_cuda_tune {
  struct tgm_cuda_gemm_key key;
  cublasLtMatmulAlgo_t algo;
  float ms, heuristic_ms;
};

struct tgm_cuda_alloc {
  void *p;
  size_t n;
};

struct tgm_cuda_ctx {
  int device;                /* the device current at creation */
  int sms;                   /* its multiprocessor count, for grid sizes */
  cudaStream_t stream;       /* every kernel, copy and GEMM is enqueued here, in order */
  cudaStream_t own;          /* the context's stream (`stream` unless the caller set one) */
  int capturing;             /* between graph_begin and graph_end: nothing may wait or allocate */
  unsigned generation;       /* scratch reallocations (graphs hold the scratch pointer) */
  cublasHandle_t blas;       /* bound to `stream`; CUBLAS_COMPUTE_32F never uses TF32 */
  void *blas_ws;             /* cuBLAS workspace, TGM_CUDA_BLAS_WS bytes (cuBLASLt's too: same stream) */
  cublasLtHandle_t lt;       /* cuBLASLt (tgm_cuda_gemm); calls pass `stream` */
  struct tgm_cuda_gemm_plan plans[TGM_CUDA_GEMM_PLANS]; /* tgm_cuda_gemm's plan cache, round robin */
  int next_plan;
  int hopper;                /* sm_90a code loaded on a compute capability 9.0 GPU: the wgmma kernels run */
  int x3;                    /* k_gemm_x3 runs here (hopper, TGM_GEMM_X3 not 0) */
  int tune;                  /* max-autotune: a GEMM's first call times the heuristic's candidates */
  char tune_file[512];       /* the choices' file ("": kept in memory only) */
  int tune_read;             /* tune_file was read */
  struct tgm_cuda_tune *tunes; /* the choices, TGM_CUDA_TUNES at most */
  int ntunes;
  unsigned long long *d_bad; /* device int64: smallest bad data position, INT64_MAX if none */
  float *d_split_part;       /* split reductions: the blocks' partials (TGM_CUDA_SPLIT_PARTS floats) */
  unsigned *d_split_count;   /* and per output tile the blocks done (TGM_CUDA_SPLIT_TILES, zero between kernels) */
  void *scratch;             /* growable scratch: attention scores, loss rows, partial states */
  size_t scratch_bytes;
  struct tgm_cuda_alloc *allocs; /* the live cudaMallocs (dev_malloc), for the memory held now and at most */
  int nallocs, cap_allocs;
  size_t mem_now, mem_peak;
  const char *op; /* the entry point running, for messages */
  char err[512];  /* the last error: "FUNCTION: message" */
};

namespace {

typedef __nv_bfloat16 bf16;
typedef __half f16;

const int kThreads = 256; /* threads per block of the flat kernels */

/* ---------------------------------------------------------------- errors */

/* Formats "OP: message" into the context; returns `code` (nonzero). */
int fail(tgm_cuda_ctx *cx, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int fail(tgm_cuda_ctx *cx, int code, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(cx->err, sizeof cx->err, "%s: %s", cx->op ? cx->op : "tgm_cuda", msg);
  return code ? code : (int)cudaErrorUnknown;
}

/* A failed CUDA call: its name and CUDA's description. */
int cuda_fail(tgm_cuda_ctx *cx, cudaError_t e, const char *what) {
  return fail(cx, (int)e, "%s failed: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* A failed cuBLAS call. */
int blas_fail(tgm_cuda_ctx *cx, cublasStatus_t s, const char *what) {
  return fail(cx, (int)s, "%s failed: %s (cuBLAS status %d)", what, cublasGetStatusString(s), (int)s);
}

/* A bad argument (a bug in the caller): cudaErrorInvalidValue with a message. */
#define TGM_CUDA_BAD(...) fail(cx, (int)cudaErrorInvalidValue, __VA_ARGS__)

#define TGM_CUDA_TRY(call)                                                                                             \
  do {                                                                                                                 \
    cudaError_t e_ = (call);                                                                                           \
    if (e_ != cudaSuccess)                                                                                             \
      return cuda_fail(cx, e_, #call);                                                                                 \
  } while (0)

#define TGM_CUDA_BLAS(call)                                                                                            \
  do {                                                                                                                 \
    cublasStatus_t s_ = (call);                                                                                        \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                                                   \
      return blas_fail(cx, s_, #call);                                                                                 \
  } while (0)

/* After every launch: a bad configuration (or an earlier asynchronous fault). */
#define TGM_CUDA_LAUNCHED(name)                                                                                        \
  do {                                                                                                                 \
    cudaError_t e_ = cudaGetLastError();                                                                               \
    if (e_ != cudaSuccess)                                                                                             \
      return cuda_fail(cx, e_, "launching " name);                                                                     \
  } while (0)

/* Every device allocation of the context goes through dev_malloc and
 * dev_free, which keep the live ones' sizes: the memory held now and at
 * most (tgm_cuda_ctx_memory; the CUDA context's own is not counted). */
cudaError_t dev_malloc(tgm_cuda_ctx *cx, void **p, size_t n) {
  *p = NULL;
  if (cx->nallocs == cx->cap_allocs) {
    int cap = cx->cap_allocs ? 2 * cx->cap_allocs : 16;
    struct tgm_cuda_alloc *a = (struct tgm_cuda_alloc *)realloc(cx->allocs, sizeof *a * (size_t)cap);
    if (!a)
      return cudaErrorMemoryAllocation;
    cx->allocs = a;
    cx->cap_allocs = cap;
  }
  cudaError_t e = cudaMalloc(p, n ? n : 1);
  if (e != cudaSuccess) {
    *p = NULL;
    return e;
  }
  cx->allocs[cx->nallocs].p = *p;
  cx->allocs[cx->nallocs++].n = n;
  cx->mem_now += n;
  if (cx->mem_now > cx->mem_peak)
    cx->mem_peak = cx->mem_now;
  return e;
}

void dev_free(tgm_cuda_ctx *cx, void *p) {
  if (!p)
    return;
  for (int i = 0; i < cx->nallocs; i++)
    if (cx->allocs[i].p == p) {
      cx->mem_now -= cx->allocs[i].n;
      cx->allocs[i] = cx->allocs[--cx->nallocs];
      break;
    }
  cudaFree(p);
}

/* The growable scratch buffer: at least `bytes`, valid until the next call
 * that asks for more. Growing waits for the stream (the old buffer may still
 * be in use), which happens only while the sizes still climb. */
int scratch(tgm_cuda_ctx *cx, size_t bytes, void **p) {
  if (bytes > cx->scratch_bytes) {
    if (cx->capturing)
      return fail(cx, (int)cudaErrorStreamCaptureUnsupported, "scratch must grow to %zu bytes while a CUDA graph is recorded", bytes);
    cx->generation++;
    size_t nb = (bytes + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
    if (cx->scratch) {
      TGM_CUDA_TRY(cudaStreamSynchronize(cx->stream));
      dev_free(cx, cx->scratch);
      cx->scratch = NULL;
      cx->scratch_bytes = 0;
    }
    cudaError_t e = dev_malloc(cx, &cx->scratch, nb);
    if (e != cudaSuccess) {
      cudaGetLastError();
      cx->scratch = NULL;
      return fail(cx, (int)e, "out of device memory for %zu bytes of scratch (%s)", nb, cudaGetErrorString(e));
    }
    cx->scratch_bytes = nb;
  }
  *p = cx->scratch;
  return 0;
}

/* Blocks for a grid-stride loop over `work` items. */
unsigned grid_for(const tgm_cuda_ctx *cx, int64_t work, int threads) {
  int64_t b = (work + threads - 1) / threads, cap = (int64_t)cx->sms * 16;
  return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}

int is_float_dt(int dt) { return dt == TGM_F32 || dt == TGM_BF16 || dt == TGM_F16; }
int dt_ok(int dt) { return dt >= TGM_F32 && dt <= TGM_BOOL; }
int dt_size(int dt) { return dt == TGM_F32 || dt == TGM_I32 ? 4 : dt == TGM_BOOL ? 1 : 2; }
const char *dt_name(int dt) {
  static const char *const n[] = {"f32", "bf16", "f16", "i32", "bool"};
  return dt_ok(dt) ? n[dt] : "?";
}

/* ---------------------------------------------------------------- device helpers */

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(f16 x) { return __half2float(x); }

template <class T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ f16 from_f<f16>(float v) { return __float2half_rn(v); }

/*@uses dropout@*/
/* Philox4x32-10, the bits of tgm_philox4x32 (tgm_init.c): ten rounds, each
 * multiplying words 0 and 2, xoring the high halves into words 1 and 3 with
 * the round key; the key bumped by the Weyl constants between rounds. */
__device__ __forceinline__ uint4 philox4x32(uint4 c, uint2 k) {
#pragma unroll
  for (int r = 0; r < 10; r++) {
    if (r) {
      k.x += 0x9E3779B9u;
      k.y += 0xBB67AE85u;
    }
    uint32_t hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
    uint32_t hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
  }
  return c;
}
/*@end dropout@*/

/* N elements moved as one aligned access (16 bytes at most per access). */
template <class T, int N> struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) Vec { T v[N]; };

/* Strided geometry of NOP operands over an output (batch) shape (see the top). */
template <int NOP> struct Geo {
  int rank;
  int64_t shape[TGM_MAXRANK];
  int64_t st[NOP][TGM_MAXRANK];
};

/* ---------------------------------------------------------------- cast */

/* Element conversion for cast: to i32 truncates toward zero (saturating, NaN
 * gives 0), to bool is x != 0, everything else goes through f32. */
template <class TO> struct CastF {
  template <class TI> __device__ __forceinline__ TO operator()(TI x) const {
    if constexpr (std::is_same<TI, TO>::value) {
      return x;
    } else if constexpr (std::is_same<TO, uint8_t>::value) {
      if constexpr (std::is_same<TI, int32_t>::value)
        return (uint8_t)(x != 0);
      else
        return (uint8_t)(to_f(x) != 0.0f);
    } else if constexpr (std::is_same<TI, uint8_t>::value) {
      if constexpr (std::is_same<TO, int32_t>::value)
        return (int32_t)x;
      else
        return from_f<TO>(x ? 1.0f : 0.0f);
    } else if constexpr (std::is_same<TO, int32_t>::value) {
      return (int32_t)__float2int_rz(to_f(x));
    } else if constexpr (std::is_same<TI, int32_t>::value) {
      return from_f<TO>((float)x);
    } else {
      return from_f<TO>(to_f(x));
    }
  }
};

/* ---------------------------------------------------------------- pointwise kernels */

/* y[i] = f(x[i]) (cast); with vec, the bulk moves in 16-byte packs (pointers aligned
 * for it, checked by the host) and the tail element by element. */
template <class TI, class TO, class F>
__global__ void k_map1(const TI *__restrict__ x, TO *__restrict__ y, int64_t n, int vec, F f) {
  constexpr int V = 16 / sizeof(TI);
  int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x, done = 0;
  if (vec) {
    int64_t nv = n / V;
    for (int64_t i = t; i < nv; i += step) {
      Vec<TI, V> a = reinterpret_cast<const Vec<TI, V> *>(x)[i];
      Vec<TO, V> r;
#pragma unroll
      for (int j = 0; j < V; j++)
        r.v[j] = f(a.v[j]);
      reinterpret_cast<Vec<TO, V> *>(y)[i] = r;
    }
    done = nv * V;
  }
  for (int64_t i = done + t; i < n; i += step)
    y[i] = f(x[i]);
}

/* Row copies: dst row p (pitch dpitch units) = src row p, or src row idx[p]
 * for embedding (an index outside [0, V) records p in *bad and writes zeros).
 * U is the widest unit that divides the widths, pitches and addresses. Block
 * (bx, by): bx threads along a row, by rows at once. */
template <class U>
__global__ void k_rows(const U *__restrict__ src, int64_t spitch, U *__restrict__ dst, int64_t dpitch, int64_t rows,
                       int64_t w, const int32_t *__restrict__ idx, int64_t V, unsigned long long *bad) {
  for (int64_t p = blockIdx.x * (int64_t)blockDim.y + threadIdx.y; p < rows; p += (int64_t)gridDim.x * blockDim.y) {
    int64_t s = p;
    if (idx) {
      s = idx[p];
      if (s < 0 || s >= V) {
        if (threadIdx.x == 0)
          atomicMin(bad, (unsigned long long)p);
        for (int64_t c = threadIdx.x; c < w; c += blockDim.x)
          dst[p * dpitch + c] = U();
        continue;
      }
    }
    for (int64_t c = threadIdx.x; c < w; c += blockDim.x)
      dst[p * dpitch + c] = src[s * spitch + c];
  }
}

template <class E> __global__ void k_fill(E *__restrict__ y, int64_t n, E v) {
  int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = t; i < n; i += step)
    y[i] = v;
}

__global__ void k_set_bad(unsigned long long *bad) { *bad = (unsigned long long)INT64_MAX; }

/*@uses attention attention_backward@*/
/* Zero bits (0 in every floating dtype; E has the dtype's size) into the n =
 * batch x rows x cols elements of a strided tensor: rows of cols elements ld
 * apart, batch element b at the offset of its index over g (operand 0). */
template <class E> __global__ void k_zero_view(E *p, Geo<1> g, int64_t rows, int64_t cols, int64_t ld, int64_t n) {
  int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = t; i < n; i += step) {
    int64_t c = i % cols, r = i / cols % rows, b = i / cols / rows, off = r * ld + c;
    for (int k = g.rank - 1; k >= 0; k--) {
      off += b % g.shape[k] * g.st[0][k];
      b /= g.shape[k];
    }
    p[off] = E();
  }
}
/*@end attention attention_backward@*/

/*@uses attention@*/
/* ---------------------------------------------------------------- the attention softmax */

__device__ __forceinline__ bool is_nan(float x) { return x != x; }
__device__ __forceinline__ bool is_inf(float x) { return fabsf(x) == INFINITY; }

/* Online log-sum-exp, the state of the attention softmax's row reductions:
 * a = the running max m (NaN once any NaN), b = the sum of exp(x - m); with
 * an infinite m the sum is not needed. */
struct Lse {
  struct S {
    float a, b;
  };
  __device__ __forceinline__ S init() const { return S{-INFINITY, 0.0f}; }
  static __device__ __forceinline__ void push(S &s, float x) {
    if (x > s.a) {
      s.b = (s.a == -INFINITY ? 0.0f : s.b * expf(s.a - x)) + 1.0f;
      s.a = x;
    } else if (is_nan(x)) {
      s.a = x;
    } else if (x > -INFINITY && s.a < INFINITY) {
      s.b += expf(x - s.a);
    }
  }
  __device__ __forceinline__ void merge(S &s, const S &o) const {
    if (is_nan(s.a) || is_nan(o.a)) {
      s.a = NAN;
    } else if (o.a > s.a) {
      s.b = o.b + (s.a == -INFINITY ? 0.0f : s.b * expf(s.a - o.a));
      s.a = o.a;
    } else if (o.a > -INFINITY && s.a < INFINITY) {
      s.b += o.b * expf(o.a - s.a);
    }
  }
  static __device__ __forceinline__ S shfl_down(const S &s, int d) {
    return S{__shfl_down_sync(0xffffffffu, s.a, d), __shfl_down_sync(0xffffffffu, s.b, d)};
  }
  static __device__ __forceinline__ S shfl0(const S &s) {
    return S{__shfl_sync(0xffffffffu, s.a, 0), __shfl_sync(0xffffffffu, s.b, 0)};
  }
};

/* The state of a whole warp, in every lane (deterministic: a fixed tree,
 * then lane 0's result broadcast). */
template <class R> __device__ __forceinline__ typename R::S warp_merge(const R &r, typename R::S s) {
#pragma unroll
  for (int d = 16; d >= 1; d >>= 1) {
    typename R::S o = R::shfl_down(s, d);
    r.merge(s, o);
  }
  return R::shfl0(s);
}

/* The state of a whole block (blockDim.x a multiple of 32), in every thread;
 * sh holds 32 states. Every thread of the block must call it. */
template <class R>
__device__ __forceinline__ typename R::S block_merge(const R &r, typename R::S s, typename R::S *sh) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  s = warp_merge(r, s);
  __syncthreads(); /* sh may still be read from a previous call */
  if (lane == 0)
    sh[warp] = s;
  __syncthreads();
  s = lane < nw ? sh[lane] : r.init();
  return warp_merge(r, s);
}

template <class R, bool BLOCK>
__device__ __forceinline__ typename R::S group_merge(const R &r, typename R::S s, typename R::S *sh) {
  if constexpr (BLOCK)
    return block_merge(r, s, sh);
  else
    return warp_merge(r, s);
}

/* ---------------------------------------------------------------- row kernels */

/* The groups of a row kernel: a warp per row (8 rows per 256-thread block) or,
 * with BLOCK, a block per row. Loops are uniform per group, so the group
 * reductions inside are safe. */
template <bool BLOCK> struct Rows {
  int lane, nthr;
  int64_t first, step;
  __device__ Rows() {
    lane = BLOCK ? threadIdx.x : (threadIdx.x & 31);
    nthr = BLOCK ? blockDim.x : 32;
    int64_t per = BLOCK ? 1 : blockDim.x / 32;
    first = blockIdx.x * per + (BLOCK ? 0 : threadIdx.x / 32);
    step = (int64_t)gridDim.x * per;
  }
};

/* Row access for the row kernels: f(j, value) for each element j of a row
 * of n that this thread owns, in 16-byte packs when vec (n a multiple of the
 * pack, the row pointers aligned: checked by the host), else one by one.
 * row_map writes yr[j] = f(j, xr[j]) with the same ownership, so a thread
 * rewrites only what it read (in-place safe). */
template <class T, class F>
__device__ __forceinline__ void row_read(const T *xr, int64_t n, int lane, int nthr, int vec, F f) {
  constexpr int V = 16 / sizeof(T);
  if (vec) {
    const Vec<T, V> *xv = reinterpret_cast<const Vec<T, V> *>(xr);
    for (int64_t jv = lane; jv < n / V; jv += nthr) {
      Vec<T, V> p = xv[jv];
#pragma unroll
      for (int u = 0; u < V; u++)
        f(jv * V + u, to_f(p.v[u]));
    }
  } else {
    for (int64_t j = lane; j < n; j += nthr)
      f(j, to_f(xr[j]));
  }
}

template <class TI, class TO, class F>
__device__ __forceinline__ void row_map(const TI *xr, TO *yr, int64_t n, int lane, int nthr, int vec, F f) {
  constexpr int V = 16 / sizeof(TI);
  if (vec) {
    const Vec<TI, V> *xv = reinterpret_cast<const Vec<TI, V> *>(xr);
    Vec<TO, V> *yv = reinterpret_cast<Vec<TO, V> *>(yr);
    for (int64_t jv = lane; jv < n / V; jv += nthr) {
      Vec<TI, V> p = xv[jv];
      Vec<TO, V> o;
#pragma unroll
      for (int u = 0; u < V; u++)
        o.v[u] = from_f<TO>(f(jv * V + u, to_f(p.v[u])));
      yv[jv] = o;
    }
  } else {
    for (int64_t j = lane; j < n; j += nthr)
      yr[j] = from_f<TO>(f(j, to_f(xr[j])));
  }
}

/* The attention softmax along rows of n. With causal_t > 0, row r masks
 * columns j > r % causal_t to -inf. x and y may be the same buffer (row_map
 * rewrites only what each thread read). lse (NULL: not wanted) gets each
 * row's log-sum-exp. */
template <class TI, class TO, bool BLOCK>
__global__ void __launch_bounds__(1024)
    k_softmax_rows(const TI *x, TO *y, int64_t rows, int64_t n, int64_t causal_t, int vec, float *lse) {
  __shared__ Lse::S sh[32];
  const Lse r;
  Rows<BLOCK> g;
  for (int64_t row = g.first; row < rows; row += g.step) {
    const TI *xr = x + row * n;
    int64_t lim = causal_t ? row % causal_t : n; /* columns j <= lim are kept */
    Lse::S s = r.init();
    row_read(xr, n, g.lane, g.nthr, vec, [&](int64_t j, float v) { Lse::push(s, j <= lim ? v : -INFINITY); });
    s = group_merge<Lse, BLOCK>(r, s, sh);
    float m = s.a, sum = is_inf(m) ? NAN : s.b; /* an infinite max: NaN, as torch */
    if (lse && g.lane == 0)
      lse[row] = is_inf(m) ? m : m + logf(s.b);
    row_map(xr, y + row * n, n, g.lane, g.nthr, vec,
            [&](int64_t j, float v) { return expf((j <= lim ? v : -INFINITY) - m) / sum; });
  }
}
/*@end attention@*/

/*@uses embedding_backward@*/
/* ---------------------------------------------------------------- embedding_backward */

/* embedding_backward, step 1: the sort's input, key[p] = idx[p] (or `nkeys`,
 * above every valid key, for an index outside [0, V), whose position goes to
 * *bad) and val[p] = p. */
__global__ void k_emb_keys(const int32_t *__restrict__ idx, int64_t n, int64_t V, uint32_t nkeys,
                           uint32_t *__restrict__ key, uint32_t *__restrict__ val, unsigned long long *bad) {
  int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t p = t; p < n; p += step) {
    int32_t i = idx[p];
    bool ok = i >= 0 && (int64_t)i < V;
    if (!ok)
      atomicMin(bad, (unsigned long long)p);
    key[p] = ok ? (uint32_t)i : nkeys;
    val[p] = (uint32_t)p;
  }
}

/* Step 3 (after the stable sort by key): row k's positions are pos[lo[k] ..
 * hi[k]), in increasing order; lo and hi are zero beforehand (empty rows). */
__global__ void k_emb_bounds(const uint32_t *__restrict__ key, int64_t n, uint32_t nkeys, uint32_t *__restrict__ lo,
                             uint32_t *__restrict__ hi) {
  int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = t; i < n; i += step) {
    uint32_t k = key[i];
    if (k >= nkeys)
      continue;
    if (i == 0 || key[i - 1] != k)
      lo[k] = (uint32_t)i;
    if (i == n - 1 || key[i + 1] != k)
      hi[k] = (uint32_t)(i + 1);
  }
}

const int kEmbStage = 256;      /* positions staged in shared memory at a time */
const uint32_t kEmbHeavy = 32; /* rows with more positions go to k_emb_heavy */

/* acc[c] += dy[p, col0 + c cstride] for the positions p = pos[a .. b) in
 * order (f32, one add per position: the order of the CPU's loop). The block
 * stages the positions in shared memory, so that only the dy loads are on the
 * critical path, and keeps U positions' loads in flight. Every thread of the
 * block calls it (it synchronises); columns past D add nothing. */
template <class T, int CPT, int U>
__device__ __forceinline__ void emb_sum(const T *__restrict__ dy, int64_t D, const uint32_t *__restrict__ pos,
                                        uint32_t a, uint32_t b, int64_t col0, int64_t cstride, float (&acc)[CPT],
                                        uint32_t *sp) {
  for (uint32_t base = a; base < b; base += kEmbStage) {
    uint32_t m = b - base < (uint32_t)kEmbStage ? b - base : (uint32_t)kEmbStage;
    __syncthreads();
    for (uint32_t t = threadIdx.x; t < m; t += blockDim.x)
      sp[t] = pos[base + t];
    __syncthreads();
    uint32_t k = 0;
    for (; k + U <= m; k += U) {
      float x[U][CPT];
#pragma unroll
      for (int u = 0; u < U; u++) {
        const T *r = dy + (int64_t)sp[k + u] * D;
#pragma unroll
        for (int c = 0; c < CPT; c++) {
          int64_t col = col0 + c * cstride;
          x[u][c] = col < D ? to_f(r[col]) : 0.0f;
        }
      }
#pragma unroll
      for (int u = 0; u < U; u++)
#pragma unroll
        for (int c = 0; c < CPT; c++)
          acc[c] += x[u][c];
    }
    for (; k < m; k++) {
      const T *r = dy + (int64_t)sp[k] * D;
#pragma unroll
      for (int c = 0; c < CPT; c++) {
        int64_t col = col0 + c * cstride;
        if (col < D)
          acc[c] += to_f(r[col]);
      }
    }
  }
}

/* Step 4: one block per output row v (grid-stride), each thread CPT columns
 * (blockDim.x apart, coalesced) summed in f32 and stored once; a row no
 * index hits is zeros (16-byte stores where aligned). A row of more than
 * kEmbHeavy positions is left to k_emb_heavy: its number goes to heavy[]
 * (in any order: each row's result does not depend on it). */
template <class T, int CPT, int U>
__global__ void k_emb_rows(const T *__restrict__ dy, int64_t D, int64_t V, uint32_t nkeys,
                           const uint32_t *__restrict__ pos, const uint32_t *__restrict__ lo,
                           const uint32_t *__restrict__ hi, uint32_t *__restrict__ heavy, uint32_t *nheavy,
                           T *__restrict__ out) {
  __shared__ uint32_t sp[kEmbStage];
  for (int64_t v = blockIdx.x; v < V; v += gridDim.x) {
    uint32_t a = v < nkeys ? lo[v] : 0, b = v < nkeys ? hi[v] : 0;
    T *row = out + v * D;
    if (b - a > kEmbHeavy) {
      if (threadIdx.x == 0)
        heavy[atomicAdd(nheavy, 1u)] = (uint32_t)v;
      continue;
    }
    if (a == b && (D * (int64_t)sizeof(T)) % 16 == 0 && ((uintptr_t)row & 15) == 0) {
      uint4 *r4 = (uint4 *)row, z = make_uint4(0, 0, 0, 0);
      for (int64_t i = threadIdx.x; i < D * (int64_t)sizeof(T) / 16; i += blockDim.x)
        r4[i] = z;
      continue;
    }
    for (int64_t cb = 0; cb < D; cb += (int64_t)CPT * blockDim.x) {
      float acc[CPT];
#pragma unroll
      for (int c = 0; c < CPT; c++)
        acc[c] = 0.0f;
      emb_sum<T, CPT, U>(dy, D, pos, a, b, cb + threadIdx.x, blockDim.x, acc, sp);
#pragma unroll
      for (int c = 0; c < CPT; c++) {
        int64_t col = cb + threadIdx.x + (int64_t)c * blockDim.x;
        if (col < D)
          row[col] = from_f<T>(acc[c]);
      }
    }
  }
}

/* Step 5: the heavy rows (a frequent token, padding), split by columns over
 * blocks: block (x, y) sums columns [x blockDim.x, (x + 1) blockDim.x) of
 * heavy row y (grid-stride over both), one column per thread and U
 * positions' loads in flight, so that a row of thousands of positions is
 * spread over many SMs with many loads outstanding. The same order of adds. */
template <class T, int U>
__global__ void k_emb_heavy(const T *__restrict__ dy, int64_t D, const uint32_t *__restrict__ pos,
                            const uint32_t *__restrict__ lo, const uint32_t *__restrict__ hi,
                            const uint32_t *__restrict__ heavy, const uint32_t *nheavy, T *__restrict__ out) {
  __shared__ uint32_t sp[kEmbStage];
  uint32_t cnt = *nheavy;
  for (uint32_t h = blockIdx.y; h < cnt; h += gridDim.y)
    for (int64_t cb = blockIdx.x * (int64_t)blockDim.x; cb < D; cb += (int64_t)gridDim.x * blockDim.x) {
      uint32_t v = heavy[h];
      int64_t col = cb + threadIdx.x;
      float acc[1] = {0.0f};
      emb_sum<T, 1, U>(dy, D, pos, lo[v], hi[v], col, 0, acc, sp);
      if (col < D)
        out[(int64_t)v * D + col] = from_f<T>(acc[0]);
    }
}
/*@end embedding_backward@*/

/*@uses dropout@*/
/* ---------------------------------------------------------------- dropout */

/* Dropout: element j kept iff 2 (r >> 8) + 1 >= t, r = word 0 of
 * philox4x32({j lo, j hi, step lo, step hi}, key); y = x s or +0. x and y
 * may be the same buffer. */
template <class T>
__global__ void k_dropout(const T *x, T *y, int64_t n, uint32_t t, float s, uint2 key, uint32_t s0, uint32_t s1) {
  int64_t i0 = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t j = i0; j < n; j += step) {
    uint32_t r = philox4x32(make_uint4((uint32_t)j, (uint32_t)((uint64_t)j >> 32), s0, s1), key).x;
    float v = to_f(x[j]) * s;
    y[j] = from_f<T>(((r >> 8) << 1 | 1u) >= t ? v : 0.0f);
  }
}
/*@end dropout@*/

/* tgm_cuda_gemm's epilogue where cuBLASLt's cannot express it, over batch x
 * M x N outputs, V per thread-step (V divides N; the host picks V > 1 only
 * when every access is 16-byte aligned):
 *   T = G (the product; 0 when G is NULL) + bias; aux = T; T = act(T) (dact: T *= act'(aux));
 *   T += residual; C = (accumulate ? C : 0) + T, rounded at the store (and, bf16/f16 with an activation,
 *   T before it and act(T) before a residual or accumulation: tgm_rt.h).
 * G has its own row and batch strides: f32 scratch, or C itself when the
 * product was written there (f32; or, for bf16/f16 outputs, the product and
 * bias rounded to C's dtype as PyTorch's linear does; read and written by
 * the same thread). */
/* x rounded to T and back, as if stored and read. */
template <class T, int V> __device__ inline void round_to(float (&x)[V]) {
#pragma unroll
  for (int k = 0; k < V; k++)
    x[k] = to_f(from_f<T>(x[k]));
}
/* The epilogue on V outputs of one row (x: the product, or zeros), o the
 * offset of the first in C's layout, j its column. */
template <class T, int V, class I>
__device__ inline void gemm_epi(float (&x)[V], I o, I j, const T *__restrict__ bias, T *aux, const T *res, T *C, int act,
                                int acc, int dact) {
  if (bias) {
    Vec<T, V> bv = *reinterpret_cast<const Vec<T, V> *>(bias + j);
#pragma unroll
    for (int k = 0; k < V; k++)
      x[k] += to_f(bv.v[k]);
  }
  if (sizeof(T) == 2 && act != TGM_ACT_NONE && !dact) /* bf16/f16: the activation's input in C's dtype (tgm_rt.h) */
    round_to<T>(x);
  if (dact) { /* an activation's backward: times act'(aux), aux read */
    Vec<T, V> av = *reinterpret_cast<const Vec<T, V> *>(aux + o);
#pragma unroll
    for (int k = 0; k < V; k++)
      x[k] *= tgm_gelu_grad(to_f(av.v[k]), act == TGM_ACT_GELU_TANH);
  } else if (aux) {
    Vec<T, V> av;
#pragma unroll
    for (int k = 0; k < V; k++)
      av.v[k] = from_f<T>(x[k]);
    *reinterpret_cast<Vec<T, V> *>(aux + o) = av;
  }
  if (act != TGM_ACT_NONE && !dact) {
#pragma unroll
    for (int k = 0; k < V; k++) /* relu: NaN stays NaN */
      x[k] = act == TGM_ACT_RELU ? (x[k] < 0.0f ? 0.0f : x[k]) : tgm_gelu(x[k], act == TGM_ACT_GELU_TANH);
    if (sizeof(T) == 2 && (res || acc)) /* in C's dtype before the add, as the graph's own op rounds it: the
                                           same bits as a kernel that recomputes it (a mask x == amax(x)) */
      round_to<T>(x);
  }
  if (res) {
    Vec<T, V> rv = *reinterpret_cast<const Vec<T, V> *>(res + o);
#pragma unroll
    for (int k = 0; k < V; k++)
      x[k] += to_f(rv.v[k]);
  }
  Vec<T, V> cv;
  if (acc)
    cv = *reinterpret_cast<const Vec<T, V> *>(C + o);
#pragma unroll
  for (int k = 0; k < V; k++)
    cv.v[k] = from_f<T>(acc ? to_f(cv.v[k]) + x[k] : x[k]);
  *reinterpret_cast<Vec<T, V> *>(C + o) = cv;
}

template <class T, class P, int V, class I>
__global__ void k_gemm_epilogue(const P *G, I gld, I gs, const T *__restrict__ bias, T *aux, const T *res, T *C, I M,
                                I N, I ldc, I sc, I total, int act, int acc, int dact) {
  const I nv = N / V;
  I t = blockIdx.x * (I)blockDim.x + threadIdx.x, step = (I)gridDim.x * blockDim.x;
  for (I i = t; i < total; i += step) {
    I row = i / nv, j = (i - row * nv) * V, b = row / M, m = row - b * M;
    I o = b * sc + m * ldc + j;
    float x[V];
    if (G) {
      Vec<P, V> gv = *reinterpret_cast<const Vec<P, V> *>(G + b * gs + m * gld + j);
#pragma unroll
      for (int k = 0; k < V; k++)
        x[k] = to_f(gv.v[k]);
    } else {
#pragma unroll
      for (int k = 0; k < V; k++)
        x[k] = 0.0f;
    }
    gemm_epi<T, V, I>(x, o, j, bias, aux, res, C, act, acc, dact);
  }
}

/* tgm_cuda_gemm for few rows: f32, M <= 32, B transposed ([N, K], a linear
 * layer's weight), one batch; an MLP at batch 32, where cuBLASLt's kernels
 * take ~10 us for 17 MFLOP. Block (x, y) owns columns [8x, 8x + 8) and rows
 * [8y, 8y + 8) of C; its warps split K in chunks of 128, a lane taking 4
 * consecutive k of each chunk. A lane sums its 8 x 8 products over its
 * chunks in registers; then 5 butterfly steps over the warp each keep half
 * of the sums and add the partner lane's half (62 shuffles), leaving lane l
 * the sums of row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1; the block adds
 * its warps' sums in warp order in shared memory and runs tgm_gemm's
 * epilogue, a thread an output (two with one warp). The same bits every run. VEC: 16-byte loads
 * (K, lda, ldb multiples of 4, A and B 16-byte aligned). */
constexpr int kSmallRows = 32, kSmallWarps = 8;
template <bool VEC>
__device__ inline void small_load4(const float *p, bool row_ok, int64_t left, float (&v)[4]) {
  if (VEC) {
    float4 q = row_ok && left > 0 ? *reinterpret_cast<const float4 *>(p) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
#pragma unroll
    for (int q = 0; q < 4; q++)
      v[q] = row_ok && q < left ? p[q] : 0.0f;
  }
}

/* One butterfly step: lanes whose bit HALF / 2 is set keep the upper HALF
 * of s[0, 2 HALF), the others the lower, each adding its partner's. */
template <int HALF> __device__ inline void small_fold(float (&s)[64], int lane) {
  const bool up = lane & (HALF / 2);
#pragma unroll
  for (int i = 0; i < HALF; i++) {
    float keep = up ? s[HALF + i] : s[i], give = up ? s[i] : s[HALF + i];
    s[i] = keep + __shfl_xor_sync(0xffffffffu, give, HALF / 2);
  }
}

template <bool VEC>
__global__ void k_gemm_small(const float *__restrict__ A, int64_t lda, const float *__restrict__ B, int64_t ldb,
                             int M, int N, int64_t K, const float *__restrict__ bias, float *aux, const float *res,
                             float *C, int64_t ldc, int act, int acc, int dact) {
  __shared__ float part[kSmallWarps][64];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  const int n0 = blockIdx.x * 8, m0 = blockIdx.y * 8;
  float s[64];
#pragma unroll
  for (int i = 0; i < 64; i++)
    s[i] = 0.0f;
  for (int64_t k = (int64_t)(w * 32 + lane) * 4; k < K; k += (int64_t)nw * 128) {
    float a[8][4], b[8][4];
#pragma unroll
    for (int r = 0; r < 8; r++)
      small_load4<VEC>(A + (int64_t)(m0 + r) * lda + k, m0 + r < M, K - k, a[r]);
#pragma unroll
    for (int c = 0; c < 8; c++)
      small_load4<VEC>(B + (int64_t)(n0 + c) * ldb + k, n0 + c < N, K - k, b[c]);
#pragma unroll
    for (int r = 0; r < 8; r++)
#pragma unroll
      for (int c = 0; c < 8; c++)
#pragma unroll
        for (int q = 0; q < 4; q++)
          s[r * 8 + c] = fmaf(a[r][q], b[c][q], s[r * 8 + c]);
  }
  small_fold<32>(s, lane);
  small_fold<16>(s, lane);
  small_fold<8>(s, lane);
  small_fold<4>(s, lane);
  small_fold<2>(s, lane);
  part[w][2 * lane] = s[0];
  part[w][2 * lane + 1] = s[1];
  __syncthreads();
  for (int t = threadIdx.x; t < 64; t += blockDim.x) { /* one warp: two outputs a thread */
    const int m = m0 + t / 8, n = n0 + t % 8;
    float x[1] = {part[0][t]};
    for (int i = 1; i < nw; i++)
      x[0] += part[i][t];
    if (m < M && n < N)
      gemm_epi<float, 1, int64_t>(x, (int64_t)m * ldc + n, (int64_t)n, bias, aux, res, C, act, acc, dact);
  }
}

/* f32 GEMMs on Hopper's tensor cores at f32's accuracy (k_gemm_x3, sm_90a):
 * each operand element x is split into two TF32 parts, x = hi + lo (hi =
 * x rounded to TF32, lo = the rest rounded to TF32), and a b is summed as
 * lo_a hi_b + hi_a lo_b + hi_a hi_b (the lo lo term is below f32's
 * rounding). The tensor cores' sums do not round to nearest, so each K
 * tile of 32 goes into a zeroed partial that is then added to the f32 sums
 * with an ordinary add: the error is then sgemm's (measured: 3.0e-7 to
 * 4.2e-7 of the largest output at K = 516 and 1028, cuBLAS's sgemm 2.0e-7
 * to 3.6e-7; one tensor-core accumulator for all of K was 10-30x that),
 * and mlp_blocks' GEMMs run 55-61 TFLOP/s against sgemm's 52-55
 * (`bench/results/h100_gpu_session13_3xtf32.txt`).
 * A block of 128 x 128 outputs is two warpgroups of 64 rows; a K tile of
 * A and B comes in by cp.async (three stages), A's fragments are split in
 * registers (wgmma's A from registers), B's tile is split into two K-major
 * TF32 tiles in shared memory (core matrices of 8 rows x 16 bytes, no
 * swizzle), made for tile kt + 1 while tile kt's wgmmas run. The epilogue
 * is gemm_epi's. */
constexpr int kX3M = 128, kX3N = 128, kX3K = 32, kX3Stages = 3, kX3Threads = 256;
constexpr int kX3B = kX3N * kX3K; /* floats in one TF32 part of B's tile */
/* a raw tile: rows of K (kc: K contiguous, padded 4) or K rows of R (padded 8): conflict-free fragment reads */
template <bool KC, int R> struct X3Tile {
  enum { ld = KC ? kX3K + 4 : R + 8, size = KC ? R * (kX3K + 4) : kX3K * (R + 8) };
};
template <bool TA, bool TB> constexpr int x3_smem() {
  return (4 * kX3B + kX3Stages * (X3Tile<!TA, kX3M>::size + X3Tile<TB, kX3N>::size)) * (int)sizeof(float);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ uint32_t x3_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ void x3_split(float x, uint32_t &h, uint32_t &l) {
  h = x3_tf32(x);
  l = x3_tf32(x - __uint_as_float(h));
}
__device__ __forceinline__ void x3_cp16(float *s, const float *g, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"((unsigned)__cvta_generic_to_shared(s)), "l"(g),
               "r"(ok ? 16 : 0));
}
/* shared-memory matrix descriptor, no swizzle: lbo bytes between core matrices adjacent in K, sbo in N */
__device__ __forceinline__ uint64_t x3_desc(const float *p, uint32_t lbo, uint32_t sbo) {
  uint64_t a = (unsigned)__cvta_generic_to_shared(p);
  return ((a & 0x3ffff) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}
__device__ __forceinline__ void x3_wgmma(float (&d)[64], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
               "{%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                 "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                 "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                 "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                 "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}
/* tgm_gemm's epilogue on two outputs of a row (columns c and c + 1 < N, at o in C's layout; pair: both
 * at once, 8-byte aligned), out of line: inlined 32 times it slowed the kernel's main loop */
__device__ __noinline__ void x3_epi(float x0, float x1, bool pair, int64_t o, int c, int N, const float *__restrict__ bias,
                                    float *aux, const float *res, float *C, int act, int accum, int dact) {
  if (pair) {
    float x[2] = {x0, x1};
    gemm_epi<float, 2, int64_t>(x, o, (int64_t)c, bias, aux, res, C, act, accum, dact);
    return;
  }
  float a[1] = {x0}, b[1] = {x1};
  if (c < N)
    gemm_epi<float, 1, int64_t>(a, o, (int64_t)c, bias, aux, res, C, act, accum, dact);
  if (c + 1 < N)
    gemm_epi<float, 1, int64_t>(b, o + 1, (int64_t)(c + 1), bias, aux, res, C, act, accum, dact);
}
/* keeps registers an asynchronous wgmma reads or writes where they are until it is waited for */
template <int N_> __device__ __forceinline__ void x3_fence(float (&x)[N_]) {
#pragma unroll
  for (int i = 0; i < N_; i++)
    asm volatile("" : "+f"(x[i])::"memory");
}
__device__ __forceinline__ void x3_fence(uint32_t (&x)[4][4]) {
#pragma unroll
  for (int s = 0; s < 4; s++)
#pragma unroll
    for (int q = 0; q < 4; q++)
      asm volatile("" : "+r"(x[s][q])::"memory");
}
#endif

/* TA: A stored [K, M] (else [M, K]); TB: B stored [N, K] (else [K, N]); V: outputs a thread's epilogue step */
template <bool TA, bool TB, int V>
__global__ void __launch_bounds__(kX3Threads, 1)
    k_gemm_x3(const float *__restrict__ A, int64_t lda, int64_t sa, const float *__restrict__ B, int64_t ldb, int64_t sb,
              int M, int N, int K, const float *__restrict__ bias, float *aux, const float *res, float *C, int64_t ldc,
              int64_t sc, int act, int accum, int dact) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(128) float x3_sm[];
  using TileA = X3Tile<!TA, kX3M>;
  using TileB = X3Tile<TB, kX3N>;
  float *Bhl = x3_sm, *As = x3_sm + 4 * kX3B, *Bs = As + kX3Stages * TileA::size; /* Bhl: [2 buffers][hi, lo] */
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int m0 = blockIdx.y * kX3M, n0 = blockIdx.x * kX3N;
  A += blockIdx.z * sa;
  B += blockIdx.z * sb;
  const int64_t cz = blockIdx.z * sc;
  const int nk = (K + kX3K - 1) / kX3K;
  auto load = [&](int stage, int kt) { /* 1024 16-byte pieces per operand, 4 a thread; outside M, N, K: zeros */
    const int k0 = kt * kX3K;
    float *as = As + stage * TileA::size, *bs = Bs + stage * TileB::size;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int c = tid + i * kX3Threads;
      if (!TA) {
        const int r = c >> 3, kc = (c & 7) * 4;
        const bool ok = m0 + r < M && k0 + kc < K;
        x3_cp16(as + r * TileA::ld + kc, A + (ok ? (int64_t)(m0 + r) * lda + k0 + kc : 0), ok);
      } else {
        const int r = c >> 5, mc = (c & 31) * 4;
        const bool ok = k0 + r < K && m0 + mc < M;
        x3_cp16(as + r * TileA::ld + mc, A + (ok ? (int64_t)(k0 + r) * lda + m0 + mc : 0), ok);
      }
      if (TB) {
        const int r = c >> 3, kc = (c & 7) * 4;
        const bool ok = n0 + r < N && k0 + kc < K;
        x3_cp16(bs + r * TileB::ld + kc, B + (ok ? (int64_t)(n0 + r) * ldb + k0 + kc : 0), ok);
      } else {
        const int r = c >> 5, nc = (c & 31) * 4;
        const bool ok = k0 + r < K && n0 + nc < N;
        x3_cp16(bs + r * TileB::ld + nc, B + (ok ? (int64_t)(k0 + r) * ldb + n0 + nc : 0), ok);
      }
    }
  };
  /* B's tile in stage `stage` as its two TF32 parts in buffer `buf`: word w is k step s = w / 1024, core
   * matrix (j = n / 8, c = which 4 of the step's 8 k), its row n % 8, element k % 4 */
  auto convert = [&](int stage, int buf) {
    const float *bs = Bs + stage * TileB::size;
    float *bh = Bhl + buf * 2 * kX3B, *bl = bh + kX3B;
#pragma unroll
    for (int i = 0; i < kX3B / kX3Threads; i++) {
      const int w = tid + i * kX3Threads, e = w & 3, r = (w >> 2) & 7, c = (w >> 5) & 1, j = (w >> 6) & 15, s = w >> 10;
      const int n = j * 8 + r, k = s * 8 + c * 4 + e;
      uint32_t h, l;
      x3_split(TB ? bs[n * TileB::ld + k] : bs[k * TileB::ld + n], h, l);
      bh[w] = __uint_as_float(h);
      bl[w] = __uint_as_float(l);
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* for the tensor cores' reads */
  };
  float acc[64], p[64];
#pragma unroll
  for (int i = 0; i < 64; i++)
    acc[i] = 0.0f;
#pragma unroll
  for (int s = 0; s < kX3Stages - 1; s++) {
    if (s < nk)
      load(s, s);
    asm volatile("cp.async.commit_group;");
  }
  asm volatile("cp.async.wait_group %0;" ::"n"(kX3Stages - 2));
  __syncthreads();
  convert(0, 0);
  __syncthreads();
  for (int kt = 0; kt < nk; kt++) {
    const float *as = As + (kt % kX3Stages) * TileA::size, *bh = Bhl + (kt & 1) * 2 * kX3B, *bl = bh + kX3B;
    uint32_t ah[4][4], al[4][4]; /* the four k steps' A fragments (m16 x k8 a warp), split */
#pragma unroll
    for (int s = 0; s < 4; s++) {
      const int r = wg * 64 + warp * 16 + g, kk = s * 8;
      float x[4];
      if (!TA) {
        x[0] = as[r * TileA::ld + kk + t];
        x[1] = as[(r + 8) * TileA::ld + kk + t];
        x[2] = as[r * TileA::ld + kk + t + 4];
        x[3] = as[(r + 8) * TileA::ld + kk + t + 4];
      } else {
        x[0] = as[(kk + t) * TileA::ld + r];
        x[1] = as[(kk + t) * TileA::ld + r + 8];
        x[2] = as[(kk + t + 4) * TileA::ld + r];
        x[3] = as[(kk + t + 4) * TileA::ld + r + 8];
      }
#pragma unroll
      for (int q = 0; q < 4; q++)
        x3_split(x[q], ah[s][q], al[s][q]);
    }
    x3_fence(ah);
    x3_fence(al);
    x3_fence(p);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int s = 0; s < 4; s++) {
      const uint64_t dh = x3_desc(bh + s * 1024, 128, 256), dl = x3_desc(bl + s * 1024, 128, 256);
      x3_wgmma(p, al[s], dh, s > 0);
      x3_wgmma(p, ah[s], dl, 1);
      x3_wgmma(p, ah[s], dh, 1);
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    if (kt + 1 < nk) { /* while they run: the next tile in, the one after it asked for, B's next parts made */
      asm volatile("cp.async.wait_group 0;");
      __syncthreads();
      if (kt + kX3Stages - 1 < nk)
        load((kt + kX3Stages - 1) % kX3Stages, kt + kX3Stages - 1);
      asm volatile("cp.async.commit_group;");
      convert((kt + 1) % kX3Stages, (kt + 1) & 1);
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    x3_fence(ah);
    x3_fence(al);
    x3_fence(p);
#pragma unroll
    for (int i = 0; i < 64; i++)
      acc[i] += p[i];
    __syncthreads(); /* B's next parts are in; this tile's buffers are free */
  }
  asm volatile("cp.async.wait_group 0;");
  /* acc[4 i .. 4 i + 3]: rows g and g + 8 of the warp's 16, columns 8 i + 2 t and + 1 */
#pragma unroll
  for (int i = 0; i < 16; i++) {
    const int c = n0 + i * 8 + 2 * t;
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int r = m0 + wg * 64 + warp * 16 + g + 8 * h;
      if (r >= M)
        continue;
      if (V == 0) { /* no epilogue: the sums as they are */
        if (c + 1 < N)
          *reinterpret_cast<float2 *>(C + cz + (int64_t)r * ldc + c) = make_float2(acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
        else if (c < N)
          C[cz + (int64_t)r * ldc + c] = acc[4 * i + 2 * h];
      } else {
        x3_epi(acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1], V == 2 && c + 1 < N, cz + (int64_t)r * ldc + c, c, N, bias, aux,
               res, C, act, accum, dact);
      }
    }
  }
#endif
}

/* Whether this build's wgmma kernels (k_gemm_x3, and flash attention's where the model has it) have their bodies
 * (the sm_90a image is the one loaded). */
__global__ void k_gemm_x3_probe(int *out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *out = 1;
#else
  *out = 0;
#endif
}

/* tgm_gemm's bgrad where cuBLASLt's BGRADB does not take the call:
 * out[m] = sum over k of op(A)[m, k] (ta: A stored [K, M]), a block of 32
 * rows of op(A) by 32 threads each over k, combined in a fixed order. */
template <class T>
__global__ void k_gemm_bgrad(const T *__restrict__ A, int64_t lda, int ta, int64_t M, int64_t K, T *__restrict__ out) {
  __shared__ float part[32][33];
  const int x = threadIdx.x % 32, y = threadIdx.x / 32;
  const int64_t m = blockIdx.x * (int64_t)32 + x;
  float s = 0.0f;
  for (int64_t k = y; m < M && k < K; k += 32)
    s += to_f(ta ? A[k * lda + m] : A[m * lda + k]);
  part[y][x] = s;
  __syncthreads();
  if (y == 0 && m < M) {
    float t = 0.0f;
    for (int j = 0; j < 32; j++)
      t += part[j][x];
    out[m] = from_f<T>(t);
  }
}

/* out[m] = sum over k of A[k lda + m] (op(A) stored transposed, [K, M]: a
 * weight gradient's dy; the bias gradient), V columns a thread in 16-byte
 * vectors (M and lda multiples of V, A 16-byte aligned). A block takes 32
 * vectors of columns, its 8 warps rows k = 8 y + w, 8 (y + gridDim.y), ...;
 * the grid's y is kBgradSplit (a constant: the sums' order, so their bits,
 * do not depend on the GPU). Each block adds its warps' sums in warp order
 * into its row of partials; the column tile's last block adds the rows in
 * order and stores. cuBLASLt's BGRADB, which this replaces where it applies,
 * runs a kernel of its own too. */
constexpr int kBgradSplit = 64;
template <class T, int V>
__global__ void __launch_bounds__(256) k_bgrad_cols(const T *__restrict__ A, int64_t lda, int64_t M, int64_t K,
                                                    float *__restrict__ part, unsigned *count, T *__restrict__ out) {
  __shared__ float s[8][32 * V];
  const int x = threadIdx.x % 32, w = threadIdx.x / 32;
  const int64_t m = (blockIdx.x * (int64_t)32 + x) * V, step = (int64_t)gridDim.y * 8;
  float acc[V] = {};
  int64_t k = blockIdx.y * (int64_t)8 + w;
  if (m < M) {
    for (; k + 3 * step < K; k += 4 * step) { /* four rows' loads in flight, added in row order */
      Vec<T, V> r[4];
#pragma unroll
      for (int u = 0; u < 4; u++)
        r[u] = *reinterpret_cast<const Vec<T, V> *>(A + (k + u * step) * lda + m);
#pragma unroll
      for (int u = 0; u < 4; u++)
#pragma unroll
        for (int q = 0; q < V; q++)
          acc[q] += to_f(r[u].v[q]);
    }
    for (; k < K; k += step) {
      Vec<T, V> r = *reinterpret_cast<const Vec<T, V> *>(A + k * lda + m);
#pragma unroll
      for (int q = 0; q < V; q++)
        acc[q] += to_f(r.v[q]);
    }
  }
#pragma unroll
  for (int q = 0; q < V; q++)
    s[w][q * 32 + x] = acc[q];
  __syncthreads();
  const int c = threadIdx.x;                        /* column c of the tile: vector c / V, element c % V */
  const int64_t col = blockIdx.x * (int64_t)(32 * V) + c;
  if (c < 32 * V && col < M) {
    float t = 0.0f;
    for (int y = 0; y < 8; y++)
      t += s[y][(c % V) * 32 + c / V];
    part[blockIdx.y * M + col] = t;
  }
  if (!tgm_split_last(&count[blockIdx.x]))
    return;
  if (c < 32 * V && col < M) {
    float t = 0.0f;
    for (int y = 0; y < (int)gridDim.y; y++)
      t += __ldcg(part + y * M + col); /* the other blocks' rows, from L2 (as the generated splits read theirs) */
    out[col] = from_f<T>(t);
  }
}

/* ---------------------------------------------------------------- host: geometry */

/*@uses matmul attention@*/
int64_t numel_of(int rank, const int64_t *shape) {
  int64_t n = 1;
  for (int k = 0; k < rank; k++)
    n *= shape[k];
  return n;
}

/* Checks a rank and shape: 0 <= rank <= TGM_MAXRANK, shape non-NULL when
 * needed, no negative dims. */
int check_shape(tgm_cuda_ctx *cx, const char *what, int rank, const int64_t *shape) {
  if (rank < 0 || rank > TGM_MAXRANK)
    return TGM_CUDA_BAD("%s: rank %d is outside [0, %d]", what, rank, TGM_MAXRANK);
  if (rank && !shape)
    return TGM_CUDA_BAD("%s: shape is NULL", what);
  for (int k = 0; k < rank; k++)
    if (shape[k] < 0)
      return TGM_CUDA_BAD("%s: dim %d is negative (%lld)", what, k, (long long)shape[k]);
  return 0;
}

/* Drops size-1 dims and merges dim k into k+1 where every operand steps
 * contiguously (st[k] == st[k+1] * shape[k+1]); rank >= 1 afterwards. */
template <int NOP> void collapse(Geo<NOP> *g) {
  int r = 0;
  for (int k = 0; k < g->rank; k++) {
    if (g->shape[k] == 1)
      continue;
    if (r > 0) {
      bool merge = true;
      for (int p = 0; p < NOP; p++)
        merge = merge && g->st[p][r - 1] == g->st[p][k] * g->shape[k];
      if (merge) {
        g->shape[r - 1] *= g->shape[k];
        for (int p = 0; p < NOP; p++)
          g->st[p][r - 1] = g->st[p][k];
        continue;
      }
    }
    g->shape[r] = g->shape[k];
    for (int p = 0; p < NOP; p++)
      g->st[p][r] = g->st[p][k];
    r++;
  }
  if (r == 0) {
    g->shape[0] = 1;
    for (int p = 0; p < NOP; p++)
      g->st[p][0] = 0;
    r = 1;
  }
  g->rank = r;
}

/*@end matmul attention@*/
/*@uses matmul@*/
/* Element strides that read a contiguous tensor of shape si[ri] at the
 * coordinates of shape so[ro] under NumPy broadcasting; `unit` multiplies
 * every stride (elements per index of these dims). Returns 0 if it does not
 * broadcast. */
int bcast_strides(int ri, const int64_t *si, int ro, const int64_t *so, int64_t unit, int64_t *st) {
  if (ri > ro)
    return 0;
  int64_t s = unit;
  for (int k = 0; k < ro; k++)
    st[k] = 0;
  for (int k = ri - 1; k >= 0; k--) {
    int o = ro - ri + k;
    if (si[k] == so[o])
      st[o] = si[k] == 1 ? 0 : s;
    else if (si[k] != 1)
      return 0;
    s *= si[k];
  }
  return 1;
}

/* Row-major strides of a shape, times unit. */
void contiguous_strides(int rank, const int64_t *shape, int64_t unit, int64_t *st) {
  int64_t s = unit;
  for (int k = rank - 1; k >= 0; k--) {
    st[k] = s;
    s *= shape[k];
  }
}
/*@end matmul@*/

bool aligned(const void *p, size_t a) { return ((uintptr_t)p % a) == 0; }

/* ---------------------------------------------------------------- host: launchers */

template <class TI, class TO, class F> int launch_map1(tgm_cuda_ctx *cx, const void *x, void *y, int64_t n, F f) {
  constexpr int V = 16 / sizeof(TI);
  int vec = aligned(x, 16) && aligned(y, alignof(Vec<TO, V>)) && n >= V;
  k_map1<TI, TO, F>
      <<<grid_for(cx, vec ? n / V : n, kThreads), kThreads, 0, cx->stream>>>((const TI *)x, (TO *)y, n, vec, f);
  TGM_CUDA_LAUNCHED("k_map1");
  return 0;
}

/*@uses linear embedding@*/
/* The widest of 16, 8, 4, 2, 1 bytes that divides every v[i] (copy_rows's unit). */
int unit_for(const int64_t *v, int nv) {
  int u = 16;
  for (int i = 0; i < nv; i++)
    while (u > 1 && v[i] % u)
      u >>= 1;
  return u;
}

template <class U>
int launch_rows(tgm_cuda_ctx *cx, const void *src, int64_t spitch, void *dst, int64_t dpitch, int64_t rows, int64_t w,
                const int32_t *idx, int64_t V) {
  int bx = 32;
  while (bx < 256 && bx < w)
    bx *= 2;
  dim3 block(bx, kThreads / bx);
  int64_t nb = (rows + block.y - 1) / block.y, cap = (int64_t)cx->sms * 16;
  k_rows<U><<<(unsigned)(nb < cap ? nb : cap), block, 0, cx->stream>>>((const U *)src, spitch, (U *)dst, dpitch, rows,
                                                                       w, idx, V, cx->d_bad);
  TGM_CUDA_LAUNCHED("k_rows");
  return 0;
}

/* dst[p, 0:wb) = src[p (or idx[p]), 0:wb) in bytes, rows with byte pitches. */
int copy_rows(tgm_cuda_ctx *cx, const void *src, int64_t spb, void *dst, int64_t dpb, int64_t rows, int64_t wb,
              const int32_t *idx, int64_t V) {
  if (rows == 0 || wb == 0)
    return 0;
  int64_t q[5] = {(int64_t)(uintptr_t)src, (int64_t)(uintptr_t)dst, spb, dpb, wb};
  int u = unit_for(q, 5);
  switch (u) {
  case 16: return launch_rows<uint4>(cx, src, spb / 16, dst, dpb / 16, rows, wb / 16, idx, V);
  case 8: return launch_rows<uint2>(cx, src, spb / 8, dst, dpb / 8, rows, wb / 8, idx, V);
  case 4: return launch_rows<uint32_t>(cx, src, spb / 4, dst, dpb / 4, rows, wb / 4, idx, V);
  case 2: return launch_rows<uint16_t>(cx, src, spb / 2, dst, dpb / 2, rows, wb / 2, idx, V);
  default: return launch_rows<uint8_t>(cx, src, spb, dst, dpb, rows, wb, idx, V);
  }
}
/*@end linear embedding@*/

/* ---------------------------------------------------------------- host: GEMM */

cudaDataType_t blas_type(int dt) { return dt == TGM_F32 ? CUDA_R_32F : dt == TGM_BF16 ? CUDA_R_16BF : CUDA_R_16F; }

/*@uses attention matmul linear@*/
/* Column-major C[m, n] (+ batch) = alpha op(A) op(B) + beta C through
 * cublasGemmEx / cublasGemmStridedBatchedEx, f32 compute (no TF32). A stride
 * of 0 broadcasts an operand over the batch. k == 0 writes beta * C, i.e.
 * zeros, as if C were contiguous (so it is wherever k can be 0 here: the
 * attention calls handle no keys or queries before their GEMMs). */
int gemm(tgm_cuda_ctx *cx, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, float alpha,
         const void *A, cudaDataType_t tA, int64_t lda, int64_t sA, const void *B, cudaDataType_t tB, int64_t ldb,
         int64_t sB, float beta, void *C, cudaDataType_t tC, int64_t ldc, int64_t sC, int64_t batch) {
  if (m == 0 || n == 0 || batch == 0)
    return 0;
  size_t ces = tC == CUDA_R_32F ? 4 : 2;
  if (k == 0) {
    if (beta != 0.0f)
      return TGM_CUDA_BAD("internal: gemm with k = 0 and beta != 0");
    TGM_CUDA_TRY(cudaMemsetAsync(C, 0, (size_t)(m * n * batch) * ces, cx->stream));
    return 0;
  }
  const int64_t big = INT_MAX;
  if (m > big || n > big || k > big || lda > big || ldb > big || ldc > big)
    return TGM_CUDA_BAD("GEMM of %lld x %lld x %lld is too large for cuBLAS's int dims", (long long)m, (long long)n,
                        (long long)k);
  for (int64_t b0 = 0; b0 < batch; b0 += 65535) {
    int64_t nb = batch - b0 < 65535 ? batch - b0 : 65535;
    const char *pa = (const char *)A + (size_t)(b0 * sA) * (tA == CUDA_R_32F ? 4 : 2);
    const char *pb = (const char *)B + (size_t)(b0 * sB) * (tB == CUDA_R_32F ? 4 : 2);
    char *pc = (char *)C + (size_t)(b0 * sC) * ces;
    if (nb == 1)
      TGM_CUDA_BLAS(cublasGemmEx(cx->blas, ta, tb, (int)m, (int)n, (int)k, &alpha, pa, tA, (int)lda, pb, tB, (int)ldb,
                                 &beta, pc, tC, (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else
      TGM_CUDA_BLAS(cublasGemmStridedBatchedEx(cx->blas, ta, tb, (int)m, (int)n, (int)k, &alpha, pa, tA, (int)lda, sA,
                                               pb, tB, (int)ldb, sB, &beta, pc, tC, (int)ldc, sC, (int)nb,
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  return 0;
}
/*@end attention matmul linear@*/

/* ---------------------------------------------------------------- host: cuBLASLt plans (tgm_cuda_gemm) */

/* The alignment cuBLASLt may assume of a pointer (and of its batch steps):
 * the largest power of two dividing both, at most 256 (NULL: 256). */
uint32_t lt_align(const void *p, int64_t step_bytes) {
  uint64_t v = (uint64_t)(uintptr_t)p | (uint64_t)step_bytes;
  uint64_t a = v & (~v + 1);
  return v == 0 || a > 256 ? 256u : (uint32_t)a;
}

void lt_plan_free(tgm_cuda_gemm_plan *p) {
  if (p->d)
    cublasLtMatrixLayoutDestroy(p->d);
  if (p->c)
    cublasLtMatrixLayoutDestroy(p->c);
  if (p->b)
    cublasLtMatrixLayoutDestroy(p->b);
  if (p->a)
    cublasLtMatrixLayoutDestroy(p->a);
  if (p->op)
    cublasLtMatmulDescDestroy(p->op);
  memset(p, 0, sizeof *p);
}

/* A column-major rows x cols layout of type t, leading dim ld, `batch`
 * matrices `stride` elements apart. */
cublasStatus_t lt_layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld,
                         int32_t batch, int64_t stride) {
  cublasStatus_t s = cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld);
  if (s == CUBLAS_STATUS_SUCCESS && batch > 1) {
    s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
  }
  return s;
}

/* The heuristic's constraints for key k: the shared workspace, split K only
 * with f32 partial sums (no reduction in the output type), the pointers'
 * alignment. */
cublasStatus_t lt_preference(const tgm_cuda_gemm_key *k, cublasLtMatmulPreference_t *out) {
  uint64_t ws = TGM_CUDA_BLAS_WS;
  uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  cublasLtMatmulPreference_t pref;
  cublasStatus_t s = cublasLtMatmulPreferenceCreate(&pref);
  if (s != CUBLAS_STATUS_SUCCESS)
    return s;
  s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask);
  static const cublasLtMatmulPreferenceAttributes_t al[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; i++)
    s = cublasLtMatmulPreferenceSetAttribute(pref, al[i], &k->align[i], sizeof k->align[i]);
  if (s != CUBLAS_STATUS_SUCCESS)
    cublasLtMatmulPreferenceDestroy(pref);
  else
    *out = pref;
  return s;
}

/* ---------------------------------------------------------------- autotune */

/* compile.mode max-autotune (tgm_cuda_set_tune): the first call of a GEMM
 * shape times up to TGM_CUDA_TUNE_CANDIDATES of the heuristic's algorithms
 * on its own operands (into a temporary output: the call's result is
 * untouched; a warm-up, then 5 calls each) and keeps the fastest when it
 * beats the heuristic's first choice by 3% (less is the timing's noise)
 * and that choice takes at least 20 us.
 * The choices go to a text file, one line per GEMM, sorted, rewritten
 * atomically after each new choice; a file written on another GPU or
 * cuBLASLt version, or a choice cuBLASLt no longer accepts, is ignored
 * (that GEMM is timed again). */
const char kTuneMagic[] = "# tgen max-autotune: cuBLASLt's algorithm per GEMM, timed on this GPU";

void tune_identity(tgm_cuda_ctx *cx, char *gpu, size_t n, size_t *lt_version) {
  cudaDeviceProp prop;
  snprintf(gpu, n, "unknown");
  if (cudaGetDeviceProperties(&prop, cx->device) == cudaSuccess)
    snprintf(gpu, n, "%s", prop.name);
  *lt_version = cublasLtGetVersion();
}

const tgm_cuda_tune *tune_find(tgm_cuda_ctx *cx, const tgm_cuda_gemm_key *k);

void tune_read(tgm_cuda_ctx *cx) {
  cx->tune_read = 1;
  FILE *f = cx->tune_file[0] ? fopen(cx->tune_file, "r") : NULL;
  if (!f)
    return;
  char line[1024], gpu[256], want_gpu[256];
  size_t want_v, v = 0;
  tune_identity(cx, want_gpu, sizeof want_gpu, &want_v);
  int ok = fgets(line, sizeof line, f) && !strncmp(line, kTuneMagic, strlen(kTuneMagic)) &&
           fgets(line, sizeof line, f) && sscanf(line, "gpu %255[^\n]", gpu) == 1 && !strcmp(gpu, want_gpu) &&
           fgets(line, sizeof line, f) && sscanf(line, "cublaslt %zu", &v) == 1 && v == want_v;
  while (ok && cx->ntunes < TGM_CUDA_TUNES && fgets(line, sizeof line, f)) {
    tgm_cuda_tune t;
    memset(&t, 0, sizeof t);
    tgm_cuda_gemm_key *k = &t.key;
    unsigned long long a[8];
    long long M, N, K, lda, ldb, ldd, sa, sb, sd;
    if (sscanf(line,
               "gemm dt %d d_f32 %d ta %d tb %d batch %d beta1 %d epilogue %u align %u %u %u %u %u %u M %lld N %lld "
               "K %lld lda %lld ldb %lld ldd %lld sa %lld sb %lld sd %lld algo %llx %llx %llx %llx %llx %llx %llx %llx",
               &k->dt, &k->d_f32, &k->ta, &k->tb, &k->batch, &k->beta1, &k->epilogue, &k->align[0], &k->align[1],
               &k->align[2], &k->align[3], &k->align[4], &k->align[5], &M, &N, &K, &lda, &ldb, &ldd, &sa, &sb, &sd,
               &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6], &a[7]) != 30)
      continue;
    k->M = M, k->N = N, k->K = K, k->lda = lda, k->ldb = ldb, k->ldd = ldd, k->sa = sa, k->sb = sb, k->sd = sd;
    for (int i = 0; i < 8; i++)
      t.algo.data[i] = a[i];
    if (!tune_find(cx, k))
      cx->tunes[cx->ntunes++] = t;
  }
  fclose(f);
}

const tgm_cuda_tune *tune_find(tgm_cuda_ctx *cx, const tgm_cuda_gemm_key *k) {
  if (!cx->tune_read)
    tune_read(cx);
  for (int i = 0; i < cx->ntunes; i++)
    if (!memcmp(&cx->tunes[i].key, k, sizeof *k))
      return &cx->tunes[i];
  return NULL;
}

int tune_cmp(const void *a, const void *b) {
  return memcmp(&((const tgm_cuda_tune *)a)->key, &((const tgm_cuda_tune *)b)->key, sizeof(tgm_cuda_gemm_key));
}

/* The choices, sorted by key, to tune_file (through a temporary and a
 * rename: a reader never sees half a file). Best effort: a file that cannot
 * be written leaves the choices in memory. */
void tune_write(tgm_cuda_ctx *cx) {
  if (!cx->tune_file[0])
    return;
  char tmp[600], gpu[256];
  size_t v;
  tune_identity(cx, gpu, sizeof gpu, &v);
  snprintf(tmp, sizeof tmp, "%s.tmp", cx->tune_file);
  FILE *f = fopen(tmp, "w");
  if (!f)
    return;
  qsort(cx->tunes, (size_t)cx->ntunes, sizeof *cx->tunes, tune_cmp);
  fprintf(f, "%s (delete it to time again)\ngpu %s\ncublaslt %zu\n", kTuneMagic, gpu, v);
  for (int i = 0; i < cx->ntunes; i++) {
    const tgm_cuda_tune *t = &cx->tunes[i];
    const tgm_cuda_gemm_key *k = &t->key;
    fprintf(f,
            "gemm dt %d d_f32 %d ta %d tb %d batch %d beta1 %d epilogue %u align %u %u %u %u %u %u M %lld N %lld K %lld "
            "lda %lld ldb %lld ldd %lld sa %lld sb %lld sd %lld algo",
            k->dt, k->d_f32, k->ta, k->tb, k->batch, k->beta1, k->epilogue, k->align[0], k->align[1], k->align[2],
            k->align[3], k->align[4], k->align[5], (long long)k->M, (long long)k->N, (long long)k->K, (long long)k->lda,
            (long long)k->ldb, (long long)k->ldd, (long long)k->sa, (long long)k->sb, (long long)k->sd);
    for (int j = 0; j < 8; j++)
      fprintf(f, " %llx", (unsigned long long)t->algo.data[j]);
    if (t->ms > 0)
      fprintf(f, "  # %.4f ms, the heuristic's first choice %.4f ms", t->ms, t->heuristic_ms);
    fprintf(f, "\n");
  }
  int bad = ferror(f);
  if (fclose(f) || bad || rename(tmp, cx->tune_file))
    remove(tmp);
}

/* Epilogues that write an aux matrix in D's layout (GELU_AUX). */
static bool lt_uses_aux(uint32_t epi) { return epi == CUBLASLT_EPILOGUE_GELU_AUX || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }

/* Times plan p's candidates on the call's operands (A, B, and C when beta
 * is 1) into temporary D and aux of dbytes each, and keeps the fastest in
 * p and in the choices. Any failure leaves the heuristic's choice. */
void lt_tune(tgm_cuda_ctx *cx, tgm_cuda_gemm_plan *p, const void *A, const void *B, const void *C, float beta,
             const void *bias, size_t dbytes) {
  p->tuned = 1;
  if (cx->ntunes >= TGM_CUDA_TUNES)
    return;
  const bool gelu_aux = lt_uses_aux(p->key.epilogue);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulHeuristicResult_t r[TGM_CUDA_TUNE_CANDIDATES];
  int n = 0;
  if (lt_preference(&p->key, &pref) != CUBLAS_STATUS_SUCCESS)
    return;
  cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(cx->lt, p->op, p->a, p->b, p->c, p->d, pref, TGM_CUDA_TUNE_CANDIDATES, r, &n);
  cublasLtMatmulPreferenceDestroy(pref);
  void *D = NULL, *aux = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL;
  if (s != CUBLAS_STATUS_SUCCESS || n < 1 || dev_malloc(cx, &D, dbytes) != cudaSuccess ||
      (gelu_aux && dev_malloc(cx, &aux, dbytes) != cudaSuccess) || cudaEventCreate(&e0) != cudaSuccess ||
      cudaEventCreate(&e1) != cudaSuccess)
    goto done;
  {
    const float alpha = 1.0f;
    const void *Cp = beta != 0.0f ? C : D;
    float best = 0, first = 0;
    int bi = -1;
    if (bias)
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    if (aux)
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
    for (int i = 0; i < n; i++) {
      if (r[i].state != CUBLAS_STATUS_SUCCESS)
        continue;
      const cublasLtMatmulAlgo_t *al = &r[i].algo;
      bool ok = cublasLtMatmul(cx->lt, p->op, &alpha, B, p->a, A, p->b, &beta, Cp, p->c, D, p->d, al, cx->blas_ws,
                               TGM_CUDA_BLAS_WS, cx->stream) == CUBLAS_STATUS_SUCCESS; /* the warm-up */
      ok = ok && cudaEventRecord(e0, cx->stream) == cudaSuccess;
      for (int rep = 0; ok && rep < 5; rep++)
        ok = cublasLtMatmul(cx->lt, p->op, &alpha, B, p->a, A, p->b, &beta, Cp, p->c, D, p->d, al, cx->blas_ws,
                            TGM_CUDA_BLAS_WS, cx->stream) == CUBLAS_STATUS_SUCCESS;
      float ms = 0;
      ok = ok && cudaEventRecord(e1, cx->stream) == cudaSuccess && cudaEventSynchronize(e1) == cudaSuccess &&
           cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess;
      if (!ok) {
        cudaGetLastError(); /* a candidate that fails is skipped */
        continue;
      }
      ms /= 5;
      if (i == 0)
        first = ms;
      if (bi < 0 || ms < best)
        bi = i, best = ms;
    }
    /* within the timing's noise, or a GEMM of a few microseconds (launch-bound: five calls in a row do
       not tell its time among other kernels; measured: mlp3's tuned GEMMs were slower in its pass):
       the heuristic's choice stays */
    if (first > 0 && (best > 0.97f * first || first < 0.02f))
      bi = 0, best = first;
    if (bi >= 0) {
      p->algo = r[bi].algo;
      tgm_cuda_tune *t = &cx->tunes[cx->ntunes++];
      t->key = p->key;
      t->algo = r[bi].algo;
      t->ms = best;
      t->heuristic_ms = first;
      tune_write(cx);
    }
  }
done:
  if (e0)
    cudaEventDestroy(e0);
  if (e1)
    cudaEventDestroy(e1);
  if (D || aux)
    cudaStreamSynchronize(cx->stream);
  dev_free(cx, D);
  dev_free(cx, aux);
}


/* Builds plan p for key k: row-major D [M, N] = op(A) op(B) is the
 * column-major D^T [N, M] = op(B)^T op(A)^T, so cuBLASLt's A is our B (its
 * transpose flag ours, its stored shape N x K or K x N column-major) and its
 * B our A. f32 compute and scale type; aux (GELU_AUX) in D's layout. The
 * heuristic sees the actual bias and aux pointers (their alignment), may use
 * the shared workspace, and may only split K with f32 partial sums (no
 * reduction in the output type). Returns 0 (p->ok = 0 when no algorithm
 * fits) or a cuBLAS error. */
int lt_plan_build(tgm_cuda_ctx *cx, tgm_cuda_gemm_plan *p, const tgm_cuda_gemm_key *k, const void *bias,
                  const void *aux) {
  memset(p, 0, sizeof *p);
  memcpy(&p->key, k, sizeof *k);
  cudaDataType_t tab = blas_type(k->dt), td = k->d_f32 ? CUDA_R_32F : tab;
  cublasOperation_t opa = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtMatmulPreference_t pref = NULL;
  cublasStatus_t s;
  const char *what = "cublasLtMatmulDescCreate";
#define TGM_LT(call, name)                                                                                             \
  if ((s = (call)) != CUBLAS_STATUS_SUCCESS) {                                                                         \
    what = name;                                                                                                       \
    goto fail;                                                                                                         \
  }
  TGM_LT(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  TGM_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), "setting TRANSA");
  TGM_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), "setting TRANSB");
  TGM_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &k->epilogue, sizeof k->epilogue),
         "setting the epilogue");
  if ((k->epilogue & CUBLASLT_EPILOGUE_BIAS) || k->epilogue == CUBLASLT_EPILOGUE_BGRADB)
    TGM_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
           "setting BIAS_POINTER");
  if (lt_uses_aux(k->epilogue)) {
    int64_t ld = k->ldd, st = k->sd;
    TGM_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux),
           "setting EPILOGUE_AUX_POINTER");
    TGM_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld),
           "setting EPILOGUE_AUX_LD");
    if (k->batch > 1)
      TGM_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &st, sizeof st),
             "setting EPILOGUE_AUX_BATCH_STRIDE");
  }
  TGM_LT(lt_layout(&p->a, tab, k->tb ? k->K : k->N, k->tb ? k->N : k->K, k->ldb, k->batch, k->sb), "layout of B");
  TGM_LT(lt_layout(&p->b, tab, k->ta ? k->M : k->K, k->ta ? k->K : k->M, k->lda, k->batch, k->sa), "layout of A");
  TGM_LT(lt_layout(&p->c, td, k->N, k->M, k->ldd, k->batch, k->sd), "layout of C");
  TGM_LT(lt_layout(&p->d, td, k->N, k->M, k->ldd, k->batch, k->sd), "layout of D");
  {
    TGM_LT(lt_preference(k, &pref), "creating the matmul preference");
    cublasLtMatmulHeuristicResult_t r;
    int n = 0;
    memset(&r, 0, sizeof r);
    s = cublasLtMatmulAlgoGetHeuristic(cx->lt, p->op, p->a, p->b, p->c, p->d, pref, 1, &r, &n);
    cublasLtMatmulPreferenceDestroy(pref);
    pref = NULL;
    if (s == CUBLAS_STATUS_SUCCESS && n > 0 && r.state == CUBLAS_STATUS_SUCCESS) {
      p->algo = r.algo;
      p->ok = 1;
      const tgm_cuda_tune *t = cx->tune ? tune_find(cx, k) : NULL;
      cublasLtMatmulHeuristicResult_t chk;
      if (t && cublasLtMatmulAlgoCheck(cx->lt, p->op, p->a, p->b, p->c, p->d, &t->algo, &chk) == CUBLAS_STATUS_SUCCESS &&
          chk.state == CUBLAS_STATUS_SUCCESS && chk.workspaceSize <= TGM_CUDA_BLAS_WS)
        p->algo = t->algo, p->tuned = 1;
    } else if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED) {
      what = "cublasLtMatmulAlgoGetHeuristic";
      goto fail;
    }
  }
#undef TGM_LT
  p->used = 1;
  return 0;
fail:
  if (pref)
    cublasLtMatmulPreferenceDestroy(pref);
  lt_plan_free(p);
  return blas_fail(cx, s, what);
}

/* The cached plan for key k, built on a miss (replacing the oldest). */
int lt_plan_get(tgm_cuda_ctx *cx, const tgm_cuda_gemm_key *k, const void *bias, const void *aux,
                tgm_cuda_gemm_plan **out) {
  for (int i = 0; i < TGM_CUDA_GEMM_PLANS; i++)
    if (cx->plans[i].used && memcmp(&cx->plans[i].key, k, sizeof *k) == 0) {
      *out = &cx->plans[i];
      return 0;
    }
  tgm_cuda_gemm_plan *p = &cx->plans[cx->next_plan];
  cx->next_plan = (cx->next_plan + 1) % TGM_CUDA_GEMM_PLANS;
  lt_plan_free(p);
  *out = p;
  return lt_plan_build(cx, p, k, bias, aux);
}

/* One cuBLASLt matmul of g's A and B (K > 0) into D, of dtype g->dt or f32
 * (d_f32), row-major with row stride ldd and batch stride sd: D = op(A) op(B)
 * + beta Cin (Cin in D's layout; beta 0 or 1) through epilogue epi, with g's
 * bias and aux where epi uses them. Batches go 65535 per call. *none is set
 * (and nothing enqueued) when cuBLASLt has no algorithm for it (the caller
 * then takes another path). */
int lt_matmul(tgm_cuda_ctx *cx, const tgm_gemm *g, void *D, int d_f32, int64_t ldd, int64_t sd, const void *Cin,
              float beta, uint32_t epi, bool *none) {
  const int64_t es = dt_size(g->dt), des = d_f32 ? 4 : es;
  const void *bias = (epi & CUBLASLT_EPILOGUE_BIAS) ? g->bias : epi == CUBLASLT_EPILOGUE_BGRADB ? g->bgrad : NULL;
  const bool gelu_aux = lt_uses_aux(epi);
  const float alpha = 1.0f;
  *none = false;
  for (int64_t b0 = 0; b0 < g->batch; b0 += 65535) {
    int32_t nb = (int32_t)(g->batch - b0 < 65535 ? g->batch - b0 : 65535);
    const char *A = (const char *)g->A + b0 * g->sa * es, *B = (const char *)g->B + b0 * g->sb * es;
    char *Dp = (char *)D + b0 * sd * des, *aux = gelu_aux ? (char *)g->aux + b0 * sd * des : NULL;
    const char *Cp = beta != 0.0f ? (const char *)Cin + b0 * sd * des : Dp;
    tgm_cuda_gemm_key k;
    memset(&k, 0, sizeof k);
    k.dt = g->dt;
    k.d_f32 = d_f32;
    k.ta = g->ta;
    k.tb = g->tb;
    k.batch = nb;
    k.beta1 = beta != 0.0f;
    k.epilogue = epi;
    int64_t step = nb > 1 ? 1 : 0;
    k.align[0] = lt_align(B, step * g->sb * es); /* cuBLASLt's A is our B */
    k.align[1] = lt_align(A, step * g->sa * es);
    k.align[2] = lt_align(Cp, step * sd * des);
    k.align[3] = lt_align(Dp, step * sd * des);
    k.align[4] = bias ? lt_align(bias, 0) : 0;
    k.align[5] = aux ? lt_align(aux, step * sd * des) : 0;
    k.M = g->M;
    k.N = g->N;
    k.K = g->K;
    k.lda = g->lda;
    k.ldb = g->ldb;
    k.ldd = ldd;
    k.sa = nb > 1 ? g->sa : 0;
    k.sb = nb > 1 ? g->sb : 0;
    k.sd = nb > 1 ? sd : 0;
    tgm_cuda_gemm_plan *p;
    int rc = lt_plan_get(cx, &k, bias, aux, &p);
    if (rc)
      return rc;
    if (!p->ok) { /* (after a first piece ran, no falling back: it may have accumulated) */
      if (b0 > 0)
        return fail(cx, (int)CUBLAS_STATUS_NOT_SUPPORTED, "cuBLASLt has no algorithm for batch elements %lld..",
                    (long long)b0);
      *none = true;
      return 0;
    }
    if (cx->tune && !p->tuned && !cx->capturing)
      lt_tune(cx, p, A, B, Cp, beta, bias,
              (size_t)(((int64_t)nb - 1) * k.sd + (g->M - 1) * ldd + g->N) * (size_t)des);
    if (bias)
      TGM_CUDA_BLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (aux)
      TGM_CUDA_BLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    TGM_CUDA_BLAS(cublasLtMatmul(cx->lt, p->op, &alpha, B, p->a, A, p->b, &beta, Cp, p->c, Dp, p->d, &p->algo,
                                 cx->blas_ws, TGM_CUDA_BLAS_WS, cx->stream));
  }
  return 0;
}

/* The cuBLASLt epilogue (and beta, and C operand) that does all of g's
 * epilogue in the matmul, writing g->C in g's dtype: none/relu/tanh-gelu
 * with or without bias; tanh-gelu's aux (GELU_AUX, when its leading dim and
 * batch stride are multiples of 8, as cuBLASLt asks); a residual or the old
 * C through beta = 1 (C operand = residual, or C itself) without an
 * activation. Returns false for what needs k_gemm_epilogue: erf gelu, an
 * activation followed by a residual or accumulation, aux without tanh-gelu,
 * a residual and accumulation together. */
bool lt_epilogue_for(const tgm_gemm *g, uint32_t *epi, float *beta, const void **cin) {
  const bool bias = g->bias != NULL;
  *beta = 0.0f;
  *cin = NULL;
  if (g->bgrad) { /* the sum over k of op(A), cuBLASLt's B: BGRADB, with nothing else */
    *epi = CUBLASLT_EPILOGUE_BGRADB;
    return !bias && g->act == TGM_ACT_NONE && !g->aux && !g->residual && !g->accumulate;
  }
  switch (g->act) {
  case TGM_ACT_NONE:
    if (g->aux || (g->residual && g->accumulate))
      return false;
    *epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (g->residual || g->accumulate) {
      *beta = 1.0f;
      *cin = g->residual ? g->residual : g->C;
    }
    return true;
  case TGM_ACT_RELU:
    if (g->aux || g->residual || g->accumulate)
      return false;
    *epi = bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    return true;
  case TGM_ACT_GELU_TANH:
    if (g->residual || g->accumulate)
      return false;
    if (g->dact) /* DGELU: cuBLASLt 13.0 runs it as a kernel of its own after the product, 0.39 ms for GPT-2's
                    [16384, 3072] (H100), three times k_gemm_epilogue's time for the same pass over C and aux */
      return false;
    if (g->aux) {
      if (g->ldc % 8 || (g->batch > 1 && g->sc % 8))
        return false;
      *epi = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    } else {
      *epi = bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    }
    return true;
  default: return false; /* erf gelu */
  }
}

/* Launches k_gemm_epilogue over g's outputs, the product read from G (f32,
 * or T when g_in_dt; row stride gld, batch stride gs; NULL: zeros). 16-byte
 * vectors when N and every stride and pointer allow. */
template <class T, class P>
int launch_gemm_epilogue(tgm_cuda_ctx *cx, const tgm_gemm *g, const P *G, int64_t gld, int64_t gs) {
  constexpr int V = 16 / sizeof(T);
  const int64_t bstep = g->batch > 1 ? 1 : 0;
  bool vec = g->N % V == 0 && g->ldc % V == 0 && (bstep * g->sc) % V == 0 && aligned(g->C, 16) &&
             (!g->bias || aligned(g->bias, 16)) && (!g->aux || aligned(g->aux, 16)) &&
             (!g->residual || aligned(g->residual, 16)) &&
             (!G || (aligned(G, 16) && gld % V == 0 && (bstep * gs) % V == 0));
  int64_t rows = g->batch * g->M, total = rows * (vec ? g->N / V : g->N);
  unsigned grid = grid_for(cx, total, kThreads);
  /* int indices where every offset fits (a 64-bit division costs tens of instructions per element) */
  int64_t last_c = (g->batch - 1) * bstep * g->sc + (g->M - 1) * g->ldc + g->N,
          last_g = G ? (g->batch - 1) * bstep * gs + (g->M - 1) * gld + g->N : 0;
  bool small = total < INT_MAX / 2 && last_c < INT_MAX / 2 && last_g < INT_MAX / 2;
  const T *bias = (const T *)g->bias, *res = (const T *)g->residual;
  T *aux = (T *)g->aux, *C = (T *)g->C;
  if (vec && small)
    k_gemm_epilogue<T, P, V, int><<<grid, kThreads, 0, cx->stream>>>(G, (int)gld, (int)(bstep * gs), bias, aux, res, C, (int)g->M,
                                                                    (int)g->N, (int)g->ldc, (int)(bstep * g->sc), (int)total,
                                                                    g->act, g->accumulate, g->dact);
  else if (vec)
    k_gemm_epilogue<T, P, V, int64_t><<<grid, kThreads, 0, cx->stream>>>(G, gld, gs, bias, aux, res, C, g->M, g->N, g->ldc,
                                                                        g->sc, total, g->act, g->accumulate, g->dact);
  else
    k_gemm_epilogue<T, P, 1, int64_t><<<grid, kThreads, 0, cx->stream>>>(G, gld, gs, bias, aux, res, C, g->M, g->N, g->ldc,
                                                                        g->sc, total, g->act, g->accumulate, g->dact);
  TGM_CUDA_LAUNCHED("k_gemm_epilogue");
  return 0;
}

int gemm_epilogue(tgm_cuda_ctx *cx, const tgm_gemm *g, const void *G, int g_in_dt, int64_t gld, int64_t gs) {
  switch (g->dt) {
  case TGM_BF16:
    return g_in_dt ? launch_gemm_epilogue<bf16>(cx, g, (const bf16 *)G, gld, gs)
                   : launch_gemm_epilogue<bf16>(cx, g, (const float *)G, gld, gs);
  case TGM_F16:
    return g_in_dt ? launch_gemm_epilogue<f16>(cx, g, (const f16 *)G, gld, gs)
                   : launch_gemm_epilogue<f16>(cx, g, (const float *)G, gld, gs);
  default: return launch_gemm_epilogue<float>(cx, g, (const float *)G, gld, gs);
  }
}

/* g (K > 0) as the f32 product in scratch, then k_gemm_epilogue: in pieces
 * of at most TGM_CUDA_GEMM_BUDGET bytes of product (whole batch elements
 * when one fits, else row blocks of one), each a smaller tgm_gemm. */
int gemm_via_scratch(tgm_cuda_ctx *cx, const tgm_gemm *g) {
  const int64_t es = dt_size(g->dt), per_b = g->M * g->N * 4;
  int64_t nb = g->batch, rows = g->M;
  if (nb * per_b > (int64_t)TGM_CUDA_GEMM_BUDGET) {
    nb = per_b > 0 ? (int64_t)TGM_CUDA_GEMM_BUDGET / per_b : 1;
    if (nb < 1) {
      nb = 1;
      rows = (int64_t)TGM_CUDA_GEMM_BUDGET / (g->N * 4);
      if (rows < 1)
        rows = 1;
    }
  }
  for (int64_t b0 = 0; b0 < g->batch; b0 += nb)
    for (int64_t m0 = 0; m0 < g->M; m0 += rows) {
      tgm_gemm p = *g;
      int64_t oc = (b0 * g->sc + m0 * g->ldc) * es;
      p.batch = g->batch - b0 < nb ? g->batch - b0 : nb;
      p.M = g->M - m0 < rows ? g->M - m0 : rows;
      p.A = (const char *)g->A + (b0 * g->sa + m0 * (g->ta ? 1 : g->lda)) * es;
      p.B = (const char *)g->B + b0 * g->sb * es;
      p.C = (char *)g->C + oc;
      p.aux = g->aux ? (char *)g->aux + oc : NULL;
      p.residual = g->residual ? (const char *)g->residual + oc : NULL;
      void *G;
      bool none;
      int rc = scratch(cx, (size_t)(p.batch * p.M * p.N * 4), &G);
      if (!rc)
        rc = lt_matmul(cx, &p, G, 1, p.N, p.M * p.N, NULL, 0.0f, CUBLASLT_EPILOGUE_DEFAULT, &none);
      if (!rc && none)
        rc = fail(cx, (int)CUBLAS_STATUS_NOT_SUPPORTED,
                  "cuBLASLt has no algorithm for this GEMM (%s, %lld x %lld x %lld)",
                  dt_name(p.dt), (long long)p.M, (long long)p.N, (long long)p.K);
      if (!rc)
        rc = gemm_epilogue(cx, &p, G, 0, p.N, p.M * p.N);
      if (rc)
        return rc;
    }
  return 0;
}

/*@uses matmul attention@*/
/* Batch dims of several operands over an output batch shape, collapsed; the
 * last collapsed dim runs inside a strided-batched call and the others in a
 * host loop (usually there are none). The flash attention kernels take the
 * last two dims inside a launch (a head and a batch dim whose strides do not
 * merge: q in GPT-2's packed qkv), the others in a host loop of outer2. */
template <int NOP> struct BatchWalk {
  Geo<NOP> g;
  int64_t outer, inner; /* host iterations, batch count per call */
  int64_t outer2, mid;  /* with the last two dims inside: host iterations, the size of the dim before the last */
  void init(int rank, const int64_t *shape, int64_t st[NOP][TGM_MAXRANK]) {
    g.rank = rank;
    for (int k = 0; k < rank; k++) {
      g.shape[k] = shape[k];
      for (int p = 0; p < NOP; p++)
        g.st[p][k] = st[p][k];
    }
    collapse(&g);
    inner = g.shape[g.rank - 1];
    mid = g.rank >= 2 ? g.shape[g.rank - 2] : 1;
    outer = outer2 = 1;
    for (int k = 0; k < g.rank - 1; k++) {
      outer *= g.shape[k];
      outer2 *= k < g.rank - 2 ? g.shape[k] : 1;
    }
  }
  /* Element offsets of the start of host iteration t over the first n dims. */
  void offsets_over(int n, int64_t t, int64_t *off) const {
    for (int p = 0; p < NOP; p++)
      off[p] = 0;
    for (int k = n - 1; k >= 0; k--) {
      int64_t i = t % g.shape[k];
      t /= g.shape[k];
      for (int p = 0; p < NOP; p++)
        off[p] += i * g.st[p][k];
    }
  }
  void offsets(int64_t t, int64_t *off) const { offsets_over(g.rank - 1, t, off); }
  void offsets2(int64_t t, int64_t *off) const { offsets_over(g.rank >= 2 ? g.rank - 2 : 0, t, off); }
  int64_t stride(int p) const { return g.st[p][g.rank - 1]; }
  int64_t stride2(int p) const { return g.rank >= 2 ? g.st[p][g.rank - 2] : 0; }
};
/*@end matmul attention@*/

/*@uses attention@*/
/* ---------------------------------------------------------------- host: attention */

template <class TO, bool BLOCK>
int launch_softmax_rows(tgm_cuda_ctx *cx, const float *x, TO *y, int64_t rows, int64_t n, int64_t causal_t, float *lse) {
  int64_t cap = (int64_t)cx->sms * 32;
  int vec = n % 4 == 0 && aligned(x, 16) && aligned(y, alignof(Vec<TO, 4>));
  if (BLOCK) {
    int threads = n >= 8192 ? 1024 : 256;
    k_softmax_rows<float, TO, true>
        <<<(unsigned)(rows < cap ? rows : cap), threads, 0, cx->stream>>>(x, y, rows, n, causal_t, vec, lse);
  } else {
    int64_t nb = (rows + 7) / 8;
    k_softmax_rows<float, TO, false>
        <<<(unsigned)(nb < cap ? nb : cap), kThreads, 0, cx->stream>>>(x, y, rows, n, causal_t, vec, lse);
  }
  TGM_CUDA_LAUNCHED("k_softmax_rows");
  return 0;
}


/* Flash attention (FlashAttention-2's loop order and register layout) for
 * bf16/f16 with head dim D (64 or 128), on the tensor cores through
 * mma.sync m16n8k16 (f32 accumulators) and ldmatrix: a block of 4 warps
 * takes 64 query rows of one batch element, each warp 16. A warp's q
 * fragments, its scores S = scale q k^T for a tile of 64 keys and its
 * output O stay in registers: thread (g = lane / 4, t = lane % 4) holds
 * rows g and g + 8, columns 2t and 2t + 1 of each 8-column tile, so a row's
 * max and sum take two shuffles within a quad, and the tile's P is the A
 * operand of P v without a trip through shared memory (rounded to T there;
 * the row sums take the f32 values, as FlashAttention-2's). The online softmax works in base 2 (scores
 * times scale log2 e). Causal (column j > row i masked) skips the key
 * tiles past the block's last row; only the diagonal and the last tile
 * pay for a mask. Tiles come into shared memory by cp.async, the next
 * while this one is computed. No T x T buffer. Rows, keys and batches
 * beyond the sizes read zeros and write nothing; an all-masked row gives
 * NaN (0/0), as torch. lse (NULL: not wanted; batch stride Tq) gets each
 * row's natural log-sum-exp for the backward; y may be NULL. Every tensor
 * has its own row stride and batch strides (fa::Layout): rows are read and
 * written in 16-byte pieces wherever they lie. */
namespace fa {
constexpr float kLog2e = 1.4426950408889634f;
/* cp.async (sm_80 on): 16 bytes (n: 16, or 0 for zeros, nothing read; cp4 below: 4 bytes, n 4 or 0) from global src
 * into shared dst without a trip through registers, so that the next tile loads while this one is computed. A
 * thread's copies since its last commit form a group; wait<N> waits until at most N of its groups are pending
 * (the block then syncs before reading what other threads copied). */
__device__ __forceinline__ void cp16(void *dst, const void *src, int n) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src), "r"(n));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }
/* Starts copying rows r0.. of a [64, D] tile (row stride ld elements of global memory) into shared memory (row
 * stride D + 8: ldmatrix's 8 rows fall in different banks); rows past n (n >= 1) become zeros, read from
 * nowhere (a zero row adds nothing to a product with it, so the kernels need no mask for them). */
template <class T, int D> __device__ __forceinline__ void load_tile(T *dst, const T *src, int ld, int r0, int n) {
  constexpr int V = 8, LD = D + 8; /* 16 bytes */
  for (int e = threadIdx.x; e < 64 * D / V; e += 128) {
    int r = e / (D / V), c = (e % (D / V)) * V, ok = r0 + r < n;
    cp16(dst + r * LD + c, src + (int64_t)(ok ? r0 + r : 0) * ld + c, ok ? 16 : 0);
  }
}
/* Key/value tile i of nk (the forward's and flash_bwd_q's loop, double buffered in sK, sV: tile j in
 * buffer j % 2): once every thread is done with tile i - 1, starts copying tile i + 1 into its buffers, then
 * waits until tile i (copied one step earlier, or before the loop) is in shared memory for every thread. */
template <class T, int D>
__device__ __forceinline__ void next_kv(T *sK, T *sV, const T *k, const T *v, int ldk, int ldv, int i, int nk, int Tk) {
  constexpr int TILE = 64 * (D + 8);
  __syncthreads();
  if (i + 1 < nk) {
    load_tile<T, D>(sK + ((i + 1) & 1) * TILE, k, ldk, (i + 1) * 64, Tk);
    load_tile<T, D>(sV + ((i + 1) & 1) * TILE, v, ldv, (i + 1) * 64, Tk);
    commit();
    wait<1>();
  } else {
    wait<0>();
  }
  __syncthreads();
}
/*@end attention@*/
/*@uses attention_backward@*/
/* cp16's 4-byte form (the backward's rows of f32) */
__device__ __forceinline__ void cp4(void *dst, const void *src, int n) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
               :: "r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src), "r"(n));
}
/* Starts copying src[r0..r0 + 63] (f32; zeros past n) into dst[64]. */
__device__ __forceinline__ void load_row(float *dst, const float *src, int r0, int n) {
  for (int e = threadIdx.x; e < 64; e += 128)
    cp4(dst + e, src + (r0 + e < n ? r0 + e : 0), r0 + e < n ? 4 : 0);
}
/*@end attention_backward@*/
/*@uses attention@*/
/* 2^x on the MUFU unit, subnormal results flushed to zero (they vanish beside a row sum of at least 1). */
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ void ldsm(uint32_t *r, const void *p) { /* four 8 x 8 matrices */
  uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldsm_t(uint32_t *r, const void *p) { /* transposed */
  uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
/* c [16 x 8] += a [16 x 16] b [16 x 8] */
__device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1, bf16) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1, f16) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <class T> __device__ __forceinline__ uint32_t pack(float x, float y) {
  T h[2] = {from_f<T>(x), from_f<T>(y)};
  uint32_t r;
  memcpy(&r, h, 4);
  return r;
}
/* The A fragment of rows r0..r0 + 15, columns c0..c0 + 15 of a tile (row stride LD). */
template <int LD, class T> __device__ __forceinline__ void frag_a(uint32_t *a, const T *tile, int r0, int c0) {
  int lane = threadIdx.x % 32;
  ldsm(a, tile + (r0 + lane % 16) * LD + c0 + lane / 16 * 8);
}
/* B fragments (b[0..1]: columns n0..n0 + 7, b[2..3]: n0 + 8..) of k = c0..c0 + 15 from a tile whose rows are
 * the n index (b[k][n] = tile[n][k]: keys in S = q k^T) */
template <int LD, class T> __device__ __forceinline__ void frag_bn(uint32_t *b, const T *tile, int n0, int c0) {
  int lane = threadIdx.x % 32;
  ldsm(b, tile + (n0 + lane % 8 + lane / 16 * 8) * LD + c0 + lane / 8 % 2 * 8);
}
/* B fragments of k = k0..k0 + 15 from a tile whose rows are the k index (b[k][n] = tile[k][n]: v in P v) */
template <int LD, class T> __device__ __forceinline__ void frag_bk(uint32_t *b, const T *tile, int k0, int n0) {
  int lane = threadIdx.x % 32;
  ldsm_t(b, tile + (k0 + lane % 8 + lane / 8 % 2 * 8) * LD + n0 + lane / 16 * 8);
}
/* The A fragment of columns 16 kc.. of a [16 x 64] accumulator tile s[8][4] (rounded to T). */
template <class T> __device__ __forceinline__ void acc_to_a(uint32_t *a, const float (*s)[4], int kc) {
  a[0] = pack<T>(s[2 * kc][0], s[2 * kc][1]);
  a[1] = pack<T>(s[2 * kc][2], s[2 * kc][3]);
  a[2] = pack<T>(s[2 * kc + 1][0], s[2 * kc + 1][1]);
  a[3] = pack<T>(s[2 * kc + 1][2], s[2 * kc + 1][3]);
}
/* out[mt] [16 x 64] (8 tiles of 8 columns) += a[mt]-rows [16 x D] (fragments) times the 64 rows of tile^T, for
 * the warp's MT row tiles: each B fragment loaded once (ldmatrix) serves all MT of them */
template <class T, int D, int MT>
__device__ __forceinline__ void scores_mt(float (*out)[8][4], const uint32_t (*a)[D / 16][4], const T *tile) {
  for (int d = 0; d < D / 16; d++)
    for (int j = 0; j < 4; j++) {
      uint32_t b[4];
      frag_bn<D + 8>(b, tile, j * 16, d * 16);
      #pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        mma(out[mt][2 * j], a[mt][d], b[0], b[1], T());
        mma(out[mt][2 * j + 1], a[mt][d], b[2], b[3], T());
      }
    }
}
template <class T, int D> __device__ __forceinline__ void scores(float (*out)[4], const uint32_t (*a)[4], const T *tile) {
  scores_mt<T, D, 1>((float (*)[8][4])out, (const uint32_t (*)[D / 16][4])a, tile);
}
/* acc[mt] [16 x D] += the [16 x 64] accumulators s[mt] (as T) times tile [64 x D], for MT row tiles */
template <class T, int D, int MT>
__device__ __forceinline__ void times_tile_mt(float (*acc)[D / 8][4], const float (*s)[8][4], const T *tile) {
  for (int kc = 0; kc < 4; kc++) {
    uint32_t a[MT][4];
    #pragma unroll
    for (int mt = 0; mt < MT; mt++)
      acc_to_a<T>(a[mt], s[mt], kc);
    for (int n = 0; n < D / 16; n++) {
      uint32_t b[4];
      frag_bk<D + 8>(b, tile, kc * 16, n * 16);
      #pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        mma(acc[mt][2 * n], a[mt], b[0], b[1], T());
        mma(acc[mt][2 * n + 1], a[mt], b[2], b[3], T());
      }
    }
  }
}
template <class T, int D> __device__ __forceinline__ void times_tile(float (*acc)[4], const float (*s)[4], const T *tile) {
  times_tile_mt<T, D, 1>((float (*)[D / 8][4])acc, (const float (*)[8][4])s, tile);
}
/* Rows r0 + g and r0 + g + 8 (below n) of a warp's [16 x D] accumulators times mul[0], mul[1] into y (row stride
 * ld elements). */
template <class T, int D>
__device__ __forceinline__ void store_acc(T *y, int ld, const float (*acc)[4], int r0, int n, const float *mul) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  for (int h = 0; h < 2; h++) {
    int r = r0 + g + h * 8;
    if (r >= n)
      continue;
    for (int c = 0; c < D / 8; c++)
      *reinterpret_cast<uint32_t *>(y + (int64_t)r * ld + c * 8 + 2 * t) =
          pack<T>(acc[c][2 * h] * mul[h], acc[c][2 * h + 1] * mul[h]);
  }
}
/* Where the NOP tensors of a launch lie: tensor p's rows ld[p] elements apart, and its batch element (hi, lo) =
 * (hi0 + the grid's z, lo0 + the grid's y) over the last two collapsed batch dims (BatchWalk's mid and inner, n0
 * of them) at off(p, hi, lo) = hi s1[p] + lo s0[p] elements past its pointer; lse and delta at (hi n0 + lo) Tq.
 * (The grid's z rather than one index divided by n0: with a 64-bit division in them the backward kernels measured
 * 15% slower on the H100.) */
template <int NOP> struct Layout {
  int64_t s0[NOP], s1[NOP], n0, hi0, lo0;
  int ld[NOP];
  __host__ __device__ int64_t off(int p, int64_t hi, int64_t lo) const { return hi * s1[p] + lo * s0[p]; }
};
/* Shared memory for `tiles` [64, D] tiles and `rows` f32 rows of 64. */
template <int D> constexpr size_t smem_bytes(int tiles, int rows) { return (size_t)tiles * 64 * (D + 8) * 2 + (size_t)rows * 64 * 4; }
/* Sets the scores s (a warp's [16 x 64] accumulators: rows row[0], row[1], keys k0..) to -inf where the key is
 * past Tk or, causal, past the row. Only a tile on the diagonal or at the end needs it. */
__device__ __forceinline__ void mask_scores(float (*s)[4], int k0, int Tk, int causal, const int *row) {
  const int t = threadIdx.x % 4;
  for (int j = 0; j < 8; j++)
    for (int e = 0; e < 4; e++) {
      int c = k0 + j * 8 + 2 * t + (e & 1);
      if (c >= Tk || (causal && c > row[e >> 1]))
        s[j][e] = -INFINITY;
    }
}
} // namespace fa

/*@end attention@*/
/*@uses attention_backward@*/
/* The backward kernels at D = 64 keep 3 blocks of 128 threads resident per SM (at most 170 registers a
 * thread): on the H100 at GPT-2's sizes 0.41 ms against 0.45 with the 178 registers nvcc takes unbounded (2
 * blocks). The forward measured the same either way; D = 128 takes what it needs. */
constexpr int flash_bwd_blocks(int D) { return D == 64 ? 3 : 1; }
/*@end attention_backward@*/
/*@uses attention@*/

/* The grid's x walks the query tiles; causal, from the last (the longest rows: every key tile up to them) to the
 * first, so that the short blocks fill the tail of the grid. Keys and values come in 64-row tiles, double
 * buffered: tile i + 1 is copied (cp.async) while tile i is computed. A warp takes MT tiles of 16 query rows
 * (a block 64 MT rows): each key and value fragment read from shared memory (ldmatrix) serves all MT, and a
 * warp skips a causal key tile past all its rows. At D = 64 MT is 2 (flash_rows; 249 registers, two blocks an
 * SM): GPT-2's layer 0.147 -> 0.143 ms on the H100, less than halving the fragment reads promised, so shared
 * memory was not what held the forward at ~180 TFLOP/s. D = 128 would not fit two tiles in registers. */
template <class T, int D, int MT>
__global__ void __launch_bounds__(128)
    k_flash_fwd(const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v, T *__restrict__ y,
                fa::Layout<4> L, int Tq, int Tk, int causal, float scale, float *__restrict__ lse) {
  constexpr int LD = D + 8, TILE = 64 * LD, BM = 64 * MT;
  extern __shared__ __align__(128) unsigned char smem[];
  T *sQ = (T *)smem, *sK = sQ + MT * TILE, *sV = sK + 2 * TILE; /* sQ: [BM, LD]; sK, sV: two tiles each */
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
  const int q0 = (causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * BM, wr = w * 16 * MT; /* the warp's rows */
  int row[MT][2];
  #pragma unroll
  for (int mt = 0; mt < MT; mt++)
    row[mt][0] = q0 + wr + mt * 16 + lane / 4, row[mt][1] = row[mt][0] + 8;
  const int64_t hi = L.hi0 + blockIdx.z, lo = L.lo0 + blockIdx.y, b = hi * L.n0 + lo;
  q += L.off(0, hi, lo), k += L.off(1, hi, lo), v += L.off(2, hi, lo);
  const int kend = causal && q0 + BM < Tk ? q0 + BM : Tk, nk = (kend + 63) / 64;
  #pragma unroll
  for (int mt = 0; mt < MT; mt++)
    fa::load_tile<T, D>(sQ + mt * TILE, q, L.ld[0], q0 + mt * 64, Tq);
  fa::load_tile<T, D>(sK, k, L.ld[1], 0, Tk);
  fa::load_tile<T, D>(sV, v, L.ld[2], 0, Tk);
  fa::commit();
  uint32_t qa[MT][D / 16][4]; /* the warp's q rows, for every key tile */
  float o[MT][D / 8][4] = {}, m[MT][2], l[MT][2];
  #pragma unroll
  for (int mt = 0; mt < MT; mt++)
    m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
  const float sl2 = scale * fa::kLog2e;
  for (int i = 0; i < nk; i++) {
    const int k0 = i * 64;
    const T *cK = sK + (i & 1) * TILE, *cV = sV + (i & 1) * TILE;
    fa::next_kv<T, D>(sK, sV, k, v, L.ld[1], L.ld[2], i, nk, Tk);
    if (i == 0)
      #pragma unroll
      for (int mt = 0; mt < MT; mt++)
        for (int d = 0; d < D / 16; d++)
          fa::frag_a<LD>(qa[mt][d], sQ, wr + mt * 16, d * 16);
    if (causal && k0 > q0 + wr + 16 * MT - 1) /* every key of the tile past the warp's rows */
      continue;
    float s[MT][8][4] = {};
    fa::scores_mt<T, D, MT>(s, qa, cK);
    #pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      for (int j = 0; j < 8; j++)
        for (int e = 0; e < 4; e++)
          s[mt][j][e] *= sl2;
      if (k0 + 64 > Tk || (causal && k0 + 63 > q0 + wr + mt * 16))
        fa::mask_scores(s[mt], k0, Tk, causal, row[mt]);
      float mx[2] = {-INFINITY, -INFINITY};
      for (int j = 0; j < 8; j++)
        for (int e = 0; e < 4; e++)
          mx[e >> 1] = fmaxf(mx[e >> 1], s[mt][j][e]);
      float alpha[2], mb[2];
      for (int h = 0; h < 2; h++) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        float mn = fmaxf(m[mt][h], mx[h]);
        alpha[h] = mn == -INFINITY ? 1.0f : fa::ex2(m[mt][h] - mn);
        mb[h] = mn == -INFINITY ? 0.0f : mn; /* a row masked so far: its -inf scores give 0 */
        m[mt][h] = mn;
        l[mt][h] *= alpha[h];
      }
      for (int j = 0; j < 8; j++)
        for (int e = 0; e < 4; e++) {
          float p = fa::ex2(s[mt][j][e] - mb[e >> 1]);
          s[mt][j][e] = p; /* rounded to T as the A operand of P v; the row sum takes the f32 value */
          l[mt][e >> 1] += p;
        }
      for (int n = 0; n < D / 8; n++)
        o[mt][n][0] *= alpha[0], o[mt][n][1] *= alpha[0], o[mt][n][2] *= alpha[1], o[mt][n][3] *= alpha[1];
    }
    fa::times_tile_mt<T, D, MT>(o, s, cV);
  }
  fa::wait<0>(); /* no key tile (Tk 0): the copies issued */
  #pragma unroll
  for (int mt = 0; mt < MT; mt++) {
    for (int h = 0; h < 2; h++) {
      l[mt][h] += __shfl_xor_sync(0xffffffffu, l[mt][h], 1);
      l[mt][h] += __shfl_xor_sync(0xffffffffu, l[mt][h], 2);
      if (lse && t == 0 && row[mt][h] < Tq) /* natural units: (m + log2 l) ln 2 */
        lse[b * Tq + row[mt][h]] = m[mt][h] == -INFINITY ? m[mt][h] : (m[mt][h] + log2f(l[mt][h])) * 0.6931471805599453f;
    }
    if (y) {
      const float inv[2] = {1.0f / l[mt][0], 1.0f / l[mt][1]};
      fa::store_acc<T, D>(y + L.off(3, hi, lo), L.ld[3], o[mt], q0 + wr + mt * 16, Tq, inv);
    }
  }
}

/* Flash attention on Hopper's warpgroup MMA (sm_90a, bf16/f16, D = 64),
 * where mma.sync held k_flash_fwd at ~180 TFLOP/s and the backward at ~165:
 * k_flash_fwd_h, and the backward's wgmma kernel (attention_backward's
 * section, where the model trains). A block is one warpgroup (128 threads;
 * wgmma's M = 64 rows, 16 a warp). The operand that stays for the block's
 * life is wgmma's A: the forward's q in registers (mma.sync's m16n8k16
 * fragments, through ldmatrix from a padded tile), the backward's k and v (q
 * and dy) in shared memory (below); the walked tiles of 64 rows come by cp.async
 * into a ring of stages, two tiles ahead, each in the 128-byte swizzle wgmma
 * reads from shared memory (row r at 128 r bytes, its 16-byte piece c at
 * c ^ r % 8, stages 1024-byte aligned), and a proxy fence makes the copies
 * visible to wgmma (the async proxy). A walked tile is B two ways: K-major
 * (its rows are the product's columns: q k^T) or N-major (its rows are the
 * sum's index: P v), the same bytes transposed by the instruction. A score
 * tile becomes the next product's A operand in registers, rounded to T.
 *
 * ptxas serializes every wgmma of a kernel (each waited for before the next:
 * ~1.3x the time) when it cannot prove an in-flight accumulator untouched: a
 * branch that differs between warpgroups, a tile whose path differs from the
 * others (a first tile with no product to wait for), a copy of an
 * accumulator between issue and wait. The loops below have one path for
 * every tile, and `hold` pins the accumulators where they are issued and
 * waited for. */
namespace fh {
constexpr int kStages = 4, kAhead = 2, kTile = 64 * 64, kLd = 64 + 8; /* kLd: fa::load_tile's padded row */
constexpr size_t kFwdSmem = (size_t)2 * kStages * kTile * 2 + (size_t)64 * kLd * 2 + 1024; /* + alignment */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* Starts copying rows r0.. of a [64, 64] tile into dst in the 128-byte swizzle; rows past n become zeros. Thread
 * i copies piece i % 8 of rows i / 8 + 16 j: the same swizzled place in each of its four 8-row groups. */
template <class T> __device__ __forceinline__ void load_sw(T *dst, const T *src, int ld, int r0, int n) {
  const int c = threadIdx.x % 8, r = threadIdx.x / 8;
  dst += r * 64 + ((c ^ (r % 8)) << 3);
  src += c * 8;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const int rr = r0 + r + j * 16, ok = rr < n;
    fa::cp16(dst + j * 16 * 64, src + (int64_t)(ok ? rr : 0) * ld, ok ? 16 : 0);
  }
}
/* o's rows times alpha (its two rows a thread) */
__device__ __forceinline__ void scale_rows(float (&o)[32], const float (&alpha)[2]) {
#pragma unroll
  for (int n = 0; n < 8; n++)
    o[4 * n] *= alpha[0], o[4 * n + 1] *= alpha[0], o[4 * n + 2] *= alpha[1], o[4 * n + 3] *= alpha[1];
}
/* The descriptor of a swizzled tile at p: 8-row groups 1024 bytes apart (K-major's SBO, and N-major's along K;
 * the leading offset is unused at 64 columns). */
__device__ __forceinline__ uint64_t desc(const void *p) {
  uint64_t a = (uint32_t)__cvta_generic_to_shared(p);
  return ((a & 0x3ffff) >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
#define FH_D32                                                                                                         \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),          \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),           \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),          \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define FH_MMA(TY)                                                                                                     \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " "                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "   \
  "%24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
/* d [64 x 64] (= when acc is 0, else +=) A [64 x 16] (registers) B [16 x 64] (shared memory; NM: N-major, else
 * K-major). Asynchronous: commit, then wait before d or a are touched. */
template <int NM>
__device__ __forceinline__ void mma(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int acc, bf16) {
  asm volatile(FH_MMA("bf16") : FH_D32 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(NM));
}
template <int NM>
__device__ __forceinline__ void mma(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int acc, f16) {
  asm volatile(FH_MMA("f16") : FH_D32 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(NM));
}
/*@end attention@*/
/*@uses attention_backward@*/
#define FH_MMA_SS(TY)                                                                                                  \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " "                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "   \
  "%24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
/* d [64 x 64] (= when acc is 0, else +=) A [64 x 16] times B [16 x 64], both K-major in shared memory */
__device__ __forceinline__ void mma_ss(float (&d)[32], uint64_t a, uint64_t b, int acc, bf16) {
  asm volatile(FH_MMA_SS("bf16") : FH_D32 : "l"(a), "l"(b), "r"(acc));
}
__device__ __forceinline__ void mma_ss(float (&d)[32], uint64_t a, uint64_t b, int acc, f16) {
  asm volatile(FH_MMA_SS("f16") : FH_D32 : "l"(a), "l"(b), "r"(acc));
}
/*@end attention_backward@*/
/*@uses attention@*/
#undef FH_MMA
#undef FH_MMA_SS
#undef FH_D32
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
/* pins the registers of an accumulator at this point (no copy of one in flight) */
__device__ __forceinline__ void hold(float (&x)[32]) {
#pragma unroll
  for (int i = 0; i < 32; i++)
    asm volatile("" : "+f"(x[i])::"memory");
}
/* Tile i is in shared memory for every thread (cp.async groups: one a tile, AHEAD - 1 newer) and visible to wgmma;
 * every thread is past its reads of the tile before. */
template <int AHEAD> __device__ __forceinline__ void arrived() {
  fa::wait<AHEAD - 1>();
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
}
/* d (= when zero, else +=) A [64 x 64] times tile^T: the tile's rows are d's columns (K-major; k step c: 32 bytes
 * into each row) */
template <class T>
__device__ __forceinline__ void times_t(float (&d)[32], const uint32_t (&a)[4][4], const T *tile, bool zero) {
#pragma unroll
  for (int c = 0; c < 4; c++)
    mma<0>(d, a[c], desc(tile + c * 16), !zero || c > 0, T());
}
/*@end attention@*/
/*@uses attention_backward@*/
/* d = A [64 x 64] times tile^T, A a swizzled tile too (its rows are d's rows) */
template <class T> __device__ __forceinline__ void times_t(float (&d)[32], const T *a, const T *tile) {
#pragma unroll
  for (int c = 0; c < 4; c++)
    mma_ss(d, desc(a + c * 16), desc(tile + c * 16), c > 0, T());
}
/*@end attention_backward@*/
/*@uses attention@*/
/* d += A [64 x 64] times tile: the tile's rows are the sum's index (N-major; k step c: rows 16 c.., 2048 bytes on) */
template <class T> __device__ __forceinline__ void times(float (&d)[32], const uint32_t (&a)[4][4], const T *tile) {
#pragma unroll
  for (int c = 0; c < 4; c++)
    mma<1>(d, a[c], desc(tile + c * 16 * 64), 1, T());
}
/* A [64 x 64] (each thread's k steps c) from a [64 x 64] accumulator, rounded to T */
template <class T> __device__ __forceinline__ void to_a(uint32_t (&a)[4][4], const float (&s)[32]) {
#pragma unroll
  for (int c = 0; c < 4; c++)
    fa::acc_to_a<T>(a[c], (const float (*)[4])s, c);
}
/* the swizzled 1024-aligned start of the dynamic shared memory */
template <class T> __device__ __forceinline__ T *smem_base(unsigned char *raw) {
  return (T *)(raw + ((1024 - (__cvta_generic_to_shared(raw) & 1023)) & 1023));
}
#endif
} // namespace fh

/* Per key tile i, S_i = q k_i^T and o += P_{i-1} v_{i-1} are issued together, and the softmax of S_i runs while
 * the second product is still on the tensor cores (waited for at the top of tile i + 1: a wait in the same basic
 * block as the softmax, ptxas hoists above it); o is rescaled there. Three blocks an SM (at most 170 registers a
 * thread, 74 KB of shared memory each). GPT-2's layer (B 16, H 12, T 1024, causal) on the H100: 108 us against
 * k_flash_fwd's 152 (and 114 with two warpgroups a block sharing tiles, 142 with tiles of 128 keys). */
template <class T>
__global__ void __launch_bounds__(128, 3)
    k_flash_fwd_h(const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v, T *__restrict__ y,
                  fa::Layout<4> L, int Tq, int Tk, int causal, float scale, float *__restrict__ lse) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace fh;
  extern __shared__ __align__(1024) unsigned char fh_raw[];
  T *sK = smem_base<T>(fh_raw), *sV = sK + kStages * kTile, *sQ = sV + kStages * kTile; /* sQ: padded */
  const int lane = threadIdx.x % 32, t = lane % 4;
  const int q0 = (causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * 64, r0 = q0 + threadIdx.x / 32 * 16;
  const int row[2] = {r0 + lane / 4, r0 + lane / 4 + 8};
  const int64_t hi = L.hi0 + blockIdx.z, lo = L.lo0 + blockIdx.y, b = hi * L.n0 + lo;
  q += L.off(0, hi, lo), k += L.off(1, hi, lo), v += L.off(2, hi, lo);
  const int kend = causal && q0 + 64 < Tk ? q0 + 64 : Tk, nk = (kend + 63) / 64;
  fa::load_tile<T, 64>(sQ, q, L.ld[0], q0, Tq);
  for (int s = 0; s < kAhead; s++) { /* tiles 0 .. kAhead - 1, one group each (the first with q) */
    if (s < nk) {
      load_sw(sK + s * kTile, k, L.ld[1], s * 64, Tk);
      load_sw(sV + s * kTile, v, L.ld[2], s * 64, Tk);
    }
    fa::commit();
  }
  /* qa: zeros until tile 0 loads it. Fragments loaded only at tile 0 and left undefined before the loop, nvcc gave
   * their registers to another operand (the backward's, when its k and v were fragments: P^T and dS^T took them) */
  uint32_t qa[4][4] = {}, pa[4][4];
  float o[32], s[32], alpha[2] = {1.0f, 1.0f}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < 32; i++)
    o[i] = s[i] = 0.0f; /* s: P_{-1}, o += 0 v_0 at tile 0 */
  float (*sc)[4] = (float (*)[4])s;
  const float sl2 = scale * fa::kLog2e;
  for (int i = 0; i < nk; i++) {
    const int k0 = i * 64;
    wait<0>(); /* P_{i-2} v_{i-2}: o and pa are free, and tile i - 2's stage */
    hold(o);
    arrived<kAhead>();
    if (i + kAhead < nk) {
      const int nt = i + kAhead, ns = nt % kStages;
      load_sw(sK + ns * kTile, k, L.ld[1], nt * 64, Tk);
      load_sw(sV + ns * kTile, v, L.ld[2], nt * 64, Tk);
    }
    fa::commit();
    if (i == 0)
#pragma unroll
      for (int d = 0; d < 4; d++)
        fa::frag_a<kLd>(qa[d], sQ, threadIdx.x / 32 * 16, d * 16);
    scale_rows(o, alpha);
    to_a<T>(pa, s);
    hold(o);
    fence();
    times_t(s, qa, sK + i % kStages * kTile, true); /* S_i = q k_i^T */
    commit();
    hold(s);
    fence();
    times(o, pa, sV + (i > 0 ? i - 1 : 0) % kStages * kTile); /* o += P_{i-1} v_{i-1} (tile 0: 0 v_0) */
    commit();
    hold(o);
    wait<1>(); /* S_i (groups complete in order) */
    hold(s);
    if (k0 + 64 > Tk || (causal && k0 + 63 > q0))
      fa::mask_scores(sc, k0, Tk, causal, row);
    /* the row maxima and sums as four chains each, not one of 16 dependent steps */
    float mx[2][4], ts[2][4], mb[2];
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
      for (int u = 0; u < 4; u++)
        mx[h][u] = fmaxf(fmaxf(sc[u][2 * h], sc[u][2 * h + 1]), fmaxf(sc[u + 4][2 * h], sc[u + 4][2 * h + 1]));
    for (int h = 0; h < 2; h++) { /* m, mb: log2 units (the scale applied after the max: it is positive) */
      float x = fmaxf(fmaxf(mx[h][0], mx[h][1]), fmaxf(mx[h][2], mx[h][3]));
      x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
      x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
      const float mn = fmaxf(m[h], x * sl2);
      alpha[h] = mn == -INFINITY ? 1.0f : fa::ex2(m[h] - mn);
      mb[h] = mn == -INFINITY ? 0.0f : mn; /* a row masked so far: its -inf scores give 0 */
      m[h] = mn;
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
      for (int e = 0; e < 4; e++) {
        const float p = fa::ex2(fmaf(sc[j][e], sl2, -mb[e >> 1]));
        sc[j][e] = p; /* rounded to T as the A operand of P v; the row sum takes the f32 value */
        if (j < 4)
          ts[e >> 1][j] = e & 1 ? ts[e >> 1][j] + p : p;
        else
          ts[e >> 1][j % 4] += p;
      }
    for (int h = 0; h < 2; h++)
      l[h] = fmaf(l[h], alpha[h], (ts[h][0] + ts[h][1]) + (ts[h][2] + ts[h][3]));
  }
  wait<0>();
  hold(o);
  if (nk > 0) { /* the last tile's product (its stage is not refilled: no tile past nk - 1 is loaded) */
    scale_rows(o, alpha);
    to_a<T>(pa, s);
    hold(o);
    fence();
    times(o, pa, sV + (nk - 1) % kStages * kTile);
    commit();
    wait<0>();
    hold(o);
  }
  fa::wait<0>(); /* the copies issued */
  for (int h = 0; h < 2; h++) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    if (lse && t == 0 && row[h] < Tq) /* natural units: (m + log2 l) ln 2 */
      lse[b * Tq + row[h]] = m[h] == -INFINITY ? m[h] : (m[h] + log2f(l[h])) * 0.6931471805599453f;
  }
  if (y) {
    const float inv[2] = {1.0f / l[0], 1.0f / l[1]};
    fa::store_acc<T, 64>(y + L.off(3, hi, lo), L.ld[3], (const float (*)[4])o, r0, Tq, inv);
  }
#endif
}

/* The flash kernels' Layout of a walk's NOP tensors with row strides ld. */
template <int NOP> fa::Layout<NOP> flash_layout(const BatchWalk<NOP> &bw, const int64_t *ld) {
  fa::Layout<NOP> L;
  for (int p = 0; p < NOP; p++) {
    L.ld[p] = (int)ld[p];
    L.s0[p] = bw.stride(p);
    L.s1[p] = bw.stride2(p);
  }
  L.n0 = bw.inner;
  L.hi0 = L.lo0 = 0;
  return L;
}

/* k_flash_fwd_h (Hopper, D = 64) or k_flash_fwd over every batch element:
 * per host iteration of bw's outer2, a grid of query tiles (64 rows, or 64
 * MT) by the last two batch dims (inner along y, mid along z, 65535 of each at
 * a time). The caller checked flash_fits. Tests set flash_mma_sync to time
 * and check the mma.sync kernels (forward and backward) where the wgmma
 * kernels would run. */
constexpr int flash_rows(int D) { return D == 64 ? 2 : 1; } /* k_flash_fwd's MT */
static bool flash_mma_sync = false;
template <class T, int D>
int flash_launch(tgm_cuda_ctx *cx, const T *q, const T *k, const T *v, T *y, const BatchWalk<4> &bw,
                 const int64_t *ld, int64_t Tq, int64_t Tk, int causal, float scale, float *lse) {
  constexpr int MT = flash_rows(D);
  const bool h = D == 64 && cx->hopper && !flash_mma_sync;
  void (*kern)(const T *, const T *, const T *, T *, fa::Layout<4>, int, int, int, float, float *) =
      h ? k_flash_fwd_h<T> : k_flash_fwd<T, D, MT>;
  const size_t bytes = h ? fh::kFwdSmem : fa::smem_bytes<D>(4 + MT, 0);
  const int rows = h ? 64 : 64 * MT;
  static bool attr[2][64]; /* per kernel and device: more than 48 KiB of shared memory is opted into per function and device */
  bool *set = cx->device >= 0 && cx->device < 64 ? &attr[h][cx->device] : NULL;
  if (!set || !*set) {
    TGM_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    if (set)
      *set = true;
  }
  unsigned tiles = (unsigned)((Tq + rows - 1) / rows);
  fa::Layout<4> L = flash_layout(bw, ld);
  const int64_t nb = bw.mid * bw.inner; /* batch elements per host iteration */
  for (int64_t t = 0; t < bw.outer2; t++) {
    int64_t off[4];
    bw.offsets2(t, off);
    for (L.hi0 = 0; L.hi0 < bw.mid; L.hi0 += 65535)
      for (L.lo0 = 0; L.lo0 < bw.inner; L.lo0 += 65535) {
        int64_t ny = bw.inner - L.lo0 < 65535 ? bw.inner - L.lo0 : 65535;
        int64_t nz = bw.mid - L.hi0 < 65535 ? bw.mid - L.hi0 : 65535;
        kern<<<dim3(tiles, (unsigned)ny, (unsigned)nz), 128, bytes, cx->stream>>>(
            q + off[0], k + off[1], v + off[2], y ? y + off[3] : NULL, L, (int)Tq, (int)Tk, causal, scale,
            lse ? lse + t * nb * Tq : NULL);
        if (h)
          TGM_CUDA_LAUNCHED("k_flash_fwd_h");
        else
          TGM_CUDA_LAUNCHED("k_flash_fwd");
      }
  }
  return 0;
}

/* Whether the flash kernels take these operands: D == Dv, 64 or 128, sizes
 * and row strides within int, and rows of whole 16-byte pieces: every
 * pointer ps[p] (NULL: absent) 16-byte aligned, and every row stride, batch
 * stride (both levels in a launch) and host-iteration offset a multiple of 8
 * elements. */
template <int NOP>
bool flash_fits(const BatchWalk<NOP> &bw, const int64_t *ld, int64_t D, int64_t Dv, int64_t Tq, int64_t Tk,
                const void *const *ps) {
  if (D != Dv || (D != 64 && D != 128) || Tq > INT_MAX - 64 || Tk > INT_MAX - 64)
    return false;
  for (int p = 0; p < NOP; p++)
    if ((ps[p] && !aligned(ps[p], 16)) || ld[p] % 8 || ld[p] > INT_MAX || bw.stride(p) % 8 || bw.stride2(p) % 8)
      return false;
  for (int64_t t = 0; t < bw.outer2; t++) { /* the host iterations' offsets too */
    int64_t off[NOP];
    bw.offsets2(t, off);
    for (int p = 0; p < NOP; p++)
      if (off[p] % 8)
        return false;
  }
  return true;
}

int flash_attention(tgm_cuda_ctx *, int, const float *, const float *, const float *, float *, const BatchWalk<4> &,
                    const int64_t *, int64_t, int64_t, int64_t, int64_t, int, float, float *) {
  return -1; /* f32: no tensor-core path (TF32 would round beyond f32) */
}

/* Flash attention where it applies (flash_fits), else -1: the caller takes
 * the materialised path. */
template <class T>
int flash_attention(tgm_cuda_ctx *cx, int dt, const T *q, const T *k, const T *v, T *y, const BatchWalk<4> &bw,
                    const int64_t *ld, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, int causal, float scale,
                    float *lse) {
  const void *ps[4] = {q, k, v, y};
  if (dt == TGM_F32 || !flash_fits(bw, ld, D, Dv, Tq, Tk, ps))
    return -1;
  return D == 64 ? flash_launch<T, 64>(cx, q, k, v, y, bw, ld, Tq, Tk, causal, scale, lse)
                 : flash_launch<T, 128>(cx, q, k, v, y, bw, ld, Tq, Tk, causal, scale, lse);
}

/* Attention over bw's batch (q, k, v, y: its operands 0..3, row strides
 * ld): flash where it applies, else per chunk of batch elements S = scale q
 * k^T in f32 on cuBLAS (the rows' strides as leading dims), the softmax rows
 * (lse from them) into P (T; f32: in place) and y = P v. */
template <class T>
int attention_typed(tgm_cuda_ctx *cx, int dt, const T *q, const T *k, const T *v, T *y, const BatchWalk<4> &bw,
                    const int64_t *ld, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, int causal, float scale,
                    float *lse) {
  if (dt != TGM_F32) { /* flash attention where it applies */
    int rc = flash_attention(cx, dt, q, k, v, y, bw, ld, Tq, Tk, D, Dv, causal, scale, lse);
    if (rc >= 0)
      return rc;
  }
  const bool f32 = dt == TGM_F32;
  const size_t per = (size_t)(Tq * Tk) * (sizeof(float) + (f32 ? 0 : sizeof(T)));
  int64_t chunk = per ? (int64_t)(TGM_CUDA_ATTN_BUDGET / per) : bw.inner;
  chunk = chunk < 1 ? 1 : chunk > bw.inner ? bw.inner : chunk;
  void *p;
  int rc = scratch(cx, per * (size_t)chunk, &p);
  if (rc)
    return rc;
  float *S = (float *)p;
  T *P = f32 ? (T *)p : (T *)(S + (size_t)(chunk * Tq * Tk));
  cudaDataType_t ty = blas_type(dt);
  for (int64_t t = 0; t < bw.outer; t++) {
    int64_t off[4];
    bw.offsets(t, off);
    for (int64_t b0 = 0; b0 < bw.inner; b0 += chunk) {
      int64_t nb = bw.inner - b0 < chunk ? bw.inner - b0 : chunk;
      const T *qb = q + off[0] + b0 * bw.stride(0), *kb = k + off[1] + b0 * bw.stride(1);
      const T *vb = v + off[2] + b0 * bw.stride(2);
      T *yb = y ? y + off[3] + b0 * bw.stride(3) : NULL;
      float *lb = lse ? lse + (t * bw.inner + b0) * Tq : NULL;
      /* S^T [Tk, Tq] (column-major) = K [Tk, D] Q^T: row-major S = scale q k^T */
      rc = gemm(cx, CUBLAS_OP_T, CUBLAS_OP_N, Tk, Tq, D, scale, kb, ty, ld[1], bw.stride(1), qb, ty, ld[0],
                bw.stride(0), 0.0f, S, CUDA_R_32F, Tk, Tq * Tk, nb);
      if (rc)
        return rc;
      rc = Tk <= 1024 ? launch_softmax_rows<T, false>(cx, S, P, nb * Tq, Tk, causal ? Tq : 0, lb)
                      : launch_softmax_rows<T, true>(cx, S, P, nb * Tq, Tk, causal ? Tq : 0, lb);
      if (rc)
        return rc;
      if (!yb) /* only the lse wanted */
        continue;
      /* O^T [Dv, Tq] = V^T P^T: row-major O = P v */
      rc = gemm(cx, CUBLAS_OP_N, CUBLAS_OP_N, Dv, Tq, Tk, 1.0f, vb, ty, ld[2], bw.stride(2), P, ty, Tk, Tq * Tk, 0.0f,
                yb, ty, ld[3], bw.stride(3), nb);
      if (rc)
        return rc;
    }
  }
  return 0;
}
/*@end attention@*/

/*@uses attention_backward@*/
/* ---------------------------------------------------------------- attention backward */

/* FlashAttention-2's backward for bf16/f16 with head dim D (64 or 128), as
 * two kinds of block so that every gradient element is summed by one warp in
 * a fixed order (deterministic; FlashAttention adds dq with atomics instead,
 * at the price of 2 of these 7 tile products), with the forward's mma.sync
 * building blocks (fa::), both kinds in one launch (k_flash_bwd, below):
 *   flash_bwd_kv: a block of 4 warps takes 64 keys of one batch element,
 *     each warp 16 of them, and walks the query tiles (causal: from its own
 *     first key on): S^T = k q^T and dP^T = v dy^T in registers, P^T =
 *     exp(scale S^T - lse) and dS^T = P^T (dP^T - delta) in f32, then dv +=
 *     P^T dy and dk += dS^T q, the two as A operands straight from the
 *     accumulators (rounded to T there); dk *= scale at the end.
 *   flash_bwd_q: a block takes 64 queries, each warp 16, and walks the key
 *     tiles (causal: up to its last query): S and dP, dS as above, dq += dS k.
 * lse and delta (f32, batch stride Tq) come from the forward and the
 * generated rowsum(dy * y). q, k, v, dy, dq, dk, dv (tensors 0..6 of the
 * Layout) have their own row and batch strides (q, k, v's batch strides 0
 * where they broadcast). Rows past Tq or Tk read zeros and write nothing. */
template <class T, int D>
__device__ __forceinline__ void flash_bwd_kv(int kt, const T *__restrict__ q, const T *__restrict__ k,
                                             const T *__restrict__ v, const T *__restrict__ dy,
                                             const float *__restrict__ lse, const float *__restrict__ delta,
                                             T *__restrict__ dk, T *__restrict__ dv, const fa::Layout<7> &L, int Tq,
                                             int Tk, int causal, float scale) {
  constexpr int LD = D + 8, TILE = 64 * LD;
  extern __shared__ __align__(128) unsigned char smem[];
  T *sK = (T *)smem, *sV = sK + TILE, *sQ = sV + TILE, *sO = sQ + 2 * TILE; /* sQ, sO: two tiles each */
  float *sL = (float *)(sO + 2 * TILE), *sD = sL + 2 * 64;                     /* two rows each */
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, k0 = kt * 64;
  const int key[2] = {k0 + w * 16 + g, k0 + w * 16 + g + 8};
  const int64_t hi = L.hi0 + blockIdx.z, lo = L.lo0 + blockIdx.y, b = hi * L.n0 + lo;
  q += L.off(0, hi, lo), k += L.off(1, hi, lo), v += L.off(2, hi, lo), dy += L.off(3, hi, lo);
  lse += b * Tq, delta += b * Tq;
  const int qbeg = causal ? k0 : 0; /* causal: queries before k0 see none of these keys */
  const int nq = qbeg < Tq ? (Tq - qbeg + 63) / 64 : 0;
  fa::load_tile<T, D>(sK, k, L.ld[1], k0, Tk);
  fa::load_tile<T, D>(sV, v, L.ld[2], k0, Tk);
  if (nq > 0) {
    fa::load_tile<T, D>(sQ, q, L.ld[0], qbeg, Tq);
    fa::load_tile<T, D>(sO, dy, L.ld[3], qbeg, Tq);
    fa::load_row(sL, lse, qbeg, Tq);
    fa::load_row(sD, delta, qbeg, Tq);
  }
  fa::commit();
  float gk[D / 8][4] = {}, gv[D / 8][4] = {};
  const float sl2 = scale * fa::kLog2e;
  for (int i = 0; i < nq; i++) {
    const int q0 = qbeg + i * 64, cur = i & 1, nxt = cur ^ 1;
    const T *cQ = sQ + cur * TILE, *cO = sO + cur * TILE;
    const float *cL = sL + cur * 64, *cD = sD + cur * 64;
    __syncthreads(); /* tile i - 1's reads are done: its buffers take tile i + 1 */
    if (i + 1 < nq) {
      fa::load_tile<T, D>(sQ + nxt * TILE, q, L.ld[0], q0 + 64, Tq);
      fa::load_tile<T, D>(sO + nxt * TILE, dy, L.ld[3], q0 + 64, Tq);
      fa::load_row(sL + nxt * 64, lse, q0 + 64, Tq);
      fa::load_row(sD + nxt * 64, delta, q0 + 64, Tq);
      fa::commit();
      fa::wait<1>();
    } else {
      fa::wait<0>();
    }
    __syncthreads();
    float s[8][4] = {}, dp[8][4] = {};
    for (int d = 0; d < D / 16; d++) {
      uint32_t ka[4], va[4];
      fa::frag_a<LD>(ka, sK, w * 16, d * 16);
      fa::frag_a<LD>(va, sV, w * 16, d * 16);
      for (int j = 0; j < 4; j++) {
        uint32_t bq4[4], bo4[4];
        fa::frag_bn<LD>(bq4, cQ, j * 16, d * 16);
        fa::frag_bn<LD>(bo4, cO, j * 16, d * 16);
        fa::mma(s[2 * j], ka, bq4[0], bq4[1], T());
        fa::mma(s[2 * j + 1], ka, bq4[2], bq4[3], T());
        fa::mma(dp[2 * j], va, bo4[0], bo4[1], T());
        fa::mma(dp[2 * j + 1], va, bo4[2], bo4[3], T());
      }
    }
    /* s becomes P^T, dp dS^T. Queries past Tq need no mask: their q and dy rows, lse and delta are zeros, so
     * P^T = 1 there meets dy = 0 and dS^T = 0 meets q = 0. Causal masks the diagonal tile. */
    const bool diag = causal && q0 < k0 + 63;
    for (int j = 0; j < 8; j++)
      for (int e = 0; e < 4; e++) {
        int c = j * 8 + 2 * t + (e & 1);
        float p = fa::ex2(fmaf(s[j][e], sl2, -cL[c] * fa::kLog2e));
        if (diag && key[e >> 1] > q0 + c)
          p = 0.0f;
        s[j][e] = p;
        dp[j][e] = p * (dp[j][e] - cD[c]);
      }
    fa::times_tile<T, D>(gv, s, cO);  /* dv += P^T dy */
    fa::times_tile<T, D>(gk, dp, cQ); /* dk += dS^T q */
  }
  fa::wait<0>(); /* no query tile: the copies issued */
  const float one[2] = {1.0f, 1.0f}, sc[2] = {scale, scale};
  if (dv)
    fa::store_acc<T, D>(dv + L.off(6, hi, lo), L.ld[6], gv, k0 + w * 16, Tk, one);
  if (dk)
    fa::store_acc<T, D>(dk + L.off(5, hi, lo), L.ld[5], gk, k0 + w * 16, Tk, sc);
}

/* Query tile qt (64 queries); key tiles double buffered. */
template <class T, int D>
__device__ __forceinline__ void flash_bwd_q(int qt, const T *__restrict__ q, const T *__restrict__ k,
                                            const T *__restrict__ v, const T *__restrict__ dy,
                                            const float *__restrict__ lse, const float *__restrict__ delta,
                                            T *__restrict__ dq, const fa::Layout<7> &L, int Tq, int Tk, int causal,
                                            float scale) {
  constexpr int LD = D + 8, TILE = 64 * LD;
  extern __shared__ __align__(128) unsigned char smem[];
  T *sQ = (T *)smem, *sO = sQ + TILE, *sK = sO + TILE, *sV = sK + 2 * TILE; /* sK, sV: two tiles each */
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
  const int q0 = qt * 64;
  const int row[2] = {q0 + w * 16 + g, q0 + w * 16 + g + 8};
  const int64_t hi = L.hi0 + blockIdx.z, lo = L.lo0 + blockIdx.y, b = hi * L.n0 + lo;
  q += L.off(0, hi, lo), k += L.off(1, hi, lo), v += L.off(2, hi, lo), dy += L.off(3, hi, lo);
  lse += b * Tq, delta += b * Tq;
  const int kend = causal && q0 + 64 < Tk ? q0 + 64 : Tk, nk = (kend + 63) / 64;
  fa::load_tile<T, D>(sQ, q, L.ld[0], q0, Tq);
  fa::load_tile<T, D>(sO, dy, L.ld[3], q0, Tq);
  fa::load_tile<T, D>(sK, k, L.ld[1], 0, Tk);
  fa::load_tile<T, D>(sV, v, L.ld[2], 0, Tk);
  fa::commit();
  float rl[2], rd[2];
  for (int h = 0; h < 2; h++)
    rl[h] = row[h] < Tq ? lse[row[h]] * fa::kLog2e : 0.0f, rd[h] = row[h] < Tq ? delta[row[h]] : 0.0f;
  uint32_t qa[D / 16][4], oa[D / 16][4];
  float gq[D / 8][4] = {};
  const float sl2 = scale * fa::kLog2e;
  for (int i = 0; i < nk; i++) {
    const int k0 = i * 64;
    const T *cK = sK + (i & 1) * TILE, *cV = sV + (i & 1) * TILE;
    fa::next_kv<T, D>(sK, sV, k, v, L.ld[1], L.ld[2], i, nk, Tk);
    if (i == 0)
      for (int d = 0; d < D / 16; d++) {
        fa::frag_a<LD>(qa[d], sQ, w * 16, d * 16);
        fa::frag_a<LD>(oa[d], sO, w * 16, d * 16);
      }
    float s[8][4] = {}, dp[8][4] = {};
    fa::scores<T, D>(s, qa, cK);  /* S = q k^T */
    fa::scores<T, D>(dp, oa, cV); /* dP = dy v^T */
    const bool edge = k0 + 64 > Tk || (causal && k0 + 63 > q0); /* keys past Tk or (causal) past a row */
    for (int j = 0; j < 8; j++) /* dp becomes dS */
      for (int e = 0; e < 4; e++) {
        int c = k0 + j * 8 + 2 * (lane % 4) + (e & 1);
        float p = fa::ex2(fmaf(s[j][e], sl2, -rl[e >> 1]));
        if (edge && (c >= Tk || (causal && c > row[e >> 1])))
          p = 0.0f;
        dp[j][e] = p * (dp[j][e] - rd[e >> 1]);
      }
    fa::times_tile<T, D>(gq, dp, cK); /* dq += dS k */
  }
  fa::wait<0>();
  const float sc[2] = {scale, scale};
  fa::store_acc<T, D>(dq + L.off(4, hi, lo), L.ld[4], gq, q0 + w * 16, Tq, sc);
}

/* Both of the backward's kernels in one launch, so that each fills the
 * other's last wave: nkv key tiles (flash_bwd_kv; 0 when dk and dv are not
 * wanted) and nq query tiles (flash_bwd_q; 0 when dq is not), taken
 * alternately while both last, each kind heaviest first under a causal
 * mask (key tiles from the first, query tiles from the last). This block's
 * key tile kt, or (kt < 0) its query tile qt. */
__device__ __forceinline__ void bwd_block(int nkv, int nq, int causal, int &kt, int &qt) {
  const int b = blockIdx.x, both = nkv < nq ? nkv : nq;
  int i = -1; /* the i-th query tile in the order above */
  kt = -1;
  if (b < 2 * both)
    (b & 1 ? i : kt) = b / 2;
  else if (nkv > both)
    kt = b - both;
  else
    i = b - both;
  qt = causal ? nq - 1 - i : i;
}

template <class T, int D>
__global__ void __launch_bounds__(128, flash_bwd_blocks(D))
    k_flash_bwd(const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v, const T *__restrict__ dy,
                const float *__restrict__ lse, const float *__restrict__ delta, T *__restrict__ dq,
                T *__restrict__ dk, T *__restrict__ dv, fa::Layout<7> L, int Tq, int Tk, int causal, float scale,
                int nkv, int nq) {
  int kt, qt;
  bwd_block(nkv, nq, causal, kt, qt);
  if (kt >= 0)
    flash_bwd_kv<T, D>(kt, q, k, v, dy, lse, delta, dk, dv, L, Tq, Tk, causal, scale);
  else
    flash_bwd_q<T, D>(qt, q, k, v, dy, lse, delta, dq, L, Tq, Tk, causal, scale);
}

/* The backward on wgmma (k_flash_bwd_h: sm_90a, bf16/f16, D = 64): the
 * blocks of k_flash_bwd, each one warpgroup (fh, above), with the same
 * products and the same order of every sum (deterministic, no atomics):
 *   a key block keeps its k and v rows and walks the query tiles (q, dy,
 *   lse and delta in a ring of three stages): S^T = k q^T and
 *   dP^T = v dy^T (q and dy K-major), then P^T and dS^T in registers, dv +=
 *   P^T dy and dk += dS^T q (dy and q N-major);
 *   a query block keeps its q and dy rows and walks the key tiles (k, v):
 *   S = q k^T, dP = dy v^T, dS, dq += dS k (k N-major).
 * The operands a block keeps (k and v, or q and dy) stay in shared memory as
 * swizzled tiles, read by wgmma's descriptor for A, not in registers (158
 * registers a thread, three blocks an SM: 0.283 -> 0.240 ms against two with
 * them in registers). Each tile's products are waited for within the tile.
 * GPT-2's layer (B 16, H 12, T 1024, causal) on the H100: 0.240 ms against
 * k_flash_bwd's 0.390. */
namespace fh {
constexpr int kBwdStages = 3;
/* the key block's ring (q, dy tiles and the lse, delta rows) and its k, v tiles; the query block's fits in it */
constexpr size_t kBwdSmem = (size_t)kBwdStages * (2 * kTile * 2 + 2 * 64 * 4) + (size_t)2 * kTile * 2 + 1024;
} // namespace fh

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <class T>
__device__ __forceinline__ void flash_bwd_kv_h(int kt, const T *__restrict__ q, const T *__restrict__ k,
                                               const T *__restrict__ v, const T *__restrict__ dy,
                                               const float *__restrict__ lse, const float *__restrict__ delta,
                                               T *__restrict__ dk, T *__restrict__ dv, const fa::Layout<7> &L, int Tq,
                                               int Tk, int causal, float scale) {
  using namespace fh;
  constexpr int S = kBwdStages;
  extern __shared__ __align__(1024) unsigned char fh_raw[];
  T *sQ = smem_base<T>(fh_raw), *sO = sQ + S * kTile, *sK = sO + S * kTile, *sV = sK + kTile;
  float *sL = (float *)(sV + kTile), *sD = sL + S * 64;
  const int lane = threadIdx.x % 32, t = lane % 4, k0 = kt * 64, r0 = k0 + threadIdx.x / 32 * 16;
  const int key[2] = {r0 + lane / 4, r0 + lane / 4 + 8};
  const int64_t hi = L.hi0 + blockIdx.z, lo = L.lo0 + blockIdx.y, b = hi * L.n0 + lo;
  q += L.off(0, hi, lo), k += L.off(1, hi, lo), v += L.off(2, hi, lo), dy += L.off(3, hi, lo);
  lse += b * Tq, delta += b * Tq;
  const int qbeg = causal ? k0 : 0; /* causal: queries before k0 see none of these keys */
  const int nq = qbeg < Tq ? (Tq - qbeg + 63) / 64 : 0;
  load_sw(sK, k, L.ld[1], k0, Tk);
  load_sw(sV, v, L.ld[2], k0, Tk);
  for (int s = 0; s < kAhead; s++) { /* query tiles 0 .. kAhead - 1, one group each (the first with k, v) */
    if (s < nq) {
      load_sw(sQ + s * kTile, q, L.ld[0], qbeg + s * 64, Tq);
      load_sw(sO + s * kTile, dy, L.ld[3], qbeg + s * 64, Tq);
      fa::load_row(sL + s * 64, lse, qbeg + s * 64, Tq);
      fa::load_row(sD + s * 64, delta, qbeg + s * 64, Tq);
    }
    fa::commit();
  }
  uint32_t pa[4][4], da[4][4];
  float gk[32], gv[32], s[32], dp[32];
#pragma unroll
  for (int i = 0; i < 32; i++)
    gk[i] = gv[i] = s[i] = dp[i] = 0.0f;
  const float sl2 = scale * fa::kLog2e;
  for (int i = 0; i < nq; i++) {
    const int q0 = qbeg + i * 64, st = i % S;
    const T *cQ = sQ + st * kTile, *cO = sO + st * kTile;
    const float *cL = sL + st * 64, *cD = sD + st * 64;
    arrived<kAhead>(); /* (and tile i - 1's stage is free: its products were waited for) */
    if (i + kAhead < nq) {
      const int n0 = q0 + kAhead * 64, ns = (i + kAhead) % S;
      load_sw(sQ + ns * kTile, q, L.ld[0], n0, Tq);
      load_sw(sO + ns * kTile, dy, L.ld[3], n0, Tq);
      fa::load_row(sL + ns * 64, lse, n0, Tq);
      fa::load_row(sD + ns * 64, delta, n0, Tq);
    }
    fa::commit();
    fence();
    times_t(s, sK, cQ);  /* S^T = k q^T */
    times_t(dp, sV, cO); /* dP^T = v dy^T */
    commit();
    wait<0>();
    hold(s);
    hold(dp);
    /* s becomes P^T, dp dS^T. Queries past Tq need no mask: their q and dy rows, lse and delta are zeros, so
     * P^T = 1 there meets dy = 0 and dS^T = 0 meets q = 0. Causal masks the diagonal tile. */
    const bool diag = causal && q0 < k0 + 63;
    float (*sc)[4] = (float (*)[4])s, (*dc)[4] = (float (*)[4])dp;
#pragma unroll
    for (int j = 0; j < 8; j++)
      for (int e = 0; e < 4; e++) {
        const int c = j * 8 + 2 * t + (e & 1);
        float p = fa::ex2(fmaf(sc[j][e], sl2, -cL[c] * fa::kLog2e));
        if (diag && key[e >> 1] > q0 + c)
          p = 0.0f;
        sc[j][e] = p;
        dc[j][e] = p * (dc[j][e] - cD[c]);
      }
    to_a<T>(pa, s);
    to_a<T>(da, dp);
    hold(gv);
    hold(gk);
    fence();
    times(gv, pa, cO); /* dv += P^T dy */
    times(gk, da, cQ); /* dk += dS^T q */
    commit();
    wait<0>();
    hold(gv);
    hold(gk);
  }
  fa::wait<0>(); /* no query tile: the copies issued */
  const float one[2] = {1.0f, 1.0f}, sc2[2] = {scale, scale};
  if (dv)
    fa::store_acc<T, 64>(dv + L.off(6, hi, lo), L.ld[6], (const float (*)[4])gv, r0, Tk, one);
  if (dk)
    fa::store_acc<T, 64>(dk + L.off(5, hi, lo), L.ld[5], (const float (*)[4])gk, r0, Tk, sc2);
}

template <class T>
__device__ __forceinline__ void flash_bwd_q_h(int qt, const T *__restrict__ q, const T *__restrict__ k,
                                              const T *__restrict__ v, const T *__restrict__ dy,
                                              const float *__restrict__ lse, const float *__restrict__ delta,
                                              T *__restrict__ dq, const fa::Layout<7> &L, int Tq, int Tk, int causal,
                                              float scale) {
  using namespace fh;
  constexpr int S = kBwdStages;
  extern __shared__ __align__(1024) unsigned char fh_raw[];
  T *sK = smem_base<T>(fh_raw), *sV = sK + S * kTile, *sQ = sV + S * kTile, *sO = sQ + kTile;
  const int lane = threadIdx.x % 32, q0 = qt * 64, r0 = q0 + threadIdx.x / 32 * 16;
  const int row[2] = {r0 + lane / 4, r0 + lane / 4 + 8};
  const int64_t hi = L.hi0 + blockIdx.z, lo = L.lo0 + blockIdx.y, b = hi * L.n0 + lo;
  q += L.off(0, hi, lo), k += L.off(1, hi, lo), v += L.off(2, hi, lo), dy += L.off(3, hi, lo);
  lse += b * Tq, delta += b * Tq;
  const int kend = causal && q0 + 64 < Tk ? q0 + 64 : Tk, nk = (kend + 63) / 64;
  load_sw(sQ, q, L.ld[0], q0, Tq);
  load_sw(sO, dy, L.ld[3], q0, Tq);
  for (int s = 0; s < kAhead; s++) { /* key tiles 0 .. kAhead - 1, one group each (the first with q, dy) */
    if (s < nk) {
      load_sw(sK + s * kTile, k, L.ld[1], s * 64, Tk);
      load_sw(sV + s * kTile, v, L.ld[2], s * 64, Tk);
    }
    fa::commit();
  }
  float rl[2], rd[2];
  for (int h = 0; h < 2; h++)
    rl[h] = row[h] < Tq ? lse[row[h]] * fa::kLog2e : 0.0f, rd[h] = row[h] < Tq ? delta[row[h]] : 0.0f;
  uint32_t da[4][4];
  float gq[32], s[32], dp[32];
#pragma unroll
  for (int i = 0; i < 32; i++)
    gq[i] = s[i] = dp[i] = 0.0f;
  const float sl2 = scale * fa::kLog2e;
  for (int i = 0; i < nk; i++) {
    const int k0 = i * 64, st = i % S;
    const T *cK = sK + st * kTile, *cV = sV + st * kTile;
    arrived<kAhead>();
    if (i + kAhead < nk) {
      const int ns = (i + kAhead) % S;
      load_sw(sK + ns * kTile, k, L.ld[1], (i + kAhead) * 64, Tk);
      load_sw(sV + ns * kTile, v, L.ld[2], (i + kAhead) * 64, Tk);
    }
    fa::commit();
    fence();
    times_t(s, sQ, cK);  /* S = q k^T */
    times_t(dp, sO, cV); /* dP = dy v^T */
    commit();
    wait<0>();
    hold(s);
    hold(dp);
    const bool edge = k0 + 64 > Tk || (causal && k0 + 63 > q0); /* keys past Tk or (causal) past a row */
    float (*sc)[4] = (float (*)[4])s, (*dc)[4] = (float (*)[4])dp;
#pragma unroll
    for (int j = 0; j < 8; j++) /* dp becomes dS */
      for (int e = 0; e < 4; e++) {
        const int c = k0 + j * 8 + 2 * (lane % 4) + (e & 1);
        float p = fa::ex2(fmaf(sc[j][e], sl2, -rl[e >> 1]));
        if (edge && (c >= Tk || (causal && c > row[e >> 1])))
          p = 0.0f;
        dc[j][e] = p * (dc[j][e] - rd[e >> 1]);
      }
    to_a<T>(da, dp);
    hold(gq);
    fence();
    times(gq, da, cK); /* dq += dS k */
    commit();
    wait<0>();
    hold(gq);
  }
  fa::wait<0>();
  const float sc2[2] = {scale, scale};
  fa::store_acc<T, 64>(dq + L.off(4, hi, lo), L.ld[4], (const float (*)[4])gq, r0, Tq, sc2);
}
#endif

/* Both kinds in one launch, as k_flash_bwd. Three blocks an SM (at most 170 registers a thread). */
template <class T>
__global__ void __launch_bounds__(128, 3)
    k_flash_bwd_h(const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v, const T *__restrict__ dy,
                  const float *__restrict__ lse, const float *__restrict__ delta, T *__restrict__ dq,
                  T *__restrict__ dk, T *__restrict__ dv, fa::Layout<7> L, int Tq, int Tk, int causal, float scale,
                  int nkv, int nq) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  int kt, qt;
  bwd_block(nkv, nq, causal, kt, qt);
  if (kt >= 0)
    flash_bwd_kv_h<T>(kt, q, k, v, dy, lse, delta, dk, dv, L, Tq, Tk, causal, scale);
  else
    flash_bwd_q_h<T>(qt, q, k, v, dy, lse, delta, dq, L, Tq, Tk, causal, scale);
#endif
}

/* The materialised backward's elementwise steps over rows of Tk (row r is
 * query r % Tq): P = exp(S - lse) (S already scaled; causal: 0 where
 * j > i), and dS = P (dP - delta). */
template <class T>
__global__ void k_att_p(const float *__restrict__ S, const float *__restrict__ lse, T *__restrict__ P, int64_t n,
                        int64_t Tq, int64_t Tk, int causal) {
  int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t e = t; e < n; e += step) {
    int64_t r = e / Tk, j = e % Tk;
    P[e] = from_f<T>(causal && j > r % Tq ? 0.0f : expf(S[e] - lse[r]));
  }
}

template <class T>
__global__ void k_att_ds(const float *dP, const T *P, const float *__restrict__ delta, T *dS, int64_t n, int64_t Tk) {
  int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t e = t; e < n; e += step)
    dS[e] = from_f<T>(to_f(P[e]) * (dP[e] - delta[e / Tk]));
}

/* k_flash_bwd_h (Hopper, D = 64) or k_flash_bwd (its key tiles when dk or
 * dv is wanted, its query tiles when dq is) over every batch element, as
 * flash_launch. The caller checked flash_fits. */
template <class T, int D>
int flash_bwd_launch(tgm_cuda_ctx *cx, const T *q, const T *k, const T *v, const T *dy, const float *lse,
                     const float *delta, T *dq, T *dk, T *dv, const BatchWalk<7> &bw, const int64_t *ld, int64_t Tq,
                     int64_t Tk, int causal, float scale) {
  const bool h = D == 64 && cx->hopper && !flash_mma_sync;
  void (*kern)(const T *, const T *, const T *, const T *, const float *, const float *, T *, T *, T *, fa::Layout<7>,
               int, int, int, float, int, int) = h ? k_flash_bwd_h<T> : k_flash_bwd<T, D>;
  const size_t bytes = h ? fh::kBwdSmem : fa::smem_bytes<D>(6, 4); /* flash_bwd_q takes 6 tiles too */
  static bool attr[2][64]; /* per kernel and device, as flash_launch */
  bool *set = cx->device >= 0 && cx->device < 64 ? &attr[h][cx->device] : NULL;
  if (!set || !*set) {
    TGM_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    if (set)
      *set = true;
  }
  fa::Layout<7> L = flash_layout(bw, ld);
  const int64_t nb = bw.mid * bw.inner; /* batch elements per host iteration */
  for (int64_t t = 0; t < bw.outer2; t++) {
    int64_t off[7];
    bw.offsets2(t, off);
    const T *qt = q + off[0], *kt = k + off[1], *vt = v + off[2], *dyt = dy + off[3];
    const float *lt = lse + t * nb * Tq, *delt = delta + t * nb * Tq;
    for (L.hi0 = 0; L.hi0 < bw.mid; L.hi0 += 65535)
      for (L.lo0 = 0; L.lo0 < bw.inner; L.lo0 += 65535) {
        int64_t ny = bw.inner - L.lo0 < 65535 ? bw.inner - L.lo0 : 65535;
        int64_t nz = bw.mid - L.hi0 < 65535 ? bw.mid - L.hi0 : 65535;
        const int nkv = dk || dv ? (int)((Tk + 63) / 64) : 0, nq = dq ? (int)((Tq + 63) / 64) : 0;
        if (nkv + nq == 0)
          continue;
        kern<<<dim3((unsigned)(nkv + nq), (unsigned)ny, (unsigned)nz), 128, bytes, cx->stream>>>(
            qt, kt, vt, dyt, lt, delt, dq ? dq + off[4] : NULL, dk ? dk + off[5] : NULL, dv ? dv + off[6] : NULL, L,
            (int)Tq, (int)Tk, causal, scale, nkv, nq);
        if (h)
          TGM_CUDA_LAUNCHED("k_flash_bwd_h");
        else
          TGM_CUDA_LAUNCHED("k_flash_bwd");
      }
  }
  return 0;
}

int flash_backward(tgm_cuda_ctx *, const float *, const float *, const float *, const float *, const float *,
                   const float *, float *, float *, float *, const BatchWalk<7> &, const int64_t *, int64_t, int64_t,
                   int64_t, int64_t, int, float) {
  return -1; /* f32: the materialised path (TF32 would round beyond f32) */
}

/* The flash backward where it applies (flash_fits), else -1. */
template <class T>
int flash_backward(tgm_cuda_ctx *cx, const T *q, const T *k, const T *v, const T *dy, const float *lse,
                   const float *delta, T *dq, T *dk, T *dv, const BatchWalk<7> &bw, const int64_t *ld, int64_t Tq,
                   int64_t Tk, int64_t D, int64_t Dv, int causal, float scale) {
  const void *ps[7] = {q, k, v, dy, dq, dk, dv};
  if (!flash_fits(bw, ld, D, Dv, Tq, Tk, ps))
    return -1;
  return D == 64 ? flash_bwd_launch<T, 64>(cx, q, k, v, dy, lse, delta, dq, dk, dv, bw, ld, Tq, Tk, causal, scale)
                 : flash_bwd_launch<T, 128>(cx, q, k, v, dy, lse, delta, dq, dk, dv, bw, ld, Tq, Tk, causal, scale);
}

/* The backward of attention_typed over bw's batch (q, k, v, dy, dq, dk, dv:
 * its operands 0..6, row strides ld; a result NULL: not wanted): flash
 * where it applies, else per chunk of batch elements S = scale q k^T, P =
 * exp(S - lse), dv = P^T dy, dP = dy v^T, dS = P (dP - delta), dq = scale dS
 * k, dk = scale dS^T q on cuBLAS with f32 S and dP (P and dS rounded to T
 * for the GEMMs, as the forward's P), the rows' strides as leading dims. */
template <class T>
int attention_backward_typed(tgm_cuda_ctx *cx, int dt, const T *q, const T *k, const T *v, const T *dy,
                             const float *lse, const float *delta, T *dq, T *dk, T *dv, const BatchWalk<7> &bw,
                             const int64_t *ld, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, int causal,
                             float scale) {
  if (dt != TGM_F32) {
    int rc = flash_backward(cx, q, k, v, dy, lse, delta, dq, dk, dv, bw, ld, Tq, Tk, D, Dv, causal, scale);
    if (rc >= 0)
      return rc;
  }
  const bool f32 = dt == TGM_F32;
  const size_t per = (size_t)(Tq * Tk) * (sizeof(float) + sizeof(T) + (f32 ? 0 : sizeof(T)));
  int64_t chunk = per ? (int64_t)(TGM_CUDA_ATTN_BUDGET / per) : bw.inner;
  chunk = chunk < 1 ? 1 : chunk > bw.inner ? bw.inner : chunk;
  void *p;
  int rc = scratch(cx, per * (size_t)chunk, &p);
  if (rc)
    return rc;
  float *A = (float *)p; /* S, then dP (f32: then dS) */
  T *P = (T *)(A + (size_t)(chunk * Tq * Tk)), *dS = f32 ? (T *)A : P + (size_t)(chunk * Tq * Tk);
  cudaDataType_t ty = blas_type(dt);
  for (int64_t t = 0; t < bw.outer; t++) {
    int64_t off[7];
    bw.offsets(t, off);
    for (int64_t b0 = 0; b0 < bw.inner; b0 += chunk) {
      int64_t nb = bw.inner - b0 < chunk ? bw.inner - b0 : chunk, e = t * bw.inner + b0, n = nb * Tq * Tk;
      const T *qb = q + off[0] + b0 * bw.stride(0), *kb = k + off[1] + b0 * bw.stride(1);
      const T *vb = v + off[2] + b0 * bw.stride(2), *dyb = dy + off[3] + b0 * bw.stride(3);
      /* S^T [Tk, Tq] (column-major) = K Q^T: row-major S = scale q k^T */
      rc = gemm(cx, CUBLAS_OP_T, CUBLAS_OP_N, Tk, Tq, D, scale, kb, ty, ld[1], bw.stride(1), qb, ty, ld[0],
                bw.stride(0), 0.0f, A, CUDA_R_32F, Tk, Tq * Tk, nb);
      if (rc)
        return rc;
      k_att_p<T><<<grid_for(cx, n, kThreads), kThreads, 0, cx->stream>>>(A, lse + e * Tq, P, n, Tq, Tk, causal);
      TGM_CUDA_LAUNCHED("k_att_p");
      if (dv && (rc = gemm(cx, CUBLAS_OP_N, CUBLAS_OP_T, Dv, Tk, Tq, 1.0f, dyb, ty, ld[3], bw.stride(3), P, ty, Tk,
                           Tq * Tk, 0.0f, dv + off[6] + b0 * bw.stride(6), ty, ld[6], bw.stride(6),
                           nb))) /* dv^T [Dv, Tk] = dy^T P */
        return rc;
      if (!dq && !dk)
        continue;
      /* dP^T [Tk, Tq] = V dy^T: row-major dP = dy v^T */
      rc = gemm(cx, CUBLAS_OP_T, CUBLAS_OP_N, Tk, Tq, Dv, 1.0f, vb, ty, ld[2], bw.stride(2), dyb, ty, ld[3],
                bw.stride(3), 0.0f, A, CUDA_R_32F, Tk, Tq * Tk, nb);
      if (rc)
        return rc;
      k_att_ds<T><<<grid_for(cx, n, kThreads), kThreads, 0, cx->stream>>>(A, P, delta + e * Tq, dS, n, Tk);
      TGM_CUDA_LAUNCHED("k_att_ds");
      if (dq && (rc = gemm(cx, CUBLAS_OP_N, CUBLAS_OP_N, D, Tq, Tk, scale, kb, ty, ld[1], bw.stride(1), dS, ty, Tk,
                           Tq * Tk, 0.0f, dq + off[4] + b0 * bw.stride(4), ty, ld[4], bw.stride(4),
                           nb))) /* dq^T [D, Tq] = k^T dS^T */
        return rc;
      if (dk && (rc = gemm(cx, CUBLAS_OP_N, CUBLAS_OP_T, D, Tk, Tq, scale, qb, ty, ld[0], bw.stride(0), dS, ty, Tk,
                           Tq * Tk, 0.0f, dk + off[5] + b0 * bw.stride(5), ty, ld[5], bw.stride(5),
                           nb))) /* dk^T [D, Tk] = q^T dS */
        return rc;
    }
  }
  return 0;
}
/*@end attention_backward@*/

} // namespace

/* ================================================================ entry points */

/* (C linkage comes from the declarations in tgm_rt.h.) */

/* Makes a context on the current device: a non-blocking stream, a cuBLAS
 * handle bound to it (workspace set, reduced-precision split-K reductions
 * off), a cuBLASLt handle (sharing that workspace; the plan cache starts
 * empty), the d_bad cell. */
int tgm_cuda_use_device(int device, char *err, size_t errlen) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && device >= n)
    e = cudaErrorInvalidDevice;
  if (e == cudaSuccess)
    e = cudaSetDevice(device);
  if (e != cudaSuccess) {
    if (err && errlen)
      snprintf(err, errlen, "CUDA device %d: %s (%d device%s visible)", device, cudaGetErrorString(e), n,
               n == 1 ? "" : "s");
    cudaGetLastError();
  }
  return (int)e;
}

static void x3_setup(tgm_cuda_ctx *cx); /* (with tgm_cuda_gemm, below) */

int tgm_cuda_ctx_create(tgm_cuda_ctx **out, char *err, size_t errlen) {
  int n = 0, dev = 0;
  cudaError_t e;
  const char *what = "";
  if (!out) {
    if (err && errlen)
      snprintf(err, errlen, "tgm_cuda_ctx_create: out is NULL");
    return (int)cudaErrorInvalidValue;
  }
  *out = NULL;
  e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (err && errlen)
      snprintf(err, errlen, "no CUDA device available (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    cudaGetLastError();
    return e != cudaSuccess ? (int)e : (int)cudaErrorNoDevice;
  }
  tgm_cuda_ctx *cx = (tgm_cuda_ctx *)calloc(1, sizeof *cx);
  if (!cx) {
    if (err && errlen)
      snprintf(err, errlen, "tgm_cuda_ctx_create: out of host memory");
    return (int)cudaErrorMemoryAllocation;
  }
  cublasStatus_t bs = CUBLAS_STATUS_SUCCESS;
  cx->op = "tgm_cuda_ctx_create";
  const unsigned long long none = (unsigned long long)INT64_MAX;
  if ((e = cudaGetDevice(&dev)) != cudaSuccess) {
    what = "cudaGetDevice";
    goto cuda_error;
  }
  cx->device = dev;
  if ((e = cudaDeviceGetAttribute(&cx->sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) {
    what = "cudaDeviceGetAttribute";
    goto cuda_error;
  }
  if (cx->sms < 1)
    cx->sms = 1;
  if ((e = cudaStreamCreateWithFlags(&cx->own, cudaStreamNonBlocking)) != cudaSuccess) {
    what = "cudaStreamCreateWithFlags";
    goto cuda_error;
  }
  cx->stream = cx->own;
  x3_setup(cx);
  if ((e = dev_malloc(cx, (void **)&cx->d_bad, sizeof *cx->d_bad)) != cudaSuccess) {
    what = "cudaMalloc (d_bad)";
    goto cuda_error;
  }
  if ((e = cudaMemcpy(cx->d_bad, &none, sizeof none, cudaMemcpyHostToDevice)) != cudaSuccess) {
    what = "cudaMemcpy (d_bad)";
    goto cuda_error;
  }
  if ((e = dev_malloc(cx, (void **)&cx->d_split_part, TGM_CUDA_SPLIT_PARTS * sizeof(float))) != cudaSuccess ||
      (e = dev_malloc(cx, (void **)&cx->d_split_count, TGM_CUDA_SPLIT_TILES * sizeof(unsigned))) != cudaSuccess) {
    what = "cudaMalloc (split reductions)";
    goto cuda_error;
  }
  if ((e = cudaMemset(cx->d_split_count, 0, TGM_CUDA_SPLIT_TILES * sizeof(unsigned))) != cudaSuccess) {
    what = "cudaMemset (split reductions)";
    goto cuda_error;
  }
  if ((e = dev_malloc(cx, &cx->blas_ws, TGM_CUDA_BLAS_WS)) != cudaSuccess) {
    what = "cudaMalloc (cuBLAS workspace)";
    goto cuda_error;
  }
  if ((bs = cublasCreate(&cx->blas)) != CUBLAS_STATUS_SUCCESS) {
    cx->blas = NULL;
    what = "cublasCreate";
    goto blas_error;
  }
  if ((bs = cublasSetStream(cx->blas, cx->stream)) != CUBLAS_STATUS_SUCCESS) {
    what = "cublasSetStream";
    goto blas_error;
  }
  if ((bs = cublasSetWorkspace(cx->blas, cx->blas_ws, TGM_CUDA_BLAS_WS)) != CUBLAS_STATUS_SUCCESS) {
    what = "cublasSetWorkspace";
    goto blas_error;
  }
  if ((bs = cublasSetMathMode(
           cx->blas, (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION))) !=
      CUBLAS_STATUS_SUCCESS) {
    what = "cublasSetMathMode";
    goto blas_error;
  }
  if ((bs = cublasLtCreate(&cx->lt)) != CUBLAS_STATUS_SUCCESS) {
    cx->lt = NULL;
    what = "cublasLtCreate";
    goto blas_error;
  }
  cx->op = NULL;
  *out = cx;
  return 0;
cuda_error:
  if (err && errlen)
    snprintf(err, errlen, "creating the CUDA context: %s failed: %s", what, cudaGetErrorString(e));
  cudaGetLastError();
  tgm_cuda_ctx_destroy(cx);
  return (int)e;
blas_error:
  if (err && errlen)
    snprintf(err, errlen, "creating the CUDA context: %s failed: %s", what, cublasGetStatusString(bs));
  tgm_cuda_ctx_destroy(cx);
  return (int)bs;
}

/* Waits for the stream, then frees everything the context owns. */
void tgm_cuda_ctx_destroy(tgm_cuda_ctx *cx) {
  if (!cx)
    return;
  if (cx->stream)
    cudaStreamSynchronize(cx->stream);
  for (int i = 0; i < TGM_CUDA_GEMM_PLANS; i++)
    lt_plan_free(&cx->plans[i]);
  free(cx->tunes);
  if (cx->lt)
    cublasLtDestroy(cx->lt);
  if (cx->blas)
    cublasDestroy(cx->blas);
  dev_free(cx, cx->scratch);
  dev_free(cx, cx->blas_ws);
  dev_free(cx, cx->d_bad);
  dev_free(cx, cx->d_split_part);
  dev_free(cx, cx->d_split_count);
  if (cx->own)
    cudaStreamDestroy(cx->own);
  cudaGetLastError();
  free(cx->allocs);
  free(cx);
}

const char *tgm_cuda_ctx_error(const tgm_cuda_ctx *cx) { return cx ? cx->err : "no CUDA context"; }

int tgm_cuda_sync(tgm_cuda_ctx *cx) {
  cx->op = "tgm_cuda_sync";
  TGM_CUDA_TRY(cudaStreamSynchronize(cx->stream));
  TGM_CUDA_TRY(cudaGetLastError());
  return 0;
}

/* Reads d_bad after the work so far; resets it when it was set. */
unsigned long long *tgm_cuda_bad_ptr(tgm_cuda_ctx *cx) { return cx->d_bad; }
float *tgm_cuda_split_part(tgm_cuda_ctx *cx) { return cx->d_split_part; }
unsigned *tgm_cuda_split_count(tgm_cuda_ctx *cx) { return cx->d_split_count; }

int tgm_cuda_bad_index(tgm_cuda_ctx *cx, int64_t *pos) {
  cx->op = "tgm_cuda_bad_index";
  unsigned long long v = 0;
  *pos = -1;
  TGM_CUDA_TRY(cudaMemcpyAsync(&v, cx->d_bad, sizeof v, cudaMemcpyDeviceToHost, cx->stream));
  TGM_CUDA_TRY(cudaStreamSynchronize(cx->stream));
  if (v != (unsigned long long)INT64_MAX) {
    *pos = (int64_t)v;
    k_set_bad<<<1, 1, 0, cx->stream>>>(cx->d_bad);
    TGM_CUDA_LAUNCHED("k_set_bad");
  }
  return 0;
}

int tgm_cuda_malloc(tgm_cuda_ctx *cx, void **p, size_t n) {
  cx->op = "tgm_cuda_malloc";
  *p = NULL;
  cudaError_t e = dev_malloc(cx, p, n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    *p = NULL;
    return fail(cx, (int)e, "could not allocate %zu bytes of device memory: %s", n, cudaGetErrorString(e));
  }
  return 0;
}

/* Waits for the stream (the memory may still be in use), then frees. */
void tgm_cuda_free(tgm_cuda_ctx *cx, void *p) {
  if (!p)
    return;
  if (cx) {
    cudaStreamSynchronize(cx->stream);
    dev_free(cx, p);
  } else {
    cudaFree(p);
  }
  cudaGetLastError();
}

void tgm_cuda_ctx_memory(const tgm_cuda_ctx *cx, size_t *now, size_t *peak) {
  *now = cx ? cx->mem_now : 0;
  *peak = cx ? cx->mem_peak : 0;
}

/* h2d and d2h return when the copy is done (host buffers are free to reuse
 * and results readable); d2d is enqueued. */
int tgm_cuda_memcpy(tgm_cuda_ctx *cx, void *dst, const void *src, size_t n, int kind) {
  cx->op = "tgm_cuda_memcpy";
  if (kind < 0 || kind > 2)
    return TGM_CUDA_BAD("kind %d is not 0 (h2d), 1 (d2h) or 2 (d2d)", kind);
  if (n == 0)
    return 0;
  if (!dst || !src)
    return TGM_CUDA_BAD("NULL pointer");
  static const cudaMemcpyKind k[3] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice};
  TGM_CUDA_TRY(cudaMemcpyAsync(dst, src, n, k[kind], cx->stream));
  if (kind != 2)
    TGM_CUDA_TRY(cudaStreamSynchronize(cx->stream));
  return 0;
}

template <class TI> static int cast_from(tgm_cuda_ctx *cx, int dt_out, const void *x, void *y, int64_t n) {
  switch (dt_out) {
  case TGM_F32: return launch_map1<TI, float>(cx, x, y, n, CastF<float>());
  case TGM_BF16: return launch_map1<TI, bf16>(cx, x, y, n, CastF<bf16>());
  case TGM_F16: return launch_map1<TI, f16>(cx, x, y, n, CastF<f16>());
  case TGM_I32: return launch_map1<TI, int32_t>(cx, x, y, n, CastF<int32_t>());
  default: return launch_map1<TI, uint8_t>(cx, x, y, n, CastF<uint8_t>());
  }
}

int tgm_cuda_cast(tgm_cuda_ctx *cx, int dt_in, int dt_out, const void *x, void *y, int64_t n) {
  cx->op = "tgm_cuda_cast";
  if (!dt_ok(dt_in) || !dt_ok(dt_out) || n < 0)
    return TGM_CUDA_BAD("bad dtypes %d -> %d or size %lld", dt_in, dt_out, (long long)n);
  if (n == 0)
    return 0;
  if (!x || !y)
    return TGM_CUDA_BAD("NULL pointer");
  if (dt_in == dt_out) {
    if (x != y)
      TGM_CUDA_TRY(cudaMemcpyAsync(y, x, (size_t)n * dt_size(dt_in), cudaMemcpyDeviceToDevice, cx->stream));
    return 0;
  }
  switch (dt_in) {
  case TGM_F32: return cast_from<float>(cx, dt_out, x, y, n);
  case TGM_BF16: return cast_from<bf16>(cx, dt_out, x, y, n);
  case TGM_F16: return cast_from<f16>(cx, dt_out, x, y, n);
  case TGM_I32: return cast_from<int32_t>(cx, dt_out, x, y, n);
  default: return cast_from<uint8_t>(cx, dt_out, x, y, n);
  }
}

/* ---------------------------------------------------------------- linear algebra */

/*@uses matmul@*/
/* torch.matmul: C[M, N] = A[M, K] B[K, N] per batch, as the column-major
 * C^T = B^T A^T; batch dims broadcast (stride 0). When b has no batch and a's
 * batch is contiguous, the batch folds into M: one GEMM. */
int tgm_cuda_matmul(tgm_cuda_ctx *cx, int dt, const void *a, int ra, const int64_t *sa, const void *b, int rb,
                    const int64_t *sb, void *y, int ry, const int64_t *sy) {
  cx->op = "tgm_cuda_matmul";
  int rc;
  if (!is_float_dt(dt))
    return TGM_CUDA_BAD("dtype %s is not floating", dt_name(dt));
  if ((rc = check_shape(cx, "a", ra, sa)) || (rc = check_shape(cx, "b", rb, sb)) || (rc = check_shape(cx, "y", ry, sy)))
    return rc;
  if (ra < 1 || rb < 1)
    return TGM_CUDA_BAD("scalar operand");
  int64_t M = ra >= 2 ? sa[ra - 2] : 1, K = sa[ra - 1];
  int64_t K2 = rb >= 2 ? sb[rb - 2] : sb[0], N = rb >= 2 ? sb[rb - 1] : 1;
  int obr = ry - (ra >= 2) - (rb >= 2);
  if (K != K2 || obr < 0 || (ra >= 2 && sy[obr] != M) || (rb >= 2 && sy[ry - 1] != N))
    return TGM_CUDA_BAD("operand shapes do not match the result (K %lld vs %lld)", (long long)K, (long long)K2);
  int64_t st[3][TGM_MAXRANK];
  if (!bcast_strides(ra >= 2 ? ra - 2 : 0, sa, obr, sy, M * K, st[0]) ||
      !bcast_strides(rb >= 2 ? rb - 2 : 0, sb, obr, sy, K * N, st[1]))
    return TGM_CUDA_BAD("batch dims do not broadcast to the result's");
  contiguous_strides(obr, sy, M * N, st[2]);
  int64_t nbatch = numel_of(obr, sy);
  if (nbatch * M * N == 0)
    return 0;
  if (!a || !b || !y)
    return TGM_CUDA_BAD("NULL pointer");
  BatchWalk<3> bw;
  bw.init(obr, sy, st);
  int64_t Mf = M, inner = bw.inner, sA = bw.stride(0), sB = bw.stride(1), sC = bw.stride(2);
  if (bw.outer == 1 && sB == 0 && sA == M * K) { /* fold the batch into M */
    Mf = M * inner;
    inner = 1;
  }
  cudaDataType_t t = blas_type(dt);
  int64_t es = dt_size(dt);
  for (int64_t i = 0; i < bw.outer; i++) {
    int64_t off[3];
    bw.offsets(i, off);
    rc = gemm(cx, CUBLAS_OP_N, CUBLAS_OP_N, N, Mf, K, 1.0f, (const char *)b + off[1] * es, t, N, sB,
              (const char *)a + off[0] * es, t, K, sA, 0.0f, (char *)y + off[2] * es, t, N, sC, inner);
    if (rc)
      return rc;
  }
  return 0;
}
/*@end matmul@*/

/*@uses linear@*/
/* y = x w^T + b: y is first filled with b broadcast over the rows, then the
 * GEMM accumulates into it (beta = 1), so the bias is added in f32 and the
 * result rounded once. Column-major: Y^T [out, rows] = W [out, in] X^T. */
int tgm_cuda_linear(tgm_cuda_ctx *cx, int dt, const void *x, const void *w, const void *b, void *y, int64_t rows,
                    int64_t in, int64_t out) {
  cx->op = "tgm_cuda_linear";
  int rc;
  if (!is_float_dt(dt))
    return TGM_CUDA_BAD("dtype %s is not floating", dt_name(dt));
  if (rows < 0 || in < 0 || out < 0)
    return TGM_CUDA_BAD("negative size");
  if (rows * out == 0)
    return 0;
  if (!x || !w || !y)
    return TGM_CUDA_BAD("NULL pointer");
  int64_t es = dt_size(dt);
  if (b) {
    if ((rc = copy_rows(cx, b, 0, y, out * es, rows, out * es, NULL, 0)))
      return rc;
    if (in == 0)
      return 0;
  }
  cudaDataType_t t = blas_type(dt);
  return gemm(cx, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, 1.0f, w, t, in, 0, x, t, in, 0, b ? 1.0f : 0.0f, y, t, out,
              0, 1);
}
/*@end linear@*/

/* Whether tgm_cuda_gemm takes k_gemm_small for g (K > 0). Each of its up to
 * 4 row blocks reads all of B, so B is kept to 8 MB (N K <= 2^21), where the
 * re-reads hit L2; it was measured at mlp3's shapes (N K = 2^18 and 5120),
 * and larger weights are left to cuBLASLt, which reads B once. */
static bool small_gemm_ok(const tgm_gemm *g) {
  return g->dt == TGM_F32 && !g->ta && g->tb && g->batch == 1 && g->M <= kSmallRows && g->K > 0 && !g->bgrad &&
         g->N * g->K <= ((int64_t)1 << 21);
}

static int small_gemm(tgm_cuda_ctx *cx, const tgm_gemm *g) {
  const int64_t chunks = (g->K + 127) / 128;
  const int nw = (int)(chunks < kSmallWarps ? chunks : kSmallWarps);
  const bool vec = g->K % 4 == 0 && g->lda % 4 == 0 && g->ldb % 4 == 0 && aligned(g->A, 16) && aligned(g->B, 16);
  dim3 grid((unsigned)((g->N + 7) / 8), (unsigned)((g->M + 7) / 8));
  const float *A = (const float *)g->A, *B = (const float *)g->B, *bias = (const float *)g->bias,
              *res = (const float *)g->residual;
  float *aux = (float *)g->aux, *C = (float *)g->C;
  if (vec)
    k_gemm_small<true><<<grid, 32 * nw, 0, cx->stream>>>(A, g->lda, B, g->ldb, (int)g->M, (int)g->N, g->K, bias, aux, res,
                                                         C, g->ldc, g->act, g->accumulate, g->dact);
  else
    k_gemm_small<false><<<grid, 32 * nw, 0, cx->stream>>>(A, g->lda, B, g->ldb, (int)g->M, (int)g->N, g->K, bias, aux,
                                                          res, C, g->ldc, g->act, g->accumulate, g->dact);
  TGM_CUDA_LAUNCHED("k_gemm_small");
  return 0;
}

/* Whether tgm_cuda_gemm takes k_gemm_x3 for g (f32, K > 0, no bgrad): its
 * 16-byte loads need the operands' contiguous dims in fours and aligned
 * rows; and it pays only with about two waves of its 128 x 128 tiles (one
 * block an SM): at 1024 x 1024 x 4096 (64 tiles) cuBLAS's split-K sgemm
 * took 0.18 ms against its 0.31, at 1024 x 4096 x 4096 (256) 0.66 against
 * 0.61. (Tests set x3_force: any shape that it can load.) */
static bool x3_force = false;
static bool x3_ok(const tgm_cuda_ctx *cx, const tgm_gemm *g) {
  if (!cx->x3 || g->dt != TGM_F32 || g->K <= 0 || g->bgrad || g->M > 65535 * (int64_t)kX3M || g->N > INT_MAX ||
      g->K > INT_MAX || g->batch > 65535) /* (the grid's y and z) */
    return false;
  if (!aligned(g->A, 16) || !aligned(g->B, 16) || g->lda % 4 || g->ldb % 4 || g->sa % 4 || g->sb % 4 ||
      (g->ta ? g->M : g->K) % 4 || (g->tb ? g->K : g->N) % 4)
    return false;
  const int64_t tiles = (g->M + kX3M - 1) / kX3M * ((g->N + kX3N - 1) / kX3N) * g->batch;
  return x3_force || (tiles * 4 >= 7 * (int64_t)cx->sms && g->K >= 256);
}

template <bool TA, bool TB, int V> static void x3_launch_v(tgm_cuda_ctx *cx, const tgm_gemm *g) {
  dim3 grid((unsigned)((g->N + kX3N - 1) / kX3N), (unsigned)((g->M + kX3M - 1) / kX3M), (unsigned)g->batch);
  k_gemm_x3<TA, TB, V><<<grid, kX3Threads, x3_smem<TA, TB>(), cx->stream>>>(
      (const float *)g->A, g->lda, g->sa, (const float *)g->B, g->ldb, g->sb, (int)g->M, (int)g->N, (int)g->K,
      (const float *)g->bias, (float *)g->aux, (const float *)g->residual, (float *)g->C, g->ldc, g->sc, g->act,
      g->accumulate, g->dact);
}
template <bool TA, bool TB> static void x3_launch(tgm_cuda_ctx *cx, const tgm_gemm *g, int v) {
  if (v == 0)
    x3_launch_v<TA, TB, 0>(cx, g);
  else if (v == 2)
    x3_launch_v<TA, TB, 2>(cx, g);
  else
    x3_launch_v<TA, TB, 1>(cx, g);
}

static int x3_gemm(tgm_cuda_ctx *cx, const tgm_gemm *g) {
  /* V: 0 without an epilogue (the sums stored as pairs), else two outputs a step where every access of
   * the pair is 8-byte aligned (2), or one (1) */
  const bool plain = !g->bias && g->act == TGM_ACT_NONE && !g->aux && !g->residual && !g->accumulate && !g->dact;
  const bool v2 = g->ldc % 2 == 0 && g->sc % 2 == 0 && aligned(g->C, 8) && (!g->bias || aligned(g->bias, 8)) &&
                  (!g->aux || aligned(g->aux, 8)) && (!g->residual || aligned(g->residual, 8));
  const int v = plain && v2 ? 0 : v2 ? 2 : 1;
  if (!g->ta && !g->tb)
    x3_launch<false, false>(cx, g, v);
  else if (!g->ta)
    x3_launch<false, true>(cx, g, v);
  else if (!g->tb)
    x3_launch<true, false>(cx, g, v);
  else
    x3_launch<true, true>(cx, g, v);
  TGM_CUDA_LAUNCHED("k_gemm_x3");
  return 0;
}

/* At context creation: whether the wgmma kernels can run (hopper: a
 * compute capability 9.0 GPU, the sm_90a image loaded), and k_gemm_x3 (also
 * TGM_GEMM_X3 not 0, and its shared memory allowed). */
static void x3_setup(tgm_cuda_ctx *cx) {
  cudaDeviceProp prop;
  int *d = NULL, h = 0;
  const char *env = getenv("TGM_GEMM_X3");
  cx->x3 = cx->hopper = 0;
  if (cudaGetDeviceProperties(&prop, cx->device) != cudaSuccess || prop.major != 9 || prop.minor != 0 ||
      cudaMalloc((void **)&d, sizeof(int)) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  k_gemm_x3_probe<<<1, 1>>>(d);
  bool ok = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess && h == 1;
  cudaFree(d);
  cx->hopper = ok;
  ok = ok && !(env && env[0] == '0');
#define X3_SMEM(TA, TB)                                                                                                \
  ok = ok &&                                                                                                           \
       cudaFuncSetAttribute(k_gemm_x3<TA, TB, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, x3_smem<TA, TB>()) ==   \
           cudaSuccess &&                                                                                              \
       cudaFuncSetAttribute(k_gemm_x3<TA, TB, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, x3_smem<TA, TB>()) ==   \
           cudaSuccess &&                                                                                              \
       cudaFuncSetAttribute(k_gemm_x3<TA, TB, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, x3_smem<TA, TB>()) ==   \
           cudaSuccess;
  X3_SMEM(false, false)
  X3_SMEM(false, true)
  X3_SMEM(true, false)
  X3_SMEM(true, true)
#undef X3_SMEM
  cudaGetLastError();
  cx->x3 = ok;
}

/* Whether k_bgrad_cols takes g's bias gradient: op(A) transposed, its rows
 * whole vectors, the partials and tiles within the context's. */
static bool bgrad_cols_ok(const tgm_gemm *g) {
  const int64_t v = 16 / dt_size(g->dt);
  return g->ta && g->M % v == 0 && g->lda % v == 0 && aligned(g->A, 16) && g->M <= TGM_CUDA_SPLIT_PARTS / kBgradSplit &&
         (g->M + 32 * v - 1) / (32 * v) <= TGM_CUDA_SPLIT_TILES;
}

template <class T> static void bgrad_cols(tgm_cuda_ctx *cx, const tgm_gemm *g) {
  constexpr int V = 16 / sizeof(T);
  dim3 grid((unsigned)((g->M + 32 * V - 1) / (32 * V)), kBgradSplit);
  k_bgrad_cols<T, V><<<grid, 256, 0, cx->stream>>>((const T *)g->A, g->lda, g->M, g->K, cx->d_split_part,
                                                   cx->d_split_count, (T *)g->bgrad);
}

/* One (batched) GEMM with its epilogue (tgm_rt.h). cuBLASLt alone when one of
 * its epilogues (with beta) expresses the whole request; else the product
 * without epilogue and k_gemm_epilogue after it: without accumulation the
 * product goes straight into C (f32; bf16/f16 with the bias, rounded once
 * there) and the kernel works in place, otherwise into f32 scratch so that
 * C's old values stay readable. K = 0 is the kernel alone on a zero product. */
int tgm_cuda_gemm(tgm_cuda_ctx *cx, const tgm_gemm *g) {
  cx->op = "tgm_cuda_gemm";
  if (!g)
    return TGM_CUDA_BAD("NULL descriptor");
  if (!is_float_dt(g->dt))
    return TGM_CUDA_BAD("dtype %s is not floating", dt_name(g->dt));
  if ((g->ta & ~1) || (g->tb & ~1))
    return TGM_CUDA_BAD("ta %d / tb %d are not 0 or 1", g->ta, g->tb);
  if (g->M < 0 || g->N < 0 || g->K < 0 || g->batch < 0 || g->sa < 0 || g->sb < 0 || g->sc < 0)
    return TGM_CUDA_BAD("negative size or stride");
  if (g->act < TGM_ACT_NONE || g->act > TGM_ACT_GELU_TANH)
    return TGM_CUDA_BAD("unknown activation %d", g->act);
  if (g->dact && (!g->aux || (g->act != TGM_ACT_GELU && g->act != TGM_ACT_GELU_TANH)))
    return TGM_CUDA_BAD("dact needs aux and a gelu activation (act %d)", g->act);
  if (g->bgrad && g->batch > 1)
    return TGM_CUDA_BAD("bgrad with batch %lld (one batch only)", (long long)g->batch);
  if (g->lda < (g->ta ? g->M : g->K) || g->ldb < (g->tb ? g->K : g->N) || g->ldc < g->N)
    return TGM_CUDA_BAD("leading dims lda %lld, ldb %lld, ldc %lld too small for M %lld, N %lld, K %lld",
                        (long long)g->lda, (long long)g->ldb, (long long)g->ldc, (long long)g->M, (long long)g->N,
                        (long long)g->K);
  if (g->M == 0 || g->N == 0 || g->batch == 0)
    return 0;
  if (!g->C || (g->K > 0 && (!g->A || !g->B)))
    return TGM_CUDA_BAD("NULL pointer");
  if (g->batch > 1 && g->sc == 0)
    return TGM_CUDA_BAD("batch %lld with C's batch stride 0", (long long)g->batch);
  uint32_t epi;
  float beta;
  const void *cin;
  bool none = true;
  int rc;
  if (g->bgrad) { /* k_bgrad_cols, else in the matmul where cuBLASLt takes it, else apart */
    if (bgrad_cols_ok(g)) {
      switch (g->dt) {
      case TGM_BF16: bgrad_cols<bf16>(cx, g); break;
      case TGM_F16: bgrad_cols<f16>(cx, g); break;
      default: bgrad_cols<float>(cx, g); break;
      }
      TGM_CUDA_LAUNCHED("k_bgrad_cols");
      tgm_gemm p = *g;
      p.bgrad = NULL;
      return tgm_cuda_gemm(cx, &p);
    }
    if (g->K > 0 && lt_epilogue_for(g, &epi, &beta, &cin)) {
      if ((rc = lt_matmul(cx, g, g->C, 0, g->ldc, g->sc, cin, beta, epi, &none)))
        return rc;
      if (!none)
        return 0;
    }
    unsigned grid = (unsigned)((g->M + 31) / 32);
    switch (g->dt) {
    case TGM_BF16: k_gemm_bgrad<bf16><<<grid, 1024, 0, cx->stream>>>((const bf16 *)g->A, g->lda, g->ta, g->M, g->K, (bf16 *)g->bgrad); break;
    case TGM_F16: k_gemm_bgrad<f16><<<grid, 1024, 0, cx->stream>>>((const f16 *)g->A, g->lda, g->ta, g->M, g->K, (f16 *)g->bgrad); break;
    default: k_gemm_bgrad<float><<<grid, 1024, 0, cx->stream>>>((const float *)g->A, g->lda, g->ta, g->M, g->K, (float *)g->bgrad); break;
    }
    TGM_CUDA_LAUNCHED("k_gemm_bgrad");
    tgm_gemm p = *g;
    p.bgrad = NULL;
    return tgm_cuda_gemm(cx, &p);
  }
  if (g->K == 0)
    return gemm_epilogue(cx, g, NULL, 0, 0, 0);
  if (small_gemm_ok(g))
    return small_gemm(cx, g);
  if (x3_ok(cx, g))
    return x3_gemm(cx, g);
  if (lt_epilogue_for(g, &epi, &beta, &cin)) {
    if ((rc = lt_matmul(cx, g, g->C, 0, g->ldc, g->sc, cin, beta, epi, &none)))
      return rc;
    if (!none)
      return 0;
  }
  if (!g->accumulate && g->residual != g->C && (!g->aux || g->aux != g->C)) {
    /* the product (bf16/f16: with the bias, rounded to C's dtype) in C, then the rest in place */
    tgm_gemm p = *g;
    uint32_t e = CUBLASLT_EPILOGUE_DEFAULT;
    if (g->dt != TGM_F32 && g->bias) {
      e = CUBLASLT_EPILOGUE_BIAS;
      p.bias = NULL;
    }
    if ((rc = lt_matmul(cx, g, g->C, g->dt == TGM_F32, g->ldc, g->sc, NULL, 0.0f, e, &none)))
      return rc;
    if (none)
      return fail(cx, (int)CUBLAS_STATUS_NOT_SUPPORTED, "cuBLASLt has no algorithm for this GEMM (%s, %lld x %lld x %lld)",
                  dt_name(g->dt), (long long)g->M, (long long)g->N, (long long)g->K);
    return gemm_epilogue(cx, &p, g->C, 1, g->ldc, g->sc);
  }
  return gemm_via_scratch(cx, g);
}

/* ---------------------------------------------------------------- neural */

/*@uses embedding@*/
int tgm_cuda_embedding(tgm_cuda_ctx *cx, int dt, const int32_t *idx, int64_t n, const void *table, int64_t V, int64_t D,
                       void *y) {
  cx->op = "tgm_cuda_embedding";
  if (!dt_ok(dt))
    return TGM_CUDA_BAD("bad dtype %d", dt);
  if (n < 0 || V < 0 || D < 0)
    return TGM_CUDA_BAD("negative size");
  if (n == 0)
    return 0;
  if (!idx || (!table && V && D) || (!y && D))
    return TGM_CUDA_BAD("NULL pointer");
  int64_t es = dt_size(dt);
  if (D == 0) /* nothing to copy, but the indices are still checked */
    return launch_rows<uint8_t>(cx, table, 0, y, 0, n, 0, idx, V);
  return copy_rows(cx, table, D * es, y, D * es, n, D * es, idx, V);
}
/*@end embedding@*/

/*@uses embedding_backward@*/
template <class T>
static int emb_rows_typed(tgm_cuda_ctx *cx, const void *dy, int64_t D, int64_t V, uint32_t nkeys, const uint32_t *pos,
                          const uint32_t *lo, const uint32_t *hi, uint32_t *heavy, uint32_t *nheavy, int64_t maxheavy,
                          void *out) {
  const int cpt = 4;
  int64_t nt = ((D + cpt - 1) / cpt + 31) / 32 * 32;
  nt = nt < 64 ? 64 : nt > 256 ? 256 : nt;
  unsigned grid = (unsigned)(V < ((int64_t)1 << 24) ? V : ((int64_t)1 << 24));
  k_emb_rows<T, cpt, 8><<<grid, (unsigned)nt, 0, cx->stream>>>((const T *)dy, D, V, nkeys, pos, lo, hi, heavy, nheavy,
                                                               (T *)out);
  TGM_CUDA_LAUNCHED("k_emb_rows");
  if (maxheavy > 0) {
    const int ht = 64;
    int64_t gx = (D + ht - 1) / ht;
    dim3 g((unsigned)(gx < 65535 ? gx : 65535), (unsigned)(maxheavy < 65535 ? maxheavy : 65535));
    k_emb_heavy<T, 64><<<g, ht, 0, cx->stream>>>((const T *)dy, D, pos, lo, hi, heavy, nheavy, (T *)out);
    TGM_CUDA_LAUNCHED("k_emb_heavy");
  }
  return 0;
}

/* Deterministic without atomics on the sums: (1) keys = the indices (bad ones
 * to a sentinel above the rest, recorded in d_bad), values = the positions;
 * (2) CUB's radix sort by key, stable, over the key's bits only (16 bits for
 * V = 50304: two passes): each row's positions end up contiguous and in
 * increasing order; (3) each row's segment [lo, hi) from the sorted keys;
 * (4) one block per row adds its dy rows in that order in f32 and writes the
 * row once, except (5) rows of more than kEmbHeavy positions, which are split
 * by columns over many blocks (same order of adds). The sums are those of
 * tgm_cpu_embedding_backward, bit for bit.
 * Cost at GPT-2 sizes (V = 50304, D = 768, n = 16384) on an H100 (tests/gpu/
 * test_cuda_kernels.cu, group timing): 0.15 ms (f32) / 0.14 ms (bf16) with
 * uniform indices, where writing the [V, D] result (155 / 77 MB) dominates;
 * 0.21 ms with Zipf indices (the top row 9% of the positions); 0.95 ms in the
 * worst case, every position on one row, where the in-order f32 sum of 16384
 * rows per column is latency-bound (the order is what makes it exact). */
int tgm_cuda_embedding_backward(tgm_cuda_ctx *cx, int dt, const int32_t *idx, int64_t n, const void *dy, int64_t V,
                                int64_t D, void *out) {
  cx->op = "tgm_cuda_embedding_backward";
  if (!is_float_dt(dt))
    return TGM_CUDA_BAD("dtype %s is not floating", dt_name(dt));
  if (n < 0 || V < 0 || D < 0)
    return TGM_CUDA_BAD("negative size");
  if (n > (int64_t)INT32_MAX)
    return TGM_CUDA_BAD("%lld indices: at most 2^31 - 1", (long long)n);
  if ((n && !idx) || (n && D && !dy) || (V && D && !out))
    return TGM_CUDA_BAD("NULL pointer");
  int64_t es = dt_size(dt);
  if (n == 0) {
    if (V * D != 0)
      TGM_CUDA_TRY(cudaMemsetAsync(out, 0, (size_t)(V * D * es), cx->stream));
    return 0;
  }
  /* keys < nkeys are rows (int32 indices reach 2^31 - 1 at most); nkeys is the bad-index sentinel */
  uint32_t nkeys = V < ((int64_t)1 << 31) ? (uint32_t)V : (uint32_t)1 << 31;
  int bits = 1;
  while (bits < 32 && (nkeys >> bits))
    bits++;
  size_t sort_bytes = 0;
  TGM_CUDA_TRY(cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const uint32_t *)NULL, (uint32_t *)NULL,
                                               (const uint32_t *)NULL, (uint32_t *)NULL, (int)n, 0, bits, cx->stream));
  /* scratch: key, val, sorted key, pos [n] each; lo, hi [nkeys], nheavy, heavy [maxheavy]; CUB's temporary */
  int64_t maxheavy = n / ((int64_t)kEmbHeavy + 1); /* rows with more than kEmbHeavy positions, at most */
  size_t nb = (size_t)TGM_ALIGN(4 * n), kb = (size_t)TGM_ALIGN(4 * (2 * (int64_t)nkeys + 1 + maxheavy));
  void *p;
  int rc = scratch(cx, 4 * nb + kb + sort_bytes, &p);
  if (rc)
    return rc;
  char *base = (char *)p;
  uint32_t *key = (uint32_t *)base, *val = (uint32_t *)(base + nb), *skey = (uint32_t *)(base + 2 * nb),
           *pos = (uint32_t *)(base + 3 * nb), *lo = (uint32_t *)(base + 4 * nb), *hi = lo + nkeys,
           *nheavy = hi + nkeys, *heavy = nheavy + 1;
  void *tmp = base + 4 * nb + kb;
  k_emb_keys<<<grid_for(cx, n, kThreads), kThreads, 0, cx->stream>>>(idx, n, V, nkeys, key, val, cx->d_bad);
  TGM_CUDA_LAUNCHED("k_emb_keys");
  if (V * D == 0)
    return 0;
  TGM_CUDA_TRY(cub::DeviceRadixSort::SortPairs(tmp, sort_bytes, (const uint32_t *)key, skey, (const uint32_t *)val,
                                               pos, (int)n, 0, bits, cx->stream));
  TGM_CUDA_TRY(cudaMemsetAsync(lo, 0, sizeof(uint32_t) * (2 * (size_t)nkeys + 1), cx->stream)); /* lo, hi, nheavy */
  k_emb_bounds<<<grid_for(cx, n, kThreads), kThreads, 0, cx->stream>>>(skey, n, nkeys, lo, hi);
  TGM_CUDA_LAUNCHED("k_emb_bounds");
  switch (dt) {
  case TGM_F32: return emb_rows_typed<float>(cx, dy, D, V, nkeys, pos, lo, hi, heavy, nheavy, maxheavy, out);
  case TGM_BF16: return emb_rows_typed<bf16>(cx, dy, D, V, nkeys, pos, lo, hi, heavy, nheavy, maxheavy, out);
  default: return emb_rows_typed<f16>(cx, dy, D, V, nkeys, pos, lo, hi, heavy, nheavy, maxheavy, out);
  }
}
/*@end embedding_backward@*/

/*@uses dropout@*/
template <class T>
static int dropout_typed(tgm_cuda_ctx *cx, const void *x, void *y, int64_t n, uint32_t t, float s, uint2 key,
                         uint32_t s0, uint32_t s1) {
  k_dropout<T><<<grid_for(cx, n, kThreads), kThreads, 0, cx->stream>>>((const T *)x, (T *)y, n, t, s, key, s0, s1);
  TGM_CUDA_LAUNCHED("k_dropout");
  return 0;
}

/* The mask of tgm_cpu_dropout (see there): kept iff 2 (r >> 8) + 1 >= t =
 * ceil(p 2^25), i.e. u >= p exactly; y = f32(x) * (float)(1 / (1 - p)). */
int tgm_cuda_dropout(tgm_cuda_ctx *cx, int dt, const void *x, void *y, int64_t n, double p, uint64_t seed,
                     uint32_t ordinal, uint64_t step) {
  cx->op = "tgm_cuda_dropout";
  if (!is_float_dt(dt))
    return TGM_CUDA_BAD("dtype %s is not floating", dt_name(dt));
  if (n < 0)
    return TGM_CUDA_BAD("negative size");
  if (n == 0)
    return 0;
  if (!x || !y)
    return TGM_CUDA_BAD("NULL pointer");
  if (!(p < 1)) { /* everything dropped */
    TGM_CUDA_TRY(cudaMemsetAsync(y, 0, (size_t)(n * dt_size(dt)), cx->stream));
    return 0;
  }
  uint32_t t = p > 0 ? (uint32_t)ceil(p * 33554432.0) : 0;
  float s = (float)(1.0 / (1.0 - p));
  uint2 key = make_uint2((uint32_t)seed, (uint32_t)(seed >> 32) ^ ordinal);
  uint32_t s0 = (uint32_t)step, s1 = (uint32_t)(step >> 32);
  switch (dt) {
  case TGM_F32: return dropout_typed<float>(cx, x, y, n, t, s, key, s0, s1);
  case TGM_BF16: return dropout_typed<bf16>(cx, x, y, n, t, s, key, s0, s1);
  default: return dropout_typed<f16>(cx, x, y, n, t, s, key, s0, s1);
  }
}
/*@end dropout@*/

/*@uses attention attention_backward@*/
/* The checks both attention calls make, and the layout they walk. A floating
 * dtype; n views t[] (q, k, v, the result y or dy, and for the backward dq,
 * dk, dv; a NULL view or p: dq, dk, dv not wanted) of rank 2 to
 * TGM_MAXRANK with no negative dims; shapes that match (q [.., Tq, D], k
 * [.., Tk, D], v [.., Tk, Dv], t[3] [batch.., Tq, Dv], dq, dk, dv [batch..,
 * Tq or Tk, D or Dv] with t[3]'s batch dims, which q, k, v's broadcast to);
 * and, for each view with memory, a last-dim stride of 1 and a row stride of
 * at least the row's length (unless that dim has size 1). Out: st[p] view p's
 * strides over t[3]'s batch dims (0 where it broadcasts) and ld[p] its row
 * stride (a single row's: its length); both 0 for a view without memory. */
static int attention_shapes(tgm_cuda_ctx *cx, int dt, int n, const tgm_view *const *t, int64_t *Tq, int64_t *D,
                            int64_t *Tk, int64_t *Dv, int64_t st[][TGM_MAXRANK], int64_t *ld) {
  const char *const name[7] = {"q", "k", "v", n == 4 ? "y" : "dy", "dq", "dk", "dv"};
  int rc;
  if (!is_float_dt(dt))
    return TGM_CUDA_BAD("dtype %s is not floating", dt_name(dt));
  for (int p = 0; p < n; p++) {
    if (!t[p] && p < 4)
      return TGM_CUDA_BAD("%s: NULL view", name[p]);
    if (t[p] && (rc = check_shape(cx, name[p], t[p]->rank, t[p]->shape)))
      return rc;
    if (t[p] && t[p]->rank < 2)
      return TGM_CUDA_BAD("%s: rank %d is below 2", name[p], t[p]->rank);
  }
  const int nb = t[3]->rank - 2;
  const int64_t *sb = t[3]->shape;
  *Tq = t[0]->shape[t[0]->rank - 2], *D = t[0]->shape[t[0]->rank - 1];
  *Tk = t[1]->shape[t[1]->rank - 2], *Dv = t[2]->shape[t[2]->rank - 1];
  const int64_t want[7][2] = {{*Tq, *D}, {*Tk, *D}, {*Tk, *Dv}, {*Tq, *Dv}, {*Tq, *D}, {*Tk, *D}, {*Tk, *Dv}};
  for (int p = 0; p < n; p++) {
    const tgm_view *v = t[p];
    ld[p] = 0;
    for (int k = 0; k < nb; k++)
      st[p][k] = 0;
    if (!v || (p >= 4 && !v->p))
      continue;
    const int r = v->rank, vb = r - 2;
    if (v->shape[r - 2] != want[p][0] || v->shape[r - 1] != want[p][1])
      return TGM_CUDA_BAD("%s: its last dims [%lld, %lld] do not match the others' (want [%lld, %lld])", name[p],
                          (long long)v->shape[r - 2], (long long)v->shape[r - 1], (long long)want[p][0],
                          (long long)want[p][1]);
    if (vb > nb || (p >= 4 && vb != nb))
      return TGM_CUDA_BAD("%s: %d batch dims where %s has %d", name[p], vb, name[3], nb);
    for (int k = 0; k < nb; k++) {
      int kk = k - (nb - vb);
      if (kk >= 0 && v->shape[kk] != sb[k] && (p >= 3 || v->shape[kk] != 1))
        return TGM_CUDA_BAD("%s: batch dim %d is %lld, which does not %s %s's %lld", name[p], kk,
                            (long long)v->shape[kk], p >= 3 ? "equal" : "broadcast to", name[3], (long long)sb[k]);
      st[p][k] = kk < 0 || v->shape[kk] == 1 ? 0 : v->st[kk];
    }
    if (!v->p) { /* y not wanted (its shape gives the batch): nothing to lay out */
      for (int k = 0; k < nb; k++)
        st[p][k] = 0;
      continue;
    }
    if (v->shape[r - 1] > 1 && v->st[r - 1] != 1)
      return TGM_CUDA_BAD("%s: the last dim's stride is %lld, not 1", name[p], (long long)v->st[r - 1]);
    if (v->shape[r - 2] > 1 && v->st[r - 2] < v->shape[r - 1])
      return TGM_CUDA_BAD("%s: the row stride %lld is below the row's length %lld", name[p], (long long)v->st[r - 2],
                          (long long)v->shape[r - 1]);
    ld[p] = v->shape[r - 2] > 1 ? v->st[r - 2] : v->shape[r - 1];
  }
  return 0;
}

/* Zeros of dtype dt through a view laid out by attention_shapes (p, batch
 * strides st over the nb batch dims sb, row stride ld): rows x cols of every
 * batch element, nothing else. */
static int zero_view(tgm_cuda_ctx *cx, int dt, void *p, int nb, const int64_t *sb, const int64_t *st, int64_t rows,
                     int64_t cols, int64_t ld) {
  const int64_t n = numel_of(nb, sb) * rows * cols;
  if (n == 0)
    return 0;
  Geo<1> g;
  g.rank = nb;
  for (int k = 0; k < nb; k++) {
    g.shape[k] = sb[k];
    g.st[0][k] = st[k];
  }
  collapse(&g);
  if (dt_size(dt) == 2)
    k_zero_view<uint16_t><<<grid_for(cx, n, kThreads), kThreads, 0, cx->stream>>>((uint16_t *)p, g, rows, cols, ld, n);
  else
    k_zero_view<uint32_t><<<grid_for(cx, n, kThreads), kThreads, 0, cx->stream>>>((uint32_t *)p, g, rows, cols, ld, n);
  TGM_CUDA_LAUNCHED("k_zero_view");
  return 0;
}
/*@end attention attention_backward@*/

/*@uses attention@*/
int tgm_cuda_attention(tgm_cuda_ctx *cx, int dt, const tgm_view *q, const tgm_view *k, const tgm_view *v,
                       const tgm_view *y, int causal, double scale, float *lse) {
  cx->op = "tgm_cuda_attention";
  const tgm_view *t[4] = {q, k, v, y};
  int64_t Tq = 0, D = 0, Tk = 0, Dv = 0, st[4][TGM_MAXRANK], ld[4]; /* (set by attention_shapes; gcc may not see it) */
  int rc = attention_shapes(cx, dt, 4, t, &Tq, &D, &Tk, &Dv, st, ld);
  if (rc)
    return rc;
  const int nb = y->rank - 2;
  if (numel_of(nb, y->shape) * Tq == 0)
    return 0;
  if (!q->p || !k->p || !v->p || (!y->p && !lse))
    return TGM_CUDA_BAD("NULL pointer");
  if (Tk == 0) { /* softmax over nothing, times nothing: zeros, as the reference; lse = log 0 */
    if (y->p && (rc = zero_view(cx, dt, y->p, nb, y->shape, st[3], Tq, Dv, ld[3])))
      return rc;
    if (lse) {
      int64_t nl = numel_of(nb, y->shape) * Tq;
      k_fill<float><<<grid_for(cx, nl, kThreads), kThreads, 0, cx->stream>>>(lse, nl, -INFINITY);
      TGM_CUDA_LAUNCHED("k_fill");
    }
    return 0;
  }
  BatchWalk<4> bw;
  bw.init(nb, y->shape, st);
  switch (dt) {
  case TGM_F32:
    return attention_typed(cx, dt, (const float *)q->p, (const float *)k->p, (const float *)v->p, (float *)y->p, bw,
                           ld, Tq, Tk, D, Dv, causal, (float)scale, lse);
  case TGM_BF16:
    return attention_typed(cx, dt, (const bf16 *)q->p, (const bf16 *)k->p, (const bf16 *)v->p, (bf16 *)y->p, bw, ld,
                           Tq, Tk, D, Dv, causal, (float)scale, lse);
  default:
    return attention_typed(cx, dt, (const f16 *)q->p, (const f16 *)k->p, (const f16 *)v->p, (f16 *)y->p, bw, ld, Tq,
                           Tk, D, Dv, causal, (float)scale, lse);
  }
}
/*@end attention@*/

/*@uses attention_backward@*/
int tgm_cuda_attention_backward(tgm_cuda_ctx *cx, int dt, const tgm_view *q, const tgm_view *k, const tgm_view *v,
                                const tgm_view *dy, const float *lse, const float *delta, const tgm_view *dq,
                                const tgm_view *dk, const tgm_view *dv, int causal, double scale) {
  cx->op = "tgm_cuda_attention_backward";
  const tgm_view *t[7] = {q, k, v, dy, dq, dk, dv};
  int64_t Tq = 0, D = 0, Tk = 0, Dv = 0, st[7][TGM_MAXRANK], ld[7]; /* (as tgm_cuda_attention's) */
  int rc = attention_shapes(cx, dt, 7, t, &Tq, &D, &Tk, &Dv, st, ld);
  if (rc)
    return rc;
  const int nb = dy->rank - 2;
  void *pq = dq ? dq->p : NULL, *pk = dk ? dk->p : NULL, *pv = dv ? dv->p : NULL;
  if (numel_of(nb, dy->shape) == 0 || (!pq && !pk && !pv))
    return 0;
  if (Tq == 0 || Tk == 0 || D == 0 || Dv == 0) { /* sums over nothing: zeros */
    if ((pq && (rc = zero_view(cx, dt, pq, nb, dy->shape, st[4], Tq, D, ld[4]))) ||
        (pk && (rc = zero_view(cx, dt, pk, nb, dy->shape, st[5], Tk, D, ld[5]))) ||
        (pv && (rc = zero_view(cx, dt, pv, nb, dy->shape, st[6], Tk, Dv, ld[6]))))
      return rc;
    return 0;
  }
  if (!q->p || !k->p || !v->p || !dy->p || !lse || !delta)
    return TGM_CUDA_BAD("NULL pointer");
  BatchWalk<7> bw;
  bw.init(nb, dy->shape, st);
  switch (dt) {
  case TGM_F32:
    return attention_backward_typed(cx, dt, (const float *)q->p, (const float *)k->p, (const float *)v->p,
                                    (const float *)dy->p, lse, delta, (float *)pq, (float *)pk, (float *)pv, bw, ld, Tq,
                                    Tk, D, Dv, causal, (float)scale);
  case TGM_BF16:
    return attention_backward_typed(cx, dt, (const bf16 *)q->p, (const bf16 *)k->p, (const bf16 *)v->p,
                                    (const bf16 *)dy->p, lse, delta, (bf16 *)pq, (bf16 *)pk, (bf16 *)pv, bw, ld, Tq, Tk,
                                    D, Dv, causal, (float)scale);
  default:
    return attention_backward_typed(cx, dt, (const f16 *)q->p, (const f16 *)k->p, (const f16 *)v->p,
                                    (const f16 *)dy->p, lse, delta, (f16 *)pq, (f16 *)pk, (f16 *)pv, bw, ld, Tq, Tk, D,
                                    Dv, causal, (float)scale);
  }
}
/*@end attention_backward@*/

/* Every element = v rounded to dt (via f32 for bf16/f16, as the host's
 * conversions; to i32 truncated; to bool v != 0). */
int tgm_cuda_fill(tgm_cuda_ctx *cx, int dt, void *y, int64_t n, double v) {
  cx->op = "tgm_cuda_fill";
  if (!dt_ok(dt) || n < 0)
    return TGM_CUDA_BAD("bad dtype %d or size %lld", dt, (long long)n);
  if (n == 0)
    return 0;
  if (!y)
    return TGM_CUDA_BAD("NULL pointer");
  uint32_t bits = 0;
  float f = (float)v;
  switch (dt) {
  case TGM_F32: memcpy(&bits, &f, 4); break;
  case TGM_BF16: {
    bf16 h = __float2bfloat16_rn(f);
    uint16_t u;
    memcpy(&u, &h, 2);
    bits = u;
    break;
  }
  case TGM_F16: {
    f16 h = __float2half_rn(f);
    uint16_t u;
    memcpy(&u, &h, 2);
    bits = u;
    break;
  }
  case TGM_I32: {
    int32_t i = v != v ? 0 : v <= (double)INT32_MIN ? INT32_MIN : v >= (double)INT32_MAX ? INT32_MAX : (int32_t)v;
    memcpy(&bits, &i, 4);
    break;
  }
  default: bits = v != 0; break;
  }
  int es = dt_size(dt);
  if (bits == 0 || es == 1) {
    TGM_CUDA_TRY(cudaMemsetAsync(y, (int)bits, (size_t)n * es, cx->stream));
    return 0;
  }
  if (es == 2)
    k_fill<uint16_t><<<grid_for(cx, n, kThreads), kThreads, 0, cx->stream>>>((uint16_t *)y, n, (uint16_t)bits);
  else
    k_fill<uint32_t><<<grid_for(cx, n, kThreads), kThreads, 0, cx->stream>>>((uint32_t *)y, n, bits);
  TGM_CUDA_LAUNCHED("k_fill");
  return 0;
}

/* ---------------------------------------------------------------- accessors */

/* Autotune on or off; file: where the choices are read and written (NULL
 * or "": kept in memory only). Plans already built keep their algorithm
 * until they are rebuilt, so this is set before the first call. */
int tgm_cuda_set_tune(tgm_cuda_ctx *cx, int on, const char *file) {
  cx->op = "tgm_cuda_set_tune";
  if (file && strlen(file) >= sizeof cx->tune_file)
    return TGM_CUDA_BAD("the file name is longer than %d bytes", (int)sizeof cx->tune_file - 1);
  if (on && !cx->tunes && !(cx->tunes = (tgm_cuda_tune *)calloc(TGM_CUDA_TUNES, sizeof *cx->tunes)))
    return TGM_CUDA_BAD("out of host memory");
  snprintf(cx->tune_file, sizeof cx->tune_file, "%s", file ? file : "");
  cx->tune = on;
  cx->tune_read = 0;
  cx->ntunes = 0;
  for (int i = 0; i < TGM_CUDA_GEMM_PLANS; i++) /* rebuilt with the new choices */
    lt_plan_free(&cx->plans[i]);
  return 0;
}

/* For kernel files that cannot see struct tgm_cuda_ctx (tgm_optim_cuda.cu). */
int tgm_cuda_set_stream(tgm_cuda_ctx *cx, void *stream) {
  cx->op = "tgm_cuda_set_stream";
  if (cx->capturing)
    return TGM_CUDA_BAD("a CUDA graph is being recorded");
  cudaStream_t s = stream ? (cudaStream_t)stream : cx->own;
  if (s != cx->stream) {
    TGM_CUDA_TRY(cudaStreamSynchronize(cx->stream)); /* the old stream's work first: the scratch is shared */
    TGM_CUDA_BLAS(cublasSetStream(cx->blas, s));
    cx->stream = s;
  }
  return 0;
}

int tgm_cuda_graph_begin(tgm_cuda_ctx *cx) {
  cx->op = "tgm_cuda_graph_begin";
  TGM_CUDA_TRY(cudaStreamBeginCapture(cx->stream, cudaStreamCaptureModeThreadLocal));
  cx->capturing = 1;
  return 0;
}

/* Ends the recording (also after a failed call in between: then *graph is
 * NULL and the error of the failed call is kept). */
int tgm_cuda_graph_end(tgm_cuda_ctx *cx, void **graph) {
  cudaGraph_t g = NULL;
  cudaGraphExec_t x = NULL;
  *graph = NULL;
  cx->capturing = 0;
  cudaError_t e = cudaStreamEndCapture(cx->stream, &g);
  if (e == cudaSuccess)
    e = cudaGraphInstantiate(&x, g, 0);
  if (g)
    cudaGraphDestroy(g);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return cuda_fail(cx, e, "recording a CUDA graph");
  }
  *graph = x;
  return 0;
}

int tgm_cuda_graph_launch(tgm_cuda_ctx *cx, void *graph) {
  cx->op = "tgm_cuda_graph_launch";
  TGM_CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)graph, cx->stream));
  return 0;
}

void tgm_cuda_graph_free(void *graph) {
  if (graph)
    cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

unsigned tgm_cuda_ctx_generation(const tgm_cuda_ctx *cx) { return cx->generation; }

cudaStream_t tgm_cuda_ctx_stream(tgm_cuda_ctx *cx, const char *op) {
  cx->op = op;
  return cx->stream;
}

int tgm_cuda_ctx_fail(tgm_cuda_ctx *cx, int code, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return fail(cx, code, "%s", msg);
}

int tgm_cuda_ctx_scratch(tgm_cuda_ctx *cx, size_t bytes, void **p) { return scratch(cx, bytes, p); }
