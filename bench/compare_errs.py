#!/usr/bin/env python3
"""compare_errs.py: two bench/run.py results (bench.json) side by side, error by
error: each gradient's and output's max|a-b|/max|ref| against float64 in the
correctness check, for a workload both files checked.

    python3 bench/compare_errs.py OLD/bench.json NEW/bench.json [--work gpt2] [--top 10]

Prints, per workload, how many errors fell and rose, their median and mean
before and after, and the largest after (with their values before, and torch's own error in the
model dtype where the new file has it): a change
of rounding moves every error a little, and the check's tolerance looks at
the largest only, so this tells a general gain or loss from one value's
draw. Run both with the same --check-seed (and the same seed again with
another one before concluding).
"""
import argparse
import json
import statistics
import sys


def errs(path, work):
    d = json.load(open(path))["workloads"].get(work, {})
    return {k: v for k, v in d.get("errs", {}).items() if isinstance(v, float)}, d.get("tol")


def torch_errs(path, work):
    """torch's own error per value in the model dtype and run.py's multiple of
    it that passes (run.py since session 19), or ({}, None)."""
    d = json.load(open(path))["workloads"].get(work, {})
    return {k: v for k, v in d.get("torch_errs", {}).items() if isinstance(v, float)}, d.get("torch_mult")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--work", default="")
    ap.add_argument("--top", type=int, default=10)
    a = ap.parse_args()
    works = [a.work] if a.work else sorted(set(json.load(open(a.old))["workloads"]) &
                                           set(json.load(open(a.new))["workloads"]))
    for w in works:
        (o, tol), (n, _) = errs(a.old, w), errs(a.new, w)
        keys = sorted(set(o) & set(n))
        if not keys:
            print(f"{w}: no errors in both files")
            continue
        ov, nv = [o[k] for k in keys], [n[k] for k in keys]
        fell = sum(1 for x, y in zip(ov, nv) if y < x)
        rose = sum(1 for x, y in zip(ov, nv) if y > x)
        print(f"{w}: {len(keys)} values, {fell} fell, {rose} rose; median {statistics.median(ov):.4g} -> "
              f"{statistics.median(nv):.4g}, mean {sum(ov) / len(ov):.4g} -> {sum(nv) / len(nv):.4g}, "
              f"max {max(ov):.4g} -> {max(nv):.4g} (tolerance {tol})")
        t, mult = torch_errs(a.new, w)
        for k in sorted(keys, key=lambda k: -n[k])[:a.top]:
            over = tol and n[k] > tol and not (mult and k in t and n[k] <= mult * t[k])  # run.py's rule
            print(f"  {k}: {o[k]:.4g} -> {n[k]:.4g}{f'  (torch {t[k]:.4g})' if k in t else ''}{'  over' if over else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
