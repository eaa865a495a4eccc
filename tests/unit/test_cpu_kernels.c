/* test_cpu_kernels.c: every tgm_cpu_* kernel of templates/runtime/tgm_cpu.c
 * against a naive double-precision reference written here (obvious loops; the
 * semantics are gen/interp.c's, i.e. PyTorch's), for f32, bf16 and f16 (and
 * i32 and bool where the kernel takes them), on random data with odd sizes,
 * broadcasting shapes and sizes large enough to take the parallel paths.
 *
 * The template sources are included directly, so the static helpers (the
 * micro-kernels, the no-scratch fallbacks, the inline conversions) are tested
 * too. Every GEMM-based test runs once per micro-kernel this CPU can execute
 * and, when built with TGM_HAVE_CBLAS (test_cpu_kernels_cblas.c), once through
 * the CBLAS as well. With OpenMP the whole suite runs at 1, the default and 3
 * threads.
 *
 * Tolerances: |got - ref| <= rtol |ref| + atol with rtol f32 1e-5 (GEMM-based
 * 1e-4, layer/rms norm 4e-5), bf16 2e-2, f16 2e-3, and atol = rtol min(1,
 * mean |ref|) (unary ops: rtol, their values being O(1)) plus half an f16
 * subnormal quantum for f16; integer, bool, compare, max/min and
 * data-movement results must be exact, as must the dtype conversions (bit
 * for bit against tgm_init.c). embedding_backward and dropout are checked bit
 * for bit against f32 reference loops written here (the in-order sums; the
 * Philox mask and the f32 product), for the same bits at 1 and 2 threads, and
 * dropout's mask against gen/interp.c itself (tgen_load + interp_run in
 * training mode). Prints a line per failure and "N passed, M failed"; exits
 * nonzero on any failure. */
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

static double wrap32(double v) { return (double)(int32_t)(uint32_t)(uint64_t)(int64_t)v; }

/* ---------------------------------------------------------------- unary, cast */

static const char *const unames[] = {"neg", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid",
                                     "relu", "silu", "erf", "square", "reciprocal", "gelu", "gelu_tanh", "pow",
                                     "clamp", "copy"};

static double ref_unary(int op, double x, double a, double b) {
  switch (op) {
  case TGM_NEG: return -x;
  case TGM_ABS: return fabs(x);
  case TGM_EXP: return exp(x);
  case TGM_LOG: return log(x);
  case TGM_SQRT: return sqrt(x);
  case TGM_RSQRT: return 1.0 / sqrt(x);
  case TGM_SIN: return sin(x);
  case TGM_COS: return cos(x);
  case TGM_TANH: return tanh(x);
  case TGM_SIGMOID: return 1.0 / (1.0 + exp(-x));
  case TGM_RELU: return x < 0 ? 0.0 : x;
  case TGM_SILU: return x / (1.0 + exp(-x));
  case TGM_ERF: return erf(x);
  case TGM_SQUARE: return x * x;
  case TGM_RECIPROCAL: return 1.0 / x;
  case TGM_GELU: return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440));
  case TGM_GELU_TANH: return 0.5 * x * (1.0 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
  case TGM_POW: return pow(x, a);
  case TGM_CLAMP: return x < a ? a : x > b ? b : x;
  default: return x;
  }
}

/* The data range each op is tested on (inside every dtype's range). */
static void urange(int op, double *lo, double *hi) {
  *lo = -4;
  *hi = 4;
  if (op == TGM_LOG || op == TGM_SQRT || op == TGM_RSQRT) {
    *lo = 0.01;
    *hi = 10;
  }
  if (op == TGM_EXP) {
    *lo = -9;
    *hi = 9;
  }
  if (op == TGM_SIN || op == TGM_COS) { /* away from zeros of sin/cos: relative error there is meaningless */
    *lo = 0.1;
    *hi = 1.4;
  }
  if (op == TGM_TANH || op == TGM_SIGMOID || op == TGM_SILU || op == TGM_GELU || op == TGM_GELU_TANH) {
    *lo = -12;
    *hi = 12;
  }
}

static void test_unary(void) {
  static const int64_t sizes[] = {1, 3, 17, 33, 130, 5000, 70001};
  static const int dts[] = {TGM_F32, TGM_BF16, TGM_F16};
  for (int op = TGM_NEG; op <= TGM_COPY; op++)
    for (int d = 0; d < 3; d++)
      for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        int dt = dts[d];
        int64_t n = sizes[si];
        double lo, hi;
        urange(op, &lo, &hi);
        double pa[3] = {2, 0.5, -1.5}, a = 0, b = 0;
        int nvar = op == TGM_POW ? 3 : op == TGM_CLAMP ? 3 : 1;
        for (int var = 0; var < nvar; var++) {
          if (op == TGM_POW) {
            a = pa[var];
            lo = var ? 0.05 : -4;
            hi = 4;
          }
          if (op == TGM_CLAMP) {
            a = var == 1 ? -INFINITY : -0.5;
            b = var == 2 ? INFINITY : 0.7;
          }
          T x = rnd(dt, 1, &n, lo, hi), y = mk(dt, 1, &n);
          if (op == TGM_RECIPROCAL)
            for (int64_t i = 0; i < n; i++)
              setv(&x, i, x.v[i] < 0 ? x.v[i] - 0.1 : x.v[i] + 0.1);
          double *ref = malloc(sizeof(double) * (size_t)n);
          for (int64_t i = 0; i < n; i++)
            ref[i] = ref_unary(op, x.v[i], a, b);
          tgm_cpu_unary(op, dt, x.p, y.p, n, a, b);
          /* values are O(1): an absolute tolerance of rtol (f32 cannot do
           * better for gelu(-5) = 0.5 x (1 + erf(x / sqrt 2)), nor can torch) */
          int exact = op == TGM_COPY || op == TGM_NEG || op == TGM_ABS;
          expect_atol(fmt("unary %s %s n=%lld a=%g b=%g", unames[op], dtn[dt], (long long)n, a, b), dt, y.p, ref, n,
                      exact ? 0 : tol_of(dt), exact ? 0 : tol_of(dt));
          free(ref);
          tfree(&x);
          tfree(&y);
        }
      }
  /* special values (f32): NaN, infinities, signed zeros, the ends of exp */
  static const float sp[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-30f, -1e-30f, 88.7f, 88.8f, -87.5f,
                             -103.0f, -104.5f, 50.0f, -50.0f, 0.6f, -0.6f, 0.65f, 1e-3f, -1e-3f, 20.0f};
  int64_t n = sizeof sp / sizeof *sp;
  for (int op = TGM_NEG; op <= TGM_COPY; op++) {
    if (op == TGM_LOG || op == TGM_SQRT || op == TGM_RSQRT || op == TGM_SIN || op == TGM_COS || op == TGM_POW)
      continue; /* libm's, or domain edges where f32 and double legitimately differ */
    T x = mk(TGM_F32, 1, &n), y = mk(TGM_F32, 1, &n);
    double ref[64];
    for (int64_t i = 0; i < n; i++) {
      setv(&x, i, sp[i]);
      double r = ref_unary(op, x.v[i], -0.5, 0.7);
      ref[i] = fabs(r) < 1.2e-38 ? 0 : fabs(r) > 3.4028234e38 && isfinite(r) ? copysign(INFINITY, r) : r;
    }
    tgm_cpu_unary(op, TGM_F32, x.p, y.p, n, -0.5, 0.7);
    /* flush the reference's subnormals: compare them with an absolute tolerance */
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
      double g = ((float *)y.p)[i], w = ref[i];
      int ok = isnan(w) ? isnan(g) : isinf(w) ? g == w : fabs(g - w) <= 2e-6 * fabs(w) + 1e-37;
      if (!ok && bad++ < 3)
        printf("  unary %s special x=%g: got %.9g want %.9g\n", unames[op], (double)sp[i], g, w);
    }
    check(!bad, fmt("unary %s special values", unames[op]));
    tfree(&x);
    tfree(&y);
  }
  /* i32: exact, wrapping */
  static const int iops[] = {TGM_NEG, TGM_ABS, TGM_RELU, TGM_SQUARE, TGM_CLAMP, TGM_COPY};
  for (size_t k = 0; k < sizeof iops / sizeof *iops; k++)
    for (int big = 0; big < 2; big++) {
      int64_t m = big ? 70001 : 130;
      T x = rnd(TGM_I32, 1, &m, big ? -2147483648.0 : -50, big ? 2147483647.0 : 50), y = mk(TGM_I32, 1, &m);
      setv(&x, 0, -2147483648.0);
      double *ref = malloc(sizeof(double) * (size_t)m);
      for (int64_t i = 0; i < m; i++) {
        double v = x.v[i];
        ref[i] = iops[k] == TGM_SQUARE   ? (double)(int32_t)(uint32_t)(uint64_t)((int64_t)v * (int64_t)v)
                 : iops[k] == TGM_CLAMP ? (v < -5 ? -5 : v > 7 ? 7 : v)
                                        : wrap32(ref_unary(iops[k], v, 0, 0));
      }
      tgm_cpu_unary(iops[k], TGM_I32, x.p, y.p, m, -5, 7);
      expect(fmt("unary %s i32 n=%lld", unames[iops[k]], (long long)m), TGM_I32, y.p, ref, m, 0);
      free(ref);
      tfree(&x);
      tfree(&y);
    }
}

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

/* ---------------------------------------------------------------- binary, where, broadcast */

static const char *const bnames[] = {"add", "sub", "mul", "div", "max", "min", "gt", "ge", "lt", "le", "eq", "ne"};

static double ref_binary(int op, double a, double b, int dt) {
  double r;
  if (dt == TGM_I32 && op <= TGM_MIN) { /* exact in int64, wrapped */
    int64_t u = (int64_t)a, v = (int64_t)b;
    int64_t w = op == TGM_ADD ? u + v : op == TGM_SUB ? u - v : op == TGM_MUL ? u * v : op == TGM_MAX ? (u > v ? u : v)
                                                                                                     : (u < v ? u : v);
    return (double)(int32_t)(uint32_t)(uint64_t)w;
  }
  switch (op) {
  case TGM_ADD: r = a + b; break;
  case TGM_SUB: r = a - b; break;
  case TGM_MUL: r = a * b; break;
  case TGM_DIV: r = a / b; break;
  case TGM_MAX: r = isnan(a) || isnan(b) ? a + b : a > b ? a : b; break;
  case TGM_MIN: r = isnan(a) || isnan(b) ? a + b : a < b ? a : b; break;
  case TGM_GT: return a > b;
  case TGM_GE: return a >= b;
  case TGM_LT: return a < b;
  case TGM_LE: return a <= b;
  case TGM_EQ: return a == b;
  default: return a != b;
  }
  return dt == TGM_I32 ? wrap32(r) : r;
}

typedef struct Pair {
  int ra;
  int64_t sa[4];
  int rb;
  int64_t sb[4];
} Pair;

static const Pair bshapes[] = {
    {1, {130}, 1, {130}},       {2, {3, 17}, 2, {3, 17}},          {2, {5, 33}, 0, {0}},
    {0, {0}, 2, {5, 33}},       {2, {17, 33}, 1, {33}},            {2, {17, 33}, 2, {17, 1}},
    {2, {17, 1}, 2, {1, 33}},   {4, {2, 1, 3, 5}, 3, {4, 1, 5}},   {0, {0}, 0, {0}},
    {1, {1}, 3, {3, 1, 7}},     {2, {300, 257}, 1, {257}},         {3, {4, 1, 9000}, 3, {1, 3, 9000}},
    {2, {70001, 1}, 2, {1, 1}}, {3, {2, 3, 1}, 3, {2, 1, 1}},
};

static void test_binary(void) {
  static const int dts[] = {TGM_F32, TGM_BF16, TGM_F16, TGM_I32};
  for (int op = TGM_ADD; op <= TGM_NE; op++)
    for (int d = 0; d < 4; d++)
      for (size_t k = 0; k < sizeof bshapes / sizeof *bshapes; k++) {
        int dt = dts[d];
        if (dt == TGM_I32 && op == TGM_DIV)
          continue;
        const Pair *ps = &bshapes[k];
        int64_t sy[TGM_MAXRANK], idx[TGM_MAXRANK];
        int ry = bcast_shape(ps->ra, ps->sa, ps->rb, ps->sb, sy);
        int cmp = op >= TGM_GT;
        double lo = dt == TGM_I32 ? -1000 : -3, hi = -lo;
        if (dt == TGM_I32 && (op == TGM_ADD || op == TGM_SUB || op == TGM_MUL) && k % 2) {
          lo = -2147483648.0; /* wrapping */
          hi = 2147483647.0;
        }
        T a = rnd(dt, ps->ra, ps->sa, lo, hi), b = rnd(dt, ps->rb, ps->sb, lo, hi);
        T y = mk(cmp ? TGM_BOOL : dt, ry, sy);
        if (op == TGM_DIV)
          for (int64_t i = 0; i < b.n; i++)
            setv(&b, i, b.v[i] < 0 ? b.v[i] - 0.5 : b.v[i] + 0.5);
        if (dt != TGM_I32 && (op == TGM_MAX || op == TGM_MIN || op == TGM_EQ || op == TGM_NE) && a.n > 3) {
          setv(&a, 1, NAN); /* NaN propagates through maximum/minimum */
          setv(&b, b.n - 1, NAN);
        }
        if (a.n > 2 && b.n > 2) /* some equal pairs for the compares */
          for (int64_t i = 0; i < y.n; i += 7) {
            unravel(i, ry, sy, idx);
            setv(&a, bidx(ps->ra, ps->sa, ry, idx), b.v[bidx(ps->rb, ps->sb, ry, idx)]);
          }
        double *ref = malloc(sizeof(double) * (size_t)(y.n ? y.n : 1));
        for (int64_t i = 0; i < y.n; i++) {
          unravel(i, ry, sy, idx);
          ref[i] = ref_binary(op, a.v[bidx(ps->ra, ps->sa, ry, idx)], b.v[bidx(ps->rb, ps->sb, ry, idx)], dt);
        }
        tgm_cpu_binary(op, dt, a.p, ps->ra, ps->sa, b.p, ps->rb, ps->sb, y.p, ry, sy);
        expect(fmt("binary %s %s %s %s", bnames[op], dtn[dt], shstr(ps->ra, ps->sa), shstr(ps->rb, ps->sb)), y.dt,
               y.p, ref, y.n, cmp || dt == TGM_I32 || op >= TGM_MAX ? 0 : tol_of(dt));
        free(ref);
        tfree(&a);
        tfree(&b);
        tfree(&y);
      }
}

static void test_where(void) {
  static const struct {
    int rc;
    int64_t sc[3];
    int ra;
    int64_t sa[3];
    int rb;
    int64_t sb[3];
  } cs[] = {
      {1, {130}, 1, {130}, 1, {130}},        {2, {17, 1}, 1, {33}, 0, {0}},
      {0, {0}, 2, {3, 5}, 2, {3, 5}},        {3, {2, 1, 5}, 2, {3, 1}, 1, {5}},
      {2, {300, 257}, 2, {300, 257}, 0, {0}}, {1, {70001}, 1, {1}, 1, {70001}},
  };
  for (int dt = 0; dt < 5; dt++)
    for (size_t k = 0; k < sizeof cs / sizeof *cs; k++) {
      int64_t s1[TGM_MAXRANK], sy[TGM_MAXRANK], idx[TGM_MAXRANK];
      int r1 = bcast_shape(cs[k].ra, cs[k].sa, cs[k].rb, cs[k].sb, s1);
      int ry = bcast_shape(cs[k].rc, cs[k].sc, r1, s1, sy);
      T c = rnd(TGM_BOOL, cs[k].rc, cs[k].sc, 0, 1), a = rnd(dt, cs[k].ra, cs[k].sa, -100, 100);
      T b = rnd(dt, cs[k].rb, cs[k].sb, -100, 100), y = mk(dt, ry, sy);
      double *ref = malloc(sizeof(double) * (size_t)y.n);
      for (int64_t i = 0; i < y.n; i++) {
        unravel(i, ry, sy, idx);
        ref[i] = c.v[bidx(c.r, c.s, ry, idx)] != 0 ? a.v[bidx(a.r, a.s, ry, idx)] : b.v[bidx(b.r, b.s, ry, idx)];
      }
      tgm_cpu_where(dt, c.p, c.r, c.s, a.p, a.r, a.s, b.p, b.r, b.s, y.p, ry, sy);
      expect(fmt("where %s %s", dtn[dt], shstr(ry, sy)), dt, y.p, ref, y.n, 0);
      free(ref);
      tfree(&c);
      tfree(&a);
      tfree(&b);
      tfree(&y);
    }
}

static void test_broadcast_fill_arange(void) {
  static const Pair cs[] = {
      {3, {3, 1, 5}, 4, {2, 3, 4, 5}}, {0, {0}, 1, {7}},           {1, {33}, 2, {17, 33}},
      {2, {17, 1}, 2, {17, 33}},       {1, {1}, 1, {70001}},       {2, {1, 257}, 3, {2, 300, 257}},
      {2, {4, 5}, 2, {4, 5}},          {3, {2, 1, 1}, 3, {2, 3, 3}},
  };
  for (int dt = 0; dt < 5; dt++)
    for (size_t k = 0; k < sizeof cs / sizeof *cs; k++) {
      int64_t idx[TGM_MAXRANK];
      T x = rnd(dt, cs[k].ra, cs[k].sa, -100, 100), y = mk(dt, cs[k].rb, cs[k].sb);
      double *ref = malloc(sizeof(double) * (size_t)y.n);
      for (int64_t i = 0; i < y.n; i++) {
        unravel(i, y.r, y.s, idx);
        ref[i] = x.v[bidx(x.r, x.s, y.r, idx)];
      }
      tgm_cpu_broadcast(dt, x.p, x.r, x.s, y.p, y.r, y.s);
      expect(fmt("broadcast %s %s -> %s", dtn[dt], shstr(x.r, x.s), shstr(y.r, y.s)), dt, y.p, ref, y.n, 0);
      free(ref);
      tfree(&x);
      tfree(&y);
    }
  static const double fv[] = {0, 1, -2.5, 3.14159, 1e10, -7};
  for (int dt = 0; dt < 5; dt++)
    for (size_t k = 0; k < sizeof fv / sizeof *fv; k++) {
      int64_t n = k % 2 ? 70001 : 33;
      if (dt == TGM_BOOL && fv[k] != 0 && fv[k] != 1)
        continue;
      T y = mk(dt, 1, &n);
      double *ref = malloc(sizeof(double) * (size_t)n);
      for (int64_t i = 0; i < n; i++)
        ref[i] = rounded(dt, fv[k]);
      tgm_cpu_fill(dt, y.p, n, fv[k]);
      expect(fmt("fill %s %g n=%lld", dtn[dt], fv[k], (long long)n), dt, y.p, ref, n, 0);
      free(ref);
      tfree(&y);
    }
  for (int64_t n = 1; n < 100000; n *= 7) {
    T y = mk(TGM_I32, 1, &n);
    double *ref = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
      ref[i] = (double)i;
    tgm_cpu_arange(y.p, n);
    expect(fmt("arange %lld", (long long)n), TGM_I32, y.p, ref, n, 0);
    free(ref);
    tfree(&y);
  }
}

/* ---------------------------------------------------------------- reductions */

static const char *const rnames[] = {"sum", "mean", "amax", "var", "logsumexp"};

/* Reference reduction: group the input elements by their kept coordinates. */
static void ref_reduce(int op, const T *x, uint32_t axes, double corr, double *out, int64_t nout) {
  int64_t idx[TGM_MAXRANK], len = 1;
  for (int k = 0; k < x->r; k++)
    if ((axes >> k) & 1)
      len *= x->s[k];
  double *s = calloc((size_t)nout, sizeof(double)), *m = malloc(sizeof(double) * (size_t)nout);
  int64_t *g = malloc(sizeof(int64_t) * (size_t)(x->n ? x->n : 1));
  for (int64_t o = 0; o < nout; o++)
    m[o] = -INFINITY;
  for (int64_t i = 0; i < x->n; i++) {
    unravel(i, x->r, x->s, idx);
    int64_t o = 0;
    for (int k = 0; k < x->r; k++)
      if (!((axes >> k) & 1))
        o = o * x->s[k] + idx[k];
    g[i] = o;
    s[o] += x->v[i];
    if (isnan(x->v[i]) || x->v[i] > m[o])
      m[o] = isnan(m[o]) ? m[o] : x->v[i];
  }
  for (int64_t o = 0; o < nout; o++) {
    if (op == TGM_SUM)
      out[o] = x->dt == TGM_I32 ? wrap32(s[o]) : s[o];
    else if (op == TGM_MEAN)
      out[o] = s[o] / (double)len;
    else if (op == TGM_AMAX)
      out[o] = m[o];
    else
      out[o] = 0;
  }
  if (op == TGM_VAR || op == TGM_LOGSUMEXP) {
    for (int64_t i = 0; i < x->n; i++) {
      int64_t o = g[i];
      double d = op == TGM_VAR ? x->v[i] - s[o] / (double)len : exp(x->v[i] - (isinf(m[o]) ? 0 : m[o]));
      out[o] += op == TGM_VAR ? d * d : d;
    }
    for (int64_t o = 0; o < nout; o++) {
      if (op == TGM_VAR) {
        double div = (double)len - corr;
        out[o] = div > 0 ? out[o] / div : out[o] > 0 ? INFINITY : NAN;
      } else {
        out[o] = log(out[o]) + (isinf(m[o]) ? 0 : m[o]);
      }
    }
  }
  free(s);
  free(m);
  free(g);
}

static void reduce_case(int op, int dt, int r, const int64_t *s, uint32_t axes, double corr, int special) {
  T x = rnd(dt, r, s, dt == TGM_I32 ? -100000 : -3, dt == TGM_I32 ? 100000 : 3);
  if (op == TGM_VAR) /* an offset mean: the two-pass variance has to cope */
    for (int64_t i = 0; i < x.n; i++)
      setv(&x, i, x.v[i] + 5);
  if (special && x.n > 40 && dt != TGM_I32) {
    setv(&x, 3, op == TGM_LOGSUMEXP ? INFINITY : NAN);
    for (int64_t i = 20; i < x.n && i < 40; i++)
      setv(&x, i, -INFINITY);
  }
  int64_t nout = 1;
  for (int k = 0; k < r; k++)
    if (!((axes >> k) & 1))
      nout *= s[k];
  T y = mk(dt, 1, &nout);
  double *ref = malloc(sizeof(double) * (size_t)(nout ? nout : 1));
  ref_reduce(op, &x, axes, corr, ref, nout);
  tgm_cpu_reduce(op, dt, x.p, r, s, axes, y.p, corr);
  expect(fmt("reduce %s %s %s axes=0x%x corr=%g%s", rnames[op], dtn[dt], shstr(r, s), axes, corr,
             special ? " (nan/inf)" : ""),
         dt, y.p, ref, nout, dt == TGM_I32 || op == TGM_AMAX ? 0 : tol_of(dt));
  free(ref);
  tfree(&x);
  tfree(&y);
}

static void test_reduce(void) {
  static const struct {
    int r;
    int64_t s[4];
  } shp[] = {{1, {130}}, {2, {17, 33}}, {4, {3, 5, 7, 4}}, {3, {2, 1, 3}}, {0, {0}}, {2, {300, 257}},
             {1, {70001}}, {2, {3, 40000}}, {3, {2, 300, 129}}, {2, {3, 0}}, {3, {1, 1, 1}}};
  static const int dts[] = {TGM_F32, TGM_BF16, TGM_F16, TGM_I32};
  for (int op = TGM_SUM; op <= TGM_LOGSUMEXP; op++)
    for (int d = 0; d < 4; d++) {
      int dt = dts[d];
      if (dt == TGM_I32 && op != TGM_SUM && op != TGM_AMAX)
        continue;
      for (size_t k = 0; k < sizeof shp / sizeof *shp; k++) {
        int r = shp[k].r;
        uint32_t full = r ? (1u << r) - 1 : 0;
        int64_t n = numel_of(r, shp[k].s);
        if (n == 0 && (op == TGM_AMAX || dt == TGM_I32))
          continue;
        for (uint32_t axes = 0; axes <= full; axes++) {
          if (n > 5000 && axes != 1 && axes != full && axes != (full >> 1) && axes != 2)
            continue;
          if (axes == 0 && r > 0 && n > 5000)
            continue;
          reduce_case(op, dt, r, shp[k].s, axes, 1.0, 0);
          if (op == TGM_VAR && n < 5000)
            reduce_case(op, dt, r, shp[k].s, axes, 0.0, 0);
        }
        if (r && dt != TGM_I32 && n > 40 && (op == TGM_AMAX || op == TGM_LOGSUMEXP || op == TGM_SUM)) {
          reduce_case(op, dt, r, shp[k].s, full, 1.0, 1);
          if (r >= 2) /* along an outer dim (the column path) */
            reduce_case(op, dt, r, shp[k].s, 1, 1.0, 1);
        }
      }
    }
  /* a variance of one element with correction 1: 0/0 */
  int64_t one = 1;
  reduce_case(TGM_VAR, TGM_F32, 1, &one, 1, 1.0, 0);
}

static void test_softmax(void) {
  static const int64_t shp[][3] = {{1, 1, 1}, {3, 17, 1}, {2, 33, 5}, {1, 130, 1}, {4, 7, 300},
                                   {300, 257, 1}, {1, 3, 40000}, {2, 70001, 1}};
  static const int dts[] = {TGM_F32, TGM_BF16, TGM_F16};
  for (int lg = 0; lg < 2; lg++)
    for (int d = 0; d < 3; d++)
      for (size_t k = 0; k < sizeof shp / sizeof *shp; k++) {
        int dt = dts[d];
        int64_t O = shp[k][0], N = shp[k][1], In = shp[k][2], n = O * N * In;
        T x = rnd(dt, 1, &n, -6, 6), y = mk(dt, 1, &n);
        if (N > 10 && n > 3 * N * In) {
          for (int64_t j = 0; j < N; j++) /* one group all -inf (NaN, as torch) */
            setv(&x, (0 * N + j) * In, -INFINITY);
          for (int64_t j = 0; j < N; j += 2) /* one group half masked */
            setv(&x, (1 * N + j) * In, -INFINITY);
        }
        double *ref = malloc(sizeof(double) * (size_t)n);
        for (int64_t o = 0; o < O; o++)
          for (int64_t i = 0; i < In; i++) {
            double m = -INFINITY, s = 0;
            for (int64_t j = 0; j < N; j++)
              m = isnan(x.v[(o * N + j) * In + i]) || x.v[(o * N + j) * In + i] > m ? x.v[(o * N + j) * In + i] : m;
            for (int64_t j = 0; j < N; j++)
              s += exp(x.v[(o * N + j) * In + i] - m);
            for (int64_t j = 0; j < N; j++) {
              double z = x.v[(o * N + j) * In + i] - m;
              ref[(o * N + j) * In + i] = lg ? z - log(s) : exp(z) / s;
            }
          }
        tgm_cpu_softmax(lg, dt, x.p, y.p, O, N, In);
        expect(fmt("%s %s [%lld,%lld,%lld]", lg ? "log_softmax" : "softmax", dtn[dt], (long long)O, (long long)N,
                   (long long)In),
               dt, y.p, ref, n, tol_of(dt));
        free(ref);
        tfree(&x);
        tfree(&y);
      }
}

static void test_norms(void) {
  static const int64_t shp[][2] = {{1, 1}, {3, 17}, {33, 130}, {300, 257}, {2, 40000}};
  static const int dts[] = {TGM_F32, TGM_BF16, TGM_F16};
  for (int d = 0; d < 3; d++)
    for (size_t k = 0; k < sizeof shp / sizeof *shp; k++)
      for (int wb = 0; wb < 4; wb++)
        for (int rms = 0; rms < 2; rms++) {
          int dt = dts[d];
          if (rms && wb >= 2)
            continue;
          int64_t R = shp[k][0], D = shp[k][1], n = R * D;
          double eps = rms ? 1e-6 : 1e-5;
          T x = rnd(dt, 1, &n, 2, 6), w = rnd(dt, 1, &D, 0.5, 1.5), b = rnd(dt, 1, &D, -1, 1), y = mk(dt, 1, &n);
          int hw = wb & 1, hb = (wb >> 1) & 1;
          double *ref = malloc(sizeof(double) * (size_t)n);
          for (int64_t r = 0; r < R; r++) {
            const double *xr = x.v + r * D;
            double mean = 0, ss = 0;
            for (int64_t j = 0; j < D; j++)
              mean += xr[j];
            mean /= (double)D;
            for (int64_t j = 0; j < D; j++)
              ss += rms ? xr[j] * xr[j] : (xr[j] - mean) * (xr[j] - mean);
            double den = sqrt(ss / (double)D + eps);
            for (int64_t j = 0; j < D; j++)
              ref[r * D + j] = (xr[j] - (rms ? 0 : mean)) / den * (hw ? w.v[j] : 1) + (hb ? b.v[j] : 0);
          }
          if (rms)
            tgm_cpu_rms_norm(dt, x.p, hw ? w.p : NULL, y.p, R, D, eps);
          else
            tgm_cpu_layer_norm(dt, x.p, hw ? w.p : NULL, hb ? b.p : NULL, y.p, R, D, eps);
          /* the normalised values are O(1) while x is offset by 4: the error of
           * x - mean in f32 is relative to x, so allow for that */
          expect(fmt("%s %s [%lld,%lld] w=%d b=%d", rms ? "rms_norm" : "layer_norm", dtn[dt], (long long)R,
                     (long long)D, hw, hb),
                 dt, y.p, ref, n, dt == TGM_F32 ? 4e-5 : tol_of(dt));
          free(ref);
          tfree(&x);
          tfree(&w);
          tfree(&b);
          tfree(&y);
        }
}

static void test_losses(void) {
  static const int dts[] = {TGM_F32, TGM_BF16, TGM_F16};
  static const int64_t ce[][2] = {{1, 1}, {1, 7}, {5, 17}, {33, 130}, {300, 1000}};
  for (int d = 0; d < 3; d++)
    for (size_t k = 0; k < sizeof ce / sizeof *ce; k++)
      for (int ign = 0; ign < 3; ign++) {
        int dt = dts[d];
        int64_t N = ce[k][0], C = ce[k][1], n = N * C, one = 1, ignore = ign == 2 ? 3 : -100;
        T x = rnd(dt, 1, &n, -8, 8), t = rnd(TGM_I32, 1, &N, 0, (double)C - 1), y = mk(dt, 1, &one);
        if (ign == 1)
          for (int64_t i = 0; i < N; i += 3)
            setv(&t, i, -100);
        if (ign == 2 && C > 3)
          setv(&t, 0, 3);
        double tot = 0, cnt = 0;
        for (int64_t i = 0; i < N; i++) {
          if (t.v[i] == (double)ignore)
            continue;
          double m = -INFINITY, s = 0;
          for (int64_t j = 0; j < C; j++)
            m = x.v[i * C + j] > m ? x.v[i * C + j] : m;
          for (int64_t j = 0; j < C; j++)
            s += exp(x.v[i * C + j] - m);
          tot += m + log(s) - x.v[i * C + (int64_t)t.v[i]];
          cnt++;
        }
        double ref = tot / cnt;
        int64_t bad = tgm_cpu_cross_entropy(dt, x.p, t.p, N, C, ignore, y.p);
        check(bad == -1, fmt("cross_entropy %s [%lld,%lld]: no bad target", dtn[dt], (long long)N, (long long)C));
        expect(fmt("cross_entropy %s [%lld,%lld] ignore=%lld", dtn[dt], (long long)N, (long long)C, (long long)ignore),
               dt, y.p, &ref, 1, tol_of(dt));
        tfree(&x);
        tfree(&t);
        tfree(&y);
      }
  { /* every target ignored: 0/0 = NaN; bad targets: the first bad row */
    int64_t N = 4, C = 5, n = 20, one = 1;
    T x = rnd(TGM_F32, 1, &n, -1, 1), t = mk(TGM_I32, 1, &N), y = mk(TGM_F32, 1, &one);
    for (int64_t i = 0; i < N; i++)
      setv(&t, i, -100);
    double nan = NAN;
    check(tgm_cpu_cross_entropy(TGM_F32, x.p, t.p, N, C, -100, y.p) == -1, "cross_entropy all ignored: no error");
    expect("cross_entropy all ignored is NaN", TGM_F32, y.p, &nan, 1, 0);
    setv(&t, 1, 2);
    setv(&t, 2, 5);
    setv(&t, 3, -1);
    check(tgm_cpu_cross_entropy(TGM_F32, x.p, t.p, N, C, -100, y.p) == 2, "cross_entropy: target == C is bad (row 2)");
    setv(&t, 2, 4);
    check(tgm_cpu_cross_entropy(TGM_F32, x.p, t.p, N, C, -100, y.p) == 3, "cross_entropy: target -1 is bad (row 3)");
    setv(&t, 0, 0);
    check(tgm_cpu_cross_entropy(TGM_F32, x.p, t.p, N, C, -1, y.p) == -1, "cross_entropy: -1 ignored when ignore=-1");
    tfree(&x);
    tfree(&t);
    tfree(&y);
  }
  static const Pair ms[] = {{1, {130}, 1, {130}},     {2, {17, 33}, 1, {33}}, {0, {0}, 2, {5, 3}},
                            {2, {17, 1}, 2, {1, 33}}, {2, {300, 257}, 2, {300, 257}}, {1, {70001}, 0, {0}}};
  for (int d = 0; d < 3; d++)
    for (size_t k = 0; k < sizeof ms / sizeof *ms; k++) {
      int dt = dts[d];
      int64_t sy[TGM_MAXRANK], idx[TGM_MAXRANK], one = 1;
      int ry = bcast_shape(ms[k].ra, ms[k].sa, ms[k].rb, ms[k].sb, sy);
      T a = rnd(dt, ms[k].ra, ms[k].sa, -2, 2), b = rnd(dt, ms[k].rb, ms[k].sb, -2, 2), y = mk(dt, 1, &one);
      int64_t n = numel_of(ry, sy);
      double s = 0;
      for (int64_t i = 0; i < n; i++) {
        unravel(i, ry, sy, idx);
        double df = a.v[bidx(a.r, a.s, ry, idx)] - b.v[bidx(b.r, b.s, ry, idx)];
        s += df * df;
      }
      double ref = s / (double)n;
      tgm_cpu_mse_loss(dt, a.p, a.r, a.s, b.p, b.r, b.s, y.p);
      expect(fmt("mse_loss %s %s %s", dtn[dt], shstr(a.r, a.s), shstr(b.r, b.s)), dt, y.p, &ref, 1, tol_of(dt));
      tfree(&a);
      tfree(&b);
      tfree(&y);
    }
}

/* ---------------------------------------------------------------- data movement */

static void permute_case(int dt, int r, const int64_t *s, const int *perm) {
  int64_t ys[TGM_MAXRANK], idx[TGM_MAXRANK], xi[TGM_MAXRANK];
  for (int k = 0; k < r; k++)
    ys[k] = s[perm[k]];
  T x = rnd(dt, r, s, -1000, 1000), y = mk(dt, r, ys);
  double *ref = malloc(sizeof(double) * (size_t)(y.n ? y.n : 1));
  for (int64_t i = 0; i < y.n; i++) {
    unravel(i, r, ys, idx);
    for (int k = 0; k < r; k++)
      xi[perm[k]] = idx[k];
    int64_t o = 0;
    for (int k = 0; k < r; k++)
      o = o * s[k] + xi[k];
    ref[i] = x.v[o];
  }
  tgm_cpu_permute(dt, x.p, r, s, perm, y.p);
  char ps[32];
  int o = 0;
  for (int k = 0; k < r; k++)
    o += snprintf(ps + o, sizeof ps - (size_t)o, "%d", perm[k]);
  ps[o] = 0;
  expect(fmt("permute %s %s (%s)", dtn[dt], shstr(r, s), ps), dt, y.p, ref, y.n, 0);
  free(ref);
  tfree(&x);
  tfree(&y);
}

static void test_permute(void) {
  for (int dt = 0; dt < 5; dt++) {
    int64_t s2[2] = {17, 33}, sb[2] = {300, 257}, s4[4] = {2, 3, 4, 5}, s41[4] = {2, 1, 33, 17};
    int64_t sh[4] = {4, 64, 12, 32}, s1[1] = {130};
    int t2[2] = {1, 0}, i2[2] = {0, 1}, p1[1] = {0};
    permute_case(dt, 2, s2, t2);
    permute_case(dt, 2, s2, i2);
    permute_case(dt, 2, sb, t2);
    permute_case(dt, 1, s1, p1);
    permute_case(dt, 0, s1, p1);
    int p[4] = {0, 1, 2, 3};
    for (int a = 0; a < 4; a++) /* all 24 permutations of rank 4 */
      for (int b = 0; b < 4; b++)
        for (int c = 0; c < 4; c++) {
          int d = 6 - a - b - c;
          if (a == b || a == c || b == c || d == a || d == b || d == c)
            continue;
          p[0] = a, p[1] = b, p[2] = c, p[3] = d;
          permute_case(dt, 4, s4, p);
        }
    int h[4] = {0, 2, 1, 3}, rv[4] = {3, 2, 1, 0}, q[4] = {0, 3, 1, 2};
    permute_case(dt, 4, s41, h);
    permute_case(dt, 4, s41, rv);
    permute_case(dt, 4, sh, h);
    permute_case(dt, 4, sh, q);
  }
}

static void test_slice_concat(void) {
  static const int64_t cs[][5] = {{1, 10, 1, 0, 10}, {3, 17, 5, 2, 9}, {4, 33, 1, 32, 33},
                                  {2, 5, 3, 2, 2},   {70, 130, 33, 1, 129}, {1, 300000, 1, 5, 299999}};
  for (int dt = 0; dt < 5; dt++)
    for (size_t k = 0; k < sizeof cs / sizeof *cs; k++) {
      int64_t O = cs[k][0], N = cs[k][1], In = cs[k][2], lo = cs[k][3], hi = cs[k][4], n = O * N * In;
      int64_t ny = O * (hi - lo) * In;
      T x = rnd(dt, 1, &n, -100, 100), y = mk(dt, 1, &ny);
      double *ref = malloc(sizeof(double) * (size_t)(ny ? ny : 1));
      for (int64_t o = 0; o < O; o++)
        for (int64_t j = lo; j < hi; j++)
          for (int64_t i = 0; i < In; i++)
            ref[(o * (hi - lo) + j - lo) * In + i] = x.v[(o * N + j) * In + i];
      tgm_cpu_slice(dt, x.p, O, N, In, lo, hi, y.p);
      expect(fmt("slice %s [%lld,%lld,%lld] %lld:%lld", dtn[dt], (long long)O, (long long)N, (long long)In,
                 (long long)lo, (long long)hi),
             dt, y.p, ref, ny, 0);
      /* concat: the slice, the rest before it and after it, back into x's shape */
      int64_t n1 = O * lo * In, n3 = O * (N - hi) * In;
      T p1 = mk(dt, 1, &n1), p3 = mk(dt, 1, &n3), z = mk(dt, 1, &n);
      tgm_cpu_slice(dt, x.p, O, N, In, 0, lo, p1.p);
      tgm_cpu_slice(dt, x.p, O, N, In, hi, N, p3.p);
      tgm_cpu_copy_into(dt, p1.p, O, lo, In, z.p, N, 0);
      tgm_cpu_copy_into(dt, y.p, O, hi - lo, In, z.p, N, lo);
      tgm_cpu_copy_into(dt, p3.p, O, N - hi, In, z.p, N, hi);
      expect(fmt("copy_into %s [%lld,%lld,%lld] at %lld, %lld", dtn[dt], (long long)O, (long long)N, (long long)In,
                 (long long)lo, (long long)hi),
             dt, z.p, x.v, n, 0);
      free(ref);
      tfree(&x);
      tfree(&y);
      tfree(&p1);
      tfree(&p3);
      tfree(&z);
    }
}

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

static void test_gemm_direct(void) {
  static const int64_t cs[][3] = {{1, 1, 1}, {3, 17, 5}, {33, 130, 17}, {130, 33, 257}, {200, 150, 300},
                                  {7, 3100, 9}};
  for (size_t k = 0; k < sizeof cs / sizeof *cs; k++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        int64_t M = cs[k][0], N = cs[k][1], K = cs[k][2], na = M * K, nb = K * N, nc = M * N;
        T a = rnd(TGM_F32, 1, &na, -1, 1), b = rnd(TGM_F32, 1, &nb, -1, 1);
        double *prod = malloc(sizeof(double) * (size_t)nc), *ref = malloc(sizeof(double) * (size_t)nc);
        for (int64_t i = 0; i < M; i++)
          for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t l = 0; l < K; l++)
              s += a.v[ta ? l * M + i : i * K + l] * b.v[tb ? j * K + l : l * N + j];
            prod[i * N + j] = s;
          }
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

/* scaled_dot_product_attention in double (gen/interp.c's eval_attention). */
static void ref_attention(const T *q, const T *k, const T *v, int ry, const int64_t *sy, int causal, double scale,
                          double *out) {
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

static void test_attention(void) {
  static const struct {
    int rq;
    int64_t sq[4];
    int rk;
    int64_t sk[4];
    int rv;
    int64_t sv[4];
  } cs[] = {
      {2, {1, 1}, 2, {1, 1}, 2, {1, 1}},
      {4, {2, 3, 17, 16}, 4, {2, 3, 17, 16}, 4, {2, 3, 17, 16}},
      {3, {2, 5, 8}, 3, {2, 9, 8}, 3, {2, 9, 12}},
      {3, {2, 9, 8}, 3, {2, 5, 8}, 3, {2, 5, 4}},
      {4, {2, 3, 7, 8}, 4, {1, 3, 7, 8}, 2, {7, 5}},
      {3, {1, 130, 32}, 3, {1, 130, 32}, 3, {1, 130, 32}},
      {4, {2, 4, 64, 16}, 4, {2, 4, 64, 16}, 4, {2, 4, 64, 16}},
      {2, {300, 8}, 2, {300, 8}, 2, {300, 8}},
  };
  static const int dts[] = {TGM_F32, TGM_BF16, TGM_F16};
  for (int d = 0; d < 3; d++)
    for (size_t k = 0; k < sizeof cs / sizeof *cs; k++)
      for (int causal = 0; causal < 2; causal++)
        for (int sc = 0; sc < 2; sc++) {
          int dt = dts[d];
          int64_t sy[TGM_MAXRANK], bkv[TGM_MAXRANK], bb[TGM_MAXRANK];
          int nb1 = bcast_shape(cs[k].rk - 2, cs[k].sk, cs[k].rv - 2, cs[k].sv, bkv);
          int nb = bcast_shape(cs[k].rq - 2, cs[k].sq, nb1, bkv, bb);
          int ry = 0;
          for (int i = 0; i < nb; i++)
            sy[ry++] = bb[i];
          sy[ry++] = cs[k].sq[cs[k].rq - 2];
          sy[ry++] = cs[k].sv[cs[k].rv - 1];
          T q = rnd(dt, cs[k].rq, cs[k].sq, -1, 1), kk = rnd(dt, cs[k].rk, cs[k].sk, -1, 1);
          T v = rnd(dt, cs[k].rv, cs[k].sv, -1, 1), y = mk(dt, ry, sy);
          double scale = sc ? 0.3 : 1.0 / sqrt((double)cs[k].sq[cs[k].rq - 1]);
          double *ref = malloc(sizeof(double) * (size_t)y.n);
          ref_attention(&q, &kk, &v, ry, sy, causal, scale, ref);
          tgm_cpu_attention(dt, q.p, q.r, q.s, kk.p, kk.r, kk.s, v.p, v.r, v.s, y.p, ry, sy, causal, scale);
          expect(fmt("attention %s q%s k%s v%s causal=%d scale=%g", dtn[dt], shstr(q.r, q.s), shstr(kk.r, kk.s),
                     shstr(v.r, v.s), causal, scale),
                 dt, y.p, ref, y.n, gtol_of(dt));
          if (ry == 3 && sy[0] <= 2) { /* the no-scratch path, one batch */
            int64_t Tq = q.s[q.r - 2], D = q.s[q.r - 1], Tk = kk.s[kk.r - 2], Dv = v.s[v.r - 1];
            memset(y.p, 0, esize(dt) * (size_t)y.n);
            attention_noscratch(dt, q.p, kk.p, v.p, y.p, Tq, Tk, D, Dv, causal, (float)scale);
            expect(fmt("attention_noscratch %s q%s causal=%d", dtn[dt], shstr(q.r, q.s), causal), dt, y.p, ref,
                   Tq * Dv, gtol_of(dt));
          }
          free(ref);
          tfree(&q);
          tfree(&kk);
          tfree(&v);
          tfree(&y);
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

/* One gemm case: shapes, storage (pad: extra elements per row of A, B, C;
 * gap: extra elements between batch elements; bc: 1 A broadcast over the
 * batch, 2 B), the epilogue, and how it runs (inplace: the residual is C
 * itself; direct: gemm_direct, the no-scratch path, instead of the entry
 * point). */
typedef struct GemmCase {
  int dt, ta, tb;
  int64_t M, N, K, batch, pad, gap;
  int bc, bias, act, aux, res, acc, inplace, direct;
} GemmCase;

static const char *gemm_label(const GemmCase *c) {
  return fmt("gemm %s ta=%d tb=%d M=%lld N=%lld K=%lld batch=%lld pad=%lld bc=%d bias=%d act=%s aux=%d res=%d%s "
             "acc=%d%s",
             dtn[c->dt], c->ta, c->tb, (long long)c->M, (long long)c->N, (long long)c->K, (long long)c->batch,
             (long long)c->pad, c->bc, c->bias, actn[c->act], c->aux, c->res, c->inplace ? "(=C)" : "", c->acc,
             c->direct ? " direct" : "");
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
  for (int64_t i = 0; i < aux.n; i++)
    if (aux.v[i] != 7.0)
      setv(&aux, i, NAN);
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
        if (c->aux) {
          aref[o] = s;
          atol[o] = rtol * (fabs(s) + scale) + sub;
        }
        s = ref_act(c->act, s);
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
  tgm_gemm g = {.dt = dt, .ta = c->ta, .tb = c->tb, .M = M, .N = N, .K = K, .batch = B,
                .A = a.p, .lda = lda, .sa = sa, .B = b.p, .ldb = ldb, .sb = sb, .C = y.p, .ldc = ldc, .sc = sc,
                .bias = c->bias ? bias.p : NULL, .act = c->act, .aux = c->aux ? aux.p : NULL,
                .residual = c->res ? (c->inplace ? y.p : res.p) : NULL, .accumulate = c->acc};
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
                          e & 1, (e >> 1) & 3, (e >> 3) & 1, (e >> 4) & 1, (e >> 5) & 1, 0, 0};
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
                      e & 1, (e >> 1) & 3, (e >> 3) & 1, (e >> 4) & 1, (e >> 5) & 1, 0, 0};
        T y = gemm_case(&c);
        tfree(&y);
        if (bc == 0 && bs[k][0] * bs[k][1] * bs[k][2] > 32768 && bs[k][0] * bs[k][1] * bs[k][2] < 2000000) {
          c.direct = 1;
          y = gemm_case(&c);
          tfree(&y);
        }
      }
  /* edge cases: K = 0 (the epilogue on zeros; A and B may be NULL), M = 0,
   * N = 0, batch = 0 (nothing written) */
  for (int d = 0; d < 3; d++) {
    GemmCase c0 = {dts[d], 0, 1, 7, 33, 0, 2, 1, 0, 0, 1, TGM_ACT_GELU, 1, 1, 1, 0, 0};
    T y = gemm_case(&c0);
    tfree(&y);
    static const int64_t z[][4] = {{0, 5, 3, 1}, {5, 0, 3, 1}, {0, 0, 0, 1}, {3, 4, 5, 0}};
    for (int k = 0; k < 4; k++) {
      GemmCase c = {dts[d], 1, 0, z[k][0], z[k][1], z[k][2], z[k][3], 1, 0, 0, 1, TGM_ACT_RELU, 1, 1, 1, 0, 0};
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
  /* the same bits at 1 and 3 threads (the built-in GEMM) */
  if (omp_get_max_threads() != 1)
    for (int d = 0; d < 3; d++) {
      if (dts[d] == TGM_F32 && gemm_via_blas())
        continue;
      GemmCase c = {dts[d], 1, 1, 200, 150, 300, 2, 1, 0, 0, 1, TGM_ACT_GELU, 1, 1, 0, 0, 0};
      uint64_t seed = rng;
      T y1 = gemm_case(&c);
      int saved = omp_get_max_threads();
      omp_set_num_threads(1);
      rng = seed;
      T y2 = gemm_case(&c);
      omp_set_num_threads(saved);
      check(y1.n == y2.n && memcmp(y1.p, y2.p, esize(dts[d]) * (size_t)y1.n) == 0,
            fmt("gemm %s: the same bits at %d threads and 1", dtn[dts[d]], saved));
      tfree(&y1);
      tfree(&y2);
    }
#endif
}

/* ---------------------------------------------------------------- driver */

static void run_all(void) {
  test_unary();
  test_cast();
  test_binary();
  test_where();
  test_broadcast_fill_arange();
  test_reduce();
  test_softmax();
  test_norms();
  test_losses();
  test_permute();
  test_slice_concat();
  test_embedding();
  test_embedding_backward();
  test_dropout();
}

static void run_gemm(void) {
  test_gemm_direct();
  test_matmul();
  test_linear();
  test_attention();
  test_gemm();
}

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
  snprintf(ctx, sizeof ctx, "interpreter");
  test_dropout_interp();
  printf("%d passed, %d failed\n", npass, nfail);
  return nfail != 0;
}
