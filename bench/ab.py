#!/usr/bin/env python3
"""bench/ab.py: variants of an emitted project timed in turn, on one machine in one call.

    python3 bench/ab.py NAME=DIR [NAME=DIR ...] [--args "--device cuda --train 1 --dims B=16"]
                        [--rounds 3] [--ncu REGEX] [--build DIR] [--jobs N] [--cmake="-DX=Y ..."]

Each DIR is an emitted project (tgen's output, or a copy edited by hand): it is
configured and its NAME_bench built (Release; CUDA arch 90 unless --cmake says
otherwise), all variants in parallel, before anything is timed. Then --rounds
rounds, each running every variant's benchmark once in the order given, so that
a machine's drift falls on all of them alike (the GPU machine's clocks and its
CPUs' speed move by several percent from minute to minute). --ncu REGEX also
runs each variant once under Nsight Compute (caches and clocks left alone) and
sums the kernels whose names match by name: each kernel's launches, total and
mean microseconds. The table: each variant's medians round by round, their
median and its ratio to the first variant's.

The benchmark binary is the one the project builds (NAME_bench: CUDA events or
wall clock around each call, the median printed on its first line), so the
numbers are the ones bench/run.py reports. This is a tool for deciding what to
keep; the table that goes into a note comes from run.py with torch in the same run.
"""
import argparse
import concurrent.futures
import csv
import glob
import io
import os
import re
import shlex
import statistics
import subprocess
import sys


def build(name, src, a):
    """(bench binary or None, message)."""
    bdir = os.path.join(a.build, name)
    cfg = ["cmake", "-S", src, "-B", bdir, "-DCMAKE_BUILD_TYPE=Release"] + shlex.split(a.cmake)
    if not any(x.startswith("-DCMAKE_CUDA_ARCHITECTURES") for x in cfg):
        cfg.append("-DCMAKE_CUDA_ARCHITECTURES=90")
    log = []
    for cmd in (cfg, ["cmake", "--build", bdir, "-j", str(a.jobs)]):
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log.append(p.stdout)
        if p.returncode:
            return None, f"{name}: `{' '.join(cmd)}` failed:\n" + "\n".join(p.stdout.strip().splitlines()[-15:])
    bins = [b for b in glob.glob(os.path.join(bdir, "*_bench")) if os.access(b, os.X_OK)]
    if len(bins) != 1:
        return None, f"{name}: {len(bins)} *_bench binaries in {bdir}"
    return bins[0], f"{name}: built {bins[0]}"


def median_ms(out):
    m = re.search(r"median ([0-9.]+) ms", out)
    return float(m.group(1)) if m else None


def ncu_sums(binary, args, regex):
    """{kernel name: (launches, total us)} of the kernels matching regex, or a message."""
    cmd = ["ncu", "--clock-control", "none", "--cache-control", "none", "--csv", "--print-units", "base", "-k",
           f"regex:{regex}", "--metrics", "gpu__time_duration.sum", binary] + args
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"ncu did not run ({type(e).__name__})"
    sums = {}
    at = p.stdout.find('"ID"')
    for r in csv.DictReader(io.StringIO(p.stdout[at:] if at >= 0 else "")):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r["Kernel Name"].split("(")[0][:60]
        n, t = sums.get(name, (0, 0.0))
        sums[name] = (n + 1, t + float(r["Metric Value"].replace(",", "")) / 1e3)  # ns -> us
    return sums or "ncu matched no kernel (rc %d): %s" % (p.returncode, " ".join(p.stdout.strip().splitlines()[-3:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+", help="NAME=DIR, an emitted project")
    ap.add_argument("--args", default="", help="the benchmark's arguments (e.g. --device cuda --train 1 --dims B=16)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ncu", default="", help="also sum these kernels' times under ncu (a regex)")
    ap.add_argument("--build", default="/tmp/tgen-ab-build")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    ap.add_argument("--cmake", default="", help="more configure arguments, as --cmake=\"-DNAME_CUDA=OFF ...\"")
    a = ap.parse_args()
    vs = []
    for v in a.variants:
        name, eq, src = v.partition("=")
        if not eq or not name or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            ap.error(f"variant '{v}': expected NAME=DIR (NAME of letters, digits, _ . -)")
        if not os.path.isfile(os.path.join(src, "CMakeLists.txt")):
            ap.error(f"variant '{name}': {src} has no CMakeLists.txt (an emitted project's folder)")
        if name in [n for n, _ in vs]:
            ap.error(f"variant '{name}' given twice")
        vs.append((name, src))
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    with concurrent.futures.ThreadPoolExecutor(len(vs)) as ex:
        built = list(ex.map(lambda v: build(v[0], v[1], a), vs))
    for _, msg in built:
        print(msg, flush=True)
    if any(b is None for b, _ in built):
        return 1
    args = shlex.split(a.args)
    times = {n: [] for n, _ in vs}
    for r in range(a.rounds):
        for (n, _), (b, _) in zip(vs, built):
            p = subprocess.run([b] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            ms = median_ms(p.stdout)
            first = (p.stdout.strip().splitlines() or ["(no output)"])[0]
            print(f"round {r + 1} {n}: {first}", flush=True)
            if p.returncode or ms is None:
                print(f"{n}: the benchmark failed (rc {p.returncode}):\n{p.stdout[-2000:]}")
                return 1
            times[n].append(ms)
    base = statistics.median(times[vs[0][0]])
    print("\n| variant | medians by round (ms) | median | / " + vs[0][0] + " |\n| --- | --- | --- | --- |")
    for n, _ in vs:
        m = statistics.median(times[n])
        print(f"| {n} | {' '.join(f'{t:.4g}' for t in times[n])} | {m:.4g} | {m / base:.3f} |")
    if a.ncu:
        for (n, _), (b, _) in zip(vs, built):
            s = ncu_sums(b, args, a.ncu)
            print(f"\nncu {n}:")
            if isinstance(s, str):
                print("  " + s)
                continue
            for k in sorted(s):
                c, t = s[k]
                print(f"  {k:48s} {c:4d} launches {t:10.2f} us {t / c:9.2f} us each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
