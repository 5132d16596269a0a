/* One rank per process under mpirun (comm.h). MPI is initialized lazily,
 * once, by the first bp_mpi_comm, and finalized at exit (MPI cannot be
 * initialized again after MPI_Finalize, so the process owns it, not a
 * trainer). Only the thread that trains calls MPI (MPI_THREAD_FUNNELED). */
#include <stdlib.h>
#include <string.h>

#include "blueprint/comm.h"

/* A positive integer from the environment, else 0. */
static int env_count(const char *name) {
  const char *text = getenv(name);
  if (!text || !*text) return 0;
  char *end = NULL;
  const long v = strtol(text, &end, 10);
  return *end == '\0' && v > 0 && v < (1L << 30) ? (int)v : 0;
}

int bp_mpi_launched_world(void) {
  static const char *const names[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const int n = env_count(names[i]);
    if (n > 0) return n;
  }
  return 1;
}

int bp_mpi_launched_local(void) {
  const int n = env_count("OMPI_COMM_WORLD_LOCAL_SIZE");
  return n > 0 ? n : bp_mpi_launched_world();
}

/* A non-negative integer from the environment, else -1. */
static int env_index(const char *name) {
  const char *text = getenv(name);
  if (!text || !*text) return -1;
  char *end = NULL;
  const long v = strtol(text, &end, 10);
  return *end == '\0' && v >= 0 && v < (1L << 30) ? (int)v : -1;
}

int bp_mpi_launched_local_rank(void) {
  static const char *const names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                      "PMIX_LOCAL_RANK"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const int n = env_index(names[i]);
    if (n >= 0) return n;
  }
  return -1;
}

#ifdef BP_HAVE_MPI
#include <mpi.h>

static MPI_Comm world_comm = MPI_COMM_NULL; /* a duplicate of MPI_COMM_WORLD */
static int world_rank, world_size;

static void finalize_at_exit(void) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (world_comm != MPI_COMM_NULL) MPI_Comm_free(&world_comm);
  MPI_Finalize();
}

bp_status bp_mpi_comm(bp_abi_comm *out) {
  if (!out) return bp_fail(BP_ERR_INVALID, "bp_mpi_comm: NULL argument");
  if (world_comm == MPI_COMM_NULL) {
    int initialized = 0, provided = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return bp_fail(BP_ERR_IO, "MPI_Init_thread failed");
      atexit(finalize_at_exit);
    }
    /* errors come back as codes, so a failed collective is reported, not fatal */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (MPI_Comm_dup(MPI_COMM_WORLD, &world_comm) != MPI_SUCCESS)
      return bp_fail(BP_ERR_IO, "MPI_Comm_dup of MPI_COMM_WORLD failed");
    MPI_Comm_rank(world_comm, &world_rank);
    MPI_Comm_size(world_comm, &world_size);
  }
  *out = (bp_abi_comm){sizeof *out, "mpi", world_rank, world_size, &world_comm};
  return BP_OK;
}

bp_status bp_mpi_sum_f64(double *values, int count) {
  if (world_comm == MPI_COMM_NULL || world_size == 1) return BP_OK;
  if (MPI_Allreduce(MPI_IN_PLACE, values, count, MPI_DOUBLE, MPI_SUM, world_comm) != MPI_SUCCESS)
    return bp_fail(BP_ERR_IO, "MPI_Allreduce of %d values failed", count);
  return BP_OK;
}

bp_status bp_mpi_bcast(void *data, int bytes, int root) {
  if (world_comm == MPI_COMM_NULL || world_size == 1) return BP_OK;
  if (MPI_Bcast(data, bytes, MPI_BYTE, root, world_comm) != MPI_SUCCESS)
    return bp_fail(BP_ERR_IO, "MPI_Bcast of %d bytes from rank %d failed", bytes, root);
  return BP_OK;
}

void bp_mpi_abort(int code) {
  if (world_comm != MPI_COMM_NULL && world_size > 1) MPI_Abort(MPI_COMM_WORLD, code);
}

#else /* a build without MPI */

bp_status bp_mpi_comm(bp_abi_comm *out) {
  (void)out;
  return bp_fail(BP_ERR_UNSUPPORTED,
                 "this blueprint was built without MPI (BP_WITH_MPI=OFF; install libopenmpi-dev "
                 "and reconfigure)");
}

bp_status bp_mpi_sum_f64(double *values, int count) {
  (void)values;
  (void)count;
  return BP_OK;
}

bp_status bp_mpi_bcast(void *data, int bytes, int root) {
  (void)data;
  (void)bytes;
  (void)root;
  return BP_OK;
}

void bp_mpi_abort(int code) { (void)code; }

#endif
