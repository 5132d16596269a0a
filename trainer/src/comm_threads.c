/* The in-process communicator (comm.h): a barrier and one published
 * pointer per rank, lent to kernels as bp_abi_comm_threads. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blueprint/comm.h"

/* Spin a little before sleeping: the ranks of a step arrive close
 * together, and a sleep/wake pair costs more than the wait. Not when the
 * ranks outnumber the cores: a spinning rank would only delay the ones it
 * waits for. */
#define COMM_SPINS 4000

struct bp_comm {
  int world;
  int spins; /* COMM_SPINS, or 0 with more ranks than cores */
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  int arrived;              /* under mutex */
  atomic_uint generation;   /* bumped by the last arrival */
  void *slots[BP_COMM_MAX_WORLD]; /* each rank's published pointer */
  bp_abi_comm_threads abi;        /* the functions below, for kernels */
};

static void abi_barrier(void *ctx) { bp_comm_barrier(ctx); }
static void abi_publish(void *ctx, int32_t rank, void *pointer) {
  ((bp_comm *)ctx)->slots[rank] = pointer; /* read by peers after the next barrier */
}
static void *abi_peer(void *ctx, int32_t peer) { return ((bp_comm *)ctx)->slots[peer]; }

bp_status bp_comm_create(int world, bp_comm **out) {
  if (!out) return bp_fail(BP_ERR_INVALID, "bp_comm_create: NULL argument");
  if (world < 1 || world > BP_COMM_MAX_WORLD)
    return bp_fail(BP_ERR_INVALID, "communicator: world %d must be in [1, %d]", world,
                   BP_COMM_MAX_WORLD);
  bp_comm *c = calloc(1, sizeof *c);
  if (!c) return bp_fail(BP_ERR_NOMEM, "out of memory creating a communicator");
  c->world = world;
  c->spins = world <= sysconf(_SC_NPROCESSORS_ONLN) ? COMM_SPINS : 0;
  c->abi = (bp_abi_comm_threads){sizeof c->abi, c, abi_barrier, abi_publish, abi_peer};
  atomic_init(&c->generation, 0u);
  if (pthread_mutex_init(&c->mutex, NULL) != 0) {
    free(c);
    return bp_fail(BP_ERR_NOMEM, "communicator: pthread_mutex_init failed");
  }
  if (pthread_cond_init(&c->cond, NULL) != 0) {
    pthread_mutex_destroy(&c->mutex);
    free(c);
    return bp_fail(BP_ERR_NOMEM, "communicator: pthread_cond_init failed");
  }
  *out = c;
  return BP_OK;
}

void bp_comm_destroy(bp_comm *c) {
  if (!c) return;
  pthread_cond_destroy(&c->cond);
  pthread_mutex_destroy(&c->mutex);
  free(c);
}

int bp_comm_world(const bp_comm *c) { return c ? c->world : 0; }

void bp_comm_barrier(bp_comm *c) {
  if (c->world == 1) return;
  pthread_mutex_lock(&c->mutex);
  const unsigned gen = atomic_load(&c->generation);
  if (++c->arrived == c->world) {
    c->arrived = 0;
    atomic_store(&c->generation, gen + 1u);
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mutex);
    return;
  }
  pthread_mutex_unlock(&c->mutex);
  for (int i = 0; i < c->spins; i++) {
    if (atomic_load(&c->generation) != gen) return;
    if (i >= 64) sched_yield();
  }
  pthread_mutex_lock(&c->mutex);
  while (atomic_load(&c->generation) == gen) pthread_cond_wait(&c->cond, &c->mutex);
  pthread_mutex_unlock(&c->mutex);
}

bp_abi_comm bp_comm_abi(bp_comm *c, int rank) {
  return (bp_abi_comm){sizeof(bp_abi_comm), "threads", rank, c->world, &c->abi};
}
