/* mlp_bench: times the forward pass, or the training step.
 *   mlp_bench [--device cpu|cuda] [--dims B=...] [--iters N] [--warmup N] [--train 0|1] [--graphs 0|1] [--autotune 0|1]
 *             [--threads N] [--int-range N]
 * (an unknown option, one without its value or a value out of its range is an error, exit status 1)
 * Prints the median, min and max milliseconds per call over N timed
 * iterations after the warm-up (on cuda: CUDA events around each call on the
 * bench's stream, as PyTorch is timed; the wall clock with a sync after each
 * call is printed too), and the workspace the pass needs at these dims. --train 1 times train_step
 * (forward, backward, optimizer) on a fixed batch; for a model without an
 * optimizer (train.wrt only), forward_backward (loss and gradients). --graphs 1 replays each
 * call from a CUDA graph (mlp_set_graphs; default: the spec's compile.mode); --autotune 1 times
 * cuBLASLt's candidates for each GEMM in the warm-up (mlp_set_autotune, choices in memory only); --threads N
 * runs the CPU's work on N OpenMP threads (mlp_set_threads; default: OpenMP's, OMP_NUM_THREADS). Inputs
 * are fixed: floats uniform in [-1, 1), integers 0, or with --int-range N uniform in [0, N) (token ids or
 * class labels as a data loader gives them: an embedding's backward and a loss over all-zero indices
 * are not the work real batches ask for). */
#define _POSIX_C_SOURCE 200809L
#include "mlp_io.h"

#include <errno.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef MLP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Integer input k's elements uniform in [0, n): words 0 and 1 of the runtime's Philox at counter (i, k). */
static void fill_ints(mlp_host *h, int k, int64_t n) {
  const uint32_t key[2] = {12345u, 0u};
  for (int64_t i = 0; i < h->numel; i++) {
    uint32_t ctr[4] = {(uint32_t)i, (uint32_t)((uint64_t)i >> 32), (uint32_t)k, 0u}, r[4];
    mlp_philox4x32(ctr, key, r);
    ((int32_t *)h->data)[i] = (int32_t)((((uint64_t)r[0] << 32) | r[1]) % (uint64_t)n);
  }
}

/* Option opt's value v as an integer in [lo, hi] into *out; 0, or -1 after saying what was wrong. */
static int opt_int(const char *opt, const char *v, long long lo, long long hi, long long *out) {
  char *end;
  errno = 0;
  long long n = strtoll(v, &end, 10);
  if (errno || end == v || *end || n < lo || n > hi) {
    fprintf(stderr, "mlp_bench: %s takes an integer from %lld to %lld, not '%s'\n", opt, lo, hi, v);
    return -1;
  }
  *out = n;
  return 0;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  const char *device = "cpu", *dims = NULL;
  int iters = 20, warmup = 3, train = 0, graphs = -1, tune = -1, threads = 0;
  long long int_range = 0;
  for (int i = 1; i < argc; i += 2) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    long long n = 0;
    int rc = 0;
    if (!strcmp(a, "--help") || !strcmp(a, "-h"))
      return puts("mlp_bench [--device cpu|cuda] [--dims B=...] [--iters N] [--warmup N] [--train 0|1] [--graphs 0|1] "
                  "[--autotune 0|1] [--threads N] [--int-range N]"), 0;
    if (!v)
      return fprintf(stderr, "mlp_bench: %s: missing value (or unknown option)\n", a), 1;
    if (!strcmp(a, "--device")) device = v;
    else if (!strcmp(a, "--dims")) dims = v;
    else if (!strcmp(a, "--iters")) rc = opt_int(a, v, 1, 100000, &n), iters = (int)n;
    else if (!strcmp(a, "--warmup")) rc = opt_int(a, v, 0, 100000, &n), warmup = (int)n;
    else if (!strcmp(a, "--train")) rc = opt_int(a, v, 0, 1, &n), train = (int)n;
    else if (!strcmp(a, "--graphs")) rc = opt_int(a, v, 0, 1, &n), graphs = (int)n;
    else if (!strcmp(a, "--autotune")) rc = opt_int(a, v, 0, 1, &n), tune = (int)n;
    else if (!strcmp(a, "--threads")) rc = opt_int(a, v, 0, MLP_MAX_THREADS, &n), threads = (int)n;
    else if (!strcmp(a, "--int-range")) rc = opt_int(a, v, 0, INT32_MAX, &n), int_range = n;
    else return fprintf(stderr, "mlp_bench: unknown option '%s'\n", a), 1;
    if (rc)
      return 1;
  }
  int64_t dyn[16] = {0}, sym[16] = {0};
  for (int k = 0; k < mlp_info.ndyn; k++)
    dyn[k] = mlp_info.dyn_max[k];
  char err[512];
  int given[16] = {0};
  if (mlp_parse_dims(dims, dyn, given, err, sizeof err) || mlp_compute_syms(dyn, sym, err, sizeof err))
    return fprintf(stderr, "mlp_bench: %s\n", err), 1;
  mlp_model *m;
  if (mlp_create(device, &m, err, sizeof err))
    return fprintf(stderr, "mlp_bench: %s\n", err), 1;
  mlp_init_params(m, mlp_info.seed);
  if ((graphs >= 0 && mlp_set_graphs(m, graphs)) || (tune >= 0 && mlp_set_autotune(m, tune, "")) ||
      mlp_set_threads(m, threads))
    return fprintf(stderr, "mlp_bench: %s\n", mlp_error(m)), 1;
  mlp_host in[64], out[64];
  void *din[64], *dout[64];
  for (int k = 0; k < mlp_info.ninputs; k++) {
    if (mlp_host_alloc(&in[k], 0, k, sym))
      return 1;
    mlp_host_fill(&in[k], mlp_info.inputs[k].name);
    if (int_range > 0 && in[k].dtype == MLP_I32)
      fill_ints(&in[k], k, int_range);
    if (mlp_to_device(m, &in[k], &din[k]))
      return 1;
  }
  int nout = train ? 0 : mlp_info.noutputs; /* a training step writes no outputs */
  for (int k = 0; k < nout; k++)
    if (mlp_host_alloc(&out[k], 1, k, sym) || mlp_to_device(m, &out[k], &dout[k]))
      return 1;
  double *t = calloc((size_t)iters, sizeof *t), *w = calloc((size_t)iters, sizeof *w);
  if (!t || !w)
    return fprintf(stderr, "mlp_bench: out of memory\n"), 1;
#ifdef MLP_HAVE_CUDA
  /* on cuda: CUDA events around each call on the bench's own stream (as
   * torch is timed), besides the wall clock */
  cudaStream_t st = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL;
  if (m->device == 1 && (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) || cudaEventCreate(&e0) ||
                         cudaEventCreate(&e1) || mlp_set_stream(m, st)))
    return fprintf(stderr, "mlp_bench: creating the stream and events failed\n"), 1;
#endif
  for (int i = 0; i < warmup + iters; i++) {
    double t0 = now_ms();
#ifdef MLP_HAVE_CUDA
    if (st)
      cudaEventRecord(e0, st);
#endif
    /* the calls do not wait for the GPU (the loss stays there); the timing must */
    const void *const *in = (const void *const *)din;
    if (train ? (mlp_info.optimizer ? mlp_train_step_v(m, dyn, in, NULL) : mlp_forward_backward_v(m, dyn, in, NULL))
              : mlp_forward_v(m, dyn, in, dout))
      return fprintf(stderr, "mlp_bench: %s\n", mlp_error(m)), 1;
    float ms = 0;
#ifdef MLP_HAVE_CUDA
    if (st && (cudaEventRecord(e1, st) || cudaEventSynchronize(e1) || cudaEventElapsedTime(&ms, e0, e1)))
      return fprintf(stderr, "mlp_bench: timing with CUDA events failed\n"), 1;
#endif
    if (mlp_sync(m))
      return fprintf(stderr, "mlp_bench: %s\n", mlp_error(m)), 1;
    if (i >= warmup) {
      w[i - warmup] = now_ms() - t0;
      t[i - warmup] = m->device == 1 ? ms : w[i - warmup];
    }
  }
  qsort(t, (size_t)iters, sizeof *t, cmp);
  qsort(w, (size_t)iters, sizeof *w, cmp);
  printf("mlp %s on %s:", train ? (mlp_info.optimizer ? "train_step" : "forward_backward") : "forward", device);
  for (int k = 0; k < mlp_info.ndyn; k++)
    printf(" %s=%lld", mlp_info.sym_names[k], (long long)dyn[k]);
  printf("  median %.4f ms  min %.4f  max %.4f  (%d iterations, %s)  wall median %.4f ms  graphs %s  workspace %.1f MiB",
         t[iters / 2], t[0], t[iters - 1], iters, m->device == 1 ? "CUDA events" : "wall clock", w[iters / 2],
         m->graphs ? "on" : "off", (double)mlp_pass_arena[train ? MLP_PASS_TRAIN : MLP_PASS_FORWARD] / 1048576.0);
  int64_t mem_now, mem_peak;
  if (m->device == 1 && !mlp_device_memory(m, &mem_now, &mem_peak))
    printf("  device memory peak %.1f MiB", (double)mem_peak / 1048576.0);
  if (m->device == 0) {
#ifdef _OPENMP
    printf("  threads %d", threads ? threads : omp_get_max_threads());
#else
    printf("  threads 1 (no OpenMP)");
#endif
  }
  printf("\n");
  free(t);
  free(w);
  mlp_destroy(m);
#ifdef MLP_HAVE_CUDA
  if (st) {
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaStreamDestroy(st);
  }
#endif
  return 0;
}
