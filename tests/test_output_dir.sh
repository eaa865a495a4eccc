#!/bin/sh
# test_output_dir.sh TGEN WORK: tgen writes its output directory atomically,
# replaces only a directory it made (and there only its own files), mends what
# a killed run left, and writes nothing for a refused spec.
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
# its own output is replaced, the user's files in it are kept (a build
# directory, a trained checkpoint), and no temporaries are left behind
"$tgen" spec/examples/mlp.yaml -o "$work/out" >/dev/null && mkdir -p "$work/out/build/x" "$work/out/src/mine" &&
  echo mine >"$work/out/trained.safetensors" && echo mine >"$work/out/build/x/CMakeCache.txt" &&
  echo mine >"$work/out/src/mine/notes.txt" && echo edited >>"$work/out/README.md" &&
  "$tgen" spec/examples/mlp.yaml -o "$work/out" >/dev/null &&
  [ "$(cat "$work/out/trained.safetensors" "$work/out/build/x/CMakeCache.txt" "$work/out/src/mine/notes.txt")" = \
    "$(printf 'mine\nmine\nmine')" ] && ! grep -q edited "$work/out/README.md" &&
  [ -z "$(ls "$work" | grep -E 'tmp-|old-')" ] && say "ok: replaces its own files, keeps the user's, no temporaries left" ok ||
  say "FAIL: replacing own output" bad
# a file tgen wrote last time and no longer writes goes
printf 'file: src/gone.c\n' >>"$work/out/.tgen-output" && echo old >"$work/out/src/gone.c" &&
  "$tgen" spec/examples/mlp.yaml -o "$work/out" >/dev/null && [ ! -e "$work/out/src/gone.c" ] &&
  [ -e "$work/out/trained.safetensors" ] && say "ok: tgen's stale files removed" ok || say "FAIL: stale tgen file" bad
# -o naming a symlink updates the target; the link stays a link
ln -s out "$work/link" && echo stale >>"$work/out/CMakeLists.txt" &&
  "$tgen" spec/examples/mlp.yaml -o "$work/link" >/dev/null && [ -L "$work/link" ] &&
  ! grep -q stale "$work/out/CMakeLists.txt" && [ -e "$work/out/trained.safetensors" ] &&
  say "ok: a symlink's target is updated" ok || say "FAIL: symlink" bad
# leftovers of runs killed mid-swap (a pid that is gone): with no OUT, its old
# copy comes back; the user's files in a leftover move back into OUT
sh -c 'exit 0' & dead=$!; wait $dead
mv "$work/out" "$work/out.old-$dead" &&
  "$tgen" spec/examples/mlp.yaml -o "$work/out" >/dev/null 2>"$work/err.txt" && grep -q restored "$work/err.txt" &&
  [ -e "$work/out/trained.safetensors" ] && [ -z "$(ls "$work" | grep -E 'tmp-|old-')" ] &&
  say "ok: an output left aside by a killed run is restored" ok || say "FAIL: restore after a kill" bad
cp -r "$work/out" "$work/out.tmp-$dead" && rm -r "$work/out/build" "$work/out/src/mine" "$work/out/trained.safetensors" &&
  "$tgen" spec/examples/mlp.yaml -o "$work/out" >/dev/null && [ -e "$work/out/trained.safetensors" ] &&
  [ -e "$work/out/build/x/CMakeCache.txt" ] && [ -e "$work/out/src/mine/notes.txt" ] &&
  [ -z "$(ls "$work" | grep -E 'tmp-|old-')" ] &&
  say "ok: the user's files in a killed run's leftover move back" ok || say "FAIL: leftover after a kill" bad
# missing -o is a usage error
"$tgen" spec/examples/mlp.yaml 2>/dev/null
[ $? -eq 2 ] && say "ok: missing -o is a usage error" ok || say "FAIL: missing -o" bad
exit $fail
