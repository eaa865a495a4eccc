#!/usr/bin/env python3
"""train_bench.py: PyTorch's training step for a tgen graph, timed the way
tgen's NAME_bench --train 1 times its own: forward, backward and the
optimizer of the spec's train: section (AdamW fused, or SGD), on a fixed
batch, median of --iters calls after --warmup, each ending with a sync.

    python3 train_bench.py --graph G.json --dims B=16 [--device cuda] [--iters 20]

The graph is tgen's JSON (`tgen check --json`), evaluated node by node by
torch_oracle.py in the model's dtypes; params are initialised N(0, 0.02)
(the timing does not depend on their values). Prints one line per mode:
eager, and torch.compile (default mode) of the step's loss function traced
once into aten ops with make_fx (so dynamo sees a straight-line graph), each
with its peak memory. Dropout, when the graph has it, is the identity here
(the oracle's eval semantics), which only makes torch's step cheaper.
"""
import argparse
import sys
import time

import torch

import torch_oracle as T


def median_ms(fn, warmup, iters, sync):
    for _ in range(warmup):
        fn()
    sync()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--graph", required=True)
    ap.add_argument("--dims", default="")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--modes", default="eager,compile")
    a = ap.parse_args()
    g = T.load_graph(a.graph)
    dims = T.parse_dims(a.dims) if a.dims else {}
    for s in g["syms"]:
        if not s["derived"] and s["name"] not in dims:
            dims[s["name"]] = s["max"]
    dev = a.device
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    gen = torch.Generator().manual_seed(0)
    params = {}
    for p in g["params"]:
        shape = [int(x) for x in p["shape"]]
        params[p["ckpt"]] = (torch.randn(shape, generator=gen) * 0.02).to(dt.get(p["dtype"], torch.float32)).to(dev)
    sizes = T.resolve_dims(g, None, dims)
    inputs = {}
    for i in g["inputs"]:
        shape = [T.eval_size(x, sizes) for x in i["shape"]]
        if i["dtype"] == "i32":
            inputs[i["name"]] = torch.zeros(shape, dtype=torch.int32, device=dev)  # valid indices and targets
        else:
            inputs[i["name"]] = torch.rand(shape, generator=gen).to(dt[i["dtype"]]).to(dev)
    ev = T.Evaluator(g, sizes, device=dev, compute="model", check=False)
    pnames = [p["ckpt"] for p in g["params"]]
    inames = [i["name"] for i in g["inputs"]]
    lid = g["loss"]

    def loss_fn(*args):
        ps = dict(zip(pnames, args[:len(pnames)]))
        xs = dict(zip(inames, args[len(pnames):]))
        return ev.run(ps, xs, {lid})[lid]

    tr = g.get("train") or {}
    leaves = [params[k].detach().clone().requires_grad_(True) for k in pnames]
    xs = [inputs[k] for k in inames]
    opt_name = tr.get("optimizer", "adamw")
    if opt_name == "sgd":
        opt = torch.optim.SGD(leaves, lr=1e-3, momentum=tr.get("momentum", 0.0) or 0.0)
    else:
        opt = torch.optim.AdamW(leaves, lr=1e-4, fused=dev.startswith("cuda"))
    print(f"train_bench: {g['name']} at {','.join(f'{k}={v}' for k, v in dims.items())}: "
          f"{sum(p.numel() for p in leaves)} params, optimizer {opt_name}", flush=True)
    for mode in a.modes.split(","):
        fn = loss_fn
        if mode == "compile":
            from torch.fx.experimental.proxy_tensor import make_fx
            with torch.no_grad():
                gm = make_fx(loss_fn)(*[p.detach() for p in leaves], *xs)
            fn = torch.compile(gm)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = fn(*leaves, *xs)
            loss.backward()
            opt.step()

        try:
            t0 = time.perf_counter()
            step()
            sync()
            first = time.perf_counter() - t0
            if dev.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            ms = median_ms(step, a.warmup, a.iters, sync)
            peak = torch.cuda.max_memory_allocated() / 2**30 if dev.startswith("cuda") else float("nan")
            print(f"torch {mode:<8} train step: median {ms:.3f} ms  (first call {first:.1f} s, peak {peak:.2f} GiB)",
                  flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"torch {mode:<8} train step: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
