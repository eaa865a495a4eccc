/* dim.c: symbolic sizes. A size is a polynomial over the dynamic dims with
 * int64 coefficients, in canonical form, so equality is structural. Division
 * that is exact term by term stays a polynomial; any other division by a
 * symbolic size makes a derived symbol (B*T/12 when 12 does not divide), whose
 * divisibility the emitted guards check at run time. */
#include "ir.h"

#include <string.h>

const char *dim_context = "";

static int term_cmp(const Term *a, const Term *b) { return memcmp(a->e, b->e, MAXSYM); }

/* Sort terms, merge equal exponents, drop zeros. */
static Dim canon(Dim d, Loc l) {
  for (int i = 1; i < d.n; i++)
    for (int j = i; j > 0 && term_cmp(&d.t[j - 1], &d.t[j]) > 0; j--) {
      Term t = d.t[j];
      d.t[j] = d.t[j - 1];
      d.t[j - 1] = t;
    }
  Dim r = {0};
  for (int i = 0; i < d.n; i++) {
    if (r.n && term_cmp(&r.t[r.n - 1], &d.t[i]) == 0) {
      if (__builtin_add_overflow(r.t[r.n - 1].c, d.t[i].c, &r.t[r.n - 1].c))
        error_at(l, "%ssize expression overflows int64", dim_context);
    } else {
      r.t[r.n++] = d.t[i];
    }
    if (r.t[r.n - 1].c == 0)
      r.n--;
  }
  return r;
}

Dim dim_const(int64_t c) {
  Dim d = {0};
  if (c) {
    d.n = 1;
    d.t[0].c = c;
  }
  return d;
}

Dim dim_sym(int s) {
  Dim d = {0};
  d.n = 1;
  d.t[0].c = 1;
  d.t[0].e[s] = 1;
  return d;
}

/* Scratch with room for the unmerged result of a product. */
typedef struct {
  int n;
  Term t[MAXTERMS * MAXTERMS];
} Wide;

static Dim narrow(Wide *w, Loc l) {
  /* merge first, then check the term limit */
  for (int i = 1; i < w->n; i++)
    for (int j = i; j > 0 && term_cmp(&w->t[j - 1], &w->t[j]) > 0; j--) {
      Term t = w->t[j];
      w->t[j] = w->t[j - 1];
      w->t[j - 1] = t;
    }
  Dim r = {0};
  for (int i = 0; i < w->n; i++) {
    if (r.n && term_cmp(&r.t[r.n - 1], &w->t[i]) == 0) {
      if (__builtin_add_overflow(r.t[r.n - 1].c, w->t[i].c, &r.t[r.n - 1].c))
        error_at(l, "%ssize expression overflows int64", dim_context);
    } else {
      if (r.n == MAXTERMS)
        error_at(l, "%ssize expression has more than %d terms; simplify it", dim_context, MAXTERMS);
      r.t[r.n++] = w->t[i];
    }
    if (r.t[r.n - 1].c == 0)
      r.n--;
  }
  return r;
}

Dim dim_add(Dim a, Dim b, Loc l) {
  Wide w = {0};
  for (int i = 0; i < a.n; i++)
    w.t[w.n++] = a.t[i];
  for (int i = 0; i < b.n; i++)
    w.t[w.n++] = b.t[i];
  return narrow(&w, l);
}

Dim dim_sub(Dim a, Dim b, Loc l) {
  for (int i = 0; i < b.n; i++) {
    if (b.t[i].c == INT64_MIN)
      error_at(l, "%ssize expression overflows int64", dim_context);
    b.t[i].c = -b.t[i].c;
  }
  return dim_add(a, b, l);
}

Dim dim_mul(Dim a, Dim b, Loc l) {
  Wide w = {0};
  for (int i = 0; i < a.n; i++)
    for (int j = 0; j < b.n; j++) {
      Term t;
      if (__builtin_mul_overflow(a.t[i].c, b.t[j].c, &t.c))
        error_at(l, "%ssize expression overflows int64", dim_context);
      for (int k = 0; k < MAXSYM; k++) {
        int e = a.t[i].e[k] + b.t[j].e[k];
        if (e > 16)
          error_at(l, "%ssize expression has a power above 16", dim_context);
        t.e[k] = (uint8_t)e;
      }
      w.t[w.n++] = t;
    }
  return narrow(&w, l);
}

int dim_eq(const Dim *a, const Dim *b) {
  if (a->n != b->n)
    return 0;
  for (int i = 0; i < a->n; i++)
    if (a->t[i].c != b->t[i].c || term_cmp(&a->t[i], &b->t[i]))
      return 0;
  return 1;
}

int dim_is_one(const Dim *a) {
  int64_t v;
  return dim_is_const(a, &v) && v == 1;
}

int dim_is_const(const Dim *a, int64_t *v) {
  if (a->n == 0) {
    *v = 0;
    return 1;
  }
  if (a->n == 1) {
    for (int k = 0; k < MAXSYM; k++)
      if (a->t[0].e[k])
        return 0;
    *v = a->t[0].c;
    return 1;
  }
  return 0;
}

/* Exact division by a single term (monomial) when every term divides. */
static int div_by_term(Dim a, const Term *m, Dim *out) {
  for (int i = 0; i < a.n; i++) {
    if (m->c == 0 || a.t[i].c % m->c)
      return 0;
    for (int k = 0; k < MAXSYM; k++)
      if (a.t[i].e[k] < m->e[k])
        return 0;
  }
  for (int i = 0; i < a.n; i++) {
    a.t[i].c /= m->c;
    for (int k = 0; k < MAXSYM; k++)
      a.t[i].e[k] = (uint8_t)(a.t[i].e[k] - m->e[k]);
  }
  *out = a;
  return 1;
}

Dim dim_div(Graph *g, Dim a, Dim b, Loc l) {
  int64_t av, bv;
  if (dim_is_const(&b, &bv) && bv == 0)
    error_at(l, "%sdivision by zero in a size expression", dim_context);
  if (dim_is_const(&a, &av) && dim_is_const(&b, &bv)) {
    if (av % bv)
      error_at(l, "%s%lld / %lld does not divide exactly; sizes must be whole", dim_context, (long long)av, (long long)bv);
    return dim_const(av / bv);
  }
  Dim r;
  if (b.n == 1 && div_by_term(a, &b.t[0], &r))
    return canon(r, l);
  if (dim_eq(&a, &b))
    return dim_const(1);
  /* A derived symbol: value = a / b, checked to divide at run time. Reuse an
   * existing one with the same numerator and denominator. */
  for (int i = 0; i < g->nsyms; i++)
    if (g->syms[i].derived && dim_eq(&g->syms[i].num, &a) && dim_eq(&g->syms[i].den, &b))
      return dim_sym(i);
  if (g->nsyms == MAXSYM)
    error_at(l, "%stoo many symbolic sizes (dynamic dims and quotients; limit %d)", dim_context, MAXSYM);
  Sym *s = &g->syms[g->nsyms];
  s->derived = 1;
  s->num = a;
  s->den = b;
  s->loc = l;
  s->name = arena_printf(g->arena, "(%s)/(%s)", dim_str(g, &a), dim_str(g, &b));
  /* the back end sizes buffers at the dims' maxima: the quotient must be
   * whole there (a split of B into 2 with B's max 7 has no size to plan) */
  int64_t vals[MAXSYM] = {0}, nv, dv;
  const char *err;
  for (int k = 0; k < g->nsyms; k++)
    vals[k] = g->syms[k].max;
  if (dim_eval(g, &a, vals, &nv, &err) && dim_eval(g, &b, vals, &dv, &err) && dv != 0 && nv % dv)
    error_at(l, "%s%s / %s does not divide at the dims' maxima (%lld / %lld); give the dynamic dims maxima for which it "
             "does", dim_context, dim_str(g, &a), dim_str(g, &b), (long long)nv, (long long)dv);
  return dim_sym(g->nsyms++);
}

const char *dim_str(const Graph *g, const Dim *a) {
  Buf b;
  buf_init(&b, g->arena);
  if (a->n == 0)
    buf_printf(&b, "0");
  for (int i = 0; i < a->n; i++) {
    const Term *t = &a->t[i];
    int64_t c = t->c;
    int nsym = 0;
    for (int k = 0; k < MAXSYM; k++)
      nsym += t->e[k];
    if (i)
      buf_printf(&b, c < 0 ? " - " : " + ");
    else if (c < 0)
      buf_printf(&b, "-");
    uint64_t mag = c < 0 ? (uint64_t)0 - (uint64_t)c : (uint64_t)c;
    if (mag != 1 || nsym == 0)
      buf_printf(&b, "%llu%s", (unsigned long long)mag, nsym ? "*" : "");
    int first = 1;
    for (int k = 0; k < MAXSYM; k++)
      for (int e = 0; e < t->e[k]; e++) {
        buf_printf(&b, "%s%s", first ? "" : "*", g->syms[k].name);
        first = 0;
      }
  }
  return b.p;
}

static int eval_rec(const Graph *g, const Dim *a, const int64_t *vals, int64_t *out, const char **err, int depth);

static int sym_value(const Graph *g, int k, const int64_t *vals, int64_t *out, const char **err, int depth) {
  const Sym *s = &g->syms[k];
  if (!s->derived) {
    *out = vals[k];
    return 1;
  }
  int64_t n, d;
  if (depth > MAXSYM || !eval_rec(g, &s->num, vals, &n, err, depth + 1) || !eval_rec(g, &s->den, vals, &d, err, depth + 1))
    return 0;
  if (d == 0 || n % d) {
    *err = arena_printf(g->arena, "%s does not divide: %lld / %lld", s->name, (long long)n, (long long)d);
    return 0;
  }
  *out = n / d;
  return 1;
}

static int eval_rec(const Graph *g, const Dim *a, const int64_t *vals, int64_t *out, const char **err, int depth) {
  int64_t sum = 0;
  for (int i = 0; i < a->n; i++) {
    int64_t t = a->t[i].c;
    for (int k = 0; k < MAXSYM; k++)
      for (int e = 0; e < a->t[i].e[k]; e++) {
        int64_t v;
        if (!sym_value(g, k, vals, &v, err, depth))
          return 0;
        if (__builtin_mul_overflow(t, v, &t))
          goto overflow;
      }
    if (__builtin_add_overflow(sum, t, &sum))
      goto overflow;
  }
  *out = sum;
  return 1;
overflow:
  *err = arena_printf(g->arena, "size %s overflows int64", dim_str(g, a));
  return 0;
}

int dim_eval(const Graph *g, const Dim *a, const int64_t *vals, int64_t *out, const char **err) {
  return eval_rec(g, a, vals, out, err, 0);
}

int dim_bounds(const Graph *g, const Dim *a, int64_t *lo, int64_t *hi) {
  int64_t mins[MAXSYM], maxs[MAXSYM];
  const char *err;
  for (int k = 0; k < MAXSYM; k++) {
    mins[k] = 1;
    maxs[k] = k < g->nsyms && !g->syms[k].derived ? g->syms[k].max : 1;
  }
  /* derived symbols take the values their formulas give; a non-dividing corner
   * is not an error here (the guard catches it at run time) */
  int64_t a1, a2;
  Graph *gg = (Graph *)g;
  int ok1 = dim_eval(gg, a, mins, &a1, &err), ok2 = dim_eval(gg, a, maxs, &a2, &err);
  if (!ok2 && strstr(err, "overflow"))
    return 0;
  if (!ok1)
    a1 = ok2 ? a2 : 1;
  if (!ok2)
    a2 = a1;
  *lo = a1 < a2 ? a1 : a2;
  *hi = a1 < a2 ? a2 : a1;
  return 1;
}
