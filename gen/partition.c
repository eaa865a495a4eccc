/* partition.c: the training schedule. Which forward values are SAVED (computed
 * in the forward pass and kept until the backward) and which the backward
 * RECOMPUTES, and the one execution order the emitter prints.
 *
 * After autodiff, g->nodes[0..nforward) are the forward graph and the rest its
 * backward. Three strategies (compile.remat):
 *
 *   save-all       PyTorch's default_partition: every forward value a backward
 *                  node reads is saved.
 *   recompute-all  nothing is saved; the backward recomputes every forward
 *                  value it needs from the params and inputs.
 *   min-cut        PyTorch's min_cut_rematerialization_partition
 *                  (ALGORITHMS.md §1): a minimum cut of the forward graph
 *                  between "computed in the forward" and "needed by the
 *                  backward", each node costing its bytes weighted by its
 *                  distance from the backward, with some ops banned from
 *                  recomputation (matmuls, attention, random ops, losses,
 *                  reductions that shrink their input 4x or more).
 *
 * Node kinds: params and inputs are always available (never saved, never
 * counted); const/full/arange are free to recompute (never saved); views
 * (reshape, squeeze, unsqueeze, a cast to the same dtype) alias their
 * operand's buffer in the emitted code, so a view is never saved itself: its
 * base is, and the view is recomputed in the backward at no cost.
 *
 * The network (min-cut): every forward node v that is neither a leaf nor free
 * becomes v_in -> v_out with capacity w(v) (views: infinite, so never cut);
 * each use of v by a forward node u is v_out -> u_in (infinite); a value a
 * backward node reads gets v_out -> sink (infinite); a banned node gets
 * source -> v_in (infinite). After max-flow (Dinic), v is saved iff v_in is
 * reachable from the source in the residual graph and v_out is not. The
 * schedule then drops saved values the backward never reads.
 *
 * w(v) = 11 * bytes * 1.1^(d - 1), d = clamp(dist_from_bw, 1, 100): PyTorch's
 * bytes * 1.1^d scaled by 10 so that d = 1 is exact in integers (which makes
 * min-cut never save more bytes than save-all). dist_from_bw is 0 for backward
 * nodes and 1 + the minimum over a node's users otherwise, except that a view
 * adds nothing (it is its base's buffer).
 *
 * Memory budget (min-cut only; the other strategies ignore it): when the
 * saved bytes exceed it the bans are relaxed step by step (1: no reduction
 * ban; 2: the largest saved banned ops made recomputable one at a time; 3:
 * everything recomputable but dropout) and finally recompute-all is used; if
 * none fits, the smallest is kept and met_budget is 0. */
#include "ir.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INF ((int64_t)1 << 62)

enum { K_LEAF, K_FREE, K_VIEW, K_OP }; /* how a forward node is treated */

/* The partitioner's working state: per-node facts and scratch arrays (malloc'd,
 * freed by part_free). */
typedef struct Part {
  const Graph *g;
  int nf, n;         /* forward nodes, all nodes */
  char *kind;        /* [nf] K_* */
  int64_t *bytes;    /* [nf] at the symbol values */
  char *bwuse;       /* [nf] read by a backward node, or a gradient itself */
  int *dist;         /* [nf] dist_from_bw, clamped to [1, 100] */
  char *need;        /* [n] backward nodes the gradients need */
  /* schedule scratch */
  char *inbw, *used, *mark; /* [n] */
  int *stack, *stackk;      /* [n] DFS: node, next operand */
  int *bw;                  /* [n] the backward part being built */
  int *order;               /* [2n] the schedule */
  char *unban;              /* [nf] budget search: banned ops allowed to be recomputed */
  int nunban;
} Part;

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (errlen)
    vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}

static const char *nname(const Node *n) { return n->name ? n->name : "?"; }

/* ---------------------------------------------------------------- node facts */

static int node_kind(const Node *n) {
  switch (n->op) {
  case OP_INPUT: case OP_PARAM:
    return K_LEAF;
  case OP_CONST: case OP_FULL: case OP_ZEROS: case OP_ONES: case OP_ARANGE:
    return K_FREE;
  case OP_RESHAPE: case OP_SQUEEZE: case OP_UNSQUEEZE:
    return K_VIEW;
  case OP_CAST:
    return n->in[0]->dtype == n->dtype ? K_VIEW : K_OP;
  default:
    return K_OP;
  }
}

/* The ops min-cut may recompute (the allowlist): pointwise, shape ops,
 * reductions, softmax and norms, creation. Everything else (matmul, linear,
 * attention, embedding, dropout, the losses) is computed once and saved. */
static int recomputable(Op op) {
  switch (op) {
  case OP_NEG: case OP_ABS: case OP_EXP: case OP_LOG: case OP_SQRT: case OP_RSQRT: case OP_SIN:
  case OP_COS: case OP_TANH: case OP_SIGMOID: case OP_RELU: case OP_SILU: case OP_ERF: case OP_SQUARE:
  case OP_RECIPROCAL: case OP_GELU:
  case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_POW: case OP_MAXIMUM: case OP_MINIMUM:
  case OP_GT: case OP_GE: case OP_LT: case OP_LE: case OP_EQ: case OP_NE: case OP_WHERE: case OP_CLAMP:
  case OP_CAST:
  case OP_SUM: case OP_MEAN: case OP_AMAX: case OP_VAR: case OP_LOGSUMEXP:
  case OP_SOFTMAX: case OP_LOG_SOFTMAX: case OP_LAYER_NORM: case OP_RMS_NORM:
  case OP_RESHAPE: case OP_TRANSPOSE: case OP_PERMUTE: case OP_CONCAT: case OP_SLICE: case OP_UNSQUEEZE:
  case OP_SQUEEZE: case OP_BROADCAST_TO:
  case OP_ARANGE: case OP_ZEROS: case OP_ONES: case OP_FULL: case OP_CONST:
    return 1;
  default:
    return 0;
  }
}

static int is_reduction(Op op) {
  return op == OP_SUM || op == OP_MEAN || op == OP_AMAX || op == OP_VAR || op == OP_LOGSUMEXP;
}

/* Whether min-cut must not recompute forward node i at relaxation `level`
 * (0: all bans; 1: no reduction ban; 2: only random ops banned). */
static int banned(const Part *P, int i, int level) {
  const Node *n = P->g->nodes[i];
  if (level >= 2 || (P->unban && P->unban[i]))
    return n->op == OP_DROPOUT;
  if (!recomputable(n->op))
    return 1;
  if (level == 0 && is_reduction(n->op)) {
    /* output bytes * 4 < input bytes (a reduction to statistics): save them */
    int64_t in = P->bytes[n->in[0]->id];
    return in > 0 && P->bytes[i] <= (in - 1) / 4;
  }
  return 0;
}

/* The buffer a forward value lives in: the first non-view down its operands. */
static int base_of(const Part *P, int i) {
  while (P->kind[i] == K_VIEW)
    i = P->g->nodes[i]->in[0]->id;
  return i;
}

static void part_free(Part *P) {
  free(P->kind);
  free(P->bytes);
  free(P->bwuse);
  free(P->dist);
  free(P->need);
  free(P->inbw);
  free(P->used);
  free(P->mark);
  free(P->stack);
  free(P->stackk);
  free(P->bw);
  free(P->order);
}

/* Fills the per-node facts; 0, or -1 with err. */
static int part_init(Part *P, const Graph *g, const int64_t *sym, char *err, size_t errlen) {
  int nf = g->nforward, n = g->nnodes;
  P->g = g;
  P->nf = nf;
  P->n = n;
  size_t un = (size_t)n + 1;
  P->kind = calloc(un, 1);
  P->bytes = calloc(un, sizeof(int64_t));
  P->bwuse = calloc(un, 1);
  P->dist = calloc(un, sizeof(int));
  P->need = calloc(un, 1);
  P->inbw = calloc(un, 1);
  P->used = calloc(un, 1);
  P->mark = calloc(un, 1);
  P->stack = calloc(un, sizeof(int));
  P->stackk = calloc(un, sizeof(int));
  P->bw = calloc(un, sizeof(int));
  P->order = calloc(2 * un, sizeof(int));
  if (!P->kind || !P->bytes || !P->bwuse || !P->dist || !P->need || !P->inbw || !P->used || !P->mark ||
      !P->stack || !P->stackk || !P->bw || !P->order)
    return fail(err, errlen, "partition: out of memory");
  for (int i = 0; i < n; i++) {
    const Node *x = g->nodes[i];
    if (x->id != i)
      return fail(err, errlen, "partition: internal error: node %d has id %d", i, x->id);
    for (int k = 0; k < x->nin; k++)
      if (x->in[k] && (x->in[k]->id < 0 || x->in[k]->id >= i))
        return fail(err, errlen, "partition: internal error: %s '%s' reads a later node", op_info[x->op].name,
                    nname(x));
  }
  for (int i = 0; i < nf; i++) {
    const Node *x = g->nodes[i];
    Tensor t;
    char e[256];
    if (!concrete_shape(g, &x->shape, sym, &t, e, sizeof e))
      return fail(err, errlen, "partition: %s '%s': %s", op_info[x->op].name, nname(x), e);
    int64_t sz = dtype_size(x->dtype);
    if (__builtin_mul_overflow(t.numel, sz, &P->bytes[i]))
      return fail(err, errlen, "partition: %s '%s': size overflows", op_info[x->op].name, nname(x));
    P->kind[i] = (char)node_kind(x);
    P->dist[i] = 1000;
  }
  /* backward users; the backward nodes the gradients need */
  for (int k = 0; k < g->ngrads; k++) {
    if (!g->grads[k])
      return fail(err, errlen, "partition: internal error: gradient %d has no node", k);
    int id = g->grads[k]->id;
    if (id < nf) {
      P->bwuse[id] = 1;
      P->dist[id] = 1;
    } else {
      P->need[id] = 1;
    }
  }
  for (int i = n - 1; i >= nf; i--) {
    const Node *x = g->nodes[i];
    for (int k = 0; k < x->nin; k++) {
      const Node *o = x->in[k];
      if (!o)
        continue;
      if (o->id >= nf)
        P->need[o->id] |= P->need[i];
      else
        P->bwuse[o->id] = 1;
    }
  }
  /* dist_from_bw: users have larger ids, so one reverse sweep */
  for (int i = n - 1; i >= 0; i--) {
    const Node *x = g->nodes[i];
    int d = i >= nf ? 1 : P->dist[i] + (P->kind[i] == K_VIEW ? 0 : 1);
    for (int k = 0; k < x->nin; k++)
      if (x->in[k] && x->in[k]->id < nf && d < P->dist[x->in[k]->id])
        P->dist[x->in[k]->id] = d;
  }
  for (int i = 0; i < nf; i++)
    P->dist[i] = P->dist[i] < 1 ? 1 : P->dist[i] > 100 ? 100 : P->dist[i];
  return 0;
}

/* ---------------------------------------------------------------- the schedule */

/* Whether forward value i is there for the backward without computing it. */
static int available(const Part *P, const char *saved, int i) { return P->kind[i] == K_LEAF || saved[i]; }

/* Appends forward node v to the backward part bw[*len], after the forward
 * values it needs that are neither available nor placed yet (depth-first, so
 * each lands just before its first use). Marks the saved values read. */
static void place(Part *P, const char *saved, int v, int *bw, int *len) {
  const Graph *g = P->g;
  if (saved[v])
    P->used[v] = 1;
  if (available(P, saved, v) || P->inbw[v])
    return;
  int top = 0;
  P->stack[top] = v;
  P->stackk[top++] = 0;
  while (top) {
    int u = P->stack[top - 1];
    const Node *x = g->nodes[u];
    if (P->stackk[top - 1] < x->nin) {
      const Node *o = x->in[P->stackk[top - 1]++];
      if (!o)
        continue;
      if (saved[o->id])
        P->used[o->id] = 1;
      if (!available(P, saved, o->id) && !P->inbw[o->id]) {
        P->stack[top] = o->id;
        P->stackk[top++] = 0;
      }
      continue;
    }
    top--;
    P->inbw[u] = 1;
    bw[(*len)++] = u;
  }
}

/* The schedule for the saved set `saved` into P->order: the forward part
 * [0, *nfwd), the backward part [*nfwd, *len). Saved values the backward
 * never reads are dropped from `saved`. Returns the saved bytes. */
static int64_t train_order(Part *P, char *saved, int *nfwd, int *len) {
  const Graph *g = P->g;
  int nf = P->nf, n = P->n, nb = 0, nw = 0;
  memset(P->inbw, 0, (size_t)n);
  memset(P->used, 0, (size_t)n);
  memset(P->mark, 0, (size_t)n);
  /* the backward part first: it decides which saved values are read */
  for (int i = nf; i < n; i++) {
    if (!P->need[i])
      continue;
    const Node *x = g->nodes[i];
    for (int k = 0; k < x->nin; k++)
      if (x->in[k] && x->in[k]->id < nf)
        place(P, saved, x->in[k]->id, P->bw, &nb);
    P->bw[nb++] = i;
  }
  for (int k = 0; k < g->ngrads; k++)
    if (g->grads[k]->id < nf)
      place(P, saved, g->grads[k]->id, P->bw, &nb);
  int64_t bytes = 0;
  for (int i = 0; i < nf; i++) {
    saved[i] = (char)(saved[i] && P->used[i]);
    bytes += saved[i] ? P->bytes[i] : 0;
  }
  /* the forward part: what the loss and the saved values need, in graph order */
  P->mark[g->loss->id] = 1;
  for (int i = nf - 1; i >= 0; i--) {
    if (!P->mark[i] && !saved[i])
      continue;
    P->mark[i] = 1;
    const Node *x = g->nodes[i];
    for (int k = 0; k < x->nin; k++)
      if (x->in[k])
        P->mark[x->in[k]->id] = 1;
  }
  for (int i = 0; i < nf; i++)
    if (P->mark[i])
      P->order[nw++] = i;
  memcpy(P->order + nw, P->bw, sizeof(int) * (size_t)nb);
  *nfwd = nw;
  *len = nw + nb;
  return bytes;
}

/* ---------------------------------------------------------------- strategies */

/* save-all: every value a backward node reads (a view's base in its place). */
static void choose_save_all(const Part *P, char *saved) {
  memset(saved, 0, (size_t)P->nf);
  for (int i = 0; i < P->nf; i++)
    if (P->bwuse[i]) {
      int b = base_of(P, i);
      if (P->kind[b] == K_OP)
        saved[b] = 1;
    }
}

/* The flow network: edges in pairs (e, e ^ 1), adjacency lists through next. */
typedef struct Net {
  int nv, ne;
  int *head, *next, *to;
  int64_t *cap; /* residual capacity */
  int *level, *it, *queue, *path;
} Net;

static void net_free(Net *N) {
  free(N->head);
  free(N->next);
  free(N->to);
  free(N->cap);
  free(N->level);
  free(N->it);
  free(N->queue);
  free(N->path);
}

static void add_edge(Net *N, int u, int v, int64_t c) {
  int e = N->ne;
  N->to[e] = v, N->cap[e] = c, N->next[e] = N->head[u], N->head[u] = e;
  N->to[e + 1] = u, N->cap[e + 1] = 0, N->next[e + 1] = N->head[v], N->head[v] = e + 1;
  N->ne += 2;
}

/* Levels from s in the residual graph (-1: unreachable); whether t is reached. */
static int bfs(Net *N, int s, int t) {
  int qh = 0, qt = 0;
  for (int v = 0; v < N->nv; v++)
    N->level[v] = -1;
  N->level[s] = 0;
  N->queue[qt++] = s;
  while (qh < qt) {
    int u = N->queue[qh++];
    for (int e = N->head[u]; e >= 0; e = N->next[e])
      if (N->cap[e] > 0 && N->level[N->to[e]] < 0) {
        N->level[N->to[e]] = N->level[u] + 1;
        N->queue[qt++] = N->to[e];
      }
  }
  return N->level[t] >= 0;
}

/* Dinic's max-flow from s to t: blocking flows along the BFS levels, each
 * augmenting path found by an iterative walk (dead ends leave the level
 * graph). Only the residual graph is wanted, not the flow's value. */
static void max_flow(Net *N, int s, int t) {
  while (bfs(N, s, t)) {
    for (int v = 0; v < N->nv; v++)
      N->it[v] = N->head[v];
    int v = s, top = 0;
    for (;;) {
      if (v == t) {
        int64_t f = INF;
        for (int k = 0; k < top; k++)
          f = N->cap[N->path[k]] < f ? N->cap[N->path[k]] : f;
        for (int k = 0; k < top; k++) {
          N->cap[N->path[k]] -= f;
          N->cap[N->path[k] ^ 1] += f;
        }
        v = s, top = 0;
        continue;
      }
      int e;
      for (e = N->it[v]; e >= 0; e = N->next[e])
        if (N->cap[e] > 0 && N->level[N->to[e]] == N->level[v] + 1)
          break;
      N->it[v] = e;
      if (e >= 0) {
        N->path[top++] = e;
        v = N->to[e];
      } else if (top == 0) {
        break;
      } else {
        N->level[v] = -1; /* dead end */
        v = N->to[N->path[--top] ^ 1];
      }
    }
  }
}

/* min-cut at relaxation `level` into saved; 0, or -1 out of memory. */
static int choose_min_cut(const Part *P, int level, char *saved) {
  const Graph *g = P->g;
  int nf = P->nf, nedges = 0, s = 2 * nf, t = 2 * nf + 1;
  for (int i = 0; i < nf; i++)
    nedges += 3 + g->nodes[i]->nin;
  Net N = {0};
  N.nv = 2 * nf + 2;
  size_t ue = 2 * (size_t)nedges + 2, uv = (size_t)N.nv;
  N.head = malloc(sizeof(int) * uv);
  N.next = malloc(sizeof(int) * ue);
  N.to = malloc(sizeof(int) * ue);
  N.cap = malloc(sizeof(int64_t) * ue);
  N.level = malloc(sizeof(int) * uv);
  N.it = malloc(sizeof(int) * uv);
  N.queue = malloc(sizeof(int) * uv);
  N.path = malloc(sizeof(int) * uv);
  if (!N.head || !N.next || !N.to || !N.cap || !N.level || !N.it || !N.queue || !N.path) {
    net_free(&N);
    return -1;
  }
  for (int v = 0; v < N.nv; v++)
    N.head[v] = -1;
  /* each finite capacity at most INF / 4 / nf: the total flow stays below INF / 4 */
  int64_t wmax = INF / 4 / (nf + 1);
  for (int i = 0; i < nf; i++) {
    const Node *x = g->nodes[i];
    if (P->kind[i] == K_LEAF || P->kind[i] == K_FREE)
      continue;
    int64_t w = INF;
    if (P->kind[i] == K_OP) {
      double wd = 11.0 * (double)P->bytes[i] * pow(1.1, P->dist[i] - 1);
      w = wd >= (double)wmax ? wmax : (int64_t)llround(wd);
      if (banned(P, i, level))
        add_edge(&N, s, 2 * i, INF);
    }
    add_edge(&N, 2 * i, 2 * i + 1, w);
    for (int k = 0; k < x->nin; k++) {
      const Node *o = x->in[k];
      if (o && (P->kind[o->id] == K_VIEW || P->kind[o->id] == K_OP))
        add_edge(&N, 2 * o->id + 1, 2 * i, INF);
    }
    if (P->bwuse[i])
      add_edge(&N, 2 * i + 1, t, INF);
  }
  max_flow(&N, s, t);
  bfs(&N, s, t); /* reachability from the source in the residual graph */
  for (int i = 0; i < nf; i++)
    saved[i] = (char)(P->kind[i] == K_OP && N.level[2 * i] >= 0 && N.level[2 * i + 1] < 0);
  net_free(&N);
  return 0;
}

/* ---------------------------------------------------------------- the pass */

/* min-cut within `budget` (-1 none): the bans relaxed step by step, then
 * recompute-all; the first saved set that fits, else the smallest, into
 * saved with its step in *relax:
 *   0  all bans
 *   1  without the reduction ban
 *   2  also banned ops allowed to be recomputed one at a time, the largest
 *      saved one first (a greedy stand-in for PyTorch's knapsack; the count
 *      is P->nunban)
 *   3  everything but dropout recomputable
 *   4  recompute-all
 * 0, or -1 out of memory. */
static int choose_within_budget(Part *P, int64_t budget, char *saved, int *relax) {
  int nf = P->nf, nfwd, len;
  int64_t best_bytes = -1;
  char *best = malloc((size_t)nf + 1);
  P->unban = calloc((size_t)nf + 1, 1);
  P->nunban = 0;
  if (!best || !P->unban) {
    free(best);
    free(P->unban);
    P->unban = NULL;
    return -1;
  }
  int rc = 0, nunban_best = 0;
  for (int level = 0; level <= 4; level++) {
    for (int more = 1; more;) {
      more = 0;
      if (level == 4)
        memset(saved, 0, (size_t)nf);
      else if (choose_min_cut(P, level == 2 ? 1 : level, saved)) {
        rc = -1;
        goto done;
      }
      int64_t bytes = train_order(P, saved, &nfwd, &len);
      if (best_bytes < 0 || bytes < best_bytes) {
        best_bytes = bytes;
        *relax = level;
        nunban_best = P->nunban;
        memcpy(best, saved, (size_t)nf);
      }
      if (budget < 0 || bytes <= budget)
        goto done;
      if (level == 2) { /* allow the largest saved banned op (not dropout) to be recomputed */
        int pick = -1;
        for (int i = 0; i < nf; i++)
          if (saved[i] && !P->unban[i] && P->g->nodes[i]->op != OP_DROPOUT && banned(P, i, 1) &&
              (pick < 0 || P->bytes[i] > P->bytes[pick]))
            pick = i;
        if (pick >= 0) {
          P->unban[pick] = 1;
          P->nunban++;
          more = 1;
        }
      }
    }
  }
done:
  memcpy(saved, best, (size_t)nf);
  P->nunban = nunban_best;
  free(best);
  free(P->unban);
  P->unban = NULL;
  return rc;
}

int partition(const Graph *g, Remat r, int64_t budget, const int64_t *sym, Plan *p, char *err, size_t errlen) {
  memset(p, 0, sizeof *p);
  if (!g->loss || !g->grads || g->nforward <= 0 || g->nforward > g->nnodes)
    return fail(err, errlen, "partition: the graph has no backward (autodiff has not run)");
  if (r != REMAT_MIN_CUT && r != REMAT_SAVE_ALL && r != REMAT_RECOMPUTE_ALL)
    return fail(err, errlen, "partition: unknown remat strategy %d", (int)r);
  Part P = {0};
  int nf = g->nforward, nfwd, len, rc = -1;
  char *saved = calloc((size_t)nf + 1, 1);
  if (!saved)
    fail(err, errlen, "partition: out of memory");
  else if (part_init(&P, g, sym, err, errlen) == 0) {
    choose_save_all(&P, saved); /* the report's reference, whatever the strategy */
    p->saveall_bytes = train_order(&P, saved, &nfwd, &len);
    if (r == REMAT_RECOMPUTE_ALL)
      memset(saved, 0, (size_t)nf);
    rc = r == REMAT_MIN_CUT ? choose_within_budget(&P, budget, saved, &p->relax) : 0;
    if (rc)
      fail(err, errlen, "partition: out of memory");
  }
  if (rc == 0) {
    p->saved_bytes = train_order(&P, saved, &nfwd, &len);
    p->order = arena_alloc(g->arena, sizeof(int) * (size_t)(len + 1));
    memcpy(p->order, P.order, sizeof(int) * (size_t)len);
    p->n = len;
    p->nfwd = nfwd;
    p->saved = arena_alloc(g->arena, (size_t)nf + 1);
    memcpy(p->saved, saved, (size_t)nf);
    p->met_budget = budget < 0 || p->saved_bytes <= budget;
    p->remat = r;
    p->budget = budget;
    for (int i = 0; i < nf; i++)
      p->nsaved += saved[i];
    for (int j = nfwd; j < len; j++)
      p->nrecomputed += p->order[j] < nf && P.kind[p->order[j]] == K_OP;
    for (int i = 0; i < g->nsyms && i < MAXSYM; i++)
      p->sym[i] = sym ? sym[i] : 0;
  }
  part_free(&P);
  free(saved);
  return rc;
}

/* ---------------------------------------------------------------- the report */

static const char *const remat_names[] = {"min-cut", "save-all", "recompute-all"};

static void put_bytes(Buf *b, int64_t n) {
  if (n >= (int64_t)1 << 30)
    buf_printf(b, "%.2f GiB", (double)n / (double)((int64_t)1 << 30));
  else if (n >= (int64_t)1 << 20)
    buf_printf(b, "%.1f MiB", (double)n / (double)(1 << 20));
  else if (n >= 1 << 10)
    buf_printf(b, "%.1f KiB", (double)n / 1024.0);
  else
    buf_printf(b, "%lld B", (long long)n);
}

/* " at B=16, T=64" for the dynamic dims, or "". */
static void put_syms(const Graph *g, const Plan *p, Buf *b) {
  int k = 0;
  for (int i = 0; i < g->nsyms && i < MAXSYM; i++)
    if (!g->syms[i].derived)
      buf_printf(b, "%s%s=%lld", k++ ? ", " : " at ", g->syms[i].name, (long long)p->sym[i]);
}

void print_plan_summary(const Graph *g, const Plan *p, Buf *b) {
  static const char *const relaxed[] = {"", " after dropping the reduction ban",
                                        " after allowing recomputation of the largest saved matmul/attention results",
                                        " after allowing recomputation of everything but dropout",
                                        " by recomputing everything"};
  buf_printf(b, "saved activations (%s): %d tensor%s, ", remat_names[p->remat], p->nsaved, p->nsaved == 1 ? "" : "s");
  put_bytes(b, p->saved_bytes);
  put_syms(g, p, b);
  buf_printf(b, " (save-all: ");
  put_bytes(b, p->saveall_bytes);
  buf_printf(b, "; recompute-all: 0 B); %d node%s recomputed", p->nrecomputed, p->nrecomputed == 1 ? "" : "s");
  if (p->budget >= 0) {
    buf_printf(b, "; memory_budget ");
    put_bytes(b, p->budget);
    if (p->remat != REMAT_MIN_CUT)
      buf_printf(b, " ignored (%s)", p->met_budget ? "met" : "exceeded");
    else if (p->met_budget)
      buf_printf(b, " met%s", relaxed[p->relax <= 4 ? p->relax : 0]);
    else
      buf_printf(b, " NOT met (the smallest saved set found is used)");
  }
  buf_printf(b, "\n");
}

void print_plan(const Graph *g, const Plan *p, Buf *b) {
  const char *file = g->spec && g->spec->file ? g->spec->file : "";
  const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
  print_plan_summary(g, p, b);
  buf_printf(b, "schedule: %d nodes, forward %d, backward %d\n", p->n, p->nfwd, p->n - p->nfwd);
  buf_printf(b, "saved:\n  %-6s %-12s %-20s %-24s %12s  %s\n", "id", "op", "name", "shape", "bytes", "spec");
  for (int i = 0; i < g->nforward; i++) {
    if (!p->saved[i])
      continue;
    const Node *n = g->nodes[i];
    Tensor t = {0};
    char e[128];
    int64_t bytes = concrete_shape(g, &n->shape, p->sym, &t, e, sizeof e) ? t.numel * dtype_size(n->dtype) : -1;
    const char *name = n->scope && n->scope[0] ? arena_printf(g->arena, "%s/%s", n->scope, nname(n)) : nname(n);
    const char *shape = arena_printf(g->arena, "%s%s", dtype_names[n->dtype], shape_str(g, &n->shape));
    buf_printf(b, "  %%%-5d %-12s %-20s %-24s %12lld  %s:%d\n", n->id, op_info[n->op].name, name, shape,
               (long long)bytes, base, n->loc.line);
  }
  buf_printf(b, "recomputed:");
  int k = 0;
  for (int j = p->nfwd; j < p->n; j++) {
    const Node *n = g->nodes[p->order[j]];
    if (n->id >= g->nforward || node_kind(n) != K_OP)
      continue;
    buf_printf(b, "%s %%%d %s", k++ % 8 ? "," : "\n ", n->id, op_info[n->op].name);
  }
  buf_printf(b, "%s\n", k ? "" : " none");
}
