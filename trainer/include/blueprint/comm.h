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
  BP_COMM_KIND_THREADS, /* ranks as threads, or mpirun processes sharing arenas */
  BP_COMM_KIND_MPI,     /* one rank per process, MPI messages */
  BP_COMM_KIND_NCCL,    /* one rank per GPU (comm_nccl.c) */
} bp_comm_kind;

typedef struct bp_comm_layout {
  const char *device;   /* the run's device, for messages */
  int cuda;             /* the ranks' kernels run on CUDA GPUs (kernel kind "cuda") */
  int device_count;     /* GPUs of this machine */
  int local, world;     /* ranks in this process, in the run */
  int local_processes;  /* processes of the run on this machine (1 without mpirun) */
  int devices[BP_COMM_MAX_WORLD]; /* [local]: each local rank's device index */
} bp_comm_layout;

/* The communicator kind of a layout. Ranks on CUDA GPUs (world > 1) use
 * NCCL, which needs one GPU per rank: in one process the local ranks'
 * devices all differ, or under mpirun at most device_count processes share
 * a machine. Ranks of one process that all share one GPU use the "threads"
 * communicator, served there by the device-memory collectives
 * (ops/allreduce/device_threads.c). Any other layout (some ranks sharing a
 * GPU, others not; processes sharing a GPU) is BP_ERR_UNSUPPORTED with the
 * reason. Pure: tested with made-up layouts. */
bp_status bp_comm_choose(const bp_comm_layout *layout, bp_comm_kind *kind_out);

/* ---- ranks on GPUs (NCCL) ----------------------------------------------- */

/* One NCCL communicator per local rank. NCCL is loaded at run time
 * (libnccl.so.2, dlopen), so the core neither links nor needs it where no
 * GPU run happens; without it, opening fails with the reason. */
typedef struct bp_nccl bp_nccl; /* opaque */

/* One process, `count` ranks on the distinct GPUs devices[0..count):
 * ncclCommInitAll. Local rank k is rank k of the communicator. */
bp_status bp_nccl_open_all(int count, const int *devices, bp_nccl **out);

/* Under mpirun (bp_mpi_comm succeeded), one rank per process: rank 0
 * makes the unique id, bp_mpi_bcast hands it to every process, each joins
 * with ncclCommInitRank as its MPI rank. The calling thread's current CUDA
 * device must be this rank's GPU (the cuda device plugin's stream_native
 * leaves the stream's device current). Collective over the processes. */
bp_status bp_nccl_open_mpi(bp_nccl **out);

/* Local rank k's view for kernels: backend "nccl", handle = its ncclComm_t. */
bp_abi_comm bp_nccl_abi(const bp_nccl *nccl, int k, int rank, int world);

/* Destroys every communicator (no kernel may still use them: the streams
 * are drained and the graphs that captured them destroyed). NULL is a no-op. */
void bp_nccl_close(bp_nccl *nccl);

#ifdef __cplusplus
}
#endif
#endif
