#!/usr/bin/env bash
# bench/prepare.sh: everything bench/run.py needs on the GPU machine (which has
# no libyaml, so no tgen): one emitted project DEST/NAME/ per benchmark model,
# its graph DEST/NAME.json (tgen check --json), and run.py + torch_oracle.py.
#
#   bench/prepare.sh [DEST] [--tgen PATH] [--golden]
#
#   DEST       default .dev/bench in the repo (git-ignored); carry it to the
#              device as is: carry [".dev/bench"], then
#              python3 .dev/bench/run.py --out $OUT
#   --tgen     the tgen binary (default: build/tgen)
#   --golden   keep the emitted golden test vectors (default: --no-golden;
#              run.py does not use them)
#
# Models: the PERF.md GPU workloads from spec/examples/ (tinyops,
# ln_linear_gelu_res, mlp3, mlp_blocks, seed_attention, gpt2) and the CPU
# anchors' sizes from bench/specs/ (tinyops_cpu, mlp_blocks_cpu, gpt2_cpu).
# DEST is emptied first. Its size is printed; it must stay under 60 MiB.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEST=
TGEN=$ROOT/build/tgen
GOLDEN=--no-golden
while [ $# -gt 0 ]; do
  case "$1" in
    --tgen) TGEN=$2; shift ;;
    --golden) GOLDEN= ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "prepare.sh: unknown option $1" >&2; exit 2 ;;
    *) DEST=$1 ;;
  esac
  shift
done
DEST=${DEST:-$ROOT/.dev/bench}
case "$TGEN" in /*) ;; *) TGEN=$(pwd)/$TGEN ;; esac
[ -x "$TGEN" ] || { echo "prepare.sh: no tgen at $TGEN (build it: cmake -S . -B build && cmake --build build -j2)" >&2; exit 2; }

rm -rf "$DEST"
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
cd "$ROOT" || exit 2

specs=(spec/examples/tinyops.yaml spec/examples/ln_linear_gelu_res.yaml spec/examples/mlp3.yaml
       spec/examples/mlp_blocks.yaml spec/examples/seed_attention.yaml spec/examples/gpt2.yaml
       bench/specs/tinyops_cpu.yaml bench/specs/mlp_blocks_cpu.yaml bench/specs/gpt2_cpu.yaml
       bench/specs/tinyops_fwdbwd.yaml)
ok=0 bad=0
: > "$DEST/prepare.log"
for s in "${specs[@]}"; do
  n=$(basename "$s" .yaml)
  t0=$(date +%s%N)
  # relative spec paths, so no absolute path of this machine lands in the output
  log=$("$TGEN" "$s" -o "$DEST/$n" $GOLDEN 2>&1 && "$TGEN" check --json "$s" 2>&1 > "$DEST/$n.json")
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '== %s (rc %s, %s ms)\n%s\n' "$s" "$rc" "$ms" "$log" >> "$DEST/prepare.log"
  if [ $rc = 0 ]; then
    ok=$((ok + 1))
    printf '%-20s %6s  (tgen: %s ms)\n' "$n" "$(du -sh "$DEST/$n" | cut -f1)" "$ms"
  else
    bad=$((bad + 1))
    rm -f "$DEST/$n.json"
    echo "$n: FAILED"
    echo "$log" | tail -3 | sed 's/^/    /'
  fi
done
cp bench/run.py tests/gpu/torch_oracle.py "$DEST/"
chmod +x "$DEST/run.py"
git -C "$ROOT" rev-parse --short HEAD > "$DEST/COMMIT" 2>/dev/null || true

bytes=$(du -sb "$DEST" | cut -f1)
mib=$(( (bytes + 1048575) / 1048576 ))
echo "prepared $ok model(s) in $DEST ($bad failed): $mib MiB"
if [ "$bytes" -gt $((60 * 1048576)) ]; then
  echo "WARNING: $DEST is $mib MiB, over the 60 MiB budget. Largest files:"
  find "$DEST" -type f -printf '%s %p\n' | sort -rn | head -10 |
    awk '{ printf "  %8.1f MiB  %s\n", $1 / 1048576, $2 }'
fi
echo "on the GPU machine (carry [\"${DEST#$ROOT/}\"]): python3 ${DEST#$ROOT/}/run.py --out \$OUT [--gpt2] [--cpu] [--only NAME,...]"
[ $bad = 0 ]
