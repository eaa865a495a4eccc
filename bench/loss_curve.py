#!/usr/bin/env python3
"""loss_curve.py: GPT-2 124M trained for --steps steps on the text shipped in
tests/data/shakespeare.txt (byte tokens, ids 0..255 of GPT-2's 50,257), by
tgen's emitted project and by PyTorch from the same weights, side by side.

    python3 bench/loss_curve.py --build BUILD --graph G.json [--spec spec/examples/gpt2.yaml]
                                [--steps 50] [--batch 8] [--out OUT]

BUILD is the emitted gpt2 project's build directory (its gpt2_run), G.json
`tgen check --json spec/examples/gpt2.yaml`; the optimizer's
hyperparameters come from the spec's train: section (PyYAML). The text becomes --steps
batches of --batch rows of T + 1 consecutive bytes (row r of step s starts
at byte (s * batch + r) * T, wrapping at the end): inputs the byte, targets
the next one. tgen: `gpt2_run --seed 0 --save-params P0` (the init), then
`gpt2_run --params P0 --inputs F --dims B=batch --train-steps N` over the
file's N batches (the runner's several-batches mode). PyTorch: the same
graph evaluated op by op with torch's ops (torch_oracle.run_grad, bf16 as the
spec says), autograd, an f32 master copy of every param, the global-norm
clip and torch.optim.AdamW with the spec's hyperparameters, from P0.

PyTorch trains three times: as it is (torch); with cuBLAS's bf16 GEMMs
reducing in the other precision (torch': torch.backends.cuda.matmul.
allow_bf16_reduced_precision_reduction flipped); and with each batch's rows
in reverse order (torch'': every gradient the same sum, added in another
order). The same math rounded differently, so the torch' and torch'' curves
show how far bf16 noise alone moves a curve. (They understate it: one bf16
ulp in one gradient element at step 1 moved tgen's curve by 3% at step 50;
bench/results/h100_gpu_session11_loss_curve.txt.) Prints the curves and their
differences; writes OUT/loss_curve.txt and OUT/loss_curve.png (when
matplotlib is there). Pass: tgen's curve is within the torch noise of
torch's: its largest relative difference at most twice the larger of
the torch' and torch'' differences (and at least 3%: the loss is itself a bf16 value,
0.4% a step at 3.0), and its mean no more than twice theirs plus one bf16
step of the loss. Exit 1 otherwise.
"""
import argparse
import os
import subprocess
import sys
import time

# bench/profile.py would shadow the standard library's profile module (torch imports cProfile)
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
import torch  # noqa: E402
import yaml  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))
import torch_oracle as T  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--graph", required=True)
    ap.add_argument("--spec", default=os.path.join(ROOT, "spec", "examples", "gpt2.yaml"))
    ap.add_argument("--text", default=os.path.join(ROOT, "tests", "data", "shakespeare.txt"))
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    g = T.load_graph(a.graph)
    tr = yaml.safe_load(open(a.spec))["train"]
    seq = int(next(i for i in g["inputs"] if i["name"] == "idx")["shape"][1])
    data = torch.frombuffer(bytearray(open(a.text, "rb").read()), dtype=torch.uint8).to(torch.int32)
    n, B = a.steps, a.batch
    starts = torch.tensor([((s * B + r) * seq) % (len(data) - seq - 1) for s in range(n) for r in range(B)])
    rows = starts[:, None] + torch.arange(seq + 1)[None, :]
    tok = data[rows]
    inputs = {"idx": tok[:, :-1].contiguous(), "targets": tok[:, 1:].contiguous()}
    work = os.path.join(a.out, "loss_curve_work")
    os.makedirs(work, exist_ok=True)
    fin, p0, fout = (os.path.join(work, f) for f in ("inputs.safetensors", "p0.safetensors", "tgen.safetensors"))
    T.st_save(fin, inputs)
    print(f"text: {len(data)} bytes; {n} steps of {B} x {seq} tokens", flush=True)

    run = os.path.join(a.build, "gpt2_run")
    subprocess.run([run, "--device", "cuda", "--seed", "0", "--save-params", p0], check=True, stdout=subprocess.DEVNULL)
    t0 = time.time()
    subprocess.run([run, "--device", "cuda", "--params", p0, "--inputs", fin, "--dims", f"B={B}", "--train-steps", str(n),
                    "--log-every", "10", "--out", fout], check=True)
    tgen = [float(x) for x in T.st_load(fout)["losses"]]
    print(f"tgen: {n} steps in {time.time() - t0:.1f} s (with start-up)", flush=True)

    T.set_precise_defaults()
    init = T.st_load(p0)
    dtype = {p["ckpt"]: T.DTYPES[p["dtype"]] for p in g["params"]}
    o = tr["optimizer"]["adamw"]

    def torch_curve(reduced, reverse=False):
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = reduced
        master = {p["ckpt"]: init[p["ckpt"]].to("cuda", torch.float32) for p in g["params"]}
        opt = torch.optim.AdamW(list(master.values()), lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
                                weight_decay=o["weight_decay"])
        curve = []
        t0 = time.time()
        for s in range(n):
            batch = {k: v[s * B:(s + 1) * B].to("cuda") for k, v in inputs.items()}
            if reverse:  # the same rows in the other order: the same sums, added in another order
                batch = {k: v.flip(0).contiguous() for k, v in batch.items()}
            params = {k: m.to(dtype[k]) for k, m in master.items()}
            loss, grads = T.run_grad(g, params, batch, device="cuda", compute="model", check=False)
            for k, m in master.items():
                m.grad = grads[k].to(torch.float32)
            if tr.get("grad_clip", 0) > 0:
                torch.nn.utils.clip_grad_norm_(list(master.values()), tr["grad_clip"])
            opt.step()
            curve.append(float(loss))
        print(f"torch (bf16 reduced-precision reduction {reduced}, rows reversed {reverse}): {n} steps in "
              f"{time.time() - t0:.1f} s (op by op)", flush=True)
        return curve

    default = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    ref, alt, rev = torch_curve(default), torch_curve(not default), torch_curve(default, reverse=True)

    def diffs(x, y):
        r = [abs(a - b) / abs(b) for a, b in zip(x, y)]
        return max(r), sum(abs(a - b) for a, b in zip(x, y)) / len(x)

    lines = ["step  tgen       torch      torch'     torch''    tgen-torch  torch'-torch  torch''-torch"]
    for s in range(n):
        lines.append(f"{s + 1:4d}  {tgen[s]:.6f}  {ref[s]:.6f}  {alt[s]:.6f}  {rev[s]:.6f}  {tgen[s] - ref[s]:+.6f}   "
                     f"{alt[s] - ref[s]:+.6f}     {rev[s] - ref[s]:+.6f}")
    (tw, tm), (aw, am), (rw, rm) = diffs(tgen, ref), diffs(alt, ref), diffs(rev, ref)
    nw, nm = max(aw, rw), max(am, rm)  # the noise: the larger of the two references'
    ulp = 2.0 ** -7 * max(abs(v) for v in ref[n // 2:])  # one bf16 step of the loss over the second half
    ok = tw <= max(0.03, 2 * nw) and tm <= 2 * nm + ulp and all(v == v for v in tgen)
    lines.append(f"tgen vs torch: largest relative difference {tw:.4f}, mean |difference| {tm:.4f}")
    lines.append(f"torch' vs torch (the other bf16 GEMM reduction): largest relative difference {aw:.4f}, mean |difference| "
                 f"{am:.4f}")
    lines.append(f"torch'' vs torch (each batch's rows in reverse order: the same sums, added in another order): largest "
                 f"relative difference {rw:.4f}, mean |difference| {rm:.4f}")
    lines.append(f"pass: largest <= max(0.03, 2 x {nw:.4f}) and mean <= 2 x {nm:.4f} + {ulp:.4f}: {'PASS' if ok else 'FAIL'}")
    lines.append(f"first loss {tgen[0]:.4f} (torch {ref[0]:.4f}), last {tgen[-1]:.4f} (torch {ref[-1]:.4f}, torch' {alt[-1]:.4f}, "
                 f"torch'' {rev[-1]:.4f})")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(a.out, "loss_curve.txt"), "w") as f:
        f.write(text + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        plt.figure(figsize=(7, 4))
        plt.plot(range(1, n + 1), tgen, label="tgen (CUDA, bf16)")
        plt.plot(range(1, n + 1), ref, "--", label="PyTorch (bf16, autograd, AdamW)")
        plt.plot(range(1, n + 1), alt, ":", label="PyTorch, the other bf16 GEMM reduction")
        plt.plot(range(1, n + 1), rev, "-.", label="PyTorch, each batch's rows reversed")
        plt.xlabel("step")
        plt.ylabel("loss")
        plt.title(f"GPT-2 124M, {B} x {seq} byte tokens of Shakespeare a step")
        plt.legend()
        plt.tight_layout()
        plt.savefig(os.path.join(a.out, "loss_curve.png"), dpi=110)
    except ImportError:
        pass
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
