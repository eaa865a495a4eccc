#!/usr/bin/env python3
"""Regenerates the golden safetensors files read by tests/unit/test_safetensors.c.

Written by Hugging Face's own `safetensors` package (pip install safetensors
numpy), so the C reader is checked against the reference writer and the C
writer's bytes against the reference's. The values follow the formulas in
test_safetensors.c (golden_value); run from the repository root:

    python3 tests/data/make_st_golden.py
"""
import numpy as np
from safetensors import TensorSpec, serialize

OUT = "tests/data/"


def f32(v):
    return np.array(v, dtype="<f4")


def bf16(v):  # the values are exact in bf16: keep the top half of the f32 bits
    return (f32(v).view("<u4") >> 16).astype("<u2")


# name, dtype (safetensors' Python name), shape; element i of tensor k is
# golden_value(dtype, i) below.
TENSORS = [
    ("f32.r2", "float32", [2, 3]),
    ("f32.r0", "float32", []),
    ("bf16.r1", "bfloat16", [5]),
    ("f16.r8", "float16", [1, 2, 1, 2, 1, 2, 1, 1]),
    ("i32.r1", "int32", [4]),
    ("bool.r2", "bool", [2, 3]),
    ("empty", "float32", [0, 3]),
    ('q"uo\\te\n\u00e9\u4e2d\U0001f600\x01', "int32", [1]),
]


def golden_value(dtype, i):
    if dtype == "int32":
        return i * 1000 - 1500
    if dtype == "bool":
        return i % 3 == 0
    return ((i % 7) - 3) * 0.5 + 0.25


def data(dtype, shape):
    n = int(np.prod(shape)) if shape else 1
    v = [golden_value(dtype, i) for i in range(n)]
    if dtype == "float32":
        return f32(v)
    if dtype == "bfloat16":
        return bf16(v)
    if dtype == "float16":
        return np.array(v, dtype="<f2")
    if dtype == "int32":
        return np.array(v, dtype="<i4")
    return np.array(v, dtype=np.bool_)


def save(path, tensors, metadata=None):
    keep = []
    specs = {}
    for name, dtype, shape in tensors:
        a = np.ascontiguousarray(data(dtype, shape))
        keep.append(a)
        specs[name] = TensorSpec(dtype=dtype, shape=shape, data_ptr=a.ctypes.data, data_len=a.nbytes)
    with open(OUT + path, "wb") as f:
        f.write(bytes(serialize(specs, metadata=metadata)))


save("st_py_all.safetensors", TENSORS)
# (the reference writes __metadata__ keys in hash order: this file may come out
# with its two keys swapped, which is as valid; the tests read it, not compare it)
save("st_py_meta.safetensors", TENSORS[:2], metadata={"format": "pt", "note": 'a "quoted"\nline \u00e9'})
save("st_py_none.safetensors", [])
