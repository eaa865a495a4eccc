/* harness.cc: runs m.yaml's generated CUDA kernels through emu.h (run.sh) and
 * checks y (a column sum, split over blocks, then exp), z (x * c + 1, vector
 * loads and stores) and w (a full sum and amax, split) against loops. */
#include "t_math.h"
#include <cstdio>
#include <cstdlib>
struct Cx { void *cx; } mm, *m = &mm;
static float part[1 << 18];
static unsigned count[1024];
float *t_cuda_split_part(void *) { return part; }
unsigned *t_cuda_split_count(void *) { return count; }
#include "kernels.inc"
static int fails;
static void cmp(const char *what, double got, double want, double tol) {
  int ok = std::fabs(got - want) <= tol * (1 + std::fabs(want));
  if (!ok) { fails++; printf("FAIL %s: %.9g vs %.9g\n", what, got, want); }
}
static void run(int64_t dim_B, int shift) {
  const int D = 47;
  int64_t n = dim_B * D;
  std::vector<float> xs(n + 8), cs(D), ys(D), zs(n + 8), ws(1);
  for (int64_t i = 0; i < n; i++) xs[i + shift] = (float)((i * 7919 % 1000) - 500) / 250.0f;
  for (int j = 0; j < D; j++) cs[j] = 0.5f + j * 0.01f;
  const float *x = xs.data() + shift, *c = cs.data();
  float *y = ys.data(), *z = zs.data() + shift, *w = ws.data();
#include "launches.inc"
  double tot = 0, mx = -INFINITY;
  for (int j = 0; j < D; j++) {
    double s = 0;
    for (int64_t b = 0; b < dim_B; b++) s += x[b * D + j];
    cmp("y", y[j], std::exp(s * 0.001), 1e-5);
  }
  for (int64_t i = 0; i < n; i++) {
    cmp("z", z[i], (double)x[i] * c[i % D] + 1, 1e-6);
    tot += (double)x[i] * x[i];
    mx = std::max(mx, (double)x[i]);
  }
  cmp("w", w[0], tot + mx, 1e-5);
  for (int i = 0; i < 1024; i++) if (count[i]) { fails++; printf("FAIL count[%d] = %u left\n", i, count[i]); }
  printf("B=%lld shift=%d: %s\n", (long long)dim_B, shift, fails ? "FAIL" : "ok");
}
int main() {
  run(3, 0);
  run(5001, 0);
  run(5001, 1);
  run(20000, 0);
  return fails != 0;
}
