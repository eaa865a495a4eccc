#!/usr/bin/env python3
"""bench/profile.py: one training step (or forward pass) of an emitted model,
kernel by kernel, grouped by class, on the GPU machine.

    python3 bench/profile.py BUILD/NAME_bench [--dims B=16] [--train] [--int-range N] [--out FILE]

Runs NAME_bench for --warmup + 1 steps under Nsight Compute (ncu at the
card's own clocks, caches left warm: --clock-control none --cache-control
none; one metric, gpu__time_duration.sum), keeps the launches of the last
step (after the optimizer kernels of the steps before it; a forward pass: the
last share of the launches), and prints them grouped by class (GEMM:
cuBLAS's; attention: the runtime's flash kernels; optimizer; generated: the
pass's loop kernels, kN_*; other), then the 25 costliest kernels. ncu
serialises the launches, so the sum is the kernels' time without launch gaps.
"""
import argparse
import csv
import io
import re
import subprocess
import sys
from collections import defaultdict


def kernel_class(name):
    if re.match(r"(void )?k\d+_", name):
        return "generated pointwise/reduction"
    if "flash" in name or "k_att" in name:
        return "attention (runtime)"
    if "k_opt" in name:
        return "optimizer"
    if "nvjet" in name or "gemm" in name.lower() or "cutlass" in name or "sm90_xmma" in name:
        return "GEMM (cuBLAS)" if "k_gemm_epilogue" not in name else "GEMM epilogue (runtime)"
    return "other: " + name[:48]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench")
    ap.add_argument("--dims", default="")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default="")
    ap.add_argument("--int-range", type=int, default=0, help="integer inputs uniform in [0, N) (NAME_bench's)")
    a = ap.parse_args()
    cmd = [a.bench, "--device", "cuda", "--iters", "1", "--warmup", str(a.warmup)]
    if a.dims:
        cmd += ["--dims", a.dims]
    if a.train:
        cmd += ["--train", "1"]
    if a.int_range:
        cmd += ["--int-range", str(a.int_range)]
    base = ["ncu", "--clock-control", "none", "--cache-control", "none", "--csv", "--print-units", "base"]
    listing = subprocess.run(base + ["--metrics", "gpu__time_duration.sum"] + cmd, capture_output=True, text=True)
    if listing.returncode:
        sys.stderr.write(listing.stdout[-4000:] + listing.stderr[-4000:])
        sys.exit(1)
    rows = [r for r in csv.DictReader(io.StringIO(listing.stdout[listing.stdout.find('"ID"'):]))
            if r.get("Metric Name") == "gpu__time_duration.sum"]
    steps = a.warmup + 1
    # the step boundary: the optimizer's update kernel (one or more per step) ends each training step;
    # without training, the launches divide evenly
    names = [r["Kernel Name"] for r in rows]
    if a.train:
        ends = [i for i, n in enumerate(names) if "k_opt_adamw" in n or "k_opt_sgd" in n]
        per_step = len(ends) // steps
        start = ends[-per_step - 1] + 1 if per_step and len(ends) > per_step else 0
    else:
        start = len(names) - len(names) // steps
    last = rows[start:]
    by_class = defaultdict(lambda: [0.0, 0])
    by_name = defaultdict(lambda: [0.0, 0])
    total = 0.0
    for r in last:
        ns = float(r["Metric Value"].replace(",", ""))
        c = kernel_class(r["Kernel Name"])
        by_class[c][0] += ns
        by_class[c][1] += 1
        by_name[r["Kernel Name"][:100]][0] += ns
        by_name[r["Kernel Name"][:100]][1] += 1
        total += ns
    lines = ["%s: the last step's %d kernels, %.2f ms (ncu at the card's clocks; no launch gaps)" %
             (" ".join(cmd), len(last), total / 1e6)]
    for c, (ns, n) in sorted(by_class.items(), key=lambda kv: -kv[1][0]):
        lines.append("  %-40s %8.2f ms  %5.1f%%  %4d launches" % (c, ns / 1e6, 100 * ns / total if total else 0, n))
    fam = defaultdict(lambda: [0.0, 0])  # generated kernels by what they compute (kN_layer_norm -> layer_norm)
    for nm, (ns, n) in by_name.items():
        m = re.match(r"(?:void )?k\d+_(\w+)", nm)
        if m:
            fam[m.group(1)][0] += ns
            fam[m.group(1)][1] += n
    lines.append("generated kernels by what they compute:")
    for f, (ns, n) in sorted(fam.items(), key=lambda kv: -kv[1][0]):
        lines.append("  %-40s %8.3f ms  %4d launches" % (f, ns / 1e6, n))
    lines.append("top kernels:")
    for nm, (ns, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:25]:
        lines.append("  %8.3f ms x%-4d %s" % (ns / 1e6, n, nm))
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
