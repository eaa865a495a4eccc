/* tgm_cpu.c: the CPU library calls of the runtime (the "CPU kernels" section
 * of tgm_rt.h): the GEMMs (matmul, linear, gemm), attention, embedding and
 * its backward, dropout and the dtype cast; the pointwise, reduction, view
 * and loss kernels are generated per model (NAME_cpu.c). OpenMP-parallel and
 * vectorisable.
 *
 * Template: copied into every emitted project with "tgm_" renamed. Plain C11
 * plus OpenMP pragmas (ignored without -fopenmp); needs libm, and a CBLAS when
 * built with -DTGM_HAVE_CBLAS (the emitted CMakeLists.txt defines it for
 * OpenBLAS, MKL, BLIS or a CBLAS asked for; for Netlib's reference BLAS,
 * slower than the built-in GEMM, only when forced). Only the sections of the
 * library calls a model makes are copied (tgm_rt.h, "Sections"). The dtype
 * conversions (tgm_bf16_to_f32, ...) live in tgm_init.c; the hot loops use
 * the inline copies of tgm_rt.h (tgm_ld_bf16, tgm_st_bf16, tgm_ld_f16,
 * tgm_st_f16, shared with tgm_optim_cpu.c), written so that loops over them
 * vectorise, bit-identical to those (round to nearest even; the unit test
 * checks every half and a sweep of floats). exp and gelu are tgm_math.h's (the generated
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
 *   attention    and its backward, a block of query rows at a time (never
 *                a Tq x Tk matrix), on the GEMM's packing and micro-kernels. */
#include "tgm_rt.h"
#include "tgm_math.h"

#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef TGM_HAVE_CBLAS
#ifdef TGM_MKL_CBLAS_H /* MKL without a cblas.h (CMakeLists.txt) */
#include <mkl_cblas.h>
#else
#include <cblas.h>
#endif
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

/* The hot loops are compiled for AVX-512, AVX2 and the baseline and the best
 * one for the CPU picked at load time (CLONES: tgm_rt.h's TGM_CLONES); only
 * leaf functions (no parallel regions) are cloned. ISA_DISPATCH: the GEMM
 * micro-kernels are chosen at run time too (x86 with gcc or clang). Both off
 * with -DTGM_NO_ISA_DISPATCH. */
#define CLONES TGM_CLONES
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) &&                          \
    !defined(TGM_NO_ISA_DISPATCH)
#define ISA_DISPATCH 1
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

/*@uses matmul linear@*/
/* Parallel versions for whole tensors. */
static void to_f32_par(int dt, const void *x, float *y, int64_t n) {
  int64_t nb = (n + 4095) / 4096;
  OMP(parallel for schedule(static) if (n >= PAR_MIN))
  for (int64_t b = 0; b < nb; b++)
    to_f32(dt, (const char *)x + b * 4096 * (int64_t)esize(dt), y + b * 4096, tgm_min64(4096, n - b * 4096));
}
/*@end matmul linear@*/
/*@uses matmul@*/
static void from_f32_par(int dt, const float *x, void *y, int64_t n) {
  int64_t nb = (n + 4095) / 4096;
  OMP(parallel for schedule(static) if (n >= PAR_MIN))
  for (int64_t b = 0; b < nb; b++)
    from_f32(dt, x + b * 4096, (char *)y + b * 4096 * (int64_t)esize(dt), tgm_min64(4096, n - b * 4096));
}
/*@end matmul@*/

/*@uses matmul linear@*/
/* A malloc'd f32 copy of a floating tensor, or NULL. */
static float *f32_copy(int dt, const void *x, int64_t n) {
  float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  if (p)
    to_f32_par(dt, x, p, n);
  return p;
}
/*@end matmul linear@*/

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
    int64_t lo = c * 4096, m = tgm_min64(4096, n - lo);
    const char *xs = (const char *)x + lo * (int64_t)esize(dt_in);
    char *ys = (char *)y + lo * (int64_t)esize(dt_out);
    int fin = dt_in == TGM_F32 || is_half(dt_in), fout = dt_out == TGM_F32 || is_half(dt_out);
    if (fin && fout) { /* through f32: the fast, common casts */
      float buf[BLK];
      for (int64_t i0 = 0; i0 < m; i0 += BLK) {
        int64_t k = tgm_min64(BLK, m - i0);
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
    dropout_run(dt, x, y, b * 4096, tgm_min64(n, (b + 1) * 4096), t, s, k0, k1, s0, s1);
}
/*@end dropout@*/

/*@uses matmul attention attention_backward@*/
/* Offset of index i over n dims of sizes sz, strides st. */
static int64_t dims_off(int n, const int64_t *sz, const int64_t *st, int64_t i) {
  int64_t off = 0;
  for (int k = n - 1; k >= 0; k--) {
    off += (i % sz[k]) * st[k];
    i /= sz[k];
  }
  return off;
}
/*@end matmul attention attention_backward@*/
/*@uses matmul@*/
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
/*@end matmul@*/

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
    int64_t w = tgm_min64(BLK, D - c0);
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
 * run time on x86 (gcc and clang), with FMA where the target has it. A second
 * copy reads A's MR rows where they are (f32, row i at a + i lda, k
 * contiguous), so that a row-major f32 A needs no packing: the same
 * multiply-adds in the same order, so the same bits. */
#define MUL_ADD(x, y, z) ((x) * (y) + (z))
#define UKERNEL_BODY(MR, NR, MADD, AK, AI)                                                                             \
  float acc[MR][NR];                                                                                                   \
  UNROLL for (int i = 0; i < MR; i++) UNROLL for (int j = 0; j < NR; j++) acc[i][j] = 0.0f;                            \
  for (int64_t k = 0; k < kc; k++) {                                                                                   \
    const float *restrict ak = a + k * (AK), *restrict bk = b + k * NR;                                                \
    UNROLL for (int i = 0; i < MR; i++) {                                                                              \
      const float ai = ak[i * (AI)];                                                                                   \
      UNROLL for (int j = 0; j < NR; j++) acc[i][j] = MADD(ai, bk[j], acc[i][j]);                                      \
    }                                                                                                                  \
  }                                                                                                                    \
  UNROLL for (int i = 0; i < MR; i++) UNROLL for (int j = 0; j < NR; j++) c[i * NR + j] = acc[i][j];

typedef void (*ukernel_fn)(int64_t kc, const float *restrict a, const float *restrict b, float *restrict c);
typedef void (*ukernel_rows_fn)(int64_t kc, const float *restrict a, int64_t lda, const float *restrict b,
                                float *restrict c);
typedef struct Ukernel {
  int mr, nr;
  ukernel_fn fn;        /* A packed */
  ukernel_rows_fn rows; /* A's rows in place */
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
  UKERNEL_BODY(4, 8, GENERIC_MADD, 4, 1)
}
static void ukernel_generic_rows(int64_t kc, const float *restrict a, int64_t lda, const float *restrict b,
                                 float *restrict c) {
  UKERNEL_BODY(4, 8, GENERIC_MADD, 1, lda)
}

#ifdef ISA_DISPATCH
__attribute__((target("avx2,fma"))) static void ukernel_avx2(int64_t kc, const float *restrict a,
                                                             const float *restrict b, float *restrict c) {
  UKERNEL_BODY(5, 16, fmaf, 5, 1)
}
__attribute__((target("avx2,fma"))) static void ukernel_avx2_rows(int64_t kc, const float *restrict a, int64_t lda,
                                                                  const float *restrict b, float *restrict c) {
  UKERNEL_BODY(5, 16, fmaf, 1, lda)
}
__attribute__((target("avx512f,avx2,fma"))) static void ukernel_avx512(int64_t kc, const float *restrict a,
                                                                       const float *restrict b, float *restrict c) {
  UKERNEL_BODY(8, 32, fmaf, 8, 1)
}
__attribute__((target("avx512f,avx2,fma"))) static void ukernel_avx512_rows(int64_t kc, const float *restrict a,
                                                                            int64_t lda, const float *restrict b,
                                                                            float *restrict c) {
  UKERNEL_BODY(8, 32, fmaf, 1, lda)
}
#endif

/* Which micro-kernel: -1 the best this CPU runs, else 0 generic, 1 AVX2, 2
 * AVX-512 (tests force each one they can run; unread without ISA_DISPATCH). */
TGM_UNUSED static int gemm_isa = -1;

static Ukernel pick_ukernel(void) {
  static const Ukernel generic = {4, 8, ukernel_generic, ukernel_generic_rows, "generic"};
#ifdef ISA_DISPATCH
  static const Ukernel avx2 = {5, 16, ukernel_avx2, ukernel_avx2_rows, "avx2"},
                       avx512 = {8, 32, ukernel_avx512, ukernel_avx512_rows, "avx512"};
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
 * x NR sliver of B (L1 or L2: 64 KB at kc 512 and NR 32, streamed from L2
 * at 128 bytes per 16 FMAs). kc 512 rather than 256: a K of 512 (an MLP's
 * up projection, GPT-2's fc projection) is one slice, so B is packed once
 * per column panel, not again for each row block, and the sums skip the
 * slices' round trip: on a 2-core AMD EPYC (Zen 4, L1 32 KB) one thread
 * 1024 x 2048 x 512 with gelu 80/86 -> 92/91 GFLOP/s, with gelu's backward
 * 65/70 -> 79/77, mlp_blocks_cpu's step 148-160 -> 141-144 ms on 2
 * threads; on the GPU machine's 16 Sapphire Rapids cores (L1 48 KB) no
 * change beyond its noise (bench/results/h100_cpu16_session17_kc.txt). */
#ifndef GEMM_KC
#define GEMM_KC 512
#endif
/* kc where A is packed from its transpose (a weight gradient's x^T dy):
 * each row of A^T gives a packed panel only mr floats, so a panel's pack
 * reads kc rows of A^T, one line each. On the GPU machine's 16 Xeon cores
 * the weight gradients of mlp_blocks_cpu (2048 x 512 x 1024 and 512 x 2048
 * x 1024, pieces of 256 x 256) ran 3-7% faster at 256 than at 512 in four
 * rounds alternating with torch.mm, the same within the noise in two more;
 * the other shapes (A not transposed) were 0-10% slower at 256, so only
 * this one changes (bench/results/h100_gpu_session27.txt). */
#ifndef GEMM_KC_TA
#define GEMM_KC_TA 256
#endif
/* GEMMs of fewer multiply-adds than this run on one thread. */
#define GEMM_PAR_MIN 65536.0
#ifndef GEMM_MC
#define GEMM_MC 192
#endif
#ifndef GEMM_NC
#define GEMM_NC 3072
#endif
/* A piece whose K has several slices is one row block when that block's
 * scratch (its f32 sums, and its packed A) takes at most this many bytes
 * (gemm_pieces). */
#ifndef GEMM_BLOCK_MAX
#define GEMM_BLOCK_MAX (1 << 20)
#endif
/* With several K slices, the row blocks whose f32 sums take at most this
 * many bytes together run slice by slice (gemm_tiled's runs): B's slice is
 * packed once for them all. */
#ifndef GEMM_RUN_MAX
#define GEMM_RUN_MAX (8 << 20)
#endif

/* d[0, n) = s[0, n) for a packed panel's row: the micro-kernels' widths as
 * fixed-size copies (inlined), where a loop of runtime length became a call
 * to memcpy per row of 8 to 32 floats. */
static inline void copy_floats(float *restrict d, const float *restrict s, int64_t n) {
  switch (n) {
  case 32: memcpy(d, s, 32 * sizeof(float)); break;
  case 16: memcpy(d, s, 16 * sizeof(float)); break;
  case 8: memcpy(d, s, 8 * sizeof(float)); break;
  case 5: memcpy(d, s, 5 * sizeof(float)); break;
  case 4: memcpy(d, s, 4 * sizeof(float)); break;
  default:
    for (int64_t i = 0; i < n; i++)
      d[i] = s[i];
  }
}

#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define TGM_SHUFFLE 1
#endif
#endif
#ifdef TGM_SHUFFLE
typedef float v8f __attribute__((vector_size(32)));
#define SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#endif

/* dst[k * w + i] = S[i * ls + k] for i < n, k < kc: the packs that
 * transpose (A not transposed, B transposed: a linear layer's forward).
 * Where the compiler has vector shuffles, in 8 x 8 blocks transposed in
 * registers (unpack pairs of rows, then pairs of pairs, then halves), rows
 * read and written 32 bytes at a time; an element at a time had been ~7%
 * of mlp_blocks_cpu's training step (2 threads). (The block is written out
 * here, not in a function of its own: one without the clone's target would
 * not be inlined into it.) */
CLONES static void pack_t(const float *S, int64_t ls, int64_t n, int64_t kc, int w, float *restrict dst) {
  int64_t i = 0;
#ifdef TGM_SHUFFLE
  for (; i + 8 <= n; i += 8) {
    int64_t k = 0;
    for (; k + 8 <= kc; k += 8) {
      v8f r[8], t[8], u[8];
      for (int q = 0; q < 8; q++)
        memcpy(&r[q], S + (i + q) * ls + k, sizeof r[q]);
      for (int q = 0; q < 8; q += 2) {
        t[q] = SHUF(r[q], r[q + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[q + 1] = SHUF(r[q], r[q + 1], 2, 10, 3, 11, 6, 14, 7, 15);
      }
      for (int q = 0; q < 8; q += 4) {
        u[q] = SHUF(t[q], t[q + 2], 0, 1, 8, 9, 4, 5, 12, 13);
        u[q + 1] = SHUF(t[q], t[q + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        u[q + 2] = SHUF(t[q + 1], t[q + 3], 0, 1, 8, 9, 4, 5, 12, 13);
        u[q + 3] = SHUF(t[q + 1], t[q + 3], 2, 3, 10, 11, 6, 7, 14, 15);
      }
      for (int c = 0; c < 4; c++) {
        v8f lo = SHUF(u[c], u[c + 4], 0, 1, 2, 3, 8, 9, 10, 11), hi = SHUF(u[c], u[c + 4], 4, 5, 6, 7, 12, 13, 14, 15);
        memcpy(dst + (k + c) * w + i, &lo, sizeof lo);
        memcpy(dst + (k + c + 4) * w + i, &hi, sizeof hi);
      }
    }
    for (; k < kc; k++)
      for (int q = 0; q < 8; q++)
        dst[k * w + i + q] = S[(i + q) * ls + k];
  }
#endif
  for (; i < n; i++) {
    const float *src = S + i * ls;
    for (int64_t k = 0; k < kc; k++)
      dst[k * w + i] = src[k];
  }
}
#ifdef TGM_SHUFFLE
#undef SHUF
#endif

/* dst[k][mr] = A(i0 + i, k0 + k), rows past mv zero. A(i, k) = A[i lda + k],
 * or A[k lda + i] when transposed. */
static void pack_a(int ta, const float *A, int64_t lda, int64_t i0, int64_t k0, int64_t mv, int64_t kc, int mr,
                   float *restrict dst) {
  if (!ta) {
    pack_t(A + i0 * lda + k0, lda, mv, kc, mr, dst);
  } else {
    for (int64_t k = 0; k < kc; k++)
      copy_floats(dst + k * mr, A + (k0 + k) * lda + i0, mv);
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
      copy_floats(dst + k * nr, B + (k0 + k) * ldb + j0, nv);
  } else {
    pack_t(B + j0 * ldb + k0, ldb, nv, kc, nr, dst);
  }
  if (nv < nr)
    for (int64_t k = 0; k < kc; k++)
      for (int64_t j = nv; j < nr; j++)
        dst[k * nr + j] = 0;
}

/* The mv x nv corner of a micro-kernel's tile (row stride nr) into C (row
 * stride ldc): C = alpha tile (bt 0), C += alpha tile (bt 1), else C =
 * alpha tile + bt C. */
static inline void tile_store(float *restrict C, int64_t ldc, const float *restrict tile, int64_t nr, int64_t mv,
                              int64_t nv, float alpha, float bt) {
  for (int64_t i = 0; i < mv; i++) {
    float *restrict c = C + i * ldc;
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

/*@uses matmul linear@*/
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
  int64_t kcb = tgm_min64(K, GEMM_KC), ncb = tgm_min64((N + nr - 1) / nr * nr, GEMM_NC / nr * nr);
  int64_t mcb = tgm_min64((M + mr - 1) / mr * mr, GEMM_MC / mr * mr);
  float *bp = malloc(sizeof(float) * (size_t)(kcb * ncb)), *ap = malloc(sizeof(float) * (size_t)(mcb * kcb));
  if (!bp || !ap) {
    free(bp);
    free(ap);
    gemm_naive(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  int usepar = par && nthreads() > 1 && (double)M * (double)N * (double)K >= GEMM_PAR_MIN;
  (void)usepar;
  OMP(parallel if (usepar))
  {
    for (int64_t jc = 0; jc < N; jc += ncb) {
      int64_t nc = tgm_min64(ncb, N - jc), npan = (nc + nr - 1) / nr;
      for (int64_t pc = 0; pc < K; pc += kcb) {
        int64_t kc = tgm_min64(kcb, K - pc);
        const float bt = pc == 0 ? beta : 1.0f;
        OMP(for schedule(static))
        for (int64_t jp = 0; jp < npan; jp++)
          pack_b(tb, B, ldb, pc, jc + jp * nr, tgm_min64(nr, nc - jp * nr), kc, nr, bp + jp * kc * nr);
        for (int64_t ic = 0; ic < M; ic += mcb) {
          int64_t mc = tgm_min64(mcb, M - ic), mpan = (mc + mr - 1) / mr;
          OMP(for schedule(static))
          for (int64_t ip = 0; ip < mpan; ip++)
            pack_a(ta, A, lda, ic + ip * mr, pc, tgm_min64(mr, mc - ip * mr), kc, mr, ap + ip * kc * mr);
          OMP(for schedule(static))
          for (int64_t t = 0; t < npan * mpan; t++) {
            int64_t jp = t / mpan, ip = t % mpan;
            int64_t i0 = ic + ip * mr, j0 = jc + jp * nr, mv = tgm_min64(mr, M - i0), nv = tgm_min64(nr, N - j0);
            float tile[MAX_MR * MAX_NR];
            uk.fn(kc, ap + ip * kc * mr, bp + jp * kc * nr, tile);
            tile_store(C + i0 * ldc + j0, ldc, tile, nr, mv, nv, alpha, bt);
          }
        }
      }
    }
  }
  free(bp);
  free(ap);
}
/*@end matmul linear@*/

/* The grid of pr x pc pieces of an M x N x K GEMM's C (pr pc <= nt) whose
 * piece costs least: its multiply-adds plus its packing, pa a multiply-add
 * per element of its rows of A and pb per element of its columns of B;
 * pieces mr x nr multiples, none empty, and at least lo rows (columns)
 * where the rows (columns) are cut. (gemm_pieces, cblas_split.) */
static void gemm_grid(int nt, int64_t M, int64_t N, int64_t K, int64_t mr, int64_t nr, int64_t lo, double pa, double pb,
                      int *pr, int *pc) {
  double best = -1;
  *pr = *pc = 1;
  for (int r = 1; r <= nt; r++) {
    const int c = nt / r;
    const int64_t mp = ((M + r - 1) / r + mr - 1) / mr * mr, np = ((N + c - 1) / c + nr - 1) / nr * nr;
    if ((r > 1 && (mp * (r - 1) >= M || M / r < lo)) || (c > 1 && (np * (c - 1) >= N || N / c < lo)))
      continue; /* a piece would be empty, or too thin */
    const double cost = (double)mp * (double)np * (double)K + ((double)mp * pa + (double)np * pb) * (double)K;
    if (best < 0 || cost < best)
      best = cost, *pr = r, *pc = c;
  }
}

#ifdef TGM_HAVE_CBLAS
/* 1 = never use the CBLAS (tests compare the two). */
static int gemm_no_blas = 0;

#if defined(__GNUC__) && defined(__ELF__)
/* OpenBLAS's thread count, when the CBLAS is OpenBLAS (weak: absent otherwise). */
extern int openblas_get_num_threads(void) __attribute__((weak));
extern void openblas_set_num_threads(int n) __attribute__((weak));
/* The name of the kernels OpenBLAS runs. */
extern char *openblas_get_corename(void) __attribute__((weak));
#endif

/* With a CBLAS that -DTGM_BLAS=AUTO chose (not one asked for), the large
 * GEMMs go to it unless it is OpenBLAS and the built-in AVX-512 kernel runs
 * here, where the built-in GEMM was the faster in both places measured:
 * OpenBLAS 0.3.21 runs its AVX2 kernels ("Haswell") on AMD's AVX-512 EPYC
 * (Zen 4), where the built-in kernel took mlp_blocks_cpu's GEMM shapes
 * 1.6-1.8x faster (2 cores: 4.8-6.7 ms against 8.6-9.8); on the GPU
 * machine's 16 Sapphire Rapids cores OpenBLAS 0.3.26 runs its AVX-512
 * ("Cooperlake") kernels, and mlp_blocks_cpu's step took 33.2-35.4 ms with
 * them against 27.7-33.4 built in (four rounds in turn; the built-in GEMM's
 * epilogues run in its store loop where OpenBLAS's product needs another
 * pass over C; bench/results/h100_gpu_session28.txt call 7). MKL and BLIS,
 * not measured, keep them. (Tests set 0.) */
#ifdef TGM_CBLAS_AUTO
static int gemm_blas_auto = 1;
#else
static int gemm_blas_auto = 0;
#endif

/* Does the rule above keep the large GEMMs built in? */
static int cblas_slower(void) {
#if defined(__GNUC__) && defined(__ELF__)
  return gemm_blas_auto && openblas_get_corename && pick_ukernel().nr == 32; /* (32: the AVX-512 kernel) */
#else
  return 0;
#endif
}

/* cblas_sgemm in one thread pool: C cut into a grid of pr x pc rectangles,
 * one per OpenMP thread, each a one-thread call (OpenBLAS's count is set to
 * 1 for the call and given back after it, so the caller's own use of
 * OpenBLAS is untouched). A BLAS with threads of its own leaves them
 * spinning after each call, taking the cores from the OpenMP kernels that
 * follow. Each call packs its own rows of A and columns of B, so the grid
 * is the one whose piece costs least, its multiply-adds plus that packing
 * (about 8 a multiply-add per element; gemm_grid, as gemm_pieces'), at
 * least 64 rows and columns a piece. Rows alone or columns alone (the grid before)
 * had every piece pack the whole of the other operand: mlp_blocks_cpu on
 * 16 threads (H100 machine, OpenBLAS's AVX-512 kernels), 4 rounds
 * interleaved, medians 33.7/30.6/31.1/30.1 -> 28.5/30.9/30.0/30.4 ms, minima
 * 27.9/27.2/28.6/28.6 -> 26.2/26.3/27.4/28.4. */
static void cblas_split(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                        const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  int was = 1;
#if defined(__GNUC__) && defined(__ELF__)
  if (openblas_get_num_threads && openblas_set_num_threads && (was = openblas_get_num_threads()) != 1)
    openblas_set_num_threads(1);
#endif
  int pr, pc;
  gemm_grid(nthreads(), M, N, K, 1, 1, 64, 8.0, 8.0, &pr, &pc);
  const int64_t npieces = (int64_t)pr * pc;
  OMP(parallel for schedule(static) if (npieces > 1))
  for (int64_t q = 0; q < npieces; q++) {
    const int64_t m0 = M * (q / pc) / pr, m1 = M * (q / pc + 1) / pr, n0 = N * (q % pc) / pc, n1 = N * (q % pc + 1) / pc;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)(m1 - m0),
                (int)(n1 - n0), (int)K, alpha, A + (ta ? m0 : m0 * lda), (int)lda, B + (tb ? n0 * ldb : n0), (int)ldb,
                beta, C + m0 * ldc + n0, (int)ldc);
  }
#if defined(__GNUC__) && defined(__ELF__)
  if (was != 1)
    openblas_set_num_threads(was);
#else
  (void)was;
#endif
}
#endif

/*@uses matmul linear@*/
/* The f32 GEMM matmul and linear use: the CBLAS when built with it (and `par`:
 * cblas_split spreads it over the OpenMP threads, so calls from inside a
 * parallel loop use the built-in one), else the blocked one. */
static void sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc, int par) {
#ifdef TGM_HAVE_CBLAS
  if (par && !gemm_no_blas && !cblas_slower() && M > 0 && N > 0 && K > 0 && M <= INT_MAX && N <= INT_MAX &&
      K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX) {
    cblas_split(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#endif
  gemm_blocked(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, par);
}
/*@end matmul linear@*/

/* Per-GEMM work (multiply-adds) below which a batch of GEMMs is split across
 * threads by batch (each GEMM serial, built-in) rather than each GEMM
 * threaded; also done when there are many batches. */
#define GEMM_SMALL 4194304.0

/* GEMMs of fewer multiply-adds than this run built in even where a CBLAS is
 * linked: cut into a piece per thread (gemm_pieces), the built-in one took
 * GPT-block shapes (512 x 384 x 128 to 512 x 512 x 128) in 28-88 us on 16
 * Xeon cores against OpenBLAS's 67-151 (h100_cpu16_session12_gemm.txt);
 * at 2^30 multiply-adds the two were even. (Tests set it to 0.) */
#ifndef GEMM_CBLAS_MIN
#define GEMM_CBLAS_MIN 67108864.0
#endif

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
          int64_t m = tgm_min64(BLK, out - j0);
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

/* ra rows (stride ts) of na sums rounded to bf16 or f16, dt's, and back:
 * where a bf16/f16 model's own op would round them (gemm_epilogue). */
TGM_FN void tile_round(int dt, float *restrict t, int64_t ts, int64_t ra, int64_t na) {
  for (int64_t i = 0; i < ra; i++) {
    if (dt == TGM_BF16)
      SIMD for (int64_t j = 0; j < na; j++) t[i * ts + j] = tgm_round_bf16(t[i * ts + j]);
    else
      SIMD for (int64_t j = 0; j < na; j++) t[i * ts + j] = tgm_round_f16(t[i * ts + j]);
  }
}

/* Finishes mv x nv sums of one GEMM, rows m0.., columns j0.. (t, row
 * stride ts): the bias, the aux store, the activation, the residual, the
 * old C when accumulating, and the store into C, rounding where tgm_rt.h
 * says (tgm_gemm's order). Clobbers t. Called per micro-tile, so the loops are short: each
 * step is one vector loop a row (the activation one over the whole tile
 * where its rows are contiguous). */
CLONES static void gemm_epilogue(const tgm_gemm *g, const GemmOne *o, int64_t m0, int64_t j0, int64_t mv, int64_t nv,
                                 float *restrict t, int64_t ts) {
  const void *bias = g->bias, *res = o->res, *c = o->C;
  void *aux = o->aux, *y = o->C;
  const int64_t ldc = g->ldc;
#define ROWS for (int64_t i = 0; i < mv; i++)
  if (bias) {
#define M_(LD, ST) ROWS SIMD for (int64_t j = 0; j < nv; j++) t[i * ts + j] += LD(bias, j0 + j);
    DT_CASES(g->dt, M_)
#undef M_
  }
  const int64_t ra = nv == ts ? 1 : mv, na = nv == ts ? mv * nv : nv; /* the tile as rows of contiguous values */
  const int rnd = g->dt != TGM_F32 && !g->dact && g->act != TGM_ACT_NONE; /* bf16/f16 with an activation */
  if (rnd) /* the activation's input in C's dtype (as tgm_rt.h says) */
    tile_round(g->dt, t, ts, ra, na);
  if (g->dact) { /* an activation's backward: T times act'(aux), aux read; the form a constant in each loop (a
                   * run-time one left the loop scalar: control flow) */
#define M_(LD, ST)                                                                                                     \
  if (g->act == TGM_ACT_GELU_TANH)                                                                                     \
    ROWS SIMD for (int64_t j = 0; j < nv; j++) t[i * ts + j] *= tgm_gelu_grad(LD(aux, (m0 + i) * ldc + j0 + j), 1);    \
  else                                                                                                                 \
    ROWS SIMD for (int64_t j = 0; j < nv; j++) t[i * ts + j] *= tgm_gelu_grad(LD(aux, (m0 + i) * ldc + j0 + j), 0);
    DT_CASES(g->dt, M_)
#undef M_
  } else if (aux) {
#define M_(LD, ST) ROWS SIMD for (int64_t j = 0; j < nv; j++) ST(aux, (m0 + i) * ldc + j0 + j, t[i * ts + j]);
    DT_CASES(g->dt, M_)
#undef M_
  }
  switch (g->dact ? TGM_ACT_NONE : g->act) {
  case TGM_ACT_RELU:
    for (int64_t i = 0; i < ra; i++)
      SIMD for (int64_t j = 0; j < na; j++) t[i * ts + j] = t[i * ts + j] < 0 ? 0.0f : t[i * ts + j]; /* NaN stays NaN */
    break;
  case TGM_ACT_GELU:
    for (int64_t i = 0; i < ra; i++)
      SIMD for (int64_t j = 0; j < na; j++) t[i * ts + j] = tgm_gelu(t[i * ts + j], 0);
    break;
  case TGM_ACT_GELU_TANH:
    for (int64_t i = 0; i < ra; i++)
      SIMD for (int64_t j = 0; j < na; j++) t[i * ts + j] = tgm_gelu(t[i * ts + j], 1);
    break;
  default: break;
  }
  if (rnd && (res || g->accumulate)) /* the activation's result in C's dtype before the add */
    tile_round(g->dt, t, ts, ra, na);
  if (res) {
#define M_(LD, ST) ROWS SIMD for (int64_t j = 0; j < nv; j++) t[i * ts + j] += LD(res, (m0 + i) * ldc + j0 + j);
    DT_CASES(g->dt, M_)
#undef M_
  }
  if (g->accumulate) {
#define M_(LD, ST) ROWS SIMD for (int64_t j = 0; j < nv; j++) t[i * ts + j] += LD(c, (m0 + i) * ldc + j0 + j);
    DT_CASES(g->dt, M_)
#undef M_
  }
#define M_(LD, ST) ROWS SIMD for (int64_t j = 0; j < nv; j++) ST(y, (m0 + i) * ldc + j0 + j, t[i * ts + j]);
  DT_CASES(g->dt, M_)
#undef M_
#undef ROWS
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
      int64_t nv = tgm_min64(BLK, N - j0);
      for (int64_t j = 0; j < nv; j++)
        t[j] = 0;
      for (int64_t k = 0; k < K; k++) {
        float a = ldf(dt, o->A, ta ? k * lda + m : m * lda + k);
        for (int64_t j = 0; j < nv; j++)
          t[j] += a * ldf(dt, o->B, tb ? (j0 + j) * ldb + k : k * ldb + j0 + j);
      }
      gemm_epilogue(g, o, m, j0, 1, nv, t, nv);
    }
  }
}

/* GEMMs of few rows with B transposed (a linear layer's x W^T at a small
 * batch): C[m][n] = sum over k of A[m][k] B'[n][k], both rows contiguous in
 * k, so nothing is packed or allocated (the packed path packs the whole
 * weight, N x K, for a few rows: mlp3 at batch 32 took 0.16-0.17 ms on 16
 * cores that way, 0.09-0.10 ms this way; H100 machine). A tile of MR rows
 * by NR columns keeps MR x NR sums of DOT_VL lanes (k mod DOT_VL), adds
 * each one's lanes in a fixed tree, then the k past the last whole DOT_VL
 * in order: the same bits for any thread count and any of the tiles below.
 * Rows and columns past mv and nv read row 0 (their sums are dropped). */
#define DOT_VL 16
_Static_assert(DOT_VL == 16, "DOT_BODY's sum tree is written out for 16 lanes");
#ifndef DOT_MAX_M
#define DOT_MAX_M 64
#endif
#define DOT_COLS 64 /* columns a task: each row's epilogue runs on 64 at a time */
#define DOT_MAX_MR 4 /* the most rows of a tile below */
#define DOT_BODY(MR, NR, MADD, TREE)                                                                                   \
  const float *ar[MR], *br[NR];                                                                                        \
  UNROLL for (int i = 0; i < MR; i++) ar[i] = a + (i < mv ? i : 0) * lda;                                              \
  UNROLL for (int j = 0; j < NR; j++) br[j] = b + (j < nv ? j : 0) * ldb;                                              \
  float acc[MR][NR][DOT_VL];                                                                                           \
  UNROLL for (int i = 0; i < MR; i++) UNROLL for (int j = 0; j < NR; j++) SIMD for (int v = 0; v < DOT_VL; v++)        \
      acc[i][j][v] = 0.0f;                                                                                             \
  int64_t k = 0;                                                                                                       \
  for (; k + DOT_VL <= K; k += DOT_VL)                                                                                 \
    UNROLL for (int i = 0; i < MR; i++) UNROLL for (int j = 0; j < NR; j++) SIMD for (int v = 0; v < DOT_VL; v++)      \
        acc[i][j][v] = MADD(ar[i][k + v], br[j][k + v], acc[i][j][v]);                                                 \
  float sums[MR][NR];                                                                                                  \
  TREE(MR, NR)                                                                                                         \
  UNROLL for (int i = 0; i < MR; i++) UNROLL for (int j = 0; j < NR; j++) {                                            \
      float sum = sums[i][j];                                                                                          \
      for (int64_t kk = k; kk < K; kk++)                                                                               \
        sum = MADD(ar[i][kk], br[j][kk], sum);                                                                         \
      c[i * ldc + j] = sum;                                                                                            \
    }

/* The tree that adds a sum's 16 lanes: lane v and v + 8, then v and v + 4,
 * v and v + 2, v and v + 1; one sum at a time, each step one vector add. */
#define DOT_TREE_EACH(MR, NR)                                                                                          \
  UNROLL for (int i = 0; i < MR; i++) UNROLL for (int j = 0; j < NR; j++) {                                            \
      float *x = acc[i][j];                                                                                            \
      SIMD for (int v = 0; v < 8; v++) x[v] += x[v + 8];                                                               \
      SIMD for (int v = 0; v < 4; v++) x[v] += x[v + 4];                                                               \
      x[0] += x[2];                                                                                                    \
      x[1] += x[3];                                                                                                    \
      x[0] += x[1];                                                                                                    \
      sums[i][j] = x[0];                                                                                               \
    }

#ifdef TGM_SHUFFLE
/* The same tree for 16 sums at once (MR NR = 16), in whole vectors: at each
 * step two sums' halves side by side in one vector (16 sums -> 8 vectors
 * of two sums' 8 partial lanes -> 4 of four sums' 4 -> 2 -> 1 vector of
 * the 16 sums). The same additions as DOT_TREE_EACH, so the same bits, in
 * 15 adds and 30 shuffles where each sum had gone through the stack: mlp3
 * at batch 32 on the GPU machine's 16 Xeon cores 0.0728, 0.0582, 0.0706 ms
 * -> 0.0704, 0.0552, 0.0563 interleaved (bench/results/h100_gpu_session27.txt). */
typedef float v16f __attribute__((vector_size(64)));
#define SH16 __builtin_shufflevector
#define DOT_TREE16(MR, NR)                                                                                             \
  {                                                                                                                    \
    _Static_assert((MR) * (NR) == 16, "DOT_TREE16 adds 16 sums");                                                      \
    v16f t_[16], u_[8], w_[4], y_[2], s_;                                                                              \
    UNROLL for (int q = 0; q < 16; q++) memcpy(&t_[q], acc[q / NR][q % NR], sizeof t_[q]);                             \
    UNROLL for (int q = 0; q < 8; q++) u_[q] =                                                                         \
        SH16(t_[2 * q], t_[2 * q + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +                       \
        SH16(t_[2 * q], t_[2 * q + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);                  \
    UNROLL for (int q = 0; q < 4; q++) w_[q] =                                                                         \
        SH16(u_[2 * q], u_[2 * q + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +                     \
        SH16(u_[2 * q], u_[2 * q + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);                    \
    UNROLL for (int q = 0; q < 2; q++) y_[q] =                                                                         \
        SH16(w_[2 * q], w_[2 * q + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +                     \
        SH16(w_[2 * q], w_[2 * q + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);                    \
    s_ = SH16(y_[0], y_[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +                               \
         SH16(y_[0], y_[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);                                \
    memcpy(sums, &s_, sizeof s_);                                                                                      \
  }
#else
#define DOT_TREE16 DOT_TREE_EACH
#endif

typedef void (*dot_fn)(int64_t K, const float *restrict a, int64_t lda, int mv, const float *restrict b, int64_t ldb,
                       int nv, float *restrict c, int64_t ldc);
typedef struct DotKernel {
  int mr, nr;
  dot_fn fn;
} DotKernel;
static void dot_generic(int64_t K, const float *restrict a, int64_t lda, int mv, const float *restrict b, int64_t ldb,
                        int nv, float *restrict c, int64_t ldc) {
  DOT_BODY(1, 2, GENERIC_MADD, DOT_TREE_EACH)
}
#ifdef ISA_DISPATCH
__attribute__((target("avx2,fma"))) static void dot_avx2(int64_t K, const float *restrict a, int64_t lda, int mv,
                                                         const float *restrict b, int64_t ldb, int nv,
                                                         float *restrict c, int64_t ldc) {
  DOT_BODY(2, 2, fmaf, DOT_TREE_EACH)
}
__attribute__((target("avx512f,avx2,fma"))) static void dot_avx512(int64_t K, const float *restrict a, int64_t lda,
                                                                   int mv, const float *restrict b, int64_t ldb, int nv,
                                                                   float *restrict c, int64_t ldc) {
  DOT_BODY(DOT_MAX_MR, 4, fmaf, DOT_TREE16)
}
#endif
#ifdef SH16
#undef SH16
#endif
/* The tile for micro-kernel uk (the plan's: so the tests' choice reaches
 * it too). */
static DotKernel pick_dot(const char *uk) {
  DotKernel d = {1, 2, dot_generic};
#ifdef ISA_DISPATCH
  if (!strcmp(uk, "avx512"))
    d = (DotKernel){DOT_MAX_MR, 4, dot_avx512};
  else if (!strcmp(uk, "avx2"))
    d = (DotKernel){2, 2, dot_avx2};
#else
  (void)uk;
#endif
  return d;
}

/* One small-M GEMM by dot tiles: a task is MR rows by DOT_COLS columns
 * (tiles of NR), then each row's epilogue over them; tasks in parallel when
 * `par` and the work is large enough. */
static void gemm_dot(const tgm_gemm *g, const char *uk, const GemmOne *o, int par) {
  const DotKernel d = pick_dot(uk);
  const int64_t M = g->M, N = g->N, K = g->K, lda = g->lda, ldb = g->ldb;
  const int64_t mb = (M + d.mr - 1) / d.mr, nb = (N + DOT_COLS - 1) / DOT_COLS;
  const float *A = o->A, *B = o->B;
  (void)par;
  OMP(parallel for schedule(static) if (par && (double)M * (double)N * (double)K >= GEMM_PAR_MIN))
  for (int64_t t = 0; t < mb * nb; t++) {
    const int64_t i0 = t % mb * d.mr, j0 = t / mb * DOT_COLS;
    const int64_t mv = tgm_min64(d.mr, M - i0), nc = tgm_min64(DOT_COLS, N - j0);
    float tile[DOT_MAX_MR * DOT_COLS];
    for (int64_t j = 0; j < nc; j += d.nr)
      d.fn(K, A + i0 * lda, lda, (int)mv, B + (j0 + j) * ldb, ldb, (int)tgm_min64(d.nr, nc - j), tile + j, DOT_COLS);
    gemm_epilogue(g, o, i0, j0, mv, nc, tile, DOT_COLS);
  }
}

/* The blocking of one shape: the micro-kernel and the block sizes, cut down
 * to the problem (a small GEMM packs no more than it has). */
typedef struct GemmPlan {
  Ukernel uk;
  int64_t kcb, ncb, mcb, nk; /* nk: K slices */
  int64_t run;               /* rows of a run of row blocks (a multiple of mcb; gemm_tiled) */
  int direct;                /* too small to pack, or K = 0 */
  int dot;                   /* few rows of f32, B transposed: gemm_dot, nothing packed */
  int a_rows;                /* f32 A not transposed: its rows read in place, not packed */
} GemmPlan;

/* The rows of a plan's runs of row blocks for a piece of `rows` rows: all
 * of them with one K slice (nothing to sum between slices), else as many
 * whole blocks as GEMM_RUN_MAX holds the sums of (at least one). */
static int64_t gemm_run_max = GEMM_RUN_MAX; /* (tests shorten it) */
static void plan_run(GemmPlan *p, int64_t rows) {
  const int64_t most = gemm_run_max / (int64_t)sizeof(float) / p->ncb / p->mcb * p->mcb;
  p->run = p->nk == 1 ? rows : most < p->mcb ? p->mcb : most < rows ? most : rows;
}

static GemmPlan gemm_plan(const tgm_gemm *g) {
  GemmPlan p;
  memset(&p, 0, sizeof p);
  p.uk = pick_ukernel();
  p.direct = g->K == 0 || (double)g->M * (double)g->N * (double)g->K < GEMM_DIRECT;
  p.dot = !p.direct && g->dt == TGM_F32 && !g->ta && g->tb && g->M <= DOT_MAX_M && g->K >= DOT_VL;
  if (!p.direct && !p.dot) {
    int mr = p.uk.mr, nr = p.uk.nr;
    p.kcb = tgm_min64(g->K, g->ta ? GEMM_KC_TA : GEMM_KC);
    p.ncb = tgm_min64((g->N + nr - 1) / nr * nr, GEMM_NC / nr * nr);
    p.mcb = tgm_min64((g->M + mr - 1) / mr * mr, GEMM_MC / mr * mr);
    p.nk = (g->K + p.kcb - 1) / p.kcb;
    plan_run(&p, g->M);
    p.a_rows = g->dt == TGM_F32 && !g->ta;
  }
  return p;
}

/* A plan's scratch: packed A (mc x kc, unless its rows are read in place) and B (kc x nc) blocks, and the f32
 * sums of an mc x nc block between K slices (only when K has several), in
 * one buffer taken from a small pool and given back after the GEMM: a fresh
 * malloc of megabytes per GEMM was fresh pages each time, their faults and
 * the TLB shootdowns of freeing them (~5% of the MLP blocks' step on 16
 * cores). The pool is global (threads come and go with the thread count)
 * and holds at most GEMM_WS_POOL buffers, each as large as it was made. */
typedef struct GemmWs {
  float *ap, *bp, *acc;
  size_t cap; /* floats at ap */
} GemmWs;

#define GEMM_WS_POOL 64
static struct {
  float *p;
  size_t n;
} gemm_ws_pool[GEMM_WS_POOL];
static atomic_flag gemm_ws_lock = ATOMIC_FLAG_INIT;

static void gemm_ws_locked(int on) {
  if (!on)
    atomic_flag_clear_explicit(&gemm_ws_lock, memory_order_release);
  else
    while (atomic_flag_test_and_set_explicit(&gemm_ws_lock, memory_order_acquire))
      ;
}

static GemmWs gemm_ws_alloc(const GemmPlan *p) {
  GemmWs w = {NULL, NULL, NULL, 0};
  if (p->direct || p->dot)
    return w;
  const int64_t mr = p->uk.mr, run = (p->run + mr - 1) / mr * mr;
  const size_t na = p->a_rows ? 0 : (size_t)(p->mcb * p->kcb), nb = (size_t)(p->kcb * p->ncb),
               nc = p->nk > 1 ? (size_t)(run * p->ncb) : 0, n = na + nb + nc;
  float *old = NULL;
  gemm_ws_locked(1);
  for (int i = 0; i < GEMM_WS_POOL && !w.ap; i++)
    if (gemm_ws_pool[i].p && gemm_ws_pool[i].n >= n) {
      w.ap = gemm_ws_pool[i].p, w.cap = gemm_ws_pool[i].n;
      gemm_ws_pool[i].p = NULL;
    }
  for (int i = 0; i < GEMM_WS_POOL && !w.ap && !old; i++)
    if (gemm_ws_pool[i].p) { /* none large enough: one smaller goes, so the pool does not fill with them */
      old = gemm_ws_pool[i].p;
      gemm_ws_pool[i].p = NULL;
    }
  gemm_ws_locked(0);
  free(old);
  if (!w.ap && (w.ap = malloc(sizeof(float) * n)) != NULL)
    w.cap = n;
  if (!w.ap)
    return w;
  w.bp = w.ap + na;
  w.acc = nc ? w.bp + nb : NULL;
  return w;
}

static void gemm_ws_free(GemmWs *w) {
  if (!w->ap)
    return;
  gemm_ws_locked(1);
  for (int i = 0; i < GEMM_WS_POOL && w->ap; i++)
    if (!gemm_ws_pool[i].p) {
      gemm_ws_pool[i].p = w->ap, gemm_ws_pool[i].n = w->cap;
      w->ap = NULL;
    }
  gemm_ws_locked(0);
  free(w->ap); /* the pool is full */
  w->ap = w->bp = w->acc = NULL;
}

/* Scratch for the n threads of a parallel region, taken by the calling
 * thread before the region and given back after it, so that the workers
 * take no lock and wait at no barrier (with both, a GEMM's region on 16
 * cores took ~29 us longer than its slowest piece; a GPT block's GEMMs take
 * 20-250 us). The array is `stack` when n fits (64), else allocated; NULL
 * when that fails. An entry whose scratch could not be had has ap NULL. */
static GemmWs *gemm_ws_take(const GemmPlan *p, int n, GemmWs *stack) {
  GemmWs *ws = n <= 64 ? stack : calloc((size_t)n, sizeof(GemmWs));
  for (int i = 0; ws && i < n; i++)
    ws[i] = gemm_ws_alloc(p);
  return ws;
}

static void gemm_ws_give(GemmWs *ws, int n, const GemmWs *stack) {
  for (int i = 0; ws && i < n; i++)
    gemm_ws_free(&ws[i]);
  if (ws != stack)
    free(ws);
}

/* A rectangle of C: rows [m0, m1), columns [n0, n1). */
typedef struct GemmPiece {
  int64_t m0, m1, n0, n1;
} GemmPiece;

/* One GEMM (or the piece pc_ of it), packed and blocked: for each nc-column
 * panel, runs of mc-row blocks (p->run rows); for each run, the K slices in
 * order: pack B's kc x nc slice once, then for each of the run's row blocks
 * pack A's mc x kc slice and run the micro-tiles, summing slices in the
 * run's f32 sums; the last slice's micro-tiles go through the epilogue into
 * C. (Row blocks outside K slices had packed B's slice again for each
 * block: on one of the GPU machine's Xeon cores, 17-18% of a 1024 x 512 x
 * 2048 product's cycles went to packing B, 2.7-3.3% in runs;
 * bench/results/h100_gpu_session27.txt.) A row-major f32 A
 * is not packed: the micro-kernel reads its rows in place (a block's last
 * panel of fewer than mr rows excepted, which each thread that needs it
 * packs into its own buffer). Threads (when `par` and the work is large
 * enough) share the packing and split the micro-tiles, a thread's tiles
 * running down the row panels under one panel of B; every output's sum is
 * formed in the same order whatever the thread count or blocking. */
static void gemm_tiled(const tgm_gemm *g, const GemmPlan *p, const GemmWs *w, const GemmOne *o, int par,
                       const GemmPiece *pc_) {
  const Ukernel uk = p->uk;
  const int mr = uk.mr, nr = uk.nr;
  const int64_t M = pc_->m1, N = pc_->n1, K = g->K, kcb = p->kcb, ncb = p->ncb, mcb = p->mcb, nk = p->nk;
  const int a_rows = p->a_rows;
  int usepar = par && nthreads() > 1 && (double)M * (double)N * (double)K >= GEMM_PAR_MIN;
  (void)usepar;
  OMP(parallel if (usepar))
  {
    float edge[MAX_MR * GEMM_KC]; /* a_rows: the block's last panel when it has fewer than mr rows */
    for (int64_t jc = pc_->n0; jc < N; jc += ncb) {
      int64_t nc = tgm_min64(ncb, N - jc), npan = (nc + nr - 1) / nr;
      for (int64_t ir = pc_->m0; ir < M; ir += p->run) {
        const int64_t re = tgm_min64(M, ir + p->run);
        for (int64_t q = 0; q < nk; q++) {
          int64_t pc = q * kcb, kc = tgm_min64(kcb, K - pc);
          if (nk > 1 || ir == pc_->m0) {
            OMP(for schedule(static))
            for (int64_t jp = 0; jp < npan; jp++)
              pack_b_dt(g->dt, g->tb, o->B, g->ldb, pc, jc + jp * nr, tgm_min64(nr, nc - jp * nr), kc, nr,
                        w->bp + jp * kc * nr);
          }
          for (int64_t ic = ir; ic < re; ic += mcb) {
            int64_t mc = tgm_min64(mcb, re - ic), mpan = (mc + mr - 1) / mr;
            int edge_packed = 0;
            if (!a_rows) {
              OMP(for schedule(static))
              for (int64_t ip = 0; ip < mpan; ip++)
                pack_a_dt(g->dt, g->ta, o->A, g->lda, ic + ip * mr, pc, tgm_min64(mr, mc - ip * mr), kc, mr,
                          w->ap + ip * kc * mr);
            }
            OMP(for schedule(static))
            for (int64_t t = 0; t < npan * mpan; t++) {
              int64_t jp = t / mpan, ip = t % mpan;
              int64_t i0 = ic + ip * mr, j0 = jc + jp * nr, mv = tgm_min64(mr, M - i0), nv = tgm_min64(nr, N - j0);
              const float *bpan = w->bp + jp * kc * nr;
              float tile[MAX_MR * MAX_NR];
              float *acc = w->acc ? w->acc + ((i0 - ir) / mr * npan + jp) * mr * nr : NULL; /* the run's sums */
              if (!a_rows) {
                uk.fn(kc, w->ap + ip * kc * mr, bpan, tile);
              } else if (mv == mr) {
                uk.rows(kc, (const float *)o->A + i0 * g->lda + pc, g->lda, bpan, tile);
              } else {
                if (!edge_packed)
                  pack_a(0, o->A, g->lda, i0, pc, mv, kc, mr, edge);
                edge_packed = 1;
                uk.fn(kc, edge, bpan, tile);
              }
              if (q + 1 < nk) { /* not the last slice: into the run's sums */
                if (q == 0)
                  memcpy(acc, tile, sizeof(float) * (size_t)(mr * nr));
                else
                  SIMD for (int x = 0; x < mr * nr; x++) acc[x] += tile[x];
                continue;
              }
              if (q > 0)
                SIMD for (int x = 0; x < mr * nr; x++) tile[x] = acc[x] + tile[x];
              gemm_epilogue(g, o, i0, j0, mv, nv, tile, nr);
            }
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
  const GemmPiece all = {0, g->M, 0, g->N};
  if (p->dot)
    gemm_dot(g, p->uk.name, &o, par);
  else if (p->direct || !w->ap)
    gemm_direct(g, &o, par);
  else
    gemm_tiled(g, p, w, &o, par, &all);
}

/* 1 = one GEMM's threads share its packing (gemm_tiled's barriers); 0 = it is
 * cut into a piece per thread (gemm_pieces). (Benchmarks set it.) */
static int gemm_shared = 0;

/* Pieces per thread (gemm_pieces) for a GEMM of `work` multiply-adds over
 * nt threads. With one piece a thread the GEMM ends when its slowest thread
 * does: on the GPU machine's 16 Xeon cores (a VM) the busiest thread took
 * 1.13-1.36 times the mean's cycles on the MLP blocks' products, 1.10-1.24
 * on 8 threads, 1.03-1.16 on 4, the pieces being the same size
 * (bench/results/h100_gpu_session27.txt). Smaller pieces taken in turn from
 * a shared counter let the faster threads run more of them; each piece
 * packs its own rows of A and columns of B, so more pieces pack more. With
 * A read in place, six a thread; with A packed (transposed, or from
 * bf16/f16), whose packing costs more (a weight gradient's A^T 13-21% of
 * its cycles at 16 threads), four, and only from 8 threads. Against torch.mm
 * in turn on the same shapes (bench/results/h100_gpu_session28.txt, call
 * 5), as a share of torch's rate: 16 threads, three rounds, the four
 * products with A in place 0.86-1.02 -> 0.93-1.16, the two weight gradients
 * 0.79-0.89 -> 0.83-0.95; 8 threads 0.80-0.99 -> 0.89-1.08 and 0.78-0.87 ->
 * 0.86-0.87; 4 threads (A in place) 0.74-0.80 -> 0.85-0.90; mlp_blocks_cpu's
 * step with the built-in GEMM on 16 threads 33.7-35.3 -> 31.1-33.0 ms. Six
 * a thread on the weight gradients (call 4): 8 threads 0.79 and 0.87
 * (four: 0.85, 0.87), 4 threads 2-11% slower than one. Not under 4 threads
 * (this 2-core machine, three a thread: 0-7% slower), nor for pieces under
 * GEMM_PIECE_MIN multiply-adds (GPT blocks' 128 x 384 x 512 product on 16
 * threads, four a thread: 0.75 of the one-piece rate). gemm_over > 0
 * (tests; -DGEMM_OVER=n in a benchmark's build) forces it. cblas_split keeps
 * one piece a thread: OpenBLAS's pieces at 2, 4 or 6 a thread were slower
 * than at one in 49 of 54 shape-rounds on those shapes, by up to 25% (16 and
 * 8 threads, call 6). */
#define GEMM_PIECE_MIN 4194304.0
#ifndef GEMM_OVER
#define GEMM_OVER 0
#endif
static int gemm_over = GEMM_OVER;
static int gemm_per_thread(const GemmPlan *p, int nt, double work) {
  int f = gemm_over > 0 ? gemm_over : nt < 4 ? 1 : p->a_rows ? 6 : nt < 8 ? 1 : 4;
  while (gemm_over <= 0 && f > 1 && work < GEMM_PIECE_MIN * nt * f)
    f--;
  return f;
}

/* A packed GEMM over nt threads as rectangles of C (pieces), each run
 * serially by one thread with its own scratch: no barriers, at the price of
 * packing some of B (or A) more than once. With one piece a thread (at
 * most nt), thread i runs piece i; with more (gemm_per_thread), the
 * threads take them in turn from a shared counter. The grid (pr x pc
 * pieces) is the one whose piece costs least: its multiply-adds plus the
 * packing it does (a transposing pack of B or A about 16 times a
 * multiply-add's cost per element, a copy 4). Each output's sum is formed
 * as in one piece: the same bits for any grid and any thread taking it.
 * Returns 0 when the plan's scratch cannot be had. */
static int gemm_pieces(const tgm_gemm *g, const GemmPlan *p, int nt) {
  const int64_t mr = p->uk.mr, nr = p->uk.nr, M = g->M, N = g->N, K = g->K;
  const int per = gemm_per_thread(p, nt, (double)M * (double)N * (double)K);
  int pr, pcn;
  gemm_grid(nt * per, M, N, K, mr, nr, 1, p->a_rows ? 0.0 : g->ta ? 4.0 : 16.0, g->tb ? 16.0 : 4.0, &pr, &pcn);
  const int npieces = pr * pcn, nw = npieces < nt ? npieces : nt;
  const int64_t mp = ((M + pr - 1) / pr + mr - 1) / mr * mr, np = ((N + pcn - 1) / pcn + nr - 1) / nr * nr;
  GemmPlan sp = *p; /* the same K slices; blocks no larger than a piece */
  sp.ncb = tgm_min64(p->ncb, np);
  /* With several K slices, a piece whose block scratch fits GEMM_BLOCK_MAX is one row block. Made
   * when each row block packed B's slice again (runs now pack it once a run either way), it still
   * keeps the piece's B panels under all its rows rather than a short last block: H100 machine, 16
   * threads, against torch.mm in turn: 1024 x 512 x 2048 (pieces 1024 x 32, six row blocks before)
   * 1.04 -> 1.13 of torch's rate with B transposed, 0.76 -> 1.01 without; dW's 2048 x 512 x 1024
   * (pieces 256 x 256) 0.74 -> 0.82 (bench/results/h100_gpu_session21.txt). */
  const int64_t block = mp * (sp.ncb + (p->a_rows ? 0 : p->kcb)) * (int64_t)sizeof(float);
  sp.mcb = p->nk > 1 && block <= GEMM_BLOCK_MAX ? mp : tgm_min64(p->mcb, mp);
  plan_run(&sp, mp);
  /* every thread's scratch had before any piece runs, so a failure leaves C as it was */
  GemmWs stack[64], *ws = gemm_ws_take(&sp, nw, stack);
  int ok = ws != NULL;
  for (int i = 0; ok && i < nw; i++)
    ok = ws[i].ap != NULL;
  if (ok) {
    atomic_int next = 0;    /* the next piece to take, when there are more pieces than threads */
    const int shared = npieces > nw; /* (a grid may have fewer pieces than asked: one a thread) */
    OMP(parallel num_threads(nw))
    {
#ifdef _OPENMP
      const int id = omp_get_thread_num(), team = omp_get_num_threads(); /* (the team may be smaller than asked) */
#else
      const int id = 0, team = 1;
#endif
      const GemmOne o = gemm_one(g, 0);
#define NEXT_PIECE(q) (shared ? atomic_fetch_add_explicit(&next, 1, memory_order_relaxed) : (q) + team)
      for (int q = shared ? NEXT_PIECE(0) : id; q < npieces; q = NEXT_PIECE(q)) {
        GemmPiece pc = {q / pcn * mp, tgm_min64(M, (q / pcn + 1) * mp), q % pcn * np, tgm_min64(N, (q % pcn + 1) * np)};
        if (pc.m0 < pc.m1 && pc.n0 < pc.n1)
          gemm_tiled(g, &sp, &ws[id], &o, 0, &pc);
      }
#undef NEXT_PIECE
    }
  }
  gemm_ws_give(ws, nw, stack);
  return ok;
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
      (g->residual && g->residual == g->C) || cblas_slower())
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
        int64_t nv = tgm_min64(BLK, g->N - j0);
        memcpy(t, (const float *)o.C + m * g->ldc + j0, sizeof(float) * (size_t)nv);
        gemm_epilogue(g, &o, m, j0, 1, nv, t, nv);
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
  if (g->dact && (!g->aux || (g->act != TGM_ACT_GELU && g->act != TGM_ACT_GELU_TANH)))
    return 0;
  if (g->bgrad && g->batch > 1)
    return 0;
  if (g->lda < (g->ta ? g->M : g->K) || g->ldb < (g->tb ? g->K : g->N) || g->ldc < g->N)
    return 0;
  if (g->M == 0 || g->N == 0 || g->batch == 0)
    return 1; /* nothing to write */
  if (!g->C || (g->K > 0 && (!g->A || !g->B)) || (g->batch > 1 && g->sc == 0))
    return 0;
  return 1;
}

/* g->bgrad[m] = sum over k of op(A)[m, k], in double, stored through f32
 * (as the generated column sums store theirs): tiles
 * of 64 rows of op(A) over the threads, each summed in k order by one thread
 * (the same bits for any thread count); op(A) stored transposed ([K, M], a
 * weight gradient's dy) is read a row of the tile at a time. */
static void gemm_bgrad(const tgm_gemm *g) {
  const int64_t M = g->M, K = g->K, lda = g->lda;
  const void *A = g->A;
  void *y = g->bgrad;
  OMP(parallel for schedule(static) if (M * K >= PAR_MIN))
  for (int64_t m0 = 0; m0 < M; m0 += 64) {
    const int64_t nm = tgm_min64(64, M - m0);
    double acc[64] = {0};
#define M_(LD, ST)                                                                                                     \
  if (g->ta && nm == 64) { /* a whole tile of contiguous rows: its sums stay in registers */                           \
    for (int64_t k = 0; k < K; k++)                                                                                    \
      SIMD for (int64_t j = 0; j < 64; j++) acc[j] += LD(A, k * lda + m0 + j);                                         \
  } else {                                                                                                             \
    for (int64_t k = 0; k < K; k++)                                                                                    \
      SIMD for (int64_t j = 0; j < nm; j++) acc[j] += LD(A, g->ta ? k * lda + m0 + j : (m0 + j) * lda + k);             \
  }                                                                                                                    \
  for (int64_t j = 0; j < nm; j++)                                                                                     \
    ST(y, m0 + j, (float)acc[j]);
    DT_CASES(g->dt, M_)
#undef M_
  }
}

int tgm_cpu_gemm(const tgm_gemm *g0) {
  if (!gemm_args_ok(g0))
    return -1;
  const tgm_gemm fold = tgm_gemm_folded(g0), *g = &fold;
  if (g->bgrad && g->batch == 1)
    gemm_bgrad(g);
  if (g->M == 0 || g->N == 0 || g->batch == 0)
    return 0;
  const GemmPlan p = gemm_plan(g);
  const double work = (double)g->M * (double)g->N * (double)g->K; /* multiply-adds per batch element */
  /* Small GEMMs of a batch run one per thread (each serial) rather than each
   * threaded, as do many; the blocking is the same either way, so are the
   * bits. The CBLAS (f32) takes the large ones (GEMM_CBLAS_MIN) when it can. */
  const int small = g->batch > 1 && work < GEMM_SMALL;
#ifdef TGM_HAVE_CBLAS
  int nested = 0;
#ifdef _OPENMP
  nested = omp_in_parallel();
#endif
  if (!p.direct && !p.dot && !small && !nested && work >= GEMM_CBLAS_MIN && gemm_cblas(g))
    return 0;
#endif
  if (g->batch > 1 && nthreads() > 1 && (small || g->batch >= 4 * nthreads())) {
    /* scratch for the threads that get a GEMM (one without runs direct) */
    const int nt = nthreads(), nw = (int)tgm_min64(nt, g->batch);
    GemmWs stack[64], *ws = gemm_ws_take(&p, nw, stack);
    OMP(parallel num_threads(nt))
    {
#ifdef _OPENMP
      const int id = omp_get_thread_num();
#else
      const int id = 0;
#endif
      const GemmWs none = {NULL, NULL, NULL, 0};
      OMP(for schedule(static))
      for (int64_t b = 0; b < g->batch; b++)
        gemm_run(g, &p, ws && id < nw ? &ws[id] : &none, b, 0);
    }
    gemm_ws_give(ws, nw, stack);
    return 0;
  }
  if (g->batch == 1 && !gemm_shared && !p.direct && !p.dot && nthreads() > 1 && work >= GEMM_PAR_MIN &&
      gemm_pieces(g, &p, nthreads()))
    return 0;
  GemmWs w = gemm_ws_alloc(&p);
  for (int64_t b = 0; b < g->batch; b++)
    gemm_run(g, &p, &w, b, 1);
  gemm_ws_free(&w);
  return 0;
}

/*@uses attention attention_backward@*/
/* ---------------------------------------------------------------- attention */

/* Attention, forward and backward, works on blocks of ATT_QB query rows of
 * one (batch, head) and holds only their scores, [ATT_QB, Tk] f32 per
 * thread, never Tq x Tk. A (batch, head)'s k and v are packed for the GEMM
 * micro-kernels once (att_pack) and shared by its blocks, and the GEMMs
 * (att_gemm) read q and dy in their dtype: no f32 copies. The block size is
 * fixed rather than a share of the threads, and a GEMM's sums do not depend
 * on its M, N or threads, so every row's results, and the order in which dk
 * and dv add the blocks, are the same for any thread count. Operands and
 * results are strided views (tgm_view): every GEMM takes their row strides
 * and every batch index its own offset in each, so the bits do not depend on
 * the layout either. */
#define ATT_QB 128

/* An operand or result of an attention call as the kernels walk it: its
 * elements, its row stride, and its strides over the call's batch dims (the
 * result's; 0 along those it broadcasts over). p NULL: absent. */
typedef struct AttOp {
  char *p;
  int64_t ld, st[TGM_MAXRANK];
} AttOp;

/* View v (NULL, or p NULL: absent) over the nb batch dims of the result,
 * right-aligned as NumPy broadcasts (a size-1 or missing dim repeats). A
 * single row's stride is taken as its length (the view may give any). */
static AttOp att_op(const tgm_view *v, int nb) {
  AttOp o = {NULL, 0, {0}};
  if (!v || !v->p)
    return o;
  const int r = v->rank;
  o.p = v->p;
  o.ld = v->shape[r - 2] > 1 ? v->st[r - 2] : v->shape[r - 1];
  for (int k = 0; k < nb; k++) {
    int kk = k - (nb - (r - 2));
    o.st[k] = kk < 0 || v->shape[kk] == 1 ? 0 : v->st[kk];
  }
  return o;
}

/* One attention call: the sizes, the batch dims (the result's, sy: batch
 * index t of an operand is dims_off(nb, sy, st, t) elements past its p), the
 * operands and results, and the micro-kernel. y is the forward's result or
 * the backward's dy; dq, dk, dv are the backward's results. */
typedef struct Att {
  int dt, nb, causal;
  float scale;
  const int64_t *sy;
  int64_t Tq, D, Tk, Dv, nbatch;
  AttOp q, k, v, y, dq, dk, dv;
  Ukernel uk;
} Att;

static Att att_init(int dt, const tgm_view *q, const tgm_view *k, const tgm_view *v, const tgm_view *y,
                    const tgm_view *dq, const tgm_view *dk, const tgm_view *dv, int causal, double scale) {
  const int nb = y->rank - 2;
  Att a = {.dt = dt, .nb = nb, .causal = causal, .scale = (float)scale, .sy = y->shape, .Tq = q->shape[q->rank - 2],
           .D = q->shape[q->rank - 1], .Tk = k->shape[k->rank - 2], .Dv = v->shape[v->rank - 1], .nbatch = 1,
           .q = att_op(q, nb), .k = att_op(k, nb), .v = att_op(v, nb), .y = att_op(y, nb), .dq = att_op(dq, nb),
           .dk = att_op(dk, nb), .dv = att_op(dv, nb), .uk = pick_ukernel()};
  for (int d = 0; d < nb; d++)
    a.nbatch *= a.sy[d];
  return a;
}

/* Row i of batch index t of operand o (present). */
static char *att_at(const Att *a, const AttOp *o, int64_t t, int64_t i) {
  return o->p + (dims_off(a->nb, a->sy, o->st, t) + i * o->ld) * (int64_t)esize(a->dt);
}

/* rows x cols elements of es bytes (row stride ld) set to zero bits: 0 in
 * every floating dtype. */
static void att_zero(void *p, int64_t ld, int64_t rows, int64_t cols, size_t es) {
  for (int64_t r = 0; r < rows; r++)
    memset((char *)p + (size_t)(r * ld) * es, 0, es * (size_t)cols);
}

/* rows x cols f32 sums (row stride fld) rounded to dt into the rows of dst
 * (row stride ld): a row at a time, as dst's rows need not be adjacent. */
static void att_round(int dt, const float *f, int64_t fld, void *dst, int64_t ld, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++)
    from_f32(dt, f + r * fld, (char *)dst + r * ld * (int64_t)esize(dt), cols);
}

/* The keys query row i sees: all, or (causal) the first min(i + 1, Tk). */
static int64_t att_keys(const Att *a, int64_t i) { return a->causal ? tgm_min64(i + 1, a->Tk) : a->Tk; }

/* The row stride of a score block: Tk rounded up to 16 floats, so that with
 * att_alloc every row starts 64-byte aligned and its vectorised loops split
 * the same way in every thread's buffer. */
static int64_t att_ld(int64_t Tk) { return (Tk + 15) / 16 * 16; }

/* n floats, 64-byte aligned (free() frees them), or NULL. */
static float *att_alloc(int64_t n) {
  return aligned_alloc(64, (sizeof(float) * (size_t)(n > 0 ? n : 1) + 63) / 64 * 64);
}

/* An operand B [K, N] packed for the micro-kernel (nr wide) as gemm_blocked
 * packs it, but whole: column panels of GEMM_NC / nr * nr, each in slices of
 * GEMM_KC rows (slice (jc, pc) at K jc + pc roundup(min(panel, N - jc), nr)),
 * each slice nr-wide slivers [kc][nr] zero-padded; K roundup(N, nr) floats. */
static int64_t att_pksize(int64_t K, int64_t N, int nr) { return K * ((N + nr - 1) / nr * nr); }

/* Packs op(B) [K, N] of dtype dt (tb: B stored [N, K]; row stride ldb) into
 * dst (att_pksize floats). */
static void att_pack(int dt, int tb, const void *B, int64_t ldb, int64_t K, int64_t N, int nr, float *dst, int par) {
  const int64_t ncb = GEMM_NC / nr * nr, nsl = (N + nr - 1) / nr;
  (void)par;
  OMP(parallel for schedule(static) if (par && K * N >= PAR_MIN))
  for (int64_t jp = 0; jp < nsl; jp++) {
    const int64_t j0 = jp * nr, jc = j0 / ncb * ncb, ncr = (tgm_min64(ncb, N - jc) + nr - 1) / nr * nr;
    for (int64_t pc = 0; pc < K; pc += GEMM_KC) {
      int64_t kc = tgm_min64(GEMM_KC, K - pc);
      pack_b_dt(dt, tb, B, ldb, pc, j0, tgm_min64(nr, N - j0), kc, nr, dst + K * jc + pc * ncr + (j0 - jc) * kc);
    }
  }
}

/* k and v of one batch index packed for the micro-kernel (each query block
 * reuses them): k^T [D, Tk] (S's B), k [Tk, D] (dq's), v [Tk, Dv] (y's), v^T
 * [Dv, Tk] (dP's); NULL where not needed. ko, vo: the offsets of the k and v
 * packed there (-1: none yet). */
typedef struct AttPk {
  float *kt, *k, *v, *vt, *mem;
  int64_t ko, vo;
} AttPk;

/* An AttPk with the packings named (1 wanted), in one att_alloc (pk.mem NULL:
 * no memory). */
static AttPk att_pk_alloc(const Att *a, int kt, int k, int v, int vt) {
  const int nr = a->uk.nr;
  const int64_t n[4] = {kt ? att_pksize(a->D, a->Tk, nr) : 0, k ? att_pksize(a->Tk, a->D, nr) : 0,
                        v ? att_pksize(a->Tk, a->Dv, nr) : 0, vt ? att_pksize(a->Dv, a->Tk, nr) : 0};
  AttPk pk = {.ko = -1, .vo = -1};
  pk.mem = att_alloc(n[0] + n[1] + n[2] + n[3]);
  if (pk.mem) {
    pk.kt = kt ? pk.mem : NULL;
    pk.k = k ? pk.mem + n[0] : NULL;
    pk.v = v ? pk.mem + n[0] + n[1] : NULL;
    pk.vt = vt ? pk.mem + n[0] + n[1] + n[2] : NULL;
  }
  return pk;
}

/* Packs what pk holds for batch index t, unless it holds it already (k and v
 * broadcast over a batch dim are packed once). */
static void att_pk_for(const Att *a, AttPk *pk, int64_t t, int par) {
  const int64_t Tk = a->Tk, D = a->D, Dv = a->Dv;
  const int64_t ko = dims_off(a->nb, a->sy, a->k.st, t), vo = dims_off(a->nb, a->sy, a->v.st, t);
  const int nr = a->uk.nr;
  const char *k = att_at(a, &a->k, t, 0), *v = att_at(a, &a->v, t, 0);
  if (ko != pk->ko && pk->kt)
    att_pack(a->dt, 1, k, a->k.ld, D, Tk, nr, pk->kt, par);
  if (ko != pk->ko && pk->k)
    att_pack(a->dt, 0, k, a->k.ld, Tk, D, nr, pk->k, par);
  if (vo != pk->vo && pk->v)
    att_pack(a->dt, 0, v, a->v.ld, Tk, Dv, nr, pk->v, par);
  if (vo != pk->vo && pk->vt)
    att_pack(a->dt, 1, v, a->v.ld, Dv, Tk, nr, pk->vt, par);
  pk->ko = ko;
  pk->vo = vo;
}

/* C [M, N] = alpha op(A) B + beta C: A of dtype adt ([M, K] with row stride
 * lda, or ta: stored [K, M]), B the first K rows and N columns of an operand
 * [K0, N0] packed by att_pack, C f32. gemm_blocked's blocks and micro-kernel:
 * an element's sum depends on K only. `ap` is GEMM_MC x GEMM_KC scratch;
 * `par` lets the threads share the work. */
static void att_gemm(const Ukernel *uk, int adt, int ta, const void *A, int64_t lda, const float *B, int64_t K0,
                     int64_t N0, int64_t M, int64_t N, int64_t K, float alpha, float beta, float *C, int64_t ldc,
                     float *ap, int par) {
  if (M <= 0 || N <= 0)
    return;
  if (K <= 0) { /* no terms: C = beta C */
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++)
        C[i * ldc + j] = beta == 0 ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  const int mr = uk->mr, nr = uk->nr;
  const int64_t ncb = GEMM_NC / nr * nr, mcb = tgm_min64((M + mr - 1) / mr * mr, GEMM_MC / mr * mr);
  int usepar = par && nthreads() > 1 && (double)M * (double)N * (double)K >= GEMM_PAR_MIN;
  (void)usepar;
  OMP(parallel if (usepar))
  {
    for (int64_t jc = 0; jc < N; jc += ncb) {
      int64_t npan = (tgm_min64(ncb, N - jc) + nr - 1) / nr, ncr = (tgm_min64(ncb, N0 - jc) + nr - 1) / nr * nr;
      for (int64_t pc = 0; pc < K; pc += GEMM_KC) {
        int64_t kc = tgm_min64(GEMM_KC, K - pc), kf = tgm_min64(GEMM_KC, K0 - pc);
        const float *bp = B + K0 * jc + pc * ncr;
        const float bt = pc == 0 ? beta : 1.0f;
        for (int64_t ic = 0; ic < M; ic += mcb) {
          int64_t mc = tgm_min64(mcb, M - ic), mpan = (mc + mr - 1) / mr;
          OMP(for schedule(static))
          for (int64_t ip = 0; ip < mpan; ip++)
            pack_a_dt(adt, ta, A, lda, ic + ip * mr, pc, tgm_min64(mr, mc - ip * mr), kc, mr, ap + ip * kc * mr);
          OMP(for schedule(static))
          for (int64_t t = 0; t < npan * mpan; t++) {
            int64_t jp = t / mpan, ip = t % mpan;
            int64_t i0 = ic + ip * mr, j0 = jc + jp * nr, mv = tgm_min64(mr, M - i0), nv = tgm_min64(nr, N - j0);
            float tile[MAX_MR * MAX_NR];
            uk->fn(kc, ap + ip * kc * mr, bp + jp * kf * nr, tile);
            tile_store(C + i0 * ldc + j0, ldc, tile, nr, mv, nv, alpha, bt);
          }
        }
      }
    }
  }
}
/*@end attention attention_backward@*/

/*@uses attention@*/
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

/* Softmax of the first n scores of row r in place, the rest of its w columns
 * (masked) set to 0; returns the row's log-sum-exp, max + log(sum exp(s -
 * max)) (the sum in double; NaN when every score is -inf, as y then is). */
CLONES static float att_softmax_row(float *restrict r, int64_t n, int64_t w) {
  float m = run_max(r, n);
  double sum = 0;
  SIMD_SUM(sum) for (int64_t j = 0; j < n; j++) {
    float e = tgm_exp(r[j] - m);
    r[j] = e;
    sum += (double)e;
  }
  float inv = (float)(1.0 / sum);
  SIMD for (int64_t j = 0; j < n; j++) r[j] *= inv;
  for (int64_t j = n; j < w; j++)
    r[j] = 0;
  return (float)((double)m + log(sum));
}

/* Without scratch: query rows [i0, i0 + nr) of batch index b on the
 * operands as stored (lse NULL: not wanted; y's p NULL: not wanted): per row
 * the max and the sum of exp, then y accumulated in chunks of 64 columns on
 * the stack (scores recomputed). */
static void attention_noscratch(const Att *a, int64_t b, int64_t i0, int64_t nr, float *lse) {
  const int dt = a->dt;
  const int64_t Tk = a->Tk, D = a->D, Dv = a->Dv, lk = a->k.ld, lv = a->v.ld;
  const float scale = a->scale;
  const char *k = att_at(a, &a->k, b, 0), *v = att_at(a, &a->v, b, 0);
  for (int64_t i = 0; i < nr; i++) {
    const char *q = att_at(a, &a->q, b, i0 + i);
    char *y = a->y.p ? att_at(a, &a->y, b, i0 + i) : NULL;
    int64_t n = a->causal ? tgm_min64(i0 + i + 1, Tk) : Tk;
    float m = -INFINITY;
    double sum = 0;
    for (int pass = 0; pass < 2; pass++)
      for (int64_t j = 0; j < n; j++) {
        float d = 0;
        for (int64_t e = 0; e < D; e++)
          d += ldf(dt, q, e) * ldf(dt, k, j * lk + e);
        if (pass)
          sum += (double)tgm_exp(scale * d - m);
        else
          m = tgm_max(m, scale * d);
      }
    if (lse)
      lse[b * a->Tq + i0 + i] = (float)((double)m + log(sum));
    for (int64_t e0 = 0; y && e0 < Dv; e0 += 64) {
      float acc[64] = {0};
      int64_t w = tgm_min64(64, Dv - e0);
      for (int64_t j = 0; j < n; j++) {
        float d = 0;
        for (int64_t e = 0; e < D; e++)
          d += ldf(dt, q, e) * ldf(dt, k, j * lk + e);
        float p = (float)(tgm_exp(scale * d - m) / sum);
        for (int64_t e = 0; e < w; e++)
          acc[e] += p * ldf(dt, v, j * lv + e0 + e);
      }
      for (int64_t e = 0; e < w; e++)
        stval(dt, y, e0 + e, acc[e]);
    }
  }
}

/* The scratch of one thread of the forward (floats, from att_alloc): the
 * scores, ATT_QB x att_ld(Tk); att_gemm's; and y's block in f32 when y is
 * wanted in bf16/f16. */
static int64_t att_fwd_ws(const Att *a) {
  return ATT_QB * att_ld(a->Tk) + GEMM_MC * GEMM_KC + (a->y.p && a->dt != TGM_F32 ? ATT_QB * a->Dv : 0);
}

/* Query rows [i0, i0 + ATT_QB) of batch index b: S = scale q k^T over the
 * keys any of them sees (causal: the first min(i0 + bq, Tk)), each row's
 * softmax in place and its lse, then y = P v (lse NULL, y's p NULL: not
 * wanted; f32 y straight into its rows, bf16/f16 through ws, rounded once).
 * pk holds b's k^T and v, ws is att_fwd_ws's scratch (either NULL: the
 * no-scratch rows); `par` lets the GEMMs and the rows use the threads, with
 * the same results. */
static void att_fwd_block(const Att *a, int64_t b, int64_t i0, const AttPk *pk, float *ws, float *lse, int par) {
  const int64_t Tq = a->Tq, Tk = a->Tk, D = a->D, Dv = a->Dv, ld = att_ld(Tk), bq = tgm_min64(ATT_QB, Tq - i0);
  if (!pk || !ws) {
    attention_noscratch(a, b, i0, bq, lse);
    return;
  }
  const int64_t n = a->causal ? tgm_min64(i0 + bq, Tk) : Tk;
  float *s = ws, *ap = s + ATT_QB * ld, *l = lse ? lse + b * Tq + i0 : NULL;
  att_gemm(&a->uk, a->dt, 0, att_at(a, &a->q, b, i0), a->q.ld, pk->kt, D, Tk, bq, n, D, a->scale, 0.0f, s, ld, ap,
           par);
  OMP(parallel for schedule(static) if (par && bq * n >= PAR_MIN))
  for (int64_t r = 0; r < bq; r++) {
    float lr = att_softmax_row(s + r * ld, att_keys(a, i0 + r), n);
    if (l)
      l[r] = lr;
  }
  if (!a->y.p)
    return;
  char *y = att_at(a, &a->y, b, i0);
  const int f32 = a->dt == TGM_F32;
  float *fy = f32 ? (float *)y : ap + GEMM_MC * GEMM_KC;
  att_gemm(&a->uk, TGM_F32, 0, s, ld, pk->v, Tk, Dv, bq, Dv, n, 1.0f, 0.0f, fy, f32 ? a->y.ld : Dv, ap, par);
  if (!f32)
    att_round(a->dt, fy, Dv, y, a->y.ld, bq, Dv);
}

void tgm_cpu_attention(int dt, const tgm_view *q, const tgm_view *k, const tgm_view *v, const tgm_view *y, int causal,
                       double scale, float *lse) {
  Att a = att_init(dt, q, k, v, y, NULL, NULL, NULL, causal, scale);
  const int64_t Tq = a.Tq, Tk = a.Tk, nqb = (Tq + ATT_QB - 1) / ATT_QB, nws = att_fwd_ws(&a);
  const int wy = a.y.p != NULL;
  if (a.nbatch <= 0 || Tq <= 0 || (!wy && !lse))
    return;
  if (Tk <= 0) { /* softmax over nothing: y = 0 (all-zero bits in every floating dtype), lse = -inf */
    for (int64_t b = 0; wy && b < a.nbatch; b++)
      att_zero(att_at(&a, &a.y, b, 0), a.y.ld, Tq, a.Dv, esize(dt));
    for (int64_t i = 0; lse && i < a.nbatch * Tq; i++)
      lse[i] = -INFINITY;
    return;
  }
  const int nt = nthreads();
  if (nt > 1 && a.nbatch >= nt) { /* batch indices over the threads, each with its own packing */
    OMP(parallel)
    {
      AttPk pk = att_pk_alloc(&a, 1, 0, wy, 0);
      float *ws = att_alloc(nws);
      OMP(for schedule(static))
      for (int64_t b = 0; b < a.nbatch; b++) {
        if (pk.mem)
          att_pk_for(&a, &pk, b, 0);
        for (int64_t i0 = 0; i0 < Tq; i0 += ATT_QB)
          att_fwd_block(&a, b, i0, pk.mem ? &pk : NULL, ws, lse, 0);
      }
      free(pk.mem);
      free(ws);
    }
    return;
  }
  /* few batch indices: one at a time, packed once, its query blocks over the
   * threads (or one after the other on threaded GEMMs) */
  AttPk pk = att_pk_alloc(&a, 1, 0, wy, 0);
  for (int64_t b = 0; b < a.nbatch; b++) {
    if (pk.mem)
      att_pk_for(&a, &pk, b, 1);
    const AttPk *p = pk.mem ? &pk : NULL;
    if (nt > 1 && nqb >= nt) {
      OMP(parallel)
      {
        float *ws = att_alloc(nws);
        OMP(for schedule(dynamic, 1))
        for (int64_t i0 = 0; i0 < Tq; i0 += ATT_QB)
          att_fwd_block(&a, b, i0, p, ws, lse, 0);
        free(ws);
      }
    } else {
      float *ws = att_alloc(nws);
      for (int64_t i0 = 0; i0 < Tq; i0 += ATT_QB)
        att_fwd_block(&a, b, i0, p, ws, lse, 1);
      free(ws);
    }
  }
  free(pk.mem);
}
/*@end attention@*/

/*@uses attention_backward@*/
/* P = exp(S - lse) over the first n scores of row r in place, 0 over the rest
 * of its w columns (masked). */
CLONES static void att_p_row(float *restrict r, int64_t n, int64_t w, float lse) {
  SIMD for (int64_t j = 0; j < n; j++) r[j] = tgm_exp(r[j] - lse);
  for (int64_t j = n; j < w; j++)
    r[j] = 0;
}

/* dS = P (dP - delta) over the first n columns of row d (dP, in place; p is
 * the row's P), 0 over the rest of its w (masked). */
CLONES static void att_ds_row(float *restrict d, const float *restrict p, int64_t n, int64_t w, float delta) {
  SIMD for (int64_t j = 0; j < n; j++) d[j] = p[j] * (d[j] - delta);
  for (int64_t j = n; j < w; j++)
    d[j] = 0;
}

/* P[i, j] and (ds not NULL) dS[i, j] of one (batch, head) from the operands
 * as stored (q, k, v, dy: its batch index's start), for the no-scratch path:
 * s = scale q_i . k_j, P = exp(s - lse_i), dS = P (dy_i . v_j - delta_i). */
static float att_pair(const Att *a, const char *q, const char *k, const char *v, const char *dy, float lse,
                      float delta, int64_t i, int64_t j, float *ds) {
  float d = 0, dp = 0;
  for (int64_t e = 0; e < a->D; e++)
    d += ldf(a->dt, q, i * a->q.ld + e) * ldf(a->dt, k, j * a->k.ld + e);
  float p = tgm_exp(a->scale * d - lse);
  for (int64_t e = 0; ds && e < a->Dv; e++)
    dp += ldf(a->dt, dy, i * a->y.ld + e) * ldf(a->dt, v, j * a->v.ld + e);
  if (ds)
    *ds = p * (dp - delta);
  return p;
}

/* Without scratch: batch index t of the backward on the operands as stored,
 * every output element a sum over the pairs (i, j) it needs, P and dS
 * recomputed per 64 output columns (on the stack). Slow: for when memory
 * cannot be had. */
static void att_bwd_noscratch(const Att *a, const float *lse, const float *delta, int64_t t) {
  const int64_t Tq = a->Tq, Tk = a->Tk, D = a->D, Dv = a->Dv;
  const char *q = att_at(a, &a->q, t, 0), *k = att_at(a, &a->k, t, 0), *v = att_at(a, &a->v, t, 0);
  const char *dy = att_at(a, &a->y, t, 0);
  char *dq = a->dq.p ? att_at(a, &a->dq, t, 0) : NULL, *dk = a->dk.p ? att_at(a, &a->dk, t, 0) : NULL;
  char *dv = a->dv.p ? att_at(a, &a->dv, t, 0) : NULL;
  lse += t * Tq;
  delta += t * Tq;
  for (int64_t i = 0; dq && i < Tq; i++) /* dq[i] = scale sum_j dS[i, j] k[j] */
    for (int64_t e0 = 0; e0 < D; e0 += 64) {
      float acc[64] = {0}, ds;
      int64_t w = tgm_min64(64, D - e0);
      for (int64_t j = 0; j < att_keys(a, i); j++) {
        att_pair(a, q, k, v, dy, lse[i], delta[i], i, j, &ds);
        for (int64_t e = 0; e < w; e++)
          acc[e] += ds * ldf(a->dt, k, j * a->k.ld + e0 + e);
      }
      for (int64_t e = 0; e < w; e++)
        stval(a->dt, dq, i * a->dq.ld + e0 + e, a->scale * acc[e]);
    }
  for (int64_t j = 0; j < Tk; j++) { /* dk[j] = scale sum_i dS[i, j] q[i], dv[j] = sum_i P[i, j] dy[i] */
    int64_t ilo = a->causal ? j : 0;
    for (int64_t e0 = 0; dk && e0 < D; e0 += 64) {
      float acc[64] = {0}, ds;
      int64_t w = tgm_min64(64, D - e0);
      for (int64_t i = ilo; i < Tq; i++) {
        att_pair(a, q, k, v, dy, lse[i], delta[i], i, j, &ds);
        for (int64_t e = 0; e < w; e++)
          acc[e] += ds * ldf(a->dt, q, i * a->q.ld + e0 + e);
      }
      for (int64_t e = 0; e < w; e++)
        stval(a->dt, dk, j * a->dk.ld + e0 + e, a->scale * acc[e]);
    }
    for (int64_t e0 = 0; dv && e0 < Dv; e0 += 64) {
      float acc[64] = {0};
      int64_t w = tgm_min64(64, Dv - e0);
      for (int64_t i = ilo; i < Tq; i++) {
        float p = att_pair(a, q, k, v, dy, lse[i], delta[i], i, j, NULL);
        for (int64_t e = 0; e < w; e++)
          acc[e] += p * ldf(a->dt, dy, i * a->y.ld + e0 + e);
      }
      for (int64_t e = 0; e < w; e++)
        stval(a->dt, dv, j * a->dv.ld + e0 + e, acc[e]);
    }
  }
}

/* The scratch of one thread of the backward (floats, from att_alloc): the P
 * and dS blocks (ATT_QB x att_ld(Tk) each); att_gemm's; the block's q and dy
 * packed (the B of dk's and dv's GEMMs); and for bf16/f16 the f32 dq block
 * and dk, dv sums. Only what the wanted outputs need. */
static int64_t att_bwd_ws(const Att *a) {
  const int dq = a->dq.p != NULL, dk = a->dk.p != NULL, dv = a->dv.p != NULL;
  int64_t n = 2 * ATT_QB * att_ld(a->Tk) + GEMM_MC * GEMM_KC;
  n += (dk ? att_pksize(ATT_QB, a->D, a->uk.nr) : 0) + (dv ? att_pksize(ATT_QB, a->Dv, a->uk.nr) : 0);
  if (a->dt != TGM_F32)
    n += (dq ? ATT_QB * a->D : 0) + (dk ? a->Tk * a->D : 0) + (dv ? a->Tk * a->Dv : 0);
  return n;
}

/* Batch index t of the backward (FlashAttention-2's, on the CPU): for each
 * block of query rows in order, S = scale q k^T, P = exp(S - lse), dv += P^T
 * dy, dP = dy v^T, dS = P (dP - delta), dq = scale dS k, dk += scale dS^T q,
 * over the keys the block sees; dk and dv summed in f32 (for f32 in the
 * results themselves, at their row strides) and rounded once, a row at a
 * time. pk holds t's packed k and v, ws is att_bwd_ws's scratch (either
 * NULL: the no-scratch path); `par` lets the GEMMs and the rows use the
 * threads, with the same results. */
static void att_bwd_one(const Att *a, const AttPk *pk, const float *lse, const float *delta, float *ws, int64_t t,
                        int par) {
  if (!pk || !ws) {
    att_bwd_noscratch(a, lse, delta, t);
    return;
  }
  const Ukernel *uk = &a->uk;
  const int dt = a->dt, half = dt != TGM_F32, nr = uk->nr;
  const int wq = a->dq.p != NULL, wk = a->dk.p != NULL, wv = a->dv.p != NULL;
  const int64_t Tq = a->Tq, Tk = a->Tk, D = a->D, Dv = a->Dv, ld = att_ld(Tk), es = (int64_t)esize(dt);
  const char *q = att_at(a, &a->q, t, 0), *dy = att_at(a, &a->y, t, 0);
  char *dq = wq ? att_at(a, &a->dq, t, 0) : NULL, *dk = wk ? att_at(a, &a->dk, t, 0) : NULL;
  char *dv = wv ? att_at(a, &a->dv, t, 0) : NULL;
  float *p = ws, *ds = p + ATT_QB * ld, *ap = ds + ATT_QB * ld, *qpk = ap + GEMM_MC * GEMM_KC;
  float *dypk = qpk + (wk ? att_pksize(ATT_QB, D, nr) : 0), *hq = dypk + (wv ? att_pksize(ATT_QB, Dv, nr) : 0);
  float *hk = hq + (half && wq ? ATT_QB * D : 0), *hv = hk + (half && wk ? Tk * D : 0);
  float *fk = !wk ? NULL : half ? hk : (float *)dk, *fv = !wv ? NULL : half ? hv : (float *)dv;
  const int64_t lfk = half ? D : a->dk.ld, lfv = half ? Dv : a->dv.ld; /* the sums' row strides */
  lse += t * Tq;
  delta += t * Tq;
  if (fk)
    att_zero(fk, lfk, Tk, D, sizeof(float));
  if (fv)
    att_zero(fv, lfv, Tk, Dv, sizeof(float));
  for (int64_t i0 = 0; i0 < Tq; i0 += ATT_QB) {
    const int64_t bq = tgm_min64(ATT_QB, Tq - i0), n = a->causal ? tgm_min64(i0 + bq, Tk) : Tk;
    const char *qb = q + i0 * a->q.ld * es, *dyb = dy + i0 * a->y.ld * es;
    att_gemm(uk, dt, 0, qb, a->q.ld, pk->kt, D, Tk, bq, n, D, a->scale, 0.0f, p, ld, ap, par);
    OMP(parallel for schedule(static) if (par && bq * n >= PAR_MIN))
    for (int64_t r = 0; r < bq; r++)
      att_p_row(p + r * ld, att_keys(a, i0 + r), n, lse[i0 + r]);
    if (fv) {
      att_pack(dt, 0, dyb, a->y.ld, bq, Dv, nr, dypk, par);
      att_gemm(uk, TGM_F32, 1, p, ld, dypk, bq, Dv, n, Dv, bq, 1.0f, 1.0f, fv, lfv, ap, par);
    }
    if (!wq && !wk)
      continue;
    att_gemm(uk, dt, 0, dyb, a->y.ld, pk->vt, Dv, Tk, bq, n, Dv, 1.0f, 0.0f, ds, ld, ap, par);
    OMP(parallel for schedule(static) if (par && bq * n >= PAR_MIN))
    for (int64_t r = 0; r < bq; r++)
      att_ds_row(ds + r * ld, p + r * ld, att_keys(a, i0 + r), n, delta[i0 + r]);
    if (wq) {
      char *dqb = dq + i0 * a->dq.ld * es;
      float *fq = half ? hq : (float *)dqb;
      att_gemm(uk, TGM_F32, 0, ds, ld, pk->k, Tk, D, bq, D, n, a->scale, 0.0f, fq, half ? D : a->dq.ld, ap, par);
      if (half)
        att_round(dt, fq, D, dqb, a->dq.ld, bq, D);
    }
    if (fk) {
      att_pack(dt, 0, qb, a->q.ld, bq, D, nr, qpk, par);
      att_gemm(uk, TGM_F32, 1, ds, ld, qpk, bq, D, n, D, bq, a->scale, 1.0f, fk, lfk, ap, par);
    }
  }
  if (half && fk)
    att_round(dt, fk, D, dk, a->dk.ld, Tk, D);
  if (half && fv)
    att_round(dt, fv, Dv, dv, a->dv.ld, Tk, Dv);
}

void tgm_cpu_attention_backward(int dt, const tgm_view *q, const tgm_view *k, const tgm_view *v, const tgm_view *dy,
                                const float *lse, const float *delta, const tgm_view *dq, const tgm_view *dk,
                                const tgm_view *dv, int causal, double scale) {
  Att a = att_init(dt, q, k, v, dy, dq, dk, dv, causal, scale);
  const int64_t Tq = a.Tq, D = a.D, Tk = a.Tk, Dv = a.Dv;
  const int wq = a.dq.p != NULL, wk = a.dk.p != NULL, wv = a.dv.p != NULL;
  const size_t es = esize(dt);
  if (a.nbatch <= 0 || (!wq && !wk && !wv))
    return;
  if (Tq <= 0 || Tk <= 0) { /* no scores: y is 0 (Tk = 0) or empty (Tq = 0), every gradient 0 */
    for (int64_t t = 0; t < a.nbatch; t++) {
      if (wq)
        att_zero(att_at(&a, &a.dq, t, 0), a.dq.ld, Tq, D, es);
      if (wk)
        att_zero(att_at(&a, &a.dk, t, 0), a.dk.ld, Tk, D, es);
      if (wv)
        att_zero(att_at(&a, &a.dv, t, 0), a.dv.ld, Tk, Dv, es);
    }
    return;
  }
  /* batch indices over the threads when there are enough of them, else one
   * after the other on threaded GEMMs; each thread packs k^T (S's B), and
   * for dq and dk k (dq's) and v^T (dP's), once per batch index */
  const int wds = wq || wk;
  const int64_t nws = att_bwd_ws(&a);
  const int outer = nthreads() > 1 && a.nbatch >= nthreads();
  OMP(parallel if (outer))
  {
    AttPk pk = att_pk_alloc(&a, 1, wds, 0, wds);
    float *ws = att_alloc(nws);
    OMP(for schedule(static))
    for (int64_t t = 0; t < a.nbatch; t++) {
      if (pk.mem)
        att_pk_for(&a, &pk, t, !outer);
      att_bwd_one(&a, pk.mem ? &pk : NULL, lse, delta, ws, t, !outer);
    }
    free(pk.mem);
    free(ws);
  }
}
/*@end attention_backward@*/
