/* build.c: Spec -> Graph. Resolves names, evaluates dims, binds calls to the
 * op table's signatures, expands blocks (calls and repeat), decomposes split
 * into slices, and runs shape/dtype inference on every node as it is made, so
 * each error points at the text that caused it. */
#include "ir.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const OpInfo op_info[NUM_OPS] = {
#define OP(e, name, sig, rule, flags, grad, cls, ...) {name, sig, flags, cls, #__VA_ARGS__},
#include "ops.def"
#undef OP
};

int op_lookup(const char *name) {
  for (int i = OP_CONST + 1; i < NUM_OPS; i++)
    if (!(op_info[i].flags & F_INTERNAL) && !strcmp(op_info[i].name, name))
      return i;
  return -1;
}

/* ---------------------------------------------------------------- environment */

typedef enum { ENV_DIM, ENV_NODE } EnvKind;

typedef struct EnvEntry {
  const char *name;
  EnvKind kind;
  const char *what; /* "dim", "input", "param", "binding", "block input" */
  Node *node;
  Dim dim;
  Loc loc;
} EnvEntry;

typedef struct Env Env;


/* Lexical context of the graph being built: the model, or a block instance. */
typedef struct Ctx {
  Graph *g;
  Env *env;
  const char *prefix;  /* instance path for params: "", "h.0." */
  const char *scope;   /* "" or "h.0" */
  const char *block;   /* block name, or NULL at top level */
  int repeat_index;    /* nearest enclosing repeat's index, or -1 */
  const char *binding; /* the binding being evaluated */
  Vec *stack;          /* blocks being expanded, for the recursion message */
  struct NameSet *names_p, *ckpts_p; /* param names, checkpoint names (shared) */
} Ctx;

/* A hash set of names -> param index, so duplicate checks stay linear even for
 * repeat(blk, 100000, x). */
typedef struct NameSet {
  const char **key;
  int *val;
  int cap, n;
} NameSet;

struct Env {
  EnvEntry *e;
  int n, cap;
  NameSet idx; /* name -> index in e: lookups stay O(1) in long graphs */
};

static uint32_t str_hash(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

/* Returns the index already holding `name`, or records it for `idx` and returns -1. */
static int name_claim_(Graph *g, NameSet *t, const char *name, int idx) {
  if (2 * (t->n + 1) > t->cap) {
    NameSet old = *t;
    t->cap = t->cap ? 2 * t->cap : 256;
    t->key = arena_alloc(g->arena, sizeof(char *) * (size_t)t->cap);
    t->val = arena_alloc(g->arena, sizeof(int) * (size_t)t->cap);
    t->n = 0;
    for (int i = 0; i < old.cap; i++)
      if (old.key[i])
        name_claim_(g, t, old.key[i], old.val[i]);
  }
  for (uint32_t i = str_hash(name) & (uint32_t)(t->cap - 1);; i = (i + 1) & (uint32_t)(t->cap - 1)) {
    if (!t->key[i]) {
      t->key[i] = name;
      t->val[i] = idx;
      t->n++;
      return -1;
    }
    if (!strcmp(t->key[i], name))
      return t->val[i];
  }
}

static Env *dims_env; /* model dims: visible in every block */

/* The index recorded for `name`, or -1. */
static int name_get(const NameSet *t, const char *name) {
  if (!t->cap)
    return -1;
  for (uint32_t i = str_hash(name) & (uint32_t)(t->cap - 1); t->key[i]; i = (i + 1) & (uint32_t)(t->cap - 1))
    if (!strcmp(t->key[i], name))
      return t->val[i];
  return -1;
}

static EnvEntry *env_find(Env *env, const char *name) {
  int i = name_get(&env->idx, name);
  return i < 0 ? NULL : &env->e[i];
}

static EnvEntry *env_add(Graph *g, Env *env, const char *name, Loc loc, const char *what) {
  EnvEntry *old = env_find(env, name);
  if (!old && env != dims_env && dims_env)
    old = env_find(dims_env, name);
  if (old) {
    if (!strcmp(old->what, "binding") && !strcmp(what, "binding"))
      error_at(loc, "'%s' is already bound (line %d); a name is bound once in a graph", name, old->loc.line);
    error_at(loc, "%s '%s' clashes with the %s of the same name (line %d)", what, name, old->what, old->loc.line);
  }
  if (env->n == env->cap) {
    int cap = env->cap ? env->cap * 2 : 32;
    EnvEntry *p = arena_alloc(g->arena, sizeof(EnvEntry) * (size_t)cap);
    if (env->n)
      memcpy(p, env->e, sizeof(EnvEntry) * (size_t)env->n);
    env->e = p;
    env->cap = cap;
  }
  name_claim_(g, &env->idx, name, env->n);
  EnvEntry *x = &env->e[env->n++];
  x->name = name;
  x->what = what;
  x->loc = loc;
  return x;
}

static EnvEntry *lookup(Ctx *c, const char *name) {
  EnvEntry *x = env_find(c->env, name);
  return x ? x : env_find(dims_env, name);
}

/* did-you-mean over everything visible */
static const char *suggest(Ctx *c, const char *name, int nodes_only) {
  Vec v = {0};
  for (int i = 0; i < c->env->n; i++)
    if (!nodes_only || c->env->e[i].kind == ENV_NODE)
      vec_push(c->g->arena, &v, (void *)c->env->e[i].name);
  for (int i = 0; !nodes_only && c->env != dims_env && i < dims_env->n; i++)
    vec_push(c->g->arena, &v, (void *)dims_env->e[i].name);
  return did_you_mean(name, (const char *const *)v.p, v.n);
}

/* Error prefix naming the binding and, inside a block, the instance. */
static const char *where(Ctx *c) {
  if (!c->binding)
    return "";
  if (c->block)
    return arena_printf(c->g->arena, "in '%s' (block %s, instance %s): ", c->binding, c->block, c->scope);
  return arena_printf(c->g->arena, "in '%s': ", c->binding);
}

/* ---------------------------------------------------------------- nodes */

Node *new_node(Graph *g, Op op, int nin, Loc loc) {
  Node *n = arena_alloc(g->arena, sizeof(Node));
  n->op = op;
  n->nin = nin;
  n->in = nin ? arena_alloc(g->arena, sizeof(Node *) * (size_t)nin) : NULL;
  n->loc = loc;
  n->dtype = DT_NONE;
  n->scope = "";
  if (g->nnodes == g->capnodes) {
    int cap = g->capnodes ? g->capnodes * 2 : 64;
    Node **p = arena_alloc(g->arena, sizeof(Node *) * (size_t)cap);
    if (g->nnodes)
      memcpy(p, g->nodes, sizeof(Node *) * (size_t)g->nnodes);
    g->nodes = p;
    g->capnodes = cap;
  }
  n->id = g->nnodes;
  g->nodes[g->nnodes++] = n;
  return n;
}

/* A literal number; its dtype is settled by the op that uses it (DT_NONE until then). */
static Node *const_node(Ctx *c, double v, Loc loc) {
  Node *n = new_node(c->g, OP_CONST, 0, loc);
  n->f[0] = v;
  n->shape.rank = 0;
  n->name = c->binding;
  n->scope = c->scope;
  return n;
}

/* ---------------------------------------------------------------- sizes */

static const char *expr_kind_desc(const Expr *e);

static Dim eval_size_(Ctx *c, const Expr *e, const char *what);

/* An integer expression over dims: NUMBER, dim NAME, + - * /, unary minus.
 * Errors of the arithmetic itself are prefixed with the binding, or with
 * `what` outside bindings ("input 'x': 768 / 7 does not divide exactly"). */
static Dim eval_size(Ctx *c, const Expr *e, const char *what) {
  const char *saved = dim_context;
  dim_context = c->binding ? where(c) : arena_printf(c->g->arena, "%s: ", what);
  Dim d = eval_size_(c, e, what);
  dim_context = saved;
  return d;
}

static const char *article(const char *w) { return strchr("aeiou", w[0]) ? "an" : "a"; }

static Dim eval_size_(Ctx *c, const Expr *e, const char *what) {
  switch (e->kind) {
  case E_NUM:
    if (!e->is_int)
      error_at(e->loc, "%s%s must be an integer, found %g", where(c), what, e->num);
    return dim_const(e->ival);
  case E_NAME: {
    EnvEntry *x = lookup(c, e->name);
    if (x && x->kind == ENV_DIM)
      return x->dim;
    if (x)
      error_at(e->loc, "%s%s must be a size; '%s' is %s %s, not a dim", where(c), what, e->name, article(x->what), x->what);
    Vec v = {0};
    for (int i = 0; i < dims_env->n; i++)
      vec_push(c->g->arena, &v, (void *)dims_env->e[i].name);
    const char *dym = did_you_mean(e->name, (const char *const *)v.p, v.n);
    if (dym)
      error_at(e->loc, "%sundefined dim '%s' in %s; did you mean '%s'?", where(c), e->name, what, dym);
    error_at(e->loc, "%sundefined dim '%s' in %s", where(c), e->name, what);
  }
  case E_NEG:
    return dim_sub(dim_const(0), eval_size_(c, e->lhs, what), e->loc);
  case E_BINOP: {
    Dim a = eval_size_(c, e->lhs, what), b = eval_size_(c, e->rhs, what);
    switch (e->op) {
    case '+': return dim_add(a, b, e->loc);
    case '-': return dim_sub(a, b, e->loc);
    case '*': return dim_mul(a, b, e->loc);
    case '/': return dim_div(c->g, a, b, e->rhs->loc);
    default: error_at(e->loc, "%s'@' is not allowed in %s", where(c), what);
    }
  }
  default:
    error_at(e->loc, "%s%s must be an integer expression over dims, found '%s'", where(c), what, expr_str(e));
  }
}

static int64_t eval_const_int(Ctx *c, const Expr *e, const char *what) {
  Dim d = eval_size(c, e, what);
  int64_t v;
  if (!dim_is_const(&d, &v))
    error_at(e->loc, "%s%s must be a constant, but '%s' depends on a dynamic dim", where(c), what, expr_str(e));
  return v;
}

/* A floating constant: numbers, static dims, + - * / and unary minus. */
static double eval_number(Ctx *c, const Expr *e, const char *what) {
  switch (e->kind) {
  case E_NUM:
    return e->num;
  case E_NAME: {
    EnvEntry *x = lookup(c, e->name);
    int64_t v;
    if (x && x->kind == ENV_DIM && dim_is_const(&x->dim, &v))
      return (double)v;
    break;
  }
  case E_NEG:
    return -eval_number(c, e->lhs, what);
  case E_BINOP: {
    double a = eval_number(c, e->lhs, what), b = eval_number(c, e->rhs, what);
    if (e->op == '+') return a + b;
    if (e->op == '-') return a - b;
    if (e->op == '*') return a * b;
    if (e->op == '/') {
      if (b == 0)
        error_at(e->rhs->loc, "%sdivision by zero in %s", where(c), what);
      return a / b;
    }
    break;
  }
  default:
    break;
  }
  error_at(e->loc, "%s%s must be a number, found %s", where(c), what, expr_kind_desc(e));
}

/* Sizes of a tensor shape must be >= 1, and numel must fit int64. `locs`
 * (may be NULL) are the entries' locations. */
static void check_shape(Graph *g, const Shape *s, Loc loc, const Loc *locs, const char *what) {
  int64_t numel = 1;
  for (int i = 0; i < s->rank; i++) {
    int64_t lo, hi;
    Loc l = locs ? locs[i] : loc;
    if (!dim_bounds(g, &s->d[i], &lo, &hi))
      error_at(l, "%s: size %s overflows int64 at the dims' max", what, dim_str(g, &s->d[i]));
    if (hi < 1)
      error_at(l, "%s: dim %d is %s; sizes must be >= 1", what, i, dim_str(g, &s->d[i]));
    if (lo < 1)
      error_at(l, "%s: dim %d is %s, which is below 1 for some values of the dynamic dims; sizes must be >= 1",
               what, i, dim_str(g, &s->d[i]));
    if (__builtin_mul_overflow(numel, hi, &numel))
      error_at(loc, "%s: shape %s has more elements than int64 can count", what, shape_str(g, s));
  }
}

static Shape eval_shape(Ctx *c, Expr **dims, int rank, Loc loc, const char *what) {
  Shape s = {0};
  if (rank > MAXRANK)
    error_at(loc, "%s has rank %d; tgen supports rank up to %d", what, rank, MAXRANK);
  s.rank = rank;
  Loc locs[MAXRANK];
  for (int i = 0; i < rank; i++) {
    s.d[i] = eval_size(c, dims[i], what);
    locs[i] = dims[i]->loc;
  }
  check_shape(c->g, &s, loc, locs, what);
  return s;
}

/* ---------------------------------------------------------------- signatures */

#define MAXSIG 12 /* parameters in an op signature (ops.def) */

typedef enum { K_T, K_TL, K_INT, K_DIMS, K_SHAPE, K_INTS, K_F, K_BOOL, K_STR, K_DTYPE } ArgKind;

typedef struct Param_ {
  const char *name;
  ArgKind kind;
  int has_default;
  const char *def; /* default text: none, false, 1e-5, 'none', -100 */
} SigParam;

typedef struct Sig {
  SigParam p[MAXSIG];
  int n;
} Sig;

static Sig sigs[NUM_OPS];
static int sigs_ready;

static void parse_sigs(void) {
  static const char *const kinds[] = {"t", "tl", "int", "dims", "shape", "ints", "f", "bool", "str", "dtype"};
  for (int op = 0; op < NUM_OPS; op++) {
    const char *s = op_info[op].sig;
    Sig *sg = &sigs[op];
    while (*s) {
      while (*s == ' ')
        s++;
      if (!*s)
        break;
      if (sg->n == MAXSIG)
        die("signature of %s too long", op_info[op].name);
      SigParam *p = &sg->p[sg->n++];
      const char *colon = strchr(s, ':');
      static char names[NUM_OPS][MAXSIG][24], defs[NUM_OPS][MAXSIG][24];
      size_t nl = (size_t)(colon - s);
      memcpy(names[op][sg->n - 1], s, nl);
      p->name = names[op][sg->n - 1];
      s = colon + 1;
      const char *end = s + strcspn(s, " =");
      int k;
      for (k = 0; k < 10; k++)
        if (strlen(kinds[k]) == (size_t)(end - s) && !strncmp(kinds[k], s, (size_t)(end - s)))
          break;
      if (k == 10)
        die("bad kind in signature of %s", op_info[op].name);
      p->kind = (ArgKind)k;
      s = end;
      if (*s == '=') {
        s++;
        end = s + strcspn(s, " ");
        memcpy(defs[op][sg->n - 1], s, (size_t)(end - s));
        p->def = defs[op][sg->n - 1];
        p->has_default = 1;
        s = end;
      }
    }
  }
  sigs_ready = 1;
}

const char *op_param_name(int op, int k) {
  if (!sigs_ready)
    parse_sigs();
  return k < sigs[op].n ? sigs[op].p[k].name : "x";
}

/* "linear(x, w, b=none)": the signature as a user writes the call. */
const char *op_signature(int op) {
  static char buf[NUM_OPS][160];
  if (!sigs_ready)
    parse_sigs();
  if (!buf[op][0]) {
    size_t n = (size_t)snprintf(buf[op][0] ? buf[op] : buf[op], sizeof buf[op], "%s(", op_info[op].name);
    for (int k = 0; k < sigs[op].n && n < sizeof buf[op]; k++) {
      const SigParam *p = &sigs[op].p[k];
      n += (size_t)snprintf(buf[op] + n, sizeof buf[op] - n, "%s%s%s%s", k ? ", " : "", p->name,
                            p->has_default ? "=" : "", p->has_default ? p->def : "");
    }
    if (n < sizeof buf[op] - 1)
      snprintf(buf[op] + n, sizeof buf[op] - n, ")");
  }
  return buf[op];
}

static Node *eval_tensor(Ctx *c, const Expr *e, const char *what);

static const char *expr_kind_desc(const Expr *e) {
  switch (e->kind) {
  case E_LIST: return "a list";
  case E_STR: return arena_printf(diag->arena, "the string '%s'", e->name);
  case E_BOOL: return e->ival ? "true" : "false";
  case E_NONE: return "none";
  default: return arena_printf(diag->arena, "'%s'", expr_str(e));
  }
}

/* Convert one argument expression according to its declared kind. */
static void convert_arg(Ctx *c, int op, const SigParam *p, const Expr *e, Arg *a) {
  const char *opn = op_info[op].name;
  const char *what = arena_printf(c->g->arena, "%s's '%s'", opn, p->name);
  a->loc = e->loc;
  a->label = p->name;
  if (e->kind == E_NONE) {
    if (!p->has_default || strcmp(p->def, "none"))
      error_at(e->loc, "%s%s: '%s' cannot be none", where(c), opn, p->name);
    a->is_none = 1;
    return;
  }
  switch (p->kind) {
  case K_T:
    if (e->kind == E_LIST || e->kind == E_STR || e->kind == E_BOOL)
      error_at(e->loc, "%s%s: '%s' must be a tensor, found %s", where(c), opn, p->name, expr_kind_desc(e));
    a->t = eval_tensor(c, e, what);
    break;
  case K_TL:
    if (e->kind != E_LIST)
      error_at(e->loc, "%s%s: '%s' must be a list of tensors like [a, b], found %s", where(c), opn, p->name, expr_kind_desc(e));
    if (e->nargs == 0)
      error_at(e->loc, "%s%s: '%s' is an empty list", where(c), opn, p->name);
    a->ntl = e->nargs;
    a->tl = arena_alloc(c->g->arena, sizeof(Node *) * (size_t)e->nargs);
    a->locs = arena_alloc(c->g->arena, sizeof(Loc) * (size_t)e->nargs);
    for (int i = 0; i < e->nargs; i++) {
      a->tl[i] = eval_tensor(c, e->args[i], what);
      a->locs[i] = e->args[i]->loc;
    }
    break;
  case K_INT:
    a->d = eval_size(c, e, what);
    break;
  case K_DIMS:
  case K_SHAPE:
  case K_INTS:
    if (e->kind != E_LIST) {
      if (p->kind != K_DIMS)
        error_at(e->loc, "%s%s: '%s' must be a list like [B, T, C], found %s", where(c), opn, p->name, expr_kind_desc(e));
      a->d = eval_size(c, e, what);
      a->nlist = 1;
      a->list = arena_alloc(c->g->arena, sizeof(Dim));
      a->list[0] = a->d;
      break;
    }
    a->is_list = 1;
    a->nlist = e->nargs;
    if (e->nargs > MAXRANK)
      error_at(e->loc, "%s%s: '%s' has %d entries; the rank limit is %d", where(c), opn, p->name, e->nargs, MAXRANK);
    a->list = arena_alloc(c->g->arena, sizeof(Dim) * (size_t)(e->nargs + 1));
    a->locs = arena_alloc(c->g->arena, sizeof(Loc) * (size_t)(e->nargs + 1));
    for (int i = 0; i < e->nargs; i++) {
      a->locs[i] = e->args[i]->loc;
      a->list[i] = eval_size(c, e->args[i], what);
      int64_t v;
      if (p->kind != K_SHAPE && !dim_is_const(&a->list[i], &v))
        error_at(e->args[i]->loc, "%s%s: '%s' entries must be constants", where(c), opn, p->name);
    }
    break;
  case K_F:
    a->f = eval_number(c, e, what);
    break;
  case K_BOOL:
    if (e->kind != E_BOOL)
      error_at(e->loc, "%s%s: '%s' must be true or false, found %s", where(c), opn, p->name, expr_kind_desc(e));
    a->b = (int)e->ival;
    break;
  case K_STR:
    if (e->kind != E_STR)
      error_at(e->loc, "%s%s: '%s' must be a quoted string, found %s", where(c), opn, p->name, expr_kind_desc(e));
    a->s = e->name;
    break;
  case K_DTYPE: {
    int dt = e->kind == E_NAME ? dtype_parse(e->name) : -1;
    if (dt < 0)
      error_at(e->loc, "%s%s: '%s' must be a dtype (f32, bf16, f16, i32, bool), found %s", where(c), opn, p->name, expr_kind_desc(e));
    a->dt = (DType)dt;
    break;
  }
  }
}

/* Defaults come from the signature text. */
static void default_arg(const SigParam *p, Arg *a) {
  if (!strcmp(p->def, "none")) {
    a->is_none = 1;
    return;
  }
  switch (p->kind) {
  case K_BOOL: a->b = !strcmp(p->def, "true"); break;
  case K_STR: a->s = arena_strndup(diag->arena, p->def + 1, strlen(p->def) - 2); break;
  case K_F: a->f = strtod(p->def, NULL); break;
  case K_INT: a->d = dim_const(strtoll(p->def, NULL, 10)); break;
  default: die("unsupported default %s", p->def);
  }
}

/* Match a call's arguments to the op's signature: positional first, then by
 * keyword; unknown keywords, duplicates and missing arguments are errors. */
static void bind_args(Ctx *c, int op, const Expr *call, Arg *args) {
  const Sig *sg = &sigs[op];
  const Expr *given[MAXSIG] = {0};
  int npos = 0;
  for (int i = 0; i < call->nargs; i++) {
    const Expr *a = call->args[i];
    if (a->kind == E_KWARG) {
      int k;
      for (k = 0; k < sg->n; k++)
        if (!strcmp(sg->p[k].name, a->name))
          break;
      if (k == sg->n) {
        const char *names[MAXSIG];
        for (int j = 0; j < sg->n; j++)
          names[j] = sg->p[j].name;
        const char *dym = did_you_mean(a->name, names, sg->n);
        if (dym)
          error_at(a->loc, "%s%s has no argument '%s'; did you mean '%s'?", where(c), call->name, a->name, dym);
        error_at(a->loc, "%s%s has no argument '%s' (signature: %s)", where(c), call->name, a->name, op_signature(op));
      }
      if (given[k])
        error_at(a->loc, "%s%s: argument '%s' given both by position and by keyword", where(c), call->name, a->name);
      given[k] = a->lhs;
    } else {
      if (npos >= sg->n)
        error_at(a->loc, "%s%s takes %d argument%s, found %d (signature: %s)", where(c), call->name, sg->n,
                 sg->n == 1 ? "" : "s", call->nargs, op_signature(op));
      given[npos++] = a;
    }
  }
  for (int k = 0; k < sg->n; k++) {
    Arg *a = &args[k];
    if (given[k]) {
      a->given = 1;
      convert_arg(c, op, &sg->p[k], given[k], a);
    } else if (sg->p[k].has_default) {
      a->loc = call->loc;
      a->label = sg->p[k].name;
      default_arg(&sg->p[k], a);
    } else {
      error_at(call->loc, "%s%s: missing argument '%s' (signature: %s)", where(c), call->name, sg->p[k].name,
               op_signature(op));
    }
  }
}

/* Literal constants take the dtype of the other tensor operands (a bool
 * condition does not count); alone they take the model dtype. */
static void settle_consts(Ctx *c, Node *n) {
  DType partner = DT_NONE;
  for (int i = 0; i < n->nin; i++)
    if (n->in[i] && n->in[i]->dtype != DT_NONE && n->in[i]->dtype != DT_BOOL) {
      partner = n->in[i]->dtype;
      break;
    }
  for (int i = 0; i < n->nin; i++) {
    Node *k = n->in[i];
    if (!k || k->op != OP_CONST || k->dtype != DT_NONE)
      continue;
    k->dtype = partner == DT_NONE ? c->g->spec->dtype : partner;
    if (k->dtype == DT_I32 && !k->is_dimval && k->f[0] != floor(k->f[0]))
      error_at(k->loc, "%s%s: the constant %g is not an integer, but the other operand is i32 (use cast(x, f32))",
               where(c), op_info[n->op].name, k->f[0]);
  }
}

/* ---------------------------------------------------------------- blocks */

static Node **expand_block(Ctx *c, Block *b, Node **ins, int nin, const char *inst, int rep, Loc loc, int *nout);

/* name(args) where name is a block; returns its outputs. */
static Node **call_block(Ctx *c, Block *b, const Expr *call, int *nout) {
  if (call->nargs != b->ninputs)
    error_at(call->loc, "%sblock %s takes %d input%s, found %d", where(c), b->name, b->ninputs,
             b->ninputs == 1 ? "" : "s", call->nargs);
  Node **ins = arena_alloc(c->g->arena, sizeof(Node *) * (size_t)(b->ninputs + 1));
  for (int i = 0; i < call->nargs; i++) {
    if (call->args[i]->kind == E_KWARG)
      error_at(call->args[i]->loc, "%sblock inputs are positional; found '%s='", where(c), call->args[i]->name);
    ins[i] = eval_tensor(c, call->args[i], arena_printf(c->g->arena, "block %s's input", b->name));
  }
  const char *inst = arena_printf(c->g->arena, "%s%s", c->prefix, c->binding);
  return expand_block(c, b, ins, b->ninputs, inst, c->repeat_index, call->loc, nout);
}

/* repeat(block, n, inputs...): n chained instances. */
static Node **call_repeat(Ctx *c, const Expr *call, int *nout) {
  if (call->nargs < 2)
    error_at(call->loc, "%srepeat needs a block, a count and the block's inputs: repeat(blk, 4, x)", where(c));
  for (int i = 0; i < call->nargs; i++)
    if (call->args[i]->kind == E_KWARG)
      error_at(call->args[i]->loc, "%srepeat takes positional arguments only", where(c));
  const Expr *be = call->args[0];
  if (be->kind != E_NAME)
    error_at(be->loc, "%srepeat's first argument must be a block name, found '%s'", where(c), expr_str(be));
  Block *b = spec_find_block(c->g->spec, be->name);
  if (!b) {
    const char *names[256];
    int n = 0;
    for (int i = 0; i < c->g->spec->nblocks && n < 256; i++)
      names[n++] = c->g->spec->blocks[i]->name;
    const char *dym = did_you_mean(be->name, names, n);
    if (dym)
      error_at(be->loc, "%sunknown block '%s'; did you mean '%s'?", where(c), be->name, dym);
    error_at(be->loc, "%sunknown block '%s'", where(c), be->name);
  }
  int64_t count = eval_const_int(c, call->args[1], "repeat count");
  if (count < 1 || count > 100000)
    error_at(call->args[1]->loc, "%srepeat count must be between 1 and 100000, found %lld", where(c), (long long)count);
  if (call->nargs - 2 != b->ninputs)
    error_at(call->loc, "%sblock %s takes %d input%s, repeat gives it %d", where(c), b->name, b->ninputs,
             b->ninputs == 1 ? "" : "s", call->nargs - 2);
  int nb = b->noutputs ? b->noutputs : 1;
  if (nb != b->ninputs)
    error_at(call->loc, "%srepeat chains outputs into inputs, but block %s has %d input%s and %d output%s", where(c),
             b->name, b->ninputs, b->ninputs == 1 ? "" : "s", nb, nb == 1 ? "" : "s");
  Node **cur = arena_alloc(c->g->arena, sizeof(Node *) * (size_t)(b->ninputs + 1));
  for (int i = 0; i < b->ninputs; i++)
    cur[i] = eval_tensor(c, call->args[i + 2], arena_printf(c->g->arena, "block %s's input", b->name));
  for (int64_t r = 0; r < count; r++) {
    const char *inst = arena_printf(c->g->arena, "%s%s.%lld", c->prefix, c->binding, (long long)r);
    Node **next = expand_block(c, b, cur, b->ninputs, inst, (int)r, call->loc, nout);
    for (int i = 0; i < b->ninputs; i++)
      if (!shape_eq(&next[i]->shape, &cur[i]->shape))
        error_at(call->loc, "%srepeat: block %s returns %s but takes %s; repeat feeds each instance's output to the next one's input, so the shapes must match",
                 where(c), b->name, shape_str(c->g, &next[i]->shape), shape_str(c->g, &cur[i]->shape));
      else if (next[i]->dtype != cur[i]->dtype)
        error_at(call->loc, "%srepeat: block %s returns %s but takes %s; repeat feeds each instance's output to the next one's input, so the dtypes must match",
                 where(c), b->name, dtype_names[next[i]->dtype], dtype_names[cur[i]->dtype]);
    cur = next;
  }
  return cur;
}

/* ---------------------------------------------------------------- expressions */

static Node *make_op(Ctx *c, int op, const Expr *call, Arg *args, int nargs_sig);

/* Operators have no parameter names; messages name the operand's text. */
static const char *operand_label(const Expr *e) {
  const char *s = expr_str_max(e, 32);
  return s ? s : "the operand";
}

static Node *binop_node(Ctx *c, const Expr *e, Node *a, Node *b) {
  static const struct { char ch; Op op; } map[] = {{'+', OP_ADD}, {'-', OP_SUB}, {'*', OP_MUL}, {'/', OP_DIV}, {'@', OP_MATMUL}};
  Op op = OP_ADD;
  for (size_t i = 0; i < sizeof map / sizeof *map; i++)
    if (map[i].ch == e->op)
      op = map[i].op;
  Arg args[2] = {0};
  args[0].t = a;
  args[0].loc = e->lhs->loc;
  args[0].given = 1;
  args[0].label = operand_label(e->lhs);
  args[1].t = b;
  args[1].loc = e->rhs->loc;
  args[1].given = 1;
  args[1].label = operand_label(e->rhs);
  return make_op(c, op, e, args, 2);
}

/* Evaluate a call: op, block or repeat. Sets *nout to the number of results. */
static Node **eval_call(Ctx *c, const Expr *e, int *nout) {
  if (!strcmp(e->name, "repeat"))
    return call_repeat(c, e, nout);
  Block *b = spec_find_block(c->g->spec, e->name);
  if (b)
    return call_block(c, b, e, nout);
  int op = op_lookup(e->name);
  if (op < 0) {
    const char *names[NUM_OPS + 256];
    int n = 0;
    for (int i = OP_CONST + 1; i < NUM_OPS; i++)
      if (!(op_info[i].flags & F_INTERNAL))
        names[n++] = op_info[i].name;
    for (int i = 0; i < c->g->spec->nblocks && n < NUM_OPS + 255; i++)
      names[n++] = c->g->spec->blocks[i]->name;
    names[n++] = "repeat";
    const char *dym = did_you_mean(e->name, names, n);
    if (dym)
      error_at(e->loc, "%sunknown op or block '%s'; did you mean '%s'?", where(c), e->name, dym);
    error_at(e->loc, "%sunknown op or block '%s'", where(c), e->name);
  }
  Arg args[MAXSIG] = {0};
  bind_args(c, op, e, args);
  if (op == OP_SPLIT) { /* n equal slices along dim */
    Node *x = args[0].t;
    int64_t parts, dv;
    if (!dim_is_const(&args[1].d, &parts))
      error_at(args[1].loc, "%ssplit: 'n' must be a constant count", where(c));
    if (parts < 1 || parts > 4096)
      error_at(args[1].loc, "%ssplit: 'n' must be between 1 and 4096, found %lld", where(c), (long long)parts);
    if (!dim_is_const(&args[2].d, &dv))
      error_at(args[2].loc, "%ssplit: 'dim' must be a constant", where(c));
    int rank = x->shape.rank;
    if (dv < -rank || dv >= rank || rank == 0)
      error_at(args[2].loc, "%ssplit: dim %lld is out of range for a tensor of rank %d (shape %s)", where(c),
               (long long)dv, rank, shape_str(c->g, &x->shape));
    int axis = (int)(dv < 0 ? dv + rank : dv);
    int64_t size;
    if (dim_is_const(&x->shape.d[axis], &size) && size % parts)
      error_at(args[1].loc, "%ssplit: dim %d of %s has size %lld, which does not divide into %lld equal parts",
               where(c), axis, shape_str(c->g, &x->shape), (long long)size, (long long)parts);
    Dim part = dim_div(c->g, x->shape.d[axis], args[1].d, args[1].loc);
    Node **outs = arena_alloc(c->g->arena, sizeof(Node *) * (size_t)parts);
    for (int64_t i = 0; i < parts; i++) {
      Arg sa[4] = {0};
      sa[0] = args[0];
      sa[1].d = dim_const(axis);
      sa[2].d = dim_mul(part, dim_const(i), e->loc);
      sa[3].d = dim_mul(part, dim_const(i + 1), e->loc);
      sa[1].loc = sa[2].loc = sa[3].loc = e->loc;
      sa[0].label = "x";
      outs[i] = make_op(c, OP_SLICE, e, sa, 4);
    }
    *nout = (int)parts;
    return outs;
  }
  Node **r = arena_alloc(c->g->arena, sizeof(Node *));
  r[0] = make_op(c, op, e, args, sigs[op].n);
  if (op == OP_ZEROS || op == OP_ONES)
    r[0]->op = OP_FULL; /* the rule has set the value */
  *nout = 1;
  return r;
}

/* Create the node for `op` with bound arguments and infer it. */
static Node *make_op(Ctx *c, int op, const Expr *at, Arg *args, int nargs_sig) {
  const Sig *sg = &sigs[op];
  int nin = 0;
  for (int k = 0; k < nargs_sig && k < sg->n; k++)
    nin += sg->p[k].kind == K_T ? 1 : sg->p[k].kind == K_TL ? args[k].ntl : 0;
  Node *n = new_node(c->g, (Op)op, nin, at->loc);
  n->name = c->binding;
  n->scope = c->scope;
  int j = 0;
  for (int k = 0; k < nargs_sig && k < sg->n; k++) {
    if (sg->p[k].kind == K_T)
      n->in[j++] = args[k].is_none ? NULL : args[k].t;
    else if (sg->p[k].kind == K_TL)
      for (int i = 0; i < args[k].ntl; i++)
        n->in[j++] = args[k].tl[i];
  }
  settle_consts(c, n);
  infer_node(c->g, n, args, where(c));
  if (op == OP_DROPOUT)
    n->index = c->g->ndropout++; /* stable key for its mask, whatever later passes renumber */
  return n;
}

static Node **eval_multi(Ctx *c, const Expr *e, int *nout);

/* An expression in a tensor position: exactly one result. */
static Node *eval_tensor(Ctx *c, const Expr *e, const char *what) {
  int n;
  Node **r = eval_multi(c, e, &n);
  if (n != 1)
    error_at(e->loc, "%s%s: '%s' gives %d results; use a binding with %d names (a, b: ...)", where(c), what,
             expr_str(e), n, n);
  return r[0];
}

static Node **eval_multi(Ctx *c, const Expr *e, int *nout) {
  Node **r = arena_alloc(c->g->arena, sizeof(Node *));
  *nout = 1;
  switch (e->kind) {
  case E_NUM:
    r[0] = const_node(c, e->num, e->loc);
    return r;
  case E_NAME: {
    EnvEntry *x = lookup(c, e->name);
    if (!x) {
      if (op_lookup(e->name) >= 0 || spec_find_block(c->g->spec, e->name))
        error_at(e->loc, "%s'%s' is an op or block; call it: %s(...)", where(c), e->name, e->name);
      const char *dym = suggest(c, e->name, 0);
      if (dym)
        error_at(e->loc, "%sundefined name '%s'; did you mean '%s'?", where(c), e->name, dym);
      if (c->block)
        error_at(e->loc, "%sundefined name '%s' (a block sees only the model's dims and its own inputs, params and bindings)", where(c), e->name);
      error_at(e->loc, "%sundefined name '%s'", where(c), e->name);
    }
    if (x->kind == ENV_DIM) {
      Node *k = const_node(c, 0, e->loc);
      k->is_dimval = 1;
      k->lo = x->dim;
      int64_t v;
      if (dim_is_const(&x->dim, &v))
        k->f[0] = (double)v;
      r[0] = k;
      return r;
    }
    r[0] = x->node;
    return r;
  }
  case E_NEG: {
    Arg a[1] = {0};
    a[0].t = eval_tensor(c, e->lhs, "operand of '-'");
    a[0].loc = e->lhs->loc;
    a[0].given = 1;
    a[0].label = operand_label(e->lhs);
    r[0] = make_op(c, OP_NEG, e, a, 1);
    return r;
  }
  case E_BINOP: {
    const char opname[2] = {e->op, 0};
    const char *what = arena_printf(c->g->arena, "operand of '%s'", opname);
    Node *a = eval_tensor(c, e->lhs, what);
    Node *b = eval_tensor(c, e->rhs, what);
    r[0] = binop_node(c, e, a, b);
    return r;
  }
  case E_CALL:
    return eval_call(c, e, nout);
  case E_KWARG:
    error_at(e->loc, "%skeyword argument '%s=' outside a call", where(c), e->name);
  default:
    error_at(e->loc, "%sexpected a tensor expression, found %s", where(c), expr_kind_desc(e));
  }
}

/* Evaluate the bindings of a graph body into c->env. Returns the last result. */
static void eval_bindings(Ctx *c, Binding *bs, int nb) {
  for (int i = 0; i < nb; i++) {
    Binding *b = &bs[i];
    c->binding = b->names[0];
    for (int k = 0; k < b->nnames; k++) { /* check names before evaluating, for a precise message */
      EnvEntry *old = env_find(c->env, b->names[k]);
      if (!old)
        old = env_find(dims_env, b->names[k]);
      if (old)
        env_add(c->g, c->env, b->names[k], b->locs[k], "binding"); /* reports the clash */
      for (int j = 0; j < k; j++)
        if (!strcmp(b->names[j], b->names[k]))
          error_at(b->locs[k], "'%s' is named twice in one binding", b->names[k]);
      if (op_lookup(b->names[k]) >= 0 || !strcmp(b->names[k], "repeat"))
        error_at(b->locs[k], "binding name '%s' is the name of an op; choose another", b->names[k]);
    }
    int n;
    Node **r = eval_multi(c, b->expr, &n);
    if (n != b->nnames) {
      if (b->nnames == 1)
        error_at(b->locs[0], "%s'%s' gives %d results; name each one: %s", where(c), expr_str(b->expr), n,
                 n == 2 ? "a, b: ..." : "a, b, c: ...");
      error_at(b->locs[0], "%sthe binding names %d results but '%s' gives %d", where(c), b->nnames,
               expr_str(b->expr), n);
    }
    for (int k = 0; k < n; k++) {
      Node *x = r[k];
      if (x->name == b->names[0] && x->op != OP_INPUT && x->op != OP_PARAM)
        x->name = b->names[k]; /* q, k, v: each result carries its own name */
      c->binding = b->names[k];
      if (x->op == OP_CONST && x->dtype == DT_NONE)
        x->dtype = x->is_dimval ? DT_I32 : c->g->spec->dtype;
      EnvEntry *en = env_add(c->g, c->env, b->names[k], b->locs[k], "binding");
      en->kind = ENV_NODE;
      en->node = x;
    }
  }
  c->binding = NULL;
}

/* Declare params (model or block instance). */
static void add_params(Ctx *c, TensorDecl *ps, int np) {
  Graph *g = c->g;
  for (int i = 0; i < np; i++) {
    TensorDecl *t = &ps[i];
    const char *what = arena_printf(g->arena, "param '%s'", t->name);
    Shape s = eval_shape(c, t->shape, t->rank, t->shape_loc, what);
    for (int k = 0; k < s.rank; k++) {
      int64_t v;
      if (!dim_is_const(&s.d[k], &v))
        error_at(t->shape[k]->loc, "%s: params have static shapes, but dim %d is %s (dynamic)", what, k,
                 dim_str(g, &s.d[k]));
    }
    Param p = {0};
    p.name = arena_printf(g->arena, "%s%s", c->prefix, t->name);
    p.shape = s;
    p.dtype = g->spec->dtype;
    p.init = t->init != INIT_DEFAULT ? t->init : s.rank >= 2 ? INIT_KAIMING_UNIFORM : INIT_ZEROS;
    p.a = t->init_a;
    p.b = t->init_b;
    p.loc = t->loc;
    p.numel = 1;
    for (int k = 0; k < s.rank; k++) {
      int64_t v;
      dim_is_const(&s.d[k], &v);
      p.numel *= v;
    }
    if (t->ext_name) {
      const char *nm = t->ext_name, *brace = strstr(nm, "{i}");
      if (brace && c->repeat_index < 0)
        error_at(t->ext_loc, "%s: name '%s' uses {i}, but this instance (%s) is not inside a repeat", what, nm,
                 c->scope[0] ? c->scope : "top level");
      Buf b;
      buf_init(&b, g->arena);
      while ((brace = strstr(nm, "{i}"))) {
        buf_putn(&b, nm, (size_t)(brace - nm));
        buf_printf(&b, "%d", c->repeat_index);
        nm = brace + 3;
      }
      buf_printf(&b, "%s", nm);
      if (strchr(b.p, '{') || strchr(b.p, '}'))
        error_at(t->ext_loc, "%s: name '%s' has a brace that is not {i}", what, t->ext_name);
      p.ckpt = b.p;
    } else {
      p.ckpt = p.name;
    }
    int k = name_claim_(g, c->names_p, p.name, g->nparams);
    if (k >= 0)
      error_at(t->loc, "param '%s' is defined twice (line %d); give each block call its own binding", p.name,
               g->params[k].loc.line);
    if ((k = name_claim_(g, c->ckpts_p, p.ckpt, g->nparams)) >= 0)
      error_at(t->ext_name ? t->ext_loc : t->loc, "checkpoint name '%s' is used by two params ('%s' and '%s')",
               p.ckpt, g->params[k].name, p.name);
    if (__builtin_add_overflow(g->param_numel, p.numel, &p.offset) || p.offset > ((int64_t)1 << 40))
      error_at(t->loc, "the params hold more than 2^40 elements in total");
    p.offset = g->param_numel;
    g->param_numel += p.numel;
    Node *n = new_node(g, OP_PARAM, 0, t->loc);
    n->index = g->nparams;
    n->name = p.name;
    n->scope = c->scope;
    n->shape = s;
    n->dtype = p.dtype;
    p.node = n;
    if (g->nparams == g->params_cap) { /* grow geometrically */
      g->params_cap = g->params_cap ? 2 * g->params_cap : 64;
      Param *np2 = arena_alloc(g->arena, sizeof(Param) * (size_t)g->params_cap);
      if (g->nparams)
        memcpy(np2, g->params, sizeof(Param) * (size_t)g->nparams);
      g->params = np2;
    }
    g->params[g->nparams++] = p;
    EnvEntry *en = env_add(g, c->env, t->name, t->loc, "param");
    en->kind = ENV_NODE;
    en->node = n;
  }
}

static Node **resolve_outputs(Ctx *c, NameRef *outs, int nouts, Binding *bs, int nb, int *n) {
  const char *pre = c->block ? arena_printf(c->g->arena, "block %s: ", c->block) : "";
  if (nouts == 0) {
    Binding *last = &bs[nb - 1];
    Node **r = arena_alloc(c->g->arena, sizeof(Node *));
    r[0] = lookup(c, last->names[last->nnames - 1])->node;
    *n = 1;
    return r;
  }
  Node **r = arena_alloc(c->g->arena, sizeof(Node *) * (size_t)nouts);
  for (int i = 0; i < nouts; i++) {
    EnvEntry *x = lookup(c, outs[i].name);
    if (!x || x->kind != ENV_NODE) {
      const char *dym = suggest(c, outs[i].name, 1);
      if (dym)
        error_at(outs[i].loc, "%soutput '%s' is not defined; did you mean '%s'?", pre, outs[i].name, dym);
      error_at(outs[i].loc, "%soutput '%s' is not defined%s", pre, outs[i].name, x ? " (it is a dim)" : "");
    }
    r[i] = x->node;
  }
  *n = nouts;
  return r;
}

static Node **expand_block(Ctx *c, Block *b, Node **ins, int nin, const char *inst, int rep, Loc loc, int *nout) {
  Graph *g = c->g;
  if (b->visiting) {
    Buf path;
    buf_init(&path, g->arena);
    for (int i = 0; i < c->stack->n; i++)
      buf_printf(&path, "%s -> ", ((Block *)c->stack->p[i])->name);
    buf_printf(&path, "%s", b->name);
    error_at(loc, "%sblocks call each other recursively: %s", where(c), path.p);
  }
  if (c->stack->n >= MAX_DEPTH)
    error_at(loc, "%sblocks nested more than %d deep", where(c), MAX_DEPTH);
  b->visiting = 1;
  vec_push(g->arena, c->stack, b);
  Env env = {0};
  Ctx cc = *c;
  cc.env = &env;
  cc.prefix = arena_printf(g->arena, "%s.", inst);
  cc.scope = inst;
  cc.block = b->name;
  cc.repeat_index = rep;
  cc.binding = NULL;
  (void)nin;
  for (int i = 0; i < b->ninputs; i++) {
    for (int j = 0; j < i; j++)
      if (!strcmp(b->inputs[j].name, b->inputs[i].name))
        error_at(b->inputs[i].loc, "block %s: input '%s' is listed twice", b->name, b->inputs[i].name);
    EnvEntry *en = env_add(g, &env, b->inputs[i].name, b->inputs[i].loc, "block input");
    en->kind = ENV_NODE;
    en->node = ins[i];
  }
  add_params(&cc, b->params, b->nparams);
  eval_bindings(&cc, b->graph, b->ngraph);
  Node **outs = resolve_outputs(&cc, b->outputs, b->noutputs, b->graph, b->ngraph, nout);
  c->stack->n--;
  b->visiting = 0;
  return outs;
}

/* ---------------------------------------------------------------- the model */

static void build_dims(Graph *g, Ctx *c) {
  Spec *s = g->spec;
  for (int i = 0; i < s->ndims; i++) {
    DimDecl *d = &s->dims[i];
    const char *what = arena_printf(g->arena, "dim '%s'", d->name);
    Dim v;
    if (d->dynamic) {
      int64_t max = eval_const_int(c, d->max, arena_printf(g->arena, "max of dynamic dim '%s'", d->name));
      if (max < 1)
        error_at(d->max->loc, "dynamic dim '%s': max must be >= 1, found %lld", d->name, (long long)max);
      if (g->nsyms == MAXSYM)
        error_at(d->loc, "too many dynamic dims (limit %d)", MAXSYM);
      Sym *sy = &g->syms[g->nsyms];
      sy->name = d->name;
      sy->loc = d->loc;
      sy->max = max;
      d->size = max;
      v = dim_sym(g->nsyms++);
    } else {
      v = eval_size(c, d->value, what);
      int64_t x;
      if (!dim_is_const(&v, &x))
        error_at(d->value->loc, "dim '%s' is static but its value '%s' depends on a dynamic dim; declare it {dynamic: true, max: ...} or use the expression where it is needed",
                 d->name, expr_str(d->value));
      if (x < 1)
        error_at(d->value->loc, "dim '%s' is %lld; sizes must be >= 1", d->name, (long long)x);
      d->size = x;
    }
    EnvEntry *en = env_add(g, dims_env, d->name, d->loc, "dim");
    en->kind = ENV_DIM;
    en->dim = v;
  }
}

Graph *build_graph(Spec *s) {
  if (!sigs_ready)
    parse_sigs();
  Graph *g = arena_alloc(diag->arena, sizeof(Graph));
  g->spec = s;
  g->arena = diag->arena;
  Env *denv = arena_alloc(g->arena, sizeof(Env));
  dims_env = denv;
  Env *env = arena_alloc(g->arena, sizeof(Env));
  Vec *stack = arena_alloc(g->arena, sizeof(Vec));
  Ctx c = {g, denv, "", "", NULL, -1, NULL, stack, arena_alloc(g->arena, sizeof(NameSet)),
           arena_alloc(g->arena, sizeof(NameSet))};
  build_dims(g, &c);
  c.env = env;

  for (int i = 0; i < s->nblocks; i++) {
    Block *b = s->blocks[i];
    if (op_lookup(b->name) >= 0 || !strcmp(b->name, "repeat"))
      error_at(b->loc, "block '%s' has the name of an op; choose another", b->name);
    for (int j = 0; j < i; j++)
      if (!strcmp(s->blocks[j]->name, b->name))
        error_at(b->loc, "block '%s' is defined twice", b->name);
  }

  g->inputs = arena_alloc(g->arena, sizeof(Input) * (size_t)(s->ninputs + 1));
  for (int i = 0; i < s->ninputs; i++) {
    TensorDecl *t = &s->inputs[i];
    const char *what = arena_printf(g->arena, "input '%s'", t->name);
    Input *in = &g->inputs[g->ninputs++];
    in->name = t->name;
    in->loc = t->loc;
    in->shape = eval_shape(&c, t->shape, t->rank, t->shape_loc, what);
    in->dtype = t->dtype == DT_NONE ? s->dtype : t->dtype;
    Node *n = new_node(g, OP_INPUT, 0, t->loc);
    n->index = i;
    n->name = t->name;
    n->shape = in->shape;
    n->dtype = in->dtype;
    in->node = n;
    EnvEntry *en = env_add(g, env, t->name, t->loc, "input");
    en->kind = ENV_NODE;
    en->node = n;
  }
  add_params(&c, s->params, s->nparams);
  eval_bindings(&c, s->graph, s->ngraph);
  g->outputs = resolve_outputs(&c, s->outputs, s->noutputs, s->graph, s->ngraph, &g->noutputs);
  g->output_names = arena_alloc(g->arena, sizeof(char *) * (size_t)g->noutputs);
  for (int i = 0; i < g->noutputs; i++) {
    Binding *last = &s->graph[s->ngraph - 1];
    g->output_names[i] = s->noutputs ? s->outputs[i].name : last->names[last->nnames - 1];
    for (int j = 0; j < i; j++)
      if (!strcmp(g->output_names[j], g->output_names[i]))
        error_at(s->outputs[i].loc, "output '%s' is listed twice", g->output_names[i]);
  }
  if (s->train.present) {
    NameRef *l = &s->train.loss;
    EnvEntry *x = lookup(&c, l->name);
    if (!x || x->kind != ENV_NODE) {
      const char *dym = suggest(&c, l->name, 1);
      if (dym)
        error_at(l->loc, "train.loss '%s' is not defined; did you mean '%s'?", l->name, dym);
      error_at(l->loc, "train.loss '%s' is not a binding of the graph", l->name);
    }
    Node *n = x->node;
    if (n->shape.rank != 0)
      error_at(l->loc, "train.loss '%s' must be a scalar, but its shape is %s (reduce it, e.g. mean(%s))", l->name,
               shape_str(g, &n->shape), l->name);
    if (!dtype_is_float(n->dtype))
      error_at(l->loc, "train.loss '%s' must be floating, but its dtype is %s", l->name, dtype_names[n->dtype]);
    const Train *t = &s->train;
    g->wrt = arena_alloc(g->arena, sizeof(int) * (size_t)(t->nwrt + 1));
    for (int j = 0; j < t->nwrt; j++) {
      const NameRef *w = &t->wrt[j];
      int k = 0;
      while (k < g->ninputs && strcmp(g->inputs[k].name, w->name))
        k++;
      if (k == g->ninputs) {
        EnvEntry *e = lookup(&c, w->name);
        if (e)
          error_at(w->loc, "train.wrt '%s' is not an input of the model (only inputs are listed in wrt; params always get gradients)", w->name);
        const char **names = arena_alloc(g->arena, sizeof(char *) * (size_t)(g->ninputs + 1));
        for (int i = 0; i < g->ninputs; i++)
          names[i] = g->inputs[i].name;
        const char *dym = did_you_mean(w->name, names, g->ninputs);
        if (dym)
          error_at(w->loc, "train.wrt '%s' is not defined; did you mean '%s'?", w->name, dym);
        error_at(w->loc, "train.wrt '%s' is not defined (wrt lists inputs of the model)", w->name);
      }
      if (!dtype_is_float(g->inputs[k].dtype))
        error_at(w->loc, "train.wrt '%s' must be a floating input, but its dtype is %s", w->name,
                 dtype_names[g->inputs[k].dtype]);
      for (int i = 0; i < j; i++)
        if (g->wrt[i] == k)
          error_at(w->loc, "train.wrt lists '%s' twice", w->name);
      if (j == 64)
        error_at(w->loc, "train.wrt lists more than 64 inputs");
      g->wrt[g->nwrt++] = k;
    }
    /* wrt order: the inputs' declaration order (the API's struct follows it) */
    for (int i = 1; i < g->nwrt; i++)
      for (int j = i; j > 0 && g->wrt[j] < g->wrt[j - 1]; j--) {
        int tmp = g->wrt[j];
        g->wrt[j] = g->wrt[j - 1];
        g->wrt[j - 1] = tmp;
      }
    if (g->nparams == 0 && !g->nwrt)
      error_at(l->loc, "train: the model has no params to train (list inputs in train.wrt for gradients w.r.t. them)");
    if (g->nparams > 0 && t->opt == OPT_NONE)
      error_at(t->loc, "train needs an 'optimizer' for the params ({sgd: {lr: 0.1}} or {adamw: {lr: 1.0e-3}}); only a model without params may omit it");
    char *dep = arena_alloc(g->arena, (size_t)g->nnodes + 1); /* what the loss depends on */
    dep[n->id] = 1;
    int any = 0;
    for (int i = n->id; i >= 0; i--)
      if (dep[i]) {
        Node *m = g->nodes[i];
        any |= m->op == OP_PARAM;
        for (int j = 0; m->op == OP_INPUT && j < g->nwrt; j++)
          any |= g->wrt[j] == m->index;
        for (int j = 0; j < m->nin; j++)
          if (m->in[j])
            dep[m->in[j]->id] = 1;
      }
    if (!any)
      error_at(l->loc, "train.loss '%s' depends on no param%s: training would change nothing", l->name, g->nwrt ? " and no train.wrt input" : "");
    g->loss = n;
  }
  dims_env = NULL;
  return g;
}

/* ---------------------------------------------------------------- entry */

Graph *tgen_load(Diag *d, Arena *a, const char *file, const char *src, size_t len) {
  Diag *saved = diag;
  diag = d;
  d->file = file;
  d->src = src;
  d->srclen = len;
  d->arena = a;
  d->msg[0] = 0;
  d->cleanup = NULL;
  if (setjmp(d->jmp)) {
    diag = saved;
    dims_env = NULL;
    dim_context = ""; /* an error inside eval_size leaves it pointing into the arena the caller frees */
    return NULL;
  }
  if (len > MAX_SPEC_BYTES)
    error_at((Loc){0, 0}, "larger than %d MiB; a model spec is limited to that size", MAX_SPEC_BYTES >> 20);
  Spec *s = spec_parse(file, src, len);
  Graph *g = build_graph(s);
  diag = saved;
  return g;
}
