/* test_optim.c: the optimizer step of templates/runtime/tgm_optim_cpu.c
 * (tgm_cpu_adamw, tgm_cpu_sgd, tgm_cpu_sum_squares, tgm_clip_factor) against
 * PyTorch: the expected values below were printed by
 * tests/unit/make_optim_golden.py, which runs torch.optim.AdamW / SGD
 * (foreach=False, fused=False) and torch.nn.utils.clip_grad_norm_ on the same
 * small tensors for three steps (an oracle independent of these kernels) into
 * tests/unit/optim_golden.h.
 *
 * Cases: AdamW (weight decay on/off, both branches of torch's lerp, grad_scale
 * != 1, bf16 and f16 gradients with a bf16/f16 copy of the params, clipping),
 * SGD (momentum 0 and 0.9, weight decay 0 and 0.01, grad_scale != 1, bf16,
 * clipping); each also tiled to a size that takes the parallel path, at 1 and
 * 3 threads. Then sum_squares (bit-identical at 1, 2, 5 threads; against a
 * long double sum) and the clip factor against clip_grad_norm_.
 *
 * Tolerance (f32 state): |got - want| <= 1e-6 |want| + 1e-7 max |want| over
 * the tensor (torch's vectorised kernels fuse some multiply-adds, so an ulp
 * or two may differ). The bf16/f16 copies must be the round-to-nearest-even
 * of our f32 weights bit for bit (tgm_f32_to_bf16 / _f16), and within one
 * unit in the last place of torch's. Prints one line per failure and
 * "N passed, M failed"; exits nonzero on any failure. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "../../templates/runtime/tgm_optim_cpu.c"
#include "../../templates/runtime/tgm_init.c"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* The expected values (and the Case struct): printed by make_optim_golden.py
 * from PyTorch, checked in. */
#include "optim_golden.h"

static int npass, nfail;

static void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int ok, const char *fmt, ...) {
  if (ok) {
    npass++;
    return;
  }
  nfail++;
  va_list ap;
  va_start(ap, fmt);
  printf("FAIL: ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
}

static double worst_rel; /* the largest error seen, in units of the tolerance */

/* got (n elements, or the tiled copies of them) against want. */
static int close_arr(const float *got, const float *want, int64_t n, int nw) {
  double mx = 0;
  for (int i = 0; i < nw; i++)
    mx = fmax(mx, fabs(want[i]));
  int ok = 1;
  for (int64_t i = 0; i < n; i++) {
    double wv = want[i % nw], d = fabs((double)got[i] - wv), tol = 1e-6 * fabs(wv) + 1e-7 * mx;
    if (!(d <= tol)) {
      if (ok)
        printf("  element %lld: got %.9g, want %.9g (diff %.3g, tol %.3g)\n", (long long)i, got[i], wv, d, tol);
      ok = 0;
    }
    if (tol > 0 && d / tol > worst_rel)
      worst_rel = d / tol;
  }
  return ok;
}

static float low_to_f32(int dt, uint16_t h) { return dt == TGM_BF16 ? tgm_bf16_to_f32(h) : tgm_f16_to_f32(h); }
static uint16_t f32_to_low(int dt, float f) { return dt == TGM_BF16 ? tgm_f32_to_bf16(f) : tgm_f32_to_f16(f); }

/* The low-precision copy: the rounding of our own weights exactly, and within
 * one ulp (adjacent bit patterns, same sign) of torch's. */
static int low_ok(int dt, const uint16_t *low, const float *w, const uint16_t *want, int64_t n, int nw) {
  int ok = 1;
  for (int64_t i = 0; i < n; i++) {
    uint16_t mine = f32_to_low(dt, w[i]), t = want[i % nw];
    int adj = ((mine ^ t) & 0x8000u) == 0 && abs((int)(mine & 0x7fff) - (int)(t & 0x7fff)) <= 1;
    if (low[i] != mine || !adj) {
      if (ok)
        printf("  element %lld: copy 0x%04x (%.6g), rounding of w 0x%04x, torch's 0x%04x (%.6g)\n", (long long)i,
               low[i], low_to_f32(dt, low[i]), mine, t, low_to_f32(dt, t));
      ok = 0;
    }
  }
  return ok;
}

/* Runs a case over `tile` copies of its tensors (19 * tile elements). */
static void run_case(const Case *c, int tile, int threads) {
  const int N = GOLD_N;
  int64_t n = (int64_t)N * tile;
  int es = c->gdt == TGM_F32 ? 4 : 2;
  float *w = malloc(sizeof(float) * n), *s1 = calloc(n, sizeof(float)), *s2 = calloc(n, sizeof(float));
  uint16_t *low = calloc(n, 2);
  unsigned char *g = malloc((size_t)es * n);
  if (!w || !s1 || !s2 || !low || !g) {
    printf("out of memory\n");
    exit(1);
  }
  for (int64_t i = 0; i < n; i++)
    w[i] = c->w0[i % N];
  if (!c->adamw) /* SGD's first step must not read the momentum buffer */
    for (int64_t i = 0; i < n; i++)
      s1[i] = 7.0f;
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
  int sgd_nomom = !c->adamw && c->momentum == 0;
  for (int t = 0; t < GOLD_STEPS; t++) {
    for (int64_t i = 0; i < n; i++)
      memcpy(g + i * es, es == 4 ? (const void *)&c->g[t][i % N] : (const void *)&c->gbits[t][i % N], es);
    double scale = c->scale;
    if (c->max_norm > 0) {
      /* the norm over one copy of the tensor, as torch's */
      double ss = tgm_cpu_sum_squares(g, c->gdt, N);
      scale = tgm_clip_factor(ss, c->max_norm);
      check(fabs(scale - c->scales[t]) <= 1e-6 * c->scales[t], "%s step %d: clip factor %.9g, torch %.9g", c->name,
            t + 1, scale, c->scales[t]);
    }
    void *lowp = c->lowdt >= 0 ? low : NULL;
    if (c->adamw)
      tgm_cpu_adamw(w, g, c->gdt, s1, s2, lowp, c->lowdt, n, c->lr, c->beta1, c->beta2, c->eps, c->wd, t + 1, scale);
    else
      tgm_cpu_sgd(w, g, c->gdt, sgd_nomom ? NULL : s1, lowp, c->lowdt, n, c->lr, c->momentum, c->wd, t + 1, scale);
    char what[160];
    snprintf(what, sizeof what, "%s x%d (%d threads) step %d", c->name, tile, threads, t + 1);
    check(close_arr(w, c->w[t], n, N), "%s: weights", what);
    if (!sgd_nomom)
      check(close_arr(s1, c->s1[t], n, N), "%s: %s", what, c->adamw ? "exp_avg" : "momentum_buffer");
    if (c->adamw)
      check(close_arr(s2, c->s2[t], n, N), "%s: exp_avg_sq", what);
    if (c->lowdt >= 0)
      check(low_ok(c->lowdt, low, w, c->low[t], n, N), "%s: %s copy", what, c->lowdt == TGM_BF16 ? "bf16" : "f16");
  }
  free(w);
  free(s1);
  free(s2);
  free(low);
  free(g);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnext(void) { /* splitmix64 */
  uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void test_sum_squares(void) {
  /* against clip_grad_norm_'s total norm and factor */
  for (int k = 0; k < 2; k++) {
    double ss = tgm_cpu_sum_squares(norm_g, TGM_F32, GOLD_N), total = norm_cases[k][1];
    check(fabs(sqrt(ss) - total) <= 1e-6 * total, "sum_squares: norm %.9g, torch %.9g", sqrt(ss), total);
    double f = tgm_clip_factor(ss, norm_cases[k][0]);
    check(fabs(f - norm_cases[k][2]) <= 1e-6 * norm_cases[k][2], "clip factor (max_norm %g): %.9g, torch %.9g",
          norm_cases[k][0], f, norm_cases[k][2]);
  }
  check(tgm_clip_factor(1e6, 1e9) == 1.0, "clip factor is at most 1");
  check(tgm_clip_factor(0, 1) == 1.0, "clip factor of a zero gradient");
  check(isnan(tgm_clip_factor(NAN, 1)), "clip factor of a NaN norm is NaN (torch.clamp keeps it)");
  check(tgm_clip_factor(INFINITY, 1) == 0.0, "clip factor of an infinite norm");
  check(tgm_cpu_sum_squares(norm_g, TGM_F32, 0) == 0.0, "sum_squares of nothing");

  /* deterministic across thread counts, and accurate */
  const int64_t n = 1000003;
  float *x = malloc(sizeof(float) * n);
  uint16_t *xb = malloc(2 * n), *xh = malloc(2 * n);
  if (!x || !xb || !xh) {
    printf("out of memory\n");
    exit(1);
  }
  long double ref = 0, refb = 0, refh = 0;
  for (int64_t i = 0; i < n; i++) {
    double u = (double)(rnext() >> 11) / 9007199254740992.0;
    x[i] = (float)((u - 0.5) * ((i % 97) ? 1.0 : 300.0));
    xb[i] = tgm_f32_to_bf16(x[i]);
    xh[i] = tgm_f32_to_f16(x[i]);
    long double a = x[i], b = tgm_bf16_to_f32(xb[i]), h = tgm_f16_to_f32(xh[i]);
    ref += a * a;
    refb += b * b;
    refh += h * h;
  }
  const void *xs[3] = {x, xb, xh};
  const int dts[3] = {TGM_F32, TGM_BF16, TGM_F16};
  const char *const dnames[3] = {"f32", "bf16", "f16"};
  const long double refs[3] = {ref, refb, refh};
  for (int d = 0; d < 3; d++) {
    double first = 0;
    const int threads[3] = {1, 2, 5};
    for (int k = 0; k < 3; k++) {
#ifdef _OPENMP
      omp_set_num_threads(threads[k]);
#endif
      double s = tgm_cpu_sum_squares(xs[d], dts[d], n);
      if (k == 0)
        first = s;
      else
        check(memcmp(&s, &first, sizeof s) == 0, "sum_squares %s: %d threads %.17g, 1 thread %.17g",
              dnames[d], threads[k], s, first);
      check(fabsl((long double)s - refs[d]) <= 1e-12L * refs[d], "sum_squares %s (%d threads): %.17g, want %.17Lg",
            dnames[d], threads[k], s, refs[d]);
    }
  }
#ifdef _OPENMP
  omp_set_num_threads(omp_get_num_procs());
#endif
  free(x);
  free(xb);
  free(xh);
}

/* The copies' rounding against tgm_init.c's on a sweep of f32 bit patterns
 * (every 4099th, plus their neighbours): SGD with a zero gradient and no
 * decay leaves w as it is (a signalling NaN may come back quieted). */
static void test_rounding(void) {
  const int64_t n = 3 * ((int64_t)1 << 20);
  float *w = malloc(sizeof(float) * n), *g = calloc(n, sizeof(float));
  uint16_t *low = malloc(2 * n);
  if (!w || !g || !low) {
    printf("out of memory\n");
    exit(1);
  }
  for (int dt = TGM_BF16; dt <= TGM_F16; dt++) {
    for (int64_t i = 0; i < n; i++) {
      uint32_t u = (uint32_t)((i / 3) * 4099u) + (uint32_t)(i % 3) - 1u;
      memcpy(&w[i], &u, 4);
    }
    tgm_cpu_sgd(w, g, TGM_F32, NULL, low, dt, n, 0.1, 0, 0, 1, 1);
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
      if (low[i] != f32_to_low(dt, w[i]))
        bad = i;
    check(bad < 0, "%s copy of %.9g: 0x%04x, tgm_init.c 0x%04x", dt == TGM_BF16 ? "bf16" : "f16",
          bad >= 0 ? w[bad] : 0.0f, bad >= 0 ? low[bad] : 0, bad >= 0 ? f32_to_low(dt, w[bad]) : 0);
  }
  /* an f32 copy is w itself */
  float w1[5] = {1.5f, -2.25f, 0.0f, 3e-40f, 7.0f}, g1[5] = {0}, c1[5];
  tgm_cpu_sgd(w1, g1, TGM_F32, NULL, c1, TGM_F32, 5, 0.1, 0, 0, 1, 1);
  check(memcmp(w1, c1, sizeof w1) == 0, "an f32 copy is the weights");
  free(w);
  free(g);
  free(low);
}

int main(void) {
  for (size_t k = 0; k < sizeof gold_cases / sizeof *gold_cases; k++) {
    run_case(gold_cases[k], 1, 1);
    run_case(gold_cases[k], 5003, 1); /* above OPT_PAR_MIN: the parallel path */
    run_case(gold_cases[k], 5003, 3);
  }
  /* n = 0 is a no-op */
  float w = 1, m = 2, v = 3, gz = 4;
  tgm_cpu_adamw(&w, &gz, TGM_F32, &m, &v, NULL, -1, 0, 0.1, 0.9, 0.999, 1e-8, 0.01, 1, 1);
  tgm_cpu_sgd(&w, &gz, TGM_F32, &m, NULL, -1, 0, 0.1, 0.9, 0.01, 1, 1);
  check(w == 1 && m == 2 && v == 3, "n = 0 changes nothing");
  test_sum_squares();
  test_rounding();
  printf("largest error: %.3g of the tolerance\n", worst_rel);
  printf("%d passed, %d failed\n", npass, nfail);
  return nfail ? 1 : 0;
}
