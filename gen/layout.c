/* layout.c: where a value's elements are in memory.
 *
 * A stored value is contiguous in its own buffer, unless the schedule placed
 * it inside another value's buffer (its host): a call result written
 * straight into the layout of the value its reader wants, e.g. attention's
 * [B, NH, T, D] output into the [B, T, C] operand of the projection after
 * it, or the three attention gradients into the one [B, T, 3C] gradient of
 * the qkv projection. A view is index arithmetic over the value it views,
 * so its elements are where that value's are, at other strides.
 *
 * A Layout says so: element (i_0, ..., i_{r-1}) of a node is element
 * off + sum_k i_k st[k] of its host's buffer. layout_of gives it for any
 * chain of views over a stored value that strides can express (a reshape
 * that merges dims whose strides do not line up cannot), layout_unview
 * runs a bijective view backwards (the layout a placed value must have so
 * that the view over it is its host). The attention calls read and write
 * through such layouts (the runtime's tgm_view), and loop kernels load a
 * placed value at its strides. */
#include "ir.h"

#include <string.h>

static const Loc noloc = {0, 0};

int layout_view1(const Node *n) { return op_info[n->op].cls == C_VIEW && n->op != OP_CONCAT; }

void layout_contig(const Node *n, Layout *l) {
  l->host = n;
  l->off = dim_const(0);
  Dim s = dim_const(1);
  for (int k = n->shape.rank - 1; k >= 0; k--) {
    l->st[k] = s;
    s = dim_mul(s, n->shape.d[k], noloc);
  }
}

/* The size d at the dims' maxima (p->sym). */
static int64_t at_max(const BPass *p, const Dim *d) {
  int64_t v = 0;
  const char *err;
  if (!dim_eval(p->g, d, p->sym, &v, &err))
    die("layout: %s", err);
  return v;
}

int64_t layout_bytes(const BPass *p, const Node *n) {
  int64_t v = n->dtype == DT_BOOL ? 1 : dtype_size(n->dtype);
  for (int k = 0; k < n->shape.rank; k++)
    v *= at_max(p, &n->shape.d[k]);
  return v;
}

/* l, strides over shape `from`, as strides over shape `to` (the same
 * elements in row-major order): dims are grouped where their products
 * agree, and a group's dims of `from` must be one run of memory (each
 * stride the next one's times its size). 0 when they are not. */
static int reshape_layout(const BPass *p, Layout *l, const Shape *from, const Shape *to) {
  Dim st[MAXRANK];
  int i = 0, j = 0;
  for (;;) {
    while (i < from->rank && dim_is_one(&from->d[i]))
      i++;
    while (j < to->rank && dim_is_one(&to->d[j]))
      st[j++] = dim_const(0);
    if (i == from->rank || j == to->rank)
      break;
    int i2 = i + 1, j2 = j + 1;
    Dim a = from->d[i], b = to->d[j];
    while (!dim_eq(&a, &b)) {
      int64_t va = at_max(p, &a), vb = at_max(p, &b);
      if (va < vb && i2 < from->rank)
        a = dim_mul(a, from->d[i2++], noloc);
      else if (vb < va && j2 < to->rank)
        b = dim_mul(b, to->d[j2++], noloc);
      else
        return 0;
    }
    int last = -1;
    for (int k = i; k < i2; k++)
      if (!dim_is_one(&from->d[k])) {
        if (last >= 0) {
          Dim run = dim_mul(l->st[k], from->d[k], noloc);
          if (!dim_eq(&l->st[last], &run))
            return 0;
        }
        last = k;
      }
    Dim s = l->st[last];
    for (int k = j2 - 1; k >= j; k--) {
      st[k] = s;
      s = dim_mul(s, to->d[k], noloc);
    }
    i = i2;
    j = j2;
  }
  if (i != from->rank || j != to->rank)
    return 0;
  memcpy(l->st, st, sizeof(Dim) * (size_t)to->rank);
  return 1;
}

/* l, the layout of view v's operand, made v's; or (back), l being v's, its
 * operand's (transposes, permutes and reshapes: a slice or a broadcast does
 * not cover its operand once). */
static int through(const BPass *p, const Node *v, Layout *l, int back) {
  const Shape *xs = &v->in[0]->shape, *ys = &v->shape;
  Layout o = *l;
  switch (v->op) {
  case OP_TRANSPOSE:
    o.st[v->axis] = l->st[v->axis2];
    o.st[v->axis2] = l->st[v->axis];
    break;
  case OP_PERMUTE:
    for (int k = 0; k < ys->rank; k++)
      if (back)
        o.st[v->perm[k]] = l->st[k];
      else
        o.st[k] = l->st[v->perm[k]];
    break;
  case OP_SLICE:
    if (back)
      return 0;
    o.off = dim_add(l->off, dim_mul(v->lo, l->st[v->axis], noloc), noloc);
    break;
  case OP_BROADCAST_TO:
    if (back)
      return 0;
    for (int k = 0; k < ys->rank; k++) {
      int kk = k - (ys->rank - xs->rank);
      o.st[k] = kk < 0 || (dim_is_one(&xs->d[kk]) && !dim_is_one(&ys->d[k])) ? dim_const(0) : l->st[kk];
    }
    break;
  case OP_RESHAPE: case OP_SQUEEZE: case OP_UNSQUEEZE:
    if (!reshape_layout(p, &o, back ? ys : xs, back ? xs : ys))
      return 0;
    break;
  default:
    return 0;
  }
  *l = o;
  return 1;
}

int layout_view(const BPass *p, const Node *v, Layout *l) { return through(p, v, l, 0); }
int layout_unview(const BPass *p, const Node *v, Layout *l) { return through(p, v, l, 1); }

int layout_stored(const BPass *p, const Node *n) {
  if (n->op == OP_INPUT || n->op == OP_PARAM)
    return 1;
  if (!p->realized[n->id])
    return 0;
  /* a stored view without a kernel of its own is an alias of its operand's bytes */
  return !layout_view1(n) || (p->kern && p->kern[n->id] >= 0) || (p->host && p->host[n->id]);
}

int layout_of(const BPass *p, const Node *n, Layout *l) {
  if (layout_stored(p, n)) {
    if (p->place && p->place[n->id])
      *l = *p->place[n->id];
    else
      layout_contig(n, l);
    return 1;
  }
  return layout_view1(n) && layout_of(p, n->in[0], l) && layout_view(p, n, l);
}

int layout_alias(const BPass *p, const Node *n, Layout *l) {
  if (!layout_view1(n) || !layout_of(p, n->in[0], l) || !layout_view(p, n, l))
    return 0;
  Dim off = l->off;
  l->off = dim_const(0);
  int contig = layout_is_contig(n, l);
  l->off = off;
  return contig;
}

const Node *layout_base(const BPass *p, const Node *n) {
  while (!layout_stored(p, n) && layout_view1(n))
    n = n->in[0];
  return n;
}

int layout_rows(const BPass *p, const Node *n, const Layout *l) {
  int r = n->shape.rank;
  int64_t v, lo, hi, dlo, dhi;
  if (r < 2)
    return 0;
  if (!dim_is_one(&n->shape.d[r - 1]) && !(dim_is_const(&l->st[r - 1], &v) && v == 1))
    return 0;
  if (dim_is_one(&n->shape.d[r - 2]))
    return 1;
  return dim_bounds(p->g, &l->st[r - 2], &lo, &hi) && dim_bounds(p->g, &n->shape.d[r - 1], &dlo, &dhi) && lo >= dhi;
}

int layout_is_contig(const Node *n, const Layout *l) {
  Layout c;
  layout_contig(n, &c);
  if (!dim_eq(&l->off, &c.off))
    return 0;
  for (int k = 0; k < n->shape.rank; k++)
    if (!dim_is_one(&n->shape.d[k]) && !dim_eq(&l->st[k], &c.st[k]))
      return 0;
  return 1;
}
