/* The one way a job runs on the local ranks (train-impl.h: bp_rank_pool_*):
 * ranks as threads, or inline on the caller's thread for one local rank. */
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

/* One rank's part of a job: its segments (train_run.c; after a failure
 * only the collectives, which the other ranks need), and, while they run,
 * its next batch. On the cpu device the segments have run when start
 * returns, so the batch is taken after the step has read this one, as the
 * inline loader needs; on a device the loader fills pinned staging while
 * the step runs. */
static bp_status rank_part(bp_trainer *t, int rank, const bp_rank_step *r,
                           const bp_segment *segments, int count, int buffer,
                           bp_data_loader *loader, bp_data_batch *batch) {
  bp_rank_job job = {.variant = r->variant,
                     .skip = r->skip,
                     .buffer = buffer,
                     .segments = segments,
                     .count = count,
                     .keep_collectives = t->local > 1,
                     .train_step = loader != NULL}; /* only a training step takes a batch */
  bp_train_job_start(t, rank, &job);
  /* job.status is the job's own until finish (a stream task may write it) */
  bp_status taken = BP_OK;
  char why[sizeof job.why];
  if (loader) {
    taken = bp_train_take_batch(t, rank, loader, batch);
    if (taken != BP_OK) snprintf(why, sizeof why, "%s", bp_last_error());
  }
  bp_status st = bp_train_job_finish(t, rank, &job); /* its failure comes first */
  return st != BP_OK || taken == BP_OK ? st : bp_fail(taken, "%s", why);
}

static void run_job(bp_rank_pool *p, int rank) {
  p->status[rank] = rank_part(p->t, rank, &p->ranks[rank], p->segments, p->count, p->buffer,
                              p->loaders ? p->loaders[rank] : NULL,
                              p->batches ? &p->batches[rank] : NULL);
  if (p->status[rank] != BP_OK) snprintf(p->why[rank], sizeof p->why[rank], "%s", bp_last_error());
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
  BP_ASSERT(count >= 0 && count <= BP_SEGMENT_COUNT);
  if (t->local == 1) { /* inline: the same part on the caller's thread */
    BP_ASSERT(!p && ranks[0].variant >= 0);
    return rank_part(t, 0, &ranks[0], segments, count, buffer, loaders ? loaders[0] : NULL,
                     batches);
  }
  BP_ASSERT(p);
  /* a skipped collective would leave the other ranks waiting in it */
  for (int k = 0; k < t->local; k++)
    BP_ASSERT(ranks[k].variant >= 0 && !(ranks[k].skip & BP_TRAIN_COLLECTIVE));
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
