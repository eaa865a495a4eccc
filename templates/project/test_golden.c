#define _POSIX_C_SOURCE 200809L
/* tgm_test_golden: the forward pass on one device ("cpu" or "cuda") against
 * the golden vectors tgen computed with its double-precision reference
 * interpreter (tests/golden.safetensors: meta.dims, meta.seed, the inputs,
 * expected.OUTPUT). Without golden vectors it checks that the forward pass
 * runs and gives finite values. Exit: 0 pass, 1 fail, 77 no GPU (skipped). */
#include "tgm_io.h"

#include <unistd.h>

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
  if (rc) {
    fprintf(stderr, "FAIL: create: %s\n", err);
    return 1;
  }
  tgm_st_file f;
  int have = access(argv[2], F_OK) == 0;
  if (have && tgm_st_read(argv[2], &f, err, sizeof err)) {
    fprintf(stderr, "FAIL: %s\n", err);
    return 1;
  }
  int64_t dyn[16] = {0}, sym[16] = {0};
  uint64_t seed = tgm_info.seed;
  if (have) {
    const tgm_tensor_desc *d = tgm_st_find(&f, "meta.dims"), *s = tgm_st_find(&f, "meta.seed");
    if (!d || !s) {
      fprintf(stderr, "FAIL: %s lacks meta.dims or meta.seed\n", argv[2]);
      return 1;
    }
    for (int k = 0; k < tgm_info.ndyn; k++)
      dyn[k] = ((const int32_t *)d->data)[1 + k];
    seed = (uint64_t)(uint32_t)((const int32_t *)s->data)[0] | (uint64_t)(uint32_t)((const int32_t *)s->data)[1] << 32;
  } else {
    for (int k = 0; k < tgm_info.ndyn; k++)
      dyn[k] = tgm_info.dyn_max[k] < 2 ? tgm_info.dyn_max[k] : 2;
  }
  if (tgm_compute_syms(dyn, sym, err, sizeof err)) {
    fprintf(stderr, "FAIL: %s\n", err);
    return 1;
  }
  if (tgm_init_params(m, seed)) {
    fprintf(stderr, "FAIL: init: %s\n", tgm_error(m));
    return 1;
  }
  tgm_host in[64], out[64];
  void *din[64], *dout[64];
  int fails = 0;
  for (int k = 0; k < tgm_info.ninputs; k++) {
    if (tgm_host_alloc(&in[k], 0, k, sym))
      return fprintf(stderr, "FAIL: out of memory\n"), 1;
    if (have) {
      const tgm_tensor_desc *t = tgm_st_find(&f, tgm_info.inputs[k].name);
      if (!t || t->dtype != in[k].dtype || tgm_numel(t->rank, t->shape) != in[k].numel) {
        fprintf(stderr, "FAIL: golden input '%s' missing or of the wrong shape\n", tgm_info.inputs[k].name);
        return 1;
      }
      memcpy(in[k].data, t->data, (size_t)in[k].numel * (size_t)tgm_dtype_sizes[in[k].dtype]);
    } else {
      tgm_host_fill(&in[k], tgm_info.inputs[k].name);
    }
    if (tgm_to_device(m, &in[k], &din[k]))
      return fprintf(stderr, "FAIL: copying input '%s' to the device\n", tgm_info.inputs[k].name), 1;
  }
  for (int k = 0; k < tgm_info.noutputs; k++)
    if (tgm_host_alloc(&out[k], 1, k, sym) || tgm_to_device(m, &out[k], &dout[k]))
      return fprintf(stderr, "FAIL: allocating output '%s'\n", tgm_info.outputs[k].name), 1;
  if (tgm_forward_v(m, dyn, (const void *const *)din, dout)) {
    fprintf(stderr, "FAIL: forward: %s\n", tgm_error(m));
    return 1;
  }
  for (int k = 0; k < tgm_info.noutputs; k++) {
    if (tgm_from_device(m, &out[k], dout[k]))
      return fprintf(stderr, "FAIL: copying output '%s' back\n", tgm_info.outputs[k].name), 1;
    const char *name = tgm_info.outputs[k].name;
    double maxdiff = 0, maxref = 0;
    int finite = 1;
    const tgm_tensor_desc *want = NULL;
    if (have) {
      char key[256];
      snprintf(key, sizeof key, "expected.%s", name);
      want = tgm_st_find(&f, key);
      if (!want || tgm_numel(want->rank, want->shape) != out[k].numel) {
        fprintf(stderr, "FAIL: golden '%s' missing or of the wrong size\n", key);
        return 1;
      }
    }
    for (int64_t i = 0; i < out[k].numel; i++) {
      double g = tgm_get(out[k].data, out[k].dtype, i);
      finite &= isfinite(g) || (want && !isfinite(((const float *)want->data)[i]));
      if (want) {
        double w = ((const float *)want->data)[i];
        if (isfinite(w) && fabs(g - w) > maxdiff)
          maxdiff = fabs(g - w);
        if (isfinite(w) && fabs(w) > maxref)
          maxref = fabs(w);
      }
    }
    /* the tolerance of the least precise dtype the output depends on */
    char key[256];
    snprintf(key, sizeof key, "meta.dtype.%s", name);
    const tgm_tensor_desc *cd = have ? tgm_st_find(&f, key) : NULL;
    int tdt = cd && cd->dtype == TGM_I32 ? ((const int32_t *)cd->data)[0] : out[k].dtype;
    double relerr = maxdiff / (maxref > 1e-6 ? maxref : 1e-6), tol = tolerance(tdt);
    int ok = finite && (!want || relerr <= tol);
    fails += !ok;
    if (want)
      printf("%s %s: max |diff| %.3g, max |ref| %.3g, relative error %.3g (tolerance %.0e)%s\n", ok ? "ok  " : "FAIL",
             name, maxdiff, maxref, relerr, tol, finite ? "" : ", non-finite values");
    else
      printf("%s %s: %s (no golden vectors)\n", ok ? "ok  " : "FAIL", name, finite ? "finite" : "non-finite values");
  }
  for (int k = 0; k < tgm_info.ninputs; k++) {
    if (din[k] != in[k].data)
      tgm_device_free(m, din[k]);
    free(in[k].data);
  }
  for (int k = 0; k < tgm_info.noutputs; k++) {
    if (dout[k] != out[k].data)
      tgm_device_free(m, dout[k]);
    free(out[k].data);
  }
  if (have)
    tgm_st_free(&f);
  tgm_destroy(m);
  printf("%d passed, %d failed\n", tgm_info.noutputs - fails, fails);
  return fails ? 1 : 0;
}
