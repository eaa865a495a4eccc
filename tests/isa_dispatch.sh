#!/bin/sh
# isa_dispatch.sh TGEN SPEC WORKDIR: the generated CPU kernels run as copies
# compiled for AVX-512, AVX2 and the baseline, picked at load time (NAME_CLONES
# in NAME_rt.h), and every copy computes what the baseline computes. The
# project is built twice, CPU only: with dispatch, and with
# -DNAME_NO_ISA_DISPATCH (one baseline copy). Checked:
#   - where the compiler has target_clones (gcc, clang on x86 glibc): every
#     leaf of NAME_cpu.c (kN_part) has its .avx2 and .avx512f copies in the
#     dispatch build's object, and the baseline build's objects have none;
#   - the forward outputs, the loss and every gradient (--grad) and two
#     AdamW steps (--train-steps 2) of both builds are bit-identical, both
#     compiled with -ffp-contract=off (the AVX-512 copy may otherwise contract
#     a * b + c into an FMA, within tgm_math.h's stated errors but not
#     bit-identical); SPEC has no GEMM (the GEMM's micro-kernels differ per
#     ISA by design). The copy this CPU runs is the one compared, so on an
#     AVX-512 machine the AVX-512 copy.
set -e
tgen=$1
spec=$2
work=$3
name=$(basename "$spec" .yaml)
out="$work/$name"
rm -rf "$out" "$out-isa" "$out-base"
mkdir -p "$work"
"$tgen" "$spec" -o "$out" >/dev/null
model=$(basename "$(ls "$out"/include/*.h)" .h)
MODEL=$(echo "$model" | tr '[:lower:]' '[:upper:]')
build() { # DIR EXTRA_C_FLAGS
  cmake -S "$out" -B "$1" -D"${MODEL}_CUDA=OFF" "-DCMAKE_C_FLAGS=-ffp-contract=off $2" >"$1.configure.log" 2>&1 ||
    { cat "$1.configure.log"; exit 1; }
  cmake --build "$1" -j "$(nproc 2>/dev/null || echo 2)" --target "${model}_run" >"$1.build.log" 2>&1 ||
    { tail -50 "$1.build.log"; exit 1; }
  if grep -i "warning" "$1.build.log"; then echo "FAIL: warnings building $1"; exit 1; fi
}
build "$out-isa" ""
build "$out-base" "-D${MODEL}_NO_ISA_DISPATCH"

obj() { find "$1" -name "$2.o" | head -1; }
# does this compiler clone (the same test as NAME_rt.h's)?
printf '#include <stdint.h>\n__attribute__((target_clones("avx512f", "avx2", "default"))) int f(int x) { return x + 1; }\nint main(void) { return f(0) - 1; }\n' >"$work/clones.c"
cc=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$out-isa/CMakeCache.txt")
if "${cc:-cc}" -c "$work/clones.c" -o "$work/clones.o" 2>/dev/null && nm "$work/clones.o" | grep -q 'f\.avx2'; then
  syms=$(nm "$(obj "$out-isa" "${model}_cpu.c")")
  leaves=$(grep -o "${MODEL}_CLONES static [a-z0-9_]* k[0-9a-z_]*_part" "$out/src/${model}_cpu.c" | sed 's/.* //')
  [ -n "$leaves" ] || { echo "FAIL: no kN_part leaves in ${model}_cpu.c"; exit 1; }
  n=0
  for f in $leaves; do
    for isa in avx2 avx512f; do
      echo "$syms" | grep -q " $f\.$isa\$" || { echo "FAIL: $f has no .$isa copy"; exit 1; }
    done
    n=$((n + 1))
  done
  echo "$n leaves, each with its .avx2 and .avx512f copies"
  for o in "${model}_cpu.c" "${model}_kernels_cpu.c"; do
    if nm "$(obj "$out-base" "$o")" | grep -E '\.(avx2|avx512f)$'; then
      echo "FAIL: -D${MODEL}_NO_ISA_DISPATCH: ISA copies in $o"
      exit 1
    fi
  done
else
  echo "this compiler has no target_clones: the symbols are not checked"
fi

for mode in "" "--grad" "--train-steps 2"; do
  tag=$(echo "fwd$mode" | tr -d ' -')
  for b in isa base; do
    "$out-$b/${model}_run" --seed 1 --threads 2 $mode --out "$out-$b/$tag.safetensors" >"$out-$b/$tag.log" 2>&1 ||
      { cat "$out-$b/$tag.log"; exit 1; }
  done
  cmp "$out-isa/$tag.safetensors" "$out-base/$tag.safetensors" ||
    { echo "FAIL: ${mode:-forward}: the ISA copies' results differ from the baseline's"; exit 1; }
  echo "${mode:-forward}: bit-identical"
done
