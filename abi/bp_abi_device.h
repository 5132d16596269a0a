/* blueprint device-plugin ABI: a device kind's runtime (arena memory,
 * copies, streams, events; optional graph capture). Same rules as bp_abi.h. */
#ifndef BP_ABI_DEVICE_H
#define BP_ABI_DEVICE_H

#include "bp_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Stream roles the executor asks for (a plugin may map several to one). */
enum {
  BP_ABI_STREAM_COMPUTE = 0, /* three of these per rank */
  BP_ABI_STREAM_TRANSFER = 1,
  BP_ABI_STREAM_UPDATE = 2,
};

/* Opaque handles, owned by the plugin. */
typedef struct bp_abi_stream bp_abi_stream;
typedef struct bp_abi_event bp_abi_event;

/* Semantics follow CUDA streams: work enqueued on one stream runs in order;
 * an event records the point a stream has reached; a stream that waits on
 * an event runs nothing enqueued after the wait until that point is done.
 * Every function returns BP_ABI_OK or an error; last_error explains. */
typedef struct bp_abi_device {
  uint32_t struct_size;
  const char *kind;                    /* "cpu", "cuda" */
  int (*device_count)(int *count_out); /* 0 devices is not an error */

  /* Arena memory on device `device`, aligned to `alignment` (>= 256). */
  int (*arena_alloc)(int device, uint64_t bytes, uint64_t alignment, void **ptr_out);
  void (*arena_free)(int device, void *ptr, uint64_t bytes);

  int (*stream_create)(int device, int role, bp_abi_stream **stream_out);
  void (*stream_destroy)(bp_abi_stream *stream);
  int (*stream_synchronize)(bp_abi_stream *stream);
  /* Runs fn(arg) on the stream, in order (cudaLaunchHostFunc semantics). */
  int (*stream_enqueue_host)(bp_abi_stream *stream, void (*fn)(void *arg), void *arg);
  /* The native handle kernels receive in bp_abi_kernel_args.stream
   * (cudaStream_t on CUDA; the bp_abi_stream itself on CPU). The host
   * calls it on the thread that is about to call the rank's kernels (and
   * before a capture): a plugin whose kernels launch on the calling
   * thread's current device makes the stream's device current there. */
  void *(*stream_native)(bp_abi_stream *stream);

  int (*event_create)(int device, bp_abi_event **event_out);
  void (*event_destroy)(bp_abi_event *event);
  int (*event_record)(bp_abi_event *event, bp_abi_stream *stream);
  int (*stream_wait_event)(bp_abi_stream *stream, bp_abi_event *event);
  int (*event_synchronize)(bp_abi_event *event);
  /* Milliseconds between two completed events (autotuning). */
  int (*event_elapsed_ms)(bp_abi_event *start, bp_abi_event *end, float *ms_out);

  /* Asynchronous copies on `stream` (host memory should be pinned). */
  int (*copy_h2d)(void *dst, const void *src, uint64_t bytes, bp_abi_stream *stream);
  int (*copy_d2h)(void *dst, const void *src, uint64_t bytes, bp_abi_stream *stream);
  int (*copy_d2d)(void *dst, const void *src, uint64_t bytes, bp_abi_stream *stream);

  /* Page-locked host staging memory. */
  int (*host_alloc_pinned)(uint64_t bytes, void **ptr_out);
  void (*host_free_pinned)(void *ptr);

  /* (optional) text of the last failure on this thread. */
  const char *(*last_error)(void);
  /* (optional) extension chain, e.g. BP_ABI_EXT_GRAPH_CAPTURE. */
  const bp_abi_ext_header *extensions;

  /* ABI 1.4: how the host reaches this device's memory and runs its
   * kernels; absent (0, NULL) in an older plugin. */
  uint32_t flags; /* BP_ABI_DEVICE_* below */
  /* The device kind whose kernels run on this device (the registry's
   * kernels of that kind serve this one); NULL: its own kind. */
  const char *kernel_kind;
} bp_abi_device;

/* bp_abi_device.flags (ABI 1.4). With none set the host treats arena
 * memory as unreachable from the host (every access through copy_h2d /
 * copy_d2h on a stream) and calls kernels on the rank's thread with
 * args->stream = stream_native(compute stream): run() enqueues its work
 * on that stream and returns. */
enum {
  /* Arena memory is plain host memory: the host may read and write it
   * directly once the streams are idle, and the kernels run synchronously
   * on the calling thread (args->stream may be ignored). The cpu device. */
  BP_ABI_DEVICE_HOST_ACCESSIBLE = 1u << 0,
  /* The kernels are synchronous host code that may touch arena memory only
   * inside this device's stream tasks: the host runs them in
   * stream_enqueue_host tasks on the compute stream. */
  BP_ABI_DEVICE_HOST_TASK_KERNELS = 1u << 1,
};

/* Graph capture (CUDA graphs): record a stream's work once, replay it.
 * CUDA's rules hold: while a stream captures, its work is recorded, not
 * run; another stream joins by waiting on an event recorded in the
 * capture and must be joined back before capture_end; no synchronization
 * of captured streams or events meanwhile. The executor's use: one step
 * per graph (docs/training.md, "Steps as graphs"). */
typedef struct bp_abi_device_graph_ext {
  bp_abi_ext_header header; /* type BP_ABI_EXT_GRAPH_CAPTURE */
  int (*capture_begin)(bp_abi_stream *stream);
  int (*capture_end)(bp_abi_stream *stream, void **graph_out);
  int (*instantiate)(void *graph, void **exec_out);
  int (*launch)(void *exec, bp_abi_stream *stream);
  void (*graph_destroy)(void *graph);
  void (*exec_destroy)(void *exec);
} bp_abi_device_graph_ext;

#ifdef __cplusplus
}
#endif
#endif
