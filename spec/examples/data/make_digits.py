"""Writes digits_train.safetensors and digits_test.safetensors: the UCI
"Optical Recognition of Handwritten Digits" test set (1797 8x8 images, as
shipped with scikit-learn), pixels scaled from 0..16 to [0, 1] as f32 `x`
[N, 64], labels as i32 `y` [N]. The first 1500 images are the training split,
the last 297 the held-out split. Needs scikit-learn and numpy; the outputs are
committed, so nothing needs this at build or test time."""
import json
import struct

import numpy as np
from sklearn.datasets import load_digits


def write(path, tensors):
    header, blobs, off = {}, [], 0
    for name, arr in tensors:
        data = np.ascontiguousarray(arr).tobytes()
        dt = {np.float32: "F32", np.int32: "I32"}[arr.dtype.type]
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


d = load_digits()
x = (d.data / 16.0).astype(np.float32)
y = d.target.astype(np.int32)
write("digits_train.safetensors", [("x", x[:1500]), ("y", y[:1500])])
write("digits_test.safetensors", [("x", x[1500:]), ("y", y[1500:])])
print("train", x[:1500].shape, "test", x[1500:].shape, "classes", np.bincount(y))
