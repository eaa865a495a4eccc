/* test_autodiff.c: gradient checks of gen/autodiff.c against central finite
 * differences, all in the double-precision interpreter.
 *
 * Each case is a model loaded with tgen_load whose params are the tensors
 * differentiated (the op's operands) and whose loss is typically
 * sum(OP(...) * c) with a fixed random input c. autodiff appends the backward
 * and verify() must accept the joint graph; the interpreter evaluates it, and
 * each param gradient is compared with (L(p + h e_i) - L(p - h e_i)) / 2h, L
 * evaluated on the forward nodes only. The error of a param is
 * max_i |grad_i - fd_i| / max_i max(|grad_i|, |fd_i|) over the coordinates
 * checked (all of them for the op cases, a random ~20 per param for the
 * example models); it must stay below 1e-6. Values are drawn away from the
 * ops' kinks (abs, relu, clamp bounds; no ties for maximum and amax), so
 * finite differences are valid. Besides the fixed cases, 48 cases with random
 * shapes (run_random_cases: broadcasting binary ops, reductions over random
 * dims, softmax and norms, batched matmuls) from a fixed seed.
 *
 * Prints the worst error of each case and "N passed, M failed"; exits
 * nonzero on any failure. */
#include "ir.h"

#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL 1e-6

static int npass, nfail;

/* ---------------------------------------------------------------- random */

static uint64_t rng_state = 0x243f6a8885a308d3ull;

/* Uniform in [0, 1) (xorshift64*; fixed seed, so runs repeat). */
static double urand(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (double)((rng_state * 0x2545f4914f6cdd1dull) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---------------------------------------------------------------- cases */

typedef struct Case {
  const char *name;
  const char *src;     /* the whole model, or (body = 1) dims/inputs/params/graph binding `loss` */
  int body;
  double lo, hi;       /* param values uniform in [lo, hi) (both 0: [-1, 1)) */
  double avoid[2];     /* param values stay 0.05 away from these (kinks) */
  int navoid;
  const char *ints;    /* i32 input values, "name=v,v,v" (others: random in [0, imax)) */
  int imax;
  int64_t dimval;      /* value of every dynamic dim */
  int training;        /* dropout active */
  int grid;            /* params on multiples of 1/1024, h = 1/1024 (exact through casts) */
  int nsample;         /* coordinates checked per param (0: all) */
  int stencil4;        /* 4-point differences, h = 1e-4 (large models: less rounding noise) */
} Case;

/* "name: t" + a case body + the loss as output and a train section. */
static const char *wrap(Arena *a, const Case *k) {
  if (!k->body)
    return k->src;
  return arena_printf(a, "name: t\ndtype: f32\n%soutputs: [loss]\ntrain:\n  loss: loss\n  optimizer: {sgd: {lr: 0.1}}\n",
                      k->src);
}

/* Values of the i32 input `name` from k->ints, or NULL. */
static const char *ints_for(const Case *k, const char *name) {
  size_t n = strlen(name);
  for (const char *p = k->ints; p && *p; p = strchr(p, ';') ? strchr(p, ';') + 1 : NULL)
    if (!strncmp(p, name, n) && p[n] == '=')
      return p + n + 1;
  return NULL;
}

/* A tensor of the given declared shape in the arena, unfilled. */
static int make_tensor(const Graph *g, const Shape *s, const int64_t *symvals, Arena *a, Tensor *t) {
  char e[256];
  if (!concrete_shape(g, s, symvals, t, e, sizeof e)) {
    printf("  bad shape: %s\n", e);
    return -1;
  }
  t->data = arena_alloc(a, sizeof(double) * (size_t)(t->numel + 1));
  return 0;
}

/* A param value for case k: uniform in [lo, hi), away from k->avoid, on the
 * 1/1024 grid if asked. */
static double param_value(const Case *k) {
  double lo = k->lo, hi = k->hi;
  if (lo == 0 && hi == 0)
    lo = -1, hi = 1;
  for (;;) {
    double v = lo + (hi - lo) * urand();
    if (k->grid)
      v = round(v * 1024) / 1024;
    int ok = 1;
    for (int i = 0; i < k->navoid; i++)
      ok &= fabs(v - k->avoid[i]) > 0.05;
    if (ok)
      return v;
  }
}

/* The loss on the forward nodes of g (nodes[0..nforward)). */
static int forward_loss(const Graph *g, const InterpOptions *o, const Tensor *ins, const Tensor *ps, double *loss) {
  Graph fg = *g;
  fg.nnodes = g->nforward;
  Tensor *vals = calloc((size_t)fg.nnodes + 1, sizeof(Tensor));
  char err[512];
  if (!vals || interp_run(&fg, o, ins, ps, vals, err, sizeof err)) {
    printf("  forward: %s\n", vals ? err : "out of memory");
    free(vals);
    return -1;
  }
  *loss = vals[g->loss->id].data[0];
  interp_free(&fg, vals);
  free(vals);
  return 0;
}

/* The central difference of the loss along coordinate i of t with step h:
 * (L(+h) - L(-h)) / 2h, or with four points (8 (L(+h) - L(-h)) - (L(+2h) -
 * L(-2h))) / 12h, whose O(h^4) error lets h be large enough that rounding in
 * a big model's loss does not swamp small gradients. 0, or -1 on a run failure. */
static int central_diff(const Graph *g, const InterpOptions *o, const Tensor *ins, Tensor *ps, Tensor *t, int64_t i,
                        double h, int four, double *fd) {
  static const double steps[4] = {1, -1, 2, -2};
  double keep = t->data[i], l[4] = {0};
  for (int s = 0; s < (four ? 4 : 2); s++) {
    t->data[i] = keep + steps[s] * h;
    int bad = forward_loss(g, o, ins, ps, &l[s]);
    t->data[i] = keep;
    if (bad)
      return -1;
  }
  *fd = four ? (8 * (l[0] - l[1]) - (l[2] - l[3])) / (12 * h) : (l[0] - l[1]) / (2 * h);
  return 0;
}

/* Compares the gradient of param p (grad) with central differences at the
 * chosen coordinates; returns the relative error, or -1 on a run failure. */
static double check_param(const Graph *g, const Case *k, const InterpOptions *o, const Tensor *ins, Tensor *ps, int p,
                          const double *grad) {
  Tensor *t = &ps[p];
  double h = k->grid ? 1.0 / 1024 : k->stencil4 ? 1e-4 : 1e-6, maxd = 0, maxv = 0;
  int64_t n = k->nsample && k->nsample < t->numel ? k->nsample : t->numel;
  for (int64_t s = 0; s < n; s++) {
    int64_t i = n == t->numel ? s : (int64_t)(urand() * (double)t->numel);
    double fd;
    if (central_diff(g, o, ins, ps, t, i, h, k->stencil4, &fd))
      return -1;
    if (!isfinite(fd) || !isfinite(grad[i]))
      return INFINITY;
    maxd = fmax(maxd, fabs(grad[i] - fd));
    maxv = fmax(maxv, fmax(fabs(grad[i]), fabs(fd)));
  }
  return maxv > 0 ? maxd / maxv : 0;
}

/* Random inputs for case k: floats uniform in [-1, 1), i32 from k->ints or
 * uniform in [0, imax), bool 0/1. */
static int make_inputs(const Graph *g, const Case *k, const int64_t *symvals, Arena *a, Tensor *ins) {
  for (int j = 0; j < g->ninputs; j++) {
    const Input *in = &g->inputs[j];
    if (make_tensor(g, &in->shape, symvals, a, &ins[j]))
      return -1;
    const char *v = in->dtype == DT_I32 ? ints_for(k, in->name) : NULL;
    for (int64_t i = 0; i < ins[j].numel; i++) {
      double x;
      if (v) {
        x = strtod(v, (char **)&v);
        v += *v == ',';
      } else if (in->dtype == DT_I32) {
        x = floor(urand() * (k->imax ? k->imax : 2));
      } else if (in->dtype == DT_BOOL) {
        x = urand() < 0.5;
      } else {
        x = 2 * urand() - 1;
        if (k->grid)
          x = round(x * 1024) / 1024;
      }
      ins[j].data[i] = x;
    }
  }
  return 0;
}

/* Loads, differentiates and checks one case; prints its worst error. */
static void run_case(const Case *k) {
  Arena arena = {0};
  Diag dg;
  arena.fail_after = -1;
  const char *src = wrap(&arena, k);
  Graph *g = tgen_load(&dg, &arena, k->name, src, strlen(src));
  double worst = -1;
  const char *worst_at = "";
  int ok = 0;
  if (!g) {
    printf("FAIL %s: refused:\n%s", k->name, dg.msg);
    goto done;
  }
  if (autodiff(g) || g->nforward <= 0 || !g->grads) {
    printf("FAIL %s: autodiff failed\n", k->name);
    goto done;
  }
  verify(g);
  int64_t symvals[MAXSYM];
  for (int i = 0; i < MAXSYM; i++)
    symvals[i] = k->dimval ? k->dimval : 2;
  InterpOptions o = {.symvals = symvals, .training = k->training, .seed = 1234, .step = 7};
  Tensor *ins = arena_alloc(&arena, sizeof(Tensor) * (size_t)(g->ninputs + 1));
  Tensor *ps = arena_alloc(&arena, sizeof(Tensor) * (size_t)(g->nparams + 1));
  if (make_inputs(g, k, symvals, &arena, ins))
    goto done;
  for (int p = 0; p < g->nparams; p++) {
    if (make_tensor(g, &g->params[p].shape, symvals, &arena, &ps[p]))
      goto done;
    const Tensor *t = &ps[p];
    double scale = k->nsample && t->rank >= 2 ? 1 / sqrt((double)t->shape[t->rank - 1]) : 1; /* fan-in */
    for (int64_t i = 0; i < t->numel; i++)
      t->data[i] = param_value(k) * scale;
  }
  Tensor *vals = calloc((size_t)g->nnodes + 1, sizeof(Tensor));
  char err[512];
  if (!vals || interp_run(g, &o, ins, ps, vals, err, sizeof err)) {
    printf("FAIL %s: joint graph: %s\n", k->name, vals ? err : "out of memory");
    free(vals);
    goto done;
  }
  ok = 1;
  for (int p = 0; p < g->nparams && ok; p++) {
    double e = check_param(g, k, &o, ins, ps, p, vals[g->grads[p]->id].data);
    if (e < 0 || !(e < TOL)) {
      printf("FAIL %s: param %s: relative error %.3g\n", k->name, g->params[p].name, e);
      ok = 0;
    }
    if (e > worst)
      worst = e, worst_at = g->params[p].name;
  }
  interp_free(g, vals);
  free(vals);
  if (ok)
    printf("ok   %-28s worst rel error %.2e (%s, %d+%d nodes)\n", k->name, worst, worst_at, g->nforward,
           g->nnodes - g->nforward);
done:
  if (ok)
    npass++;
  else
    nfail++;
  arena_free(&arena);
}

/* ---------------------------------------------------------------- the cases */

/* loss = sum(EXPR * c) over params x [3, 4] (and c of EXPR's shape). */
#define UNARY(nm, expr, ...)                                                                                  \
  {.name = nm, .body = 1,                                                                                     \
   .src = "inputs:\n  c: [3, 4]\nparams:\n  x: {shape: [3, 4]}\ngraph:\n  - y: " expr "\n  - loss: sum(y * c)\n", \
   __VA_ARGS__}

/* loss = sum(EXPR * c) for params a [3, 4] and b of shape BSHAPE. */
#define BINARY(nm, expr, bshape, ...)                                                                          \
  {.name = nm, .body = 1,                                                                                      \
   .src = "inputs:\n  c: [3, 4]\nparams:\n  a: {shape: [3, 4]}\n  b: {shape: " bshape "}\ngraph:\n  - y: " expr \
          "\n  - loss: sum(y * c)\n",                                                                          \
   __VA_ARGS__}

/* loss = sum(EXPR * c), param x of shape XSHAPE, c of shape CSHAPE. */
#define SHAPED(nm, xshape, expr, cshape, ...)                                                                 \
  {.name = nm, .body = 1,                                                                                     \
   .src = "inputs:\n  c: " cshape "\nparams:\n  x: {shape: " xshape "}\ngraph:\n  - y: " expr                 \
          "\n  - loss: sum(y * c)\n",                                                                         \
   __VA_ARGS__}

static const Case cases[] = {
    /* unary pointwise */
    UNARY("neg", "-x", .lo = -1),
    UNARY("abs", "abs(x)", .avoid = {0}, .navoid = 1),
    UNARY("exp", "exp(x)", .lo = -1),
    UNARY("log", "log(x)", .lo = 0.2, .hi = 2),
    UNARY("sqrt", "sqrt(x)", .lo = 0.2, .hi = 2),
    UNARY("rsqrt", "rsqrt(x)", .lo = 0.2, .hi = 2),
    UNARY("sin", "sin(x)", .lo = -1),
    UNARY("cos", "cos(x)", .lo = -1),
    UNARY("tanh", "tanh(x)", .lo = -1),
    UNARY("sigmoid", "sigmoid(x)", .lo = -1),
    UNARY("relu", "relu(x)", .avoid = {0}, .navoid = 1),
    UNARY("silu", "silu(x)", .lo = -1),
    UNARY("erf", "erf(x)", .lo = -1),
    UNARY("square", "square(x)", .lo = -1),
    UNARY("reciprocal", "reciprocal(x)", .lo = 0.2, .hi = 2),
    UNARY("gelu", "gelu(x * 3)", .lo = -1),
    UNARY("gelu_tanh", "gelu(x * 3, approximate='tanh')", .lo = -1),
    UNARY("pow_3", "pow(x, 3)", .lo = -1),
    UNARY("pow_1.5", "pow(x, 1.5)", .lo = 0.2, .hi = 2),
    UNARY("pow_-2", "pow(x, -2)", .lo = 0.5, .hi = 2),
    UNARY("clamp", "clamp(x, -0.5, 0.5)", .avoid = {-0.5, 0.5}, .navoid = 2),
    UNARY("clamp_min", "clamp(x, min=-0.3)", .avoid = {-0.3}, .navoid = 1),
    UNARY("clamp_max", "clamp(x, max=0.2)", .avoid = {0.2}, .navoid = 1),
    UNARY("chain_reuse", "x * tanh(x) + exp(x) / (x * x + 1)", .lo = -1),
    /* binary pointwise, broadcasting both ways */
    BINARY("add", "a + b", "[4]", .lo = -1),
    BINARY("add_col", "b + a", "[3, 1]", .lo = -1),
    BINARY("sub", "a - b", "[3, 1]", .lo = -1),
    BINARY("sub_rev", "b - a", "[4]", .lo = -1),
    BINARY("mul", "a * b", "[4]", .lo = -1),
    BINARY("mul_scalar", "a * b", "[]", .lo = -1),
    BINARY("div", "a / b", "[3, 1]", .lo = 0.5, .hi = 2),
    BINARY("div_rev", "b / a", "[4]", .lo = 0.5, .hi = 2),
    BINARY("maximum", "maximum(a, b)", "[4]", .lo = -1),
    BINARY("minimum", "minimum(b, a)", "[3, 1]", .lo = -1),
    BINARY("where", "where(gt(c, 0), a, b)", "[4]", .lo = -1),
    BINARY("where_scalar", "where(lt(c, 0.2), 2.5, b * a)", "[3, 1]", .lo = -1),
    BINARY("mse_loss", "mse_loss(a, b) * c", "[4]", .lo = -1),
    BINARY("mse_loss_rev", "mse_loss(b, a) * c", "[3, 1]", .lo = -1),
    BINARY("broadcast_to", "broadcast_to(b, [2, 3, 4]) * a", "[3, 1]", .lo = -1),
    /* reductions */
    SHAPED("sum_dim", "[2, 3, 4]", "sum(x, dim=1)", "[2, 4]", .lo = -1),
    SHAPED("sum_keepdim", "[2, 3, 4]", "sum(x, dim=[0, 2], keepdim=true)", "[1, 3, 1]", .lo = -1),
    SHAPED("sum_all", "[2, 3, 4]", "sum(x * x)", "[]", .lo = -1),
    SHAPED("mean_dim", "[2, 3, 4]", "mean(x, dim=-1)", "[2, 3]", .lo = -1),
    SHAPED("mean_keepdim", "[2, 3, 4]", "mean(x, dim=[0, 1], keepdim=true)", "[1, 1, 4]", .lo = -1),
    SHAPED("amax_dim", "[2, 3, 4]", "amax(x, dim=1)", "[2, 4]", .lo = -1),
    SHAPED("amax_all_keepdim", "[2, 3, 4]", "amax(x, keepdim=true)", "[1, 1, 1]", .lo = -1),
    SHAPED("amax_tie", "[3, 4]", "amax(concat([x, x], dim=1), dim=1)", "[3]", .lo = -1),
    SHAPED("var_dim", "[2, 3, 4]", "var(x, dim=1)", "[2, 4]", .lo = -1),
    SHAPED("var_keepdim_c0", "[2, 3, 4]", "var(x, dim=[0, 2], keepdim=true, correction=0)", "[1, 3, 1]", .lo = -1),
    SHAPED("logsumexp", "[2, 3, 4]", "logsumexp(x * 2, dim=[0, 1])", "[4]", .lo = -1),
    SHAPED("logsumexp_keepdim", "[2, 3, 4]", "logsumexp(x, dim=-1, keepdim=true)", "[2, 3, 1]", .lo = -1),
    /* normalisation */
    SHAPED("softmax", "[3, 4]", "softmax(x * 2, dim=0)", "[3, 4]", .lo = -1),
    SHAPED("softmax_last", "[2, 3, 4]", "softmax(x, dim=-1)", "[2, 3, 4]", .lo = -1),
    SHAPED("log_softmax", "[2, 3, 4]", "log_softmax(x * 2, dim=1)", "[2, 3, 4]", .lo = -1),
    {.name = "layer_norm", .body = 1,
     .src = "inputs:\n  c: [2, 3, 5]\nparams:\n  x: {shape: [2, 3, 5]}\n  w: {shape: [5]}\n  b: {shape: [5]}\n"
            "graph:\n  - y: layer_norm(x, w, b, eps=0.01)\n  - loss: sum(y * c)\n"},
    SHAPED("layer_norm_plain", "[3, 5]", "layer_norm(x)", "[3, 5]", .lo = -1),
    {.name = "rms_norm", .body = 1,
     .src = "inputs:\n  c: [2, 3, 5]\nparams:\n  x: {shape: [2, 3, 5]}\n  w: {shape: [5]}\n"
            "graph:\n  - y: rms_norm(x, w, eps=0.01)\n  - loss: sum(y * c)\n"},
    SHAPED("rms_norm_plain", "[3, 5]", "rms_norm(x)", "[3, 5]", .lo = -1),
    /* shape */
    SHAPED("reshape", "[2, 6]", "reshape(x, [3, 4]) * reshape(x, [3, 4])", "[3, 4]", .lo = -1),
    SHAPED("reshape_infer", "[2, 6]", "exp(reshape(x, [4, -1]))", "[4, 3]", .lo = -1),
    SHAPED("transpose", "[2, 3, 4]", "transpose(x, 0, 2) * 2", "[4, 3, 2]", .lo = -1),
    SHAPED("permute", "[2, 3, 4]", "permute(x, [1, 2, 0])", "[3, 4, 2]", .lo = -1),
    SHAPED("squeeze", "[3, 1, 4]", "squeeze(x, 1)", "[3, 4]", .lo = -1),
    SHAPED("unsqueeze", "[3, 4]", "unsqueeze(x, 1) * unsqueeze(x, -1)", "[3, 4, 4]", .lo = -1),
    SHAPED("slice_start", "[3, 5]", "slice(x, 1, 0, 2)", "[3, 2]", .lo = -1),
    SHAPED("slice_middle", "[3, 5]", "slice(x, 1, 1, 3)", "[3, 2]", .lo = -1),
    SHAPED("slice_end", "[3, 5]", "slice(x, 0, 1, 3)", "[2, 5]", .lo = -1),
    SHAPED("slice_neg", "[3, 5]", "slice(x, -1, -3, -1)", "[3, 2]", .lo = -1),
    {.name = "split", .body = 1,
     .src = "inputs:\n  c: [2, 2]\nparams:\n  x: {shape: [2, 6]}\ngraph:\n  - p, q, r: split(x, 3, dim=-1)\n"
            "  - loss: sum(p * q * c) + sum(exp(r))\n"},
    {.name = "concat", .body = 1,
     .src = "inputs:\n  c: [3, 7]\nparams:\n  a: {shape: [3, 4]}\n  b: {shape: [3, 2]}\n"
            "graph:\n  - y: concat([a, square(b), a], dim=1)\n  - loss: sum(slice(y, 1, 0, 7) * c)\n"},
    /* linear algebra */
    {.name = "matmul", .body = 1,
     .src = "inputs:\n  c: [3, 5]\nparams:\n  a: {shape: [3, 4]}\n  b: {shape: [4, 5]}\n"
            "graph:\n  - y: a @ b\n  - loss: sum(y * c)\n"},
    {.name = "matmul_1d_left", .body = 1,
     .src = "inputs:\n  c: [5]\nparams:\n  a: {shape: [4]}\n  b: {shape: [4, 5]}\n"
            "graph:\n  - y: matmul(a, b)\n  - loss: sum(y * c)\n"},
    {.name = "matmul_1d_right", .body = 1,
     .src = "inputs:\n  c: [2, 3]\nparams:\n  a: {shape: [2, 3, 4]}\n  b: {shape: [4]}\n"
            "graph:\n  - y: matmul(a, b)\n  - loss: sum(y * c)\n"},
    {.name = "matmul_1d_both", .body = 1,
     .src = "params:\n  a: {shape: [4]}\n  b: {shape: [4]}\ngraph:\n  - loss: matmul(a, b) * 1.5\n"},
    {.name = "matmul_batch_bcast", .body = 1,
     .src = "inputs:\n  c: [2, 3, 3, 5]\nparams:\n  a: {shape: [2, 1, 3, 4]}\n  b: {shape: [3, 4, 5]}\n"
            "graph:\n  - y: a @ b\n  - loss: sum(y * c)\n"},
    {.name = "linear", .body = 1,
     .src = "inputs:\n  c: [2, 3, 5]\nparams:\n  x: {shape: [2, 3, 4]}\n  w: {shape: [5, 4]}\n  b: {shape: [5]}\n"
            "graph:\n  - y: linear(x, w, b)\n  - loss: sum(y * c)\n"},
    {.name = "linear_nobias_1d", .body = 1,
     .src = "inputs:\n  c: [5]\nparams:\n  x: {shape: [4]}\n  w: {shape: [5, 4]}\n"
            "graph:\n  - y: linear(x, w)\n  - loss: sum(y * c)\n"},
    /* neural */
    {.name = "embedding", .body = 1, .ints = "idx=1,3,1,0,4,1",
     .src = "inputs:\n  c: [2, 3, 4]\n  idx: {shape: [2, 3], dtype: i32}\nparams:\n  t: {shape: [5, 4]}\n"
            "graph:\n  - y: embedding(idx, t)\n  - loss: sum(y * y * c)\n"},
    {.name = "attention", .body = 1,
     .src = "inputs:\n  c: [2, 2, 3, 5]\nparams:\n  q: {shape: [2, 2, 3, 4]}\n  k: {shape: [2, 4, 4]}\n"
            "  v: {shape: [2, 1, 4, 5]}\ngraph:\n  - y: attention(q, k, v)\n  - loss: sum(y * c)\n"},
    {.name = "attention_causal", .body = 1,
     .src = "inputs:\n  c: [2, 2, 4, 5]\nparams:\n  q: {shape: [1, 2, 4, 4]}\n  k: {shape: [2, 2, 4, 4]}\n"
            "  v: {shape: [4, 5]}\ngraph:\n  - y: attention(q, k, v, causal=true)\n  - loss: sum(y * c)\n"},
    {.name = "attention_causal_scale", .body = 1,
     .src = "inputs:\n  c: [2, 3, 5]\nparams:\n  q: {shape: [2, 3, 4]}\n  k: {shape: [2, 5, 4]}\n"
            "  v: {shape: [2, 5, 5]}\ngraph:\n  - y: attention(q, k, v, causal=true, scale=0.7)\n  - loss: sum(y * c)\n"},
    {.name = "dropout", .body = 1, .training = 1,
     .src = "inputs:\n  c: [4, 5]\nparams:\n  x: {shape: [4, 5]}\n"
            "graph:\n  - y: dropout(x * x, 0.3)\n  - z: dropout(x, 0.5)\n  - loss: sum(y * c) + sum(z * z)\n"},
    /* losses */
    {.name = "cross_entropy", .body = 1, .ints = "t=1,-100,4,0",
     .src = "inputs:\n  t: {shape: [4], dtype: i32}\nparams:\n  x: {shape: [4, 5]}\n"
            "graph:\n  - loss: cross_entropy(x * 2, t)\n"},
    {.name = "cross_entropy_ignore2", .body = 1, .ints = "t=2,1,2,3",
     .src = "inputs:\n  t: {shape: [4], dtype: i32}\nparams:\n  x: {shape: [4, 5]}\n"
            "graph:\n  - loss: cross_entropy(x, t, ignore_index=2) * 3\n"},
    {.name = "cross_entropy_1d", .body = 1, .ints = "t=3",
     .src = "inputs:\n  t: {shape: [], dtype: i32}\nparams:\n  x: {shape: [5]}\n"
            "graph:\n  - loss: cross_entropy(x, t)\n"},
    /* casts (values on a grid exact in f16, so rounding does not disturb the differences) */
    {.name = "cast", .body = 1, .grid = 1,
     .src = "inputs:\n  c: [3, 4]\nparams:\n  x: {shape: [3, 4]}\n"
            "graph:\n  - y: cast(square(cast(x, f16)), f32)\n  - loss: sum(y * c)\n"},
    /* a dynamic dim: symbolic counts in mean, mse_loss */
    {.name = "dynamic_mean_mse", .body = 1, .dimval = 3,
     .src = "dims:\n  B: {dynamic: true, max: 8}\ninputs:\n  c: [B, 4]\nparams:\n  w: {shape: [4]}\n"
            "graph:\n  - y: c * w\n  - loss: mean(y * y) + mean(y, dim=0) @ w + mse_loss(y, c)\n"},
    /* a param the loss does not use: a zero gradient */
    {.name = "unused_param", .body = 1,
     .src = "inputs:\n  c: [3]\nparams:\n  x: {shape: [3]}\n  u: {shape: [2]}\ngraph:\n  - loss: sum(x * c)\n"},
};

/* The example models with a train section, at B = 2, ~20 coordinates per
 * param. mlp_blocks runs with its widths cut from D=1024, H=4096 to D=32,
 * H=64 (the same graph; at full size each of the ~2000 evaluations copies its
 * 270 MB of params); TGEN_AD_FULL=1 in the environment checks it at full size. */
typedef struct Example {
  const char *path;
  const char *from[2], *to[2]; /* dims lines replaced unless TGEN_AD_FULL is set */
} Example;
static const Example examples[] = {
    {"spec/examples/mlp.yaml", {0}, {0}},
    {"spec/examples/mlp3.yaml", {0}, {0}},
    {"spec/examples/mlp_blocks.yaml", {"D: 1024", "H: 4096"}, {"D: 32  ", "H: 64  "}},
    {"tests/data/gpt2_tiny.yaml", {0}, {0}},
};

/* s with its first `from` replaced by `to` (same length), in place. */
static void replace(char *s, const char *from, const char *to) {
  char *p = from ? strstr(s, from) : NULL;
  if (p)
    memcpy(p, to, strlen(to));
}

/* Reads a whole file into the arena (NULL if it cannot). */
static char *slurp(Arena *a, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = arena_alloc(a, (size_t)n + 1);
  size_t got = fread(s, 1, (size_t)n, f);
  fclose(f);
  s[got] = 0;
  return s;
}

/* ---------------------------------------------------------------- random shapes */

/* "[2, 3, 4]" */
static const char *shape_text(Arena *a, int rank, const int *d) {
  const char *s = "[";
  for (int i = 0; i < rank; i++)
    s = arena_printf(a, "%s%s%d", s, i ? ", " : "", d[i]);
  return arena_printf(a, "%s]", s);
}

static int rdim(void) { return 1 + (int)(urand() * 4); } /* 1..4 */

/* Random cases from a fixed seed: broadcasting binary ops (b's shape drops
 * leading dims and sets others to 1), reductions over random dims with and
 * without keepdim, softmax / log_softmax / norms along random dims, and
 * batched matmuls with broadcast batch dims; shapes of rank 1 to 3, sizes
 * 1 to 4. Each is loss = sum(y * c). */
static void run_random_cases(int n, const char *only) {
  static const char *const bin[] = {"a + b", "a - b", "a * b", "a / b", "where(gt(a, 0), a * b, b)"};
  static const char *const red[] = {"sum", "mean", "amax", "var", "logsumexp"};
  Arena a = {0};
  a.fail_after = -1;
  uint64_t saved = rng_state;
  rng_state = 0x5eed0fa11ull; /* the same cases whichever others run */
  for (int i = 0; i < n; i++) {
    int kind = i % 4, ra = 1 + (int)(urand() * 3), da[3], db[3], dy[3], rb = ra, ry = ra;
    for (int j = 0; j < ra; j++)
      da[j] = rdim();
    Case k = {.body = 1, .lo = -1, .hi = 1};
    const char *expr, *bdecl = "";
    if (kind == 0) { /* binary, broadcasting */
      rb = 1 + (int)(urand() * ra);
      for (int j = 0; j < rb; j++)
        db[j] = urand() < 0.3 ? 1 : da[ra - rb + j];
      for (int j = 0; j < ra; j++)
        dy[j] = da[j];
      int op = (int)(urand() * 5);
      expr = bin[op];
      if (op == 3)
        k.lo = 0.5, k.hi = 2; /* b away from 0 */
      if (op == 4)
        k.avoid[0] = 0, k.navoid = 1;
      bdecl = arena_printf(&a, "  b: {shape: %s}\n", shape_text(&a, rb, db));
      k.name = arena_printf(&a, "random %s %s %s", expr, shape_text(&a, ra, da), shape_text(&a, rb, db));
    } else if (kind == 1) { /* reduction */
      uint32_t axes = 1u + (uint32_t)(urand() * ((1u << ra) - 1));
      int keep = urand() < 0.5, op = (int)(urand() * 5);
      const char *dims = "[";
      ry = 0;
      for (int j = 0; j < ra; j++) {
        if (axes >> j & 1)
          dims = arena_printf(&a, "%s%s%d", dims, dims[1] ? ", " : "", j);
        if (!(axes >> j & 1))
          dy[ry++] = da[j];
        else if (keep)
          dy[ry++] = 1;
      }
      expr = arena_printf(&a, "%s(x, dim=%s], keepdim=%s)", red[op], dims, keep ? "true" : "false");
      if (op == 3) { /* var needs more than one element per group */
        int64_t cnt = 1;
        for (int j = 0; j < ra; j++)
          cnt *= axes >> j & 1 ? da[j] : 1;
        if (cnt < 2)
          expr = arena_printf(&a, "sum(x, dim=%s], keepdim=%s)", dims, keep ? "true" : "false");
      }
      if (ry == 0)
        expr = arena_printf(&a, "unsqueeze(%s, 0)", expr), dy[ry++] = 1;
      k.name = arena_printf(&a, "random %s on %s", expr, shape_text(&a, ra, da));
    } else if (kind == 2) { /* softmax family and norms */
      int ax = (int)(urand() * ra), op = (int)(urand() * 4);
      static const char *const f[] = {"softmax(x, dim=%d)", "log_softmax(x, dim=%d)", "layer_norm(x * 3, b, b)",
                                      "rms_norm(x * 3, b)"};
      expr = arena_printf(&a, f[op], ax);
      if (op >= 2 && da[ra - 1] < 3)
        da[ra - 1] = 3; /* over 1 or 2 elements a norm is x / |x|-like: a kink finite differences cannot follow */
      if (op >= 2)
        bdecl = arena_printf(&a, "  b: {shape: [%d]}\n", da[ra - 1]);
      for (int j = 0; j < ra; j++)
        dy[j] = da[j];
      k.name = arena_printf(&a, "random %s on %s", expr, shape_text(&a, ra, da));
    } else { /* batched matmul, batch dims broadcast */
      int M = rdim(), K = rdim(), N = rdim(), batch = rdim();
      int ab = urand() < 0.5, bb = !ab || urand() < 0.5;
      ra = ab ? 3 : 2;
      da[0] = batch, da[ra - 2] = M, da[ra - 1] = K;
      if (!ab)
        da[0] = M, da[1] = K;
      rb = bb ? 3 : 2;
      db[0] = batch, db[rb - 2] = K, db[rb - 1] = N;
      ry = ab || bb ? 3 : 2;
      dy[0] = batch, dy[ry - 2] = M, dy[ry - 1] = N;
      expr = "a @ b";
      bdecl = arena_printf(&a, "  b: {shape: %s}\n", shape_text(&a, rb, db));
      k.name = arena_printf(&a, "random matmul %s @ %s", shape_text(&a, ra, da), shape_text(&a, rb, db));
    }
    const char *x = kind == 0 || kind == 3 ? "a" : "x";
    k.src = arena_printf(&a, "inputs:\n  c: %s\nparams:\n  %s: {shape: %s}\n%sgraph:\n  - y: %s\n  - loss: sum(y * c)\n",
                         shape_text(&a, ry, dy), x, shape_text(&a, ra, da), bdecl, expr);
    if (!only || strstr(k.name, only))
      run_case(&k);
  }
  rng_state = saved;
  arena_free(&a);
}

/* In a bf16 model the backwards of softmax, log_softmax, layer_norm,
 * rms_norm and cross_entropy compute in f32 and round once (as PyTorch's
 * native kernels do): the gradient of a param that is the op's operand is
 * one cast to bf16 of an f32 arithmetic result (not of a cast: the work is
 * in f32, not in bf16 and widened). */
static void f32_backwards(void) {
  static const char *const ops[] = {"sum(softmax(x, dim=-1) * c)", "sum(log_softmax(x, dim=-1) * c)",
                                    "sum(layer_norm(x, w, w) * c)", "sum(rms_norm(x, w) * c)",
                                    "cross_entropy(x, t)"};
  for (int i = 0; i < 5; i++) {
    Arena arena = {0};
    Diag dg;
    arena.fail_after = -1;
    const char *src = arena_printf(&arena,
                                   "name: t\ndtype: bf16\ninputs:\n  c: [3, 5]\n  t: {shape: [3], dtype: i32}\n"
                                   "params:\n  x: {shape: [3, 5]}\n  w: {shape: [5]}\ngraph:\n  - loss: %s + sum(w)\n"
                                   "outputs: [loss]\ntrain:\n  loss: loss\n  optimizer: {sgd: {lr: 0.1}}\n",
                                   ops[i]);
    Graph *g = tgen_load(&dg, &arena, "f32_backwards", src, strlen(src));
    if (!g || autodiff(g)) {
      printf("FAIL f32 backward of %s: %s\n", ops[i], g ? "autodiff failed" : dg.msg);
      nfail++;
      arena_free(&arena);
      continue;
    }
    const Node *dx = g->grads[0];
    if (dx->op == OP_CAST && dx->dtype == DT_BF16 && dx->in[0]->dtype == DT_F32 && dx->in[0]->op != OP_CAST) {
      printf("ok   f32 backward of %s\n", ops[i]);
      npass++;
    } else {
      printf("FAIL f32 backward of %s: d x is a %s %s of %s\n", ops[i], dtype_names[dx->dtype], op_info[dx->op].name,
             dx->nin ? op_info[dx->in[0]->op].name : "-");
      nfail++;
    }
    arena_free(&arena);
  }
}

int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : NULL; /* run the cases whose name contains this */
#ifdef _OPENMP
  /* thousands of tiny evaluations: threads only add barriers, and under a
   * parallel ctest on few cores their spinning slows this test ~1000x */
  omp_set_num_threads(1);
#endif
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    if (!only || strstr(cases[i].name, only))
      run_case(&cases[i]);
  run_random_cases(48, only);
  if (!only)
    f32_backwards();
  Arena files = {0};
  files.fail_after = -1;
  for (size_t i = 0; i < sizeof examples / sizeof examples[0]; i++) {
    const Example *x = &examples[i];
    if (only && !strstr(x->path, only))
      continue;
    char *src = slurp(&files, x->path);
    if (!src) {
      printf("FAIL %s: cannot read\n", x->path);
      nfail++;
      continue;
    }
    for (int r = 0; r < 2 && !getenv("TGEN_AD_FULL"); r++)
      replace(src, x->from[r], x->to[r]);
    Case k = {.name = x->path, .src = src, .imax = 10, .dimval = 2, .nsample = 20, .stencil4 = 1,
              .lo = -0.5, .hi = 0.5};
    run_case(&k);
  }
  arena_free(&files);
  printf("%d passed, %d failed\n", npass, nfail);
  return nfail != 0;
}
