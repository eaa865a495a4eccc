/* mlp_test_train: training on one device ("cpu" or "cuda"), from the golden
 * vectors' params (the seed) and inputs (tests/golden.safetensors):
 *   1. forward_backward: the loss and every gradient against the reference
 *      interpreter's (expected.train_loss, expected.grad.NAME; dropout on,
 *      step 0); without golden vectors, only that they are finite;
 *   2. the loss falls over a few train_steps on that batch (the lowest
 *      later loss is below the first; every loss finite);
 *   3. a checkpoint saved mid-way and loaded into a fresh model gives the
 *      same losses afterwards, bit for bit.
 * Large models (params over 64 MB) run 1 and a two-step 2 only.
 * Exit: 0 pass, 1 fail, 77 skipped (no GPU, or no train: section). */
#include "mlp_io.h"

#include <stdarg.h>

static double tolerance(int dt) { return dt == MLP_BF16 ? 5e-2 : dt == MLP_F16 ? 1e-2 : 2e-4; }

static int fails;

static void check(int ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s ", ok ? "ok  " : "FAIL");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fails += !ok;
}

/* n train steps; losses into l[0..n) */
static int steps(mlp_model *m, mlp_case *c, int n, float *l) {
  for (int i = 0; i < n; i++)
    if (mlp_train_step_v(m, c->dyn, (const void *const *)c->din, &l[i])) {
      fprintf(stderr, "FAIL: train_step: %s\n", mlp_error(m));
      return -1;
    }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s cpu|cuda GOLDEN.safetensors SCRATCH_DIR\n", argv[0]);
    return 1;
  }
  if (!mlp_info.loss_name) {
    printf("skipped: model %s has no train: section\n", mlp_info.name);
    return 77;
  }
  char err[512];
  mlp_model *m, *m2;
  int rc = mlp_create(argv[1], &m, err, sizeof err);
  if (rc == MLP_EDEVICE && !strcmp(argv[1], "cuda")) {
    printf("skipped: %s\n", err);
    return 77;
  }
  mlp_case c;
  if (rc || mlp_case_open(m, argv[2], &c, err, sizeof err)) {
    fprintf(stderr, "FAIL: %s\n", rc ? err : err);
    return 1;
  }
  int big = mlp_info.param_bytes > ((int64_t)64 << 20);
  /* tolerances follow the least precise dtype of the model (meta.dtype) */
  const mlp_tensor_desc *md = c.have ? mlp_st_find(&c.f, "meta.dtype") : NULL;
  int mdt = md && md->dtype == MLP_I32 ? ((const int32_t *)md->data)[0] : -1;

  /* 1. gradients */
  size_t pb = mlp_param_bytes();
  unsigned char *g = malloc(pb ? pb : 1);
  float loss;
  if (!g || mlp_forward_backward_v(m, c.dyn, (const void *const *)c.din, &loss) || mlp_get_grads(m, g, pb)) {
    fprintf(stderr, "FAIL: forward_backward: %s\n", mlp_error(m));
    return 1;
  }
  const mlp_tensor_desc *wl = c.have ? mlp_st_find(&c.f, "expected.train_loss") : NULL;
  if (wl) {
    double want = ((const float *)wl->data)[0], err1 = fabs(loss - want) / (fabs(want) > 1e-6 ? fabs(want) : 1e-6);
    check(err1 <= tolerance(mdt >= 0 ? mdt : mlp_info.loss_dtype), "%s: %.7g vs reference %.7g", mlp_info.loss_name, loss, want);
  } else {
    check(isfinite(loss), "%s: %.7g is finite (no golden vectors)", mlp_info.loss_name, loss);
  }
  for (int k = 0; k < mlp_info.nparams; k++) {
    const mlp_param_info *p = &mlp_info.params[k];
    char key[300];
    snprintf(key, sizeof key, "expected.grad.%s", p->ckpt);
    const mlp_tensor_desc *w = c.have ? mlp_st_find(&c.f, key) : NULL;
    if (w && mlp_numel(w->rank, w->shape) != p->numel) {
      check(0, "%s: golden gradient has the wrong size", key);
      continue;
    }
    double maxref;
    int finite;
    double e = mlp_rel_err(g + p->offset, p->dtype, w ? (const float *)w->data : NULL, p->numel, &maxref, &finite);
    if (w)
      check(finite && e <= tolerance(mdt >= 0 ? mdt : p->dtype), "grad %s: relative error %.3g (max |ref| %.3g)", p->ckpt, e, maxref);
    else
      check(finite, "grad %s: finite (no golden vectors)", p->ckpt);
  }

  /* 2. the loss falls; 3. resume from a checkpoint */
  enum { N = 12, K = 4 };
  int n = big ? 2 : N, k = big ? 1 : K;
  float l[N], l2[N];
  if (mlp_init_params(m, c.seed) || steps(m, &c, n, l))
    return fprintf(stderr, "FAIL: %s\n", mlp_error(m)), 1;
  printf("losses:");
  int finite = 1;
  for (int i = 0; i < n; i++) {
    printf(" %.5g", l[i]);
    finite &= isfinite(l[i]) ? 1 : 0;
  }
  printf("\n");
  float best = l[1];
  for (int i = 1; i < n; i++)
    best = l[i] < best || !isfinite(best) ? l[i] : best;
  check(finite && best < l[0], "%s falls over the steps: %.6g -> lowest %.6g", mlp_info.loss_name, l[0], best);

  if (big) { /* a property of the runtime, checked on the small models */
    printf("skip resume and determinism checks: a large model (%lld MB of params)\n",
           (long long)(mlp_info.param_bytes >> 20));
    goto done;
  }
  char path[1024];
  snprintf(path, sizeof path, "%s/%s_train_%s.safetensors", argv[3], mlp_info.name, argv[1]);
  if (mlp_init_params(m, c.seed) || steps(m, &c, k, l2) || mlp_save_checkpoint(m, path) ||
      steps(m, &c, n - k, l2 + k))
    return fprintf(stderr, "FAIL: %s\n", mlp_error(m)), 1;
  if (mlp_create(argv[1], &m2, err, sizeof err) || mlp_load_checkpoint(m2, path))
    return fprintf(stderr, "FAIL: resume: %s\n", m2 ? mlp_error(m2) : err), 1;
  float l3[N];
  if (steps(m2, &c, n - k, l3))
    return 1;
  int same = 1;
  for (int i = 0; i < n - k; i++)
    same &= memcmp(&l3[i], &l2[k + i], sizeof(float)) == 0;
  check(same, "resume from %s after %d steps gives the same losses, bit for bit (last %.9g)", path, k, l3[n - k - 1]);
  same = 1;
  for (int i = 0; i < n; i++)
    same &= memcmp(&l[i], &l2[i], sizeof(float)) == 0;
  check(same, "training twice from the seed gives the same losses, bit for bit");

  mlp_destroy(m2);
done:
  mlp_case_close(m, &c);
  mlp_destroy(m);
  free(g);
  printf("%d failed\n", fails);
  return fails ? 1 : 0;
}
