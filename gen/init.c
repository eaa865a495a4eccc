/* init.c: parameter initialisation. Every random value comes from Philox4x32-10
 * (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), a
 * counter-based generator: element i of a param is a pure function of (seed,
 * param name, i), so the interpreter, the emitted CPU code and the emitted CUDA
 * code produce the same bits in any order and on any number of threads.
 *
 * Also here: rounding a double to the precision of a dtype (f32, bf16, f16,
 * i32, bool), used for init values and by the interpreter's `cast`. */
#include "ir.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- philox */

#define PHILOX_M0 0xD2511F53u /* round multipliers */
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u /* key schedule (Weyl sequence) increments */
#define PHILOX_W1 0xBB67AE85u

/* The high and low 32-bit halves of the 64-bit product a*b. */
static void mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
  uint64_t p = (uint64_t)a * b;
  *hi = (uint32_t)(p >> 32);
  *lo = (uint32_t)p;
}

/* One Philox round: two multiplications mix counter words 0 and 2; their high
 * halves are xored with words 1 and 3 and the round key; the words are then
 * permuted so every word is multiplied every other round. */
static void philox_round(uint32_t x[4], const uint32_t k[2]) {
  uint32_t hi0, lo0, hi1, lo1;
  mulhilo(PHILOX_M0, x[0], &hi0, &lo0);
  mulhilo(PHILOX_M1, x[2], &hi1, &lo1);
  uint32_t y0 = hi1 ^ x[1] ^ k[0];
  uint32_t y2 = hi0 ^ x[3] ^ k[1];
  x[0] = y0;
  x[1] = lo1;
  x[2] = y2;
  x[3] = lo0;
}

/* Philox4x32-10: ten rounds, the key bumped by the Weyl constants between
 * rounds. ctr and key are not modified. */
void philox4x32(uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t x[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
  uint32_t k[2] = {key[0], key[1]};
  for (int r = 0; r < 10; r++) {
    if (r > 0) {
      k[0] += PHILOX_W0;
      k[1] += PHILOX_W1;
    }
    philox_round(x, k);
  }
  memcpy(out, x, sizeof x);
}

/* 32-bit FNV-1a of a NUL-terminated string: mixes a param's name into its
 * Philox key so params draw independent streams. */
uint32_t name_hash(const char *s) {
  uint32_t h = 2166136261u;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    h ^= *p;
    h *= 16777619u;
  }
  return h;
}

/* A uniform double in (0, 1) from the top 24 bits of x: ((x >> 8) + 0.5) / 2^24.
 * Never 0 (log is safe) and never 1; every value is exact in f32. */
static double unit(uint32_t x) { return ((double)(x >> 8) + 0.5) * (1.0 / 16777216.0); }

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

/* Size k of a param's (static) shape; a symbolic size (never, for params)
 * counts as 1. */
static int64_t static_dim(const Param *p, int k) {
  int64_t v;
  if (!dim_is_const(&p->shape.d[k], &v) || v < 1)
    return 1;
  return v;
}

/* fan_in, fan_out as PyTorch computes them for an nn.Linear-style weight
 * [out, in]: fan_in is the last dim, fan_out the product of the rest. Rank 0
 * and 1 follow the rules in the brief (kaiming: fan_in = last dim or 1;
 * xavier: both = numel). */
static void fans(const Param *p, double *fan_in, double *fan_out) {
  int r = p->shape.rank;
  double numel = 1;
  for (int k = 0; k < r; k++)
    numel *= (double)static_dim(p, k);
  if (r >= 2) {
    *fan_in = (double)static_dim(p, r - 1);
    *fan_out = numel / *fan_in;
  } else {
    *fan_in = *fan_out = numel < 1 ? 1 : numel;
  }
}

/* Element i of param p for `seed`, rounded to p's dtype. The Philox stream:
 *   key = {seed lo32, seed hi32 ^ fnv1a(name)},  ctr = {i lo32, i hi32, 0, 0},
 *   u(x) = ((x >> 8) + 0.5) * 2^-24,
 *   uniform(lo, hi) = lo + (hi - lo) * u(out[0]),
 *   normal(std) = std * sqrt(-2 ln u(out[0])) * cos(2 pi u(out[1])),
 *   kaiming_uniform = uniform(-b, b), b = 1/sqrt(fan_in),
 *   xavier_uniform = uniform(-b, b), b = sqrt(6/(fan_in + fan_out)),
 * all in double, then rounded to f32 (and from there to bf16/f16). */
double param_init_value(const Param *p, uint64_t seed, int64_t i) {
  static const double two_pi = 6.283185307179586476925286766559;
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32) ^ name_hash(p->name)};
  uint32_t ctr[4] = {(uint32_t)(uint64_t)i, (uint32_t)((uint64_t)i >> 32), 0, 0};
  uint32_t out[4];
  double v, lo, hi, fin, fout;

  switch (p->init) {
  case INIT_ZEROS:
    v = 0;
    break;
  case INIT_ONES:
    v = 1;
    break;
  case INIT_UNIFORM:
    lo = p->a, hi = p->b;
    philox4x32(ctr, key, out);
    v = lo + (hi - lo) * unit(out[0]);
    break;
  case INIT_NORMAL:
    philox4x32(ctr, key, out);
    v = p->a * sqrt(-2.0 * log(unit(out[0]))) * cos(two_pi * unit(out[1]));
    break;
  case INIT_KAIMING_UNIFORM:
    fans(p, &fin, &fout);
    hi = 1.0 / sqrt(fin);
    philox4x32(ctr, key, out);
    v = -hi + (hi - -hi) * unit(out[0]);
    break;
  case INIT_XAVIER_UNIFORM:
    fans(p, &fin, &fout);
    hi = sqrt(6.0 / (fin + fout));
    philox4x32(ctr, key, out);
    v = -hi + (hi - -hi) * unit(out[0]);
    break;
  default: /* INIT_DEFAULT is resolved by the builder */
    v = 0;
    break;
  }
  return round_to_dtype(v, p->dtype == DT_BF16 || p->dtype == DT_F16 ? p->dtype : DT_F32);
}
