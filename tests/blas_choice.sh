#!/bin/sh
# blas_choice.sh TGEN SPEC WORKDIR: which CPU GEMM the emitted CMakeLists.txt
# chooses (configure only), against stand-in CBLAS libraries built here that
# carry the marks it goes by: Netlib's reference BLAS (its CBLAS's global
# CBLAS_CallFromC; named libblas.so.3 behind a libblas.so link, as Debian's
# libblas-dev installs it), OpenBLAS (openblas_get_num_threads) and a CBLAS
# it does not know. The reference BLAS is never chosen unless forced.
set -e
tgen=$1
spec=$2
work=$3
rm -rf "$work"
mkdir -p "$work/netlib/blas" "$work/openblas" "$work/other" "$work/include"
cd "$work"
"$tgen" "$spec" -o proj >/dev/null
MODEL=$(basename "$(ls proj/include/*.h)" .h | tr '[:lower:]' '[:upper:]')
cc=${CC:-cc}
common='void sgemm_(void) {} void cblas_sgemm(void) {}'
echo "$common int CBLAS_CallFromC;" >netlib.c
echo "$common int openblas_get_num_threads(void) { return 1; }" >openblas.c
echo "$common" >other.c
$cc -shared -fPIC -o netlib/blas/libblas.so.3 netlib.c
ln -s blas/libblas.so.3 netlib/libblas.so
$cc -shared -fPIC -o openblas/libopenblas.so openblas.c
$cc -shared -fPIC -o other/libfastblas.so other.c
echo '/* a stand-in: configuring only looks for it */' >include/cblas.h

n=0
fails=0
# expect NAME WANT ARGS...: configure with ARGS; WANT is a grep -E pattern for the log
expect() {
  name=$1
  want=$2
  shift 2
  n=$((n + 1))
  rm -rf build
  cmake -S proj -B build -D${MODEL}_CUDA=OFF -D${MODEL}_CBLAS_INCLUDE="$work/include" "$@" >log.txt 2>&1 || true
  # CMake wraps its errors and warnings: the message's words on one line
  grep -v '^--' log.txt | tr -s ' \n' ' ' >joined.txt
  if grep -Eq "$want" log.txt joined.txt; then
    echo "ok   $name: $(grep -Eho "$want" log.txt joined.txt | head -1)"
  else
    fails=$((fails + 1))
    echo "FAIL $name: no /$want/ in:"
    sed 's/^/     /' log.txt | grep -v -E '^ +-- (The|Detecting|Check|Found|Looking|Performing|Configuring|Generating|Build)'
  fi
}
lib="$work/netlib"
expect "the reference BLAS found, default: the built-in GEMM" \
  "CPU GEMM: built-in blocked GEMM \(found .*libblas.so: Netlib's reference BLAS, slower than the built-in one; -D${MODEL}_BLAS=FORCE" \
  -DBLA_VENDOR=Generic -DCMAKE_LIBRARY_PATH="$lib"
expect "the reference BLAS found, ON: refused" \
  "${MODEL}_BLAS=ON asks for a CBLAS, but found .*Netlib's reference BLAS" \
  -D${MODEL}_BLAS=ON -DBLA_VENDOR=Generic -DCMAKE_LIBRARY_PATH="$lib"
expect "the reference BLAS found, FORCE: used, with a warning" \
  "CMake Warning .*FORCE: the CPU GEMMs call .*libblas.so, Netlib's reference BLAS: unoptimised" -D${MODEL}_BLAS=FORCE -DBLA_VENDOR=Generic -DCMAKE_LIBRARY_PATH="$lib"
expect "  ... and named as such" "CPU GEMM: Netlib's reference BLAS \(.*libblas.so, forced" \
  -D${MODEL}_BLAS=FORCE -DBLA_VENDOR=Generic -DCMAKE_LIBRARY_PATH="$lib"
expect "the reference BLAS named: as ON, refused" "${MODEL}_BLAS=ON asks for a CBLAS, but found .*Netlib's reference" \
  -D${MODEL}_BLAS_LIBRARY="$lib/libblas.so"
expect "OpenBLAS found, default: used" "CPU GEMM: OpenBLAS \(.*libopenblas.so" \
  -DBLA_VENDOR=OpenBLAS -DCMAKE_LIBRARY_PATH="$work/openblas"
expect "  ... but not on a CPU with AVX-512 (AUTO)" \
  "CPU GEMM: OpenBLAS \(.*libopenblas.so; the built-in GEMM instead on a CPU with AVX-512, where it is the faster" \
  -DBLA_VENDOR=OpenBLAS -DCMAKE_LIBRARY_PATH="$work/openblas"
expect "OpenBLAS asked for (ON): used for every large GEMM" "CPU GEMM: OpenBLAS \(.*libopenblas.so; -D${MODEL}_BLAS=OFF" \
  -D${MODEL}_BLAS=ON -DBLA_VENDOR=OpenBLAS -DCMAKE_LIBRARY_PATH="$work/openblas"
expect "OpenBLAS found, OFF: the built-in GEMM" "CPU GEMM: built-in blocked GEMM \(-D${MODEL}_BLAS=OFF\)" \
  -D${MODEL}_BLAS=OFF -DBLA_VENDOR=OpenBLAS -DCMAKE_LIBRARY_PATH="$work/openblas"
expect "an unknown CBLAS named, default: used (a library named is asked for)" \
  "CPU GEMM: a CBLAS not known to be fast .*libfastblas.so" -D${MODEL}_BLAS_LIBRARY="$work/other/libfastblas.so"
expect "an unknown CBLAS named, AUTO given: as ON, used" \
  "CPU GEMM: a CBLAS not known to be fast .*libfastblas.so" -D${MODEL}_BLAS=AUTO -D${MODEL}_BLAS_LIBRARY="$work/other/libfastblas.so"
expect "no BLAS found, default: the built-in GEMM" "CPU GEMM: built-in blocked GEMM \(no BLAS found" \
  -DBLA_VENDOR=SGIMATH # (a vendor no Linux machine has)
expect "no BLAS found, ON: refused" "${MODEL}_BLAS=ON asks for a CBLAS, but no BLAS found" \
  -D${MODEL}_BLAS=ON -DBLA_VENDOR=SGIMATH
expect "a bad value refused" "${MODEL}_BLAS is 'maybe': give AUTO, OFF, ON or FORCE" -D${MODEL}_BLAS=maybe
echo "$((n - fails)) passed, $fails failed"
[ "$fails" = 0 ]
