/* mlp_test_golden: the forward pass on one device ("cpu" or "cuda") against
 * the golden vectors tgen computed with its double-precision reference
 * interpreter (tests/golden.safetensors: meta.dims, meta.seed, the inputs,
 * expected.OUTPUT, meta.dtype.OUTPUT). Without golden vectors it checks that
 * the forward pass runs and gives finite values. Exit: 0 pass, 1 fail, 77 no
 * GPU (skipped). */
#include "mlp_io.h"

/* The error allowed for each output dtype: max|got - want| / max|want|. */
static double tolerance(int dt) { return dt == MLP_BF16 ? 3e-2 : dt == MLP_F16 ? 5e-3 : 1e-4; }

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s cpu|cuda GOLDEN.safetensors\n", argv[0]);
    return 1;
  }
  char err[512];
  mlp_model *m;
  int rc = mlp_create(argv[1], &m, err, sizeof err);
  if (rc == MLP_EDEVICE && !strcmp(argv[1], "cuda")) {
    printf("skipped: %s\n", err);
    return 77;
  }
  mlp_case c;
  if (rc || mlp_case_open(m, argv[2], &c, err, sizeof err)) {
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
    free(out[k].data);
  }
  mlp_case_close(m, &c);
  mlp_destroy(m);
  printf("%d passed, %d failed\n", mlp_info.noutputs - fails, fails);
  return fails ? 1 : 0;
}
