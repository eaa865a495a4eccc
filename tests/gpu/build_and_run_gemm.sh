#!/bin/sh
# build_and_run_gemm.sh: tgm_cuda_gemm's CUDA test (against tgm_cpu_gemm);
# see build_and_run.sh.
TEST=test_gemm_cuda exec sh "$(dirname "$0")/build_and_run.sh" "$@"
