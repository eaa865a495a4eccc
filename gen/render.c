/* render.c: a scheduled, planned pass printed as C (OpenMP) or CUDA.
 *
 * One walker prints every kernel for both targets; the two differ only by
 * the Dialect table (loop headers, how the lanes of a reduction combine, the
 * launch). A loop kernel is printed from its values, not from a template:
 *
 *   val(node, index)  the C expression of node's element at `index`: a load
 *                     of a stored value, the accumulator of a reduction the
 *                     kernel computes, or (pointwise ops) ops.def's
 *                     expression of the operands' values, printed once per
 *                     loop and index (a local), hoisted to the outermost loop
 *                     its indices allow; views only transform the index.
 *
 * An index is a row-major flat position or per-dim positions, converted
 * lazily (div/mod by the dims' C sizes) and broadcast by dropping or zeroing
 * dims. A reduction kernel runs, for each output element o, one loop over
 * the reduced elements r per phase (a phase's reductions read only earlier
 * phases' results), then stores its values over the input's space in the
 * loop after the last reduction they read (with the first phase when they
 * read none), and its values over the output's space after the loops. */
#include "ir.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- C text */

const char *c_dim(const Graph *g, const Dim *d) {
  Buf b;
  buf_init(&b, g->arena);
  if (d->n == 0)
    buf_printf(&b, "0");
  for (int i = 0; i < d->n; i++) {
    const Term *t = &d->t[i];
    int nsym = 0;
    for (int k = 0; k < MAXSYM; k++)
      nsym += t->e[k];
    int64_t c = t->c;
    if (i)
      buf_printf(&b, c < 0 ? " - " : " + ");
    else if (c < 0)
      buf_printf(&b, "-");
    uint64_t mag = c < 0 ? (uint64_t)0 - (uint64_t)c : (uint64_t)c;
    int first = 1;
    if (mag != 1 || nsym == 0) {
      buf_printf(&b, mag > 2147483647u ? "%lluLL" : "%llu", (unsigned long long)mag);
      first = 0;
    }
    for (int k = 0; k < MAXSYM; k++)
      for (int x = 0; x < t->e[k]; x++) {
        buf_printf(&b, "%sdim_%s", first ? "" : " * ",
                   g->syms[k].derived ? arena_printf(g->arena, "q%d", k) : g->syms[k].name);
        first = 0;
      }
  }
  return b.p;
}

static int idc(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* A float literal of the emitted code. */
static const char *flit(Arena *a, double v) {
  if (isinf(v))
    return v > 0 ? "INFINITY" : "-INFINITY";
  if (isnan(v))
    return "NAN";
  char t[64];
  snprintf(t, sizeof t, "%.9g", v);
  if (!strpbrk(t, ".eEn"))
    strcat(t, ".0");
  return arena_printf(a, "%sf", t);
}

/* ---------------------------------------------------------------- the dialects */

/* An index into a value of shape sh: its row-major position, or its
 * position along each dim, or both. */
typedef struct Ix {
  const Shape *sh;
  const char *flat;          /* row-major position, or NULL */
  const char *d[MAXRANK];    /* per-dim positions (NULL: derived from flat) */
  const struct Ix *src;      /* flat from a reshape: the position in its output, or NULL (row_view_base) */
} Ix;

typedef struct R R;
/* how a kernel's elements map to threads: pointwise; a loop per output
 * element; a warp or a block per output element (rows: the reduced dims are
 * innermost); a tile of 32 output elements per block, its 32 rows of
 * threads splitting the reduced elements (columns: the kept dims innermost,
 * so the 32 threads of a row read 32 neighbours) */
enum { M_PW, M_SERIAL, M_WARP, M_BLOCK, M_COLUMN, M_CTILE };
enum { CHUNKS = 64 }; /* a split CPU reduction's chunks: fixed, so its sums do not depend on the thread count */
/* CPU, M_CTILE: a column reduction (kept dims innermost) as tiles of
 * CTILE neighbouring output elements, each tile one iteration of the
 * parallel loop: for each reduced element r, a vector loop over the tile's
 * outputs reads a row's contiguous elements into an array of accumulators
 * (instead of a loop per output element striding over the rows). */
#define CTILE 16
#define CTILE_TEXT "16"

typedef struct Dialect {
  const char *name;       /* "cpu", "cuda" */
  const char *qual;       /* before a kernel's return type */
  const char *restr;      /* the restrict qualifier */
  const char *acc;        /* a float accumulator's type */
  void (*pw_loop)(R *r);  /* open the loop over the elements i < n */
  void (*o_loop)(R *r);   /* open the loop over the output elements o < n_o */
  void (*r_loop)(R *r);   /* open a loop over the reduced elements r < n_r */
  void (*combine)(R *r, Op op, const char *acc); /* after an r loop: combine the lanes' accumulators */
  const char *(*one_lane)(R *r); /* the condition for the stores of reduction results ("" = always) */
  void (*bad)(R *r, int level, const char *pos); /* record a bad index at flat position pos */
  void (*close_kernel)(R *r);
} Dialect;

/* ---------------------------------------------------------------- a kernel's context */

#define LEVELS 4

/* An open-addressing table of entry numbers + 1 (0: empty) by string,
 * so that a kernel of thousands of values renders in linear time. */
typedef struct Hash {
  int *slot;
  int cap; /* a power of two, at least twice the entries */
} Hash;

static uint32_t hstr(const char *s, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)s[i]) * 16777619u;
  return h;
}

/* The slot of string s[0..n) among names[] (its entry or the empty one it would take). */
static int *hash_find(Hash *h, const char *s, size_t n, const char *const *names, size_t stride) {
  for (uint32_t i = hstr(s, n) & (uint32_t)(h->cap - 1);; i = (i + 1) & (uint32_t)(h->cap - 1)) {
    int e = h->slot[i];
    if (!e)
      return &h->slot[i];
    const char *t = *(const char *const *)((const char *)names + (size_t)(e - 1) * stride);
    if (!strncmp(t, s, n) && !t[n])
      return &h->slot[i];
  }
}

/* Entries 0..n-1 of names[] (each stride bytes apart) into h, the latest of equal names winning. */
static void hash_build(Arena *a, Hash *h, int n, const char *const *names, size_t stride) {
  if (h->cap < 2 * n + 2) {
    while (h->cap < 2 * n + 2)
      h->cap = h->cap ? 2 * h->cap : 512;
    h->slot = arena_alloc(a, sizeof(int) * (size_t)h->cap);
  }
  memset(h->slot, 0, sizeof(int) * (size_t)h->cap);
  for (int i = 0; i < n; i++) {
    const char *s = *(const char *const *)((const char *)names + (size_t)i * stride);
    *hash_find(h, s, strlen(s), names, stride) = i + 1;
  }
}

/* Per-node tables of the kernel walkers, allocated once per pass: an entry
 * counts for the walker whose stamp it bears, so a walker costs its
 * kernel's size, not the pass's (the scheduler renders a kernel at every
 * merge it tries). */
typedef struct RTab {
  int *own_st, *acc_st, *dep_st, *dep, *cdep_st, *cdep;
  const char **acc;
  int stamp;
} RTab;

typedef struct Memo {
  const char *key, *var;
  int level;
} Memo;

struct R {
  BPass *p;
  Graph *g;
  Arena *a;
  const Dialect *d;
  const Kernel *k;
  int mode;
  Buf lv[LEVELS];     /* text of each loop level: 0 kernel top, 1 per element o (or i), 2 an r loop */
  int level;          /* the innermost open level */
  Memo *memo;
  int nmemo, cap;
  const char **vlev;  /* index variables and their levels */
  int *vlevel;
  int nv, capv;
  Hash mh, vh;        /* memo keys and variable names -> their latest entry */
  int nvars;
  RTab *t;            /* per node: the reduction's result variable (once its phase is done), the kernel
                         computes it, the phase it is known after: entries stamped with stamp */
  int stamp;
  int fail;           /* render_check: 1 a reduction read at another element, 2 a load of a value it stores */
  Vec params;         /* Buffer indices the kernel reads or writes, in first-use order */
  int *bkey;          /* the buffers with flags (BF_*): an open-addressed table of index + 1, */
  unsigned char *bflag; /* their flags beside it (sized by the kernel's buffers, not the pass's) */
  int bcap, bn;
  int has_bad;        /* the kernel reports bad indices (a take) */
  int saw_take;
  const Shape *outer_sh; /* the output space of a reduction kernel */
  Shape outer_shape;
  const char *name;   /* the model's name, for the math functions */
  const char *NAME;
  const char *it;     /* the index type: "int64_t", or "int" where every size fits (CUDA) */
  int vec;            /* M_PW on CUDA: elements per thread of the vector loop (0: none) */
  int rvec;           /* M_WARP, M_BLOCK rows on CUDA: elements per vector of the rows' vector loops (0: none) */
  int cvec;           /* M_COLUMN on CUDA: output columns per thread, one vector of each row (column_vectors) */
  int rcache;         /* rows on CUDA read in several phases: vectors per thread kept in registers (0: none) */
  const char *rc_start, *rc_step; /* their loop's first vector and step */
  int rthreads;       /* M_BLOCK on CUDA, not split: the threads of a row (a block; ROW_BLOCK unless long rows) */
  int srow;           /* a long row in shared memory (SROW_MAX): the bytes it may take (0: none) */
  int srow_used;      /* the bytes its buffers' rows take (the launch's dynamic shared memory) */
  int grp;            /* M_WARP: the lanes of a row (32; a power of two below it for short rows, 32 / grp rows a
                         warp, each group of lanes on its own: tgm_group_*) */
  const Node *on_max, *on_sum; /* CUDA rows: amax(u) and sum(exp(u - amax(u))) in one online pass (online_pair) */
  Ix full;            /* a reduction phase's index over the kernel's whole space (full.sh NULL: none) */
  int rcache_regs;    /* the registers those arrays take so far */
  int lanes;          /* printing a vector loop's lane body */
  const char *vflat;  /* the flat index a vector lane loads and stores at ("i"; a row kernel's "o * n_r + r") */
  const char *vidx;   /* the vector loop's index ("iv"; "rv": vectors of the row at o) */
  int vload_lv;       /* the level of the vector loop's loads */
  Vec vstores;        /* the lane body's vector stores: "buffer|local" */
  int nph, last_full; /* a reduction kernel's phases; the last one a value over the input space waits for */
  int split;          /* M_BLOCK, M_COLUMN on CUDA: the reduced elements split over gridDim.y blocks */
  int csplit;         /* on the CPU: few outputs, the reduced elements split into CHUNKS parallel chunks */
  /* in place (plan.c): the kernel stores buffer ip_out over the bytes of ip_in, which it reads last */
  int ip_in, ip_out;  /* buffer indices, or -1 */
  int ip_ph;          /* the phase printing now: 2 * ph in phase ph's loops (2 a pointwise loop), 2 * ph_w
                         - 1 the values over the output space printed before the storing phase ph_w */
  int ip_loop;        /* which loop prints now (each of a phase's loops, vector or not, its own) */
  int ip_seq;         /* reads and stores noted so far */
  int ip_bad;         /* a read or store that is not safe in place */
  Vec ip_ld, ip_st;   /* the reads of ip_in's bytes and the stores of ip_out: "loop|phase|index" */
  int nslot;          /* riders on CUDA: each thread's sums of a rider (its positions of the row), in shared memory */
  int leaf;           /* on the CPU (not csplit): the parallel loop printed as a leaf function's loop over
                         [lo, hi), no parallel region inside (loop_kernel prints the region that calls it) */
};

static void emit(R *r, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void emit(R *r, int level, const char *fmt, ...) {
  char tmp[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  for (int i = 0; i < level + 1 + (r->csplit && level >= 2); i++) /* a split's r loop sits in its chunk loop */
    buf_printf(&r->lv[level], "  ");
  buf_printf(&r->lv[level], "%s\n", tmp);
}

static void open_level(R *r) {
  r->level++;
  buf_init(&r->lv[r->level], r->a);
}

/* A loop's header: the first line of its own level, so that values hoisted
 * out of the loop (into the enclosing level) print before it. */
static void head(R *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void head(R *r, const char *fmt, ...) {
  char tmp[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  for (int i = 0; i < r->level; i++)
    buf_printf(&r->lv[r->level], "  ");
  buf_printf(&r->lv[r->level], "%s\n", tmp);
}

/* Close the innermost level: its text goes into the enclosing one, inside a
 * block; its locals are forgotten. */
static void close_level(R *r) {
  int l = r->level--;
  buf_printf(&r->lv[r->level], "%s", r->lv[l].p ? r->lv[l].p : "");
  for (int i = 0; i < r->level + 1 + (r->csplit && l == 2); i++)
    buf_printf(&r->lv[r->level], "  ");
  buf_printf(&r->lv[r->level], "}\n");
  int w = 0;
  for (int i = 0; i < r->nmemo; i++)
    if (r->memo[i].level <= r->level)
      r->memo[w++] = r->memo[i];
  r->nmemo = w;
  w = 0;
  for (int i = 0; i < r->nv; i++)
    if (r->vlevel[i] <= r->level)
      r->vlev[w] = r->vlev[i], r->vlevel[w++] = r->vlevel[i];
  r->nv = w;
  hash_build(r->a, &r->mh, r->nmemo, &r->memo[0].key, sizeof(Memo));
  hash_build(r->a, &r->vh, r->nv, r->vlev, sizeof(char *));
}

static void set_var_level(R *r, const char *v, int level) {
  if (r->nv == r->capv) {
    r->capv *= 2;
    const char **nv = arena_alloc(r->a, sizeof(char *) * (size_t)r->capv);
    int *nl = arena_alloc(r->a, sizeof(int) * (size_t)r->capv);
    memcpy(nv, r->vlev, sizeof(char *) * (size_t)r->nv);
    memcpy(nl, r->vlevel, sizeof(int) * (size_t)r->nv);
    r->vlev = nv, r->vlevel = nl;
  }
  r->vlev[r->nv] = v;
  r->vlevel[r->nv++] = level;
  if (2 * r->nv + 2 > r->vh.cap)
    hash_build(r->a, &r->vh, r->nv, r->vlev, sizeof(char *));
  else
    *hash_find(&r->vh, v, strlen(v), r->vlev, sizeof(char *)) = r->nv;
}

/* The innermost level whose variables the expression uses (0: dims only). */
static int expr_level(R *r, const char *e) {
  int lv = 0;
  for (const char *s = e; *s;) {
    if (idc(*s) && (s == e || !idc(s[-1]))) {
      const char *t = s;
      while (idc(*t))
        t++;
      int hit = r->vh.cap ? *hash_find(&r->vh, s, (size_t)(t - s), r->vlev, sizeof(char *)) : 0;
      if (hit && r->vlevel[hit - 1] > lv) /* the latest variable of that name */
        lv = r->vlevel[hit - 1];
      s = t;
    } else {
      s++;
    }
  }
  return lv;
}

static const char *memo_get(R *r, const char *key) {
  int e = r->mh.cap ? *hash_find(&r->mh, key, strlen(key), &r->memo[0].key, sizeof(Memo)) : 0;
  return e ? r->memo[e - 1].var : NULL;
}

static void memo_put(R *r, const char *key, const char *var, int level) {
  if (r->nmemo == r->cap) {
    r->cap = r->cap ? 2 * r->cap : 256;
    Memo *m = arena_alloc(r->a, sizeof(Memo) * (size_t)r->cap);
    if (r->nmemo)
      memcpy(m, r->memo, sizeof(Memo) * (size_t)r->nmemo);
    r->memo = m;
  }
  r->memo[r->nmemo++] = (Memo){key, var, level};
  if (2 * r->nmemo + 2 > r->mh.cap)
    hash_build(r->a, &r->mh, r->nmemo, &r->memo[0].key, sizeof(Memo));
  else
    *hash_find(&r->mh, key, strlen(key), &r->memo[0].key, sizeof(Memo)) = r->nmemo;
}

/* A local holding expression e (of C type t), at the innermost level e needs;
 * the same expression at a visible level is reused. */
static const char *bind_as(R *r, const char *t, const char *e, const char *prefix) {
  int plain = 1; /* an identifier or a number needs no local */
  for (const char *c = e; *c && plain; c++)
    plain = idc(*c) || *c == '.';
  if (plain)
    return e;
  const char *key = arena_printf(r->a, "%s|%s", t, e);
  const char *v = memo_get(r, key);
  if (v)
    return v;
  int lv = expr_level(r, e);
  if (lv < 1 && r->level >= 1)
    lv = 1; /* values are per element; dims-only ones too (cheap) */
  v = arena_printf(r->a, "%s%d", prefix, r->nvars++);
  emit(r, lv, "const %s %s = %s;", t, v, e);
  memo_put(r, key, v, lv);
  set_var_level(r, v, lv);
  return v;
}
static const char *bind(R *r, const char *t, const char *e) { return bind_as(r, t, e, strcmp(t, "int64_t") ? "v" : "ix"); }
/* An index (a position in a buffer or a dim). */
static const char *bind_ix(R *r, const char *e) { return bind_as(r, r->it, e, "ix"); }

/* ---------------------------------------------------------------- indices */


static const char *stride_c(R *r, const Shape *s, int k) {
  Dim st = dim_const(1);
  Loc none = {0, 0};
  for (int j = k + 1; j < s->rank; j++)
    st = dim_mul(st, s->d[j], none);
  return c_dim(r->g, &st);
}

static const char *ix_dim(R *r, Ix *ix, int k) {
  if (ix->d[k])
    return ix->d[k];
  if (dim_is_one(&ix->sh->d[k]))
    return ix->d[k] = "0";
  if (!ix->flat)
    die("render: an index with neither form");
  const char *st = stride_c(r, ix->sh, k);
  const char *e = strcmp(st, "1") ? arena_printf(r->a, "%s / (%s)", ix->flat, st) : ix->flat;
  int all_before_one = 1;
  for (int j = 0; j < k; j++)
    all_before_one &= dim_is_one(&ix->sh->d[j]);
  if (!all_before_one)
    e = arena_printf(r->a, "(%s) %% (%s)", e, c_dim(r->g, &ix->sh->d[k]));
  return ix->d[k] = bind_ix(r, e);
}

/* The position of element ix: sum of its dims' positions times strides st
 * (NULL: its shape's row-major strides; a placed value's, layout.c). */
static const char *ix_at(R *r, Ix *ix, const Dim *st) {
  Buf b;
  buf_init(&b, r->a);
  int any = 0;
  for (int k = 0; k < ix->sh->rank; k++) {
    if (dim_is_one(&ix->sh->d[k]))
      continue;
    const char *sk = st ? c_dim(r->g, &st[k]) : stride_c(r, ix->sh, k), *dk = ix_dim(r, ix, k);
    if (!strcmp(dk, "0"))
      continue;
    buf_printf(&b, "%s%s%s", any++ ? " + " : "", dk, strcmp(sk, "1") ? arena_printf(r->a, " * (%s)", sk) : "");
  }
  return any ? bind_ix(r, b.p) : "0";
}

static const char *ix_flat(R *r, Ix *ix) { return ix->flat ? ix->flat : (ix->flat = ix_at(r, ix, NULL)); }

/* The index as text, for the memo, without printing any local. */
static const char *ix_key(R *r, const Ix *ix) {
  if (ix->flat)
    return ix->flat;
  Buf b;
  buf_init(&b, r->a);
  buf_printf(&b, "d");
  for (int k = 0; k < ix->sh->rank; k++)
    buf_printf(&b, ":%s", ix->d[k] ? ix->d[k] : dim_is_one(&ix->sh->d[k]) ? "0" : "?");
  return b.p;
}

static Ix ix_make(const Shape *sh, const char *flat) {
  Ix ix = {sh, flat, {0}, NULL};
  return ix;
}

/* The index into an operand of shape `to` broadcast to `from`'s index ix. */
static Ix ix_bcast(R *r, Ix *ix, const Shape *to) {
  const Shape *from = ix->sh;
  if (shape_eq(from, to))
    return *ix;
  Ix o = ix_make(to, NULL);
  int off = from->rank - to->rank;
  int suffix = 1, known = 1; /* to = from's trailing dims, the leading ones broadcast; their positions known */
  for (int k = 0; k < to->rank; k++) {
    if (!dim_eq(&to->d[k], &from->d[k + off]))
      suffix = 0;
    known &= dim_is_one(&to->d[k]) || ix->d[k + off] != NULL;
  }
  if (suffix && ix->flat && !known) { /* (the positions known: no division by the suffix's size) */
    Dim n = dim_const(1);
    Loc none = {0, 0};
    for (int k = 0; k < to->rank; k++)
      n = dim_mul(n, to->d[k], none);
    o.flat = to->rank ? arena_printf(r->a, "%s %% (%s)", ix->flat, c_dim(r->g, &n)) : "0";
    if (to->rank)
      o.flat = bind_ix(r, o.flat);
    return o;
  }
  for (int k = 0; k < to->rank; k++)
    o.d[k] = dim_is_one(&to->d[k]) ? "0" : ix_dim(r, ix, k + off);
  return o;
}

/* The index into a view's operand. */
static Ix ix_view(R *r, const Node *n, Ix *ix) {
  const Node *x = n->in[0];
  Ix o = ix_make(&x->shape, NULL);
  switch (n->op) {
  case OP_RESHAPE: case OP_SQUEEZE: case OP_UNSQUEEZE: {
    o.flat = ix_flat(r, ix);
    if (r->full.sh && r->full.flat && !strcmp(o.flat, r->full.flat) && shape_eq(&x->shape, r->full.sh))
      return r->full; /* back to the kernel's own index (its output element o reads its reductions) */
    Ix *s = arena_alloc(r->a, sizeof(Ix));
    *s = *ix;
    o.src = s;
    return o;
  }
  case OP_BROADCAST_TO:
    return ix_bcast(r, ix, &x->shape);
  case OP_TRANSPOSE: case OP_PERMUTE:
    for (int k = 0; k < x->shape.rank; k++) {
      int src = n->op == OP_PERMUTE ? n->perm[k] : k == n->axis ? n->axis2 : k == n->axis2 ? n->axis : k;
      o.d[src] = ix_dim(r, ix, k);
    }
    return o;
  case OP_SLICE:
    for (int k = 0; k < x->shape.rank; k++)
      o.d[k] = ix_dim(r, ix, k);
    if (n->lo.n)
      o.d[n->axis] = bind_ix(r, arena_printf(r->a, "%s + (%s)", o.d[n->axis], c_dim(r->g, &n->lo)));
    return o;
  default:
    die("render: %s is not a view", op_info[n->op].name);
  }
}

/* ---------------------------------------------------------------- values */

static const char *ctype(DType t) {
  return t == DT_F32 ? "float" : t == DT_I32 ? "int32_t" : t == DT_BOOL ? "uint8_t" : "uint16_t";
}
static const char *vtype(DType t) { return dtype_is_float(t) ? "float" : t == DT_I32 ? "int64_t" : "int"; }

static int param_of(R *r, int bi) {
  for (int i = 0; i < r->params.n; i++)
    if ((intptr_t)r->params.p[i] == bi + 1)
      return i;
  vec_push(r->a, &r->params, (void *)(intptr_t)(bi + 1));
  return r->params.n - 1;
}

static const char *bufname(R *r, const Node *n) {
  if (!r->p->buf) /* render_check, before plan: names do not matter */
    return arena_printf(r->a, "b%d", n->id);
  int bi = r->p->buf[n->id];
  if (bi < 0)
    die("render: node %d (%s) has no buffer", n->id, op_info[n->op].name);
  param_of(r, bi);
  return r->p->b[bi].name;
}

/* The vector type of r->vec elements of dtype t (tgm_math.h's NAME_vec). */
static const char *vec_type(R *r, DType t) {
  return arena_printf(r->a, "%s_vec<%s, %d>", r->name, ctype(t), r->vec ? r->vec : r->rvec ? r->rvec : r->cvec);
}

/* Where vector r->vidx of buffer p starts: p itself, or the row at o. */
static const char *vec_base(R *r, const char *p) {
  return r->rvec ? arena_printf(r->a, "(%s + o * n_r)", p) : p;
}

/* Are n's bytes a value this kernel stores (n itself, or a stored reshape
 * of one)? A load of them would run before the store that writes them, or
 * on another iteration (another thread) than it: the schedule must not
 * fuse so (render_check fails). */
static int is_own(const R *r, const Node *n) { return r->t->own_st[n->id] == r->stamp; }

static const char *acc_of(const R *r, const Node *n) { return r->t->acc_st[n->id] == r->stamp ? r->t->acc[n->id] : NULL; }

static void set_acc(R *r, const Node *n, const char *v) {
  r->t->acc[n->id] = v;
  r->t->acc_st[n->id] = r->stamp;
}

static int own_bytes(R *r, const Node *n) { return is_own(r, n) || is_own(r, layout_base(r->p, n)); }

/* A row kernel that reads its rows in several phases (layer_norm: the mean,
 * the variance, the normalised values) keeps each thread's vectors of a
 * buffer's row in a register array (r->rcache vectors; at most RCACHE_REGS
 * registers for all its arrays, the later buffers load in every phase):
 * the array is filled before the loop of the first phase that reads the
 * buffer, all its loads in one loop that nothing else is in (each one
 * predicated, so they go out together: in the phase's loop each sat behind
 * the exit test of the vector before it), and read in the phases, so the
 * row comes from memory once. */
enum { RCACHE_REGS = 64, RCACHE_MAX = 8 };
/* M_BLOCK's threads a row (not split), and M_WARP's a block (4 rows): a layer-norm backward over rows of 768
 * took 73 us with 128 threads a block against 83 with 256 (H100, GPT-2). A row of more than RCACHE_MAX vectors
 * a thread at ROW_BLOCK gets ROW_BLOCK_LONG threads instead, and its rows stay in memory: GPT-2's cross entropy
 * over 50304 bf16 logits (16384 rows) took 1.68 ms with 256 threads a row, 1.65 with 512 and 1.45 with 1024
 * (the H100, session 22: with fewer rows in flight the second read of a row comes from L2; 3.30 GB read
 * from DRAM at 256 for 1.65 GB of logits). Kept in registers at 1024 (7 vectors a thread) it took 1.82 ms:
 * 64 registers a thread leave one block on an SM, so no other row's loads run while a row computes. */
enum { ROW_BLOCK = 256, ROW_BLOCK_LONG = 1024, WARP_BLOCK = 128 };
/* A long row (as above) that the kernel reads in two passes or more, of at most SROW_MAX bytes, is copied into
 * shared memory once (tgm_cp16: cp.async) and its passes read it there, SROW_BLOCK threads a row, so that two
 * blocks share an SM and one's copy runs while the other computes; its max and its sum of exponentials are
 * then two passes over shared memory rather than one online pass (fewer instructions an element). GPT-2's
 * cross entropy over 16384 x 50304 bf16 logits (the H100, session 23, the kernel standalone): 1.445 ms at
 * ROW_BLOCK_LONG from memory, 1.100 ms this way (3.0 TB/s for the logits read once and d_logits written);
 * 1.106 at 256 threads, 1.187 with the grid capped at 528 blocks. */
enum { SROW_MAX = 112 << 10, SROW_BLOCK = 512 };
/* Riders on CUDA (a row kernel's column sums, loop_body): each thread adds
 * its row positions' elements into its own column of the block's shared
 * sums ([rider][a thread's position s][thread]: no bank conflicts, and no
 * registers: with them in registers, and the first finish, GPT-2's step
 * took 35.5 ms against 34.7, in shared memory 34.7); after its rows each block adds
 * its lane groups' sums in order into a row of partials, and the finish
 * kernel (rider_finish) adds the rows, RIDE_SPLIT blocks a tile of
 * columns. The blocks: whole rounds of RIDE_SMS multiprocessors (H100 and
 * H200: 132), 4 blocks an SM (GPT-2's layer-norm backwards: WARP_BLOCK
 * threads of 126 registers, 4 blocks resident), or for one-row blocks of
 * more than 288 threads, 1152 threads' worth (its gelu gradient: 384
 * threads, 3 an SM); fewer where the partials' room is short. H200, session
 * 29, GPT-2: 528 and 396 blocks against 439 and 325 (the old cap of 512 and
 * 1M partials) took the layer-norm backwards 52.8 -> 48.5 us and the gelu
 * gradient 120.5 -> 107.1 (ncu), the step 29.71-29.79 -> 29.38-29.48 ms (four
 * rounds in turn); two rounds of blocks (1056, 792) 51.7 and 108.6 us with a
 * slower finish. (H100, before: 264, 512, 660, 1024 and 2048 blocks took
 * 35.1, 34.7, 35.1, 35.5 and 36.7 ms a step; session 23's 528 and 396 gave
 * the older kernels 56.3 -> 53.3 us and 144.5 -> 139.9.) The count is a
 * constant of the printed code, so the sums' order, and their bits, do not
 * depend on the GPU. */
enum { RIDE_SMS = 132, RIDE_SPLIT = 16 };

static const char *row_cache(R *r, const Node *n, const char *p) {
  const char *key = arena_printf(r->a, "rcache|%s", p), *v = memo_get(r, key);
  if (v || r->rcache_regs + 4 * r->rcache > RCACHE_REGS)
    return v;
  v = arena_printf(r->a, "v%d", r->nvars++);
  const char *vt = vec_type(r, n->dtype);
  emit(r, 1, "%s %s[%d];  /* this thread's vectors of %s's row o */", vt, v, r->rcache, p);
  emit(r, 1, "#pragma unroll");
  emit(r, 1, "for (int rj = 0; rj < %d; rj++) {", r->rcache);
  emit(r, 1, "  const %s rv = %s + rj * %s;", r->it, r->rc_start, r->rc_step);
  emit(r, 1, "  if (rv < nrv)");
  emit(r, 1, "    %s[rj] = ((const %s *)%s)[rv];", v, vt, vec_base(r, p));
  emit(r, 1, "}");
  memo_put(r, key, v, 1);
  set_var_level(r, v, 1);
  r->rcache_regs += 4 * r->rcache;
  return v;
}

/* Buffer n's row o in shared memory (srow): each thread copies the vectors
 * it reads in the passes (the same start and step), before the first pass
 * that reads it; NULL when it would not fit, or its vectors are not 16
 * bytes (it is then read from memory in every pass). */
static const char *srow_cache(R *r, const Node *n, const char *p) {
  const char *key = arena_printf(r->a, "srow|%s", p), *v = memo_get(r, key);
  int64_t nr = 0;
  if (v || !dim_is_const(&r->k->rnum, &nr) || dtype_size(n->dtype) * r->rvec != 16)
    return v;
  int64_t bytes = (nr * dtype_size(n->dtype) + 15) / 16 * 16;
  if (r->srow_used + bytes > r->srow)
    return NULL;
  if (!r->srow_used)
    emit(r, 0, "extern __shared__ uint4 %s_srow[];  /* the rows kept in shared memory */", r->name);
  v = arena_printf(r->a, "s%d", r->nvars++);
  const char *vt = vec_type(r, n->dtype);
  emit(r, 1, "%s *%s = (%s *)(%s_srow + %lld);  /* %s's row o in shared memory */", vt, v, vt, r->name,
       (long long)(r->srow_used / 16), p);
  emit(r, 1, "for (%s rv = threadIdx.x; rv < nrv; rv += blockDim.x)  /* (the vectors this thread reads) */", r->it);
  emit(r, 1, "  %s_cp16(%s + rv, (const %s *)%s + rv);", r->name, v, vt, vec_base(r, p));
  emit(r, 1, "%s_cp_wait();", r->name);
  memo_put(r, key, v, 1);
  set_var_level(r, v, 1);
  r->srow_used += (int)bytes;
  return v;
}

/* One read of an in-place input's bytes or one store of the in-place
 * output (ip_safe checks them). */
typedef struct IpAt {
  int loop, ph, seq; /* seq: the order printed (within a level) */
  int vec;           /* a vector lane's element: the vector is loaded before the lanes, stored after them */
  const char *ix;
} IpAt;

static void ip_note(R *r, Vec *v, const char *i) {
  IpAt *a = arena_alloc(r->a, sizeof(IpAt));
  a->loop = r->ip_loop, a->ph = r->ip_ph, a->ix = i, a->seq = r->ip_seq++;
  a->vec = r->lanes && r->vflat && !strcmp(i, r->vflat);
  vec_push(r->a, v, a);
}

/* Per buffer the kernel touches: BF_WRITTEN it stores it; BF_CONTIG it is
 * loaded at the kernel's element i (a vector load's candidate); BF_BCAST a
 * row kernel loads it at the row position r alone (a layer norm's weight). */
enum { BF_WRITTEN = 1, BF_CONTIG = 2, BF_BCAST = 4, BF_ROWV = 8 };
/* (BF_ROWV: a CUDA row kernel loads it through a view whose row at o lies
 * contiguous and aligned, at a base of o alone plus r: row_view_base) */

static int bf_slot(const R *r, int bi) {
  for (unsigned i = ((unsigned)bi * 2654435761u) & (unsigned)(r->bcap - 1);; i = (i + 1) & (unsigned)(r->bcap - 1))
    if (r->bkey[i] == bi + 1 || !r->bkey[i])
      return (int)i;
}

static int bf(const R *r, int bi) {
  if (!r->bcap)
    return 0;
  int s = bf_slot(r, bi);
  return r->bkey[s] ? r->bflag[s] : 0;
}

static void bf_set(R *r, int bi, int f) {
  if (2 * (r->bn + 1) > r->bcap) { /* half full at most */
    int oc = r->bcap, *ok = r->bkey;
    unsigned char *of = r->bflag;
    r->bcap = oc ? 2 * oc : 32;
    r->bkey = arena_alloc(r->a, sizeof(int) * (size_t)r->bcap);
    r->bflag = arena_alloc(r->a, (size_t)r->bcap);
    for (int i = 0; i < oc; i++)
      if (ok[i]) {
        int s = bf_slot(r, ok[i] - 1);
        r->bkey[s] = ok[i], r->bflag[s] = of[i];
      }
  }
  int s = bf_slot(r, bi);
  if (!r->bkey[s])
    r->bkey[s] = bi + 1, r->bn++;
  r->bflag[s] |= (unsigned char)f;
}

static int by_int(const void *x, const void *y) {
  int a = *(const int *)x, b = *(const int *)y;
  return (a > b) - (a < b);
}

/* The buffers with any flag, in ascending order (that of their names in
 * the checks printed); *n of them. */
static int *bf_list(const R *r, int *n) {
  int *l = arena_alloc(r->a, sizeof(int) * (size_t)(r->bn + 1));
  *n = 0;
  for (int i = 0; i < r->bcap; i++)
    if (r->bkey[i])
      l[(*n)++] = r->bkey[i] - 1;
  qsort(l, (size_t)*n, sizeof(int), by_int);
  return l;
}

/* Whether buffer bi, read at the row position alone, is loaded a vector at
 * a time beside the row's vectors (one vector of the row's width, 16
 * bytes): the loads and the kernel's alignment check both ask. */
static int bcast_vec(const R *r, int bi) {
  return (bf(r, bi) & BF_BCAST) && r->rvec && dtype_size(r->p->b[bi].node->dtype) * r->rvec == 16;
}

/* Where the row of o begins, when a row kernel reads n at (positions of
 * o, r) with a stride of 1 along r: through n's placed layout pl, or, n
 * row-major, at the flat position of a reshape's (ix->src) dims; and every
 * row begins a multiple of 16 bytes past the buffer's pointer (the other
 * strides whole 16 bytes; the pointer itself is in the kernel's alignment
 * check). A row kernel over heads' views (attention's delta reads
 * [B, H, T, D] through [B, T, H, D]) then loads its rows a vector at a
 * time as it does contiguous ones. NULL: not so. */
static const char *row_view_base(R *r, const Node *n, Ix *ix, const Layout *pl) {
  const int es = dtype_size(n->dtype);
  if (strcmp(r->d->name, "cuda") || !kernel_rows(r->k) || (r->mode != M_WARP && r->mode != M_BLOCK))
    return NULL;
  Ix at;
  int64_t st[MAXRANK], v;
  if (pl) { /* n's own layout */
    at = *ix;
    for (int k = 0; k < n->shape.rank; k++)
      if (!dim_is_const(&pl->st[k], &st[k]))
        st[k] = dim_is_one(&n->shape.d[k]) ? 0 : -1;
  } else if (ix->src && ix->flat) { /* n row-major, its position a reshape's flat one: that reshape's dims */
    at = *ix->src;
    for (int k = at.sh->rank - 1, m = 1; k >= 0; k--) {
      st[k] = m;
      if (m > 0 && dim_is_const(&at.sh->d[k], &v))
        m = (int)(m * v > (1 << 30) ? -1 : m * v);
      else
        m = -1;
    }
  } else {
    return NULL;
  }
  const int rk = at.sh->rank;
  if (rk < 2 || st[rk - 1] != 1 || strcmp(ix_dim(r, &at, rk - 1), "r"))
    return NULL;
  for (int k = 0; k < rk - 1; k++)
    if (!dim_is_one(&at.sh->d[k]) && (st[k] < 0 || (st[k] * es) % 16))
      return NULL;
  for (int k = 0; k < rk - 1; k++)
    ix_dim(r, &at, k);
  at.flat = NULL, at.src = NULL;
  at.d[rk - 1] = "0";
  return ix_at(r, &at, pl ? pl->st : NULL);
}

/* The lane's element of one vector of n's dtype loaded from base at vector
 * index idx, the load printed once (memo key) at the vector loop's level. */
static const char *vec_lane(R *r, const Node *n, const char *key, const char *base, const char *idx) {
  const char *v = memo_get(r, key);
  if (!v) {
    v = arena_printf(r->a, "v%d", r->nvars++);
    const char *vt = vec_type(r, n->dtype);
    emit(r, r->vload_lv, "const %s %s = ((const %s *)%s)[%s];", vt, v, vt, base, idx);
    memo_put(r, key, v, r->vload_lv);
    set_var_level(r, v, r->vload_lv);
  }
  return arena_printf(r->a, "%s.v[lane]", v);
}

static const char *load(R *r, const Node *n, Ix *ix) {
  if (own_bytes(r, n))
    r->fail = 2;
  const Layout *pl = r->p->place ? r->p->place[n->id] : NULL;
  const char *p = bufname(r, n), *i = pl ? ix_at(r, ix, pl->st) : ix_flat(r, ix);
  if (r->ip_in >= 0) {
    int bi = r->p->buf[n->id];
    if (bi == r->ip_in)
      ip_note(r, &r->ip_ld, i);
    while (bi >= 0 && r->p->b[bi].home == HOME_ALIAS) /* a view of its bytes under another name: not checked */
      if ((bi = r->p->b[bi].index) == r->ip_in)
        r->ip_bad = 1;
  }
  const char *at = arena_printf(r->a, "%s[%s]", p, i), *rb;
  if (r->p->buf && r->vflat && !strcmp(i, r->vflat)) {
    int bi = r->p->buf[n->id];
    bf_set(r, bi, BF_CONTIG);
    const char *rc = r->lanes && r->rcache ? row_cache(r, n, p) : NULL, *sr;
    if (rc)
      at = arena_printf(r->a, "%s[rj].v[lane]", rc);
    else if (r->lanes && r->srow && (sr = srow_cache(r, n, p)))
      at = vec_lane(r, n, arena_printf(r->a, "svec|%s", p), sr, r->vidx);
    else if (r->lanes) /* the lane of one vector load per buffer and vector */
      at = vec_lane(r, n, arena_printf(r->a, "vec|%s", p), vec_base(r, p), r->vidx);
  } else if (r->p->buf && r->p->buf[n->id] != r->ip_in && (rb = row_view_base(r, n, ix, pl))) {
    bf_set(r, r->p->buf[n->id], BF_ROWV);
    if (r->lanes) /* the lane of one vector load per buffer, row base and vector */
      at = vec_lane(r, n, arena_printf(r->a, "rowv|%s|%s", p, rb), arena_printf(r->a, "(%s + %s)", p, rb), r->vidx);
  } else if (r->p->buf && kernel_rows(r->k) && !strcmp(i, "r") && r->p->buf[n->id] != r->ip_in) {
    int bi = r->p->buf[n->id]; /* the same elements for every row: one vector load a vector of the row */
    bf_set(r, bi, BF_BCAST);
    if (r->lanes && bcast_vec(r, bi))
      at = vec_lane(r, n, arena_printf(r->a, "bvec|%s", p), p, "rv");
  }
  const char *e;
  switch (n->dtype) {
  case DT_BF16: e = arena_printf(r->a, "%s_load_bf16(%s)", r->name, at); break;
  case DT_F16: e = arena_printf(r->a, "%s_load_f16(%s)", r->name, at); break;
  default: e = at; break;
  }
  return bind(r, vtype(n->dtype), e);
}

static const char *conv(R *r, const char *v, DType from, DType to) {
  if (dtype_is_float(from) == dtype_is_float(to) && (from == DT_BOOL) == (to == DT_BOOL))
    return v;
  if (to == DT_BOOL)
    return arena_printf(r->a, "(%s != 0)", v);
  if (dtype_is_float(to))
    return arena_printf(r->a, "(float)%s", v);
  return arena_printf(r->a, "%s_to_i32(%s)", r->name, v); /* float -> i32 */
}

/* ops.def's expression with the operands and attributes filled in. */
static const char *expr_text(R *r, const Node *n, const char **ops) {
  const char *x = op_info[n->op].expr;
  Buf b;
  buf_init(&b, r->a);
  double p0 = n->op == OP_CLAMP && !n->has_f[0] ? -INFINITY : n->f[0];
  double p1 = n->op == OP_CLAMP && !n->has_f[1] ? INFINITY : n->f[1];
  for (const char *s = x; *s;) {
    if (idc(*s) && (s == x || !idc(s[-1]))) {
      const char *t = s;
      while (idc(*t))
        t++;
      size_t len = (size_t)(t - s);
      if (isdigit((unsigned char)*s)) { /* a decimal literal: an f32 constant */
        while (*t == '.' || isdigit((unsigned char)*t))
          t++;
        buf_putn(&b, s, (size_t)(t - s));
        if (memchr(s, '.', (size_t)(t - s)))
          buf_printf(&b, "f");
      } else if (len == 1 && *s >= 'a' && *s <= 'c') {
        buf_printf(&b, "%s", ops[*s - 'a']);
      } else if (len == 2 && !strncmp(s, "P0", 2)) {
        buf_printf(&b, "%s", flit(r->a, p0));
      } else if (len == 2 && !strncmp(s, "P1", 2)) {
        buf_printf(&b, "%s", flit(r->a, p1));
      } else if (len == 4 && !strncmp(s, "FLAG", 4)) {
        buf_printf(&b, "%d", n->flag);
      } else if (len > 2 && !strncmp(s, "f_", 2)) {
        buf_printf(&b, "%s_%.*s", r->name, (int)len - 2, s + 2);
      } else {
        buf_putn(&b, s, len);
      }
      s = t;
    } else {
      buf_putn(&b, s, 1);
      s++;
    }
  }
  return b.p;
}

static const char *val(R *r, const Node *n, Ix *ix);

/* A bf16/f16 value is rounded to its dtype where it is computed, as if it
 * were stored: every reader sees the same value (a mask x == amax(x) must
 * hold in the kernel that computes x and in one that loads it). */
static const char *half_round(R *r, DType t, const char *e) {
  if (t != DT_BF16 && t != DT_F16)
    return e;
  return arena_printf(r->a, "%s_round_%s(%s)", r->name, t == DT_BF16 ? "bf16" : "f16", e);
}

/* The result of a reduction this kernel computes, read at ix: only at the
 * kernel's own output element. */
static const char *red_val(R *r, const Node *n, Ix *ix) {
  Ix o = ix_make(r->outer_sh, "o");
  int j = 0;
  for (int k = 0; k < n->shape.rank; k++) {
    if (dim_is_one(&n->shape.d[k]))
      continue;
    while (j < o.sh->rank && dim_is_one(&o.sh->d[j]))
      j++;
    if (j >= o.sh->rank || strcmp(ix_dim(r, ix, k), ix_dim(r, &o, j)))
      r->fail = 1;
    j++;
  }
  while (j < o.sh->rank && dim_is_one(&o.sh->d[j]))
    j++;
  if (j != o.sh->rank || !acc_of(r, n))
    r->fail = 1;
  return acc_of(r, n) ? acc_of(r, n) : "0";
}

static const char *val(R *r, const Node *n, Ix *ix) {
  BPass *p = r->p;
  int leaf = n->op == OP_INPUT || n->op == OP_PARAM;
  if (leaf || (p->realized[n->id] && !is_own(r, n)))
    return load(r, n, ix);
  if (op_info[n->op].cls == C_REDUCE)
    return red_val(r, n, ix);
  const char *key = arena_printf(r->a, "%d@%s", n->id, ix_key(r, ix));
  const char *m = memo_get(r, key);
  if (m)
    return m;
  const char *v;
  switch (op_info[n->op].cls) {
  case C_VIEW: {
    if (n->op == OP_CONCAT) { /* stored operands; only the chosen one is read */
      Buf b;
      buf_init(&b, r->a);
      const char *pos = ix_dim(r, ix, n->axis);
      Dim at = dim_const(0);
      Loc none = {0, 0};
      for (int k = 0; k < n->nin; k++) {
        const Node *x = n->in[k];
        if (own_bytes(r, x))
          r->fail = 2;
        Ix xi = ix_make(&x->shape, NULL);
        for (int j = 0; j < x->shape.rank; j++)
          xi.d[j] = j == n->axis ? bind_ix(r, arena_printf(r->a, "%s - (%s)", pos, c_dim(r->g, &at))) : ix_dim(r, ix, j);
        at = dim_add(at, x->shape.d[n->axis], none);
        const char *pn = bufname(r, x), *fi = ix_flat(r, &xi);
        const char *ld = x->dtype == DT_BF16 ? arena_printf(r->a, "%s_load_bf16(%s[%s])", r->name, pn, fi)
                         : x->dtype == DT_F16 ? arena_printf(r->a, "%s_load_f16(%s[%s])", r->name, pn, fi)
                                              : arena_printf(r->a, "%s[%s]", pn, fi);
        if (k + 1 < n->nin)
          buf_printf(&b, "%s < %s ? %s : ", pos, c_dim(r->g, &at), ld);
        else
          buf_printf(&b, "%s", ld);
      }
      v = bind(r, vtype(n->dtype), b.p);
      break;
    }
    Ix o = ix_view(r, n, ix);
    v = val(r, n->in[0], &o);
    break;
  }
  case C_TAKE: {
    r->saw_take = 1;
    Ix ti = ix_bcast(r, ix, &n->in[1]->shape);
    const char *t = val(r, n->in[1], &ti);
    const Shape *xs = &n->in[0]->shape;
    const char *size = c_dim(r->g, &xs->d[n->axis]);
    const char *ok = bind(r, "int", arena_printf(r->a, "%s >= 0 && %s < %s", t, t, size));
    const char *ign = arena_printf(r->a, "%s == %lld", t, (long long)n->ignore_index);
    const char *pos = ix_flat(r, ix);
    int lv = expr_level(r, ok) > expr_level(r, pos) ? expr_level(r, ok) : expr_level(r, pos);
    if (lv < 1)
      lv = 1;
    emit(r, lv, "if (!%s && !(%s))", ok, ign); /* the check and its statement at one level */
    r->d->bad(r, lv, pos);
    const char *tc = bind_ix(r, arena_printf(r->a, "%s ? %s : 0", ok, t));
    Ix xi = ix_make(xs, NULL);
    for (int k = 0, j = 0; k < xs->rank; k++)
      xi.d[k] = k == n->axis ? tc : ix_dim(r, ix, j++);
    v = val(r, n->in[0], &xi);
    break;
  }
  case C_PW: {
    const char *ops[3] = {"0", "0", "0"};
    if (n->op == OP_CONST) {
      v = n->is_dimval ? arena_printf(r->a, "((%s)(%s))", vtype(n->dtype), c_dim(r->g, &n->lo))
                       : dtype_is_float(n->dtype) ? flit(r->a, n->f[0]) : arena_printf(r->a, "%lld", (long long)n->f[0]);
      break;
    }
    if (n->op == OP_FULL || n->op == OP_ZEROS || n->op == OP_ONES) {
      v = dtype_is_float(n->dtype) ? flit(r->a, n->f[0]) : arena_printf(r->a, "%lld", (long long)n->f[0]);
      break;
    }
    if (n->op == OP_ARANGE) {
      v = ix_dim(r, ix, 0);
      break;
    }
    for (int k = 0; k < n->nin; k++) {
      Ix oi = ix_bcast(r, ix, &n->in[k]->shape);
      ops[k] = val(r, n->in[k], &oi);
    }
    if (n->op == OP_CAST) {
      const char *c = conv(r, ops[0], n->in[0]->dtype, n->dtype);
      if ((n->dtype == DT_BF16 || n->dtype == DT_F16) && n->in[0]->dtype != DT_BOOL) /* the cast rounds (0 and 1 are exact) */
        c = arena_printf(r->a, "%s_round_%s(%s)", r->name, n->dtype == DT_BF16 ? "bf16" : "f16", c);
      v = bind(r, vtype(n->dtype), c);
      break;
    }
    if (n->op == OP_WHERE) {
      ops[1] = conv(r, ops[1], n->in[1]->dtype, n->dtype);
      ops[2] = conv(r, ops[2], n->in[2]->dtype, n->dtype);
    }
    v = bind(r, vtype(n->dtype), half_round(r, n->dtype, expr_text(r, n, ops)));
    break;
  }
  default:
    die("render: %s read but neither stored nor computable here", op_info[n->op].name);
  }
  memo_put(r, key, v, expr_level(r, v));
  return v;
}

/* Store node n's value at ix into its buffer. */
static void store(R *r, const Node *n, Ix *ix, int guard) {
  const char *v = val(r, n, ix);
  const char *pn = bufname(r, n), *i = ix_flat(r, ix);
  int at_vec = r->vflat && !strcmp(i, r->vflat); /* a vector lane's element */
  if (r->ip_out >= 0 && r->p->buf[n->id] == r->ip_out) {
    ip_note(r, &r->ip_st, i);
    if (guard && *r->d->one_lane(r)) /* one lane stores what all computed: another may read after */
      r->ip_bad = 1;
  }
  if (r->p->buf) {
    bf_set(r, r->p->buf[n->id], BF_WRITTEN | (at_vec ? BF_CONTIG : 0));
  }
  const char *e;
  switch (n->dtype) {
  case DT_BF16: e = arena_printf(r->a, "%s_store_bf16(%s)", r->name, v); break;
  case DT_F16: e = arena_printf(r->a, "%s_store_f16(%s)", r->name, v); break;
  default: e = arena_printf(r->a, "(%s)%s", ctype(n->dtype), v); break;
  }
  if (r->lanes && at_vec) { /* into the lane of the vector the loop stores after the lanes */
    const char *key = arena_printf(r->a, "vst|%s", pn), *vv = memo_get(r, key);
    if (!vv) {
      vv = arena_printf(r->a, "v%d", r->nvars++);
      emit(r, r->vload_lv, "%s %s;", vec_type(r, n->dtype), vv);
      memo_put(r, key, vv, r->vload_lv);
      vec_push(r->a, &r->vstores,
               (void *)arena_printf(r->a, "((%s *)%s)[%s] = %s;", vec_type(r, n->dtype), vec_base(r, pn), r->vidx, vv));
    }
    emit(r, r->level, "%s.v[lane] = %s;", vv, e);
  } else if (guard && *r->d->one_lane(r))
    emit(r, r->level, "if (%s) %s[%s] = %s;", r->d->one_lane(r), pn, i, e);
  else
    emit(r, r->level, "%s[%s] = %s;", pn, i, e);
}

/* ---------------------------------------------------------------- CPU */

static void cpu_pw_loop(R *r) {
  if (r->leaf) {
    emit(r, 0, "%s_OMP(simd%s)", r->NAME, r->has_bad ? " reduction(min : bad)" : "");
    head(r, "for (int64_t i = lo; i < hi; i++) {");
    return;
  }
  emit(r, 0, "%s_OMP(parallel for simd if (n > 16384) schedule(static)%s)", r->NAME, r->has_bad ? " reduction(min : bad)" : "");
  head(r, "for (int64_t i = 0; i < n; i++) {");
}
static void cpu_o_loop(R *r) {
  if (r->leaf) {
    head(r, "for (int64_t o = lo; o < hi; o++) {");
    return;
  }
  if (!r->csplit) /* a split kernel's threads share each output's reduced elements instead */
    emit(r, 0, "%s_OMP(parallel for if (n_o * n_r > 16384) schedule(static)%s)", r->NAME, r->has_bad ? " reduction(min : bad)" : "");
  head(r, "for (int64_t o = 0; o < n_o; o++) {");
}
static void cpu_r_loop(R *r) {
  if (r->csplit)
    head(r, "  for (int64_t r = c * n_r / %d; r < (c + 1) * n_r / %d; r++) {", CHUNKS, CHUNKS);
  else
    head(r, "for (int64_t r = 0; r < n_r; r++) {");
}
static void cpu_combine(R *r, Op op, const char *acc) { (void)r, (void)op, (void)acc; }
static void cpu_bad(R *r, int level, const char *pos) { emit(r, level, "  bad = bad < %s ? bad : %s;", pos, pos); }
static void cpu_close(R *r) {
  if (r->has_bad && r->leaf) /* the kernel takes the least over the threads */
    emit(r, 0, "return bad;");
  else if (r->has_bad)
    emit(r, 0, "return bad == INT64_MAX ? -1 : bad;");
}

static const char *cpu_one_lane(R *r) { (void)r; return ""; }

static const Dialect dl_cpu = {"cpu", "static", "restrict", "double", cpu_pw_loop, cpu_o_loop, cpu_r_loop, cpu_combine,
                               cpu_one_lane, cpu_bad, cpu_close};

/* ---------------------------------------------------------------- CUDA */

static void cuda_pw_loop(R *r) {
  const char *t = r->it;
  if (r->vec) /* the elements past the vectors (all where a buffer is not aligned) */
    head(r, "for (%s i = nv * %d + blockIdx.x * (%s)blockDim.x + threadIdx.x; i < n; i += (%s)gridDim.x * blockDim.x) {", t,
         r->vec, t, t);
  else
    head(r, "for (%s i = blockIdx.x * (%s)blockDim.x + threadIdx.x; i < n; i += (%s)gridDim.x * blockDim.x) {", t, t, t);
}
static void cuda_o_loop(R *r) {
  const char *t = r->it;
  if (r->mode == M_WARP && r->grp < 32) /* 32 / grp rows a warp, a group of grp lanes each */
    head(r, "for (%s o = (blockIdx.x * (%s)(blockDim.x / 32) + threadIdx.x / 32) * %d + threadIdx.x %% 32 / %d; o < n_o; o += (%s)gridDim.x * (blockDim.x / 32) * %d) {",
         t, t, 32 / r->grp, r->grp, t, 32 / r->grp);
  else if (r->mode == M_WARP)
    head(r, "for (%s o = blockIdx.x * (%s)(blockDim.x / 32) + threadIdx.x / 32; o < n_o; o += (%s)gridDim.x * (blockDim.x / 32)) {", t, t, t);
  else if (r->mode == M_BLOCK)
    head(r, "for (%s o = blockIdx.x; o < n_o; o += gridDim.x) {", t);
  else if (r->mode == M_COLUMN) {
    head(r, "for (%s o0 = blockIdx.x * (%s)32; o0 < n_o; o0 += (%s)gridDim.x * 32) {", t, t, t);
    head(r, "  const int live = o0 + threadIdx.x %% 32 < n_o;  /* the tile's last columns may be past the end */");
    head(r, "  const %s o = live ? o0 + threadIdx.x %% 32 : n_o - 1;", t);
  } else
    head(r, "for (%s o = blockIdx.x * (%s)blockDim.x + threadIdx.x; o < n_o; o += (%s)gridDim.x * blockDim.x) {", t, t, t);
}
/* A thread's strided loop `for (v = start; v < end; v += step)` (`live`: a
 * condition for any iteration, or NULL), unrolled by `unroll`. A step known
 * only at run time (blockDim, gridDim) is printed as a counted loop
 * (NAME_steps, tgm_math.h says why). Closed by the caller's close_level. */
static void strided_loop(R *r, const char *v, const char *start, const char *end, const char *step, const char *live,
                         int unroll) {
  const char *t = r->it;
  if (unroll)
    head(r, "#pragma unroll %d", unroll);
  int lit = 1;
  for (const char *c = step; *c; c++)
    lit &= *c >= '0' && *c <= '9';
  if (lit && !live) {
    head(r, "for (%s %s = %s; %s < %s; %s += %s) {", t, v, start, v, end, v, step);
    return;
  }
  const char *from = live ? arena_printf(r->a, "%s ? %s : %s", live, start, end) : start;
  head(r, "for (%s %s_i = 0, %s_n = %s_steps<%s>(%s, %s, %s); %s_i < %s_n; %s_i++) {  /* counted: %s_steps */", t, v, v,
       r->name, t, from, end, step, v, v, v, r->name);
  emit(r, r->level, "const %s %s = %s + %s_i * %s;", t, v, start, v,
       strchr(step, ' ') ? arena_printf(r->a, "(%s)", step) : step);
}

static void cuda_r_loop(R *r) {
  const char *t = r->it;
  const int u = r->mode != M_SERIAL ? 4 : 0; /* several loads in flight per thread, not one load's latency per element */
  const char *past = r->rvec ? arena_printf(r->a, "nrv * %d + ", r->rvec) : ""; /* after the row's vectors */
  if (r->mode == M_WARP)
    strided_loop(r, "r", arena_printf(r->a, "%sthreadIdx.x %% %d", past, r->grp), "n_r",
                 arena_printf(r->a, "%d", r->grp), NULL, u);
  else if (r->mode == M_BLOCK && r->split)
    strided_loop(r, "r", arena_printf(r->a, "%sblockIdx.y * blockDim.x + threadIdx.x", past), "n_r",
                 "gridDim.y * blockDim.x", NULL, u);
  else if (r->mode == M_BLOCK)
    strided_loop(r, "r", arena_printf(r->a, "%sthreadIdx.x", past), "n_r", "blockDim.x", NULL, u);
  else if (r->mode == M_COLUMN && r->split)
    strided_loop(r, "r", "blockIdx.y * (blockDim.x / 32) + threadIdx.x / 32", "n_r", "gridDim.y * (blockDim.x / 32)",
                 "live", u);
  else if (r->mode == M_COLUMN)
    strided_loop(r, "r", "threadIdx.x / 32", "n_r", "blockDim.x / 32", "live", u);
  else
    head(r, "for (%s r = 0; r < n_r; r++) {", t);
}
static void cuda_combine(R *r, Op op, const char *acc) {
  const char *f = op == OP_AMAX ? "max" : "sum";
  if (r->mode == M_WARP && r->grp < 32)
    emit(r, r->level, "%s = %s_group_%s(%s, %d);", acc, r->name, f, acc, r->grp);
  else if (r->mode == M_WARP)
    emit(r, r->level, "%s = %s_warp_%s(%s);", acc, r->name, f, acc);
  else if (r->mode == M_BLOCK)
    emit(r, r->level, "%s = %s_block_%s(%s);", acc, r->name, f, acc);
  else if (r->mode == M_COLUMN)
    emit(r, r->level, "%s = %s_column_%s(%s);", acc, r->name, f, acc);
}
static void cuda_bad(R *r, int level, const char *pos) {
  emit(r, level, "  atomicMin(bad, (unsigned long long)(%s));", pos);
}
static void cuda_close(R *r) { (void)r; }
static const char *cuda_one_lane(R *r) {
  return r->mode == M_WARP    ? arena_printf(r->a, "threadIdx.x %% %d == 0", r->grp)
         : r->mode == M_BLOCK  ? "threadIdx.x == 0"
         : r->mode == M_COLUMN ? "threadIdx.x / 32 == 0 && live"
                               : "";
}

static const Dialect dl_cuda = {"cuda", "static __global__", "__restrict__", "float", cuda_pw_loop, cuda_o_loop,
                                cuda_r_loop, cuda_combine, cuda_one_lane, cuda_bad, cuda_close};

/* ---------------------------------------------------------------- loop kernels */

/* Drop the locals nothing reads ("const T name = ...;" lines whose name no
 * other line mentions, or, for a name defined on several lines, that
 * nothing reads in the definition's own scope), until none is left: the
 * walker binds some index forms it then does not use (an unused local is a
 * warning under -Wall, which the emitted projects compile with; e2e tests
 * fail on one). Linear in the text but for the scope scans of names
 * defined more than once (each stops at its first read): every
 * identifier's mentions are counted once, and dropping a line lowers the
 * counts of the names it mentions and revisits only the lines that define
 * them. */
static const char *prune(Arena *a, const char *text) {
  int n = 0, ntok = 0;
  for (const char *c = text; *c; c++) {
    n += *c == '\n';
    ntok += idc(*c) && (c == text || !idc(c[-1]));
  }
  const char **line = arena_alloc(a, sizeof(char *) * (size_t)(n + 1));
  int *len = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  int *t0 = arena_alloc(a, sizeof(int) * (size_t)(n + 1)); /* line i's tokens: tok[t0[i] .. t0[i + 1]) */
  int *tok = arena_alloc(a, sizeof(int) * (size_t)(ntok + 1));
  const char **names = arena_alloc(a, sizeof(char *) * (size_t)(ntok + 1));
  int *uses = arena_alloc(a, sizeof(int) * (size_t)(ntok + 1));
  int *first_def = arena_alloc(a, sizeof(int) * (size_t)(ntok + 1));
  int *def = arena_alloc(a, sizeof(int) * (size_t)(n + 1)), *self = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  int *next_def = arena_alloc(a, sizeof(int) * (size_t)(n + 1));
  int *work = arena_alloc(a, sizeof(int) * (size_t)(3 * n + 3)); /* a line goes in at most three times */
  char *dead = arena_alloc(a, (size_t)n + 1);
  Hash h = {NULL, 512}; /* room for every token (arena memory is zeroed) */
  while (h.cap < 2 * ntok + 2)
    h.cap *= 2;
  h.slot = arena_alloc(a, sizeof(int) * (size_t)h.cap);
  int nnames = 0, k = 0, nt = 0;
  for (const char *c = text; *c; k++) {
    const char *e = strchr(c, '\n');
    line[k] = c;
    len[k] = (int)(e - c) + 1;
    t0[k] = nt;
    for (const char *q = c; q < e;) {
      if (!idc(*q)) {
        q++;
        continue;
      }
      const char *w = q;
      while (idc(*q))
        q++;
      int *slot = hash_find(&h, w, (size_t)(q - w), names, sizeof(char *));
      if (!*slot) {
        names[nnames] = arena_strndup(a, w, (size_t)(q - w));
        first_def[nnames] = -1;
        *slot = ++nnames;
      }
      uses[*slot - 1]++;
      tok[nt++] = *slot - 1;
    }
    c = e + 1;
  }
  t0[k] = nt;
  /* the defining lines: "const TYPE NAME = ..." with no comma after NAME */
  int nwork = 0;
  for (int i = 0; i < k; i++) {
    def[i] = -1;
    const char *c = line[i];
    while (*c == ' ')
      c++;
    if (strncmp(c, "const ", 6) || t0[i + 1] - t0[i] < 3)
      continue;
    c += 6;
    while (idc(*c))
      c++;
    while (*c == ' ')
      c++;
    const char *nm = c;
    while (idc(*c))
      c++;
    if (c == nm || strncmp(c, " = ", 3) || memchr(nm, ',', (size_t)(line[i] + len[i] - nm)))
      continue;
    int id = tok[t0[i] + 2]; /* const, the type, the name */
    def[i] = id;
    for (int t = t0[i]; t < t0[i + 1]; t++)
      self[i] += tok[t] == id;
    next_def[i] = first_def[id];
    first_def[id] = i;
    work[nwork++] = i;
  }
  /* a name defined on several lines (the same local in two loops): a
   * definition that nothing reads in its own scope (the lines after it down
   * to the first closing brace indented less) is dead too, whatever the
   * other scopes read; the scan stops at the first read */
  char *unread = arena_alloc(a, (size_t)n + 1);
  for (int i = 0; i < k; i++) {
    if (def[i] < 0 || (first_def[def[i]] == i && next_def[i] < 0))
      continue;
    int ind = 0, read = 0;
    while (line[i][ind] == ' ')
      ind++;
    for (int j = i + 1; j < k && !read; j++) {
      int jind = 0;
      while (line[j][jind] == ' ')
        jind++;
      if (jind < ind && line[j][jind] == '}') /* the block's end (other lines less indented, pragmas, scan on) */
        break;
      for (int t = t0[j]; t < t0[j + 1] && !read; t++)
        read = tok[t] == def[i];
    }
    if (!read && !unread[i])
      unread[i] = 1, work[nwork++] = i;
  }
  while (nwork) {
    int i = work[--nwork];
    if (dead[i] || (uses[def[i]] > self[i] && !unread[i]))
      continue;
    dead[i] = 1;
    for (int t = t0[i]; t < t0[i + 1]; t++)
      if (--uses[tok[t]])
        for (int d = first_def[tok[t]]; d >= 0; d = next_def[d])
          if (!dead[d] && uses[tok[t]] == self[d])
            work[nwork++] = d;
  }
  Buf b;
  buf_init(&b, a);
  for (int i = 0; i < k; i++)
    if (!dead[i])
      buf_putn(&b, line[i], (size_t)len[i]);
  return b.p ? b.p : "";
}

/* The phase after which n's value is known in kernel r->k: 0 when it reads
 * no reduction the kernel computes, else the latest such reduction's. */
static int dep(R *r, const Node *n) {
  RTab *t = r->t;
  if (t->dep_st[n->id] == r->stamp)
    return t->dep[n->id];
  int leaf = n->op == OP_INPUT || n->op == OP_PARAM, d = 0;
  if (!leaf && !(r->p->realized[n->id] && !is_own(r, n))) {
    for (int k = 0; k < n->nin; k++)
      if (n->in[k]) {
        int x = dep(r, n->in[k]);
        d = x > d ? x : d;
      }
    if (op_info[n->op].cls == C_REDUCE)
      d++;
  }
  t->dep_st[n->id] = r->stamp;
  return t->dep[n->id] = d;
}

/* Does n's value read one of kernel r->k's riders (its column sums)? Such a
 * value is known only once every row is done: the riders' outs. */
static int cdep(R *r, const Node *n) {
  RTab *t = r->t;
  if (!r->k || !r->k->ncols)
    return 0;
  if (t->cdep_st[n->id] == r->stamp)
    return t->cdep[n->id];
  int c = 0;
  for (int i = 0; i < r->k->ncols && !c; i++)
    c = r->k->cols[i] == n;
  if (!c && !(n->op == OP_INPUT || n->op == OP_PARAM) && !(r->p->realized[n->id] && !is_own(r, n)))
    for (int k = 0; k < n->nin && !c; k++)
      c = n->in[k] && cdep(r, n->in[k]);
  t->cdep_st[n->id] = r->stamp;
  return t->cdep[n->id] = c;
}

static R *new_r(Arena *a, BPass *p, const Kernel *k, const Dialect *d) {
  R *r = arena_alloc(a, sizeof(R));
  r->p = p;
  r->g = p->g;
  r->a = a;
  r->d = d;
  r->k = k;
  r->name = p->g->spec->name;
  char *up = arena_strdup(a, r->name);
  for (char *c = up; *c; c++)
    *c = (char)toupper((unsigned char)*c);
  r->NAME = up;
  if (!p->rtab) { /* the pass's tables (in the graph's arena: they outlive this kernel) */
    Arena *ga = p->g->arena;
    RTab *t = arena_alloc(ga, sizeof(RTab));
    t->own_st = arena_alloc(ga, sizeof(int) * (size_t)(p->n + 1));
    t->acc_st = arena_alloc(ga, sizeof(int) * (size_t)(p->n + 1));
    t->dep_st = arena_alloc(ga, sizeof(int) * (size_t)(p->n + 1));
    t->dep = arena_alloc(ga, sizeof(int) * (size_t)(p->n + 1));
    t->cdep_st = arena_alloc(ga, sizeof(int) * (size_t)(p->n + 1));
    t->cdep = arena_alloc(ga, sizeof(int) * (size_t)(p->n + 1));
    t->acc = arena_alloc(ga, sizeof(char *) * (size_t)(p->n + 1));
    p->rtab = t;
  }
  r->t = p->rtab;
  r->stamp = ++r->t->stamp;
  r->it = "int64_t";
  r->capv = 256;
  r->cap = 256; /* (a level may close before the first memo: rider_finish's) */
  r->memo = arena_alloc(a, sizeof(Memo) * (size_t)r->cap);
  r->vlev = arena_alloc(a, sizeof(char *) * (size_t)r->capv);
  r->vlevel = arena_alloc(a, sizeof(int) * (size_t)r->capv);
  buf_init(&r->lv[0], a);
  for (int i = 0; k && i < k->nouts; i++)
    r->t->own_st[k->outs[i]->id] = r->stamp;
  for (int i = 0; k && i < k->nreds; i++)
    r->t->own_st[k->reds[i]->id] = r->stamp;
  for (int i = 0; k && i < k->ncols; i++)
    r->t->own_st[k->cols[i]->id] = r->stamp;
  r->ip_in = r->ip_out = -1;
  r->grp = 32;
  for (int i = 0; k && p->buf && i < k->nouts; i++) {
    int bi = p->buf[k->outs[i]->id];
    if (bi >= 0 && p->b[bi].inplace >= 0)
      r->ip_out = bi, r->ip_in = p->b[bi].inplace;
  }
  return r;
}

/* Whether identifier w occurs in text. */
static int uses(const char *text, const char *w) {
  size_t n = strlen(w);
  for (const char *h = strstr(text, w); h; h = strstr(h + 1, w))
    if (!idc(h[n]) && (h == text || !idc(h[-1])))
      return 1;
  return 0;
}

/* The lane loop's element index (declared by the line containing decl in
 * the innermost level) dropped when no lane reads it (name v), after the
 * level's unread locals are (prune: an index form bound but not loaded at). */
static void drop_unused_index(R *r, const char *decl_text, const char *v) {
  Buf *b = &r->lv[r->level];
  const char *t = prune(r->a, b->p ? b->p : ""), *decl = strstr(t, decl_text);
  const char *next = decl ? strchr(decl, '\n') + 1 : NULL;
  Buf nb;
  buf_init(&nb, r->a);
  if (!decl || uses(next, v)) {
    buf_printf(&nb, "%s", t);
  } else {
    while (decl > t && decl[-1] != '\n')
      decl--;
    buf_printf(&nb, "%.*s%s", (int)(decl - t), t, next);
  }
  *b = nb;
}

/* A pointwise kernel's vector loop (CUDA): each thread takes r->vec
 * consecutive elements, loads each buffer read at the element itself (every
 * such buffer, r->contig) as one vector, computes the lanes in an unrolled
 * loop (a broadcast operand's load stays scalar) and stores each result as
 * one vector. It runs when every vector buffer is aligned to its vector's
 * bytes; the scalar loop after it does the rest (all elements otherwise). */
static void vec_loop(R *r) {
  const Kernel *k = r->k;
  Buf al;
  buf_init(&al, r->a);
  int nl, *l = bf_list(r, &nl);
  for (int j = 0, nal = 0; j < nl; j++)
    if (bf(r, l[j]) & BF_CONTIG)
      buf_printf(&al, "%s(uintptr_t)%s %% %d", nal++ ? " | " : "", r->p->b[l[j]].name,
                 r->vec * dtype_size(r->p->b[l[j]].node->dtype));
  emit(r, 0, "const %s nv = (%s) == 0 ? n / %d : 0;  /* vectors of %d elements: aligned buffers only */", r->it, al.p,
       r->vec, r->vec);
  open_level(r);
  head(r, "for (%s iv = blockIdx.x * (%s)blockDim.x + threadIdx.x; iv < nv; iv += (%s)gridDim.x * blockDim.x) {", r->it,
       r->it, r->it);
  set_var_level(r, "iv", 1);
  open_level(r);
  head(r, "#pragma unroll");
  head(r, "for (int lane = 0; lane < %d; lane++) {", r->vec);
  set_var_level(r, "lane", 2);
  emit(r, 2, "const %s i = iv * %d + lane;", r->it, r->vec);
  set_var_level(r, "i", 2);
  r->lanes = 1;
  r->vidx = "iv";
  r->vload_lv = 1;
  r->vstores.n = 0;
  r->ip_ph = 2, r->ip_loop++;
  for (int i = 0; i < k->nouts; i++) {
    Ix ix = ix_make(&k->outs[i]->shape, "i");
    store(r, k->outs[i], &ix, 0);
  }
  r->lanes = 0;
  drop_unused_index(r, " i = iv * ", "i");
  close_level(r);
  for (int i = 0; i < r->vstores.n; i++)
    emit(r, 1, "%s", (const char *)r->vstores.p[i]);
  close_level(r);
}

/* A split reduction's accumulators after its r loop (CUDA): each block
 * combines its lanes, writes its partials, and the last block of the output
 * tile to finish combines the tile's partials (tgm_math.h's tgm_split_*, a
 * fixed order) and goes on to the values over the output space; the others
 * are done with the tile. Partial a of output o is at part[(o * na + a) *
 * gridDim.y + blockIdx.y]. */
static void split_combine(R *r, const char **accs, const Op *ops, int na) {
  for (int a = 0; a < na; a++)
    r->d->combine(r, ops[a], accs[a]);
  int blk = r->mode == M_BLOCK;
  emit(r, 1, "if (%s) {  /* this block's partials */", blk ? "threadIdx.x == 0" : "threadIdx.x / 32 == 0 && live");
  for (int a = 0; a < na; a++)
    emit(r, 1, "  split_part[(o * %d + %d) * gridDim.y + blockIdx.y] = %s;", na, a, accs[a]);
  emit(r, 1, "}");
  emit(r, 1, "if (!%s_split_last(&split_count[%s]))  /* the tile's last block to finish goes on */", r->name,
       blk ? "o" : "o0 / 32");
  emit(r, 1, "  continue;");
  for (int a = 0; a < na; a++)
    emit(r, 1, "%s = %s_split_%s_%s(split_part + (o * %d + %d) * gridDim.y%s);", accs[a], r->name, blk ? "block" : "column",
         ops[a] == OP_AMAX ? "max" : "sum", na, a, blk ? "" : ", live");
}

static Dim numel_of(const Shape *sh) {
  Dim n = dim_const(1);
  Loc none = {0, 0};
  for (int j = 0; j < sh->rank; j++)
    n = dim_mul(n, sh->d[j], none);
  return n;
}

/* Is n, a value reduction kernel k stores, over k's input space (not a
 * reduction, not over the output space)? */
static int over_input(R *r, const Node *n) {
  const Kernel *k = r->k;
  Dim nn = numel_of(&n->shape);
  return op_info[n->op].cls != C_REDUCE && dim_eq(&nn, &k->numel) && !dim_eq(&k->numel, &k->outer) && !cdep(r, n);
}

/* Does kernel k store values over its input's space? */
static int full_outputs(R *r) {
  for (int i = 0; i < r->k->nouts; i++)
    if (over_input(r, r->k->outs[i]))
      return 1;
  return 0;
}

/* Element ixF (of output t of a tile, level 3) added into each reduction's
 * accumulator accs[i][t]. */
static void tile_add(R *r, const char **accs, const char *t, const Ix *ixF) {
  for (int i = 0; i < r->k->nreds; i++) {
    const Node *red = r->k->reds[i];
    Ix xi = *ixF;
    const char *v = val(r, red->in[0], &xi);
    if (red->op == OP_SUM)
      emit(r, 3, "%s[%s] += %s;", accs[i], t, v);
    else
      emit(r, 3, "%s[%s] = %s_max(%s[%s], %s);", accs[i], t, r->name, accs[i], t, v);
  }
}

/* In a loop over a tile's outputs o (level 2; accs[i][t] reduction i's
 * accumulator of output t): each reduction's result, then the kernel's
 * values over the output space, stored at o. */
static void tile_results(R *r, const char **accs, const char *t) {
  const Kernel *k = r->k;
  for (int i = 0; i < k->nreds; i++) {
    const Node *red = k->reds[i];
    const char *v = arena_printf(r->a, "s%d", r->nvars++);
    emit(r, 2, "const %s %s = %s;", vtype(red->dtype), v,
         half_round(r, red->dtype, arena_printf(r->a, "(%s)%s[%s]", vtype(red->dtype), accs[i], t)));
    set_var_level(r, v, 2);
    set_acc(r, red, v);
  }
  for (int i = 0; i < k->nouts; i++) {
    Ix xi = ix_make(&k->outs[i]->shape, "o");
    store(r, k->outs[i], &xi, 1);
  }
}

/* M_CTILE (CPU): one phase of reductions over leading dims, and the values
 * over the output space after it. Levels: 1 a tile of outputs o0..o0+nc, 2
 * a reduced element r, 3 an output o of the tile; then 2 again, an output
 * o of the tile after the loop over r. Each output's sum runs over r in
 * order, as in a loop per output element. */
static void column_tiles(R *r, const Shape *rsh) {
  const Kernel *k = r->k;
  if (r->leaf) { /* lo and hi are multiples of CTILE (or n_o) */
    head(r, "for (int64_t o0 = lo; o0 < hi; o0 += %d) {", CTILE);
  } else {
    emit(r, 0, "%s_OMP(parallel for if (n_o * n_r > 16384) schedule(static)%s)", r->NAME,
         r->has_bad ? " reduction(min : bad)" : "");
    head(r, "for (int64_t o0 = 0; o0 < n_o; o0 += %d) {", CTILE);
  }
  set_var_level(r, "o0", 1);
  emit(r, 1, "const int64_t nc = n_o - o0 < %d ? n_o - o0 : %d;", CTILE, CTILE);
  set_var_level(r, "nc", 1);
  const char **accs = arena_alloc(r->a, sizeof(char *) * (size_t)(k->nreds + 1));
  for (int i = 0; i < k->nreds; i++) {
    const Node *red = k->reds[i];
    int fl = dtype_is_float(red->dtype);
    const char *t = red->op == OP_AMAX ? (fl ? "float" : "int64_t") : (fl ? r->d->acc : "int64_t");
    accs[i] = arena_printf(r->a, "acc%d", r->nvars++);
    emit(r, 1, "%s %s[%d];", t, accs[i], CTILE);
    emit(r, 1, "for (int64_t c = 0; c < %d; c++)", CTILE);
    emit(r, 1, "  %s[c] = %s;", accs[i], red->op == OP_SUM ? "0" : fl ? "-INFINITY" : "INT64_MIN");
  }
  open_level(r);
  head(r, "for (int64_t r = 0; r < n_r; r++) {");
  set_var_level(r, "r", 2);
  open_level(r);
  head(r, "%s_OMP(simd%s)", r->NAME, r->has_bad ? " reduction(min : bad)" : "");
  head(r, "for (int64_t c = 0; c < nc; c++) {");
  head(r, "  const int64_t o = o0 + c;");
  set_var_level(r, "c", 3);
  set_var_level(r, "o", 3);
  Ix ixF = ix_make(&k->full, NULL);
  Ix oo = ix_make(r->outer_sh, "o"), ro = ix_make(rsh, "r");
  for (int j = 0, a = 0, b = 0; j < k->full.rank; j++)
    ixF.d[j] = k->axes >> j & 1 ? ix_dim(r, &ro, a++) : ix_dim(r, &oo, b++);
  tile_add(r, accs, "c", &ixF);
  close_level(r);
  close_level(r);
  /* the results and the values over the output space */
  open_level(r);
  head(r, "for (int64_t c = 0; c < nc; c++) {");
  head(r, "  const int64_t o = o0 + c;");
  set_var_level(r, "c", 2);
  set_var_level(r, "o", 2);
  tile_results(r, accs, "c");
  close_level(r);
  close_level(r);
}

/* Through views of one operand: the node a value is read from. */
static const Node *unview(const Node *n) {
  while (layout_view1(n))
    n = n->in[0];
  return n;
}

/* A row kernel on CUDA whose first phase is m = amax(u) alone and whose
 * second is s = sum(exp(u - m)) alone, nothing else stored in between (a
 * softmax's or a cross-entropy's statistics): both in one pass over the row
 * (the online softmax: a larger element rescales the sum so far), so the
 * row is read once fewer. Sets r->on_max, r->on_sum. */
static void online_pair(R *r) {
  const Kernel *k = r->k;
  const Node *m = NULL, *sm = NULL;
  r->on_max = r->on_sum = NULL;
  if (strcmp(r->d->name, "cuda") || (r->mode != M_WARP && r->mode != M_BLOCK) || r->split)
    return;
  for (int i = 0; i < k->nreds; i++) {
    const Node *red = k->reds[i];
    int ph = dep(r, red);
    if (ph == 1 && !m && red->op == OP_AMAX && red->dtype == DT_F32)
      m = red;
    else if (ph == 2 && !sm && red->op == OP_SUM && red->dtype == DT_F32)
      sm = red;
    else if (ph <= 2)
      return;
  }
  if (!m || !sm)
    return;
  for (int i = 0; i < k->nouts; i++)
    if (over_input(r, k->outs[i]) && dep(r, k->outs[i]) == 1)
      return;
  for (int i = 0; i < k->ncols; i++) /* a rider added in the second phase's pass, which this one drops */
    if (dep(r, k->cols[i]->in[0]) == 1)
      return;
  const Node *e = sm->in[0], *d = e->op == OP_EXP ? e->in[0] : NULL;
  if (!d || d->op != OP_SUB || d->dtype != DT_F32 || e->dtype != DT_F32 || d->in[0] != m->in[0] ||
      unview(d->in[1]) != m || r->p->realized[e->id] || r->p->realized[d->id])
    return;
  r->on_max = m;
  r->on_sum = sm;
}

/* Is loop kernel k a reduction over leading dims only (element (r, o) at
 * r * n_o + o: a column sum's rows)? */
static int column_prefix(const Kernel *k) {
  int j = 0;
  while (j < k->full.rank && (k->axes >> j & 1))
    j++;
  return j > 0 && (k->axes >> j) == 0;
}

/* M_COLUMN on CUDA with r->cvec = V: one phase of reductions over leading
 * dims (bias and layer-norm gradients), a block a tile of 32 V output
 * columns, each thread V neighbouring columns (oc V .. oc V + V - 1) over
 * its rows r, loading each buffer's V elements of row r as one vector
 * (the kernel's buffers at that element are aligned, n_o a multiple of V:
 * loop_kernel checked), accumulating into V accumulators; then the
 * block's row groups combine each accumulator's V columns in one pass into
 * warp 0, which stores (tgm_column_*_v), split over blocks as M_COLUMN is.
 * Levels: 1 a tile, 2 a row r, 3 a column of the thread; then 2 a column
 * again, for the results. */
static void column_vectors(R *r, const Shape *rsh) {
  const Kernel *k = r->k;
  const int V = r->cvec;
  const char *it = r->it;
  head(r, "for (%s o0 = blockIdx.x * (%s)%d; o0 < n_o; o0 += (%s)gridDim.x * %d) {", it, it, 32 * V, it, 32 * V);
  head(r, "  const %s oc = o0 / %d + threadIdx.x %% 32;  /* this thread's columns: oc * %d .. oc * %d + %d */", it, V, V, V,
       V - 1);
  head(r, "  const int live = oc * %d < n_o;", V);
  set_var_level(r, "o0", 1);
  set_var_level(r, "oc", 1);
  set_var_level(r, "live", 1);
  const char **accs = arena_alloc(r->a, sizeof(char *) * (size_t)(k->nreds + 1));
  for (int i = 0; i < k->nreds; i++) {
    const Node *red = k->reds[i];
    accs[i] = arena_printf(r->a, "acc%d", r->nvars++);
    emit(r, 1, "float %s[%d];", accs[i], V);
    emit(r, 1, "for (int lane = 0; lane < %d; lane++)", V);
    emit(r, 1, "  %s[lane] = %s;", accs[i], red->op == OP_SUM ? "0" : "-INFINITY");
  }
  open_level(r);
  r->d->r_loop(r);
  set_var_level(r, "r", 2);
  open_level(r);
  head(r, "#pragma unroll");
  head(r, "for (int lane = 0; lane < %d; lane++) {", V);
  emit(r, 3, "const %s o = oc * %d + lane;", it, V);
  set_var_level(r, "lane", 3);
  set_var_level(r, "o", 3);
  Ix ixF = ix_make(&k->full, NULL);
  Ix oo = ix_make(r->outer_sh, "o"), ro = ix_make(rsh, "r");
  for (int j = 0, a = 0, b = 0; j < k->full.rank; j++)
    ixF.d[j] = k->axes >> j & 1 ? ix_dim(r, &ro, a++) : ix_dim(r, &oo, b++);
  r->vflat = ixF.flat = bind_ix(r, "r * n_o + o");
  r->lanes = 1;
  r->vidx = arena_printf(r->a, "r * (n_o / %d) + oc", V);
  r->vload_lv = 2;
  tile_add(r, accs, "lane", &ixF);
  r->lanes = 0;
  r->vflat = NULL;
  drop_unused_index(r, " o = oc * ", "o"); /* (the loads all vectors: nvcc warns of an unused o) */
  close_level(r);
  close_level(r);
  /* the row groups' partials of each column, in order, into warp 0 (then,
   * split, the blocks': reduction i's partials are gridDim.y rows of n_o) */
  for (int i = 0; i < k->nreds; i++)
    emit(r, 1, "%s_column_%s_v(%s, %d);", r->name, k->reds[i]->op == OP_AMAX ? "max" : "sum", accs[i], V);
  if (r->split) {
    emit(r, 1, "if (threadIdx.x / 32 == 0 && live)  /* this block's partials */");
    emit(r, 1, "  for (int lane = 0; lane < %d; lane++) {", V);
    for (int i = 0; i < k->nreds; i++)
      emit(r, 1, "    split_part[(%d * gridDim.y + blockIdx.y) * n_o + oc * %d + lane] = %s[lane];", i, V, accs[i]);
    emit(r, 1, "  }");
    emit(r, 1, "if (!%s_split_last(&split_count[o0 / %d]))  /* the tile's last block to finish goes on */", r->name, 32 * V);
    emit(r, 1, "  continue;");
    for (int i = 0; i < k->nreds; i++)
      emit(r, 1, "%s_split_column_%s_v(split_part + %d * gridDim.y * n_o, n_o, oc, live, %s, %d);", r->name,
           k->reds[i]->op == OP_AMAX ? "max" : "sum", i, accs[i], V);
  }
  open_level(r);
  head(r, "for (int lane = 0; lane < %d; lane++) {", V);
  emit(r, 2, "const %s o = oc * %d + lane;", it, V);
  set_var_level(r, "lane", 2);
  set_var_level(r, "o", 2);
  tile_results(r, accs, "lane");
  close_level(r);
  close_level(r);
}

/* The body of phase ph's loop over the reduced elements r of output o (the
 * innermost level open): each reduction of the phase adds element r into
 * its accumulator accs[...], and the values over the input space that wait
 * for the phase before are stored. Returns the phase's reduction count. */
static int phase_body(R *r, int ph, const Shape *rsh, const char **accs) {
  const Kernel *k = r->k;
  int lv = r->level, na = 0;
  r->ip_ph = 2 * ph, r->ip_loop++;
  Ix ixF = ix_make(&k->full, NULL);
  Ix oo = ix_make(r->outer_sh, "o"), ro = ix_make(rsh, "r"); /* fresh: their dims are this loop's locals */
  for (int j = 0, a = 0, b = 0; j < k->full.rank; j++)
    ixF.d[j] = k->axes >> j & 1 ? ix_dim(r, &ro, a++) : ix_dim(r, &oo, b++);
  if (kernel_rows(k))
    r->vflat = ixF.flat = bind_ix(r, "o * n_r + r");
  else if (!strcmp(r->d->name, "cuda") && column_prefix(k)) /* (for the probe: which buffers are read there) */
    r->vflat = ixF.flat = bind_ix(r, "r * n_o + o");
  r->full = ixF; /* (only the rows' flat index names an element of the whole space) */
  if (!kernel_rows(k))
    r->full.sh = NULL;
  for (int i = 0; i < k->nreds && ph <= r->nph; i++) {
    const Node *red = k->reds[i];
    if (dep(r, red) != ph || red == r->on_sum)
      continue;
    Ix xi = ixF;
    const char *v = val(r, red->in[0], &xi);
    if (red == r->on_max) { /* and the sum of exp(u - max) so far, rescaled when the max grows */
      const char *mx = accs[na], *sm = accs[na + 1];
      /* without branches (selects), so that an unrolled loop's next loads are not behind them; one exp:
       * exp(max - v) rescales the sum when v is larger (then exp(v - v), 1 or NaN, is v - v + 1), else
       * exp(v - max) adds to it; a NaN element, or max, stays */
      emit(r, lv, "{  /* %s, %s: the online max and sum of exp(x - max) */", mx, sm);
      emit(r, lv, "  const int up = %s > %s;", v, mx);
      emit(r, lv, "  const float ex = %s_exp(up ? %s - %s : %s - %s);", r->name, mx, v, v, mx);
      emit(r, lv, "  const float grown = (%s == -INFINITY ? 0.0f : %s * ex) + (%s - %s + 1.0f), added = %s + ex;", mx,
           sm, v, v, sm);
      emit(r, lv, "  const int nan = %s != %s;", v, v);
      emit(r, lv, "  %s = nan ? %s : up ? grown : added;", sm, v);
      emit(r, lv, "  %s = nan || up ? %s : %s;", mx, v, mx);
      emit(r, lv, "}");
      na += 2;
      continue;
    }
    if (red->op == OP_SUM)
      emit(r, lv, "%s += %s;", accs[na], v);
    else
      emit(r, lv, "%s = %s_max(%s, %s);", accs[na], r->name, accs[na], v);
    na++;
  }
  for (int i = 0; i < k->ncols; i++) { /* the riders' columns: element r of the row adds into sum r */
    const Node *c = k->cols[i];
    if (dep(r, c->in[0]) != ph - 1)
      continue;
    Ix xi = ixF;
    const char *v = val(r, c->in[0], &xi);
    if (!strcmp(r->d->name, "cuda") && r->mode == M_BLOCK) /* riders_block: in registers */
      emit(r, lv, "rsum[%d + %s] += %s;", i * r->nslot, r->lanes ? arena_printf(r->a, "rj * %d + lane", r->rvec) : "rk", v);
    else if (!strcmp(r->d->name, "cuda")) /* (this thread's column of the block's sums: no bank conflicts) */
      emit(r, lv, "csum[(%d + %s) * %d + threadIdx.x] += %s;", i * r->nslot,
           r->lanes ? arena_printf(r->a, "rj * %d + lane", r->rvec) : "rk", WARP_BLOCK, v);
    else
      emit(r, lv, "cpart[%d * n_r + r] += %s;", i, v);
  }
  for (int i = 0; i < k->nouts; i++) {
    const Node *n = k->outs[i];
    if (!over_input(r, n))
      continue;
    int d = dep(r, n);
    if (d == ph - 1 || (d == r->nph && ph == r->nph + 1)) {
      Ix xi = ix_make(&n->shape, ix_flat(r, &ixF));
      if (!shape_eq(&n->shape, &k->full))
        xi.flat = ix_flat(r, &ixF);
      else
        xi = ixF;
      store(r, n, &xi, 0);
    }
  }
  r->full.sh = NULL;
  return na;
}

/* A reduction kernel's values over the output space (phase ph for ip_safe). */
static void out_space_stores(R *r, int ph) {
  const Kernel *k = r->k;
  r->ip_ph = ph;
  for (int i = 0; i < k->nouts; i++) {
    const Node *n = k->outs[i];
    Dim nn = numel_of(&n->shape);
    if (!dim_eq(&nn, &k->outer) || cdep(r, n))
      continue;
    Ix xi = ix_make(&n->shape, "o");
    store(r, n, &xi, 1);
  }
}

/* Does loop kernel k walk its space a row at a time (reductions, or riders
 * on a pointwise kernel), not element by element? */
static int walks_rows(const Kernel *k) { return k->nreds || k->ncols; }

/* The body of loop kernel k (into r->lv[0]). */
static void loop_body(R *r) {
  const Kernel *k = r->k;
  if (!walks_rows(k)) {
    r->vflat = "i";
    emit(r, 0, "const %s n = %s;", r->it, c_dim(r->g, &k->numel));
    if (r->vec)
      vec_loop(r);
    open_level(r);
    r->d->pw_loop(r);
    set_var_level(r, "i", 1);
    r->ip_ph = 2, r->ip_loop++;
    for (int i = 0; i < k->nouts; i++) {
      Ix ix = ix_make(&k->outs[i]->shape, "i");
      store(r, k->outs[i], &ix, 0);
    }
    close_level(r);
    return;
  }
  r->outer_shape.rank = 0;
  Shape rsh = {0};
  for (int j = 0; j < k->full.rank; j++)
    if (k->axes >> j & 1)
      rsh.d[rsh.rank++] = k->full.d[j];
    else
      r->outer_shape.d[r->outer_shape.rank++] = k->full.d[j];
  r->outer_sh = &r->outer_shape;
  if (r->leaf) { /* one a line: the loop over [lo, hi) may not read n_o (prune drops it then) */
    emit(r, 0, "const %s n_o = %s;", r->it, c_dim(r->g, &k->outer));
    emit(r, 0, "const %s n_r = %s;", r->it, c_dim(r->g, &k->rnum));
  } else
    emit(r, 0, "const %s n_o = %s, n_r = %s;", r->it, c_dim(r->g, &k->outer), c_dim(r->g, &k->rnum));
  if (r->rvec) { /* rows of whole vectors, every vector buffer aligned: else no vector loop */
    Buf al;
    buf_init(&al, r->a);
    int nl, *l = bf_list(r, &nl);
    for (int j = 0, nal = 0; j < nl; j++)
      if ((bf(r, l[j]) & (BF_CONTIG | BF_ROWV)) || bcast_vec(r, l[j]))
        buf_printf(&al, "%s(uintptr_t)%s", nal++ ? " | " : "", r->p->b[l[j]].name);
    emit(r, 0, "const %s nrv = n_r %% %d == 0 && (%s) %% 16 == 0 ? n_r / %d : 0;  /* vectors of %d elements a row */",
         r->it, r->rvec, al.p, r->rvec, r->rvec);
  }
  int nph = 0;
  for (int i = 0; i < k->nreds; i++) {
    int ph = dep(r, k->reds[i]);
    nph = ph > nph ? ph : nph;
  }
  int last_full = 0; /* the latest phase a value over the input space waits for */
  for (int i = 0; i < k->nouts; i++)
    if (over_input(r, k->outs[i])) {
      int d = dep(r, k->outs[i]);
      last_full = d > last_full ? d : last_full;
    }
  for (int i = 0; i < k->ncols; i++) { /* a rider adds its element in the pass after the phase it waits for */
    const Node *c = k->cols[i];
    int d = dep(r, c->in[0]);
    last_full = d > last_full ? d : last_full;
    if (cdep(r, c->in[0])) /* a rider reads another's sum: known only after every row */
      r->fail = 1;
  }
  for (int i = 0; i < k->ncols && !r->fail; i++) { /* only the riders' outs read their sums, over their space */
    for (int j = 0; j < k->nreds; j++)
      r->fail |= cdep(r, k->reds[j]);
    for (int j = 0; j < k->nouts; j++) { /* and every other value over the rows' space or their results' */
      Dim nn = numel_of(&k->outs[j]->shape);
      r->fail |= cdep(r, k->outs[j]) ? !dim_eq(&nn, &k->rnum) : !dim_eq(&nn, &k->numel) && !dim_eq(&nn, &k->outer);
    }
  }
  r->nph = nph, r->last_full = last_full;
  online_pair(r);
  const int passes = nph + (last_full == nph) - (r->on_sum != NULL); /* over the row */
  if (r->srow && passes < 2) /* one pass over the row: nothing to keep */
    r->srow = 0, r->rthreads = ROW_BLOCK_LONG;
  if (r->srow) /* the max and the sum as two passes over shared memory (long rows keep no registers) */
    r->on_max = r->on_sum = NULL;
  if (passes < 2 && !k->ncols) /* one pass over the row: nothing to keep (riders keep the loop over rj) */
    r->rcache = 0;
  if (r->mode == M_CTILE && nph == 1 && !full_outputs(r)) {
    open_level(r);
    column_tiles(r, &rsh);
    return;
  }
  if (r->cvec) {
    open_level(r);
    column_vectors(r, &rsh);
    return;
  }
  if (r->mode == M_CTILE) /* several phases, or values over the input space: a loop per output element */
    r->mode = M_SERIAL;
  int cuda = !strcmp(r->d->name, "cuda");
  int64_t nrc = 0;
  if (k->ncols && cuda && dim_is_const(&k->rnum, &nrc) && r->mode == M_BLOCK) { /* riders_block */
    if (!r->rvec || !r->rcache)
      r->fail = 1;
    r->nslot = r->rcache * r->rvec;
    emit(r, 0, "float rsum[%d];  /* the riders' sums: [rider][a thread's sum s], in registers */", k->ncols * r->nslot);
    emit(r, 0, "#pragma unroll");
    emit(r, 0, "for (int s = 0; s < %d; s++)", k->ncols * r->nslot);
    emit(r, 0, "  rsum[s] = 0;");
  } else if (k->ncols && cuda && dim_is_const(&k->rnum, &nrc)) { /* each thread's sums of its columns, one per rider */
    r->nslot = r->rvec ? r->rcache * r->rvec : (int)((nrc + r->grp - 1) / r->grp);
    emit(r, 0, "__shared__ float csum[%d];  /* the riders' sums: [rider][a thread's sum s][thread] */",
         k->ncols * r->nslot * WARP_BLOCK);
    emit(r, 0, "for (int s = 0; s < %d; s++)", k->ncols * r->nslot);
    emit(r, 0, "  csum[s * %d + threadIdx.x] = 0;", WARP_BLOCK);
  } else if (k->ncols && cuda)
    r->fail = 1;
  open_level(r);
  r->d->o_loop(r);
  set_var_level(r, "o", 1);
  const char **accs = arena_alloc(r->a, sizeof(char *) * (size_t)(k->nreds + 1));
  const char **tys = arena_alloc(r->a, sizeof(char *) * (size_t)(k->nreds + 1));
  Op *ops = arena_alloc(r->a, sizeof(Op) * (size_t)(k->nreds + 1));
  /* in place: the phase that stores ip_out over the bytes it reads; when it
   * is the last pass over the row, the values over the output space (which
   * may read ip_in elsewhere: the loss's logit at the target) first */
  int ph_w = r->ip_out >= 0 ? dep(r, r->p->b[r->ip_out].node) + 1 : 0, early = ph_w == nph + 1 && last_full == nph;
  for (int ph = 1; ph <= nph + (last_full == nph); ph++) {
    if (r->on_sum && ph == 2) /* computed in the first phase's pass */
      continue;
    if (ph == ph_w && early)
      out_space_stores(r, 2 * ph_w - 1);
    if (ph == ph_w && ph > 1 && !strcmp(r->d->name, "cuda") &&
        (r->mode == M_WARP || r->mode == M_BLOCK || r->mode == M_COLUMN)) /* every read of the row so far is done */
      emit(r, 1, "%s;  /* %s is written over %s from here */",
           r->mode != M_WARP ? "__syncthreads()"
           : r->grp < 32     ? arena_printf(r->a, "__syncwarp(%s_group_mask(%d))", r->name, r->grp)
                             : "__syncwarp()",
           r->p->b[r->ip_out].name, r->p->b[r->ip_in].name);
    int na = 0;
    for (int i = 0; i < k->nreds && ph <= nph; i++) {
      const Node *red = k->reds[i];
      if (dep(r, red) != ph || red == r->on_sum)
        continue;
      for (int pair = 0; pair <= (red == r->on_max); pair++) { /* the online max, then its sum */
        const Node *x = pair ? r->on_sum : red;
        const char *acc = arena_printf(r->a, "acc%d", r->nvars++);
        int fl = dtype_is_float(x->dtype);
        const char *t = x->op == OP_AMAX ? (fl ? "float" : "int64_t") : (fl ? r->d->acc : "int64_t");
        emit(r, 1, "%s %s = %s;", t, acc, x->op == OP_SUM ? "0" : fl ? "-INFINITY" : "INT64_MIN");
        tys[na] = t;
        ops[na] = x->op;
        accs[na++] = acc;
      }
    }
    if (r->csplit) /* each chunk's accumulators, then the chunks in order */
      for (int a = 0; a < na; a++)
        emit(r, 1, "%s %s_part[%d];", tys[a], accs[a], CHUNKS);
    open_level(r);
    if (r->csplit) {
      head(r, "%s_OMP(parallel for schedule(static) if (n_r > 16384)%s)", r->NAME, r->has_bad ? " reduction(min : bad)" : "");
      head(r, "for (int64_t c = 0; c < %d; c++) {", CHUNKS);
      for (int i = 0, a = 0; i < k->nreds; i++)
        if (dep(r, k->reds[i]) == ph)
          head(r, "  %s %s = %s;  /* this chunk's */", tys[a], accs[a], k->reds[i]->op == OP_SUM ? "0" : "-INFINITY"), a++;
    }
    if (na && !strcmp(r->d->name, "cpu")) {
      /* one vector loop: sums, float maxes (NaN-propagating: the math header's tgm_fmax) and integer ones */
      Buf b, c[3];
      buf_init(&b, r->a);
      for (int q = 0; q < 3; q++)
        buf_init(&c[q], r->a);
      for (int i = 0; i < na; i++) {
        int q = ops[i] == OP_SUM ? 0 : !strcmp(tys[i], "float") ? 1 : 2;
        buf_printf(&c[q], "%s%s", c[q].len ? ", " : "", accs[i]);
      }
      const char *kind[3] = {"+", arena_printf(r->a, "%s_fmax", r->name), "max"};
      for (int q = 0; q < 3; q++)
        if (c[q].len)
          buf_printf(&b, "%sreduction(%s : %s)", b.len ? " " : "", kind[q], c[q].p);
      head(r, "%s%s_OMP(simd %s%s)", r->csplit ? "  " : "", r->NAME, b.p, r->has_bad ? " reduction(min : bad)" : "");
    } else if (!na && r->ip_out >= 0 && !strcmp(r->d->name, "cpu")) {
      /* a pass storing over its input at the element it reads (ip_safe): the compiler cannot see that the two
       * pointers do not overlap otherwise, and leaves the loop scalar */
      head(r, "%s%s_OMP(simd%s)", r->csplit ? "  " : "", r->NAME, r->has_bad ? " reduction(min : bad)" : "");
    }
    if (r->rvec) { /* the row's vectors first (none when a buffer is not aligned), then the elements past them */
      const char *start = r->mode == M_WARP ? arena_printf(r->a, "threadIdx.x %% %d", r->grp)
                          : r->split        ? "blockIdx.y * blockDim.x + threadIdx.x"
                                            : "threadIdx.x";
      const char *step = r->mode == M_WARP ? arena_printf(r->a, "%d", r->grp) : r->split ? "gridDim.y * blockDim.x" : "blockDim.x";
      if (r->rcache) { /* the same vectors in every phase: the first phase's loads stay in registers */
        r->rc_start = start, r->rc_step = step;
        head(r, "#pragma unroll");
        head(r, "for (int rj = 0; rj < %d; rj++) {", r->rcache);
        set_var_level(r, "rj", 2);
        emit(r, 2, "const %s rv = %s + rj * %s;", r->it, start, step);
        emit(r, 2, "if (rv >= nrv) break;");
      } else {
        strided_loop(r, "rv", start, "nrv", step, NULL, 2);
      }
      set_var_level(r, "rv", 2);
      open_level(r);
      head(r, "#pragma unroll");
      head(r, "for (int lane = 0; lane < %d; lane++) {", r->rvec);
      set_var_level(r, "lane", 3);
      emit(r, 3, "const %s r = rv * %d + lane;", r->it, r->rvec);
      set_var_level(r, "r", 3);
      r->lanes = 1;
      r->vidx = "rv";
      r->vload_lv = 2;
      r->vstores.n = 0;
      phase_body(r, ph, &rsh, accs);
      r->lanes = 0;
      drop_unused_index(r, " r = rv * ", "r");
      close_level(r);
      for (int i = 0; i < r->vstores.n; i++)
        emit(r, 2, "%s", (const char *)r->vstores.p[i]);
      close_level(r);
      open_level(r);
    }
    if (k->ncols && cuda && r->mode == M_BLOCK) { /* riders_block: sum rk is element rk of the thread's (registers: unrolled) */
      head(r, "#pragma unroll");
      head(r, "for (int rk = 0; rk < %d; rk++) {", r->nslot);
      emit(r, r->level, "const %s r = nrv * %d + threadIdx.x + rk * %d;", r->it, r->rvec, r->rthreads);
      emit(r, r->level, "if (r >= n_r) break;");
      set_var_level(r, "rk", 2);
    } else if (k->ncols && cuda) { /* counted: sum rk of the thread's riders is element rk of its elements */
      head(r, "#pragma unroll 4");
      head(r, "for (int rk = 0; rk < %d; rk++) {", r->nslot);
      emit(r, r->level, "const %s r = %sthreadIdx.x %% %d + rk * %d;", r->it,
           r->rvec ? arena_printf(r->a, "nrv * %d + ", r->rvec) : "", r->grp, r->grp);
      emit(r, r->level, "if (r >= n_r) break;");
      set_var_level(r, "rk", 2);
    } else
      r->d->r_loop(r);
    set_var_level(r, "r", 2);
    na = phase_body(r, ph, &rsh, accs);
    r->vflat = NULL;
    close_level(r);
    if (r->csplit && ph <= nph) {
      for (int a = 0; a < na; a++)
        emit(r, 1, "  %s_part[c] = %s;", accs[a], accs[a]);
      emit(r, 1, "}");
      for (int i = 0, a = 0; i < k->nreds; i++)
        if (dep(r, k->reds[i]) == ph) {
          if (k->reds[i]->op == OP_SUM)
            emit(r, 1, "for (int c = 0; c < %d; c++) %s += %s_part[c];", CHUNKS, accs[a], accs[a]);
          else
            emit(r, 1, "for (int c = 0; c < %d; c++) %s = %s_max(%s, %s_part[c]);", CHUNKS, accs[a], r->name, accs[a], accs[a]);
          a++;
        }
    }
    if (r->split && ph <= nph) {
      for (int i = 0, j = 0; i < k->nreds; i++)
        if (dep(r, k->reds[i]) == ph)
          ops[j++] = k->reds[i]->op;
      split_combine(r, accs, ops, na);
    }
    na = 0;
    for (int i = 0; i < k->nreds && ph <= nph; i++) {
      const Node *red = k->reds[i];
      if (dep(r, red) != ph || red == r->on_sum)
        continue;
      for (int pair = 0; pair <= (red == r->on_max); pair++) {
        const Node *x = pair ? r->on_sum : red;
        if (x == r->on_max && r->mode == M_WARP && r->grp < 32)
          emit(r, 1, "%s_group_online(&%s, &%s, %d);", r->name, accs[na], accs[na + 1], r->grp);
        else if (x == r->on_max)
          emit(r, 1, "%s_%s_online(&%s, &%s);", r->name, r->mode == M_WARP ? "warp" : "block", accs[na], accs[na + 1]);
        else if (!r->split && x != r->on_sum)
          r->d->combine(r, x->op, accs[na]);
        const char *v = arena_printf(r->a, "%s%d", "s", r->nvars++);
        emit(r, 1, "const %s %s = %s;", vtype(x->dtype), v,
             half_round(r, x->dtype, arena_printf(r->a, "(%s)%s", vtype(x->dtype), accs[na])));
        set_var_level(r, v, 1);
        set_acc(r, x, v);
        na++;
      }
    }
  }
  if (!(ph_w && early))
    out_space_stores(r, 2 * (nph + 2));
  close_level(r);
  if (k->ncols && cuda && !r->fail && r->mode == M_BLOCK) { /* riders_block: each thread's sums are the block's */
    const int nc = k->ncols * (int)nrc;
    emit(r, 0, "#pragma unroll");
    emit(r, 0, "for (int s = 0; s < %d; s++) {  /* sum s: the thread's vector s / %d's lane s %% %d, else its element s */", r->nslot,
         r->rvec, r->rvec);
    emit(r, 0, "  const int v = threadIdx.x + s / %d * %d, c = nrv ? v * %d + s %% %d : threadIdx.x + s * %d;", r->rvec, r->rthreads,
         r->rvec, r->rvec, r->rthreads);
    emit(r, 0, "  if (nrv ? v < nrv : c < %d)", (int)nrc);
    emit(r, 0, "    for (int i = 0; i < %d; i++)", k->ncols);
    emit(r, 0, "      split_part[blockIdx.x * %d + i * %d + c] = rsum[i * %d + s];", nc, (int)nrc, r->nslot);
    emit(r, 0, "}");
  } else if (k->ncols && cuda && !r->fail) { /* the riders' sums of the block's rows, lane group by lane group in order */
    const int nc = k->ncols * (int)nrc;
    emit(r, 0, "__syncthreads();  /* the block's partials: column c of rider i, from each lane group g in order */");
    emit(r, 0, "for (int j = threadIdx.x; j < %d; j += blockDim.x) {", nc);
    emit(r, 0, "  const int i = j / %d, c = j %% %d;", (int)nrc, (int)nrc);
    if (r->rvec) /* the vector loop's lanes (nrv: all the row's vectors), else a thread's elements */
      emit(r, 0, "  const int t = nrv ? c / %d %% %d : c %% %d, s = nrv ? c / %d / %d * %d + c %% %d : c / %d;", r->rvec, r->grp,
           r->grp, r->rvec, r->grp, r->rvec, r->rvec, r->grp);
    else
      emit(r, 0, "  const int t = c %% %d, s = c / %d;", r->grp, r->grp);
    emit(r, 0, "  float a = 0;");
    emit(r, 0, "  for (int g = 0; g < %d; g++)", WARP_BLOCK / r->grp);
    emit(r, 0, "    a += csum[(i * %d + s) * %d + g * %d + t];", r->nslot, WARP_BLOCK, r->grp);
    emit(r, 0, "  split_part[blockIdx.x * %d + j] = a;", nc);
    emit(r, 0, "}");
  }
  if (k->ncols && r->saw_take) /* (a rider kernel reports no bad index) */
    r->fail = 1;
}

static void choose_mode(R *r) {
  const Kernel *k = r->k;
  if (!k || !walks_rows(k)) {
    r->mode = M_PW;
    return;
  }
  r->mode = kernel_rows(k) ? M_SERIAL : M_CTILE;
  if (!strcmp(r->d->name, "cuda")) {
    int64_t rn = 0;
    const char *err;
    dim_eval(r->g, &k->rnum, r->p->sym, &rn, &err);
    r->mode = !kernel_rows(k) ? M_COLUMN : rn > 1024 || !k->nreds ? M_BLOCK : M_WARP; /* (a pointwise kernel with riders:
                                                                                     a block a row, riders_block) */
  }
}

/* A split reduction's least reduced elements per block (tgm_split's per),
 * and the blocks it aims at in all (its total). A vector column kernel's
 * blocks are of COLUMN_VBLOCK threads and end in one pass over their
 * partials (tgm_column_reduce_v): on GPT-2's layer-norm gradients
 * ([16384, 768] bf16, 2 sums) 512 threads in 88 blocks a tile took 31 us,
 * 1024 in 44 31 us, 256 in 88 35 us; the per-column tail it replaced took
 * 58 us at its best (1024 threads, 32 blocks a tile; H100, session 11). */
#define COLUMN_VBLOCK 512
static int split_per(R *r) { return r->mode == M_BLOCK ? 4096 : r->cvec ? 128 : 512; }
static int split_total(R *r) { return r->mode == M_BLOCK || !r->cvec ? 512 : 256; }

static int small(R *r, Dim d) {
  int64_t v;
  const char *err;
  return dim_eval(r->g, &d, r->p->sym, &v, &err) && v <= (int64_t)1 << 30;
}

/* Whether every position kernel r->k computes fits an int (CUDA's 32-bit
 * index arithmetic): its iteration space, every buffer it touches (from a
 * printed probe r) and every dim, at the dims' maxima, are at most 2^30, so
 * a grid-stride step (at most 2^26 threads) cannot overflow either. */
static int fits_int(R *r) {
  const Kernel *k = r->k;
  if (!small(r, k->numel) || !small(r, k->outer) || !small(r, numel_of(&k->full)))
    return 0;
  for (int i = 0; i < r->params.n; i++)
    if (!small(r, numel_of(&r->p->b[(int)(intptr_t)r->params.p[i] - 1].node->shape)))
      return 0;
  for (int s = 0; s < r->g->nsyms; s++)
    if (r->p->sym[s] > (int64_t)1 << 30)
      return 0;
  return 1;
}

/* The vector width of loop kernel r->k on CUDA (probe r printed it): 16
 * bytes of the widest buffer it loads or stores at a vector lane's element
 * (a pointwise kernel's own element, a row kernel's element r of row o; with
 * stores: every store, a pointwise kernel's) (4 f32, 8 bf16/f16), at most 8
 * elements; 0 when there is none. */
static int vec_width(R *r, int stores) {
  int w = 0, nl, *l = bf_list(r, &nl);
  for (int j = 0; j < nl; j++)
    if ((bf(r, l[j]) & (BF_CONTIG | BF_ROWV)) || (stores && (bf(r, l[j]) & BF_WRITTEN))) {
      int sz = dtype_size(r->p->b[l[j]].node->dtype);
      w = sz > w ? sz : w;
    }
  return !w ? 0 : 16 / w > 8 ? 8 : 16 / w;
}

/* M_COLUMN's columns per thread (probe r printed it): a vector's worth of
 * the widest buffer read at the kernel's element (r, o), when every such
 * buffer is aligned for it wherever o starts a vector (arena slots,
 * params and gradients are 256-aligned; an alias or a placed value at an
 * offset of whole vectors) and n_o is static and a multiple of it; else 0
 * (one column a thread). */
static int column_vec(R *r) {
  int64_t no;
  int w = vec_width(r, 0);
  if (!w || !dim_is_const(&r->k->outer, &no) || no % w)
    return 0;
  int nl, *l = bf_list(r, &nl);
  for (int j = 0; j < nl; j++) {
    if (!(bf(r, l[j]) & BF_CONTIG))
      continue;
    const Buffer *b = &r->p->b[l[j]];
    int64_t off = 0;
    while (b->home == HOME_ALIAS) {
      int64_t o;
      if (!dim_is_const(&b->off, &o))
        return 0;
      off += o;
      b = &r->p->b[b->index];
    }
    if ((b->home != HOME_ARENA && b->home != HOME_PARAM && b->home != HOME_GRAD) || off % w)
      return 0;
  }
  return w;
}

/* The output and reduced element counts at the dims' maxima of a reduction
 * kernel (probe r printed it) that could split its reduced elements: one
 * phase (a value over the input space after the reduction would need the
 * total), at most 8 reductions, all float (the partials' room); else 0. */
static int split_sizes(R *r, int64_t *no, int64_t *nr) {
  const Kernel *k = r->k;
  const char *err;
  if (r->nph != 1 || r->last_full || !k->nreds || k->nreds > 8)
    return 0;
  for (int i = 0; i < k->nreds; i++)
    if (!dtype_is_float(k->reds[i]->dtype))
      return 0;
  return dim_eval(r->g, &k->outer, r->p->sym, no, &err) && dim_eval(r->g, &k->rnum, r->p->sym, nr, &err);
}

/* The runtime's room for split partials (tgm_rt.h's TGM_CUDA_SPLIT_PARTS). */
#define SPLIT_PARTS ((int64_t)1 << 21)

/* CUDA: a block or column reduction with few tiles (at most 256: a block's
 * worth of output elements, or 32 columns, 32 cvec) and many reduced
 * elements each splits them over several blocks per output tile (as many as
 * tgm_split gives at the dims' maxima), when their partials fit the
 * runtime's room. */
static int split_ok(R *r) {
  int64_t no, nr;
  if ((r->mode != M_BLOCK && r->mode != M_COLUMN) || !split_sizes(r, &no, &nr))
    return 0;
  int64_t tw = r->mode == M_BLOCK ? 1 : 32 * (r->cvec ? r->cvec : 1), tiles = (no + tw - 1) / tw;
  int64_t per = (nr + split_per(r) - 1) / split_per(r), q = (split_total(r) + tiles - 1) / tiles;
  int64_t blocks = per < q ? per : q;
  blocks = blocks > 256 ? 256 : blocks;
  return tiles <= 256 && nr >= 2 * split_per(r) && tiles * tw * r->k->nreds * blocks <= SPLIT_PARTS;
}

/* CPU: a reduction to at most 8 values of at least 65536 elements each
 * splits them into CHUNKS chunks run in parallel, combined in order. */
static int cpu_split_ok(R *r) {
  int64_t no, nr;
  return r->mode == M_SERIAL && split_sizes(r, &no, &nr) && no <= 8 && nr >= 65536;
}

int render_check(BPass *p, const Kernel *k) {
  Arena a = {.fail_after = -1}; /* the check's own, freed after it: the scheduler asks thousands of times */
  int fail = 0;
  if (!walks_rows(k)) { /* pointwise: only a load of a value it stores (or of a reshape of one) fails */
    LoadWalk *w = p->walk; /* its own marks: the kernel's own values */
    kernel_loads(p, k, w);
    for (int i = 0; i < k->nouts; i++)
      w->own[k->outs[i]->id] = w->stamp;
    for (int q = 0; q < w->nlist && !fail; q++) {
      const Node *n = p->nodes[w->list[q]];
      fail = w->own[n->id] == w->stamp || w->own[layout_base(p, n)->id] == w->stamp ? 2 : 0;
    }
  } else {
    R *r = new_r(&a, p, k, &dl_cpu);
    choose_mode(r);
    r->has_bad = 0;
    loop_body(r);
    fail = r->fail;
  }
  arena_free(&a);
  return fail;
}

/* ---------------------------------------------------------------- files */

/* Each param's byte offset in the flat param (and gradient) buffer,
 * 256-aligned, and at [nparams] their total: one pass over the params
 * (a sum per pointer printed had been quadratic in them). */
int64_t *param_offsets(const Graph *g, Arena *a) {
  int64_t *o = arena_alloc(a, sizeof(int64_t) * (size_t)(g->nparams + 1));
  for (int k = 0; k < g->nparams; k++)
    o[k + 1] = o[k] + ((g->params[k].numel * dtype_size(g->params[k].dtype) + 255) & ~(int64_t)255);
  return o;
}

typedef struct File {
  Graph *g;
  Arena *a;
  const Dialect *d;
  const char *name, *NAME, *spec;
  const int64_t *pbyte; /* param_offsets */
  Buf kernels;       /* the kernel functions */
  Vec bodies, names; /* printed kernels (text without the name) and their names */
  int nk;
} File;

static const char *dt_c(File *f, DType t) {
  static const char *const n[] = {"F32", "BF16", "F16", "I32", "BOOL"};
  return arena_printf(f->a, "%s_%s", f->NAME, n[t]);
}

static const char *shape_text(const Graph *g, const Node *n) {
  return arena_printf(g->arena, "%s%s", dtype_names[n->dtype], shape_str(g, &n->shape));
}

/* The spec lines kernel k covers: its values' bindings
 * ("mlp.yaml:30 'h', 31 'logits'"; a library call's node first). */
const char *kernel_covers(const BPass *p, const Kernel *k, const char *spec) {
  Buf b;
  buf_init(&b, p->g->arena);
  int lines[16], nl = 0;
  for (int pass = 0; pass < 3; pass++)
    for (int i = 0; i < (pass == 0 ? k->anchor != NULL : pass == 1 ? k->nouts : k->nreds) && nl < 16; i++) {
      const Node *o = p->orig[(pass == 0 ? k->anchor : pass == 1 ? k->outs[i] : k->reds[i])->id];
      int dup = 0;
      for (int j = 0; j < nl; j++)
        dup |= lines[j] == o->loc.line;
      if (dup)
        continue;
      lines[nl++] = o->loc.line;
      buf_printf(&b, "%s%s:%d '%s'", nl > 1 ? ", " : "", nl > 1 ? "" : spec, o->loc.line, o->name ? o->name : "");
    }
  return b.p ? b.p : "";
}

static const char *kernel_ops(File *f, BPass *p, const Kernel *k) {
  Buf b;
  buf_init(&b, f->a);
  const char *seen[4];
  int ns = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < (pass ? k->nouts : k->nreds) && ns < 3; i++) {
      const Node *o = p->orig[(pass ? k->outs[i] : k->reds[i])->id];
      const char *nm = op_info[o->op].name;
      int dup = 0;
      for (int j = 0; j < ns; j++)
        dup |= !strcmp(seen[j], nm);
      if (!dup)
        seen[ns++] = nm, buf_printf(&b, "_%s", nm);
    }
  return b.p;
}

/* Loop kernel k ready to print for dialect d: a probe printing finds which
 * buffers it reads where, then the mapping (mode, index type, vectors,
 * split) is chosen from it. */
static R *configured(Arena *ka, BPass *p, const Kernel *k, const Dialect *d) {
  R *probe = new_r(ka, p, k, d);
  choose_mode(probe);
  loop_body(probe);
  R *r = new_r(ka, p, k, d);
  r->mode = probe->mode;
  r->has_bad = probe->saw_take;
  int cuda = !strcmp(d->name, "cuda");
  r->csplit = !cuda && cpu_split_ok(probe);
  r->leaf = !cuda && !r->csplit;
  r->vflat = NULL;
  r->rthreads = ROW_BLOCK;
  if (cuda) {
    r->it = fits_int(probe) ? "int" : "int64_t";
    if (r->mode == M_COLUMN && column_prefix(k) && probe->nph == 1 && !full_outputs(probe))
      r->cvec = probe->cvec = column_vec(probe);
    r->split = split_ok(probe);
    int nl, *l = bf_list(probe, &nl);
    if (r->mode == M_PW && (r->vec = vec_width(probe, 1)))
      for (int j = 0; j < nl; j++)
        if (bf(probe, l[j]) & (BF_CONTIG | BF_WRITTEN))
          bf_set(r, l[j], BF_CONTIG);
    int64_t rn;
    if (r->mode == M_WARP && dim_is_const(&k->rnum, &rn)) { /* short rows: several a warp, grp lanes each */
      const int w = kernel_rows(k) ? vec_width(probe, 0) : 0;
      const int64_t units = w ? (rn + w - 1) / w : rn; /* a lane's steps along the row, at one lane a row */
      while (r->grp > 1 && units <= r->grp / 2)
        r->grp /= 2;
    }
    if ((r->mode == M_WARP || r->mode == M_BLOCK) && kernel_rows(k) && (r->rvec = vec_width(probe, 0))) {
      for (int j = 0; j < nl; j++)
        if (bf(probe, l[j]) & (BF_CONTIG | BF_BCAST | BF_ROWV))
          bf_set(r, l[j], bf(probe, l[j]) & (BF_CONTIG | BF_BCAST | BF_ROWV));
      int64_t nr, per = r->mode == M_WARP ? r->grp : ROW_BLOCK; /* the threads of a row (the launch below) */
      if (r->mode == M_BLOCK && !k->nreds && dim_is_const(&k->rnum, &nr)) /* riders alone: a thread a vector of the row */
        per = r->rthreads = (int)(nr / r->rvec > 1024 ? 1024 : (nr / r->rvec + 31) / 32 * 32);
      if (r->mode == M_BLOCK && !r->split && !k->ncols && dim_is_const(&k->rnum, &nr) && nr / r->rvec > (int64_t)RCACHE_MAX * ROW_BLOCK) {
        r->rthreads = ROW_BLOCK_LONG; /* (and no registers for the row) */
        int64_t need = 0; /* the rows it reads at the row's positions, each of 16-byte vectors (else none) */
        for (int j = 0; j < nl && need >= 0; j++) {
          int fl = bf(probe, l[j]), sz = dtype_size(p->b[l[j]].node->dtype);
          if ((fl & BF_CONTIG) && !(fl & BF_WRITTEN))
            need = sz * r->rvec == 16 ? need + (nr * sz + 15) / 16 * 16 : -1;
        }
        if (need > 0 && need <= SROW_MAX) /* (loop_body keeps them there if it reads them twice) */
          r->srow = (int)need, r->rthreads = SROW_BLOCK;
      }
      else if (!r->split && dim_is_const(&k->rnum, &nr) && (nr / r->rvec + per - 1) / per <= (k->nreds ? RCACHE_MAX : RIDE_SLOTS / r->rvec))
        r->rcache = (int)((nr / r->rvec + per - 1) / per);
    }
  }
  return r;
}

/* Is printed kernel r safe with its in-place pair (plan.c's rule)? Its
 * stores of ip_out are all in one phase ph_w and not by one lane for the
 * others; a read of ip_in's bytes in an earlier phase, or among the values
 * over the output space printed before ph_w, is done before ph_w starts (a
 * row's threads have passed the phases' combines and the barrier that
 * loop_body prints at ph_w; the CPU runs a row on one thread); a read in
 * ph_w is at the element that the same loop iteration stores (the same
 * index, so the same address: same element size, both at their slot's
 * start). None later. A row is one block's or one warp's, never split over
 * blocks (split reductions store no value over their input anyway). */
static int ip_safe(const R *r) {
  int cuda = !strcmp(r->d->name, "cuda"), ph_w = -1;
  if (r->ip_bad || r->fail || !r->ip_st.n || r->split || r->csplit ||
      !(r->mode == M_PW || r->mode == M_SERIAL || (cuda && (r->mode == M_WARP || r->mode == M_BLOCK || r->mode == M_COLUMN))))
    return 0;
  for (int i = 0; i < r->ip_st.n; i++) {
    const IpAt *s = r->ip_st.p[i];
    if (ph_w >= 0 && s->ph != ph_w)
      return 0;
    ph_w = s->ph;
  }
  for (int i = 0; i < r->ip_ld.n; i++) {
    const IpAt *l = r->ip_ld.p[i];
    int same = 0, after = 0; /* at the element stored in the same loop; printed after a store there */
    for (int j = 0; j < r->ip_st.n && l->ph == ph_w; j++) {
      const IpAt *s = r->ip_st.p[j];
      if (s->loop != l->loop)
        continue;
      same |= !strcmp(s->ix, l->ix);
      after |= s->seq < l->seq && !(s->vec && l->vec);
    }
    if (l->ph > ph_w || (l->ph == ph_w && (!same || after)))
      return 0;
  }
  return 1;
}

int render_inplace_ok(BPass *p, const Kernel *k) {
  int ok = k->kind == K_LOOP;
  for (int t = 0; t < 2 && ok; t++) {
    Arena ka = {.fail_after = -1};
    R *r = configured(&ka, p, k, t ? &dl_cuda : &dl_cpu);
    loop_body(r);
    ok = r->ip_out >= 0 && ip_safe(r);
    arena_free(&ka);
  }
  return ok;
}

/* A printed kernel's parameters: the dims its text (body, and a leaf's
 * caller's sizes) uses, then the buffers r read or wrote, into sig (with
 * types) and args (the caller's names); returns whether none was added
 * (first stays 1). */
/* A kernel's parameters take their buffers' names as inside their block
 * (Buffer.pname: "ln_1_w", not "h_3_ln_1_w"), so that the instances of a
 * repeated block print one kernel, called with each instance's buffers.
 * The renaming: each buffer of params (Vecs of buffer indices + 1) whose
 * pname differs, from its name to its pname; none at all (n = 0) where two
 * of the final names meet or a new name is already an identifier of one of
 * the texts (a local, a dim, another parameter). */
typedef struct Rename {
  int n;
  const char **from, **to;
} Rename;

/* c starts a name in scope: not a member's (".y", "->y") */
static int scoped(const char *text, const char *c) {
  return c == text || (!idc(c[-1]) && c[-1] != '.' && !(c - text >= 2 && c[-1] == '>' && c[-2] == '-'));
}

/* The index in names[0..n) of the identifier c[0..len), or -1. */
static int find_id(const char *const *names, int n, const char *c, size_t len) {
  for (int i = 0; i < n; i++)
    if (strlen(names[i]) == len && !strncmp(c, names[i], len))
      return i;
  return -1;
}

static Rename param_names(Arena *a, const BPass *p, const Vec *const *params, int nparams, const char *const *texts,
                          int ntexts) {
  const Rename none = {0, NULL, NULL};
  int cap = 0, nb = 0;
  for (int v = 0; v < nparams; v++)
    cap += params[v] ? params[v]->n : 0;
  const Buffer **bs = arena_alloc(a, sizeof(Buffer *) * (size_t)(cap + 1)); /* the kernel's buffers, each once */
  for (int v = 0; v < nparams; v++)
    for (int i = 0; params[v] && i < params[v]->n; i++) {
      const Buffer *b = &p->b[(int)(intptr_t)params[v]->p[i] - 1];
      int seen = 0;
      for (int j = 0; j < nb && !seen; j++)
        seen = bs[j] == b;
      if (!seen)
        bs[nb++] = b;
    }
  Rename rn = {0, arena_alloc(a, sizeof(char *) * (size_t)(nb + 1)), arena_alloc(a, sizeof(char *) * (size_t)(nb + 1))};
  for (int j = 0; j < nb; j++)
    if (strcmp(bs[j]->pname, bs[j]->name))
      rn.from[rn.n] = bs[j]->name, rn.to[rn.n++] = bs[j]->pname;
  if (!rn.n)
    return none;
  for (int j = 0; j < nb; j++) /* the final names (the pnames) distinct */
    for (int l = j + 1; l < nb; l++)
      if (!strcmp(bs[j]->pname, bs[l]->pname))
        return none;
  for (int t = 0; t < ntexts; t++) /* and no new name already an identifier there (one pass over each text) */
    for (const char *c = texts[t]; c && *c;) {
      if (!idc(*c)) {
        c++;
        continue;
      }
      const char *e = c;
      while (idc(*e))
        e++;
      if (scoped(texts[t], c) && find_id(rn.to, rn.n, c, (size_t)(e - c)) >= 0)
        return none;
      c = e;
    }
  return rn;
}

/* text with each whole identifier rn.from[i] (comments too) written rn.to[i] */
static const char *rename_ids(Arena *a, const Rename *rn, const char *text) {
  if (!rn->n || !text)
    return text;
  Buf o;
  buf_init(&o, a);
  buf_printf(&o, "%s", "");
  for (const char *c = text; *c;) {
    if (!idc(*c)) {
      const char *e = c;
      while (*e && !idc(*e))
        e++;
      buf_putn(&o, c, (size_t)(e - c));
      c = e;
      continue;
    }
    const char *e = c;
    while (idc(*e))
      e++;
    const int i = scoped(text, c) ? find_id(rn->from, rn->n, c, (size_t)(e - c)) : -1;
    if (i >= 0)
      buf_putn(&o, rn->to[i], strlen(rn->to[i]));
    else
      buf_putn(&o, c, (size_t)(e - c));
    c = e;
  }
  return o.p;
}

static int kernel_params(File *f, R *r, const char *body, const char *size, Buf *sig, Buf *args, int first) {
  for (int s = 0; s < f->g->nsyms; s++) {
    const char *dn = arena_printf(f->a, "dim_%s", f->g->syms[s].derived ? arena_printf(f->a, "q%d", s) : f->g->syms[s].name);
    const char *hit = strstr(body, dn), *hit2 = strstr(size, dn);
    if ((hit && !idc(hit[strlen(dn)])) || (hit2 && !idc(hit2[strlen(dn)]))) {
      buf_printf(sig, "%s%s %s", first ? "" : ", ", r->it, dn);
      buf_printf(args, "%s%s", first ? "" : ", ", dn);
      first = 0;
    }
  }
  for (int i = 0; i < r->params.n; i++) {
    int bi = (int)(intptr_t)r->params.p[i] - 1;
    const Buffer *b = &r->p->b[bi];
    if (bi == r->ip_in || bi == r->ip_out) /* the same bytes under two names: no restrict */
      buf_printf(sig, "%s%s%s *%s%s", first ? "" : ", ", (bf(r, bi) & BF_WRITTEN) ? "" : "const ", ctype(b->node->dtype), b->name,
                 bi == r->ip_out ? arena_printf(f->a, " /* in place of %s */", r->p->b[r->ip_in].name) : "");
    else
      buf_printf(sig, "%s%s%s *%s %s", first ? "" : ", ", (bf(r, bi) & BF_WRITTEN) ? "" : "const ", ctype(b->node->dtype),
                 f->d->restr, b->name);
    buf_printf(args, "%s%s", first ? "" : ", ", b->name);
    first = 0;
  }
  return first;
}

/* The riders' finish (CUDA): each accumulator ca<i> the sum, over this
 * thread's rows of partials (`loop`: its variable from threadIdx.x / 32, a
 * step of the block's row groups; row `row` at split_part + row * the
 * partials' width), of its column o, four loads in flight; then the row
 * groups combined in order (tgm_column_sum). */
static void finish_rows(R *q, const Kernel *k, long long nr, const char *loop, const char *row, const char *what) {
  long long nc = (long long)k->ncols * nr;
  for (int i = 0; i < k->ncols; i++)
    emit(q, 1, "ca%d = 0;", i);
  emit(q, 1, "#pragma unroll 4");
  emit(q, 1, "for (int %s; %c += blockDim.x / 32) {  /* %s */", loop, loop[0], what);
  for (int i = 0; i < k->ncols; i++)
    emit(q, 1, "  ca%d += __ldcg(split_part + %s * %lld + %lld + o);", i, row, nc, (long long)i * nr);
  emit(q, 1, "}");
  for (int i = 0; i < k->ncols; i++)
    emit(q, 1, "ca%d = %s_column_sum(ca%d);", i, q->name, i);
}

/* The riders' results of row kernel k (printed as r): the sums' totals,
 * then their outs stored at each element o of the riders' result space.
 * CUDA: a kernel of its own over the blocks' partials (split_part, nb rows
 * of ncols * n_r floats), a block a tile of 32 columns and a share of the
 * rows (gridDim.y of them: RIDE_SPLIT), whose 8 row groups add rows y, y +
 * 8, ... of its share in order, four loads in flight, then combine in
 * order (tgm_column_sum) into a row of its own after the nb; the tile's
 * last block to finish adds those rows the same way and stores (one block
 * a tile reading all nb rows took 11 us, 24 blocks for GPT-2's 768
 * columns); the CPU: a loop over o reading the chunks' totals
 * (tot, summed in chunk order by the caller). Returns the body; *fr gets
 * the printer (its buffers). */
static const char *rider_finish(File *f, Arena *ka, BPass *p, const Kernel *k, const R *r, R **fr) {
  R *q = new_r(ka, p, k, f->d);
  int cuda = !strcmp(f->d->name, "cuda");
  int64_t nr = 0;
  dim_is_const(&k->rnum, &nr);
  q->mode = cuda ? M_COLUMN : M_SERIAL;
  q->it = r->it;
  q->outer_shape.rank = 0;
  for (int j = 0; j < k->full.rank; j++)
    if (k->axes >> j & 1)
      q->outer_shape.d[q->outer_shape.rank++] = k->full.d[j];
  q->outer_sh = &q->outer_shape;
  if (cuda) /* (the CPU's finish is in the caller, whose n_o is the rows') */
    emit(q, 0, "const %s n_o = %lld;", q->it, (long long)nr);
  open_level(q);
  if (cuda) {
    head(q, "for (%s o0 = blockIdx.x * (%s)32; o0 < n_o; o0 += (%s)gridDim.x * 32) {", q->it, q->it, q->it);
    head(q, "  const int live = o0 + threadIdx.x %% 32 < n_o;  /* the tile's last columns may be past the end */");
    head(q, "  const %s o = live ? o0 + threadIdx.x %% 32 : n_o - 1;", q->it);
    set_var_level(q, "o0", 1);
    set_var_level(q, "live", 1);
    long long nc = (long long)(k->ncols * nr);
    for (int i = 0; i < k->ncols; i++)
      emit(q, 1, "float ca%d;", i);
    emit(q, 1, "const int b0 = blockIdx.y * nb / gridDim.y, b1 = (blockIdx.y + 1) * nb / gridDim.y;  /* this block's rows */");
    finish_rows(q, k, nr, "b = b0 + threadIdx.x / 32; b < b1", "b", "the rows of partials, in order");
    emit(q, 1, "if (threadIdx.x / 32 == 0 && live) {  /* this block's sums, after the nb rows */");
    for (int i = 0; i < k->ncols; i++)
      emit(q, 1, "  split_part[(nb + blockIdx.y) * %lld + %lld + o] = ca%d;", nc, (long long)(i * nr), i);
    emit(q, 1, "}");
    emit(q, 1, "if (!%s_split_last(&split_count[o0 / 32]))  /* the tile's last block to finish goes on */", q->name);
    emit(q, 1, "  continue;");
    finish_rows(q, k, nr, "y = threadIdx.x / 32; y < (int)gridDim.y", "(nb + y)", "the tile's blocks' sums, in order");
  } else {
    head(q, "for (int64_t o = 0; o < %lld; o++) {  /* the riders' results */", (long long)nr);
  }
  set_var_level(q, "o", 1);
  for (int i = 0; i < k->ncols; i++) {
    const Node *c = k->cols[i];
    const char *v = arena_printf(q->a, "s%d", q->nvars++);
    const char *tot = cuda ? arena_printf(q->a, "ca%d", i) : arena_printf(q->a, "tot[%lld + o]", (long long)(i * nr));
    emit(q, 1, "const %s %s = %s;", vtype(c->dtype), v, half_round(q, c->dtype, arena_printf(q->a, "(%s)%s", vtype(c->dtype), tot)));
    set_var_level(q, v, 1);
    set_acc(q, c, v);
  }
  for (int i = 0; i < k->nouts; i++)
    if (cdep(q, k->outs[i])) {
      Ix xi = ix_make(&k->outs[i]->shape, "o");
      store(q, k->outs[i], &xi, 1);
    }
  close_level(q);
  *fr = q;
  return prune(ka, q->lv[0].p);
}

/* The blocks of a CUDA row kernel with riders (above): whole rounds of
 * RIDE_SMS where the runtime's partials hold them, else as many as they
 * hold. */
static int ride_blocks(const R *r, const Kernel *k) {
  int64_t nr = 1;
  dim_is_const(&k->rnum, &nr);
  const int64_t room = SPLIT_PARTS / (k->ncols * nr) - RIDE_SPLIT; /* (and the finish's rows) */
  const int64_t per_sm = r->mode == M_BLOCK && r->rthreads > 288 ? 1152 / r->rthreads : 4;
  const int64_t want = RIDE_SMS * per_sm;
  return (int)(room >= want ? want : room >= RIDE_SMS ? room / RIDE_SMS * RIDE_SMS : room);
}

/* Print loop kernel k (once per file: an identical kernel, of another pass
 * or of another instance of a repeated block with its parameters named as
 * inside the block (param_names), is reused) and its call into `call`. */
static void loop_kernel(File *f, BPass *p, Kernel *k, Buf *call) {
  Arena ka = {.fail_after = -1}; /* the walkers' per-node tables, freed after each kernel: memory stays linear */
  R *r = configured(&ka, p, k, f->d);
  int cuda = !strcmp(f->d->name, "cuda");
  loop_body(r);
  if (r->ip_out >= 0 && !ip_safe(r))
    die("render: %s is written over %s, which is not safe in the printed kernel", p->b[r->ip_out].name,
        p->b[r->ip_in].name);
  r->d->close_kernel(r);
  if (r->fail) {
    for (int i = 0; i < k->nouts; i++)
      fprintf(stderr, "out %d %s %s\n", k->outs[i]->id, op_info[k->outs[i]->op].name, shape_str(f->g, &k->outs[i]->shape));
    for (int i = 0; i < k->nreds; i++)
      fprintf(stderr, "red %d %s %s\n", k->reds[i]->id, op_info[k->reds[i]->op].name, shape_str(f->g, &k->reds[i]->shape));
    fprintf(stderr, "%s\n", r->lv[0].p);
    die(r->fail == 2 ? "render: kernel loading a value it stores" : "render: kernel with a reduction read at another element");
  }
  /* the signature: the dims it uses, then its buffers */
  Buf sig, args;
  buf_init(&sig, f->a);
  buf_init(&args, f->a);
  const char *body = arena_strdup(f->a, prune(&ka, r->lv[0].p));
  /* a leaf's caller: the loop's size and the condition for threads (as the parallel loops' above) */
  const char *size = "";
  if (r->leaf && !walks_rows(k))
    size = arena_printf(f->a, "  const int64_t n = %s;\n", c_dim(f->g, &k->numel));
  else if (r->leaf)
    size = arena_printf(f->a, "  const int64_t n_o = %s, n_r = %s;\n", c_dim(f->g, &k->outer), c_dim(f->g, &k->rnum));
  R *q = NULL; /* the riders' results (rider_finish) */
  const char *fbody = k->ncols ? rider_finish(f, &ka, p, k, r, &q) : "";
  int first = kernel_params(f, r, body, size, &sig, &args, 1);
  if (r->split || (k->ncols && cuda)) { /* (riders: their rows of partials) */
    buf_printf(&sig, "%sfloat *split_part%s", first ? "" : ", ", r->split ? ", unsigned *split_count" : "");
    buf_printf(&args, "%s%s_cuda_split_part(m->cx)%s", first ? "" : ", ", f->name,
               r->split ? arena_printf(f->a, ", %s_cuda_split_count(m->cx)", f->name) : "");
    first = 0;
  }
  if (r->has_bad && cuda) {
    buf_printf(&sig, "%sunsigned long long *bad", first ? "" : ", ");
    buf_printf(&args, "%s%s_cuda_bad_ptr(m->cx)", first ? "" : ", ", f->name);
  }
  /* riders: the finish's signature (CUDA: its kernel's; the CPU: the caller's, past the leaf's) */
  Buf fsig, fargs;
  buf_init(&fsig, f->a);
  buf_init(&fargs, f->a);
  int ffirst = 1;
  if (q && cuda) {
    buf_printf(&fsig, "int nb, float *split_part, unsigned *split_count");
    kernel_params(f, q, fbody, "", &fsig, &fargs, 0);
  } else if (q) { /* the leaf's dims and buffers, the finish's dims, then the buffers the finish adds */
    ffirst = kernel_params(f, r, body, arena_printf(f->a, "%s%s", size, fbody), &fsig, &fargs, 1);
    for (int i = 0; i < q->params.n; i++) {
      int bi = (int)(intptr_t)q->params.p[i] - 1, dup = 0;
      for (int j = 0; j < r->params.n && !dup; j++)
        dup = (int)(intptr_t)r->params.p[j] - 1 == bi;
      if (dup)
        continue;
      const Buffer *bb = &p->b[bi];
      buf_printf(&fsig, "%s%s%s *%s %s", ffirst ? "" : ", ", (bf(q, bi) & BF_WRITTEN) ? "" : "const ", ctype(bb->node->dtype),
                 f->d->restr, bb->name);
      buf_printf(&fargs, "%s%s", ffirst ? "" : ", ", bb->name);
      ffirst = 0;
    }
  }
  /* inside the kernel, its riders' finish and its CPU caller, the buffers go by their block's names (each
   * function's own renaming; iargs: the caller's arguments to the kernel's loop, in the caller's names) */
  const Vec *kv[1] = {&r->params}, *fv[2] = {q ? &q->params : NULL, q && !cuda ? &r->params : NULL};
  const char *kt[] = {body, size, sig.p}, *ft[] = {fbody, fsig.p, size};
  const Rename rk = param_names(f->a, p, kv, 1, kt, 3), rf = param_names(f->a, p, fv, 2, ft, 3);
  body = rename_ids(f->a, &rk, body);
  fbody = rename_ids(f->a, &rf, fbody);
  const char *isig = rename_ids(f->a, &rk, sig.p), *ifsig = rename_ids(f->a, &rf, fsig.p);
  const char *iargs = rename_ids(f->a, q && !cuda ? &rf : &rk, args.p);
  const char *ret = r->has_bad && !cuda        ? "int64_t"
                    : r->srow_used ? arena_printf(f->a, "void __launch_bounds__(%d, 2)", r->rthreads) /* (two blocks an SM) */
                    : r->rthreads > ROW_BLOCK ? arena_printf(f->a, "void __launch_bounds__(%d)", r->rthreads) /* (its register cap) */
                                              : "void";
  const char *text = arena_printf(f->a, "(%s%s%s) {\n%s%s}\n", !r->leaf ? "" : first ? "int64_t lo, int64_t hi" : "int64_t lo, int64_t hi, ",
                                  isig ? isig : "", q && !cuda ? ", double *restrict cpart" : "",
                                  r->has_bad && !cuda ? "  int64_t bad = INT64_MAX;\n" : "", body);
  /* (the CPU caller's sizes are outside the loop's text: two fills of the same loop and different sizes differ) */
  const char *key = arena_printf(f->a, "%s/* size */%s/* riders */%s%s", text, size, q && ifsig ? ifsig : "", q ? fbody : "");
  const char *kn = NULL;
  for (int i = 0; i < f->bodies.n; i++)
    if (!strcmp(f->bodies.p[i], key))
      kn = f->names.p[i];
  if (!kn) {
    kn = arena_printf(f->a, "k%d%s", ++f->nk, kernel_ops(f, p, k));
    vec_push(f->a, &f->bodies, (void *)key);
    vec_push(f->a, &f->names, (void *)kn);
    static const char *const modes[] = {"one thread per element", "one thread per output element",
                                        "one warp per output element", "one block per output element",
                                        "32 output elements per block, 32 threads each", ""};
    buf_printf(&f->kernels, "\n/* %s: %s%s  (%s)%s%s */\n%s%s %s %s%s%s", kn, kernel_covers(p, k, f->spec),
               k->nreds ? arena_printf(f->a, "; reduces %s of %s", c_dim(f->g, &k->rnum), shape_str(f->g, &k->full)) : "",
               r->vec               ? arena_printf(f->a, "%d elements per thread: vector loads and stores", r->vec)
               : r->cvec            ? arena_printf(f->a, "%d output elements per block, %d a thread, 32 threads each", 32 * r->cvec, r->cvec)
               : cuda && r->mode == M_WARP && r->grp < 32
                   ? arena_printf(f->a, "%d output elements per warp, %d threads each", 32 / r->grp, r->grp)
               : cuda && !k->nreds && k->ncols ? "one block per row"
               : cuda               ? modes[r->mode]
               : r->mode == M_CTILE ? "tiles of " CTILE_TEXT " output elements, a vector loop over each tile per reduced element"
               : r->csplit          ? arena_printf(f->a, "the reduced elements in %d chunks in parallel", CHUNKS)
               : k->nreds           ? "a loop per output element"
               : k->ncols           ? "a loop per row"
                                    : "a loop over the elements",
               !q ? ""
               : cuda
                   ? arena_printf(f->a, ";\n * and %d rider%s: sum%s over its rows' positions, each thread's in %s, then each "
                                        "block's in split_part (%s_cols adds them)",
                                  k->ncols, k->ncols > 1 ? "s" : "", k->ncols > 1 ? "s" : "",
                                  r->mode == M_BLOCK ? "its registers" : "the block's shared memory", kn)
                   : arena_printf(f->a, ";\n * and %d rider%s: sum%s over its rows' positions, into cpart (the caller adds the "
                                        "chunks' in order)",
                                  k->ncols, k->ncols > 1 ? "s" : "", k->ncols > 1 ? "s" : ""),
               !r->leaf ? ""
                        : arena_printf(f->a, "\n * %s_part: the loop, over %s [lo, hi); compiled per ISA (see the top)",
                                       kn, k->ncols && !k->nreds ? "rows" : !k->nreds ? "elements"
                                           : r->mode == M_CTILE ? "the tiles of output elements" : "output elements"),
               r->leaf ? arena_printf(f->a, "%s_CLONES ", f->NAME) : "", f->d->qual, ret, kn, r->leaf ? "_part" : "", text);
    if (q && cuda)
      buf_printf(&f->kernels, "\n/* %s_cols: %s's riders' totals (the blocks' partials added in block order) and the values "
                              "over their result space */\n%s void %s_cols(%s) {\n%s}\n",
                 kn, kn, f->d->qual, kn, ifsig, fbody);
    if (r->leaf && q) { /* the rows in CHUNKS fixed chunks, each chunk's riders' sums added in chunk order */
      int64_t nr = 0;
      dim_is_const(&k->rnum, &nr);
      long long nc = (long long)(k->ncols * nr);
      buf_printf(&f->kernels, "%s void %s(%s) {\n%s", f->d->qual, kn, ifsig ? ifsig : "", size);
      buf_printf(&f->kernels, "  double tot[%lld];  /* the riders' sums, then the chunks' added in order */\n", nc);
      buf_printf(&f->kernels, "  for (int64_t j = 0; j < %lld; j++)\n    tot[j] = 0;\n", nc);
      buf_printf(&f->kernels, "  %s_OMP(parallel for ordered schedule(static, 1) if (n_o * n_r > 16384))\n", f->NAME);
      buf_printf(&f->kernels, "  for (int64_t c = 0; c < %d; c++) {\n    double part[%lld];\n", CHUNKS, nc);
      buf_printf(&f->kernels, "    for (int64_t j = 0; j < %lld; j++)\n      part[j] = 0;\n", nc);
      buf_printf(&f->kernels, "    %s_part(c * n_o / %d, (c + 1) * n_o / %d%s%s, part);\n", kn, CHUNKS, CHUNKS,
                 first ? "" : ", ", iargs ? iargs : "");
      buf_printf(&f->kernels, "    %s_OMP(ordered)\n    for (int64_t j = 0; j < %lld; j++)\n      tot[j] += part[j];\n  }\n",
                 f->NAME, nc);
      buf_printf(&f->kernels, "%s}\n", fbody);
    } else if (r->leaf) { /* the kernel: the threads run the loop over the chunks they take in turn */
      const char *cond = k->nreds ? "n_o * n_r > 16384" : "n > 16384";
      buf_printf(&f->kernels, "%s %s %s(%s) {\n%s%s", f->d->qual, ret, kn, isig, size, r->has_bad ? "  int64_t bad = INT64_MAX;\n" : "");
      buf_printf(&f->kernels, "  int64_t next = 0;  /* the next chunk the threads take (%s_chunk) */\n", f->name);
      buf_printf(&f->kernels, "  %s_OMP(parallel if (%s)%s)\n  {\n    int64_t lo, hi;\n    while (%s_chunk(&next, %s, %d, &lo, &hi))",
                 f->NAME, cond, r->has_bad ? " reduction(min : bad)" : "", f->name, k->nreds ? "n_o" : "n",
                 !k->nreds ? 16 : r->mode == M_CTILE ? CTILE : 1);
      const char *part = arena_printf(f->a, "%s_part(lo, hi%s%s)", kn, first ? "" : ", ", iargs);
      if (r->has_bad) /* (no local for the part's result: it could shadow a parameter) */
        buf_printf(&f->kernels, "\n      bad = %s_min64(bad, %s);\n  }\n", f->name, part);
      else
        buf_printf(&f->kernels, "\n      %s;\n  }\n", part);
      buf_printf(&f->kernels, "%s}\n", r->has_bad ? "  return bad == INT64_MAX ? -1 : bad;\n" : "");
    }
  }
  k->name = kn;
  if (cuda) {
    const char *n = walks_rows(k) ? c_dim(f->g, &k->outer) : c_dim(f->g, &k->numel);
    const char *grid = r->mode == M_WARP    ? arena_printf(f->a, "%s_blocks(%s, %d), %d", f->name, n, WARP_BLOCK / r->grp, WARP_BLOCK)
                       : r->mode == M_BLOCK ? arena_printf(f->a, "%s_blocks(%s, 1), %d", f->name, n, r->rthreads)
                       : r->mode == M_COLUMN ? arena_printf(f->a, "%s_blocks(%s, %d), %d", f->name, n, 32 * (r->cvec ? r->cvec : 1),
                                                           r->cvec ? COLUMN_VBLOCK : 1024)
                                            : arena_printf(f->a, "%s_blocks(%s, %d), 256", f->name, n, 256 * (r->vec ? r->vec : 1));
    if (r->split) { /* gridDim.y: the blocks per output tile */
      const int tw = 32 * (r->cvec ? r->cvec : 1); /* a column tile's outputs */
      const char *tiles = r->mode == M_BLOCK ? n : arena_printf(f->a, "((%s) + %d) / %d", n, tw - 1, tw);
      grid = arena_printf(f->a, "dim3(%s_blocks(%s, %d), %s_split(%s, %d, %s, %d)), %d", f->name, n, r->mode == M_BLOCK ? 1 : tw,
                          f->name, c_dim(f->g, &k->rnum), split_per(r), tiles, split_total(r),
                          r->mode == M_BLOCK ? 512 : r->cvec ? COLUMN_VBLOCK : 1024);
    }
    if (q) { /* at most a fixed number of blocks, each adding its rows' riders into a row of partials, then the finish */
      int64_t nr = 0;
      dim_is_const(&k->rnum, &nr);
      const char *nb = arena_printf(f->a, "%s_blocks_most(%s, %d, %d)", f->name, n, r->mode == M_BLOCK ? 1 : WARP_BLOCK / r->grp,
                                    ride_blocks(r, k));
      buf_printf(call, "  %s<<<%s, %d, 0, st>>>(%s);\n", kn, nb, r->mode == M_BLOCK ? r->rthreads : WARP_BLOCK, args.p);
      buf_printf(call, "  %s_cols<<<dim3(%s_blocks(%lld, 32), %d), 256, 0, st>>>((int)%s, %s_cuda_split_part(m->cx), "
                       "%s_cuda_split_count(m->cx)%s);\n",
                 kn, f->name, (long long)nr, RIDE_SPLIT, nb, f->name, f->name, fargs.p ? fargs.p : ""); /* (fargs: ", name, ...") */
    } else if (r->srow_used) { /* (dynamic shared memory past 48 KB is asked for; an error shows at the pass's end) */
      buf_printf(call, "  cudaFuncSetAttribute(%s, cudaFuncAttributeMaxDynamicSharedMemorySize, %d);\n", kn, r->srow_used);
      buf_printf(call, "  %s<<<%s, %d, st>>>(%s);\n", kn, grid, r->srow_used, args.p);
    } else
      buf_printf(call, "  %s<<<%s, 0, st>>>(%s);\n", kn, grid, args.p);
  } else if (r->has_bad) {
    buf_printf(call, "  bad = %s(%s);\n", kn, args.p);
  } else {
    buf_printf(call, "  %s(%s);\n", kn, q ? fargs.p : args.p);
  }
  if (r->has_bad && !cuda) {
    const Node *t = NULL;
    for (int i = 0; i < p->n && !t; i++)
      if (p->nodes[i]->op == OP_TAKE)
        t = p->nodes[i];
    const Node *o = p->orig[t->id];
    buf_printf(call, "  if (bad >= 0)\n    return %s_fail(m, %s_EDATA, \"%s in '%s' (%s:%d): a target at position %%lld is outside [0, %s) (ignore_index %lld)\", (long long)bad);\n",
               f->name, f->NAME, op_info[o->op].name, o->name ? o->name : "?", f->spec, o->loc.line,
               dim_str(f->g, &t->in[0]->shape.d[t->axis]), (long long)t->ignore_index);
  }
  arena_free(&ka);
}

static const char *bname(BPass *p, const Node *n) {
  int bi = p->buf[n->id];
  if (bi < 0)
    die("render: %s (%%%d, pass %s) has no buffer", op_info[n->op].name, n->id, pass_names[p->kind]);
  return p->b[bi].name;
}

/* A shape as a C array local named nm. */
static const char *shape_arr_of(File *f, Buf *b, const Shape *s, const char *nm) {
  buf_printf(b, "  const int64_t %s[%d] = {", nm, s->rank ? s->rank : 1);
  if (!s->rank)
    buf_printf(b, "1");
  for (int i = 0; i < s->rank; i++)
    buf_printf(b, "%s%s", i ? ", " : "", c_dim(f->g, &s->d[i]));
  buf_printf(b, "};\n");
  return nm;
}

static const char *shape_arr(File *f, Buf *b, const Node *n, const char *nm) { return shape_arr_of(f, b, &n->shape, nm); }

static const char *prod(File *f, const Shape *s, int from, int to) {
  Dim d = dim_const(1);
  Loc none = {0, 0};
  for (int i = from; i < to; i++)
    d = dim_mul(d, s->d[i], none);
  return c_dim(f->g, &d);
}

/* A GEMM as one strided-batch call of the runtime's GEMM: transposed views
 * of stored values are transpose flags, a linear's bias and the epilogue the
 * schedule fused (relu or gelu, then a residual add) are applied where the
 * result is stored. */
static void gemm_call(File *f, BPass *p, const Kernel *k, Buf *b) {
  const Node *n = k->anchor, *out = k->outs[0];
  int cuda = !strcmp(f->d->name, "cuda");
  int ta, tb;
  const Node *sa = gemm_operand(n, 0, &ta), *sb = gemm_operand(n, 1, &tb);
  const Shape *ys = &n->shape;
  const char *M, *N, *K, *batch, *lda, *ldb;
  const Node *a = n->in[0], *bb = n->in[1];
  if (n->op == OP_LINEAR) { /* x [..., in] @ w[out, in]^T: w is B transposed */
    M = prod(f, &a->shape, 0, a->shape.rank - 1);
    K = c_dim(f->g, &a->shape.d[a->shape.rank - 1]);
    N = c_dim(f->g, &bb->shape.d[0]);
    batch = "1";
    tb = !tb;
  } else {
    M = c_dim(f->g, &a->shape.d[a->shape.rank - 2]);
    K = c_dim(f->g, &a->shape.d[a->shape.rank - 1]);
    N = c_dim(f->g, &bb->shape.d[bb->shape.rank - 1]);
    batch = prod(f, ys, 0, ys->rank - 2);
  }
  /* leading dims: the stored matrix's last dim */
  lda = c_dim(f->g, &sa->shape.d[sa->shape.rank - 1]);
  ldb = c_dim(f->g, &sb->shape.d[sb->shape.rank - 1]);
  int abatch = n->op == OP_MATMUL && a->shape.rank > 2, bbatch = n->op == OP_MATMUL && bb->shape.rank > 2;
  static const char *const acts[] = {"NONE", "RELU", "GELU", "GELU_TANH"};
  int act = !k->act ? 0 : k->act->op == OP_RELU ? 1 : k->act->flag ? 3 : 2;
  int dact = k->act && k->act->op == OP_GELU_GRAD; /* the activation's gradient at aux */
  buf_printf(b, "  {  /* %s%s%s%s%s */\n", op_info[n->op].name, k->act ? arena_printf(f->a, ", %s", op_info[k->act->op].name) : "",
             k->aux ? (dact ? " of aux" : ", its input stored as aux") : "", k->add ? ", + residual" : "",
             k->bgrad ? ", and the sum over k of op(A) (a bias's gradient)" : "");
  buf_printf(b, "    const %s_gemm gemm = {%s, %d, %d, %s, %s, %s, %s,\n", f->name, dt_c(f, n->dtype), ta, tb, M, N, K, batch);
  buf_printf(b, "                       %s, %s, %s, %s, %s, %s,\n", bname(p, sa), lda,
             abatch ? arena_printf(f->a, "(%s) * (%s)", M, K) : "0", bname(p, sb), ldb,
             bbatch ? arena_printf(f->a, "(%s) * (%s)", K, N) : "0");
  buf_printf(b, "                       %s, %s, (%s) * (%s), %s, %s_ACT_%s, %s, %s, 0, %d, %s};\n", bname(p, out), N, M,
             N, n->op == OP_LINEAR && n->nin > 2 && n->in[2] ? bname(p, n->in[2]) : "NULL", f->NAME, acts[act],
             k->aux ? bname(p, k->aux) : "NULL", k->res ? bname(p, k->res) : "NULL", dact,
             k->bgrad ? bname(p, k->bgrad) : "NULL");
  if (cuda)
    buf_printf(b, "    CK(%s_cuda_gemm(m->cx, &gemm));\n  }\n", f->name);
  else
    buf_printf(b, "    if (%s_cpu_gemm(&gemm))\n      return %s_fail(m, %s_EINVAL, \"GEMM of %s: bad arguments\");\n  }\n", f->name,
               f->name, f->NAME, op_info[n->op].name);
}

/* The local `const NAME_view nm` of value n (NULL: absent, shaped s) where
 * it is in memory (layout.c): its buffer, or the buffer of the value a
 * view of it reads, at strides. */
static void view_decl(File *f, BPass *p, Buf *b, const char *nm, const Node *n, const Shape *s) {
  Layout l;
  const char *at = "NULL";
  if (n) {
    if (!layout_of(p, n, &l))
      die("render: %s (%%%d) is neither stored nor a view of a stored value", op_info[n->op].name, n->id);
    if (p->place[n->id] || l.host == n) { /* its own buffer (a placed one's includes the offset) */
      at = bname(p, n);
    } else {
      at = bname(p, l.host);
      if (l.off.n)
        at = arena_printf(f->a, "%s + %s", at, c_dim(f->g, &l.off));
    }
    at = arena_printf(f->a, "(void *)(%s)", at);
  } else {
    Node shaped = {0};
    shaped.shape = *s;
    layout_contig(&shaped, &l);
  }
  buf_printf(b, "    const %s_view %s = {%s, %d, {", f->name, nm, at, s->rank);
  for (int i = 0; i < s->rank; i++)
    buf_printf(b, "%s%s", i ? ", " : "", c_dim(f->g, &s->d[i]));
  buf_printf(b, "}, {");
  for (int i = 0; i < s->rank; i++)
    buf_printf(b, "%s%s", i ? ", " : "", c_dim(f->g, &l.st[i]));
  buf_printf(b, "}};\n");
}

/* A library call (GEMM, attention, embedding, dropout). */
static void call_kernel(File *f, BPass *p, const Kernel *k, int ki, Buf *b) {
  const Node *n = k->anchor;
  if (k->kind == K_GEMM && gemm_strided(n)) {
    gemm_call(f, p, k, b);
    return;
  }
  int cuda = !strcmp(f->d->name, "cuda");
  const char *o = cuda ? "CK(" : "", *c = cuda ? ")" : "", *rt = cuda ? "cuda" : "cpu", *cx = cuda ? "m->cx, " : "";
  const char *dt = dt_c(f, n->dtype), *y = bname(p, n);
  int views = n->op == OP_ATTENTION || n->op == OP_ATTENTION_LSE || n->op == OP_ATTENTION_BACKWARD; /* (view_decl) */
  const char *a0 = !views && n->nin > 0 && n->in[0] ? bname(p, n->in[0]) : "NULL";
  const char *a1 = !views && n->nin > 1 && n->in[1] ? bname(p, n->in[1]) : "NULL";
  const char *a2 = !views && n->nin > 2 && n->in[2] ? bname(p, n->in[2]) : "NULL";
  const Node *src = p->orig[n->id];
  const char *where = arena_printf(f->a, "%s in '%s' (%s:%d)", op_info[src->op].name, src->name ? src->name : "?", f->spec, src->loc.line);
  switch (n->op) {
  case OP_LINEAR: {
    const Shape *s = &n->in[0]->shape, *w = &n->in[1]->shape;
    buf_printf(b, "  %s%s_%s_linear(%s%s, %s, %s, %s, %s, %s, %s, %s)%s;\n", o, f->name, rt, cx, dt, a0, a1, a2, y,
               prod(f, s, 0, s->rank - 1), c_dim(f->g, &w->d[1]), c_dim(f->g, &w->d[0]), c);
    break;
  }
  case OP_MATMUL: {
    const char *sa = shape_arr(f, b, n->in[0], arena_printf(f->a, "sa%d", ki));
    const char *sb = shape_arr(f, b, n->in[1], arena_printf(f->a, "sb%d", ki));
    const char *sy = shape_arr(f, b, n, arena_printf(f->a, "sy%d", ki));
    buf_printf(b, "  %s%s_%s_matmul(%s%s, %s, %d, %s, %s, %d, %s, %s, %d, %s)%s;\n", o, f->name, rt, cx, dt, a0,
               n->in[0]->shape.rank, sa, a1, n->in[1]->shape.rank, sb, y, n->shape.rank, sy, c);
    break;
  }
  case OP_EMBEDDING: case OP_EMBEDDING_BACKWARD: {
    int bwd = n->op == OP_EMBEDDING_BACKWARD;
    const Shape *t = bwd ? &n->shape : &n->in[1]->shape;
    const char *nidx = prod(f, &n->in[0]->shape, 0, n->in[0]->shape.rank);
    const char *fn = bwd ? "embedding_backward" : "embedding";
    if (cuda)
      buf_printf(b, "  CK(%s_cuda_%s(m->cx, %s, %s, %s, %s, %s, %s, %s));\n", f->name, fn, dt, a0, nidx, a1,
                 c_dim(f->g, &t->d[0]), c_dim(f->g, &t->d[1]), y);
    else {
      buf_printf(b, "  bad = %s_cpu_%s(%s, %s, %s, %s, %s, %s, %s);\n", f->name, fn, dt, a0, nidx, a1,
                 c_dim(f->g, &t->d[0]), c_dim(f->g, &t->d[1]), y);
      buf_printf(b, "  if (bad >= 0)\n    return %s_fail(m, %s_EDATA, \"%s: an index at position %%lld is outside [0, %s)\", (long long)bad);\n",
                 f->name, f->NAME, where, dim_str(f->g, &t->d[0]));
    }
    break;
  }
  case OP_DROPOUT:
    buf_printf(b, "  %s%s_%s_dropout(%s%s, %s, %s, %s, %s, %s_info.seed, %du, (uint64_t)m->step)%s;\n", o, f->name, rt,
               cx, dt, a0, y, prod(f, &n->shape, 0, n->shape.rank), flit(f->a, n->f[0]), f->name, n->index, c);
    break;
  case OP_ATTENTION: case OP_ATTENTION_LSE: case OP_ATTENTION_BACKWARD: {
    /* one call for the kernel's outputs: the result and its lse, or the wanted gradients; every tensor as a
     * view (layout.c: q, k, v read where they are, results written where their readers want them) */
    const Node *q = n->in[0], *out[3] = {NULL, NULL, NULL};
    for (int i = 0; i < k->nouts; i++)
      out[k->outs[i]->op == OP_ATTENTION_BACKWARD ? k->outs[i]->axis : k->outs[i]->op == OP_ATTENTION_LSE] = k->outs[i];
    int bwd = n->op == OP_ATTENTION_BACKWARD;
    Shape ys = n->shape; /* the forward result's shape */
    if (bwd)
      ys = n->in[3]->shape;
    else if (!out[0]) {
      const Shape *v = &n->in[2]->shape;
      ys.d[ys.rank++] = v->d[v->rank - 1];
    }
    const char *scale = n->has_f[0] ? arena_printf(f->a, "%.17g", n->f[0])
                                    : arena_printf(f->a, "1.0 / sqrt((double)(%s))", c_dim(f->g, &q->shape.d[q->shape.rank - 1]));
    buf_printf(b, "  {  /* %s */\n", bwd ? "attention's backward" : out[0] ? "attention" : "attention's row log-sum-exp");
    static const char *const in_nm[4] = {"qv", "kv", "vv", "dyv"}, *const out_nm[3] = {"dqv", "dkv", "dvv"};
    for (int j = 0; j < 3 + bwd; j++)
      view_decl(f, p, b, in_nm[j], n->in[j], &n->in[j]->shape);
    if (bwd) {
      for (int j = 0; j < 3; j++) { /* [batch of dy..., rows and columns of operand j] */
        const Shape *os = &n->in[j]->shape;
        Shape gs = ys;
        gs.d[gs.rank - 2] = os->d[os->rank - 2];
        gs.d[gs.rank - 1] = os->d[os->rank - 1];
        view_decl(f, p, b, out_nm[j], out[j], &gs);
      }
      buf_printf(b, "    %s%s_%s_attention_backward(%s%s, &qv, &kv, &vv, &dyv, %s, %s, &dqv, &dkv, &dvv, %d, %s)%s;\n  }\n", o,
                 f->name, rt, cx, dt, bname(p, n->in[4]), bname(p, n->in[5]), n->flag, scale, c);
    } else {
      view_decl(f, p, b, "yv", out[0], &ys);
      buf_printf(b, "    %s%s_%s_attention(%s%s, &qv, &kv, &vv, &yv, %d, %s, %s)%s;\n  }\n", o, f->name, rt, cx, dt,
                 n->flag, scale, out[1] ? bname(p, out[1]) : "NULL", c);
    }
    break;
  }
  default:
    die("render: no library call for %s", op_info[n->op].name);
  }
}

static const char *bytes_c(File *f, const Node *n) {
  return arena_printf(f->a, "(size_t)(%s) * %d", prod(f, &n->shape, 0, n->shape.rank),
                      n->dtype == DT_BOOL ? 1 : dtype_size(n->dtype));
}

/* Data parallel (compile.distributed): the kernel after which each param's
 * gradient is final, its last writer (-1: none; the pass's end), so that
 * the ranks start averaging it while the backward goes on. */
static int *grad_last_writers(File *f, BPass *p) {
  int *last = arena_alloc(f->a, sizeof(int) * (size_t)(f->g->nparams + 1));
  for (int k = 0; k < f->g->nparams; k++)
    last[k] = -1;
  for (int i = 0; i < p->nk; i++)
    for (int j = 0; j < p->k[i]->nouts; j++) {
      int bi = p->buf[p->k[i]->outs[j]->id];
      while (bi >= 0 && p->b[bi].home == HOME_ALIAS)
        bi = p->b[bi].index;
      if (bi >= 0 && p->b[bi].home == HOME_GRAD)
        last[p->b[bi].index] = i;
    }
  return last;
}

/* One pass as a C function NAME_<pass>_<dialect>(m, sym, in, out). */
/* The loss pass l when it computes just what the forward pass fw does (the
 * loss one of the outputs): a call of the forward, the loss into the pass's
 * output, the other outputs into the arena after the forward's own. */
static void loss_via_forward(File *f, const BPass *l, const BPass *fw, Buf *b) {
  buf_printf(b, "\n/* the loss pass: the forward pass (the loss is its output %d), its other outputs in the arena after the\n"
                " * forward's own; arena %lld bytes at the dims' maxima */\n",
             l->via_forward - 1, (long long)l->arena);
  buf_printf(b, "int %s_loss_%s(struct %s_model *m, const int64_t *sym, const void *const *in, void *const *out) {\n",
             f->name, f->d->name, f->name);
  buf_printf(b, "  void *fo[%d];\n", fw->nfinals);
  for (int k = 0; k < fw->nfinals; k++)
    if (k == l->via_forward - 1)
      buf_printf(b, "  fo[%d] = out[0];  /* %s */\n", k, f->g->outputs[k]->name ? f->g->outputs[k]->name : "the loss");
    else
      buf_printf(b, "  fo[%d] = m->ws + %lld;  /* %s */\n", k, (long long)l->out_at[k],
                 f->g->outputs[k]->name ? f->g->outputs[k]->name : "");
  buf_printf(b, "  return %s_forward_%s(m, sym, in, fo);\n}\n", f->name, f->d->name);
}

static void pass_fn(File *f, BPass *p, Buf *b) {
  Graph *g = f->g;
  int cuda = !strcmp(f->d->name, "cuda");
  buf_printf(b, "\n/* the %s pass: %d kernels, arena %lld bytes at the dims' maxima */\n", pass_names[p->kind], p->nk,
             (long long)p->arena);
  buf_printf(b, "int %s_%s_%s(struct %s_model *m, const int64_t *sym, const void *const *in, void *const *out) {\n",
             f->name, pass_names[p->kind], f->d->name, f->name);
  for (int s = 0; s < g->nsyms; s++)
    buf_printf(b, "  %s_UNUSED const int64_t dim_%s = sym[%d];\n", f->NAME,
               g->syms[s].derived ? arena_printf(f->a, "q%d", s) : g->syms[s].name, s);
  buf_printf(b, "  %s_UNUSED unsigned char *ws = m->ws;\n  %s_UNUSED const unsigned char *P = m->params;\n", f->NAME, f->NAME);
  if (p->kind == PASS_TRAIN)
    buf_printf(b, "  %s_UNUSED unsigned char *G = m->grads;\n", f->NAME);
  if (!cuda)
    buf_printf(b, "  %s_UNUSED int64_t bad = -1;\n", f->NAME);
  if (cuda)
    buf_printf(b, "  cudaStream_t st = %s_cuda_ctx_stream(m->cx, \"%s\");\n", f->name, pass_names[p->kind]);
  /* the buffers: each alias after the buffer it views (a placed value's host may follow it) */
  char *done = arena_alloc(f->a, (size_t)p->nb + 1);
  for (int left = p->nb, i = 0; left; i = (i + 1) % p->nb) {
    const Buffer *x = &p->b[i];
    if (done[i] || (x->home == HOME_ALIAS && !done[x->index]))
      continue;
    done[i] = 1;
    left--;
    const char *t = ctype(x->node->dtype), *c = x->home == HOME_INPUT || x->home == HOME_PARAM ? "const " : "";
    const char *at;
    switch (x->home) {
    case HOME_INPUT: at = arena_printf(f->a, "in[%d]", x->index); break;
    case HOME_PARAM: at = arena_printf(f->a, "P + %lld", (long long)f->pbyte[x->index]); break;
    case HOME_GRAD: at = arena_printf(f->a, "G + %lld", (long long)f->pbyte[x->index]); break;
    case HOME_OUTPUT: at = arena_printf(f->a, "out[%d]", x->index); break;
    case HOME_IGRAD: at = arena_printf(f->a, "out[%d]", 1 + x->index); break;
    case HOME_ALIAS:
      at = x->off.n ? arena_printf(f->a, "%s + %s", p->b[x->index].name, c_dim(g, &x->off)) : p->b[x->index].name;
      c = p->b[x->index].home == HOME_INPUT || p->b[x->index].home == HOME_PARAM ? "const " : "";
      break;
    default: at = arena_printf(f->a, "ws + %lld", (long long)x->offset); break;
    }
    const Node *o = p->orig[x->node->id];
    buf_printf(b, "  %s_UNUSED %s%s *%s = (%s%s *)(%s);  /* %s", f->NAME, c, t, x->name, c, t, at, shape_text(g, x->node));
    if (x->home == HOME_ARENA || x->home == HOME_GRAD || x->home == HOME_OUTPUT || x->home == HOME_IGRAD)
      buf_printf(b, "  %s:%d", f->spec, o->loc.line);
    buf_printf(b, " */\n");
  }
  buf_printf(b, "\n");
  int *last = cuda && p->kind == PASS_TRAIN && g->spec->compile.distributed ? grad_last_writers(f, p) : NULL;
  for (int i = 0; i < p->nk; i++) {
    Kernel *k = p->k[i];
    if (k->kind == K_LOOP) {
      if (!k->nouts)
        continue;
      loop_kernel(f, p, k, b);
    } else {
      call_kernel(f, p, k, i, b);
    }
    Buf ready; /* data parallel: the params whose gradients this kernel finished */
    int nready = 0;
    buf_init(&ready, f->a);
    for (int q = 0; last && q < g->nparams; q++)
      if (last[q] == i)
        buf_printf(&ready, "%s%d", nready++ ? ", " : "", q);
    if (nready)
      buf_printf(b, "  CK(%s_dist_ready(m, (const int[]){%s}, %d));  /* final gradients: the ranks may average them */\n",
                 f->name, ready.p, nready);
  }
  /* finals not written in place (the loss of the loss and train passes is final 0, at out[0]) */
  for (int k = 0; k < p->nfinals; k++) {
    const Node *n = p->finals[k];
    Home h;
    int idx, bi = p->buf[n->id];
    final_home(p, k, &h, &idx);
    while (bi >= 0 && p->b[bi].home == HOME_ALIAS)
      bi = p->b[bi].index;
    if (bi >= 0 && p->b[bi].home == h && p->b[bi].index == idx)
      continue;
    const char *dst = h == HOME_OUTPUT ? arena_printf(f->a, "out[%d]", idx)
                      : h == HOME_GRAD ? arena_printf(f->a, "G + %lld", (long long)f->pbyte[idx])
                                       : arena_printf(f->a, "out[%d]", 1 + idx);
    if (cuda)
      buf_printf(b, "  CK(%s_cuda_memcpy(m->cx, %s, %s, %s, 2));\n", f->name, dst, bname(p, n), bytes_c(f, n));
    else
      buf_printf(b, "  memcpy(%s, %s, %s);\n", dst, bname(p, n), bytes_c(f, n));
  }
  if (cuda)
    buf_printf(b, "  CK(cudaGetLastError() == cudaSuccess ? 0 : %s_cuda_ctx_fail(m->cx, (int)cudaGetLastError(), \"kernel launch\"));\n", f->name);
  buf_printf(b, "  return %s_OK;\n}\n", f->NAME);
}

/* The file of one dialect: every pass (NULL: the model has none). */
const char *render_file(Graph *g, BPass **passes, int cuda, const char *spec_name) {
  File ff = {0}, *f = &ff;
  f->g = g;
  f->a = g->arena;
  f->d = cuda ? &dl_cuda : &dl_cpu;
  f->name = g->spec->name;
  char *up = arena_strdup(f->a, f->name);
  for (char *c = up; *c; c++)
    *c = (char)toupper((unsigned char)*c);
  f->NAME = up;
  f->spec = spec_name;
  f->pbyte = param_offsets(g, f->a);
  buf_init(&f->kernels, f->a);
  Buf pb;
  buf_init(&pb, f->a);
  for (int k = 0; k < NPASS; k++) {
    if (passes[k] && passes[k]->via_forward) {
      loss_via_forward(f, passes[k], passes[PASS_FORWARD], &pb);
    } else if (passes[k]) {
      pass_fn(f, passes[k], &pb);
    } else {
      buf_printf(&pb, "\nint %s_%s_%s(struct %s_model *m, const int64_t *sym, const void *const *in, void *const *out) {\n",
                 f->name, pass_names[k], f->d->name, f->name);
      buf_printf(&pb, "  (void)sym; (void)in; (void)out;\n  return %s_fail(m, %s_EINVAL, \"model %s has no train: section, so no loss or training step\");\n}\n",
                 f->name, f->NAME, f->name);
    }
  }
  Buf b;
  buf_init(&b, f->a);
  buf_printf(&b, "/* %s_%s: model %s on %s, generated by tgen %s from %s.\n *\n", f->name, cuda ? "cuda.cu" : "cpu.c",
             f->name, cuda ? "CUDA" : "the CPU (OpenMP)", TGEN_VERSION, spec_name);
  buf_printf(&b, " * The kernels tgen generated for this model (each names the spec lines it\n"
                 " * computes), then the passes that call them and the runtime's library\n"
                 " * kernels (GEMMs, attention, embedding, dropout):\n"
                 " *   %s_forward_*  the outputs (dropout off)\n"
                 " *   %s_loss_*     the training loss only (dropout off)\n"
                 " *   %s_train_*    loss and gradients (the partitioner's schedule)\n"
                 " * Every value lives in the caller's buffers or in the pass's arena (ws) at\n"
                 " * the offset tgen planned for the dims' maxima.%s */\n",
             f->name, f->name, f->name,
             cuda ? ""
                  : arena_printf(f->a, "\n *\n"
                                 " * A kernel's loop is a function of its own, kN_part over a range of the\n"
                                 " * elements (or output elements), so that it can be compiled for AVX-512,\n"
                                 " * AVX2 and the baseline, the best one for the CPU picked at load time\n"
                                 " * (the body of an OpenMP parallel region is a function the compiler makes,\n"
                                 " * which would not be); the kernel runs it on each thread's share. See\n"
                                 " * %s_CLONES in %s_rt.h;\n"
                                 " * -D%s_NO_ISA_DISPATCH compiles each loop once, for the compiler's target.",
                                 f->NAME, f->name, f->NAME));
  buf_printf(&b, "#include \"%s_rt.h\"\n#include \"%s_math.h\"\n\n#include <math.h>\n#include <stdint.h>\n#include <string.h>\n", f->name, f->name);
  if (cuda)
    buf_printf(&b, "\n#define CK(call) do { if (call) return %s_fail(m, %s_EDEVICE, \"%%s\", %s_cuda_ctx_error(m->cx)); } while (0)\n",
               f->name, f->NAME, f->name);
  buf_printf(&b, "%s%s", f->kernels.p ? f->kernels.p : "", pb.p);
  return b.p;
}
