/* main.c: the tgen command line. It reads as the pipeline: load the spec
 * (parse -> build -> infer), verify, then the command's own work. */
#include "ir.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: tgen MODEL.yaml -o OUT [--targets cpu,cuda] [--cuda-arch ARCH] [--no-golden] [--test-dim N]\n"
    "       tgen check MODEL.yaml [--dump | --json]\n"
    "       tgen eval MODEL.yaml [--dims B=4,T=64] [--seed N] [--set NAME=v1,v2,...]... [--max N]\n"
    "       tgen --help | --version\n"
    "\n"
    "  MODEL.yaml -o OUT\n"
    "          print the model's C/CUDA project into directory OUT (written\n"
    "          atomically; an existing OUT is replaced only if tgen made it).\n"
    "          --targets and --cuda-arch override the spec's compile: section;\n"
    "          --test-dim sets the dynamic dims of the emitted tests (default 2);\n"
    "          --no-golden skips the golden vectors of the emitted tests\n"
    "  check   validate a model spec and print a summary (dims, inputs, params,\n"
    "          ops, outputs); --dump also prints the graph IR; --json prints\n"
    "          the graph as JSON instead (for other tools)\n"
    "  eval    run the model's forward pass in the double-precision reference\n"
    "          interpreter: params from the seed (the spec's by default), inputs\n"
    "          from --set (comma-separated values, row-major) or else a fixed\n"
    "          pseudo-random fill (floats in [-1, 1), integer inputs valid\n"
    "          indices for the ops that use them); prints\n"
    "          every output (at most --max values each, default 64)\n"
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

static int cmd_check(int argc, char **argv) {
  const char *path = NULL;
  int dump = 0, json = 0;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--dump"))
      dump = 1;
    else if (!strcmp(argv[i], "--json"))
      json = 1;
    else if (argv[i][0] == '-' && argv[i][1])
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
  if (dump && !json) {
    buf_printf(&b, "\n");
    dump_graph(g, &b);
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

static int cmd_eval(int argc, char **argv) {
  const char *path = NULL, *dims = NULL;
  long long seed = -1, max = 64;
  SetArg sets[64];
  int nsets = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    int has_val = i + 1 < argc;
    if (!strcmp(a, "--dims") || !strcmp(a, "--seed") || !strcmp(a, "--set") || !strcmp(a, "--max")) {
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
          max = x;
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
  Arena ar = {.fail_after = -1};
  Diag d = {0};
  Graph *g = load(&ar, &d, path);
  if (!g) {
    arena_free(&ar);
    return 1;
  }
  int64_t symvals[MAXSYM] = {0};
  int given[MAXSYM] = {0}, rc = 0;
  if (dims && (rc = parse_dims_arg(g, dims, symvals, given)))
    goto out;
  for (int k = 0; k < g->nsyms; k++)
    if (!g->syms[k].derived && !given[k]) {
      fprintf(stderr, "tgen: eval: dynamic dim %s needs a value: --dims %s=N\n", g->syms[k].name, g->syms[k].name);
      rc = 2;
      goto out;
    }
  uint64_t sd = seed >= 0 ? (uint64_t)seed : g->spec->seed;
  Tensor *ins = NULL, *ps = NULL, *vals = calloc((size_t)g->nnodes + 1, sizeof(Tensor));
  char err[512];
  for (int i = 0; i < nsets; i++) {
    const char *eq = strchr(sets[i].name, '=');
    int k;
    for (k = 0; k < g->ninputs; k++)
      if (strlen(g->inputs[k].name) == (size_t)(eq - sets[i].name) && !strncmp(g->inputs[k].name, sets[i].name, (size_t)(eq - sets[i].name)))
        break;
    if (k == g->ninputs) {
      rc = usage_error("eval: --set names '%s', which is not an input of the model", sets[i].name);
      goto done;
    }
  }
  /* params from the seed, inputs from the fixed fill, then the --set values */
  if (!vals || interp_make_args(g, symvals, sd, &ins, &ps, err, sizeof err)) {
    fprintf(stderr, "tgen: eval: %s\n", vals ? err : "out of memory");
    rc = 1;
    goto done;
  }
  for (int k = 0; k < g->ninputs && !rc; k++)
    for (int i = 0; i < nsets; i++)
      if (!strncmp(sets[i].name, g->inputs[k].name, strlen(g->inputs[k].name)) &&
          sets[i].name[strlen(g->inputs[k].name)] == '=')
        rc = fill_set(&ins[k], g->inputs[k].name, sets[i].vals);
  if (!rc) {
    InterpOptions opt = {symvals, 0, sd, 0};
    if (interp_run(g, &opt, ins, ps, vals, err, sizeof err)) {
      fprintf(stderr, "%s: error: evaluation failed: %s\n", path, err);
      rc = 1;
    } else {
      for (int i = 0; i < g->noutputs; i++)
        print_tensor(g->output_names[i], g->outputs[i]->dtype, &vals[g->outputs[i]->id], max);
      int loss_shown = 0;
      for (int i = 0; i < g->noutputs; i++)
        loss_shown |= g->outputs[i] == g->loss;
      if (g->loss && !loss_shown)
        print_tensor(g->spec->train.loss.name, g->loss->dtype, &vals[g->loss->id], max);
      interp_free(g, vals);
    }
  }
done:
  interp_free_args(g, ins, ps);
  free(vals);
out:
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
  const char *path = NULL, *out = NULL, *targets = NULL, *arch = NULL;
  int golden = 1;
  long long test_dim = 2;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-o") || !strcmp(a, "--targets") || !strcmp(a, "--cuda-arch") || !strcmp(a, "--test-dim")) {
      if (i + 1 >= argc)
        return usage_error("%s needs a value", a);
      const char *v = argv[++i];
      if (!strcmp(a, "-o"))
        out = v;
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
  EmitOptions o = {spec_display_name(path), tmask ? tmask : g->spec->compile.targets,
                   arch ? arch : g->spec->compile.cuda_arch, golden, 2e9, test_dim};
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
  if (cmd[0] != '-')
    return cmd_generate(argc - 1, argv + 1);
  return usage_error("unknown command '%s'", cmd);
}
