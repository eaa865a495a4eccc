/* test_cpu_kernels_cblas.c: test_cpu_kernels.c with the CPU kernels built
 * against a CBLAS (TGM_HAVE_CBLAS): the GEMM-based tests then also run
 * through cblas_sgemm (small ones too: the runtime keeps those built in). Link with a CBLAS, e.g. -lopenblas (cblas.h from
 * libopenblas-dev). */
#define TGM_HAVE_CBLAS 1
#define GEMM_CBLAS_MIN 0.0 /* every f32 GEMM the CBLAS can take, however small */
#include "test_cpu_kernels.c"
