/* tgm_init.c: dtype conversions, Philox4x32-10 and parameter initialisation.
 *
 * Template: copied into every emitted project (src/NAME_init.c) and also
 * compiled into tgen itself, so the reference interpreter's params and the
 * emitted code's params are the same bits by construction. Element i of a
 * param is a pure function of (seed, the param's name, i): any thread count,
 * any device, any order gives the same values. */
#include "tgm_rt.h"

#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- bf16, f16 */

float tgm_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Round to nearest even on the f32 bits: add 0x7fff plus the lowest kept bit,
 * truncate. Overflow carries into the exponent and gives inf, as it should.
 * NaN stays a (quiet) NaN of the same sign. */
uint16_t tgm_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float tgm_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
  if (e == 0x1f) {
    u = sign | 0x7f800000u | (m << 13); /* inf, NaN */
  } else if (e) {
    u = sign | ((e + 112u) << 23) | (m << 13); /* normal: rebias 15 -> 127 */
  } else if (m) { /* subnormal: m * 2^-24 */
    float f = (float)m * (1.0f / 16777216.0f);
    memcpy(&u, &f, sizeof u);
    u |= sign;
  } else {
    u = sign;
  }
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Round to nearest even: 10 fraction bits for normals, a quantum of 2^-24 for
 * subnormals; |f| >= 65520 (halfway above the largest half, 65504) is inf. */
uint16_t tgm_f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u)
    return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
  if (a >= 0x477ff000u)
    return (uint16_t)(sign | 0x7c00u); /* 65520 and above, inf */
  if (a >= 0x38800000u) { /* normal half: exponent >= -14 */
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
  }
  /* subnormal half (or zero): value / 2^-24, rounded to nearest even */
  float x;
  memcpy(&x, &a, sizeof x);
  float q = x * 16777216.0f; /* exact: scaling by a power of two */
  float r = rintf(q);
  return (uint16_t)(sign | (uint16_t)r);
}

/* ---------------------------------------------------------------- Philox */

#define PHILOX_M0 0xD2511F53u /* round multipliers */
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u /* key schedule (Weyl sequence) increments */
#define PHILOX_W1 0xBB67AE85u

/* Philox4x32-10 (Salmon et al., SC'11): ten rounds; each multiplies words 0
 * and 2, xors the high halves into words 1 and 3 with the round key, and
 * permutes; the key is bumped by the Weyl constants between rounds. */
void tgm_philox4x32(uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t x0 = ctr[0], x1 = ctr[1], x2 = ctr[2], x3 = ctr[3], k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; r++) {
    if (r) {
      k0 += PHILOX_W0;
      k1 += PHILOX_W1;
    }
    uint64_t p0 = (uint64_t)PHILOX_M0 * x0, p1 = (uint64_t)PHILOX_M1 * x2;
    uint32_t y0 = (uint32_t)(p1 >> 32) ^ x1 ^ k0, y2 = (uint32_t)(p0 >> 32) ^ x3 ^ k1;
    x0 = y0;
    x1 = (uint32_t)p1;
    x2 = y2;
    x3 = (uint32_t)p0;
  }
  out[0] = x0, out[1] = x1, out[2] = x2, out[3] = x3;
}

uint32_t tgm_name_hash(const char *s) {
  uint32_t h = 2166136261u;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    h ^= *p;
    h *= 16777619u;
  }
  return h;
}

/* A uniform double in (0, 1) from the top 24 bits: ((x >> 8) + 0.5) / 2^24. */
static double unit(uint32_t x) { return ((double)(x >> 8) + 0.5) * (1.0 / 16777216.0); }

/* Round a double to the value it has once stored in dtype (via f32 for bf16,
 * f16, as the stores do). */
static double to_dtype(double v, int dtype) {
  float f = (float)v;
  if (dtype == TGM_BF16)
    return tgm_bf16_to_f32(tgm_f32_to_bf16(f));
  if (dtype == TGM_F16)
    return tgm_f16_to_f32(tgm_f32_to_f16(f));
  return f;
}

/* Element i of a param (spec/LANGUAGE.md, "Params and initialisation"):
 *   key = {seed lo32, seed hi32 ^ fnv1a(name)},  ctr = {i lo32, i hi32, 0, 0}
 *   uniform(lo, hi) = lo + (hi - lo) u(r0);  normal(std) = std sqrt(-2 ln u(r0)) cos(2 pi u(r1))
 *   kaiming_uniform: bound 1/sqrt(fan_in);  xavier_uniform: bound sqrt(6/(fan_in + fan_out))
 *   fan_in = last dim, fan_out = numel / fan_in (rank <= 1: both numel)
 * computed in double, then rounded to the dtype. */
double tgm_init_value(const char *name, int init, double a, double b, int dtype, int rank, const int64_t *shape,
                      uint64_t seed, int64_t i) {
  static const double two_pi = 6.283185307179586476925286766559;
  uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32) ^ tgm_name_hash(name)};
  uint32_t ctr[4] = {(uint32_t)(uint64_t)i, (uint32_t)((uint64_t)i >> 32), 0, 0}, r[4];
  double numel = 1, fan_in, fan_out, bound, v;
  for (int k = 0; k < rank; k++)
    numel *= (double)shape[k];
  if (rank >= 2) {
    fan_in = (double)shape[rank - 1];
    fan_out = numel / fan_in;
  } else {
    fan_in = fan_out = numel < 1 ? 1 : numel;
  }
  switch (init) {
  case TGM_INIT_ONES:
    return 1;
  case TGM_INIT_UNIFORM:
    tgm_philox4x32(ctr, key, r);
    v = a + (b - a) * unit(r[0]);
    break;
  case TGM_INIT_NORMAL:
    tgm_philox4x32(ctr, key, r);
    v = a * sqrt(-2.0 * log(unit(r[0]))) * cos(two_pi * unit(r[1]));
    break;
  case TGM_INIT_KAIMING_UNIFORM:
  case TGM_INIT_XAVIER_UNIFORM:
    bound = init == TGM_INIT_KAIMING_UNIFORM ? 1.0 / sqrt(fan_in) : sqrt(6.0 / (fan_in + fan_out));
    tgm_philox4x32(ctr, key, r);
    v = -bound + 2.0 * bound * unit(r[0]);
    break;
  default:
    return 0;
  }
  return to_dtype(v, dtype);
}
