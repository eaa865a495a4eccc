/* main.c: the tgen command line. It reads as the pipeline: load the spec
 * (parse -> build -> infer), verify, then the command's own work. */
#include "ir.h"
#include "tgm_rt.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: tgen MODEL.yaml -o OUT [--targets cpu,cuda] [--cuda-arch ARCH] [--no-golden] [--no-fuse] [--test-dim N]\n"
    "                 [--remat min-cut|save-all|recompute-all] [--memory-budget BYTES] [--distributed nccl|none]\n"
    "       tgen check MODEL.yaml [--dump | --json] [--remat STRATEGY] [--memory-budget BYTES]\n"
    "       tgen explain MODEL.yaml [--dims B=4,T=64] [--json] [--no-fuse] [--remat STRATEGY]\n"
    "                 [--memory-budget BYTES] [--gpu h100|h200]\n"
    "       tgen eval MODEL.yaml [--dims B=4,T=64] [--seed N | --params P.safetensors] [--inputs I.safetensors]\n"
    "                 [--set NAME=v1,v2,...]... [--grad] [--out O.safetensors [--out-dtype f32|f64]] [--max N]\n"
    "       tgen --help | --version\n"
    "\n"
    "  MODEL.yaml -o OUT\n"
    "          print the model's C/CUDA project into directory OUT (written\n"
    "          atomically; in an existing OUT, which tgen must have made, only\n"
    "          tgen's files are replaced: build/ and other files of yours stay).\n"
    "          --targets and --cuda-arch override the spec's compile: section;\n"
    "          --test-dim sets the dynamic dims of the emitted tests (default 2);\n"
    "          --no-golden skips the golden vectors of the emitted tests;\n"
    "          --no-fuse prints one kernel per op (the baseline fusion is measured against);\n"
    "          --distributed nccl adds data-parallel training across GPUs through\n"
    "          NCCL (compile.distributed; the project then needs NCCL to build);\n"
    "          --remat and --memory-budget override compile.remat and\n"
    "          compile.memory_budget (BYTES: 1000000, 512MB, 2GiB or none)\n"
    "  check   validate a model spec and print a summary (dims, inputs, params,\n"
    "          ops, outputs; for a model with train:, the saved activations of\n"
    "          the training step at each dynamic dim's max, under --remat and\n"
    "          --memory-budget); --dump also prints the graph IR and the saved\n"
    "          tensors; --json prints the graph as JSON instead (for other tools)\n"
    "  explain for each pass (forward, loss, train), every kernel in order: its name,\n"
    "          kind, the spec lines it covers, bytes moved and FLOPs at --dims (default:\n"
    "          each dynamic dim's max), its floor time on the measured ceilings of\n"
    "          --gpu (default h100), why it stores each value and why the next kernel does not\n"
    "          fuse into it; then the pass's totals and arena. --json: the same as JSON\n"
    "  eval    run the model's forward pass in the double-precision reference\n"
    "          interpreter: params from the seed (the spec's by default), inputs\n"
    "          from --set (comma-separated values, row-major) or else a fixed\n"
    "          pseudo-random fill (floats in [-1, 1), integer inputs valid\n"
    "          indices for the ops that use them); prints\n"
    "          every output (at most --max values each, default 64).\n"
    "          --params / --inputs read the params (checkpoint names) and inputs\n"
    "          (input names) from safetensors files; --grad also runs the\n"
    "          backward (autodiff, dropout inactive) and shows the loss and\n"
    "          grad.<checkpoint name> of every param (and grad.<input> of the\n"
    "          inputs train.wrt lists); --out writes what would\n"
    "          be shown to a safetensors file (floating tensors as f32, or f64)\n"
    "\n"
    "Exit status: 0 success, 1 the spec (or an evaluation) was refused, 2 bad usage.\n";

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "tgen: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n%s", usage);
  return 2;
}

/* Load, build and verify MODEL; on refusal print the message and return NULL. */
static Graph *load(Arena *a, Diag *d, const char *path) {
  size_t len = 0;
  Diag fd = {0};
  fd.file = path;
  diag = &fd;
  fd.arena = a;
  if (setjmp(fd.jmp)) {
    diag = NULL;
    fputs(fd.msg, stderr);
    return NULL;
  }
  char *src = read_file(a, path, &len);
  diag = NULL;
  if (!src) {
    if (errno == EFBIG)
      fprintf(stderr, "%s: error: larger than %d MiB; a model spec is limited to that size\n", path,
              MAX_SPEC_BYTES >> 20);
    else if (errno == EISDIR)
      fprintf(stderr, "%s: error: is a directory; MODEL is the spec file (a .yaml)\n", path);
    else
      fprintf(stderr, "%s: error: cannot read: %s\n", path, strerror(errno));
    return NULL;
  }
  Graph *g = tgen_load(d, a, path, src, len);
  if (!g) {
    fputs(d->msg, stderr);
    return NULL;
  }
  verify(g);
  return g;
}

/* autodiff(g) with its size arithmetic's errors (an overflow) reported, not
 * aborted on: 0, or -1 with the message printed. */
static int differentiate(Graph *g, const char *path) {
  Diag d = {0};
  d.file = path;
  d.arena = g->arena;
  diag = &d;
  if (setjmp(d.jmp)) {
    diag = NULL;
    fputs(d.msg, stderr);
    return -1;
  }
  int rc = autodiff(g);
  diag = NULL;
  if (rc)
    fprintf(stderr, "%s: error: the model has no train: loss to differentiate\n", path);
  return rc;
}

/* --remat STRATEGY, --memory-budget BYTES (argv[*i] is the option): the
 * value into *remat or *budget (-1 for none), marked in *given (bit 0 remat,
 * bit 1 budget). 0, 1 if argv[*i] is neither option, 2 a usage error. */
static int remat_option(int argc, char **argv, int *i, Remat *remat, int64_t *budget, int *given) {
  static const char *const names[] = {"min-cut", "save-all", "recompute-all"};
  const char *a = argv[*i];
  if (strcmp(a, "--remat") && strcmp(a, "--memory-budget"))
    return 1;
  if (*i + 1 >= argc)
    return usage_error("%s needs a value", a);
  const char *v = argv[++*i];
  if (!strcmp(a, "--remat")) {
    for (int k = 0; k < 3; k++)
      if (!strcmp(v, names[k])) {
        *remat = (Remat)k;
        *given |= 1;
        return 0;
      }
    return usage_error("--remat: unknown strategy '%s' (min-cut, save-all, recompute-all)", v);
  }
  if (!strcmp(v, "none"))
    *budget = -1;
  else if (parse_byte_size(v, budget))
    return usage_error("--memory-budget: '%s' is not a positive size in bytes (1000000, 512MB, 2GiB, none)", v);
  *given |= 2;
  return 0;
}

static int cmd_check(int argc, char **argv) {
  const char *path = NULL;
  int dump = 0, json = 0, given = 0, r, after = -1, nofuse = 0;
  static const char *const stages[] = {"build", "autodiff", "partition", "decompose", "schedule", "plan"};
  Remat remat = REMAT_MIN_CUT;
  int64_t budget = -1;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--dump"))
      dump = 1;
    else if (!strcmp(argv[i], "--no-fuse"))
      nofuse = 1;
    else if (!strcmp(argv[i], "--dump-after")) {
      if (i + 1 >= argc)
        return usage_error("check: --dump-after needs a pass (%s)", "build, autodiff, partition, decompose, schedule, plan");
      for (int s = 0; s < 6; s++)
        if (!strcmp(argv[i + 1], stages[s]))
          after = s;
      if (after < 0)
        return usage_error("check: --dump-after: unknown pass '%s' (build, autodiff, partition, decompose, schedule, plan)", argv[i + 1]);
      i++;
    }
    else if (!strcmp(argv[i], "--json"))
      json = 1;
    else if ((r = remat_option(argc, argv, &i, &remat, &budget, &given)) != 1) {
      if (r)
        return r;
    } else if (argv[i][0] == '-' && argv[i][1])
      return usage_error("check: unknown option '%s'", argv[i]);
    else if (path)
      return usage_error("check: more than one model given ('%s')", argv[i]);
    else
      path = argv[i];
  }
  if (!path)
    return usage_error("check: no model file given%s", "");
  Arena a = {.fail_after = -1};
  Diag d = {0};
  Graph *g = load(&a, &d, path);
  if (!g) {
    arena_free(&a);
    return 1;
  }
  Buf b;
  buf_init(&b, &a);
  if (json)
    dump_json(g, &b);
  else
    print_summary(g, &b);
  if (given & 1)
    g->spec->compile.remat = remat;
  if (given & 2)
    g->spec->compile.memory_budget = budget;
  /* training: the saved activations at each dynamic dim's max */
  Plan plan = {0};
  int trained = !json && g->spec->train.present && g->loss;
  if (trained) {
    int64_t sym[MAXSYM] = {0};
    char err[512];
    for (int k = 0; k < g->nsyms; k++)
      sym[k] = g->syms[k].derived ? 0 : g->syms[k].max;
    if (differentiate(g, path) ||
        partition(g, g->spec->compile.remat, g->spec->compile.memory_budget, sym, &plan, err, sizeof err)) {
      fputs(b.p, stdout);
      if (g->grads)
        fprintf(stderr, "%s: error: %s\n", path, err);
      arena_free(&a);
      return 1;
    }
    print_plan_summary(g, &plan, &b);
  }
  if (!json) { /* the back end: kernels and the arena each pass needs */
    BPass *ps[NPASS] = {0};
    build_passes(g, trained ? &plan : NULL, !nofuse && g->spec->compile.fuse, 2, ps);
    buf_printf(&b, "kernels and arena (at each dynamic dim's max):");
    for (int k = 0; k < NPASS; k++)
      if (ps[k])
        buf_printf(&b, "%s %s %d kernel%s%s, %.1f MiB", k ? ";" : "", pass_names[k], ps[k]->nk, ps[k]->nk == 1 ? "" : "s",
                   ps[k]->via_forward ? " (the forward pass's)" : "", (double)ps[k]->arena / 1048576.0);
    buf_printf(&b, "\n");
  }
  if (dump && !json) {
    Graph fwd = *g; /* the forward graph, as written */
    if (trained)
      fwd.nnodes = g->nforward;
    buf_printf(&b, "\n");
    dump_graph(&fwd, &b);
    if (trained) {
      buf_printf(&b, "\n");
      print_plan(g, &plan, &b);
    }
  }
  if (after >= 0 && !json) {
    buf_printf(&b, "\n");
    if (after == 0 || (after <= 2 && !trained)) {
      Graph fwd = *g;
      if (trained)
        fwd.nnodes = g->nforward;
      dump_graph(&fwd, &b);
    } else if (after == 1) {
      dump_graph(g, &b);
    } else if (after == 2) {
      print_plan(g, &plan, &b);
    } else {
      BPass *ps[NPASS] = {0};
      build_passes(g, trained ? &plan : NULL, !nofuse && g->spec->compile.fuse, after - 3, ps);
      for (int k = 0; k < NPASS; k++)
        if (ps[k])
          dump_pass(ps[k], after - 3, &b);
    }
  }
  fputs(b.p, stdout);
  arena_free(&a);
  return 0;
}

/* ---------------------------------------------------------------- eval */

typedef struct {
  const char *name;
  const char *vals;
} SetArg;

/* "B=4,T=64" -> symbol values; unknown names and bad numbers are usage errors. */
static int parse_dims_arg(const Graph *g, const char *s, int64_t *vals, int *given) {
  while (*s) {
    const char *eq = strchr(s, '=');
    if (!eq)
      return usage_error("--dims: expected NAME=VALUE, found '%s'", s);
    int k;
    for (k = 0; k < g->nsyms; k++)
      if (!g->syms[k].derived && strlen(g->syms[k].name) == (size_t)(eq - s) && !strncmp(g->syms[k].name, s, (size_t)(eq - s)))
        break;
    if (k == g->nsyms)
      return usage_error("--dims: '%s' is not a dynamic dim of the model", arena_strndup(g->arena, s, (size_t)(eq - s)));
    if (given[k])
      return usage_error("--dims: %s is given twice", g->syms[k].name);
    char *end;
    errno = 0;
    long long v = strtoll(eq + 1, &end, 10);
    if (end == eq + 1 || (*end && *end != ',') || errno)
      return usage_error("--dims: bad value in '%s'", s);
    if (v < 1 || v > g->syms[k].max) {
      fprintf(stderr, "tgen: --dims: %s=%lld is outside [1, %lld] (its max)\n", g->syms[k].name, v,
              (long long)g->syms[k].max);
      return 2;
    }
    vals[k] = v;
    given[k] = 1;
    s = *end ? end + 1 : end;
  }
  return 0;
}

/* ---------------------------------------------------------------- explain */

static int cmd_explain(int argc, char **argv) {
  const char *path = NULL, *dims = NULL;
  int json = 0, nofuse = 0, given = 0, r;
  Remat remat = REMAT_MIN_CUT;
  int64_t budget = -1;
  const GpuCeilings *gpu = gpu_ceilings("h100");
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--json"))
      json = 1;
    else if (!strcmp(argv[i], "--no-fuse"))
      nofuse = 1;
    else if (!strcmp(argv[i], "--gpu")) {
      if (i + 1 >= argc)
        return usage_error("explain: %s needs a value", argv[i]);
      if (!(gpu = gpu_ceilings(argv[++i])))
        return usage_error("explain: --gpu: unknown GPU '%s' (h100, h200)", argv[i]);
    } else if (!strcmp(argv[i], "--dims")) {
      if (i + 1 >= argc)
        return usage_error("explain: %s needs a value", argv[i]);
      dims = argv[++i];
    } else if ((r = remat_option(argc, argv, &i, &remat, &budget, &given)) != 1) {
      if (r)
        return r;
    } else if (argv[i][0] == '-' && argv[i][1])
      return usage_error("explain: unknown option '%s'", argv[i]);
    else if (path)
      return usage_error("explain: more than one model given ('%s')", argv[i]);
    else
      path = argv[i];
  }
  if (!path)
    return usage_error("explain: no model file given%s", "");
  Arena a = {.fail_after = -1};
  Diag d = {0};
  Graph *g = load(&a, &d, path);
  if (!g) {
    arena_free(&a);
    return 1;
  }
  /* the passes are planned at each dynamic dim's max (as tgen MODEL -o OUT
   * prints them); their costs are evaluated at --dims */
  int64_t sym[MAXSYM] = {0}, at[MAXSYM] = {0};
  int set[MAXSYM] = {0}, rc = 0;
  for (int k = 0; k < g->nsyms; k++)
    sym[k] = at[k] = g->syms[k].derived ? 0 : g->syms[k].max;
  if (dims && (rc = parse_dims_arg(g, dims, at, set))) {
    arena_free(&a);
    return rc;
  }
  for (int k = 0; k < g->nsyms; k++) {
    int64_t v;
    const char *err;
    Dim x = dim_sym(k);
    if (g->syms[k].derived && !dim_eval(g, &x, at, &v, &err)) {
      fprintf(stderr, "tgen: explain: --dims %s: %s\n", dims, err);
      arena_free(&a);
      return 2;
    }
  }
  if (given & 1)
    g->spec->compile.remat = remat;
  if (given & 2)
    g->spec->compile.memory_budget = budget;
  Plan plan = {0};
  int trained = g->spec->train.present && g->loss;
  char err[512];
  if (trained && (differentiate(g, path) ||
                  partition(g, g->spec->compile.remat, g->spec->compile.memory_budget, sym, &plan, err, sizeof err))) {
    if (g->grads)
      fprintf(stderr, "%s: error: %s\n", path, err);
    arena_free(&a);
    return 1;
  }
  BPass *ps[NPASS] = {0};
  build_passes(g, trained ? &plan : NULL, !nofuse && g->spec->compile.fuse, 2, ps);
  render_file(g, ps, 1, path); /* names the loop kernels as the CUDA file does */
  for (int k = 0; k < NPASS; k++)
    if (ps[k])
      memcpy(ps[k]->sym, at, sizeof at);
  Buf b;
  buf_init(&b, &a);
  explain(g, ps, path, json, gpu, &b);
  fputs(b.p, stdout);
  arena_free(&a);
  return 0;
}

static int fill_set(Tensor *t, const char *name, const char *vals) {
  const char *p = vals;
  for (int64_t i = 0; i < t->numel; i++) {
    char *end;
    errno = 0;
    t->data[i] = strtod(p, &end);
    if (end == p || errno) {
      fprintf(stderr, "tgen: --set %s: value %lld is not a number ('%s')\n", name, (long long)i, p);
      return 2;
    }
    p = end;
    if (i + 1 < t->numel) {
      if (*p != ',') {
        fprintf(stderr, "tgen: --set %s: %lld values given, the input has %lld elements\n", name, (long long)i + 1,
                (long long)t->numel);
        return 2;
      }
      p++;
    }
  }
  if (*p) {
    fprintf(stderr, "tgen: --set %s: more values than the input's %lld elements\n", name, (long long)t->numel);
    return 2;
  }
  return 0;
}

static void print_tensor(const char *name, DType dt, const Tensor *t, int64_t max) {
  printf("%s: %s[", name, dtype_names[dt]);
  for (int i = 0; i < t->rank; i++)
    printf("%s%lld", i ? ", " : "", (long long)t->shape[i]);
  printf("] =");
  for (int64_t i = 0; i < t->numel && i < max; i++)
    printf(" %.9g", t->data[i]);
  if (t->numel > max)
    printf(" ... (%lld more)", (long long)(t->numel - max));
  printf("\n");
}

/* A size that is a single dynamic dim (B, not B*T or 2*B): its symbol, else -1. */
static int bare_sym(const Graph *g, const Dim *d) {
  if (d->n != 1 || d->t[0].c != 1)
    return -1;
  int s = -1;
  for (int k = 0; k < g->nsyms; k++) {
    if (!d->t[0].e[k])
      continue;
    if (s >= 0 || d->t[0].e[k] != 1 || g->syms[k].derived)
      return -1;
    s = k;
  }
  return s;
}

static const char *shape_text(char *buf, size_t n, int rank, const int64_t *s) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < rank && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)s[i]);
  if (k < n)
    snprintf(buf + k, n - k, "]");
  return buf;
}

/* Copies a tensor read from a safetensors file into t (its concrete shape
 * already set), checking dtype and shape as tgm_load_params does. */
static int take_tensor(const char *file, const char *what, const char *name, DType dt, const tgm_tensor_desc *src,
                       Tensor *t) {
  char a[160], b[160];
  if (src->dtype != (int)dt) {
    fprintf(stderr, "tgen: eval: %s: %s '%s' has dtype %s, expected %s\n", file, what, name,
            tgm_dtype_names[src->dtype], dtype_names[dt]);
    return 1;
  }
  int same = src->rank == t->rank;
  for (int j = 0; same && j < t->rank; j++)
    same = src->shape[j] == t->shape[j];
  if (!same) {
    fprintf(stderr, "tgen: eval: %s: %s '%s' has shape %s, expected %s\n", file, what, name,
            shape_text(a, sizeof a, src->rank, src->shape), shape_text(b, sizeof b, t->rank, t->shape));
    return 1;
  }
  for (int64_t i = 0; i < t->numel; i++)
    t->data[i] = tgm_get(src->data, src->dtype, i);
  return 0;
}

/* --params: every param by its checkpoint name (dtype and shape must match;
 * a tensor that is no param of the model is an error, as in tgm_load_params). */
static int load_params_file(const Graph *g, const char *file, Tensor *ps) {
  tgm_st_file f;
  char err[512];
  if (tgm_st_read(file, &f, err, sizeof err)) {
    fprintf(stderr, "tgen: eval: %s\n", err);
    return 1;
  }
  int rc = 0;
  for (int k = 0; k < g->nparams && !rc; k++) {
    const Param *p = &g->params[k];
    const tgm_tensor_desc *t = tgm_st_find(&f, p->ckpt);
    if (!t) {
      fprintf(stderr, "tgen: eval: %s: param '%s' is missing%s%s%s\n", file, p->ckpt, strcmp(p->ckpt, p->name) ? " (" : "",
              strcmp(p->ckpt, p->name) ? p->name : "", strcmp(p->ckpt, p->name) ? ")" : "");
      rc = 1;
    } else {
      rc = take_tensor(file, "param", p->ckpt, p->dtype, t, &ps[k]);
    }
  }
  for (int i = 0; i < f.n && !rc; i++) {
    int known = 0;
    for (int k = 0; k < g->nparams && !known; k++)
      known = !strcmp(f.t[i].name, g->params[k].ckpt);
    if (!known) {
      fprintf(stderr, "tgen: eval: %s: tensor '%s' is not a param of model %s\n", file, f.t[i].name, g->spec->name);
      rc = 1;
    }
  }
  tgm_st_free(&f);
  return rc;
}

/* Writes tensors as F64 safetensors (the runtime's writer has no F64), via
 * PATH.tmp and a rename. */
static int write_f64(Arena *a, const char *path, const char *const *names, const Tensor *const *t, int n) {
  Buf b;
  buf_init(&b, a);
  buf_printf(&b, "{");
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    buf_printf(&b, "%s\"", i ? "," : "");
    for (const char *s = names[i]; *s; s++) {
      if (*s == '"' || *s == '\\')
        buf_printf(&b, "\\%c", *s);
      else if ((unsigned char)*s < 32)
        buf_printf(&b, "\\u%04x", *s);
      else
        buf_putn(&b, s, 1);
    }
    buf_printf(&b, "\":{\"dtype\":\"F64\",\"shape\":[");
    for (int k = 0; k < t[i]->rank; k++)
      buf_printf(&b, "%s%lld", k ? "," : "", (long long)t[i]->shape[k]);
    uint64_t nb = (uint64_t)t[i]->numel * 8;
    buf_printf(&b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)(off + nb));
    off += nb;
  }
  buf_printf(&b, "}");
  while (strlen(b.p) % 8)
    buf_printf(&b, " ");
  const char *tmp = arena_printf(a, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    fprintf(stderr, "tgen: eval: cannot write %s: %s\n", tmp, strerror(errno));
    return 1;
  }
  uint64_t hl = strlen(b.p);
  unsigned char le[8];
  for (int k = 0; k < 8; k++)
    le[k] = (unsigned char)(hl >> (8 * k));
  int bad = fwrite(le, 1, 8, f) != 8 || fwrite(b.p, 1, hl, f) != hl;
  for (int i = 0; i < n && !bad; i++) /* little-endian hosts, as the runtime assumes */
    bad = fwrite(t[i]->data, 8, (size_t)t[i]->numel, f) != (size_t)t[i]->numel;
  bad |= fclose(f) != 0;
  if (bad || rename(tmp, path)) {
    fprintf(stderr, "tgen: eval: writing %s failed: %s\n", path, strerror(errno));
    remove(tmp);
    return 1;
  }
  return 0;
}

/* --out: the named tensors, floating ones as f32 (or all as f64 with
 * --out-dtype f64), i32 and bool ones in their dtype. */
static int write_out(Arena *a, const char *path, int f64, const char *const *names, const DType *dts,
                     const Tensor *const *t, int n) {
  if (f64)
    return write_f64(a, path, names, t, n);
  tgm_tensor_desc *d = calloc((size_t)n + 1, sizeof *d);
  void **bufs = calloc((size_t)n + 1, sizeof *bufs);
  int rc = !d || !bufs;
  for (int i = 0; i < n && !rc; i++) {
    int dt = dtype_is_float(dts[i]) ? TGM_F32 : (int)dts[i];
    bufs[i] = malloc((size_t)(t[i]->numel + 1) * (size_t)tgm_dtype_sizes[dt]);
    if (!bufs[i]) {
      rc = 1;
      break;
    }
    for (int64_t k = 0; k < t[i]->numel; k++)
      tgm_put(bufs[i], dt, k, t[i]->data[k]);
    d[i].name = names[i];
    d[i].dtype = dt;
    d[i].rank = t[i]->rank;
    memcpy(d[i].shape, t[i]->shape, sizeof(int64_t) * (size_t)t[i]->rank);
    d[i].data = bufs[i];
  }
  char err[512];
  if (rc)
    fprintf(stderr, "tgen: eval: out of memory writing %s\n", path);
  else if (tgm_st_write(path, d, n, err, sizeof err)) {
    fprintf(stderr, "tgen: eval: %s\n", err);
    rc = 1;
  }
  for (int i = 0; bufs && i < n; i++)
    free(bufs[i]);
  free(bufs);
  free(d);
  return rc;
}

static int cmd_eval(int argc, char **argv) {
  const char *path = NULL, *dims = NULL, *params_path = NULL, *inputs_path = NULL, *out_path = NULL;
  long long seed = -1, max = 64;
  int grad = 0, out_f64 = 0, max_given = 0;
  SetArg sets[64];
  int nsets = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    int has_val = i + 1 < argc;
    if (!strcmp(a, "--grad")) {
      grad = 1;
    } else if (!strcmp(a, "--params") || !strcmp(a, "--inputs") || !strcmp(a, "--out") || !strcmp(a, "--out-dtype")) {
      if (!has_val)
        return usage_error("eval: %s needs a value", a);
      const char *v = argv[++i];
      if (!strcmp(a, "--params"))
        params_path = v;
      else if (!strcmp(a, "--inputs"))
        inputs_path = v;
      else if (!strcmp(a, "--out"))
        out_path = v;
      else if (!strcmp(v, "f32") || !strcmp(v, "f64"))
        out_f64 = !strcmp(v, "f64");
      else
        return usage_error("eval: --out-dtype is f32 or f64, not '%s'", v);
    } else if (!strcmp(a, "--dims") || !strcmp(a, "--seed") || !strcmp(a, "--set") || !strcmp(a, "--max")) {
      if (!has_val)
        return usage_error("eval: %s needs a value", a);
      const char *v = argv[++i];
      char *end;
      if (!strcmp(a, "--dims"))
        dims = v;
      else if (!strcmp(a, "--set")) {
        const char *eq = strchr(v, '=');
        if (!eq || nsets == 64)
          return usage_error("eval: --set takes NAME=v1,v2,... (found '%s')", v);
        sets[nsets].name = v;
        sets[nsets++].vals = eq + 1;
      } else {
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (*end || end == v || errno || x < 0)
          return usage_error("eval: expected a non-negative integer, found '%s'", v);
        if (!strcmp(a, "--seed"))
          seed = x;
        else
          max = x, max_given = 1;
      }
    } else if (a[0] == '-' && a[1]) {
      return usage_error("eval: unknown option '%s'", a);
    } else if (path) {
      return usage_error("eval: more than one model given ('%s')", a);
    } else {
      path = a;
    }
  }
  if (!path)
    return usage_error("eval: no model file given%s", "");
  if (params_path && seed >= 0)
    return usage_error("eval: give --params or --seed, not both%s", "");
  Arena ar = {.fail_after = -1};
  Diag d = {0};
  Graph *g = load(&ar, &d, path);
  if (!g) {
    arena_free(&ar);
    return 1;
  }
  int64_t symvals[MAXSYM] = {0};
  int given[MAXSYM] = {0}, rc = 0;
  Tensor *ins = NULL, *ps = NULL, *vals = NULL;
  tgm_st_file inf;
  int have_inf = 0;
  char err[512];
  if (dims && (rc = parse_dims_arg(g, dims, symvals, given)))
    goto out;
  for (int i = 0; i < nsets; i++) {
    const char *eq = strchr(sets[i].name, '=');
    int k;
    for (k = 0; k < g->ninputs; k++)
      if (strlen(g->inputs[k].name) == (size_t)(eq - sets[i].name) && !strncmp(g->inputs[k].name, sets[i].name, (size_t)(eq - sets[i].name)))
        break;
    if (k == g->ninputs) {
      rc = usage_error("eval: --set names '%s', which is not an input of the model", sets[i].name);
      goto out;
    }
  }
  if (grad && !g->loss) {
    fprintf(stderr, "%s: error: eval --grad: model %s has no train: loss to differentiate\n", path, g->spec->name);
    rc = 1;
    goto out;
  }
  /* --inputs: every input by name; dynamic dims not given by --dims come
   * from the sizes that are a single dim, as the emitted runner does */
  if (inputs_path) {
    if (tgm_st_read(inputs_path, &inf, err, sizeof err)) {
      fprintf(stderr, "tgen: eval: %s\n", err);
      rc = 1;
      goto out;
    }
    have_inf = 1;
    for (int k = 0; k < g->ninputs; k++) {
      const Input *in = &g->inputs[k];
      const tgm_tensor_desc *t = tgm_st_find(&inf, in->name);
      if (!t) {
        fprintf(stderr, "tgen: eval: %s: input '%s' is missing\n", inputs_path, in->name);
        rc = 1;
        goto out;
      }
      if (t->rank != in->shape.rank) {
        fprintf(stderr, "tgen: eval: %s: input '%s' has rank %d, expected %d (%s)\n", inputs_path, in->name, t->rank,
                in->shape.rank, shape_str(g, &in->shape));
        rc = 1;
        goto out;
      }
      for (int j = 0; j < t->rank; j++) {
        int s = bare_sym(g, &in->shape.d[j]);
        if (s < 0 || given[s])
          continue;
        if (t->shape[j] < 1 || t->shape[j] > g->syms[s].max) {
          fprintf(stderr, "tgen: eval: %s: input '%s': dim %d is %lld, outside [1, %lld] (dim %s)\n", inputs_path,
                  in->name, j, (long long)t->shape[j], (long long)g->syms[s].max, g->syms[s].name);
          rc = 1;
          goto out;
        }
        symvals[s] = t->shape[j];
        given[s] = 1;
      }
    }
  }
  for (int k = 0; k < g->nsyms; k++)
    if (!g->syms[k].derived && !given[k]) {
      fprintf(stderr, "tgen: eval: dynamic dim %s needs a value: --dims %s=N\n", g->syms[k].name, g->syms[k].name);
      rc = 2;
      goto out;
    }
  /* the joint forward/backward graph: g->grads[k] = d loss / d params[k] */
  if (grad && differentiate(g, path)) {
    rc = 1;
    goto out;
  }
  uint64_t sd = seed >= 0 ? (uint64_t)seed : g->spec->seed;
  vals = calloc((size_t)g->nnodes + 1, sizeof(Tensor));
  /* params from the seed or --params, inputs from the fixed fill or
   * --inputs, then the --set values */
  if (!vals || interp_make_args(g, symvals, sd, &ins, &ps, err, sizeof err)) {
    fprintf(stderr, "tgen: eval: %s\n", vals ? err : "out of memory");
    rc = 1;
    goto done;
  }
  if (params_path && (rc = load_params_file(g, params_path, ps)))
    goto done;
  for (int k = 0; have_inf && k < g->ninputs && !rc; k++)
    rc = take_tensor(inputs_path, "input", g->inputs[k].name, g->inputs[k].dtype, tgm_st_find(&inf, g->inputs[k].name),
                     &ins[k]);
  for (int k = 0; k < g->ninputs && !rc; k++)
    for (int i = 0; i < nsets; i++)
      if (!strncmp(sets[i].name, g->inputs[k].name, strlen(g->inputs[k].name)) &&
          sets[i].name[strlen(g->inputs[k].name)] == '=')
        rc = fill_set(&ins[k], g->inputs[k].name, sets[i].vals);
  if (rc)
    goto done;
  InterpOptions opt = {symvals, 0, sd, 0}; /* dropout inactive (eval semantics), --grad too */
  if (interp_run(g, &opt, ins, ps, vals, err, sizeof err)) {
    fprintf(stderr, "%s: error: evaluation failed: %s\n", path, err);
    rc = 1;
    goto done;
  }
  /* what is shown or written: with --grad the loss, grad.<checkpoint name>
   * of every param and grad.<input> of every train.wrt input; else the
   * outputs, and the loss when it is not one */
  int cap = g->noutputs + g->nparams + g->nwrt + 2, n = 0;
  const char **names = arena_alloc(&ar, sizeof(char *) * (size_t)cap);
  const Tensor **ts = arena_alloc(&ar, sizeof(Tensor *) * (size_t)cap);
  DType *dts = arena_alloc(&ar, sizeof(DType) * (size_t)cap);
  if (grad) {
    names[n] = g->spec->train.loss.name, ts[n] = &vals[g->loss->id], dts[n++] = g->loss->dtype;
    for (int k = 0; k < g->ngrads; k++)
      names[n] = arena_printf(&ar, "grad.%s", k < g->nparams ? g->params[k].ckpt : g->inputs[g->wrt[k - g->nparams]].name),
      ts[n] = &vals[g->grads[k]->id], dts[n++] = g->grads[k]->dtype;
  } else {
    int loss_shown = 0;
    for (int i = 0; i < g->noutputs; i++) {
      names[n] = g->output_names[i], ts[n] = &vals[g->outputs[i]->id], dts[n++] = g->outputs[i]->dtype;
      loss_shown |= g->outputs[i] == g->loss;
    }
    if (g->loss && !loss_shown)
      names[n] = g->spec->train.loss.name, ts[n] = &vals[g->loss->id], dts[n++] = g->loss->dtype;
  }
  if (out_path) {
    rc = write_out(&ar, out_path, out_f64, names, dts, ts, n);
    if (!rc)
      printf("tgen: eval: wrote %d tensor%s to %s\n", n, n == 1 ? "" : "s", out_path);
  } else {
    for (int i = 0; i < n; i++) {
      print_tensor(names[i], dts[i], ts[i], grad && i && !max_given ? 8 : max);
      if (grad && i) {
        double s = 0;
        for (int64_t k = 0; k < ts[i]->numel; k++)
          s += ts[i]->data[k] * ts[i]->data[k];
        printf("  norm %.9g\n", sqrt(s));
      }
    }
  }
  interp_free(g, vals);
done:
  interp_free_args(g, ins, ps);
  free(vals);
out:
  if (have_inf)
    tgm_st_free(&inf);
  arena_free(&ar);
  return rc;
}

/* How the emitted files name the spec: the path as given when it is relative
 * (spec/examples/mlp.yaml), else its base name, so no absolute path of this
 * machine ends up in the output. */
static const char *spec_display_name(const char *p) {
  const char *s = strrchr(p, '/');
  return p[0] != '/' ? p : s ? s + 1 : p;
}

/* tgen MODEL.yaml -o OUT ...: the whole pipeline, then the emitted project. */
static int cmd_generate(int argc, char **argv) {
  const char *path = NULL, *out = NULL, *targets = NULL, *arch = NULL, *dist = NULL;
  int golden = 1, nofuse = 0, given = 0, r;
  long long test_dim = 2;
  Remat remat = REMAT_MIN_CUT;
  int64_t budget = -1;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if ((r = remat_option(argc, argv, &i, &remat, &budget, &given)) != 1) {
      if (r)
        return r;
    } else if (!strcmp(a, "-o") || !strcmp(a, "--targets") || !strcmp(a, "--cuda-arch") || !strcmp(a, "--test-dim") ||
               !strcmp(a, "--distributed")) {
      if (i + 1 >= argc)
        return usage_error("%s needs a value", a);
      const char *v = argv[++i];
      if (!strcmp(a, "-o"))
        out = v;
      else if (!strcmp(a, "--distributed")) {
        if (strcmp(v, "nccl") && strcmp(v, "none"))
          return usage_error("--distributed: unknown backend '%s' (nccl, none)", v);
        dist = v;
      }
      else if (!strcmp(a, "--targets"))
        targets = v;
      else if (!strcmp(a, "--cuda-arch"))
        arch = v;
      else {
        char *end;
        test_dim = strtoll(v, &end, 10);
        if (*end || end == v || test_dim < 1)
          return usage_error("--test-dim: expected a positive integer, found '%s'", v);
      }
    } else if (!strcmp(a, "--no-golden")) {
      golden = 0;
    } else if (!strcmp(a, "--no-fuse")) {
      nofuse = 1;
    } else if (a[0] == '-' && a[1]) {
      return usage_error("unknown option '%s'", a);
    } else if (path) {
      return usage_error("more than one model given ('%s')", a);
    } else {
      path = a;
    }
  }
  if (!path)
    return usage_error("no model file given%s", "");
  if (!out)
    return usage_error("no output directory given: tgen %s -o OUT", path);
  int tmask = 0;
  if (targets) {
    char buf[64];
    snprintf(buf, sizeof buf, "%s", targets);
    for (char *t = strtok(buf, ","); t; t = strtok(NULL, ","))
      if (!strcmp(t, "cpu"))
        tmask |= TARGET_CPU;
      else if (!strcmp(t, "cuda"))
        tmask |= TARGET_CUDA;
      else
        return usage_error("--targets: unknown target '%s' (cpu, cuda)", t);
  }
  if (arch) {
    for (const char *p = arch; *p; p++)
      if (!(isalnum((unsigned char)*p) || *p == ';' || *p == '-'))
        return usage_error("--cuda-arch: '%s' is not an architecture list (native, 90, 80;90)", arch);
  }
  Arena a = {.fail_after = -1};
  Diag d = {0};
  Graph *g = load(&a, &d, path);
  if (!g) {
    arena_free(&a);
    return 1;
  }
  if (given & 1)
    g->spec->compile.remat = remat;
  if (given & 2)
    g->spec->compile.memory_budget = budget;
  EmitOptions o = {spec_display_name(path), tmask ? tmask : g->spec->compile.targets,
                   arch ? arch : g->spec->compile.cuda_arch, golden, 2e9, test_dim,
                   nofuse ? 0 : g->spec->compile.fuse, dist ? !strcmp(dist, "nccl") : g->spec->compile.distributed};
  if (o.distributed && (!g->spec->train.present || g->spec->train.opt == OPT_NONE)) {
    fprintf(stderr, "tgen: error: --distributed nccl: model %s has no train: section with an optimizer to run in "
                    "data parallel\n", g->spec->name);
    arena_free(&a);
    return 1;
  }
  g->spec->compile.distributed = o.distributed; /* the command line wins (render.c reads it) */
  if (o.distributed && !(o.targets & TARGET_CUDA)) {
    fprintf(stderr, "tgen: error: distributed training through NCCL needs the cuda target (--targets has no cuda)\n");
    arena_free(&a);
    return 1;
  }
  char err[1024];
  int rc = 0;
  if (emit_project(g, &o, out, err, sizeof err)) {
    fprintf(stderr, "tgen: error: %s\n", err);
    rc = 1;
  } else {
    printf("tgen: wrote %s (model %s: %d ops, %d params)\n", out, g->spec->name, g->nnodes, g->nparams);
  }
  arena_free(&a);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2)
    return usage_error("no command given%s", "");
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    fputs(usage, stdout);
    return 0;
  }
  if (!strcmp(cmd, "--version")) {
    printf("tgen %s\n", TGEN_VERSION);
    return 0;
  }
  if (!strcmp(cmd, "check"))
    return cmd_check(argc - 2, argv + 2);
  if (!strcmp(cmd, "eval"))
    return cmd_eval(argc - 2, argv + 2);
  if (!strcmp(cmd, "explain"))
    return cmd_explain(argc - 2, argv + 2);
  if (cmd[0] != '-')
    return cmd_generate(argc - 1, argv + 1);
  return usage_error("unknown command '%s'", cmd);
}
