/* mlp_model.c: the public API of a model (mlp.h), independent of the model:
 * everything specific comes from the tables tgen generates (mlp_info,
 * mlp_compute_syms, mlp_io_shape, mlp_ws_bytes) and the forward passes of
 * the CPU and CUDA files. Template: copied into NAME_common.c with "mlp"
 * renamed. */
#include "mlp_rt.h"
#include "mlp.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

mlp_status mlp_create(const char *device, mlp_model **out, char *err, size_t errlen) {
  if (!out) {
    set_err(err, errlen, "mlp_create: out is NULL%s", "");
    return MLP_EINVAL;
  }
  *out = NULL;
  if (!device || (strcmp(device, "cpu") && strcmp(device, "cuda"))) {
    set_err(err, errlen, "mlp_create: device must be \"cpu\" or \"cuda\", not \"%s\"", device ? device : "(null)");
    return MLP_EINVAL;
  }
  mlp_model *m = calloc(1, sizeof *m);
  if (!m) {
    set_err(err, errlen, "mlp_create: out of memory%s", "");
    return MLP_ENOMEM;
  }
  size_t pb = (size_t)mlp_info.param_bytes;
  if (!strcmp(device, "cpu")) {
    m->device = 0;
    m->params = calloc(1, pb ? pb : 1);
    if (!m->params) {
      free(m);
      set_err(err, errlen, "mlp_create: out of memory for the params%s", "");
      return MLP_ENOMEM;
    }
  } else {
#ifdef MLP_HAVE_CUDA
    m->device = 1;
    char cerr[256];
    if (mlp_cuda_ctx_create(&m->cx, cerr, sizeof cerr)) {
      set_err(err, errlen, "mlp_create: %s", cerr);
      free(m);
      return MLP_EDEVICE;
    }
    if (mlp_cuda_malloc(m->cx, (void **)&m->params, pb ? pb : 1)) {
      set_err(err, errlen, "mlp_create: %s", mlp_cuda_ctx_error(m->cx));
      mlp_cuda_ctx_destroy(m->cx);
      free(m);
      return MLP_ENOMEM;
    }
    unsigned char *zero = calloc(1, pb ? pb : 1);
    int rc = !zero || mlp_cuda_memcpy(m->cx, m->params, zero, pb, 0);
    free(zero);
    if (rc) {
      set_err(err, errlen, "mlp_create: could not clear the params on the device%s", "");
      mlp_destroy(m);
      return MLP_EDEVICE;
    }
#else
    free(m);
    set_err(err, errlen, "mlp_create: this build has no CUDA path (no CUDA compiler was found when it was configured)%s", "");
    return MLP_EDEVICE;
#endif
  }
  *out = m;
  return MLP_OK;
}

void mlp_destroy(mlp_model *m) {
  if (!m)
    return;
  if (m->device == 0) {
    free(m->params);
    free(m->ws);
  }
#ifdef MLP_HAVE_CUDA
  else {
    mlp_cuda_free(m->cx, m->params);
    mlp_cuda_free(m->cx, m->ws);
    mlp_cuda_ctx_destroy(m->cx);
  }
#endif
  free(m);
}

const char *mlp_error(const mlp_model *m) { return m ? m->err : "mlp_error: model is NULL"; }

size_t mlp_param_bytes(void) { return (size_t)mlp_info.param_bytes; }

/* Copy between a host buffer and the params (either direction). */
static int params_copy(mlp_model *m, void *host, int to_host) {
  size_t n = (size_t)mlp_info.param_bytes;
  if (m->device == 0) {
    if (to_host)
      memcpy(host, m->params, n);
    else
      memcpy(m->params, host, n);
    return MLP_OK;
  }
#ifdef MLP_HAVE_CUDA
  if (mlp_cuda_memcpy(m->cx, to_host ? host : m->params, to_host ? m->params : host, n, to_host ? 1 : 0))
    return mlp_fail(m, MLP_EDEVICE, "copying the params: %s", mlp_cuda_ctx_error(m->cx));
  return MLP_OK;
#else
  return mlp_fail(m, MLP_EDEVICE, "no CUDA path in this build");
#endif
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

mlp_status mlp_init_params(mlp_model *m, uint64_t seed) {
  if (!m)
    return MLP_EINVAL;
  size_t n = (size_t)mlp_info.param_bytes;
  unsigned char *h = calloc(1, n ? n : 1); /* padding between params stays zero */
  if (!h)
    return mlp_fail(m, MLP_ENOMEM, "mlp_init_params: out of memory (%zu bytes)", n);
  for (int k = 0; k < mlp_info.nparams; k++) {
    const mlp_param_info *p = &mlp_info.params[k];
    void *dst = h + p->offset;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < p->numel; i++)
      mlp_put(dst, p->dtype, i, mlp_init_value(p->name, p->init, p->a, p->b, p->dtype, p->rank, p->shape, seed, i));
  }
  int rc = params_copy(m, h, 0);
  free(h);
  return (mlp_status)rc;
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
  if (mlp_st_write(path, t, mlp_info.nparams, m->err, sizeof m->err))
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
      if (!known) {
        rc = mlp_fail(m, MLP_ECORRUPT, "%s: tensor '%s' is not a param of model %s", path, f.t[i].name, mlp_info.name);
        goto done;
      }
    }
  }
  rc = params_copy(m, h, 0);
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
  if (mlp_cuda_malloc(m->cx, (void **)&m->ws, (size_t)need))
    return mlp_fail(m, MLP_ENOMEM, "out of device memory for the workspace (%lld bytes): %s", (long long)need,
                    mlp_cuda_ctx_error(m->cx));
  m->ws_bytes = need;
  return MLP_OK;
#else
  return mlp_fail(m, MLP_EDEVICE, "no CUDA path in this build");
#endif
}

mlp_status mlp_forward_v(mlp_model *m, const int64_t *dims, const void *const *in, void *const *out) {
  if (!m)
    return MLP_EINVAL;
  if (mlp_info.ndyn && !dims)
    return mlp_fail(m, MLP_EINVAL, "forward: dims is NULL, but the model has %d dynamic dim%s", mlp_info.ndyn,
                    mlp_info.ndyn == 1 ? "" : "s");
  if ((mlp_info.ninputs && !in) || !out)
    return mlp_fail(m, MLP_EINVAL, "forward: %s is NULL", out ? "inputs" : "outputs");
  for (int k = 0; k < mlp_info.ninputs; k++)
    if (!in[k])
      return mlp_fail(m, MLP_EINVAL, "forward: input '%s' is NULL", mlp_info.inputs[k].name);
  for (int k = 0; k < mlp_info.noutputs; k++)
    if (!out[k])
      return mlp_fail(m, MLP_EINVAL, "forward: output '%s' is NULL", mlp_info.outputs[k].name);
  int64_t sym[16] = {0};
  int rc = mlp_compute_syms(dims, sym, m->err, sizeof m->err);
  if (rc)
    return (mlp_status)rc;
  rc = ensure_ws(m, mlp_ws_bytes(sym));
  if (rc)
    return (mlp_status)rc;
  if (m->device == 0)
    return (mlp_status)mlp_forward_cpu(m, sym, in, out);
#ifdef MLP_HAVE_CUDA
  return (mlp_status)mlp_forward_cuda(m, sym, in, out);
#else
  return mlp_fail(m, MLP_EDEVICE, "no CUDA path in this build");
#endif
}
