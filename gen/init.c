/* init.c: parameter initialisation. Every random value comes from Philox4x32-10
 * (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), a
 * counter-based generator: element i of a param is a pure function of (seed,
 * param name, i), so the interpreter, the emitted CPU code and the emitted CUDA
 * code produce the same bits in any order and on any number of threads.
 *
 * Also here: rounding a double to the precision of a dtype (f32, bf16, f16,
 * i32, bool), used for init values and by the interpreter's `cast`. */
#include "ir.h"
#include "tgm_rt.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- philox */

/* Philox and the init formulas live in the runtime template
 * (templates/runtime/tgm_init.c), compiled into tgen too: the interpreter's
 * params and the emitted code's params are the same bits by construction. */

void philox4x32(uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) { tgm_philox4x32(ctr, key, out); }

uint32_t name_hash(const char *s) { return tgm_name_hash(s); }

/* ---------------------------------------------------------------- rounding */

/* v rounded to the nearest f32 (ties to even), as a double. Values beyond the
 * f32 range become +-inf exactly where the IEEE conversion would (at and above
 * FLT_MAX + half an ulp), written out so no out-of-range conversion (undefined
 * in ISO C) happens. */
static double round_f32(double v) {
  if (isnan(v))
    return v;
  double a = fabs(v);
  if (a > FLT_MAX) {
    /* FLT_MAX = (2 - 2^-23) * 2^127; halfway to 2^128 is (2 - 2^-24) * 2^127,
     * which ties to even = 2^128 = inf. */
    double half = ldexp(2.0 - ldexp(1.0, -24), 127);
    double r = a >= half ? (double)INFINITY : (double)FLT_MAX;
    return v < 0 ? -r : r;
  }
  return (double)(float)v;
}

/* v (already an f32 value) rounded to the nearest bf16, ties to even. bf16 is
 * the top 16 bits of an f32, so this is the usual "add 0x7fff plus the lowest
 * kept bit, then truncate" on the f32 bits; overflow carries into the exponent
 * and gives inf, as it should. NaN stays NaN. */
static double round_bf16(double v) {
  if (isnan(v))
    return v;
  float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  memcpy(&f, &u, sizeof u);
  return (double)f;
}

/* v (already an f32 value) rounded to the nearest f16, ties to even: 11
 * significant bits for normals (|v| >= 2^-14), a fixed quantum of 2^-24 for
 * subnormals; |v| >= 65520 (halfway from the largest f16, 65504, to 2^16)
 * becomes inf. NaN stays NaN. Scaling by powers of two is exact, so rint (in
 * the default round-to-nearest-even mode) does the rounding. */
static double round_f16(double v) {
  if (isnan(v) || v == 0)
    return v;
  double a = fabs(v);
  if (a >= 65520.0)
    return v < 0 ? -(double)INFINITY : (double)INFINITY;
  int ex;
  frexp(a, &ex);      /* a in [2^(ex-1), 2^ex) */
  int q = ex - 1 - 10; /* log2 of the quantum: 10 fraction bits */
  if (q < -24)
    q = -24;          /* subnormal range */
  double r = ldexp(rint(ldexp(a, -q)), q);
  return v < 0 ? -r : r;
}

/* The value v takes when stored in dtype t: floats round to nearest even (via
 * f32 first for bf16/f16, as the emitted code converts); i32 truncates toward
 * zero (C's and torch's .to(torch.int32)), with NaN and out-of-range values
 * giving INT32_MIN as the x86 conversion does; bool is v != 0. */
double round_to_dtype(double v, DType t) {
  switch (t) {
  case DT_F32:
    return round_f32(v);
  case DT_BF16:
    return round_bf16(round_f32(v));
  case DT_F16:
    return round_f16(round_f32(v));
  case DT_I32:
    if (isnan(v) || v <= -2147483649.0 || v >= 2147483648.0)
      return -2147483648.0;
    return trunc(v);
  case DT_BOOL:
    return v != 0;
  default:
    return v;
  }
}

/* ---------------------------------------------------------------- init */

/* Element i of param p for `seed`, rounded to p's dtype (see tgm_init_value
 * and spec/LANGUAGE.md for the formulas). InitKind and DType share the
 * runtime's numbering. */
double param_init_value(const Param *p, uint64_t seed, int64_t i) {
  int64_t shape[MAXRANK];
  for (int k = 0; k < p->shape.rank; k++)
    if (!dim_is_const(&p->shape.d[k], &shape[k]) || shape[k] < 1)
      shape[k] = 1;
  int dtype = p->dtype == DT_BF16 || p->dtype == DT_F16 ? (int)p->dtype : TGM_F32;
  return tgm_init_value(p->name, (int)p->init, p->a, p->b, dtype, p->shape.rank, shape, seed, i);
}

_Static_assert((int)INIT_ZEROS == TGM_INIT_ZEROS && (int)INIT_KAIMING_UNIFORM == TGM_INIT_KAIMING_UNIFORM &&
                   (int)INIT_XAVIER_UNIFORM == TGM_INIT_XAVIER_UNIFORM && (int)INIT_NORMAL == TGM_INIT_NORMAL,
               "InitKind and the runtime's TGM_INIT_* must agree");
_Static_assert((int)DT_BF16 == TGM_BF16 && (int)DT_F16 == TGM_F16 && (int)DT_I32 == TGM_I32 && (int)DT_BOOL == TGM_BOOL,
               "DType and the runtime's dtypes must agree");
