/* schedule.c: which values of a pass are stored, and the kernels that compute
 * them.
 *
 * A value is *realized* (stored in a buffer) when something needs it in
 * memory: a pass result (output, loss, gradient), a value the training
 * schedule saves for the backward, the operands and results of library calls
 * (GEMMs, attention, embedding, dropout, concat), a reduction, or a pointwise
 * value read by several consumers whose recomputation would cost more than a
 * few operations. Every other pointwise op and every view is recomputed where
 * it is read: a view is index arithmetic in its reader, never a copy.
 *
 * Each realized value starts as its own kernel, in pass order. Fusion then
 * merges a loop kernel into an earlier one (Inductor's rule of thumb, made
 * ahead of time):
 *   - pointwise kernels over the same number of elements;
 *   - a reduction with the pointwise kernels over its input's space (its
 *     prologue, or an epilogue such as softmax's divide, computed in a loop
 *     after the reduction) or over its result's space (an epilogue after it);
 *   - reductions over the same input space and dims (several phases of one
 *     loop nest: layer_norm's mean then variance, softmax's max then sum);
 *   - sums over the leading dims of a row kernel's space, as its riders
 *     (rider_fit: a layer norm's weight and bias gradients, added as its
 *     backward's rows go by), with the pointwise work over their results;
 * when the later kernel reads a value the earlier one stores, or both read
 * the same buffer, when no other kernel between them has to run in between
 * (fusion never creates a cycle), and when the renderer can index every read
 * of a fused reduction's result at the kernel's own output element. A stored
 * value that only its own kernel reads is then kept in registers instead.
 * With fuse off every computed node is a kernel of its own. */
#include "ir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct S {
  BPass *p;
  Arena *a;
  struct LoadWalk *wp, *wp2; /* the walks of merge() and of leaves_to_finals() */
  int *mj, *saved;
  char *cut;             /* per node: stored to bound an expression's depth */
  /* While it schedules, p->kern holds a kernel's id (its first index), which
   * a merge does not change: kid_at[index] and idx_of[id] map between them
   * (a merge then renumbers the kernels after it, not every node) */
  int *kid_at, *idx_of;
  int *uoff;             /* each node's consumers: users[uoff[id] .. uoff[id + 1]) */
  Node **users;
} S;

/* The current index of the kernel that stores node id, or -1. */
static int kidx(const S *s, int id) { return s->p->kern[id] < 0 ? -1 : s->idx_of[s->p->kern[id]]; }

/* the deepest expression a kernel computes inline (schedule) */
#define MAX_INLINE_DEPTH 256
/* the most stored values and reductions one fused kernel computes */
#define MAX_KERNEL_VALUES 64

static int is_leaf(const Node *n) { return n->op == OP_INPUT || n->op == OP_PARAM; }
static int is_reduce(const Node *n) { return op_info[n->op].cls == C_REDUCE; }
/* A library call: its operands and result live in memory. */
static int is_call(const Node *n) {
  OpClass c = op_info[n->op].cls;
  return c == C_GEMM || c == C_EXTERN || n->op == OP_CONCAT;
}
/* Do library calls a and b share one runtime call: attention and its
 * attention_lse, or the attention_backward of its operands (the same
 * operands and attributes)? */
static int same_call(const Node *a, const Node *b) {
  int fa = a->op == OP_ATTENTION || a->op == OP_ATTENTION_LSE, fb = b->op == OP_ATTENTION || b->op == OP_ATTENTION_LSE;
  if (!(fa && fb) && !(a->op == OP_ATTENTION_BACKWARD && b->op == OP_ATTENTION_BACKWARD))
    return 0;
  for (int k = 0; k < (fa ? 3 : 6); k++)
    if (a->in[k] != b->in[k])
      return 0;
  return a->flag == b->flag && a->has_f[0] == b->has_f[0] && (!a->has_f[0] || a->f[0] == b->f[0]);
}

const Node *gemm_source(const Node *x, int *trans) {
  *trans = 0;
  if (x->op == OP_INPUT || x->op == OP_PARAM)
    return x;
  int r = x->shape.rank;
  if (r < 2)
    return x;
  int swap = 0;
  if (x->op == OP_TRANSPOSE)
    swap = (x->axis == r - 1 && x->axis2 == r - 2) || (x->axis == r - 2 && x->axis2 == r - 1);
  else if (x->op == OP_PERMUTE) {
    swap = x->perm[r - 1] == r - 2 && x->perm[r - 2] == r - 1;
    for (int k = 0; k < r - 2; k++)
      swap &= x->perm[k] == k;
  }
  if (!swap)
    return x;
  int t; /* a transpose of a transpose: follow it, flipping again */
  const Node *y = gemm_source(x->in[0], &t);
  *trans = !t;
  return y;
}

static int batch_ok(const Node *x, const Node *y) {
  int bx = x->shape.rank - 2, by = y->shape.rank - 2;
  if (bx == 0)
    return 1;
  if (bx != by)
    return 0;
  for (int k = 0; k < bx; k++)
    if (!dim_eq(&x->shape.d[k], &y->shape.d[k]))
      return 0;
  return 1;
}

const Node *gemm_operand(const Node *n, int k, int *trans) {
  *trans = 0;
  if (k >= 2 || (n->op == OP_LINEAR && k == 0) || !gemm_strided(n))
    return n->in[k];
  return gemm_source(n->in[k], trans);
}

int gemm_strided(const Node *n) {
  if (n->op == OP_LINEAR)
    return 1;
  return n->in[0]->shape.rank >= 2 && n->in[1]->shape.rank >= 2 && batch_ok(n->in[0], n) && batch_ok(n->in[1], n);
}

static Dim numel_dim(const BPass *p, const Shape *s, uint32_t only, int want) {
  Dim d = dim_const(1);
  Loc none = {0, 0};
  (void)p;
  for (int k = 0; k < s->rank; k++)
    if (!only || ((only >> k & 1) == (uint32_t)want))
      d = dim_mul(d, s->d[k], none);
  return d;
}

/* Operations in the recomputed cone of n (pointwise ops and views up to
 * realized values and leaves). */
static int cone_cost(S *s, const Node *n, int depth) {
  BPass *p = s->p;
  if (is_leaf(n) || (p->realized[n->id] && depth) || depth > 64)
    return 0;
  int c = op_info[n->op].cls == C_PW ? 1 : 0;
  for (int k = 0; k < n->nin; k++)
    if (n->in[k])
      c += cone_cost(s, n->in[k], depth + 1);
  return c;
}

/* n must be stored, for reason r (the first reason given is kept). */
static void need(BPass *p, char *keep, const Node *n, const char *r) {
  keep[n->id] = 1;
  if (!p->why[n->id])
    p->why[n->id] = r;
}

/* ---------------------------------------------------------------- kernels */

static Kernel *new_kernel(S *s, KernelKind kind, Node *n) {
  BPass *p = s->p;
  Kernel *k = arena_alloc(s->a, sizeof(Kernel));
  k->kind = kind;
  k->outs = arena_alloc(s->a, sizeof(Node *)); /* merge sizes its own: memory stays linear */
  k->reds = arena_alloc(s->a, sizeof(Node *));
  k->outs[k->nouts++] = n;
  if (kind != K_LOOP)
    k->anchor = n;
  else if (is_reduce(n)) {
    k->reds[k->nreds++] = n;
    k->full = n->in[0]->shape;
    k->axes = n->axes;
    k->outer = numel_dim(p, &k->full, k->axes, 0);
    k->rnum = numel_dim(p, &k->full, k->axes, 1);
    k->numel = numel_dim(p, &k->full, 0, 0);
  } else {
    k->numel = numel_dim(p, &n->shape, 0, 0);
  }
  return k;
}

LoadWalk *walk_new(Arena *a, int n) {
  LoadWalk *w = arena_alloc(a, sizeof(LoadWalk));
  w->seen = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  w->own = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  w->mark = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  w->list = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  w->cap = n + 1; /* a walk pushes each node at most once per operand: at most 3 * n, grown below */
  w->stack = arena_alloc(a, sizeof(Node *) * (size_t)w->cap);
  return w;
}

static void load(LoadWalk *w, int id) {
  if (w->mark[id] != w->stamp) {
    w->mark[id] = w->stamp;
    w->list[w->nlist++] = id;
  }
}

/* A value read from memory, and through a stored reshape (an alias), the
 * value whose bytes it is; a view a call reads as strides (layout.c), the
 * value it views. */
static void mark_alias(const BPass *p, const Node *n, LoadWalk *w) {
  if (is_leaf(n) || p->realized[n->id])
    load(w, n->id);
  while (!layout_stored(p, n) && layout_view1(n)) {
    n = n->in[0];
    if (is_leaf(n) || p->realized[n->id])
      load(w, n->id);
  }
}

/* What kernel k reads from memory: up from its results through the values
 * it computes (an explicit stack: a fused chain may be thousands deep). */
void kernel_loads(const BPass *p, const Kernel *k, LoadWalk *w) {
  w->stamp++;
  w->nlist = 0;
  if (k->kind != K_LOOP) {
    const Node *a = k->anchor;
    for (int j = 0; j < a->nin; j++)
      if (a->in[j]) {
        int t;
        mark_alias(p, k->kind == K_GEMM ? gemm_operand(a, j, &t) : a->in[j], w);
      }
    if (k->res)
      mark_alias(p, k->res, w);
    if (k->aux && k->aux != a) /* an activation gradient's input */
      mark_alias(p, k->aux, w);
    return;
  }
  int sp = 0;
  for (int i = 0; i < k->nouts; i++)
    w->own[k->outs[i]->id] = w->stamp;
  for (int i = 0; i < k->nreds; i++)
    w->own[k->reds[i]->id] = w->stamp;
  for (int i = 0; i < k->ncols; i++)
    w->own[k->cols[i]->id] = w->stamp;
  for (int i = 0; i < k->nreds + k->nouts + k->ncols; i++) {
    w->stack[sp++] = i < k->nouts ? k->outs[i] : i < k->nouts + k->nreds ? k->reds[i - k->nouts] : k->cols[i - k->nouts - k->nreds];
    while (sp) {
      const Node *n = w->stack[--sp];
      if (w->seen[n->id] == w->stamp)
        continue;
      w->seen[n->id] = w->stamp;
      int own = w->own[n->id] == w->stamp;
      if (!own && (is_leaf(n) || p->realized[n->id])) {
        mark_alias(p, n, w);
        continue;
      }
      if (!own && is_call(n))
        die("schedule: %s is read unrealized", op_info[n->op].name);
      if (n->op == OP_CONCAT) { /* its operands are read from memory, even one this kernel stores */
        for (int j = 0; j < n->nin; j++)
          mark_alias(p, n->in[j], w);
        continue;
      }
      if (sp + n->nin + 1 > w->cap) {
        const Node **st = arena_alloc(p->g->arena, sizeof(Node *) * (size_t)(2 * (sp + n->nin + 1)));
        memcpy(st, w->stack, sizeof(Node *) * (size_t)sp);
        w->stack = st;
        w->cap = 2 * (sp + n->nin + 1);
      }
      for (int j = n->nin - 1; j >= 0; j--)
        if (n->in[j])
          w->stack[sp++] = n->in[j];
    }
  }
}

/* Stamp the loads of k into s->wp's marks and list with a new stamp; returns it. */
static int loads(S *s, const Kernel *k) {
  kernel_loads(s->p, k, s->wp);
  return s->wp->stamp;
}

/* Does kernel a's iteration space admit kernel b's nodes (and vice versa)? */
static int domains_fit(const Kernel *a, const Kernel *b) {
  if (a->nreds && b->nreds)
    return a->axes == b->axes && shape_eq(&a->full, &b->full);
  if (a->nreds || b->nreds) {
    const Kernel *r = a->nreds ? a : b, *q = a->nreds ? b : a;
    return dim_eq(&q->numel, &r->numel) || dim_eq(&q->numel, &r->outer);
  }
  return dim_eq(&a->numel, &b->numel);
}

/* Can column kernel b ride row kernel a (a < b in pass order): b's sums over
 * the dims a's reductions keep (the leading dims: a layer norm's weight and
 * bias gradients) accumulated as a's rows go by, so the rows are read once
 * (render.c's riders)? b sums floats in one phase and stores only values
 * over its result space; a's rows are of a constant length, a multiple of
 * 8 elements and at most RIDE_ROW (a warp's on CUDA), and the sums of all
 * its riders fit a block's shared memory on CUDA (RIDE_SLOTS floats a
 * thread) and a chunk's partials on the CPU (RIDE_COLS). */
int rider_fit(const BPass *p, const Kernel *a, const Kernel *b) {
  int64_t nr;
  uint32_t all = (a->full.rank >= 32 ? 0 : 1u << a->full.rank) - 1;
  if (a->kind != K_LOOP || b->kind != K_LOOP || !b->nreds || b->ncols || !kernel_rows(a) ||
      !shape_eq(&a->full, &b->full) || (a->axes & b->axes) || (a->axes | b->axes) != all ||
      !dim_is_const(&a->rnum, &nr) || nr % 8 || nr > (a->nreds ? RIDE_ROW : RIDE_COLS))
    return 0;
  /* a CUDA thread's sums of a rider (render.c: its positions in vectors of 8 or 4, or elements): at most */
  int64_t n = a->ncols + b->nreds, s8 = (nr + 255) / 256 * 8, s4 = (nr + 127) / 128 * 4, s1 = (nr + 31) / 32;
  int64_t slots = s8 > s4 ? s8 : s4;
  slots = slots > s1 ? slots : s1;
  if (n * nr > RIDE_COLS || n * slots > RIDE_SLOTS)
    return 0;
  for (int i = 0; i < b->nreds; i++)
    if (b->reds[i]->op != OP_SUM || !dtype_is_float(b->reds[i]->dtype))
      return 0;
  for (int i = 0; i < b->nouts; i++) {
    Dim nn = numel_dim(p, &b->outs[i]->shape, 0, 0);
    if (!dim_eq(&nn, &b->outer))
      return 0;
  }
  return 1;
}

/* Pointwise kernel a as a row kernel over column kernel b's space (its rows
 * the dims b's sums keep, innermost), for b's sums to ride it (a bias's
 * gradient out of the pointwise kernel that stores dy: GPT-2's c_fc's, out
 * of gelu's gradient); 0 when a's elements are not b's. Its rows are not
 * held anywhere (no reduction reads them again), so they may be as long as
 * the riders' sums allow (RIDE_COLS). */
static int host_rows(const BPass *p, const Kernel *a, const Kernel *b, Kernel *h) {
  uint32_t all = (b->full.rank >= 32 ? 0 : 1u << b->full.rank) - 1;
  Dim n = numel_dim(p, &b->full, 0, 0);
  if (a->kind != K_LOOP || a->nreds || a->ncols || !dim_eq(&n, &a->numel) || !b->axes || b->axes == all)
    return 0;
  *h = *a;
  h->full = b->full;
  h->axes = all & ~b->axes;
  h->outer = numel_dim(p, &h->full, h->axes, 0);
  h->rnum = numel_dim(p, &h->full, h->axes, 1);
  return kernel_rows(h);
}

static void absorb(Kernel *into, const Kernel *from) {
  int had = into->nreds;
  for (int i = 0; i < from->nouts; i++)
    into->outs[into->nouts++] = from->outs[i];
  for (int i = 0; i < from->nreds; i++)
    into->reds[into->nreds++] = from->reds[i];
  for (int i = 0; i < from->ncols; i++)
    into->cols[into->ncols++] = from->cols[i];
  if (!had && from->nreds) {
    into->full = from->full;
    into->axes = from->axes;
    into->outer = from->outer;
    into->rnum = from->rnum;
    into->numel = from->numel;
  }
}

int kernel_rows(const Kernel *k) {
  int seen_kept = 0;
  for (int j = k->full.rank - 1; j >= 0; j--)
    if (!(k->axes >> j & 1))
      seen_kept = 1;
    else if (seen_kept)
      return 0;
  return 1;
}

static int in_backward(const BPass *p, const Kernel *k) {
  for (int i = 0; i < k->nouts; i++)
    if (k->outs[i]->id >= p->nfwd)
      return 1;
  for (int i = 0; i < k->nreds; i++)
    if (k->reds[i]->id >= p->nfwd)
      return 1;
  for (int i = 0; i < k->ncols; i++)
    if (k->cols[i]->id >= p->nfwd)
      return 1;
  return 0;
}

/* Whether kernel k (its loads just walked into s->wp) reads only inputs and params and
 * stores only pass results (gradients) and values no other kernel reads
 * (kept in registers): such a backward kernel may join a forward one that
 * reads the same inputs (sum(f(x)) w.r.t. x: the loss and d_x in one pass
 * over x), since it needs nothing the forward computes and keeps nothing in
 * the arena. */
static int leaves_to_finals(S *s, Kernel *k) {
  BPass *p = s->p; /* s->wp's list holds k's loads */
  for (int q = 0; q < s->wp->nlist; q++)
    if (!is_leaf(p->nodes[s->wp->list[q]]))
      return 0;
  /* cached: merging never adds a reader of another kernel's values (a
   * merged kernel reads what its parts read), and a merge makes a new kernel */
  if (k->leaves)
    return k->leaves == 1;
  k->leaves = 1;
  for (int i = 0; i < k->nouts && k->leaves == 1; i++) {
    int final = 0;
    for (int f = 0; f < p->nfinals && !final; f++)
      final = p->finals[f] == k->outs[i];
    for (int m = 0; m < p->nk && !final && k->leaves == 1; m++)
      if (p->k[m] != k) {
        kernel_loads(p, p->k[m], s->wp2);
        if (s->wp2->mark[k->outs[i]->id] == s->wp2->stamp)
          k->leaves = 2;
      }
  }
  return k->leaves == 1;
}

/* Does backward kernel k compute gradient work only (no value it stores or
 * reduces is a copy of a forward node, as a recomputation is)? Such work
 * may run in the forward's kernel that its operands are ready by: the loss
 * gradient's first kernels over the logits or the prediction (a
 * recomputation there would store what the partitioner chose not to save). */
static int gradient_only(const BPass *p, const Kernel *k) {
  for (int i = 0; i < k->nouts; i++)
    if (p->orig[k->outs[i]->id]->id < p->g->nforward)
      return 0;
  for (int i = 0; i < k->nreds; i++)
    if (p->orig[k->reds[i]->id]->id < p->g->nforward)
      return 0;
  for (int i = 0; i < k->ncols; i++)
    if (p->orig[k->cols[i]->id]->id < p->g->nforward)
      return 0;
  return 1;
}

/* Does kernel k read only inputs and params (so it may run earlier)? */
static int reads_leaves(S *s, const Kernel *k) {
  kernel_loads(s->p, k, s->wp2);
  for (int q = 0; q < s->wp2->nlist; q++)
    if (!is_leaf(s->p->nodes[s->wp2->list[q]]))
      return 0;
  return 1;
}

/* Moves kernel x (> i) to index i, the kernels i..x-1 one later. */
static void hoist(S *s, int x, int i) {
  BPass *p = s->p;
  Kernel *k = p->k[x];
  int id = s->kid_at[x];
  for (int q = x; q > i; q--) {
    p->k[q] = p->k[q - 1];
    s->kid_at[q] = s->kid_at[q - 1];
    s->idx_of[s->kid_at[q]] = q;
  }
  p->k[i] = k;
  s->kid_at[i] = id;
  s->idx_of[id] = i;
}

/* What kernel k is, in words, for the reasons below ("a GEMM (linear)"). */
static const char *kernel_what(const BPass *p, const Kernel *k) {
  if (k->kind == K_LOOP)
    return k->nreds ? "a reduction" : "a pointwise loop";
  const char *op = op_info[k->anchor->op].name;
  if (k->kind == K_GEMM)
    return arena_printf(p->g->arena, "a GEMM (%s, a library call)", op);
  return arena_printf(p->g->arena, "a library call (%s)", op);
}

/* A loop kernel's iteration space in words ("B*10 elements", "a reduction of
 * [B, 10] over 10 elements each"). */
static const char *space(const BPass *p, const Kernel *k) {
  Graph *g = p->g;
  if (!k->nreds)
    return arena_printf(g->arena, "%s elements", dim_str(g, &k->numel));
  const char *o = dim_str(g, &k->outer);
  return arena_printf(g->arena, "%s reduced to %s value%s", shape_str(g, &k->full), o, strcmp(o, "1") ? "s" : "");
}

/* Why nothing fuses after library call k. */
static const char *call_stop(const BPass *p, const Kernel *k) {
  if (k->kind == K_GEMM)
    return arena_printf(p->g->arena, "this is a GEMM (%s): only a bias, relu/gelu and residual add fuse into a GEMM",
                        op_info[k->anchor->op].name);
  return arena_printf(p->g->arena, "this is %s: nothing fuses into it", kernel_what(p, k));
}

/* Merge kernel j into kernel i (i < j): NULL when merged (commit) or when
 * they could be (!commit: nothing changes), else why not, in words. */
/* Why not, in words: printed only when asked (!commit); the greedy pass
 * tries thousands of merges and needs only yes or no. */
#define WHY(...) (commit ? "" : arena_printf(g->arena, __VA_ARGS__))

static const char *merge(S *s, int i, int j, int commit) {
  BPass *p = s->p;
  Graph *g = p->g;
  Kernel *ki = p->k[i], *kj = p->k[j];
  if (ki->kind != K_LOOP)
    return commit ? "" : call_stop(p, ki);
  if (kj->kind != K_LOOP)
    return WHY("%s comes next", kernel_what(p, kj));
  if (ki->nouts + ki->nreds + ki->ncols + kj->nouts + kj->nreds + kj->ncols > MAX_KERNEL_VALUES)
    return WHY("the kernel would compute more than %d stored values and reductions (a bound on its "
                        "size: registers, and the compiler's time)", MAX_KERNEL_VALUES);
  int ride = !domains_fit(ki, kj) && ki->nreds && rider_fit(p, ki, kj); /* kj's sums ride ki's rows */
  /* pointwise work over the riders' result space (a cast of their sums): with their totals (the renderer
   * checks that it reads them) */
  int ride_out = !domains_fit(ki, kj) && !ride && ki->ncols && !kj->nreds && !kj->ncols && dim_eq(&kj->numel, &ki->rnum);
  if (!domains_fit(ki, kj) && !ride && !ride_out) {
    if (ki->nreds && kj->nreds)
      return WHY("both reduce, over different spaces (%s; the next: %s)", space(p, ki), space(p, kj));
    return WHY("the next loop runs over another space (this: %s; the next: %s)", space(p, ki),
                        space(p, kj));
  }
  /* a reduction to few values fused with work over its whole input would
   * serialise that work, unless the renderer splits its reduced elements
   * over blocks (CUDA) and chunks (CPU): one reduction to at most 8 values
   * of at least 65536 elements each (render.c's split_ok, cpu_split_ok) */
  if ((ki->nreds || kj->nreds) && !(ki->nreds && kj->nreds)) {
    const Kernel *r = ki->nreds ? ki : kj, *q = ki->nreds ? kj : ki;
    int64_t o, rn;
    const char *e;
    int splits = r->nreds == 1 && dim_is_const(&r->outer, &o) && o <= 8 && dim_eval(g, &r->rnum, p->sym, &rn, &e) &&
                 rn >= 65536;
    if (!splits && dim_is_const(&r->outer, &o) && o < 64 && dim_eq(&q->numel, &r->numel) && !dim_eq(&r->numel, &r->outer))
      return WHY("a reduction to %lld value%s does not take work over its whole input (it would run on "
                          "%lld thread%s)", (long long)o, o == 1 ? "" : "s", (long long)o, o == 1 ? "" : "s");
  }
  /* the training schedule's forward part stays apart from its backward
   * (fusing a recomputation into the forward would store what the
   * partitioner chose not to save) */
  int sj = loads(s, kj);
  int into_fwd = 0; /* gradient work merged into the forward kernel its operands are ready by */
  if (in_backward(p, ki) != in_backward(p, kj) && !(!in_backward(p, ki) && leaves_to_finals(s, kj))) {
    if (in_backward(p, ki) || !gradient_only(p, kj) || reads_leaves(s, kj)) /* (one that reads only leaves
                                                                               moves before its reader) */
      return "the training step's backward part starts (the forward keeps only what the partitioner saved)";
    into_fwd = 1;
    sj = loads(s, kj);
  }
  int related = 0;
  for (int q = 0; q < ki->nouts && !related; q++)
    related = s->wp->mark[ki->outs[q]->id] == sj;
  /* a value stored to bound the depth of a chain's expression stays a load */
  for (int q = 0; q < s->wp->nlist; q++)
    if (s->cut[s->wp->list[q]] && kidx(s, s->wp->list[q]) == i)
      return WHY("the next reads a value stored to bound a chain's expression depth (%d ops)",
                          MAX_INLINE_DEPTH);
  if (!related) { /* horizontal: a shared load */
    int *mj = s->mj, nj = s->wp->nlist;
    memcpy(mj, s->wp->list, sizeof(int) * (size_t)nj);
    int si = loads(s, ki);
    for (int q = 0; q < nj && !related; q++)
      related = s->wp->mark[mj[q]] == si;
    sj = loads(s, kj);
  }
  if (!related)
    return "nothing in common: the next reads nothing this one stores, and they load no buffer in common";
  /* placement: at i when every producer of j runs before i, else at j when
   * nothing between them reads i's stores */
  int at_i = 1, *up = s->mj, nup = 0; /* kernels between them that j reads and that read only leaves: moved before i */
  for (int q = 0; q < s->wp->nlist && at_i; q++) {
    int id = s->wp->list[q], x = kidx(s, id);
    if (x > i && x != j) {
      int dup = 0;
      for (int u = 0; u < nup; u++)
        dup |= up[u] == x;
      if (into_fwd && !dup && reads_leaves(s, p->k[x]))
        up[nup++] = x;
      else if (!dup)
        at_i = 0;
    }
  }
  if (into_fwd && !at_i)
    return WHY("the next is gradient work that reads values computed after this kernel");
  int at_j = 0;
  if (!at_i) {
    at_j = 1;
    for (int m = i + 1; m < j && at_j; m++) {
      int sm = loads(s, p->k[m]);
      for (int q = 0; q < ki->nouts && at_j; q++)
        if (s->wp->mark[ki->outs[q]->id] == sm)
          at_j = 0;
    }
  }
  if (!at_i && !at_j)
    return "a kernel between them reads this one's result and writes what the other reads (fusing makes a cycle)";
  /* tentatively merge and let the renderer check the indexing */
  Kernel *m = arena_alloc(s->a, sizeof(Kernel));
  *m = *ki;
  m->leaves = 0;
  m->outs = arena_alloc(s->a, sizeof(Node *) * (size_t)(ki->nouts + kj->nouts + 1));
  m->reds = arena_alloc(s->a, sizeof(Node *) * (size_t)(ki->nreds + kj->nreds + 1));
  m->cols = arena_alloc(s->a, sizeof(Node *) * (size_t)(ki->ncols + kj->ncols + kj->nreds + 1));
  m->nouts = m->nreds = m->ncols = 0;
  m->stop = NULL;
  absorb(m, ki);
  if (ride) { /* kj's sums as riders, its values over their result space among the outs */
    for (int q = 0; q < kj->nouts; q++)
      m->outs[m->nouts++] = kj->outs[q];
    for (int q = 0; q < kj->nreds; q++)
      m->cols[m->ncols++] = kj->reds[q];
  } else
    absorb(m, kj);
  /* a reduction over leading dims (bias gradients) runs as tiles of 32
   * output columns, so few outputs means few thread blocks: work over its
   * whole input is not put there unless the tiles fill the GPU */
  if (m->nreds && !kernel_rows(m)) {
    int64_t o = 0;
    const char *e;
    int full_work = 0;
    for (int q = 0; q < m->nouts; q++) {
      Dim nn = numel_dim(p, &m->outs[q]->shape, 0, 0);
      full_work |= !is_reduce(m->outs[q]) && dim_eq(&nn, &m->numel) && !dim_eq(&m->numel, &m->outer);
    }
    if (full_work && dim_eval(p->g, &m->outer, p->sym, &o, &e) && o / 32 < 132)
      return WHY("a reduction over leading dims with %lld outputs runs as %lld tiles of 32 columns, "
                          "too few for the work over its whole input (the H100 has 132 SMs)", (long long)o,
                          (long long)((o + 31) / 32));
  }
  if (commit && nup) { /* up[] (each before j) to i, i's kernel after them */
    for (int u = 0; u < nup; u++) { /* in index order, so each move keeps the others' places */
      int lo = u;
      for (int v = u + 1; v < nup; v++)
        if (up[v] < up[lo])
          lo = v;
      int t = up[u];
      up[u] = up[lo];
      up[lo] = t;
      hoist(s, up[u], i + u);
    }
    i += nup;
  }
  int *saved = s->saved; /* the kernel of each value m stores, before (only these change) */
  int pos = at_i ? i : j;
  for (int q = 0; q < m->nouts; q++) {
    saved[q] = p->kern[m->outs[q]->id];
    p->kern[m->outs[q]->id] = s->kid_at[pos];
  }
  p->k[pos] = m;
  int bad = render_check(p, m);
  if (bad || !commit) {
    for (int q = m->nouts - 1; q >= 0; q--)
      p->kern[m->outs[q]->id] = saved[q];
    p->k[pos] = pos == i ? ki : kj;
    return bad == 2   ? "the fused kernel would load a value it stores (a concat's operand)"
           : bad      ? "a reduction's result would be read at another element than the fused loop's own"
                      : NULL;
  }
  /* remove the other slot */
  int gone = pos == i ? j : i;
  s->idx_of[s->kid_at[gone]] = -1; /* its values are m's now (stamped with the id at pos above) */
  for (int q = gone; q + 1 < p->nk; q++) {
    p->k[q] = p->k[q + 1];
    s->kid_at[q] = s->kid_at[q + 1];
    s->idx_of[s->kid_at[q]] = q;
  }
  p->nk--;
  return NULL;
}

/* ---------------------------------------------------------------- layouts */

/* The attention calls take their operands and results as strided views
 * (tgm_view): q, k, v (and the backward's dy) are read where they are, and
 * a result may be written inside another value's buffer (layout.c). */
static int strided_result(const Node *n) { return n->op == OP_ATTENTION || n->op == OP_ATTENTION_BACKWARD; }
static int strided_slot(const Node *c, int k) {
  return ((c->op == OP_ATTENTION || c->op == OP_ATTENTION_LSE) && k < 3) || (c->op == OP_ATTENTION_BACKWARD && k < 4);
}
/* A view that reads each element of its operand once (bijective). */
static int bijective(const Node *n) {
  return n->op == OP_TRANSPOSE || n->op == OP_PERMUTE || n->op == OP_RESHAPE || n->op == OP_SQUEEZE ||
         n->op == OP_UNSQUEEZE;
}

/* The consumers of node id: s->users[s->uoff[id] .. s->uoff[id + 1]). */
#define USERS(s, id) for (int u_ = (s)->uoff[id]; u_ < (s)->uoff[(id) + 1]; u_++)

/* Does every consumer of r read it as a strided value: loop work, views,
 * and the attention calls' strided operands (not GEMMs or other calls)? */
static int strided_readers(const S *s, const Node *r) {
  USERS(s, r->id) {
    const Node *c = s->users[u_];
    if (!is_call(c))
      continue;
    for (int k = 0; k < c->nin; k++)
      if (c->in[k] == r && !strided_slot(c, k))
        return 0;
  }
  return 1;
}

static int nusers(const S *s, const Node *n) { return s->uoff[n->id + 1] - s->uoff[n->id]; }

/* Up a chain of bijective views from v, each the only consumer of the one
 * before and not stored for another reason: the view at its end. */
static Node *chain_end(const S *s, const char *keep, Node *v) {
  while (nusers(s, v) == 1 && !keep[v->id]) {
    Node *c = s->users[s->uoff[v->id]];
    if (!bijective(c))
      break;
    v = c;
  }
  return v;
}

/* l, the layout of view w over chain end, run back down the chain to r. */
static int unview_to(const BPass *p, const Node *w, const Node *r, Layout *l) {
  for (const Node *v = w; v != r; v = v->in[0])
    if (!layout_unview(p, v, l))
      return 0;
  return 1;
}

/* Concat c (stored, not a pass result) as the host of its operands when
 * each is a chain of bijective views over an attention result of its own
 * (each view the only consumer of the one before): the results are placed
 * at their offsets in c's buffer, and the operands are no longer stored. */
static int place_concat(S *s, char *keep, const char *final, Node *c) {
  BPass *p = s->p;
  enum { MAXC = 4 * MAXRANK };
  Layout lc, ls[MAXC];
  Node *rs[MAXC];
  if (c->nin > MAXC)
    return 0;
  layout_contig(c, &lc);
  Dim at = dim_const(0);
  Loc none = {0, 0};
  for (int k = 0; k < c->nin; k++) {
    Node *x = c->in[k], *rk = x;
    while (bijective(rk) && (rk == x || (nusers(s, rk) == 1 && !keep[rk->id])))
      rk = rk->in[0]; /* down from the operand to the result its chain starts at */
    int ok = rk != x && strided_result(rk) && keep[rk->id] && !final[rk->id] && !p->place[rk->id] &&
             rk->dtype == c->dtype && strided_readers(s, rk) && nusers(s, x) == 1;
    for (int j = 0; ok && j < k; j++)
      ok = rs[j] != rk;
    ls[k] = lc;
    ls[k].off = dim_mul(at, lc.st[c->axis], none);
    if (!ok || !unview_to(p, x, rk, &ls[k]) || !layout_rows(p, rk, &ls[k]))
      return 0;
    rs[k] = rk;
    at = dim_add(at, x->shape.d[c->axis], none);
  }
  for (int k = 0; k < c->nin; k++) {
    p->place[rs[k]->id] = arena_alloc(s->a, sizeof(Layout));
    *p->place[rs[k]->id] = ls[k];
    keep[c->in[k]->id] = 0; /* read from the concat's buffer */
    p->why[c->in[k]->id] = NULL;
  }
  p->host[c->id] = 1;
  return 1;
}

/* Attention results written where their readers want them (their host's
 * buffer; layout.c): the result y of attention whose heads-first [B, NH,
 * T, D] a chain of transposes and reshapes turns into the [B, T, C] operand
 * of a GEMM (that operand is y's host); the gradients d_q, d_k, d_v whose
 * chains are the operands of one concat (the gradient of the split of qkv:
 * the concat is their host). A host has no kernel: the calls fill it. */
static void place_results(S *s, char *keep, const char *final) {
  BPass *p = s->p;
  for (int i = 0; i < p->n; i++) {
    Node *r = p->nodes[i];
    if (!strided_result(r) || !keep[i] || final[i] || p->place[i] || !strided_readers(s, r))
      continue;
    USERS(s, i) {
      Node *w0 = s->users[u_];
      if (p->place[i] || !bijective(w0))
        continue;
      Node *w = chain_end(s, keep, w0);
      Node *c = nusers(s, w) == 1 ? s->users[s->uoff[w->id]] : NULL;
      if (c && c->op == OP_CONCAT && keep[c->id] && !final[c->id] && !p->host[c->id] && c->dtype == r->dtype &&
          place_concat(s, keep, final, c))
        continue;
      Layout l;
      if (keep[w->id] && !final[w->id] && !p->host[w->id] && w->dtype == r->dtype) { /* the view is the host */
        layout_contig(w, &l);
        if (unview_to(p, w, r, &l) && layout_rows(p, r, &l) && !layout_is_contig(r, &l)) {
          p->place[i] = arena_alloc(s->a, sizeof(Layout));
          *p->place[i] = l;
          p->host[w->id] = 1;
        }
      }
    }
  }
}

/* Stored views that every reader can take as strides over the value they
 * view (the attention calls' q, k, v and dy; loop work computes a view from
 * its operand anyway) are not copied: that value is stored instead. A view
 * read across the training step's forward/backward boundary keeps its
 * value alive until the backward, so those go only where they cover their
 * value (GPT-2's q, k, v heads are the three thirds of qkv). */
static void view_operands(S *s, const char *final) {
  BPass *p = s->p;
  int64_t *cross = arena_alloc(s->a, sizeof(int64_t) * (size_t)(p->n + 1)); /* per base: bytes of views read across */
  char *cand = arena_alloc(s->a, (size_t)p->n + 1);
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < p->n; i++) {
      Node *v = p->nodes[i];
      if (pass == 0) {
        Layout l;
        if (!p->realized[i] || !layout_view1(v) || final[i] || p->host[i] || !strided_readers(s, v))
          continue;
        int call = 0, across = 0;
        USERS(s, i) {
          const Node *c = s->users[u_];
          call |= is_call(c);
          across |= i < p->nfwd && c->id >= p->nfwd;
        }
        const Node *b = layout_base(p, v);
        if (!call || b == v || !layout_of(p, v, &l) || !layout_rows(p, v, &l))
          continue;
        cand[i] = 1 + across;
        if (across)
          cross[b->id] += layout_bytes(p, v);
      } else if (cand[i]) {
        const Node *b = layout_base(p, v);
        if (cand[i] == 2 && cross[b->id] < layout_bytes(p, b))
          continue;
        p->realized[i] = 0;
        p->why[i] = NULL;
      }
    }
}

/* Do a and b read the same elements of memory in the same row-major order
 * (the same stored value, or views of it that are aliases)? */
static int same_memory(const BPass *p, const Node *a, const Node *b) {
  Layout la, lb;
  if (!layout_of(p, a, &la) || !layout_of(p, b, &lb) || la.host != lb.host || !dim_eq(&la.off, &lb.off))
    return 0;
  Dim na = dim_const(1), nb = dim_const(1);
  Loc none = {0, 0};
  for (int k = 0; k < a->shape.rank; k++)
    na = dim_mul(na, a->shape.d[k], none);
  for (int k = 0; k < b->shape.rank; k++)
    nb = dim_mul(nb, b->shape.d[k], none);
  la.off = lb.off = dim_const(0);
  return dim_eq(&na, &nb) && layout_is_contig(a, &la) && layout_is_contig(b, &lb);
}

/* A bias's gradient next to its weight's: sum(dy) over every dim but the
 * last, where a matmul after it (no epilogue, one batch) reads dy as its
 * transposed A, [K, M] = [rows, the last dim]: the GEMM call computes
 * the sum over k of op(A) too (the CUDA runtime's k_bgrad_cols, or
 * cuBLASLt's BGRADB epilogue; the CPU GEMM sums its operand), so the
 * schedule needs no kernel for it. bg[sum] = the GEMM: the first one in
 * node order that no earlier sum took. Linear: the candidate GEMMs are
 * listed by the stored value their A lies in (a sum can only match one
 * over its own operand's bytes), so each sum looks at a few. */
static int bias_grad_gemm(const BPass *p, int j, const Node **a) {
  Node *g = p->nodes[j];
  int ta;
  if (g->op != OP_MATMUL || !p->realized[j] || g->shape.rank != 2 || !gemm_strided(g))
    return 0;
  *a = gemm_operand(g, 0, &ta);
  return ta;
}

static int host_slot(const BPass *p, const Node *n) {
  Layout l;
  if (!layout_of(p, n, &l))
    return -1;
  return l.host && l.host->id >= 0 && l.host->id < p->n ? l.host->id : p->n;
}

static void claim_bias_grads(S *s, Node **epi, Node **bg) {
  BPass *p = s->p;
  size_t sz = sizeof(int) * (size_t)(p->n + 1);
  int *head = arena_alloc(s->a, sz), *tail = arena_alloc(s->a, sz), *next = arena_alloc(s->a, sz);
  char *taken = arena_alloc(s->a, (size_t)(p->n + 1));
  for (int i = 0; i <= p->n; i++)
    head[i] = tail[i] = next[i] = -1;
  for (int j = 0; j < p->n; j++) {
    const Node *a = NULL;
    int h;
    if (epi[4 * j] || epi[4 * j + 1] || !bias_grad_gemm(p, j, &a) || (h = host_slot(p, a)) < 0)
      continue;
    if (tail[h] < 0)
      head[h] = j;
    else
      next[tail[h]] = j;
    tail[h] = j;
  }
  for (int i = 0; i < p->n; i++) {
    Node *r = p->nodes[i];
    int rank = r->op == OP_SUM ? r->in[0]->shape.rank : 0, h;
    if (rank < 2 || r->axes != (1u << (rank - 1)) - 1 || !p->realized[i] || r->dtype != r->in[0]->dtype ||
        !dtype_is_float(r->dtype) || (h = host_slot(p, r->in[0])) < 0)
      continue;
    for (int j = head[h]; j >= 0 && j < i; j = next[j]) {
      Node *g = p->nodes[j];
      const Node *a = NULL;
      bias_grad_gemm(p, j, &a);
      if (!taken[j] && g->dtype == r->dtype && (j < p->nfwd) == (i < p->nfwd) &&
          dim_eq(&a->shape.d[1], &r->in[0]->shape.d[rank - 1]) && same_memory(p, a, r->in[0])) {
        bg[i] = g;
        taken[j] = 1;
        break;
      }
    }
  }
}

/* Values computed where their statistics are: a pointwise value V over a
 * reduction R's result space (a row's loss term: log(sum) + amax minus the
 * logit at the target) that also reads a larger stored value X which R's
 * own input reads (the logits) is stored, so that it becomes the epilogue of
 * R's kernel (the merge of a kernel over R's result space into R's), which
 * has X's row at hand, and not the prologue of a later kernel (the mean
 * over rows), which would read X once more and keep all of X alive until
 * it ran: X's last reader is then R's kernel, whose output may take X's
 * bytes (plan.c's in place). V costs one value per row; X is larger. Only
 * the last such value of a chain is stored (one with a reader that is not
 * such a value), and only where V, R and X are on the same side of the
 * training step's forward/backward boundary. Should the merge into R's
 * kernel not happen, V fuses into its reader as before and is kept in
 * registers there. Linear: one pass over the nodes, each carrying the
 * latest reduction and the largest stored value its inline cone loads. */
static void epilogue_values(S *s) {
  BPass *p = s->p;
  int *red = arena_alloc(s->a, sizeof(int) * (size_t)(p->n + 1)), *big = arena_alloc(s->a, sizeof(int) * (size_t)(p->n + 1));
  char *ok = arena_alloc(s->a, (size_t)p->n + 1);
  for (int i = 0; i < p->n; i++) {
    Node *n = p->nodes[i];
    red[i] = big[i] = -1;
    if (is_leaf(n) || is_call(n) || (p->realized[i] && !is_reduce(n)))
      continue;
    for (int k = 0; k < n->nin; k++) {
      const Node *x = n->in[k];
      if (!x || is_leaf(x))
        continue;
      int r = p->realized[x->id] ? (is_reduce(x) ? x->id : -1) : red[x->id];
      int b = p->realized[x->id] ? (is_reduce(x) ? -1 : x->id) : big[x->id];
      if (r > red[i])
        red[i] = r;
      if (b >= 0 && (big[i] < 0 || layout_bytes(p, p->nodes[b]) > layout_bytes(p, p->nodes[big[i]])))
        big[i] = b;
    }
    if (is_reduce(n)) { /* what its own kernel reads: its input's cone */
      const Node *x = n->in[0];
      red[i] = -1;
      big[i] = is_leaf(x) ? -1 : p->realized[x->id] ? x->id : big[x->id];
      continue;
    }
    if (p->realized[i] || red[i] < 0 || big[i] < 0 || !(op_info[n->op].cls == C_PW || n->op == OP_TAKE))
      continue;
    const Node *r = p->nodes[red[i]], *x = p->nodes[big[i]];
    Dim nv = numel_dim(p, &n->shape, 0, 0), nr = numel_dim(p, &r->shape, 0, 0);
    ok[i] = dim_eq(&nv, &nr) && big[r->id] == x->id && layout_bytes(p, x) > layout_bytes(p, n) &&
            (i < p->nfwd) == (r->id < p->nfwd) && (x->id < p->nfwd) == (r->id < p->nfwd);
  }
  for (int i = 0; i < p->n; i++) {
    int last = 0;
    USERS(s, i) last |= !ok[s->users[u_]->id];
    if (ok[i] && last) {
      p->realized[i] = 1;
      p->why[i] = arena_printf(s->a, "computed in the kernel of the reduction it reads (%%%d), which reads %%%d, so "
                                     "that its readers do not read %%%d (%lld bytes) again and keep it alive",
                               red[i], big[i], big[i], (long long)layout_bytes(p, p->nodes[big[i]]));
    }
  }
}

/* ---------------------------------------------------------------- the pass */

void schedule(BPass *p, int fuse) {
  S ss = {0}, *s = &ss;
  s->p = p;
  s->a = p->g->arena;
  p->fuse = fuse;
  p->realized = arena_alloc(s->a, (size_t)p->n + 1);
  p->nuse = arena_alloc(s->a, sizeof(int) * (size_t)(p->n + 1));
  p->kern = arena_alloc(s->a, sizeof(int) * (size_t)(p->n + 1));
  s->wp = walk_new(s->a, p->n);
  s->wp2 = walk_new(s->a, p->n);
  p->walk = walk_new(s->a, p->n);
  s->cut = arena_alloc(s->a, (size_t)p->n + 1);
  s->kid_at = arena_alloc(s->a, sizeof(int) * (size_t)(p->n + 1));
  s->idx_of = arena_alloc(s->a, sizeof(int) * (size_t)(p->n + 1));
  s->mj = arena_alloc(s->a, sizeof(int) * (size_t)(p->n + 1));
  s->saved = arena_alloc(s->a, sizeof(int) * (size_t)(p->n + 1));
  char *keep = arena_alloc(s->a, (size_t)p->n + 1); /* must stay stored */
  char *final = arena_alloc(s->a, (size_t)p->n + 1);
  p->place = arena_alloc(s->a, sizeof(Layout *) * (size_t)(p->n + 1));
  p->host = arena_alloc(s->a, (size_t)p->n + 1);
  s->uoff = arena_alloc(s->a, sizeof(int) * (size_t)(p->n + 2));
  for (int i = 0; i < p->n; i++)
    p->kern[i] = -1;
  for (int k = 0; k < p->nfinals; k++)
    final[p->finals[k]->id] = 1;
  /* the consumers, by node (one that reads a value twice, once) */
  for (int pass = 0; pass < 2; pass++) {
    int *fill = pass ? arena_alloc(s->a, sizeof(int) * (size_t)(p->n + 1)) : NULL;
    for (int i = 0; i < p->n; i++)
      for (int k = 0; k < p->nodes[i]->nin; k++) {
        Node *x = p->nodes[i]->in[k];
        int seen = 0;
        for (int j = 0; j < k && x; j++)
          seen |= p->nodes[i]->in[j] == x;
        if (!x || seen)
          continue;
        if (pass)
          s->users[s->uoff[x->id] + fill[x->id]++] = p->nodes[i];
        else
          s->uoff[x->id + 1]++;
      }
    if (!pass) {
      for (int i = 0; i < p->n; i++)
        s->uoff[i + 1] += s->uoff[i];
      s->users = arena_alloc(s->a, sizeof(Node *) * (size_t)(s->uoff[p->n] + 1));
    }
  }
  for (int i = 0; i < p->n; i++)
    for (int k = 0; k < p->nodes[i]->nin; k++)
      if (p->nodes[i]->in[k])
        p->nuse[p->nodes[i]->in[k]->id]++;
  const char **why = p->why = arena_alloc(s->a, sizeof(char *) * (size_t)(p->n + 1));
  for (int k = 0; k < p->nfinals; k++) {
    p->nuse[p->finals[k]->id]++;
    need(p, keep, p->finals[k], p->kind == PASS_FORWARD ? "an output" : k ? "a gradient" : "the loss");
  }
  /* values the backward reads from the forward part: saved */
  for (int i = p->nfwd; i < p->n; i++)
    for (int k = 0; k < p->nodes[i]->nin; k++)
      if (p->nodes[i]->in[k] && p->nodes[i]->in[k]->id < p->nfwd)
        need(p, keep, p->nodes[i]->in[k], "saved for the backward");
  char *kept = arena_alloc(s->a, (size_t)p->n + 1); /* results and saved values */
  memcpy(kept, keep, (size_t)p->n);
  Node **user = arena_alloc(s->a, sizeof(Node *) * (size_t)(p->n + 1)); /* the one consumer, if one */
  Node **act_user = arena_alloc(s->a, sizeof(Node *) * (size_t)(p->n + 1)); /* the first relu/gelu of it */
  int *pw_reads = arena_alloc(s->a, sizeof(int) * (size_t)(p->n + 1)); /* its pointwise readers in the backward */
  for (int i = 0; i < p->n; i++)
    for (int k = 0; k < p->nodes[i]->nin; k++)
      if (p->nodes[i]->in[k]) {
        Node *c = p->nodes[i], *x = c->in[k];
        user[x->id] = c;
        if ((c->op == OP_RELU || c->op == OP_GELU) && !act_user[x->id])
          act_user[x->id] = c;
        pw_reads[x->id] += op_info[c->op].cls == C_PW && c->id >= p->nfwd;
      }
  for (int i = 0; i < p->n; i++) {
    Node *n = p->nodes[i];
    if (is_call(n)) {
      need(p, keep, n, arena_printf(s->a, "the result of %s", op_info[n->op].name));
      for (int k = 0; k < n->nin; k++)
        if (n->in[k]) {
          int t;
          const Node *src = op_info[n->op].cls == C_GEMM ? gemm_operand(n, k, &t) : n->in[k];
          need(p, keep, src, n->op == OP_CONCAT ? "an operand of concat, which copies from memory"
                                                : arena_printf(s->a, "an operand of %s, a library call", op_info[n->op].name));
        }
    }
  }
  /* a GEMM's epilogue: an activation, then a residual add, each the sole
   * consumer of the value before it; the GEMM's store applies them. The
   * activation may instead read a product that is stored anyway (saved for
   * the backward, or read elsewhere): the store writes that product as well
   * (its aux). An activation's gradient (gelu_grad) with the product as its
   * dy reads its x in the store, x computed before the GEMM, unless another
   * pointwise op of the backward reads x (the recomputed activation, when
   * the partitioner saved only x): then one loop kernel reads x once for
   * both (GPT-2: 400 MB a layer instead of the epilogue's 300 and the
   * recomputation's 200). */
  Node **epi = arena_alloc(s->a, sizeof(Node *) * 4 * (size_t)(p->n + 1)); /* act, add, residual, aux */
  for (int i = 0; fuse && i < p->n; i++) {
    Node *n = p->nodes[i], *tail = n, **e = &epi[4 * i];
    if (op_info[n->op].cls != C_GEMM || !gemm_strided(n) || !dtype_is_float(n->dtype))
      continue;
    int sole = p->nuse[i] == 1 && !kept[i];
    Node *c = sole ? user[i] : act_user[i];
    if (c && (c->op == OP_RELU || c->op == OP_GELU) && c->dtype == n->dtype && (c->id < p->nfwd) == (i < p->nfwd)) {
      e[0] = c;
      e[3] = sole ? NULL : n;
      tail = c;
      c = p->nuse[c->id] == 1 && !kept[c->id] ? user[c->id] : NULL;
    } else if (sole && c && c->op == OP_GELU_GRAD && c->in[0] == n && c->in[1] != n && c->in[1]->id < n->id &&
               c->dtype == n->dtype && shape_eq(&c->shape, &n->shape) && shape_eq(&c->in[1]->shape, &n->shape) &&
               (c->id < p->nfwd || pw_reads[c->in[1]->id] == 1)) {
      e[0] = c;
      e[3] = c->in[1];
      tail = c;
      c = p->nuse[c->id] == 1 && !kept[c->id] ? user[c->id] : NULL;
    }
    if (c && c->op == OP_ADD && c->dtype == n->dtype && shape_eq(&c->in[0]->shape, &c->in[1]->shape) &&
        shape_eq(&c->shape, &tail->shape)) {
      Node *r = c->in[0] == tail ? c->in[1] : c->in[0];
      if (r != tail && r->id < n->id) { /* computed before the GEMM runs */
        e[1] = c;
        e[2] = r;
        tail = c;
      }
    }
    if (tail != n) {
      if (e[3] != n) {
        keep[i] = 0;
        why[i] = NULL;
      }
      if (e[3] && e[3] != n)
        need(p, keep, e[3], "the input of the activation gradient a GEMM's store applies");
      need(p, keep, tail, arena_printf(s->a, "the result of %s with its epilogue", op_info[n->op].name));
      if (e[2])
        need(p, keep, e[2], arena_printf(s->a, "the residual the %s's store adds", op_info[n->op].name));
      for (int k = 0; k < n->nin; k++) /* the operands stay stored */
        if (n->in[k]) {
          int t;
          need(p, keep, gemm_operand(n, k, &t),
               arena_printf(s->a, "an operand of %s, a library call", op_info[n->op].name));
        }
    }
  }
  if (fuse)
    place_results(s, keep, final);
  for (int i = 0; i < p->n; i++) {
    Node *n = p->nodes[i];
    if (is_leaf(n))
      continue;
    int pw = op_info[n->op].cls == C_PW || n->op == OP_TAKE;
    int cost;
    if (keep[i] || is_reduce(n) || (!fuse && op_info[n->op].cls != C_VIEW && n->nin)) {
      p->realized[i] = 1;
      if (!why[i])
        why[i] = is_reduce(n) ? "a reduction's result, read by another kernel" : "--no-fuse: every op's value is stored";
    } else if (pw && n->nin && p->nuse[i] > 1 && (cost = cone_cost(s, n, 0)) > 6) {
      p->realized[i] = 1;
      why[i] = arena_printf(s->a, "read %d times; recomputing its %d ops at each read costs more than a load", p->nuse[i], cost);
    }
  }
  if (fuse) {
    epilogue_values(s);
    view_operands(s, final);
  }
  /* a value computed inline is an expression over its kernel's loads; one
   * more than MAX_INLINE_DEPTH ops deep is stored, so that a long chain of
   * bindings gives kernels a compiler takes (and a renderer that recurses
   * over them a bounded depth) */
  int *depth = arena_alloc(s->a, sizeof(int) * (size_t)(p->n + 1));
  for (int i = 0; i < p->n; i++) {
    Node *n = p->nodes[i];
    if (is_leaf(n))
      continue;
    int d = 0;
    for (int k = 0; k < n->nin; k++)
      if (n->in[k] && !p->realized[n->in[k]->id] && depth[n->in[k]->id] > d)
        d = depth[n->in[k]->id];
    depth[i] = d + 1;
    if (!p->realized[i] && depth[i] > MAX_INLINE_DEPTH && n->nin) {
      p->realized[i] = 1;
      s->cut[i] = 1;
      why[i] = arena_printf(s->a, "its expression is %d ops deep (values are stored every %d ops of a chain)", depth[i],
                            MAX_INLINE_DEPTH);
    }
    if (p->realized[i])
      depth[i] = 0;
  }
  Node **bg = arena_alloc(s->a, sizeof(Node *) * (size_t)(p->n + 1));
  if (fuse)
    claim_bias_grads(s, epi, bg);
  /* a kernel per realized value; stored views of stored values are aliases */
  p->k = arena_alloc(s->a, sizeof(Kernel *) * (size_t)(p->n + 1));
  for (int i = 0; i < p->n; i++) {
    Node *n = p->nodes[i];
    if (!p->realized[i] || epi[4 * i + 3] == n || p->host[i] || bg[i]) /* a GEMM's aux or bias gradient: its
                                                                          kernel stores it; a host: the values
                                                                          placed in it */
      continue;
    Layout l;
    if (layout_alias(p, n, &l)) { /* its bytes are the stored value's (plan.c), which stays stored */
      const Node *b = layout_base(p, n->in[0]);
      if (!keep[b->id] && p->why[i])
        p->why[b->id] = arena_printf(s->a, "%s, through a view", p->why[i]);
      keep[b->id] = 1;
      continue;
    }
    Kernel *sib = NULL; /* an earlier call this one's runtime call computes too */
    int att = n->op == OP_ATTENTION || n->op == OP_ATTENTION_LSE || n->op == OP_ATTENTION_BACKWARD;
    for (int c = p->nk - 1; att && c >= 0 && !sib; c--)
      if (p->k[c]->kind == K_EXTERN && same_call(p->k[c]->anchor, n))
        sib = p->k[c];
    if (sib) {
      Node **o = arena_alloc(s->a, sizeof(Node *) * (size_t)(sib->nouts + 1));
      if (sib->nouts)
        memcpy(o, sib->outs, sizeof(Node *) * (size_t)sib->nouts);
      o[sib->nouts++] = n;
      sib->outs = o;
      p->kern[i] = p->kern[sib->anchor->id];
      continue;
    }
    KernelKind kind = op_info[n->op].cls == C_GEMM ? K_GEMM : op_info[n->op].cls == C_EXTERN ? K_EXTERN : K_LOOP;
    p->kern[i] = s->kid_at[p->nk] = s->idx_of[p->nk] = p->nk;
    p->k[p->nk++] = new_kernel(s, kind, n);
  }
  /* GEMM epilogues: the tail (and the aux it stores) is stored by the GEMM's kernel */
  for (int i = 0; i < p->n; i++) {
    Node **e = &epi[4 * i];
    if (!e[0] && !e[1])
      continue;
    Node *tail = e[1] ? e[1] : e[0];
    int c = kidx(s, tail->id);
    Kernel *k = p->k[c];
    k->kind = K_GEMM;
    k->anchor = p->nodes[i];
    k->act = e[0];
    k->add = e[1];
    k->res = e[2];
    k->aux = e[3];
    k->nreds = 0;
    if (e[3] == p->nodes[i]) {
      Node **o = arena_alloc(s->a, sizeof(Node *) * 2);
      o[0] = tail;
      o[1] = e[3];
      k->outs = o;
      k->nouts = 2;
      p->kern[i] = p->kern[tail->id];
    }
  }
  for (int i = 0; i < p->n; i++) /* bias gradients: stored by their GEMM's kernel */
    if (bg[i]) {
      Kernel *k = p->k[kidx(s, bg[i]->id)];
      Node **o = arena_alloc(s->a, sizeof(Node *) * 2);
      o[0] = k->outs[0];
      o[1] = p->nodes[i];
      k->outs = o;
      k->nouts = 2;
      k->bgrad = p->nodes[i];
      p->kern[i] = p->kern[bg[i]->id];
    }
  if (fuse) {
    /* debugging aid: TGEN_FUSE_LIMIT=N allows only the train pass's first N
     * merges, to bisect a wrong result to the merge that made it */
    int limit = getenv("TGEN_FUSE_LIMIT") ? atoi(getenv("TGEN_FUSE_LIMIT")) : 1 << 30, merges = 0;
    for (int j = 1; j < p->nk; j++)
      for (int i = j - 1; i >= 0 && i >= j - 64 && (p->kind != PASS_TRAIN || merges < limit); i--)
        if (!merge(s, i, j, 1)) {
          merges++;
          j = i - 1; /* the merged kernel may join an earlier one, and take more */
          break;
        }
    /* a bias's gradient that a GEMM's store took (on CUDA k_bgrad_cols or
     * cuBLASLt's BGRADB: a kernel of its own, reading dy again) rides instead the row kernel that
     * stores dy, where it can (a residual's gradient out of a layer norm's
     * backward: the attention and MLP projections' biases in GPT-2) */
    for (int c = 0; c < p->nk; c++) {
      Kernel *g = p->k[c];
      if (g->kind != K_GEMM || !g->bgrad)
        continue;
      Node *b = g->bgrad;
      int x = kidx(s, b->in[0]->id);
      if (x < 0 || x >= c || p->k[x]->kind != K_LOOP)
        continue;
      Kernel *r = p->k[x], *was = r, col = {0}, host;
      Node *one[1] = {b};
      col.kind = K_LOOP;
      col.reds = col.outs = one;
      col.nreds = col.nouts = 1;
      col.full = b->in[0]->shape;
      col.axes = b->axes;
      col.outer = numel_dim(p, &col.full, col.axes, 0);
      if (host_rows(p, r, &col, &host)) /* a pointwise kernel, as rows */
        r = &host;
      if (!rider_fit(p, r, &col))
        continue;
      Node **cols = arena_alloc(s->a, sizeof(Node *) * (size_t)(r->ncols + 1));
      Node **outs = arena_alloc(s->a, sizeof(Node *) * (size_t)(r->nouts + 1));
      if (r->ncols) /* (a kernel with none may have no array: memcpy's pointers must not be NULL) */
        memcpy(cols, r->cols, sizeof(Node *) * (size_t)r->ncols);
      if (r->nouts)
        memcpy(outs, r->outs, sizeof(Node *) * (size_t)r->nouts);
      Kernel *m = arena_alloc(s->a, sizeof(Kernel));
      *m = *r;
      m->cols = cols, m->outs = outs;
      m->cols[m->ncols++] = b;
      m->outs[m->nouts++] = b;
      p->k[x] = m;
      p->kern[b->id] = s->kid_at[x];
      if (render_check(p, m)) { /* as it was */
        p->k[x] = was;
        p->kern[b->id] = s->kid_at[c];
        continue;
      }
      g->bgrad = NULL;
      g->nouts = 1;
    }
    /* stored values only their own kernel reads: kept in registers (the
     * kernel that reads each value: rd, -2 when several do) */
    int *rd = s->saved;
    for (int q = 0; q < p->n; q++)
      rd[q] = -1;
    for (int m = 0; m < p->nk; m++) {
      loads(s, p->k[m]);
      for (int q = 0; q < s->wp->nlist; q++) {
        int id = s->wp->list[q];
        rd[id] = rd[id] == -1 || rd[id] == m ? m : -2;
      }
    }
    for (int c = 0; c < p->nk; c++) {
      Kernel *k = p->k[c];
      if (k->kind != K_LOOP)
        continue;
      for (int q = 0; q < k->nouts; q++) {
        Node *n = k->outs[q];
        if (keep[n->id] || s->cut[n->id])
          continue;
        int other = rd[n->id] != -1 && rd[n->id] != c;
        if (!other) {
          p->realized[n->id] = 0;
          p->kern[n->id] = -1;
          k->outs[q] = k->outs[--k->nouts];
          if (render_check(p, k)) { /* it must stay stored after all */
            k->outs[k->nouts++] = k->outs[q];
            k->outs[q] = n;
            p->realized[n->id] = 1;
            p->kern[n->id] = s->kid_at[c];
            why[n->id] = "its kernel reads it at other elements than its own (a loop cannot keep it in registers)";
          } else {
            q--;
          }
        }
      }
    }
  }
  /* why each kernel boundary is one (tgen explain): kernel c + 1 does not
   * fuse into kernel c */
  for (int c = 0; c + 1 < p->nk; c++)
    p->k[c]->stop = !fuse ? "--no-fuse (or compile.fuse: false): one kernel per op"
                          : merge(s, c, c + 1, 0);
  for (int c = 0; c + 1 < p->nk; c++)
    if (!p->k[c]->stop) /* the greedy pass merged otherwise (or TGEN_FUSE_LIMIT stopped it) */
      p->k[c]->stop = "none: the two could fuse, but the greedy fusion pass did not merge them";
  for (int i = 0; i < p->n; i++) /* kernel ids to the kernels' indices */
    p->kern[i] = kidx(s, i);
}

/* ---------------------------------------------------------------- dump */

void dump_pass(const BPass *p, int after, Buf *b) {
  Graph *g = p->g;
  buf_printf(b, "pass %s: %d nodes (forward part %d)\n", pass_names[p->kind], p->n, p->nfwd);
  for (int i = 0; i < p->n; i++) {
    const Node *n = p->nodes[i];
    buf_printf(b, "  %%%d = %s(", i, op_info[n->op].name);
    for (int k = 0; k < n->nin; k++)
      buf_printf(b, "%s%s", k ? ", " : "", n->in[k] ? arena_printf(g->arena, "%%%d", n->in[k]->id) : "none");
    buf_printf(b, ") : %s%s", dtype_names[n->dtype], shape_str(g, &n->shape));
    if (after >= 1 && p->realized[i])
      buf_printf(b, "  stored by k%d", p->kern[i] + 1);
    if (after >= 2 && p->buf && p->buf[i] >= 0) {
      const Buffer *x = &p->b[p->buf[i]];
      static const char *const homes[] = {"arena", "input", "param", "gradient", "output", "alias",
                                           "input gradient"};
      buf_printf(b, "  -> %s (%s", x->name, homes[x->home]);
      if (x->home == HOME_ARENA)
        buf_printf(b, " +%lld, %lld bytes, kernels %d..%d", (long long)x->offset, (long long)x->bytes, x->first + 1,
                   x->last + 1);
      if (x->home == HOME_ARENA && x->inplace >= 0)
        buf_printf(b, ", in place of %s", p->b[x->inplace].name);
      buf_printf(b, ")");
    }
    buf_printf(b, "  # %s @%d\n", n->name ? n->name : "", n->loc.line);
  }
  if (after < 1)
    return;
  static const char *const kinds[] = {"loop", "gemm", "call", "concat"};
  for (int c = 0; c < p->nk; c++) {
    const Kernel *k = p->k[c];
    buf_printf(b, "  k%d %s:", c + 1, kinds[k->kind]);
    for (int i = 0; i < k->nouts; i++)
      buf_printf(b, " %%%d", k->outs[i]->id);
    if (k->nreds) {
      buf_printf(b, "  reduces");
      for (int i = 0; i < k->nreds; i++)
        buf_printf(b, " %%%d", k->reds[i]->id);
      buf_printf(b, " over %s of %s", c_dim(g, &k->rnum), shape_str(g, &k->full));
    }
    if (k->ncols) {
      buf_printf(b, "  and sums");
      for (int i = 0; i < k->ncols; i++)
        buf_printf(b, " %%%d", k->cols[i]->id);
      buf_printf(b, " over its rows (riders)");
    }
    if (k->stop)
      buf_printf(b, "  (not fused with the next: %s)", k->stop);
    buf_printf(b, "\n");
  }
  if (after >= 2)
    buf_printf(b, "  arena: %lld bytes at the dims' maxima\n", (long long)p->arena);
}
