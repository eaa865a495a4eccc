/* ir.h: tgen's graph IR and the passes over it.
 *
 * Files:   dim.c     symbolic sizes: polynomials over the dynamic dims
 *          build.c   Spec -> Graph (names resolved, blocks expanded, calls bound
 *                    to op signatures); calls infer for every node
 *          infer.c   shape and dtype rules, one per op-table rule
 *          verify.c  structural checks of a Graph (a bug if they fail)
 *          init.c    Philox-based parameter initialisation
 *          autodiff.c reverse mode: appends the backward of g->loss (grads)
 *          interp.c  the double-precision reference interpreter
 *          interp_train.c training steps in the interpreter (PyTorch's optimizers in double)
 *          partition.c the training schedule: saved activations vs recomputation
 *          dump.c    printing a Graph (tgen check --dump)
 *          explain.c tgen explain: kernels, costs, fusion and storage reasons
 *          main.c    the command line
 */
#ifndef TGEN_IR_H
#define TGEN_IR_H

#include "../spec/spec.h"

#define MAXRANK 8   /* tensor rank limit */
#define MAXSYM 8    /* dynamic dims + derived quotients per model */
#define MAXTERMS 4  /* terms in one symbolic size */

/* ---------------------------------------------------------------- dim.c */

/* A size: a polynomial over symbols with int64 coefficients, kept canonical
 * (terms sorted by exponents, no zero coefficients, n == 0 means 0), so two
 * sizes are equal iff their structs compare equal term by term. Static dims are
 * constants; each dynamic dim is a symbol. */
typedef struct Term {
  int64_t c;
  uint8_t e[MAXSYM]; /* exponent of each symbol */
} Term;

typedef struct Dim {
  int n;
  Term t[MAXTERMS];
} Dim;

typedef struct Sym {
  const char *name; /* "B", or "(B*T)/12" for a derived quotient */
  Loc loc;
  int derived;      /* value = num / den, checked to divide at run time */
  Dim num, den;
  int64_t max;      /* dynamic dims: the declared max */
} Sym;

typedef struct Graph Graph;

Dim dim_const(int64_t c);
Dim dim_sym(int s);
Dim dim_add(Dim a, Dim b, Loc l);       /* error_at on overflow or too many terms */
Dim dim_sub(Dim a, Dim b, Loc l);
Dim dim_mul(Dim a, Dim b, Loc l);
Dim dim_div(Graph *g, Dim a, Dim b, Loc l); /* exact, or a derived symbol; static: must divide */
/* Prefix for the errors the dim operations report ("in 'y': ", "input 'x': "). */
extern const char *dim_context;
int dim_eq(const Dim *a, const Dim *b);
int dim_is_const(const Dim *a, int64_t *v);
int dim_is_one(const Dim *a);
const char *dim_str(const Graph *g, const Dim *a);
/* Value for the given symbol values (vals[i] for symbol i; derived symbols are
 * computed). Returns 0 and sets *err on overflow or a quotient that does not
 * divide. */
int dim_eval(const Graph *g, const Dim *a, const int64_t *vals, int64_t *out, const char **err);
/* Bounds of a size over 1 <= sym <= max (corners; exact for the monotone
 * sizes the language produces). Returns 0 on int64 overflow. */
int dim_bounds(const Graph *g, const Dim *a, int64_t *lo, int64_t *hi);

/* ---------------------------------------------------------------- nodes */

typedef enum {
#define OP(e, name, sig, rule, flags, grad, cls, ...) OP_##e,
#include "ops.def"
#undef OP
  NUM_OPS
} Op;

enum { F_FLOAT = 1, F_NUMERIC = 2, F_BOOL_OUT = 4, F_NO_GRAD = 8, F_INTERNAL = 16 };

/* The op classes of the back end (ops.def's cls column). */
typedef enum { C_LEAF, C_PW, C_REDUCE, C_COMPOSITE, C_VIEW, C_GEMM, C_EXTERN, C_TAKE } OpClass;

typedef struct OpInfo {
  const char *name;
  const char *sig;
  int flags;
  OpClass cls;
  const char *expr;  /* C_PW: the scalar expression (ops.def) */
} OpInfo;
extern const OpInfo op_info[NUM_OPS];
int op_lookup(const char *name); /* -1 if none (or internal: F_INTERNAL) */
const char *op_param_name(int op, int k); /* name of signature param k */
const char *op_signature(int op);         /* "linear(x, w, b=none)" */

typedef struct Shape {
  int rank;
  Dim d[MAXRANK];
} Shape;

typedef struct Node Node;
struct Node {
  Op op;
  int id;           /* index in g->nodes (topological order) */
  Node **in;        /* operands; optional ones absent = NULL (see ops.def) */
  int nin;
  DType dtype;
  Shape shape;
  /* attributes, meaning per op in ops.def */
  int axis, axis2;
  uint32_t axes;    /* reductions: bit i set = input dim i reduced */
  int keepdim;
  int perm[MAXRANK];
  Dim lo, hi;
  double f[2];
  int has_f[2];
  int flag;
  int64_t ignore_index;
  int is_dimval;    /* const: value is the size `lo` */
  int index;        /* input / param index; dropout: its ordinal in the spec (mask key) */
  const char *name; /* binding name (inputs, params: their name) */
  const char *scope;/* block instance path, "" at top level ("h.0") */
  Loc loc;          /* the spec text it came from */
};

typedef struct Param {
  const char *name;  /* internal: "w1", "h.0.ln_w" */
  const char *ckpt;  /* checkpoint name: `name:` with {i} resolved, else `name` */
  Shape shape;       /* static */
  int64_t numel;
  int64_t offset;    /* elements from the start of the flat param buffer */
  DType dtype;
  InitKind init;     /* resolved: never INIT_DEFAULT */
  double a, b;
  Loc loc;
  Node *node;
} Param;

typedef struct Input {
  const char *name;
  Shape shape;
  DType dtype;
  Loc loc;
  Node *node;
} Input;

struct Graph {
  Spec *spec;
  Arena *arena;
  Node **nodes;  int nnodes, capnodes;
  Param *params; int nparams, params_cap;
  Input *inputs; int ninputs;
  Node **outputs; const char **output_names; int noutputs;
  Node *loss;    /* train.loss, or NULL */
  int *wrt; int nwrt; /* train.wrt: input indices, in declaration order */
  Sym syms[MAXSYM]; int nsyms;
  int64_t param_numel;     /* total elements of all params */
  int ndropout;            /* dropout nodes, numbered in spec order (Node.index) */
  /* set by autodiff: nodes[0..nforward) are the forward graph, the rest its
   * backward; grads[k] is d loss / d params[k] (a zero `full` if unused) for
   * k < nparams, then grads[nparams + j] is d loss / d inputs[wrt[j]];
   * ngrads = nparams + nwrt */
  int nforward;
  Node **grads;
  int ngrads;
};

/* The front end in one call: read `src`, parse, build and infer. Returns NULL
 * on a refused spec, with the formatted message in d->msg. */
Graph *tgen_load(Diag *d, Arena *a, const char *file, const char *src, size_t len);

/* build.c */
Graph *build_graph(Spec *s);
Node *new_node(Graph *g, Op op, int nin, Loc loc);

/* infer.c: argument normalisation and the shape/dtype rule for `n`. */
typedef struct Arg {
  int given;        /* written in the call (else defaulted) */
  int is_none;
  Loc loc;
  const char *label;/* how messages name it: the param name, or the operand's text for operators */
  Loc *locs;        /* tl, shape, ints, dims: each element's location */
  Node *t;          /* t */
  Node **tl;        /* tl */
  int ntl;
  Dim d;            /* int */
  Dim *list;        /* shape, ints, dims (as a list) */
  int nlist, is_list;
  double f;
  int b;
  const char *s;
  DType dt;
} Arg;
void infer_node(Graph *g, Node *n, Arg *args, const char *where);
const char *shape_str(const Graph *g, const Shape *s);
int shape_eq(const Shape *a, const Shape *b);
/* Broadcast a and b (NumPy rules); 0 if incompatible. */
int broadcast_shapes(const Shape *a, const Shape *b, Shape *out);

/* autodiff.c: append to g the nodes computing d g->loss / d param for every
 * param and d g->loss / d input for every train.wrt input (g->grads), after
 * the forward nodes (g->nforward). 0, or -1 if g has
 * no loss. Inference failing on a backward node is a bug (it aborts). */
int autodiff(Graph *g);

/* verify.c */
void verify(const Graph *g); /* die()s on a malformed graph */

/* dump.c */
void dump_graph(const Graph *g, Buf *b);
void print_summary(const Graph *g, Buf *b);
void dump_json(const Graph *g, Buf *b); /* tgen check --json */
void json_str(Buf *b, const char *s); /* s as a JSON string */

/* ---------------------------------------------------------------- init.c */

/* Philox4x32-10: 4 uint32 outputs for counter ctr and key. */
void philox4x32(uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
uint32_t name_hash(const char *s); /* FNV-1a, 32-bit */
/* Initial value of element i of param p for `seed`, as a double that is exactly
 * representable in f32 (the emitted code computes the same bits). */
double param_init_value(const Param *p, uint64_t seed, int64_t i);
/* v as stored in dtype t: f32, bf16, f16 round to nearest even (bf16/f16 via
 * f32); i32 truncates toward zero (NaN, out of range: INT32_MIN); bool is v != 0. */
double round_to_dtype(double v, DType t);

/* ---------------------------------------------------------------- the back end */

/* A pass of the emitted code (decompose.c builds it, schedule.c groups it
 * into kernels, plan.c places its buffers, render.c prints it). Its nodes are
 * pass-local copies of the graph's (id = index in nodes[]), composite ops
 * rewritten into pointwise ops and primitive reductions; a forward node that
 * the training schedule recomputes in the backward is a second copy. */
enum { PASS_FORWARD, PASS_LOSS, PASS_TRAIN, NPASS };
extern const char *const pass_names[NPASS]; /* "forward", "loss", "train" */

/* HOME_IGRAD: the gradient of train.wrt input wrt[index], in the caller's
 * buffer out[1 + index] of the train pass (out[0] is the loss). */
typedef enum { HOME_ARENA, HOME_INPUT, HOME_PARAM, HOME_GRAD, HOME_OUTPUT, HOME_ALIAS, HOME_IGRAD } Home;

typedef struct Buffer {
  Node *node;        /* the value it holds */
  const char *name;  /* its C name: "h", "d_h", "logits" */
  const char *pname; /* its name as a kernel's parameter: without a block instance's path ("h_3_ln_1_w" is
                        "ln_1_w"), so that the instances' kernels print once (render.c); not unique */
  Home home;
  int index;         /* input, param, gradient (param), output or wrt index; HOME_ALIAS: the buffer it views */
  int64_t bytes;     /* at each dynamic dim's max */
  int64_t offset;    /* HOME_ARENA: bytes from the arena's start (plan.c) */
  Dim off;           /* HOME_ALIAS: elements from the start of the buffer it views (a placed value) */
  int first, last;   /* the kernels that write it and read it last (nk: read at the pass's end) */
  int inplace;       /* HOME_ARENA: the buffer whose bytes it takes, written in place by its kernel, that
                        buffer's last reader (plan.c), or -1 */
} Buffer;

typedef enum { K_LOOP, K_GEMM, K_EXTERN, K_CONCAT } KernelKind;

typedef struct Kernel {
  KernelKind kind;
  const char *name;  /* "k3_layer_norm" (render.c) */
  Node **outs;       /* the values it stores, in order */
  int nouts;
  Node **reds;       /* K_LOOP: the reductions it computes (stored or not) */
  int nreds;
  Node **cols;       /* K_LOOP rows: sums over the dims the rows' reductions keep (the leading dims: a layer
                        norm's weight and bias gradients), accumulated as the rows go by (riders); the values
                        over their result space (the riders' outs) are among outs */
  int ncols;
  Node *anchor;      /* K_GEMM, K_EXTERN, K_CONCAT: the node */
  Node *act, *add;   /* K_GEMM: the activation (relu, gelu) and the residual add its store applies, or NULL;
                        outs[0] is the last of anchor, act, add */
  Node *res;         /* K_GEMM: the residual add's other operand */
  Node *aux;         /* K_GEMM: the product, stored beside the activation (outs[1]: read elsewhere); or, act
                        being an activation's gradient (gelu_grad), the x it reads */
  Node *bgrad;       /* K_GEMM: the sum over k of op(A) (a bias's gradient, outs[1]), or NULL */
  /* K_LOOP's iteration space: with reductions, each output element o of
   * `outer` elements reduces `rnum` elements of `full` over the dims in
   * `axes`; without, `numel` elements */
  Shape full;
  uint32_t axes;
  Dim outer, rnum, numel;
  const char *stop;  /* why the next kernel does not fuse into it, in words (tgen explain) */
  int leaves;        /* schedule.c: leaves_to_finals's answer, cached (0 not asked, 1 yes, 2 no) */
} Kernel;

/* Where a value's elements are (layout.c): element (i_0, ..., i_{r-1}) at
 * element off + sum_k i_k st[k] of host's buffer. */
typedef struct Layout {
  const Node *host;
  Dim off;
  Dim st[MAXRANK];
} Layout;

typedef struct BPass {
  Graph *g;
  int kind;          /* PASS_* */
  int training;      /* dropout active */
  Node **nodes;      /* pass-local nodes, topological */
  int n, nfwd;       /* nodes [0, nfwd) are the forward part */
  const Node **orig; /* orig[id]: the graph node it came from */
  Node **finals;     /* forward: the outputs; loss, train: the loss, then (train) each param's gradient */
  int nfinals;
  /* schedule.c */
  int fuse;
  char *realized;    /* per node: stored in a buffer (else recomputed where it is read) */
  int *nuse;         /* per node: consumers in the pass */
  Kernel **k;
  int nk;
  int *kern;         /* per node: the kernel that stores it, or -1 */
  const char **why;  /* per realized node: why it is stored, in words (tgen explain) */
  Layout **place;    /* per node: NULL, or where in another value's buffer (its host) the result of its
                        kernel (an attention call) is stored */
  char *host;        /* per node: a stored value with no kernel of its own, filled by the values placed in it */
  struct LoadWalk *walk; /* for kernel_loads's callers after the schedule */
  struct RTab *rtab;  /* render.c: its kernel walkers' per-node tables */
  /* plan.c */
  Buffer *b;
  int nb;
  int *buf;          /* per node: its buffer, or -1 */
  int64_t arena;     /* the arena's peak bytes */
  int64_t sym[MAXSYM]; /* the symbol values sizes are planned at (each dynamic dim's max) */
  int via_forward;   /* PASS_LOSS: 1 + the forward output that is the loss when this pass computes just what
                        the forward does (it is printed as a call of the forward, its other outputs in the
                        arena after the forward's); 0: a pass of its own */
  int64_t *out_at;   /* via_forward: each forward output's offset in the arena (the loss's unused) */
} BPass;

/* emit.c: the back end's passes of g up to stage upto (0 decompose, 1
 * schedule, 2 plan): forward, and with a training plan pl, loss and train. */
struct Plan;
void build_passes(Graph *g, const struct Plan *pl, int fuse, int upto, BPass **ps);
/* decompose.c: the pass over the graph nodes `order` (ids; the training
 * schedule for PASS_TRAIN, with nfwd its forward part). */
BPass *build_pass(Graph *g, int kind, const int *order, int n, int nfwd);
/* schedule.c: realize values and group the nodes into kernels (fuse = 0: one
 * kernel per computed node). */
void schedule(BPass *p, int fuse);
/* A GEMM operand as memory: x itself, or the value x transposes (its last
 * two dims swapped), with *trans = 1. */
const Node *gemm_source(const Node *x, int *trans);
/* Operand k of GEMM node n as the runtime GEMM reads it (gemm_source for
 * the matrices of a strided GEMM; linear's x and bias as they are). */
const Node *gemm_operand(const Node *n, int k, int *trans);
/* Can GEMM node n run as one strided-batch GEMM over its operands' sources
 * (both of rank >= 2, each operand's batch dims the result's or none)? */
int gemm_strided(const Node *n);
/* Are loop kernel k's reduced dims the innermost ones (rows, not columns)? */
int kernel_rows(const Kernel *k);
/* Riders (schedule.c's rider_fit, render.c): a row kernel's rows at most
 * RIDE_ROW elements long, its riders' result elements (the sums of all of
 * them) at most RIDE_COLS, and a CUDA thread's share of them at most
 * RIDE_SLOTS floats (its column of the block's shared sums: 48 KB for a
 * block of 128 threads). */
enum { RIDE_ROW = 1024, RIDE_COLS = 4096, RIDE_SLOTS = 96 };
int rider_fit(const BPass *p, const Kernel *a, const Kernel *b);
/* A walk over the values a kernel reads from memory (leaves and values
 * stored by other kernels): after kernel_loads(p, k, w), list[0 .. nlist)
 * holds their ids and mark[id] == stamp says whether id is one. It costs the
 * kernel's size, not the pass's (the scheduler walks kernels at every merge
 * it tries). */
typedef struct LoadWalk {
  int *seen, *own, *mark; /* per node: stamps of the latest walk that visited it, found it the kernel's own, loaded it */
  int stamp;
  int *list, nlist;
  const Node **stack;
  int cap;
} LoadWalk;
LoadWalk *walk_new(Arena *a, int n);
void kernel_loads(const BPass *p, const Kernel *k, LoadWalk *w);
/* layout.c. Is n a view of one operand (index arithmetic; a concat reads
 * several)? */
int layout_view1(const Node *n);
/* n's bytes at the dims' maxima (p->sym). */
int64_t layout_bytes(const BPass *p, const Node *n);
/* n's own buffer, contiguous. */
void layout_contig(const Node *n, Layout *l);
/* l holds the layout of view v's operand: make it v's (layout_view), or,
 * l holding v's, its operand's (layout_unview: transposes, permutes and
 * reshapes only). 0 when strides cannot express it. */
int layout_view(const BPass *p, const Node *v, Layout *l);
int layout_unview(const BPass *p, const Node *v, Layout *l);
/* Is n's value in memory of its own (a leaf, or stored and not an alias)? */
int layout_stored(const BPass *p, const Node *n);
/* Where n's elements are: a stored value's own (or placed) layout, a view
 * chain's over the stored value it views; 0 when n is neither. */
int layout_of(const BPass *p, const Node *n, Layout *l);
/* Is stored view n an alias: its elements contiguous (at an offset) where
 * the value it views is? l: where (host, offset). */
int layout_alias(const BPass *p, const Node *n, Layout *l);
/* The stored value a chain of views from n reads (n itself when stored). */
const Node *layout_base(const BPass *p, const Node *n);
/* Does l give n rows as the runtime's tgm_view wants them (last stride 1, the
 * row stride at least the row's length, for every value of the dims)? */
int layout_rows(const BPass *p, const Node *n, const Layout *l);
/* Is l n's contiguous layout at offset 0? */
int layout_is_contig(const Node *n, const Layout *l);

/* plan.c: buffers, their lifetimes and arena offsets at p->sym. */
void plan(BPass *p);
void final_home(const BPass *p, int k, Home *h, int *index);
/* 0 when no two arena buffers with overlapping lifetimes overlap in bytes
 * but a recorded in-place pair (the output's .inplace names the input, both
 * at one offset with the same bytes, the input's last reader the output's
 * writer); else -1 and a message. */
int plan_check(const BPass *p, char *err, size_t errlen);
/* render.c: 0 when loop kernel k (its values as the schedule stands) can be
 * printed: every read of a reduction it computes is at its own element (else
 * 1), and it loads no value it stores itself (else 2: the load could run
 * before the store, or on another thread). */
int render_check(BPass *p, const Kernel *k);
/* 1 when loop kernel k, printed for both targets with its in-place pair
 * (the buffer of one value it stores has .inplace set: plan.c), writes each
 * element of that buffer only where every read of the input's bytes, by any
 * thread, is done: reads in earlier phases or before the kernel's barrier,
 * or at the element the same thread stores in the same loop iteration. */
int render_inplace_ok(BPass *p, const Kernel *k);
/* The pass in words (tgen check --dump-after). */
void dump_pass(const BPass *p, int after, Buf *b); /* after: 0 decompose, 1 schedule, 2 plan */
/* The C file of one target (cuda 0: the CPU) with every pass (NULL: the
 * model has none): the generated kernels, then the pass functions. */
const char *render_file(Graph *g, BPass **passes, int cuda, const char *spec_name);
/* The byte offset of each param in the flat params buffer (each param
 * 256-aligned), and at [nparams] the buffer's size. */
int64_t *param_offsets(const Graph *g, Arena *a);
/* The C text of a size over the dims' locals (dim_B, ...). */
const char *c_dim(const Graph *g, const Dim *d);
/* The spec lines kernel k covers ("spec.yaml:30 'h', 31 'logits'"). */
const char *kernel_covers(const BPass *p, const Kernel *k, const char *spec);

/* ---------------------------------------------------------------- explain.c */

/* Bytes read and written, FLOPs of kernel k at p->sym (conventions in
 * explain.c). */
void kernel_cost(const BPass *p, const Kernel *k, double *bytes, double *flops);
/* tgen explain: each pass's kernels (ps[k], planned; render_file named them)
 * with what they cover, cost and floor at p->sym, where fusion stopped and
 * why values are stored; as text or JSON. */
/* A GPU's measured ceilings for explain's floors (key: --gpu's value). */
typedef struct {
  const char *key, *name;
  double copy, gemm16, f32; /* bytes/s; bf16/f16 GEMM and attention FLOP/s; everything else */
} GpuCeilings;
const GpuCeilings *gpu_ceilings(const char *key); /* "h100", "h200"; NULL if unknown */
void explain(Graph *g, BPass **ps, const char *spec, int json, const GpuCeilings *gpu, Buf *b);

/* ---------------------------------------------------------------- emit.c */

typedef struct EmitOptions {
  const char *spec_name;   /* the spec's file name as shown in comments (no directories) */
  int targets;             /* TARGET_* bits */
  const char *cuda_arch;   /* CMAKE_CUDA_ARCHITECTURES default */
  int golden;              /* compute golden vectors */
  double golden_budget;    /* flops the interpreter may spend on them */
  int64_t test_dim;        /* value of each dynamic dim in the emitted tests (capped by its max) */
  int fuse;                /* 0: one kernel per node (compile.fuse: false, --no-fuse) */
  int distributed;         /* 1: data-parallel training through NCCL (compile.distributed, --distributed) */
} EmitOptions;

/* Print the project for g into directory `out` (atomically). 0, or -1 with err. */
int emit_project(Graph *g, const EmitOptions *o, const char *out, char *err, size_t errlen);

/* ---------------------------------------------------------------- interp.c */

/* A dense row-major tensor of doubles (every dtype is held as double; bool is
 * 0/1, i32 holds exact integers). */
typedef struct Tensor {
  int rank;
  int64_t shape[MAXRANK];
  int64_t numel;
  double *data; /* malloc'd; owned by whoever made the tensor */
} Tensor;

typedef struct InterpOptions {
  const int64_t *symvals; /* value of each symbol g->syms[i] (derived: ignored) */
  int training;           /* dropout active */
  uint64_t seed;          /* dropout seed */
  uint64_t step;          /* dropout step */
} InterpOptions;

/* Evaluate every node. inputs[g->ninputs], params[g->nparams] (shapes must
 * match; checked). On success returns 0 and vals[g->nnodes] holds each node's
 * value (caller frees with interp_free). On a run-time error (a guard, an index
 * out of range) returns -1 with a message in err. */
int interp_run(const Graph *g, const InterpOptions *opt, const Tensor *inputs, const Tensor *params,
               Tensor *vals, char *err, size_t errlen);
void interp_free(const Graph *g, Tensor *vals);
/* The same over the nodes of a back-end pass (decompose.c; id = position):
 * vals[n]; the caller frees each vals[i].data. */
int interp_run_nodes(const Graph *g, Node *const *nodes, int n, const InterpOptions *opt, const Tensor *inputs,
                     const Tensor *params, Tensor *vals, char *err, size_t errlen);
/* Runs the joint graph in the order of a training schedule (partition.c):
 * the forward part, then every forward value that is not saved (nor a param
 * or input) is freed, then the backward part. Fails (-1 with err) if a node
 * reads a value that is not there, so it checks the schedule as well as
 * computing. grads[g->ngrads] and loss receive copies (caller frees data). */
struct Plan;
int interp_run_plan(const Graph *g, const struct Plan *p, const InterpOptions *opt, const Tensor *inputs,
                    const Tensor *params, Tensor *grads, Tensor *loss, char *err, size_t errlen);
/* Inputs (a fixed pseudo-random fill with valid indices) and params (from
 * seed) for a run at the symbol values sym; 0, or -1 with err. */
int interp_make_args(const Graph *g, const int64_t *sym, uint64_t seed, Tensor **ins, Tensor **ps, char *err,
                     size_t errlen);
void interp_free_args(const Graph *g, Tensor *ins, Tensor *ps);
/* Concrete shape of a node for the given symbol values (0 + err on failure). */
int concrete_shape(const Graph *g, const Shape *s, const int64_t *symvals, Tensor *t, char *err, size_t errlen);

/* ---------------------------------------------------------------- interp_train.c */

/* torch.nn.utils.clip_grad_norm_'s factor: min(1, max_norm / (sqrt(sum_squares) + 1e-6)). */
double optim_clip_factor(double sum_squares, double max_norm);
/* One step of tr's optimizer (PyTorch's AdamW or SGD) in double on n elements:
 * w the weights, grad the gradient (times grad_scale), m the first moment or
 * momentum buffer, v the second moment (AdamW); step is 1-based. */
void optim_step(const Train *tr, double *w, const double *grad, double *m, double *v, int64_t n, int64_t step,
                double grad_scale);
/* nsteps training steps of the emitted train_step from params and inputs:
 * opt gives the symbol values and the dropout seed (training and step are set
 * per step); losses[s] = the loss of step s (before its update). g needs its
 * gradients (autodiff) and a train: optimizer. 0, or -1 with err (an
 * interpreter error, or "gradient norm is NaN at step N"). */
int interp_train(const Graph *g, const InterpOptions *opt, const Tensor *inputs, const Tensor *params, int nsteps,
                 double *losses, char *err, size_t errlen);

/* ---------------------------------------------------------------- partition.c */

/* partition.c: the training schedule. */
typedef struct Plan {
  int *order; int n;   /* node ids in execution order (arena memory) */
  int nfwd;            /* order[0..nfwd): the forward pass: every node the loss needs, and the saved values;
                          order[nfwd..n): the backward: the backward nodes the gradients need, in
                          topological order, with each recomputed forward node placed just before its
                          first use (a forward id may appear in both parts) */
  char *saved;         /* saved[id] for id < g->nforward: computed in the forward, read by the backward */
  int nsaved, nrecomputed; /* nrecomputed: forward ops in the backward part, not counting the free
                              ones (const, full, arange) and views (reshape, squeeze, unsqueeze, same-dtype cast) */
  int64_t saved_bytes; /* bytes of the saved values at the symbol values given to partition() */
  int64_t saveall_bytes; /* the same for remat: save-all, for the report */
  int met_budget;      /* 0 when memory_budget could not be met (the smallest found is used) */
  /* for the report */
  Remat remat;         /* the strategy asked for */
  int64_t budget;      /* the budget given (-1 none) */
  int relax;           /* min-cut: 0 all bans; 1 without the reduction ban; 2 also the largest saved
                          banned ops recomputable, one at a time; 3 only dropout banned; 4 fell
                          back to recompute-all (to meet the budget) */
  int64_t sym[MAXSYM]; /* the symbol values sizes were evaluated at */
} Plan;
/* Choose the saved set for strategy r (Remat from spec.h; budget in bytes, -1 = none) with sizes
 * evaluated at symbol values sym (the caller passes each dynamic dim's max). 0, or -1 with err.
 * The budget only steers min-cut; save-all and recompute-all ignore it (met_budget still says
 * whether their saved bytes fit). */
int partition(const Graph *g, Remat r, int64_t budget, const int64_t *sym, Plan *p, char *err, size_t errlen);
/* The report: strategy, saved count and bytes, recompute count, the saved nodes (id, op, name, shape, bytes, spec line). */
void print_plan(const Graph *g, const Plan *p, Buf *b);
/* Its first line alone (tgen check): "saved activations (min-cut): N tensors, X MiB at B=16 (...)". */
void print_plan_summary(const Graph *g, const Plan *p, Buf *b);

#endif
