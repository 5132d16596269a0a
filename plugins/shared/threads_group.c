/* The plugins' "threads" communicator (threads_group.h): a generation
 * barrier under a mutex, with a short spin first because the ranks of a
 * step arrive close together. */
#include "threads_group.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define SPINS 4000

struct threads_group {
  int32_t world;
  int spins; /* SPINS, or 0 with more ranks than cores (a spinner delays the rest) */
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  int32_t arrived; /* under mutex */
  atomic_uint generation;
  void *slots[THREADS_GROUP_MAX];
  bp_abi_comm_threads abi;
};

static void barrier(void *ctx) {
  threads_group *g = ctx;
  if (g->world == 1) return;
  pthread_mutex_lock(&g->mutex);
  const unsigned gen = atomic_load(&g->generation);
  if (++g->arrived == g->world) {
    g->arrived = 0;
    atomic_store(&g->generation, gen + 1u);
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->mutex);
    return;
  }
  pthread_mutex_unlock(&g->mutex);
  for (int i = 0; i < g->spins; i++) {
    if (atomic_load(&g->generation) != gen) return;
    if (i >= 64) sched_yield();
  }
  pthread_mutex_lock(&g->mutex);
  while (atomic_load(&g->generation) == gen) pthread_cond_wait(&g->cond, &g->mutex);
  pthread_mutex_unlock(&g->mutex);
}

static void publish(void *ctx, int32_t rank, void *pointer) {
  ((threads_group *)ctx)->slots[rank] = pointer; /* peers read it after the next barrier */
}

static void *peer(void *ctx, int32_t rank) { return ((threads_group *)ctx)->slots[rank]; }

int threads_group_open(int32_t world, threads_group **out, char *reason, size_t reason_size) {
  if (!out || world < 1 || world > THREADS_GROUP_MAX) {
    if (reason && reason_size) snprintf(reason, reason_size, "%d ranks: 1..%d", (int)world,
                                        THREADS_GROUP_MAX);
    return BP_ABI_ERR_INVALID;
  }
  threads_group *g = calloc(1, sizeof *g);
  if (!g) return BP_ABI_ERR_NOMEM;
  g->world = world;
  g->spins = world <= sysconf(_SC_NPROCESSORS_ONLN) ? SPINS : 0;
  g->abi = (bp_abi_comm_threads){sizeof g->abi, g, barrier, publish, peer};
  atomic_init(&g->generation, 0u);
  if (pthread_mutex_init(&g->mutex, NULL) != 0) {
    free(g);
    return BP_ABI_ERR_NOMEM;
  }
  if (pthread_cond_init(&g->cond, NULL) != 0) {
    pthread_mutex_destroy(&g->mutex);
    free(g);
    return BP_ABI_ERR_NOMEM;
  }
  *out = g;
  return BP_ABI_OK;
}

int threads_group_comm(threads_group *g, int32_t k, bp_abi_comm *comm_out) {
  if (!g || !comm_out || k < 0 || k >= g->world) return BP_ABI_ERR_INVALID;
  *comm_out = (bp_abi_comm){sizeof *comm_out, "threads", k, g->world, &g->abi};
  return BP_ABI_OK;
}

void threads_group_close(threads_group *g) {
  if (!g) return;
  pthread_cond_destroy(&g->cond);
  pthread_mutex_destroy(&g->mutex);
  free(g);
}
