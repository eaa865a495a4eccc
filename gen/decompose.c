/* decompose.c: a pass of the emitted code as a DAG of pass-local nodes, with
 * the composite ops rewritten into what the back end knows how to fuse:
 * pointwise ops (ops.def expressions), the primitive reductions sum and amax,
 * views, and the ops that stay library calls (GEMMs, attention, embedding,
 * dropout).
 *
 *   mean(x)         sum(x) / n
 *   var(x)          sum((x - mean(x))^2) / max(n - correction, 0)
 *   logsumexp(x)    log(sum(exp(x - s))) + s,  s = inf0(amax(x))
 *   softmax(x)      e / sum(e),  e = exp(x - amax(x))
 *   log_softmax(x)  z - log(sum(exp(z))),  z = x - amax(x)
 *   layer_norm(x)   d * rsqrt(sum(d^2) / D + eps) * w + b,  d = x - sum(x) / D
 *   rms_norm(x)     x * rsqrt(sum(x^2) / D + eps) * w
 *   cross_entropy   sum(where(t != ignore, lse - take(x, t), 0)) / sum(t != ignore)
 *                   (its gradient's softmax of the same logits reuses the
 *                   row max and sum: the backward reads each logit once)
 *   mse_loss(a, b)  sum((a - b)^2) / n
 *   embedding(arange(n), W)               W[0:n], a view (and its backward,
 *                                         dy and zero rows: no scatter)
 *
 * Statistics are computed in f32 whatever the model's dtype (as PyTorch's
 * decompositions upcast); the composite's result is cast back to its dtype.
 * Each copy keeps the graph node's binding name, scope and spec location, so
 * the kernels that compute it can name where they came from. */
#include "ir.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct D {
  BPass *p;
  Arena *a;
  Vec nodes, orig;   /* Node *, const Node * */
  const Node *src;   /* the graph node being copied */
  /* each cross_entropy's logits and its row max (f32, kept dims) and sum
   * of exp(x - max): the backward's softmax of the same logits reuses them */
  Node *ce_x[8], *ce_m[8], *ce_s[8];
  int ce_ax[8], nce;
} D;

static Node *nn(D *d, Op op, int nin, DType dt, const Shape *sh) {
  Node *n = arena_alloc(d->a, sizeof(Node));
  *n = *d->src;
  n->op = op;
  n->nin = nin;
  n->in = arena_alloc(d->a, sizeof(Node *) * (size_t)(nin ? nin : 1));
  n->dtype = dt;
  n->shape = *sh;
  n->id = d->nodes.n;
  vec_push(d->a, &d->nodes, n);
  vec_push(d->a, &d->orig, (void *)d->src);
  return n;
}

static Node *op1(D *d, Op op, Node *x) {
  Node *n = nn(d, op, 1, x->dtype, &x->shape);
  n->in[0] = x;
  return n;
}

static Node *op2(D *d, Op op, Node *x, Node *y) {
  Shape s;
  if (!broadcast_shapes(&x->shape, &y->shape, &s))
    die("decompose: %s of shapes that do not broadcast", op_info[op].name);
  Node *n = nn(d, op, 2, op_info[op].flags & F_BOOL_OUT ? DT_BOOL : x->dtype, &s);
  n->in[0] = x;
  n->in[1] = y;
  return n;
}

static Node *scalar(D *d, double v, DType dt) {
  Shape s = {0};
  Node *n = nn(d, OP_CONST, 0, dt, &s);
  n->f[0] = v;
  n->is_dimval = 0;
  return n;
}

/* The product of x's dims in `axes`, as an f32 scalar (a size known at run
 * time when it involves a dynamic dim). */
static Node *count(D *d, const Shape *x, uint32_t axes) {
  Dim c = dim_const(1);
  for (int k = 0; k < x->rank; k++)
    if (axes >> k & 1)
      c = dim_mul(c, x->d[k], d->src->loc);
  Shape s = {0};
  Node *n = nn(d, OP_CONST, 0, DT_F32, &s);
  n->is_dimval = 1;
  n->lo = c;
  return n;
}

static Node *cast(D *d, Node *x, DType dt) {
  if (x->dtype == dt)
    return x;
  Node *n = op1(d, OP_CAST, x);
  n->dtype = dt;
  return n;
}

/* A reduction (sum, amax) over `axes`; keepdim keeps them as size 1. */
static Node *reduce(D *d, Op op, Node *x, uint32_t axes, int keep) {
  Shape s = {0};
  for (int k = 0; k < x->shape.rank; k++)
    if (!(axes >> k & 1))
      s.d[s.rank++] = x->shape.d[k];
    else if (keep)
      s.d[s.rank++] = dim_const(1);
  Node *n = nn(d, op, 1, x->dtype, &s);
  n->in[0] = x;
  n->axes = axes;
  n->keepdim = keep;
  return n;
}

static Node *reshape(D *d, Node *x, const Shape *s) {
  if (shape_eq(&x->shape, s))
    return x;
  Node *n = nn(d, OP_RESHAPE, 1, x->dtype, s);
  n->in[0] = x;
  return n;
}

static uint32_t all_axes(const Node *x) { return x->shape.rank ? (1u << x->shape.rank) - 1 : 0; }

/* ---------------------------------------------------------------- rules */

/* Are a and b the same value: one node, or reshapes of the same shape of
 * one node (the backward may recompute a view)? */
static int same_value(const Node *a, const Node *b) {
  while (a != b && a->op == OP_RESHAPE && b->op == OP_RESHAPE && shape_eq(&a->shape, &b->shape))
    a = a->in[0], b = b->in[0];
  return a == b;
}

/* The decomposition of a composite node n whose operands (pass-local) are
 * in[]; returns the node holding its value. */
static Node *decompose(D *d, const Node *n, Node **in) {
  DType dt = n->dtype;
  Node *x = in[0];
  switch (n->op) {
  case OP_MEAN: {
    Node *xf = cast(d, x, DT_F32);
    return cast(d, op2(d, OP_DIV, reduce(d, OP_SUM, xf, n->axes, n->keepdim), count(d, &x->shape, n->axes)), dt);
  }
  case OP_VAR: {
    Node *xf = cast(d, x, DT_F32);
    Node *mu = op2(d, OP_DIV, reduce(d, OP_SUM, xf, n->axes, 1), count(d, &x->shape, n->axes));
    Node *dx = op2(d, OP_SUB, xf, mu);
    Node *div = op2(d, OP_SUB, count(d, &x->shape, n->axes), scalar(d, n->f[0], DT_F32));
    div = op2(d, OP_MAXIMUM, div, scalar(d, 0, DT_F32));
    return cast(d, op2(d, OP_DIV, reduce(d, OP_SUM, op1(d, OP_SQUARE, dx), n->axes, n->keepdim), div), dt);
  }
  case OP_LOGSUMEXP: {
    Node *xf = cast(d, x, DT_F32);
    Node *s = op1(d, OP_INF0, reduce(d, OP_AMAX, xf, n->axes, 1));
    Node *sum = reduce(d, OP_SUM, op1(d, OP_EXP, op2(d, OP_SUB, xf, s)), n->axes, n->keepdim);
    return cast(d, op2(d, OP_ADD, op1(d, OP_LOG, sum), reshape(d, s, &sum->shape)), dt);
  }
  case OP_SOFTMAX: case OP_LOG_SOFTMAX: {
    uint32_t ax = 1u << n->axis;
    Node *xf = cast(d, x, DT_F32);
    for (int i = 0; i < d->nce && n->op == OP_SOFTMAX; i++)
      if ((same_value(d->ce_x[i], x) || (x->op == OP_CAST && x->dtype == DT_F32 && same_value(d->ce_x[i], x->in[0]))) &&
          d->ce_ax[i] == n->axis) {
        /* cross_entropy's gradient: exp(x - lse) from its forward's row max m and sum s (lse = m + log s):
         * one subtraction and one exp a logit, no division */
        Shape ks = d->ce_m[i]->shape;
        Node *lse = op2(d, OP_ADD, d->ce_m[i], reshape(d, op1(d, OP_LOG, d->ce_s[i]), &ks));
        return cast(d, op1(d, OP_EXP, op2(d, OP_SUB, xf, lse)), dt);
      }
    Node *z = op2(d, OP_SUB, xf, reduce(d, OP_AMAX, xf, ax, 1));
    if (n->op == OP_SOFTMAX) {
      Node *e = op1(d, OP_EXP, z);
      return cast(d, op2(d, OP_DIV, e, reduce(d, OP_SUM, e, ax, 1)), dt);
    }
    return cast(d, op2(d, OP_SUB, z, op1(d, OP_LOG, reduce(d, OP_SUM, op1(d, OP_EXP, z), ax, 1))), dt);
  }
  case OP_LAYER_NORM: case OP_RMS_NORM: {
    uint32_t ax = 1u << (x->shape.rank - 1);
    Node *xf = cast(d, x, DT_F32), *dx = xf;
    if (n->op == OP_LAYER_NORM)
      dx = op2(d, OP_SUB, xf, op2(d, OP_DIV, reduce(d, OP_SUM, xf, ax, 1), count(d, &x->shape, ax)));
    Node *var = op2(d, OP_DIV, reduce(d, OP_SUM, op1(d, OP_SQUARE, dx), ax, 1), count(d, &x->shape, ax));
    Node *y = op2(d, OP_MUL, dx, op1(d, OP_RSQRT, op2(d, OP_ADD, var, scalar(d, n->f[0], DT_F32))));
    if (n->nin > 1 && in[1])
      y = op2(d, OP_MUL, y, cast(d, in[1], DT_F32));
    if (n->op == OP_LAYER_NORM && n->nin > 2 && in[2])
      y = op2(d, OP_ADD, y, cast(d, in[2], DT_F32));
    return cast(d, y, dt);
  }
  case OP_CROSS_ENTROPY: {
    int ax = x->shape.rank == 1 ? 0 : 1;
    Node *xf = cast(d, x, DT_F32), *t = in[1];
    Node *m = reduce(d, OP_AMAX, xf, 1u << ax, 1);
    Node *s = reduce(d, OP_SUM, op1(d, OP_EXP, op2(d, OP_SUB, xf, m)), 1u << ax, 0);
    if (d->nce < 8)
      d->ce_x[d->nce] = x, d->ce_m[d->nce] = m, d->ce_s[d->nce] = s, d->ce_ax[d->nce++] = ax;
    Node *lse = op2(d, OP_ADD, op1(d, OP_LOG, s), reshape(d, m, &s->shape));
    Node *picked = nn(d, OP_TAKE, 2, DT_F32, &s->shape);
    picked->in[0] = xf;
    picked->in[1] = reshape(d, t, &s->shape);
    picked->axis = ax;
    picked->ignore_index = n->ignore_index;
    Node *valid = op2(d, OP_NE, picked->in[1], scalar(d, (double)n->ignore_index, t->dtype));
    Node *diff = op2(d, OP_SUB, lse, picked), *zero = scalar(d, 0, DT_F32);
    Node *row = nn(d, OP_WHERE, 3, DT_F32, &s->shape);
    row->in[0] = valid;
    row->in[1] = diff;
    row->in[2] = zero;
    Node *total = reduce(d, OP_SUM, row, all_axes(row), 0);
    Node *cnt = reduce(d, OP_SUM, cast(d, valid, DT_F32), all_axes(valid), 0);
    return cast(d, op2(d, OP_DIV, total, cnt), dt);
  }
  case OP_MSE_LOSS: {
    Node *df = op2(d, OP_SUB, cast(d, x, DT_F32), cast(d, in[1], DT_F32));
    Node *s = reduce(d, OP_SUM, op1(d, OP_SQUARE, df), all_axes(df), 0);
    return cast(d, op2(d, OP_DIV, s, count(d, &df->shape, all_axes(df))), dt);
  }
  default:
    die("decompose: no rule for %s", op_info[n->op].name);
  }
}

/* The rows 0..n-1 of a table, read through an index arange(n) (GPT-2's
 * position embedding): embedding(arange(n), W) is the view W[0:n] and
 * embedding_backward(arange(n), dy, V) is dy with V - n zero rows after it
 * (no two positions meet a row). NULL when n is not an arange's index. */
static Node *arange_rows(D *d, const Node *x, Node **in) {
  const Node *idx = in[0];
  if ((x->op != OP_EMBEDDING && x->op != OP_EMBEDDING_BACKWARD) || idx->op != OP_ARANGE || idx->shape.rank != 1)
    return NULL;
  Node *t = in[1]; /* the table, or dy */
  const Dim *n = &idx->shape.d[0], *rows = &x->shape.d[0];
  if (dim_eq(n, &t->shape.d[0]) && dim_eq(n, rows))
    return t;
  Node *y;
  if (x->op == OP_EMBEDDING) {
    y = nn(d, OP_SLICE, 1, x->dtype, &x->shape);
    y->in[0] = t;
    y->axis = 0;
    y->lo = dim_const(0);
    y->hi = *n;
    return y;
  }
  int64_t v, m;
  if (!dim_is_const(rows, &v) || !dim_is_const(n, &m) || m >= v)
    return NULL;
  Shape zs = x->shape;
  zs.d[0] = dim_const(v - m);
  Node *z = nn(d, OP_FULL, 0, x->dtype, &zs);
  z->f[0] = 0;
  y = nn(d, OP_CONCAT, 2, x->dtype, &x->shape);
  y->in[0] = t;
  y->in[1] = z;
  y->axis = 0;
  return y;
}

/* A const's value where tgen knows it: a literal, or the size of dims that
 * are all static (1 with it, else 0). */
static int const_value(const Node *n, double *v) {
  int64_t c;
  if (!n->is_dimval)
    return *v = n->f[0], 1;
  if (!dim_is_const(&n->lo, &c))
    return 0;
  *v = (double)c;
  return 1;
}

/* Do a and b compute the same value: the same op, operands and the
 * attributes the op reads (a decomposition's nodes inherit the other fields
 * from the node they came from: a sum from var carries its correction)? A
 * static dim's size and a literal of that value are the same const (a
 * layer norm's backward divides by the literal 768 where its recomputed
 * forward divides by the dim D = 768: their row sums are then one). */
static int same_node(const Node *a, const Node *b) {
  if (a->op != b->op || a->dtype != b->dtype || a->nin != b->nin || !shape_eq(&a->shape, &b->shape))
    return 0;
  double va, vb;
  if (a->op == OP_CONST) /* (its other f are a decomposed node's, inherited) */
    return (a->is_dimval && b->is_dimval && dim_eq(&a->lo, &b->lo)) ||
           (const_value(a, &va) && const_value(b, &vb) && !memcmp(&va, &vb, sizeof va));
  for (int k = 0; k < a->nin; k++)
    if (a->in[k] != b->in[k])
      return 0;
  const OpInfo *o = &op_info[a->op];
  if (o->cls == C_REDUCE)
    return a->axes == b->axes && a->keepdim == b->keepdim;
  if (o->cls == C_PW) {
    if (strstr(o->expr, "P0") || strstr(o->expr, "P1"))
      if (memcmp(a->f, b->f, sizeof a->f) || memcmp(a->has_f, b->has_f, sizeof a->has_f))
        return 0;
    if (strstr(o->expr, "FLAG") && a->flag != b->flag)
      return 0;
    if (a->op == OP_CONST)
      return a->is_dimval == b->is_dimval && (!a->is_dimval || dim_eq(&a->lo, &b->lo));
    return a->op != OP_ARANGE || dim_eq(&a->lo, &b->lo);
  }
  return a->axis == b->axis && a->axis2 == b->axis2 && a->axes == b->axes && a->keepdim == b->keepdim &&
         a->flag == b->flag && a->ignore_index == b->ignore_index && a->is_dimval == b->is_dimval &&
         a->index == b->index && dim_eq(&a->lo, &b->lo) && dim_eq(&a->hi, &b->hi) && !memcmp(a->f, b->f, sizeof a->f) &&
         !memcmp(a->has_f, b->has_f, sizeof a->has_f) && !memcmp(a->perm, b->perm, sizeof(int) * (size_t)a->shape.rank);
}

/* The pass without repeats and dead nodes. Decompositions and the backward
 * repeat subexpressions (layer_norm's backward computes its input's row sum
 * three times): a node equal to an earlier one of the same part (forward or
 * backward: a recomputation the partitioner chose stays apart from the
 * value it did not save) is replaced by it; then the nodes no result needs
 * are dropped (but the leaves, which every pass names alike). */
static void dedupe(BPass *p) {
  int n = p->n, cap = 64;
  while (cap < 2 * n)
    cap *= 2;
  Node **rep = calloc((size_t)n + 1, sizeof(Node *)), **tab = calloc((size_t)cap, sizeof(Node *));
  char *live = calloc((size_t)n + 1, 1);
  if (!rep || !tab || !live)
    die("out of memory");
  for (int i = 0; i < n; i++) {
    Node *x = p->nodes[i];
    uint32_t h = 2166136261u ^ (uint32_t)x->op;
    for (int k = 0; k < x->nin; k++) {
      if (x->in[k] && rep[x->in[k]->id])
        x->in[k] = rep[x->in[k]->id];
      h = (h ^ (uint32_t)(x->in[k] ? x->in[k]->id + 1 : 0)) * 16777619u;
    }
    if (x->op == OP_INPUT || x->op == OP_PARAM || x->op == OP_DROPOUT)
      continue;
    h = (h ^ (uint32_t)x->shape.rank) * 16777619u; /* (only what same_node compares for every op) */
    for (int j = (int)(h & (uint32_t)(cap - 1));; j = (j + 1) & (cap - 1)) {
      Node *y = tab[j];
      if (!y) {
        tab[j] = x;
        break;
      }
      if ((y->id < p->nfwd) == (i < p->nfwd) && same_node(x, y)) {
        rep[i] = y;
        break;
      }
    }
  }
  for (int k = 0; k < p->nfinals; k++)
    if (rep[p->finals[k]->id])
      p->finals[k] = rep[p->finals[k]->id];
  for (int k = 0; k < p->nfinals; k++)
    live[p->finals[k]->id] = 1;
  for (int i = n - 1; i >= 0; i--) {
    Node *x = p->nodes[i];
    live[i] |= x->op == OP_INPUT || x->op == OP_PARAM;
    for (int k = 0; live[i] && !rep[i] && k < x->nin; k++)
      if (x->in[k])
        live[x->in[k]->id] = 1;
  }
  int m = 0, nfwd = 0;
  for (int i = 0; i < n; i++)
    if (live[i] && !rep[i]) {
      nfwd += i < p->nfwd;
      p->orig[m] = p->orig[i];
      p->nodes[m] = p->nodes[i];
      p->nodes[m]->id = m;
      m++;
    }
  p->n = m;
  p->nfwd = nfwd;
  free(rep);
  free(tab);
  free(live);
}

/* ---------------------------------------------------------------- the pass */

const char *const pass_names[NPASS] = {"forward", "loss", "train"};

BPass *build_pass(Graph *g, int kind, const int *order, int n, int nfwd) {
  D dd = {0}, *d = &dd;
  d->a = g->arena;
  BPass *p = arena_alloc(d->a, sizeof(BPass));
  p->g = g;
  p->kind = kind;
  p->training = kind == PASS_TRAIN;
  Node **map = arena_alloc(d->a, sizeof(Node *) * (size_t)(g->nnodes + 1));
  Node **in = arena_alloc(d->a, sizeof(Node *) * (size_t)(g->nnodes + 4));
  /* leaves first, so every pass names its inputs and params alike */
  for (int k = 0; k < g->ninputs; k++) {
    d->src = g->inputs[k].node;
    map[d->src->id] = nn(d, OP_INPUT, 0, d->src->dtype, &d->src->shape);
  }
  for (int k = 0; k < g->nparams; k++) {
    d->src = g->params[k].node;
    map[d->src->id] = nn(d, OP_PARAM, 0, d->src->dtype, &d->src->shape);
  }
  for (int i = 0; i < n; i++) {
    const Node *x = g->nodes[order[i]];
    if (i == nfwd)
      p->nfwd = d->nodes.n;
    if (x->op == OP_INPUT || x->op == OP_PARAM)
      continue;
    d->src = x;
    for (int k = 0; k < x->nin; k++)
      in[k] = x->in[k] ? map[x->in[k]->id] : NULL;
    Node *y;
    if ((x->op == OP_DROPOUT && !p->training) || (x->op == OP_CAST && x->dtype == x->in[0]->dtype))
      y = in[0]; /* the identity */
    else if ((y = arange_rows(d, x, in)))
      ;
    else if (op_info[x->op].cls == C_COMPOSITE)
      y = decompose(d, x, in);
    else {
      y = nn(d, x->op, x->nin, x->dtype, &x->shape);
      for (int k = 0; k < x->nin; k++)
        y->in[k] = in[k];
    }
    map[x->id] = y; /* a recomputed node's later copy replaces its forward one */
  }
  if (nfwd >= n)
    p->nfwd = d->nodes.n;
  p->nodes = (Node **)d->nodes.p;
  p->n = d->nodes.n;
  p->orig = (const Node **)d->orig.p;
  if (kind == PASS_FORWARD) {
    p->nfinals = g->noutputs;
    p->finals = arena_alloc(d->a, sizeof(Node *) * (size_t)(g->noutputs + 1));
    for (int k = 0; k < g->noutputs; k++)
      p->finals[k] = map[g->outputs[k]->id];
  } else {
    int ng = kind == PASS_TRAIN ? g->ngrads : 0;
    p->nfinals = 1 + ng;
    p->finals = arena_alloc(d->a, sizeof(Node *) * (size_t)(ng + 1));
    p->finals[0] = map[g->loss->id];
    for (int k = 0; k < ng; k++)
      p->finals[1 + k] = map[g->grads[k]->id];
  }
  for (int k = 0; k < g->nsyms; k++)
    p->sym[k] = g->syms[k].derived ? 0 : g->syms[k].max;
  dedupe(p);
  return p;
}
