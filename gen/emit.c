/* emit.c: Graph -> the emitted C/CUDA project.
 *
 * The project is the runtime templates (templates/runtime, renamed "tgm" ->
 * the model's name) plus the model-specific files printed here:
 *   include/NAME.h      the public API (template + generated structs)
 *   src/NAME_common.c   tables (dims, params, inputs, outputs), guards, shapes
 *   src/NAME_cpu.c      the forward pass on the CPU (OpenMP kernels)
 *   src/NAME_cuda.cu    the forward pass on CUDA (kernels + cuBLAS)
 *   tests/golden.safetensors   golden vectors from the reference interpreter
 * One walker prints both forward passes; the two dialects differ only in the
 * kernel prefix, the context argument and error checking.
 *
 * Everything is written into memory first; the directory is written only when
 * all of it succeeded, into a temporary directory renamed into place. */
#define _DEFAULT_SOURCE /* syscall (renameat2), realpath */
#include "ir.h"
#include "../templates/runtime/tgm_rt.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct {
  const char *path;
  const unsigned char *data;
  size_t len;
} TemplateFile;
extern const TemplateFile tgen_templates[];

typedef struct OutFile {
  const char *path;
  const char *data;
  size_t len;
} OutFile;

/* The runtime library calls a section of the runtime templates can be kept
 * for, one per op (render.c's call_kernel prints them): a section names the
 * ops, e.g. "attention matmul". GEMMs that render.c prints as tgm_*_gemm calls
 * (gemm_call) need no section: that code is always kept. */
static const Op library_ops[] = {OP_ATTENTION, OP_ATTENTION_BACKWARD, OP_EMBEDDING, OP_EMBEDDING_BACKWARD,
                                 OP_DROPOUT,   OP_MATMUL,             OP_LINEAR};
enum { NLIBRARY = sizeof library_ops / sizeof *library_ops };

typedef struct E {
  Graph *g;
  Arena *a;
  const EmitOptions *o;
  const char *name;  /* model name */
  const char *NAME;  /* upper-case */
  Vec files;         /* OutFile* */
  int64_t *pbyte;    /* param byte offsets (256-aligned) */
  int64_t param_bytes;
  int64_t test_sym[MAXSYM];
  Buf cuda_checks;   /* the CUDA pass's index-checking ops, for its message */
  int cur;           /* the step being printed */
  const char *test_dims_arg; /* "--dims B=2,T=2" (the emitted tests' dims), or "" */
  BPass *pass[NPASS]; /* forward, loss, train (NULL: the model has none) */
  struct { int64_t b0, b1, n, f; DType dt; } *runs; /* params of one dtype in a row */
  int nruns, need_master;
  int64_t *state, state_elems; /* param k's f32 element in the optimizer state; the total */
  Plan plan;         /* the training schedule (partition.c) */
  char calls[NLIBRARY]; /* per library_ops: some pass calls it (the runtime sections kept) */
} E;

#define P(...) buf_printf(b, __VA_ARGS__)

/* ---------------------------------------------------------------- templates */

static const TemplateFile *template_find(const char *path) {
  for (const TemplateFile *t = tgen_templates; t->path; t++)
    if (!strcmp(t->path, path))
      return t;
  die("template %s is not embedded", path);
}

/* Template text with the word "tgm" renamed to the model (TGM -> NAME) and the
 * @KEY@ placeholders filled. */
static const char *instantiate(E *e, const char *path) {
  const TemplateFile *t = template_find(path);
  Buf b;
  buf_init(&b, e->a);
  const char *s = (const char *)t->data, *end = s + t->len;
  while (s < end) {
    int word_start = s == (const char *)t->data || !(isalnum((unsigned char)s[-1]) || s[-1] == '_') ||
                     (s - (const char *)t->data >= 2 && s[-2] == '-' && s[-1] == 'D'); /* -DTGM_CUDA */
    if (word_start && end - s >= 3 && (!strncmp(s, "tgm", 3) || !strncmp(s, "TGM", 3)) &&
        !(s + 3 < end && isalnum((unsigned char)s[3]))) {
      buf_printf(&b, "%s", s[0] == 't' ? e->name : e->NAME);
      s += 3;
      continue;
    }
    if (*s == '@') {
      static const char *const keys[] = {"@SPEC@",    "@CUDA_ARCH@", "@WANT_CUDA@",     "@WANT_CPU@",
                                         "@VERSION@", "@HAS_TRAIN@", "@TEST_DIMS_ARG@", "@HAS_OPTIMIZER@"};
      const char *vals[] = {e->o->spec_name,
                            e->o->cuda_arch,
                            (e->o->targets & TARGET_CUDA) ? "ON" : "OFF",
                            (e->o->targets & TARGET_CPU) ? "ON" : "OFF",
                            TGEN_VERSION,
                            e->g->grads ? "ON" : "OFF",
                            e->test_dims_arg ? e->test_dims_arg : "",
                            e->g->spec->train.opt != OPT_NONE ? "ON" : "OFF"};
      size_t k;
      for (k = 0; k < sizeof keys / sizeof *keys; k++)
        if ((size_t)(end - s) >= strlen(keys[k]) && !strncmp(s, keys[k], strlen(keys[k])))
          break;
      if (k < sizeof keys / sizeof *keys) {
        buf_printf(&b, "%s", vals[k]);
        s += strlen(keys[k]);
        continue;
      }
    }
    buf_putn(&b, s, 1);
    s++;
  }
  return b.p;
}

/* Replace the section "/@BEGIN KEY@/ ... /@END KEY@/" of text with repl. */
static const char *replace_section(E *e, const char *text, const char *key, const char *repl) {
  char begin[64], endm[64];
  snprintf(begin, sizeof begin, "/*@BEGIN %s@*/", key);
  snprintf(endm, sizeof endm, "/*@END %s@*/", key);
  const char *b0 = strstr(text, begin), *e0 = b0 ? strstr(b0, endm) : NULL;
  if (!b0 || !e0)
    die("template section %s missing", key);
  e0 += strlen(endm);
  if (*e0 == '\n')
    e0++;
  return arena_printf(e->a, "%.*s%s%s", (int)(b0 - text), text, repl, e0);
}

/* ---------------------------------------------------------------- runtime sections */

/* Which of library_ops some pass calls: the anchors of its K_EXTERN kernels
 * and of the K_GEMM kernels that are not strided GEMMs (call_kernel's test). */
static void find_library_calls(E *e) {
  for (int i = 0; i < NPASS; i++) {
    BPass *p = e->pass[i];
    for (int j = 0; p && j < p->nk; j++) {
      const Kernel *k = p->k[j];
      /* call_kernel prints a library call for these (strided GEMMs: gemm_call) */
      int call = k->kind == K_EXTERN || (k->kind == K_GEMM && !gemm_strided(k->anchor));
      if (!call)
        continue;
      Op op = k->anchor->op == OP_ATTENTION_LSE ? OP_ATTENTION : k->anchor->op; /* one call computes both */
      for (int c = 0; c < NLIBRARY; c++)
        if (op == library_ops[c])
          e->calls[c] = 1;
    }
  }
}

/* Whether the section naming the ops in words[0, len) (separated by spaces)
 * is kept: some pass calls one of them. An unknown name is a template bug. */
static int section_kept(E *e, const char *path, const char *words, size_t len) {
  int kept = 0;
  const char *s = words, *end = words + len;
  while (s < end) {
    if (*s == ' ') {
      s++;
      continue;
    }
    size_t n = 0;
    while (s + n < end && s[n] != ' ')
      n++;
    int c;
    for (c = 0; c < NLIBRARY; c++) {
      const char *name = op_info[library_ops[c]].name;
      if (strlen(name) == n && !strncmp(name, s, n))
        break;
    }
    if (n == 11 && !strncmp(s, "distributed", n))
      kept |= e->o->distributed; /* the data-parallel path (--distributed nccl) */
    else if (c == NLIBRARY)
      die("template %s: section names '%.*s', which is no library call", path, (int)n, s);
    else
      kept |= e->calls[c];
    s += n;
  }
  return kept;
}

/* A template's text with its sections resolved. A section is the lines
 * between two marker lines, C comments holding "@uses NAMES@" and "@end
 * NAMES@" (the same NAMES, e.g. "attention matmul"), each comment alone on
 * its line (in CMake files, "#@uses NAMES@" and "#@end NAMES@"): kept when
 * the model calls one of the library functions NAMES (ops, see
 * library_ops), or for the name "distributed" when the project is generated
 * with --distributed nccl, else dropped. The marker lines themselves are
 * always dropped. Sections do not nest. */
static const char *keep_sections(E *e, const char *path, const char *text) {
  Buf b;
  buf_init(&b, e->a);
  const char *open = NULL; /* the open section's NAMES, or NULL */
  size_t openlen = 0;
  int keep = 1;
  const char *s = text;
  while (*s) {
    const char *eol = strchr(s, '\n');
    size_t len = eol ? (size_t)(eol - s) : strlen(s);
    const char *next = eol ? eol + 1 : s + len;
    /* "/" "*@uses NAMES@*" "/" (C) or "#@uses NAMES@" (CMake): the prefix's and suffix's lengths */
    int c = len > 3 && !strncmp(s + len - 3, "@*/", 3) && s[0] == '/', hash = s[0] == '#' && len > 2 && s[len - 1] == '@';
    size_t pre = c ? 2 : 1, suf = c ? 3 : 1;
    int marker = c || hash;
    if (marker && len > pre + suf + 5 && !strncmp(s + pre, "@uses ", 6)) {
      if (open)
        die("template %s: section '%.*s' opened inside '%.*s'", path, (int)(len - pre - suf - 6), s + pre + 6,
            (int)openlen, open);
      open = s + pre + 6;
      openlen = len - pre - suf - 6;
      keep = section_kept(e, path, open, openlen);
    } else if (marker && len > pre + suf + 4 && !strncmp(s + pre, "@end ", 5)) {
      if (!open || len - pre - suf - 5 != openlen || strncmp(s + pre + 5, open, openlen))
        die("template %s: '%.*s' closes no open section", path, (int)len, s);
      open = NULL;
      keep = 1;
    } else if (keep) {
      buf_putn(&b, s, (size_t)(next - s));
    }
    s = next;
  }
  if (open)
    die("template %s: section '%.*s' is not closed", path, (int)openlen, open);
  return b.p;
}

static void add_file(E *e, const char *path, const char *data) {
  OutFile *f = arena_alloc(e->a, sizeof(OutFile));
  f->path = path;
  f->data = data;
  f->len = strlen(data);
  vec_push(e->a, &e->files, f);
}

static void add_binary(E *e, const char *path, const void *data, size_t len) {
  OutFile *f = arena_alloc(e->a, sizeof(OutFile));
  f->path = path;
  f->data = data;
  f->len = len;
  vec_push(e->a, &e->files, f);
}

/* ---------------------------------------------------------------- C text of sizes */

/* The C local of symbol k (render.c's c_dim prints sizes over the same). */
static const char *sym_var(const Graph *g, int k) {
  return g->syms[k].derived ? arena_printf(g->arena, "dim_q%d", k) : arena_printf(g->arena, "dim_%s", g->syms[k].name);
}


static const char *ctype(DType t) {
  return t == DT_F32 ? "float" : t == DT_I32 ? "int32_t" : t == DT_BOOL ? "uint8_t" : "uint16_t";
}

static const char *dtc(E *e, DType t) {
  static const char *const n[] = {"F32", "BF16", "F16", "I32", "BOOL"};
  return arena_printf(e->a, "%s_%s", e->NAME, n[t]);
}

static const char *cstr(E *e, const char *s) { /* a C string literal */
  Buf b;
  buf_init(&b, e->a);
  buf_printf(&b, "\"");
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      buf_printf(&b, "\\%c", *s);
    else if ((unsigned char)*s < 32)
      buf_printf(&b, "\\%03o", (unsigned char)*s);
    else
      buf_putn(&b, s, 1);
  }
  buf_printf(&b, "\"");
  return b.p;
}

static const char *fnum(E *e, double v) {
  if (isinf(v))
    return v > 0 ? "INFINITY" : "-INFINITY";
  if (isnan(v))
    return "NAN";
  char tmp[64];
  snprintf(tmp, sizeof tmp, "%.17g", v);
  if (!strpbrk(tmp, ".eE"))
    strcat(tmp, ".0");
  return arena_strdup(e->a, tmp);
}

/* ---------------------------------------------------------------- passes */

static void emit_sym_locals(E *e, Buf *b) {
  for (int k = 0; k < e->g->nsyms; k++)
    P("  %s_UNUSED const int64_t %s = sym[%d];%s\n", e->NAME, sym_var(e->g, k), k,
      e->g->syms[k].derived ? arena_printf(e->a, "  /* %s */", e->g->syms[k].name) : "");
}

static const char *shape_comment(E *e, const Node *n) {
  return arena_printf(e->a, "%s%s", dtype_names[n->dtype], shape_str(e->g, &n->shape));
}

/* The first line of the spec text a node came from, for comments. */
static const char *origin(E *e, const Node *n) {
  const char *who = n->name ? n->name : "";
  if (n->scope && n->scope[0])
    return arena_printf(e->a, "%s:%d '%s' (%s)", e->o->spec_name, n->loc.line, who, n->scope);
  return arena_printf(e->a, "%s:%d '%s'", e->o->spec_name, n->loc.line, who);
}

/* The ids of the forward nodes `roots` need, in graph order. */
static int needed(Graph *g, Node **roots, int nroots, int *order) {
  char *live = arena_alloc(g->arena, (size_t)g->nnodes + 1);
  for (int k = 0; k < nroots; k++)
    live[roots[k]->id] = 1;
  for (int i = g->nnodes - 1; i >= 0; i--)
    for (int k = 0; live[i] && k < g->nodes[i]->nin; k++)
      if (g->nodes[i]->in[k])
        live[g->nodes[i]->in[k]->id] = 1;
  int n = 0;
  for (int i = 0; i < g->nnodes; i++)
    if (live[i])
      order[n++] = i;
  return n;
}

/* The back end's passes up to stage upto (0 decompose, 1 schedule, 2 plan):
 * forward; with a training plan, loss and train. */
void build_passes(Graph *g, const Plan *pl, int fuse, int upto, BPass **ps) {
  int *order = arena_alloc(g->arena, sizeof(int) * (size_t)(g->nnodes + 1));
  int n = needed(g, g->outputs, g->noutputs, order), via = 0;
  ps[PASS_FORWARD] = build_pass(g, PASS_FORWARD, order, n, n);
  if (pl) {
    int *lorder = arena_alloc(g->arena, sizeof(int) * (size_t)(g->nnodes + 1));
    int ln = needed(g, &g->loss, 1, lorder);
    /* the loss is an output and needs every node the outputs do: the loss
     * pass is the forward pass (printed once) */
    for (int k = 0; k < g->noutputs && !via; k++)
      if (g->outputs[k] == g->loss && ln == n && !memcmp(order, lorder, sizeof(int) * (size_t)n))
        via = k + 1;
    ps[PASS_LOSS] = build_pass(g, PASS_LOSS, lorder, ln, ln);
    ps[PASS_TRAIN] = build_pass(g, PASS_TRAIN, pl->order, pl->n, pl->nfwd);
  }
  for (int k = 0; k < NPASS; k++)
    if (ps[k] && upto >= 1) {
      schedule(ps[k], fuse);
      if (upto >= 2)
        plan(ps[k]);
    }
  if (via && upto >= 2) { /* the forward's arena, then its outputs but the loss */
    BPass *f = ps[PASS_FORWARD], *l = ps[PASS_LOSS];
    l->via_forward = via;
    l->out_at = arena_alloc(g->arena, sizeof(int64_t) * (size_t)(f->nfinals + 1));
    int64_t at = (f->arena + 255) & ~(int64_t)255;
    for (int k = 0; k < f->nfinals; k++)
      if (k != via - 1) {
        l->out_at[k] = at;
        at += (layout_bytes(f, f->finals[k]) + 255) & ~(int64_t)255;
      }
    l->arena = at;
  }
}

/* The arena each pass needs (tgen planned it for the dims' maxima). */
static void emit_arena_table(E *e, Buf *b) {
  P("/* The arena of each pass (forward, loss, train) in bytes, planned by tgen\n"
    " * for each dynamic dim's max; the passes place every intermediate in it. */\n");
  P("const int64_t %s_pass_arena[%s_NPASS] = {", e->name, e->NAME);
  for (int k = 0; k < NPASS; k++)
    P("%s%lld", k ? ", " : "", e->pass[k] ? (long long)e->pass[k]->arena : 0LL);
  P("};\n");
  P("/* Passes with dropout (never replayed from a CUDA graph: the mask follows the step). */\n");
  P("const int %s_pass_dropout[%s_NPASS] = {", e->name, e->NAME);
  for (int k = 0; k < NPASS; k++) {
    int d = 0;
    for (int i = 0; e->pass[k] && i < e->pass[k]->n; i++)
      d |= e->pass[k]->nodes[i]->op == OP_DROPOUT;
    P("%s%d", k ? ", " : "", d);
  }
  P("};\n");
  P("/* The inputs each pass reads (bit k: input k); the others may be NULL. */\n");
  P("const uint64_t %s_pass_inputs[%s_NPASS] = {", e->name, e->NAME);
  for (int k = 0; k < NPASS; k++) {
    uint64_t bits = 0;
    for (int i = 0; e->pass[k] && i < e->pass[k]->nb; i++)
      if (e->pass[k]->b[i].home == HOME_INPUT)
        bits |= (uint64_t)1 << e->pass[k]->b[i].index;
    P("%s0x%llxULL", k ? ", " : "", (unsigned long long)bits);
  }
  P("};\n");
  CompileMode mode = e->g->spec->compile.mode;
  int ro = mode != MODE_DEFAULT, mat = mode == MODE_MAX_AUTOTUNE;
  P("/* compile.mode %s: CUDA graphs %s, autotuned GEMMs %s by default (%s_set_graphs, %s_set_autotune switch). */\n",
    mat ? "max-autotune" : ro ? "reduce-overhead" : "default", ro ? "on" : "off", mat ? "on" : "off", e->name, e->name);
  P("const int %s_graphs_default = %d;\n", e->name, ro);
  P("const int %s_tune_default = %d;\n", e->name, mat);
}

/* ---------------------------------------------------------------- common: tables, guards */

static const char *init_c(E *e, InitKind k) {
  static const char *const n[] = {"ZEROS", "ZEROS", "ONES", "NORMAL", "UNIFORM", "XAVIER_UNIFORM", "KAIMING_UNIFORM"};
  return arena_printf(e->a, "%s_INIT_%s", e->NAME, n[k]);
}

/* The spec text of an input's dim k ("B", "(B * T)"), for guard messages. */
static const char *input_dim_text(E *e, int k, int j) {
  const TensorDecl *t = &e->g->spec->inputs[k];
  return j < t->rank ? expr_str(t->shape[j]) : "?";
}

/* The API's field for a dim, input or output: its spec name, with '_' appended
 * where C would break on it (c_reserved: int -> int_, linux -> linux_). */
static const char *field(E *e, const char *name) {
  return c_reserved(name, e->name) ? arena_printf(e->a, "%s_", name) : name;
}

/* The field's comment: the spec name when the field differs from it. */
static const char *field_note(E *e, const char *name) {
  return c_reserved(name, e->name) ? arena_printf(e->a, "; '%s' in the spec", name) : "";
}

static const char *common_file(E *e) {
  Graph *g = e->g;
  Buf bb, *b = &bb;
  buf_init(b, e->a);
  P("/* %s_common.c: what tgen knows about model %s at compile time (generated\n"
    " * from %s): dims and their guards, the param layout, input and output\n"
    " * shapes, and the typed forward entry point. */\n", e->name, e->name, e->o->spec_name);
  P("#include \"%s_rt.h\"\n#include \"%s.h\"\n\n#include <stdio.h>\n\n", e->name, e->name);
  int ndyn = 0;
  for (int k = 0; k < g->nsyms; k++)
    ndyn += !g->syms[k].derived;
  P("static const char *const sym_names[] = {");
  for (int k = 0; k < g->nsyms; k++)
    P("%s, ", cstr(e, g->syms[k].name));
  P("NULL};\nstatic const int64_t dyn_max[] = {");
  for (int k = 0; k < ndyn; k++)
    P("%lld, ", (long long)g->syms[k].max);
  P("0};\n\n/* params: name, checkpoint name, dtype, rank, shape, numel, byte offset, init */\n");
  P("static const %s_param_info params[] = {\n", e->name);
  for (int k = 0; k < g->nparams; k++) {
    Param *p = &g->params[k];
    P("  {%s, %s, %s, %d, {", cstr(e, p->name), cstr(e, p->ckpt), dtc(e, p->dtype), p->shape.rank);
    for (int i = 0; i < p->shape.rank; i++) {
      int64_t s;
      dim_is_const(&p->shape.d[i], &s);
      P("%s%lld", i ? ", " : "", (long long)s);
    }
    P("}, %lld, %lld, %s, %s, %s, %lld},\n", (long long)p->numel, (long long)e->pbyte[k], init_c(e, p->init),
      fnum(e, p->a), fnum(e, p->b), (long long)e->state[k]);
  }
  if (!g->nparams)
    P("  {NULL, NULL, 0, 0, {0}, 0, 0, 0, 0, 0, 0},\n");
  P("};\n\n/* runs of params of one dtype: bytes [b0, b1), elements, f32 state element, dtype */\n");
  P("static const %s_param_run runs[] = {\n", e->name);
  for (int r = 0; r < e->nruns; r++)
    P("  {%lld, %lld, %lld, %lld, %s},\n", (long long)e->runs[r].b0, (long long)e->runs[r].b1, (long long)e->runs[r].n,
      (long long)e->runs[r].f, dtc(e, e->runs[r].dt));
  if (!e->nruns)
    P("  {0, 0, 0, 0, 0},\n");
  P("};\n\nstatic const %s_io_info inputs[] = {\n", e->name);
  for (int k = 0; k < g->ninputs; k++)
    P("  {%s, %s, %d},\n", cstr(e, g->inputs[k].name), dtc(e, g->inputs[k].dtype), g->inputs[k].shape.rank);
  if (!g->ninputs)
    P("  {NULL, 0, 0},\n");
  P("};\n\nstatic const %s_io_info outputs[] = {\n", e->name);
  for (int k = 0; k < g->noutputs; k++)
    P("  {%s, %s, %d},\n", cstr(e, g->output_names[k]), dtc(e, g->outputs[k]->dtype), g->outputs[k]->shape.rank);
  P("};\n\nstatic const int wrt[] = {");
  for (int j = 0; j < g->nwrt; j++)
    P("%d, ", g->wrt[j]);
  P("-1};\n\n");
  P("const %s_model_info %s_info = {%s, %d, %d, sym_names, dyn_max, %d, params, %lld, %d, %d, inputs, outputs, %lluULL,\n",
    e->name, e->name, cstr(e, e->name), g->nsyms, ndyn, g->nparams, (long long)e->param_bytes, g->ninputs, g->noutputs,
    (unsigned long long)g->spec->seed);
  const Train *tr = &g->spec->train;
  int metric_out = -1, metric_in = -1;
  if (g->loss && g->loss->op == OP_CROSS_ENTROPY && g->loss->in[1]->op == OP_INPUT)
    for (int k = 0; k < g->noutputs; k++)
      if (g->outputs[k] == g->loss->in[0] && g->outputs[k]->shape.rank == 2) {
        metric_out = k;
        metric_in = g->loss->in[1]->index;
      }
  P("  /* training: loss and its dtype, optimizer (0 none, 1 sgd, 2 adamw), lr, beta1, beta2, eps, weight_decay, momentum,\n"
    "   * grad_clip (0 = none); accuracy from output %%d against input %%d (-1: none) */\n");
  P("  %s, %s, %d, %s, %s, %s, %s, %s, %s, %s, %d, %d, %d, runs, %lld, %d,\n"
    "  /* train.wrt: the inputs whose gradients the train pass writes */\n  %d, wrt};\n\n",
    g->loss ? cstr(e, g->spec->train.loss.name) : "NULL", dtc(e, g->loss ? g->loss->dtype : DT_F32), g->loss ? (int)tr->opt : 0, fnum(e, tr->lr), fnum(e, tr->beta1), fnum(e, tr->beta2), fnum(e, tr->eps),
    fnum(e, tr->weight_decay), fnum(e, tr->momentum), fnum(e, tr->has_clip ? tr->grad_clip : 0), metric_out, metric_in,
    e->nruns, (long long)e->state_elems, e->need_master, g->nwrt);

  /* guards */
  P("/* The dims of a call: each dynamic dim within [1, max]; derived sizes\n * (non-exact divisions) must divide. */\n");
  P("int %s_compute_syms(const int64_t *dyn, int64_t *sym, char *err, size_t errlen) {\n", e->name);
  for (int k = 0; k < g->nsyms; k++) {
    Sym *s = &g->syms[k];
    if (!s->derived) {
      P("  if (dyn[%d] < 1 || dyn[%d] > %lld) {\n", k, k, (long long)s->max);
      P("    snprintf(err, errlen, \"dim %s is %%lld, outside [1, %lld]\", (long long)dyn[%d]);\n", s->name,
        (long long)s->max, k);
      P("    return %s_EINVAL;\n  }\n", e->NAME);
      P("  const int64_t %s = sym[%d] = dyn[%d];\n", sym_var(g, k), k, k);
    } else {
      P("  const int64_t n%d = %s, m%d = %s;\n", k, c_dim(g, &s->num), k, c_dim(g, &s->den));
      P("  if (m%d == 0 || n%d %% m%d) {\n", k, k, k);
      P("    snprintf(err, errlen, \"%s does not divide: %%lld / %%lld\", (long long)n%d, (long long)m%d);\n",
        s->name, k, k);
      P("    return %s_EINVAL;\n  }\n", e->NAME);
      P("  const int64_t %s = sym[%d] = n%d / m%d;\n", sym_var(g, k), k, k, k);
    }
    P("  (void)%s;\n", sym_var(g, k));
  }
  P("  (void)dyn; (void)sym; (void)err; (void)errlen;\n  return %s_OK;\n}\n\n", e->NAME);

  /* io shapes */
  P("void %s_io_shape(int is_output, int k, const int64_t *sym, int64_t *shape) {\n", e->name);
  emit_sym_locals(e, b);
  P("  static const int8_t none = 0; (void)none;\n  if (!is_output) {\n    switch (k) {\n");
  for (int k = 0; k < g->ninputs; k++) {
    P("    case %d:", k);
    for (int i = 0; i < g->inputs[k].shape.rank; i++)
      P(" shape[%d] = %s;", i, c_dim(g, &g->inputs[k].shape.d[i]));
    P(" return;\n");
  }
  P("    }\n  }\n  switch (k) {\n");
  for (int k = 0; k < g->noutputs; k++) {
    P("  case %d:", k);
    for (int i = 0; i < g->outputs[k]->shape.rank; i++)
      P(" shape[%d] = %s;", i, c_dim(g, &g->outputs[k]->shape.d[i]));
    P(" return;\n");
  }
  P("  }\n}\n\n");

  /* the spec text of each input dim, for the runner's messages */
  P("const char *const %s_input_dim_text[][%d] = {\n", e->name, MAXRANK);
  for (int k = 0; k < g->ninputs; k++) {
    P("  {");
    for (int i = 0; i < g->inputs[k].shape.rank; i++)
      P("%s%s", i ? ", " : "", cstr(e, input_dim_text(e, k, i)));
    P("%s},\n", g->inputs[k].shape.rank ? "" : "NULL");
  }
  if (!g->ninputs)
    P("  {NULL},\n");
  P("};\n\n");

  emit_arena_table(e, b);
  P("\n");

  /* typed entry points */
  const char *dv = "NULL";
  P("/* dims and inputs as arrays */\n#define DIMS_INPUTS(what) \\\n");
  P("  if (!m)                                                              \\\n    return %s_EINVAL;                                                  \\\n", e->NAME);
  P("  if (%d && !in)                                                        \\\n    return %s_fail(m, %s_EINVAL, \"%%s: in is NULL\", what);          \\\n", g->ninputs, e->name, e->NAME);
  P("  const void *iv[%d] = {", g->ninputs ? g->ninputs : 1);
  for (int k = 0; k < g->ninputs; k++)
    P("%sin->%s", k ? ", " : "", field(e, g->inputs[k].name));
  P("%s};                                                               \\\n", g->ninputs ? "" : "NULL");
  if (ndyn) {
    P("  if (!dims)                                                           \\\n    return %s_fail(m, %s_EINVAL, \"%%s: dims is NULL\", what);        \\\n", e->name, e->NAME);
    P("  const int64_t dv[%d] = {", ndyn);
    for (int k = 0, j = 0; k < g->nsyms; k++)
      if (!g->syms[k].derived)
        P("%sdims->%s", j++ ? ", " : "", field(e, g->syms[k].name));
    P("};\n\n");
    dv = "dv";
  } else {
    P("  (void)dims;\n\n");
  }
  P("%s_status %s_forward(%s_model *m, const %s_dims *dims, const %s_inputs *in, %s_outputs *out) {\n", e->name,
    e->name, e->name, e->name, e->name, e->name);
  P("  DIMS_INPUTS(\"forward\");\n  if (!out)\n    return %s_fail(m, %s_EINVAL, \"forward: out is NULL\");\n", e->name, e->NAME);
  P("  void *ov[%d] = {", g->noutputs);
  for (int k = 0; k < g->noutputs; k++)
    P("%sout->%s", k ? ", " : "", field(e, g->output_names[k]));
  P("};\n  return %s_forward_v(m, %s, iv, ov);\n}\n\n", e->name, dv);
  static const char *const tfn[] = {"loss", "forward_backward", "train_step"};
  for (int k = 0; k < 3; k++) {
    P("%s_status %s_%s(%s_model *m, const %s_dims *dims, const %s_inputs *in, float *loss) {\n", e->name, e->name,
      tfn[k], e->name, e->name, e->name);
    P("  DIMS_INPUTS(\"%s\");\n  return %s_%s_v(m, %s, iv, loss);\n}\n\n", tfn[k], e->name, tfn[k], dv);
  }
  if (g->nwrt) {
    P("%s_status %s_forward_backward_wrt(%s_model *m, const %s_dims *dims, const %s_inputs *in, %s_input_grads *d_in, float *loss) {\n",
      e->name, e->name, e->name, e->name, e->name, e->name);
    P("  DIMS_INPUTS(\"forward_backward_wrt\");\n  if (!d_in)\n    return %s_fail(m, %s_EINVAL, \"forward_backward_wrt: d_in is NULL\");\n",
      e->name, e->NAME);
    P("  void *gv[%d] = {", g->nwrt);
    for (int j = 0; j < g->nwrt; j++)
      P("%sd_in->%s", j ? ", " : "", g->inputs[g->wrt[j]].name);
    P("};\n  return %s_forward_backward_wrt_v(m, %s, iv, gv, loss);\n}\n\n", e->name, dv);
  }
  return b->p;
}

/* ---------------------------------------------------------------- public header */

static const char *api_types(E *e) {
  Graph *g = e->g;
  Buf bb, *b = &bb;
  buf_init(b, e->a);
  int ndyn = 0;
  for (int k = 0; k < g->nsyms; k++)
    ndyn += !g->syms[k].derived;
  P("/* Dynamic dims of one call (each 1 <= value <= its max). */\ntypedef struct %s_dims {\n", e->name);
  for (int k = 0; k < g->nsyms; k++)
    if (!g->syms[k].derived)
      P("  int64_t %s; /* max %lld%s */\n", field(e, g->syms[k].name), (long long)g->syms[k].max,
        field_note(e, g->syms[k].name));
  if (!ndyn)
    P("  int64_t unused; /* the model has no dynamic dims: pass NULL */\n");
  P("} %s_dims;\n\n/* Inputs: caller buffers, row-major. */\ntypedef struct %s_inputs {\n", e->name, e->name);
  for (int k = 0; k < g->ninputs; k++)
    P("  const %s *%s; /* %s%s%s */\n", ctype(g->inputs[k].dtype), field(e, g->inputs[k].name),
      dtype_names[g->inputs[k].dtype], shape_str(g, &g->inputs[k].shape), field_note(e, g->inputs[k].name));
  if (!g->ninputs)
    P("  const void *unused; /* the model has no inputs */\n");
  P("} %s_inputs;\n\n/* Outputs: caller buffers, written by %s_forward. */\ntypedef struct %s_outputs {\n", e->name,
    e->name, e->name);
  for (int k = 0; k < g->noutputs; k++)
    P("  %s *%s; /* %s%s%s */\n", ctype(g->outputs[k]->dtype), field(e, g->output_names[k]),
      dtype_names[g->outputs[k]->dtype], shape_str(g, &g->outputs[k]->shape), field_note(e, g->output_names[k]));
  P("} %s_outputs;\n", e->name);
  if (g->nwrt) {
    P("\n/* Gradients w.r.t. the inputs train.wrt lists: caller buffers, written by\n"
      " * %s_forward_backward_wrt (d loss / d input, the input's shape). */\ntypedef struct %s_input_grads {\n",
      e->name, e->name);
    for (int j = 0; j < g->nwrt; j++) {
      const Input *x = &g->inputs[g->wrt[j]];
      P("  %s *%s; /* %s%s */\n", ctype(x->dtype), x->name, dtype_names[x->dtype], shape_str(g, &x->shape));
    }
    P("} %s_input_grads;\n\n", e->name);
    P("/* Loss, every param's gradient (the gradient buffer) and d loss / d input\n"
      " * for each input in train.wrt, into d_in's buffers (device memory on \"cuda\").\n"
      " * The step count is unchanged. */\n");
    P("%s_status %s_forward_backward_wrt(%s_model *m, const %s_dims *dims, const %s_inputs *in, %s_input_grads *d_in, float *loss);\n",
      e->name, e->name, e->name, e->name, e->name, e->name);
  }
  return b->p;
}

/* ---------------------------------------------------------------- golden vectors */

/* Rough cost of the interpreter at the test dims, in flops. */
static double forward_cost(const Graph *g, const int64_t *sym) {
  double c = 0;
  for (int i = 0; i < g->nnodes; i++) {
    const Node *n = g->nodes[i];
    Tensor t;
    char err[128];
    if (!concrete_shape(g, &n->shape, sym, &t, err, sizeof err))
      return 1e30;
    double k = 1;
    int att = n->op == OP_ATTENTION || n->op == OP_ATTENTION_LSE || n->op == OP_ATTENTION_BACKWARD;
    if (n->op == OP_MATMUL || n->op == OP_LINEAR || att) {
      const Node *a = n->in[0];
      int64_t kk;
      if (!dim_eval(g, &a->shape.d[a->shape.rank - 1], sym, &kk, &(const char *){0}))
        return 1e30;
      k = 2.0 * (double)kk * (att ? 4 : 1);
    }
    c += (double)t.numel * (k > 10 ? k : 10);
  }
  return c;
}

static void *tensor_bytes(E *e, const Tensor *t, DType dt) {
  void *p = arena_alloc(e->a, (size_t)(t->numel * dtype_size(dt)) + 8);
  for (int64_t i = 0; i < t->numel; i++)
    tgm_put(p, (int)dt, i, t->data[i]);
  return p;
}

/* The least precise floating dtype among the nodes `root` depends on (all
 * nodes: root NULL): the golden tests' tolerance follows it, since an f32
 * result computed from bf16 values carries bf16 errors. */
static DType cone_dtype(E *e, const Node *root) {
  Graph *g = e->g;
  char *live = arena_alloc(e->a, (size_t)g->nnodes + 1);
  DType worst = DT_F32;
  if (root)
    live[root->id] = 1;
  for (int i = g->nnodes - 1; i >= 0; i--) {
    const Node *n = g->nodes[i];
    if (root && !live[i])
      continue;
    for (int k = 0; k < n->nin; k++)
      if (n->in[k])
        live[n->in[k]->id] = 1;
    if (n->dtype == DT_BF16 || (n->dtype == DT_F16 && worst == DT_F32))
      worst = n->dtype;
  }
  return worst;
}

/* Steps of train_step whose losses the golden file holds. */
#define GOLDEN_TRAIN_STEPS 3

/* tests/golden.safetensors: meta.dims, meta.seed, the inputs by name and
 * expected.NAME for every output, computed by the reference interpreter;
 * with train:, the loss and gradients of the first step and the losses of
 * the first GOLDEN_TRAIN_STEPS steps (expected.train_losses).
 * Returns 0 and sets *why when the model is too large to evaluate here. */
static int golden(E *e, const char **why) {
  Graph *g = e->g;
  int64_t *sym = e->test_sym;
  if (forward_cost(g, sym) > e->o->golden_budget) {
    *why = arena_printf(e->a, "the reference forward pass at the test dims costs about %.1f GFLOP (limit %.1f)",
                        forward_cost(g, sym) / 1e9, e->o->golden_budget / 1e9);
    return 0;
  }
  /* the same inputs and params the emitted tests and tgen eval use */
  Tensor *ins = NULL, *ps = NULL, *vals = calloc((size_t)g->nnodes + 1, sizeof(Tensor));
  char err[512];
  int ok = vals && interp_make_args(g, sym, g->spec->seed, &ins, &ps, err, sizeof err) == 0;
  if (!vals)
    snprintf(err, sizeof err, "out of memory");
  InterpOptions opt = {sym, 0, g->spec->seed, 0};
  int ran = ok && interp_run(g, &opt, ins, ps, vals, err, sizeof err) == 0;
  /* training: loss and gradients (params, then train.wrt inputs) with dropout
   * on (step 0), as the train pass; not for models whose gradients would bloat
   * the project (over 4M params) */
  int train = g->grads != NULL && g->param_numel <= ((int64_t)4 << 20);
  Tensor *tv = train ? calloc((size_t)g->nnodes + 1, sizeof(Tensor)) : NULL;
  InterpOptions topt = {sym, 1, g->spec->seed, 0};
  if (ran && train && (!tv || interp_run(g, &topt, ins, ps, tv, err, sizeof err))) {
    if (!tv)
      snprintf(err, sizeof err, "out of memory");
    ran = 0;
    interp_free(g, vals);
  }
  if (ok && !ran)
    *why = arena_printf(e->a, "the reference interpreter failed: %s", err);
  if (ran) {
    int n = 3 + g->ninputs + 2 * g->noutputs + (train ? 2 + g->ngrads : 0), t = 0;
    tgm_tensor_desc *d = arena_alloc(e->a, sizeof(tgm_tensor_desc) * (size_t)n);
    int32_t *dims = arena_alloc(e->a, sizeof(int32_t) * (MAXSYM + 1)), *seed = arena_alloc(e->a, 8);
    int ndyn = 0;
    for (int k = 0; k < g->nsyms; k++)
      if (!g->syms[k].derived)
        dims[1 + ndyn++] = (int32_t)sym[k];
    dims[0] = ndyn;
    seed[0] = (int32_t)(uint32_t)g->spec->seed;
    seed[1] = (int32_t)(uint32_t)(g->spec->seed >> 32);
    d[t++] = (tgm_tensor_desc){"meta.dims", TGM_I32, 1, {ndyn + 1}, dims};
    d[t++] = (tgm_tensor_desc){"meta.seed", TGM_I32, 1, {2}, seed};
    for (int k = 0; k < g->ninputs; k++) {
      tgm_tensor_desc x = {g->inputs[k].name, (int)g->inputs[k].dtype, ins[k].rank, {0}, NULL};
      memcpy(x.shape, ins[k].shape, sizeof x.shape);
      x.data = tensor_bytes(e, &ins[k], g->inputs[k].dtype);
      d[t++] = x;
    }
    for (int k = 0; k < g->noutputs; k++) {
      const Tensor *o = &vals[g->outputs[k]->id];
      tgm_tensor_desc x = {arena_printf(e->a, "expected.%s", g->output_names[k]), (int)DT_F32, o->rank, {0}, NULL};
      memcpy(x.shape, o->shape, sizeof x.shape);
      x.data = tensor_bytes(e, o, DT_F32); /* the exact values, rounded once to f32 */
      d[t++] = x;
    }
    /* the least precise dtype each output (and the training step) depends on */
    for (int k = 0; k <= g->noutputs; k++) {
      int32_t *v = arena_alloc(e->a, 8);
      v[0] = (int32_t)cone_dtype(e, k < g->noutputs ? g->outputs[k] : NULL);
      d[t++] = (tgm_tensor_desc){k < g->noutputs ? arena_printf(e->a, "meta.dtype.%s", g->output_names[k]) : "meta.dtype",
                                 TGM_I32, 0, {0}, v};
    }
    for (int k = 0; train && k <= g->ngrads; k++) { /* grad.<param checkpoint name>, then grad.<wrt input> */
      const Tensor *o = &tv[(k ? g->grads[k - 1] : g->loss)->id];
      const char *gname = !k ? NULL : k - 1 < g->nparams ? g->params[k - 1].ckpt : g->inputs[g->wrt[k - 1 - g->nparams]].name;
      tgm_tensor_desc x = {k ? arena_printf(e->a, "expected.grad.%s", gname) : "expected.train_loss",
                           (int)DT_F32, o->rank, {0}, NULL};
      memcpy(x.shape, o->shape, sizeof x.shape);
      x.data = tensor_bytes(e, o, DT_F32);
      d[t++] = x;
    }
    /* the losses of the first train_steps from these params (none if the reference diverges) */
    double tl[GOLDEN_TRAIN_STEPS];
    if (train && interp_train(g, &opt, ins, ps, GOLDEN_TRAIN_STEPS, tl, err, sizeof err) == 0) {
      float *f = arena_alloc(e->a, sizeof(float) * GOLDEN_TRAIN_STEPS);
      for (int s = 0; s < GOLDEN_TRAIN_STEPS; s++)
        f[s] = (float)tl[s];
      d[t++] = (tgm_tensor_desc){"expected.train_losses", TGM_F32, 1, {GOLDEN_TRAIN_STEPS}, f};
    }
    /* serialise in memory through a temp file (the writer is the runtime's) */
    char path[] = "/tmp/tgen-golden-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || tgm_st_write(path, d, t, err, sizeof err)) {
      *why = arena_printf(e->a, "writing golden vectors: %s", fd < 0 ? strerror(errno) : err);
      ran = 0;
    } else {
      size_t len;
      char *data = read_file_max(e->a, path, &len, (size_t)1 << 40);
      if (data)
        add_binary(e, "tests/golden.safetensors", data, len);
      ran = data != NULL;
    }
    if (fd >= 0) {
      close(fd);
      unlink(path);
    }
    interp_free(g, vals);
    if (train)
      interp_free(g, tv);
  }
  if (ok)
    interp_free_args(g, ins, ps);
  free(vals);
  free(tv);
  if (!ok && !*why)
    *why = arena_printf(e->a, "%s", err);
  return ran;
}

/* ---------------------------------------------------------------- README */

static const char *readme(E *e, const char *golden_note) {
  Graph *g = e->g;
  Buf bb, *b = &bb;
  buf_init(b, e->a);
  const char *t = keep_sections(e, "project/README.md", instantiate(e, "project/README.md"));
  Buf k;
  buf_init(&k, e->a);
  if (g->grads) { /* the partitioner's choice, in its own words */
    Buf sum;
    buf_init(&sum, e->a);
    print_plan_summary(g, &e->plan, &sum);
    buf_printf(&k, "Training step: %s\n", sum.p);
  }
  char *recomputed = arena_alloc(e->a, (size_t)g->nnodes + 1);
  for (int i = e->plan.nfwd; g->grads && i < e->plan.n; i++)
    if (e->plan.order[i] < g->nforward)
      recomputed[e->plan.order[i]] = 1;
  buf_printf(&k, "Kernels and arena (every intermediate of a pass lives in its arena, at offsets tgen planned for each dynamic dim's max):\n\n| pass | kernels | arena |\n| --- | --- | --- |\n");
  for (int q = 0; q < NPASS; q++)
    if (e->pass[q])
      buf_printf(&k, "| %s | %d%s | %lld bytes (%.1f MiB) |\n", pass_names[q], e->pass[q]->nk,
                 e->pass[q]->via_forward ? " (the forward pass's: it calls it, the outputs but the loss in its arena)" : "",
                 (long long)e->pass[q]->arena, (double)e->pass[q]->arena / 1048576.0);
  buf_printf(&k, "\nThe graph's ops (`tgen check MODEL --dump-after schedule` shows which kernel computes each):\n\n");
  buf_printf(&k, "| node | op | result | spec | part |\n| --- | --- | --- | --- | --- |\n");
  for (int i = 0; i < g->nnodes; i++) {
    Node *n = g->nodes[i];
    if (n->op == OP_INPUT || n->op == OP_PARAM)
      continue;
    const char *part = !g->grads ? "forward"
                       : i >= g->nforward ? "backward"
                       : e->plan.saved[i] ? "forward, saved for the backward"
                       : recomputed[i]    ? "forward, recomputed in the backward"
                                          : "forward";
    buf_printf(&k, "| %%%d | %s%s | %s | %s | %s |\n", n->id, op_info[n->op].name, op_info[n->op].cls == C_VIEW ? " (view)" : "",
               shape_comment(e, n), origin(e, n), part);
  }
  Buf p;
  buf_init(&p, e->a);
  buf_printf(&p, "| param | checkpoint name | dtype | shape | byte offset | init |\n| --- | --- | --- | --- | --- | --- |\n");
  for (int i = 0; i < g->nparams; i++)
    buf_printf(&p, "| %s | %s | %s | %s | %lld | %s |\n", g->params[i].name, g->params[i].ckpt,
               dtype_names[g->params[i].dtype], shape_str(g, &g->params[i].shape), (long long)e->pbyte[i],
               init_names[g->params[i].init]);
  Buf io;
  buf_init(&io, e->a);
  for (int i = 0; i < g->ninputs; i++)
    buf_printf(&io, "- input `%s`: %s%s\n", g->inputs[i].name, dtype_names[g->inputs[i].dtype], shape_str(g, &g->inputs[i].shape));
  for (int i = 0; i < g->noutputs; i++)
    buf_printf(&io, "- output `%s`: %s%s\n", g->output_names[i], dtype_names[g->outputs[i]->dtype],
               shape_str(g, &g->outputs[i]->shape));
  for (int j = 0; j < g->nwrt; j++)
    buf_printf(&io, "- gradient of input `%s` (train.wrt): %s%s, written by `%s_forward_backward_wrt`\n",
               g->inputs[g->wrt[j]].name, dtype_names[g->inputs[g->wrt[j]].dtype],
               shape_str(g, &g->inputs[g->wrt[j]].shape), e->name);
  for (int k2 = 0; k2 < g->nsyms; k2++)
    if (!g->syms[k2].derived)
      buf_printf(&io, "- dynamic dim `%s`: 1 to %lld\n", g->syms[k2].name, (long long)g->syms[k2].max);
  t = replace_section(e, t, "IO", io.p);
  t = replace_section(e, t, "PARAMS", p.p);
  t = replace_section(e, t, "KERNELS", k.p);
  t = replace_section(e, t, "GOLDEN", golden_note);
  P("%s", t);
  return b->p;
}

/* ---------------------------------------------------------------- writing the tree */

static int write_all(const char *path, const char *data, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f)
    return -1;
  size_t w = fwrite(data, 1, len, f);
  int rc = fclose(f);
  return w == len && rc == 0 ? 0 : -1;
}

static int mkdirs(char *path) { /* mkdir -p of the parent directories of path */
  for (char *s = path + 1; *s; s++)
    if (*s == '/') {
      *s = 0;
      int rc = mkdir(path, 0777);
      *s = '/';
      if (rc && errno != EEXIST)
        return -1;
    }
  return 0;
}

static int rm_rf(const char *path) {
  struct stat st;
  if (lstat(path, &st))
    return errno == ENOENT ? 0 : -1;
  if (S_ISDIR(st.st_mode)) {
    DIR *d = opendir(path);
    if (!d)
      return -1;
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d))) {
      if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
        continue;
      size_t n = strlen(path) + strlen(de->d_name) + 2;
      char *p = malloc(n);
      if (!p) {
        rc = -1;
        break;
      }
      snprintf(p, n, "%s/%s", path, de->d_name);
      rc |= rm_rf(p);
      free(p);
    }
    closedir(d);
    return rc | rmdir(path);
  }
  return unlink(path);
}

#define MARKER ".tgen-output"

/* The files of an output directory that are tgen's: the marker, the files it
 * writes now and those its marker lists from the last run ("file: PATH"
 * lines). Everything else (build/, a trained checkpoint) is the user's. */
typedef struct Owned {
  Vec paths; /* const char * */
} Owned;

static void own(E *e, Owned *o, const char *path) { vec_push(e->a, &o->paths, (void *)arena_strdup(e->a, path)); }

/* Adds the paths that DIR's marker lists; 0 when it lists none (a marker of an
 * older tgen, or none at all). */
static int own_listed(E *e, Owned *o, const char *dir) {
  size_t len;
  char *m = read_file_max(e->a, arena_printf(e->a, "%s/%s", dir, MARKER), &len, (size_t)1 << 24);
  int n = 0;
  for (char *line = m; line && *line;) {
    char *nl = strchr(line, '\n');
    if (nl)
      *nl = 0;
    if (!strncmp(line, "file: ", 6) && line[6])
      own(e, o, line + 6), n++;
    line = nl ? nl + 1 : NULL;
  }
  return n;
}

/* 1: `rel` is one of tgen's files; 2: a directory holding some; 0: neither. */
static int owned(const Owned *o, const char *rel) {
  size_t n = strlen(rel);
  int inside = 0;
  if (!strcmp(rel, MARKER))
    return 1;
  for (int i = 0; i < o->paths.n; i++) {
    const char *p = o->paths.p[i];
    if (!strcmp(p, rel))
      return 1;
    inside |= !strncmp(p, rel, n) && p[n] == '/';
  }
  return inside ? 2 : 0;
}

/* Move what is the user's in FROM (an old output) to the same place in TO (the
 * new one): whole directories where they hold nothing of tgen's. Returns the
 * number of entries that could not be moved (they stay in FROM). */
static int move_user_files(E *e, const Owned *o, const char *from, const char *to, const char *rel) {
  const char *dir = rel ? arena_printf(e->a, "%s/%s", from, rel) : from;
  DIR *d = opendir(dir);
  if (!d)
    return 1;
  int left = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
      continue;
    const char *r = rel ? arena_printf(e->a, "%s/%s", rel, de->d_name) : arena_strdup(e->a, de->d_name);
    int k = owned(o, r);
    struct stat st;
    const char *src = arena_printf(e->a, "%s/%s", from, r);
    if (k == 2 && !lstat(src, &st) && S_ISDIR(st.st_mode)) {
      left += move_user_files(e, o, from, to, r);
    } else if (!k) {
      char *dst = arena_printf(e->a, "%s/%s", to, r);
      if (!lstat(dst, &st) || mkdirs(dst) || rename(src, dst))
        left++;
    }
  }
  closedir(d);
  return left;
}

/* rm -rf of an output tgen made, its marker last: a run killed meanwhile
 * leaves a leftover that recover() still knows as tgen's. */
static int rm_output(E *e, const char *dir) {
  DIR *d = opendir(dir);
  if (!d)
    return rm_rf(dir);
  int rc = 0;
  struct dirent *de;
  while ((de = readdir(d)))
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && strcmp(de->d_name, MARKER))
      rc |= rm_rf(arena_printf(e->a, "%s/%s", dir, de->d_name));
  closedir(d);
  return rc | rm_rf(dir);
}

/* renameat2(RENAME_EXCHANGE): swaps two paths atomically (Linux 3.15+). */
static int exchange(const char *a, const char *b) {
#ifdef SYS_renameat2
  return (int)syscall(SYS_renameat2, AT_FDCWD, a, AT_FDCWD, b, 2 /* RENAME_EXCHANGE */);
#else
  (void)a, (void)b;
  errno = ENOSYS;
  return -1;
#endif
}

/* OUT.old-PID: the old output during a swap without exchange() (and in older
 * tgens); OUT.tmp-PID: the new one before the swap, the old one after it. A
 * run killed in between leaves them: the next run finishes its work. With no
 * OUT, an OUT.old-PID is the complete old output: it goes back. In any other
 * leftover, what its marker does not list is the user's and moves to OUT; the
 * rest is deleted. Leftovers of a live tgen are not touched. */
static void recover(E *e, const char *out) {
  char *parent = arena_strdup(e->a, out), *slash = strrchr(parent, '/');
  const char *base = slash ? slash + 1 : out;
  if (slash)
    *(slash == parent ? slash + 1 : slash) = 0;
  else
    parent = ".";
  size_t bn = strlen(base);
  DIR *d = opendir(parent);
  if (!d)
    return;
  struct dirent *de;
  while ((de = readdir(d))) {
    const char *n = de->d_name, *tail = n + bn;
    if (strncmp(n, base, bn) || (strncmp(tail, ".tmp-", 5) && strncmp(tail, ".old-", 5)))
      continue;
    char *end;
    long pid = strtol(tail + 5, &end, 10);
    if (*end || pid <= 0 || pid == (long)getpid() || !(kill((pid_t)pid, 0) && errno == ESRCH))
      continue;
    const char *left = arena_printf(e->a, "%s/%s", parent, n);
    struct stat st;
    if (lstat(left, &st) || !S_ISDIR(st.st_mode) || !rmdir(left) ||
        access(arena_printf(e->a, "%s/%s", left, MARKER), F_OK))
      continue; /* not tgen's (write_tree writes the marker first), or empty and now gone */
    if (!strncmp(tail, ".old-", 5) && stat(out, &st) && !rename(left, out)) {
      fprintf(stderr, "tgen: %s: restored from %s, left by an interrupted run\n", out, left);
      continue;
    }
    Owned o = {0};
    if (own_listed(e, &o, left) && !stat(out, &st) && move_user_files(e, &o, left, out, NULL)) {
      fprintf(stderr, "tgen: warning: %s (left by an interrupted run) holds files that could not be moved back "
              "into %s; it is kept\n", left, out);
      continue;
    }
    rm_output(e, left);
  }
  closedir(d);
}

/* Write the files into OUT.tmp-PID, then swap it with OUT atomically. An
 * existing OUT is replaced only if tgen made it (it holds the marker file),
 * and then only tgen's files are: the user's move into the new OUT. A symlink
 * OUT is followed: its target is updated. */
static int write_tree(E *e, const char *out, char *err, size_t errlen) {
  struct stat st;
  if (!lstat(out, &st) && S_ISLNK(st.st_mode)) {
    char *real = realpath(out, NULL);
    if (!real) {
      snprintf(err, errlen, "%s: a symlink whose target cannot be resolved: %s", out, strerror(errno));
      return -1;
    }
    out = arena_strdup(e->a, real);
    free(real);
  }
  recover(e, out);
  int exists = stat(out, &st) == 0;
  if (exists) {
    char *m = arena_printf(e->a, "%s/%s", out, MARKER);
    if (!S_ISDIR(st.st_mode) || access(m, F_OK)) {
      snprintf(err, errlen, "%s: exists and was not created by tgen (no %s file); refusing to overwrite it", out, MARKER);
      return -1;
    }
  }
  /* the marker lists the files, so that the next run knows which are tgen's */
  Owned o = {0};
  int marker = -1;
  for (int i = 0; i < e->files.n; i++) {
    OutFile *f = e->files.p[i];
    if (!strcmp(f->path, MARKER)) {
      marker = i;
      Buf b;
      buf_init(&b, e->a);
      buf_printf(&b, "%s", f->data);
      for (int j = 0; j < e->files.n; j++)
        if (j != i)
          buf_printf(&b, "file: %s\n", ((OutFile *)e->files.p[j])->path);
      f->data = b.p;
      f->len = b.len;
    } else {
      own(e, &o, f->path);
    }
  }
  const char *tmp = arena_printf(e->a, "%s.tmp-%ld", out, (long)getpid());
  const char *old = arena_printf(e->a, "%s.old-%ld", out, (long)getpid());
  rm_output(e, tmp);
  if (mkdirs(arena_strdup(e->a, tmp)) || mkdir(tmp, 0777)) {
    snprintf(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
    return -1;
  }
  for (int k = -1; k < e->files.n; k++) { /* the marker first: a leftover without one is not tgen's */
    int i = k < 0 ? marker : k;
    if (i < 0 || k == marker)
      continue;
    OutFile *f = e->files.p[i];
    char *p = arena_printf(e->a, "%s/%s", tmp, f->path);
    if (mkdirs(p) || write_all(p, f->data, f->len)) {
      snprintf(err, errlen, "%s: cannot write: %s", p, strerror(errno));
      rm_output(e, tmp);
      return -1;
    }
  }
  if (!exists) {
    if (rename(tmp, out)) {
      snprintf(err, errlen, "%s: cannot rename %s into place: %s", out, tmp, strerror(errno));
      rm_output(e, tmp);
      return -1;
    }
    return 0;
  }
  own_listed(e, &o, out);
  const char *prev = tmp; /* where the old output ends up */
  if (exchange(tmp, out)) { /* no atomic exchange here: two renames (recover() mends a kill between them) */
    if (rename(out, old)) {
      snprintf(err, errlen, "%s: cannot move the old output aside: %s", out, strerror(errno));
      rm_output(e, tmp);
      return -1;
    }
    if (rename(tmp, out)) {
      snprintf(err, errlen, "%s: cannot rename %s into place: %s", out, tmp, strerror(errno));
      rename(old, out);
      rm_output(e, tmp);
      return -1;
    }
    prev = old;
  }
  if (move_user_files(e, &o, prev, out, NULL)) {
    fprintf(stderr, "tgen: warning: some of your files in the old %s could not be moved into the new one; they "
            "are kept in %s\n", out, prev);
    return 0;
  }
  rm_output(e, prev);
  return 0;
}

/* ---------------------------------------------------------------- entry */

static const char *upper(Arena *a, const char *s) {
  char *u = arena_strdup(a, s);
  for (char *p = u; *p; p++)
    *p = (char)toupper((unsigned char)*p);
  return u;
}

static int emit(E *e, Graph *g, const EmitOptions *o, const char *out, char *err, size_t errlen);

/* Runs under its own Diag, so that anything the helpers shared with the front
 * end report (a size overflow) becomes a message, not an abort. */
int emit_project(Graph *g, const EmitOptions *o, const char *out, char *err, size_t errlen) {
  Diag d = {0}, *saved = diag;
  d.file = o->spec_name;
  d.arena = g->arena;
  diag = &d;
  if (setjmp(d.jmp)) {
    diag = saved;
    snprintf(err, errlen, "%s", d.msg);
    return -1;
  }
  E ee = {0};
  int rc = emit(&ee, g, o, out, err, errlen);
  diag = saved;
  return rc;
}

static int emit(E *e, Graph *g, const EmitOptions *o, const char *out, char *err, size_t errlen) {
  e->g = g;
  e->a = g->arena;
  e->o = o;
  e->name = g->spec->name;
  e->NAME = upper(e->a, e->name);
  /* param byte offsets, 256-aligned */
  e->pbyte = param_offsets(g, e->a);
  e->param_bytes = e->pbyte[g->nparams];
  /* runs of one dtype, and each param's place in the flat f32 optimizer state */
  e->runs = arena_alloc(e->a, sizeof *e->runs * (size_t)(g->nparams + 1));
  e->state = arena_alloc(e->a, sizeof(int64_t) * (size_t)(g->nparams + 1));
  for (int k = 0; k < g->nparams; k++) {
    int64_t end = k + 1 < g->nparams ? e->pbyte[k + 1] : e->param_bytes;
    DType dt = g->params[k].dtype;
    if (!e->nruns || e->runs[e->nruns - 1].dt != dt) {
      e->runs[e->nruns].b0 = e->pbyte[k];
      e->runs[e->nruns].dt = dt;
      e->runs[e->nruns].f = e->state_elems;
      e->nruns++;
    }
    e->runs[e->nruns - 1].b1 = end;
    e->runs[e->nruns - 1].n = (end - e->runs[e->nruns - 1].b0) / dtype_size(dt);
    e->state[k] = e->runs[e->nruns - 1].f + (e->pbyte[k] - e->runs[e->nruns - 1].b0) / dtype_size(dt);
    e->state_elems = e->runs[e->nruns - 1].f + e->runs[e->nruns - 1].n;
    e->need_master |= dt != DT_F32;
  }
  for (int k = 0; k < g->nsyms; k++)
    e->test_sym[k] = g->syms[k].derived ? 0 : (g->syms[k].max < o->test_dim ? g->syms[k].max : o->test_dim);
  e->test_dims_arg = "";
  for (int k = 0; k < g->nsyms; k++)
    if (!g->syms[k].derived)
      e->test_dims_arg = arena_printf(e->a, "%s%s%s=%lld", e->test_dims_arg, *e->test_dims_arg ? "," : "--dims ",
                                      g->syms[k].name, (long long)e->test_sym[k]);

  /* the passes: forward; with train:, the loss and the partitioned joint
   * forward/backward graph (its sizes judged at each dynamic dim's max) */
  if (g->spec->train.present && g->loss) {
    if (!g->grads && autodiff(g)) {
      snprintf(err, errlen, "%s: the model has no loss to differentiate", o->spec_name);
      return -1;
    }
    int64_t maxsym[MAXSYM] = {0};
    for (int k = 0; k < g->nsyms; k++)
      maxsym[k] = g->syms[k].derived ? 0 : g->syms[k].max;
    if (partition(g, g->spec->compile.remat, g->spec->compile.memory_budget, maxsym, &e->plan, err, errlen))
      return -1;
  }
  build_passes(g, g->grads ? &e->plan : NULL, o->fuse, 2, e->pass);
  find_library_calls(e);
  const char *why = NULL;
  int have_golden = o->golden && golden(e, &why);
  const char *note = have_golden
                         ? g->grads && g->param_numel > ((int64_t)4 << 20)
                               ? "Golden vectors (`tests/golden.safetensors`) were computed by tgen's double-precision reference interpreter at the test dims; the golden tests compare both paths against them. The model has more than 4M params, so the gradients are not stored: the training tests check that they are finite.\n"
                               : "Golden vectors (`tests/golden.safetensors`) were computed by tgen's double-precision reference interpreter at the test dims (outputs; with train:, the loss and every gradient, and the losses of the first three training steps with tgen's optimizer in double); the golden and training tests compare both paths against them.\n"
                         : arena_printf(e->a, "No golden vectors: %s. The golden tests only check that the forward pass runs and gives finite values.\n",
                                        why ? why : "disabled by --no-golden");
  /* the project */
  add_file(e, MARKER, "This directory was written by tgen. Regenerating replaces the files listed below\n"
                      "(atomically) and keeps every other file (build/, checkpoints).\n");
  add_file(e, "CMakeLists.txt", keep_sections(e, "project/CMakeLists.txt", instantiate(e, "project/CMakeLists.txt")));
  add_file(e, "README.md", readme(e, note));
  add_file(e, arena_printf(e->a, "include/%s.h", e->name),
           replace_section(e, keep_sections(e, "project/tgm.h", instantiate(e, "project/tgm.h")), "API_TYPES",
                           api_types(e)));
  static const char *const runtime[][2] = {{"runtime/tgm_rt.h", "src/%s_rt.h"},
                                           {"runtime/tgm_model.c", "src/%s_model.c"},
                                           {"runtime/tgm_init.c", "src/%s_init.c"},
                                           {"runtime/tgm_math.h", "src/%s_math.h"},
                                           {"runtime/tgm_safetensors.c", "src/%s_safetensors.c"},
                                           {"runtime/tgm_cpu.c", "src/%s_kernels_cpu.c"},
                                           {"runtime/tgm_cuda.cu", "src/%s_kernels_cuda.cu"},
                                           {"runtime/tgm_optim_cpu.c", "src/%s_optim_cpu.c"},
                                           {"runtime/tgm_optim_cuda.cu", "src/%s_optim_cuda.cu"},
                                           {"project/test_train.c", "tests/%s_test_train.c"},
                                           {"runtime/tgm_run.c", "src/%s_run.c"},
                                           {"runtime/tgm_io.h", "src/%s_io.h"},
                                           {"project/test_golden.c", "tests/%s_test_golden.c"},
                                           {"project/test_api.c", "tests/%s_test_api.c"},
                                           {"project/bench.c", "bench/%s_bench.c"}};
  static const char *const distributed[][2] = {{"runtime/tgm_dist.c", "src/%s_dist.c"},
                                               {"project/test_dist.c", "tests/%s_test_dist.c"}};
  for (size_t i = 0; i < sizeof runtime / sizeof *runtime; i++)
    add_file(e, arena_printf(e->a, runtime[i][1], e->name),
             keep_sections(e, runtime[i][0], instantiate(e, runtime[i][0])));
  for (size_t i = 0; o->distributed && i < sizeof distributed / sizeof *distributed; i++)
    add_file(e, arena_printf(e->a, distributed[i][1], e->name),
             keep_sections(e, distributed[i][0], instantiate(e, distributed[i][0])));
  add_file(e, arena_printf(e->a, "src/%s_common.c", e->name), common_file(e));
  add_file(e, arena_printf(e->a, "src/%s_cpu.c", e->name), render_file(g, e->pass, 0, o->spec_name));
  add_file(e, arena_printf(e->a, "src/%s_cuda.cu", e->name), render_file(g, e->pass, 1, o->spec_name));
  return write_tree(e, out, err, errlen);
}
