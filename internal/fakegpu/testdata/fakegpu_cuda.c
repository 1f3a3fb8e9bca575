/*
 * fakegpu_cuda.c (with fakegpu_nccl.c): a fake libcuda.so.1 + libnccl.so.2 for ranktree's CI.
 *
 * Written for ranktree from the public CUDA driver API and nccl.h
 * signatures. "Device" memory is host memory (cuMemAlloc = malloc), streams
 * are in-order op queues executed on the host, events complete when the
 * stream reaches them, and NCCL communicators have world-size-1 semantics.
 *
 * Faults (set with fakegpu_set(name, value) or the env var of the same name
 * upper-cased with a RANKTREE_FAKE_ prefix, read at first use):
 *   hang_after       N>=0: NCCL collectives after the first N never finish
 *                    (their stream blocks, as under cuStreamWaitValue32),
 *                    until ncclCommAbort on their communicator.
 *   async_error_after N>=0: after N collectives, ncclCommGetAsyncError
 *                    reports ncclSystemError.
 *   init_polls       number of ncclCommGetAsyncError polls a nonblocking
 *                    init stays in ncclInProgress (default 2).
 *   abort_blocks     1: ncclCommAbort blocks until it is set back to 0, as
 *                    the real one does when a kernel it must wait for is
 *                    queued behind a stream that never moves.
 *   split_late       1: ncclCommSplit returns ncclSuccess with the handle
 *                    unset and writes it 20 ms later from another thread,
 *                    as NCCL 2.28 does for a nonblocking split.
 * A communicator with nranks > 1 never finishes init (missing peers).
 */
#include "fakegpu.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>

pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

/* ---------------- faults ---------------- */
long f_hang_after = -1, f_async_after = -1, f_init_polls = 2;
volatile long f_abort_blocks;
long f_split_late;
static int f_loaded;
long ncoll;

static long envl(const char *name, long def) {
  const char *v = getenv(name);
  return v && *v ? atol(v) : def;
}
void load_faults(void) {
  if (f_loaded) return;
  f_loaded = 1;
  f_hang_after = envl("RANKTREE_FAKE_HANG_AFTER", -1);
  f_async_after = envl("RANKTREE_FAKE_ASYNC_ERROR_AFTER", -1);
  f_init_polls = envl("RANKTREE_FAKE_INIT_POLLS", 2);
}

/* fakegpu_set sets a fault knob; returns 0, or -1 for an unknown name. */
int fakegpu_set(const char *name, long v) {
  pthread_mutex_lock(&mu);
  load_faults();
  int rc = 0;
  if (!strcmp(name, "hang_after")) f_hang_after = v;
  else if (!strcmp(name, "async_error_after")) f_async_after = v;
  else if (!strcmp(name, "init_polls")) f_init_polls = v;
  else if (!strcmp(name, "abort_blocks")) f_abort_blocks = v;
  else if (!strcmp(name, "split_late")) f_split_late = v;
  else if (!strcmp(name, "reset_count")) ncoll = 0;
  else rc = -1;
  pthread_mutex_unlock(&mu);
  return rc;
}

/* live object counters for leak checks */
static long live_allocs, live_streams, live_events;
long live_comms;
long fakegpu_live(const char *what) {
  pthread_mutex_lock(&mu);
  long v = -1;
  if (!strcmp(what, "allocs")) v = live_allocs;
  else if (!strcmp(what, "streams")) v = live_streams;
  else if (!strcmp(what, "events")) v = live_events;
  else if (!strcmp(what, "comms")) v = live_comms;
  pthread_mutex_unlock(&mu);
  return v;
}

/* ---------------- streams and events ---------------- */
static stream legacy = {0, 0, 1, 0};
static stream *allstreams = &legacy;

stream *S(uintptr_t h) { return h ? (stream *)h : &legacy; }

void push(stream *s, op *o) {
  o->next = 0;
  if (s->tail) s->tail->next = o; else s->head = o;
  s->tail = o;
}

static int can_run(op *o) {
  switch (o->kind) {
  case OP_WAITVAL: {
    uint32_t cur = *(volatile uint32_t *)o->dst;
    switch (o->flags & 3) {
    case 0: return (int32_t)(cur - o->val) >= 0; /* GEQ (cyclic) */
    case 1: return cur == o->val;               /* EQ */
    case 2: return (cur & o->val) != 0;         /* AND */
    default: return (cur | o->val) != cur || 1; /* NOR: treat as ready */
    }
  }
  case OP_WAITEV: return o->ev->done >= o->gen;
  case OP_HANG: return o->comm->aborted;
  default: return 1;
  }
}

static void run(op *o) {
  switch (o->kind) {
  case OP_COPY: if (o->n && o->dst != o->src) memmove(o->dst, o->src, o->n); break;
  case OP_SET8: memset(o->dst, (int)o->val, o->n); break;
  case OP_SET32: for (size_t i = 0; i < o->n; i++) ((uint32_t *)o->dst)[i] = o->val; break;
  case OP_RECORD: if (o->ev->done < o->gen) o->ev->done = o->gen; break;
  case OP_SCALE: exec_scale(o); break;
  default: break;
  }
}

/* progress runs every stream's ready ops; call with mu held. */
void progress(void) {
  int moved = 1;
  while (moved) {
    moved = 0;
    for (stream *s = allstreams; s; s = s->nextall) {
      while (s->head && can_run(s->head)) {
        op *o = s->head;
        s->head = o->next;
        if (!s->head) s->tail = 0;
        run(o);
        free(o);
        moved = 1;
      }
    }
  }
}

op *newop(int kind) { op *o = calloc(1, sizeof(op)); o->kind = kind; return o; }

/* ---------------- CUDA driver API ---------------- */
typedef int CUresult;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_READY 600

static int inited;
static int ctx_primary[2] = {0, 0};
__thread uintptr_t cur_ctx;

CUresult cuInit(unsigned flags) { (void)flags; inited = 1; return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int *v) { if (!v) return CUDA_ERROR_INVALID_VALUE; *v = 12080; return CUDA_SUCCESS; }
CUresult cuDeviceGetCount(int *n) { if (!inited) return CUDA_ERROR_NOT_INITIALIZED; *n = 1; return CUDA_SUCCESS; }
CUresult cuDeviceGet(int *d, int ord) {
  if (!inited) return CUDA_ERROR_NOT_INITIALIZED;
  if (ord != 0) return CUDA_ERROR_INVALID_DEVICE;
  *d = ord; return CUDA_SUCCESS;
}
CUresult cuDeviceGetName(char *name, int len, int dev) {
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, len, "ranktree fake GPU"); return CUDA_SUCCESS;
}
CUresult cuDeviceGetPCIBusId(char *bus, int len, int dev) {
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(bus, len, "00000000:FA:CE:0"); return CUDA_SUCCESS;
}
CUresult cuDeviceGetUuid_v2(unsigned char *u, int dev) {
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  for (int i = 0; i < 16; i++) u[i] = (unsigned char)(0xf0 + i);
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetUuid(unsigned char *u, int dev) { return cuDeviceGetUuid_v2(u, dev); }
CUresult cuDevicePrimaryCtxRetain(uintptr_t *ctx, int dev) {
  if (!inited) return CUDA_ERROR_NOT_INITIALIZED;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&mu); ctx_primary[dev]++; pthread_mutex_unlock(&mu);
  *ctx = (uintptr_t)&ctx_primary[dev]; return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease_v2(int dev) {
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&mu); ctx_primary[dev]--; pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuCtxSetCurrent(uintptr_t ctx) { cur_ctx = ctx; return CUDA_SUCCESS; }
CUresult cuCtxGetCurrent(uintptr_t *ctx) { *ctx = cur_ctx; return CUDA_SUCCESS; }
CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return CUDA_SUCCESS;
}

static CUresult needctx(void) { return cur_ctx ? CUDA_SUCCESS : 201; /* CUDA_ERROR_INVALID_CONTEXT */ }

CUresult cuStreamCreateWithPriority(uintptr_t *out, unsigned flags, int prio) {
  (void)flags; (void)prio;
  if (needctx()) return needctx();
  stream *s = calloc(1, sizeof(stream));
  s->live = 1;
  pthread_mutex_lock(&mu);
  s->nextall = allstreams; allstreams = s; live_streams++;
  pthread_mutex_unlock(&mu);
  *out = (uintptr_t)s; return CUDA_SUCCESS;
}
CUresult cuStreamCreate(uintptr_t *out, unsigned flags) { return cuStreamCreateWithPriority(out, flags, 0); }
CUresult cuStreamDestroy_v2(uintptr_t h) {
  if (!h) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&mu);
  stream *s = S(h);
  if (!s->live) { pthread_mutex_unlock(&mu); return CUDA_ERROR_INVALID_HANDLE; }
  s->live = 0; live_streams--; /* kept in the list: pending work still drains, as in CUDA */
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuStreamQuery(uintptr_t h) {
  pthread_mutex_lock(&mu); progress();
  int busy = S(h)->head != 0;
  pthread_mutex_unlock(&mu);
  return busy ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
CUresult cuStreamSynchronize(uintptr_t h) {
  for (;;) {
    if (cuStreamQuery(h) == CUDA_SUCCESS) return CUDA_SUCCESS;
    usleep(200);
  }
}
CUresult cuEventCreate(uintptr_t *out, unsigned flags) {
  (void)flags;
  event *e = calloc(1, sizeof(event)); e->live = 1;
  pthread_mutex_lock(&mu); live_events++; pthread_mutex_unlock(&mu);
  *out = (uintptr_t)e; return CUDA_SUCCESS;
}
CUresult cuEventDestroy_v2(uintptr_t h) {
  if (!h) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&mu);
  event *e = (event *)h;
  if (!e->live) { pthread_mutex_unlock(&mu); return CUDA_ERROR_INVALID_HANDLE; }
  e->live = 0; live_events--; /* memory kept: queued ops may still point at it */
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuEventRecord(uintptr_t h, uintptr_t st) {
  if (!h) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&mu);
  event *e = (event *)h;
  op *o = newop(OP_RECORD); o->ev = e; o->gen = ++e->recorded;
  push(S(st), o); progress();
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuEventQuery(uintptr_t h) {
  if (!h) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&mu); progress();
  event *e = (event *)h;
  int ready = e->done >= e->recorded;
  pthread_mutex_unlock(&mu);
  return ready ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
CUresult cuEventSynchronize(uintptr_t h) {
  for (;;) {
    CUresult r = cuEventQuery(h);
    if (r != CUDA_ERROR_NOT_READY) return r;
    usleep(200);
  }
}
CUresult cuStreamWaitEvent(uintptr_t st, uintptr_t ev, unsigned flags) {
  (void)flags;
  if (!ev) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&mu);
  event *e = (event *)ev;
  op *o = newop(OP_WAITEV); o->ev = e; o->gen = e->recorded;
  push(S(st), o); progress();
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuStreamWaitValue32_v2(uintptr_t st, uintptr_t addr, uint32_t val, unsigned flags) {
  pthread_mutex_lock(&mu);
  op *o = newop(OP_WAITVAL); o->dst = (void *)addr; o->val = val; o->flags = flags;
  push(S(st), o); progress();
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuStreamWaitValue32(uintptr_t st, uintptr_t addr, uint32_t val, unsigned flags) {
  return cuStreamWaitValue32_v2(st, addr, val, flags);
}
CUresult cuMemAlloc_v2(uintptr_t *p, size_t n) {
  if (needctx()) return needctx();
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  void *m = malloc(n ? n : 1);
  if (!m) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
  memset(m, 0xAB, n); /* device memory starts as garbage */
  pthread_mutex_lock(&mu); live_allocs++; pthread_mutex_unlock(&mu);
  *p = (uintptr_t)m; return CUDA_SUCCESS;
}
CUresult cuMemFree_v2(uintptr_t p) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&mu); live_allocs--; pthread_mutex_unlock(&mu);
  free((void *)p); return CUDA_SUCCESS;
}
static CUresult enqueue_copy(uintptr_t st, void *dst, const void *src, size_t n) {
  pthread_mutex_lock(&mu);
  op *o = newop(OP_COPY); o->dst = dst; o->src = src; o->n = n;
  push(S(st), o); progress();
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoDAsync_v2(uintptr_t dst, const void *src, size_t n, uintptr_t st) { return enqueue_copy(st, (void *)dst, src, n); }
CUresult cuMemcpyDtoHAsync_v2(void *dst, uintptr_t src, size_t n, uintptr_t st) { return enqueue_copy(st, dst, (const void *)src, n); }
CUresult cuMemcpyDtoDAsync_v2(uintptr_t dst, uintptr_t src, size_t n, uintptr_t st) { return enqueue_copy(st, (void *)dst, (const void *)src, n); }
CUresult cuMemcpyHtoD_v2(uintptr_t dst, const void *src, size_t n) { enqueue_copy(0, (void *)dst, src, n); return cuStreamSynchronize(0); }
CUresult cuMemcpyDtoH_v2(void *dst, uintptr_t src, size_t n) { enqueue_copy(0, dst, (const void *)src, n); return cuStreamSynchronize(0); }
CUresult cuMemsetD8Async(uintptr_t dst, unsigned char v, size_t n, uintptr_t st) {
  pthread_mutex_lock(&mu);
  op *o = newop(OP_SET8); o->dst = (void *)dst; o->val = v; o->n = n;
  push(S(st), o); progress();
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuMemsetD32Async(uintptr_t dst, unsigned v, size_t n, uintptr_t st) {
  pthread_mutex_lock(&mu);
  op *o = newop(OP_SET32); o->dst = (void *)dst; o->val = v; o->n = n;
  push(S(st), o); progress();
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
CUresult cuGetErrorString(CUresult r, const char **s) {
  switch (r) {
  case 0: *s = "no error"; break;
  case 1: *s = "invalid argument"; break;
  case 3: *s = "initialization error"; break;
  case 101: *s = "invalid device ordinal"; break;
  case 201: *s = "invalid device context"; break;
  case 400: *s = "invalid resource handle"; break;
  case 600: *s = "device not ready"; break;
  default: *s = "unknown error"; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
CUresult cuGetErrorName(CUresult r, const char **s) {
  switch (r) {
  case 0: *s = "CUDA_SUCCESS"; break;
  case 1: *s = "CUDA_ERROR_INVALID_VALUE"; break;
  case 3: *s = "CUDA_ERROR_NOT_INITIALIZED"; break;
  case 101: *s = "CUDA_ERROR_INVALID_DEVICE"; break;
  case 201: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
  case 400: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
  case 600: *s = "CUDA_ERROR_NOT_READY"; break;
  default: *s = "CUDA_ERROR_UNKNOWN"; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

