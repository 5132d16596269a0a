/* The "cuda" device plugin: the ABI's device runtime mapped onto the CUDA
 * runtime API, plus the graph-capture extension. Plain C calling cudart; it
 * compiles and links where the toolkit is installed, GPU or not, and a
 * machine without a GPU reports 0 devices.
 *
 * Mapping:
 *  - arena_alloc / arena_free: cudaMalloc / cudaFree on the given device
 *    (cudaMalloc aligns to at least 256 bytes); arenas are zero-filled so
 *    they start like the cpu plugin's.
 *  - stream_create: cudaStreamCreateWithFlags(cudaStreamNonBlocking) for
 *    every role; the executor asks for three compute streams, one transfer
 *    and one update stream per rank.
 *  - events: cudaEventCreate (timing enabled, for autotuning),
 *    cudaEventRecord, cudaStreamWaitEvent, cudaEventSynchronize,
 *    cudaEventElapsedTime.
 *  - copies: cudaMemcpyAsync on the stream; host_alloc_pinned: cudaHostAlloc
 *    (portable, so every rank's device sees it as pinned).
 *  - stream_enqueue_host: cudaLaunchHostFunc (fn may not call CUDA).
 *  - stream_native: the cudaStream_t kernels launch on; it also makes the
 *    stream's device current on the calling thread (a rank's thread).
 *  - collective transports (ABI 1.6, comm_nccl.c): "nccl", one rank per
 *    GPU, in one process or one per process under mpirun; "threads", ranks
 *    of one process sharing one GPU.
 *  - BP_ABI_EXT_GRAPH_CAPTURE: cudaStreamBeginCapture (thread-local mode, so
 *    ranks on other threads keep allocating) / cudaStreamEndCapture,
 *    cudaGraphInstantiate, cudaGraphLaunch, cudaGraph(Exec)Destroy.
 *
 * Calls that take a device switch the calling thread to it for the call and
 * switch back, so a rank thread's current device is left as it was (but
 * stream_native, which makes its stream's device current).
 * Every function returns BP_ABI_OK or an error and leaves the CUDA error
 * name and text for last_error() on the calling thread. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "bp_abi.h"
#include "bp_abi_device.h"
#include "comm_cuda.h"

#ifndef BP_PLUGIN_VERSION
#define BP_PLUGIN_VERSION "0.0.0"
#endif

#define CU_MIN_ALIGN 256ull

/* ---- per-thread error text ------------------------------------------------ */

static _Thread_local char cu_error[512];

static int cu_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cu_fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cu_error, sizeof cu_error, fmt, ap);
  va_end(ap);
  return code;
}

/* Records a failed CUDA call and clears the runtime's (non-sticky) error. */
static int cu_fail_cuda(const char *what, cudaError_t err) {
  (void)cudaGetLastError();
  return cu_fail(err == cudaErrorMemoryAllocation ? BP_ABI_ERR_NOMEM : BP_ABI_ERR_DEVICE,
                 "%s: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

static const char *cu_last_error(void) { return cu_error; }

/* Makes `device` current for a call; *prev_out receives the device to go
 * back to with cu_leave. */
static int cu_enter(const char *what, int device, int *prev_out) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return cu_fail_cuda(what, err);
  if (device < 0 || device >= count)
    return cu_fail(BP_ABI_ERR_INVALID, "%s: device %d (this machine has %d)", what, device, count);
  err = cudaGetDevice(prev_out);
  if (err != cudaSuccess) return cu_fail_cuda(what, err);
  if (*prev_out != device) {
    err = cudaSetDevice(device);
    if (err != cudaSuccess) return cu_fail_cuda(what, err);
  }
  return BP_ABI_OK;
}

static void cu_leave(int device, int prev) {
  if (prev != device) (void)cudaSetDevice(prev);
}

/* ---- devices and memory ----------------------------------------------------- */

/* No driver, no GPU, or a broken runtime: 0 devices, not an error; the
 * reason stays in last_error(). */
static int cu_device_count(int *count_out) {
  if (!count_out) return cu_fail(BP_ABI_ERR_INVALID, "device_count: count_out is NULL");
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cu_fail_cuda("cudaGetDeviceCount", err);
    count = 0;
  } else if (count == 0) {
    (void)cu_fail(BP_ABI_OK, "cudaGetDeviceCount: 0 devices");
  }
  *count_out = count < 0 ? 0 : count;
  return BP_ABI_OK;
}

static int cu_is_pow2(uint64_t x) { return x && !(x & (x - 1)); }

static int cu_arena_alloc(int device, uint64_t bytes, uint64_t alignment, void **ptr_out) {
  if (!ptr_out) return cu_fail(BP_ABI_ERR_INVALID, "arena_alloc: ptr_out is NULL");
  if (bytes == 0) return cu_fail(BP_ABI_ERR_INVALID, "arena_alloc: 0 bytes");
  if (alignment < CU_MIN_ALIGN || !cu_is_pow2(alignment))
    return cu_fail(BP_ABI_ERR_INVALID,
                   "arena_alloc: alignment %llu (must be a power of two >= %llu)",
                   (unsigned long long)alignment, CU_MIN_ALIGN);
  if (bytes > SIZE_MAX)
    return cu_fail(BP_ABI_ERR_NOMEM, "arena_alloc: %llu bytes do not fit in size_t",
                   (unsigned long long)bytes);
  int prev = 0;
  int rc = cu_enter("arena_alloc", device, &prev);
  if (rc != BP_ABI_OK) return rc;
  void *p = NULL;
  cudaError_t err = cudaMalloc(&p, (size_t)bytes);
  if (err != cudaSuccess) {
    cu_leave(device, prev);
    return cu_fail_cuda("arena_alloc: cudaMalloc", err);
  }
  if ((uintptr_t)p % alignment != 0) {
    (void)cudaFree(p);
    cu_leave(device, prev);
    return cu_fail(BP_ABI_ERR_UNSUPPORTED,
                   "arena_alloc: cudaMalloc returned %p, not aligned to %llu", p,
                   (unsigned long long)alignment);
  }
  err = cudaMemset(p, 0, (size_t)bytes); /* on the legacy stream: wait for it */
  if (err == cudaSuccess) err = cudaStreamSynchronize(NULL);
  if (err != cudaSuccess) {
    (void)cudaFree(p);
    cu_leave(device, prev);
    return cu_fail_cuda("arena_alloc: cudaMemset", err);
  }
  cu_leave(device, prev);
  *ptr_out = p;
  return BP_ABI_OK;
}

static void cu_arena_free(int device, void *ptr, uint64_t bytes) {
  (void)device;
  (void)bytes;
  if (ptr) (void)cudaFree(ptr);
}

static int cu_host_alloc_pinned(uint64_t bytes, void **ptr_out) {
  if (!ptr_out) return cu_fail(BP_ABI_ERR_INVALID, "host_alloc_pinned: ptr_out is NULL");
  if (bytes == 0) return cu_fail(BP_ABI_ERR_INVALID, "host_alloc_pinned: 0 bytes");
  if (bytes > SIZE_MAX)
    return cu_fail(BP_ABI_ERR_NOMEM, "host_alloc_pinned: %llu bytes do not fit in size_t",
                   (unsigned long long)bytes);
  void *p = NULL;
  cudaError_t err = cudaHostAlloc(&p, (size_t)bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) return cu_fail_cuda("host_alloc_pinned: cudaHostAlloc", err);
  *ptr_out = p;
  return BP_ABI_OK;
}

static void cu_host_free_pinned(void *ptr) {
  if (ptr) (void)cudaFreeHost(ptr);
}

/* ---- streams ------------------------------------------------------------------ */

struct bp_abi_stream {
  cudaStream_t stream;
  int device;
  int role;
};

static int cu_stream_create(int device, int role, bp_abi_stream **stream_out) {
  if (!stream_out) return cu_fail(BP_ABI_ERR_INVALID, "stream_create: stream_out is NULL");
  if (role < BP_ABI_STREAM_COMPUTE || role > BP_ABI_STREAM_UPDATE)
    return cu_fail(BP_ABI_ERR_INVALID, "stream_create: unknown role %d", role);
  bp_abi_stream *s = calloc(1, sizeof *s);
  if (!s) return cu_fail(BP_ABI_ERR_NOMEM, "stream_create: out of memory");
  int prev = 0;
  int rc = cu_enter("stream_create", device, &prev);
  if (rc != BP_ABI_OK) {
    free(s);
    return rc;
  }
  cudaError_t err = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
  cu_leave(device, prev);
  if (err != cudaSuccess) {
    free(s);
    return cu_fail_cuda("stream_create: cudaStreamCreateWithFlags", err);
  }
  s->device = device;
  s->role = role;
  *stream_out = s;
  return BP_ABI_OK;
}

/* Returns at once; CUDA releases the stream when its work is done. */
static void cu_stream_destroy(bp_abi_stream *s) {
  if (!s) return;
  (void)cudaStreamDestroy(s->stream);
  free(s);
}

static int cu_stream_synchronize(bp_abi_stream *s) {
  if (!s) return cu_fail(BP_ABI_ERR_INVALID, "stream_synchronize: stream is NULL");
  cudaError_t err = cudaStreamSynchronize(s->stream);
  if (err != cudaSuccess) return cu_fail_cuda("stream_synchronize", err);
  return BP_ABI_OK;
}

static int cu_stream_enqueue_host(bp_abi_stream *s, void (*fn)(void *arg), void *arg) {
  if (!s) return cu_fail(BP_ABI_ERR_INVALID, "stream_enqueue_host: stream is NULL");
  if (!fn) return cu_fail(BP_ABI_ERR_INVALID, "stream_enqueue_host: fn is NULL");
  cudaError_t err = cudaLaunchHostFunc(s->stream, fn, arg);
  if (err != cudaSuccess) return cu_fail_cuda("stream_enqueue_host: cudaLaunchHostFunc", err);
  return BP_ABI_OK;
}

/* The executor calls it on a rank's thread before it calls that rank's
 * kernels (and before a capture): kernels, cuBLAS and cuDNN launch on the
 * calling thread's current device, so the stream's device is made current
 * here and left so (the one call here that does not switch back). */
static void *cu_stream_native(bp_abi_stream *s) {
  if (!s) return NULL;
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != s->device) {
    (void)cudaGetLastError();
    if (cudaSetDevice(s->device) != cudaSuccess) (void)cudaGetLastError();
  }
  return (void *)s->stream;
}

/* ---- events ------------------------------------------------------------------- */

struct bp_abi_event {
  cudaEvent_t event;
  int device;
};

static int cu_event_create(int device, bp_abi_event **event_out) {
  if (!event_out) return cu_fail(BP_ABI_ERR_INVALID, "event_create: event_out is NULL");
  bp_abi_event *e = calloc(1, sizeof *e);
  if (!e) return cu_fail(BP_ABI_ERR_NOMEM, "event_create: out of memory");
  int prev = 0;
  int rc = cu_enter("event_create", device, &prev);
  if (rc != BP_ABI_OK) {
    free(e);
    return rc;
  }
  cudaError_t err = cudaEventCreate(&e->event);
  cu_leave(device, prev);
  if (err != cudaSuccess) {
    free(e);
    return cu_fail_cuda("event_create: cudaEventCreate", err);
  }
  e->device = device;
  *event_out = e;
  return BP_ABI_OK;
}

static void cu_event_destroy(bp_abi_event *e) {
  if (!e) return;
  (void)cudaEventDestroy(e->event);
  free(e);
}

static int cu_event_record(bp_abi_event *e, bp_abi_stream *s) {
  if (!e || !s) return cu_fail(BP_ABI_ERR_INVALID, "event_record: event and stream must be set");
  if (e->device != s->device)
    return cu_fail(BP_ABI_ERR_INVALID, "event_record: event on device %d, stream on device %d",
                   e->device, s->device);
  cudaError_t err = cudaEventRecord(e->event, s->stream);
  if (err != cudaSuccess) return cu_fail_cuda("event_record: cudaEventRecord", err);
  return BP_ABI_OK;
}

static int cu_stream_wait_event(bp_abi_stream *s, bp_abi_event *e) {
  if (!e || !s)
    return cu_fail(BP_ABI_ERR_INVALID, "stream_wait_event: stream and event must be set");
  cudaError_t err = cudaStreamWaitEvent(s->stream, e->event, 0);
  if (err != cudaSuccess) return cu_fail_cuda("stream_wait_event: cudaStreamWaitEvent", err);
  return BP_ABI_OK;
}

static int cu_event_synchronize(bp_abi_event *e) {
  if (!e) return cu_fail(BP_ABI_ERR_INVALID, "event_synchronize: event is NULL");
  cudaError_t err = cudaEventSynchronize(e->event);
  if (err != cudaSuccess) return cu_fail_cuda("event_synchronize: cudaEventSynchronize", err);
  return BP_ABI_OK;
}

static int cu_event_elapsed_ms(bp_abi_event *start, bp_abi_event *end, float *ms_out) {
  if (!start || !end || !ms_out)
    return cu_fail(BP_ABI_ERR_INVALID, "event_elapsed_ms: start, end and ms_out must be set");
  float ms = 0;
  cudaError_t err = cudaEventElapsedTime(&ms, start->event, end->event);
  if (err != cudaSuccess) return cu_fail_cuda("event_elapsed_ms: cudaEventElapsedTime", err);
  *ms_out = ms;
  return BP_ABI_OK;
}

/* ---- copies ------------------------------------------------------------------- */

static int cu_copy(const char *what, void *dst, const void *src, uint64_t bytes,
                   enum cudaMemcpyKind kind, bp_abi_stream *s) {
  if (!s) return cu_fail(BP_ABI_ERR_INVALID, "%s: stream is NULL", what);
  if (bytes == 0) return BP_ABI_OK;
  if (!dst || !src)
    return cu_fail(BP_ABI_ERR_INVALID, "%s: NULL %s with %llu bytes", what, dst ? "src" : "dst",
                   (unsigned long long)bytes);
  if (bytes > SIZE_MAX)
    return cu_fail(BP_ABI_ERR_INVALID, "%s: %llu bytes do not fit in size_t", what,
                   (unsigned long long)bytes);
  cudaError_t err = cudaMemcpyAsync(dst, src, (size_t)bytes, kind, s->stream);
  if (err != cudaSuccess) return cu_fail_cuda(what, err);
  return BP_ABI_OK;
}

static int cu_copy_h2d(void *dst, const void *src, uint64_t bytes, bp_abi_stream *s) {
  return cu_copy("copy_h2d: cudaMemcpyAsync", dst, src, bytes, cudaMemcpyHostToDevice, s);
}
static int cu_copy_d2h(void *dst, const void *src, uint64_t bytes, bp_abi_stream *s) {
  return cu_copy("copy_d2h: cudaMemcpyAsync", dst, src, bytes, cudaMemcpyDeviceToHost, s);
}
static int cu_copy_d2d(void *dst, const void *src, uint64_t bytes, bp_abi_stream *s) {
  return cu_copy("copy_d2d: cudaMemcpyAsync", dst, src, bytes, cudaMemcpyDeviceToDevice, s);
}

/* ---- graph capture extension ---------------------------------------------- */

static int cu_capture_begin(bp_abi_stream *s) {
  if (!s) return cu_fail(BP_ABI_ERR_INVALID, "capture_begin: stream is NULL");
  cudaError_t err = cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) return cu_fail_cuda("capture_begin: cudaStreamBeginCapture", err);
  return BP_ABI_OK;
}

/* *graph_out (a cudaGraph_t) is handed to the caller: graph_destroy it. */
static int cu_capture_end(bp_abi_stream *s, void **graph_out) {
  if (!s || !graph_out)
    return cu_fail(BP_ABI_ERR_INVALID, "capture_end: stream and graph_out must be set");
  cudaGraph_t graph = NULL;
  cudaError_t err = cudaStreamEndCapture(s->stream, &graph);
  if (err != cudaSuccess) {
    if (graph) (void)cudaGraphDestroy(graph);
    return cu_fail_cuda("capture_end: cudaStreamEndCapture", err);
  }
  *graph_out = graph;
  return BP_ABI_OK;
}

/* *exec_out (a cudaGraphExec_t) is handed to the caller: exec_destroy it.
 * The graph may be destroyed once instantiated. */
static int cu_instantiate(void *graph, void **exec_out) {
  if (!graph || !exec_out)
    return cu_fail(BP_ABI_ERR_INVALID, "instantiate: graph and exec_out must be set");
  cudaGraphExec_t exec = NULL;
  cudaError_t err = cudaGraphInstantiate(&exec, (cudaGraph_t)graph, 0);
  if (err != cudaSuccess) return cu_fail_cuda("instantiate: cudaGraphInstantiate", err);
  *exec_out = exec;
  return BP_ABI_OK;
}

static int cu_launch(void *exec, bp_abi_stream *s) {
  if (!exec || !s) return cu_fail(BP_ABI_ERR_INVALID, "launch: exec and stream must be set");
  cudaError_t err = cudaGraphLaunch((cudaGraphExec_t)exec, s->stream);
  if (err != cudaSuccess) return cu_fail_cuda("launch: cudaGraphLaunch", err);
  return BP_ABI_OK;
}

static void cu_graph_destroy(void *graph) {
  if (graph) (void)cudaGraphDestroy((cudaGraph_t)graph);
}

static void cu_exec_destroy(void *exec) {
  if (exec) (void)cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

static const bp_abi_device_graph_ext cu_graph_ext = {
    .header = {.struct_size = sizeof(bp_abi_device_graph_ext),
               .type = BP_ABI_EXT_GRAPH_CAPTURE,
               .next = NULL},
    .capture_begin = cu_capture_begin,
    .capture_end = cu_capture_end,
    .instantiate = cu_instantiate,
    .launch = cu_launch,
    .graph_destroy = cu_graph_destroy,
    .exec_destroy = cu_exec_destroy,
};

/* ---- registration ------------------------------------------------------------- */

static const bp_abi_device cu_device = {
    .struct_size = sizeof(bp_abi_device),
    .kind = "cuda",
    .device_count = cu_device_count,
    .arena_alloc = cu_arena_alloc,
    .arena_free = cu_arena_free,
    .stream_create = cu_stream_create,
    .stream_destroy = cu_stream_destroy,
    .stream_synchronize = cu_stream_synchronize,
    .stream_enqueue_host = cu_stream_enqueue_host,
    .stream_native = cu_stream_native,
    .event_create = cu_event_create,
    .event_destroy = cu_event_destroy,
    .event_record = cu_event_record,
    .stream_wait_event = cu_stream_wait_event,
    .event_synchronize = cu_event_synchronize,
    .event_elapsed_ms = cu_event_elapsed_ms,
    .copy_h2d = cu_copy_h2d,
    .copy_d2h = cu_copy_d2h,
    .copy_d2d = cu_copy_d2d,
    .host_alloc_pinned = cu_host_alloc_pinned,
    .host_free_pinned = cu_host_free_pinned,
    .last_error = cu_last_error,
    .extensions = &cu_graph_ext.header,
    .transports = cu_transports, /* "nccl", then "threads" (comm_nccl.c) */
    .num_transports = CU_TRANSPORTS,
};

/* Registers the device even where no GPU exists (device_count says 0), so
 * `blueprint plugins` can show it and why it has no devices. */
static int cu_init(const bp_abi_host *host) {
  if (!host || !host->register_device) {
    if (host && host->error) host->error(host->ctx, "device-cuda: the host cannot register devices");
    return BP_ABI_ERR_UNSUPPORTED;
  }
  int rc = host->register_device(host->ctx, &cu_device);
  if (rc != BP_ABI_OK && host->error) host->error(host->ctx, "device-cuda: register_device failed");
  return rc;
}

static const bp_abi_module cu_module = {
    .struct_size = sizeof(bp_abi_module),
    .abi_major = BP_ABI_MAJOR,
    .abi_minor_built = BP_ABI_MINOR,
    .abi_minor_required = 0,
    .name = "device-cuda",
    .version = BP_PLUGIN_VERSION,
    .build_id = "device-cuda " BP_PLUGIN_VERSION " " __DATE__ " " __TIME__,
    .init = cu_init,
    .fini = NULL,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &cu_module; }
