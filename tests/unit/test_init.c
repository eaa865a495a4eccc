/* test_init.c: gen/init.c against published known answers and against values
 * computed by a separate few-line Python implementation of the same formulas
 * (Philox written independently from the algorithm description, checked on
 * the same known answers; struct.pack for f32/f16 rounding).
 *
 * Built by tests/CMakeLists.txt against tgenlib.
 */
#include "ir.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int npass, nfail;

static void check(int ok, const char *what) {
  if (ok) {
    npass++;
  } else {
    nfail++;
    printf("FAIL: %s\n", what);
  }
}

/* Exact equality that also equates NaN with NaN. */
static void check_val(double got, double want, const char *what) {
  int ok = isnan(want) ? isnan(got) : got == want && signbit(got) == signbit(want);
  if (!ok)
    printf("FAIL: %s: got %.17g, want %.17g\n", what, got, want);
  ok ? npass++ : nfail++;
}

/* Random123's known answers for Philox4x32-10 (kat_vectors: zeros, all
 * ones, and the digits of pi). */
static void test_philox_kat(void) {
  static const struct {
    uint32_t ctr[4], key[2], out[4];
  } kat[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
    uint32_t ctr[4], out[4];
    memcpy(ctr, kat[i].ctr, sizeof ctr);
    philox4x32(ctr, kat[i].key, out);
    char what[64];
    snprintf(what, sizeof what, "philox KAT %zu", i);
    check(!memcmp(out, kat[i].out, sizeof out), what);
    check(!memcmp(ctr, kat[i].ctr, sizeof ctr), "philox leaves ctr alone");
  }
}

/* FNV-1a 32-bit reference values (the FNV authors' test suite). */
static void test_name_hash(void) {
  check(name_hash("") == 2166136261u, "fnv1a(\"\")");
  check(name_hash("a") == 0xe40c292cu, "fnv1a(\"a\")");
  check(name_hash("foobar") == 0xbf9cf968u, "fnv1a(\"foobar\")");
}

/* A param of the given shape for param_init_value. */
static Param mkparam(const char *name, int rank, const int64_t *d, DType dt, InitKind k, double a, double b) {
  Param p;
  memset(&p, 0, sizeof p);
  p.name = name;
  p.shape.rank = rank;
  p.numel = 1;
  for (int i = 0; i < rank; i++) {
    p.shape.d[i] = dim_const(d[i]);
    p.numel *= d[i];
  }
  p.dtype = dt;
  p.init = k;
  p.a = a;
  p.b = b;
  return p;
}

/* Init values: u = ((x >> 8) + 0.5) * 2^-24 of philox(ctr = {i lo, i hi, 0,
 * 0}, key = {seed lo, seed hi ^ fnv1a(name)}), formulas as in init.c; the
 * expected literals are Python's float(struct f32) of the same formula. */
static void test_param_init(void) {
  int64_t s43[2] = {4, 3};
  int64_t s5[1] = {5};

  Param p = mkparam("w", 2, s43, DT_F32, INIT_ZEROS, 0, 0);
  check_val(param_init_value(&p, 42, 3), 0.0, "zeros");
  p.init = INIT_ONES;
  check_val(param_init_value(&p, 42, 3), 1.0, "ones");

  /* kaiming: bound 1/sqrt(3); seed 42, element 5 */
  p.init = INIT_KAIMING_UNIFORM;
  check_val(param_init_value(&p, 42, 5), 0.5410601496696472, "kaiming_uniform w[4,3] seed 42 i 5");
  double bound = 1 / sqrt(3.0);
  int inside = 1;
  for (int64_t i = 0; i < 12; i++) {
    double v = param_init_value(&p, 42, i);
    inside &= fabs(v) <= bound && v == (double)(float)v;
  }
  check(inside, "kaiming values within the bound and f32-exact");

  /* xavier: fan_in 3, fan_out 4, bound sqrt(6/7); param "x", element 0 */
  Param x = mkparam("x", 2, s43, DT_F32, INIT_XAVIER_UNIFORM, 0, 0);
  check_val(param_init_value(&x, 42, 0), 0.4105442464351654, "xavier_uniform x[4,3] seed 42 i 0");

  /* normal std 0.02: Box-Muller of out[0], out[1]; param "emb", seed 7, i 3 */
  Param e = mkparam("emb", 1, s5, DT_F32, INIT_NORMAL, 0.02, 0);
  check_val(param_init_value(&e, 7, 3), -0.02402126044034958, "normal(0.02) emb seed 7 i 3");

  /* uniform [-1, 1], with the high words of seed and index in play:
   * seed 2^33 + 5, i 2^32 + 9; double value 0.46200138330459595, which
   * rounds to bf16 0.462890625 and to f16 0.4619140625 */
  Param u = mkparam("h.0.u", 1, s5, DT_BF16, INIT_UNIFORM, -1, 1);
  uint64_t seed = ((uint64_t)1 << 33) + 5;
  int64_t i = ((int64_t)1 << 32) + 9;
  check_val(param_init_value(&u, seed, i), 0.462890625, "uniform bf16, 64-bit seed and index");
  u.dtype = DT_F16;
  check_val(param_init_value(&u, seed, i), 0.4619140625, "uniform f16");
  u.dtype = DT_F32;
  check_val(param_init_value(&u, seed, i), (double)(float)0.46200138330459595, "uniform f32");

  /* different names draw different streams; same inputs, same bits */
  Param w2 = mkparam("w2", 2, s43, DT_F32, INIT_KAIMING_UNIFORM, 0, 0);
  check(param_init_value(&w2, 42, 5) != param_init_value(&p, 42, 5), "name changes the stream");
  check(param_init_value(&p, 42, 5) == param_init_value(&p, 42, 5), "deterministic");
}

/* Rounding to each dtype, by hand: bf16 keeps 7 fraction bits, f16 10 (and
 * subnormals down to 2^-24), f32 23. */
static void test_round(void) {
  /* bf16: 1 + 2^-8 is halfway between 1 (even) and 1 + 2^-7 -> 1;
   * 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 -> 1 + 2^-6 */
  check_val(round_to_dtype(1 + ldexp(1, -8), DT_BF16), 1.0, "bf16 tie to even down");
  check_val(round_to_dtype(1 + 3 * ldexp(1, -8), DT_BF16), 1.015625, "bf16 tie to even up");
  /* bf16 max is (2 - 2^-7) * 2^127; halfway to 2^128 is (2 - 2^-8) * 2^127 */
  check_val(round_to_dtype(3.4e38, DT_BF16), INFINITY, "bf16 overflow");
  check_val(round_to_dtype(-3.39e38, DT_BF16), -ldexp(2 - ldexp(1, -7), 127), "bf16 to max");
  check_val(round_to_dtype(NAN, DT_BF16), NAN, "bf16 NaN");
  /* f16: max 65504, halfway to 2^16 is 65520 (ties to even = inf) */
  check_val(round_to_dtype(65519, DT_F16), 65504.0, "f16 below the overflow threshold");
  check_val(round_to_dtype(65520, DT_F16), INFINITY, "f16 overflow at the tie");
  check_val(round_to_dtype(-1e6, DT_F16), -INFINITY, "f16 negative overflow");
  check_val(round_to_dtype(1 + ldexp(1, -11), DT_F16), 1.0, "f16 tie to even");
  check_val(round_to_dtype(1 + 3 * ldexp(1, -11), DT_F16), 1.001953125, "f16 tie to even up");
  check_val(round_to_dtype(3e-8, DT_F16), ldexp(1, -24), "f16 subnormal rounds up to 2^-24");
  check_val(round_to_dtype(2.5 * ldexp(1, -24), DT_F16), ldexp(1, -23), "f16 subnormal tie to even");
  check_val(round_to_dtype(1e-8, DT_F16), 0.0, "f16 underflow to 0");
  check_val(round_to_dtype(-1e-8, DT_F16), -0.0, "f16 underflow keeps the sign");
  check_val(round_to_dtype(ldexp(1, -14) * (1 + ldexp(1, -10)), DT_F16), ldexp(1, -14) * (1 + ldexp(1, -10)),
            "f16 smallest normal + ulp exact");
  /* f32 */
  check_val(round_to_dtype(0.1, DT_F32), 0.100000001490116119384765625, "f32 0.1");
  check_val(round_to_dtype(1e39, DT_F32), INFINITY, "f32 overflow");
  check_val(round_to_dtype(-ldexp(2 - ldexp(1, -24), 127), DT_F32), -INFINITY, "f32 overflow at the tie");
  check_val(round_to_dtype(nextafter(ldexp(2 - ldexp(1, -24), 127), 0), DT_F32), (double)3.40282346638528859811704183484516925e+38,
            "f32 just below the overflow tie -> FLT_MAX");
  check_val(round_to_dtype(16777217, DT_F32), 16777216.0, "f32 integer rounding (tie to even)");
  /* i32: truncation toward zero; NaN / out of range -> INT32_MIN (x86) */
  check_val(round_to_dtype(1.7, DT_I32), 1.0, "i32 trunc +");
  check_val(round_to_dtype(-1.7, DT_I32), -1.0, "i32 trunc -");
  check_val(round_to_dtype(3e9, DT_I32), -2147483648.0, "i32 out of range");
  check_val(round_to_dtype(NAN, DT_I32), -2147483648.0, "i32 NaN");
  /* bool */
  check_val(round_to_dtype(-2, DT_BOOL), 1.0, "bool -2");
  check_val(round_to_dtype(0, DT_BOOL), 0.0, "bool 0");
  check_val(round_to_dtype(NAN, DT_BOOL), 1.0, "bool NaN");
}

int main(void) {
  test_philox_kat();
  test_name_hash();
  test_param_init();
  test_round();
  printf("%d passed, %d failed\n", npass, nfail);
  return nfail != 0;
}
