#!/bin/sh
# deps.sh: install what tgen and its tests need, when missing (Debian/Ubuntu).
# Needs root for apt-get; prints what to install otherwise.
missing=""
command -v cmake >/dev/null 2>&1 || missing="$missing cmake"
command -v cc >/dev/null 2>&1 || missing="$missing gcc"
command -v make >/dev/null 2>&1 || missing="$missing make"
command -v pkg-config >/dev/null 2>&1 || missing="$missing pkg-config"
pkg-config --exists yaml-0.1 2>/dev/null || missing="$missing libyaml-dev"
# a CBLAS for the CPU GEMMs: OpenBLAS (the emitted projects never link the
# reference BLAS that Debian's libblas-dev brings unless forced: their
# built-in GEMM is faster; without OpenBLAS they use that one)
if command -v dpkg >/dev/null 2>&1; then
  dpkg -s libopenblas-dev >/dev/null 2>&1 || missing="$missing libopenblas-dev"
else
  [ -f /usr/include/x86_64-linux-gnu/cblas.h ] || [ -f /usr/include/cblas.h ] || [ -f /usr/include/openblas/cblas.h ] ||
    echo "deps.sh: no cblas.h found: the emitted projects use their built-in GEMM (slower)" >&2
fi
command -v bc >/dev/null 2>&1 || missing="$missing bc"
if [ "${TGEN_NEED_CLANG:-0}" = 1 ]; then
  command -v clang >/dev/null 2>&1 || missing="$missing clang"
  ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 || missing="$missing libclang-rt-dev"
fi
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "deps.sh: installing:$missing"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null || exit 1
  else
    echo "deps.sh: please install:$missing" >&2
    exit 1
  fi
fi
# JAX (CPU) for the gradient oracle (tests/oracle, CTest label oracle), from
# PyPI into the python3 on PATH; nothing when it imports already. Without it
# the oracle tests skip, so a failed install is reported but not fatal.
if command -v python3 >/dev/null 2>&1 && ! python3 -c "import jax" >/dev/null 2>&1; then
  echo "deps.sh: installing jax (pip, CPU) for the gradient oracle"
  python3 -m pip install -q --disable-pip-version-check jax >/dev/null 2>&1 ||
    python3 -m pip install -q --disable-pip-version-check --break-system-packages jax >/dev/null 2>&1 ||
    echo "deps.sh: could not pip install jax: the gradient-oracle tests (label oracle) will skip" >&2
fi
exit 0
