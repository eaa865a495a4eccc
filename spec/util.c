/* util.c: the arena, diagnostics with source line and caret, small strings. */
#include "spec.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

Diag *diag;

/* ---------------------------------------------------------------- arena */

struct ArenaBlock {
  ArenaBlock *next;
  size_t used, cap;
  max_align_t data[];
};

#define ARENA_CHUNK (64 * 1024)

/* The one allocation entry point of the compiler. Memory is zeroed. */
void *arena_alloc(Arena *a, size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (a->fail_after == 0 || n > ((size_t)1 << 40)) {
    Loc none = {0, 0};
    a->fail_after = -1;
    error_at(none, "out of memory (allocating %zu bytes)", n);
  }
  if (a->fail_after > 0)
    a->fail_after--;
  ArenaBlock *b = a->head;
  if (!b || b->cap - b->used < n) {
    size_t cap = n > ARENA_CHUNK ? n : ARENA_CHUNK;
    b = malloc(sizeof(ArenaBlock) + cap);
    if (!b) {
      Loc none = {0, 0};
      error_at(none, "out of memory (allocating %zu bytes)", n);
    }
    b->used = 0;
    b->cap = cap;
    b->next = a->head;
    a->head = b;
  }
  void *p = (char *)b->data + b->used;
  b->used += n;
  a->total += n;
  memset(p, 0, n);
  return p;
}

void arena_free(Arena *a) {
  ArenaBlock *b = a->head;
  while (b) {
    ArenaBlock *next = b->next;
    free(b);
    b = next;
  }
  a->head = NULL;
  a->total = 0;
}

char *arena_strndup(Arena *a, const char *s, size_t n) {
  char *p = arena_alloc(a, n + 1);
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}

char *arena_strdup(Arena *a, const char *s) { return arena_strndup(a, s, strlen(s)); }

char *arena_printf(Arena *a, const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *p = arena_alloc(a, (size_t)n + 1);
  vsnprintf(p, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  return p;
}

void vec_push(Arena *a, Vec *v, void *x) {
  if (v->n == v->cap) {
    int cap = v->cap ? v->cap * 2 : 8;
    void **p = arena_alloc(a, sizeof(void *) * (size_t)cap);
    if (v->n)
      memcpy(p, v->p, sizeof(void *) * (size_t)v->n);
    v->p = p;
    v->cap = cap;
  }
  v->p[v->n++] = x;
}

/* ---------------------------------------------------------------- buffers */

void buf_init(Buf *b, Arena *a) {
  b->a = a;
  b->len = 0;
  b->cap = 256;
  b->p = arena_alloc(a, b->cap);
}

void buf_putn(Buf *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap * 2;
    while (cap < b->len + n + 1)
      cap *= 2;
    char *p = arena_alloc(b->a, cap);
    memcpy(p, b->p, b->len);
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

void buf_printf(Buf *b, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < (int)sizeof tmp) {
    buf_putn(b, tmp, (size_t)n);
    return;
  }
  char *p = arena_alloc(b->a, (size_t)n + 1);
  va_start(ap, fmt);
  vsnprintf(p, (size_t)n + 1, fmt, ap);
  va_end(ap);
  buf_putn(b, p, (size_t)n);
}

/* ---------------------------------------------------------------- diagnostics */

/* Append the source line `line` and a caret under column `col` to `out`.
 * Tabs in the line are kept in the caret's padding so it lines up. A long line
 * is shown as a window of at most 240 characters around the column. */
static size_t put_caret(char *out, size_t cap, int line, int col) {
  const char *s = diag->src, *end = s + diag->srclen;
  for (int l = 1; l < line && s < end; s++)
    if (*s == '\n' || (*s == '\r' && s + 1 < end && s[1] != '\n')) /* a lone CR breaks a line in YAML too */
      l++;
  if (s >= end && line > 1)
    return 0;
  const char *e = s;
  while (e < end && *e != '\n' && *e != '\r')
    e++;
  size_t n = 0;
  const char *pre = "";
  if (col > 160 && col - 1 <= e - s) { /* start the window 80 characters before the column */
    s += col - 81;
    col = 81 + 3;
    pre = "...";
  }
  int len = (int)(e - s) > 240 ? 240 : (int)(e - s);
  n += (size_t)snprintf(out + n, cap - n, "%s%.*s%s\n", pre, len, s, len < e - s ? "..." : "");
  if (n >= cap)
    return cap - 1;
  int plen = (int)strlen(pre);
  for (int c = 1; c < col && c <= plen + len + 1 && n + 2 < cap; c++)
    out[n++] = c > plen && c - 1 - plen < len && s[c - 1 - plen] == '\t' ? '\t' : ' ';
  if (n + 2 < cap) {
    out[n++] = '^';
    out[n++] = '\n';
  }
  out[n] = 0;
  return n;
}

void verror_at(Loc loc, const char *fmt, va_list ap) {
  Diag *d = diag;
  if (!d) {
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    abort();
  }
  size_t n = 0, cap = sizeof d->msg;
  if (loc.line > 0)
    n += (size_t)snprintf(d->msg, cap, "%s:%d:%d: error: ", d->file, loc.line, loc.col);
  else
    n += (size_t)snprintf(d->msg, cap, "%s: error: ", d->file);
  if (n < cap) { /* a message longer than ~1000 characters (a huge name in it) keeps its start and its end,
                   where the reason is */
    va_list aq;
    va_copy(aq, ap);
    int len = vsnprintf(NULL, 0, fmt, aq);
    va_end(aq);
    char *tmp = malloc(len > 0 ? (size_t)len + 1 : 1);
    if (!tmp || len < 0)
      len = 0;
    else
      vsnprintf(tmp, (size_t)len + 1, fmt, ap);
    if (len > 1000)
      n += (size_t)snprintf(d->msg + n, cap - n, "%.480s ... %s", tmp, tmp + len - 480);
    else
      n += (size_t)snprintf(d->msg + n, cap - n, "%s", tmp ? tmp : "(out of memory)");
    free(tmp);
  }
  if (n < cap - 1) {
    d->msg[n++] = '\n';
    d->msg[n] = 0;
  }
  if (loc.line > 0 && n < cap && d->src)
    put_caret(d->msg + n, cap - n, loc.line, loc.col);
  if (d->cleanup) {
    void (*f)(void *) = d->cleanup;
    d->cleanup = NULL;
    f(d->cleanup_arg);
  }
  longjmp(d->jmp, 1);
}

void error_at(Loc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  verror_at(loc, fmt, ap);
}

void die_(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "tgen: internal error at %s:%d: ", file, line);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  abort();
}

/* ---------------------------------------------------------------- strings */

int is_ident(const char *s) {
  if (!s || !(isalpha((unsigned char)*s) || *s == '_'))
    return 0;
  for (s++; *s; s++)
    if (!(isalnum((unsigned char)*s) || *s == '_'))
      return 0;
  return 1;
}

/* Is `s` unusable as an identifier in emitted C/CUDA (a struct field, a kernel
 * parameter)? C11 and C23 keywords, macros that compilers predefine (linux,
 * unix in GNU mode) or that the emitted code's headers define (NULL, EOF,
 * errno, ...), the math functions the kernels call, CUDA's built-in variables,
 * identifiers reserved to the implementation (__x, _X), and, when `model` is
 * given, the model's own prefixes (model_..., MODEL_...), which name the
 * emitted functions and macros. Such a name is emitted with a '_' appended. */
int c_reserved(const char *s, const char *model) {
  static const char *const words[] = {
      /* C11 keywords, then C23's */
      "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum", "extern",
      "float", "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return", "short", "signed",
      "sizeof", "static", "struct", "switch", "typedef", "union", "unsigned", "void", "volatile", "while",
      "alignas", "alignof", "bool", "constexpr", "false", "nullptr", "static_assert", "thread_local", "true",
      "typeof", "typeof_unqual", "asm", "noreturn", "complex", "imaginary", "I",
      /* predefined by compilers (GNU mode) */
      "linux", "unix", "i386", "i686", "sparc", "mips", "vax", "sun",
      /* macros of the standard headers the emitted code includes */
      "NULL", "EOF", "errno", "stdin", "stdout", "stderr", "assert", "offsetof", "INFINITY", "NAN", "HUGE_VAL",
      "HUGE_VALF", "BUFSIZ", "FILENAME_MAX", "RAND_MAX", "EXIT_SUCCESS", "EXIT_FAILURE", "CHAR_BIT", "CHAR_MAX",
      "INT_MAX", "INT_MIN", "UINT_MAX", "LONG_MAX", "LONG_MIN", "LLONG_MAX", "LLONG_MIN", "SIZE_MAX", "INT8_MAX",
      "INT16_MAX", "INT32_MAX", "INT32_MIN", "INT64_MAX", "INT64_MIN", "UINT8_MAX", "UINT16_MAX", "UINT32_MAX",
      "UINT64_MAX", "FLT_MAX", "FLT_MIN", "FLT_EPSILON", "DBL_MAX", "DBL_MIN", "DBL_EPSILON", "M_PI", "M_E",
      "M_SQRT2", "M_SQRT1_2", "M_2_SQRTPI", "M_LN2", "EINVAL", "ENOMEM", "ERANGE", "EDOM", "EIO", "ENOENT",
      "EEXIST", "EINTR", "EAGAIN", "EFBIG", "ENOSPC", "EACCES", "SEEK_SET", "SEEK_CUR", "SEEK_END",
      "CLOCK_MONOTONIC", "CLOCK_REALTIME", "O_RDONLY", "O_WRONLY", "O_CREAT", "FP_NAN", "FP_INFINITE",
      "PRId64", "PRIu64", "PRIx64", "MAP_FAILED", "main",
      /* functions the kernels call, and CUDA's built-in variables */
      "exp", "expf", "exp2f", "expm1f", "log", "logf", "log2f", "log1pf", "sqrt", "sqrtf", "rsqrtf", "tanh",
      "tanhf", "erf", "erff", "erfc", "erfcf", "pow", "powf", "fabs", "fabsf", "fmax", "fmaxf", "fmin", "fminf",
      "floor", "floorf", "ceil", "ceilf", "round", "roundf", "sin", "sinf", "cos", "cosf", "isnan", "isinf",
      "isfinite", "signbit", "fmaf", "max", "min", "abs", "memcpy", "memset", "malloc", "free", "printf",
      "threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize", NULL};
  if (s[0] == '_' && (s[1] == '_' || isupper((unsigned char)s[1])))
    return 1;
  for (int i = 0; words[i]; i++)
    if (!strcmp(s, words[i]))
      return 1;
  if (model) {
    size_t n = strlen(model);
    if (!strncasecmp(s, model, n) && s[n] == '_')
      return 1;
  }
  return 0;
}

static int edit_distance(const char *a, const char *b) {
  int la = (int)strlen(a), lb = (int)strlen(b);
  if (la > 64 || lb > 64)
    return 99;
  int prev[65], cur[65];
  for (int j = 0; j <= lb; j++)
    prev[j] = j;
  for (int i = 1; i <= la; i++) {
    cur[0] = i;
    for (int j = 1; j <= lb; j++) {
      int c = prev[j - 1] + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
      if (prev[j] + 1 < c)
        c = prev[j] + 1;
      if (cur[j - 1] + 1 < c)
        c = cur[j - 1] + 1;
      cur[j] = c;
    }
    memcpy(prev, cur, sizeof(int) * (size_t)(lb + 1));
  }
  return prev[lb];
}

const char *did_you_mean(const char *s, const char *const *cands, int n) {
  const char *best = NULL;
  int bestd = 99, len = (int)strlen(s);
  int limit = len <= 3 ? 1 : len <= 6 ? 2 : 3;
  for (int i = 0; i < n; i++) {
    if (!cands[i])
      continue;
    int d = edit_distance(s, cands[i]);
    if (d < bestd && d <= limit) {
      bestd = d;
      best = cands[i];
    }
  }
  return best;
}

char *read_file(Arena *a, const char *path, size_t *len) { return read_file_max(a, path, len, MAX_SPEC_BYTES); }

char *read_file_max(Arena *a, const char *path, size_t *len, size_t max) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
    fclose(f);
    errno = EISDIR;
    return NULL;
  }
  size_t cap = 4096, n = 0;
  char *p = malloc(cap);
  for (;;) {
    if (!p) {
      fclose(f);
      errno = ENOMEM;
      return NULL;
    }
    size_t r = fread(p + n, 1, cap - n, f);
    n += r;
    if (r == 0)
      break;
    if (n > max) { /* /dev/zero, a stray binary: refused after the limit, not read whole */
      free(p);
      fclose(f);
      errno = EFBIG;
      return NULL;
    }
    if (n == cap) {
      char *q = realloc(p, cap * 2);
      if (!q)
        free(p);
      p = q;
      cap *= 2;
    }
  }
  int err = ferror(f);
  fclose(f);
  if (err) {
    free(p);
    errno = EIO;
    return NULL;
  }
  char *out = arena_strndup(a, p, n);
  free(p);
  *len = n;
  return out;
}
