#!/usr/bin/env python3
"""torch_oracle.py: an independent PyTorch evaluation of a tgen graph.

Reads the graph IR that `tgen check --json MODEL.yaml` prints and evaluates the
forward pass node by node with PyTorch's own ops (torch.nn.functional where
one exists), so that the outputs of a tgen-emitted project can be compared
with what PyTorch computes for the same params and inputs.

    python3 torch_oracle.py --graph G.json --params P.safetensors \\
        --inputs I.safetensors --out O.safetensors \\
        [--device cuda|cpu] [--compute model|f64|f32] [--dims B=2,T=64] [--with-loss]
        [--grad [--allow-dropout]]

  --compute model  every tensor in its own dtype (f32 / bf16 / f16 / i32 /
                   bool), as torch computes with tensors of those dtypes: this
                   is what the emitted code approximates (default)
  --compute f64    every floating tensor in float64 (a high-precision
                   reference); `cast` to a floating dtype still rounds to that
                   dtype, as tgen's reference interpreter does
  --compute f32    every floating tensor in float32 (casts still round)
  --grad           instead of the outputs, write the train loss (under its
                   binding name, the JSON's "loss_name") and
                   grad.<checkpoint name> = d loss / d param for every param,
                   by torch.autograd over the same node-by-node evaluation
                   (params are leaf tensors with requires_grad). With
                   --compute f64/f32 the gradient of a `cast` is rounded to
                   the operand's dtype (a cast back, as gen/autodiff.c and
                   tests/oracle/jax_oracle.py do); with --compute model it is
                   torch's own. The loss may not depend on a dropout with
                   p > 0 (evaluated as the identity, which a training step
                   with masks does not compute) unless --allow-dropout.

Params are looked up by their checkpoint name ("ckpt" in the JSON), falling
back to the internal name; inputs by input name. Dynamic dims come from
--dims, else from the inputs' shapes (a size that is a bare dim name), else 1.
Outputs are written with tensor names = output names, in the node's dtype
(--compute model) or float64/float32.

As a module:

    import torch_oracle as T
    g = T.load_graph("G.json")
    outs = T.run_graph(g, T.st_load("P.safetensors"), T.st_load("I.safetensors"),
                       device="cuda", compute="model")
    loss, grads = T.run_grad(g, params, inputs, device="cuda", compute="f64")

Safetensors files are read and written with `safetensors.torch` when it is
importable, else with the small reader/writer below (json + struct +
torch.frombuffer; no numpy needed). Set TORCH_ORACLE_OWN_ST=1 to force the
built-in one.
"""
import argparse
import ctypes
import json
import math
import os
import re
import struct
import sys

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------- dtypes

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "i32": torch.int32,
          "bool": torch.bool}
FLOAT_DTYPES = ("f32", "bf16", "f16")

# ---------------------------------------------------------------- safetensors

_ST_TO_TORCH = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                "U8": torch.uint8, "BOOL": torch.bool}
_TORCH_TO_ST = {v: k for k, v in _ST_TO_TORCH.items()}


def _have_st_package():
    if os.environ.get("TORCH_ORACLE_OWN_ST"):
        return False
    try:
        import safetensors.torch  # noqa: F401
        return True
    except Exception:
        return False


def st_read_own(path):
    """Reads a safetensors file into {name: CPU tensor} without the package."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    hdr = json.loads(data[8:8 + n].decode("utf-8"))
    base = 8 + n
    buf = bytearray(data[base:])  # writable, so torch.frombuffer does not warn
    out = {}
    for name, d in hdr.items():
        if name == "__metadata__":
            continue
        if d["dtype"] not in _ST_TO_TORCH:
            raise ValueError(f"{path}: tensor '{name}': unsupported dtype {d['dtype']}")
        dt = _ST_TO_TORCH[d["dtype"]]
        shape = [int(s) for s in d["shape"]]
        b, e = d["data_offsets"]
        numel = math.prod(shape)
        esize = torch.empty((), dtype=dt).element_size()
        if e - b != numel * esize or e > len(buf) or b < 0:
            raise ValueError(f"{path}: tensor '{name}': data_offsets {b},{e} do not match {d['dtype']}{shape}")
        if numel == 0:
            t = torch.empty(shape, dtype=dt)
        else:
            t = torch.frombuffer(buf, dtype=torch.uint8, count=e - b, offset=b).clone().view(dt).reshape(shape)
        out[name] = t
    return out


def st_write_own(path, tensors, metadata=None):
    """Writes {name: tensor} as safetensors (atomically: PATH.tmp, then rename)."""
    hdr, blobs, off = {}, [], 0
    if metadata:
        hdr["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        if t.dtype not in _TORCH_TO_ST:
            raise ValueError(f"tensor '{name}': dtype {t.dtype} has no safetensors code")
        nbytes = t.numel() * t.element_size()
        hdr[name] = {"dtype": _TORCH_TO_ST[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + nbytes]}
        blobs.append(ctypes.string_at(t.data_ptr(), nbytes) if nbytes else b"")
        off += nbytes
    h = json.dumps(hdr, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for bl in blobs:
            f.write(bl)
    os.replace(tmp, path)


def st_load(path):
    """{name: CPU tensor} from a safetensors file."""
    if _have_st_package():
        from safetensors.torch import load_file
        return load_file(path)
    return st_read_own(path)


def st_save(path, tensors):
    """Writes {name: tensor} to a safetensors file (tensors moved to the CPU)."""
    # own copies: outputs may be views of one another, which the package refuses
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    if _have_st_package():
        from safetensors.torch import save_file
        save_file(tensors, path)
    else:
        st_write_own(path, tensors)

# ---------------------------------------------------------------- sizes

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(.))")


def eval_size(expr, env):
    """Value of a size expression over dims: ints, names (looked up in env),
    + - * / (exact division) and parentheses. Anything else is an error."""
    if isinstance(expr, int):
        return expr
    toks = []
    for m in _TOKEN.finditer(str(expr)):
        if m.group(1):
            toks.append(("n", int(m.group(1))))
        elif m.group(2):
            if m.group(2) not in env:
                raise ValueError(f"size '{expr}': unknown dim '{m.group(2)}'")
            toks.append(("n", int(env[m.group(2)])))
        elif m.group(3) and not m.group(3).isspace():
            if m.group(3) not in "+-*/()":
                raise ValueError(f"size '{expr}': unexpected '{m.group(3)}'")
            toks.append(("o", m.group(3)))
    pos = [0]

    def peek():
        return toks[pos[0]] if pos[0] < len(toks) else ("e", None)

    def take():
        t = peek()
        pos[0] += 1
        return t

    def atom():
        k, v = take()
        if k == "n":
            return v
        if (k, v) == ("o", "-"):
            return -atom()
        if (k, v) == ("o", "("):
            r = sum_()
            if take() != ("o", ")"):
                raise ValueError(f"size '{expr}': missing ')'")
            return r
        raise ValueError(f"size '{expr}': unexpected {v!r}")

    def prod_():
        r = atom()
        while peek() in (("o", "*"), ("o", "/")):
            op = take()[1]
            b = atom()
            if op == "*":
                r *= b
            else:
                if b == 0 or r % b:
                    raise ValueError(f"size '{expr}': {r} / {b} does not divide")
                r //= b
        return r

    def sum_():
        r = prod_()
        while peek() in (("o", "+"), ("o", "-")):
            op = take()[1]
            b = prod_()
            r = r + b if op == "+" else r - b
        return r

    r = sum_()
    if pos[0] != len(toks):
        raise ValueError(f"size '{expr}': trailing text")
    return r


class Sizes:
    """Evaluates the JSON's sizes for given values of the dynamic dims.
    Derived quotients ("(B*T)/(12)") appear verbatim inside other sizes; they
    are replaced by their values (checked to divide) before evaluating."""

    def __init__(self, graph, dims):
        self.env = {}
        base = [s for s in graph["syms"] if not s["derived"]]
        for s in base:
            if s["name"] not in dims:
                raise ValueError(f"dynamic dim {s['name']} has no value")
            v = int(dims[s["name"]])
            if v < 1 or (s["max"] > 0 and v > s["max"]):
                raise ValueError(f"dim {s['name']} = {v} is outside [1, {s['max']}]")
            self.env[s["name"]] = v
        self.derived = []  # (name, value), longest name first
        for s in graph["syms"]:
            if s["derived"]:
                self.derived.append((s["name"], self._eval(s["name"])))
                self.derived.sort(key=lambda p: -len(p[0]))

    def _eval(self, e):
        for name, v in self.derived:
            e = e.replace(name, f"({v})")
        return eval_size(e, self.env)

    def size(self, d):
        return d if isinstance(d, int) else self._eval(d)

    def shape(self, s):
        return [self.size(d) for d in s]


def resolve_dims(graph, inputs=None, dims=None):
    """Values of the dynamic dims: `dims` first, then the input tensors' sizes
    where the declared size is a bare dim name, else 1 (as the runner does)."""
    out = dict(dims or {})
    names = {s["name"] for s in graph["syms"] if not s["derived"]}
    for inp in graph["inputs"]:
        t = (inputs or {}).get(inp["name"])
        if t is None:
            continue
        for k, d in enumerate(inp["shape"]):
            if isinstance(d, str) and d in names and d not in out and k < t.dim():
                out[d] = int(t.shape[k])
    for n in names:
        if n not in out:
            print(f"torch_oracle: dynamic dim {n} not given and not in an input shape: using 1", file=sys.stderr)
            out[n] = 1
    return out


def parse_dims(s):
    """"B=4,T=64" -> {"B": 4, "T": 64}."""
    out = {}
    for part in (s or "").split(","):
        if part.strip():
            k, v = part.split("=")
            out[k.strip()] = int(v)
    return out

# ---------------------------------------------------------------- evaluation

UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "relu": torch.relu, "silu": F.silu, "erf": torch.erf, "square": torch.square,
    "reciprocal": torch.reciprocal,
}
# Binary ops that take a Python scalar on either side (like torch with a
# Python number: the scalar does not decide the result dtype).
BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
}
def fval(n, k):
    """n["f"][k] as a float (the JSON spells NaN and infinities as strings)."""
    v = n["f"][k]
    return float(v) if isinstance(v, str) else v


def load_graph(path):
    with open(path) as f:
        return json.load(f)


class RoundCast(torch.autograd.Function):
    """`cast` to a floating dtype with --compute f64/f32 under autograd: the
    value rounded through the target dtype and held in the compute dtype (as
    without autograd); the gradient rounded to the operand's dtype, as the
    cast back that gen/autodiff.c makes (none when the dtypes agree)."""

    @staticmethod
    def forward(ctx, x, to_dt, from_dt):
        ctx.from_dt, ctx.same = from_dt, to_dt == from_dt
        return x.to(to_dt).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        return (g if ctx.same else g.to(ctx.from_dt).to(g.dtype)), None, None


def loss_name(graph):
    """The train loss's binding name (the JSON's loss_name, else the node's)."""
    return graph.get("loss_name") or graph["nodes"][graph["loss"]]["name"] or "loss"


def loss_dropouts(graph):
    """Dropout nodes with p > 0 that the loss depends on."""
    nodes, seen, stack, out = graph["nodes"], set(), [graph["loss"]], []
    while stack:
        i = stack.pop()
        if i < 0 or i in seen:
            continue
        seen.add(i)
        if nodes[i]["op"] == "dropout" and fval(nodes[i], 0) > 0:
            out.append(nodes[i])
        stack.extend(nodes[i]["in"])
    return sorted(out, key=lambda n: n["id"])


class Evaluator:
    """Evaluates a graph with torch ops. compute: 'model' (each tensor in its
    own dtype), 'f64' or 'f32' (every floating tensor in that dtype; casts
    round through their target dtype). check: validate shapes, indices and
    targets (off for torch.compile)."""

    def __init__(self, graph, dims, device="cpu", compute="model", check=True):
        self.g = graph
        self.nodes = graph["nodes"]
        self.sizes = Sizes(graph, dims)
        self.dims = dims
        self.device = torch.device(device)
        if compute not in ("model", "f64", "f32"):
            raise ValueError(f"compute must be model, f64 or f32, not {compute!r}")
        self.compute = compute
        self.check = check
        self.input_of = {i["node"]: i for i in graph["inputs"]}
        self.param_of = {p["node"]: p for p in graph["params"]}
        # last use of every node, to free values early
        self.last_use = {}
        for n in self.nodes:
            for i in n["in"]:
                if i >= 0:
                    self.last_use[i] = n["id"]
        self.keep = {o["node"] for o in graph["outputs"]}
        if graph.get("loss", -1) >= 0:
            self.keep.add(graph["loss"])

    # the torch dtype a node's value is held in
    def tdtype(self, dt):
        if dt in FLOAT_DTYPES and self.compute != "model":
            return torch.float64 if self.compute == "f64" else torch.float32
        return DTYPES[dt]

    def leaf(self, t, dt):
        return t.to(device=self.device, dtype=self.tdtype(dt))

    def run(self, params, inputs, want):
        """Values of the node ids in `want` ({id: tensor})."""
        vals = {}
        nodes = self.nodes
        for n in nodes:
            i = n["id"]
            v = self.node(n, vals, params, inputs)
            if not isinstance(v, torch.Tensor) and n["op"] != "const":
                v = torch.tensor(v, dtype=self.tdtype(n["dtype"]), device=self.device)
            if isinstance(v, torch.Tensor):
                want_dt = self.tdtype(n["dtype"])
                if v.dtype != want_dt:
                    v = v.to(want_dt)
                if self.check:
                    shape = self.sizes.shape(n["shape"])
                    if list(v.shape) != shape:
                        raise RuntimeError(f"torch_oracle: node %{i} {n['op']} '{n['name']}' (line {n['line']}): "
                                           f"result shape {list(v.shape)}, the graph says {shape}")
            vals[i] = v
            for j in set(n["in"]):
                if j >= 0 and self.last_use.get(j) == i and j not in want and j not in self.keep:
                    del vals[j]
        return {i: self.materialize(vals[i], nodes[i]) for i in want}

    def materialize(self, v, n):
        if isinstance(v, torch.Tensor):
            return v
        return torch.full(self.sizes.shape(n["shape"]), v, dtype=self.tdtype(n["dtype"]), device=self.device)

    def scalar_value(self, n):
        """A const node's value as a Python number of its dtype's kind."""
        if n["is_dimval"]:
            v = self.sizes.size(n["lo"])
        else:
            v = fval(n, 0)
        if n["dtype"] == "i32":
            return int(v)
        if n["dtype"] == "bool":
            return bool(v)
        return float(v)

    def node(self, n, vals, params, inputs):
        op, ins, dt = n["op"], n["in"], n["dtype"]

        def T(k):  # operand k as a tensor
            j = ins[k]
            if j < 0:
                return None
            v = vals[j]
            return v if isinstance(v, torch.Tensor) else self.materialize(v, self.nodes[j])

        def V(k):  # operand k as a tensor or a Python scalar (const)
            return vals[ins[k]]

        if op == "input":
            name = self.input_of[n["id"]]["name"]
            if name not in inputs:
                raise KeyError(f"input '{name}' is missing")
            return self.leaf(inputs[name], dt)
        if op == "param":
            p = self.param_of[n["id"]]
            t = params.get(p["ckpt"], params.get(p["name"]))
            if t is None:
                raise KeyError(f"param '{p['ckpt']}' ({p['name']}) is missing")
            return self.leaf(t, dt)
        if op == "const":
            v = self.scalar_value(n)
            if n["shape"]:
                return torch.full(self.sizes.shape(n["shape"]), v, dtype=self.tdtype(dt), device=self.device)
            return v
        if op in ("full", "zeros", "ones"):
            v = {"zeros": 0.0, "ones": 1.0}.get(op, fval(n, 0))
            v = int(v) if dt == "i32" else bool(v) if dt == "bool" else float(v)
            return torch.full(self.sizes.shape(n["shape"]), v, dtype=self.tdtype(dt), device=self.device)
        if op == "arange":
            return torch.arange(self.sizes.size(n["lo"]), dtype=self.tdtype(dt), device=self.device)

        # pointwise
        if op in UNARY:
            return UNARY[op](T(0))
        if op == "gelu":
            return F.gelu(T(0), approximate="tanh" if n["flag"] else "none")
        if op in BINARY:
            a, b = V(0), V(1)
            if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
                a = T(0)
            return BINARY[op](a, b)
        if op in ("maximum", "minimum"):
            a, b = V(0), V(1)
            if not isinstance(a, torch.Tensor):
                a = torch.full((), a, dtype=self.tdtype(self.nodes[ins[0]]["dtype"]), device=self.device)
            if not isinstance(b, torch.Tensor):
                b = torch.full((), b, dtype=self.tdtype(self.nodes[ins[1]]["dtype"]), device=self.device)
            return torch.maximum(a, b) if op == "maximum" else torch.minimum(a, b)
        if op == "pow":
            return torch.pow(T(0), float(fval(n, 0)))
        if op == "clamp":
            x = T(0)
            lo = fval(n, 0) if n["has_f"][0] else None
            hi = fval(n, 1) if n["has_f"][1] else None
            if not x.is_floating_point():
                lo = None if lo is None else int(lo)
                hi = None if hi is None else int(hi)
            return torch.clamp(x, min=lo, max=hi)
        if op == "where":
            c, a, b = T(0).bool(), V(1), V(2)
            if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
                a = T(1)
            return torch.where(c, a, b)
        if op == "cast":
            x = T(0)
            if dt in FLOAT_DTYPES:
                src = self.nodes[ins[0]]["dtype"]
                if x.requires_grad and self.compute != "model" and src in FLOAT_DTYPES:
                    return RoundCast.apply(x, DTYPES[dt], DTYPES[src])
                # round to the target dtype, then hold it in the compute dtype
                return x.to(DTYPES[dt]).to(self.tdtype(dt))
            return x.to(DTYPES[dt])
        if op == "dropout":
            return T(0)  # inference: identity

        # reductions
        if op in ("sum", "mean", "amax", "var", "logsumexp"):
            x = T(0)
            if x.dim() == 0:
                x = x.reshape(1)
                axes, keep = [0], False
            else:
                axes = [k for k in range(x.dim()) if (n["axes"] >> k) & 1]
                keep = bool(n["keepdim"])
            if op == "sum":
                return torch.sum(x, dim=axes, keepdim=keep)
            if op == "mean":
                return torch.mean(x, dim=axes, keepdim=keep)
            if op == "amax":
                return torch.amax(x, dim=axes, keepdim=keep)
            if op == "var":
                return torch.var(x, dim=axes, correction=fval(n, 0), keepdim=keep)
            return torch.logsumexp(x, dim=axes, keepdim=keep)

        # normalisation
        if op == "softmax":
            return F.softmax(T(0), dim=n["axis"])
        if op == "log_softmax":
            return F.log_softmax(T(0), dim=n["axis"])
        if op == "layer_norm":
            x = T(0)
            w = T(1) if len(ins) > 1 else None
            b = T(2) if len(ins) > 2 else None
            return F.layer_norm(x, (x.shape[-1],), w, b, eps=fval(n, 0))
        if op == "rms_norm":
            x = T(0)
            w = T(1) if len(ins) > 1 else None
            return F.rms_norm(x, (x.shape[-1],), w, eps=fval(n, 0))

        # shape
        if op == "reshape":
            return T(0).reshape(self.sizes.shape(n["shape"]))
        if op == "squeeze":
            return T(0).squeeze(n["axis"])
        if op == "unsqueeze":
            return T(0).unsqueeze(n["axis"])
        if op == "broadcast_to":
            return T(0).broadcast_to(self.sizes.shape(n["shape"]))
        if op == "transpose":
            return T(0).transpose(n["axis"], n["axis2"])
        if op == "permute":
            return T(0).permute(n["perm"])
        if op == "slice":
            lo, hi = self.sizes.size(n["lo"]), self.sizes.size(n["hi"])
            return T(0).narrow(n["axis"], lo, hi - lo)
        if op == "concat":
            return torch.cat([T(k) for k in range(len(ins))], dim=n["axis"])
        if op == "split":
            raise RuntimeError("torch_oracle: split should have been lowered to slices")

        # linear algebra
        if op == "matmul":
            return torch.matmul(T(0), T(1))
        if op == "linear":
            return F.linear(T(0), T(1), T(2) if len(ins) > 2 else None)

        # neural
        if op == "embedding":
            idx, tab = T(0), T(1)
            if self.check:
                V_ = tab.shape[0]
                bad = (idx < 0) | (idx >= V_)
                if bool(bad.any()):
                    raise ValueError(f"embedding '{n['name']}': index {int(idx[bad][0])} outside [0, {V_})")
            return F.embedding(idx.long(), tab)
        if op == "attention":
            q, k, v = T(0), T(1), T(2)
            bs = self.sizes.shape(n["shape"])[:-2]
            q = q.expand(*bs, *q.shape[-2:])
            k = k.expand(*bs, *k.shape[-2:])
            v = v.expand(*bs, *v.shape[-2:])
            scale = float(fval(n, 0)) if n["has_f"][0] else None
            Tq, Tk = q.shape[-2], k.shape[-2]
            if n["flag"] and Tq != Tk:
                # top-left aligned causal mask (torch.tril(ones(Tq, Tk))), explicit
                mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril()
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
            return F.scaled_dot_product_attention(q, k, v, is_causal=bool(n["flag"]), scale=scale)

        # losses
        if op == "cross_entropy":
            x, t = T(0), T(1)
            ii = int(n["ignore_index"])
            if self.check:
                C = x.shape[0] if x.dim() == 1 else x.shape[1]
                bad = (t != ii) & ((t < 0) | (t >= C))
                if bool(bad.any()):
                    raise ValueError(f"cross_entropy '{n['name']}': target {int(t[bad][0])} outside [0, {C})")
            return F.cross_entropy(x, t.long(), ignore_index=ii)
        if op == "mse_loss":
            a, b = T(0), T(1)
            a, b = torch.broadcast_tensors(a, b)
            return F.mse_loss(a, b)

        raise RuntimeError(f"torch_oracle: no rule for op '{op}' (node %{n['id']})")


def run_graph(graph, params, inputs, dims=None, device="cpu", compute="model", include_loss=False,
              check=True):
    """Evaluates the graph's forward pass. params: {ckpt or internal name:
    tensor}; inputs: {input name: tensor}; dims: {dim: value} (missing ones
    come from the inputs' shapes). Returns {output name: tensor} (plus the
    loss under its binding name with include_loss, when it is not an
    output)."""
    dims = resolve_dims(graph, inputs, dims)
    ev = Evaluator(graph, dims, device=device, compute=compute, check=check)
    want = {o["node"]: o["name"] for o in graph["outputs"]}
    extra = {}
    if include_loss and graph.get("loss", -1) >= 0 and graph["loss"] not in want:
        extra[graph["loss"]] = graph["nodes"][graph["loss"]]["name"] or "loss"
    with torch.inference_mode():
        vals = ev.run(params, inputs, set(want) | set(extra))
    out = {}
    for o in graph["outputs"]:
        out[o["name"]] = vals[o["node"]]
    for i, name in extra.items():
        out[name] = vals[i]
    return out


def run_grad(graph, params, inputs, dims=None, device="cpu", compute="model", allow_dropout=False, check=True):
    """The train loss and d loss / d param for every param, by torch.autograd
    over the node-by-node evaluation (each param a leaf tensor with
    requires_grad, in the compute dtype). Returns (loss, {checkpoint name:
    grad}), then d loss / d input under the input's name for every input the
    graph's "wrt" lists (train.wrt); a param or input the loss does not depend
    on (or a param of a non-floating dtype) gets zeros. Refuses a loss that depends on a dropout with p > 0 unless
    allow_dropout (see the module doc)."""
    if graph.get("loss", -1) < 0:
        raise ValueError(f"torch_oracle: model {graph.get('name')} has no train: loss to differentiate")
    bad = loss_dropouts(graph)
    if bad and not allow_dropout:
        n = bad[0]
        raise ValueError(f"torch_oracle: the loss depends on dropout '{n['name']}' (line {n['line']}, p = "
                         f"{fval(n, 0)}): the oracle evaluates dropout as the identity (eval semantics), which a "
                         f"training step with dropout masks does not compute; pass --allow-dropout to evaluate "
                         f"it so anyway")
    dims = resolve_dims(graph, inputs, dims)
    ev = Evaluator(graph, dims, device=device, compute=compute, check=check)
    leaves = {}
    for p in graph["params"]:
        t = params.get(p["ckpt"], params.get(p["name"]))
        if t is None:
            raise KeyError(f"param '{p['ckpt']}' ({p['name']}) is missing")
        t = ev.leaf(t, p["dtype"]).detach().clone()
        if t.is_floating_point():
            t.requires_grad_(True)
        leaves[p["ckpt"]] = t
    inputs = dict(inputs)
    itype = {i["name"]: i["dtype"] for i in graph["inputs"]}
    wrt = {w: ev.leaf(inputs[w], itype[w]).detach().clone().requires_grad_(True) for w in graph.get("wrt", [])}
    inputs.update(wrt)
    lid = graph["loss"]
    with torch.enable_grad():
        loss = ev.run(leaves, inputs, {lid})[lid]
        diff = [(k, v) for k, v in leaves.items() if v.requires_grad] + [("input." + k, v) for k, v in wrt.items()]
        gs = [None] * len(diff)
        if diff and loss.requires_grad:
            gs = torch.autograd.grad(loss, [v for _, v in diff], allow_unused=True)
    grads = {k: g for (k, _), g in zip(diff, gs)}
    out = {}
    for p in graph["params"]:
        g = grads.get(p["ckpt"])
        out[p["ckpt"]] = torch.zeros_like(leaves[p["ckpt"]]).detach() if g is None else g.detach()
    for k, v in wrt.items():
        g = grads.get("input." + k)
        out[k] = torch.zeros_like(v).detach() if g is None else g.detach()
    return loss.detach(), out


def make_forward(graph, params, dims, device="cuda", compute="model", example_inputs=None):
    """A function of the inputs (positional, in the graph's input order)
    returning the outputs (a tuple, in output order) over fixed params,
    without the checks: for timing in eager mode or under torch.compile.

    With example_inputs ({name: tensor} on the device) the evaluator is traced
    once with make_fx into a straight-line FX graph of aten ops (params become
    constants), so that neither eager timing nor torch.compile sees the
    interpreter loop (dynamo would otherwise break the graph at every node
    and hit its recompile limit); falls back to the plain evaluator when the
    trace fails. Returns (fn, input names, output names, traced?)."""
    ev = Evaluator(graph, dims, device=device, compute=compute, check=False)
    want = [o["node"] for o in graph["outputs"]]
    in_names = [i["name"] for i in graph["inputs"]]
    out_names = [o["name"] for o in graph["outputs"]]
    pdev = {k: v.to(device) for k, v in params.items()}

    def forward(*xs):
        vals = ev.run(pdev, dict(zip(in_names, xs)), set(want))
        return tuple(vals[i] for i in want)

    if example_inputs is None:
        return forward, in_names, out_names, False
    try:
        from torch.fx.experimental.proxy_tensor import make_fx
        with torch.no_grad():
            gm = make_fx(forward)(*[example_inputs[k] for k in in_names])
        return gm, in_names, out_names, True
    except Exception as e:  # noqa: BLE001
        print(f"torch_oracle: make_fx trace failed ({type(e).__name__}: {e}); timing the evaluator",
              file=sys.stderr)
        return forward, in_names, out_names, False


def set_precise_defaults():
    """f32 matmuls in full f32 (no TF32), whatever the environment set."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", required=True, help="tgen check --json output")
    ap.add_argument("--params", required=True, help="params safetensors (checkpoint names)")
    ap.add_argument("--inputs", required=True, help="inputs safetensors (input names)")
    ap.add_argument("--out", required=True, help="where to write the outputs (safetensors)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--compute", default="model", choices=["model", "f64", "f32"])
    ap.add_argument("--dims", default="", help="dynamic dims, B=2,T=64")
    ap.add_argument("--with-loss", action="store_true", help="also write the train loss (its binding name)")
    ap.add_argument("--grad", action="store_true",
                    help="write the train loss and grad.<checkpoint name> for every param instead of the outputs")
    ap.add_argument("--allow-dropout", action="store_true",
                    help="--grad: evaluate a dropout the loss depends on as the identity instead of refusing")
    a = ap.parse_args(argv)
    set_precise_defaults()
    g = load_graph(a.graph)
    if a.grad:
        try:
            loss, grads = run_grad(g, st_load(a.params), st_load(a.inputs), parse_dims(a.dims), device=a.device,
                                   compute=a.compute, allow_dropout=a.allow_dropout)
        except (KeyError, ValueError) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            print(msg if msg.startswith("torch_oracle:") else f"torch_oracle: {msg}", file=sys.stderr)
            return 1
        outs = {loss_name(g): loss}
        outs.update({f"grad.{k}": v for k, v in grads.items()})
    else:
        outs = run_graph(g, st_load(a.params), st_load(a.inputs), parse_dims(a.dims), device=a.device,
                         compute=a.compute, include_loss=a.with_loss)
    st_save(a.out, outs)
    for k, v in outs.items():
        print(f"{k}: {str(v.dtype).replace('torch.', '')}{list(v.shape)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
