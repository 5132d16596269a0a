/* The collectives (allreduce.sum, .reduce_scatter, .all_gather) for ranks
 * on GPUs (impl "nccl", backend "nccl": the handle is an ncclComm_t, one
 * rank per GPU), enqueued on the rank's stream (args->stream), so they are
 * captured in the step's CUDA graph (NCCL >= 2.9). Built as
 * bp_ops_allreduce_nccl.so where CUDA and NCCL are found.
 *
 * The phases of allreduce-impl.h, with NCCL doing the float sums:
 *  - reduce: NCCL sums chunk k (bp_abi_chunk_start) into rank k's span:
 *    one in-place ncclReduceScatter when the chunks are equal (count a
 *    multiple of world), else one ncclReduce per chunk with root k in one
 *    group; then rank k multiplies its chunk by scale (nccl_scale.cu), so
 *    the result is "sum, then scale" as in the contract;
 *  - gather: every chunk is copied from its owner: an in-place
 *    ncclAllGather, or one ncclBroadcast per chunk from root k in a group.
 * allreduce.sum is both phases (not ncclAllReduce), so reduce_scatter gives
 * a rank's chunk exactly the bits allreduce.sum gives it, and a sharded
 * update equals the replicated one bit for bit.
 *
 * Bits. NCCL's summation order (ring or tree, chunked by NCCL) is not the
 * rank order of "threads" and "mpi": the sums differ from theirs by
 * rounding (a few ulps per element for small worlds). Every rank still
 * ends with the same bits, because each chunk is summed once, by one NCCL
 * reduce, and then copied from its owner by the gather. Same inputs give
 * the same bits (flag DETERMINISTIC) as long as NCCL picks the same
 * algorithm and protocol: the same NCCL version, world size, span size,
 * GPUs and links, and NCCL_* environment; NCCL_ALGO/NCCL_PROTO pin them. */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "allreduce-impl.h"
#include "module_register.h"
#include "nccl-impl.h"
#include "shared/cuda_probe.h"
#ifdef BP_OPS_ALLREDUCE_NCCL_BUILD_ID_HEADER
#include "build_id.h" /* generated: a hash of the sources and compiler settings */
#endif

#ifndef BP_OPS_ALLREDUCE_NCCL_VERSION
#define BP_OPS_ALLREDUCE_NCCL_VERSION "0.0.0"
#endif
#ifndef BP_OPS_ALLREDUCE_NCCL_BUILD_ID
#define BP_OPS_ALLREDUCE_NCCL_BUILD_ID "unknown"
#endif

#define NCCL_MAX_WORLD (1 << 20)
#define NCCL_MIN_VERSION 20900 /* 2.9: NCCL calls may be captured in a CUDA graph */

static int nccl_check(const bp_abi_kernel_args *a, ar_op op, uint64_t *count, float *scale,
                      char *reason, size_t size) {
  const bp_abi_comm *c = a && BP_SDK_HAS_FIELD(a, bp_abi_kernel_args, comm) ? a->comm : NULL;
  if (c && c->struct_size >= sizeof *c && c->backend && strcmp(c->backend, "nccl") != 0)
    return bp_sdk_fail(reason, size,
                       "the run's communicator is '%s', not 'nccl': NCCL needs one GPU per "
                       "rank and a communicator the host made with NCCL",
                       c->backend);
  if (!ar_check(a, op, "nccl", NCCL_MAX_WORLD, count, scale, reason, size)) return 0;
  int n = 0, r = -1;
  if (ncclCommCount((ncclComm_t)c->handle, &n) != ncclSuccess ||
      ncclCommUserRank((ncclComm_t)c->handle, &r) != ncclSuccess || n != c->world ||
      r != c->rank)
    return bp_sdk_fail(reason, size,
                       "the NCCL communicator is rank %d of %d, the host says rank %d of %d", r,
                       n, c->rank, c->world);
  return 1;
}

static int nccl_fail(const bp_abi_kernel_args *a, ncclComm_t comm, const char *what,
                     ncclResult_t res) {
  const char *last = ncclGetLastError(comm);
  bp_sdk_set_reason(a, "%s: %s%s%s", what, ncclGetErrorString(res), last && *last ? ": " : "",
                    last ? last : "");
  return BP_ABI_ERR_DEVICE;
}

static int cuda_fail(const bp_abi_kernel_args *a, const char *what, cudaError_t err) {
  (void)cudaGetLastError();
  bp_sdk_set_reason(a, "%s: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
  return err == cudaErrorMemoryAllocation ? BP_ABI_ERR_NOMEM : BP_ABI_ERR_DEVICE;
}

/* One NCCL call per chunk k (root k), fused in a group so they progress
 * together; the group is closed even when a call fails. */
static ncclResult_t per_chunk(ar_op phase, float *data, uint64_t count, int world,
                              ncclComm_t comm, cudaStream_t stream) {
  ncclResult_t res = ncclGroupStart();
  if (res != ncclSuccess) return res;
  for (int k = 0; k < world && res == ncclSuccess; k++) {
    const uint64_t lo = ar_chunk_start(count, world, k), hi = ar_chunk_start(count, world, k + 1);
    if (hi == lo) continue; /* the same on every rank: every rank skips it */
    res = phase == AR_REDUCE_SCATTER
              ? ncclReduce(data + lo, data + lo, (size_t)(hi - lo), ncclFloat32, ncclSum, k, comm,
                           stream)
              : ncclBroadcast(data + lo, data + lo, (size_t)(hi - lo), ncclFloat32, k, comm,
                              stream);
  }
  const ncclResult_t end = ncclGroupEnd();
  return res != ncclSuccess ? res : end;
}

static int nccl_run(const bp_abi_kernel_args *a, ar_op op) {
  uint64_t count;
  float scale;
  if (!nccl_check(a, op, &count, &scale, bp_sdk_args_reason(a), bp_sdk_args_reason_size(a)))
    return BP_ABI_ERR_INVALID;
  const int world = a->comm->world, rank = a->comm->rank;
  const ncclComm_t comm = (ncclComm_t)a->comm->handle;
  const cudaStream_t stream = (cudaStream_t)a->stream;
  float *data = a->output_ptrs[0];
  /* the scale kernel launches on the current device: the communicator's */
  int want = -1, current = -1;
  ncclResult_t res = ncclCommCuDevice(comm, &want);
  if (res != ncclSuccess) return nccl_fail(a, comm, "ncclCommCuDevice", res);
  cudaError_t err = cudaGetDevice(&current);
  if (err == cudaSuccess && current != want) err = cudaSetDevice(want);
  if (err != cudaSuccess) return cuda_fail(a, "cudaSetDevice to the communicator's GPU", err);
  if (count == 0) return BP_ABI_OK; /* the same on every rank */
  if (a->input_ptrs[0] != data &&
      (err = cudaMemcpyAsync(data, a->input_ptrs[0], (size_t)count * sizeof(float),
                             cudaMemcpyDeviceToDevice, stream)) != cudaSuccess)
    return cuda_fail(a, "cudaMemcpyAsync of the input span", err);
  const int equal = count % (uint64_t)world == 0;
  const size_t each = (size_t)(count / (uint64_t)world);
  const uint64_t lo = ar_chunk_start(count, world, rank), hi = ar_chunk_start(count, world, rank + 1);
  if (AR_REDUCES(op)) { /* in place: rank k's chunk is where ncclReduceScatter puts its part */
    res = equal ? ncclReduceScatter(data, data + lo, each, ncclFloat32, ncclSum, comm, stream)
                : per_chunk(AR_REDUCE_SCATTER, data, count, world, comm, stream);
    if (res != ncclSuccess)
      return nccl_fail(a, comm, equal ? "ncclReduceScatter" : "ncclReduce per chunk", res);
    if (scale != 1.0f && (err = (cudaError_t)ar_nccl_scale(data + lo, hi - lo, scale,
                                                           (void *)stream)) != cudaSuccess)
      return cuda_fail(a, "the scale kernel", err);
  }
  if (AR_GATHERS(op)) { /* in place: this rank's chunk is where ncclAllGather reads it */
    res = equal ? ncclAllGather(data + lo, data, each, ncclFloat32, comm, stream)
                : per_chunk(AR_ALL_GATHER, data, count, world, comm, stream);
    if (res != ncclSuccess)
      return nccl_fail(a, comm, equal ? "ncclAllGather" : "ncclBroadcast per chunk", res);
  }
  if (!stream && (err = cudaStreamSynchronize(NULL)) != cudaSuccess) /* no stream: synchronous */
    return cuda_fail(a, "cudaStreamSynchronize", err);
  return BP_ABI_OK;
}

static int nccl_supports(void *user, const bp_abi_kernel_args *a, char *reason, size_t size) {
  uint64_t count;
  float scale;
  return nccl_check(a, ar_op_of(user), &count, &scale, reason, size);
}
static int nccl_run_op(void *user, const bp_abi_kernel_args *a) {
  return nccl_run(a, ar_op_of(user));
}

#define NCCL_KERNEL(op_name, phase)                                                             \
  {                                                                                             \
    .struct_size = sizeof(bp_abi_kernel), .op = op_name, .impl = "nccl", .device = "cuda",      \
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), .priority = BP_ABI_PRIORITY_VENDOR,          \
    .flags = AR_FLAGS | BP_ABI_KERNEL_GRAPH_CAPTURABLE, .supports = nccl_supports,              \
    .run = nccl_run_op, .user = AR_USER(phase)                                                  \
  }
static const bp_abi_kernel nccl_descriptors[] = {
    NCCL_KERNEL("allreduce.sum", AR_SUM),
    NCCL_KERNEL("allreduce.reduce_scatter", AR_REDUCE_SCATTER),
    NCCL_KERNEL("allreduce.all_gather", AR_ALL_GATHER),
};
static const bp_abi_kernel *const nccl_kernels[] = {
    &nccl_descriptors[0], &nccl_descriptors[1], &nccl_descriptors[2]};

/* Refuses the module, with the reason `blueprint plugins` shows, without a
 * GPU or with an NCCL too old to be captured. (Without libnccl.so.2 at all
 * the loader refuses it first, with the dynamic linker's message.) */
static int nccl_init(const bp_abi_host *host) {
  int rc = ops_cuda_probe(host, "ops-allreduce-nccl");
  if (rc != BP_ABI_OK) return rc;
  int version = 0;
  const ncclResult_t res = ncclGetVersion(&version);
  if (res != ncclSuccess || version < NCCL_MIN_VERSION) {
    char message[256];
    snprintf(message, sizeof message,
             "ops-allreduce-nccl: NCCL %d is older than 2.9 (graph capture) or unusable: %s",
             version, ncclGetErrorString(res));
    if (host->error) host->error(host->ctx, message);
    return BP_ABI_ERR_UNSUPPORTED;
  }
  return ops_register_kernels(host, "ops-allreduce-nccl", nccl_kernels,
                              sizeof nccl_kernels / sizeof nccl_kernels[0]);
}

static const bp_abi_module nccl_module = {
    .struct_size = sizeof(bp_abi_module),
    .abi_major = BP_ABI_MAJOR,
    .abi_minor_built = BP_ABI_MINOR,
    .abi_minor_required = 1, /* the communicator */
    .name = "ops-allreduce-nccl",
    .version = BP_OPS_ALLREDUCE_NCCL_VERSION,
    .build_id = BP_OPS_ALLREDUCE_NCCL_BUILD_ID,
    .init = nccl_init,
    .fini = NULL,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &nccl_module; }
