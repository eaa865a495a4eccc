/* fuzz_spec.c: libFuzzer target for the front end (YAML loader, expression
 * parser, spec checks, graph build, shape inference, verify) and, for a spec
 * that loads, what `tgen check` runs after it: autodiff, the partitioner,
 * decomposition, the scheduler (with the renderer's checks) and the memory
 * plan. Any input must either load or be refused with a message: never
 * crash, leak, hang or trip a sanitizer. Build with -DTGEN_FUZZ=ON (clang). */
#include "ir.h"

#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

/* The back end of `tgen check` on a loaded graph (errors are messages). */
static void back_end(Graph *g) {
  Diag d = {0};
  d.file = "fuzz.yaml";
  d.arena = g->arena;
  diag = &d;
  if (setjmp(d.jmp)) {
    diag = NULL;
    return;
  }
  Plan plan = {0};
  int trained = g->spec->train.present && g->loss;
  if (trained) {
    int64_t sym[MAXSYM] = {0};
    char err[512];
    for (int k = 0; k < g->nsyms; k++)
      sym[k] = g->syms[k].derived ? 0 : g->syms[k].max;
    if (autodiff(g) || partition(g, g->spec->compile.remat, g->spec->compile.memory_budget, sym, &plan, err, sizeof err)) {
      diag = NULL;
      return;
    }
  }
  BPass *ps[NPASS] = {0};
  build_passes(g, trained ? &plan : NULL, g->spec->compile.fuse, 2, ps);
  diag = NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *src = malloc(size + 1);
  if (!src)
    return 0;
  memcpy(src, data, size);
  src[size] = 0;
  Arena a = {.fail_after = -1};
  Diag d = {0};
  Graph *g = tgen_load(&d, &a, "fuzz.yaml", src, size);
  if (g) {
    verify(g);
    back_end(g);
  }
  else if (strncmp(d.msg, "fuzz.yaml", 9) != 0)
    abort(); /* a refusal always names the file */
  arena_free(&a);
  free(src);
  return 0;
}
