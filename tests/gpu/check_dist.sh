#!/usr/bin/env bash
# check_dist.sh: the data-parallel path (--distributed nccl) on a machine with
# 2 or more GPUs. Run there after `tests/gpu/prepare.sh --with-dist` here:
#
#   OUT=... bash .dev/gpu/check_dist.sh
#
# For gpt2_tiny and gpt2 (DIR/dist/NAME): configure (NCCL from the CUDA
# Toolkit, else from PyTorch's nvidia-nccl wheel), build, and run the emitted
# tests: dist_cuda (2 ranks against one GPU), dist_cpu (the sharded
# optimizer on the CPU) and the one-GPU CUDA tests (gpt2: its CPU training
# tests, dist_cpu among them, take many minutes at T=1024 and are left out,
# as in CI, which runs dist_cpu on gpt2_tiny and train_ops_bf16). Then the runner's
# start-ups on gpt2_tiny (--nproc 2 with a checkpoint, resumed on 1 GPU; two
# processes joined by a tcp rendezvous), and train_step of gpt2 at B=16
# T=1024 per GPU timed by its bench on 1 GPU without ranks and with 1 and 2
# ranks (weak scaling). Writes OUT/dist.txt; exit status 1 if anything failed.
set -u
DIR=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$DIR/out}
mkdir -p "$OUT"
LOG=$OUT/dist.txt
: > "$LOG"
# NVLink multicast stays off (the device notes: it can take the host's GPUs out of service)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
say() { echo "$*" | tee -a "$LOG"; }
fail=0
nvidia-smi -L | tee -a "$LOG"
NCCL_ARG=""
if ! ls /usr/local/cuda/include/nccl.h >/dev/null 2>&1; then
  root=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null)
  [ -n "$root" ] && NCCL_ARG="-DNCCL_ROOT=$root" && export LD_LIBRARY_PATH="$root/lib:${LD_LIBRARY_PATH:-}"
fi
say "NCCL: ${NCCL_ARG:-from the CUDA Toolkit}"

build() { # NAME
  local n=$1 t0=$SECONDS
  cmake -S "$DIR/dist/$n" -B "$DIR/dist/$n-build" -DCMAKE_CUDA_ARCHITECTURES=90 $NCCL_ARG > "$OUT/$n.configure.log" 2>&1 &&
    cmake --build "$DIR/dist/$n-build" -j 16 > "$OUT/$n.build.log" 2>&1
  local rc=$?
  echo "$n: built in $((SECONDS - t0)) s (rc $rc); $(grep -h 'multi-GPU path' "$OUT/$n.configure.log" | sed 's/^-- //')" >> "$LOG"
  return $rc
}
build gpt2 & big=$!
build gpt2_tiny || fail=1

T=$DIR/dist/gpt2_tiny-build
say "== gpt2_tiny: emitted tests (all but dist_cuda, which runs next)"
(cd "$T" && ctest --output-on-failure -E '^dist_cuda$' 2>&1) > "$OUT/gpt2_tiny.ctest.log"
tail -4 "$OUT/gpt2_tiny.ctest.log" >> "$LOG"
grep -q "100% tests passed" "$OUT/gpt2_tiny.ctest.log" || fail=1
say "== gpt2_tiny: dist_cuda"
"$T/gpt2_tiny_test_dist" cuda "$DIR/dist/gpt2_tiny/tests/golden.safetensors" "$T" 2 >> "$LOG" 2>&1 || fail=1
say "== gpt2_tiny: runner --nproc 2, a checkpoint, resumed on 1 GPU"
(cd "$T" && ./gpt2_tiny_run --nproc 2 --dims B=8 --train-steps 4 --save-checkpoint "$T/r2.safetensors" \
  --out "$T/r2out.safetensors" && ./gpt2_tiny_run --device cuda --dims B=8 --checkpoint "$T/r2.safetensors" \
  --train-steps 2) >> "$LOG" 2>&1 || { say "FAIL: runner --nproc"; fail=1; }
say "== gpt2_tiny: two processes joined by tcp:127.0.0.1:29561"
for r in 0 1; do
  (cd "$T" && ./gpt2_tiny_run --rendezvous tcp:127.0.0.1:29561 --rank $r --nranks 2 --local-rank $r \
    --dims B=8 --train-steps 3 > "$OUT/tcp$r.log" 2>&1) &
  pids[$r]=$!
done
for r in 0 1; do wait ${pids[$r]} || { say "FAIL: tcp rank $r"; fail=1; }; done
cat "$OUT/tcp0.log" "$OUT/tcp1.log" >> "$LOG"

wait $big || fail=1
G=$DIR/dist/gpt2-build
say "== gpt2: emitted tests (the one-GPU CUDA tests)"
(cd "$G" && ctest --output-on-failure -R '^(golden_cuda|train_cuda|api)$' 2>&1) > "$OUT/gpt2.ctest.log"
grep -E "^ *[0-9]+/[0-9]+ Test|tests passed" "$OUT/gpt2.ctest.log" >> "$LOG"
grep -q "100% tests passed" "$OUT/gpt2.ctest.log" || fail=1
say "== gpt2: dist_cuda"
"$G/gpt2_test_dist" cuda "$DIR/dist/gpt2/tests/golden.safetensors" "$G" 2 >> "$LOG" 2>&1 || fail=1
say "== gpt2: train_step at B=16 T=1024 per GPU (bf16), 20 iterations after 3 warm-up"
(cd "$G" && ./gpt2_bench --device cuda --train 1 --dims B=16 --iters 20 --warmup 3) >> "$LOG" 2>&1 || fail=1
for n in 1 2; do
  (cd "$G" && ./gpt2_bench --train 1 --nproc $n --dims B=16 --iters 20 --warmup 3) >> "$LOG" 2>&1 || fail=1
done
say "check_dist: $([ $fail = 0 ] && echo PASS || echo FAIL)"
exit $fail
