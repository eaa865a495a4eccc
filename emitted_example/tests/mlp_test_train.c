/* mlp_test_train: training on one device ("cpu" or "cuda"), from the golden
 * vectors' params (the seed) and inputs (tests/golden.safetensors):
 *   1. forward_backward: the loss and every gradient against the reference
 *      interpreter's (expected.train_loss, expected.grad.NAME; dropout on,
 *      step 0); without golden vectors, only that they are finite; with
 *      train.wrt, forward_backward_wrt: the same loss and param gradients
 *      bit for bit, and each input's gradient (expected.grad.INPUT). A model
 *      without an optimizer stops here (train_step must refuse);
 *   2. the losses of the first train_steps against the interpreter's own
 *      training (expected.train_losses: tgen's optimizer in double, the
 *      params rounded to their dtype after each update), each within the
 *      tolerance of the model's dtype; every loss finite (whether the loss
 *      rises or falls at the spec's learning rate is not checked);
 *   3. a checkpoint saved mid-way and loaded into a fresh model gives the
 *      same losses afterwards, bit for bit;
 *   4. a step whose gradient norm is NaN (all params NaN, through
 *      set_params) fails with MLP_EDATA and "gradient norm is NaN at step N"
 *      and leaves the params, the f32 masters, the optimizer state and the
 *      step count bit-identical (a checkpoint before and after, byte for
 *      byte); with RUNNER (the mlp_run binary), the runner's --train-steps
 *      on those params stops with the message and a non-zero exit status.
 *   5. the same training without waiting for the loss (get_loss at the end)
 *      and with CUDA graphs: the same losses bit for bit; a NaN step found
 *      asynchronously is reported by sync.
 * Large models (params over 64 MB) run 1, a two-step 2 and 4 only.
 * Exit: 0 pass, 1 fail, 77 skipped (no GPU, or no train: section).
 *
 * `mlp_test_train grad-file FILE` checks instead what `mlp_run --grad` wrote
 * to FILE: the loss, every gradient (params and train.wrt inputs), and every
 * output of the forward pass (dtype and rank; an output named like the loss
 * is the loss). */
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

/* The whole of a file (NULL if unreadable); *n its length. */
static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  unsigned char *p = NULL;
  long len = -1;
  if (f && !fseek(f, 0, SEEK_END) && (len = ftell(f)) >= 0 && !fseek(f, 0, SEEK_SET) &&
      (p = malloc((size_t)len + 1)) && fread(p, 1, (size_t)len, f) != (size_t)len) {
    free(p);
    p = NULL;
  }
  if (f)
    fclose(f);
  *n = p ? (size_t)len : 0;
  return p;
}

/* What mlp_run --grad wrote: the loss, grad.NAME for every param, every output. */
static int grad_file(const char *path) {
  mlp_st_file f;
  char err[512];
  if (mlp_st_read(path, &f, err, sizeof err)) {
    fprintf(stderr, "FAIL: %s\n", err);
    return 1;
  }
  const mlp_tensor_desc *t = mlp_st_find(&f, mlp_info.loss_name);
  check(t && t->dtype == MLP_F32 && t->rank == 0, "%s: the loss '%s' (f32 scalar)", path, mlp_info.loss_name);
  for (int k = 0; k < mlp_info.nparams; k++) {
    const mlp_param_info *p = &mlp_info.params[k];
    char key[300];
    snprintf(key, sizeof key, "grad.%s", p->ckpt);
    t = mlp_st_find(&f, key);
    check(t && t->dtype == p->dtype && mlp_numel(t->rank, t->shape) == p->numel, "%s: gradient '%s'", path, key);
  }
  for (int j = 0; j < mlp_info.nwrt; j++) {
    const mlp_io_info *x = &mlp_info.inputs[mlp_info.wrt[j]];
    char key[300];
    snprintf(key, sizeof key, "grad.%s", x->name);
    t = mlp_st_find(&f, key);
    check(t && t->dtype == x->dtype && t->rank == x->rank, "%s: input gradient '%s'", path, key);
  }
  for (int k = 0; k < mlp_info.noutputs; k++) {
    const mlp_io_info *o = &mlp_info.outputs[k];
    t = mlp_st_find(&f, o->name);
    int is_loss = !strcmp(o->name, mlp_info.loss_name);
    check(t && (is_loss || (t->dtype == o->dtype && t->rank == o->rank)), "%s: output '%s' (%s, rank %d)%s", path,
          o->name, mlp_dtype_names[o->dtype], o->rank, is_loss ? ", written as the loss" : "");
  }
  mlp_st_free(&f);
  printf("%d failed\n", fails);
  return fails ? 1 : 0;
}

/* 1, train.wrt: forward_backward_wrt into fresh buffers: the loss and the
 * param gradients (g, from forward_backward) bit for bit, and each input's
 * gradient against expected.grad.INPUT (else finite). */
static void input_grads(mlp_model *m, mlp_case *c, const unsigned char *g, float loss, int mdt) {
  size_t pb = mlp_param_bytes();
  unsigned char *g2 = malloc(pb ? pb : 1);
  mlp_host h[64];
  void *d[64];
  float loss2 = 0;
  int nw = mlp_info.nwrt, ok = g2 != NULL;
  for (int j = 0; j < nw; j++) {
    d[j] = NULL;
    if (mlp_host_alloc(&h[j], 0, mlp_info.wrt[j], c->sym) || mlp_to_device(m, &h[j], &d[j]))
      ok = 0;
  }
  if (!ok || mlp_forward_backward_wrt_v(m, c->dyn, (const void *const *)c->din, d, &loss2) ||
      mlp_get_grads(m, g2, pb)) {
    check(0, "forward_backward_wrt: %s", mlp_error(m));
    goto done;
  }
  check(memcmp(&loss, &loss2, sizeof loss) == 0 && memcmp(g, g2, pb) == 0,
        "forward_backward_wrt: the same loss (%.9g) and param gradients as forward_backward, bit for bit", loss2);
  for (int j = 0; j < nw; j++) {
    const char *name = mlp_info.inputs[mlp_info.wrt[j]].name;
    char key[300];
    snprintf(key, sizeof key, "expected.grad.%s", name);
    if (mlp_from_device(m, &h[j], d[j])) {
      check(0, "copying the gradient of input %s back", name);
      continue;
    }
    const mlp_tensor_desc *w = c->have ? mlp_st_find(&c->f, key) : NULL;
    if (w && mlp_numel(w->rank, w->shape) != h[j].numel) {
      check(0, "%s: golden gradient has the wrong size", key);
      continue;
    }
    double maxref;
    int finite;
    double e = mlp_rel_err(h[j].data, h[j].dtype, w ? (const float *)w->data : NULL, h[j].numel, &maxref, &finite);
    if (w)
      check(finite && e <= tolerance(mdt >= 0 ? mdt : h[j].dtype), "grad %s (input): relative error %.3g (max |ref| %.3g)",
            name, e, maxref);
    else
      check(finite, "grad %s (input): finite (no golden vectors)", name);
  }
  /* a NULL buffer is refused */
  void *dn[64];
  for (int j = 0; j < nw; j++)
    dn[j] = j == nw - 1 ? NULL : d[j];
  check(mlp_forward_backward_wrt_v(m, c->dyn, (const void *const *)c->din, dn, &loss2) == MLP_EINVAL,
        "forward_backward_wrt refuses a NULL gradient buffer: %s", mlp_error(m));
done:
  for (int j = 0; j < nw; j++) {
    if (d[j] && d[j] != h[j].data)
      mlp_device_free(m, d[j]);
    free(h[j].data);
  }
  free(g2);
}

/* 4. A step whose gradient norm is NaN: refused, nothing changes. Leaves m
 * with NaN params. */
static void nonfinite_step(mlp_model *m, mlp_case *c, const char *dir, const char *dev, const char *runner) {
  size_t pb = mlp_param_bytes(), na = 0, nb = 0;
  unsigned char *p0 = malloc(pb ? pb : 1), *p1 = malloc(pb ? pb : 1), *ck0 = NULL, *ck1 = NULL;
  char path[1024], want[160], log[1024], cmd[4096];
  float loss;
  if (!p0 || !p1 || mlp_init_params(m, c->seed) || steps(m, c, 1, &loss) || mlp_get_params(m, p0, pb)) {
    check(0, "NaN gradient: setting up: %s", mlp_error(m));
    goto done;
  }
  for (int k = 0; k < mlp_info.nparams; k++) {
    const mlp_param_info *p = &mlp_info.params[k];
    for (int64_t i = 0; i < p->numel && p->dtype <= MLP_F16; i++)
      mlp_put(p0 + p->offset, p->dtype, i, NAN);
  }
  snprintf(path, sizeof path, "%s/%s_nan_%s.safetensors", dir, mlp_info.name, dev);
  int64_t step0 = mlp_get_step(m);
  if (mlp_set_params(m, p0, pb) || mlp_save_checkpoint(m, path) || !(ck0 = slurp(path, &na))) {
    check(0, "NaN gradient: saving the state before: %s", mlp_error(m));
    goto done;
  }
  int rc = mlp_train_step_v(m, c->dyn, (const void *const *)c->din, &loss);
  snprintf(want, sizeof want, "gradient norm is NaN at step %lld", (long long)(step0 + 1));
  check(rc == MLP_EDATA && strstr(mlp_error(m), want), "a NaN gradient: train_step returns MLP_EDATA (%d): %s", rc,
        mlp_error(m));
  check(mlp_get_step(m) == step0, "a NaN gradient: the step count stays %lld (is %lld)", (long long)step0,
        (long long)mlp_get_step(m));
  check(!mlp_get_params(m, p1, pb) && !memcmp(p0, p1, pb), "a NaN gradient: the params are unchanged, bit for bit");
  check(!mlp_save_checkpoint(m, path) && (ck1 = slurp(path, &nb)) && na == nb && !memcmp(ck0, ck1, na),
        "a NaN gradient: the checkpoint (params, f32 masters, optimizer state, step) is unchanged, byte for byte");
  if (!runner)
    goto done;
  /* the runner: fresh training (step 1) from these params */
  /* named per device: the cpu and cuda tests share the folder and run at once */
  snprintf(path, sizeof path, "%s/%s_nan_params_%s.safetensors", dir, mlp_info.name, dev);
  snprintf(log, sizeof log, "%s/%s_nan_run_%s.log", dir, mlp_info.name, dev);
  snprintf(cmd, sizeof cmd, "\"%s\" --device cpu --params \"%s\" --train-steps 3 >\"%s\" 2>&1", runner, path, log);
  if (mlp_save_params(m, path)) {
    check(0, "a NaN gradient: saving %s: %s", path, mlp_error(m));
    goto done;
  }
  int st = system(cmd);
  free(ck1);
  ck1 = slurp(log, &nb);
  snprintf(want, sizeof want, "gradient norm is NaN at step 1");
  check(st != 0 && ck1 && strstr((const char *)ck1, want), "a NaN gradient: %s exits non-zero (%d) saying '%s'", cmd,
        st, want);
  if (ck1)
    printf("     runner: %s", (const char *)ck1);
done:
  /* the scratch files go (a checkpoint is gigabytes at GPT-2 size) */
  snprintf(path, sizeof path, "%s/%s_nan_%s.safetensors", dir, mlp_info.name, dev);
  remove(path);
  snprintf(path, sizeof path, "%s/%s_nan_params_%s.safetensors", dir, mlp_info.name, dev);
  remove(path);
  free(p0);
  free(p1);
  free(ck0);
  free(ck1);
}

/* 5. The same training without waiting (NULL loss; get_loss at the end),
 * then with CUDA graphs (recorded on the second call, replayed after): the
 * same losses as the synchronous calls, bit for bit; then a NaN gradient
 * found asynchronously: reported by sync, the step count back where it was. */
static void async_steps(mlp_model *m, mlp_case *c, int n, const float *l) {
  float last = NAN, lg[16];
  int rc = mlp_init_params(m, c->seed);
  for (int i = 0; i < n && !rc; i++)
    rc = mlp_train_step_v(m, c->dyn, (const void *const *)c->din, NULL);
  rc = rc ? rc : mlp_get_loss(m, &last);
  check(!rc && !memcmp(&last, &l[n - 1], sizeof last) && mlp_get_step(m) == n,
        "%d train_steps without waiting, then get_loss: %.9g (synchronous %.9g), step %lld: %s", n, last, l[n - 1],
        (long long)mlp_get_step(m), rc ? mlp_error(m) : "");
  int same = !mlp_set_graphs(m, 1) && !mlp_init_params(m, c->seed) && n <= 16 && !steps(m, c, n, lg);
  for (int i = 0; same && i < n; i++)
    same = !memcmp(&lg[i], &l[i], sizeof(float));
  check(same, "%d train_steps with graphs on: the same losses, bit for bit (%s)", n, mlp_error(m));
  size_t pb = mlp_param_bytes();
  unsigned char *p = malloc(pb ? pb : 1);
  if (!p || mlp_get_params(m, p, pb)) {
    check(0, "async NaN: %s", mlp_error(m));
    free(p);
    return;
  }
  for (int k = 0; k < mlp_info.nparams; k++)
    for (int64_t i = 0; i < mlp_info.params[k].numel; i++)
      mlp_put(p + mlp_info.params[k].offset, mlp_info.params[k].dtype, i, NAN);
  int64_t step0 = mlp_get_step(m);
  rc = mlp_set_params(m, p, pb);
  if (!rc)
    rc = mlp_train_step_v(m, c->dyn, (const void *const *)c->din, NULL);
  if (!rc)
    rc = mlp_sync(m); /* cuda: found by the device, reported here */
  check(rc == MLP_EDATA && strstr(mlp_error(m), "gradient norm is NaN") && mlp_get_step(m) == step0,
        "a NaN gradient without waiting: MLP_EDATA (%d) '%s', step %lld (was %lld)", rc, mlp_error(m),
        (long long)mlp_get_step(m), (long long)step0);
  check(mlp_sync(m) == MLP_OK, "reported once: the next sync is clean (%s)", mlp_error(m));
  mlp_set_graphs(m, 0);
  free(p);
}

/* 1b. the loss pass (mlp_loss): where a forward output is the loss, its value equals that output's, within the
 * model dtype's tolerance (tgen may print the loss pass as a call of the forward, the other outputs in its
 * arena: this catches a wrong output slot); and, without dropout, the training pass's loss. */
static void loss_pass(mlp_model *m, const char *device, mlp_case *c, int mdt) {
  float l0 = NAN, l1;
  /* on a fresh model with m's params, so that no earlier call's loss is left where the loss is read */
  mlp_model *fresh = NULL;
  size_t pb = mlp_param_bytes();
  unsigned char *pv = malloc(pb ? pb : 1);
  int rc = !pv || mlp_create(device, &fresh, NULL, 0) || mlp_get_params(m, pv, pb) || mlp_set_params(fresh, pv, pb) ||
           mlp_loss_v(fresh, c->dyn, (const void *const *)c->din, &l0);
  check(!rc && isfinite(l0), "loss: %.7g (%s)", l0, rc ? (fresh ? mlp_error(fresh) : "no model") : "ok");
  mlp_destroy(fresh);
  free(pv);
  double tol = tolerance(mdt >= 0 ? mdt : mlp_info.loss_dtype);
  for (int k = 0; k < mlp_info.noutputs; k++) {
    if (strcmp(mlp_info.outputs[k].name, mlp_info.loss_name))
      continue;
    mlp_host out[64];
    void *dout[64] = {0};
    int ok = 1;
    for (int j = 0; j < mlp_info.noutputs && ok; j++)
      ok = !mlp_host_alloc(&out[j], 1, j, c->sym) && !mlp_to_device(m, &out[j], &dout[j]);
    ok = ok && !mlp_forward_v(m, c->dyn, (const void *const *)c->din, dout) && !mlp_from_device(m, &out[k], dout[k]);
    double f = ok ? mlp_get(out[k].data, out[k].dtype, 0) : NAN;
    check(ok && fabs(l0 - f) <= tol * (fabs(f) > 1e-6 ? fabs(f) : 1e-6), "loss %.7g equals the forward's output '%s' %.7g",
          l0, mlp_info.outputs[k].name, f);
    for (int j = 0; j < mlp_info.noutputs; j++) {
      if (dout[j] && dout[j] != out[j].data)
        mlp_device_free(m, dout[j]);
      free(out[j].data);
    }
  }
  if (!mlp_pass_dropout[MLP_PASS_TRAIN] && !mlp_forward_backward_v(m, c->dyn, (const void *const *)c->din, &l1))
    check(fabs(l0 - l1) <= tol * (fabs(l1) > 1e-6 ? fabs(l1) : 1e-6), "loss %.7g equals forward_backward's %.7g", l0, l1);
}

int main(int argc, char **argv) {
  if (argc != 4 && argc != 5 && !(argc == 3 && !strcmp(argv[1], "grad-file"))) {
    fprintf(stderr, "usage: %s cpu|cuda GOLDEN.safetensors SCRATCH_DIR [RUNNER]\n       %s grad-file FILE\n",
            argv[0], argv[0]);
    return 1;
  }
  if (!mlp_info.loss_name) {
    printf("skipped: model %s has no train: section\n", mlp_info.name);
    return 77;
  }
  if (argc == 3)
    return grad_file(argv[2]);
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
  if (mlp_info.nwrt)
    input_grads(m, &c, g, loss, mdt);
  free(g);
  g = NULL;
  loss_pass(m, argv[1], &c, mdt);
  if (!mlp_info.optimizer) {
    rc = mlp_train_step_v(m, c.dyn, (const void *const *)c.din, &loss);
    check(rc == MLP_EINVAL && strstr(mlp_error(m), "no optimizer"), "train_step without an optimizer is refused: %s",
          mlp_error(m));
    printf("model %s has no optimizer: no training steps to check\n", mlp_info.name);
    mlp_case_close(m, &c);
    mlp_destroy(m);
    printf("%d failed\n", fails);
    return fails ? 1 : 0;
  }

  /* 2. the first losses against the interpreter's training; 3. resume from a checkpoint */
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
  check(finite, "%s is finite over %d train_steps", mlp_info.loss_name, n);
  const mlp_tensor_desc *wls = c.have ? mlp_st_find(&c.f, "expected.train_losses") : NULL;
  if (wls && wls->dtype == MLP_F32 && wls->rank == 1) {
    int nref = (int)(wls->shape[0] < n ? wls->shape[0] : n);
    double maxref, tol = tolerance(mdt >= 0 ? mdt : mlp_info.loss_dtype);
    int fin;
    /* relative to the largest reference loss, as the gradients are */
    mlp_rel_err(l, MLP_F32, (const float *)wls->data, nref, &maxref, &fin);
    for (int i = 0; i < nref; i++) {
      double want = ((const float *)wls->data)[i], e = fabs(l[i] - want) / (maxref > 1e-6 ? maxref : 1e-6);
      check(isfinite(l[i]) && e <= tol, "train_step %d: %s %.7g vs reference %.7g (relative error %.3g, tolerance %.3g)",
            i + 1, mlp_info.loss_name, l[i], want, e, tol);
    }
  } else {
    printf("no reference losses (expected.train_losses) in the golden vectors: not compared\n");
  }

  if (big) { /* a property of the runtime, checked on the small models */
    printf("skip resume and determinism checks: a large model (%lld MB of params)\n",
           (long long)(mlp_info.param_bytes >> 20));
    goto nonfinite;
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
  remove(path);
  same = 1;
  for (int i = 0; i < n; i++)
    same &= memcmp(&l[i], &l2[i], sizeof(float)) == 0;
  check(same, "training twice from the seed gives the same losses, bit for bit");

  mlp_destroy(m2);
  async_steps(m, &c, n, l);
nonfinite:
  /* 4. a NaN gradient norm */
  nonfinite_step(m, &c, argv[3], argv[1], argc == 5 ? argv[4] : NULL);
  mlp_case_close(m, &c);
  mlp_destroy(m);
  printf("%d failed\n", fails);
  return fails ? 1 : 0;
}
