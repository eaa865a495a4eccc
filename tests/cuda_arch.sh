#!/bin/sh
# cuda_arch.sh TGEN SPEC WORKDIR: the CUDA architectures the emitted
# CMakeLists.txt compiles for (configure only; skipped, exit 77, without
# nvcc or with CMake older than 3.25): Hopper named as 90 (or 90-real) is
# compiled as sm_90a, whose wgmma instructions k_gemm_x3 and the flash
# attention kernels use; other architectures, and 90-virtual (a PTX for later
# GPUs), are left as named.
set -e
tgen=$1
spec=$2
work=$3
command -v nvcc >/dev/null 2>&1 || { echo "SKIP: no nvcc"; exit 77; }
v=$(cmake --version | sed -n 's/^cmake version \([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
set -- $v
if [ "$1" -lt 3 ] || { [ "$1" -eq 3 ] && [ "$2" -lt 25 ]; }; then
  echo "SKIP: CMake $1.$2 (90a needs 3.25)"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
cd "$work"
"$tgen" "$spec" -o proj >/dev/null
MODEL=$(basename "$(ls proj/include/*.h)" .h | tr '[:lower:]' '[:upper:]')
n=0
fails=0
# expect NAME ARCHS WANT: configure with CMAKE_CUDA_ARCHITECTURES=ARCHS; WANT is a grep -E pattern for
# the CUDA flags CMake wrote (flags.make), NOT (optional) one that must not be there
expect() {
  name=$1
  archs=$2
  want=$3
  not=${4:-}
  n=$((n + 1))
  rm -rf build
  cmake -S proj -B build -D${MODEL}_BLAS=OFF "-DCMAKE_CUDA_ARCHITECTURES=$archs" >log.txt 2>&1 || true
  flags=$(cat build/CMakeFiles/*.dir/flags.make 2>/dev/null | grep CUDA_FLAGS || true)
  if echo "$flags" | grep -Eq "$want" && { [ -z "$not" ] || ! echo "$flags" | grep -Eq "$not"; }; then
    echo "ok   $name: $(echo "$flags" | grep -Eo "$want" | head -1)"
  else
    fails=$((fails + 1))
    echo "FAIL $name: want /$want/${not:+, not /$not/} in:"
    echo "$flags" | sed 's/^/     /'
    tail -5 log.txt | sed 's/^/     /'
  fi
}
expect "90 is compiled as sm_90a" "90" "arch=compute_90a,code=\[compute_90a,sm_90a\]" "compute_90,"
expect "90-real as sm_90a only" "90-real" "arch=compute_90a,code=\[sm_90a\]"
expect "90-virtual stays a PTX for later GPUs" "90-virtual" "arch=compute_90,code=\[compute_90\]" "90a"
expect "80 is left as named" "80" "arch=compute_80,code=\[compute_80,sm_80\]" "90a"
expect "a list: 80 as named, 90 as 90a" "80;90" "compute_80.*compute_90a|compute_90a.*compute_80"
echo "$((n - fails)) passed, $fails failed"
[ "$fails" = 0 ]
