#!/bin/sh
# build_and_run_optim.sh [GROUP]: the optimizer kernels' CUDA test (GROUP:
# golden, cpu, sumsq or errors); see build_and_run.sh.
TEST=test_optim_cuda exec sh "$(dirname "$0")/build_and_run.sh" "$@"
