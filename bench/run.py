#!/usr/bin/env python3
"""run.py: tgen's emitted code against PyTorch (eager and torch.compile) on
the PERF.md workloads: correctness on the same weights and inputs, then
timing, all in one run on one machine. Runs where the projects are built (the
GPU machine); bench/prepare.sh makes the folder it sits in (the emitted
projects NAME/, their graphs NAME.json, torch_oracle.py) where tgen is.

    python3 DEST/run.py --out OUT [--cpu] [--gpt2] [--only NAME[,NAME]] [options]

  (default)      GPU mode: tinyops, tinyops_fwdbwd, ln_linear_gelu_res, mlp3,
                 mlp_blocks, seed_attention (+ gpt2, gpt2_infer with --gpt2)
  --cpu          CPU mode (PERF.md's CPU anchors, --threads threads, default 16):
                 tinyops_cpu, mlp3_cpu, mlp_blocks_cpu, gpt2_cpu; the copy and
                 sgemm ceilings are measured first in the same run
  --gpt2         add GPT-2 124M to the GPU mode: its train step and its forward (gpt2_infer), B=16, bf16
  --only A,B     just these workloads (any mode's names; gpt2 included if named)
  --list         print the workloads and exit
  --no-compile   skip torch.compile (quick runs)
  --iters N      timed iterations for every timing (default: per workload, >= 20)
  --budget S     no workload starts after S seconds (default 540; the device
                 machine ends a command at 600 s), and each one's limit is cut
                 to what is left
  --build DIR    where NAME-build/ go (default /tmp/tgen-bench-build; reused:
                 cmake --build is incremental)   --no-build: use them as they are
  --work DIR     inputs, params, outputs, logs (default /tmp/tgen-bench-work)
  --jobs N       compile jobs per project (default: all cores)
  --limit S      seconds per workload (default: its own, 120 to 330)

Per workload (each in its own process, killed at its time limit; a failure is a
row of the table, never the end of the run):
  1. build:   cmake -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90
              (all projects in parallel, at the start);
  2. tgen:    NAME_bench --device cuda|cpu --dims ... --iters N [--train 1]
              (median ms; on the GPU CUDA events around each call, then
              again with --graphs 1: CUDA graphs, and with --graphs 1
              --autotune 1: max-autotune, both reported in the notes);
  3. check:   NAME_run --seed S --save-params on inputs from seed S
              (--check-seed, default 0; --grad for train workloads: the
              loss and every gradient), against torch_oracle.py's
              evaluation of tgen's graph in float64 on the same params and
              inputs (and torch in the model dtype against the same reference,
              "torch err", for scale). Error = max|a-b| / max|ref| (a gradient's
              max|ref| floored at 1e-3 x the largest gradient, as
              tests/gpu/grad_parity.py does). Tolerance f32 1e-4, bf16/f16 2e-2;
  4. torch:   a hand-written functional module (checked against the oracle in
              float64 on the same params first: "module err" in the JSON),
              timed eager and under torch.compile (default mode; mlp3 also
              mode="reduce-overhead") with CUDA events, median after warm-up.
              Train steps: zero_grad, loss, backward, (clip), AdamW (fused on
              CUDA); GPT-2: f32 params under bf16 autocast, as PERF.md measures.
Floor = max(bytes / copy bandwidth, FLOPs / GEMM ceiling of the dtype) from the
shapes (GPU: PERF.md's H100 numbers, 2965 GB/s, f32 51.7, bf16/f16 738 TFLOP/s;
on an H200 its copy and bf16 rates measured in this workplace, 4300 GB/s and
788 TFLOP/s; CPU: measured here). "% of floor" = tgen ms / floor ms x 100 (100% = at the floor).

Output in --out: bench.md (the table), bench.json (every number), bench.png
(matplotlib, if importable), logs.tgz (build and run logs). The table and the
JSON are rewritten after each workload, so a cut-off run still leaves them.

Needs python3 with torch (numpy, matplotlib optional), cmake, a C compiler and
(GPU mode) nvcc. No tgen: the projects are already emitted.
"""
import argparse
import concurrent.futures
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------- ceilings

# PERF.md, measured on the H100 80GB HBM3 with torch 2.11
GPU_CEIL = {"copy": 2965e9, "f32": 51.7e12, "tf32": 395e12, "bf16": 738e12, "f16": 738e12}
# The H200 (the H100's chip with faster memory), as this workplace measured it with torch (the device
# library's KINDS.md, 2026-10-28/11-04: a device-to-device copy ~4.3 TB/s counting bytes read and written,
# 8192^3 bf16 matmul 769-798 TFLOP/s on random data); f32 and tf32 the H100's (same multiprocessors, clocks)
GPU_CEIL_H200 = {"copy": 4300e9, "f32": 51.7e12, "tf32": 395e12, "bf16": 788e12, "f16": 788e12,
                 "source": "the H200's copy and bf16 rates measured in this workplace; f32, tf32 PERF.md's"}
# PERF.md's CPU anchors (16-core Xeon, 16 threads); replaced by the measured ones when measured
CPU_CEIL = {"copy": 80e9, "f32": 1454e9, "bf16": 1454e9, "f16": 1454e9}

TOL = {"f32": 1e-4, "bf16": 2e-2, "f16": 2e-2}
# A value over TOL still passes within this multiple of torch's own error on it
# in the model dtype against the same float64 reference: a 12-layer bf16 model's
# gradients reach the tolerance in torch too (GPT-2 at B=2: 0.019-0.020), so a
# fixed bound alone fails by one seed's draw. PyTorch checks torch.compile the
# same way (torch._dynamo.utils.same with an fp64 reference: eager's error
# times a multiplier).
TORCH_MULT = 2.0

# ---------------------------------------------------------------- workloads
#
# name: (mode, project or None, kind, fields). kind: fwd | train | fwdbwd (the loss's
# gradient w.r.t. the input: tgen's forward_backward of a train.wrt spec without an optimizer).
# dims: bench dims; check: the correctness check's dims (default: dims);
# ints: bound of each i32 input's values; scale: float inputs are uniform in
# [-scale, scale); iters: timed iterations; limit: seconds for the workload.


def _wl(mode, project, kind, dtype, dims="", check=None, iters=30, limit=150, ints=None, scale=1.0,
        modes=("default",), note=""):
    return {"mode": mode, "project": project, "kind": kind, "dtype": dtype, "dims": dims,
            "check": dims if check is None else check, "iters": iters, "limit": limit, "ints": ints or {},
            "scale": scale, "modes": modes, "note": note}


WORKLOADS = {
    # GPU (PERF.md's table)
    "tinyops": _wl("gpu", "tinyops", "fwd", "f32", iters=50, limit=120),
    "tinyops_fwdbwd": _wl("gpu", "tinyops_fwdbwd", "fwdbwd", "f32", iters=50, limit=120),
    "ln_linear_gelu_res": _wl("gpu", "ln_linear_gelu_res", "fwd", "f16", iters=50, limit=120),
    "mlp3": _wl("gpu", "mlp3", "fwd", "f32", dims="B=32", iters=100, limit=150, ints={"y": 10},
                modes=("default", "reduce-overhead"), note="launch-bound: the bytes/FLOPs floor is ~1 us"),
    "mlp_blocks": _wl("gpu", "mlp_blocks", "train", "f32", dims="B=8192", iters=20, limit=200),
    "seed_attention": _wl("gpu", "seed_attention", "fwd", "f32", iters=30, limit=120, scale=0.25,
                          note="inputs in [-0.25, 0.25): exp without max-subtraction"),
    "gpt2": _wl("gpu", "gpt2", "train", "bf16", dims="B=16", check="B=2", iters=20, limit=330,
                ints={"idx": 50304, "targets": 50304}),
    "gpt2_infer": _wl("gpu", "gpt2", "fwd", "bf16", dims="B=16", check="B=2", iters=30, limit=240,
                      ints={"idx": 50304, "targets": 50304}, note="the forward: logits and loss, bf16 weights"),
    # CPU (PERF.md's CPU anchors)
    "tinyops_cpu": _wl("cpu", "tinyops_cpu", "fwd", "f32", iters=20, limit=240),
    "mlp3_cpu": _wl("cpu", "mlp3", "fwd", "f32", dims="B=32", iters=100, limit=180, ints={"y": 10}),
    "mlp_blocks_cpu": _wl("cpu", "mlp_blocks_cpu", "train", "f32", dims="B=1024", iters=20, limit=240),
    "gpt2_cpu": _wl("cpu", "gpt2_cpu", "train", "f32", dims="B=8", iters=20, limit=240,
                    ints={"idx": 512, "targets": 512}),
}
GPU_DEFAULT = ["tinyops", "tinyops_fwdbwd", "ln_linear_gelu_res", "mlp3", "mlp_blocks", "seed_attention"]
CPU_DEFAULT = ["tinyops_cpu", "mlp3_cpu", "mlp_blocks_cpu", "gpt2_cpu"]

# optimizer of each train spec (the graph JSON does not carry the train: section)
OPTIM = {
    "mlp_blocks": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01, "clip": 0.0},
    "mlp_blocks_cpu": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01, "clip": 0.0},
    "gpt2": {"lr": 6e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "clip": 1.0},
    "gpt2_cpu": {"lr": 6e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "clip": 1.0},
}


def parse_dims(s):
    out = {}
    for part in (s or "").split(","):
        if part.strip():
            k, v = part.split("=")
            out[k.strip()] = int(v)
    return out


def graph_dims(graph, dims):
    """Every dim's value: static ones from the graph's syms/shapes, dynamic from dims."""
    env = dict(dims)
    for s in graph["syms"]:
        if not s["derived"] and s["name"] not in env:
            env[s["name"]] = s["max"]
    return env


def static_dim(graph, name):
    """A static dim's value, found in the params' or inputs' declared shapes."""
    for src in ("params", "inputs"):
        for p in graph[src]:
            for d, e in zip(p["shape"], p.get("shape_text", p["shape"])):
                if e == name and isinstance(d, int):
                    return d
    return None


def floor_of(name, graph, dims, ceil):
    """(bytes that must move, FLOPs that must be done, which GEMM ceiling)."""
    base = name.replace("_fwdbwd", "").replace("_cpu", "").replace("_infer", "")
    params = sum(math.prod(int(x) for x in p["shape"]) for p in graph["params"]) if graph else 0
    if base == "tinyops":
        n = 8192 if name != "tinyops_cpu" else 4096
        return 2 * n * n * 4, 0, "f32"
    if base == "ln_linear_gelu_res":
        B, T, D = 32, 512, 512
        return (2 * B * T * D + D * D + D) * 2, 2 * B * T * D * D, "f16"
    if base == "mlp3":
        B = dims.get("B", 32)
        return (params + B * 512 + B * 10) * 4, 2 * B * (512 * 512 * 2 + 512 * 10), "f32"
    if base == "mlp_blocks":
        B = dims["B"]
        D, H, L = (1024, 4096, 4) if name == "mlp_blocks" else (512, 2048, 2)
        # read x, tgt; AdamW reads p, g, m, v and writes p, m, v (f32) -- the GEMMs dominate
        return 2 * B * D * 4 + 7 * params * 4, 3 * L * 2 * (2 * B * D * H), "f32"
    if base == "seed_attention":
        B, T, D = 1, 1024, 4096
        return (2 * B * T * D + 3 * D * D) * 4, 3 * 2 * B * T * D * D + 2 * 2 * B * T * T * D, "f32"
    if base == "gpt2":
        B = dims["B"]
        T, C, L, V, dt = (64, 128, 2, 512, "f32") if name == "gpt2_cpu" else (1024, 768, 12, 50304, "bf16")
        per_tok = 2 * (12 * L * C * C + V * C) + L * 4 * T * C  # fwd: matmul params + QK^T, PV (full)
        if name == "gpt2_infer":  # read the params, write the logits
            return params * 2 + B * T * V * 2, B * T * per_tok, dt
        opt = params * ((2 + 4 + 4 + 4) * 2 if dt == "bf16" else 4 * 7)  # rough: p, master, m, v in and out
        return 2 * B * T * 4 + opt, 3 * B * T * per_tok, dt
    return 0, 0, "f32"


# ---------------------------------------------------------------- small helpers

def say(*a):
    print(*a, flush=True)


def run_cmd(cmd, timeout, log, env=None, cwd=None):
    """Runs cmd with a time limit; output appended to log. (rc, output, seconds); rc 'timeout' on expiry."""
    t0 = time.time()
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd,
                             start_new_session=True)
        try:
            out, _ = p.communicate(timeout=timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            rc = "timeout"
    except OSError as e:
        rc, out = "oserror", str(e)
    dt = time.time() - t0
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n{out}\n[rc={rc}, {dt:.1f}s]\n\n")
    return rc, out or "", dt


def fmt_ms(v):
    if v is None:
        return "n/a"
    if isinstance(v, str):
        return v
    return f"{v:.3g}" if v < 0.1 else f"{v:.4f}" if v < 1 else f"{v:.3f}" if v < 100 else f"{v:.1f}"


# ---------------------------------------------------------------- torch side (worker only)

def torch_fns(name, graph):
    """(function of (P, *inputs) -> outputs tuple or loss, input names) of the
    hand-written module of a workload; P: {checkpoint name: tensor}."""
    import torch
    import torch.nn.functional as F
    base = name.replace("_fwdbwd", "").replace("_cpu", "").replace("_infer", "")
    if base == "tinyops":
        def tiny(P, x):
            a = x * 2 + 1
            b = torch.sigmoid(a)
            c = b * b
            d = torch.tanh(c)
            return (d / (d.abs() + 1),)
        return tiny
    if base == "ln_linear_gelu_res":
        def lnres(P, x):
            return (F.gelu(F.linear(F.layer_norm(x, (x.shape[-1],), eps=1e-5), P["w"], P["b"])) + x,)
        return lnres
    if base == "mlp3":
        def mlp3(P, x, y):
            h = F.gelu(F.linear(x, P["w1"], P["b1"]))
            h = F.gelu(F.linear(h, P["w2"], P["b2"]))
            return (F.linear(h, P["w3"], P["b3"]),)
        return mlp3
    if base == "mlp_blocks":
        L = len([p for p in graph["params"] if p["ckpt"].endswith(".up")])

        def blocks(P, x, tgt):
            h = x
            for i in range(L):
                p = f"h.{i}."
                u = F.layer_norm(h, (h.shape[-1],), P[p + "ln_w"], P[p + "ln_b"], eps=1e-5)
                h = h + F.linear(F.gelu(F.linear(u, P[p + "up"], P[p + "up_b"])), P[p + "down"], P[p + "down_b"])
            return F.mse_loss(h, tgt)
        return blocks
    if base == "seed_attention":
        def seed(P, x):
            q = F.linear(x, P["wq"])
            k = F.linear(x, P["wk"])
            v = F.linear(x, P["wv"])
            e = torch.exp(q @ k.transpose(1, 2))
            return ((e / e.sum(-1, keepdim=True)) @ v,)
        return seed
    if base == "gpt2":
        L = len([p for p in graph["params"] if p["ckpt"].endswith("attn.c_attn.weight")])
        NH = 4 if name == "gpt2_cpu" else 12

        def gpt(P, idx, targets):
            B, T = idx.shape
            t = "transformer."
            x = F.embedding(idx.long(), P[t + "wte.weight"]) + P[t + "wpe.weight"][:T]
            C = x.shape[-1]
            for i in range(L):
                p = f"{t}h.{i}."
                u = F.layer_norm(x, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], eps=1e-5)
                qkv = F.linear(u, P[p + "attn.c_attn.weight"], P[p + "attn.c_attn.bias"])
                q, k, v = qkv.split(C, dim=-1)
                q, k, v = (z.view(B, T, NH, C // NH).transpose(1, 2) for z in (q, k, v))
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
                x = x + F.linear(a, P[p + "attn.c_proj.weight"], P[p + "attn.c_proj.bias"])
                u = F.layer_norm(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], eps=1e-5)
                m = F.gelu(F.linear(u, P[p + "mlp.c_fc.weight"], P[p + "mlp.c_fc.bias"]), approximate="tanh")
                x = x + F.linear(m, P[p + "mlp.c_proj.weight"], P[p + "mlp.c_proj.bias"])
            x = F.layer_norm(x, (C,), P[t + "ln_f.weight"], P[t + "ln_f.bias"], eps=1e-5)
            logits = F.linear(x, P[t + "wte.weight"])
            loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T).long())  # f32 under autocast
            return (logits, loss) if name.endswith("_infer") else loss  # the forward's outputs, or the loss
        return gpt
    raise ValueError(name)


class Worker:
    """One workload in this process: tgen timing, correctness, torch timing.
    Results go to self.res, saved to --res after every step."""

    def __init__(self, a):
        import torch
        self.torch = torch
        sys.path.insert(0, HERE)
        import torch_oracle as T
        self.T = T
        self.a = a
        self.name = a.worker
        self.w = WORKLOADS[self.name]
        self.cpu = self.w["mode"] == "cpu" or a.test_on_cpu
        self.dev = "cpu" if self.cpu else "cuda"
        self.res = {"name": self.name}
        self.work = os.path.join(a.work, self.name)
        os.makedirs(self.work, exist_ok=True)
        self.log = os.path.join(a.work, "logs", f"{self.name}.log")
        if self.cpu:
            torch.set_num_threads(a.threads)
        T.set_precise_defaults()  # TF32 off
        proj = self.w["project"] or self.name.replace("_fwdbwd", "")
        self.graph = T.load_graph(os.path.join(a.dir, f"{proj}.json"))
        self.model = self.graph["name"]
        self.exe = os.path.join(a.build, f"{proj}-build")

    def save(self):
        with open(self.a.res + ".tmp", "w") as f:
            json.dump(self.res, f, indent=1)
        os.replace(self.a.res + ".tmp", self.a.res)

    def step(self, what, fn):
        t0 = time.time()
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {str(e)[:400]}"
            self.res.setdefault("errors", {})[what] = msg
            say(f"  [{self.name}] {what} failed: {msg}")
            with open(self.log, "a") as f:
                import traceback
                f.write(f"{what} failed:\n{traceback.format_exc()}\n")
        self.res.setdefault("step_s", {})[what] = round(time.time() - t0, 2)
        self.save()
        if not self.cpu:
            self.torch.cuda.empty_cache()

    # ------------------------------------------------------------ inputs
    def inputs(self, dims, seed):
        torch, T = self.torch, self.T
        sizes = T.Sizes(self.graph, graph_dims(self.graph, dims))
        gen = torch.Generator().manual_seed(seed)
        out = {}
        for inp in self.graph["inputs"]:
            shape = sizes.shape(inp["shape"])
            dt = inp["dtype"]
            if dt in T.FLOAT_DTYPES:
                t = ((torch.rand(shape, generator=gen) * 2 - 1) * self.w["scale"]).to(T.DTYPES[dt])
            elif dt == "bool":
                t = torch.randint(0, 2, shape, generator=gen).bool()
            else:
                t = torch.randint(0, self.w["ints"].get(inp["name"], 4), shape, generator=gen).to(torch.int32)
            out[inp["name"]] = t
        return out

    # ------------------------------------------------------------ 1. tgen timing
    def tgen_time(self):
        if not self.w["project"]:
            self.res["tgen_ms"] = None
            return
        cmd = [os.path.join(self.exe, f"{self.model}_bench"), "--device", self.dev]
        if self.w["dims"]:
            cmd += ["--dims", self.w["dims"]]
        if self.w["kind"] in ("train", "fwdbwd"):
            cmd += ["--train", "1"]  # fwdbwd: forward_backward (the spec has no optimizer)
        if self.w["ints"]:  # integer inputs spread over their range, as torch's (not all 0)
            cmd += ["--int-range", str(min(self.w["ints"].values()))]
        env = dict(os.environ, OMP_NUM_THREADS=str(self.a.threads)) if self.cpu else None
        # a probe (2 calls) first: a slow call gets fewer iterations (at least 5), not a timeout
        probe, _ = self.bench_median(cmd + ["--iters", "1", "--warmup", "1"], env)
        n, warm = self.fit_iters(probe)
        self.tgen_cmd = (cmd + ["--iters", str(n), "--warmup", str(warm)], env)
        self.res["tgen_iters"] = n
        self.res["tgen_ms"], out = self.bench_median(*self.tgen_cmd)
        self.res["tgen_line"] = out.strip().splitlines()[-1]
        mem = re.search(r"device memory peak ([\d.]+) MiB", out)  # tgm_device_memory: what the model allocated
        if mem:
            self.res["tgen_peak_gib"] = round(float(mem.group(1)) / 1024, 2)
        if not self.cpu:  # the same with CUDA graphs (NAME_set_graphs: one switch for the user)
            rc, out, _ = run_cmd(cmd + ["--iters", str(n), "--warmup", str(max(warm, 3)), "--graphs", "1"],
                                 self.a.cmd_timeout, self.log, env=env)
            m = re.search(r"median ([\d.]+) ms", out)
            self.res["tgen_graphs_ms"] = float(m.group(1)) if rc == 0 and m else None
            # and with autotuned GEMMs and graphs (compile.mode max-autotune's defaults)
            rc, out, _ = run_cmd(cmd + ["--iters", str(n), "--warmup", str(max(warm, 3)), "--graphs", "1",
                                        "--autotune", "1"], self.a.cmd_timeout, self.log, env=env)
            m = re.search(r"median ([\d.]+) ms", out)
            self.res["tgen_tuned_ms"] = float(m.group(1)) if rc == 0 and m else None
        ws = re.search(r"workspace ([\d.]+) MiB", out)
        if ws:
            self.res["tgen_workspace_mib"] = float(ws.group(1))
        say(f"  [{self.name}] tgen {self.res['tgen_ms']:.4f} ms")

    def bench_median(self, cmd, env):
        """Runs NAME_bench; (its median ms, its output), or raises with the tail of its output."""
        rc, out, _ = run_cmd(cmd, self.a.cmd_timeout, self.log, env=env)
        m = re.search(r"median ([\d.]+) ms", out)
        if rc != 0 or not m:
            raise RuntimeError(f"{os.path.basename(cmd[0])} rc={rc}: {out.strip()[-300:]}")
        return float(m.group(1)), out

    def tgen_again(self):
        """CPU: the same timing once more after torch's, so that a machine whose speed drifts over the minutes
        between them shows in the row (the headline stays the first run's)."""
        if not getattr(self, "tgen_cmd", None):
            return
        self.res["tgen_again_ms"], _ = self.bench_median(*self.tgen_cmd)
        say(f"  [{self.name}] tgen again after torch {self.res['tgen_again_ms']:.4f} ms")

    def iters(self):
        return self.a.iters or self.w["iters"]

    def fit_iters(self, ms):
        """(iterations, warm-up calls) for a call of about ms: the workload's
        iterations, cut so that timing takes about 30 s at most (never below 5)."""
        n = self.iters()
        if ms * (n + 5) > 30e3:
            n = max(5, int(30e3 / max(ms, 1e-3)) - 2)
            return n, 2
        return n, 5

    # ------------------------------------------------------------ 2. correctness
    def check(self):
        if not self.w["project"]:
            return
        torch, T = self.torch, self.T
        dims = parse_dims(self.w["check"])
        train = self.w["kind"] in ("train", "fwdbwd")  # fwdbwd: the loss and grad.<input> (train.wrt)
        inputs = self.inputs(dims, seed=self.a.check_seed)
        ip, pp, op = (os.path.join(self.work, f) for f in ("inputs.safetensors", "params.safetensors",
                                                           "out.safetensors"))
        for p in (pp, op):
            if os.path.exists(p):
                os.remove(p)
        T.st_save(ip, inputs)
        cmd = [os.path.join(self.exe, f"{self.model}_run"), "--device", self.dev, "--seed", str(self.a.check_seed),
               "--save-params", pp, "--inputs", ip, "--out", op]
        if self.w["check"]:
            cmd += ["--dims", self.w["check"]]
        if train:
            cmd.append("--grad")
        env = dict(os.environ, OMP_NUM_THREADS=str(self.a.threads)) if self.cpu else None
        rc, out, secs = run_cmd(cmd, self.a.cmd_timeout, self.log, env=env)
        if rc != 0 or not os.path.exists(op):
            self.res["status"] = f"FAIL (runner rc={rc})"
            raise RuntimeError(f"{self.model}_run rc={rc}: {out.strip()[-300:]}")
        got = T.st_load(op)
        params = T.st_load(pp)
        self.params = params
        dev = self.dev
        errs, terrs = {}, {}
        if train:
            loss, grads = T.run_grad(self.graph, params, inputs, dims, device=dev, compute="f64")
            ref = {T.loss_name(self.graph): loss}
            ref.update({f"grad.{k}": v for k, v in grads.items()})
            del grads
            lm, gm = T.run_grad(self.graph, params, inputs, dims, device=dev, compute="model")
            mod = {T.loss_name(self.graph): lm}
            mod.update({f"grad.{k}": v for k, v in gm.items()})
            del gm
        else:
            ref = T.run_graph(self.graph, params, inputs, dims, device=dev, compute="f64")
            mod = T.run_graph(self.graph, params, inputs, dims, device=dev, compute="model")
        gscale = max((float(v.abs().max()) for k, v in ref.items() if k.startswith("grad.") and v.numel()),
                     default=0.0)
        for k, r in ref.items():
            floor = 1e-3 * gscale if k.startswith("grad.") else 0.0
            errs[k] = rel_err(got.get(k), r, floor) if k in got else "missing"
            terrs[k] = rel_err(mod[k], r, floor)
        tol = TOL.get(self.w["dtype"], 1e-4)
        numeric = [e for e in errs.values() if isinstance(e, float)]
        worst = max(numeric) if numeric else None
        # a value passes within the dtype's tolerance, or within TORCH_MULT times torch's own
        # error in the model dtype on it (as PyTorch checks torch.compile against float64)
        bad = [k for k, e in errs.items()
               if not isinstance(e, float) or not (e <= tol or (isinstance(terrs.get(k), float) and
                                                                e <= TORCH_MULT * terrs[k]))]
        self.res.update({"err": worst, "errs": errs, "torch_errs": terrs, "tol": tol, "torch_mult": TORCH_MULT,
                         "check_dims": self.w["check"],
                         "torch_err": max((e for e in terrs.values() if isinstance(e, float)), default=None),
                         "status": "pass" if not bad else f"FAIL ({len(bad)} of {len(errs)} over tol and over "
                                                          f"{TORCH_MULT:g}x torch's: {', '.join(bad[:3])})"})
        say(f"  [{self.name}] check at {self.w['check'] or 'static dims'}: max rel err {worst} "
            f"(torch in {self.w['dtype']}: {self.res['torch_err']}), tol {tol:g}: {self.res['status']}")
        # the hand-written module against the same reference, in float64
        fn = torch_fns(self.name, self.graph)
        P = {k: v.to(dev, torch.float64) for k, v in params.items()}
        xs = [inputs[i["name"]].to(dev) for i in self.graph["inputs"]]
        xs = [x.double() if x.is_floating_point() else x for x in xs]
        with torch.no_grad():
            o = fn(P, *xs)
        if self.w["kind"] == "fwdbwd":
            o = o[0].sum()  # the module returns the outputs; the loss is their sum
        if train:
            me = rel_err(o, ref[T.loss_name(self.graph)])
        else:
            me = max(rel_err(v, ref[out["name"]]) or 0.0 for v, out in zip(o, self.graph["outputs"]))
        self.res["module_err"] = me
        if me is None or me > 1e-6:
            say(f"  [{self.name}] WARNING: the torch module differs from tgen's graph (f64 rel err {me}): "
                f"its timings may not be comparable")

    # ------------------------------------------------------------ 3. torch timing
    def params_for_torch(self):
        """The checked params when there are (same weights), else the seed's init is irrelevant: N(0, 0.02)."""
        torch = self.torch
        P = getattr(self, "params", None)
        if P is None:
            gen = torch.Generator().manual_seed(0)
            P = {p["ckpt"]: torch.randn([int(x) for x in p["shape"]], generator=gen) * 0.02
                 for p in self.graph["params"]}
        master = self.name == "gpt2"  # f32 params under bf16 autocast, as PERF.md's anchor
        dt = torch.float32 if master else self.T.DTYPES[self.w["dtype"]]
        return {k: v.to(self.dev, dt) for k, v in P.items()}

    def timer(self, fn, first_ms):
        """Median ms of fn over the fitted iterations after warm-up."""
        torch = self.torch
        n, warmup = self.fit_iters(first_ms)
        for _ in range(warmup):
            fn()
        ts = []
        if self.cpu:
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e3)
        else:
            torch.cuda.synchronize()
            for _ in range(n):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                e.synchronize()
                ts.append(s.elapsed_time(e))
        return statistics.median(ts)

    def sync(self):
        if not self.cpu:
            self.torch.cuda.synchronize()

    def module(self, P, grad):
        """The hand-written function as an nn.Module holding P as parameters, so
        that torch.compile sees the weights as a model's (static addresses for
        CUDA graphs) and the optimizer steps them."""
        torch = self.torch
        fn = torch_fns(self.name, self.graph)
        keys = list(P)

        class Mod(torch.nn.Module):
            def __init__(self):
                super().__init__()
                for i, k in enumerate(keys):
                    self.register_parameter(f"p{i}", torch.nn.Parameter(P[k], requires_grad=grad))

            def forward(self, *xs):
                return fn({k: getattr(self, f"p{i}") for i, k in enumerate(keys)}, *xs)
        return Mod()

    def torch_time(self, mode):
        torch = self.torch
        kind = self.w["kind"]
        P = self.params_for_torch()
        # i32 indices as int64, as PyTorch code holds them (no conversion inside the timed step)
        xs = [v.to(self.dev, torch.int64 if v.dtype == torch.int32 else v.dtype)
              for v in self.inputs(parse_dims(self.w["dims"]), seed=1).values()]
        key = "eager_ms" if mode == "eager" else "compile_ms" if mode == "default" else f"compile_{mode}_ms"
        if mode != "eager":
            torch._dynamo.reset()
        mod = self.module(P, grad=kind == "train")
        f = mod if mode == "eager" else torch.compile(mod, mode=mode)
        if kind == "fwd":
            def call():
                with torch.no_grad():
                    f(*xs)
        elif kind == "fwdbwd":
            x = xs[0].requires_grad_(True)
            g = (lambda x: mod(x)[0].sum())
            f = g if mode == "eager" else torch.compile(g, mode=mode)

            def call():
                torch.autograd.grad(f(x), [x])
        else:
            o = OPTIM[self.name]
            ps = list(mod.parameters())
            opt = torch.optim.AdamW(ps, lr=o["lr"], betas=o["betas"], eps=o["eps"],
                                    weight_decay=o["weight_decay"], fused=not self.cpu)
            amp = self.name == "gpt2"

            def call():
                opt.zero_grad(set_to_none=True)
                with torch.autocast(self.dev, dtype=torch.bfloat16, enabled=amp):
                    loss = f(*xs)
                loss.backward()
                if o["clip"]:
                    torch.nn.utils.clip_grad_norm_(ps, o["clip"], foreach=not self.cpu)
                opt.step()
        t0 = time.time()
        call()
        self.sync()
        first = time.time() - t0
        if not self.cpu:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.time()
        call()  # a second call: its time sizes the iterations
        self.sync()
        ms = self.timer(call, 1e3 * (time.time() - t0))
        self.res[key] = ms
        self.res[key.replace("_ms", "_first_s")] = round(first, 2)
        if not self.cpu:
            self.res[key.replace("_ms", "_peak_gib")] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        say(f"  [{self.name}] torch {mode}: {ms:.4f} ms (first call {first:.1f} s)")

    def run(self):
        w = self.w
        self.res.update({"kind": w["kind"], "dtype": w["dtype"], "dims": w["dims"], "project": w["project"],
                         "note": w["note"]})
        self.step("tgen", self.tgen_time)
        self.step("check", self.check)
        self.step("eager", lambda: self.torch_time("eager"))
        if not self.a.no_compile:
            for m in w["modes"]:
                self.step(f"compile-{m}", lambda m=m: self.torch_time(m))
        if self.cpu:
            self.step("tgen-again", self.tgen_again)
        return 0


def rel_err(a, ref, floor=0.0):
    """max|a - ref| / max(max|ref|, floor) over finite refs; positions where both
    are NaN (or the same infinity) agree, NaN or inf in one only is an infinite
    error; absolute when the scale is 0. None: the sizes differ."""
    import torch
    if isinstance(a, (tuple, list)):
        a = a[0]
    a = a.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    if a.numel() != ref.numel():
        return None
    a = a.reshape(ref.shape)
    if a.numel() == 0:
        return 0.0
    same = (torch.isnan(a) & torch.isnan(ref)) | (a == ref)
    fin = torch.isfinite(ref)
    scale = ref[fin].abs().max().item() if bool(fin.any()) else 0.0
    scale = max(scale, floor)
    d = (a - ref).abs()
    d[same] = 0
    d[torch.isnan(d)] = float("inf")
    m = d.max().item()
    return m / scale if scale > 0 else m


def measure_cpu_ceilings(a):
    """Copy bandwidth and sgemm 2048^3 on the CPU with a.threads threads (torch)."""
    import torch
    torch.set_num_threads(a.threads)
    src = torch.rand(64 << 20)  # 256 MiB
    dst = torch.empty_like(src)
    ts = []
    for i in range(12):
        t0 = time.perf_counter()
        dst.copy_(src)
        if i >= 2:
            ts.append(time.perf_counter() - t0)
    copy = 2 * src.numel() * 4 / statistics.median(ts)
    x, y = torch.rand(2048, 2048), torch.rand(2048, 2048)
    ts = []
    for i in range(12):
        t0 = time.perf_counter()
        torch.mm(x, y)
        if i >= 2:
            ts.append(time.perf_counter() - t0)
    gemm = 2 * 2048 ** 3 / statistics.median(ts)
    out = {"copy": copy, "f32": gemm, "bf16": gemm, "f16": gemm, "measured": True}
    with open(a.res, "w") as f:
        json.dump(out, f)
    say(f"  CPU ceilings ({a.threads} threads): copy {copy / 1e9:.1f} GB/s, sgemm 2048^3 {gemm / 1e9:.0f} GFLOP/s")
    return 0


# ---------------------------------------------------------------- driver

def env_info(a):
    lines = [f"date: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}"]
    try:
        c = open(os.path.join(a.dir, "COMMIT")).read().strip()
        lines.append(f"tgen commit: {c}")
    except OSError:
        pass
    for label, cmd in (("gpu", ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]),
                       ("nvcc", ["nvcc", "--version"]), ("cmake", ["cmake", "--version"]),
                       ("torch", [sys.executable, "-c", "import torch; print(torch.__version__, 'cuda',"
                                  " torch.version.cuda, 'available', torch.cuda.is_available())"]),
                       ("cpu", ["sh", "-c", "echo $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cores"])):
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=90)
            out = " ".join(p.stdout.strip().splitlines()[-2:] if label != "gpu" else p.stdout.strip().splitlines()[:1])
        except Exception as e:  # noqa: BLE001
            out = f"none ({type(e).__name__})"
        lines.append(f"{label}: {out.strip()}")
    return lines


def build(a, proj, logdir):
    """cmake configure + build; (ok, seconds, message)."""
    src = os.path.join(a.dir, proj)
    bdir = os.path.join(a.build, f"{proj}-build")
    log = os.path.join(logdir, f"{proj}.build.log")
    open(log, "w").close()
    t0 = time.time()
    cache = os.path.join(bdir, "CMakeCache.txt")
    if os.path.exists(cache):  # a build of another prepared folder's project: CMake refuses it, so start afresh
        m = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", open(cache, errors="replace").read(), re.M)
        if m and os.path.realpath(m.group(1)) != os.path.realpath(src):
            shutil.rmtree(bdir, ignore_errors=True)
    cfg = ["cmake", "-S", src, "-B", bdir, "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_CUDA_ARCHITECTURES={a.arch}"]
    if a.cpu and a.cpu_only_build:
        m = re.search(r"option\((\w+_CUDA) ", open(os.path.join(src, "CMakeLists.txt")).read())
        cfg.append(f"-D{m.group(1) if m else 'TGM_CUDA'}=OFF")
    rc, out, _ = run_cmd(cfg, a.build_timeout, log)
    if rc == 0:
        rc, out, _ = run_cmd(["cmake", "--build", bdir, "-j", str(a.jobs)], a.build_timeout, log)
    dt = time.time() - t0
    if rc != 0:
        tail = "\n".join(out.strip().splitlines()[-8:])
        return False, dt, f"build failed (rc={rc}; logs/{proj}.build.log):\n{tail}"
    text = open(log).read()
    cuda = re.search(r"CUDA path: (\w+)", text)
    gemm = re.search(r"CPU GEMM: ([^\n]+)", text)
    return True, dt, (f"built in {dt:.0f} s (CUDA path {cuda.group(1) if cuda else '?'}, "
                      f"CPU GEMM {gemm.group(1).strip() if gemm else '?'})")


def row_of(name, r, ceil, a):
    """The table row (list of strings) and the numbers it shows."""
    w = WORKLOADS[name]
    tg, ea, co = r.get("tgen_ms"), r.get("eager_ms"), r.get("compile_ms")
    fl = r.get("floor_ms")
    ratio = f"{tg / co:.2f}" if tg and co else "n/a"
    pct = f"{100 * tg / fl:.0f}%" if tg and fl else "n/a"
    err = r.get("err")
    if w["project"] is None:
        tgs, errs, status = "n/a (not supported yet)", "n/a", "n/a"
    else:
        tgs = fmt_ms(tg) if tg is not None else ("FAIL" if r.get("status", "").startswith("FAIL") or
                                                  "tgen" in r.get("errors", {}) else "n/a")
        errs = f"{err:.1e}" if isinstance(err, float) else "n/a"
        if isinstance(err, float) and r.get("torch_err") is not None:
            errs += f" (torch {r['torch_err']:.1e})"
        status = r.get("status") or ("FAIL (no check)" if "check" in r.get("errors", {}) else "n/a")
    if r.get("timeout"):
        status = f"{status}; TIMEOUT ({r['timeout']})" if status not in ("n/a",) else f"TIMEOUT ({r['timeout']})"
    if r.get("skipped"):
        status = r["skipped"]
    notes = []
    if r.get("tgen_again_ms") is not None:
        notes.append(f"tgen again after torch {fmt_ms(r['tgen_again_ms'])} ms")
    if r.get("tgen_graphs_ms") is not None:
        notes.append(f"tgen with CUDA graphs {fmt_ms(r['tgen_graphs_ms'])} ms")
    if r.get("tgen_tuned_ms") is not None:
        notes.append(f"tgen max-autotune (graphs and timed GEMM algorithms) {fmt_ms(r['tgen_tuned_ms'])} ms")
    if r.get("compile_reduce-overhead_ms") is not None:
        notes.append(f"reduce-overhead {fmt_ms(r['compile_reduce-overhead_ms'])} ms")
    if r.get("compile_first_s") is not None:
        notes.append(f"compile 1st call {r['compile_first_s']:.0f} s")
    if r.get("tgen_workspace_mib") is not None:
        notes.append(f"tgen workspace {r['tgen_workspace_mib']:.4g} MiB")
    if w["kind"] == "train" or name == "gpt2_infer":  # device memory allocated at most (not the CUDA context)
        peaks = [(k, r.get(f"{k}_peak_gib")) for k in ("tgen", "eager", "compile")]
        if any(v is not None for _, v in peaks):
            notes.append("peak memory " + ", ".join(f"{k} {v:.2f} GiB" for k, v in peaks if v is not None))
    if r.get("build") and not r["build"].startswith("built"):
        notes.append(r["build"])
    for k, v in r.get("errors", {}).items():
        notes.append(f"{k} error: {v[:120]}")
    if w["note"]:
        notes.append(w["note"])
    dims = w["dims"] or "static"
    return [f"{name} ({w['kind']}, {w['dtype']}, {dims})", tgs, fmt_ms(ea), fmt_ms(co), ratio,
            fmt_ms(fl) if fl else "n/a", pct, errs, status, "; ".join(notes).replace("|", "/")]


HEAD = ["workload", "tgen ms", "eager ms", "compile ms", "tgen/compile", "floor ms", "% of floor",
        "max rel err", "pass/fail", "notes"]


def write_report(a, names, results, ceil, envl, t_start, final=False):
    rows = [row_of(n, results[n], ceil, a) for n in names if n in results]
    md = [f"# tgen vs PyTorch, {'CPU' if a.cpu else 'GPU'} mode", ""]
    md += [f"- {ln}" for ln in envl]
    cs = ", ".join(f"{k} {v / 1e9:.0f} {'GB/s' if k == 'copy' else 'GFLOP/s'}" for k, v in ceil.items()
                   if isinstance(v, float))
    src = "measured here" if ceil.get("measured") else ceil.get("source", "PERF.md")
    md.append(f"- ceilings for the floors ({src}): {cs}")
    builds = sorted({f"{WORKLOADS[n]['project']}: {results[n]['build']}" for n in names
                     if n in results and results[n].get("build")})
    if builds:
        md.append("- builds: " + "; ".join(builds))
    md.append(f"- run time so far: {time.time() - t_start:.0f} s{'' if final else ' (incomplete)'}")
    md += ["", "| " + " | ".join(HEAD) + " |", "|" + " --- |" * len(HEAD)]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    md += ["", "tgen: NAME_bench median (GPU: CUDA events around each call, as torch; CPU: wall clock); torch: median of CUDA events "
           "(GPU) or wall clock (CPU) after warm-up; % of floor = tgen / floor; max rel err = max|tgen-ref|/"
           "max|ref| against torch_oracle in float64 on the same params and inputs (outputs; or loss and every "
           "gradient), torch = torch in the model dtype against the same reference; a value passes within f32 1e-4, "
           "bf16/f16 2e-2, or within twice torch's own error on it."]
    with open(os.path.join(a.out, "bench.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(a.out, "bench.json"), "w") as f:
        json.dump({"mode": "cpu" if a.cpu else "gpu", "env": envl, "ceilings": ceil,
                   "workloads": {n: results[n] for n in names if n in results},
                   "elapsed_s": round(time.time() - t_start, 1), "complete": final}, f, indent=1)
    return rows


def plot(a, names, results):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        say(f"no plot: matplotlib is not importable ({type(e).__name__})")
        return
    series = [("tgen", "tgen_ms", "tab:green"), ("torch eager", "eager_ms", "tab:blue"),
              ("torch.compile", "compile_ms", "tab:orange"), ("floor", "floor_ms", "tab:gray")]
    shown = [n for n in names if n in results and any(results[n].get(k) for _, k, _ in series[:3])]
    if not shown:
        say("no plot: no timings")
        return
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(shown) + 2), 4.5))
    wbar = 0.8 / len(series)
    for j, (label, key, color) in enumerate(series):
        xs, ys = [], []
        for i, n in enumerate(shown):
            v = results[n].get(key)
            if v:
                xs.append(i + (j - 1.5) * wbar)
                ys.append(v)
        ax.bar(xs, ys, wbar, label=label, color=color)
        for x, y in zip(xs, ys):
            ax.text(x, y, fmt_ms(y), ha="center", va="bottom", fontsize=6, rotation=90)
    ax.set_yscale("log")
    ax.set_xticks(range(len(shown)))
    ax.set_xticklabels(shown, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("ms (log scale, lower is better)")
    ax.set_title(f"tgen vs PyTorch ({'CPU' if a.cpu else 'GPU'})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "bench.png"), dpi=120)
    say(f"plot: {os.path.join(a.out, 'bench.png')}")


def run_worker(a, argv_extra, limit, res_path, log):
    """Runs this script as a worker with a time limit, its output streamed. (rc or 'timeout', seconds)."""
    cmd = [sys.executable, os.path.abspath(__file__)] + argv_extra + ["--res", res_path]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t0 = time.time()
    with open(log, "a") as lf:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                             start_new_session=True)
        import threading

        def pump():
            for line in p.stdout:
                lf.write(line)
                lf.flush()
                if line.startswith("  [") or line.startswith("  CPU") or "Error" in line or "WARNING" in line:
                    sys.stdout.write(line)
                    sys.stdout.flush()
        th = threading.Thread(target=pump, daemon=True)
        th.start()
        try:
            rc = p.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            rc = "timeout"
        th.join(timeout=5)
    return rc, time.time() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out"), help="results folder (default $OUT)")
    ap.add_argument("--dir", default=HERE, help="the prepared folder (default: this script's)")
    ap.add_argument("--build", default="/tmp/tgen-bench-build")
    ap.add_argument("--work", default="/tmp/tgen-bench-work")
    ap.add_argument("--cpu", action="store_true", help="CPU mode")
    ap.add_argument("--gpt2", action="store_true", help="GPU mode: add GPT-2 124M")
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("--threads", type=int, default=16, help="CPU threads (tgen OMP_NUM_THREADS, torch)")
    ap.add_argument("--budget", type=float, default=540.0)
    ap.add_argument("--limit", type=float, default=0, help="seconds per workload (default: its own, 120-330)")
    ap.add_argument("--check-seed", type=int, default=0,
                    help="the correctness check's params (NAME_run --seed) and inputs seed (default 0)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 8)
    ap.add_argument("--arch", default="90")
    ap.add_argument("--cpu-only-build", action="store_true", help="CPU mode: build without the CUDA path")
    ap.add_argument("--build-timeout", type=int, default=300)
    ap.add_argument("--cmd-timeout", type=int, default=240, help="seconds per runner/bench call")
    ap.add_argument("--test-on-cpu", action="store_true", help=argparse.SUPPRESS)  # GPU workloads on the CPU
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ceilings", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--res", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.dir = os.path.abspath(a.dir)
    a.build = os.path.abspath(a.build)
    a.work = os.path.abspath(a.work)

    if a.ceilings:
        return measure_cpu_ceilings(a)
    if a.worker:
        return Worker(a).run()

    if a.list:
        for n, w in WORKLOADS.items():
            say(f"{n:<20} {w['mode']}  {w['kind']:<6} {w['dtype']:<4} {w['dims'] or 'static':<8} "
                f"project {w['project']}")
        return 0
    if a.only:
        names = [n.strip() for n in a.only.split(",") if n.strip()]
        bad = [n for n in names if n not in WORKLOADS]
        if bad:
            say(f"run.py: unknown workload(s) {', '.join(bad)}; --list shows them")
            return 2
        a.cpu = a.cpu or all(WORKLOADS[n]["mode"] == "cpu" for n in names)
        if any((WORKLOADS[n]["mode"] == "cpu") != a.cpu for n in names):
            say("run.py: --only mixes GPU and CPU workloads; run the modes separately (--cpu for CPU ones)")
            return 2
    else:
        names = list(CPU_DEFAULT if a.cpu else GPU_DEFAULT + (["gpt2", "gpt2_infer"] if a.gpt2 else []))
    t_start = time.time()
    os.makedirs(a.out, exist_ok=True)
    a.out = os.path.abspath(a.out)
    logdir = os.path.join(a.work, "logs")
    shutil.rmtree(logdir, ignore_errors=True)
    os.makedirs(logdir, exist_ok=True)
    os.makedirs(a.build, exist_ok=True)
    if not a.cpu and not shutil.which("nvcc") and os.path.exists("/usr/local/cuda/bin/nvcc"):
        os.environ["PATH"] = "/usr/local/cuda/bin:" + os.environ["PATH"]
    say(f"== tgen bench ({'CPU' if a.cpu else 'GPU'} mode): {', '.join(names)}")

    # builds: all projects in parallel, in the background
    projects = sorted({WORKLOADS[n]["project"] for n in names if WORKLOADS[n]["project"]})
    missing = [p for p in projects if not os.path.exists(os.path.join(a.dir, p, "CMakeLists.txt"))]
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(projects)))
    futs = {}
    for p in projects:
        if p in missing:
            continue
        if a.no_build:
            ok = os.path.isdir(os.path.join(a.build, f"{p}-build"))
            f = concurrent.futures.Future()
            f.set_result((ok, 0.0, "reused" if ok else "not built (--no-build)"))
            futs[p] = f
        else:
            futs[p] = pool.submit(build, a, p, logdir)
    if projects and not a.no_build:
        say(f"== building {len(futs)} project(s) in parallel (-j {a.jobs} each): {', '.join(futs)}")

    envl = env_info(a)
    for ln in envl:
        say("   " + ln)

    # every build done before anything is timed: a compiler on every core skews the timings
    if futs:
        concurrent.futures.wait(list(futs.values()), timeout=max(1.0, a.budget - (time.time() - t_start)))
        say(f"== builds done after {time.time() - t_start:.0f} s")
    ceil = dict(GPU_CEIL_H200 if any(ln.startswith("gpu:") and "H200" in ln for ln in envl) else GPU_CEIL)
    results = {}
    if a.cpu:
        ceil = dict(CPU_CEIL)
        rp = os.path.join(a.work, "ceilings.json")
        rc, _ = run_worker(a, ["--ceilings", "--threads", str(a.threads)], 120, rp,
                           os.path.join(logdir, "ceilings.log"))
        try:
            ceil.update(json.load(open(rp)))
        except Exception:  # noqa: BLE001
            say(f"   CPU ceilings not measured (rc {rc}); using PERF.md's")

    for n in names:
        w = WORKLOADS[n]
        r = {"name": n}
        results[n] = r
        left = a.budget - (time.time() - t_start)
        say(f"== {n} ({w['kind']}, {w['dtype']}, {w['dims'] or 'static dims'})")
        if left < 20:
            r["skipped"] = f"skipped (time budget {a.budget:.0f} s)"
            say(f"   {r['skipped']}")
            write_report(a, names, results, ceil, envl, t_start)
            continue
        p = w["project"]
        graph = None
        gp = os.path.join(a.dir, f"{p or n.replace('_fwdbwd', '')}.json")
        try:
            graph = json.load(open(gp))
        except OSError:
            pass
        if p:
            if p in missing or graph is None:
                r["status"] = "FAIL (not prepared)"
                say(f"   {p}: not in {a.dir} (run bench/prepare.sh)")
                write_report(a, names, results, ceil, envl, t_start)
                continue
            try:
                ok, secs, msg = futs[p].result(timeout=max(1.0, a.budget - (time.time() - t_start)))
            except concurrent.futures.TimeoutError:
                ok, secs, msg = False, 0, "build still running at the time budget"
            say(f"   {p}: {msg}")
            r["build"] = msg.splitlines()[0]
            r["build_s"] = round(secs, 1)
            if not ok:
                r["status"] = "FAIL (build)"
                write_report(a, names, results, ceil, envl, t_start)
                continue
        d = graph_dims(graph, parse_dims(w["dims"])) if graph else {}
        try:
            by, fl, ck = floor_of(n, graph, d, ceil)
            r.update({"floor_bytes": by, "floor_flops": fl, "floor_ceiling": ck,
                      "floor_ms": 1e3 * max(by / ceil["copy"], fl / ceil[ck])})
        except Exception as e:  # noqa: BLE001
            say(f"   floor: {type(e).__name__}: {e}")
        limit = min(a.limit or w["limit"], a.budget - (time.time() - t_start))
        rp = os.path.join(a.work, f"{n}.result.json")
        if os.path.exists(rp):
            os.remove(rp)
        extra = ["--worker", n, "--dir", a.dir, "--build", a.build, "--work", a.work, "--threads", str(a.threads),
                 "--iters", str(a.iters), "--cmd-timeout", str(a.cmd_timeout)]
        extra += (["--no-compile"] if a.no_compile else []) + (["--test-on-cpu"] if a.test_on_cpu else [])
        rc, secs = run_worker(a, extra, limit, rp, os.path.join(logdir, f"{n}.worker.log"))
        try:
            wr = json.load(open(rp))
        except Exception:  # noqa: BLE001
            wr = {}
        floor_keys = {k: r[k] for k in r}
        r.update(wr)
        r.update({k: v for k, v in floor_keys.items() if k.startswith("floor") or k.startswith("build")})
        r["seconds"] = round(secs, 1)
        if rc == "timeout":
            r["timeout"] = f"killed at {limit:.0f} s"
        elif rc != 0:
            r.setdefault("errors", {})["worker"] = f"exit {rc} (logs/{n}.worker.log)"
        row = row_of(n, r, ceil, a)
        say(f"   -> tgen {row[1]} | eager {row[2]} | compile {row[3]} | floor {row[5]} | err {row[7]} | "
            f"{row[8]}  ({secs:.0f} s)")
        write_report(a, names, results, ceil, envl, t_start)

    pool.shutdown(wait=False, cancel_futures=True)
    rows = write_report(a, names, results, ceil, envl, t_start, final=True)
    say("")
    say("| " + " | ".join(HEAD[:-1]) + " |")
    say("|" + " --- |" * (len(HEAD) - 1))
    for row in rows:
        say("| " + " | ".join(row[:-1]) + " |")
    plot(a, names, results)
    try:
        with tarfile.open(os.path.join(a.out, "logs.tgz"), "w:gz") as t:
            t.add(logdir, arcname="logs")
    except Exception as e:  # noqa: BLE001
        say(f"logs.tgz: {e}")
    say(f"results: {a.out}/bench.md, bench.json, bench.png, logs.tgz ({time.time() - t_start:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
