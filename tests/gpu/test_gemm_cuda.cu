/* test_gemm_cuda.cu: tgm_cuda_gemm against tgm_cpu_gemm (which
 * tests/unit/test_cpu_kernels.c checks against a double-precision reference)
 * on the cases the CPU test runs: every shape in {1, 7, 33, 130}^3, every
 * transpose pair, f32 / bf16 / f16, the 64 epilogues (bias x act x aux x
 * residual x accumulate) in turn, padded leading dims, the residual being C
 * itself; batches with A or B broadcast (stride 0) and gaps between batch
 * elements; sizes that take several cuBLASLt pieces (the product scratch is
 * cut to 64 KiB here, so the row and batch splitting runs); K = 0, M = 0,
 * batch = 0; pointers one element off alignment (the unvectorised epilogue,
 * cuBLASLt's low-alignment algorithms); a case run twice (the cached plan);
 * and bad arguments (an error code and a message).
 *
 * Every element of C's and aux's buffers is compared, padding included (it
 * must stay exactly as it was). Tolerance: rtol (|cpu| + scale), scale the
 * size of what was summed into the output (the 2-norm of the K products plus
 * |bias|, |residual|, |old C|), rtol f32 2e-5 (no TF32: both sides sum in
 * f32, in different orders), bf16 1e-2, f16 2e-3 (one rounding each; they may
 * differ by an ulp), plus 2^-24 for f16. Where cuBLASLt's own GELU epilogue
 * runs (tanh-gelu without residual or accumulation) f32 gets 1e-3: its tanh
 * may be a faster approximation than tanhf. Each line names the path taken:
 * "lt" (cuBLASLt epilogue alone) or "lt+k" (product, then k_gemm_epilogue).
 *
 * Exit status: 0 all passed, 1 some failed, 77 no CUDA device (skip).
 * Build and run: TEST=test_gemm_cuda sh tests/gpu/build_and_run.sh (it also
 * compiles templates/runtime/tgm_cpu.c with the host C compiler and links
 * -lcublasLt); by hand:
 *   gcc -std=c11 -O2 -fopenmp -c templates/runtime/tgm_cpu.c -o tgm_cpu.o
 *   nvcc -std=c++17 -O3 -arch=sm_90 -Xcompiler -fopenmp tests/gpu/test_gemm_cuda.cu tgm_cpu.o \
 *        -lcublas -lcublasLt -o test_gemm_cuda && ./test_gemm_cuda */
#define TGM_CUDA_GEMM_BUDGET ((size_t)64 << 10)
#include "../../templates/runtime/tgm_cuda.cu"
#include "../../templates/runtime/tgm_init.c"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

static tgm_cuda_ctx *CX;
static int n_pass, n_fail;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng_next(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double urand(double lo, double hi) { return lo + (hi - lo) * ((double)(rng_next() >> 11) * 0x1p-53); }

static const char *DTN[] = {"f32", "bf16", "f16"};
static const char *ACTN[] = {"none", "relu", "gelu", "gelu_tanh"};

/* A host buffer of dtype dt (raw bytes) and its values as doubles. */
struct Buf {
  int dt = TGM_F32;
  int64_t n = 0;
  std::vector<unsigned char> raw;
  std::vector<double> v;
  void init(int dt_, int64_t n_) {
    dt = dt_;
    n = n_;
    raw.assign((size_t)(n > 0 ? n : 1) * dt_size(dt), 0);
    v.assign((size_t)(n > 0 ? n : 1), 0.0);
  }
  void set(int64_t i, double x) {
    tgm_put(raw.data(), dt, i, x);
    v[i] = tgm_get(raw.data(), dt, i);
  }
  size_t bytes() const { return raw.size(); }
};

/* nb matrices rows x cols, row stride ld, batch stride st: entries uniform
 * in [-1, 1), the rest `fill`. */
static void fill_buf(Buf &b, int dt, int64_t nb, int64_t rows, int64_t cols, int64_t ld, int64_t st, double fill) {
  b.init(dt, nb > 0 ? (nb - 1) * st + rows * ld : 0);
  for (int64_t i = 0; i < b.n; i++)
    b.set(i, fill);
  for (int64_t k = 0; k < nb; k++)
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++)
        b.set(k * st + r * ld + c, urand(-1, 1));
}

/* Device copies, `skew` elements past a 256-byte boundary. */
struct Dev {
  void *base = nullptr;
  char *p = nullptr;
  Dev() {}
  Dev(const Dev &) = delete;
  Dev &operator=(const Dev &) = delete;
  ~Dev() {
    if (base)
      cudaFree(base);
  }
  bool up(const Buf &b, int skew) {
    size_t off = (size_t)skew * dt_size(b.dt);
    if (cudaMalloc(&base, b.bytes() + off) != cudaSuccess)
      return false;
    p = (char *)base + off;
    return put(b);
  }
  bool put(const Buf &b) { return cudaMemcpy(p, b.raw.data(), b.bytes(), cudaMemcpyHostToDevice) == cudaSuccess; }
  bool down(Buf &b) const { return cudaMemcpy(b.raw.data(), p, b.bytes(), cudaMemcpyDeviceToHost) == cudaSuccess; }
};

struct Case {
  int dt, ta, tb;
  int64_t M, N, K, batch, pad, gap;
  int bc, bias, act, aux, res, acc, inplace, skew, dact, bgrad;
};

static void result(bool ok, const std::string &label, const std::string &why) {
  if (ok)
    n_pass++;
  else
    n_fail++;
  printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", label.c_str(), why.empty() ? "" : ": ", why.c_str());
}

/* got (device result) against want (tgm_cpu_gemm's): element i within
 * rtol (|want| + scale[i]) + sub, exactly where scale[i] < 0 (padding; NaN
 * meets NaN). `why` describes the worst element. */
static bool within(const Buf &got, const Buf &want, const std::vector<double> &scale, double rtol, double sub,
                   std::string &why) {
  int64_t bad = 0, worst = -1;
  double wr = 0;
  for (int64_t i = 0; i < want.n; i++) {
    double g = got.v[i], w = want.v[i], tol = scale[i] < 0 ? 0 : rtol * (std::fabs(w) + scale[i]) + sub;
    bool ok = std::isnan(w) ? std::isnan(g) : tol == 0 ? g == w : std::fabs(g - w) <= tol;
    double r = tol > 0 ? std::fabs(g - w) / tol : (ok ? 0 : 1e30);
    if (!ok)
      bad++;
    if (r > wr || (std::isnan(g) && !std::isnan(w))) {
      wr = r;
      worst = i;
    }
  }
  char b[200];
  if (worst >= 0)
    snprintf(b, sizeof b, "%lld bad; worst element %lld: got %.9g, want %.9g (error/tolerance %.3g)", (long long)bad,
             (long long)worst, got.v[worst], want.v[worst], wr);
  else
    snprintf(b, sizeof b, "exact");
  why = b;
  return bad == 0;
}

/* One case on both sides. */
static void run_case(const Case &c, int repeat = 1) {
  const int dt = c.dt;
  const int64_t M = c.M, N = c.N, K = c.K, B = c.batch;
  const int64_t ar = c.ta ? K : M, ac = c.ta ? M : K, br = c.tb ? N : K, bcl = c.tb ? K : N;
  const int64_t lda = ac + c.pad, ldb = bcl + c.pad, ldc = N + c.pad;
  const int64_t sa = c.bc == 1 ? 0 : ar * lda + c.gap, sb = c.bc == 2 ? 0 : br * ldb + c.gap, sc = M * ldc + c.gap;
  Buf a, b, bias, y, aux, res;
  fill_buf(a, dt, c.bc == 1 ? 1 : B, ar, ac, lda, sa, NAN);
  fill_buf(b, dt, c.bc == 2 ? 1 : B, br, bcl, ldb, sb, NAN);
  fill_buf(bias, dt, 1, 1, N, N, 0, NAN);
  fill_buf(y, dt, B, M, N, ldc, sc, 7.0);
  fill_buf(aux, dt, B, M, N, ldc, sc, 7.0);
  fill_buf(res, dt, B, M, N, ldc, sc, NAN);
  for (int64_t i = 0; i < aux.n && !c.dact; i++) /* (dact: aux is the activation's input, read) */
    if (aux.v[i] != 7.0)
      aux.set(i, NAN);
  Buf bg; /* the bias gradient, two sentinels past it */
  fill_buf(bg, dt, 1, 1, M + 2, M + 2, 0, NAN);
  bg.set(M, 7.0);
  bg.set(M + 1, 7.0);
  std::vector<double> bscale((size_t)M + 2, -1.0);
  for (int64_t m = 0; m < M && c.bgrad; m++) {
    double s2 = 0;
    for (int64_t l = 0; l < K; l++) {
      double v = a.v[c.ta ? l * lda + m : m * lda + l];
      s2 += v * v;
    }
    bscale[m] = std::sqrt(s2);
  }
  if (!c.acc && !c.inplace)
    for (int64_t k = 0; k < B; k++)
      for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++)
          y.set(k * sc + m * ldc + n, NAN);
  /* tolerances from the double sums */
  const bool lt_gelu = c.act == TGM_ACT_GELU_TANH && !c.res && !c.acc && K > 0;
  const double rtol = dt == TGM_BF16 ? 1e-2 : dt == TGM_F16 ? 2e-3 : lt_gelu || c.dact ? 1e-3 : 2e-5;
  const double sub = dt == TGM_F16 ? 0x1p-24 : 0;
  std::vector<double> scale((size_t)(y.n > 0 ? y.n : 1), -1.0), ascale = scale;
  /* (M N K products in double, strided: GPT-2's 768 x 768 x 2048 took seconds a case on one thread, most
     of the file's four minutes on the H100 machine; the outputs are independent) */
#pragma omp parallel for collapse(3) schedule(static)
  for (int64_t k = 0; k < B; k++)
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) {
        double s2 = 0, ps = 0;
        for (int64_t l = 0; l < K; l++) {
          double p =
              a.v[k * sa + (c.ta ? l * lda + m : m * lda + l)] * b.v[k * sb + (c.tb ? n * ldb + l : l * ldb + n)];
          s2 += p * p;
          ps += p;
        }
        int64_t o = k * sc + m * ldc + n;
        double s = std::sqrt(s2) + (c.bias ? std::fabs(bias.v[n]) : 0);
        if (c.dact) /* times act'(aux): at most about 1.13, its two terms (each below 1.25) may cancel */
          s = 1.13 * s + 1.25 * (std::fabs(ps) + (c.bias ? std::fabs(bias.v[n]) : 0));
        if (c.aux)
          ascale[o] = s;
        scale[o] = s + (c.res ? std::fabs(c.inplace ? y.v[o] : res.v[o]) : 0) + (c.acc ? std::fabs(y.v[o]) : 0);
      }
  Dev da, db, dbias, dy, daux, dres, dbg;
  if (!da.up(a, c.skew) || !db.up(b, c.skew) || !dbias.up(bias, c.skew) || !dy.up(y, c.skew) ||
      !daux.up(aux, c.skew) || !dres.up(res, c.skew) || !dbg.up(bg, c.skew)) {
    result(false, "gemm", "cudaMalloc/cudaMemcpy failed");
    return;
  }
  tgm_gemm h = {};
  h.dt = dt;
  h.ta = c.ta;
  h.tb = c.tb;
  h.M = M;
  h.N = N;
  h.K = K;
  h.batch = B;
  h.lda = lda;
  h.sa = sa;
  h.ldb = ldb;
  h.sb = sb;
  h.ldc = ldc;
  h.sc = sc;
  h.act = c.act;
  h.accumulate = c.acc;
  h.dact = c.dact;
  tgm_gemm d = h;
  Buf ycpu = y, auxcpu = aux, bgcpu = bg;
  h.A = a.raw.data();
  h.B = b.raw.data();
  h.C = ycpu.raw.data();
  h.bias = c.bias ? bias.raw.data() : NULL;
  h.aux = c.aux || c.dact ? auxcpu.raw.data() : NULL;
  h.bgrad = c.bgrad ? bgcpu.raw.data() : NULL;
  d.bgrad = c.bgrad ? dbg.p : NULL;
  h.residual = c.res ? (c.inplace ? (const void *)ycpu.raw.data() : (const void *)res.raw.data()) : NULL;
  d.A = da.p;
  d.B = db.p;
  d.C = dy.p;
  d.bias = c.bias ? dbias.p : NULL;
  d.aux = c.aux || c.dact ? daux.p : NULL;
  d.residual = c.res ? (c.inplace ? (const void *)dy.p : (const void *)dres.p) : NULL;
  uint32_t epi;
  float beta;
  const void *cin;
  const char *path = K > 0 && small_gemm_ok(&d)                       ? "small"
                     : K > 0 && !d.bgrad && x3_ok(CX, &d)               ? "x3"
                     : K > 0 && lt_epilogue_for(&d, &epi, &beta, &cin) ? "lt"
                                                                         : "lt+k";
  char lab[300];
  snprintf(lab, sizeof lab,
           "gemm %s ta=%d tb=%d M=%lld N=%lld K=%lld batch=%lld pad=%lld bc=%d bias=%d act=%s aux=%d res=%d%s acc=%d%s%s%s "
           "[%s]",
           DTN[dt], c.ta, c.tb, (long long)M, (long long)N, (long long)K, (long long)B, (long long)c.pad, c.bc,
           c.bias, ACTN[c.act], c.aux, c.res, c.inplace ? "(=C)" : "", c.acc, c.skew ? " skew" : "",
           c.dact ? " dact" : "", c.bgrad ? " bgrad" : "", path);
  int rc = tgm_cpu_gemm(&h);
  if (rc) {
    result(false, lab, "tgm_cpu_gemm returned " + std::to_string(rc));
    return;
  }
  /* repeat > 1: run again from the same inputs (the second call uses the cached plan) */
  for (int r = 0; r < repeat; r++) {
    if (r > 0 && !dy.put(y)) {
      result(false, lab, "cudaMemcpy failed");
      return;
    }
    rc = tgm_cuda_gemm(CX, &d);
    if (!rc)
      rc = tgm_cuda_sync(CX);
    if (rc) {
      result(false, lab, std::string("tgm_cuda_gemm: ") + tgm_cuda_ctx_error(CX));
      return;
    }
    Buf ygpu = y, auxgpu = aux, bggpu = bg;
    if (!dy.down(ygpu) || !daux.down(auxgpu) || !dbg.down(bggpu)) {
      result(false, lab, "cudaMemcpy failed");
      return;
    }
    for (int64_t i = 0; i < ygpu.n; i++) {
      ygpu.v[i] = tgm_get(ygpu.raw.data(), dt, i);
      auxgpu.v[i] = tgm_get(auxgpu.raw.data(), dt, i);
      ycpu.v[i] = tgm_get(ycpu.raw.data(), dt, i);
      auxcpu.v[i] = tgm_get(auxcpu.raw.data(), dt, i);
    }
    for (int64_t i = 0; i < bggpu.n; i++) {
      bggpu.v[i] = tgm_get(bggpu.raw.data(), dt, i);
      bgcpu.v[i] = tgm_get(bgcpu.raw.data(), dt, i);
    }
    std::string w1, w2, w3;
    bool ok1 = within(ygpu, ycpu, scale, rtol, sub, w1), ok2 = within(auxgpu, auxcpu, ascale, rtol, sub, w2);
    bool ok3 = within(bggpu, bgcpu, bscale, rtol, sub, w3);
    result(ok1 && ok2 && ok3, std::string(lab) + (r ? " (again)" : ""), "C " + w1 + "; aux " + w2 + "; bgrad " + w3);
  }
}

static void test_gemm(void) {
  static const int dts[] = {TGM_F32, TGM_BF16, TGM_F16};
  static const int64_t sz[] = {1, 7, 33, 130};
  int rot = 0;
  for (int di = 0; di < 3; di++)
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 4; j++)
        for (int k = 0; k < 4; k++)
          for (int t = 0; t < 4; t++, rot++) {
            int e = rot % 64;
            Case c = {dts[di], t & 1, t >> 1, sz[i], sz[j], sz[k], 1, rot % 3 ? 3 : 0, 0, 0,
                      e & 1, (e >> 1) & 3, (e >> 3) & 1, (e >> 4) & 1, (e >> 5) & 1, 0, rot % 7 == 0, 0, 0};
            c.inplace = c.res && !c.acc && rot % 5 == 0;
            run_case(c);
          }
  static const int64_t bs[][4] = {{7, 33, 130, 3}, {33, 7, 33, 4}, {130, 33, 7, 2},   {200, 150, 300, 2},
                                  {7, 3100, 9, 1}, {8, 8, 8, 40},  {300, 70, 520, 1}, {1, 257, 600, 3},
                                  {64, 96, 128, 3}};
  for (int di = 0; di < 3; di++)
    for (size_t k = 0; k < sizeof bs / sizeof *bs; k++)
      for (int bc = 0; bc < 3; bc++, rot++) {
        int e = (rot * 7) % 64;
        /* gap 8 keeps batch strides multiples of 8 where pad allows: GELU_AUX's batched path */
        Case c = {dts[di], rot & 1, (rot >> 1) & 1, bs[k][0], bs[k][1], bs[k][2], bs[k][3], k == 8 ? 0 : 2,
                  k == 8 ? 0 : 5, bc, e & 1, (e >> 1) & 3, (e >> 3) & 1, (e >> 4) & 1, (e >> 5) & 1, 0, 0, 0, 0};
        run_case(c);
      }
  /* every cuBLASLt epilogue on an aligned, batched shape (N, ldc multiples of 8) */
  for (int di = 0; di < 3; di++)
    for (int e = 0; e < 64; e++) {
      Case c = {dts[di], e & 1, 1, 64, 96, 128, 2, 0, 0, 0, e & 1, (e >> 1) & 3, (e >> 3) & 1, (e >> 4) & 1,
                (e >> 5) & 1, 0, 0, 0, 0};
      run_case(c);
    }
  /* edge cases, and the plan cache (a second run of the same case) */
  for (int di = 0; di < 3; di++) {
    run_case(Case{dts[di], 0, 1, 7, 33, 0, 2, 1, 0, 0, 1, TGM_ACT_GELU, 1, 1, 1, 0, 0, 0, 0});
    static const int64_t z[][4] = {{0, 5, 3, 1}, {5, 0, 3, 1}, {0, 0, 0, 1}, {3, 4, 5, 0}};
    for (auto &q : z)
      run_case(Case{dts[di], 1, 0, q[0], q[1], q[2], q[3], 1, 0, 0, 1, TGM_ACT_RELU, 1, 1, 1, 0, 0, 0, 0});
    run_case(Case{dts[di], 0, 1, 130, 96, 33, 2, 0, 0, 0, 1, TGM_ACT_GELU_TANH, 1, 0, 0, 0, 0, 0, 0}, 2);
    run_case(Case{dts[di], 0, 1, 130, 96, 33, 2, 0, 0, 0, 1, TGM_ACT_GELU, 1, 1, 0, 0, 0, 0, 0}, 2);
  }
  /* a batch sharing B whose A and C rows run on (gap 0: the CPU folds it into one GEMM, tgm_gemm_folded;
   * cuBLASLt takes it batched, which measured as fast on GPT-2), a larger bf16 one (256 x 192 x 768,
   * batch 4), every epilogue in turn; and with a gap */
  for (int di = 0; di < 3; di++)
    for (int e = 0; e < 64; e += 9, rot++) {
      const bool big = e == 0 && di == 1;
      Case c = {dts[di], 0, rot & 1, big ? 256 : 64, big ? 192 : 96, big ? 768 : 130, big ? 4 : 5,
                rot % 2 && !big ? 3 : 0, 0, 2, e & 1, (e >> 1) & 3, (e >> 3) & 1, (e >> 4) & 1, (e >> 5) & 1, 0, 0, 0, 0};
      run_case(c);
      c.gap = 8;
      run_case(c);
    }
  /* few rows (k_gemm_small: f32, M <= 32, B transposed): mlp3's layers at batch 32, partial row and
   * column tiles, K over several warps and chunks, K not a multiple of 4 (scalar loads), every epilogue */
  static const int64_t ss[][3] = {{32, 512, 512}, {32, 10, 512}, {32, 9, 130}, {17, 24, 2000}, {9, 1, 4}, {1, 300, 1031}};
  for (size_t k = 0; k < sizeof ss / sizeof *ss; k++)
    for (int e = 0; e < 64; e += 5, rot++)
      run_case(Case{TGM_F32, 0, 1, ss[k][0], ss[k][1], ss[k][2], 1, rot % 3 == 0 ? 4 : rot % 3 == 1 ? 1 : 0, 0, 0,
                    e & 1, (e >> 1) & 3, (e >> 3) & 1, (e >> 4) & 1, (e >> 5) & 1, (e >> 4) & 1 && !((e >> 5) & 1) && rot % 2, rot % 4 == 3,
                    0, 0});
  for (size_t k = 0; k < sizeof ss / sizeof *ss; k++) /* gelu's backward at aux */
    run_case(Case{TGM_F32, 0, 1, ss[k][0], ss[k][1], ss[k][2], 1, 0, 0, 0, 1, TGM_ACT_GELU, 0, 0, 0, 0, 0, 1, 0});
  /* an activation's backward at aux (dact: always the epilogue kernel, lt_epilogue_for says why),
   * and the sum over k of op(A) (bgrad: k_bgrad_cols where A is transposed with rows of whole
   * vectors, else BGRADB alone, else k_gemm_bgrad), GPT-2's weight-gradient shape among them
   * (M = N = 768, K = 2048, A transposed) */
  static const int64_t ds[][3] = {{64, 96, 128}, {130, 33, 7}, {7, 130, 520}, {768, 768, 2048}};
  for (int di = 0; di < 3; di++)
    for (size_t k = 0; k < sizeof ds / sizeof *ds; k++)
      for (int t = 0; t < 4; t++, rot++) {
        int pad = rot % 3 == 0 ? 3 : 0;
        run_case(Case{dts[di], t & 1, t >> 1, ds[k][0], ds[k][1], ds[k][2], 1, pad, 0, 0, rot % 4 == 1,
                      t & 2 ? TGM_ACT_GELU_TANH : TGM_ACT_GELU, 0, 0, 0, 0, 0, 1, 0});
        run_case(Case{dts[di], 1, t & 1, ds[k][0], ds[k][1], ds[k][2], 1, pad, 0, 0, t == 3, 0, 0, 0, 0, 0, 0, 0, 1});
      }
  /* k_bgrad_cols over several column tiles, the last partial, and K past its unrolled steps and not a
   * multiple of them (pad 0); the same shape with rows that are not whole vectors (pad 3: the others) */
  for (int di = 0; di < 3; di++)
    for (int pad = 0; pad <= 3; pad += 3)
      run_case(Case{dts[di], 1, 0, 1032, 24, 5000, 1, pad, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1});
}

/* k_gemm_x3 (f32 on Hopper's tensor cores, three TF32 products; x3_force takes it at any shape it
 * can load): partial tiles in M, N and K, K of one tile and of many, each transpose pair, every
 * epilogue in turn (and gelu's backward at aux), a batch of 3 with a gap, B shared; padded leading
 * dims a multiple of 4 (another pad falls back to cuBLASLt: run too). Skipped where it cannot run. */
static void test_x3(void) {
  if (!CX->x3) {
    printf("SKIP x3: k_gemm_x3 does not run here (needs a compute capability 9.0 GPU and an sm_90a build)\n");
    return;
  }
  x3_force = true;
  static const int64_t xs[][3] = {{200, 136, 72}, {128, 128, 32}, {257, 300, 516}, {64, 1000, 1028}, {1000, 40, 200},
                                  {130, 260, 4}};
  int rot = 0;
  for (size_t k = 0; k < sizeof xs / sizeof *xs; k++)
    for (int t = 0; t < 4; t++)
      for (int e = t; e < 64; e += 13, rot++) {
        Case c = {TGM_F32, t & 1, t >> 1, xs[k][0], xs[k][1], xs[k][2], rot % 5 == 0 ? 3 : 1, rot % 3 == 0 ? 4 : 0,
                  rot % 5 == 0 ? 8 : 0, rot % 7 == 0 ? 2 : 0, e & 1, (e >> 1) & 3, (e >> 3) & 1, (e >> 4) & 1,
                  (e >> 5) & 1, 0, 0, 0, 0};
        run_case(c);
      }
  for (size_t k = 0; k < sizeof xs / sizeof *xs; k++) /* gelu's backward at aux */
    run_case(Case{TGM_F32, 0, (int)(k & 1), xs[k][0], xs[k][1], xs[k][2], 1, 0, 0, 0, 1, TGM_ACT_GELU, 0, 0, 0, 0, 0, 1, 0});
  run_case(Case{TGM_F32, 0, 1, 200, 136, 72, 1, 3, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}); /* pad 3: cuBLASLt */
  x3_force = false;
}

/* Bad arguments: an error code and a message naming the function. */
static void test_errors(void) {
  tgm_gemm ok = {};
  ok.dt = TGM_F32;
  ok.M = ok.N = ok.K = 2;
  ok.batch = 2;
  ok.lda = ok.ldb = ok.ldc = 2;
  ok.sa = ok.sb = ok.sc = 4;
  ok.A = ok.B = ok.C = (void *)(uintptr_t)256; /* never dereferenced: the calls fail before any launch */
  tgm_gemm bad[8];
  for (auto &g : bad)
    g = ok;
  bad[0].dt = TGM_I32;
  bad[1].ta = 2;
  bad[2].lda = 1;
  bad[3].ldc = 1;
  bad[4].act = 9;
  bad[5].sc = 0;
  bad[6].C = NULL;
  bad[7].K = -1;
  for (int k = 0; k < 8; k++) {
    int rc = tgm_cuda_gemm(CX, &bad[k]);
    const char *msg = tgm_cuda_ctx_error(CX);
    result(rc != 0 && strstr(msg, "tgm_cuda_gemm") != NULL,
           "gemm refuses bad arguments (case " + std::to_string(k) + ")", msg);
  }
  result(tgm_cuda_gemm(CX, NULL) != 0, "gemm refuses NULL", tgm_cuda_ctx_error(CX));
}

/* test_gemm_cuda [GROUP]: every group, or one (gemm, x3, errors) */
int main(int argc, char **argv) {
  static const struct {
    const char *name;
    void (*run)(void);
  } groups[] = {{"gemm", test_gemm}, {"x3", test_x3}, {"errors", test_errors}};
  const char *only = argc > 1 ? argv[1] : NULL;
  bool known = !only;
  for (const auto &gr : groups)
    known = known || strcmp(gr.name, only) == 0;
  if (!known) {
    printf("FAIL: unknown group '%s' (gemm, x3, errors)\n", only);
    return 2;
  }
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
  for (const auto &gr : groups)
    if (!only || strcmp(gr.name, only) == 0)
      gr.run();
  tgm_cuda_ctx_destroy(CX);
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
