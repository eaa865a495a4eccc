/* mlp_io.h: helpers shared by the runner, the tests and the benchmark of the
 * mlp model (host-side tensors, safetensors in/out, device copies). Template:
 * copied as src/NAME_io.h. */
#ifndef MLP_IO_H
#define MLP_IO_H

#include "mlp_rt.h"
#include "mlp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A host tensor of one of the model's inputs or outputs. */
typedef struct mlp_host {
  int dtype, rank;
  int64_t shape[MLP_MAXRANK];
  int64_t numel;
  void *data;
} mlp_host;

static inline int64_t mlp_numel(int rank, const int64_t *s) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++)
    n *= s[i];
  return n;
}

/* Allocate input or output k at the dims' shapes (zeroed). */
static inline int mlp_host_alloc(mlp_host *h, int is_output, int k, const int64_t *sym) {
  const mlp_io_info *io = is_output ? &mlp_info.outputs[k] : &mlp_info.inputs[k];
  memset(h, 0, sizeof *h);
  h->dtype = io->dtype;
  h->rank = io->rank;
  mlp_io_shape(is_output, k, sym, h->shape);
  h->numel = mlp_numel(h->rank, h->shape);
  h->data = calloc((size_t)h->numel + 1, (size_t)mlp_dtype_sizes[h->dtype]);
  return h->data ? 0 : -1;
}

/* A fixed pseudo-random fill: floats uniform in [-1, 1), integers 0. */
static inline void mlp_host_fill(mlp_host *h, const char *name) {
  for (int64_t i = 0; i < h->numel; i++)
    mlp_put(h->data, h->dtype, i,
            h->dtype <= MLP_F16 ? mlp_init_value(name, MLP_INIT_UNIFORM, -1, 1, MLP_F32, 0, NULL, 12345, i) : 0);
}

/* Device buffers for the host tensors (a no-op copy on the CPU). */
static inline int mlp_to_device(mlp_model *m, const mlp_host *h, void **dev) {
  size_t n = (size_t)h->numel * (size_t)mlp_dtype_sizes[h->dtype];
  if (m->device == 0) {
    *dev = h->data;
    return 0;
  }
#ifdef MLP_HAVE_CUDA
  if (mlp_cuda_malloc(m->cx, dev, n ? n : 1))
    return -1;
  return mlp_cuda_memcpy(m->cx, *dev, h->data, n, 0);
#else
  (void)n;
  return -1;
#endif
}

static inline int mlp_from_device(mlp_model *m, mlp_host *h, void *dev) {
  if (m->device == 0)
    return 0;
#ifdef MLP_HAVE_CUDA
  return mlp_cuda_memcpy(m->cx, h->data, dev, (size_t)h->numel * (size_t)mlp_dtype_sizes[h->dtype], 1);
#else
  (void)dev;
  return -1;
#endif
}

static inline void mlp_device_free(mlp_model *m, void *dev) {
#ifdef MLP_HAVE_CUDA
  if (m->device == 1)
    mlp_cuda_free(m->cx, dev);
#else
  (void)m;
  (void)dev;
#endif
}

#endif
