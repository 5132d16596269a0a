/* Communicators: how ranks reach each other (docs/architecture.md, "Ranks
 * and sharding").
 *
 * Kernels see a communicator through the ABI (bp_abi.h: bp_abi_comm in
 * bp_abi_kernel_args.comm); the collectives themselves live in op modules
 * (ops/allreduce). The trainer provides the communicators, or a device does:
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
 *  - a device's own ("nccl" on the cuda device, ...): a collective transport
 *    the device plugin offers (bp_abi_device.h, ABI 1.6), chosen by its
 *    flags (bp_comm_choose), before the host's own.
 *
 * Thread safety: each rank's calls come from one thread at a time. */
#ifndef BLUEPRINT_COMM_H
#define BLUEPRINT_COMM_H

#include <stdint.h>

#include "bp_abi.h"
#include "bp_abi_device.h"
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
 * gives NULL on every rank alike when the ranks span machines
 * or the file cannot be had (/dev/shm full): the
 * caller then keeps its own memory and the "mpi" communicator. Its free is
 * local. Without MPI, alloc always gives NULL. The arenas are `shared`'s
 * (borrowed; it outlives them). */
typedef struct bp_mpi_shared bp_mpi_shared; /* opaque: one run's shared arenas */
/* An owner whose arenas share their first `*shared_bytes` bytes (borrowed,
 * read at each alloc). */
bp_status bp_mpi_shared_create(const size_t *shared_bytes, bp_mpi_shared **shared_out);
/* After every arena it gave is freed; NULL is a no-op. */
void bp_mpi_shared_destroy(bp_mpi_shared *shared);
bp_arena_allocator bp_mpi_shared_allocator(bp_mpi_shared *shared);

/* The "threads" view of this rank for kernels, over the shared arena at
 * `base` (an arena `shared`'s allocator gave): rank and world of
 * MPI_COMM_WORLD. Publish takes pointers into the arena's shared bytes
 * only (the collectives publish the spans they reduce). BP_ERR_INVALID
 * when `base` is not such an arena. */
bp_status bp_mpi_shared_comm(bp_mpi_shared *shared, const void *base, bp_abi_comm *comm_out);

/* Processes of this run on this machine (OMPI_COMM_WORLD_LOCAL_SIZE, else
 * the launched world); 1 when not launched by mpirun. For sizing thread
 * pools. Reads only the environment. */
int bp_mpi_launched_local(void);

/* This process's index among the run's processes on this machine
 * (OMPI_COMM_WORLD_LOCAL_RANK, else MPI_LOCALRANKID or PMIX_LOCAL_RANK), or
 * -1 when the launcher does not say. Ranks on GPUs use it as their device.
 * Reads only the environment. */
int bp_mpi_launched_local_rank(void);

/* Copies `bytes` bytes from process `root` to every process; a no-op
 * unless bp_mpi_comm succeeded with world > 1. */
bp_status bp_mpi_bcast(void *data, int bytes, int root);

/* ---- which communicator a run gets ------------------------------------- */

/* What the kernels' collectives go through (bp_abi_comm.backend). */
typedef enum bp_comm_kind {
  BP_COMM_KIND_NONE,    /* one rank: no collectives */
  BP_COMM_KIND_THREADS, /* the host's: ranks as threads, or mpirun processes sharing arenas */
  BP_COMM_KIND_MPI,     /* the host's: one rank per process, MPI messages */
  BP_COMM_KIND_DEVICE,  /* a collective transport the device plugin offers (bp_abi_device.h) */
} bp_comm_kind;

#define BP_COMM_MAX_TRANSPORTS BP_ABI_COMM_TRANSPORTS_MAX

typedef struct bp_comm_layout {
  const char *device;   /* the run's device, for messages */
  /* the host code of a collective kernel reaches the device's arena memory
   * (BP_ABI_DEVICE_HOST_ACCESSIBLE or _HOST_TASK_KERNELS): the host's own
   * communicators serve it */
  int host_reach;
  int device_count;     /* devices of this machine */
  int local, world;     /* ranks in this process, in the run */
  int local_processes;  /* processes of the run on this machine (1 without mpirun) */
  int devices[BP_COMM_MAX_WORLD]; /* [local]: each local rank's device index */
  int transports;       /* the device's collective transports, in its order */
  const char *transport_names[BP_COMM_MAX_TRANSPORTS]; /* their backends, for messages */
  uint32_t transport_flags[BP_COMM_MAX_TRANSPORTS];    /* BP_ABI_COMM_* */
} bp_comm_layout;

/* The communicator of a layout (the rules of bp_abi_device.h, "collective
 * transports"): one rank needs none; else the first of the device's
 * transports whose flags serve the layout (*transport_out is its index,
 * else -1): processes need SPANS_PROCESSES and SPANS_DEVICES, ranks of one
 * process on several devices SPANS_DEVICES, two ranks on one device (in
 * this process, or more processes on this machine than devices)
 * SHARES_DEVICE. Without one, a device the host reaches gets the host's
 * threads (one process) or MPI (processes) communicator; any other layout
 * is BP_ERR_UNSUPPORTED with one line naming the layout, what each
 * transport lacks and what to run instead. Pure: tested with made-up
 * layouts. */
bp_status bp_comm_choose(const bp_comm_layout *layout, bp_comm_kind *kind_out,
                         int *transport_out);

#ifdef __cplusplus
}
#endif
#endif
