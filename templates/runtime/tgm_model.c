/* tgm_model.c: the public API of a model (tgm.h), independent of the model:
 * everything specific comes from the tables tgen generates (tgm_info,
 * tgm_compute_syms, tgm_io_shape, tgm_ws_bytes) and the forward passes of
 * the CPU and CUDA files. Template: copied into NAME_common.c with "tgm"
 * renamed. */
#include "tgm_rt.h"
#include "tgm.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* compile.mode max-autotune: where the GEMM choices are kept (the working
 * directory; tgm_set_autotune names another file) */
#define TGM_TUNE_FILE "tgm_autotune.txt"
/*@uses distributed@*/

/* data parallel: how long a rank waits for the others at the rendezvous */
#define TGM_RENDEZVOUS_S 600.0
static void dist_free(struct tgm_model *m);
static int dist_state_to_host(struct tgm_model *m, int kind, float *dst);
static int dist_write(struct tgm_model *m, const char *path, const tgm_tensor_desc *t, int nt);
#ifdef TGM_HAVE_CUDA
static int dist_sum_squares(struct tgm_model *m);
static int dist_gather_params(struct tgm_model *m);
#endif
/*@end distributed@*/

int tgm_fail(struct tgm_model *m, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->err, sizeof m->err, fmt, ap);
  va_end(ap);
  return code;
}

static void set_err(char *err, size_t errlen, const char *fmt, const char *arg) {
  if (err && errlen)
    snprintf(err, errlen, fmt, arg);
}

/* Memory on the model's device: zeroed; freed by dev_free. */
static void *dev_zalloc(tgm_model *m, size_t n) {
  if (m->device == 0)
    return calloc(1, n ? n : 1);
#ifdef TGM_HAVE_CUDA
  void *p = NULL;
  unsigned char *zero = calloc(1, n ? n : 1);
  if (!zero || tgm_cuda_malloc(m->cx, &p, n ? n : 1) || tgm_cuda_memcpy(m->cx, p, zero, n, 0)) {
    tgm_cuda_free(m->cx, p);
    p = NULL;
  }
  free(zero);
  return p;
#else
  return NULL;
#endif
}

static void dev_free(tgm_model *m, void *p) {
  if (m->device == 0)
    free(p);
#ifdef TGM_HAVE_CUDA
  else if (p)
    tgm_cuda_free(m->cx, p);
#endif
}

/* Fill n bytes on the model's device with 0xff (TGM_POISON_ARENA). */
static int dev_poison(tgm_model *m, void *p, size_t n) {
  if (!p || !n)
    return TGM_OK;
  if (m->device == 0) {
    memset(p, 0xff, n);
    return TGM_OK;
  }
#ifdef TGM_HAVE_CUDA
  unsigned char *ff = malloc(n);
  int rc = !ff || tgm_cuda_memcpy(m->cx, p, memset(ff, 0xff, n), n, 0);
  free(ff);
  if (rc)
    return tgm_fail(m, TGM_EDEVICE, "poisoning the arena: %s", ff ? tgm_cuda_ctx_error(m->cx) : "out of memory");
  return TGM_OK;
#else
  return tgm_fail(m, TGM_EDEVICE, "no CUDA path in this build");
#endif
}

/* Copy n bytes between the host and the model's device (to_host: dev -> host). */
static int dev_copy(tgm_model *m, void *host, void *dev, size_t n, int to_host) {
  if (m->device == 0) {
    if (to_host)
      memcpy(host, dev, n);
    else
      memcpy(dev, host, n);
    return TGM_OK;
  }
#ifdef TGM_HAVE_CUDA
  if (tgm_cuda_memcpy(m->cx, to_host ? host : dev, to_host ? dev : host, n, to_host ? 1 : 0))
    return tgm_fail(m, TGM_EDEVICE, "copying %s the device: %s", to_host ? "from" : "to", tgm_cuda_ctx_error(m->cx));
  return TGM_OK;
#else
  return tgm_fail(m, TGM_EDEVICE, "no CUDA path in this build");
#endif
}

tgm_status tgm_create(const char *device, tgm_model **out, char *err, size_t errlen) {
  if (!out) {
    set_err(err, errlen, "tgm_create: out is NULL%s", "");
    return TGM_EINVAL;
  }
  *out = NULL;
  int gpu = -1; /* "cuda:N": device N */
  if (device && !strncmp(device, "cuda:", 5)) {
    char *end;
    long v = strtol(device + 5, &end, 10);
    if (end == device + 5 || *end || v < 0 || v > 1023) {
      set_err(err, errlen, "tgm_create: \"%s\" is no device (\"cuda:N\" with N a device number)", device);
      return TGM_EINVAL;
    }
    gpu = (int)v;
  } else if (!device || (strcmp(device, "cpu") && strcmp(device, "cuda"))) {
    set_err(err, errlen, "tgm_create: device must be \"cpu\", \"cuda\" or \"cuda:N\", not \"%s\"",
            device ? device : "(null)");
    return TGM_EINVAL;
  }
  tgm_model *m = calloc(1, sizeof *m);
  if (!m) {
    set_err(err, errlen, "tgm_create: out of memory%s", "");
    return TGM_ENOMEM;
  }
  m->master_stale = 1;
  m->state_hi = tgm_info.state_elems;
  if (strcmp(device, "cpu")) {
#ifdef TGM_HAVE_CUDA
    m->device = 1;
    char cerr[256];
    if ((gpu >= 0 && tgm_cuda_use_device(gpu, cerr, sizeof cerr)) || tgm_cuda_ctx_create(&m->cx, cerr, sizeof cerr)) {
      set_err(err, errlen, "tgm_create: %s", cerr);
      free(m);
      return TGM_EDEVICE;
    }
    m->graphs = tgm_graphs_default;
    if (tgm_tune_default && tgm_cuda_set_tune(m->cx, 1, TGM_TUNE_FILE)) {
      set_err(err, errlen, "tgm_create: %s", tgm_cuda_ctx_error(m->cx));
      tgm_cuda_ctx_destroy(m->cx);
      free(m);
      return TGM_ENOMEM;
    }
#else
    (void)gpu;
    free(m);
    set_err(err, errlen, "tgm_create: this build has no CUDA path (no CUDA compiler was found when it was configured)%s", "");
    return TGM_EDEVICE;
#endif
  }
  if (!(m->params = dev_zalloc(m, (size_t)tgm_info.param_bytes))) {
    set_err(err, errlen, "tgm_create: out of %s memory for the params", m->device ? "device" : "host");
    tgm_destroy(m);
    return TGM_ENOMEM;
  }
  *out = m;
  return TGM_OK;
}

void tgm_destroy(tgm_model *m) {
  if (!m)
    return;
  void *bufs[] = {m->params, m->ws, m->grads, m->master, m->opt_m, m->opt_v, m->loss, m->opt, m->igrad};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
    dev_free(m, bufs[i]);
/*@uses distributed@*/
  dist_free(m);
/*@end distributed@*/
#ifdef TGM_HAVE_CUDA
  for (int i = 0; i < TGM_GRAPHS; i++)
    tgm_cuda_graph_free(m->graph[i].exec);
  if (m->device == 1)
    tgm_cuda_ctx_destroy(m->cx);
#endif
  free(m);
}

const char *tgm_error(const tgm_model *m) { return m ? m->err : "tgm_error: model is NULL"; }

size_t tgm_param_bytes(void) { return (size_t)tgm_info.param_bytes; }

/* Copy between a host buffer and the params (either direction). */
static int params_copy(tgm_model *m, void *host, int to_host) {
  if (!to_host)
    m->master_stale = 1; /* the optimizer's f32 copy must follow */
  return dev_copy(m, host, m->params, (size_t)tgm_info.param_bytes, to_host);
}

tgm_status tgm_get_params(tgm_model *m, void *host, size_t bytes) {
  if (!m)
    return TGM_EINVAL;
  if (!host || bytes != (size_t)tgm_info.param_bytes)
    return tgm_fail(m, TGM_EINVAL, "tgm_get_params: need a buffer of exactly %lld bytes, got %zu%s",
                    (long long)tgm_info.param_bytes, bytes, host ? "" : " (NULL)");
  return params_copy(m, host, 1);
}

tgm_status tgm_set_params(tgm_model *m, const void *host, size_t bytes) {
  if (!m)
    return TGM_EINVAL;
  if (!host || bytes != (size_t)tgm_info.param_bytes)
    return tgm_fail(m, TGM_EINVAL, "tgm_set_params: need a buffer of exactly %lld bytes, got %zu%s",
                    (long long)tgm_info.param_bytes, bytes, host ? "" : " (NULL)");
  return params_copy(m, (void *)host, 0);
}

/* Fresh training: optimizer state zero, step 0 (after init or load). */
static int reset_train_state(tgm_model *m) {
  size_t fb = (size_t)(m->state_hi - m->state_lo) * sizeof(float);
  float *bufs[2] = {m->opt_m, m->opt_v};
  m->step = 0;
  m->step_dirty = 1;
  for (int i = 0; i < 2; i++) {
    if (!bufs[i])
      continue;
    if (m->device == 0) {
      memset(bufs[i], 0, fb);
      continue;
    }
#ifdef TGM_HAVE_CUDA
    if (tgm_cuda_fill(m->cx, TGM_F32, bufs[i], m->state_hi - m->state_lo, 0) || tgm_cuda_sync(m->cx))
      return tgm_fail(m, TGM_EDEVICE, "clearing the optimizer state: %s", tgm_cuda_ctx_error(m->cx));
#endif
  }
  return TGM_OK;
}

/* The model's thread count (tgm_set_threads) around a call's host work (a
 * CPU pass, the CPU optimizer step, the params' init): threads_begin sets it
 * for the calling thread's parallel regions (an OpenMP setting is per
 * thread) and returns the caller's, which threads_end gives back. Nothing
 * without OpenMP or with the default (0). */
static int threads_begin(const tgm_model *m) {
#ifdef _OPENMP
  int was = omp_get_max_threads();
  if (m->threads > 0 && m->threads != was)
    omp_set_num_threads(m->threads);
  return was;
#else
  (void)m;
  return 1;
#endif
}

static void threads_end(const tgm_model *m, int was) {
#ifdef _OPENMP
  if (m->threads > 0 && m->threads != was)
    omp_set_num_threads(was);
#else
  (void)m;
  (void)was;
#endif
}

tgm_status tgm_set_threads(tgm_model *m, int n) {
  if (!m)
    return TGM_EINVAL;
  if (n < 0 || n > TGM_MAX_THREADS)
    return tgm_fail(m, TGM_EINVAL, "set_threads: n must be 1 to %d, or 0 for OpenMP's default, not %d",
                    TGM_MAX_THREADS, n);
  m->threads = n;
  return TGM_OK;
}

tgm_status tgm_init_params(tgm_model *m, uint64_t seed) {
  if (!m)
    return TGM_EINVAL;
  size_t n = (size_t)tgm_info.param_bytes;
  unsigned char *h = calloc(1, n ? n : 1); /* padding between params stays zero */
  if (!h)
    return tgm_fail(m, TGM_ENOMEM, "tgm_init_params: out of memory (%zu bytes)", n);
  int was = threads_begin(m);
  for (int k = 0; k < tgm_info.nparams; k++) {
    const tgm_param_info *p = &tgm_info.params[k];
    void *dst = h + p->offset;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t i = 0; i < p->numel; i++)
      tgm_put(dst, p->dtype, i, tgm_init_value(p->name, p->init, p->a, p->b, p->dtype, p->rank, p->shape, seed, i));
  }
  threads_end(m, was);
  int rc = params_copy(m, h, 0);
  free(h);
  return (tgm_status)(rc ? rc : reset_train_state(m));
}

tgm_status tgm_save_params(tgm_model *m, const char *path) {
  if (!m)
    return TGM_EINVAL;
  if (!path)
    return tgm_fail(m, TGM_EINVAL, "tgm_save_params: path is NULL");
  size_t n = (size_t)tgm_info.param_bytes;
  unsigned char *h = calloc(1, n ? n : 1); /* padding between params stays zero */
  tgm_tensor_desc *t = calloc((size_t)tgm_info.nparams + 1, sizeof *t);
  int rc = TGM_OK;
  if (!h || !t) {
    rc = tgm_fail(m, TGM_ENOMEM, "tgm_save_params: out of memory");
    goto done;
  }
  if ((rc = params_copy(m, h, 1)))
    goto done;
  for (int k = 0; k < tgm_info.nparams; k++) {
    const tgm_param_info *p = &tgm_info.params[k];
    t[k].name = p->ckpt;
    t[k].dtype = p->dtype;
    t[k].rank = p->rank;
    memcpy(t[k].shape, p->shape, sizeof p->shape);
    t[k].data = h + p->offset;
  }
  if (tgm_st_write_checked(path, t, tgm_info.nparams, m->err, sizeof m->err))
    rc = TGM_EIO;
done:
  free(h);
  free(t);
  return (tgm_status)rc;
}

static const char *shape_text(char *buf, size_t n, int rank, const int64_t *s) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < rank && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)s[i]);
  if (k < n)
    snprintf(buf + k, n - k, "]");
  return buf;
}

tgm_status tgm_load_params(tgm_model *m, const char *path) {
  if (!m)
    return TGM_EINVAL;
  if (!path)
    return tgm_fail(m, TGM_EINVAL, "tgm_load_params: path is NULL");
  tgm_st_file f;
  int rc = tgm_st_read(path, &f, m->err, sizeof m->err);
  if (rc)
    return (tgm_status)rc;
  size_t n = (size_t)tgm_info.param_bytes;
  unsigned char *h = calloc(1, n ? n : 1); /* padding between params stays zero */
  char a[128], b[128];
  if (!h) {
    rc = tgm_fail(m, TGM_ENOMEM, "tgm_load_params: out of memory");
    goto done;
  }
  for (int k = 0; k < tgm_info.nparams; k++) {
    const tgm_param_info *p = &tgm_info.params[k];
    const tgm_tensor_desc *t = tgm_st_find(&f, p->ckpt);
    if (!t) {
      rc = tgm_fail(m, TGM_ECORRUPT, "%s: tensor '%s' is missing", path, p->ckpt);
      goto done;
    }
    if (t->dtype != p->dtype) {
      rc = tgm_fail(m, TGM_ECORRUPT, "%s: tensor '%s' has dtype %s, expected %s", path, p->ckpt,
                    tgm_dtype_names[t->dtype], tgm_dtype_names[p->dtype]);
      goto done;
    }
    if (t->rank != p->rank || memcmp(t->shape, p->shape, sizeof(int64_t) * (size_t)p->rank)) {
      rc = tgm_fail(m, TGM_ECORRUPT, "%s: tensor '%s' has shape %s, expected %s", path, p->ckpt,
                    shape_text(a, sizeof a, t->rank, t->shape), shape_text(b, sizeof b, p->rank, p->shape));
      goto done;
    }
    memcpy(h + p->offset, t->data, (size_t)(p->numel * tgm_dtype_sizes[p->dtype]));
  }
  if (f.n != tgm_info.nparams) {
    for (int i = 0; i < f.n; i++) {
      int known = 0;
      for (int k = 0; k < tgm_info.nparams && !known; k++)
        known = !strcmp(f.t[i].name, tgm_info.params[k].ckpt);
      known |= !strncmp(f.t[i].name, "optim.", 6); /* a training checkpoint's optimizer state */
      if (!known) {
        rc = tgm_fail(m, TGM_ECORRUPT, "%s: tensor '%s' is not a param of model %s", path, f.t[i].name, tgm_info.name);
        goto done;
      }
    }
  }
  rc = params_copy(m, h, 0);
  if (!rc)
    rc = reset_train_state(m);
done:
  free(h);
  tgm_st_free(&f);
  return (tgm_status)rc;
}

/* Make sure the workspace holds `need` bytes (grows, never shrinks). */
static int ensure_ws(tgm_model *m, int64_t need) {
  if (need <= m->ws_bytes)
    return TGM_OK;
  if (m->device == 0) {
    free(m->ws);
    m->ws = malloc((size_t)need);
    m->ws_bytes = m->ws ? need : 0;
    return m->ws ? TGM_OK : tgm_fail(m, TGM_ENOMEM, "out of memory for the workspace (%lld bytes)", (long long)need);
  }
#ifdef TGM_HAVE_CUDA
  tgm_cuda_free(m->cx, m->ws);
  m->ws = NULL;
  m->ws_bytes = 0;
  m->ws_gen++; /* graphs recorded with the old workspace are stale */
  if (tgm_cuda_malloc(m->cx, (void **)&m->ws, (size_t)need))
    return tgm_fail(m, TGM_ENOMEM, "out of device memory for the workspace (%lld bytes): %s", (long long)need,
                    tgm_cuda_ctx_error(m->cx));
  m->ws_bytes = need;
  return TGM_OK;
#else
  return tgm_fail(m, TGM_EDEVICE, "no CUDA path in this build");
#endif
}

/* ---------------------------------------------------------------- passes */

/* Checks common to every pass; sym gets the dims' symbol values. */
static int check_call(tgm_model *m, const char *what, int pass, const int64_t *dims, const void *const *in,
                      int64_t *sym) {
  if (tgm_info.ndyn && !dims)
    return tgm_fail(m, TGM_EINVAL, "%s: dims is NULL, but the model has %d dynamic dim%s", what, tgm_info.ndyn,
                    tgm_info.ndyn == 1 ? "" : "s");
  if (tgm_info.ninputs && !in)
    return tgm_fail(m, TGM_EINVAL, "%s: inputs is NULL", what);
  for (int k = 0; k < tgm_info.ninputs; k++)
    if (!in[k] && (tgm_pass_inputs[pass] >> k & 1)) /* one the pass does not read may be NULL */
      return tgm_fail(m, TGM_EINVAL, "%s: input '%s' is NULL", what, tgm_info.inputs[k].name);
  return tgm_compute_syms(dims, sym, m->err, sizeof m->err);
}

static int run_pass(tgm_model *m, int pass, const int64_t *sym, const void *const *in, void *const *out) {
  static const tgm_pass_fn cpu[TGM_NPASS] = {tgm_forward_cpu, tgm_loss_cpu, tgm_train_cpu};
  if (m->device == 0) {
    int was = threads_begin(m), rc = cpu[pass](m, sym, in, out);
    threads_end(m, was);
    return rc;
  }
#ifdef TGM_HAVE_CUDA
  static const tgm_pass_fn cuda[TGM_NPASS] = {tgm_forward_cuda, tgm_loss_cuda, tgm_train_cuda};
  return cuda[pass](m, sym, in, out);
#else
  return tgm_fail(m, TGM_EDEVICE, "no CUDA path in this build");
#endif
}

static int optimizer_enqueue(tgm_model *m);
static int optimizer_step_cpu(tgm_model *m);
static int refresh_master(tgm_model *m);
/*@uses distributed@*/
static int dist_reduce(tgm_model *m, int pass);
static void dist_pass_begin(tgm_model *m, int pass, int opt);
/*@end distributed@*/

/* One call's work: the pass, then (train_step) the optimizer. */
static int enqueue(tgm_model *m, int pass, int opt, const int64_t *sym, const void *const *in, void *const *out) {
/*@uses distributed@*/
  if (m->dist)
    dist_pass_begin(m, pass, opt);
/*@end distributed@*/
  int rc = run_pass(m, pass, sym, in, out);
/*@uses distributed@*/
  if (!rc && m->dist && pass != TGM_PASS_FORWARD)
    rc = dist_reduce(m, pass); /* the loss and the gradients averaged over the ranks */
/*@end distributed@*/
  return rc || !opt ? rc : optimizer_enqueue(m);
}

#ifdef TGM_HAVE_CUDA
/* The graph recorded for this call, or the entry to record it in. The first
 * call with a key runs eagerly (it sizes the scratch and the GEMM plans);
 * the second records; later ones replay. A graph holds every pointer it was
 * recorded with: the inputs, outputs, workspace and scratch are its key. */
static struct tgm_graph *graph_slot(tgm_model *m, int pass, const int64_t *sym, const void *const *in,
                                    void *const *out, int *found) {
  unsigned gen = tgm_cuda_ctx_generation(m->cx);
  int nout = pass == TGM_PASS_FORWARD ? tgm_info.noutputs : pass == TGM_PASS_TRAIN ? 1 + tgm_info.nwrt : 1, victim = 0;
  *found = 0;
  for (int i = 0; i < TGM_GRAPHS; i++) {
    struct tgm_graph *e = &m->graph[i];
    if (!e->used) {
      victim = i;
      continue;
    }
    int same = e->pass == pass && e->gen == gen && e->ws_gen == m->ws_gen &&
               !memcmp(e->sym, sym, sizeof(int64_t) * (size_t)tgm_info.nsym);
    for (int k = 0; same && k < tgm_info.ninputs; k++)
      same = e->in[k] == in[k];
    for (int k = 0; same && k < nout; k++)
      same = e->out[k] == out[k];
    if (same) {
      *found = 1;
      return e;
    }
    if (m->graph[victim].used && e->used < m->graph[victim].used)
      victim = i; /* the least recently used */
  }
  struct tgm_graph *e = &m->graph[victim];
  tgm_cuda_graph_free(e->exec);
  memset(e, 0, sizeof *e);
  e->pass = pass, e->gen = gen, e->ws_gen = m->ws_gen;
  memcpy(e->sym, sym, sizeof(int64_t) * (size_t)tgm_info.nsym);
  for (int k = 0; k < tgm_info.ninputs; k++)
    e->in[k] = in[k];
  for (int k = 0; k < nout; k++)
    e->out[k] = out[k];
  return e;
}

static int graph_call(tgm_model *m, int pass, int opt, const int64_t *sym, const void *const *in, void *const *out) {
  int found;
  struct tgm_graph *e = graph_slot(m, pass, sym, in, out, &found);
  e->used = ++m->graph_clock;
  if (found && e->exec)
    return tgm_cuda_graph_launch(m->cx, e->exec) ? tgm_fail(m, TGM_EDEVICE, "%s", tgm_cuda_ctx_error(m->cx)) : TGM_OK;
  if (!found || e->eager) /* first sight (or not recordable): eagerly */
    return enqueue(m, pass, opt, sym, in, out);
  if (tgm_cuda_graph_begin(m->cx))
    return tgm_fail(m, TGM_EDEVICE, "%s", tgm_cuda_ctx_error(m->cx));
  int rc = enqueue(m, pass, opt, sym, in, out);
  void *g = NULL;
  int end = tgm_cuda_graph_end(m->cx, &g);
  if (rc) /* an argument error found while recording: nothing ran */
    return rc;
  if (end || !g) { /* something in the pass cannot be recorded: this key runs eagerly from now on */
    e->eager = 1;
    return enqueue(m, pass, opt, sym, in, out);
  }
  e->exec = g;
  return tgm_cuda_graph_launch(m->cx, g) ? tgm_fail(m, TGM_EDEVICE, "%s", tgm_cuda_ctx_error(m->cx)) : TGM_OK;
}
#endif

/* A call's work on the model's device, replayed from a CUDA graph where it can be. */
static int run_call(tgm_model *m, int pass, int opt, const int64_t *sym, const void *const *in, void *const *out) {
  int rc = ensure_ws(m, tgm_pass_arena[pass]);
  if (rc)
    return rc;
  /* a test aid: TGM_POISON_ARENA=1 fills the arena (and before a train pass
   * each param's gradient) with 0xff bytes, NaN in every float dtype, so that a value
   * read before the pass writes it shows */
  const char *poison = getenv("TGM_POISON_ARENA");
  if (poison && *poison && strcmp(poison, "0") != 0) {
    rc = dev_poison(m, m->ws, (size_t)tgm_pass_arena[pass]);
    for (int k = 0; !rc && pass == TGM_PASS_TRAIN && k < tgm_info.nparams; k++) {
      const tgm_param_info *q = &tgm_info.params[k]; /* not the padding between them: it stays 0 */
      rc = dev_poison(m, m->grads + q->offset, (size_t)(q->numel * (q->dtype == TGM_F32 ? 4 : 2)));
    }
    if (rc)
      return rc;
  }
#ifdef TGM_HAVE_CUDA
  if (m->device == 1 && opt && m->step_dirty) {
    if (tgm_cuda_opt_set_step(m->cx, m->opt, m->step))
      return tgm_fail(m, TGM_EDEVICE, "%s", tgm_cuda_ctx_error(m->cx));
    m->step_dirty = 0;
  }
  if (m->device == 1 && m->graphs && !tgm_pass_dropout[pass] && tgm_info.ninputs <= TGM_GRAPH_IO &&
      tgm_info.noutputs <= TGM_GRAPH_IO && 1 + tgm_info.nwrt <= TGM_GRAPH_IO)
    rc = graph_call(m, pass, opt, sym, in, out);
  else
#endif
    rc = enqueue(m, pass, opt, sym, in, out);
  if (!rc && opt && m->device == 1)
    m->step++; /* counted now; settle() corrects it from the device */
  return rc;
}

/* Waits for the device and reports what its work found: the loss (when
 * asked), a bad index or target, a refused optimizer step. The host's step
 * count follows the device's. */
static int settle(tgm_model *m, float *loss) {
  if (m->device == 0) {
    if (loss && m->loss)
      *loss = (float)tgm_get(m->loss, tgm_info.loss_dtype, 0);
    return TGM_OK;
  }
#ifdef TGM_HAVE_CUDA
  int64_t bad = -1, step = m->step, bad_step = 0;
  double bad_ss = 0;
  unsigned char lb[8] = {0};
  if (tgm_cuda_sync(m->cx) || (loss && m->loss && tgm_cuda_memcpy(m->cx, lb, m->loss, 8, 1)) ||
      tgm_cuda_bad_index(m->cx, &bad) || (m->opt && tgm_cuda_opt_report(m->cx, m->opt, &step, &bad_step, &bad_ss)))
    return tgm_fail(m, TGM_EDEVICE, "%s", tgm_cuda_ctx_error(m->cx));
  if (loss && m->loss)
    *loss = (float)tgm_get(lb, tgm_info.loss_dtype, 0);
  if (m->opt && !m->step_dirty)
    m->step = step;
  if (bad >= 0)
    return tgm_fail(m, TGM_EDATA, "an index or target at position %lld is out of range (an embedding or cross_entropy)%s",
                    (long long)bad, bad_step ? "; no update applied" : "");
  if (bad_step)
    return tgm_fail(m, TGM_EDATA,
                    "train_step: gradient norm is %s at step %lld; no update applied (params, optimizer state and "
                    "step unchanged)",
                    isnan(bad_ss) ? "NaN" : "inf", (long long)bad_step);
  return TGM_OK;
#else
  return tgm_fail(m, TGM_EDEVICE, "no CUDA path in this build");
#endif
}

tgm_status tgm_sync(tgm_model *m) { return m ? (tgm_status)settle(m, NULL) : TGM_EINVAL; }

tgm_status tgm_set_stream(tgm_model *m, void *stream) {
  if (!m)
    return TGM_EINVAL;
  if (m->device == 0)
    return stream ? tgm_fail(m, TGM_EINVAL, "set_stream: the model is on the cpu, which has no streams") : TGM_OK;
#ifdef TGM_HAVE_CUDA
  if (tgm_cuda_set_stream(m->cx, stream))
    return tgm_fail(m, TGM_EDEVICE, "set_stream: %s", tgm_cuda_ctx_error(m->cx));
#endif
  return TGM_OK;
}

tgm_status tgm_set_graphs(tgm_model *m, int on) {
  if (!m)
    return TGM_EINVAL;
  if (on != 0 && on != 1)
    return tgm_fail(m, TGM_EINVAL, "set_graphs: on must be 0 or 1, not %d", on);
  m->graphs = on && m->device == 1;
  return TGM_OK;
}

tgm_status tgm_set_autotune(tgm_model *m, int on, const char *file) {
  if (!m)
    return TGM_EINVAL;
  if (on != 0 && on != 1)
    return tgm_fail(m, TGM_EINVAL, "set_autotune: on must be 0 or 1, not %d", on);
  if (m->device == 0)
    return TGM_OK;
#ifdef TGM_HAVE_CUDA
  if (tgm_cuda_set_tune(m->cx, on, file ? file : TGM_TUNE_FILE))
    return tgm_fail(m, TGM_EINVAL, "set_autotune: %s", tgm_cuda_ctx_error(m->cx));
#endif
  return TGM_OK;
}

tgm_status tgm_forward_v(tgm_model *m, const int64_t *dims, const void *const *in, void *const *out) {
  if (!m)
    return TGM_EINVAL;
  int64_t sym[16] = {0};
  int rc = check_call(m, "forward", TGM_PASS_FORWARD, dims, in, sym);
  if (rc)
    return (tgm_status)rc;
  if (!out)
    return tgm_fail(m, TGM_EINVAL, "forward: outputs is NULL");
  for (int k = 0; k < tgm_info.noutputs; k++)
    if (!out[k])
      return tgm_fail(m, TGM_EINVAL, "forward: output '%s' is NULL", tgm_info.outputs[k].name);
  return (tgm_status)run_call(m, TGM_PASS_FORWARD, 0, sym, in, out);
}

/* ---------------------------------------------------------------- training */

static int need_train(tgm_model *m, const char *what) {
  if (!tgm_info.loss_name)
    return tgm_fail(m, TGM_EINVAL, "%s: model %s has no train: section", what, tgm_info.name);
  return TGM_OK;
}

/* Allocate the gradient buffer and the optimizer state on first use. */
static int train_state(tgm_model *m) {
  size_t fb = (size_t)(m->state_hi - m->state_lo) * sizeof(float);
  if (!m->grads && !(m->grads = dev_zalloc(m, (size_t)tgm_info.param_bytes)))
    return tgm_fail(m, TGM_ENOMEM, "out of memory for the gradients (%lld bytes)", (long long)tgm_info.param_bytes);
  if (tgm_info.need_master && !m->master && !(m->master = dev_zalloc(m, fb)))
    return tgm_fail(m, TGM_ENOMEM, "out of memory for the f32 master params (%zu bytes)", fb);
  int nstate = tgm_info.optimizer == 2 ? 2 : tgm_info.optimizer == 1 && tgm_info.momentum != 0 ? 1 : 0;
  if (nstate >= 1 && !m->opt_m && !(m->opt_m = dev_zalloc(m, fb)))
    return tgm_fail(m, TGM_ENOMEM, "out of memory for the optimizer state (%zu bytes)", fb);
  if (nstate >= 2 && !m->opt_v && !(m->opt_v = dev_zalloc(m, fb)))
    return tgm_fail(m, TGM_ENOMEM, "out of memory for the optimizer state (%zu bytes)", fb);
#ifdef TGM_HAVE_CUDA
  if (m->device == 1 && !m->opt) {
    if (tgm_cuda_opt_new(m->cx, tgm_info.nruns, &m->opt))
      return tgm_fail(m, TGM_ENOMEM, "out of device memory for the optimizer's state: %s", tgm_cuda_ctx_error(m->cx));
    m->step_dirty = 1;
  }
#endif
  return TGM_OK;
}

/* The train pass's out[]: the loss, then the gradient of each train.wrt
 * input: the caller's buffer d_in[j], or (d_in NULL: train_step,
 * forward_backward) scratch the model keeps, grown to the call's sizes. */
static int train_outs(tgm_model *m, const int64_t *sym, void *const *d_in, void **out) {
  int64_t need = 0, at = 0, shape[TGM_MAXRANK];
  out[0] = m->loss;
  for (int pass = 0; pass < 2; pass++) {
    for (int j = 0; j < tgm_info.nwrt; j++) {
      const tgm_io_info *x = &tgm_info.inputs[tgm_info.wrt[j]];
      int64_t n = tgm_dtype_sizes[x->dtype];
      tgm_io_shape(0, tgm_info.wrt[j], sym, shape);
      for (int i = 0; i < x->rank; i++)
        n *= shape[i];
      if (pass == 0)
        need += (n + 255) & ~(int64_t)255;
      else if (d_in)
        out[1 + j] = d_in[j];
      else
        out[1 + j] = m->igrad + at, at += (n + 255) & ~(int64_t)255;
    }
    if (pass == 0 && !d_in && need > m->igrad_bytes) {
      dev_free(m, m->igrad);
      m->igrad_bytes = 0;
      if (!(m->igrad = dev_zalloc(m, (size_t)need)))
        return tgm_fail(m, TGM_ENOMEM, "out of memory for the input gradients (%lld bytes)", (long long)need);
      m->igrad_bytes = need;
    }
  }
  return TGM_OK;
}

/* The loss pass, forward_backward(_wrt) or train_step: the work is enqueued;
 * with a loss pointer the call waits and reports; with NULL it returns at
 * once (on cuda: read the loss with get_loss, errors come from sync). */
static int train_call(tgm_model *m, const char *what, int pass, int opt, const int64_t *dims, const void *const *in,
                      void *const *d_in, float *loss) {
  if (!m)
    return TGM_EINVAL;
  int64_t sym[16] = {0};
  int rc = need_train(m, what);
  if (!rc)
    rc = check_call(m, what, pass, dims, in, sym);
  if (!rc && !m->loss && !(m->loss = dev_zalloc(m, 8)))
    rc = tgm_fail(m, TGM_ENOMEM, "%s: out of memory for the loss", what);
  if (!rc && pass == TGM_PASS_TRAIN)
    rc = train_state(m);
  if (!rc && opt)
    rc = refresh_master(m);
  void *out[1 + 64] = {m->loss};
  if (!rc && pass == TGM_PASS_TRAIN)
    rc = train_outs(m, sym, d_in, out);
  if (rc)
    return rc;
  if ((rc = run_call(m, pass, opt, sym, in, out)))
    return rc;
  if (m->device == 0 && opt)
    rc = optimizer_step_cpu(m);
  return rc || (!loss && m->device == 1) ? rc : settle(m, loss);
}

tgm_status tgm_loss_v(tgm_model *m, const int64_t *dims, const void *const *in, float *loss) {
  return (tgm_status)train_call(m, "loss", TGM_PASS_LOSS, 0, dims, in, NULL, loss);
}

tgm_status tgm_forward_backward_v(tgm_model *m, const int64_t *dims, const void *const *in, float *loss) {
  return (tgm_status)train_call(m, "forward_backward", TGM_PASS_TRAIN, 0, dims, in, NULL, loss);
}

tgm_status tgm_forward_backward_wrt_v(tgm_model *m, const int64_t *dims, const void *const *in, void *const *d_in,
                                      float *loss) {
  if (!m)
    return TGM_EINVAL;
  if (tgm_info.nwrt && !d_in)
    return tgm_fail(m, TGM_EINVAL, "forward_backward_wrt: d_in is NULL");
  for (int j = 0; j < tgm_info.nwrt; j++)
    if (!d_in[j])
      return tgm_fail(m, TGM_EINVAL, "forward_backward_wrt: the gradient buffer of input '%s' is NULL",
                      tgm_info.inputs[tgm_info.wrt[j]].name);
  return (tgm_status)train_call(m, "forward_backward_wrt", TGM_PASS_TRAIN, 0, dims, in, d_in, loss);
}

tgm_status tgm_train_step_v(tgm_model *m, const int64_t *dims, const void *const *in, float *loss) {
  if (m && tgm_info.loss_name && !tgm_info.optimizer)
    return tgm_fail(m, TGM_EINVAL, "train_step: model %s has no optimizer (its train: section only asks for gradients)",
                    tgm_info.name);
  return (tgm_status)train_call(m, "train_step", TGM_PASS_TRAIN, 1, dims, in, NULL, loss);
}

tgm_status tgm_get_loss(tgm_model *m, float *loss) {
  if (!m)
    return TGM_EINVAL;
  if (!loss)
    return tgm_fail(m, TGM_EINVAL, "get_loss: loss is NULL");
  if (!m->loss)
    return tgm_fail(m, TGM_EINVAL, "get_loss: no loss computed yet");
  return (tgm_status)settle(m, loss);
}

/* Run i's elements in the slice [lo, hi) of the flat optimizer state: the
 * count (0: none), and in *e0 the first one's index within the run. */
static int64_t run_slice(int i, int64_t lo, int64_t hi, int64_t *e0) {
  const tgm_param_run *r = &tgm_info.runs[i];
  int64_t a = r->f > lo ? r->f : lo, b = r->f + r->n < hi ? r->f + r->n : hi;
  *e0 = a - r->f;
  return b > a ? b - a : 0;
}

/* The optimizer's operands for run i's part of the state this model keeps
 * (all of the run, except on a data-parallel rank): n elements; w the f32
 * values it updates (the master copy, or the f32 params themselves), lowp
 * the bf16/f16 params it rounds them into (NULL for f32), the moments and
 * the gradient. */
typedef struct run_operands {
  int64_t n;
  float *w, *mm, *vv;
  void *lowp;
  const void *g;
} run_operands;

static run_operands operands(tgm_model *m, int i) {
  const tgm_param_run *r = &tgm_info.runs[i];
  int64_t e0, n = run_slice(i, m->state_lo, m->state_hi, &e0), s = r->f + e0 - m->state_lo;
  int64_t b = r->b0 + e0 * tgm_dtype_sizes[r->dt];
  int low = r->dt != TGM_F32;
  run_operands o = {n, low ? m->master + s : (float *)(void *)(m->params + b), m->opt_m ? m->opt_m + s : NULL,
                    m->opt_v ? m->opt_v + s : NULL, low ? m->params + b : NULL, m->grads + b};
  return o;
}

/* The f32 master copy from the params (after init, load or set). */
static int refresh_master(tgm_model *m) {
  const tgm_param_run *r = tgm_info.runs;
  if (!m->master || !m->master_stale)
    return TGM_OK;
  for (int i = 0; i < tgm_info.nruns; i++) {
    run_operands a = operands(m, i);
    if (r[i].dt == TGM_F32 || !a.n)
      continue;
    if (m->device == 0) {
      int was = threads_begin(m);
      tgm_cpu_cast(r[i].dt, TGM_F32, a.lowp, a.w, a.n);
      threads_end(m, was);
    }
#ifdef TGM_HAVE_CUDA
    else if (tgm_cuda_cast(m->cx, r[i].dt, TGM_F32, a.lowp, a.w, a.n))
      return tgm_fail(m, TGM_EDEVICE, "%s", tgm_cuda_ctx_error(m->cx));
#endif
  }
  m->master_stale = 0;
  return TGM_OK;
}

/* The CPU's step: the global gradient norm, checked before anything
 * changes (a step with a NaN or inf in the gradients is refused: TGM_EDATA,
 * no update); the clip factor (1 = none); the optimizer over every run. */
static int optimizer_step_cpu(tgm_model *m) {
  const tgm_param_run *r = tgm_info.runs;
  const tgm_model_info *o = &tgm_info;
  double ss = 0;
  int was = threads_begin(m);
  for (int i = 0; i < o->nruns; i++) /* in a fixed order: deterministic */
    ss += tgm_cpu_sum_squares(m->grads + r[i].b0, r[i].dt, r[i].n);
  if (!isfinite(ss)) {
    threads_end(m, was);
    return tgm_fail(m, TGM_EDATA,
                    "train_step: gradient norm is %s at step %lld; no update applied (params, optimizer state and "
                    "step unchanged)",
                    isnan(ss) ? "NaN" : "inf", (long long)(m->step + 1));
  }
  double scale = o->grad_clip > 0 ? tgm_clip_factor(ss, o->grad_clip) : 1;
  int64_t t = m->step + 1;
  for (int i = 0; i < o->nruns; i++) {
    run_operands a = operands(m, i);
    if (o->optimizer == 2)
      tgm_cpu_adamw(a.w, a.g, r[i].dt, a.mm, a.vv, a.lowp, r[i].dt, a.n, o->lr, o->beta1, o->beta2, o->eps,
                    o->weight_decay, t, scale);
    else
      tgm_cpu_sgd(a.w, a.g, r[i].dt, a.mm, a.lowp, r[i].dt, a.n, o->lr, o->momentum, o->weight_decay, t, scale);
  }
  threads_end(m, was);
  m->step = t;
  return TGM_OK;
}

/* The CUDA step, enqueued after the train pass (a graph records both): the
 * sums of squares, the device's decision (refuse, or clip and step), the
 * updates. The host counts the step now; settle corrects it from the device. */
static int optimizer_enqueue(tgm_model *m) {
  if (m->device == 0)
    return TGM_OK; /* train_call runs the CPU's step after the pass */
#ifdef TGM_HAVE_CUDA
  const tgm_param_run *r = tgm_info.runs;
  const tgm_model_info *o = &tgm_info;
  tgm_opt_hyper h = {o->optimizer, o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, o->momentum, o->grad_clip};
  int e = 0;
  for (int i = 0; i < o->nruns && !e; i++) {
    run_operands a = operands(m, i);
    e = tgm_cuda_opt_sum_squares(m->cx, m->opt, o->nruns, i, a.g, r[i].dt, a.n);
  }
/*@uses distributed@*/
  if (!e && m->dist && (e = dist_sum_squares(m))) /* every rank's parts: the global norm */
    return e;
/*@end distributed@*/
  if (!e)
    e = tgm_cuda_opt_prepare(m->cx, m->opt, o->nruns, &h);
  for (int i = 0; i < o->nruns && !e; i++) {
    run_operands a = operands(m, i);
    e = o->optimizer == 2
            ? tgm_cuda_opt_adamw(m->cx, m->opt, a.w, a.g, r[i].dt, a.mm, a.vv, a.lowp, r[i].dt, a.n)
            : tgm_cuda_opt_sgd(m->cx, m->opt, a.w, a.g, r[i].dt, a.mm, o->momentum != 0, a.lowp, r[i].dt, a.n);
  }
  if (e)
    return tgm_fail(m, TGM_EDEVICE, "optimizer: %s", tgm_cuda_ctx_error(m->cx));
/*@uses distributed@*/
  if (m->dist)
    return dist_gather_params(m); /* each rank's updated params to every rank */
/*@end distributed@*/
  return TGM_OK;
#else
  return tgm_fail(m, TGM_EDEVICE, "no CUDA path in this build");
#endif
}

const void *tgm_grads(tgm_model *m) {
  if (!m || need_train(m, "grads") || train_state(m))
    return NULL;
  return m->grads;
}

tgm_status tgm_get_grads(tgm_model *m, void *host, size_t bytes) {
  if (!m)
    return TGM_EINVAL;
  int rc = need_train(m, "get_grads");
  if (rc)
    return (tgm_status)rc;
  if (!host || bytes != (size_t)tgm_info.param_bytes)
    return tgm_fail(m, TGM_EINVAL, "get_grads: need a buffer of exactly %lld bytes, got %zu%s",
                    (long long)tgm_info.param_bytes, bytes, host ? "" : " (NULL)");
  if ((rc = train_state(m)))
    return (tgm_status)rc;
  return (tgm_status)dev_copy(m, host, m->grads, bytes, 1);
}

int64_t tgm_get_step(const tgm_model *m) { return m ? m->step : -1; }

tgm_status tgm_set_step(tgm_model *m, int64_t step) {
  if (!m)
    return TGM_EINVAL;
  if (step < 0)
    return tgm_fail(m, TGM_EINVAL, "set_step: step %lld is negative", (long long)step);
  m->step = step;
  m->step_dirty = 1;
  return TGM_OK;
}

/* ---------------------------------------------------------------- checkpoints */

/* The optimizer state's tensors: kind 0 master, 1 exp_avg / momentum_buffer, 2 exp_avg_sq. */
static const char *state_name(int kind) {
  return kind == 0 ? "master" : kind == 2 ? "exp_avg_sq" : tgm_info.optimizer == 2 ? "exp_avg" : "momentum_buffer";
}

static float *state_buf(tgm_model *m, int kind) { return kind == 0 ? m->master : kind == 1 ? m->opt_m : m->opt_v; }

/* State buffer `kind` into dst, the whole flat state's place (on a
 * data-parallel rank: every rank's slice into rank 0's dst). */
static int state_to_host(tgm_model *m, int kind, float *dst) {
/*@uses distributed@*/
  if (m->dist)
    return dist_state_to_host(m, kind, dst);
/*@end distributed@*/
  return dev_copy(m, dst + m->state_lo, state_buf(m, kind), (size_t)(m->state_hi - m->state_lo) * sizeof(float), 1);
}

tgm_status tgm_save_checkpoint(tgm_model *m, const char *path) {
  if (!m)
    return TGM_EINVAL;
  int rc = need_train(m, "save_checkpoint");
  if (rc)
    return (tgm_status)rc;
  if (!path)
    return tgm_fail(m, TGM_EINVAL, "save_checkpoint: path is NULL");
  if ((rc = settle(m, NULL))) /* the step count the device reached */
    return (tgm_status)rc;
  if ((rc = train_state(m)) || (rc = refresh_master(m)))
    return (tgm_status)rc;
  int64_t n = tgm_info.state_elems;
  size_t pb = (size_t)tgm_info.param_bytes, fb = (size_t)n * sizeof(float);
  unsigned char *h = calloc(1, pb + 3 * fb + 8);
  tgm_tensor_desc *t = calloc((size_t)tgm_info.nparams * 4 + 2, sizeof *t);
  char (*names)[160] = calloc((size_t)tgm_info.nparams * 3 + 1, sizeof *names);
  int nt = 0;
  if (!h || !t || !names) {
    rc = tgm_fail(m, TGM_ENOMEM, "save_checkpoint: out of memory");
    goto done;
  }
  float *st = (float *)(void *)(h + pb);
  if ((rc = dev_copy(m, h, m->params, pb, 1)))
    goto done;
  for (int kind = 0; kind < 3; kind++)
    if (state_buf(m, kind) && (rc = state_to_host(m, kind, st + (size_t)kind * (size_t)n)))
      goto done;
  for (int k = 0; k < tgm_info.nparams; k++) {
    const tgm_param_info *p = &tgm_info.params[k];
    t[nt] = (tgm_tensor_desc){p->ckpt, p->dtype, p->rank, {0}, h + p->offset};
    memcpy(t[nt++].shape, p->shape, sizeof p->shape);
    for (int kind = 0; kind < 3; kind++) {
      if (!state_buf(m, kind) || (kind == 0 && p->dtype == TGM_F32))
        continue;
      snprintf(names[k * 3 + kind], sizeof names[0], "optim.%s.%s", state_name(kind), p->ckpt);
      t[nt] = (tgm_tensor_desc){names[k * 3 + kind], TGM_F32, p->rank, {0}, st + (size_t)kind * (size_t)n + tgm_info.params[k].state};
      memcpy(t[nt++].shape, p->shape, sizeof p->shape);
    }
  }
  int32_t stepv[2] = {(int32_t)(uint32_t)m->step, (int32_t)(uint32_t)((uint64_t)m->step >> 32)};
  t[nt++] = (tgm_tensor_desc){"optim.step", TGM_I32, 1, {2}, stepv};
/*@uses distributed@*/
  if (m->dist) { /* rank 0 writes; every rank returns what that gave */
    rc = dist_write(m, path, t, nt);
    goto done;
  }
/*@end distributed@*/
  if (tgm_st_write_checked(path, t, nt, m->err, sizeof m->err))
    rc = TGM_EIO;
done:
  free(h);
  free(t);
  free(names);
  return (tgm_status)rc;
}

/* Tensor `name` of f: present, f32 (or i32 for the step), with the shape. */
static const tgm_tensor_desc *want(tgm_model *m, const tgm_st_file *f, const char *path, const char *name, int dtype,
                                   int rank, const int64_t *shape, int *rc) {
  const tgm_tensor_desc *t = tgm_st_find(f, name);
  if (!t)
    *rc = tgm_fail(m, TGM_ECORRUPT, "%s: tensor '%s' is missing (not a training checkpoint of this model?)", path, name);
  else if (t->dtype != dtype || t->rank != rank || memcmp(t->shape, shape, sizeof(int64_t) * (size_t)rank))
    *rc = tgm_fail(m, TGM_ECORRUPT, "%s: tensor '%s' has the wrong dtype or shape", path, name);
  return *rc ? NULL : t;
}

tgm_status tgm_load_checkpoint(tgm_model *m, const char *path) {
  if (!m)
    return TGM_EINVAL;
  int rc = need_train(m, "load_checkpoint");
  if (rc)
    return (tgm_status)rc;
  if (!path)
    return tgm_fail(m, TGM_EINVAL, "load_checkpoint: path is NULL");
  if ((rc = train_state(m)))
    return (tgm_status)rc;
  tgm_st_file f;
  if ((rc = tgm_st_read(path, &f, m->err, sizeof m->err)))
    return (tgm_status)rc;
  int64_t n = tgm_info.state_elems;
  size_t fb = (size_t)n * sizeof(float);
  float *st = calloc(1, 3 * fb + 8);
  int64_t step = 0;
  if (!st) {
    rc = tgm_fail(m, TGM_ENOMEM, "load_checkpoint: out of memory");
    goto done;
  }
  /* check everything before changing anything */
  const int64_t two = 2;
  const tgm_tensor_desc *s = want(m, &f, path, "optim.step", TGM_I32, 1, &two, &rc);
  if (!s)
    goto done;
  step = (int64_t)((uint64_t)(uint32_t)((const int32_t *)s->data)[0] | (uint64_t)(uint32_t)((const int32_t *)s->data)[1] << 32);
  if (step < 0) {
    rc = tgm_fail(m, TGM_ECORRUPT, "%s: optim.step is negative", path);
    goto done;
  }
  for (int k = 0; k < tgm_info.nparams; k++) {
    const tgm_param_info *p = &tgm_info.params[k];
    for (int kind = 0; kind < 3; kind++) {
      if (!state_buf(m, kind) || (kind == 0 && p->dtype == TGM_F32))
        continue;
      char name[160];
      snprintf(name, sizeof name, "optim.%s.%s", state_name(kind), p->ckpt);
      const tgm_tensor_desc *t = want(m, &f, path, name, TGM_F32, p->rank, p->shape, &rc);
      if (!t)
        goto done;
      memcpy(st + (size_t)kind * (size_t)n + tgm_info.params[k].state, t->data, (size_t)p->numel * sizeof(float));
      const float *v = st + (size_t)kind * (size_t)n + tgm_info.params[k].state;
      for (int64_t i = 0; kind == 2 && i < p->numel; i++)
        if (!(v[i] >= 0)) { /* a second moment is a mean of squares */
          rc = tgm_fail(m, TGM_ECORRUPT, "%s: %s[%lld] is %g; a second moment is never negative or NaN", path, name,
                        (long long)i, (double)v[i]);
          goto done;
        }
    }
  }
  if ((rc = tgm_load_params(m, path))) /* checks and loads the params (all or nothing) */
    goto done;
  for (int kind = 0; kind < 3; kind++) /* the slice of the state this model keeps */
    if (state_buf(m, kind) && (rc = dev_copy(m, st + (size_t)kind * (size_t)n + m->state_lo, state_buf(m, kind),
                                             (size_t)(m->state_hi - m->state_lo) * sizeof(float), 0)))
      goto done;
  if (m->master)
    m->master_stale = 0; /* the checkpoint's master copy, not the rounded params */
  m->step = step;
  m->step_dirty = 1;
done:
  free(st);
  tgm_st_free(&f);
  return (tgm_status)rc;
}
/*@uses distributed@*/

/* ---------------------------------------------------------------- data parallel */

/* The message of the last failed NCCL or CUDA call (both land in the
 * context); a build without the CUDA path never makes a rank with NCCL. */
static const char *dist_error(const tgm_model *m) {
#ifdef TGM_HAVE_CUDA
  return tgm_cuda_ctx_error(m->cx);
#else
  (void)m;
  return "this build has no CUDA path";
#endif
}

/* A buffer in the params' layout (the params or the gradients) as NCCL
 * parts: each run's part in each rank's slice, that rank its root
 * (by_owner), or each run whole with root 0. out has room for nruns x
 * nranks parts; returns the count. */
static int dist_parts(const tgm_model *m, unsigned char *base, int by_owner, tgm_nccl_part *out) {
  const tgm_dist *d = m->dist;
  int np = 0;
  for (int q = 0; q < (by_owner ? d->nranks : 1); q++) {
    int64_t lo = 0, hi = tgm_info.state_elems;
    if (by_owner)
      tgm_shard(tgm_info.state_elems, d->nranks, q, &lo, &hi);
    for (int i = 0; i < tgm_info.nruns; i++) {
      const tgm_param_run *r = &tgm_info.runs[i];
      int64_t e0, n = run_slice(i, lo, hi, &e0);
      if (n)
        out[np++] = (tgm_nccl_part){base + r->b0 + e0 * tgm_dtype_sizes[r->dt], n, r->dt, q};
    }
  }
  return np;
}

/* A broadcast over a buffer in the params' layout: each rank's slice from
 * it (by_owner), or all of rank 0's. */
static int dist_broadcast(tgm_model *m, unsigned char *base, int by_owner, const char *what) {
  tgm_dist *d = m->dist;
  tgm_nccl_part *parts = malloc(sizeof *parts * (size_t)(tgm_info.nruns * d->nranks + 1));
  if (!parts)
    return tgm_fail(m, TGM_ENOMEM, "%s: out of memory", what);
  int np = dist_parts(m, base, by_owner, parts);
  int e = tgm_nccl_broadcast(m->cx, d->comm, parts, np);
  free(parts);
  return e ? tgm_fail(m, TGM_EDEVICE, "%s: %s", what, dist_error(m)) : TGM_OK;
}

/* Before a pass: a train pass's gradients will be averaged (mode 1: into
 * every rank, forward_backward; 2: into the rank that owns each slice,
 * train_step: the optimizer reads only its own); none sent yet. */
static void dist_pass_begin(tgm_model *m, int pass, int opt) {
  tgm_dist *d = m->dist;
  d->mode = d->comm && pass == TGM_PASS_TRAIN ? (opt ? 2 : 1) : 0;
  d->nbucket = 0;
  d->bucket_bytes = 0;
  memset(d->sent, 0, (size_t)tgm_info.nparams + 1);
}

/* The bucket's gradients averaged over the ranks on the side stream (after
 * the kernels enqueued so far): each param whole (mode 1), or its part in
 * each rank's slice into that rank (mode 2). */
static int dist_send_bucket(tgm_model *m) {
  tgm_dist *d = m->dist;
  if (!d->nbucket)
    return TGM_OK;
  tgm_nccl_part *parts = malloc(sizeof *parts * (size_t)(d->nbucket * d->nranks + 1));
  if (!parts)
    return tgm_fail(m, TGM_ENOMEM, "averaging the gradients: out of memory");
  int np = 0;
  for (int i = 0; i < d->nbucket; i++) {
    const tgm_param_info *p = &tgm_info.params[d->bucket[i]];
    for (int q = 0; q < (d->mode == 2 ? d->nranks : 1); q++) {
      int64_t lo = 0, hi = tgm_info.state_elems;
      if (d->mode == 2)
        tgm_shard(tgm_info.state_elems, d->nranks, q, &lo, &hi);
      int64_t a = p->state > lo ? p->state : lo, b = p->state + p->numel < hi ? p->state + p->numel : hi;
      if (b > a)
        parts[np++] = (tgm_nccl_part){m->grads + p->offset + (a - p->state) * tgm_dtype_sizes[p->dtype], b - a,
                                      p->dtype, q};
    }
  }
  int e = d->mode == 2 ? tgm_nccl_reduce_avg(m->cx, d->comm, parts, np, 1)
                       : tgm_nccl_all_reduce(m->cx, d->comm, parts, np, 1, 1);
  free(parts);
  d->nbucket = 0;
  d->bucket_bytes = 0;
  return e ? tgm_fail(m, TGM_EDEVICE, "averaging the gradients over the ranks: %s", dist_error(m))
           : TGM_OK;
}

int tgm_dist_ready(tgm_model *m, const int *ks, int n) {
  tgm_dist *d = m->dist;
  if (!d || !d->mode)
    return TGM_OK;
  for (int i = 0; i < n; i++) {
    const tgm_param_info *p = &tgm_info.params[ks[i]];
    if (d->sent[ks[i]])
      continue;
    d->sent[ks[i]] = 1;
    d->bucket[d->nbucket++] = ks[i];
    d->bucket_bytes += p->numel * tgm_dtype_sizes[p->dtype];
  }
  return d->bucket_bytes >= TGM_BUCKET_BYTES ? dist_send_bucket(m) : TGM_OK;
}

/* After a loss or train pass: the loss averaged over the ranks; the
 * gradients the pass did not hand over yet sent as the last bucket, and
 * the model's stream waits for them. A simulated rank exchanges nothing. */
static int dist_reduce(tgm_model *m, int pass) {
  tgm_dist *d = m->dist;
  if (!d->comm)
    return TGM_OK;
  int rc = TGM_OK;
  if (pass == TGM_PASS_TRAIN) {
    for (int k = 0; k < tgm_info.nparams && !rc; k++) /* the gradients no kernel handed over */
      if (!d->sent[k])
        rc = tgm_dist_ready(m, &k, 1);
    if (rc || (rc = dist_send_bucket(m)) || tgm_nccl_join(m->cx, d->comm))
      rc = rc ? rc : tgm_fail(m, TGM_EDEVICE, "%s", dist_error(m));
    d->mode = 0;
  }
  tgm_nccl_part loss = {m->loss, 1, tgm_info.loss_dtype, 0};
  if (!rc && tgm_nccl_all_reduce(m->cx, d->comm, &loss, 1, 1, 0))
    rc = tgm_fail(m, TGM_EDEVICE, "averaging the loss over the ranks: %s", dist_error(m));
  return rc;
}

#ifdef TGM_HAVE_CUDA
/* The per-run sums of squares of every rank's slice, summed: the global
 * gradient norm, the same on every rank (so every rank clips, or refuses
 * the step, alike). */
static int dist_sum_squares(tgm_model *m) {
  tgm_nccl_part p = {tgm_cuda_opt_sums(m->opt), tgm_info.nruns, TGM_NCCL_F64, 0};
  if (tgm_nccl_all_reduce(m->cx, m->dist->comm, &p, 1, 0, 0))
    return tgm_fail(m, TGM_EDEVICE, "summing the gradient norm over the ranks: %s", dist_error(m));
  return TGM_OK;
}

/* After the update: each rank's slice of the params to every rank. */
static int dist_gather_params(tgm_model *m) {
  return dist_broadcast(m, m->params, 1, "gathering the updated params");
}
#endif

/* Optimizer state buffer `kind` of every rank into rank 0's dst (the whole
 * flat state); the other ranks send theirs. */
static int dist_state_to_host(tgm_model *m, int kind, float *dst) {
  tgm_dist *d = m->dist;
  if (!d->comm)
    return tgm_fail(m, TGM_EINVAL, "save_checkpoint: a simulated rank keeps only its slice of the optimizer state");
  int64_t E = tgm_info.state_elems;
  float *all = NULL;
  tgm_nccl_part *parts = calloc((size_t)d->nranks, sizeof *parts);
  int rc = parts ? TGM_OK : tgm_fail(m, TGM_ENOMEM, "save_checkpoint: out of memory");
  if (!rc && d->rank == 0 && !(all = dev_zalloc(m, (size_t)E * sizeof(float))))
    rc = tgm_fail(m, TGM_ENOMEM, "save_checkpoint: out of device memory for the optimizer state (%lld bytes)",
                  (long long)E * 4);
  for (int q = 0; !rc && q < d->nranks; q++) {
    int64_t lo, hi;
    tgm_shard(E, d->nranks, q, &lo, &hi);
    parts[q] = (tgm_nccl_part){all ? all + lo : NULL, hi - lo, TGM_F32, q};
  }
  if (!rc && tgm_nccl_gather(m->cx, d->comm, d->rank, state_buf(m, kind), parts, d->nranks))
    rc = tgm_fail(m, TGM_EDEVICE, "save_checkpoint: gathering the optimizer state: %s", dist_error(m));
  if (!rc && all)
    rc = dev_copy(m, dst, all, (size_t)E * sizeof(float), 1);
  dev_free(m, all);
  free(parts);
  return rc;
}

/* Rank 0 writes the checkpoint; every rank returns what that gave. */
static int dist_write(tgm_model *m, const char *path, const tgm_tensor_desc *t, int nt) {
  int32_t bad = m->dist->rank == 0 && tgm_st_write_checked(path, t, nt, m->err, sizeof m->err);
  int32_t *flag = dev_zalloc(m, sizeof bad);
  tgm_nccl_part p = {flag, 1, TGM_I32, 0};
  if (!flag || dev_copy(m, &bad, flag, sizeof bad, 0) || tgm_nccl_broadcast(m->cx, m->dist->comm, &p, 1) ||
      dev_copy(m, &bad, flag, sizeof bad, 1)) {
    dev_free(m, flag);
    return tgm_fail(m, TGM_EDEVICE, "save_checkpoint: agreeing on the result: %s", dist_error(m));
  }
  dev_free(m, flag);
  if (bad && m->dist->rank != 0)
    return tgm_fail(m, TGM_EIO, "save_checkpoint: rank 0 could not write %s (its error says why)", path);
  return bad ? TGM_EIO : TGM_OK;
}

static void dist_free(tgm_model *m) {
  if (m->dist) {
    tgm_nccl_free(m->dist->comm);
    free(m->dist->sent);
    free(m->dist->bucket);
  }
  free(m->dist);
  m->dist = NULL;
}

/* The checks before a model becomes a rank; then its slice of the state. */
static int dist_begin(tgm_model *m, const char *what, int rank, int nranks) {
  if (need_train(m, what))
    return TGM_EINVAL;
  if (!tgm_info.optimizer)
    return tgm_fail(m, TGM_EINVAL, "%s: model %s has no optimizer", what, tgm_info.name);
  if (nranks < 1 || nranks > 65536 || rank < 0 || rank >= nranks)
    return tgm_fail(m, TGM_EINVAL, "%s: rank %d of %d ranks (need 0 <= rank < nranks, 1 <= nranks <= 65536)", what,
                    rank, nranks);
  if (m->dist)
    return tgm_fail(m, TGM_EINVAL, "%s: the model is already rank %d of %d", what, m->dist->rank, m->dist->nranks);
  if (m->grads)
    return tgm_fail(m, TGM_EINVAL, "%s: call it before the first training call or load_checkpoint (the optimizer "
                                   "state is already allocated whole)", what);
  if (!(m->dist = calloc(1, sizeof *m->dist)) || !(m->dist->sent = calloc((size_t)tgm_info.nparams + 1, 1)) ||
      !(m->dist->bucket = calloc((size_t)tgm_info.nparams + 1, sizeof(int)))) {
    dist_free(m);
    return tgm_fail(m, TGM_ENOMEM, "%s: out of memory", what);
  }
  m->dist->rank = rank;
  m->dist->nranks = nranks;
  tgm_shard(tgm_info.state_elems, nranks, rank, &m->state_lo, &m->state_hi);
  return TGM_OK;
}

int tgm_dist_simulate(tgm_model *m, int rank, int nranks) {
  if (!m)
    return TGM_EINVAL;
  if (m->device != 0)
    return tgm_fail(m, TGM_EINVAL, "dist_simulate: only a model on the cpu simulates a rank");
  return dist_begin(m, "dist_simulate", rank, nranks);
}

tgm_status tgm_dist_new_id(void *id, size_t bytes) {
  char err[256];
  if (!id || bytes != TGM_NCCL_ID_BYTES)
    return TGM_EINVAL;
  return tgm_nccl_new_id(id, err, sizeof err) ? TGM_EDEVICE : TGM_OK;
}

tgm_status tgm_dist_init_id(tgm_model *m, int rank, int nranks, const void *id, size_t bytes) {
  if (!m)
    return TGM_EINVAL;
  if (m->device != 1)
    return tgm_fail(m, TGM_EINVAL, "dist_init: the model must be on \"cuda\" (NCCL runs on GPUs)");
  if (!id || bytes != TGM_NCCL_ID_BYTES)
    return tgm_fail(m, TGM_EINVAL, "dist_init: the id must be %d bytes (tgm_dist_new_id), got %zu%s",
                    TGM_NCCL_ID_BYTES, bytes, id ? "" : " (NULL)");
  if (!tgm_nccl_available())
    return tgm_fail(m, TGM_EDEVICE, "dist_init: this build has no NCCL path (configured with -DTGM_NCCL=OFF)");
  int rc = dist_begin(m, "dist_init", rank, nranks);
  if (rc)
    return (tgm_status)rc;
  if (tgm_nccl_init(m->cx, &m->dist->comm, rank, nranks, id)) {
    rc = tgm_fail(m, TGM_EDEVICE, "dist_init: %s", dist_error(m));
    dist_free(m);
    m->state_lo = 0, m->state_hi = tgm_info.state_elems;
    return (tgm_status)rc;
  }
  m->master_stale = 1;
  /* every rank starts from rank 0's params */
  if ((rc = dist_broadcast(m, m->params, 0, "dist_init: sharing rank 0's params")))
    return (tgm_status)rc;
  return (tgm_status)settle(m, NULL);
}

tgm_status tgm_dist_init(tgm_model *m, int rank, int nranks, const char *rendezvous) {
  if (!m)
    return TGM_EINVAL;
  if (!rendezvous)
    return tgm_fail(m, TGM_EINVAL, "dist_init: rendezvous is NULL (\"file:PATH\" or \"tcp:HOST:PORT\")");
  if (m->device != 1)
    return tgm_fail(m, TGM_EINVAL, "dist_init: the model must be on \"cuda\" (NCCL runs on GPUs)");
  if (rank < 0 || rank >= nranks)
    return tgm_fail(m, TGM_EINVAL, "dist_init: rank %d of %d ranks (need 0 <= rank < nranks)", rank, nranks);
  if (!tgm_nccl_available())
    return tgm_fail(m, TGM_EDEVICE, "dist_init: this build has no NCCL path (configured with -DTGM_NCCL=OFF)");
  unsigned char id[TGM_NCCL_ID_BYTES];
  if (tgm_rendezvous(rendezvous, rank, nranks, TGM_RENDEZVOUS_S, id, m->err, sizeof m->err))
    return TGM_EIO;
  tgm_status rc = tgm_dist_init_id(m, rank, nranks, id, sizeof id);
  if (!rc)
    tgm_rendezvous_done(rendezvous, rank);
  return rc;
}

int tgm_dist_rank(const tgm_model *m) { return m && m->dist ? m->dist->rank : 0; }
int tgm_dist_nranks(const tgm_model *m) { return m && m->dist ? m->dist->nranks : 1; }
/*@end distributed@*/
