#!/bin/sh
# build_and_run.sh: builds one of the self-checking CUDA tests with nvcc and
# runs it: tests/gpu/test_cuda_kernels.cu (the kernel library; default) or,
# with TEST=test_optim_cuda, tests/gpu/test_optim_cuda.cu (the optimizer
# kernels against PyTorch's values in tests/unit/optim_golden.h).
#   sh tests/gpu/build_and_run.sh [GROUP]      GROUP: run only that group (unary, matmul, ...; golden, sumsq, ...)
# Environment: TEST (default test_cuda_kernels), NVCC (default nvcc), BUILD_DIR (default build-gpu), NVCC_FLAGS (extra flags),
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
# -arch=native needs a GPU at build time; without one, build for Hopper.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  ARCH=-arch=native
else
  ARCH=-arch=sm_90
fi
mkdir -p "$BUILD_DIR"
# shellcheck disable=SC2086
"$NVCC" -std=c++17 -O3 $ARCH -Xcompiler -Wall,-Wextra $NVCC_FLAGS \
  -o "$BUILD_DIR/$TEST" "tests/gpu/$TEST.cu" -lcublas || exit 2
set +e
if [ "${SANITIZE:-0}" = 1 ]; then
  compute-sanitizer --tool memcheck --error-exitcode 3 "$BUILD_DIR/$TEST" "$@"
else
  "$BUILD_DIR/$TEST" "$@"
fi
