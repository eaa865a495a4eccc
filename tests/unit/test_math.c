/* test_math.c: templates/runtime/tgm_math.h's CPU functions (exp, log, tanh,
 * erf, erfc, gelu and its derivative in both forms, and sigmoid and silu as
 * ops.def prints them) against double-precision references over the f32
 * range, including subnormals, +-0, +-inf and NaN.
 *
 * Every function runs in an OpenMP simd loop, as the generated kernels call
 * it (and every 61st input also through a scalar call, which must give the
 * same bits). The reference is libm's double function (or a formula in
 * double without cancellation: gelu as x erfc(-x/sqrt2)/2, its tanh form as
 * x / (1 + e^-2y)), which is within 1e-16 of the interpreter's double.
 *
 * Error: for exp, log, tanh, erf, erfc and sigmoid in ulps of the exact
 * value, |got - ref| / 2^(max(ilogb(ref), -126) - 23), the ulp of the f32
 * binade the exact value lies in (a subnormal's ulp is 2^-149); for gelu,
 * silu and the derivatives (whose values cross or approach zero where their
 * terms cancel) relative to the size of the terms, |got - ref| / max(scale,
 * 2^-126), scale = |gelu(x)|, |silu(x)|, or |Phi(x)| + |x phi(x)|; for the
 * tanh forms (s = (1 + tanh y)/2) |gelu(x)| and |s| + |s 2k x (1 - s)(1 +
 * 3c x^2)| times 1 + |2y (1 - s)|, the condition number of their argument
 * y = k (x + c x^3), which f32 rounds by a few ulps (without that factor
 * their relative error reaches 1.6e-5 near x = -10). Where the exact value
 * is NaN the result must be NaN, where it rounds to +-inf the same
 * infinity; a few special inputs must give exact results (the table
 * `specials`). Each
 * function has a stated maximum error (the table `fns`, and tgm_math.h's
 * header) that the test asserts: it fails when any input exceeds it.
 *
 * Inputs: CI (no arguments) every 31st bit pattern of all 2^32 (about 139
 * million per function), every sign and exponent with the mantissas 0, 1, 2,
 * 2^22, 2^23 - 2 and 2^23 - 1, and 2^16 patterns around each function's
 * critical points (thresholds, zeros, the ends of its intervals).
 *   test_math --all [NAME...]   every one of the 2^32 inputs (a minute per
 *                               function on 2 cores; 9 minutes in all)
 *   test_math --bench           ns per element of each function's simd loop
 *                               over 16M floats, one thread
 * Prints a line per function and "N passed, M failed"; exits nonzero on any
 * failure. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "../../templates/runtime/tgm_math.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__GNUC__) || defined(__clang__)
#define NOINLINE __attribute__((noinline))
#else
#define NOINLINE
#endif

static int npass, nfail;

/* ---------------------------------------------------------------- the functions */

/* Each function as the kernels call it (v_NAME: a simd loop over an array)
 * and as a scalar call (s_NAME, not inlined). */
#define FN(NAME, E)                                                                                                    \
  static void v_##NAME(const float *restrict in, float *restrict out, int n) {                                         \
    TGM_OMP(simd)                                                                                                      \
    for (int i = 0; i < n; i++) {                                                                                      \
      float x = in[i];                                                                                                 \
      out[i] = E;                                                                                                      \
    }                                                                                                                  \
  }                                                                                                                    \
  static NOINLINE float s_##NAME(float x) { return E; }
FN(exp, tgm_exp(x))
FN(log, tgm_log(x))
FN(tanh, tgm_tanh(x))
FN(erf, tgm_erf(x))
FN(erfc, tgm_erfc(x))
FN(sigmoid, tgm_div(1.0f, 1.0f + tgm_exp(-x))) /* ops.def's expressions */
FN(silu, tgm_div(x, 1.0f + tgm_exp(-x)))
FN(gelu, tgm_gelu(x, 0))
FN(gelu_tanh, tgm_gelu(x, 1))
FN(gelu_grad, tgm_gelu_grad(x, 0))
FN(gelu_grad_tanh, tgm_gelu_grad(x, 1))

/* The references, in double; *scale is what a relative error is taken
 * against (unused for the ulp metric). */
static const double K = 0.79788456080286535588, C = 0.044715; /* sqrt(2/pi), the tanh form's cubic */
static double r_exp(double x, double *s) { return *s = exp(x); }
static double r_log(double x, double *s) { return *s = log(x); }
static double r_tanh(double x, double *s) { return *s = tanh(x); }
static double r_erf(double x, double *s) { return *s = erf(x); }
static double r_erfc(double x, double *s) { return *s = erfc(x); }
static double r_sigmoid(double x, double *s) { return *s = 1.0 / (1.0 + exp(-x)); }
static double r_silu(double x, double *s) {
  double v = x / (1.0 + exp(-x));
  *s = fabs(v);
  return v;
}
static double r_gelu(double x, double *s) {
  double g = 0.5 * x * erfc(-x * 0.70710678118654752440);
  *s = fabs(g);
  return g;
}
/* The tanh forms' scale includes |2y (1 - s)|, the factor by which a
 * relative error in y (y rounded in f32 has a few ulps) reaches x s. */
static double r_gelu_tanh(double x, double *s) {
  double y = K * (x + C * x * x * x), e = exp(-2.0 * fabs(y)), sg = y < 0 ? e / (1.0 + e) : 1.0 / (1.0 + e);
  double g = x * sg;
  *s = fabs(g) * (1.0 + fabs(2.0 * y) * (1.0 - sg));
  return g;
}
static double r_gelu_grad(double x, double *s) {
  double phi = 0.5 * erfc(-x * 0.70710678118654752440), xp = x * exp(-0.5 * x * x) * 0.39894228040143267794;
  *s = fabs(phi) + fabs(xp);
  return phi + xp;
}
static double r_gelu_grad_tanh(double x, double *s) {
  double y = K * (x + C * x * x * x), e = exp(-2.0 * fabs(y)), d = 1.0 / (1.0 + e);
  double sg = y < 0 ? e * d : d, s1 = y < 0 ? d : e * d; /* s, 1 - s */
  double t = sg * x * s1 * 2.0 * K * (1.0 + 3.0 * C * x * x);
  *s = (fabs(sg) + fabs(t)) * (1.0 + fabs(2.0 * y) * s1);
  return sg + t;
}

typedef struct Fn {
  const char *name;
  void (*v)(const float *, float *, int);
  float (*s)(float);
  double (*ref)(double, double *);
  int rel;        /* 0: ulps of the exact value; 1: relative to *scale */
  double bound;   /* the stated maximum error */
  float tail;     /* below it, only |got - ref| <= tail_abs is asserted (0: none) */
  double tail_abs;
  float crit[8];  /* critical points: 2^16 patterns around each (a 0 after the first ends the list) */
} Fn;

/* The stated maximum errors, asserted; the largest measured over all 2^32
 * inputs (--all) is in the comment. */
static const Fn fns[] = {
    /* name, simd loop, scalar call, reference, metric, bound (measured max), tail, critical points */
    {"exp", v_exp, s_exp, r_exp, 0, 1.0 /* 0.868 */, 0, 0, {88.72284f, -87.33655f, -103.97208f, 1.0f, -1.0f, 0.34657f}},
    {"log", v_log, s_log, r_log, 0, 1.0 /* 0.917 */, 0, 0, {1.0f, 1.41421354f, 0.70710677f, 1.17549435e-38f, 2.0f}},
    {"tanh", v_tanh, s_tanh, r_tanh, 0, 2.5 /* 2.424 */, 0, 0, {0.17329f, -0.17329f, 0.0625f, 9.0f, 10.0f, 0.1f}},
    {"erf", v_erf, s_erf, r_erf, 0, 1.5 /* 1.192 */, 0, 0, {0.75f, -0.75f, 2.0f, 3.9f, 11.0f}},
    {"erfc", v_erfc, s_erfc, r_erfc, 0, 3.0 /* 2.645 */, 0, 0, {0.75f, -0.75f, 2.0f, 9.194f, 10.0542f, 11.0f}},
    /* sigmoid, silu: below -88.72, e^-x is inf in f32 and the result 0 (the
     * exact value is below 2.94e-39, or 2.61e-37 in size for silu) */
    {"sigmoid", v_sigmoid, s_sigmoid, r_sigmoid, 0, 2.5 /* 2.481 */, -88.72f, 3.0e-39,
     {-88.7228f, -87.33655f, 17.0f}},
    {"silu", v_silu, s_silu, r_silu, 1, 2e-7 /* 1.75e-7 */, -88.72f, 2.7e-37, {-88.7228f, 0.0f, -1.0f, 17.0f}},
    {"gelu", v_gelu, s_gelu, r_gelu, 1, 3e-7 /* 2.47e-7 */, 0, 0,
     {1.06066f, -1.06066f, -2.828427f, -13.0f, -14.2f, 16.0f}},
    /* the tanh forms: below -10.2 the result is subnormal, from e^-2|y|
     * subnormal (a few bits): the absolute error is asserted there */
    {"gelu_tanh", v_gelu_tanh, s_gelu_tanh, r_gelu_tanh, 1, 2.5e-7 /* 1.99e-7 */, -10.2f, 5e-44, {-3.0f, -10.0f, 3.0f}},
    {"gelu_grad", v_gelu_grad, s_gelu_grad, r_gelu_grad, 1, 2.5e-7 /* 2.17e-7 */, 0, 0,
     {1.06066f, -1.06066f, -2.828427f, -0.75179f, -14.0f, 16.0f}},
    {"gelu_grad_tanh", v_gelu_grad_tanh, s_gelu_grad_tanh, r_gelu_grad_tanh, 1, 2.5e-7 /* 1.96e-7 */, -10.2f, 1e-42,
     {-0.7539f, -3.0f, -10.0f, 3.0f}},
};
enum { NFN = sizeof fns / sizeof fns[0] };

/* Exact results: function, input, expected (NaN: any NaN; the sign of a
 * zero or an infinity must match). */
static const struct {
  const char *name;
  float x, want;
} specials[] = {
    {"exp", 0.0f, 1.0f}, {"exp", -0.0f, 1.0f}, {"exp", INFINITY, INFINITY}, {"exp", -INFINITY, 0.0f},
    {"exp", NAN, NAN}, {"exp", 88.73f, INFINITY}, {"exp", -104.0f, 0.0f}, {"exp", 1e30f, INFINITY},
    {"exp", -1e30f, 0.0f}, {"exp", 1e-45f, 1.0f},
    {"log", 1.0f, 0.0f}, {"log", 0.0f, -INFINITY}, {"log", -0.0f, -INFINITY}, {"log", -1e-45f, NAN},
    {"log", -1.0f, NAN}, {"log", -INFINITY, NAN}, {"log", INFINITY, INFINITY}, {"log", NAN, NAN},
    {"log", 2.0f, 0.693147182f},
    {"tanh", 0.0f, 0.0f}, {"tanh", -0.0f, -0.0f}, {"tanh", INFINITY, 1.0f}, {"tanh", -INFINITY, -1.0f},
    {"tanh", NAN, NAN}, {"tanh", 20.0f, 1.0f}, {"tanh", -1e-45f, -1e-45f},
    {"erf", 0.0f, 0.0f}, {"erf", -0.0f, -0.0f}, {"erf", INFINITY, 1.0f}, {"erf", -INFINITY, -1.0f}, {"erf", NAN, NAN},
    {"erf", 5.0f, 1.0f}, {"erf", -1e30f, -1.0f},
    {"erfc", 0.0f, 1.0f}, {"erfc", INFINITY, 0.0f}, {"erfc", -INFINITY, 2.0f}, {"erfc", NAN, NAN},
    {"erfc", 11.0f, 0.0f}, {"erfc", -1e30f, 2.0f},
    {"sigmoid", 0.0f, 0.5f}, {"sigmoid", -0.0f, 0.5f}, {"sigmoid", INFINITY, 1.0f}, {"sigmoid", -INFINITY, 0.0f},
    {"sigmoid", NAN, NAN},
    {"silu", INFINITY, INFINITY}, {"silu", NAN, NAN},
    {"gelu", 0.0f, 0.0f}, {"gelu", -0.0f, -0.0f}, {"gelu", INFINITY, INFINITY}, {"gelu", -INFINITY, NAN},
    {"gelu", NAN, NAN}, {"gelu", 1e30f, 1e30f}, {"gelu", -1e30f, -0.0f},
    {"gelu_tanh", 0.0f, 0.0f}, {"gelu_tanh", INFINITY, INFINITY}, {"gelu_tanh", -INFINITY, NAN},
    {"gelu_tanh", NAN, NAN}, {"gelu_tanh", 1e30f, 1e30f},
    {"gelu_grad", 0.0f, 0.5f}, {"gelu_grad", INFINITY, NAN}, {"gelu_grad", -INFINITY, NAN}, {"gelu_grad", NAN, NAN},
    {"gelu_grad", 30.0f, 1.0f}, {"gelu_grad", 1e30f, 1.0f}, {"gelu_grad", -30.0f, 0.0f},
    {"gelu_grad_tanh", 0.0f, 0.5f}, {"gelu_grad_tanh", INFINITY, NAN}, {"gelu_grad_tanh", -INFINITY, NAN},
    {"gelu_grad_tanh", NAN, NAN}, {"gelu_grad_tanh", 30.0f, 1.0f}, {"gelu_grad_tanh", 1e30f, 1.0f},
    {"gelu_grad_tanh", -30.0f, 0.0f},
};

/* ---------------------------------------------------------------- errors */

static float fbits(uint32_t u) { return tgm_fbits(u); }
static uint32_t bitsf(float f) { return tgm_bitsf(f); }

/* The error of got against ref (see the top): 0 where both are the same NaN
 * or infinity, INFINITY where they differ in kind. */
static double error_of(const Fn *f, double ref, double scale, float got) {
  const double ovf = ldexp(2.0 - ldexp(1.0, -24), 127); /* FLT_MAX + half an ulp: rounds to inf */
  if (isnan(ref) || isnan(got))
    return isnan(ref) && isnan(got) ? 0.0 : INFINITY;
  if (fabs(ref) >= ovf)
    return got == (ref > 0 ? INFINITY : -INFINITY) ? 0.0 : INFINITY;
  if (isinf(got))
    return INFINITY;
  double d = fabs((double)got - ref);
  if (f->rel)
    return d / fmax(scale, ldexp(1.0, -126));
  int e = ref == 0 ? -126 : ilogb(ref);
  return d / ldexp(1.0, (e < -126 ? -126 : e) - 23);
}

typedef struct Stat {
  double max, tmax; /* the largest error; the largest |got - ref| in the tail */
  float at, tat;     /* where */
  double n, bad;     /* inputs checked; those over the bound (or NaN / inf mismatches) */
  int mismatch;      /* scalar calls that gave other bits than the simd loop */
} Stat;

enum { BLK = 4096 };

/* Checks n inputs x[] of f into st. */
static void check_block(const Fn *f, const float *x, int n, Stat *st) {
  float y[BLK];
  f->v(x, y, n);
  for (int i = 0; i < n; i++) {
    double scale = 0, ref = f->ref((double)x[i], &scale);
    if (f->tail != 0 && x[i] < f->tail) {
      double d = isnan(ref) ? (isnan(y[i]) ? 0.0 : INFINITY) : fabs((double)y[i] - ref);
      if (!(d <= f->tail_abs))
        st->bad++;
      if (!(d <= st->tmax))
        st->tmax = d, st->tat = x[i];
    } else {
      double e = error_of(f, ref, scale, y[i]);
      if (!(e <= f->bound))
        st->bad++;
      if (!(e <= st->max))
        st->max = e, st->at = x[i];
    }
    if (i % 61 == 0) {
      float s = f->s(x[i]);
      if (bitsf(s) != bitsf(y[i]) && !(s != s && y[i] != y[i]))
        st->mismatch++;
    }
  }
  st->n += n;
}

static void merge(Stat *a, const Stat *b) {
  if (!(b->max <= a->max))
    a->max = b->max, a->at = b->at;
  if (!(b->tmax <= a->tmax))
    a->tmax = b->tmax, a->tat = b->tat;
  a->n += b->n, a->bad += b->bad, a->mismatch += b->mismatch;
}

/* Every stride-th bit pattern (the stride odd, so all low bits vary), split
 * over the threads in blocks; in CI also the exponent boundaries and the
 * patterns around f's critical points. */
static Stat sweep(const Fn *f, uint64_t stride, int extra) {
  Stat all = {0};
  uint64_t nblk = ((1ull << 32) / stride + BLK - 1) / BLK;
#ifdef _OPENMP
#pragma omp parallel
#endif
  {
    Stat st = {0};
    float x[BLK];
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 16)
#endif
    for (int64_t b = 0; b < (int64_t)nblk; b++) {
      int n = 0;
      for (uint64_t i = (uint64_t)b * BLK; i < (uint64_t)(b + 1) * BLK && i * stride < (1ull << 32); i++)
        x[n++] = fbits((uint32_t)(i * stride));
      check_block(f, x, n, &st);
    }
#ifdef _OPENMP
#pragma omp critical
#endif
    merge(&all, &st);
  }
  if (extra) {
    static const uint32_t mant[] = {0, 1, 2, 1u << 22, (1u << 23) - 2, (1u << 23) - 1};
    float x[BLK];
    int n = 0;
    for (uint32_t s = 0; s < 2; s++)
      for (uint32_t e = 0; e < 256; e++)
        for (int m = 0; m < 6; m++)
          x[n++] = fbits(s << 31 | e << 23 | mant[m]);
    check_block(f, x, n, &all);
    for (int c = 0; c < 8 && (c == 0 || f->crit[c] != 0); c++)
      for (int b = 0; b < 16; b++) {
        for (int i = 0; i < BLK; i++)
          x[i] = fbits(bitsf(f->crit[c]) + (uint32_t)(b * BLK + i) - 32768u);
        check_block(f, x, BLK, &all);
      }
  }
  return all;
}

/* ---------------------------------------------------------------- bench */

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ns per element of each function's simd loop over 16M inputs spread over
 * [lo, hi], the best of 5 runs, one thread. */
static void bench(void) {
  static const struct {
    const char *name;
    float lo, hi;
  } r[] = {{"exp", -80, 80},   {"log", 1e-30f, 1e30f},     {"tanh", -10, 10},          {"erf", -5, 5},
           {"erfc", -5, 10},   {"sigmoid", -20, 20},       {"silu", -20, 20},          {"gelu", -8, 8},
           {"gelu_tanh", -8, 8}, {"gelu_grad", -8, 8},     {"gelu_grad_tanh", -8, 8}};
  int n = 1 << 24;
  float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
  if (!x || !y)
    exit(1);
  for (size_t k = 0; k < sizeof r / sizeof r[0]; k++) {
    const Fn *f = NULL;
    for (int i = 0; i < NFN; i++)
      if (!strcmp(fns[i].name, r[k].name))
        f = &fns[i];
    for (int i = 0; i < n; i++) /* a scrambled spread over [lo, hi] */
      x[i] = r[k].lo + (r[k].hi - r[k].lo) * (float)(((uint32_t)i * 2654435761u) >> 8) * (1.0f / 16777216.0f);
    double best = 1e30, sum = 0;
    for (int rep = 0; rep < 5; rep++) {
      double t0 = now();
      f->v(x, y, n);
      double t = now() - t0;
      best = t < best ? t : best;
    }
    for (int i = 0; i < n; i += 4099)
      sum += y[i];
    printf("%-15s %6.2f ns/element over [%g, %g]  (%g)\n", f->name, best * 1e9 / n, r[k].lo, r[k].hi, sum);
  }
  free(x), free(y);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv) {
  int all = argc > 1 && !strcmp(argv[1], "--all");
  setvbuf(stdout, NULL, _IOLBF, 0); /* a line per function as it finishes, also into a file */
  if (argc > 1 && !strcmp(argv[1], "--bench")) {
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    bench();
    return 0;
  }
  if (argc > 1 && !all) {
    fprintf(stderr, "usage: test_math [--all [NAME...] | --bench]\n");
    return 2;
  }

  for (size_t k = 0; k < sizeof specials / sizeof specials[0]; k++) {
    const Fn *f = NULL;
    for (int i = 0; i < NFN; i++)
      if (!strcmp(fns[i].name, specials[k].name))
        f = &fns[i];
    float x = specials[k].x, want = specials[k].want, got;
    f->v(&x, &got, 1);
    int ok = want != want ? got != got : bitsf(got) == bitsf(want);
    if (ok) {
      npass++;
    } else {
      nfail++;
      printf("FAIL %s(%.9g) = %.9g, want %.9g\n", f->name, x, got, want);
    }
  }

  printf("%-15s %12s %12s  %-16s %8s  %s\n", "function", "inputs", "max error", "at", "bound", "metric");
  for (int i = 0; i < NFN; i++) {
    const Fn *f = &fns[i];
    if (all && argc > 2) {
      int want = 0;
      for (int a = 2; a < argc; a++)
        want |= !strcmp(argv[a], f->name);
      if (!want)
        continue;
    }
    double t0 = now();
    Stat st = sweep(f, all ? 1 : 31, !all);
    int ok = st.bad == 0 && st.mismatch == 0;
    printf("%-15s %12.0f %12.4g  %-16.9g %8.3g  %s%s  %.1f s\n", f->name, st.n, st.max, st.at, f->bound,
           f->rel ? "relative" : "ulp", ok ? "" : "  FAIL", now() - t0);
    if (f->tail != 0)
      printf("%-15s below %.9g: max |got - ref| %.3g at %.9g (bound %.3g)\n", "", f->tail, st.tmax, st.tat,
             f->tail_abs);
    if (st.bad)
      printf("  %.0f inputs over the bound\n", st.bad);
    if (st.mismatch)
      printf("  %d scalar calls gave other bits than the simd loop\n", st.mismatch);
    ok ? npass++ : nfail++;
  }
  printf("%d passed, %d failed\n", npass, nfail);
  return nfail != 0;
}
