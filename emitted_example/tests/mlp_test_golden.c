#define _POSIX_C_SOURCE 200809L
/* mlp_test_golden: the forward pass on one device ("cpu" or "cuda") against
 * the golden vectors tgen computed with its double-precision reference
 * interpreter (tests/golden.safetensors: meta.dims, meta.seed, the inputs,
 * expected.OUTPUT). Without golden vectors it checks that the forward pass
 * runs and gives finite values. Exit: 0 pass, 1 fail, 77 no GPU (skipped). */
#include "mlp_io.h"

#include <unistd.h>

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
  if (rc) {
    fprintf(stderr, "FAIL: create: %s\n", err);
    return 1;
  }
  mlp_st_file f;
  int have = access(argv[2], F_OK) == 0;
  if (have && mlp_st_read(argv[2], &f, err, sizeof err)) {
    fprintf(stderr, "FAIL: %s\n", err);
    return 1;
  }
  int64_t dyn[16] = {0}, sym[16] = {0};
  uint64_t seed = mlp_info.seed;
  if (have) {
    const mlp_tensor_desc *d = mlp_st_find(&f, "meta.dims"), *s = mlp_st_find(&f, "meta.seed");
    if (!d || !s) {
      fprintf(stderr, "FAIL: %s lacks meta.dims or meta.seed\n", argv[2]);
      return 1;
    }
    for (int k = 0; k < mlp_info.ndyn; k++)
      dyn[k] = ((const int32_t *)d->data)[1 + k];
    seed = (uint64_t)(uint32_t)((const int32_t *)s->data)[0] | (uint64_t)(uint32_t)((const int32_t *)s->data)[1] << 32;
  } else {
    for (int k = 0; k < mlp_info.ndyn; k++)
      dyn[k] = mlp_info.dyn_max[k] < 2 ? mlp_info.dyn_max[k] : 2;
  }
  if (mlp_compute_syms(dyn, sym, err, sizeof err)) {
    fprintf(stderr, "FAIL: %s\n", err);
    return 1;
  }
  if (mlp_init_params(m, seed)) {
    fprintf(stderr, "FAIL: init: %s\n", mlp_error(m));
    return 1;
  }
  mlp_host in[64], out[64];
  void *din[64], *dout[64];
  int fails = 0;
  for (int k = 0; k < mlp_info.ninputs; k++) {
    if (mlp_host_alloc(&in[k], 0, k, sym))
      return fprintf(stderr, "FAIL: out of memory\n"), 1;
    if (have) {
      const mlp_tensor_desc *t = mlp_st_find(&f, mlp_info.inputs[k].name);
      if (!t || t->dtype != in[k].dtype || mlp_numel(t->rank, t->shape) != in[k].numel) {
        fprintf(stderr, "FAIL: golden input '%s' missing or of the wrong shape\n", mlp_info.inputs[k].name);
        return 1;
      }
      memcpy(in[k].data, t->data, (size_t)in[k].numel * (size_t)mlp_dtype_sizes[in[k].dtype]);
    } else {
      mlp_host_fill(&in[k], mlp_info.inputs[k].name);
    }
    if (mlp_to_device(m, &in[k], &din[k]))
      return fprintf(stderr, "FAIL: copying input '%s' to the device\n", mlp_info.inputs[k].name), 1;
  }
  for (int k = 0; k < mlp_info.noutputs; k++)
    if (mlp_host_alloc(&out[k], 1, k, sym) || mlp_to_device(m, &out[k], &dout[k]))
      return fprintf(stderr, "FAIL: allocating output '%s'\n", mlp_info.outputs[k].name), 1;
  if (mlp_forward_v(m, dyn, (const void *const *)din, dout)) {
    fprintf(stderr, "FAIL: forward: %s\n", mlp_error(m));
    return 1;
  }
  for (int k = 0; k < mlp_info.noutputs; k++) {
    if (mlp_from_device(m, &out[k], dout[k]))
      return fprintf(stderr, "FAIL: copying output '%s' back\n", mlp_info.outputs[k].name), 1;
    const char *name = mlp_info.outputs[k].name;
    double maxdiff = 0, maxref = 0;
    int finite = 1;
    const mlp_tensor_desc *want = NULL;
    if (have) {
      char key[256];
      snprintf(key, sizeof key, "expected.%s", name);
      want = mlp_st_find(&f, key);
      if (!want || mlp_numel(want->rank, want->shape) != out[k].numel) {
        fprintf(stderr, "FAIL: golden '%s' missing or of the wrong size\n", key);
        return 1;
      }
    }
    for (int64_t i = 0; i < out[k].numel; i++) {
      double g = mlp_get(out[k].data, out[k].dtype, i);
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
    const mlp_tensor_desc *cd = have ? mlp_st_find(&f, key) : NULL;
    int tdt = cd && cd->dtype == MLP_I32 ? ((const int32_t *)cd->data)[0] : out[k].dtype;
    double relerr = maxdiff / (maxref > 1e-6 ? maxref : 1e-6), tol = tolerance(tdt);
    int ok = finite && (!want || relerr <= tol);
    fails += !ok;
    if (want)
      printf("%s %s: max |diff| %.3g, max |ref| %.3g, relative error %.3g (tolerance %.0e)%s\n", ok ? "ok  " : "FAIL",
             name, maxdiff, maxref, relerr, tol, finite ? "" : ", non-finite values");
    else
      printf("%s %s: %s (no golden vectors)\n", ok ? "ok  " : "FAIL", name, finite ? "finite" : "non-finite values");
  }
  for (int k = 0; k < mlp_info.ninputs; k++) {
    if (din[k] != in[k].data)
      mlp_device_free(m, din[k]);
    free(in[k].data);
  }
  for (int k = 0; k < mlp_info.noutputs; k++) {
    if (dout[k] != out[k].data)
      mlp_device_free(m, dout[k]);
    free(out[k].data);
  }
  if (have)
    mlp_st_free(&f);
  mlp_destroy(m);
  printf("%d passed, %d failed\n", mlp_info.noutputs - fails, fails);
  return fails ? 1 : 0;
}
