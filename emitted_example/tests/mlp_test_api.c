/* mlp_test_api: bad arguments, bad dims and bad checkpoints are refused with
 * a status and a message; nothing aborts; a failed load leaves the params as
 * they were; save + load round-trips exactly; the thread count
 * (mlp_set_threads) changes no result. Usage: mlp_test_api TMPDIR [GOLDEN]
 * (the files it writes there are removed at the end: at GPT-2 size they are
 * gigabytes; GOLDEN: the golden test's dims, seed and inputs). */
#include "mlp_io.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static int passed, failed;

static void check(int cond, const char *what, const char *detail) {
  if (cond)
    passed++;
  else
    failed++;
  printf("%s %s%s%s\n", cond ? "ok  " : "FAIL", what, detail && *detail ? ": " : "", detail ? detail : "");
}

static int contains(const char *s, const char *sub) { return s && strstr(s, sub) != NULL; }

/* What one thread count computes on the case: the outputs, then (train:)
 * the loss and the gradient buffer, as host bytes. */
typedef struct results {
  int n;
  void *data[66];
  size_t bytes[66];
  int dtype[66];
  const char *name[66];
} results;

static void results_free(results *r) {
  for (int i = 0; i < r->n; i++)
    free(r->data[i]);
  r->n = 0;
}

/* The case's forward pass (and forward_backward) with `threads` threads
 * (-1: the model's default); 0, or -1 with the message in err. */
static int run_threads(mlp_model *m, mlp_case *c, int threads, results *r, char *err, size_t errlen) {
  memset(r, 0, sizeof *r);
  if (threads >= 0 && mlp_set_threads(m, threads))
    return snprintf(err, errlen, "set_threads(%d): %s", threads, mlp_error(m)), -1;
  mlp_host out[64];
  void *dout[64] = {0};
  int rc = 0;
  for (int k = 0; k < mlp_info.noutputs; k++, r->n++) {
    if (mlp_host_alloc(&out[k], 1, k, c->sym) || mlp_to_device(m, &out[k], &dout[k]))
      return snprintf(err, errlen, "allocating output '%s'", mlp_info.outputs[k].name), -1;
    r->data[k] = out[k].data;
    r->bytes[k] = (size_t)out[k].numel * (size_t)mlp_dtype_sizes[out[k].dtype];
    r->dtype[k] = out[k].dtype;
    r->name[k] = mlp_info.outputs[k].name;
  }
  rc = mlp_forward_v(m, c->dyn, (const void *const *)c->din, dout);
  if (!rc)
    rc = mlp_sync(m);
  for (int k = 0; k < mlp_info.noutputs; k++) {
    if (!rc && mlp_from_device(m, &out[k], dout[k]))
      rc = MLP_EDEVICE;
    if (dout[k] && dout[k] != out[k].data)
      mlp_device_free(m, dout[k]);
  }
  if (rc)
    return snprintf(err, errlen, "forward with %d threads: %s", threads, mlp_error(m)), -1;
  if (mlp_info.loss_name) {
    float *loss = malloc(sizeof *loss);
    size_t nb = mlp_param_bytes();
    unsigned char *g = malloc(nb ? nb : 1);
    r->data[r->n] = loss, r->bytes[r->n] = sizeof *loss, r->dtype[r->n] = MLP_F32, r->name[r->n++] = mlp_info.loss_name;
    r->data[r->n] = g, r->bytes[r->n] = nb, r->dtype[r->n] = -1, r->name[r->n++] = "gradients";
    if (!loss || !g || mlp_forward_backward_v(m, c->dyn, (const void *const *)c->din, loss) || mlp_get_grads(m, g, nb))
      return snprintf(err, errlen, "forward_backward with %d threads: %s", threads, mlp_error(m)), -1;
  }
  return 0;
}

/* The golden test's tolerance for a dtype: max|got - want| / max|want|. */
static double tolerance(int dt) { return dt == MLP_BF16 ? 3e-2 : dt == MLP_F16 ? 5e-3 : 1e-4; }

/* got against want, tensor by tensor (the gradients param by param): 1 when
 * bit-identical, 0 when within the tolerance, -1 when not; what differs
 * most goes into detail. */
static int compare(const results *got, const results *want, char *detail, size_t n) {
  int same = 1, ok = 1;
  double worst = 0;
  const char *where = "";
  snprintf(detail, n, "bit-identical");
  for (int i = 0; i < want->n; i++) {
    if (!memcmp(got->data[i], want->data[i], want->bytes[i]))
      continue;
    same = 0;
    int np = want->dtype[i] < 0 ? mlp_info.nparams : 1;
    for (int k = 0; k < np; k++) {
      int dt = want->dtype[i] < 0 ? mlp_info.params[k].dtype : want->dtype[i];
      size_t off = want->dtype[i] < 0 ? (size_t)mlp_info.params[k].offset : 0;
      int64_t numel = want->dtype[i] < 0 ? mlp_info.params[k].numel : (int64_t)(want->bytes[i] / (size_t)mlp_dtype_sizes[dt]);
      float *ref = malloc((size_t)(numel + 1) * sizeof *ref);
      if (!ref)
        return -1;
      for (int64_t j = 0; j < numel; j++)
        ref[j] = (float)mlp_get((const unsigned char *)want->data[i] + off, dt, j);
      double maxref;
      int finite;
      double e = mlp_rel_err((const unsigned char *)got->data[i] + off, dt, ref, numel, &maxref, &finite);
      free(ref);
      if (!finite)
        e = INFINITY;
      if (e > tolerance(dt))
        ok = 0;
      if (e >= worst) {
        worst = e;
        where = want->dtype[i] < 0 ? mlp_info.params[k].ckpt : want->name[i];
      }
    }
  }
  if (!same)
    snprintf(detail, n, "not bit-identical; relative error at most %.3g (%s)", worst, where);
  return same ? 1 : ok ? 0 : -1;
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : ".", *golden = argc > 2 ? argv[2] : NULL;
  char err[512] = "", path[1024], bad[1024], tmp[1024];
  mlp_model *m = NULL;

  check(mlp_create("tpu", &m, err, sizeof err) == MLP_EINVAL && !m && contains(err, "device"), "unknown device refused", err);
  check(mlp_create(NULL, &m, err, sizeof err) == MLP_EINVAL, "NULL device refused", err);
  check(mlp_create("cuda:x", &m, err, sizeof err) == MLP_EINVAL && !m && contains(err, "cuda:N"),
        "cuda:x refused", err);
  check(mlp_create("cuda:-1", &m, err, sizeof err) == MLP_EINVAL && !m && contains(err, "cuda:N"),
        "cuda:-1 refused", err);
  check(mlp_create("cuda:", &m, err, sizeof err) == MLP_EINVAL && !m, "cuda: refused", err);
  /* a device number past the last GPU: no CUDA path, no GPU, or no such device; never a model */
  check(mlp_create("cuda:1023", &m, err, sizeof err) == MLP_EDEVICE && !m, "cuda:1023 refused", err);
  check(mlp_create("cpu", NULL, err, sizeof err) == MLP_EINVAL, "NULL out refused", err);
  check(mlp_forward_v(NULL, NULL, NULL, NULL) == MLP_EINVAL, "forward on NULL model refused", "");
  if (mlp_create("cpu", &m, err, sizeof err)) {
    printf("FAIL create: %s\n", err);
    return 1;
  }
  check(mlp_init_params(m, 7) == MLP_OK, "init params", mlp_error(m));
  size_t nb = mlp_param_bytes();
  unsigned char *a = malloc(nb + 1), *b = malloc(nb + 1);
  check(mlp_get_params(m, a, nb) == MLP_OK, "get params", mlp_error(m));
  check(mlp_get_params(m, a, nb + 1) == MLP_EINVAL, "get params with a wrong size refused", mlp_error(m));

  /* dims */
  int64_t dyn[16] = {0};
  void *outs[64] = {0};
  const void *ins[64] = {0};
  if (mlp_info.ndyn) {
    dyn[0] = mlp_info.dyn_max[0] + 1;
    for (int k = 1; k < mlp_info.ndyn; k++)
      dyn[k] = 1;
    int rc = mlp_forward_v(m, dyn, ins, outs);
    check(rc == MLP_EINVAL, "forward refuses NULL buffers or a dim above its max", mlp_error(m));
  }
  check(mlp_forward_v(m, mlp_info.ndyn ? NULL : dyn, ins, NULL) == MLP_EINVAL, "forward refuses NULL outputs or dims", mlp_error(m));

  /* checkpoints */
  snprintf(path, sizeof path, "%s/api_params.safetensors", dir);
  check(mlp_save_params(m, path) == MLP_OK, "save params", mlp_error(m));
  check(mlp_init_params(m, 8) == MLP_OK, "re-init with another seed", mlp_error(m));
  check(mlp_load_params(m, path) == MLP_OK, "load params", mlp_error(m));
  check(mlp_get_params(m, b, nb) == MLP_OK && memcmp(a, b, nb) == 0, "save + load round-trips exactly", "");
  check(mlp_load_params(m, "/nonexistent/params.safetensors") == MLP_EIO, "missing checkpoint refused", mlp_error(m));
  snprintf(bad, sizeof bad, "%s/api_junk.safetensors", dir);
  FILE *f = fopen(bad, "wb");
  if (f) {
    fputs("this is not a safetensors file at all", f);
    fclose(f);
  }
  check(mlp_load_params(m, bad) == MLP_ECORRUPT, "junk checkpoint refused", mlp_error(m));
  /* truncated: the saved file minus its last byte */
  FILE *src = fopen(path, "rb");
  snprintf(tmp, sizeof tmp, "%s/api_truncated.safetensors", dir);
  FILE *dst = fopen(tmp, "wb");
  if (src && dst) {
    fseek(src, 0, SEEK_END);
    long n = ftell(src);
    fseek(src, 0, SEEK_SET);
    for (long i = 0; i + 1 < n; i++)
      fputc(fgetc(src), dst);
  }
  if (src)
    fclose(src);
  if (dst)
    fclose(dst);
  check(mlp_load_params(m, tmp) == MLP_ECORRUPT, "truncated checkpoint refused", mlp_error(m));
  remove(tmp);
  if (mlp_info.nparams > 0) {
    /* the first param with a wrong shape */
    const mlp_param_info *p = &mlp_info.params[0];
    mlp_tensor_desc t = {p->ckpt, p->dtype, 1, {p->numel + 1}, NULL};
    void *z = calloc((size_t)p->numel + 1, (size_t)mlp_dtype_sizes[p->dtype]);
    t.data = z;
    snprintf(tmp, sizeof tmp, "%s/api_shape.safetensors", dir);
    mlp_st_write(tmp, &t, 1, err, sizeof err);
    int rc = mlp_load_params(m, tmp);
    check(rc == MLP_ECORRUPT && contains(mlp_error(m), p->ckpt), "wrong shape refused, naming the tensor", mlp_error(m));
    free(z);
  }
  check(mlp_get_params(m, b, nb) == MLP_OK && memcmp(a, b, nb) == 0, "failed loads leave the params untouched", "");
  check(mlp_save_params(m, "/nonexistent/dir/p.safetensors") == MLP_EIO, "save into a missing directory refused",
        mlp_error(m));

  /* execution controls */
  check(mlp_set_stream(m, (void *)&nb) == MLP_EINVAL && contains(mlp_error(m), "stream"), "a stream on the cpu refused",
        mlp_error(m));
  check(mlp_set_stream(m, NULL) == MLP_OK && mlp_set_stream(NULL, NULL) == MLP_EINVAL, "set_stream(NULL)", mlp_error(m));
  check(mlp_set_graphs(m, 2) == MLP_EINVAL && mlp_set_graphs(m, 1) == MLP_OK && mlp_set_graphs(m, 0) == MLP_OK,
        "set_graphs takes 0 or 1", mlp_error(m));
  check(mlp_set_autotune(m, 2, NULL) == MLP_EINVAL && contains(mlp_error(m), "0 or 1") &&
            mlp_set_autotune(m, 1, NULL) == MLP_OK && mlp_set_autotune(m, 0, "") == MLP_OK &&
            mlp_set_autotune(NULL, 0, NULL) == MLP_EINVAL,
        "set_autotune takes 0 or 1 (on the cpu it does nothing)", mlp_error(m));
  check(mlp_sync(m) == MLP_OK && mlp_sync(NULL) == MLP_EINVAL, "sync", mlp_error(m));
  check(mlp_set_threads(NULL, 1) == MLP_EINVAL, "set_threads on NULL model refused", "");
  check(mlp_set_threads(m, -1) == MLP_EINVAL && contains(mlp_error(m), "set_threads") &&
            mlp_set_threads(m, MLP_MAX_THREADS + 1) == MLP_EINVAL && contains(mlp_error(m), "set_threads"),
        "set_threads refuses a negative count and one above MLP_MAX_THREADS", mlp_error(m));
  check(mlp_set_threads(m, 1) == MLP_OK && mlp_set_threads(m, MLP_MAX_THREADS) == MLP_OK && mlp_set_threads(m, 0) == MLP_OK,
        "set_threads takes 1 to MLP_MAX_THREADS, and 0 (OpenMP's default)", "");
  int64_t mem_now = -1, mem_peak = -1;
  check(mlp_device_memory(NULL, &mem_now, &mem_peak) == MLP_EINVAL && mlp_device_memory(m, NULL, &mem_peak) == MLP_EINVAL &&
            mlp_device_memory(m, &mem_now, NULL) == MLP_EINVAL,
        "device_memory refuses NULL arguments", "");
  check(mlp_device_memory(m, &mem_now, &mem_peak) == MLP_OK && mem_now == 0 && mem_peak == 0,
        "device_memory on the cpu: 0 and 0", "");
  {
    mlp_model *g = NULL;
    if (mlp_create("cuda", &g, err, sizeof err) == MLP_OK) { /* a GPU answers */
      check(mlp_device_memory(g, &mem_now, &mem_peak) == MLP_OK && mem_now >= (int64_t)mlp_param_bytes() &&
                mem_peak >= mem_now,
            "device_memory on the GPU: at least the params, and a peak no lower than now", "");
      mlp_destroy(g);
    }
  }

  /* training calls */
  float loss;
  if (mlp_info.loss_name)
    check(mlp_get_loss(m, &loss) == MLP_EINVAL && contains(mlp_error(m), "no loss") &&
              mlp_get_loss(m, NULL) == MLP_EINVAL,
          "get_loss before any loss is computed, or into NULL, refused", mlp_error(m));
  check(mlp_train_step_v(NULL, dyn, ins, &loss) == MLP_EINVAL, "train_step on NULL model refused", "");
  check(mlp_forward_backward_wrt_v(NULL, dyn, ins, NULL, &loss) == MLP_EINVAL, "forward_backward_wrt on NULL model refused",
        "");
  if (!mlp_info.loss_name)
    check(mlp_forward_backward_wrt_v(m, dyn, ins, NULL, &loss) == MLP_EINVAL && contains(mlp_error(m), "train"),
          "forward_backward_wrt on a model without train: refused", mlp_error(m));
  else if (mlp_info.nwrt)
    check(mlp_forward_backward_wrt_v(m, dyn, ins, NULL, &loss) == MLP_EINVAL && contains(mlp_error(m), "d_in"),
          "forward_backward_wrt refuses NULL gradient buffers", mlp_error(m));
  if (!mlp_info.loss_name) {
    check(mlp_train_step_v(m, dyn, ins, &loss) == MLP_EINVAL && contains(mlp_error(m), "train"),
          "train_step on a model without train: refused", mlp_error(m));
    check(mlp_save_checkpoint(m, path) == MLP_EINVAL, "save_checkpoint without train: refused", mlp_error(m));
  } else {
    for (int k = 0; k < mlp_info.ndyn; k++)
      dyn[k] = 1;
    check(mlp_forward_backward_v(m, mlp_info.ndyn ? NULL : dyn, ins, &loss) == MLP_EINVAL,
          "forward_backward refuses NULL dims or inputs", mlp_error(m));
    check(mlp_train_step_v(m, dyn, ins, NULL) == MLP_EINVAL, "train_step refuses NULL inputs", mlp_error(m));
    check(mlp_get_grads(m, a, nb + 1) == MLP_EINVAL, "get_grads with a wrong size refused", mlp_error(m));
    check(mlp_set_step(m, -1) == MLP_EINVAL, "a negative step refused", mlp_error(m));
    /* a params-only file is not a training checkpoint; nothing changes */
    check(mlp_load_checkpoint(m, path) == MLP_ECORRUPT && contains(mlp_error(m), "optim."),
          "a params file refused as a checkpoint, naming the missing tensor", mlp_error(m));
    snprintf(tmp, sizeof tmp, "%s/api_ckpt.safetensors", dir);
    check(mlp_set_step(m, 41) == MLP_OK && mlp_save_checkpoint(m, tmp) == MLP_OK, "save checkpoint", mlp_error(m));
    check(mlp_load_params(m, tmp) == MLP_OK && mlp_get_step(m) == 0, "load_params reads a checkpoint, step 0",
          mlp_error(m));
    check(mlp_load_checkpoint(m, tmp) == MLP_OK && mlp_get_step(m) == 41, "load_checkpoint restores the step",
          mlp_error(m));
    check(mlp_load_checkpoint(m, bad) == MLP_ECORRUPT && mlp_get_step(m) == 41,
          "junk checkpoint refused, state untouched", mlp_error(m));
    check(mlp_get_params(m, b, nb) == MLP_OK && memcmp(a, b, nb) == 0, "checkpoint round-trips the params", "");
    /* a flipped bit in the data: the checksum refuses it; a negative second
     * moment (rewritten without a checksum) is refused, naming the tensor */
    mlp_st_file cf;
    char err[512], *copy = NULL;
    if (mlp_st_read(tmp, &cf, err, sizeof err) == MLP_OK) {
      char flipped[600];
      snprintf(flipped, sizeof flipped, "%s/api_flipped.safetensors", dir);
      FILE *out = fopen(flipped, "wb");
      if (out) {
        cf.buf[cf.size - 1] ^= 4;
        fwrite(cf.buf, 1, cf.size, out);
        fclose(out);
        cf.buf[cf.size - 1] ^= 4;
      }
      check(mlp_load_checkpoint(m, flipped) == MLP_ECORRUPT && contains(mlp_error(m), "checksum") &&
                mlp_get_step(m) == 41,
            "a checkpoint with a flipped bit refused, state untouched", mlp_error(m));
      remove(flipped);
      for (int k = 0; k < cf.n; k++)
        if (!strncmp(cf.t[k].name, "optim.exp_avg_sq.", 17) && mlp_numel(cf.t[k].rank, cf.t[k].shape) > 0 &&
            (copy = malloc((size_t)mlp_numel(cf.t[k].rank, cf.t[k].shape) * 4))) {
          memcpy(copy, cf.t[k].data, (size_t)mlp_numel(cf.t[k].rank, cf.t[k].shape) * 4);
          ((float *)copy)[0] = -1;
          cf.t[k].data = copy;
          snprintf(flipped, sizeof flipped, "%s/api_negative.safetensors", dir);
          check(mlp_st_write(flipped, cf.t, cf.n, err, sizeof err) == MLP_OK &&
                    mlp_load_checkpoint(m, flipped) == MLP_ECORRUPT && contains(mlp_error(m), cf.t[k].name) &&
                    mlp_get_step(m) == 41,
                "a negative exp_avg_sq refused, naming the tensor", mlp_error(m));
          remove(flipped);
          break;
        }
      free(copy);
      mlp_st_free(&cf);
    }
  }
  /* an input the forward pass does not read (a loss's labels) may be NULL; one it reads may not */
  {
    mlp_case c;
    char cerr[512];
    mlp_host out[64];
    void *dout[64] = {0};
    int ok = !mlp_case_open(m, NULL, &c, cerr, sizeof cerr), nout = 0;
    for (int k = 0; ok && k < mlp_info.noutputs; k++, nout++)
      ok = !mlp_host_alloc(&out[k], 1, k, c.sym) && !mlp_to_device(m, &out[k], &dout[k]);
    for (int k = 0; ok && k < mlp_info.ninputs; k++) {
      const void *keep = c.din[k];
      c.din[k] = NULL;
      int reads = (int)(mlp_pass_inputs[MLP_PASS_FORWARD] >> k & 1);
      int rc = mlp_forward_v(m, c.dyn, (const void *const *)c.din, dout);
      if (!rc)
        rc = mlp_sync(m);
      check(reads ? rc == MLP_EINVAL && contains(mlp_error(m), mlp_info.inputs[k].name) : rc == MLP_OK,
            reads ? "forward refuses NULL for an input it reads" : "forward takes NULL for an input it does not read",
            mlp_error(m));
      c.din[k] = (void *)keep;
    }
    check(ok, "forward with NULL inputs: setting up", cerr);
    for (int k = 0; k < nout; k++) {
      if (dout[k] && dout[k] != out[k].data)
        mlp_device_free(m, dout[k]);
      free(out[k].data);
    }
    mlp_case_close(m, &c);
  }
  /* the same results with 1, 2 and 3 threads as with the default count: bit for bit with the built-in
   * GEMM (its sums, like the generated kernels', are formed in one order for any thread count); within
   * the golden test's tolerance with a CBLAS. The caller's own OpenMP setting is left as it was. */
  if (m->device == 0) {
    mlp_case c;
    results base = {0}, r;
    char cerr[512], detail[512];
    int ok = !mlp_case_open(m, golden, &c, cerr, sizeof cerr) && !run_threads(m, &c, -1, &base, cerr, sizeof cerr);
    check(ok, "threads: the default count's results", cerr);
    for (int t = 1; ok && t <= 3; t++) {
#ifdef _OPENMP
      int before = omp_get_max_threads();
#endif
      if (run_threads(m, &c, t, &r, cerr, sizeof cerr)) {
        check(0, "threads", cerr);
        results_free(&r);
        break;
      }
#ifdef _OPENMP
      check(omp_get_max_threads() == before, "set_threads leaves the caller's OpenMP thread count as it was", "");
#endif
      int cmp = compare(&r, &base, detail, sizeof detail);
      char what[128];
#ifdef MLP_TEST_CBLAS
      snprintf(what, sizeof what, "%d thread%s: the default count's results (a CBLAS: within the tolerance)", t,
               t == 1 ? "" : "s");
      check(cmp >= 0, what, detail);
#else
      snprintf(what, sizeof what, "%d thread%s: the default count's results bit for bit", t, t == 1 ? "" : "s");
      check(cmp == 1, what, detail);
#endif
      results_free(&r);
    }
    results_free(&base);
    mlp_set_threads(m, 0);
    mlp_case_close(m, &c);
  }
  free(a);
  free(b);
  mlp_destroy(m);
  static const char *const scratch[] = {"params", "junk", "truncated", "shape", "ckpt", "flipped", "negative"};
  for (size_t k = 0; k < sizeof scratch / sizeof *scratch; k++) {
    snprintf(tmp, sizeof tmp, "%s/api_%s.safetensors", dir, scratch[k]);
    remove(tmp);
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
