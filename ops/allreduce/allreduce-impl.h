/* Private helpers of the all-reduce modules (ops/allreduce/).
 *
 * The contract every implementation keeps (bp_abi_ops.h, allreduce.*): one
 * FP32 span [1,1,1,E], in place. The sum has one fixed order: the span is
 * cut into `world` chunks by bp_abi_chunk_start; rank k owns chunk k and
 * sums it over ranks 0, 1, ..., world-1 in that order in one float
 * accumulator starting from rank 0's value, then multiplies by scale
 * (reduce-scatter); every rank then copies the other chunks from their
 * owners (all-gather). allreduce.sum is both phases, reduce_scatter and
 * all_gather one each. Every implementation does exactly these float
 * operations, so "threads" and "mpi" give the same bits for the same
 * inputs, whatever the timing, and a sharded update (reduce_scatter,
 * update, all_gather) the same bits as allreduce.sum then the update.
 * "nccl" (nccl.c) keeps the chunks, the phases and "sum, then scale", but
 * NCCL chooses the order of each chunk's sum: its bits differ from these by
 * rounding, and are still the same on every rank and between
 * allreduce.sum and reduce_scatter. */
#ifndef BP_OPS_ALLREDUCE_IMPL_H
#define BP_OPS_ALLREDUCE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "bp_abi.h"
#include "bp_abi_ops.h"
#include "bp_abi_sdk.h"

#define AR_FLAGS \
  (BP_ABI_KERNEL_DETERMINISTIC | BP_ABI_KERNEL_IN_PLACE | BP_ABI_KERNEL_COLLECTIVE)
#define AR_BLOCK 1024 /* elements summed per pass (one accumulator block on the stack) */

/* The three ops, as phases: what a call reduces and what it gathers. */
typedef enum ar_op { AR_SUM, AR_REDUCE_SCATTER, AR_ALL_GATHER } ar_op;
#define AR_REDUCES(op) ((op) != AR_ALL_GATHER)
#define AR_GATHERS(op) ((op) != AR_REDUCE_SCATTER)
/* A kernel's `user` pointer carries its op: one supports/run pair serves
 * all three descriptors of a module. */
#define AR_USER(op) ((void *)(uintptr_t)(op))
static inline ar_op ar_op_of(const void *user) { return (ar_op)(uintptr_t)user; }

static inline uint64_t ar_chunk_start(uint64_t count, int world, int k) {
  return bp_abi_chunk_start(count, world, k);
}

/* The args of an `op` node for `backend`: struct sizes, one FP32 span in
 * and the same span out, the attribute block (not for all_gather), and a
 * communicator of that backend with 1 <= world <= max_world and 0 <= rank <
 * world. Fills *count and *scale (1 for all_gather). 0 with a reason
 * otherwise (run() passes the host's buffer, bp_sdk_args_reason). */
int ar_check(const bp_abi_kernel_args *args, ar_op op, const char *backend, int max_world,
             uint64_t *count, float *scale, char *reason, size_t reason_size);

/* dst[i] = scale * (src[0][i] + src[1][i] + ... + src[world-1][i]) for i <
 * n: one float accumulator per element starting from src[0], summed in rank
 * order, then scaled. The one summation every implementation calls, so
 * they all give the same bits. dst may be any src. */
void ar_reduce_chunk(float *dst, const float *const *src, int world, uint64_t n, float scale);

/* Copies the input span into the output span when they differ (in place is
 * the usual case and copies nothing). */
void ar_copy_in(const bp_abi_kernel_args *args, uint64_t count);

#endif
