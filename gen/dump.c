/* dump.c: the graph as text (tgen check --dump) and the check summary. */
#include "ir.h"

#include <math.h>
#include <string.h>

static void put_node_ref(Buf *b, const Node *x) {
  if (!x)
    buf_printf(b, "none");
  else
    buf_printf(b, "%%%d", x->id);
}

/* One line per node: %id = op(operands) attrs : dtype[shape]  # binding @line */
void dump_graph(const Graph *g, Buf *b) {
  for (int i = 0; i < g->nnodes; i++) {
    const Node *n = g->nodes[i];
    buf_printf(b, "%%%d = %s", n->id, op_info[n->op].name);
    if (n->op == OP_INPUT || n->op == OP_PARAM)
      buf_printf(b, " %s", n->name);
    else if (n->op == OP_CONST && n->is_dimval)
      buf_printf(b, " %s", dim_str(g, &n->lo));
    else if (n->op == OP_CONST)
      buf_printf(b, " %.17g", n->f[0]);
    if (n->nin) {
      buf_printf(b, "(");
      for (int k = 0; k < n->nin; k++) {
        if (k)
          buf_printf(b, ", ");
        put_node_ref(b, n->in[k]);
      }
      buf_printf(b, ")");
    }
    switch (n->op) {
    case OP_SUM: case OP_MEAN: case OP_AMAX: case OP_VAR: case OP_LOGSUMEXP:
      buf_printf(b, " axes=0x%x keepdim=%d", n->axes, n->keepdim);
      if (n->op == OP_VAR)
        buf_printf(b, " correction=%g", n->f[0]);
      break;
    case OP_SOFTMAX: case OP_LOG_SOFTMAX: case OP_CONCAT: case OP_UNSQUEEZE: case OP_SQUEEZE:
      buf_printf(b, " axis=%d", n->axis);
      break;
    case OP_TRANSPOSE:
      buf_printf(b, " axes=%d,%d", n->axis, n->axis2);
      break;
    case OP_PERMUTE:
      buf_printf(b, " perm=");
      for (int k = 0; k < n->shape.rank; k++)
        buf_printf(b, "%s%d", k ? "," : "", n->perm[k]);
      break;
    case OP_SLICE:
      buf_printf(b, " axis=%d [%s:%s]", n->axis, dim_str(g, &n->lo), dim_str(g, &n->hi));
      break;
    case OP_LAYER_NORM: case OP_RMS_NORM:
      buf_printf(b, " eps=%g", n->f[0]);
      break;
    case OP_GELU:
      buf_printf(b, "%s", n->flag ? " tanh" : "");
      break;
    case OP_POW: case OP_DROPOUT: case OP_FULL:
      buf_printf(b, " %g", n->f[0]);
      break;
    case OP_CLAMP:
      if (n->has_f[0]) buf_printf(b, " min=%g", n->f[0]);
      if (n->has_f[1]) buf_printf(b, " max=%g", n->f[1]);
      break;
    case OP_ATTENTION: case OP_ATTENTION_LSE: case OP_ATTENTION_BACKWARD:
      if (n->op == OP_ATTENTION_BACKWARD) buf_printf(b, " d%s", n->axis == 0 ? "q" : n->axis == 1 ? "k" : "v");
      buf_printf(b, "%s", n->flag ? " causal" : "");
      if (n->has_f[0]) buf_printf(b, " scale=%g", n->f[0]);
      break;
    case OP_CROSS_ENTROPY:
      buf_printf(b, " ignore_index=%lld", (long long)n->ignore_index);
      break;
    default:
      break;
    }
    buf_printf(b, " : %s%s", dtype_names[n->dtype], shape_str(g, &n->shape));
    if (n->name && n->op != OP_INPUT && n->op != OP_PARAM)
      buf_printf(b, "  # %s%s%s", n->scope[0] ? n->scope : "", n->scope[0] ? "/" : "", n->name);
    buf_printf(b, " @%d:%d\n", n->loc.line, n->loc.col);
  }
}

static void human_bytes(Buf *b, int64_t n) {
  if (n >= 10 * 1000 * 1000)
    buf_printf(b, "%.1f MB", (double)n / 1e6);
  else if (n >= 10 * 1000)
    buf_printf(b, "%.1f kB", (double)n / 1e3);
  else
    buf_printf(b, "%lld B", (long long)n);
}

/* The summary printed by `tgen check`. */
void print_summary(const Graph *g, Buf *b) {
  const Spec *s = g->spec;
  buf_printf(b, "model %s (%s): dtype %s, seed %llu\n", s->name, s->file, dtype_names[s->dtype],
             (unsigned long long)s->seed);
  buf_printf(b, "dims:");
  for (int i = 0; i < s->ndims; i++) {
    const DimDecl *d = &s->dims[i];
    if (d->dynamic)
      buf_printf(b, " %s<=%lld (dynamic)", d->name, (long long)d->size);
    else
      buf_printf(b, " %s=%lld", d->name, (long long)d->size);
  }
  buf_printf(b, "%s\n", s->ndims ? "" : " none");
  buf_printf(b, "inputs:\n");
  for (int i = 0; i < g->ninputs; i++)
    buf_printf(b, "  %-12s %s%s\n", g->inputs[i].name, dtype_names[g->inputs[i].dtype], shape_str(g, &g->inputs[i].shape));
  int64_t bytes = 0;
  for (int i = 0; i < g->nparams; i++)
    bytes += g->params[i].numel * dtype_size(g->params[i].dtype);
  buf_printf(b, "params: %d tensors, %lld elements, ", g->nparams, (long long)g->param_numel);
  human_bytes(b, bytes);
  buf_printf(b, "\n");
  for (int i = 0; i < g->nparams && i < 12; i++) {
    const Param *p = &g->params[i];
    buf_printf(b, "  %-24s %s%s %s", p->name, dtype_names[p->dtype], shape_str(g, &p->shape), init_names[p->init]);
    if (strcmp(p->ckpt, p->name))
      buf_printf(b, "  (checkpoint name %s)", p->ckpt);
    buf_printf(b, "\n");
  }
  if (g->nparams > 12)
    buf_printf(b, "  ... %d more\n", g->nparams - 12);
  int ops = 0;
  for (int i = 0; i < g->nnodes; i++)
    ops += g->nodes[i]->op > OP_CONST;
  buf_printf(b, "ops: %d\n", ops);
  buf_printf(b, "outputs:");
  for (int i = 0; i < g->noutputs; i++)
    buf_printf(b, " %s %s%s", g->output_names[i], dtype_names[g->outputs[i]->dtype], shape_str(g, &g->outputs[i]->shape));
  buf_printf(b, "\n");
  if (g->loss) {
    const Train *t = &s->train;
    if (t->opt == OPT_NONE)
      buf_printf(b, "train: loss %s, no optimizer", s->train.loss.name);
    else
      buf_printf(b, "train: loss %s, %s lr %g", s->train.loss.name, t->opt == OPT_SGD ? "sgd" : "adamw", t->lr);
    for (int j = 0; j < g->nwrt; j++)
      buf_printf(b, "%s%s", j ? ", " : "; gradients w.r.t. inputs ", g->inputs[g->wrt[j]].name);
    if (t->has_clip)
      buf_printf(b, ", grad_clip %g", t->grad_clip);
    buf_printf(b, "\n");
  }
}

/* ---------------------------------------------------------------- JSON */

void json_str(Buf *b, const char *s) {
  buf_printf(b, "\"");
  for (; s && *s; s++) {
    if (*s == '"' || *s == '\\')
      buf_printf(b, "\\%c", *s);
    else if ((unsigned char)*s < 32)
      buf_printf(b, "\\u%04x", *s);
    else
      buf_putn(b, s, 1);
  }
  buf_printf(b, "\"");
}

static void json_num(Buf *b, double v) {
  if (isnan(v))
    buf_printf(b, "\"nan\"");
  else if (isinf(v))
    buf_printf(b, v > 0 ? "\"inf\"" : "\"-inf\"");
  else
    buf_printf(b, "%.17g", v);
}

/* A shape as a list of ints and size-expression strings ("B*1024"). */
static void json_shape(const Graph *g, Buf *b, const Shape *s) {
  buf_printf(b, "[");
  for (int i = 0; i < s->rank; i++) {
    int64_t v;
    if (i)
      buf_printf(b, ", ");
    if (dim_is_const(&s->d[i], &v))
      buf_printf(b, "%lld", (long long)v);
    else
      json_str(b, dim_str(g, &s->d[i]));
  }
  buf_printf(b, "]");
}

static void json_dim(const Graph *g, Buf *b, const Dim *d) {
  int64_t v;
  if (dim_is_const(d, &v))
    buf_printf(b, "%lld", (long long)v);
  else
    json_str(b, dim_str(g, d));
}

/* The graph for other tools (the PyTorch oracle in tests/gpu, the JAX oracle
 * in tests/oracle): every node with its operands, attributes, dtype and
 * shape; sizes that depend on dynamic dims are strings over the dims' names.
 * Only the forward graph (no autodiff). */
void dump_json(const Graph *g, Buf *b) {
  const Spec *s = g->spec;
  buf_printf(b, "{\"name\": ");
  json_str(b, s->name);
  buf_printf(b, ", \"dtype\": \"%s\", \"seed\": %llu,\n \"syms\": [", dtype_names[s->dtype], (unsigned long long)s->seed);
  for (int k = 0; k < g->nsyms; k++) {
    buf_printf(b, "%s{\"name\": ", k ? ", " : "");
    json_str(b, g->syms[k].name);
    buf_printf(b, ", \"derived\": %s, \"max\": %lld}", g->syms[k].derived ? "true" : "false", (long long)g->syms[k].max);
  }
  buf_printf(b, "],\n \"inputs\": [");
  for (int k = 0; k < g->ninputs; k++) {
    buf_printf(b, "%s{\"name\": ", k ? ", " : "");
    json_str(b, g->inputs[k].name);
    buf_printf(b, ", \"node\": %d, \"dtype\": \"%s\", \"shape\": ", g->inputs[k].node->id, dtype_names[g->inputs[k].dtype]);
    json_shape(g, b, &g->inputs[k].shape);
    buf_printf(b, "}");
  }
  buf_printf(b, "],\n \"params\": [");
  for (int k = 0; k < g->nparams; k++) {
    buf_printf(b, "%s\n  {\"name\": ", k ? "," : "");
    json_str(b, g->params[k].name);
    buf_printf(b, ", \"ckpt\": ");
    json_str(b, g->params[k].ckpt);
    buf_printf(b, ", \"node\": %d, \"dtype\": \"%s\", \"shape\": ", g->params[k].node->id, dtype_names[g->params[k].dtype]);
    json_shape(g, b, &g->params[k].shape);
    buf_printf(b, "}");
  }
  buf_printf(b, "],\n \"outputs\": [");
  for (int k = 0; k < g->noutputs; k++) {
    buf_printf(b, "%s{\"name\": ", k ? ", " : "");
    json_str(b, g->output_names[k]);
    buf_printf(b, ", \"node\": %d}", g->outputs[k]->id);
  }
  /* loss: the train loss's node id (-1: none); loss_name: its binding name
   * (the name the loss is written under, e.g. by `tgen eval --grad`), or null */
  buf_printf(b, "],\n \"loss\": %d, \"loss_name\": ", g->loss ? g->loss->id : -1);
  if (g->loss)
    json_str(b, s->train.loss.name);
  else
    buf_printf(b, "null");
  /* wrt: the inputs (train.wrt) whose gradients are computed too */
  buf_printf(b, ",\n \"wrt\": [");
  for (int j = 0; j < g->nwrt; j++) {
    buf_printf(b, "%s", j ? ", " : "");
    json_str(b, g->inputs[g->wrt[j]].name);
  }
  buf_printf(b, "],\n \"nodes\": [");
  for (int i = 0; i < g->nnodes; i++) {
    const Node *n = g->nodes[i];
    buf_printf(b, "%s\n  {\"id\": %d, \"op\": \"%s\", \"in\": [", i ? "," : "", n->id, op_info[n->op].name);
    for (int k = 0; k < n->nin; k++)
      buf_printf(b, k ? ", %d" : "%d", n->in[k] ? n->in[k]->id : -1);
    buf_printf(b, "], \"dtype\": \"%s\", \"shape\": ", dtype_names[n->dtype]);
    json_shape(g, b, &n->shape);
    buf_printf(b, ", \"axis\": %d, \"axis2\": %d, \"axes\": %u, \"keepdim\": %d, \"perm\": [", n->axis, n->axis2, n->axes,
               n->keepdim);
    for (int k = 0; k < n->shape.rank && n->op == OP_PERMUTE; k++)
      buf_printf(b, k ? ", %d" : "%d", n->perm[k]);
    buf_printf(b, "], \"lo\": ");
    json_dim(g, b, &n->lo);
    buf_printf(b, ", \"hi\": ");
    json_dim(g, b, &n->hi);
    buf_printf(b, ", \"f\": [");
    json_num(b, n->f[0]);
    buf_printf(b, ", ");
    json_num(b, n->f[1]);
    buf_printf(b, "], \"has_f\": [%d, %d], \"flag\": %d, \"ignore_index\": %lld, \"is_dimval\": %d, \"index\": %d, \"name\": ",
               n->has_f[0], n->has_f[1], n->flag, (long long)n->ignore_index, n->is_dimval, n->index);
    json_str(b, n->name ? n->name : "");
    buf_printf(b, ", \"line\": %d}", n->loc.line);
  }
  buf_printf(b, "]}\n");
}
