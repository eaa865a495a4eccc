#!/usr/bin/env python3
"""validate_oracle.py: checks torch_oracle.py against tgen's reference
interpreter (gen/interp.c), on this machine (CPU, needs torch and tgen).

For each spec: dumps the graph (tgen check --json), picks small dims and
inputs as parity.py does, runs interp_ref (tests/gpu/interp_ref.c: tgen's
params for the seed, written as safetensors, and the interpreter's outputs in
float64), then evaluates the same graph with torch_oracle.py on the same
params and inputs

  - in float64: must agree with the interpreter to 1e-9 (relative to max|ref|):
    this checks every op's semantics and attributes;
  - in the model dtype: reported against the interpreter, with the parity
    tolerance of the output's dtype (what torch itself achieves in that dtype).

It also checks the oracle's own safetensors reader/writer against files
written by the runtime's writer (tgm_st_write, via interp_ref), and, for one
spec, interp_ref against `tgen eval --set` (same params, same outputs).

    python3 tests/gpu/validate_oracle.py [SPEC.yaml ...] [--tgen build/tgen]
        [--interp-ref PATH] [--work DIR] [--device cpu|cuda]
    python3 tests/gpu/validate_oracle.py --precomputed DIR [--device cuda] [--bench]

The second form reuses the folders the first one left in its --work DIR (no
tgen, no interp_ref: for running the oracle on the GPU machine).

Default specs: tests/gpu/oracle_specs/*.yaml and the spec/examples that the
interpreter evaluates quickly (all but gpt2 and seed_attention; name them to
include them).
"""
import argparse
import glob
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import torch  # noqa: E402

import parity as P  # noqa: E402
import torch_oracle as T  # noqa: E402

F64_TOL = 1e-9


def build_interp_ref(tgen_build, out):
    lib = os.path.join(tgen_build, "libtgenlib.a")
    cmd = ["cc", "-O2", "-fopenmp", "-D_POSIX_C_SOURCE=200809L", f"-I{ROOT}/gen", f"-I{ROOT}/spec",
           f"-I{ROOT}/templates/runtime", os.path.join(HERE, "interp_ref.c"), lib, "-lyaml", "-lm", "-o", out]
    subprocess.run(cmd, check=True)


def check_safetensors(path):
    """The oracle's own reader agrees with the safetensors package (when
    present) on a file the runtime wrote, and a round trip through the own
    writer preserves every tensor bit for bit."""
    own = T.st_read_own(path)
    msgs = []
    try:
        from safetensors.torch import load_file
        pkg = load_file(path)
        for k in pkg:
            if not torch.equal(pkg[k], own[k]) or pkg[k].dtype != own[k].dtype:
                msgs.append(f"reader differs from the safetensors package on {k}")
    except ImportError:
        pass
    tmp = path + ".rt.safetensors"
    T.st_write_own(tmp, own)
    back = T.st_read_own(tmp)
    try:
        from safetensors.torch import load_file
        pk = load_file(tmp)
        for k in own:
            if not torch.equal(pk[k], own[k]):
                msgs.append(f"package reads our writer's {k} differently")
    except ImportError:
        pass
    os.remove(tmp)
    for k in own:
        if own[k].dtype != back[k].dtype or not torch.equal(own[k].view(-1).view(torch.uint8) if own[k].numel() else
                                                            own[k], back[k].view(-1).view(torch.uint8) if
                                                            back[k].numel() else back[k]):
            msgs.append(f"round trip changed {k}")
    return msgs


def eval_cross_check(tgen, spec, dims, inputs, ref):
    """interp_ref against `tgen eval --set` (printed with 9 digits)."""
    cmd = [tgen, "eval", spec, "--max", "100000"]
    if dims:
        cmd += ["--dims", P.dims_str(dims)]
    for k, v in inputs.items():
        vals = v.to(torch.float64).reshape(-1).tolist()
        cmd += ["--set", f"{k}=" + ",".join(repr(int(x)) if v.dtype == torch.int32 else repr(x) for x in vals)]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout
    worst = 0.0
    seen = 0
    for line in out.splitlines():
        name, rest = line.split(":", 1)
        nums = [float(x) for x in rest.split("=", 1)[1].split()]
        if name in ref:
            r = ref[name].reshape(-1)
            e = P.rel_err(torch.tensor(nums, dtype=torch.float64), r)
            worst = max(worst, e)
            seen += 1
    return seen, worst


def bench_line(g, params, dims, device):
    """Median ms of the oracle graph (traced with make_fx) in eager and under
    torch.compile, and whether the trace's outputs equal the evaluator's."""
    inputs = {k: v.to(device) for k, v in P.make_inputs(g, dims, seed=1).items()}
    fwd, names, onames, traced = T.make_forward(g, params, dims, device=device, compute="model",
                                                example_inputs=inputs)
    xs = [inputs[k] for k in names]
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    ref = T.run_graph(g, params, inputs, dims, device=device, compute="model")
    with torch.inference_mode():
        got = fwd(*xs)
        eager = P.median_ms(lambda: fwd(*xs), sync)
    same = all(P.rel_err(a, ref[k]) == 0 for a, k in zip(got, onames))
    try:
        cf = torch.compile(fwd)
        with torch.no_grad():
            comp = f"{P.median_ms(lambda: cf(*xs), sync):.4f} ms"
            e = max(P.rel_err(a, ref[k]) for a, k in zip(cf(*xs), onames))
            comp += f" (max rel err {e:.1e} vs eager)"
    except Exception as e:  # noqa: BLE001
        comp = f"failed: {type(e).__name__}: {str(e)[:200]}"
    return (f"{'traced' if traced else 'NOT traced'}{'' if same else ' (trace DIFFERS)'}: eager {eager:.4f} ms, "
            f"torch.compile {comp}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("specs", nargs="*")
    ap.add_argument("--tgen", default=os.path.join(ROOT, "build", "tgen"))
    ap.add_argument("--interp-ref", default=None, help="a built interp_ref (default: build one from build/)")
    ap.add_argument("--work", default="/tmp/validate_oracle")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dim-value", type=int, default=2, help="value of each dynamic dim (capped by its max)")
    ap.add_argument("--precomputed", default=None,
                    help="reuse WORK-style folders made earlier (NAME/graph.json, inputs, params, interp "
                         "safetensors): no tgen or interp_ref needed, e.g. on the GPU machine")
    ap.add_argument("--bench", action="store_true", help="with --precomputed: also time eager vs torch.compile")
    a = ap.parse_args()
    if a.precomputed:
        specs = sorted(os.path.join(a.precomputed, d) for d in os.listdir(a.precomputed)
                       if os.path.exists(os.path.join(a.precomputed, d, "interp.safetensors")))
    else:
        os.makedirs(a.work, exist_ok=True)
        specs = a.specs or (sorted(glob.glob(os.path.join(HERE, "oracle_specs", "*.yaml"))) +
                            [os.path.join(ROOT, "spec", "examples", f"{n}.yaml")
                             for n in ("mlp", "mlp3", "mlp_blocks", "ln_linear_gelu_res", "tinyops")])
        iref = a.interp_ref
        if not iref:
            iref = os.path.join(a.work, "interp_ref")
            build_interp_ref(os.path.dirname(a.tgen), iref)
    T.set_precise_defaults()
    bad = 0
    print(f"{'spec':<20} {'output':<8} {'dtype':<5} {'shape':<16} {'f64-vs-interp':>13} {'model-vs-interp':>15} {'tol':>6}")
    for si, spec in enumerate(specs):
        name = os.path.splitext(os.path.basename(spec))[0]
        w = spec if a.precomputed else os.path.join(a.work, name)
        gj = os.path.join(w, "graph.json")
        ipath, ppath, opath = (os.path.join(w, x) for x in ("inputs.safetensors", "params.safetensors",
                                                            "interp.safetensors"))
        if a.precomputed:
            g = T.load_graph(gj)
            inputs = T.st_load(ipath)
            dims = T.resolve_dims(g, inputs)
        else:
            os.makedirs(w, exist_ok=True)
            with open(gj, "w") as f:
                subprocess.run([a.tgen, "check", "--json", spec], stdout=f, check=True)
            g = T.load_graph(gj)
            dims = P.pick_dims(g, prefer=a.dim_value)
            inputs = P.make_inputs(g, dims, seed=si)
            T.st_save(ipath, inputs)
            cmd = [iref, spec, "--params-out", ppath, "--inputs", ipath, "--out", opath]
            if dims:
                cmd += ["--dims", P.dims_str(dims)]
            subprocess.run(cmd, check=True)
        for m in check_safetensors(ppath) + check_safetensors(ipath):
            print(f"{name}: safetensors: {m}")
            bad += 1
        ref = T.st_load(opath)
        params = T.st_load(ppath)
        o64 = T.run_graph(g, params, inputs, dims, device=a.device, compute="f64", include_loss=True)
        omd = T.run_graph(g, params, inputs, dims, device=a.device, compute="model", include_loss=True)
        dtypes = {o["name"]: g["nodes"][o["node"]]["dtype"] for o in g["outputs"]}
        if g.get("loss", -1) >= 0:
            dtypes.setdefault(g["nodes"][g["loss"]]["name"], g["nodes"][g["loss"]]["dtype"])
        for k, r in ref.items():
            if k not in o64:
                print(f"{name:<20} {k:<8} missing from the oracle's outputs")
                bad += 1
                continue
            e64 = P.rel_err(o64[k], r)
            emd = P.rel_err(omd[k], r)
            tol = P.tolerance(g, dtypes[k])
            ok64 = e64 is not None and e64 <= F64_TOL
            okmd = emd is not None and emd <= max(tol, 1e-6)
            bad += (not ok64)
            print(f"{name:<20} {k:<8} {dtypes[k]:<5} {str(list(r.shape)):<16} {P.fmt_err(e64):>13}"
                  f"{'' if ok64 else '!'} {P.fmt_err(emd):>15}{'' if okmd else '?'} {tol:>6.0e}")
        if a.precomputed and a.bench:
            print(f"{name:<20} bench {bench_line(g, params, dims, a.device)}")
        if name in ("mlp", "ops_neural") and not a.precomputed:
            seen, worst = eval_cross_check(a.tgen, spec, dims, inputs, ref)
            ok = seen and worst < 1e-7
            bad += not ok
            print(f"{name:<20} interp_ref vs `tgen eval --set`: {seen} outputs, max rel err {worst:.1e}"
                  f"{'' if ok else '  MISMATCH'}")
    print(f"\n{'OK' if not bad else f'{bad} problem(s)'}: float64 oracle vs interpreter, tolerance {F64_TOL:g} "
          "('!' = over it; '?' = model-dtype error above the parity tolerance)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
