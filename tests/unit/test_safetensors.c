/* test_safetensors.c: the runtime's safetensors reader and writer
 * (templates/runtime/tgm_safetensors.c, included whole).
 *
 *   round trips of every dtype, ranks 0 to 8, empty tensors, odd names;
 *   golden files written by Hugging Face's Python package
 *   (tests/data/make_st_golden.py): read back, and our writer's bytes equal
 *   to theirs for the same tensors in the same order;
 *   corrupt files, each refused with the right code and a precise message;
 *   atomic writes: a failed write creates nothing and leaves the old file.
 *
 * Runs from the repository root (tests/data/...), writes under a mkdtemp
 * directory in /tmp and removes it. Prints "N passed, M failed". */
#define _POSIX_C_SOURCE 200809L
#include "../../templates/runtime/tgm_safetensors.c"

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

static int npass, nfail;
static char dir[64];

static void check(int ok, const char *fmt, ...) TGM_ST_PRINTF(2, 3);
static void check(int ok, const char *fmt, ...) {
  if (ok) {
    npass++;
    return;
  }
  nfail++;
  va_list ap;
  va_start(ap, fmt);
  printf("FAIL: ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
}

/* A path inside the test directory (one of a few rotating buffers). */
static const char *in_dir(const char *name) {
  static char buf[4][512];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
  return buf[k];
}

static int write_bytes(const char *path, const void *p, size_t n) {
  FILE *fp = fopen(path, "wb");
  if (!fp)
    return -1;
  int ok = fwrite(p, 1, n, fp) == n;
  return fclose(fp) == 0 && ok ? 0 : -1;
}

/* The whole file, malloc'd (NULL if unreadable). */
static unsigned char *read_bytes(const char *path, size_t *n) {
  FILE *fp = fopen(path, "rb");
  if (!fp)
    return NULL;
  unsigned char *p = NULL;
  size_t cap = 0;
  *n = 0;
  for (;;) {
    if (*n == cap) {
      cap = cap ? 2 * cap : 4096;
      unsigned char *q = realloc(p, cap);
      if (!q)
        break;
      p = q;
    }
    size_t r = fread(p + *n, 1, cap - *n, fp);
    if (!r)
      break;
    *n += r;
  }
  fclose(fp);
  return p;
}

static int exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* Entries of the test directory: how many, and whether one is a temp file. */
static int dir_entries(int *tmp_files) {
  DIR *d = opendir(dir);
  int n = 0;
  *tmp_files = 0;
  if (!d)
    return -1;
  for (struct dirent *e; (e = readdir(d));) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
      continue;
    n++;
    *tmp_files += strstr(e->d_name, ".tmp.") != NULL;
  }
  closedir(d);
  return n;
}

/* Empty the test directory (files and one level of subdirectories). */
static void clear_dir(const char *path) {
  DIR *d = opendir(path);
  if (!d)
    return;
  for (struct dirent *e; (e = readdir(d));) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
      continue;
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    struct stat st;
    if (!lstat(p, &st) && S_ISDIR(st.st_mode)) {
      clear_dir(p);
      rmdir(p);
    } else {
      unlink(p);
    }
  }
  closedir(d);
}

static int is_zeroed(const tgm_st_file *f) { return !f->buf && !f->t && !f->n && !f->size; }

/* ---------------------------------------------------------------- values */

/* The formulas of tests/data/make_st_golden.py. */
static float golden_float(int64_t i) { return (float)((i % 7) - 3) * 0.5f + 0.25f; }

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* Exact f32 -> f16 for the normal values above (no rounding needed). */
static uint16_t f16_exact(float f) {
  uint32_t u = f32_bits(f);
  if (!(u & 0x7fffffffu))
    return (uint16_t)(u >> 16);
  int e = (int)((u >> 23) & 0xff) - 127 + 15;
  return (uint16_t)(((u >> 16) & 0x8000u) | ((uint32_t)e << 10) | ((u >> 13) & 0x3ffu));
}

/* Fill `out` with the golden values of a tensor of `dt` and n elements. */
static void golden_data(int dt, int64_t n, void *out) {
  for (int64_t i = 0; i < n; i++) {
    switch (dt) {
    case TGM_F32: {
      float v = golden_float(i);
      memcpy((char *)out + 4 * i, &v, 4);
      break;
    }
    case TGM_BF16: {
      uint16_t v = (uint16_t)(f32_bits(golden_float(i)) >> 16);
      memcpy((char *)out + 2 * i, &v, 2);
      break;
    }
    case TGM_F16: {
      uint16_t v = f16_exact(golden_float(i));
      memcpy((char *)out + 2 * i, &v, 2);
      break;
    }
    case TGM_I32: {
      int32_t v = (int32_t)(i * 1000 - 1500);
      memcpy((char *)out + 4 * i, &v, 4);
      break;
    }
    default: ((unsigned char *)out)[i] = i % 3 == 0; break;
    }
  }
}

static int64_t numel_of(int rank, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++)
    n *= shape[i];
  return n;
}

/* ---------------------------------------------------------------- round trips */

static uint32_t lcg_state = 12345;
static unsigned char rnd_byte(void) {
  lcg_state = lcg_state * 1664525u + 1013904223u;
  return (unsigned char)(lcg_state >> 24);
}

/* Compare a read file against the descs written, in order. */
static void check_same(const char *what, const tgm_st_file *f, const tgm_tensor_desc *t, int n) {
  check(f->n == n, "%s: %d tensors read, %d written", what, f->n, n);
  if (f->n != n)
    return;
  for (int k = 0; k < n; k++) {
    const tgm_tensor_desc *r = &f->t[k];
    size_t bytes = (size_t)numel_of(t[k].rank, t[k].shape) * (size_t)tgm_dtype_sizes[t[k].dtype];
    check(!strcmp(r->name, t[k].name), "%s: tensor %d is '%s', want '%s'", what, k, r->name, t[k].name);
    check(r->dtype == t[k].dtype && r->rank == t[k].rank, "%s: '%s': dtype %d rank %d, want %d %d", what, t[k].name,
          r->dtype, r->rank, t[k].dtype, t[k].rank);
    int same_shape = 1;
    for (int i = 0; i < TGM_MAXRANK; i++)
      same_shape &= r->shape[i] == (i < t[k].rank ? t[k].shape[i] : 0);
    check(same_shape, "%s: '%s': shape differs", what, t[k].name);
    check(!bytes || !memcmp(r->data, t[k].data, bytes), "%s: '%s': data differs", what, t[k].name);
    check(tgm_st_find(f, t[k].name) == r, "%s: find('%s')", what, t[k].name);
  }
}

static void test_round_trip(void) {
  enum { NT = 26 };
  static unsigned char data[NT][4096];
  static const char *names[NT];
  static char namebuf[NT][48];
  tgm_tensor_desc t[NT];
  int n = 0;
  /* every dtype at ranks 0, 1, 3 and 8, and an empty tensor; bool first so
   * that the wider dtypes after it sit at odd offsets */
  static const int order[5] = {TGM_BOOL, TGM_F32, TGM_BF16, TGM_F16, TGM_I32};
  for (int o = 0; o < 5; o++) {
    int dt = order[o];
    static const int ranks[5] = {0, 1, 3, 8, 2};
    for (int r = 0; r < 5; r++) {
      tgm_tensor_desc *d = &t[n];
      memset(d, 0, sizeof *d);
      snprintf(namebuf[n], sizeof namebuf[n], "%s.rank%d%s", tgm_dtype_names[dt], ranks[r], r == 4 ? ".empty" : "");
      names[n] = namebuf[n];
      d->name = names[n];
      d->dtype = dt;
      d->rank = ranks[r];
      for (int i = 0; i < d->rank; i++)
        d->shape[i] = r == 4 ? (i ? 0 : 3) : r == 3 ? 1 + (i % 3 == 0) : 3 + i;
      int64_t bytes = numel_of(d->rank, d->shape) * tgm_dtype_sizes[dt];
      for (int64_t i = 0; i < bytes; i++)
        data[n][i] = dt == TGM_BOOL ? rnd_byte() & 1 : rnd_byte();
      d->data = r == 4 ? NULL : data[n]; /* an empty tensor needs no data */
      n++;
    }
  }
  /* a name that needs every kind of JSON escape, and UTF-8 */
  t[n] = (tgm_tensor_desc){"q\"uo\\te\n\r\t\b\f\x01\x1f\x7f/\xc3\xa9\xf0\x9f\x98\x80", TGM_I32, 1, {2}, data[n]};
  memset(data[n], 7, 8);
  n++;

  const char *path = in_dir("rt.safetensors");
  char err[512] = "";
  int rc = tgm_st_write(path, t, n, err, sizeof err);
  check(rc == TGM_OK, "round trip: write: %d %s", rc, err);
  int tmp;
  check(dir_entries(&tmp) == 1 && tmp == 0, "round trip: the directory holds only the file");

  /* the layout: N a multiple of 8, the header padded with spaces, data in order */
  size_t size;
  unsigned char *raw = read_bytes(path, &size);
  uint64_t hn = 0;
  for (int i = 0; raw && size >= 8 && i < 8; i++)
    hn |= (uint64_t)raw[i] << (8 * i);
  check(raw && hn % 8 == 0 && 8 + hn <= size, "round trip: header length %llu is a multiple of 8",
        (unsigned long long)hn);
  check(raw && raw[8] == '{' && (hn < 1 || raw[8 + hn - 1] == '}' || raw[8 + hn - 1] == ' '),
        "round trip: header is an object padded with spaces");
  free(raw);

  tgm_st_file f;
  rc = tgm_st_read(path, &f, err, sizeof err);
  check(rc == TGM_OK, "round trip: read: %d %s", rc, err);
  if (rc)
    return;
  check(f.size == size, "round trip: f.size");
  check_same("round trip", &f, t, n);
  size_t off = 8 + (size_t)hn; /* contiguous, in the given order */
  for (int k = 0; k < f.n; k++) {
    check(f.t[k].data == f.buf + off, "round trip: '%s' at file offset %zu", f.t[k].name, off);
    off += (size_t)numel_of(t[k].rank, t[k].shape) * (size_t)tgm_dtype_sizes[t[k].dtype];
  }
  check(off == f.size, "round trip: nothing after the data");
  check(tgm_st_find(&f, "nope") == NULL && tgm_st_find(&f, "") == NULL && tgm_st_find(&f, NULL) == NULL,
        "round trip: find of absent names");
  tgm_st_free(&f);
  check(is_zeroed(&f), "round trip: free zeroes the struct");
  tgm_st_free(&f); /* twice is harmless */

  /* overwrite the same path with fewer tensors */
  rc = tgm_st_write(path, t + 1, 2, err, sizeof err);
  check(rc == TGM_OK, "overwrite: %d %s", rc, err);
  rc = tgm_st_read(path, &f, err, sizeof err);
  check(rc == TGM_OK, "overwrite: read: %s", err);
  if (!rc)
    check_same("overwrite", &f, t + 1, 2);
  tgm_st_free(&f);
  check(dir_entries(&tmp) == 1 && tmp == 0, "overwrite: the directory holds only the file");
  unlink(path);

  /* no tensors at all: the header "{}" padded to 8 bytes */
  rc = tgm_st_write(path, NULL, 0, err, sizeof err);
  check(rc == TGM_OK, "no tensors: write: %s", err);
  raw = read_bytes(path, &size);
  check(raw && size == 16 && !memcmp(raw, "\x08\0\0\0\0\0\0\0{}      ", 16), "no tensors: the bytes");
  free(raw);
  rc = tgm_st_read(path, &f, err, sizeof err);
  check(rc == TGM_OK && f.n == 0 && f.t == NULL && tgm_st_find(&f, "x") == NULL, "no tensors: read: %s", err);
  tgm_st_free(&f);
  unlink(path);
}

/* Many tensors: the name index (binary search) and the overlap check at scale. */
static void test_many(void) {
  enum { N = 3000 };
  tgm_tensor_desc *t = calloc(N, sizeof *t);
  char(*names)[16] = calloc(N, 16);
  int32_t *vals = calloc(N, sizeof *vals);
  if (!t || !names || !vals) {
    check(0, "many: out of memory");
    free(t);
    free(names);
    free(vals);
    return;
  }
  for (int k = 0; k < N; k++) {
    snprintf(names[k], 16, "t%d", (k * 7919) % N); /* names not in sorted order */
    vals[k] = k;
    t[k] = (tgm_tensor_desc){names[k], TGM_I32, 1, {1}, &vals[k]};
  }
  const char *path = in_dir("many.safetensors");
  char err[512];
  int rc = tgm_st_write(path, t, N, err, sizeof err);
  check(rc == TGM_OK, "many: write: %s", err);
  tgm_st_file f;
  rc = tgm_st_read(path, &f, err, sizeof err);
  check(rc == TGM_OK, "many: read: %s", err);
  int bad = 0;
  for (int k = 0; !rc && k < N; k++) {
    const tgm_tensor_desc *d = tgm_st_find(&f, names[k]);
    int32_t v = -1;
    if (d)
      memcpy(&v, d->data, 4);
    bad += !d || d != &f.t[k] || v != k;
  }
  check(!rc && !bad, "many: %d lookups wrong", bad);
  tgm_st_free(&f);
  unlink(path);
  free(t);
  free(names);
  free(vals);
}

/* ---------------------------------------------------------------- golden files */

typedef struct golden {
  const char *name;
  int dtype, rank;
  int64_t shape[TGM_MAXRANK];
} golden;

/* tests/data/make_st_golden.py's TENSORS, in the order its writer chose
 * (dtype descending as the reference orders dtypes, then name). */
static const golden golden_all[] = {
    {"empty", TGM_F32, 2, {0, 3}},
    {"f32.r0", TGM_F32, 0, {0}},
    {"f32.r2", TGM_F32, 2, {2, 3}},
    {"i32.r1", TGM_I32, 1, {4}},
    {"q\"uo\\te\n\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\x01", TGM_I32, 1, {1}},
    {"bf16.r1", TGM_BF16, 1, {5}},
    {"f16.r8", TGM_F16, 8, {1, 2, 1, 2, 1, 2, 1, 1}},
    {"bool.r2", TGM_BOOL, 2, {2, 3}},
};
enum { NGOLDEN = sizeof golden_all / sizeof *golden_all };

/* Descs for golden tensors with their golden data (in `store`). */
static void golden_descs(const golden *g, int n, tgm_tensor_desc *t, unsigned char (*store)[256]) {
  for (int k = 0; k < n; k++) {
    memset(&t[k], 0, sizeof t[k]);
    t[k].name = g[k].name;
    t[k].dtype = g[k].dtype;
    t[k].rank = g[k].rank;
    memcpy(t[k].shape, g[k].shape, sizeof t[k].shape);
    golden_data(g[k].dtype, numel_of(g[k].rank, g[k].shape), store[k]);
    t[k].data = store[k];
  }
}

static void test_golden_read(const char *path, const golden *g, int n) {
  static unsigned char store[NGOLDEN][256];
  tgm_tensor_desc want[NGOLDEN];
  golden_descs(g, n, want, store);
  tgm_st_file f;
  char err[512];
  int rc = tgm_st_read(path, &f, err, sizeof err);
  check(rc == TGM_OK, "golden %s: read: %d %s", path, rc, err);
  if (rc)
    return;
  check_same(path, &f, want, n);
  /* the values once more, decoded, for a readable failure */
  const tgm_tensor_desc *d = tgm_st_find(&f, "f32.r2");
  if (d) {
    float v[6];
    memcpy(v, d->data, sizeof v);
    check(v[0] == -1.25f && v[5] == 1.25f, "golden %s: f32.r2 = %g .. %g", path, v[0], v[5]);
  }
  tgm_st_free(&f);
}

/* Our writer, given the same tensors in the same order, writes the same bytes
 * as the reference implementation. */
static void test_golden_bytes(const char *golden_path, const golden *g, int n) {
  static unsigned char store[NGOLDEN][256];
  tgm_tensor_desc t[NGOLDEN];
  golden_descs(g, n, t, store);
  const char *path = in_dir("ours.safetensors");
  char err[512];
  int rc = tgm_st_write(path, t, n, err, sizeof err);
  check(rc == TGM_OK, "golden bytes: write: %s", err);
  size_t na = 0, nb = 0;
  unsigned char *a = read_bytes(path, &na), *b = read_bytes(golden_path, &nb);
  check(a && b && na == nb && !memcmp(a, b, na), "golden bytes: our file differs from %s (%zu vs %zu bytes)",
        golden_path, na, nb);
  free(a);
  free(b);
  unlink(path);
}

static void test_golden(void) {
  check(access("tests/data/st_py_all.safetensors", R_OK) == 0,
        "golden: tests/data/st_py_all.safetensors not found (run from the repository root)");
  test_golden_read("tests/data/st_py_all.safetensors", golden_all, NGOLDEN);
  test_golden_read("tests/data/st_py_meta.safetensors", golden_all + 1, 2); /* __metadata__ is skipped */
  test_golden_read("tests/data/st_py_none.safetensors", golden_all, 0);
  test_golden_bytes("tests/data/st_py_all.safetensors", golden_all, NGOLDEN);
  test_golden_bytes("tests/data/st_py_none.safetensors", golden_all, 0);
}

/* ---------------------------------------------------------------- corrupt files */

/* Read `bytes` as a file: expect `code` and a message holding `want` and the path. */
static void expect_bytes(const char *what, const void *bytes, size_t n, int code, const char *want) {
  const char *path = in_dir("bad.safetensors");
  if (write_bytes(path, bytes, n)) {
    check(0, "%s: cannot write the test file", what);
    return;
  }
  tgm_st_file f;
  char err[512] = "";
  int rc = tgm_st_read(path, &f, err, sizeof err);
  check(rc == code, "%s: code %d, want %d (%s)", what, rc, code, err);
  check(strstr(err, want) != NULL, "%s: message \"%s\" lacks \"%s\"", what, err, want);
  if (code) {
    check(!strncmp(err, path, strlen(path)), "%s: message \"%s\" does not start with the path", what, err);
    check(is_zeroed(&f), "%s: f not zeroed after a failure", what);
  } else {
    tgm_st_free(&f);
  }
  unlink(path);
}

/* A file made of the header text (its length as N) and `ndata` data bytes. */
static void expect_header(const char *what, const char *header, size_t ndata, int code, const char *want) {
  size_t hn = strlen(header), n = 8 + hn + ndata;
  unsigned char *b = calloc(1, n);
  for (int i = 0; i < 8; i++)
    b[i] = (unsigned char)((uint64_t)hn >> (8 * i));
  memcpy(b + 8, header, hn);
  for (size_t i = 0; i < ndata; i++)
    b[8 + hn + i] = (unsigned char)i;
  expect_bytes(what, b, n, code, want);
  free(b);
}

#define A4 "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}"

static void test_corrupt(void) {
  const int C = TGM_ECORRUPT;
  /* too short, bad header lengths */
  expect_bytes("empty file", "", 0, C, "is 0 bytes, too short");
  expect_bytes("7 bytes", "\x10\0\0\0\0\0\0", 7, C, "is 7 bytes, too short");
  expect_bytes("N too large", "\xe8\x03\0\0\0\0\0\0{}        ", 18, C, "header length 1000 exceeds the 10 bytes");
  expect_bytes("N huge", "\0\0\0\0\0\0\0\x80{}", 10, C, "header length 9223372036854775808 exceeds");
  {
    /* N above the 100 MB limit (a real file this size is not needed: parse in memory) */
    size_t hn = 100000001, n = 8 + hn;
    unsigned char *b = calloc(1, n);
    if (b) {
      for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)hn >> (8 * i));
      tgm_st_file f;
      char err[256] = "";
      int rc = st_parse("big", b, n, &f, err, sizeof err);
      check(rc == C && strstr(err, "big: header length 100000001 is above the limit of 100 MB"), "N > 100 MB: %s",
            err);
      free(b);
    }
  }

  /* truncations of a good file */
  {
    int32_t v[6] = {1, 2, 3, 4, 5, 6};
    tgm_tensor_desc t[2] = {{"a", TGM_I32, 2, {2, 2}, v}, {"b", TGM_I32, 1, {2}, v + 4}};
    const char *path = in_dir("good.safetensors");
    char err[512];
    int rc = tgm_st_write(path, t, 2, err, sizeof err);
    size_t n;
    unsigned char *b = read_bytes(path, &n);
    unlink(path);
    if (!rc && b) {
      expect_bytes("good file", b, n, TGM_OK, "");
      expect_bytes("truncated data", b, n - 4, C,
                   "tensor 'b': data_offsets [16, 24] run past the end of the 20-byte data section (truncated file?)");
      expect_bytes("truncated header", b, 8 + 20, C, "exceeds the 20 bytes that follow it (truncated");
      expect_bytes("only the length", b, 8, C, "exceeds the 0 bytes");
    } else {
      check(0, "truncations: cannot make the good file: %s", err);
    }
    free(b);
  }

  /* JSON syntax, with positions */
  expect_header("zero-length header", "", 0, C, "header byte 0 (file byte 8): expected '{' (the header is a JSON object), found the end of the header");
  expect_header("top-level array", "[]", 0, C, "header byte 0 (file byte 8): expected '{'");
  expect_header("trailing comma", "{\"a\":" A4 ",}", 4, C, "header byte 54 (file byte 62): expected a tensor name (a string), found '}'");
  expect_header("missing colon", "{\"a\" " A4 "}", 4, C, "header byte 5 (file byte 13): expected ':' after a name, found '{'");
  expect_header("unclosed object", "{\"a\":" A4, 4, C, "expected ',' or '}' after a tensor, found the end of the header");
  expect_header("unterminated string", "{\"abc", 0, C, "header byte 1 (file byte 9): unterminated string");
  expect_header("bad escape", "{\"a\\x\":" A4 "}", 4, C, "header byte 3 (file byte 11): invalid escape in a string");
  expect_header("bad \\u", "{\"a\\u12g4\":" A4 "}", 4, C, "header byte 3 (file byte 11): a \\u escape needs four hex digits");
  expect_header("short \\u", "{\"\\u12", 0, C, "a \\u escape needs four hex digits");
  expect_header("lone high surrogate", "{\"\\ud800x\":" A4 "}", 4, C, "header byte 2 (file byte 10): unpaired high surrogate");
  expect_header("high surrogate + BMP", "{\"\\ud800\\u0041\":" A4 "}", 4, C, "unpaired high surrogate");
  expect_header("lone low surrogate", "{\"\\udc00\":" A4 "}", 4, C, "unpaired low surrogate");
  expect_header("raw control character", "{\"a\tb\":" A4 "}", 4, C, "header byte 3 (file byte 11): control character in a string");
  expect_header("invalid UTF-8", "{\"\xff\":" A4 "}", 4, C, "header byte 2 (file byte 10): the header is not valid UTF-8");
  expect_header("overlong UTF-8", "{\"\xc0\xaf\":" A4 "}", 4, C, "header byte 2 (file byte 10): the header is not valid UTF-8");
  expect_header("UTF-8 surrogate", "{\"\xed\xa0\x80\":" A4 "}", 4, C, "the header is not valid UTF-8");
  expect_header("garbage after the object", "{}  x", 0, C, "header byte 4 (file byte 12): unexpected bytes after the header object");
  expect_header("two objects", "{}{}", 0, C, "unexpected bytes after the header object");
  expect_header("leading zero", "{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4, C, "shape of tensor 'a' has a leading zero");
  expect_header("fraction", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, C, "shape of tensor 'a' is not an integer");
  expect_header("exponent", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1e0],\"data_offsets\":[0,4]}}", 4, C, "is not an integer");
  expect_header("negative dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, C, "header byte 29 (file byte 37): the shape of tensor 'a' is negative");
  expect_header("negative offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-0,4]}}", 4, C, "the data_offsets of tensor 'a' is negative");
  expect_header("number too large", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,18446744073709551616]}}", 4, C, "the data_offsets of tensor 'a' is too large");
  expect_header("string as dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4, C, "expected a non-negative integer (the shape of tensor 'a'), found '\"'");
  expect_header("shape not an array", "{\"a\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,4]}}", 4, C, "expected '[' to start the shape of tensor 'a', found '4'");
  expect_header("unclosed shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1 \"data_offsets\":[0,4]}}", 4, C, "expected ',' or ']' in the shape of tensor 'a'");
  expect_header("dtype not a string", "{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, C, "expected a string (the dtype), found '4'");
  expect_header("entry not an object", "{\"a\":4}", 0, C, "expected '{' to start the entry of tensor 'a', found '4'");
  expect_header("name not a string", "{a:" A4 "}", 4, C, "header byte 1 (file byte 9): expected a tensor name (a string), found 'a'");
  expect_header("entry: trailing comma", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],}}", 4, C, "expected a string, found '}'");

  /* the entries */
  expect_header("missing shape", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, C, "tensor 'a' has no 'shape'");
  expect_header("missing dtype", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, C, "tensor 'a' has no 'dtype'");
  expect_header("missing data_offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, C, "tensor 'a' has no 'data_offsets'");
  expect_header("empty entry", "{\"a\":{}}", 0, C, "tensor 'a' has no 'dtype'");
  expect_header("extra key", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"extra\":[1],\"data_offsets\":[0,4]}}", 4, C, "tensor 'a' has an unexpected key 'extra' at header byte 32");
  expect_header("duplicate key", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, C, "tensor 'a' has key 'dtype' twice");
  expect_header("unknown dtype", "{\"a\":{\"dtype\":\"Q9\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, C, "unknown dtype 'Q9' of tensor 'a'");
  expect_header("lower-case dtype", "{\"a\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, C, "unknown dtype 'f32' of tensor 'a'");
  expect_header("F64", "{\"x\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, C, "dtype 'F64' of tensor 'x' is not supported (f32, bf16, f16, i32, bool)");
  expect_header("I64", "{\"x\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]}}", 8, C, "dtype 'I64' of tensor 'x' is not supported");
  expect_header("rank 9", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, C, "tensor 'a' has rank 9, above the maximum 8");
  expect_header("dim above int64", "{\"a\":{\"dtype\":\"BOOL\",\"shape\":[9223372036854775808],\"data_offsets\":[0,4]}}", 4, C, "tensor 'a': dim 0 (9223372036854775808) is too large");
  expect_header("shape product overflow", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4, C, "tensor 'a': the product of the shape overflows");
  expect_header("bytes overflow", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,4]}}", 4, C, "the product of the shape overflows");
  expect_header("zero dim beats overflow", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,0],\"data_offsets\":[0,0]}}", 0, TGM_OK, "");
  expect_header("size mismatch", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20, C, "tensor 'a': data_offsets [0, 20] hold 20 bytes, but F32 [2, 3] needs 24");
  expect_header("size mismatch rank 0", "{\"a\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, C, "hold 4 bytes, but BF16 [] needs 2");
  expect_header("begin after end", "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4, C, "tensor 'a': data_offsets [4, 0] end before they begin");
  expect_header("three offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, C, "tensor 'a': data_offsets has 3 numbers, not 2");
  expect_header("one offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]}}", 4, C, "data_offsets has 1 numbers, not 2");
  expect_header("offset past the data", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 4, C, "data_offsets [4, 8] run past the end of the 4-byte data section");

  /* the tensors together */
  expect_header("overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, C, "tensors 'a' [0, 8] and 'b' [4, 12] overlap");
  expect_header("same span", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, C, "tensors 'a' [0, 4] and 'b' [0, 4] overlap");
  expect_header("empty inside another", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", 8, C, "tensors 'a' [0, 8] and 'e' [4, 4] overlap");
  expect_header("hole", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, C, "4 unused bytes before tensor 'b'");
  expect_header("trailing bytes", "{\"a\":" A4 "}", 9, C, "5 unused bytes after the last tensor");
  expect_header("data without tensors", "{}", 3, C, "3 unused bytes after the last tensor");
  expect_header("duplicate name", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, C, "duplicate tensor name 'a' (header bytes 1 and 54)");
  expect_header("duplicate name, escaped", "{\"ab\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\\u0062\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, C, "duplicate tensor name 'ab'");
  expect_header("NUL in name", "{\"a\\u0000b\":" A4 "}", 4, C, "the tensor name at header byte 1 contains a NUL character");

  /* __metadata__ */
  expect_header("metadata value not a string", "{\"__metadata__\":{\"k\":1}}", 0, C, "expected a string (__metadata__ values are strings), found '1'");
  expect_header("metadata not an object", "{\"__metadata__\":[]}", 0, C, "expected '{' to start __metadata__");
  expect_header("metadata twice", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, C, "'__metadata__' appears twice (header byte 19)");
  expect_header("metadata bad escape", "{\"__metadata__\":{\"k\":\"\\q\"}}", 0, C, "invalid escape in a string");
  expect_header("metadata unclosed", "{\"__metadata__\":{\"k\":\"v\"", 0, C, "expected ',' or '}' in __metadata__");

  /* files that are fine */
  expect_header("whitespace and key order",
                " \t\n{ \"a\" : { \"shape\" : [ 1 ] ,\r\n \"data_offsets\" : [ 0 , 4 ] , \"dtype\" : \"F32\" } }\n ", 4,
                TGM_OK, "");
  expect_header("metadata kept out", "{\"__metadata__\":{\"format\":\"pt\",\"\\u00e9\":\"\\ud83d\\ude00\\n\"},\"a\":" A4 "}", 4, TGM_OK, "");
  expect_header("escaped __metadata__", "{\"\\u005f_metadata__\":{}}", 0, TGM_OK, "");
  expect_header("empty metadata, no tensors", "{\"__metadata__\":{}}", 0, TGM_OK, "");
  expect_header("empty name", "{\"\":" A4 "}", 4, TGM_OK, "");
  expect_header("tensors out of data order",
                "{\"b\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[4,5]},\"a\":" A4
                ",\"e\":{\"dtype\":\"I32\",\"shape\":[0,2],\"data_offsets\":[5,5]}}",
                5, TGM_OK, "");

  /* decoded names and data pointers */
  {
    const char *hdr = "{\"\\u0041\\u00e9\\ud83d\\ude00\\\"\\\\\\/\\b\\f\\n\\r\\t\":" A4 "}";
    size_t hn = strlen(hdr);
    unsigned char b[256];
    memset(b, 0, sizeof b);
    for (int i = 0; i < 8; i++)
      b[i] = (unsigned char)((uint64_t)hn >> (8 * i));
    memcpy(b + 8, hdr, hn);
    memcpy(b + 8 + hn, "\x01\x02\x03\x04", 4);
    const char *path = in_dir("esc.safetensors");
    write_bytes(path, b, 8 + hn + 4);
    tgm_st_file f;
    char err[512];
    int rc = tgm_st_read(path, &f, err, sizeof err);
    const char *want = "A\xc3\xa9\xf0\x9f\x98\x80\"\\/\b\f\n\r\t";
    check(rc == TGM_OK && f.n == 1 && !strcmp(f.t[0].name, want), "escapes decode: %s", rc ? err : f.t[0].name);
    check(rc == TGM_OK && f.n == 1 && f.t[0].data == f.buf + 8 + hn && tgm_st_find(&f, want) == &f.t[0],
          "escapes: data pointer and find");
    tgm_st_free(&f);
    unlink(path);
  }

  /* I/O errors */
  {
    tgm_st_file f;
    char err[512] = "";
    const char *path = in_dir("does-not-exist.safetensors");
    int rc = tgm_st_read(path, &f, err, sizeof err);
    check(rc == TGM_EIO && strstr(err, path) && strstr(err, "No such file or directory") && is_zeroed(&f),
          "missing file: %d %s", rc, err);
    rc = tgm_st_read(dir, &f, err, sizeof err);
    check(rc == TGM_EIO && strstr(err, "not a regular file"), "directory: %d %s", rc, err);
    rc = tgm_st_read(path, &f, NULL, 0); /* no room for a message is fine */
    check(rc == TGM_EIO, "missing file, no message buffer: %d", rc);
    check(tgm_st_read(NULL, &f, err, sizeof err) == TGM_EINVAL && tgm_st_read(path, NULL, err, sizeof err) == TGM_EINVAL,
          "NULL arguments");
    char tiny[8];
    rc = tgm_st_read(path, &f, tiny, sizeof tiny);
    check(rc == TGM_EIO && strlen(tiny) == 7, "a short message buffer gets a truncated message");
  }
}

/* ---------------------------------------------------------------- writing: errors and atomicity */

/* The writer refuses bad descs with TGM_EINVAL and writes nothing. */
static void expect_write_refused(const char *what, const tgm_tensor_desc *t, int n, const char *want) {
  const char *path = in_dir("refused.safetensors");
  char err[512] = "";
  int rc = tgm_st_write(path, t, n, err, sizeof err);
  int tmp, ents = dir_entries(&tmp);
  check(rc == TGM_EINVAL, "%s: code %d, want %d (%s)", what, rc, TGM_EINVAL, err);
  check(strstr(err, want) != NULL, "%s: message \"%s\" lacks \"%s\"", what, err, want);
  check(!exists(path) && ents == 0, "%s: something was created", what);
}

static void test_write_errors(void) {
  float v[4] = {0};
  tgm_tensor_desc ok = {"a", TGM_F32, 1, {4}, v};
  tgm_tensor_desc t[2];
  t[0] = ok, t[0].dtype = 5;
  expect_write_refused("bad dtype", t, 1, "tensor 'a' has an unknown dtype code 5");
  t[0] = ok, t[0].rank = 9;
  expect_write_refused("rank 9", t, 1, "tensor 'a' has rank 9, outside 0..8");
  t[0] = ok, t[0].rank = -1;
  expect_write_refused("rank -1", t, 1, "has rank -1");
  t[0] = ok, t[0].shape[0] = -4;
  expect_write_refused("negative dim", t, 1, "tensor 'a' has a negative dim 0 (-4)");
  t[0] = ok, t[0].rank = 2, t[0].shape[0] = t[0].shape[1] = INT64_MAX / 2;
  expect_write_refused("too large", t, 1, "tensor 'a' is too large");
  t[0] = ok, t[0].name = NULL;
  expect_write_refused("no name", t, 1, "tensor 0 has no name");
  t[0] = ok, t[0].name = "__metadata__";
  expect_write_refused("reserved name", t, 1, "'__metadata__' is reserved");
  t[0] = ok, t[0].name = "bad\xff";
  expect_write_refused("invalid UTF-8 name", t, 1, "is not valid UTF-8");
  t[0] = ok, t[0].data = NULL;
  expect_write_refused("no data", t, 1, "tensor 'a' has no data");
  t[0] = ok, t[1] = ok;
  expect_write_refused("duplicate names", t, 2, "two tensors are named 'a' (0 and 1)");
  expect_write_refused("negative count", t, -1, "bad tensor list");
  expect_write_refused("NULL list", NULL, 2, "bad tensor list");
  char err[64];
  check(tgm_st_write(NULL, t, 1, err, sizeof err) == TGM_EINVAL, "NULL path");
}

static void test_atomic(void) {
  char err[512];
  int tmp;
  float a[4] = {1, 2, 3, 4};
  tgm_tensor_desc t = {"a", TGM_F32, 1, {4}, a};

  /* a directory that does not exist: TGM_EIO, nothing created */
  const char *nodir = in_dir("nope"), *path = in_dir("nope/x.safetensors");
  int rc = tgm_st_write(path, &t, 1, err, sizeof err);
  check(rc == TGM_EIO && strstr(err, path) && strstr(err, "No such file or directory"),
        "missing directory: %d %s", rc, err);
  check(!exists(nodir) && dir_entries(&tmp) == 0, "missing directory: something was created");

  /* the file to keep */
  path = in_dir("keep.safetensors");
  rc = tgm_st_write(path, &t, 1, err, sizeof err);
  check(rc == TGM_OK, "atomic: first write: %s", err);
  size_t n0;
  unsigned char *before = read_bytes(path, &n0);

  float big[16384];
  memset(big, 0, sizeof big);
  tgm_tensor_desc tb = {"a", TGM_F32, 1, {16384}, big};

  /* the temp file cannot be created (its name is taken by a directory) */
  char tmpname[600];
  snprintf(tmpname, sizeof tmpname, "%s.tmp.%ld", path, (long)getpid());
  mkdir(tmpname, 0700);
  rc = tgm_st_write(path, &tb, 1, err, sizeof err);
  check(rc == TGM_EIO && strstr(err, "cannot create"), "temp name taken: %d %s", rc, err);
  rmdir(tmpname);
  size_t n1;
  unsigned char *after = read_bytes(path, &n1);
  check(after && n1 == n0 && !memcmp(before, after, n0), "temp name taken: the old file changed");
  free(after);
  check(dir_entries(&tmp) == 1 && tmp == 0, "temp name taken: the directory holds only the old file");

  /* the disk fills up mid-write (a file size limit: EFBIG) */
  struct rlimit old;
  if (!getrlimit(RLIMIT_FSIZE, &old)) {
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = old;
    lim.rlim_cur = 4096;
    if (!setrlimit(RLIMIT_FSIZE, &lim)) {
      rc = tgm_st_write(path, &tb, 1, err, sizeof err);
      setrlimit(RLIMIT_FSIZE, &old);
      check(rc == TGM_EIO && strstr(err, "cannot write") && strstr(err, path), "write fails midway: %d %s", rc, err);
      after = read_bytes(path, &n1);
      check(after && n1 == n0 && !memcmp(before, after, n0), "write fails midway: the old file changed");
      free(after);
      check(dir_entries(&tmp) == 1 && tmp == 0, "write fails midway: the temp file was left behind");
    } else {
      printf("note: setrlimit(RLIMIT_FSIZE) refused; the mid-write failure case is skipped\n");
    }
    signal(SIGXFSZ, prev);
  }

  /* the rename fails (the path is a non-empty directory): the temp file goes */
  const char *sub = in_dir("sub"), *inner = in_dir("sub/f");
  mkdir(sub, 0700);
  write_bytes(inner, "x", 1);
  rc = tgm_st_write(sub, &t, 1, err, sizeof err);
  check(rc == TGM_EIO && strstr(err, "cannot rename"), "rename fails: %d %s", rc, err);
  check(dir_entries(&tmp) == 2 && tmp == 0, "rename fails: the temp file was left behind");
  unlink(inner);
  rmdir(sub);

  /* and the good file still reads */
  tgm_st_file f;
  rc = tgm_st_read(path, &f, err, sizeof err);
  check(rc == TGM_OK && f.n == 1 && !memcmp(f.t[0].data, a, sizeof a), "atomic: the old file reads: %s", err);
  tgm_st_free(&f);
  free(before);
  unlink(path);
}

/* The tables the rest of the runtime relies on. */
static void test_tables(void) {
  static const char *names[5] = {"f32", "bf16", "f16", "i32", "bool"}, *st[5] = {"F32", "BF16", "F16", "I32", "BOOL"};
  static const int sizes[5] = {4, 2, 2, 4, 1};
  int d = TGM_F32 == 0 && TGM_BF16 == 1 && TGM_F16 == 2 && TGM_I32 == 3 && TGM_BOOL == 4;
  for (int k = 0; k < 5; k++)
    d &= !strcmp(tgm_dtype_names[k], names[k]) && !strcmp(tgm_dtype_st_names[k], st[k]) &&
         tgm_dtype_sizes[k] == sizes[k];
  check(d, "dtype tables");
}

/* tgm_st_write_checked: a checksum in __metadata__ that the reader verifies:
 * a flipped bit anywhere in the data is refused, files without a checksum
 * load; the writer removes the PATH.tmp.PID of killed writers only. */
static void test_checksum(void) {
  char err[512];
  float a[5] = {1, 2, 3, 4, 5};
  int32_t b[3] = {7, 8, 9};
  tgm_tensor_desc t[2] = {{"a", TGM_F32, 1, {5}, a}, {"b", TGM_I32, 1, {3}, b}};
  const char *path = in_dir("sum.safetensors");
  check(tgm_st_write_checked(path, t, 2, err, sizeof err) == TGM_OK, "checksum: write: %s", err);
  tgm_st_file f;
  int rc = tgm_st_read(path, &f, err, sizeof err);
  check(rc == TGM_OK && f.n == 2 && !memcmp(tgm_st_find(&f, "b")->data, b, sizeof b), "checksum: read back: %s",
        err);
  if (!rc)
    tgm_st_free(&f);
  size_t size;
  unsigned char *raw = read_bytes(path, &size);
  check(raw && size > 32 && strstr((char *)raw + 8, "\"__metadata__\":{\"tgm.checksum\":\"w64:"),
        "checksum: stored in __metadata__");
  for (size_t bit = 0; raw && bit < 8 * 32; bit += 37) { /* each flip in the 32 data bytes is caught */
    raw[size - 32 + bit / 8] ^= (unsigned char)(1u << (bit % 8));
    write_bytes(path, raw, size);
    rc = tgm_st_read(path, &f, err, sizeof err);
    check(rc == TGM_ECORRUPT && strstr(err, "checksum mismatch"), "checksum: bit %zu flipped: rc %d, %s", bit, rc,
          err);
    if (!rc)
      tgm_st_free(&f);
    raw[size - 32 + bit / 8] ^= (unsigned char)(1u << (bit % 8));
  }
  free(raw);
  /* without the checksum (every other writer, older files): loads */
  check(tgm_st_write(path, t, 2, err, sizeof err) == TGM_OK && tgm_st_read(path, &f, err, sizeof err) == TGM_OK,
        "checksum: a file without one loads: %s", err);
  tgm_st_free(&f);
  /* stale temporaries: a dead writer's goes, a live process's stays */
  pid_t dead = fork();
  if (dead == 0)
    _exit(0);
  waitpid(dead, NULL, 0);
  char stale[600], live[600];
  snprintf(stale, sizeof stale, "%s.tmp.%ld", path, (long)dead);
  snprintf(live, sizeof live, "%s.tmp.%ld", path, (long)getppid());
  write_bytes(stale, "x", 1);
  write_bytes(live, "x", 1);
  check(tgm_st_write_checked(path, t, 2, err, sizeof err) == TGM_OK, "checksum: write over: %s", err);
  check(access(stale, F_OK) != 0, "a dead writer's %s is removed", stale);
  check(access(live, F_OK) == 0, "a live process's %s is kept", live);
  remove(live);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/tgm_st_test_XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  test_tables();
  test_round_trip();
  test_many();
  test_golden();
  test_corrupt();
  test_write_errors();
  test_atomic();
  test_checksum();
  clear_dir(dir);
  rmdir(dir);
  printf("%d passed, %d failed\n", npass, nfail);
  return nfail != 0;
}
