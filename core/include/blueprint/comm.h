/* Communicators: how ranks reach each other (docs/architecture.md, "Ranks
 * and sharding").
 *
 * Kernels see a communicator through the ABI (bp_abi.h: bp_abi_comm in
 * bp_abi_kernel_args.comm); the collectives themselves live in op modules
 * (ops/allreduce). The core provides the communicators:
 *
 *  - in-process ("threads"): ranks are threads of one process. A bp_comm of
 *    `world` ranks is a barrier and one published pointer per rank
 *    (bp_abi_comm_threads), shared by those threads; every collective is
 *    called by all of them in the same order. The core uses its barrier to
 *    start and end each job of the rank threads (train_ranks.c).
 *  - across processes ("mpi"): one rank per process under mpirun
 *    (comm_mpi.c, built with BP_WITH_MPI): rank and world come from the MPI
 *    environment; the host initializes MPI once and finalizes it at exit.
 *    When every process runs on one machine the collectives' part of their
 *    arenas is shared memory and kernels see a "threads" communicator over
 *    it (comm_mpi_shared.c).
 *
 * Thread safety: each rank's calls come from one thread at a time. */
#ifndef BLUEPRINT_COMM_H
#define BLUEPRINT_COMM_H

#include <stdint.h>

#include "bp_abi.h"
#include "blueprint/arena.h"
#include "blueprint/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BP_COMM_MAX_WORLD 64

/* ---- in-process ranks --------------------------------------------------- */

typedef struct bp_comm bp_comm; /* opaque */

/* world in [1, BP_COMM_MAX_WORLD]. */
bp_status bp_comm_create(int world, bp_comm **comm_out);
void bp_comm_destroy(bp_comm *comm); /* NULL is a no-op; no rank may be inside a call */
int bp_comm_world(const bp_comm *comm);

/* Waits until every rank has called it. */
void bp_comm_barrier(bp_comm *comm);

/* Rank `rank`'s view of the communicator for kernels: backend "threads",
 * handle = the shared bp_abi_comm_threads. Valid while comm lives. */
bp_abi_comm bp_comm_abi(bp_comm *comm, int rank);

/* ---- one rank per process (MPI) ------------------------------------------ */

/* Ranks in the launcher's environment (Open MPI's OMPI_COMM_WORLD_SIZE, or
 * PMI_SIZE / PMIX_SIZE of other launchers); 1 when not launched by one.
 * Reads only the environment. */
int bp_mpi_launched_world(void);

/* Initializes MPI once per process (later calls return the same) and fills
 * this process's communicator: backend "mpi", rank and world of
 * MPI_COMM_WORLD, handle = an MPI_Comm *. MPI is finalized at exit.
 * BP_ERR_UNSUPPORTED in a build without MPI. */
bp_status bp_mpi_comm(bp_abi_comm *comm_out);

/* Sums `count` doubles over the processes (every process gets the sum);
 * a no-op unless bp_mpi_comm succeeded with world > 1. */
bp_status bp_mpi_sum_f64(double *values, int count);

/* Ends every process of the run with `code` after one has failed, so the
 * others do not wait forever in a collective; a no-op unless bp_mpi_comm
 * succeeded with world > 1 (then it does not return). */
void bp_mpi_abort(int code);

/* Arenas of processes that share a machine. Under mpirun with every rank
 * on this node, the host allocates each rank's arena so that its first
 * `*shared_bytes` bytes (the regions the collectives touch, first in the
 * plan) lie in one shared memory file that every process maps: since every
 * arena follows the same plan, a peer's span lies at the same offset in
 * the peer's arena. Kernels then see a "threads" communicator
 * (bp_abi_comm_threads: the barrier is MPI_Barrier, publish/peer translate
 * arena offsets), so the collectives read peers' spans in place as between
 * threads, with the same float operations, and the "mpi" kernels' message
 * copies are left out. The rest of the arena is private memory.
 *
 * The allocator's alloc is a collective (every rank, the same sizes) and
 * gives NULL on every rank alike when the ranks span machines,
 * BP_MPI_SHARED=0 is set, or the file cannot be had (/dev/shm full): the
 * caller then keeps its own memory and the "mpi" communicator. Its free is
 * local. Without MPI, alloc always gives NULL. `shared_bytes` is borrowed. */
bp_arena_allocator bp_mpi_shared_allocator(const size_t *shared_bytes);

/* The "threads" view of this rank for kernels, over the shared arena at
 * `base` (an arena bp_mpi_shared_allocator gave): rank and world of
 * MPI_COMM_WORLD. Publish takes pointers into the arena's shared bytes
 * only (the collectives publish the spans they reduce). BP_ERR_INVALID
 * when `base` is not such an arena. */
bp_status bp_mpi_shared_comm(const void *base, bp_abi_comm *comm_out);

/* Processes of this run on this machine (OMPI_COMM_WORLD_LOCAL_SIZE, else
 * the launched world); 1 when not launched by mpirun. For sizing thread
 * pools. Reads only the environment. */
int bp_mpi_launched_local(void);

#ifdef __cplusplus
}
#endif
#endif
