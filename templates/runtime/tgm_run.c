/* tgm_run: the tgm model from the command line, for scripting and parity
 * checks against other frameworks.
 *
 *   tgm_run [--device cpu|cuda] [--params P.safetensors | --seed N] [--save-params P.safetensors]
 *           [--inputs I.safetensors] [--out O.safetensors] [--dims B=4,T=64]
 *
 * Loads or initialises the params (default: --seed of the spec), optionally
 * saves them, reads the inputs (tensor names = input names; without --inputs
 * a fixed pseudo-random fill), runs the forward pass and writes the outputs
 * (tensor names = output names). Dynamic dims come from --dims, else from the
 * input shapes, else 1. Errors go to stderr with exit status 1. */
#include "tgm_io.h"

#include <errno.h>

extern const char *const tgm_input_dim_text[][TGM_MAXRANK];

static int die_(const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "tgm_run: ");
  fprintf(stderr, fmt, a, b);
  fputc('\n', stderr);
  return 1;
}

static const char *usage =
    "usage: tgm_run [--device cpu|cuda] [--params P.safetensors | --seed N] [--save-params P.safetensors]\n"
    "               [--inputs I.safetensors] [--out O.safetensors] [--dims B=4,T=64]\n";

int main(int argc, char **argv) {
  const char *device = "cpu", *params = NULL, *save = NULL, *inputs = NULL, *outp = NULL, *dims = NULL;
  unsigned long long seed = tgm_info.seed;
  int have_seed = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(usage, stdout);
      return 0;
    }
    if (i + 1 >= argc)
      return die_("%s: missing value (or unknown option)\n%s", a, usage);
    const char *v = argv[++i];
    if (!strcmp(a, "--device")) device = v;
    else if (!strcmp(a, "--params")) params = v;
    else if (!strcmp(a, "--save-params")) save = v;
    else if (!strcmp(a, "--inputs")) inputs = v;
    else if (!strcmp(a, "--out")) outp = v;
    else if (!strcmp(a, "--dims")) dims = v;
    else if (!strcmp(a, "--seed")) {
      char *end;
      errno = 0;
      seed = strtoull(v, &end, 10);
      if (*end || end == v || errno || v[0] == '-')
        return die_("--seed: '%s' is not a non-negative integer%s", v, "");
      have_seed = 1;
    } else
      return die_("unknown option '%s'\n%s", a, usage);
  }
  if (params && have_seed)
    return die_("give --params or --seed, not both%s%s", "", "");

  int64_t dyn[16] = {0}, sym[16] = {0};
  int given[16] = {0};
  if (dims) { /* --dims B=4,T=64 */
    const char *s = dims;
    while (*s) {
      const char *eq = strchr(s, '=');
      int k;
      if (!eq)
        return die_("--dims: expected NAME=VALUE in '%s'%s", s, "");
      for (k = 0; k < tgm_info.ndyn; k++)
        if (strlen(tgm_info.sym_names[k]) == (size_t)(eq - s) && !strncmp(tgm_info.sym_names[k], s, (size_t)(eq - s)))
          break;
      if (k == tgm_info.ndyn)
        return die_("--dims: '%.*s' is not a dynamic dim of the model", s, "") ;
      char *end;
      dyn[k] = strtoll(eq + 1, &end, 10);
      if (end == eq + 1 || (*end && *end != ','))
        return die_("--dims: bad value in '%s'%s", s, "");
      given[k] = 1;
      s = *end ? end + 1 : end;
    }
  }
  tgm_st_file inf;
  memset(&inf, 0, sizeof inf);
  char err[512];
  if (inputs) {
    if (tgm_st_read(inputs, &inf, err, sizeof err))
      return die_("%s%s", err, "");
    /* dims from the input shapes where a size is a single dynamic dim */
    for (int k = 0; k < tgm_info.ninputs; k++) {
      const tgm_tensor_desc *t = tgm_st_find(&inf, tgm_info.inputs[k].name);
      if (!t)
        return die_("%s: input '%s' is missing", inputs, tgm_info.inputs[k].name);
      if (t->rank != tgm_info.inputs[k].rank) {
        fprintf(stderr, "tgm_run: input '%s': rank %d, expected %d\n", tgm_info.inputs[k].name, t->rank,
                tgm_info.inputs[k].rank);
        return 1;
      }
      for (int j = 0; j < t->rank; j++)
        for (int s = 0; s < tgm_info.ndyn; s++)
          if (!strcmp(tgm_input_dim_text[k][j], tgm_info.sym_names[s]) && !given[s]) {
            if (t->shape[j] > tgm_info.dyn_max[s] || t->shape[j] < 1) {
              fprintf(stderr, "tgm_run: input '%s': dim %d is %lld, %s %lld (%s)\n", tgm_info.inputs[k].name, j,
                      (long long)t->shape[j], t->shape[j] < 1 ? "below" : "above max",
                      (long long)(t->shape[j] < 1 ? 1 : tgm_info.dyn_max[s]), tgm_info.sym_names[s]);
              return 1;
            }
            dyn[s] = t->shape[j];
            given[s] = 1;
          }
    }
  }
  for (int s = 0; s < tgm_info.ndyn; s++)
    if (!given[s])
      dyn[s] = 1;
  if (tgm_compute_syms(dyn, sym, err, sizeof err))
    return die_("%s%s", err, "");

  tgm_model *m;
  if (tgm_create(device, &m, err, sizeof err))
    return die_("%s%s", err, "");
  int rc = params ? tgm_load_params(m, params) : tgm_init_params(m, seed);
  if (rc)
    return die_("%s%s", tgm_error(m), "");
  if (save && tgm_save_params(m, save))
    return die_("%s%s", tgm_error(m), "");

  tgm_host in[64], out[64];
  void *din[64], *dout[64];
  for (int k = 0; k < tgm_info.ninputs; k++) {
    if (tgm_host_alloc(&in[k], 0, k, sym))
      return die_("out of memory%s%s", "", "");
    if (inputs) {
      const tgm_tensor_desc *t = tgm_st_find(&inf, tgm_info.inputs[k].name);
      if (t->dtype != in[k].dtype) {
        fprintf(stderr, "tgm_run: input '%s': dtype %s, expected %s\n", tgm_info.inputs[k].name,
                tgm_dtype_names[t->dtype], tgm_dtype_names[in[k].dtype]);
        return 1;
      }
      for (int j = 0; j < t->rank; j++)
        if (t->shape[j] != in[k].shape[j]) {
          fprintf(stderr, "tgm_run: input '%s': dim %d is %lld, expected %lld (%s)\n", tgm_info.inputs[k].name, j,
                  (long long)t->shape[j], (long long)in[k].shape[j], tgm_input_dim_text[k][j]);
          return 1;
        }
      memcpy(in[k].data, t->data, (size_t)in[k].numel * (size_t)tgm_dtype_sizes[in[k].dtype]);
    } else {
      tgm_host_fill(&in[k], tgm_info.inputs[k].name);
    }
    if (tgm_to_device(m, &in[k], &din[k]))
      return die_("copying input '%s' to the device%s", tgm_info.inputs[k].name, "");
  }
  for (int k = 0; k < tgm_info.noutputs; k++)
    if (tgm_host_alloc(&out[k], 1, k, sym) || tgm_to_device(m, &out[k], &dout[k]))
      return die_("allocating output '%s'%s", tgm_info.outputs[k].name, "");
  if (tgm_forward_v(m, dyn, (const void *const *)din, dout))
    return die_("%s%s", tgm_error(m), "");
  tgm_tensor_desc t[64];
  for (int k = 0; k < tgm_info.noutputs; k++) {
    if (tgm_from_device(m, &out[k], dout[k]))
      return die_("copying output '%s' back%s", tgm_info.outputs[k].name, "");
    t[k].name = tgm_info.outputs[k].name;
    t[k].dtype = out[k].dtype;
    t[k].rank = out[k].rank;
    memcpy(t[k].shape, out[k].shape, sizeof t[k].shape);
    t[k].data = out[k].data;
  }
  if (outp && tgm_st_write(outp, t, tgm_info.noutputs, err, sizeof err))
    return die_("%s%s", err, "");
  for (int k = 0; k < tgm_info.noutputs; k++) {
    double s = 0;
    for (int64_t i = 0; i < out[k].numel; i++)
      s += fabs(tgm_get(out[k].data, out[k].dtype, i));
    printf("%s: %s[", tgm_info.outputs[k].name, tgm_dtype_names[out[k].dtype]);
    for (int j = 0; j < out[k].rank; j++)
      printf("%s%lld", j ? ", " : "", (long long)out[k].shape[j]);
    printf("] mean |x| %.6g\n", out[k].numel ? s / (double)out[k].numel : 0.0);
  }
  for (int k = 0; k < tgm_info.ninputs; k++)
    if (din[k] != in[k].data)
      tgm_device_free(m, din[k]);
  for (int k = 0; k < tgm_info.noutputs; k++)
    if (dout[k] != out[k].data)
      tgm_device_free(m, dout[k]);
  if (inputs)
    tgm_st_free(&inf);
  tgm_destroy(m);
  return 0;
}
