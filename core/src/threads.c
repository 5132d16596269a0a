/* The per-rank parallel-for pool behind bp_abi_threads (threads.h).
 *
 * One job at a time: the caller publishes (fn, arg, n) under the mutex and
 * bumps `job`; workers wake, take chunks of indices from the atomic `next`
 * until it passes n, and count themselves out in `busy`. The caller takes
 * chunks too, then waits for busy == 0, so every fn call happens before
 * parallel_for returns (the mutex orders the workers' writes for it). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#endif
#include "blueprint/threads.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct bp_threads {
  bp_abi_threads abi; /* what kernels see; abi.ctx points back here */
  int count;
  int started;          /* workers actually running */
  pthread_t *workers;   /* [count - 1] */
  pthread_mutex_t call; /* one parallel_for at a time */
  pthread_mutex_t mu;   /* guards everything below except `next` */
  pthread_cond_t wake, done;
  uint64_t job; /* bumped per job; workers run each job once */
  int stop;
  int busy; /* workers not yet finished with the current job */
  void (*fn)(void *arg, int64_t i);
  void *arg;
  int64_t n, chunk;
  _Atomic int64_t next; /* first index nobody has taken */
};

/* The pool the current thread is working for: a parallel_for from inside
 * fn runs inline instead of waiting on itself. */
static _Thread_local const bp_threads *inside;

static void take_chunks(bp_threads *t, void (*fn)(void *, int64_t), void *arg, int64_t n,
                        int64_t chunk) {
  for (;;) {
    int64_t begin = atomic_fetch_add_explicit(&t->next, chunk, memory_order_relaxed);
    if (begin >= n) return;
    int64_t end = n - begin < chunk ? n : begin + chunk;
    for (int64_t i = begin; i < end; i++) fn(arg, i);
  }
}

static void *worker_main(void *p) {
  bp_threads *t = p;
  inside = t;
  uint64_t seen = 0;
  pthread_mutex_lock(&t->mu);
  for (;;) {
    while (t->job == seen && !t->stop) pthread_cond_wait(&t->wake, &t->mu);
    if (t->stop) break;
    seen = t->job;
    void (*fn)(void *, int64_t) = t->fn;
    void *arg = t->arg;
    int64_t n = t->n, chunk = t->chunk;
    pthread_mutex_unlock(&t->mu);
    take_chunks(t, fn, arg, n, chunk);
    pthread_mutex_lock(&t->mu);
    if (--t->busy == 0) pthread_cond_signal(&t->done);
  }
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

static void parallel_for(void *ctx, void (*fn)(void *arg, int64_t i), void *arg, int64_t n) {
  bp_threads *t = ctx;
  if (n <= 0) return;
  if (t->started == 0 || n == 1 || inside == t) {
    for (int64_t i = 0; i < n; i++) fn(arg, i);
    return;
  }
  pthread_mutex_lock(&t->call);
  /* About four chunks per thread: few enough atomics, small enough that
   * a slow index does not hold the others back. */
  int64_t chunk = n / ((int64_t)t->count * 4);
  if (chunk < 1) chunk = 1;
  pthread_mutex_lock(&t->mu);
  t->fn = fn;
  t->arg = arg;
  t->n = n;
  t->chunk = chunk;
  atomic_store_explicit(&t->next, 0, memory_order_relaxed);
  t->busy = t->started;
  t->job++;
  pthread_cond_broadcast(&t->wake);
  pthread_mutex_unlock(&t->mu);

  const bp_threads *outer = inside;
  inside = t;
  take_chunks(t, fn, arg, n, chunk);
  inside = outer;

  pthread_mutex_lock(&t->mu);
  while (t->busy > 0) pthread_cond_wait(&t->done, &t->mu);
  pthread_mutex_unlock(&t->mu);
  pthread_mutex_unlock(&t->call);
}

bp_status bp_threads_create(int count, bp_threads **out) {
  if (!out) return bp_fail(BP_ERR_INVALID, "bp_threads_create: out is NULL");
  if (count < 1 || count > 1024)
    return bp_fail(BP_ERR_INVALID, "bp_threads_create: count %d is outside [1, 1024]", count);
  bp_threads *t = calloc(1, sizeof *t);
  if (!t) return bp_fail(BP_ERR_NOMEM, "bp_threads_create: out of memory");
  t->abi = (bp_abi_threads){
      .struct_size = sizeof(bp_abi_threads),
      .count = count,
      .ctx = t,
      .parallel_for = parallel_for,
  };
  t->count = count;
  pthread_mutex_init(&t->call, NULL);
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->wake, NULL);
  pthread_cond_init(&t->done, NULL);
  if (count > 1) {
    t->workers = calloc((size_t)count - 1, sizeof *t->workers);
    if (!t->workers) {
      bp_threads_destroy(t);
      return bp_fail(BP_ERR_NOMEM, "bp_threads_create: out of memory");
    }
    for (int i = 0; i < count - 1; i++) {
      if (pthread_create(&t->workers[i], NULL, worker_main, t) != 0) {
        bp_threads_destroy(t);
        return bp_fail(BP_ERR_NOMEM, "bp_threads_create: could not start thread %d of %d", i + 2,
                       count);
      }
      t->started++;
    }
  }
  *out = t;
  return BP_OK;
}

void bp_threads_destroy(bp_threads *t) {
  if (!t) return;
  pthread_mutex_lock(&t->mu);
  t->stop = 1;
  pthread_cond_broadcast(&t->wake);
  pthread_mutex_unlock(&t->mu);
  for (int i = 0; i < t->started; i++) pthread_join(t->workers[i], NULL);
  pthread_cond_destroy(&t->done);
  pthread_cond_destroy(&t->wake);
  pthread_mutex_destroy(&t->mu);
  pthread_mutex_destroy(&t->call);
  free(t->workers);
  free(t);
}

const bp_abi_threads *bp_threads_abi(const bp_threads *t) { return t ? &t->abi : NULL; }

int bp_threads_share(int ranks_in_process) {
  int cores = 0;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cores = CPU_COUNT(&set);
  if (cores < 1) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    cores = online > 0 ? (int)online : 1;
  }
  int share = ranks_in_process > 1 ? cores / ranks_in_process : cores;
  if (share > 1024) share = 1024;
  return share < 1 ? 1 : share;
}
