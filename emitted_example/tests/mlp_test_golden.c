/* mlp_test_golden: the forward pass on one device ("cpu" or "cuda") against
 * the golden vectors tgen computed with its double-precision reference
 * interpreter (tests/golden.safetensors: meta.dims, meta.seed, the inputs,
 * expected.OUTPUT, meta.dtype.OUTPUT). Without golden vectors it checks that
 * the forward pass runs and gives finite values. With a third argument, a
 * file name, the model runs with autotuned GEMMs (mlp_set_autotune) keeping
 * its choices there, twice: the second model reads the choices the first
 * wrote and must give the same outputs bit for bit; the file is removed.
 * Exit: 0 pass, 1 fail, 77 no GPU (skipped). */
#include "mlp_io.h"

/* The error allowed for each output dtype: max|got - want| / max|want|. */
static double tolerance(int dt) { return dt == MLP_BF16 ? 3e-2 : dt == MLP_F16 ? 5e-3 : 1e-4; }

/* One model's forward on dev against the golden vectors; with tune, its
 * GEMMs autotuned with that file. The outputs' bytes stay in keep[k]
 * (malloc'd) for the caller. Returns 0, 1 (failed) or 77 (no GPU). */
static int run(const char *dev, const char *golden, const char *tune, void **keep, size_t *kbytes) {
  char err[512];
  mlp_model *m;
  int rc = mlp_create(dev, &m, err, sizeof err);
  if (rc == MLP_EDEVICE && !strcmp(dev, "cuda")) {
    printf("skipped: %s\n", err);
    return 77;
  }
  if (!rc && tune && mlp_set_autotune(m, 1, tune)) {
    fprintf(stderr, "FAIL: set_autotune: %s\n", mlp_error(m));
    return 1;
  }
  mlp_case c;
  if (rc || mlp_case_open(m, golden, &c, err, sizeof err)) {
    fprintf(stderr, "FAIL: %s\n", err);
    return 1;
  }
  mlp_host out[64];
  void *dout[64];
  int fails = 0;
  for (int k = 0; k < mlp_info.noutputs; k++)
    if (mlp_host_alloc(&out[k], 1, k, c.sym) || mlp_to_device(m, &out[k], &dout[k]))
      return fprintf(stderr, "FAIL: allocating output '%s'\n", mlp_info.outputs[k].name), 1;
  if (mlp_forward_v(m, c.dyn, (const void *const *)c.din, dout)) {
    fprintf(stderr, "FAIL: forward: %s\n", mlp_error(m));
    return 1;
  }
  for (int k = 0; k < mlp_info.noutputs; k++) {
    if (mlp_from_device(m, &out[k], dout[k]))
      return fprintf(stderr, "FAIL: copying output '%s' back\n", mlp_info.outputs[k].name), 1;
    const char *name = mlp_info.outputs[k].name;
    const mlp_tensor_desc *want = NULL;
    char key[256];
    if (c.have) {
      snprintf(key, sizeof key, "expected.%s", name);
      want = mlp_st_find(&c.f, key);
      if (!want || mlp_numel(want->rank, want->shape) != out[k].numel) {
        fprintf(stderr, "FAIL: golden '%s' missing or of the wrong size\n", key);
        return 1;
      }
    }
    /* the tolerance of the least precise dtype the output depends on */
    snprintf(key, sizeof key, "meta.dtype.%s", name);
    const mlp_tensor_desc *cd = c.have ? mlp_st_find(&c.f, key) : NULL;
    int tdt = cd && cd->dtype == MLP_I32 ? ((const int32_t *)cd->data)[0] : out[k].dtype;
    double maxref, tol = tolerance(tdt);
    int finite;
    double relerr = mlp_rel_err(out[k].data, out[k].dtype, want ? (const float *)want->data : NULL, out[k].numel,
                                &maxref, &finite);
    int ok = finite && (!want || relerr <= tol);
    fails += !ok;
    if (want)
      printf("%s %s: max |diff| %.3g, max |ref| %.3g, relative error %.3g (tolerance %.0e)%s\n", ok ? "ok  " : "FAIL",
             name, relerr * (maxref > 1e-6 ? maxref : 1e-6), maxref, relerr, tol, finite ? "" : ", non-finite values");
    else
      printf("%s %s: %s (no golden vectors)\n", ok ? "ok  " : "FAIL", name, finite ? "finite" : "non-finite values");
  }
  for (int k = 0; k < mlp_info.noutputs; k++) {
    if (dout[k] != out[k].data)
      mlp_device_free(m, dout[k]);
    kbytes[k] = (size_t)out[k].numel * (size_t)mlp_dtype_sizes[out[k].dtype];
    keep[k] = out[k].data;
  }
  mlp_case_close(m, &c);
  mlp_destroy(m);
  printf("%d passed, %d failed\n", mlp_info.noutputs - fails, fails);
  return fails ? 1 : 0;
}

/* The first bytes of file path (0 when there is none), NUL-terminated. */
static size_t slurp(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "rb");
  size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
  if (f)
    fclose(f);
  buf[n] = 0;
  return n;
}

int main(int argc, char **argv) {
  if (argc != 3 && argc != 4) {
    fprintf(stderr, "usage: %s cpu|cuda GOLDEN.safetensors [AUTOTUNE_FILE]\n", argv[0]);
    return 1;
  }
  void *a[64] = {0}, *b[64] = {0};
  size_t na[64] = {0}, nb[64] = {0};
  const char *tune = argc == 4 ? argv[3] : NULL;
  if (tune)
    remove(tune);
  int rc = run(argv[1], argv[2], tune, a, na);
  if (!rc && tune) { /* again, from the choices the first run wrote */
    char first[8192], second[8192];
    size_t n1 = slurp(tune, first, sizeof first), n2;
    int gemms = 0;
    for (const char *l = first; (l = strstr(l, "\ngemm ")); l++)
      gemms++;
    printf("autotune: %s holds %d GEMM choice(s)\n", tune, gemms);
    rc = run(argv[1], argv[2], tune, b, nb);
    for (int k = 0; !rc && k < mlp_info.noutputs; k++)
      if (na[k] != nb[k] || memcmp(a[k], b[k], na[k])) {
        printf("FAIL %s: the second autotuned run (choices read from %s) differs from the first\n",
               mlp_info.outputs[k].name, tune);
        rc = 1;
      }
    n2 = slurp(tune, second, sizeof second);
    if (!rc && (n1 != n2 || memcmp(first, second, n1))) { /* a GEMM timed again would rewrite it */
      printf("FAIL the second run did not take its choices from %s: the file changed\n", tune);
      rc = 1;
    }
    remove(tune);
  }
  for (int k = 0; k < 64; k++)
    free(a[k]), free(b[k]);
  return rc;
}
