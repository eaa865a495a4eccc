/* harness.cc: runs m.yaml's generated CUDA kernels and checks y (a column
 * sum, split over blocks, then exp), z (x * cw + 1, vector loads and stores,
 * aligned and not, with a scalar tail), w (a full sum and amax, split), sm
 * and sq (softmax rows of 47, a warp a row, and of 3000, a block a row: the
 * max and the sum of exp in one online pass; sq's rows hold a NaN, all -inf,
 * a +inf), cs (a column sum over an arena value, 4 columns a thread
 * from one vector load of each row) and hd (rows of 64 summed through a
 * transposed view of hv, [B, 2, 64] as [2, B, 64]: each row's vectors
 * from its base, 16 lanes a row; shifted, hv is misaligned and the rows
 * go element by element), and the riders (column sums riding a row
 * kernel: rac over ra = c - mean(c), rows of 64, 16 lanes a row, with cs
 * over the same rows; rbc and rbd over rw's rows of 200, a warp a row, as
 * vectors or, rw shifted, element by element) against plain loops. Built by run.sh on the CPU through emu.h, or by
 * gpu.sh with nvcc on a GPU (the split reductions' last-block race real). */
#include "t_math.h"
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#ifdef __NVCC__
template <typename T> static T *alloc(size_t n) {
  T *p = nullptr;
  if (cudaMallocManaged(&p, n * sizeof(T)) != cudaSuccess) {
    printf("cudaMallocManaged failed\n");
    exit(1);
  }
  memset(p, 0, n * sizeof(T));
  return p;
}
static void wait_all() {
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    printf("CUDA error: %s\n", cudaGetErrorString(e));
    exit(1);
  }
}
static const cudaStream_t st = 0;
#else
template <typename T> static T *alloc(size_t n) { return (T *)calloc(n, sizeof(T)); }
static void wait_all() {}
#endif
struct Cx { void *cx; } mm, *m = &mm;
static float *part;
static unsigned *count;
float *t_cuda_split_part(void *) { return part; }
unsigned *t_cuda_split_count(void *) { return count; }
#include "kernels.inc"
static int fails;
static void cmp(const char *what, double got, double want, double tol) {
  int ok = std::fabs(got - want) <= tol * (1 + std::fabs(want));
  if (!ok && fails++ < 10)
    printf("FAIL %s: %.9g vs %.9g\n", what, got, want);
}
/* Softmax of n elements in double, as torch: NaN anywhere, all -inf, or a
 * +inf (inf - inf) give NaN everywhere (the sum is NaN). */
static void ref_softmax(const float *x, int n, double *o) {
  double m = -INFINITY, s = 0;
  for (int j = 0; j < n; j++)
    m = std::isnan(x[j]) || std::isnan(m) ? NAN : std::max(m, (double)x[j]);
  for (int j = 0; j < n; j++)
    s += std::exp(x[j] - m);
  for (int j = 0; j < n; j++)
    o[j] = std::exp(x[j] - m) / s;
}
static void cmp_rows(const char *what, const float *got, const float *x, int64_t rows, int n) {
  std::vector<double> o((size_t)n);
  for (int64_t r = 0; r < rows; r++) {
    ref_softmax(x + r * n, n, o.data());
    for (int j = 0; j < n; j++) {
      double g = got[r * n + j], w = o[(size_t)j];
      if (std::isnan(w) != std::isnan(g) || (!std::isnan(w) && std::fabs(g - w) > 1e-6 * (1 + std::fabs(w)))) {
        if (fails++ < 10)
          printf("FAIL %s row %lld col %d: %.9g vs %.9g\n", what, (long long)r, j, g, w);
        break;
      }
    }
  }
}
static void run(int64_t dim_B, int shift) {
  const int D = 47, Q = 3000;
  int64_t n = dim_B * D;
  float *xs = alloc<float>(n + 8), *cw = alloc<float>(D), *y = alloc<float>(D), *zs = alloc<float>(n + 8), *w = alloc<float>(1);
  float *sm = alloc<float>(n), *q = alloc<float>(4 * Q), *sq = alloc<float>(4 * Q);
  float *sq_amax = alloc<float>(4), *sq_sum = alloc<float>(4); /* sq's row statistics (a kernel of their own) */
  const int C = 64;
  float *c_ = alloc<float>(dim_B * C), *g = alloc<float>(dim_B * C), *cs = alloc<float>(C);
  float *hvs = alloc<float>(dim_B * 128 + 8), *hd = alloc<float>(2 * dim_B);
  float *hv = hvs + shift;
  const int RW = 200;
  float *ra = alloc<float>(dim_B * C), *rac = alloc<float>(C), *rws = alloc<float>(dim_B * RW + 8);
  float *rb = alloc<float>(dim_B * RW), *rbc = alloc<float>(RW), *rbd = alloc<float>(RW);
  float *rw = rws + shift;
  for (int64_t i = 0; i < dim_B * RW; i++)
    rw[i] = (float)((i * 4099 % 1000) - 500) / 500.0f;
  for (int64_t i = 0; i < dim_B * 128; i++)
    hv[i] = (float)((i * 6007 % 1000) - 500) / 500.0f;
  for (int64_t i = 0; i < dim_B * C; i++)
    c_[i] = (float)((i * 7907 % 1000) - 500) / 500.0f;
  for (int r = 0; r < 4; r++) /* rows: ordinary, a NaN, all -inf, a +inf */
    for (int j = 0; j < Q; j++)
      q[r * Q + j] = r == 2 ? -INFINITY : (float)((j * 7919 % 997) - 498) / 100.0f;
  q[1 * Q + 1234] = NAN;
  q[3 * Q + 2999] = INFINITY;
  for (int64_t i = 0; i < n; i++)
    xs[i + shift] = (float)((i * 7919 % 1000) - 500) / 250.0f;
  for (int j = 0; j < D; j++)
    cw[j] = 0.5f + j * 0.01f;
  const float *x = xs + shift;
  float *z = zs + shift;
  for (int rep = 0; rep < 2; rep++) { /* twice: the counts are back at zero after a kernel */
#include "launches.inc"
    wait_all();
    double tot = 0, mx = -INFINITY;
    for (int j = 0; j < D; j++) {
      double s = 0;
      for (int64_t b = 0; b < dim_B; b++)
        s += x[b * D + j];
      cmp("y", y[j], std::exp(s * 0.001), 1e-5);
    }
    for (int64_t i = 0; i < n; i++) {
      cmp("z", z[i], (double)x[i] * cw[i % D] + 1, 1e-6);
      tot += (double)x[i] * x[i];
      mx = std::max(mx, (double)x[i]);
    }
    cmp("w", w[0], tot + mx, 1e-5);
    cmp_rows("sm", sm, x, dim_B, D);
    for (int j = 0; j < C; j++) {
      double t = 0;
      for (int64_t b = 0; b < dim_B; b++) {
        double v = 2.0 * c_[b * C + j] + 1;
        t += v * v;
      }
      cmp("cs", cs[j], t, 1e-5);
    }
    cmp_rows("sq", sq, q, 4, Q);
    for (int h = 0; h < 2; h++)
      for (int64_t b = 0; b < dim_B; b++) {
        double t = 0;
        for (int k = 0; k < 64; k++)
          t += hv[b * 128 + h * 64 + k];
        cmp("hd", hd[h * dim_B + b], t, 1e-5);
      }
    std::vector<double> rac_w((size_t)C, 0.0), rbc_w((size_t)RW, 1.0), rbd_w((size_t)RW, 0.0), rb_abs((size_t)RW, 1.0);
    for (int64_t b = 0; b < dim_B; b++) {
      double mean = 0, mx = -INFINITY;
      for (int j = 0; j < C; j++)
        mean += c_[b * C + j];
      mean /= C;
      for (int j = 0; j < C; j++) {
        double v = (double)c_[b * C + j] - mean;
        cmp("ra", ra[b * C + j], v, 1e-5);
        rac_w[(size_t)j] += v * v;
      }
      for (int j = 0; j < RW; j++)
        mx = std::max(mx, (double)rw[b * RW + j]);
      for (int j = 0; j < RW; j++) {
        double v = (double)rw[b * RW + j] * mx;
        cmp("rb", rb[b * RW + j], v, 1e-6);
        rbc_w[(size_t)j] += v;
        rbd_w[(size_t)j] += 3.0 * rw[b * RW + j];
        rb_abs[(size_t)j] += std::fabs(v) + std::fabs(3.0 * rw[b * RW + j]);
      }
    }
    for (int j = 0; j < C; j++)
      cmp("rac", rac[j], rac_w[(size_t)j], 1e-5);
    for (int j = 0; j < RW; j++) { /* sums that cancel: to f32's rounding of the terms' magnitudes */
      auto tol = [&](double want) { return std::max(1e-5, 1e-6 * rb_abs[(size_t)j] / (1 + std::fabs(want))); };
      cmp("rbc", rbc[j], rbc_w[(size_t)j], tol(rbc_w[(size_t)j]));
      cmp("rbd", rbd[j], rbd_w[(size_t)j], tol(rbd_w[(size_t)j]));
    }
    for (int i = 0; i < 1024; i++)
      if (count[i] && fails++ < 10)
        printf("FAIL count[%d] = %u left\n", i, count[i]);
  }
  printf("B=%lld shift=%d: %s\n", (long long)dim_B, shift, fails ? "FAIL" : "ok");
}
int main(int argc, char **argv) {
  part = alloc<float>(1 << 18);
  count = alloc<unsigned>(1024);
  run(3, 0);
  run(5001, 0);
  run(5001, 1);
  run(20000, 0);
  if (argc > 1) /* the dims' maxima: 256 blocks a tile */
    run(65536, 0), run(65536, 2);
  return fails != 0;
}
