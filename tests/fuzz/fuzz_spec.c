/* fuzz_spec.c: libFuzzer target for the whole front end (YAML loader,
 * expression parser, spec checks, graph build, shape inference, verify).
 * Any input must either load or be refused with a message: never crash, leak,
 * hang or trip a sanitizer. Build with -DTGEN_FUZZ=ON (clang). */
#include "ir.h"

#include <stdlib.h>
#include <string.h>

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
  if (g)
    verify(g);
  else if (strncmp(d.msg, "fuzz.yaml", 9) != 0)
    abort(); /* a refusal always names the file */
  arena_free(&a);
  free(src);
  return 0;
}
