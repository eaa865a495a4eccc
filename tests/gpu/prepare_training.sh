#!/usr/bin/env bash
# prepare_training.sh [DEST]: what check_training.sh needs on the GPU machine
# (which has no libyaml, so no tgen): every model with train: emitted into
# DEST/NAME/ with its graph DEST/NAME.json, the gradient-check folders
# DEST/grad/NAME/ (graph.json, inputs, params for models under 64 MB of
# params, dims), and the scripts. DEST defaults to .dev/train (git-ignored).
set -eu
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEST=${1:-$ROOT/.dev/train}
TGEN=${TGEN:-$ROOT/build/tgen}
rm -rf "$DEST"
mkdir -p "$DEST/grad"
cd "$ROOT"
# spec|dims of the gradient check
for e in "spec/examples/mlp.yaml|B=4" "spec/examples/mlp3.yaml|B=4" "spec/examples/mlp_blocks.yaml|B=2" \
         "tests/data/gpt2_tiny.yaml|B=2" "spec/examples/gpt2.yaml|B=2" "tests/e2e/train_ops.yaml|" \
         "tests/e2e/train_ops_bf16.yaml|"; do
  s=${e%%|*} d=${e#*|}
  n=$(basename "$s" .yaml)
  "$TGEN" "$s" -o "$DEST/$n" > /dev/null
  "$TGEN" check --json "$s" > "$DEST/$n.json"
  [ -n "$d" ] || continue
  w=$DEST/grad/$n
  python3 tests/oracle/check_grad.py --tgen "$TGEN" --spec "$s" --work "$w" --dims "$d" > "$w.log" 2>&1 || true
  echo "$d" > "$w/dims"
  rm -f "$w/subject.safetensors" "$w/oracle.safetensors" "$w.log"
  # big params are made on the GPU machine from the seed instead
  [ "$(stat -c %s "$w/params.safetensors")" -lt $((16 << 20)) ] || rm -f "$w/params.safetensors"
done
cp tests/gpu/torch_oracle.py tests/gpu/check_training.sh tests/gpu/train_bench.py tests/gpu/grad_parity.py "$DEST/"
du -sh "$DEST"
