/* interp_ref: tgen's double-precision reference interpreter (gen/interp.c) on
 * inputs from a safetensors file, for validating tests/gpu/torch_oracle.py.
 *
 *   interp_ref MODEL.yaml [--seed N] [--dims B=2,T=8] --params-out P.safetensors
 *              --inputs I.safetensors --out O.safetensors
 *
 * Writes the params `tgen eval` uses for the seed (default: the spec's) in
 * their dtypes under their checkpoint names, reads the inputs (tensor names =
 * input names; F32/BF16/F16/I32/BOOL), runs interp_run and writes every output
 * plus the train loss (under its binding name) as F64, unrounded.
 *
 * Build (from the repo root, after building tgen in build/):
 *   cc -O2 -fopenmp -Igen -Ispec -Itemplates/runtime tests/gpu/interp_ref.c \
 *      build/libtgenlib.a -lyaml -lm -o build/interp_ref */
#include "ir.h"
#include "tgm_rt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *msg, const char *a) {
  fprintf(stderr, "interp_ref: %s%s\n", msg, a ? a : "");
  return 1;
}

/* Writes F64 tensors in safetensors format (tgm_st_write has no F64). */
static int write_f64(const char *path, const char **names, const Tensor *t, int n) {
  Buf b;
  Arena a = {.fail_after = -1};
  buf_init(&b, &a);
  buf_printf(&b, "{");
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    buf_printf(&b, "%s\"%s\":{\"dtype\":\"F64\",\"shape\":[", i ? "," : "", names[i]);
    for (int k = 0; k < t[i].rank; k++)
      buf_printf(&b, "%s%lld", k ? "," : "", (long long)t[i].shape[k]);
    uint64_t nb = (uint64_t)t[i].numel * 8;
    buf_printf(&b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)(off + nb));
    off += nb;
  }
  buf_printf(&b, "}");
  while (strlen(b.p) % 8)
    buf_printf(&b, " ");
  FILE *f = fopen(path, "wb");
  if (!f)
    return fail("cannot write ", path);
  uint64_t hl = strlen(b.p);
  unsigned char le[8];
  for (int k = 0; k < 8; k++)
    le[k] = (unsigned char)(hl >> (8 * k));
  fwrite(le, 1, 8, f);
  fwrite(b.p, 1, hl, f);
  for (int i = 0; i < n; i++)
    fwrite(t[i].data, 8, (size_t)t[i].numel, f);
  int bad = fclose(f) != 0;
  arena_free(&a);
  return bad ? fail("write failed: ", path) : 0;
}

/* Load and build MODEL as tgen does (gen/main.c); NULL after printing the
 * refusal. */
static Graph *load(Arena *a, Diag *d, const char *path) {
  size_t len = 0;
  Diag fd = {0};
  fd.file = path;
  fd.arena = a;
  diag = &fd;
  if (setjmp(fd.jmp)) {
    diag = NULL;
    fputs(fd.msg, stderr);
    return NULL;
  }
  char *src = read_file(a, path, &len);
  diag = NULL;
  if (!src) {
    fail("cannot read ", path);
    return NULL;
  }
  Graph *g = tgen_load(d, a, path, src, len);
  if (!g)
    fputs(d->msg, stderr);
  return g;
}

int main(int argc, char **argv) {
  const char *path = NULL, *dims = NULL, *pout = NULL, *inp = NULL, *outp = NULL;
  long long seed = -1;
  for (int i = 1; i < argc; i++) {
    if (i + 1 < argc && !strcmp(argv[i], "--seed"))
      seed = atoll(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--dims"))
      dims = argv[++i];
    else if (i + 1 < argc && !strcmp(argv[i], "--params-out"))
      pout = argv[++i];
    else if (i + 1 < argc && !strcmp(argv[i], "--inputs"))
      inp = argv[++i];
    else if (i + 1 < argc && !strcmp(argv[i], "--out"))
      outp = argv[++i];
    else if (argv[i][0] != '-' && !path)
      path = argv[i];
    else
      return fail("bad argument ", argv[i]);
  }
  if (!path || !outp)
    return fail("usage: interp_ref MODEL.yaml [--seed N] [--dims B=2] [--params-out P] [--inputs I] --out O", NULL);

  Arena ar = {.fail_after = -1};
  Diag d = {0};
  Graph *g = load(&ar, &d, path);
  if (!g)
    return 1;

  int64_t symvals[MAXSYM] = {0};
  for (int k = 0; k < g->nsyms; k++)
    symvals[k] = 1;
  for (const char *s = dims; s && *s;) {
    const char *eq = strchr(s, '=');
    if (!eq)
      return fail("bad --dims ", dims);
    int k;
    for (k = 0; k < g->nsyms; k++)
      if (!g->syms[k].derived && strlen(g->syms[k].name) == (size_t)(eq - s) &&
          !strncmp(g->syms[k].name, s, (size_t)(eq - s)))
        break;
    if (k == g->nsyms)
      return fail("unknown dim in --dims ", s);
    char *end;
    symvals[k] = strtoll(eq + 1, &end, 10);
    s = *end == ',' ? end + 1 : end;
  }
  uint64_t sd = seed >= 0 ? (uint64_t)seed : g->spec->seed;
  char err[512];

  /* params */
  Tensor *ps = calloc((size_t)g->nparams + 1, sizeof(Tensor));
  tgm_tensor_desc *pd = calloc((size_t)g->nparams + 1, sizeof(tgm_tensor_desc));
  for (int k = 0; k < g->nparams; k++) {
    Param *p = &g->params[k];
    if (!concrete_shape(g, &p->shape, symvals, &ps[k], err, sizeof err))
      return fail(err, NULL);
    ps[k].data = malloc(sizeof(double) * (size_t)(ps[k].numel + 1));
    void *raw = calloc((size_t)ps[k].numel + 1, (size_t)tgm_dtype_sizes[p->dtype]);
    for (int64_t i = 0; i < ps[k].numel; i++) {
      double v = param_init_value(p, sd, i);
      ps[k].data[i] = v;
      switch (p->dtype) {
      case DT_F32: ((float *)raw)[i] = (float)v; break;
      case DT_BF16: ((uint16_t *)raw)[i] = tgm_f32_to_bf16((float)v); break;
      case DT_F16: ((uint16_t *)raw)[i] = tgm_f32_to_f16((float)v); break;
      case DT_I32: ((int32_t *)raw)[i] = (int32_t)v; break;
      default: ((uint8_t *)raw)[i] = v != 0; break;
      }
    }
    pd[k].name = p->ckpt;
    pd[k].dtype = (int)p->dtype;
    pd[k].rank = ps[k].rank;
    memcpy(pd[k].shape, ps[k].shape, sizeof(int64_t) * (size_t)ps[k].rank);
    pd[k].data = raw;
  }
  if (pout && tgm_st_write(pout, pd, g->nparams, err, sizeof err))
    return fail(err, NULL);

  /* inputs */
  Tensor *ins = calloc((size_t)g->ninputs + 1, sizeof(Tensor));
  tgm_st_file inf;
  memset(&inf, 0, sizeof inf);
  if (inp && tgm_st_read(inp, &inf, err, sizeof err))
    return fail(err, NULL);
  for (int k = 0; k < g->ninputs; k++) {
    Input *in = &g->inputs[k];
    const tgm_tensor_desc *t = inp ? tgm_st_find(&inf, in->name) : NULL;
    if (!t)
      return fail("input missing: ", in->name);
    ins[k].rank = t->rank;
    ins[k].numel = 1;
    for (int j = 0; j < t->rank; j++) {
      ins[k].shape[j] = t->shape[j];
      ins[k].numel *= t->shape[j];
    }
    ins[k].data = malloc(sizeof(double) * (size_t)(ins[k].numel + 1));
    for (int64_t i = 0; i < ins[k].numel; i++) {
      double v;
      switch (t->dtype) {
      case TGM_F32: v = ((const float *)t->data)[i]; break;
      case TGM_BF16: v = tgm_bf16_to_f32(((const uint16_t *)t->data)[i]); break;
      case TGM_F16: v = tgm_f16_to_f32(((const uint16_t *)t->data)[i]); break;
      case TGM_I32: v = ((const int32_t *)t->data)[i]; break;
      default: v = ((const uint8_t *)t->data)[i] != 0; break;
      }
      ins[k].data[i] = v;
    }
  }

  Tensor *vals = calloc((size_t)g->nnodes + 1, sizeof(Tensor));
  InterpOptions opt = {symvals, 0, sd, 0};
  if (interp_run(g, &opt, ins, ps, vals, err, sizeof err))
    return fail("evaluation failed: ", err);
  const char *names[MAXSYM + 64];
  Tensor outs[MAXSYM + 64];
  int n = 0;
  int loss_shown = 0;
  for (int i = 0; i < g->noutputs && n < 64; i++) {
    names[n] = g->output_names[i];
    outs[n++] = vals[g->outputs[i]->id];
    loss_shown |= g->outputs[i] == g->loss;
  }
  if (g->loss && !loss_shown) {
    names[n] = g->spec->train.loss.name;
    outs[n++] = vals[g->loss->id];
  }
  return write_f64(outp, names, outs, n);
}
