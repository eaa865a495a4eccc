/* mlp_run: the mlp model from the command line, for scripting, training and
 * parity checks against other frameworks.
 *
 *   mlp_run [--device cpu|cuda|auto] [--params P | --checkpoint C | --seed N]
 *           [--inputs I.safetensors] [--dims B=4,T=64] [--out O.safetensors]
 *           [--grad] [--train-steps N] [--log-every K] [--eval-inputs E.safetensors]
 *           [--save-params P] [--save-checkpoint C] [--threads N]
 *
 * Device: cpu (default), cuda, or auto (cuda when the build has it and a GPU
 * answers, else cpu). Params: loaded from --params (a params file or a checkpoint), from a
 * training checkpoint with its optimizer state (--checkpoint), or initialised
 * from --seed (default: the spec's seed). Inputs: tensor names = input names;
 * without --inputs a fixed pseudo-random fill. Dynamic dims come from --dims,
 * else from the input shapes, else 1. Several batches: when every input's
 * first dim is the same dynamic dim, --dims gives it, and the file's is N
 * times that, the file holds N batches; --train-steps trains step s on
 * batch s mod N (the others use the first). --threads N: the CPU's OpenMP threads
 * (mlp_set_threads; default 0, OpenMP's own: OMP_NUM_THREADS, else a core each).
 *
 * What runs:
 *   default          the forward pass; --out gets the outputs by name
 *   --grad           loss and gradients; --out gets the loss under its name,
 *                    every gradient as grad.<param checkpoint name> (and, for
 *                    the inputs the spec's train.wrt lists, grad.<input>) and the
 *                    forward pass's outputs by name (dropout off; an output
 *                    named like the loss is written once, as the loss)
 *   --train-steps N  N training steps on the inputs; --out gets the updated
 *                    params by name and the per-step losses as `losses` [N];
 *                    progress every --log-every steps (default: about 10 lines)
 *   --eval-inputs E  after training (or alone): the loss on E and, when the
 *                    loss is cross_entropy of an output against an input, the
 *                    accuracy of the argmax
 * Errors go to stderr with exit status 1. */
#include "mlp_io.h"

#include <errno.h>
#include <time.h>
#include <unistd.h>

static int die_(const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "mlp_run: ");
  fprintf(stderr, fmt, a, b);
  fputc('\n', stderr);
  return 1;
}

/* An output file's directory must exist and be writable before any work
 * starts (not found out after an hour of training). */
static int check_writable(const char *opt, const char *path) {
  if (!path)
    return 0;
  const char *slash = strrchr(path, '/');
  char dir[4096];
  if (!slash)
    strcpy(dir, ".");
  else
    snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
  if (access(dir, W_OK))
    return fprintf(stderr, "mlp_run: %s %s: cannot write into %s: %s\n", opt, path, dir, strerror(errno)), 1;
  return 0;
}

static const char *usage =
    "usage: mlp_run [--device cpu|cuda|auto] [--params P | --checkpoint C | --seed N]\n"
    "               [--inputs I.safetensors] [--dims B=4,T=64] [--out O.safetensors]\n"
    "               [--grad] [--train-steps N] [--log-every K] [--eval-inputs E.safetensors]\n"
    "               [--save-params P] [--save-checkpoint C] [--threads N]\n";

/* A batch: the inputs of one file (or the fill), on the device. The file
 * may hold several batches along the inputs' first dim (a dynamic dim that
 * --dims gives: N of them when that dim is N times the value; step s of
 * --train-steps trains on batch s mod N); a rank of a data-parallel run
 * takes its part of each (the r-th of nranks equal parts of its rows). */
typedef struct batch {
  int64_t dyn[16], sym[16];  /* the dims of one call */
  mlp_host in[64];           /* every batch, on the host */
  void *din[64];             /* and on the device */
  const void *cur[64];       /* the inputs of the call (batch_at) */
  int64_t row[64];           /* bytes of one row of each input's first dim (0: no such dim) */
  int64_t rows, nb;          /* a batch's rows (its first dim) and the number of batches */
  int part, parts;           /* this rank's part of each batch, of parts */
  mlp_st_file f;
  int have_file;
} batch;

/* The inputs of step s: its batch, this rank's part. */
static const void *const *batch_at(batch *b, long long s) {
  int64_t r0 = (s % b->nb) * b->rows + b->part * (b->rows / b->parts);
  for (int k = 0; k < mlp_info.ninputs; k++)
    b->cur[k] = (const unsigned char *)b->din[k] + r0 * b->row[k];
  return b->cur;
}

/* dims from --dims (given[]) and the shapes of the file's inputs */
static int load_batch(mlp_model *m, const char *path, const char *dims, batch *b) {
  int given[16] = {0};
  char err[512];
  memset(b, 0, sizeof *b);
  if (mlp_parse_dims(dims, b->dyn, given, err, sizeof err))
    return die_("%s%s", err, "");
  if (path) {
    if (mlp_st_read(path, &b->f, err, sizeof err))
      return die_("%s%s", err, "");
    b->have_file = 1;
    for (int k = 0; k < mlp_info.ninputs; k++) {
      const mlp_tensor_desc *t = mlp_st_find(&b->f, mlp_info.inputs[k].name);
      if (!t)
        return die_("%s: input '%s' is missing", path, mlp_info.inputs[k].name);
      if (t->rank != mlp_info.inputs[k].rank) {
        fprintf(stderr, "mlp_run: %s: input '%s': rank %d, expected %d\n", path, mlp_info.inputs[k].name, t->rank,
                mlp_info.inputs[k].rank);
        return 1;
      }
      for (int j = 0; j < t->rank; j++)
        for (int s = 0; s < mlp_info.ndyn; s++)
          if (!strcmp(mlp_input_dim_text[k][j], mlp_info.sym_names[s]) && !given[s]) {
            if (t->shape[j] > mlp_info.dyn_max[s] || t->shape[j] < 1) {
              fprintf(stderr, "mlp_run: %s: input '%s': dim %d is %lld, %s %lld (%s)\n", path, mlp_info.inputs[k].name,
                      j, (long long)t->shape[j], t->shape[j] < 1 ? "below" : "above max",
                      (long long)(t->shape[j] < 1 ? 1 : mlp_info.dyn_max[s]), mlp_info.sym_names[s]);
              return 1;
            }
            b->dyn[s] = t->shape[j];
            given[s] = 1;
          }
    }
  }
  for (int s = 0; s < mlp_info.ndyn; s++)
    if (!given[s])
      b->dyn[s] = 1;
  /* several batches in the file: its first dim a multiple of the one --dims gives */
  int batch = mlp_batch_dim();
  b->nb = 1, b->part = 0, b->parts = 1;
  b->rows = batch >= 0 ? b->dyn[batch] : 1;
  if (path && batch >= 0) {
    int64_t n = mlp_st_find(&b->f, mlp_info.inputs[0].name)->shape[0];
    if (n != b->rows && n % b->rows == 0)
      b->nb = n / b->rows;
  }
  if (mlp_compute_syms(b->dyn, b->sym, err, sizeof err))
    return die_("%s%s", err, "");
  for (int k = 0; k < mlp_info.ninputs; k++) {
    mlp_host *h = &b->in[k];
    if (mlp_host_alloc(h, 0, k, b->sym))
      return die_("out of memory%s%s", "", "");
    if (b->nb > 1) { /* every batch, along the first dim */
      free(h->data);
      h->shape[0] *= b->nb;
      h->numel *= b->nb;
      if (!(h->data = calloc((size_t)h->numel + 1, (size_t)mlp_dtype_sizes[h->dtype])))
        return die_("out of memory%s%s", "", "");
    }
    if (path) {
      const mlp_tensor_desc *t = mlp_st_find(&b->f, mlp_info.inputs[k].name);
      if (t->dtype != h->dtype) {
        fprintf(stderr, "mlp_run: %s: input '%s': dtype %s, expected %s\n", path, mlp_info.inputs[k].name,
                mlp_dtype_names[t->dtype], mlp_dtype_names[h->dtype]);
        return 1;
      }
      for (int j = 0; j < t->rank; j++)
        if (t->shape[j] != h->shape[j]) {
          if (j == 0 && batch >= 0 && b->nb == 1 && t->shape[0] > b->rows)
            fprintf(stderr, "mlp_run: %s: input '%s': dim 0 is %lld, neither %s = %lld nor a multiple of it (several "
                    "batches)\n", path, mlp_info.inputs[k].name, (long long)t->shape[0], mlp_input_dim_text[k][0],
                    (long long)b->rows);
          else
            fprintf(stderr, "mlp_run: %s: input '%s': dim %d is %lld, expected %lld (%s)\n", path,
                    mlp_info.inputs[k].name, j, (long long)t->shape[j], (long long)h->shape[j],
                    mlp_input_dim_text[k][j]);
          return 1;
        }
      memcpy(h->data, t->data, (size_t)h->numel * (size_t)mlp_dtype_sizes[h->dtype]);
    } else {
      mlp_host_fill(h, mlp_info.inputs[k].name);
    }
    if (mlp_to_device(m, h, &b->din[k]))
      return die_("copying input '%s' to the device%s", mlp_info.inputs[k].name, "");
    b->row[k] = batch >= 0 ? h->numel / h->shape[0] * mlp_dtype_sizes[h->dtype] : 0;
  }
  if (batch >= 0) { /* the dims of one call: a batch, this rank's part of it */
    b->dyn[batch] = b->rows / b->parts;
    if (mlp_compute_syms(b->dyn, b->sym, err, sizeof err))
      return die_("%s%s", err, "");
  }
  batch_at(b, 0);
  return 0;
}

static void free_batch(mlp_model *m, batch *b) {
  for (int k = 0; k < mlp_info.ninputs; k++) {
    if (b->din[k] != b->in[k].data)
      mlp_device_free(m, b->din[k]);
    free(b->in[k].data);
  }
  if (b->have_file)
    mlp_st_free(&b->f);
}

/* The forward pass on b: outputs into out[] (host), allocated here. */
static int forward(mlp_model *m, batch *b, mlp_host *out) {
  void *dout[64];
  for (int k = 0; k < mlp_info.noutputs; k++)
    if (mlp_host_alloc(&out[k], 1, k, b->sym) || mlp_to_device(m, &out[k], &dout[k]))
      return die_("allocating output '%s'%s", mlp_info.outputs[k].name, "");
  int rc = mlp_forward_v(m, b->dyn, b->cur, dout);
  if (!rc)
    rc = mlp_sync(m); /* what the device found (an index out of range) */
  for (int k = 0; k < mlp_info.noutputs; k++) {
    if (!rc && mlp_from_device(m, &out[k], dout[k]))
      rc = die_("copying output '%s' back%s", mlp_info.outputs[k].name, "");
    if (dout[k] != out[k].data)
      mlp_device_free(m, dout[k]);
  }
  if (rc)
    return die_("%s%s", mlp_error(m), "");
  return 0;
}

static void describe(const char *name, const mlp_host *h) {
  double s = 0;
  for (int64_t i = 0; i < h->numel; i++)
    s += fabs(mlp_get(h->data, h->dtype, i));
  printf("%s: %s[", name, mlp_dtype_names[h->dtype]);
  for (int j = 0; j < h->rank; j++)
    printf("%s%lld", j ? ", " : "", (long long)h->shape[j]);
  printf("] mean |x| %.6g\n", h->numel ? s / (double)h->numel : 0.0);
}

/* The loss on b's first batch and, when the model has a classification
 * metric, the accuracy. */
static int evaluate(mlp_model *m, batch *b, const char *what) {
  float loss;
  if (mlp_loss_v(m, b->dyn, batch_at(b, 0), &loss))
    return die_("%s%s", mlp_error(m), "");
  printf("%s: %s %.6f", what, mlp_info.loss_name, loss);
  if (mlp_info.metric_output >= 0) {
    mlp_host out[64];
    if (forward(m, b, out))
      return 1;
    const mlp_host *lg = &out[mlp_info.metric_output];
    const int32_t *y = (const int32_t *)((const unsigned char *)b->in[mlp_info.metric_target].data +
                                         b->part * (b->rows / b->parts) * b->row[mlp_info.metric_target]);
    int64_t rows = lg->shape[0], C = lg->shape[1], right = 0, counted = 0;
    for (int64_t r = 0; r < rows; r++) {
      int64_t best = 0;
      for (int64_t j = 1; j < C; j++)
        if (mlp_get(lg->data, lg->dtype, r * C + j) > mlp_get(lg->data, lg->dtype, r * C + best))
          best = j;
      int32_t t = y[r];
      if (t < 0 || t >= C)
        continue; /* ignored rows */
      counted++;
      right += best == t;
    }
    printf(", accuracy %.2f%% (%lld of %lld)", counted ? 100.0 * (double)right / (double)counted : 0.0,
           (long long)right, (long long)counted);
    for (int k = 0; k < mlp_info.noutputs; k++)
      free(out[k].data);
  }
  printf("\n");
  return 0;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int parse_count(const char *opt, const char *v, long long *out) {
  char *end;
  errno = 0;
  *out = strtoll(v, &end, 10);
  if (*end || end == v || errno || *out < 0)
    return die_("%s: '%s' is not a non-negative integer", opt, v);
  return 0;
}

int main(int argc, char **argv) {
  const char *device = "cpu", *params = NULL, *ckpt = NULL, *save = NULL, *save_ckpt = NULL, *inputs = NULL,
             *outp = NULL, *dims = NULL, *eval = NULL;
  unsigned long long seed = mlp_info.seed;
  long long train = -1, log_every = 0, threads = 0;
  int have_seed = 0, grad = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(usage, stdout);
      return 0;
    }
    if (!strcmp(a, "--grad")) {
      grad = 1;
      continue;
    }
    if (i + 1 >= argc)
      return die_("%s: missing value (or unknown option)\n%s", a, usage);
    const char *v = argv[++i];
    long long n;
    if (!strcmp(a, "--device")) device = v;
    else if (!strcmp(a, "--params")) params = v;
    else if (!strcmp(a, "--checkpoint")) ckpt = v;
    else if (!strcmp(a, "--save-params")) save = v;
    else if (!strcmp(a, "--save-checkpoint")) save_ckpt = v;
    else if (!strcmp(a, "--inputs")) inputs = v;
    else if (!strcmp(a, "--eval-inputs")) eval = v;
    else if (!strcmp(a, "--out")) outp = v;
    else if (!strcmp(a, "--dims")) dims = v;
    else if (!strcmp(a, "--train-steps")) {
      if (parse_count(a, v, &train))
        return 1;
    } else if (!strcmp(a, "--log-every")) {
      if (parse_count(a, v, &log_every))
        return 1;
    } else if (!strcmp(a, "--threads")) {
      if (parse_count(a, v, &threads))
        return 1;
      if (threads > MLP_MAX_THREADS)
        return fprintf(stderr, "mlp_run: --threads: %lld is above %d\n", threads, MLP_MAX_THREADS), 1;
    } else if (!strcmp(a, "--seed")) {
      if (parse_count(a, v, &n))
        return 1;
      seed = (unsigned long long)n;
      have_seed = 1;
    } else
      return die_("unknown option '%s'\n%s", a, usage);
  }
  if ((params != NULL) + (ckpt != NULL) + have_seed > 1)
    return die_("give one of --params, --checkpoint and --seed%s%s", "", "");
  if (grad && train >= 0)
    return die_("give --grad or --train-steps, not both%s%s", "", "");
  if ((grad || train >= 0 || eval || ckpt || save_ckpt) && !mlp_info.loss_name)
    return die_("model %s has no train: section, so no --grad, --train-steps, --eval-inputs or checkpoints%s",
                mlp_info.name, "");

  if (check_writable("--save-params", save) || check_writable("--save-checkpoint", save_ckpt) ||
      check_writable("--out", outp))
    return 1;

  char err[512];
  mlp_model *m;
  if (!strcmp(device, "auto")) { /* CUDA when this build has it and a GPU answers, else the CPU */
    device = mlp_create("cuda", &m, err, sizeof err) ? "cpu" : "cuda";
    if (!strcmp(device, "cuda"))
      mlp_destroy(m);
    printf("device: %s\n", device);
  }
  if (mlp_create(device, &m, err, sizeof err))
    return die_("%s%s", err, "");
  if (mlp_set_threads(m, (int)threads))
    return die_("%s%s", mlp_error(m), "");
  int rc = ckpt ? mlp_load_checkpoint(m, ckpt) : params ? mlp_load_params(m, params) : mlp_init_params(m, seed);
  if (rc)
    return die_("%s%s", mlp_error(m), "");

  batch b;
  if ((inputs || !eval || train >= 0 || grad) && load_batch(m, inputs, dims, &b))
    return 1;
  int have_batch = inputs || !eval || train >= 0 || grad;
  /* what --out writes: the loss, every gradient (params and wrt inputs) and output, or the params and losses */
  mlp_tensor_desc *t = calloc((size_t)(mlp_info.nparams + mlp_info.nwrt + mlp_info.noutputs + 2), sizeof *t);
  char(*names)[300] = calloc((size_t)(mlp_info.nparams + mlp_info.nwrt + 1), sizeof *names);
  int nt = 0;
  if (!t || !names)
    return die_("out of memory%s%s", "", "");
  mlp_host out[64];
  unsigned char *gbuf = NULL;
  float loss = 0, *losses = NULL;
  mlp_host ig[64]; /* train.wrt: the inputs' gradients (--grad) */
  void *dig[64];
  memset(ig, 0, sizeof ig);

  if (grad) {
    size_t pb = mlp_param_bytes();
    gbuf = malloc(pb ? pb : 1);
    if (!gbuf)
      return die_("out of memory%s%s", "", "");
    for (int j = 0; j < mlp_info.nwrt; j++)
      if (mlp_host_alloc(&ig[j], 0, mlp_info.wrt[j], b.sym) || mlp_to_device(m, &ig[j], &dig[j]))
        return die_("allocating the gradient of input '%s'%s", mlp_info.inputs[mlp_info.wrt[j]].name, "");
    if ((mlp_info.nwrt ? mlp_forward_backward_wrt_v(m, b.dyn, b.cur, dig, &loss)
                       : mlp_forward_backward_v(m, b.dyn, b.cur, &loss)) ||
        mlp_get_grads(m, gbuf, pb))
      return die_("%s%s", mlp_error(m), "");
    printf("%s: %.7g\n", mlp_info.loss_name, loss);
    t[nt++] = (mlp_tensor_desc){mlp_info.loss_name, MLP_F32, 0, {0}, &loss};
    for (int k = 0; k < mlp_info.nparams; k++) {
      const mlp_param_info *p = &mlp_info.params[k];
      snprintf(names[k], sizeof names[k], "grad.%s", p->ckpt);
      t[nt] = (mlp_tensor_desc){names[k], p->dtype, p->rank, {0}, gbuf + p->offset};
      memcpy(t[nt++].shape, p->shape, sizeof p->shape);
      double ss = 0;
      for (int64_t i = 0; i < p->numel; i++)
        ss += mlp_get(gbuf + p->offset, p->dtype, i) * mlp_get(gbuf + p->offset, p->dtype, i);
      printf("  grad.%s: norm %.6g\n", p->ckpt, sqrt(ss));
    }
    for (int j = 0; j < mlp_info.nwrt; j++) {
      const char *name = mlp_info.inputs[mlp_info.wrt[j]].name;
      mlp_host *h = &ig[j];
      if (mlp_from_device(m, h, dig[j]))
        return die_("copying the gradient of input '%s' back%s", name, "");
      if (dig[j] != h->data)
        mlp_device_free(m, dig[j]);
      snprintf(names[mlp_info.nparams + j], sizeof names[0], "grad.%s", name);
      t[nt] = (mlp_tensor_desc){names[mlp_info.nparams + j], h->dtype, h->rank, {0}, h->data};
      memcpy(t[nt++].shape, h->shape, sizeof h->shape);
      double ss = 0;
      for (int64_t i = 0; i < h->numel; i++)
        ss += mlp_get(h->data, h->dtype, i) * mlp_get(h->data, h->dtype, i);
      printf("  grad.%s: norm %.6g\n", name, sqrt(ss));
    }
    if (forward(m, &b, out))
      return 1;
    for (int k = 0; k < mlp_info.noutputs; k++) {
      if (strcmp(mlp_info.outputs[k].name, mlp_info.loss_name)) {
        t[nt] = (mlp_tensor_desc){mlp_info.outputs[k].name, out[k].dtype, out[k].rank, {0}, out[k].data};
        memcpy(t[nt++].shape, out[k].shape, sizeof t[0].shape);
      }
      describe(mlp_info.outputs[k].name, &out[k]);
    }
  } else if (train >= 0) {
    losses = calloc((size_t)train + 1, sizeof(float));
    if (!losses)
      return die_("out of memory%s%s", "", "");
    long long every = log_every ? log_every : train > 10 ? train / 10 : 1;
    double t0 = now();
    for (long long s = 0; s < train; s++) {
      if (mlp_train_step_v(m, b.dyn, batch_at(&b, s), &losses[s]))
        return die_("%s%s", mlp_error(m), "");
      if ((s + 1) % every == 0 || s + 1 == train) {
        double dt = now() - t0;
        printf("step %5lld/%lld  %s %.6f  (%.1f ms/step)\n", s + 1, train, mlp_info.loss_name, losses[s],
               1e3 * dt / (double)(s + 1));
        fflush(stdout);
      }
    }
    size_t pb = mlp_param_bytes();
    gbuf = malloc(pb ? pb : 1);
    if (!gbuf || mlp_get_params(m, gbuf, pb))
      return die_("%s%s", gbuf ? mlp_error(m) : "out of memory", "");
    for (int k = 0; k < mlp_info.nparams; k++) {
      const mlp_param_info *p = &mlp_info.params[k];
      t[nt] = (mlp_tensor_desc){p->ckpt, p->dtype, p->rank, {0}, gbuf + p->offset};
      memcpy(t[nt++].shape, p->shape, sizeof p->shape);
    }
    t[nt++] = (mlp_tensor_desc){"losses", MLP_F32, 1, {train}, losses};
  } else if (have_batch) {
    if (forward(m, &b, out))
      return 1;
    for (int k = 0; k < mlp_info.noutputs; k++) {
      t[nt] = (mlp_tensor_desc){mlp_info.outputs[k].name, out[k].dtype, out[k].rank, {0}, out[k].data};
      memcpy(t[nt++].shape, out[k].shape, sizeof t[0].shape);
      describe(mlp_info.outputs[k].name, &out[k]);
    }
  }
  if (outp && nt && mlp_st_write(outp, t, nt, err, sizeof err))
    return die_("%s%s", err, "");
  if (save && mlp_save_params(m, save))
    return die_("%s%s", mlp_error(m), "");
  if (save_ckpt && mlp_save_checkpoint(m, save_ckpt))
    return die_("%s%s", mlp_error(m), "");
  if (train >= 0 && evaluate(m, &b, "train"))
    return 1;
  if (eval) {
    batch e;
    if (load_batch(m, eval, NULL, &e) || evaluate(m, &e, "held-out"))
      return 1;
    free_batch(m, &e);
  }
  if (have_batch)
    free_batch(m, &b);
  if (train < 0 && have_batch)
    for (int k = 0; k < mlp_info.noutputs; k++)
      free(out[k].data);
  for (int j = 0; j < mlp_info.nwrt; j++)
    free(ig[j].data);
  free(gbuf);
  free(losses);
  free(t);
  free(names);
  mlp_destroy(m);
  return 0;
}
