#!/usr/bin/env python3
"""check_grad.py: checks a model's loss and parameter gradients, as tgen
computes them, against a framework's own autodiff (JAX by default).

    check_grad.py --tgen PATH/tgen --spec MODEL.yaml --work DIR [--dims B=4]
        [--seed 0] [--runner PATH/NAME_run] [--tol T] [--oracle jax|torch]
        [--keep | --clean] [--skip-without-jax] [--perturb NAME=REL --expect-fail NAME]

Steps (files in --work DIR):
  graph.json          tgen check --json MODEL.yaml
  params.safetensors  with --runner: `NAME_run --seed S --save-params` (the
                      model's init); else (or with --random-params) random
                      normal params (std 1/sqrt(fan_in), fan_in = the
                      last dim, for rank >= 2; std 0.5 for rank <= 1) in each
                      param's dtype, under its checkpoint name
  inputs.safetensors  floats uniform in [-1, 1) in the input's dtype; i32
                      inputs valid for the ops they reach through shape ops
                      (the rows of an embedding table, the classes of a
                      cross_entropy), and for a cross_entropy-only target
                      about --ignore-frac of the entries set to its
                      ignore_index (never all); bool inputs 0/1
  subject.safetensors the subject: with --runner, `NAME_run --params P
                      --inputs I --grad --out G` (the emitted code, in the
                      model's dtype); else `tgen eval --grad --params P
                      --inputs I --out G --out-dtype f64` (tgen's autodiff run
                      in its double-precision interpreter)
  oracle.safetensors  jax_oracle.py --grad --compute f64 on the same files
                      (--oracle torch: tests/gpu/torch_oracle.py --grad)

then compares the loss (its binding name), grad.<checkpoint name> of every
param and grad.<input> of every input the spec's train.wrt lists: err = max|subject - oracle|, rel = err / max(max|oracle|, floor),
pass when rel <= tol; floor = --floor-rel (default 1e-3) x the largest
max|oracle| of all the gradients (1e-12 for the loss), so that a gradient
that is zero but for rounding (a bias before a layer_norm) is not judged by
its noise alone. Default tol: 1e-9 against tgen eval (both sides in f64);
against a runner by the model dtype: f32 2e-5, f16 1e-2, bf16 5e-2 (the last
two provisional). Prints a table; exits 1 when a tensor fails or is missing
on either side, 2 on a setup error (a command failed), 77 with
--skip-without-jax when jax cannot be imported (CTest's skip code; not when
the environment has TGEN_REQUIRE_JAX=1, as CI does), else 0.

Self-test: --perturb NAME=REL adds REL * max|t| to the largest-magnitude
element of the subject's tensor NAME in subject.safetensors before comparing;
--expect-fail NAME then exits 0 only if NAME, and nothing else, fails.

--reuse keeps graph.json, params and inputs already in --work (and with
--subject-file F takes the subject's results from F instead of running one):
for running an oracle on files made elsewhere, e.g. torch_oracle.py on a GPU
machine without tgen.
"""
import argparse
import math
import os
import subprocess
import sys
import time

try:
    import numpy as np
except ImportError:  # reported in main, with the jax check
    np = None

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TORCH_ORACLE = os.path.join(ROOT, "tests", "gpu", "torch_oracle.py")
JAX_ORACLE = os.path.join(HERE, "jax_oracle.py")

SHAPE_OPS = {"reshape", "transpose", "permute", "slice", "squeeze", "unsqueeze", "broadcast_to", "concat"}
RUNNER_TOL = {"f32": 2e-5, "f16": 1e-2, "bf16": 5e-2}
EVAL_TOL = 1e-9
TINY = 1e-12


class SetupError(Exception):
    pass


def run(cmd, what, log=None):
    """Runs cmd; raises SetupError with its output when it fails."""
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    dt = time.time() - t0
    if log is not None:
        log.append((what, dt))
    if p.returncode != 0:
        raise SetupError(f"{what} failed (exit {p.returncode}):\n  $ {' '.join(cmd)}\n{p.stdout.rstrip()}")
    return p.stdout


def np_dtype(J, dt):
    return J.DTYPES[dt]

# ---------------------------------------------------------------- params and inputs


def random_params(J, graph, seed):
    """Random normal params, kaiming-like scale, in each param's dtype."""
    rng = np.random.default_rng(seed)
    out = {}
    for p in graph["params"]:
        shape = [int(d) for d in p["shape"]]  # params are static
        std = 1.0 / math.sqrt(shape[-1]) if len(shape) >= 2 else 0.5
        v = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
        if p["dtype"] in J.FLOAT_DTYPES:
            out[p["ckpt"]] = v.astype(np.float32).astype(np_dtype(J, p["dtype"]))
        else:
            out[p["ckpt"]] = np.round(v).astype(np_dtype(J, p["dtype"]))
    return out


def index_uses(graph, sizes, node_id):
    """Where the values of i32 node `node_id` end up, through shape ops:
    (bound, ignore_index): bound = the smallest table rows / class count of
    the embeddings and cross_entropys they reach (None: none); ignore_index
    = the cross_entropy's when that is their only use (else None)."""
    nodes = graph["nodes"]
    users = {}
    for n in nodes:
        for k, i in enumerate(n["in"]):
            if i >= 0:
                users.setdefault(i, []).append((n, k))
    bound, ignore, only_ce = None, None, True
    stack, seen = [node_id], set()
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        for n, k in users.get(i, []):
            if n["op"] in SHAPE_OPS:
                stack.append(n["id"])
            elif n["op"] == "embedding" and k == 0:
                b = sizes.size(nodes[n["in"][1]]["shape"][0])
                bound = b if bound is None else min(bound, b)
                only_ce = False
            elif n["op"] == "cross_entropy" and k == 1:
                lg = nodes[n["in"][0]]["shape"]
                b = sizes.size(lg[0] if len(lg) == 1 else lg[1])
                bound = b if bound is None else min(bound, b)
                if ignore is not None and ignore != n["ignore_index"]:
                    only_ce = False
                ignore = n["ignore_index"]
            else:
                only_ce = False
    return bound, (ignore if only_ce else None)


def random_inputs(J, graph, sizes, seed, ignore_frac):
    rng = np.random.default_rng(seed + 1000003)
    out = {}
    for inp in graph["inputs"]:
        shape = sizes.shape(inp["shape"])
        dt = inp["dtype"]
        if dt in J.FLOAT_DTYPES:
            out[inp["name"]] = rng.uniform(-1, 1, shape).astype(np.float32).astype(np_dtype(J, dt))
        elif dt == "bool":
            out[inp["name"]] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            bound, ignore = index_uses(graph, sizes, inp["node"])
            v = rng.integers(0, bound if bound else 4, shape).astype(np.int32)
            if ignore is not None and ignore_frac > 0 and v.size > 1:
                drop = rng.random(shape) < ignore_frac
                if drop.all():
                    drop.flat[0] = False
                v[drop] = ignore
            out[inp["name"]] = v
    return out

# ---------------------------------------------------------------- the subject
#
# What is checked against the oracle. Two modes:
#   tgen eval  (default)   tgen's autodiff (gen/autodiff.c) in its
#                          double-precision interpreter: checks autodiff's
#                          rules, and the oracle itself
#   runner     (--runner)  EMITTED-RUNNER MODE: the emitted project's
#                          NAME_run --grad, i.e. the generated backward code in
#                          the model's dtype. Interface: `NAME_run --params P
#                          --inputs I --grad --out G [--dims ...]` writes the
#                          loss (binding name, the loss node's dtype) and
#                          grad.<ckpt> (the param's dtype). CTest wiring:
#                          TGEN_ORACLE_RUNNER_SPECS in tests/CMakeLists.txt.


def subject_tgen_eval(a, files, dims_arg, log):
    cmd = [a.tgen, "eval", a.spec, "--params", files["params"], "--inputs", files["inputs"], "--grad", "--out",
           files["subject"], "--out-dtype", "f64"]
    if dims_arg:
        cmd += ["--dims", dims_arg]
    run(cmd, "tgen eval --grad", log)


def subject_runner(a, files, dims_arg, log):
    cmd = [a.runner, "--params", files["params"], "--inputs", files["inputs"], "--grad", "--out", files["subject"]]
    if dims_arg:
        cmd += ["--dims", dims_arg]
    run(cmd, f"{os.path.basename(a.runner)} --grad", log)


def runner_params(a, files, log):
    run([a.runner, "--seed", str(a.seed), "--save-params", files["params"]], "runner --save-params", log)

# ---------------------------------------------------------------- the oracle


def run_oracle(a, files, dims_arg, log):
    if a.oracle == "jax":
        cmd = [a.oracle_python, JAX_ORACLE, "--compute", "f64"]
    else:
        cmd = [a.oracle_python, TORCH_ORACLE, "--compute", "f64", "--device", a.torch_device]
    cmd += ["--graph", files["graph"], "--params", files["params"], "--inputs", files["inputs"], "--grad", "--out",
            files["oracle"]]
    if dims_arg:
        cmd += ["--dims", dims_arg]
    if a.allow_dropout:
        cmd += ["--allow-dropout"]
    run(cmd, f"{a.oracle}_oracle --grad (f64)", log)

# ---------------------------------------------------------------- comparison


def perturb(J, path, spec):
    name, rel = spec.split("=")
    rel = float(rel)
    t = J.st_load(path)
    if name not in t:
        raise SetupError(f"--perturb: the subject wrote no tensor '{name}'")
    v = t[name].astype(np.float64)
    k = int(np.argmax(np.abs(v))) if v.size else 0
    v.flat[k] += rel * float(np.max(np.abs(v)))
    t[name] = v.astype(t[name].dtype)
    J.st_save(path, t)
    print(f"check_grad: perturbed {name}[{k}] by {rel:g} x max|{name}| in {path}")


def compare(J, graph, subject_path, oracle_path, tol, floor_rel=1e-3):
    """Rows (name, shape, dtype, max|ref|, err, rel, ok, note) for the loss
    and every param gradient; missing tensors are rows with ok = False.
    rel = err / max(max|ref|, floor, 1e-12): for a gradient, floor =
    floor_rel x the largest max|ref| of all gradients, so that a gradient that
    is zero up to rounding (a bias before a layer_norm) is not judged by its
    rounding noise alone."""
    sub, ref = J.st_load(subject_path), J.st_load(oracle_path)
    lname = J.loss_name(graph)
    names = [lname] + [f"grad.{p['ckpt']}" for p in graph["params"]] + [f"grad.{w}" for w in graph.get("wrt", [])]
    scale = 0.0
    for name in names[1:]:
        r = ref.get(name)
        if r is not None and r.size:
            r = np.abs(r.astype(np.float64))
            if np.isfinite(r).any():
                scale = max(scale, float(np.max(r[np.isfinite(r)])))
    floor = floor_rel * scale
    rows = []
    for name in names:
        s, r = sub.get(name), ref.get(name)
        if s is None or r is None:
            rows.append((name, "-", "-", float("nan"), float("nan"), float("nan"), False,
                         "missing in the " + ("subject" if s is None else "oracle")))
            continue
        if list(s.shape) != list(r.shape):
            rows.append((name, str(list(r.shape)), str(s.dtype), float("nan"), float("nan"), float("nan"), False,
                         f"shape {list(s.shape)} vs {list(r.shape)}"))
            continue
        sd, rd = s.astype(np.float64), r.astype(np.float64)
        mref = float(np.max(np.abs(rd))) if rd.size else 0.0
        err = float(np.max(np.abs(sd - rd))) if rd.size else 0.0
        if not (np.all(np.isfinite(sd) == np.isfinite(rd)) and np.array_equal(sd[~np.isfinite(sd)], rd[~np.isfinite(rd)])):
            err = float("inf")
        elif rd.size and not np.all(np.isfinite(rd)):
            fin = np.isfinite(rd)
            err = float(np.max(np.abs(sd[fin] - rd[fin]))) if fin.any() else 0.0
            mref = float(np.max(np.abs(rd[fin]))) if fin.any() else 0.0
        den = max(mref, TINY) if name == lname else max(mref, floor, TINY)
        rel = err / den
        note = f"(rel to the floor {floor:.1e})" if name != lname and floor > mref else ""
        rows.append((name, str(list(r.shape)), str(s.dtype), mref, err, rel, rel <= tol, note))
    extra = sorted(set(sub) - set(names))
    return rows, extra


def print_table(rows, tol):
    w = max([len("name")] + [len(r[0]) for r in rows])
    ws = max([len("shape")] + [len(r[1]) for r in rows])
    print(f"{'name':<{w}}  {'shape':<{ws}}  {'dtype':<8} {'max|ref|':>10} {'max abs err':>12} {'rel err':>10}  pass")
    for name, shape, dt, mref, err, rel, ok, note in rows:
        print(f"{name:<{w}}  {shape:<{ws}}  {dt:<8} {mref:>10.3e} {err:>12.3e} {rel:>10.3e}  "
              f"{'ok' if ok else 'FAIL'}{'  ' + note if note else ''}")
    nf = sum(not r[6] for r in rows)
    worst = max((r[5] for r in rows if r[5] == r[5]), default=float("nan"))
    print(f"{len(rows) - nf} passed, {nf} failed (tol {tol:g}, worst rel err {worst:.3e})")

# ---------------------------------------------------------------- main


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--tgen", help="the tgen binary")
    ap.add_argument("--spec", help="the model spec (YAML), with a train: section")
    ap.add_argument("--work", required=True, help="folder for the files (made if missing)")
    ap.add_argument("--dims", default="", help="dynamic dims, B=4,T=8 (missing ones: 2, capped by the max)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the params and inputs")
    ap.add_argument("--runner", help="the emitted NAME_run: check the emitted code (else tgen eval --grad)")
    ap.add_argument("--random-params", action="store_true",
                    help="with --runner too: random params instead of the runner's init (zeros-initialised "
                         "params can put ops at their kinks, abs or relu at 0)")
    ap.add_argument("--tol", type=float, help="max rel err (default: see above)")
    ap.add_argument("--floor-rel", type=float, default=1e-3,
                    help="a gradient's error is relative to at least this x the largest |gradient| (default 1e-3)")
    ap.add_argument("--oracle", choices=["jax", "torch"], default="jax")
    ap.add_argument("--oracle-python", default=sys.executable, help="python for the oracle (default: this one)")
    ap.add_argument("--torch-device", default="cpu", help="--oracle torch: cpu or cuda")
    ap.add_argument("--ignore-frac", type=float, default=0.25,
                    help="fraction of cross_entropy-only targets set to ignore_index (default 0.25)")
    ap.add_argument("--allow-dropout", action="store_true", help="passed to the oracle")
    ap.add_argument("--keep", action="store_true", help="keep the files (the default)")
    ap.add_argument("--clean", action="store_true", help="remove the safetensors files when everything passes")
    ap.add_argument("--skip-without-jax", action="store_true", help="exit 77 (skip) when jax cannot be imported")
    ap.add_argument("--perturb", help="NAME=REL: self-test, perturb the subject's tensor NAME")
    ap.add_argument("--expect-fail", help="exit 0 only if exactly this tensor fails (with --perturb)")
    ap.add_argument("--reuse", action="store_true", help="reuse graph.json, params and inputs in --work")
    ap.add_argument("--subject-file", help="with --reuse: the subject's results (no subject is run)")
    a = ap.parse_args(argv)

    sys.path.insert(0, HERE)
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    try:
        import jax_oracle as J
    except ImportError as e:
        if a.skip_without_jax and os.environ.get("TGEN_REQUIRE_JAX") != "1":
            print(f"check_grad: SKIP: jax is not importable ({e}); pip install jax")
            return 77
        print(f"check_grad: jax is not importable ({e}); pip install jax", file=sys.stderr)
        return 2
    if not a.reuse and not (a.tgen and a.spec):
        ap.error("--tgen and --spec are needed (unless --reuse)")
    if a.subject_file and not a.reuse:
        ap.error("--subject-file needs --reuse")
    if not a.subject_file and not a.runner and not a.tgen:
        ap.error("--tgen is needed to run the subject")

    os.makedirs(a.work, exist_ok=True)
    files = {k: os.path.join(a.work, f) for k, f in
             (("graph", "graph.json"), ("params", "params.safetensors"), ("inputs", "inputs.safetensors"),
              ("subject", "subject.safetensors"), ("oracle", "oracle.safetensors"))}
    if a.subject_file:
        files["subject"] = a.subject_file
    log = []
    t_start = time.time()
    try:
        if not a.reuse:
            with open(files["graph"], "w") as f:
                f.write(run([a.tgen, "check", "--json", a.spec], "tgen check --json", log))
        graph = J.load_graph(files["graph"])
        if graph.get("loss", -1) < 0:
            raise SetupError(f"{a.spec or files['graph']}: the model has no train: loss")
        dims = J.parse_dims(a.dims)
        for s in graph["syms"]:
            if not s["derived"] and s["name"] not in dims:
                dims[s["name"]] = min(2, s["max"]) if s["max"] > 0 else 2
        dims_arg = ",".join(f"{k}={v}" for k, v in dims.items())
        sizes = J.Sizes(graph, dims)
        if not a.reuse:
            if a.runner and not a.random_params:
                runner_params(a, files, log)
            else:
                J.st_save(files["params"], random_params(J, graph, a.seed))
            J.st_save(files["inputs"], random_inputs(J, graph, sizes, a.seed, a.ignore_frac))
        if not a.subject_file:
            (subject_runner if a.runner else subject_tgen_eval)(a, files, dims_arg, log)
        run_oracle(a, files, dims_arg, log)
        if a.perturb:
            perturb(J, files["subject"], a.perturb)
    except SetupError as e:
        print(f"check_grad: {e}", file=sys.stderr)
        return 2

    tol = a.tol
    if tol is None:
        tol = RUNNER_TOL.get(graph["dtype"], 2e-5) if a.runner else EVAL_TOL
    what = (os.path.basename(a.runner) if a.runner else "tgen eval --grad (f64)") if not a.subject_file \
        else a.subject_file
    print(f"check_grad: {graph['name']} at {dims_arg or 'static dims'}: {what} vs {a.oracle} (f64), "
          f"{len(graph['params'])} params")
    rows, extra = compare(J, graph, files["subject"], files["oracle"], tol, a.floor_rel)
    print_table(rows, tol)
    if extra:
        print(f"check_grad: note: the subject also wrote {', '.join(extra)}")
    print("check_grad: times: " + ", ".join(f"{w} {t:.2f} s" for w, t in log) +
          f"; total {time.time() - t_start:.2f} s")
    failed = {r[0] for r in rows if not r[6]}
    if a.expect_fail:
        ok = failed == {a.expect_fail}
        print(f"check_grad: expected exactly {a.expect_fail} to fail: "
              f"{'yes' if ok else 'no (failed: ' + (', '.join(sorted(failed)) or 'none') + ')'}")
        return 0 if ok else 1
    if not failed and a.clean:
        for k in ("params", "inputs", "subject", "oracle"):
            if k != "subject" or not a.subject_file:
                try:
                    os.remove(files[k])
                except OSError:
                    pass
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
