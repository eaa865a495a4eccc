/* mlp_cuda.cu: the CUDA library calls of the runtime (the "CUDA kernels"
 * section of mlp_rt.h): the context, the GEMMs (matmul, linear, gemm),
 * attention, embedding and its backward, dropout, cast and fill; the
 * pointwise, reduction, view and loss kernels are generated per model
 * (NAME_cuda.cu).
 *
 * Template: copied into every emitted project as src/NAME_kernels_cuda.cu
 * with "mlp_" renamed; it needs only the CUDA Toolkit (cudart, cuBLAS,
 * cuBLASLt, and CUB's headers for embedding_backward's radix sort). Every
 * entry point checks its arguments, enqueues its work on the context's stream
 * and returns 0, or a CUDA/cuBLAS error code with "FUNCTION: what went wrong"
 * in the context (mlp_cuda_ctx_error); nothing here exits or aborts. Only
 * the sections of the library calls a model makes are copied (mlp_rt.h,
 * "Sections"); CUB's header is in embedding_backward's.
 *
 * Semantics are PyTorch's, as gen/interp.c computes them in double: storage
 * f32 / bf16 / f16 (and i32 / bool for cast and fill), arithmetic and
 * accumulation in f32, results rounded once to the storage dtype. No
 * fast-math: the GEMM epilogue's gelu is mlp_math.h's (the generated
 * kernels'), on CUDA's precise erfcf and tanhf.
 *
 * Layout of this file:
 *   the context, errors, scratch
 *   device helpers: dtype conversion, Philox, packed vectors, batch geometry
 *   kernels: cast, row copies, fill, the attention softmax, embedding_backward,
 *            dropout, the GEMM epilogue
 *   host helpers: geometry (broadcast strides, dim collapsing), GEMM,
 *                 cuBLASLt plans (mlp_cuda_gemm), attention
 *   the entry points, in the order of mlp_rt.h
 *
 * Batch geometry: a batched call over batch shape S reads operand p at
 * offset sum_k idx_k * st[p][k] (stride 0 = broadcast); the host collapses it
 * (drops size-1 dims, merges neighbours that are contiguous for every
 * operand), so that usually one strided-batched call covers the batch. */
#include "mlp_rt.h"
#include "mlp_math.h"

#include <cublasLt.h>
#include <cublas_v2.h>
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

#define MLP_CUDA_BLAS_WS ((size_t)32 << 20)      /* cuBLAS workspace (Hopper: 32 MiB) */
#define MLP_CUDA_ATTN_BUDGET ((size_t)256 << 20) /* attention scores scratch per chunk */
#ifndef MLP_CUDA_GEMM_BUDGET
#define MLP_CUDA_GEMM_BUDGET ((size_t)256 << 20) /* mlp_cuda_gemm's f32 product scratch per piece */
#endif
#define MLP_CUDA_GEMM_PLANS 16                   /* cuBLASLt plans kept per context */
#define MLP_CUDA_TUNES 256                       /* autotuned GEMM choices kept per context */
#define MLP_CUDA_TUNE_CANDIDATES 8               /* the heuristic's algorithms timed per GEMM */

/* What identifies a cuBLASLt plan: the problem as cuBLASLt sees it (types,
 * transposes, sizes, leading dims, batch count and strides, epilogue, beta 0
 * or 1) and the alignment of each pointer (the heuristic's choice depends on
 * it). Zero-filled before use, compared with memcmp. */
struct mlp_cuda_gemm_key {
  int32_t dt, d_f32, ta, tb, batch, beta1;
  uint32_t epilogue;
  uint32_t align[6]; /* A, B, C, D, bias, aux (bytes, at most 256) */
  int64_t M, N, K, lda, ldb, ldd, sa, sb, sd;
};

/* A cached cuBLASLt plan: the matmul descriptor (transposes, epilogue, aux
 * leading dim and batch stride; the bias and aux pointers are set per call),
 * the four layouts, and the heuristic's algorithm (ok = 0: there was none). */
struct mlp_cuda_gemm_plan {
  int used, ok;
  int tuned; /* autotune: the algorithm is the timed or cached choice (or timing was not possible) */
  struct mlp_cuda_gemm_key key;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c, d;
  cublasLtMatmulAlgo_t algo;
};

/* An autotuned GEMM: its key, the fastest algorithm and the times of it
 * and of the heuristic's first choice (ms; 0 when read from the file). */
struct mlp_cuda_tune {
  struct mlp_cuda_gemm_key key;
  cublasLtMatmulAlgo_t algo;
  float ms, heuristic_ms;
};

struct mlp_cuda_alloc {
  void *p;
  size_t n;
};

struct mlp_cuda_ctx {
  int device;                /* the device current at creation */
  int sms;                   /* its multiprocessor count, for grid sizes */
  cudaStream_t stream;       /* every kernel, copy and GEMM is enqueued here, in order */
  cudaStream_t own;          /* the context's stream (`stream` unless the caller set one) */
  int capturing;             /* between graph_begin and graph_end: nothing may wait or allocate */
  unsigned generation;       /* scratch reallocations (graphs hold the scratch pointer) */
  cublasHandle_t blas;       /* bound to `stream`; CUBLAS_COMPUTE_32F never uses TF32 */
  void *blas_ws;             /* cuBLAS workspace, MLP_CUDA_BLAS_WS bytes (cuBLASLt's too: same stream) */
  cublasLtHandle_t lt;       /* cuBLASLt (mlp_cuda_gemm); calls pass `stream` */
  struct mlp_cuda_gemm_plan plans[MLP_CUDA_GEMM_PLANS]; /* mlp_cuda_gemm's plan cache, round robin */
  int next_plan;
  int hopper;                /* sm_90a code loaded on a compute capability 9.0 GPU: the wgmma kernels run */
  int x3;                    /* k_gemm_x3 runs here (hopper, MLP_GEMM_X3 not 0) */
  int tune;                  /* max-autotune: a GEMM's first call times the heuristic's candidates */
  char tune_file[512];       /* the choices' file ("": kept in memory only) */
  int tune_read;             /* tune_file was read */
  struct mlp_cuda_tune *tunes; /* the choices, MLP_CUDA_TUNES at most */
  int ntunes;
  unsigned long long *d_bad; /* device int64: smallest bad data position, INT64_MAX if none */
  float *d_split_part;       /* split reductions: the blocks' partials (MLP_CUDA_SPLIT_PARTS floats) */
  unsigned *d_split_count;   /* and per output tile the blocks done (MLP_CUDA_SPLIT_TILES, zero between kernels) */
  void *scratch;             /* growable scratch: attention scores, loss rows, partial states */
  size_t scratch_bytes;
  struct mlp_cuda_alloc *allocs; /* the live cudaMallocs (dev_malloc), for the memory held now and at most */
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
int fail(mlp_cuda_ctx *cx, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int fail(mlp_cuda_ctx *cx, int code, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(cx->err, sizeof cx->err, "%s: %s", cx->op ? cx->op : "mlp_cuda", msg);
  return code ? code : (int)cudaErrorUnknown;
}

/* A failed CUDA call: its name and CUDA's description. */
int cuda_fail(mlp_cuda_ctx *cx, cudaError_t e, const char *what) {
  return fail(cx, (int)e, "%s failed: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* A failed cuBLAS call. */
int blas_fail(mlp_cuda_ctx *cx, cublasStatus_t s, const char *what) {
  return fail(cx, (int)s, "%s failed: %s (cuBLAS status %d)", what, cublasGetStatusString(s), (int)s);
}

/* A bad argument (a bug in the caller): cudaErrorInvalidValue with a message. */
#define MLP_CUDA_BAD(...) fail(cx, (int)cudaErrorInvalidValue, __VA_ARGS__)

#define MLP_CUDA_TRY(call)                                                                                             \
  do {                                                                                                                 \
    cudaError_t e_ = (call);                                                                                           \
    if (e_ != cudaSuccess)                                                                                             \
      return cuda_fail(cx, e_, #call);                                                                                 \
  } while (0)

#define MLP_CUDA_BLAS(call)                                                                                            \
  do {                                                                                                                 \
    cublasStatus_t s_ = (call);                                                                                        \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                                                   \
      return blas_fail(cx, s_, #call);                                                                                 \
  } while (0)

/* After every launch: a bad configuration (or an earlier asynchronous fault). */
#define MLP_CUDA_LAUNCHED(name)                                                                                        \
  do {                                                                                                                 \
    cudaError_t e_ = cudaGetLastError();                                                                               \
    if (e_ != cudaSuccess)                                                                                             \
      return cuda_fail(cx, e_, "launching " name);                                                                     \
  } while (0)

/* Every device allocation of the context goes through dev_malloc and
 * dev_free, which keep the live ones' sizes: the memory held now and at
 * most (mlp_cuda_ctx_memory; the CUDA context's own is not counted). */
cudaError_t dev_malloc(mlp_cuda_ctx *cx, void **p, size_t n) {
  *p = NULL;
  if (cx->nallocs == cx->cap_allocs) {
    int cap = cx->cap_allocs ? 2 * cx->cap_allocs : 16;
    struct mlp_cuda_alloc *a = (struct mlp_cuda_alloc *)realloc(cx->allocs, sizeof *a * (size_t)cap);
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

void dev_free(mlp_cuda_ctx *cx, void *p) {
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
int scratch(mlp_cuda_ctx *cx, size_t bytes, void **p) {
  if (bytes > cx->scratch_bytes) {
    if (cx->capturing)
      return fail(cx, (int)cudaErrorStreamCaptureUnsupported, "scratch must grow to %zu bytes while a CUDA graph is recorded", bytes);
    cx->generation++;
    size_t nb = (bytes + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
    if (cx->scratch) {
      MLP_CUDA_TRY(cudaStreamSynchronize(cx->stream));
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
unsigned grid_for(const mlp_cuda_ctx *cx, int64_t work, int threads) {
  int64_t b = (work + threads - 1) / threads, cap = (int64_t)cx->sms * 16;
  return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}

int is_float_dt(int dt) { return dt == MLP_F32 || dt == MLP_BF16 || dt == MLP_F16; }
int dt_ok(int dt) { return dt >= MLP_F32 && dt <= MLP_BOOL; }
int dt_size(int dt) { return dt == MLP_F32 || dt == MLP_I32 ? 4 : dt == MLP_BOOL ? 1 : 2; }
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


/* N elements moved as one aligned access (16 bytes at most per access). */
template <class T, int N> struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) Vec { T v[N]; };

/* Strided geometry of NOP operands over an output (batch) shape (see the top). */
template <int NOP> struct Geo {
  int rank;
  int64_t shape[MLP_MAXRANK];
  int64_t st[NOP][MLP_MAXRANK];
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





/* mlp_cuda_gemm's epilogue where cuBLASLt's cannot express it, over batch x
 * M x N outputs, V per thread-step (V divides N; the host picks V > 1 only
 * when every access is 16-byte aligned):
 *   T = G (the product; 0 when G is NULL) + bias; aux = T; T = act(T) (dact: T *= act'(aux));
 *   T += residual; C = (accumulate ? C : 0) + T, rounded at the store (and, bf16/f16 with an activation,
 *   T before it and act(T) before a residual or accumulation: mlp_rt.h).
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
  if (sizeof(T) == 2 && act != MLP_ACT_NONE && !dact) /* bf16/f16: the activation's input in C's dtype (mlp_rt.h) */
    round_to<T>(x);
  if (dact) { /* an activation's backward: times act'(aux), aux read */
    Vec<T, V> av = *reinterpret_cast<const Vec<T, V> *>(aux + o);
#pragma unroll
    for (int k = 0; k < V; k++)
      x[k] *= mlp_gelu_grad(to_f(av.v[k]), act == MLP_ACT_GELU_TANH);
  } else if (aux) {
    Vec<T, V> av;
#pragma unroll
    for (int k = 0; k < V; k++)
      av.v[k] = from_f<T>(x[k]);
    *reinterpret_cast<Vec<T, V> *>(aux + o) = av;
  }
  if (act != MLP_ACT_NONE && !dact) {
#pragma unroll
    for (int k = 0; k < V; k++) /* relu: NaN stays NaN */
      x[k] = act == MLP_ACT_RELU ? (x[k] < 0.0f ? 0.0f : x[k]) : mlp_gelu(x[k], act == MLP_ACT_GELU_TANH);
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

/* mlp_cuda_gemm for few rows: f32, M <= 32, B transposed ([N, K], a linear
 * layer's weight), one batch; an MLP at batch 32, where cuBLASLt's kernels
 * take ~10 us for 17 MFLOP. Block (x, y) owns columns [8x, 8x + 8) and rows
 * [8y, 8y + 8) of C; its warps split K in chunks of 128, a lane taking 4
 * consecutive k of each chunk. A lane sums its 8 x 8 products over its
 * chunks in registers; then 5 butterfly steps over the warp each keep half
 * of the sums and add the partner lane's half (62 shuffles), leaving lane l
 * the sums of row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1; the block adds
 * its warps' sums in warp order in shared memory and runs mlp_gemm's
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
/* mlp_gemm's epilogue on two outputs of a row (columns c and c + 1 < N, at o in C's layout; pair: both
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

/* mlp_gemm's bgrad where cuBLASLt's BGRADB does not take the call:
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
  if (!mlp_split_last(&count[blockIdx.x]))
    return;
  if (c < 32 * V && col < M) {
    float t = 0.0f;
    for (int y = 0; y < (int)gridDim.y; y++)
      t += __ldcg(part + y * M + col); /* the other blocks' rows, from L2 (as the generated splits read theirs) */
    out[col] = from_f<T>(t);
  }
}

/* ---------------------------------------------------------------- host: geometry */


bool aligned(const void *p, size_t a) { return ((uintptr_t)p % a) == 0; }

/* ---------------------------------------------------------------- host: launchers */

template <class TI, class TO, class F> int launch_map1(mlp_cuda_ctx *cx, const void *x, void *y, int64_t n, F f) {
  constexpr int V = 16 / sizeof(TI);
  int vec = aligned(x, 16) && aligned(y, alignof(Vec<TO, V>)) && n >= V;
  k_map1<TI, TO, F>
      <<<grid_for(cx, vec ? n / V : n, kThreads), kThreads, 0, cx->stream>>>((const TI *)x, (TO *)y, n, vec, f);
  MLP_CUDA_LAUNCHED("k_map1");
  return 0;
}


/* ---------------------------------------------------------------- host: GEMM */

cudaDataType_t blas_type(int dt) { return dt == MLP_F32 ? CUDA_R_32F : dt == MLP_BF16 ? CUDA_R_16BF : CUDA_R_16F; }


/* ---------------------------------------------------------------- host: cuBLASLt plans (mlp_cuda_gemm) */

/* The alignment cuBLASLt may assume of a pointer (and of its batch steps):
 * the largest power of two dividing both, at most 256 (NULL: 256). */
uint32_t lt_align(const void *p, int64_t step_bytes) {
  uint64_t v = (uint64_t)(uintptr_t)p | (uint64_t)step_bytes;
  uint64_t a = v & (~v + 1);
  return v == 0 || a > 256 ? 256u : (uint32_t)a;
}

void lt_plan_free(mlp_cuda_gemm_plan *p) {
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
cublasStatus_t lt_preference(const mlp_cuda_gemm_key *k, cublasLtMatmulPreference_t *out) {
  uint64_t ws = MLP_CUDA_BLAS_WS;
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

/* compile.mode max-autotune (mlp_cuda_set_tune): the first call of a GEMM
 * shape times up to MLP_CUDA_TUNE_CANDIDATES of the heuristic's algorithms
 * on its own operands (into a temporary output: the call's result is
 * untouched; a warm-up, then 5 calls each) and keeps the fastest when it
 * beats the heuristic's first choice by 3% (less is the timing's noise)
 * and that choice takes at least 20 us.
 * The choices go to a text file, one line per GEMM, sorted, rewritten
 * atomically after each new choice; a file written on another GPU or
 * cuBLASLt version, or a choice cuBLASLt no longer accepts, is ignored
 * (that GEMM is timed again). */
const char kTuneMagic[] = "# tgen max-autotune: cuBLASLt's algorithm per GEMM, timed on this GPU";

void tune_identity(mlp_cuda_ctx *cx, char *gpu, size_t n, size_t *lt_version) {
  cudaDeviceProp prop;
  snprintf(gpu, n, "unknown");
  if (cudaGetDeviceProperties(&prop, cx->device) == cudaSuccess)
    snprintf(gpu, n, "%s", prop.name);
  *lt_version = cublasLtGetVersion();
}

const mlp_cuda_tune *tune_find(mlp_cuda_ctx *cx, const mlp_cuda_gemm_key *k);

void tune_read(mlp_cuda_ctx *cx) {
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
  while (ok && cx->ntunes < MLP_CUDA_TUNES && fgets(line, sizeof line, f)) {
    mlp_cuda_tune t;
    memset(&t, 0, sizeof t);
    mlp_cuda_gemm_key *k = &t.key;
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

const mlp_cuda_tune *tune_find(mlp_cuda_ctx *cx, const mlp_cuda_gemm_key *k) {
  if (!cx->tune_read)
    tune_read(cx);
  for (int i = 0; i < cx->ntunes; i++)
    if (!memcmp(&cx->tunes[i].key, k, sizeof *k))
      return &cx->tunes[i];
  return NULL;
}

int tune_cmp(const void *a, const void *b) {
  return memcmp(&((const mlp_cuda_tune *)a)->key, &((const mlp_cuda_tune *)b)->key, sizeof(mlp_cuda_gemm_key));
}

/* The choices, sorted by key, to tune_file (through a temporary and a
 * rename: a reader never sees half a file). Best effort: a file that cannot
 * be written leaves the choices in memory. */
void tune_write(mlp_cuda_ctx *cx) {
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
    const mlp_cuda_tune *t = &cx->tunes[i];
    const mlp_cuda_gemm_key *k = &t->key;
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
void lt_tune(mlp_cuda_ctx *cx, mlp_cuda_gemm_plan *p, const void *A, const void *B, const void *C, float beta,
             const void *bias, size_t dbytes) {
  p->tuned = 1;
  if (cx->ntunes >= MLP_CUDA_TUNES)
    return;
  const bool gelu_aux = lt_uses_aux(p->key.epilogue);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulHeuristicResult_t r[MLP_CUDA_TUNE_CANDIDATES];
  int n = 0;
  if (lt_preference(&p->key, &pref) != CUBLAS_STATUS_SUCCESS)
    return;
  cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(cx->lt, p->op, p->a, p->b, p->c, p->d, pref, MLP_CUDA_TUNE_CANDIDATES, r, &n);
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
                               MLP_CUDA_BLAS_WS, cx->stream) == CUBLAS_STATUS_SUCCESS; /* the warm-up */
      ok = ok && cudaEventRecord(e0, cx->stream) == cudaSuccess;
      for (int rep = 0; ok && rep < 5; rep++)
        ok = cublasLtMatmul(cx->lt, p->op, &alpha, B, p->a, A, p->b, &beta, Cp, p->c, D, p->d, al, cx->blas_ws,
                            MLP_CUDA_BLAS_WS, cx->stream) == CUBLAS_STATUS_SUCCESS;
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
      mlp_cuda_tune *t = &cx->tunes[cx->ntunes++];
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
int lt_plan_build(mlp_cuda_ctx *cx, mlp_cuda_gemm_plan *p, const mlp_cuda_gemm_key *k, const void *bias,
                  const void *aux) {
  memset(p, 0, sizeof *p);
  memcpy(&p->key, k, sizeof *k);
  cudaDataType_t tab = blas_type(k->dt), td = k->d_f32 ? CUDA_R_32F : tab;
  cublasOperation_t opa = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtMatmulPreference_t pref = NULL;
  cublasStatus_t s;
  const char *what = "cublasLtMatmulDescCreate";
#define MLP_LT(call, name)                                                                                             \
  if ((s = (call)) != CUBLAS_STATUS_SUCCESS) {                                                                         \
    what = name;                                                                                                       \
    goto fail;                                                                                                         \
  }
  MLP_LT(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  MLP_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), "setting TRANSA");
  MLP_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), "setting TRANSB");
  MLP_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &k->epilogue, sizeof k->epilogue),
         "setting the epilogue");
  if ((k->epilogue & CUBLASLT_EPILOGUE_BIAS) || k->epilogue == CUBLASLT_EPILOGUE_BGRADB)
    MLP_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
           "setting BIAS_POINTER");
  if (lt_uses_aux(k->epilogue)) {
    int64_t ld = k->ldd, st = k->sd;
    MLP_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux),
           "setting EPILOGUE_AUX_POINTER");
    MLP_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld),
           "setting EPILOGUE_AUX_LD");
    if (k->batch > 1)
      MLP_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &st, sizeof st),
             "setting EPILOGUE_AUX_BATCH_STRIDE");
  }
  MLP_LT(lt_layout(&p->a, tab, k->tb ? k->K : k->N, k->tb ? k->N : k->K, k->ldb, k->batch, k->sb), "layout of B");
  MLP_LT(lt_layout(&p->b, tab, k->ta ? k->M : k->K, k->ta ? k->K : k->M, k->lda, k->batch, k->sa), "layout of A");
  MLP_LT(lt_layout(&p->c, td, k->N, k->M, k->ldd, k->batch, k->sd), "layout of C");
  MLP_LT(lt_layout(&p->d, td, k->N, k->M, k->ldd, k->batch, k->sd), "layout of D");
  {
    MLP_LT(lt_preference(k, &pref), "creating the matmul preference");
    cublasLtMatmulHeuristicResult_t r;
    int n = 0;
    memset(&r, 0, sizeof r);
    s = cublasLtMatmulAlgoGetHeuristic(cx->lt, p->op, p->a, p->b, p->c, p->d, pref, 1, &r, &n);
    cublasLtMatmulPreferenceDestroy(pref);
    pref = NULL;
    if (s == CUBLAS_STATUS_SUCCESS && n > 0 && r.state == CUBLAS_STATUS_SUCCESS) {
      p->algo = r.algo;
      p->ok = 1;
      const mlp_cuda_tune *t = cx->tune ? tune_find(cx, k) : NULL;
      cublasLtMatmulHeuristicResult_t chk;
      if (t && cublasLtMatmulAlgoCheck(cx->lt, p->op, p->a, p->b, p->c, p->d, &t->algo, &chk) == CUBLAS_STATUS_SUCCESS &&
          chk.state == CUBLAS_STATUS_SUCCESS && chk.workspaceSize <= MLP_CUDA_BLAS_WS)
        p->algo = t->algo, p->tuned = 1;
    } else if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED) {
      what = "cublasLtMatmulAlgoGetHeuristic";
      goto fail;
    }
  }
#undef MLP_LT
  p->used = 1;
  return 0;
fail:
  if (pref)
    cublasLtMatmulPreferenceDestroy(pref);
  lt_plan_free(p);
  return blas_fail(cx, s, what);
}

/* The cached plan for key k, built on a miss (replacing the oldest). */
int lt_plan_get(mlp_cuda_ctx *cx, const mlp_cuda_gemm_key *k, const void *bias, const void *aux,
                mlp_cuda_gemm_plan **out) {
  for (int i = 0; i < MLP_CUDA_GEMM_PLANS; i++)
    if (cx->plans[i].used && memcmp(&cx->plans[i].key, k, sizeof *k) == 0) {
      *out = &cx->plans[i];
      return 0;
    }
  mlp_cuda_gemm_plan *p = &cx->plans[cx->next_plan];
  cx->next_plan = (cx->next_plan + 1) % MLP_CUDA_GEMM_PLANS;
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
int lt_matmul(mlp_cuda_ctx *cx, const mlp_gemm *g, void *D, int d_f32, int64_t ldd, int64_t sd, const void *Cin,
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
    mlp_cuda_gemm_key k;
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
    mlp_cuda_gemm_plan *p;
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
      MLP_CUDA_BLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (aux)
      MLP_CUDA_BLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    MLP_CUDA_BLAS(cublasLtMatmul(cx->lt, p->op, &alpha, B, p->a, A, p->b, &beta, Cp, p->c, Dp, p->d, &p->algo,
                                 cx->blas_ws, MLP_CUDA_BLAS_WS, cx->stream));
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
bool lt_epilogue_for(const mlp_gemm *g, uint32_t *epi, float *beta, const void **cin) {
  const bool bias = g->bias != NULL;
  *beta = 0.0f;
  *cin = NULL;
  if (g->bgrad) { /* the sum over k of op(A), cuBLASLt's B: BGRADB, with nothing else */
    *epi = CUBLASLT_EPILOGUE_BGRADB;
    return !bias && g->act == MLP_ACT_NONE && !g->aux && !g->residual && !g->accumulate;
  }
  switch (g->act) {
  case MLP_ACT_NONE:
    if (g->aux || (g->residual && g->accumulate))
      return false;
    *epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (g->residual || g->accumulate) {
      *beta = 1.0f;
      *cin = g->residual ? g->residual : g->C;
    }
    return true;
  case MLP_ACT_RELU:
    if (g->aux || g->residual || g->accumulate)
      return false;
    *epi = bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    return true;
  case MLP_ACT_GELU_TANH:
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
int launch_gemm_epilogue(mlp_cuda_ctx *cx, const mlp_gemm *g, const P *G, int64_t gld, int64_t gs) {
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
  MLP_CUDA_LAUNCHED("k_gemm_epilogue");
  return 0;
}

int gemm_epilogue(mlp_cuda_ctx *cx, const mlp_gemm *g, const void *G, int g_in_dt, int64_t gld, int64_t gs) {
  switch (g->dt) {
  case MLP_BF16:
    return g_in_dt ? launch_gemm_epilogue<bf16>(cx, g, (const bf16 *)G, gld, gs)
                   : launch_gemm_epilogue<bf16>(cx, g, (const float *)G, gld, gs);
  case MLP_F16:
    return g_in_dt ? launch_gemm_epilogue<f16>(cx, g, (const f16 *)G, gld, gs)
                   : launch_gemm_epilogue<f16>(cx, g, (const float *)G, gld, gs);
  default: return launch_gemm_epilogue<float>(cx, g, (const float *)G, gld, gs);
  }
}

/* g (K > 0) as the f32 product in scratch, then k_gemm_epilogue: in pieces
 * of at most MLP_CUDA_GEMM_BUDGET bytes of product (whole batch elements
 * when one fits, else row blocks of one), each a smaller mlp_gemm. */
int gemm_via_scratch(mlp_cuda_ctx *cx, const mlp_gemm *g) {
  const int64_t es = dt_size(g->dt), per_b = g->M * g->N * 4;
  int64_t nb = g->batch, rows = g->M;
  if (nb * per_b > (int64_t)MLP_CUDA_GEMM_BUDGET) {
    nb = per_b > 0 ? (int64_t)MLP_CUDA_GEMM_BUDGET / per_b : 1;
    if (nb < 1) {
      nb = 1;
      rows = (int64_t)MLP_CUDA_GEMM_BUDGET / (g->N * 4);
      if (rows < 1)
        rows = 1;
    }
  }
  for (int64_t b0 = 0; b0 < g->batch; b0 += nb)
    for (int64_t m0 = 0; m0 < g->M; m0 += rows) {
      mlp_gemm p = *g;
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




} // namespace

/* ================================================================ entry points */

/* (C linkage comes from the declarations in mlp_rt.h.) */

/* Makes a context on the current device: a non-blocking stream, a cuBLAS
 * handle bound to it (workspace set, reduced-precision split-K reductions
 * off), a cuBLASLt handle (sharing that workspace; the plan cache starts
 * empty), the d_bad cell. */
int mlp_cuda_use_device(int device, char *err, size_t errlen) {
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

static void x3_setup(mlp_cuda_ctx *cx); /* (with mlp_cuda_gemm, below) */

int mlp_cuda_ctx_create(mlp_cuda_ctx **out, char *err, size_t errlen) {
  int n = 0, dev = 0;
  cudaError_t e;
  const char *what = "";
  if (!out) {
    if (err && errlen)
      snprintf(err, errlen, "mlp_cuda_ctx_create: out is NULL");
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
  mlp_cuda_ctx *cx = (mlp_cuda_ctx *)calloc(1, sizeof *cx);
  if (!cx) {
    if (err && errlen)
      snprintf(err, errlen, "mlp_cuda_ctx_create: out of host memory");
    return (int)cudaErrorMemoryAllocation;
  }
  cublasStatus_t bs = CUBLAS_STATUS_SUCCESS;
  cx->op = "mlp_cuda_ctx_create";
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
  if ((e = dev_malloc(cx, (void **)&cx->d_split_part, MLP_CUDA_SPLIT_PARTS * sizeof(float))) != cudaSuccess ||
      (e = dev_malloc(cx, (void **)&cx->d_split_count, MLP_CUDA_SPLIT_TILES * sizeof(unsigned))) != cudaSuccess) {
    what = "cudaMalloc (split reductions)";
    goto cuda_error;
  }
  if ((e = cudaMemset(cx->d_split_count, 0, MLP_CUDA_SPLIT_TILES * sizeof(unsigned))) != cudaSuccess) {
    what = "cudaMemset (split reductions)";
    goto cuda_error;
  }
  if ((e = dev_malloc(cx, &cx->blas_ws, MLP_CUDA_BLAS_WS)) != cudaSuccess) {
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
  if ((bs = cublasSetWorkspace(cx->blas, cx->blas_ws, MLP_CUDA_BLAS_WS)) != CUBLAS_STATUS_SUCCESS) {
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
  mlp_cuda_ctx_destroy(cx);
  return (int)e;
blas_error:
  if (err && errlen)
    snprintf(err, errlen, "creating the CUDA context: %s failed: %s", what, cublasGetStatusString(bs));
  mlp_cuda_ctx_destroy(cx);
  return (int)bs;
}

/* Waits for the stream, then frees everything the context owns. */
void mlp_cuda_ctx_destroy(mlp_cuda_ctx *cx) {
  if (!cx)
    return;
  if (cx->stream)
    cudaStreamSynchronize(cx->stream);
  for (int i = 0; i < MLP_CUDA_GEMM_PLANS; i++)
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

const char *mlp_cuda_ctx_error(const mlp_cuda_ctx *cx) { return cx ? cx->err : "no CUDA context"; }

int mlp_cuda_sync(mlp_cuda_ctx *cx) {
  cx->op = "mlp_cuda_sync";
  MLP_CUDA_TRY(cudaStreamSynchronize(cx->stream));
  MLP_CUDA_TRY(cudaGetLastError());
  return 0;
}

/* Reads d_bad after the work so far; resets it when it was set. */
unsigned long long *mlp_cuda_bad_ptr(mlp_cuda_ctx *cx) { return cx->d_bad; }
float *mlp_cuda_split_part(mlp_cuda_ctx *cx) { return cx->d_split_part; }
unsigned *mlp_cuda_split_count(mlp_cuda_ctx *cx) { return cx->d_split_count; }

int mlp_cuda_bad_index(mlp_cuda_ctx *cx, int64_t *pos) {
  cx->op = "mlp_cuda_bad_index";
  unsigned long long v = 0;
  *pos = -1;
  MLP_CUDA_TRY(cudaMemcpyAsync(&v, cx->d_bad, sizeof v, cudaMemcpyDeviceToHost, cx->stream));
  MLP_CUDA_TRY(cudaStreamSynchronize(cx->stream));
  if (v != (unsigned long long)INT64_MAX) {
    *pos = (int64_t)v;
    k_set_bad<<<1, 1, 0, cx->stream>>>(cx->d_bad);
    MLP_CUDA_LAUNCHED("k_set_bad");
  }
  return 0;
}

int mlp_cuda_malloc(mlp_cuda_ctx *cx, void **p, size_t n) {
  cx->op = "mlp_cuda_malloc";
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
void mlp_cuda_free(mlp_cuda_ctx *cx, void *p) {
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

void mlp_cuda_ctx_memory(const mlp_cuda_ctx *cx, size_t *now, size_t *peak) {
  *now = cx ? cx->mem_now : 0;
  *peak = cx ? cx->mem_peak : 0;
}

/* h2d and d2h return when the copy is done (host buffers are free to reuse
 * and results readable); d2d is enqueued. */
int mlp_cuda_memcpy(mlp_cuda_ctx *cx, void *dst, const void *src, size_t n, int kind) {
  cx->op = "mlp_cuda_memcpy";
  if (kind < 0 || kind > 2)
    return MLP_CUDA_BAD("kind %d is not 0 (h2d), 1 (d2h) or 2 (d2d)", kind);
  if (n == 0)
    return 0;
  if (!dst || !src)
    return MLP_CUDA_BAD("NULL pointer");
  static const cudaMemcpyKind k[3] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice};
  MLP_CUDA_TRY(cudaMemcpyAsync(dst, src, n, k[kind], cx->stream));
  if (kind != 2)
    MLP_CUDA_TRY(cudaStreamSynchronize(cx->stream));
  return 0;
}

template <class TI> static int cast_from(mlp_cuda_ctx *cx, int dt_out, const void *x, void *y, int64_t n) {
  switch (dt_out) {
  case MLP_F32: return launch_map1<TI, float>(cx, x, y, n, CastF<float>());
  case MLP_BF16: return launch_map1<TI, bf16>(cx, x, y, n, CastF<bf16>());
  case MLP_F16: return launch_map1<TI, f16>(cx, x, y, n, CastF<f16>());
  case MLP_I32: return launch_map1<TI, int32_t>(cx, x, y, n, CastF<int32_t>());
  default: return launch_map1<TI, uint8_t>(cx, x, y, n, CastF<uint8_t>());
  }
}

int mlp_cuda_cast(mlp_cuda_ctx *cx, int dt_in, int dt_out, const void *x, void *y, int64_t n) {
  cx->op = "mlp_cuda_cast";
  if (!dt_ok(dt_in) || !dt_ok(dt_out) || n < 0)
    return MLP_CUDA_BAD("bad dtypes %d -> %d or size %lld", dt_in, dt_out, (long long)n);
  if (n == 0)
    return 0;
  if (!x || !y)
    return MLP_CUDA_BAD("NULL pointer");
  if (dt_in == dt_out) {
    if (x != y)
      MLP_CUDA_TRY(cudaMemcpyAsync(y, x, (size_t)n * dt_size(dt_in), cudaMemcpyDeviceToDevice, cx->stream));
    return 0;
  }
  switch (dt_in) {
  case MLP_F32: return cast_from<float>(cx, dt_out, x, y, n);
  case MLP_BF16: return cast_from<bf16>(cx, dt_out, x, y, n);
  case MLP_F16: return cast_from<f16>(cx, dt_out, x, y, n);
  case MLP_I32: return cast_from<int32_t>(cx, dt_out, x, y, n);
  default: return cast_from<uint8_t>(cx, dt_out, x, y, n);
  }
}

/* ---------------------------------------------------------------- linear algebra */



/* Whether mlp_cuda_gemm takes k_gemm_small for g (K > 0). Each of its up to
 * 4 row blocks reads all of B, so B is kept to 8 MB (N K <= 2^21), where the
 * re-reads hit L2; it was measured at mlp3's shapes (N K = 2^18 and 5120),
 * and larger weights are left to cuBLASLt, which reads B once. */
static bool small_gemm_ok(const mlp_gemm *g) {
  return g->dt == MLP_F32 && !g->ta && g->tb && g->batch == 1 && g->M <= kSmallRows && g->K > 0 && !g->bgrad &&
         g->N * g->K <= ((int64_t)1 << 21);
}

static int small_gemm(mlp_cuda_ctx *cx, const mlp_gemm *g) {
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
  MLP_CUDA_LAUNCHED("k_gemm_small");
  return 0;
}

/* Whether mlp_cuda_gemm takes k_gemm_x3 for g (f32, K > 0, no bgrad): its
 * 16-byte loads need the operands' contiguous dims in fours and aligned
 * rows; and it pays only with about two waves of its 128 x 128 tiles (one
 * block an SM): at 1024 x 1024 x 4096 (64 tiles) cuBLAS's split-K sgemm
 * took 0.18 ms against its 0.31, at 1024 x 4096 x 4096 (256) 0.66 against
 * 0.61. (Tests set x3_force: any shape that it can load.) */
static bool x3_force = false;
static bool x3_ok(const mlp_cuda_ctx *cx, const mlp_gemm *g) {
  if (!cx->x3 || g->dt != MLP_F32 || g->K <= 0 || g->bgrad || g->M > 65535 * (int64_t)kX3M || g->N > INT_MAX ||
      g->K > INT_MAX || g->batch > 65535) /* (the grid's y and z) */
    return false;
  if (!aligned(g->A, 16) || !aligned(g->B, 16) || g->lda % 4 || g->ldb % 4 || g->sa % 4 || g->sb % 4 ||
      (g->ta ? g->M : g->K) % 4 || (g->tb ? g->K : g->N) % 4)
    return false;
  const int64_t tiles = (g->M + kX3M - 1) / kX3M * ((g->N + kX3N - 1) / kX3N) * g->batch;
  return x3_force || (tiles * 4 >= 7 * (int64_t)cx->sms && g->K >= 256);
}

template <bool TA, bool TB, int V> static void x3_launch_v(mlp_cuda_ctx *cx, const mlp_gemm *g) {
  dim3 grid((unsigned)((g->N + kX3N - 1) / kX3N), (unsigned)((g->M + kX3M - 1) / kX3M), (unsigned)g->batch);
  k_gemm_x3<TA, TB, V><<<grid, kX3Threads, x3_smem<TA, TB>(), cx->stream>>>(
      (const float *)g->A, g->lda, g->sa, (const float *)g->B, g->ldb, g->sb, (int)g->M, (int)g->N, (int)g->K,
      (const float *)g->bias, (float *)g->aux, (const float *)g->residual, (float *)g->C, g->ldc, g->sc, g->act,
      g->accumulate, g->dact);
}
template <bool TA, bool TB> static void x3_launch(mlp_cuda_ctx *cx, const mlp_gemm *g, int v) {
  if (v == 0)
    x3_launch_v<TA, TB, 0>(cx, g);
  else if (v == 2)
    x3_launch_v<TA, TB, 2>(cx, g);
  else
    x3_launch_v<TA, TB, 1>(cx, g);
}

static int x3_gemm(mlp_cuda_ctx *cx, const mlp_gemm *g) {
  /* V: 0 without an epilogue (the sums stored as pairs), else two outputs a step where every access of
   * the pair is 8-byte aligned (2), or one (1) */
  const bool plain = !g->bias && g->act == MLP_ACT_NONE && !g->aux && !g->residual && !g->accumulate && !g->dact;
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
  MLP_CUDA_LAUNCHED("k_gemm_x3");
  return 0;
}

/* At context creation: whether the wgmma kernels can run (hopper: a
 * compute capability 9.0 GPU, the sm_90a image loaded), and k_gemm_x3 (also
 * MLP_GEMM_X3 not 0, and its shared memory allowed). */
static void x3_setup(mlp_cuda_ctx *cx) {
  cudaDeviceProp prop;
  int *d = NULL, h = 0;
  const char *env = getenv("MLP_GEMM_X3");
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
static bool bgrad_cols_ok(const mlp_gemm *g) {
  const int64_t v = 16 / dt_size(g->dt);
  return g->ta && g->M % v == 0 && g->lda % v == 0 && aligned(g->A, 16) && g->M <= MLP_CUDA_SPLIT_PARTS / kBgradSplit &&
         (g->M + 32 * v - 1) / (32 * v) <= MLP_CUDA_SPLIT_TILES;
}

template <class T> static void bgrad_cols(mlp_cuda_ctx *cx, const mlp_gemm *g) {
  constexpr int V = 16 / sizeof(T);
  dim3 grid((unsigned)((g->M + 32 * V - 1) / (32 * V)), kBgradSplit);
  k_bgrad_cols<T, V><<<grid, 256, 0, cx->stream>>>((const T *)g->A, g->lda, g->M, g->K, cx->d_split_part,
                                                   cx->d_split_count, (T *)g->bgrad);
}

/* One (batched) GEMM with its epilogue (mlp_rt.h). cuBLASLt alone when one of
 * its epilogues (with beta) expresses the whole request; else the product
 * without epilogue and k_gemm_epilogue after it: without accumulation the
 * product goes straight into C (f32; bf16/f16 with the bias, rounded once
 * there) and the kernel works in place, otherwise into f32 scratch so that
 * C's old values stay readable. K = 0 is the kernel alone on a zero product. */
int mlp_cuda_gemm(mlp_cuda_ctx *cx, const mlp_gemm *g) {
  cx->op = "mlp_cuda_gemm";
  if (!g)
    return MLP_CUDA_BAD("NULL descriptor");
  if (!is_float_dt(g->dt))
    return MLP_CUDA_BAD("dtype %s is not floating", dt_name(g->dt));
  if ((g->ta & ~1) || (g->tb & ~1))
    return MLP_CUDA_BAD("ta %d / tb %d are not 0 or 1", g->ta, g->tb);
  if (g->M < 0 || g->N < 0 || g->K < 0 || g->batch < 0 || g->sa < 0 || g->sb < 0 || g->sc < 0)
    return MLP_CUDA_BAD("negative size or stride");
  if (g->act < MLP_ACT_NONE || g->act > MLP_ACT_GELU_TANH)
    return MLP_CUDA_BAD("unknown activation %d", g->act);
  if (g->dact && (!g->aux || (g->act != MLP_ACT_GELU && g->act != MLP_ACT_GELU_TANH)))
    return MLP_CUDA_BAD("dact needs aux and a gelu activation (act %d)", g->act);
  if (g->bgrad && g->batch > 1)
    return MLP_CUDA_BAD("bgrad with batch %lld (one batch only)", (long long)g->batch);
  if (g->lda < (g->ta ? g->M : g->K) || g->ldb < (g->tb ? g->K : g->N) || g->ldc < g->N)
    return MLP_CUDA_BAD("leading dims lda %lld, ldb %lld, ldc %lld too small for M %lld, N %lld, K %lld",
                        (long long)g->lda, (long long)g->ldb, (long long)g->ldc, (long long)g->M, (long long)g->N,
                        (long long)g->K);
  if (g->M == 0 || g->N == 0 || g->batch == 0)
    return 0;
  if (!g->C || (g->K > 0 && (!g->A || !g->B)))
    return MLP_CUDA_BAD("NULL pointer");
  if (g->batch > 1 && g->sc == 0)
    return MLP_CUDA_BAD("batch %lld with C's batch stride 0", (long long)g->batch);
  uint32_t epi;
  float beta;
  const void *cin;
  bool none = true;
  int rc;
  if (g->bgrad) { /* k_bgrad_cols, else in the matmul where cuBLASLt takes it, else apart */
    if (bgrad_cols_ok(g)) {
      switch (g->dt) {
      case MLP_BF16: bgrad_cols<bf16>(cx, g); break;
      case MLP_F16: bgrad_cols<f16>(cx, g); break;
      default: bgrad_cols<float>(cx, g); break;
      }
      MLP_CUDA_LAUNCHED("k_bgrad_cols");
      mlp_gemm p = *g;
      p.bgrad = NULL;
      return mlp_cuda_gemm(cx, &p);
    }
    if (g->K > 0 && lt_epilogue_for(g, &epi, &beta, &cin)) {
      if ((rc = lt_matmul(cx, g, g->C, 0, g->ldc, g->sc, cin, beta, epi, &none)))
        return rc;
      if (!none)
        return 0;
    }
    unsigned grid = (unsigned)((g->M + 31) / 32);
    switch (g->dt) {
    case MLP_BF16: k_gemm_bgrad<bf16><<<grid, 1024, 0, cx->stream>>>((const bf16 *)g->A, g->lda, g->ta, g->M, g->K, (bf16 *)g->bgrad); break;
    case MLP_F16: k_gemm_bgrad<f16><<<grid, 1024, 0, cx->stream>>>((const f16 *)g->A, g->lda, g->ta, g->M, g->K, (f16 *)g->bgrad); break;
    default: k_gemm_bgrad<float><<<grid, 1024, 0, cx->stream>>>((const float *)g->A, g->lda, g->ta, g->M, g->K, (float *)g->bgrad); break;
    }
    MLP_CUDA_LAUNCHED("k_gemm_bgrad");
    mlp_gemm p = *g;
    p.bgrad = NULL;
    return mlp_cuda_gemm(cx, &p);
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
    mlp_gemm p = *g;
    uint32_t e = CUBLASLT_EPILOGUE_DEFAULT;
    if (g->dt != MLP_F32 && g->bias) {
      e = CUBLASLT_EPILOGUE_BIAS;
      p.bias = NULL;
    }
    if ((rc = lt_matmul(cx, g, g->C, g->dt == MLP_F32, g->ldc, g->sc, NULL, 0.0f, e, &none)))
      return rc;
    if (none)
      return fail(cx, (int)CUBLAS_STATUS_NOT_SUPPORTED, "cuBLASLt has no algorithm for this GEMM (%s, %lld x %lld x %lld)",
                  dt_name(g->dt), (long long)g->M, (long long)g->N, (long long)g->K);
    return gemm_epilogue(cx, &p, g->C, 1, g->ldc, g->sc);
  }
  return gemm_via_scratch(cx, g);
}

/* ---------------------------------------------------------------- neural */







/* Every element = v rounded to dt (via f32 for bf16/f16, as the host's
 * conversions; to i32 truncated; to bool v != 0). */
int mlp_cuda_fill(mlp_cuda_ctx *cx, int dt, void *y, int64_t n, double v) {
  cx->op = "mlp_cuda_fill";
  if (!dt_ok(dt) || n < 0)
    return MLP_CUDA_BAD("bad dtype %d or size %lld", dt, (long long)n);
  if (n == 0)
    return 0;
  if (!y)
    return MLP_CUDA_BAD("NULL pointer");
  uint32_t bits = 0;
  float f = (float)v;
  switch (dt) {
  case MLP_F32: memcpy(&bits, &f, 4); break;
  case MLP_BF16: {
    bf16 h = __float2bfloat16_rn(f);
    uint16_t u;
    memcpy(&u, &h, 2);
    bits = u;
    break;
  }
  case MLP_F16: {
    f16 h = __float2half_rn(f);
    uint16_t u;
    memcpy(&u, &h, 2);
    bits = u;
    break;
  }
  case MLP_I32: {
    int32_t i = v != v ? 0 : v <= (double)INT32_MIN ? INT32_MIN : v >= (double)INT32_MAX ? INT32_MAX : (int32_t)v;
    memcpy(&bits, &i, 4);
    break;
  }
  default: bits = v != 0; break;
  }
  int es = dt_size(dt);
  if (bits == 0 || es == 1) {
    MLP_CUDA_TRY(cudaMemsetAsync(y, (int)bits, (size_t)n * es, cx->stream));
    return 0;
  }
  if (es == 2)
    k_fill<uint16_t><<<grid_for(cx, n, kThreads), kThreads, 0, cx->stream>>>((uint16_t *)y, n, (uint16_t)bits);
  else
    k_fill<uint32_t><<<grid_for(cx, n, kThreads), kThreads, 0, cx->stream>>>((uint32_t *)y, n, bits);
  MLP_CUDA_LAUNCHED("k_fill");
  return 0;
}

/* ---------------------------------------------------------------- accessors */

/* Autotune on or off; file: where the choices are read and written (NULL
 * or "": kept in memory only). Plans already built keep their algorithm
 * until they are rebuilt, so this is set before the first call. */
int mlp_cuda_set_tune(mlp_cuda_ctx *cx, int on, const char *file) {
  cx->op = "mlp_cuda_set_tune";
  if (file && strlen(file) >= sizeof cx->tune_file)
    return MLP_CUDA_BAD("the file name is longer than %d bytes", (int)sizeof cx->tune_file - 1);
  if (on && !cx->tunes && !(cx->tunes = (mlp_cuda_tune *)calloc(MLP_CUDA_TUNES, sizeof *cx->tunes)))
    return MLP_CUDA_BAD("out of host memory");
  snprintf(cx->tune_file, sizeof cx->tune_file, "%s", file ? file : "");
  cx->tune = on;
  cx->tune_read = 0;
  cx->ntunes = 0;
  for (int i = 0; i < MLP_CUDA_GEMM_PLANS; i++) /* rebuilt with the new choices */
    lt_plan_free(&cx->plans[i]);
  return 0;
}

/* For kernel files that cannot see struct mlp_cuda_ctx (mlp_optim_cuda.cu). */
int mlp_cuda_set_stream(mlp_cuda_ctx *cx, void *stream) {
  cx->op = "mlp_cuda_set_stream";
  if (cx->capturing)
    return MLP_CUDA_BAD("a CUDA graph is being recorded");
  cudaStream_t s = stream ? (cudaStream_t)stream : cx->own;
  if (s != cx->stream) {
    MLP_CUDA_TRY(cudaStreamSynchronize(cx->stream)); /* the old stream's work first: the scratch is shared */
    MLP_CUDA_BLAS(cublasSetStream(cx->blas, s));
    cx->stream = s;
  }
  return 0;
}

int mlp_cuda_graph_begin(mlp_cuda_ctx *cx) {
  cx->op = "mlp_cuda_graph_begin";
  MLP_CUDA_TRY(cudaStreamBeginCapture(cx->stream, cudaStreamCaptureModeThreadLocal));
  cx->capturing = 1;
  return 0;
}

/* Ends the recording (also after a failed call in between: then *graph is
 * NULL and the error of the failed call is kept). */
int mlp_cuda_graph_end(mlp_cuda_ctx *cx, void **graph) {
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

int mlp_cuda_graph_launch(mlp_cuda_ctx *cx, void *graph) {
  cx->op = "mlp_cuda_graph_launch";
  MLP_CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)graph, cx->stream));
  return 0;
}

void mlp_cuda_graph_free(void *graph) {
  if (graph)
    cudaGraphExecDestroy((cudaGraphExec_t)graph);
}

unsigned mlp_cuda_ctx_generation(const mlp_cuda_ctx *cx) { return cx->generation; }

cudaStream_t mlp_cuda_ctx_stream(mlp_cuda_ctx *cx, const char *op) {
  cx->op = op;
  return cx->stream;
}

int mlp_cuda_ctx_fail(mlp_cuda_ctx *cx, int code, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return fail(cx, code, "%s", msg);
}

int mlp_cuda_ctx_scratch(mlp_cuda_ctx *cx, size_t bytes, void **p) { return scratch(cx, bytes, p); }
