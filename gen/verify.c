/* verify.c: structural invariants of a Graph. A failure is a bug in a pass,
 * never a user error, so it dies with the node that broke the rule. */
#include "ir.h"

#include <string.h>

void verify(const Graph *g) {
  for (int i = 0; i < g->nnodes; i++) {
    const Node *n = g->nodes[i];
    if (!n || n->id != i)
      die("node %d: id %d does not match its position", i, n ? n->id : -1);
    if ((int)n->op < 0 || n->op >= NUM_OPS || n->op == OP_SPLIT || n->op == OP_ZEROS || n->op == OP_ONES)
      die("node %d: op %d may not appear in a graph", i, (int)n->op);
    if (n->dtype == DT_NONE)
      die("node %d (%s): dtype not inferred", i, op_info[n->op].name);
    if (n->shape.rank < 0 || n->shape.rank > MAXRANK)
      die("node %d (%s): rank %d", i, op_info[n->op].name, n->shape.rank);
    for (int k = 0; k < n->nin; k++) {
      const Node *x = n->in[k];
      int optional = (n->op == OP_LAYER_NORM && k > 0) || (n->op == OP_RMS_NORM && k == 1) ||
                     (n->op == OP_LINEAR && k == 2);
      if (!x && !optional)
        die("node %d (%s): operand %d missing", i, op_info[n->op].name, k);
      if (x && (x->id >= i || g->nodes[x->id] != x))
        die("node %d (%s): operand %d (node %d) is not an earlier node", i, op_info[n->op].name, k, x->id);
    }
    if (n->op == OP_INPUT && (n->index < 0 || n->index >= g->ninputs || g->inputs[n->index].node != n))
      die("node %d: input index %d", i, n->index);
    if (n->op == OP_PARAM && (n->index < 0 || n->index >= g->nparams || g->params[n->index].node != n))
      die("node %d: param index %d", i, n->index);
  }
  int64_t off = 0;
  for (int k = 0; k < g->nparams; k++) {
    if (g->params[k].offset != off)
      die("param %s: offset %lld, expected %lld", g->params[k].name, (long long)g->params[k].offset, (long long)off);
    off += g->params[k].numel;
  }
  if (off != g->param_numel)
    die("param_numel %lld, expected %lld", (long long)g->param_numel, (long long)off);
  for (int k = 0; k < g->noutputs; k++)
    if (!g->outputs[k] || g->nodes[g->outputs[k]->id] != g->outputs[k])
      die("output %d is not a node of the graph", k);
  if (g->loss && (g->loss->shape.rank != 0 || !dtype_is_float(g->loss->dtype)))
    die("loss is not a floating scalar");
}
