/* test_backend.c: the back end's passes (gen/decompose.c, schedule.c,
 * plan.c) on every example and e2e model, and the kernel groups the
 * scheduler must find on small specs.
 *
 * For each model, at every dynamic dim = 2 (3 for the second run):
 *   - decompose: the pass's nodes, evaluated by the interpreter
 *     (interp_run_nodes), give the graph's outputs, loss and gradients
 *     (interp_run on the joint graph, dropout active in training) to 1e-9
 *     relative: the decompositions of softmax, layer_norm, cross_entropy...
 *     compute what the composite ops compute;
 *   - schedule and plan, fused and unfused: every pass renders (render_file)
 *     and no two arena buffers that are live together share a byte
 *     (plan_check); each kernel's values are stored once; the unfused pass
 *     has one kernel per computed node (one library call computes attention
 *     and its lse, and the gradients of its operands).
 * Then the expected kernel groups, derived from the graphs' structure (and
 * a concat never fused with the kernel that stores its operand):
 *   tinyops' forward is one kernel; softmax and layer_norm one kernel each
 *   (two reductions and their epilogue); a column sum and its epilogue one
 *   kernel; a transpose feeding pointwise work is index arithmetic (one
 *   kernel, no copy); layer_norm -> linear -> gelu -> +x is a normalisation
 *   kernel, the GEMM and one epilogue kernel; mlp's forward is GEMM, relu,
 *   GEMM. The training pass of sum(tinyops(x)) w.r.t. x (train.wrt): one
 *   kernel that reads x and writes the loss and d_x where the sum splits
 *   over blocks (8192 x 8192), else the sum apart.
 * In place (plan.c): GPT-2's cross-entropy kernel (gpt2_tiny, found from
 * the graph) reads the logits last and writes their gradient over them;
 * plan_check allows that pair and refuses it unrecorded, with the input
 * read later, or with a third buffer on its bytes; small passes where a
 * value must not take its input's bytes (the input read by a later
 * kernel, read transposed, or read after the store in the loop) and
 * where it may (a softmax over a GEMM's rows, exp of it).
 * And the CUDA mapping of loop kernels, in the printed CUDA (the CPU text
 * has none of it): a pointwise kernel loads each operand it reads at its
 * own element, and stores each result, as 16-byte vectors (4 f32, 8 bf16),
 * a broadcast operand scalar; its indices are int when every size fits,
 * int64_t otherwise; a reduction with few outputs and many reduced elements
 * (a full sum, a column sum over many rows) is split over blocks, one with
 * few reduced elements or two phases (softmax) is not. Riders: a layer
 * norm's weight and bias gradients ride its backward's row kernel (rows of
 * 768), and do not where a row is too long (2048) or not whole vectors.
 *
 * Prints one line per case and "N passed, M failed". */
#include "ir.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* mark[id] = 1 for each value kernel k reads from memory, else 0 */
static void loads_mark(const BPass *p, const Kernel *k, char *mark) {
  memset(mark, 0, (size_t)p->n + 1);
  kernel_loads(p, k, p->walk);
  for (int q = 0; q < p->walk->nlist; q++)
    mark[p->walk->list[q]] = 1;
}

static int npass, nfail;

/* Is n a view that a loop kernel stores while the memory it views is
 * stored already (a copy)? */
static int copy_of_stored(const BPass *p, const Node *n) {
  Layout l;
  return op_info[n->op].cls == C_VIEW && n->op != OP_CONCAT && p->kern[n->id] >= 0 &&
         p->k[p->kern[n->id]]->kind == K_LOOP && layout_of(p, n->in[0], &l);
}

static void check(int ok, const char *what, const char *detail) {
  if (ok)
    npass++;
  else
    nfail++;
  printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", what, detail && *detail ? ": " : "", detail ? detail : "");
}

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

static Graph *load(Arena *a, const char *name, const char *src) {
  Diag dg;
  Graph *g = tgen_load(&dg, a, name, src, strlen(src));
  if (!g)
    printf("FAIL %s: refused:\n%s", name, dg.msg);
  return g;
}

/* Largest |a - b| relative to max(|b|) over a tensor (NaN-safe). */
static double rel_err(const Tensor *a, const Tensor *b) {
  if (a->numel != b->numel)
    return INFINITY;
  double m = 1e-30, e = 0;
  for (int64_t i = 0; i < b->numel; i++)
    if (fabs(b->data[i]) > m)
      m = fabs(b->data[i]);
  for (int64_t i = 0; i < b->numel; i++) {
    double d = fabs(a->data[i] - b->data[i]);
    if (isnan(a->data[i]) != isnan(b->data[i]))
      return INFINITY;
    if (d > e)
      e = d;
  }
  return e / m;
}

/* The pass's values equal the graph's. */
static void check_decompose(Graph *g, BPass *p, const Tensor *gvals, const InterpOptions *o, const Tensor *ins,
                            const Tensor *ps, const char *name) {
  Tensor *pv = calloc((size_t)p->n + 1, sizeof(Tensor));
  char err[512], what[256];
  snprintf(what, sizeof what, "%s %s: decomposed pass = graph", name, pass_names[p->kind]);
  InterpOptions po = *o;
  po.training = p->training;
  if (interp_run_nodes(g, p->nodes, p->n, &po, ins, ps, pv, err, sizeof err)) {
    check(0, what, err);
    free(pv);
    return;
  }
  double worst = 0;
  for (int k = 0; k < p->nfinals; k++) {
    const Node *want = p->kind == PASS_FORWARD ? g->outputs[k] : k == 0 ? g->loss : g->grads[k - 1];
    double e = rel_err(&pv[p->finals[k]->id], &gvals[want->id]);
    if (!(e <= worst))
      worst = e;
  }
  /* the decompositions round their result to the model's dtype once (the
   * emitted code stores it so); f32 models must agree to double rounding */
  DType dt = g->spec->dtype;
  double tol = dt == DT_BF16 ? 2e-2 : dt == DT_F16 ? 4e-3 : 1e-9;
  snprintf(err, sizeof err, "worst relative error %.2e over %d results (tolerance %.0e)", worst, p->nfinals, tol);
  check(worst <= tol, what, err);
  for (int i = 0; i < p->n; i++)
    free(pv[i].data);
  free(pv);
}

/* Fused and unfused: renders, the plan keeps live buffers apart, every
 * stored value is stored by one kernel; unfused: one kernel per computed
 * node. */
/* Every final a loop kernel or a GEMM of the pass computes (an output, the
 * loss, a gradient, or a reshape of one) is stored where the caller gets it:
 * no copy after the kernels. A value that is two finals is stored once, for the first. */
static void check_in_place(const BPass *p, const char *path) {
  for (int k = 0; k < p->nfinals; k++) {
    Home h;
    int idx, bi = p->buf[p->finals[k]->id], dup = 0;
    final_home(p, k, &h, &idx);
    while (bi >= 0 && p->b[bi].home == HOME_ALIAS)
      bi = p->b[bi].index;
    if (bi < 0)
      continue;
    const Node *x = p->b[bi].node;
    if (p->kern[x->id] < 0 || p->k[p->kern[x->id]]->kind == K_EXTERN)
      continue;
    for (int j = 0; j < k; j++) {
      int bj = p->buf[p->finals[j]->id];
      while (bj >= 0 && p->b[bj].home == HOME_ALIAS)
        bj = p->b[bj].index;
      dup |= bj == bi;
    }
    char msg[200];
    snprintf(msg, sizeof msg, "%s pass: final %d (%s) is stored in the arena and copied, not in place",
             pass_names[p->kind], k, p->b[bi].name);
    check(dup || (p->b[bi].home == h && p->b[bi].index == idx), path, msg);
  }
}

static void check_schedule(Graph *g, BPass *p, int fuse, const char *name) {
  char err[512], what[256];
  snprintf(what, sizeof what, "%s %s %s: plan keeps live buffers apart", name, pass_names[p->kind],
           fuse ? "fused" : "unfused");
  check(!plan_check(p, err, sizeof err), what, plan_check(p, err, sizeof err) ? err : "");
  int *stores = calloc((size_t)p->n + 1, sizeof(int)), ok = 1;
  for (int c = 0; c < p->nk; c++)
    for (int i = 0; i < p->k[c]->nouts; i++)
      stores[p->k[c]->outs[i]->id]++;
  for (int i = 0; i < p->n; i++)
    if (stores[i] > 1 || (stores[i] && !p->realized[i]))
      ok = 0;
  /* no transpose kernel feeds a GEMM (transposes are GEMM flags); fused,
   * no kernel copies a view of stored memory for a GEMM or an attention
   * call (attention reads and writes strided layouts) */
  int feed_ok = 1;
  for (int c = 0; c < p->nk && feed_ok; c++) {
    const Kernel *k = p->k[c];
    int att = k->kind == K_EXTERN && (k->anchor->op == OP_ATTENTION || k->anchor->op == OP_ATTENTION_LSE ||
                                      k->anchor->op == OP_ATTENTION_BACKWARD);
    if ((k->kind != K_GEMM || !gemm_strided(k->anchor)) && !att) /* (torch.matmul's broadcasting call takes */
      continue;                                                     /* contiguous operands) */
    for (int j = 0; j < (att ? k->anchor->nin : 2); j++) {
      int t, tt;
      const Node *src = att ? k->anchor->in[j] : gemm_operand(k->anchor, j, &t);
      const Node *v = src->op == OP_RESHAPE ? src->in[0] : src;
      int transposed = k->kind == K_GEMM && gemm_source(v, &tt) != v;
      const Node *b = layout_base(p, src);
      if (copy_of_stored(p, b) && (transposed || fuse)) {
        snprintf(err, sizeof err, "kernel %d copies %s (%%%d) for %s kernel %d", p->kern[b->id] + 1,
                 op_info[b->op].name, b->id, att ? "attention" : "GEMM", c + 1);
        feed_ok = 0;
      }
    }
  }
  snprintf(what, sizeof what, "%s %s %s: no %s kernel feeds a %s", name, pass_names[p->kind],
           fuse ? "fused" : "unfused", fuse ? "copy" : "transpose", fuse ? "GEMM or attention" : "strided GEMM");
  check(feed_ok, what, feed_ok ? "" : err);
  /* every value a kernel reads from memory is written by an earlier kernel */
  char *mark = calloc((size_t)p->n + 1, 1);
  int order_ok = 1;
  for (int c = 0; c < p->nk && order_ok; c++) {
    loads_mark(p, p->k[c], mark);
    for (int i = 0; i < p->n && order_ok; i++) {
      if (mark[i] && p->kern[i] >= c) {
        snprintf(err, sizeof err, "kernel %d reads %%%d (%s), written by kernel %d", c + 1, i,
                 op_info[p->nodes[i]->op].name, p->kern[i] + 1);
        order_ok = 0;
      }
      for (int j = 0; mark[i] && p->host[i] && j < p->n && order_ok; j++) /* a host: the values placed in it */
        if (p->place[j] && p->place[j]->host == p->nodes[i] && p->kern[j] >= c) {
          snprintf(err, sizeof err, "kernel %d reads %%%d (%s), whose part %%%d kernel %d writes", c + 1, i,
                   op_info[p->nodes[i]->op].name, j, p->kern[j] + 1);
          order_ok = 0;
        }
    }
  }
  free(mark);
  snprintf(what, sizeof what, "%s %s %s: kernels read only what earlier kernels wrote", name, pass_names[p->kind],
           fuse ? "fused" : "unfused");
  check(order_ok, what, order_ok ? "" : err);
  snprintf(what, sizeof what, "%s %s %s: each stored value stored once (%d kernels)", name, pass_names[p->kind],
           fuse ? "fused" : "unfused", p->nk);
  check(ok, what, "");
  if (!fuse) {
    int want = 0;
    for (int i = 0; i < p->n; i++) {
      const Node *n = p->nodes[i];
      Layout l;
      int alias = p->kern[i] < 0 && layout_alias(p, n, &l);
      if (p->realized[i] && !alias)
        want++;
    }
    for (int c = 0; c < p->nk; c++) /* a library call's siblings (attention and its lse, its gradients) */
      if (p->k[c]->kind == K_EXTERN)
        want -= p->k[c]->nouts - 1;
    snprintf(what, sizeof what, "%s %s unfused: one kernel per computed node", name, pass_names[p->kind]);
    snprintf(err, sizeof err, "%d kernels, %d computed nodes", p->nk, want);
    check(p->nk == want, what, err);
  }
  free(stores);
}

static void run_model(const char *path) {
  Arena a = {.fail_after = -1};
  char *src = slurp(&a, path);
  Graph *g = src ? load(&a, path, src) : NULL;
  if (!g) {
    check(0, path, "cannot read or load");
    arena_free(&a);
    return;
  }
  Plan pl = {0};
  int train = g->spec->train.present && g->loss;
  int64_t maxsym[MAXSYM] = {0};
  for (int k = 0; k < g->nsyms; k++)
    maxsym[k] = g->syms[k].derived ? 0 : g->syms[k].max;
  char err[512];
  if (train && (autodiff(g) || partition(g, g->spec->compile.remat, -1, maxsym, &pl, err, sizeof err))) {
    check(0, path, "autodiff or partition failed");
    arena_free(&a);
    return;
  }
  /* the interpreter at small dims (skipped for the giant static models) */
  int64_t sym[MAXSYM];
  for (int k = 0; k < MAXSYM; k++)
    sym[k] = 2;
  double work = 0;
  for (int i = 0; i < g->nnodes; i++) {
    Tensor t;
    if (concrete_shape(g, &g->nodes[i]->shape, sym, &t, err, sizeof err))
      work += (double)t.numel;
  }
  Tensor *ins = NULL, *ps = NULL, *vals = NULL;
  InterpOptions o = {.symvals = sym, .training = 1, .seed = 7, .step = 2};
  int interp = work < 2e7 && !interp_make_args(g, sym, 3, &ins, &ps, err, sizeof err);
  if (interp) {
    vals = calloc((size_t)g->nnodes + 1, sizeof(Tensor));
    o.training = 0;
    if (interp_run(g, &o, ins, ps, vals, err, sizeof err)) {
      check(0, path, err);
      interp = 0;
    }
  }
  for (int fuse = 1; fuse >= 0; fuse--) {
    BPass *p[NPASS] = {0};
    build_passes(g, train ? &pl : NULL, fuse, 2, p);
    render_file(g, p, 0, path);
    render_file(g, p, 1, path);
    for (int k = 0; k < NPASS; k++)
      if (p[k]) {
        check_schedule(g, p[k], fuse, path);
        check_in_place(p[k], path);
        if (fuse && interp && k != PASS_TRAIN)
          check_decompose(g, p[k], vals, &o, ins, ps, path);
      }
    if (fuse && interp && train) { /* the training pass: dropout active */
      Tensor *tv = calloc((size_t)g->nnodes + 1, sizeof(Tensor));
      InterpOptions to = o;
      to.training = 1;
      if (!interp_run(g, &to, ins, ps, tv, err, sizeof err)) {
        check_decompose(g, p[PASS_TRAIN], tv, &to, ins, ps, path);
        interp_free(g, tv);
      }
      free(tv);
    }
  }
  if (interp) {
    interp_free(g, vals);
    interp_free_args(g, ins, ps);
  }
  free(vals);
  arena_free(&a);
}

/* ---------------------------------------------------------------- kernel groups */

static BPass *forward_of(Arena *a, const char *name, const char *src, int fuse) {
  Graph *g = load(a, name, src);
  if (!g)
    return NULL;
  BPass *p[NPASS] = {0};
  build_passes(g, NULL, fuse, 2, p);
  return p[PASS_FORWARD];
}

/* kinds: one letter a kernel: L loop without reductions, R loop with
 * reductions, G GEMM, C library call. */
static void expect_kernels(const char *name, const char *src, const char *kinds, const char *why) {
  Arena a = {.fail_after = -1};
  BPass *p = forward_of(&a, name, src, 1);
  char got[64] = {0}, what[256];
  for (int c = 0; p && c < p->nk && c < 63; c++) {
    const Kernel *k = p->k[c];
    got[c] = k->kind == K_GEMM ? 'G' : k->kind == K_EXTERN ? 'C' : k->nreds ? 'R' : 'L';
  }
  snprintf(what, sizeof what, "kernels of %s: %s (%s)", name, kinds, why);
  char detail[128];
  snprintf(detail, sizeof detail, "got %s", got);
  check(p && !strcmp(got, kinds), what, strcmp(got, kinds) ? detail : "");
  arena_free(&a);
}

static const char *spec(Arena *a, const char *dims, const char *inputs, const char *params, const char *graph) {
  return arena_printf(a, "name: t\ndims:\n%s\ninputs:\n%s\n%s\ngraph:\n%s\n", dims, inputs,
                      params ? arena_printf(a, "params:\n%s", params) : "", graph);
}

static void kernel_groups(void) {
  Arena a = {.fail_after = -1};
  const char *dims = "  B: {dynamic: true, max: 64}\n  D: 48";
  char *tiny = slurp(&a, "spec/examples/tinyops.yaml");
  if (tiny)
    expect_kernels("tinyops", tiny, "L", "a pointwise chain is one kernel");
  expect_kernels("softmax", spec(&a, dims, "  x: [B, D]", NULL, "  - y: softmax(x, -1)"), "R",
                 "max, sum and divide over each row in one kernel");
  expect_kernels("layer_norm",
                 spec(&a, dims, "  x: [B, D]", "  w: {shape: [D], init: ones}\n  b: {shape: [D], init: zeros}\n",
                      "  - y: layer_norm(x, w, b)"),
                 "R", "mean, variance and the normalisation in one kernel");
  expect_kernels("column sum", spec(&a, dims, "  x: [B, D]", NULL, "  - s: sum(x, 0)\n  - y: exp(s) * 2"), "R",
                 "a reduction and its epilogue over the result");
  expect_kernels("transpose", spec(&a, dims, "  x: [B, D]", NULL, "  - y: tanh(transpose(x, 0, 1)) * 2"), "L",
                 "a view is index arithmetic in its reader");
  expect_kernels("softmax of a pointwise prologue", spec(&a, dims, "  x: [B, D]", NULL, "  - y: softmax(x * 3 + 1, -1)"),
                 "R", "the prologue is recomputed in each phase, never stored");
  expect_kernels("two reductions of one input",
                 spec(&a, dims, "  x: [B, D]", NULL, "  - s: sum(x, -1)\n  - m: amax(x, -1)\n  - y: s + m"), "R",
                 "reductions over the same space share one kernel");
  /* a concat reads its operands from memory: the kernel storing one (here
   * a row mean's epilogue) is not fused with the concat, which would read it
   * before the store, and from another thread (the kernel order check of
   * check_schedule fails on such a kernel) */
  const char *cc = spec(&a, dims, "  x: [B, D]", NULL,
                        "  - m: mean(x, -1, keepdim=true)\n  - c: concat([m * 2, slice(x, 1, 1, 48)], -1)\n  - y: c * 3");
  expect_kernels("concat of a reduction's epilogue", cc, "RLL", "the concat's operand is stored before the concat runs");
  BPass *pc = forward_of(&a, "concat of a reduction's epilogue", cc, 1);
  if (pc)
    check_schedule(pc->g, pc, 1, "concat of a reduction's epilogue");
  char *ln = slurp(&a, "spec/examples/ln_linear_gelu_res.yaml");
  if (ln)
    expect_kernels("ln_linear_gelu_res", ln, "RG", "normalisation, then the GEMM with gelu and the residual in its epilogue");
  char *mlp = slurp(&a, "spec/examples/mlp.yaml");
  if (mlp)
    expect_kernels("mlp", mlp, "GG", "linear with relu in its epilogue, linear");
  /* unfused: the softmax is its decomposition, a kernel per node */
  BPass *p = forward_of(&a, "softmax unfused", spec(&a, dims, "  x: [B, D]", NULL, "  - y: softmax(x, -1)"), 0);
  char detail[64];
  snprintf(detail, sizeof detail, "%d kernels", p ? p->nk : -1);
  check(p && p->nk == 5, "kernels of softmax unfused: amax, sub, exp, sum, div", detail);
  arena_free(&a);
}

/* The fused training pass of the model at path, partitioned at each dynamic
 * dim's max (as tgen does; at_max) or at zero sizes; NULL after a failed
 * check when it cannot be built. */
/* A training spec's passes (into ps), or NULL (a failed check) when it cannot be loaded, differentiated or
 * partitioned. */
static Graph *train_passes(Arena *a, const char *path, const char *src, int at_max, Plan *pl, BPass **ps) {
  Graph *g = src ? load(a, path, src) : NULL;
  int64_t maxsym[MAXSYM] = {0};
  char err[512];
  for (int k = 0; g && at_max && k < g->nsyms; k++)
    maxsym[k] = g->syms[k].derived ? 0 : g->syms[k].max;
  if (!g || autodiff(g) || partition(g, g->spec->compile.remat, -1, maxsym, pl, err, sizeof err)) {
    check(0, path, "cannot load, differentiate or partition");
    return NULL;
  }
  build_passes(g, pl, 1, 2, ps);
  return g;
}

static BPass *train_pass_of(Arena *a, const char *path, const char *src, int at_max, Plan *pl) {
  BPass *ps[NPASS] = {0};
  return train_passes(a, path, src, at_max, pl, ps) ? ps[PASS_TRAIN] : NULL;
}

static BPass *train_pass(Arena *a, const char *path, int at_max, Plan *pl) {
  return train_pass_of(a, path, slurp(a, path), at_max, pl);
}

/* Attention differentiated as one op: in the training pass of a model whose
 * q, k and v all need gradients, each attention's call also stores its lse
 * (one kernel), one attention_backward call computes the three gradients,
 * and no value has the [T, T] scores' shape (T = 12, head dim 8). */
static void attention_kernels(void) {
  Arena a = {.fail_after = -1};
  Plan pl = {0};
  char detail[200];
  const char *src = "name: att\ndims:\n  B: 2\n  T: 12\ninputs:\n  x: [B, T, 16]\nparams:\n"
                    "  wq: {shape: [16, 16]}\n  wk: {shape: [16, 16]}\n  wv: {shape: [16, 16]}\ngraph:\n"
                    "  - q: transpose(reshape(linear(x, wq), [B, T, 2, 8]), 1, 2)\n"
                    "  - k: transpose(reshape(linear(x, wk), [B, T, 2, 8]), 1, 2)\n"
                    "  - v: transpose(reshape(linear(x, wv), [B, T, 2, 8]), 1, 2)\n"
                    "  - y: attention(q, k, v, causal=true)\n  - loss: mean(y * y)\n"
                    "outputs: [y]\ntrain:\n  loss: loss\n  optimizer: {sgd: {lr: 0.1}}\n";
  BPass *p = train_pass_of(&a, "attention_kernels", src, 0, &pl);
  if (!p) {
    arena_free(&a);
    return;
  }
  int fwd = 0, bwd = 0, fwd_ok = 1, bwd_ok = 1, tt = 0;
  for (int c = 0; c < p->nk; c++) {
    const Kernel *k = p->k[c];
    if (k->kind != K_EXTERN)
      continue;
    if (k->anchor->op == OP_ATTENTION || k->anchor->op == OP_ATTENTION_LSE) {
      fwd++;
      fwd_ok &= k->nouts == 2 && k->outs[0]->op != k->outs[1]->op;
    } else if (k->anchor->op == OP_ATTENTION_BACKWARD) {
      bwd++;
      int seen = 0;
      for (int i = 0; i < k->nouts; i++)
        seen |= 1 << k->outs[i]->axis;
      bwd_ok &= k->nouts == 3 && seen == 7;
    }
  }
  for (int i = 0; i < p->n; i++) {
    const Shape *s = &p->nodes[i]->shape;
    int64_t d0, d1;
    tt += s->rank >= 2 && dim_is_const(&s->d[s->rank - 2], &d0) && dim_is_const(&s->d[s->rank - 1], &d1) && d0 == 12 &&
          d1 == 12;
  }
  snprintf(detail, sizeof detail, "%d attention call(s), %d backward call(s), %d [T, T] value(s)", fwd, bwd, tt);
  check(fwd == 1 && fwd_ok && bwd == 1 && bwd_ok && tt == 0,
        "attention: the forward call stores its lse, one backward call the three gradients, no T x T value", detail);
  arena_free(&a);
}

/* GPT-2's training pass (tests/data/gpt2_tiny.yaml, 2 layers): each
 * attention reads q, k and v where the qkv projection stored them and
 * writes its output into the [B, T, C] operand of the projection after it
 * (placed there; that operand has no kernel of its own); each backward
 * call writes d_q, d_k and d_v into the one gradient of qkv (a concat with
 * no kernel); the MLP's first GEMM applies gelu with its input stored
 * beside the output (aux) in the forward; the backward, which recomputes
 * gelu(x) from the saved x, applies gelu's gradient in the same loop
 * kernel (with every activation saved, in the store of its GEMM); each
 * linear's bias gradient is summed by the GEMM of its weight's gradient,
 * which reads the same dy. */
static void gpt2_layouts(void) {
  Arena a = {.fail_after = -1};
  Plan pl = {0};
  char detail[200];
  BPass *p = train_pass(&a, "tests/data/gpt2_tiny.yaml", 1, &pl);
  if (!p) {
    arena_free(&a);
    return;
  }
  int att = 0, att_placed = 0, grads = 0, grads_placed = 0, gelu_aux = 0, dgelu = 0, dgelu_nodes = 0, bgrads = 0, both = 0, riders = 0, both_ride = 0;
  for (int i = 0; i < p->n; i++) {
    const Node *n = p->nodes[i];
    const Layout *l = p->place[i];
    int host_ok = l && p->host[l->host->id] && p->kern[l->host->id] < 0 && p->buf[l->host->id] >= 0;
    if (n->op == OP_ATTENTION) {
      att++;
      att_placed += host_ok;
    } else if (n->op == OP_ATTENTION_BACKWARD) {
      grads++;
      grads_placed += host_ok && l->host->op == OP_CONCAT;
    }
    dgelu_nodes += n->op == OP_GELU_GRAD;
  }
  for (int c = 0; c < p->nk; c++) {
    const Kernel *k = p->k[c];
    gelu_aux += k->kind == K_GEMM && k->act && k->act->op == OP_GELU && k->aux == k->anchor && k->nouts == 2;
    dgelu += k->kind == K_GEMM && k->act && k->act->op == OP_GELU_GRAD && k->aux == k->act->in[1];
    int kg = 0, kgg = 0; /* a loop kernel storing gelu(x) (recomputed) and gelu_grad(dy, x) */
    for (int q = 0; k->kind == K_LOOP && q < k->nouts; q++) {
      const Node *o = k->outs[q];
      while (op_info[o->op].cls == C_VIEW) /* (stored as the view its GEMM reads) */
        o = o->in[0];
      kg |= o->op == OP_GELU;
      kgg |= o->op == OP_GELU_GRAD;
    }
    both += kg && kgg;
    both_ride += kg && kgg && k->ncols == 1 && k->cols[0]->op == OP_SUM;
    bgrads += k->kind == K_GEMM && k->bgrad && k->anchor->op == OP_MATMUL && k->nouts == 2 && k->outs[1] == k->bgrad &&
              k->bgrad->op == OP_SUM;
    riders += k->kind == K_LOOP ? k->ncols : 0;
  }
  snprintf(detail, sizeof detail, "attention results placed %d of %d, gradients placed in a concat %d of %d", att_placed,
           att, grads_placed, grads);
  check(att == 2 && att_placed == att && grads == 6 && grads_placed == grads,
        "gpt2_tiny: attention writes its output and its gradients where the GEMMs read them", detail);
  snprintf(detail, sizeof detail, "%d GEMMs with gelu and aux, %d with gelu's gradient, %d gelu_grad nodes", gelu_aux,
           dgelu, dgelu_nodes);
  check(gelu_aux == 2 && dgelu == 0 && dgelu_nodes == 2, "gpt2_tiny: gelu in the forward GEMMs' stores", detail);
  snprintf(detail, sizeof detail, "%d loop kernels store both", both);
  check(both == 2, "gpt2_tiny: the backward recomputes gelu(x) and applies gelu's gradient in one kernel reading x once",
        detail);
  snprintf(detail, sizeof detail, "%d GEMMs store a bias gradient, %d riders, %d of them on gelu's gradient's kernels",
           bgrads, riders, both_ride);
  check(bgrads == 2 && riders == 16 && both_ride == 2,
        "gpt2_tiny: qkv's bias gradients in the store of their weights' gradient GEMMs (1 a layer); the projections' "
        "ride the layer norms' backward kernels that store their dy, beside the layer norms' own two (14), and c_fc's "
        "the pointwise kernel that stores gelu's gradient (2)",
        detail);
  /* saving every activation (no recomputed gelu to share x with): the
   * gradient's GEMM applies gelu's gradient in its store */
  const char *src = slurp(&a, "tests/data/gpt2_tiny.yaml");
  Plan pl2 = {0};
  p = src ? train_pass_of(&a, "tests/data/gpt2_tiny.yaml", arena_printf(&a, "%scompile: {remat: save-all}\n", src), 1, &pl2)
          : NULL;
  dgelu = 0;
  for (int c = 0; p && c < p->nk; c++) {
    const Kernel *k = p->k[c];
    dgelu += k->kind == K_GEMM && k->act && k->act->op == OP_GELU_GRAD && k->aux == k->act->in[1];
  }
  snprintf(detail, sizeof detail, "%d GEMMs with gelu's gradient", dgelu);
  check(p && dgelu == 2, "gpt2_tiny, save-all: gelu's gradient in the GEMMs' stores", detail);
  arena_free(&a);
}

/* The training pass of d sum(tinyops(x)) / d x (train.wrt). Nothing is
 * saved; the backward recomputes the chain from x, so the kernel that
 * writes d_x reads x only and joins the forward kernel that reads x (a
 * backward kernel that needs nothing the forward computes). Small
 * (tests/e2e/tinyops_grad.yaml, 64 x 64): the sum is not split (too few
 * elements), so the work over x stays out of it: a pointwise kernel that
 * writes d_x, then the sum. Large (bench/specs/tinyops_fwdbwd.yaml, 8192 x
 * 8192): the sum is split over blocks, and the pass is one kernel that reads
 * x and writes the loss and d_x. */
static void wrt_pass(const char *path, const char *want, int dx_kernel) {
  Arena a = {.fail_after = -1};
  Plan pl = {0};
  char detail[160];
  BPass *p = train_pass(&a, path, 0, &pl);
  if (!p) {
    arena_free(&a);
    return;
  }
  check(p->g->nwrt == 1 && p->g->ngrads == 1 && pl.nsaved == 0, path, "d_x from x alone (nothing saved)");
  char kinds[16] = {0};
  for (int c = 0; c < p->nk && c < 15; c++)
    kinds[c] = p->k[c]->kind == K_GEMM ? 'G' : p->k[c]->kind == K_EXTERN ? 'C' : p->k[c]->nreds ? 'R' : 'L';
  snprintf(detail, sizeof detail, "%s: train pass kernels %s, want %s", path, kinds, want);
  check(!strcmp(kinds, want), detail, "");
  if (dx_kernel >= p->nk) {
    arena_free(&a);
    return;
  }
  const Kernel *k = p->k[dx_kernel];
  char *mark = arena_alloc(&a, (size_t)p->n + 1);
  loads_mark(p, k, mark);
  int reads = 0, reads_x = 0, writes_dx = 0;
  for (int i = 0; i < p->n; i++) {
    reads += mark[i];
    reads_x += mark[i] && p->nodes[i]->op == OP_INPUT;
  }
  for (int i = 0; i < k->nouts; i++) {
    int bi = p->buf[k->outs[i]->id];
    writes_dx |= bi >= 0 && p->b[bi].home == HOME_IGRAD && p->b[bi].index == 0 && !strcmp(p->b[bi].name, "d_x");
  }
  snprintf(detail, sizeof detail, "%s: kernel %d reads %d values (%d inputs), writes d_x: %d", path, dx_kernel, reads,
           reads_x, writes_dx);
  check(reads == 1 && reads_x == 1 && writes_dx, detail, "reads x only and writes d_x in the caller's buffer");
  arena_free(&a);
}

/* A loss and the first kernel of its gradient: the loss's reductions over
 * the prediction (cross_entropy: the row max and sum of exp; mse_loss: the
 * sum of squares, split over blocks at 8192 x 1024) and the gradient of the
 * prediction in one kernel, the only one that reads the prediction (the
 * count of the targets that are not ignored, which reads only the targets,
 * runs before it). */
static int is_leaf_node(const Node *n) { return n->op == OP_INPUT || n->op == OP_PARAM; }

static Dim shape_numel(const Shape *sh) {
  Dim n = dim_const(1);
  for (int i = 0; i < sh->rank; i++)
    n = dim_mul(n, sh->d[i], (Loc){0});
  return n;
}

static void loss_kernels(const char *path, Op loss) {
  Arena a = {.fail_after = -1};
  Plan pl = {0};
  char detail[200];
  BPass *p = train_pass(&a, path, 1, &pl);
  if (!p) {
    arena_free(&a);
    return;
  }
  int kc = -1, grads = 0, readers = 0, pred = -1;
  const Node *pg = NULL; /* the prediction in the graph: the loss's operand, through views */
  for (int c = 0; c < p->nk && kc < 0; c++)
    for (int r = 0; r < p->k[c]->nreds && kc < 0; r++)
      if (p->orig[p->k[c]->reds[r]->id]->op == loss)
        kc = c, pg = p->orig[p->k[c]->reds[r]->id]->in[0];
  while (pg && op_info[pg->op].cls == C_VIEW)
    pg = pg->in[0];
  char *mark = arena_alloc(&a, (size_t)p->n + 1);
  if (kc >= 0) {
    const Kernel *k = p->k[kc];
    for (int i = 0; i < k->nouts; i++) {
      Dim n = shape_numel(&k->outs[i]->shape);
      grads += k->outs[i]->id >= p->nfwd && dim_eq(&n, &k->numel);
    }
    loads_mark(p, k, mark); /* the prediction: what it loads over its whole space */
    for (int i = 0; i < p->n && pred < 0; i++)
      if (mark[i] && p->orig[i] == pg)
        pred = i;
    for (int i = 0; i < p->n && pred < 0; i++) { /* (an alias of it: what the kernel loads over its whole space) */
      Dim n = shape_numel(&p->nodes[i]->shape);
      if (mark[i] && !is_leaf_node(p->nodes[i]) && dim_eq(&n, &k->numel))
        pred = i;
    }
    for (int c = 0; c < p->nk && pred >= 0; c++) { /* the kernels that pass over it */
      memset(mark, 0, (size_t)p->n + 1);
      loads_mark(p, p->k[c], mark);
      readers += mark[pred] && p->k[c]->kind == K_LOOP && dim_eq(&p->k[c]->numel, &k->numel);
    }
  }
  snprintf(detail, sizeof detail,
           "%s: the %s kernel (#%d) stores %d gradient(s) over its input; %d kernel(s) pass over the prediction (%%%d)",
           path, op_info[loss].name, kc + 1, grads, readers, pred);
  check(kc >= 0 && grads == 1 && readers == 1, detail, "the loss and its gradient in one kernel over the prediction");
  arena_free(&a);
}

/* ---------------------------------------------------------------- in place */

/* The buffer of pass p's node whose graph node is `name`'s binding (its
 * last node of that name), or -1. */
static int buf_named(const BPass *p, const char *name) {
  int bi = -1;
  for (int i = 0; i < p->nb; i++) {
    const Node *o = p->orig[p->b[i].node->id];
    if (o->name && !strcmp(o->name, name) && p->b[i].home == HOME_ARENA)
      bi = i;
  }
  return bi;
}

/* plan_check on a copy of p's buffers changed by f: it must fail. */
static void expect_plan_check_fails(BPass *p, const char *what, void (*f)(Buffer *b, int nb, int o, int i), int o, int i) {
  Buffer *saved = malloc(sizeof(Buffer) * (size_t)(p->nb + 1));
  memcpy(saved, p->b, sizeof(Buffer) * (size_t)p->nb);
  f(p->b, p->nb, o, i);
  char err[512] = "";
  int bad = plan_check(p, err, sizeof err);
  check(bad != 0, what, bad ? "" : "plan_check accepted it");
  memcpy(p->b, saved, sizeof(Buffer) * (size_t)p->nb);
  free(saved);
}
static void forget_pair(Buffer *b, int nb, int o, int i) { (void)nb, (void)i, b[o].inplace = -1; }
static void read_later(Buffer *b, int nb, int o, int i) { (void)nb, (void)o, b[i].last++; }
static void third_on_slot(Buffer *b, int nb, int o, int i) {
  for (int j = 0; j < nb; j++) /* another buffer live at the pair's kernel, moved onto the pair's bytes */
    if (j != o && j != i && b[j].home == HOME_ARENA && b[j].bytes && b[j].first <= b[o].first && b[o].first <= b[j].last) {
      b[j].offset = b[o].offset;
      return;
    }
}

/* GPT-2's cross-entropy kernel (tests/data/gpt2_tiny.yaml's training pass,
 * found from the graph: the loop kernel that reduces the amax of the
 * cross_entropy over the logits) writes the logits' gradient over the
 * logits: the row loss is its epilogue, so no later kernel reads the
 * logits, and the gradient's buffer is recorded in place of the logits' at
 * their offset. plan_check allows that pair and no other overlap: it fails
 * when the pair is not recorded, when the input is read after the kernel,
 * and when a third buffer live there is moved onto the bytes. */
static void gpt2_in_place(void) {
  Arena a = {.fail_after = -1};
  Plan pl = {0};
  char detail[300];
  BPass *p = train_pass(&a, "tests/data/gpt2_tiny.yaml", 1, &pl);
  if (!p) {
    arena_free(&a);
    return;
  }
  int kc = -1, li = -1, go = -1;
  for (int c = 0; c < p->nk && kc < 0; c++)
    for (int r = 0; r < p->k[c]->nreds && kc < 0; r++) {
      const Node *red = p->k[c]->reds[r];
      if (red->op == OP_AMAX && p->orig[red->id]->op == OP_CROSS_ENTROPY) {
        const Node *x = red->in[0];
        while (x->op == OP_CAST || op_info[x->op].cls == C_VIEW) /* f32 statistics of the logits' view */
          x = x->in[0];
        kc = c, li = p->buf[x->id];
      }
    }
  for (int i = 0; kc >= 0 && i < p->k[kc]->nouts; i++) { /* the gradient: stored over the kernel's whole space */
    const Node *n = p->k[kc]->outs[i];
    Dim nn = shape_numel(&n->shape);
    if (n->id >= p->nfwd && dim_eq(&nn, &p->k[kc]->numel))
      go = p->buf[n->id];
  }
  const Buffer *o = go >= 0 ? &p->b[go] : NULL, *in = li >= 0 ? &p->b[li] : NULL;
  snprintf(detail, sizeof detail, "kernel %d, logits %s (kernels %d..%d, +%lld), gradient %s (in place of %d, +%lld)",
           kc + 1, in ? in->name : "?", in ? in->first + 1 : 0, in ? in->last + 1 : 0, in ? (long long)in->offset : -1,
           o ? o->name : "?", o ? o->inplace : -2, o ? (long long)o->offset : -1);
  check(in && o && in->last == kc && o->inplace == li && o->offset == in->offset && in->home == HOME_ARENA,
        "gpt2_tiny: the cross-entropy kernel reads the logits last and writes their gradient in place", detail);
  char err[512] = "";
  check(!plan_check(p, err, sizeof err), "gpt2_tiny: plan_check allows the in-place pair", err);
  if (in && o && o->inplace == li) {
    expect_plan_check_fails(p, "gpt2_tiny: plan_check refuses the pair's overlap unrecorded", forget_pair, go, li);
    expect_plan_check_fails(p, "gpt2_tiny: plan_check refuses the pair when the input is read after its kernel",
                            read_later, go, li);
    expect_plan_check_fails(p, "gpt2_tiny: plan_check refuses a third buffer on the pair's bytes", third_on_slot, go, li);
  }
  arena_free(&a);
}

/* in place or not, in small forward passes: y's buffer takes x's slot
 * (want 1) or has its own (want 0). */
static void expect_in_place(const char *name, const char *src, const char *x, const char *y, int want) {
  Arena a = {.fail_after = -1};
  BPass *p = forward_of(&a, name, src, 1);
  int xi = p ? buf_named(p, x) : -1, yi = p ? buf_named(p, y) : -1;
  char what[256], detail[200], err[512] = "";
  snprintf(what, sizeof what, "in place: %s %s %s's bytes (%s)", y, want ? "takes" : "does not take", x, name);
  snprintf(detail, sizeof detail, "%s: buffer %d, %s: buffer %d in place of %d", x, xi, y, yi,
           yi >= 0 ? p->b[yi].inplace : -2);
  check(xi >= 0 && yi >= 0 && (p->b[yi].inplace == xi) == want, what, detail);
  if (p && plan_check(p, err, sizeof err))
    check(0, what, err);
  arena_free(&a);
}

static void in_place_cases(void) {
  Arena a = {.fail_after = -1};
  const char *dims = "  B: {dynamic: true, max: 64}\n  N: 48", *in = "  x: [B, N]",
             *ws = "  w1: {shape: [N, N]}\n  w2: {shape: [N, N]}\n";
  /* a softmax over a GEMM's rows, h read by nothing after it: in place */
  expect_in_place("softmax", spec(&a, dims, in, ws, "  - h: linear(x, w1)\n  - s: softmax(h, -1)\n  - y: linear(s, w2)"),
                  "h", "s", 1);
  /* h read again by a later kernel (the second GEMM): not its last reader */
  expect_in_place("softmax, h read later",
                  spec(&a, dims, in, ws,
                       "  - h: linear(x, w1)\n  - s: softmax(h, -1)\n  - y: linear(s, w2) + linear(h, w2)"),
                  "h", "s", 0);
  /* a pointwise kernel reading h at its own element: in place; reading it
   * transposed (another thread's element): not */
  const char *sq = "  N: 48", *sx = "  x: [N, N]";
  expect_in_place("pointwise", spec(&a, sq, sx, ws, "  - h: linear(x, w1)\n  - t: exp(h) * 2\n  - y: linear(t, w2)"),
                  "h", "t", 1);
  expect_in_place("pointwise, transposed",
                  spec(&a, sq, sx, ws, "  - h: linear(x, w1)\n  - t: exp(transpose(h, 0, 1)) * 2\n  - y: linear(t, w2)"),
                  "h", "t", 0);
  /* a stored before h is read in the same loop iteration (a reads only x):
   * a over h would change h's element before b reads it; b, which reads
   * h before its store, may take its bytes */
  const char *ab = spec(&a, sq, sx, ws,
                        "  - h: linear(x, w1)\n  - u: exp(x) * 2\n  - v: h + u\n  - y: linear(u, w2) + linear(v, w2)");
  expect_in_place("store before the read", ab, "h", "u", 0);
  expect_in_place("store before the read", ab, "h", "v", 1);
  /* a row's values read at another row (a broadcast of the row sums over
   * the columns, transposed): not */
  expect_in_place("softmax, transposed",
                  spec(&a, sq, sx, ws,
                       "  - h: linear(x, w1)\n  - s: softmax(transpose(h, 0, 1), -1)\n  - y: linear(s, w2)"),
                  "h", "s", 0);
  arena_free(&a);
}

static void wrt_kernels(void) {
  wrt_pass("tests/e2e/tinyops_grad.yaml", "LR", 0);
  wrt_pass("bench/specs/tinyops_fwdbwd.yaml", "R", 0);
}

/* ---------------------------------------------------------------- the CUDA mapping */

/* The CUDA (cuda = 1) or CPU file of a model's forward pass. */
static const char *forward_text(Arena *a, const char *name, const char *src, int cuda, BPass **out) {
  Graph *g = load(a, name, src);
  if (!g)
    return "";
  BPass *p[NPASS] = {0};
  build_passes(g, NULL, 1, 2, p);
  if (out)
    *out = p[PASS_FORWARD];
  return render_file(g, p, cuda, name);
}

/* The name of the buffer that holds the forward pass's value `name`. */
static const char *buf_of(BPass *p, const char *name) {
  for (int i = 0; p && i < p->nb; i++) {
    const Node *o = p->orig[p->b[i].node->id];
    if (o->name && !strcmp(o->name, name))
      return p->b[i].name;
  }
  return "?";
}

static int count_text(const char *text, const char *needle) {
  int n = 0;
  for (const char *t = strstr(text, needle); t; t = strstr(t + 1, needle))
    n++;
  return n;
}

static void expect_text(const char *text, const char *what, const char *needle, int present) {
  char w[256];
  snprintf(w, sizeof w, "%s: %s'%s'", what, present ? "" : "no ", needle);
  check(!strstr(text, needle) == !present, w, "");
}

static void cuda_mapping(void) {
  Arena a = {.fail_after = -1};
  BPass *p = NULL;
  /* tinyops: one pointwise kernel, x read and y written as float4 */
  char *tiny = slurp(&a, "spec/examples/tinyops.yaml");
  if (tiny) {
    const char *cu = forward_text(&a, "tinyops", tiny, 1, &p);
    const char *x = buf_of(p, "x"), *y = buf_of(p, "y");
    expect_text(cu, "tinyops: x loaded as vectors", arena_printf(&a, "((const tinyops_vec<float, 4> *)%s)[iv]", x), 1);
    expect_text(cu, "tinyops: y stored as vectors", arena_printf(&a, "((tinyops_vec<float, 4> *)%s)[iv] = ", y), 1);
    expect_text(cu, "tinyops: the scalar loop only past the vectors", "i = nv * 4 + ", 1);
    expect_text(cu, "tinyops: 32-bit indices (8192^2 elements)", "const int n = ", 1);
    expect_text(cu, "tinyops: 32-bit indices", "int64_t i", 0);
    const char *cpu = forward_text(&a, "tinyops", tiny, 0, NULL);
    expect_text(cpu, "tinyops CPU", "_vec<", 0);
    expect_text(cpu, "tinyops CPU: 64-bit indices", "for (int64_t i = lo; i < hi; i++)", 1);
    expect_text(cpu, "tinyops CPU: the loop a leaf compiled per ISA", "TINYOPS_CLONES static void k1_div_part(int64_t lo, int64_t hi, ", 1);
    expect_text(cpu, "tinyops CPU: chunks the threads take in turn, in units of 16", "while (tinyops_chunk(&next, n, 16, &lo, &hi))", 1);
  }
  const char *dims = "  B: {dynamic: true, max: 64}\n  D: 48";
  /* a broadcast operand stays a scalar load */
  const char *cu = forward_text(&a, "bias", spec(&a, dims, "  x: [B, D]\n  c: [D]", NULL, "  - y: x * c + 1"), 1, &p);
  expect_text(cu, "x * c: x loaded as vectors", arena_printf(&a, "((const t_vec<float, 4> *)%s)[iv]", buf_of(p, "x")), 1);
  expect_text(cu, "x * c: c loaded by element", arena_printf(&a, "t_vec<float, 4> *)%s)", buf_of(p, "c")), 0);
  /* bf16: 8 elements a vector, f32 math */
  cu = forward_text(&a, "bf16", arena_printf(&a, "dtype: bf16\n%s", spec(&a, dims, "  x: [B, D]", NULL, "  - y: exp(x) * 2")), 1,
                    &p);
  expect_text(cu, "bf16 pointwise: 8 lanes", arena_printf(&a, "((const t_vec<uint16_t, 8> *)%s)[iv]", buf_of(p, "x")), 1);
  /* a bool cast to bf16 is 0 or 1, exact: not rounded (the product is) */
  cu = forward_text(&a, "bool cast", arena_printf(&a, "dtype: bf16\n%s", spec(&a, dims, "  x: [B, D]", NULL,
                                                                             "  - y: x * cast(gt(x, 0), bf16)")),
                    1, NULL);
  check(count_text(cu, " = (float)v") == 2 && count_text(cu, "_round_bf16((float)") == 0 &&
            count_text(cu, "_round_bf16(v") == 2,
        "bf16: a cast of a comparison is not rounded, the product after it is (vector and scalar loops)", "");
  /* more than 2^30 elements: 64-bit indices */
  cu = forward_text(&a, "huge", spec(&a, "  N: 65536", "  x: [N, N]", NULL, "  - y: x * 2"), 1, NULL);
  expect_text(cu, "2^32 elements: 64-bit indices", "const int64_t n = ", 1);
  /* a full sum of 2^24 elements, and a column sum over 2^16 rows: split */
  cu = forward_text(&a, "full sum", spec(&a, "  N: 4096", "  x: [N, N]", NULL, "  - s: sum(x * x)"), 1, NULL);
  expect_text(cu, "full sum: split over blocks", "t_split_last(", 1);
  expect_text(cu, "full sum: its grid", "dim3(t_blocks(1, 1), t_split(16777216, ", 1);
  cu = forward_text(&a, "column sum", spec(&a, "  B: {dynamic: true, max: 65536}\n  D: 48", "  x: [B, D]", NULL,
                                           "  - s: sum(x, 0)\n  - y: exp(s)"),
                    1, NULL);
  expect_text(cu, "column sum over many rows: split", "t_split_column_sum(", 1);
  /* bf16 column sums and a max of 768 columns (GPT-2's layer-norm and bias
   * gradients): 8 columns a thread, each accumulator's 8 combined in one
   * pass into warp 0, the blocks' partials rows of n_o floats (h, a GEMM's
   * result in the arena, is aligned for vectors; an input may not be) */
  cu = forward_text(&a, "column vectors",
                    arena_printf(&a, "dtype: bf16\n%s",
                                 spec(&a, "  B: {dynamic: true, max: 65536}\n  D: 768", "  x: [B, D]", "  w: [D, D]",
                                      "  - h: matmul(x, w)\n  - s: sum(h, 0)\n  - q: sum(h * h, 0)\n  - m: amax(h, 0)\n"
                                      "outputs: [s, q, m]")),
                    1, NULL);
  expect_text(cu, "column vectors: 8 columns a thread", "const int oc = o0 / 8 + threadIdx.x % 32;", 1);
  /* the row loop's lanes read h as vectors, never at its column o: no o declared there (nvcc warns of it) */
  check(count_text(cu, "const int o = oc * 8 + lane;") == 1, "column vectors: o declared only where the results use it", cu);
  check(count_text(cu, "t_column_sum_v(acc") == 2 && count_text(cu, "t_column_max_v(acc") == 1,
        "column vectors: one combine per accumulator (2 sums, 1 max)", "");
  check(count_text(cu, "t_split_column_sum_v(split_part + ") == 2 && count_text(cu, "t_split_column_max_v(split_part + ") == 1,
        "column vectors: the last block totals each accumulator's rows of partials", "");
  expect_text(cu, "column vectors: reduction 2's partials after 2 x gridDim.y rows",
              "split_part[(2 * gridDim.y + blockIdx.y) * n_o + oc * 8 + lane] = ", 1);
  expect_text(cu, "column vectors: blocks of 512, 128 rows or more each, about 256 in all",
              "t_split(dim_B, 128, ((768) + 255) / 256, 256)), 512, 0, st>>>", 1);
  expect_text(cu, "column vectors: no per-column combine", "t_column_sum(", 0);
  /* its row loop (step gridDim.y x the block's warps) is counted, so that the unrolled copies' loads go out
   * together: a strided loop's copies each wait behind an exit test */
  expect_text(cu, "column vectors: a counted row loop",
              "for (int r_i = 0, r_n = t_steps<int>(live ? blockIdx.y * (blockDim.x / 32) + threadIdx.x / 32 : n_r, n_r, "
              "gridDim.y * (blockDim.x / 32)); r_i < r_n; r_i++) {", 1);
  expect_text(cu, "column vectors: row r of the count",
              "const int r = blockIdx.y * (blockDim.x / 32) + threadIdx.x / 32 + r_i * (gridDim.y * (blockDim.x / 32));", 1);
  expect_text(cu, "column vectors: no strided row loop", "; live && r < n_r;", 0);
  cu = forward_text(&a, "small sum", spec(&a, dims, "  x: [B, D]", NULL, "  - s: sum(x)"), 1, NULL);
  expect_text(cu, "sum of 64 x 48: one block", "split", 0);
  cu = forward_text(&a, "long softmax", spec(&a, "  B: 4\n  D: 65536", "  x: [B, D]", NULL, "  - y: softmax(x, -1)"), 1,
                    NULL);
  expect_text(cu, "softmax over 65536 (two phases): one block a row", "split", 0);
  expect_text(cu, "softmax over 65536: rows too long to keep in registers", "rj <", 0);
  /* a row of more than 8 vectors a thread at 256 threads: 1024 threads a row (its launch and the kernel's
   * register cap agree), the row not kept in registers (GPT-2's vocabulary row of 50304 bf16 would be 7
   * vectors a thread); a row of 4096 f32 keeps 256 threads and its 4 vectors a thread in registers. (256 rows:
   * with few rows, the values over the rows are a pointwise kernel of their own, and the row kernel reads its
   * row once) */
  expect_text(cu, "softmax over 65536: 1024 threads a row", ", 1), 1024, 0, st>>>", 1);
  expect_text(cu, "softmax over 65536: the kernel capped for 1024 threads", "void __launch_bounds__(1024) k", 1);
  cu = forward_text(&a, "vocabulary rows",
                    arena_printf(&a, "dtype: bf16\n%s", spec(&a, "  B: 256\n  V: 50304", "  x: [B, V]", NULL,
                                                             "  - y: log_softmax(x, -1)")),
                    1, &p);
  /* a long row read in two passes or more that fits SROW_MAX (50304 bf16: 100608 bytes): copied into shared
   * memory once, each thread its own vectors, 512 threads a row, two blocks an SM; its max and sum of
   * exponentials two passes over it, not one online pass */
  expect_text(cu, "log_softmax over 50304 bf16: 512 threads a row, its row in dynamic shared memory",
              ", 1), 512, 100608, st>>>", 1);
  expect_text(cu, "log_softmax over 50304 bf16: the launch asks for the shared memory",
              "cudaFuncAttributeMaxDynamicSharedMemorySize, 100608);", 1);
  expect_text(cu, "log_softmax over 50304 bf16: two blocks an SM", "void __launch_bounds__(512, 2) k", 1);
  expect_text(cu, "log_softmax over 50304 bf16: not in registers", "this thread's vectors of", 0);
  check(count_text(cu, arena_printf(&a, "t_cp16(s2 + rv, (const t_vec<uint16_t, 8> *)(%s + o * n_r) + rv);",
                                    buf_of(p, "x"))) == 1,
        "log_softmax over 50304 bf16: x's row copied into shared memory once", cu);
  check(count_text(cu, arena_printf(&a, "((const t_vec<uint16_t, 8> *)(%s + o * n_r))[rv]", buf_of(p, "x"))) == 0,
        "log_softmax over 50304 bf16: no pass reads x's row from memory", cu);
  check(count_text(cu, "((const t_vec<uint16_t, 8> *)s2)[rv]") == 3,
        "log_softmax over 50304 bf16: the max, the sum and the output passes read the row in shared memory", cu);
  expect_text(cu, "log_softmax over 50304 bf16: no online max and sum", "the online max", 0);
  cu = forward_text(&a, "vocabulary sums",
                    arena_printf(&a, "dtype: bf16\n%s", spec(&a, "  B: 256\n  V: 50304", "  x: [B, V]", NULL,
                                                             "  - y: sum(x * x, -1)")),
                    1, NULL);
  /* read in one pass (split over blocks): nothing to keep */
  expect_text(cu, "sum over 50304 bf16: no shared memory row", "_srow", 0);
  expect_text(cu, "sum over 50304 bf16: no dynamic shared memory asked for", "cudaFuncSetAttribute", 0);
  cu = forward_text(&a, "rows of 4096", spec(&a, "  B: 256\n  D: 4096", "  x: [B, D]", NULL, "  - y: softmax(x, -1)"), 1,
                    NULL);
  expect_text(cu, "softmax over 4096 f32: 256 threads a row", ", 1), 256, 0, st>>>", 1);
  expect_text(cu, "softmax over 4096 f32: no register cap", "__launch_bounds__", 0);
  expect_text(cu, "softmax over 4096 f32: 4 vectors a thread in registers", "[4];  /* this thread's vectors of ", 1);
  /* layer_norm over rows of 512 f16 (three phases: mean, variance, output):
   * each lane's 2 vectors of its row loaded once, kept in registers */
  cu = forward_text(&a, "layer_norm rows",
                    arena_printf(&a, "dtype: f16\n%s", spec(&a, "  B: 64\n  D: 512", "  x: [B, D]", NULL,
                                                            "  - y: layer_norm(x)")),
                    1, &p);
  const char *x = buf_of(p, "x");
  expect_text(cu, "layer_norm: x's row in registers", arena_printf(&a, "[2];  /* this thread's vectors of %s's row o */", x), 1);
  expect_text(cu, "layer_norm: a warp's loop past the vectors (a constant step) stays strided",
              "for (int r = nrv * 8 + threadIdx.x % 32; r < n_r; r += 32) {", 3);
  const char *load = arena_printf(&a, "[rj] = ((const t_vec<uint16_t, 8> *)(%s + o * n_r))[rv];", x);
  check(count_text(cu, load) == 1, "layer_norm: x's vectors loaded once, into the registers", "");
  check(count_text(cu, "[rj].v[lane])") == 3, "layer_norm: the three phases read the registers", "");
  check(count_text(cu, "for (int rj = 0; rj < 2; rj++) {") == 4, "layer_norm: three phases over the same 2 vectors (and the loads' loop)", "");
  /* the loads in a loop of their own before the first phase's, each predicated (not behind the exit test of
   * the vector before it), so that they go out together */
  check(count_text(cu, "  if (rv < nrv)\n") == 1 && count_text(cu, "if (rv >= nrv) break;") == 3 &&
            strstr(cu, load) && strstr(cu, load) < strstr(cu, "if (rv >= nrv) break;"),
        "layer_norm: the row's vectors loaded before the phases' loops", cu);
  /* its weight and bias: the same elements for every row, one vector load
   * a vector of the row (not 8 scalar loads), aligned as the rows are */
  cu = forward_text(&a, "layer_norm rows, affine",
                    arena_printf(&a, "dtype: f16\n%s",
                                 spec(&a, "  B: 64\n  D: 512", "  x: [B, D]",
                                      "  w: {shape: [D], init: ones}\n  b: {shape: [D], init: zeros}",
                                      "  - y: layer_norm(x, w, b)")),
                    1, &p);
  const char *w = buf_of(p, "w"), *bb = buf_of(p, "b");
  expect_text(cu, "layer_norm: w's vector at the row's vector rv",
              arena_printf(&a, " = ((const t_vec<uint16_t, 8> *)%s)[rv];", w), 1);
  expect_text(cu, "layer_norm: b's vector at the row's vector rv",
              arena_printf(&a, " = ((const t_vec<uint16_t, 8> *)%s)[rv];", bb), 1);
  expect_text(cu, "layer_norm: w in the vectors' alignment check", arena_printf(&a, "(uintptr_t)%s | ", w), 1);
  expect_text(cu, "layer_norm: w by element only past the vectors", arena_printf(&a, "_load_f16(%s[r])", w), 1);
  /* a row sum through heads' views ([B, T, H D] read as [B, H, T, D]: attention's delta): each row lies
   * contiguous and 16-byte aligned at a base of o alone, so its elements come a vector at a time (8 lanes a
   * row of 64 bf16), as a contiguous row's do; a row of 12 bf16 (24 bytes apart) does not */
  cu = forward_text(&a, "heads' view rows",
                    arena_printf(&a, "dtype: bf16\n%s",
                                 spec(&a, "  B: {dynamic: true, max: 8}\n  T: 32", "  x: [B, T, 256]\n  y: [B, T, 256]", NULL,
                                      "  - d: sum(transpose(reshape(x, [B, T, 4, 64]), 1, 2) * "
                                      "transpose(reshape(y, [B, T, 4, 64]), 1, 2), -1)")),
                    1, &p);
  check(count_text(cu, "const t_vec<uint16_t, 8> v") == 2 && count_text(cu, "((const t_vec<uint16_t, 8> *)(") == 2,
        "heads' view rows: one vector load a row's vector for each of x and y", cu);
  expect_text(cu, "heads' view rows: 8 lanes a row", "t_group_sum(acc0, 8)", 1);
  expect_text(cu, "heads' view rows: both in the alignment check",
              arena_printf(&a, "(uintptr_t)%s | (uintptr_t)%s", buf_of(p, "x"), buf_of(p, "y")), 1);
  cu = forward_text(&a, "heads' view rows of 12",
                    spec(&a, "  B: {dynamic: true, max: 8}\n  T: 32", "  x: [B, T, 48]", NULL,
                         "  - d: sum(transpose(reshape(x, [B, T, 4, 12]), 1, 2), -1)"),
                    1, NULL);
  expect_text(cu, "heads' view rows of 12 f32 (48 bytes apart): vectors", "t_vec<float, 4>", 1);
  cu = forward_text(&a, "heads' view rows of 6",
                    spec(&a, "  B: {dynamic: true, max: 8}\n  T: 32", "  x: [B, T, 30]", NULL,
                         "  - d: sum(transpose(reshape(x, [B, T, 5, 6]), 1, 2), -1)"),
                    1, NULL);
  expect_text(cu, "heads' view rows of 6 f32 (24 bytes apart): no vectors", "t_vec<", 0);
  /* one phase (a row sum): nothing to keep */
  cu = forward_text(&a, "row sum", spec(&a, "  B: 64\n  D: 512", "  x: [B, D]", NULL, "  - s: sum(x, 1)"), 1, NULL);
  expect_text(cu, "row sum: one pass, no register row", "rj <", 0);
  arena_free(&a);
}

/* Riders: a layer norm's weight and bias gradients (sums over the rows of
 * its backward's space) ride the row kernel of its backward: no column
 * kernel of their own in the train pass. CUDA adds each thread's positions
 * into its column of the block's shared sums, each block's into a row of
 * partials, and a finish kernel (NAME_cols) adds those; the CPU adds each
 * chunk's rows into cpart and the caller the chunks in order. Rows too
 * long for a warp (2048), or not a multiple of 8 elements (100), keep the
 * column kernel. */
static void riders(void) {
  Arena a = {.fail_after = -1};
  for (int v = 0; v < 3; v++) {
    int d = v == 0 ? 768 : v == 1 ? 2048 : 100;
    const char *src = arena_printf(&a, "dtype: bf16\n%soutputs: [y]\ntrain:\n  loss: loss\n  optimizer: {sgd: {lr: 0.1}}\n",
                                   spec(&a, arena_printf(&a, "  B: {dynamic: true, max: 64}\n  D: %d", d), "  x: [B, D]",
                                        "  w: {shape: [D], init: ones}\n  b: {shape: [D], init: zeros}",
                                        "  - y: layer_norm(x, w, b) * 2\n  - loss: mean(y * y)"));
    Plan pl = {0};
    char what[128];
    BPass *ps[NPASS] = {0};
    Graph *g = train_passes(&a, "riders", src, 0, &pl, ps);
    BPass *p = g ? ps[PASS_TRAIN] : NULL;
    int rows = 0, cols = 0, riders = 0;
    for (int c = 0; p && c < p->nk; c++) {
      const Kernel *k = p->k[c];
      if (k->kind != K_LOOP || !k->nreds)
        continue;
      if (kernel_rows(k))
        rows++, riders += k->ncols;
      else
        cols++;
    }
    if (v == 0 && p) { /* dedupe: the backward's mean divides by the literal 768, the recomputed forward's by the
                          dim D = 768: the same value, so one sum of the row and one of its squares each */
      int rowsums = 0;
      int64_t one = 0;
      for (int i = 0; i < p->n; i++)
        rowsums += p->nodes[i]->op == OP_SUM && p->nodes[i]->shape.rank == 2 && dim_is_const(&p->nodes[i]->shape.d[1], &one) &&
                   one == 1;
      char got[64];
      snprintf(got, sizeof got, "%d row sums", rowsums);
      check(rowsums == 4, "riders, rows of 768: the forward's two row sums, and the backward's two (its recomputed "
                          "forward's, shared with its own)", got);
    }
    snprintf(what, sizeof what, "riders, rows of %d: the weight and bias gradients %s", d,
             v == 0 ? "ride the backward's row kernel" : "stay a column kernel");
    char detail[96];
    snprintf(detail, sizeof detail, "%d row kernels, %d riders, %d column kernels", rows, riders, cols);
    check(p && (v == 0 ? riders == 2 && cols == 0 : riders == 0 && cols == 1), what, detail);
    if (v || !g)
      continue;
    const char *cu = render_file(g, ps, 1, "riders"), *cpu = render_file(g, ps, 0, "riders");
    expect_text(cu, "riders (CUDA): a thread's 24 positions of rows of 768 bf16 (3 vectors of 8) for 2 riders",
                "__shared__ float csum[6144];", 1);
    expect_text(cu, "riders (CUDA): the vector loop adds into its column", "csum[(24 + rj * 8 + lane) * 128 + threadIdx.x] += ", 1);
    expect_text(cu, "riders (CUDA): so does the loop past the vectors", "csum[(24 + rk) * 128 + threadIdx.x] += ", 1);
    expect_text(cu, "riders (CUDA): a block's lane groups in order, then a row of partials",
                "split_part[blockIdx.x * 1536 + j] = a;", 1);
    expect_text(cu, "riders (CUDA): whole rounds of 132 SMs, 4 warp blocks an SM", "_blocks_most(dim_B, 4, 528), 128, 0, st>>>", 1);
    expect_text(cu, "riders (CUDA): the finish over 16 blocks a tile of 32 columns", "_cols<<<dim3(t_blocks(768, 32), 16), 256", 1);
    expect_text(cu, "riders (CUDA): the finish's tile's last block adds the 16 blocks' sums",
                "if (!t_split_last(&split_count[o0 / 32]))", 1);
    expect_text(cpu, "riders (CPU): a chunk's rows add into cpart", "cpart[0 * n_r + r] += ", 1);
    expect_text(cpu, "riders (CPU): the chunks in order", "_OMP(parallel for ordered schedule(static, 1)", 1);
    expect_text(cpu, "riders (CPU): the totals", "double tot[1536];", 1);
  }
  /* one-row blocks of 384 threads (GPT-2's gelu gradient with its bias's): 3 an SM, 396 blocks */
  const char *src = arena_printf(&a, "dtype: bf16\n%soutputs: [y]\ntrain:\n  loss: loss\n  optimizer: {sgd: {lr: 0.1}}\n",
                                 spec(&a, "  B: {dynamic: true, max: 64}\n  D: 768\n  H: 3072", "  x: [B, D]",
                                      "  w: [H, D]\n  b: [H]\n  w2: [D, H]",
                                      "  - y: linear(gelu(linear(x, w, b), approximate='tanh'), w2)\n"
                                      "  - loss: mean(y * y)"));
  Plan pl = {0};
  BPass *ps[NPASS] = {0};
  Graph *g = train_passes(&a, "riders_block", src, 0, &pl, ps);
  const char *cu = g ? render_file(g, ps, 1, "riders_block") : "";
  expect_text(cu, "riders (CUDA): one-row blocks of 384 threads, 3 an SM of 132", "_blocks_most(dim_B, 1, 396), 384, 0, st>>>",
              1);
  arena_free(&a);
}

/* A repeated block's kernels print once, their parameters named as inside
 * the block (Buffer.pname; render.c's param_names): gpt2_tiny with 3 and
 * with 5 layers prints the same number of kernels in every file (the
 * middle layers' kernels are the same text; only the first and last read
 * or write the model's own buffers), while its launches grow with the
 * layers; no kernel's signature names a layer ("h_1_"), and the calls do. */
static int count_defs(const char *text, int cuda) {
  return count_text(text, cuda ? "static __global__ void" : "\n/* k");
}

static void repeated_blocks(void) {
  Arena a = {.fail_after = -1};
  const char *src = slurp(&a, "tests/data/gpt2_tiny.yaml");
  const char *at = src ? strstr(src, "repeat(block, 2, x)") : NULL;
  if (!at) {
    check(0, "repeated blocks", "tests/data/gpt2_tiny.yaml has no 'repeat(block, 2, x)'");
    arena_free(&a);
    return;
  }
  int defs[2][2] = {{0}}, calls[2] = {0};
  for (int v = 0; v < 2; v++) {
    const int layers = v ? 5 : 3;
    const char *s = arena_printf(&a, "%.*srepeat(block, %d, x)%s", (int)(at - src), src, layers, at + strlen("repeat(block, 2, x)"));
    Plan pl;
    BPass *ps[NPASS] = {0};
    Graph *g = train_passes(&a, "gpt2_tiny (repeated blocks)", s, 1, &pl, ps);
    if (!g)
      continue;
    for (int cuda = 0; cuda < 2; cuda++) {
      const char *text = render_file(g, ps, cuda, "gpt2_tiny");
      defs[v][cuda] = count_defs(text, cuda);
      if (cuda)
        calls[v] = count_text(text, "_layer_norm<<<") + count_text(text, "_layer_norm_mean_sum<<<");
      int named = 0; /* kernels' signatures (a line from "static" or "..._CLONES static" to its body's brace) */
      for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const char *c = strstr(l, "_CLONES static "), *nl = strchr(l, '\n');
        if (strncmp(l, "static ", 7) && !(c && (!nl || c < nl) && !strchr(" \t", *l)))
          continue;
        const char *e = strchr(l, '{'), *h = strstr(l, "h_1_");
        named += h && e && h < e;
      }
      char w[160];
      snprintf(w, sizeof w, "repeated blocks, %d layers (%s): no kernel's parameters name a layer", layers, cuda ? "CUDA" : "CPU");
      check(!named, w, "");
      snprintf(w, sizeof w, "repeated blocks, %d layers (%s): the calls pass a layer's buffers", layers, cuda ? "CUDA" : "CPU");
      check(strstr(text, "h_1_ln_1_w") != NULL, w, "");
      snprintf(w, sizeof w, "repeated blocks, %d layers (%s): a kernel's parameter is named as in the block", layers,
               cuda ? "CUDA" : "CPU");
      check(strstr(text, "*__restrict__ ln_1_w") || strstr(text, "*restrict ln_1_w"), w, "");
    }
  }
  char got[96];
  for (int cuda = 0; cuda < 2; cuda++) {
    snprintf(got, sizeof got, "%d kernels with 3 layers, %d with 5", defs[0][cuda], defs[1][cuda]);
    check(defs[0][cuda] > 0 && defs[0][cuda] == defs[1][cuda],
          cuda ? "repeated blocks (CUDA): the kernels do not grow with the layers" : "repeated blocks (CPU): the kernels do not grow with the layers", got);
  }
  snprintf(got, sizeof got, "%d layer-norm launches with 3 layers, %d with 5", calls[0], calls[1]);
  check(calls[0] > 0 && calls[1] > calls[0], "repeated blocks (CUDA): the launches grow with the layers", got);
  arena_free(&a);
}

/* The CPU kernels' loops are leaf functions compiled per ISA (NAME_CLONES):
 * no parallel region inside one (its body would not be cloned), and every
 * parallel region of a kernel is one that calls a leaf on the chunks its threads take,
 * but the chunks of a split reduction (few outputs of many elements). */
static void cpu_leaves(const char *path) {
  Arena a = {.fail_after = -1};
  char *src = slurp(&a, path);
  const char *cpu = src ? forward_text(&a, path, src, 0, NULL) : "";
  int leaves = 0, shares = count_text(cpu, "_chunk(&next, ");
  for (const char *t = strstr(cpu, "_CLONES static "); t; t = strstr(t + 1, "_CLONES static ")) {
    const char *end = strstr(t, "\n}\n"), *par = strstr(t, "_OMP(parallel");
    check(end && (!par || par > end), "CPU: no parallel region in a leaf", path);
    leaves++;
  }
  int regions = count_text(cpu, "_OMP(parallel"), wrappers = count_text(cpu, "_OMP(parallel if ("),
      split = count_text(cpu, "_OMP(parallel for schedule(static) if (n_r > 16384))");
  check(leaves > 0 && leaves == shares && leaves == wrappers, "CPU: a leaf and a region that calls it per kernel", path);
  check(regions == wrappers + split, "CPU: every parallel region calls a leaf (or is a split reduction's)", path);
  arena_free(&a);
}

int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : NULL;
  static const char *const models[] = {
      "spec/examples/mlp.yaml", "spec/examples/mlp3.yaml", "spec/examples/mlp_blocks.yaml",
      "spec/examples/tinyops.yaml", "spec/examples/ln_linear_gelu_res.yaml", "spec/examples/seed_attention.yaml",
      "spec/examples/gpt2.yaml", "tests/data/gpt2_tiny.yaml", "tests/e2e/all_ops.yaml", "tests/e2e/all_ops_bf16.yaml",
      "tests/e2e/train_ops.yaml", "tests/e2e/train_ops_bf16.yaml", "tests/e2e/train_f16.yaml",
      "tests/oracle/all_ops_grad.yaml", "tests/e2e/tinyops_grad.yaml", "tests/e2e/mlp_wrt.yaml", NULL};
  for (int i = 0; models[i]; i++)
    if (!only || strstr(models[i], only))
      run_model(models[i]);
  if (!only) {
    kernel_groups();
    wrt_kernels();
    loss_kernels("spec/examples/mlp.yaml", OP_CROSS_ENTROPY);
    loss_kernels("tests/data/gpt2_tiny.yaml", OP_CROSS_ENTROPY);
    loss_kernels("spec/examples/mlp_blocks.yaml", OP_MSE_LOSS);
    attention_kernels();
    gpt2_layouts();
    gpt2_in_place();
    in_place_cases();
    cuda_mapping();
    riders();
    repeated_blocks();
    cpu_leaves("spec/examples/mlp_blocks.yaml");
    cpu_leaves("tests/e2e/all_ops_bf16.yaml");
    cpu_leaves("tests/data/gpt2_tiny.yaml");
  }
  printf("%d passed, %d failed\n", npass, nfail);
  return nfail != 0;
}
