#!/bin/sh
# test_sections.sh TGEN MODEL.yaml OUT: the runtime kernel library of the
# project tgen writes for MODEL keeps exactly the library calls the model
# needs (gen/emit.c, keep_sections), judged from the spec's ops:
#   attention, embedding           kept iff the spec has that op
#   dropout                        kept iff the spec has dropout and trains
#                                  (the forward pass is in eval mode: no call)
#   embedding_backward             kept iff the spec has embedding and trains
#                                  (every embedding table here is a param)
#   attention_backward             kept iff the spec has attention and trains
#                                  (every attention here gets a gradient)
#   matmul                         kept iff the spec has matmul (the specs
#                                  tested have no matmul that is not a GEMM)
#   linear                         never (linear is always a strided GEMM)
# "Kept" means defined in src/NAME_kernels_cpu.c and src/NAME_kernels_cuda.cu
# and declared in src/NAME_rt.h; dropped means named in none of them. CUB's
# header goes with embedding_backward, the attention softmax kernel with
# attention, the Philox kernel with dropout. No section marker is left.
tgen=$1
spec=$2
out=$3
rm -rf "$out"
"$tgen" "$spec" -o "$out" --no-golden >/dev/null || { echo "FAIL: tgen $spec"; exit 1; }
ops=$("$tgen" check "$spec" --json | grep -o '"op": "[a-z_]*"' | sed 's/.*: "//; s/"//' | sort -u)
has() { echo "$ops" | grep -qx "$1"; }
trains=0
"$tgen" check "$spec" | grep -q '^train:' && trains=1
name=$(sed -n 's/^name: *\([A-Za-z0-9_]*\).*/\1/p' "$spec")
src=$out/src
cpu=$src/${name}_kernels_cpu.c
cuda=$src/${name}_kernels_cuda.cu
rt=$src/${name}_rt.h
bad=0

# check FEATURE WANT: the library call FEATURE is in all three files (WANT 1)
# or in none (WANT 0)
check() {
  n=0
  grep -q "^[a-z0-9_]* ${name}_cpu_$1(" "$cpu" && n=$((n + 1))
  grep -q "^int ${name}_cuda_$1(" "$cuda" && n=$((n + 1))
  grep -q "${name}_cpu_$1(" "$rt" && n=$((n + 1))
  grep -q "${name}_cuda_$1(" "$rt" && n=$((n + 1))
  if [ "$2" = 1 ] && [ $n -ne 4 ]; then
    echo "FAIL: $spec: $1 is used but missing ($n of 4 definitions and declarations)"
    bad=1
  fi
  if [ "$2" = 0 ] && grep -q "${name}_c[pu][ud]*_$1(" "$cpu" "$cuda" "$rt"; then
    echo "FAIL: $spec: $1 is not used but is in the kernel library:"
    grep -n "${name}_c[pu][ud]*_$1(" "$cpu" "$cuda" "$rt"
    bad=1
  fi
}
want() { if has "$1"; then echo 1; else echo 0; fi; }
# marker KERNEL WANT: a CUDA helper that belongs to a section
marker() {
  if grep -q "$1" "$cuda"; then n=1; else n=0; fi
  if [ $n -ne "$2" ]; then
    echo "FAIL: $spec: '$1' in $cuda: $n, expected $2"
    bad=1
  fi
}

check attention "$(want attention)"
check embedding "$(want embedding)"
drop=0
has dropout && [ $trains = 1 ] && drop=1
check dropout $drop
check matmul "$(want matmul)"
check linear 0
emb_bwd=0
has embedding && [ $trains = 1 ] && emb_bwd=1
check embedding_backward $emb_bwd
att_bwd=0
has attention && [ $trains = 1 ] && att_bwd=1
check attention_backward $att_bwd
marker '#include <cub/' $emb_bwd
marker 'k_flash_bwd' $att_bwd
marker 'k_softmax_rows' "$(want attention)"
marker 'philox4x32' $drop
# the GEMM, cast and fill are always there
check gemm 1
check cast 1
grep -q "^int ${name}_cuda_fill(" "$cuda" || { echo "FAIL: $spec: no ${name}_cuda_fill"; bad=1; }
if grep -rn '^\(/\*\|#\)@\(uses\|end\) ' "$out"; then
  echo "FAIL: $spec: section markers left in the output"
  bad=1
fi
# the data-parallel path (section "distributed"): nowhere without --distributed nccl; with it (a
# model that trains with an optimizer), its files, API, CMake option and test, and no marker left
if grep -rniq 'nccl\|_dist_' "$out"; then
  echo "FAIL: $spec: the data-parallel path is in a project generated without --distributed:"
  grep -rnil 'nccl\|_dist_' "$out"
  bad=1
fi
if "$tgen" check "$spec" | grep -q '^train:.*\(adamw\|sgd\) lr'; then
  rm -rf "$out.dist"
  "$tgen" "$spec" -o "$out.dist" --no-golden --distributed nccl >/dev/null || { echo "FAIL: tgen --distributed nccl"; exit 1; }
  NAME=$(echo "$name" | tr '[:lower:]' '[:upper:]')
  for f in "src/${name}_dist.c" "tests/${name}_test_dist.c"; do
    [ -f "$out.dist/$f" ] || { echo "FAIL: $spec: --distributed nccl wrote no $f"; bad=1; }
  done
  grep -q "^${name}_status ${name}_dist_init(" "$out.dist/include/${name}.h" || { echo "FAIL: no ${name}_dist_init"; bad=1; }
  grep -q "option(${NAME}_NCCL" "$out.dist/CMakeLists.txt" || { echo "FAIL: no ${NAME}_NCCL option"; bad=1; }
  grep -q "NAME dist_cuda" "$out.dist/CMakeLists.txt" || { echo "FAIL: no dist_cuda test"; bad=1; }
  if grep -rn '^\(/\*\|#\)@\(uses\|end\) ' "$out.dist"; then
    echo "FAIL: $spec: section markers left in the --distributed output"
    bad=1
  fi
  rm -rf "$out.dist"
fi
[ $bad = 0 ] && echo "ok: $name (ops: $(echo $ops | tr '\n' ' '))"
exit $bad
