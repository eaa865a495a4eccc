/* mlp_cpu.c: the CPU kernel library of the runtime (the "CPU kernels" section
 * of mlp_rt.h), one function per op, OpenMP-parallel and vectorisable.
 *
 * Template: copied into every emitted project with "mlp_" renamed. Plain C11
 * plus OpenMP pragmas (ignored without -fopenmp); needs libm, and a CBLAS when
 * built with -DTGM_HAVE_CBLAS. The dtype conversions (mlp_bf16_to_f32, ...)
 * live in mlp_init.c; the hot loops use the inline copies of mlp_rt.h
 * (mlp_ld_bf16, mlp_st_bf16, mlp_ld_f16, mlp_st_f16, shared with
 * mlp_optim_cpu.c), written so that loops over them vectorise, bit-identical
 * to those (round to nearest even; the unit test checks every half and a
 * sweep of floats).
 *
 * Numerics: floating ops compute in f32 (bf16/f16 are loaded to f32 and the
 * result rounded once on store); long reductions (sum, mean, var, logsumexp,
 * softmax and norm statistics, losses) accumulate in double, in an order that
 * does not depend on the thread count; i32 ops are exact (int64
 * intermediates, results wrap to 32 bits). exp, tanh, erf and gelu are
 * vectorisable polynomials written here (exp 1.4 ulp; tanh, erf, erfc within
 * 4e-7 relative; inf, NaN and subnormals as libm); log, sqrt, sin, cos, pow
 * are libm's. On x86 with gcc or clang the hot loops are also compiled for
 * AVX2 and AVX-512 and picked at load time (target_clones), as are the GEMM
 * micro-kernels (at run time); -DTGM_NO_ISA_DISPATCH turns both off.
 *
 * The layout of the file:
 *   helpers      threads, pragmas, dtype loads and stores (on mlp_rt.h's
 *                inline conversions and bit selects), exp and tanh
 *   broadcast    Bc: a result shape with each operand's strides, collapsed to
 *                the fewest dims, walked in contiguous runs by several threads
 *   pointwise    unary, cast, binary, where, broadcast, fill, arange, dropout
 *   reductions   reduce (any axes), softmax, layer_norm, rms_norm, losses
 *   data movement  permute (tiled transposes), slice, copy_into, embedding
 *                and its backward (a stable counting sort, then rows)
 *   GEMM         a packed, cache-blocked GEMM with register-blocked micro-
 *                kernels (AVX-512 / AVX2 chosen at run time on x86, else
 *                plain C), or cblas_sgemm; matmul, linear, attention on top
 *   gemm         mlp_cpu_gemm: the same blocks and micro-kernels on any
 *                dtype, transposes, strides and batches, with the fused
 *                epilogue applied as micro-tiles are stored. */
#include "mlp_rt.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef MLP_HAVE_CBLAS
#include <cblas.h>
#endif

/* ---------------------------------------------------------------- helpers */

/* OMP(parallel for ...) is `#pragma omp parallel for ...` under OpenMP and
 * nothing otherwise (so builds without -fopenmp see no unknown pragmas). */
#define PRAGMA_(...) _Pragma(#__VA_ARGS__)
#ifdef _OPENMP
#define OMP(...) PRAGMA_(omp __VA_ARGS__)
#define SIMD PRAGMA_(omp simd)
#define SIMD_SUM(v) PRAGMA_(omp simd reduction(+ : v))
static int nthreads(void) { return omp_in_parallel() ? 1 : omp_get_max_threads(); }
#else
#define OMP(...)
#define SIMD
#define SIMD_SUM(v)
static int nthreads(void) { return 1; }
#endif
#if defined(__GNUC__) && !defined(__clang__)
#define UNROLL PRAGMA_(GCC unroll 32)
#elif defined(__clang__)
#define UNROLL PRAGMA_(unroll)
#else
#define UNROLL
#endif

/* The hot loops are compiled three times (AVX-512, AVX2, baseline) and the
 * best one for the CPU picked at load time (gcc and clang on x86 glibc, where
 * ifuncs exist); elsewhere, or with -DTGM_NO_ISA_DISPATCH, once for the
 * compiler's target. Only leaf functions (no parallel regions) are cloned. */
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) &&                          \
    !defined(MLP_NO_ISA_DISPATCH)
#define ISA_DISPATCH 1
#if defined(__GLIBC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#endif
#ifndef CLONES
#define CLONES
#endif

/* Small helpers inside the hot loops must inline even when gcc's unit growth
 * limit is reached (it is, with the clones), or the loops do not vectorise. */
#if defined(__GNUC__) || defined(__clang__)
#define HOT static inline __attribute__((always_inline))
#else
#define HOT static inline
#endif

/* Work below this many elements runs on one thread. */
#define PAR_MIN 32768
/* Partial results of a parallel sum: a fixed number of chunks summed in
 * order, so a result does not depend on the thread count. */
#define NCHUNK 64
/* f32 scratch blocks (elements) for bf16/f16 pointwise work. */
#define BLK 256

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static size_t esize(int dt) { return dt == MLP_BF16 || dt == MLP_F16 ? 2 : dt == MLP_BOOL ? 1 : 4; }
static int is_half(int dt) { return dt == MLP_BF16 || dt == MLP_F16; }

/* One element of any dtype as a float / from a float (i32 saturating, NaN to
 * INT32_MIN, as tgen's cast; bool as 0/1). For scalars and slow paths. */
static inline float ldf(int dt, const void *p, int64_t i) {
  switch (dt) {
  case MLP_BF16: return mlp_ld_bf16(((const uint16_t *)p)[i]);
  case MLP_F16: return mlp_ld_f16(((const uint16_t *)p)[i]);
  case MLP_I32: return (float)((const int32_t *)p)[i];
  case MLP_BOOL: return (float)((const uint8_t *)p)[i];
  default: return ((const float *)p)[i];
  }
}
static inline double ldd(int dt, const void *p, int64_t i) {
  return dt == MLP_I32 ? (double)((const int32_t *)p)[i] : (double)ldf(dt, p, i);
}
static inline int32_t sat_i32(double v) {
  if (!(v > -2147483649.0 && v < 2147483648.0))
    return INT32_MIN;
  return (int32_t)v;
}
static inline void stval(int dt, void *p, int64_t i, double v) {
  switch (dt) {
  case MLP_BF16: ((uint16_t *)p)[i] = mlp_st_bf16((float)v); break;
  case MLP_F16: ((uint16_t *)p)[i] = mlp_st_f16((float)v); break;
  case MLP_I32: ((int32_t *)p)[i] = sat_i32(v); break;
  case MLP_BOOL: ((uint8_t *)p)[i] = v != 0; break;
  default: ((float *)p)[i] = (float)v; break;
  }
}

/* Loaders and storers for loops stamped out once per floating dtype:
 * DT_CASES(dt, M) expands M(LD, ST) for the dtype's pair. */
#define LD_F32(p, i) (((const float *)(p))[i])
#define LD_BF(p, i) mlp_ld_bf16(((const uint16_t *)(p))[i])
#define LD_H(p, i) mlp_ld_f16(((const uint16_t *)(p))[i])
#define ST_F32(p, i, v) (((float *)(p))[i] = (v))
#define ST_BF(p, i, v) (((uint16_t *)(p))[i] = mlp_st_bf16(v))
#define ST_H(p, i, v) (((uint16_t *)(p))[i] = mlp_st_f16(v))
#define DT_CASES(dt, M)                                                                                                \
  switch (dt) {                                                                                                        \
  case MLP_BF16: M(LD_BF, ST_BF); break;                                                                               \
  case MLP_F16: M(LD_H, ST_H); break;                                                                                  \
  default: M(LD_F32, ST_F32); break;                                                                                   \
  }

/* n floating elements of dtype dt to f32 and back (serial; blocks). */
CLONES static void to_f32(int dt, const void *x, float *restrict y, int64_t n) {
#define M_(LD, ST)                                                                                                     \
  SIMD for (int64_t i = 0; i < n; i++) y[i] = LD(x, i);
  DT_CASES(dt, M_)
#undef M_
}
CLONES static void from_f32(int dt, const float *restrict x, void *y, int64_t n) {
#define M_(LD, ST)                                                                                                     \
  SIMD for (int64_t i = 0; i < n; i++) ST(y, i, x[i]);
  DT_CASES(dt, M_)
#undef M_
}

/* Parallel versions for whole tensors. */
static void to_f32_par(int dt, const void *x, float *y, int64_t n) {
  int64_t nb = (n + 4095) / 4096;
  OMP(parallel for schedule(static) if (n >= PAR_MIN))
  for (int64_t b = 0; b < nb; b++)
    to_f32(dt, (const char *)x + b * 4096 * (int64_t)esize(dt), y + b * 4096, min64(4096, n - b * 4096));
}
static void from_f32_par(int dt, const float *x, void *y, int64_t n) {
  int64_t nb = (n + 4095) / 4096;
  OMP(parallel for schedule(static) if (n >= PAR_MIN))
  for (int64_t b = 0; b < nb; b++)
    from_f32(dt, x + b * 4096, (char *)y + b * 4096 * (int64_t)esize(dt), min64(4096, n - b * 4096));
}

/* A malloc'd f32 copy of a floating tensor, or NULL. */
static float *f32_copy(int dt, const void *x, int64_t n) {
  float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  if (p)
    to_f32_par(dt, x, p, n);
  return p;
}

/* exp(x) = 2^n e^r with n = round(x log2 e) (taken from the bits of x log2 e +
 * 1.5 * 2^23, no float-to-int conversion), r reduced in two steps (Cody-Waite)
 * and e^r from Cephes' expf polynomial; 2^n applied as two factors so
 * subnormal results round once. Above 88.75 is inf, below -104 is 0, NaN
 * stays NaN. Max error 1.4 ulp. */
HOT float exp_f32(float x) {
  float t = x * 1.44269504088896341f + 12582912.0f;
  float n = t - 12582912.0f;
  int32_t ni = (int32_t)(mlp_f_bits(t) - 0x4b400000u), h = ni / 2;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = (((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) * r +
              1.6666665459e-1f) * r + 5.0000001201e-1f) * (r * r) + r + 1.0f;
  float e = p * mlp_bits_f((uint32_t)(h + 127) << 23) * mlp_bits_f((uint32_t)(ni - h + 127) << 23);
  uint32_t big = mlp_mask(x > 88.75f), small = mlp_mask(x < -104.0f);
  return mlp_bits_f(((mlp_f_bits(e) & ~big) | (0x7f800000u & big)) & ~small);
}

/* tanh: Cephes' odd polynomial below |x| = 0.625, else 1 - 2 / (e^2|x| + 1)
 * with the sign of x (both computed, one selected). */
HOT float tanh_f32(float x) {
  float z = x * x;
  float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z + 1.33314422036e-1f) * z -
                 3.33332819422e-1f) * z * x + x;
  float ax = mlp_bits_f(mlp_f_bits(x) & 0x7fffffffu);
  float big = 1.0f - 2.0f / (exp_f32(2.0f * ax) + 1.0f);
  big = mlp_bits_f(mlp_f_bits(big) | (mlp_f_bits(x) & 0x80000000u));
  return mlp_sel(mlp_mask(ax < 0.625f), small, big);
}

/* erfc(z) for z >= 0: libm's erfcf (correctly rounded to within an ulp; it
 * does not vectorise, which costs GELU(erf) some speed until a polynomial of
 * our own derivation replaces it). */
HOT float erfc_pos(float z) { return erfcf(z); }

/* erf: the Taylor series to x^11 below |x| = 0.5 (relative error 3e-8),
 * else 1 - erfc(|x|); the sign of x. */
HOT float erf_f32(float x) {
  float ax = mlp_bits_f(mlp_f_bits(x) & 0x7fffffffu), z = ax * ax;
  float small = ax * (1.12837916709551257f +
                      z * (-0.37612638903183752f +
                           z * (0.11283791670955126f +
                                z * (-0.02686617064513125f + z * (0.00522397762544218f + z * -0.00085483270234508f)))));
  float r = mlp_sel(mlp_mask(ax < 0.5f), small, 1.0f - erfc_pos(ax));
  return mlp_bits_f(mlp_f_bits(r) | (mlp_f_bits(x) & 0x80000000u));
}

/* gelu(x) = x/2 (1 + erf(x / sqrt 2)) = x/2 erfc(|x| / sqrt 2) for x < 0 (no
 * cancellation there), x/2 (2 - erfc(x / sqrt 2)) otherwise. */
HOT float gelu_f32(float x) {
  float e = erfc_pos(mlp_bits_f(mlp_f_bits(x) & 0x7fffffffu) * 0.70710678118654752440f);
  return 0.5f * x * mlp_sel(mlp_mask(x < 0), e, 2.0f - e);
}

/* NaN-propagating max (torch.amax, torch.maximum), as a bitwise select. */
HOT float max_nan(float m, float v) { return mlp_sel(mlp_mask((v > m) | (v != v)), v, m); }
static inline double max_nan_d(double m, double v) {
  if (m != m)
    return m;
  return v > m || v != v ? v : m;
}

/* ---------------------------------------------------------------- broadcast */

/* The result's shape with, for each operand, the element strides that read it
 * at the result's coordinates (0 along broadcast dims). Size-1 dims are
 * dropped and neighbours merged wherever every operand allows, so a same-shape
 * op is one dim, a bias add two. The innermost stride of each operand is then
 * 0 or 1. */
typedef struct Bc {
  int rank, nop;
  int64_t n;
  int64_t shape[MLP_MAXRANK];
  int64_t st[4][MLP_MAXRANK];
} Bc;

static void bc_init(Bc *b, int ry, const int64_t *sy, int nop, const int *r, const int64_t *const *s) {
  int64_t st[4][MLP_MAXRANK];
  b->nop = nop;
  b->n = 1;
  for (int k = 0; k < ry; k++)
    b->n *= sy[k];
  for (int p = 0; p < nop; p++) {
    int64_t c = 1;
    for (int k = ry - 1; k >= 0; k--) {
      int kk = k - (ry - r[p]);
      st[p][k] = kk < 0 || s[p][kk] == 1 ? 0 : c;
      if (kk >= 0)
        c *= s[p][kk];
    }
  }
  b->rank = 0;
  for (int k = 0; k < ry; k++) {
    if (sy[k] == 1)
      continue;
    int merge = b->rank > 0;
    for (int p = 0; p < nop && merge; p++)
      merge = b->st[p][b->rank - 1] == st[p][k] * sy[k];
    if (merge) {
      b->shape[b->rank - 1] *= sy[k];
      for (int p = 0; p < nop; p++)
        b->st[p][b->rank - 1] = st[p][k];
    } else {
      b->shape[b->rank] = sy[k];
      for (int p = 0; p < nop; p++)
        b->st[p][b->rank] = st[p][k];
      b->rank++;
    }
  }
  if (b->rank == 0) {
    b->rank = 1;
    b->shape[0] = 1;
    for (int p = 0; p < nop; p++)
      b->st[p][0] = 0;
  }
}

/* The coordinates and operand offsets of flat result index i. */
static void bc_seek(const Bc *b, int64_t i, int64_t *idx, int64_t *off) {
  for (int p = 0; p < b->nop; p++)
    off[p] = 0;
  for (int k = b->rank - 1; k >= 0; k--) {
    idx[k] = i % b->shape[k];
    i /= b->shape[k];
    for (int p = 0; p < b->nop; p++)
      off[p] += idx[k] * b->st[p][k];
  }
}

/* Moves m elements along the innermost dim (not past its end), carrying. */
static void bc_step(const Bc *b, int64_t *idx, int64_t *off, int64_t m) {
  int k = b->rank - 1;
  idx[k] += m;
  for (int p = 0; p < b->nop; p++)
    off[p] += m * b->st[p][k];
  while (k >= 0 && idx[k] == b->shape[k]) {
    for (int p = 0; p < b->nop; p++)
      off[p] -= b->shape[k] * b->st[p][k];
    idx[k] = 0;
    if (--k >= 0) {
      idx[k]++;
      for (int p = 0; p < b->nop; p++)
        off[p] += b->st[p][k];
    }
  }
}

/* fn(ctx, chunk, off, i, len): elements i .. i+len-1 of the result, a run
 * along the innermost dim, operand p starting at element off[p]. */
typedef void (*run_fn)(void *ctx, int chunk, const int64_t *off, int64_t i, int64_t len);

/* Calls fn on every run of the result, the flat range split into nch chunks
 * (0: as many as suit the threads) run in parallel. */
static void bc_run(const Bc *b, run_fn fn, void *ctx, int nch) {
  int64_t n = b->n;
  if (n <= 0)
    return;
  if (nch <= 0)
    nch = n >= PAR_MIN ? 4 * nthreads() : 1;
  OMP(parallel for schedule(static) if (nch > 1 && n >= PAR_MIN))
  for (int c = 0; c < nch; c++) {
    int64_t lo = n / nch * c + min64(c, n % nch), hi = lo + n / nch + (c < n % nch);
    int64_t idx[MLP_MAXRANK], off[4];
    if (lo >= hi)
      continue;
    bc_seek(b, lo, idx, off);
    for (int64_t i = lo; i < hi;) {
      int64_t len = min64(b->shape[b->rank - 1] - idx[b->rank - 1], hi - i);
      fn(ctx, c, off, i, len);
      i += len;
      bc_step(b, idx, off, len);
    }
  }
}

/* ---------------------------------------------------------------- unary */

static const float SQRT_2_OVER_PI = 0.79788456080286535588f;

/* y[i] = op(x[i]) in f32; the switch is outside the loops. */
CLONES static void unary_f32(int op, const float *restrict x, float *restrict y, int64_t n, float a, float b) {
#define LOOP(EXPR)                                                                                                     \
  SIMD for (int64_t i = 0; i < n; i++) {                                                                               \
    const float v = x[i];                                                                                              \
    y[i] = (EXPR);                                                                                                     \
  }                                                                                                                    \
  break;
  switch (op) {
  case MLP_NEG: LOOP(-v)
  case MLP_ABS: LOOP(mlp_bits_f(mlp_f_bits(v) & 0x7fffffffu))
  case MLP_EXP: LOOP(exp_f32(v))
  case MLP_LOG: for (int64_t i = 0; i < n; i++) y[i] = logf(x[i]); break;
  case MLP_SQRT: for (int64_t i = 0; i < n; i++) y[i] = sqrtf(x[i]); break; /* libm (errno): no simd */
  case MLP_RSQRT: for (int64_t i = 0; i < n; i++) y[i] = 1.0f / sqrtf(x[i]); break;
  case MLP_SIN: for (int64_t i = 0; i < n; i++) y[i] = sinf(x[i]); break;
  case MLP_COS: for (int64_t i = 0; i < n; i++) y[i] = cosf(x[i]); break;
  case MLP_TANH: LOOP(tanh_f32(v))
  case MLP_SIGMOID: LOOP(1.0f / (1.0f + exp_f32(-v)))
  case MLP_RELU: LOOP(v < 0 ? 0.0f : v) /* NaN stays NaN */
  case MLP_SILU: LOOP(v / (1.0f + exp_f32(-v)))
  case MLP_ERF: LOOP(erf_f32(v))
  case MLP_SQUARE: LOOP(v * v)
  case MLP_RECIPROCAL: LOOP(1.0f / v)
  case MLP_GELU: LOOP(gelu_f32(v))
  case MLP_GELU_TANH: LOOP(0.5f * v * (1.0f + tanh_f32(SQRT_2_OVER_PI * (v + 0.044715f * v * v * v))))
  case MLP_POW:
    if (a == 2.0f) {
      LOOP(v * v)
    } else if (a == 1.0f) {
      LOOP(v)
    } else if (a == 0.5f) { /* pow(-0, 0.5) = +0, pow(-inf, 0.5) = inf */
      for (int64_t i = 0; i < n; i++)
        y[i] = x[i] == -INFINITY ? INFINITY : sqrtf(x[i]) + 0.0f;
      break;
    }
    for (int64_t i = 0; i < n; i++)
      y[i] = powf(x[i], a);
    break;
  case MLP_CLAMP: LOOP((v < a ? a : v) > b ? b : (v < a ? a : v)) /* NaN stays NaN */
  default: LOOP(v)
  }
#undef LOOP
}

/* Exact i32 versions of the integer-valued unary ops (wrapping like int32). */
static void unary_i32(int op, const int32_t *restrict x, int32_t *restrict y, int64_t n, double a, double b) {
  switch (op) {
  case MLP_NEG: SIMD for (int64_t i = 0; i < n; i++) y[i] = (int32_t)(0u - (uint32_t)x[i]); break;
  case MLP_ABS: SIMD for (int64_t i = 0; i < n; i++) y[i] = x[i] < 0 ? (int32_t)(0u - (uint32_t)x[i]) : x[i]; break;
  case MLP_RELU: SIMD for (int64_t i = 0; i < n; i++) y[i] = x[i] < 0 ? 0 : x[i]; break;
  case MLP_SQUARE: SIMD for (int64_t i = 0; i < n; i++) y[i] = (int32_t)(uint32_t)((uint64_t)((int64_t)x[i] * x[i])); break;
  case MLP_CLAMP:
    for (int64_t i = 0; i < n; i++) {
      double v = x[i];
      v = v < a ? a : v;
      v = v > b ? b : v;
      y[i] = sat_i32(v);
    }
    break;
  case MLP_COPY: memcpy(y, x, sizeof(int32_t) * (size_t)n); break;
  default: { /* not integer-valued (tgen does not emit these on i32) */
    float xf[BLK], yf[BLK];
    for (int64_t i0 = 0; i0 < n; i0 += BLK) {
      int64_t m = min64(BLK, n - i0);
      for (int64_t i = 0; i < m; i++)
        xf[i] = (float)x[i0 + i];
      unary_f32(op, xf, yf, m, (float)a, (float)b);
      for (int64_t i = 0; i < m; i++)
        y[i0 + i] = sat_i32(yf[i]);
    }
  }
  }
}

void mlp_cpu_unary(int op, int dt, const void *x, void *y, int64_t n, double a, double b) {
  if (n <= 0)
    return;
  size_t es = esize(dt);
  int64_t nb = (n + 4095) / 4096;
  if (op == MLP_COPY || dt == MLP_BOOL) {
    if (x != y)
      memcpy(y, x, es * (size_t)n);
    return;
  }
  OMP(parallel for schedule(static) if (n >= PAR_MIN))
  for (int64_t c = 0; c < nb; c++) {
    int64_t lo = c * 4096, m = min64(4096, n - lo);
    if (dt == MLP_F32) {
      unary_f32(op, (const float *)x + lo, (float *)y + lo, m, (float)a, (float)b);
    } else if (dt == MLP_I32) {
      unary_i32(op, (const int32_t *)x + lo, (int32_t *)y + lo, m, a, b);
    } else {
      float xf[BLK], yf[BLK];
      for (int64_t i0 = lo; i0 < lo + m; i0 += BLK) {
        int64_t k = min64(BLK, lo + m - i0);
        to_f32(dt, (const char *)x + i0 * 2, xf, k);
        unary_f32(op, xf, yf, k, (float)a, (float)b);
        from_f32(dt, yf, (char *)y + i0 * 2, k);
      }
    }
  }
}

/* ---------------------------------------------------------------- cast */

void mlp_cpu_cast(int dt_in, int dt_out, const void *x, void *y, int64_t n) {
  if (n <= 0)
    return;
  if (dt_in == dt_out) {
    if (x != y)
      memcpy(y, x, esize(dt_in) * (size_t)n);
    return;
  }
  int64_t nb = (n + 4095) / 4096;
  OMP(parallel for schedule(static) if (n >= PAR_MIN))
  for (int64_t c = 0; c < nb; c++) {
    int64_t lo = c * 4096, m = min64(4096, n - lo);
    const char *xs = (const char *)x + lo * (int64_t)esize(dt_in);
    char *ys = (char *)y + lo * (int64_t)esize(dt_out);
    int fin = dt_in == MLP_F32 || is_half(dt_in), fout = dt_out == MLP_F32 || is_half(dt_out);
    if (fin && fout) { /* through f32: the fast, common casts */
      float buf[BLK];
      for (int64_t i0 = 0; i0 < m; i0 += BLK) {
        int64_t k = min64(BLK, m - i0);
        const char *xp = xs + i0 * (int64_t)esize(dt_in);
        char *yp = ys + i0 * (int64_t)esize(dt_out);
        if (dt_in == MLP_F32) {
          from_f32(dt_out, (const float *)xp, yp, k);
        } else if (dt_out == MLP_F32) {
          to_f32(dt_in, xp, (float *)yp, k);
        } else {
          to_f32(dt_in, xp, buf, k);
          from_f32(dt_out, buf, yp, k);
        }
      }
    } else {
      for (int64_t i = 0; i < m; i++)
        stval(dt_out, ys, i, ldd(dt_in, xs, i));
    }
  }
}

/* ---------------------------------------------------------------- binary */

/* One run of y = a op b: a and b advance by sa, sb (0 or 1) per element. The
 * compares write uint8 to yb; everything else writes y. */
#define BIN_LOOPS(T, Y, EXPR)                                                                                          \
  if (sa && sb) {                                                                                                      \
    SIMD for (int64_t i = 0; i < n; i++) {                                                                             \
      const T u = a[i], v = b[i];                                                                                      \
      Y[i] = (EXPR);                                                                                                   \
    }                                                                                                                  \
  } else if (sa) {                                                                                                     \
    const T v = b[0];                                                                                                  \
    SIMD for (int64_t i = 0; i < n; i++) {                                                                             \
      const T u = a[i];                                                                                                \
      Y[i] = (EXPR);                                                                                                   \
    }                                                                                                                  \
  } else if (sb) {                                                                                                     \
    const T u = a[0];                                                                                                  \
    SIMD for (int64_t i = 0; i < n; i++) {                                                                             \
      const T v = b[i];                                                                                                \
      Y[i] = (EXPR);                                                                                                   \
    }                                                                                                                  \
  } else {                                                                                                             \
    const T u = a[0], v = b[0];                                                                                        \
    for (int64_t i = 0; i < n; i++)                                                                                    \
      Y[i] = (EXPR);                                                                                                   \
  }                                                                                                                    \
  break;

CLONES static void bin_f32(int op, const float *restrict a, int64_t sa, const float *restrict b, int64_t sb,
                    float *restrict y, uint8_t *restrict yb, int64_t n) {
  switch (op) {
  case MLP_ADD: BIN_LOOPS(float, y, u + v)
  case MLP_SUB: BIN_LOOPS(float, y, u - v)
  case MLP_MUL: BIN_LOOPS(float, y, u * v)
  case MLP_DIV: BIN_LOOPS(float, y, u / v)
  case MLP_MAX: BIN_LOOPS(float, y, (u != u || v != v) ? u + v : u > v ? u : v)
  case MLP_MIN: BIN_LOOPS(float, y, (u != u || v != v) ? u + v : u < v ? u : v)
  case MLP_GT: BIN_LOOPS(float, yb, u > v)
  case MLP_GE: BIN_LOOPS(float, yb, u >= v)
  case MLP_LT: BIN_LOOPS(float, yb, u < v)
  case MLP_LE: BIN_LOOPS(float, yb, u <= v)
  case MLP_EQ: BIN_LOOPS(float, yb, u == v)
  default: BIN_LOOPS(float, yb, u != v)
  }
}

/* Exact: int64 intermediates, wrapped to 32 bits on store. */
static void bin_i32(int op, const int32_t *restrict a, int64_t sa, const int32_t *restrict b, int64_t sb,
                    int32_t *restrict y, uint8_t *restrict yb, int64_t n) {
  switch (op) {
  case MLP_ADD: BIN_LOOPS(int64_t, y, (int32_t)(uint32_t)(uint64_t)(u + v))
  case MLP_SUB: BIN_LOOPS(int64_t, y, (int32_t)(uint32_t)(uint64_t)(u - v))
  case MLP_MUL: BIN_LOOPS(int64_t, y, (int32_t)(uint32_t)(uint64_t)(u * v))
  case MLP_DIV: BIN_LOOPS(int64_t, y, sat_i32((double)u / (double)v)) /* not emitted for i32 */
  case MLP_MAX: BIN_LOOPS(int64_t, y, (int32_t)(u > v ? u : v))
  case MLP_MIN: BIN_LOOPS(int64_t, y, (int32_t)(u < v ? u : v))
  case MLP_GT: BIN_LOOPS(int64_t, yb, u > v)
  case MLP_GE: BIN_LOOPS(int64_t, yb, u >= v)
  case MLP_LT: BIN_LOOPS(int64_t, yb, u < v)
  case MLP_LE: BIN_LOOPS(int64_t, yb, u <= v)
  case MLP_EQ: BIN_LOOPS(int64_t, yb, u == v)
  default: BIN_LOOPS(int64_t, yb, u != v)
  }
}

static int is_compare(int op) { return op >= MLP_GT; }

typedef struct BinCtx {
  int op, dt;
  const void *a, *b;
  void *y;
  int64_t sa, sb; /* innermost strides */
} BinCtx;

static void bin_run(void *vc, int chunk, const int64_t *off, int64_t i, int64_t n) {
  const BinCtx *c = vc;
  int cmp = is_compare(c->op);
  (void)chunk;
  if (c->dt == MLP_F32) {
    const float *a = (const float *)c->a + off[0], *b = (const float *)c->b + off[1];
    bin_f32(c->op, a, c->sa, b, c->sb, cmp ? NULL : (float *)c->y + i, cmp ? (uint8_t *)c->y + i : NULL, n);
  } else if (c->dt == MLP_I32) {
    const int32_t *a = (const int32_t *)c->a + off[0], *b = (const int32_t *)c->b + off[1];
    bin_i32(c->op, a, c->sa, b, c->sb, cmp ? NULL : (int32_t *)c->y + i, cmp ? (uint8_t *)c->y + i : NULL, n);
  } else if (is_half(c->dt)) {
    float af[BLK], bf[BLK], yf[BLK];
    for (int64_t i0 = 0; i0 < n; i0 += BLK) {
      int64_t k = min64(BLK, n - i0);
      to_f32(c->dt, (const uint16_t *)c->a + off[0] + i0 * c->sa, af, c->sa ? k : 1);
      to_f32(c->dt, (const uint16_t *)c->b + off[1] + i0 * c->sb, bf, c->sb ? k : 1);
      if (cmp) {
        bin_f32(c->op, af, c->sa, bf, c->sb, NULL, (uint8_t *)c->y + i + i0, k);
      } else {
        bin_f32(c->op, af, c->sa, bf, c->sb, yf, NULL, k);
        from_f32(c->dt, yf, (uint16_t *)c->y + i + i0, k);
      }
    }
  } else { /* bool: not emitted; through double */
    for (int64_t j = 0; j < n; j++) {
      float u = ldf(c->dt, c->a, off[0] + j * c->sa), v = ldf(c->dt, c->b, off[1] + j * c->sb), r;
      bin_f32(c->op, &u, 0, &v, 0, &r, (uint8_t *)c->y + i + j, 1);
      if (!cmp)
        ((uint8_t *)c->y)[i + j] = r != 0;
    }
  }
}

void mlp_cpu_binary(int op, int dt, const void *a, int ra, const int64_t *sa, const void *b, int rb,
                    const int64_t *sb, void *y, int ry, const int64_t *sy) {
  Bc bc;
  const int r[2] = {ra, rb};
  const int64_t *s[2] = {sa, sb};
  bc_init(&bc, ry, sy, 2, r, s);
  BinCtx c = {op, dt, a, b, y, bc.st[0][bc.rank - 1], bc.st[1][bc.rank - 1]};
  bc_run(&bc, bin_run, &c, 0);
}

/* ---------------------------------------------------------------- where, broadcast */

typedef struct SelCtx {
  size_t es;
  const uint8_t *c;
  const void *a, *b;
  void *y;
  int64_t sc, sa, sb;
} SelCtx;

#define SEL_LOOP(T)                                                                                                    \
  do {                                                                                                                 \
    const T *restrict a = (const T *)x->a + off[1], *restrict b = (const T *)x->b + off[2];                           \
    T *restrict y = (T *)x->y + i;                                                                                     \
    SIMD for (int64_t j = 0; j < n; j++) y[j] = c[j * x->sc] ? a[j * x->sa] : b[j * x->sb];                            \
  } while (0)

/* y = c ? a : b moves bits, so one loop per element size serves every dtype. */
static void sel_run(void *vc, int chunk, const int64_t *off, int64_t i, int64_t n) {
  const SelCtx *x = vc;
  const uint8_t *restrict c = x->c + off[0];
  (void)chunk;
  if (x->es == 4)
    SEL_LOOP(uint32_t);
  else if (x->es == 2)
    SEL_LOOP(uint16_t);
  else
    SEL_LOOP(uint8_t);
}

void mlp_cpu_where(int dt, const uint8_t *c, int rc, const int64_t *sc, const void *a, int ra, const int64_t *sa,
                   const void *b, int rb, const int64_t *sb, void *y, int ry, const int64_t *sy) {
  Bc bc;
  const int r[3] = {rc, ra, rb};
  const int64_t *s[3] = {sc, sa, sb};
  bc_init(&bc, ry, sy, 3, r, s);
  int l = bc.rank - 1;
  SelCtx x = {esize(dt), c, a, b, y, bc.st[0][l], bc.st[1][l], bc.st[2][l]};
  bc_run(&bc, sel_run, &x, 0);
}

typedef struct CopyCtx {
  size_t es;
  const void *x;
  void *y;
  int64_t sx;
} CopyCtx;

/* A run of y from x: contiguous (memcpy) or one repeated element. */
static void copy_run(void *vc, int chunk, const int64_t *off, int64_t i, int64_t n) {
  const CopyCtx *c = vc;
  const char *x = (const char *)c->x + off[0] * (int64_t)c->es;
  char *y = (char *)c->y + i * (int64_t)c->es;
  (void)chunk;
  if (c->sx) {
    memcpy(y, x, c->es * (size_t)n);
  } else if (c->es == 4) {
    uint32_t v;
    memcpy(&v, x, 4);
    SIMD for (int64_t j = 0; j < n; j++) ((uint32_t *)(void *)y)[j] = v;
  } else if (c->es == 2) {
    uint16_t v;
    memcpy(&v, x, 2);
    SIMD for (int64_t j = 0; j < n; j++) ((uint16_t *)(void *)y)[j] = v;
  } else {
    memset(y, *x, (size_t)n);
  }
}

void mlp_cpu_broadcast(int dt, const void *x, int rx, const int64_t *sx, void *y, int ry, const int64_t *sy) {
  Bc bc;
  bc_init(&bc, ry, sy, 1, &rx, &sx);
  CopyCtx c = {esize(dt), x, y, bc.st[0][bc.rank - 1]};
  bc_run(&bc, copy_run, &c, 0);
}

void mlp_cpu_fill(int dt, void *y, int64_t n, double v) {
  uint32_t bits = 0;
  switch (dt) {
  case MLP_BF16: bits = mlp_st_bf16((float)v); break;
  case MLP_F16: bits = mlp_st_f16((float)v); break;
  case MLP_I32: bits = (uint32_t)sat_i32(v); break;
  case MLP_BOOL: bits = v != 0; break;
  default: bits = mlp_f_bits((float)v); break;
  }
  size_t es = esize(dt);
  unsigned char one[4];
  if (es == 4) {
    memcpy(one, &bits, 4);
  } else if (es == 2) {
    uint16_t h = (uint16_t)bits;
    memcpy(one, &h, 2);
  } else {
    one[0] = (unsigned char)bits;
  }
  int64_t s1 = 1;
  Bc bc;
  bc_init(&bc, 1, &n, 1, (const int[]){1}, (const int64_t *const[]){&s1});
  CopyCtx c = {es, one, y, 0};
  bc_run(&bc, copy_run, &c, 0);
}

void mlp_cpu_arange(int32_t *y, int64_t n) {
  OMP(parallel for schedule(static) if (n >= PAR_MIN))
  for (int64_t i = 0; i < n; i++)
    y[i] = (int32_t)i;
}

/* ---------------------------------------------------------------- dropout */

/* Word 0 of Philox4x32-10 (the bits of mlp_philox4x32, mlp_init.c), inline so
 * that a loop over counters vectorises (the 32 x 32 -> 64 multiplies map to
 * vpmuludq). The key bump after the last round is unused, as there. */
HOT uint32_t philox_w0(uint32_t x0, uint32_t x1, uint32_t x2, uint32_t x3, uint32_t k0, uint32_t k1) {
  UNROLL
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * x0, p1 = (uint64_t)0xCD9E8D57u * x2;
    x0 = (uint32_t)(p1 >> 32) ^ x1 ^ k0;
    x2 = (uint32_t)(p0 >> 32) ^ x3 ^ k1;
    x1 = (uint32_t)p1;
    x3 = (uint32_t)p0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return x0;
}

/* Elements [lo, hi) of dropout: kept iff 2 (r >> 8) + 1 >= t (see below). */
CLONES static void dropout_run(int dt, const void *x, void *y, int64_t lo, int64_t hi, uint32_t t, float s,
                               uint32_t k0, uint32_t k1, uint32_t s0, uint32_t s1) {
#define M_(LD, ST)                                                                                                     \
  SIMD for (int64_t j = lo; j < hi; j++) {                                                                             \
    uint32_t r = philox_w0((uint32_t)j, (uint32_t)((uint64_t)j >> 32), s0, s1, k0, k1);                                \
    ST(y, j, mlp_sel(mlp_mask(((r >> 8) << 1 | 1u) >= t), LD(x, j) * s, 0.0f));                                        \
  }
  DT_CASES(dt, M_)
#undef M_
}

/* Training-mode dropout, the mask of gen/interp.c's eval_dropout: element j
 * is kept iff u >= p with u = ((r >> 8) + 0.5) 2^-24, r = word 0 of
 * philox4x32(ctr = {j lo, j hi, step lo, step hi}, key = {seed lo, seed hi ^
 * ordinal}). u >= p is decided exactly in integers: 2 (r >> 8) + 1 >= p 2^25,
 * i.e. >= t = ceil(p 2^25). Kept values are x (in f32) times (float)(1 / (1 -
 * p)), rounded once to dt; dropped ones are +0 (whatever x is). p >= 1 (or
 * NaN) drops everything. x and y may be the same buffer. */
void mlp_cpu_dropout(int dt, const void *x, void *y, int64_t n, double p, uint64_t seed, uint32_t ordinal,
                     uint64_t step) {
  if (n <= 0)
    return;
  if (!(p < 1)) {
    memset(y, 0, esize(dt) * (size_t)n);
    return;
  }
  uint32_t t = p > 0 ? (uint32_t)ceil(p * 33554432.0) : 0;
  float s = (float)(1.0 / (1.0 - p));
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32) ^ ordinal, s0 = (uint32_t)step, s1 = (uint32_t)(step >> 32);
  int64_t nb = (n + 4095) / 4096;
  OMP(parallel for schedule(static) if (n >= PAR_MIN / 8))
  for (int64_t b = 0; b < nb; b++)
    dropout_run(dt, x, y, b * 4096, min64(n, (b + 1) * 4096), t, s, k0, k1, s0, s1);
}

/* ---------------------------------------------------------------- mse_loss */

typedef struct MseCtx {
  int dt;
  const void *a, *b;
  int64_t sa, sb;
  double part[NCHUNK];
} MseCtx;

static void mse_run(void *vc, int chunk, const int64_t *off, int64_t i, int64_t n) {
  MseCtx *c = vc;
  double s = 0;
  int64_t sa = c->sa, sb = c->sb;
  (void)i;
#define M_(LD, ST)                                                                                                     \
  {                                                                                                                    \
    const void *a = (const char *)c->a + off[0] * (int64_t)esize(c->dt);                                               \
    const void *b = (const char *)c->b + off[1] * (int64_t)esize(c->dt);                                               \
    SIMD_SUM(s) for (int64_t j = 0; j < n; j++) {                                                                      \
      float d = LD(a, j * sa) - LD(b, j * sb);                                                                         \
      s += (double)(d * d);                                                                                            \
    }                                                                                                                  \
  }
  DT_CASES(c->dt, M_)
#undef M_
  c->part[chunk] += s;
}

void mlp_cpu_mse_loss(int dt, const void *a, int ra, const int64_t *sa, const void *b, int rb, const int64_t *sb,
                      void *y) {
  int64_t sy[MLP_MAXRANK];
  int ry = ra > rb ? ra : rb;
  for (int k = 0; k < ry; k++) {
    int ka = k - (ry - ra), kb = k - (ry - rb);
    int64_t da = ka >= 0 ? sa[ka] : 1, db = kb >= 0 ? sb[kb] : 1;
    sy[k] = da == 1 ? db : da;
  }
  Bc bc;
  const int r[2] = {ra, rb};
  const int64_t *s[2] = {sa, sb};
  bc_init(&bc, ry, sy, 2, r, s);
  MseCtx *c = malloc(sizeof *c);
  double total = 0;
  if (c) {
    memset(c, 0, sizeof *c);
    c->dt = dt;
    c->a = a;
    c->b = b;
    c->sa = bc.st[0][bc.rank - 1];
    c->sb = bc.st[1][bc.rank - 1];
    bc_run(&bc, mse_run, c, NCHUNK);
    for (int k = 0; k < NCHUNK; k++)
      total += c->part[k];
    free(c);
  } else { /* serial, element by element */
    int64_t idx[MLP_MAXRANK], off[4];
    bc_seek(&bc, 0, idx, off);
    for (int64_t i = 0; i < bc.n; i++) {
      double d = (double)(ldf(dt, a, off[0]) - ldf(dt, b, off[1]));
      total += d * d;
      bc_step(&bc, idx, off, 1);
    }
  }
  stval(dt, y, 0, bc.n ? total / (double)bc.n : NAN);
}

/* ---------------------------------------------------------------- reductions */

/* Runs: statistics of n contiguous elements (double accumulators). */
enum { P_SUM, P_MAX, P_SQDEV, P_EXP };

/* The NaN-propagating max of n contiguous elements (-inf for none): with gcc
 * and OpenMP an OpenMP max reduction plus a NaN flag (vectorised at every -O
 * level), else 16 independent lanes (what clang vectorises). */
CLONES static float run_max(int dt, const void *x, int64_t n) {
#if defined(_OPENMP) && !defined(__clang__)
  float m = -INFINITY;
  int nan = 0;
#define M_(LD, ST)                                                                                                     \
  PRAGMA_(omp simd reduction(max : m) reduction(| : nan))                                                              \
  for (int64_t i = 0; i < n; i++) {                                                                                    \
    const float v = LD(x, i);                                                                                          \
    m = v > m ? v : m;                                                                                                 \
    nan |= v != v;                                                                                                     \
  }
  DT_CASES(dt, M_)
#undef M_
  return nan ? NAN : m;
#else
  float lane[16], m = -INFINITY;
  int64_t i = 0;
  for (int l = 0; l < 16; l++)
    lane[l] = -INFINITY;
#define M_(LD, ST)                                                                                                     \
  for (; i + 16 <= n; i += 16)                                                                                         \
    for (int l = 0; l < 16; l++)                                                                                       \
      lane[l] = max_nan(lane[l], LD(x, i + l));                                                                        \
  for (; i < n; i++)                                                                                                   \
    lane[0] = max_nan(lane[0], LD(x, i));
  DT_CASES(dt, M_)
#undef M_
  for (int l = 0; l < 16; l++)
    m = max_nan(m, lane[l]);
  return m;
#endif
}

CLONES static double run_pass(int pass, int dt, const void *x, int64_t n, double c) {
  double s = 0;
  float cf = (float)c;
#define M_(LD, ST)                                                                                                     \
  switch (pass) {                                                                                                      \
  case P_SUM: SIMD_SUM(s) for (int64_t i = 0; i < n; i++) s += (double)LD(x, i); break;                                \
  case P_MAX: s = run_max(dt, x, n); break;                                                                            \
  case P_SQDEV:                                                                                                        \
    SIMD_SUM(s) for (int64_t i = 0; i < n; i++) {                                                                      \
      double d = (double)LD(x, i) - c;                                                                                 \
      s += d * d;                                                                                                      \
    }                                                                                                                  \
    break;                                                                                                             \
  default: SIMD_SUM(s) for (int64_t i = 0; i < n; i++) s += (double)exp_f32(LD(x, i) - cf); break;                     \
  }
  DT_CASES(dt, M_)
#undef M_
  return s;
}

/* Columns: acc[j] accumulates element j of n contiguous ones (a row of a
 * reduction along an outer dim); mx is the per-column max or shift. */
CLONES static void col_pass(int pass, int dt, const void *x, int64_t n, double *restrict acc, float *restrict mx,
                     const double *restrict c) {
#define M_(LD, ST)                                                                                                     \
  switch (pass) {                                                                                                      \
  case P_SUM: SIMD for (int64_t j = 0; j < n; j++) acc[j] += (double)LD(x, j); break;                                  \
  case P_MAX: SIMD for (int64_t j = 0; j < n; j++) mx[j] = max_nan(mx[j], LD(x, j)); break;                            \
  case P_SQDEV:                                                                                                        \
    SIMD for (int64_t j = 0; j < n; j++) {                                                                             \
      double d = (double)LD(x, j) - c[j];                                                                              \
      acc[j] += d * d;                                                                                                 \
    }                                                                                                                  \
    break;                                                                                                             \
  default: SIMD for (int64_t j = 0; j < n; j++) acc[j] += (double)exp_f32(LD(x, j) - mx[j]); break;                    \
  }
  DT_CASES(dt, M_)
#undef M_
}

/* A tensor's dims split into kept (output) and reduced ones: size-1 dims
 * dropped, neighbours of the same kind merged (the tensor is contiguous, so
 * that is always valid), strides in elements. */
typedef struct Rd {
  int nk, nr;
  int64_t ks[MLP_MAXRANK], kst[MLP_MAXRANK], rs[MLP_MAXRANK], rst[MLP_MAXRANK];
  int inner_red; /* the innermost dim is a reduced one (else a kept one, or none) */
  int64_t nout, len;
} Rd;

static void rd_init(Rd *d, int rank, const int64_t *shape, uint32_t axes) {
  int64_t sz[MLP_MAXRANK], st[MLP_MAXRANK];
  int kind[MLP_MAXRANK], m = 0;
  d->nout = d->len = 1;
  for (int k = 0; k < rank; k++) {
    int red = (int)((axes >> k) & 1u);
    if (red)
      d->len *= shape[k];
    else
      d->nout *= shape[k];
    if (shape[k] == 1)
      continue;
    if (m > 0 && kind[m - 1] == red) {
      sz[m - 1] *= shape[k];
    } else {
      sz[m] = shape[k];
      kind[m++] = red;
    }
  }
  int64_t s = 1;
  for (int k = m - 1; k >= 0; k--) {
    st[k] = s;
    s *= sz[k];
  }
  d->nk = d->nr = 0;
  for (int k = 0; k < m; k++) {
    if (kind[k]) {
      d->rs[d->nr] = sz[k];
      d->rst[d->nr++] = st[k];
    } else {
      d->ks[d->nk] = sz[k];
      d->kst[d->nk++] = st[k];
    }
  }
  d->inner_red = m > 0 && kind[m - 1];
  if (m == 0) { /* one element: a kept dim of size 1 */
    d->ks[0] = d->kst[0] = 1;
    d->nk = 1;
  }
}

/* Offset of index i over n dims of sizes sz, strides st. */
static int64_t dims_off(int n, const int64_t *sz, const int64_t *st, int64_t i) {
  int64_t off = 0;
  for (int k = n - 1; k >= 0; k--) {
    off += (i % sz[k]) * st[k];
    i /= sz[k];
  }
  return off;
}

/* Odometer step over n dims; returns the new offset. */
static int64_t dims_next(int n, const int64_t *sz, const int64_t *st, int64_t *idx, int64_t off) {
  for (int k = n - 1; k >= 0; k--) {
    idx[k]++;
    off += st[k];
    if (idx[k] < sz[k])
      return off;
    off -= st[k] * sz[k];
    idx[k] = 0;
  }
  return off;
}

/* A pass over elements [lo, hi) of one output's reduced set, when the
 * innermost dim is reduced: runs of L contiguous elements at the offsets of
 * the outer reduced dims. */
static double red_range(const Rd *d, int pass, int dt, const void *x, int64_t base, int64_t lo, int64_t hi, double c) {
  int64_t L = d->rs[d->nr - 1], idx[MLP_MAXRANK], q = lo / L, pos = lo % L;
  int no = d->nr - 1;
  double acc = pass == P_MAX ? -INFINITY : 0;
  for (int k = no - 1; k >= 0; k--) {
    idx[k] = q % d->rs[k];
    q /= d->rs[k];
  }
  int64_t roff = dims_off(no, d->rs, d->rst, lo / L);
  size_t es = esize(dt);
  for (int64_t i = lo; i < hi;) {
    int64_t n = min64(L - pos, hi - i);
    double v = run_pass(pass, dt, (const char *)x + (base + roff + pos) * (int64_t)es, n, c);
    acc = pass == P_MAX ? max_nan_d(acc, v) : acc + v;
    i += n;
    pos = 0;
    roff = dims_next(no, d->rs, d->rst, idx, roff);
  }
  return acc;
}

/* The statistic of one output from its passes. */
static double red_final(int op, double s, double s2, double shift, double len, double correction) {
  switch (op) {
  case MLP_SUM: return s;
  case MLP_AMAX: return s;
  case MLP_MEAN: return len > 0 ? s / len : NAN;
  case MLP_VAR: {
    double div = len - correction;
    return div > 0 ? s2 / div : s2 > 0 ? INFINITY : NAN;
  }
  default: return log(s2) + shift;
  }
}

/* Case A (innermost dim reduced): one output at a time, or, for few outputs,
 * each output's reduction split into NCHUNK parallel pieces. */
static void reduce_inner(int op, int dt, const void *x, const Rd *d, void *y, double corr) {
  int split = d->nout < 2 * nthreads() && d->len >= PAR_MIN;
  int first = op == MLP_AMAX || op == MLP_LOGSUMEXP ? P_MAX : P_SUM;
  int second = op == MLP_VAR ? P_SQDEV : op == MLP_LOGSUMEXP ? P_EXP : -1;
  double len = (double)d->len;
  if (split) {
    for (int64_t o = 0; o < d->nout; o++) {
      int64_t base = dims_off(d->nk, d->ks, d->kst, o);
      double part[NCHUNK], s = first == P_MAX ? -INFINITY : 0, s2 = 0, c = 0;
      for (int pass = 0; pass < 2; pass++) {
        int p = pass ? second : first;
        if (p < 0)
          break;
        if (pass)
          c = op == MLP_VAR ? s / len : (isinf(s) ? 0 : s);
        OMP(parallel for schedule(static))
        for (int k = 0; k < NCHUNK; k++)
          part[k] = red_range(d, p, dt, x, base, d->len * k / NCHUNK, d->len * (k + 1) / NCHUNK, c);
        for (int k = 0; k < NCHUNK; k++) {
          if (!pass)
            s = p == P_MAX ? max_nan_d(s, part[k]) : s + part[k];
          else
            s2 += part[k];
        }
      }
      stval(dt, y, o, red_final(op, s, s2, c, len, corr));
    }
    return;
  }
  OMP(parallel for schedule(static) if (d->nout * d->len >= PAR_MIN && d->nout > 1))
  for (int64_t o = 0; o < d->nout; o++) {
    int64_t base = dims_off(d->nk, d->ks, d->kst, o);
    double s = red_range(d, first, dt, x, base, 0, d->len, 0), s2 = 0, c = 0;
    if (second >= 0) {
      c = op == MLP_VAR ? s / len : (isinf(s) ? 0 : s);
      s2 = red_range(d, second, dt, x, base, 0, d->len, c);
    }
    stval(dt, y, o, red_final(op, s, s2, c, len, corr));
  }
}

/* Case B (innermost dim kept, W wide): tiles of up to CBLK outputs of one
 * output row, accumulated over every reduced index with vector loops. */
#define CBLK 1024
static void reduce_outer(int op, int dt, const void *x, const Rd *d, void *y, double corr) {
  int64_t W = d->ks[d->nk - 1], nrow = d->nout / W;
  /* tiles as wide as CBLK, or narrower (not below 64) when there are too few
   * to keep the threads busy */
  int64_t cw = nrow >= 2 * nthreads() ? CBLK : (W / (2 * nthreads()) + 15) / 16 * 16;
  cw = cw < 64 ? 64 : cw > CBLK ? CBLK : cw;
  int64_t ntile = (W + cw - 1) / cw;
  int nko = d->nk - 1;
  size_t es = esize(dt);
  double len = (double)d->len;
  OMP(parallel for schedule(static) if (d->nout * d->len >= PAR_MIN && nrow * ntile > 1))
  for (int64_t t = 0; t < nrow * ntile; t++) {
    int64_t row = t / ntile, j0 = (t % ntile) * cw, n = min64(cw, W - j0);
    int64_t base = dims_off(nko, d->ks, d->kst, row) + j0, idx[MLP_MAXRANK] = {0}, roff = 0;
    double acc[CBLK], acc2[CBLK], c[CBLK];
    float mx[CBLK];
    for (int64_t j = 0; j < n; j++) {
      acc[j] = acc2[j] = 0;
      mx[j] = -INFINITY;
    }
    int first = op == MLP_AMAX || op == MLP_LOGSUMEXP ? P_MAX : P_SUM;
    for (int64_t r = 0; r < d->len; r++) {
      col_pass(first, dt, (const char *)x + (base + roff) * (int64_t)es, n, acc, mx, NULL);
      roff = dims_next(d->nr, d->rs, d->rst, idx, roff);
    }
    if (op == MLP_VAR || op == MLP_LOGSUMEXP) {
      for (int64_t j = 0; j < n; j++) {
        c[j] = op == MLP_VAR ? acc[j] / len : isinf(mx[j]) ? 0 : mx[j];
        mx[j] = (float)c[j];
      }
      for (int64_t r = 0; r < d->len; r++) {
        col_pass(op == MLP_VAR ? P_SQDEV : P_EXP, dt, (const char *)x + (base + roff) * (int64_t)es, n, acc2, mx, c);
        roff = dims_next(d->nr, d->rs, d->rst, idx, roff);
      }
    }
    for (int64_t j = 0; j < n; j++) {
      double s = first == P_MAX ? (double)mx[j] : acc[j];
      if (op == MLP_LOGSUMEXP)
        s = c[j];
      stval(dt, y, row * W + j0 + j, red_final(op, s, acc2[j], c[j], len, corr));
    }
  }
}

/* i32 sum and amax, exact (int64), one output at a time. */
static void reduce_i32(int op, const int32_t *x, const Rd *d, int32_t *y) {
  OMP(parallel for schedule(static) if (d->nout * d->len >= PAR_MIN && d->nout > 1))
  for (int64_t o = 0; o < d->nout; o++) {
    int64_t idx[MLP_MAXRANK] = {0}, base = 0, roff = 0, s = op == MLP_AMAX ? INT64_MIN : 0;
    /* the output's offset: kept dims, innermost first */
    base = dims_off(d->nk, d->ks, d->kst, o);
    for (int64_t r = 0; r < d->len; r++) {
      int64_t v = x[base + roff];
      s = op == MLP_AMAX ? (v > s ? v : s) : s + v;
      roff = dims_next(d->nr, d->rs, d->rst, idx, roff);
    }
    y[o] = (int32_t)(uint32_t)(uint64_t)s;
  }
}

void mlp_cpu_reduce(int op, int dt, const void *x, int rank, const int64_t *shape, uint32_t axes, void *y,
                    double correction) {
  Rd d;
  rd_init(&d, rank, shape, axes);
  if (d.nout <= 0)
    return;
  if (dt == MLP_I32)
    reduce_i32(op, x, &d, y);
  else if (d.len == 0) /* empty reductions: sum 0, amax -inf, mean/var NaN, logsumexp -inf */
    for (int64_t o = 0; o < d.nout; o++)
      stval(dt, y, o, op == MLP_SUM ? 0 : op == MLP_AMAX || op == MLP_LOGSUMEXP ? -INFINITY : NAN);
  else if (d.inner_red)
    reduce_inner(op, dt, x, &d, y, correction);
  else
    reduce_outer(op, dt, x, &d, y, correction);
}

/* ---------------------------------------------------------------- softmax */

/* One contiguous row of n: shift by the max (NaN-propagating, as torch), sum
 * of exp in double, then y = e / s or (x - m) - log s. */
CLONES static void softmax_row(int logsm, int dt, const void *x, void *y, int64_t n) {
  float m = (float)run_pass(P_MAX, dt, x, n, 0);
  double s = 0;
  if (dt == MLP_F32 && !logsm) {
    const float *restrict xf = x;
    float *restrict yf = y;
    SIMD_SUM(s) for (int64_t i = 0; i < n; i++) {
      float e = exp_f32(xf[i] - m);
      yf[i] = e;
      s += (double)e;
    }
    float inv = (float)(1.0 / s);
    SIMD for (int64_t i = 0; i < n; i++) yf[i] *= inv;
    return;
  }
  s = run_pass(P_EXP, dt, x, n, m);
  float inv = (float)(1.0 / s), ls = (float)log(s);
#define M_(LD, ST)                                                                                                     \
  if (logsm) {                                                                                                         \
    SIMD for (int64_t i = 0; i < n; i++) ST(y, i, (LD(x, i) - m) - ls);                                                \
  } else {                                                                                                             \
    SIMD for (int64_t i = 0; i < n; i++) ST(y, i, exp_f32(LD(x, i) - m) * inv);                                        \
  }
  DT_CASES(dt, M_)
#undef M_
}

/* w columns (at most BLK) of a softmax along an outer dim: element r of
 * column j at x[r * inner + j]. */
CLONES static void softmax_cols(int logsm, int dt, const void *x, void *y, int64_t n, int64_t inner, int64_t w) {
  int64_t es = (int64_t)esize(dt);
  double acc[BLK];
  float mx[BLK], inv[BLK], ls[BLK];
  for (int64_t j = 0; j < w; j++) {
    acc[j] = 0;
    mx[j] = -INFINITY;
  }
  for (int64_t r = 0; r < n; r++)
    col_pass(P_MAX, dt, (const char *)x + r * inner * es, w, acc, mx, NULL);
  for (int64_t r = 0; r < n; r++)
    col_pass(P_EXP, dt, (const char *)x + r * inner * es, w, acc, mx, NULL);
  for (int64_t j = 0; j < w; j++) {
    inv[j] = (float)(1.0 / acc[j]);
    ls[j] = (float)log(acc[j]);
  }
  for (int64_t r = 0; r < n; r++) {
    const void *xr = (const char *)x + r * inner * es;
    void *yr = (char *)y + r * inner * es;
#define M_(LD, ST)                                                                                                     \
  if (logsm) {                                                                                                         \
    SIMD for (int64_t j = 0; j < w; j++) ST(yr, j, (LD(xr, j) - mx[j]) - ls[j]);                                       \
  } else {                                                                                                             \
    SIMD for (int64_t j = 0; j < w; j++) ST(yr, j, exp_f32(LD(xr, j) - mx[j]) * inv[j]);                               \
  }
    DT_CASES(dt, M_)
#undef M_
  }
}

void mlp_cpu_softmax(int logsm, int dt, const void *x, void *y, int64_t outer, int64_t n, int64_t inner) {
  size_t es = esize(dt);
  if (outer <= 0 || n <= 0 || inner <= 0)
    return;
  if (inner == 1) {
    OMP(parallel for schedule(static) if (outer * n >= PAR_MIN && outer > 1))
    for (int64_t o = 0; o < outer; o++)
      softmax_row(logsm, dt, (const char *)x + o * n * (int64_t)es, (char *)y + o * n * (int64_t)es, n);
    return;
  }
  /* along an outer dim: tiles of columns, vector loops across them */
  int64_t ntile = (inner + BLK - 1) / BLK;
  OMP(parallel for schedule(static) if (outer * n * inner >= PAR_MIN && outer * ntile > 1))
  for (int64_t t = 0; t < outer * ntile; t++) {
    int64_t o = t / ntile, j0 = (t % ntile) * BLK, base = (o * n * inner + j0) * (int64_t)es;
    softmax_cols(logsm, dt, (const char *)x + base, (char *)y + base, n, inner, min64(BLK, inner - j0));
  }
}

/* ---------------------------------------------------------------- norms */

/* One row: mean and (biased) variance in double, two passes; then
 * y = (x - mean) rstd w + b in f32. */
CLONES static void ln_row(int dt, const void *xr, const void *w, const void *b, void *yr, int64_t d, double eps) {
  double mean = run_pass(P_SUM, dt, xr, d, 0) / (double)d;
  double var = run_pass(P_SQDEV, dt, xr, d, mean) / (double)d;
  const float mf = (float)mean, rs = (float)(1.0 / sqrt(var + eps));
#define M_(LD, ST)                                                                                                     \
  if (w && b) {                                                                                                        \
    SIMD for (int64_t j = 0; j < d; j++) ST(yr, j, (LD(xr, j) - mf) * rs * LD(w, j) + LD(b, j));                       \
  } else if (w) {                                                                                                      \
    SIMD for (int64_t j = 0; j < d; j++) ST(yr, j, (LD(xr, j) - mf) * rs * LD(w, j));                                  \
  } else if (b) {                                                                                                      \
    SIMD for (int64_t j = 0; j < d; j++) ST(yr, j, (LD(xr, j) - mf) * rs + LD(b, j));                                  \
  } else {                                                                                                             \
    SIMD for (int64_t j = 0; j < d; j++) ST(yr, j, (LD(xr, j) - mf) * rs);                                             \
  }
  DT_CASES(dt, M_)
#undef M_
}

/* One row: y = x / sqrt(mean x^2 + eps) w. */
CLONES static void rms_row(int dt, const void *xr, const void *w, void *yr, int64_t d, double eps) {
  const float rs = (float)(1.0 / sqrt(run_pass(P_SQDEV, dt, xr, d, 0) / (double)d + eps));
#define M_(LD, ST)                                                                                                     \
  if (w) {                                                                                                             \
    SIMD for (int64_t j = 0; j < d; j++) ST(yr, j, LD(xr, j) * rs * LD(w, j));                                         \
  } else {                                                                                                             \
    SIMD for (int64_t j = 0; j < d; j++) ST(yr, j, LD(xr, j) * rs);                                                    \
  }
  DT_CASES(dt, M_)
#undef M_
}

void mlp_cpu_layer_norm(int dt, const void *x, const void *w, const void *b, void *y, int64_t rows, int64_t d,
                        double eps) {
  int64_t es = (int64_t)esize(dt);
  if (rows <= 0 || d <= 0)
    return;
  OMP(parallel for schedule(static) if (rows * d >= PAR_MIN && rows > 1))
  for (int64_t r = 0; r < rows; r++)
    ln_row(dt, (const char *)x + r * d * es, w, b, (char *)y + r * d * es, d, eps);
}

void mlp_cpu_rms_norm(int dt, const void *x, const void *w, void *y, int64_t rows, int64_t d, double eps) {
  int64_t es = (int64_t)esize(dt);
  if (rows <= 0 || d <= 0)
    return;
  OMP(parallel for schedule(static) if (rows * d >= PAR_MIN && rows > 1))
  for (int64_t r = 0; r < rows; r++)
    rms_row(dt, (const char *)x + r * d * es, w, (char *)y + r * d * es, d, eps);
}

/* ---------------------------------------------------------------- losses */

int64_t mlp_cpu_cross_entropy(int dt, const void *logits, const int32_t *target, int64_t N, int64_t C, int64_t ignore,
                              void *y) {
  for (int64_t i = 0; i < N; i++)
    if (target[i] != ignore && (target[i] < 0 || target[i] >= C))
      return i;
  size_t es = esize(dt);
  double part[NCHUNK], cnt[NCHUNK];
  OMP(parallel for schedule(static) if (N * C >= PAR_MIN))
  for (int k = 0; k < NCHUNK; k++) {
    double s = 0, c = 0;
    for (int64_t i = N * k / NCHUNK; i < N * (k + 1) / NCHUNK; i++) {
      if (target[i] == ignore)
        continue;
      const void *row = (const char *)logits + i * C * (int64_t)es;
      double m = run_pass(P_MAX, dt, row, C, 0);
      double se = run_pass(P_EXP, dt, row, C, m);
      s += log(se) + m - (double)ldf(dt, row, target[i]);
      c += 1;
    }
    part[k] = s;
    cnt[k] = c;
  }
  double s = 0, c = 0;
  for (int k = 0; k < NCHUNK; k++) {
    s += part[k];
    c += cnt[k];
  }
  stval(dt, y, 0, c > 0 ? s / c : NAN);
  return -1;
}

/* ---------------------------------------------------------------- data movement */

/* rows of `row` elements from src (rows `ss` apart) to dst (`ds` apart),
 * split across threads by rows, or within rows when there are few. */
static void copy_rows(size_t es, const void *src, int64_t ss, void *dst, int64_t ds, int64_t rows, int64_t row) {
  if (rows <= 0 || row <= 0)
    return;
  int64_t bytes = row * (int64_t)es, per = bytes > (1 << 16) && rows < 4 * nthreads() ? (bytes + 65535) / 65536 : 1;
  int64_t piece = (bytes + per - 1) / per;
  OMP(parallel for schedule(static) if (rows * row >= PAR_MIN))
  for (int64_t t = 0; t < rows * per; t++) {
    int64_t r = t / per, p = t % per, lo = p * piece, n = min64(piece, bytes - lo);
    if (n > 0)
      memcpy((char *)dst + r * ds * (int64_t)es + lo, (const char *)src + r * ss * (int64_t)es + lo, (size_t)n);
  }
}

void mlp_cpu_slice(int dt, const void *x, int64_t outer, int64_t n, int64_t inner, int64_t lo, int64_t hi, void *y) {
  size_t es = esize(dt);
  copy_rows(es, (const char *)x + lo * inner * (int64_t)es, n * inner, y, (hi - lo) * inner, outer, (hi - lo) * inner);
}

void mlp_cpu_copy_into(int dt, const void *x, int64_t outer, int64_t nx, int64_t inner, void *y, int64_t ny,
                       int64_t at) {
  size_t es = esize(dt);
  copy_rows(es, x, nx * inner, (char *)y + at * inner * (int64_t)es, ny * inner, outer, nx * inner);
}

/* 64 x 64 tiles of a transpose: y[a * ya + b] = x[a + b * xb] (a along the
 * dim that is contiguous in x, b along the one contiguous in y). */
#define TILE 64
#define TR_TILE(T)                                                                                                     \
  do {                                                                                                                 \
    const T *restrict xs = (const T *)x;                                                                               \
    T *restrict ys = (T *)y;                                                                                           \
    for (int64_t a = 0; a < na; a++)                                                                                   \
      for (int64_t b = 0; b < nb; b++)                                                                                 \
        ys[a * ya + b] = xs[a + b * xb];                                                                               \
  } while (0)

static void tr_tile(size_t es, const void *x, int64_t xb, void *y, int64_t ya, int64_t na, int64_t nb) {
  if (es == 4)
    TR_TILE(uint32_t);
  else if (es == 2)
    TR_TILE(uint16_t);
  else
    TR_TILE(uint8_t);
}

void mlp_cpu_permute(int dt, const void *x, int rank, const int64_t *shape, const int *perm, void *y) {
  size_t es = esize(dt);
  int64_t xst[MLP_MAXRANK], ysh[MLP_MAXRANK], sh[MLP_MAXRANK], st[MLP_MAXRANK], s = 1, n = 1;
  for (int k = rank - 1; k >= 0; k--) {
    xst[k] = s;
    s *= shape[k];
  }
  /* y's dims with x's strides; size-1 dims dropped, neighbours merged */
  int m = 0;
  for (int k = 0; k < rank; k++) {
    ysh[k] = shape[perm[k]];
    n *= ysh[k];
    if (ysh[k] == 1)
      continue;
    if (m > 0 && st[m - 1] == xst[perm[k]] * ysh[k]) {
      sh[m - 1] *= ysh[k];
      st[m - 1] = xst[perm[k]];
    } else {
      sh[m] = ysh[k];
      st[m++] = xst[perm[k]];
    }
  }
  if (n <= 0)
    return;
  if (m <= 1) { /* the same order: a copy */
    memcpy(y, x, es * (size_t)n);
    return;
  }
  /* y's innermost dim is contiguous in x: copy runs */
  if (st[m - 1] == 1) {
    Bc bc;
    bc.rank = m;
    bc.nop = 1;
    bc.n = n;
    for (int k = 0; k < m; k++) {
      bc.shape[k] = sh[k];
      bc.st[0][k] = st[k];
    }
    CopyCtx c = {es, x, y, 1};
    bc_run(&bc, copy_run, &c, 0);
    return;
  }
  /* else the dim j contiguous in x is some outer dim of y: tiles over (j, last) */
  int j = 0;
  while (j < m - 1 && st[j] != 1)
    j++;
  int64_t yst[MLP_MAXRANK], L = sh[m - 1], J = sh[j];
  s = 1;
  for (int k = m - 1; k >= 0; k--) {
    yst[k] = s;
    s *= sh[k];
  }
  /* the other dims, as one odometer */
  int64_t osh[MLP_MAXRANK], oxs[MLP_MAXRANK], oys[MLP_MAXRANK], nout = 1;
  int no = 0;
  for (int k = 0; k < m - 1; k++)
    if (k != j) {
      osh[no] = sh[k];
      oxs[no] = st[k];
      oys[no++] = yst[k];
      nout *= sh[k];
    }
  int64_t tj = (J + TILE - 1) / TILE, tl = (L + TILE - 1) / TILE;
  OMP(parallel for schedule(static) if (n >= PAR_MIN))
  for (int64_t t = 0; t < nout * tj * tl; t++) {
    int64_t o = t / (tj * tl), a0 = (t / tl) % tj * TILE, b0 = t % tl * TILE;
    int64_t xo = dims_off(no, osh, oxs, o), yo = dims_off(no, osh, oys, o);
    tr_tile(es, (const char *)x + (xo + a0 + b0 * st[m - 1]) * (int64_t)es, st[m - 1],
            (char *)y + (yo + a0 * yst[j] + b0) * (int64_t)es, yst[j], min64(TILE, J - a0), min64(TILE, L - b0));
  }
}

int64_t mlp_cpu_embedding(int dt, const int32_t *idx, int64_t n, const void *table, int64_t V, int64_t D, void *y) {
  for (int64_t i = 0; i < n; i++)
    if (idx[i] < 0 || idx[i] >= V)
      return i;
  size_t row = esize(dt) * (size_t)(D > 0 ? D : 0);
  OMP(parallel for schedule(static) if (n * D >= PAR_MIN))
  for (int64_t i = 0; i < n; i++)
    memcpy((char *)y + (size_t)i * row, (const char *)table + (size_t)idx[i] * row, row);
  return -1;
}

/* One row of embedding_backward: row = the sum over its m positions (pos[k],
 * increasing), in f32 from 0 and in that order, stored once in dt; BLK
 * columns at a time. pos NULL: the positions are those p < m with idx[p] == v
 * (the fallback without the sort's memory; the same sums). */
CLONES static void emb_bwd_row(int dt, const void *dy, int64_t D, const int64_t *pos, int64_t m, const int32_t *idx,
                               int64_t v, void *row) {
  size_t es = esize(dt);
  float acc[BLK];
  for (int64_t c0 = 0; c0 < D; c0 += BLK) {
    int64_t w = min64(BLK, D - c0);
    for (int64_t j = 0; j < w; j++)
      acc[j] = 0.0f;
    for (int64_t k = 0; k < m; k++) {
      int64_t p = pos ? pos[k] : k;
      if (!pos && idx[p] != v)
        continue;
      const void *src = (const char *)dy + (p * D + c0) * (int64_t)es;
#define M_(LD, ST)                                                                                                     \
  SIMD for (int64_t j = 0; j < w; j++) acc[j] += LD(src, j);
      DT_CASES(dt, M_)
#undef M_
    }
    void *dst = (char *)row + c0 * (int64_t)es;
#define M_(LD, ST)                                                                                                     \
  SIMD for (int64_t j = 0; j < w; j++) ST(dst, j, acc[j]);
    DT_CASES(dt, M_)
#undef M_
  }
}

/* out[v, :] = the sum of dy[p, :] over the positions p with idx[p] == v, in
 * increasing p (f32 from 0, stored once in dt); rows no index hits are zero.
 * The positions are grouped by row with a stable counting sort (c[v] .. c[v +
 * 1] are row v's, in order), then each row is summed by one thread: the
 * result does not depend on the thread count or the schedule. */
int64_t mlp_cpu_embedding_backward(int dt, const int32_t *idx, int64_t n, const void *dy, int64_t V, int64_t D,
                                   void *out) {
  for (int64_t p = 0; p < n; p++)
    if (idx[p] < 0 || idx[p] >= V)
      return p;
  if (V <= 0 || D <= 0)
    return -1;
  size_t es = esize(dt);
  int64_t *c = malloc(sizeof(int64_t) * (size_t)(V + 2 + n)), *pos = c ? c + V + 2 : NULL;
  if (c) {
    memset(c, 0, sizeof(int64_t) * (size_t)(V + 2));
    for (int64_t p = 0; p < n; p++)
      c[idx[p] + 2]++;
    for (int64_t v = 2; v < V + 2; v++)
      c[v] += c[v - 1];
    for (int64_t p = 0; p < n; p++) /* c[v + 1]: row v's next slot; afterwards the start of row v + 1 */
      pos[c[idx[p] + 1]++] = p;
  }
  OMP(parallel for schedule(dynamic, 16) if ((V + n) * D >= PAR_MIN))
  for (int64_t v = 0; v < V; v++) {
    void *row = (char *)out + v * D * (int64_t)es;
    if (c && c[v] == c[v + 1])
      memset(row, 0, es * (size_t)D);
    else if (c)
      emb_bwd_row(dt, dy, D, pos + c[v], c[v + 1] - c[v], NULL, v, row);
    else
      emb_bwd_row(dt, dy, D, NULL, n, idx, v, row);
  }
  free(c);
  return -1;
}

/* ---------------------------------------------------------------- GEMM */

/* The micro-kernel: c[MR][NR] = sum over k < kc of a[k][MR] (x) b[k][NR],
 * from packed panels. Plain C that compilers keep in registers and vectorise
 * once the i and j loops are unrolled; one copy per instruction set, chosen at
 * run time on x86 (gcc and clang), with FMA where the target has it. */
#define MUL_ADD(x, y, z) ((x) * (y) + (z))
#define UKERNEL_BODY(MR, NR, MADD)                                                                                     \
  float acc[MR][NR];                                                                                                   \
  UNROLL for (int i = 0; i < MR; i++) UNROLL for (int j = 0; j < NR; j++) acc[i][j] = 0.0f;                            \
  for (int64_t k = 0; k < kc; k++) {                                                                                   \
    const float *restrict ak = a + k * MR, *restrict bk = b + k * NR;                                                  \
    UNROLL for (int i = 0; i < MR; i++) {                                                                              \
      const float ai = ak[i];                                                                                          \
      UNROLL for (int j = 0; j < NR; j++) acc[i][j] = MADD(ai, bk[j], acc[i][j]);                                      \
    }                                                                                                                  \
  }                                                                                                                    \
  UNROLL for (int i = 0; i < MR; i++) UNROLL for (int j = 0; j < NR; j++) c[i * NR + j] = acc[i][j];

typedef void (*ukernel_fn)(int64_t kc, const float *restrict a, const float *restrict b, float *restrict c);
typedef struct Ukernel {
  int mr, nr;
  ukernel_fn fn;
  const char *name;
} Ukernel;
#define MAX_MR 8
#define MAX_NR 32

#ifdef __FMA__
#define GENERIC_MADD fmaf
#else
#define GENERIC_MADD MUL_ADD
#endif
static void ukernel_generic(int64_t kc, const float *restrict a, const float *restrict b, float *restrict c) {
  UKERNEL_BODY(4, 8, GENERIC_MADD)
}

#ifdef ISA_DISPATCH
__attribute__((target("avx2,fma"))) static void ukernel_avx2(int64_t kc, const float *restrict a,
                                                             const float *restrict b, float *restrict c) {
  UKERNEL_BODY(5, 16, fmaf)
}
__attribute__((target("avx512f,avx2,fma"))) static void ukernel_avx512(int64_t kc, const float *restrict a,
                                                                       const float *restrict b, float *restrict c) {
  UKERNEL_BODY(8, 32, fmaf)
}
#endif

/* Which micro-kernel: -1 the best this CPU runs, else 0 generic, 1 AVX2, 2
 * AVX-512 (tests force each one they can run). */
static int gemm_isa = -1;

static Ukernel pick_ukernel(void) {
  static const Ukernel generic = {4, 8, ukernel_generic, "generic"};
#ifdef ISA_DISPATCH
  static const Ukernel avx2 = {5, 16, ukernel_avx2, "avx2"}, avx512 = {8, 32, ukernel_avx512, "avx512"};
  /* (the CPU model is read by a constructor; kernels run after those) */
  int has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
  int has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if ((gemm_isa < 0 || gemm_isa == 2) && has512)
    return avx512;
  if ((gemm_isa < 0 || gemm_isa >= 1) && has2)
    return avx2;
#endif
  return generic;
}

/* Cache blocking: a kc x nc panel of B (L3), an mc x kc block of A (L2), a kc
 * x NR sliver of B (L1). */
#ifndef GEMM_KC
#define GEMM_KC 256
#endif
#ifndef GEMM_MC
#define GEMM_MC 192
#endif
#ifndef GEMM_NC
#define GEMM_NC 3072
#endif

/* dst[k][mr] = A(i0 + i, k0 + k), rows past mv zero. A(i, k) = A[i lda + k],
 * or A[k lda + i] when transposed. */
static void pack_a(int ta, const float *A, int64_t lda, int64_t i0, int64_t k0, int64_t mv, int64_t kc, int mr,
                   float *restrict dst) {
  if (!ta) {
    for (int64_t i = 0; i < mv; i++) {
      const float *src = A + (i0 + i) * lda + k0;
      for (int64_t k = 0; k < kc; k++)
        dst[k * mr + i] = src[k];
    }
  } else {
    for (int64_t k = 0; k < kc; k++)
      memcpy(dst + k * mr, A + (k0 + k) * lda + i0, sizeof(float) * (size_t)mv);
  }
  if (mv < mr)
    for (int64_t k = 0; k < kc; k++)
      for (int64_t i = mv; i < mr; i++)
        dst[k * mr + i] = 0;
}

/* dst[k][nr] = B(k0 + k, j0 + j), columns past nv zero. B(k, j) = B[k ldb +
 * j], or B[j ldb + k] when transposed. */
static void pack_b(int tb, const float *B, int64_t ldb, int64_t k0, int64_t j0, int64_t nv, int64_t kc, int nr,
                   float *restrict dst) {
  if (!tb) {
    for (int64_t k = 0; k < kc; k++)
      memcpy(dst + k * nr, B + (k0 + k) * ldb + j0, sizeof(float) * (size_t)nv);
  } else {
    for (int64_t j = 0; j < nv; j++) {
      const float *src = B + (j0 + j) * ldb + k0;
      for (int64_t k = 0; k < kc; k++)
        dst[k * nr + j] = src[k];
    }
  }
  if (nv < nr)
    for (int64_t k = 0; k < kc; k++)
      for (int64_t j = nv; j < nr; j++)
        dst[k * nr + j] = 0;
}

/* C = alpha op(A) op(B) + beta C without blocking or scratch (the fallback
 * when scratch cannot be had). beta 0 ignores C's old contents. */
static void gemm_naive(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                       const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  for (int64_t i = 0; i < M; i++) {
    float *c = C + i * ldc;
    for (int64_t j = 0; j < N; j++)
      c[j] = beta == 0 ? 0.0f : beta * c[j];
    for (int64_t k = 0; k < K; k++) {
      float aik = alpha * (ta ? A[k * lda + i] : A[i * lda + k]);
      for (int64_t j = 0; j < N; j++)
        c[j] += aik * (tb ? B[j * ldb + k] : B[k * ldb + j]);
    }
  }
}

/* The built-in GEMM: C[M,N] = alpha op(A) op(B) + beta C, row-major f32.
 * Threads (when `par` and the work is large enough) share packing and split
 * the micro-tiles of each block; the loops are the same on every thread. */
static void gemm_blocked(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                         const float *B, int64_t ldb, float beta, float *C, int64_t ldc, int par) {
  if (M <= 0 || N <= 0)
    return;
  if (K <= 0) {
    gemm_naive(ta, tb, M, N, 0, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const Ukernel uk = pick_ukernel();
  const int mr = uk.mr, nr = uk.nr;
  int64_t kcb = min64(K, GEMM_KC), ncb = min64((N + nr - 1) / nr * nr, GEMM_NC / nr * nr);
  int64_t mcb = min64((M + mr - 1) / mr * mr, GEMM_MC / mr * mr);
  float *bp = malloc(sizeof(float) * (size_t)(kcb * ncb)), *ap = malloc(sizeof(float) * (size_t)(mcb * kcb));
  if (!bp || !ap) {
    free(bp);
    free(ap);
    gemm_naive(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  int usepar = par && nthreads() > 1 && (double)M * (double)N * (double)K >= 65536.0;
  (void)usepar;
  OMP(parallel if (usepar))
  {
    for (int64_t jc = 0; jc < N; jc += ncb) {
      int64_t nc = min64(ncb, N - jc), npan = (nc + nr - 1) / nr;
      for (int64_t pc = 0; pc < K; pc += kcb) {
        int64_t kc = min64(kcb, K - pc);
        const float bt = pc == 0 ? beta : 1.0f;
        OMP(for schedule(static))
        for (int64_t jp = 0; jp < npan; jp++)
          pack_b(tb, B, ldb, pc, jc + jp * nr, min64(nr, nc - jp * nr), kc, nr, bp + jp * kc * nr);
        for (int64_t ic = 0; ic < M; ic += mcb) {
          int64_t mc = min64(mcb, M - ic), mpan = (mc + mr - 1) / mr;
          OMP(for schedule(static))
          for (int64_t ip = 0; ip < mpan; ip++)
            pack_a(ta, A, lda, ic + ip * mr, pc, min64(mr, mc - ip * mr), kc, mr, ap + ip * kc * mr);
          OMP(for schedule(static))
          for (int64_t t = 0; t < npan * mpan; t++) {
            int64_t jp = t / mpan, ip = t % mpan;
            int64_t i0 = ic + ip * mr, j0 = jc + jp * nr, mv = min64(mr, M - i0), nv = min64(nr, N - j0);
            float tile[MAX_MR * MAX_NR];
            uk.fn(kc, ap + ip * kc * mr, bp + jp * kc * nr, tile);
            for (int64_t i = 0; i < mv; i++) {
              float *restrict c = C + (i0 + i) * ldc + j0;
              const float *restrict tr = tile + i * nr;
              if (bt == 0) {
                SIMD for (int64_t j = 0; j < nv; j++) c[j] = alpha * tr[j];
              } else if (bt == 1) {
                SIMD for (int64_t j = 0; j < nv; j++) c[j] += alpha * tr[j];
              } else {
                SIMD for (int64_t j = 0; j < nv; j++) c[j] = alpha * tr[j] + bt * c[j];
              }
            }
          }
        }
      }
    }
  }
  free(bp);
  free(ap);
}

#ifdef MLP_HAVE_CBLAS
/* 1 = never use the CBLAS (tests compare the two). */
static int gemm_no_blas = 0;
#endif

/* The f32 GEMM every op uses: cblas_sgemm when built with it (and `par`:
 * BLAS threads itself, so calls from inside a parallel loop use the built-in
 * one), else the blocked one. */
static void sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc, int par) {
#ifdef MLP_HAVE_CBLAS
  if (par && !gemm_no_blas && M > 0 && N > 0 && K > 0 && M <= INT_MAX && N <= INT_MAX && K <= INT_MAX &&
      lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
                alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
    return;
  }
#endif
  gemm_blocked(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, par);
}

/* ---------------------------------------------------------------- matmul */

/* Batch strides: the batch dims of an operand (the first r of shape s, each
 * batch a matrix of `mat` elements) read at the result's nb batch dims (0
 * along broadcast ones). */
static void batch_strides(int r, const int64_t *s, int64_t mat, int nb, int64_t *st) {
  int64_t c = mat;
  for (int k = nb - 1; k >= 0; k--) {
    int kk = k - (nb - r);
    st[k] = kk < 0 || s[kk] == 1 ? 0 : c;
    if (kk >= 0)
      c *= s[kk];
  }
}

/* Per-GEMM work (multiply-adds) below which a batch of GEMMs is split across
 * threads by batch (each GEMM serial, built-in) rather than each GEMM
 * threaded; also done when there are many batches. */
#define GEMM_SMALL 4194304.0

static void matmul_f32(const float *a, int ra, const int64_t *sa, const float *b, int rb, const int64_t *sb, float *y,
                       int ry, const int64_t *sy) {
  int64_t M = ra >= 2 ? sa[ra - 2] : 1, K = sa[ra - 1], N = rb >= 2 ? sb[rb - 1] : 1;
  int abr = ra >= 2 ? ra - 2 : 0, bbr = rb >= 2 ? rb - 2 : 0, nb = ry - (ra >= 2) - (rb >= 2);
  int64_t ast[MLP_MAXRANK], bst[MLP_MAXRANK], nbatch = 1;
  if (nb < 0)
    nb = 0;
  batch_strides(abr, sa, M * K, nb, ast);
  batch_strides(bbr, sb, K * N, nb, bst);
  int b_shared = 1;
  for (int k = 0; k < nb; k++) {
    nbatch *= sy[k];
    b_shared &= bst[k] == 0 || sy[k] == 1;
  }
  if (nbatch <= 0 || M <= 0 || N <= 0)
    return;
  /* b shared by every batch (then the batch dims are all a's, so a's batches
   * are contiguous): one tall GEMM */
  if (nbatch == 1 || b_shared) {
    sgemm(0, 0, nbatch * M, N, K, 1.0f, a, K, b, N, 0.0f, y, N, 1);
    return;
  }
  double work = (double)M * (double)N * (double)K;
  int outer = work < GEMM_SMALL || nbatch >= 4 * nthreads();
  OMP(parallel for schedule(static) if (outer && nbatch > 1))
  for (int64_t t = 0; t < nbatch; t++) {
    int64_t ao = dims_off(nb, sy, ast, t), bo = dims_off(nb, sy, bst, t);
    sgemm(0, 0, M, N, K, 1.0f, a + ao, K, b + bo, N, 0.0f, y + t * M * N, N, !outer);
  }
}

/* The slow path for dtypes that need scratch when none can be had. */
static void matmul_naive(int dt, const void *a, int ra, const int64_t *sa, const void *b, int rb, const int64_t *sb,
                         void *y, int ry, const int64_t *sy) {
  int64_t M = ra >= 2 ? sa[ra - 2] : 1, K = sa[ra - 1], N = rb >= 2 ? sb[rb - 1] : 1;
  int nb = ry - (ra >= 2) - (rb >= 2);
  int64_t ast[MLP_MAXRANK], bst[MLP_MAXRANK], nbatch = 1;
  if (nb < 0)
    nb = 0;
  batch_strides(ra >= 2 ? ra - 2 : 0, sa, M * K, nb, ast);
  batch_strides(rb >= 2 ? rb - 2 : 0, sb, K * N, nb, bst);
  for (int k = 0; k < nb; k++)
    nbatch *= sy[k];
  OMP(parallel for schedule(static))
  for (int64_t t = 0; t < nbatch; t++) {
    int64_t ao = dims_off(nb, sy, ast, t), bo = dims_off(nb, sy, bst, t);
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        float s = 0;
        for (int64_t k = 0; k < K; k++)
          s += ldf(dt, a, ao + i * K + k) * ldf(dt, b, bo + k * N + j);
        stval(dt, y, t * M * N + i * N + j, s);
      }
  }
}

static int64_t numel(int r, const int64_t *s) {
  int64_t n = 1;
  for (int k = 0; k < r; k++)
    n *= s[k];
  return n;
}

void mlp_cpu_matmul(int dt, const void *a, int ra, const int64_t *sa, const void *b, int rb, const int64_t *sb,
                    void *y, int ry, const int64_t *sy) {
  if (dt == MLP_F32) {
    matmul_f32(a, ra, sa, b, rb, sb, y, ry, sy);
    return;
  }
  int64_t na = numel(ra, sa), nbb = numel(rb, sb), ny = numel(ry, sy);
  float *fa = f32_copy(dt, a, na), *fb = fa ? f32_copy(dt, b, nbb) : NULL;
  float *fy = fb ? malloc(sizeof(float) * (size_t)(ny > 0 ? ny : 1)) : NULL;
  if (fy) {
    matmul_f32(fa, ra, sa, fb, rb, sb, fy, ry, sy);
    from_f32_par(dt, fy, y, ny);
  } else {
    matmul_naive(dt, a, ra, sa, b, rb, sb, y, ry, sy);
  }
  free(fa);
  free(fb);
  free(fy);
}

/* ---------------------------------------------------------------- linear */

void mlp_cpu_linear(int dt, const void *x, const void *w, const void *b, void *y, int64_t rows, int64_t in,
                    int64_t out) {
  if (rows <= 0 || out <= 0)
    return;
  if (dt == MLP_F32) { /* y = b (rows), then y += x w^T */
    const float *bf = b;
    float *yf = y;
    if (bf) {
      OMP(parallel for schedule(static) if (rows * out >= PAR_MIN))
      for (int64_t r = 0; r < rows; r++)
        memcpy(yf + r * out, bf, sizeof(float) * (size_t)out);
    }
    sgemm(0, 1, rows, out, in, 1.0f, x, in, w, in, bf ? 1.0f : 0.0f, yf, out, 1);
    return;
  }
  float *fx = f32_copy(dt, x, rows * in), *fw = fx ? f32_copy(dt, w, out * in) : NULL;
  float *fy = fw ? malloc(sizeof(float) * (size_t)(rows * out)) : NULL;
  if (fy) {
    sgemm(0, 1, rows, out, in, 1.0f, fx, in, fw, in, 0.0f, fy, out, 1);
    OMP(parallel for schedule(static) if (rows * out >= PAR_MIN))
    for (int64_t r = 0; r < rows; r++) {
      float *yr = fy + r * out;
      if (b) {
        float bb[BLK];
        for (int64_t j0 = 0; j0 < out; j0 += BLK) {
          int64_t m = min64(BLK, out - j0);
          to_f32(dt, (const uint16_t *)b + j0, bb, m);
          SIMD for (int64_t j = 0; j < m; j++) yr[j0 + j] += bb[j];
        }
      }
      from_f32(dt, yr, (uint16_t *)y + r * out, out);
    }
  } else { /* no scratch: one dot product at a time */
    OMP(parallel for schedule(static))
    for (int64_t r = 0; r < rows; r++)
      for (int64_t o = 0; o < out; o++) {
        float s = 0;
        for (int64_t k = 0; k < in; k++)
          s += ldf(dt, x, r * in + k) * ldf(dt, w, o * in + k);
        stval(dt, y, r * out + o, s + (b ? ldf(dt, b, o) : 0.0f));
      }
  }
  free(fx);
  free(fw);
  free(fy);
}

/* ---------------------------------------------------------------- gemm */

/* mlp_cpu_gemm: the packed GEMM above (micro-kernels, cache blocks) read
 * straight from bf16/f16/f32 operands with any transposes and leading
 * dimensions (the packing converts to f32), batched by strides, and finished
 * by the epilogue (bias, aux, activation, residual, accumulate) as each
 * micro-tile is stored, so that every output is rounded once and C is written
 * once. No buffer the size of C: the f32 sums of one mc x nc block are kept
 * across K slices only when K needs more than one slice. */

HOT float gelu_tanh_f32(float v) { return 0.5f * v * (1.0f + tanh_f32(SQRT_2_OVER_PI * (v + 0.044715f * v * v * v))); }

/* One GEMM of the batch: its operands, with the batch offsets applied. */
typedef struct GemmOne {
  const void *A, *B;
  void *C, *aux;
  const void *res;
} GemmOne;

/* Finishes nv sums t[0, nv) of row m, columns j0.., of one GEMM: the bias,
 * the aux store, the activation, the residual, the old C when accumulating,
 * and the one rounding store into C (mlp_gemm's order). Clobbers t. Called
 * per micro-tile row, so the loops are short; each is one vector loop. */
CLONES static void gemm_epilogue(const mlp_gemm *g, const GemmOne *o, int64_t m, int64_t j0, int64_t nv,
                                 float *restrict t) {
  const int64_t off = m * g->ldc + j0;
  const void *bias = g->bias, *res = o->res, *c = o->C;
  void *aux = o->aux, *y = o->C;
  if (bias) {
#define M_(LD, ST) SIMD for (int64_t j = 0; j < nv; j++) t[j] += LD(bias, j0 + j);
    DT_CASES(g->dt, M_)
#undef M_
  }
  if (aux) {
#define M_(LD, ST) SIMD for (int64_t j = 0; j < nv; j++) ST(aux, off + j, t[j]);
    DT_CASES(g->dt, M_)
#undef M_
  }
  switch (g->act) {
  case MLP_ACT_RELU: SIMD for (int64_t j = 0; j < nv; j++) t[j] = t[j] < 0 ? 0.0f : t[j]; break; /* NaN stays NaN */
  case MLP_ACT_GELU: SIMD for (int64_t j = 0; j < nv; j++) t[j] = gelu_f32(t[j]); break;
  case MLP_ACT_GELU_TANH: SIMD for (int64_t j = 0; j < nv; j++) t[j] = gelu_tanh_f32(t[j]); break;
  default: break;
  }
  if (res) {
#define M_(LD, ST) SIMD for (int64_t j = 0; j < nv; j++) t[j] += LD(res, off + j);
    DT_CASES(g->dt, M_)
#undef M_
  }
  if (g->accumulate) {
#define M_(LD, ST) SIMD for (int64_t j = 0; j < nv; j++) t[j] += LD(c, off + j);
    DT_CASES(g->dt, M_)
#undef M_
  }
#define M_(LD, ST) SIMD for (int64_t j = 0; j < nv; j++) ST(y, off + j, t[j]);
  DT_CASES(g->dt, M_)
#undef M_
}

/* pack_a / pack_b for an operand of dtype dt: f32 as above, bf16/f16
 * converted to f32 on the way. */
static void pack_a_dt(int dt, int ta, const void *A, int64_t lda, int64_t i0, int64_t k0, int64_t mv, int64_t kc,
                      int mr, float *restrict dst) {
  if (dt == MLP_F32) {
    pack_a(ta, A, lda, i0, k0, mv, kc, mr, dst);
    return;
  }
#define M_(LD, ST)                                                                                                     \
  if (!ta) {                                                                                                           \
    for (int64_t i = 0; i < mv; i++)                                                                                   \
      for (int64_t k = 0; k < kc; k++)                                                                                 \
        dst[k * mr + i] = LD(A, (i0 + i) * lda + k0 + k);                                                              \
  } else {                                                                                                             \
    for (int64_t k = 0; k < kc; k++)                                                                                   \
      SIMD for (int64_t i = 0; i < mv; i++) dst[k * mr + i] = LD(A, (k0 + k) * lda + i0 + i);                          \
  }
  DT_CASES(dt, M_)
#undef M_
  for (int64_t k = 0; k < kc; k++)
    for (int64_t i = mv; i < mr; i++)
      dst[k * mr + i] = 0;
}

static void pack_b_dt(int dt, int tb, const void *B, int64_t ldb, int64_t k0, int64_t j0, int64_t nv, int64_t kc,
                      int nr, float *restrict dst) {
  if (dt == MLP_F32) {
    pack_b(tb, B, ldb, k0, j0, nv, kc, nr, dst);
    return;
  }
#define M_(LD, ST)                                                                                                     \
  if (!tb) {                                                                                                           \
    for (int64_t k = 0; k < kc; k++)                                                                                   \
      SIMD for (int64_t j = 0; j < nv; j++) dst[k * nr + j] = LD(B, (k0 + k) * ldb + j0 + j);                          \
  } else {                                                                                                             \
    for (int64_t j = 0; j < nv; j++)                                                                                   \
      for (int64_t k = 0; k < kc; k++)                                                                                 \
        dst[k * nr + j] = LD(B, (j0 + j) * ldb + k0 + k);                                                              \
  }
  DT_CASES(dt, M_)
#undef M_
  for (int64_t k = 0; k < kc; k++)
    for (int64_t j = nv; j < nr; j++)
      dst[k * nr + j] = 0;
}

/* GEMMs with fewer multiply-adds than this skip packing (gemm_direct). */
#define GEMM_DIRECT 32768.0

/* One GEMM without packing or scratch: each row's sums in f32, k in order,
 * then the epilogue. For GEMMs too small to pay for packing (and K = 0), and
 * the fallback when scratch cannot be had. Rows in parallel when `par`. */
static void gemm_direct(const mlp_gemm *g, const GemmOne *o, int par) {
  const int dt = g->dt, ta = g->ta, tb = g->tb;
  const int64_t M = g->M, N = g->N, K = g->K, lda = g->lda, ldb = g->ldb;
  (void)par;
  OMP(parallel for schedule(static) if (par && (double)M * (double)N * (double)(K + 1) >= PAR_MIN))
  for (int64_t m = 0; m < M; m++) {
    float t[BLK];
    for (int64_t j0 = 0; j0 < N; j0 += BLK) {
      int64_t nv = min64(BLK, N - j0);
      for (int64_t j = 0; j < nv; j++)
        t[j] = 0;
      for (int64_t k = 0; k < K; k++) {
        float a = ldf(dt, o->A, ta ? k * lda + m : m * lda + k);
        for (int64_t j = 0; j < nv; j++)
          t[j] += a * ldf(dt, o->B, tb ? (j0 + j) * ldb + k : k * ldb + j0 + j);
      }
      gemm_epilogue(g, o, m, j0, nv, t);
    }
  }
}

/* The blocking of one shape: the micro-kernel and the block sizes, cut down
 * to the problem (a small GEMM packs no more than it has). */
typedef struct GemmPlan {
  Ukernel uk;
  int64_t kcb, ncb, mcb, nk; /* nk: K slices */
  int direct;                /* too small to pack, or K = 0 */
} GemmPlan;

static GemmPlan gemm_plan(const mlp_gemm *g) {
  GemmPlan p;
  memset(&p, 0, sizeof p);
  p.uk = pick_ukernel();
  p.direct = g->K == 0 || (double)g->M * (double)g->N * (double)g->K < GEMM_DIRECT;
  if (!p.direct) {
    int mr = p.uk.mr, nr = p.uk.nr;
    p.kcb = min64(g->K, GEMM_KC);
    p.ncb = min64((g->N + nr - 1) / nr * nr, GEMM_NC / nr * nr);
    p.mcb = min64((g->M + mr - 1) / mr * mr, GEMM_MC / mr * mr);
    p.nk = (g->K + p.kcb - 1) / p.kcb;
  }
  return p;
}

/* A plan's scratch: packed A (mc x kc) and B (kc x nc) blocks, and the f32
 * sums of an mc x nc block between K slices (only when K has several). */
typedef struct GemmWs {
  float *ap, *bp, *acc;
} GemmWs;

static GemmWs gemm_ws_alloc(const GemmPlan *p) {
  GemmWs w = {NULL, NULL, NULL};
  if (p->direct)
    return w;
  w.ap = malloc(sizeof(float) * (size_t)(p->mcb * p->kcb));
  w.bp = malloc(sizeof(float) * (size_t)(p->kcb * p->ncb));
  w.acc = p->nk > 1 ? malloc(sizeof(float) * (size_t)(p->mcb * p->ncb)) : NULL;
  if (!w.ap || !w.bp || (p->nk > 1 && !w.acc)) {
    free(w.ap);
    free(w.bp);
    free(w.acc);
    w.ap = w.bp = w.acc = NULL;
  }
  return w;
}

static void gemm_ws_free(GemmWs *w) {
  free(w->ap);
  free(w->bp);
  free(w->acc);
}

/* One GEMM, packed and blocked: for each nc-column panel and mc-row block, the
 * K slices in order (pack B's kc x nc slice, A's mc x kc slice, run the
 * micro-tiles, summing slices in the block's f32 sums); the last slice's
 * micro-tiles go through the epilogue into C. B's slice is packed again for
 * each row block only when K has several slices. Threads (when `par` and the
 * work is large enough) share the packing and split the micro-tiles; every
 * output's sum is formed in the same order whatever the thread count. */
static void gemm_tiled(const mlp_gemm *g, const GemmPlan *p, const GemmWs *w, const GemmOne *o, int par) {
  const Ukernel uk = p->uk;
  const int mr = uk.mr, nr = uk.nr;
  const int64_t M = g->M, N = g->N, K = g->K, kcb = p->kcb, ncb = p->ncb, mcb = p->mcb, nk = p->nk;
  int usepar = par && nthreads() > 1 && (double)M * (double)N * (double)K >= 65536.0;
  (void)usepar;
  OMP(parallel if (usepar))
  {
    for (int64_t jc = 0; jc < N; jc += ncb) {
      int64_t nc = min64(ncb, N - jc), npan = (nc + nr - 1) / nr;
      for (int64_t ic = 0; ic < M; ic += mcb) {
        int64_t mc = min64(mcb, M - ic), mpan = (mc + mr - 1) / mr;
        for (int64_t q = 0; q < nk; q++) {
          int64_t pc = q * kcb, kc = min64(kcb, K - pc);
          if (nk > 1 || ic == 0) {
            OMP(for schedule(static))
            for (int64_t jp = 0; jp < npan; jp++)
              pack_b_dt(g->dt, g->tb, o->B, g->ldb, pc, jc + jp * nr, min64(nr, nc - jp * nr), kc, nr,
                        w->bp + jp * kc * nr);
          }
          OMP(for schedule(static))
          for (int64_t ip = 0; ip < mpan; ip++)
            pack_a_dt(g->dt, g->ta, o->A, g->lda, ic + ip * mr, pc, min64(mr, mc - ip * mr), kc, mr,
                      w->ap + ip * kc * mr);
          OMP(for schedule(static))
          for (int64_t t = 0; t < npan * mpan; t++) {
            int64_t jp = t / mpan, ip = t % mpan;
            int64_t i0 = ic + ip * mr, j0 = jc + jp * nr, mv = min64(mr, M - i0), nv = min64(nr, N - j0);
            float tile[MAX_MR * MAX_NR];
            float *acc = w->acc ? w->acc + t * mr * nr : NULL;
            uk.fn(kc, w->ap + ip * kc * mr, w->bp + jp * kc * nr, tile);
            if (q + 1 < nk) { /* not the last slice: into the block's sums */
              if (q == 0)
                memcpy(acc, tile, sizeof(float) * (size_t)(mr * nr));
              else
                SIMD for (int x = 0; x < mr * nr; x++) acc[x] += tile[x];
              continue;
            }
            if (q > 0)
              SIMD for (int x = 0; x < mr * nr; x++) tile[x] = acc[x] + tile[x];
            for (int64_t i = 0; i < mv; i++)
              gemm_epilogue(g, o, i0 + i, j0, nv, tile + i * nr);
          }
        }
      }
    }
  }
}

/* The operands of GEMM b of the batch. */
static GemmOne gemm_one(const mlp_gemm *g, int64_t b) {
  const int64_t es = (int64_t)esize(g->dt), oc = b * g->sc * es;
  GemmOne o;
  o.A = (const char *)g->A + b * g->sa * es;
  o.B = (const char *)g->B + b * g->sb * es;
  o.C = (char *)g->C + oc;
  o.aux = g->aux ? (char *)g->aux + oc : NULL;
  o.res = g->residual ? (const char *)g->residual + oc : NULL;
  return o;
}

/* GEMM b of the batch: direct when the plan says so or there is no scratch. */
static void gemm_run(const mlp_gemm *g, const GemmPlan *p, const GemmWs *w, int64_t b, int par) {
  GemmOne o = gemm_one(g, b);
  if (p->direct || !w->ap)
    gemm_direct(g, &o, par);
  else
    gemm_tiled(g, p, w, &o, par);
}

#ifdef MLP_HAVE_CBLAS
/* f32 GEMMs through cblas_sgemm (one call per batch element, straight into
 * C; beta 1 when accumulating), then, when there is an epilogue, one pass
 * over C applying it. Only where that is exact: no accumulation under an
 * epilogue (T would have to be kept apart from C) and no residual read from
 * C itself. Returns 0 when it did not apply. */
static int gemm_cblas(const mlp_gemm *g) {
  const int plain = !g->bias && g->act == MLP_ACT_NONE && !g->aux && !g->residual;
  if (gemm_no_blas || g->dt != MLP_F32 || g->K == 0 || (g->accumulate && !plain) ||
      (g->residual && g->residual == g->C))
    return 0;
  if (g->M > INT_MAX || g->N > INT_MAX || g->K > INT_MAX || g->lda > INT_MAX || g->ldb > INT_MAX ||
      g->ldc > INT_MAX)
    return 0;
  for (int64_t b = 0; b < g->batch; b++) {
    GemmOne o = gemm_one(g, b);
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans, (int)g->M,
                (int)g->N, (int)g->K, 1.0f, o.A, (int)g->lda, o.B, (int)g->ldb, g->accumulate ? 1.0f : 0.0f, o.C,
                (int)g->ldc);
    if (plain)
      continue;
    OMP(parallel for schedule(static) if (g->M * g->N >= PAR_MIN))
    for (int64_t m = 0; m < g->M; m++) {
      float t[BLK];
      for (int64_t j0 = 0; j0 < g->N; j0 += BLK) {
        int64_t nv = min64(BLK, g->N - j0);
        memcpy(t, (const float *)o.C + m * g->ldc + j0, sizeof(float) * (size_t)nv);
        gemm_epilogue(g, &o, m, j0, nv, t);
      }
    }
  }
  return 1;
}
#endif

/* Whether a mlp_gemm is well formed (see mlp_rt.h). */
static int gemm_args_ok(const mlp_gemm *g) {
  if (!g || (g->dt != MLP_F32 && g->dt != MLP_BF16 && g->dt != MLP_F16) || (g->ta & ~1) || (g->tb & ~1))
    return 0;
  if (g->M < 0 || g->N < 0 || g->K < 0 || g->batch < 0 || g->sa < 0 || g->sb < 0 || g->sc < 0)
    return 0;
  if (g->act < MLP_ACT_NONE || g->act > MLP_ACT_GELU_TANH)
    return 0;
  if (g->lda < (g->ta ? g->M : g->K) || g->ldb < (g->tb ? g->K : g->N) || g->ldc < g->N)
    return 0;
  if (g->M == 0 || g->N == 0 || g->batch == 0)
    return 1; /* nothing to write */
  if (!g->C || (g->K > 0 && (!g->A || !g->B)) || (g->batch > 1 && g->sc == 0))
    return 0;
  return 1;
}

int mlp_cpu_gemm(const mlp_gemm *g) {
  if (!gemm_args_ok(g))
    return -1;
  if (g->M == 0 || g->N == 0 || g->batch == 0)
    return 0;
  const GemmPlan p = gemm_plan(g);
  /* Small GEMMs of a batch run one per thread (each serial) rather than each
   * threaded, as do many; the blocking is the same either way, so are the
   * bits. The CBLAS (f32) takes the rest when it can. */
  const int small = g->batch > 1 && (double)g->M * (double)g->N * (double)g->K < GEMM_SMALL;
#ifdef MLP_HAVE_CBLAS
  int nested = 0;
#ifdef _OPENMP
  nested = omp_in_parallel();
#endif
  if (!p.direct && !small && !nested && gemm_cblas(g))
    return 0;
#endif
  if (g->batch > 1 && nthreads() > 1 && (small || g->batch >= 4 * nthreads())) {
    OMP(parallel)
    {
      GemmWs w = gemm_ws_alloc(&p);
      OMP(for schedule(static))
      for (int64_t b = 0; b < g->batch; b++)
        gemm_run(g, &p, &w, b, 0);
      gemm_ws_free(&w);
    }
    return 0;
  }
  GemmWs w = gemm_ws_alloc(&p);
  for (int64_t b = 0; b < g->batch; b++)
    gemm_run(g, &p, &w, b, 1);
  gemm_ws_free(&w);
  return 0;
}

/* ---------------------------------------------------------------- attention */

/* Softmax of the first n of the Tk scores in r, in place; the rest (masked)
 * become 0. */
CLONES static void att_softmax_row(float *restrict r, int64_t n, int64_t Tk) {
  float m = (float)run_pass(P_MAX, MLP_F32, r, n, 0);
  double sum = 0;
  SIMD_SUM(sum) for (int64_t j = 0; j < n; j++) {
    float e = exp_f32(r[j] - m);
    r[j] = e;
    sum += (double)e;
  }
  float inv = (float)(1.0 / sum);
  SIMD for (int64_t j = 0; j < n; j++) r[j] *= inv;
  for (int64_t j = n; j < Tk; j++)
    r[j] = 0;
}

/* One (batch, head): S = scale q k^T [Tq, Tk] (causal: j > i masked), row
 * softmax, y = P v. `s` is Tq x Tk scratch; `par` lets the GEMMs and the
 * softmax use the threads (when the batch loop does not). */
static void attention_one(const float *q, const float *k, const float *v, float *y, float *s, int64_t Tq, int64_t Tk,
                          int64_t D, int64_t Dv, int causal, float scale, int par) {
  sgemm(0, 1, Tq, Tk, D, scale, q, D, k, D, 0.0f, s, Tk, par);
  OMP(parallel for schedule(static) if (par && Tq * Tk >= PAR_MIN))
  for (int64_t i = 0; i < Tq; i++)
    att_softmax_row(s + i * Tk, causal ? min64(i + 1, Tk) : Tk, Tk);
  sgemm(0, 0, Tq, Dv, Tk, 1.0f, s, Tk, v, Dv, 0.0f, y, Dv, par);
}

/* Without scratch: per row, the max and the sum of exp, then y accumulated in
 * chunks of 64 columns on the stack (scores recomputed). */
static void attention_noscratch(int dt, const void *q, const void *k, const void *v, void *y, int64_t Tq, int64_t Tk,
                                int64_t D, int64_t Dv, int causal, float scale) {
  for (int64_t i = 0; i < Tq; i++) {
    int64_t n = causal ? min64(i + 1, Tk) : Tk;
    float m = -INFINITY;
    double sum = 0;
    for (int pass = 0; pass < 2; pass++)
      for (int64_t j = 0; j < n; j++) {
        float d = 0;
        for (int64_t e = 0; e < D; e++)
          d += ldf(dt, q, i * D + e) * ldf(dt, k, j * D + e);
        if (pass)
          sum += (double)exp_f32(scale * d - m);
        else
          m = max_nan(m, scale * d);
      }
    for (int64_t e0 = 0; e0 < Dv; e0 += 64) {
      float acc[64] = {0};
      int64_t w = min64(64, Dv - e0);
      for (int64_t j = 0; j < n; j++) {
        float d = 0;
        for (int64_t e = 0; e < D; e++)
          d += ldf(dt, q, i * D + e) * ldf(dt, k, j * D + e);
        float p = (float)(exp_f32(scale * d - m) / sum);
        for (int64_t e = 0; e < w; e++)
          acc[e] += p * ldf(dt, v, j * Dv + e0 + e);
      }
      for (int64_t e = 0; e < w; e++)
        stval(dt, y, i * Dv + e0 + e, acc[e]);
    }
  }
}

void mlp_cpu_attention(int dt, const void *q, int rq, const int64_t *sq, const void *k, int rk, const int64_t *sk,
                       const void *v, int rv, const int64_t *sv, void *y, int ry, const int64_t *sy, int causal,
                       double scale) {
  int64_t Tq = sq[rq - 2], D = sq[rq - 1], Tk = sk[rk - 2], Dv = sv[rv - 1];
  int nb = ry - 2;
  int64_t qst[MLP_MAXRANK], kst[MLP_MAXRANK], vst[MLP_MAXRANK], nbatch = 1;
  batch_strides(rq - 2, sq, Tq * D, nb, qst);
  batch_strides(rk - 2, sk, Tk * D, nb, kst);
  batch_strides(rv - 2, sv, Tk * Dv, nb, vst);
  for (int d = 0; d < nb; d++)
    nbatch *= sy[d];
  if (nbatch <= 0 || Tq <= 0 || Dv <= 0)
    return;
  int64_t ny = nbatch * Tq * Dv;
  if (Tk <= 0) { /* softmax over nothing: y = 0 */
    mlp_cpu_fill(dt, y, ny, 0.0);
    return;
  }
  const float *fq = q, *fk = k, *fv = v;
  float *fy = y, *tq = NULL, *tk = NULL, *tv = NULL;
  int ok = 1;
  if (dt != MLP_F32) {
    fq = tq = f32_copy(dt, q, numel(rq, sq));
    fk = tk = tq ? f32_copy(dt, k, numel(rk, sk)) : NULL;
    fv = tv = tk ? f32_copy(dt, v, numel(rv, sv)) : NULL;
    fy = tv ? malloc(sizeof(float) * (size_t)ny) : NULL;
    ok = fy != NULL;
  }
  int outer = nbatch >= nthreads() && nthreads() > 1;
  if (ok && outer) {
    OMP(parallel)
    {
      float *s = malloc(sizeof(float) * (size_t)(Tq * Tk));
      OMP(for schedule(static))
      for (int64_t t = 0; t < nbatch; t++) {
        const float *qb = fq + dims_off(nb, sy, qst, t), *kb = fk + dims_off(nb, sy, kst, t);
        const float *vb = fv + dims_off(nb, sy, vst, t);
        if (s)
          attention_one(qb, kb, vb, fy + t * Tq * Dv, s, Tq, Tk, D, Dv, causal, (float)scale, 0);
        else
          attention_noscratch(MLP_F32, qb, kb, vb, fy + t * Tq * Dv, Tq, Tk, D, Dv, causal, (float)scale);
      }
      free(s);
    }
  } else if (ok) {
    float *s = malloc(sizeof(float) * (size_t)(Tq * Tk));
    for (int64_t t = 0; t < nbatch; t++) {
      const float *qb = fq + dims_off(nb, sy, qst, t), *kb = fk + dims_off(nb, sy, kst, t);
      const float *vb = fv + dims_off(nb, sy, vst, t);
      if (s)
        attention_one(qb, kb, vb, fy + t * Tq * Dv, s, Tq, Tk, D, Dv, causal, (float)scale, 1);
      else
        attention_noscratch(MLP_F32, qb, kb, vb, fy + t * Tq * Dv, Tq, Tk, D, Dv, causal, (float)scale);
    }
    free(s);
  } else { /* half dtypes without scratch */
    size_t es = esize(dt);
    OMP(parallel for schedule(static))
    for (int64_t t = 0; t < nbatch; t++)
      attention_noscratch(dt, (const char *)q + dims_off(nb, sy, qst, t) * (int64_t)es,
                          (const char *)k + dims_off(nb, sy, kst, t) * (int64_t)es,
                          (const char *)v + dims_off(nb, sy, vst, t) * (int64_t)es,
                          (char *)y + t * Tq * Dv * (int64_t)es, Tq, Tk, D, Dv, causal, (float)scale);
  }
  if (dt != MLP_F32 && ok)
    from_f32_par(dt, fy, y, ny);
  free(tq);
  free(tk);
  free(tv);
  if (fy != y)
    free(fy);
}
