#!/usr/bin/env python3
"""fit_math.py: the polynomial coefficients of templates/runtime/tgm_math.h's
CPU functions (exp, log, erf, erfc; tanh is exp's), fitted here rather than
copied.

Each polynomial approximates a function g that the C code combines with
exactly computed leading terms (exp: e^r = 1 + r + r^2 q(r), with q fitted
to (e^r - 1 - r) / r^2), as a minimax fit of the relative error (or of
another weight w) by the Remez exchange algorithm (E. Remez 1934; see e.g.
J.-M. Muller, "Elementary Functions", ch. 3): it solves for c and E in

    sum_i c_i x_j^i - g(x_j) = (-1)^j E / w(x_j),   j = 0..n,

moves the n + 1 points to the extrema of the weighted error, and repeats
until the extrema level out. Everything runs in mpmath at 60 digits. The
coefficients are then rounded to the nearest f32 (a constant term whose
rounding would cost most of an ulp is printed as a sum of two f32), and the
error of the rounded polynomial is printed too; tests/unit/test_math.c
measures the result of the rounding and of the f32 evaluation over every
f32 input.

Usage: python3 tests/unit/fit_math.py [exp log erf erfc]   (needs
mpmath and numpy; prints each fit's errors and coefficients, lowest first,
as C literals)
"""
import mpmath as mp
import numpy as np

mp.mp.dps = 60


def remez(g, w, basis, lo, hi, iters=40):
    """c minimising max over [lo, hi] of |w(x) (sum c_i basis_i(x) - g(x))|."""
    n = len(basis)
    # n + 1 unknowns (c and E): start at n + 1 Chebyshev extrema
    xs = [lo + (hi - lo) * (1 - mp.cos(mp.pi * j / n)) / 2 for j in range(n + 1)]
    E = 0
    for _ in range(iters):
        A = mp.matrix(n + 1, n + 1)
        b = mp.matrix(n + 1, 1)
        for j, x in enumerate(xs):
            for i, phi in enumerate(basis):
                A[j, i] = phi(x)
            A[j, n] = (-1) ** j / w(x)
            b[j] = g(x)
        sol = mp.lu_solve(A, b)
        c = [sol[i] for i in range(n)]
        E = sol[n]

        def err(x):
            return w(x) * (sum(ci * phi(x) for ci, phi in zip(c, basis)) - g(x))

        # the extrema of err between sign changes, on a fine grid then refined
        m = 40 * (n + 1)
        grid = [lo + (hi - lo) * k / m for k in range(m + 1)]
        ev = [err(x) for x in grid]
        new = []
        k = 0
        while k <= m:
            s = mp.sign(ev[k])
            best = k
            while k <= m and mp.sign(ev[k]) == s:
                if abs(ev[k]) > abs(ev[best]):
                    best = k
                k += 1
            a, bnd = grid[max(best - 1, 0)], grid[min(best + 1, m)]
            try:  # golden-section refinement of |err| on the grid cell
                for _r in range(60):
                    p1 = a + (bnd - a) * 0.382
                    p2 = a + (bnd - a) * 0.618
                    if abs(err(p1)) > abs(err(p2)):
                        bnd = p2
                    else:
                        a = p1
                new.append((a + bnd) / 2)
            except ZeroDivisionError:
                new.append(grid[best])
        if len(new) < n + 1:
            break
        # keep n+1 alternating extrema, dropping the smallest at the ends
        while len(new) > n + 1:
            if abs(err(new[0])) < abs(err(new[-1])):
                new.pop(0)
            else:
                new.pop()
        if abs(new[0] - lo) < (hi - lo) * 1e-3:
            new[0] = lo
        if abs(new[-1] - hi) < (hi - lo) * 1e-3:
            new[-1] = hi
        mx = max(abs(err(x)) for x in new)
        xs = new
        if abs(mx - abs(E)) < abs(E) * 1e-6:
            break
    return c, abs(E)


def mono(k):
    return lambda x: x ** k


def f32(v):
    """v rounded to the nearest f32 (through a double: close enough here)."""
    return mp.mpf(float(np.float32(float(v))))


def fit(name, g, deg, lo, hi, w=None, split0=False):
    """A degree-deg polynomial in x, minimax error to g on [lo, hi] weighted
    by w (default: relative, 1/|g|), its coefficients then rounded to f32
    (split0: the constant term as the sum of two f32, hi + lo, for a
    constant whose rounding would cost most of an ulp). Prints the error
    before and after the rounding and the coefficients, lowest first."""
    w = w or (lambda x: 1 / abs(g(x)))
    c, E = remez(g, w, [mono(i) for i in range(deg + 1)], lo, hi)
    r = [f32(ci) for ci in c]
    if split0:
        r[0] = r[0] + f32(c[0] - r[0])
    grid = [lo + (hi - lo) * j / 4000 for j in range(4001)]
    Ef = max(abs(w(x) * (sum(ci * x**i for i, ci in enumerate(r)) - g(x))) for x in grid)
    print(f"{name}: minimax error {mp.nstr(E, 3)}, {mp.nstr(Ef, 3)} = 2^{mp.nstr(mp.log(Ef, 2), 4)}"
          " with the f32 coefficients")
    for i, ci in enumerate(c):
        if i == 0 and split0:
            print(f"  x^0: {float(f32(ci)):.9g}f + {float(f32(ci - f32(ci))):.9g}f")
        else:
            print(f"  x^{i}: {float(f32(ci)):.9g}f")
    return c


def at0(f, v0):
    """f, continued by its limit v0 at 0 (the grid passes through 0)."""
    return lambda x: v0 if abs(x) < mp.mpf(10) ** -30 else f(x)


if __name__ == "__main__":
    import sys
    which = sys.argv[1:] or ["exp", "log", "erf", "erfc"]
    if "exp" in which:
        # exp: e^r = 1 + r + r^2 q(r) on |r| <= ln2/2 (a little wider: the
        # rounded reduction's r), q of degree 5 fitted to (e^r - 1 - r) / r^2
        # (its relative error reaches e^r scaled by r^2/2 / e^r <= 0.07).
        # Cody and Waite's ln2 = LN2_HI + LN2_LO, LN2_HI of 9 bits.
        hi = mp.nint(mp.log(2) * 512) / 512
        print(f"LN2_HI = {float(hi):.9g}f ({int(hi * 512)}/512), LN2_LO = {float(f32(mp.log(2) - hi)):.9g}f")
        h = mp.log(2) / 2 * mp.mpf("1.0001")
        fit("exp: q(r), e^r = 1 + r + r^2 q(r)", at0(lambda r: (mp.expm1(r) - r) / r**2, mp.mpf(1) / 2), 5, -h, h)
    if "log" in which:
        # log: log(1 + f) = f + f^2 q(f) for 1 + f in [sqrt(1/2), sqrt(2)], q
        # of degree 9 fitted to (log(1 + f) - f) / f^2.
        lo, hi = mp.sqrt(0.5) - 1, mp.sqrt(2) - 1
        fit("log: q(f), log(1 + f) = f + f^2 q(f)", at0(lambda f: (mp.log1p(f) - f) / f**2, -mp.mpf(1) / 2), 9, lo, hi)
    if "erf" in which:
        # erf for |x| <= 0.75: erf(x) = x + x q(z), z = x^2, q of degree 5
        # fitted to erf(x)/x - 1 (which crosses 0) with the error weighted
        # by x / erf(x): the relative error of erf.
        g = at0(lambda z: mp.erf(mp.sqrt(z)) / mp.sqrt(z) - 1, 2 / mp.sqrt(mp.pi) - 1)
        fit("erf: q(z), erf(x) = x + x q(z)", g, 5, mp.mpf(0), mp.mpf(0.75) ** 2, w=lambda z: 1 / (1 + g(z)))
    if "erfc" in which:
        # erfc for u in [0.75, 11.5]: erfc(u) = e^(-u^2) R(u), R(u) = erfc(u)
        # e^(u^2) (W. J. Cody's split, "Rational Chebyshev approximations for
        # the error function", Math. Comp. 1969; polynomials here): below 2
        # a polynomial in v = u - 1.375 of degree 9; above, R(u) = S(z) / u
        # with S a polynomial of degree 9 in z = 1/u^2 (R's asymptotic series
        # is one in 1/u^2).
        R = lambda u: mp.erfc(u) * mp.exp(u * u)  # noqa: E731
        fit("erfc: R(1.375 + v)", lambda v: R(v + mp.mpf(1.375)), 9, -mp.mpf(0.625), mp.mpf(0.625), split0=True)
        fit("erfc: S(z) = u R(u), z = 1/u^2", lambda z: R(1 / mp.sqrt(z)) / mp.sqrt(z), 9, 1 / mp.mpf(11.5) ** 2,
            mp.mpf(1) / 4, split0=True)
