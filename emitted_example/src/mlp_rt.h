/* mlp_rt.h: the runtime shared by every emitted model (internal header).
 *
 * This is a template: tgen copies it into the emitted project as
 * src/NAME_rt.h, replacing every "mlp_" with "NAME_" and "MLP_" with
 * "NAME_" upper-cased. It compiles on its own as the runtime of a model
 * called "mlp", which is how the runtime's own tests build it.
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
 *   the CPU kernel library (mlp_cpu.c)  and  the CUDA kernel library (mlp_cuda.cu)
 *
 * Conventions for every kernel: tensors are dense row-major; `dt` is the
 * storage dtype of the floating operands (MLP_F32, MLP_BF16, MLP_F16; some
 * ops also take MLP_I32); arithmetic is done in f32 for floating dtypes
 * (accumulations in f32 too; the CPU path accumulates long reductions in
 * double where that is free) and exactly for i32. Shapes are `int rank,
 * const int64_t *shape`; a rank-0 tensor has one element. Broadcasting
 * follows NumPy: trailing dims align, size-1 (or missing) dims repeat. */
#ifndef MLP_RT_H
#define MLP_RT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MLP_MAXRANK 8
/* Workspace buffers start at 256-byte boundaries. */
#define MLP_ALIGN(n) (((int64_t)(n) + 255) & ~(int64_t)255)
/* Generated locals that a given model may not use. */
#define MLP_UNUSED __attribute__((unused))

/* ---------------------------------------------------------------- dtypes */

enum { MLP_F32 = 0, MLP_BF16 = 1, MLP_F16 = 2, MLP_I32 = 3, MLP_BOOL = 4 };
extern const char *const mlp_dtype_names[5];      /* "f32", "bf16", ...          */
extern const char *const mlp_dtype_st_names[5];   /* safetensors: "F32", "BF16", "F16", "I32", "BOOL" */
extern const int mlp_dtype_sizes[5];              /* 4, 2, 2, 4, 1               */

float mlp_bf16_to_f32(uint16_t h);
uint16_t mlp_f32_to_bf16(float f);  /* round to nearest even; NaN stays NaN */
float mlp_f16_to_f32(uint16_t h);
uint16_t mlp_f32_to_f16(float f);   /* round to nearest even; overflow -> inf */

/* The same conversions inline, for hot loops (the CPU kernels, mlp_cpu.c, and
 * the optimizer, mlp_optim_cpu.c): bit-identical to the functions above but
 * written with bit masks instead of branches, so that loops over them
 * vectorise; always inlined, even where gcc's unit-growth limit is reached
 * (the ISA clones reach it), or the loops do not vectorise. Helpers:
 * mlp_bits_f / mlp_f_bits reinterpret; mlp_mask(c) is all ones when c holds;
 * mlp_sel(m, a, b) takes a where m is set, else b (a select that vectorises
 * where ?: on floats does not: gcc will not if-convert under trapping math). */
#if defined(__GNUC__) || defined(__clang__)
#define MLP_HOT static inline __attribute__((always_inline))
#else
#define MLP_HOT static inline
#endif

/* MLP_CLONES before a leaf function (no OpenMP parallel region inside: the
 * region's body is a function the compiler makes, which would not inherit
 * the attribute) compiles it three times, for AVX-512, AVX2 and the baseline,
 * the best one for the CPU picked at load time (an ifunc: gcc and clang on
 * x86 with glibc); elsewhere, or with -DMLP_NO_ISA_DISPATCH, it is nothing
 * and the function is compiled once, for the compiler's target. The hot loops
 * of the runtime (mlp_cpu.c) and of the generated kernels (NAME_cpu.c) use
 * it; MLP_HOT helpers they call are compiled into each copy. The AVX-512 copy
 * may contract a * b + c into one FMA (gcc's default): within mlp_math.h's
 * stated errors, but not always the baseline's last bit; with -ffp-contract=off
 * the generated kernels' copies give the baseline's bits (tests/isa_dispatch.sh). */
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) &&                          \
    defined(__GLIBC__) && defined(__has_attribute) && !defined(MLP_NO_ISA_DISPATCH)
#if __has_attribute(target_clones)
#define MLP_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef MLP_CLONES
#define MLP_CLONES
#endif

MLP_HOT float mlp_bits_f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
MLP_HOT uint32_t mlp_f_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
MLP_HOT uint32_t mlp_mask(int c) { return (uint32_t)0 - (uint32_t)(c != 0); }
MLP_HOT float mlp_sel(uint32_t m, float a, float b) {
  return mlp_bits_f((mlp_f_bits(a) & m) | (mlp_f_bits(b) & ~m));
}

MLP_HOT float mlp_ld_bf16(uint16_t h) { return mlp_bits_f((uint32_t)h << 16); }

/* Round to nearest even on the bits; NaN stays a quiet NaN of the same sign. */
MLP_HOT uint16_t mlp_st_bf16(float f) {
  uint32_t u = mlp_f_bits(f), nan = mlp_mask((u & 0x7fffffffu) > 0x7f800000u);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x0040u;
  return (uint16_t)((r & ~nan) | (q & nan));
}

/* Exact: normals rebias the exponent, inf/NaN keep the payload, subnormals
 * come out of one exact subtraction (2^-14 (1 + m/1024) - 2^-14). */
MLP_HOT float mlp_ld_f16(uint16_t h) {
  uint32_t o = (uint32_t)(h & 0x7fffu) << 13, e = o & 0x0f800000u;
  uint32_t inf = mlp_mask(e == 0x0f800000u), zero = mlp_mask(e == 0);
  o += 0x38000000u + (0x38000000u & inf);
  uint32_t sub = mlp_f_bits(mlp_bits_f(o + 0x00800000u) - mlp_bits_f(0x38800000u));
  o = (o & ~zero) | (sub & zero);
  return mlp_bits_f(o | ((uint32_t)(h & 0x8000u) << 16));
}

/* Round to nearest even: 10 fraction bits for normals, a quantum of 2^-24 for
 * subnormals (rounded by adding 2^23), 65520 and above to inf. */
MLP_HOT uint16_t mlp_st_f16(float f) {
  uint32_t u = mlp_f_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  uint32_t nanv = 0x7e00u | ((a >> 13) & 0x3ffu);
  uint32_t norm = (a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
  uint32_t sub = mlp_f_bits(mlp_bits_f(a) * 16777216.0f + 8388608.0f) - 0x4b000000u;
  uint32_t isnan = mlp_mask(a > 0x7f800000u), isinf = mlp_mask(a >= 0x477ff000u), isnorm = mlp_mask(a >= 0x38800000u);
  uint32_t r = (norm & isnorm) | (sub & ~isnorm);
  r = (0x7c00u & isinf) | (r & ~isinf);
  r = (nanv & isnan) | (r & ~isnan);
  return (uint16_t)(sign | (r & 0xffffu));
}

/* Element i of a typed host buffer, as a double; and the store back (rounding
 * to bf16/f16, truncating to i32, bool = v != 0). For tables and tests, not
 * for hot loops. */
static inline double mlp_get(const void *p, int dt, int64_t i) {
  switch (dt) {
  case MLP_F32: return ((const float *)p)[i];
  case MLP_BF16: return mlp_bf16_to_f32(((const uint16_t *)p)[i]);
  case MLP_F16: return mlp_f16_to_f32(((const uint16_t *)p)[i]);
  case MLP_I32: return ((const int32_t *)p)[i];
  default: return ((const uint8_t *)p)[i];
  }
}

static inline void mlp_put(void *p, int dt, int64_t i, double v) {
  switch (dt) {
  case MLP_F32: ((float *)p)[i] = (float)v; break;
  case MLP_BF16: ((uint16_t *)p)[i] = mlp_f32_to_bf16((float)v); break;
  case MLP_F16: ((uint16_t *)p)[i] = mlp_f32_to_f16((float)v); break;
  case MLP_I32: ((int32_t *)p)[i] = (int32_t)v; break;
  default: ((uint8_t *)p)[i] = v != 0; break;
  }
}

/* ---------------------------------------------------------------- status */

/* Status codes of the public API (the public header mlp.h defines the same
 * enum under the same guard). Every failing call also leaves a message naming
 * what was wrong, e.g. "input 'x': dim 0 is 5000, above max 4096 (B)". */
#ifndef MLP_STATUS_DEFINED
#define MLP_STATUS_DEFINED
typedef enum mlp_status {
  MLP_OK = 0,
  MLP_EINVAL = 1,   /* bad argument (NULL pointer, unknown device, bad dims) */
  MLP_ESHAPE = 2,   /* a shape or dtype does not match the model */
  MLP_EIO = 3,      /* a file could not be read or written */
  MLP_ECORRUPT = 4, /* a file is not a valid checkpoint for this model */
  MLP_EDEVICE = 5,  /* CUDA unavailable or a CUDA call failed */
  MLP_ENOMEM = 6,   /* out of host or device memory */
  MLP_EDATA = 7     /* bad data at run time (an index out of range; train_step: a NaN or inf gradient norm) */
} mlp_status;
#endif

/* ---------------------------------------------------------------- init */

void mlp_philox4x32(uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
uint32_t mlp_name_hash(const char *s); /* FNV-1a 32 */
enum { MLP_INIT_ZEROS = 1, MLP_INIT_ONES, MLP_INIT_NORMAL, MLP_INIT_UNIFORM, MLP_INIT_XAVIER_UNIFORM,
       MLP_INIT_KAIMING_UNIFORM };
/* Element i of a param: see spec/LANGUAGE.md "Params and initialisation".
 * Returns the value already rounded to `dtype` (as a double). */
double mlp_init_value(const char *name, int init, double a, double b, int dtype, int rank, const int64_t *shape,
                      uint64_t seed, int64_t i);

/* ---------------------------------------------------------------- safetensors */

typedef struct mlp_tensor_desc {
  const char *name;
  int dtype;
  int rank;
  int64_t shape[MLP_MAXRANK];
  const void *data;  /* host memory, row-major */
} mlp_tensor_desc;

/* Writes `n` tensors to `path` atomically (PATH.tmp.PID, fsync, rename;
 * stale PATH.tmp.PID of killed writers removed).
 * Returns MLP_OK; MLP_EIO when the file cannot be written; MLP_EINVAL for a
 * bad descriptor (unknown dtype, rank > 8, duplicate name, ...); MLP_ENOMEM.
 * The message in err names the file and the problem. */
int mlp_st_write(const char *path, const mlp_tensor_desc *t, int n, char *err, size_t errlen);
/* The same, with a checksum of the data in __metadata__ (verified by
 * mlp_st_read): for checkpoints and saved params. */
int mlp_st_write_checked(const char *path, const mlp_tensor_desc *t, int n, char *err, size_t errlen);

/* A file read fully into memory and its header parsed and validated
 * (header length, JSON syntax, dtypes, shapes, data_offsets inside the file
 * and consistent with dtype x numel, no overlaps). */
typedef struct mlp_st_file {
  unsigned char *buf;   /* the whole file */
  size_t size;
  int n;
  mlp_tensor_desc *t;   /* names point into allocated strings */
} mlp_st_file;
int mlp_st_read(const char *path, mlp_st_file *f, char *err, size_t errlen);
const mlp_tensor_desc *mlp_st_find(const mlp_st_file *f, const char *name);
void mlp_st_free(mlp_st_file *f);

/* ---------------------------------------------------------------- CPU kernels (mlp_cpu.c) */

/* The library calls of the generated passes (GEMMs, attention, embedding,
 * dropout) and the cast the model object uses; the pointwise, reduction, view
 * and loss kernels are generated per model (NAME_cpu.c, NAME_cuda.cu). */
void mlp_cpu_cast(int dt_in, int dt_out, const void *x, void *y, int64_t n); /* to i32 truncates; to bool x != 0 */
/* One (batched) GEMM with a fused epilogue, row-major. For b in [0, batch):
 *   T = op(A_b) @ op(B_b)       op(A_b) is [M, K]: A_b = A + b*sa (elements); ta = 0: stored [M, K] with row
 *                               stride lda (>= K); ta = 1: stored [K, M] (lda >= M) and transposed. op(B_b) is
 *                               [K, N] likewise (tb = 1: stored [N, K], the nn.Linear weight layout).
 *   T += bias[n]                bias: length N, broadcast over rows and batch (NULL: none)
 *   if aux: aux_b[m, n] = T     the pre-activation values, for a backward (C's layout: ldc, sc)
 *   T = act(T)                  MLP_ACT_NONE, MLP_ACT_RELU, MLP_ACT_GELU (erf form), MLP_ACT_GELU_TANH
 *                               (dact: instead of the two lines above, T = T * act'(aux_b[m, n]), aux an input:
 *                               an activation's backward, gelu forms only)
 *   T += residual_b[m, n]       residual (NULL: none), C's layout; may be C itself
 *   C_b[m, n] = accumulate ? C_b[m, n] + T : T      (ldc >= N; C_b = C + b*sc)
 * Batch strides of A and B may be 0 (broadcast); sc may be 0 only when batch <= 1. All floating operands
 * have dtype dt (MLP_F32, MLP_BF16, MLP_F16); products are summed in f32 and each output rounded at the
 * store; with bf16/f16 and an activation (not dact) T is also rounded to dt before the activation and, when
 * a residual or accumulation follows, after it: where the model's own ops round, so that a fused GEMM gives
 * the bits of the ops one by one (a kernel that recomputes the activation's result compares equal to it, as
 * a mask x == amax(x) needs). Except on CUDA where cuBLASLt's own epilogue does the whole request (an
 * activation with no residual or accumulation: it applies the activation to the unrounded sum). K = 0 makes
 * T = 0 (the epilogue still runs). C and aux must not overlap A, B, bias or each other (aux may be read by a
 * dact GEMM: then it must not overlap C). One struct rather than 20 arguments: callers set the fields they use, e.g.
 *   mlp_gemm g = {.dt = MLP_BF16, .tb = 1, .M = rows, .N = out, .K = in, .batch = 1, .A = x, .lda = in,
 *                 .B = w, .ldb = in, .C = y, .ldc = out, .bias = b};                  (y = x w^T + b) */
typedef struct mlp_gemm {
  int dt, ta, tb;
  int64_t M, N, K, batch;
  const void *A;
  int64_t lda, sa;
  const void *B;
  int64_t ldb, sb;
  void *C;
  int64_t ldc, sc;
  const void *bias;     /* [N] or NULL */
  int act;              /* MLP_ACT_* */
  void *aux;            /* NULL, or the pre-activation output in C's layout (ldc, sc) */
  const void *residual; /* NULL, or added after the activation, in C's layout */
  int accumulate;       /* 1: C += T instead of C = T */
  int dact;             /* 1: T *= act'(aux) (aux read: the activation's input) instead of aux = T, T = act(T) */
  void *bgrad;          /* NULL, or [M]: bgrad[m] = sum over k of op(A)[m, k] (a bias's gradient beside its
                           weight's), summed in f32 or better, stored in dt; batch 1 only */
} mlp_gemm;
enum { MLP_ACT_NONE, MLP_ACT_RELU, MLP_ACT_GELU, MLP_ACT_GELU_TANH };
/* g as one GEMM of batch x M rows where that is the same computation: B shared by the batch (sb 0), A not
 * transposed, and A's and C's rows running on from one batch element into the next (sa = M lda, sc = M ldc;
 * aux and residual follow C). A linear layer's backward over [B, T, C] is such a batch. Else g itself.
 * (mlp_cpu_gemm folds; on CUDA cuBLASLt's batched call measured as fast as the folded one on GPT-2.) */
static inline mlp_gemm mlp_gemm_folded(const mlp_gemm *g) {
  mlp_gemm f = *g;
  if (g->batch > 1 && g->sb == 0 && !g->ta && !g->bgrad && g->sa == g->M * g->lda && g->sc == g->M * g->ldc) {
    f.M = g->M * g->batch;
    f.batch = 1;
    f.sa = f.sc = 0;
  }
  return f;
}
/* Returns 0, or -1 for bad arguments (then nothing is written). Deterministic: the same bits for any
 * thread count (with the built-in GEMM; f32 GEMMs go through cblas_sgemm when built with MLP_HAVE_CBLAS,
 * whose order of summation is the BLAS's). */
int mlp_cpu_gemm(const mlp_gemm *g);

/* The optimizer step (mlp_optim_cpu.c), PyTorch 2.x semantics (torch.optim
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
void mlp_cpu_adamw(float *w, const void *g, int gdt, float *m, float *v, void *lowp, int lowdt, int64_t n, double lr,
                   double beta1, double beta2, double eps, double weight_decay, int64_t step, double grad_scale);
void mlp_cpu_sgd(float *w, const void *g, int gdt, float *buf, void *lowp, int lowdt, int64_t n, double lr,
                 double momentum, double weight_decay, int64_t step, double grad_scale);
/* sum of x[i]^2 in double (for clip_grad_norm_); deterministic: a fixed
 * reduction order, independent of the thread count */
double mlp_cpu_sum_squares(const void *x, int dt, int64_t n);
/* the clip factor of torch.nn.utils.clip_grad_norm_: min(1, max_norm / (sqrt(sum_squares) + 1e-6)) */
double mlp_clip_factor(double sum_squares, double max_norm);

/* ---------------------------------------------------------------- CUDA kernels (mlp_cuda.cu) */

/* The same operations on device pointers, enqueued on the context's stream.
 * Each returns 0, or a CUDA/cuBLAS error code with a message in the context.
 * Data errors (embedding indices, cross-entropy targets) are recorded in
 * cx->d_bad (device int64: the smallest bad position, INT64_MAX if none) and
 * checked by the caller after synchronising. */
typedef struct mlp_cuda_ctx mlp_cuda_ctx;
int mlp_cuda_ctx_create(mlp_cuda_ctx **cx, char *err, size_t errlen); /* picks the current device */
int mlp_cuda_use_device(int device, char *err, size_t errlen);        /* makes device current (cudaSetDevice) */
void mlp_cuda_ctx_destroy(mlp_cuda_ctx *cx);
const char *mlp_cuda_ctx_error(const mlp_cuda_ctx *cx);
int mlp_cuda_sync(mlp_cuda_ctx *cx);                 /* waits; reports asynchronous errors */
int mlp_cuda_bad_index(mlp_cuda_ctx *cx, int64_t *pos); /* reads and resets d_bad; pos = -1 if none */
unsigned long long *mlp_cuda_bad_ptr(mlp_cuda_ctx *cx); /* d_bad, for generated kernels' atomicMin */
/* The scratch of the generated reductions split over several blocks per
 * output tile (tgen keeps every kernel within these sizes): the blocks'
 * partials, and per tile a count of the blocks done, zero between kernels
 * (the last block resets it). Only the context's stream uses them. */
#define MLP_CUDA_SPLIT_PARTS (1 << 21) /* gen/render.c's SPLIT_PARTS */
#define MLP_CUDA_SPLIT_TILES 1024
float *mlp_cuda_split_part(mlp_cuda_ctx *cx);
unsigned *mlp_cuda_split_count(mlp_cuda_ctx *cx);
int mlp_cuda_malloc(mlp_cuda_ctx *cx, void **p, size_t n);
void mlp_cuda_free(mlp_cuda_ctx *cx, void *p);
void mlp_cuda_ctx_memory(const mlp_cuda_ctx *cx, size_t *now, size_t *peak); /* device bytes held, now and at most */
int mlp_cuda_memcpy(mlp_cuda_ctx *cx, void *dst, const void *src, size_t n, int kind); /* 0 h2d, 1 d2h, 2 d2d */

int mlp_cuda_cast(mlp_cuda_ctx *cx, int dt_in, int dt_out, const void *x, void *y, int64_t n);
int mlp_cuda_fill(mlp_cuda_ctx *cx, int dt, void *y, int64_t n, double v); /* every element = v rounded to dt */
/* mlp_cpu_gemm's operation on device pointers, through cuBLASLt (f32 compute, no TF32) with its fused
 * epilogues where they express the request (bias, relu, tanh-gelu, gelu aux, a residual or accumulation
 * through beta = 1); the rest (erf gelu, an activation followed by a residual or accumulation, relu or no
 * activation with aux) in one pointwise kernel after the product: the product is written into C (bf16/f16:
 * with the bias, rounded to C's dtype, as PyTorch's linear rounds before its activation), or into f32
 * scratch when C's old values are still needed (accumulation, a residual or aux in C's place). Returns 0 or
 * an error code with a message in cx. */
int mlp_cuda_gemm(mlp_cuda_ctx *cx, const mlp_gemm *g);

/* The optimizer step on device pointers (mlp_optim_cuda.cu): the same
 * semantics and arguments as mlp_cpu_adamw / mlp_cpu_sgd, enqueued on the
 * context's stream (grid-stride kernels, no allocation, no synchronisation). */
int mlp_cuda_adamw(mlp_cuda_ctx *cx, float *w, const void *g, int gdt, float *m, float *v, void *lowp, int lowdt,
                   int64_t n, double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step,
                   double grad_scale);
int mlp_cuda_sgd(mlp_cuda_ctx *cx, float *w, const void *g, int gdt, float *buf, void *lowp, int lowdt, int64_t n,
                 double lr, double momentum, double weight_decay, int64_t step, double grad_scale);
/* sum of x[i]^2 in double into *host_result: two deterministic phases (per-
 * block partials, then one block over them in a fixed order; the grid does
 * not depend on the device); uses the context's scratch and synchronises. */
int mlp_cuda_sum_squares(mlp_cuda_ctx *cx, const void *x, int dt, int64_t n, double *host_result);

/* The device-driven optimizer step (no host read-back; a CUDA graph may
 * capture it): the state (mlp_cuda_opt_new, zeroed device memory freed with
 * mlp_cuda_free) holds the step count, one sum of squares per run of params
 * and the prepare kernel's decision. A step is: opt_sum_squares for every
 * run, opt_prepare (refuses the step when the global norm is not finite or
 * the context's d_bad records bad data; else the clip factor and step + 1),
 * then opt_adamw / opt_sgd for every run (no-ops when refused).
 * opt_report waits for the stream and reads the step count and the first
 * refused step since the last report (0: none) with its sum of squares (NaN
 * or inf; 0 for bad data), then forgets the refusal. */
typedef struct mlp_opt_hyper {
  int optimizer; /* 1 sgd, 2 adamw */
  double lr, beta1, beta2, eps, weight_decay, momentum, grad_clip;
} mlp_opt_hyper;
int mlp_cuda_opt_new(mlp_cuda_ctx *cx, int nruns, void **state);
int mlp_cuda_opt_sum_squares(mlp_cuda_ctx *cx, void *state, int nruns, int run, const void *x, int dt, int64_t n);
int mlp_cuda_opt_prepare(mlp_cuda_ctx *cx, void *state, int nruns, const mlp_opt_hyper *h);
int mlp_cuda_opt_adamw(mlp_cuda_ctx *cx, const void *state, float *w, const void *g, int gdt, float *m, float *v,
                       void *lowp, int lowdt, int64_t n);
int mlp_cuda_opt_sgd(mlp_cuda_ctx *cx, const void *state, float *w, const void *g, int gdt, float *buf, int mom,
                     void *lowp, int lowdt, int64_t n);
int mlp_cuda_opt_set_step(mlp_cuda_ctx *cx, void *state, int64_t step);
int mlp_cuda_opt_report(mlp_cuda_ctx *cx, void *state, int64_t *step, int64_t *bad_step, double *bad_ss);

/* Streams and graphs. set_stream: the stream every later call enqueues on
 * (NULL: the context's own); the caller keeps it alive. A graph records the
 * calls between graph_begin and graph_end (nothing may wait for the stream
 * in between) and graph_launch replays them; graph_free releases one.
 * generation counts the reallocations of the context's scratch: a graph
 * recorded under another generation holds a freed pointer. */
int mlp_cuda_set_stream(mlp_cuda_ctx *cx, void *stream);
int mlp_cuda_set_tune(mlp_cuda_ctx *cx, int on, const char *file); /* max-autotune; file NULL: in memory only */
int mlp_cuda_graph_begin(mlp_cuda_ctx *cx);
int mlp_cuda_graph_end(mlp_cuda_ctx *cx, void **graph);
int mlp_cuda_graph_launch(mlp_cuda_ctx *cx, void *graph);
void mlp_cuda_graph_free(void *graph);
unsigned mlp_cuda_ctx_generation(const mlp_cuda_ctx *cx);

/* For kernel files other than mlp_cuda.cu (mlp_optim_cuda.cu), which cannot
 * see struct mlp_cuda_ctx: record the entry point running (for messages) and
 * get the stream; record a failure ("OP: message", returns code, or
 * cudaErrorUnknown when code is 0); get the growable scratch (at least
 * `bytes`, valid until the next call that asks for more). */
#ifdef __CUDACC__
cudaStream_t mlp_cuda_ctx_stream(mlp_cuda_ctx *cx, const char *op);
#endif
int mlp_cuda_ctx_fail(mlp_cuda_ctx *cx, int code, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 3, 4)))
#endif
    ;
int mlp_cuda_ctx_scratch(mlp_cuda_ctx *cx, size_t bytes, void **p);

/* ---------------------------------------------------------------- the model (mlp_model.c) */

/* Compile-time description of the model, generated by tgen into NAME_common.c. */
typedef struct mlp_param_info {
  const char *name;       /* internal name: "h.0.up" */
  const char *ckpt;       /* checkpoint name */
  int dtype, rank;
  int64_t shape[MLP_MAXRANK];
  int64_t numel;
  int64_t offset;         /* bytes from the start of the params buffer */
  int init;               /* MLP_INIT_* */
  double a, b;            /* init arguments */
  int64_t state;          /* f32 element of its optimizer state (master copy, moments) */
} mlp_param_info;

/* Consecutive params of one dtype: bytes [b0, b1) of the params and the
 * gradients, n elements, at f32 element f of the flat optimizer state. The
 * optimizer makes one call per run (one for a model of one dtype). */
typedef struct mlp_param_run {
  int64_t b0, b1, n, f;
  int dt;
} mlp_param_run;

typedef struct mlp_io_info {
  const char *name;
  int dtype, rank;
} mlp_io_info;

typedef struct mlp_model_info {
  const char *name;
  int nsym, ndyn;               /* symbols: dynamic dims first, then derived sizes */
  const char *const *sym_names;
  const int64_t *dyn_max;
  int nparams;
  const mlp_param_info *params;
  int64_t param_bytes;
  int ninputs, noutputs;
  const mlp_io_info *inputs, *outputs;
  uint64_t seed;              /* params' init and dropout's mask */
  /* training (train: section; loss_name NULL when there is none) */
  const char *loss_name;
  int loss_dtype;
  int optimizer;              /* 0 none, 1 sgd, 2 adamw */
  double lr, beta1, beta2, eps, weight_decay, momentum;
  double grad_clip;           /* max global L2 norm; 0 = no clipping */
  int metric_output, metric_target; /* accuracy: logits output k vs i32 input k; -1 = none */
  int nruns;
  const mlp_param_run *runs;
  int64_t state_elems;        /* f32 elements of each optimizer state buffer */
  int need_master;            /* some params are bf16/f16: keep an f32 master copy */
  int nwrt;                   /* train.wrt: inputs whose gradients the train pass computes */
  const int *wrt;             /* the input index of each, in declaration order */
} mlp_model_info;
extern const mlp_model_info mlp_info;

/* Generated: derived sizes and the guards on dims (0, or MLP_EINVAL with a
 * message); shapes of inputs and outputs; each pass's arena. */
int mlp_compute_syms(const int64_t *dyn, int64_t *sym, char *err, size_t errlen);
void mlp_io_shape(int is_output, int k, const int64_t *sym, int64_t *shape);
enum { MLP_PASS_FORWARD, MLP_PASS_LOSS, MLP_PASS_TRAIN, MLP_NPASS };
/* The bytes of each pass's arena, planned by tgen for the dims' maxima (the
 * passes place their intermediates at offsets fixed at generation time). */
extern const int64_t mlp_pass_arena[MLP_NPASS];
/* Whether a pass uses dropout (its mask depends on the step: never replayed
 * from a CUDA graph), and the compile mode's default for graphs. */
extern const int mlp_pass_dropout[MLP_NPASS];
/* The inputs each pass reads (bit k: input k): an input a pass does not read
 * may be NULL in its call. */
extern const uint64_t mlp_pass_inputs[MLP_NPASS];
extern const int mlp_graphs_default;
extern const int mlp_tune_default; /* compile.mode max-autotune */

#define MLP_GRAPHS 8    /* CUDA graphs kept per model (round robin) */
#define MLP_GRAPH_IO 16 /* models with more inputs or outputs run without graphs */
struct mlp_model {
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
  int threads;             /* OpenMP threads of the model's host work (mlp_set_threads; 0: OpenMP's default) */
  mlp_cuda_ctx *cx;
  void *opt;               /* cuda: the device-driven optimizer's state (mlp_cuda_opt_new) */
  int step_dirty;          /* cuda: m->step was set on the host; the device's count must follow */
  int graphs;              /* cuda: record each pass (and train step) as a CUDA graph and replay it */
  struct mlp_graph {       /* cuda: recorded graphs, by what they were recorded with */
    void *exec;            /* NULL: seen once (the next call with this key records) */
    int pass, used, eager; /* used: the clock at the last use (0: free); eager: cannot be recorded */
    unsigned gen, ws_gen;  /* the context's scratch generation and the workspace's when recorded */
    const void *in[MLP_GRAPH_IO];
    void *out[MLP_GRAPH_IO];
    int64_t sym[16];
  } graph[MLP_GRAPHS];
  int graph_clock;
  unsigned ws_gen;         /* workspace reallocations */
  char err[512];
};
int mlp_fail(struct mlp_model *m, int code, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* The generated passes (NAME_cpu.c, NAME_cuda.cu): forward: out[k] =
 * output k; loss, train: out[0] = m->loss (the loss in its dtype, device
 * memory on cuda); train writes m->grads and out[1 + j] = the gradient of
 * input mlp_info.wrt[j]. A CUDA pass only enqueues work: it never waits for
 * the stream, so a graph may record it. */
typedef int (*mlp_pass_fn)(struct mlp_model *m, const int64_t *sym, const void *const *in, void *const *out);
int mlp_forward_cpu(struct mlp_model *m, const int64_t *sym, const void *const *in, void *const *out);
int mlp_loss_cpu(struct mlp_model *m, const int64_t *sym, const void *const *in, void *const *out);
int mlp_train_cpu(struct mlp_model *m, const int64_t *sym, const void *const *in, void *const *out);
int mlp_forward_cuda(struct mlp_model *m, const int64_t *sym, const void *const *in, void *const *out);
int mlp_loss_cuda(struct mlp_model *m, const int64_t *sym, const void *const *in, void *const *out);
int mlp_train_cuda(struct mlp_model *m, const int64_t *sym, const void *const *in, void *const *out);

#ifdef __cplusplus
}
#endif
#endif
