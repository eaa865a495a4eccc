#!/usr/bin/env python3
"""Several builds of bench/cpu_gemm.c (name=lib.so) and torch.mm called in turn on each shape, one call each
a turn. Prints per build the median GFLOP/s, the median per-turn ratio to torch, and / torch's sgemm 2048^3.
A build that exports exp_prof[64][4] (rdtsc cycles per thread: [0] packing A, [1] micro-tiles, [2] packing B, added around
those phases of gemm_tiled: the session's scratch hooks, not in the runtime) also reports the share of cycles spent packing.
Usage: T=16 ITERS=30 [WORK=mlp_blocks_cpu] [PLAIN=1] python3 session27_gemm_variants.py name=lib.so ...
(each lib: gcc -O3 -fopenmp -DCPU_GEMM_LIB -shared -fPIC bench/cpu_gemm.c -lm -o lib.so)."""
import ctypes, os, statistics, sys, time
threads = int(os.environ.get("T", "16"))
os.environ["OMP_NUM_THREADS"] = str(threads)
os.environ["OMP_WAIT_POLICY"] = "passive"
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(threads))
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
try:
    import torch
    torch.set_num_threads(threads)
except ImportError:  # (a local check of this script)
    torch = None
    import numpy as np
iters = int(os.environ.get("ITERS", "30"))
work = os.environ.get("WORK", "mlp_blocks_cpu")
plain = int(os.environ.get("PLAIN", "1"))
libs = []
for a in sys.argv[1:]:
    n, p = a.split("=", 1)
    l = ctypes.CDLL(os.path.abspath(p))
    l.cg_call.restype = ctypes.c_double
    prof = None
    try:
        prof = (ctypes.c_ulonglong * 256).in_dll(l, "exp_prof")
    except ValueError:
        pass
    libs.append((n, l, prof))

def timed(f):
    t0 = time.perf_counter(); f(); return time.perf_counter() - t0

def operands(M, N, K, ta, tb):
    if torch is None:
        A = np.random.rand(K, M).astype(np.float32).T if ta else np.random.rand(M, K).astype(np.float32)
        B = np.random.rand(N, K).astype(np.float32).T if tb else np.random.rand(K, N).astype(np.float32)
        return lambda: A @ B
    A = torch.randn(K, M) if ta else torch.randn(M, K)
    B = torch.randn(N, K) if tb else torch.randn(K, N)
    A, B = (A.t() if ta else A), (B.t() if tb else B)
    return lambda: torch.mm(A, B)

def sgemm():
    f = operands(2048, 2048, 2048, 0, 0)
    for _ in range(3): f()
    return 2.0 * 2048**3 / statistics.median(timed(f) for _ in range(10)) * 1e-9

p0 = sgemm()
print(f"threads {threads}, {iters} turns a shape, plain {plain}; torch sgemm 2048^3 {p0:.0f} GFLOP/s")
buf = ctypes.create_string_buffer(256)
l0 = libs[0][1]
for s in range(l0.cg_count()):
    l0.cg_describe(s, buf, 256)
    f = buf.value.decode().split()
    if work and f[0] != work:
        continue
    ta, tb, M, N, K = map(int, f[1:6])
    for n, l, pr in libs:
        l.cg_select(s, plain)
    ref = operands(M, N, K, ta, tb)
    for _ in range(3):
        for n, l, pr in libs: l.cg_call()
        ref()
    for n, l, pr in libs:
        if pr is not None:
            for i in range(256): pr[i] = 0
    tt = {n: [] for n, _, _ in libs}; tr = []
    for it in range(iters):
        order = libs if it % 2 == 0 else libs[::-1]
        for n, l, pr in order:
            tt[n].append(l.cg_call())
        tr.append(timed(ref))
    fl = 2.0 * M * N * K * 1e-9
    gr = fl / statistics.median(tr)
    line = f"{ta} {tb} {M}x{N}x{K}: torch {gr:.0f}"
    for n, l, pr in libs:
        g = fl / statistics.median(tt[n]); r = statistics.median(b / a for a, b in zip(tt[n], tr))
        line += f" | {n} {g:.0f} ({r:.2f}, {g / p0:.2f})"
        if pr is not None:
            pk = [pr[i * 4] for i in range(64)]; kn = [pr[i * 4 + 1] for i in range(64)]; pb = [pr[i * 4 + 2] for i in range(64)]
            tot = [a + b + c for a, b, c in zip(pk, kn, pb)]
            act = [i for i in range(64) if tot[i]]
            if act:
                line += f" [pack A {sum(pk) / max(1, sum(tot)):.1%}, B {sum(pb) / max(1, sum(tot)):.1%} of cycles, threads {len(act)}, busiest/mean {max(tot) / (sum(tot) / len(act)):.2f}, per call {statistics.mean(tot[i] for i in act) / iters / 1e6:.2f} Mcyc]"
    print(line, flush=True)
print(f"torch sgemm 2048^3 after: {sgemm():.0f} GFLOP/s")
