/* The in-process communicator (comm.h): a barrier and a deterministic
 * reduce-scatter + all-gather over the ranks' own buffers. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/comm.h"

/* Spin a little before sleeping: the ranks of a step arrive close
 * together, and a sleep/wake pair costs more than the wait. */
#define COMM_SPINS 4000

struct bp_comm {
  int world;
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  int arrived;              /* under mutex */
  atomic_uint generation;   /* bumped by the last arrival */
  float *bufs[BP_COMM_MAX_WORLD]; /* each rank's buffer of the current all-reduce */
};

bp_status bp_comm_create(int world, bp_comm **out) {
  if (!out) return bp_fail(BP_ERR_INVALID, "bp_comm_create: NULL argument");
  if (world < 1 || world > BP_COMM_MAX_WORLD)
    return bp_fail(BP_ERR_INVALID, "communicator: world %d must be in [1, %d]", world,
                   BP_COMM_MAX_WORLD);
  bp_comm *c = calloc(1, sizeof *c);
  if (!c) return bp_fail(BP_ERR_NOMEM, "out of memory creating a communicator");
  c->world = world;
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
  for (int i = 0; i < COMM_SPINS; i++) {
    if (atomic_load(&c->generation) != gen) return;
    if (i >= 64) sched_yield();
  }
  pthread_mutex_lock(&c->mutex);
  while (atomic_load(&c->generation) == gen) pthread_cond_wait(&c->cond, &c->mutex);
  pthread_mutex_unlock(&c->mutex);
}

static uint64_t chunk_start(uint64_t count, int world, int k) {
  /* count * k / world without overflow for any count below 2^64 / world */
  const uint64_t w = (uint64_t)world, q = count / w, r = count % w;
  return q * (uint64_t)k + r * (uint64_t)k / w;
}

#define COMM_BLOCK 1024

void bp_comm_allreduce_f32(bp_comm *c, int rank, float *data, uint64_t count, float scale) {
  const int world = c->world;
  if (world == 1) {
    for (uint64_t i = 0; i < count; i++) data[i] *= scale;
    return;
  }
  c->bufs[rank] = data;
  bp_comm_barrier(c); /* every buffer is published and holds its rank's values */
  /* reduce-scatter: this rank owns chunk `rank` */
  const uint64_t lo = chunk_start(count, world, rank), hi = chunk_start(count, world, rank + 1);
  float acc[COMM_BLOCK];
  for (uint64_t b = lo; b < hi; b += COMM_BLOCK) {
    const uint64_t n = hi - b < COMM_BLOCK ? hi - b : COMM_BLOCK;
    memcpy(acc, c->bufs[0] + b, (size_t)n * sizeof *acc);
    for (int r = 1; r < world; r++) {
      const float *src = c->bufs[r] + b;
      for (uint64_t i = 0; i < n; i++) acc[i] += src[i];
    }
    for (uint64_t i = 0; i < n; i++) data[b + i] = acc[i] * scale;
  }
  bp_comm_barrier(c); /* every chunk is final in its owner's buffer */
  /* all-gather */
  for (int r = 0; r < world; r++) {
    if (r == rank) continue;
    const uint64_t a = chunk_start(count, world, r), z = chunk_start(count, world, r + 1);
    if (z > a) memcpy(data + a, c->bufs[r] + a, (size_t)(z - a) * sizeof *data);
  }
  bp_comm_barrier(c); /* nobody reads this rank's buffer any more */
}
