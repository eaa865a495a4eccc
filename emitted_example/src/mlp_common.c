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
  {"w1", "w1", MLP_F32, 2, {128, 64}, 8192, 0, MLP_INIT_KAIMING_UNIFORM, 0.0, 0.0, 0},
  {"b1", "b1", MLP_F32, 1, {128}, 128, 32768, MLP_INIT_ZEROS, 0.0, 0.0, 8192},
  {"w2", "w2", MLP_F32, 2, {10, 128}, 1280, 33280, MLP_INIT_KAIMING_UNIFORM, 0.0, 0.0, 8320},
  {"b2", "b2", MLP_F32, 1, {10}, 10, 38400, MLP_INIT_ZEROS, 0.0, 0.0, 9600},
};

/* runs of params of one dtype: bytes [b0, b1), elements, f32 state element, dtype */
static const mlp_param_run runs[] = {
  {0, 38656, 9664, 0, MLP_F32},
};

static const mlp_io_info inputs[] = {
  {"x", MLP_F32, 2},
  {"y", MLP_I32, 1},
};

static const mlp_io_info outputs[] = {
  {"logits", MLP_F32, 2},
};

static const int wrt[] = {-1};

const mlp_model_info mlp_info = {"mlp", 1, 1, sym_names, dyn_max, 4, params, 38656, 2, 1, inputs, outputs, 0ULL,
  /* training: loss and its dtype, optimizer (0 none, 1 sgd, 2 adamw), lr, beta1, beta2, eps, weight_decay, momentum,
   * grad_clip (0 = none); accuracy from output %d against input %d (-1: none) */
  "loss", MLP_F32, 2, 0.01, 0.90000000000000002, 0.999, 1e-08, 0.0, 0.0, 0.0, 0, 1, 1, runs, 9664, 0,
  /* train.wrt: the inputs whose gradients the train pass writes */
  0, wrt};

/* The dims of a call: each dynamic dim within [1, max]; derived sizes
 * (non-exact divisions) must divide. */
int mlp_compute_syms(const int64_t *dyn, int64_t *sym, char *err, size_t errlen) {
  if (dyn[0] < 1 || dyn[0] > 2048) {
    snprintf(err, errlen, "dim B is %lld, outside [1, 2048]", (long long)dyn[0]);
    return MLP_EINVAL;
  }
  const int64_t dim_B = sym[0] = dyn[0];
  (void)dim_B;
  (void)dyn; (void)sym; (void)err; (void)errlen;
  return MLP_OK;
}

void mlp_io_shape(int is_output, int k, const int64_t *sym, int64_t *shape) {
  MLP_UNUSED const int64_t dim_B = sym[0];
  static const int8_t none = 0; (void)none;
  if (!is_output) {
    switch (k) {
    case 0: shape[0] = dim_B; shape[1] = 64; return;
    case 1: shape[0] = dim_B; return;
    }
  }
  switch (k) {
  case 0: shape[0] = dim_B; shape[1] = 10; return;
  }
}

const char *const mlp_input_dim_text[][8] = {
  {"B", "D"},
  {"B"},
};

/* The arena of each pass (forward, loss, train) in bytes, planned by tgen
 * for each dynamic dim's max; the passes place every intermediate in it. */
const int64_t mlp_pass_arena[MLP_NPASS] = {1048576, 1130496, 3227648};
/* Passes with dropout (never replayed from a CUDA graph: the mask follows the step). */
const int mlp_pass_dropout[MLP_NPASS] = {0, 0, 0};
/* The inputs each pass reads (bit k: input k); the others may be NULL. */
const uint64_t mlp_pass_inputs[MLP_NPASS] = {0x1ULL, 0x3ULL, 0x3ULL};
/* compile.mode default: CUDA graphs off, autotuned GEMMs off by default (mlp_set_graphs, mlp_set_autotune switch). */
const int mlp_graphs_default = 0;
const int mlp_tune_default = 0;

/* dims and inputs as arrays */
#define DIMS_INPUTS(what) \
  if (!m)                                                              \
    return MLP_EINVAL;                                                  \
  if (2 && !in)                                                        \
    return mlp_fail(m, MLP_EINVAL, "%s: in is NULL", what);          \
  const void *iv[2] = {in->x, in->y};                                                               \
  if (!dims)                                                           \
    return mlp_fail(m, MLP_EINVAL, "%s: dims is NULL", what);        \
  const int64_t dv[1] = {dims->B};

mlp_status mlp_forward(mlp_model *m, const mlp_dims *dims, const mlp_inputs *in, mlp_outputs *out) {
  DIMS_INPUTS("forward");
  if (!out)
    return mlp_fail(m, MLP_EINVAL, "forward: out is NULL");
  void *ov[1] = {out->logits};
  return mlp_forward_v(m, dv, iv, ov);
}

mlp_status mlp_loss(mlp_model *m, const mlp_dims *dims, const mlp_inputs *in, float *loss) {
  DIMS_INPUTS("loss");
  return mlp_loss_v(m, dv, iv, loss);
}

mlp_status mlp_forward_backward(mlp_model *m, const mlp_dims *dims, const mlp_inputs *in, float *loss) {
  DIMS_INPUTS("forward_backward");
  return mlp_forward_backward_v(m, dv, iv, loss);
}

mlp_status mlp_train_step(mlp_model *m, const mlp_dims *dims, const mlp_inputs *in, float *loss) {
  DIMS_INPUTS("train_step");
  return mlp_train_step_v(m, dv, iv, loss);
}

