/* test_interp_train.c: training in the reference interpreter (gen/interp_train.c).
 *
 * 1. optim_step and optim_clip_factor, tgen's optimizers in double, against
 *    PyTorch: the cases of tests/unit/optim_golden.h (printed by
 *    make_optim_golden.py from torch.optim.AdamW / SGD, foreach=False, and
 *    clip_grad_norm_), three steps each: the weights and the optimizer state
 *    after every step, the clip factor torch applied, and the bf16/f16 copy
 *    (the rounding of our weights, within one unit in the last place of
 *    torch's). Tolerance: |got - want| <= 2e-6 |want| + 2e-7 max |want|
 *    (torch computes in f32, we in double).
 * 2. interp_train on a model whose losses can be derived by hand:
 *    loss = mse_loss(w, x) with w: [2] (init zeros), so d = w - x,
 *    grad = d (2/n = 1), loss = mean(d^2):
 *      SGD lr        d_{t+1} = (1 - lr) d_t:  loss_t = (1 - lr)^2t loss_0
 *      SGD + clip c  d_1 = d_0 (1 - lr c / (|d_0| + 1e-6))  (when that clips)
 *      AdamW, wd 0   w_1 = -lr g / (|g| + eps) elementwise (m^ = g, v^ = g^2)
 *    within 1e-6 (the params are rounded to f32 after each update); and an
 *    input of NaN or inf stops it with "gradient norm is NaN (inf) at step 1". */
#include "ir.h"
#include "../../templates/runtime/tgm_rt.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static int close_arr(const double *got, const float *want, int n) {
  double mx = 0;
  for (int i = 0; i < n; i++)
    mx = fmax(mx, fabs(want[i]));
  int ok = 1;
  for (int i = 0; i < n; i++) {
    double d = fabs(got[i] - want[i]), tol = 2e-6 * fabs(want[i]) + 2e-7 * mx;
    if (!(d <= tol)) {
      if (ok)
        printf("  element %d: got %.9g, want %.9g (diff %.3g, tol %.3g)\n", i, got[i], want[i], d, tol);
      ok = 0;
    }
    if (tol > 0 && d / tol > worst_rel)
      worst_rel = d / tol;
  }
  return ok;
}

/* ---------------------------------------------------------------- 1. the optimizer */

static void optim_case(const Case *c) {
  Train tr = {.present = 1, .opt = c->adamw ? OPT_ADAMW : OPT_SGD, .lr = c->lr, .beta1 = c->beta1,
              .beta2 = c->beta2, .eps = c->eps, .weight_decay = c->wd, .momentum = c->momentum};
  double w[GOLD_N], g[GOLD_N], m[GOLD_N] = {0}, v[GOLD_N] = {0};
  for (int i = 0; i < GOLD_N; i++)
    w[i] = c->w0[i];
  for (int s = 0; s < GOLD_STEPS; s++) {
    double ss = 0, scale = c->scale;
    for (int i = 0; i < GOLD_N; i++) {
      g[i] = c->g[s][i];
      ss += g[i] * g[i];
    }
    if (c->max_norm > 0) {
      scale = optim_clip_factor(ss, c->max_norm);
      check(fabs(scale - c->scales[s]) <= 1e-6 * c->scales[s], "%s step %d: clip factor %.9g, torch %.9g", c->name,
            s + 1, scale, c->scales[s]);
    }
    optim_step(&tr, w, g, m, v, GOLD_N, s + 1, scale);
    check(close_arr(w, c->w[s], GOLD_N), "%s step %d: weights", c->name, s + 1);
    if (c->adamw || c->momentum != 0)
      check(close_arr(m, c->s1[s], GOLD_N), "%s step %d: %s", c->name, s + 1, c->adamw ? "exp_avg" : "momentum_buffer");
    if (c->adamw)
      check(close_arr(v, c->s2[s], GOLD_N), "%s step %d: exp_avg_sq", c->name, s + 1);
    if (c->lowdt >= 0) {
      int ok = 1;
      for (int i = 0; i < GOLD_N; i++) {
        float f = (float)w[i];
        uint16_t mine = c->lowdt == TGM_BF16 ? tgm_f32_to_bf16(f) : tgm_f32_to_f16(f), t = c->low[s][i];
        double r = round_to_dtype(w[i], c->lowdt == TGM_BF16 ? DT_BF16 : DT_F16);
        double back = c->lowdt == TGM_BF16 ? tgm_bf16_to_f32(mine) : tgm_f16_to_f32(mine);
        ok &= r == back && ((mine ^ t) & 0x8000u) == 0 && abs((int)(mine & 0x7fff) - (int)(t & 0x7fff)) <= 1;
      }
      check(ok, "%s step %d: the rounded copy within one ulp of torch's", c->name, s + 1);
    }
  }
}

/* clip_grad_norm_ over a gradient split over two params */
static void norms(void) {
  double ss = 0;
  for (int i = 0; i < GOLD_N; i++)
    ss += (double)norm_g[i] * norm_g[i];
  for (int k = 0; k < 2; k++) {
    check(fabs(sqrt(ss) - norm_cases[k][1]) <= 1e-6 * norm_cases[k][1], "total norm %.9g, torch %.9g", sqrt(ss),
          norm_cases[k][1]);
    double f = optim_clip_factor(ss, norm_cases[k][0]);
    check(fabs(f - norm_cases[k][2]) <= 1e-6 * norm_cases[k][2], "clip factor (max_norm %g): %.9g, torch %.9g",
          norm_cases[k][0], f, norm_cases[k][2]);
  }
  check(isnan(optim_clip_factor(NAN, 1.0)), "a NaN norm gives a NaN factor (as torch.clamp)");
}

/* ---------------------------------------------------------------- 2. interp_train */

enum { STEPS = 3 };

/* The model loss = mse_loss(w, x) under the given train: body: its losses
 * and the input x; 0, or -1 with err. */
static int train_model(const char *optimizer, double *losses, double *x, char *err, size_t errlen) {
  Arena arena = {0};
  arena.fail_after = -1;
  Diag dg;
  const char *src = arena_printf(&arena,
                                 "name: t\ndtype: f32\ninputs:\n  x: [2]\nparams:\n  w: {shape: [2], init: zeros}\n"
                                 "graph:\n  - loss: mse_loss(w, x)\noutputs: [loss]\ntrain:\n  loss: loss\n%s",
                                 optimizer);
  Graph *g = tgen_load(&dg, &arena, "t.yaml", src, strlen(src));
  int rc = -1;
  if (!g) {
    snprintf(err, errlen, "refused: %.400s", dg.msg);
    goto done;
  }
  if (autodiff(g)) {
    snprintf(err, errlen, "autodiff failed");
    goto done;
  }
  int64_t sym[MAXSYM] = {0};
  Tensor *ins, *ps;
  if (interp_make_args(g, sym, g->spec->seed, &ins, &ps, err, errlen))
    goto done;
  x[0] = ins[0].data[0];
  x[1] = ins[0].data[1];
  InterpOptions o = {sym, 0, g->spec->seed, 0};
  rc = interp_train(g, &o, ins, ps, STEPS, losses, err, errlen);
  interp_free_args(g, ins, ps);
done:
  arena_free(&arena);
  return rc;
}

static int near(double got, double want) { return fabs(got - want) <= 1e-6 * fabs(want) + 1e-12; }

static void interp_cases(void) {
  char err[512];
  double l[STEPS], x[2];
  /* SGD: the distance to x shrinks by (1 - lr) a step */
  if (train_model("  optimizer: {sgd: {lr: 0.25}}\n", l, x, err, sizeof err)) {
    check(0, "sgd: %s", err);
  } else {
    double l0 = (x[0] * x[0] + x[1] * x[1]) / 2;
    check(near(l[0], l0), "sgd: first loss %.9g, by hand %.9g", l[0], l0);
    for (int s = 1; s < STEPS; s++)
      check(near(l[s], l0 * pow(0.75, 2 * s)), "sgd: loss of step %d %.9g, by hand %.9g", s + 1, l[s],
            l0 * pow(0.75, 2 * s));
  }
  /* SGD with a clip that bites on the first step */
  if (train_model("  optimizer: {sgd: {lr: 0.5}}\n  grad_clip: 0.01\n", l, x, err, sizeof err)) {
    check(0, "sgd + clip: %s", err);
  } else {
    double n0 = sqrt(x[0] * x[0] + x[1] * x[1]), k = 1 - 0.5 * 0.01 / (n0 + 1e-6);
    check(n0 > 0.01, "sgd + clip: the clip bites (norm %.3g)", n0);
    check(near(l[1], l[0] * k * k), "sgd + clip: loss of step 2 %.9g, by hand %.9g", l[1], l[0] * k * k);
  }
  /* AdamW without decay: the first update is -lr g / (|g| + eps) */
  if (train_model("  optimizer: {adamw: {lr: 0.01, weight_decay: 0}}\n", l, x, err, sizeof err)) {
    check(0, "adamw: %s", err);
  } else {
    double want = 0;
    for (int i = 0; i < 2; i++) {
      double gi = -x[i], w1 = (double)(float)(-0.01 * gi / (fabs(gi) + 1e-8));
      want += (w1 - x[i]) * (w1 - x[i]) / 2;
    }
    check(near(l[1], want), "adamw: loss of step 2 %.9g, by hand %.9g", l[1], want);
  }
}

/* A NaN or inf input: interp_train refuses the step. */
static void nonfinite(double bad, const char *word) {
  Arena arena = {0};
  arena.fail_after = -1;
  Diag dg;
  const char *src = "name: t\ndtype: f32\ninputs:\n  x: [2]\nparams:\n  w: {shape: [2], init: zeros}\n"
                    "graph:\n  - loss: mse_loss(w, x)\noutputs: [loss]\ntrain:\n  loss: loss\n"
                    "  optimizer: {adamw: {lr: 0.01}}\n";
  Graph *g = tgen_load(&dg, &arena, "t.yaml", src, strlen(src));
  char err[512] = "", want[64];
  int64_t sym[MAXSYM] = {0};
  Tensor *ins, *ps;
  double l[STEPS];
  if (!g || autodiff(g) || interp_make_args(g, sym, 0, &ins, &ps, err, sizeof err)) {
    check(0, "nonfinite: setting up: %s", g ? err : dg.msg);
    arena_free(&arena);
    return;
  }
  ins[0].data[1] = bad;
  InterpOptions o = {sym, 0, 0, 0};
  int rc = interp_train(g, &o, ins, ps, STEPS, l, err, sizeof err);
  snprintf(want, sizeof want, "gradient norm is %s at step 1", word);
  check(rc == -1 && strstr(err, want), "an input of %g: '%s' (%s)", bad, want, err);
  interp_free_args(g, ins, ps);
  arena_free(&arena);
}

int main(void) {
  for (size_t k = 0; k < sizeof gold_cases / sizeof *gold_cases; k++)
    optim_case(gold_cases[k]);
  norms();
  interp_cases();
  nonfinite(NAN, "NaN");
  nonfinite(INFINITY, "inf");
  printf("largest optimizer error: %.3g of the tolerance\n", worst_rel);
  printf("%d passed, %d failed\n", npass, nfail);
  return nfail ? 1 : 0;
}
