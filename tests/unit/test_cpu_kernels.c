/* test_cpu_kernels.c: every tgm_cpu_* call of templates/runtime/tgm_cpu.c
 * (cast, embedding and its backward, dropout, matmul, linear, attention and
 * its backward, gemm) against a naive double-precision reference written
 * here (obvious loops; the semantics are gen/interp.c's, i.e. PyTorch's), for
 * f32, bf16 and f16 (and i32 and bool where the call takes them), on random
 * data with odd sizes, broadcasting batch shapes and sizes large enough to
 * take the parallel paths. (The pointwise, reduction, view and loss kernels
 * are generated per model and tested through test_backend and the e2e
 * tests.)
 *
 * The template sources are included directly, so the static helpers (the
 * micro-kernels, the no-scratch fallbacks, the inline conversions) are tested
 * too. Every GEMM-based test runs once per micro-kernel this CPU can execute
 * and, when built with TGM_HAVE_CBLAS (test_cpu_kernels_cblas.c), once through
 * the CBLAS as well. With OpenMP the whole suite runs at 1, the default and 3
 * threads.
 *
 * Tolerances: |got - ref| <= rtol |ref| + atol with rtol f32 1e-5 (GEMM-based
 * 1e-4), bf16 2e-2, f16 2e-3, and atol = rtol min(1, mean |ref|) plus half an
 * f16 subnormal quantum for f16; integer, bool and data-movement results must
 * be exact, as must the dtype conversions (bit for bit against tgm_init.c).
 * embedding_backward and dropout are checked bit for bit against f32
 * reference loops written here (the in-order sums; the Philox mask and the
 * f32 product), for the same bits at 1 and 2 threads, and dropout's mask
 * against gen/interp.c itself (tgen_load + interp_run in training mode).
 * Attention's lse (f32 from the stored inputs) is held to the f32 tolerance;
 * its backward's gradients to the GEMM ones, with atol from the mean size of
 * a gradient's terms rather than of its values (they cancel: dS sums to 0
 * over a row), against the kernel's contract (delta from y rounded to dt)
 * and in f32 also against the exact gradient; outputs not wanted (NULL)
 * leave the others' bits alone, and the forward and backward give the same
 * bits at 1, 2 and 3 threads. Attention on strided views (q, k, v read from
 * GPT-2's packed qkv layout, results written into packed and padded
 * buffers, k and v broadcast by a 0 stride or a missing dim) must give the
 * bits of the same call on contiguous copies and write nothing outside the
 * views. Prints a line per failure and "N passed, M failed"; exits nonzero
 * on any failure. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "../../templates/runtime/tgm_cpu.c"
#include "../../templates/runtime/tgm_init.c"

#include "ir.h" /* tgen_load, interp_run: dropout's mask against the interpreter */

#include <stdarg.h>
#include <stdio.h>

static int npass, nfail;
static char ctx[128]; /* what the current pass runs under (threads, GEMM) */

/* ---------------------------------------------------------------- random data */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnext(void) { /* splitmix64 */
  uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double runif(double lo, double hi) { return lo + (hi - lo) * ((double)(rnext() >> 11) / 9007199254740992.0); }

static const char *const dtn[5] = {"f32", "bf16", "f16", "i32", "bool"};
static double tol_of(int dt) { return dt == TGM_BF16 ? 2e-2 : dt == TGM_F16 ? 2e-3 : dt == TGM_F32 ? 1e-5 : 0; }
static double gtol_of(int dt) { return dt == TGM_F32 ? 1e-4 : tol_of(dt); }

/* ---------------------------------------------------------------- tensors */

/* A tensor in its storage dtype plus the stored values as doubles (what the
 * reference computes with). */
typedef struct T {
  int dt, r;
  int64_t s[TGM_MAXRANK], n;
  void *p;
  double *v;
} T;

/* The value x once stored in dt, read back through tgm_init.c's conversions. */
static double rounded(int dt, double x) {
  switch (dt) {
  case TGM_BF16: return tgm_bf16_to_f32(tgm_f32_to_bf16((float)x));
  case TGM_F16: return tgm_f16_to_f32(tgm_f32_to_f16((float)x));
  case TGM_I32: return isnan(x) || x <= -2147483649.0 || x >= 2147483648.0 ? -2147483648.0 : trunc(x);
  case TGM_BOOL: return x != 0;
  default: return (float)x;
  }
}

static double getv(int dt, const void *p, int64_t i) {
  switch (dt) {
  case TGM_BF16: return tgm_bf16_to_f32(((const uint16_t *)p)[i]);
  case TGM_F16: return tgm_f16_to_f32(((const uint16_t *)p)[i]);
  case TGM_I32: return ((const int32_t *)p)[i];
  case TGM_BOOL: return ((const uint8_t *)p)[i];
  default: return ((const float *)p)[i];
  }
}

static void setv(T *t, int64_t i, double x) {
  switch (t->dt) {
  case TGM_BF16: ((uint16_t *)t->p)[i] = tgm_f32_to_bf16((float)x); break;
  case TGM_F16: ((uint16_t *)t->p)[i] = tgm_f32_to_f16((float)x); break;
  case TGM_I32: ((int32_t *)t->p)[i] = (int32_t)rounded(TGM_I32, x); break;
  case TGM_BOOL: ((uint8_t *)t->p)[i] = x != 0; break;
  default: ((float *)t->p)[i] = (float)x; break;
  }
  t->v[i] = getv(t->dt, t->p, i);
}

static T mk(int dt, int r, const int64_t *s) {
  T t = {dt, r, {0}, 1, NULL, NULL};
  for (int k = 0; k < r; k++) {
    t.s[k] = s[k];
    t.n *= s[k];
  }
  size_t n = (size_t)(t.n > 0 ? t.n : 1);
  t.p = calloc(n, 4);
  t.v = calloc(n, sizeof(double));
  if (!t.p || !t.v) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  return t;
}

/* Uniform in [lo, hi) (integers in [lo, hi] for i32, 0/1 for bool). */
static T rnd(int dt, int r, const int64_t *s, double lo, double hi) {
  T t = mk(dt, r, s);
  for (int64_t i = 0; i < t.n; i++) {
    double x = dt == TGM_I32 ? floor(runif(lo, hi + 1)) : dt == TGM_BOOL ? (double)(rnext() & 1) : runif(lo, hi);
    setv(&t, i, x);
  }
  return t;
}

static void tfree(T *t) {
  free(t->p);
  free(t->v);
  t->p = t->v = NULL;
}

static int64_t numel_of(int r, const int64_t *s) {
  int64_t n = 1;
  for (int k = 0; k < r; k++)
    n *= s[k];
  return n;
}

/* A strided view (attention's operands): rank r, shape s, element strides st
 * (NULL: row-major), starting off elements of dtype dt past p (p NULL: an
 * absent view of that shape). */
static tgm_view view_of(int dt, void *p, int64_t off, int r, const int64_t *s, const int64_t *st) {
  tgm_view v = {p ? (char *)p + off * (int64_t)esize(dt) : NULL, r, {0}, {0}};
  int64_t c = 1;
  for (int k = r - 1; k >= 0; k--) {
    v.shape[k] = s[k];
    v.st[k] = st ? st[k] : c;
    c *= s[k];
  }
  return v;
}

/* The row-major view of a tensor. */
static tgm_view tview(const T *t) { return view_of(t->dt, t->p, 0, t->r, t->s, NULL); }

/* ---------------------------------------------------------------- checks */

static void check(int ok, const char *what) {
  if (ok) {
    npass++;
  } else {
    nfail++;
    printf("FAIL [%s]: %s\n", ctx, what);
  }
}

/* The n results in p (dtype dt) against ref; rtol 0 means exact (NaN equal to
 * NaN). Prints the first few mismatches. */
static void expect_atol(const char *what, int dt, const void *p, const double *ref, int64_t n, double rtol,
                        double atol) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    double g = getv(dt, p, i), w = ref[i];
    int ok;
    if (isnan(w))
      ok = isnan(g);
    else if (isinf(w) || rtol == 0)
      ok = g == w;
    else
      ok = fabs(g - w) <= rtol * fabs(w) + atol;
    if (!ok && bad++ < 4)
      printf("  %s: element %lld: got %.9g, want %.9g\n", what, (long long)i, g, w);
  }
  if (bad)
    printf("  %s: %lld of %lld elements wrong (%s)\n", what, (long long)bad, (long long)n, dtn[dt]);
  check(bad == 0, what);
}

/* ... with atol = rtol min(1, mean |ref|), plus half an f16 subnormal quantum
 * for f16 (tiny results there have no relative precision). */
static void expect(const char *what, int dt, const void *p, const double *ref, int64_t n, double rtol) {
  double mean = 0;
  int64_t nfin = 0;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(ref[i])) {
      mean += fabs(ref[i]);
      nfin++;
    }
  mean = nfin ? mean / (double)nfin : 0;
  expect_atol(what, dt, p, ref, n, rtol, rtol * (mean < 1 ? mean : 1) + (dt == TGM_F16 && rtol ? 0x1p-25 : 0));
}

static const char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static const char *fmt(const char *f, ...) {
  static char buf[8][256];
  static int k;
  char *b = buf[k++ & 7];
  va_list ap;
  va_start(ap, f);
  vsnprintf(b, 256, f, ap);
  va_end(ap);
  return b;
}

static const char *shstr(int r, const int64_t *s) {
  static char buf[8][96];
  static int k;
  char *b = buf[k++ & 7];
  int o = snprintf(b, 96, "[");
  for (int i = 0; i < r; i++)
    o += snprintf(b + o, (size_t)(96 - o), "%s%lld", i ? "," : "", (long long)s[i]);
  snprintf(b + o, (size_t)(96 - o), "]");
  return b;
}

/* ---------------------------------------------------------------- reference helpers */

/* Flat index in a tensor of rank r, shape s, of the result coordinates
 * idx[ry] under NumPy broadcasting. */
static int64_t bidx(int r, const int64_t *s, int ry, const int64_t *idx) {
  int64_t o = 0;
  for (int k = 0; k < r; k++) {
    int64_t c = s[k] == 1 ? 0 : idx[ry - r + k];
    o = o * s[k] + c;
  }
  return o;
}

static void unravel(int64_t i, int r, const int64_t *s, int64_t *idx) {
  for (int k = r - 1; k >= 0; k--) {
    idx[k] = i % s[k];
    i /= s[k];
  }
}

static int bcast_shape(int ra, const int64_t *sa, int rb, const int64_t *sb, int64_t *sy) {
  int r = ra > rb ? ra : rb;
  for (int k = 0; k < r; k++) {
    int ka = k - (r - ra), kb = k - (r - rb);
    int64_t da = ka >= 0 ? sa[ka] : 1, db = kb >= 0 ? sb[kb] : 1;
    sy[k] = da == 1 ? db : da;
  }
  return r;
}

/* ---------------------------------------------------------------- cast */

/* Every pair of dtypes, on values that hit the rounding and saturation rules. */
static void test_cast(void) {
  static const double vals[] = {0, -0.0, 1, -1, 1.5, -2.5, 2.5, 3.7, -3.7, 65504, 65519, 65520, 1e5, -1e5,
                                6e-8, 3e-8, 1e-40, 2147483520.0, 3e9, -3e9, 1.00390625, 1.005859375, 255.5, NAN,
                                INFINITY, -INFINITY, 0.1, 1e-5, 123456.789};
  int64_t nv = sizeof vals / sizeof *vals;
  for (int din = 0; din < 5; din++)
    for (int dout = 0; dout < 5; dout++)
      for (int big = 0; big < 2; big++) {
        int64_t n = big ? 70001 : nv;
        T x = mk(din, 1, &n), y = mk(dout, 1, &n);
        double *ref = malloc(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++) {
          double v = i < nv ? vals[i] : runif(-70000, 70000);
          if (din == TGM_BOOL)
            v = v != 0 && !isnan(v) ? (double)(rnext() & 1) : 0;
          setv(&x, i, v);
          ref[i] = rounded(dout, x.v[i]);
        }
        tgm_cpu_cast(din, dout, x.p, y.p, n);
        expect(fmt("cast %s -> %s n=%lld", dtn[din], dtn[dout], (long long)n), dout, y.p, ref, n, 0);
        free(ref);
        tfree(&x);
        tfree(&y);
      }
  /* the inline conversions against tgm_init.c's, bit for bit: every half, and
   * a sweep of f32 bit patterns (every 65521st, plus the neighbourhood of each
   * rounding boundary of the halves) */
  int64_t n = 65536;
  uint16_t *h = malloc(2 * (size_t)n), *hb = malloc(2 * (size_t)n);
  float *f = malloc(4 * (size_t)n);
  for (int64_t i = 0; i < n; i++)
    h[i] = (uint16_t)i;
  int bad = 0;
  for (int dt = TGM_BF16; dt <= TGM_F16; dt++) {
    tgm_cpu_cast(dt, TGM_F32, h, f, n);
    for (int64_t i = 0; i < n; i++) {
      float w = dt == TGM_BF16 ? tgm_bf16_to_f32(h[i]) : tgm_f16_to_f32(h[i]);
      bad += tgm_f_bits(f[i]) != tgm_f_bits(w);
    }
  }
  check(!bad, "bf16/f16 -> f32: every half, bit-identical to tgm_init.c");
  bad = 0;
  uint32_t u = 0;
  int64_t tested = 0;
  for (int pass = 0; pass < 2; pass++)
    for (;;) {
      int64_t m = 0;
      for (; m < n; m++) {
        if (pass == 0) { /* stride through all patterns */
          if (u > 0xffffffffu - 65521u)
            break;
          f[m] = tgm_bits_f(u += 65521u);
        } else { /* around every half / bf16 boundary: h<<13 and h<<16 +- a few ulps */
          if (u >= 65536u * 8u)
            break;
          uint32_t hh = u / 8, dd = u % 8;
          uint32_t base = dd < 4 ? ((hh << 13) + 0x38000000u) : (hh << 16);
          f[m] = tgm_bits_f(base + (dd % 4 == 0 ? 0 : dd % 4 == 1 ? 1 : dd % 4 == 2 ? 0x0fffu : 0x1000u) -
                        (dd % 4 == 3 ? 1u : 0u) + ((dd >= 4 && dd % 2) ? 0x7fffu : 0u));
          u++;
        }
      }
      if (m == 0)
        break;
      for (int dt = TGM_BF16; dt <= TGM_F16; dt++) {
        tgm_cpu_cast(TGM_F32, dt, f, hb, m);
        for (int64_t i = 0; i < m; i++) {
          uint16_t w = dt == TGM_BF16 ? tgm_f32_to_bf16(f[i]) : tgm_f32_to_f16(f[i]);
          if (hb[i] != w && bad++ < 4)
            printf("  f32 %08x -> %s: got %04x want %04x\n", tgm_f_bits(f[i]), dtn[dt], hb[i], w);
        }
      }
      tested += m;
      if (m < n)
        break;
    }
  check(!bad, fmt("f32 -> bf16/f16 on %lld patterns, bit-identical to tgm_init.c", (long long)tested));
  free(h);
  free(hb);
  free(f);
}

/* ---------------------------------------------------------------- embedding */

static void test_embedding(void) {
  static const int64_t cs[][3] = {{1, 1, 1}, {17, 5, 33}, {130, 1000, 17}, {3000, 50, 64}};
  for (int dt = 0; dt < 5; dt++)
    for (size_t k = 0; k < sizeof cs / sizeof *cs; k++) {
      int64_t n = cs[k][0], V = cs[k][1], D = cs[k][2], nt = V * D, ny = n * D;
      T tab = rnd(dt, 1, &nt, -100, 100), idx = rnd(TGM_I32, 1, &n, 0, (double)V - 1), y = mk(dt, 1, &ny);
      double *ref = malloc(sizeof(double) * (size_t)ny);
      for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < D; j++)
          ref[i * D + j] = tab.v[(int64_t)idx.v[i] * D + j];
      int64_t bad = tgm_cpu_embedding(dt, idx.p, n, tab.p, V, D, y.p);
      check(bad == -1, fmt("embedding %s: no bad index", dtn[dt]));
      expect(fmt("embedding %s n=%lld V=%lld D=%lld", dtn[dt], (long long)n, (long long)V, (long long)D), dt, y.p,
             ref, ny, 0);
      if (n > 5) {
        setv(&idx, n - 1, -1);
        setv(&idx, 4, (double)V);
        bad = tgm_cpu_embedding(dt, idx.p, n, tab.p, V, D, y.p);
        check(bad == 4, fmt("embedding %s: first bad index is 4 (got %lld)", dtn[dt], (long long)bad));
        setv(&idx, 4, 0);
        bad = tgm_cpu_embedding(dt, idx.p, n, tab.p, V, D, y.p);
        check(bad == n - 1, fmt("embedding %s: a negative index is bad", dtn[dt]));
      }
      free(ref);
      tfree(&tab);
      tfree(&idx);
      tfree(&y);
    }
}

/* The same call at 1 and 2 threads must give the same bits (the kernels'
 * orders do not depend on the thread count); restores the thread count. */
#ifdef _OPENMP
#define SAME_AT_1_AND_2_THREADS(what, bytes, out, call)                                                                \
  do {                                                                                                                 \
    int nt_ = omp_get_max_threads();                                                                                   \
    void *one_ = malloc((size_t)(bytes) + 1);                                                                          \
    omp_set_num_threads(1);                                                                                            \
    call;                                                                                                              \
    memcpy(one_, out, (size_t)(bytes));                                                                                \
    memset(out, 0x5a, (size_t)(bytes));                                                                                \
    omp_set_num_threads(2);                                                                                            \
    call;                                                                                                              \
    omp_set_num_threads(nt_);                                                                                          \
    check(!memcmp(one_, out, (size_t)(bytes)), fmt("%s: the same bits at 1 and 2 threads", what));                     \
    free(one_);                                                                                                        \
  } while (0)
#else
#define SAME_AT_1_AND_2_THREADS(what, bytes, out, call) ((void)0)
#endif

/* embedding_backward against out = 0; out[idx[p]] += dy[p] for p in order,
 * in f32 (the stored result must be those bits exactly) and in double
 * (within the dtype's tolerance). Indices are drawn from the even rows only
 * (the odd rows are unused and must come out zero, whatever out held), with
 * many repeats; D up to past the kernel's column block. */
static void test_embedding_backward(void) {
  static const int64_t cs[][3] = {{1, 1, 1}, {17, 5, 33}, {130, 1000, 17}, {3000, 50, 300}, {5000, 301, 64}, {0, 9, 7}};
  for (int dt = 0; dt < 3; dt++)
    for (size_t k = 0; k < sizeof cs / sizeof *cs; k++) {
      int64_t n = cs[k][0], V = cs[k][1], D = cs[k][2], ny = n * D, no = V * D, nidx = n > 0 ? n : 1;
      size_t es = (size_t)tgm_dtype_sizes[dt];
      T dy = rnd(dt, 1, &ny, -1, 1), idx = mk(TGM_I32, 1, &nidx), out = mk(dt, 1, &no);
      for (int64_t p = 0; p < n; p++)
        setv(&idx, p, (double)(int64_t)(rnext() % (uint64_t)((V + 1) / 2)) * 2);
      float *acc = calloc((size_t)no + 1, sizeof(float));
      double *ref = calloc((size_t)no + 1, sizeof(double)), *exact = calloc((size_t)no + 1, sizeof(double));
      for (int64_t p = 0; p < n; p++)
        for (int64_t j = 0; j < D; j++) {
          acc[(int64_t)idx.v[p] * D + j] += (float)dy.v[p * D + j];
          exact[(int64_t)idx.v[p] * D + j] += dy.v[p * D + j];
        }
      for (int64_t i = 0; i < no; i++)
        ref[i] = rounded(dt, acc[i]);
      const char *what = fmt("embedding_backward %s n=%lld V=%lld D=%lld", dtn[dt], (long long)n, (long long)V,
                             (long long)D);
      memset(out.p, 0xa5, es * (size_t)no); /* rows no index hits must be written (zeros) */
      int64_t bad = tgm_cpu_embedding_backward(dt, idx.p, n, dy.p, V, D, out.p);
      check(bad == -1, fmt("%s: no bad index (got %lld)", what, (long long)bad));
      expect(fmt("%s: the f32 sums in position order, bit for bit", what), dt, out.p, ref, no, 0);
      expect(fmt("%s: within tolerance of the exact sums", what), dt, out.p, exact, no, tol_of(dt));
      SAME_AT_1_AND_2_THREADS(what, es * (size_t)no, out.p,
                              tgm_cpu_embedding_backward(dt, idx.p, n, dy.p, V, D, out.p));
      /* the fallback without the sort's memory (each row scans idx): the same bits */
      if (n > 0) {
        void *fb = malloc(es * (size_t)no);
        for (int64_t v = 0; v < V; v++)
          emb_bwd_row(dt, dy.p, D, NULL, n, idx.p, v, (char *)fb + (size_t)(v * D) * es);
        check(!memcmp(fb, out.p, es * (size_t)no), fmt("%s: the no-scratch rows give the same bits", what));
        free(fb);
      }
      if (n > 5) { /* the first bad position, and out untouched */
        memset(out.p, 0x3c, es * (size_t)no);
        setv(&idx, n - 1, -1);
        setv(&idx, 4, (double)V);
        bad = tgm_cpu_embedding_backward(dt, idx.p, n, dy.p, V, D, out.p);
        check(bad == 4, fmt("%s: first bad index is 4 (got %lld)", what, (long long)bad));
        setv(&idx, 4, 0);
        bad = tgm_cpu_embedding_backward(dt, idx.p, n, dy.p, V, D, out.p);
        check(bad == n - 1, fmt("%s: a negative index is bad (got %lld)", what, (long long)bad));
        int untouched = 1;
        for (size_t b = 0; b < es * (size_t)no; b++)
          untouched &= ((unsigned char *)out.p)[b] == 0x3c;
        check(untouched, fmt("%s: out is not written on a bad index", what));
      }
      free(acc);
      free(ref);
      free(exact);
      tfree(&dy);
      tfree(&idx);
      tfree(&out);
    }
}

/* dropout's keep decision, as gen/interp.c writes it: u in double, u >= p. */
static int ref_kept(int64_t j, double p, uint64_t seed, uint32_t ordinal, uint64_t step) {
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32) ^ ordinal};
  uint32_t ctr[4] = {(uint32_t)(uint64_t)j, (uint32_t)((uint64_t)j >> 32), (uint32_t)step, (uint32_t)(step >> 32)};
  uint32_t r[4];
  tgm_philox4x32(ctr, key, r);
  double u = ((double)(r[0] >> 8) + 0.5) * (1.0 / 16777216.0);
  return p < 1 && u >= p;
}

/* dropout: the mask equal to the reference Philox's, element for element;
 * kept values x * (float)(1 / (1 - p)) in f32 rounded to the dtype (exact)
 * and within tolerance of the double product; dropped ones +0; the kept
 * fraction near 1 - p; in place; the same bits at 1 and 2 threads. x has no
 * zeros, so a zero result means dropped. */
static void test_dropout(void) {
  static const int64_t ns[] = {1, 1000, 70001};
  static const double ps[] = {0, 0.5, 0.1, 0.9, 1, 1.0 / 3};
  static const uint64_t seeds[][3] = {{0, 0, 0}, {((uint64_t)1 << 32) + 1234, 3, ((uint64_t)1 << 32) + 7},
                                      {0xdeadbeefcafef00dull, 0xffffffffu, 123456789}};
  for (int dt = 0; dt < 3; dt++)
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
      for (size_t b = 0; b < sizeof ps / sizeof *ps; b++) {
        int64_t n = ns[a];
        double p = ps[b];
        const uint64_t *sd = seeds[(a + b) % 3];
        uint64_t seed = sd[0], step = sd[2];
        uint32_t ordinal = (uint32_t)sd[1];
        size_t es = (size_t)tgm_dtype_sizes[dt];
        T x = mk(dt, 1, &n), y = mk(dt, 1, &n);
        for (int64_t j = 0; j < n; j++)
          setv(&x, j, (rnext() & 1 ? -1 : 1) * runif(0.25, 4));
        double *ref = malloc(sizeof(double) * (size_t)n), *ref32 = malloc(sizeof(double) * (size_t)n);
        float s = (float)(1.0 / (1.0 - p));
        int64_t kept = 0, mism = 0;
        for (int64_t j = 0; j < n; j++) {
          int k = ref_kept(j, p, seed, ordinal, step);
          kept += k;
          ref[j] = k ? rounded(dt, x.v[j] * (1.0 / (1.0 - p))) : 0.0;
          ref32[j] = k ? rounded(dt, (float)x.v[j] * s) : 0.0;
        }
        const char *what = fmt("dropout %s n=%lld p=%g seed=%llx ordinal=%u step=%llu", dtn[dt], (long long)n, p,
                               (unsigned long long)seed, ordinal, (unsigned long long)step);
        tgm_cpu_dropout(dt, x.p, y.p, n, p, seed, ordinal, step);
        for (int64_t j = 0; j < n; j++)
          mism += (getv(dt, y.p, j) != 0) != (ref[j] != 0);
        check(mism == 0, fmt("%s: mask equal to the reference Philox (%lld mismatches)", what, (long long)mism));
        expect(fmt("%s: values, f32 product", what), dt, y.p, ref32, n, 0);
        expect(fmt("%s: values within tolerance of the double product", what), dt, y.p, ref, n, tol_of(dt));
        if (n > 10000)
          check(fabs((double)kept / (double)n - (1 - p)) < 0.01,
                fmt("%s: kept fraction %g near 1 - p", what, (double)kept / (double)n));
        int signs = 1; /* dropped elements are +0 */
        for (int64_t j = 0; j < n; j++)
          if (ref[j] == 0)
            signs &= (es == 4 ? ((uint32_t *)y.p)[j] : ((uint16_t *)y.p)[j]) == 0;
        check(signs, fmt("%s: dropped elements are +0", what));
        SAME_AT_1_AND_2_THREADS(what, es * (size_t)n, y.p, tgm_cpu_dropout(dt, x.p, y.p, n, p, seed, ordinal, step));
        void *keep = malloc(es * (size_t)n);
        memcpy(keep, y.p, es * (size_t)n);
        tgm_cpu_dropout(dt, x.p, x.p, n, p, seed, ordinal, step); /* in place */
        check(!memcmp(keep, x.p, es * (size_t)n), fmt("%s: in place, the same bits", what));
        free(keep);
        free(ref);
        free(ref32);
        tfree(&x);
        tfree(&y);
      }
  /* the boundary of u >= p: p = u_j exactly keeps element j, the next double
   * above drops it (the kernel decides in integers) */
  {
    int64_t m = 64, bad_keep = 0, bad_drop = 0;
    T x = mk(TGM_F32, 1, &m), y = mk(TGM_F32, 1, &m);
    for (int64_t j = 0; j < m; j++)
      setv(&x, j, 1);
    for (int64_t j = 0; j < m; j++) {
      uint32_t key[2] = {99, 5 ^ 2u}, ctr[4] = {(uint32_t)j, 0, 3, 0}, r[4];
      tgm_philox4x32(ctr, key, r);
      double u = ((double)(r[0] >> 8) + 0.5) * (1.0 / 16777216.0);
      tgm_cpu_dropout(TGM_F32, x.p, y.p, m, u, ((uint64_t)5 << 32) + 99, 2, 3);
      bad_keep += ((float *)y.p)[j] == 0;
      tgm_cpu_dropout(TGM_F32, x.p, y.p, m, nextafter(u, 2), ((uint64_t)5 << 32) + 99, 2, 3);
      bad_drop += ((float *)y.p)[j] != 0;
    }
    check(bad_keep == 0 && bad_drop == 0, fmt("dropout: p = u keeps (%lld wrong), p just above u drops (%lld wrong)",
                                              (long long)bad_keep, (long long)bad_drop));
    tfree(&x);
    tfree(&y);
  }
  /* a different step, ordinal or seed gives a different mask */
  int64_t n = 4096;
  T x = mk(TGM_F32, 1, &n), y0 = mk(TGM_F32, 1, &n), y1 = mk(TGM_F32, 1, &n);
  for (int64_t j = 0; j < n; j++)
    setv(&x, j, 1);
  tgm_cpu_dropout(TGM_F32, x.p, y0.p, n, 0.5, 42, 0, 1);
  tgm_cpu_dropout(TGM_F32, x.p, y1.p, n, 0.5, 42, 0, 2);
  check(memcmp(y0.p, y1.p, 4 * (size_t)n) != 0, "dropout: another step, another mask");
  tgm_cpu_dropout(TGM_F32, x.p, y1.p, n, 0.5, 42, 1, 1);
  check(memcmp(y0.p, y1.p, 4 * (size_t)n) != 0, "dropout: another ordinal, another mask");
  tgm_cpu_dropout(TGM_F32, x.p, y1.p, n, 0.5, 42 + ((uint64_t)1 << 32), 0, 1);
  check(memcmp(y0.p, y1.p, 4 * (size_t)n) != 0, "dropout: another seed (high word), another mask");
  tfree(&x);
  tfree(&y0);
  tfree(&y1);
}

/* dropout against gen/interp.c itself: two dropouts of one spec (ordinals 0
 * and 1) through tgen_load and interp_run in training mode; the kernel with
 * each node's ordinal gives the interpreter's zero pattern exactly and its
 * values to f32 rounding. */
static void test_dropout_interp(void) {
  static const char spec[] = "name: t\n"
                             "inputs:\n"
                             "  x: [3000]\n"
                             "graph:\n"
                             "  - a: dropout(x, 0.3)\n"
                             "  - b: dropout(a, 0.75)\n"
                             "outputs: [a, b]\n";
  static Diag dg; /* tgen_load may leave the global `diag` pointing here */
  Arena ar = {0};
  ar.fail_after = -1;
  Graph *g = tgen_load(&dg, &ar, "t.yaml", spec, sizeof spec - 1);
  if (!g) {
    check(0, fmt("dropout vs interp: the spec was refused: %s", dg.msg));
    arena_free(&ar);
    return;
  }
  int64_t n = 3000;
  Tensor in = {1, {n}, n, malloc(sizeof(double) * (size_t)n)};
  float *xf = malloc(sizeof(float) * (size_t)n), *ya = malloc(sizeof(float) * (size_t)n),
        *yb = malloc(sizeof(float) * (size_t)n);
  for (int64_t j = 0; j < n; j++)
    in.data[j] = xf[j] = (float)((rnext() & 1 ? -1 : 1) * runif(0.25, 4));
  Tensor *vals = calloc((size_t)g->nnodes + 1, sizeof(Tensor));
  char err[256];
  uint64_t seeds[2] = {0x0123456789abcdefull, 7};
  uint64_t steps[2] = {((uint64_t)3 << 32) + 11, 0};
  for (int r = 0; r < 2; r++) {
    InterpOptions o = {.training = 1, .seed = seeds[r], .step = steps[r]};
    if (interp_run(g, &o, &in, NULL, vals, err, sizeof err)) {
      check(0, fmt("dropout vs interp: interp_run: %s", err));
      break;
    }
    const Node *na = g->outputs[0], *nb = g->outputs[1];
    tgm_cpu_dropout(TGM_F32, xf, ya, n, 0.3, seeds[r], (uint32_t)na->index, steps[r]);
    tgm_cpu_dropout(TGM_F32, ya, yb, n, 0.75, seeds[r], (uint32_t)nb->index, steps[r]);
    const double *ia = vals[na->id].data, *ib = vals[nb->id].data;
    int64_t mism = 0, far = 0, kept = 0;
    for (int64_t j = 0; j < n; j++) {
      mism += (ya[j] != 0) != (ia[j] != 0);
      mism += (yb[j] != 0) != (ib[j] != 0);
      kept += ib[j] != 0;
      far += fabs(ya[j] - ia[j]) > 1e-6 * fabs(ia[j]) || fabs(yb[j] - ib[j]) > 2e-6 * fabs(ib[j]);
    }
    check(na->index != nb->index, "dropout vs interp: the two dropouts have different ordinals");
    check(mism == 0 && kept > 0, fmt("dropout vs interp (seed %llx): the same zero pattern (%lld mismatches)",
                                     (unsigned long long)seeds[r], (long long)mism));
    check(far == 0, fmt("dropout vs interp (seed %llx): values to f32 rounding (%lld beyond)",
                        (unsigned long long)seeds[r], (long long)far));
    interp_free(g, vals);
  }
  free(vals);
  free(in.data);
  free(xf);
  free(ya);
  free(yb);
  arena_free(&ar);
}

/* ---------------------------------------------------------------- GEMM-based */

/* op(a) op(b) in double, M x N row-major (malloc'd): a is [M, K] ([K, M] when ta), b [K, N] ([N, K] when tb). */
static double *ref_sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, const T *a, const T *b) {
  double *out = malloc(sizeof(double) * (size_t)(M * N));
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double s = 0;
      for (int64_t l = 0; l < K; l++)
        s += a->v[ta ? l * M + i : i * K + l] * b->v[tb ? j * K + l : l * N + j];
      out[i * N + j] = s;
    }
  return out;
}

static void test_gemm_direct(void) {
  static const int64_t cs[][3] = {{1, 1, 1}, {3, 17, 5}, {33, 130, 17}, {130, 33, 257}, {200, 150, 300},
                                  {7, 3100, 9}};
  for (size_t k = 0; k < sizeof cs / sizeof *cs; k++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        int64_t M = cs[k][0], N = cs[k][1], K = cs[k][2], na = M * K, nb = K * N, nc = M * N;
        T a = rnd(TGM_F32, 1, &na, -1, 1), b = rnd(TGM_F32, 1, &nb, -1, 1);
        double *prod = ref_sgemm(ta, tb, M, N, K, &a, &b), *ref = malloc(sizeof(double) * (size_t)nc);
        for (int bv = 0; bv < 3; bv++) {
          float alpha = bv == 2 ? 0.5f : 1.0f, beta = bv == 0 ? 0.0f : bv == 1 ? 1.0f : -0.25f;
          T c = rnd(TGM_F32, 1, &nc, -1, 1);
          for (int64_t i = 0; i < nc; i++) {
            if (beta == 0)
              setv(&c, i, NAN); /* beta 0 must not read C */
            ref[i] = alpha * prod[i] + (beta == 0 ? 0 : beta * c.v[i]);
          }
          sgemm(ta, tb, M, N, K, alpha, a.p, ta ? M : K, b.p, tb ? K : N, beta, c.p, N, 1);
          expect(fmt("sgemm ta=%d tb=%d M=%lld N=%lld K=%lld alpha=%g beta=%g", ta, tb, (long long)M, (long long)N,
                     (long long)K, alpha, beta),
                 TGM_F32, c.p, ref, nc, 1e-4);
          if (M * N * K < 100000 && beta == 0) { /* the no-scratch fallback */
            for (int64_t i = 0; i < nc; i++)
              setv(&c, i, NAN);
            gemm_naive(ta, tb, M, N, K, alpha, a.p, ta ? M : K, b.p, tb ? K : N, beta, c.p, N);
            expect(fmt("gemm_naive ta=%d tb=%d M=%lld N=%lld K=%lld", ta, tb, (long long)M, (long long)N, (long long)K),
                   TGM_F32, c.p, ref, nc, 1e-4);
          }
          tfree(&c);
        }
        free(prod);
        free(ref);
        tfree(&a);
        tfree(&b);
      }
}

/* tgm_chunk: the chunks the team's threads take tile [0, n) exactly, each
 * starting on a whole unit, at 1-16 threads and outside a parallel region;
 * at most one a thread under 4 threads, four a thread from 4 (which thread
 * takes how many is the scheduler's affair). */
static void test_chunks(void) {
  snprintf(ctx, sizeof ctx, "tgm_chunk");
  static const int64_t ns[] = {0, 1, 15, 16, 17, 1000, 16384 * 3 + 5}, units[] = {1, 16, 64};
  static char seen[16384 * 3 + 5];
#ifdef _OPENMP
  const int saved = omp_get_max_threads();
#endif
  for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
    for (size_t b = 0; b < sizeof units / sizeof *units; b++)
      for (int nt = 0; nt <= 16; nt++) { /* 0: outside a parallel region */
        const int64_t n = ns[a], unit = units[b];
        memset(seen, 0, sizeof seen);
        int64_t next = 0, taken = 0, bad = 0, chunks = 0;
#ifdef _OPENMP
        if (nt)
          omp_set_num_threads(nt);
#pragma omp parallel if (nt > 0) reduction(+ : taken, bad, chunks)
#endif
        {
          int64_t lo, hi;
          while (tgm_chunk(&next, n, unit, &lo, &hi)) {
            bad += lo % unit != 0 || lo >= hi || hi > n;
            for (int64_t i = lo; i < hi && i < n; i++) {
              char was;
#ifdef _OPENMP
#pragma omp atomic capture
#endif
              was = seen[i]++;
              bad += was != 0;
            }
            taken += hi - lo;
            chunks++;
          }
        }
        check(taken == n && !bad, fmt("n %lld, unit %lld, %d threads: the chunks tile [0, n) once each",
                                      (long long)n, (long long)unit, nt));
        const int64_t units_n = (n + unit - 1) / unit, most_chunks = nt < 4 ? (nt ? nt : 1) : 4 * nt;
        check(chunks <= most_chunks && (n == 0 || chunks >= (units_n < most_chunks ? units_n : most_chunks) / 2),
              fmt("n %lld, unit %lld, %d threads: %lld chunks (at most %lld)", (long long)n, (long long)unit, nt,
                  (long long)chunks, (long long)most_chunks));
      }
#ifdef _OPENMP
  omp_set_num_threads(saved);
#endif
}

/* sgemm at 4 and 12 threads on shapes whose pieces are a grid in both
 * dims (with a CBLAS, cblas_split's 2 x 2, 3 x 4, ...; built in, the
 * blocked GEMM's), against the product in double. */
static void test_gemm_grid(void) {
#ifdef _OPENMP
  static const int64_t cs[][3] = {{256, 320, 40}, {130, 700, 33}, {700, 130, 65}};
  static const int nts[] = {4, 12};
  const int saved = omp_get_max_threads();
  for (size_t k = 0; k < sizeof cs / sizeof *cs; k++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        const int64_t M = cs[k][0], N = cs[k][1], K = cs[k][2], na = M * K, nb = K * N, nc = M * N;
        T a = rnd(TGM_F32, 1, &na, -1, 1), b = rnd(TGM_F32, 1, &nb, -1, 1);
        double *ref = ref_sgemm(ta, tb, M, N, K, &a, &b);
        for (size_t t = 0; t < sizeof nts / sizeof *nts; t++) {
          omp_set_num_threads(nts[t]);
          T c = rnd(TGM_F32, 1, &nc, -1, 1);
          for (int64_t i = 0; i < nc; i++)
            setv(&c, i, NAN); /* beta 0: every element written */
          sgemm(ta, tb, M, N, K, 1.0f, a.p, ta ? M : K, b.p, tb ? K : N, 0.0f, c.p, N, 1);
          expect(fmt("sgemm on %d threads ta=%d tb=%d M=%lld N=%lld K=%lld", nts[t], ta, tb, (long long)M, (long long)N,
                     (long long)K),
                 TGM_F32, c.p, ref, nc, 1e-4);
          tfree(&c);
        }
        free(ref);
        tfree(&a);
        tfree(&b);
      }
  omp_set_num_threads(saved);
#endif
}

/* torch.matmul in double: batch dims broadcast, 1-D operands promoted. */
static void ref_matmul(const T *a, const T *b, int ry, const int64_t *sy, double *out) {
  int64_t M = a->r >= 2 ? a->s[a->r - 2] : 1, K = a->s[a->r - 1], N = b->r >= 2 ? b->s[b->r - 1] : 1;
  int nb = ry - (a->r >= 2) - (b->r >= 2), abr = a->r >= 2 ? a->r - 2 : 0, bbr = b->r >= 2 ? b->r - 2 : 0;
  int64_t nbatch = numel_of(nb, sy), idx[TGM_MAXRANK];
  for (int64_t t = 0; t < nbatch; t++) {
    unravel(t, nb, sy, idx);
    int64_t ao = bidx(abr, a->s, nb, idx) * M * K, bo = bidx(bbr, b->s, nb, idx) * K * N;
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++)
          s += a->v[ao + i * K + k] * b->v[bo + k * N + j];
        out[(t * M + i) * N + j] = s;
      }
  }
}

static void test_matmul(void) {
  static const struct {
    int ra;
    int64_t sa[4];
    int rb;
    int64_t sb[4];
  } cs[] = {
      {2, {1, 1}, 2, {1, 1}},           {2, {3, 17}, 2, {17, 5}},         {2, {33, 130}, 2, {130, 17}},
      {2, {130, 33}, 2, {33, 129}},     {1, {17}, 2, {17, 5}},            {2, {5, 17}, 1, {17}},
      {1, {33}, 1, {33}},               {4, {2, 3, 5, 17}, 2, {17, 9}},   {2, {5, 17}, 3, {2, 17, 9}},
      {4, {2, 1, 5, 7}, 3, {3, 7, 4}},  {3, {5, 3, 17}, 3, {5, 17, 6}},   {1, {17}, 3, {4, 17, 5}},
      {3, {4, 5, 17}, 1, {17}},         {2, {200, 270}, 2, {270, 130}},   {3, {3, 5, 17}, 4, {1, 1, 17, 9}},   {3, {16, 64, 64}, 3, {16, 64, 64}},
      {2, {8, 300}, 2, {300, 3100}},    {3, {2, 150, 40}, 3, {2, 40, 260}}, {2, {4, 0}, 2, {0, 3}},
  };
  static const int dts[] = {TGM_F32, TGM_BF16, TGM_F16};
  for (int d = 0; d < 3; d++)
    for (size_t k = 0; k < sizeof cs / sizeof *cs; k++) {
      int dt = dts[d];
      int ra = cs[k].ra, rb = cs[k].rb, ry = 0;
      int64_t sy[TGM_MAXRANK], bs[TGM_MAXRANK];
      int abr = ra >= 2 ? ra - 2 : 0, bbr = rb >= 2 ? rb - 2 : 0;
      int nb = bcast_shape(abr, cs[k].sa, bbr, cs[k].sb, bs);
      for (int i = 0; i < nb; i++)
        sy[ry++] = bs[i];
      if (ra >= 2)
        sy[ry++] = cs[k].sa[ra - 2];
      if (rb >= 2)
        sy[ry++] = cs[k].sb[rb - 1];
      T a = rnd(dt, ra, cs[k].sa, -1, 1), b = rnd(dt, rb, cs[k].sb, -1, 1), y = mk(dt, ry, sy);
      double *ref = malloc(sizeof(double) * (size_t)(y.n ? y.n : 1));
      ref_matmul(&a, &b, ry, sy, ref);
      tgm_cpu_matmul(dt, a.p, ra, a.s, b.p, rb, b.s, y.p, ry, sy);
      expect(fmt("matmul %s %s @ %s", dtn[dt], shstr(ra, a.s), shstr(rb, b.s)), dt, y.p, ref, y.n, gtol_of(dt));
      if (y.n * a.s[ra - 1] < 200000) { /* the no-scratch path */
        memset(y.p, 0, esize(dt) * (size_t)y.n);
        matmul_naive(dt, a.p, ra, a.s, b.p, rb, b.s, y.p, ry, sy);
        expect(fmt("matmul_naive %s %s @ %s", dtn[dt], shstr(ra, a.s), shstr(rb, b.s)), dt, y.p, ref, y.n,
               gtol_of(dt));
      }
      free(ref);
      tfree(&a);
      tfree(&b);
      tfree(&y);
    }
}

static void test_linear(void) {
  static const int64_t cs[][3] = {{1, 1, 1},       {3, 17, 5},     {33, 130, 17}, {300, 257, 129},
                                  {2, 0, 3},       {1000, 64, 10}, {5, 33, 300}};
  static const int dts[] = {TGM_F32, TGM_BF16, TGM_F16};
  for (int d = 0; d < 3; d++)
    for (size_t k = 0; k < sizeof cs / sizeof *cs; k++)
      for (int hb = 0; hb < 2; hb++) {
        int dt = dts[d];
        int64_t R = cs[k][0], In = cs[k][1], O = cs[k][2], nx = R * In, nw = O * In, ny = R * O;
        T x = rnd(dt, 1, &nx, -1, 1), w = rnd(dt, 1, &nw, -1, 1), b = rnd(dt, 1, &O, -1, 1), y = mk(dt, 1, &ny);
        double *ref = malloc(sizeof(double) * (size_t)ny);
        for (int64_t r = 0; r < R; r++)
          for (int64_t o = 0; o < O; o++) {
            double s = hb ? b.v[o] : 0;
            for (int64_t i = 0; i < In; i++)
              s += x.v[r * In + i] * w.v[o * In + i];
            ref[r * O + o] = s;
          }
        tgm_cpu_linear(dt, x.p, w.p, hb ? b.p : NULL, y.p, R, In, O);
        expect(fmt("linear %s rows=%lld in=%lld out=%lld bias=%d", dtn[dt], (long long)R, (long long)In, (long long)O,
                   hb),
               dt, y.p, ref, ny, gtol_of(dt));
        free(ref);
        tfree(&x);
        tfree(&w);
        tfree(&b);
        tfree(&y);
      }
}

/* scaled_dot_product_attention in double (gen/interp.c's eval_attention),
 * and each row's log-sum-exp of the scores when lse is not NULL. */
static void ref_attention(const T *q, const T *k, const T *v, int ry, const int64_t *sy, int causal, double scale,
                          double *out, double *lse) {
  int64_t Tq = q->s[q->r - 2], D = q->s[q->r - 1], Tk = k->s[k->r - 2], Dv = v->s[v->r - 1];
  int nb = ry - 2;
  int64_t nbatch = numel_of(nb, sy), idx[TGM_MAXRANK];
  double *s = malloc(sizeof(double) * (size_t)(Tk ? Tk : 1));
  for (int64_t t = 0; t < nbatch; t++) {
    unravel(t, nb, sy, idx);
    const double *Q = q->v + bidx(q->r - 2, q->s, nb, idx) * Tq * D, *K = k->v + bidx(k->r - 2, k->s, nb, idx) * Tk * D;
    const double *V = v->v + bidx(v->r - 2, v->s, nb, idx) * Tk * Dv;
    double *O = out + t * Tq * Dv;
    for (int64_t i = 0; i < Tq; i++) {
      double m = -INFINITY, sum = 0;
      for (int64_t j = 0; j < Tk; j++) {
        double dot = 0;
        for (int64_t e = 0; e < D; e++)
          dot += Q[i * D + e] * K[j * D + e];
        s[j] = causal && j > i ? -INFINITY : scale * dot;
        m = s[j] > m ? s[j] : m;
      }
      for (int64_t j = 0; j < Tk; j++)
        sum += (s[j] = exp(s[j] - m));
      if (lse)
        lse[t * Tq + i] = m + log(sum);
      for (int64_t e = 0; e < Dv; e++) {
        double acc = 0;
        for (int64_t j = 0; j < Tk; j++)
          acc += s[j] / sum * V[j * Dv + e];
        O[i * Dv + e] = acc;
      }
    }
  }
  free(s);
}

/* The attention cases (forward and backward): q, k, v shapes. Odd sizes,
 * sizes that are not a multiple of the query block (ATT_QB) or cross it,
 * Tq != Tk both ways, broadcast batch dims (k, v of batch 1 against q's 2; a
 * rank-2 v), head dims 8 to 64, no keys or no queries, and batch counts
 * that take both parallel paths (over the batch, over the query blocks). */
static const struct {
  int rq;
  int64_t sq[4];
  int rk;
  int64_t sk[4];
  int rv;
  int64_t sv[4];
} att_cases[] = {
    {2, {1, 1}, 2, {1, 1}, 2, {1, 1}},
    {4, {2, 3, 17, 16}, 4, {2, 3, 17, 16}, 4, {2, 3, 17, 16}},
    {3, {2, 5, 8}, 3, {2, 9, 8}, 3, {2, 9, 12}},
    {3, {2, 9, 8}, 3, {2, 5, 8}, 3, {2, 5, 4}},
    {4, {2, 3, 7, 8}, 4, {1, 3, 7, 8}, 2, {7, 5}},
    {3, {2, 130, 16}, 3, {1, 130, 16}, 3, {1, 130, 16}},
    {3, {1, 65, 64}, 3, {1, 300, 64}, 3, {1, 300, 64}},
    {3, {1, 300, 8}, 3, {1, 130, 8}, 3, {1, 130, 8}},
    {4, {2, 4, 64, 16}, 4, {2, 4, 64, 16}, 4, {2, 4, 64, 16}},
    {2, {300, 8}, 2, {300, 8}, 2, {300, 8}},
    {3, {1, 260, 32}, 3, {1, 260, 32}, 3, {1, 260, 32}},
    {3, {2, 5, 8}, 3, {2, 0, 8}, 3, {2, 0, 4}},
    {3, {2, 0, 8}, 3, {2, 5, 8}, 3, {2, 5, 4}},
};
enum { NATT_CASES = sizeof att_cases / sizeof *att_cases };

/* The result shape sy of attention case c (returns its rank). */
static int att_shape(size_t c, int64_t *sy) {
  int64_t bkv[TGM_MAXRANK], bb[TGM_MAXRANK];
  int nb1 = bcast_shape(att_cases[c].rk - 2, att_cases[c].sk, att_cases[c].rv - 2, att_cases[c].sv, bkv);
  int nb = bcast_shape(att_cases[c].rq - 2, att_cases[c].sq, nb1, bkv, bb);
  int ry = 0;
  for (int i = 0; i < nb; i++)
    sy[ry++] = bb[i];
  sy[ry++] = att_cases[c].sq[att_cases[c].rq - 2];
  sy[ry++] = att_cases[c].sv[att_cases[c].rv - 1];
  return ry;
}

static void test_attention(void) {
  static const int dts[] = {TGM_F32, TGM_BF16, TGM_F16};
  for (int d = 0; d < 3; d++)
    for (size_t k = 0; k < NATT_CASES; k++)
      for (int causal = 0; causal < 2; causal++)
        for (int sc = 0; sc < 2; sc++) {
          int dt = dts[d];
          int64_t sy[TGM_MAXRANK];
          int ry = att_shape(k, sy);
          T q = rnd(dt, att_cases[k].rq, att_cases[k].sq, -1, 1), kk = rnd(dt, att_cases[k].rk, att_cases[k].sk, -1, 1);
          T v = rnd(dt, att_cases[k].rv, att_cases[k].sv, -1, 1), y = mk(dt, ry, sy);
          int64_t nl = numel_of(ry - 1, sy);
          double scale = sc ? 0.3 : 1.0 / sqrt((double)att_cases[k].sq[att_cases[k].rq - 1]);
          double *ref = malloc(sizeof(double) * (size_t)(y.n + 1)), *rlse = malloc(sizeof(double) * (size_t)(nl + 1));
          float *lse = malloc(sizeof(float) * (size_t)(nl + 1)), *lse2 = malloc(sizeof(float) * (size_t)(nl + 1));
          ref_attention(&q, &kk, &v, ry, sy, causal, scale, ref, rlse);
          char what[160];
          snprintf(what, sizeof what, "attention %s q%s k%s v%s causal=%d scale=%g", dtn[dt], shstr(q.r, q.s),
                   shstr(kk.r, kk.s), shstr(v.r, v.s), causal, scale);
          tgm_view vq = tview(&q), vk = tview(&kk), vv = tview(&v), vy = tview(&y), vn = view_of(dt, NULL, 0, ry, sy, NULL);
          memset(y.p, 0x5a, esize(dt) * (size_t)y.n);
          memset(lse, 0x5a, sizeof(float) * (size_t)nl);
          tgm_cpu_attention(dt, &vq, &vk, &vv, &vy, causal, scale, lse);
          expect(what, dt, y.p, ref, y.n, gtol_of(dt));
          expect(fmt("%s: lse", what), TGM_F32, lse, rlse, nl, tol_of(TGM_F32));
          /* lse alone (y NULL): the same bits */
          memset(lse2, 0x5a, sizeof(float) * (size_t)nl);
          tgm_cpu_attention(dt, &vq, &vk, &vv, &vn, causal, scale, lse2);
          check(!memcmp(lse, lse2, sizeof(float) * (size_t)nl), fmt("%s: lse alone (y NULL), the same bits", what));
          int64_t Tq = q.s[q.r - 2], Tk = kk.s[kk.r - 2], Dv = v.s[v.r - 1];
          if (ry == 3 && sy[0] <= 2 && Tq * Tk <= 20000) { /* the no-scratch rows, one batch */
            Att a = att_init(dt, &vq, &vk, &vv, &vy, NULL, NULL, NULL, causal, scale);
            memset(y.p, 0, esize(dt) * (size_t)y.n);
            attention_noscratch(&a, 0, 0, Tq, lse);
            expect(fmt("attention_noscratch %s q%s causal=%d", dtn[dt], shstr(q.r, q.s), causal), dt, y.p, ref,
                   Tq * Dv, gtol_of(dt));
            expect(fmt("attention_noscratch %s q%s causal=%d: lse", dtn[dt], shstr(q.r, q.s), causal), TGM_F32, lse,
                   rlse, Tq, tol_of(TGM_F32));
          }
          free(ref);
          free(rlse);
          free(lse);
          free(lse2);
          tfree(&q);
          tfree(&kk);
          tfree(&v);
          tfree(&y);
        }
  /* NaN propagates as in torch: a NaN query row, and a row whose scores are
   * all -inf, give NaN in y and lse; the other rows are untouched */
  int64_t s3[3] = {1, 3, 4};
  T q = rnd(TGM_F32, 3, s3, -1, 1), kk = rnd(TGM_F32, 3, s3, 0.5, 1), v = rnd(TGM_F32, 3, s3, -1, 1);
  T y = mk(TGM_F32, 3, s3);
  float lse[3];
  for (int e = 0; e < 4; e++) {
    setv(&q, 4 + e, NAN);
    setv(&q, 8 + e, -INFINITY);
  }
  tgm_view vq = tview(&q), vk = tview(&kk), vv = tview(&v), vy = tview(&y);
  tgm_cpu_attention(TGM_F32, &vq, &vk, &vv, &vy, 0, 0.5, lse);
  const float *fy = y.p;
  int ok = isfinite(lse[0]) && isnan(lse[1]) && isnan(lse[2]);
  for (int e = 0; e < 4; e++)
    ok &= isfinite(fy[e]) && isnan(fy[4 + e]) && isnan(fy[8 + e]);
  check(ok, "attention: a NaN row and an all -inf row give NaN (y and lse), the others finite");
  tfree(&q);
  tfree(&kk);
  tfree(&v);
  tfree(&y);
}

/* attention's backward in double, from the reference forward's P: dv = P^T
 * dy, dP = dy v^T, dS = P (dP - rowsum(dP P)), dq = scale dS k, dk = scale
 * dS^T q, for every batch index of sy (dk and dv too where k and v
 * broadcast). Also the inputs the kernel takes, in f32: lse, and delta =
 * rowsum(dy y) with y the reference forward rounded to dt (as the caller
 * computes it from the forward's stored result). exact 0: dS = P (dP -
 * delta) with that delta, the kernel's contract; it differs from the exact
 * gradient by y's rounding, for bf16 and f16 by more than their tolerance on
 * the gradients near 0 (in f32 the two agree to rounding). mag[3] gets each
 * gradient's mean size of its terms (sum over j of scale |dS| |k| for dq,
 * with |dS| <= P (|dP| + |delta|) ...), the scale of its rounding errors:
 * dq and dk sum terms that cancel (dS sums to 0 over a row), so their
 * elements can be far smaller than the terms, exactly 0 with one key. */
static void ref_attention_backward(const T *q, const T *k, const T *v, const T *dy, int ry, const int64_t *sy,
                                   int causal, double scale, int exact, double *dq, double *dk, double *dv,
                                   float *lse, float *delta, double *mag) {
  int64_t Tq = q->s[q->r - 2], D = q->s[q->r - 1], Tk = k->s[k->r - 2], Dv = v->s[v->r - 1];
  int nb = ry - 2;
  int64_t nbatch = numel_of(nb, sy), idx[TGM_MAXRANK];
  double *p = malloc(sizeof(double) * (size_t)(Tk + 1)), *dp = malloc(sizeof(double) * (size_t)(Tk + 1));
  memset(dk, 0, sizeof(double) * (size_t)(nbatch * Tk * D));
  memset(dv, 0, sizeof(double) * (size_t)(nbatch * Tk * Dv));
  mag[0] = mag[1] = mag[2] = 0;
  for (int64_t t = 0; t < nbatch; t++) {
    unravel(t, nb, sy, idx);
    const double *Q = q->v + bidx(q->r - 2, q->s, nb, idx) * Tq * D, *K = k->v + bidx(k->r - 2, k->s, nb, idx) * Tk * D;
    const double *V = v->v + bidx(v->r - 2, v->s, nb, idx) * Tk * Dv, *dY = dy->v + t * Tq * Dv;
    double *dQ = dq + t * Tq * D, *dK = dk + t * Tk * D, *dV = dv + t * Tk * Dv;
    for (int64_t i = 0; i < Tq; i++) {
      double m = -INFINITY, sum = 0, rs = 0, dl = 0;
      for (int64_t j = 0; j < Tk; j++) {
        double dot = 0;
        for (int64_t e = 0; e < D; e++)
          dot += Q[i * D + e] * K[j * D + e];
        p[j] = causal && j > i ? -INFINITY : scale * dot;
        m = p[j] > m ? p[j] : m;
      }
      for (int64_t j = 0; j < Tk; j++)
        sum += (p[j] = exp(p[j] - m));
      lse[t * Tq + i] = (float)(m + log(sum));
      for (int64_t j = 0; j < Tk; j++) {
        p[j] /= sum;
        dp[j] = 0;
        for (int64_t e = 0; e < Dv; e++)
          dp[j] += dY[i * Dv + e] * V[j * Dv + e];
        rs += dp[j] * p[j];
      }
      for (int64_t e = 0; e < Dv; e++) {
        double y = 0;
        for (int64_t j = 0; j < Tk; j++)
          y += p[j] * V[j * Dv + e];
        dl += dY[i * Dv + e] * rounded(dy->dt, y);
      }
      delta[t * Tq + i] = (float)dl;
      if (!exact)
        rs = delta[t * Tq + i];
      for (int64_t e = 0; e < D; e++)
        dQ[i * D + e] = 0;
      for (int64_t j = 0; j < Tk; j++) {
        double ds = p[j] * (dp[j] - rs), dsm = scale * p[j] * (fabs(dp[j]) + fabs(rs));
        for (int64_t e = 0; e < D; e++) {
          dQ[i * D + e] += scale * ds * K[j * D + e];
          dK[j * D + e] += scale * ds * Q[i * D + e];
          mag[0] += dsm * fabs(K[j * D + e]);
          mag[1] += dsm * fabs(Q[i * D + e]);
        }
        for (int64_t e = 0; e < Dv; e++) {
          dV[j * Dv + e] += p[j] * dY[i * Dv + e];
          mag[2] += p[j] * fabs(dY[i * Dv + e]);
        }
      }
    }
  }
  mag[0] /= (double)(nbatch * Tq * D > 0 ? nbatch * Tq * D : 1);
  mag[1] /= (double)(nbatch * Tk * D > 0 ? nbatch * Tk * D : 1);
  mag[2] /= (double)(nbatch * Tk * Dv > 0 ? nbatch * Tk * Dv : 1);
  free(p);
  free(dp);
}

/* A gradient against its reference: expect's tolerance with the mean size
 * of its terms (ref_attention_backward's mag) in place of its mean. */
static void expect_grad(const char *what, int dt, const void *p, const double *ref, int64_t n, double mag) {
  double rtol = gtol_of(dt);
  expect_atol(what, dt, p, ref, n, rtol, rtol * (mag < 1 ? mag : 1) + (dt == TGM_F16 ? 0x1p-25 : 0));
}

/* A row-major view at p of shape [sy's batch dims..., rows, cols] (a
 * backward result's: sy is dy's shape). */
static tgm_view grad_view(int dt, void *p, int ry, const int64_t *sy, int64_t rows, int64_t cols) {
  int64_t s[TGM_MAXRANK];
  for (int k = 0; k < ry - 2; k++)
    s[k] = sy[k];
  s[ry - 2] = rows;
  s[ry - 1] = cols;
  return view_of(dt, p, 0, ry, s, NULL);
}

/* The backward of case c in dtype dt (all three gradients, or the ones `want`
 * names: bit 0 dq, 1 dk, 2 dv) into out[3] (T's made here, flat). */
static void att_bwd_run(int dt, const T *q, const T *k, const T *v, const T *dy, int ry, const int64_t *sy,
                        const float *lse, const float *delta, int causal, double scale, int want, T *out) {
  int64_t Tq = q->s[q->r - 2], D = q->s[q->r - 1], Tk = k->s[k->r - 2], Dv = v->s[v->r - 1];
  int64_t nbatch = numel_of(ry - 2, sy), n[3] = {nbatch * Tq * D, nbatch * Tk * D, nbatch * Tk * Dv};
  for (int o = 0; o < 3; o++) {
    out[o] = mk(dt, 1, &n[o]);
    memset(out[o].p, 0x5a, esize(dt) * (size_t)n[o]); /* every element must be written */
  }
  tgm_view vq = tview(q), vk = tview(k), vv = tview(v), vdy = view_of(dt, dy->p, 0, ry, sy, NULL);
  tgm_view vg[3] = {grad_view(dt, want & 1 ? out[0].p : NULL, ry, sy, Tq, D),
                    grad_view(dt, want & 2 ? out[1].p : NULL, ry, sy, Tk, D),
                    grad_view(dt, want & 4 ? out[2].p : NULL, ry, sy, Tk, Dv)};
  tgm_cpu_attention_backward(dt, &vq, &vk, &vv, &vdy, lse, delta, &vg[0], &vg[1], &vg[2], causal, scale);
}

static void test_attention_backward(void) {
  static const int dts[] = {TGM_F32, TGM_BF16, TGM_F16};
  static const char *const gn[3] = {"dq", "dk", "dv"};
  for (int d = 0; d < 3; d++)
    for (size_t c = 0; c < NATT_CASES; c++)
      for (int causal = 0; causal < 2; causal++) {
        int dt = dts[d];
        int64_t sy[TGM_MAXRANK];
        int ry = att_shape(c, sy);
        T q = rnd(dt, att_cases[c].rq, att_cases[c].sq, -1, 1), kk = rnd(dt, att_cases[c].rk, att_cases[c].sk, -1, 1);
        T v = rnd(dt, att_cases[c].rv, att_cases[c].sv, -1, 1), dy = rnd(dt, ry, sy, -1, 1);
        int64_t Tq = q.s[q.r - 2], D = q.s[q.r - 1], Tk = kk.s[kk.r - 2], Dv = v.s[v.r - 1];
        int64_t nbatch = numel_of(ry - 2, sy), nl = nbatch * Tq;
        int64_t n[3] = {nbatch * Tq * D, nbatch * Tk * D, nbatch * Tk * Dv};
        double scale = causal ? 0.3 : 1.0 / sqrt((double)D), *ref[3], mag[3];
        for (int o = 0; o < 3; o++)
          ref[o] = malloc(sizeof(double) * (size_t)(n[o] + 1));
        float *lse = malloc(sizeof(float) * (size_t)(nl + 1)), *delta = malloc(sizeof(float) * (size_t)(nl + 1));
        char what[160];
        snprintf(what, sizeof what, "attention_backward %s q%s k%s v%s causal=%d", dtn[dt], shstr(q.r, q.s),
                 shstr(kk.r, kk.s), shstr(v.r, v.s), causal);
        T g[3], h[3];
        if (dt == TGM_F32) { /* the exact gradient */
          ref_attention_backward(&q, &kk, &v, &dy, ry, sy, causal, scale, 1, ref[0], ref[1], ref[2], lse, delta, mag);
          att_bwd_run(dt, &q, &kk, &v, &dy, ry, sy, lse, delta, causal, scale, 7, g);
          for (int o = 0; o < 3; o++) {
            expect_grad(fmt("%s: %s, the exact gradient", what, gn[o]), dt, g[o].p, ref[o], n[o], mag[o]);
            tfree(&g[o]);
          }
        }
        ref_attention_backward(&q, &kk, &v, &dy, ry, sy, causal, scale, 0, ref[0], ref[1], ref[2], lse, delta, mag);
        att_bwd_run(dt, &q, &kk, &v, &dy, ry, sy, lse, delta, causal, scale, 7, g);
        for (int o = 0; o < 3; o++)
          expect_grad(fmt("%s: %s", what, gn[o]), dt, g[o].p, ref[o], n[o], mag[o]);
        /* some not wanted (NULL): the others' bits unchanged */
        static const int wants[] = {1, 2, 4, 3, 6};
        for (size_t w = 0; w < sizeof wants / sizeof *wants; w++) {
          att_bwd_run(dt, &q, &kk, &v, &dy, ry, sy, lse, delta, causal, scale, wants[w], h);
          int same = 1;
          for (int o = 0; o < 3; o++) {
            if (wants[w] >> o & 1)
              same &= !memcmp(g[o].p, h[o].p, esize(dt) * (size_t)n[o]);
            tfree(&h[o]);
          }
          check(same, fmt("%s: only%s%s%s wanted, the same bits", what, wants[w] & 1 ? " dq" : "",
                          wants[w] & 2 ? " dk" : "", wants[w] & 4 ? " dv" : ""));
        }
        /* the no-scratch path, on the small cases */
        if (Tq * Tk * nbatch <= 20000) {
          tgm_view vq = tview(&q), vk = tview(&kk), vv = tview(&v), vdy = tview(&dy);
          tgm_view vg[3] = {grad_view(dt, g[0].p, ry, sy, Tq, D), grad_view(dt, g[1].p, ry, sy, Tk, D),
                            grad_view(dt, g[2].p, ry, sy, Tk, Dv)};
          for (int o = 0; o < 3; o++)
            memset(g[o].p, 0x5a, esize(dt) * (size_t)n[o]);
          Att a = att_init(dt, &vq, &vk, &vv, &vdy, &vg[0], &vg[1], &vg[2], causal, scale);
          for (int64_t t = 0; t < nbatch && Tq > 0 && Tk > 0; t++)
            att_bwd_noscratch(&a, lse, delta, t);
          for (int o = 0; o < 3 && Tq > 0 && Tk > 0; o++)
            expect_grad(fmt("%s: %s, no scratch", what, gn[o]), dt, g[o].p, ref[o], n[o], mag[o]);
        }
        for (int o = 0; o < 3; o++) {
          free(ref[o]);
          tfree(&g[o]);
        }
        free(lse);
        free(delta);
        tfree(&q);
        tfree(&kk);
        tfree(&v);
        tfree(&dy);
      }
#ifdef _OPENMP
  /* the same bits at 1, 2 and 3 threads, forward (y, lse) and backward: one
   * batch index (the query blocks over the threads / threaded GEMMs), two
   * (over the batch at 2 threads, threaded GEMMs at 3) and six */
  static const int64_t ts[][3] = {{1, 300, 32}, {2, 200, 24}, {6, 130, 16}};
  int saved = omp_get_max_threads();
  for (int d = 0; d < 2; d++)
    for (size_t c = 0; c < sizeof ts / sizeof *ts; c++)
      for (int causal = 0; causal < 2; causal++) {
        int dt = dts[d];
        int64_t s[3] = {ts[c][0], ts[c][1], ts[c][2]}, nl = s[0] * s[1];
        T q = rnd(dt, 3, s, -1, 1), kk = rnd(dt, 3, s, -1, 1), v = rnd(dt, 3, s, -1, 1), dy = rnd(dt, 3, s, -1, 1);
        float *lse = malloc(sizeof(float) * (size_t)nl), *delta = malloc(sizeof(float) * (size_t)nl);
        for (int64_t i = 0; i < nl; i++)
          delta[i] = (float)runif(-0.5, 0.5);
        T y[3], g[3][3];
        float *l[3];
        for (int nt = 1; nt <= 3; nt++) {
          omp_set_num_threads(nt);
          y[nt - 1] = mk(dt, 3, s);
          l[nt - 1] = malloc(sizeof(float) * (size_t)nl);
          tgm_view vq = tview(&q), vk = tview(&kk), vv = tview(&v), vy = tview(&y[nt - 1]);
          tgm_cpu_attention(dt, &vq, &vk, &vv, &vy, causal, 0.25, l[nt - 1]);
          if (nt == 1)
            memcpy(lse, l[0], sizeof(float) * (size_t)nl);
          att_bwd_run(dt, &q, &kk, &v, &dy, 3, s, lse, delta, causal, 0.25, 7, g[nt - 1]);
        }
        omp_set_num_threads(saved);
        int same = 1;
        for (int nt = 2; nt <= 3; nt++) {
          same &= !memcmp(y[0].p, y[nt - 1].p, esize(dt) * (size_t)y[0].n);
          same &= !memcmp(l[0], l[nt - 1], sizeof(float) * (size_t)nl);
          for (int o = 0; o < 3; o++)
            same &= !memcmp(g[0][o].p, g[nt - 1][o].p, esize(dt) * (size_t)g[0][o].n);
        }
        check(same, fmt("attention and its backward %s %s causal=%d: the same bits at 1, 2 and 3 threads", dtn[dt],
                        shstr(3, s), causal));
        for (int nt = 0; nt < 3; nt++) {
          tfree(&y[nt]);
          free(l[nt]);
          for (int o = 0; o < 3; o++)
            tfree(&g[nt][o]);
        }
        free(lse);
        free(delta);
        tfree(&q);
        tfree(&kk);
        tfree(&v);
        tfree(&dy);
      }
#endif
}

/* ---------------------------------------------------------------- attention on strided views */

/* The elements of view v (dtype dt) as a contiguous tensor of its shape. */
static T gather(int dt, const tgm_view *v) {
  T t = mk(dt, v->rank, v->shape);
  const size_t es = esize(dt);
  for (int64_t i = 0; i < t.n; i++) {
    int64_t idx[TGM_MAXRANK], off = 0;
    unravel(i, v->rank, v->shape, idx);
    for (int k = 0; k < v->rank; k++)
      off += idx[k] * v->st[k];
    memcpy((char *)t.p + (size_t)i * es, (const char *)v->p + (size_t)off * es, es);
    t.v[i] = getv(dt, t.p, i);
  }
  return t;
}

/* Marks in m (a byte per element of the buffer at base) the elements of v. */
static void mark(int dt, const void *base, const tgm_view *v, unsigned char *m) {
  const int64_t n = numel_of(v->rank, v->shape), o0 = ((const char *)v->p - (const char *)base) / (int64_t)esize(dt);
  for (int64_t i = 0; i < n; i++) {
    int64_t idx[TGM_MAXRANK], off = o0;
    unravel(i, v->rank, v->shape, idx);
    for (int k = 0; k < v->rank; k++)
      off += idx[k] * v->st[k];
    m[off] = 1;
  }
}

/* Whether every element of the n at b (dtype dt) that m does not mark still
 * holds the sentinel bytes 0x5a. */
static int untouched(int dt, const void *b, const unsigned char *m, int64_t n) {
  const size_t es = esize(dt);
  for (int64_t i = 0; i < n; i++)
    for (size_t e = 0; !m[i] && e < es; e++)
      if (((const unsigned char *)b)[(size_t)i * es + e] != 0x5a)
        return 0;
  return 1;
}

/* Whether view v has the bits of the contiguous tensor t (NULL: of zeros). */
static int same_bits(int dt, const tgm_view *v, const T *t) {
  T g = gather(dt, v);
  int same = 1;
  if (t)
    same = g.n == t->n && !memcmp(g.p, t->p, esize(dt) * (size_t)g.n);
  for (int64_t i = 0; !t && i < g.n * (int64_t)esize(dt); i++)
    same &= ((const unsigned char *)g.p)[i] == 0;
  tfree(&g);
  return same;
}

/* Strided views against contiguous copies. q, k, v are views into one
 * buffer laid out as GPT-2's packed qkv, [B, T, 3, H, D] (q(b, h, t, d) at
 * ((b T + t) 3 + 0) H D + h D + d, k one H D further, v two) with `pad`
 * spare elements after each token (0: GPT-2's layout); y and dy are views
 * into [B, T, H, D] (+ pad per token); dq, dk, dv are written into one
 * packed [B, T, 3, H, D] (+ pad) where q, k, v are read from. kv 1: k and v
 * read batch 0 for every batch (batch stride 0); kv 2: k and v shaped [H,
 * T, D] (a missing batch dim). Every result must have the bits of the same
 * call on contiguous copies (the blocked paths, and on the first call the
 * no-scratch ones; all three gradients, and dq, dv without dk), and every element of the result
 * buffers outside the views written (the pads, the slot of a gradient not
 * wanted) must keep its sentinel. Then no keys or no queries: zeros written
 * through views, the pads kept. */
static void test_attention_views(void) {
  static const int dts[] = {TGM_F32, TGM_BF16, TGM_F16};
  static const struct {
    int64_t B, H, T, D, pad;
    int kv;
  } cs[] = {{2, 3, 130, 16, 0, 0}, {2, 2, 70, 64, 3, 0}, {3, 2, 200, 8, 0, 1}, {2, 3, 100, 16, 5, 2},
            {1, 2, 1, 8, 2, 0}};
  static int calls; /* the no-scratch paths use neither the threads nor the GEMM: on the first call only */
  const int noscratch = calls++ == 0;
  for (int d = 0; d < 3; d++)
    for (size_t c = 0; c < sizeof cs / sizeof *cs; c++)
      for (int causal = 0; causal < 2; causal++) {
        const int dt = dts[d], kv = cs[c].kv;
        const int64_t B = cs[c].B, H = cs[c].H, Tt = cs[c].T, D = cs[c].D, HD = H * D;
        const int64_t rw = 3 * HD + cs[c].pad, yw = HD + cs[c].pad, nq = B * Tt * rw, ny = B * Tt * yw;
        const int64_t nl = B * H * Tt, s4[4] = {B, H, Tt, D}, pst[4] = {Tt * rw, D, rw, 1};
        const int64_t yst[4] = {Tt * yw, D, yw, 1}, kst[4] = {kv ? 0 : Tt * rw, D, rw, 1};
        const double scale = 1.0 / sqrt((double)D);
        const size_t es = esize(dt);
        T qkv = rnd(dt, 1, &nq, -1, 1), dyb = rnd(dt, 1, &ny, -1, 1), yb = mk(dt, 1, &ny), gb = mk(dt, 1, &nq);
        tgm_view vq = view_of(dt, qkv.p, 0, 4, s4, pst), vy = view_of(dt, yb.p, 0, 4, s4, yst);
        tgm_view vk = view_of(dt, qkv.p, HD, kv == 2 ? 3 : 4, s4 + (kv == 2), kst + (kv == 2));
        tgm_view vv = view_of(dt, qkv.p, 2 * HD, kv == 2 ? 3 : 4, s4 + (kv == 2), kst + (kv == 2));
        tgm_view vdy = view_of(dt, dyb.p, 0, 4, s4, yst), vg[3];
        for (int o = 0; o < 3; o++)
          vg[o] = view_of(dt, gb.p, o * HD, 4, s4, pst);
        T cq = gather(dt, &vq), ck = gather(dt, &vk), cv = gather(dt, &vv), cdy = gather(dt, &vdy);
        T cy = mk(dt, 4, s4), cg[3];
        tgm_view wq = tview(&cq), wk = tview(&ck), wv = tview(&cv), wy = tview(&cy), wdy = tview(&cdy);
        float *lse = malloc(sizeof(float) * (size_t)nl), *clse = malloc(sizeof(float) * (size_t)nl);
        float *delta = malloc(sizeof(float) * (size_t)nl);
        unsigned char *m = calloc((size_t)nq, 1);
        char what[160];
        snprintf(what, sizeof what, "attention on views %s B=%lld H=%lld T=%lld D=%lld pad=%lld kv=%d causal=%d",
                 dtn[dt], (long long)B, (long long)H, (long long)Tt, (long long)D, (long long)cs[c].pad, kv, causal);
        /* the forward: y and lse */
        memset(yb.p, 0x5a, es * (size_t)ny);
        tgm_cpu_attention(dt, &wq, &wk, &wv, &wy, causal, scale, clse);
        tgm_cpu_attention(dt, &vq, &vk, &vv, &vy, causal, scale, lse);
        mark(dt, yb.p, &vy, m);
        check(same_bits(dt, &vy, &cy) && !memcmp(lse, clse, sizeof(float) * (size_t)nl) && untouched(dt, yb.p, m, ny),
              fmt("%s: y and lse have the contiguous call's bits, y's pads untouched", what));
        if (noscratch) { /* the no-scratch rows */
          Att a = att_init(dt, &vq, &vk, &vv, &vy, NULL, NULL, NULL, causal, scale);
          Att ca = att_init(dt, &wq, &wk, &wv, &wy, NULL, NULL, NULL, causal, scale);
          memset(yb.p, 0x5a, es * (size_t)ny);
          for (int64_t b = 0; b < B * H; b++) {
            attention_noscratch(&a, b, 0, Tt, lse);
            attention_noscratch(&ca, b, 0, Tt, clse);
          }
          check(same_bits(dt, &vy, &cy) && !memcmp(lse, clse, sizeof(float) * (size_t)nl) &&
                    untouched(dt, yb.p, m, ny),
                fmt("%s: no scratch, y and lse have the contiguous rows' bits, y's pads untouched", what));
        }
        /* the backward: all three gradients, then dq and dv alone (dk's slot keeps its sentinel) */
        for (int64_t i = 0; i < nl; i++)
          delta[i] = (float)runif(-0.5, 0.5);
        att_bwd_run(dt, &cq, &ck, &cv, &cdy, 4, s4, clse, delta, causal, scale, 7, cg);
        static const int wants[] = {7, 5};
        for (size_t w = 0; w < sizeof wants / sizeof *wants; w++) {
          tgm_view ug[3];
          memset(gb.p, 0x5a, es * (size_t)nq);
          memset(m, 0, (size_t)nq);
          for (int o = 0; o < 3; o++)
            ug[o] = view_of(dt, wants[w] >> o & 1 ? gb.p : NULL, o * HD, 4, s4, pst);
          tgm_cpu_attention_backward(dt, &vq, &vk, &vv, &vdy, clse, delta, &ug[0], &ug[1], &ug[2], causal, scale);
          int ok = 1;
          for (int o = 0; o < 3; o++)
            if (wants[w] >> o & 1) {
              ok &= same_bits(dt, &ug[o], &cg[o]);
              mark(dt, gb.p, &ug[o], m);
            }
          check(ok && untouched(dt, gb.p, m, nq),
                fmt("%s: %s have the contiguous call's bits, the rest of the packed buffer untouched", what,
                    wants[w] == 7 ? "dq, dk, dv" : "dq, dv (dk not wanted)"));
        }
        if (noscratch) { /* the no-scratch backward */
          T ng[3];
          tgm_view wg[3];
          memset(gb.p, 0x5a, es * (size_t)nq);
          memset(m, 0, (size_t)nq);
          for (int o = 0; o < 3; o++) {
            ng[o] = mk(dt, 4, s4);
            wg[o] = tview(&ng[o]);
            mark(dt, gb.p, &vg[o], m);
          }
          Att ab = att_init(dt, &vq, &vk, &vv, &vdy, &vg[0], &vg[1], &vg[2], causal, scale);
          Att cb = att_init(dt, &wq, &wk, &wv, &wdy, &wg[0], &wg[1], &wg[2], causal, scale);
          for (int64_t t = 0; t < B * H; t++) {
            att_bwd_noscratch(&ab, clse, delta, t);
            att_bwd_noscratch(&cb, clse, delta, t);
          }
          int ok = untouched(dt, gb.p, m, nq);
          for (int o = 0; o < 3; o++) {
            ok &= same_bits(dt, &vg[o], &ng[o]);
            tfree(&ng[o]);
          }
          check(ok, fmt("%s: no scratch, dq, dk, dv have the contiguous path's bits, the pads untouched", what));
        }
        for (int o = 0; o < 3; o++)
          tfree(&cg[o]);
        free(lse);
        free(clse);
        free(delta);
        free(m);
        T *ts[] = {&qkv, &dyb, &yb, &gb, &cq, &ck, &cv, &cdy, &cy};
        for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
          tfree(ts[i]);
      }
  /* no keys (y = 0, lse = -inf; dq = 0) and no queries (dk = dv = 0) */
  for (int d = 0; d < 3; d++) {
    const int dt = dts[d];
    const int64_t B = 2, H = 2, Tt = 5, D = 8, HD = H * D, rw = 3 * HD + 3, yw = HD + 3, nq = B * Tt * rw;
    const int64_t ny = B * Tt * yw, s4[4] = {B, H, Tt, D}, s0[4] = {B, H, 0, D}, pst[4] = {Tt * rw, D, rw, 1};
    const int64_t yst[4] = {Tt * yw, D, yw, 1};
    const size_t es = esize(dt);
    T qkv = rnd(dt, 1, &nq, -1, 1), dyb = rnd(dt, 1, &ny, -1, 1), yb = mk(dt, 1, &ny), gb = mk(dt, 1, &nq);
    float lse[2 * 2 * 5], delta[2 * 2 * 5]; /* B H Tt */
    unsigned char *m = calloc((size_t)nq, 1);
    tgm_view vq = view_of(dt, qkv.p, 0, 4, s4, pst), vk = view_of(dt, qkv.p, HD, 4, s4, pst);
    tgm_view vv = view_of(dt, qkv.p, 2 * HD, 4, s4, pst), vq0 = view_of(dt, qkv.p, 0, 4, s0, pst);
    tgm_view vk0 = view_of(dt, qkv.p, HD, 4, s0, pst), vv0 = view_of(dt, qkv.p, 2 * HD, 4, s0, pst);
    tgm_view vy = view_of(dt, yb.p, 0, 4, s4, yst), vdy = view_of(dt, dyb.p, 0, 4, s4, yst);
    tgm_view vdy0 = view_of(dt, dyb.p, 0, 4, s0, yst), vg[3], vg0[3];
    for (int o = 0; o < 3; o++) {
      vg[o] = view_of(dt, gb.p, o * HD, 4, s4, pst);
      vg0[o] = view_of(dt, gb.p, o * HD, 4, s0, pst);
    }
    memset(yb.p, 0x5a, es * (size_t)ny);
    tgm_cpu_attention(dt, &vq, &vk0, &vv0, &vy, 0, 0.5, lse);
    mark(dt, yb.p, &vy, m);
    int ok = same_bits(dt, &vy, NULL) && untouched(dt, yb.p, m, ny);
    for (int64_t i = 0; i < B * H * Tt; i++) {
      ok &= isinf(lse[i]) && lse[i] < 0;
      delta[i] = 0;
    }
    check(ok, fmt("attention on views %s, no keys: y = 0 through its view, its pads untouched, lse = -inf", dtn[dt]));
    memset(gb.p, 0x5a, es * (size_t)nq);
    memset(m, 0, (size_t)nq);
    tgm_cpu_attention_backward(dt, &vq, &vk0, &vv0, &vdy, lse, delta, &vg[0], &vg0[1], &vg0[2], 0, 0.5);
    mark(dt, gb.p, &vg[0], m);
    check(same_bits(dt, &vg[0], NULL) && untouched(dt, gb.p, m, nq),
          fmt("attention_backward on views %s, no keys: dq = 0 through its view, the rest untouched", dtn[dt]));
    memset(gb.p, 0x5a, es * (size_t)nq);
    memset(m, 0, (size_t)nq);
    tgm_cpu_attention_backward(dt, &vq0, &vk, &vv, &vdy0, lse, delta, &vg0[0], &vg[1], &vg[2], 1, 0.5);
    mark(dt, gb.p, &vg[1], m);
    mark(dt, gb.p, &vg[2], m);
    check(same_bits(dt, &vg[1], NULL) && same_bits(dt, &vg[2], NULL) && untouched(dt, gb.p, m, nq),
          fmt("attention_backward on views %s, no queries: dk = dv = 0 through their views, the rest untouched",
              dtn[dt]));
    free(m);
    tfree(&qkv);
    tfree(&dyb);
    tfree(&yb);
    tfree(&gb);
  }
}

/* ---------------------------------------------------------------- tgm_cpu_gemm */

static const char *const actn[] = {"none", "relu", "gelu", "gelu_tanh"};

static double ref_act(int act, double x) {
  switch (act) {
  case TGM_ACT_RELU: return x < 0 ? 0 : x;
  case TGM_ACT_GELU: return 0.5 * x * (1 + erf(x / sqrt(2.0)));
  case TGM_ACT_GELU_TANH: return 0.5 * x * (1 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
  default: return x;
  }
}

/* act'(x) for the gelu forms (tgm_gemm's dact). */
static double ref_act_grad(int act, double x) {
  if (act == TGM_ACT_GELU_TANH) {
    double t = tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.79788456080286535588 * (1 + 3 * 0.044715 * x * x);
  }
  return 0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) * 0.39894228040143267794;
}

/* One gemm case: shapes, storage (pad: extra elements per row of A, B, C;
 * gap: extra elements between batch elements; bc: 1 A broadcast over the
 * batch, 2 B), the epilogue, and how it runs (inplace: the residual is C
 * itself; direct: gemm_direct, the no-scratch path, instead of the entry
 * point; dact: aux is read, act's gradient at it multiplies the product;
 * bgrad: the sum over k of op(A) is stored too). */
typedef struct GemmCase {
  int dt, ta, tb;
  int64_t M, N, K, batch, pad, gap;
  int bc, bias, act, aux, res, acc, inplace, direct, dact, bgrad;
} GemmCase;

static const char *gemm_label(const GemmCase *c) {
  return fmt("gemm %s ta=%d tb=%d M=%lld N=%lld K=%lld batch=%lld pad=%lld bc=%d bias=%d act=%s aux=%d res=%d%s "
             "acc=%d%s%s%s",
             dtn[c->dt], c->ta, c->tb, (long long)c->M, (long long)c->N, (long long)c->K, (long long)c->batch,
             (long long)c->pad, c->bc, c->bias, actn[c->act], c->aux, c->res, c->inplace ? "(=C)" : "", c->acc,
             c->direct ? " direct" : "", c->dact ? " dact" : "", c->bgrad ? " bgrad" : "");
}

/* A buffer of `nb` matrices of rows x cols with row stride ld and batch
 * stride st: the matrix entries uniform in [-1, 1), everything else `fill`. */
static T gemm_buf(int dt, int64_t nb, int64_t rows, int64_t cols, int64_t ld, int64_t st, double fill) {
  int64_t n = nb > 0 ? (nb - 1) * st + rows * ld : 0;
  T t = mk(dt, 1, &n);
  for (int64_t i = 0; i < n; i++)
    setv(&t, i, fill);
  for (int64_t b = 0; b < nb; b++)
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++)
        setv(&t, b * st + r * ld + c, runif(-1, 1));
  return t;
}

/* The n results in p against ref, element i within tol[i] (0: exactly;
 * NaN must meet NaN). */
static void expect_tol(const char *what, int dt, const void *p, const double *ref, const double *tol, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    double g = getv(dt, p, i), w = ref[i];
    int ok = isnan(w) ? isnan(g) : tol[i] == 0 ? g == w : fabs(g - w) <= tol[i];
    if (!ok && bad++ < 4)
      printf("  %s: element %lld: got %.9g, want %.9g (tolerance %.3g)\n", what, (long long)i, g, w, tol[i]);
  }
  if (bad)
    printf("  %s: %lld of %lld elements wrong (%s)\n", what, (long long)bad, (long long)n, dtn[dt]);
  check(bad == 0, what);
}

/* Runs one case and checks C and aux against the double reference, their
 * padding (and aux when not asked for) left alone. Tolerance of an output:
 * rtol (|ref| + scale), scale being the size of what was summed into it (the
 * 2-norm of the K products, plus |bias|, |residual|, |old C|): f32 sums of
 * hundreds of terms are accurate to that, not to |ref| when they cancel.
 * rtol: f32 1e-5, bf16 2e-2, f16 2e-3 (plus half an f16 subnormal quantum).
 * Returns C's buffer (for the determinism check; the caller frees it). */
static T gemm_case(const GemmCase *c) {
  const int dt = c->dt;
  const int64_t M = c->M, N = c->N, K = c->K, B = c->batch;
  const int64_t ar = c->ta ? K : M, ac = c->ta ? M : K, br = c->tb ? N : K, bcl = c->tb ? K : N;
  const int64_t lda = ac + c->pad, ldb = bcl + c->pad, ldc = N + c->pad;
  const int64_t sa = c->bc == 1 ? 0 : ar * lda + c->gap, sb = c->bc == 2 ? 0 : br * ldb + c->gap,
                sc = M * ldc + c->gap;
  T a = gemm_buf(dt, c->bc == 1 ? 1 : B, ar, ac, lda, sa, NAN);
  T b = gemm_buf(dt, c->bc == 2 ? 1 : B, br, bcl, ldb, sb, NAN);
  T bias = gemm_buf(dt, 1, 1, N, N, 0, NAN);
  /* C: the old values when accumulating or when it is the residual, else NaN
   * (must not be read); padding 7 (must stay) */
  T y = gemm_buf(dt, B, M, N, ldc, sc, 7.0);
  T aux = gemm_buf(dt, B, M, N, ldc, sc, 7.0);
  T res = gemm_buf(dt, B, M, N, ldc, sc, NAN);
  if (!c->acc && !c->inplace)
    for (int64_t bb = 0; bb < B; bb++)
      for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++)
          setv(&y, bb * sc + m * ldc + n, NAN);
  for (int64_t i = 0; i < aux.n && !c->dact; i++) /* (dact: aux is the activation's input, read) */
    if (aux.v[i] != 7.0)
      setv(&aux, i, NAN);
  T bg = gemm_buf(dt, 1, 1, M + 2, M + 2, 0, NAN); /* the bias gradient, two elements past it (must stay) */
  setv(&bg, M, 7.0);
  setv(&bg, M + 1, 7.0);
  double *bref = calloc((size_t)M + 3, sizeof(double)), *btol = calloc((size_t)M + 3, sizeof(double));
  bref[M] = bref[M + 1] = 7.0;
  size_t nbytes = sizeof(double) * (size_t)(y.n ? y.n : 1);
  double *ref = malloc(nbytes), *aref = malloc(nbytes), *tol = calloc(1, nbytes), *atol = calloc(1, nbytes);
  memcpy(ref, y.v, sizeof(double) * (size_t)y.n);
  memcpy(aref, aux.v, sizeof(double) * (size_t)aux.n);
  const double *rv = c->inplace ? y.v : res.v;
  const double rtol = dt == TGM_F32 ? 1e-5 : tol_of(dt), sub = dt == TGM_F16 ? 0x1p-25 : 0;
  for (int64_t bb = 0; bb < B; bb++)
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) {
        double s = 0, s2 = 0;
        for (int64_t k = 0; k < K; k++) {
          double p = a.v[bb * sa + (c->ta ? k * lda + m : m * lda + k)] *
                     b.v[bb * sb + (c->tb ? n * ldb + k : k * ldb + n)];
          s += p;
          s2 += p * p;
        }
        int64_t o = bb * sc + m * ldc + n;
        double scale = sqrt(s2);
        if (c->bias) {
          s += bias.v[n];
          scale += fabs(bias.v[n]);
        }
        if (c->dact) { /* aux stays; the product times act'(aux), whose two terms (each below 1.25) may cancel */
          double d = ref_act_grad(c->act, aux.v[o]);
          scale = scale * fabs(d) + fabs(s) * 1.25;
          s *= d;
        } else {
          if (c->aux) {
            aref[o] = s;
            atol[o] = rtol * (fabs(s) + scale) + sub;
          }
          s = ref_act(c->act, s);
        }
        if (c->res) {
          s += rv[o];
          scale += fabs(rv[o]);
        }
        if (c->acc) {
          s += y.v[o];
          scale += fabs(y.v[o]);
        }
        ref[o] = s;
        tol[o] = rtol * (fabs(s) + scale) + sub;
      }
  for (int64_t m = 0; m < M && c->bgrad; m++) { /* sum over k of op(A)[m, k] */
    double s = 0, s2 = 0;
    for (int64_t k = 0; k < K; k++) {
      double v = a.v[c->ta ? k * lda + m : m * lda + k];
      s += v;
      s2 += v * v;
    }
    bref[m] = s;
    btol[m] = rtol * (fabs(s) + sqrt(s2)) + sub;
  }
  tgm_gemm g = {.dt = dt, .ta = c->ta, .tb = c->tb, .M = M, .N = N, .K = K, .batch = B,
                .A = a.p, .lda = lda, .sa = sa, .B = b.p, .ldb = ldb, .sb = sb, .C = y.p, .ldc = ldc, .sc = sc,
                .bias = c->bias ? bias.p : NULL, .act = c->act, .aux = c->aux || c->dact ? aux.p : NULL,
                .residual = c->res ? (c->inplace ? y.p : res.p) : NULL, .accumulate = c->acc, .dact = c->dact,
                .bgrad = c->bgrad ? bg.p : NULL};
  int rc = 0;
  if (c->direct) {
    for (int64_t bb = 0; bb < B; bb++) {
      GemmOne o = gemm_one(&g, bb);
      gemm_direct(&g, &o, 1);
    }
  } else {
    rc = tgm_cpu_gemm(&g);
  }
  const char *what = gemm_label(c);
  check(rc == 0, fmt("%s: returns %d", what, rc));
  expect_tol(what, dt, y.p, ref, tol, y.n);
  expect_tol(fmt("%s: aux", what), dt, aux.p, aref, atol, aux.n);
  if (c->bgrad)
    expect_tol(fmt("%s: bgrad", what), dt, bg.p, bref, btol, M + 2);
  free(bref);
  free(btol);
  tfree(&bg);
  free(ref);
  free(aref);
  free(tol);
  free(atol);
  tfree(&a);
  tfree(&b);
  tfree(&bias);
  tfree(&aux);
  tfree(&res);
  return y;
}

/* Whether f32 GEMMs go through the CBLAS now (its bits may depend on its
 * threads). */
static int gemm_via_blas(void) {
#ifdef TGM_HAVE_CBLAS
  return !gemm_no_blas;
#else
  return 0;
#endif
}

static void test_gemm(void) {
  static const int dts[] = {TGM_F32, TGM_BF16, TGM_F16};
  static const int64_t sz[] = {1, 7, 33, 130};
  int rot = 0;
  /* every shape from {1, 7, 33, 130}^3, every transpose pair, every dtype;
   * the 64 epilogues (bias x act x aux x residual x accumulate) taken in turn,
   * with and without padded leading dimensions, the residual sometimes C */
  for (int d = 0; d < 3; d++)
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 4; j++)
        for (int k = 0; k < 4; k++)
          for (int t = 0; t < 4; t++, rot++) {
            int e = rot % 64;
            GemmCase c = {dts[d], t & 1, t >> 1, sz[i], sz[j], sz[k], 1, rot % 3 ? 3 : 0, 0, 0,
                          e & 1, (e >> 1) & 3, (e >> 3) & 1, (e >> 4) & 1, (e >> 5) & 1, 0, 0, 0, 0};
            c.inplace = c.res && !c.acc && rot % 5 == 0;
            T y = gemm_case(&c);
            tfree(&y);
          }
  /* batches: broadcast A or B (stride 0), gaps between batch elements,
   * sizes that take several K slices, row blocks and column panels, many
   * small GEMMs (split by batch element), and the no-scratch path */
  static const int64_t bs[][4] = {{7, 33, 130, 3}, {33, 7, 33, 4},    {130, 33, 7, 2},  {200, 150, 300, 2},
                                  {7, 3100, 9, 1}, {8, 8, 8, 40},     {300, 70, 520, 1}, {1, 257, 600, 3}};
  for (int d = 0; d < 3; d++)
    for (size_t k = 0; k < sizeof bs / sizeof *bs; k++)
      for (int bc = 0; bc < 3; bc++, rot++) {
        int e = (rot * 7) % 64;
        GemmCase c = {dts[d], rot & 1, (rot >> 1) & 1, bs[k][0], bs[k][1], bs[k][2], bs[k][3], 2, 5, bc,
                      e & 1, (e >> 1) & 3, (e >> 3) & 1, (e >> 4) & 1, (e >> 5) & 1, 0, 0, 0, 0};
        T y = gemm_case(&c);
        tfree(&y);
        if (bc == 0 && bs[k][0] * bs[k][1] * bs[k][2] > 32768 && bs[k][0] * bs[k][1] * bs[k][2] < 2000000) {
          c.direct = 1;
          y = gemm_case(&c);
          tfree(&y);
        }
      }
  /* a batch that is one GEMM of batch x M rows (B shared, A's and C's rows running on: gap 0, A not
   * transposed; tgm_gemm_folded), with every epilogue in turn, padded rows or not; and the same with a
   * gap (not folded) */
  for (int d = 0; d < 3; d++)
    for (int e = 0; e < 64; e += 9, rot++) {
      GemmCase c = {dts[d], 0, rot & 1, 64, 96, 130, 5, rot % 2 ? 3 : 0, 0, 2, e & 1, (e >> 1) & 3, (e >> 3) & 1,
                    (e >> 4) & 1, (e >> 5) & 1, 0, 0, 0, 0};
      T y = gemm_case(&c);
      tfree(&y);
      c.gap = 4;
      y = gemm_case(&c);
      tfree(&y);
    }
  /* an activation's backward at aux (dact: gelu forms), and the sum over k
   * of op(A) (bgrad, one batch), with either transpose, bias and residual
   * in turn */
  static const int64_t ds[][3] = {{7, 33, 130}, {130, 7, 33}, {33, 130, 7}, {1, 9, 300}};
  for (int d = 0; d < 3; d++)
    for (size_t k = 0; k < sizeof ds / sizeof *ds; k++)
      for (int t = 0; t < 4; t++, rot++) {
        GemmCase c = {dts[d], t & 1, t >> 1, ds[k][0], ds[k][1], ds[k][2], 1, rot % 2 ? 3 : 0, 0, 0,
                      0, t & 2 ? TGM_ACT_GELU_TANH : TGM_ACT_GELU, 0, rot % 3 == 0, 0, 0, 0, 1, 0};
        T y = gemm_case(&c);
        tfree(&y);
        GemmCase b = {dts[d], t & 1, t >> 1, ds[k][0], ds[k][1], ds[k][2], 1, rot % 2 ? 3 : 0, 0, 0,
                      rot % 3 == 1, 0, 0, 0, 0, 0, 0, 0, 1};
        y = gemm_case(&b);
        tfree(&y);
      }
  /* edge cases: K = 0 (the epilogue on zeros; A and B may be NULL), M = 0,
   * N = 0, batch = 0 (nothing written) */
  for (int d = 0; d < 3; d++) {
    GemmCase c0 = {dts[d], 0, 1, 7, 33, 0, 2, 1, 0, 0, 1, TGM_ACT_GELU, 1, 1, 1, 0, 0, 0, 0};
    T y = gemm_case(&c0);
    tfree(&y);
    static const int64_t z[][4] = {{0, 5, 3, 1}, {5, 0, 3, 1}, {0, 0, 0, 1}, {3, 4, 5, 0}};
    for (int k = 0; k < 4; k++) {
      GemmCase c = {dts[d], 1, 0, z[k][0], z[k][1], z[k][2], z[k][3], 1, 0, 0, 1, TGM_ACT_RELU, 1, 1, 1, 0, 0, 0, 0};
      y = gemm_case(&c);
      tfree(&y);
    }
  }
  {
    float c1[4] = {1, 2, 3, 4};
    tgm_gemm g = {.dt = TGM_F32, .M = 2, .N = 2, .K = 0, .batch = 1, .ldb = 2, .C = c1, .ldc = 2, .accumulate = 1};
    check(tgm_cpu_gemm(&g) == 0 && c1[0] == 1 && c1[3] == 4, "gemm K=0 accumulate, A and B NULL: C unchanged");
  }
  /* bad arguments: -1, nothing written */
  {
    float a[16] = {0}, b[16] = {0}, c[16];
    const tgm_gemm ok = {.dt = TGM_F32, .M = 2, .N = 2, .K = 2, .batch = 2, .A = a, .lda = 2, .sa = 4,
                         .B = b, .ldb = 2, .sb = 4, .C = c, .ldc = 2, .sc = 4};
    tgm_gemm bad[10];
    for (int k = 0; k < 10; k++)
      bad[k] = ok;
    bad[0].dt = TGM_I32;
    bad[1].ta = 2;
    bad[2].lda = 1;
    bad[3].ldc = 1;
    bad[4].act = 4;
    bad[5].sc = 0;
    bad[6].C = NULL;
    bad[7].B = NULL;
    bad[8].K = -1;
    bad[9].sa = -4;
    for (int k = 0; k < 10; k++) {
      for (int i = 0; i < 16; i++)
        c[i] = 7;
      int rc = tgm_cpu_gemm(&bad[k]);
      int untouched = 1;
      for (int i = 0; i < 16; i++)
        untouched &= c[i] == 7;
      check(rc == -1 && untouched, fmt("gemm refuses bad arguments (case %d): rc %d", k, rc));
    }
    check(tgm_cpu_gemm(NULL) == -1, "gemm refuses NULL");
    tgm_gemm g = ok;
    check(tgm_cpu_gemm(&g) == 0, "gemm accepts the well-formed call");
  }
#ifdef _OPENMP
  /* the same bits at 1 and 3 threads (the built-in GEMM; the last case, 32
   * rows of f32 by a transposed B, runs as dot tiles, nothing packed) */
  if (omp_get_max_threads() != 1)
    for (int d = 0; d < 4; d++) {
      if (d < 3 && dts[d] == TGM_F32 && gemm_via_blas())
        continue;
      GemmCase c = {dts[d % 3], 1, 1, 200, 150, 300, 2, 1, 0, 0, 1, TGM_ACT_GELU, 1, 1, 0, 0, 0, 0, 0};
      if (d == 3)
        c = (GemmCase){TGM_F32, 0, 1, 32, 150, 300, 2, 1, 0, 0, 1, TGM_ACT_GELU, 1, 1, 0, 0, 0, 0, 0};
      uint64_t seed = rng;
      T y1 = gemm_case(&c);
      int saved = omp_get_max_threads();
      omp_set_num_threads(1);
      rng = seed;
      T y2 = gemm_case(&c);
      omp_set_num_threads(saved);
      check(y1.n == y2.n && memcmp(y1.p, y2.p, esize(c.dt) * (size_t)y1.n) == 0,
            fmt("gemm %s %lldx%lldx%lld: the same bits at %d threads and 1", dtn[c.dt], (long long)c.M, (long long)c.N,
                (long long)c.K, saved));
      tfree(&y1);
      tfree(&y2);
    }
#ifdef ISA_DISPATCH
  /* dot tiles (a few rows of f32, B transposed): the AVX-512 tile (4 x 4, its
   * 16 sums' trees in whole vectors) and the AVX2 one (2 x 2, a sum at a
   * time) give the same bits, K past a whole 16 lanes included */
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    static const int64_t dk[][3] = {{32, 150, 300}, {7, 64, 512}, {61, 9, 17}};
    for (size_t k = 0; k < sizeof dk / sizeof *dk; k++) {
      GemmCase c = {TGM_F32, 0, 1, dk[k][0], dk[k][1], dk[k][2], 1, 1, 0, 0, 1, TGM_ACT_GELU, 0, k == 1, 0, 0, 0, 0, 0};
      T y[2];
      for (int v = 0; v < 2; v++) {
        uint64_t seed = rng;
        gemm_isa = 2 - v;
        y[v] = gemm_case(&c);
        rng = seed;
      }
      gemm_isa = -1;
      check(y[0].n == y[1].n && memcmp(y[0].p, y[1].p, sizeof(float) * (size_t)y[0].n) == 0,
            fmt("%s: dot tiles, AVX-512 and AVX2 give the same bits", gemm_label(&c)));
      tfree(&y[0]);
      tfree(&y[1]);
    }
  }
#endif
  /* one GEMM cut into a piece per thread (gemm_pieces): every grid the thread
   * counts give, against 1 thread and against the threads sharing one
   * blocking (gemm_shared); f32 with A read in place (its last row panel
   * short), A transposed, bf16; K in two slices; accumulating, a residual;
   * A transposed and K in two slices with pieces of more rows than GEMM_MC
   * (each one row block, its packed A and sums whole) */
  if (omp_get_max_threads() != 1) {
    static const GemmCase pcs[] = {
        {TGM_F32, 0, 1, 203, 150, GEMM_KC + 44, 1, 1, 0, 0, 1, TGM_ACT_GELU, 1, 1, 0, 0, 0, 0, 0},
        {TGM_F32, 1, 0, 130, 333, 70, 1, 0, 0, 0, 0, TGM_ACT_NONE, 0, 0, 1, 0, 0, 0, 0},
        {TGM_BF16, 0, 0, 96, 64, GEMM_KC + 34, 1, 2, 0, 0, 1, TGM_ACT_RELU, 0, 1, 0, 0, 0, 0, 0},
        {TGM_F32, 1, 0, GEMM_MC + 109, 72, GEMM_KC + 20, 1, 0, 0, 0, 0, TGM_ACT_NONE, 0, 0, 1, 0, 0, 0, 0},
    };
    int saved = omp_get_max_threads(), via = gemm_via_blas();
#ifdef TGM_HAVE_CBLAS
    gemm_no_blas = 1;
#endif
    for (size_t k = 0; k < sizeof pcs / sizeof *pcs; k++) {
      static const int nts[] = {1, 2, 3, 5, 8, 16};
      T ref = {0};
      for (int s = -1; s < (int)(sizeof nts / sizeof *nts); s++) {
        omp_set_num_threads(s < 0 ? 4 : nts[s]);
        gemm_shared = s < 0;
        uint64_t seed = rng;
        T y = gemm_case(&pcs[k]);
        rng = seed;
        if (s < 0) {
          ref = y;
          continue;
        }
        check(y.n == ref.n && memcmp(y.p, ref.p, esize(pcs[k].dt) * (size_t)y.n) == 0,
              fmt("%s: in pieces at %d threads, the same bits as one shared blocking", gemm_label(&pcs[k]), nts[s]));
        tfree(&y);
      }
      /* runs of one row block each (gemm_tiled packs B's K slice once a run), on one thread and shared by 4 */
      for (int s = 0; s < 2; s++) {
        omp_set_num_threads(s ? 4 : 1);
        gemm_shared = s;
        gemm_run_max = 1;
        uint64_t seed = rng;
        T y = gemm_case(&pcs[k]);
        rng = seed;
        gemm_run_max = GEMM_RUN_MAX;
        check(y.n == ref.n && memcmp(y.p, ref.p, esize(pcs[k].dt) * (size_t)y.n) == 0,
              fmt("%s: runs of one row block at %d threads, the same bits", gemm_label(&pcs[k]), s ? 4 : 1));
        tfree(&y);
      }
      gemm_shared = 0;
      /* a team smaller than the pieces (OpenMP's dynamic threads give at most the cores: each thread
       * runs several pieces) */
      omp_set_dynamic(1);
      omp_set_num_threads(64);
      uint64_t seed = rng;
      T y = gemm_case(&pcs[k]);
      rng = seed;
      omp_set_dynamic(0);
      check(y.n == ref.n && memcmp(y.p, ref.p, esize(pcs[k].dt) * (size_t)y.n) == 0,
            fmt("%s: 64 pieces on a dynamic team, the same bits", gemm_label(&pcs[k])));
      tfree(&y);
      gemm_shared = 0;
      /* several pieces a thread, taken in turn from the shared counter (gemm_per_thread; forced here,
       * the pieces being small), on full teams and on a dynamic one */
      for (int s = 0; s < 4; s++) {
        static const int per[] = {3, 7, 2, 5}, nt[] = {2, 5, 16, 64};
        omp_set_dynamic(nt[s] == 64);
        omp_set_num_threads(nt[s]);
        gemm_over = per[s];
        seed = rng;
        y = gemm_case(&pcs[k]);
        rng = seed;
        gemm_over = 0;
        omp_set_dynamic(0);
        check(y.n == ref.n && memcmp(y.p, ref.p, esize(pcs[k].dt) * (size_t)y.n) == 0,
              fmt("%s: %d pieces a thread at %d threads%s, the same bits", gemm_label(&pcs[k]), per[s], nt[s],
                  nt[s] == 64 ? " (a dynamic team)" : ""));
        tfree(&y);
      }
      rng += 1;
      tfree(&ref);
    }
    /* the pieces per thread chosen: one under 4 threads or for small pieces; six with A read in
     * place, four with A packed from 8 threads; and a GEMM large enough for them (512 x 520 x 520 at
     * 8 threads: four a thread with A in place, GEMM_PIECE_MIN capping the six) against 1 thread */
    {
      GemmPlan in_place = {0}, packed = {0};
      in_place.a_rows = 1;
      const double big = 1e10;
      check(gemm_per_thread(&in_place, 2, big) == 1 && gemm_per_thread(&in_place, 4, big) == 6 &&
                gemm_per_thread(&in_place, 16, big) == 6 && gemm_per_thread(&packed, 4, big) == 1 &&
                gemm_per_thread(&packed, 8, big) == 4 && gemm_per_thread(&packed, 16, big) == 4 &&
                gemm_per_thread(&in_place, 16, GEMM_PIECE_MIN * 16 * 2.5) == 2 &&
                gemm_per_thread(&in_place, 16, GEMM_PIECE_MIN * 16 - 1) == 1,
            "gemm_per_thread: the pieces a thread by threads, A's packing and size");
      const GemmCase big_case = {TGM_F32, 0, 1, 512, 520, 520, 1, 1, 0, 0, 0, TGM_ACT_NONE, 0, 0, 0, 0, 0, 0, 0};
      T one = {0};
      for (int s = 0; s < 2; s++) {
        omp_set_num_threads(s ? 8 : 1);
        uint64_t seed = rng;
        T y = gemm_case(&big_case);
        rng = seed;
        if (!s)
          one = y;
        else {
          check(y.n == one.n && memcmp(y.p, one.p, sizeof(float) * (size_t)y.n) == 0,
                fmt("%s: four pieces a thread at 8 threads, the same bits as 1 thread", gemm_label(&big_case)));
          tfree(&y);
        }
      }
      tfree(&one);
    }
#ifdef TGM_HAVE_CBLAS
    gemm_no_blas = !via;
#else
    (void)via;
#endif
    omp_set_num_threads(saved);
  }
#endif
}

/* ---------------------------------------------------------------- driver */

static void run_all(void) {
  test_cast();
  test_embedding();
  test_embedding_backward();
  test_dropout();
}

/* bf16/f16 GEMMs with an activation and a residual (or accumulation) give
 * the bits of the ops one by one, each rounded to the dtype as the model's
 * ops are: y = x w^T + b (a GEMM that stores), then act(y), then + r (tgm_rt.h),
 * so that a kernel that recomputes act(y) from the stored y compares equal
 * to the fused result's parts (a mask x == amax(x) needs the same bits). */
static void test_gemm_rounding(void) {
  const int dts[2] = {TGM_BF16, TGM_F16};
  const int acts[3] = {TGM_ACT_RELU, TGM_ACT_GELU, TGM_ACT_GELU_TANH};
  for (int d = 0; d < 2; d++)
    for (int ai = 0; ai < 3; ai++)
      for (int acc = 0; acc < 2; acc++) {
        const int dt = dts[d], act = acts[ai];
        const int64_t M = 37, N = 40, K = 300; /* large enough to pack and tile */
        T a = gemm_buf(dt, 1, M, K, K, 0, 0), w = gemm_buf(dt, 1, N, K, K, 0, 0), b = gemm_buf(dt, 1, 1, N, N, 0, 0);
        T r = gemm_buf(dt, 1, M, N, N, 0, 0), y = gemm_buf(dt, 1, M, N, N, 0, 0), f = gemm_buf(dt, 1, M, N, N, 0, 0);
        if (acc)
          memcpy(f.p, r.p, (size_t)(M * N) * 2);
        tgm_gemm g = {.dt = dt, .tb = 1, .M = M, .N = N, .K = K, .batch = 1, .A = a.p, .lda = K, .B = w.p, .ldb = K,
                      .C = y.p, .ldc = N, .bias = b.p};
        int rc = tgm_cpu_gemm(&g); /* y = x w^T + b, stored */
        g.C = f.p, g.act = act, g.residual = acc ? NULL : r.p, g.accumulate = acc;
        rc |= tgm_cpu_gemm(&g); /* f = act(x w^T + b) + r, fused */
        int64_t bad = 0;
        for (int64_t i = 0; i < M * N; i++) {
          float yv = dt == TGM_BF16 ? tgm_bf16_to_f32(((uint16_t *)y.p)[i]) : tgm_f16_to_f32(((uint16_t *)y.p)[i]);
          float av = act == TGM_ACT_RELU ? (yv < 0 ? 0.0f : yv) : tgm_gelu(yv, act == TGM_ACT_GELU_TANH);
          float rv = dt == TGM_BF16 ? tgm_bf16_to_f32(((uint16_t *)r.p)[i]) : tgm_f16_to_f32(((uint16_t *)r.p)[i]);
          uint16_t want =
              dt == TGM_BF16 ? tgm_store_bf16(tgm_round_bf16(av) + rv) : tgm_store_f16(tgm_round_f16(av) + rv);
          bad += ((uint16_t *)f.p)[i] != want;
        }
        check(!rc && bad == 0, fmt("gemm %s act %d %s: the bits of the ops one by one (%lld of %lld differ)",
                                   dt == TGM_BF16 ? "bf16" : "f16", act, acc ? "accumulating" : "+ residual",
                                   (long long)bad, (long long)(M * N)));
        tfree(&a), tfree(&w), tfree(&b), tfree(&r), tfree(&y), tfree(&f);
      }
}

static void run_gemm(void) {
  test_gemm_rounding();
  test_gemm_direct();
  test_chunks();
  test_gemm_grid();
  test_matmul();
  test_linear();
  test_attention();
  test_attention_backward();
  test_attention_views();
  test_gemm();
}

#ifdef TGM_HAVE_CBLAS
/* -DTGM_BLAS=AUTO's rule (gemm_blas_auto): with OpenBLAS the large GEMMs
 * stay built in where the built-in AVX-512 kernel runs; then a GEMM gives
 * the built-in's bits. */
static void test_blas_width_rule(void) {
  snprintf(ctx, sizeof ctx, "CBLAS chosen by AUTO");
  const char *core = openblas_get_corename ? openblas_get_corename() : NULL;
  gemm_blas_auto = 1;
  for (int isa = 2; isa >= 1; isa--) { /* the AVX-512 kernel, then (rule off) the AVX2 one */
    gemm_isa = isa;
    Ukernel uk = pick_ukernel();
    int expect = core && !strcmp(uk.name, "avx512");
    check(cblas_slower() == expect, fmt("OpenBLAS core %s, built-in kernel %s: the large GEMMs %s", core ? core : "(none)",
                                        uk.name, expect ? "stay built in" : "go to the CBLAS"));
    const GemmCase c = {TGM_F32, 0, 1, 203, 150, 300, 1, 0, 0, 0, 1, TGM_ACT_GELU, 1, 0, 0, 0, 0, 0, 0};
    uint64_t seed = rng;
    T y1 = gemm_case(&c);
    rng = seed;
    gemm_no_blas = 1;
    T y2 = gemm_case(&c);
    gemm_no_blas = 0;
    if (expect)
      check(y1.n == y2.n && memcmp(y1.p, y2.p, sizeof(float) * (size_t)y1.n) == 0,
            fmt("%s: kept built in by the rule, the built-in GEMM's bits", gemm_label(&c)));
    tfree(&y1);
    tfree(&y2);
  }
  gemm_isa = -1;
  gemm_blas_auto = 0;
}
#endif

int main(void) {
#ifdef _OPENMP
  const int nthr[3] = {1, omp_get_max_threads(), 3};
  int ntc = 3;
#else
  const int nthr[1] = {1};
  int ntc = 1;
#endif
  for (int t = 0; t < ntc; t++) {
#ifdef _OPENMP
    omp_set_num_threads(nthr[t]);
#endif
    snprintf(ctx, sizeof ctx, "%d threads", nthr[t]);
    run_all();
    /* the GEMM-based kernels once per micro-kernel this CPU runs (at the
     * default thread count; else the best one), and through the CBLAS when
     * there is one */
    for (int isa = 2; isa >= 0; isa--) {
      if (t != 1 && isa != 2)
        break;
      gemm_isa = t != 1 ? -1 : isa;
      Ukernel uk = pick_ukernel();
      if (t == 1 && ((isa == 2 && strcmp(uk.name, "avx512")) || (isa == 1 && strcmp(uk.name, "avx2"))))
        continue;
#ifdef TGM_HAVE_CBLAS
      gemm_no_blas = 1;
#endif
      snprintf(ctx, sizeof ctx, "%d threads, built-in GEMM %s", nthr[t], uk.name);
      run_gemm();
    }
    gemm_isa = -1;
#ifdef TGM_HAVE_CBLAS
    gemm_no_blas = 0;
    snprintf(ctx, sizeof ctx, "%d threads, CBLAS", nthr[t]);
    run_gemm();
#endif
  }
#ifdef TGM_HAVE_CBLAS
  test_blas_width_rule();
#endif
  snprintf(ctx, sizeof ctx, "interpreter");
  test_dropout_interp();
  printf("%d passed, %d failed\n", npass, nfail);
  return nfail != 0;
}
