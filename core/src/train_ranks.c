/* Ranks as threads (train-impl.h: bp_rank_pool_*). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train-impl.h"

struct bp_rank_pool {
  bp_trainer *t;
  bp_comm *gate; /* start/end of a job: a barrier of its own, apart from the all-reduces */
  pthread_t threads[BP_TRAIN_MAX_RANKS];
  int started; /* threads running: ranks 1..started */
  pthread_mutex_t go_mutex; /* the threads start their loop once every one runs */
  pthread_cond_t go_cond;
  int go;
  int failed; /* a thread failed to start: set with go, never after */
  /* the job, written by rank 0 before the start barrier */
  int quit, count, buffer;
  bp_rank_step ranks[BP_TRAIN_MAX_RANKS]; /* each rank's variant and skipped segments */
  bp_segment segments[BP_SEGMENT_COUNT];
  bp_data_loader **loaders; /* NULL, or each rank's loader to take the next batch from */
  bp_data_batch *batches;   /* where rank k puts it: batches[k] */
  bp_status status[BP_TRAIN_MAX_RANKS];
  char why[BP_TRAIN_MAX_RANKS][1024];
};

static void run_job(bp_rank_pool *p, int rank) {
  bp_status first = BP_OK;
  const bp_rank_step *r = &p->ranks[rank];
  for (int s = 0; s < p->count; s++) {
    /* after a failure only the collectives run: the other ranks need this one */
    if (first != BP_OK && !(BP_TRAIN_COLLECTIVE & (1u << p->segments[s]))) continue;
    if (r->skip & (1u << p->segments[s])) continue; /* a rank with no samples */
    bp_status st = bp_exec_run(p->t->ranks[rank].exec, r->variant, p->segments[s], p->buffer);
    if (st != BP_OK && first == BP_OK) {
      first = st;
      snprintf(p->why[rank], sizeof p->why[rank], "%s", bp_last_error());
    }
  }
  /* the next batch, after the step has read this one (the collectives are
   * behind every rank: a failure here leaves nobody waiting) */
  if (first == BP_OK && p->loaders) {
    first = bp_data_loader_next(p->loaders[rank], &p->batches[rank]);
    if (first != BP_OK) snprintf(p->why[rank], sizeof p->why[rank], "%s", bp_last_error());
  }
  p->status[rank] = first;
}

typedef struct worker_arg {
  bp_rank_pool *pool;
  int rank;
} worker_arg;

typedef struct pool_alloc {
  bp_rank_pool pool;
  worker_arg args[BP_TRAIN_MAX_RANKS];
} pool_alloc;

static void *worker(void *arg) {
  const worker_arg *w = arg;
  bp_rank_pool *p = w->pool;
  pthread_mutex_lock(&p->go_mutex);
  while (!p->go) pthread_cond_wait(&p->go_cond, &p->go_mutex);
  /* not quit: stop writes that before the gate barrier, maybe before this
   * thread gets here, and this thread must still reach that barrier */
  const int failed = p->failed;
  pthread_mutex_unlock(&p->go_mutex);
  if (failed) return NULL; /* another rank's thread failed to start */
  for (;;) {
    bp_comm_barrier(p->gate); /* a job (or quit) is posted */
    if (p->quit) break;
    run_job(p, w->rank);
    bp_comm_barrier(p->gate); /* the job is done on every rank */
  }
  return NULL;
}

bp_status bp_rank_pool_start(bp_trainer *t) {
  pool_alloc *a = calloc(1, sizeof *a);
  if (!a) return bp_fail(BP_ERR_NOMEM, "out of memory starting %d rank threads", t->local);
  bp_rank_pool *p = &a->pool;
  p->t = t;
  pthread_mutex_init(&p->go_mutex, NULL);
  pthread_cond_init(&p->go_cond, NULL);
  t->pool = p;
  bp_status st = bp_comm_create(t->local, &p->gate);
  for (int k = 1; st == BP_OK && k < t->local; k++) {
    a->args[k] = (worker_arg){p, k};
    if (pthread_create(&p->threads[k], NULL, worker, &a->args[k]) != 0)
      st = bp_fail(BP_ERR_NOMEM, "could not start the thread of rank %d", k);
    else
      p->started = k;
  }
  pthread_mutex_lock(&p->go_mutex);
  p->failed = st != BP_OK;
  p->go = 1;
  pthread_cond_broadcast(&p->go_cond);
  pthread_mutex_unlock(&p->go_mutex);
  return st;
}

void bp_rank_pool_stop(bp_trainer *t) {
  bp_rank_pool *p = t->pool;
  if (!p) return;
  if (!p->failed) { /* every thread waits at the gate for a job */
    p->quit = 1;
    bp_comm_barrier(p->gate);
  }
  for (int k = 1; k <= p->started; k++) pthread_join(p->threads[k], NULL);
  bp_comm_destroy(p->gate);
  pthread_cond_destroy(&p->go_cond);
  pthread_mutex_destroy(&p->go_mutex);
  free((pool_alloc *)(void *)p);
  t->pool = NULL;
}

bp_status bp_rank_pool_run(bp_trainer *t, const bp_rank_step *ranks, const bp_segment *segments,
                           int count, int buffer, bp_data_loader **loaders,
                           bp_data_batch *batches) {
  bp_rank_pool *p = t->pool;
  TRAIN_ASSERT(p && count >= 0 && count <= BP_SEGMENT_COUNT);
  /* a skipped collective would leave the other ranks waiting in it */
  for (int k = 0; k < t->local; k++)
    TRAIN_ASSERT(ranks[k].variant >= 0 && !(ranks[k].skip & BP_TRAIN_COLLECTIVE));
  memcpy(p->ranks, ranks, (size_t)t->local * sizeof *ranks);
  p->count = count;
  p->buffer = buffer;
  p->loaders = loaders;
  p->batches = batches;
  memcpy(p->segments, segments, (size_t)count * sizeof *segments);
  bp_comm_barrier(p->gate);
  run_job(p, 0);
  bp_comm_barrier(p->gate);
  for (int k = 0; k < t->local; k++)
    if (p->status[k] != BP_OK) return bp_fail(p->status[k], "%s", p->why[k]);
  return BP_OK;
}
