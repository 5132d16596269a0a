/* The executor of one rank: a graph bound to that rank's arena.
 *
 * Binding (bp_exec_create) happens once per (variant, rank): every node's
 * tensors are resolved to arena base + offset, their kernel descriptors
 * (bp_abi_tensor) and argument blocks (bp_abi_kernel_args) are built, and
 * each node's kernel is chosen through bp_registry_select (pins from the
 * options or BP_KERNELS, then supports(), autotune, priority; REFERENCE
 * kernels only as a last resort). One workspace per rank, the largest any
 * node asks for, is allocated here and shared by every node (nodes run one
 * at a time on a rank).
 *
 * A sharded node (graph.h: bp_node.shard_domain) is bound to the slice of
 * its spans that lies in this rank's chunk of its bucket, the same slice of
 * every span (options.rank of options.world); a rank that owns none of it
 * leaves the node out of its bound segment.
 *
 * Collective nodes ("allreduce.*") are selected like any node; their
 * kernels (ops/allreduce) reach the other ranks through options.comm,
 * which every argument block carries (bp_abi_kernel_args.comm), and pick
 * themselves by its backend in supports(). Autotune never times them
 * (BP_ABI_KERNEL_COLLECTIVE): a collective cannot run on one rank alone.
 *
 * Running (bp_exec_run) a segment is a loop over its pre-bound nodes, each
 * a call of kernel.run(user, &args): no lookup, no allocation, no shape
 * arithmetic. Each node holds two argument blocks, one per input buffer:
 * they differ only in the pointers of tensors in I_A, which the B block
 * points at their I_B twins (graph.h invariant 3).
 *
 * Invariants (checked at create):
 *  1. I_A and I_B have equal bytes, so tensor k of I_A and of I_B sit at the
 *     same relative offset;
 *  2. every bound pointer lies inside the arena with slot_bytes readable;
 *  3. every node's workspace need is at most the rank's workspace bytes.
 *
 * Lifetime: the graph, the registry and the arena are borrowed and must
 * outlive the executor. */
#ifndef BLUEPRINT_EXEC_H
#define BLUEPRINT_EXEC_H

#include <stdint.h>

#include "blueprint/comm.h"
#include "blueprint/graph.h"
#include "blueprint/registry.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bp_exec bp_exec; /* opaque */

typedef struct bp_exec_options {
  const char *device;         /* device kind: "cpu" */
  const char *pins;           /* "op_glob=impl,..."; NULL: BP_KERNELS (registry.h) */
  int autotune;               /* time the kernels that support a node (runs them on the arena) */
  const char *autotune_cache; /* NULL: none */
  int rank, world;            /* this rank of `world` (kernel args) */
  const bp_abi_comm *comm;    /* (optional) this rank's communicator (comm.h), handed to
                                 every kernel; must outlive the executor */
} bp_exec_options;

/* Binds every variant of `graph` to the arena at `arena_base` (the plan's
 * total bytes, on the device). A node that no kernel supports is
 * BP_ERR_UNSUPPORTED with one line naming the variant, the node, its op,
 * its tensors' shapes and every candidate's reason. With autotune, the
 * arena's contents are overwritten: bind before filling it. */
bp_status bp_exec_create(const bp_graph *graph, bp_registry *registry, void *arena_base,
                         const bp_exec_options *options, bp_exec **exec_out);
void bp_exec_destroy(bp_exec *exec); /* NULL is a no-op */

/* Runs segment `segment` of `variant` with input buffer `buffer` (0: I_A,
 * 1: I_B). A kernel's failure stops the segment: BP_ERR_UNSUPPORTED /
 * BP_ERR_INVALID with the node named. */
bp_status bp_exec_run(bp_exec *exec, int variant, bp_segment segment, int buffer);

/* The kernel bound to node `index` of a segment; NULL when out of range. */
const bp_registered_kernel *bp_exec_kernel(const bp_exec *exec, int variant, bp_segment segment,
                                           int index);
/* Bytes of the rank's workspace. */
uint64_t bp_exec_workspace_bytes(const bp_exec *exec);

#ifdef __cplusplus
}
#endif
#endif
