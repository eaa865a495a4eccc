/* fork/join cost and mlp3's GEMMs (B=32) one by one, on this machine's threads */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "../../templates/runtime/tgm_cpu.c"
#include "../../templates/runtime/tgm_init.c"
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
#define N_IT 3000
static double med(double *t) { qsort(t, N_IT, sizeof *t, cmpd); return t[N_IT / 2] * 1e6; }
static float *fl(int64_t n, float sc) { float *p = malloc(n * 4); for (int64_t i = 0; i < n; i++) p[i] = ((float)((i * 7919) % 1000) * 1e-3f - 0.5f) * sc; return p; }
int main(void) {
  static double t[N_IT];
  volatile int sink = 0;
  for (int i = 0; i < N_IT; i++) { double t0 = now();
#pragma omp parallel
    { sink += 0; }
    t[i] = now() - t0; }
  printf("threads %d: empty parallel region %.2f us\n", omp_get_max_threads(), med(t));
  for (int i = 0; i < N_IT; i++) { double t0 = now();
#pragma omp parallel for schedule(static)
    for (int k = 0; k < 64; k++) sink += 0;
    t[i] = now() - t0; }
  printf("  parallel for of 64 empty tasks %.2f us\n", med(t));
  float *x = fl(32 * 512, 3.4f), *w1 = fl(512 * 512, 0.0884f), *w2 = fl(512 * 512, 0.0884f), *w3 = fl(10 * 512, 0.0884f), *b = fl(512, 0.1f), *h1 = fl(32 * 512, 1), *h2 = fl(32 * 512, 1), *y = fl(320, 1);
  tgm_gemm g1 = {.dt = TGM_F32, .ta = 0, .tb = 1, .M = 32, .N = 512, .K = 512, .batch = 1, .A = x, .lda = 512, .B = w1, .ldb = 512, .C = h1, .ldc = 512, .bias = b, .act = TGM_ACT_GELU};
  tgm_gemm g2 = g1; g2.A = h1; g2.B = w2; g2.C = h2;
  tgm_gemm g3 = g1; g3.A = h2; g3.B = w3; g3.N = 10; g3.C = y; g3.ldc = 10; g3.act = TGM_ACT_NONE;
  tgm_gemm *gs[3] = {&g1, &g2, &g3};
  for (int q = 0; q < 3; q++) {
    for (int i = 0; i < 100; i++) tgm_cpu_gemm(gs[q]);
    for (int i = 0; i < N_IT; i++) { double t0 = now(); tgm_cpu_gemm(gs[q]); t[i] = now() - t0; }
    printf("  gemm %d (32 x %lld x 512%s) %.2f us\n", q + 1, (long long)gs[q]->N, q < 2 ? ", gelu" : "", med(t));
  }
  for (int i = 0; i < 100; i++) for (int q = 0; q < 3; q++) tgm_cpu_gemm(gs[q]);
  for (int i = 0; i < N_IT; i++) { double t0 = now(); for (int q = 0; q < 3; q++) tgm_cpu_gemm(gs[q]); t[i] = now() - t0; }
  printf("  the three in turn %.2f us\n", med(t));
  /* the same products without the gelu */
  g1.act = g2.act = TGM_ACT_NONE;
  for (int i = 0; i < N_IT; i++) { double t0 = now(); for (int q = 0; q < 3; q++) tgm_cpu_gemm(gs[q]); t[i] = now() - t0; }
  printf("  the three without gelu %.2f us\n", med(t));
  return sink < 0;
}
