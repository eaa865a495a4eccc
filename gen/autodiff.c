/* autodiff.c: reverse-mode differentiation into one joint forward/backward
 * graph.
 *
 * autodiff(g) walks the forward nodes from g->loss back to the leaves and
 * appends, after them, the nodes computing d loss / d x for every node x a
 * param's value flows into. Each op's local rule is the `grad` column of
 * ops.def (grad_<rule> below), written with the ordinary ops of the language
 * through a small builder that runs the same shape/dtype rules (infer.c) as
 * the forward nodes; so the backward is plain IR that every later pass, the
 * interpreter and the emitter read like the forward. Formulas: ALGORITHMS.md
 * §3 and PyTorch's derivatives (the interpreter's semantics).
 *
 * Conventions: dy is the gradient of the node being differentiated (its shape
 * and dtype); gradients of broadcast operands are summed back to the operand's
 * shape (sum_to); gradients that meet add up; only floating nodes that depend
 * on a param get one (i32/bool operands, comparisons and F_NO_GRAD ops none).
 * Every backward node carries the loc and scope of the forward node it
 * differentiates and the name "d_<its name>", so emitted code can point at the
 * spec line. */
#include "ir.h"

#include <math.h>
#include <string.h>

typedef struct AD {
  Graph *g;
  Node **grad;      /* grad[id] for the forward nodes: the sum so far, or NULL */
  Node **lse;       /* lse[id] for the attention nodes differentiated: their attention_lse */
  char *needs;      /* needs[id]: floating, and a param's value flows into it */
  const Node *at;   /* forward node being differentiated: loc, scope of new nodes */
  const char *name; /* "d_" + at's name */
} AD;

/* ---------------------------------------------------------------- builder */

/* Sets the forward node whose gradient the next nodes compute. */
static void set_at(AD *a, const Node *n) {
  a->at = n;
  a->name = arena_printf(a->g->arena, "d_%s", n->name ? n->name : "?");
}

/* A backward node: `op` over ins[0..nin) with the other arguments in args
 * (signature positions, as build.c fills them), shaped by infer_node. */
static Node *mk(AD *a, Op op, int nin, Node *const *ins, Arg *args) {
  Node *n = new_node(a->g, op, nin, a->at->loc);
  for (int i = 0; i < nin; i++)
    n->in[i] = ins[i];
  n->name = a->name;
  n->scope = a->at->scope;
  infer_node(a->g, n, args, "autodiff: ");
  return n;
}

static Node *op1(AD *a, Op op, Node *x) {
  Arg r[2] = {{0}};
  return mk(a, op, 1, &x, r);
}

static Node *op2(AD *a, Op op, Node *x, Node *y) {
  Arg r[2] = {{0}};
  Node *in[2] = {x, y};
  return mk(a, op, 2, in, r);
}

/* A Dim list in the arena for shape-kind arguments. */
static Arg shape_arg(AD *a, const Shape *s) {
  Arg r = {0};
  r.is_list = 1;
  r.nlist = s->rank;
  r.list = arena_alloc(a->g->arena, sizeof(Dim) * (size_t)(s->rank + 1));
  memcpy(r.list, s->d, sizeof(Dim) * (size_t)s->rank);
  return r;
}

/* full(shape, v, dtype). */
static Node *full_(AD *a, const Shape *s, double v, DType dt) {
  Arg r[3] = {shape_arg(a, s)};
  r[1].f = v;
  r[2].dt = dt;
  return mk(a, OP_FULL, 0, NULL, r);
}

/* A scalar constant (a rank-0 full; broadcasts against anything). */
static Node *scalar(AD *a, double v, DType dt) {
  Shape s = {0};
  return full_(a, &s, v, dt);
}

static Node *mulc(AD *a, Node *x, double v) { return op2(a, OP_MUL, x, scalar(a, v, x->dtype)); }
static Node *addc(AD *a, Node *x, double v) { return op2(a, OP_ADD, x, scalar(a, v, x->dtype)); }

static Node *cast_(AD *a, Node *x, DType dt) {
  Arg r[2] = {{0}};
  r[1].dt = dt;
  return mk(a, OP_CAST, 1, &x, r);
}

/* cmp(x, y) as 0/1 in dtype dt: the masks of the piecewise rules. */
static Node *mask(AD *a, Op cmp, Node *x, Node *y, DType dt) { return cast_(a, op2(a, cmp, x, y), dt); }

static Node *pow_(AD *a, Node *x, double p) {
  Arg r[2] = {{0}};
  r[1].f = p;
  return mk(a, OP_POW, 1, &x, r);
}

/* A reduction over the dims in `axes` (non-empty), or over all dims when
 * axes is ~0u. */
static Node *reduce(AD *a, Op op, Node *x, uint32_t axes, int keepdim, double correction) {
  Arg r[4] = {{0}};
  if (axes == ~0u) {
    r[1].is_none = 1;
  } else {
    r[1].is_list = 1;
    r[1].list = arena_alloc(a->g->arena, sizeof(Dim) * MAXRANK);
    for (int i = 0; i < x->shape.rank; i++)
      if (axes & (1u << i))
        r[1].list[r[1].nlist++] = dim_const(i);
  }
  r[2].b = keepdim;
  r[3].f = correction;
  return mk(a, op, 1, &x, r);
}

static Node *reshape_(AD *a, Node *x, const Shape *s) {
  if (shape_eq(&x->shape, s))
    return x;
  Arg r[2] = {{0}, shape_arg(a, s)};
  return mk(a, OP_RESHAPE, 1, &x, r);
}

static Node *broadcast_(AD *a, Node *x, const Shape *s) {
  if (shape_eq(&x->shape, s))
    return x;
  Arg r[2] = {{0}, shape_arg(a, s)};
  return mk(a, OP_BROADCAST_TO, 1, &x, r);
}

/* transpose(x, d0, d1); negative dims count from the end. */
static Node *transpose_(AD *a, Node *x, int d0, int d1) {
  Arg r[3] = {{0}};
  r[1].d = dim_const(d0);
  r[2].d = dim_const(d1);
  return mk(a, OP_TRANSPOSE, 1, &x, r);
}

static Node *unsqueeze_(AD *a, Node *x, int axis) {
  Arg r[2] = {{0}};
  r[1].d = dim_const(axis);
  return mk(a, OP_UNSQUEEZE, 1, &x, r);
}

static Node *softmax_(AD *a, Node *x, int axis) {
  Arg r[2] = {{0}};
  r[1].d = dim_const(axis);
  return mk(a, OP_SOFTMAX, 1, &x, r);
}

static Node *slice_(AD *a, Node *x, int axis, Dim lo, Dim hi) {
  Arg r[4] = {{0}};
  r[1].d = dim_const(axis);
  r[2].d = lo;
  r[3].d = hi;
  return mk(a, OP_SLICE, 1, &x, r);
}

static Node *arange_(AD *a, Dim n) {
  Arg r[1] = {{0}};
  r[0].d = n;
  return mk(a, OP_ARANGE, 0, NULL, r);
}

static Node *where_(AD *a, Node *c, Node *x, Node *y) {
  Arg r[3] = {{0}};
  Node *in[3] = {c, x, y};
  return mk(a, OP_WHERE, 3, in, r);
}

/* A size as a scalar of dtype dt: a constant, or the run-time value of a
 * symbolic size (a dim-valued const, as build.c makes for `x / T`). */
static Node *size_node(AD *a, Dim d, DType dt) {
  int64_t v;
  if (dim_is_const(&d, &v))
    return scalar(a, (double)v, dt);
  Node *n = new_node(a->g, OP_CONST, 0, a->at->loc);
  n->is_dimval = 1;
  n->lo = d;
  n->dtype = dt;
  n->name = a->name;
  n->scope = a->at->scope;
  Arg r[1] = {{0}};
  infer_node(a->g, n, r, "autodiff: ");
  return n;
}

/* Product of the dims of s in `axes`. */
static Dim dims_product(AD *a, const Shape *s, uint32_t axes) {
  Dim p = dim_const(1);
  for (int i = 0; i < s->rank; i++)
    if (axes & (1u << i))
      p = dim_mul(p, s->d[i], a->at->loc);
  return p;
}

/* x summed to shape s (s broadcasts to x's shape): over the leading dims x has
 * beyond s and the dims where s is 1 and x is not, keeping them, then
 * reshaped to s. The gradient of a broadcast operand. */
static Node *sum_to(AD *a, Node *x, const Shape *s) {
  if (shape_eq(&x->shape, s))
    return x;
  int lead = x->shape.rank - s->rank;
  if (lead < 0)
    die("sum_to: %s does not broadcast to %s", shape_str(a->g, s), shape_str(a->g, &x->shape));
  uint32_t axes = 0;
  for (int i = 0; i < x->shape.rank; i++)
    if (i < lead || (dim_is_one(&s->d[i - lead]) && !dim_is_one(&x->shape.d[i])))
      axes |= 1u << i;
  if (axes)
    x = reduce(a, OP_SUM, x, axes, 1, 0);
  return reshape_(a, x, s);
}

/* The shape of a reduction of s over `axes` with keepdim. */
static Shape keep_shape(const Shape *s, uint32_t axes) {
  Shape k = *s;
  for (int i = 0; i < s->rank; i++)
    if (axes & (1u << i))
      k.d[i] = dim_const(1);
  return k;
}

/* t (a reduction's result or gradient) in its keepdim shape, so it
 * broadcasts against the reduction's input x. */
static Node *keep(AD *a, Node *t, const Node *x, uint32_t axes) {
  Shape k = keep_shape(&x->shape, axes);
  return reshape_(a, t, &k);
}

/* ---------------------------------------------------------------- accumulation */

/* Whether operand x gets a gradient. */
static int wants(const AD *a, const Node *x) { return x && x->id < a->g->nforward && a->needs[x->id]; }

static int is_zeros(const Node *n) { return n->op == OP_FULL && n->f[0] == 0; }

/* The sum of two gradients g and d of one tensor that are each a concat,
 * along one axis of static sizes, of zero blocks and pieces, no piece of one
 * overlapping a piece of the other: one concat of the pieces and the zeros
 * between them. The gradients of slices that tile a tensor (q, k, v =
 * split(qkv)) so become one concat of d_q, d_k, d_v instead of three padded
 * copies added up. NULL when g and d are not so. */
static Node *merge_pieces(AD *a, Node *g, Node *d) {
  enum { MAXP = 32 };
  if (g->op != OP_CONCAT || d->op != OP_CONCAT || g->axis != d->axis || g->nin > MAXP || d->nin > MAXP)
    return NULL;
  const int ax = g->axis, n[2] = {g->nin, d->nin};
  Node *const *in[2] = {g->in, d->in};
  int64_t at[2][MAXP + 1]; /* where each operand starts along the axis */
  for (int s = 0; s < 2; s++) {
    at[s][0] = 0;
    for (int i = 0; i < n[s]; i++) {
      int64_t sz;
      if (!dim_is_const(&in[s][i]->shape.d[ax], &sz))
        return NULL;
      at[s][i + 1] = at[s][i] + sz;
    }
  }
  Node *parts[4 * MAXP];
  int np = 0, i[2] = {0, 0};
  for (int64_t pos = 0, total = at[0][n[0]]; pos < total;) {
    for (int s = 0; s < 2; s++)
      while (at[s][i[s] + 1] <= pos)
        i[s]++;
    int z0 = is_zeros(in[0][i[0]]), z1 = is_zeros(in[1][i[1]]);
    if (!z0 && !z1)
      return NULL;
    if (!z0 || !z1) { /* a piece of side s, the other side zeros all along it */
      int s = z0 ? 1 : 0;
      int64_t end = at[s][i[s] + 1];
      if (at[s][i[s]] != pos)
        return NULL;
      for (int j = i[!s]; j < n[!s] && at[!s][j] < end; j++)
        if (!is_zeros(in[!s][j]))
          return NULL;
      parts[np++] = in[s][i[s]];
      pos = end;
    } else { /* zeros on both sides, up to the next piece of either */
      int64_t next = total;
      for (int s = 0; s < 2; s++)
        for (int j = i[s]; j < n[s]; j++)
          if (!is_zeros(in[s][j])) {
            next = at[s][j] < next ? at[s][j] : next;
            break;
          }
      Shape sh = g->shape;
      sh.d[ax] = dim_const(next - pos);
      parts[np++] = full_(a, &sh, 0, g->dtype);
      pos = next;
    }
  }
  if (np == 1)
    return parts[0];
  Arg r[2] = {{0}};
  r[1].d = dim_const(ax);
  return mk(a, OP_CONCAT, np, parts, r);
}

/* Adds dx to the gradient of x (dx has x's shape and dtype). */
static void acc(AD *a, Node *x, Node *dx) {
  if (!wants(a, x))
    return;
  if (!shape_eq(&dx->shape, &x->shape) || dx->dtype != x->dtype)
    die("autodiff: gradient of %s '%s' is %s %s, expected %s %s", op_info[x->op].name, x->name ? x->name : "?",
        dtype_names[dx->dtype], shape_str(a->g, &dx->shape), dtype_names[x->dtype], shape_str(a->g, &x->shape));
  Node **g = &a->grad[x->id], *m = *g ? merge_pieces(a, *g, dx) : NULL;
  *g = m ? m : *g ? op2(a, OP_ADD, *g, dx) : dx;
}

/* ---------------------------------------------------------------- rules: pointwise */

/* No gradient flows: leaves, constants, comparisons, ops the builder expands
 * (split, zeros, ones), backward-only ops. */
static void grad_none(AD *a, Node *n, Node *dy) { (void)a, (void)n, (void)dy; }

/* f'(x) of a one-operand pointwise op n = f(x) (x's shape, or a scalar),
 * written with x and the result y = n. */
static Node *unary_deriv(AD *a, Node *n) {
  Node *x = n->in[0], *y = n;
  DType dt = x->dtype;
  switch (n->op) {
  case OP_NEG: return scalar(a, -1, dt);
  case OP_ABS: /* sign(x), 0 at 0 */
    return op2(a, OP_SUB, mask(a, OP_GT, x, scalar(a, 0, dt), dt), mask(a, OP_LT, x, scalar(a, 0, dt), dt));
  case OP_EXP: return y;
  case OP_LOG: return op1(a, OP_RECIPROCAL, x);
  case OP_SQRT: return op2(a, OP_DIV, scalar(a, 0.5, dt), y);
  case OP_RSQRT: return mulc(a, pow_(a, y, 3), -0.5);
  case OP_SIN: return op1(a, OP_COS, x);
  case OP_COS: return op1(a, OP_NEG, op1(a, OP_SIN, x));
  case OP_TANH: return op2(a, OP_SUB, scalar(a, 1, dt), op1(a, OP_SQUARE, y));
  case OP_SIGMOID: return op2(a, OP_MUL, y, op2(a, OP_SUB, scalar(a, 1, dt), y));
  case OP_RELU: return mask(a, OP_GT, x, scalar(a, 0, dt), dt); /* 0 at x <= 0 */
  case OP_SILU: { /* s (1 + x (1 - s)), s = sigmoid(x) */
    Node *s = op1(a, OP_SIGMOID, x);
    return op2(a, OP_MUL, s, addc(a, op2(a, OP_MUL, x, op2(a, OP_SUB, scalar(a, 1, dt), s)), 1));
  }
  case OP_ERF: return mulc(a, op1(a, OP_EXP, op1(a, OP_NEG, op1(a, OP_SQUARE, x))), 1.12837916709551257390);
  case OP_SQUARE: return mulc(a, x, 2);
  case OP_RECIPROCAL: return op1(a, OP_NEG, op1(a, OP_SQUARE, y));
  case OP_POW: /* p x^(p-1); torch gives 0 for p = 0 */
    return n->f[0] == 0 ? scalar(a, 0, dt) : mulc(a, pow_(a, x, n->f[0] - 1), n->f[0]);
  case OP_CLAMP: { /* 1 where min <= x <= max */
    Node *m = NULL;
    if (n->has_f[0])
      m = mask(a, OP_GE, x, scalar(a, n->f[0], dt), dt);
    if (n->has_f[1]) {
      Node *m2 = mask(a, OP_LE, x, scalar(a, n->f[1], dt), dt);
      m = m ? op2(a, OP_MUL, m, m2) : m2;
    }
    return m;
  }
  default: die("autodiff: %s is not a unary op", op_info[n->op].name);
  }
}

/* gelu: dx = gelu_grad(dy, x), one pointwise op (ops.def). */
static void grad_gelu(AD *a, Node *n, Node *dy) {
  if (!wants(a, n->in[0]))
    return;
  Node *d = op2(a, OP_GELU_GRAD, dy, n->in[0]);
  d->flag = n->flag;
  acc(a, n->in[0], d);
}

/* One-operand pointwise ops: dx = dy * f'(x). */
static void grad_unary(AD *a, Node *n, Node *dy) {
  if (wants(a, n->in[0]))
    acc(a, n->in[0], op2(a, OP_MUL, dy, unary_deriv(a, n)));
}

static void grad_add(AD *a, Node *n, Node *dy) {
  for (int k = 0; k < 2; k++)
    if (wants(a, n->in[k]))
      acc(a, n->in[k], sum_to(a, dy, &n->in[k]->shape));
}

static void grad_sub(AD *a, Node *n, Node *dy) {
  if (wants(a, n->in[0]))
    acc(a, n->in[0], sum_to(a, dy, &n->in[0]->shape));
  if (wants(a, n->in[1]))
    acc(a, n->in[1], sum_to(a, op1(a, OP_NEG, dy), &n->in[1]->shape));
}

static void grad_mul(AD *a, Node *n, Node *dy) {
  for (int k = 0; k < 2; k++)
    if (wants(a, n->in[k]))
      acc(a, n->in[k], sum_to(a, op2(a, OP_MUL, dy, n->in[1 - k]), &n->in[k]->shape));
}

/* y = a / b: da = dy / b, db = -dy y / b. */
static void grad_div(AD *a, Node *n, Node *dy) {
  Node *x = n->in[0], *b = n->in[1];
  if (wants(a, x))
    acc(a, x, sum_to(a, op2(a, OP_DIV, dy, b), &x->shape));
  if (wants(a, b))
    acc(a, b, sum_to(a, op1(a, OP_NEG, op2(a, OP_DIV, op2(a, OP_MUL, dy, n), b)), &b->shape));
}

/* maximum/minimum: the gradient goes to the winner; ties split it in half
 * (torch). */
static void grad_maxmin(AD *a, Node *n, Node *dy) {
  Op win = n->op == OP_MAXIMUM ? OP_GT : OP_LT;
  for (int k = 0; k < 2; k++) {
    Node *x = n->in[k], *o = n->in[1 - k];
    if (!wants(a, x))
      continue;
    Node *w = op2(a, OP_ADD, mask(a, win, x, o, x->dtype), mulc(a, mask(a, OP_EQ, x, o, x->dtype), 0.5));
    acc(a, x, sum_to(a, op2(a, OP_MUL, dy, w), &x->shape));
  }
}

/* where(c, a, b): dy to a where c holds, to b elsewhere. */
static void grad_where(AD *a, Node *n, Node *dy) {
  Node *c = n->in[0], *zero = NULL;
  for (int k = 1; k < 3; k++) {
    Node *x = n->in[k];
    if (!wants(a, x))
      continue;
    if (!zero)
      zero = scalar(a, 0, dy->dtype);
    Node *d = k == 1 ? where_(a, c, dy, zero) : where_(a, c, zero, dy);
    acc(a, x, sum_to(a, d, &x->shape));
  }
}

/* cast: the gradient cast back to the operand's dtype. */
static void grad_cast(AD *a, Node *n, Node *dy) {
  Node *x = n->in[0];
  if (wants(a, x))
    acc(a, x, dy->dtype == x->dtype ? dy : cast_(a, dy, x->dtype));
}

/* ---------------------------------------------------------------- rules: reductions, normalisation */

/* sum, mean, amax, var, logsumexp over n->axes; g is dy in the keepdim shape. */
static void grad_reduce(AD *a, Node *n, Node *dy) {
  Node *x = n->in[0], *dx;
  uint32_t axes = n->axes;
  if (!wants(a, x))
    return;
  Node *g = keep(a, dy, x, axes);
  DType dt = x->dtype;
  switch (n->op) {
  case OP_SUM:
    dx = broadcast_(a, g, &x->shape);
    break;
  case OP_MEAN:
    dx = broadcast_(a, op2(a, OP_DIV, g, size_node(a, dims_product(a, &x->shape, axes), dt)), &x->shape);
    break;
  case OP_AMAX: { /* ties share evenly: dy (x == max) / count */
    Node *m = mask(a, OP_EQ, x, keep(a, n, x, axes), dt);
    Node *cnt = axes ? reduce(a, OP_SUM, m, axes, 1, 0) : scalar(a, 1, dt);
    dx = op2(a, OP_MUL, g, op2(a, OP_DIV, m, cnt));
    break;
  }
  case OP_VAR: { /* dy 2 (x - mean) / (N - correction) */
    Node *mu = axes ? reduce(a, OP_MEAN, x, axes, 1, 0) : x;
    Node *den = addc(a, size_node(a, dims_product(a, &x->shape, axes), dt), -n->f[0]);
    dx = op2(a, OP_MUL, g, op2(a, OP_DIV, mulc(a, op2(a, OP_SUB, x, mu), 2), den));
    break;
  }
  default: /* logsumexp: dy exp(x - y) */
    dx = op2(a, OP_MUL, g, op1(a, OP_EXP, op2(a, OP_SUB, x, keep(a, n, x, axes))));
    break;
  }
  acc(a, x, dx);
}

/* softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy),
 * sums along the softmax dim; in f32, rounded once (f32_ below says why). */
static Node *f32_(AD *a, Node *x);
static void grad_softmax(AD *a, Node *n, Node *dy) {
  Node *x = n->in[0];
  uint32_t ax = 1u << n->axis;
  if (!wants(a, x))
    return;
  Node *y = f32_(a, n), *g = f32_(a, dy), *dx;
  if (n->op == OP_SOFTMAX)
    dx = op2(a, OP_MUL, y, op2(a, OP_SUB, g, reduce(a, OP_SUM, op2(a, OP_MUL, g, y), ax, 1, 0)));
  else
    dx = op2(a, OP_SUB, g, op2(a, OP_MUL, op1(a, OP_EXP, y), reduce(a, OP_SUM, g, ax, 1, 0)));
  acc(a, x, x->dtype == DT_F32 ? dx : cast_(a, dx, x->dtype));
}

/* x as f32 (itself when it is). The backwards of softmax and the norms
 * compute in f32 and round once, as PyTorch's native kernels do for
 * bf16/f16 (one rounding per op there would be both less accurate and, in
 * the generated row kernels, more instructions per element: GPT-2's
 * layer-norm backward kernel had 34 roundings, now 6). */
static Node *f32_(AD *a, Node *x) { return x->dtype == DT_F32 ? x : cast_(a, x, DT_F32); }

/* layer_norm over the last dim, statistics recomputed, in f32: r =
 * rsqrt(var + eps), xh = (x - mean) r, g = dy w; dx = r (g - mean(g) - xh
 * mean(g xh)), dw = sum over rows of dy xh, db = sum over rows of dy. */
static void grad_layer_norm(AD *a, Node *n, Node *dy) {
  Node *x = n->in[0], *w = n->in[1], *b = n->in[2];
  uint32_t ax = 1u << (x->shape.rank - 1);
  if (wants(a, x) || wants(a, w)) {
    Node *xf = f32_(a, x), *dyf = f32_(a, dy);
    Node *mu = reduce(a, OP_MEAN, xf, ax, 1, 0);
    Node *r = op1(a, OP_RSQRT, addc(a, reduce(a, OP_VAR, xf, ax, 1, 0), n->f[0]));
    Node *xh = op2(a, OP_MUL, op2(a, OP_SUB, xf, mu), r);
    if (wants(a, x)) {
      Node *g = w ? op2(a, OP_MUL, dyf, f32_(a, w)) : dyf;
      Node *mg = reduce(a, OP_MEAN, g, ax, 1, 0);
      Node *mgx = reduce(a, OP_MEAN, op2(a, OP_MUL, g, xh), ax, 1, 0);
      Node *dx = op2(a, OP_MUL, r, op2(a, OP_SUB, op2(a, OP_SUB, g, mg), op2(a, OP_MUL, xh, mgx)));
      acc(a, x, x->dtype == DT_F32 ? dx : cast_(a, dx, x->dtype));
    }
    if (wants(a, w)) {
      Node *dw = sum_to(a, op2(a, OP_MUL, dyf, xh), &w->shape);
      acc(a, w, w->dtype == DT_F32 ? dw : cast_(a, dw, w->dtype));
    }
  }
  if (wants(a, b))
    acc(a, b, sum_to(a, dy, &b->shape));
}

/* rms_norm over the last dim, in f32: r = rsqrt(mean(x^2) + eps), g = dy w;
 * dx = r g - r^3 x mean(g x), dw = sum over rows of dy x r. */
static void grad_rms_norm(AD *a, Node *n, Node *dy) {
  Node *x = n->in[0], *w = n->in[1];
  uint32_t ax = 1u << (x->shape.rank - 1);
  if (!wants(a, x) && !wants(a, w))
    return;
  Node *xf = f32_(a, x), *dyf = f32_(a, dy);
  Node *r = op1(a, OP_RSQRT, addc(a, reduce(a, OP_MEAN, op1(a, OP_SQUARE, xf), ax, 1, 0), n->f[0]));
  if (wants(a, x)) {
    Node *g = w ? op2(a, OP_MUL, dyf, f32_(a, w)) : dyf;
    Node *mgx = reduce(a, OP_MEAN, op2(a, OP_MUL, g, xf), ax, 1, 0);
    Node *dx = op2(a, OP_SUB, op2(a, OP_MUL, r, g), op2(a, OP_MUL, op2(a, OP_MUL, pow_(a, r, 3), xf), mgx));
    acc(a, x, x->dtype == DT_F32 ? dx : cast_(a, dx, x->dtype));
  }
  if (wants(a, w)) {
    Node *dw = sum_to(a, op2(a, OP_MUL, dyf, op2(a, OP_MUL, xf, r)), &w->shape);
    acc(a, w, w->dtype == DT_F32 ? dw : cast_(a, dw, w->dtype));
  }
}

/* ---------------------------------------------------------------- rules: shape */

/* reshape, squeeze, unsqueeze: the same elements in x's shape. */
static void grad_reshape(AD *a, Node *n, Node *dy) {
  if (wants(a, n->in[0]))
    acc(a, n->in[0], reshape_(a, dy, &n->in[0]->shape));
}

static void grad_broadcast_to(AD *a, Node *n, Node *dy) {
  if (wants(a, n->in[0]))
    acc(a, n->in[0], sum_to(a, dy, &n->in[0]->shape));
}

static void grad_transpose(AD *a, Node *n, Node *dy) {
  if (wants(a, n->in[0]))
    acc(a, n->in[0], transpose_(a, dy, n->axis, n->axis2));
}

/* permute: dy permuted by the inverse permutation. */
static void grad_permute(AD *a, Node *n, Node *dy) {
  Node *x = n->in[0];
  if (!wants(a, x))
    return;
  Arg r[2] = {{0}};
  r[1].is_list = 1;
  r[1].nlist = n->shape.rank;
  r[1].list = arena_alloc(a->g->arena, sizeof(Dim) * MAXRANK);
  for (int i = 0; i < n->shape.rank; i++)
    r[1].list[n->perm[i]] = dim_const(i);
  acc(a, x, mk(a, OP_PERMUTE, 1, &dy, r));
}

/* A zero block: x's shape with `size` along `axis`; NULL for size 0 (sizes
 * must be >= 1, so an empty piece is left out). */
/* Zeros shaped like x with dim `axis` = size; NULL when size is 0. A size
 * that may be 0 for some values of the dynamic dims gets one extra element
 * (*padded = 1), which the caller slices off again. */
static Node *zero_piece(AD *a, const Node *x, int axis, Dim size, int *padded) {
  int64_t v, lo, hi;
  *padded = 0;
  if (dim_is_const(&size, &v) && v == 0)
    return NULL;
  if (!dim_bounds(a->g, &size, &lo, &hi) || lo < 1) {
    size = dim_add(size, dim_const(1), a->at->loc);
    *padded = 1;
  }
  Shape s = x->shape;
  s.d[axis] = size;
  return full_(a, &s, 0, x->dtype);
}

/* slice: dy placed back between zeros, concat([zeros(lo), dy, zeros(size -
 * hi)]); pieces that can be empty at run time are padded by one element and
 * the padding sliced off. */
static void grad_slice(AD *a, Node *n, Node *dy) {
  Node *x = n->in[0];
  int ax = n->axis;
  if (!wants(a, x))
    return;
  Node *parts[3];
  int np = 0, pb, pa;
  Node *before = zero_piece(a, x, ax, n->lo, &pb);
  Node *after = zero_piece(a, x, ax, dim_sub(x->shape.d[ax], n->hi, n->loc), &pa);
  if (before)
    parts[np++] = before;
  parts[np++] = dy;
  if (after)
    parts[np++] = after;
  if (np == 1) {
    acc(a, x, dy);
    return;
  }
  Arg r[2] = {{0}};
  r[1].d = dim_const(ax);
  Node *cat = mk(a, OP_CONCAT, np, parts, r);
  if (pb || pa)
    cat = slice_(a, cat, ax, dim_const(pb), dim_add(x->shape.d[ax], dim_const(pb), n->loc));
  acc(a, x, cat);
}

/* concat: each operand's stretch of dy. */
static void grad_concat(AD *a, Node *n, Node *dy) {
  Dim at = dim_const(0);
  for (int i = 0; i < n->nin; i++) {
    Node *x = n->in[i];
    Dim hi = dim_add(at, x->shape.d[n->axis], n->loc);
    if (wants(a, x))
      acc(a, x, slice_(a, dy, n->axis, at, hi));
    at = hi;
  }
}

/* ---------------------------------------------------------------- rules: linear algebra */

/* matmul: with a' = a ([K] -> [1, K]) and b' = b ([K] -> [K, 1]) and dy'
 * the result with those dims back, da' = dy' b'^T, db' = a'^T dy', each
 * summed over the broadcast batch dims and reshaped to the operand. */
static void grad_matmul(AD *a, Node *n, Node *dy) {
  Node *x = n->in[0], *y = n->in[1];
  int a1 = x->shape.rank == 1, b1 = y->shape.rank == 1;
  Node *g = dy;
  if (b1)
    g = unsqueeze_(a, g, g->shape.rank);
  if (a1)
    g = unsqueeze_(a, g, g->shape.rank - 1);
  if (wants(a, x)) {
    Node *yp = b1 ? unsqueeze_(a, y, 1) : y;
    Shape sp = x->shape;
    if (a1) {
      sp.rank = 2;
      sp.d[1] = sp.d[0];
      sp.d[0] = dim_const(1);
    }
    Node *d = sum_to(a, op2(a, OP_MATMUL, g, transpose_(a, yp, -1, -2)), &sp);
    acc(a, x, reshape_(a, d, &x->shape));
  }
  if (wants(a, y)) {
    Node *xp = a1 ? unsqueeze_(a, x, 0) : x;
    Shape sp = y->shape;
    if (b1) {
      sp.rank = 2;
      sp.d[1] = dim_const(1);
    }
    Node *d = sum_to(a, op2(a, OP_MATMUL, transpose_(a, xp, -1, -2), g), &sp);
    acc(a, y, reshape_(a, d, &y->shape));
  }
}

/* linear(x, w, b) = x w^T + b: dx = dy w; dw = dy^T x over the rows (x's
 * leading dims flattened); db = dy summed over the rows. */
static void grad_linear(AD *a, Node *n, Node *dy) {
  Node *x = n->in[0], *w = n->in[1], *b = n->in[2];
  if (wants(a, x))
    acc(a, x, op2(a, OP_MATMUL, dy, w));
  if (wants(a, w)) {
    int r = x->shape.rank;
    Dim rows = dims_product(a, &x->shape, (1u << (r - 1)) - 1);
    Shape sd = {2, {rows, w->shape.d[0]}}, sx = {2, {rows, w->shape.d[1]}};
    Node *dt = transpose_(a, reshape_(a, dy, &sd), 0, 1);
    acc(a, w, op2(a, OP_MATMUL, dt, reshape_(a, x, &sx)));
  }
  if (wants(a, b))
    acc(a, b, sum_to(a, dy, &b->shape));
}

/* ---------------------------------------------------------------- rules: neural, losses */

/* embedding: the table's gradient is dy scattered back to the rows idx read. */
static void grad_embedding(AD *a, Node *n, Node *dy) {
  Node *idx = n->in[0], *t = n->in[1];
  if (!wants(a, t))
    return;
  Arg r[3] = {{0}};
  r[2].d = t->shape.d[0];
  Node *in[2] = {idx, dy};
  acc(a, t, mk(a, OP_EMBEDDING_BACKWARD, 2, in, r));
}

/* attention, as FlashAttention differentiates it: with the forward's row
 * log-sum-exp lse (attention_lse, computed beside it) and delta =
 * rowsum(dy * y) in f32, one attention_backward per operand that wants a
 * gradient (P = exp(S - lse); dv = P^T dy, dS = P (dy v^T - delta), dq =
 * scale dS k, dk = scale dS^T q), each summed to its operand's batch dims.
 * The runtime computes the wanted ones in one call without the T x T
 * matrix; the interpreter evaluates the formulas. */
static void grad_attention(AD *a, Node *n, Node *dy) {
  Node *q = n->in[0], *k = n->in[1], *v = n->in[2], *lse = a->lse[n->id];
  if (!lse || (!wants(a, q) && !wants(a, k) && !wants(a, v)))
    return;
  int last = 1 << (n->shape.rank - 1);
  Node *dyf = dy->dtype == DT_F32 ? dy : cast_(a, dy, DT_F32), *yf = n->dtype == DT_F32 ? n : cast_(a, n, DT_F32);
  Node *delta = reduce(a, OP_SUM, op2(a, OP_MUL, dyf, yf), last, 0, 0);
  delta->name = arena_printf(a->g->arena, "%s_delta", n->name ? n->name : "?");
  Node *in[6] = {q, k, v, dy, lse, delta};
  for (int w = 0; w < 3; w++) {
    if (!wants(a, in[w]))
      continue;
    Arg r[9] = {{0}};
    r[6].b = n->flag;
    r[7].is_none = !n->has_f[0];
    r[7].f = n->f[0];
    r[8].d = dim_const(w);
    Node *d = mk(a, OP_ATTENTION_BACKWARD, 6, in, r);
    d->name = arena_printf(a->g->arena, "d_%s", in[w]->name ? in[w]->name : "?");
    acc(a, in[w], sum_to(a, d, &in[w]->shape));
  }
}

/* dropout: dy times the forward's mask, regenerated by a dropout of ones with
 * the forward node's index (the mask key; see interp.c eval_dropout). */
static void grad_dropout(AD *a, Node *n, Node *dy) {
  Node *x = n->in[0];
  if (!wants(a, x))
    return;
  Arg r[2] = {{0}};
  r[1].f = n->f[0];
  Node *ones = full_(a, &x->shape, 1, x->dtype);
  Node *m = mk(a, OP_DROPOUT, 1, &ones, r);
  m->index = n->index;
  acc(a, x, op2(a, OP_MUL, dy, m));
}

/* cross_entropy (mean over the rows whose target is not ignore_index):
 * dlogits = (softmax(logits) - onehot(target)) where(valid, dy / count(valid), 0),
 * the one-hot as eq(unsqueeze(target), arange(C)); logits [N, C] or [C]; in
 * f32, rounded once (as the norms' backwards: f32_ above). As torch's: an
 * ignored row's gradient is selected away, not multiplied by 0, so a batch
 * whose targets are all ignored has a NaN loss (0/0) but zero gradients
 * (dy / 0 is inf, and inf * 0 would be NaN). */
static void grad_cross_entropy(AD *a, Node *n, Node *dy) {
  Node *lg = n->in[0], *t = n->in[1];
  if (!wants(a, lg))
    return;
  DType dt = lg->dtype;
  int r = lg->shape.rank;
  Node *p = softmax_(a, f32_(a, lg), r - 1);
  Node *onehot = mask(a, OP_EQ, unsqueeze_(a, t, t->shape.rank), arange_(a, lg->shape.d[r - 1]), DT_F32);
  Node *ok = op2(a, OP_NE, t, scalar(a, (double)n->ignore_index, DT_I32));
  Node *w = op2(a, OP_DIV, f32_(a, dy), reduce(a, OP_SUM, cast_(a, ok, DT_F32), ~0u, 0, 0));
  Node *rows = where_(a, unsqueeze_(a, ok, ok->shape.rank), w, scalar(a, 0, DT_F32));
  Node *dx = op2(a, OP_MUL, op2(a, OP_SUB, p, onehot), rows);
  acc(a, lg, dt == DT_F32 ? dx : cast_(a, dx, dt));
}

/* mse_loss = mean((a - b)^2): da = 2 (a - b) dy / numel, db = -da, each
 * summed to its operand's shape. */
static void grad_mse_loss(AD *a, Node *n, Node *dy) {
  Node *x = n->in[0], *y = n->in[1];
  if (!wants(a, x) && !wants(a, y))
    return;
  Node *d = op2(a, OP_SUB, x, y);
  Node *numel = size_node(a, dims_product(a, &d->shape, ~0u), d->dtype);
  Node *s = op2(a, OP_MUL, d, op2(a, OP_DIV, mulc(a, dy, 2), numel));
  if (wants(a, x))
    acc(a, x, sum_to(a, s, &x->shape));
  if (wants(a, y))
    acc(a, y, sum_to(a, op1(a, OP_NEG, s), &y->shape));
}

/* ---------------------------------------------------------------- driver */

typedef void (*GradRule)(AD *, Node *, Node *);
static const GradRule grad_rules[NUM_OPS] = {
#define OP(e, name, sig, rule, flags, grad, cls, ...) grad_##grad,
#include "ops.def"
#undef OP
};

/* needs[id] for the forward nodes: floating params and the train.wrt inputs,
 * and floating nodes that may carry a gradient with an operand that needs one. */
static void mark_needs(AD *a, int nforward) {
  Graph *g = a->g;
  for (int i = 0; i < nforward; i++) {
    Node *n = g->nodes[i];
    int need = 0;
    if (n->op == OP_PARAM)
      need = 1;
    else if (n->op == OP_INPUT)
      for (int j = 0; j < g->nwrt && !need; j++)
        need = g->wrt[j] == n->index;
    else if (!(op_info[n->op].flags & F_NO_GRAD))
      for (int k = 0; k < n->nin && !need; k++)
        need = n->in[k] && a->needs[n->in[k]->id];
    a->needs[i] = (char)(need && dtype_is_float(n->dtype));
  }
}

/* Moves the last node of g to just after node `at` (ids renumbered). */
static void move_after(Graph *g, const Node *at) {
  Node *n = g->nodes[g->nnodes - 1];
  for (int i = g->nnodes - 1; i > at->id + 1; i--) {
    g->nodes[i] = g->nodes[i - 1];
    g->nodes[i]->id = i;
  }
  g->nodes[at->id + 1] = n;
  n->id = at->id + 1;
}

/* Each attention a gradient flows through gets its attention_lse right
 * after it, in the forward graph: the backward reads it, the forward
 * computes it in the same runtime call as the output (gen/schedule.c). */
static void add_attention_lse(AD *a) {
  Graph *g = a->g;
  int n0 = g->nnodes;
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    if (n->op != OP_ATTENTION || !a->needs[i - (g->nnodes - n0)])
      continue;
    set_at(a, n);
    Arg r[5] = {{0}};
    r[3].b = n->flag;
    r[4].is_none = !n->has_f[0];
    r[4].f = n->f[0];
    Node *l = mk(a, OP_ATTENTION_LSE, 3, n->in, r);
    l->name = arena_printf(g->arena, "%s_lse", n->name ? n->name : "?");
    move_after(g, n);
    i++;
  }
  a->lse = arena_alloc(g->arena, sizeof(Node *) * (size_t)(g->nnodes + 1));
  for (int i = 0; i + 1 < g->nnodes; i++)
    if (g->nodes[i + 1]->op == OP_ATTENTION_LSE)
      a->lse[i] = g->nodes[i + 1];
}

int autodiff(Graph *g) {
  if (!g->loss)
    return -1;
  AD ad = {g, NULL, NULL, NULL, NULL, NULL}, *a = &ad;
  a->needs = arena_alloc(g->arena, (size_t)g->nnodes + 1);
  mark_needs(a, g->nnodes);
  add_attention_lse(a);
  g->nforward = g->nnodes;
  a->grad = arena_alloc(g->arena, sizeof(Node *) * (size_t)(g->nforward + 1));
  a->needs = arena_alloc(g->arena, (size_t)g->nforward + 1);
  mark_needs(a, g->nforward);
  if (a->needs[g->loss->id]) {
    set_at(a, g->loss);
    a->grad[g->loss->id] = scalar(a, 1, g->loss->dtype); /* d loss / d loss */
  }
  for (int i = g->loss->id; i >= 0; i--) {
    Node *n = g->nodes[i];
    if (!a->grad[i] || n->op == OP_PARAM || n->op == OP_INPUT)
      continue;
    set_at(a, n);
    grad_rules[n->op](a, n, a->grad[i]);
  }
  g->ngrads = g->nparams + g->nwrt;
  g->grads = arena_alloc(g->arena, sizeof(Node *) * (size_t)(g->ngrads + 1));
  for (int k = 0; k < g->ngrads; k++) {
    Node *p = k < g->nparams ? g->params[k].node : g->inputs[g->wrt[k - g->nparams]].node;
    set_at(a, p);
    g->grads[k] = a->grad[p->id] ? a->grad[p->id] : full_(a, &p->shape, 0, p->dtype);
  }
  return 0;
}
