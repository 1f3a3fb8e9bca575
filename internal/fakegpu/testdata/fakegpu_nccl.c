/* fakegpu_nccl.c: the fake NCCL of ranktree's CI (see fakegpu_cuda.c). */
#include "fakegpu.h"
#include <unistd.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <math.h>

/* ---------------- NCCL ---------------- */
typedef int ncclResult_t;
enum { ncclSuccess, ncclUnhandledCudaError, ncclSystemError, ncclInternalError, ncclInvalidArgument,
       ncclInvalidUsage, ncclRemoteError, ncclInProgress };
#define FAKE_NCCL_VERSION 22807
#define UID_MAGIC 0x52544b46u /* "RTKF" */

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct { size_t size; unsigned magic, version; int blocking; } cfg_head;
typedef struct comm comm;

static __thread char g_lasterr[256];
/* NCCL group calls are per thread */
struct gq { int kind; const void *s; void *r; size_t n; int dt, redop, root, peer; comm *c; stream *st; };
#define MAXGQ 4096
static __thread int group_depth;
static __thread struct gq *gq;
static __thread int ngq;
static unsigned uid_counter;

static size_t dtsize(int dt) {
  switch (dt) {
  case 0: case 1: case 10: case 11: return 1;
  case 6: case 9: return 2;
  case 2: case 3: case 7: return 4;
  case 4: case 5: case 8: return 8;
  }
  return 0;
}

ncclResult_t ncclGetVersion(int *v) { if (!v) return ncclInvalidArgument; *v = FAKE_NCCL_VERSION; return ncclSuccess; }
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (!id) return ncclInvalidArgument;
  memset(id, 0, sizeof *id);
  pthread_mutex_lock(&mu); unsigned n = ++uid_counter; pthread_mutex_unlock(&mu);
  uint32_t m = UID_MAGIC;
  memcpy(id->internal, &m, 4);
  memcpy(id->internal + 4, &n, 4);
  for (int i = 8; i < 128; i++) id->internal[i] = (char)(i ^ n);
  return ncclSuccess;
}
static int uid_ok(const ncclUniqueId *id) {
  uint32_t m, n;
  memcpy(&m, id->internal, 4); memcpy(&n, id->internal + 4, 4);
  if (m != UID_MAGIC) return 0;
  for (int i = 8; i < 128; i++) if (id->internal[i] != (char)(i ^ n)) return 0;
  return 1;
}
const char *ncclGetErrorString(ncclResult_t r) {
  static const char *s[] = {"no error", "unhandled cuda error", "unhandled system error", "internal error",
                            "invalid argument", "invalid usage", "remote process exited or there was a network error",
                            "NCCL operation in progress", "timeout"};
  return r >= 0 && r <= 8 ? s[r] : "unknown result code";
}
const char *ncclGetLastError(comm *c) {
  if (c && c->lasterr[0]) return c->lasterr;
  return g_lasterr;
}
static ncclResult_t fail(comm *c, ncclResult_t r, const char *msg) {
  snprintf(g_lasterr, sizeof g_lasterr, "fake nccl: %s", msg);
  if (c) snprintf(c->lasterr, sizeof c->lasterr, "fake nccl: %s", msg);
  return r;
}

static comm *mkcomm(int nranks, int rank, const cfg_head *cfg, ncclResult_t *ret) {
  comm *c = calloc(1, sizeof(comm));
  c->nranks = nranks; c->rank = rank; c->live = 1;
  int nonblocking = cfg && cfg->blocking == 0;
  if (nranks > 1) c->init_left = -1; /* peers never arrive */
  else c->init_left = nonblocking ? (int)f_init_polls : 0;
  c->async_err = c->init_left ? ncclInProgress : ncclSuccess;
  live_comms++;
  *ret = c->init_left ? ncclInProgress : ncclSuccess;
  return c;
}

ncclResult_t ncclCommInitRankConfig(comm **out, int nranks, ncclUniqueId id, int rank, cfg_head *cfg) {
  if (!out) return fail(0, ncclInvalidArgument, "comm out pointer is NULL");
  if (nranks < 1 || rank < 0 || rank >= nranks) return fail(0, ncclInvalidArgument, "invalid rank or nranks");
  if (!uid_ok(&id)) return fail(0, ncclInvalidArgument, "unique id was corrupted (not from ncclGetUniqueId)");
  if (cfg) {
    if (cfg->magic != 0xcafebeefu) return fail(0, ncclInvalidArgument, "config not initialized (bad magic)");
    if (cfg->size < sizeof(cfg_head) || cfg->size > 4096) return fail(0, ncclInvalidArgument, "config size out of range");
    if (cfg->version < 21400) return fail(0, ncclInvalidArgument, "config version too old");
    if (cfg->blocking != 0 && cfg->blocking != 1 && cfg->blocking != (int)0x80000000) return fail(0, ncclInvalidArgument, "bad blocking");
  }
  if (!cur_ctx) return fail(0, ncclUnhandledCudaError, "no current CUDA context on this thread");
  pthread_mutex_lock(&mu); load_faults();
  ncclResult_t r;
  *out = mkcomm(nranks, rank, cfg, &r);
  pthread_mutex_unlock(&mu);
  return r;
}
ncclResult_t ncclCommInitRank(comm **out, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(out, nranks, id, rank, 0);
}
ncclResult_t ncclCommGetAsyncError(comm *c, ncclResult_t *r) {
  if (!c || !r) return ncclInvalidArgument;
  pthread_mutex_lock(&mu);
  if (c->init_left > 0 && --c->init_left == 0) c->async_err = ncclSuccess;
  *r = c->async_err;
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}
ncclResult_t ncclCommCount(comm *c, int *n) { if (!c || !n) return ncclInvalidArgument; *n = c->nranks; return ncclSuccess; }
ncclResult_t ncclCommUserRank(comm *c, int *r) { if (!c || !r) return ncclInvalidArgument; *r = c->rank; return ncclSuccess; }
ncclResult_t ncclCommCuDevice(comm *c, int *d) { if (!c || !d) return ncclInvalidArgument; *d = 0; return ncclSuccess; }
static ncclResult_t release(comm *c, int abort) {
  if (!c) return ncclInvalidArgument;
  pthread_mutex_lock(&mu);
  if (!c->live) { pthread_mutex_unlock(&mu); return fail(0, ncclInvalidUsage, "communicator already destroyed"); }
  c->live = 0; live_comms--;
  if (abort) { c->aborted = 1; progress(); }
  /* c is never freed: queued hang ops point at it */
  pthread_mutex_unlock(&mu);
  return ncclSuccess;
}
ncclResult_t ncclCommFinalize(comm *c) {
  if (!c) return ncclInvalidArgument;
  pthread_mutex_lock(&mu); progress(); pthread_mutex_unlock(&mu);
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(comm *c) { return release(c, 0); }
ncclResult_t ncclCommAbort(comm *c) {
  while (f_abort_blocks) usleep(1000); /* unlocked: fakegpu_set must get in */
  return release(c, 1);
}
struct late_split { comm **out; comm *c; };
static void *write_split_late(void *p) {
  struct late_split *ls = p;
  usleep(20000);
  __atomic_store_n(ls->out, ls->c, __ATOMIC_RELEASE);
  free(ls);
  return 0;
}
ncclResult_t ncclCommSplit(comm *c, int color, int key, comm **out, cfg_head *cfg) {
  (void)key;
  if (!c || !out) return ncclInvalidArgument;
  if (color == -1) { *out = 0; return ncclSuccess; }
  pthread_mutex_lock(&mu);
  ncclResult_t r;
  comm *child = mkcomm(1, 0, cfg, &r);
  long late = f_split_late;
  pthread_mutex_unlock(&mu);
  if (!late) { *out = child; return r; }
  /* as NCCL 2.28 does for a nonblocking split: the handle is written by
     another thread once the child's init ends, after this call returned */
  *out = 0;
  struct late_split *ls = malloc(sizeof *ls);
  ls->out = out; ls->c = child;
  pthread_t th;
  pthread_create(&th, 0, write_split_late, ls);
  pthread_detach(th);
  return ncclSuccess;
}

/* ---- reductions (world size 1: only PreMulSum changes the data) ---- */
static float h2f(uint16_t h) {
  uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
  if (e == 0) {
    if (!m) u = s;
    else { float f = ldexpf((float)m, -24); return s ? -f : f; }
  } else if (e == 31) u = s | 0x7f800000u | (m << 13);
  else u = s | ((e + 112) << 23) | (m << 13);
  float f; memcpy(&f, &u, 4); return f;
}
static uint16_t f2h(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  uint16_t s = (u >> 16) & 0x8000;
  float a = fabsf(f);
  if (f != f) return s | 0x7e00;
  if (a >= 65520.0f) return s | 0x7c00;
  if (a < 6.103515625e-05f) { /* subnormal */
    return s | (uint16_t)lrintf(a * 16777216.0f);
  }
  int e; float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5,1) */
  uint32_t mant = (uint32_t)lrintf((m * 2 - 1) * 1024);
  int ee = e - 1 + 15;
  if (mant == 1024) { mant = 0; ee++; }
  if (ee >= 31) return s | 0x7c00;
  return s | (uint16_t)(ee << 10) | (uint16_t)mant;
}
static float b2f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t f2b(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)(u >> 16) | 0x40;
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}
void exec_scale(op *o) {
  for (size_t i = 0; i < o->n; i++) {
    switch (o->dt) {
    case 6: ((uint16_t *)o->dst)[i] = f2h((float)(h2f(((const uint16_t *)o->src)[i]) * o->scale)); break;
    case 9: ((uint16_t *)o->dst)[i] = f2b((float)(b2f(((const uint16_t *)o->src)[i]) * o->scale)); break;
    case 7: ((float *)o->dst)[i] = ((const float *)o->src)[i] * (float)o->scale; break;
    case 8: ((double *)o->dst)[i] = ((const double *)o->src)[i] * o->scale; break;
    }
  }
}
static double scalar_of(const void *p, int dt) {
  switch (dt) {
  case 6: return h2f(*(const uint16_t *)p);
  case 9: return b2f(*(const uint16_t *)p);
  case 7: return *(const float *)p;
  case 8: return *(const double *)p;
  }
  return NAN;
}
ncclResult_t ncclRedOpCreatePreMulSum(int *op, void *scalar, int dt, int residence, comm *c) {
  if (!op || !scalar || !c) return fail(c, ncclInvalidArgument, "NULL argument to ncclRedOpCreatePreMulSum");
  if (residence != 1) return fail(c, ncclInvalidArgument, "fake supports ncclScalarHostImmediate only");
  if (dt != 6 && dt != 7 && dt != 8 && dt != 9) return fail(c, ncclInvalidArgument, "PreMulSum needs a floating datatype");
  pthread_mutex_lock(&mu);
  if (c->npremul >= 64) { pthread_mutex_unlock(&mu); return fail(c, ncclInternalError, "too many custom ops"); }
  int i = c->npremul++;
  c->premul[i] = scalar_of(scalar, dt); c->premul_dt[i] = dt;
  pthread_mutex_unlock(&mu);
  *op = 5 + i;
  return ncclSuccess;
}
ncclResult_t ncclRedOpDestroy(int op, comm *c) {
  if (!c || op < 5 || op >= 5 + c->npremul) return fail(c, ncclInvalidArgument, "ncclRedOpDestroy: not a custom op");
  return ncclSuccess;
}

enum { K_AR, K_BC, K_RED, K_AG, K_RS, K_SEND, K_RECV };

static ncclResult_t check_comm(comm *c) {
  if (!c) return fail(0, ncclInvalidArgument, "NULL communicator");
  if (!c->live) return fail(c, ncclInvalidUsage, "communicator was destroyed or aborted");
  if (c->init_left != 0) return fail(c, ncclInvalidUsage, "communicator init is still in progress");
  if (c->async_err != ncclSuccess) return c->async_err; /* keep the async error's own message */
  return ncclSuccess;
}

/* exec enqueues one collective on its stream; mu held. */
static ncclResult_t exec(struct gq *g) {
  comm *c = g->c;
  size_t bytes = g->n * dtsize(g->dt);
  ncoll++;
  if (f_hang_after >= 0 && ncoll > f_hang_after) {
    op *h = newop(OP_HANG); h->comm = c; push(g->st, h);
  }
  if (f_async_after >= 0 && ncoll > f_async_after && c->async_err == ncclSuccess) {
    c->async_err = ncclSystemError;
    snprintf(c->lasterr, sizeof c->lasterr, "fake nccl: injected async error after %ld collectives", f_async_after);
  }
  op *o = 0;
  switch (g->kind) {
  case K_AR: case K_RED:
    if (g->kind == K_RED && g->root != c->rank) break;
    if (g->redop >= 5) {
      int i = g->redop - 5;
      o = newop(OP_SCALE); o->dst = g->r; o->src = g->s; o->n = g->n; o->dt = g->dt; o->scale = c->premul[i];
    } else { o = newop(OP_COPY); o->dst = g->r; o->src = g->s; o->n = bytes; }
    break;
  case K_BC: case K_AG: case K_RS:
    o = newop(OP_COPY); o->dst = g->r; o->src = g->s; o->n = bytes; break;
  case K_SEND: case K_RECV: {
    /* match with an opposite pending entry, FIFO */
    int want = g->kind == K_SEND ? 0 : 1;
    for (int i = 0; i < c->nq; i++) {
      if (c->q[i].send == want) {
        struct pend p = c->q[i];
        memmove(&c->q[i], &c->q[i + 1], (size_t)(c->nq - i - 1) * sizeof(struct pend));
        c->nq--;
        o = newop(OP_COPY);
        o->n = bytes < p.bytes ? bytes : p.bytes;
        if (g->kind == K_SEND) { o->dst = p.buf; o->src = g->s; push(p.s, o); }
        else { o->dst = g->r; o->src = p.buf; push(g->st, o); }
        progress();
        return ncclSuccess;
      }
    }
    if (c->nq >= 4096) return fail(c, ncclInternalError, "too many unmatched send/recv");
    struct pend p = { g->kind == K_SEND, g->kind == K_SEND ? (void *)g->s : g->r, bytes, g->st };
    c->q[c->nq++] = p;
    return ncclSuccess;
  }
  }
  if (o) push(g->st, o);
  progress();
  return ncclSuccess;
}

static ncclResult_t coll(int kind, const void *s, void *r, size_t n, int dt, int redop, int root, int peer, comm *c, uintptr_t st) {
  pthread_mutex_lock(&mu);
  load_faults();
  ncclResult_t rc = check_comm(c);
  if (rc == ncclSuccess && dtsize(dt) == 0) rc = fail(c, ncclInvalidArgument, "invalid datatype");
  if (rc == ncclSuccess && (redop < 0 || redop >= 5 + c->npremul) && (kind == K_AR || kind == K_RED || kind == K_RS))
    rc = fail(c, ncclInvalidArgument, "invalid reduction op");
  if (rc == ncclSuccess && (kind == K_BC || kind == K_RED) && (root < 0 || root >= c->nranks))
    rc = fail(c, ncclInvalidArgument, "invalid root");
  if (rc == ncclSuccess && (kind == K_SEND || kind == K_RECV) && (peer < 0 || peer >= c->nranks))
    rc = fail(c, ncclInvalidArgument, "invalid peer");
  if (rc == ncclSuccess && n > 0 && ((kind != K_RECV && !s) || (kind != K_SEND && !r && !(kind == K_RED && root != c->rank))))
    rc = fail(c, ncclInvalidArgument, "NULL buffer");
  if (rc == ncclSuccess) {
    struct gq g = {kind, s, r, n, dt, redop, root, peer, c, S(st)};
    if (group_depth > 0) {
      if (!gq) gq = calloc(MAXGQ, sizeof(struct gq));
      if (ngq >= MAXGQ) rc = fail(c, ncclInternalError, "group too large");
      else gq[ngq++] = g;
    } else rc = exec(&g);
  }
  pthread_mutex_unlock(&mu);
  return rc;
}

ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, comm *c, uintptr_t st) { return coll(K_AR, s, r, n, dt, op, 0, 0, c, st); }
ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, int dt, int root, comm *c, uintptr_t st) { return coll(K_BC, s, r, n, dt, 0, root, 0, c, st); }
ncclResult_t ncclReduce(const void *s, void *r, size_t n, int dt, int op, int root, comm *c, uintptr_t st) { return coll(K_RED, s, r, n, dt, op, root, 0, c, st); }
ncclResult_t ncclAllGather(const void *s, void *r, size_t n, int dt, comm *c, uintptr_t st) { return coll(K_AG, s, r, n, dt, 0, 0, 0, c, st); }
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, int dt, int op, comm *c, uintptr_t st) { return coll(K_RS, s, r, n, dt, op, 0, 0, c, st); }
ncclResult_t ncclSend(const void *s, size_t n, int dt, int peer, comm *c, uintptr_t st) { return coll(K_SEND, s, 0, n, dt, 0, 0, peer, c, st); }
ncclResult_t ncclRecv(void *r, size_t n, int dt, int peer, comm *c, uintptr_t st) { return coll(K_RECV, 0, r, n, dt, 0, 0, peer, c, st); }

ncclResult_t ncclGroupStart(void) { group_depth++; return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) {
  pthread_mutex_lock(&mu);
  if (group_depth == 0) { pthread_mutex_unlock(&mu); return fail(0, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart"); }
  ncclResult_t rc = ncclSuccess;
  if (--group_depth == 0) {
    /* receives first so that a grouped send/recv pair to self matches either way */
    for (int pass = 0; pass < 2; pass++)
      for (int i = 0; i < ngq; i++) {
        int isrecv = gq[i].kind == K_RECV;
        if ((pass == 0) != isrecv) continue;
        ncclResult_t r = exec(&gq[i]);
        if (r != ncclSuccess && rc == ncclSuccess) rc = r;
      }
    ngq = 0;
  }
  pthread_mutex_unlock(&mu);
  return rc;
}
