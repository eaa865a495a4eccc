#!/usr/bin/env python3
"""cpu_gemm_torch.py: torch's CPU matmul on the shapes bench/cpu_gemm.c times
(read from `cpu_gemm --list` on stdin), the product alone (no epilogue), and
the machine's sgemm 2048^3, in the same run; then the table against the
cpu_gemm outputs given as files.

    ./cpu_gemm --list | python3 bench/cpu_gemm_torch.py --threads 16 builtin.txt blas.txt

Prints one row a shape: torch's GFLOP/s, each cpu_gemm file's GFLOP/s, and
each as a share of torch's rate on that shape and of the sgemm 2048^3 rate.
"""
import argparse
import re
import statistics
import sys
import time

import torch


def rate(fn, flops, iters):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return flops / statistics.median(ts) * 1e-9


def parse(path):
    rows = []
    for line in open(path):
        m = re.search(r"([\d.]+) GFLOP/s", line)
        if m:
            rows.append(float(m.group(1)))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("files", nargs="*", help="cpu_gemm outputs (one column each)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    shapes = [l.split() for l in sys.stdin if l.strip()]
    n = 2048
    x, y = torch.randn(n, n), torch.randn(n, n)
    peak = rate(lambda: torch.mm(x, y), 2.0 * n**3, 10)
    cols = [(f, parse(f)) for f in a.files]
    print(f"threads {a.threads}; torch sgemm 2048^3 {peak:.0f} GFLOP/s")
    head = "| workload | ta tb | M x N x K | epilogue | torch GFLOP/s |"
    for f, _ in cols:
        head += f" {f} GFLOP/s | / torch | / sgemm |"
    print(head)
    print("|" + " --- |" * (5 + 3 * len(cols)))
    for i, s in enumerate(shapes):
        work, ta, tb, M, N, K, bias, act, res, dact = s[0], *map(int, s[1:])
        A = torch.randn(K, M) if ta else torch.randn(M, K)
        B = torch.randn(N, K) if tb else torch.randn(K, N)
        opA = A.t() if ta else A
        opB = B.t() if tb else B
        r = rate(lambda: torch.mm(opA, opB), 2.0 * M * N * K, a.iters)
        epi = ",".join(e for e, on in (("bias", bias), (f"act{act}", act and not dact), (f"dact{act}", dact),
                                       ("res", res)) if on) or "-"
        row = f"| {work} | {ta} {tb} | {M} x {N} x {K} | {epi} | {r:.0f} |"
        for _, vals in cols:
            v = vals[i] if i < len(vals) else float("nan")
            row += f" {v:.0f} | {v / r:.2f} | {v / peak:.2f} |"
        print(row)


if __name__ == "__main__":
    main()
