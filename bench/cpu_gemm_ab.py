#!/usr/bin/env python3
"""cpu_gemm_ab.py: tgen's CPU GEMM and the reference's (torch.mm, else numpy's
matmul) on the shapes bench/cpu_gemm.c knows, called alternately in one
process, one call of each in turn, so that the machine's drift from second
to second (10-30% on the GPU machine's shared CPU, session 19) falls on both
alike. Prints per shape each side's median GFLOP/s, the median of the
per-turn ratios tgen/reference, and the reference's sgemm 2048^3 rate
(measured before and after the shapes).

    gcc -O3 -fopenmp -DCPU_GEMM_LIB -shared -fPIC bench/cpu_gemm.c -lm -o /tmp/libcpu_gemm.so
    python3 bench/cpu_gemm_ab.py /tmp/libcpu_gemm.so --threads 16 [--work mlp_blocks_cpu] [--plain] [--iters 40]

--plain: tgen's product alone (no epilogue), as the reference's is.
Both sides' OpenMP threads sleep between calls (OMP_WAIT_POLICY=passive, set
here before either runtime starts), or the one that just ran would spin on
the cores the other needs. Benchmarks are not tests: nothing is asserted.
"""
import argparse
import ctypes
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib", help="bench/cpu_gemm.c built with -DCPU_GEMM_LIB -shared")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--work", default="", help="only this workload's shapes")
    ap.add_argument("--plain", action="store_true", help="tgen's product without its epilogue")
    ap.add_argument("--iters", type=int, default=40)
    a = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    os.environ["OMP_WAIT_POLICY"] = "passive"
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(a.threads))
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # (numpy's OpenBLAS: spin 2^4 cycles, not 2^28)
    try:
        import torch
        torch.set_num_threads(a.threads)
        ref_name = f"torch {torch.__version__}"

        def operands(M, N, K, ta, tb):
            A = torch.randn(K, M) if ta else torch.randn(M, K)
            B = torch.randn(N, K) if tb else torch.randn(K, N)
            A, B = (A.t() if ta else A), (B.t() if tb else B)
            return lambda: torch.mm(A, B)
    except ImportError:
        import numpy as np
        ref_name = f"numpy {np.__version__}"
        rng = np.random.default_rng(0)

        def operands(M, N, K, ta, tb):
            A = rng.standard_normal((K, M) if ta else (M, K), dtype=np.float32)
            B = rng.standard_normal((N, K) if tb else (K, N), dtype=np.float32)
            A, B = (A.T if ta else A), (B.T if tb else B)
            return lambda: A @ B
    lib = ctypes.CDLL(a.lib)
    lib.cg_call.restype = ctypes.c_double

    def timed(fn):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def sgemm():
        f = operands(2048, 2048, 2048, 0, 0)
        for _ in range(3):
            f()
        return 2.0 * 2048**3 / statistics.median(timed(f) for _ in range(10)) * 1e-9

    peak0 = sgemm()
    print(f"threads {a.threads}; reference {ref_name}; tgen {'product alone' if a.plain else 'with its epilogue'}; "
          f"{a.iters} alternate calls a shape")
    print("| workload | ta tb | M x N x K | epilogue | tgen GFLOP/s | ref GFLOP/s | tgen / ref (median of turns) "
          "| tgen / sgemm |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    buf = ctypes.create_string_buffer(256)
    rows = []
    for s in range(lib.cg_count()):
        lib.cg_describe(s, buf, 256)
        f = buf.value.decode().split()
        work, (ta, tb, M, N, K, bias, act, res, dact) = f[0], map(int, f[1:])
        if a.work and work != a.work:
            continue
        lib.cg_select(s, 1 if a.plain else 0)
        ref = operands(M, N, K, ta, tb)
        for _ in range(3):
            lib.cg_call()
            ref()
        tt, tr = [], []
        for _ in range(a.iters):
            t = lib.cg_call()
            if t < 0:
                sys.exit(f"cpu_gemm_ab: tgm_cpu_gemm refused shape {s}")
            tt.append(t)
            tr.append(timed(ref))
        fl = 2.0 * M * N * K * 1e-9
        gt, gr = fl / statistics.median(tt), fl / statistics.median(tr)
        ratio = statistics.median(r / t for t, r in zip(tt, tr))
        epi = "-" if a.plain else (",".join(e for e, on in (("bias", bias), (f"act{act}", act and not dact),
                                                              (f"dact{act}", dact), ("res", res)) if on) or "-")
        rows.append((work, ta, tb, M, N, K, epi, gt, gr, ratio))
    peak1 = sgemm()
    peak = (peak0 + peak1) / 2
    for work, ta, tb, M, N, K, epi, gt, gr, ratio in rows:
        print(f"| {work} | {ta} {tb} | {M} x {N} x {K} | {epi} | {gt:.0f} | {gr:.0f} | {ratio:.2f} | {gt / peak:.2f} |")
    print(f"reference sgemm 2048^3: {peak0:.0f} GFLOP/s before the shapes, {peak1:.0f} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
