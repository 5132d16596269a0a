/* A stream's machinery on the host: a FIFO of tasks that one worker thread
 * runs one at a time in push order. The cpu device plugin (device_cpu.c)
 * builds its streams on it, and so does the guarded test device
 * (tests/modules/guarddev.c); each compiles stream_worker.c into itself
 * (hidden symbols), so neither depends on the other or on the core. What a
 * task does (copies, host functions, event marks) stays with the plugin.
 *
 * Invariant: completed <= enqueued; they are equal exactly when the FIFO
 * is empty and the worker is idle (checked by the worker, BP_ASSERT). */
#ifndef BP_PLUGIN_STREAM_WORKER_H
#define BP_PLUGIN_STREAM_WORKER_H

#include <pthread.h>
#include <stdint.h>

/* One task, embedded first in the plugin's own task struct. */
typedef struct stream_task {
  struct stream_task *next; /* the FIFO's link (the worker's) */
  /* Runs the task on the worker thread, then frees it: the worker does not
   * touch the task afterwards. */
  void (*run)(struct stream_task *self);
} stream_task;

/* Fields are the worker's: use the functions below. */
typedef struct stream_worker {
  pthread_mutex_t mu;
  pthread_cond_t cv_work; /* the worker waits here for tasks */
  pthread_cond_t cv_idle; /* drain waits here for completion */
  stream_task *head, *tail;
  uint64_t enqueued, completed; /* the invariant */
  int stop;
  pthread_t thread;
} stream_worker;

/* Initializes w and starts its worker: 0, or an errno value with nothing
 * left to clean up. */
int stream_worker_start(stream_worker *w);

/* Runs every task pushed so far, stops the worker and releases w's
 * resources (not w itself). Not from one of w's own tasks. */
void stream_worker_stop(stream_worker *w);

/* Appends t (handed over) to the FIFO. Any thread, a task of w included. */
void stream_worker_push(stream_worker *w, stream_task *t);

/* Returns when every task pushed so far has run. Not from one of w's own
 * tasks (it would wait for itself): see stream_worker_is_current. */
void stream_worker_drain(stream_worker *w);

/* 1 when the calling thread is w's worker (inside one of its tasks). */
int stream_worker_is_current(const stream_worker *w);

#endif
