// Session 25: LLGR's GEMM + erf gelu + residual (16384 x 512 x 512 f16): where its 40 us go, and what moving the
// bias out of cuBLASLt's epilogue (2.9 us, but then the product is rounded before the bias: not tgm_rt.h's
// rounding) or a leaner epilogue kernel (k_epi2) would give. Results: bench/results/h100_gpu_session25.txt.
// Build (device): nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/epi_bench \
//   bench/results/session25_epilogue_bench.cu tgm_cpu.o -Xcompiler -fopenmp -lcublas -lcublasLt
#include "../../templates/runtime/tgm_cuda.cu"
#include "../../templates/runtime/tgm_init.c"
#include <cstdio>
#include <vector>
#include <algorithm>

/* rows of N = 8 NV columns: block of 256 threads = 256 / NV rows x NV vectors; bias, act, + residual; in place */
template <class T, int NV, int ACT, int UNROLL>
__global__ void __launch_bounds__(256) k_epi2(T *C, const T *__restrict__ bias, const T *__restrict__ res, int M) {
  constexpr int RB = 256 / NV;
  const int j = threadIdx.x % NV * 8;
  Vec<T, 8> bv = *reinterpret_cast<const Vec<T, 8> *>(bias + j);
  for (int r0 = (blockIdx.x * RB + threadIdx.x / NV) * UNROLL; r0 < M; r0 += gridDim.x * RB * UNROLL) {
    Vec<T, 8> cv[UNROLL], rv[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++)
      if (r0 + u < M) {
        cv[u] = *reinterpret_cast<const Vec<T, 8> *>(C + (int64_t)(r0 + u) * NV * 8 + j);
        rv[u] = *reinterpret_cast<const Vec<T, 8> *>(res + (int64_t)(r0 + u) * NV * 8 + j);
      }
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      if (r0 + u >= M) break;
      Vec<T, 8> o;
#pragma unroll
      for (int k = 0; k < 8; k++) {
        float x = to_f(from_f<T>(to_f(cv[u].v[k]) + to_f(bv.v[k])));
        if (ACT) x = to_f(from_f<T>(tgm_gelu(x, 0)));
        o.v[k] = from_f<T>(x + to_f(rv[u].v[k]));
      }
      *reinterpret_cast<Vec<T, 8> *>(C + (int64_t)(r0 + u) * NV * 8 + j) = o;
    }
  }
}

static tgm_cuda_ctx *cx;
template <class F> static double timeit(F f, int it = 100) {
  for (int i = 0; i < 5; i++) f();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a, cx->stream);
  for (int i = 0; i < it; i++) f();
  cudaEventRecord(b, cx->stream);
  cudaEventSynchronize(b);
  float ms;
  cudaEventElapsedTime(&ms, a, b);
  return ms * 1000.0 / it;
}
int main() {
  setvbuf(stdout, NULL, _IONBF, 0);
  char err[256];
  if (tgm_cuda_ctx_create(&cx, err, sizeof err)) { printf("ctx: %s\n", err); return 1; }
  const int64_t M = 16384, N = 512, K = 512;
  std::vector<uint16_t> h((size_t)M * K);
  for (size_t i = 0; i < h.size(); i++) h[i] = tgm_f32_to_f16(((i * 2654435761u) % 1000) / 1000.0f - 0.5f);
  void *A, *B, *C, *R, *bias;
  cudaMalloc(&A, M * K * 2); cudaMalloc(&B, N * K * 2); cudaMalloc(&C, M * N * 2); cudaMalloc(&R, M * N * 2); cudaMalloc(&bias, N * 2);
  cudaMemcpy(A, h.data(), M * K * 2, cudaMemcpyHostToDevice); cudaMemcpy(B, h.data() + 7, N * K * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(R, h.data() + 3, M * N * 2, cudaMemcpyHostToDevice); cudaMemcpy(bias, h.data() + 11, N * 2, cudaMemcpyHostToDevice);
  tgm_gemm g = {};
  g.dt = TGM_F16; g.tb = 1; g.M = M; g.N = N; g.K = K; g.batch = 1; g.A = A; g.lda = K; g.B = B; g.ldb = K; g.C = C; g.ldc = N;
  g.bias = bias; g.act = TGM_ACT_GELU; g.residual = R;
  tgm_gemm q = g;
  q.bias = NULL; q.act = TGM_ACT_NONE; q.residual = NULL;
  tgm_gemm qb = q;
  qb.bias = bias;
  std::vector<uint16_t> ref((size_t)(M * N)), got((size_t)(M * N));
  auto check = [&](const char *name, double us) {
    cudaError_t e = cudaStreamSynchronize(cx->stream);
    cudaMemcpy(got.data(), C, M * N * 2, cudaMemcpyDeviceToHost);
    int64_t differ = 0; double worst = 0;
    for (int64_t i = 0; i < M * N; i++) {
      float x = tgm_f16_to_f32(got[i]), y = tgm_f16_to_f32(ref[i]);
      differ += got[i] != ref[i];
      worst = std::max(worst, (double)fabsf(x - y) / std::max(1.0f, fabsf(y)));
    }
    printf("%-60s %7.2f us  %lld differ (of %lld), worst %.2e%s\n", name, us, (long long)differ, (long long)(M * N), worst, e ? " CUDA ERROR" : "");
  };
  bool none;
  int sms = cx->sms;
  for (int round = 0; round < 2; round++) {
    printf("-- round %d\n", round);
    double t0 = timeit([&] { tgm_cuda_gemm(cx, &g); });
    tgm_cuda_gemm(cx, &g);
    cudaStreamSynchronize(cx->stream);
    cudaMemcpy(ref.data(), C, M * N * 2, cudaMemcpyDeviceToHost);
    check("old: cuBLASLt + bias, k_gemm_epilogue gelu + res", t0);
    double tp = timeit([&] { lt_matmul(cx, &q, C, 0, N, M * N, NULL, 0.0f, CUBLASLT_EPILOGUE_DEFAULT, &none); });
    double tpb = timeit([&] { lt_matmul(cx, &qb, C, 0, N, M * N, NULL, 0.0f, CUBLASLT_EPILOGUE_BIAS, &none); });
    printf("%-60s %7.2f us\n%-60s %7.2f us\n", "cuBLASLt product alone", tp, "cuBLASLt product + BIAS", tpb);
    double t1 = timeit([&] {
      lt_matmul(cx, &q, C, 0, N, M * N, NULL, 0.0f, CUBLASLT_EPILOGUE_DEFAULT, &none);
      gemm_epilogue(cx, &g, C, 1, N, M * N);
    });
    check("cuBLASLt product, k_gemm_epilogue bias + gelu + res", t1);
    double te = timeit([&] { gemm_epilogue(cx, &g, C, 1, N, M * N); });
    printf("%-60s %7.2f us\n", "k_gemm_epilogue bias + gelu + res alone", te);
    for (int mult : {4, 8, 16}) {
      auto run2 = [&](bool act, int unroll) {
        unsigned grid = (unsigned)sms * mult;
        if (act && unroll == 1) k_epi2<f16, 64, 1, 1><<<grid, 256, 0, cx->stream>>>((f16 *)C, (const f16 *)bias, (const f16 *)R, (int)M);
        if (act && unroll == 2) k_epi2<f16, 64, 1, 2><<<grid, 256, 0, cx->stream>>>((f16 *)C, (const f16 *)bias, (const f16 *)R, (int)M);
        if (!act && unroll == 1) k_epi2<f16, 64, 0, 1><<<grid, 256, 0, cx->stream>>>((f16 *)C, (const f16 *)bias, (const f16 *)R, (int)M);
        if (!act && unroll == 2) k_epi2<f16, 64, 0, 2><<<grid, 256, 0, cx->stream>>>((f16 *)C, (const f16 *)bias, (const f16 *)R, (int)M);
      };
      for (int unroll : {1, 2}) {
        char name[128];
        double tk = timeit([&] { run2(true, unroll); });
        snprintf(name, sizeof name, "k_epi2 gelu alone (grid %dx SMs, unroll %d)", mult, unroll);
        printf("%-60s %7.2f us\n", name, tk);
        double tn = timeit([&] { run2(false, unroll); });
        snprintf(name, sizeof name, "k_epi2 no act alone (grid %dx SMs, unroll %d)", mult, unroll);
        printf("%-60s %7.2f us\n", name, tn);
        double t2 = timeit([&] {
          lt_matmul(cx, &q, C, 0, N, M * N, NULL, 0.0f, CUBLASLT_EPILOGUE_DEFAULT, &none);
          run2(true, unroll);
        });
        lt_matmul(cx, &q, C, 0, N, M * N, NULL, 0.0f, CUBLASLT_EPILOGUE_DEFAULT, &none);
        run2(true, unroll);
        snprintf(name, sizeof name, "cuBLASLt product, k_epi2 (grid %dx SMs, unroll %d)", mult, unroll);
        check(name, t2);
      }
    }
  }
  return 0;
}
