/* tgm_test_api: bad arguments, bad dims and bad checkpoints are refused with
 * a status and a message; nothing aborts; a failed load leaves the params as
 * they were; save + load round-trips exactly; the thread count
 * (tgm_set_threads) changes no result. Usage: tgm_test_api TMPDIR [GOLDEN]
 * (the files it writes there are removed at the end: at GPT-2 size they are
 * gigabytes; GOLDEN: the golden test's dims, seed and inputs). */
#include "tgm_io.h"

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
static int run_threads(tgm_model *m, tgm_case *c, int threads, results *r, char *err, size_t errlen) {
  memset(r, 0, sizeof *r);
  if (threads >= 0 && tgm_set_threads(m, threads))
    return snprintf(err, errlen, "set_threads(%d): %s", threads, tgm_error(m)), -1;
  tgm_host out[64];
  void *dout[64] = {0};
  int rc = 0;
  for (int k = 0; k < tgm_info.noutputs; k++, r->n++) {
    if (tgm_host_alloc(&out[k], 1, k, c->sym) || tgm_to_device(m, &out[k], &dout[k]))
      return snprintf(err, errlen, "allocating output '%s'", tgm_info.outputs[k].name), -1;
    r->data[k] = out[k].data;
    r->bytes[k] = (size_t)out[k].numel * (size_t)tgm_dtype_sizes[out[k].dtype];
    r->dtype[k] = out[k].dtype;
    r->name[k] = tgm_info.outputs[k].name;
  }
  rc = tgm_forward_v(m, c->dyn, (const void *const *)c->din, dout);
  if (!rc)
    rc = tgm_sync(m);
  for (int k = 0; k < tgm_info.noutputs; k++) {
    if (!rc && tgm_from_device(m, &out[k], dout[k]))
      rc = TGM_EDEVICE;
    if (dout[k] && dout[k] != out[k].data)
      tgm_device_free(m, dout[k]);
  }
  if (rc)
    return snprintf(err, errlen, "forward with %d threads: %s", threads, tgm_error(m)), -1;
  if (tgm_info.loss_name) {
    float *loss = malloc(sizeof *loss);
    size_t nb = tgm_param_bytes();
    unsigned char *g = malloc(nb ? nb : 1);
    r->data[r->n] = loss, r->bytes[r->n] = sizeof *loss, r->dtype[r->n] = TGM_F32, r->name[r->n++] = tgm_info.loss_name;
    r->data[r->n] = g, r->bytes[r->n] = nb, r->dtype[r->n] = -1, r->name[r->n++] = "gradients";
    if (!loss || !g || tgm_forward_backward_v(m, c->dyn, (const void *const *)c->din, loss) || tgm_get_grads(m, g, nb))
      return snprintf(err, errlen, "forward_backward with %d threads: %s", threads, tgm_error(m)), -1;
  }
  return 0;
}

/* The golden test's tolerance for a dtype: max|got - want| / max|want|. */
static double tolerance(int dt) { return dt == TGM_BF16 ? 3e-2 : dt == TGM_F16 ? 5e-3 : 1e-4; }

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
    int np = want->dtype[i] < 0 ? tgm_info.nparams : 1;
    for (int k = 0; k < np; k++) {
      int dt = want->dtype[i] < 0 ? tgm_info.params[k].dtype : want->dtype[i];
      size_t off = want->dtype[i] < 0 ? (size_t)tgm_info.params[k].offset : 0;
      int64_t numel = want->dtype[i] < 0 ? tgm_info.params[k].numel : (int64_t)(want->bytes[i] / (size_t)tgm_dtype_sizes[dt]);
      float *ref = malloc((size_t)(numel + 1) * sizeof *ref);
      if (!ref)
        return -1;
      for (int64_t j = 0; j < numel; j++)
        ref[j] = (float)tgm_get((const unsigned char *)want->data[i] + off, dt, j);
      double maxref;
      int finite;
      double e = tgm_rel_err((const unsigned char *)got->data[i] + off, dt, ref, numel, &maxref, &finite);
      free(ref);
      if (!finite)
        e = INFINITY;
      if (e > tolerance(dt))
        ok = 0;
      if (e >= worst) {
        worst = e;
        where = want->dtype[i] < 0 ? tgm_info.params[k].ckpt : want->name[i];
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
  tgm_model *m = NULL;

  check(tgm_create("tpu", &m, err, sizeof err) == TGM_EINVAL && !m && contains(err, "device"), "unknown device refused", err);
  check(tgm_create(NULL, &m, err, sizeof err) == TGM_EINVAL, "NULL device refused", err);
  check(tgm_create("cuda:x", &m, err, sizeof err) == TGM_EINVAL && !m && contains(err, "cuda:N"),
        "cuda:x refused", err);
  check(tgm_create("cuda:-1", &m, err, sizeof err) == TGM_EINVAL && !m && contains(err, "cuda:N"),
        "cuda:-1 refused", err);
  check(tgm_create("cuda:", &m, err, sizeof err) == TGM_EINVAL && !m, "cuda: refused", err);
  /* a device number past the last GPU: no CUDA path, no GPU, or no such device; never a model */
  check(tgm_create("cuda:1023", &m, err, sizeof err) == TGM_EDEVICE && !m, "cuda:1023 refused", err);
  check(tgm_create("cpu", NULL, err, sizeof err) == TGM_EINVAL, "NULL out refused", err);
  check(tgm_forward_v(NULL, NULL, NULL, NULL) == TGM_EINVAL, "forward on NULL model refused", "");
  if (tgm_create("cpu", &m, err, sizeof err)) {
    printf("FAIL create: %s\n", err);
    return 1;
  }
  check(tgm_init_params(m, 7) == TGM_OK, "init params", tgm_error(m));
  size_t nb = tgm_param_bytes();
  unsigned char *a = malloc(nb + 1), *b = malloc(nb + 1);
  check(tgm_get_params(m, a, nb) == TGM_OK, "get params", tgm_error(m));
  check(tgm_get_params(m, a, nb + 1) == TGM_EINVAL, "get params with a wrong size refused", tgm_error(m));

  /* dims */
  int64_t dyn[16] = {0};
  void *outs[64] = {0};
  const void *ins[64] = {0};
  if (tgm_info.ndyn) {
    dyn[0] = tgm_info.dyn_max[0] + 1;
    for (int k = 1; k < tgm_info.ndyn; k++)
      dyn[k] = 1;
    int rc = tgm_forward_v(m, dyn, ins, outs);
    check(rc == TGM_EINVAL, "forward refuses NULL buffers or a dim above its max", tgm_error(m));
  }
  check(tgm_forward_v(m, tgm_info.ndyn ? NULL : dyn, ins, NULL) == TGM_EINVAL, "forward refuses NULL outputs or dims", tgm_error(m));

  /* checkpoints */
  snprintf(path, sizeof path, "%s/api_params.safetensors", dir);
  check(tgm_save_params(m, path) == TGM_OK, "save params", tgm_error(m));
  check(tgm_init_params(m, 8) == TGM_OK, "re-init with another seed", tgm_error(m));
  check(tgm_load_params(m, path) == TGM_OK, "load params", tgm_error(m));
  check(tgm_get_params(m, b, nb) == TGM_OK && memcmp(a, b, nb) == 0, "save + load round-trips exactly", "");
  check(tgm_load_params(m, "/nonexistent/params.safetensors") == TGM_EIO, "missing checkpoint refused", tgm_error(m));
  snprintf(bad, sizeof bad, "%s/api_junk.safetensors", dir);
  FILE *f = fopen(bad, "wb");
  if (f) {
    fputs("this is not a safetensors file at all", f);
    fclose(f);
  }
  check(tgm_load_params(m, bad) == TGM_ECORRUPT, "junk checkpoint refused", tgm_error(m));
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
  check(tgm_load_params(m, tmp) == TGM_ECORRUPT, "truncated checkpoint refused", tgm_error(m));
  remove(tmp);
  if (tgm_info.nparams > 0) {
    /* the first param with a wrong shape */
    const tgm_param_info *p = &tgm_info.params[0];
    tgm_tensor_desc t = {p->ckpt, p->dtype, 1, {p->numel + 1}, NULL};
    void *z = calloc((size_t)p->numel + 1, (size_t)tgm_dtype_sizes[p->dtype]);
    t.data = z;
    snprintf(tmp, sizeof tmp, "%s/api_shape.safetensors", dir);
    tgm_st_write(tmp, &t, 1, err, sizeof err);
    int rc = tgm_load_params(m, tmp);
    check(rc == TGM_ECORRUPT && contains(tgm_error(m), p->ckpt), "wrong shape refused, naming the tensor", tgm_error(m));
    free(z);
  }
  check(tgm_get_params(m, b, nb) == TGM_OK && memcmp(a, b, nb) == 0, "failed loads leave the params untouched", "");
  check(tgm_save_params(m, "/nonexistent/dir/p.safetensors") == TGM_EIO, "save into a missing directory refused",
        tgm_error(m));

  /* execution controls */
  check(tgm_set_stream(m, (void *)&nb) == TGM_EINVAL && contains(tgm_error(m), "stream"), "a stream on the cpu refused",
        tgm_error(m));
  check(tgm_set_stream(m, NULL) == TGM_OK && tgm_set_stream(NULL, NULL) == TGM_EINVAL, "set_stream(NULL)", tgm_error(m));
  check(tgm_set_graphs(m, 2) == TGM_EINVAL && tgm_set_graphs(m, 1) == TGM_OK && tgm_set_graphs(m, 0) == TGM_OK,
        "set_graphs takes 0 or 1", tgm_error(m));
  check(tgm_set_autotune(m, 2, NULL) == TGM_EINVAL && contains(tgm_error(m), "0 or 1") &&
            tgm_set_autotune(m, 1, NULL) == TGM_OK && tgm_set_autotune(m, 0, "") == TGM_OK &&
            tgm_set_autotune(NULL, 0, NULL) == TGM_EINVAL,
        "set_autotune takes 0 or 1 (on the cpu it does nothing)", tgm_error(m));
  check(tgm_sync(m) == TGM_OK && tgm_sync(NULL) == TGM_EINVAL, "sync", tgm_error(m));
  check(tgm_set_threads(NULL, 1) == TGM_EINVAL, "set_threads on NULL model refused", "");
  check(tgm_set_threads(m, -1) == TGM_EINVAL && contains(tgm_error(m), "set_threads") &&
            tgm_set_threads(m, TGM_MAX_THREADS + 1) == TGM_EINVAL && contains(tgm_error(m), "set_threads"),
        "set_threads refuses a negative count and one above TGM_MAX_THREADS", tgm_error(m));
  check(tgm_set_threads(m, 1) == TGM_OK && tgm_set_threads(m, TGM_MAX_THREADS) == TGM_OK && tgm_set_threads(m, 0) == TGM_OK,
        "set_threads takes 1 to TGM_MAX_THREADS, and 0 (OpenMP's default)", "");
  int64_t mem_now = -1, mem_peak = -1;
  check(tgm_device_memory(NULL, &mem_now, &mem_peak) == TGM_EINVAL && tgm_device_memory(m, NULL, &mem_peak) == TGM_EINVAL &&
            tgm_device_memory(m, &mem_now, NULL) == TGM_EINVAL,
        "device_memory refuses NULL arguments", "");
  check(tgm_device_memory(m, &mem_now, &mem_peak) == TGM_OK && mem_now == 0 && mem_peak == 0,
        "device_memory on the cpu: 0 and 0", "");
  {
    tgm_model *g = NULL;
    if (tgm_create("cuda", &g, err, sizeof err) == TGM_OK) { /* a GPU answers */
      check(tgm_device_memory(g, &mem_now, &mem_peak) == TGM_OK && mem_now >= (int64_t)tgm_param_bytes() &&
                mem_peak >= mem_now,
            "device_memory on the GPU: at least the params, and a peak no lower than now", "");
      tgm_destroy(g);
    }
  }

  /* training calls */
  float loss;
  if (tgm_info.loss_name)
    check(tgm_get_loss(m, &loss) == TGM_EINVAL && contains(tgm_error(m), "no loss") &&
              tgm_get_loss(m, NULL) == TGM_EINVAL,
          "get_loss before any loss is computed, or into NULL, refused", tgm_error(m));
  check(tgm_train_step_v(NULL, dyn, ins, &loss) == TGM_EINVAL, "train_step on NULL model refused", "");
  check(tgm_forward_backward_wrt_v(NULL, dyn, ins, NULL, &loss) == TGM_EINVAL, "forward_backward_wrt on NULL model refused",
        "");
  if (!tgm_info.loss_name)
    check(tgm_forward_backward_wrt_v(m, dyn, ins, NULL, &loss) == TGM_EINVAL && contains(tgm_error(m), "train"),
          "forward_backward_wrt on a model without train: refused", tgm_error(m));
  else if (tgm_info.nwrt)
    check(tgm_forward_backward_wrt_v(m, dyn, ins, NULL, &loss) == TGM_EINVAL && contains(tgm_error(m), "d_in"),
          "forward_backward_wrt refuses NULL gradient buffers", tgm_error(m));
  if (!tgm_info.loss_name) {
    check(tgm_train_step_v(m, dyn, ins, &loss) == TGM_EINVAL && contains(tgm_error(m), "train"),
          "train_step on a model without train: refused", tgm_error(m));
    check(tgm_save_checkpoint(m, path) == TGM_EINVAL, "save_checkpoint without train: refused", tgm_error(m));
  } else {
    for (int k = 0; k < tgm_info.ndyn; k++)
      dyn[k] = 1;
    check(tgm_forward_backward_v(m, tgm_info.ndyn ? NULL : dyn, ins, &loss) == TGM_EINVAL,
          "forward_backward refuses NULL dims or inputs", tgm_error(m));
    check(tgm_train_step_v(m, dyn, ins, NULL) == TGM_EINVAL, "train_step refuses NULL inputs", tgm_error(m));
    check(tgm_get_grads(m, a, nb + 1) == TGM_EINVAL, "get_grads with a wrong size refused", tgm_error(m));
    check(tgm_set_step(m, -1) == TGM_EINVAL, "a negative step refused", tgm_error(m));
    /* a params-only file is not a training checkpoint; nothing changes */
    check(tgm_load_checkpoint(m, path) == TGM_ECORRUPT && contains(tgm_error(m), "optim."),
          "a params file refused as a checkpoint, naming the missing tensor", tgm_error(m));
    snprintf(tmp, sizeof tmp, "%s/api_ckpt.safetensors", dir);
    check(tgm_set_step(m, 41) == TGM_OK && tgm_save_checkpoint(m, tmp) == TGM_OK, "save checkpoint", tgm_error(m));
    check(tgm_load_params(m, tmp) == TGM_OK && tgm_get_step(m) == 0, "load_params reads a checkpoint, step 0",
          tgm_error(m));
    check(tgm_load_checkpoint(m, tmp) == TGM_OK && tgm_get_step(m) == 41, "load_checkpoint restores the step",
          tgm_error(m));
    check(tgm_load_checkpoint(m, bad) == TGM_ECORRUPT && tgm_get_step(m) == 41,
          "junk checkpoint refused, state untouched", tgm_error(m));
    check(tgm_get_params(m, b, nb) == TGM_OK && memcmp(a, b, nb) == 0, "checkpoint round-trips the params", "");
    /* a flipped bit in the data: the checksum refuses it; a negative second
     * moment (rewritten without a checksum) is refused, naming the tensor */
    tgm_st_file cf;
    char err[512], *copy = NULL;
    if (tgm_st_read(tmp, &cf, err, sizeof err) == TGM_OK) {
      char flipped[600];
      snprintf(flipped, sizeof flipped, "%s/api_flipped.safetensors", dir);
      FILE *out = fopen(flipped, "wb");
      if (out) {
        cf.buf[cf.size - 1] ^= 4;
        fwrite(cf.buf, 1, cf.size, out);
        fclose(out);
        cf.buf[cf.size - 1] ^= 4;
      }
      check(tgm_load_checkpoint(m, flipped) == TGM_ECORRUPT && contains(tgm_error(m), "checksum") &&
                tgm_get_step(m) == 41,
            "a checkpoint with a flipped bit refused, state untouched", tgm_error(m));
      remove(flipped);
      for (int k = 0; k < cf.n; k++)
        if (!strncmp(cf.t[k].name, "optim.exp_avg_sq.", 17) && tgm_numel(cf.t[k].rank, cf.t[k].shape) > 0 &&
            (copy = malloc((size_t)tgm_numel(cf.t[k].rank, cf.t[k].shape) * 4))) {
          memcpy(copy, cf.t[k].data, (size_t)tgm_numel(cf.t[k].rank, cf.t[k].shape) * 4);
          ((float *)copy)[0] = -1;
          cf.t[k].data = copy;
          snprintf(flipped, sizeof flipped, "%s/api_negative.safetensors", dir);
          check(tgm_st_write(flipped, cf.t, cf.n, err, sizeof err) == TGM_OK &&
                    tgm_load_checkpoint(m, flipped) == TGM_ECORRUPT && contains(tgm_error(m), cf.t[k].name) &&
                    tgm_get_step(m) == 41,
                "a negative exp_avg_sq refused, naming the tensor", tgm_error(m));
          remove(flipped);
          break;
        }
      free(copy);
      tgm_st_free(&cf);
    }
  }
  /* an input the forward pass does not read (a loss's labels) may be NULL; one it reads may not */
  {
    tgm_case c;
    char cerr[512];
    tgm_host out[64];
    void *dout[64] = {0};
    int ok = !tgm_case_open(m, NULL, &c, cerr, sizeof cerr), nout = 0;
    for (int k = 0; ok && k < tgm_info.noutputs; k++, nout++)
      ok = !tgm_host_alloc(&out[k], 1, k, c.sym) && !tgm_to_device(m, &out[k], &dout[k]);
    for (int k = 0; ok && k < tgm_info.ninputs; k++) {
      const void *keep = c.din[k];
      c.din[k] = NULL;
      int reads = (int)(tgm_pass_inputs[TGM_PASS_FORWARD] >> k & 1);
      int rc = tgm_forward_v(m, c.dyn, (const void *const *)c.din, dout);
      if (!rc)
        rc = tgm_sync(m);
      check(reads ? rc == TGM_EINVAL && contains(tgm_error(m), tgm_info.inputs[k].name) : rc == TGM_OK,
            reads ? "forward refuses NULL for an input it reads" : "forward takes NULL for an input it does not read",
            tgm_error(m));
      c.din[k] = (void *)keep;
    }
    check(ok, "forward with NULL inputs: setting up", cerr);
    for (int k = 0; k < nout; k++) {
      if (dout[k] && dout[k] != out[k].data)
        tgm_device_free(m, dout[k]);
      free(out[k].data);
    }
    tgm_case_close(m, &c);
  }
  /* the same results with 1, 2 and 3 threads as with the default count: bit for bit with the built-in
   * GEMM (its sums, like the generated kernels', are formed in one order for any thread count); within
   * the golden test's tolerance with a CBLAS. The caller's own OpenMP setting is left as it was. */
  if (m->device == 0) {
    tgm_case c;
    results base = {0}, r;
    char cerr[512], detail[512];
    int ok = !tgm_case_open(m, golden, &c, cerr, sizeof cerr) && !run_threads(m, &c, -1, &base, cerr, sizeof cerr);
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
#ifdef TGM_TEST_CBLAS
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
    tgm_set_threads(m, 0);
    tgm_case_close(m, &c);
  }
  free(a);
  free(b);
  tgm_destroy(m);
  static const char *const scratch[] = {"params", "junk", "truncated", "shape", "ckpt", "flipped", "negative"};
  for (size_t k = 0; k < sizeof scratch / sizeof *scratch; k++) {
    snprintf(tmp, sizeof tmp, "%s/api_%s.safetensors", dir, scratch[k]);
    remove(tmp);
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
