/* mlp_model.c: the public API of a model (mlp.h), independent of the model:
 * everything specific comes from the tables tgen generates (mlp_info,
 * mlp_compute_syms, mlp_io_shape, mlp_ws_bytes) and the forward passes of
 * the CPU and CUDA files. Template: copied into NAME_common.c with "mlp"
 * renamed. */
#include "mlp_rt.h"
#include "mlp.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* compile.mode max-autotune: where the GEMM choices are kept (the working
 * directory; mlp_set_autotune names another file) */
#define MLP_TUNE_FILE "mlp_autotune.txt"

int mlp_fail(struct mlp_model *m, int code, const char *fmt, ...) {
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
static void *dev_zalloc(mlp_model *m, size_t n) {
  if (m->device == 0)
    return calloc(1, n ? n : 1);
#ifdef MLP_HAVE_CUDA
  void *p = NULL;
  unsigned char *zero = calloc(1, n ? n : 1);
  if (!zero || mlp_cuda_malloc(m->cx, &p, n ? n : 1) || mlp_cuda_memcpy(m->cx, p, zero, n, 0)) {
    mlp_cuda_free(m->cx, p);
    p = NULL;
  }
  free(zero);
  return p;
#else
  return NULL;
#endif
}

static void dev_free(mlp_model *m, void *p) {
  if (m->device == 0)
    free(p);
#ifdef MLP_HAVE_CUDA
  else if (p)
    mlp_cuda_free(m->cx, p);
#endif
}

/* Fill n bytes on the model's device with 0xff (MLP_POISON_ARENA). */
static int dev_poison(mlp_model *m, void *p, size_t n) {
  if (!p || !n)
    return MLP_OK;
  if (m->device == 0) {
    memset(p, 0xff, n);
    return MLP_OK;
  }
#ifdef MLP_HAVE_CUDA
  unsigned char *ff = malloc(n);
  int rc = !ff || mlp_cuda_memcpy(m->cx, p, memset(ff, 0xff, n), n, 0);
  free(ff);
  if (rc)
    return mlp_fail(m, MLP_EDEVICE, "poisoning the arena: %s", ff ? mlp_cuda_ctx_error(m->cx) : "out of memory");
  return MLP_OK;
#else
  return mlp_fail(m, MLP_EDEVICE, "no CUDA path in this build");
#endif
}

/* Copy n bytes between the host and the model's device (to_host: dev -> host). */
static int dev_copy(mlp_model *m, void *host, void *dev, size_t n, int to_host) {
  if (m->device == 0) {
    if (to_host)
      memcpy(host, dev, n);
    else
      memcpy(dev, host, n);
    return MLP_OK;
  }
#ifdef MLP_HAVE_CUDA
  if (mlp_cuda_memcpy(m->cx, to_host ? host : dev, to_host ? dev : host, n, to_host ? 1 : 0))
    return mlp_fail(m, MLP_EDEVICE, "copying %s the device: %s", to_host ? "from" : "to", mlp_cuda_ctx_error(m->cx));
  return MLP_OK;
#else
  return mlp_fail(m, MLP_EDEVICE, "no CUDA path in this build");
#endif
}

mlp_status mlp_create(const char *device, mlp_model **out, char *err, size_t errlen) {
  if (!out) {
    set_err(err, errlen, "mlp_create: out is NULL%s", "");
    return MLP_EINVAL;
  }
  *out = NULL;
  int gpu = -1; /* "cuda:N": device N */
  if (device && !strncmp(device, "cuda:", 5)) {
    char *end;
    long v = strtol(device + 5, &end, 10);
    if (end == device + 5 || *end || v < 0 || v > 1023) {
      set_err(err, errlen, "mlp_create: \"%s\" is no device (\"cuda:N\" with N a device number)", device);
      return MLP_EINVAL;
    }
    gpu = (int)v;
  } else if (!device || (strcmp(device, "cpu") && strcmp(device, "cuda"))) {
    set_err(err, errlen, "mlp_create: device must be \"cpu\", \"cuda\" or \"cuda:N\", not \"%s\"",
            device ? device : "(null)");
    return MLP_EINVAL;
  }
  mlp_model *m = calloc(1, sizeof *m);
  if (!m) {
    set_err(err, errlen, "mlp_create: out of memory%s", "");
    return MLP_ENOMEM;
  }
  m->master_stale = 1;
  m->state_hi = mlp_info.state_elems;
  if (strcmp(device, "cpu")) {
#ifdef MLP_HAVE_CUDA
    m->device = 1;
    char cerr[256];
    if ((gpu >= 0 && mlp_cuda_use_device(gpu, cerr, sizeof cerr)) || mlp_cuda_ctx_create(&m->cx, cerr, sizeof cerr)) {
      set_err(err, errlen, "mlp_create: %s", cerr);
      free(m);
      return MLP_EDEVICE;
    }
    m->graphs = mlp_graphs_default;
    if (mlp_tune_default && mlp_cuda_set_tune(m->cx, 1, MLP_TUNE_FILE)) {
      set_err(err, errlen, "mlp_create: %s", mlp_cuda_ctx_error(m->cx));
      mlp_cuda_ctx_destroy(m->cx);
      free(m);
      return MLP_ENOMEM;
    }
#else
    (void)gpu;
    free(m);
    set_err(err, errlen, "mlp_create: this build has no CUDA path (no CUDA compiler was found when it was configured)%s", "");
    return MLP_EDEVICE;
#endif
  }
  if (!(m->params = dev_zalloc(m, (size_t)mlp_info.param_bytes))) {
    set_err(err, errlen, "mlp_create: out of %s memory for the params", m->device ? "device" : "host");
    mlp_destroy(m);
    return MLP_ENOMEM;
  }
  *out = m;
  return MLP_OK;
}

void mlp_destroy(mlp_model *m) {
  if (!m)
    return;
  void *bufs[] = {m->params, m->ws, m->grads, m->master, m->opt_m, m->opt_v, m->loss, m->opt, m->igrad};
  for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
    dev_free(m, bufs[i]);
#ifdef MLP_HAVE_CUDA
  for (int i = 0; i < MLP_GRAPHS; i++)
    mlp_cuda_graph_free(m->graph[i].exec);
  if (m->device == 1)
    mlp_cuda_ctx_destroy(m->cx);
#endif
  free(m);
}

const char *mlp_error(const mlp_model *m) { return m ? m->err : "mlp_error: model is NULL"; }

size_t mlp_param_bytes(void) { return (size_t)mlp_info.param_bytes; }

/* Copy between a host buffer and the params (either direction). */
static int params_copy(mlp_model *m, void *host, int to_host) {
  if (!to_host)
    m->master_stale = 1; /* the optimizer's f32 copy must follow */
  return dev_copy(m, host, m->params, (size_t)mlp_info.param_bytes, to_host);
}

mlp_status mlp_get_params(mlp_model *m, void *host, size_t bytes) {
  if (!m)
    return MLP_EINVAL;
  if (!host || bytes != (size_t)mlp_info.param_bytes)
    return mlp_fail(m, MLP_EINVAL, "mlp_get_params: need a buffer of exactly %lld bytes, got %zu%s",
                    (long long)mlp_info.param_bytes, bytes, host ? "" : " (NULL)");
  return params_copy(m, host, 1);
}

mlp_status mlp_set_params(mlp_model *m, const void *host, size_t bytes) {
  if (!m)
    return MLP_EINVAL;
  if (!host || bytes != (size_t)mlp_info.param_bytes)
    return mlp_fail(m, MLP_EINVAL, "mlp_set_params: need a buffer of exactly %lld bytes, got %zu%s",
                    (long long)mlp_info.param_bytes, bytes, host ? "" : " (NULL)");
  return params_copy(m, (void *)host, 0);
}

/* Fresh training: optimizer state zero, step 0 (after init or load). */
static int reset_train_state(mlp_model *m) {
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
#ifdef MLP_HAVE_CUDA
    if (mlp_cuda_fill(m->cx, MLP_F32, bufs[i], m->state_hi - m->state_lo, 0) || mlp_cuda_sync(m->cx))
      return mlp_fail(m, MLP_EDEVICE, "clearing the optimizer state: %s", mlp_cuda_ctx_error(m->cx));
#endif
  }
  return MLP_OK;
}

/* The model's thread count (mlp_set_threads) around a call's host work (a
 * CPU pass, the CPU optimizer step, the params' init): threads_begin sets it
 * for the calling thread's parallel regions (an OpenMP setting is per
 * thread) and returns the caller's, which threads_end gives back. Nothing
 * without OpenMP or with the default (0). */
static int threads_begin(const mlp_model *m) {
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

static void threads_end(const mlp_model *m, int was) {
#ifdef _OPENMP
  if (m->threads > 0 && m->threads != was)
    omp_set_num_threads(was);
#else
  (void)m;
  (void)was;
#endif
}

mlp_status mlp_set_threads(mlp_model *m, int n) {
  if (!m)
    return MLP_EINVAL;
  if (n < 0 || n > MLP_MAX_THREADS)
    return mlp_fail(m, MLP_EINVAL, "set_threads: n must be 1 to %d, or 0 for OpenMP's default, not %d",
                    MLP_MAX_THREADS, n);
  m->threads = n;
  return MLP_OK;
}

mlp_status mlp_init_params(mlp_model *m, uint64_t seed) {
  if (!m)
    return MLP_EINVAL;
  size_t n = (size_t)mlp_info.param_bytes;
  unsigned char *h = calloc(1, n ? n : 1); /* padding between params stays zero */
  if (!h)
    return mlp_fail(m, MLP_ENOMEM, "mlp_init_params: out of memory (%zu bytes)", n);
  int was = threads_begin(m);
  for (int k = 0; k < mlp_info.nparams; k++) {
    const mlp_param_info *p = &mlp_info.params[k];
    void *dst = h + p->offset;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t i = 0; i < p->numel; i++)
      mlp_put(dst, p->dtype, i, mlp_init_value(p->name, p->init, p->a, p->b, p->dtype, p->rank, p->shape, seed, i));
  }
  threads_end(m, was);
  int rc = params_copy(m, h, 0);
  free(h);
  return (mlp_status)(rc ? rc : reset_train_state(m));
}

mlp_status mlp_save_params(mlp_model *m, const char *path) {
  if (!m)
    return MLP_EINVAL;
  if (!path)
    return mlp_fail(m, MLP_EINVAL, "mlp_save_params: path is NULL");
  size_t n = (size_t)mlp_info.param_bytes;
  unsigned char *h = calloc(1, n ? n : 1); /* padding between params stays zero */
  mlp_tensor_desc *t = calloc((size_t)mlp_info.nparams + 1, sizeof *t);
  int rc = MLP_OK;
  if (!h || !t) {
    rc = mlp_fail(m, MLP_ENOMEM, "mlp_save_params: out of memory");
    goto done;
  }
  if ((rc = params_copy(m, h, 1)))
    goto done;
  for (int k = 0; k < mlp_info.nparams; k++) {
    const mlp_param_info *p = &mlp_info.params[k];
    t[k].name = p->ckpt;
    t[k].dtype = p->dtype;
    t[k].rank = p->rank;
    memcpy(t[k].shape, p->shape, sizeof p->shape);
    t[k].data = h + p->offset;
  }
  if (mlp_st_write_checked(path, t, mlp_info.nparams, m->err, sizeof m->err))
    rc = MLP_EIO;
done:
  free(h);
  free(t);
  return (mlp_status)rc;
}

static const char *shape_text(char *buf, size_t n, int rank, const int64_t *s) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < rank && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)s[i]);
  if (k < n)
    snprintf(buf + k, n - k, "]");
  return buf;
}

mlp_status mlp_load_params(mlp_model *m, const char *path) {
  if (!m)
    return MLP_EINVAL;
  if (!path)
    return mlp_fail(m, MLP_EINVAL, "mlp_load_params: path is NULL");
  mlp_st_file f;
  int rc = mlp_st_read(path, &f, m->err, sizeof m->err);
  if (rc)
    return (mlp_status)rc;
  size_t n = (size_t)mlp_info.param_bytes;
  unsigned char *h = calloc(1, n ? n : 1); /* padding between params stays zero */
  char a[128], b[128];
  if (!h) {
    rc = mlp_fail(m, MLP_ENOMEM, "mlp_load_params: out of memory");
    goto done;
  }
  for (int k = 0; k < mlp_info.nparams; k++) {
    const mlp_param_info *p = &mlp_info.params[k];
    const mlp_tensor_desc *t = mlp_st_find(&f, p->ckpt);
    if (!t) {
      rc = mlp_fail(m, MLP_ECORRUPT, "%s: tensor '%s' is missing", path, p->ckpt);
      goto done;
    }
    if (t->dtype != p->dtype) {
      rc = mlp_fail(m, MLP_ECORRUPT, "%s: tensor '%s' has dtype %s, expected %s", path, p->ckpt,
                    mlp_dtype_names[t->dtype], mlp_dtype_names[p->dtype]);
      goto done;
    }
    if (t->rank != p->rank || memcmp(t->shape, p->shape, sizeof(int64_t) * (size_t)p->rank)) {
      rc = mlp_fail(m, MLP_ECORRUPT, "%s: tensor '%s' has shape %s, expected %s", path, p->ckpt,
                    shape_text(a, sizeof a, t->rank, t->shape), shape_text(b, sizeof b, p->rank, p->shape));
      goto done;
    }
    memcpy(h + p->offset, t->data, (size_t)(p->numel * mlp_dtype_sizes[p->dtype]));
  }
  if (f.n != mlp_info.nparams) {
    for (int i = 0; i < f.n; i++) {
      int known = 0;
      for (int k = 0; k < mlp_info.nparams && !known; k++)
        known = !strcmp(f.t[i].name, mlp_info.params[k].ckpt);
      known |= !strncmp(f.t[i].name, "optim.", 6); /* a training checkpoint's optimizer state */
      if (!known) {
        rc = mlp_fail(m, MLP_ECORRUPT, "%s: tensor '%s' is not a param of model %s", path, f.t[i].name, mlp_info.name);
        goto done;
      }
    }
  }
  rc = params_copy(m, h, 0);
  if (!rc)
    rc = reset_train_state(m);
done:
  free(h);
  mlp_st_free(&f);
  return (mlp_status)rc;
}

/* Make sure the workspace holds `need` bytes (grows, never shrinks). */
static int ensure_ws(mlp_model *m, int64_t need) {
  if (need <= m->ws_bytes)
    return MLP_OK;
  if (m->device == 0) {
    free(m->ws);
    m->ws = malloc((size_t)need);
    m->ws_bytes = m->ws ? need : 0;
    return m->ws ? MLP_OK : mlp_fail(m, MLP_ENOMEM, "out of memory for the workspace (%lld bytes)", (long long)need);
  }
#ifdef MLP_HAVE_CUDA
  mlp_cuda_free(m->cx, m->ws);
  m->ws = NULL;
  m->ws_bytes = 0;
  m->ws_gen++; /* graphs recorded with the old workspace are stale */
  if (mlp_cuda_malloc(m->cx, (void **)&m->ws, (size_t)need))
    return mlp_fail(m, MLP_ENOMEM, "out of device memory for the workspace (%lld bytes): %s", (long long)need,
                    mlp_cuda_ctx_error(m->cx));
  m->ws_bytes = need;
  return MLP_OK;
#else
  return mlp_fail(m, MLP_EDEVICE, "no CUDA path in this build");
#endif
}

/* ---------------------------------------------------------------- passes */

/* Checks common to every pass; sym gets the dims' symbol values. */
static int check_call(mlp_model *m, const char *what, int pass, const int64_t *dims, const void *const *in,
                      int64_t *sym) {
  if (mlp_info.ndyn && !dims)
    return mlp_fail(m, MLP_EINVAL, "%s: dims is NULL, but the model has %d dynamic dim%s", what, mlp_info.ndyn,
                    mlp_info.ndyn == 1 ? "" : "s");
  if (mlp_info.ninputs && !in)
    return mlp_fail(m, MLP_EINVAL, "%s: inputs is NULL", what);
  for (int k = 0; k < mlp_info.ninputs; k++)
    if (!in[k] && (mlp_pass_inputs[pass] >> k & 1)) /* one the pass does not read may be NULL */
      return mlp_fail(m, MLP_EINVAL, "%s: input '%s' is NULL", what, mlp_info.inputs[k].name);
  return mlp_compute_syms(dims, sym, m->err, sizeof m->err);
}

static int run_pass(mlp_model *m, int pass, const int64_t *sym, const void *const *in, void *const *out) {
  static const mlp_pass_fn cpu[MLP_NPASS] = {mlp_forward_cpu, mlp_loss_cpu, mlp_train_cpu};
  if (m->device == 0) {
    int was = threads_begin(m), rc = cpu[pass](m, sym, in, out);
    threads_end(m, was);
    return rc;
  }
#ifdef MLP_HAVE_CUDA
  static const mlp_pass_fn cuda[MLP_NPASS] = {mlp_forward_cuda, mlp_loss_cuda, mlp_train_cuda};
  return cuda[pass](m, sym, in, out);
#else
  return mlp_fail(m, MLP_EDEVICE, "no CUDA path in this build");
#endif
}

static int optimizer_enqueue(mlp_model *m);
static int optimizer_step_cpu(mlp_model *m);
static int refresh_master(mlp_model *m);

/* One call's work: the pass, then (train_step) the optimizer. */
static int enqueue(mlp_model *m, int pass, int opt, const int64_t *sym, const void *const *in, void *const *out) {
  int rc = run_pass(m, pass, sym, in, out);
  return rc || !opt ? rc : optimizer_enqueue(m);
}

#ifdef MLP_HAVE_CUDA
/* The graph recorded for this call, or the entry to record it in. The first
 * call with a key runs eagerly (it sizes the scratch and the GEMM plans);
 * the second records; later ones replay. A graph holds every pointer it was
 * recorded with: the inputs, outputs, workspace and scratch are its key. */
static struct mlp_graph *graph_slot(mlp_model *m, int pass, const int64_t *sym, const void *const *in,
                                    void *const *out, int *found) {
  unsigned gen = mlp_cuda_ctx_generation(m->cx);
  int nout = pass == MLP_PASS_FORWARD ? mlp_info.noutputs : pass == MLP_PASS_TRAIN ? 1 + mlp_info.nwrt : 1, victim = 0;
  *found = 0;
  for (int i = 0; i < MLP_GRAPHS; i++) {
    struct mlp_graph *e = &m->graph[i];
    if (!e->used) {
      victim = i;
      continue;
    }
    int same = e->pass == pass && e->gen == gen && e->ws_gen == m->ws_gen &&
               !memcmp(e->sym, sym, sizeof(int64_t) * (size_t)mlp_info.nsym);
    for (int k = 0; same && k < mlp_info.ninputs; k++)
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
  struct mlp_graph *e = &m->graph[victim];
  mlp_cuda_graph_free(e->exec);
  memset(e, 0, sizeof *e);
  e->pass = pass, e->gen = gen, e->ws_gen = m->ws_gen;
  memcpy(e->sym, sym, sizeof(int64_t) * (size_t)mlp_info.nsym);
  for (int k = 0; k < mlp_info.ninputs; k++)
    e->in[k] = in[k];
  for (int k = 0; k < nout; k++)
    e->out[k] = out[k];
  return e;
}

static int graph_call(mlp_model *m, int pass, int opt, const int64_t *sym, const void *const *in, void *const *out) {
  int found;
  struct mlp_graph *e = graph_slot(m, pass, sym, in, out, &found);
  e->used = ++m->graph_clock;
  if (found && e->exec)
    return mlp_cuda_graph_launch(m->cx, e->exec) ? mlp_fail(m, MLP_EDEVICE, "%s", mlp_cuda_ctx_error(m->cx)) : MLP_OK;
  if (!found || e->eager) /* first sight (or not recordable): eagerly */
    return enqueue(m, pass, opt, sym, in, out);
  if (mlp_cuda_graph_begin(m->cx))
    return mlp_fail(m, MLP_EDEVICE, "%s", mlp_cuda_ctx_error(m->cx));
  int rc = enqueue(m, pass, opt, sym, in, out);
  void *g = NULL;
  int end = mlp_cuda_graph_end(m->cx, &g);
  if (rc) /* an argument error found while recording: nothing ran */
    return rc;
  if (end || !g) { /* something in the pass cannot be recorded: this key runs eagerly from now on */
    e->eager = 1;
    return enqueue(m, pass, opt, sym, in, out);
  }
  e->exec = g;
  return mlp_cuda_graph_launch(m->cx, g) ? mlp_fail(m, MLP_EDEVICE, "%s", mlp_cuda_ctx_error(m->cx)) : MLP_OK;
}
#endif

/* A call's work on the model's device, replayed from a CUDA graph where it can be. */
static int run_call(mlp_model *m, int pass, int opt, const int64_t *sym, const void *const *in, void *const *out) {
  int rc = ensure_ws(m, mlp_pass_arena[pass]);
  if (rc)
    return rc;
  /* a test aid: MLP_POISON_ARENA=1 fills the arena (and before a train pass
   * each param's gradient) with 0xff bytes, NaN in every float dtype, so that a value
   * read before the pass writes it shows */
  const char *poison = getenv("MLP_POISON_ARENA");
  if (poison && *poison && strcmp(poison, "0") != 0) {
    rc = dev_poison(m, m->ws, (size_t)mlp_pass_arena[pass]);
    for (int k = 0; !rc && pass == MLP_PASS_TRAIN && k < mlp_info.nparams; k++) {
      const mlp_param_info *q = &mlp_info.params[k]; /* not the padding between them: it stays 0 */
      rc = dev_poison(m, m->grads + q->offset, (size_t)(q->numel * (q->dtype == MLP_F32 ? 4 : 2)));
    }
    if (rc)
      return rc;
  }
#ifdef MLP_HAVE_CUDA
  if (m->device == 1 && opt && m->step_dirty) {
    if (mlp_cuda_opt_set_step(m->cx, m->opt, m->step))
      return mlp_fail(m, MLP_EDEVICE, "%s", mlp_cuda_ctx_error(m->cx));
    m->step_dirty = 0;
  }
  if (m->device == 1 && m->graphs && !mlp_pass_dropout[pass] && mlp_info.ninputs <= MLP_GRAPH_IO &&
      mlp_info.noutputs <= MLP_GRAPH_IO && 1 + mlp_info.nwrt <= MLP_GRAPH_IO)
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
static int settle(mlp_model *m, float *loss) {
  if (m->device == 0) {
    if (loss && m->loss)
      *loss = (float)mlp_get(m->loss, mlp_info.loss_dtype, 0);
    return MLP_OK;
  }
#ifdef MLP_HAVE_CUDA
  int64_t bad = -1, step = m->step, bad_step = 0;
  double bad_ss = 0;
  unsigned char lb[8] = {0};
  if (mlp_cuda_sync(m->cx) || (loss && m->loss && mlp_cuda_memcpy(m->cx, lb, m->loss, 8, 1)) ||
      mlp_cuda_bad_index(m->cx, &bad) || (m->opt && mlp_cuda_opt_report(m->cx, m->opt, &step, &bad_step, &bad_ss)))
    return mlp_fail(m, MLP_EDEVICE, "%s", mlp_cuda_ctx_error(m->cx));
  if (loss && m->loss)
    *loss = (float)mlp_get(lb, mlp_info.loss_dtype, 0);
  if (m->opt && !m->step_dirty)
    m->step = step;
  if (bad >= 0)
    return mlp_fail(m, MLP_EDATA, "an index or target at position %lld is out of range (an embedding or cross_entropy)%s",
                    (long long)bad, bad_step ? "; no update applied" : "");
  if (bad_step)
    return mlp_fail(m, MLP_EDATA,
                    "train_step: gradient norm is %s at step %lld; no update applied (params, optimizer state and "
                    "step unchanged)",
                    isnan(bad_ss) ? "NaN" : "inf", (long long)bad_step);
  return MLP_OK;
#else
  return mlp_fail(m, MLP_EDEVICE, "no CUDA path in this build");
#endif
}

mlp_status mlp_sync(mlp_model *m) { return m ? (mlp_status)settle(m, NULL) : MLP_EINVAL; }

mlp_status mlp_set_stream(mlp_model *m, void *stream) {
  if (!m)
    return MLP_EINVAL;
  if (m->device == 0)
    return stream ? mlp_fail(m, MLP_EINVAL, "set_stream: the model is on the cpu, which has no streams") : MLP_OK;
#ifdef MLP_HAVE_CUDA
  if (mlp_cuda_set_stream(m->cx, stream))
    return mlp_fail(m, MLP_EDEVICE, "set_stream: %s", mlp_cuda_ctx_error(m->cx));
#endif
  return MLP_OK;
}

mlp_status mlp_set_graphs(mlp_model *m, int on) {
  if (!m)
    return MLP_EINVAL;
  if (on != 0 && on != 1)
    return mlp_fail(m, MLP_EINVAL, "set_graphs: on must be 0 or 1, not %d", on);
  m->graphs = on && m->device == 1;
  return MLP_OK;
}

mlp_status mlp_set_autotune(mlp_model *m, int on, const char *file) {
  if (!m)
    return MLP_EINVAL;
  if (on != 0 && on != 1)
    return mlp_fail(m, MLP_EINVAL, "set_autotune: on must be 0 or 1, not %d", on);
  if (m->device == 0)
    return MLP_OK;
#ifdef MLP_HAVE_CUDA
  if (mlp_cuda_set_tune(m->cx, on, file ? file : MLP_TUNE_FILE))
    return mlp_fail(m, MLP_EINVAL, "set_autotune: %s", mlp_cuda_ctx_error(m->cx));
#endif
  return MLP_OK;
}

mlp_status mlp_forward_v(mlp_model *m, const int64_t *dims, const void *const *in, void *const *out) {
  if (!m)
    return MLP_EINVAL;
  int64_t sym[16] = {0};
  int rc = check_call(m, "forward", MLP_PASS_FORWARD, dims, in, sym);
  if (rc)
    return (mlp_status)rc;
  if (!out)
    return mlp_fail(m, MLP_EINVAL, "forward: outputs is NULL");
  for (int k = 0; k < mlp_info.noutputs; k++)
    if (!out[k])
      return mlp_fail(m, MLP_EINVAL, "forward: output '%s' is NULL", mlp_info.outputs[k].name);
  return (mlp_status)run_call(m, MLP_PASS_FORWARD, 0, sym, in, out);
}

/* ---------------------------------------------------------------- training */

static int need_train(mlp_model *m, const char *what) {
  if (!mlp_info.loss_name)
    return mlp_fail(m, MLP_EINVAL, "%s: model %s has no train: section", what, mlp_info.name);
  return MLP_OK;
}

/* Allocate the gradient buffer and the optimizer state on first use. */
static int train_state(mlp_model *m) {
  size_t fb = (size_t)(m->state_hi - m->state_lo) * sizeof(float);
  if (!m->grads && !(m->grads = dev_zalloc(m, (size_t)mlp_info.param_bytes)))
    return mlp_fail(m, MLP_ENOMEM, "out of memory for the gradients (%lld bytes)", (long long)mlp_info.param_bytes);
  if (mlp_info.need_master && !m->master && !(m->master = dev_zalloc(m, fb)))
    return mlp_fail(m, MLP_ENOMEM, "out of memory for the f32 master params (%zu bytes)", fb);
  int nstate = mlp_info.optimizer == 2 ? 2 : mlp_info.optimizer == 1 && mlp_info.momentum != 0 ? 1 : 0;
  if (nstate >= 1 && !m->opt_m && !(m->opt_m = dev_zalloc(m, fb)))
    return mlp_fail(m, MLP_ENOMEM, "out of memory for the optimizer state (%zu bytes)", fb);
  if (nstate >= 2 && !m->opt_v && !(m->opt_v = dev_zalloc(m, fb)))
    return mlp_fail(m, MLP_ENOMEM, "out of memory for the optimizer state (%zu bytes)", fb);
#ifdef MLP_HAVE_CUDA
  if (m->device == 1 && !m->opt) {
    if (mlp_cuda_opt_new(m->cx, mlp_info.nruns, &m->opt))
      return mlp_fail(m, MLP_ENOMEM, "out of device memory for the optimizer's state: %s", mlp_cuda_ctx_error(m->cx));
    m->step_dirty = 1;
  }
#endif
  return MLP_OK;
}

/* The train pass's out[]: the loss, then the gradient of each train.wrt
 * input: the caller's buffer d_in[j], or (d_in NULL: train_step,
 * forward_backward) scratch the model keeps, grown to the call's sizes. */
static int train_outs(mlp_model *m, const int64_t *sym, void *const *d_in, void **out) {
  int64_t need = 0, at = 0, shape[MLP_MAXRANK];
  out[0] = m->loss;
  for (int pass = 0; pass < 2; pass++) {
    for (int j = 0; j < mlp_info.nwrt; j++) {
      const mlp_io_info *x = &mlp_info.inputs[mlp_info.wrt[j]];
      int64_t n = mlp_dtype_sizes[x->dtype];
      mlp_io_shape(0, mlp_info.wrt[j], sym, shape);
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
        return mlp_fail(m, MLP_ENOMEM, "out of memory for the input gradients (%lld bytes)", (long long)need);
      m->igrad_bytes = need;
    }
  }
  return MLP_OK;
}

/* The loss pass, forward_backward(_wrt) or train_step: the work is enqueued;
 * with a loss pointer the call waits and reports; with NULL it returns at
 * once (on cuda: read the loss with get_loss, errors come from sync). */
static int train_call(mlp_model *m, const char *what, int pass, int opt, const int64_t *dims, const void *const *in,
                      void *const *d_in, float *loss) {
  if (!m)
    return MLP_EINVAL;
  int64_t sym[16] = {0};
  int rc = need_train(m, what);
  if (!rc)
    rc = check_call(m, what, pass, dims, in, sym);
  if (!rc && !m->loss && !(m->loss = dev_zalloc(m, 8)))
    rc = mlp_fail(m, MLP_ENOMEM, "%s: out of memory for the loss", what);
  if (!rc && pass == MLP_PASS_TRAIN)
    rc = train_state(m);
  if (!rc && opt)
    rc = refresh_master(m);
  void *out[1 + 64] = {m->loss};
  if (!rc && pass == MLP_PASS_TRAIN)
    rc = train_outs(m, sym, d_in, out);
  if (rc)
    return rc;
  if ((rc = run_call(m, pass, opt, sym, in, out)))
    return rc;
  if (m->device == 0 && opt)
    rc = optimizer_step_cpu(m);
  return rc || (!loss && m->device == 1) ? rc : settle(m, loss);
}

mlp_status mlp_loss_v(mlp_model *m, const int64_t *dims, const void *const *in, float *loss) {
  return (mlp_status)train_call(m, "loss", MLP_PASS_LOSS, 0, dims, in, NULL, loss);
}

mlp_status mlp_forward_backward_v(mlp_model *m, const int64_t *dims, const void *const *in, float *loss) {
  return (mlp_status)train_call(m, "forward_backward", MLP_PASS_TRAIN, 0, dims, in, NULL, loss);
}

mlp_status mlp_forward_backward_wrt_v(mlp_model *m, const int64_t *dims, const void *const *in, void *const *d_in,
                                      float *loss) {
  if (!m)
    return MLP_EINVAL;
  if (mlp_info.nwrt && !d_in)
    return mlp_fail(m, MLP_EINVAL, "forward_backward_wrt: d_in is NULL");
  for (int j = 0; j < mlp_info.nwrt; j++)
    if (!d_in[j])
      return mlp_fail(m, MLP_EINVAL, "forward_backward_wrt: the gradient buffer of input '%s' is NULL",
                      mlp_info.inputs[mlp_info.wrt[j]].name);
  return (mlp_status)train_call(m, "forward_backward_wrt", MLP_PASS_TRAIN, 0, dims, in, d_in, loss);
}

mlp_status mlp_train_step_v(mlp_model *m, const int64_t *dims, const void *const *in, float *loss) {
  if (m && mlp_info.loss_name && !mlp_info.optimizer)
    return mlp_fail(m, MLP_EINVAL, "train_step: model %s has no optimizer (its train: section only asks for gradients)",
                    mlp_info.name);
  return (mlp_status)train_call(m, "train_step", MLP_PASS_TRAIN, 1, dims, in, NULL, loss);
}

mlp_status mlp_get_loss(mlp_model *m, float *loss) {
  if (!m)
    return MLP_EINVAL;
  if (!loss)
    return mlp_fail(m, MLP_EINVAL, "get_loss: loss is NULL");
  if (!m->loss)
    return mlp_fail(m, MLP_EINVAL, "get_loss: no loss computed yet");
  return (mlp_status)settle(m, loss);
}

/* Run i's elements in the slice [lo, hi) of the flat optimizer state: the
 * count (0: none), and in *e0 the first one's index within the run. */
static int64_t run_slice(int i, int64_t lo, int64_t hi, int64_t *e0) {
  const mlp_param_run *r = &mlp_info.runs[i];
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

static run_operands operands(mlp_model *m, int i) {
  const mlp_param_run *r = &mlp_info.runs[i];
  int64_t e0, n = run_slice(i, m->state_lo, m->state_hi, &e0), s = r->f + e0 - m->state_lo;
  int64_t b = r->b0 + e0 * mlp_dtype_sizes[r->dt];
  int low = r->dt != MLP_F32;
  run_operands o = {n, low ? m->master + s : (float *)(void *)(m->params + b), m->opt_m ? m->opt_m + s : NULL,
                    m->opt_v ? m->opt_v + s : NULL, low ? m->params + b : NULL, m->grads + b};
  return o;
}

/* The f32 master copy from the params (after init, load or set). */
static int refresh_master(mlp_model *m) {
  const mlp_param_run *r = mlp_info.runs;
  if (!m->master || !m->master_stale)
    return MLP_OK;
  for (int i = 0; i < mlp_info.nruns; i++) {
    run_operands a = operands(m, i);
    if (r[i].dt == MLP_F32 || !a.n)
      continue;
    if (m->device == 0) {
      int was = threads_begin(m);
      mlp_cpu_cast(r[i].dt, MLP_F32, a.lowp, a.w, a.n);
      threads_end(m, was);
    }
#ifdef MLP_HAVE_CUDA
    else if (mlp_cuda_cast(m->cx, r[i].dt, MLP_F32, a.lowp, a.w, a.n))
      return mlp_fail(m, MLP_EDEVICE, "%s", mlp_cuda_ctx_error(m->cx));
#endif
  }
  m->master_stale = 0;
  return MLP_OK;
}

/* The CPU's step: the global gradient norm, checked before anything
 * changes (a step with a NaN or inf in the gradients is refused: MLP_EDATA,
 * no update); the clip factor (1 = none); the optimizer over every run. */
static int optimizer_step_cpu(mlp_model *m) {
  const mlp_param_run *r = mlp_info.runs;
  const mlp_model_info *o = &mlp_info;
  double ss = 0;
  int was = threads_begin(m);
  for (int i = 0; i < o->nruns; i++) /* in a fixed order: deterministic */
    ss += mlp_cpu_sum_squares(m->grads + r[i].b0, r[i].dt, r[i].n);
  if (!isfinite(ss)) {
    threads_end(m, was);
    return mlp_fail(m, MLP_EDATA,
                    "train_step: gradient norm is %s at step %lld; no update applied (params, optimizer state and "
                    "step unchanged)",
                    isnan(ss) ? "NaN" : "inf", (long long)(m->step + 1));
  }
  double scale = o->grad_clip > 0 ? mlp_clip_factor(ss, o->grad_clip) : 1;
  int64_t t = m->step + 1;
  for (int i = 0; i < o->nruns; i++) {
    run_operands a = operands(m, i);
    if (o->optimizer == 2)
      mlp_cpu_adamw(a.w, a.g, r[i].dt, a.mm, a.vv, a.lowp, r[i].dt, a.n, o->lr, o->beta1, o->beta2, o->eps,
                    o->weight_decay, t, scale);
    else
      mlp_cpu_sgd(a.w, a.g, r[i].dt, a.mm, a.lowp, r[i].dt, a.n, o->lr, o->momentum, o->weight_decay, t, scale);
  }
  threads_end(m, was);
  m->step = t;
  return MLP_OK;
}

/* The CUDA step, enqueued after the train pass (a graph records both): the
 * sums of squares, the device's decision (refuse, or clip and step), the
 * updates. The host counts the step now; settle corrects it from the device. */
static int optimizer_enqueue(mlp_model *m) {
  if (m->device == 0)
    return MLP_OK; /* train_call runs the CPU's step after the pass */
#ifdef MLP_HAVE_CUDA
  const mlp_param_run *r = mlp_info.runs;
  const mlp_model_info *o = &mlp_info;
  mlp_opt_hyper h = {o->optimizer, o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, o->momentum, o->grad_clip};
  int e = 0;
  for (int i = 0; i < o->nruns && !e; i++) {
    run_operands a = operands(m, i);
    e = mlp_cuda_opt_sum_squares(m->cx, m->opt, o->nruns, i, a.g, r[i].dt, a.n);
  }
  if (!e)
    e = mlp_cuda_opt_prepare(m->cx, m->opt, o->nruns, &h);
  for (int i = 0; i < o->nruns && !e; i++) {
    run_operands a = operands(m, i);
    e = o->optimizer == 2
            ? mlp_cuda_opt_adamw(m->cx, m->opt, a.w, a.g, r[i].dt, a.mm, a.vv, a.lowp, r[i].dt, a.n)
            : mlp_cuda_opt_sgd(m->cx, m->opt, a.w, a.g, r[i].dt, a.mm, o->momentum != 0, a.lowp, r[i].dt, a.n);
  }
  if (e)
    return mlp_fail(m, MLP_EDEVICE, "optimizer: %s", mlp_cuda_ctx_error(m->cx));
  return MLP_OK;
#else
  return mlp_fail(m, MLP_EDEVICE, "no CUDA path in this build");
#endif
}

const void *mlp_grads(mlp_model *m) {
  if (!m || need_train(m, "grads") || train_state(m))
    return NULL;
  return m->grads;
}

mlp_status mlp_get_grads(mlp_model *m, void *host, size_t bytes) {
  if (!m)
    return MLP_EINVAL;
  int rc = need_train(m, "get_grads");
  if (rc)
    return (mlp_status)rc;
  if (!host || bytes != (size_t)mlp_info.param_bytes)
    return mlp_fail(m, MLP_EINVAL, "get_grads: need a buffer of exactly %lld bytes, got %zu%s",
                    (long long)mlp_info.param_bytes, bytes, host ? "" : " (NULL)");
  if ((rc = train_state(m)))
    return (mlp_status)rc;
  return (mlp_status)dev_copy(m, host, m->grads, bytes, 1);
}

int64_t mlp_get_step(const mlp_model *m) { return m ? m->step : -1; }

mlp_status mlp_set_step(mlp_model *m, int64_t step) {
  if (!m)
    return MLP_EINVAL;
  if (step < 0)
    return mlp_fail(m, MLP_EINVAL, "set_step: step %lld is negative", (long long)step);
  m->step = step;
  m->step_dirty = 1;
  return MLP_OK;
}

/* ---------------------------------------------------------------- checkpoints */

/* The optimizer state's tensors: kind 0 master, 1 exp_avg / momentum_buffer, 2 exp_avg_sq. */
static const char *state_name(int kind) {
  return kind == 0 ? "master" : kind == 2 ? "exp_avg_sq" : mlp_info.optimizer == 2 ? "exp_avg" : "momentum_buffer";
}

static float *state_buf(mlp_model *m, int kind) { return kind == 0 ? m->master : kind == 1 ? m->opt_m : m->opt_v; }

/* State buffer `kind` into dst, the whole flat state's place (on a
 * data-parallel rank: every rank's slice into rank 0's dst). */
static int state_to_host(mlp_model *m, int kind, float *dst) {
  return dev_copy(m, dst + m->state_lo, state_buf(m, kind), (size_t)(m->state_hi - m->state_lo) * sizeof(float), 1);
}

mlp_status mlp_save_checkpoint(mlp_model *m, const char *path) {
  if (!m)
    return MLP_EINVAL;
  int rc = need_train(m, "save_checkpoint");
  if (rc)
    return (mlp_status)rc;
  if (!path)
    return mlp_fail(m, MLP_EINVAL, "save_checkpoint: path is NULL");
  if ((rc = settle(m, NULL))) /* the step count the device reached */
    return (mlp_status)rc;
  if ((rc = train_state(m)) || (rc = refresh_master(m)))
    return (mlp_status)rc;
  int64_t n = mlp_info.state_elems;
  size_t pb = (size_t)mlp_info.param_bytes, fb = (size_t)n * sizeof(float);
  unsigned char *h = calloc(1, pb + 3 * fb + 8);
  mlp_tensor_desc *t = calloc((size_t)mlp_info.nparams * 4 + 2, sizeof *t);
  char (*names)[160] = calloc((size_t)mlp_info.nparams * 3 + 1, sizeof *names);
  int nt = 0;
  if (!h || !t || !names) {
    rc = mlp_fail(m, MLP_ENOMEM, "save_checkpoint: out of memory");
    goto done;
  }
  float *st = (float *)(void *)(h + pb);
  if ((rc = dev_copy(m, h, m->params, pb, 1)))
    goto done;
  for (int kind = 0; kind < 3; kind++)
    if (state_buf(m, kind) && (rc = state_to_host(m, kind, st + (size_t)kind * (size_t)n)))
      goto done;
  for (int k = 0; k < mlp_info.nparams; k++) {
    const mlp_param_info *p = &mlp_info.params[k];
    t[nt] = (mlp_tensor_desc){p->ckpt, p->dtype, p->rank, {0}, h + p->offset};
    memcpy(t[nt++].shape, p->shape, sizeof p->shape);
    for (int kind = 0; kind < 3; kind++) {
      if (!state_buf(m, kind) || (kind == 0 && p->dtype == MLP_F32))
        continue;
      snprintf(names[k * 3 + kind], sizeof names[0], "optim.%s.%s", state_name(kind), p->ckpt);
      t[nt] = (mlp_tensor_desc){names[k * 3 + kind], MLP_F32, p->rank, {0}, st + (size_t)kind * (size_t)n + mlp_info.params[k].state};
      memcpy(t[nt++].shape, p->shape, sizeof p->shape);
    }
  }
  int32_t stepv[2] = {(int32_t)(uint32_t)m->step, (int32_t)(uint32_t)((uint64_t)m->step >> 32)};
  t[nt++] = (mlp_tensor_desc){"optim.step", MLP_I32, 1, {2}, stepv};
  if (mlp_st_write_checked(path, t, nt, m->err, sizeof m->err))
    rc = MLP_EIO;
done:
  free(h);
  free(t);
  free(names);
  return (mlp_status)rc;
}

/* Tensor `name` of f: present, f32 (or i32 for the step), with the shape. */
static const mlp_tensor_desc *want(mlp_model *m, const mlp_st_file *f, const char *path, const char *name, int dtype,
                                   int rank, const int64_t *shape, int *rc) {
  const mlp_tensor_desc *t = mlp_st_find(f, name);
  if (!t)
    *rc = mlp_fail(m, MLP_ECORRUPT, "%s: tensor '%s' is missing (not a training checkpoint of this model?)", path, name);
  else if (t->dtype != dtype || t->rank != rank || memcmp(t->shape, shape, sizeof(int64_t) * (size_t)rank))
    *rc = mlp_fail(m, MLP_ECORRUPT, "%s: tensor '%s' has the wrong dtype or shape", path, name);
  return *rc ? NULL : t;
}

mlp_status mlp_load_checkpoint(mlp_model *m, const char *path) {
  if (!m)
    return MLP_EINVAL;
  int rc = need_train(m, "load_checkpoint");
  if (rc)
    return (mlp_status)rc;
  if (!path)
    return mlp_fail(m, MLP_EINVAL, "load_checkpoint: path is NULL");
  if ((rc = train_state(m)))
    return (mlp_status)rc;
  mlp_st_file f;
  if ((rc = mlp_st_read(path, &f, m->err, sizeof m->err)))
    return (mlp_status)rc;
  int64_t n = mlp_info.state_elems;
  size_t fb = (size_t)n * sizeof(float);
  float *st = calloc(1, 3 * fb + 8);
  int64_t step = 0;
  if (!st) {
    rc = mlp_fail(m, MLP_ENOMEM, "load_checkpoint: out of memory");
    goto done;
  }
  /* check everything before changing anything */
  const int64_t two = 2;
  const mlp_tensor_desc *s = want(m, &f, path, "optim.step", MLP_I32, 1, &two, &rc);
  if (!s)
    goto done;
  step = (int64_t)((uint64_t)(uint32_t)((const int32_t *)s->data)[0] | (uint64_t)(uint32_t)((const int32_t *)s->data)[1] << 32);
  if (step < 0) {
    rc = mlp_fail(m, MLP_ECORRUPT, "%s: optim.step is negative", path);
    goto done;
  }
  for (int k = 0; k < mlp_info.nparams; k++) {
    const mlp_param_info *p = &mlp_info.params[k];
    for (int kind = 0; kind < 3; kind++) {
      if (!state_buf(m, kind) || (kind == 0 && p->dtype == MLP_F32))
        continue;
      char name[160];
      snprintf(name, sizeof name, "optim.%s.%s", state_name(kind), p->ckpt);
      const mlp_tensor_desc *t = want(m, &f, path, name, MLP_F32, p->rank, p->shape, &rc);
      if (!t)
        goto done;
      memcpy(st + (size_t)kind * (size_t)n + mlp_info.params[k].state, t->data, (size_t)p->numel * sizeof(float));
      const float *v = st + (size_t)kind * (size_t)n + mlp_info.params[k].state;
      for (int64_t i = 0; kind == 2 && i < p->numel; i++)
        if (!(v[i] >= 0)) { /* a second moment is a mean of squares */
          rc = mlp_fail(m, MLP_ECORRUPT, "%s: %s[%lld] is %g; a second moment is never negative or NaN", path, name,
                        (long long)i, (double)v[i]);
          goto done;
        }
    }
  }
  if ((rc = mlp_load_params(m, path))) /* checks and loads the params (all or nothing) */
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
  mlp_st_free(&f);
  return (mlp_status)rc;
}
