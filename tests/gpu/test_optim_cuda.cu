/* test_optim_cuda.cu: the optimizer step of templates/runtime/tgm_optim_cuda.cu
 * (tgm_cuda_adamw, tgm_cuda_sgd, tgm_cuda_sum_squares) against PyTorch, with
 * the cases and expected values of tests/unit/optim_golden.h (printed by
 * tests/unit/make_optim_golden.py from torch.optim.AdamW / SGD and
 * torch.nn.utils.clip_grad_norm_), as tests/unit/test_optim.c checks the CPU.
 *
 * Each case runs at its size (19) and tiled to 19 x 50003 elements (a grid
 * that strides); the clip factor comes from tgm_cuda_sum_squares and the
 * CPU's tgm_clip_factor. Then: the copies agree bit for bit with the CPU
 * kernels' (tgm_optim_cpu.c) on random data; sum_squares is bit-identical
 * across runs, agrees with a long double sum, works for small and empty
 * inputs; bad arguments are refused with a message and leave the context
 * usable.
 *
 * Tolerance (f32 state): |got - want| <= 1e-6 |want| + 1e-7 max |want| over
 * the tensor; the bf16/f16 copy must be the round-to-nearest-even of the
 * weights (tgm_f32_to_bf16 / _f16) bit for bit and within one ulp of torch's.
 *
 * Exit status: 0 all passed, 1 some failed, 77 no CUDA device (skip).
 * Build: tests/gpu/build_and_run_optim.sh. */
#include "../../templates/runtime/tgm_cuda.cu"
#include "../../templates/runtime/tgm_optim_cuda.cu"
#include "../../templates/runtime/tgm_init.c"
/* The CPU kernels, for tgm_clip_factor and the CPU-vs-CUDA comparison (C
 * compiled as C++ here: `restrict` is C-only). */
#define restrict __restrict__
#include "../../templates/runtime/tgm_optim_cpu.c"
#undef restrict

#include "../unit/optim_golden.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

static tgm_cuda_ctx *CX;
static int n_pass, n_fail;
static double worst_rel;

static void check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char *fmt, ...) {
  if (ok) {
    n_pass++;
    return;
  }
  n_fail++;
  va_list ap;
  va_start(ap, fmt);
  printf("FAIL: ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
}

#define CK(call)                                                                                                       \
  do {                                                                                                                 \
    cudaError_t e_ = (call);                                                                                           \
    if (e_ != cudaSuccess) {                                                                                           \
      printf("FAIL: %s: %s\n", #call, cudaGetErrorString(e_));                                                         \
      exit(1);                                                                                                         \
    }                                                                                                                  \
  } while (0)

/* A device buffer filled from / read back into a host vector. */
template <class T> struct Dev {
  T *d = nullptr;
  size_t n = 0;
  explicit Dev(size_t n_) : n(n_) { CK(cudaMalloc((void **)&d, sizeof(T) * (n ? n : 1))); }
  ~Dev() { cudaFree(d); }
  Dev(const Dev &) = delete;
  Dev &operator=(const Dev &) = delete;
  void put(const std::vector<T> &h) { CK(cudaMemcpy(d, h.data(), sizeof(T) * n, cudaMemcpyHostToDevice)); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    CK(cudaMemcpy(h.data(), d, sizeof(T) * n, cudaMemcpyDeviceToHost));
    return h;
  }
};

static bool close_arr(const std::vector<float> &got, const float *want, int nw) {
  double mx = 0;
  for (int i = 0; i < nw; i++)
    mx = std::fmax(mx, std::fabs(want[i]));
  bool ok = true;
  for (size_t i = 0; i < got.size(); i++) {
    double wv = want[i % nw], d = std::fabs((double)got[i] - wv), tol = 1e-6 * std::fabs(wv) + 1e-7 * mx;
    if (!(d <= tol)) {
      if (ok)
        printf("  element %zu: got %.9g, want %.9g (diff %.3g, tol %.3g)\n", i, got[i], wv, d, tol);
      ok = false;
    }
    if (tol > 0 && d / tol > worst_rel)
      worst_rel = d / tol;
  }
  return ok;
}

static uint16_t f32_to_low(int dt, float f) { return dt == TGM_BF16 ? tgm_f32_to_bf16(f) : tgm_f32_to_f16(f); }

static bool low_ok(int dt, const std::vector<uint16_t> &low, const std::vector<float> &w, const uint16_t *want,
                   int nw) {
  bool ok = true;
  for (size_t i = 0; i < low.size(); i++) {
    uint16_t mine = f32_to_low(dt, w[i]), t = want[i % nw];
    bool adj = ((mine ^ t) & 0x8000u) == 0 && std::abs((int)(mine & 0x7fff) - (int)(t & 0x7fff)) <= 1;
    if (low[i] != mine || !adj) {
      if (ok)
        printf("  element %zu: copy 0x%04x, rounding of w 0x%04x, torch's 0x%04x\n", i, low[i], mine, t);
      ok = false;
    }
  }
  return ok;
}

static void run_case(const Case *c, int tile) {
  const int N = GOLD_N;
  size_t n = (size_t)N * tile;
  int es = c->gdt == TGM_F32 ? 4 : 2;
  std::vector<float> w(n), s1(n, 0.0f);
  for (size_t i = 0; i < n; i++)
    w[i] = c->w0[i % N];
  if (!c->adamw) /* SGD's first step must not read the momentum buffer */
    std::fill(s1.begin(), s1.end(), 7.0f);
  Dev<float> dw(n), ds1(n), ds2(n);
  Dev<uint16_t> dlow(n);
  Dev<unsigned char> dg(n * es);
  dw.put(w);
  ds1.put(s1);
  ds2.put(std::vector<float>(n, 0.0f));
  bool sgd_nomom = !c->adamw && c->momentum == 0;
  for (int t = 0; t < GOLD_STEPS; t++) {
    std::vector<unsigned char> g(n * es);
    for (size_t i = 0; i < n; i++)
      memcpy(&g[i * es], es == 4 ? (const void *)&c->g[t][i % N] : (const void *)&c->gbits[t][i % N], es);
    dg.put(g);
    char what[160];
    snprintf(what, sizeof what, "%s x%d step %d", c->name, tile, t + 1);
    double scale = c->scale;
    if (c->max_norm > 0) {
      double ss = -1;
      int rc = tgm_cuda_sum_squares(CX, dg.d, c->gdt, N, &ss); /* over one copy, as torch's */
      check(rc == 0, "%s: sum_squares: %s", what, tgm_cuda_ctx_error(CX));
      scale = tgm_clip_factor(ss, c->max_norm);
      check(std::fabs(scale - c->scales[t]) <= 1e-6 * c->scales[t], "%s: clip factor %.9g, torch %.9g", what, scale,
            c->scales[t]);
    }
    void *lowp = c->lowdt >= 0 ? dlow.d : NULL;
    int rc = c->adamw ? tgm_cuda_adamw(CX, dw.d, dg.d, c->gdt, ds1.d, ds2.d, lowp, c->lowdt, (int64_t)n, c->lr,
                                       c->beta1, c->beta2, c->eps, c->wd, t + 1, scale)
                      : tgm_cuda_sgd(CX, dw.d, dg.d, c->gdt, sgd_nomom ? NULL : ds1.d, lowp, c->lowdt, (int64_t)n,
                                     c->lr, c->momentum, c->wd, t + 1, scale);
    if (rc == 0)
      rc = tgm_cuda_sync(CX);
    check(rc == 0, "%s: %s", what, tgm_cuda_ctx_error(CX));
    if (rc)
      return;
    std::vector<float> gw = dw.get();
    check(close_arr(gw, c->w[t], N), "%s: weights", what);
    if (!sgd_nomom)
      check(close_arr(ds1.get(), c->s1[t], N), "%s: %s", what, c->adamw ? "exp_avg" : "momentum_buffer");
    if (c->adamw)
      check(close_arr(ds2.get(), c->s2[t], N), "%s: exp_avg_sq", what);
    if (c->lowdt >= 0)
      check(low_ok(c->lowdt, dlow.get(), gw, c->low[t], N), "%s: %s copy", what,
            c->lowdt == TGM_BF16 ? "bf16" : "f16");
  }
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnext() { /* splitmix64 */
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static float runif(float lo, float hi) { return lo + (hi - lo) * (float)((double)(rnext() >> 11) / 9007199254740992.0); }

/* CUDA against the CPU kernels on random data: the copies bit for bit, the
 * f32 state within the tolerance (multiply-add contraction may differ). */
static void test_vs_cpu() {
  const int64_t n = 300007;
  const int dts[3] = {TGM_F32, TGM_BF16, TGM_F16};
  for (int gi = 0; gi < 3; gi++)
    for (int li = 0; li < 3; li++)
      for (int opt = 0; opt < 3; opt++) { /* adamw, sgd, sgd with momentum */
        int gdt = dts[gi], ldt = dts[li], es = gdt == TGM_F32 ? 4 : 2;
        std::vector<float> w(n), m(n), v(n), g32(n);
        for (int64_t i = 0; i < n; i++) {
          w[i] = runif(-1, 1);
          m[i] = runif(-0.1f, 0.1f);
          v[i] = runif(0, 0.01f);
          g32[i] = runif(-2, 2);
        }
        std::vector<unsigned char> g(n * es);
        for (int64_t i = 0; i < n; i++) {
          if (gdt == TGM_F32) {
            memcpy(&g[i * 4], &g32[i], 4);
          } else {
            uint16_t h = f32_to_low(gdt, g32[i]);
            memcpy(&g[i * 2], &h, 2);
          }
        }
        std::vector<uint16_t> low(n * 2, 0); /* room for an f32 copy */
        Dev<float> dw(n), dm(n), dv(n);
        Dev<unsigned char> dg(n * es);
        Dev<uint16_t> dl(n * 2);
        dw.put(w);
        dm.put(m);
        dv.put(v);
        dg.put(g);
        int rc = 0;
        for (int step = 1; step <= 3 && rc == 0; step++) {
          if (opt == 0) {
            tgm_cpu_adamw(w.data(), g.data(), gdt, m.data(), v.data(), low.data(), ldt, n, 1e-3, 0.9, 0.95, 1e-8, 0.1,
                          step, 0.7);
            rc = tgm_cuda_adamw(CX, dw.d, dg.d, gdt, dm.d, dv.d, dl.d, ldt, n, 1e-3, 0.9, 0.95, 1e-8, 0.1, step, 0.7);
          } else {
            double mom = opt == 2 ? 0.9 : 0.0;
            tgm_cpu_sgd(w.data(), g.data(), gdt, m.data(), low.data(), ldt, n, 1e-2, mom, 0.01, step, 0.7);
            rc = tgm_cuda_sgd(CX, dw.d, dg.d, gdt, dm.d, dl.d, ldt, n, 1e-2, mom, 0.01, step, 0.7);
          }
        }
        if (rc == 0)
          rc = tgm_cuda_sync(CX);
        char what[96];
        snprintf(what, sizeof what, "vs cpu: %s grads %s copy %s", opt == 0 ? "adamw" : opt == 1 ? "sgd" : "sgd mom",
                 dt_name(gdt), dt_name(ldt));
        check(rc == 0, "%s: %s", what, tgm_cuda_ctx_error(CX));
        if (rc)
          continue;
        std::vector<float> gw = dw.get();
        bool ok = true;
        for (int64_t i = 0; i < n && ok; i++)
          ok = std::fabs(gw[i] - w[i]) <= 1e-6 * std::fabs(w[i]) + 1e-7;
        check(ok, "%s: weights", what);
        if (opt != 1) {
          std::vector<float> gm = dm.get();
          ok = true;
          for (int64_t i = 0; i < n && ok; i++)
            ok = std::fabs(gm[i] - m[i]) <= 1e-6 * std::fabs(m[i]) + 1e-7;
          check(ok, "%s: exp_avg / momentum buffer", what);
        }
        /* the copy: the rounding of the CUDA weights, bit for bit */
        std::vector<uint16_t> gl = dl.get();
        ok = true;
        for (int64_t i = 0; i < n && ok; i++) {
          if (ldt == TGM_F32) {
            float f;
            memcpy(&f, &gl[2 * i], 4);
            ok = memcmp(&f, &gw[i], 4) == 0;
          } else {
            ok = gl[i] == f32_to_low(ldt, gw[i]);
          }
        }
        check(ok, "%s: the copy is the rounding of the weights", what);
      }
  /* the bf16/f16 rounding on the device against tgm_init.c's on special values */
  const float sp[] = {0.0f, -0.0f, 1.0f, 65504.0f, 65519.996f, 65520.0f, 1e-8f, -3e-7f, 5.96e-8f, 2.98e-8f,
                      1e38f, INFINITY, -INFINITY, NAN, -NAN, 1.00390625f, 1.01171875f, 3.4e38f, 1.2e-38f, 1e-45f};
  const int ns = sizeof sp / sizeof *sp;
  for (int li = 1; li < 3; li++) {
    int ldt = dts[li];
    std::vector<float> w(sp, sp + ns);
    Dev<float> dw(ns), dm(ns);
    Dev<uint16_t> dl(ns);
    Dev<float> dg(ns);
    dw.put(w);
    dg.put(std::vector<float>(ns, 0.0f));
    int rc = tgm_cuda_sgd(CX, dw.d, dg.d, TGM_F32, NULL, dl.d, ldt, ns, 0.1, 0, 0, 1, 1); /* w unchanged */
    if (rc == 0)
      rc = tgm_cuda_sync(CX);
    check(rc == 0, "rounding %s: %s", dt_name(ldt), tgm_cuda_ctx_error(CX));
    std::vector<uint16_t> gl = dl.get();
    std::vector<float> gw = dw.get(); /* as sp, but a NaN may come back as the GPU's canonical NaN */
    for (int i = 0; i < ns; i++)
      check(gl[i] == f32_to_low(ldt, gw[i]) && (gw[i] == sp[i] || (std::isnan(sp[i]) && std::isnan(gw[i]))),
            "rounding %g to %s: 0x%04x, tgm_init.c 0x%04x", sp[i], dt_name(ldt), gl[i], f32_to_low(ldt, gw[i]));
  }
}

static void test_sum_squares() {
  for (int k = 0; k < 2; k++) {
    Dev<float> d(GOLD_N);
    d.put(std::vector<float>(norm_g, norm_g + GOLD_N));
    double ss = -1;
    int rc = tgm_cuda_sum_squares(CX, d.d, TGM_F32, GOLD_N, &ss);
    check(rc == 0, "sum_squares: %s", tgm_cuda_ctx_error(CX));
    double total = norm_cases[k][1], f = tgm_clip_factor(ss, norm_cases[k][0]);
    check(std::fabs(std::sqrt(ss) - total) <= 1e-6 * total, "sum_squares: norm %.9g, torch %.9g", std::sqrt(ss), total);
    check(std::fabs(f - norm_cases[k][2]) <= 1e-6 * norm_cases[k][2], "clip factor (max_norm %g): %.9g, torch %.9g",
          norm_cases[k][0], f, norm_cases[k][2]);
  }
  const int64_t sizes[] = {0, 1, 255, 257, 4099, 262145, 1000003, 5000011};
  for (int64_t n : sizes) {
    std::vector<float> x(n);
    std::vector<uint16_t> xb(n), xh(n);
    long double ref[3] = {0, 0, 0};
    for (int64_t i = 0; i < n; i++) {
      x[i] = runif(-0.5f, 0.5f) * ((i % 97) ? 1.0f : 300.0f);
      xb[i] = tgm_f32_to_bf16(x[i]);
      xh[i] = tgm_f32_to_f16(x[i]);
      long double a = x[i], b = tgm_bf16_to_f32(xb[i]), h = tgm_f16_to_f32(xh[i]);
      ref[0] += a * a;
      ref[1] += b * b;
      ref[2] += h * h;
    }
    Dev<float> dx(n);
    Dev<uint16_t> dxb(n), dxh(n);
    dx.put(x);
    dxb.put(xb);
    dxh.put(xh);
    const void *ptrs[3] = {dx.d, dxb.d, dxh.d};
    const int dts[3] = {TGM_F32, TGM_BF16, TGM_F16};
    for (int d = 0; d < 3; d++) {
      double s1 = -1, s2 = -2;
      int rc = tgm_cuda_sum_squares(CX, ptrs[d], dts[d], n, &s1);
      if (rc == 0)
        rc = tgm_cuda_sum_squares(CX, ptrs[d], dts[d], n, &s2);
      check(rc == 0, "sum_squares %s n=%lld: %s", dt_name(dts[d]), (long long)n, tgm_cuda_ctx_error(CX));
      check(memcmp(&s1, &s2, sizeof s1) == 0, "sum_squares %s n=%lld: two runs %.17g, %.17g", dt_name(dts[d]),
            (long long)n, s1, s2);
      check(std::fabs((long double)s1 - ref[d]) <= 1e-12L * ref[d], "sum_squares %s n=%lld: %.17g, want %.17Lg",
            dt_name(dts[d]), (long long)n, s1, ref[d]);
    }
  }
}

static void test_errors() {
  Dev<float> a(16), b(16), c(16);
  int rc = tgm_cuda_adamw(CX, a.d, b.d, TGM_I32, c.d, c.d, NULL, -1, 16, 0.1, 0.9, 0.999, 1e-8, 0, 1, 1);
  std::string msg = tgm_cuda_ctx_error(CX);
  check(rc != 0 && msg.find("tgm_cuda_adamw") == 0 && msg.find("dtype") != std::string::npos,
        "error: adamw with i32 gradients: rc %d, '%s'", rc, msg.c_str());
  rc = tgm_cuda_sgd(CX, a.d, b.d, TGM_F32, NULL, NULL, -1, 16, 0.1, 0.9, 0, 1, 1);
  msg = tgm_cuda_ctx_error(CX);
  check(rc != 0 && msg.find("tgm_cuda_sgd") == 0 && msg.find("NULL") != std::string::npos,
        "error: sgd with momentum and no buffer: rc %d, '%s'", rc, msg.c_str());
  rc = tgm_cuda_sgd(CX, a.d, b.d, TGM_F32, NULL, c.d, TGM_BOOL, 16, 0.1, 0, 0, 1, 1);
  check(rc != 0, "error: sgd with a bool copy");
  rc = tgm_cuda_adamw(CX, a.d, b.d, TGM_F32, c.d, c.d, NULL, -1, -1, 0.1, 0.9, 0.999, 1e-8, 0, 1, 1);
  check(rc != 0, "error: negative size");
  double r = 5;
  rc = tgm_cuda_sum_squares(CX, NULL, TGM_F32, 3, &r);
  msg = tgm_cuda_ctx_error(CX);
  check(rc != 0 && msg.find("tgm_cuda_sum_squares") == 0, "error: sum_squares of NULL: rc %d, '%s'", rc, msg.c_str());
  rc = tgm_cuda_sum_squares(CX, a.d, TGM_F32, 3, NULL);
  check(rc != 0, "error: sum_squares into NULL");
  rc = tgm_cuda_adamw(CX, NULL, NULL, TGM_F32, NULL, NULL, NULL, -1, 0, 0.1, 0.9, 0.999, 1e-8, 0, 1, 1);
  check(rc == 0, "n = 0 with NULL pointers is a no-op: %s", tgm_cuda_ctx_error(CX));
  rc = tgm_cuda_sync(CX);
  check(rc == 0, "error: the context still works after refused calls: %s", tgm_cuda_ctx_error(CX));
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
  const char *only = argc > 1 ? argv[1] : NULL; /* optional: golden, cpu, sumsq, errors */
  if (!only || !strcmp(only, "golden"))
    for (const Case *c : gold_cases) {
      run_case(c, 1);
      run_case(c, 50003); /* 950057 elements: more than the grid cap, so threads stride */
    }
  if (!only || !strcmp(only, "cpu"))
    test_vs_cpu();
  if (!only || !strcmp(only, "sumsq"))
    test_sum_squares();
  if (!only || !strcmp(only, "errors"))
    test_errors();
  tgm_cuda_ctx_destroy(CX);
  printf("largest error against torch: %.3g of the tolerance\n", worst_rel);
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
