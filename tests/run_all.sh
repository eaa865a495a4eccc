#!/bin/sh
# run_all.sh: the whole test suite, as CI runs it.
#   1. the normal build, warnings as errors, and every CTest test;
#   2. the same suite (less the end-to-end builds) under ASan + UBSan;
#   3. the libFuzzer targets (clang), the front end and the safetensors reader,
#      for TGEN_FUZZ_SECONDS in all (default 60).
# Build trees: build-ci/, build-asan/, build-fuzz/ beside the sources.
set -e
cd "$(dirname "$0")/.."
TGEN_NEED_CLANG=1 sh tests/deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
step() { printf '\n==== %s\n' "$*"; }

step "build (warnings are errors)"
cmake -S . -B build-ci -DTGEN_WERROR=ON -DBUILD_TESTING=ON >/dev/null
cmake --build build-ci -j "$jobs"
step "tests"
ctest --test-dir build-ci --output-on-failure -j "$jobs"

step "sanitizer build (ASan + UBSan)"
cmake -S . -B build-asan -DTGEN_SANITIZE=ON -DTGEN_WERROR=ON -DBUILD_TESTING=ON >/dev/null
cmake --build build-asan -j "$jobs"
step "tests under sanitizers"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build-asan --output-on-failure -j "$jobs" -LE e2e

step "fuzzing the spec (front end and back end) and the safetensors reader for ${TGEN_FUZZ_SECONDS:-60} s"
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DTGEN_FUZZ=ON -DTGEN_FUZZ_SECONDS="${TGEN_FUZZ_SECONDS:-60}" -DBUILD_TESTING=ON >/dev/null
cmake --build build-fuzz -j "$jobs" --target tgen_fuzz tgen_fuzz_st
ctest --test-dir build-fuzz -L fuzz --output-on-failure
