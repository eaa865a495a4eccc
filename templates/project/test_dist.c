/* tgm_test_dist: data-parallel training (projects generated with
 * --distributed nccl), from the golden vectors' params (the seed) and
 * inputs (tests/golden.safetensors).
 *
 *   tgm_test_dist cpu GOLDEN DIR
 *       The sharded optimizer's arithmetic on the CPU: 3 ranks simulated in
 *       one process (tgm_dist_simulate: each keeps and updates only its
 *       slice of the optimizer state and exchanges nothing; every rank sees
 *       the whole batch, so its gradient is the whole gradient; after each
 *       step the test copies each rank's slice of the params into the
 *       others', as the GPUs' broadcast does). Each rank's losses equal the
 *       unsharded model's bit for bit, and so do the params after 3 steps;
 *       the same after resuming every rank from an unsharded checkpoint
 *       written after step 1. Bad calls are refused.
 *
 *   tgm_test_dist cuda GOLDEN DIR [N]
 *       N ranks (default 2) on GPUs 0..N-1 through NCCL, one process each
 *       (forked before CUDA starts; exit 77 with fewer GPUs). Rank q trains
 *       on shard q of a global batch of N shards (shard q: the golden inputs
 *       with floats scaled by 1 + q/8 and integers rotated by q places).
 *       Checked afterwards on GPU 0 against one model without ranks:
 *       1. forward_backward: the loss and every gradient equal the average
 *          over q of the single-GPU loss and gradient of shard q;
 *       2. after every train_step all ranks hold the same params bit for
 *          bit, and report the same losses;
 *       3. when every input's first dim is the same dynamic dim and the
 *          model's loss is a mean over it (the whole batch's loss and
 *          gradient equal the shards' average), the losses of 3 steps and
 *          the params' updates equal those of the single GPU trained on the
 *          whole batch (within the dtype's rounding), and the checkpoint
 *          the ranks saved after step 2 (rank 0 writes it) holds the same
 *          optimizer state as the single GPU's after step 2; loaded into the
 *          single GPU, it continues with the ranks' step 3.
 * Exit: 0 pass, 1 fail, 77 skipped. */
#include "tgm_io.h"

#include <stdarg.h>
#ifdef TGM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define STEPS 3
#define SIM_RANKS 3

static int fails;

static void check(int ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s ", ok ? "ok  " : "FAIL");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fails += !ok;
}

static int steps(tgm_model *m, const int64_t *dyn, void *const *din, int n, float *l) {
  for (int i = 0; i < n; i++)
    if (tgm_train_step_v(m, dyn, (const void *const *)din, &l[i])) {
      fprintf(stderr, "FAIL: train_step: %s\n", tgm_error(m));
      return -1;
    }
  return 0;
}

/* The bytes of the params buffer in rank r's slice of the state, from src into dst. */
static void copy_slice(int r, int nranks, const unsigned char *src, unsigned char *dst) {
  int64_t lo, hi;
  tgm_shard(tgm_info.state_elems, nranks, r, &lo, &hi);
  for (int i = 0; i < tgm_info.nruns; i++) {
    const tgm_param_run *u = &tgm_info.runs[i];
    int64_t a = u->f > lo ? u->f : lo, b = u->f + u->n < hi ? u->f + u->n : hi, sz = tgm_dtype_sizes[u->dt];
    if (b > a)
      memcpy(dst + u->b0 + (a - u->f) * sz, src + u->b0 + (a - u->f) * sz, (size_t)((b - a) * sz));
  }
}

/* ---------------------------------------------------------------- cpu: simulated ranks */

static int cpu_test(const char *golden, const char *dir) {
  char err[512], ckpt[4096];
  snprintf(ckpt, sizeof ckpt, "%s/dist_cpu_ckpt.safetensors", dir);
  size_t pb = tgm_param_bytes();
  unsigned char *want = calloc(1, pb + 1), *got = calloc(1, pb + 1), *p = calloc(1, pb + 1), *prev = calloc(1, pb + 1);
  tgm_model *ref, *rk[SIM_RANKS];
  tgm_case c;
  if (!want || !got || !p || !prev || tgm_create("cpu", &ref, err, sizeof err) || tgm_case_open(ref, golden, &c, err, sizeof err))
    return fprintf(stderr, "FAIL: setup: %s\n", err), 1;
  float lref[STEPS], l[STEPS];
  if (steps(ref, c.dyn, c.din, 1, lref) || tgm_save_checkpoint(ref, ckpt) || steps(ref, c.dyn, c.din, STEPS - 1, lref + 1) ||
      tgm_get_params(ref, want, pb))
    return fprintf(stderr, "FAIL: the unsharded model: %s\n", tgm_error(ref)), 1;
  for (int resume = 0; resume < 2; resume++) {
    int n = resume ? STEPS - 1 : STEPS, same = 1, own = 1;
    int64_t kept = 0;
    for (int r = 0; r < SIM_RANKS; r++) {
      if (tgm_create("cpu", &rk[r], err, sizeof err) || tgm_init_params(rk[r], c.seed) ||
          tgm_dist_simulate(rk[r], r, SIM_RANKS) || (resume && tgm_load_checkpoint(rk[r], ckpt)))
        return fprintf(stderr, "FAIL: simulated rank %d: %s\n", r, rk[r] ? tgm_error(rk[r]) : err), 1;
      own &= rk[r]->state_lo == kept && rk[r]->state_hi > rk[r]->state_lo;
      kept = rk[r]->state_hi;
    }
    check(own && kept == tgm_info.state_elems, "the %d ranks keep consecutive slices of the %lld state elements",
          SIM_RANKS, (long long)tgm_info.state_elems);
    for (int i = 0; i < n; i++) {
      memcpy(prev, rk[0]->params, pb); /* every rank's params before the step */
      for (int r = 0; r < SIM_RANKS; r++) {
        memcpy(p, prev, pb);
        if (steps(rk[r], c.dyn, c.din, 1, l))
          return 1;
        same &= l[0] == lref[STEPS - n + i];
        copy_slice(r, SIM_RANKS, rk[r]->params, p); /* the slice this rank updated */
        own &= !memcmp(p, rk[r]->params, pb);         /* and nothing else */
        copy_slice(r, SIM_RANKS, rk[r]->params, got);
      }
      for (int r = 0; r < SIM_RANKS; r++) /* every rank's slice to every rank */
        memcpy(rk[r]->params, got, pb);
    }
    check(same, "%s: %d ranks' %d losses equal the unsharded model's bit for bit",
          resume ? "resumed from step 1" : "from the seed", SIM_RANKS, n);
    check(own, "%s: each rank updates its slice of the params and nothing else",
          resume ? "resumed from step 1" : "from the seed");
    check(!tgm_get_params(rk[0], p, pb) && !memcmp(p, want, pb),
          "%s: the params updated slice by slice equal the unsharded model's bit for bit",
          resume ? "resumed from step 1" : "from the seed");
    if (resume) {
      check(tgm_save_checkpoint(rk[0], ckpt) == TGM_EINVAL && strstr(tgm_error(rk[0]), "slice"),
            "save_checkpoint on a simulated rank is refused: %s", tgm_error(rk[0]));
      check(tgm_dist_simulate(rk[1], 0, 2) == TGM_EINVAL && strstr(tgm_error(rk[1]), "already"),
            "a second dist_simulate is refused: %s", tgm_error(rk[1]));
    }
    for (int r = 0; r < SIM_RANKS; r++)
      tgm_destroy(rk[r]);
  }
  tgm_model *m;
  if (tgm_create("cpu", &m, err, sizeof err))
    return fprintf(stderr, "FAIL: create: %s\n", err), 1;
  check(tgm_dist_simulate(m, 3, 3) == TGM_EINVAL && strstr(tgm_error(m), "rank 3 of 3"), "rank 3 of 3 is refused: %s",
        tgm_error(m));
  check(tgm_dist_init(m, 0, 2, "file:x") == TGM_EINVAL && strstr(tgm_error(m), "cuda"),
        "dist_init on the cpu is refused: %s", tgm_error(m));
  check(steps(m, c.dyn, c.din, 1, l) == 0 && tgm_dist_simulate(m, 0, 2) == TGM_EINVAL &&
            strstr(tgm_error(m), "before the first training call"),
        "dist_simulate after training is refused: %s", tgm_error(m));
  tgm_destroy(m);
  remove(ckpt);
  tgm_case_close(ref, &c);
  tgm_destroy(ref);
  free(want), free(got), free(p), free(prev);
  printf("%s\n", fails ? "FAILED" : "all passed");
  return fails ? 1 : 0;
}

/* ---------------------------------------------------------------- cuda: N ranks */

/* Shard q of the global batch from the golden inputs: floats scaled by 1 + q/8, integers rotated by q places. */
static void make_shard(const tgm_case *c, int q, tgm_host *out) {
  for (int k = 0; k < tgm_info.ninputs; k++) {
    const tgm_host *h = &c->in[k];
    tgm_host *o = &out[k];
    *o = *h;
    o->data = calloc((size_t)h->numel + 1, (size_t)tgm_dtype_sizes[h->dtype]);
    for (int64_t i = 0; o->data && i < h->numel; i++) {
      if (h->dtype <= TGM_F16)
        tgm_put(o->data, h->dtype, i, tgm_get(h->data, h->dtype, i) * (1.0 + q / 8.0));
      else
        tgm_put(o->data, h->dtype, i, tgm_get(h->data, h->dtype, (i + q) % h->numel));
    }
  }
}

/* What each rank writes to DIR/dist_rank<r>.bin. */
typedef struct rank_result {
  float fb_loss, losses[STEPS];
  unsigned char *grads, *params2, *params3; /* after forward_backward; after steps 2 and 3 */
} rank_result;

static int result_io(const char *path, rank_result *r, size_t pb, int write) {
  FILE *f = fopen(path, write ? "wb" : "rb");
  if (!f)
    return -1;
  size_t ok = write ? fwrite(&r->fb_loss, sizeof(float), 1 + STEPS, f) : fread(&r->fb_loss, sizeof(float), 1 + STEPS, f);
  unsigned char *b[3] = {r->grads, r->params2, r->params3};
  for (int i = 0; i < 3; i++)
    ok += write ? fwrite(b[i], 1, pb, f) : fread(b[i], 1, pb, f);
  return (fclose(f) == 0 && ok == 1 + STEPS + 3 * pb) ? 0 : -1;
}

static int alloc_result(rank_result *r, size_t pb) {
  memset(r, 0, sizeof *r);
  r->grads = calloc(1, pb + 1), r->params2 = calloc(1, pb + 1), r->params3 = calloc(1, pb + 1);
  return r->grads && r->params2 && r->params3 ? 0 : -1;
}

static void free_result(rank_result *r) { free(r->grads), free(r->params2), free(r->params3); }

static int upload(tgm_model *m, const tgm_host *h, void **din) {
  for (int k = 0; k < tgm_info.ninputs; k++)
    if (tgm_to_device(m, &h[k], &din[k]))
      return -1;
  return 0;
}

/* Rank r of n: train on shard r, write what it saw. */
static int rank_main(const char *golden, const char *dir, const char *rdv, int r, int n) {
#ifdef TGM_HAVE_CUDA
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < n)
    return 77;
#endif
  char err[512], dev[32], path[4200];
  snprintf(dev, sizeof dev, "cuda:%d", r);
  size_t pb = tgm_param_bytes();
  tgm_model *m;
  tgm_case c;
  tgm_host sh[64];
  void *din[64];
  rank_result res;
  if (tgm_create(dev, &m, err, sizeof err))
    return fprintf(stderr, "rank %d: %s\n", r, err), strstr(err, "no CUDA") ? 77 : 1;
  if (tgm_case_open(m, golden, &c, err, sizeof err) || alloc_result(&res, pb))
    return fprintf(stderr, "FAIL: rank %d: setup: %s\n", r, err), 1;
  make_shard(&c, r, sh);
  if (upload(m, sh, din) || tgm_dist_init(m, r, n, rdv))
    return fprintf(stderr, "FAIL: rank %d: %s\n", r, tgm_error(m)), 1;
  snprintf(path, sizeof path, "%s/dist_ckpt.safetensors", dir);
  if (tgm_forward_backward_v(m, c.dyn, (const void *const *)din, &res.fb_loss) || tgm_get_grads(m, res.grads, pb) ||
      steps(m, c.dyn, din, 2, res.losses) || tgm_get_params(m, res.params2, pb) || tgm_save_checkpoint(m, path) ||
      steps(m, c.dyn, din, 1, res.losses + 2) || tgm_get_params(m, res.params3, pb))
    return fprintf(stderr, "FAIL: rank %d: %s\n", r, tgm_error(m)), 1;
  snprintf(path, sizeof path, "%s/dist_rank%d.bin", dir, r);
  if (result_io(path, &res, pb, 1))
    return fprintf(stderr, "FAIL: rank %d: cannot write %s\n", r, path), 1;
  tgm_destroy(m);
  return 0;
}

static double tolerance(int dt) { return dt == TGM_BF16 ? 2e-2 : dt == TGM_F16 ? 5e-3 : 1e-4; }

/* max over params of tgm_rel_err(got, want) / tolerance: <= 1 passes */
static double grads_err(const unsigned char *got, const double *want, size_t pb) {
  double worst = 0;
  for (int k = 0; k < tgm_info.nparams; k++) {
    const tgm_param_info *q = &tgm_info.params[k];
    float *w = malloc(sizeof(float) * (size_t)q->numel + 1);
    double maxref;
    int finite;
    for (int64_t i = 0; w && i < q->numel; i++)
      w[i] = (float)want[(q->offset / tgm_dtype_sizes[q->dtype]) + i];
    double e = w ? tgm_rel_err(got + q->offset, q->dtype, w, q->numel, &maxref, &finite) / tolerance(q->dtype) : 1e9;
    if (!finite)
      e = 1e9;
    worst = e > worst ? e : worst;
    free(w);
  }
  (void)pb;
  return worst;
}

/* ||(a1 - a0) - (b1 - b0)|| / ||b1 - b0|| over the params: how far two updates differ */
static double update_err(const unsigned char *a0, const unsigned char *a1, const unsigned char *b0,
                         const unsigned char *b1) {
  double d = 0, s = 0;
  for (int k = 0; k < tgm_info.nparams; k++) {
    const tgm_param_info *q = &tgm_info.params[k];
    for (int64_t i = 0; i < q->numel; i++) {
      double da = tgm_get(a1 + q->offset, q->dtype, i) - tgm_get(a0 + q->offset, q->dtype, i);
      double db = tgm_get(b1 + q->offset, q->dtype, i) - tgm_get(b0 + q->offset, q->dtype, i);
      d += (da - db) * (da - db), s += db * db;
    }
  }
  return sqrt(d / (s > 0 ? s : 1e-30));
}

static int cuda_test(const char *golden, const char *dir, int n) {
  char path[4200], err[512];
  char rdv[4200];
  int r0 = 0, rc = tgm_fork_ranks(n, &r0, rdv, sizeof rdv);
  if (rc < 0)
    _exit(rank_main(golden, dir, rdv, r0, n));
  int bad = rc == 1, skip = rc == 77;
  snprintf(path, sizeof path, "%s/dist_ckpt.safetensors", dir);
  if (bad || skip) {
    remove(path);
    if (!bad)
      printf("skipped: %d GPUs needed\n", n);
    return bad ? 1 : 77;
  }
  size_t pb = tgm_param_bytes();
  rank_result res[64];
  for (int r = 0; r < n; r++) {
    char rp[4200];
    snprintf(rp, sizeof rp, "%s/dist_rank%d.bin", dir, r);
    if (alloc_result(&res[r], pb) || result_io(rp, &res[r], pb, 0))
      return fprintf(stderr, "FAIL: reading %s\n", rp), 1;
    remove(rp);
  }
  for (int r = 1; r < n; r++)
    check(!memcmp(res[r].params3, res[0].params3, pb) && !memcmp(res[r].params2, res[0].params2, pb) &&
              !memcmp(res[r].losses, res[0].losses, sizeof res[0].losses) && res[r].fb_loss == res[0].fb_loss,
          "rank %d holds rank 0's params after steps 2 and 3 and reports its losses, bit for bit", r);

  /* the reference: one GPU, shard by shard */
  tgm_model *m;
  tgm_case c;
  tgm_host sh[64];
  void *din[64];
  double *avg = calloc(pb + 1, sizeof(double)), loss_avg = 0;
  unsigned char *g = calloc(1, pb + 1);
  if (!avg || !g || tgm_create("cuda:0", &m, err, sizeof err) || tgm_case_open(m, golden, &c, err, sizeof err))
    return fprintf(stderr, "FAIL: the reference: %s\n", err), 1;
  for (int q = 0; q < n; q++) {
    float l;
    make_shard(&c, q, sh);
    if (upload(m, sh, din) || tgm_forward_backward_v(m, c.dyn, (const void *const *)din, &l) || tgm_get_grads(m, g, pb))
      return fprintf(stderr, "FAIL: the reference on shard %d: %s\n", q, tgm_error(m)), 1;
    loss_avg += l / n;
    for (int k = 0; k < tgm_info.nparams; k++) {
      const tgm_param_info *p = &tgm_info.params[k];
      int64_t at = p->offset / tgm_dtype_sizes[p->dtype];
      for (int64_t i = 0; i < p->numel; i++)
        avg[at + i] += tgm_get(g + p->offset, p->dtype, i) / n;
    }
    for (int k = 0; k < tgm_info.ninputs; k++)
      tgm_device_free(m, din[k]), free(sh[k].data);
  }
  double lt = tolerance(tgm_info.loss_dtype);
  check(fabs(res[0].fb_loss - loss_avg) <= lt * fabs(loss_avg) + 1e-6,
        "forward_backward: the loss %.7g is the shards' average %.7g", res[0].fb_loss, loss_avg);
  double ge = grads_err(res[0].grads, avg, pb);
  check(ge <= 1, "forward_backward: every gradient is the shards' average (worst error %.3g of the tolerance)", ge);

  /* the whole batch on one GPU, when the loss is a mean over it */
  int s = tgm_batch_dim();
  if (s < 0 || c.dyn[s] * n > tgm_info.dyn_max[s]) {
    printf("skip the whole-batch comparison: %s\n",
           s < 0 ? "the inputs' first dims are not one dynamic dim" : "the whole batch is above the dim's max");
  } else {
    int64_t dyn[16];
    memcpy(dyn, c.dyn, sizeof dyn);
    dyn[s] *= n;
    tgm_host whole[64];
    for (int k = 0; k < tgm_info.ninputs; k++) {
      size_t sz = (size_t)c.in[k].numel * (size_t)tgm_dtype_sizes[c.in[k].dtype];
      whole[k] = c.in[k];
      whole[k].shape[0] *= n;
      whole[k].numel *= n;
      whole[k].data = malloc(sz * (size_t)n + 1);
    }
    for (int q = 0; q < n; q++) {
      make_shard(&c, q, sh);
      for (int k = 0; k < tgm_info.ninputs; k++) {
        size_t sz = (size_t)c.in[k].numel * (size_t)tgm_dtype_sizes[c.in[k].dtype];
        memcpy((unsigned char *)whole[k].data + sz * (size_t)q, sh[k].data, sz);
        free(sh[k].data);
      }
    }
    float lw, lws[STEPS];
    unsigned char *p0 = calloc(1, pb + 1), *p2 = calloc(1, pb + 1), *p3 = calloc(1, pb + 1);
    char refck[4200];
    snprintf(refck, sizeof refck, "%s/dist_ref_ckpt.safetensors", dir);
    if (!p0 || !p2 || !p3 || upload(m, whole, din) || tgm_init_params(m, c.seed) || tgm_get_params(m, p0, pb) ||
        tgm_forward_backward_v(m, dyn, (const void *const *)din, &lw) || tgm_get_grads(m, g, pb))
      return fprintf(stderr, "FAIL: the whole batch: %s\n", tgm_error(m)), 1;
    int mean = fabs(lw - loss_avg) <= lt * fabs(loss_avg) + 1e-6 && grads_err(g, avg, pb) <= 1;
    if (!mean) {
      printf("skip the whole-batch comparison: the whole batch's loss %.7g is not the shards' average %.7g (not a "
             "mean over the batch)\n", lw, loss_avg);
    } else {
      if (tgm_init_params(m, c.seed) || steps(m, dyn, din, 2, lws) || tgm_get_params(m, p2, pb) ||
          tgm_save_checkpoint(m, refck) || steps(m, dyn, din, 1, lws + 2) || tgm_get_params(m, p3, pb))
        return fprintf(stderr, "FAIL: the whole batch: %s\n", tgm_error(m)), 1;
      for (int i = 0; i < STEPS; i++)
        check(fabs(res[0].losses[i] - lws[i]) <= lt * fabs(lws[i]) + 1e-6,
              "step %d: the ranks' loss %.7g is the whole batch's %.7g", i + 1, res[0].losses[i], lws[i]);
      double ue = update_err(p0, res[0].params3, p0, p3);
      check(ue <= 0.05, "the params' update over %d steps is the whole batch's (relative difference %.3g)", STEPS, ue);
      /* the checkpoint: the same optimizer state as the single GPU's after step 2, and it resumes */
      tgm_st_file a, b;
      if (tgm_st_read(path, &a, err, sizeof err) || tgm_st_read(refck, &b, err, sizeof err))
        return fprintf(stderr, "FAIL: reading the checkpoints: %s\n", err), 1;
      /* per kind of state (master copies, first moments, second moments): ||ranks - one GPU|| / ||one GPU|| over
       * all its tensors (a norm, not an element's error: a gradient that is rounding noise, such as attention's
       * key bias's, has moments of noise in both) */
      static const char *const kinds[] = {"optim.master.", "optim.exp_avg.", "optim.exp_avg_sq.",
                                          "optim.momentum_buffer."};
      double d2[4] = {0}, s2[4] = {0}, worst = 0;
      int missing = 0;
      for (int i = 0; i < b.n; i++) {
        const tgm_tensor_desc *tb = &b.t[i], *ta = tgm_st_find(&a, tb->name);
        int kind = -1;
        for (int k = 0; k < 4 && kind < 0; k++)
          kind = !strncmp(tb->name, kinds[k], strlen(kinds[k])) ? k : -1;
        if (kind < 0)
          continue;
        int64_t ne = tgm_numel(tb->rank, tb->shape);
        if (!ta || ta->dtype != TGM_F32 || tgm_numel(ta->rank, ta->shape) != ne) {
          missing++;
          continue;
        }
        for (int64_t j = 0; j < ne; j++) {
          double x = ((const float *)ta->data)[j], y = ((const float *)tb->data)[j];
          missing += !isfinite(x);
          d2[kind] += (x - y) * (x - y), s2[kind] += y * y;
        }
      }
      for (int k = 0; k < 4; k++)
        if (s2[k] > 0 && sqrt(d2[k] / s2[k]) > worst)
          worst = sqrt(d2[k] / s2[k]);
      check(!missing && worst <= 0.05,
            "the ranks' checkpoint holds the whole batch's optimizer state after step 2 (relative difference %.3g)",
            worst);
      tgm_st_free(&a);
      tgm_st_free(&b);
      float l3;
      if (tgm_load_checkpoint(m, path) || steps(m, dyn, din, 1, &l3) || tgm_get_params(m, p3, pb))
        return fprintf(stderr, "FAIL: resuming on one GPU: %s\n", tgm_error(m)), 1;
      check(fabs(l3 - res[0].losses[2]) <= lt * fabs(l3) + 1e-6,
            "the checkpoint loaded on one GPU gives the ranks' step-3 loss (%.7g, ranks %.7g)", l3, res[0].losses[2]);
      ue = update_err(res[0].params2, p3, res[0].params2, res[0].params3);
      check(ue <= 0.05, "and the ranks' step-3 update (relative difference %.3g)", ue);
      remove(refck);
    }
    for (int k = 0; k < tgm_info.ninputs; k++)
      tgm_device_free(m, din[k]), free(whole[k].data);
    free(p0), free(p2), free(p3);
  }
  remove(path);
  tgm_case_close(m, &c);
  tgm_destroy(m);
  for (int r = 0; r < n; r++)
    free_result(&res[r]);
  free(avg), free(g);
  printf("%s\n", fails ? "FAILED" : "all passed");
  return fails ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc >= 4 && !strcmp(argv[1], "cpu"))
    return cpu_test(argv[2], argv[3]);
  if (argc >= 4 && !strcmp(argv[1], "cuda")) {
    int n = argc >= 5 ? atoi(argv[4]) : 2;
    if (n < 1 || n > 64)
      return fprintf(stderr, "tgm_test_dist: ranks must be 1..64, not %s\n", argv[4]), 2;
    return cuda_test(argv[2], argv[3], n);
  }
  fprintf(stderr, "usage: tgm_test_dist cpu GOLDEN DIR | cuda GOLDEN DIR [RANKS]\n");
  return 2;
}
