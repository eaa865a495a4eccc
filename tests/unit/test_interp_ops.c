/* test_interp_ops.c: every op of gen/ops.def (leaves aside) through the front
 * end and the reference interpreter, against expectations derived by hand or
 * by a separate few-line calculation (Python's math module, or an independent
 * Python Philox for dropout; the formula is beside each literal). Nothing here
 * was copied from the interpreter's own output.
 *
 * Each test is a small model in YAML, loaded with tgen_load (so the attributes
 * the interpreter reads are the ones build.c and infer.c really set); every
 * binding becomes an output, checked by name. The few cases the language
 * refuses but the IR allows (an empty slice, zeros/ones nodes) are appended to
 * a loaded graph by hand.
 *
 * Prints "N passed, M failed"; exits nonzero on any failure. */
#include "ir.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int npass, nfail;
static Diag dg;
static Arena arena;
static Graph *g;
static Tensor *ins;      /* the caller's input tensors, g->ninputs */
static Tensor *vals;     /* the interpreter's values, g->nnodes */
static char err[512];    /* the interpreter's last error */
static const char *test; /* the running test, for messages */

/* ---------------------------------------------------------------- loading */

/* Appends to b the names bound by the graph lines "  - a, b: EXPR" of body. */
static void binding_names(Buf *b, const char *body) {
  int first = 1;
  for (const char *p = strstr(body, "graph:\n"); p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
    if (strncmp(p, "  - ", 4))
      continue;
    const char *s = p + 4, *colon = strchr(s, ':');
    while (s < colon) {
      const char *e = s;
      while (e < colon && *e != ',')
        e++;
      buf_printf(b, "%s%.*s", first ? "" : ", ", (int)(e - s), s);
      first = 0;
      s = e < colon ? e + 2 : colon; /* skip ", " */
    }
  }
}

/* Loads "name: t" + body + "outputs: [every binding]"; a refusal is a
 * failure. Static inputs get their shapes; data comes from set(). */
static int load(const char *name, const char *body) {
  test = name;
  arena_free(&arena);
  arena.fail_after = -1;
  vals = NULL;
  Buf b;
  buf_init(&b, &arena);
  buf_printf(&b, "name: t\n%soutputs: [", body);
  binding_names(&b, body);
  buf_printf(&b, "]\n");
  g = tgen_load(&dg, &arena, "t.yaml", b.p, b.len);
  if (!g) {
    printf("FAIL %s: refused:\n%s", test, dg.msg);
    nfail++;
    return -1;
  }
  ins = arena_alloc(&arena, sizeof(Tensor) * (size_t)(g->ninputs + 1));
  for (int k = 0; k < g->ninputs; k++) {
    ins[k].rank = g->inputs[k].shape.rank;
    ins[k].numel = 1;
    for (int d = 0; d < ins[k].rank; d++) {
      if (!dim_is_const(&g->inputs[k].shape.d[d], &ins[k].shape[d]))
        ins[k].shape[d] = -1; /* dynamic: set_shaped() gives it */
      ins[k].numel *= ins[k].shape[d];
    }
  }
  return 0;
}

static int input_index(const char *name) {
  for (int k = 0; k < g->ninputs; k++)
    if (!strcmp(g->inputs[k].name, name))
      return k;
  printf("%s: bad test: no input '%s'\n", test, name);
  exit(2);
}

/* Gives input `name` the concrete shape[rank] and the values data[0..n). */
static void set_shaped(const char *name, int rank, const int64_t *shape, const double *data, int n) {
  Tensor *t = &ins[input_index(name)];
  t->rank = rank;
  t->numel = 1;
  for (int d = 0; d < rank; d++)
    t->numel *= t->shape[d] = shape[d];
  if (t->numel != n) {
    printf("%s: bad test: input '%s' has %d values for %lld elements\n", test, name, n, (long long)t->numel);
    exit(2);
  }
  t->data = arena_alloc(&arena, sizeof(double) * (size_t)(n ? n : 1));
  memcpy(t->data, data, sizeof(double) * (size_t)n);
}

/* Gives the static input `name` the values data[0..n). */
static void set(const char *name, const double *data, int n) {
  Tensor *t = &ins[input_index(name)];
  set_shaped(name, t->rank, t->shape, data, n);
}

/* The node of output `name`. */
static Node *out(const char *name) {
  for (int i = 0; i < g->noutputs; i++)
    if (!strcmp(g->output_names[i], name))
      return g->outputs[i];
  printf("%s: bad test: no output '%s'\n", test, name);
  exit(2);
}

/* Index of the symbol of dynamic dim `name`. */
static int sym(const char *name) {
  for (int i = 0; i < g->nsyms; i++)
    if (!strcmp(g->syms[i].name, name))
      return i;
  printf("%s: bad test: no dim '%s'\n", test, name);
  exit(2);
}

/* A node appended by hand (for IR the language does not produce). */
static Node *append(Op op, DType dt, int rank, const int64_t *shape, Node *x) {
  Node *n = new_node(g, op, x ? 1 : 0, (Loc){0, 0});
  if (x)
    n->in[0] = x;
  n->dtype = dt;
  n->name = "hand";
  n->shape.rank = rank;
  for (int d = 0; d < rank; d++)
    n->shape.d[d] = dim_const(shape[d]);
  return n;
}

/* ---------------------------------------------------------------- running, checking */

/* Runs the graph; an error is a failure. */
static int run_opt(const InterpOptions *o) {
  if (!g)
    return -1;
  vals = arena_alloc(&arena, sizeof(Tensor) * (size_t)(g->nnodes + 1));
  if (interp_run(g, o, ins, NULL, vals, err, sizeof err)) {
    printf("FAIL %s: interp_run: %s\n", test, err);
    nfail++;
    vals = NULL;
    return -1;
  }
  return 0;
}
static int run(void) {
  InterpOptions o = {0};
  return run_opt(&o);
}
static void done(void) {
  if (vals)
    interp_free(g, vals);
  vals = NULL;
}

/* Expects the run to fail with a message containing `want`, having freed
 * everything. */
static void expect_error(const InterpOptions *o, const char *want) {
  if (!g) {
    nfail++;
    return;
  }
  Tensor *v = arena_alloc(&arena, sizeof(Tensor) * (size_t)(g->nnodes + 1));
  err[0] = 0;
  int rc = interp_run(g, o, ins, NULL, v, err, sizeof err);
  int ok = rc == -1 && strstr(err, want);
  if (!ok)
    printf("FAIL %s: expected an error containing \"%s\", got rc %d \"%s\"\n", test, want, rc, err);
  for (int i = 0; i < g->nnodes; i++)
    ok &= v[i].data == NULL;
  if (rc == 0)
    interp_free(g, v);
  ok ? npass++ : nfail++;
}

/* |got - want| <= tol * max(1, |want|); NaN matches NaN, infinities match
 * exactly. */
static int close_to(double got, double want, double tol) {
  if (isnan(want))
    return isnan(got);
  if (isinf(want))
    return got == want;
  return fabs(got - want) <= tol * (fabs(want) > 1 ? fabs(want) : 1);
}

#define EXACT 0.0
#define TIGHT 1e-14

/* Expects output `name` to have shape shape[rank] and values want[0..n). */
static void check(const char *name, Node *n, int rank, const int64_t *shape, double tol, const double *want, int nw) {
  if (!vals) {
    nfail++;
    return;
  }
  Tensor *t = &vals[n->id];
  int ok = t->rank == rank && t->numel == nw;
  for (int d = 0; ok && d < rank; d++)
    ok = t->shape[d] == shape[d];
  if (!ok) {
    printf("FAIL %s/%s: shape differs (rank %d, %lld elements; want rank %d, %d elements)\n", test, name, t->rank,
           (long long)t->numel, rank, nw);
    nfail++;
    return;
  }
  for (int i = 0; i < nw; i++)
    if (!close_to(t->data[i], want[i], tol)) {
      printf("FAIL %s/%s: element %d is %.17g, want %.17g\n", test, name, i, t->data[i], want[i]);
      nfail++;
      return;
    }
  npass++;
}

/* S(2, 3) is the shape [2, 3] as (rank, dims); S0 is []. V(1, 2) is a double
 * array and its length. */
#define S(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]){__VA_ARGS__}
#define S0 0, NULL
#define V(...) (const double[]){__VA_ARGS__}, (int)(sizeof((double[]){__VA_ARGS__}) / sizeof(double))
#define expect(name, ...) check(name, out(name), __VA_ARGS__)
#define EXPECT(name, shape, ...) expect(name, shape, EXACT, __VA_ARGS__)
#define NEAR(name, shape, ...) expect(name, shape, TIGHT, __VA_ARGS__)

/* ---------------------------------------------------------------- pointwise */

/* Unary ops on [-2, -0.5, 0, 0.5, 1.5]; the transcendental values are
 * Python's math.exp/sin/cos/tanh/erf and 1/(1+exp(-x)), x/(1+exp(-x)),
 * 0.5x(1+erf(x/sqrt2)), 0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3))). IEEE edge
 * cases: log 0 = -inf, log -1 = NaN, sqrt -1 = NaN, 1/0 = inf, relu keeps NaN
 * (torch.relu(nan) = nan). */
static void test_unary(void) {
  if (load("unary", "inputs:\n"
                    "  x: [5]\n"
                    "  p: [4]\n"
                    "  z: [3]\n"
                    "graph:\n"
                    "  - neg_: neg(x)\n"
                    "  - minus: -x\n"
                    "  - abs_: abs(x)\n"
                    "  - relu_: relu(x)\n"
                    "  - square_: square(x)\n"
                    "  - exp_: exp(x)\n"
                    "  - sin_: sin(x)\n"
                    "  - cos_: cos(x)\n"
                    "  - tanh_: tanh(x)\n"
                    "  - sigmoid_: sigmoid(x)\n"
                    "  - silu_: silu(x)\n"
                    "  - erf_: erf(x)\n"
                    "  - gelu_: gelu(x)\n"
                    "  - gelu_tanh: gelu(x, approximate='tanh')\n"
                    "  - log_: log(p)\n"
                    "  - sqrt_: sqrt(p)\n"
                    "  - rsqrt_: rsqrt(p)\n"
                    "  - reciprocal_: reciprocal(p)\n"
                    "  - log_z: log(z)\n"
                    "  - sqrt_z: sqrt(z)\n"
                    "  - reciprocal_z: reciprocal(z)\n"
                    "  - relu_z: relu(z)\n"))
    return;
  set("x", V(-2, -0.5, 0, 0.5, 1.5));
  set("p", V(0.25, 1, 2, 4));
  set("z", V(0, -1, NAN));
  if (run() == 0) {
    EXPECT("neg_", S(5), V(2, 0.5, -0.0, -0.5, -1.5));
    EXPECT("minus", S(5), V(2, 0.5, -0.0, -0.5, -1.5));
    EXPECT("abs_", S(5), V(2, 0.5, 0, 0.5, 1.5));
    EXPECT("relu_", S(5), V(0, 0, 0, 0.5, 1.5));
    EXPECT("square_", S(5), V(4, 0.25, 0, 0.25, 2.25));
    NEAR("exp_", S(5), V(0.1353352832366127, 0.6065306597126334, 1.0, 1.6487212707001282, 4.4816890703380645));
    NEAR("sin_", S(5), V(-0.9092974268256817, -0.479425538604203, 0.0, 0.479425538604203, 0.9974949866040544));
    NEAR("cos_", S(5), V(-0.4161468365471424, 0.8775825618903728, 1.0, 0.8775825618903728, 0.0707372016677029));
    NEAR("tanh_", S(5), V(-0.9640275800758169, -0.46211715726000974, 0.0, 0.46211715726000974, 0.9051482536448664));
    NEAR("sigmoid_", S(5), V(0.11920292202211755, 0.3775406687981454, 0.5, 0.6224593312018546, 0.8175744761936437));
    NEAR("silu_", S(5), V(-0.2384058440442351, -0.1887703343990727, 0.0, 0.3112296656009273, 1.2263617142904655));
    NEAR("erf_", S(5), V(-0.9953222650189527, -0.5204998778130465, 0.0, 0.5204998778130465, 0.9661051464753108));
    NEAR("gelu_", S(5), V(-0.04550026389635842, -0.15426876936299344, 0.0, 0.34573123063700656, 1.399789198096713));
    NEAR("gelu_tanh", S(5),
         V(-0.04540230591222494, -0.15428599017485606, 0.0, 0.34571400982514394, 1.3995715769802328));
    NEAR("log_", S(4), V(-1.3862943611198906, 0.0, 0.6931471805599453, 1.3862943611198906));
    EXPECT("sqrt_", S(4), V(0.5, 1, 1.4142135623730951, 2));    /* sqrt is correctly rounded */
    EXPECT("rsqrt_", S(4), V(2, 1, 0.7071067811865475, 0.5));   /* 1/1.4142135623730951 */
    EXPECT("reciprocal_", S(4), V(4, 1, 0.5, 0.25));
    EXPECT("log_z", S(3), V(-INFINITY, NAN, NAN));
    EXPECT("sqrt_z", S(3), V(0, NAN, NAN));
    EXPECT("reciprocal_z", S(3), V(INFINITY, -1, NAN));
    EXPECT("relu_z", S(3), V(0, 0, NAN));
  }
  done();
}

/* Binary ops with NumPy broadcasting, by hand: a [2,3] = 1..6 with b [3] =
 * [10,20,30]; [2,1] with [1,3] (an outer sum); scalars on either side;
 * maximum/minimum propagate NaN from either side (torch); pow with a scalar
 * exponent (a negative base with a fractional exponent is NaN). */
static void test_binary(void) {
  if (load("binary", "inputs:\n"
                     "  a: [2, 3]\n"
                     "  b: [3]\n"
                     "  c: [2, 1]\n"
                     "  d: [1, 3]\n"
                     "  m1: [4]\n"
                     "  m2: [4]\n"
                     "  pb: [4]\n"
                     "graph:\n"
                     "  - add_: add(a, b)\n"
                     "  - plus: a + b\n"
                     "  - sub_: a - b\n"
                     "  - mul_: mul(a, b)\n"
                     "  - div_: a / b\n"
                     "  - outer: c + d\n"
                     "  - twice: 2 * d\n"
                     "  - rsub: 1 - c\n"
                     "  - maximum_: maximum(m1, m2)\n"
                     "  - minimum_: minimum(m1, m2)\n"
                     "  - pow_half: pow(pb, 0.5)\n"
                     "  - pow_3: pow(pb, 3)\n"))
    return;
  set("a", V(1, 2, 3, 4, 5, 6));
  set("b", V(10, 20, 30));
  set("c", V(1, 2));
  set("d", V(10, 20, 30));
  set("m1", V(1, NAN, 3, -0.5));
  set("m2", V(2, 0, NAN, -1));
  set("pb", V(4, 9, 2, -8));
  if (run() == 0) {
    EXPECT("add_", S(2, 3), V(11, 22, 33, 14, 25, 36));
    EXPECT("plus", S(2, 3), V(11, 22, 33, 14, 25, 36));
    EXPECT("sub_", S(2, 3), V(-9, -18, -27, -6, -15, -24));
    EXPECT("mul_", S(2, 3), V(10, 40, 90, 40, 100, 180));
    EXPECT("div_", S(2, 3), V(0.1, 0.1, 0.1, 0.4, 0.25, 0.2)); /* correctly rounded quotients */
    EXPECT("outer", S(2, 3), V(11, 21, 31, 12, 22, 32));
    EXPECT("twice", S(1, 3), V(20, 40, 60));
    EXPECT("rsub", S(2, 1), V(0, -1));
    EXPECT("maximum_", S(4), V(2, NAN, NAN, -0.5));
    EXPECT("minimum_", S(4), V(1, NAN, NAN, -1));
    EXPECT("pow_half", S(4), V(2, 3, 1.4142135623730951, NAN));
    EXPECT("pow_3", S(4), V(64, 729, 8, -512));
  }
  done();
}

/* Comparisons (bool 0/1; NaN compares false except ne), where with a [2,1]
 * condition, a [3] tensor and a scalar, clamp = min(max(x, lo), hi) with
 * both, one, or crossed bounds (lo > hi gives hi, as torch). */
static void test_compare_select(void) {
  if (load("compare/select", "inputs:\n"
                             "  a: [4]\n"
                             "  b: [4]\n"
                             "  cond: {shape: [2, 1], dtype: bool}\n"
                             "  wa: [3]\n"
                             "  x: [5]\n"
                             "  n: {shape: [3], dtype: i32}\n"
                             "graph:\n"
                             "  - gt_: gt(a, b)\n"
                             "  - ge_: ge(a, b)\n"
                             "  - lt_: lt(a, b)\n"
                             "  - le_: le(a, b)\n"
                             "  - eq_: eq(a, b)\n"
                             "  - ne_: ne(a, b)\n"
                             "  - gt_scalar: gt(a, 1.5)\n"
                             "  - where_: where(cond, wa, 9)\n"
                             "  - where_cmp: where(gt(a, b), a, b)\n"
                             "  - clamp_both: clamp(x, min=-1, max=1)\n"
                             "  - clamp_min: clamp(x, min=0)\n"
                             "  - clamp_max: clamp(x, max=0)\n"
                             "  - clamp_crossed: clamp(x, 1, 0)\n"
                             "  - clamp_i32: clamp(n, min=0, max=5)\n"))
    return;
  set("a", V(1, 2, 3, NAN));
  set("b", V(2, 2, 2, NAN));
  set("cond", V(1, 0));
  set("wa", V(1, 2, 3));
  set("x", V(-2, -0.5, 0.5, 2, NAN));
  set("n", V(-3, 4, 7));
  if (run() == 0) {
    EXPECT("gt_", S(4), V(0, 0, 1, 0));
    EXPECT("ge_", S(4), V(0, 1, 1, 0));
    EXPECT("lt_", S(4), V(1, 0, 0, 0));
    EXPECT("le_", S(4), V(1, 1, 0, 0));
    EXPECT("eq_", S(4), V(0, 1, 0, 0));
    EXPECT("ne_", S(4), V(1, 0, 1, 1));
    EXPECT("gt_scalar", S(4), V(0, 1, 1, 0));
    EXPECT("where_", S(2, 3), V(1, 2, 3, 9, 9, 9));
    EXPECT("where_cmp", S(4), V(2, 2, 3, NAN));
    EXPECT("clamp_both", S(5), V(-1, -0.5, 0.5, 1, NAN));
    EXPECT("clamp_min", S(5), V(0, 0, 0.5, 2, NAN));
    EXPECT("clamp_max", S(5), V(-2, -0.5, 0, 0, NAN));
    EXPECT("clamp_crossed", S(5), V(0, 0, 0, 0, NAN));
    EXPECT("clamp_i32", S(3), V(0, 4, 5));
  }
  done();
}

/* ---------------------------------------------------------------- reductions */

/* x[i,j,k] = 12i + 4j + k over [2,3,4] (0..23). By hand:
 *   sum all = 23*24/2 = 276
 *   sum over i,k (keepdim) = sum_{i<2,k<4} 12i+4j+k = 48 + 32j + 12 = 60 + 32j
 *   mean over j = 12i + 4 + k
 *   amax over k = 12i + 4j + 3; amax over i,j = 20 + k
 *   var over k = var([0,1,2,3]) = 5/3 (correction 1), 5/4 (correction 0)
 *   var over i = ((-6)^2 + 6^2) / 1 = 72
 *   var with N - correction <= 0: divisor max(0, N - c) = 0 (torch.var), so
 *     0/0 = NaN for one element, 2/0 = inf for [1,2,3] with correction 5
 *   logsumexp rows: [1,2,3] -> log(e+e^2+e^3) = 3.40760596444438 (Python);
 *     all -inf -> -inf; [1000,1000,-inf] -> 1000 + log 2 (needs the shift);
 *     [inf,0,0] -> inf
 *   a rank-0 input reduces nothing; amax propagates NaN; mean of 1..6 = 3.5 */
static void test_reduce(void) {
  if (load("reduce", "inputs:\n"
                     "  x: [2, 3, 4]\n"
                     "  one: [1, 2]\n"
                     "  three: [3]\n"
                     "  l: [4, 3]\n"
                     "  s: []\n"
                     "  nan: [3]\n"
                     "  six: [2, 3]\n"
                     "  n: {shape: [2, 2], dtype: i32}\n"
                     "graph:\n"
                     "  - sum_all: sum(x)\n"
                     "  - sum_02: sum(x, [0, -1], keepdim=true)\n"
                     "  - mean_1: mean(x, 1)\n"
                     "  - amax_2: amax(x, 2, keepdim=true)\n"
                     "  - amax_01: amax(x, [0, 1])\n"
                     "  - var_2: var(x, 2)\n"
                     "  - var_2_c0: var(x, -1, keepdim=true, correction=0)\n"
                     "  - var_0: var(x, 0)\n"
                     "  - var_nan: var(one, 0)\n"
                     "  - var_inf: var(three, correction=5)\n"
                     "  - lse: logsumexp(l, 1)\n"
                     "  - lse_keep: logsumexp(l, -1, keepdim=true)\n"
                     "  - sum_scalar: sum(s)\n"
                     "  - amax_nan: amax(nan)\n"
                     "  - mean_all: mean(six)\n"
                     "  - sum_i32: sum(n, 0)\n"))
    return;
  double x24[24];
  for (int i = 0; i < 24; i++)
    x24[i] = i;
  set("x", x24, 24);
  set("one", V(5, 7));
  set("three", V(1, 2, 3));
  set("l", V(1, 2, 3, -INFINITY, -INFINITY, -INFINITY, 1000, 1000, -INFINITY, INFINITY, 0, 0));
  set("s", V(5));
  set("nan", V(1, NAN, 3));
  set("six", V(1, 2, 3, 4, 5, 6));
  set("n", V(1, -2, 3, 7));
  if (run() == 0) {
    double f3 = 5.0 / 3.0;
    EXPECT("sum_all", S0, V(276));
    EXPECT("sum_02", S(1, 3, 1), V(60, 92, 124));
    EXPECT("mean_1", S(2, 4), V(4, 5, 6, 7, 16, 17, 18, 19));
    EXPECT("amax_2", S(2, 3, 1), V(3, 7, 11, 15, 19, 23));
    EXPECT("amax_01", S(4), V(20, 21, 22, 23));
    EXPECT("var_2", S(2, 3), V(f3, f3, f3, f3, f3, f3));
    EXPECT("var_2_c0", S(2, 3, 1), V(1.25, 1.25, 1.25, 1.25, 1.25, 1.25));
    EXPECT("var_0", S(3, 4), V(72, 72, 72, 72, 72, 72, 72, 72, 72, 72, 72, 72));
    EXPECT("var_nan", S(2), V(NAN, NAN));
    EXPECT("var_inf", S0, V(INFINITY));
    NEAR("lse", S(4), V(3.40760596444438, -INFINITY, 1000.6931471805599, INFINITY));
    NEAR("lse_keep", S(4, 1), V(3.40760596444438, -INFINITY, 1000.6931471805599, INFINITY));
    EXPECT("sum_scalar", S0, V(5));
    EXPECT("amax_nan", S0, V(NAN));
    EXPECT("mean_all", S0, V(3.5));
    EXPECT("sum_i32", S(2), V(4, 5));
  }
  done();
}

/* ---------------------------------------------------------------- normalisation */

/* softmax([1,2,3]) = e^x / (e + e^2 + e^3) and log_softmax = x - 3.40760596444438
 * (Python); [1000, 1001] -> [1/(1+e), e/(1+e)] (needs the max shift); along
 * dim 0 of [[1,2,3],[1,3,5]]: columns (1,1) -> 1/2 each, (2,3) -> 1/(1+e),
 * e/(1+e), (3,5) -> 1/(1+e^2), e^2/(1+e^2), and their logs; a row of -inf
 * gives NaN, like torch. */
static void test_softmax(void) {
  if (load("softmax", "inputs:\n"
                      "  x: [3]\n"
                      "  big: [1, 2]\n"
                      "  m: [2, 3]\n"
                      "  ninf: [2]\n"
                      "graph:\n"
                      "  - softmax_: softmax(x, 0)\n"
                      "  - log_softmax_: log_softmax(x, -1)\n"
                      "  - large: softmax(big, 1)\n"
                      "  - col: softmax(m, 0)\n"
                      "  - log_col: log_softmax(m, -2)\n"
                      "  - all_ninf: softmax(ninf, 0)\n"))
    return;
  set("x", V(1, 2, 3));
  set("big", V(1000, 1001));
  set("m", V(1, 2, 3, 1, 3, 5));
  set("ninf", V(-INFINITY, -INFINITY));
  if (run() == 0) {
    NEAR("softmax_", S(3), V(0.09003057317038046, 0.24472847105479767, 0.6652409557748219));
    NEAR("log_softmax_", S(3), V(-2.40760596444438, -1.4076059644443801, -0.40760596444438013));
    NEAR("large", S(1, 2), V(0.2689414213699951, 0.7310585786300049));
    NEAR("col", S(2, 3), V(0.5, 0.2689414213699951, 0.11920292202211755, 0.5, 0.7310585786300049, 0.8807970779778824));
    NEAR("log_col", S(2, 3),
         V(-0.6931471805599453, -1.3132616875182228, -2.1269280110429722, -0.6931471805599453, -0.3132616875182228,
           -0.12692801104297224));
    EXPECT("all_ninf", S(2), V(NAN, NAN));
  }
  done();
}

/* layer_norm rows [1,2,3] and [2,4,6]: mean 2 / 4, biased var 2/3 / 8/3, so
 * both normalise to [-sqrt(3/2), 0, sqrt(3/2)] = +-1.224744871391589 (eps 0).
 * With weight [1,2,3], bias [0.5,0,-0.5], eps 1e-5: (x-m)/sqrt(v+1e-5)*w+b
 * (Python). rms_norm [3,4]: mean square 12.5, so [3,4]/sqrt(12.5) (eps 0);
 * with weight [2,-1], eps 1e-6 on rows [3,4] and [1,-1] (Python). */
static void test_norm(void) {
  if (load("norm", "inputs:\n"
                   "  x: [2, 3]\n"
                   "  w: [3]\n"
                   "  b: [3]\n"
                   "  r: [1, 2]\n"
                   "  r2: [2, 2]\n"
                   "  rw: [2]\n"
                   "graph:\n"
                   "  - ln0: layer_norm(x, eps=0)\n"
                   "  - ln: layer_norm(x, w, b)\n"
                   "  - ln_w: layer_norm(x, w, eps=0)\n"
                   "  - rms0: rms_norm(r, eps=0)\n"
                   "  - rms: rms_norm(r2, rw)\n"))
    return;
  set("x", V(1, 2, 3, 2, 4, 6));
  set("w", V(1, 2, 3));
  set("b", V(0.5, 0, -0.5));
  set("r", V(3, 4));
  set("r2", V(3, 4, 1, -1));
  set("rw", V(2, -1));
  if (run() == 0) {
    double s = 1.224744871391589;
    NEAR("ln0", S(2, 3), V(-s, 0, s, -s, 0, s));
    NEAR("ln", S(2, 3), V(-0.7247356859083902, 0.0, 3.1742070577251704, -0.7247425750014138, 0.0, 3.1742277250042417));
    NEAR("ln_w", S(2, 3), V(-s, 0, 3 * s, -s, 0, 3 * s));
    NEAR("rms0", S(1, 2), V(0.848528137423857, 1.131370849898476));
    NEAR("rms", S(2, 2), V(1.697056206965467, -1.1313708046436448, 1.99999900000075, 0.999999500000375));
  }
  done();
}

/* ---------------------------------------------------------------- shape ops */

/* By hand on small matrices; the 3-D transpose and permute index lists are
 * [x(i,j,k) for k, j, i] and [x(i,j,k) for k, i, j] with x = 12i + 4j + k.
 * split(s, 2, dim=1) is the two slices [0,2) and [2,4). The empty slice and
 * zeros/ones nodes (which the language does not produce) are appended by hand. */
static void test_shape(void) {
  if (load("shape", "inputs:\n"
                    "  m: [2, 3]\n"
                    "  x: [2, 3, 4]\n"
                    "  s: [2, 4]\n"
                    "  c1: [2, 2]\n"
                    "  c2: [2, 1]\n"
                    "  r1: [1, 2]\n"
                    "  v3: [3]\n"
                    "graph:\n"
                    "  - reshape_: reshape(m, [3, 2])\n"
                    "  - reshape_infer: reshape(m, [-1])\n"
                    "  - transpose_: transpose(m, 0, 1)\n"
                    "  - transpose3: transpose(x, 2, 0)\n"
                    "  - permute_: permute(x, [2, 0, 1])\n"
                    "  - slice1: slice(s, 1, 1, 3)\n"
                    "  - slice0: slice(s, 0, 1, 2)\n"
                    "  - slice_neg: slice(s, -1, -3, -1)\n"
                    "  - left, right: split(s, 2, dim=1)\n"
                    "  - cat1: concat([c1, c2], 1)\n"
                    "  - cat0: concat([r1, c1, r1], dim=0)\n"
                    "  - us0: unsqueeze(v3, 0)\n"
                    "  - us1: unsqueeze(v3, -1)\n"
                    "  - sq: squeeze(us0, 0)\n"
                    "  - b1: broadcast_to(v3, [2, 3])\n"
                    "  - b2: broadcast_to(c2, [2, 3])\n"))
    return;
  Node *empty = append(OP_SLICE, DT_F32, S(2, 0), out("slice1"));
  empty->axis = 1, empty->lo = dim_const(2), empty->hi = dim_const(2);
  Node *zeros = append(OP_ZEROS, DT_F32, S(3), NULL);
  Node *ones = append(OP_ONES, DT_F32, S(1, 2), NULL);
  double x24[24];
  for (int i = 0; i < 24; i++)
    x24[i] = i;
  set("m", V(1, 2, 3, 4, 5, 6));
  set("x", x24, 24);
  set("s", V(0, 1, 2, 3, 4, 5, 6, 7));
  set("c1", V(1, 2, 3, 4));
  set("c2", V(5, 6));
  set("r1", V(7, 8));
  set("v3", V(1, 2, 3));
  if (run() == 0) {
    EXPECT("reshape_", S(3, 2), V(1, 2, 3, 4, 5, 6));
    EXPECT("reshape_infer", S(6), V(1, 2, 3, 4, 5, 6));
    EXPECT("transpose_", S(3, 2), V(1, 4, 2, 5, 3, 6));
    EXPECT("transpose3", S(4, 3, 2),
           V(0, 12, 4, 16, 8, 20, 1, 13, 5, 17, 9, 21, 2, 14, 6, 18, 10, 22, 3, 15, 7, 19, 11, 23));
    EXPECT("permute_", S(4, 2, 3),
           V(0, 4, 8, 12, 16, 20, 1, 5, 9, 13, 17, 21, 2, 6, 10, 14, 18, 22, 3, 7, 11, 15, 19, 23));
    EXPECT("slice1", S(2, 2), V(1, 2, 5, 6));
    EXPECT("slice0", S(1, 4), V(4, 5, 6, 7));
    EXPECT("slice_neg", S(2, 2), V(1, 2, 5, 6)); /* [-3, -1) of 4 = [1, 3) */
    EXPECT("left", S(2, 2), V(0, 1, 4, 5));
    EXPECT("right", S(2, 2), V(2, 3, 6, 7));
    EXPECT("cat1", S(2, 3), V(1, 2, 5, 3, 4, 6));
    EXPECT("cat0", S(4, 2), V(7, 8, 1, 2, 3, 4, 7, 8));
    EXPECT("us0", S(1, 3), V(1, 2, 3));
    EXPECT("us1", S(3, 1), V(1, 2, 3));
    EXPECT("sq", S(3), V(1, 2, 3));
    EXPECT("b1", S(2, 3), V(1, 2, 3, 1, 2, 3));
    EXPECT("b2", S(2, 3), V(5, 5, 5, 6, 6, 6));
    check("empty slice", empty, S(2, 0), EXACT, NULL, 0);
    check("zeros", zeros, S(3), EXACT, V(0, 0, 0));
    check("ones", ones, S(1, 2), EXACT, V(1, 1));
  }
  done();
}

/* ---------------------------------------------------------------- linear algebra */

/* torch.matmul cases by hand:
 *   [[1,2],[3,4]] @ [[5,6],[7,8]] = [[19,22],[43,50]]
 *   batch [2,2,2] @ [2,2]: the second matrix [[0,1],[1,0]] swaps rows -> [[7,8],[5,6]]
 *   [2,1,1,2] @ [3,2,1] -> [2,3,1,1]: a_i . b_j with a = [1,2],[3,4] and
 *     b = [1,1],[1,0],[0,1] -> [3,1,2, 7,3,4]
 *   [1,2] @ [[1,2],[3,4]] = [7,10];  [[1,2],[3,4]] @ [1,1] = [3,7]
 *   [1,2,3] @ [4,5,6] = 32 (a scalar)
 *   [1,0,1] @ [2,3,2] (0..11): rows 0 + 2 of each [3,2] -> [[4,6],[16,18]]
 *   [2,2,3] (0..11) @ [1,0,1]: x0 + x2 of each row -> [[2,8],[14,20]]
 * linear: x [2,3], w [[1,0,-1],[.5,.5,.5]], b [10,20]: rows [1,2,3] ->
 * [1-3, 3] + b = [8, 23]; [4,5,6] -> [-2, 7.5] + b = [8, 27.5]. */
static void test_matmul(void) {
  if (load("matmul", "inputs:\n"
                     "  a: [2, 2]\n"
                     "  b: [2, 2]\n"
                     "  ab: [2, 2, 2]\n"
                     "  p: [2, 1, 1, 2]\n"
                     "  q: [3, 2, 1]\n"
                     "  v2: [2]\n"
                     "  ones: [2]\n"
                     "  u: [3]\n"
                     "  w: [3]\n"
                     "  v101: [3]\n"
                     "  b3: [2, 3, 2]\n"
                     "  a3: [2, 2, 3]\n"
                     "  x: [2, 3]\n"
                     "  lw: [2, 3]\n"
                     "  lb: [2]\n"
                     "  x3: [1, 2, 3]\n"
                     "graph:\n"
                     "  - mm: matmul(a, b)\n"
                     "  - at: a @ b\n"
                     "  - batch: ab @ b\n"
                     "  - both: p @ q\n"
                     "  - vm: v2 @ a\n"
                     "  - mv: a @ ones\n"
                     "  - vv: u @ w\n"
                     "  - vb: v101 @ b3\n"
                     "  - bv: a3 @ v101\n"
                     "  - lin: linear(x, lw, lb)\n"
                     "  - lin0: linear(x, lw)\n"
                     "  - lin3: linear(x3, lw, lb)\n"))
    return;
  double x12[12];
  for (int i = 0; i < 12; i++)
    x12[i] = i;
  set("a", V(1, 2, 3, 4));
  set("b", V(5, 6, 7, 8));
  set("ab", V(1, 2, 3, 4, 0, 1, 1, 0));
  set("p", V(1, 2, 3, 4));
  set("q", V(1, 1, 1, 0, 0, 1));
  set("v2", V(1, 2));
  set("ones", V(1, 1));
  set("u", V(1, 2, 3));
  set("w", V(4, 5, 6));
  set("v101", V(1, 0, 1));
  set("b3", x12, 12);
  set("a3", x12, 12);
  set("x", V(1, 2, 3, 4, 5, 6));
  set("lw", V(1, 0, -1, 0.5, 0.5, 0.5));
  set("lb", V(10, 20));
  set("x3", V(1, 2, 3, 4, 5, 6));
  if (run() == 0) {
    EXPECT("mm", S(2, 2), V(19, 22, 43, 50));
    EXPECT("at", S(2, 2), V(19, 22, 43, 50));
    EXPECT("batch", S(2, 2, 2), V(19, 22, 43, 50, 7, 8, 5, 6));
    EXPECT("both", S(2, 3, 1, 1), V(3, 1, 2, 7, 3, 4));
    EXPECT("vm", S(2), V(7, 10));
    EXPECT("mv", S(2), V(3, 7));
    EXPECT("vv", S0, V(32));
    EXPECT("vb", S(2, 2), V(4, 6, 16, 18));
    EXPECT("bv", S(2, 2), V(2, 8, 14, 20));
    EXPECT("lin", S(2, 2), V(8, 23, 8, 27.5));
    EXPECT("lin0", S(2, 2), V(-2, 3, -2, 7.5));
    EXPECT("lin3", S(1, 2, 2), V(8, 23, 8, 27.5));
  }
  done();
}

/* ---------------------------------------------------------------- neural */

/* embedding: rows of [[1,2],[3,4],[5,6]] picked by [[0,2],[1,0]]; an index
 * outside [0, 3) is a run-time error naming the binding and the position. */
static void test_embedding(void) {
  static const char *model = "inputs:\n"
                             "  idx: {shape: [2, 2], dtype: i32}\n"
                             "  tab: [3, 2]\n"
                             "graph:\n"
                             "  - emb: embedding(idx, tab)\n";
  if (load("embedding", model))
    return;
  set("idx", V(0, 2, 1, 0));
  set("tab", V(1, 2, 3, 4, 5, 6));
  if (run() == 0)
    EXPECT("emb", S(2, 2, 2), V(1, 2, 5, 6, 3, 4, 1, 2));
  done();
  InterpOptions o = {0};
  set("idx", V(0, 3, 1, 0));
  expect_error(&o, "embedding 'emb': index 3 at position 1 is outside [0, 3)");
  set("idx", V(0, 1, 1, -1));
  expect_error(&o, "embedding 'emb': index -1 at position 3 is outside [0, 3)");
}

/* attention with q = k = I (2x2), v = [[1,2],[3,4]], D = 2, scale 1/sqrt2:
 * S = I/sqrt2, so row 0 weights (p, 1-p) and row 1 (1-p, p) with
 * p = e^s/(e^s+1), s = 1/sqrt2; out row 0 = p[1,2] + (1-p)[3,4] (Python).
 * Causal: row 0 sees only j = 0 -> [1,2]. scale 2, causal: row 1 weights
 * (1-q, q), q = e^2/(e^2+1). A batch [2] of q (the second q swaps the rows)
 * against unbatched k, v; Tq = 1 < Tk = 2 causal sees j = 0 only. */
static void test_attention(void) {
  if (load("attention", "inputs:\n"
                        "  q: [2, 2]\n"
                        "  k: [2, 2]\n"
                        "  v: [2, 2]\n"
                        "  qb: [2, 2, 2]\n"
                        "  q1: [1, 2]\n"
                        "graph:\n"
                        "  - att: attention(q, k, v)\n"
                        "  - causal: attention(q, k, v, causal=true)\n"
                        "  - scale2: attention(q, k, v, causal=true, scale=2)\n"
                        "  - batch: attention(qb, k, v)\n"
                        "  - short: attention(q1, k, v, true)\n"))
    return;
  set("q", V(1, 0, 0, 1));
  set("k", V(1, 0, 0, 1));
  set("v", V(1, 2, 3, 4));
  set("qb", V(1, 0, 0, 1, 0, 1, 1, 0));
  set("q1", V(1, 0));
  if (run() == 0) {
    double r0a = 1.6604769013466862, r0b = 2.6604769013466862, r1a = 2.3395230986533138, r1b = 3.3395230986533138;
    NEAR("att", S(2, 2), V(r0a, r0b, r1a, r1b));
    NEAR("causal", S(2, 2), V(1, 2, r1a, r1b));
    NEAR("scale2", S(2, 2), V(1.0, 2.0, 2.7615941559557653, 3.761594155955765));
    NEAR("batch", S(2, 2, 2), V(r0a, r0b, r1a, r1b, r1a, r1b, r0a, r0b));
    NEAR("short", S(1, 2), V(1, 2));
  }
  done();
}

/* dropout on x = 1..8 (node 1 of the graph). Not training: identity. Training
 * with seed 2^32 + 1234, step 2^32 + 7, p = 0.5 and the first dropout of the
 * spec (ordinal 0): u_j = ((philox(ctr = {j, 0, 7, 1}, key = {1234, 1 ^ 0})[0]
 * >> 8) + 0.5) * 2^-24 from a separate Python Philox (checked against
 * Random123's known answer) = [0.808, 0.205, 0.87, 0.192, 0.161, 0.979, 0.38,
 * 0.523], so elements 0, 2, 5, 7 are kept and doubled. p = 0 keeps all; p = 1
 * drops all. */
static void test_dropout(void) {
  if (load("dropout", "inputs:\n"
                      "  x: [8]\n"
                      "graph:\n"
                      "  - d: dropout(x, 0.5)\n"
                      "  - d0: dropout(x, 0)\n"
                      "  - d1: dropout(x, 1)\n"))
    return;
  set("x", V(1, 2, 3, 4, 5, 6, 7, 8));
  if (out("d")->index != 0) {
    printf("FAIL dropout: the expected mask assumes dropout ordinal 0, the graph has %d\n", out("d")->index);
    nfail++;
  }
  if (run() == 0)
    EXPECT("d", S(8), V(1, 2, 3, 4, 5, 6, 7, 8));
  done();
  InterpOptions o = {.training = 1, .seed = ((uint64_t)1 << 32) + 1234, .step = ((uint64_t)1 << 32) + 7};
  if (run_opt(&o) == 0) {
    EXPECT("d", S(8), V(2, 0, 6, 0, 0, 12, 0, 16));
    EXPECT("d0", S(8), V(1, 2, 3, 4, 5, 6, 7, 8));
    EXPECT("d1", S(8), V(0, 0, 0, 0, 0, 0, 0, 0));
  }
  done();
}

/* ---------------------------------------------------------------- losses */

/* cross_entropy on rows [1,2,3] (target 2), [0,0,0] (ignored), [1,1,1]
 * (target 0): losses log(e+e^2+e^3) - 3 = 0.40760596444438 and log 3, mean
 * (0.40760596444438 + 1.0986122886681098)/2 = 0.753109126556245 (Python).
 * [C] logits with a scalar target 0: log(e+e^2+e^3) - 1. All ignored: NaN.
 * mse_loss([[1,2],[3,4]], [1,1]): differences 0,1,2,3 -> (0+1+4+9)/4. */
static void test_losses(void) {
  static const char *model = "inputs:\n"
                             "  logits: [3, 3]\n"
                             "  t: {shape: [3], dtype: i32}\n"
                             "  t1: {shape: [3], dtype: i32}\n"
                             "  tall: {shape: [3], dtype: i32}\n"
                             "  row: [3]\n"
                             "  t0: {shape: [], dtype: i32}\n"
                             "  ma: [2, 2]\n"
                             "  mb: [2]\n"
                             "graph:\n"
                             "  - loss: cross_entropy(logits, t)\n"
                             "  - ignore1: cross_entropy(logits, t1, ignore_index=1)\n"
                             "  - all_ignored: cross_entropy(logits, tall)\n"
                             "  - rank1: cross_entropy(row, t0)\n"
                             "  - mse: mse_loss(ma, mb)\n";
  if (load("losses", model))
    return;
  set("logits", V(1, 2, 3, 0, 0, 0, 1, 1, 1));
  set("t", V(2, -100, 0));
  set("t1", V(2, 1, 0));
  set("tall", V(-100, -100, -100));
  set("row", V(1, 2, 3));
  set("t0", V(0));
  set("ma", V(1, 2, 3, 4));
  set("mb", V(1, 1));
  if (run() == 0) {
    NEAR("loss", S0, V(0.753109126556245));
    NEAR("ignore1", S0, V(0.753109126556245));
    EXPECT("all_ignored", S0, V(NAN));
    NEAR("rank1", S0, V(2.40760596444438));
    EXPECT("mse", S0, V(3.5));
  }
  done();
  InterpOptions o = {0};
  set("t", V(2, 3, 0));
  expect_error(&o, "cross_entropy 'loss': target 3 at position 1 is outside [0, 3)");
  set("t", V(2, -1, 0));
  expect_error(&o, "cross_entropy 'loss': target -1 at position 1 is outside [0, 3)");
}

/* ---------------------------------------------------------------- creation, casts */

/* cast: i32 truncates toward zero; bool is x != 0 (NaN is true); bf16 keeps 7
 * fraction bits, f16 10, f32 23 (ties to even), by hand:
 *   bf16: 1 + 2^-8 -> 1; 1 + 3*2^-8 -> 1 + 2^-6; 3.4e38 -> inf (past the tie
 *         (2 - 2^-8) * 2^127)
 *   f16:  65519 -> 65504; 65520 -> inf; 3e-8 -> 2^-24; 1 + 2^-11 -> 1
 *   f32:  0.1 -> 0.100000001490116119384765625; 2^24 + 1 -> 2^24
 * and the creation ops: arange(5), full, zeros, ones, a literal. */
static void test_creation_cast(void) {
  if (load("creation/cast", "inputs:\n"
                            "  x: [4]\n"
                            "  b: [4]\n"
                            "  bf: [3]\n"
                            "  hf: [4]\n"
                            "  ff: [2]\n"
                            "graph:\n"
                            "  - to_i32: cast(x, i32)\n"
                            "  - to_bool: cast(b, bool)\n"
                            "  - to_bf16: cast(bf, bf16)\n"
                            "  - to_f16: cast(hf, f16)\n"
                            "  - to_f32: cast(cast(ff, bf16), f32)\n"
                            "  - arange_: arange(5)\n"
                            "  - full_: full([2, 2], 7.5)\n"
                            "  - zeros_: zeros([3])\n"
                            "  - ones_: ones([1, 2], dtype=i32)\n"
                            "  - lit: 2.5\n"))
    return;
  set("x", V(1.7, -1.7, -0.5, 2));
  set("b", V(0, 0.1, -2, NAN));
  set("bf", V(1 + 0x1p-8, 1 + 3 * 0x1p-8, 3.4e38));
  set("hf", V(65519, 65520, 3e-8, 1 + 0x1p-11));
  set("ff", V(1 + 0x1p-8, 1 + 3 * 0x1p-8)); /* through bf16: 1, 1 + 2^-6 */
  if (run() == 0) {
    EXPECT("to_i32", S(4), V(1, -1, 0, 2));
    EXPECT("to_bool", S(4), V(0, 1, 1, 1));
    EXPECT("to_bf16", S(3), V(1, 1.015625, INFINITY));
    EXPECT("to_f16", S(4), V(65504, INFINITY, 0x1p-24, 1));
    EXPECT("to_f32", S(2), V(1, 1.015625));
    EXPECT("arange_", S(5), V(0, 1, 2, 3, 4));
    EXPECT("full_", S(2, 2), V(7.5, 7.5, 7.5, 7.5));
    EXPECT("zeros_", S(3), V(0, 0, 0));
    EXPECT("ones_", S(1, 2), V(1, 1));
    EXPECT("lit", S0, V(2.5));
  }
  done();
  if (load("cast f32", "inputs:\n"
                       "  ff: {shape: [2], dtype: i32}\n"
                       "graph:\n"
                       "  - to_f32: cast(ff, f32)\n"))
    return;
  set("ff", V(16777217, -16777219)); /* 2^24 + 1 -> 2^24 (tie to even); -(2^24 + 3) -> -(2^24 + 4) */
  if (run() == 0)
    EXPECT("to_f32", S(2), V(16777216, -16777220));
  done();
}

/* ---------------------------------------------------------------- sizes, guards */

/* A dynamic dim B (max 8) run at B = 3: x [B+1, 2], arange(B), B as a value,
 * slice [1, B+1) along dim 0, sum over dim 0, and a size 2B/4 that must divide
 * (a derived symbol). The guards: B outside [1, max], an input whose shape
 * does not match, a quotient that does not divide, missing dim values. */
static void test_symbolic(void) {
  if (load("symbolic", "dims:\n"
                       "  B: {dynamic: true, max: 8}\n"
                       "inputs:\n"
                       "  x: [B + 1, 2]\n"
                       "graph:\n"
                       "  - ar: arange(B)\n"
                       "  - bv: B\n"
                       "  - sl: slice(x, 0, 1, B + 1)\n"
                       "  - sm: sum(x, 0)\n"
                       "  - half: arange(B * 2 / 4)\n"))
    return;
  int64_t symv[MAXSYM] = {0};
  int b = sym("B");
  InterpOptions o = {.symvals = symv};
  symv[b] = 2;
  set_shaped("x", S(3, 2), V(1, 2, 3, 4, 5, 6));
  if (run_opt(&o) == 0) {
    EXPECT("ar", S(2), V(0, 1));
    EXPECT("bv", S0, V(2));
    EXPECT("sl", S(2, 2), V(3, 4, 5, 6));
    EXPECT("sm", S(2), V(9, 12));
    EXPECT("half", S(1), V(0));
  }
  done();
  symv[b] = 9;
  expect_error(&o, "dim B is 9, expected 1 <= B <= 8");
  symv[b] = 4;
  expect_error(&o, "input 'x': dim 0 is 3, expected 5");
  set_shaped("x", S(4, 2), V(1, 2, 3, 4, 5, 6, 7, 8));
  symv[b] = 3;
  expect_error(&o, "does not divide");
  o.symvals = NULL;
  expect_error(&o, "needs the values of the dynamic dims");

  if (load("input checks", "inputs:\n"
                           "  x: [2, 4]\n"
                           "graph:\n"
                           "  - y: neg(x)\n"))
    return;
  InterpOptions o2 = {0};
  set_shaped("x", S(2, 5), V(1, 2, 3, 4, 5, 6, 7, 8, 9, 10));
  expect_error(&o2, "input 'x': dim 1 is 5, expected 4");
  set_shaped("x", S(8), V(1, 2, 3, 4, 5, 6, 7, 8));
  expect_error(&o2, "input 'x': rank is 1, expected 2");
}

int main(void) {
  test_unary();
  test_binary();
  test_compare_select();
  test_reduce();
  test_softmax();
  test_norm();
  test_shape();
  test_matmul();
  test_embedding();
  test_attention();
  test_dropout();
  test_losses();
  test_creation_cast();
  test_symbolic();
  arena_free(&arena);
  printf("%d passed, %d failed\n", npass, nfail);
  return nfail != 0;
}
