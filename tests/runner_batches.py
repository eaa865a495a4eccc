#!/usr/bin/env python3
"""runner_batches.py RUNNER WORK: the runner's several batches in one inputs
file (gpt2_tiny's runner, which e2e/gpt2_tiny builds). A file of 3 batches
of B=8 token rows (24 rows: above B's max of 16, as a file of many batches
is), trained 3 steps with --dims B=8, must give the losses of
3 runs that each train one step on one batch and hand the checkpoint on (bit
for bit: the CPU resumes exactly); a file whose first dim is not a multiple
of B is refused with a message naming it. Python's standard library only."""
import json
import os
import struct
import subprocess
import sys

runner, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
B, T, V, NB = 8, 8, 32, 3


def write_st(path, tensors):  # {name: (dtype, shape, list of ints)} -> safetensors
    hdr, blobs, off = {}, [], 0
    for name, (dt, shape, vals) in tensors.items():
        b = struct.pack("<%di" % len(vals), *vals)
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_losses(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    a, b = hdr["losses"]["data_offsets"]
    return list(struct.unpack("<%df" % ((b - a) // 4), data[a:b]))


def tokens(seed, n):  # a fixed pseudo-random sequence in [0, V)
    x, out = seed, []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2**31
        out.append(x % V)
    return out


idx, tgt = tokens(1, NB * B * T), tokens(2, NB * B * T)
allf = os.path.join(work, "batches.safetensors")
write_st(allf, {"idx": ("I32", [NB * B, T], idx), "targets": ("I32", [NB * B, T], tgt)})
for i in range(NB):
    sl = slice(i * B * T, (i + 1) * B * T)
    write_st(os.path.join(work, "batch%d.safetensors" % i), {"idx": ("I32", [B, T], idx[sl]), "targets": ("I32", [B, T], tgt[sl])})


def run(*args):
    r = subprocess.run([runner, "--device", "cpu"] + list(args), capture_output=True, text=True)
    if r.returncode:
        sys.exit("FAIL: %s %s: %s" % (runner, " ".join(args), r.stderr.strip()))
    return r


run("--seed", "1", "--inputs", allf, "--dims", "B=%d" % B, "--train-steps", str(NB), "--out", os.path.join(work, "all.out"))
together = read_losses(os.path.join(work, "all.out"))
apart = []
for i in range(NB):
    ck = os.path.join(work, "ck%d.safetensors" % i)
    start = ["--seed", "1"] if i == 0 else ["--checkpoint", os.path.join(work, "ck%d.safetensors" % (i - 1))]
    out = os.path.join(work, "one%d.out" % i)
    run(*start, "--inputs", os.path.join(work, "batch%d.safetensors" % i), "--train-steps", "1", "--save-checkpoint", ck, "--out", out)
    apart += read_losses(out)
ok = together == apart and len(set(together)) == NB
print("%s: %d steps over the file's %d batches: losses %s; one batch a run: %s" %
      ("ok" if ok else "FAIL", NB, NB, together, apart))
r = subprocess.run([runner, "--device", "cpu", "--inputs", allf, "--dims", "B=5", "--train-steps", "1"], capture_output=True, text=True)
refused = r.returncode == 1 and "dim 0 is 24, neither B = 5 nor a multiple of it" in r.stderr
print("%s: a file of 24 rows with --dims B=5 is refused: %s" % ("ok" if refused else "FAIL", r.stderr.strip()))
for f in os.listdir(work):
    os.remove(os.path.join(work, f))
sys.exit(0 if ok and refused else 1)
