/* tgm_io.h: helpers shared by the runner, the tests and the benchmark of the
 * tgm model (host-side tensors, safetensors in/out, device copies). Template:
 * copied as src/NAME_io.h. */
#ifndef TGM_IO_H
#define TGM_IO_H

#include "tgm_rt.h"
#include "tgm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A host tensor of one of the model's inputs or outputs. */
typedef struct tgm_host {
  int dtype, rank;
  int64_t shape[TGM_MAXRANK];
  int64_t numel;
  void *data;
} tgm_host;

static inline int64_t tgm_numel(int rank, const int64_t *s) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++)
    n *= s[i];
  return n;
}

/* Allocate input or output k at the dims' shapes (zeroed). */
static inline int tgm_host_alloc(tgm_host *h, int is_output, int k, const int64_t *sym) {
  const tgm_io_info *io = is_output ? &tgm_info.outputs[k] : &tgm_info.inputs[k];
  memset(h, 0, sizeof *h);
  h->dtype = io->dtype;
  h->rank = io->rank;
  tgm_io_shape(is_output, k, sym, h->shape);
  h->numel = tgm_numel(h->rank, h->shape);
  h->data = calloc((size_t)h->numel + 1, (size_t)tgm_dtype_sizes[h->dtype]);
  return h->data ? 0 : -1;
}

/* A fixed pseudo-random fill: floats uniform in [-1, 1), integers 0. */
static inline void tgm_host_fill(tgm_host *h, const char *name) {
  for (int64_t i = 0; i < h->numel; i++)
    tgm_put(h->data, h->dtype, i,
            h->dtype <= TGM_F16 ? tgm_init_value(name, TGM_INIT_UNIFORM, -1, 1, TGM_F32, 0, NULL, 12345, i) : 0);
}

/* Device buffers for the host tensors (a no-op copy on the CPU). */
static inline int tgm_to_device(tgm_model *m, const tgm_host *h, void **dev) {
  size_t n = (size_t)h->numel * (size_t)tgm_dtype_sizes[h->dtype];
  if (m->device == 0) {
    *dev = h->data;
    return 0;
  }
#ifdef TGM_HAVE_CUDA
  if (tgm_cuda_malloc(m->cx, dev, n ? n : 1))
    return -1;
  return tgm_cuda_memcpy(m->cx, *dev, h->data, n, 0);
#else
  (void)n;
  return -1;
#endif
}

static inline int tgm_from_device(tgm_model *m, tgm_host *h, void *dev) {
  if (m->device == 0)
    return 0;
#ifdef TGM_HAVE_CUDA
  return tgm_cuda_memcpy(m->cx, h->data, dev, (size_t)h->numel * (size_t)tgm_dtype_sizes[h->dtype], 1);
#else
  (void)dev;
  return -1;
#endif
}

static inline void tgm_device_free(tgm_model *m, void *dev) {
#ifdef TGM_HAVE_CUDA
  if (m->device == 1)
    tgm_cuda_free(m->cx, dev);
#else
  (void)m;
  (void)dev;
#endif
}

#endif
