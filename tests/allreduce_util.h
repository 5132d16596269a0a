/* Helpers of the all-reduce tests (test_allreduce.c, in-process ranks;
 * test_allreduce_mpi.c, ranks under mpirun): the values every rank puts in
 * a span, the bits each op must leave, and the args of one kernel call. */
#ifndef BP_TESTS_ALLREDUCE_UTIL_H
#define BP_TESTS_ALLREDUCE_UTIL_H

#include <stdint.h>

#include "blueprint/registry.h"
#include "bp_abi.h"
#include "bp_abi_ops.h"

/* The kernel of `op` with implementation `impl` in `registry`, or NULL. */
const bp_abi_kernel *ar_kernel(bp_registry *registry, const char *op, const char *impl);

/* A value of rank r, element i: varied magnitudes and signs, so the sum's
 * rounding depends on its order. */
float ar_value_of(int r, uint64_t i);

/* The value element i of a span of `count` must hold on rank r after `op`
 * ("allreduce.sum", ".reduce_scatter", ".all_gather") over `world` ranks
 * that filled it with ar_value_of: 1 and *want, or 0 where it is undefined
 * (the chunks a reduce_scatter does not own). */
int ar_expected(const char *op, int world, int r, uint64_t count, uint64_t i, float scale,
                float *want);

/* The args of one rank's call over the FP32 span data[0..count), in place. */
typedef struct ar_node {
  bp_abi_tensor span;
  bp_allreduce_attrs attrs;
  void *ptr;
  bp_abi_comm comm;
  bp_abi_kernel_args args;
} ar_node;

/* c: the rank's communicator, or NULL for none (args.comm NULL). */
void ar_node_init(ar_node *n, float *data, uint64_t count, float scale, const bp_abi_comm *c);

#endif
