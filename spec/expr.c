/* expr.c: the expression language of bindings, shapes and dims.
 *
 *   expr  := term (('+' | '-') term)*
 *   term  := unary (('*' | '/' | '@') unary)*
 *   unary := '-' unary | atom
 *   atom  := NUMBER | NAME | call | '(' expr ')' | '[' [expr (',' expr)*] ']'
 *          | STRING | 'true' | 'false' | 'none'
 *   call  := NAME '(' [arg (',' arg)*] ')'
 *   arg   := expr | NAME '=' expr
 *
 * Strings and true/false/none are accepted anywhere by the parser and checked
 * against the op's signature later, which gives better messages. */
#include "spec.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef enum { T_NUM, T_NAME, T_STR, T_PUNCT, T_EOF } TokKind;

typedef struct {
  const YNode *y; /* the scalar being parsed (for locations) */
  const char *s;  /* its text */
  const char *p;  /* cursor */
  TokKind kind;   /* current token */
  const char *tok;
  size_t toklen;
  int depth;
} Lexer;

static Loc loc_of(Lexer *L, const char *at) {
  Loc l = L->y->vloc;
  if (!L->y->multiline)
    l.col += (int)(at - L->s);
  return l;
}

static void lex(Lexer *L) {
  while (*L->p == ' ' || *L->p == '\t' || *L->p == '\n' || *L->p == '\r')
    L->p++;
  const char *p = L->p;
  L->tok = p;
  if (!*p) {
    L->kind = T_EOF;
    L->toklen = 0;
    return;
  }
  if (isdigit((unsigned char)*p) || (*p == '.' && isdigit((unsigned char)p[1]))) {
    while (isdigit((unsigned char)*p))
      p++;
    if (*p == '.')
      for (p++; isdigit((unsigned char)*p); p++)
        ;
    if ((*p == 'e' || *p == 'E') &&
        (isdigit((unsigned char)p[1]) || ((p[1] == '+' || p[1] == '-') && isdigit((unsigned char)p[2])))) {
      p += 2;
      while (isdigit((unsigned char)*p))
        p++;
    }
    if (isalpha((unsigned char)*p) || *p == '_')
      error_at(loc_of(L, L->tok), "malformed number '%.*s'", (int)(p - L->tok + 1), L->tok);
    L->kind = T_NUM;
  } else if (isalpha((unsigned char)*p) || *p == '_') {
    while (isalnum((unsigned char)*p) || *p == '_')
      p++;
    L->kind = T_NAME;
  } else if (*p == '\'' || *p == '"') {
    char q = *p++;
    while (*p && *p != q)
      p++;
    if (!*p)
      error_at(loc_of(L, L->tok), "unterminated string (missing closing %c)", q);
    p++;
    L->kind = T_STR;
  } else if (strchr("+-*/@()[],=", *p)) {
    p++;
    L->kind = T_PUNCT;
  } else {
    unsigned char c = (unsigned char)*p;
    if (c >= 0x80)
      error_at(loc_of(L, p), "unexpected non-ASCII character in expression");
    error_at(loc_of(L, p), "unexpected character '%c' in expression", c);
  }
  L->toklen = (size_t)(p - L->tok);
  L->p = p;
}

static int is_punct(Lexer *L, char c) { return L->kind == T_PUNCT && *L->tok == c; }

static const char *tok_desc(Lexer *L) {
  if (L->kind == T_EOF)
    return "end of expression";
  return arena_printf(diag->arena, "'%.*s'", (int)(L->toklen > 40 ? 40 : L->toklen), L->tok);
}

static void expect(Lexer *L, char c, const char *what) {
  if (!is_punct(L, c))
    error_at(loc_of(L, L->tok), "expected '%c' %s, found %s", c, what, tok_desc(L));
  lex(L);
}

static Expr *new_expr(Lexer *L, ExprKind k, const char *at) {
  Expr *e = arena_alloc(diag->arena, sizeof(Expr));
  e->kind = k;
  e->loc = loc_of(L, at);
  return e;
}

static Expr *expr(Lexer *L);

/* Records that `child` hangs below `e`. The tree's height is bounded, chains
 * included (a + b + c is a tree of height 2), so that every pass may walk it
 * recursively: a 20,000-term chain is refused here, not by a stack overflow. */
static void below(Lexer *L, Expr *e, const Expr *child, const char *at) {
  if (child->depth + 1 > e->depth)
    e->depth = child->depth + 1;
  if (e->depth > MAX_EXPR_DEPTH)
    error_at(loc_of(L, at), "expression nested more than %d levels deep (each operator of a chain 'a + b + ...' "
             "is a level); split it into several bindings", MAX_EXPR_DEPTH);
}

static void enter(Lexer *L, const char *at) {
  if (++L->depth > MAX_DEPTH)
    error_at(loc_of(L, at), "expression nested more than %d levels deep", MAX_DEPTH);
}

/* Comma-separated items up to `close`; keyword args allowed when `call`. */
static void items(Lexer *L, Expr *e, char close, int call) {
  Vec v = {0};
  const char *open = L->tok;
  lex(L);
  while (!is_punct(L, close)) {
    if (L->kind == T_EOF)
      error_at(loc_of(L, open), "'%c' is never closed (expected '%c')", *open, close);
    if (v.n)
      expect(L, ',', call ? "between arguments" : "between list items");
    Expr *a;
    const char *start = L->tok;
    if (call && L->kind == T_NAME && L->p[strspn(L->p, " \t")] == '=') {
      a = new_expr(L, E_KWARG, start);
      a->name = arena_strndup(diag->arena, L->tok, L->toklen);
      lex(L);
      lex(L); /* '=' */
      for (int i = 0; i < v.n; i++) {
        Expr *o = v.p[i];
        if (o->kind == E_KWARG && strcmp(o->name, a->name) == 0)
          error_at(a->loc, "keyword argument '%s' given twice", a->name);
      }
      a->lhs = expr(L);
      below(L, a, a->lhs, start);
    } else {
      a = expr(L);
      for (int i = 0; call && i < v.n; i++)
        if (((Expr *)v.p[i])->kind == E_KWARG)
          error_at(a->loc, "positional argument after a keyword argument");
    }
    below(L, e, a, start);
    vec_push(diag->arena, &v, a);
  }
  lex(L);
  e->args = (Expr **)v.p;
  e->nargs = v.n;
}

static Expr *atom(Lexer *L) {
  const char *start = L->tok;
  Expr *e;
  switch (L->kind) {
  case T_NUM: {
    e = new_expr(L, E_NUM, start);
    char *tmp = arena_strndup(diag->arena, L->tok, L->toklen);
    e->is_int = strpbrk(tmp, ".eE") == NULL;
    errno = 0;
    if (e->is_int) {
      if (tmp[0] == '0' && tmp[1]) /* YAML 1.1 tools (PyYAML, ...) read 010 as octal 8: no silent guess either way */
        error_at(e->loc, "integer %s has a leading zero (YAML 1.1 reads that as octal): write it without", tmp);
      char *end;
      unsigned long long v = strtoull(tmp, &end, 10);
      if (errno == ERANGE || v > (unsigned long long)INT64_MAX)
        error_at(e->loc, "integer %s is too large (limit %lld)", tmp, (long long)INT64_MAX);
      e->ival = (int64_t)v;
      e->num = (double)v;
    } else {
      e->num = strtod(tmp, NULL);
      if (!isfinite(e->num))
        error_at(e->loc, "number %s is out of range", tmp);
    }
    lex(L);
    break;
  }
  case T_STR:
    e = new_expr(L, E_STR, start);
    e->name = arena_strndup(diag->arena, L->tok + 1, L->toklen - 2);
    lex(L);
    break;
  case T_NAME: {
    char *name = arena_strndup(diag->arena, L->tok, L->toklen);
    lex(L);
    if (is_punct(L, '(')) {
      e = new_expr(L, E_CALL, start);
      e->name = name;
      items(L, e, ')', 1);
    } else if (!strcmp(name, "true") || !strcmp(name, "false")) {
      e = new_expr(L, E_BOOL, start);
      e->ival = name[0] == 't';
    } else if (!strcmp(name, "none")) {
      e = new_expr(L, E_NONE, start);
    } else {
      e = new_expr(L, E_NAME, start);
      e->name = name;
    }
    break;
  }
  case T_PUNCT:
    if (is_punct(L, '(')) {
      lex(L);
      e = expr(L);
      if (!is_punct(L, ')'))
        error_at(loc_of(L, L->kind == T_EOF ? start : L->tok), "expected ')' to close '(' , found %s", tok_desc(L));
      lex(L);
      break;
    }
    if (is_punct(L, '[')) {
      e = new_expr(L, E_LIST, start);
      items(L, e, ']', 0);
      break;
    }
    /* fallthrough */
  default:
    error_at(loc_of(L, start), "expected an operand (a name, number, call, '(' or '['), found %s", tok_desc(L));
  }
  return e;
}

static Expr *unary(Lexer *L) {
  if (is_punct(L, '-')) {
    const char *start = L->tok;
    enter(L, start);
    lex(L);
    Expr *x = unary(L);
    L->depth--;
    if (x->kind == E_NUM) { /* fold literal: -2 is a number */
      x->num = -x->num;
      x->ival = -x->ival;
      x->loc = loc_of(L, start);
      return x;
    }
    Expr *e = new_expr(L, E_NEG, start);
    e->lhs = x;
    below(L, e, x, start);
    return e;
  }
  return atom(L);
}

static Expr *binop(Lexer *L, char op, const char *at, Expr *lhs, Expr *rhs) {
  Expr *e = arena_alloc(diag->arena, sizeof(Expr));
  e->kind = E_BINOP;
  e->op = op;
  e->lhs = lhs;
  e->rhs = rhs;
  e->loc = lhs->loc;
  below(L, e, lhs, at);
  below(L, e, rhs, at);
  return e;
}

static Expr *term(Lexer *L) {
  Expr *e = unary(L);
  while (is_punct(L, '*') || is_punct(L, '/') || is_punct(L, '@')) {
    char op = *L->tok;
    const char *at = L->tok;
    lex(L);
    e = binop(L, op, at, e, unary(L));
  }
  return e;
}

static Expr *expr(Lexer *L) {
  enter(L, L->tok);
  Expr *e = term(L);
  while (is_punct(L, '+') || is_punct(L, '-')) {
    char op = *L->tok;
    const char *at = L->tok;
    lex(L);
    e = binop(L, op, at, e, term(L));
  }
  L->depth--;
  return e;
}

Expr *parse_expr(const YNode *y) {
  Lexer L = {.y = y, .s = y->str, .p = y->str};
  if (y->kind != Y_SCALAR)
    error_at(y->loc, "expected an expression, found a %s", y->kind == Y_MAP ? "mapping" : "sequence");
  lex(&L);
  if (L.kind == T_EOF)
    error_at(y->loc, "expected an expression, found an empty value");
  Expr *e = expr(&L);
  if (L.kind != T_EOF)
    error_at(loc_of(&L, L.tok), "unexpected %s after the end of the expression", tok_desc(&L));
  return e;
}

/* Stops once the text passes `max` characters: messages show the start of a
 * long expression, and printing costs O(max) however long the chain. */
static void print_expr(Buf *b, const Expr *e, size_t max) {
  if (b->len > max)
    return;
  switch (e->kind) {
  case E_NUM:
    if (e->is_int)
      buf_printf(b, "%lld", (long long)e->ival);
    else
      buf_printf(b, "%g", e->num);
    break;
  case E_NAME: buf_printf(b, "%s", e->name); break;
  case E_STR: buf_printf(b, "'%s'", e->name); break;
  case E_BOOL: buf_printf(b, "%s", e->ival ? "true" : "false"); break;
  case E_NONE: buf_printf(b, "none"); break;
  case E_KWARG:
    buf_printf(b, "%s=", e->name);
    print_expr(b, e->lhs, max);
    break;
  case E_LIST:
  case E_CALL:
    if (e->kind == E_CALL)
      buf_printf(b, "%s(", e->name);
    else
      buf_printf(b, "[");
    for (int i = 0; i < e->nargs; i++) {
      if (i)
        buf_printf(b, ", ");
      print_expr(b, e->args[i], max);
    }
    buf_printf(b, "%s", e->kind == E_CALL ? ")" : "]");
    break;
  case E_NEG:
    buf_printf(b, "-");
    print_expr(b, e->lhs, max);
    break;
  case E_BINOP:
    buf_printf(b, "(");
    print_expr(b, e->lhs, max);
    buf_printf(b, " %c ", e->op);
    print_expr(b, e->rhs, max);
    buf_printf(b, ")");
    break;
  }
}

/* The printed form, or NULL when it is longer than `max` characters. */
const char *expr_str_max(const Expr *e, size_t max) {
  Buf b;
  buf_init(&b, diag->arena);
  print_expr(&b, e, max);
  return b.len > max ? NULL : b.p;
}

const char *expr_str(const Expr *e) {
  enum { MAX = 200 };
  Buf b;
  buf_init(&b, diag->arena);
  print_expr(&b, e, MAX);
  if (b.len > MAX) {
    b.len = MAX;
    buf_printf(&b, "...");
  }
  return b.p;
}
