/* tgm_optim_cuda.cu: the optimizer step of the emitted training code on CUDA
 * (tgm_cuda_adamw, tgm_cuda_sgd, tgm_cuda_sum_squares in tgm_rt.h's "CUDA
 * kernels" section).
 *
 * Template: copied into every emitted project with "tgm_" renamed; needs only
 * cudart. It cannot see struct tgm_cuda_ctx (private to tgm_cuda.cu) and
 * reaches the context through tgm_cuda_ctx_stream / _fail / _scratch. Its
 * helpers live in an anonymous namespace with cuopt_ names (tgm_optim_cpu.c's
 * are opt_), so the file can share a translation unit with tgm_cuda.cu and
 * tgm_optim_cpu.c (as the tests include them).
 *
 * Semantics: exactly tgm_optim_cpu.c's (PyTorch 2.x AdamW / SGD on an f32
 * param; see the comment at its top), computed in f32 in the same order of
 * operations; nvcc's default multiply-add contraction is kept (torch's CUDA
 * kernels are compiled the same way), so results may differ from the CPU's by
 * an ulp. The low-precision copy is rounded to nearest even with the bit
 * logic of tgm_f32_to_bf16 / tgm_f32_to_f16 (NaN payloads included).
 *
 * The update kernels are grid-stride loops (AdamW's 4 elements an iteration
 * where the pointers allow 16-byte accesses, SGD's one), and allocate nothing. sum_squares is two deterministic phases: a grid whose
 * size depends only on n (not on the device) writes one double per block
 * (each thread strides over fixed elements, the block reduces in a fixed
 * tree), then one block reduces the partials in a fixed order. */
#include "tgm_rt.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

namespace {

const int kOptThreads = 256;        /* threads per block */
const int64_t kOptMaxBlocks = 4096; /* grid cap of the update kernels (grid-stride beyond) */
const int kOptSumBlocks = 1024;     /* most partial sums of sum_squares */

/* ---------------------------------------------------------------- device helpers */

__device__ __forceinline__ uint32_t cuopt_mask(bool c) { return c ? 0xffffffffu : 0u; }

/* The bit logic of tgm_f32_to_bf16: round to nearest even; NaN stays a quiet NaN. */
__device__ __forceinline__ uint16_t cuopt_st_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((u >> 16) | 0x0040u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* The bit logic of tgm_f32_to_f16 (as tgm_cpu.c's st_f16): round to nearest
 * even; subnormals by one exact-scaled addition; 65520 and above to inf. */
__device__ __forceinline__ uint16_t cuopt_st_f16(float f) {
  uint32_t u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  uint32_t nanv = 0x7e00u | ((a >> 13) & 0x3ffu);
  uint32_t norm = (a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
  uint32_t sub = __float_as_uint(__fadd_rn(__fmul_rn(__uint_as_float(a), 16777216.0f), 8388608.0f)) - 0x4b000000u;
  uint32_t isnan = cuopt_mask(a > 0x7f800000u), isinf = cuopt_mask(a >= 0x477ff000u), isnorm = cuopt_mask(a >= 0x38800000u);
  uint32_t r = (norm & isnorm) | (sub & ~isnorm);
  r = (0x7c00u & isinf) | (r & ~isinf);
  r = (nanv & isnan) | (r & ~isnan);
  return (uint16_t)(sign | (r & 0xffffu));
}

/* Element i of a floating tensor of dtype DT, as f32 (exact). */
template <int DT> __device__ __forceinline__ float cuopt_ld(const void *p, int64_t i) {
  if constexpr (DT == TGM_BF16) {
    return __uint_as_float((uint32_t)((const uint16_t *)p)[i] << 16);
  } else if constexpr (DT == TGM_F16) {
    return __half2float(((const __half *)p)[i]);
  } else {
    return ((const float *)p)[i];
  }
}

/* Element i of the low-precision copy (LDT < 0: there is none). */
template <int LDT> __device__ __forceinline__ void cuopt_st(void *p, int64_t i, float x) {
  if constexpr (LDT == TGM_BF16) {
    ((uint16_t *)p)[i] = cuopt_st_bf16(x);
  } else if constexpr (LDT == TGM_F16) {
    ((uint16_t *)p)[i] = cuopt_st_f16(x);
  } else if constexpr (LDT == TGM_F32) {
    ((float *)p)[i] = x;
  } else {
    (void)p, (void)i, (void)x;
  }
}

/* ---------------------------------------------------------------- kernels */

struct OptAdam {
  float gs, decay, w1, wm1, b2, omb2, bc2s, nstep, eps;
  bool small; /* torch's lerp: start + w (end - start) when |w| < 0.5, else end + (w - 1)(end - start) */
};

struct OptSgd {
  float gs, wd, mom, nlr;
  bool use_wd, first;
};

/* The device-driven step's state (tgm_cuda_opt_new): what the prepare kernel
 * decided for this step, the step count, the first refused step since the
 * last report, then one sum of squares per run and the partial sums. */
struct OptDev {
  int64_t step;     /* steps applied */
  int64_t bad_step; /* the first step refused since the last report (0: none) */
  double bad_ss;    /* its gradients' sum of squares (NaN or inf; 0 when refused for bad data) */
  int skip;         /* this step is refused: the update kernels return at once */
  OptAdam adam;
  OptSgd sgd;
  double ss[1];     /* [nruns], then kOptSumBlocks partials */
};

/* The update's f32 scalars from the hyperparameters, the step t (>= 1) and
 * the gradient scale, as torch forms them (Python floats), then rounded to
 * f32: the same on the host and in the prepare kernel. */
__host__ __device__ inline OptAdam cuopt_adam(double lr, double beta1, double beta2, double eps, double weight_decay,
                                              int64_t step, double grad_scale) {
  double t = (double)(step > 0 ? step : 1);
  OptAdam a;
  a.gs = (float)grad_scale;
  a.decay = (float)(1.0 - lr * weight_decay);
  a.w1 = (float)(1.0 - beta1);
  a.wm1 = a.w1 - 1.0f;
  a.small = fabsf(a.w1) < 0.5f;
  a.b2 = (float)beta2;
  a.omb2 = (float)(1.0 - beta2);
  a.bc2s = (float)sqrt(1.0 - pow(beta2, t));
  a.nstep = (float)(-(lr / (1.0 - pow(beta1, t))));
  a.eps = (float)eps;
  return a;
}

__host__ __device__ inline OptSgd cuopt_sgd(double lr, double momentum, double weight_decay, int64_t step,
                                            double grad_scale) {
  OptSgd a;
  a.gs = (float)grad_scale;
  a.wd = (float)weight_decay;
  a.mom = (float)momentum;
  a.nlr = (float)-lr;
  a.use_wd = weight_decay != 0;
  a.first = step <= 1;
  return a;
}

/* Elements 4j..4j + 3 of a floating tensor of dtype DT, as f32, in one
 * load (16 bytes of f32, 8 of bf16/f16: the caller checked alignment). */
template <int DT> __device__ __forceinline__ void cuopt_ld4(const void *p, int64_t j, float *x) {
  if constexpr (DT == TGM_F32) {
    float4 t = ((const float4 *)p)[j];
    x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;
  } else {
    uint2 t = ((const uint2 *)p)[j];
    const uint16_t h[4] = {(uint16_t)t.x, (uint16_t)(t.x >> 16), (uint16_t)t.y, (uint16_t)(t.y >> 16)};
    for (int k = 0; k < 4; k++)
      x[k] = cuopt_ld<DT>(h, k);
  }
}

/* The same four elements of the low-precision copy, in one store. */
template <int LDT> __device__ __forceinline__ void cuopt_st4(void *p, int64_t j, const float *x) {
  if constexpr (LDT == TGM_F32) {
    ((float4 *)p)[j] = make_float4(x[0], x[1], x[2], x[3]);
  } else if constexpr (LDT == TGM_BF16 || LDT == TGM_F16) {
    uint16_t h[4];
    for (int k = 0; k < 4; k++)
      cuopt_st<LDT>(h, k, x[k]);
    ((uint2 *)p)[j] = make_uint2(h[0] | (uint32_t)h[1] << 16, h[2] | (uint32_t)h[3] << 16);
  } else {
    (void)p, (void)j, (void)x;
  }
}

/* One AdamW element, in torch's order of operations. */
__device__ __forceinline__ void cuopt_adamw_one(const OptAdam &a, float gi, float &wi, float &mi, float &vi) {
  gi = gi * a.gs;
  wi = wi * a.decay;
  float d = gi - mi;
  mi = a.small ? mi + a.w1 * d : gi + a.wm1 * d;
  vi = vi * a.b2 + a.omb2 * gi * gi;
  wi = wi + a.nstep * mi / (sqrtf(vi) / a.bc2s + a.eps);
}

/* st == NULL: the scalars are a; else the prepare kernel's (or nothing, when
 * it refused the step). vec: every pointer allows 4 elements per access
 * (16-byte f32 vectors, 8-byte bf16/f16): the elements go 4 a thread, the
 * last n % 4 one a thread; the same arithmetic per element either way. */
template <int GDT, int LDT>
__global__ void __launch_bounds__(kOptThreads)
    k_opt_adamw(float *__restrict__ w, const void *__restrict__ g, float *__restrict__ m, float *__restrict__ v,
                void *__restrict__ lowp, int64_t n, OptAdam a, const OptDev *st, int vec) {
  if (st) {
    if (st->skip)
      return;
    a = st->adam;
  }
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
  const int64_t nv = vec ? n / 4 : 0;
  for (int64_t j = t; j < nv; j += step) {
    float gi[4], wi[4], lo[4];
    float4 w4 = ((const float4 *)w)[j], m4 = ((const float4 *)m)[j], v4 = ((const float4 *)v)[j];
    float mi[4] = {m4.x, m4.y, m4.z, m4.w}, vi[4] = {v4.x, v4.y, v4.z, v4.w};
    wi[0] = w4.x, wi[1] = w4.y, wi[2] = w4.z, wi[3] = w4.w;
    cuopt_ld4<GDT>(g, j, gi);
    for (int k = 0; k < 4; k++) {
      cuopt_adamw_one(a, gi[k], wi[k], mi[k], vi[k]);
      lo[k] = wi[k];
    }
    ((float4 *)w)[j] = make_float4(wi[0], wi[1], wi[2], wi[3]);
    ((float4 *)m)[j] = make_float4(mi[0], mi[1], mi[2], mi[3]);
    ((float4 *)v)[j] = make_float4(vi[0], vi[1], vi[2], vi[3]);
    cuopt_st4<LDT>(lowp, j, lo);
  }
  for (int64_t i = nv * 4 + t; i < n; i += step) {
    float wi = w[i], mi = m[i], vi = v[i];
    cuopt_adamw_one(a, cuopt_ld<GDT>(g, i), wi, mi, vi);
    w[i] = wi;
    m[i] = mi;
    v[i] = vi;
    cuopt_st<LDT>(lowp, i, wi);
  }
}

/* MOM: momentum != 0 (buf is read and written; otherwise never touched). */
template <int GDT, int LDT, bool MOM>
__global__ void __launch_bounds__(kOptThreads)
    k_opt_sgd(float *__restrict__ w, const void *__restrict__ g, float *__restrict__ buf, void *__restrict__ lowp,
              int64_t n, OptSgd a, const OptDev *st) {
  if (st) {
    if (st->skip)
      return;
    a = st->sgd;
  }
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float gi = cuopt_ld<GDT>(g, i) * a.gs, wi = w[i];
    if (a.use_wd)
      gi = gi + a.wd * wi;
    if constexpr (MOM) {
      gi = a.first ? gi : buf[i] * a.mom + gi;
      buf[i] = gi;
    }
    wi = wi + a.nlr * gi;
    w[i] = wi;
    cuopt_st<LDT>(lowp, i, wi);
  }
}

/* Fixed-order tree sum of the block's values; the result in thread 0. */
__device__ __forceinline__ double cuopt_block_sum(double s, double *sh) {
  sh[threadIdx.x] = s;
  __syncthreads();
  for (int k = kOptThreads / 2; k > 0; k >>= 1) {
    if ((int)threadIdx.x < k)
      sh[threadIdx.x] += sh[threadIdx.x + k];
    __syncthreads();
  }
  return sh[0];
}

template <int DT>
__global__ void __launch_bounds__(kOptThreads) k_opt_sumsq_part(const void *__restrict__ x, int64_t n, double *part) {
  __shared__ double sh[kOptThreads];
  double s = 0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    double e = (double)cuopt_ld<DT>(x, i);
    s += e * e;
  }
  s = cuopt_block_sum(s, sh);
  if (threadIdx.x == 0)
    part[blockIdx.x] = s;
}

__global__ void __launch_bounds__(kOptThreads) k_opt_sumsq_final(const double *part, int nb, double *out) {
  __shared__ double sh[kOptThreads];
  double s = 0;
  for (int i = threadIdx.x; i < nb; i += blockDim.x)
    s += part[i];
  s = cuopt_block_sum(s, sh);
  if (threadIdx.x == 0)
    out[0] = s;
}

/* The step's decision, one thread: the global sum of squares over the runs
 * in order; a step with bad data recorded (d_bad) or a non-finite norm is
 * refused (skip; the first refusal is kept for the report); otherwise the
 * clip factor (torch's clip_grad_norm_) and the scalars of step t = step + 1. */
__global__ void k_opt_prepare(OptDev *st, int nruns, tgm_opt_hyper h, const unsigned long long *bad) {
  double ss = 0;
  for (int i = 0; i < nruns; i++)
    ss += st->ss[i];
  int data = bad && *bad != (unsigned long long)INT64_MAX;
  int64_t t = st->step + 1;
  st->skip = data || !isfinite(ss);
  if (st->skip) {
    if (!st->bad_step)
      st->bad_step = t, st->bad_ss = data ? 0 : ss;
    return;
  }
  double scale = 1;
  if (h.grad_clip > 0) {
    double c = h.grad_clip / (sqrt(ss) + 1e-6);
    scale = c > 1.0 ? 1.0 : c;
  }
  if (h.optimizer == 2)
    st->adam = cuopt_adam(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, t, scale);
  else
    st->sgd = cuopt_sgd(h.lr, h.momentum, h.weight_decay, t, scale);
  st->step = t;
}

__global__ void k_opt_set_step(OptDev *st, int64_t step) { st->step = step; }

/* ---------------------------------------------------------------- host helpers */

bool cuopt_is_float(int dt) { return dt == TGM_F32 || dt == TGM_BF16 || dt == TGM_F16; }

unsigned cuopt_grid(int64_t n, int64_t cap) {
  int64_t b = (n + kOptThreads - 1) / kOptThreads;
  return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}

template <int V> using OptInt = std::integral_constant<int, V>;

/* f(OptInt<GDT>, OptInt<LDT>) for the gradient dtype and the copy's (-1: none). */
template <class F> int cuopt_dispatch(int gdt, int ldt, F f) {
  auto low = [&](auto G) -> int {
    switch (ldt) {
    case TGM_F32: return f(G, OptInt<TGM_F32>());
    case TGM_BF16: return f(G, OptInt<TGM_BF16>());
    case TGM_F16: return f(G, OptInt<TGM_F16>());
    default: return f(G, OptInt<-1>());
    }
  };
  switch (gdt) {
  case TGM_BF16: return low(OptInt<TGM_BF16>());
  case TGM_F16: return low(OptInt<TGM_F16>());
  default: return low(OptInt<TGM_F32>());
  }
}

/* The checks common to both updates; 0 or an error recorded in the context. */
int cuopt_check(tgm_cuda_ctx *cx, int64_t n, bool ptrs_ok, int gdt, const void *lowp, int lowdt) {
  if (n < 0)
    return tgm_cuda_ctx_fail(cx, (int)cudaErrorInvalidValue, "negative size %lld", (long long)n);
  if (n > 0 && !ptrs_ok)
    return tgm_cuda_ctx_fail(cx, (int)cudaErrorInvalidValue, "NULL pointer");
  if (!cuopt_is_float(gdt))
    return tgm_cuda_ctx_fail(cx, (int)cudaErrorInvalidValue, "gradient dtype %d is not f32, bf16 or f16", gdt);
  if (lowp && !cuopt_is_float(lowdt))
    return tgm_cuda_ctx_fail(cx, (int)cudaErrorInvalidValue, "low-precision copy dtype %d is not f32, bf16 or f16",
                             lowdt);
  return 0;
}

int cuopt_launched(tgm_cuda_ctx *cx, const char *what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return tgm_cuda_ctx_fail(cx, (int)e, "launching %s failed: %s (%s)", what, cudaGetErrorString(e),
                             cudaGetErrorName(e));
  return 0;
}

/* The launches shared by the host-scalar entry points and the device-driven step. */
int cuopt_adamw_launch(tgm_cuda_ctx *cx, cudaStream_t stream, float *w, const void *g, int gdt, float *m, float *v,
                       void *lowp, int lowdt, int64_t n, OptAdam a, const OptDev *st) {
  /* 4 elements an access where every pointer is aligned for it */
  const uintptr_t a16 = (uintptr_t)w | (uintptr_t)m | (uintptr_t)v | (gdt == TGM_F32 ? (uintptr_t)g : 0) |
                        (lowp && lowdt == TGM_F32 ? (uintptr_t)lowp : 0);
  const uintptr_t a8 = (gdt != TGM_F32 ? (uintptr_t)g : 0) | (lowp && lowdt != TGM_F32 ? (uintptr_t)lowp : 0);
  const int vec = a16 % 16 == 0 && a8 % 8 == 0;
  return cuopt_dispatch(gdt, lowp ? lowdt : -1, [&](auto G, auto L) -> int {
    k_opt_adamw<decltype(G)::value, decltype(L)::value>
        <<<cuopt_grid(vec ? (n + 3) / 4 : n, kOptMaxBlocks), kOptThreads, 0, stream>>>(w, g, m, v, lowp, n, a, st, vec);
    return cuopt_launched(cx, "k_opt_adamw");
  });
}

int cuopt_sgd_launch(tgm_cuda_ctx *cx, cudaStream_t stream, float *w, const void *g, int gdt, float *buf, void *lowp,
                     int lowdt, int64_t n, bool mom, OptSgd a, const OptDev *st) {
  return cuopt_dispatch(gdt, lowp ? lowdt : -1, [&](auto G, auto L) -> int {
    if (mom)
      k_opt_sgd<decltype(G)::value, decltype(L)::value, true>
          <<<cuopt_grid(n, kOptMaxBlocks), kOptThreads, 0, stream>>>(w, g, buf, lowp, n, a, st);
    else
      k_opt_sgd<decltype(G)::value, decltype(L)::value, false>
          <<<cuopt_grid(n, kOptMaxBlocks), kOptThreads, 0, stream>>>(w, g, buf, lowp, n, a, st);
    return cuopt_launched(cx, "k_opt_sgd");
  });
}

/* sum of squares of x into *out (device): per-block partials, then one block. */
int cuopt_sumsq_launch(tgm_cuda_ctx *cx, cudaStream_t stream, const void *x, int dt, int64_t n, double *part,
                       double *out) {
  unsigned nb = cuopt_grid(n, kOptSumBlocks);
  switch (dt) {
  case TGM_BF16: k_opt_sumsq_part<TGM_BF16><<<nb, kOptThreads, 0, stream>>>(x, n, part); break;
  case TGM_F16: k_opt_sumsq_part<TGM_F16><<<nb, kOptThreads, 0, stream>>>(x, n, part); break;
  default: k_opt_sumsq_part<TGM_F32><<<nb, kOptThreads, 0, stream>>>(x, n, part); break;
  }
  if (int rc = cuopt_launched(cx, "k_opt_sumsq_part"))
    return rc;
  k_opt_sumsq_final<<<1, kOptThreads, 0, stream>>>(part, (int)nb, out);
  return cuopt_launched(cx, "k_opt_sumsq_final");
}

} // namespace

/* ---------------------------------------------------------------- entry points */

int tgm_cuda_adamw(tgm_cuda_ctx *cx, float *w, const void *g, int gdt, float *m, float *v, void *lowp, int lowdt,
                   int64_t n, double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step,
                   double grad_scale) {
  cudaStream_t stream = tgm_cuda_ctx_stream(cx, "tgm_cuda_adamw");
  if (int rc = cuopt_check(cx, n, w && g && m && v, gdt, lowp, lowdt))
    return rc;
  if (n == 0)
    return 0;
  return cuopt_adamw_launch(cx, stream, w, g, gdt, m, v, lowp, lowdt, n,
                            cuopt_adam(lr, beta1, beta2, eps, weight_decay, step, grad_scale), NULL);
}

int tgm_cuda_sgd(tgm_cuda_ctx *cx, float *w, const void *g, int gdt, float *buf, void *lowp, int lowdt, int64_t n,
                 double lr, double momentum, double weight_decay, int64_t step, double grad_scale) {
  cudaStream_t stream = tgm_cuda_ctx_stream(cx, "tgm_cuda_sgd");
  if (int rc = cuopt_check(cx, n, w && g && (buf || momentum == 0), gdt, lowp, lowdt))
    return rc;
  if (n == 0)
    return 0;
  return cuopt_sgd_launch(cx, stream, w, g, gdt, buf, lowp, lowdt, n, momentum != 0,
                          cuopt_sgd(lr, momentum, weight_decay, step, grad_scale), NULL);
}

int tgm_cuda_sum_squares(tgm_cuda_ctx *cx, const void *x, int dt, int64_t n, double *host_result) {
  cudaStream_t stream = tgm_cuda_ctx_stream(cx, "tgm_cuda_sum_squares");
  if (!host_result)
    return tgm_cuda_ctx_fail(cx, (int)cudaErrorInvalidValue, "NULL result pointer");
  *host_result = 0;
  if (int rc = cuopt_check(cx, n, x != NULL, dt, NULL, 0))
    return rc;
  if (n == 0)
    return 0;
  void *s = NULL;
  if (int rc = tgm_cuda_ctx_scratch(cx, sizeof(double) * (kOptSumBlocks + 1), &s))
    return rc;
  double *part = (double *)s, *out = part + kOptSumBlocks;
  if (int rc = cuopt_sumsq_launch(cx, stream, x, dt, n, part, out))
    return rc;
  double r = 0;
  cudaError_t e = cudaMemcpyAsync(&r, out, sizeof r, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess)
    return tgm_cuda_ctx_fail(cx, (int)e, "reading the sum back failed: %s (%s)", cudaGetErrorString(e),
                             cudaGetErrorName(e));
  *host_result = r;
  return 0;
}

/* ---------------------------------------------------------------- the device-driven step */

int tgm_cuda_opt_new(tgm_cuda_ctx *cx, int nruns, void **state) {
  size_t bytes = sizeof(OptDev) + sizeof(double) * (size_t)(nruns + kOptSumBlocks);
  *state = NULL;
  if (int rc = tgm_cuda_malloc(cx, state, bytes))
    return rc;
  cudaError_t e = cudaMemsetAsync(*state, 0, bytes, tgm_cuda_ctx_stream(cx, "tgm_cuda_opt_new"));
  if (e != cudaSuccess)
    return tgm_cuda_ctx_fail(cx, (int)e, "clearing the optimizer's device state: %s", cudaGetErrorString(e));
  return 0;
}

int tgm_cuda_opt_sum_squares(tgm_cuda_ctx *cx, void *state, int nruns, int run, const void *x, int dt, int64_t n) {
  cudaStream_t stream = tgm_cuda_ctx_stream(cx, "tgm_cuda_opt_sum_squares");
  if (int rc = cuopt_check(cx, n, x != NULL && state != NULL, dt, NULL, 0))
    return rc;
  OptDev *st = (OptDev *)state;
  if (n == 0)
    return cudaMemsetAsync(&st->ss[run], 0, sizeof(double), stream) == cudaSuccess
               ? 0
               : tgm_cuda_ctx_fail(cx, (int)cudaErrorUnknown, "clearing a sum of squares failed");
  return cuopt_sumsq_launch(cx, stream, x, dt, n, st->ss + nruns, &st->ss[run]);
}

int tgm_cuda_opt_prepare(tgm_cuda_ctx *cx, void *state, int nruns, const tgm_opt_hyper *h) {
  cudaStream_t stream = tgm_cuda_ctx_stream(cx, "tgm_cuda_opt_prepare");
  k_opt_prepare<<<1, 1, 0, stream>>>((OptDev *)state, nruns, *h, tgm_cuda_bad_ptr(cx));
  return cuopt_launched(cx, "k_opt_prepare");
}

int tgm_cuda_opt_adamw(tgm_cuda_ctx *cx, const void *state, float *w, const void *g, int gdt, float *m, float *v,
                       void *lowp, int lowdt, int64_t n) {
  cudaStream_t stream = tgm_cuda_ctx_stream(cx, "tgm_cuda_opt_adamw");
  if (int rc = cuopt_check(cx, n, w && g && m && v && state, gdt, lowp, lowdt))
    return rc;
  return n ? cuopt_adamw_launch(cx, stream, w, g, gdt, m, v, lowp, lowdt, n, OptAdam(), (const OptDev *)state) : 0;
}

int tgm_cuda_opt_sgd(tgm_cuda_ctx *cx, const void *state, float *w, const void *g, int gdt, float *buf, int mom,
                     void *lowp, int lowdt, int64_t n) {
  cudaStream_t stream = tgm_cuda_ctx_stream(cx, "tgm_cuda_opt_sgd");
  if (int rc = cuopt_check(cx, n, w && g && (buf || !mom) && state, gdt, lowp, lowdt))
    return rc;
  return n ? cuopt_sgd_launch(cx, stream, w, g, gdt, buf, lowp, lowdt, n, mom != 0, OptSgd(), (const OptDev *)state)
           : 0;
}

/*@uses distributed@*/
double *tgm_cuda_opt_sums(void *state) { return ((OptDev *)state)->ss; }

/*@end distributed@*/
int tgm_cuda_opt_set_step(tgm_cuda_ctx *cx, void *state, int64_t step) {
  k_opt_set_step<<<1, 1, 0, tgm_cuda_ctx_stream(cx, "tgm_cuda_opt_set_step")>>>((OptDev *)state, step);
  return cuopt_launched(cx, "k_opt_set_step");
}

int tgm_cuda_opt_report(tgm_cuda_ctx *cx, void *state, int64_t *step, int64_t *bad_step, double *bad_ss) {
  cudaStream_t stream = tgm_cuda_ctx_stream(cx, "tgm_cuda_opt_report");
  struct { int64_t step, bad_step; double bad_ss; } r; /* OptDev's first three fields */
  static_assert(offsetof(OptDev, bad_ss) == 2 * sizeof(int64_t), "OptDev's layout");
  cudaError_t e = cudaMemcpyAsync(&r, state, sizeof r, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(stream);
  if (e == cudaSuccess && r.bad_step)
    e = cudaMemsetAsync((char *)state + sizeof(int64_t), 0, sizeof(int64_t), stream);
  if (e != cudaSuccess)
    return tgm_cuda_ctx_fail(cx, (int)e, "reading the optimizer's state failed: %s", cudaGetErrorString(e));
  *step = r.step, *bad_step = r.bad_step, *bad_ss = r.bad_ss;
  return 0;
}
