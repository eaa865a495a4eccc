/* fuzz_st.c: libFuzzer target for the runtime's safetensors reader
 * (templates/runtime/tgm_safetensors.c, included whole, as the unit test
 * does): header length, JSON, dtypes, shapes, offsets, __metadata__ and its
 * checksum. Any input must load or be refused with a message naming the file:
 * never crash, leak, hang or read outside the buffer. Every loaded tensor is
 * looked up by name and its bytes read, so a bad offset shows under ASan.
 * Build with -DTGEN_FUZZ=ON (clang). */
#include "../../templates/runtime/tgm_safetensors.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  unsigned char *buf = malloc(size ? size : 1); /* exactly the input's bytes: ASan sees any overread */
  if (!buf)
    return 0;
  memcpy(buf, data, size);
  tgm_st_file f;
  char err[512];
  err[0] = 0;
  int rc = st_parse("fuzz.safetensors", buf, size, &f, err, sizeof err);
  if (rc) {
    if (strncmp(err, "fuzz.safetensors", 16) != 0)
      abort(); /* a refusal always names the file */
    free(buf);
    return 0;
  }
  unsigned sum = 0;
  for (int k = 0; k < f.n; k++) {
    const tgm_tensor_desc *t = tgm_st_find(&f, f.t[k].name);
    if (t != &f.t[k])
      abort(); /* names are unique and findable */
    int64_t bytes = tgm_dtype_sizes[t->dtype];
    for (int i = 0; i < t->rank; i++)
      bytes *= t->shape[i];
    if (bytes > 0)
      sum += ((const unsigned char *)t->data)[0] + ((const unsigned char *)t->data)[bytes - 1];
  }
  tgm_st_free(&f);
  return (int)(sum & 0);
}
