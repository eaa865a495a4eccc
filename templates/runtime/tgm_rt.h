/* tgm_rt.h: the runtime shared by every emitted model (internal header).
 *
 * This is a template: tgen copies it into the emitted project as
 * src/NAME_rt.h, replacing every "tgm_" with "NAME_" and "TGM_" with
 * "NAME_" upper-cased. It compiles on its own as the runtime of a model
 * called "tgm", which is how the runtime's own tests build it.
 *
 * Sections: the lines between the marker comments "@uses NAMES@" and
 * "@end NAMES@" (each alone on its line) are copied only into models whose
 * passes call one of the library functions NAMES (attention, embedding,
 * embedding_backward, dropout, matmul, linear; gen/emit.c, keep_sections).
 * The markers are comments: the template still compiles whole.
 *
 * Contents:
 *   dtypes and their conversions (bf16, f16 stored as uint16_t; math in f32)
 *   the model-independent parts of the model object (errors, params buffer)
 *   parameter init (Philox4x32-10, the same bits as tgen's interpreter)
 *   safetensors reading and writing (atomic: temp file + rename)
 *   the CPU kernel library (tgm_cpu.c)  and  the CUDA kernel library (tgm_cuda.cu)
 *
 * Conventions for every kernel: tensors are dense row-major; `dt` is the
 * storage dtype of the floating operands (TGM_F32, TGM_BF16, TGM_F16; some
 * ops also take TGM_I32); arithmetic is done in f32 for floating dtypes
 * (accumulations in f32 too; the CPU path accumulates long reductions in
 * double where that is free) and exactly for i32. Shapes are `int rank,
 * const int64_t *shape`; a rank-0 tensor has one element. Broadcasting
 * follows NumPy: trailing dims align, size-1 (or missing) dims repeat. */
#ifndef TGM_RT_H
#define TGM_RT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TGM_MAXRANK 8
/* Workspace buffers start at 256-byte boundaries. */
#define TGM_ALIGN(n) (((int64_t)(n) + 255) & ~(int64_t)255)
/* Generated locals that a given model may not use. */
#define TGM_UNUSED __attribute__((unused))

/* ---------------------------------------------------------------- dtypes */

enum { TGM_F32 = 0, TGM_BF16 = 1, TGM_F16 = 2, TGM_I32 = 3, TGM_BOOL = 4 };
extern const char *const tgm_dtype_names[5];      /* "f32", "bf16", ...          */
extern const char *const tgm_dtype_st_names[5];   /* safetensors: "F32", "BF16", "F16", "I32", "BOOL" */
extern const int tgm_dtype_sizes[5];              /* 4, 2, 2, 4, 1               */

float tgm_bf16_to_f32(uint16_t h);
uint16_t tgm_f32_to_bf16(float f);  /* round to nearest even; NaN stays NaN */
float tgm_f16_to_f32(uint16_t h);
uint16_t tgm_f32_to_f16(float f);   /* round to nearest even; overflow -> inf */

/* The same conversions inline, for hot loops (the CPU kernels, tgm_cpu.c, and
 * the optimizer, tgm_optim_cpu.c): bit-identical to the functions above but
 * written with bit masks instead of branches, so that loops over them
 * vectorise; always inlined, even where gcc's unit-growth limit is reached
 * (the ISA clones reach it), or the loops do not vectorise. Helpers:
 * tgm_bits_f / tgm_f_bits reinterpret; tgm_mask(c) is all ones when c holds;
 * tgm_sel(m, a, b) takes a where m is set, else b (a select that vectorises
 * where ?: on floats does not: gcc will not if-convert under trapping math). */
#if defined(__GNUC__) || defined(__clang__)
#define TGM_HOT static inline __attribute__((always_inline))
#else
#define TGM_HOT static inline
#endif

/* TGM_CLONES before a leaf function (no OpenMP parallel region inside: the
 * region's body is a function the compiler makes, which would not inherit
 * the attribute) compiles it three times, for AVX-512, AVX2 and the baseline,
 * the best one for the CPU picked at load time (an ifunc: gcc and clang on
 * x86 with glibc); elsewhere, or with -DTGM_NO_ISA_DISPATCH, it is nothing
 * and the function is compiled once, for the compiler's target. The hot loops
 * of the runtime (tgm_cpu.c) and of the generated kernels (NAME_cpu.c) use
 * it; TGM_HOT helpers they call are compiled into each copy. The AVX-512 copy
 * may contract a * b + c into one FMA (gcc's default): within tgm_math.h's
 * stated errors, but not always the baseline's last bit; with -ffp-contract=off
 * the generated kernels' copies give the baseline's bits (tests/isa_dispatch.sh). */
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) &&                          \
    defined(__GLIBC__) && defined(__has_attribute) && !defined(TGM_NO_ISA_DISPATCH)
#if __has_attribute(target_clones)
#define TGM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef TGM_CLONES
#define TGM_CLONES
#endif

TGM_HOT float tgm_bits_f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
TGM_HOT uint32_t tgm_f_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
TGM_HOT uint32_t tgm_mask(int c) { return (uint32_t)0 - (uint32_t)(c != 0); }
TGM_HOT float tgm_sel(uint32_t m, float a, float b) {
  return tgm_bits_f((tgm_f_bits(a) & m) | (tgm_f_bits(b) & ~m));
}

TGM_HOT float tgm_ld_bf16(uint16_t h) { return tgm_bits_f((uint32_t)h << 16); }

/* Round to nearest even on the bits; NaN stays a quiet NaN of the same sign. */
TGM_HOT uint16_t tgm_st_bf16(float f) {
  uint32_t u = tgm_f_bits(f), nan = tgm_mask((u & 0x7fffffffu) > 0x7f800000u);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x0040u;
  return (uint16_t)((r & ~nan) | (q & nan));
}

/* Exact: normals rebias the exponent, inf/NaN keep the payload, subnormals
 * come out of one exact subtraction (2^-14 (1 + m/1024) - 2^-14). */
TGM_HOT float tgm_ld_f16(uint16_t h) {
  uint32_t o = (uint32_t)(h & 0x7fffu) << 13, e = o & 0x0f800000u;
  uint32_t inf = tgm_mask(e == 0x0f800000u), zero = tgm_mask(e == 0);
  o += 0x38000000u + (0x38000000u & inf);
  uint32_t sub = tgm_f_bits(tgm_bits_f(o + 0x00800000u) - tgm_bits_f(0x38800000u));
  o = (o & ~zero) | (sub & zero);
  return tgm_bits_f(o | ((uint32_t)(h & 0x8000u) << 16));
}

/* Round to nearest even: 10 fraction bits for normals, a quantum of 2^-24 for
 * subnormals (rounded by adding 2^23), 65520 and above to inf. */
TGM_HOT uint16_t tgm_st_f16(float f) {
  uint32_t u = tgm_f_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  uint32_t nanv = 0x7e00u | ((a >> 13) & 0x3ffu);
  uint32_t norm = (a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
  uint32_t sub = tgm_f_bits(tgm_bits_f(a) * 16777216.0f + 8388608.0f) - 0x4b000000u;
  uint32_t isnan = tgm_mask(a > 0x7f800000u), isinf = tgm_mask(a >= 0x477ff000u), isnorm = tgm_mask(a >= 0x38800000u);
  uint32_t r = (norm & isnorm) | (sub & ~isnorm);
  r = (0x7c00u & isinf) | (r & ~isinf);
  r = (nanv & isnan) | (r & ~isnan);
  return (uint16_t)(sign | (r & 0xffffu));
}

/* Element i of a typed host buffer, as a double; and the store back (rounding
 * to bf16/f16, truncating to i32, bool = v != 0). For tables and tests, not
 * for hot loops. */
static inline double tgm_get(const void *p, int dt, int64_t i) {
  switch (dt) {
  case TGM_F32: return ((const float *)p)[i];
  case TGM_BF16: return tgm_bf16_to_f32(((const uint16_t *)p)[i]);
  case TGM_F16: return tgm_f16_to_f32(((const uint16_t *)p)[i]);
  case TGM_I32: return ((const int32_t *)p)[i];
  default: return ((const uint8_t *)p)[i];
  }
}

static inline void tgm_put(void *p, int dt, int64_t i, double v) {
  switch (dt) {
  case TGM_F32: ((float *)p)[i] = (float)v; break;
  case TGM_BF16: ((uint16_t *)p)[i] = tgm_f32_to_bf16((float)v); break;
  case TGM_F16: ((uint16_t *)p)[i] = tgm_f32_to_f16((float)v); break;
  case TGM_I32: ((int32_t *)p)[i] = (int32_t)v; break;
  default: ((uint8_t *)p)[i] = v != 0; break;
  }
}

/* ---------------------------------------------------------------- status */

/* Status codes of the public API (the public header tgm.h defines the same
 * enum under the same guard). Every failing call also leaves a message naming
 * what was wrong, e.g. "input 'x': dim 0 is 5000, above max 4096 (B)". */
#ifndef TGM_STATUS_DEFINED
#define TGM_STATUS_DEFINED
typedef enum tgm_status {
  TGM_OK = 0,
  TGM_EINVAL = 1,   /* bad argument (NULL pointer, unknown device, bad dims) */
  TGM_ESHAPE = 2,   /* a shape or dtype does not match the model */
  TGM_EIO = 3,      /* a file could not be read or written */
  TGM_ECORRUPT = 4, /* a file is not a valid checkpoint for this model */
  TGM_EDEVICE = 5,  /* CUDA unavailable or a CUDA call failed */
  TGM_ENOMEM = 6,   /* out of host or device memory */
  TGM_EDATA = 7     /* bad data at run time (an index out of range; train_step: a NaN or inf gradient norm) */
} tgm_status;
#endif

/* ---------------------------------------------------------------- init */

void tgm_philox4x32(uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
uint32_t tgm_name_hash(const char *s); /* FNV-1a 32 */
enum { TGM_INIT_ZEROS = 1, TGM_INIT_ONES, TGM_INIT_NORMAL, TGM_INIT_UNIFORM, TGM_INIT_XAVIER_UNIFORM,
       TGM_INIT_KAIMING_UNIFORM };
/* Element i of a param: see spec/LANGUAGE.md "Params and initialisation".
 * Returns the value already rounded to `dtype` (as a double). */
double tgm_init_value(const char *name, int init, double a, double b, int dtype, int rank, const int64_t *shape,
                      uint64_t seed, int64_t i);

/* ---------------------------------------------------------------- safetensors */

typedef struct tgm_tensor_desc {
  const char *name;
  int dtype;
  int rank;
  int64_t shape[TGM_MAXRANK];
  const void *data;  /* host memory, row-major */
} tgm_tensor_desc;

/* Writes `n` tensors to `path` atomically (PATH.tmp.PID, fsync, rename;
 * stale PATH.tmp.PID of killed writers removed).
 * Returns TGM_OK; TGM_EIO when the file cannot be written; TGM_EINVAL for a
 * bad descriptor (unknown dtype, rank > 8, duplicate name, ...); TGM_ENOMEM.
 * The message in err names the file and the problem. */
int tgm_st_write(const char *path, const tgm_tensor_desc *t, int n, char *err, size_t errlen);
/* The same, with a checksum of the data in __metadata__ (verified by
 * tgm_st_read): for checkpoints and saved params. */
int tgm_st_write_checked(const char *path, const tgm_tensor_desc *t, int n, char *err, size_t errlen);

/* A file read fully into memory and its header parsed and validated
 * (header length, JSON syntax, dtypes, shapes, data_offsets inside the file
 * and consistent with dtype x numel, no overlaps). */
typedef struct tgm_st_file {
  unsigned char *buf;   /* the whole file */
  size_t size;
  int n;
  tgm_tensor_desc *t;   /* names point into allocated strings */
} tgm_st_file;
int tgm_st_read(const char *path, tgm_st_file *f, char *err, size_t errlen);
const tgm_tensor_desc *tgm_st_find(const tgm_st_file *f, const char *name);
void tgm_st_free(tgm_st_file *f);

/* ---------------------------------------------------------------- CPU kernels (tgm_cpu.c) */

/* The library calls of the generated passes (GEMMs, attention, embedding,
 * dropout) and the cast the model object uses; the pointwise, reduction, view
 * and loss kernels are generated per model (NAME_cpu.c, NAME_cuda.cu). */
void tgm_cpu_cast(int dt_in, int dt_out, const void *x, void *y, int64_t n); /* to i32 truncates; to bool x != 0 */
/*@uses matmul@*/
/* torch.matmul (1-D operands, broadcast batch dims); sy is the result shape */
void tgm_cpu_matmul(int dt, const void *a, int ra, const int64_t *sa, const void *b, int rb, const int64_t *sb,
                    void *y, int ry, const int64_t *sy);
/*@end matmul@*/
/*@uses linear@*/
/* y [rows, out] = x [rows, in] @ w[out, in]^T + b[out] (b may be NULL) */
void tgm_cpu_linear(int dt, const void *x, const void *w, const void *b, void *y, int64_t rows, int64_t in,
                    int64_t out);
/*@end linear@*/
/* One (batched) GEMM with a fused epilogue, row-major. For b in [0, batch):
 *   T = op(A_b) @ op(B_b)       op(A_b) is [M, K]: A_b = A + b*sa (elements); ta = 0: stored [M, K] with row
 *                               stride lda (>= K); ta = 1: stored [K, M] (lda >= M) and transposed. op(B_b) is
 *                               [K, N] likewise (tb = 1: stored [N, K], the nn.Linear weight layout).
 *   T += bias[n]                bias: length N, broadcast over rows and batch (NULL: none)
 *   if aux: aux_b[m, n] = T     the pre-activation values, for a backward (C's layout: ldc, sc)
 *   T = act(T)                  TGM_ACT_NONE, TGM_ACT_RELU, TGM_ACT_GELU (erf form), TGM_ACT_GELU_TANH
 *                               (dact: instead of the two lines above, T = T * act'(aux_b[m, n]), aux an input:
 *                               an activation's backward, gelu forms only)
 *   T += residual_b[m, n]       residual (NULL: none), C's layout; may be C itself
 *   C_b[m, n] = accumulate ? C_b[m, n] + T : T      (ldc >= N; C_b = C + b*sc)
 * Batch strides of A and B may be 0 (broadcast); sc may be 0 only when batch <= 1. All floating operands
 * have dtype dt (TGM_F32, TGM_BF16, TGM_F16); products are summed in f32 and each output rounded at the
 * store; with bf16/f16 and an activation (not dact) T is also rounded to dt before the activation and, when
 * a residual or accumulation follows, after it: where the model's own ops round, so that a fused GEMM gives
 * the bits of the ops one by one (a kernel that recomputes the activation's result compares equal to it, as
 * a mask x == amax(x) needs). Except on CUDA where cuBLASLt's own epilogue does the whole request (an
 * activation with no residual or accumulation: it applies the activation to the unrounded sum). K = 0 makes
 * T = 0 (the epilogue still runs). C and aux must not overlap A, B, bias or each other (aux may be read by a
 * dact GEMM: then it must not overlap C). One struct rather than 20 arguments: callers set the fields they use, e.g.
 *   tgm_gemm g = {.dt = TGM_BF16, .tb = 1, .M = rows, .N = out, .K = in, .batch = 1, .A = x, .lda = in,
 *                 .B = w, .ldb = in, .C = y, .ldc = out, .bias = b};                  (y = x w^T + b) */
typedef struct tgm_gemm {
  int dt, ta, tb;
  int64_t M, N, K, batch;
  const void *A;
  int64_t lda, sa;
  const void *B;
  int64_t ldb, sb;
  void *C;
  int64_t ldc, sc;
  const void *bias;     /* [N] or NULL */
  int act;              /* TGM_ACT_* */
  void *aux;            /* NULL, or the pre-activation output in C's layout (ldc, sc) */
  const void *residual; /* NULL, or added after the activation, in C's layout */
  int accumulate;       /* 1: C += T instead of C = T */
  int dact;             /* 1: T *= act'(aux) (aux read: the activation's input) instead of aux = T, T = act(T) */
  void *bgrad;          /* NULL, or [M]: bgrad[m] = sum over k of op(A)[m, k] (a bias's gradient beside its
                           weight's), summed in f32 or better, stored in dt; batch 1 only */
} tgm_gemm;
enum { TGM_ACT_NONE, TGM_ACT_RELU, TGM_ACT_GELU, TGM_ACT_GELU_TANH };
/* g as one GEMM of batch x M rows where that is the same computation: B shared by the batch (sb 0), A not
 * transposed, and A's and C's rows running on from one batch element into the next (sa = M lda, sc = M ldc;
 * aux and residual follow C). A linear layer's backward over [B, T, C] is such a batch. Else g itself.
 * (tgm_cpu_gemm folds; on CUDA cuBLASLt's batched call measured as fast as the folded one on GPT-2.) */
static inline tgm_gemm tgm_gemm_folded(const tgm_gemm *g) {
  tgm_gemm f = *g;
  if (g->batch > 1 && g->sb == 0 && !g->ta && !g->bgrad && g->sa == g->M * g->lda && g->sc == g->M * g->ldc) {
    f.M = g->M * g->batch;
    f.batch = 1;
    f.sa = f.sc = 0;
  }
  return f;
}
/* Returns 0, or -1 for bad arguments (then nothing is written). Deterministic: the same bits for any
 * thread count (with the built-in GEMM; f32 GEMMs go through cblas_sgemm when built with TGM_HAVE_CBLAS,
 * whose order of summation is the BLAS's). */
int tgm_cpu_gemm(const tgm_gemm *g);
/*@uses embedding@*/
/* y [n, D] = table[idx[i]]; returns -1, or the first i with idx[i] outside [0, V) */
int64_t tgm_cpu_embedding(int dt, const int32_t *idx, int64_t n, const void *table, int64_t V, int64_t D, void *y);
/*@end embedding@*/
/*@uses embedding_backward@*/
/* The table's gradient: out [V, D] = 0, then out[idx[p], :] += dy[p, :] for
 * p = 0, 1, ... n - 1 in that order, in f32 (stored once in dt: f32, bf16,
 * f16); deterministic (the same bits for any thread count). Returns -1, or
 * the first p with idx[p] outside [0, V) (then out is not written). */
int64_t tgm_cpu_embedding_backward(int dt, const int32_t *idx, int64_t n, const void *dy, int64_t V, int64_t D,
                                   void *out);
/*@end embedding_backward@*/
/*@uses dropout@*/
/* Training-mode dropout (gen/interp.c's eval_dropout): element j is kept iff
 * u >= p, u = ((r >> 8) + 0.5) 2^-24 from r = word 0 of tgm_philox4x32(ctr =
 * {j lo32, j hi32, step lo32, step hi32}, key = {seed lo32, seed hi32 ^
 * ordinal}); kept: y = f32(x) * (float)(1 / (1 - p)) rounded to dt, dropped:
 * y = +0; p >= 1 drops everything. The scale is applied in f32 (the
 * interpreter's in double: values agree to rounding, the mask exactly). */
void tgm_cpu_dropout(int dt, const void *x, void *y, int64_t n, double p, uint64_t seed, uint32_t ordinal,
                     uint64_t step);
/*@end dropout@*/
/*@uses attention attention_backward@*/
/* A tensor in strided memory, as the attention calls take their operands and results: element (i_0, ...,
 * i_{rank-1}) is at p + sum_k i_k st[k] (elements of the call's dtype), so that a head's rows can be read from
 * and written into the [B, T, NH * D] layout of the linears around them without a copy. The last dim's stride
 * is 1 and the row dim's (the one before it) at least the last dim's size, unless that dim has size 1; a batch
 * dim's stride is anything (0 repeats). A result must not overlap another result or an operand. p NULL: absent
 * (a result that is not wanted). */
typedef struct tgm_view {
  void *p;
  int rank;
  int64_t shape[TGM_MAXRANK];
  int64_t st[TGM_MAXRANK];
} tgm_view;
/*@end attention attention_backward@*/
/*@uses attention@*/
/* scaled_dot_product_attention: y [batch..., Tq, Dv] = softmax(S) v with S = scale q k^T (causal: -inf where
 * key j > query i), q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv] whose batch dims broadcast to y's. lse
 * (NULL: not wanted) gets each row's log-sum-exp of S in f32, contiguous [batch..., Tq] (the backward's input);
 * y->p may be NULL when only lse is wanted (y's shape still gives the batch dims). Never holds a Tq x Tk
 * matrix: per thread a block of score rows (128 x Tk) and one (batch, head)'s k and v packed for the GEMM. */
void tgm_cpu_attention(int dt, const tgm_view *q, const tgm_view *k, const tgm_view *v, const tgm_view *y, int causal,
                       double scale, float *lse);
/*@end attention@*/
/*@uses attention_backward@*/
/* attention's backward. dy has the forward result's shape [batch..., Tq, Dv]; lse is the forward's [batch...,
 * Tq] and delta[i] = sum_e dy[i, e] y[i, e] (both f32, contiguous). With P = exp(S - lse):
 *   dv = P^T dy,  dS = P (dy v^T - delta),  dq = scale dS k,  dk = scale dS^T q,
 * each over dy's batch dims (dq [batch..., Tq, D], dk [batch..., Tk, D], dv [batch..., Tk, Dv], in dt; the caller
 * sums the dims an operand broadcast over); a result whose p is NULL is not wanted. Sums in f32, each result
 * rounded once; deterministic (the same bits for any thread count); memory per thread as tgm_cpu_attention's. */
void tgm_cpu_attention_backward(int dt, const tgm_view *q, const tgm_view *k, const tgm_view *v, const tgm_view *dy,
                                const float *lse, const float *delta, const tgm_view *dq, const tgm_view *dk,
                                const tgm_view *dv, int causal, double scale);
/*@end attention_backward@*/

/* The optimizer step (tgm_optim_cpu.c), PyTorch 2.x semantics (torch.optim
 * AdamW / SGD, single-tensor path, maximize and amsgrad off, dampening 0, no
 * nesterov), over n elements of the flat parameter buffer.
 * w: f32 weights (the f32 master copy when the model dtype is bf16/f16);
 * g: gradients of dtype gdt (f32/bf16/f16), loaded to f32 and multiplied by
 *    grad_scale first (the clip factor; 1 = none);
 * lowp (may be NULL): a copy of w in dtype lowdt (bf16/f16, or f32) refreshed
 *    from w after the update, rounded to nearest even (the model's bf16/f16
 *    params); the CPU ignores another lowdt, CUDA refuses it;
 * step: the 1-based step count (bias correction; SGD's first-step momentum).
 * Per-element math in f32, the scalar factors in double rounded to f32, as
 * torch does for f32 params. No allocation; OpenMP-parallel. */
void tgm_cpu_adamw(float *w, const void *g, int gdt, float *m, float *v, void *lowp, int lowdt, int64_t n, double lr,
                   double beta1, double beta2, double eps, double weight_decay, int64_t step, double grad_scale);
void tgm_cpu_sgd(float *w, const void *g, int gdt, float *buf, void *lowp, int lowdt, int64_t n, double lr,
                 double momentum, double weight_decay, int64_t step, double grad_scale);
/* sum of x[i]^2 in double (for clip_grad_norm_); deterministic: a fixed
 * reduction order, independent of the thread count */
double tgm_cpu_sum_squares(const void *x, int dt, int64_t n);
/* the clip factor of torch.nn.utils.clip_grad_norm_: min(1, max_norm / (sqrt(sum_squares) + 1e-6)) */
double tgm_clip_factor(double sum_squares, double max_norm);

/* ---------------------------------------------------------------- CUDA kernels (tgm_cuda.cu) */

/* The same operations on device pointers, enqueued on the context's stream.
 * Each returns 0, or a CUDA/cuBLAS error code with a message in the context.
 * Data errors (embedding indices, cross-entropy targets) are recorded in
 * cx->d_bad (device int64: the smallest bad position, INT64_MAX if none) and
 * checked by the caller after synchronising. */
typedef struct tgm_cuda_ctx tgm_cuda_ctx;
int tgm_cuda_ctx_create(tgm_cuda_ctx **cx, char *err, size_t errlen); /* picks the current device */
int tgm_cuda_use_device(int device, char *err, size_t errlen);        /* makes device current (cudaSetDevice) */
void tgm_cuda_ctx_destroy(tgm_cuda_ctx *cx);
const char *tgm_cuda_ctx_error(const tgm_cuda_ctx *cx);
int tgm_cuda_sync(tgm_cuda_ctx *cx);                 /* waits; reports asynchronous errors */
int tgm_cuda_bad_index(tgm_cuda_ctx *cx, int64_t *pos); /* reads and resets d_bad; pos = -1 if none */
unsigned long long *tgm_cuda_bad_ptr(tgm_cuda_ctx *cx); /* d_bad, for generated kernels' atomicMin */
/* The scratch of the generated reductions split over several blocks per
 * output tile (tgen keeps every kernel within these sizes): the blocks'
 * partials, and per tile a count of the blocks done, zero between kernels
 * (the last block resets it). Only the context's stream uses them. */
#define TGM_CUDA_SPLIT_PARTS (1 << 21) /* gen/render.c's SPLIT_PARTS */
#define TGM_CUDA_SPLIT_TILES 1024
float *tgm_cuda_split_part(tgm_cuda_ctx *cx);
unsigned *tgm_cuda_split_count(tgm_cuda_ctx *cx);
int tgm_cuda_malloc(tgm_cuda_ctx *cx, void **p, size_t n);
void tgm_cuda_free(tgm_cuda_ctx *cx, void *p);
void tgm_cuda_ctx_memory(const tgm_cuda_ctx *cx, size_t *now, size_t *peak); /* device bytes held, now and at most */
int tgm_cuda_memcpy(tgm_cuda_ctx *cx, void *dst, const void *src, size_t n, int kind); /* 0 h2d, 1 d2h, 2 d2d */

int tgm_cuda_cast(tgm_cuda_ctx *cx, int dt_in, int dt_out, const void *x, void *y, int64_t n);
int tgm_cuda_fill(tgm_cuda_ctx *cx, int dt, void *y, int64_t n, double v); /* every element = v rounded to dt */
/*@uses matmul@*/
int tgm_cuda_matmul(tgm_cuda_ctx *cx, int dt, const void *a, int ra, const int64_t *sa, const void *b, int rb,
                    const int64_t *sb, void *y, int ry, const int64_t *sy);
/*@end matmul@*/
/*@uses linear@*/
int tgm_cuda_linear(tgm_cuda_ctx *cx, int dt, const void *x, const void *w, const void *b, void *y, int64_t rows,
                    int64_t in, int64_t out);
/*@end linear@*/
/* tgm_cpu_gemm's operation on device pointers, through cuBLASLt (f32 compute, no TF32) with its fused
 * epilogues where they express the request (bias, relu, tanh-gelu, gelu aux, a residual or accumulation
 * through beta = 1); the rest (erf gelu, an activation followed by a residual or accumulation, relu or no
 * activation with aux) in one pointwise kernel after the product: the product is written into C (bf16/f16:
 * with the bias, rounded to C's dtype, as PyTorch's linear rounds before its activation), or into f32
 * scratch when C's old values are still needed (accumulation, a residual or aux in C's place). Returns 0 or
 * an error code with a message in cx. */
int tgm_cuda_gemm(tgm_cuda_ctx *cx, const tgm_gemm *g);
/*@uses embedding@*/
int tgm_cuda_embedding(tgm_cuda_ctx *cx, int dt, const int32_t *idx, int64_t n, const void *table, int64_t V, int64_t D,
                       void *y);
/*@end embedding@*/
/*@uses embedding_backward@*/
/* As tgm_cpu_embedding_backward, the same bits (positions in order, f32);
 * a bad index records its position in d_bad and its dy row is left out.
 * Uses the context's scratch (a CUB radix sort of the indices). */
int tgm_cuda_embedding_backward(tgm_cuda_ctx *cx, int dt, const int32_t *idx, int64_t n, const void *dy, int64_t V,
                                int64_t D, void *out);
/*@end embedding_backward@*/
/*@uses dropout@*/
/* As tgm_cpu_dropout, the same bits (the same mask; one f32 multiply and a
 * round-to-nearest-even store on both). */
int tgm_cuda_dropout(tgm_cuda_ctx *cx, int dt, const void *x, void *y, int64_t n, double p, uint64_t seed,
                     uint32_t ordinal, uint64_t step);
/*@end dropout@*/
/*@uses attention@*/
int tgm_cuda_attention(tgm_cuda_ctx *cx, int dt, const tgm_view *q, const tgm_view *k, const tgm_view *v,
                       const tgm_view *y, int causal, double scale, float *lse);
/*@end attention@*/
/*@uses attention_backward@*/
int tgm_cuda_attention_backward(tgm_cuda_ctx *cx, int dt, const tgm_view *q, const tgm_view *k, const tgm_view *v,
                                const tgm_view *dy, const float *lse, const float *delta, const tgm_view *dq,
                                const tgm_view *dk, const tgm_view *dv, int causal, double scale);
/*@end attention_backward@*/

/* The optimizer step on device pointers (tgm_optim_cuda.cu): the same
 * semantics and arguments as tgm_cpu_adamw / tgm_cpu_sgd, enqueued on the
 * context's stream (grid-stride kernels, no allocation, no synchronisation). */
int tgm_cuda_adamw(tgm_cuda_ctx *cx, float *w, const void *g, int gdt, float *m, float *v, void *lowp, int lowdt,
                   int64_t n, double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step,
                   double grad_scale);
int tgm_cuda_sgd(tgm_cuda_ctx *cx, float *w, const void *g, int gdt, float *buf, void *lowp, int lowdt, int64_t n,
                 double lr, double momentum, double weight_decay, int64_t step, double grad_scale);
/* sum of x[i]^2 in double into *host_result: two deterministic phases (per-
 * block partials, then one block over them in a fixed order; the grid does
 * not depend on the device); uses the context's scratch and synchronises. */
int tgm_cuda_sum_squares(tgm_cuda_ctx *cx, const void *x, int dt, int64_t n, double *host_result);

/* The device-driven optimizer step (no host read-back; a CUDA graph may
 * capture it): the state (tgm_cuda_opt_new, zeroed device memory freed with
 * tgm_cuda_free) holds the step count, one sum of squares per run of params
 * and the prepare kernel's decision. A step is: opt_sum_squares for every
 * run, opt_prepare (refuses the step when the global norm is not finite or
 * the context's d_bad records bad data; else the clip factor and step + 1),
 * then opt_adamw / opt_sgd for every run (no-ops when refused).
 * opt_report waits for the stream and reads the step count and the first
 * refused step since the last report (0: none) with its sum of squares (NaN
 * or inf; 0 for bad data), then forgets the refusal. */
typedef struct tgm_opt_hyper {
  int optimizer; /* 1 sgd, 2 adamw */
  double lr, beta1, beta2, eps, weight_decay, momentum, grad_clip;
} tgm_opt_hyper;
int tgm_cuda_opt_new(tgm_cuda_ctx *cx, int nruns, void **state);
int tgm_cuda_opt_sum_squares(tgm_cuda_ctx *cx, void *state, int nruns, int run, const void *x, int dt, int64_t n);
int tgm_cuda_opt_prepare(tgm_cuda_ctx *cx, void *state, int nruns, const tgm_opt_hyper *h);
int tgm_cuda_opt_adamw(tgm_cuda_ctx *cx, const void *state, float *w, const void *g, int gdt, float *m, float *v,
                       void *lowp, int lowdt, int64_t n);
int tgm_cuda_opt_sgd(tgm_cuda_ctx *cx, const void *state, float *w, const void *g, int gdt, float *buf, int mom,
                     void *lowp, int lowdt, int64_t n);
int tgm_cuda_opt_set_step(tgm_cuda_ctx *cx, void *state, int64_t step);
int tgm_cuda_opt_report(tgm_cuda_ctx *cx, void *state, int64_t *step, int64_t *bad_step, double *bad_ss);

/* Streams and graphs. set_stream: the stream every later call enqueues on
 * (NULL: the context's own); the caller keeps it alive. A graph records the
 * calls between graph_begin and graph_end (nothing may wait for the stream
 * in between) and graph_launch replays them; graph_free releases one.
 * generation counts the reallocations of the context's scratch: a graph
 * recorded under another generation holds a freed pointer. */
int tgm_cuda_set_stream(tgm_cuda_ctx *cx, void *stream);
int tgm_cuda_set_tune(tgm_cuda_ctx *cx, int on, const char *file); /* max-autotune; file NULL: in memory only */
int tgm_cuda_graph_begin(tgm_cuda_ctx *cx);
int tgm_cuda_graph_end(tgm_cuda_ctx *cx, void **graph);
int tgm_cuda_graph_launch(tgm_cuda_ctx *cx, void *graph);
void tgm_cuda_graph_free(void *graph);
unsigned tgm_cuda_ctx_generation(const tgm_cuda_ctx *cx);

/* For kernel files other than tgm_cuda.cu (tgm_optim_cuda.cu), which cannot
 * see struct tgm_cuda_ctx: record the entry point running (for messages) and
 * get the stream; record a failure ("OP: message", returns code, or
 * cudaErrorUnknown when code is 0); get the growable scratch (at least
 * `bytes`, valid until the next call that asks for more). */
#ifdef __CUDACC__
cudaStream_t tgm_cuda_ctx_stream(tgm_cuda_ctx *cx, const char *op);
#endif
int tgm_cuda_ctx_fail(tgm_cuda_ctx *cx, int code, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 3, 4)))
#endif
    ;
int tgm_cuda_ctx_scratch(tgm_cuda_ctx *cx, size_t bytes, void **p);

/* ---------------------------------------------------------------- the model (tgm_model.c) */

/* Compile-time description of the model, generated by tgen into NAME_common.c. */
typedef struct tgm_param_info {
  const char *name;       /* internal name: "h.0.up" */
  const char *ckpt;       /* checkpoint name */
  int dtype, rank;
  int64_t shape[TGM_MAXRANK];
  int64_t numel;
  int64_t offset;         /* bytes from the start of the params buffer */
  int init;               /* TGM_INIT_* */
  double a, b;            /* init arguments */
  int64_t state;          /* f32 element of its optimizer state (master copy, moments) */
} tgm_param_info;

/* Consecutive params of one dtype: bytes [b0, b1) of the params and the
 * gradients, n elements, at f32 element f of the flat optimizer state. The
 * optimizer makes one call per run (one for a model of one dtype). */
typedef struct tgm_param_run {
  int64_t b0, b1, n, f;
  int dt;
} tgm_param_run;

typedef struct tgm_io_info {
  const char *name;
  int dtype, rank;
} tgm_io_info;

typedef struct tgm_model_info {
  const char *name;
  int nsym, ndyn;               /* symbols: dynamic dims first, then derived sizes */
  const char *const *sym_names;
  const int64_t *dyn_max;
  int nparams;
  const tgm_param_info *params;
  int64_t param_bytes;
  int ninputs, noutputs;
  const tgm_io_info *inputs, *outputs;
  uint64_t seed;              /* params' init and dropout's mask */
  /* training (train: section; loss_name NULL when there is none) */
  const char *loss_name;
  int loss_dtype;
  int optimizer;              /* 0 none, 1 sgd, 2 adamw */
  double lr, beta1, beta2, eps, weight_decay, momentum;
  double grad_clip;           /* max global L2 norm; 0 = no clipping */
  int metric_output, metric_target; /* accuracy: logits output k vs i32 input k; -1 = none */
  int nruns;
  const tgm_param_run *runs;
  int64_t state_elems;        /* f32 elements of each optimizer state buffer */
  int need_master;            /* some params are bf16/f16: keep an f32 master copy */
  int nwrt;                   /* train.wrt: inputs whose gradients the train pass computes */
  const int *wrt;             /* the input index of each, in declaration order */
} tgm_model_info;
extern const tgm_model_info tgm_info;

/* Generated: derived sizes and the guards on dims (0, or TGM_EINVAL with a
 * message); shapes of inputs and outputs; each pass's arena. */
int tgm_compute_syms(const int64_t *dyn, int64_t *sym, char *err, size_t errlen);
void tgm_io_shape(int is_output, int k, const int64_t *sym, int64_t *shape);
enum { TGM_PASS_FORWARD, TGM_PASS_LOSS, TGM_PASS_TRAIN, TGM_NPASS };
/* The bytes of each pass's arena, planned by tgen for the dims' maxima (the
 * passes place their intermediates at offsets fixed at generation time). */
extern const int64_t tgm_pass_arena[TGM_NPASS];
/* Whether a pass uses dropout (its mask depends on the step: never replayed
 * from a CUDA graph), and the compile mode's default for graphs. */
extern const int tgm_pass_dropout[TGM_NPASS];
/* The inputs each pass reads (bit k: input k): an input a pass does not read
 * may be NULL in its call. */
extern const uint64_t tgm_pass_inputs[TGM_NPASS];
extern const int tgm_graphs_default;
extern const int tgm_tune_default; /* compile.mode max-autotune */

/*@uses distributed@*/
/* ---------------------------------------------------------------- data parallel (tgm_dist.cu) */

/* ZeRO-1 over nranks GPUs: the flat optimizer state's E f32 elements (the
 * state indices of tgm_param_run) in slices of S = ceil(E / nranks)
 * rounded up to 64 elements, so that a slice's params and gradients start
 * 128-byte aligned (runs start at multiples of 64 elements); rank r owns
 * [min(r S, E), min(r S + S, E)). */
static inline void tgm_shard(int64_t E, int nranks, int r, int64_t *lo, int64_t *hi) {
  int64_t S = ((E + nranks - 1) / nranks + 63) / 64 * 64;
  *lo = (int64_t)r * S < E ? (int64_t)r * S : E;
  *hi = *lo + S < E ? *lo + S : E;
}

/* A data-parallel rank: its place, the slice of the state it keeps and
 * updates, and its NCCL communicator (NULL: a simulated rank, which keeps and
 * updates only its slice but exchanges nothing: the CPU test of the
 * sharded arithmetic, tgm_dist_simulate). */
typedef struct tgm_dist {
  int rank, nranks;
  void *comm;
  /* the training step's gradients, averaged in buckets as the backward
   * finishes them (tgm_dist_ready): mode 0 none, 1 all-reduce (forward_backward),
   * 2 reduce into each slice's owner (train_step); per param, 1 once enqueued */
  int mode;
  unsigned char *sent;
  int *bucket, nbucket;
  int64_t bucket_bytes;
} tgm_dist;
struct tgm_model;
int tgm_dist_simulate(struct tgm_model *m, int rank, int nranks); /* before the first training call */
/* Called by the generated train pass after the kernel that finishes the
 * gradients of params ks[0..n): on a rank, once a bucket's worth is final
 * (TGM_BUCKET_BYTES), the ranks start averaging it on the side stream. */
int tgm_dist_ready(struct tgm_model *m, const int *ks, int n);
#define TGM_BUCKET_BYTES ((int64_t)32 << 20)

/* NCCL, enqueued on the context's stream (each returns 0, or an error with
 * its message in the context). A part is n elements of dtype dt (a TGM_*
 * float dtype, or TGM_NCCL_F64) at p; root is the rank that owns it. */
enum { TGM_NCCL_F64 = 16 };
typedef struct tgm_nccl_part {
  void *p;
  int64_t n;
  int dt, root;
} tgm_nccl_part;
#define TGM_NCCL_ID_BYTES 128
int tgm_nccl_available(void); /* 0: built without NCCL (-DTGM_NCCL=OFF) */
int tgm_nccl_new_id(void *id, char *err, size_t errlen); /* TGM_NCCL_ID_BYTES bytes */
/* comm: the communicator and a side stream (tgm_nccl_init; freed by tgm_nccl_free) */
int tgm_nccl_init(tgm_cuda_ctx *cx, void **comm, int rank, int nranks, const void *id);
void tgm_nccl_free(void *comm);
/* every part summed over the ranks (avg: then divided by nranks), in place on every rank; side: on the side
 * stream, after the work enqueued so far on the context's stream (tgm_nccl_join waits for it there) */
int tgm_nccl_all_reduce(tgm_cuda_ctx *cx, void *comm, const tgm_nccl_part *parts, int nparts, int avg, int side);
/* each part averaged over the ranks into its root's copy (the others' copies are left as they were) */
int tgm_nccl_reduce_avg(tgm_cuda_ctx *cx, void *comm, const tgm_nccl_part *parts, int nparts, int side);
/* the context's stream waits for what the side stream has been given */
int tgm_nccl_join(tgm_cuda_ctx *cx, void *comm);
/* each part copied from its root to every rank */
int tgm_nccl_broadcast(tgm_cuda_ctx *cx, void *comm, const tgm_nccl_part *parts, int nparts);
/* rank 0 receives part q (f32) from rank q; rank q sends `mine` (its part q's length) */
int tgm_nccl_gather(tgm_cuda_ctx *cx, void *comm, int rank, const float *mine, const tgm_nccl_part *parts,
                    int nparts);
/* The NCCL unique id from a rendezvous: "file:PATH" (rank 0 creates the id
 * and writes PATH, which must not exist yet, atomically; the others wait for
 * it) or "tcp:HOST:PORT" (rank 0 listens on PORT; the others connect to
 * HOST:PORT). Waits up to timeout_s seconds for the other ranks. Host only. */
int tgm_rendezvous(const char *how, int rank, int nranks, double timeout_s, void *id, char *err, size_t errlen);
void tgm_rendezvous_done(const char *how, int rank); /* every rank joined: rank 0 removes the file */
/* The device optimizer's per-run sums of squares (device memory, nruns doubles). */
double *tgm_cuda_opt_sums(void *state);

/*@end distributed@*/
#define TGM_GRAPHS 8    /* CUDA graphs kept per model (round robin) */
#define TGM_GRAPH_IO 16 /* models with more inputs or outputs run without graphs */
struct tgm_model {
  int device;              /* 0 cpu, 1 cuda */
  unsigned char *params;   /* host (cpu) or device (cuda) */
  unsigned char *ws;       /* the arena: every intermediate of a pass (the largest pass's size) */
  int64_t ws_bytes;
  /* training state (allocated by the first forward_backward / train_step) */
  unsigned char *grads;    /* gradients, the params' layout (device memory on cuda) */
  float *master;           /* f32 copy of the params the optimizer updates (NULL: the params are f32) */
  float *opt_m, *opt_v;    /* AdamW moments / SGD momentum buffer (opt_m), f32, flat */
  int master_stale;        /* params changed outside the optimizer: refresh master first */
  int64_t step;            /* optimizer steps taken (dropout's step; AdamW's t - 1); on cuda the steps
                              enqueued, set from the device's count whenever the model waits for it */
  unsigned char *loss;     /* the loss pass's and train pass's loss (the loss dtype; device memory on cuda) */
  unsigned char *igrad;    /* train.wrt: where the input gradients go when the caller gives no buffers */
  int64_t igrad_bytes;
  int64_t state_lo, state_hi; /* the optimizer state kept here: elements [lo, hi) of the flat state (all of it,
                                 except on a data-parallel rank) */
  int threads;             /* OpenMP threads of the model's host work (tgm_set_threads; 0: OpenMP's default) */
  tgm_cuda_ctx *cx;
  void *opt;               /* cuda: the device-driven optimizer's state (tgm_cuda_opt_new) */
  int step_dirty;          /* cuda: m->step was set on the host; the device's count must follow */
  int graphs;              /* cuda: record each pass (and train step) as a CUDA graph and replay it */
  struct tgm_graph {       /* cuda: recorded graphs, by what they were recorded with */
    void *exec;            /* NULL: seen once (the next call with this key records) */
    int pass, used, eager; /* used: the clock at the last use (0: free); eager: cannot be recorded */
    unsigned gen, ws_gen;  /* the context's scratch generation and the workspace's when recorded */
    const void *in[TGM_GRAPH_IO];
    void *out[TGM_GRAPH_IO];
    int64_t sym[16];
  } graph[TGM_GRAPHS];
  int graph_clock;
  unsigned ws_gen;         /* workspace reallocations */
/*@uses distributed@*/
  struct tgm_dist *dist;   /* data parallel (tgm_dist_init); NULL: one GPU */
/*@end distributed@*/
  char err[512];
};
int tgm_fail(struct tgm_model *m, int code, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* The generated passes (NAME_cpu.c, NAME_cuda.cu): forward: out[k] =
 * output k; loss, train: out[0] = m->loss (the loss in its dtype, device
 * memory on cuda); train writes m->grads and out[1 + j] = the gradient of
 * input tgm_info.wrt[j]. A CUDA pass only enqueues work: it never waits for
 * the stream, so a graph may record it. */
typedef int (*tgm_pass_fn)(struct tgm_model *m, const int64_t *sym, const void *const *in, void *const *out);
int tgm_forward_cpu(struct tgm_model *m, const int64_t *sym, const void *const *in, void *const *out);
int tgm_loss_cpu(struct tgm_model *m, const int64_t *sym, const void *const *in, void *const *out);
int tgm_train_cpu(struct tgm_model *m, const int64_t *sym, const void *const *in, void *const *out);
int tgm_forward_cuda(struct tgm_model *m, const int64_t *sym, const void *const *in, void *const *out);
int tgm_loss_cuda(struct tgm_model *m, const int64_t *sym, const void *const *in, void *const *out);
int tgm_train_cuda(struct tgm_model *m, const int64_t *sym, const void *const *in, void *const *out);

#ifdef __cplusplus
}
#endif
#endif
