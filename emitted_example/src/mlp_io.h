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

/* The text of each input's dims as the spec writes them ("B", "64"). */
extern const char *const mlp_input_dim_text[][MLP_MAXRANK];

/* The dynamic dim that is every input's first (the batch, which data-parallel
 * ranks split and an inputs file may hold several of), or -1. */
static inline int mlp_batch_dim(void) {
  for (int s = 0; s < mlp_info.ndyn; s++) {
    int all = mlp_info.ninputs > 0;
    for (int k = 0; k < mlp_info.ninputs; k++)
      all &= mlp_info.inputs[k].rank > 0 && !strcmp(mlp_input_dim_text[k][0], mlp_info.sym_names[s]);
    if (all)
      return s;
  }
  return -1;
}

/* "B=4,T=64" (--dims) into dyn[], given[k] = 1 for each dim named; 0, or -1
 * with err naming the bad part. */
static inline int mlp_parse_dims(const char *s, int64_t *dyn, int *given, char *err, size_t errlen) {
  while (s && *s) {
    const char *eq = strchr(s, '=');
    int k;
    if (!eq)
      return snprintf(err, errlen, "--dims: expected NAME=VALUE in '%s'", s), -1;
    for (k = 0; k < mlp_info.ndyn; k++)
      if (strlen(mlp_info.sym_names[k]) == (size_t)(eq - s) && !strncmp(mlp_info.sym_names[k], s, (size_t)(eq - s)))
        break;
    if (k == mlp_info.ndyn)
      return snprintf(err, errlen, "--dims: '%.*s' is not a dynamic dim of the model", (int)(eq - s), s), -1;
    if (given[k])
      return snprintf(err, errlen, "--dims: %s is given twice", mlp_info.sym_names[k]), -1;
    char *end;
    dyn[k] = strtoll(eq + 1, &end, 10);
    if (end == eq + 1 || (*end && *end != ','))
      return snprintf(err, errlen, "--dims: bad value in '%s'", s), -1;
    given[k] = 1;
    s = *end ? end + 1 : end;
  }
  return 0;
}

/* A test case: the golden file's dims, seed and inputs (or, without the
 * file, dims of 2 (capped by max), the spec's seed and the fixed fill), with
 * the params initialised from the seed and the inputs on the device. */
typedef struct mlp_case {
  int have;                 /* the golden file exists */
  mlp_st_file f;
  int64_t dyn[16], sym[16];
  uint64_t seed;
  mlp_host in[64];
  void *din[64];
} mlp_case;

static inline int mlp_case_open(mlp_model *m, const char *golden, mlp_case *c, char *err, size_t errlen) {
  memset(c, 0, sizeof *c);
  FILE *fp = golden ? fopen(golden, "rb") : NULL;
  c->have = fp != NULL;
  if (fp)
    fclose(fp);
  if (c->have && mlp_st_read(golden, &c->f, err, errlen))
    return -1;
  c->seed = mlp_info.seed;
  if (c->have) {
    const mlp_tensor_desc *d = mlp_st_find(&c->f, "meta.dims"), *s = mlp_st_find(&c->f, "meta.seed");
    if (!d || !s)
      return snprintf(err, errlen, "%s lacks meta.dims or meta.seed", golden), -1;
    for (int k = 0; k < mlp_info.ndyn; k++)
      c->dyn[k] = ((const int32_t *)d->data)[1 + k];
    c->seed = (uint64_t)(uint32_t)((const int32_t *)s->data)[0] | (uint64_t)(uint32_t)((const int32_t *)s->data)[1] << 32;
  } else {
    for (int k = 0; k < mlp_info.ndyn; k++)
      c->dyn[k] = mlp_info.dyn_max[k] < 2 ? mlp_info.dyn_max[k] : 2;
  }
  if (mlp_compute_syms(c->dyn, c->sym, err, errlen))
    return -1;
  if (mlp_init_params(m, c->seed))
    return snprintf(err, errlen, "init: %s", mlp_error(m)), -1;
  for (int k = 0; k < mlp_info.ninputs; k++) {
    if (mlp_host_alloc(&c->in[k], 0, k, c->sym))
      return snprintf(err, errlen, "out of memory"), -1;
    if (c->have) {
      const mlp_tensor_desc *t = mlp_st_find(&c->f, mlp_info.inputs[k].name);
      if (!t || t->dtype != c->in[k].dtype || mlp_numel(t->rank, t->shape) != c->in[k].numel)
        return snprintf(err, errlen, "golden input '%s' missing or of the wrong shape", mlp_info.inputs[k].name), -1;
      memcpy(c->in[k].data, t->data, (size_t)c->in[k].numel * (size_t)mlp_dtype_sizes[c->in[k].dtype]);
    } else {
      mlp_host_fill(&c->in[k], mlp_info.inputs[k].name);
    }
    if (mlp_to_device(m, &c->in[k], &c->din[k]))
      return snprintf(err, errlen, "copying input '%s' to the device", mlp_info.inputs[k].name), -1;
  }
  return 0;
}

static inline void mlp_case_close(mlp_model *m, mlp_case *c) {
  for (int k = 0; k < mlp_info.ninputs; k++) {
    if (c->din[k] && c->din[k] != c->in[k].data)
      mlp_device_free(m, c->din[k]);
    free(c->in[k].data);
  }
  if (c->have)
    mlp_st_free(&c->f);
}

/* max|got - want| / max|want| over the finite wanted values; *finite = 0 if
 * got has a non-finite value where want is finite. */
static inline double mlp_rel_err(const void *got, int dt, const float *want, int64_t n, double *maxref, int *finite) {
  double maxdiff = 0;
  *maxref = 0;
  *finite = 1;
  for (int64_t i = 0; i < n; i++) {
    double g = mlp_get(got, dt, i), w = want ? want[i] : 0;
    if (want && !isfinite(w))
      continue;
    *finite &= isfinite(g) ? 1 : 0;
    if (want && fabs(g - w) > maxdiff)
      maxdiff = fabs(g - w);
    if (want && fabs(w) > *maxref)
      *maxref = fabs(w);
  }
  return maxdiff / (*maxref > 1e-6 ? *maxref : 1e-6);
}

#endif
