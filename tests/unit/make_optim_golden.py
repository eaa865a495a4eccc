#!/usr/bin/env python3
"""make_optim_golden.py: the expected values of tests/unit/test_optim.c and
tests/gpu/test_optim_cuda.cu, from PyTorch itself (an oracle independent of
tgen's kernels).

Runs torch.optim.AdamW / torch.optim.SGD (foreach=False, fused=False, the
single-tensor path) and torch.nn.utils.clip_grad_norm_ on small fixed f32
tensors for three steps, and prints C literals: the inputs (initial weights,
the gradient of every step, as f32 or as bf16/f16 bits) and the weights and
optimizer state after every step. The low-precision copies are torch's own
.to(bfloat16/float16) of the f32 master.

Usage: python3 tests/unit/make_optim_golden.py > tests/unit/optim_golden.h
(the header both tests include; it is checked in, so the tests need no torch).
"""
import math

import torch

N = 19      # odd: vector loops get a tail
STEPS = 3
torch.set_num_threads(1)


def f32(xs):
    return torch.tensor(xs, dtype=torch.float32)


def weights(seed):
    return f32([math.sin(0.7 * i + seed) * (0.5 + 0.03 * i) for i in range(N)])


def grads(seed):
    # a different gradient every step; some large, some tiny
    return [f32([math.cos(1.3 * i + 0.9 * s + seed) * (0.2 + 0.9 * ((i * 7 + s) % 5) / 5.0) for i in range(N)])
            for s in range(STEPS)]


DTNAME = {torch.float32: "TGM_F32", torch.bfloat16: "TGM_BF16", torch.float16: "TGM_F16"}


def cfloats(t):
    return "{" + ", ".join("%.9eF" % v for v in t.float().tolist()) + "}"


def cbits(t):
    return "{" + ", ".join("0x%04x" % (v & 0xffff) for v in t.view(torch.int16).tolist()) + "}"


def run(name, kind, hp, gdt=torch.float32, lowdt=None, scale=1.0, max_norm=None, seed=0.0):
    w0 = weights(seed)
    gs = [g.to(gdt) for g in grads(seed + 0.5)]
    p = torch.nn.Parameter(w0.clone())
    if kind == "adamw":
        opt = torch.optim.AdamW([p], lr=hp["lr"], betas=hp["betas"], eps=hp["eps"], weight_decay=hp["wd"],
                                foreach=False, fused=False)
    else:
        opt = torch.optim.SGD([p], lr=hp["lr"], momentum=hp["momentum"], weight_decay=hp["wd"], foreach=False,
                              fused=False)
    ws, s1, s2, lows, scales = [], [], [], [], []
    for g in gs:
        p.grad = g.float().clone()  # the f32 master's gradient: the low-precision gradient, exactly
        if max_norm is not None:
            before = p.grad.clone()
            torch.nn.utils.clip_grad_norm_([p], max_norm, foreach=False)
            # the factor torch applied (f32)
            k = torch.argmax(before.abs())
            scales.append(float(p.grad[k] / before[k]))
        elif scale != 1.0:
            p.grad.mul_(scale)
        opt.step()
        st = opt.state[p]
        ws.append(p.detach().clone())
        if kind == "adamw":
            s1.append(st["exp_avg"].clone())
            s2.append(st["exp_avg_sq"].clone())
        else:
            s1.append(st["momentum_buffer"].clone() if hp["momentum"] != 0 else torch.zeros(N))
        if lowdt is not None:
            lows.append(p.detach().to(lowdt))
    print("/* %s */" % name)
    print("static const Case %s = {" % name)
    print('  "%s", %d, %s, %s, %.17g, %.17g, %.17g, %.17g, %.17g, %.17g, %.17g,' % (
        name, kind == "adamw", DTNAME[gdt], DTNAME[lowdt] if lowdt is not None else "-1",
        hp["lr"], hp.get("betas", (0, 0))[0], hp.get("betas", (0, 0))[1], hp.get("eps", 0), hp["wd"],
        hp.get("momentum", 0), scale))
    print("  %.17g," % (max_norm if max_norm is not None else 0.0))
    print("  %s," % cfloats(w0))
    print("  {%s}," % ", ".join(cfloats(g.float()) for g in gs))
    print("  {%s}," % ", ".join(cbits(g) if gdt != torch.float32 else "{0}" for g in gs))
    print("  {%s}," % ", ".join(cfloats(x) for x in ws))
    print("  {%s}," % ", ".join(cfloats(x) for x in s1))
    print("  {%s}," % ", ".join(cfloats(x) for x in s2) if s2 else "  {{0}},")
    print("  {%s}," % ", ".join(cbits(x) for x in lows) if lows else "  {{0}},")
    print("  {%s}," % ", ".join("%.9e" % x for x in scales) if scales else "  {0},")
    print("};")


def norms():
    """clip_grad_norm_ on a gradient split over two params (as the flat buffer
    is): the total norm and the factor, for a max_norm that clips and one
    that does not."""
    g = grads(3.0)[0] * 3.0
    out = []
    for max_norm in (0.5, 1e3):
        a = torch.nn.Parameter(torch.zeros(7))
        b = torch.nn.Parameter(torch.zeros(N - 7))
        a.grad = g[:7].clone()
        b.grad = g[7:].clone()
        total = torch.nn.utils.clip_grad_norm_([a, b], max_norm, foreach=False)
        k = int(torch.argmax(g.abs()))
        after = torch.cat([a.grad, b.grad])
        out.append((max_norm, float(total), float(after[k] / g[k])))
    print("/* clip_grad_norm_ over g (split over two params): max_norm, total_norm, factor applied */")
    print("static const float norm_g[%d] = %s;" % (N, cfloats(g)))
    print("static const double norm_cases[2][3] = {%s};" % ", ".join(
        "{%.17g, %.17g, %.17g}" % c for c in out))


print("""/* optim_golden.h: generated by tests/unit/make_optim_golden.py (torch %s); do not edit.
 * The expected values of tests/unit/test_optim.c and tests/gpu/test_optim_cuda.cu,
 * computed by torch.optim.AdamW / SGD and torch.nn.utils.clip_grad_norm_. */
#ifndef OPTIM_GOLDEN_H
#define OPTIM_GOLDEN_H
#include <stdint.h>

#define GOLD_N %d
#define GOLD_STEPS %d

typedef struct Case {
  const char *name;
  int adamw, gdt, lowdt; /* lowdt -1: no low-precision copy */
  double lr, beta1, beta2, eps, wd, momentum, scale;
  double max_norm;                       /* > 0: clip_grad_norm_ before every step (scale unused) */
  float w0[GOLD_N];                      /* the initial weights */
  float g[GOLD_STEPS][GOLD_N];           /* the gradients as f32 (exactly the bf16/f16 ones when gdt is) */
  uint16_t gbits[GOLD_STEPS][GOLD_N];    /* the bf16/f16 gradients */
  float w[GOLD_STEPS][GOLD_N];           /* the weights after every step */
  float s1[GOLD_STEPS][GOLD_N];          /* exp_avg / momentum_buffer */
  float s2[GOLD_STEPS][GOLD_N];          /* exp_avg_sq */
  uint16_t low[GOLD_STEPS][GOLD_N];      /* torch's .to(bf16/f16) of the weights */
  double scales[GOLD_STEPS];             /* the clip factor torch applied */
} Case;
/* clang-format off */""" % (torch.__version__, N, STEPS))
adam = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, wd=0.01)
run("adamw_f32", "adamw", adam)
run("adamw_nowd_scaled", "adamw", dict(lr=3e-3, betas=(0.3, 0.99), eps=1e-6, wd=0.0), scale=0.5, seed=1.0)
run("adamw_bf16", "adamw", adam, gdt=torch.bfloat16, lowdt=torch.bfloat16, seed=2.0)
run("adamw_f16", "adamw", dict(lr=5e-2, betas=(0.9, 0.95), eps=1e-8, wd=0.1), gdt=torch.float16,
    lowdt=torch.float16, seed=3.0)
run("adamw_clip", "adamw", adam, max_norm=0.5, seed=4.0)
run("sgd_plain", "sgd", dict(lr=0.1, momentum=0.0, wd=0.0), seed=5.0)
run("sgd_plain_wd", "sgd", dict(lr=0.1, momentum=0.0, wd=0.01), scale=2.0, seed=6.0)
run("sgd_mom", "sgd", dict(lr=0.05, momentum=0.9, wd=0.0), seed=7.0)
run("sgd_mom_wd_scaled", "sgd", dict(lr=0.05, momentum=0.9, wd=0.01), scale=0.25, seed=8.0)
run("sgd_mom_bf16", "sgd", dict(lr=0.05, momentum=0.9, wd=0.01), gdt=torch.bfloat16, lowdt=torch.bfloat16,
    seed=9.0)
run("sgd_clip", "sgd", dict(lr=0.1, momentum=0.9, wd=0.0), max_norm=1.0, seed=10.0)
norms()
print("static const Case *const gold_cases[] = {&adamw_f32, &adamw_nowd_scaled, &adamw_bf16, &adamw_f16, &adamw_clip,"
      " &sgd_plain, &sgd_plain_wd, &sgd_mom, &sgd_mom_wd_scaled, &sgd_mom_bf16, &sgd_clip};")
print("/* clang-format on */")
print("#endif")
