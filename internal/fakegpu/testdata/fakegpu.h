/*
 * fakegpu.h: state shared by the fake CUDA driver (fakegpu_cuda.c) and the
 * fake NCCL (fakegpu_nccl.c) of ranktree's CI. See fakegpu_cuda.c.
 */
#ifndef RANKTREE_FAKEGPU_H
#define RANKTREE_FAKEGPU_H
#include <stdint.h>
#include <stddef.h>
#include <pthread.h>

/* internal to the fake: not exported from the shared object */
#pragma GCC visibility push(hidden)

extern pthread_mutex_t mu;            /* guards every fake object */
extern long f_hang_after, f_async_after, f_init_polls;
extern volatile long f_abort_blocks;
extern long f_split_late;
extern long ncoll;                    /* collectives enqueued process-wide */
extern long live_comms;
void load_faults(void);               /* mu held */

enum { OP_COPY, OP_SET8, OP_SET32, OP_WAITVAL, OP_WAITEV, OP_RECORD, OP_HANG, OP_SCALE };

struct comm;
typedef struct event { long recorded, done; int live; } event;
typedef struct op {
  int kind;
  void *dst; const void *src; size_t n;
  uint32_t val; unsigned flags;
  event *ev; long gen;
  struct comm *comm; /* for OP_HANG */
  int dt; double scale; /* OP_SCALE: dst = src * scale, n elements */
  struct op *next;
} op;
typedef struct stream { op *head, *tail; int live; struct stream *nextall; } stream;

struct pend { int send; void *buf; size_t bytes; stream *s; };
struct comm { int nranks, rank, init_left, aborted, async_err, live;
  struct pend q[4096]; int nq;
  double premul[64]; int premul_dt[64]; int npremul; char lasterr[256]; };

extern __thread uintptr_t cur_ctx;    /* current context of this thread */
stream *S(uintptr_t h);               /* 0 is the legacy stream */
void push(stream *s, op *o);          /* mu held */
void progress(void);                  /* mu held: run every stream's ready ops */
op *newop(int kind);
void exec_scale(op *o);               /* fakegpu_nccl.c */
#pragma GCC visibility pop
#endif
