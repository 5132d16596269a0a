/* The collectives (allreduce.sum, .reduce_scatter, .all_gather) for one
 * rank per process under mpirun (impl "mpi", backend "mpi": the handle is
 * an MPI_Comm * of the host's MPI). Reduce-scatter as an MPI_Alltoallv
 * that hands rank k chunk k of every rank and a sum in rank order into
 * this rank's chunk; all-gather as an in-place MPI_Allgatherv: the same
 * float operations in the same order as "threads" (allreduce-impl.h), so
 * `mpirun -np N` and N threads give the same bits. The received chunks and
 * the count tables live in the rank's workspace: nothing is allocated per
 * call. Built as bp_ops_allreduce_mpi.so (BP_WITH_MPI). */
#include <limits.h>
#include <mpi.h>

#include "allreduce-impl.h"
#include "module_register.h"
#ifdef BP_OPS_ALLREDUCE_MPI_BUILD_ID_HEADER
#include "build_id.h" /* generated: a hash of the sources and compiler settings */
#endif

#ifndef BP_OPS_ALLREDUCE_MPI_VERSION
#define BP_OPS_ALLREDUCE_MPI_VERSION "0.0.0"
#endif
#ifndef BP_OPS_ALLREDUCE_MPI_BUILD_ID
#define BP_OPS_ALLREDUCE_MPI_BUILD_ID "unknown"
#endif

#define MPI_MAX_WORLD (1 << 20)

/* Workspace: world pointers to the received chunks, world chunks of at most
 * ceil(count / world) floats, then four int tables of world entries. */
static uint64_t mpi_workspace(uint64_t count, int world) {
  const uint64_t chunk = (count + (uint64_t)world - 1) / (uint64_t)world;
  return (uint64_t)world * sizeof(float *) + chunk * (uint64_t)world * sizeof(float) +
         4u * (uint64_t)world * sizeof(int);
}

static int mpi_check(const bp_abi_kernel_args *a, ar_op op, uint64_t *count, float *scale,
                     char *reason, size_t size) {
  if (!ar_check(a, op, "mpi", MPI_MAX_WORLD, count, scale, reason, size)) return 0;
  if (*count > (uint64_t)INT_MAX)
    return bp_sdk_fail(reason, size, "a span of %llu elements (MPI counts are int)",
                       (unsigned long long)*count);
  return 1;
}

static uint64_t mpi_workspace_size(const bp_abi_kernel_args *a, ar_op op) {
  uint64_t count;
  float scale;
  return mpi_check(a, op, &count, &scale, NULL, 0) ? mpi_workspace(count, a->comm->world) : 0;
}

static int mpi_run(const bp_abi_kernel_args *a, ar_op op) {
  uint64_t count;
  float scale;
  if (!mpi_check(a, op, &count, &scale, bp_sdk_args_reason(a), bp_sdk_args_reason_size(a)))
    return BP_ABI_ERR_INVALID;
  const int world = a->comm->world, rank = a->comm->rank;
  if (!a->workspace || a->workspace_bytes < mpi_workspace(count, world)) {
    bp_sdk_set_reason(a, "needs a workspace of %llu bytes",
                      (unsigned long long)mpi_workspace(count, world));
    return BP_ABI_ERR_INVALID;
  }
  ar_copy_in(a, count);
  float *data = a->output_ptrs[0];
  if (world == 1) {
    if (AR_REDUCES(op)) ar_reduce_chunk(data, (const float *const[]){data}, 1, count, scale);
    return BP_ABI_OK;
  }
  const MPI_Comm comm = *(const MPI_Comm *)a->comm->handle;
  const uint64_t chunk_max = (count + (uint64_t)world - 1) / (uint64_t)world;
  const float **received = a->workspace; /* pointers first: the most aligned */
  float *recv = (float *)(void *)(received + world);
  int *send_counts = (int *)(void *)(recv + chunk_max * (uint64_t)world);
  int *send_displs = send_counts + world, *recv_counts = send_displs + world,
      *recv_displs = recv_counts + world;
  const uint64_t lo = ar_chunk_start(count, world, rank), hi = ar_chunk_start(count, world, rank + 1);
  const int mine = (int)(hi - lo);
  for (int r = 0; r < world; r++) {
    send_displs[r] = (int)ar_chunk_start(count, world, r);
    send_counts[r] = (int)ar_chunk_start(count, world, r + 1) - send_displs[r];
    recv_counts[r] = mine;
    recv_displs[r] = r * mine;
  }
  if (AR_REDUCES(op)) { /* recv holds chunk `rank` of ranks 0..world-1, in rank order */
    if (MPI_Alltoallv(data, send_counts, send_displs, MPI_FLOAT, recv, recv_counts, recv_displs,
                      MPI_FLOAT, comm) != MPI_SUCCESS)
      return BP_ABI_ERR_DEVICE;
    for (int r = 0; r < world; r++) received[r] = recv + (size_t)r * (size_t)mine;
    ar_reduce_chunk(data + lo, received, world, (uint64_t)mine, scale);
  }
  if (AR_GATHERS(op) && /* every rank's chunk into every rank's span */
      MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, send_counts, send_displs,
                     MPI_FLOAT, comm) != MPI_SUCCESS)
    return BP_ABI_ERR_DEVICE;
  return BP_ABI_OK;
}

static int mpi_supports(void *user, const bp_abi_kernel_args *a, char *reason, size_t size) {
  uint64_t count;
  float scale;
  return mpi_check(a, ar_op_of(user), &count, &scale, reason, size);
}
static uint64_t mpi_workspace_of(void *user, const bp_abi_kernel_args *a) {
  return mpi_workspace_size(a, ar_op_of(user));
}
static int mpi_run_op(void *user, const bp_abi_kernel_args *a) {
  return mpi_run(a, ar_op_of(user));
}

#define MPI_KERNEL(op_name, phase)                                                              \
  {                                                                                             \
    .struct_size = sizeof(bp_abi_kernel), .op = op_name, .impl = "mpi", .device = "cpu",        \
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), .priority = 0, .flags = AR_FLAGS,            \
    .supports = mpi_supports, .workspace_size = mpi_workspace_of, .run = mpi_run_op,            \
    .user = AR_USER(phase)                                                                      \
  }
static const bp_abi_kernel mpi_descriptors[] = {
    MPI_KERNEL("allreduce.sum", AR_SUM),
    MPI_KERNEL("allreduce.reduce_scatter", AR_REDUCE_SCATTER),
    MPI_KERNEL("allreduce.all_gather", AR_ALL_GATHER),
};
static const bp_abi_kernel *const mpi_kernels[] = {
    &mpi_descriptors[0], &mpi_descriptors[1], &mpi_descriptors[2]};

static int mpi_init(const bp_abi_host *host) {
  return ops_register_kernels(host, "ops-allreduce-mpi", mpi_kernels,
                              sizeof mpi_kernels / sizeof mpi_kernels[0]);
}

static const bp_abi_module mpi_module = {
    .struct_size = sizeof(bp_abi_module),
    .abi_major = BP_ABI_MAJOR,
    .abi_minor_built = BP_ABI_MINOR,
    .abi_minor_required = 1,
    .name = "ops-allreduce-mpi",
    .version = BP_OPS_ALLREDUCE_MPI_VERSION,
    .build_id = BP_OPS_ALLREDUCE_MPI_BUILD_ID,
    .init = mpi_init,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &mpi_module; }
