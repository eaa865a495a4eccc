/* plan.c: the buffers of a scheduled pass and where they live.
 *
 * Inputs and params are the caller's and the model's memory; a gradient is
 * written straight into the gradient buffer, an input's gradient (train.wrt)
 * into the caller's buffer for it and an output into the caller's output
 * buffer when a kernel computes it (else it is copied there at the end); a
 * stored reshape of a stored value is an alias of its bytes. Every
 * other stored value gets a slot in the pass's one arena, sized for each
 * dynamic dim's max, live from the kernel that writes it to the last kernel
 * that reads it. Slots are placed largest first, each at the lowest
 * 256-aligned offset that no live slot occupies, so values whose lifetimes do
 * not overlap share bytes; the arena's size is the peak, known here, at
 * generation time.
 *
 * In place: a loop kernel K may store its value O in the slot of a value I
 * that it reads for the last time (I's last reader is K, I written by an
 * earlier kernel), when O and I have the same bytes and element size and
 * K's printed code, on both targets, writes each element of O only after
 * every read of I's element there, by any thread, is done. The renderer
 * proves it on the code it prints (render_inplace_ok), not on the graph:
 *   - every store of O is in one phase P of the kernel (a pointwise loop;
 *     a row kernel's loop after its reductions: the cross-entropy's
 *     softmax - onehot, the layer norm's output), at the element the loop
 *     is at, by every thread (not one lane for the others);
 *   - a read of I in P is at that same element (the same index text in the
 *     same loop: the same address, since both start at the slot's start and
 *     their elements have one size), printed before the store (or a vector
 *     load, which precedes the lanes, whose vector store follows them);
 *   - a read of I elsewhere (a row's reductions; a gather of the logit at
 *     the target in the values over the row, which the renderer then prints
 *     before P) happens before P starts: on the CPU a row is one thread's
 *     loop, in order; on CUDA a row is one warp's or one block's (never
 *     split over blocks), and P starts with __syncwarp or __syncthreads,
 *     so every thread of the row has done its reads; a pointwise kernel's
 *     thread reads and writes its own elements;
 *   - no read of I after P, and no read through another name (an alias).
 * Then the two pointers of K name the same bytes: K's parameters for them
 * are not restrict. The pair shares one slot, live from I's writer to O's
 * last reader; plan_check allows exactly those overlaps. One pair a kernel;
 * a chain (O in place of I, then O2 in place of O) is one slot. GPT-2's
 * gradient of the logits takes the logits' 1.6 GB, the layer norms' outputs
 * their inputs', the residual stream's gradient its previous value's. */
#include "ir.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALIGN(n) (((n) + 255) & ~(int64_t)255)

/* Is s `pre` followed by digits alone (a renderer's numbered local: s3, acc0)? */
static int numbered(const char *s, const char *pre) {
  size_t n = strlen(pre);
  if (strncmp(s, pre, n) || !s[n])
    return 0;
  for (s += n; *s; s++)
    if (!isdigit((unsigned char)*s))
      return 0;
  return 1;
}

/* A name a kernel's locals and parameters cannot take: the C names of
 * c_reserved, and the emitted code's own locals (a CPU kernel's chunk
 * bounds and counter, lo, hi and next, and its riders' sums; a CUDA row
 * kernel's riders' sums, csum and rsum, and its column kernel's count of
 * partials, nb; the renderer's numbered values). */
static int is_keyword(const char *s, const char *model) {
  static const char *const kw[] = {"ws", "P", "G", "m", "sym", "in", "out", "bad", "st", "i", "o", "r", "n", "n_o",
                                   "n_r", "o0", "live", "gemm", "lb", "iv", "nv", "lane", "split_part", "split_count",
                                   "c", "nc", "rv", "nrv", "rj", "qv", "kv", "vv", "yv", "dyv", "dqv", "dkv", "dvv",
                                   "lo", "hi", "next", "tot", "part", "cpart", "j", "nb", "csum", "rsum", NULL};
  static const char *const pre[] = {"s", "q", "ca", "acc", "sa", "sb", "sy", "ix", NULL};
  for (int i = 0; kw[i]; i++)
    if (!strcmp(s, kw[i]))
      return 1;
  for (int i = 0; pre[i]; i++)
    if (numbered(s, pre[i]))
      return 1;
  return c_reserved(s, model) || !strncmp(s, "dim_", 4) || (s[0] == 'k' && isdigit((unsigned char)s[1])) ||
         (s[0] == 'v' && isdigit((unsigned char)s[1]));
}

/* The names taken so far: an open-addressing set, each entry with the next
 * suffix to try for a name built on it (so n equal names cost O(n), not
 * O(n^2) or worse). */
typedef struct Names {
  const char **key;
  int *next;
  int cap, n; /* cap a power of two, at least twice n */
} Names;

static int names_slot(const Names *t, const char *s) {
  uint32_t h = 2166136261u;
  for (const char *c = s; *c; c++)
    h = (h ^ (unsigned char)*c) * 16777619u;
  int i = (int)(h & (uint32_t)(t->cap - 1));
  while (t->key[i] && strcmp(t->key[i], s))
    i = (i + 1) & (t->cap - 1);
  return i;
}

static int names_add(Arena *a, Names *t, const char *s) {
  if (2 * (t->n + 1) > t->cap) {
    Names o = *t;
    t->cap = o.cap ? 2 * o.cap : 256;
    t->key = arena_alloc(a, sizeof(char *) * (size_t)t->cap);
    t->next = arena_alloc(a, sizeof(int) * (size_t)t->cap);
    for (int i = 0; i < o.cap; i++)
      if (o.key[i]) {
        int j = names_slot(t, o.key[i]);
        t->key[j] = o.key[i];
        t->next[j] = o.next[i];
      }
  }
  int i = names_slot(t, s);
  if (!t->key[i]) {
    t->key[i] = s;
    t->next[i] = 2;
    t->n++;
  }
  return i;
}

/* A C identifier from a binding or param name ("h.0.ln_w" -> "h_0_ln_w"),
 * unique among the names taken so far. */
static const char *c_name(Arena *a, Names *taken, const char *base, const char *model) {
  char *s = arena_printf(a, "%s%s", base && *base && isdigit((unsigned char)*base) ? "v" : "", base && *base ? base : "t");
  for (char *c = s; *c; c++)
    if (!isalnum((unsigned char)*c) && *c != '_')
      *c = '_';
  const char *name = is_keyword(s, model) ? arena_printf(a, "%s_", s) : s;
  if (taken->cap && taken->key[names_slot(taken, name)]) { /* taken: the next free s_K */
    int b = names_add(a, taken, s), k = taken->next[b];
    do
      name = arena_printf(a, "%s_%d", s, k++);
    while (taken->key[names_slot(taken, name)]);
    taken->next[names_add(a, taken, s)] = k; /* the slot may have moved */
  }
  names_add(a, taken, name);
  return name;
}

/* A C identifier from the part of a name after its block instance's path
 * ("h.0.ln_1_w" -> "ln_1_w"), with `pre` before it; not made unique. */
static const char *local_name(Arena *a, const char *pre, const char *base, const char *model) {
  const char *dot = base ? strrchr(base, '.') : NULL;
  char *s = arena_printf(a, "%s%s", pre, dot ? dot + 1 : base && *base ? base : "t");
  if (isdigit((unsigned char)*s))
    s = arena_printf(a, "v%s", s);
  for (char *c = s; *c; c++)
    if (!isalnum((unsigned char)*c) && *c != '_')
      *c = '_';
  return is_keyword(s, model) ? arena_printf(a, "%s_", s) : s;
}

static const Buffer *sort_b;
static int by_size(const void *x, const void *y) {
  const Buffer *b = sort_b;
  int i = *(const int *)x, j = *(const int *)y;
  if (b[i].bytes != b[j].bytes)
    return b[i].bytes > b[j].bytes ? -1 : 1;
  return i - j;
}

/* slot[i]: the first buffer of b[i]'s chain of in-place pairs (its slot's),
 * each chain walked once. */
static void slots(const Buffer *b, int nb, int *slot) {
  for (int i = 0; i < nb; i++)
    slot[i] = b[i].inplace < 0 ? i : -1;
  for (int i = 0; i < nb; i++) {
    int r = i;
    while (slot[r] < 0)
      r = b[r].inplace;
    for (int j = i; slot[j] < 0; j = b[j].inplace)
      slot[j] = slot[r];
  }
}

static int64_t place(Buffer *b, int nb) {
  int *ord = malloc(sizeof(int) * (size_t)(nb + 1)), *end = malloc(sizeof(int) * (size_t)(nb + 1));
  int *at_of = malloc(sizeof(int) * (size_t)(nb + 1)); /* the placed buffers by offset */
  int *slot = malloc(sizeof(int) * (size_t)(nb + 1));
  if (!ord || !end || !at_of || !slot)
    die("out of memory");
  /* a chain of in-place pairs is one slot, live from its first buffer's
   * writer to its last buffer's last reader */
  slots(b, nb, slot);
  for (int i = 0; i < nb; i++)
    end[i] = b[i].last;
  for (int i = 0; i < nb; i++)
    if (b[i].home == HOME_ARENA && b[i].inplace >= 0)
      end[slot[i]] = b[i].last > end[slot[i]] ? b[i].last : end[slot[i]];
  int n = 0;
  for (int i = 0; i < nb; i++)
    if (b[i].home == HOME_ARENA && b[i].inplace < 0)
      ord[n++] = i;
  sort_b = b;
  qsort(ord, (size_t)n, sizeof(int), by_size);
  int64_t peak = 0;
  for (int i = 0; i < n; i++) {
    Buffer *x = &b[ord[i]];
    /* the lowest gap: walk the placed buffers by offset, past each one live
     * at the same time that starts below the end of x placed at `at` */
    int64_t at = 0;
    for (int j = 0; j < i; j++) {
      const Buffer *y = &b[at_of[j]];
      if (y->offset >= at + ALIGN(x->bytes))
        break;
      if (y->bytes && y->first <= end[ord[i]] && x->first <= end[at_of[j]] && y->offset + ALIGN(y->bytes) > at)
        at = y->offset + ALIGN(y->bytes);
    }
    x->offset = at;
    if (at + ALIGN(x->bytes) > peak)
      peak = at + ALIGN(x->bytes);
    int lo = 0, hi = i; /* after the placed ones at offsets <= at */
    while (lo < hi) {
      int mid = (lo + hi) / 2;
      if (b[at_of[mid]].offset <= at)
        lo = mid + 1;
      else
        hi = mid;
    }
    memmove(at_of + lo + 1, at_of + lo, sizeof(int) * (size_t)(i - lo));
    at_of[lo] = ord[i];
  }
  for (int i = 0; i < nb; i++)
    if (b[i].home == HOME_ARENA && b[i].inplace >= 0)
      b[i].offset = b[slot[i]].offset;
  free(ord);
  free(end);
  free(at_of);
  free(slot);
  return peak;
}

/* Where final k of a pass goes: the forward's outputs, the loss (final 0
 * of the loss and train passes) at out[0], the params' gradients in place,
 * then the gradients of the train.wrt inputs at out[1 + j]. */
void final_home(const BPass *p, int k, Home *h, int *index) {
  int np = p->g->nparams;
  *h = p->kind == PASS_FORWARD || k == 0 ? HOME_OUTPUT : k - 1 < np ? HOME_GRAD : HOME_IGRAD;
  *index = p->kind == PASS_FORWARD ? k : k == 0 ? 0 : k - 1 < np ? k - 1 : k - 1 - np;
}

/* the most pairs tried (each a printing of the kernel) a kernel: in a pass
 * whose values all have one size, every stored value a kernel reads last
 * is a candidate for each it stores; generation stays linear */
#define MAX_INPLACE_TRIES 4

static int64_t elem_size(const Node *n) { return n->dtype == DT_BOOL ? 1 : dtype_size(n->dtype); }

/* The in-place pairs (see the header): for each loop kernel, the first of
 * its stored arena values and the first buffer it reads last that fit
 * (same bytes and element size, written by an earlier kernel, neither a
 * host of placed values) and that the printed kernel proves safe on both
 * targets (render_inplace_ok); at most one pair a kernel, at most
 * MAX_INPLACE_TRIES tried, and a buffer gives its bytes once. */
static void in_place(BPass *p) {
  /* debugging aid: TGEN_INPLACE_LIMIT=N allows only each pass's first N
   * pairs, to bisect a wrong result to the pair that made it */
  int limit = getenv("TGEN_INPLACE_LIMIT") ? atoi(getenv("TGEN_INPLACE_LIMIT")) : 1 << 30, npairs = 0;
  LoadWalk *w = p->walk;
  char *taken = arena_alloc(p->g->arena, (size_t)p->nb + 1);
  int *ld = arena_alloc(p->g->arena, sizeof(int) * (size_t)(p->n + 1));
  for (int c = 0; c < p->nk; c++) {
    const Kernel *k = p->k[c];
    if (k->kind != K_LOOP || npairs >= limit)
      continue;
    kernel_loads(p, k, w);
    int nld = w->nlist, paired = 0, tries = 0;
    memcpy(ld, w->list, sizeof(int) * (size_t)nld);
    for (int i = 0; i < k->nouts && !paired && tries < MAX_INPLACE_TRIES; i++) {
      int bo = p->buf[k->outs[i]->id];
      Buffer *o = bo >= 0 ? &p->b[bo] : NULL;
      if (!o || o->home != HOME_ARENA || o->first != c || !o->bytes || p->host[o->node->id])
        continue;
      for (int q = 0; q < nld && !paired && tries < MAX_INPLACE_TRIES; q++) {
        int bi = p->buf[ld[q]];
        const Buffer *x = bi >= 0 ? &p->b[bi] : NULL;
        if (!x || x->home != HOME_ARENA || taken[bi] || x->last != c || x->first >= c || x->bytes != o->bytes ||
            elem_size(x->node) != elem_size(o->node) || p->host[x->node->id])
          continue;
        o->inplace = bi;
        tries++;
        if (render_inplace_ok(p, k))
          taken[bi] = paired = 1, npairs++;
        else
          o->inplace = -1;
      }
    }
  }
}

void plan(BPass *p) {
  Graph *g = p->g;
  Arena *a = g->arena;
  p->b = arena_alloc(a, sizeof(Buffer) * (size_t)(p->n + p->nfinals + 1));
  p->buf = arena_alloc(a, sizeof(int) * (size_t)(p->n + 1));
  Names taken = {0};
  for (int i = 0; i < p->n; i++)
    p->buf[i] = -1;
  /* the kernels' reads */
  LoadWalk *w = p->walk;
  int *last = arena_alloc(a, sizeof(int) * (size_t)(p->n + 1));
  for (int i = 0; i < p->n; i++)
    last[i] = -1;
  for (int c = 0; c < p->nk; c++) {
    kernel_loads(p, p->k[c], w);
    for (int q = 0; q < w->nlist; q++) {
      const Node *x = p->nodes[w->list[q]];
      last[x->id] = c; /* (an alias's target is among the loads: kernel_loads) */
    }
  }
  for (int k = 0; k < p->nfinals; k++)
    last[p->finals[k]->id] = p->nk;
  /* homes of the finals */
  int *home = arena_alloc(a, sizeof(int) * (size_t)(p->n + 1)), *hidx = arena_alloc(a, sizeof(int) * (size_t)(p->n + 1));
  for (int i = 0; i < p->n; i++)
    home[i] = -1;
  for (int k = 0; k < p->nfinals; k++) {
    Node *n = p->finals[k];
    Home h;
    int idx;
    final_home(p, k, &h, &idx);
    if (p->kern[n->id] < 0) { /* a reshape of a value computed here: that value is stored there */
      Node *x = n->in[0];
      if (!(n->op == OP_RESHAPE || n->op == OP_SQUEEZE || n->op == OP_UNSQUEEZE) || p->kern[x->id] < 0 ||
          !p->realized[x->id] || home[x->id] >= 0 || p->k[p->kern[x->id]]->kind == K_EXTERN ||
          x->dtype != n->dtype || p->place[x->id])
        continue;
      n = x;
    }
    if (home[n->id] >= 0 || p->k[p->kern[n->id]]->kind == K_EXTERN)
      continue; /* already placed, or a library call's own buffer: copied at the end */
    home[n->id] = h;
    hidx[n->id] = idx;
  }
  /* later[i]: a later node has node i's binding (name and scope): node i is
   * an intermediate of the binding, named after its op too (a table of
   * (name, scope) pointers, filled from the end: linear) */
  char *later = arena_alloc(a, (size_t)p->n + 1);
  {
    int cap = 256;
    while (cap < 2 * p->n + 2)
      cap *= 2;
    const Node **seen = arena_alloc(a, sizeof(Node *) * (size_t)cap);
    for (int i = p->n - 1; i >= 0; i--) {
      const Node *n = p->nodes[i];
      if (!n->name)
        continue;
      uintptr_t h = ((uintptr_t)n->name * 31u) ^ (uintptr_t)n->scope;
      int j = (int)((h ^ (h >> 17)) & (uintptr_t)(cap - 1));
      while (seen[j] && !(seen[j]->name == n->name && seen[j]->scope == n->scope))
        j = (j + 1) & (cap - 1);
      later[i] = seen[j] != NULL;
      if (!seen[j])
        seen[j] = n;
    }
  }
  /* the buffers, in node order; an alias's or a placed value's target is
   * looked up once all exist (a host follows the values placed in it) */
  int *target = arena_alloc(a, sizeof(int) * (size_t)(p->n + p->nfinals + 1));
  for (int i = 0; i < p->n; i++) {
    Node *n = p->nodes[i];
    int leaf = n->op == OP_INPUT || n->op == OP_PARAM;
    if (!leaf && !p->realized[i])
      continue;
    if (leaf && last[i] < 0)
      continue;
    Buffer *b = &p->b[p->nb];
    b->node = n;
    b->inplace = -1;
    b->bytes = layout_bytes(p, n);
    b->first = p->kern[i] >= 0 ? p->kern[i] : p->host[i] ? p->nk : 0; /* a host: from its first placed value's kernel */
    b->last = last[i] < b->first && !p->host[i] ? b->first : last[i];
    target[p->nb] = -1;
    if (n->op == OP_INPUT) {
      b->home = HOME_INPUT, b->index = n->index;
      b->name = c_name(a, &taken, g->inputs[n->index].name, g->spec->name);
      b->pname = local_name(a, "", g->inputs[n->index].name, g->spec->name);
    } else if (n->op == OP_PARAM) {
      b->home = HOME_PARAM, b->index = n->index;
      b->name = c_name(a, &taken, g->params[n->index].name, g->spec->name);
      b->pname = local_name(a, "", g->params[n->index].name, g->spec->name);
    } else if (p->kern[i] < 0 && !p->host[i]) { /* a view of stored bytes */
      Layout l;
      if (!layout_alias(p, n, &l))
        die("plan: a stored %s (%%%d) with no kernel is not an alias", op_info[n->op].name, i);
      b->home = HOME_ALIAS, target[p->nb] = l.host->id;
      b->off = l.off;
      b->name = c_name(a, &taken, n->name, g->spec->name);
      b->pname = local_name(a, "", n->name, g->spec->name);
    } else {
      b->home = home[i] >= 0 ? (Home)home[i] : HOME_ARENA;
      b->index = home[i] >= 0 ? hidx[i] : -1;
      if (p->place[i]) { /* in its host's buffer, at an offset */
        b->home = HOME_ALIAS, target[p->nb] = p->place[i]->host->id;
        b->off = p->place[i]->off;
      }
      const char *base = n->name ? n->name : "t", *local = base;
      if (n->scope && n->scope[0])
        base = arena_printf(a, "%s_%s", n->scope, base);
      if (home[i] == HOME_GRAD) {
        base = arena_printf(a, "d_%s", g->params[hidx[i]].name);
        local = local_name(a, "d_", g->params[hidx[i]].name, g->spec->name);
      } else if (home[i] == HOME_IGRAD)
        local = base = arena_printf(a, "d_%s", g->inputs[g->wrt[hidx[i]]].name);
      else if (home[i] == HOME_OUTPUT && p->kind == PASS_FORWARD)
        local = base = g->output_names[hidx[i]];
      else if (later[i] || !n->name) { /* the binding's own value keeps its name; others add the op */
        base = arena_printf(a, "%s_%s", base, op_info[n->op].name);
        local = arena_printf(a, "%s_%s", local, op_info[n->op].name);
      }
      b->name = c_name(a, &taken, base, g->spec->name);
      b->pname = local_name(a, "", local, g->spec->name);
    }
    p->buf[i] = p->nb++;
  }
  for (int i = 0; i < p->nb; i++)
    if (target[i] >= 0 && (p->b[i].index = p->buf[target[i]]) < 0)
      die("plan: %s aliases an unplaced value (%s)", p->b[i].name, op_info[p->nodes[target[i]]->op].name);
  /* aliases keep their target alive, and a placed value's kernel starts its
   * host's life (chains of them: until nothing changes) */
  for (int changed = 1; changed;) {
    changed = 0;
    for (int i = 0; i < p->nb; i++)
      if (p->b[i].home == HOME_ALIAS) {
        Buffer *x = &p->b[i], *t = &p->b[x->index];
        int placed = p->place[x->node->id] != NULL;
        if (x->last > t->last || (placed && x->first < t->first)) {
          t->last = x->last > t->last ? x->last : t->last;
          t->first = placed && x->first < t->first ? x->first : t->first;
          changed = 1;
        }
      }
  }
  in_place(p);
  p->arena = place(p->b, p->nb);
}

int plan_check(const BPass *p, char *err, size_t errlen) {
  for (int i = 0; i < p->nb; i++)
    for (int j = i + 1; j < p->nb; j++) {
      const Buffer *x = &p->b[i], *y = &p->b[j];
      if (x->home != HOME_ARENA || y->home != HOME_ARENA || !x->bytes || !y->bytes)
        continue;
      int live = x->first <= y->last && y->first <= x->last;
      int over = x->offset < y->offset + y->bytes && y->offset < x->offset + x->bytes;
      /* the one exception: an in-place pair, the output written over its
       * input by the input's last reader, the same bytes at the same offset */
      const Buffer *in = y->inplace == i ? x : x->inplace == j ? y : NULL, *out = in == x ? y : x;
      if (live && over && in && in->last == out->first && in->offset == out->offset && in->bytes == out->bytes)
        continue;
      if (live && over) {
        snprintf(err, errlen, "buffers %s [%d, %d] and %s [%d, %d] are live together and overlap", x->name, x->first,
                 x->last, y->name, y->first, y->last);
        return -1;
      }
    }
  for (int i = 0; i < p->nb; i++)
    if (p->b[i].home == HOME_ARENA && p->b[i].offset + p->b[i].bytes > p->arena) {
      snprintf(err, errlen, "%s ends past the arena (%lld bytes)", p->b[i].name, (long long)p->arena);
      return -1;
    }
  return 0;
}
