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

/* The text of each input's dims as the spec writes them ("B", "64"). */
extern const char *const tgm_input_dim_text[][TGM_MAXRANK];

/* The dynamic dim that is every input's first (the batch, which data-parallel
 * ranks split and an inputs file may hold several of), or -1. */
static inline int tgm_batch_dim(void) {
  for (int s = 0; s < tgm_info.ndyn; s++) {
    int all = tgm_info.ninputs > 0;
    for (int k = 0; k < tgm_info.ninputs; k++)
      all &= tgm_info.inputs[k].rank > 0 && !strcmp(tgm_input_dim_text[k][0], tgm_info.sym_names[s]);
    if (all)
      return s;
  }
  return -1;
}

/* "B=4,T=64" (--dims) into dyn[], given[k] = 1 for each dim named; 0, or -1
 * with err naming the bad part. */
static inline int tgm_parse_dims(const char *s, int64_t *dyn, int *given, char *err, size_t errlen) {
  while (s && *s) {
    const char *eq = strchr(s, '=');
    int k;
    if (!eq)
      return snprintf(err, errlen, "--dims: expected NAME=VALUE in '%s'", s), -1;
    for (k = 0; k < tgm_info.ndyn; k++)
      if (strlen(tgm_info.sym_names[k]) == (size_t)(eq - s) && !strncmp(tgm_info.sym_names[k], s, (size_t)(eq - s)))
        break;
    if (k == tgm_info.ndyn)
      return snprintf(err, errlen, "--dims: '%.*s' is not a dynamic dim of the model", (int)(eq - s), s), -1;
    if (given[k])
      return snprintf(err, errlen, "--dims: %s is given twice", tgm_info.sym_names[k]), -1;
    char *end;
    dyn[k] = strtoll(eq + 1, &end, 10);
    if (end == eq + 1 || (*end && *end != ','))
      return snprintf(err, errlen, "--dims: bad value in '%s'", s), -1;
    given[k] = 1;
    s = *end ? end + 1 : end;
  }
  return 0;
}

/*@uses distributed@*/
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

/* One process per rank on this host (the runner's and the bench's --nproc,
 * the multi-GPU test): n children, forked before anything starts CUDA. In a
 * child: returns -1 with *rank set, and rdv holds the rendezvous
 * ("file:PATH" in a fresh directory). In the parent: waits for every child
 * and returns 0 when all exited 0, 77 when some exited 77 (skipped) and
 * none failed, else 1; a failing rank stops the others (which would wait
 * for it in NCCL for ever) and the parent says so on stderr. */
static inline int tgm_fork_ranks(int n, int *rank, char *rdv, size_t rdvlen) {
  const char *tmp = getenv("TMPDIR");
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/tgm_ranks.XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir))
    return fprintf(stderr, "cannot make a directory in %s: %s\n", tmp && *tmp ? tmp : "/tmp", strerror(errno)), 1;
  snprintf(rdv, rdvlen, "file:%s/nccl_id", dir);
  fflush(stdout);
  fflush(stderr);
  pid_t pid[1024];
  int bad = n < 1 || n > 1024, skip = 0;
  for (int r = 0; !bad && r < n; r++) {
    if ((pid[r] = fork()) == 0) {
      *rank = r;
      return -1;
    }
    if (pid[r] < 0) {
      fprintf(stderr, "fork: %s\n", strerror(errno));
      for (int q = 0; q < r; q++)
        kill(pid[q], SIGTERM);
      n = r, bad = 1;
    }
  }
  for (int left = bad ? 0 : n; left > 0; left--) {
    int st;
    pid_t w = wait(&st);
    int code = w > 0 && WIFEXITED(st) ? WEXITSTATUS(st) : 1;
    if (code && code != 77 && !bad) {
      fprintf(stderr, "a rank exited with status %d%s\n", code, skip ? "" : "; stopping the others");
      for (int r = 0; r < n && !skip; r++)
        if (pid[r] != w)
          kill(pid[r], SIGTERM);
    }
    skip |= code == 77;
    bad |= code != 0 && code != 77;
  }
  unlink(rdv + 5);
  rmdir(dir);
  return bad ? 1 : skip ? 77 : 0;
}

#ifdef TGM_HAVE_CUDA
#include <cuda_runtime.h>
/* This process's GPU memory in use (every process on the GPU: what nvidia-smi shows), MiB; -1 if unknown. */
static inline double tgm_gpu_mib_used(void) {
  size_t fr = 0, tot = 0;
  return cudaMemGetInfo(&fr, &tot) == cudaSuccess ? (double)(tot - fr) / 1048576.0 : -1;
}
#else
static inline double tgm_gpu_mib_used(void) { return -1; }
#endif

/*@end distributed@*/
/* A test case: the golden file's dims, seed and inputs (or, without the
 * file, dims of 2 (capped by max), the spec's seed and the fixed fill), with
 * the params initialised from the seed and the inputs on the device. */
typedef struct tgm_case {
  int have;                 /* the golden file exists */
  tgm_st_file f;
  int64_t dyn[16], sym[16];
  uint64_t seed;
  tgm_host in[64];
  void *din[64];
} tgm_case;

static inline int tgm_case_open(tgm_model *m, const char *golden, tgm_case *c, char *err, size_t errlen) {
  memset(c, 0, sizeof *c);
  FILE *fp = golden ? fopen(golden, "rb") : NULL;
  c->have = fp != NULL;
  if (fp)
    fclose(fp);
  if (c->have && tgm_st_read(golden, &c->f, err, errlen))
    return -1;
  c->seed = tgm_info.seed;
  if (c->have) {
    const tgm_tensor_desc *d = tgm_st_find(&c->f, "meta.dims"), *s = tgm_st_find(&c->f, "meta.seed");
    if (!d || !s)
      return snprintf(err, errlen, "%s lacks meta.dims or meta.seed", golden), -1;
    for (int k = 0; k < tgm_info.ndyn; k++)
      c->dyn[k] = ((const int32_t *)d->data)[1 + k];
    c->seed = (uint64_t)(uint32_t)((const int32_t *)s->data)[0] | (uint64_t)(uint32_t)((const int32_t *)s->data)[1] << 32;
  } else {
    for (int k = 0; k < tgm_info.ndyn; k++)
      c->dyn[k] = tgm_info.dyn_max[k] < 2 ? tgm_info.dyn_max[k] : 2;
  }
  if (tgm_compute_syms(c->dyn, c->sym, err, errlen))
    return -1;
  if (tgm_init_params(m, c->seed))
    return snprintf(err, errlen, "init: %s", tgm_error(m)), -1;
  for (int k = 0; k < tgm_info.ninputs; k++) {
    if (tgm_host_alloc(&c->in[k], 0, k, c->sym))
      return snprintf(err, errlen, "out of memory"), -1;
    if (c->have) {
      const tgm_tensor_desc *t = tgm_st_find(&c->f, tgm_info.inputs[k].name);
      if (!t || t->dtype != c->in[k].dtype || tgm_numel(t->rank, t->shape) != c->in[k].numel)
        return snprintf(err, errlen, "golden input '%s' missing or of the wrong shape", tgm_info.inputs[k].name), -1;
      memcpy(c->in[k].data, t->data, (size_t)c->in[k].numel * (size_t)tgm_dtype_sizes[c->in[k].dtype]);
    } else {
      tgm_host_fill(&c->in[k], tgm_info.inputs[k].name);
    }
    if (tgm_to_device(m, &c->in[k], &c->din[k]))
      return snprintf(err, errlen, "copying input '%s' to the device", tgm_info.inputs[k].name), -1;
  }
  return 0;
}

static inline void tgm_case_close(tgm_model *m, tgm_case *c) {
  for (int k = 0; k < tgm_info.ninputs; k++) {
    if (c->din[k] && c->din[k] != c->in[k].data)
      tgm_device_free(m, c->din[k]);
    free(c->in[k].data);
  }
  if (c->have)
    tgm_st_free(&c->f);
}

/* max|got - want| / max|want| over the finite wanted values; *finite = 0 if
 * got has a non-finite value where want is finite. */
static inline double tgm_rel_err(const void *got, int dt, const float *want, int64_t n, double *maxref, int *finite) {
  double maxdiff = 0;
  *maxref = 0;
  *finite = 1;
  for (int64_t i = 0; i < n; i++) {
    double g = tgm_get(got, dt, i), w = want ? want[i] : 0;
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
