/* blueprint device-plugin ABI: a device kind's runtime (arena memory,
 * copies, streams, events; optional graph capture and, since 1.6,
 * collective transports). Same rules as bp_abi.h. */
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

  /* ABI 1.6: the collective transports this device offers (below), in the
   * order the plugin prefers them; absent (NULL, 0) in an older plugin,
   * which offers none. The array is strided by its first element's
   * struct_size (bp_abi_ops.h rule 6). */
  const struct bp_abi_comm_transport *transports; /* [num_transports] */
  int32_t num_transports; /* 0..BP_ABI_COMM_TRANSPORTS_MAX */
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

/* ---- collective transports (ABI 1.6) -------------------------------------
 *
 * How ranks whose arenas live on this device reach each other: a device
 * plugin offers transports (bp_abi_device.transports), each making the
 * bp_abi_comm that collective kernels (allreduce.*) receive, with the
 * backend name those kernels check in supports(). The host knows no
 * transport by name: it picks by the flags below.
 *
 * Rules:
 *  1. A run of more than one rank takes the first transport, in the
 *     device's order, whose flags serve its layout: ranks that are
 *     processes (under mpirun) need SPANS_PROCESSES and SPANS_DEVICES;
 *     ranks of one process on more than one device need SPANS_DEVICES;
 *     two ranks on one device (in one process, or more processes on a
 *     machine than it has devices) need SHARES_DEVICE.
 *  2. When none serves it, the host's own communicators ("threads" for
 *     ranks of one process, "mpi" or shared memory for processes) serve
 *     devices whose arena memory the host code of a collective kernel can
 *     reach (BP_ABI_DEVICE_HOST_ACCESSIBLE or _HOST_TASK_KERNELS); any
 *     other layout is refused before the plan is built, naming each
 *     transport and what it lacks. One rank needs no transport.
 *  3. open() is called once per run and process, on local rank 0's thread
 *     after that rank's streams exist and stream_native() of its compute
 *     stream was called (its device is current there), before any kernel
 *     is bound. It makes the group of this process's `local` ranks (local
 *     rank k is rank first_rank + k of `world`, on device devices[k]).
 *     When the ranks span processes every process calls it together, and
 *     `bootstrap` lets them agree (below); otherwise bootstrap is NULL.
 *     On failure it returns an error with `reason` written and leaves
 *     nothing behind; the host then fails the run with the reason (under
 *     mpirun every process must fail alike: use bootstrap->count so that
 *     none is left waiting).
 *  4. comm() fills local rank k's bp_abi_comm (struct_size, backend, rank
 *     first_rank + k, world, handle); it stays valid until close().
 *  5. close() is called once, after every kernel that used the group is
 *     released and the device's streams are idle (and the step graphs that
 *     captured them destroyed). */
#define BP_ABI_COMM_TRANSPORTS_MAX 8

/* bp_abi_comm_transport.flags: the layouts a transport serves. */
enum {
  BP_ABI_COMM_SPANS_PROCESSES = 1u << 0, /* ranks may be processes (uses the bootstrap) */
  BP_ABI_COMM_SPANS_DEVICES = 1u << 1,   /* ranks may be on different devices */
  BP_ABI_COMM_SHARES_DEVICE = 1u << 2,   /* several ranks may be on one device */
};

/* What the host lends open() when ranks span processes: agreement among
 * the run's processes, through the host's own process communicator (MPI).
 * Every process calls the same functions in the same order. */
typedef struct bp_abi_comm_bootstrap {
  uint32_t struct_size;
  void *ctx;                  /* pass to every function below */
  int32_t process, processes; /* this process's index, the run's processes */
  /* Copies `bytes` bytes (a few: an id) from process 0's `data` to every
   * process's `data`. */
  int (*broadcast)(void *ctx, void *data, uint64_t bytes);
  /* *total_out = the sum of `value` over the processes (e.g. how many
   * failed), so that every process takes the same branch. */
  int (*count)(void *ctx, int32_t value, int32_t *total_out);
} bp_abi_comm_bootstrap;

/* open()'s arguments (rule 3). */
typedef struct bp_abi_comm_open_args {
  uint32_t struct_size;
  int32_t local;           /* ranks of this process (1..world) */
  const int32_t *devices;  /* [local] each local rank's device index */
  int32_t first_rank;      /* the rank id of local rank 0 */
  int32_t world;           /* ranks of the run */
  const bp_abi_comm_bootstrap *bootstrap; /* NULL unless ranks span processes */
  char *reason;            /* why open() failed (NUL-terminated, truncated) */
  size_t reason_size;
} bp_abi_comm_open_args;

/* One collective transport of a device (rules above). */
typedef struct bp_abi_comm_transport {
  uint32_t struct_size;
  const char *backend; /* what its bp_abi_comm.backend carries, e.g. "nccl", "threads" */
  uint32_t flags;      /* BP_ABI_COMM_*; at least one */
  void *user;          /* passed to open() */
  /* Makes the group of this process's ranks in *group_out. */
  int (*open)(void *user, const bp_abi_comm_open_args *args, void **group_out);
  /* Local rank k's communicator (0 <= k < the open's local). */
  int (*comm)(void *group, int32_t k, bp_abi_comm *comm_out);
  void (*close)(void *group);
} bp_abi_comm_transport;

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
