/* tgm_math.h: the scalar functions the generated kernels call, in f32, for
 * the CPU (plain C, written to vectorise: bit selects instead of branches)
 * and for CUDA (device functions on CUDA's math library); and, for CUDA, the
 * lane and block reductions of the generated reduction kernels.
 *
 * Template: copied into every emitted project as src/NAME_math.h with "tgm"
 * renamed. The names are those of gen/ops.def's expressions (f_exp becomes
 * tgm_exp, ...), whose double-precision versions are the interpreter's.
 *
 * CPU accuracy: exp, log, tanh, erf, erfc, gelu and gelu's derivative are
 * this file's own (range reductions and minimax polynomials, vectorising;
 * see below), sqrt, sin, cos, pow are libm's. The largest error over all
 * 2^32 f32 inputs against libm's double (the interpreter's functions;
 * tests/unit/test_math.c, which asserts bounds a little above these), in
 * ulps of the exact value: exp 0.87, log 0.92, tanh 2.42, erf 1.19, erfc
 * 2.65, sigmoid (ops.def's 1 / (1 + exp(-x))) 2.48 (0 below -88.72, where
 * the exact value is below 2.94e-39); relative to the size of their terms:
 * gelu 2.5e-7, gelu_grad 2.2e-7, silu 1.8e-7, and the tanh forms 2.0e-7
 * times the condition number of their f32 argument y = sqrt(2/pi) (x +
 * 0.044715 x^3) (up to 1.6e-5 without it, near x = -10, where gelu is
 * 1e-37). +-0, subnormals, +-inf and NaN give the interpreter's results
 * (NaN in, NaN out). The same with FMA contraction (-march=native).
 * CUDA: CUDA's math library; f32 division (tgm_div) within 2 ulp
 * (tests/cuda_math/div.cu); exp as __expf (2 + 1.173 |x| ulp); erf-gelu as
 * PyTorch's CUDA kernels compute it. */
#ifndef TGM_MATH_H
#define TGM_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define TGM_FN static __device__ __forceinline__
#else
#if defined(__GNUC__) || defined(__clang__)
#define TGM_FN static inline __attribute__((always_inline, unused))
#else
#define TGM_FN static inline
#endif
#endif

/* TGM_OMP(parallel for ...): an OpenMP pragma, or nothing without OpenMP. */
#define TGM_PRAGMA_(...) _Pragma(#__VA_ARGS__)
#ifdef _OPENMP
#define TGM_OMP(...) TGM_PRAGMA_(omp __VA_ARGS__)
#else
#define TGM_OMP(...)
#endif

#ifndef __CUDACC__
#ifdef _OPENMP
#include <omp.h>
#endif
/* The smaller of two int64_t (chunk and tile bounds; a kernel's first bad index over its chunks). */
TGM_FN int64_t tgm_min64(int64_t a, int64_t b) { return a < b ? a : b; }
/* The next chunk [*lo, *hi) of [0, n) for the calling OpenMP thread, in
 * whole units of `unit` elements but the last: the team's threads take the
 * chunks in turn from *next (shared, 0 before the region), from 4 threads
 * about four a thread, so that a thread slower than the others runs fewer
 * of them (one a thread under 4). On the GPU machine's 16 Xeon cores, where
 * the threads' speeds differ (tgm_cpu.c's gemm_per_thread), tinyops_cpu's
 * one loop took 2.45-3.23 ms (median of six rounds 2.55) against
 * 2.65-3.39 (3.20) with each thread's fixed share; gpt2_cpu's and
 * mlp_blocks_cpu's steps the same within their noise
 * (bench/results/h100_gpu_session28.txt calls 10-11). Returns 0 when none
 * is left; outside a parallel region one thread takes them all. The
 * generated CPU kernels run their loops (leaf functions, for TGM_CLONES)
 * over the chunks: each output element is computed within one chunk, so
 * the bits do not depend on who takes which. */
TGM_FN int tgm_chunk(int64_t *next, int64_t n, int64_t unit, int64_t *lo, int64_t *hi) {
#ifdef _OPENMP
  const int64_t nt = omp_get_num_threads();
#else
  const int64_t nt = 1;
#endif
  const int64_t nc = nt < 4 ? nt : 4 * nt; /* chunks */
  const int64_t units = (n + unit - 1) / unit, per = (units + nc - 1) / nc * unit;
  int64_t c;
  TGM_OMP(atomic capture)
  {
    c = *next;
    *next += per;
  }
  if (c >= n)
    return 0;
  *lo = c;
  *hi = n - c < per ? n : c + per;
  return 1;
}
#endif

TGM_FN float tgm_fbits(uint32_t u) {
#ifdef __CUDACC__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}
TGM_FN uint32_t tgm_bitsf(float f) {
#ifdef __CUDACC__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}
TGM_FN uint32_t tgm_m(int c) { return (uint32_t)0 - (uint32_t)(c != 0); }
TGM_FN float tgm_pick(uint32_t m, float a, float b) { return tgm_fbits((tgm_bitsf(a) & m) | (tgm_bitsf(b) & ~m)); }

/* ---------------------------------------------------------------- storage */

#ifdef __CUDACC__
/* CUDA: the hardware's conversions (one instruction each; round to nearest
 * even, as below; a NaN becomes the canonical NaN) */
TGM_FN float tgm_load_bf16(uint16_t h) { return __bfloat162float(__ushort_as_bfloat16(h)); }
TGM_FN uint16_t tgm_store_bf16(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
TGM_FN float tgm_load_f16(uint16_t h) { return __half2float(__ushort_as_half(h)); }
TGM_FN uint16_t tgm_store_f16(float f) { return __half_as_ushort(__float2half_rn(f)); }
#else
TGM_FN float tgm_load_bf16(uint16_t h) { return tgm_fbits((uint32_t)h << 16); }
TGM_FN uint16_t tgm_store_bf16(float f) { /* round to nearest even; NaN stays NaN */
  uint32_t u = tgm_bitsf(f), nan = tgm_m((u & 0x7fffffffu) > 0x7f800000u);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x0040u;
  return (uint16_t)((r & ~nan) | (q & nan));
}
TGM_FN float tgm_load_f16(uint16_t h) {
  uint32_t o = (uint32_t)(h & 0x7fffu) << 13, e = o & 0x0f800000u;
  uint32_t inf = tgm_m(e == 0x0f800000u), zero = tgm_m(e == 0);
  o += 0x38000000u + (0x38000000u & inf);
  uint32_t sub = tgm_bitsf(tgm_fbits(o + 0x00800000u) - tgm_fbits(0x38800000u));
  o = (o & ~zero) | (sub & zero);
  return tgm_fbits(o | ((uint32_t)(h & 0x8000u) << 16));
}
TGM_FN uint16_t tgm_store_f16(float f) {
  uint32_t u = tgm_bitsf(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  uint32_t nanv = 0x7e00u | ((a >> 13) & 0x3ffu);
  uint32_t norm = (a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
  uint32_t sub = tgm_bitsf(tgm_fbits(a) * 16777216.0f + 8388608.0f) - 0x4b000000u;
  uint32_t isnan = tgm_m(a > 0x7f800000u), isinf = tgm_m(a >= 0x477ff000u), isnorm = tgm_m(a >= 0x38800000u);
  uint32_t r = (norm & isnorm) | (sub & ~isnorm);
  r = (0x7c00u & isinf) | (r & ~isinf);
  r = (nanv & isnan) | (r & ~isnan);
  return (uint16_t)(sign | (r & 0xffffu));
}
#endif
/* A value rounded to bf16 / f16 and back (an explicit cast). */
TGM_FN float tgm_round_bf16(float f) { return tgm_load_bf16(tgm_store_bf16(f)); }
TGM_FN float tgm_round_f16(float f) { return tgm_load_f16(tgm_store_f16(f)); }
/* f32 to i32 toward zero; NaN and out of range give INT32_MIN (the interpreter's rule). */
TGM_FN int64_t tgm_to_i32(float f) {
  return f == f && f > -2147483904.0f && f < 2147483648.0f ? (int64_t)(int32_t)f : (int64_t)INT32_MIN;
}

/* ---------------------------------------------------------------- math */

TGM_FN float tgm_abs(float x) { return tgm_fbits(tgm_bitsf(x) & 0x7fffffffu); }
/* NaN-propagating max and min (torch.maximum, torch.amax): as selects, or on CUDA from sm_80 on one
 * instruction each (PTX max.NaN, min.NaN: a canonical NaN; the sign of a zero result may differ from the
 * selects', which keep a where a and b compare equal). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
TGM_FN float tgm_max(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
TGM_FN float tgm_min(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
#else
TGM_FN float tgm_max(float a, float b) { return tgm_pick(tgm_m((b > a) | (b != b)), b, a); }
TGM_FN float tgm_min(float a, float b) { return tgm_pick(tgm_m((b < a) | (b != b)), b, a); }
#endif
#if defined(_OPENMP) && !defined(__CUDACC__)
/* tgm_max as an OpenMP reduction, so that a row's max is a vector loop
 * (exact whatever the order: NaN propagates and a max does not round; only
 * the sign of a zero max may differ from the serial loop's) */
#pragma omp declare reduction(tgm_fmax : float : omp_out = tgm_max(omp_out, omp_in)) initializer(omp_priv = -INFINITY)
#endif
TGM_FN float tgm_clamp(float x, float lo, float hi) { /* min(max(x, lo), hi); NaN stays */
  float t = x < lo ? lo : x;
  return t > hi ? hi : t;
}
TGM_FN float tgm_inf0(float x) { return tgm_abs(x) == INFINITY ? 0.0f : x; }

/* a / b. CUDA: PTX div.full.f32, at most 2 ulp from the IEEE quotient over
 * the whole range, infinities and NaN as IEEE (Triton's f32 division, so
 * torch.compile's); about half the instructions of div.rn's IEEE sequence,
 * which made tinyops' backward compute-bound. The CPU divides exactly. */
#ifdef __CUDA_ARCH__
TGM_FN float tgm_div(float a, float b) {
  float q;
  asm("div.full.f32 %0, %1, %2;" : "=f"(q) : "f"(a), "f"(b));
  return q;
}
#else
TGM_FN float tgm_div(float a, float b) { return a / b; }
#endif

#ifdef __CUDACC__
/* e^x as CUDA's __expf: ex2.approx (MUFU.EX2) of x log2(e), two
 * instructions where expf's accurate reduction is eight (Triton's exp, so
 * torch.compile's). Error at most 2 + 1.173 |x| ulp (CUDA's programming
 * guide): 2 ulp near 0, about 1e-6 relative at |x| = 10 and 6e-6 at 88;
 * results below 2^-126 may flush to zero. The loss kernel over GPT-2's logits,
 * an exp for each of 824 million elements twice a step, was
 * instruction-bound on expf. */
TGM_FN float tgm_exp(float x) { return __expf(x); }
TGM_FN float tgm_log(float x) { return logf(x); }
TGM_FN float tgm_sqrt(float x) { return sqrtf(x); }
TGM_FN float tgm_sin(float x) { return sinf(x); }
TGM_FN float tgm_cos(float x) { return cosf(x); }
TGM_FN float tgm_tanh(float x) { return tanhf(x); }
TGM_FN float tgm_erf(float x) { return erff(x); }
TGM_FN float tgm_pow(float x, float p) { return p == 2.0f ? x * x : powf(x, p); }
TGM_FN float tgm_gelu(float x, int tanh_form) {
  if (tanh_form)
    return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
  /* PyTorch's CUDA formula: erff costs about half of erfcf, and gelu's
   * backward (x/2 (1 + erf(x/sqrt 2)) + ...) shares it. For x < -3 the
   * result's relative error grows (1 + erf cancels) while its absolute
   * error stays below |x| 1e-7, as PyTorch's. */
  return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}
/* gelu's derivative (gen/interp.c's f_gelu_grad), with the forward's
 * functions. */
TGM_FN float tgm_gelu_grad(float x, int tanh_form) {
  if (tanh_form) {
    float t = tanhf(0.7978845608f * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608f * (1.0f + 0.134145f * x * x);
  }
  return 0.5f * (1.0f + erff(x * 0.70710678118654752f)) + x * expf(-0.5f * x * x) * 0.3989422804f;
}
#else
/* The CPU functions are written to vectorise (an OpenMP simd loop over them
 * compiles to SSE2 or AVX code): no branches and no libm calls but sqrt,
 * sin, cos and pow; special inputs (subnormals, +-0, +-inf, NaN) go through
 * the same arithmetic and bit selects. Their polynomials are minimax fits of
 * the relative error by the Remez exchange, made by tests/unit/fit_math.py
 * (mpmath) and rounded to f32; tests/unit/test_math.c measures every one of
 * them against libm's double over the f32 range (the errors above). */

/* e^(a - b) = 2^n (1 + p), b a small correction to a (a double-float
 * argument, b = 0 for exp): returns p = e^r - 1 and sets *n. Cody and
 * Waite's reduction: a - b = n ln2 + r, |r| <= ln2/2 (n = round((a - b) /
 * ln2) by the 1.5 2^23 trick), ln2 = LN2_HI + LN2_LO with LN2_HI = 355/512
 * (9 bits) so that n LN2_HI and a - n LN2_HI are exact; r kept as r + rl
 * (its rounding error), e^r - 1 = r + (rl + r^2 q(r)), q of degree 5. NaN
 * in, NaN p out. */
TGM_FN float tgm_expr_(float a, float b, int32_t *n) {
  float t = (a - b) * 1.44269504088896341f + 12582912.0f;
  float nf = t - 12582912.0f;
  float rh = a - nf * 0.693359375f, w = b + nf * -2.12194442e-4f;
  float r = rh - w, rl = (rh - r) - w; /* r + rl = rh - w, rl the rounding error (Fast2Sum) */
  float q = ((((1.98578025e-4f * r + 1.39336067e-3f) * r + 8.33336078e-3f) * r + 4.16664667e-2f) * r + 1.66666672e-1f) *
                r + 0.5f;
  *n = (int32_t)(tgm_bitsf(t) - 0x4b400000u);
  return r + (rl + r * r * q);
}
/* m e^(a - b): m e^r as m + m (e^r - 1) (one rounding that counts), then 2^n
 * as two factors 2^h 2^(n-h) so that a subnormal result rounds once and one
 * past FLT_MAX is inf. For a - b in [-174, 88.75] (both factors normal; the
 * callers clamp their arguments to [-128, 88.75] or select). */
TGM_FN float tgm_expm_(float a, float b, float m) {
  int32_t ni;
  float p = tgm_expr_(a, b, &ni);
  int32_t h = ni / 2;
  return (m + m * p) * tgm_fbits((uint32_t)(h + 127) << 23) * tgm_fbits((uint32_t)(ni - h + 127) << 23);
}
/* exp: x clamped to [-104, 88.75] (NaN stays NaN): from 88.75 on the
 * product overflows to inf, below -104 (e^x < 2^-150) it rounds to zero.
 * Error at most 0.87 ulp. */
TGM_FN float tgm_exp(float x) {
  return tgm_expm_(tgm_pick(tgm_m(x < -104.0f), -104.0f, tgm_pick(tgm_m(x > 88.75f), 88.75f, x)), 0.0f, 1.0f);
}
/* log: x = 2^e (1 + f), 1 + f in [sqrt(1/2), sqrt(2)) (e from x's bits less
 * sqrt(1/2)'s, so f = m - 1 is exact), log(1 + f) = f + f^2 q(f), q of
 * degree 9, plus e ln2 as e LN2_HI (exact) + e LN2_LO. A subnormal x is
 * scaled by 2^23 first; log(+-0) = -inf, log(x < 0) = NaN, inf and NaN stay.
 * Error at most 0.92 ulp. */
TGM_FN float tgm_log(float x) {
  uint32_t sub = tgm_m(x < 1.17549435e-38f);
  uint32_t u = tgm_bitsf(tgm_pick(sub, x * 8388608.0f, x)), k = u - 0x3f3504f3u;
  float e = (float)((int32_t)(k >> 23) - (int32_t)((k >> 31) << 9)) - tgm_pick(sub, 23.0f, 0.0f);
  float f = tgm_fbits(u - (k & 0xff800000u)) - 1.0f;
  float q = ((((((((6.86432645e-2f * f - 1.1612983e-1f) * f + 1.17998518e-1f) * f - 1.24107338e-1f) * f +
                 1.42326191e-1f) * f - 1.6668117e-1f) * f + 2.00014532e-1f) * f - 0.25f) * f + 3.33333224e-1f) * f -
            0.5f;
  float y = e * 0.693359375f + (f + (f * f * q + e * -2.12194442e-4f));
  float s = tgm_pick(tgm_m(x == 0), -INFINITY, tgm_pick(tgm_m(x < 0), NAN, x));
  return tgm_pick(tgm_m((x > 0) & (x < INFINITY)), y, s);
}
TGM_FN float tgm_sqrt(float x) { return sqrtf(x); }
TGM_FN float tgm_sin(float x) { return sinf(x); }
TGM_FN float tgm_cos(float x) { return cosf(x); }
/* tanh, odd, computed at a = |x| with the sign put back (tanh(-0) = -0), as
 * E / (E + 2), E = e^2a - 1 = 2^n p + (2^n - 1) from tgm_expr_ (no
 * cancellation: 2^n - 1 is exact and p, e^r - 1, is accurate where n = 0);
 * a capped at 10 (tanh is 1 in f32 from 9.01 on; inf and NaN go through
 * the same arithmetic). One exponential and one division: a vector loop
 * computes every branch, and a polynomial below 0.625 beside 1 - 2 / (e^2a
 * + 1) above (1.31 ulp) took 1.6 times as long. Error at most 2.42 ulp (the
 * rounding of E + 2 and of the quotient, where tanh lies at the top of a
 * binade). */
TGM_FN float tgm_tanh(float x) {
  float a = tgm_abs(x);
  int32_t n;
  float p = tgm_expr_(2.0f * tgm_pick(tgm_m(a > 10.0f), 10.0f, a), 0.0f, &n), s = tgm_fbits((uint32_t)(n + 127) << 23);
  float e = s * p + (s - 1.0f);
  return tgm_fbits(tgm_bitsf(e / (e + 2.0f)) | (tgm_bitsf(x) & 0x80000000u));
}
/* erf(x)/x - 1 for |x| <= 0.75, of z = x^2, degree 5: erf(x) = x + x q(z)
 * (x exact, where x (2/sqrt(pi) + ...) would round 2/sqrt(pi)). */
TGM_FN float tgm_erfq_(float z) {
  return ((((-6.74951356e-4f * z + 5.11434581e-3f) * z - 2.68346239e-2f) * z + 1.12833768e-1f) * z - 3.761262e-1f) * z +
         1.28379166e-1f;
}
/* erfc(u) e^(u^2) for u in [0.75, 11.5], after W. J. Cody ("Rational
 * Chebyshev approximations for the error function", Math. Comp. 1969) with
 * polynomials: below 2, P(u - 1.375); above, S(z) / u, z = 1/u^2 (its
 * asymptotic series is one in 1/u^2); P and S of degree 9, their constant
 * terms as two floats, one Horner with the coefficients selected. Returns
 * P or S (r = 1/u given); the callers divide by u or multiply by r. */
TGM_FN float tgm_erfcp_(float u, float r) {
  uint32_t m = tgm_m(u < 2.0f);
  float v = tgm_pick(m, u - 1.375f, r * r);
  float p = tgm_pick(m, -1.17794654e-4f, -98.6403122f);
  p = p * v + tgm_pick(m, 3.59801808e-4f, 143.882355f);
  p = p * v + tgm_pick(m, -9.29683563e-4f, -95.8760681f);
  p = p * v + tgm_pick(m, 2.5636896e-3f, 39.9546165f);
  p = p * v + tgm_pick(m, -6.80471025e-3f, -12.4411583f);
  p = p * v + tgm_pick(m, 1.70867424e-2f, 3.45651054f);
  p = p * v + tgm_pick(m, -4.05033939e-2f, -1.04849625f);
  p = p * v + tgm_pick(m, 8.98620337e-2f, 4.22932684e-1f);
  p = p * v + tgm_pick(m, -1.84315473e-1f, -2.82092422e-1f);
  p = p * v + tgm_pick(m, -1.14958212e-8f, 2.06175237e-8f);
  return p + tgm_pick(m, 3.43295902e-1f, 5.64189553e-1f);
}
/* v^2 k (k = 1 or 1/2, 0 <= v <= 16) as hi + lo for tgm_expm_: v split at
 * its 12th bit into vh + vl, each of at most 12 bits, so that hi = vh^2 k is
 * exact and lo = vl (2 vh + vl) k has one rounding (|lo| < 2^-10 v^2): e^-v^2
 * keeps its accuracy at large v, where v^2 rounded to f32 would not. */
TGM_FN float tgm_sq_(float v, float k, float *lo) {
  float vh = tgm_fbits(tgm_bitsf(v) & 0xfffff000u), vl = v - vh;
  *lo = vl * (vh + vh + vl) * k;
  return vh * vh * k;
}
/* erfc: (1 - |x|) - |x| q(x^2) below |x| = 0.75 (1 - |x| exact from 0.5
 * on), else e^-x^2 P or e^-x^2 S / |x|; 2 - erfc(|x|) for x < 0. |x| is
 * capped at 11 (erfc(11) is 0 in f32). Error at most 2.65 ulp. Not an op:
 * erf's and gelu's helpers, and the tests'. */
TGM_FN float tgm_erfc(float x) {
  float a = tgm_min(tgm_abs(x), 11.0f), lo, hi = tgm_sq_(a, 1.0f, &lo), p = tgm_erfcp_(a, 1.0f / a);
  float big = tgm_expm_(-hi, lo, tgm_pick(tgm_m(a < 2.0f), p, p / a));
  float r = tgm_pick(tgm_m(a < 0.75f), (1.0f - a) - a * tgm_erfq_(a * a), big);
  return tgm_pick(tgm_m(x < 0), 2.0f - r, r);
}
/* erf: |x| + |x| q(x^2) below |x| = 0.75, else 1 - erfc(|x|); odd (erf(-0)
 * = -0). Error at most 1.19 ulp. */
TGM_FN float tgm_erf(float x) {
  float a = tgm_min(tgm_abs(x), 11.0f), r = 1.0f / a, lo, hi = tgm_sq_(a, 1.0f, &lo), p = tgm_erfcp_(a, r);
  float e = tgm_pick(tgm_m(a < 0.75f), a + a * tgm_erfq_(a * a),
                     1.0f - tgm_expm_(-hi, lo, tgm_pick(tgm_m(a < 2.0f), p, p * r)));
  return tgm_fbits(tgm_bitsf(e) | (tgm_bitsf(x) & 0x80000000u));
}
TGM_FN float tgm_pow(float x, float p) {
  if (p == 2.0f)
    return x * x;
  if (p == 1.0f)
    return x;
  if (p == 0.5f) /* pow(-0, 0.5) = +0, pow(-inf, 0.5) = inf */
    return x == -INFINITY ? INFINITY : sqrtf(x) + 0.0f;
  return powf(x, p);
}
/* gelu. Erf form x Phi(x), u = |x|/sqrt2: below u = 0.75, x/2 ((1 + w) +
 * w q(w^2)), w = x/sqrt2 (1 + w is exact where 1 + erf(w) cancels); above,
 * [x >= 0] x - |x|/2 erfc(u), the product |x|/2 erfc(u) formed inside
 * tgm_expm_ (no cancellation for x < 0, one rounding where it is subnormal;
 * |x|/2 S(z) / u is S(z) / sqrt2); |x| capped at 16 (past it gelu(x) is x
 * or 0); the result has x's sign. Tanh form x/2 (1 + tanh(y)), y =
 * sqrt(2/pi) (x + 0.044715 x^3), as x / (1 + e^-2y) = x e^2y / (1 + e^2y)
 * for y < 0 (the same function, without 1 + tanh's cancellation for x < 0).
 * gelu(-inf) is NaN in both, as the interpreter's formula (and PyTorch's)
 * give: -inf * 0. Relative error at most 2.5e-7 (erf form), 2.0e-7 times
 * the condition number 1 + |2y (1 - s)|, s = 1/(1 + e^-2y), of x s w.r.t.
 * y (tanh form; y in f32 has a few ulps of error; subnormal below -10.2). */
TGM_FN float tgm_gelu(float x, int tanh_form) {
  if (tanh_form) {
    float y = 0.79788456080286535588f * (x + 0.044715f * x * x * x), e = tgm_exp(-2.0f * tgm_abs(y));
    return tgm_pick(tgm_m(y < 0), x * e, x) / (1.0f + e);
  }
  float a = tgm_min(tgm_abs(x), 16.0f), u = a * 0.70710678118654752440f, lo, hi = tgm_sq_(a, 0.5f, &lo);
  float w = x * 0.70710678118654752440f, small = 0.5f * x * ((1.0f + w) + w * tgm_erfq_(u * u));
  float p = tgm_erfcp_(u, 1.0f / u) * tgm_pick(tgm_m(u < 2.0f), -0.5f * a, -0.70710678118654752440f);
  float g = tgm_pick(tgm_m(u < 0.75f), small, tgm_pick(tgm_m(x < 0), 0.0f, x) + tgm_expm_(-hi, lo, p));
  return tgm_pick(tgm_m(x == -INFINITY), NAN, tgm_fbits(tgm_bitsf(g) | (tgm_bitsf(x) & 0x80000000u)));
}
/* gelu's derivative (gen/interp.c's f_gelu_grad). Erf form Phi(x) + x
 * phi(x), phi(x) = e^(-x^2/2) / sqrt(2 pi): below u = |x|/sqrt2 = 0.75, (1 +
 * erf(x/sqrt2))/2 as gelu's, + e^(-x^2/2) x/sqrt(2 pi); above, [x >= 0] +
 * e^(-x^2/2) (x/sqrt(2 pi) -+ erfc(u) e^(u^2)/2), one tgm_expm_ for both
 * terms. Tanh form, s = 1/(1 + e^-2y) = (1 + tanh y)/2: s + s x (1 - s) 2
 * sqrt(2/pi) (1 + 3 0.044715 x^2), s and 1 - s from e^-2|y| (no
 * cancellation), x^2 capped at 1e4 there (so a huge finite x gives 1 or 0,
 * as the interpreter's double). At +-inf both are NaN, as the interpreter's
 * formula: inf * 0. Error relative to |Phi(x)| + |x phi(x)| (the size of
 * the tanh form's two terms) at most 2.2e-7 (erf form), 2.0e-7 times the
 * condition number of y as gelu's (tanh form). */
TGM_FN float tgm_gelu_grad(float x, int tanh_form) {
  if (tanh_form) {
    float y = 0.79788456080286535588f * (x + 0.044715f * x * x * x), e = tgm_exp(-2.0f * tgm_abs(y));
    uint32_t neg = tgm_m(y < 0);
    float d = 1.0f / (1.0f + e), s = tgm_pick(neg, e * d, d), s1 = tgm_pick(neg, d, e * d);
    return s + s * x * s1 * (1.5957691216057307118f * (1.0f + 0.134145f * tgm_min(x * x, 1e4f)));
  }
  float a = tgm_min(tgm_abs(x), 16.0f), u = a * 0.70710678118654752440f, r = 1.0f / u;
  float lo, hi = tgm_sq_(a, 0.5f, &lo);
  float xc = tgm_fbits(tgm_bitsf(a) | (tgm_bitsf(x) & 0x80000000u)), c = 0.39894228040143267794f * xc;
  uint32_t neg = tgm_m(x < 0), sm = tgm_m(u < 0.75f);
  float p = tgm_erfcp_(u, r), w = x * 0.70710678118654752440f;
  float h = 0.5f * tgm_pick(tgm_m(u < 2.0f), p, p * r); /* erfc(u) e^(u^2) / 2 */
  float base = tgm_pick(sm, 0.5f * ((1.0f + w) + w * tgm_erfq_(u * u)), tgm_pick(neg, 0.0f, 1.0f));
  float g = base + tgm_expm_(-hi, lo, tgm_pick(sm, c, c + tgm_pick(neg, h, -h)));
  return tgm_pick(tgm_m(tgm_abs(x) == INFINITY), NAN, g);
}
#endif

/* ---------------------------------------------------------------- CUDA reductions */

#ifdef __CUDACC__
/* N elements of type T as one aligned access (16 bytes for 4 f32 or 8
 * bf16/f16): the vector loads and stores of the generated pointwise kernels,
 * which index .v[lane] in an unrolled loop (registers, not memory). */
template <typename T, int N> struct alignas(sizeof(T) * N) tgm_vec {
  T v[N];
};
/* The iterations of a thread's loop from a up to b (exclusive) in steps of
 * s > 0. The kernels' unrolled loops whose step is known only at run time
 * are counted with it: unrolled, a strided loop tests for its exit between
 * copies, so each copy's loads wait behind a branch (the PTX shows it);
 * counted, the copies' loads can go out together. Measured on GPT-2 (H100,
 * session 18): with the branch-free online softmax, its loss kernel 1.714
 * -> 1.685 ms; its split column sums alone, no change. */
template <typename I> TGM_FN I tgm_steps(I a, I b, I s) {
  return a < b ? (b - a + s - 1) / s : 0;
}
/* Every lane gets the sum (max) of the warp's values, combined in a fixed
 * butterfly order, so the result does not depend on timing. */
TGM_FN float tgm_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
TGM_FN float tgm_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v = tgm_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
/* Online softmax statistics: (*m, *s), a max and the sum of exp(x - max)
 * over some elements, merged with (m2, s2) over others. A max of -inf (no
 * element above it) leaves its sum out unless both are -inf (then the sum
 * is that of exp(-inf - -inf), NaN, as the two-pass sum's); NaN spreads. */
TGM_FN void tgm_online_merge(float *m, float *s, float m2, float s2) {
  float mx = tgm_max(*m, m2);
  if (mx == -INFINITY) {
    *s += s2;
  } else {
    float a = *m == -INFINITY ? 0.0f : *s * tgm_exp(*m - mx), b = m2 == -INFINITY ? 0.0f : s2 * tgm_exp(m2 - mx);
    *s = a + b;
  }
  *m = mx;
}
/* Every lane (every thread of the block) gets the warp's (block's) merged
 * online statistics, combined in a fixed butterfly order (then by warp). */
TGM_FN void tgm_warp_online(float *m, float *s) {
  for (int o = 16; o > 0; o >>= 1)
    tgm_online_merge(m, s, __shfl_xor_sync(0xffffffffu, *m, o), __shfl_xor_sync(0xffffffffu, *s, o));
}
/* The same over the g lanes (g a power of two below 32) that share a row of
 * a kernel with several short rows a warp: lanes g k .. g k + g - 1, each
 * group on its own (a group past the last row has left its loop). */
TGM_FN unsigned tgm_group_mask(int g) { return ((1u << g) - 1u) << (threadIdx.x % 32 / g * g); }
TGM_FN float tgm_group_sum(float v, int g) {
  const unsigned mask = tgm_group_mask(g);
  for (int o = g / 2; o > 0; o >>= 1)
    v += __shfl_xor_sync(mask, v, o);
  return v;
}
TGM_FN float tgm_group_max(float v, int g) {
  const unsigned mask = tgm_group_mask(g);
  for (int o = g / 2; o > 0; o >>= 1)
    v = tgm_max(v, __shfl_xor_sync(mask, v, o));
  return v;
}
TGM_FN void tgm_group_online(float *m, float *s, int g) {
  const unsigned mask = tgm_group_mask(g);
  for (int o = g / 2; o > 0; o >>= 1)
    tgm_online_merge(m, s, __shfl_xor_sync(mask, *m, o), __shfl_xor_sync(mask, *s, o));
}
TGM_FN void tgm_block_online(float *m, float *s) {
  __shared__ float pm[32], ps[32];
  tgm_warp_online(m, s);
  int lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = (blockDim.x + 31) / 32;
  __syncthreads();
  if (lane == 0)
    pm[w] = *m, ps[w] = *s;
  __syncthreads();
  *m = lane < nw ? pm[lane] : -INFINITY;
  *s = lane < nw ? ps[lane] : 0.0f;
  tgm_warp_online(m, s);
}
/* A long row kept in shared memory (render.c's srow): 16 bytes from global src into shared dst without a
 * trip through registers (cp.async), and the wait for all of this thread's copies. A thread reads back only
 * the vectors it copied, so no barrier follows. */
TGM_FN void tgm_cp16(void *dst, const void *src) {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src)
               : "memory"); /* (the thread's reads of dst's old value stay before it) */
#else
  *(uint4 *)dst = *(const uint4 *)src;
#endif
}
TGM_FN void tgm_cp_wait(void) {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
#endif
}
/* Every thread of the block gets the block's sum (max); all threads call it. */
TGM_FN float tgm_block_reduce(float v, int is_max) {
  __shared__ float part[32];
  v = is_max ? tgm_warp_max(v) : tgm_warp_sum(v);
  int lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = (blockDim.x + 31) / 32;
  __syncthreads();
  if (lane == 0)
    part[w] = v;
  __syncthreads();
  v = lane < nw ? part[lane] : (is_max ? -INFINITY : 0.0f);
  return is_max ? tgm_warp_max(v) : tgm_warp_sum(v);
}
/* A block of 32 x k threads, thread (x, y) = (threadIdx.x % 32, threadIdx.x /
 * 32) holding a partial of column x: every thread gets its column's sum
 * (max), the k partials combined in order y = 0, 1, ... */
TGM_FN float tgm_column_reduce(float v, int is_max) {
  __shared__ float part[32][33];
  int x = threadIdx.x % 32, y = threadIdx.x / 32, ny = blockDim.x / 32;
  __syncthreads();
  part[y][x] = v;
  __syncthreads();
  float t = part[0][x];
  for (int j = 1; j < ny; j++)
    t = is_max ? tgm_max(t, part[j][x]) : t + part[j][x];
  return t;
}
/* The same for n <= 8 neighbouring columns a thread (v[0..n-1], each
 * thread's own): one barrier pair for all n, and warp 0's lanes add the k
 * partials of their n columns in order y = 0, 1, ..., n loads in flight at
 * a time. Only warp 0 gets the totals; the others' v are left as they were
 * (the vector column kernels store from warp 0). */
TGM_FN void tgm_column_reduce_v(float *v, int n, int is_max) {
  __shared__ float part[32][8][33];
  int x = threadIdx.x % 32, y = threadIdx.x / 32, ny = blockDim.x / 32;
  __syncthreads();
  for (int l = 0; l < n; l++)
    part[y][l][x] = v[l];
  __syncthreads();
  if (y == 0)
    for (int j = 1; j < ny; j++)
      for (int l = 0; l < n; l++)
        v[l] = is_max ? tgm_max(v[l], part[j][l][x]) : v[l] + part[j][l][x];
}
TGM_FN void tgm_column_sum_v(float *v, int n) { tgm_column_reduce_v(v, n, 0); }
TGM_FN void tgm_column_max_v(float *v, int n) { tgm_column_reduce_v(v, n, 1); }
TGM_FN float tgm_column_sum(float v) { return tgm_column_reduce(v, 0); }
TGM_FN float tgm_column_max(float v) { return tgm_column_reduce(v, 1); }
TGM_FN float tgm_block_sum(float v) { return tgm_block_reduce(v, 0); }
TGM_FN float tgm_block_max(float v) { return tgm_block_reduce(v, 1); }
/* A reduction split over gridDim.y blocks per output tile (the last kernel
 * dim's partials in `part`, one per block, in blockIdx.y order): whether this
 * block is the last of its tile to finish. All threads call it after the
 * block's partials are written; the fence makes them visible before the
 * count says so, and the last block resets the count for the next kernel. */
TGM_FN int tgm_split_last(unsigned *count) {
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(count, 1u) == gridDim.y - 1;
    if (last) {
      *count = 0;
      __threadfence(); /* the others' partials are read after their count */
    }
  }
  __syncthreads();
  return last;
}
/* The last block's total of the gridDim.y partials at part (of one output
 * element, or of each live thread's column): each thread adds a fixed
 * subset in order, then the block (column) combines them as tgm_block_sum
 * (tgm_column_sum) does, so the result does not depend on timing. The loads
 * bypass L1: other blocks wrote the partials. */
TGM_FN float tgm_split_block_reduce(const float *part, int is_max) {
  float v = is_max ? -INFINITY : 0.0f;
  for (unsigned p = threadIdx.x; p < gridDim.y; p += blockDim.x)
    v = is_max ? tgm_max(v, __ldcg(part + p)) : v + __ldcg(part + p);
  return tgm_block_reduce(v, is_max);
}
TGM_FN float tgm_split_column_reduce(const float *part, int live, int is_max) {
  float v = is_max ? -INFINITY : 0.0f;
  const int k = blockDim.x / 32, np = live ? tgm_steps<int>(threadIdx.x / 32, gridDim.y, k) : 0;
#pragma unroll 4
  for (int i = 0; i < np; i++) {
    const float t = __ldcg(part + threadIdx.x / 32 + i * k);
    v = is_max ? tgm_max(v, t) : v + t;
  }
  return tgm_column_reduce(v, is_max);
}
/* The last block's totals of a vector column kernel's split (its n <= 8
 * columns from oc * n; each block's partials a row of n_o floats at part +
 * blockIdx.y * n_o): thread (x, y) adds rows y, y + k, ... in that order
 * (a counted loop, four rows' loads in flight; 16-byte loads where n is a
 * multiple of 4, as the kernel's n_o then is), then warp 0 combines the k
 * partials as tgm_column_reduce_v does. The totals are warp 0's v. */
TGM_FN void tgm_split_column_reduce_v(const float *part, int n_o, int oc, int live, float *v, int n, int is_max) {
  for (int l = 0; l < n; l++)
    v[l] = is_max ? -INFINITY : 0.0f;
  const int k = blockDim.x / 32, y = threadIdx.x / 32, np = live ? tgm_steps<int>(y, gridDim.y, k) : 0;
#pragma unroll 4
  for (int i = 0; i < np; i++) {
    const float *q = part + (size_t)(y + i * k) * n_o + oc * n;
    float t[8];
    for (int l = 0; l < n; l += 4)
      if (n % 4 == 0) {
        const float4 f = __ldcg(reinterpret_cast<const float4 *>(q + l));
        t[l] = f.x, t[l + 1] = f.y, t[l + 2] = f.z, t[l + 3] = f.w;
      } else {
        for (int j = l; j < l + 4 && j < n; j++)
          t[j] = __ldcg(q + j);
      }
    for (int l = 0; l < n; l++)
      v[l] = is_max ? tgm_max(v[l], t[l]) : v[l] + t[l];
  }
  tgm_column_reduce_v(v, n, is_max);
}
TGM_FN void tgm_split_column_sum_v(const float *part, int n_o, int oc, int live, float *v, int n) {
  tgm_split_column_reduce_v(part, n_o, oc, live, v, n, 0);
}
TGM_FN void tgm_split_column_max_v(const float *part, int n_o, int oc, int live, float *v, int n) {
  tgm_split_column_reduce_v(part, n_o, oc, live, v, n, 1);
}
TGM_FN float tgm_split_block_sum(const float *part) { return tgm_split_block_reduce(part, 0); }
TGM_FN float tgm_split_block_max(const float *part) { return tgm_split_block_reduce(part, 1); }
TGM_FN float tgm_split_column_sum(const float *part, int live) { return tgm_split_column_reduce(part, live, 0); }
TGM_FN float tgm_split_column_max(const float *part, int live) { return tgm_split_column_reduce(part, live, 1); }
/* Blocks per output tile of a split reduction of n_r elements: at least
 * `per` elements each, about `total` blocks in all over `tiles` tiles, at
 * most 256 (tgen sizes the partials for this). */
static inline unsigned tgm_split(int64_t n_r, int64_t per, int64_t tiles, int64_t total) {
  int64_t p = (n_r + per - 1) / per, q = (total + tiles - 1) / tiles;
  p = p < q ? p : q;
  return (unsigned)(p < 1 ? 1 : p > 256 ? 256 : p);
}
/* Blocks for n items, `per` to a block: enough to fill the GPU, no more. */
static inline unsigned tgm_blocks(int64_t n, int64_t per) {
  int64_t b = (n + per - 1) / per;
  return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}
/* The same, at most `most` (a row kernel with riders: a row of partials a block). */
static inline unsigned tgm_blocks_most(int64_t n, int64_t per, unsigned most) {
  unsigned b = tgm_blocks(n, per);
  return b < most ? b : most;
}
#endif

#endif
