/* test_partition.c: the training schedules of gen/partition.c.
 *
 * For each model (the example models with a train section at small sizes,
 * and a spec here with every kind of op the partitioner treats differently)
 * and each strategy (save-all, recompute-all, min-cut, min-cut under a tiny
 * budget and under one just below its own saved bytes):
 *   - an independent checker validates the schedule: forward part in graph
 *     order with the loss, every operand there when read (in the backward:
 *     earlier in the backward, saved, or a param/input), every gradient
 *     computed, nothing saved that is free or a view, the counts and bytes;
 *   - interp_run_plan runs it (forward, free everything not saved, backward)
 *     with dropout active, and the loss and every gradient must equal
 *     interp_run's on the joint graph bit for bit;
 *   - save-all bytes >= min-cut bytes >= recompute-all bytes = 0; min-cut never
 *     recomputes a banned op and every value it saves is read by the backward.
 * A plan with a saved value dropped must be refused by both the checker and
 * interp_run_plan. Finally spec/examples/gpt2.yaml is partitioned at its max
 * (B=16) with each strategy, checked and timed (no interpreter: too big).
 *
 * Prints one line per case and "N passed, M failed"; exits nonzero on any
 * failure. An argument runs only the models whose name contains it. */
#include "ir.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int npass, nfail;

/* ---------------------------------------------------------------- the checker */

static const char *const remat_names[] = {"min-cut", "save-all", "recompute-all"};

static int is_leaf(const Node *n) { return n->op == OP_INPUT || n->op == OP_PARAM; }
static int is_free(const Node *n) {
  return n->op == OP_CONST || n->op == OP_FULL || n->op == OP_ARANGE || n->op == OP_ZEROS || n->op == OP_ONES;
}
static int is_view(const Node *n) {
  return n->op == OP_RESHAPE || n->op == OP_SQUEEZE || n->op == OP_UNSQUEEZE ||
         (n->op == OP_CAST && n->in[0]->dtype == n->dtype);
}

/* Ops min-cut must never recompute (before any budget relaxation). */
static int never_recompute(Op op) {
  return op == OP_MATMUL || op == OP_LINEAR || op == OP_ATTENTION || op == OP_EMBEDDING ||
         op == OP_EMBEDDING_BACKWARD || op == OP_DROPOUT || op == OP_CROSS_ENTROPY || op == OP_MSE_LOSS;
}

static int64_t node_bytes(const Graph *g, const Node *n, const int64_t *sym) {
  Tensor t;
  char e[256];
  if (!concrete_shape(g, &n->shape, sym, &t, e, sizeof e))
    return -1;
  return t.numel * dtype_size(n->dtype);
}

#define BAD(...)                 \
  do {                           \
    printf("    plan: ");        \
    printf(__VA_ARGS__);         \
    printf("\n");                \
    ok = 0;                      \
    goto out;                    \
  } while (0)

/* The schedule's structural rules (see ir.h, Plan); 1 if it keeps them. */
static int check_plan(const Graph *g, const Plan *p, const int64_t *sym) {
  int nf = g->nforward, ok = 1, prev = -1;
  char *infw = calloc((size_t)g->nnodes, 1), *inbw = calloc((size_t)g->nnodes, 1);
  if (p->nfwd < 0 || p->nfwd > p->n)
    BAD("nfwd %d outside [0, %d]", p->nfwd, p->n);
  for (int j = 0; j < p->nfwd; j++) {
    int id = p->order[j];
    if (id <= prev || id >= nf)
      BAD("forward part: %%%d after %%%d (ids must ascend and be forward nodes)", id, prev);
    prev = id;
    const Node *n = g->nodes[id];
    for (int k = 0; k < n->nin; k++)
      if (n->in[k] && !infw[n->in[k]->id])
        BAD("forward part: %%%d reads %%%d before it is computed", id, n->in[k]->id);
    infw[id] = 1;
  }
  if (!infw[g->loss->id])
    BAD("the forward part does not compute the loss %%%d", g->loss->id);
  int nsaved = 0, nrec = 0;
  int64_t bytes = 0;
  for (int i = 0; i < nf; i++) {
    if (!p->saved[i])
      continue;
    const Node *n = g->nodes[i];
    if (!infw[i])
      BAD("saved %%%d is not computed in the forward part", i);
    if (is_leaf(n) || is_free(n) || is_view(n))
      BAD("saved %%%d is a %s (a leaf, free or a view: never saved)", i, op_info[n->op].name);
    nsaved++;
    bytes += node_bytes(g, n, sym);
  }
  for (int j = p->nfwd; j < p->n; j++) {
    int id = p->order[j];
    if (id < 0 || id >= g->nnodes || inbw[id])
      BAD("backward part: node %d out of range or listed twice", id);
    const Node *n = g->nodes[id];
    if (id < nf && (p->saved[id] || is_leaf(n)))
      BAD("backward part recomputes %%%d, which is saved or a leaf", id);
    for (int k = 0; k < n->nin; k++) {
      const Node *o = n->in[k];
      if (o && !inbw[o->id] && !(o->id < nf && (p->saved[o->id] || is_leaf(o))))
        BAD("backward part: %%%d (%s) reads %%%d (%s), neither saved nor computed before it", id,
            op_info[n->op].name, o->id, op_info[o->op].name);
    }
    inbw[id] = 1;
    nrec += id < nf && !is_free(n) && !is_view(n);
  }
  for (int k = 0; k < g->ngrads; k++) {
    int id = g->grads[k]->id;
    if (!inbw[id] && !(id < nf && (p->saved[id] || is_leaf(g->nodes[id]))))
      BAD("gradient %d (%%%d) is not computed", k, id);
  }
  if (nsaved != p->nsaved || bytes != p->saved_bytes || nrec != p->nrecomputed)
    BAD("counts: %d saved (%d reported), %lld bytes (%lld reported), %d recomputed (%d reported)", nsaved,
        p->nsaved, (long long)bytes, (long long)p->saved_bytes, nrec, p->nrecomputed);
  if (p->budget >= 0 && p->met_budget != (p->saved_bytes <= p->budget))
    BAD("met_budget %d with %lld saved bytes and a budget of %lld", p->met_budget, (long long)p->saved_bytes,
        (long long)p->budget);
out:
  free(infw);
  free(inbw);
  return ok;
}

/* The rules of one strategy (min-cut: `strict` = no budget relaxation). */
static int check_strategy(const Graph *g, const Plan *p, const int64_t *sym, int strict) {
  int nf = g->nforward, ok = 1;
  char *readbw = calloc((size_t)nf + 1, 1);
  for (int j = p->nfwd; j < p->n; j++) {
    const Node *n = g->nodes[p->order[j]];
    for (int k = 0; k < n->nin; k++)
      if (n->in[k] && n->in[k]->id < nf)
        readbw[n->in[k]->id] = 1;
  }
  for (int k = 0; k < g->ngrads; k++)
    if (g->grads[k]->id < nf)
      readbw[g->grads[k]->id] = 1;
  for (int i = 0; i < nf; i++)
    if (p->saved[i] && !readbw[i])
      BAD("saved %%%d is read by no backward or recomputed node", i);
  if (p->remat == REMAT_SAVE_ALL && p->nrecomputed)
    BAD("save-all recomputes %d nodes", p->nrecomputed);
  if (p->remat == REMAT_SAVE_ALL && p->saved_bytes != p->saveall_bytes)
    BAD("save-all saves %lld bytes but reports save-all %lld", (long long)p->saved_bytes, (long long)p->saveall_bytes);
  if (p->remat == REMAT_RECOMPUTE_ALL && (p->nsaved || p->saved_bytes))
    BAD("recompute-all saves %d values", p->nsaved);
  if (p->remat == REMAT_MIN_CUT && strict) {
    for (int j = p->nfwd; j < p->n; j++) {
      const Node *n = g->nodes[p->order[j]];
      if (n->id >= nf)
        continue;
      if (never_recompute(n->op))
        BAD("min-cut recomputes %%%d, a %s", n->id, op_info[n->op].name);
      int red = n->op == OP_SUM || n->op == OP_MEAN || n->op == OP_AMAX || n->op == OP_VAR || n->op == OP_LOGSUMEXP;
      if (red && node_bytes(g, n, sym) * 4 < node_bytes(g, n->in[0], sym))
        BAD("min-cut recomputes %%%d, a %s to under a quarter of its input", n->id, op_info[n->op].name);
    }
  }
out:
  free(readbw);
  return ok;
}

/* ---------------------------------------------------------------- runs */

/* Runs plan p and compares its loss and gradients with the joint graph's
 * values `vals` bit for bit. 1 if equal. */
static int run_and_compare(const Graph *g, const Plan *p, const InterpOptions *o, const Tensor *ins, const Tensor *ps,
                           const Tensor *vals) {
  Tensor *grads = calloc((size_t)g->ngrads + 1, sizeof(Tensor)), loss = {0};
  char err[512];
  int ok = 1;
  if (interp_run_plan(g, p, o, ins, ps, grads, &loss, err, sizeof err)) {
    printf("    interp_run_plan: %s\n", err);
    free(grads);
    return 0;
  }
  if (memcmp(loss.data, vals[g->loss->id].data, sizeof(double)))
    printf("    loss %.17g, joint graph %.17g\n", loss.data[0], vals[g->loss->id].data[0]), ok = 0;
  for (int k = 0; k < g->ngrads; k++) {
    const Tensor *want = &vals[g->grads[k]->id];
    if (grads[k].numel != want->numel || memcmp(grads[k].data, want->data, sizeof(double) * (size_t)want->numel)) {
      printf("    gradient %d differs from the joint graph's\n", k);
      ok = 0;
    }
    free(grads[k].data);
  }
  free(loss.data);
  free(grads);
  return ok;
}

/* A copy of p with saved value `drop` removed (for the must-fail check). */
static Plan drop_saved(const Graph *g, const Plan *p, int drop) {
  Plan q = *p;
  q.saved = arena_alloc(g->arena, (size_t)g->nforward + 1);
  memcpy(q.saved, p->saved, (size_t)g->nforward);
  q.saved[drop] = 0;
  q.nsaved--;
  return q;
}

static void report(int ok, const char *model, const char *what, const Plan *p) {
  if (ok)
    npass++;
  else
    nfail++;
  printf("%s %-32s %-22s %3d saved %9lld B (save-all %9lld B), %3d recomputed, %d+%d nodes\n", ok ? "ok  " : "FAIL",
         model, what, p->nsaved, (long long)p->saved_bytes, (long long)p->saveall_bytes, p->nrecomputed, p->nfwd,
         p->n - p->nfwd);
}

/* Every strategy on one model at every dynamic dim = 2. */
static void run_model(const char *name, const char *src) {
  Arena arena = {0};
  arena.fail_after = -1;
  Diag dg;
  Graph *g = tgen_load(&dg, &arena, name, src, strlen(src));
  if (!g) {
    printf("FAIL %s: refused:\n%s", name, dg.msg);
    nfail++;
    arena_free(&arena);
    return;
  }
  if (autodiff(g)) {
    printf("FAIL %s: autodiff failed\n", name);
    nfail++;
    arena_free(&arena);
    return;
  }
  verify(g);
  int64_t sym[MAXSYM];
  for (int i = 0; i < MAXSYM; i++)
    sym[i] = 2;
  InterpOptions o = {.symvals = sym, .training = 1, .seed = 99, .step = 3};
  Tensor *ins, *ps, *vals = calloc((size_t)g->nnodes + 1, sizeof(Tensor));
  char err[512];
  if (interp_make_args(g, sym, 5, &ins, &ps, err, sizeof err) || interp_run(g, &o, ins, ps, vals, err, sizeof err)) {
    printf("FAIL %s: joint graph: %s\n", name, err);
    nfail++;
    free(vals);
    arena_free(&arena);
    return;
  }
  struct { Remat r; int64_t budget; const char *what; } runs[] = {
      {REMAT_SAVE_ALL, -1, "save-all"},
      {REMAT_RECOMPUTE_ALL, -1, "recompute-all"},
      {REMAT_MIN_CUT, -1, "min-cut"},
      {REMAT_MIN_CUT, 1, "min-cut budget 1 B"},
      {REMAT_MIN_CUT, 0, "min-cut budget just under"}, /* set below */
  };
  int64_t bytes[5] = {0};
  for (int r = 0; r < 5; r++) {
    Plan p;
    if (r == 4) {
      if (bytes[2] <= 1)
        continue;
      runs[r].budget = bytes[2] - 1;
    }
    if (partition(g, runs[r].r, runs[r].budget, sym, &p, err, sizeof err)) {
      printf("FAIL %s %s: partition: %s\n", name, runs[r].what, err);
      nfail++;
      continue;
    }
    bytes[r] = p.saved_bytes;
    int ok = check_plan(g, &p, sym);
    ok = check_strategy(g, &p, sym, runs[r].budget < 0) && ok;
    ok = ok && run_and_compare(g, &p, &o, ins, ps, vals);
    if (runs[r].budget >= 0 && !(p.met_budget && p.saved_bytes <= runs[r].budget)) {
      printf("    budget %lld not met: %lld bytes saved\n", (long long)runs[r].budget, (long long)p.saved_bytes);
      ok = 0;
    }
    /* a plan missing one saved value must be refused by both checks */
    for (int i = 0; ok && i < g->nforward; i++)
      if (p.saved[i]) {
        Plan q = drop_saved(g, &p, i);
        Tensor *gr = calloc((size_t)g->ngrads + 1, sizeof(Tensor)), l;
        printf("    (expected) ");
        int checker = check_plan(g, &q, sym);
        int interp = !interp_run_plan(g, &q, &o, ins, ps, gr, &l, err, sizeof err);
        if (!interp)
          printf("    (expected) interp_run_plan: %s\n", err);
        if (checker || interp) {
          printf("    a plan without saved %%%d was accepted by the %s\n", i, checker ? "checker" : "interpreter");
          ok = 0;
        }
        if (interp) {
          free(l.data);
          for (int k = 0; k < g->ngrads; k++)
            free(gr[k].data);
        }
        free(gr);
        break;
      }
    report(ok, name, runs[r].what, &p);
  }
  int order_ok = bytes[1] == 0 && bytes[0] >= bytes[2] && bytes[2] >= bytes[1];
  if (!order_ok)
    printf("FAIL %s: bytes save-all %lld, min-cut %lld, recompute-all %lld: expected save-all >= min-cut >= recompute-all = 0\n",
           name, (long long)bytes[0], (long long)bytes[2], (long long)bytes[1]);
  order_ok ? npass++ : nfail++;
  interp_free(g, vals);
  free(vals);
  interp_free_args(g, ins, ps);
  arena_free(&arena);
}

/* ---------------------------------------------------------------- models */

/* Every kind of node the partitioner treats differently: attention, dropout
 * (random), embedding, the loss (banned); reductions to statistics (banned
 * at full strictness); layer_norm, rms_norm, softmax, gelu, casts, concat,
 * slice, permute, where (recomputable); reshapes and a same-dtype cast
 * (views); arange (free). */
static const char mixed[] =
    "name: mixed\n"
    "dtype: f32\n"
    "dims:\n"
    "  B: {dynamic: true, max: 8}\n"
    "  T: 4\n"
    "  C: 8\n"
    "  NH: 2\n"
    "  V: 11\n"
    "inputs:\n"
    "  idx: {shape: [B, T], dtype: i32}\n"
    "  tgt: {shape: [B, T], dtype: i32}\n"
    "params:\n"
    "  emb: {shape: [V, C], init: {normal: 0.5}}\n"
    "  pos: {shape: [T, C], init: {normal: 0.5}}\n"
    "  ln_w: {shape: [C], init: ones}\n"
    "  ln_b: {shape: [C], init: {uniform: [-0.5, 0.5]}}\n"
    "  wqkv: {shape: [3*C, C]}\n"
    "  wo: {shape: [C, C]}\n"
    "  w1: {shape: [4*C, C]}\n"
    "  w2: {shape: [C, 4*C]}\n"
    "  g2: {shape: [C], init: {uniform: [0.5, 1.5]}}\n"
    "  wout: {shape: [V, C]}\n"
    "  unused: {shape: [3]}\n"
    "graph:\n"
    "  - x: embedding(idx, emb) + embedding(arange(T), pos)\n"
    "  - q, k, v: split(linear(layer_norm(x, ln_w, ln_b), wqkv), 3, dim=-1)\n"
    "  - qh: transpose(reshape(q, [B, T, NH, C/NH]), 1, 2)\n"
    "  - kh: transpose(reshape(k, [B, T, NH, C/NH]), 1, 2)\n"
    "  - vh: transpose(reshape(v, [B, T, NH, C/NH]), 1, 2)\n"
    "  - a: reshape(transpose(attention(qh, kh, vh, causal=true), 1, 2), [B, T, C])\n"
    "  - x1: x + dropout(linear(a, wo), 0.25)\n"
    "  - s: softmax(x1, dim=-1) * 8\n"
    "  - m: linear(dropout(gelu(linear(rms_norm(x1, g2), w1)), 0.1), w2)\n"
    "  - st: mean(x1, dim=-1, keepdim=true) + var(x1, dim=-1, keepdim=true) + amax(x1, dim=-1, keepdim=true)\n"
    "  - lse: logsumexp(x1, dim=-1, keepdim=true)\n"
    "  - x2: x1 + m + s * sigmoid(st - lse) + where(gt(x1, 0), tanh(x1), exp(x1) - 1)\n"
    "  - h: concat([slice(x2, 2, 0, 4), cast(cast(slice(x2, 2, 4, 8), bf16), f32)], dim=-1)\n"
    "  - hv: cast(unsqueeze(squeeze(unsqueeze(h, 0), 0), 3), f32)\n"
    "  - logits: linear(layer_norm(reshape(hv, [B, T, C])), wout)\n"
    "  - loss: cross_entropy(reshape(logits, [B*T, V]), reshape(tgt, [B*T])) + sum(square(permute(h, [2, 0, 1]))) / 100\n"
    "outputs: [logits]\n"
    "train:\n"
    "  loss: loss\n"
    "  optimizer: {sgd: {lr: 0.1}}\n";

/* The example models, with mlp_blocks' widths cut (the same graph). */
typedef struct Example {
  const char *path;
  const char *from[2], *to[2];
} Example;
static const Example examples[] = {
    {"spec/examples/mlp.yaml", {0}, {0}},
    {"spec/examples/mlp3.yaml", {0}, {0}},
    {"spec/examples/mlp_blocks.yaml", {"D: 1024", "H: 4096"}, {"D: 32  ", "H: 64  "}},
    {"tests/data/gpt2_tiny.yaml", {0}, {0}},
    {"tests/e2e/all_ops.yaml", {0}, {0}}, /* only if it has a train section */
    {"tests/e2e/tinyops_grad.yaml", {0}, {0}}, /* train.wrt: an input's gradient, no params */
    {"tests/e2e/mlp_wrt.yaml", {0}, {0}},      /* params and an input */
};

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

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* gpt2 at its max: every strategy checked (structure only) and timed. */
static void run_gpt2(void) {
  Arena arena = {0};
  arena.fail_after = -1;
  Diag dg;
  const char *path = "spec/examples/gpt2.yaml";
  char *src = slurp(&arena, path), err[512];
  Graph *g = src ? tgen_load(&dg, &arena, path, src, strlen(src)) : NULL;
  if (!g || autodiff(g)) {
    printf("FAIL %s: cannot load or differentiate\n", path);
    nfail++;
    arena_free(&arena);
    return;
  }
  int64_t sym[MAXSYM] = {0};
  for (int i = 0; i < g->nsyms; i++)
    sym[i] = g->syms[i].max;
  int64_t bytes[3] = {0};
  for (int r = 0; r < 3; r++) {
    Plan p;
    double t0 = now();
    int bad = partition(g, (Remat)r, -1, sym, &p, err, sizeof err);
    double ms = (now() - t0) * 1e3;
    if (bad) {
      printf("FAIL %s %s: %s\n", path, remat_names[r], err);
      nfail++;
      continue;
    }
    bytes[r] = p.saved_bytes;
    int ok = check_plan(g, &p, sym) && check_strategy(g, &p, sym, 1) && ms < 1000;
    report(ok, "gpt2.yaml B=16", remat_names[r], &p);
    printf("     %d+%d nodes in the joint graph; partition took %.3f ms\n", g->nforward, g->nnodes - g->nforward, ms);
  }
  if (!(bytes[1] >= bytes[0] && bytes[0] >= bytes[2] && bytes[2] == 0)) {
    printf("FAIL gpt2: save-all %lld < min-cut %lld bytes\n", (long long)bytes[1], (long long)bytes[0]);
    nfail++;
  }
  arena_free(&arena);
}

int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : NULL;
#ifdef _OPENMP
  omp_set_num_threads(1); /* many small evaluations */
#endif
  if (!only || strstr("mixed", only))
    run_model("mixed", mixed);
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
    if (!strstr(src, "\ntrain:")) {
      printf("skip %s: no train section\n", x->path);
      continue;
    }
    for (int r = 0; r < 2; r++) {
      char *p = x->from[r] ? strstr(src, x->from[r]) : NULL;
      if (p)
        memcpy(p, x->to[r], strlen(x->to[r]));
    }
    run_model(x->path, src);
  }
  arena_free(&files);
  if (!only || strstr("gpt2.yaml", only))
    run_gpt2();
  printf("%d passed, %d failed\n", npass, nfail);
  return nfail != 0;
}
