/* Which communicator a run's kernels see (comm.h: bp_comm_choose). */
#include "blueprint/comm.h"

bp_status bp_comm_choose(const bp_comm_layout *l, bp_comm_kind *out) {
  if (!l || !out) return bp_fail(BP_ERR_INVALID, "bp_comm_choose: NULL argument");
  if (l->local < 1 || l->local > BP_COMM_MAX_WORLD || l->world < l->local)
    return bp_fail(BP_ERR_INVALID, "bp_comm_choose: %d local ranks of %d", l->local, l->world);
  const int processes = l->world > l->local;
  *out = BP_COMM_KIND_NONE;
  if (l->world == 1) return BP_OK;
  if (!l->cuda) {
    *out = processes ? BP_COMM_KIND_MPI : BP_COMM_KIND_THREADS;
    return BP_OK;
  }
  const char *dev = l->device ? l->device : "cuda";
  if (processes && l->local_processes > l->device_count)
    return bp_fail(BP_ERR_UNSUPPORTED,
                   "%d processes of this run share this machine's %d '%s' device(s): NCCL "
                   "needs one GPU per rank, and the device-memory collectives serve ranks of "
                   "one process only: start at most %d processes per machine, or run --ranks "
                   "without mpirun",
                   l->local_processes, l->device_count, dev, l->device_count);
  int one_gpu = !processes; /* every local rank on the first one's GPU */
  for (int k = 1; k < l->local; k++) one_gpu = one_gpu && l->devices[k] == l->devices[0];
  if (one_gpu) { /* the device-memory "threads" collectives */
    *out = BP_COMM_KIND_THREADS;
    return BP_OK;
  }
  for (int k = 0; k < l->local; k++)
    for (int j = 0; j < k; j++)
      if (l->devices[j] == l->devices[k])
        return bp_fail(BP_ERR_UNSUPPORTED,
                       "ranks %d and %d both run on '%s' device %d while other ranks run on "
                       "other GPUs: NCCL needs one GPU per rank, and the device-memory "
                       "collectives need every rank on one GPU: run at most %d ranks (this "
                       "machine's GPUs), or give --devices with distinct GPUs or one GPU for all",
                       j, k, dev, l->devices[k], l->device_count);
  *out = BP_COMM_KIND_NCCL;
  return BP_OK;
}
