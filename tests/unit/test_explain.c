/* test_explain.c: kernel_cost (gen/explain.c) and the stop reasons tgen
 * explain prints, with every expectation derived from the spec's shapes:
 *   - tinyops' forward at N = 8192 is one kernel reading x and writing y
 *     (2 * 4 * N^2 bytes) with one FLOP per element for each pointwise op
 *     of y's cone in the graph (counted here on the graph: 8);
 *   - mlp's first GEMM (linear + bias + relu): 2*B*H*D + 2*B*H FLOPs and
 *     x, w1, b1 read, h written; its second: 2*B*C*H + B*C;
 *   - seed_attention's q @ k^T: 2*B*T*T*D FLOPs;
 *   - mlp's bytes and FLOPs are linear in B (B = 1, 2, 7) in every pass;
 *   - in every pass of every example, each kernel but the last has a stop
 *     reason and each stored value a reason for being stored.
 * Prints one line per case and "N passed, M failed". */
#include "ir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int npass, nfail;

static void check(int ok, const char *what, const char *detail) {
  if (ok)
    npass++;
  else
    nfail++;
  printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", what, detail && *detail ? ": " : "", detail ? detail : "");
}

/* The passes of a spec (planned as tgen prints them), or NULL. */
static Graph *passes(Arena *a, const char *path, BPass **ps) {
  size_t len = 0;
  char *src = read_file(a, path, &len);
  Diag dg = {0};
  Graph *g = src ? tgen_load(&dg, a, path, src, len) : NULL;
  if (!g) {
    check(0, path, src ? dg.msg : "cannot read");
    return NULL;
  }
  memset(ps, 0, sizeof(BPass *) * NPASS);
  Plan pl = {0};
  int trained = g->spec->train.present && g->loss;
  if (trained) {
    int64_t sym[MAXSYM] = {0};
    char err[256];
    for (int k = 0; k < g->nsyms; k++)
      sym[k] = g->syms[k].derived ? 0 : g->syms[k].max;
    if (autodiff(g) || partition(g, g->spec->compile.remat, g->spec->compile.memory_budget, sym, &pl, err, sizeof err)) {
      check(0, path, "partition");
      return NULL;
    }
  }
  build_passes(g, trained ? &pl : NULL, g->spec->compile.fuse, 2, ps);
  return g;
}

static int64_t cdim(const Dim *d) {
  int64_t v = -1;
  dim_is_const(d, &v);
  return v;
}

/* Pointwise ops (not constants or casts) in the graph cone of n. */
static int pw_ops(const Graph *g, const Node *n, char *seen) {
  if (seen[n->id])
    return 0;
  seen[n->id] = 1;
  int c = op_info[n->op].cls == C_PW && n->nin && n->op != OP_CAST;
  for (int k = 0; k < n->nin; k++)
    if (n->in[k])
      c += pw_ops(g, n->in[k], seen);
  return c;
}

static void tinyops(void) {
  Arena a = {.fail_after = -1};
  BPass *ps[NPASS];
  Graph *g = passes(&a, "spec/examples/tinyops.yaml", ps);
  if (!g)
    return;
  BPass *p = ps[PASS_FORWARD];
  double n = (double)cdim(&g->inputs[0].shape.d[0]) * (double)cdim(&g->inputs[0].shape.d[1]);
  char *seen = calloc((size_t)g->nnodes, 1);
  int ops = pw_ops(g, g->outputs[0], seen);
  free(seen);
  check(ops == 8, "tinyops: y's cone has 8 pointwise ops (x*2, +1, sigmoid, b*b, tanh, abs, +1, /)", NULL);
  check(p->nk == 1, "tinyops forward: one kernel", NULL);
  double b, f;
  kernel_cost(p, p->k[0], &b, &f);
  char d[160];
  snprintf(d, sizeof d, "bytes %.0f (want %.0f), flops %.0f (want %.0f)", b, 2 * 4 * n, f, n * ops);
  check(b == 2 * 4 * n && f == n * ops && n == 8192.0 * 8192.0, "tinyops forward: x read once, y written, 1 FLOP per op per element", d);
  arena_free(&a);
}

static void mlp_gemms(void) {
  Arena a = {.fail_after = -1};
  BPass *ps[NPASS];
  Graph *g = passes(&a, "spec/examples/mlp.yaml", ps);
  if (!g)
    return;
  BPass *p = ps[PASS_FORWARD];
  double B = (double)g->syms[0].max, D = (double)cdim(&g->inputs[0].shape.d[1]);
  double H = (double)cdim(&g->params[0].shape.d[0]), C = (double)cdim(&g->params[2].shape.d[0]);
  check(p->nk == 2 && p->k[0]->kind == K_GEMM && p->k[1]->kind == K_GEMM && p->k[0]->act, "mlp forward: linear+relu, linear", NULL);
  if (p->nk != 2)
    return;
  double b, f;
  char d[200];
  kernel_cost(p, p->k[0], &b, &f);
  double wb = 4 * (B * D + H * D + H + B * H), wf = 2 * B * H * D + 2 * B * H;
  snprintf(d, sizeof d, "bytes %.0f (want %.0f), flops %.0f (want %.0f)", b, wb, f, wf);
  check(b == wb && f == wf, "mlp linear+relu: x, w1, b1 read, h written; 2*B*H*D + bias + relu", d);
  kernel_cost(p, p->k[1], &b, &f);
  wb = 4 * (B * H + C * H + C + B * C), wf = 2 * B * C * H + B * C;
  snprintf(d, sizeof d, "bytes %.0f (want %.0f), flops %.0f (want %.0f)", b, wb, f, wf);
  check(b == wb && f == wf, "mlp linear: h, w2, b2 read, logits written; 2*B*C*H + bias", d);
  arena_free(&a);
}

static void attention_scores(void) {
  Arena a = {.fail_after = -1};
  BPass *ps[NPASS];
  Graph *g = passes(&a, "spec/examples/seed_attention.yaml", ps);
  if (!g)
    return;
  BPass *p = ps[PASS_FORWARD];
  const Shape *x = &g->inputs[0].shape;
  double B = (double)cdim(&x->d[0]), T = (double)cdim(&x->d[1]), D = (double)cdim(&x->d[2]);
  int found = 0;
  for (int c = 0; c < p->nk; c++) {
    const Kernel *k = p->k[c];
    if (k->kind != K_GEMM || strcmp(p->orig[k->anchor->id]->name, "s"))
      continue;
    double b, f;
    kernel_cost(p, k, &b, &f);
    char d[160];
    snprintf(d, sizeof d, "flops %.0f (want %.0f)", f, 2 * B * T * T * D);
    check(f == 2 * B * T * T * D, "seed_attention s = q @ k^T: 2*B*T*T*D", d);
    found = 1;
  }
  check(found, "seed_attention: s is a GEMM kernel", NULL);
  arena_free(&a);
}

/* Pass totals at B = v. */
static void totals(BPass *p, int64_t v, double *b, double *f) {
  p->sym[0] = v;
  *b = *f = 0;
  for (int c = 0; c < p->nk; c++) {
    double kb, kf;
    kernel_cost(p, p->k[c], &kb, &kf);
    *b += kb;
    *f += kf;
  }
}

static void mlp_linear_in_b(void) {
  Arena a = {.fail_after = -1};
  BPass *ps[NPASS];
  if (!passes(&a, "spec/examples/mlp.yaml", ps))
    return;
  for (int k = 0; k < NPASS; k++) {
    double b1, f1, b2, f2, b7, f7;
    totals(ps[k], 1, &b1, &f1);
    totals(ps[k], 2, &b2, &f2);
    totals(ps[k], 7, &b7, &f7);
    char d[200];
    snprintf(d, sizeof d, "bytes %.0f %.0f %.0f, flops %.0f %.0f %.0f", b1, b2, b7, f1, f2, f7);
    check(b2 > b1 && b7 - b1 == 6 * (b2 - b1) && f7 - f1 == 6 * (f2 - f1),
          arena_printf(&a, "mlp %s: bytes and FLOPs linear in B (B = 1, 2, 7)", pass_names[k]), d);
  }
  arena_free(&a);
}

static void reasons(const char *path) {
  Arena a = {.fail_after = -1};
  BPass *ps[NPASS];
  if (!passes(&a, path, ps))
    return;
  for (int k = 0; k < NPASS; k++) {
    BPass *p = ps[k];
    if (!p)
      continue;
    const char *bad = NULL;
    for (int c = 0; c < p->nk && !bad; c++) {
      const Kernel *kk = p->k[c];
      if ((c + 1 < p->nk) != (kk->stop && *kk->stop))
        bad = arena_printf(&a, "kernel %d of %d: stop %s", c + 1, p->nk, kk->stop ? kk->stop : "NULL");
      for (int i = 0; i < kk->nouts && !bad; i++)
        if (!p->why[kk->outs[i]->id])
          bad = arena_printf(&a, "kernel %d stores %%%d without a reason", c + 1, kk->outs[i]->id);
    }
    check(!bad, arena_printf(&a, "%s %s: a stop reason at each kernel boundary, a reason for each stored value", path, pass_names[k]), bad);
  }
  arena_free(&a);
}

int main(void) {
  tinyops();
  mlp_gemms();
  attention_scores();
  mlp_linear_in_b();
  static const char *const specs[] = {"spec/examples/gpt2.yaml", "spec/examples/ln_linear_gelu_res.yaml",
                                      "spec/examples/mlp.yaml", "spec/examples/mlp3.yaml", "spec/examples/mlp_blocks.yaml",
                                      "spec/examples/seed_attention.yaml", "spec/examples/tinyops.yaml",
                                      "tests/e2e/train_ops.yaml", "tests/e2e/all_ops_bf16.yaml"};
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
    reasons(specs[i]);
  printf("%d passed, %d failed\n", npass, nfail);
  return nfail != 0;
}
