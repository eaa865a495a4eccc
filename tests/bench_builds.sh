#!/bin/sh
# tests/bench_builds.sh SRC_ROOT WORK: bench/cpu_gemm.c, the CPU GEMM benchmark,
# still builds warning-free against the runtime as a program and as the library
# bench/cpu_gemm_ab.py loads, and both run: the program lists the 16 shapes and
# times the GPT-2 blocks' 8 once each; the library's cg_* entry points exist.
# (Nothing is timed against a bound: benchmarks are not tests.)
set -e
src=$1 work=$2
mkdir -p "$work"
cc=${CC:-cc}
"$cc" -std=c11 -O1 -fopenmp -Wall -Wextra -Werror "$src/bench/cpu_gemm.c" -lm -o "$work/cpu_gemm"
"$cc" -std=c11 -O1 -fopenmp -Wall -Wextra -Werror -DCPU_GEMM_LIB -shared -fPIC "$src/bench/cpu_gemm.c" -lm \
  -o "$work/libcpu_gemm.so"
n=$("$work/cpu_gemm" --list | wc -l)
[ "$n" -eq 16 ] || { echo "cpu_gemm --list: $n shapes, expected 16"; exit 1; }
n=$(OMP_NUM_THREADS=2 "$work/cpu_gemm" --work gpt2_cpu --iters 1 | grep -c 'GFLOP/s')
[ "$n" -eq 8 ] || { echo "cpu_gemm --work gpt2_cpu: $n timed shapes, expected 8"; exit 1; }
for f in cg_count cg_describe cg_select cg_call; do
  nm -D "$work/libcpu_gemm.so" | grep -q " T $f\$" || { echo "libcpu_gemm.so: no $f"; exit 1; }
done
echo "bench/cpu_gemm.c: program and library build and run"
