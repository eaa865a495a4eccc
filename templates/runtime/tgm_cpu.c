/* tgm_cpu.c: the CPU library calls of the runtime (the "CPU kernels" section
 * of tgm_rt.h): the GEMMs (matmul, linear, gemm), attention, embedding and
 * its backward, dropout and the dtype cast; the pointwise, reduction, view
 * and loss kernels are generated per model (NAME_cpu.c). OpenMP-parallel and
 * vectorisable.
 *
 * Template: copied into every emitted project with "tgm_" renamed. Plain C11
 * plus OpenMP pragmas (ignored without -fopenmp); needs libm, and a CBLAS when
 * built with -DTGM_HAVE_CBLAS. Only the sections of the library calls a
 * model makes are copied (tgm_rt.h, "Sections"). The dtype conversions
 * (tgm_bf16_to_f32, ...) live in tgm_init.c; the hot loops use the inline
 * copies of tgm_rt.h (tgm_ld_bf16, tgm_st_bf16, tgm_ld_f16, tgm_st_f16,
 * shared with tgm_optim_cpu.c), written so that loops over them vectorise,
 * bit-identical to those (round to nearest even; the unit test checks every
 * half and a sweep of floats). exp and gelu are tgm_math.h's (the generated
 * kernels'), vectorisable polynomials.
 *
 * Numerics: floating ops compute in f32 (bf16/f16 are loaded to f32 and the
 * result rounded once on store); softmax sums accumulate in double. On x86
 * with gcc or clang the hot loops are also compiled for AVX2 and AVX-512 and
 * picked at load time (target_clones), as are the GEMM micro-kernels (at run
 * time); -DTGM_NO_ISA_DISPATCH turns both off.
 *
 * The layout of the file:
 *   helpers      threads, pragmas, dtype loads and stores (on tgm_rt.h's
 *                inline conversions and bit selects)
 *   cast, dropout
 *   embedding    and its backward (a stable counting sort, then rows)
 *   GEMM         a packed, cache-blocked GEMM with register-blocked micro-
 *                kernels (AVX-512 / AVX2 chosen at run time on x86, else
 *                plain C), or cblas_sgemm; matmul, linear on top
 *   gemm         tgm_cpu_gemm: the same blocks and micro-kernels on any
 *                dtype, transposes, strides and batches, with the fused
 *                epilogue applied as micro-tiles are stored
 *   attention    on the GEMM. */
#include "tgm_rt.h"
#include "tgm_math.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef TGM_HAVE_CBLAS
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
    !defined(TGM_NO_ISA_DISPATCH)
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
/* f32 scratch blocks (elements) for bf16/f16 pointwise work. */
#define BLK 256

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static size_t esize(int dt) { return dt == TGM_BF16 || dt == TGM_F16 ? 2 : dt == TGM_BOOL ? 1 : 4; }
static int is_half(int dt) { return dt == TGM_BF16 || dt == TGM_F16; }

/* One element of any dtype as a float / from a float (i32 saturating, NaN to
 * INT32_MIN, as tgen's cast; bool as 0/1). For scalars and slow paths. */
static inline float ldf(int dt, const void *p, int64_t i) {
  switch (dt) {
  case TGM_BF16: return tgm_ld_bf16(((const uint16_t *)p)[i]);
  case TGM_F16: return tgm_ld_f16(((const uint16_t *)p)[i]);
  case TGM_I32: return (float)((const int32_t *)p)[i];
  case TGM_BOOL: return (float)((const uint8_t *)p)[i];
  default: return ((const float *)p)[i];
  }
}
static inline double ldd(int dt, const void *p, int64_t i) {
  return dt == TGM_I32 ? (double)((const int32_t *)p)[i] : (double)ldf(dt, p, i);
}
static inline int32_t sat_i32(double v) {
  if (!(v > -2147483649.0 && v < 2147483648.0))
    return INT32_MIN;
  return (int32_t)v;
}
static inline void stval(int dt, void *p, int64_t i, double v) {
  switch (dt) {
  case TGM_BF16: ((uint16_t *)p)[i] = tgm_st_bf16((float)v); break;
  case TGM_F16: ((uint16_t *)p)[i] = tgm_st_f16((float)v); break;
  case TGM_I32: ((int32_t *)p)[i] = sat_i32(v); break;
  case TGM_BOOL: ((uint8_t *)p)[i] = v != 0; break;
  default: ((float *)p)[i] = (float)v; break;
  }
}

/* Loaders and storers for loops stamped out once per floating dtype:
 * DT_CASES(dt, M) expands M(LD, ST) for the dtype's pair. */
#define LD_F32(p, i) (((const float *)(p))[i])
#define LD_BF(p, i) tgm_ld_bf16(((const uint16_t *)(p))[i])
#define LD_H(p, i) tgm_ld_f16(((const uint16_t *)(p))[i])
#define ST_F32(p, i, v) (((float *)(p))[i] = (v))
#define ST_BF(p, i, v) (((uint16_t *)(p))[i] = tgm_st_bf16(v))
#define ST_H(p, i, v) (((uint16_t *)(p))[i] = tgm_st_f16(v))
#define DT_CASES(dt, M)                                                                                                \
  switch (dt) {                                                                                                        \
  case TGM_BF16: M(LD_BF, ST_BF); break;                                                                               \
  case TGM_F16: M(LD_H, ST_H); break;                                                                                  \
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

/*@uses matmul linear attention@*/
/* Parallel versions for whole tensors. */
static void to_f32_par(int dt, const void *x, float *y, int64_t n) {
  int64_t nb = (n + 4095) / 4096;
  OMP(parallel for schedule(static) if (n >= PAR_MIN))
  for (int64_t b = 0; b < nb; b++)
    to_f32(dt, (const char *)x + b * 4096 * (int64_t)esize(dt), y + b * 4096, min64(4096, n - b * 4096));
}
/*@end matmul linear attention@*/
/*@uses matmul attention@*/
static void from_f32_par(int dt, const float *x, void *y, int64_t n) {
  int64_t nb = (n + 4095) / 4096;
  OMP(parallel for schedule(static) if (n >= PAR_MIN))
  for (int64_t b = 0; b < nb; b++)
    from_f32(dt, x + b * 4096, (char *)y + b * 4096 * (int64_t)esize(dt), min64(4096, n - b * 4096));
}
/*@end matmul attention@*/

/*@uses matmul linear attention@*/
/* A malloc'd f32 copy of a floating tensor, or NULL. */
static float *f32_copy(int dt, const void *x, int64_t n) {
  float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  if (p)
    to_f32_par(dt, x, p, n);
  return p;
}
/*@end matmul linear attention@*/

/* ---------------------------------------------------------------- cast */

void tgm_cpu_cast(int dt_in, int dt_out, const void *x, void *y, int64_t n) {
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
    int fin = dt_in == TGM_F32 || is_half(dt_in), fout = dt_out == TGM_F32 || is_half(dt_out);
    if (fin && fout) { /* through f32: the fast, common casts */
      float buf[BLK];
      for (int64_t i0 = 0; i0 < m; i0 += BLK) {
        int64_t k = min64(BLK, m - i0);
        const char *xp = xs + i0 * (int64_t)esize(dt_in);
        char *yp = ys + i0 * (int64_t)esize(dt_out);
        if (dt_in == TGM_F32) {
          from_f32(dt_out, (const float *)xp, yp, k);
        } else if (dt_out == TGM_F32) {
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

/*@uses dropout@*/
/* ---------------------------------------------------------------- dropout */

/* Word 0 of Philox4x32-10 (the bits of tgm_philox4x32, tgm_init.c), inline so
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
    ST(y, j, tgm_sel(tgm_mask(((r >> 8) << 1 | 1u) >= t), LD(x, j) * s, 0.0f));                                        \
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
void tgm_cpu_dropout(int dt, const void *x, void *y, int64_t n, double p, uint64_t seed, uint32_t ordinal,
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
/*@end dropout@*/

/*@uses matmul attention@*/
/* Offset of index i over n dims of sizes sz, strides st. */
static int64_t dims_off(int n, const int64_t *sz, const int64_t *st, int64_t i) {
  int64_t off = 0;
  for (int k = n - 1; k >= 0; k--) {
    off += (i % sz[k]) * st[k];
    i /= sz[k];
  }
  return off;
}

/* Elements of shape s[r]. */
static int64_t numel(int r, const int64_t *s) {
  int64_t n = 1;
  for (int k = 0; k < r; k++)
    n *= s[k];
  return n;
}

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
/*@end matmul attention@*/

/*@uses embedding@*/
/* ---------------------------------------------------------------- embedding */

int64_t tgm_cpu_embedding(int dt, const int32_t *idx, int64_t n, const void *table, int64_t V, int64_t D, void *y) {
  for (int64_t i = 0; i < n; i++)
    if (idx[i] < 0 || idx[i] >= V)
      return i;
  size_t row = esize(dt) * (size_t)(D > 0 ? D : 0);
  OMP(parallel for schedule(static) if (n * D >= PAR_MIN))
  for (int64_t i = 0; i < n; i++)
    memcpy((char *)y + (size_t)i * row, (const char *)table + (size_t)idx[i] * row, row);
  return -1;
}
/*@end embedding@*/

/*@uses embedding_backward@*/
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
int64_t tgm_cpu_embedding_backward(int dt, const int32_t *idx, int64_t n, const void *dy, int64_t V, int64_t D,
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
/*@end embedding_backward@*/

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

/*@uses matmul linear attention@*/
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
/*@end matmul linear attention@*/

#ifdef TGM_HAVE_CBLAS
/* 1 = never use the CBLAS (tests compare the two). */
static int gemm_no_blas = 0;

#if defined(__GNUC__) && defined(__ELF__)
/* OpenBLAS's thread count, when the CBLAS is OpenBLAS (weak: absent otherwise). */
extern int openblas_get_num_threads(void) __attribute__((weak));
extern void openblas_set_num_threads(int n) __attribute__((weak));
#endif

/* cblas_sgemm in one thread pool: the rows (or the columns, when there are
 * more) in one piece per OpenMP thread, each piece a one-thread call
 * (OpenBLAS's count is set to 1 for the call and given back after it, so
 * the caller's own use of OpenBLAS is untouched). A BLAS with threads of its
 * own leaves them spinning after each call, taking the cores from the OpenMP
 * kernels that follow. */
static void cblas_split(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                        const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  int was = 1;
#if defined(__GNUC__) && defined(__ELF__)
  if (openblas_get_num_threads && openblas_set_num_threads && (was = openblas_get_num_threads()) != 1)
    openblas_set_num_threads(1);
#endif
  int by_rows = M >= N, nt = nthreads();
  int64_t len = by_rows ? M : N, np = len / 64 < nt ? len / 64 : nt;
  if (np < 1)
    np = 1;
  OMP(parallel for schedule(static) if (np > 1))
  for (int64_t q = 0; q < np; q++) {
    int64_t a0 = len * q / np, a1 = len * (q + 1) / np;
    const float *Aq = A, *Bq = B;
    float *Cq = C;
    if (by_rows) {
      Aq += ta ? a0 : a0 * lda;
      Cq += a0 * ldc;
    } else {
      Bq += tb ? a0 * ldb : a0;
      Cq += a0;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)(by_rows ? a1 - a0 : M), (int)(by_rows ? N : a1 - a0), (int)K, alpha, Aq, (int)lda, Bq, (int)ldb,
                beta, Cq, (int)ldc);
  }
#if defined(__GNUC__) && defined(__ELF__)
  if (was != 1)
    openblas_set_num_threads(was);
#else
  (void)was;
#endif
}
#endif

/*@uses matmul linear attention@*/
/* The f32 GEMM every op uses: the CBLAS when built with it (and `par`:
 * cblas_split spreads it over the OpenMP threads, so calls from inside a
 * parallel loop use the built-in one), else the blocked one. */
static void sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc, int par) {
#ifdef TGM_HAVE_CBLAS
  if (par && !gemm_no_blas && M > 0 && N > 0 && K > 0 && M <= INT_MAX && N <= INT_MAX && K <= INT_MAX &&
      lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX) {
    cblas_split(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#endif
  gemm_blocked(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, par);
}
/*@end matmul linear attention@*/

/* Per-GEMM work (multiply-adds) below which a batch of GEMMs is split across
 * threads by batch (each GEMM serial, built-in) rather than each GEMM
 * threaded; also done when there are many batches. */
#define GEMM_SMALL 4194304.0

/*@uses matmul@*/
/* ---------------------------------------------------------------- matmul */

static void matmul_f32(const float *a, int ra, const int64_t *sa, const float *b, int rb, const int64_t *sb, float *y,
                       int ry, const int64_t *sy) {
  int64_t M = ra >= 2 ? sa[ra - 2] : 1, K = sa[ra - 1], N = rb >= 2 ? sb[rb - 1] : 1;
  int abr = ra >= 2 ? ra - 2 : 0, bbr = rb >= 2 ? rb - 2 : 0, nb = ry - (ra >= 2) - (rb >= 2);
  int64_t ast[TGM_MAXRANK], bst[TGM_MAXRANK], nbatch = 1;
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
  int64_t ast[TGM_MAXRANK], bst[TGM_MAXRANK], nbatch = 1;
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

void tgm_cpu_matmul(int dt, const void *a, int ra, const int64_t *sa, const void *b, int rb, const int64_t *sb,
                    void *y, int ry, const int64_t *sy) {
  if (dt == TGM_F32) {
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
/*@end matmul@*/

/*@uses linear@*/
/* ---------------------------------------------------------------- linear */

void tgm_cpu_linear(int dt, const void *x, const void *w, const void *b, void *y, int64_t rows, int64_t in,
                    int64_t out) {
  if (rows <= 0 || out <= 0)
    return;
  if (dt == TGM_F32) { /* y = b (rows), then y += x w^T */
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
/*@end linear@*/

/* ---------------------------------------------------------------- gemm */

/* tgm_cpu_gemm: the packed GEMM above (micro-kernels, cache blocks) read
 * straight from bf16/f16/f32 operands with any transposes and leading
 * dimensions (the packing converts to f32), batched by strides, and finished
 * by the epilogue (bias, aux, activation, residual, accumulate) as each
 * micro-tile is stored, so that every output is rounded once and C is written
 * once. No buffer the size of C: the f32 sums of one mc x nc block are kept
 * across K slices only when K needs more than one slice. */

/* One GEMM of the batch: its operands, with the batch offsets applied. */
typedef struct GemmOne {
  const void *A, *B;
  void *C, *aux;
  const void *res;
} GemmOne;

/* Finishes nv sums t[0, nv) of row m, columns j0.., of one GEMM: the bias,
 * the aux store, the activation, the residual, the old C when accumulating,
 * and the one rounding store into C (tgm_gemm's order). Clobbers t. Called
 * per micro-tile row, so the loops are short; each is one vector loop. */
CLONES static void gemm_epilogue(const tgm_gemm *g, const GemmOne *o, int64_t m, int64_t j0, int64_t nv,
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
  case TGM_ACT_RELU: SIMD for (int64_t j = 0; j < nv; j++) t[j] = t[j] < 0 ? 0.0f : t[j]; break; /* NaN stays NaN */
  case TGM_ACT_GELU: SIMD for (int64_t j = 0; j < nv; j++) t[j] = tgm_gelu(t[j], 0); break;
  case TGM_ACT_GELU_TANH: SIMD for (int64_t j = 0; j < nv; j++) t[j] = tgm_gelu(t[j], 1); break;
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
  if (dt == TGM_F32) {
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
  if (dt == TGM_F32) {
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
static void gemm_direct(const tgm_gemm *g, const GemmOne *o, int par) {
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

static GemmPlan gemm_plan(const tgm_gemm *g) {
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
static void gemm_tiled(const tgm_gemm *g, const GemmPlan *p, const GemmWs *w, const GemmOne *o, int par) {
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
static GemmOne gemm_one(const tgm_gemm *g, int64_t b) {
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
static void gemm_run(const tgm_gemm *g, const GemmPlan *p, const GemmWs *w, int64_t b, int par) {
  GemmOne o = gemm_one(g, b);
  if (p->direct || !w->ap)
    gemm_direct(g, &o, par);
  else
    gemm_tiled(g, p, w, &o, par);
}

#ifdef TGM_HAVE_CBLAS
/* f32 GEMMs through cblas_sgemm (one call per batch element, straight into
 * C; beta 1 when accumulating), then, when there is an epilogue, one pass
 * over C applying it. Only where that is exact: no accumulation under an
 * epilogue (T would have to be kept apart from C) and no residual read from
 * C itself. Returns 0 when it did not apply. */
static int gemm_cblas(const tgm_gemm *g) {
  const int plain = !g->bias && g->act == TGM_ACT_NONE && !g->aux && !g->residual;
  if (gemm_no_blas || g->dt != TGM_F32 || g->K == 0 || (g->accumulate && !plain) ||
      (g->residual && g->residual == g->C))
    return 0;
  if (g->M > INT_MAX || g->N > INT_MAX || g->K > INT_MAX || g->lda > INT_MAX || g->ldb > INT_MAX ||
      g->ldc > INT_MAX)
    return 0;
  for (int64_t b = 0; b < g->batch; b++) {
    GemmOne o = gemm_one(g, b);
    cblas_split(g->ta, g->tb, g->M, g->N, g->K, 1.0f, (const float *)o.A, g->lda, (const float *)o.B, g->ldb,
                g->accumulate ? 1.0f : 0.0f, (float *)o.C, g->ldc);
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

/* Whether a tgm_gemm is well formed (see tgm_rt.h). */
static int gemm_args_ok(const tgm_gemm *g) {
  if (!g || (g->dt != TGM_F32 && g->dt != TGM_BF16 && g->dt != TGM_F16) || (g->ta & ~1) || (g->tb & ~1))
    return 0;
  if (g->M < 0 || g->N < 0 || g->K < 0 || g->batch < 0 || g->sa < 0 || g->sb < 0 || g->sc < 0)
    return 0;
  if (g->act < TGM_ACT_NONE || g->act > TGM_ACT_GELU_TANH)
    return 0;
  if (g->lda < (g->ta ? g->M : g->K) || g->ldb < (g->tb ? g->K : g->N) || g->ldc < g->N)
    return 0;
  if (g->M == 0 || g->N == 0 || g->batch == 0)
    return 1; /* nothing to write */
  if (!g->C || (g->K > 0 && (!g->A || !g->B)) || (g->batch > 1 && g->sc == 0))
    return 0;
  return 1;
}

int tgm_cpu_gemm(const tgm_gemm *g) {
  if (!gemm_args_ok(g))
    return -1;
  if (g->M == 0 || g->N == 0 || g->batch == 0)
    return 0;
  const GemmPlan p = gemm_plan(g);
  /* Small GEMMs of a batch run one per thread (each serial) rather than each
   * threaded, as do many; the blocking is the same either way, so are the
   * bits. The CBLAS (f32) takes the rest when it can. */
  const int small = g->batch > 1 && (double)g->M * (double)g->N * (double)g->K < GEMM_SMALL;
#ifdef TGM_HAVE_CBLAS
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

/*@uses attention@*/
/* ---------------------------------------------------------------- attention */

/* The NaN-propagating max of n contiguous floats (-inf for none): with gcc
 * and OpenMP an OpenMP max reduction plus a NaN flag (vectorised at every -O
 * level), else 16 independent lanes (what clang vectorises). */
HOT float run_max(const float *restrict x, int64_t n) {
#if defined(_OPENMP) && !defined(__clang__)
  float m = -INFINITY;
  int nan = 0;
  PRAGMA_(omp simd reduction(max : m) reduction(| : nan))
  for (int64_t i = 0; i < n; i++) {
    const float v = x[i];
    m = v > m ? v : m;
    nan |= v != v;
  }
  return nan ? NAN : m;
#else
  float lane[16], m = -INFINITY;
  int64_t i = 0;
  for (int l = 0; l < 16; l++)
    lane[l] = -INFINITY;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; l++)
      lane[l] = tgm_max(lane[l], x[i + l]);
  for (; i < n; i++)
    lane[0] = tgm_max(lane[0], x[i]);
  for (int l = 0; l < 16; l++)
    m = tgm_max(m, lane[l]);
  return m;
#endif
}

/* Softmax of the first n of the Tk scores in r, in place; the rest (masked)
 * become 0. */
CLONES static void att_softmax_row(float *restrict r, int64_t n, int64_t Tk) {
  float m = run_max(r, n);
  double sum = 0;
  SIMD_SUM(sum) for (int64_t j = 0; j < n; j++) {
    float e = tgm_exp(r[j] - m);
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
          sum += (double)tgm_exp(scale * d - m);
        else
          m = tgm_max(m, scale * d);
      }
    for (int64_t e0 = 0; e0 < Dv; e0 += 64) {
      float acc[64] = {0};
      int64_t w = min64(64, Dv - e0);
      for (int64_t j = 0; j < n; j++) {
        float d = 0;
        for (int64_t e = 0; e < D; e++)
          d += ldf(dt, q, i * D + e) * ldf(dt, k, j * D + e);
        float p = (float)(tgm_exp(scale * d - m) / sum);
        for (int64_t e = 0; e < w; e++)
          acc[e] += p * ldf(dt, v, j * Dv + e0 + e);
      }
      for (int64_t e = 0; e < w; e++)
        stval(dt, y, i * Dv + e0 + e, acc[e]);
    }
  }
}

void tgm_cpu_attention(int dt, const void *q, int rq, const int64_t *sq, const void *k, int rk, const int64_t *sk,
                       const void *v, int rv, const int64_t *sv, void *y, int ry, const int64_t *sy, int causal,
                       double scale) {
  int64_t Tq = sq[rq - 2], D = sq[rq - 1], Tk = sk[rk - 2], Dv = sv[rv - 1];
  int nb = ry - 2;
  int64_t qst[TGM_MAXRANK], kst[TGM_MAXRANK], vst[TGM_MAXRANK], nbatch = 1;
  batch_strides(rq - 2, sq, Tq * D, nb, qst);
  batch_strides(rk - 2, sk, Tk * D, nb, kst);
  batch_strides(rv - 2, sv, Tk * Dv, nb, vst);
  for (int d = 0; d < nb; d++)
    nbatch *= sy[d];
  if (nbatch <= 0 || Tq <= 0 || Dv <= 0)
    return;
  int64_t ny = nbatch * Tq * Dv;
  if (Tk <= 0) { /* softmax over nothing: y = 0 (all-zero bits in every floating dtype) */
    memset(y, 0, esize(dt) * (size_t)ny);
    return;
  }
  const float *fq = q, *fk = k, *fv = v;
  float *fy = y, *tq = NULL, *tk = NULL, *tv = NULL;
  int ok = 1;
  if (dt != TGM_F32) {
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
          attention_noscratch(TGM_F32, qb, kb, vb, fy + t * Tq * Dv, Tq, Tk, D, Dv, causal, (float)scale);
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
        attention_noscratch(TGM_F32, qb, kb, vb, fy + t * Tq * Dv, Tq, Tk, D, Dv, causal, (float)scale);
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
  if (dt != TGM_F32 && ok)
    from_f32_par(dt, fy, y, ny);
  free(tq);
  free(tk);
  free(tv);
  if (fy != y)
    free(fy);
}
/*@end attention@*/
