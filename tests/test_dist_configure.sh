#!/bin/sh
# test_dist_configure.sh TGEN WORK: configuring a project generated with
# --distributed nccl: without the CUDA path (-DNAME_CUDA=OFF) it stops with a
# message naming the way out (-DNAME_NCCL=OFF), and with that option it
# configures and builds the one-GPU project (CPU only here), whose dist_cpu
# test passes. Configure-and-build of mlp (small): about 20 s on 2 cores.
tgen=$1
work=$2
rm -rf "$work"
mkdir -p "$work"
"$tgen" spec/examples/mlp.yaml -o "$work/mlp" --distributed nccl >/dev/null || { echo "FAIL: tgen"; exit 1; }
if cmake -S "$work/mlp" -B "$work/b1" -DMLP_CUDA=OFF >"$work/c1.log" 2>&1; then
  echo "FAIL: configured without the CUDA path and with NCCL on"
  exit 1
fi
grep -q "needs the CUDA path" "$work/c1.log" && grep -q "MLP_NCCL=OFF" "$work/c1.log" ||
  { echo "FAIL: the message does not say why and what to do:"; cat "$work/c1.log"; exit 1; }
echo "ok: refused: $(grep -o 'mlp: the multi-GPU path.*' "$work/c1.log" | head -1)"
cmake -S "$work/mlp" -B "$work/b2" -DMLP_CUDA=OFF -DMLP_NCCL=OFF >"$work/c2.log" 2>&1 &&
  cmake --build "$work/b2" -j 2 >"$work/b2.log" 2>&1 || { echo "FAIL: -DMLP_NCCL=OFF"; tail -n 20 "$work/c2.log" "$work/b2.log"; exit 1; }
grep -q "multi-GPU path (NCCL): OFF" "$work/c2.log" || { echo "FAIL: configure does not say the path is off"; exit 1; }
(cd "$work/b2" && ctest -R '^dist_cpu$' --output-on-failure >"$work/t.log" 2>&1) || { cat "$work/t.log"; exit 1; }
echo "ok: -DMLP_NCCL=OFF configures, builds and passes dist_cpu"
rm -rf "$work"
