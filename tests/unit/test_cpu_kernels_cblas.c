/* test_cpu_kernels_cblas.c: test_cpu_kernels.c with the CPU kernels built
 * against a CBLAS (TGM_HAVE_CBLAS): the GEMM-based tests then also run
 * through cblas_sgemm. Link with a CBLAS, e.g. -lopenblas (cblas.h from
 * libopenblas-dev). */
#define TGM_HAVE_CBLAS 1
#include "test_cpu_kernels.c"
