/* cpu_gemm.c: the CPU GEMM's rate on the GEMM shapes of the CPU benchmark
 * workloads (issue 12: "GEMM at >= 70% of the machine's sgemm rate for the
 * shapes in these workloads"), one line a shape: median microseconds and
 * GFLOP/s of tgm_cpu_gemm with the epilogue the workload asks for.
 *
 * Built against the runtime template directly (as tests/unit/test_cpu_kernels.c):
 *   cc -O3 -fopenmp -Itemplates/runtime bench/cpu_gemm.c -lm -o cpu_gemm             (built-in GEMM)
 *   cc -O3 -fopenmp -DTGM_HAVE_CBLAS -I/usr/include/openblas bench/cpu_gemm.c -lopenblas -lm -o cpu_gemm_blas
 * (with the CBLAS, f32 GEMMs go through cblas_split as in an emitted project
 * built with OpenBLAS; those under GEMM_CBLAS_MIN multiply-adds stay built in).
 *   cpu_gemm [--iters N] [--work NAME] [--list]
 * --work times only that workload's shapes; --list prints the shapes only (bench/cpu_gemm_torch.py reads them, so that
 * torch times the same products in the same run). Threads: OMP_NUM_THREADS.
 * Built with -DCPU_GEMM_LIB -shared -fPIC it is instead a library for bench/cpu_gemm_ab.py, which calls it and torch
 * alternately in one process (cg_count, cg_describe, cg_select, cg_call below).
 *
 * The shapes, f32, as tgen prints them for the workloads (bench/specs/
 * mlp_blocks_cpu.yaml at B=1024, spec/examples/mlp3.yaml at B=32,
 * bench/specs/gpt2_cpu.yaml at B=8): ta/tb as tgm_gemm's, M N K, the
 * epilogue. Benchmarks are not tests: nothing here is asserted but that
 * the call succeeds. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "../templates/runtime/tgm_cpu.c"
#include "../templates/runtime/tgm_init.c"

#include <stdio.h>
#include <time.h>

typedef struct Shape {
  const char *work;
  int ta, tb;
  int64_t M, N, K;
  int bias, act, res, dact;
} Shape;

static const Shape shapes[] = {
    {"mlp_blocks_cpu", 0, 1, 1024, 2048, 512, 1, TGM_ACT_GELU, 0, 0}, /* up projection, gelu */
    {"mlp_blocks_cpu", 0, 1, 1024, 512, 2048, 1, TGM_ACT_NONE, 1, 0}, /* down projection + residual */
    {"mlp_blocks_cpu", 0, 0, 1024, 2048, 512, 0, TGM_ACT_GELU, 0, 1}, /* d_h, gelu's backward */
    {"mlp_blocks_cpu", 0, 0, 1024, 512, 2048, 0, TGM_ACT_NONE, 0, 0}, /* d_x */
    {"mlp_blocks_cpu", 1, 0, 2048, 512, 1024, 0, TGM_ACT_NONE, 0, 0}, /* d_w1 */
    {"mlp_blocks_cpu", 1, 0, 512, 2048, 1024, 0, TGM_ACT_NONE, 0, 0}, /* d_w2 */
    {"mlp3_cpu", 0, 1, 32, 512, 512, 1, TGM_ACT_RELU, 0, 0},
    {"mlp3_cpu", 0, 1, 32, 10, 512, 1, TGM_ACT_NONE, 0, 0},
    {"gpt2_cpu", 0, 1, 512, 384, 128, 1, TGM_ACT_NONE, 0, 0}, /* qkv */
    {"gpt2_cpu", 0, 1, 512, 128, 128, 1, TGM_ACT_NONE, 1, 0}, /* attention projection + residual */
    {"gpt2_cpu", 0, 1, 512, 512, 128, 1, TGM_ACT_GELU_TANH, 0, 0}, /* fc */
    {"gpt2_cpu", 0, 1, 512, 128, 512, 1, TGM_ACT_NONE, 1, 0}, /* fc projection + residual */
    {"gpt2_cpu", 0, 1, 512, 512, 128, 0, TGM_ACT_NONE, 0, 0}, /* logits (V = 512) */
    {"gpt2_cpu", 0, 0, 512, 128, 512, 0, TGM_ACT_NONE, 0, 0}, /* d_h of fc projection, logits */
    {"gpt2_cpu", 1, 0, 512, 128, 512, 0, TGM_ACT_NONE, 0, 0}, /* d_w */
    {"gpt2_cpu", 1, 0, 128, 384, 512, 0, TGM_ACT_NONE, 0, 0}, /* d_w qkv */
};
enum { NSHAPES = sizeof shapes / sizeof shapes[0] };

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
#ifndef CPU_GEMM_LIB
static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
#endif
static float *fill(int64_t n, uint32_t seed) {
  float *p = malloc((size_t)n * sizeof *p);
  if (!p) {
    fprintf(stderr, "cpu_gemm: out of memory\n");
    exit(1);
  }
  for (int64_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = (float)((seed >> 8) * (1.0 / 16777216.0) - 0.5);
  }
  return p;
}

/* One shape's operands (fill's values) and its descriptor; plain: the product alone, no epilogue. */
typedef struct Run {
  float *A, *B, *C, *bias, *aux, *res;
  tgm_gemm g;
} Run;

static Run run_make(const Shape *h, int s, int plain) {
  Run r;
  r.A = fill(h->M * h->K, 1 + s), r.B = fill(h->K * h->N, 7 + s), r.C = fill(h->M * h->N, 3);
  r.bias = fill(h->N, 5), r.aux = fill(h->M * h->N, 11), r.res = fill(h->M * h->N, 13);
  tgm_gemm g = {.dt = TGM_F32, .ta = h->ta, .tb = h->tb, .M = h->M, .N = h->N, .K = h->K, .batch = 1,
                .A = r.A, .lda = h->ta ? h->M : h->K, .B = r.B, .ldb = h->tb ? h->K : h->N, .C = r.C, .ldc = h->N,
                .bias = h->bias && !plain ? r.bias : NULL, .act = plain ? TGM_ACT_NONE : h->act,
                .aux = h->dact && !plain ? r.aux : NULL, .residual = h->res && !plain ? r.res : NULL,
                .dact = plain ? 0 : h->dact};
  r.g = g;
  return r;
}

static void run_free(Run *r) {
  free(r->A), free(r->B), free(r->C), free(r->bias), free(r->aux), free(r->res);
  memset(r, 0, sizeof *r);
}

#ifdef CPU_GEMM_LIB
/* The ctypes interface of bench/cpu_gemm_ab.py: the shapes, one selected at a
 * time (its operands made, the previous one's freed), and one timed call. */
static Run sel;
int cg_count(void) { return NSHAPES; }
/* Shape s as `--list` prints it, into buf (n bytes); -1 for no such shape. */
int cg_describe(int s, char *buf, int n) {
  if (s < 0 || s >= NSHAPES)
    return -1;
  const Shape *h = &shapes[s];
  snprintf(buf, (size_t)n, "%s %d %d %lld %lld %lld %d %d %d %d", h->work, h->ta, h->tb, (long long)h->M,
           (long long)h->N, (long long)h->K, h->bias, h->act, h->res, h->dact);
  return 0;
}
int cg_select(int s, int plain) {
  if (s < 0 || s >= NSHAPES)
    return -1;
  run_free(&sel);
  sel = run_make(&shapes[s], s, plain);
  return 0;
}
/* One tgm_cpu_gemm of the selected shape: its seconds, or -1 when refused. */
double cg_call(void) {
  double t0 = now();
  if (!sel.A || tgm_cpu_gemm(&sel.g))
    return -1;
  return now() - t0;
}
#else
int main(int argc, char **argv) {
  int iters = 50, list = 0;
  const char *work = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--work") && i + 1 < argc)
      work = argv[++i];
    else if (!strcmp(argv[i], "--list"))
      list = 1;
    else {
      fprintf(stderr, "usage: cpu_gemm [--iters N] [--work NAME] [--list]\n");
      return 2;
    }
  }
  if (iters < 1)
    iters = 1;
  for (int s = 0; s < NSHAPES; s++) {
    const Shape *h = &shapes[s];
    if (work && strcmp(work, h->work))
      continue;
    if (list) {
      printf("%s %d %d %lld %lld %lld %d %d %d %d\n", h->work, h->ta, h->tb, (long long)h->M, (long long)h->N,
             (long long)h->K, h->bias, h->act, h->res, h->dact);
      continue;
    }
    Run run = run_make(h, s, 0);
    const tgm_gemm g = run.g;
    double *t = malloc((size_t)iters * sizeof *t);
    for (int w = 0; w < 3; w++)
      if (tgm_cpu_gemm(&g)) {
        fprintf(stderr, "cpu_gemm: tgm_cpu_gemm refused shape %d\n", s);
        return 1;
      }
    for (int i = 0; i < iters; i++) {
      double t0 = now();
      tgm_cpu_gemm(&g);
      t[i] = now() - t0;
    }
    qsort(t, (size_t)iters, sizeof *t, cmpd);
    double med = t[iters / 2], fl = 2.0 * h->M * h->N * h->K;
    printf("%-15s ta=%d tb=%d %5lld x %5lld x %5lld bias=%d act=%d res=%d dact=%d: %9.1f us %7.0f GFLOP/s  (min %.1f us)\n",
           h->work, h->ta, h->tb, (long long)h->M, (long long)h->N, (long long)h->K, h->bias, h->act, h->res, h->dact,
           med * 1e6, fl / med * 1e-9, t[0] * 1e6);
    fflush(stdout);
    free(t);
    run_free(&run);
  }
  return 0;
}
#endif
