#!/usr/bin/env python3
"""jax_oracle.py: an independent JAX evaluation of a tgen graph, forward and
gradients.

Reads the graph IR that `tgen check --json MODEL.yaml` prints, evaluates the
forward pass node by node with jax.numpy / jax.nn (PyTorch's semantics,
written out where JAX's differ), and with --grad differentiates the train
loss with respect to every param with JAX's own autodiff (jax.value_and_grad
over that evaluation): nothing of tgen's autodiff (gen/autodiff.c) is used.
It mirrors tests/gpu/torch_oracle.py op by op, so the two oracles check each
other; this one needs no PyTorch (CI installs `jax` on the CPU).

    python3 jax_oracle.py --graph G.json --params P.safetensors \\
        --inputs I.safetensors --out O.safetensors [--grad] \\
        [--compute f64|model] [--dims B=2,T=8] [--with-loss] [--allow-dropout] \\
        [--device cpu|gpu] [--eager]

  --grad           write the loss (under its binding name, the JSON's
                   "loss_name") and grad.<checkpoint name> = d loss / d param
                   for every param, instead of the outputs
  --compute f64    every floating tensor in float64 (default): a
                   high-precision reference; `cast` to a floating dtype still
                   rounds to that dtype, as tgen's reference interpreter does,
                   and its gradient is rounded to the operand's dtype (the
                   backward of a cast is a cast back, as in gen/autodiff.c)
  --compute model  every tensor in its own dtype (f32 / bf16 / f16 / i32 /
                   bool); bf16 / f16 matmuls, reductions, norms, softmax,
                   attention and losses accumulate in f32
  --with-loss      (without --grad) also write the train loss

Written tensors are in the compute dtype: float64 with --compute f64, the
node's (the param's, for a gradient) dtype with --compute model.

Dropout: evaluated as the identity (eval semantics), as torch_oracle.py does.
tgen's emitted training step applies dropout masks that no independent oracle
can reproduce, so --grad and --with-loss refuse a graph whose loss depends on
a dropout with p > 0; --allow-dropout evaluates such a dropout as the
identity anyway (what `tgen eval --grad` computes: its interpreter runs with
dropout inactive).

Where PyTorch and JAX pick different derivatives at a kink, the oracle takes
PyTorch's: abs'(0) = 0 (JAX's own is 1), relu'(0) = 0, clamp passes the
gradient for min <= x <= max, maximum/minimum split ties in half, amax
shares ties evenly. The evaluation is one jax.jit-compiled program (--eager:
op by op); index and target checks run on the values afterwards. XLA may not
drop casts as "excess precision" (XLA_FLAGS gets
--xla_allow_excess_precision=false), so casts round on GPUs too.

Params are looked up by their checkpoint name ("ckpt" in the JSON), falling
back to the internal name; inputs by input name. Dynamic dims come from
--dims, else from the inputs' shapes (a size that is a bare dim name), else 1.

As a module:

    import jax_oracle as J
    g = J.load_graph("G.json")
    outs = J.run_graph(g, J.st_load("P.safetensors"), J.st_load("I.safetensors"))
    loss, grads = J.run_grad(g, params, inputs, dims={"B": 4})

Safetensors files are read and written by the small reader/writer below
(json + struct + numpy; bf16 through ml_dtypes, which JAX depends on).
Exit status: 0 success, 1 a refused graph or bad files, 2 bad usage.
"""
import argparse
import functools
import json
import math
import os
import re
import struct
import sys

import numpy as np

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - jax always brings it
    ml_dtypes = None

# Casts must round: XLA may otherwise drop a narrowing convert pair
# (f64 -> bf16 -> f64) as "excess precision", which it does on GPUs.
if "xla_allow_excess_precision" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_allow_excess_precision=false").strip()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_default_matmul_precision", "highest")
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

# ---------------------------------------------------------------- dtypes

BF16 = np.dtype(ml_dtypes.bfloat16) if ml_dtypes else None
DTYPES = {"f32": np.dtype(np.float32), "bf16": BF16, "f16": np.dtype(np.float16), "i32": np.dtype(np.int32),
          "bool": np.dtype(np.bool_)}
FLOAT_DTYPES = ("f32", "bf16", "f16")
HALF = tuple(d for d in (BF16, np.dtype(np.float16)) if d is not None)

# ---------------------------------------------------------------- safetensors

_ST_TO_NP = {"F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
             "I64": np.dtype(np.int64), "I32": np.dtype(np.int32), "I16": np.dtype(np.int16),
             "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_)}
if BF16 is not None:
    _ST_TO_NP["BF16"] = BF16
_NP_TO_ST = {v: k for k, v in _ST_TO_NP.items()}


def st_load(path):
    """{name: numpy array} from a safetensors file (little-endian data)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    hdr = json.loads(data[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, d in hdr.items():
        if name == "__metadata__":
            continue
        if d["dtype"] not in _ST_TO_NP:
            raise ValueError(f"{path}: tensor '{name}': unsupported dtype {d['dtype']}")
        dt = _ST_TO_NP[d["dtype"]]  # hosts are little-endian, as the runtime assumes
        shape = [int(s) for s in d["shape"]]
        b, e = d["data_offsets"]
        numel = math.prod(shape)
        if e - b != numel * dt.itemsize or b < 0 or base + e > len(data):
            raise ValueError(f"{path}: tensor '{name}': data_offsets {b},{e} do not match {d['dtype']}{shape}")
        out[name] = np.frombuffer(data, dtype=dt, count=numel, offset=base + b).reshape(shape).copy()
    return out


def st_save(path, tensors, metadata=None):
    """Writes {name: array} as safetensors (atomically: PATH.tmp.PID, then
    rename), in the given order, header padded to a multiple of 8."""
    hdr, blobs, off = {}, [], 0
    if metadata:
        hdr["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        a = np.asarray(t, order="C")  # (ascontiguousarray would make a scalar 1-D)
        if a.dtype not in _NP_TO_ST:
            raise ValueError(f"tensor '{name}': dtype {a.dtype} has no safetensors code")
        raw = a.tobytes()
        hdr[name] = {"dtype": _NP_TO_ST[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(hdr, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for bl in blobs:
            f.write(bl)
    os.replace(tmp, path)

# ---------------------------------------------------------------- sizes (as torch_oracle.py)

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
    """Evaluates the JSON's sizes for given values of the dynamic dims
    (derived quotients such as "(B*T)/(12)" are replaced by their values)."""

    def __init__(self, graph, dims):
        self.env = {}
        for s in graph["syms"]:
            if s["derived"]:
                continue
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


def resolve_dims(graph, inputs=None, dims=None, quiet=False):
    """Values of the dynamic dims: `dims` first, then the input tensors' sizes
    where the declared size is a bare dim name, else 1 (as the runner does)."""
    out = dict(dims or {})
    names = {s["name"] for s in graph["syms"] if not s["derived"]}
    for inp in graph["inputs"]:
        t = (inputs or {}).get(inp["name"])
        if t is None:
            continue
        for k, d in enumerate(inp["shape"]):
            if isinstance(d, str) and d in names and d not in out and k < np.ndim(t):
                out[d] = int(np.shape(t)[k])
    for n in sorted(names):
        if n not in out:
            if not quiet:
                print(f"jax_oracle: dynamic dim {n} not given and not in an input shape: using 1", file=sys.stderr)
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


def load_graph(path):
    with open(path) as f:
        return json.load(f)


def fval(n, k):
    """n["f"][k] as a float (the JSON spells NaN and infinities as strings)."""
    v = n["f"][k]
    return float(v) if isinstance(v, str) else v


def loss_name(graph):
    """The loss's binding name: the JSON's loss_name (tgen >= this file), else
    the loss node's name."""
    if graph.get("loss_name"):
        return graph["loss_name"]
    return graph["nodes"][graph["loss"]]["name"] or "loss"


def loss_dropouts(graph):
    """Dropout nodes with p > 0 that the loss depends on."""
    nodes, seen, stack, out = graph["nodes"], set(), [graph["loss"]], []
    while stack:
        i = stack.pop()
        if i < 0 or i in seen:
            continue
        seen.add(i)
        n = nodes[i]
        if n["op"] == "dropout" and fval(n, 0) > 0:
            out.append(n)
        stack.extend(n["in"])
    return sorted(out, key=lambda n: n["id"])


def refuse_dropout(graph, allow, who="jax_oracle"):
    """Raises when the loss depends on an active dropout, unless allowed."""
    bad = loss_dropouts(graph)
    if bad and not allow:
        n = bad[0]
        raise RefusedGraph(f"{who}: the loss depends on dropout '{n['name']}' (line {n['line']}, p = {fval(n, 0)}): "
                           f"the oracle evaluates dropout as the identity (eval semantics), which a training "
                           f"step with dropout masks does not compute; pass --allow-dropout to evaluate it so "
                           f"anyway (tgen eval --grad runs with dropout inactive too)")


class RefusedGraph(Exception):
    pass

# ---------------------------------------------------------------- evaluation


@jax.custom_jvp
def _abs_f(x):
    return jnp.abs(x)


@_abs_f.defjvp
def _abs_f_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return jnp.abs(x), jnp.sign(x) * t  # torch.abs: sgn(x), 0 at 0 (JAX's own gives 1 at 0)


def _abs(x):
    return _abs_f(x) if jnp.issubdtype(x.dtype, jnp.floating) else jnp.abs(x)


def _relu(x):
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jax.nn.relu(x)  # gradient 0 at 0, NaN stays NaN: torch.relu
    return jnp.maximum(x, jnp.zeros((), x.dtype))


UNARY = {
    "neg": jnp.negative, "abs": _abs, "exp": jnp.exp, "log": jnp.log, "sqrt": jnp.sqrt,
    "rsqrt": lax.rsqrt, "sin": jnp.sin, "cos": jnp.cos, "tanh": jnp.tanh, "sigmoid": jax.nn.sigmoid,
    "relu": _relu, "silu": jax.nn.silu, "erf": lax.erf, "square": jnp.square, "reciprocal": jnp.reciprocal,
}
# Binary ops; a Python scalar on either side is weakly typed (it does not
# decide the result dtype), as a Python number is in torch.
BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
}


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def round_cast(x, to_dt, from_dt):
    """cast in --compute f64: x (held in float64) rounded through to_dt, held
    in float64 again; the gradient rounded to from_dt, the operand's dtype (a
    cast back, as gen/autodiff.c's rule; none when the dtypes agree)."""
    return _round_to(x, to_dt)


def _round_to(x, dt):
    """x rounded to dt and held in x's dtype again; bf16 / f16 via f32, as
    tgen's round_to_dtype (gen/init.c) does."""
    if dt in HALF:
        return x.astype(np.float32).astype(dt).astype(x.dtype)
    return x.astype(dt).astype(x.dtype)


def _round_cast_fwd(x, to_dt, from_dt):
    return round_cast(x, to_dt, from_dt), None


def _round_cast_bwd(to_dt, from_dt, _res, g):
    return (g if to_dt == from_dt else _round_to(g, from_dt),)


round_cast.defvjp(_round_cast_fwd, _round_cast_bwd)


def _concrete(x):
    """x as a numpy array when its value is known (not a tracer), else None."""
    try:
        return np.asarray(x)
    except Exception:  # noqa: BLE001 - a tracer: the check is skipped
        return None


def validate_index(meta, c):
    """Raises when an index or target array holds a value outside [0, bound)."""
    op, name, what, bound, ignore = meta
    c = np.asarray(c)
    bad = (c < 0) | (c >= bound)
    if ignore is not None:
        bad &= c != ignore
    if bad.any():
        raise ValueError(f"{op} '{name}': {what} {int(c[bad][0])} outside [0, {bound})")


def _is_array(v):
    return isinstance(v, (jax.Array, np.ndarray))


class Evaluator:
    """Evaluates a graph with JAX ops. compute: 'f64' (every floating tensor
    in float64; casts round through their target dtype) or 'model' (each
    tensor in its own dtype). check: validate shapes, indices and targets."""

    def __init__(self, graph, dims, compute="f64", check=True):
        self.g = graph
        self.nodes = graph["nodes"]
        self.sizes = Sizes(graph, dims)
        if compute not in ("model", "f64"):
            raise ValueError(f"compute must be f64 or model, not {compute!r}")
        self.compute = compute
        self.check = check
        self.input_of = {i["node"]: i for i in graph["inputs"]}
        self.param_of = {p["node"]: p for p in graph["params"]}
        self.last_use = {}
        for n in self.nodes:
            for i in n["in"]:
                if i >= 0:
                    self.last_use[i] = n["id"]
        self.keep = {o["node"] for o in graph["outputs"]}
        if graph.get("loss", -1) >= 0:
            self.keep.add(graph["loss"])
        self.pending = []

    def check_index(self, n, what, idx, bound, ignore):
        """Indices must lie in [0, bound) (or equal `ignore`): checked now when
        idx is concrete, else (under jit) recorded in self.pending, for
        validate() once the values are known."""
        if not self.check:
            return
        c = _concrete(idx)
        if c is None:
            self.pending.append(((n["op"], n["name"], what, bound, ignore), idx))
        else:
            validate_index((n["op"], n["name"], what, bound, ignore), c)

    def tdtype(self, dt):
        """The dtype a node of dtype `dt` is held in."""
        if dt in FLOAT_DTYPES and self.compute == "f64":
            return np.dtype(np.float64)
        return DTYPES[dt]

    def acc(self, x):
        """bf16 / f16 values widened to f32 for accumulating ops (model mode)."""
        return x.astype(np.float32) if _is_array(x) and x.dtype in HALF else x

    def run(self, params, inputs, want):
        """Values of the node ids in `want` ({id: array})."""
        vals = {}
        for n in self.nodes:
            i = n["id"]
            v = self.node(n, vals, params, inputs)
            if not _is_array(v) and n["op"] != "const":
                v = jnp.asarray(v, dtype=self.tdtype(n["dtype"]))
            if _is_array(v):
                want_dt = self.tdtype(n["dtype"])
                if v.dtype != want_dt:
                    v = v.astype(want_dt)
                if self.check:
                    shape = self.sizes.shape(n["shape"])
                    if list(v.shape) != shape:
                        raise RuntimeError(f"jax_oracle: node %{i} {n['op']} '{n['name']}' (line {n['line']}): "
                                           f"result shape {list(v.shape)}, the graph says {shape}")
            vals[i] = v
            for j in set(n["in"]):
                if j >= 0 and self.last_use.get(j) == i and j not in want and j not in self.keep:
                    del vals[j]
        return {i: self.materialize(vals[i], self.nodes[i]) for i in want}

    def materialize(self, v, n):
        if _is_array(v):
            return v
        return jnp.full(self.sizes.shape(n["shape"]), v, dtype=self.tdtype(n["dtype"]))

    def scalar_value(self, n):
        """A const node's value as a Python number of its dtype's kind."""
        v = self.sizes.size(n["lo"]) if n["is_dimval"] else fval(n, 0)
        if n["dtype"] == "i32":
            return int(v)
        if n["dtype"] == "bool":
            return bool(v)
        return float(v)

    def node(self, n, vals, params, inputs):
        op, ins, dt = n["op"], n["in"], n["dtype"]

        def T(k):  # operand k as an array
            j = ins[k]
            if j < 0:
                return None
            v = vals[j]
            return v if _is_array(v) else self.materialize(v, self.nodes[j])

        def V(k):  # operand k as an array or a Python scalar (const)
            return vals[ins[k]]

        def full(v):
            return jnp.full(self.sizes.shape(n["shape"]), v, dtype=self.tdtype(dt))

        if op == "input":
            name = self.input_of[n["id"]]["name"]
            if name not in inputs:
                raise KeyError(f"input '{name}' is missing")
            return jnp.asarray(inputs[name]).astype(self.tdtype(dt))
        if op == "param":
            p = self.param_of[n["id"]]
            t = params.get(p["ckpt"], params.get(p["name"]))
            if t is None:
                raise KeyError(f"param '{p['ckpt']}' ({p['name']}) is missing")
            t = jnp.asarray(t)
            return t if t.dtype == self.tdtype(dt) else t.astype(self.tdtype(dt))
        if op == "const":
            v = self.scalar_value(n)
            return full(v) if n["shape"] else v
        if op in ("full", "zeros", "ones"):
            v = {"zeros": 0.0, "ones": 1.0}.get(op, fval(n, 0))
            return full(int(v) if dt == "i32" else bool(v) if dt == "bool" else float(v))
        if op == "arange":
            return jnp.arange(self.sizes.size(n["lo"]), dtype=self.tdtype(dt))

        # pointwise
        if op in UNARY:
            return UNARY[op](T(0))
        if op == "gelu":  # 'none': x/2 (1 + erf(x/sqrt 2)); 'tanh': torch's tanh formula
            return jax.nn.gelu(T(0), approximate=bool(n["flag"]))
        if op in BINARY:
            a, b = V(0), V(1)
            if not _is_array(a) and not _is_array(b):
                a = T(0)
            return BINARY[op](a, b)
        if op in ("maximum", "minimum"):  # ties split the gradient in half, as torch
            a, b = V(0), V(1)
            if not _is_array(a) and not _is_array(b):
                a = T(0)
            return jnp.maximum(a, b) if op == "maximum" else jnp.minimum(a, b)
        if op == "pow":
            p = float(fval(n, 0))
            if p.is_integer() and abs(p) <= 64:
                return lax.integer_pow(T(0), int(p))
            return jnp.power(T(0), p)
        if op == "clamp":
            # torch.clamp: NaN stays NaN; the gradient passes where lo <= x <= hi
            x = T(0)
            lo = fval(n, 0) if n["has_f"][0] else None
            hi = fval(n, 1) if n["has_f"][1] else None
            if not jnp.issubdtype(x.dtype, jnp.floating):
                lo = None if lo is None else int(lo)
                hi = None if hi is None else int(hi)
                return jnp.clip(x, lo, hi)
            inside = jnp.ones(x.shape, bool)
            if lo is not None:
                inside = inside & (x >= lo)
            if hi is not None:
                inside = inside & (x <= hi)
            return jnp.where(inside, x, lax.stop_gradient(jnp.clip(x, lo, hi)))
        if op == "where":
            c, a, b = T(0).astype(bool), V(1), V(2)
            if not _is_array(a) and not _is_array(b):
                a = T(1)
            return jnp.where(c, a, b)
        if op == "cast":
            x = T(0)
            src = self.nodes[ins[0]]["dtype"]
            if dt in FLOAT_DTYPES:
                if self.compute == "f64" and src in FLOAT_DTYPES:
                    return round_cast(x, DTYPES[dt], DTYPES[src])
                return x.astype(DTYPES[dt]).astype(self.tdtype(dt))
            if dt == "bool":
                return x != 0
            return x.astype(DTYPES[dt])  # to i32: truncates toward zero
        if op == "dropout":
            return T(0)  # eval semantics: identity (see the module doc)

        # reductions
        if op in ("sum", "mean", "amax", "var", "logsumexp"):
            x = T(0)
            if x.ndim == 0:
                x = x.reshape(1)
                axes, keep = (0,), False
            else:
                axes = tuple(k for k in range(x.ndim) if (n["axes"] >> k) & 1)
                keep = bool(n["keepdim"])
            if op == "sum":
                return jnp.sum(self.acc(x), axis=axes, keepdims=keep)
            if op == "mean":
                return jnp.mean(self.acc(x), axis=axes, keepdims=keep)
            if op == "amax":  # ties share the gradient evenly, as torch.amax
                return jnp.max(x, axis=axes, keepdims=keep)
            if op == "var":  # sum (x - mean)^2 / max(0, N - correction)
                xf = self.acc(x)
                cnt = math.prod(x.shape[k] for k in axes)
                mu = jnp.mean(xf, axis=axes, keepdims=True)
                return jnp.sum(jnp.square(xf - mu), axis=axes, keepdims=keep) / max(0.0, cnt - fval(n, 0))
            return jax.nn.logsumexp(self.acc(x), axis=axes, keepdims=keep)

        # normalisation
        if op == "softmax":
            return jax.nn.softmax(self.acc(T(0)), axis=n["axis"])
        if op == "log_softmax":
            return jax.nn.log_softmax(self.acc(T(0)), axis=n["axis"])
        if op == "layer_norm":  # biased variance over the last dim, eps inside the sqrt
            x = T(0)
            w = T(1) if len(ins) > 1 else None
            b = T(2) if len(ins) > 2 else None
            xf = self.acc(x)
            mu = jnp.mean(xf, axis=-1, keepdims=True)
            var = jnp.mean(jnp.square(xf - mu), axis=-1, keepdims=True)
            y = ((xf - mu) * lax.rsqrt(var + fval(n, 0))).astype(x.dtype)
            if w is not None:
                y = y * w
            if b is not None:
                y = y + b
            return y
        if op == "rms_norm":
            x = T(0)
            w = T(1) if len(ins) > 1 else None
            xf = self.acc(x)
            y = (xf * lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + fval(n, 0))).astype(x.dtype)
            return y * w if w is not None else y

        # shape
        if op == "reshape":
            return jnp.reshape(T(0), self.sizes.shape(n["shape"]))
        if op == "squeeze":
            return jnp.squeeze(T(0), axis=n["axis"])
        if op == "unsqueeze":
            return jnp.expand_dims(T(0), n["axis"])
        if op == "broadcast_to":
            return jnp.broadcast_to(T(0), self.sizes.shape(n["shape"]))
        if op == "transpose":
            return jnp.swapaxes(T(0), n["axis"], n["axis2"])
        if op == "permute":
            return jnp.transpose(T(0), n["perm"])
        if op == "slice":
            lo, hi = self.sizes.size(n["lo"]), self.sizes.size(n["hi"])
            return lax.slice_in_dim(T(0), lo, hi, axis=n["axis"])
        if op == "concat":
            return jnp.concatenate([T(k) for k in range(len(ins))], axis=n["axis"])
        if op == "split":
            raise RuntimeError("jax_oracle: split should have been lowered to slices")

        # linear algebra (torch.matmul semantics, 1-D operands included)
        if op == "matmul":
            a, b = T(0), T(1)
            return jnp.matmul(self.acc(a), self.acc(b))
        if op == "linear":  # x @ w^T + b, w [out, in]
            x, w = T(0), T(1)
            y = jnp.matmul(self.acc(x), jnp.swapaxes(self.acc(w), -1, -2))
            if len(ins) > 2 and ins[2] >= 0:
                y = (y.astype(x.dtype) if x.dtype in HALF else y) + T(2)
            return y

        # neural
        if op == "embedding":
            idx, tab = T(0), T(1)
            self.check_index(n, "index", idx, tab.shape[0], None)
            return jnp.take(tab, idx.astype(np.int32), axis=0)
        if op == "attention":
            # softmax(q k^T scale + causal mask) v, mask top-left aligned (tril)
            q, k, v = T(0), T(1), T(2)
            bs = self.sizes.shape(n["shape"])[:-2]
            q = jnp.broadcast_to(q, (*bs, *q.shape[-2:]))
            k = jnp.broadcast_to(k, (*bs, *k.shape[-2:]))
            v = jnp.broadcast_to(v, (*bs, *v.shape[-2:]))
            scale = float(fval(n, 0)) if n["has_f"][0] else 1.0 / math.sqrt(q.shape[-1])
            s = jnp.matmul(self.acc(q), jnp.swapaxes(self.acc(k), -1, -2)) * scale
            if n["flag"]:
                mask = jnp.tril(jnp.ones((q.shape[-2], k.shape[-2]), bool))
                s = jnp.where(mask, s, -jnp.inf)
            p = jax.nn.softmax(s, axis=-1)
            return jnp.matmul(p, self.acc(v))

        # losses
        if op == "cross_entropy":
            # mean over the rows whose target is not ignore_index of
            # logsumexp(logits) - logits[target]; classes along dim 1 ([N, C, ...]) or dim 0 ([C])
            x, t = self.acc(T(0)), T(1)
            ii = int(n["ignore_index"])
            C = x.shape[0] if x.ndim == 1 else x.shape[1]
            self.check_index(n, "target", t, C, ii)
            if x.ndim == 1:
                x, t = x[None], jnp.reshape(t, (1,))
            valid = t != ii
            tc = jnp.where(valid, t, 0).astype(np.int32)
            picked = jnp.squeeze(jnp.take_along_axis(x, jnp.expand_dims(tc, 1), axis=1), 1)
            nll = jnp.where(valid, jax.nn.logsumexp(x, axis=1) - picked, 0)
            return jnp.sum(nll) / jnp.sum(valid).astype(x.dtype)
        if op == "mse_loss":
            a, b = jnp.broadcast_arrays(self.acc(T(0)), self.acc(T(1)))
            return jnp.mean(jnp.square(a - b))

        raise RuntimeError(f"jax_oracle: no rule for op '{op}' (node %{n['id']})")


def _leaves(graph, params, ev):
    """The params as arrays in the compute dtype, by checkpoint name."""
    out = {}
    for p in graph["params"]:
        t = params.get(p["ckpt"], params.get(p["name"]))
        if t is None:
            raise KeyError(f"param '{p['ckpt']}' ({p['name']}) is missing")
        want = tuple(ev.sizes.shape(p["shape"]))
        if tuple(np.shape(t)) != want:
            raise ValueError(f"param '{p['ckpt']}': shape {list(np.shape(t))}, the graph says {list(want)}")
        out[p["ckpt"]] = jnp.asarray(t).astype(ev.tdtype(p["dtype"]))
    return out


def _traced(ev, want):
    """f(params, fixed, inputs) -> ({id: value}, [index arrays to validate]),
    for jax.jit: the whole evaluation is one compiled program (eager JAX
    would compile every op on its own). The checks that need values are
    returned and done by validate() afterwards; meta holds what they check."""
    meta = []

    def f(ps, fixed, inputs):
        ev.pending = []
        vals = ev.run({**fixed, **ps}, inputs, want)
        meta[:] = [m for m, _ in ev.pending]
        return vals, [x for _, x in ev.pending]

    return f, meta


def validate(meta, aux):
    for m, x in zip(meta, aux):
        validate_index(m, x)


def run_graph(graph, params, inputs, dims=None, compute="f64", include_loss=False, allow_dropout=False,
              check=True, jit=True):
    """The forward pass: {output name: array} (plus the loss under its binding
    name with include_loss, when it is not an output)."""
    dims = resolve_dims(graph, inputs, dims)
    ev = Evaluator(graph, dims, compute=compute, check=check)
    want = {o["node"]: o["name"] for o in graph["outputs"]}
    extra = {}
    if include_loss and graph.get("loss", -1) >= 0:
        refuse_dropout(graph, allow_dropout)
        if graph["loss"] not in want:
            extra[graph["loss"]] = loss_name(graph)
    f, meta = _traced(ev, set(want) | set(extra))
    inputs = {k: jnp.asarray(v) for k, v in inputs.items()}
    vals, aux = (jax.jit(f) if jit else f)(_leaves(graph, params, ev), {}, inputs)
    validate(meta, aux)
    out = {o["name"]: vals[o["node"]] for o in graph["outputs"]}
    for i, name in extra.items():
        out[name] = vals[i]
    return out


def run_grad(graph, params, inputs, dims=None, compute="f64", allow_dropout=False, check=True, jit=True):
    """The loss and d loss / d param for every param, with jax.value_and_grad
    over the node-by-node evaluation. Returns (loss, {checkpoint name: grad}),
    then d loss / d input for every input the graph's "wrt" lists (train.wrt),
    under the input's name. Params of a non-floating dtype get a zero gradient."""
    if graph.get("loss", -1) < 0:
        raise RefusedGraph(f"jax_oracle: model {graph.get('name')} has no train: loss to differentiate")
    refuse_dropout(graph, allow_dropout)
    dims = resolve_dims(graph, inputs, dims)
    ev = Evaluator(graph, dims, compute=compute, check=check)
    leaves = _leaves(graph, params, ev)
    diff = {k: v for k, v in leaves.items() if jnp.issubdtype(v.dtype, jnp.floating)}
    fixed = {k: v for k, v in leaves.items() if k not in diff}
    loss_id = graph["loss"]
    inputs = {k: jnp.asarray(v) for k, v in inputs.items()}
    itype = {i["name"]: i["dtype"] for i in graph["inputs"]}  # a wrt input in the compute dtype, as params are
    wrt = {k: v.astype(ev.tdtype(itype[k])) for k, v in inputs.items() if k in graph.get("wrt", [])}
    rest = {k: v for k, v in inputs.items() if k not in wrt}
    f, meta = _traced(ev, {loss_id})

    def loss_fn(ps, fx, ins, wins):
        vals, aux = f(ps, fx, {**ins, **wins})
        return vals[loss_id], aux

    vg = jax.value_and_grad(loss_fn, argnums=(0, 3), has_aux=True)
    (loss, aux), (grads, igrads) = (jax.jit(vg) if jit else vg)(diff, fixed, rest, wrt)
    validate(meta, aux)
    for k, v in fixed.items():
        grads[k] = jnp.zeros_like(v)
    out = {p["ckpt"]: grads[p["ckpt"]] for p in graph["params"]}
    out.update({k: igrads[k] for k in graph.get("wrt", [])})
    return loss, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", required=True, help="tgen check --json output")
    ap.add_argument("--params", required=True, help="params safetensors (checkpoint names)")
    ap.add_argument("--inputs", required=True, help="inputs safetensors (input names)")
    ap.add_argument("--out", required=True, help="where to write the results (safetensors)")
    ap.add_argument("--compute", default="f64", choices=["f64", "model"])
    ap.add_argument("--dims", default="", help="dynamic dims, B=2,T=64")
    ap.add_argument("--grad", action="store_true", help="write the loss and grad.<ckpt> for every param")
    ap.add_argument("--with-loss", action="store_true", help="(forward) also write the train loss")
    ap.add_argument("--allow-dropout", action="store_true",
                    help="evaluate a dropout the loss depends on as the identity instead of refusing")
    ap.add_argument("--device", choices=["cpu", "gpu"], help="JAX platform (default: JAX's default)")
    ap.add_argument("--eager", action="store_true", help="op by op, without jax.jit (slower; for debugging)")
    a = ap.parse_args(argv)
    if a.device:
        jax.config.update("jax_platforms", a.device if a.device == "cpu" else "cuda")
    try:
        g = load_graph(a.graph)
        params, inputs = st_load(a.params), st_load(a.inputs)
        dims = parse_dims(a.dims)
    except (OSError, ValueError) as e:
        print(f"jax_oracle: {e}", file=sys.stderr)
        return 1
    try:
        if a.grad:
            loss, grads = run_grad(g, params, inputs, dims, compute=a.compute, allow_dropout=a.allow_dropout,
                                   jit=not a.eager)
            outs = {loss_name(g): loss}
            outs.update({f"grad.{k}": v for k, v in grads.items()})
        else:
            outs = run_graph(g, params, inputs, dims, compute=a.compute, include_loss=a.with_loss,
                             allow_dropout=a.allow_dropout, jit=not a.eager)
    except (RefusedGraph, KeyError, ValueError, RuntimeError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(msg if msg.startswith("jax_oracle:") else f"jax_oracle: {msg}", file=sys.stderr)
        return 1
    outs = {k: np.asarray(v) for k, v in outs.items()}
    st_save(a.out, outs)
    for k, v in outs.items():
        print(f"{k}: {v.dtype}{list(v.shape)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
