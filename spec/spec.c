/* spec.c: the YNode tree -> Spec. Checks every key, type and literal value of
 * the language; names, shapes and dtypes are checked later, in gen/build.c,
 * where the graph is known. */
#include "spec.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const dtype_names[] = {"f32", "bf16", "f16", "i32", "bool", "none"};
const char *const init_names[] = {"default", "zeros", "ones", "normal", "uniform",
                                  "xavier_uniform", "kaiming_uniform"};

int dtype_parse(const char *s) {
  for (int i = 0; i < DT_NONE; i++)
    if (!strcmp(s, dtype_names[i]))
      return i;
  return -1;
}
int dtype_is_float(DType t) { return t == DT_F32 || t == DT_BF16 || t == DT_F16; }
int dtype_size(DType t) { return t == DT_F32 || t == DT_I32 ? 4 : t == DT_BOOL ? 1 : 2; }

/* ---------------------------------------------------------------- node helpers */

static const char *kind_name(const YNode *y) {
  if (y->kind == Y_MAP)
    return "a mapping";
  if (y->kind == Y_SEQ)
    return "a list";
  return y->str[0] ? arena_printf(diag->arena, "'%s'", y->str) : "an empty value";
}

/* kind_name, with a list's length where the length is what is wrong */
static const char *seq_desc(const YNode *y) {
  return y->kind == Y_SEQ ? arena_printf(diag->arena, "a list of length %d", y->n) : kind_name(y);
}

static void want(const YNode *y, YKind k, const char *what) {
  if (y->kind != k)
    error_at(y->loc, "%s must be %s, found %s", what,
             k == Y_MAP ? "a mapping" : k == Y_SEQ ? "a list" : "a single value", kind_name(y));
}

/* Every key of map `y` must be one of `keys`; otherwise name the closest. */
static void check_keys(const YNode *y, const char *const *keys, int n, const char *where) {
  for (int i = 0; i < y->n; i++) {
    const char *k = y->keys[i]->str;
    int ok = 0;
    for (int j = 0; j < n; j++)
      ok |= !strcmp(k, keys[j]);
    if (ok)
      continue;
    const char *dym = did_you_mean(k, keys, n);
    if (dym)
      error_at(y->keys[i]->loc, "unknown key '%s' in %s; did you mean '%s'?", k, where, dym);
    Buf b;
    buf_init(&b, diag->arena);
    for (int j = 0; j < n; j++)
      buf_printf(&b, "%s%s", j ? ", " : "", keys[j]);
    error_at(y->keys[i]->loc, "unknown key '%s' in %s (expected one of: %s)", k, where, b.p);
  }
}

static YNode *get(const YNode *y, const char *key) {
  for (int i = 0; i < y->n; i++)
    if (!strcmp(y->keys[i]->str, key))
      return y->items[i];
  return NULL;
}

static double scalar_num(const YNode *y, const char *what) {
  want(y, Y_SCALAR, what);
  char *end;
  errno = 0;
  double v = strtod(y->str, &end);
  if (y->quoted || !y->str[0] || *end || errno == ERANGE || !isfinite(v))
    error_at(y->loc, "%s must be a number, found %s", what, kind_name(y));
  return v;
}

static int64_t scalar_int(const YNode *y, const char *what) {
  want(y, Y_SCALAR, what);
  char *end;
  errno = 0;
  long long v = strtoll(y->str, &end, 10);
  if (y->quoted || !y->str[0] || *end)
    error_at(y->loc, "%s must be an integer, found %s", what, kind_name(y));
  const char *d = y->str + (y->str[0] == '-' || y->str[0] == '+');
  if (d[0] == '0' && d[1])
    error_at(y->loc, "%s: %s has a leading zero (YAML 1.1 reads that as octal): write it without", what, y->str);
  if (errno == ERANGE)
    error_at(y->loc, "%s: %s is out of range", what, y->str);
  return v;
}

static int scalar_bool(const YNode *y, const char *what) {
  want(y, Y_SCALAR, what);
  if (!y->quoted && !strcmp(y->str, "true"))
    return 1;
  if (!y->quoted && !strcmp(y->str, "false"))
    return 0;
  error_at(y->loc, "%s must be true or false, found %s", what, kind_name(y));
}

static const char *scalar_str(const YNode *y, const char *what) {
  want(y, Y_SCALAR, what);
  return y->str;
}

static int is_none(const YNode *y) {
  return y->kind == Y_SCALAR && !y->quoted && (!strcmp(y->str, "none") || !y->str[0]);
}

/* A name that the user declares: a C identifier, not a reserved word. */
static const char *decl_name(const YNode *key, const char *what) {
  const char *s = key->str;
  static const char *const reserved[] = {"true", "false", "none", "f32", "bf16", "f16", "i32", "bool"};
  if (!is_ident(s))
    error_at(key->loc, "%s name '%s' is not an identifier (letters, digits and '_', not starting with a digit)", what, s);
  for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++)
    if (!strcmp(s, reserved[i]))
      error_at(key->loc, "%s name '%s' is a reserved word", what, s);
  return s;
}

static int pick(const YNode *y, const char *const *names, int n, const char *what) {
  const char *s = scalar_str(y, what);
  for (int i = 0; i < n; i++)
    if (!strcmp(s, names[i]))
      return i;
  const char *dym = did_you_mean(s, names, n);
  Buf b;
  buf_init(&b, diag->arena);
  for (int j = 0; j < n; j++)
    buf_printf(&b, "%s%s", j ? ", " : "", names[j]);
  if (dym)
    error_at(y->loc, "unknown %s '%s'; did you mean '%s'?", what, s, dym);
  error_at(y->loc, "unknown %s '%s' (expected one of: %s)", what, s, b.p);
}

/* ---------------------------------------------------------------- sections */

static void parse_dims(Spec *s, const YNode *y) {
  want(y, Y_MAP, "'dims'");
  s->dims = arena_alloc(diag->arena, sizeof(DimDecl) * (size_t)(y->n + 1));
  for (int i = 0; i < y->n; i++) {
    DimDecl *d = &s->dims[s->ndims++];
    d->name = decl_name(y->keys[i], "dim");
    d->loc = y->keys[i]->loc;
    const YNode *v = y->items[i];
    if (v->kind == Y_MAP) {
      static const char *const keys[] = {"dynamic", "max"};
      check_keys(v, keys, 2, arena_printf(diag->arena, "dim '%s'", d->name));
      const YNode *dyn = get(v, "dynamic"), *max = get(v, "max");
      if (!dyn || !scalar_bool(dyn, "'dynamic'"))
        error_at(v->loc, "dim '%s': a mapping declares a dynamic dim: write {dynamic: true, max: N}, or give the size directly (%s: 64)", d->name, d->name);
      if (!max)
        error_at(v->loc, "dynamic dim '%s' needs a 'max' (it bounds the memory plan): {dynamic: true, max: N}", d->name);
      d->dynamic = 1;
      d->max = parse_expr(max);
    } else if (v->kind == Y_SCALAR) {
      if (!v->str[0])
        error_at(v->loc, "dim '%s' has no value; give a size (%s: 64) or {dynamic: true, max: N}", d->name, d->name);
      d->value = parse_expr(v);
    } else {
      error_at(v->loc, "dim '%s' must be a size or {dynamic: true, max: N}, found a list", d->name);
    }
  }
}

static void parse_shape(TensorDecl *t, const YNode *y, const char *what) {
  if (y->kind != Y_SEQ)
    error_at(y->loc, "%s: shape must be a list of sizes like [B, 784], found %s", what, kind_name(y));
  t->rank = y->n;
  t->shape_loc = y->loc;
  t->shape = arena_alloc(diag->arena, sizeof(Expr *) * (size_t)(y->n + 1));
  for (int i = 0; i < y->n; i++) {
    if (y->items[i]->kind != Y_SCALAR || !y->items[i]->str[0])
      error_at(y->items[i]->loc, "%s: each shape entry must be a size (integer, dim name or expression), found %s", what, kind_name(y->items[i]));
    t->shape[i] = parse_expr(y->items[i]);
  }
}

static void parse_inputs(Spec *s, const YNode *y) {
  want(y, Y_MAP, "'inputs'");
  s->inputs = arena_alloc(diag->arena, sizeof(TensorDecl) * (size_t)(y->n + 1));
  for (int i = 0; i < y->n; i++) {
    if (i == MAX_IO)
      error_at(y->keys[i]->loc, "input %d; a model has at most %d inputs (the emitted runner and tests hold them in "
               "fixed arrays)", i + 1, MAX_IO);
    TensorDecl *t = &s->inputs[s->ninputs++];
    t->name = decl_name(y->keys[i], "input");
    t->loc = y->keys[i]->loc;
    t->dtype = DT_NONE;
    const YNode *v = y->items[i];
    const char *what = arena_printf(diag->arena, "input '%s'", t->name);
    if (v->kind == Y_MAP) {
      static const char *const keys[] = {"shape", "dtype"};
      check_keys(v, keys, 2, what);
      const YNode *sh = get(v, "shape"), *dt = get(v, "dtype");
      if (!sh)
        error_at(v->loc, "%s needs a 'shape'", what);
      parse_shape(t, sh, what);
      if (dt) {
        static const char *const names[] = {"f32", "bf16", "f16", "i32", "bool"};
        t->dtype = (DType)pick(dt, names, 5, "dtype");
        t->dtype_loc = dt->loc;
      }
    } else {
      parse_shape(t, v, what);
    }
  }
}

static void parse_init(TensorDecl *t, const YNode *v, const char *what) {
  t->init_loc = v->loc;
  if (v->kind == Y_SCALAR) {
    static const char *const names[] = {"zeros", "ones", "xavier_uniform", "kaiming_uniform"};
    static const InitKind kinds[] = {INIT_ZEROS, INIT_ONES, INIT_XAVIER_UNIFORM, INIT_KAIMING_UNIFORM};
    if (!strcmp(v->str, "normal") || !strcmp(v->str, "uniform"))
      error_at(v->loc, "%s: init '%s' needs its parameters: %s", what, v->str,
               v->str[0] == 'n' ? "{normal: STD}" : "{uniform: [LO, HI]}");
    for (int i = 0; i < 4; i++)
      if (!strcmp(v->str, names[i])) {
        t->init = kinds[i];
        return;
      }
    const char *dym = did_you_mean(v->str, names, 4);
    if (dym)
      error_at(v->loc, "%s: unknown init '%s'; did you mean '%s'?", what, v->str, dym);
    error_at(v->loc, "%s: unknown init '%s' (expected one of: zeros, ones, xavier_uniform, kaiming_uniform, {normal: STD}, {uniform: [LO, HI]})", what, v->str);
  }
  if (v->kind != Y_MAP || v->n != 1)
    error_at(v->loc, "%s: init must be zeros, ones, xavier_uniform, kaiming_uniform, {normal: STD} or {uniform: [LO, HI]}", what);
  static const char *const keys[] = {"normal", "uniform"};
  check_keys(v, keys, 2, "init");
  const YNode *a = v->items[0];
  if (!strcmp(v->keys[0]->str, "normal")) {
    t->init = INIT_NORMAL;
    t->init_a = scalar_num(a, "init normal's standard deviation");
    if (t->init_a < 0)
      error_at(a->loc, "%s: normal init's standard deviation must be >= 0, found %g", what, t->init_a);
  } else {
    t->init = INIT_UNIFORM;
    if (a->kind != Y_SEQ || a->n != 2)
      error_at(a->loc, "%s: uniform init takes [LO, HI], found %s", what, seq_desc(a));
    t->init_a = scalar_num(a->items[0], "uniform init's LO");
    t->init_b = scalar_num(a->items[1], "uniform init's HI");
    if (t->init_a > t->init_b)
      error_at(a->loc, "%s: uniform init needs LO <= HI, found [%g, %g]", what, t->init_a, t->init_b);
  }
}

static TensorDecl *parse_params(const YNode *y, int *n, const char *where) {
  want(y, Y_MAP, where);
  TensorDecl *ps = arena_alloc(diag->arena, sizeof(TensorDecl) * (size_t)(y->n + 1));
  for (int i = 0; i < y->n; i++) {
    TensorDecl *t = &ps[i];
    t->name = decl_name(y->keys[i], "param");
    t->loc = y->keys[i]->loc;
    t->dtype = DT_NONE;
    const YNode *v = y->items[i];
    const char *what = arena_printf(diag->arena, "param '%s'", t->name);
    if (v->kind != Y_MAP) {
      parse_shape(t, v, what);
      continue;
    }
    static const char *const keys[] = {"shape", "init", "name"};
    check_keys(v, keys, 3, what);
    const YNode *sh = get(v, "shape"), *in = get(v, "init"), *nm = get(v, "name");
    if (!sh)
      error_at(v->loc, "%s needs a 'shape'", what);
    parse_shape(t, sh, what);
    if (in)
      parse_init(t, in, what);
    if (nm) {
      t->ext_name = scalar_str(nm, "'name'");
      t->ext_loc = nm->vloc;
      if (!t->ext_name[0])
        error_at(nm->loc, "%s: 'name' must not be empty", what);
    }
  }
  *n = y->n;
  return ps;
}

static NameRef *parse_names(const YNode *y, int *n, const char *what) {
  if (y->kind == Y_SCALAR && y->str[0]) { /* a single name */
    NameRef *r = arena_alloc(diag->arena, sizeof(NameRef));
    r->name = y->str;
    r->loc = y->vloc;
    if (!is_ident(r->name))
      error_at(y->loc, "%s: '%s' is not a name", what, r->name);
    *n = 1;
    return r;
  }
  want(y, Y_SEQ, what);
  NameRef *r = arena_alloc(diag->arena, sizeof(NameRef) * (size_t)(y->n + 1));
  for (int i = 0; i < y->n; i++) {
    want(y->items[i], Y_SCALAR, arena_printf(diag->arena, "each entry of %s", what));
    r[i].name = y->items[i]->str;
    r[i].loc = y->items[i]->vloc;
    if (!is_ident(r[i].name))
      error_at(y->items[i]->loc, "%s: '%s' is not a name", what, r[i].name);
  }
  *n = y->n;
  return r;
}

/* `- a: EXPR` or `- a, b: EXPR` (several results). */
static Binding *parse_graph(const YNode *y, int *n, const char *what) {
  want(y, Y_SEQ, what);
  if (y->n == 0)
    error_at(y->loc, "%s is empty; it needs at least one binding like '- y: f(x)'", what);
  Binding *bs = arena_alloc(diag->arena, sizeof(Binding) * (size_t)y->n);
  for (int i = 0; i < y->n; i++) {
    const YNode *e = y->items[i];
    if (e->kind != Y_MAP || e->n != 1)
      error_at(e->loc, "each entry of %s must be one binding 'NAME: EXPRESSION', found %s", what,
               e->kind == Y_MAP ? arena_printf(diag->arena, "a mapping with %d keys", e->n) : kind_name(e));
    Binding *b = &bs[i];
    const YNode *key = e->keys[0];
    b->loc = key->loc;
    /* split "a, b, c" into names, keeping each one's column */
    Vec names = {0};
    const char *s = key->str;
    while (*s) {
      while (*s == ' ')
        s++;
      const char *st = s;
      while (*s && *s != ',' && *s != ' ')
        s++;
      char *nm = arena_strndup(diag->arena, st, (size_t)(s - st));
      Loc l = key->vloc;
      l.col += (int)(st - key->str);
      if (!is_ident(nm))
        error_at(l, "binding name '%s' is not an identifier", nm[0] ? nm : key->str);
      vec_push(diag->arena, &names, nm);
      Loc *lp = arena_alloc(diag->arena, sizeof(Loc));
      *lp = l;
      vec_push(diag->arena, &names, lp);
      while (*s == ' ')
        s++;
      if (*s == ',') {
        s++;
        if (!s[strspn(s, " ")])
          error_at(key->loc, "binding names end with ','");
      }
    }
    b->nnames = names.n / 2;
    b->names = arena_alloc(diag->arena, sizeof(char *) * (size_t)b->nnames);
    b->locs = arena_alloc(diag->arena, sizeof(Loc) * (size_t)b->nnames);
    for (int k = 0; k < b->nnames; k++) {
      b->names[k] = names.p[2 * k];
      b->locs[k] = *(Loc *)names.p[2 * k + 1];
    }
    if (b->nnames == 0)
      error_at(key->loc, "binding has no name");
    const YNode *v = e->items[0];
    if (v->kind != Y_SCALAR)
      error_at(v->loc, "binding '%s' must be an expression, found %s (write lists inside the expression, e.g. reshape(x, [B, T]))", b->names[0], kind_name(v));
    b->expr = parse_expr(v);
  }
  *n = y->n;
  return bs;
}

static void parse_blocks(Spec *s, const YNode *y) {
  want(y, Y_MAP, "'blocks'");
  s->blocks = arena_alloc(diag->arena, sizeof(Block *) * (size_t)(y->n + 1));
  for (int i = 0; i < y->n; i++) {
    Block *b = arena_alloc(diag->arena, sizeof(Block));
    b->name = decl_name(y->keys[i], "block");
    b->loc = y->keys[i]->loc;
    const YNode *v = y->items[i];
    const char *what = arena_printf(diag->arena, "block '%s'", b->name);
    want(v, Y_MAP, what);
    static const char *const keys[] = {"inputs", "params", "graph", "outputs"};
    check_keys(v, keys, 4, what);
    const YNode *in = get(v, "inputs"), *ps = get(v, "params"), *g = get(v, "graph"), *out = get(v, "outputs");
    if (!in)
      error_at(v->loc, "%s needs 'inputs' (a list of names)", what);
    if (!g)
      error_at(v->loc, "%s needs a 'graph'", what);
    b->inputs = parse_names(in, &b->ninputs, arena_printf(diag->arena, "%s inputs", what));
    if (ps && !is_none(ps))
      b->params = parse_params(ps, &b->nparams, arena_printf(diag->arena, "%s params", what));
    b->graph = parse_graph(g, &b->ngraph, arena_printf(diag->arena, "%s graph", what));
    if (out)
      b->outputs = parse_names(out, &b->noutputs, arena_printf(diag->arena, "%s outputs", what));
    s->blocks[s->nblocks++] = b;
  }
}

static void parse_train(Spec *s, const YNode *y) {
  Train *t = &s->train;
  want(y, Y_MAP, "'train'");
  static const char *const keys[] = {"loss", "optimizer", "grad_clip", "wrt"};
  check_keys(y, keys, 4, "train");
  t->present = 1;
  t->loc = y->loc;
  const YNode *loss = get(y, "loss"), *opt = get(y, "optimizer"), *clip = get(y, "grad_clip"), *wrt = get(y, "wrt");
  if (!loss)
    error_at(y->loc, "train needs 'loss': the name of a scalar binding to minimise");
  want(loss, Y_SCALAR, "train.loss");
  t->loss.name = loss->str;
  t->loss.loc = loss->vloc;
  if (wrt && !is_none(wrt))
    t->wrt = parse_names(wrt, &t->nwrt, "train.wrt");
  if (!opt && t->nwrt) { /* gradients w.r.t. inputs only (build.c: only if the model has no params) */
    if (clip && !is_none(clip))
      error_at(clip->loc, "grad_clip needs an optimizer (train.optimizer)");
    return;
  }
  if (!opt)
    error_at(y->loc, "train needs an 'optimizer': {sgd: {lr: 0.1}} or {adamw: {lr: 1.0e-3}}");
  if (opt->kind == Y_SCALAR && (!strcmp(opt->str, "sgd") || !strcmp(opt->str, "adamw")))
    error_at(opt->loc, "optimizer '%s' needs its settings, at least lr: {%s: {lr: ...}}", opt->str, opt->str);
  if (opt->kind == Y_MAP && opt->n > 1)
    error_at(opt->keys[1]->loc, "optimizer must name exactly one optimizer (sgd or adamw), found a second one: '%s'", opt->keys[1]->str);
  if (opt->kind != Y_MAP || opt->n != 1)
    error_at(opt->loc, "optimizer must be one of {sgd: {...}} or {adamw: {...}}, found %s", kind_name(opt));
  static const char *const names[] = {"sgd", "adamw"};
  const YNode *name = opt->keys[0], *o = opt->items[0];
  t->opt = pick(name, names, 2, "optimizer") == 0 ? OPT_SGD : OPT_ADAMW;
  t->opt_loc = name->loc;
  want(o, Y_MAP, arena_printf(diag->arena, "optimizer %s's settings", name->str));
  t->beta1 = 0.9, t->beta2 = 0.999, t->eps = 1e-8;
  t->weight_decay = t->opt == OPT_ADAMW ? 0.01 : 0;
  if (t->opt == OPT_SGD) {
    static const char *const k[] = {"lr", "momentum", "weight_decay"};
    check_keys(o, k, 3, "sgd");
  } else {
    static const char *const k[] = {"lr", "betas", "eps", "weight_decay"};
    check_keys(o, k, 4, "adamw");
  }
  const YNode *lr = get(o, "lr");
  if (!lr)
    error_at(o->loc, "optimizer %s needs 'lr' (the learning rate)", name->str);
  t->lr = scalar_num(lr, "lr");
  if (!(t->lr > 0))
    error_at(lr->loc, "lr must be > 0, found %g", t->lr);
  const YNode *x;
  if ((x = get(o, "momentum"))) {
    t->momentum = scalar_num(x, "momentum");
    if (t->momentum < 0 || t->momentum >= 1)
      error_at(x->loc, "momentum must be in [0, 1), found %g", t->momentum);
  }
  if ((x = get(o, "weight_decay"))) {
    t->weight_decay = scalar_num(x, "weight_decay");
    if (t->weight_decay < 0)
      error_at(x->loc, "weight_decay must be >= 0, found %g", t->weight_decay);
  }
  if ((x = get(o, "eps"))) {
    t->eps = scalar_num(x, "eps");
    if (!(t->eps > 0))
      error_at(x->loc, "eps must be > 0, found %g", t->eps);
  }
  if ((x = get(o, "betas"))) {
    if (x->kind != Y_SEQ || x->n != 2)
      error_at(x->loc, "betas must be a list of two numbers [beta1, beta2], found %s", seq_desc(x));
    t->beta1 = scalar_num(x->items[0], "beta1");
    t->beta2 = scalar_num(x->items[1], "beta2");
    for (int k = 0; k < 2; k++) {
      double b = k ? t->beta2 : t->beta1;
      if (b < 0 || b >= 1)
        error_at(x->items[k]->loc, "beta%d must be in [0, 1), found %g", k + 1, b);
    }
  }
  if (clip && !is_none(clip)) {
    t->has_clip = 1;
    t->grad_clip = scalar_num(clip, "grad_clip");
    if (!(t->grad_clip > 0))
      error_at(clip->loc, "grad_clip must be > 0, found %g", t->grad_clip);
  }
}

/* "512MB", "1.5GiB", 1048576 -> bytes; see spec.h. */
int parse_byte_size(const char *s, int64_t *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  static const struct { const char *sfx; double mul; } units[] = {
      {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"KiB", 1024.0},
      {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  if (end == s || errno == ERANGE)
    return -1;
  while (*end == ' ')
    end++;
  for (size_t i = 0; i < sizeof units / sizeof *units; i++)
    if (!strcmp(end, units[i].sfx)) {
      double b = v * units[i].mul;
      if (!(b > 0) || b > 9.0e18)
        return -2;
      *out = (int64_t)b;
      return 0;
    }
  return -1;
}

static int64_t parse_bytes(const YNode *y) {
  want(y, Y_SCALAR, "memory_budget");
  int64_t b;
  int rc = parse_byte_size(y->str, &b);
  if (rc == 0)
    return b;
  if (rc == -2)
    error_at(y->loc, "memory_budget must be a positive number of bytes, found '%s'", y->str);
  error_at(y->loc, "memory_budget must be none or a size in bytes (e.g. 2GB, 512MiB, 1000000), found '%s'", y->str);
}

static void parse_compile(Spec *s, const YNode *y) {
  Compile *c = &s->compile;
  want(y, Y_MAP, "'compile'");
  static const char *const keys[] = {"targets", "mode", "remat", "memory_budget", "fuse", "cuda_arch", "distributed"};
  check_keys(y, keys, 7, "compile");
  const YNode *x;
  if ((x = get(y, "targets"))) {
    static const char *const names[] = {"cuda", "cpu"};
    c->targets = 0;
    if (x->kind == Y_SCALAR) {
      c->targets = pick(x, names, 2, "target") == 0 ? TARGET_CUDA : TARGET_CPU;
    } else {
      want(x, Y_SEQ, "targets");
      for (int i = 0; i < x->n; i++)
        c->targets |= pick(x->items[i], names, 2, "target") == 0 ? TARGET_CUDA : TARGET_CPU;
      if (!c->targets)
        error_at(x->loc, "targets is empty; give [cuda], [cpu] or [cuda, cpu]");
    }
  }
  if ((x = get(y, "mode"))) {
    static const char *const names[] = {"default", "reduce-overhead", "max-autotune"};
    c->mode = (CompileMode)pick(x, names, 3, "compile mode");
  }
  if ((x = get(y, "remat"))) {
    static const char *const names[] = {"min-cut", "save-all", "recompute-all"};
    c->remat = (Remat)pick(x, names, 3, "remat strategy");
  }
  if ((x = get(y, "memory_budget")) && !is_none(x))
    c->memory_budget = parse_bytes(x);
  if ((x = get(y, "fuse")))
    c->fuse = scalar_bool(x, "fuse");
  if ((x = get(y, "distributed"))) {
    static const char *const names[] = {"none", "nccl"};
    c->distributed = pick(x, names, 2, "distributed backend");
    c->distributed_loc = x->loc;
  }
  if ((x = get(y, "cuda_arch"))) {
    const char *a = scalar_str(x, "cuda_arch");
    int ok = !strcmp(a, "native") || !strcmp(a, "all") || !strcmp(a, "all-major");
    if (!ok) { /* 90 | 90a | 80;90 */
      const char *p = a;
      ok = *p != 0;
      while (ok && *p) {
        if (!(*p >= '0' && *p <= '9'))
          ok = 0;
        while (*p >= '0' && *p <= '9')
          p++;
        if (*p == 'a')
          p++;
        if (*p == ';' && p[1])
          p++;
        else if (*p)
          ok = 0;
      }
    }
    if (!ok)
      error_at(x->loc, "cuda_arch must be native, all, or compute capabilities like 90 or 80;90, found '%s'", a);
    c->cuda_arch = a;
  }
}

/* ---------------------------------------------------------------- entry */

static const char *const top_keys[] = {"name", "dtype", "seed", "dims", "inputs", "params",
                                       "blocks", "graph", "outputs", "train", "compile"};

static Spec *parse_top(const char *file, const YNode *y) {
  Spec *s = arena_alloc(diag->arena, sizeof(Spec));
  s->file = file;
  s->dtype = DT_F32;
  s->compile = (Compile){TARGET_CUDA | TARGET_CPU, MODE_DEFAULT, REMAT_MIN_CUT, -1, 1, "native", 0, {0}};
  if (y->kind != Y_MAP)
    error_at(y->loc, "a model spec must be a mapping with keys like name, dims, inputs, params, graph; found %s", kind_name(y));
  check_keys(y, top_keys, (int)(sizeof top_keys / sizeof *top_keys), "top level");
  const YNode *x;
  if (!(x = get(y, "name")))
    error_at(y->loc, "missing 'name': every model needs a name (a C identifier that prefixes the emitted API)");
  s->name = scalar_str(x, "'name'");
  s->name_loc = x->vloc;
  if (!is_ident(s->name))
    error_at(x->vloc, "name '%s' is not a C identifier (letters, digits and '_', not starting with a digit)", s->name);
  /* the model's name is its CMake library target: not one CMake reserves */
  static const char *const cmake_reserved[] = {"all", "clean", "help", "install", "test", "package",
                                               "package_source", "edit_cache", "rebuild_cache", "depend",
                                               "preinstall", "list_install_components", "ALL_BUILD",
                                               "ZERO_CHECK", "RUN_TESTS", "INSTALL", "PACKAGE", "Continuous",
                                               "Experimental", "Nightly", "NightlyMemoryCheck"};
  for (size_t i = 0; i < sizeof cmake_reserved / sizeof *cmake_reserved; i++)
    if (!strcmp(s->name, cmake_reserved[i]))
      error_at(x->vloc, "name '%s' is a target name CMake reserves (the model's name is its library target); "
               "choose another", s->name);
  if ((x = get(y, "dtype"))) {
    static const char *const names[] = {"f32", "bf16", "f16"};
    if (x->kind == Y_SCALAR && (!strcmp(x->str, "i32") || !strcmp(x->str, "bool")))
      error_at(x->loc, "the model dtype must be floating (f32, bf16 or f16), found '%s'", x->str);
    s->dtype = (DType)pick(x, names, 3, "dtype");
  }
  if ((x = get(y, "seed"))) {
    int64_t v = scalar_int(x, "seed");
    if (v < 0)
      error_at(x->loc, "seed must be >= 0, found %lld", (long long)v);
    s->seed = (uint64_t)v;
  }
  if ((x = get(y, "dims")) && !is_none(x))
    parse_dims(s, x);
  if ((x = get(y, "inputs")) && !is_none(x))
    parse_inputs(s, x);
  if ((x = get(y, "params")) && !is_none(x))
    s->params = parse_params(x, &s->nparams, "'params'");
  if ((x = get(y, "blocks")) && !is_none(x))
    parse_blocks(s, x);
  if (!(x = get(y, "graph")))
    error_at(y->loc, "missing 'graph': the list of bindings that computes the model");
  s->graph = parse_graph(x, &s->ngraph, "'graph'");
  if ((x = get(y, "outputs"))) {
    s->outputs = parse_names(x, &s->noutputs, "'outputs'");
    s->outputs_loc = x->loc;
    if (s->noutputs == 0)
      error_at(x->loc, "outputs is empty; list at least one binding (or leave it out for the last binding)");
    if (s->noutputs > MAX_IO)
      error_at(x->loc, "%d outputs; a model has at most %d (the emitted runner and tests hold them in fixed arrays)",
               s->noutputs, MAX_IO);
  }
  if ((x = get(y, "train")) && !is_none(x))
    parse_train(s, x);
  if ((x = get(y, "compile")) && !is_none(x))
    parse_compile(s, x);
  if (s->compile.distributed && (!s->train.present || s->train.opt == OPT_NONE))
    error_at(s->compile.distributed_loc,
             "distributed: nccl trains across GPUs, so the model needs a train: section with an optimizer");
  if (s->compile.distributed && !(s->compile.targets & TARGET_CUDA))
    error_at(s->compile.distributed_loc, "distributed: nccl needs the cuda target (NCCL runs on GPUs)");
  return s;
}

Spec *spec_parse(const char *file, const char *src, size_t len) {
  return parse_top(file, yaml_load(src, len));
}

Block *spec_find_block(const Spec *s, const char *name) {
  for (int i = 0; i < s->nblocks; i++)
    if (!strcmp(s->blocks[i]->name, name))
      return s->blocks[i];
  return NULL;
}
