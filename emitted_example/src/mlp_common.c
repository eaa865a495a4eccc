/* mlp_common.c: what tgen knows about model mlp at compile time (generated
 * from spec/examples/mlp.yaml): dims and their guards, the param layout, input and output
 * shapes, and the typed forward entry point. */
#include "mlp_rt.h"
#include "mlp.h"

#include <stdio.h>

static const char *const sym_names[] = {"B", NULL};
static const int64_t dyn_max[] = {2048, 0};

/* params: name, checkpoint name, dtype, rank, shape, numel, byte offset, init */
static const mlp_param_info params[] = {
  {"w1", "w1", MLP_F32, 2, {128, 64}, 8192, 0, MLP_INIT_KAIMING_UNIFORM, 0.0, 0.0},
  {"b1", "b1", MLP_F32, 1, {128}, 128, 32768, MLP_INIT_ZEROS, 0.0, 0.0},
  {"w2", "w2", MLP_F32, 2, {10, 128}, 1280, 33280, MLP_INIT_KAIMING_UNIFORM, 0.0, 0.0},
  {"b2", "b2", MLP_F32, 1, {10}, 10, 38400, MLP_INIT_ZEROS, 0.0, 0.0},
};

static const mlp_io_info inputs[] = {
  {"x", MLP_F32, 2},
  {"y", MLP_I32, 1},
};

static const mlp_io_info outputs[] = {
  {"logits", MLP_F32, 2},
};

const mlp_model_info mlp_info = {"mlp", 1, 1, sym_names, dyn_max, 4, params, 38656, 2, 1, inputs, outputs, 0ULL};

/* The dims of a call: each dynamic dim within [1, max]; derived sizes
 * (non-exact divisions) must divide. */
int mlp_compute_syms(const int64_t *dyn, int64_t *sym, char *err, size_t errlen) {
  if (dyn[0] < 1 || dyn[0] > 2048) {
    snprintf(err, errlen, "dim B is %lld, outside [1, 2048]", (long long)dyn[0]);
    return MLP_EINVAL;
  }
  const int64_t d_B = sym[0] = dyn[0];
  (void)d_B;
  (void)dyn; (void)sym; (void)err; (void)errlen;
  return MLP_OK;
}

void mlp_io_shape(int is_output, int k, const int64_t *sym, int64_t *shape) {
  MLP_UNUSED const int64_t d_B = sym[0];
  static const int8_t none = 0; (void)none;
  if (!is_output) {
    switch (k) {
    case 0: shape[0] = d_B; shape[1] = 64; return;
    case 1: shape[0] = d_B; return;
    }
  }
  switch (k) {
  case 0: shape[0] = d_B; shape[1] = 10; return;
  }
}

const char *const mlp_input_dim_text[][8] = {
  {"B", "D"},
  {"B"},
};

/* Bytes of workspace the forward pass needs for these dims. */
int64_t mlp_ws_bytes(const int64_t *sym) {
  MLP_UNUSED const int64_t d_B = sym[0];
  int64_t o = 0;
  o += MLP_ALIGN(128 * d_B * 4);  /* %6 linear */
  o += MLP_ALIGN(128 * d_B * 4);  /* %7 relu */
  o += MLP_ALIGN(10 * d_B * 4);  /* %8 linear */
  return o;
}

mlp_status mlp_forward(mlp_model *m, const mlp_dims *dims, const mlp_inputs *in, mlp_outputs *out) {
  if (!m)
    return MLP_EINVAL;
  if ((!in && 2) || !out)
    return mlp_fail(m, MLP_EINVAL, "forward: %s is NULL", out ? "in" : "out");
  const void *iv[2] = {in->x, in->y};
  void *ov[1] = {out->logits};
  if (!dims)
    return mlp_fail(m, MLP_EINVAL, "forward: dims is NULL");
  const int64_t dv[1] = {dims->B};
  return mlp_forward_v(m, dv, iv, ov);
}
