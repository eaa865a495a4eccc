/* infer.c: shape and dtype rules, one per `rule` column of ops.def. Each rule
 * checks its arguments (ranks, sizes, dtypes, ranges), normalises them into the
 * node's fields, and sets the node's shape and dtype. Messages name the op, the
 * argument and the shapes involved; build.c prefixes the binding. */
#include "ir.h"

#include <stdio.h>
#include <string.h>

typedef struct {
  Graph *g;
  Node *n;
  Arg *a;
  const char *w;   /* "in 'h': " */
  const char *op;  /* op name */
} R;

#define ERR(loc, ...) rerr(r, loc, __VA_ARGS__)

__attribute__((format(printf, 3, 4))) static _Noreturn void rerr(R *r, Loc loc, const char *fmt, ...) {
  char tmp[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  error_at(loc.line ? loc : r->n->loc, "%s%s: %s", r->w, r->op, tmp);
}

const char *shape_str(const Graph *g, const Shape *s) {
  Buf b;
  buf_init(&b, g->arena);
  buf_printf(&b, "[");
  for (int i = 0; i < s->rank; i++)
    buf_printf(&b, "%s%s", i ? ", " : "", dim_str(g, &s->d[i]));
  buf_printf(&b, "]");
  return b.p;
}

int shape_eq(const Shape *a, const Shape *b) {
  if (a->rank != b->rank)
    return 0;
  for (int i = 0; i < a->rank; i++)
    if (!dim_eq(&a->d[i], &b->d[i]))
      return 0;
  return 1;
}

int broadcast_shapes(const Shape *a, const Shape *b, Shape *out) {
  int rank = a->rank > b->rank ? a->rank : b->rank;
  Shape s = {0};
  s.rank = rank;
  for (int i = 0; i < rank; i++) {
    int ia = a->rank - rank + i, ib = b->rank - rank + i;
    const Dim *da = ia >= 0 ? &a->d[ia] : NULL, *db = ib >= 0 ? &b->d[ib] : NULL;
    if (!da || (dim_is_one(da) && db))
      s.d[i] = *db;
    else if (!db || dim_is_one(db) || dim_eq(da, db))
      s.d[i] = *da;
    else
      return 0;
  }
  *out = s;
  return 1;
}

/* ---------------------------------------------------------------- helpers */

static const char *shp(R *r, const Node *x) { return shape_str(r->g, &x->shape); }
/* How messages name argument k: its parameter name, or for operators the operand's text. */
static const char *lab(R *r, int k) { return r->a[k].label ? r->a[k].label : op_param_name(r->n->op, k); }
static const char *dstr(R *r, const Dim *d) { return dim_str(r->g, d); }

static void need_float(R *r, const Node *x, const char *arg, Loc l) {
  if (!dtype_is_float(x->dtype))
    ERR(l, "%s must be floating (f32, bf16, f16), found %s", arg, dtype_names[x->dtype]);
}

static void same_dtype(R *r, const Node *a, const char *an, const Node *b, const char *bn, Loc l) {
  if (a->dtype != b->dtype)
    ERR(l, "dtype mismatch: %s is %s but %s is %s (convert one with cast(%s, %s))", an, dtype_names[a->dtype], bn,
        dtype_names[b->dtype], bn, dtype_names[a->dtype]);
}

static int64_t const_arg(R *r, int k, const char *what) {
  int64_t v;
  if (!dim_is_const(&r->a[k].d, &v))
    ERR(r->a[k].loc, "%s must be a constant, found %s", what, dstr(r, &r->a[k].d));
  return v;
}

/* A dim index in [-rank, rank), returned non-negative. */
static int axis_of(R *r, int64_t v, int rank, Loc l, const Node *x) {
  if (v < -rank || v >= rank)
    ERR(l, "dim %lld is out of range for %s of rank %d (shape %s)", (long long)v, x ? "a tensor" : "the result", rank,
        x ? shp(r, x) : "?");
  return (int)(v < 0 ? v + rank : v);
}

static int axis_arg(R *r, int k, const Node *x) {
  return axis_of(r, const_arg(r, k, "dim"), x->shape.rank, r->a[k].loc, x);
}

/* ---------------------------------------------------------------- rules */

static void infer_leaf(R *r) { (void)r; }

static void infer_unary(R *r) {
  Node *x = r->n->in[0];
  r->n->shape = x->shape;
  r->n->dtype = x->dtype;
}

static void infer_gelu(R *r) {
  const char *s = r->a[1].s;
  if (strcmp(s, "none") && strcmp(s, "tanh"))
    ERR(r->a[1].loc, "approximate must be 'none' or 'tanh', found '%s'", s);
  r->n->flag = !strcmp(s, "tanh");
  infer_unary(r);
}

static void infer_binary(R *r) {
  Node *a = r->n->in[0], *b = r->n->in[1];
  same_dtype(r, a, lab(r, 0), b, lab(r, 1), r->a[1].loc);
  if (!broadcast_shapes(&a->shape, &b->shape, &r->n->shape))
    ERR(r->a[1].loc, "shapes %s (%s) and %s (%s) do not broadcast (trailing dims must match or be 1)", shp(r, a),
        lab(r, 0), shp(r, b), lab(r, 1));
  r->n->dtype = op_info[r->n->op].flags & F_BOOL_OUT ? DT_BOOL : a->dtype;
}

static void infer_pow(R *r) {
  r->n->f[0] = r->a[1].f;
  infer_unary(r);
}

static void infer_where(R *r) {
  Node *c = r->n->in[0], *a = r->n->in[1], *b = r->n->in[2];
  if (c->dtype != DT_BOOL)
    ERR(r->a[0].loc, "cond must be bool (a comparison such as gt(x, 0)), found %s", dtype_names[c->dtype]);
  same_dtype(r, a, lab(r, 1), b, lab(r, 2), r->a[2].loc);
  Shape s;
  if (!broadcast_shapes(&a->shape, &b->shape, &s))
    ERR(r->a[2].loc, "shapes %s (%s) and %s (%s) do not broadcast", shp(r, a), lab(r, 1), shp(r, b), lab(r, 2));
  if (!broadcast_shapes(&c->shape, &s, &r->n->shape))
    ERR(r->a[0].loc, "cond's shape %s does not broadcast with %s", shp(r, c), shape_str(r->g, &s));
  r->n->dtype = a->dtype;
}

static void infer_clamp(R *r) {
  if (r->a[1].is_none && r->a[2].is_none)
    ERR(r->n->loc, "give at least one of min and max");
  for (int k = 0; k < 2; k++) {
    r->n->has_f[k] = !r->a[k + 1].is_none;
    r->n->f[k] = r->a[k + 1].f;
  }
  infer_unary(r);
}

static void infer_reduce(R *r) {
  Node *n = r->n, *x = n->in[0];
  int rank = x->shape.rank;
  Arg *d = &r->a[1];
  uint32_t axes = 0;
  if (d->is_none) {
    axes = rank ? (uint32_t)((1u << rank) - 1) : 0;
  } else {
    if (d->is_list && d->nlist == 0)
      ERR(d->loc, "dim is an empty list; leave it out (or none) to reduce over all dims");
    for (int i = 0; i < d->nlist; i++) {
      int64_t v;
      dim_is_const(&d->list[i], &v);
      if (rank == 0 && (v == 0 || v == -1))
        continue;
      int ax = axis_of(r, v, rank, d->loc, x);
      if (axes & (1u << ax))
        ERR(d->loc, "dim %d appears twice", ax);
      axes |= 1u << ax;
    }
  }
  n->axes = axes;
  n->keepdim = r->a[2].b;
  if (n->op == OP_VAR)
    n->f[0] = r->a[3].f;
  Shape s = {0};
  for (int i = 0; i < rank; i++) {
    if (!(axes & (1u << i)))
      s.d[s.rank++] = x->shape.d[i];
    else if (n->keepdim)
      s.d[s.rank++] = dim_const(1);
  }
  n->shape = s;
  n->dtype = x->dtype;
}

static void infer_softmax(R *r) {
  Node *x = r->n->in[0];
  if (x->shape.rank == 0)
    ERR(r->a[0].loc, "x is a scalar; %s needs at least one dim", r->op);
  r->n->axis = axis_arg(r, 1, x);
  infer_unary(r);
}

/* layer_norm(x, weight, bias, eps) and rms_norm(x, weight, eps), over the last dim. */
static void infer_norm(R *r) {
  Node *n = r->n, *x = n->in[0];
  if (x->shape.rank == 0)
    ERR(r->a[0].loc, "x is a scalar; %s normalises over the last dim", r->op);
  const Dim *D = &x->shape.d[x->shape.rank - 1];
  static const char *const names[] = {"x", "weight", "bias"};
  for (int k = 1; k < n->nin; k++) {
    Node *p = n->in[k];
    if (!p)
      continue;
    same_dtype(r, x, "x", p, names[k], r->a[k].loc);
    if (p->shape.rank != 1 || !dim_eq(&p->shape.d[0], D))
      ERR(r->a[k].loc, "%s has shape %s but x's last dim is %s (x: %s); %s must be [%s]", names[k], shp(r, p),
          dstr(r, D), shp(r, x), names[k], dstr(r, D));
  }
  double eps = r->a[n->op == OP_LAYER_NORM ? 3 : 2].f;
  if (eps < 0)
    ERR(r->a[n->op == OP_LAYER_NORM ? 3 : 2].loc, "eps must be >= 0, found %g", eps);
  n->f[0] = eps;
  infer_unary(r);
}

static Dim numel_of(R *r, const Shape *s, Loc l) {
  Dim p = dim_const(1);
  for (int i = 0; i < s->rank; i++)
    p = dim_mul(p, s->d[i], l);
  (void)r;
  return p;
}

static void infer_reshape(R *r) {
  Node *n = r->n, *x = n->in[0];
  Arg *a = &r->a[1];
  Shape s = {0};
  s.rank = a->nlist;
  int infer_at = -1;
  for (int i = 0; i < a->nlist; i++) {
    int64_t v;
    if (dim_is_const(&a->list[i], &v) && v == -1) {
      if (infer_at >= 0)
        ERR(a->loc, "only one size may be -1 (inferred)");
      infer_at = i;
      continue;
    }
    int64_t lo, hi;
    if (!dim_bounds(r->g, &a->list[i], &lo, &hi) || lo < 1)
      ERR(a->locs ? a->locs[i] : a->loc, "dim %d of the target shape is %s; sizes must be >= 1", i,
          dstr(r, &a->list[i]));
    s.d[i] = a->list[i];
  }
  Dim in = numel_of(r, &x->shape, a->loc);
  if (infer_at >= 0) {
    Shape rest = s;
    rest.d[infer_at] = dim_const(1);
    Dim known = numel_of(r, &rest, a->loc);
    int64_t iv, kv;
    if (dim_is_const(&in, &iv) && dim_is_const(&known, &kv) && iv % kv)
      ERR(a->loc, "cannot infer the -1 size: %lld elements of x (shape %s) do not divide by %lld", (long long)iv,
          shp(r, x), (long long)kv);
    s.d[infer_at] = dim_div(r->g, in, known, a->loc);
  }
  Dim out = numel_of(r, &s, a->loc);
  if (!dim_eq(&in, &out))
    ERR(a->loc, "cannot reshape x of shape %s (%s elements) into %s (%s elements)", shp(r, x), dstr(r, &in),
        shape_str(r->g, &s), dstr(r, &out));
  n->shape = s;
  n->dtype = x->dtype;
}

static void infer_transpose(R *r) {
  Node *n = r->n, *x = n->in[0];
  if (x->shape.rank == 0)
    ERR(r->a[0].loc, "x is a scalar");
  n->axis = axis_arg(r, 1, x);
  n->axis2 = axis_arg(r, 2, x);
  n->shape = x->shape;
  n->shape.d[n->axis] = x->shape.d[n->axis2];
  n->shape.d[n->axis2] = x->shape.d[n->axis];
  n->dtype = x->dtype;
}

static void infer_permute(R *r) {
  Node *n = r->n, *x = n->in[0];
  Arg *a = &r->a[1];
  int rank = x->shape.rank;
  if (a->nlist != rank)
    ERR(a->loc, "dims has %d entries but x has rank %d (shape %s)", a->nlist, rank, shp(r, x));
  uint32_t seen = 0;
  n->shape.rank = rank;
  for (int i = 0; i < rank; i++) {
    int64_t v;
    dim_is_const(&a->list[i], &v);
    int ax = axis_of(r, v, rank, a->loc, x);
    if (seen & (1u << ax))
      ERR(a->loc, "dims is not a permutation: %d appears twice", ax);
    seen |= 1u << ax;
    n->perm[i] = ax;
    n->shape.d[i] = x->shape.d[ax];
  }
  n->dtype = x->dtype;
}

static void infer_split(R *r) { die("split is expanded by the builder (%s)", r->op); }

static void infer_concat(R *r) {
  Node *n = r->n, *x = n->in[0];
  int rank = x->shape.rank;
  if (rank == 0)
    ERR(r->a[0].loc, "tensors must have at least one dim; tensor 0 is a scalar");
  int ax = axis_of(r, const_arg(r, 1, "dim"), rank, r->a[1].loc, x);
  Shape s = x->shape;
  for (int i = 1; i < n->nin; i++) {
    Node *y = n->in[i];
    Loc yl = r->a[0].locs ? r->a[0].locs[i] : r->a[0].loc;
    if (y->dtype != x->dtype)
      ERR(yl, "dtype mismatch: tensor 0 is %s but tensor %d is %s", dtype_names[x->dtype], i,
          dtype_names[y->dtype]);
    if (y->shape.rank != rank)
      ERR(yl, "tensor %d has rank %d (shape %s) but tensor 0 has rank %d (shape %s)", i, y->shape.rank,
          shp(r, y), rank, shp(r, x));
    for (int k = 0; k < rank; k++)
      if (k != ax && !dim_eq(&y->shape.d[k], &x->shape.d[k]))
        ERR(yl, "tensor %d has shape %s but tensor 0 has %s; they must match except in dim %d", i, shp(r, y),
            shp(r, x), ax);
    s.d[ax] = dim_add(s.d[ax], y->shape.d[ax], yl);
  }
  n->axis = ax;
  n->shape = s;
  n->dtype = x->dtype;
}

static void infer_slice(R *r) {
  Node *n = r->n, *x = n->in[0];
  if (x->shape.rank == 0)
    ERR(r->a[0].loc, "x is a scalar");
  int ax = axis_arg(r, 1, x);
  Dim size = x->shape.d[ax], b[2];
  for (int k = 0; k < 2; k++) {
    b[k] = r->a[2 + k].d;
    int64_t v;
    if (dim_is_const(&b[k], &v) && v < 0) /* negative counts from the end */
      b[k] = dim_add(size, b[k], r->a[2 + k].loc);
  }
  Dim len = dim_sub(b[1], b[0], r->a[3].loc), after = dim_sub(size, b[1], r->a[3].loc);
  int64_t lo, hi, slo, shi, alo, ahi;
  if (!dim_bounds(r->g, &b[0], &slo, &shi) || !dim_bounds(r->g, &len, &lo, &hi) ||
      !dim_bounds(r->g, &after, &alo, &ahi))
    ERR(r->a[2].loc, "slice bounds overflow");
  if (slo < 0 || lo < 1 || alo < 0)
    ERR(r->a[alo < 0 ? 3 : 2].loc, "[%s, %s) is not a non-empty range inside dim %d of size %s (x: %s)", dstr(r, &r->a[2].d),
        dstr(r, &r->a[3].d), ax, dstr(r, &size), shp(r, x));
  n->axis = ax;
  n->lo = b[0];
  n->hi = b[1];
  n->shape = x->shape;
  n->shape.d[ax] = len;
  n->dtype = x->dtype;
}

static void infer_unsqueeze(R *r) {
  Node *n = r->n, *x = n->in[0];
  int rank = x->shape.rank;
  if (rank == MAXRANK)
    ERR(r->a[0].loc, "the result would have rank %d; the limit is %d", rank + 1, MAXRANK);
  int64_t v = const_arg(r, 1, "dim");
  if (v < -(rank + 1) || v > rank)
    ERR(r->a[1].loc, "dim %lld is out of range [%d, %d] for x of rank %d (shape %s)", (long long)v, -(rank + 1), rank,
        rank, shp(r, x));
  int ax = (int)(v < 0 ? v + rank + 1 : v);
  n->axis = ax;
  n->shape.rank = rank + 1;
  for (int i = 0, j = 0; i <= rank; i++)
    n->shape.d[i] = i == ax ? dim_const(1) : x->shape.d[j++];
  n->dtype = x->dtype;
}

static void infer_squeeze(R *r) {
  Node *n = r->n, *x = n->in[0];
  if (x->shape.rank == 0)
    ERR(r->a[0].loc, "x is a scalar");
  int ax = axis_arg(r, 1, x);
  if (!dim_is_one(&x->shape.d[ax]))
    ERR(r->a[1].loc, "dim %d of x has size %s, not 1 (x: %s)", ax, dstr(r, &x->shape.d[ax]), shp(r, x));
  n->axis = ax;
  n->shape.rank = x->shape.rank - 1;
  for (int i = 0, j = 0; i < x->shape.rank; i++)
    if (i != ax)
      n->shape.d[j++] = x->shape.d[i];
  n->dtype = x->dtype;
}

static void infer_broadcast_to(R *r) {
  Node *n = r->n, *x = n->in[0];
  Arg *a = &r->a[1];
  Shape t = {0}, s;
  t.rank = a->nlist;
  for (int i = 0; i < a->nlist; i++)
    t.d[i] = a->list[i];
  if (t.rank < x->shape.rank || !broadcast_shapes(&x->shape, &t, &s) || !shape_eq(&s, &t))
    ERR(a->loc, "x of shape %s cannot be broadcast to %s", shp(r, x), shape_str(r->g, &t));
  n->shape = t;
  n->dtype = x->dtype;
}

/* torch.matmul: 1-D operands are promoted and the added dim removed; batch
 * dims broadcast. */
static void infer_matmul(R *r) {
  Node *n = r->n, *a = n->in[0], *b = n->in[1];
  same_dtype(r, a, lab(r, 0), b, lab(r, 1), r->a[1].loc);
  if (a->shape.rank == 0 || b->shape.rank == 0)
    ERR(r->a[a->shape.rank == 0 ? 0 : 1].loc, "operands must have at least one dim (%s: %s, %s: %s)", lab(r, 0),
        shp(r, a), lab(r, 1), shp(r, b));
  Shape sa = a->shape, sb = b->shape;
  int a1 = sa.rank == 1, b1 = sb.rank == 1;
  if (a1) {
    sa.rank = 2;
    sa.d[1] = sa.d[0];
    sa.d[0] = dim_const(1);
  }
  if (b1) {
    sb.rank = 2;
    sb.d[1] = dim_const(1);
  }
  const Dim *ka = &sa.d[sa.rank - 1], *kb = &sb.d[sb.rank - 2];
  if (!dim_eq(ka, kb))
    ERR(r->a[1].loc, "inner dims differ: %s is %s and %s is %s (%s vs %s)", lab(r, 0), shp(r, a), lab(r, 1), shp(r, b),
        dstr(r, ka), dstr(r, kb));
  Shape ba = sa, bb = sb, bs;
  ba.rank -= 2;
  bb.rank -= 2;
  if (!broadcast_shapes(&ba, &bb, &bs))
    ERR(r->a[1].loc, "batch dims of %s %s and %s %s do not broadcast", lab(r, 0), shp(r, a), lab(r, 1), shp(r, b));
  if (bs.rank + 2 > MAXRANK)
    ERR(r->a[1].loc, "the result's rank exceeds %d", MAXRANK);
  Shape s = bs;
  if (!a1)
    s.d[s.rank++] = sa.d[sa.rank - 2];
  if (!b1)
    s.d[s.rank++] = sb.d[sb.rank - 1];
  n->shape = s;
  n->dtype = a->dtype;
}

static void infer_linear(R *r) {
  Node *n = r->n, *x = n->in[0], *w = n->in[1], *b = n->in[2];
  if (w->shape.rank != 2)
    ERR(r->a[1].loc, "w must be 2-D [out_features, in_features], found %s", shp(r, w));
  if (x->shape.rank == 0)
    ERR(r->a[0].loc, "x is a scalar; it needs a features dim");
  same_dtype(r, x, "x", w, "w", r->a[1].loc);
  const Dim *in = &x->shape.d[x->shape.rank - 1];
  if (!dim_eq(in, &w->shape.d[1]))
    ERR(r->a[0].loc, "x has %s features but w expects %s (w: %s)", dstr(r, in), dstr(r, &w->shape.d[1]), shp(r, w));
  if (b) {
    same_dtype(r, x, "x", b, "b", r->a[2].loc);
    if (b->shape.rank != 1 || !dim_eq(&b->shape.d[0], &w->shape.d[0]))
      ERR(r->a[2].loc, "b has shape %s but w has %s outputs; b must be [%s]", shp(r, b), dstr(r, &w->shape.d[0]),
          dstr(r, &w->shape.d[0]));
  }
  n->shape = x->shape;
  n->shape.d[n->shape.rank - 1] = w->shape.d[0];
  n->dtype = x->dtype;
}

static void infer_embedding(R *r) {
  Node *n = r->n, *idx = n->in[0], *t = n->in[1];
  if (idx->dtype != DT_I32)
    ERR(r->a[0].loc, "idx must be i32 indices, found %s", dtype_names[idx->dtype]);
  if (t->shape.rank != 2)
    ERR(r->a[1].loc, "table must be 2-D [num_embeddings, dim], found %s", shp(r, t));
  need_float(r, t, "table", r->a[1].loc);
  if (idx->shape.rank + 1 > MAXRANK)
    ERR(r->a[0].loc, "the result's rank exceeds %d", MAXRANK);
  n->shape = idx->shape;
  n->shape.d[n->shape.rank++] = t->shape.d[1];
  n->dtype = t->dtype;
}

/* embedding_backward(idx, dy, num_embeddings): made by autodiff only, so a
 * mismatch is a bug; the result is [num_embeddings, D] in dy's dtype. */
static void infer_embedding_backward(R *r) {
  Node *n = r->n, *idx = n->in[0], *dy = n->in[1];
  int k = idx->shape.rank;
  if (idx->dtype != DT_I32 || dy->shape.rank != k + 1)
    die("embedding_backward: idx %s %s, dy %s", dtype_names[idx->dtype], shp(r, idx), shp(r, dy));
  for (int i = 0; i < k; i++)
    if (!dim_eq(&idx->shape.d[i], &dy->shape.d[i]))
      die("embedding_backward: idx %s does not lead dy %s", shp(r, idx), shp(r, dy));
  n->lo = r->a[2].d;
  n->shape.rank = 2;
  n->shape.d[0] = r->a[2].d;
  n->shape.d[1] = dy->shape.d[k];
  n->dtype = dy->dtype;
}

static void infer_attention(R *r) {
  Node *n = r->n, *q = n->in[0], *k = n->in[1], *v = n->in[2];
  static const char *const names[] = {"q", "k", "v"};
  for (int i = 0; i < 3; i++)
    if (n->in[i]->shape.rank < 2)
      ERR(r->a[i].loc, "%s must be [..., T, D], found %s", names[i], shp(r, n->in[i]));
  same_dtype(r, q, "q", k, "k", r->a[1].loc);
  same_dtype(r, q, "q", v, "v", r->a[2].loc);
  int rq = q->shape.rank, rk = k->shape.rank, rv = v->shape.rank;
  if (!dim_eq(&q->shape.d[rq - 1], &k->shape.d[rk - 1]))
    ERR(r->a[1].loc, "q and k must have the same head size: q is %s, k is %s", shp(r, q), shp(r, k));
  if (!dim_eq(&k->shape.d[rk - 2], &v->shape.d[rv - 2]))
    ERR(r->a[2].loc, "k and v must have the same sequence length: k is %s, v is %s", shp(r, k), shp(r, v));
  Shape bq = q->shape, bk = k->shape, bv = v->shape, b1, b2;
  bq.rank -= 2, bk.rank -= 2, bv.rank -= 2;
  if (!broadcast_shapes(&bq, &bk, &b1) || !broadcast_shapes(&b1, &bv, &b2))
    ERR(r->a[1].loc, "batch dims of q %s, k %s and v %s do not broadcast", shp(r, q), shp(r, k), shp(r, v));
  n->flag = r->a[3].b;
  n->has_f[0] = !r->a[4].is_none;
  n->f[0] = r->a[4].f;
  n->shape = b2;
  n->shape.d[n->shape.rank++] = q->shape.d[rq - 2];
  n->shape.d[n->shape.rank++] = v->shape.d[rv - 1];
  n->dtype = q->dtype;
}

/* attention_lse(q, k, v, causal, scale): made by autodiff from a checked
 * attention, so only the result changes: f32 [batch..., Tq]. */
static void infer_attention_lse(R *r) {
  infer_attention(r);
  r->n->shape.rank--;
  r->n->dtype = DT_F32;
}

/* attention_backward(q, k, v, dy, lse, delta, causal, scale, which): made by
 * autodiff, so a mismatch is a bug; the gradient of operand `which` over the
 * forward result's batch dims, in q's dtype. */
static void infer_attention_backward(R *r) {
  Node *n = r->n, *y = n->in[3];
  int64_t w;
  infer_attention(r);
  if (!shape_eq(&n->shape, &y->shape) || n->in[4]->dtype != DT_F32 || n->in[5]->dtype != DT_F32 ||
      !dim_is_const(&r->a[8].d, &w) || w < 0 || w > 2)
    die("attention_backward: dy %s does not match the attention", shp(r, y));
  const Node *x = n->in[w];
  n->flag = r->a[6].b; /* infer_attention read them from attention's positions */
  n->has_f[0] = !r->a[7].is_none;
  n->f[0] = r->a[7].f;
  n->axis = (int)w;
  n->shape.d[n->shape.rank - 2] = x->shape.d[x->shape.rank - 2];
  n->shape.d[n->shape.rank - 1] = x->shape.d[x->shape.rank - 1];
}

static void infer_dropout(R *r) {
  double p = r->a[1].f;
  if (p < 0 || p > 1)
    ERR(r->a[1].loc, "p must be in [0, 1], found %g", p);
  r->n->f[0] = p;
  infer_unary(r);
}

static void infer_cross_entropy(R *r) {
  Node *n = r->n, *lg = n->in[0], *t = n->in[1];
  need_float(r, lg, "logits", r->a[0].loc);
  if (t->dtype != DT_I32)
    ERR(r->a[1].loc, "target must be i32 class indices, found %s", dtype_names[t->dtype]);
  if (lg->shape.rank != 2 && lg->shape.rank != 1)
    ERR(r->a[0].loc, "logits must be [N, C] (or [C]), found %s; reshape it first, e.g. reshape(logits, [B*T, V])",
        shp(r, lg));
  if (t->shape.rank != lg->shape.rank - 1 || (t->shape.rank == 1 && !dim_eq(&t->shape.d[0], &lg->shape.d[0])))
    ERR(r->a[1].loc, "target has shape %s but logits %s need target [%s]", shp(r, t), shp(r, lg),
        lg->shape.rank == 2 ? dstr(r, &lg->shape.d[0]) : "");
  n->ignore_index = const_arg(r, 2, "ignore_index");
  n->shape.rank = 0;
  n->dtype = lg->dtype;
}

static void infer_mse_loss(R *r) {
  Node *n = r->n, *a = n->in[0], *b = n->in[1];
  same_dtype(r, a, lab(r, 0), b, lab(r, 1), r->a[1].loc);
  Shape s;
  if (!broadcast_shapes(&a->shape, &b->shape, &s))
    ERR(r->a[1].loc, "shapes %s (%s) and %s (%s) do not broadcast", shp(r, a), lab(r, 0), shp(r, b), lab(r, 1));
  n->shape.rank = 0;
  n->dtype = a->dtype;
}

static void infer_arange(R *r) {
  Node *n = r->n;
  n->lo = r->a[0].d;
  n->shape.rank = 1;
  n->shape.d[0] = r->a[0].d;
  n->dtype = DT_I32;
}

/* full(shape, value, dtype), zeros(shape, dtype), ones(shape, dtype); the
 * builder turns zeros and ones into full after this rule. */
static void infer_full(R *r) {
  Node *n = r->n;
  Arg *s = &r->a[0], *dt = &r->a[n->op == OP_FULL ? 2 : 1];
  n->shape.rank = s->nlist;
  for (int i = 0; i < s->nlist; i++) {
    int64_t lo, hi;
    if (!dim_bounds(r->g, &s->list[i], &lo, &hi) || lo < 1)
      ERR(s->locs ? s->locs[i] : s->loc, "dim %d is %s; sizes must be >= 1", i, dstr(r, &s->list[i]));
    n->shape.d[i] = s->list[i];
  }
  n->f[0] = n->op == OP_FULL ? r->a[1].f : n->op == OP_ONES;
  n->dtype = dt->is_none ? r->g->spec->dtype : dt->dt;
  if (n->dtype == DT_I32 && n->f[0] != (double)(int64_t)n->f[0])
    ERR(r->a[1].loc, "value %g is not an integer, but dtype is i32", n->f[0]);
  if (n->dtype == DT_BOOL && n->f[0] != 0 && n->f[0] != 1)
    ERR(r->a[1].loc, "value %g is not 0 or 1, but dtype is bool", n->f[0]);
}

static void infer_cast(R *r) {
  r->n->shape = r->n->in[0]->shape;
  r->n->dtype = r->a[1].dt;
}

/* take, inf0: made by gen/decompose.c with their shapes set; never inferred. */
static void infer_none(R *r) { die("%s: no shape rule (made by decompose only)", r->op); }

/* ---------------------------------------------------------------- dispatch */

typedef void (*Rule)(R *);
static const Rule rules[NUM_OPS] = {
#define OP(e, name, sig, rule, flags, grad, cls, ...) infer_##rule,
#include "ops.def"
#undef OP
};

void infer_node(Graph *g, Node *n, Arg *args, const char *where) {
  R rr = {g, n, args, where ? where : "", op_info[n->op].name}, *r = &rr;
  int flags = op_info[n->op].flags;
  /* operand dtype classes from the table's flags; tensor params lead the
   * signature, so in[i] is signature param i (concat: all in param 0) */
  for (int i = 0; i < n->nin; i++) {
    Node *x = n->in[i];
    int k = n->op == OP_CONCAT ? 0 : i;
    if (!x || (n->op == OP_WHERE && i == 0) || n->op == OP_EMBEDDING || n->op == OP_CROSS_ENTROPY)
      continue; /* bool condition; mixed dtypes by design (checked by the rule) */
    const char *nm = lab(r, k);
    Loc l = n->op == OP_CONCAT && args[0].locs ? args[0].locs[i] : args[k].loc;
    if ((flags & F_FLOAT) && !dtype_is_float(x->dtype))
      ERR(l, "%s must be floating (f32, bf16, f16), found %s", nm, dtype_names[x->dtype]);
    if ((flags & F_NUMERIC) && x->dtype == DT_BOOL)
      ERR(l, "%s is bool; %s needs numbers (cast(%s, f32) first)", nm, r->op, nm);
  }
  rules[n->op](r);
  /* every result must have a countable shape */
  int64_t numel = 1;
  for (int i = 0; i < n->shape.rank; i++) {
    int64_t lo, hi;
    if (!dim_bounds(g, &n->shape.d[i], &lo, &hi) || __builtin_mul_overflow(numel, hi, &numel))
      ERR(n->loc, "the result's shape %s has more elements than int64 can count", shape_str(g, &n->shape));
    if (lo < 1)
      ERR(n->loc, "the result's dim %d is %s, which can be below 1", i, dim_str(g, &n->shape.d[i]));
  }
  if (numel > INT64_MAX / 8) /* its bytes (8 in the interpreter) must be countable too */
    ERR(n->loc, "the result's shape %s has %lld elements, too many to count their bytes in int64",
        shape_str(g, &n->shape), (long long)numel);
}
