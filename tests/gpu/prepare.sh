#!/usr/bin/env bash
# prepare.sh: everything check_examples.sh needs on the GPU machine (which has
# no libyaml, so no tgen): every spec/examples/*.yaml emitted as a project
# DEST/NAME/ with its graph DEST/NAME.json (tgen check --json), and the
# scripts torch_oracle.py, parity.py and check_examples.sh beside them.
#
#   tests/gpu/prepare.sh [DEST] [--with-opspecs] [--tgen PATH] [--no-clean]
#
#   DEST            default .dev/gpu in the repo (ignored by git; hand it to
#                   the device with carry: [".dev/gpu"])
#   --with-opspecs  also the op-coverage specs tests/gpu/oracle_specs/*.yaml
#   --with-e2e      also the end-to-end specs tests/e2e/*.yaml and tests/data/gpt2_tiny.yaml
#   --with-dist     also gpt2_tiny and gpt2 generated with --distributed nccl into DEST/dist/
#                   (for check_dist.sh on a machine with 2 or more GPUs)
#   --tgen PATH     the tgen binary (default: build/tgen)
#   --no-clean      keep what DEST already holds (default: empty it first)
#
# Then, on the GPU machine: OUT=... bash .dev/gpu/check_examples.sh
# The folder must stay under the device's 64 MiB carry limit: its size is
# printed, and a warning (with the largest files) is given above 56 MiB.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEST=
TGEN=$ROOT/build/tgen
OPSPECS=0
E2E=0
DIST=0
CLEAN=1
while [ $# -gt 0 ]; do
  case "$1" in
    --with-opspecs) OPSPECS=1 ;;
    --with-e2e) E2E=1 ;;
    --with-dist) DIST=1 ;;
    --tgen) TGEN=$2; shift ;;
    --no-clean) CLEAN=0 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "prepare.sh: unknown option $1" >&2; exit 2 ;;
    *) DEST=$1 ;;
  esac
  shift
done
DEST=${DEST:-$ROOT/.dev/gpu}
case "$TGEN" in /*) ;; *) TGEN=$(pwd)/$TGEN ;; esac
[ -x "$TGEN" ] || { echo "prepare.sh: no tgen at $TGEN (build it first)" >&2; exit 2; }

if [ $CLEAN = 1 ] && [ -d "$DEST" ]; then
  # only what an earlier prepare.sh put there
  for j in "$DEST"/*.json; do
    [ -e "$j" ] || continue
    n=$(basename "$j" .json)
    rm -rf "${DEST:?}/$n" "$j"
  done
  rm -f "$DEST/torch_oracle.py" "$DEST/parity.py" "$DEST/check_examples.sh" "$DEST/check_dist.sh" "$DEST/prepare.log"
  rm -rf "${DEST:?}/dist"
fi
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)

cd "$ROOT" || exit 2
specs=(spec/examples/*.yaml)
[ $OPSPECS = 1 ] && specs+=(tests/gpu/oracle_specs/*.yaml)
[ $E2E = 1 ] && specs+=(tests/e2e/*.yaml tests/data/gpt2_tiny.yaml)
ok=0 bad=0
: > "$DEST/prepare.log"
for s in "${specs[@]}"; do
  n=$(basename "$s" .yaml)
  # relative spec paths, so no absolute path of this machine lands in the output
  log=$("$TGEN" "$s" -o "$DEST/$n" 2>&1 && "$TGEN" check --json "$s" 2>&1 > "$DEST/$n.json")
  rc=$?
  printf '== %s (rc %s)\n%s\n' "$s" "$rc" "$log" >> "$DEST/prepare.log"
  if [ $rc = 0 ]; then
    ok=$((ok + 1))
    printf '%-22s %s\n' "$n" "$(du -sh "$DEST/$n" | cut -f1)"
  else
    bad=$((bad + 1))
    rm -f "$DEST/$n.json"
    echo "$n: FAILED"
    echo "$log" | tail -3 | sed 's/^/    /'
  fi
done
if [ $DIST = 1 ]; then
  for s in tests/data/gpt2_tiny.yaml spec/examples/gpt2.yaml; do
    n=$(basename "$s" .yaml)
    if "$TGEN" "$s" -o "$DEST/dist/$n" --distributed nccl >> "$DEST/prepare.log" 2>&1; then
      printf '%-22s %s\n' "dist/$n" "$(du -sh "$DEST/dist/$n" | cut -f1)"
    else
      bad=$((bad + 1))
      echo "dist/$n: FAILED"
    fi
  done
  cp tests/gpu/check_dist.sh "$DEST/"
fi
cp tests/gpu/torch_oracle.py tests/gpu/parity.py tests/gpu/check_examples.sh "$DEST/"
chmod +x "$DEST/check_examples.sh"

bytes=$(du -sb "$DEST" | cut -f1)
mib=$(( (bytes + 1048575) / 1048576 ))
echo "prepared $ok example(s) in $DEST ($bad failed): $mib MiB"
if [ "$bytes" -gt $((56 * 1048576)) ]; then
  echo "WARNING: $DEST is $mib MiB; the device carries at most 64 MiB in all. Largest files:"
  find "$DEST" -type f -printf '%s %p\n' | sort -rn | head -10 |
    awk '{ printf "  %8.1f MiB  %s\n", $1 / 1048576, $2 }'
fi
[ $bad = 0 ]
