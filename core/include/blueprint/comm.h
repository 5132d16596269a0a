/* In-process communicators: ranks as threads of one process (DESIGN.md
 * section 7).
 *
 * A communicator of `world` ranks is shared by the threads that run those
 * ranks; every collective must be called by all of them, with the same
 * arguments apart from each rank's own buffer, in the same order.
 *
 * All-reduce (sum, then multiply by a scale): reduce-scatter, then
 * all-gather. The count is cut into `world` chunks, chunk k being elements
 * [count*k/world, count*(k+1)/world); rank k sums chunk k over ranks 0, 1,
 * ..., world-1 in that order (one float accumulator per element, starting
 * from rank 0's value), multiplies by scale and writes the result into its
 * own buffer; then every rank copies the other chunks from their owners.
 * The summation order is fixed, so every rank ends with the same bits on
 * every run, whatever the timing.
 *
 * Thread safety: each rank's calls come from one thread at a time. The
 * executor binds the graph's "allreduce.sum" nodes to this (exec.h:
 * bp_exec_options.comm) as the built-in implementation "threads". */
#ifndef BLUEPRINT_COMM_H
#define BLUEPRINT_COMM_H

#include <stdint.h>

#include "blueprint/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BP_COMM_MAX_WORLD 64

typedef struct bp_comm bp_comm; /* opaque */

/* world in [1, BP_COMM_MAX_WORLD]. */
bp_status bp_comm_create(int world, bp_comm **comm_out);
void bp_comm_destroy(bp_comm *comm); /* NULL is a no-op; no rank may be inside a call */
int bp_comm_world(const bp_comm *comm);

/* Waits until every rank has called it. */
void bp_comm_barrier(bp_comm *comm);

/* data[0..count) of rank `rank` becomes scale * (sum over ranks in rank
 * order); see the top. count may be 0 (still a collective). */
void bp_comm_allreduce_f32(bp_comm *comm, int rank, float *data, uint64_t count, float scale);

#ifdef __cplusplus
}
#endif
#endif
