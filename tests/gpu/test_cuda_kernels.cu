/* test_cuda_kernels.cu: every tgm_cuda_* library call (cast, fill, matmul,
 * linear, embedding and its backward, dropout, attention (bf16/f16 with head
 * dim 64 or 128: flash attention, on Hopper at 64 the wgmma kernels and the
 * mma.sync ones); tgm_cuda_gemm has
 * test_gemm_cuda.cu) against a naive double-precision host reference (the
 * semantics of gen/interp.c), on random data with odd sizes and broadcasting
 * batch shapes, for f32 / bf16 / f16 (and i32, bool where the call takes
 * them). The pointwise, reduction, view and loss kernels are generated per
 * model and checked on a GPU by the emitted projects' tests
 * (tests/gpu/check_examples.sh).
 *
 * One line per case: PASS/FAIL, the case, the largest error and the
 * tolerance. An error is |got - ref| / max(1, |ref|, scale) where scale is the
 * natural size of the result when it is a sum (the 2-norm of the summed
 * terms); NaN must meet NaN and infinities must match exactly. Tolerances:
 * f32 1e-5, f32 GEMM-based 1e-4 (no TF32), bf16 2e-2, f16 2e-3; integer,
 * bool and data-movement results must be exact. embedding_backward and
 * dropout must give the CPU kernels' bits: the f32 in-order sums, the Philox
 * mask and the f32 product, computed here as tgm_cpu_embedding_backward and
 * tgm_cpu_dropout compute them (test_cpu_kernels.c checks those kernels
 * against the same loops bit for bit). Group "timing" prints TIME lines for
 * GPT-2-sized embedding_backward and dropout, "attention_timing" for GPT-2's
 * attention (contiguous, and on views of its packed qkv), and
 * "attention_views" checks attention on strided views against the same
 * calls on contiguous copies.
 *
 * Exit status: 0 all passed, 1 some failed, 77 no CUDA device (skip).
 * Build: tests/gpu/build_and_run.sh. */
#include "../../templates/runtime/tgm_cuda.cu"

/* The dtype conversions live in tgm_init.c; without it, local copies. */
#if !defined(TGM_TEST_LOCAL_CONVERSIONS) && __has_include("../../templates/runtime/tgm_init.c")
#include "../../templates/runtime/tgm_init.c"
#else
#ifndef TGM_TEST_CONVERSIONS_DEFINED
#define TGM_TEST_CONVERSIONS_DEFINED
float tgm_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
uint16_t tgm_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
float tgm_f16_to_f32(uint16_t h) {
  __half_raw r;
  r.x = h;
  return __half2float(__half(r));
}
uint16_t tgm_f32_to_f16(float f) {
  __half x = __float2half_rn(f);
  uint16_t h;
  memcpy(&h, &x, 2);
  return h;
}
#endif
#endif

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

typedef std::vector<int64_t> Shape;
typedef std::vector<double> Vals;

static tgm_cuda_ctx *CX;
static int n_pass, n_fail;

/* ---------------------------------------------------------------- random data */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng_next(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double urand(double lo, double hi) { return lo + (hi - lo) * ((double)(rng_next() >> 11) * 0x1p-53); }
static int64_t irand(int64_t lo, int64_t hi) { return lo + (int64_t)(rng_next() % (uint64_t)(hi - lo + 1)); }

/* ---------------------------------------------------------------- dtypes on the host */

static const char *DTN[] = {"f32", "bf16", "f16", "i32", "bool"};
static const int ESZ[] = {4, 2, 2, 4, 1};

/* The value v once stored in dt (floats via f32, as the kernels round). */
static double round_dt(int dt, double v) {
  float f = (float)v;
  switch (dt) {
  case TGM_F32: return f;
  case TGM_BF16: return tgm_bf16_to_f32(tgm_f32_to_bf16(f));
  case TGM_F16: return tgm_f16_to_f32(tgm_f32_to_f16(f));
  case TGM_I32: return (double)(int32_t)v;
  default: return v != 0;
  }
}
static void put(int dt, void *raw, int64_t i, double v) {
  float f = (float)v;
  switch (dt) {
  case TGM_F32: ((float *)raw)[i] = f; break;
  case TGM_BF16: ((uint16_t *)raw)[i] = tgm_f32_to_bf16(f); break;
  case TGM_F16: ((uint16_t *)raw)[i] = tgm_f32_to_f16(f); break;
  case TGM_I32: ((int32_t *)raw)[i] = (int32_t)v; break;
  default: ((uint8_t *)raw)[i] = v != 0; break;
  }
}
static double get(int dt, const void *raw, int64_t i) {
  switch (dt) {
  case TGM_F32: return ((const float *)raw)[i];
  case TGM_BF16: return tgm_bf16_to_f32(((const uint16_t *)raw)[i]);
  case TGM_F16: return tgm_f16_to_f32(((const uint16_t *)raw)[i]);
  case TGM_I32: return ((const int32_t *)raw)[i];
  default: return ((const uint8_t *)raw)[i];
  }
}

static int64_t numel(const Shape &s) {
  int64_t n = 1;
  for (int64_t d : s)
    n *= d;
  return n;
}
static std::string shape_str(const Shape &s) {
  std::string r = "[";
  for (size_t k = 0; k < s.size(); k++)
    r += (k ? "," : "") + std::to_string(s[k]);
  return r + "]";
}

/* A tensor: its values as stored (doubles) and a device copy. The device
 * buffer can start `skew` elements past an aligned address (to exercise the
 * unvectorised paths). */
struct Tensor {
  int dt = TGM_F32;
  Shape shape;
  Vals v;
  void *base = nullptr, *d = nullptr;
  Tensor() {}
  Tensor(const Tensor &) = delete;
  Tensor &operator=(const Tensor &) = delete;
  ~Tensor() {
    if (base)
      tgm_cuda_free(CX, base);
  }
  int64_t n() const { return numel(shape); }
  /* Allocates the device buffer (and fills it with `fill`'s bit pattern). */
  void alloc(int dt_, const Shape &s, int skew = 0) {
    dt = dt_;
    shape = s;
    size_t bytes = (size_t)(n() + skew) * ESZ[dt] + 64;
    if (tgm_cuda_malloc(CX, &base, bytes)) {
      fprintf(stderr, "allocation failed: %s\n", tgm_cuda_ctx_error(CX));
      exit(1);
    }
    cudaMemsetAsync(base, 0xA5, bytes, CX->stream); /* junk, so unwritten outputs show (on the ctx's stream) */
    d = (char *)base + (size_t)skew * ESZ[dt];
  }
  void upload() {
    std::vector<unsigned char> raw((size_t)n() * ESZ[dt] + 1);
    for (int64_t i = 0; i < n(); i++)
      put(dt, raw.data(), i, v[i]);
    if (n() && tgm_cuda_memcpy(CX, d, raw.data(), (size_t)n() * ESZ[dt], 0)) {
      fprintf(stderr, "upload failed: %s\n", tgm_cuda_ctx_error(CX));
      exit(1);
    }
  }
  Vals download() const {
    std::vector<unsigned char> raw((size_t)n() * ESZ[dt] + 1);
    Vals r((size_t)n());
    if (n() && tgm_cuda_memcpy(CX, raw.data(), d, (size_t)n() * ESZ[dt], 1)) {
      fprintf(stderr, "download failed: %s\n", tgm_cuda_ctx_error(CX));
      return Vals((size_t)n(), NAN);
    }
    for (int64_t i = 0; i < n(); i++)
      r[i] = get(dt, raw.data(), i);
    return r;
  }
};

/* A random tensor in [lo, hi] (integers for i32, 0/1 for bool), rounded to dt. */
static void rand_tensor(Tensor &t, int dt, const Shape &s, double lo, double hi, int skew = 0) {
  t.alloc(dt, s, skew);
  t.v.resize((size_t)t.n());
  for (auto &x : t.v)
    x = dt == TGM_I32    ? (double)irand((int64_t)lo, (int64_t)hi)
        : dt == TGM_BOOL ? (double)irand(0, 1)
                         : round_dt(dt, urand(lo, hi));
  t.upload();
}
/* An output tensor (junk-filled). */
static void out_tensor(Tensor &t, int dt, const Shape &s) { t.alloc(dt, s); }

/* ---------------------------------------------------------------- checking */

static double tol_for(int dt, bool gemm = false) {
  switch (dt) {
  case TGM_F32: return gemm ? 1e-4 : 1e-5;
  case TGM_BF16: return 2e-2;
  case TGM_F16: return 2e-3;
  default: return 0;
  }
}

/* Reports a case whose kernel call failed. */
static void fail_call(const std::string &label, int rc) {
  printf("FAIL  %-58s call returned %d: %s\n", label.c_str(), rc, tgm_cuda_ctx_error(CX));
  n_fail++;
}

/* Runs the GPU side of a case: the call's status, then a sync. */
static bool ran(const std::string &label, int rc) {
  if (rc) {
    fail_call(label, rc);
    return false;
  }
  rc = tgm_cuda_sync(CX);
  if (rc) {
    fail_call(label + " (sync)", rc);
    return false;
  }
  return true;
}

/* Compares got with ref (see the top); scale may be empty. */
static bool compare(const std::string &label, const Vals &got, const Vals &ref, double tol,
                    const Vals &scale = Vals()) {
  double worst = 0;
  int64_t wi = -1;
  if (got.size() != ref.size()) {
    printf("FAIL  %-58s size %zu, expected %zu\n", label.c_str(), got.size(), ref.size());
    n_fail++;
    return false;
  }
  for (size_t i = 0; i < ref.size(); i++) {
    double g = got[i], r = ref[i], e;
    if (std::isnan(r) || std::isnan(g))
      e = std::isnan(r) && std::isnan(g) ? 0 : INFINITY;
    else if (std::isinf(r) || std::isinf(g))
      e = g == r ? 0 : INFINITY;
    else {
      double den = std::max(1.0, fabs(r));
      if (!scale.empty())
        den = std::max(den, scale[i]);
      e = fabs(g - r) / den;
      if (tol == 0 && g != r)
        e = INFINITY;
    }
    if (e > worst || wi < 0) {
      worst = e;
      wi = (int64_t)i;
    }
  }
  bool ok = worst <= tol;
  if (ok)
    printf("PASS  %-58s n=%-8zu max_err %.3g (tol %.3g)\n", label.c_str(), ref.size(), worst, tol);
  else
    printf("FAIL  %-58s n=%-8zu max_err %.3g (tol %.3g) at [%lld]: got %.9g, expected %.9g\n", label.c_str(),
           ref.size(), worst, tol, (long long)wi, got[wi], ref[wi]);
  ok ? n_pass++ : n_fail++;
  return ok;
}

static void expect(const std::string &label, bool cond, const std::string &why) {
  if (cond) {
    printf("PASS  %-58s\n", label.c_str());
    n_pass++;
  } else {
    printf("FAIL  %-58s %s\n", label.c_str(), why.c_str());
    n_fail++;
  }
}

/* Offset in an operand of shape is (NumPy-broadcast) for output element i of shape os. */
static int64_t bidx(const Shape &os, int64_t i, const Shape &is) {
  std::vector<int64_t> c(os.size());
  for (int k = (int)os.size() - 1; k >= 0; k--) {
    c[k] = i % os[k];
    i /= os[k];
  }
  int64_t off = 0, st = 1;
  for (int k = (int)is.size() - 1; k >= 0; k--) {
    int o = (int)os.size() - (int)is.size() + k;
    off += (is[k] == 1 ? 0 : c[o]) * st;
    st *= is[k];
  }
  return off;
}

static Shape bshape(const Shape &a, const Shape &b) {
  size_t r = std::max(a.size(), b.size());
  Shape s(r);
  for (size_t k = 0; k < r; k++) {
    int64_t da = k + a.size() >= r ? a[k + a.size() - r] : 1, db = k + b.size() >= r ? b[k + b.size() - r] : 1;
    s[k] = da == 1 ? db : da;
  }
  return s;
}

/* A view (the attention calls' operands) of shape s at p: row-major, or with
 * the element strides st. p NULL: absent (a result not wanted). */
static tgm_view view_at(const void *p, const Shape &s, const Shape &st = Shape()) {
  tgm_view v;
  memset(&v, 0, sizeof v);
  v.p = (void *)p;
  v.rank = (int)s.size();
  int64_t c = 1;
  for (int k = v.rank - 1; k >= 0; k--) {
    v.shape[k] = s[k];
    v.st[k] = st.empty() ? c : st[k];
    c *= s[k];
  }
  return v;
}

/* ---------------------------------------------------------------- cast, fill */

/* cast: every pair of dtypes, exact against the host conversions. */
static void test_cast(void) {
  for (int di = 0; di < 5; di++)
    for (int dout = 0; dout < 5; dout++) {
      const int64_t n = 1037;
      Tensor x, y;
      x.alloc(di, {n});
      x.v.resize(n);
      for (int64_t i = 0; i < n; i++) {
        double v = i % 7 == 0 ? 0.0 : i % 5 == 0 ? (double)irand(-300, 300) : urand(-300, 300);
        if (di == TGM_I32)
          v = i % 11 == 0 ? (double)irand(-100000, 100000) : (double)irand(-300, 300);
        x.v[i] = round_dt(di, v);
      }
      x.upload();
      out_tensor(y, dout, {n});
      std::string label = std::string("cast ") + DTN[di] + " -> " + DTN[dout];
      if (!ran(label, tgm_cuda_cast(CX, di, dout, x.d, y.d, n)))
        continue;
      Vals ref(n);
      for (int64_t i = 0; i < n; i++) {
        double v = x.v[i];
        ref[i] = dout == TGM_I32 ? trunc(v) : dout == TGM_BOOL ? (double)(v != 0) : round_dt(dout, v);
      }
      compare(label, y.download(), ref, 0);
    }
}

/* ---------------------------------------------------------------- linear algebra */

static void test_matmul(void) {
  const Shape cases[][2] = {{{37, 29}, {29, 41}},
                            {{3, 37, 29}, {29, 41}},
                            {{2, 1, 17, 9}, {3, 9, 13}},
                            {{29}, {29, 41}},
                            {{3, 37, 29}, {29}},
                            {{29}, {29}},
                            {{4, 1, 5, 6}, {1, 3, 6, 7}},
                            {{2, 3, 5, 6}, {2, 3, 6, 4}},
                            {{3, 0}, {0, 4}},
                            {{5, 64}, {2, 64, 33}},
                            {{130, 257}, {257, 3}}};
  const int dts[] = {TGM_F32, TGM_BF16, TGM_F16};
  for (int dt : dts)
    for (auto &c : cases) {
      const Shape &sa = c[0], &sb = c[1];
      int ra = (int)sa.size(), rb = (int)sb.size();
      int64_t M = ra >= 2 ? sa[ra - 2] : 1, K = sa[ra - 1], N = rb >= 2 ? sb[rb - 1] : 1;
      Shape ab(sa.begin(), sa.end() - std::min(ra, 2)), bb(sb.begin(), sb.end() - std::min(rb, 2));
      Shape ys = bshape(ab, bb), batch = ys;
      if (ra >= 2)
        ys.push_back(M);
      if (rb >= 2)
        ys.push_back(N);
      Tensor a, b, y;
      rand_tensor(a, dt, sa, -1, 1);
      rand_tensor(b, dt, sb, -1, 1);
      out_tensor(y, dt, ys);
      std::string label = std::string("matmul ") + DTN[dt] + " " + shape_str(sa) + " @ " + shape_str(sb);
      if (!ran(label, tgm_cuda_matmul(CX, dt, a.d, ra, sa.data(), b.d, rb, sb.data(), y.d, (int)ys.size(), ys.data())))
        continue;
      int64_t nb = numel(batch);
      Vals ref(nb * M * N);
      for (int64_t t = 0; t < nb; t++) {
        int64_t ao = bidx(batch, t, ab) * M * K, bo = bidx(batch, t, bb) * K * N;
        for (int64_t i = 0; i < M; i++)
          for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++)
              s += a.v[ao + i * K + k] * b.v[bo + k * N + j];
            ref[(t * M + i) * N + j] = s;
          }
      }
      compare(label, y.download(), ref, tol_for(dt, true));
    }
}

static void test_linear(void) {
  struct Case {
    int64_t rows, in, out;
  };
  const Case cases[] = {{37, 29, 41}, {1, 64, 10}, {130, 257, 3}, {5, 0, 7}};
  const int dts[] = {TGM_F32, TGM_BF16, TGM_F16};
  for (int dt : dts)
    for (int bias = 0; bias < 2; bias++)
      for (const Case &c : cases) {
        Tensor x, w, b, y;
        rand_tensor(x, dt, {c.rows, c.in}, -1, 1);
        rand_tensor(w, dt, {c.out, c.in}, -1, 1);
        rand_tensor(b, dt, {c.out}, -1, 1);
        out_tensor(y, dt, {c.rows, c.out});
        char lab[160];
        snprintf(lab, sizeof lab, "linear %s rows=%lld in=%lld out=%lld%s", DTN[dt], (long long)c.rows, (long long)c.in,
                 (long long)c.out, bias ? " +bias" : "");
        if (!ran(lab, tgm_cuda_linear(CX, dt, x.d, w.d, bias ? b.d : NULL, y.d, c.rows, c.in, c.out)))
          continue;
        Vals ref(c.rows * c.out);
        for (int64_t r = 0; r < c.rows; r++)
          for (int64_t o = 0; o < c.out; o++) {
            double s = bias ? b.v[o] : 0;
            for (int64_t k = 0; k < c.in; k++)
              s += x.v[r * c.in + k] * w.v[o * c.in + k];
            ref[r * c.out + o] = s;
          }
        compare(lab, y.download(), ref, tol_for(dt, true));
      }
}

/* ---------------------------------------------------------------- neural */

static void test_embedding(void) {
  struct Case {
    int64_t n, V, D;
    bool bad;
  };
  const Case cases[] = {
      {37, 50, 33, false}, {64, 1000, 64, false}, {9, 7, 3, false}, {20, 50, 16, true}, {5, 4, 0, true}};
  for (int dt = 0; dt < 5; dt++)
    for (const Case &c : cases) {
      Tensor idx, tab, y;
      rand_tensor(idx, TGM_I32, {c.n}, 0, c.V - 1);
      if (c.bad) { /* two bad indices: the smaller position must be reported */
        idx.v[3] = (double)c.V;
        idx.v[c.n - 2] = -1;
        idx.upload();
      }
      rand_tensor(tab, dt, {c.V, c.D}, -1000, 1000);
      out_tensor(y, dt, {c.n, c.D});
      char lab[160];
      snprintf(lab, sizeof lab, "embedding %s n=%lld V=%lld D=%lld%s", DTN[dt], (long long)c.n, (long long)c.V,
               (long long)c.D, c.bad ? " (bad indices)" : "");
      if (!ran(lab, tgm_cuda_embedding(CX, dt, (const int32_t *)idx.d, c.n, tab.d, c.V, c.D, y.d)))
        continue;
      int64_t pos = -2;
      int rc = tgm_cuda_bad_index(CX, &pos);
      expect(std::string(lab) + " bad position", rc == 0 && pos == (c.bad ? 3 : -1),
             "rc " + std::to_string(rc) + ", position " + std::to_string(pos));
      if (c.bad) {
        rc = tgm_cuda_bad_index(CX, &pos);
        expect(std::string(lab) + " d_bad reset", rc == 0 && pos == -1, "position " + std::to_string(pos));
      }
      Vals ref(c.n * c.D);
      for (int64_t p = 0; p < c.n; p++)
        for (int64_t j = 0; j < c.D; j++) {
          int64_t i = (int64_t)idx.v[p];
          ref[p * c.D + j] = i >= 0 && i < c.V ? tab.v[i * c.D + j] : 0.0;
        }
      compare(lab, y.download(), ref, 0);
    }
}

/* The raw bytes of a device tensor. */
static std::vector<unsigned char> raw_bytes(const Tensor &t) {
  std::vector<unsigned char> raw((size_t)t.n() * ESZ[t.dt] + 1);
  if (t.n() && tgm_cuda_memcpy(CX, raw.data(), t.d, (size_t)t.n() * ESZ[t.dt], 1))
    fprintf(stderr, "download failed: %s\n", tgm_cuda_ctx_error(CX));
  return raw;
}

/* embedding_backward against the CPU kernel's arithmetic, bit for bit:
 * out[idx[p]] += dy[p] for p in order, in f32 from 0, stored once in dt (what
 * tgm_cpu_embedding_backward computes; tests/unit/test_cpu_kernels.c checks it
 * against the same loop bit for bit); bad positions are left out of the sums
 * and the first one reported. Indices hit only the even rows (the odd rows
 * must come out zero over the junk fill), with many repeats; D past one
 * column chunk (4 x 256); runs twice to the same bits. */
static void test_embedding_backward(void) {
  struct Case {
    int64_t n, V, D;
    bool bad, skewed;
  };
  const Case cases[] = {{1, 1, 1, false, false},      {37, 50, 33, false, false},    {300, 7, 257, false, false},
                        {5000, 1000, 768, false, false}, {2003, 3, 1100, false, false}, {20, 50, 16, true, false},
                        {0, 9, 7, false, false},      {5, 4, 0, true, false},       {64, 70000, 8, true, false},
                        {4099, 1, 5, false, false},    {6000, 500, 200, true, true},  {3001, 64, 1030, false, true}};
  for (int dt = 0; dt < 3; dt++)
    for (const Case &c : cases) {
      Tensor idx, dy, y;
      idx.alloc(TGM_I32, {std::max<int64_t>(c.n, 1)});
      idx.shape = {c.n};
      idx.v.resize((size_t)c.n);
      for (auto &x : idx.v) /* skewed: a third of the positions on rows 0 and 2 (heavy rows), the rest spread */
        x = (double)((c.skewed && rng_next() % 3 == 0 ? irand(0, 1) : irand(0, (c.V - 1) / 2)) * 2);
      if (c.bad) { /* two bad indices: the smaller position must be reported */
        idx.v[3] = (double)c.V;
        idx.v[c.n - 2] = -1;
      }
      idx.upload();
      rand_tensor(dy, dt, {c.n, c.D}, -1, 1);
      out_tensor(y, dt, {c.V, c.D});
      char lab[160];
      snprintf(lab, sizeof lab, "embedding_backward %s n=%lld V=%lld D=%lld%s%s", DTN[dt], (long long)c.n,
               (long long)c.V, (long long)c.D, c.skewed ? " skewed" : "", c.bad ? " (bad indices)" : "");
      if (!ran(lab, tgm_cuda_embedding_backward(CX, dt, (const int32_t *)idx.d, c.n, dy.d, c.V, c.D, y.d)))
        continue;
      int64_t pos = -2;
      int rc = tgm_cuda_bad_index(CX, &pos);
      expect(std::string(lab) + " bad position", rc == 0 && pos == (c.bad ? 3 : -1),
             "rc " + std::to_string(rc) + ", position " + std::to_string(pos));
      std::vector<float> acc((size_t)(c.V * c.D) + 1, 0.0f);
      Vals exact((size_t)(c.V * c.D), 0.0), ref((size_t)(c.V * c.D)), scale((size_t)(c.V * c.D), 0.0);
      for (int64_t p = 0; p < c.n; p++) {
        int64_t i = (int64_t)idx.v[p];
        if (i < 0 || i >= c.V)
          continue;
        for (int64_t j = 0; j < c.D; j++) {
          acc[i * c.D + j] += (float)dy.v[p * c.D + j];
          exact[i * c.D + j] += dy.v[p * c.D + j];
          scale[i * c.D + j] += dy.v[p * c.D + j] * dy.v[p * c.D + j];
        }
      }
      for (size_t i = 0; i < ref.size(); i++) {
        ref[i] = round_dt(dt, acc[i]);
        scale[i] = sqrt(scale[i]);
      }
      Vals got = y.download();
      compare(std::string(lab) + " = f32 sums in order", got, ref, 0);
      compare(std::string(lab) + " ~ exact sums", got, exact, tol_for(dt), scale);
      std::vector<unsigned char> first = raw_bytes(y);
      if (c.bad)
        tgm_cuda_bad_index(CX, &pos);
      if (ran(std::string(lab) + " again",
              tgm_cuda_embedding_backward(CX, dt, (const int32_t *)idx.d, c.n, dy.d, c.V, c.D, y.d)))
        expect(std::string(lab) + " again: the same bits", raw_bytes(y) == first, "the bits differ");
      if (c.bad)
        tgm_cuda_bad_index(CX, &pos);
    }
  /* a refused dtype */
  int rc = tgm_cuda_embedding_backward(CX, TGM_I32, NULL, 0, NULL, 0, 0, NULL);
  expect("embedding_backward: i32 refused", rc != 0 && strstr(tgm_cuda_ctx_error(CX), "embedding_backward"),
         tgm_cuda_ctx_error(CX));
}

/* Milliseconds per call of `call` (after a warm-up), by CUDA events on the
 * context's stream. */
template <class F> static double time_ms(F call, int reps) {
  call();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a, CX->stream);
  for (int r = 0; r < reps; r++)
    call();
  cudaEventRecord(b, CX->stream);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / reps;
}

/* GPT-2 sizes (V = 50304, D = 768, n = 16384 tokens): uniform indices, Zipf
 * (s = 1: the top row gets 8.8% of the positions, text-like), and the worst
 * case of every position on one row; dropout on [16384, 768]. */
static void test_timing(void) {
  const int64_t V = 50304, D = 768, n = 16384;
  std::vector<double> cdf((size_t)V);
  double tot = 0;
  for (int64_t r = 0; r < V; r++)
    cdf[r] = tot += 1.0 / (double)(r + 1);
  static const char *const how[] = {"(uniform indices)", "(Zipf indices)", "(all on one row)"};
  for (int dt = 0; dt < 2; dt++)
    for (int skew = 0; skew < 3; skew++) {
      Tensor idx, dy, y;
      rand_tensor(idx, TGM_I32, {n}, 0, skew == 2 ? 0 : V - 1);
      if (skew == 1) {
        for (auto &x : idx.v)
          x = (double)(std::lower_bound(cdf.begin(), cdf.end(), urand(0, tot)) - cdf.begin());
        idx.upload();
      }
      rand_tensor(dy, dt, {n, D}, -1, 1);
      out_tensor(y, dt, {V, D});
      int rc = 0;
      double ms = time_ms(
          [&] { rc |= tgm_cuda_embedding_backward(CX, dt, (const int32_t *)idx.d, n, dy.d, V, D, y.d); }, 20);
      char lab[160];
      snprintf(lab, sizeof lab, "TIME embedding_backward %s V=%lld D=%lld n=%lld %s", DTN[dt], (long long)V,
               (long long)D, (long long)n, how[skew]);
      if (ran(lab, rc))
        printf("%-64s %.3f ms (%.0f GB/s of output)\n", lab, ms, (double)(V * D * ESZ[dt]) / ms * 1e-6);
    }
  for (int dt = 0; dt < 2; dt++) {
    Tensor x, y;
    rand_tensor(x, dt, {n, D}, -1, 1);
    out_tensor(y, dt, {n, D});
    int rc = 0;
    double ms = time_ms([&] { rc |= tgm_cuda_dropout(CX, dt, x.d, y.d, n * D, 0.1, 1234, 0, 7); }, 20);
    char lab[160];
    snprintf(lab, sizeof lab, "TIME dropout %s [%lld, %lld] p=0.1", DTN[dt], (long long)n, (long long)D);
    if (ran(lab, rc))
      printf("%-64s %.3f ms (%.0f GB/s)\n", lab, ms, (double)(2 * n * D * ESZ[dt]) / ms * 1e-6);
  }
}

/* The largest |a - b| / max(1, |b|) over n bf16 values on the device. */
static double bf16_worst(const void *da, const void *db, int64_t n) {
  std::vector<uint16_t> a((size_t)n), b((size_t)n);
  cudaMemcpy(a.data(), da, (size_t)n * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(b.data(), db, (size_t)n * 2, cudaMemcpyDeviceToHost);
  double worst = 0;
  for (int64_t i = 0; i < n; i++) {
    uint32_t ua = (uint32_t)a[(size_t)i] << 16, ub = (uint32_t)b[(size_t)i] << 16;
    float fa, fb;
    memcpy(&fa, &ua, 4);
    memcpy(&fb, &ub, 4);
    worst = std::max(worst, (double)fabsf(fa - fb) / std::max(1.0, (double)fabsf(fb)));
  }
  return worst;
}

/* GPT-2's attention (B=16, 12 heads, T=1024, D=64, causal, bf16): flash
 * attention, and the materialised path it replaces (forced by operands one
 * element off 16-byte alignment), both timed; the two must agree. Then on
 * GPT-2's layout, views of q, k, v in the packed qkv [B, T, 3 C] (rows of
 * 2304 elements) and y written straight into [B, T, C] (the backward: dy read
 * from [B, T, C], dq, dk, dv written into a packed [B, T, 3 C]), timed: the
 * flash kernels must take them (on a context of its own, which the
 * materialised path would make take scratch), with the contiguous calls'
 * bits. */
static void test_attention_timing(void) {
  const int64_t B = 16, H = 12, T = 1024, D = 64, n = B * H * T * D;
  Shape sh = {B, H, T, D};
  Tensor q, k, v, q2, k2, v2, y1, y2; /* q2, k2, v2: the same values one element later (not 16-byte aligned) */
  rand_tensor(q, TGM_BF16, {n + 8}, -1, 1);
  rand_tensor(k, TGM_BF16, {n + 8}, -1, 1);
  rand_tensor(v, TGM_BF16, {n + 8}, -1, 1);
  out_tensor(q2, TGM_BF16, {n + 8});
  out_tensor(k2, TGM_BF16, {n + 8});
  out_tensor(v2, TGM_BF16, {n + 8});
  cudaMemcpy((char *)q2.d + 2, q.d, (size_t)n * 2, cudaMemcpyDeviceToDevice);
  cudaMemcpy((char *)k2.d + 2, k.d, (size_t)n * 2, cudaMemcpyDeviceToDevice);
  cudaMemcpy((char *)v2.d + 2, v.d, (size_t)n * 2, cudaMemcpyDeviceToDevice);
  out_tensor(y1, TGM_BF16, {n + 8});
  out_tensor(y2, TGM_BF16, {n + 8});
  const char *lab[2] = {"TIME attention bf16 [16, 12, 1024, 64] causal, flash", "TIME attention bf16 [16, 12, 1024, 64] causal, materialised"};
  double ms[2];
  int rc = 0;
  for (int m = 0; m < 2; m++) {
    size_t o = (size_t)m * 2; /* bytes: 0 aligned (flash), 2 not (the materialised path) */
    const char *qp = (const char *)(m ? q2.d : q.d) + o, *kp = (const char *)(m ? k2.d : k.d) + o;
    const char *vp = (const char *)(m ? v2.d : v.d) + o;
    char *yp = (char *)(m ? y2.d : y1.d) + o;
    tgm_view vq = view_at(qp, sh), vk = view_at(kp, sh), vv = view_at(vp, sh), vy = view_at(yp, sh);
    ms[m] = time_ms([&] { rc |= tgm_cuda_attention(CX, TGM_BF16, &vq, &vk, &vv, &vy, 1, 0.125, NULL); }, 10);
    if (ran(lab[m], rc))
      printf("%-64s %.3f ms (%.0f TFLOP/s causal)\n", lab[m], ms[m], 2.0 * B * H * T * T * D / ms[m] * 1e-9);
  }
  double worst = bf16_worst(y1.d, (const char *)y2.d + 2, n);
  expect("attention timing: flash and the materialised path agree (bf16 2e-2)", rc == 0 && worst <= 2e-2,
         "max error " + std::to_string(worst));
  if (CX->hopper) { /* k_flash_fwd_h took it: k_flash_fwd, timed beside it, into y2 */
    const char *l3 = "TIME attention bf16 [16, 12, 1024, 64] causal, flash on mma.sync (k_flash_fwd)";
    tgm_view vq = view_at(q.d, sh), vk = view_at(k.d, sh), vv = view_at(v.d, sh), vy = view_at(y2.d, sh);
    flash_mma_sync = true;
    double t = time_ms([&] { rc |= tgm_cuda_attention(CX, TGM_BF16, &vq, &vk, &vv, &vy, 1, 0.125, NULL); }, 10);
    flash_mma_sync = false;
    if (ran(l3, rc))
      printf("%-64s %.3f ms (%.0f TFLOP/s causal)\n", l3, t, 2.0 * B * H * T * T * D / t * 1e-9);
    worst = bf16_worst(y1.d, y2.d, n);
    expect("attention timing: k_flash_fwd_h and k_flash_fwd agree (bf16 2e-2)", rc == 0 && worst <= 2e-2,
           "max error " + std::to_string(worst));
  }
  /* the backward, both ways, from the flash forward's lse and delta = rowsum(dy * y) */
  Tensor lse, delta, dy, dy2, g1, g2;
  rand_tensor(dy, TGM_BF16, {n + 8}, -1, 1);
  out_tensor(dy2, TGM_BF16, {n + 8});
  cudaMemcpy((char *)dy2.d + 2, dy.d, (size_t)n * 2, cudaMemcpyDeviceToDevice);
  out_tensor(lse, TGM_F32, {B * H * T});
  tgm_view vq = view_at(q.d, sh), vk = view_at(k.d, sh), vv = view_at(v.d, sh), vy = view_at(y1.d, sh);
  rc |= tgm_cuda_attention(CX, TGM_BF16, &vq, &vk, &vv, &vy, 1, 0.125, (float *)lse.d);
  {
    std::vector<uint16_t> yh((size_t)n), gh((size_t)n);
    cudaMemcpy(yh.data(), y1.d, (size_t)n * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(gh.data(), dy.d, (size_t)n * 2, cudaMemcpyDeviceToHost);
    delta.alloc(TGM_F32, {B * H * T});
    delta.v.assign((size_t)(B * H * T), 0.0);
    for (int64_t i = 0; i < n; i++) {
      uint32_t ua = (uint32_t)yh[(size_t)i] << 16, ub = (uint32_t)gh[(size_t)i] << 16;
      float fa, fb;
      memcpy(&fa, &ua, 4);
      memcpy(&fb, &ub, 4);
      delta.v[(size_t)(i / D)] += (double)fa * fb;
    }
    delta.upload();
  }
  out_tensor(g1, TGM_BF16, {3 * (n + 8)});
  out_tensor(g2, TGM_BF16, {3 * (n + 8)});
  const char *blab[2] = {"TIME attention backward bf16 [16, 12, 1024, 64] causal, flash",
                         "TIME attention backward bf16 [16, 12, 1024, 64] causal, materialised"};
  for (int m = 0; m < 2; m++) {
    size_t o = (size_t)m * 2;
    const char *qp = (const char *)(m ? q2.d : q.d) + o, *kp = (const char *)(m ? k2.d : k.d) + o;
    const char *vp = (const char *)(m ? v2.d : v.d) + o, *gp = (const char *)(m ? dy2.d : dy.d) + o;
    char *base = (char *)(m ? g2.d : g1.d) + o, *dq = base, *dk = base + (n + 8) * 2, *dv = base + 2 * (n + 8) * 2;
    tgm_view wq = view_at(qp, sh), wk = view_at(kp, sh), wv = view_at(vp, sh), wdy = view_at(gp, sh);
    tgm_view wdq = view_at(dq, sh), wdk = view_at(dk, sh), wdv = view_at(dv, sh);
    double t = time_ms([&] { rc |= tgm_cuda_attention_backward(CX, TGM_BF16, &wq, &wk, &wv, &wdy, (const float *)lse.d,
                                                               (const float *)delta.d, &wdq, &wdk, &wdv, 1, 0.125); },
                       5);
    if (ran(blab[m], rc))
      printf("%-64s %.3f ms (%.0f TFLOP/s causal, 5 of 7 products)\n", blab[m], t, 5.0 * B * H * T * T * D / t * 1e-9);
  }
  worst = 0;
  for (int g = 0; g < 3; g++)
    worst = std::max(worst, bf16_worst((const char *)g1.d + (size_t)g * (n + 8) * 2,
                                       (const char *)g2.d + (size_t)g * (n + 8) * 2 + 2, n));
  expect("attention backward timing: flash and the materialised path agree (bf16 2e-2)", rc == 0 && worst <= 2e-2,
         "max error " + std::to_string(worst));
  /* GPT-2's layout: the same values copied into the packed buffers, head by head */
  const int64_t C = H * D, n3 = 3 * n;
  Tensor qkv, yv, dyv, gv;
  out_tensor(qkv, TGM_BF16, {n3});
  out_tensor(yv, TGM_BF16, {n});
  out_tensor(dyv, TGM_BF16, {n});
  out_tensor(gv, TGM_BF16, {n3});
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++) {
      size_t src = (size_t)((b * H + h) * T * D) * 2, row = (size_t)D * 2;
      char *dst = (char *)qkv.d + (size_t)(b * T * 3 * C + h * D) * 2;
      const void *from[3] = {q.d, k.d, v.d};
      for (int j = 0; j < 3; j++)
        cudaMemcpy2DAsync(dst + (size_t)(j * C) * 2, (size_t)(3 * C) * 2, (const char *)from[j] + src, row, row,
                          (size_t)T, cudaMemcpyDeviceToDevice, CX->stream);
      cudaMemcpy2DAsync((char *)dyv.d + (size_t)(b * T * C + h * D) * 2, (size_t)C * 2, (const char *)dy.d + src, row,
                        row, (size_t)T, cudaMemcpyDeviceToDevice, CX->stream);
    }
  const Shape pst = {T * 3 * C, D, 3 * C, 1}, yst = {T * C, D, C, 1};
  tgm_view pq = view_at(qkv.d, sh, pst), pk = view_at((char *)qkv.d + C * 2, sh, pst);
  tgm_view pv = view_at((char *)qkv.d + 2 * C * 2, sh, pst), py = view_at(yv.d, sh, yst), pdy = view_at(dyv.d, sh, yst);
  tgm_view pdq = view_at(gv.d, sh, pst), pdk = view_at((char *)gv.d + C * 2, sh, pst);
  tgm_view pdv = view_at((char *)gv.d + 2 * C * 2, sh, pst);
  const char *vlab[2] = {"TIME attention bf16 [16, 12, 1024, 64] causal, flash on GPT-2's views",
                         "TIME attention backward bf16 [16, 12, 1024, 64] causal, flash on GPT-2's views"};
  rc = 0;
  double vms = time_ms([&] { rc |= tgm_cuda_attention(CX, TGM_BF16, &pq, &pk, &pv, &py, 1, 0.125, NULL); }, 10);
  if (ran(vlab[0], rc))
    printf("%-64s %.3f ms (%.0f TFLOP/s causal; contiguous %.3f ms)\n", vlab[0], vms, 2.0 * B * H * T * T * D / vms * 1e-9,
           ms[0]);
  double vbms = time_ms([&] { rc |= tgm_cuda_attention_backward(CX, TGM_BF16, &pq, &pk, &pv, &pdy, (const float *)lse.d,
                                                                (const float *)delta.d, &pdq, &pdk, &pdv, 1, 0.125); },
                        5);
  if (ran(vlab[1], rc))
    printf("%-64s %.3f ms (%.0f TFLOP/s causal, 5 of 7 products)\n", vlab[1], vbms,
           5.0 * B * H * T * T * D / vbms * 1e-9);
  /* the same bits as the contiguous flash calls: y1 [B, H, T, D] against [B, T, H, D], g1's three against the packed */
  std::vector<uint16_t> a((size_t)n), b((size_t)n3);
  int64_t diff = 0;
  cudaMemcpy(a.data(), y1.d, (size_t)n * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(b.data(), yv.d, (size_t)n * 2, cudaMemcpyDeviceToHost);
  for (int64_t i = 0; i < n; i++) { /* i = ((bb H + h) T + t) D + d */
    int64_t d = i % D, t = i / D % T, h = i / (D * T) % H, bb = i / (D * T * H);
    diff += a[(size_t)i] != b[(size_t)((bb * T + t) * C + h * D + d)];
  }
  expect("attention on GPT-2's views: y has the contiguous flash call's bits", rc == 0 && diff == 0,
         std::to_string(diff) + " elements differ");
  cudaMemcpy(b.data(), gv.d, (size_t)n3 * 2, cudaMemcpyDeviceToHost);
  diff = 0;
  for (int g = 0; g < 3; g++) {
    cudaMemcpy(a.data(), (const char *)g1.d + (size_t)g * (n + 8) * 2, (size_t)n * 2, cudaMemcpyDeviceToHost);
    for (int64_t i = 0; i < n; i++) {
      int64_t d = i % D, t = i / D % T, h = i / (D * T) % H, bb = i / (D * T * H);
      diff += a[(size_t)i] != b[(size_t)((bb * T + t) * 3 * C + g * C + h * D + d)];
    }
  }
  expect("attention backward on GPT-2's views: dq, dk, dv have the contiguous flash call's bits", rc == 0 && diff == 0,
         std::to_string(diff) + " elements differ");
  /* the flash kernels took them: a fresh context has no scratch after both calls */
  tgm_cuda_ctx *cx2;
  char err[256];
  if (tgm_cuda_ctx_create(&cx2, err, sizeof err)) {
    expect("attention on GPT-2's views: a second context", false, err);
    return;
  }
  rc = tgm_cuda_attention(cx2, TGM_BF16, &pq, &pk, &pv, &py, 1, 0.125, NULL);
  rc = rc ? rc : tgm_cuda_attention_backward(cx2, TGM_BF16, &pq, &pk, &pv, &pdy, (const float *)lse.d,
                                             (const float *)delta.d, &pdq, &pdk, &pdv, 1, 0.125);
  rc = rc ? rc : tgm_cuda_sync(cx2);
  expect("attention and its backward on GPT-2's views run the flash kernels (no scratch taken)",
         rc == 0 && cx2->scratch_bytes == 0,
         "rc " + std::to_string(rc) + " (" + tgm_cuda_ctx_error(cx2) + "), scratch " +
             std::to_string(cx2->scratch_bytes) + " bytes");
  tgm_cuda_ctx_destroy(cx2);
}

/* The device Philox against tgm_philox4x32 (tgm_init.c), all four words. */
__global__ void k_test_philox(const uint4 *c, const uint2 *k, uint4 *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = philox4x32(c[i], k[i]);
}

/* dropout's keep decision as gen/interp.c writes it: u in double, u >= p. */
static bool ref_kept(int64_t j, double p, uint64_t seed, uint32_t ordinal, uint64_t step) {
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32) ^ ordinal};
  uint32_t ctr[4] = {(uint32_t)(uint64_t)j, (uint32_t)((uint64_t)j >> 32), (uint32_t)step, (uint32_t)(step >> 32)};
  uint32_t r[4];
  tgm_philox4x32(ctr, key, r);
  double u = ((double)(r[0] >> 8) + 0.5) * (1.0 / 16777216.0);
  return p < 1 && u >= p;
}

/* dropout against the CPU kernel's result, bit for bit: the mask of the
 * reference Philox (the interpreter's decision, u >= p in double) and kept
 * values (float)x * (float)(1 / (1 - p)) rounded to dt (what
 * tgm_cpu_dropout stores; test_cpu_kernels.c checks it bit for bit); dropped
 * ones +0. In place too; the boundary p = u_j keeps j, the next double
 * drops it. */
static void test_dropout(void) {
  {
    const int n = 4096;
    std::vector<uint4> c(n), got(n);
    std::vector<uint2> k(n);
    for (int i = 0; i < n; i++) {
      uint64_t a = rng_next(), b = rng_next(), e = rng_next();
      c[i] = make_uint4((uint32_t)a, (uint32_t)(a >> 32), (uint32_t)b, (uint32_t)(b >> 32));
      k[i] = make_uint2((uint32_t)e, (uint32_t)(e >> 32));
    }
    c[0] = make_uint4(0, 0, 0, 0), k[0] = make_uint2(0, 0);
    void *dc, *dk, *dout;
    tgm_cuda_malloc(CX, &dc, sizeof(uint4) * n);
    tgm_cuda_malloc(CX, &dk, sizeof(uint2) * n);
    tgm_cuda_malloc(CX, &dout, sizeof(uint4) * n);
    tgm_cuda_memcpy(CX, dc, c.data(), sizeof(uint4) * n, 0);
    tgm_cuda_memcpy(CX, dk, k.data(), sizeof(uint2) * n, 0);
    k_test_philox<<<(n + 255) / 256, 256, 0, CX->stream>>>((const uint4 *)dc, (const uint2 *)dk, (uint4 *)dout, n);
    tgm_cuda_memcpy(CX, got.data(), dout, sizeof(uint4) * n, 1);
    int bad = 0;
    for (int i = 0; i < n; i++) {
      uint32_t ctr[4] = {c[i].x, c[i].y, c[i].z, c[i].w}, key[2] = {k[i].x, k[i].y}, r[4];
      tgm_philox4x32(ctr, key, r);
      bad += r[0] != got[i].x || r[1] != got[i].y || r[2] != got[i].z || r[3] != got[i].w;
    }
    /* Random123's known answer for Philox4x32-10, counter 0 and key 0 */
    bool kat = got[0].x == 0x6627e8d5u && got[0].y == 0xe169c58du && got[0].z == 0xbc57ac4cu && got[0].w == 0x9b00dbd8u;
    expect("philox4x32 on the device: the bits of tgm_philox4x32 (4096 counters)", bad == 0,
           std::to_string(bad) + " differ");
    expect("philox4x32 on the device: Random123's known answer at 0", kat, "wrong words");
    tgm_cuda_free(CX, dc);
    tgm_cuda_free(CX, dk);
    tgm_cuda_free(CX, dout);
  }
  const int64_t ns[] = {1, 1000, 70001, (1 << 20) + 3};
  const double ps[] = {0, 0.5, 0.1, 0.9, 1, 1.0 / 3};
  const uint64_t seeds[][3] = {{0, 0, 0}, {((uint64_t)1 << 32) + 1234, 3, ((uint64_t)1 << 32) + 7},
                               {0xdeadbeefcafef00dull, 0xffffffffu, 123456789}};
  int which = 0;
  for (int dt = 0; dt < 3; dt++)
    for (int64_t n : ns)
      for (double p : ps) {
        const uint64_t *sd = seeds[which++ % 3];
        uint64_t seed = sd[0], step = sd[2];
        uint32_t ordinal = (uint32_t)sd[1];
        Tensor x, y;
        x.alloc(dt, {n});
        x.v.resize((size_t)n);
        for (auto &v : x.v)
          v = round_dt(dt, (rng_next() & 1 ? -1 : 1) * urand(0.25, 4));
        x.upload();
        out_tensor(y, dt, {n});
        char lab[200];
        snprintf(lab, sizeof lab, "dropout %s n=%lld p=%g seed=%llx ord=%u step=%llu", DTN[dt], (long long)n, p,
                 (unsigned long long)seed, ordinal, (unsigned long long)step);
        if (!ran(lab, tgm_cuda_dropout(CX, dt, x.d, y.d, n, p, seed, ordinal, step)))
          continue;
        Vals ref((size_t)n);
        float s = (float)(1.0 / (1.0 - p));
        for (int64_t j = 0; j < n; j++)
          ref[j] = ref_kept(j, p, seed, ordinal, step) ? round_dt(dt, (double)((float)x.v[j] * s)) : 0.0;
        Vals got = y.download();
        int64_t mism = 0;
        for (int64_t j = 0; j < n; j++)
          mism += (got[j] != 0) != (ref[j] != 0);
        expect(std::string(lab) + " mask", mism == 0, std::to_string(mism) + " elements differ");
        compare(std::string(lab) + " values", got, ref, 0);
        std::vector<unsigned char> first = raw_bytes(y);
        bool plus0 = true;
        for (int64_t j = 0; j < n; j++)
          if (ref[j] == 0)
            for (int b = 0; b < ESZ[dt]; b++)
              plus0 &= first[(size_t)j * ESZ[dt] + b] == 0;
        expect(std::string(lab) + " dropped are +0", plus0, "a dropped element is not +0");
        if (ran(std::string(lab) + " in place", tgm_cuda_dropout(CX, dt, x.d, x.d, n, p, seed, ordinal, step)))
          expect(std::string(lab) + " in place: the same bits", raw_bytes(x) == first, "the bits differ");
      }
  { /* the boundary of u >= p */
    const int64_t m = 64;
    Tensor x, y;
    x.alloc(TGM_F32, {m});
    x.v.assign((size_t)m, 1.0);
    x.upload();
    out_tensor(y, TGM_F32, {m});
    int bad_keep = 0, bad_drop = 0, rc = 0;
    for (int64_t j = 0; j < m; j++) {
      uint32_t key[2] = {99, 5 ^ 2u}, ctr[4] = {(uint32_t)j, 0, 3, 0}, r[4];
      tgm_philox4x32(ctr, key, r);
      double u = ((double)(r[0] >> 8) + 0.5) * (1.0 / 16777216.0);
      rc |= tgm_cuda_dropout(CX, TGM_F32, x.d, y.d, m, u, ((uint64_t)5 << 32) + 99, 2, 3);
      bad_keep += y.download()[j] == 0;
      rc |= tgm_cuda_dropout(CX, TGM_F32, x.d, y.d, m, nextafter(u, 2.0), ((uint64_t)5 << 32) + 99, 2, 3);
      bad_drop += y.download()[j] != 0;
    }
    expect("dropout: p = u keeps, the next double above drops", rc == 0 && bad_keep == 0 && bad_drop == 0,
           "rc " + std::to_string(rc) + ", " + std::to_string(bad_keep) + " not kept, " + std::to_string(bad_drop) +
               " not dropped");
  }
}

/* The cases below; mma_sync: on Hopper, the flash cases (bf16/f16, D = 64) again with k_flash_fwd and
 * k_flash_bwd, where k_flash_fwd_h and k_flash_bwd_h run (the kernels of other GPUs). */
static void attention_cases(bool mma_sync) {
  struct Case {
    Shape q, k, v;
  };
  const Case cases[] = {{{2, 3, 17, 8}, {2, 3, 17, 8}, {2, 3, 17, 8}},
                        {{2, 3, 5, 16}, {2, 3, 19, 16}, {2, 3, 19, 12}},
                        {{2, 3, 11, 8}, {1, 3, 13, 8}, {2, 1, 13, 8}},
                        {{9, 4}, {9, 4}, {9, 6}},
                        {{1, 2, 4, 16}, {1, 2, 1500, 16}, {1, 2, 1500, 16}},
                        {{3, 1, 7, 64}, {3, 4, 7, 64}, {3, 4, 7, 64}},
                        {{2, 33, 32}, {2, 40, 32}, {2, 40, 32}},
                        /* bf16/f16 with head dim 64 or 128: flash attention (k_flash_fwd: blocks of 128 query
                         * rows at D = 64, 64 at D = 128; on Hopper at D = 64 k_flash_fwd_h: blocks of 64; key
                         * tiles of 64 in both) */
                        {{2, 2, 100, 64}, {2, 2, 100, 64}, {2, 2, 100, 64}},
                        {{2, 1, 257, 64}, {2, 1, 257, 64}, {2, 1, 257, 64}},
                        {{1, 2, 200, 64}, {1, 2, 130, 64}, {1, 2, 130, 64}},
                        {{1, 3, 64, 64}, {1, 3, 64, 64}, {1, 3, 64, 64}},
                        {{2, 2, 70, 64}, {1, 2, 200, 64}, {2, 1, 200, 64}},
                        {{1, 2, 130, 128}, {1, 2, 90, 128}, {1, 2, 90, 128}},
                        {{3, 1, 1, 64}, {3, 1, 300, 64}, {3, 1, 300, 64}},
                        /* three batch dims that do not collapse: flash's host loop over the first */
                        {{2, 1, 3, 70, 64}, {1, 2, 3, 70, 64}, {2, 2, 1, 70, 64}}};
  const int dts[] = {TGM_F32, TGM_BF16, TGM_F16};
  for (int dt : dts)
    for (int causal = 0; causal < 2; causal++)
      for (const Case &c : cases) {
        int rq = (int)c.q.size(), rk = (int)c.k.size(), rv = (int)c.v.size();
        int64_t Tq = c.q[rq - 2], D = c.q[rq - 1], Tk = c.k[rk - 2], Dv = c.v[rv - 1];
        if (mma_sync && (dt == TGM_F32 || D != 64))
          continue;
        Shape bq(c.q.begin(), c.q.end() - 2), bk(c.k.begin(), c.k.end() - 2), bv(c.v.begin(), c.v.end() - 2);
        Shape batch = bshape(bshape(bq, bk), bv), ys = batch;
        ys.push_back(Tq);
        ys.push_back(Dv);
        Tensor q, k, v, y, lse, dy, lse_in, delta, dq, dk, dv;
        rand_tensor(q, dt, c.q, -1, 1);
        rand_tensor(k, dt, c.k, -1, 1);
        rand_tensor(v, dt, c.v, -1, 1);
        rand_tensor(dy, dt, ys, -1, 1);
        out_tensor(y, dt, ys);
        Shape rows = batch;
        rows.push_back(Tq);
        out_tensor(lse, TGM_F32, rows);
        double scale = 1.0 / sqrt((double)D);
        std::string label = std::string("attention ") + DTN[dt] + (causal ? " causal " : " ") + shape_str(c.q) +
                            shape_str(c.k) + shape_str(c.v) + (mma_sync ? " (mma.sync)" : "");
        tgm_view vq = view_at(q.d, c.q), vk = view_at(k.d, c.k), vv = view_at(v.d, c.v), vy = view_at(y.d, ys);
        if (!ran(label, tgm_cuda_attention(CX, dt, &vq, &vk, &vv, &vy, causal, scale, (float *)lse.d)))
          continue;
        /* the reference forward (y, lse) and backward (dq, dk, dv over the result's batch dims, from dy and
         * delta = rowsum(dy * y), the f32 delta the call gets) */
        int64_t nb = numel(batch);
        Vals ref(nb * Tq * Dv), rlse(nb * Tq), rdelta(nb * Tq), rdq(nb * Tq * D, 0.0), rdk(nb * Tk * D, 0.0);
        Vals rdv(nb * Tk * Dv, 0.0), s(Tk), P(Tq * Tk);
        for (int64_t t = 0; t < nb; t++) {
          const double *Q = &q.v[bidx(batch, t, bq) * Tq * D], *K = &k.v[bidx(batch, t, bk) * Tk * D];
          const double *V = &v.v[bidx(batch, t, bv) * Tk * Dv], *DY = &dy.v[t * Tq * Dv];
          for (int64_t i = 0; i < Tq; i++) {
            double m = -INFINITY, sum = 0, dl = 0;
            for (int64_t j = 0; j < Tk; j++) {
              double dot = 0;
              for (int64_t d = 0; d < D; d++)
                dot += Q[i * D + d] * K[j * D + d];
              s[j] = causal && j > i ? -INFINITY : scale * dot;
              m = std::max(m, s[j]);
            }
            for (int64_t j = 0; j < Tk; j++)
              sum += (s[j] = exp(s[j] - m));
            rlse[t * Tq + i] = m + log(sum);
            for (int64_t j = 0; j < Tk; j++)
              P[i * Tk + j] = s[j] / sum;
            for (int64_t e = 0; e < Dv; e++) {
              double acc = 0;
              for (int64_t j = 0; j < Tk; j++)
                acc += P[i * Tk + j] * V[j * Dv + e];
              ref[(t * Tq + i) * Dv + e] = acc;
              dl += DY[i * Dv + e] * acc;
            }
            rdelta[t * Tq + i] = (double)(float)dl;
          }
          for (int64_t i = 0; i < Tq; i++)
            for (int64_t j = 0; j < Tk; j++) {
              double p = P[i * Tk + j], dp = 0;
              for (int64_t e = 0; e < Dv; e++) {
                dp += DY[i * Dv + e] * V[j * Dv + e];
                rdv[(t * Tk + j) * Dv + e] += p * DY[i * Dv + e];
              }
              double ds = p * (dp - rdelta[t * Tq + i]);
              for (int64_t d = 0; d < D; d++) {
                rdq[(t * Tq + i) * D + d] += scale * ds * K[j * D + d];
                rdk[(t * Tk + j) * D + d] += scale * ds * Q[i * D + d];
              }
            }
        }
        compare(label, y.download(), ref, tol_for(dt, true));
        compare(label + " lse", lse.download(), rlse, 1e-4);
        /* the backward from the reference lse and delta (each output alone too, for the flash kernels' split) */
        lse_in.alloc(TGM_F32, rows);
        lse_in.v = rlse;
        lse_in.upload();
        delta.alloc(TGM_F32, rows);
        delta.v = rdelta;
        delta.upload();
        Shape qs = batch, ks = batch, vs = batch;
        qs.insert(qs.end(), {Tq, D});
        ks.insert(ks.end(), {Tk, D});
        vs.insert(vs.end(), {Tk, Dv});
        out_tensor(dq, dt, qs);
        out_tensor(dk, dt, ks);
        out_tensor(dv, dt, vs);
        double gt = dt == TGM_F32 ? 1e-4 : tol_for(dt, true);
        for (int only = -1; only < 3; only += (causal ? 4 : 1)) { /* all three, then each alone (not causal) */
          std::string bl = label + " backward" + (only < 0 ? "" : only == 0 ? " dq only" : only == 1 ? " dk only" : " dv only");
          void *pq = only < 0 || only == 0 ? dq.d : NULL, *pk = only < 0 || only == 1 ? dk.d : NULL;
          void *pv = only < 0 || only == 2 ? dv.d : NULL;
          tgm_view vdy = view_at(dy.d, ys), vdq = view_at(pq, qs), vdk = view_at(pk, ks), vdv = view_at(pv, vs);
          if (!ran(bl, tgm_cuda_attention_backward(CX, dt, &vq, &vk, &vv, &vdy, (const float *)lse_in.d,
                                                   (const float *)delta.d, &vdq, &vdk, &vdv, causal, scale)))
            continue;
          if (pq)
            compare(bl + " dq", dq.download(), rdq, gt);
          if (pk)
            compare(bl + " dk", dk.download(), rdk, gt);
          if (pv)
            compare(bl + " dv", dv.download(), rdv, gt);
        }
      }
}

static void test_attention(void) {
  attention_cases(false);
  if (CX->hopper) {
    flash_mma_sync = true;
    attention_cases(true);
    flash_mma_sync = false;
  }
}

/* ---------------------------------------------------------------- attention on strided views */

/* The element offsets of a view of shape s, strides st, starting at element off, in its row-major order. */
static std::vector<int64_t> view_offsets(int64_t off, const Shape &s, const Shape &st) {
  std::vector<int64_t> r((size_t)numel(s));
  for (int64_t i = 0; i < (int64_t)r.size(); i++) {
    int64_t o = off, j = i;
    for (int k = (int)s.size() - 1; k >= 0; k--) {
      o += j % s[k] * st[k];
      j /= s[k];
    }
    r[(size_t)i] = o;
  }
  return r;
}

/* A contiguous device copy of the view (off, s, st) of t's values. */
static void gather(Tensor &c, const Tensor &t, int64_t off, const Shape &s, const Shape &st) {
  c.alloc(t.dt, s);
  c.v.clear();
  for (int64_t o : view_offsets(off, s, st))
    c.v.push_back(t.v[(size_t)o]);
  c.upload();
}

/* The values of the view (off, s, st) in raw, the bytes of a buffer of dtype
 * dt; marks its elements in m. */
static Vals view_vals(const std::vector<unsigned char> &raw, int dt, int64_t off, const Shape &s, const Shape &st,
                      std::vector<char> &m) {
  Vals r;
  for (int64_t o : view_offsets(off, s, st)) {
    r.push_back(get(dt, raw.data(), o));
    m[(size_t)o] = 1;
  }
  return r;
}

/* Whether every element of raw (es bytes each) that m does not mark still
 * holds Tensor::alloc's junk (bytes 0xA5). */
static bool junk_kept(const std::vector<unsigned char> &raw, int es, const std::vector<char> &m) {
  for (size_t i = 0; i < m.size(); i++)
    for (int e = 0; !m[i] && e < es; e++)
      if (raw[i * es + e] != 0xA5)
        return false;
  return true;
}

/* Element off of t's device buffer. */
static void *elem(const Tensor &t, int64_t off) { return (char *)t.d + off * ESZ[t.dt]; }

/* Strided views against contiguous copies (test_cpu_kernels.c's
 * test_attention_views on the device): q, k, v are views into one buffer
 * laid out as GPT-2's packed qkv, [B, T, 3, H, D] (q(b, h, t, d) at ((b T +
 * t) 3 + 0) H D + h D + d, k one H D further, v two), with `pad` spare
 * elements after each token (0: GPT-2's layout); y and dy are views into [B,
 * T, H, D] (+ pad), dq, dk, dv are written into one packed [B, T, 3, H, D]
 * (+ pad). kv 1: k and v read batch 0 for every batch (batch stride 0); kv
 * 2: k, v shaped [H, T, D] (a missing batch dim). The results must match the
 * same call on contiguous copies within the tolerances (flash gives the same
 * bits; cuBLAS may take other algorithms for other leading dims), and the
 * elements of the result buffers outside the views written (the pads, dk's
 * slot when only dq and dv are wanted) keep their junk. bf16/f16 with D 64
 * or 128 and rows of whole 16 bytes take the flash kernels; pad 4 (rows of 8
 * bytes more), other head dims and f32 the materialised path. Then no keys
 * or no queries: zeros through views, nothing else written. */
static void test_attention_views(void) {
  struct Case {
    int dt;
    int64_t B, H, T, D, pad;
    int kv;
  };
  const Case cases[] = {{TGM_BF16, 2, 3, 100, 64, 0, 0}, {TGM_BF16, 2, 2, 70, 128, 8, 0},
                        {TGM_BF16, 3, 2, 130, 64, 0, 1}, {TGM_F16, 2, 3, 100, 64, 8, 2},
                        {TGM_F16, 1, 2, 200, 128, 0, 1}, {TGM_BF16, 2, 2, 70, 64, 4, 0},
                        {TGM_BF16, 2, 2, 50, 32, 0, 2},  {TGM_F32, 2, 3, 100, 64, 0, 0},
                        {TGM_F32, 2, 2, 70, 32, 5, 1},   {TGM_F32, 2, 2, 90, 16, 3, 2}};
  for (const Case &c : cases)
    for (int causal = 0; causal < 2; causal++) {
      const int dt = c.dt, es = ESZ[dt];
      const int64_t B = c.B, H = c.H, T = c.T, D = c.D, HD = H * D, rw = 3 * HD + c.pad, yw = HD + c.pad;
      const int64_t nq = B * T * rw, ny = B * T * yw, nl = B * H * T;
      const Shape s4 = {B, H, T, D}, pst = {T * rw, D, rw, 1}, yst = {T * yw, D, yw, 1};
      const Shape kvs = c.kv == 2 ? Shape{H, T, D} : s4;
      const Shape kst = c.kv == 2 ? Shape{D, rw, 1} : Shape{c.kv ? 0 : T * rw, D, rw, 1};
      const double scale = 1.0 / sqrt((double)D);
      char lab[160];
      snprintf(lab, sizeof lab, "attention views %s%s B=%lld H=%lld T=%lld D=%lld pad=%lld kv=%d", DTN[dt],
               causal ? " causal" : "", (long long)B, (long long)H, (long long)T, (long long)D, (long long)c.pad, c.kv);
      const std::string label = lab;
      Tensor qkv, dyb, yb, gb, cq, ck, cv, cdy, cy, clse, slse, delta, cg[3];
      rand_tensor(qkv, dt, {nq}, -1, 1);
      rand_tensor(dyb, dt, {ny}, -1, 1);
      out_tensor(yb, dt, {ny});
      out_tensor(gb, dt, {nq});
      gather(cq, qkv, 0, s4, pst);
      gather(ck, qkv, HD, kvs, kst);
      gather(cv, qkv, 2 * HD, kvs, kst);
      gather(cdy, dyb, 0, s4, yst);
      out_tensor(cy, dt, s4);
      out_tensor(clse, TGM_F32, {nl});
      out_tensor(slse, TGM_F32, {nl});
      tgm_view vq = view_at(qkv.d, s4, pst), vk = view_at(elem(qkv, HD), kvs, kst);
      tgm_view vv = view_at(elem(qkv, 2 * HD), kvs, kst), vy = view_at(yb.d, s4, yst), vdy = view_at(dyb.d, s4, yst);
      tgm_view wq = view_at(cq.d, s4), wk = view_at(ck.d, kvs), wv = view_at(cv.d, kvs), wy = view_at(cy.d, s4);
      tgm_view wdy = view_at(cdy.d, s4);
      if (!ran(label + " (contiguous)", tgm_cuda_attention(CX, dt, &wq, &wk, &wv, &wy, causal, scale, (float *)clse.d)) ||
          !ran(label, tgm_cuda_attention(CX, dt, &vq, &vk, &vv, &vy, causal, scale, (float *)slse.d)))
        continue;
      std::vector<unsigned char> raw = raw_bytes(yb);
      std::vector<char> m((size_t)ny, 0);
      Vals ry = cy.download(), rlse = clse.download();
      compare(label + " y", view_vals(raw, dt, 0, s4, yst, m), ry, tol_for(dt, true));
      compare(label + " lse", slse.download(), rlse, 1e-4);
      expect(label + " y: nothing written outside its view", junk_kept(raw, es, m), "a pad element was written");
      /* the backward from the contiguous call's lse and delta = rowsum(dy * y) in f32 */
      delta.alloc(TGM_F32, {nl});
      delta.v.assign((size_t)nl, 0.0);
      for (int64_t i = 0; i < nl * D; i++)
        delta.v[(size_t)(i / D)] += cdy.v[(size_t)i] * ry[(size_t)i];
      for (double &x : delta.v)
        x = (double)(float)x;
      delta.upload();
      tgm_view wg[3];
      for (int o = 0; o < 3; o++) {
        out_tensor(cg[o], dt, s4);
        wg[o] = view_at(cg[o].d, s4);
      }
      if (!ran(label + " backward (contiguous)",
               tgm_cuda_attention_backward(CX, dt, &wq, &wk, &wv, &wdy, (const float *)clse.d, (const float *)delta.d,
                                           &wg[0], &wg[1], &wg[2], causal, scale)))
        continue;
      Vals rg[3] = {cg[0].download(), cg[1].download(), cg[2].download()};
      const char *gn[3] = {" dq", " dk", " dv"};
      for (int want : {7, 5}) { /* all three, then dq and dv (dk's slot keeps its junk) */
        std::string bl = label + (want == 7 ? " backward" : " backward (no dk)");
        tgm_view vg[3];
        cudaMemsetAsync(gb.d, 0xA5, (size_t)nq * es, CX->stream);
        for (int o = 0; o < 3; o++)
          vg[o] = view_at(want >> o & 1 ? elem(gb, o * HD) : NULL, s4, pst);
        if (!ran(bl, tgm_cuda_attention_backward(CX, dt, &vq, &vk, &vv, &vdy, (const float *)clse.d,
                                                 (const float *)delta.d, &vg[0], &vg[1], &vg[2], causal, scale)))
          continue;
        raw = raw_bytes(gb);
        m.assign((size_t)nq, 0);
        for (int o = 0; o < 3; o++)
          if (want >> o & 1)
            compare(bl + gn[o], view_vals(raw, dt, o * HD, s4, pst, m), rg[o], dt == TGM_F32 ? 1e-4 : tol_for(dt, true));
        expect(bl + ": nothing written outside the views", junk_kept(raw, es, m), "an element outside was written");
      }
    }
  /* no keys (y = 0, lse = -inf; dq = 0) and no queries (dk = dv = 0) */
  for (int dt : {TGM_F32, TGM_BF16}) {
    const int es = ESZ[dt];
    const int64_t B = 2, H = 2, T = 5, D = 8, HD = H * D, rw = 3 * HD + 3, yw = HD + 3, nq = B * T * rw;
    const int64_t ny = B * T * yw, nl = B * H * T;
    const Shape s4 = {B, H, T, D}, s0 = {B, H, 0, D}, pst = {T * rw, D, rw, 1}, yst = {T * yw, D, yw, 1};
    Tensor qkv, dyb, yb, gb, lse, delta;
    rand_tensor(qkv, dt, {nq}, -1, 1);
    rand_tensor(dyb, dt, {ny}, -1, 1);
    out_tensor(yb, dt, {ny});
    out_tensor(gb, dt, {nq});
    out_tensor(lse, TGM_F32, {nl});
    rand_tensor(delta, TGM_F32, {nl}, -1, 1);
    tgm_view vq = view_at(qkv.d, s4, pst), vk = view_at(elem(qkv, HD), s4, pst);
    tgm_view vv = view_at(elem(qkv, 2 * HD), s4, pst), vq0 = view_at(qkv.d, s0, pst);
    tgm_view vk0 = view_at(elem(qkv, HD), s0, pst), vv0 = view_at(elem(qkv, 2 * HD), s0, pst);
    tgm_view vy = view_at(yb.d, s4, yst), vdy = view_at(dyb.d, s4, yst), vdy0 = view_at(dyb.d, s0, yst);
    tgm_view vg[3], vg0[3];
    for (int o = 0; o < 3; o++) {
      vg[o] = view_at(elem(gb, o * HD), s4, pst);
      vg0[o] = view_at(elem(gb, o * HD), s0, pst);
    }
    std::string label = std::string("attention views ") + DTN[dt] + " no keys";
    if (ran(label, tgm_cuda_attention(CX, dt, &vq, &vk0, &vv0, &vy, 0, 0.5, (float *)lse.d))) {
      std::vector<unsigned char> raw = raw_bytes(yb);
      std::vector<char> m((size_t)ny, 0);
      compare(label + " y", view_vals(raw, dt, 0, s4, yst, m), Vals((size_t)(B * H * T * D), 0.0), 0);
      compare(label + " lse", lse.download(), Vals((size_t)nl, -INFINITY), 0);
      expect(label + " y: nothing written outside its view", junk_kept(raw, es, m), "a pad element was written");
    }
    label = std::string("attention views ") + DTN[dt] + " backward no keys";
    if (ran(label, tgm_cuda_attention_backward(CX, dt, &vq, &vk0, &vv0, &vdy, (const float *)lse.d,
                                               (const float *)delta.d, &vg[0], &vg0[1], &vg0[2], 0, 0.5))) {
      std::vector<unsigned char> raw = raw_bytes(gb);
      std::vector<char> m((size_t)nq, 0);
      compare(label + " dq", view_vals(raw, dt, 0, s4, pst, m), Vals((size_t)(B * H * T * D), 0.0), 0);
      expect(label + ": nothing written outside dq", junk_kept(raw, es, m), "an element outside was written");
    }
    cudaMemsetAsync(gb.d, 0xA5, (size_t)nq * es, CX->stream);
    label = std::string("attention views ") + DTN[dt] + " backward no queries";
    if (ran(label, tgm_cuda_attention_backward(CX, dt, &vq0, &vk, &vv, &vdy0, (const float *)lse.d,
                                               (const float *)delta.d, &vg0[0], &vg[1], &vg[2], 1, 0.5))) {
      std::vector<unsigned char> raw = raw_bytes(gb);
      std::vector<char> m((size_t)nq, 0);
      compare(label + " dk", view_vals(raw, dt, HD, s4, pst, m), Vals((size_t)(B * H * T * D), 0.0), 0);
      compare(label + " dv", view_vals(raw, dt, 2 * HD, s4, pst, m), Vals((size_t)(B * H * T * D), 0.0), 0);
      expect(label + ": nothing written outside dk, dv", junk_kept(raw, es, m), "an element outside was written");
    }
  }
}

/* ---------------------------------------------------------------- errors */

/* fill: every dtype, exact against the host conversions. */
static void test_fill(void) {
  const double vals[] = {1.5, -3.0, 0.0, 2.9, 1.0 / 3.0, 70000.0};
  for (int dt = 0; dt < 5; dt++)
    for (double v : vals) {
      if (dt == TGM_BOOL && v != 0 && v != 1.5)
        continue;
      const int64_t n = 1001;
      Tensor y;
      out_tensor(y, dt, {n});
      char lab[160];
      snprintf(lab, sizeof lab, "fill %s %g", DTN[dt], v);
      if (!ran(lab, tgm_cuda_fill(CX, dt, y.d, n, v)))
        continue;
      double r = dt == TGM_I32 ? trunc(v) : round_dt(dt, v);
      compare(lab, y.download(), Vals(n, r), 0);
    }
}

/* tgm_max and tgm_min on the device (PTX max.NaN, min.NaN from sm_80 on) against their selects on the host:
 * NaN in either operand gives NaN, infinities and ordinary values the larger (smaller); only the sign of a zero
 * result may differ (compared as equal). */
__global__ void k_maxmin(const float *a, const float *b, float *mx, float *mn, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    mx[i] = tgm_max(a[i], b[i]), mn[i] = tgm_min(a[i], b[i]);
}
static float host_max(float a, float b) { return (b > a) || (b != b) ? b : a; }
static float host_min(float a, float b) { return (b < a) || (b != b) ? b : a; }
static void test_maxmin(void) {
  const float v[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1.0f, -1.0f, 3.5e38f, 1e-45f, -2.5f};
  const int k = sizeof v / sizeof *v, n = k * k;
  std::vector<float> a(n), b(n), mx(n), mn(n);
  for (int i = 0; i < n; i++)
    a[i] = v[i / k], b[i] = v[i % k];
  float *d;
  if (cudaMalloc(&d, 4 * n * sizeof(float)) != cudaSuccess) {
    expect("max/min: device memory", false, "cudaMalloc failed");
    return;
  }
  cudaMemcpy(d, a.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(d + n, b.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  k_maxmin<<<1, 128>>>(d, d + n, d + 2 * n, d + 3 * n, n);
  cudaError_t e = cudaMemcpy(mx.data(), d + 2 * n, n * sizeof(float), cudaMemcpyDeviceToHost);
  if (e == cudaSuccess)
    e = cudaMemcpy(mn.data(), d + 3 * n, n * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(d);
  if (e != cudaSuccess) {
    expect("max/min: the kernel ran", false, cudaGetErrorString(e));
    return;
  }
  Vals gx(n), rx(n), gn(n), rn(n);
  for (int i = 0; i < n; i++)
    gx[i] = mx[i], rx[i] = host_max(a[i], b[i]), gn[i] = mn[i], rn[i] = host_min(a[i], b[i]);
  compare("tgm_max over 11 x 11 pairs (NaN, infinities, zeros, extremes)", gx, rx, 0);
  compare("tgm_min over 11 x 11 pairs (NaN, infinities, zeros, extremes)", gn, rn, 0);
}

/* Bad arguments: a nonzero status and a message naming the function. */
static void test_errors(void) {
  Tensor a, b, y;
  rand_tensor(a, TGM_F32, {3, 4}, -1, 1);
  rand_tensor(b, TGM_F32, {5}, -1, 1);
  out_tensor(y, TGM_F32, {3, 4});
  const int64_t sa[] = {3, 4};
  int rc = tgm_cuda_cast(CX, TGM_F32, 9, a.d, y.d, 12);
  std::string msg = tgm_cuda_ctx_error(CX);
  expect("error: cast to an unknown dtype", rc != 0 && msg.find("tgm_cuda_cast") != std::string::npos,
         "rc " + std::to_string(rc) + ", message '" + msg + "'");
  rc = tgm_cuda_dropout(CX, TGM_I32, a.d, y.d, 12, 0.5, 1, 0, 0);
  msg = tgm_cuda_ctx_error(CX);
  expect("error: dropout on i32", rc != 0 && msg.find("i32") != std::string::npos, "rc " + std::to_string(rc));
  const int64_t sq[] = {2, 3};
  rc = tgm_cuda_matmul(CX, TGM_F32, a.d, 2, sa, b.d, 2, sq, y.d, 2, sa);
  expect("error: matmul with mismatched K", rc != 0, "rc " + std::to_string(rc));
  /* attention's views: a last-dim stride other than 1, a row stride below the row, batch dims that do not
   * broadcast, a result of another shape; each refused with a message naming the tensor */
  const Shape s3 = {2, 3, 4};
  tgm_view good = view_at(a.d, s3), y3 = view_at(y.d, s3), lastst = view_at(a.d, s3, {12, 8, 2});
  tgm_view rowst = view_at(a.d, s3, {12, 3, 1}), badb = view_at(a.d, {3, 3, 4}), dq2 = view_at(y.d, {2, 3, 5});
  struct {
    const char *what, *needle;
    const tgm_view *q, *k, *y, *dq;
  } bad[] = {{"error: attention with q's last stride 2", "q: the last dim's stride is 2", &lastst, &good, &y3, NULL},
             {"error: attention with k's row stride below its row", "k: the row stride 3", &good, &rowst, &y3, NULL},
             {"error: attention with batch dims that do not broadcast", "k: batch dim 0 is 3", &good, &badb, &y3, NULL},
             {"error: attention_backward with dq of another shape", "dq: its last dims [3, 5]", &good, &good, &y3,
              &dq2}};
  for (const auto &c : bad) {
    rc = c.dq ? tgm_cuda_attention_backward(CX, TGM_F32, c.q, c.k, &good, c.y, (const float *)b.d,
                                            (const float *)b.d, c.dq, NULL, NULL, 0, 0.5)
              : tgm_cuda_attention(CX, TGM_F32, c.q, c.k, &good, c.y, 0, 0.5, NULL);
    msg = tgm_cuda_ctx_error(CX);
    expect(c.what, rc != 0 && msg.find(c.needle) != std::string::npos,
           "rc " + std::to_string(rc) + ", message '" + msg + "'");
  }
  rc = tgm_cuda_sync(CX);
  expect("error: the context still works after refused calls", rc == 0, tgm_cuda_ctx_error(CX));
}

int main(int argc, char **argv) {
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    printf("SKIP: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  char err[256];
  if (tgm_cuda_ctx_create(&CX, err, sizeof err)) {
    printf("FAIL: tgm_cuda_ctx_create: %s\n", err);
    return 1;
  }
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  const char *only = argc > 1 ? argv[1] : NULL; /* optional: run only the group with this name */
  struct Group {
    const char *name;
    void (*fn)(void);
  };
  const Group groups_[] = {{"cast", test_cast},
                           {"fill", test_fill},
                           {"matmul", test_matmul},
                           {"linear", test_linear},
                           {"embedding", test_embedding},
                           {"embedding_backward", test_embedding_backward},
                           {"dropout", test_dropout},
                           {"timing", test_timing},
                           {"attention_timing", test_attention_timing},
                           {"attention", test_attention},
                           {"attention_views", test_attention_views},
                           {"maxmin", test_maxmin},
                           {"errors", test_errors}};
  for (const Group &g : groups_)
    if (!only || !strcmp(only, g.name))
      g.fn();
  tgm_cuda_ctx_destroy(CX);
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
