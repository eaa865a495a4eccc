#!/usr/bin/env bash
# check_training.sh: the training step of tgen's emitted projects on a GPU
# machine. tests/gpu/prepare_training.sh made DIR (default: this script's
# folder) on the build machine: per model NAME the project NAME/, its graph
# NAME.json and, for the gradient check, grad/NAME/ (graph.json, inputs and,
# for small models, params).
#
#   OUT=out bash check_training.sh [--no-build] [--bench "NAME:B=16 ..."]
#
#   1. build every project (CUDA for sm_90) in $BUILD_ROOT (default /tmp/tgen-train);
#   2. ctest -R "golden|train": the CUDA and CPU golden and training tests
#      (gradients and the first losses against the interpreter, bit-exact resume);
#   3. gradients against PyTorch's autograd in float64 on the GPU
#      (grad_parity.py), for the CUDA and the CPU path's NAME_run --grad;
#   4. --bench: NAME_bench --device cuda --train 1 at the dims, beside
#      torch eager and torch.compile of the same graph's step (train_bench.py).
# Report: $OUT/training.txt; logs in $OUT/logs.tgz.
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=$HERE
BUILD=${BUILD_ROOT:-/tmp/tgen-train}
OUT=${OUT:-./out}
DO_BUILD=1
BENCH=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) DO_BUILD=0 ;;
    --bench) BENCH=$2; shift ;;
    --dir) DIR=$2; shift ;;
    *) echo "check_training.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT" "$BUILD"
OUT=$(cd "$OUT" && pwd)
LOGS=$BUILD/logs
mkdir -p "$LOGS"
REPORT=$OUT/training.txt
PY=${PYTHON:-python3}
command -v nvcc >/dev/null 2>&1 || export PATH=/usr/local/cuda/bin:$PATH
NAMES=()
for j in "$DIR"/*.json; do n=$(basename "$j" .json); [ -f "$DIR/$n/CMakeLists.txt" ] && NAMES+=("$n"); done
{
  echo "== tgen training check $(date -u '+%F %T UTC'): $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  echo "torch $($PY -c 'import torch; print(torch.__version__)' 2>&1 | tail -1); models: ${NAMES[*]}"
} | tee "$REPORT"

if [ $DO_BUILD = 1 ]; then
  per=$(( $(nproc) / ${#NAMES[@]} )); [ $per -lt 2 ] && per=2
  for n in "${NAMES[@]}"; do
    ( cmake -S "$DIR/$n" -B "$BUILD/$n" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 > "$LOGS/$n.cmake.log" 2>&1 &&
      cmake --build "$BUILD/$n" -j "$per" > "$LOGS/$n.build.log" 2>&1 && echo "$n: built" || echo "$n: BUILD FAILED" ) &
  done
  wait
fi

echo "== emitted tests (ctest -R 'golden|train')" | tee -a "$REPORT"
for n in "${NAMES[@]}"; do
  (cd "$BUILD/$n" && timeout 300 ctest -R "golden|train" --output-on-failure) > "$LOGS/$n.ctest.log" 2>&1
  printf '%-16s rc %s: %s\n' "$n" "$?" "$(grep -E 'Test +#' "$LOGS/$n.ctest.log" | sed -E 's/.*Test +#[0-9]+: ([a-z_]+) \.*\**([A-Za-z]+).*/\1=\2/' | tr '\n' ' ')" | tee -a "$REPORT"
  grep -E "^(ok|FAIL) |^losses" "$LOGS/$n.ctest.log" | grep -v "^ok   grad" | sed 's/^/    /' >> "$REPORT"
done

echo "== gradients vs torch autograd (float64, on the GPU): max|a-b|/max(max|ref|, 1e-3 max|grad|)" | tee -a "$REPORT"
for w in "$DIR"/grad/*/; do
  n=$(basename "$w")
  [ -x "$BUILD/$n/${n}_run" ] || continue
  dims=$(cat "$w/dims")
  [ -f "$w/params.safetensors" ] || "$BUILD/$n/${n}_run" --seed 0 --save-params "$w/params.safetensors" --dims "$dims" > /dev/null
  for dev in cuda cpu; do
    timeout 300 "$BUILD/$n/${n}_run" --device $dev --params "$w/params.safetensors" --inputs "$w/inputs.safetensors" \
      --dims "$dims" --grad --out "$w/subject_$dev.safetensors" > "$LOGS/$n.grad.$dev.log" 2>&1 &&
    (cd "$DIR" && timeout 600 "$PY" grad_parity.py --graph "$w/graph.json" --params "$w/params.safetensors" \
      --inputs "$w/inputs.safetensors" --subject "$w/subject_$dev.safetensors" --dims "$dims") >> "$LOGS/$n.grad.$dev.log" 2>&1
    rc=$?
    summary=$(grep -E '^[0-9]+ passed' "$LOGS/$n.grad.$dev.log" | tail -1)
    printf '%-16s %-6s %-5s rc %s  %s\n' "$n" "$dims" "$dev" "$rc" "${summary:-$(tail -2 "$LOGS/$n.grad.$dev.log" | tr '\n' ' ')}" | tee -a "$REPORT"
    [ $rc = 0 ] || grep -v " ok$" "$LOGS/$n.grad.$dev.log" | head -20 | sed 's/^/    /' >> "$REPORT"
  done
done

if [ -n "$BENCH" ]; then
  echo "== training step: tgen vs torch (median ms)" | tee -a "$REPORT"
  for e in $BENCH; do
    n=${e%%:*} d=${e#*:}
    timeout 120 "$BUILD/$n/${n}_bench" --device cuda --train 1 --dims "$d" --iters 20 2>&1 | tail -1 | tee -a "$REPORT"
    (cd "$DIR" && timeout 300 "$PY" train_bench.py --graph "$DIR/$n.json" --dims "$d") 2>&1 | tail -3 | tee -a "$REPORT"
  done
fi
tar czf "$OUT/logs.tgz" -C "$BUILD" logs 2>/dev/null
echo "report: $REPORT"
