/* mlp_safetensors.c: reading and writing safetensors files.
 *
 * Template: copied into every emitted project (src/NAME_safetensors.c) and
 * also compiled into tgen itself, which writes its golden vectors with it.
 * No global state, no exit: every failure is a status code (MLP_EIO,
 * MLP_ECORRUPT, MLP_ENOMEM, MLP_EINVAL) plus a message in `err` that names
 * the file and what is wrong with it.
 *
 * The format (Hugging Face safetensors):
 *   8 bytes   N, a little-endian u64: the length of the header
 *   N bytes   UTF-8 JSON: {"NAME": {"dtype": "F32", "shape": [2, 3],
 *             "data_offsets": [BEGIN, END]}, ..., "__metadata__": {"k": "v"}}
 *             padded with trailing spaces
 *   the rest  the data section: tensors little-endian, row-major, BEGIN and
 *             END relative to the start of this section
 *
 * The writer keeps the given order, lays the data out contiguously in that
 * order, pads the header with spaces so that the data section starts at a
 * multiple of 8, and prints the header the way the reference implementation
 * (the Rust crate behind Python's `safetensors`) does: compact JSON, keys in
 * the order dtype, shape, data_offsets. Given tensors in the order that
 * implementation picks (dtype size descending, then name), the bytes are the
 * same. It writes PATH.tmp.PID, flushes and fsyncs it and renames it over
 * PATH, so PATH is either the old file or the complete new one; the
 * PATH.tmp.PID files of writers that were killed (their PID is gone) are
 * removed first. mlp_st_write_checked also stores a checksum of the data
 * section in __metadata__ ("mlp.checksum": "w64:HEX", see st_sum), which the
 * reader verifies whenever a file has one (files without one still load).
 *
 * The reader reads the whole file and checks it at least as strictly as the
 * reference implementation: a small parser for exactly this JSON structure
 * (no general JSON values), then the semantic checks: dtypes, ranks, shape
 * products, data_offsets against dtype x numel, and the tensors covering the
 * data section exactly (no overlap, no hole, nothing left over). Only our five
 * dtypes are accepted. Tensor data points into the file buffer: the data
 * section starts 8-aligned when the header was padded as above, but a tensor
 * may sit at any offset the file says, so copy it out with memcpy rather than
 * dereferencing it as float *. Hosts are assumed little-endian. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "mlp_rt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *const mlp_dtype_names[5] = {"f32", "bf16", "f16", "i32", "bool"};
const char *const mlp_dtype_st_names[5] = {"F32", "BF16", "F16", "I32", "BOOL"};
const int mlp_dtype_sizes[5] = {4, 2, 2, 4, 1};

/* The reference implementation's limit on the header length. */
#define MLP_ST_MAX_HEADER 100000000u

#ifdef __GNUC__
#define MLP_ST_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MLP_ST_PRINTF(a, b)
#endif

static int st_fail(char *err, size_t errlen, int code, const char *fmt, ...) MLP_ST_PRINTF(4, 5);

/* Every error goes through here: format the message (when there is room for
 * one) and return the code. */
static int st_fail(char *err, size_t errlen, int code, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return code;
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is invalid
 * (overlong forms, surrogates and code points above U+10FFFF included). */
static size_t st_utf8_len(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  if (c < 0x80)
    return 1;
  size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  if (!len || len > n)
    return 0;
  for (size_t k = 1; k < len; k++)
    if ((s[k] & 0xc0) != 0x80)
      return 0;
  if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] > 0x9f) || (c == 0xf0 && s[1] < 0x90) ||
      (c == 0xf4 && s[1] > 0x8f))
    return 0;
  return len;
}

/* Offset of the first byte that is not valid UTF-8, or n if all are. */
static size_t st_utf8_check(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    size_t k = st_utf8_len(s + i, n - i);
    if (!k)
      return i;
    i += k;
  }
  return n;
}

/* ================================================================ writer */

/* The header text, grown in memory. */
typedef struct st_text {
  char *s;
  size_t len, cap;
  int oom;
} st_text;

static void st_put(st_text *b, const char *s, size_t n) {
  if (b->oom)
    return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1)
      cap *= 2;
    char *p = realloc(b->s, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->s = p;
    b->cap = cap;
  }
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = 0;
}

static void st_puts(st_text *b, const char *s) { st_put(b, s, strlen(s)); }

static void st_putu(st_text *b, unsigned long long v) {
  char tmp[24];
  int k = snprintf(tmp, sizeof tmp, "%llu", v);
  st_put(b, tmp, (size_t)k);
}

/* A JSON string, escaped as serde_json does: \" \\ \b \f \n \r \t, other
 * control characters as \u00xx, everything else (UTF-8 included) as is. */
static void st_put_json_string(st_text *b, const char *s) {
  static const char hex[] = "0123456789abcdef";
  st_put(b, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    char e[7] = {'\\', 0, 0, 0, 0, 0, 0};
    size_t n = 2;
    switch (*p) {
    case '"': e[1] = '"'; break;
    case '\\': e[1] = '\\'; break;
    case '\b': e[1] = 'b'; break;
    case '\f': e[1] = 'f'; break;
    case '\n': e[1] = 'n'; break;
    case '\r': e[1] = 'r'; break;
    case '\t': e[1] = 't'; break;
    default:
      if (*p >= 0x20) {
        st_put(b, (const char *)p, 1);
        continue;
      }
      memcpy(e + 1, "u00", 3);
      e[4] = hex[*p >> 4];
      e[5] = hex[*p & 15];
      n = 6;
    }
    st_put(b, e, n);
  }
  st_put(b, "\"", 1);
}

typedef struct st_name_ix {
  const char *name;
  int ix;
} st_name_ix;

/* By name (bytes), then by position: duplicates end up adjacent, the first
 * occurrence first. */
static int st_cmp_name(const void *a, const void *b) {
  const st_name_ix *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  return c ? c : (x->ix > y->ix) - (x->ix < y->ix);
}

/* Check the tensors the caller hands to the writer (bugs in the caller, not
 * I/O problems: MLP_EINVAL) and compute each one's byte count. */
static int st_check_descs(const char *path, const mlp_tensor_desc *t, int n, uint64_t *bytes, char *err,
                          size_t errlen) {
  for (int k = 0; k < n; k++) {
    const mlp_tensor_desc *d = &t[k];
    if (!d->name)
      return st_fail(err, errlen, MLP_EINVAL, "%s: tensor %d has no name", path, k);
    size_t len = strlen(d->name);
    if (st_utf8_check((const unsigned char *)d->name, len) != len)
      return st_fail(err, errlen, MLP_EINVAL, "%s: tensor name '%s' is not valid UTF-8", path, d->name);
    if (!strcmp(d->name, "__metadata__"))
      return st_fail(err, errlen, MLP_EINVAL, "%s: '__metadata__' is reserved and cannot name a tensor", path);
    if (d->dtype < 0 || d->dtype > 4)
      return st_fail(err, errlen, MLP_EINVAL, "%s: tensor '%s' has an unknown dtype code %d", path, d->name,
                     d->dtype);
    if (d->rank < 0 || d->rank > MLP_MAXRANK)
      return st_fail(err, errlen, MLP_EINVAL, "%s: tensor '%s' has rank %d, outside 0..%d", path, d->name, d->rank,
                     MLP_MAXRANK);
    uint64_t b = (uint64_t)mlp_dtype_sizes[d->dtype];
    for (int i = 0; i < d->rank; i++) {
      if (d->shape[i] < 0)
        return st_fail(err, errlen, MLP_EINVAL, "%s: tensor '%s' has a negative dim %d (%lld)", path, d->name, i,
                       (long long)d->shape[i]);
      if (d->shape[i] && b > (uint64_t)INT64_MAX / (uint64_t)d->shape[i])
        return st_fail(err, errlen, MLP_EINVAL, "%s: tensor '%s' is too large", path, d->name);
      b *= (uint64_t)d->shape[i];
    }
    if (b && !d->data)
      return st_fail(err, errlen, MLP_EINVAL, "%s: tensor '%s' has no data", path, d->name);
    bytes[k] = b;
  }
  if (n < 2)
    return MLP_OK;
  st_name_ix *ix = malloc(sizeof *ix * (size_t)n);
  if (!ix)
    return st_fail(err, errlen, MLP_ENOMEM, "%s: out of memory", path);
  for (int k = 0; k < n; k++)
    ix[k] = (st_name_ix){t[k].name, k};
  qsort(ix, (size_t)n, sizeof *ix, st_cmp_name);
  int rc = MLP_OK;
  for (int k = 1; k < n && !rc; k++)
    if (!strcmp(ix[k - 1].name, ix[k].name))
      rc = st_fail(err, errlen, MLP_EINVAL, "%s: two tensors are named '%s' (%d and %d)", path, ix[k].name,
                   ix[k - 1].ix, ix[k].ix);
  free(ix);
  return rc;
}

/* Best effort: make the rename itself durable by syncing the directory. */
static void st_sync_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = slash ? malloc((size_t)(slash - path) + 2) : NULL;
  if (slash && !dir)
    return;
  if (dir) {
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    memcpy(dir, path, n);
    dir[n] = 0;
  }
  int fd = open(dir ? dir : ".", O_RDONLY);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
  free(dir);
}

/* The checksum of the data section: FNV-1a over its 8-byte little-endian
 * words (the last one zero-padded), then over its length. Each step is a
 * bijection of the state, so any change confined to one word (a flipped bit,
 * a torn sector's word) always changes the sum; 8 bytes per multiply keeps it
 * at memory speed for GB-sized checkpoints. Streaming: feed, then finish. */
typedef struct st_sum {
  uint64_t h, len;
  unsigned char part[8];
  int np;
} st_sum;

static void st_sum_word(st_sum *c, const unsigned char *w) {
  uint64_t x = 0;
  for (int i = 0; i < 8; i++)
    x |= (uint64_t)w[i] << (8 * i);
  c->h = (c->h ^ x) * 0x100000001b3ull;
}

static void st_sum_feed(st_sum *c, const unsigned char *p, size_t n) {
  c->len += n;
  while (n && c->np) {
    c->part[c->np++] = *p++, n--;
    if (c->np == 8)
      st_sum_word(c, c->part), c->np = 0;
  }
  for (; n >= 8; p += 8, n -= 8)
    st_sum_word(c, p);
  while (n)
    c->part[c->np++] = *p++, n--;
}

static uint64_t st_sum_finish(st_sum *c) {
  if (c->np) {
    memset(c->part + c->np, 0, (size_t)(8 - c->np));
    st_sum_word(c, c->part);
  }
  return (c->h ^ c->len) * 0x100000001b3ull;
}

#define MLP_ST_SUM_KEY "mlp.checksum"
#define MLP_ST_SUM_INIT 0xcbf29ce484222325ull

/* Remove the PATH.tmp.PID files that writers killed mid-save left (their PID
 * is gone); those of live processes, and anything else, stay. */
static void st_clean_stale(const char *path) {
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  size_t dn = slash ? (size_t)(slash - path) + 1 : 0, bn = strlen(base);
  char *dir = malloc(dn + 2);
  if (!dir)
    return;
  memcpy(dir, path, dn);
  strcpy(dir + dn, dn ? "" : ".");
  DIR *d = opendir(dir);
  struct dirent *de;
  while (d && (de = readdir(d))) {
    const char *nm = de->d_name;
    if (strncmp(nm, base, bn) || strncmp(nm + bn, ".tmp.", 5))
      continue;
    char *end;
    long pid = strtol(nm + bn + 5, &end, 10);
    if (*end || pid <= 0 || pid == (long)getpid() || !(kill((pid_t)pid, 0) && errno == ESRCH))
      continue;
    size_t fn = dn + strlen(nm) + 1;
    char *f = malloc(fn);
    if (f) {
      memcpy(f, path, dn);
      strcpy(f + dn, nm);
      remove(f);
      free(f);
    }
  }
  if (d)
    closedir(d);
  free(dir);
}

static int st_write(const char *path, const mlp_tensor_desc *t, int n, int checksum, char *err, size_t errlen);

int mlp_st_write(const char *path, const mlp_tensor_desc *t, int n, char *err, size_t errlen) {
  return st_write(path, t, n, 0, err, errlen);
}

int mlp_st_write_checked(const char *path, const mlp_tensor_desc *t, int n, char *err, size_t errlen) {
  return st_write(path, t, n, 1, err, errlen);
}

static int st_write(const char *path, const mlp_tensor_desc *t, int n, int checksum, char *err, size_t errlen) {
  if (!path || !*path)
    return st_fail(err, errlen, MLP_EINVAL, "mlp_st_write: no path");
  if (n < 0 || (n && !t))
    return st_fail(err, errlen, MLP_EINVAL, "%s: bad tensor list (%d tensors)", path, n);
  uint64_t *bytes = malloc(sizeof *bytes * (size_t)(n ? n : 1));
  if (!bytes)
    return st_fail(err, errlen, MLP_ENOMEM, "%s: out of memory", path);
  int rc = st_check_descs(path, t, n, bytes, err, errlen);
  if (rc) {
    free(bytes);
    return rc;
  }

  /* the header: {"NAME":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},...} */
  st_text h = {0};
  uint64_t off = 0;
  st_puts(&h, "{");
  for (int k = 0; k < n; k++) {
    if (off > UINT64_MAX - bytes[k]) {
      free(bytes);
      free(h.s);
      return st_fail(err, errlen, MLP_EINVAL, "%s: the tensors are too large", path);
    }
    st_puts(&h, k ? "," : "");
    st_put_json_string(&h, t[k].name);
    st_puts(&h, ":{\"dtype\":\"");
    st_puts(&h, mlp_dtype_st_names[t[k].dtype]);
    st_puts(&h, "\",\"shape\":[");
    for (int i = 0; i < t[k].rank; i++) {
      st_puts(&h, i ? "," : "");
      st_putu(&h, (unsigned long long)t[k].shape[i]);
    }
    st_puts(&h, "],\"data_offsets\":[");
    st_putu(&h, (unsigned long long)off);
    st_puts(&h, ",");
    off += bytes[k];
    st_putu(&h, (unsigned long long)off);
    st_puts(&h, "]}");
  }
  if (checksum) {
    st_sum c = {MLP_ST_SUM_INIT, 0, {0}, 0};
    for (int k = 0; k < n; k++)
      if (bytes[k])
        st_sum_feed(&c, t[k].data, (size_t)bytes[k]);
    char v[40];
    snprintf(v, sizeof v, "w64:%016llx", (unsigned long long)st_sum_finish(&c));
    st_puts(&h, n ? ",\"__metadata__\":{\"" MLP_ST_SUM_KEY "\":\"" : "\"__metadata__\":{\"" MLP_ST_SUM_KEY "\":\"");
    st_puts(&h, v);
    st_puts(&h, "\"}");
  }
  st_puts(&h, "}");
  while (h.len % 8) /* the data section starts at 8 + len: a multiple of 8 */
    st_puts(&h, " ");
  if (h.oom) {
    free(bytes);
    free(h.s);
    return st_fail(err, errlen, MLP_ENOMEM, "%s: out of memory for the header", path);
  }
  unsigned char len8[8];
  for (int i = 0; i < 8; i++)
    len8[i] = (unsigned char)((uint64_t)h.len >> (8 * i));

  size_t tn = strlen(path) + 32;
  char *tmp = malloc(tn);
  if (!tmp) {
    free(bytes);
    free(h.s);
    return st_fail(err, errlen, MLP_ENOMEM, "%s: out of memory", path);
  }
  snprintf(tmp, tn, "%s.tmp.%ld", path, (long)getpid());
  st_clean_stale(path);
  FILE *fp = fopen(tmp, "wb");
  if (!fp) {
    rc = st_fail(err, errlen, MLP_EIO, "%s: cannot create %s: %s", path, tmp, strerror(errno));
    goto done;
  }
  errno = 0;
  int ok = fwrite(len8, 1, 8, fp) == 8 && fwrite(h.s, 1, h.len, fp) == h.len;
  for (int k = 0; ok && k < n; k++)
    ok = !bytes[k] || fwrite(t[k].data, 1, (size_t)bytes[k], fp) == (size_t)bytes[k];
  if (!ok || fflush(fp)) {
    rc = st_fail(err, errlen, MLP_EIO, "%s: cannot write %s: %s", path, tmp, errno ? strerror(errno) : "write error");
  } else if (fsync(fileno(fp))) {
    rc = st_fail(err, errlen, MLP_EIO, "%s: cannot sync %s: %s", path, tmp, strerror(errno));
  }
  int closed = fclose(fp);
  if (!rc && closed)
    rc = st_fail(err, errlen, MLP_EIO, "%s: cannot close %s: %s", path, tmp, strerror(errno));
  if (!rc && rename(tmp, path))
    rc = st_fail(err, errlen, MLP_EIO, "%s: cannot rename %s over it: %s", path, tmp, strerror(errno));
  if (rc)
    remove(tmp);
  else
    st_sync_dir(path);
done:
  free(tmp);
  free(bytes);
  free(h.s);
  return rc;
}

/* ================================================================ reader */

/* The parser's state. Positions in messages are header bytes (0 = the first
 * byte after the length) with the file offset beside them. */
typedef struct st_parser {
  const unsigned char *s; /* the header */
  size_t n, i;            /* its length; the current position */
  uint64_t data_size;     /* bytes in the data section */
  const char *path;
  char *err;
  size_t errlen;
  char *names;            /* decoded tensor names, NUL-terminated, N + 1 bytes */
  size_t names_used;
  mlp_tensor_desc *t;     /* the tensors so far (names point into `names`) */
  struct st_ent {         /* beside each: where its name is, its data_offsets */
    size_t at;
    uint64_t begin, end;
  } *ent;
  int nt, cap;
  int seen_metadata;
  int has_sum;            /* __metadata__ holds mlp.checksum: its value */
  char sum[40];
} st_parser;

static void st_ws(st_parser *p) {
  while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
    p->i++;
}

/* A syntax error at the current position: "expected X, found Y". */
static int st_syntax(st_parser *p, const char *expected) {
  char found[32];
  if (p->i >= p->n) {
    snprintf(found, sizeof found, "the end of the header");
  } else {
    unsigned c = p->s[p->i];
    if (c > 0x20 && c < 0x7f)
      snprintf(found, sizeof found, "'%c'", (char)c);
    else
      snprintf(found, sizeof found, "byte 0x%02x", c);
  }
  return st_fail(p->err, p->errlen, MLP_ECORRUPT,
                 "%s: invalid header JSON at header byte %zu (file byte %zu): expected %s, found %s", p->path, p->i,
                 p->i + 8, expected, found);
}

/* A syntax error with its own wording at position `at`. */
static int st_syntax_at(st_parser *p, size_t at, const char *what) {
  return st_fail(p->err, p->errlen, MLP_ECORRUPT, "%s: invalid header JSON at header byte %zu (file byte %zu): %s",
                 p->path, at, at + 8, what);
}

static int st_expect(st_parser *p, char c, const char *expected) {
  st_ws(p);
  if (p->i >= p->n || p->s[p->i] != (unsigned char)c)
    return st_syntax(p, expected);
  p->i++;
  return MLP_OK;
}

static int st_hex4(st_parser *p, size_t at, unsigned *v) {
  *v = 0;
  for (int k = 0; k < 4; k++) {
    unsigned c = at + (size_t)k < p->n ? p->s[at + (size_t)k] : 0;
    int d = c >= '0' && c <= '9' ? (int)(c - '0') : c >= 'a' && c <= 'f' ? (int)(c - 'a' + 10)
          : c >= 'A' && c <= 'F' ? (int)(c - 'A' + 10) : -1;
    if (d < 0)
      return st_syntax_at(p, at - 2, "a \\u escape needs four hex digits");
    *v = *v * 16 + (unsigned)d;
  }
  return MLP_OK;
}

/* string := '"' (char | escape)* '"'. Decodes into out[0..cap) (cut short
 * when longer; always NUL-terminated when cap > 0) and sets *len to the full
 * decoded length. The header is already known to be valid UTF-8, and a
 * decoded string is never longer than its JSON text. */
static int st_string(st_parser *p, char *out, size_t cap, size_t *len) {
  int rc;
  size_t k = 0;
  if (p->i >= p->n || p->s[p->i] != '"')
    return st_syntax(p, "a string");
  size_t start = p->i++;
  for (;;) {
    if (p->i >= p->n)
      return st_syntax_at(p, start, "unterminated string");
    unsigned c = p->s[p->i];
    unsigned char u[4];
    size_t nu = 1;
    if (c == '"') {
      p->i++;
      break;
    }
    if (c < 0x20)
      return st_syntax_at(p, p->i, "control character in a string (it must be escaped)");
    if (c != '\\') {
      u[0] = (unsigned char)c;
      p->i++;
    } else {
      static const char esc[] = "\"\\/bfnrt", val[] = "\"\\/\b\f\n\r\t";
      unsigned e = p->i + 1 < p->n ? p->s[p->i + 1] : 0;
      const char *simple = e ? strchr(esc, (int)e) : NULL;
      if (simple) {
        u[0] = (unsigned char)val[simple - esc];
        p->i += 2;
      } else if (e == 'u') {
        unsigned cp, lo;
        if ((rc = st_hex4(p, p->i + 2, &cp)))
          return rc;
        size_t at = p->i;
        p->i += 6;
        if (cp >= 0xdc00 && cp <= 0xdfff)
          return st_syntax_at(p, at, "unpaired low surrogate in a \\u escape");
        if (cp >= 0xd800 && cp <= 0xdbff) {
          if (p->i + 1 >= p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u')
            return st_syntax_at(p, at, "unpaired high surrogate in a \\u escape");
          if ((rc = st_hex4(p, p->i + 2, &lo)))
            return rc;
          if (lo < 0xdc00 || lo > 0xdfff)
            return st_syntax_at(p, at, "unpaired high surrogate in a \\u escape");
          p->i += 6;
          cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        if (cp < 0x80) {
          u[0] = (unsigned char)cp;
        } else if (cp < 0x800) {
          u[0] = (unsigned char)(0xc0 | cp >> 6);
          u[1] = (unsigned char)(0x80 | (cp & 0x3f));
          nu = 2;
        } else if (cp < 0x10000) {
          u[0] = (unsigned char)(0xe0 | cp >> 12);
          u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
          u[2] = (unsigned char)(0x80 | (cp & 0x3f));
          nu = 3;
        } else {
          u[0] = (unsigned char)(0xf0 | cp >> 18);
          u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
          u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
          u[3] = (unsigned char)(0x80 | (cp & 0x3f));
          nu = 4;
        }
      } else {
        return st_syntax_at(p, p->i, "invalid escape in a string");
      }
    }
    for (size_t j = 0; j < nu; j++, k++)
      if (k + 1 < cap)
        out[k] = (char)u[j];
  }
  if (cap)
    out[k + 1 < cap ? k : cap - 1] = 0;
  *len = k;
  return MLP_OK;
}

/* uint := '0' | [1-9][0-9]*, at most 2^64 - 1; signs, fractions and
 * exponents are refused. `what` says which number it is, for messages. */
static int st_uint(st_parser *p, uint64_t *v, const char *what) {
  char msg[160];
  st_ws(p);
  size_t at = p->i;
  if (p->i < p->n && p->s[p->i] == '-') {
    snprintf(msg, sizeof msg, "%s is negative", what);
    return st_syntax_at(p, at, msg);
  }
  if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') {
    snprintf(msg, sizeof msg, "a non-negative integer (%s)", what);
    return st_syntax(p, msg);
  }
  if (p->s[p->i] == '0' && p->i + 1 < p->n && p->s[p->i + 1] >= '0' && p->s[p->i + 1] <= '9') {
    snprintf(msg, sizeof msg, "%s has a leading zero", what);
    return st_syntax_at(p, at, msg);
  }
  *v = 0;
  while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
    unsigned d = p->s[p->i] - '0';
    if (*v > (UINT64_MAX - d) / 10) {
      snprintf(msg, sizeof msg, "%s is too large", what);
      return st_syntax_at(p, at, msg);
    }
    *v = *v * 10 + d;
    p->i++;
  }
  if (p->i < p->n && (p->s[p->i] == '.' || p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
    snprintf(msg, sizeof msg, "%s is not an integer", what);
    return st_syntax_at(p, at, msg);
  }
  return MLP_OK;
}

/* uints := '[' (uint (',' uint)*)? ']'. Stores the first `cap` values and
 * counts them all. */
static int st_uints(st_parser *p, uint64_t *v, int cap, int *count, const char *what) {
  int rc;
  char msg[160];
  *count = 0;
  snprintf(msg, sizeof msg, "'[' to start %s", what);
  if ((rc = st_expect(p, '[', msg)))
    return rc;
  st_ws(p);
  if (p->i < p->n && p->s[p->i] == ']') {
    p->i++;
    return MLP_OK;
  }
  for (;;) {
    uint64_t x = 0;
    if ((rc = st_uint(p, &x, what)))
      return rc;
    if (*count < cap)
      v[*count] = x;
    if (*count < INT32_MAX)
      ++*count;
    st_ws(p);
    if (p->i < p->n && p->s[p->i] == ',') {
      p->i++;
      continue;
    }
    if (p->i < p->n && p->s[p->i] == ']') {
      p->i++;
      return MLP_OK;
    }
    snprintf(msg, sizeof msg, "',' or ']' in %s", what);
    return st_syntax(p, msg);
  }
}

/* metadata := '{' (string ':' string (',' string ':' string)*)? '}'.
 * Checked; only mlp.checksum is kept. */
static int st_metadata(st_parser *p) {
  int rc;
  size_t len;
  char key[sizeof MLP_ST_SUM_KEY + 1], scratch[sizeof p->sum];
  if ((rc = st_expect(p, '{', "'{' to start __metadata__ (an object of strings)")))
    return rc;
  st_ws(p);
  if (p->i < p->n && p->s[p->i] == '}') {
    p->i++;
    return MLP_OK;
  }
  for (;;) {
    st_ws(p);
    size_t klen;
    if ((rc = st_string(p, key, sizeof key, &klen)) || (rc = st_expect(p, ':', "':' after a key")))
      return rc;
    st_ws(p);
    if (p->i >= p->n || p->s[p->i] != '"')
      return st_syntax(p, "a string (__metadata__ values are strings)");
    if ((rc = st_string(p, scratch, sizeof scratch, &len)))
      return rc;
    if (klen == strlen(MLP_ST_SUM_KEY) && !strcmp(key, MLP_ST_SUM_KEY)) {
      if (len >= sizeof p->sum)
        return st_fail(p->err, p->errlen, MLP_ECORRUPT, "%s: the %s in __metadata__ is malformed", p->path,
                       MLP_ST_SUM_KEY);
      memcpy(p->sum, scratch, len + 1);
      p->has_sum = 1;
    }
    st_ws(p);
    if (p->i < p->n && p->s[p->i] == ',') {
      p->i++;
      continue;
    }
    return st_expect(p, '}', "',' or '}' in __metadata__");
  }
}

/* The safetensors dtypes we know but do not support. */
static const char *const st_other_dtypes[] = {"F64", "I64", "U64", "U32", "I16", "U16", "I8", "U8", "F8_E4M3",
                                              "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64"};

/* entry := '{' key ':' value (',' key ':' value)* '}' with exactly the keys
 * dtype (a string), shape (uints) and data_offsets (two uints), in any order.
 * Checks the entry and fills t and ent. */
static int st_entry(st_parser *p, mlp_tensor_desc *t, struct st_ent *ent) {
  static const char *const keys[3] = {"dtype", "shape", "data_offsets"};
  const char *name = t->name;
  char key[40], dt[24], msg[200];
  size_t len, dtlen = 0;
  uint64_t shape[MLP_MAXRANK], off[2];
  int rc, seen[3] = {0, 0, 0}, rank = 0, noff = 0;
  snprintf(msg, sizeof msg, "'{' to start the entry of tensor '%s'", name);
  if ((rc = st_expect(p, '{', msg)))
    return rc;
  st_ws(p);
  if (p->i < p->n && p->s[p->i] == '}') {
    p->i++;
  } else {
    for (;;) {
      st_ws(p);
      size_t at = p->i;
      if ((rc = st_string(p, key, sizeof key, &len)) || (rc = st_expect(p, ':', "':' after a key")))
        return rc;
      int w = 0;
      while (w < 3 && !(len == strlen(keys[w]) && !memcmp(key, keys[w], len)))
        w++;
      if (w == 3)
        return st_fail(p->err, p->errlen, MLP_ECORRUPT,
                       "%s: tensor '%s' has an unexpected key '%s%s' at header byte %zu (expected dtype, shape, "
                       "data_offsets)",
                       p->path, name, key, len >= sizeof key ? "..." : "", at);
      if (seen[w])
        return st_fail(p->err, p->errlen, MLP_ECORRUPT, "%s: tensor '%s' has key '%s' twice (header byte %zu)",
                       p->path, name, keys[w], at);
      seen[w] = 1;
      st_ws(p);
      if (w == 0) {
        if (p->i >= p->n || p->s[p->i] != '"')
          return st_syntax(p, "a string (the dtype)");
        if ((rc = st_string(p, dt, sizeof dt, &dtlen)))
          return rc;
      } else if (w == 1) {
        snprintf(msg, sizeof msg, "the shape of tensor '%s'", name);
        if ((rc = st_uints(p, shape, MLP_MAXRANK, &rank, msg)))
          return rc;
      } else {
        snprintf(msg, sizeof msg, "the data_offsets of tensor '%s'", name);
        if ((rc = st_uints(p, off, 2, &noff, msg)))
          return rc;
      }
      st_ws(p);
      if (p->i < p->n && p->s[p->i] == ',') {
        p->i++;
        continue;
      }
      snprintf(msg, sizeof msg, "',' or '}' in the entry of tensor '%s'", name);
      if ((rc = st_expect(p, '}', msg)))
        return rc;
      break;
    }
  }
  for (int w = 0; w < 3; w++)
    if (!seen[w])
      return st_fail(p->err, p->errlen, MLP_ECORRUPT, "%s: tensor '%s' has no '%s'", p->path, name, keys[w]);

  /* dtype */
  int dtype = -1;
  for (int d = 0; d < 5; d++)
    if (dtlen == strlen(mlp_dtype_st_names[d]) && !memcmp(dt, mlp_dtype_st_names[d], dtlen))
      dtype = d;
  if (dtype < 0) {
    const char *more = dtlen >= sizeof dt ? "..." : "";
    for (size_t d = 0; d < sizeof st_other_dtypes / sizeof *st_other_dtypes; d++)
      if (dtlen == strlen(st_other_dtypes[d]) && !memcmp(dt, st_other_dtypes[d], dtlen))
        return st_fail(p->err, p->errlen, MLP_ECORRUPT,
                       "%s: dtype '%s' of tensor '%s' is not supported (f32, bf16, f16, i32, bool)", p->path, dt, name);
    return st_fail(p->err, p->errlen, MLP_ECORRUPT, "%s: unknown dtype '%s%s' of tensor '%s'", p->path, dt, more,
                   name);
  }
  t->dtype = dtype;

  /* shape */
  if (rank > MLP_MAXRANK)
    return st_fail(p->err, p->errlen, MLP_ECORRUPT, "%s: tensor '%s' has rank %d, above the maximum %d", p->path,
                   name, rank, MLP_MAXRANK);
  uint64_t bytes = (uint64_t)mlp_dtype_sizes[dtype];
  int zero = 0;
  for (int i = 0; i < rank; i++) {
    if (shape[i] > (uint64_t)INT64_MAX)
      return st_fail(p->err, p->errlen, MLP_ECORRUPT, "%s: tensor '%s': dim %d (%llu) is too large", p->path, name,
                     i, (unsigned long long)shape[i]);
    zero |= shape[i] == 0;
    t->shape[i] = (int64_t)shape[i];
  }
  t->rank = rank;
  for (int i = 0; i < rank && !zero; i++) { /* the product overflows only if no dim is 0 */
    if (bytes > (uint64_t)INT64_MAX / shape[i])
      return st_fail(p->err, p->errlen, MLP_ECORRUPT, "%s: tensor '%s': the product of the shape overflows", p->path,
                     name);
    bytes *= shape[i];
  }
  if (zero)
    bytes = 0;

  /* data_offsets */
  if (noff != 2)
    return st_fail(p->err, p->errlen, MLP_ECORRUPT, "%s: tensor '%s': data_offsets has %d numbers, not 2 [begin, end]",
                   p->path, name, noff);
  if (off[0] > off[1])
    return st_fail(p->err, p->errlen, MLP_ECORRUPT, "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin",
                   p->path, name, (unsigned long long)off[0], (unsigned long long)off[1]);
  if (off[1] > p->data_size)
    return st_fail(p->err, p->errlen, MLP_ECORRUPT,
                   "%s: tensor '%s': data_offsets [%llu, %llu] run past the end of the %llu-byte data section "
                   "(truncated file?)",
                   p->path, name, (unsigned long long)off[0], (unsigned long long)off[1],
                   (unsigned long long)p->data_size);
  if (off[1] - off[0] != bytes) {
    char s[8 * 22 + 4];
    size_t k = 0;
    s[k++] = '[';
    for (int i = 0; i < rank; i++)
      k += (size_t)snprintf(s + k, sizeof s - k, "%s%llu", i ? ", " : "", (unsigned long long)shape[i]);
    snprintf(s + k, sizeof s - k, "]");
    return st_fail(p->err, p->errlen, MLP_ECORRUPT,
                   "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes, but %s %s needs %llu", p->path, name,
                   (unsigned long long)off[0], (unsigned long long)off[1], (unsigned long long)(off[1] - off[0]),
                   mlp_dtype_st_names[dtype], s, (unsigned long long)bytes);
  }
  ent->begin = off[0];
  ent->end = off[1];
  return MLP_OK;
}

/* header := ws '{' ws (name ':' (entry | metadata) (',' name ':' ...)*)? '}' ws */
static int st_header(st_parser *p) {
  int rc;
  if ((rc = st_expect(p, '{', "'{' (the header is a JSON object)")))
    return rc;
  st_ws(p);
  if (p->i < p->n && p->s[p->i] == '}') {
    p->i++;
  } else {
    for (;;) {
      st_ws(p);
      size_t at = p->i, len;
      char *name = p->names + p->names_used;
      if (p->i >= p->n || p->s[p->i] != '"')
        return st_syntax(p, "a tensor name (a string)");
      if ((rc = st_string(p, name, p->n + 1 - p->names_used, &len)) || (rc = st_expect(p, ':', "':' after a name")))
        return rc;
      if (len == 12 && !memcmp(name, "__metadata__", 12)) {
        if (p->seen_metadata)
          return st_fail(p->err, p->errlen, MLP_ECORRUPT, "%s: '__metadata__' appears twice (header byte %zu)",
                         p->path, at);
        p->seen_metadata = 1;
        if ((rc = st_metadata(p)))
          return rc;
      } else {
        if (strlen(name) != len)
          return st_fail(p->err, p->errlen, MLP_ECORRUPT,
                         "%s: the tensor name at header byte %zu contains a NUL character", p->path, at);
        p->names_used += len + 1;
        if (p->nt == p->cap) {
          int cap = p->cap ? 2 * p->cap : 16;
          mlp_tensor_desc *t = realloc(p->t, sizeof *t * (size_t)cap);
          if (t)
            p->t = t;
          struct st_ent *e = t ? realloc(p->ent, sizeof *e * (size_t)cap) : NULL;
          if (!e)
            return st_fail(p->err, p->errlen, MLP_ENOMEM, "%s: out of memory for %d tensors", p->path, cap);
          p->ent = e;
          p->cap = cap;
        }
        mlp_tensor_desc *t = &p->t[p->nt];
        memset(t, 0, sizeof *t);
        t->name = name;
        p->ent[p->nt].at = at;
        if ((rc = st_entry(p, t, &p->ent[p->nt])))
          return rc;
        p->nt++;
      }
      st_ws(p);
      if (p->i < p->n && p->s[p->i] == ',') {
        p->i++;
        continue;
      }
      if ((rc = st_expect(p, '}', "',' or '}' after a tensor")))
        return rc;
      break;
    }
  }
  st_ws(p);
  if (p->i < p->n)
    return st_syntax_at(p, p->i, "unexpected bytes after the header object (only spaces may follow it)");
  return MLP_OK;
}

typedef struct st_span {
  uint64_t begin, end;
  int ix;
} st_span;

static int st_cmp_span(const void *a, const void *b) {
  const st_span *x = a, *y = b;
  if (x->begin != y->begin)
    return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end)
    return x->end < y->end ? -1 : 1;
  return (x->ix > y->ix) - (x->ix < y->ix);
}

/* After the header: names unique, and the tensors tile the data section
 * exactly, in some order. Also builds the name index (sorted by name). */
static int st_check_all(st_parser *p, int32_t *by_name) {
  int n = p->nt, rc = MLP_OK;
  if (!n) {
    if (p->data_size)
      return st_fail(p->err, p->errlen, MLP_ECORRUPT, "%s: %llu unused bytes after the last tensor (there are none)",
                     p->path, (unsigned long long)p->data_size);
    return MLP_OK;
  }
  st_name_ix *ix = malloc(sizeof *ix * (size_t)n);
  st_span *sp = malloc(sizeof *sp * (size_t)n);
  if (!ix || !sp) {
    free(ix);
    free(sp);
    return st_fail(p->err, p->errlen, MLP_ENOMEM, "%s: out of memory for %d tensors", p->path, n);
  }
  for (int k = 0; k < n; k++) {
    ix[k] = (st_name_ix){p->t[k].name, k};
    sp[k] = (st_span){p->ent[k].begin, p->ent[k].end, k};
  }
  qsort(ix, (size_t)n, sizeof *ix, st_cmp_name);
  for (int k = 0; k < n && !rc; k++) {
    by_name[k] = ix[k].ix;
    if (k && !strcmp(ix[k - 1].name, ix[k].name))
      rc = st_fail(p->err, p->errlen, MLP_ECORRUPT, "%s: duplicate tensor name '%s' (header bytes %zu and %zu)",
                   p->path, ix[k].name, p->ent[ix[k - 1].ix].at, p->ent[ix[k].ix].at);
  }
  qsort(sp, (size_t)n, sizeof *sp, st_cmp_span);
  uint64_t pos = 0;
  for (int k = 0; k < n && !rc; k++) {
    const st_span *s = &sp[k];
    if (s->begin < pos) {
      const st_span *q = &sp[k - 1];
      rc = st_fail(p->err, p->errlen, MLP_ECORRUPT, "%s: tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] overlap",
                   p->path, p->t[q->ix].name, (unsigned long long)q->begin, (unsigned long long)q->end,
                   p->t[s->ix].name, (unsigned long long)s->begin, (unsigned long long)s->end);
    } else if (s->begin > pos) {
      rc = st_fail(p->err, p->errlen, MLP_ECORRUPT,
                   "%s: %llu unused bytes before tensor '%s' (data_offsets [%llu, %llu]; the data before it ends at "
                   "%llu)",
                   p->path, (unsigned long long)(s->begin - pos), p->t[s->ix].name, (unsigned long long)s->begin,
                   (unsigned long long)s->end, (unsigned long long)pos);
    }
    pos = s->end;
  }
  if (!rc && pos != p->data_size)
    rc = st_fail(p->err, p->errlen, MLP_ECORRUPT, "%s: %llu unused bytes after the last tensor", p->path,
                 (unsigned long long)(p->data_size - pos));
  free(ix);
  free(sp);
  return rc;
}

/* Parse and check a whole file in memory. On success fills f, which then
 * owns buf; on failure f is zeroed and buf still belongs to the caller.
 * f->t is one allocation: the n descs, then n int32 indices of the descs in
 * name order (for mlp_st_find), then the names. */
static int st_parse(const char *path, unsigned char *buf, size_t size, mlp_st_file *f, char *err, size_t errlen) {
  memset(f, 0, sizeof *f);
  if (size < 8)
    return st_fail(err, errlen, MLP_ECORRUPT,
                   "%s: file is %zu bytes, too short for a safetensors file (at least the 8-byte header length)", path,
                   size);
  uint64_t hn = 0;
  for (int i = 0; i < 8; i++)
    hn |= (uint64_t)buf[i] << (8 * i);
  if (hn > size - 8)
    return st_fail(err, errlen, MLP_ECORRUPT,
                   "%s: header length %llu exceeds the %zu bytes that follow it (truncated, or not a safetensors file)",
                   path, (unsigned long long)hn, size - 8);
  if (hn > MLP_ST_MAX_HEADER)
    return st_fail(err, errlen, MLP_ECORRUPT, "%s: header length %llu is above the limit of 100 MB (%u bytes)", path,
                   (unsigned long long)hn, MLP_ST_MAX_HEADER);
  st_parser p = {0};
  p.s = buf + 8;
  p.n = (size_t)hn;
  p.data_size = size - 8 - p.n;
  p.path = path;
  p.err = err;
  p.errlen = errlen;
  size_t bad = st_utf8_check(p.s, p.n);
  if (bad < p.n)
    return st_syntax_at(&p, bad, "the header is not valid UTF-8");
  p.names = malloc(p.n + 1);
  if (!p.names)
    return st_fail(err, errlen, MLP_ENOMEM, "%s: out of memory for a %zu-byte header", path, p.n);
  int rc = st_header(&p);
  int32_t *by_name = NULL;
  if (!rc && p.nt && !(by_name = malloc(sizeof *by_name * (size_t)p.nt)))
    rc = st_fail(err, errlen, MLP_ENOMEM, "%s: out of memory for %d tensors", path, p.nt);
  if (!rc)
    rc = st_check_all(&p, by_name);
  if (!rc && p.has_sum) { /* the data section against the checksum the writer stored */
    st_sum c = {MLP_ST_SUM_INIT, 0, {0}, 0};
    st_sum_feed(&c, buf + 8 + p.n, p.data_size);
    char v[40];
    snprintf(v, sizeof v, "w64:%016llx", (unsigned long long)st_sum_finish(&c));
    if (strcmp(v, p.sum))
      rc = st_fail(err, errlen, MLP_ECORRUPT, "%s: checksum mismatch: the data is corrupted (the file says %s, the "
                   "data gives %s)", path, p.sum, v);
  }
  if (!rc && p.nt) {
    size_t head = sizeof(mlp_tensor_desc) * (size_t)p.nt + sizeof(int32_t) * (size_t)p.nt;
    unsigned char *block = malloc(head + p.names_used);
    if (!block) {
      rc = st_fail(err, errlen, MLP_ENOMEM, "%s: out of memory for %d tensors", path, p.nt);
    } else {
      mlp_tensor_desc *t = (mlp_tensor_desc *)block;
      char *names = (char *)block + head;
      memcpy(names, p.names, p.names_used);
      memcpy(block + sizeof(mlp_tensor_desc) * (size_t)p.nt, by_name, sizeof(int32_t) * (size_t)p.nt);
      for (int k = 0; k < p.nt; k++) {
        t[k] = p.t[k];
        t[k].name = names + (p.t[k].name - p.names);
        t[k].data = buf + 8 + p.n + p.ent[k].begin;
      }
      f->buf = buf;
      f->size = size;
      f->n = p.nt;
      f->t = t;
    }
  } else if (!rc) {
    f->buf = buf;
    f->size = size;
  }
  free(by_name);
  free(p.names);
  free(p.t);
  free(p.ent);
  return rc;
}

int mlp_st_read(const char *path, mlp_st_file *f, char *err, size_t errlen) {
  if (!f)
    return st_fail(err, errlen, MLP_EINVAL, "mlp_st_read: f is NULL");
  memset(f, 0, sizeof *f);
  if (!path)
    return st_fail(err, errlen, MLP_EINVAL, "mlp_st_read: path is NULL");
  int fd = open(path, O_RDONLY);
  if (fd < 0)
    return st_fail(err, errlen, MLP_EIO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st)) {
    int e = errno;
    close(fd);
    return st_fail(err, errlen, MLP_EIO, "%s: cannot stat: %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return st_fail(err, errlen, MLP_EIO, "%s: not a regular file", path);
  }
  if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX - 1) {
    close(fd);
    return st_fail(err, errlen, MLP_ENOMEM, "%s: file too large for memory", path);
  }
  size_t size = (size_t)st.st_size;
  unsigned char *buf = malloc(size ? size : 1);
  if (!buf) {
    close(fd);
    return st_fail(err, errlen, MLP_ENOMEM, "%s: out of memory for %zu bytes", path, size);
  }
  size_t got = 0;
  while (got < size) {
    ssize_t r = read(fd, buf + got, size - got > ((size_t)1 << 30) ? ((size_t)1 << 30) : size - got);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0) {
      int e = errno;
      close(fd);
      free(buf);
      if (r < 0)
        return st_fail(err, errlen, MLP_EIO, "%s: read error: %s", path, strerror(e));
      return st_fail(err, errlen, MLP_EIO, "%s: file shrank while being read (%zu of %zu bytes)", path, got, size);
    }
    got += (size_t)r;
  }
  close(fd);
  int rc = st_parse(path, buf, size, f, err, errlen);
  if (rc)
    free(buf);
  return rc;
}

const mlp_tensor_desc *mlp_st_find(const mlp_st_file *f, const char *name) {
  if (!f || !f->t || f->n <= 0 || !name)
    return NULL;
  const int32_t *by_name = (const int32_t *)(f->t + f->n);
  int lo = 0, hi = f->n - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    int c = strcmp(name, f->t[by_name[mid]].name);
    if (!c)
      return &f->t[by_name[mid]];
    if (c < 0)
      hi = mid - 1;
    else
      lo = mid + 1;
  }
  return NULL;
}

void mlp_st_free(mlp_st_file *f) {
  if (!f)
    return;
  free(f->buf);
  free(f->t);
  memset(f, 0, sizeof *f);
}
