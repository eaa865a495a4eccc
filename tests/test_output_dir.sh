#!/bin/sh
# test_output_dir.sh TGEN WORK: tgen writes its output directory atomically,
# replaces only a directory it made, and writes nothing for a refused spec.
tgen=$1
work=$2
fail=0
rm -rf "$work" && mkdir -p "$work"
say() { echo "$1"; [ "$2" = ok ] || fail=1; }

# a refused spec writes nothing
"$tgen" tests/errors/unknown_key.yaml -o "$work/refused" 2>/dev/null
[ $? -eq 1 ] && [ ! -e "$work/refused" ] && say "ok: refused spec writes nothing" ok || say "FAIL: refused spec" bad
# a directory tgen did not make is left alone
mkdir -p "$work/mine" && echo keep >"$work/mine/file.txt"
"$tgen" spec/examples/mlp.yaml -o "$work/mine" 2>"$work/err.txt"
rc=$?
[ $rc -eq 1 ] && [ "$(cat "$work/mine/file.txt")" = keep ] && grep -q "not created by tgen" "$work/err.txt" &&
  say "ok: refuses to overwrite a foreign directory" ok || say "FAIL: foreign directory (rc $rc)" bad
# a plain file is left alone too
echo keep >"$work/afile"
"$tgen" spec/examples/mlp.yaml -o "$work/afile" 2>/dev/null
[ $? -eq 1 ] && [ "$(cat "$work/afile")" = keep ] && say "ok: refuses to replace a file" ok || say "FAIL: file replaced" bad
# its own output is replaced, and leaves no temporaries behind
"$tgen" spec/examples/mlp.yaml -o "$work/out" >/dev/null && echo stale >"$work/out/stale.txt" &&
  "$tgen" spec/examples/mlp.yaml -o "$work/out" >/dev/null && [ ! -e "$work/out/stale.txt" ] &&
  [ -z "$(ls "$work" | grep -E 'tmp-|old-')" ] && say "ok: replaces its own output, no temporaries left" ok ||
  say "FAIL: replacing own output" bad
# missing -o is a usage error
"$tgen" spec/examples/mlp.yaml 2>/dev/null
[ $? -eq 2 ] && say "ok: missing -o is a usage error" ok || say "FAIL: missing -o" bad
exit $fail
