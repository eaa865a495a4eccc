/* mlp_cpu.c: the CPU library calls of the runtime (the "CPU kernels" section
 * of mlp_rt.h): the GEMMs (matmul, linear, gemm), attention, embedding and
 * its backward, dropout and the dtype cast; the pointwise, reduction, view
 * and loss kernels are generated per model (NAME_cpu.c). OpenMP-parallel and
 * vectorisable.
 *
 * Template: copied into every emitted project with "mlp_" renamed. Plain C11
 * plus OpenMP pragmas (ignored without -fopenmp); needs libm, and a CBLAS when
 * built with -DMLP_HAVE_CBLAS (the emitted CMakeLists.txt defines it for
 * OpenBLAS, MKL, BLIS or a CBLAS asked for; for Netlib's reference BLAS,
 * slower than the built-in GEMM, only when forced). Only the sections of the
 * library calls a model makes are copied (mlp_rt.h, "Sections"). The dtype
 * conversions (mlp_bf16_to_f32, ...) live in mlp_init.c; the hot loops use
 * the inline copies of mlp_rt.h (mlp_ld_bf16, mlp_st_bf16, mlp_ld_f16,
 * mlp_st_f16, shared with mlp_optim_cpu.c), written so that loops over them
 * vectorise, bit-identical to those (round to nearest even; the unit test
 * checks every half and a sweep of floats). exp and gelu are mlp_math.h's (the generated
 * kernels'), vectorisable polynomials.
 *
 * Numerics: floating ops compute in f32 (bf16/f16 are loaded to f32 and the
 * result rounded once on store); softmax sums accumulate in double. On x86
 * with gcc or clang the hot loops are also compiled for AVX2 and AVX-512 and
 * picked at load time (target_clones), as are the GEMM micro-kernels (at run
 * time); -DMLP_NO_ISA_DISPATCH turns both off.
 *
 * The layout of the file:
 *   helpers      threads, pragmas, dtype loads and stores (on mlp_rt.h's
 *                inline conversions and bit selects)
 *   cast, dropout
 *   embedding    and its backward (a stable counting sort, then rows)
 *   GEMM         a packed, cache-blocked GEMM with register-blocked micro-
 *                kernels (AVX-512 / AVX2 chosen at run time on x86, else
 *                plain C), or cblas_sgemm; matmul, linear on top
 *   gemm         mlp_cpu_gemm: the same blocks and micro-kernels on any
 *                dtype, transposes, strides and batches, with the fused
 *                epilogue applied as micro-tiles are stored
 *   attention    and its backward, a block of query rows at a time (never
 *                a Tq x Tk matrix), on the GEMM's packing and micro-kernels. */
#include "mlp_rt.h"
#include "mlp_math.h"

#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef MLP_HAVE_CBLAS
#ifdef MLP_MKL_CBLAS_H /* MKL without a cblas.h (CMakeLists.txt) */
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
 * one for the CPU picked at load time (CLONES: mlp_rt.h's MLP_CLONES); only
 * leaf functions (no parallel regions) are cloned. ISA_DISPATCH: the GEMM
 * micro-kernels are chosen at run time too (x86 with gcc or clang). Both off
 * with -DMLP_NO_ISA_DISPATCH. */
#define CLONES MLP_CLONES
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) &&                          \
    !defined(MLP_NO_ISA_DISPATCH)
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
    int64_t lo = c * 4096, m = mlp_min64(4096, n - lo);
    const char *xs = (const char *)x + lo * (int64_t)esize(dt_in);
    char *ys = (char *)y + lo * (int64_t)esize(dt_out);
    int fin = dt_in == MLP_F32 || is_half(dt_in), fout = dt_out == MLP_F32 || is_half(dt_out);
    if (fin && fout) { /* through f32: the fast, common casts */
      float buf[BLK];
      for (int64_t i0 = 0; i0 < m; i0 += BLK) {
        int64_t k = mlp_min64(BLK, m - i0);
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
MLP_UNUSED static int gemm_isa = -1;

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
#define MLP_SHUFFLE 1
#endif
#endif
#ifdef MLP_SHUFFLE
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
#ifdef MLP_SHUFFLE
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
#ifdef MLP_SHUFFLE
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

#ifdef MLP_HAVE_CBLAS
/* 1 = never use the CBLAS (tests compare the two). */
static int gemm_no_blas = 0;

#if defined(__GNUC__) && defined(__ELF__)
/* OpenBLAS's thread count, when the CBLAS is OpenBLAS (weak: absent otherwise). */
extern int openblas_get_num_threads(void) __attribute__((weak));
extern void openblas_set_num_threads(int n) __attribute__((weak));
/* The name of the kernels OpenBLAS runs. */
extern char *openblas_get_corename(void) __attribute__((weak));
#endif

/* With a CBLAS that -DMLP_BLAS=AUTO chose (not one asked for), the large
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
#ifdef MLP_CBLAS_AUTO
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



/* ---------------------------------------------------------------- gemm */

/* mlp_cpu_gemm: the packed GEMM above (micro-kernels, cache blocks) read
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
MLP_FN void tile_round(int dt, float *restrict t, int64_t ts, int64_t ra, int64_t na) {
  for (int64_t i = 0; i < ra; i++) {
    if (dt == MLP_BF16)
      SIMD for (int64_t j = 0; j < na; j++) t[i * ts + j] = mlp_round_bf16(t[i * ts + j]);
    else
      SIMD for (int64_t j = 0; j < na; j++) t[i * ts + j] = mlp_round_f16(t[i * ts + j]);
  }
}

/* Finishes mv x nv sums of one GEMM, rows m0.., columns j0.. (t, row
 * stride ts): the bias, the aux store, the activation, the residual, the
 * old C when accumulating, and the store into C, rounding where mlp_rt.h
 * says (mlp_gemm's order). Clobbers t. Called per micro-tile, so the loops are short: each
 * step is one vector loop a row (the activation one over the whole tile
 * where its rows are contiguous). */
CLONES static void gemm_epilogue(const mlp_gemm *g, const GemmOne *o, int64_t m0, int64_t j0, int64_t mv, int64_t nv,
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
  const int rnd = g->dt != MLP_F32 && !g->dact && g->act != MLP_ACT_NONE; /* bf16/f16 with an activation */
  if (rnd) /* the activation's input in C's dtype (as mlp_rt.h says) */
    tile_round(g->dt, t, ts, ra, na);
  if (g->dact) { /* an activation's backward: T times act'(aux), aux read; the form a constant in each loop (a
                   * run-time one left the loop scalar: control flow) */
#define M_(LD, ST)                                                                                                     \
  if (g->act == MLP_ACT_GELU_TANH)                                                                                     \
    ROWS SIMD for (int64_t j = 0; j < nv; j++) t[i * ts + j] *= mlp_gelu_grad(LD(aux, (m0 + i) * ldc + j0 + j), 1);    \
  else                                                                                                                 \
    ROWS SIMD for (int64_t j = 0; j < nv; j++) t[i * ts + j] *= mlp_gelu_grad(LD(aux, (m0 + i) * ldc + j0 + j), 0);
    DT_CASES(g->dt, M_)
#undef M_
  } else if (aux) {
#define M_(LD, ST) ROWS SIMD for (int64_t j = 0; j < nv; j++) ST(aux, (m0 + i) * ldc + j0 + j, t[i * ts + j]);
    DT_CASES(g->dt, M_)
#undef M_
  }
  switch (g->dact ? MLP_ACT_NONE : g->act) {
  case MLP_ACT_RELU:
    for (int64_t i = 0; i < ra; i++)
      SIMD for (int64_t j = 0; j < na; j++) t[i * ts + j] = t[i * ts + j] < 0 ? 0.0f : t[i * ts + j]; /* NaN stays NaN */
    break;
  case MLP_ACT_GELU:
    for (int64_t i = 0; i < ra; i++)
      SIMD for (int64_t j = 0; j < na; j++) t[i * ts + j] = mlp_gelu(t[i * ts + j], 0);
    break;
  case MLP_ACT_GELU_TANH:
    for (int64_t i = 0; i < ra; i++)
      SIMD for (int64_t j = 0; j < na; j++) t[i * ts + j] = mlp_gelu(t[i * ts + j], 1);
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
      int64_t nv = mlp_min64(BLK, N - j0);
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

#ifdef MLP_SHUFFLE
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
static void gemm_dot(const mlp_gemm *g, const char *uk, const GemmOne *o, int par) {
  const DotKernel d = pick_dot(uk);
  const int64_t M = g->M, N = g->N, K = g->K, lda = g->lda, ldb = g->ldb;
  const int64_t mb = (M + d.mr - 1) / d.mr, nb = (N + DOT_COLS - 1) / DOT_COLS;
  const float *A = o->A, *B = o->B;
  (void)par;
  OMP(parallel for schedule(static) if (par && (double)M * (double)N * (double)K >= GEMM_PAR_MIN))
  for (int64_t t = 0; t < mb * nb; t++) {
    const int64_t i0 = t % mb * d.mr, j0 = t / mb * DOT_COLS;
    const int64_t mv = mlp_min64(d.mr, M - i0), nc = mlp_min64(DOT_COLS, N - j0);
    float tile[DOT_MAX_MR * DOT_COLS];
    for (int64_t j = 0; j < nc; j += d.nr)
      d.fn(K, A + i0 * lda, lda, (int)mv, B + (j0 + j) * ldb, ldb, (int)mlp_min64(d.nr, nc - j), tile + j, DOT_COLS);
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

static GemmPlan gemm_plan(const mlp_gemm *g) {
  GemmPlan p;
  memset(&p, 0, sizeof p);
  p.uk = pick_ukernel();
  p.direct = g->K == 0 || (double)g->M * (double)g->N * (double)g->K < GEMM_DIRECT;
  p.dot = !p.direct && g->dt == MLP_F32 && !g->ta && g->tb && g->M <= DOT_MAX_M && g->K >= DOT_VL;
  if (!p.direct && !p.dot) {
    int mr = p.uk.mr, nr = p.uk.nr;
    p.kcb = mlp_min64(g->K, g->ta ? GEMM_KC_TA : GEMM_KC);
    p.ncb = mlp_min64((g->N + nr - 1) / nr * nr, GEMM_NC / nr * nr);
    p.mcb = mlp_min64((g->M + mr - 1) / mr * mr, GEMM_MC / mr * mr);
    p.nk = (g->K + p.kcb - 1) / p.kcb;
    plan_run(&p, g->M);
    p.a_rows = g->dt == MLP_F32 && !g->ta;
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
static void gemm_tiled(const mlp_gemm *g, const GemmPlan *p, const GemmWs *w, const GemmOne *o, int par,
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
      int64_t nc = mlp_min64(ncb, N - jc), npan = (nc + nr - 1) / nr;
      for (int64_t ir = pc_->m0; ir < M; ir += p->run) {
        const int64_t re = mlp_min64(M, ir + p->run);
        for (int64_t q = 0; q < nk; q++) {
          int64_t pc = q * kcb, kc = mlp_min64(kcb, K - pc);
          if (nk > 1 || ir == pc_->m0) {
            OMP(for schedule(static))
            for (int64_t jp = 0; jp < npan; jp++)
              pack_b_dt(g->dt, g->tb, o->B, g->ldb, pc, jc + jp * nr, mlp_min64(nr, nc - jp * nr), kc, nr,
                        w->bp + jp * kc * nr);
          }
          for (int64_t ic = ir; ic < re; ic += mcb) {
            int64_t mc = mlp_min64(mcb, re - ic), mpan = (mc + mr - 1) / mr;
            int edge_packed = 0;
            if (!a_rows) {
              OMP(for schedule(static))
              for (int64_t ip = 0; ip < mpan; ip++)
                pack_a_dt(g->dt, g->ta, o->A, g->lda, ic + ip * mr, pc, mlp_min64(mr, mc - ip * mr), kc, mr,
                          w->ap + ip * kc * mr);
            }
            OMP(for schedule(static))
            for (int64_t t = 0; t < npan * mpan; t++) {
              int64_t jp = t / mpan, ip = t % mpan;
              int64_t i0 = ic + ip * mr, j0 = jc + jp * nr, mv = mlp_min64(mr, M - i0), nv = mlp_min64(nr, N - j0);
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
static int gemm_pieces(const mlp_gemm *g, const GemmPlan *p, int nt) {
  const int64_t mr = p->uk.mr, nr = p->uk.nr, M = g->M, N = g->N, K = g->K;
  const int per = gemm_per_thread(p, nt, (double)M * (double)N * (double)K);
  int pr, pcn;
  gemm_grid(nt * per, M, N, K, mr, nr, 1, p->a_rows ? 0.0 : g->ta ? 4.0 : 16.0, g->tb ? 16.0 : 4.0, &pr, &pcn);
  const int npieces = pr * pcn, nw = npieces < nt ? npieces : nt;
  const int64_t mp = ((M + pr - 1) / pr + mr - 1) / mr * mr, np = ((N + pcn - 1) / pcn + nr - 1) / nr * nr;
  GemmPlan sp = *p; /* the same K slices; blocks no larger than a piece */
  sp.ncb = mlp_min64(p->ncb, np);
  /* With several K slices, a piece whose block scratch fits GEMM_BLOCK_MAX is one row block. Made
   * when each row block packed B's slice again (runs now pack it once a run either way), it still
   * keeps the piece's B panels under all its rows rather than a short last block: H100 machine, 16
   * threads, against torch.mm in turn: 1024 x 512 x 2048 (pieces 1024 x 32, six row blocks before)
   * 1.04 -> 1.13 of torch's rate with B transposed, 0.76 -> 1.01 without; dW's 2048 x 512 x 1024
   * (pieces 256 x 256) 0.74 -> 0.82 (bench/results/h100_gpu_session21.txt). */
  const int64_t block = mp * (sp.ncb + (p->a_rows ? 0 : p->kcb)) * (int64_t)sizeof(float);
  sp.mcb = p->nk > 1 && block <= GEMM_BLOCK_MAX ? mp : mlp_min64(p->mcb, mp);
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
        GemmPiece pc = {q / pcn * mp, mlp_min64(M, (q / pcn + 1) * mp), q % pcn * np, mlp_min64(N, (q % pcn + 1) * np)};
        if (pc.m0 < pc.m1 && pc.n0 < pc.n1)
          gemm_tiled(g, &sp, &ws[id], &o, 0, &pc);
      }
#undef NEXT_PIECE
    }
  }
  gemm_ws_give(ws, nw, stack);
  return ok;
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
        int64_t nv = mlp_min64(BLK, g->N - j0);
        memcpy(t, (const float *)o.C + m * g->ldc + j0, sizeof(float) * (size_t)nv);
        gemm_epilogue(g, &o, m, j0, 1, nv, t, nv);
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
  if (g->dact && (!g->aux || (g->act != MLP_ACT_GELU && g->act != MLP_ACT_GELU_TANH)))
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
static void gemm_bgrad(const mlp_gemm *g) {
  const int64_t M = g->M, K = g->K, lda = g->lda;
  const void *A = g->A;
  void *y = g->bgrad;
  OMP(parallel for schedule(static) if (M * K >= PAR_MIN))
  for (int64_t m0 = 0; m0 < M; m0 += 64) {
    const int64_t nm = mlp_min64(64, M - m0);
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

int mlp_cpu_gemm(const mlp_gemm *g0) {
  if (!gemm_args_ok(g0))
    return -1;
  const mlp_gemm fold = mlp_gemm_folded(g0), *g = &fold;
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
#ifdef MLP_HAVE_CBLAS
  int nested = 0;
#ifdef _OPENMP
  nested = omp_in_parallel();
#endif
  if (!p.direct && !p.dot && !small && !nested && work >= GEMM_CBLAS_MIN && gemm_cblas(g))
    return 0;
#endif
  if (g->batch > 1 && nthreads() > 1 && (small || g->batch >= 4 * nthreads())) {
    /* scratch for the threads that get a GEMM (one without runs direct) */
    const int nt = nthreads(), nw = (int)mlp_min64(nt, g->batch);
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



