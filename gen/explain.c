/* explain.c: tgen explain: for each pass, every kernel in order, the spec
 * lines it covers, its cost and floor time, why each value it stores is
 * stored and why the next kernel does not fuse into it (schedule.c records
 * both reasons: BPass.why, Kernel.stop).
 *
 * Cost conventions (kernel_cost), at the pass's symbol values p->sym:
 *   bytes  each distinct buffer the kernel loads, once, at its own size (a
 *          broadcast operand such as a bias counts its own elements; a slice
 *          counts its whole buffer, an upper bound; an embedding counts the
 *          table rows it gathers, its result's size), plus each value it
 *          stores;
 *   FLOPs  a loop kernel: 1 per element of each pointwise op it computes,
 *          whatever the op (an add, a compare, a select and a
 *          transcendental such as exp, tanh or erf each count 1; constants,
 *          casts and views are free), each value once at its own size; a
 *          reduction 1 per reduced element. A GEMM 2*M*N*K*batch, plus 1 per
 *          result element for its bias, activation and residual add.
 *          Attention its two GEMMs, 2*batch*Tq*Tk*(D + Dv) (no softmax, no
 *          causal discount); dropout 1 per element; embedding 0; its
 *          backward 1 per gradient element added.
 * The floor is max(bytes / copy bandwidth, FLOPs / rate) on a GPU's measured
 * ceilings (--gpu): the H100's by default (PERF.md: copy 2965 GB/s, bf16/f16
 * GEMM and attention 738 TFLOP/s, everything else at the f32 rate, 51.7
 * TFLOP/s), or the H200's (copy 4300 GB/s and bf16 788 TFLOP/s as measured
 * on the lent H200s with torch; f32 the H100's: the same multiprocessors and
 * clocks). */
#include "ir.h"

#include <stdlib.h>
#include <string.h>

static const GpuCeilings gpus[] = {
    {"h100", "H100", 2965e9, 738e12, 51.7e12},
    {"h200", "H200", 4300e9, 788e12, 51.7e12},
};

const GpuCeilings *gpu_ceilings(const char *name) {
  for (size_t i = 0; i < sizeof gpus / sizeof gpus[0]; i++)
    if (!strcmp(gpus[i].key, name))
      return &gpus[i];
  return NULL;
}

static double dimv(const BPass *p, const Dim *d) {
  int64_t v;
  const char *err;
  if (!dim_eval(p->g, d, p->sym, &v, &err))
    die("explain: size %s: %s", dim_str(p->g, d), err);
  return (double)v;
}

static double numel(const BPass *p, const Shape *s) {
  double n = 1;
  for (int k = 0; k < s->rank; k++)
    n *= dimv(p, &s->d[k]);
  return n;
}

static double nbytes(const BPass *p, const Node *n) { return numel(p, &n->shape) * dtype_size(n->dtype); }

static int in_list(Node *const *v, int n, const Node *x) {
  for (int i = 0; i < n; i++)
    if (v[i] == x)
      return 1;
  return 0;
}

static int is_attention(const Node *n) {
  return n->op == OP_ATTENTION || n->op == OP_ATTENTION_LSE || n->op == OP_ATTENTION_BACKWARD;
}

/* FLOPs of the values loop kernel k computes: n and the operands it
 * recomputes (up to loads), each once. */
static double loop_flops(const BPass *p, const Kernel *k, const Node *n, int top, char *seen) {
  if (seen[n->id])
    return 0;
  seen[n->id] = 1;
  int own = in_list(k->outs, k->nouts, n) || in_list(k->reds, k->nreds, n);
  if (n->op == OP_INPUT || n->op == OP_PARAM || (!top && !own && p->realized[n->id]))
    return 0;
  double f = 0;
  OpClass c = op_info[n->op].cls;
  if (c == C_REDUCE)
    f = numel(p, &n->in[0]->shape);
  else if (c == C_PW && n->nin && n->op != OP_CAST)
    f = numel(p, &n->shape);
  for (int j = 0; j < n->nin; j++)
    if (n->in[j])
      f += loop_flops(p, k, n->in[j], 0, seen);
  return f;
}

void kernel_cost(const BPass *p, const Kernel *k, double *bytes, double *flops) {
  char *mark = calloc((size_t)p->n + 1, 1);
  if (!mark)
    die("out of memory");
  kernel_loads(p, k, p->walk);
  for (int q = 0; q < p->walk->nlist; q++)
    mark[p->walk->list[q]] = 1;
  double b = 0, f = 0;
  for (int i = 0; i < p->n; i++) {
    const Node *n = p->nodes[i];
    if (!mark[i] || (layout_view1(n) && mark[n->in[0]->id])) /* an alias: its operand's bytes */
      continue;
    b += k->anchor && k->anchor->op == OP_EMBEDDING && n == k->anchor->in[1] ? nbytes(p, k->anchor) : nbytes(p, n);
  }
  for (int i = 0; i < k->nouts; i++)
    b += nbytes(p, k->outs[i]);
  const Node *a = k->anchor;
  if (k->kind == K_GEMM) {
    const Node *x = a->in[0];
    f = 2 * numel(p, &a->shape) * dimv(p, &x->shape.d[x->shape.rank - 1]);
    double e = numel(p, &a->shape);
    f += e * ((a->op == OP_LINEAR && a->nin > 2 && a->in[2]) + (k->act != NULL) + (k->add != NULL));
    if (k->bgrad) /* the sum of op(A)'s K x M elements */
      f += numel(p, &k->bgrad->in[0]->shape);
  } else if (a && is_attention(a)) {
    /* the products of T x T scores (a causal mask skips about half): the
     * forward's S = q k^T and P v; the backward recomputes S, and computes
     * dy v^T for dq or dk, then P^T dy (dv), dS k (dq), dS^T q (dk) */
    const Shape *q = &a->in[0]->shape, *kk = &a->in[1]->shape, *v = &a->in[2]->shape;
    double d = dimv(p, &q->d[q->rank - 1]), dv = dimv(p, &v->d[v->rank - 1]);
    double scores = numel(p, q) / d * dimv(p, &kk->d[kk->rank - 2]) * (a->flag ? 0.5 : 1);
    if (a->op != OP_ATTENTION_BACKWARD)
      f = 2 * scores * (d + dv);
    else {
      int want[3] = {0, 0, 0};
      for (int i = 0; i < k->nouts; i++)
        want[k->outs[i]->axis] = 1;
      f = 2 * scores * (d + (want[0] || want[1] ? dv : 0) + want[0] * d + want[1] * d + want[2] * dv);
    }
  } else if (a && a->op == OP_DROPOUT) {
    f = numel(p, &a->shape);
  } else if (a && a->op == OP_EMBEDDING_BACKWARD) {
    f = numel(p, &a->in[1]->shape);
  } else if (k->kind == K_LOOP) {
    memset(mark, 0, (size_t)p->n + 1);
    for (int i = 0; i < k->nouts; i++)
      f += loop_flops(p, k, k->outs[i], 1, mark);
    for (int i = 0; i < k->nreds; i++)
      f += loop_flops(p, k, k->reds[i], 1, mark);
  }
  free(mark);
  *bytes = b;
  *flops = f;
}

/* ---------------------------------------------------------------- the report */

static const char *kind_name(const Kernel *k) {
  return k->kind == K_GEMM ? "GEMM" : k->kind != K_LOOP ? "call" : k->nreds ? "reduction" : "pointwise";
}

/* The renderer's name of a loop kernel; a library call's ops ("linear+relu"). */
static const char *kname(const BPass *p, const Kernel *k) {
  if (k->name)
    return k->name;
  if (!k->anchor)
    return "?";
  return arena_printf(p->g->arena, "%s%s%s%s%s", op_info[k->anchor->op].name, k->act ? "+" : "",
                      k->act ? op_info[k->act->op].name : "", k->add ? "+add" : "", k->bgrad ? "+bias_grad" : "");
}

static double floor_us(const GpuCeilings *c, const Kernel *k, double bytes, double flops) {
  DType t = k->anchor ? k->anchor->dtype : DT_F32;
  int mma = (k->kind == K_GEMM || (k->anchor && is_attention(k->anchor))) && (t == DT_BF16 || t == DT_F16);
  double tb = bytes / c->copy, tf = flops / (mma ? c->gemm16 : c->f32);
  return 1e6 * (tb > tf ? tb : tf);
}

/* v with an SI prefix, 3 digits ("1.05 MB", "268 MFLOP"). */
static const char *si(Arena *a, double v, const char *unit) {
  static const char *const pre[] = {"", "k", "M", "G", "T", "P"};
  int e = 0;
  while (v >= 999.5 && e < 5)
    v /= 1000, e++;
  return arena_printf(a, e == 0 || v >= 99.95 ? "%.0f %s%s" : v >= 9.995 ? "%.1f %s%s" : "%.2f %s%s", v, pre[e], unit);
}

/* Text s after `lead`, wrapped at 100 columns with continuation lines
 * indented by 7. */
static void wrapped(Buf *b, const char *lead, const char *s) {
  buf_printf(b, "     %s", lead);
  int col = 5 + (int)strlen(lead);
  while (*s) {
    while (*s == ' ')
      s++;
    int w = (int)strcspn(s, " ");
    if (!w)
      break;
    if (col + 1 + w > 100 && col > 7) {
      buf_printf(b, "\n%7s", "");
      col = 7;
    } else {
      buf_printf(b, " ");
      col++;
    }
    buf_putn(b, s, (size_t)w);
    col += w;
    s += w;
  }
  buf_printf(b, "\n");
}

/* What kernel k stores and why ("h (an output); t (read 3 times; ...)"). */
static const char *stores(const BPass *p, const Kernel *k) {
  Buf b;
  buf_init(&b, p->g->arena);
  for (int i = 0; i < k->nouts; i++) {
    const Node *n = k->outs[i];
    const char *nm = p->buf && p->buf[n->id] >= 0 ? p->b[p->buf[n->id]].name : "?";
    buf_printf(&b, "%s%s (%s)", i ? "; " : "", nm, p->why && p->why[n->id] ? p->why[n->id] : "stored");
  }
  return b.p ? b.p : "";
}

static void json_kv(Buf *b, const char *key, const char *s, int comma) {
  buf_printf(b, "\"%s\": ", key);
  json_str(b, s);
  buf_printf(b, comma ? ", " : "");
}

void explain(Graph *g, BPass **ps, const char *spec, int json, const GpuCeilings *gpu, Buf *b) {
  Arena *a = g->arena;
  const BPass *p0 = ps[PASS_FORWARD];
  Buf dims;
  buf_init(&dims, a);
  int first = 1;
  for (int s = 0; s < g->nsyms; s++)
    if (!g->syms[s].derived) {
      buf_printf(&dims, json ? "%s\"%s\": %lld" : "%s%s=%lld", first ? "" : json ? ", " : ",", g->syms[s].name,
                 (long long)p0->sym[s]);
      first = 0;
    }
  if (json) {
    buf_printf(b, "{");
    json_kv(b, "model", g->spec->name, 1);
    json_kv(b, "spec", spec, 1);
    buf_printf(b, "\"dims\": {%s}, \"ceilings\": {\"gpu\": \"%s\", \"copy_bytes_per_s\": %g, \"gemm_16bit_flops\": %g, "
                  "\"f32_flops\": %g},\n \"passes\": [",
               first ? "" : dims.p, gpu->name, gpu->copy, gpu->gemm16, gpu->f32);
  } else {
    buf_printf(b, "model %s (%s)%s%s\n", g->spec->name, spec, first ? "" : " at ", first ? "" : dims.p);
    buf_printf(b, "floor = max(bytes / %.0f GB/s, FLOPs / %.0f TFLOP/s for bf16/f16 GEMMs, else %.1f TFLOP/s) (%s)\n",
               gpu->copy / 1e9, gpu->gemm16 / 1e12, gpu->f32 / 1e12, gpu->name);
  }
  int firstp = 1;
  for (int pk = 0; pk < NPASS; pk++) {
    const BPass *p = ps[pk];
    if (!p)
      continue;
    double tb = 0, tf = 0, tt = 0;
    int nk = 0;
    Buf body;
    buf_init(&body, a);
    if (!json)
      buf_printf(&body, "  #  kernel                    kind           bytes       FLOPs   floor µs\n");
    int prev = -1;
    for (int c = 0; c <= p->nk; c++) {
      const Kernel *k = c < p->nk ? p->k[c] : NULL;
      if (k && k->kind == K_LOOP && !k->nouts) /* nothing stored: not emitted */
        continue;
      if (prev >= 0) { /* the previous kernel's stop, now that the next is known */
        const Kernel *q = p->k[prev];
        if (json && !k) {
          buf_printf(&body, ", \"stop\": null}");
        } else if (json) {
          buf_printf(&body, ", \"stop\": {");
          json_kv(&body, "next", kname(p, k), 1);
          json_kv(&body, "why", q->stop ? q->stop : "?", 0);
          buf_printf(&body, "}}");
        } else if (k)
          wrapped(&body, arena_printf(a, "stop before #%d %s:", nk + 1, kname(p, k)), q->stop ? q->stop : "?");
      }
      if (!k)
        break;
      double by, fl;
      kernel_cost(p, k, &by, &fl);
      double fu = floor_us(gpu, k, by, fl);
      tb += by, tf += fl, tt += fu;
      nk++;
      if (json) {
        buf_printf(&body, "%s\n   {\"index\": %d, ", nk > 1 ? "," : "", nk);
        json_kv(&body, "name", kname(p, k), 1);
        json_kv(&body, "kind", kind_name(k), 1);
        json_kv(&body, "covers", kernel_covers(p, k, spec), 1);
        buf_printf(&body, "\"bytes\": %.0f, \"flops\": %.0f, \"floor_us\": %.6g, \"stores\": [", by, fl, fu);
        for (int i = 0; i < k->nouts; i++) {
          const Node *n = k->outs[i];
          buf_printf(&body, "%s{", i ? ", " : "");
          json_kv(&body, "name", p->buf[n->id] >= 0 ? p->b[p->buf[n->id]].name : "?", 1);
          json_kv(&body, "why", p->why[n->id] ? p->why[n->id] : "stored", 0);
          buf_printf(&body, "}");
        }
        buf_printf(&body, "]");
      } else {
        buf_printf(&body, "%3d  %-25s %-9s %10s %11s %10.2f\n", nk, kname(p, k), kind_name(k), si(a, by, "B"),
                   si(a, fl, "FLOP"), fu);
        wrapped(&body, "covers", kernel_covers(p, k, spec));
        wrapped(&body, "stores", stores(p, k));
      }
      prev = c;
    }
    if (json) {
      buf_printf(b, "%s\n  {\"pass\": \"%s\", \"kernels\": [%s],\n   \"total\": {\"kernels\": %d, \"bytes\": %.0f, "
                    "\"flops\": %.0f, \"floor_us\": %.6g}, \"arena_bytes\": %lld}",
                 firstp ? "" : ",", pass_names[pk], body.p ? body.p : "", nk, tb, tf, tt, (long long)p->arena);
    } else {
      buf_printf(b, "\n%s pass: %d kernel%s\n%s", pass_names[pk], nk, nk == 1 ? "" : "s", body.p);
      buf_printf(b, "  total: %d kernel%s, %s, %s, floor %.2f µs; arena %s (at the dims' maxima)\n", nk,
                 nk == 1 ? "" : "s", si(a, tb, "B"), si(a, tf, "FLOP"), tt, si(a, (double)p->arena, "B"));
    }
    firstp = 0;
  }
  if (json)
    buf_printf(b, "]}\n");
}
