/* interp_train.c: training in the reference interpreter, the oracle of the
 * emitted train_step.
 *
 * The optimizer is PyTorch's, as templates/runtime/tgm_optim_cpu.c computes
 * it for an f32 param, but in double and in the textbook order of operations
 * (the emitted code rounds to f32 where torch does; the difference is the
 * tolerance of the tests that compare them):
 *
 *   g      = grad * grad_scale      (grad_scale: clip_grad_norm_'s factor, or 1)
 *   AdamW  w *= 1 - lr wd                                   (decoupled decay)
 *          m  = m + (1 - b1) (g - m)                        (exp_avg.lerp_)
 *          v  = b2 v + (1 - b2) g g
 *          w -= lr / (1 - b1^t) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 *   SGD    g += wd w                                        (when wd != 0)
 *          buf = t == 1 ? g : momentum buf + g; g = buf     (when momentum != 0)
 *          w -= lr g
 *
 * A training step here is what the emitted train_step does: the joint
 * forward/backward graph in the interpreter with dropout on at the step
 * count, the global gradient norm (refused when not finite, as the runtime
 * refuses it), the clip, the update of a master copy kept in double, and the
 * params the next step computes with are the master rounded to each param's
 * dtype (the emitted code's f32 params, or its bf16/f16 copies of the f32
 * master). */
#include "ir.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double optim_clip_factor(double sum_squares, double max_norm) {
  double c = max_norm / (sqrt(sum_squares) + 1e-6);
  return c > 1.0 ? 1.0 : c; /* a NaN norm gives NaN, as torch.clamp passes it */
}

void optim_step(const Train *tr, double *w, const double *grad, double *m, double *v, int64_t n, int64_t step,
                double grad_scale) {
  double t = (double)(step > 0 ? step : 1);
  if (tr->opt == OPT_ADAMW) {
    double decay = 1.0 - tr->lr * tr->weight_decay, bc1 = 1.0 - pow(tr->beta1, t), bc2 = 1.0 - pow(tr->beta2, t);
    for (int64_t i = 0; i < n; i++) {
      double g = grad[i] * grad_scale;
      w[i] *= decay;
      m[i] += (1.0 - tr->beta1) * (g - m[i]);
      v[i] = tr->beta2 * v[i] + (1.0 - tr->beta2) * g * g;
      w[i] -= tr->lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + tr->eps);
    }
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    double g = grad[i] * grad_scale;
    if (tr->weight_decay != 0)
      g += tr->weight_decay * w[i];
    if (tr->momentum != 0) {
      m[i] = step <= 1 ? g : tr->momentum * m[i] + g;
      g = m[i];
    }
    w[i] -= tr->lr * g;
  }
}

int interp_train(const Graph *g, const InterpOptions *opt, const Tensor *inputs, const Tensor *params, int nsteps,
                 double *losses, char *err, size_t errlen) {
  const Train *tr = &g->spec->train;
  if (!g->grads || !g->loss || (tr->opt != OPT_ADAMW && tr->opt != OPT_SGD)) {
    snprintf(err, errlen, "internal error: interp_train needs a graph with gradients and an optimizer");
    return -1;
  }
  int np = g->nparams, rc = 0;
  /* per param: the master (double), the params of the next step (rounded), the moments */
  Tensor *cur = calloc((size_t)np + 1, sizeof *cur), *vals = calloc((size_t)g->nnodes + 1, sizeof *vals);
  double **master = calloc((size_t)np + 1, sizeof *master), **mom = calloc((size_t)np + 1, sizeof *mom),
         **sq = calloc((size_t)np + 1, sizeof *sq);
  int ok = cur && vals && master && mom && sq;
  for (int k = 0; ok && k < np; k++) {
    size_t n = (size_t)params[k].numel + 1;
    cur[k] = params[k];
    cur[k].data = malloc(n * sizeof(double));
    master[k] = malloc(n * sizeof(double));
    mom[k] = calloc(n, sizeof(double));
    sq[k] = calloc(n, sizeof(double));
    ok = cur[k].data && master[k] && mom[k] && sq[k];
    if (ok) {
      memcpy(master[k], params[k].data, (size_t)params[k].numel * sizeof(double));
      memcpy(cur[k].data, params[k].data, (size_t)params[k].numel * sizeof(double));
    }
  }
  if (!ok) {
    snprintf(err, errlen, "out of memory for the training state");
    rc = -1;
  }
  for (int s = 0; !rc && s < nsteps; s++) {
    InterpOptions o = *opt;
    o.training = 1;
    o.step = (uint64_t)s; /* the step count before this step: dropout's step */
    if (interp_run(g, &o, inputs, cur, vals, err, errlen)) {
      rc = -1;
      break;
    }
    losses[s] = vals[g->loss->id].data[0];
    double ss = 0;
    for (int k = 0; k < np; k++) {
      const Tensor *gr = &vals[g->grads[k]->id];
      for (int64_t i = 0; i < gr->numel; i++)
        ss += gr->data[i] * gr->data[i];
    }
    if (!isfinite(ss)) {
      snprintf(err, errlen, "gradient norm is %s at step %d", isnan(ss) ? "NaN" : "inf", s + 1);
      rc = -1;
    }
    double scale = tr->has_clip && tr->grad_clip > 0 ? optim_clip_factor(ss, tr->grad_clip) : 1.0;
    for (int k = 0; !rc && s + 1 < nsteps && k < np; k++) { /* the last step's update is not needed */
      optim_step(tr, master[k], vals[g->grads[k]->id].data, mom[k], sq[k], params[k].numel, s + 1, scale);
      for (int64_t i = 0; i < params[k].numel; i++)
        cur[k].data[i] = round_to_dtype(master[k][i], g->params[k].dtype);
    }
    interp_free(g, vals);
  }
  for (int k = 0; k < np; k++) {
    if (cur)
      free(cur[k].data);
    if (master)
      free(master[k]);
    if (mom)
      free(mom[k]);
    if (sq)
      free(sq[k]);
  }
  free(cur);
  free(vals);
  free(master);
  free(mom);
  free(sq);
  return rc;
}
