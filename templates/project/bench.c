/* tgm_bench: times the forward pass, or the training step.
 *   tgm_bench [--device cpu|cuda] [--dims B=...] [--iters N] [--warmup N] [--train 1]
 * Prints the median, min and max milliseconds per call over N timed
 * iterations after the warm-up (each timed call is followed by a sync), and the
 * workspace the pass needs at these dims. --train 1 times train_step
 * (forward, backward, optimizer) on a fixed batch; for a model without an
 * optimizer (train.wrt only), forward_backward (loss and gradients). */
#define _POSIX_C_SOURCE 200809L
#include "tgm_io.h"

#include <time.h>

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  const char *device = "cpu", *dims = NULL;
  int iters = 20, warmup = 3, train = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--device")) device = argv[i + 1];
    else if (!strcmp(argv[i], "--dims")) dims = argv[i + 1];
    else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--warmup")) warmup = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--train")) train = atoi(argv[i + 1]);
    else return fprintf(stderr, "tgm_bench: unknown option '%s'\n", argv[i]), 1;
  }
  if (iters < 1 || iters > 100000)
    iters = 20;
  int64_t dyn[16] = {0}, sym[16] = {0};
  for (int k = 0; k < tgm_info.ndyn; k++)
    dyn[k] = tgm_info.dyn_max[k];
  char err[512];
  int given[16] = {0};
  if (tgm_parse_dims(dims, dyn, given, err, sizeof err) || tgm_compute_syms(dyn, sym, err, sizeof err))
    return fprintf(stderr, "tgm_bench: %s\n", err), 1;
  tgm_model *m;
  if (tgm_create(device, &m, err, sizeof err))
    return fprintf(stderr, "tgm_bench: %s\n", err), 1;
  tgm_init_params(m, tgm_info.seed);
  tgm_host in[64], out[64];
  void *din[64], *dout[64];
  for (int k = 0; k < tgm_info.ninputs; k++) {
    if (tgm_host_alloc(&in[k], 0, k, sym))
      return 1;
    tgm_host_fill(&in[k], tgm_info.inputs[k].name);
    if (tgm_to_device(m, &in[k], &din[k]))
      return 1;
  }
  for (int k = 0; k < tgm_info.noutputs; k++)
    if (tgm_host_alloc(&out[k], 1, k, sym) || tgm_to_device(m, &out[k], &dout[k]))
      return 1;
  double *t = calloc((size_t)iters, sizeof *t);
  for (int i = 0; i < warmup + iters; i++) {
    double t0 = now_ms();
    float loss;
    const void *const *in = (const void *const *)din;
    if (train ? (tgm_info.optimizer ? tgm_train_step_v(m, dyn, in, &loss) : tgm_forward_backward_v(m, dyn, in, &loss))
              : tgm_forward_v(m, dyn, in, dout))
      return fprintf(stderr, "tgm_bench: %s\n", tgm_error(m)), 1;
#ifdef TGM_HAVE_CUDA
    if (m->device == 1 && tgm_cuda_sync(m->cx)) /* the passes do not wait for the GPU; the timing must */
      return fprintf(stderr, "tgm_bench: %s\n", tgm_cuda_ctx_error(m->cx)), 1;
#endif
    if (i >= warmup)
      t[i - warmup] = now_ms() - t0;
  }
  qsort(t, (size_t)iters, sizeof *t, cmp);
  printf("tgm %s on %s:", train ? (tgm_info.optimizer ? "train_step" : "forward_backward") : "forward", device);
  for (int k = 0; k < tgm_info.ndyn; k++)
    printf(" %s=%lld", tgm_info.sym_names[k], (long long)dyn[k]);
  printf("  median %.4f ms  min %.4f  max %.4f  (%d iterations)  workspace %.1f MiB\n", t[iters / 2], t[0],
         t[iters - 1], iters, (double)tgm_pass_arena[train ? TGM_PASS_TRAIN : TGM_PASS_FORWARD] / 1048576.0);
  free(t);
  tgm_destroy(m);
  return 0;
}
