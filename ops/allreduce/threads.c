/* The collectives (allreduce.sum, .reduce_scatter, .all_gather) for ranks
 * that share memory (impl "threads", backend "threads": threads of one
 * process, or mpirun processes of one machine that share their arenas' spans):
 * every rank publishes its span, reduces the chunk it owns straight from
 * its peers' spans (reduce-scatter) and copies the other chunks from their
 * owners (all-gather), all in shared memory; the order of the sum is
 * allreduce-impl.h's. One barrier when the spans are published, then one
 * after each phase (its chunks final, or nobody reads any more): three for
 * a sum, two for one phase. Built as bp_ops_allreduce.so. */
#include <string.h>

#include "allreduce-impl.h"
#include "module_register.h"
#ifdef BP_OPS_ALLREDUCE_BUILD_ID_HEADER
#include "build_id.h" /* generated: a hash of the sources and compiler settings */
#endif

#ifndef BP_OPS_ALLREDUCE_VERSION
#define BP_OPS_ALLREDUCE_VERSION "0.0.0"
#endif
#ifndef BP_OPS_ALLREDUCE_BUILD_ID
#define BP_OPS_ALLREDUCE_BUILD_ID "unknown"
#endif

#define THREADS_MAX_WORLD 256 /* peers are cached on the stack */

static int threads_comm_ok(const bp_abi_comm *c, char *reason, size_t size) {
  const bp_abi_comm_threads *t = c->handle;
  if (t->struct_size < sizeof *t || !t->barrier || !t->publish || !t->peer)
    return bp_sdk_fail(reason, size, "the threads communicator lacks barrier/publish/peer");
  return 1;
}

static int threads_check(const bp_abi_kernel_args *a, ar_op op, uint64_t *count, float *scale,
                         char *reason, size_t size) {
  return ar_check(a, op, "threads", THREADS_MAX_WORLD, count, scale, reason, size) &&
         threads_comm_ok(a->comm, reason, size);
}

static int threads_run(const bp_abi_kernel_args *a, ar_op op) {
  uint64_t count;
  float scale;
  if (!threads_check(a, op, &count, &scale, bp_sdk_args_reason(a), bp_sdk_args_reason_size(a)))
    return BP_ABI_ERR_INVALID;
  ar_copy_in(a, count);
  float *data = a->output_ptrs[0];
  const int world = a->comm->world, rank = a->comm->rank;
  if (world == 1) {
    if (AR_REDUCES(op)) ar_reduce_chunk(data, (const float *const[]){data}, 1, count, scale);
    return BP_ABI_OK;
  }
  const bp_abi_comm_threads *t = a->comm->handle;
  t->publish(t->ctx, rank, data);
  t->barrier(t->ctx); /* every span is published and holds its rank's values */
  const float *peer[THREADS_MAX_WORLD];
  for (int r = 0; r < world; r++) peer[r] = t->peer(t->ctx, r);
  if (AR_REDUCES(op)) { /* this rank owns chunk `rank`, read from every peer's span */
    const uint64_t lo = ar_chunk_start(count, world, rank);
    const uint64_t hi = ar_chunk_start(count, world, rank + 1);
    const float *chunk[THREADS_MAX_WORLD];
    for (int r = 0; r < world; r++) chunk[r] = peer[r] + lo;
    ar_reduce_chunk(data + lo, chunk, world, hi - lo, scale);
    t->barrier(t->ctx); /* every chunk is final in its owner's span; nobody reads ours */
  }
  if (AR_GATHERS(op)) {
    for (int r = 0; r < world; r++) {
      if (r == rank) continue;
      const uint64_t a0 = ar_chunk_start(count, world, r), z = ar_chunk_start(count, world, r + 1);
      if (z > a0) memcpy(data + a0, peer[r] + a0, (size_t)(z - a0) * sizeof *data);
    }
    t->barrier(t->ctx); /* nobody reads this rank's span any more */
  }
  return BP_ABI_OK;
}

static int threads_supports(void *user, const bp_abi_kernel_args *a, char *reason,
                            size_t size) {
  uint64_t count;
  float scale;
  return threads_check(a, ar_op_of(user), &count, &scale, reason, size);
}
static int threads_run_op(void *user, const bp_abi_kernel_args *a) {
  return threads_run(a, ar_op_of(user));
}

#define THREADS_KERNEL(op_name, phase)                                                          \
  {                                                                                             \
    .struct_size = sizeof(bp_abi_kernel), .op = op_name, .impl = "threads", .device = "cpu",    \
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), .priority = 0, .flags = AR_FLAGS,            \
    .supports = threads_supports, .run = threads_run_op, .user = AR_USER(phase)                 \
  }
static const bp_abi_kernel threads_descriptors[] = {
    THREADS_KERNEL("allreduce.sum", AR_SUM),
    THREADS_KERNEL("allreduce.reduce_scatter", AR_REDUCE_SCATTER),
    THREADS_KERNEL("allreduce.all_gather", AR_ALL_GATHER),
};
static const bp_abi_kernel *const threads_kernels[] = {
    &threads_descriptors[0], &threads_descriptors[1], &threads_descriptors[2]};

static int threads_init(const bp_abi_host *host) {
  return ops_register_kernels(host, "ops-allreduce", threads_kernels,
                              sizeof threads_kernels / sizeof threads_kernels[0]);
}

static const bp_abi_module threads_module = {
    .struct_size = sizeof(bp_abi_module),
    .abi_major = BP_ABI_MAJOR,
    .abi_minor_built = BP_ABI_MINOR,
    .abi_minor_required = 1,
    .name = "ops-allreduce",
    .version = BP_OPS_ALLREDUCE_VERSION,
    .build_id = BP_OPS_ALLREDUCE_BUILD_ID,
    .init = threads_init,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &threads_module; }
