#!/bin/sh
# test_explain.sh TGEN MODEL.yaml: `tgen explain MODEL` exits 0, prints at
# least one pass, and in each pass every kernel line but the last is followed
# by a "stop before #N+1 NAME: REASON" line with a reason, the pass's total
# counts its kernels, and no line is wider than 100 columns.
tgen=$1
f=$2
tmp=$(mktemp) || exit 1
trap 'rm -f "$tmp"' EXIT
"$tgen" explain "$f" >"$tmp"
rc=$?
if [ $rc -ne 0 ]; then
  echo "FAIL: tgen explain $f exited $rc"
  exit 1
fi
awk '
  function done_pass() {
    if (pass == "") return
    if (stops != nk - 1) { printf "FAIL: %s pass: %d kernels, %d stop reasons\n", pass, nk, stops; bad = 1 }
    if (total != nk) { printf "FAIL: %s pass: %d kernel lines, the total says %d\n", pass, nk, total; bad = 1 }
  }
  /^[a-z]+ pass: [0-9]+ kernels?$/ { done_pass(); pass = $1; nk = 0; stops = 0; total = -1; passes++; next }
  /^ *[0-9]+  [^ ]/ { nk++; if (last_stop_for != nk - 1 && nk > 1) { printf "FAIL: %s pass: kernel %d has no stop reason\n", pass, nk - 1; bad = 1 }; next }
  /^     stop before #[0-9]+ [^ ]+: [^ ]/ {
    stops++
    n = substr($3, 2) + 0
    if (n != nk + 1) { printf "FAIL: %s pass: kernel %d stops before #%d\n", pass, nk, n; bad = 1 }
    last_stop_for = nk
    next
  }
  /^  total: [0-9]+ kernel/ { total = $2 + 0 }
  END { done_pass(); if (!passes) { print "FAIL: no pass printed"; bad = 1 }; exit bad }
' "$tmp" || { cat "$tmp"; exit 1; }
# 100 columns (characters; the one non-ASCII character is the "µ" of "µs")
wide=$(sed 's/µ/u/g' "$tmp" | awk 'length > 100' | head -n 3)
if [ -n "$wide" ]; then
  echo "FAIL: lines wider than 100 columns:"
  echo "$wide"
  exit 1
fi
echo "ok: tgen explain $f"
