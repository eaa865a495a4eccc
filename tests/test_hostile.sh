#!/bin/sh
# test_hostile.sh TGEN DIR: inputs a hostile user would try, generated here
# (too big to keep as files): each must be refused with a located message, or
# accepted, in linear time and memory; never a crash.
tgen=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail=0
# each run gets 20 s and 1 GiB of address space: a quadratic pass or a stack
# overflow shows as a timeout or a signal (a sanitizer build maps terabytes
# of shadow memory and cannot start under an address-space limit: it gets
# the time limit only; the shell may print "Aborted" for the probe)
vlimit=1048576
( (ulimit -v $vlimit; "$tgen" --version) >/dev/null 2>&1 ) 2>/dev/null || vlimit=unlimited
run() { (ulimit -v $vlimit; timeout 20 "$tgen" "$@") >"$dir/out" 2>"$dir/err"; }
expect() { # expect RC FIRST-LINE-OF-STDERR (a prefix) -- what
  if [ "$rc" -ne "$1" ]; then echo "FAIL ($3): exit status $rc, expected $1"; head -c 600 "$dir/err"; fail=1; return; fi
  case "$(head -n 1 "$dir/err")" in
    "$2"*) ;;
    *) echo "FAIL ($3): stderr starts:"; head -c 600 "$dir/err"; echo "expected: $2"; fail=1 ;;
  esac
}
header() { printf 'name: chain\ndtype: f32\ndims:\n  B: 4\ninputs:\n  x: [B]\ngraph:\n'; }

# one binding with an N-term chain x + x + ... + x (80 KB and 800 KB)
for n in 20000 200000; do
  { header; printf '  - y: x'; awk -v n=$n 'BEGIN { for (i = 1; i < n; i++) printf " + x"; print "" }'
    printf 'outputs: [y]\n'; } >"$dir/chain$n.yaml"
  run check "$dir/chain$n.yaml"; rc=$?
  expect 1 "$dir/chain$n.yaml:8:1034: error: expression nested more than 256 levels deep" "chain of $n terms"
done
# 256 terms in one chain are fine; 20,000 bindings in a line and side by side too
{ header; printf '  - y: x'; awk 'BEGIN { for (i = 1; i < 256; i++) printf " * x"; print "" }'
  printf 'outputs: [y]\n'; } >"$dir/chain256.yaml"
run check "$dir/chain256.yaml"; rc=$?
expect 0 "" "chain of 256 terms"
{ header; echo "  - y0: x"; awk 'BEGIN { for (i = 1; i <= 20000; i++) printf "  - y%d: y%d + x\n", i, i - 1 }'
  printf '  - y: y20000 + 1\noutputs: [y]\n'; } >"$dir/long.yaml"
run check "$dir/long.yaml"; rc=$?
expect 0 "" "20,000 bindings in a line"
{ header; awk 'BEGIN { for (i = 0; i < 20000; i++) printf "  - y%d: x * %d\n", i, i }'
  printf '  - y: y19999 + y0\noutputs: [y]\n'; } >"$dir/wide.yaml"
run check "$dir/wide.yaml"; rc=$?
expect 0 "" "20,000 bindings side by side"
# generated, not only checked: the scheduler, the memory plan and the
# renderer stay linear (a chain is stored every 256 ops, a fused kernel holds
# at most 64 values); 200,000 bindings in a line checked
run "$dir/long.yaml" -o "$dir/long_out"; rc=$?
expect 0 "" "a project from 20,000 bindings in a line"
{ header; echo "  - y0: x"; awk 'BEGIN { for (i = 1; i <= 200000; i++) printf "  - y%d: y%d + x\n", i, i - 1 }'
  printf '  - y: y200000 + 1\noutputs: [y]\n'; } >"$dir/long200k.yaml"
run check "$dir/long200k.yaml"; rc=$?
expect 0 "" "200,000 bindings in a line"
# a training chain: 2,000 uses of one param (its gradient sums 2,000 terms)
{ printf 'name: tchain\ndtype: f32\ndims:\n  B: 4\ninputs:\n  x: [B, 8]\nparams:\n  w: {shape: [8]}\ngraph:\n  - y0: x * w\n'
  awk 'BEGIN { for (i = 1; i < 2000; i++) printf "  - y%d: tanh(y%d) * w\n", i, i - 1 }'
  printf '  - loss: sum(y1999)\noutputs: [loss]\ntrain: {loss: loss, optimizer: {sgd: {lr: 0.1}}}\n'; } >"$dir/tchain.yaml"
run "$dir/tchain.yaml" -o "$dir/tchain_out"; rc=$?
expect 0 "" "a training chain of 2,000 bindings"
rm -rf "$dir/long_out" "$dir/tchain_out"
# GPT-2 with 96 layers (many buffers named alike: 'h', 'd_h', ...; was minutes)
sed 's/repeat(block, 12, x)/repeat(block, 96, x)/' spec/examples/gpt2.yaml >"$dir/gpt2_96.yaml"
run check "$dir/gpt2_96.yaml"; rc=$?
expect 0 "" "GPT-2 with 96 layers"
# GPT-2 with 400 layers: 2 s (6.5 s under ASan); the search for the GEMMs
# that sum the bias gradients was cubic in the layers (19 s at 300 layers,
# found by the spec fuzzer at 88 layers under its instrumentation)
sed 's/repeat(block, 12, x)/repeat(block, 400, x)/' spec/examples/gpt2.yaml >"$dir/gpt2_400.yaml"
run check "$dir/gpt2_400.yaml"; rc=$?
expect 0 "" "GPT-2 with 400 layers"

# a 5,000-character model name: the message keeps its reason; a 64k-character
# binding name: YAML's key length limit, named
{ printf 'name: '; awk 'BEGIN { for (i = 0; i < 5000; i++) printf "a"; print "-b" }'
  printf 'dims: {B: 2}\ninputs:\n  x: [B]\ngraph:\n  - y: x + 1\n'; } >"$dir/longname.yaml"
run check "$dir/longname.yaml"; rc=$?
expect 1 "$dir/longname.yaml:1:7: error: name 'aaaa" "a 5,000-character name"
head -n 1 "$dir/err" | grep -q "a-b' is not a C identifier (letters, digits and '_', not starting with a digit)\$" ||
  { echo "FAIL: a 5,000-character name: the reason is cut off"; fail=1; }
{ printf 'name: q\ndims: {B: 2}\ninputs:\n  x: [B]\ngraph:\n  - '
  awk 'BEGIN { for (i = 0; i < 65536; i++) printf "b"; print ": x + 1" }'; } >"$dir/longkey.yaml"
run check "$dir/longkey.yaml"; rc=$?
expect 1 "$dir/longkey.yaml:6:65541: error: a key longer than 1024 characters (YAML's limit for a plain key)" "64k key"
# a dim given twice
printf 'name: d\ndims:\n  B: {dynamic: true, max: 4}\ninputs:\n  x: [B]\ngraph:\n  - y: x + 1\n' >"$dir/d.yaml"
run eval "$dir/d.yaml" --dims B=2,B=3; rc=$?
expect 2 "tgen: --dims: B is given twice" "--dims B=2,B=3"

# a file that never ends, and a directory
run check /dev/zero; rc=$?
expect 1 "/dev/zero: error: larger than 16 MiB; a model spec is limited to that size" "/dev/zero"
run check "$dir"; rc=$?
expect 1 "$dir: error: is a directory" "a directory as MODEL"

# 65 outputs (the emitted runner holds 64)
{ header; awk 'BEGIN { for (i = 0; i < 65; i++) printf "  - y%d: x * %d\n", i, i; printf "outputs: [y0"
                       for (i = 1; i < 65; i++) printf ", y%d", i; print "]" }'; } >"$dir/outs.yaml"
run check "$dir/outs.yaml"; rc=$?
expect 1 "$dir/outs.yaml:73:10: error: 65 outputs; a model has at most 64" "65 outputs"

# a batch whose targets are all ignore_index: as torch, the loss is NaN (0/0)
# and every gradient 0 (a step leaves the params finite)
printf 'name: ce\ndims: {B: 2, C: 3}\ninputs:\n  x: [B, C]\n  y: {shape: [B], dtype: i32}\nparams:\n  w: [C, C]\ngraph:\n  - loss: cross_entropy(linear(x, w), y)\ntrain:\n  loss: loss\n  optimizer: {sgd: {lr: 0.1}}\n' >"$dir/ce.yaml"
run eval "$dir/ce.yaml" --set y=-100,-100 --grad; rc=$?
expect 0 "" "all targets ignored"
grep -q 'loss: f32\[\] = -*nan' "$dir/out" && grep -q 'grad.w: f32\[3, 3\] = 0 0 0 0 0 0 0 0' "$dir/out" ||
  { echo "FAIL: all targets ignored: not a NaN loss and zero gradients:"; cat "$dir/out"; fail=1; }

# model m: its options in the emitted CMakeLists.txt's header are M_CUDA, M_BLAS
printf 'name: m\ndims: {B: 2}\ninputs:\n  x: [B]\ngraph:\n  - y: x + 1\n' >"$dir/m.yaml"
run "$dir/m.yaml" -o "$dir/m" --no-golden; rc=$?
expect 0 "" "model m"
grep -q -- '-DM_CUDA=OFF' "$dir/m/CMakeLists.txt" && ! grep -q TGM "$dir/m/CMakeLists.txt" ||
  { echo "FAIL: the emitted CMakeLists.txt names other options than M_CUDA, M_BLAS"; fail=1; }

[ $fail -eq 0 ] && echo "hostile inputs: ok"
exit $fail
