/* The collectives (allreduce.sum, .reduce_scatter, .all_gather) for ranks
 * that share one GPU (impl "cuda_threads", device "cuda", backend
 * "threads": threads of one process whose arenas lie on the same GPU, the
 * layout NCCL refuses). The protocol of threads.c, with each host barrier
 * also ordering the ranks' streams: before it a rank records an event on its
 * stream, after it the rank's stream waits on every peer's event, so a
 * peer's span is read only once the work before the peer's barrier is done
 * on the GPU:
 *   span ready   -> reduce: rank k sums chunk k from every rank's span, in
 *                   rank order (device_threads.cu: the CPU's bits)
 *   chunk final  -> gather: rank k copies chunk j from rank j's span
 *   copies done  -> nobody reads rank k's span any more.
 * The events live in the node's state (prepare), three per (node, rank):
 * an event is recorded again only after every peer has passed the barrier
 * that follows its wait on the previous record. Every rank runs every
 * barrier even after a failure, so none is left waiting; the first error is
 * returned at the end.
 * Not capturable: a rank's graph cannot wait on another rank's capture, so
 * steps with these kernels run eagerly (docs/training.md, "Ranks on GPUs").
 * Built into bp_ops_allreduce_cuda.so. */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "allreduce-impl.h"
#include "device_threads-impl.h"
#include "module_register.h"
#include "shared/cuda_probe.h"
#ifdef BP_OPS_ALLREDUCE_CUDA_BUILD_ID_HEADER
#include "build_id.h" /* generated: a hash of the sources and compiler settings */
#endif

#ifndef BP_OPS_ALLREDUCE_CUDA_VERSION
#define BP_OPS_ALLREDUCE_CUDA_VERSION "0.0.0"
#endif
#ifndef BP_OPS_ALLREDUCE_CUDA_BUILD_ID
#define BP_OPS_ALLREDUCE_CUDA_BUILD_ID "unknown"
#endif

enum { DT_READY, DT_REDUCED, DT_GATHERED, DT_EVENTS };

/* What a rank publishes: its span in this call, its GPU and its events. */
typedef struct dt_state {
  float *span;
  int device;
  cudaEvent_t done[DT_EVENTS];
} dt_state;

static int dt_check(const bp_abi_kernel_args *a, ar_op op, uint64_t *count, float *scale,
                    char *reason, size_t size) {
  if (!ar_check(a, op, "threads", AR_DT_MAX_WORLD, count, scale, reason, size)) return 0;
  const bp_abi_comm_threads *t = a->comm->handle;
  if (t->struct_size < sizeof *t || !t->barrier || !t->publish || !t->peer)
    return bp_sdk_fail(reason, size, "the threads communicator lacks barrier/publish/peer");
  return 1;
}

static void dt_release(void *user, void *state) {
  (void)user;
  dt_state *s = state;
  for (int i = 0; i < DT_EVENTS; i++)
    if (s->done[i]) (void)cudaEventDestroy(s->done[i]);
  free(s);
}

/* The node's events, on the GPU that holds the rank's span. */
static int dt_prepare(void *user, const bp_abi_kernel_args *a, void **state_out) {
  struct cudaPointerAttributes at;
  cudaError_t err = cudaPointerGetAttributes(&at, a->output_ptrs[0]);
  if (err != cudaSuccess || at.type != cudaMemoryTypeDevice) {
    (void)cudaGetLastError();
    bp_sdk_set_reason(a, "the span is not device memory of a GPU (%s)",
                      err != cudaSuccess ? cudaGetErrorString(err) : "another memory type");
    return BP_ABI_ERR_INVALID;
  }
  dt_state *s = calloc(1, sizeof *s);
  if (!s) return BP_ABI_ERR_NOMEM;
  s->device = at.device;
  int prev = -1;
  err = cudaGetDevice(&prev);
  if (err == cudaSuccess && prev != s->device) err = cudaSetDevice(s->device);
  for (int i = 0; i < DT_EVENTS && err == cudaSuccess; i++)
    err = cudaEventCreateWithFlags(&s->done[i], cudaEventDisableTiming);
  if (prev >= 0 && prev != s->device) (void)cudaSetDevice(prev);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    bp_sdk_set_reason(a, "cudaEventCreateWithFlags: %s", cudaGetErrorString(err));
    dt_release(user, s);
    return BP_ABI_ERR_DEVICE;
  }
  *state_out = s;
  return BP_ABI_OK;
}

/* The first failure of a call; later CUDA steps are skipped, barriers not. */
typedef struct dt_call {
  const bp_abi_kernel_args *a;
  int failed;
} dt_call;

static void dt_note(dt_call *c, const char *what, cudaError_t err) {
  if (err == cudaSuccess || c->failed) return;
  (void)cudaGetLastError();
  bp_sdk_set_reason(c->a, "%s: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
  c->failed = err == cudaErrorMemoryAllocation ? BP_ABI_ERR_NOMEM : BP_ABI_ERR_DEVICE;
}

/* Records event `e` on this rank's stream, runs the barrier, then makes the
 * stream wait on every peer's event `e`. */
static void dt_phase_end(dt_call *c, dt_state *me, dt_state *const *peer, int e) {
  const bp_abi_comm_threads *t = c->a->comm->handle;
  const cudaStream_t stream = (cudaStream_t)c->a->stream;
  if (!c->failed) dt_note(c, "cudaEventRecord", cudaEventRecord(me->done[e], stream));
  t->barrier(t->ctx);
  for (int r = 0; r < c->a->comm->world && !c->failed; r++)
    if (peer[r] != me)
      dt_note(c, "cudaStreamWaitEvent on a peer's event",
              cudaStreamWaitEvent(stream, peer[r]->done[e], 0));
}

static int dt_run(const bp_abi_kernel_args *a, ar_op op) {
  uint64_t count;
  float scale;
  if (!dt_check(a, op, &count, &scale, bp_sdk_args_reason(a), bp_sdk_args_reason_size(a)))
    return BP_ABI_ERR_INVALID;
  dt_state *me = BP_SDK_HAS_FIELD(a, bp_abi_kernel_args, state) ? a->state : NULL;
  if (!me) { /* the host always prepares; without a state no rank could wait on this one */
    bp_sdk_set_reason(a, "no state: the host did not call prepare()");
    return BP_ABI_ERR_INVALID;
  }
  const int world = a->comm->world, rank = a->comm->rank;
  const bp_abi_comm_threads *t = a->comm->handle;
  const cudaStream_t stream = (cudaStream_t)a->stream;
  float *data = a->output_ptrs[0];
  dt_call c = {a, 0};
  int prev = -1; /* the kernel launches on the span's GPU */
  cudaError_t err = cudaGetDevice(&prev);
  if (err == cudaSuccess && prev != me->device) err = cudaSetDevice(me->device);
  dt_note(&c, "cudaSetDevice to the span's GPU", err);
  if (!c.failed && a->input_ptrs[0] != data && count)
    dt_note(&c, "cudaMemcpyAsync of the input span",
            cudaMemcpyAsync(data, a->input_ptrs[0], (size_t)count * sizeof(float),
                            cudaMemcpyDeviceToDevice, stream));
  const uint64_t lo = ar_chunk_start(count, world, rank), hi = ar_chunk_start(count, world, rank + 1);
  dt_state *peer[AR_DT_MAX_WORLD] = {0};
  if (world > 1) {
    me->span = data;
    t->publish(t->ctx, rank, me);
    if (!c.failed) dt_note(&c, "cudaEventRecord", cudaEventRecord(me->done[DT_READY], stream));
    t->barrier(t->ctx); /* every span is published, its event recorded */
    for (int r = 0; r < world; r++) peer[r] = t->peer(t->ctx, r);
    for (int r = 0; r < world && !c.failed; r++) {
      if (peer[r]->device != me->device) { /* every rank sees the same devices: all fail here */
        bp_sdk_set_reason(a, "ranks %d and %d hold their spans on GPUs %d and %d: these "
                          "collectives need every rank on one GPU", rank, r, me->device,
                          peer[r]->device);
        c.failed = BP_ABI_ERR_UNSUPPORTED;
      } else if (peer[r] != me) {
        dt_note(&c, "cudaStreamWaitEvent on a peer's event",
                cudaStreamWaitEvent(stream, peer[r]->done[DT_READY], 0));
      }
    }
  } else {
    peer[0] = me;
    me->span = data;
  }
  if (AR_REDUCES(op)) {
    ar_dt_sources src;
    for (int r = 0; r < world; r++) src.src[r] = peer[r]->span + lo;
    if (!c.failed)
      dt_note(&c, "the reduce kernel",
              (cudaError_t)ar_dt_reduce(data + lo, &src, world, hi - lo, scale, (void *)stream));
    if (world > 1) dt_phase_end(&c, me, peer, DT_REDUCED);
  }
  if (AR_GATHERS(op) && world > 1) {
    for (int r = 0; r < world && !c.failed; r++) {
      const uint64_t a0 = ar_chunk_start(count, world, r), z = ar_chunk_start(count, world, r + 1);
      if (r != rank && z > a0)
        dt_note(&c, "cudaMemcpyAsync of a peer's chunk",
                cudaMemcpyAsync(data + a0, peer[r]->span + a0, (size_t)(z - a0) * sizeof(float),
                                cudaMemcpyDeviceToDevice, stream));
    }
    dt_phase_end(&c, me, peer, DT_GATHERED);
  }
  if (!stream && !c.failed) dt_note(&c, "cudaStreamSynchronize", cudaStreamSynchronize(NULL));
  return c.failed ? c.failed : BP_ABI_OK;
}

static int dt_supports(void *user, const bp_abi_kernel_args *a, char *reason, size_t size) {
  uint64_t count;
  float scale;
  return dt_check(a, ar_op_of(user), &count, &scale, reason, size);
}
static int dt_run_op(void *user, const bp_abi_kernel_args *a) { return dt_run(a, ar_op_of(user)); }

#define DT_KERNEL(op_name, phase)                                                               \
  {                                                                                             \
    .struct_size = sizeof(bp_abi_kernel), .op = op_name, .impl = "cuda_threads",                \
    .device = "cuda", .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32),                            \
    .priority = BP_ABI_PRIORITY_PORTABLE, .flags = AR_FLAGS, .supports = dt_supports,           \
    .run = dt_run_op, .user = AR_USER(phase), .prepare = dt_prepare, .release = dt_release      \
  }
static const bp_abi_kernel dt_descriptors[] = {
    DT_KERNEL("allreduce.sum", AR_SUM),
    DT_KERNEL("allreduce.reduce_scatter", AR_REDUCE_SCATTER),
    DT_KERNEL("allreduce.all_gather", AR_ALL_GATHER),
};
static const bp_abi_kernel *const dt_kernels[] = {&dt_descriptors[0], &dt_descriptors[1],
                                                   &dt_descriptors[2]};

static int dt_init(const bp_abi_host *host) {
  const int rc = ops_cuda_probe(host, "ops-allreduce-cuda");
  if (rc != BP_ABI_OK) return rc;
  return ops_register_kernels(host, "ops-allreduce-cuda", dt_kernels,
                              sizeof dt_kernels / sizeof dt_kernels[0]);
}

static const bp_abi_module dt_module = {
    .struct_size = sizeof(bp_abi_module),
    .abi_major = BP_ABI_MAJOR,
    .abi_minor_built = BP_ABI_MINOR,
    .abi_minor_required = 4, /* prepare/release and the state */
    .name = "ops-allreduce-cuda",
    .version = BP_OPS_ALLREDUCE_CUDA_VERSION,
    .build_id = BP_OPS_ALLREDUCE_CUDA_BUILD_ID,
    .init = dt_init,
    .fini = NULL,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &dt_module; }
