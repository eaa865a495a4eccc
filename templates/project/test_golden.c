/* tgm_test_golden: the forward pass on one device ("cpu" or "cuda") against
 * the golden vectors tgen computed with its double-precision reference
 * interpreter (tests/golden.safetensors: meta.dims, meta.seed, the inputs,
 * expected.OUTPUT, meta.dtype.OUTPUT). Without golden vectors it checks that
 * the forward pass runs and gives finite values. Exit: 0 pass, 1 fail, 77 no
 * GPU (skipped). */
#include "tgm_io.h"

/* The error allowed for each output dtype: max|got - want| / max|want|. */
static double tolerance(int dt) { return dt == TGM_BF16 ? 3e-2 : dt == TGM_F16 ? 5e-3 : 1e-4; }

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s cpu|cuda GOLDEN.safetensors\n", argv[0]);
    return 1;
  }
  char err[512];
  tgm_model *m;
  int rc = tgm_create(argv[1], &m, err, sizeof err);
  if (rc == TGM_EDEVICE && !strcmp(argv[1], "cuda")) {
    printf("skipped: %s\n", err);
    return 77;
  }
  tgm_case c;
  if (rc || tgm_case_open(m, argv[2], &c, err, sizeof err)) {
    fprintf(stderr, "FAIL: %s\n", err);
    return 1;
  }
  tgm_host out[64];
  void *dout[64];
  int fails = 0;
  for (int k = 0; k < tgm_info.noutputs; k++)
    if (tgm_host_alloc(&out[k], 1, k, c.sym) || tgm_to_device(m, &out[k], &dout[k]))
      return fprintf(stderr, "FAIL: allocating output '%s'\n", tgm_info.outputs[k].name), 1;
  if (tgm_forward_v(m, c.dyn, (const void *const *)c.din, dout)) {
    fprintf(stderr, "FAIL: forward: %s\n", tgm_error(m));
    return 1;
  }
  for (int k = 0; k < tgm_info.noutputs; k++) {
    if (tgm_from_device(m, &out[k], dout[k]))
      return fprintf(stderr, "FAIL: copying output '%s' back\n", tgm_info.outputs[k].name), 1;
    const char *name = tgm_info.outputs[k].name;
    const tgm_tensor_desc *want = NULL;
    char key[256];
    if (c.have) {
      snprintf(key, sizeof key, "expected.%s", name);
      want = tgm_st_find(&c.f, key);
      if (!want || tgm_numel(want->rank, want->shape) != out[k].numel) {
        fprintf(stderr, "FAIL: golden '%s' missing or of the wrong size\n", key);
        return 1;
      }
    }
    /* the tolerance of the least precise dtype the output depends on */
    snprintf(key, sizeof key, "meta.dtype.%s", name);
    const tgm_tensor_desc *cd = c.have ? tgm_st_find(&c.f, key) : NULL;
    int tdt = cd && cd->dtype == TGM_I32 ? ((const int32_t *)cd->data)[0] : out[k].dtype;
    double maxref, tol = tolerance(tdt);
    int finite;
    double relerr = tgm_rel_err(out[k].data, out[k].dtype, want ? (const float *)want->data : NULL, out[k].numel,
                                &maxref, &finite);
    int ok = finite && (!want || relerr <= tol);
    fails += !ok;
    if (want)
      printf("%s %s: max |diff| %.3g, max |ref| %.3g, relative error %.3g (tolerance %.0e)%s\n", ok ? "ok  " : "FAIL",
             name, relerr * (maxref > 1e-6 ? maxref : 1e-6), maxref, relerr, tol, finite ? "" : ", non-finite values");
    else
      printf("%s %s: %s (no golden vectors)\n", ok ? "ok  " : "FAIL", name, finite ? "finite" : "non-finite values");
  }
  for (int k = 0; k < tgm_info.noutputs; k++) {
    if (dout[k] != out[k].data)
      tgm_device_free(m, dout[k]);
    free(out[k].data);
  }
  tgm_case_close(m, &c);
  tgm_destroy(m);
  printf("%d passed, %d failed\n", tgm_info.noutputs - fails, fails);
  return fails ? 1 : 0;
}
