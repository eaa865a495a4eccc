#!/bin/sh
# test_kill_output.sh TGEN WORK [N [SPEC_A SPEC_B [MAX_MS]]]: tgen killed
# (SIGKILL) at random points (0 to MAX_MS ms, default 30) while it regenerates
# OUT, N times (default 20), alternating two models (default mlp, mlp3): after
# each kill OUT is complete (all of one model's files, as a clean run writes
# them), and the user's files survive (in OUT, or moved back by the next run).
tgen=$1
work=$2
n=${3:-20}
a=${4:-spec/examples/mlp.yaml}
b=${5:-spec/examples/mlp3.yaml}
max_ms=${6:-30}
rm -rf "$work" && mkdir -p "$work" || exit 1
"$tgen" "$a" -o "$work/ref_a" >/dev/null && "$tgen" "$b" -o "$work/ref_b" >/dev/null ||
  exit 1
"$tgen" "$a" -o "$work/out" >/dev/null || exit 1
mkdir -p "$work/out/build" && echo mine >"$work/out/build/keep.txt" && echo mine >"$work/out/trained.safetensors"
# complete: every file of ref (a clean output) is in OUT, byte for byte
same() { (cd "$1" && find . -type f) | while read -r f; do cmp -s "$1/$f" "$work/out/$f" || { echo "$f"; break; }; done; }
user_ok() { # in OUT, or in a leftover of the killed run
  for f in build/keep.txt trained.safetensors; do
    found=0
    for p in "$work/out/$f" "$work"/out.*-*/"$f"; do [ -e "$p" ] && found=1; done
    [ $found -eq 1 ] || return 1
  done
}
fail=0 killed=0
i=0
while [ $i -lt "$n" ]; do
  spec=$a
  [ $((i % 2)) -eq 1 ] && spec=$b
  "$tgen" "$spec" -o "$work/out" >/dev/null 2>&1 &
  pid=$!
  sleep "$(awk -v s=$i -v m="$max_ms" 'BEGIN { srand(s); printf "%.3f", int(rand() * m) / 1000 }')"
  kill -9 $pid 2>/dev/null && killed=$((killed + 1))
  wait $pid 2>/dev/null
  if [ -n "$(same "$work/ref_a")" ] && [ -n "$(same "$work/ref_b")" ]; then
    echo "FAIL: kill $i: OUT is neither model's complete output"
    fail=1
  fi
  user_ok || { echo "FAIL: kill $i: a user file is gone"; fail=1; }
  i=$((i + 1))
done
# the next run mends everything: the new model, the user's files, no leftovers
"$tgen" "$a" -o "$work/out" >/dev/null 2>&1 && [ -z "$(same "$work/ref_a")" ] &&
  [ -e "$work/out/build/keep.txt" ] && [ -e "$work/out/trained.safetensors" ] &&
  [ -z "$(ls "$work" | grep -E 'out\.(tmp|old)-')" ] || { echo "FAIL: the run after the kills"; ls "$work"; fail=1; }
[ $fail -eq 0 ] && echo "ok: $n runs ($killed killed mid-way): OUT always complete, the user's files kept"
exit $fail
