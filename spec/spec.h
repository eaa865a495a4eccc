/* spec.h: tgen's front end. The YAML model language (SPEC.md, spec/LANGUAGE.md)
 * becomes a Spec: a tree of declarations whose every node keeps the file:line:col
 * it came from, so any later pass can point the user at the offending text.
 *
 * Files:   util.c   arena, diagnostics (error_at + caret), strings, did-you-mean
 *          yaml.c   libyaml events -> YNode tree (dup keys, tabs, UTF-8, depth)
 *          expr.c   expression grammar -> Expr
 *          spec.c   YNode tree -> Spec (keys, types, values checked)
 */
#ifndef TGEN_SPEC_H
#define TGEN_SPEC_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#define TGEN_VERSION "0.1.0"
#define MAX_DEPTH 64 /* YAML and expression nesting bound: no stack overflow */
#define MAX_SPEC_BYTES (16 << 20) /* a spec file larger than this is refused */
#define MAX_IO 64 /* inputs, and outputs, of a model */
#define MAX_EXPR_DEPTH 256 /* depth of an expression tree, operator chains included */

/* ---------------------------------------------------------------- util.c */

typedef struct Loc {
  int line, col; /* 1-based; 0 = unknown */
} Loc;

/* One arena per compilation: every allocation of the front end and the IR goes
 * through arena_alloc, and arena_free releases all of it at once. A test may
 * set a failure countdown to check that out-of-memory is reported, not fatal. */
typedef struct ArenaBlock ArenaBlock;
typedef struct Arena {
  ArenaBlock *head;
  size_t total;     /* bytes handed out */
  long fail_after;  /* tests: fail the Nth allocation from now (<0: never) */
} Arena;

void *arena_alloc(Arena *a, size_t n); /* zeroed; reports OOM through error() */
void arena_free(Arena *a);
char *arena_strdup(Arena *a, const char *s);
char *arena_strndup(Arena *a, const char *s, size_t n);
char *arena_printf(Arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Diagnostics. A compilation runs under one Diag: errors format their message
 * into `msg` (with source line and caret) and longjmp back to the entry point,
 * which returns failure. No exit() inside the library: the fuzzer and the tests
 * call the front end many times in one process. */
typedef struct Diag {
  const char *file;  /* name as given by the user */
  const char *src;   /* whole source text (NUL-terminated copy) */
  size_t srclen;
  Arena *arena;
  jmp_buf jmp;
  char msg[2048];    /* the formatted error, "FILE:L:C: error: ...\n line\n caret\n" */
  void (*cleanup)(void *); /* released before the jump (e.g. the libyaml parser) */
  void *cleanup_arg;
} Diag;

extern Diag *diag; /* the current compilation; set by the entry points */

_Noreturn void error_at(Loc loc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
_Noreturn void verror_at(Loc loc, const char *fmt, va_list ap);
_Noreturn void die_(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define die(...) die_(__FILE__, __LINE__, __VA_ARGS__) /* internal error: a bug */

/* Growable string buffer (malloc-free: grows in the arena). */
typedef struct Buf {
  char *p;
  size_t len, cap;
  Arena *a;
} Buf;
void buf_init(Buf *b, Arena *a);
void buf_printf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_putn(Buf *b, const char *s, size_t n);

/* The closest candidate to `s` by edit distance, or NULL if none is close. */
const char *did_you_mean(const char *s, const char *const *cands, int n);
int is_ident(const char *s);
int c_reserved(const char *s, const char *model); /* emitted C would break on this name (a '_' is appended) */

/* Growable pointer array in the arena. */
typedef struct Vec {
  void **p;
  int n, cap;
} Vec;
void vec_push(Arena *a, Vec *v, void *x);

/* ---------------------------------------------------------------- yaml.c */

typedef enum { Y_SCALAR, Y_SEQ, Y_MAP } YKind;
typedef struct YNode YNode;
struct YNode {
  YKind kind;
  Loc loc;         /* where the node starts */
  Loc vloc;        /* scalars: where the text starts (after an opening quote) */
  const char *str; /* scalars: the text */
  int quoted;      /* scalars: written in quotes or as a block (never a number/bool) */
  int multiline;   /* scalars: text spans lines, so column offsets are approximate */
  YNode **items;   /* seq items; map values */
  YNode **keys;    /* map keys (scalars) */
  int n;
};

/* Parse `src` as one YAML document. Refuses (error_at) tabs in indentation,
 * NUL bytes, invalid UTF-8, duplicate keys, aliases, non-scalar keys, an empty
 * file and nesting deeper than MAX_DEPTH. */
YNode *yaml_load(const char *src, size_t len);

/* ---------------------------------------------------------------- expr.c */

typedef enum {
  E_NUM,   /* number literal: num, is_int, ival */
  E_NAME,  /* identifier: name */
  E_STR,   /* quoted string: name holds the text */
  E_BOOL,  /* true/false: ival */
  E_NONE,  /* none */
  E_LIST,  /* [a, b, ...]: args */
  E_CALL,  /* name(args): name, args (E_KWARG for keyword args) */
  E_KWARG, /* name=lhs, inside a call's args */
  E_BINOP, /* lhs op rhs; op one of + - * / @ */
  E_NEG,   /* -lhs */
} ExprKind;

typedef struct Expr Expr;
struct Expr {
  ExprKind kind;
  Loc loc;          /* first character of this expression */
  double num;       /* E_NUM */
  int is_int;       /* E_NUM: written without '.', 'e' */
  int64_t ival;     /* E_NUM when is_int; E_BOOL */
  const char *name; /* E_NAME, E_CALL, E_KWARG, E_STR */
  char op;          /* E_BINOP */
  Expr *lhs, *rhs;  /* E_BINOP, E_NEG (lhs), E_KWARG (lhs = value) */
  Expr **args;      /* E_CALL, E_LIST */
  int nargs;
  int depth;        /* height of the tree below: 0 for a leaf, at most MAX_EXPR_DEPTH */
};

/* Parse the text of a YAML scalar as an expression; locations are computed
 * from the scalar's position in the file. */
Expr *parse_expr(const YNode *scalar);
const char *expr_str(const Expr *e); /* short printed form for messages (long ones cut: "...") */
const char *expr_str_max(const Expr *e, size_t max); /* NULL if longer than max */

/* ---------------------------------------------------------------- spec.c */

typedef enum { DT_F32, DT_BF16, DT_F16, DT_I32, DT_BOOL, DT_NONE } DType;
extern const char *const dtype_names[];
int dtype_parse(const char *s); /* -1 if unknown */
int dtype_is_float(DType t);
int dtype_size(DType t);

typedef enum { INIT_DEFAULT, INIT_ZEROS, INIT_ONES, INIT_NORMAL, INIT_UNIFORM,
               INIT_XAVIER_UNIFORM, INIT_KAIMING_UNIFORM } InitKind;
extern const char *const init_names[];

typedef struct DimDecl {
  const char *name;
  Loc loc;
  Expr *value;    /* static: the size expression; dynamic: NULL */
  int dynamic;
  Expr *max;      /* dynamic: the bound */
  int64_t size;   /* filled by the builder: the static size, or the dynamic max */
} DimDecl;

typedef struct TensorDecl { /* an input or a param */
  const char *name;
  Loc loc;        /* the key */
  Expr **shape;   /* one integer expression per dim */
  int rank;
  Loc shape_loc;
  DType dtype;    /* inputs: DT_NONE = model default */
  Loc dtype_loc;
  InitKind init;  /* params */
  double init_a, init_b; /* normal: std; uniform: lo, hi */
  Loc init_loc;
  const char *ext_name; /* params: `name:` (may contain {i}); NULL = derived */
  Loc ext_loc;
} TensorDecl;

typedef struct Binding {   /* `- a, b: EXPR` */
  const char **names;
  Loc *locs;
  int nnames;
  Expr *expr;
  Loc loc;
} Binding;

typedef struct NameRef {
  const char *name;
  Loc loc;
} NameRef;

typedef struct Block {
  const char *name;
  Loc loc;
  NameRef *inputs;  int ninputs;
  TensorDecl *params; int nparams;
  Binding *graph;   int ngraph;
  NameRef *outputs; int noutputs;
  int visiting;     /* recursion check during expansion */
} Block;

typedef enum { OPT_NONE, OPT_SGD, OPT_ADAMW } OptKind;
typedef enum { MODE_DEFAULT, MODE_REDUCE_OVERHEAD, MODE_MAX_AUTOTUNE } CompileMode;
typedef enum { REMAT_MIN_CUT, REMAT_SAVE_ALL, REMAT_RECOMPUTE_ALL } Remat;
enum { TARGET_CUDA = 1, TARGET_CPU = 2 };

typedef struct Train {
  int present;
  Loc loc;           /* the train: mapping */
  NameRef loss;
  NameRef *wrt;      /* train.wrt: the inputs whose gradients are computed too */
  int nwrt;
  OptKind opt;       /* OPT_NONE: no optimizer (allowed only with wrt and no params) */
  Loc opt_loc;
  double lr, beta1, beta2, eps, weight_decay, momentum;
  int has_clip;
  double grad_clip;
} Train;

typedef struct Compile {
  int targets;          /* TARGET_* bits */
  CompileMode mode;
  Remat remat;
  int64_t memory_budget; /* bytes; -1 = none */
  int fuse;
  const char *cuda_arch; /* "native", "90", "80;90", ... */
  int distributed;       /* 1: data-parallel training across GPUs through NCCL (compile.distributed: nccl) */
  Loc distributed_loc;
} Compile;

typedef struct Spec {
  const char *file;
  const char *name;   Loc name_loc;
  DType dtype;
  uint64_t seed;
  DimDecl *dims;      int ndims;
  TensorDecl *inputs; int ninputs;
  TensorDecl *params; int nparams;
  Block **blocks;     int nblocks;
  Binding *graph;     int ngraph;
  NameRef *outputs;   int noutputs; /* 0 = the last binding */
  Loc outputs_loc;
  Train train;
  Compile compile;
} Spec;

/* Read and check a model file's text; runs under `diag` (errors longjmp to the
 * caller's setjmp, see tgen_load in gen/ir.h). The Spec lives in diag->arena. */
Spec *spec_parse(const char *file, const char *src, size_t len);
/* A memory size as compile.memory_budget writes it ("512MB", "1.5GiB",
 * "1000000"; units B KB MB GB KiB MiB GiB) into *out: 0; -1 not a size;
 * -2 not positive or too large. */
int parse_byte_size(const char *s, int64_t *out);
Block *spec_find_block(const Spec *s, const char *name);

/* Read a whole file into the arena (NUL-terminated); NULL + errno on failure
 * (EISDIR for a directory, EFBIG past `max` bytes). */
char *read_file(Arena *a, const char *path, size_t *len); /* EFBIG past MAX_SPEC_BYTES */
char *read_file_max(Arena *a, const char *path, size_t *len, size_t max);

#endif
