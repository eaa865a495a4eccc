#!/bin/sh
# build_and_run.sh: builds one of the self-checking CUDA tests with nvcc and
# runs it: tests/gpu/test_cuda_kernels.cu (the kernel library; default) or,
# with TEST=test_optim_cuda, tests/gpu/test_optim_cuda.cu (the optimizer
# kernels against PyTorch's values in tests/unit/optim_golden.h), or, with
# TEST=test_gemm_cuda, tests/gpu/test_gemm_cuda.cu (tgm_cuda_gemm against
# tgm_cpu_gemm; templates/runtime/tgm_cpu.c is compiled with $CC and linked).
#   sh tests/gpu/build_and_run.sh [GROUP]      GROUP: run only that group (cast, matmul, ...; golden, sumsq, ...; gemm, x3, errors)
# Environment: TEST (default test_cuda_kernels), NVCC (default nvcc), CC (default cc), BUILD_DIR (default build-gpu), NVCC_FLAGS (extra flags),
#              SANITIZE=1 runs it under compute-sanitizer (memcheck).
# Exit status: the test's (0 pass, 1 fail, 77 no CUDA device), 2 if it did not build.
set -e
cd "$(dirname "$0")/../.."
TEST=${TEST:-test_cuda_kernels}
NVCC=${NVCC:-nvcc}
BUILD_DIR=${BUILD_DIR:-build-gpu}
if ! command -v "$NVCC" >/dev/null 2>&1; then
  echo "SKIP: $NVCC not found"
  exit 77
fi
# -arch=native needs a GPU at build time; without one, build for Hopper. Hopper (compute
# capability 9.0) as sm_90a, as the emitted CMakeLists.txt does (k_gemm_x3's wgmma).
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  ARCH=-arch=native
  case "$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)" in
    9.0*) ARCH=-gencode=arch=compute_90a,code=sm_90a ;;
  esac
else
  ARCH=-gencode=arch=compute_90a,code=sm_90a
fi
mkdir -p "$BUILD_DIR"
EXTRA=""
if [ "$TEST" = test_gemm_cuda ]; then
  "${CC:-cc}" -std=c11 -O2 -fopenmp -Wall -Wextra -c templates/runtime/tgm_cpu.c -o "$BUILD_DIR/tgm_cpu.o" || exit 2
  EXTRA="$BUILD_DIR/tgm_cpu.o -Xcompiler -fopenmp"
fi
# shellcheck disable=SC2086
"$NVCC" -std=c++17 -O3 $ARCH -Xcompiler -Wall,-Wextra $NVCC_FLAGS \
  -o "$BUILD_DIR/$TEST" "tests/gpu/$TEST.cu" $EXTRA -lcublas -lcublasLt || exit 2
set +e
if [ "${SANITIZE:-0}" = 1 ]; then
  compute-sanitizer --tool memcheck --error-exitcode 3 "$BUILD_DIR/$TEST" "$@"
else
  "$BUILD_DIR/$TEST" "$@"
fi
