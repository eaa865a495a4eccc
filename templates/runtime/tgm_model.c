/* tgm_model.c: the public API of a model (tgm.h), independent of the model:
 * everything specific comes from the tables tgen generates (tgm_info,
 * tgm_compute_syms, tgm_io_shape, tgm_ws_bytes) and the forward passes of
 * the CPU and CUDA files. Template: copied into NAME_common.c with "tgm"
 * renamed. */
#include "tgm_rt.h"
#include "tgm.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

tgm_status tgm_create(const char *device, tgm_model **out, char *err, size_t errlen) {
  if (!out) {
    set_err(err, errlen, "tgm_create: out is NULL%s", "");
    return TGM_EINVAL;
  }
  *out = NULL;
  if (!device || (strcmp(device, "cpu") && strcmp(device, "cuda"))) {
    set_err(err, errlen, "tgm_create: device must be \"cpu\" or \"cuda\", not \"%s\"", device ? device : "(null)");
    return TGM_EINVAL;
  }
  tgm_model *m = calloc(1, sizeof *m);
  if (!m) {
    set_err(err, errlen, "tgm_create: out of memory%s", "");
    return TGM_ENOMEM;
  }
  size_t pb = (size_t)tgm_info.param_bytes;
  if (!strcmp(device, "cpu")) {
    m->device = 0;
    m->params = calloc(1, pb ? pb : 1);
    if (!m->params) {
      free(m);
      set_err(err, errlen, "tgm_create: out of memory for the params%s", "");
      return TGM_ENOMEM;
    }
  } else {
#ifdef TGM_HAVE_CUDA
    m->device = 1;
    char cerr[256];
    if (tgm_cuda_ctx_create(&m->cx, cerr, sizeof cerr)) {
      set_err(err, errlen, "tgm_create: %s", cerr);
      free(m);
      return TGM_EDEVICE;
    }
    if (tgm_cuda_malloc(m->cx, (void **)&m->params, pb ? pb : 1)) {
      set_err(err, errlen, "tgm_create: %s", tgm_cuda_ctx_error(m->cx));
      tgm_cuda_ctx_destroy(m->cx);
      free(m);
      return TGM_ENOMEM;
    }
    unsigned char *zero = calloc(1, pb ? pb : 1);
    int rc = !zero || tgm_cuda_memcpy(m->cx, m->params, zero, pb, 0);
    free(zero);
    if (rc) {
      set_err(err, errlen, "tgm_create: could not clear the params on the device%s", "");
      tgm_destroy(m);
      return TGM_EDEVICE;
    }
#else
    free(m);
    set_err(err, errlen, "tgm_create: this build has no CUDA path (no CUDA compiler was found when it was configured)%s", "");
    return TGM_EDEVICE;
#endif
  }
  *out = m;
  return TGM_OK;
}

void tgm_destroy(tgm_model *m) {
  if (!m)
    return;
  if (m->device == 0) {
    free(m->params);
    free(m->ws);
  }
#ifdef TGM_HAVE_CUDA
  else {
    tgm_cuda_free(m->cx, m->params);
    tgm_cuda_free(m->cx, m->ws);
    tgm_cuda_ctx_destroy(m->cx);
  }
#endif
  free(m);
}

const char *tgm_error(const tgm_model *m) { return m ? m->err : "tgm_error: model is NULL"; }

size_t tgm_param_bytes(void) { return (size_t)tgm_info.param_bytes; }

/* Copy between a host buffer and the params (either direction). */
static int params_copy(tgm_model *m, void *host, int to_host) {
  size_t n = (size_t)tgm_info.param_bytes;
  if (m->device == 0) {
    if (to_host)
      memcpy(host, m->params, n);
    else
      memcpy(m->params, host, n);
    return TGM_OK;
  }
#ifdef TGM_HAVE_CUDA
  if (tgm_cuda_memcpy(m->cx, to_host ? host : m->params, to_host ? m->params : host, n, to_host ? 1 : 0))
    return tgm_fail(m, TGM_EDEVICE, "copying the params: %s", tgm_cuda_ctx_error(m->cx));
  return TGM_OK;
#else
  return tgm_fail(m, TGM_EDEVICE, "no CUDA path in this build");
#endif
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

tgm_status tgm_init_params(tgm_model *m, uint64_t seed) {
  if (!m)
    return TGM_EINVAL;
  size_t n = (size_t)tgm_info.param_bytes;
  unsigned char *h = calloc(1, n ? n : 1); /* padding between params stays zero */
  if (!h)
    return tgm_fail(m, TGM_ENOMEM, "tgm_init_params: out of memory (%zu bytes)", n);
  for (int k = 0; k < tgm_info.nparams; k++) {
    const tgm_param_info *p = &tgm_info.params[k];
    void *dst = h + p->offset;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < p->numel; i++)
      tgm_put(dst, p->dtype, i, tgm_init_value(p->name, p->init, p->a, p->b, p->dtype, p->rank, p->shape, seed, i));
  }
  int rc = params_copy(m, h, 0);
  free(h);
  return (tgm_status)rc;
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
  if (tgm_st_write(path, t, tgm_info.nparams, m->err, sizeof m->err))
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
      if (!known) {
        rc = tgm_fail(m, TGM_ECORRUPT, "%s: tensor '%s' is not a param of model %s", path, f.t[i].name, tgm_info.name);
        goto done;
      }
    }
  }
  rc = params_copy(m, h, 0);
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
  if (tgm_cuda_malloc(m->cx, (void **)&m->ws, (size_t)need))
    return tgm_fail(m, TGM_ENOMEM, "out of device memory for the workspace (%lld bytes): %s", (long long)need,
                    tgm_cuda_ctx_error(m->cx));
  m->ws_bytes = need;
  return TGM_OK;
#else
  return tgm_fail(m, TGM_EDEVICE, "no CUDA path in this build");
#endif
}

tgm_status tgm_forward_v(tgm_model *m, const int64_t *dims, const void *const *in, void *const *out) {
  if (!m)
    return TGM_EINVAL;
  if (tgm_info.ndyn && !dims)
    return tgm_fail(m, TGM_EINVAL, "forward: dims is NULL, but the model has %d dynamic dim%s", tgm_info.ndyn,
                    tgm_info.ndyn == 1 ? "" : "s");
  if ((tgm_info.ninputs && !in) || !out)
    return tgm_fail(m, TGM_EINVAL, "forward: %s is NULL", out ? "inputs" : "outputs");
  for (int k = 0; k < tgm_info.ninputs; k++)
    if (!in[k])
      return tgm_fail(m, TGM_EINVAL, "forward: input '%s' is NULL", tgm_info.inputs[k].name);
  for (int k = 0; k < tgm_info.noutputs; k++)
    if (!out[k])
      return tgm_fail(m, TGM_EINVAL, "forward: output '%s' is NULL", tgm_info.outputs[k].name);
  int64_t sym[16] = {0};
  int rc = tgm_compute_syms(dims, sym, m->err, sizeof m->err);
  if (rc)
    return (tgm_status)rc;
  rc = ensure_ws(m, tgm_ws_bytes(sym));
  if (rc)
    return (tgm_status)rc;
  if (m->device == 0)
    return (tgm_status)tgm_forward_cpu(m, sym, in, out);
#ifdef TGM_HAVE_CUDA
  return (tgm_status)tgm_forward_cuda(m, sym, in, out);
#else
  return tgm_fail(m, TGM_EDEVICE, "no CUDA path in this build");
#endif
}
