/* The loader thread: prefetches one batch ahead into the two input buffers
 * (A and B, the plan's I_A and I_B) while the consumer works on the other.
 *
 * State of each buffer, guarded by `mutex`:
 *
 *     FREE --(thread fills it)--> READY --(next() hands it out)--> HELD
 *       ^                                                            |
 *       +----------(next() or release() hands it back)---------------+
 *
 * Invariants (checked by check_locked in every transition, always on):
 *  1. batch k (counted from 0 since create) is filled into buffer k % 2, so
 *     the buffers alternate A, B, A, ...;
 *  2. delivered <= produced <= delivered + 2: the thread is never more than
 *     two batches ahead, and at most one buffer is HELD;
 *  3. the thread writes a buffer only while it is FREE (it marks nothing
 *     while writing; the consumer never touches a FREE buffer), and the
 *     consumer reads only the buffer it HOLDS;
 *  4. once `finished` is set the thread writes nothing more.
 * The fill itself runs outside the mutex.
 *
 * Inline mode (options.inline_fill) has no thread: next() fills the batch
 * itself, in the caller's thread, through the same cursor and the same
 * transitions (FREE -> READY -> HELD at once), so the batches, their
 * buffers and their bytes are those of the threaded mode. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data-impl.h"
#include "bp_abi_sdk.h"

/* Always-on check of an internal invariant (a bug, never bad input). */
typedef enum { BUF_FREE = 0, BUF_READY, BUF_HELD } buf_state;

typedef struct loader_buffer {
  void *images;
  bp_dtensor image_desc;
  void *labels;
  bp_dtensor label_desc;
  int has_labels;
  buf_state state;
  bp_data_batch batch; /* what the thread put in it (valid when READY/HELD) */
  int64_t *indices;    /* capacity entries */
} loader_buffer;

struct bp_data_loader {
  const bp_dataset *dataset; /* borrowed */
  bp_data_loader_options options;
  bp_data_norm norm;
  int has_norm;
  int64_t steps;    /* per epoch */
  int64_t capacity; /* rows a rank may receive per step */
  int64_t *perm;    /* the producer's current epoch permutation */
  loader_buffer buf[2];
  /* the producer's cursor (the thread's, or next()'s when inline): the
   * epoch and step of the next batch to fill, the epoch perm is for */
  int64_t epoch, step, perm_epoch;

  pthread_t thread;
  int thread_started;
  pthread_mutex_t mutex;
  pthread_cond_t cond; /* every state change broadcasts */
  int stop;            /* destroy asked the thread to end */
  int finished;        /* the thread ended: every epoch filled, stopped, or failed */
  bp_status error;     /* the thread's failure (BP_OK if none) */
  char error_msg[1024];
  int64_t produced;  /* batches filled (READY or beyond) */
  int64_t delivered; /* batches handed out by next() */
  int held;          /* buffer the consumer holds, -1 if none */
};

static void check_locked(const bp_data_loader *l) {
  BP_ASSERT(l->delivered <= l->produced && l->produced <= l->delivered + 2);
  int held = 0;
  for (int b = 0; b < 2; b++) held += l->buf[b].state == BUF_HELD;
  BP_ASSERT(held <= 1);
  BP_ASSERT(l->held < 0 || l->buf[l->held].state == BUF_HELD);
}

/* Fills buffer `b` with step `step` of epoch `epoch` (perm is that epoch's). */
static bp_status fill_one(bp_data_loader *l, loader_buffer *b, int64_t epoch, int64_t step) {
  const bp_data_loader_options *o = &l->options;
  bp_data_slice slice;
  bp_status st = bp_data_step_slice(bp_dataset_get_info(l->dataset)->count, o->global_batch,
                                    o->drop_last, step, o->world, o->rank, &slice);
  if (st != BP_OK) return st;
  memcpy(b->indices, l->perm + slice.first, (size_t)slice.count * sizeof *b->indices);
  bp_data_fill_options fo = {l->has_norm ? &l->norm : NULL, o->augment, o->seed,
                             (uint64_t)epoch};
  st = bp_data_fill(l->dataset, b->indices, slice.count, &fo, &b->image_desc, b->images,
                    b->has_labels ? &b->label_desc : NULL, b->has_labels ? b->labels : NULL);
  if (st != BP_OK) return st;
  b->batch = (bp_data_batch){.buffer = (int)(b - l->buf),
                             .count = slice.count,
                             .global_count = slice.global_count,
                             .epoch = epoch,
                             .step = step,
                             .steps = l->steps,
                             .first = slice.first,
                             .indices = b->indices,
                             .last_in_epoch = step == l->steps - 1,
                             .done = 0};
  return BP_OK;
}

/* Whether the cursor has passed the last epoch asked for. */
static int cursor_at_end(const bp_data_loader *l) {
  const bp_data_loader_options *o = &l->options;
  return o->epochs > 0 && l->epoch >= o->first_epoch + o->epochs;
}

/* Fills the FREE buffer of batch `produced` at the cursor, marks it READY
 * and moves the cursor on. Called by the producer only (the thread, or
 * next() when inline); takes the mutex for the transition. */
static bp_status produce_one(bp_data_loader *l) {
  const bp_data_loader_options *o = &l->options;
  loader_buffer *b = &l->buf[l->produced % 2]; /* produced changes only here */
  if (l->perm_epoch != l->epoch) {
    const int64_t n = bp_dataset_get_info(l->dataset)->count;
    bp_status st = bp_data_permutation(o->seed, (uint64_t)l->epoch, o->shuffle, n, l->perm);
    if (st != BP_OK) return st;
    l->perm_epoch = l->epoch;
  }
  bp_status st = fill_one(l, b, l->epoch, l->step); /* b is FREE: only the producer touches it */
  if (st != BP_OK) return st;
  pthread_mutex_lock(&l->mutex);
  BP_ASSERT(b->state == BUF_FREE);
  b->state = BUF_READY;
  l->produced++;
  check_locked(l);
  pthread_cond_broadcast(&l->cond);
  pthread_mutex_unlock(&l->mutex);
  if (++l->step == l->steps) {
    l->step = 0;
    l->epoch++;
  }
  return BP_OK;
}

/* The producer ends: every epoch filled, stopped, or failed with `st`
 * (its message is the producer thread's last error). */
static void finish(bp_data_loader *l, bp_status st) {
  pthread_mutex_lock(&l->mutex);
  if (st != BP_OK) {
    l->error = st;
    snprintf(l->error_msg, sizeof l->error_msg, "%s", bp_last_error());
  }
  l->finished = 1;
  pthread_cond_broadcast(&l->cond);
  pthread_mutex_unlock(&l->mutex);
}

static void *loader_main(void *arg) {
  bp_data_loader *l = arg;
  bp_status st = BP_OK;
  while (!cursor_at_end(l)) {
    const loader_buffer *b = &l->buf[l->produced % 2];
    pthread_mutex_lock(&l->mutex);
    while (b->state != BUF_FREE && !l->stop) pthread_cond_wait(&l->cond, &l->mutex);
    int stop = l->stop;
    pthread_mutex_unlock(&l->mutex);
    if (stop) break;
    if ((st = produce_one(l)) != BP_OK) break;
  }
  finish(l, st);
  return NULL;
}

/* Hands back the held buffer; caller holds the mutex. */
static void release_locked(bp_data_loader *l) {
  if (l->held < 0) return;
  l->buf[l->held].state = BUF_FREE;
  l->held = -1;
  check_locked(l);
  pthread_cond_broadcast(&l->cond);
}

static bp_status check_loader_options(const bp_dataset_info *in, const bp_data_loader_options *o,
                                      int64_t *steps_out) {
  if (o->global_batch < 1 || o->world < 1 || o->rank < 0 || o->rank >= o->world)
    return bp_fail(BP_ERR_INVALID, "loader: global batch %lld, rank %d of world %d is invalid",
                   (long long)o->global_batch, o->rank, o->world);
  if (o->first_epoch < 0 || o->epochs < 0)
    return bp_fail(BP_ERR_INVALID, "loader: first epoch %lld and epochs %lld must be >= 0",
                   (long long)o->first_epoch, (long long)o->epochs);
  int64_t steps = bp_data_steps_per_epoch(in->count, o->global_batch, o->drop_last);
  if (steps == 0)
    return bp_fail(BP_ERR_INVALID,
                   "loader: %lld samples make no batch of %lld with drop_last (an empty epoch)",
                   (long long)in->count, (long long)o->global_batch);
  if (o->first_step < 0 || o->first_step >= steps)
    return bp_fail(BP_ERR_INVALID, "loader: first step %lld is outside the %lld steps per epoch",
                   (long long)o->first_step, (long long)steps);
  *steps_out = steps;
  return BP_OK;
}

bp_status bp_data_loader_create(const bp_dataset *dataset, const bp_data_loader_options *options,
                                const bp_data_buffer buffers[2], bp_data_loader **loader_out) {
  if (!dataset || !options || !buffers || !loader_out)
    return bp_fail(BP_ERR_INVALID, "bp_data_loader_create: NULL argument");
  const bp_dataset_info *in = bp_dataset_get_info(dataset);
  int64_t steps = 0;
  bp_status st = check_loader_options(in, options, &steps);
  if (st != BP_OK) return st;
  const int64_t capacity = bp_data_rank_capacity(options->global_batch, options->world);
  static const char *const names[2] = {"loader buffer A", "loader buffer B"};
  for (int b = 0; b < 2; b++) {
    st = bp_data_check_targets_(in, capacity, names[b], buffers[b].image_desc, buffers[b].images,
                                buffers[b].label_desc, buffers[b].labels);
    if (st != BP_OK) return st;
  }
  if (buffers[0].images == buffers[1].images)
    return bp_fail(BP_ERR_INVALID, "loader buffers A and B are the same memory");
  bp_data_fill_options fo = {options->norm, options->augment, options->seed, 0};
  st = bp_data_check_fill_options_(in, &fo);
  if (st != BP_OK) return st;

  bp_data_loader *l = calloc(1, sizeof *l);
  if (!l) return bp_fail(BP_ERR_NOMEM, "out of memory creating a data loader");
  if (pthread_mutex_init(&l->mutex, NULL) != 0) {
    free(l);
    return bp_fail(BP_ERR_NOMEM, "data loader: pthread_mutex_init failed");
  }
  if (pthread_cond_init(&l->cond, NULL) != 0) {
    pthread_mutex_destroy(&l->mutex);
    free(l);
    return bp_fail(BP_ERR_NOMEM, "data loader: pthread_cond_init failed");
  }
  l->dataset = dataset;
  l->options = *options;
  l->options.norm = NULL; /* the copy below is used */
  if (options->norm) {
    l->norm = *options->norm;
    l->has_norm = 1;
  }
  l->steps = steps;
  l->capacity = capacity;
  l->held = -1;
  l->epoch = options->first_epoch;
  l->step = options->first_step;
  l->perm_epoch = -1;
  l->perm = malloc((size_t)in->count * sizeof *l->perm);
  int ok = l->perm != NULL;
  for (int b = 0; b < 2; b++) {
    loader_buffer *lb = &l->buf[b];
    lb->images = buffers[b].images;
    lb->image_desc = *buffers[b].image_desc;
    lb->has_labels = buffers[b].labels != NULL;
    if (lb->has_labels) {
      lb->labels = buffers[b].labels;
      lb->label_desc = *buffers[b].label_desc;
    }
    lb->indices = malloc((size_t)capacity * sizeof *lb->indices);
    ok = ok && lb->indices != NULL;
  }
  if (!ok) {
    bp_data_loader_destroy(l); /* no thread yet: frees what exists */
    return bp_fail(BP_ERR_NOMEM, "out of memory creating a data loader");
  }
  if (options->inline_fill) {
    *loader_out = l;
    return BP_OK;
  }
  int rc = pthread_create(&l->thread, NULL, loader_main, l);
  if (rc != 0) {
    bp_data_loader_destroy(l);
    return bp_fail(BP_ERR_NOMEM, "data loader: cannot start its thread (%s)", strerror(rc));
  }
  l->thread_started = 1;
  *loader_out = l;
  return BP_OK;
}

bp_status bp_data_loader_next(bp_data_loader *l, bp_data_batch *batch_out) {
  if (!l || !batch_out) return bp_fail(BP_ERR_INVALID, "bp_data_loader_next: NULL argument");
  if (l->options.inline_fill) { /* this thread is the producer: fill the next batch now */
    bp_data_loader_release(l);
    if (!l->finished) {
      bp_status st = cursor_at_end(l) ? BP_OK : produce_one(l);
      if (st != BP_OK || cursor_at_end(l)) finish(l, st);
    }
  }
  pthread_mutex_lock(&l->mutex);
  release_locked(l);
  loader_buffer *b = &l->buf[l->delivered % 2];
  while (b->state != BUF_READY && !(l->finished && l->produced == l->delivered))
    pthread_cond_wait(&l->cond, &l->mutex);
  if (b->state == BUF_READY) {
    b->state = BUF_HELD;
    l->held = (int)(b - l->buf);
    l->delivered++;
    check_locked(l);
    *batch_out = b->batch;
    pthread_mutex_unlock(&l->mutex);
    return BP_OK;
  }
  /* the thread has ended and every batch it filled was delivered */
  bp_status error = l->error;
  char msg[sizeof l->error_msg];
  memcpy(msg, l->error_msg, sizeof msg);
  pthread_mutex_unlock(&l->mutex);
  if (error != BP_OK) return bp_fail(error, "data loader: %s", msg);
  memset(batch_out, 0, sizeof *batch_out);
  batch_out->buffer = -1;
  batch_out->done = 1;
  return BP_OK;
}

void bp_data_loader_release(bp_data_loader *l) {
  if (!l) return;
  pthread_mutex_lock(&l->mutex);
  release_locked(l);
  pthread_mutex_unlock(&l->mutex);
}

void bp_data_loader_destroy(bp_data_loader *l) {
  if (!l) return;
  if (l->thread_started) {
    pthread_mutex_lock(&l->mutex);
    l->stop = 1;
    pthread_cond_broadcast(&l->cond);
    pthread_mutex_unlock(&l->mutex);
    pthread_join(l->thread, NULL);
  }
  pthread_cond_destroy(&l->cond);
  pthread_mutex_destroy(&l->mutex);
  free(l->perm);
  free(l->buf[0].indices);
  free(l->buf[1].indices);
  free(l);
}
