/* interp.c: the double-precision reference interpreter, the oracle of tgen.
 *
 * It evaluates a Graph node by node (g->nodes is topologically sorted) on dense
 * row-major tensors of doubles, computing what the PyTorch function of the same
 * name computes, in double and without rounding intermediate results to the
 * node's dtype (only `cast` rounds). Every pass is checked against it, and the
 * golden vectors of the emitted tests come from it, so it favours the obvious
 * loop over the fast one. The one concession is gemm (matmul, linear): i-k-j
 * loop order and, when built with OpenMP, rows on several threads; each value
 * is still summed in the same order, so results do not depend on either.
 *
 * The machinery is two strided helpers shared by every op:
 *   Walk    an odometer over a shape that keeps several operands' element
 *           offsets in step (broadcasting = stride 0; transpose, permute and
 *           slice = permuted or offset strides);
 *   Groups  a tensor's elements split along a set of dims (reductions,
 *           softmax, norms: one group per output element).
 *
 * Errors on user data (a bad input shape, an index out of range) return -1
 * with a message; nothing here aborts or exits. Malformed graphs (a bug in an
 * earlier pass) are reported the same way, prefixed "internal error". */
#include "ir.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Loops whose iterations write disjoint outputs may run on several threads
 * (each value is still computed by one thread in a fixed order). */
#ifdef _OPENMP
#define PARALLEL_FOR _Pragma("omp parallel for schedule(static)")
#else
#define PARALLEL_FOR
#endif

static const char *const op_names[] = {
#define OP(e, name, sig, rule, flags, grad, cls, ...) name,
#include "ops.def"
#undef OP
};

/* What every evaluation function needs: the graph, the options, the values
 * computed so far and where to put an error message. */
typedef struct Ctx {
  const Graph *g;
  Node *const *nodes; /* the nodes evaluated (NULL: g->nodes) */
  const InterpOptions *opt;
  Tensor *vals;
  char *err;
  size_t errlen;
} Ctx;

/* Formats an error into c->err; returns -1 so callers can `return fail(...)`. */
static int fail(Ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(Ctx *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (c->errlen)
    vsnprintf(c->err, c->errlen, fmt, ap);
  va_end(ap);
  return -1;
}

/* The binding name of a node for messages. */
static const char *nname(const Node *n) { return n->name ? n->name : "?"; }

/* ---------------------------------------------------------------- strides */

/* Row-major element strides of a shape. */
static void contiguous_strides(int rank, const int64_t *shape, int64_t *st) {
  int64_t s = 1;
  for (int k = rank - 1; k >= 0; k--) {
    st[k] = s;
    s *= shape[k];
  }
}

/* Strides that read a tensor of shape ish[ir] (element strides ist) at the
 * coordinates of the shape osh[orank] under NumPy broadcasting: trailing dims
 * align, a dim of size 1 or a missing leading dim repeats (stride 0). Returns 0
 * if ish does not broadcast to osh. */
static int bcast_strides(int ir, const int64_t *ish, const int64_t *ist, int orank, const int64_t *osh,
                         int64_t *st) {
  if (ir > orank)
    return 0;
  for (int k = 0; k < orank; k++)
    st[k] = 0;
  for (int k = 0; k < ir; k++) {
    int o = orank - ir + k;
    if (ish[k] == osh[o])
      st[o] = ish[k] == 1 ? 0 : ist[k];
    else if (ish[k] != 1)
      return 0;
  }
  return 1;
}

/* An odometer over `shape` that moves up to four operands' element offsets
 * along with the index: operand p sits at off[p] = sum_k idx[k] * st[p][k]
 * (+ its starting offset). walk_next steps to the next index in row-major
 * order. */
typedef struct Walk {
  int rank, nop;
  int64_t shape[MAXRANK], idx[MAXRANK];
  int64_t st[4][MAXRANK];
  int64_t off[4];
} Walk;

static void walk_init(Walk *w, int rank, const int64_t *shape, int nop) {
  memset(w, 0, sizeof *w);
  w->rank = rank;
  w->nop = nop;
  for (int k = 0; k < rank; k++)
    w->shape[k] = shape[k];
}

static void walk_next(Walk *w) {
  for (int k = w->rank - 1; k >= 0; k--) {
    w->idx[k]++;
    for (int p = 0; p < w->nop; p++)
      w->off[p] += w->st[p][k];
    if (w->idx[k] < w->shape[k])
      return;
    for (int p = 0; p < w->nop; p++)
      w->off[p] -= w->st[p][k] * w->shape[k];
    w->idx[k] = 0;
  }
}

/* Sets operand p of a walk over out's shape to read tensor t broadcast. */
static int walk_bcast(Ctx *c, const Node *n, Walk *w, int p, const Tensor *t) {
  int64_t st[MAXRANK];
  contiguous_strides(t->rank, t->shape, st);
  if (!bcast_strides(t->rank, t->shape, st, w->rank, w->shape, w->st[p]))
    return fail(c, "internal error: %s '%s': operand %d does not broadcast to the result", op_names[n->op],
                nname(n), p);
  return 0;
}

/* dst[i] = src[i] for every index i of `shape`, each side addressed by its own
 * strides and starting offset: the one loop behind broadcast_to, transpose,
 * permute, slice and concat. */
static void copy_strided(double *dst, const int64_t *dst_st, int64_t dst_base, const double *src,
                         const int64_t *src_st, int64_t src_base, int rank, const int64_t *shape) {
  Walk w;
  int64_t numel = 1;
  for (int k = 0; k < rank; k++)
    numel *= shape[k];
  walk_init(&w, rank, shape, 2);
  memcpy(w.st[0], dst_st, sizeof(int64_t) * (size_t)rank);
  memcpy(w.st[1], src_st, sizeof(int64_t) * (size_t)rank);
  for (int64_t j = 0; j < numel; j++, walk_next(&w))
    dst[dst_base + w.off[0]] = src[src_base + w.off[1]];
}

/* ---------------------------------------------------------------- groups */

/* The elements of a tensor split along the dims in `mask`: group i holds the
 * elements base[i] + off[r] for r < len. Groups come in row-major order of the
 * unmasked dims (the order of a reduction's output, with or without keepdim)
 * and each group in row-major order of the masked dims. Mask bits at or above
 * the rank are ignored (a rank-0 tensor is one group of one). */
typedef struct Groups {
  int64_t n, len;
  int64_t *base, *off;
} Groups;

static int groups_make(Ctx *c, const Tensor *t, uint32_t mask, Groups *gr) {
  int64_t st[MAXRANK], kept[MAXRANK], red[MAXRANK];
  contiguous_strides(t->rank, t->shape, st);
  gr->n = gr->len = 1;
  for (int k = 0; k < t->rank; k++) {
    int r = (mask >> k) & 1;
    kept[k] = r ? 1 : t->shape[k];
    red[k] = r ? t->shape[k] : 1;
    gr->n *= kept[k];
    gr->len *= red[k];
  }
  gr->base = malloc(sizeof(int64_t) * (size_t)(gr->n ? gr->n : 1));
  gr->off = malloc(sizeof(int64_t) * (size_t)(gr->len ? gr->len : 1));
  if (!gr->base || !gr->off) {
    free(gr->base);
    free(gr->off);
    gr->base = gr->off = NULL;
    return fail(c, "out of memory");
  }
  Walk w;
  walk_init(&w, t->rank, kept, 1);
  memcpy(w.st[0], st, sizeof st);
  for (int64_t i = 0; i < gr->n; i++, walk_next(&w))
    gr->base[i] = w.off[0];
  walk_init(&w, t->rank, red, 1);
  memcpy(w.st[0], st, sizeof st);
  for (int64_t r = 0; r < gr->len; r++, walk_next(&w))
    gr->off[r] = w.off[0];
  return 0;
}

static void groups_free(Groups *gr) {
  free(gr->base);
  free(gr->off);
}

/* Sum of x[off[r]], r < len, in order. */
static double gsum(const double *x, const int64_t *off, int64_t len) {
  double s = 0;
  for (int64_t r = 0; r < len; r++)
    s += x[off[r]];
  return s;
}

/* Maximum of x[off[r]]; NaN if any element is NaN (torch.amax, torch.max). */
static double gmax(const double *x, const int64_t *off, int64_t len) {
  double m = -INFINITY;
  for (int64_t r = 0; r < len; r++) {
    double v = x[off[r]];
    if (isnan(v))
      return v;
    if (v > m)
      m = v;
  }
  return m;
}

/* log(sum(exp(x))) as torch.logsumexp: shifted by the max, except that an
 * infinite max shifts by 0 (all -inf gives -inf, any +inf gives +inf). */
static double glogsumexp(const double *x, const int64_t *off, int64_t len) {
  double m = gmax(x, off, len);
  if (isinf(m))
    m = 0;
  double s = 0;
  for (int64_t r = 0; r < len; r++)
    s += exp(x[off[r]] - m);
  return log(s) + m;
}

/* Variance with `correction` (Bessel's for 1): sum((x - mean)^2) / max(0, N -
 * correction), as torch.var; a divisor of 0 gives inf or NaN. */
static double gvar(const double *x, const int64_t *off, int64_t len, double correction) {
  double mean = gsum(x, off, len) / (double)len, ss = 0;
  for (int64_t r = 0; r < len; r++) {
    double d = x[off[r]] - mean;
    ss += d * d;
  }
  double div = (double)len - correction;
  return ss / (div > 0 ? div : 0.0);
}

/* ---------------------------------------------------------------- pointwise */

/* The math functions of ops.def's expressions, in double (the emitted code
 * defines the same names in f32: templates/runtime/tgm_math.h). PyTorch's
 * semantics: maximum/minimum and clamp propagate NaN; gelu in its erf form,
 * or its tanh form when tanh_form. */
static double f_abs(double x) { return fabs(x); }
static double f_div(double a, double b) { return a / b; }
static double f_exp(double x) { return exp(x); }
static double f_log(double x) { return log(x); }
static double f_sqrt(double x) { return sqrt(x); }
static double f_sin(double x) { return sin(x); }
static double f_cos(double x) { return cos(x); }
static double f_tanh(double x) { return tanh(x); }
static double f_erf(double x) { return erf(x); }
static double f_pow(double x, double p) { return pow(x, p); }
static double f_inf0(double x) { return isinf(x) ? 0.0 : x; }
static double f_max(double a, double b) { return isnan(a) || isnan(b) ? a + b : a > b ? a : b; }
static double f_min(double a, double b) { return isnan(a) || isnan(b) ? a + b : a < b ? a : b; }
static double f_clamp(double x, double lo, double hi) { /* min(max(x, lo), hi); NaN stays */
  double t = x < lo ? lo : x;
  return t > hi ? hi : t;
}
static double f_gelu(double x, int tanh_form) {
  if (tanh_form)
    return 0.5 * x * (1.0 + tanh(0.79788456080286535587989211986876 * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440084436210485));
}
/* d gelu / dx: Phi(x) + x phi(x), or for the tanh form, with t = tanh(k (x +
 * c x^3)), k = sqrt(2/pi), c = 0.044715: (1 + t) / 2 + x (1 - t^2) k (1 +
 * 3 c x^2) / 2. */
static double f_gelu_grad(double x, int tanh_form) {
  if (tanh_form) {
    const double k = 0.79788456080286535587989211986876, c = 0.044715;
    double t = tanh(k * (x + c * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * c * x * x);
  }
  return 0.5 * (1.0 + erf(x * 0.70710678118654752440084436210485)) +
         x * exp(-0.5 * x * x) * 0.39894228040143267793994605993438;
}

/* One element of a pointwise op (class C_PW but for leaves, creation and
 * cast, which eval_leaf and eval_pointwise handle): ops.def's expression. */
#define PW_C_PW(...) return (double)(__VA_ARGS__);
#define PW_C_LEAF(...) break;
#define PW_C_REDUCE(...) break;
#define PW_C_COMPOSITE(...) break;
#define PW_C_VIEW(...) break;
#define PW_C_GEMM(...) break;
#define PW_C_EXTERN(...) break;
#define PW_C_TAKE(...) break;
static double pointwise(const Node *n, double a, double b, double c) {
  const double P0 = n->op == OP_CLAMP && !n->has_f[0] ? -INFINITY : n->f[0];
  const double P1 = n->op == OP_CLAMP && !n->has_f[1] ? INFINITY : n->f[1];
  const int FLAG = n->flag;
  const double I0 = 0;
  (void)P0, (void)P1, (void)FLAG, (void)I0, (void)a, (void)b, (void)c;
  switch (n->op) {
#define OP(e, name, sig, rule, flags, grad, cls, ...) case OP_##e: PW_##cls(__VA_ARGS__)
#include "ops.def"
#undef OP
  default: break;
  }
  return NAN;
}

/* Every op that maps operand elements to one result element, the operands
 * broadcast to the result's shape: unary, binary, pow, clamp, where, cast. */
static int eval_pointwise(Ctx *c, const Node *n, Tensor *out) {
  const Tensor *x[3];
  int nop = n->nin;
  Walk w;
  walk_init(&w, out->rank, out->shape, nop);
  for (int p = 0; p < nop; p++) {
    x[p] = &c->vals[n->in[p]->id];
    if (walk_bcast(c, n, &w, p, x[p]))
      return -1;
  }
  for (int64_t j = 0; j < out->numel; j++, walk_next(&w)) {
    double a = x[0]->data[w.off[0]];
    double b = nop > 1 ? x[1]->data[w.off[1]] : 0, cc = nop > 2 ? x[2]->data[w.off[2]] : 0;
    out->data[j] = n->op == OP_CAST ? round_to_dtype(a, n->dtype) : pointwise(n, a, b, cc);
  }
  return 0;
}

/* The uniform in (0, 1) of init.c: ((x >> 8) + 0.5) * 2^-24. */
static double unit(uint32_t x) { return ((double)(x >> 8) + 0.5) * (1.0 / 16777216.0); }

/* dropout(x, p): identity unless training. In training, element j of node n
 * is kept iff u >= p, where
 *   key = {seed lo32, seed hi32 ^ (uint32)n->index (the dropout's ordinal in the spec, stable across passes)},
 *   ctr = {j lo32, j hi32, step lo32, step hi32},
 *   u   = ((philox4x32(ctr, key)[0] >> 8) + 0.5) * 2^-24,
 * and kept values are multiplied by 1/(1-p) (p = 1 drops everything). The
 * emitted forward and backward regenerate exactly this mask. */
static int eval_dropout(Ctx *c, const Node *n, Tensor *out) {
  const Tensor *x = &c->vals[n->in[0]->id];
  const InterpOptions *o = c->opt;
  double p = n->f[0];
  if (x->numel != out->numel)
    return fail(c, "internal error: dropout '%s': operand size differs from the result", nname(n));
  if (!o->training) {
    memcpy(out->data, x->data, sizeof(double) * (size_t)out->numel);
    return 0;
  }
  uint32_t key[2] = {(uint32_t)o->seed, (uint32_t)(o->seed >> 32) ^ (uint32_t)n->index};
  for (int64_t j = 0; j < out->numel; j++) {
    uint32_t ctr[4] = {(uint32_t)(uint64_t)j, (uint32_t)((uint64_t)j >> 32), (uint32_t)o->step,
                       (uint32_t)(o->step >> 32)};
    uint32_t r[4];
    philox4x32(ctr, key, r);
    out->data[j] = p < 1 && unit(r[0]) >= p ? x->data[j] * (1.0 / (1.0 - p)) : 0.0;
  }
  return 0;
}

/* ---------------------------------------------------------------- reductions */

/* sum, mean, amax, var, logsumexp over the input dims in n->axes. The result's
 * elements are the groups in order, whether or not keepdim kept size-1 dims. */
static int eval_reduce(Ctx *c, const Node *n, Tensor *out) {
  const Tensor *x = &c->vals[n->in[0]->id];
  Groups gr;
  if (groups_make(c, x, n->axes, &gr))
    return -1;
  if (gr.n != out->numel) {
    groups_free(&gr);
    return fail(c, "internal error: %s '%s': result has %lld elements, expected %lld", op_names[n->op], nname(n),
                (long long)out->numel, (long long)gr.n);
  }
  for (int64_t i = 0; i < gr.n; i++) {
    const double *xs = x->data + gr.base[i];
    double v;
    switch (n->op) {
    case OP_SUM: v = gsum(xs, gr.off, gr.len); break;
    case OP_MEAN: v = gsum(xs, gr.off, gr.len) / (double)gr.len; break;
    case OP_AMAX: v = gmax(xs, gr.off, gr.len); break;
    case OP_VAR: v = gvar(xs, gr.off, gr.len, n->f[0]); break;
    default: v = glogsumexp(xs, gr.off, gr.len); break;
    }
    out->data[i] = v;
  }
  groups_free(&gr);
  return 0;
}

/* softmax and log_softmax along n->axis, shifted by the row max as torch does
 * (a row of all -inf gives NaN, like torch). */
static int eval_softmax(Ctx *c, const Node *n, Tensor *out) {
  const Tensor *x = &c->vals[n->in[0]->id];
  Groups gr;
  if (n->axis < 0 || n->axis >= x->rank || x->numel != out->numel)
    return fail(c, "internal error: %s '%s': bad axis", op_names[n->op], nname(n));
  if (groups_make(c, x, 1u << n->axis, &gr))
    return -1;
  for (int64_t i = 0; i < gr.n; i++) {
    const double *xs = x->data + gr.base[i];
    double *ys = out->data + gr.base[i];
    double m = gmax(xs, gr.off, gr.len), s = 0;
    for (int64_t r = 0; r < gr.len; r++)
      s += exp(xs[gr.off[r]] - m);
    for (int64_t r = 0; r < gr.len; r++) {
      double z = xs[gr.off[r]] - m;
      ys[gr.off[r]] = n->op == OP_SOFTMAX ? exp(z) / s : z - log(s);
    }
  }
  groups_free(&gr);
  return 0;
}

/* layer_norm and rms_norm over the last dim:
 *   layer_norm: (x - mean) / sqrt(var + eps) * weight + bias  (biased var)
 *   rms_norm:   x / sqrt(mean(x^2) + eps) * weight
 * weight and bias are [D] (or absent) and index the position in the row. */
static int eval_norm(Ctx *c, const Node *n, Tensor *out) {
  const Tensor *x = &c->vals[n->in[0]->id];
  const Tensor *w = n->nin > 1 && n->in[1] ? &c->vals[n->in[1]->id] : NULL;
  const Tensor *b = n->op == OP_LAYER_NORM && n->nin > 2 && n->in[2] ? &c->vals[n->in[2]->id] : NULL;
  double eps = n->f[0];
  Groups gr;
  if (groups_make(c, x, x->rank ? 1u << (x->rank - 1) : 0, &gr))
    return -1;
  if ((w && w->numel != gr.len) || (b && b->numel != gr.len)) {
    groups_free(&gr);
    return fail(c, "internal error: %s '%s': weight or bias size differs from the last dim", op_names[n->op],
                nname(n));
  }
  for (int64_t i = 0; i < gr.n; i++) {
    const double *xs = x->data + gr.base[i];
    double *ys = out->data + gr.base[i];
    double len = (double)gr.len, mean = 0, denom;
    if (n->op == OP_LAYER_NORM) {
      mean = gsum(xs, gr.off, gr.len) / len;
      denom = sqrt(gvar(xs, gr.off, gr.len, 0) + eps);
    } else {
      double ss = 0;
      for (int64_t r = 0; r < gr.len; r++)
        ss += xs[gr.off[r]] * xs[gr.off[r]];
      denom = sqrt(ss / len + eps);
    }
    for (int64_t r = 0; r < gr.len; r++) {
      double y = (xs[gr.off[r]] - mean) / denom;
      if (w)
        y *= w->data[r];
      if (b)
        y += b->data[r];
      ys[gr.off[r]] = y;
    }
  }
  groups_free(&gr);
  return 0;
}

/* ---------------------------------------------------------------- shape ops */

/* Evaluates a size attribute (slice bounds, arange length). */
static int eval_dim(Ctx *c, const Node *n, const Dim *d, int64_t *v) {
  const char *e = NULL;
  int64_t k;
  if (dim_is_const(d, &k)) {
    *v = k;
    return 0;
  }
  if (!c->opt->symvals)
    return fail(c, "%s '%s': a size needs the values of the dynamic dims", op_names[n->op], nname(n));
  if (!dim_eval(c->g, d, c->opt->symvals, v, &e))
    return fail(c, "%s '%s': %s", op_names[n->op], nname(n), e ? e : "size does not evaluate");
  return 0;
}

/* reshape, squeeze, unsqueeze: the same elements in the same order. */
static int eval_copy(Ctx *c, const Node *n, Tensor *out) {
  const Tensor *x = &c->vals[n->in[0]->id];
  if (x->numel != out->numel)
    return fail(c, "internal error: %s '%s': %lld elements into %lld", op_names[n->op], nname(n),
                (long long)x->numel, (long long)out->numel);
  memcpy(out->data, x->data, sizeof(double) * (size_t)out->numel);
  return 0;
}

/* broadcast_to, transpose, permute, slice: the result read from the operand
 * through strides (broadcast: stride 0; transpose/permute: the operand's
 * strides permuted; slice: the operand's strides from lo along axis). */
static int eval_view(Ctx *c, const Node *n, Tensor *out) {
  const Tensor *x = &c->vals[n->in[0]->id];
  int64_t ist[MAXRANK], ost[MAXRANK], st[MAXRANK], base = 0;
  int r = out->rank;
  contiguous_strides(x->rank, x->shape, ist);
  contiguous_strides(r, out->shape, ost);
  if (n->op == OP_BROADCAST_TO) {
    if (!bcast_strides(x->rank, x->shape, ist, r, out->shape, st))
      return fail(c, "internal error: broadcast_to '%s': operand does not broadcast", nname(n));
  } else {
    int perm[MAXRANK];
    for (int k = 0; k < r; k++)
      perm[k] = k;
    if (n->op == OP_TRANSPOSE) {
      if (n->axis < 0 || n->axis >= r || n->axis2 < 0 || n->axis2 >= r)
        return fail(c, "internal error: transpose '%s': bad axes", nname(n));
      perm[n->axis] = n->axis2;
      perm[n->axis2] = n->axis;
    } else if (n->op == OP_PERMUTE) {
      memcpy(perm, n->perm, sizeof perm);
    }
    if (x->rank != r)
      return fail(c, "internal error: %s '%s': rank changes", op_names[n->op], nname(n));
    for (int k = 0; k < r; k++) {
      if (perm[k] < 0 || perm[k] >= r)
        return fail(c, "internal error: %s '%s': bad permutation", op_names[n->op], nname(n));
      st[k] = ist[perm[k]];
      if (n->op != OP_SLICE && out->shape[k] != x->shape[perm[k]])
        return fail(c, "internal error: %s '%s': result shape does not match", op_names[n->op], nname(n));
    }
    if (n->op == OP_SLICE) {
      int64_t lo, hi;
      int a = n->axis;
      if (a < 0 || a >= r)
        return fail(c, "internal error: slice '%s': bad axis", nname(n));
      if (eval_dim(c, n, &n->lo, &lo) || eval_dim(c, n, &n->hi, &hi))
        return -1;
      if (lo < 0 || lo > hi || hi > x->shape[a] || out->shape[a] != hi - lo)
        return fail(c, "slice '%s': [%lld, %lld) is not a range of a dim of size %lld", nname(n), (long long)lo,
                    (long long)hi, (long long)x->shape[a]);
      base = lo * ist[a];
    }
  }
  copy_strided(out->data, ost, 0, x->data, st, base, r, out->shape);
  return 0;
}

/* concat along n->axis: each operand copied into its stretch of the result. */
static int eval_concat(Ctx *c, const Node *n, Tensor *out) {
  int64_t ost[MAXRANK], ist[MAXRANK], at = 0;
  int a = n->axis;
  if (a < 0 || a >= out->rank)
    return fail(c, "internal error: concat '%s': bad axis", nname(n));
  contiguous_strides(out->rank, out->shape, ost);
  for (int i = 0; i < n->nin; i++) {
    const Tensor *x = &c->vals[n->in[i]->id];
    if (x->rank != out->rank || at + x->shape[a] > out->shape[a])
      return fail(c, "internal error: concat '%s': operand %d does not fit", nname(n), i);
    contiguous_strides(x->rank, x->shape, ist);
    copy_strided(out->data, ost, at * ost[a], x->data, ist, 0, x->rank, x->shape);
    at += x->shape[a];
  }
  if (at != out->shape[a])
    return fail(c, "internal error: concat '%s': operands do not fill the result", nname(n));
  return 0;
}

/* ---------------------------------------------------------------- linear algebra */

/* C[M,N] = A[M,K] @ B[K,N], row-major and contiguous. Every C[i,j] is the sum
 * of A[i,k] * B[k,j] over k = 0, 1, ... in that order, so the value does not
 * depend on the loop order or on the number of threads; the loops run i, k, j
 * so that the inner loop walks rows of B and C (contiguous, vectorisable). */
static void gemm(const double *A, const double *B, double *C, int64_t M, int64_t K, int64_t N) {
  PARALLEL_FOR
  for (int64_t i = 0; i < M; i++) {
    double *Ci = C + i * N;
    for (int64_t j = 0; j < N; j++)
      Ci[j] = 0;
    for (int64_t k = 0; k < K; k++) {
      double aik = A[i * K + k];
      const double *Bk = B + k * N;
      for (int64_t j = 0; j < N; j++)
        Ci[j] += aik * Bk[j];
    }
  }
}

/* torch.matmul: a viewed as [batch..., M, K] (1-D: [1, K]), b as [batch..., K,
 * N] (1-D: [K, 1]), batch dims broadcast to the result's; the dims added for
 * 1-D operands are absent from the result, which does not change its layout. */
static int eval_matmul(Ctx *c, const Node *n, Tensor *out) {
  const Tensor *a = &c->vals[n->in[0]->id], *b = &c->vals[n->in[1]->id];
  int ar = a->rank, br = b->rank;
  if (ar < 1 || br < 1)
    return fail(c, "internal error: matmul '%s': scalar operand", nname(n));
  int64_t M = ar >= 2 ? a->shape[ar - 2] : 1, K = a->shape[ar - 1];
  int64_t K2 = br >= 2 ? b->shape[br - 2] : b->shape[0], N = br >= 2 ? b->shape[br - 1] : 1;
  int abr = ar >= 2 ? ar - 2 : 0, bbr = br >= 2 ? br - 2 : 0;
  int obr = out->rank - (ar >= 2) - (br >= 2);
  if (K != K2 || obr < 0 || (ar >= 2 && out->shape[obr] != M) || (br >= 2 && out->shape[out->rank - 1] != N))
    return fail(c, "internal error: matmul '%s': operand shapes do not match the result", nname(n));
  int64_t ast[MAXRANK], bst[MAXRANK];
  Walk w;
  contiguous_strides(ar, a->shape, ast);
  contiguous_strides(br, b->shape, bst);
  walk_init(&w, obr, out->shape, 2);
  if (!bcast_strides(abr, a->shape, ast, obr, out->shape, w.st[0]) ||
      !bcast_strides(bbr, b->shape, bst, obr, out->shape, w.st[1]))
    return fail(c, "internal error: matmul '%s': batch dims do not broadcast", nname(n));
  int64_t nbatch = 1;
  for (int k = 0; k < obr; k++)
    nbatch *= out->shape[k];
  for (int64_t t = 0; t < nbatch; t++, walk_next(&w))
    gemm(a->data + w.off[0], b->data + w.off[1], out->data + t * M * N, M, K, N);
  return 0;
}

/* linear(x, w, b) = x @ w^T + b: x [..., in], w [out, in], b [out] or absent;
 * x's leading dims are rows. w is transposed once so gemm can run. */
static int eval_linear(Ctx *c, const Node *n, Tensor *out) {
  const Tensor *x = &c->vals[n->in[0]->id], *w = &c->vals[n->in[1]->id];
  const Tensor *b = n->nin > 2 && n->in[2] ? &c->vals[n->in[2]->id] : NULL;
  if (x->rank < 1 || w->rank != 2 || x->shape[x->rank - 1] != w->shape[1] || (b && b->numel != w->shape[0]))
    return fail(c, "internal error: linear '%s': operand shapes do not match", nname(n));
  int64_t K = w->shape[1], O = w->shape[0], rows = K ? x->numel / K : 0;
  if (rows * O != out->numel)
    return fail(c, "internal error: linear '%s': result size does not match", nname(n));
  double *wt = malloc(sizeof(double) * (size_t)(K > 0 && O > 0 ? K * O : 1));
  if (!wt)
    return fail(c, "out of memory");
  for (int64_t o = 0; o < O; o++)
    for (int64_t k = 0; k < K; k++)
      wt[k * O + o] = w->data[o * K + k];
  gemm(x->data, wt, out->data, rows, K, O);
  free(wt);
  if (b)
    for (int64_t r = 0; r < rows; r++)
      for (int64_t o = 0; o < O; o++)
        out->data[r * O + o] += b->data[o];
  return 0;
}

/* ---------------------------------------------------------------- neural */

/* embedding(idx, table): out[p, :] = table[idx[p], :]; an index outside [0, V)
 * is a run-time error naming the binding and the position. */
static int eval_embedding(Ctx *c, const Node *n, Tensor *out) {
  const Tensor *idx = &c->vals[n->in[0]->id], *tab = &c->vals[n->in[1]->id];
  if (tab->rank != 2 || idx->numel * tab->shape[1] != out->numel)
    return fail(c, "internal error: embedding '%s': operand shapes do not match", nname(n));
  int64_t V = tab->shape[0], D = tab->shape[1];
  for (int64_t p = 0; p < idx->numel; p++) {
    double v = idx->data[p];
    if (!(v >= 0 && v < (double)V))
      return fail(c, "embedding '%s': index %.17g at position %lld is outside [0, %lld)", nname(n), v, (long long)p,
                  (long long)V);
    memcpy(out->data + p * D, tab->data + (int64_t)v * D, sizeof(double) * (size_t)D);
  }
  return 0;
}

/* embedding_backward(idx, dy, V): out [V, D] = 0, then out[idx[p], :] +=
 * dy[p, :] for p in order (deterministic); an index outside [0, V) is a
 * run-time error, as in embedding. */
static int eval_embedding_backward(Ctx *c, const Node *n, Tensor *out) {
  const Tensor *idx = &c->vals[n->in[0]->id], *dy = &c->vals[n->in[1]->id];
  if (out->rank != 2 || idx->numel * out->shape[1] != dy->numel)
    return fail(c, "internal error: embedding_backward '%s': operand shapes do not match", nname(n));
  int64_t V = out->shape[0], D = out->shape[1];
  memset(out->data, 0, sizeof(double) * (size_t)out->numel);
  for (int64_t p = 0; p < idx->numel; p++) {
    double v = idx->data[p];
    if (!(v >= 0 && v < (double)V))
      return fail(c, "embedding_backward '%s': index %.17g at position %lld is outside [0, %lld)", nname(n), v,
                  (long long)p, (long long)V);
    double *row = out->data + (int64_t)v * D;
    for (int64_t e = 0; e < D; e++)
      row[e] += dy->data[p * D + e];
  }
  return 0;
}

/* attention(q, k, v) as scaled_dot_product_attention: per batch index (q, k, v
 * batch dims broadcast to the result's), S = scale * q k^T [Tq, Tk]; causal
 * masks j > i (torch's tril(ones(Tq, Tk)), top-left aligned) to -inf; P =
 * softmax(S) over the last dim; out = P v [Tq, Dv].
 * attention_lse: lse[i] = log(sum_j exp(S[i, j])) (the max taken out first).
 * attention_backward (FlashAttention's, from the forward's lse and delta[i] =
 * sum_e dy[i, e] out[i, e]): P = exp(S - lse), dS = P (dy v^T - delta);
 * operand 0: dq = scale dS k; 1: dk = scale dS^T q; 2: dv = P^T dy, each
 * over the result's batch dims. */
static int eval_attention(Ctx *c, const Node *n, Tensor *out) {
  const Tensor *t[3] = {&c->vals[n->in[0]->id], &c->vals[n->in[1]->id], &c->vals[n->in[2]->id]};
  int lse = n->op == OP_ATTENTION_LSE, bwd = n->op == OP_ATTENTION_BACKWARD;
  int br = out->rank - (lse ? 1 : 2);
  for (int p = 0; p < 3; p++)
    if (t[p]->rank < 2)
      return fail(c, "internal error: %s '%s': operand of rank < 2", op_info[n->op].name, nname(n));
  const Tensor *q = t[0], *k = t[1], *v = t[2];
  int64_t Tq = q->shape[q->rank - 2], D = q->shape[q->rank - 1];
  int64_t Tk = k->shape[k->rank - 2], Dv = v->shape[v->rank - 1];
  int64_t ylen[3] = {Tq * D, Tk * D, Tk * Dv};
  if (br < 0 || k->shape[k->rank - 1] != D || v->shape[v->rank - 2] != Tk ||
      (n->op == OP_ATTENTION && (out->shape[br] != Tq || out->shape[br + 1] != Dv)) ||
      (lse && out->shape[br] != Tq))
    return fail(c, "internal error: %s '%s': operand shapes do not match", op_info[n->op].name, nname(n));
  double scale = n->has_f[0] ? n->f[0] : 1.0 / sqrt((double)D);
  Walk w;
  walk_init(&w, br, out->shape, 3);
  for (int p = 0; p < 3; p++) {
    int64_t st[MAXRANK];
    contiguous_strides(t[p]->rank, t[p]->shape, st);
    if (!bcast_strides(t[p]->rank - 2, t[p]->shape, st, br, out->shape, w.st[p]))
      return fail(c, "internal error: %s '%s': batch dims do not broadcast", op_info[n->op].name, nname(n));
  }
  double *s = malloc(sizeof(double) * (size_t)(Tk ? Tk : 1));
  if (!s)
    return fail(c, "out of memory");
  int64_t nbatch = 1;
  for (int d = 0; d < br; d++)
    nbatch *= out->shape[d];
  const double *DY = bwd ? c->vals[n->in[3]->id].data : NULL, *LSE = bwd ? c->vals[n->in[4]->id].data : NULL;
  const double *DELTA = bwd ? c->vals[n->in[5]->id].data : NULL;
  if (bwd)
    memset(out->data, 0, sizeof(double) * (size_t)(nbatch * ylen[n->axis]));
  for (int64_t b = 0; b < nbatch; b++, walk_next(&w)) {
    const double *Q = q->data + w.off[0], *K = k->data + w.off[1], *V = v->data + w.off[2];
    for (int64_t i = 0; i < Tq; i++) {
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j < Tk; j++) {
        double dot = 0;
        for (int64_t d = 0; d < D; d++)
          dot += Q[i * D + d] * K[j * D + d];
        s[j] = n->flag && j > i ? -INFINITY : scale * dot;
        if (s[j] > m) /* a NaN score still reaches every output through exp */
          m = s[j];
      }
      if (bwd) { /* s[j] = P[i, j] from the forward's lse */
        int64_t r = b * Tq + i;
        const double *dy = DY + r * Dv;
        double *o = out->data + b * ylen[n->axis];
        for (int64_t j = 0; j < Tk; j++) {
          double p = exp(s[j] - LSE[r]), dp = 0;
          for (int64_t e = 0; e < Dv; e++)
            dp += dy[e] * V[j * Dv + e];
          double ds = p * (dp - DELTA[r]);
          if (n->axis == 0)
            for (int64_t d = 0; d < D; d++)
              o[i * D + d] += scale * ds * K[j * D + d];
          else if (n->axis == 1)
            for (int64_t d = 0; d < D; d++)
              o[j * D + d] += scale * ds * Q[i * D + d];
          else
            for (int64_t e = 0; e < Dv; e++)
              o[j * Dv + e] += p * dy[e];
        }
        continue;
      }
      for (int64_t j = 0; j < Tk; j++) {
        s[j] = exp(s[j] - m);
        sum += s[j];
      }
      if (lse) {
        out->data[b * Tq + i] = m + log(sum);
        continue;
      }
      /* O[i,e] = sum over j (in order) of P[i,j] * V[j,e]; j outer for locality */
      double *O = out->data + b * Tq * Dv;
      for (int64_t e = 0; e < Dv; e++)
        O[i * Dv + e] = 0;
      for (int64_t j = 0; j < Tk; j++) {
        double p = s[j] / sum;
        for (int64_t e = 0; e < Dv; e++)
          O[i * Dv + e] += p * V[j * Dv + e];
      }
    }
  }
  free(s);
  return 0;
}

/* ---------------------------------------------------------------- losses */

/* cross_entropy(logits, target) as torch: logits [N, C, d...] (or [C] with a
 * scalar target), target [N, d...] integer classes; the loss of an element is
 * -log_softmax(row)[t] = max + log(sum(exp(row - max))) - row[t]; the result
 * is the mean over elements whose target is not ignore_index (none: 0/0 =
 * NaN). A target outside [0, C) is a run-time error. */
static int eval_cross_entropy(Ctx *c, const Node *n, Tensor *out) {
  const Tensor *x = &c->vals[n->in[0]->id], *tg = &c->vals[n->in[1]->id];
  int64_t N = 1, C, R = 1;
  if (x->rank == 1) {
    C = x->shape[0];
  } else if (x->rank >= 2) {
    N = x->shape[0];
    C = x->shape[1];
    for (int k = 2; k < x->rank; k++)
      R *= x->shape[k];
  } else {
    return fail(c, "internal error: cross_entropy '%s': scalar logits", nname(n));
  }
  if (tg->numel != N * R || out->numel != 1)
    return fail(c, "internal error: cross_entropy '%s': target shape does not match", nname(n));
  double total = 0, count = 0;
  for (int64_t i = 0; i < N; i++)
    for (int64_t r = 0; r < R; r++) {
      double t = tg->data[i * R + r];
      if (t == (double)n->ignore_index)
        continue;
      if (!(t >= 0 && t < (double)C))
        return fail(c, "cross_entropy '%s': target %.17g at position %lld is outside [0, %lld)", nname(n), t,
                    (long long)(i * R + r), (long long)C);
      const double *row = x->data + i * C * R + r;
      double m = -INFINITY, s = 0;
      for (int64_t j = 0; j < C; j++)
        if (row[j * R] > m) /* a NaN still reaches the loss through exp */
          m = row[j * R];
      for (int64_t j = 0; j < C; j++)
        s += exp(row[j * R] - m);
      total += -((row[(int64_t)t * R] - m) - log(s));
      count += 1;
    }
  out->data[0] = total / count;
  return 0;
}

/* mse_loss(a, b) = mean((a - b)^2) over the broadcast of a and b. */
static int eval_mse(Ctx *c, const Node *n, Tensor *out) {
  const Tensor *a = &c->vals[n->in[0]->id], *b = &c->vals[n->in[1]->id];
  int r = a->rank > b->rank ? a->rank : b->rank;
  int64_t sh[MAXRANK], numel = 1;
  for (int k = 0; k < r; k++) {
    int ka = k - (r - a->rank), kb = k - (r - b->rank);
    int64_t da = ka >= 0 ? a->shape[ka] : 1, db = kb >= 0 ? b->shape[kb] : 1;
    if (da != db && da != 1 && db != 1)
      return fail(c, "internal error: mse_loss '%s': operands do not broadcast", nname(n));
    sh[k] = da == 1 ? db : da;
    numel *= sh[k];
  }
  Walk w;
  walk_init(&w, r, sh, 2);
  if (walk_bcast(c, n, &w, 0, a) || walk_bcast(c, n, &w, 1, b))
    return -1;
  double s = 0;
  for (int64_t j = 0; j < numel; j++, walk_next(&w)) {
    double d = a->data[w.off[0]] - b->data[w.off[1]];
    s += d * d;
  }
  out->data[0] = s / (double)numel;
  return 0;
}

/* ---------------------------------------------------------------- leaves, creation */

/* input/param: a copy of the caller's tensor (shapes checked up front);
 * const: a scalar, or the value of a size; arange: 0..n-1; zeros/ones/full:
 * every element the value. */
static int eval_leaf(Ctx *c, const Node *n, const Tensor *src, Tensor *out) {
  double v = 0;
  switch (n->op) {
  case OP_INPUT:
  case OP_PARAM:
    if (src->numel != out->numel)
      return fail(c, "internal error: %s '%s': size differs from its declaration", op_names[n->op], nname(n));
    memcpy(out->data, src->data, sizeof(double) * (size_t)out->numel);
    return 0;
  case OP_ARANGE:
    for (int64_t j = 0; j < out->numel; j++)
      out->data[j] = (double)j;
    return 0;
  case OP_CONST:
    if (n->is_dimval) {
      int64_t k;
      if (eval_dim(c, n, &n->lo, &k))
        return -1;
      v = (double)k;
    } else {
      v = n->f[0];
    }
    break;
  case OP_ZEROS: v = 0; break;
  case OP_ONES: v = 1; break;
  default: v = n->f[0]; break; /* full */
  }
  for (int64_t j = 0; j < out->numel; j++)
    out->data[j] = v;
  return 0;
}

/* ---------------------------------------------------------------- driver */

/* Concrete shape of `s` for the symbol values: every Dim evaluated, checked
 * non-negative, numel checked not to overflow. t->data is left alone. */
int concrete_shape(const Graph *g, const Shape *s, const int64_t *symvals, Tensor *t, char *err, size_t errlen) {
  Ctx c = {.g = g, .err = err, .errlen = errlen};
  if (s->rank < 0 || s->rank > MAXRANK)
    return fail(&c, "internal error: rank %d", s->rank), 0;
  t->rank = s->rank;
  t->numel = 1;
  for (int k = 0; k < s->rank; k++) {
    int64_t v;
    const char *e = NULL;
    if (!dim_is_const(&s->d[k], &v)) {
      if (!symvals)
        return fail(&c, "dim %d (%s) needs the values of the dynamic dims", k, dim_str(g, &s->d[k])), 0;
      if (!dim_eval(g, &s->d[k], symvals, &v, &e))
        return fail(&c, "%s", e ? e : "a size does not evaluate"), 0;
    }
    if (v < 0)
      return fail(&c, "dim %d is negative (%lld)", k, (long long)v), 0;
    t->shape[k] = v;
    if (__builtin_mul_overflow(t->numel, v, &t->numel) || t->numel > (int64_t)(SIZE_MAX / sizeof(double)))
      return fail(&c, "tensor size overflows"), 0;
  }
  return 1;
}

/* Checks a caller's tensor against the declared shape of a leaf: "input 'x':
 * dim 1 is 5, expected 4". */
static int check_leaf(Ctx *c, const char *what, const char *name, const Node *node, const Tensor *t) {
  Tensor want;
  char e[256];
  if (!node)
    return fail(c, "internal error: %s '%s' has no node", what, name);
  if (!concrete_shape(c->g, &node->shape, c->opt->symvals, &want, e, sizeof e))
    return fail(c, "%s '%s': %s", what, name, e);
  if (!t)
    return fail(c, "%s '%s': no tensor given", what, name);
  if (t->rank != want.rank)
    return fail(c, "%s '%s': rank is %d, expected %d", what, name, t->rank, want.rank);
  for (int k = 0; k < want.rank; k++)
    if (t->shape[k] != want.shape[k])
      return fail(c, "%s '%s': dim %d is %lld, expected %lld", what, name, k, (long long)t->shape[k],
                  (long long)want.shape[k]);
  if (want.numel && !t->data)
    return fail(c, "%s '%s': no data", what, name);
  return 0;
}

/* Checks the values of the dynamic dims as the emitted guards do: 1 <= v <= max. */
static int check_syms(Ctx *c) {
  const Graph *g = c->g;
  if (!c->opt->symvals)
    return 0;
  for (int i = 0; i < g->nsyms; i++) {
    const Sym *s = &g->syms[i];
    if (s->derived) /* its value comes from its formula; checked by dim_eval */
      continue;
    int64_t v = c->opt->symvals[i];
    if (v < 1 || (s->max > 0 && v > s->max))
      return fail(c, "dim %s is %lld, expected 1 <= %s <= %lld", s->name ? s->name : "?", (long long)v,
                  s->name ? s->name : "?", (long long)s->max);
  }
  return 0;
}

/* take (gen/decompose.c): x with dim n->axis removed, each element x at the
 * index read from idx (same shape as the result); an index outside the dim
 * that is not n->ignore_index is an error, an ignored one reads index 0. */
static int eval_take(Ctx *c, const Node *n, Tensor *out) {
  const Tensor *x = &c->vals[n->in[0]->id], *ix = &c->vals[n->in[1]->id];
  int64_t inner = 1, size = x->shape[n->axis];
  for (int k = n->axis + 1; k < x->rank; k++)
    inner *= x->shape[k];
  if (ix->numel != out->numel || out->numel * size != x->numel)
    return fail(c, "internal error: take '%s': shapes do not match", nname(n));
  for (int64_t j = 0; j < out->numel; j++) {
    double t = ix->data[j];
    if (t == (double)n->ignore_index)
      t = 0;
    else if (!(t >= 0 && t < (double)size))
      return fail(c, "take '%s': index %.17g at position %lld is outside [0, %lld)", nname(n), t, (long long)j,
                  (long long)size);
    int64_t o = j / inner, i = j % inner;
    out->data[j] = x->data[(o * size + (int64_t)t) * inner + i];
  }
  return 0;
}

/* One node's value into out (shape already set, data allocated): by the op's
 * class, then by op within the classes that have several evaluators. */
static int eval_node(Ctx *c, const Node *n, const Tensor *inputs, const Tensor *params, Tensor *out) {
  switch (n->op) { /* leaves and creation (class C_LEAF, or C_PW without operands) */
  case OP_INPUT: return eval_leaf(c, n, &inputs[n->index], out);
  case OP_PARAM: return eval_leaf(c, n, &params[n->index], out);
  case OP_CONST: case OP_ARANGE: case OP_ZEROS: case OP_ONES: case OP_FULL: return eval_leaf(c, n, NULL, out);
  default: break;
  }
  switch (op_info[n->op].cls) {
  case C_PW: return eval_pointwise(c, n, out);
  case C_REDUCE: return eval_reduce(c, n, out);
  case C_TAKE: return eval_take(c, n, out);
  default: break;
  }
  switch (n->op) {
  case OP_MEAN: case OP_VAR: case OP_LOGSUMEXP: return eval_reduce(c, n, out);
  case OP_SOFTMAX: case OP_LOG_SOFTMAX: return eval_softmax(c, n, out);
  case OP_LAYER_NORM: case OP_RMS_NORM: return eval_norm(c, n, out);
  case OP_RESHAPE: case OP_SQUEEZE: case OP_UNSQUEEZE: return eval_copy(c, n, out);
  case OP_BROADCAST_TO: case OP_TRANSPOSE: case OP_PERMUTE: case OP_SLICE: return eval_view(c, n, out);
  case OP_CONCAT: return eval_concat(c, n, out);
  case OP_MATMUL: return eval_matmul(c, n, out);
  case OP_LINEAR: return eval_linear(c, n, out);
  case OP_EMBEDDING: return eval_embedding(c, n, out);
  case OP_EMBEDDING_BACKWARD: return eval_embedding_backward(c, n, out);
  case OP_ATTENTION: case OP_ATTENTION_LSE: case OP_ATTENTION_BACKWARD: return eval_attention(c, n, out);
  case OP_DROPOUT: return eval_dropout(c, n, out);
  case OP_CROSS_ENTROPY: return eval_cross_entropy(c, n, out);
  case OP_MSE_LOSS: return eval_mse(c, n, out);
  default: /* split becomes slices in the builder */
    return fail(c, "internal error: the interpreter has no rule for op %s",
                (unsigned)n->op < NUM_OPS ? op_names[n->op] : "?");
  }
}

/* Operand sanity: present where required and computed before n (the graph is
 * topologically sorted; a violation is a bug, reported rather than read). */
static int check_operands(Ctx *c, const Node *n, int i) {
  for (int k = 0; k < n->nin; k++) {
    const Node *m = n->in[k];
    if (!m) {
      int optional = (k >= 1 && (n->op == OP_LAYER_NORM || n->op == OP_RMS_NORM)) || (k == 2 && n->op == OP_LINEAR);
      if (optional)
        continue;
      return fail(c, "internal error: %s '%s': operand %d missing", op_names[n->op], nname(n), k);
    }
    if (m->id < 0 || m->id >= i || (c->nodes ? c->nodes : c->g->nodes)[m->id] != m)
      return fail(c, "internal error: %s '%s': operand %d is not an earlier node", op_names[n->op], nname(n), k);
  }
  return 0;
}

/* Evaluates node n into c->vals[n->id] (its operands' values are there). */
static int eval_one(Ctx *c, const Node *n, const Tensor *inputs, const Tensor *params) {
  const Graph *g = c->g;
  Tensor *out = &c->vals[n->id];
  if ((n->op == OP_INPUT && (n->index < 0 || n->index >= g->ninputs)) ||
      (n->op == OP_PARAM && (n->index < 0 || n->index >= g->nparams)))
    return fail(c, "internal error: %s '%s': bad index %d", op_names[n->op], nname(n), n->index);
  char e[256];
  if (!concrete_shape(g, &n->shape, c->opt->symvals, out, e, sizeof e))
    return fail(c, "%s '%s': %s", op_names[n->op], nname(n), e);
  out->data = malloc(sizeof(double) * (size_t)(out->numel ? out->numel : 1));
  if (!out->data)
    return fail(c, "out of memory (%s '%s': %lld elements)", op_names[n->op], nname(n), (long long)out->numel);
  return eval_node(c, n, inputs, params, out);
}

/* Checks the symbol values and the caller's inputs and params. */
static int check_args(Ctx *c, const Tensor *inputs, const Tensor *params) {
  const Graph *g = c->g;
  if (check_syms(c))
    return -1;
  for (int k = 0; k < g->ninputs; k++)
    if (check_leaf(c, "input", g->inputs[k].name, g->inputs[k].node, inputs ? &inputs[k] : NULL))
      return -1;
  for (int k = 0; k < g->nparams; k++)
    if (check_leaf(c, "param", g->params[k].name, g->params[k].node, params ? &params[k] : NULL))
      return -1;
  return 0;
}

/* Evaluates every node of g in order; see ir.h. */
int interp_run(const Graph *g, const InterpOptions *opt, const Tensor *inputs, const Tensor *params, Tensor *vals,
               char *err, size_t errlen) {
  static const InterpOptions none = {0};
  Ctx c = {.g = g, .opt = opt ? opt : &none, .vals = vals, .err = err, .errlen = errlen};
  if (errlen)
    err[0] = 0;
  memset(vals, 0, sizeof(Tensor) * (size_t)g->nnodes);
  if (check_args(&c, inputs, params))
    return -1;
  for (int i = 0; i < g->nnodes; i++)
    if (check_operands(&c, g->nodes[i], i) || eval_one(&c, g->nodes[i], inputs, params))
      goto error;
  return 0;
error:
  interp_free(g, vals);
  return -1;
}

/* Evaluates the nodes of a back-end pass (ids = positions in nodes[]); see ir.h. */
int interp_run_nodes(const Graph *g, Node *const *nodes, int n, const InterpOptions *opt, const Tensor *inputs,
                     const Tensor *params, Tensor *vals, char *err, size_t errlen) {
  static const InterpOptions none = {0};
  Ctx c = {.g = g, .nodes = nodes, .opt = opt ? opt : &none, .vals = vals, .err = err, .errlen = errlen};
  if (errlen)
    err[0] = 0;
  memset(vals, 0, sizeof(Tensor) * (size_t)n);
  if (check_args(&c, inputs, params))
    return -1;
  for (int i = 0; i < n; i++)
    if (nodes[i]->id != i || check_operands(&c, nodes[i], i) || eval_one(&c, nodes[i], inputs, params)) {
      if (nodes[i]->id != i)
        fail(&c, "internal error: node %d has id %d", i, nodes[i]->id);
      for (int j = 0; j < n; j++)
        free(vals[j].data);
      return -1;
    }
  return 0;
}

/* Frees every value interp_run made. */
void interp_free(const Graph *g, Tensor *vals) {
  for (int i = 0; i < g->nnodes; i++) {
    free(vals[i].data);
    vals[i].data = NULL;
  }
}

/* A copy of t (data malloc'd); 0, or -1 out of memory. */
static int copy_tensor(Ctx *c, const Tensor *t, Tensor *out) {
  *out = *t;
  out->data = malloc(sizeof(double) * (size_t)(t->numel ? t->numel : 1));
  if (!out->data)
    return fail(c, "out of memory");
  memcpy(out->data, t->data, sizeof(double) * (size_t)t->numel);
  return 0;
}

/* Evaluates the nodes in the order of a training schedule; see ir.h. A value
 * is present iff its data is set (every evaluated tensor has data). Params
 * and inputs are loaded up front and never freed: they are always there. */
int interp_run_plan(const Graph *g, const Plan *p, const InterpOptions *opt, const Tensor *inputs,
                    const Tensor *params, Tensor *grads, Tensor *loss, char *err, size_t errlen) {
  static const InterpOptions none = {0};
  Tensor *vals = calloc((size_t)g->nnodes + 1, sizeof(Tensor));
  Ctx c = {.g = g, .opt = opt ? opt : &none, .vals = vals, .err = err, .errlen = errlen};
  if (errlen)
    err[0] = 0;
  memset(grads, 0, sizeof(Tensor) * (size_t)g->ngrads);
  memset(loss, 0, sizeof *loss);
  if (!vals)
    return fail(&c, "out of memory");
  if (p->nfwd < 0 || p->nfwd > p->n || !p->saved) {
    fail(&c, "internal error: plan: forward part of %d nodes out of %d", p->nfwd, p->n);
    goto error;
  }
  if (check_args(&c, inputs, params))
    goto error;
  for (int i = 0; i < g->nnodes; i++)
    if ((g->nodes[i]->op == OP_INPUT || g->nodes[i]->op == OP_PARAM) && eval_one(&c, g->nodes[i], inputs, params))
      goto error;
  for (int j = 0; j <= p->n; j++) {
    if (j == p->nfwd) { /* the end of the forward pass: keep the loss and the saved values */
      if (!vals[g->loss->id].data) {
        fail(&c, "plan: the forward part does not compute the loss");
        goto error;
      }
      if (copy_tensor(&c, &vals[g->loss->id], loss))
        goto error;
      for (int i = 0; i < g->nforward; i++) {
        const Node *n = g->nodes[i];
        if (n->op != OP_INPUT && n->op != OP_PARAM && !p->saved[i]) {
          free(vals[i].data);
          vals[i].data = NULL;
        }
      }
    }
    if (j == p->n)
      break;
    int id = p->order[j];
    if (id < 0 || id >= g->nnodes) {
      fail(&c, "internal error: plan: node id %d out of range", id);
      goto error;
    }
    const Node *n = g->nodes[id];
    if (n->op == OP_INPUT || n->op == OP_PARAM)
      continue;
    const char *part = j < p->nfwd ? "forward" : "backward";
    if (vals[id].data) {
      fail(&c, "plan: %s part evaluates %s '%s' (%%%d), which is already there", part, op_names[n->op], nname(n), id);
      goto error;
    }
    for (int k = 0; k < n->nin; k++) {
      const Node *m = n->in[k];
      if (m && !vals[m->id].data) {
        fail(&c, "plan: %s part: %s '%s' (%%%d) reads %s '%s' (%%%d), which is %s", part, op_names[n->op], nname(n),
             id, op_names[m->op], nname(m), m->id,
             j >= p->nfwd && m->id < g->nforward ? "neither saved nor recomputed before it" : "not computed before it");
        goto error;
      }
    }
    if (eval_one(&c, n, inputs, params))
      goto error;
  }
  for (int k = 0; k < g->ngrads; k++) {
    const Node *d = g->grads[k];
    if (!vals[d->id].data) {
      fail(&c, "plan: the gradient of %s '%s' (%s '%s', %%%d) is not computed", k < g->nparams ? "param" : "input",
           k < g->nparams ? g->params[k].name : g->inputs[g->wrt[k - g->nparams]].name, op_names[d->op], nname(d), d->id);
      goto error;
    }
    if (copy_tensor(&c, &vals[d->id], &grads[k]))
      goto error;
  }
  interp_free(g, vals);
  free(vals);
  return 0;
error:
  interp_free(g, vals);
  free(vals);
  free(loss->data);
  loss->data = NULL;
  for (int k = 0; k < g->ngrads; k++) {
    free(grads[k].data);
    grads[k].data = NULL;
  }
  return -1;
}

/* ---------------------------------------------------------------- arguments */

/* The exclusive upper bound of the values of i32 input `in`: the rows of the
 * tables it indexes (embedding) or the classes it labels (cross_entropy),
 * the smallest of them; 4 when no op constrains it. */
static int64_t index_bound(const Graph *g, const Node *in) {
  int64_t bound = -1, v;
  for (int i = 0; i < g->nnodes; i++) {
    const Node *n = g->nodes[i];
    const Dim *d = NULL;
    if (n->op == OP_EMBEDDING && n->in[0] == in)
      d = &n->in[1]->shape.d[0];
    else if (n->op == OP_CROSS_ENTROPY && n->in[1] == in)
      d = &n->in[0]->shape.d[n->in[0]->shape.rank - 1];
    if (d && dim_is_const(d, &v) && (bound < 0 || v < bound))
      bound = v;
  }
  return bound < 0 ? 4 : bound;
}

/* Inputs and params for a run of g at the symbol values sym: params from
 * `seed` (param_init_value); inputs from a fixed pseudo-random fill (Philox
 * keyed by the input's name, seed 12345): floats uniform in [-1, 1) rounded
 * to the dtype, i32 in [0, index_bound), bool 0/1. Callers may overwrite the
 * inputs. Returns 0, or -1 with err and nothing left allocated. */
int interp_make_args(const Graph *g, const int64_t *sym, uint64_t seed, Tensor **ins_out, Tensor **ps_out, char *err,
                     size_t errlen) {
  Tensor *ins = calloc((size_t)g->ninputs + 1, sizeof(Tensor)), *ps = calloc((size_t)g->nparams + 1, sizeof(Tensor));
  int ok = ins && ps;
  if (!ok)
    snprintf(err, errlen, "out of memory");
  for (int k = 0; ok && k < g->ninputs; k++) {
    const Input *in = &g->inputs[k];
    ok = concrete_shape(g, &in->shape, sym, &ins[k], err, errlen);
    if (ok && !(ins[k].data = calloc((size_t)ins[k].numel + 1, sizeof(double)))) {
      snprintf(err, errlen, "out of memory for input '%s'", in->name);
      ok = 0;
    }
    int64_t bound = index_bound(g, in->node);
    Param fill = {.name = in->name, .init = INIT_UNIFORM, .a = -1, .b = 1, .dtype = in->dtype};
    if (!dtype_is_float(in->dtype))
      fill.a = 0, fill.b = in->dtype == DT_BOOL ? 2 : (double)bound, fill.dtype = DT_F32;
    for (int64_t i = 0; ok && i < ins[k].numel; i++) {
      double u = param_init_value(&fill, 12345, i);
      ins[k].data[i] = dtype_is_float(in->dtype) ? u : fmin(floor(u), fill.b - 1);
    }
  }
  for (int k = 0; ok && k < g->nparams; k++) {
    const Param *p = &g->params[k];
    ok = concrete_shape(g, &p->shape, sym, &ps[k], err, errlen);
    if (ok && !(ps[k].data = malloc(sizeof(double) * (size_t)ps[k].numel + 8))) {
      snprintf(err, errlen, "out of memory for param '%s'", p->name);
      ok = 0;
    }
    for (int64_t i = 0; ok && i < p->numel; i++)
      ps[k].data[i] = param_init_value(p, seed, i);
  }
  if (!ok) {
    interp_free_args(g, ins, ps);
    ins = ps = NULL;
  }
  *ins_out = ins;
  *ps_out = ps;
  return ok ? 0 : -1;
}

void interp_free_args(const Graph *g, Tensor *ins, Tensor *ps) {
  for (int k = 0; ins && k < g->ninputs; k++)
    free(ins[k].data);
  for (int k = 0; ps && k < g->nparams; k++)
    free(ps[k].data);
  free(ins);
  free(ps);
}
