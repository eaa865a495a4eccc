#!/bin/sh
# build_and_run_optim.sh: builds tests/gpu/test_optim_cuda.cu (the optimizer
# kernels of templates/runtime/tgm_optim_cuda.cu against PyTorch's values in
# tests/unit/optim_golden.h) with nvcc and runs it.
#   sh tests/gpu/build_and_run_optim.sh [GROUP]   GROUP: golden, cpu, sumsq or errors
# Environment: NVCC (default nvcc), BUILD_DIR (default build-gpu), NVCC_FLAGS (extra flags),
#              SANITIZE=1 runs it under compute-sanitizer (memcheck).
# Exit status: the test's (0 pass, 1 fail, 77 no CUDA device), 2 if it did not build.
set -e
cd "$(dirname "$0")/../.."
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
  -o "$BUILD_DIR/test_optim_cuda" tests/gpu/test_optim_cuda.cu -lcublas || exit 2
set +e
if [ "${SANITIZE:-0}" = 1 ]; then
  compute-sanitizer --tool memcheck --error-exitcode 3 "$BUILD_DIR/test_optim_cuda" "$@"
else
  "$BUILD_DIR/test_optim_cuda" "$@"
fi
