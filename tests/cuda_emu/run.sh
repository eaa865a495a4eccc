#!/bin/bash
# tests/cuda_emu/run.sh [TGEN]: the generated CUDA kernels of m.yaml (a split
# column sum and its epilogue, a vector pointwise kernel with a broadcast
# operand and a scalar tail, a split sum and amax) run on the CPU through
# emu.h (a thread per CUDA thread, blocks in order), checked against plain
# loops at several sizes, aligned and not. Not a ctest (about a minute of
# thread creation); run by hand from the repository root after a build.
# The blocks run in order, so the race of a split reduction's last block is
# not exercised: only its indexing, partials and fixed-order combine.
set -e
tgen=${1:-$PWD/build/tgen}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$tgen" "$here/m.yaml" -o "$work/out" --no-golden >/dev/null
src=$work/out/src/t_cuda.cu
awk '/^\/\* k[0-9]/{on=1} /^\/\* the /{on=0} on' "$src" > "$work/kernels.inc"
grep "<<<" "$src" | sed -E 's/^ *([a-z0-9_]+)<<<(.*), ([0-9]+), 0, st>>>\((.*)\);/  launch(dim3(\2), dim3(\3), \1, \4);/' > "$work/launches.inc"
g++ -std=c++20 -O1 -w -pthread -include "$here/emu.h" -I "$work/out/src" -I "$work" -o "$work/h" "$here/harness.cc"
"$work/h"
