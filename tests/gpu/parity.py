#!/usr/bin/env python3
"""parity.py: compares a built tgen project's outputs with PyTorch.

For one example NAME prepared by tests/gpu/prepare.sh (DIR/NAME/ the emitted
project, DIR/NAME.json its graph) and built into BUILD/NAME-build/:

  1. picks small dims (each dynamic dim = min(max, 2), adjusted so derived
     sizes divide) and makes inputs: floats uniform in [-1, 1), i32 inputs
     valid for their use (embedding index: < rows of the table;
     cross_entropy target: < classes, every 4th one from the second =
     ignore_index; else
     0..3), written to WORK/inputs.safetensors;
  2. runs NAME_run --device cuda --seed 0 --save-params (params.safetensors),
     then NAME_run --device cpu --params params.safetensors, same inputs;
  3. evaluates the graph with torch_oracle.py on the same params and inputs,
     in the model dtype and in float64;
  4. prints one row per output: max relative error (max|a-b| / max|ref|) of
     tgen-cuda, tgen-cpu and torch-in-model-dtype against torch-f64, and
     PASS/FAIL of tgen-cuda and tgen-cpu against the tolerance of the
     output's dtype (f32 1e-4, bf16 3e-2, f16 5e-3, or the model dtype's where
     that is looser; i32/bool exact).

With --bench it also times the forward pass: NAME_bench --device cuda vs the
oracle graph in torch eager and under torch.compile (model dtype).

    python3 parity.py --dir DIR --name NAME [--build BUILD] [--work WORK]
        [--report parity.txt] [--dims B=2] [--no-cpu] [--bench [--bench-dims B=32]]

The functions pick_dims, make_inputs, rel_err and TOL are used by
validate_oracle.py as well.
"""
import argparse
import itertools
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import torch_oracle as T  # noqa: E402

TOL = {"f32": 1e-4, "bf16": 3e-2, "f16": 5e-3, "i32": 0.0, "bool": 0.0}


def tolerance(graph, dtype):
    """The tolerance of an output of this dtype: its own, or the model
    dtype's where that is looser (an f32 output computed from bf16 values
    carries bf16 errors). Integer and bool outputs must match exactly."""
    if dtype not in T.FLOAT_DTYPES:
        return TOL[dtype]
    return max(TOL[dtype], TOL.get(graph["dtype"], 0.0))
SHAPE_OPS = ("reshape", "squeeze", "unsqueeze", "transpose", "permute", "slice", "broadcast_to")


# ---------------------------------------------------------------- dims, inputs

def pick_dims(graph, prefer=2):
    """Each dynamic dim = min(max, prefer), else the first small values for
    which every derived size divides."""
    base = [s for s in graph["syms"] if not s["derived"]]
    if not base:
        return {}
    cands = []
    for s in base:
        c = [min(s["max"], prefer)] + [v for v in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32) if v <= s["max"]]
        cands.append(list(dict.fromkeys(c)))
    for combo in itertools.product(*cands):
        d = {s["name"]: v for s, v in zip(base, combo)}
        try:
            T.Sizes(graph, d)
            return d
        except ValueError:
            continue
    raise ValueError("no small dims make every derived size divide")


def _origin(graph, nid):
    """The input a value comes from through shape-only ops, or None."""
    nodes = graph["nodes"]
    while nodes[nid]["op"] in SHAPE_OPS:
        nid = nodes[nid]["in"][0]
    return nid if nodes[nid]["op"] == "input" else None


def index_uses(graph, sizes):
    """{input node id: (bound, ignore_index or None)} for i32 inputs used as
    embedding indices or cross_entropy targets."""
    nodes, out = graph["nodes"], {}

    def note(nid, bound, ign):
        o = _origin(graph, nid)
        if o is None:
            return
        b0, i0 = out.get(o, (bound, ign))
        out[o] = (min(b0, bound), ign if ign is not None else i0)

    for n in nodes:
        if n["op"] == "embedding":
            note(n["in"][0], sizes.shape(nodes[n["in"][1]]["shape"])[0], None)
        elif n["op"] == "cross_entropy":
            ls = sizes.shape(nodes[n["in"][0]]["shape"])
            note(n["in"][1], ls[0] if len(ls) == 1 else ls[1], int(n["ignore_index"]))
    return out


def make_inputs(graph, dims, seed=0):
    """Inputs for the graph at `dims` (CPU tensors in the inputs' dtypes)."""
    sizes = T.Sizes(graph, dims)
    uses = index_uses(graph, sizes)
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for k, inp in enumerate(graph["inputs"]):
        shape = sizes.shape(inp["shape"])
        dt = inp["dtype"]
        if dt in T.FLOAT_DTYPES:
            t = (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1).to(T.DTYPES[dt])
        elif dt == "bool":
            t = torch.randint(0, 2, shape, generator=gen).bool()
        else:
            bound, ign = uses.get(inp["node"], (4, None))
            t = torch.randint(0, max(bound, 1), shape, generator=gen, dtype=torch.int64)
            if ign is not None and t.numel() >= 2:
                flat = t.reshape(-1)
                flat[1::4] = ign
            t = t.to(torch.int32)
        out[inp["name"]] = t
    return out


def dims_str(d):
    return ",".join(f"{k}={v}" for k, v in d.items())


# ---------------------------------------------------------------- compare

def rel_err(a, ref):
    """max|a - ref| / max|ref| over finite refs (absolute when max|ref| is 0);
    positions where both are NaN (or the same infinity) agree; NaN or inf in
    one only is an infinite error. None if the shapes differ."""
    a = a.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    if a.shape != ref.shape:
        return None
    if a.numel() == 0:
        return 0.0
    same = (torch.isnan(a) & torch.isnan(ref)) | (a == ref)
    fin = torch.isfinite(ref)
    scale = ref[fin].abs().max().item() if bool(fin.any()) else 0.0
    d = (a - ref).abs()
    d[same] = 0
    d[torch.isnan(d)] = float("inf")
    m = d.max().item()
    return m / scale if scale > 0 else m


def fmt_err(e):
    if e is None:
        return "shape!"
    if isinstance(e, str):
        return e
    return f"{e:.2e}"


def verdict(e, tol):
    if e is None or isinstance(e, str):
        return "FAIL"
    return "PASS" if e <= tol else "FAIL"


# ---------------------------------------------------------------- runner

def run_cmd(cmd, timeout, log):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, text=True)
        rc, out = p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        rc, out = "timeout", (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    except OSError as e:
        rc, out = "oserror", str(e)
    dt = time.time() - t0
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n{out}\n[rc={rc}, {dt:.1f}s]\n\n")
    return rc, out, dt


def median_ms(fn, sync, warmup=3, iters=20):
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


def bench(args, graph, params, exe_dir, model, log):
    """Returns a line: tgen-cuda vs torch eager vs torch.compile medians."""
    bdims = T.parse_dims(args.bench_dims) if args.bench_dims else {
        s["name"]: s["max"] for s in graph["syms"] if not s["derived"]}
    res = {}
    rc, out, _ = run_cmd([os.path.join(exe_dir, f"{model}_bench"), "--device", "cuda", "--dims", dims_str(bdims)],
                         args.timeout, log)
    m = re.search(r"median ([\d.]+) ms", out or "")
    res["tgen"] = float(m.group(1)) if rc == 0 and m else None
    dev = args.device
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    fwd = None
    try:
        inputs = {k: v.to(dev) for k, v in make_inputs(graph, bdims, seed=1).items()}
        fwd, names, _, traced = T.make_forward(graph, params, bdims, device=dev, compute="model",
                                               example_inputs=inputs)
        xs = [inputs[k] for k in names]
        with torch.inference_mode():
            res["eager"] = median_ms(lambda: fwd(*xs), sync)
    except Exception as e:  # noqa: BLE001
        res["eager"] = None
        with open(log, "a") as f:
            f.write(f"torch eager failed: {e!r}\n")
    try:
        cf = torch.compile(fwd)
        with torch.no_grad():
            res["compile"] = median_ms(lambda: cf(*xs), sync, warmup=3)
    except Exception as e:  # noqa: BLE001
        res["compile"] = None
        with open(log, "a") as f:
            f.write(f"torch.compile failed: {e!r}\n")

    def f(v):
        return f"{v:.4f}" if v is not None else "n/a"

    return (f"{args.name:<20} {dims_str(bdims):<12} tgen-cuda {f(res['tgen'])} ms   torch-eager {f(res['eager'])} ms   "
            f"torch.compile {f(res['compile'])} ms")


# ---------------------------------------------------------------- main

HEADER = (f"{'example':<20} {'output':<12} {'dtype':<5} {'shape':<16} {'cuda-vs-f64':>11} {'cpu-vs-f64':>11} "
          f"{'torch-vs-f64':>12} {'tol':>7}  cuda cpu")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="the prepared folder (NAME/ and NAME.json)")
    ap.add_argument("--name", required=True, help="example name (the folder and json name)")
    ap.add_argument("--build", default=None, help="folder holding NAME-build/ (default: --dir)")
    ap.add_argument("--work", default=None, help="scratch folder (default: $WORK/NAME, WORK=/tmp/tgen-gpu-work)")
    ap.add_argument("--report", default=None, help="append the table rows to this file")
    ap.add_argument("--dims", default="", help="dynamic dims (default: small ones)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="where the torch oracle runs")
    ap.add_argument("--no-cpu", action="store_true", help="skip the tgen CPU run")
    ap.add_argument("--no-cuda", action="store_true", help="skip the tgen CUDA run")
    ap.add_argument("--timeout", type=int, default=int(os.environ.get("PARITY_TIMEOUT", "300")),
                    help="seconds per runner call")
    ap.add_argument("--bench", action="store_true", help="also time the forward pass")
    ap.add_argument("--bench-dims", default="", help="dims for --bench (default: the max of each)")
    ap.add_argument("--header", action="store_true", help="print the table header first")
    args = ap.parse_args(argv)

    T.set_precise_defaults()
    graph = T.load_graph(os.path.join(args.dir, f"{args.name}.json"))
    model = graph["name"]
    build = args.build or args.dir
    exe_dir = os.path.join(build, f"{args.name}-build")
    work = args.work or os.path.join(os.environ.get("WORK", "/tmp/tgen-gpu-work"), args.name)
    os.makedirs(work, exist_ok=True)
    log = os.path.join(work, "parity.log")
    open(log, "w").close()
    rows = []

    def emit(line):
        print(line, flush=True)
        rows.append(line)

    if args.header:
        emit(HEADER)
    dims = T.parse_dims(args.dims) if args.dims else pick_dims(graph)
    inputs = make_inputs(graph, dims, seed=0)
    ipath = os.path.join(work, "inputs.safetensors")
    ppath = os.path.join(work, "params.safetensors")
    T.st_save(ipath, inputs)
    if os.path.exists(ppath):
        os.remove(ppath)
    run = os.path.join(exe_dir, f"{model}_run")
    dargs = ["--dims", dims_str(dims)] if dims else []
    status = {}
    res = {}
    for dev in ("cuda", "cpu"):
        if (dev == "cuda" and args.no_cuda) or (dev == "cpu" and args.no_cpu):
            status[dev] = "skipped"
            continue
        opath = os.path.join(work, f"out_{dev}.safetensors")
        if os.path.exists(opath):
            os.remove(opath)
        pa = ["--params", ppath] if os.path.exists(ppath) else ["--seed", "0", "--save-params", ppath]
        rc, out, secs = run_cmd([run, "--device", dev, *pa, "--inputs", ipath, "--out", opath, *dargs],
                                args.timeout, log)
        if rc == 0 and os.path.exists(opath):
            status[dev] = f"ok {secs:.1f}s"
            res[dev] = T.st_load(opath)
        else:
            status[dev] = f"rc={rc}"
    if not os.path.exists(ppath):
        emit(f"{args.name:<20} ERROR: no params (runner: cuda {status.get('cuda')}, cpu {status.get('cpu')}; "
             f"see {log})")
        return finish(args, rows, 1)
    params = T.st_load(ppath)
    try:
        ref = T.run_graph(graph, params, inputs, dims, device=args.device, compute="f64")
        mod = T.run_graph(graph, params, inputs, dims, device=args.device, compute="model")
    except Exception as e:  # noqa: BLE001
        emit(f"{args.name:<20} ERROR: torch oracle failed: {e!r}")
        return finish(args, rows, 1)
    T.st_save(os.path.join(work, "out_torch_f64.safetensors"), ref)
    T.st_save(os.path.join(work, "out_torch_model.safetensors"), mod)
    nodes = graph["nodes"]
    fails = 0
    for o in graph["outputs"]:
        name, dt = o["name"], nodes[o["node"]]["dtype"]
        tol = tolerance(graph, dt)
        r = ref[name]
        errs, verd = {}, {}
        for dev in ("cuda", "cpu"):
            if dev not in res:
                errs[dev], verd[dev] = status[dev], "skip" if status[dev] == "skipped" else "FAIL"
            elif name not in res[dev]:
                errs[dev], verd[dev] = "missing", "FAIL"
            else:
                errs[dev] = rel_err(res[dev][name], r)
                verd[dev] = verdict(errs[dev], tol)
            fails += verd[dev] == "FAIL"
        et = rel_err(mod[name], r)
        emit(f"{args.name:<20} {name:<12} {dt:<5} {str(list(r.shape)):<16} {fmt_err(errs['cuda']):>11} "
             f"{fmt_err(errs['cpu']):>11} {fmt_err(et):>12} {tol:>7.0e}  {verd['cuda']:<4} {verd['cpu']}")
    if args.bench:
        emit("bench: " + bench(args, graph, params, exe_dir, model, log))
    return finish(args, rows, 1 if fails else 0)


def finish(args, rows, rc):
    if args.report:
        with open(args.report, "a") as f:
            f.write("\n".join(rows) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
