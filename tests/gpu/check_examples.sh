#!/usr/bin/env bash
# check_examples.sh: builds, tests and parity-checks tgen's emitted example
# projects on a GPU machine (no tgen needed there: tests/gpu/prepare.sh made
# everything on the build machine).
#
#   OUT=out bash check_examples.sh [options] [NAME...]
#
# The folder this script sits in (or --dir DIR) holds, per example NAME, the
# emitted project NAME/ and its graph NAME.json, plus torch_oracle.py and
# parity.py. For each example (default: every NAME.json with a NAME/):
#   1. build:  cmake -S NAME -B BUILD/NAME-build -DCMAKE_CUDA_ARCHITECTURES=90
#              and cmake --build (all examples in parallel);
#   2. ctest:  the emitted tests (golden_cpu, golden_cuda, api, runner);
#   3. parity: parity.py: small dims and inputs, NAME_run on cuda and cpu with
#              the same params (--seed 0), torch_oracle.py on the same params
#              and inputs in the model dtype and in float64; one row per
#              output with max|a-b|/max|ref| against torch-f64, PASS/FAIL at
#              f32 1e-4, bf16 3e-2, f16 5e-3;
#   4. with --bench: NAME_bench --device cuda vs torch eager and torch.compile
#              of the oracle graph (dims: BENCH_DIMS, else each dim's max).
# $OUT (default ./out) gets two files: parity.txt (the report) and logs.tgz
# (cmake, build, ctest and parity logs). Bulky things (inputs, params, outputs
# of each example: gpt2's params alone are 250 MB) stay in $WORK (default
# /tmp/tgen-gpu-work), as do the logs themselves; the device machine returns
# at most 8 files of 16 MiB from $OUT.
#
# Options:
#   --dir DIR        the prepared folder (default: this script's folder)
#   --build DIR      where NAME-build/ go (default: $BUILD_ROOT, else --dir;
#                    put them outside a folder that `run` re-carries, e.g.
#                    /tmp/tgen-gpu, so a later call can reuse them)
#   --no-build       reuse existing builds      --no-ctest   skip ctest
#   --no-parity      skip the parity runs       --no-cpu     skip tgen's CPU run in parity
#   --bench          time the forward pass (BENCH_DIMS="gpt2:B=16;mlp3:B=32")
#   --arch A         CMAKE_CUDA_ARCHITECTURES (default 90)
# Environment: OUT, WORK, BUILD_ROOT, JOBS (parallel compile jobs, default nproc),
# CTEST_TIMEOUT (s per test, default 120), PARITY_TIMEOUT (s per runner
# call, default 180), TIME_BUDGET (s: no new ctest or parity step starts
# after this much time, so the report is still written inside the device's
# 10-minute command limit; default 480), PYTHON (default python3).
# Examples run smallest first (by parameter count), so a budget cut drops
# the big ones (gpt2).
set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=$HERE
BUILD=${BUILD_ROOT:-}
ARCH=90
DO_BUILD=1 DO_CTEST=1 DO_PARITY=1 NO_CPU=0 BENCH=0
NAMES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) DIR=$2; shift ;;
    --build) BUILD=$2; shift ;;
    --arch) ARCH=$2; shift ;;
    --no-build) DO_BUILD=0 ;;
    --no-ctest) DO_CTEST=0 ;;
    --no-parity) DO_PARITY=0 ;;
    --no-cpu) NO_CPU=1 ;;
    --bench) BENCH=1 ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    -*) echo "check_examples.sh: unknown option $1" >&2; exit 2 ;;
    *) NAMES+=("$1") ;;
  esac
  shift
done
DIR=$(cd "$DIR" && pwd)
BUILD=${BUILD:-$DIR}
mkdir -p "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
OUT=${OUT:-./out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=${WORK:-/tmp/tgen-gpu-work}
LOGS=$WORK/logs
rm -rf "$LOGS"
mkdir -p "$LOGS"
WORK=$(cd "$WORK" && pwd)
export OUT WORK PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 8)}
CTEST_TIMEOUT=${CTEST_TIMEOUT:-120}
export PARITY_TIMEOUT=${PARITY_TIMEOUT:-180}
TIME_BUDGET=${TIME_BUDGET:-480}
T0=$(date +%s)
over_budget() { [ $(( $(date +%s) - T0 )) -ge "$TIME_BUDGET" ]; }

if [ ${#NAMES[@]} -eq 0 ]; then
  for j in "$DIR"/*.json; do
    n=$(basename "$j" .json)
    [ -f "$DIR/$n/CMakeLists.txt" ] && NAMES+=("$n")
  done
fi
if [ ${#NAMES[@]} -eq 0 ]; then
  echo "check_examples.sh: no prepared examples in $DIR (run tests/gpu/prepare.sh)" >&2
  exit 2
fi
# smallest first
mapfile -t NAMES < <("${PYTHON:-python3}" - "$DIR" "${NAMES[@]}" <<'PYEOF'
import json, math, sys
d, names = sys.argv[1], sys.argv[2:]
def size(n):
    try:
        g = json.load(open(f"{d}/{n}.json"))
        return sum(math.prod(x for x in p["shape"] if isinstance(x, int)) for p in g["params"]) + len(g["nodes"])
    except Exception:
        return 0
print("\n".join(sorted(names, key=size)))
PYEOF
)

# nvcc is often installed but not on PATH
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

REPORT=$OUT/parity.txt
CTEST_TXT=$LOGS/ctest_summary.txt
ROWS=$LOGS/parity_rows.txt
: > "$CTEST_TXT"
: > "$ROWS"
say() { echo "$@"; }

{
  echo "== tgen GPU check, $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname)"
  gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
  echo "gpu:    ${gpu:-none}"
  echo "nvcc:   $(nvcc --version 2>/dev/null | tail -1 || echo none)"
  echo "cmake:  $(cmake --version 2>/dev/null | head -1)"
  echo "torch:  $($PY -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -1)"
  echo "examples: ${NAMES[*]}"
} > "$LOGS/env.txt"
cat "$LOGS/env.txt"

# ---------------------------------------------------------------- 1. build
if [ $DO_BUILD = 1 ]; then
  say "== building ${#NAMES[@]} projects (arch $ARCH, $JOBS jobs)"
  per=$(( JOBS / ${#NAMES[@]} )); [ $per -lt 2 ] && per=2
  for n in "${NAMES[@]}"; do
    (
      t0=$(date +%s)
      if cmake -S "$DIR/$n" -B "$BUILD/$n-build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
           > "$LOGS/$n.cmake.log" 2>&1 &&
         cmake --build "$BUILD/$n-build" -j "$per" > "$LOGS/$n.build.log" 2>&1; then
        cuda=$(grep -o 'CUDA path: [A-Z]*' "$LOGS/$n.cmake.log" | head -1)
        echo "ok $(( $(date +%s) - t0 ))s${cuda:+, $cuda}" > "$LOGS/$n.build.status"
      else
        echo "FAILED $(( $(date +%s) - t0 ))s (logs/$n.cmake.log, logs/$n.build.log in logs.tgz)" > "$LOGS/$n.build.status"
      fi
    ) &
  done
  wait
fi

# ---------------------------------------------------------------- 2. ctest
# "1/4 Test #1: golden_cpu .......   Passed    0.01 sec" -> golden_cpu=Passed
ctest_summary() {
  awk '/Test +#[0-9]+:/ {
         line = $0; sub(/.*Test +#[0-9]+: /, "", line)
         name = line; sub(/ .*/, "", name)
         st = line; sub(/^[^ ]+ \.*/, "", st); sub(/ +[0-9.]+ sec.*$/, "", st)
         gsub(/\*/, "", st); gsub(/^ +| +$/, "", st); gsub(/ +/, "_", st)
         printf "%s=%s ", name, st }' "$1"
}

for n in "${NAMES[@]}"; do
  b=$(cat "$LOGS/$n.build.status" 2>/dev/null || { [ -x "$BUILD/$n-build/${n}_run" ] && echo "reused" || echo "not built"; })
  line="$(printf '%-20s build: %s' "$n" "$b")"
  if [ $DO_CTEST = 1 ] && over_budget; then
    line="$line; ctest skipped (time budget)"
  elif [ $DO_CTEST = 1 ] && [ -d "$BUILD/$n-build" ]; then
    (cd "$BUILD/$n-build" && ctest --output-on-failure --timeout "$CTEST_TIMEOUT") > "$LOGS/$n.ctest.log" 2>&1
    rc=$?
    line="$line; ctest (rc $rc): $(ctest_summary "$LOGS/$n.ctest.log")"
  fi
  say "$line"
  echo "$line" >> "$CTEST_TXT"
done

# ---------------------------------------------------------------- 3. parity (+ 4. bench)
if [ $DO_PARITY = 1 ]; then
  say "== parity (max|a-b|/max|ref| against torch float64)"
  first=--header
  for n in "${NAMES[@]}"; do
    if over_budget; then
      printf '%-20s parity skipped (time budget %ss)\n' "$n" "$TIME_BUDGET" | tee -a "$ROWS"
      continue
    fi
    args=(--dir "$DIR" --name "$n" --build "$BUILD" --work "$WORK/$n" --report "$ROWS")
    [ -n "$first" ] && args+=("$first") && first=
    [ $NO_CPU = 1 ] && args+=(--no-cpu)
    if [ $BENCH = 1 ]; then
      args+=(--bench)
      bd=${BENCH_DIMS:-}
      for e in ${bd//;/ }; do
        [ "${e%%:*}" = "$n" ] && args+=(--bench-dims "${e#*:}")
      done
    fi
    "$PY" "$DIR/parity.py" "${args[@]}" 2> "$LOGS/$n.parity.stderr" ||
      echo "   ($n: parity.py exit $?; see logs/$n.parity.log, logs/$n.parity.stderr in logs.tgz)"
    cp "$WORK/$n/parity.log" "$LOGS/$n.parity.log" 2>/dev/null
  done
fi

# ---------------------------------------------------------------- report
{
  cat "$LOGS/env.txt"
  echo
  echo "== build + ctest"
  cat "$CTEST_TXT"
  if [ $DO_PARITY = 1 ]; then
    echo
    echo "== parity: max|a-b|/max|ref| per output against torch float64 (same params and inputs);"
    echo "   torch-vs-f64 = torch in the model dtype, what that dtype allows; tol: f32 1e-4, bf16 3e-2, f16 5e-3"
    grep -v '^bench: ' "$ROWS"
    if [ $BENCH = 1 ]; then
      echo
      echo "== bench: forward pass, median ms (tgen NAME_bench vs the oracle graph in torch eager / torch.compile)"
      grep '^bench: ' "$ROWS" | sed 's/^bench: //'
    fi
  fi
} > "$REPORT"
tar czf "$OUT/logs.tgz" -C "$WORK" logs
echo
echo "report: $REPORT (logs: $OUT/logs.tgz; inputs, params, outputs: $WORK/NAME/)"
fails=$(grep -c -E ' FAIL|ERROR|FAILED|Failed' "$REPORT")
echo "problems: $fails"
[ "$fails" = 0 ]
