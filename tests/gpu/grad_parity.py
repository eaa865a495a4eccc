#!/usr/bin/env python3
"""grad_parity.py: the loss and gradients an emitted NAME_run --grad wrote,
against PyTorch's autograd over tgen's graph (torch_oracle.run_grad) in
float64 on the same params and inputs.

    python3 grad_parity.py --graph G.json --params P --inputs I --subject S [--dims B=2] [--device cuda]

Error of each tensor: max|a - b| / max(max|ref|, 1e-3 * largest |ref| over all
gradients), so that gradients that are zero up to rounding (a bias before a
layer_norm) are judged against the model's gradient scale. Tolerance by the
model dtype: f32 2e-5, bf16 5e-2, f16 1e-2. Prints a table; exit 1 on a
failure or a missing tensor.
"""
import argparse
import sys

import torch

import torch_oracle as T

TOL = {"f32": 2e-5, "bf16": 5e-2, "f16": 1e-2}


def main():
    ap = argparse.ArgumentParser()
    for k in ("graph", "params", "inputs", "subject"):
        ap.add_argument("--" + k, required=True)
    ap.add_argument("--dims", default="")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    g = T.load_graph(a.graph)
    params, inputs, subj = T.st_load(a.params), T.st_load(a.inputs), T.st_load(a.subject)
    dims = T.parse_dims(a.dims) if a.dims else None
    loss, grads = T.run_grad(g, params, inputs, dims=dims, device=a.device, compute="f64")
    ref = {T.loss_name(g): loss}
    ref.update({f"grad.{k}": v for k, v in grads.items()})
    scale = max((float(v.abs().max()) for k, v in ref.items() if k.startswith("grad.") and v.numel()), default=0)
    tol = TOL.get(g["dtype"], 2e-5)
    fails = 0
    print(f"{'tensor':<28} {'shape':<16} {'max|ref|':>10} {'max|diff|':>10} {'rel err':>9}")
    worst = 0.0
    for k, r in ref.items():
        s = subj.get(k)
        if s is None:
            print(f"{k:<28} MISSING in {a.subject}")
            fails += 1
            continue
        r = r.double().cpu().reshape(-1)
        s = s.double().reshape(-1)
        mref = float(r.abs().max()) if r.numel() else 0.0
        diff = float((r - s).abs().max()) if r.numel() else 0.0
        den = max(mref, 1e-3 * scale if k.startswith("grad.") else 0.0, 1e-30)
        err = diff / den
        ok = err <= tol and bool(torch.isfinite(s).all())
        worst = max(worst, err)
        fails += not ok
        print(f"{k:<28} {str(list(subj[k].shape)):<16} {mref:10.3e} {diff:10.3e} {err:9.2e} {'ok' if ok else 'FAIL'}")
    print(f"{len(ref) - fails} passed, {fails} failed (tol {tol:g}, worst rel err {worst:.3e})")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
