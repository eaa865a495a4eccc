#!/bin/bash
# tests/cuda_emu/gpu.sh [TGEN]: harness.cc with nvcc on a GPU: the same
# checks as run.sh, plus B at its max (the split reductions' 256 blocks a
# tile); the last block of a split tile is the one the race picks.
set -e
tgen=${1:-$PWD/build/tgen}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$tgen" "$here/m.yaml" -o "$work/out" --no-golden >/dev/null
src=$work/out/src/t_cuda.cu
awk '/^\/\* k[0-9]/{on=1} /^\/\* the /{on=0} on' "$src" > "$work/kernels.inc"
grep "<<<" "$src" > "$work/launches.inc"
cp "$here/harness.cc" "$work/harness.cu"
nvcc -O2 -std=c++17 -I "$work/out/src" -I "$work" -o "$work/h" "$work/harness.cu"
"$work/h" max
