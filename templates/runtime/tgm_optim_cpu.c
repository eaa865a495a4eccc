/* tgm_optim_cpu.c: the optimizer step of the emitted training code on the CPU
 * (the tgm_cpu_adamw / tgm_cpu_sgd / tgm_cpu_sum_squares / tgm_clip_factor
 * part of tgm_rt.h's "CPU kernels" section).
 *
 * Template: copied into every emitted project with "tgm_" renamed. Plain C11
 * plus OpenMP pragmas (ignored without -fopenmp); needs libm. Its macros
 * carry an OPT_ prefix so that this file can share a translation unit with
 * tgm_cpu.c; the bit helpers and bf16/f16 conversions come from tgm_rt.h.
 *
 * Semantics: PyTorch 2.x torch.optim.AdamW and torch.optim.SGD as their
 * single-tensor (foreach=False, fused=False) paths compute them for an f32
 * param, and torch.nn.utils.clip_grad_norm_ for the clip factor:
 *
 *   g   = f32(grad) * grad_scale
 *   AdamW  w *= 1 - lr wd                      (decoupled decay, every param)
 *          m  = lerp(m, g, 1 - b1)             (torch's exp_avg.lerp_)
 *          v  = v b2 + (1 - b2) g g            (exp_avg_sq.mul_.addcmul_)
 *          w += (-lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 *   SGD    g += wd w                           (when wd != 0)
 *          buf = t == 1 ? g : momentum buf + g (when momentum != 0); g = buf
 *          w += -lr g
 *
 * Per-element arithmetic is f32, in torch's order of operations; the scalar
 * factors are computed in double and rounded to f32 once, as torch does with
 * its Python-float scalars. Rounding can still differ from torch's vectorised
 * kernels by an ulp where they fuse a multiply-add. The low-precision copy
 * (bf16/f16) is rounded to nearest even from the updated f32 master, bit-
 * identical to tgm_f32_to_bf16 / tgm_f32_to_f16 (tgm_init.c).
 *
 * The loops are `omp parallel for simd` over the elements, no allocation.
 * Loop-invariant choices (weight decay on/off, the branch of lerp, the first
 * momentum step) are made with bit masks so that one loop body serves them
 * all. sqrtf keeps its errno check unless compiled with -fno-math-errno (the
 * emitted CMakeLists.txt passes it to gcc and clang); the AdamW loop
 * vectorises only then (scalar, it was 9% of the GPT blocks' step on one
 * thread), so it is marked `simd` only under __NO_MATH_ERRNO__. */
#include "tgm_rt.h"

#include <math.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* ---------------------------------------------------------------- helpers */

#define OPT_PRAGMA_(...) _Pragma(#__VA_ARGS__)
#ifdef _OPENMP
#define OPT_OMP(...) OPT_PRAGMA_(omp __VA_ARGS__)
#define OPT_SIMD_SUM(v) OPT_PRAGMA_(omp simd reduction(+ : v))
#else
#define OPT_OMP(...)
#define OPT_SIMD_SUM(v)
#endif

/* The AdamW loop calls sqrtf, which vectorises only without errno (clang
 * warns about an `omp simd` loop it cannot vectorise): simd only then. */
#ifdef __NO_MATH_ERRNO__
#define OPT_PAR_SQRT(cond) OPT_OMP(parallel for simd schedule(static) if (cond))
#else
#define OPT_PAR_SQRT(cond) OPT_OMP(parallel for schedule(static) if (cond))
#endif

/* Work below this many elements runs on one thread. */
#define OPT_PAR_MIN 32768
/* sum_squares: a fixed number of chunks, each summed serially, then the
 * partial sums added in order: the result does not depend on the threads. */
#define OPT_NCHUNK 64

/* The bit helpers (tgm_mask, tgm_sel) and the inline dtype conversions
 * (tgm_ld_bf16, tgm_st_bf16, tgm_ld_f16, tgm_st_f16) are tgm_rt.h's, shared
 * with tgm_cpu.c: bit-identical to tgm_init.c's and written to vectorise. */
#define OPT_LD_F32(p, i) (((const float *)(p))[i])
#define OPT_LD_BF(p, i) tgm_ld_bf16(((const uint16_t *)(p))[i])
#define OPT_LD_H(p, i) tgm_ld_f16(((const uint16_t *)(p))[i])
#define OPT_ST_NONE(p, i, x) ((void)0)
#define OPT_ST_F32(p, i, x) (((float *)(p))[i] = (x))
#define OPT_ST_BF(p, i, x) (((uint16_t *)(p))[i] = tgm_st_bf16(x))
#define OPT_ST_H(p, i, x) (((uint16_t *)(p))[i] = tgm_st_f16(x))

/* M(LDG, STL) for the gradient dtype gdt and the copy of the weights (none
 * when lowp is NULL or lowdt is not a floating dtype; f32; bf16; f16). */
#define OPT_LOW_CASES(lowp, lowdt, M, LDG)                                                                             \
  if (!(lowp)) {                                                                                                       \
    M(LDG, OPT_ST_NONE);                                                                                               \
  } else if ((lowdt) == TGM_BF16) {                                                                                    \
    M(LDG, OPT_ST_BF);                                                                                                 \
  } else if ((lowdt) == TGM_F16) {                                                                                     \
    M(LDG, OPT_ST_H);                                                                                                  \
  } else if ((lowdt) == TGM_F32) {                                                                                     \
    M(LDG, OPT_ST_F32);                                                                                                \
  } else {                                                                                                             \
    M(LDG, OPT_ST_NONE);                                                                                               \
  }
#define OPT_CASES(gdt, lowp, lowdt, M)                                                                                 \
  switch (gdt) {                                                                                                       \
  case TGM_BF16: OPT_LOW_CASES(lowp, lowdt, M, OPT_LD_BF) break;                                                       \
  case TGM_F16: OPT_LOW_CASES(lowp, lowdt, M, OPT_LD_H) break;                                                         \
  default: OPT_LOW_CASES(lowp, lowdt, M, OPT_LD_F32) break;                                                            \
  }

/* ---------------------------------------------------------------- AdamW */

void tgm_cpu_adamw(float *w, const void *g, int gdt, float *m, float *v, void *lowp, int lowdt, int64_t n, double lr,
                   double beta1, double beta2, double eps, double weight_decay, int64_t step, double grad_scale) {
  if (n <= 0)
    return;
  double t = (double)(step > 0 ? step : 1);
  /* The scalars as torch forms them (Python floats), then rounded to f32. */
  const float gs = (float)grad_scale;
  const float decay = (float)(1.0 - lr * weight_decay);
  const float w1 = (float)(1.0 - beta1);              /* lerp weight */
  const float wm1 = w1 - 1.0f;                        /* torch's lerp: end + (w - 1)(end - start) when |w| >= 0.5 */
  const uint32_t small = tgm_mask(fabsf(w1) < 0.5f); /* torch's lerp: start + w (end - start) */
  const float b2 = (float)beta2, omb2 = (float)(1.0 - beta2);
  const float bc2s = (float)sqrt(1.0 - pow(beta2, t));
  const float nstep = (float)(-(lr / (1.0 - pow(beta1, t))));
  const float epsf = (float)eps;
  float *restrict W = w, *restrict M = m, *restrict V = v;
#define OPT_ADAMW(LDG, STL)                                                                                            \
  OPT_PAR_SQRT(n >= OPT_PAR_MIN)                                                                                       \
  for (int64_t i = 0; i < n; i++) {                                                                                    \
    float gi = LDG(g, i) * gs;                                                                                         \
    float wi = W[i] * decay, mi = M[i], vi = V[i];                                                                     \
    float d = gi - mi;                                                                                                 \
    mi = tgm_sel(small, mi + w1 * d, gi + wm1 * d);                                                                    \
    vi = vi * b2 + omb2 * gi * gi;                                                                                     \
    wi = wi + nstep * mi / (sqrtf(vi) / bc2s + epsf);                                                                  \
    W[i] = wi;                                                                                                         \
    M[i] = mi;                                                                                                         \
    V[i] = vi;                                                                                                         \
    STL(lowp, i, wi);                                                                                                  \
  }
  OPT_CASES(gdt, lowp, lowdt, OPT_ADAMW)
#undef OPT_ADAMW
}

/* ---------------------------------------------------------------- SGD */

void tgm_cpu_sgd(float *w, const void *g, int gdt, float *buf, void *lowp, int lowdt, int64_t n, double lr,
                 double momentum, double weight_decay, int64_t step, double grad_scale) {
  if (n <= 0)
    return;
  const float gs = (float)grad_scale, wd = (float)weight_decay, mom = (float)momentum, nlr = (float)-lr;
  const uint32_t use_wd = tgm_mask(weight_decay != 0), first = tgm_mask(step <= 1);
  float *restrict W = w, *restrict B = buf;
  if (momentum == 0) {
#define OPT_SGD(LDG, STL)                                                                                              \
  OPT_OMP(parallel for simd schedule(static) if (n >= OPT_PAR_MIN))                                                    \
  for (int64_t i = 0; i < n; i++) {                                                                                    \
    float gi = LDG(g, i) * gs, wi = W[i];                                                                              \
    gi = tgm_sel(use_wd, gi + wd * wi, gi);                                                                            \
    wi = wi + nlr * gi;                                                                                                \
    W[i] = wi;                                                                                                         \
    STL(lowp, i, wi);                                                                                                  \
  }
    OPT_CASES(gdt, lowp, lowdt, OPT_SGD)
#undef OPT_SGD
  } else {
#define OPT_SGD_MOM(LDG, STL)                                                                                          \
  OPT_OMP(parallel for simd schedule(static) if (n >= OPT_PAR_MIN))                                                    \
  for (int64_t i = 0; i < n; i++) {                                                                                    \
    float gi = LDG(g, i) * gs, wi = W[i];                                                                              \
    gi = tgm_sel(use_wd, gi + wd * wi, gi);                                                                            \
    float bi = tgm_sel(first, gi, B[i] * mom + gi);                                                                    \
    wi = wi + nlr * bi;                                                                                                \
    B[i] = bi;                                                                                                         \
    W[i] = wi;                                                                                                         \
    STL(lowp, i, wi);                                                                                                  \
  }
    OPT_CASES(gdt, lowp, lowdt, OPT_SGD_MOM)
#undef OPT_SGD_MOM
  }
}

/* ---------------------------------------------------------------- gradient norm */

double tgm_cpu_sum_squares(const void *x, int dt, int64_t n) {
  if (n <= 0)
    return 0;
  double part[OPT_NCHUNK];
  OPT_OMP(parallel for schedule(static) if (n >= OPT_PAR_MIN))
  for (int c = 0; c < OPT_NCHUNK; c++) {
    int64_t base = n / OPT_NCHUNK, rem = n % OPT_NCHUNK;
    int64_t lo = c * base + (c < rem ? c : rem), hi = lo + base + (c < rem);
    double s = 0;
#define OPT_SUMSQ(LD)                                                                                                  \
  OPT_SIMD_SUM(s)                                                                                                      \
  for (int64_t i = lo; i < hi; i++) {                                                                                  \
    double e = (double)LD(x, i);                                                                                       \
    s += e * e;                                                                                                        \
  }
    switch (dt) {
    case TGM_BF16: OPT_SUMSQ(OPT_LD_BF) break;
    case TGM_F16: OPT_SUMSQ(OPT_LD_H) break;
    default: OPT_SUMSQ(OPT_LD_F32) break;
    }
#undef OPT_SUMSQ
    part[c] = s;
  }
  double s = 0;
  for (int c = 0; c < OPT_NCHUNK; c++)
    s += part[c];
  return s;
}

/* torch: total_norm = ||g||_2; clip_coef = max_norm / (total_norm + 1e-6),
 * clamped to at most 1 (a NaN norm gives NaN, as torch.clamp passes it). */
double tgm_clip_factor(double sum_squares, double max_norm) {
  double c = max_norm / (sqrt(sum_squares) + 1e-6);
  return c > 1.0 ? 1.0 : c;
}
