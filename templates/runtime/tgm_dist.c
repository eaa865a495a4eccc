/* tgm_dist.c: data-parallel training across GPUs (projects generated with
 * --distributed nccl): the NCCL collectives the training step enqueues
 * (tgm_model.c's dist_ functions) and the rendezvous that hands every rank
 * the NCCL id. The collectives are NCCL's; this file only maps the model's
 * buffers onto them. Built without NCCL (-DTGM_NCCL=OFF), the collectives
 * are stubs that fail and tgm_nccl_available() says 0.
 *
 * Rendezvous (host only, POSIX):
 *   file:PATH      rank 0 writes the id into PATH.tmp.PID and links it to
 *                  PATH (atomic; fails if PATH exists); the others poll for
 *                  PATH. Rank 0 removes PATH once every rank has joined.
 *   tcp:HOST:PORT  rank 0 listens on PORT (every interface) and sends the id
 *                  to each of the nranks - 1 ranks that connect to HOST:PORT. */
#include "tgm_rt.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#ifdef TGM_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

/* ---------------------------------------------------------------- rendezvous */

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void nap_ms(int ms) {
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

static int say(char *err, size_t n, const char *fmt, const char *a, const char *b) {
  if (err && n)
    snprintf(err, n, fmt, a, b);
  return -1;
}

static int write_all(int fd, const void *p, size_t n) {
  const unsigned char *c = p;
  while (n) {
    ssize_t k = write(fd, c, n);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      return -1;
    c += k, n -= (size_t)k;
  }
  return 0;
}

/* n bytes from fd, waiting at most until `deadline` (now_s()). */
static int read_all(int fd, void *p, size_t n, double deadline) {
  unsigned char *c = p;
  while (n) {
    struct pollfd pf = {fd, POLLIN, 0};
    int left = (int)((deadline - now_s()) * 1000);
    if (left <= 0 || poll(&pf, 1, left) <= 0)
      return -1;
    ssize_t k = read(fd, c, n);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      return -1;
    c += k, n -= (size_t)k;
  }
  return 0;
}

static int file_rendezvous(const char *path, int rank, double timeout_s, void *id, char *err, size_t errlen) {
  double deadline = now_s() + timeout_s;
  if (rank == 0) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (tgm_nccl_new_id(id, err, errlen))
      return -1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
      return say(err, errlen, "rendezvous: cannot create %s: %s", tmp, strerror(errno));
    int bad = write_all(fd, id, TGM_NCCL_ID_BYTES) || fsync(fd);
    bad |= close(fd) != 0;
    if (bad) {
      unlink(tmp);
      return say(err, errlen, "rendezvous: cannot write %s: %s", tmp, strerror(errno));
    }
    if (link(tmp, path)) { /* atomic, and refuses an existing PATH */
      int e = errno;
      unlink(tmp);
      if (e == EEXIST)
        return say(err, errlen, "rendezvous: %s exists already (left by an earlier run?): remove it or name a new "
                                "file%s", path, "");
      return say(err, errlen, "rendezvous: cannot create %s: %s", path, strerror(e));
    }
    unlink(tmp);
    return 0;
  }
  for (;;) {
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
      int ok = read_all(fd, id, TGM_NCCL_ID_BYTES, deadline) == 0;
      close(fd);
      if (ok)
        return 0;
    }
    if (now_s() > deadline)
      return say(err, errlen, "rendezvous: rank 0 did not write %s in time%s (is rank 0 running, and is the file on a "
                              "filesystem every rank sees?)", path, "");
    nap_ms(50);
  }
}

static const char magic[8] = "tgmnccl";

static int tcp_rendezvous(const char *hostport, int rank, int nranks, double timeout_s, void *id, char *err,
                          size_t errlen) {
  double deadline = now_s() + timeout_s;
  char host[256];
  const char *colon = strrchr(hostport, ':');
  if (!colon || colon == hostport || !colon[1] || (size_t)(colon - hostport) >= sizeof host)
    return say(err, errlen, "rendezvous: 'tcp:%s' is not tcp:HOST:PORT%s", hostport, "");
  snprintf(host, sizeof host, "%.*s", (int)(colon - hostport), hostport);
  const char *port = colon + 1;
  struct addrinfo hints, *ai = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = rank == 0 ? AI_PASSIVE : 0;
  int g = getaddrinfo(rank == 0 ? NULL : host, port, &hints, &ai);
  if (g || !ai)
    return say(err, errlen, "rendezvous: cannot resolve %s: %s", hostport, gai_strerror(g));
  if (rank == 0) {
    int ls = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol), one = 1;
    if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) || bind(ls, ai->ai_addr, ai->ai_addrlen) ||
        listen(ls, nranks)) {
      int e = errno;
      if (ls >= 0)
        close(ls);
      freeaddrinfo(ai);
      return say(err, errlen, "rendezvous: cannot listen on port %s: %s", port, strerror(e));
    }
    freeaddrinfo(ai);
    if (tgm_nccl_new_id(id, err, errlen)) {
      close(ls);
      return -1;
    }
    for (int joined = 1; joined < nranks;) {
      struct pollfd pf = {ls, POLLIN, 0};
      int left = (int)((deadline - now_s()) * 1000);
      if (left <= 0 || poll(&pf, 1, left) <= 0) {
        close(ls);
        return say(err, errlen, "rendezvous: not every rank connected to port %s in time%s", port, "");
      }
      int c = accept(ls, NULL, NULL);
      if (c < 0)
        continue;
      if (!write_all(c, magic, sizeof magic) && !write_all(c, id, TGM_NCCL_ID_BYTES))
        joined++;
      close(c);
    }
    close(ls);
    return 0;
  }
  for (;;) {
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
      int c = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (c < 0)
        continue;
      char got[sizeof magic];
      int ok = !connect(c, a->ai_addr, a->ai_addrlen) && !read_all(c, got, sizeof got, deadline) &&
               !memcmp(got, magic, sizeof magic) && !read_all(c, id, TGM_NCCL_ID_BYTES, deadline);
      close(c);
      if (ok) {
        freeaddrinfo(ai);
        return 0;
      }
    }
    if (now_s() > deadline) {
      freeaddrinfo(ai);
      return say(err, errlen, "rendezvous: could not get the id from rank 0 at %s in time%s", hostport, "");
    }
    nap_ms(100);
  }
}

int tgm_rendezvous(const char *how, int rank, int nranks, double timeout_s, void *id, char *err, size_t errlen) {
  if (!strncmp(how, "file:", 5) && how[5])
    return file_rendezvous(how + 5, rank, timeout_s, id, err, errlen);
  if (!strncmp(how, "tcp:", 4))
    return tcp_rendezvous(how + 4, rank, nranks, timeout_s, id, err, errlen);
  return say(err, errlen, "rendezvous: '%s' is neither file:PATH nor tcp:HOST:PORT%s", how, "");
}

void tgm_rendezvous_done(const char *how, int rank) {
  if (rank == 0 && !strncmp(how, "file:", 5))
    unlink(how + 5); /* every rank has joined: nobody reads it again */
}

/* ---------------------------------------------------------------- NCCL */

#ifdef TGM_HAVE_NCCL
cudaStream_t tgm_cuda_ctx_stream(tgm_cuda_ctx *cx, const char *op);

/* A rank's NCCL state: the communicator, and a side stream (with the events
 * that fork it from the model's stream and join it back) on which the
 * gradients of a training step are averaged while the backward goes on. */
typedef struct nccl {
  ncclComm_t comm;
  cudaStream_t side;
  cudaEvent_t fork, join;
} nccl;

_Static_assert(sizeof(ncclUniqueId) == TGM_NCCL_ID_BYTES, "the NCCL id's size");

int tgm_nccl_available(void) { return 1; }

static ncclDataType_t nccl_type(int dt) {
  switch (dt) {
  case TGM_BF16: return ncclBfloat16;
  case TGM_F16: return ncclFloat16;
  case TGM_I32: return ncclInt32;
  case TGM_NCCL_F64: return ncclFloat64;
  default: return ncclFloat32;
  }
}

/* An NCCL result: 0, or the error (with NCCL's last message) in the context. */
static int nccl_check(tgm_cuda_ctx *cx, void *comm, ncclResult_t r, const char *what) {
  if (r == ncclSuccess)
    return 0;
  const char *last = comm ? ncclGetLastError((ncclComm_t)comm) : NULL;
  return tgm_cuda_ctx_fail(cx, 1000 + (int)r, "%s: %s%s%s", what, ncclGetErrorString(r), last && *last ? ": " : "",
                           last ? last : "");
}

int tgm_nccl_new_id(void *id, char *err, size_t errlen) {
  ncclUniqueId u;
  ncclResult_t r = ncclGetUniqueId(&u);
  if (r != ncclSuccess)
    return say(err, errlen, "ncclGetUniqueId: %s%s", ncclGetErrorString(r), "");
  memcpy(id, &u, sizeof u);
  return 0;
}

void tgm_nccl_free(void *comm) {
  nccl *c = comm;
  if (!c)
    return;
  if (c->comm)
    ncclCommDestroy(c->comm);
  if (c->side)
    cudaStreamDestroy(c->side);
  if (c->fork)
    cudaEventDestroy(c->fork);
  if (c->join)
    cudaEventDestroy(c->join);
  free(c);
}

int tgm_nccl_init(tgm_cuda_ctx *cx, void **comm, int rank, int nranks, const void *id) {
  ncclUniqueId u;
  nccl *c = calloc(1, sizeof *c);
  memcpy(&u, id, sizeof u);
  *comm = NULL;
  if (!c)
    return tgm_cuda_ctx_fail(cx, (int)cudaErrorMemoryAllocation, "out of host memory");
  cudaError_t e = cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking);
  if (e == cudaSuccess)
    e = cudaEventCreateWithFlags(&c->fork, cudaEventDisableTiming);
  if (e == cudaSuccess)
    e = cudaEventCreateWithFlags(&c->join, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    tgm_nccl_free(c);
    return tgm_cuda_ctx_fail(cx, (int)e, "the side stream for NCCL: %s", cudaGetErrorString(e));
  }
  if (nccl_check(cx, NULL, ncclCommInitRank(&c->comm, nranks, u, rank), "ncclCommInitRank")) {
    tgm_nccl_free(c);
    return -1;
  }
  *comm = c;
  return 0;
}

/* The stream a collective runs on: the model's, or (side) the side stream
 * once it has waited for the work enqueued so far on the model's. */
static cudaStream_t pick_stream(tgm_cuda_ctx *cx, nccl *c, int side, const char *what) {
  cudaStream_t st = tgm_cuda_ctx_stream(cx, what);
  if (!side)
    return st;
  if (cudaEventRecord(c->fork, st) != cudaSuccess || cudaStreamWaitEvent(c->side, c->fork, 0) != cudaSuccess)
    return NULL;
  return c->side;
}

int tgm_nccl_join(tgm_cuda_ctx *cx, void *comm) {
  nccl *c = comm;
  cudaStream_t st = tgm_cuda_ctx_stream(cx, "joining the side stream");
  cudaError_t e = cudaEventRecord(c->join, c->side);
  if (e == cudaSuccess)
    e = cudaStreamWaitEvent(st, c->join, 0);
  return e == cudaSuccess ? 0 : tgm_cuda_ctx_fail(cx, (int)e, "joining the side stream: %s", cudaGetErrorString(e));
}

/* op: 0 all-reduce, 1 reduce to the part's root, 2 broadcast from it */
static int grouped(tgm_cuda_ctx *cx, void *comm, const tgm_nccl_part *parts, int nparts, int op, ncclRedOp_t red,
                   int side, const char *what) {
  cudaStream_t st = pick_stream(cx, comm, side, what);
  ncclComm_t c = ((nccl *)comm)->comm;
  if (!st)
    return tgm_cuda_ctx_fail(cx, (int)cudaErrorUnknown, "%s: forking the side stream failed", what);
  ncclResult_t r = ncclGroupStart();
  for (int i = 0; i < nparts && r == ncclSuccess; i++) {
    const tgm_nccl_part *p = &parts[i];
    size_t n = (size_t)p->n;
    ncclDataType_t t = nccl_type(p->dt);
    r = op == 0   ? ncclAllReduce(p->p, p->p, n, t, red, c, st)
        : op == 1 ? ncclReduce(p->p, p->p, n, t, red, p->root, c, st)
                  : ncclBroadcast(p->p, p->p, n, t, p->root, c, st);
  }
  ncclResult_t r2 = ncclGroupEnd();
  return nccl_check(cx, c, r != ncclSuccess ? r : r2, what);
}

int tgm_nccl_all_reduce(tgm_cuda_ctx *cx, void *comm, const tgm_nccl_part *parts, int nparts, int avg, int side) {
  return grouped(cx, comm, parts, nparts, 0, avg ? ncclAvg : ncclSum, side, "ncclAllReduce");
}

int tgm_nccl_reduce_avg(tgm_cuda_ctx *cx, void *comm, const tgm_nccl_part *parts, int nparts, int side) {
  return grouped(cx, comm, parts, nparts, 1, ncclAvg, side, "ncclReduce");
}

int tgm_nccl_broadcast(tgm_cuda_ctx *cx, void *comm, const tgm_nccl_part *parts, int nparts) {
  return grouped(cx, comm, parts, nparts, 2, ncclSum, 0, "ncclBroadcast");
}

int tgm_nccl_gather(tgm_cuda_ctx *cx, void *comm, int rank, const float *mine, const tgm_nccl_part *parts,
                    int nparts) {
  cudaStream_t st = tgm_cuda_ctx_stream(cx, "ncclSend/ncclRecv");
  ncclComm_t c = ((nccl *)comm)->comm;
  if (rank == 0 && parts[0].n) {
    cudaError_t e = cudaMemcpyAsync(parts[0].p, mine, sizeof(float) * (size_t)parts[0].n, cudaMemcpyDeviceToDevice, st);
    if (e != cudaSuccess)
      return tgm_cuda_ctx_fail(cx, (int)e, "copying rank 0's slice: %s", cudaGetErrorString(e));
  }
  ncclResult_t r = ncclGroupStart();
  for (int q = 1; q < nparts && r == ncclSuccess; q++) {
    if (!parts[q].n)
      continue;
    if (rank == 0)
      r = ncclRecv(parts[q].p, (size_t)parts[q].n, ncclFloat32, q, c, st);
    else if (rank == q)
      r = ncclSend(mine, (size_t)parts[q].n, ncclFloat32, 0, c, st);
  }
  ncclResult_t r2 = ncclGroupEnd();
  return nccl_check(cx, c, r != ncclSuccess ? r : r2, "ncclSend/ncclRecv");
}

#else /* built without NCCL: every collective fails (tgm_dist_init refuses first) */

int tgm_nccl_available(void) { return 0; }

int tgm_nccl_new_id(void *id, char *err, size_t errlen) {
  (void)id;
  return say(err, errlen, "this build has no NCCL path (configured with -DTGM_NCCL=OFF, or without CUDA)%s%s", "",
             "");
}

int tgm_nccl_init(tgm_cuda_ctx *cx, void **comm, int rank, int nranks, const void *id) {
  (void)cx, (void)rank, (void)nranks, (void)id;
  *comm = NULL;
  return -1;
}

void tgm_nccl_free(void *comm) { (void)comm; }

int tgm_nccl_all_reduce(tgm_cuda_ctx *cx, void *comm, const tgm_nccl_part *parts, int nparts, int avg, int side) {
  (void)cx, (void)comm, (void)parts, (void)nparts, (void)avg, (void)side;
  return -1;
}

int tgm_nccl_reduce_avg(tgm_cuda_ctx *cx, void *comm, const tgm_nccl_part *parts, int nparts, int side) {
  (void)cx, (void)comm, (void)parts, (void)nparts, (void)side;
  return -1;
}

int tgm_nccl_join(tgm_cuda_ctx *cx, void *comm) {
  (void)cx, (void)comm;
  return -1;
}

int tgm_nccl_broadcast(tgm_cuda_ctx *cx, void *comm, const tgm_nccl_part *parts, int nparts) {
  (void)cx, (void)comm, (void)parts, (void)nparts;
  return -1;
}

int tgm_nccl_gather(tgm_cuda_ctx *cx, void *comm, int rank, const float *mine, const tgm_nccl_part *parts,
                    int nparts) {
  (void)cx, (void)comm, (void)rank, (void)mine, (void)parts, (void)nparts;
  return -1;
}
#endif
