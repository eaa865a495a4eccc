#!/bin/sh
# run_error_test.sh TGEN FILE: one tests-as-data refusal case.
#
# FILE carries its expectation in its first line:   # error: LINE:COL: MESSAGE
# (or, for files that cannot hold a comment, in FILE.expect). tgen check FILE
# must exit 1, print nothing on stdout, and print on stderr exactly
#   FILE:LINE:COL: error: MESSAGE
# followed, when LINE > 0, by the source line and a line ending in a caret.
tgen=$1
f=$2
if [ -f "$f.expect" ]; then
  want=$(head -n 1 "$f.expect")
else
  want=$(head -n 1 "$f" | sed -n 's/^# error: //p')
fi
if [ -z "$want" ]; then
  echo "FAIL: $f has no '# error: LINE:COL: MESSAGE' first line (nor a .expect file)"
  exit 1
fi
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
"$tgen" check "$f" >"$tmp/out" 2>"$tmp/err"
rc=$?
fail=0
if [ $rc -ne 1 ]; then
  echo "FAIL: exit status $rc, expected 1"
  fail=1
fi
if [ -s "$tmp/out" ]; then
  echo "FAIL: stdout is not empty:"
  cat "$tmp/out"
  fail=1
fi
case "$want" in
  0:0:*) expected="$f: error: ${want#0:0: }" ;;
  *) expected="$f:${want%%: *}: error: ${want#*: }" ;;
esac
got=$(head -n 1 "$tmp/err")
if [ "$got" != "$expected" ]; then
  echo "FAIL: first line of stderr differs"
  echo "  expected: $expected"
  echo "  got:      $got"
  fail=1
fi
case "$want" in
  0:0:*) ;;
  *)
    if [ "$(wc -l <"$tmp/err")" -lt 3 ] || ! sed -n 3p "$tmp/err" | grep -q '\^$'; then
      echo "FAIL: stderr lacks the source line and caret:"
      fail=1
    fi ;;
esac
if [ $fail -ne 0 ]; then
  echo "--- stderr:"
  cat "$tmp/err"
  exit 1
fi
echo "ok: $got"
