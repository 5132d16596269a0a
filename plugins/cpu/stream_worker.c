/* One worker thread and a FIFO of tasks (stream_worker.h). */
#include "stream_worker.h"

#include <stddef.h>
#include <string.h>

#include "bp_abi_sdk.h"

/* The worker whose thread is the calling one (NULL elsewhere). */
static _Thread_local const stream_worker *current;

static void *worker_main(void *arg) {
  stream_worker *w = arg;
  current = w;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (!w->head && !w->stop) pthread_cond_wait(&w->cv_work, &w->mu);
    if (!w->head) break; /* stop requested and the FIFO is drained */
    stream_task *t = w->head;
    w->head = t->next;
    if (!w->head) w->tail = NULL;
    pthread_mutex_unlock(&w->mu);
    t->run(t); /* frees t */
    pthread_mutex_lock(&w->mu);
    w->completed++;
    BP_ASSERT(w->completed <= w->enqueued);
    if (w->completed == w->enqueued) pthread_cond_broadcast(&w->cv_idle);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

int stream_worker_start(stream_worker *w) {
  memset(w, 0, sizeof *w);
  int rc = pthread_mutex_init(&w->mu, NULL);
  if (rc != 0) return rc;
  rc = pthread_cond_init(&w->cv_work, NULL);
  if (rc != 0) goto fail_cv_work;
  rc = pthread_cond_init(&w->cv_idle, NULL);
  if (rc != 0) goto fail_cv_idle;
  rc = pthread_create(&w->thread, NULL, worker_main, w);
  if (rc != 0) goto fail_thread;
  return 0;

fail_thread:
  pthread_cond_destroy(&w->cv_idle);
fail_cv_idle:
  pthread_cond_destroy(&w->cv_work);
fail_cv_work:
  pthread_mutex_destroy(&w->mu);
  return rc;
}

void stream_worker_stop(stream_worker *w) {
  BP_ASSERT(current != w); /* a task may not stop its own worker */
  pthread_mutex_lock(&w->mu);
  w->stop = 1;
  pthread_cond_signal(&w->cv_work);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->thread, NULL);
  BP_ASSERT(w->head == NULL && w->completed == w->enqueued);
  pthread_cond_destroy(&w->cv_idle);
  pthread_cond_destroy(&w->cv_work);
  pthread_mutex_destroy(&w->mu);
}

void stream_worker_push(stream_worker *w, stream_task *t) {
  t->next = NULL;
  pthread_mutex_lock(&w->mu);
  if (w->tail)
    w->tail->next = t;
  else
    w->head = t;
  w->tail = t;
  w->enqueued++;
  pthread_cond_signal(&w->cv_work);
  pthread_mutex_unlock(&w->mu);
}

void stream_worker_drain(stream_worker *w) {
  BP_ASSERT(current != w);
  pthread_mutex_lock(&w->mu);
  while (w->completed != w->enqueued) pthread_cond_wait(&w->cv_idle, &w->mu);
  pthread_mutex_unlock(&w->mu);
}

int stream_worker_is_current(const stream_worker *w) { return current == w; }
