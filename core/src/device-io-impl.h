/* A rank's way to its arena: every host read or write of arena memory goes
 * through here, and from here through the device plugin (bp_abi_device.h).
 * Not installed.
 *
 * Two modes, chosen once from the plugin's flags (ABI 1.4):
 *  - host: the arena is host memory (BP_ABI_DEVICE_HOST_ACCESSIBLE, or no
 *    plugin at all): reads and writes are memcpy on the calling thread, no
 *    stream is made, the loader fills the input buffers in the arena itself
 *    and kernels run on the rank's thread. The cpu device; nothing is added
 *    to its step.
 *  - device: the arena is the device's. The rank owns a compute and a
 *    transfer stream. Writes and reads are copy_h2d / copy_d2h on the
 *    transfer stream through pinned staging, ordered with the compute
 *    stream by events both ways (a read waits for the compute work
 *    enqueued before it; compute enqueued after a write waits for it). The
 *    loader fills pinned staging of the two input buffers; an upload copies
 *    one into the arena on the transfer stream once the compute stream has
 *    finished the step that last read that buffer (event consumed[b]) and
 *    records loaded[b], which the compute stream waits on before the next
 *    job on buffer b. The host hands staging b back to the loader only
 *    after loaded[b] (bp_devio_staging_free). In graph mode
 *    (train_graph.c) the upload is part of the step instead: the host
 *    copies the batch into fixed staging (bp_devio_stage) and the step
 *    copies it from there (bp_devio_step_inputs).
 *
 * Layout: the host side of a tensor is compact NHWC FP32 (bp_dtensor_host_elems
 * floats); the device side is the tensor's padded slot in its dtype. The
 * conversion happens on the host, in host memory, before the copy (and
 * after it, for reads); channel padding written from the host is zero.
 *
 * Every function returns BP_OK or fails with a message that names the
 * device and the plugin's reason (BP_ERR_DEVICE for a plugin failure).
 * One thread uses a rank's io at a time (the rank's). */
#ifndef BLUEPRINT_DEVICE_IO_IMPL_H
#define BLUEPRINT_DEVICE_IO_IMPL_H

#include <stdint.h>

#include "blueprint/dtensor.h"
#include "blueprint/exec.h"
#include "blueprint/plan.h"
#include "blueprint/registry.h"
#include "bp_abi_device.h"

typedef struct bp_devio {
  const bp_abi_device *dev; /* NULL: host memory from bp_host_allocator */
  const char *kind;         /* the device kind, for messages */
  int device;               /* the device index the rank runs on */
  int host;                 /* host mode (above) */
  int host_tasks;           /* kernels run in host tasks on the compute stream */
  char *base;               /* arena base; dereferenced only in host mode */
  uint64_t bytes;           /* arena bytes */
  bp_span input[2];         /* the regions I_A and I_B */
  /* device mode only */
  bp_abi_stream *compute, *transfer;
  bp_abi_event *computed;    /* the end of the latest compute work */
  bp_abi_event *transferred; /* the end of the latest write */
  bp_abi_event *loaded[2];   /* input buffer b uploaded */
  bp_abi_event *consumed[2]; /* the latest job on input buffer b done */
  unsigned char *staging;    /* pinned, BP_DEVIO_CHUNK bytes: synchronous reads and writes */
  unsigned char *scalars;    /* pinned, BP_DEVIO_SCALAR_BYTES: asynchronous small writes */
  uint64_t scalar_used;
  unsigned char *inputs[2];  /* pinned copies of I_A and I_B the loader fills */
  int pending[2];            /* an upload of buffer b not yet waited for by the host */
  /* step graphs (bp_devio_graph_open; docs/training.md, "Steps as graphs") */
  const bp_abi_device_graph_ext *graph; /* the device's capture extension; NULL: none */
  bp_abi_event *fork, *joined; /* a step's input-copy branch: used only inside
                                  bp_devio_step_inputs, record before wait */
  unsigned char *fixed[2];     /* pinned copies of I_A and I_B at fixed addresses: the
                                  source of the input copies a graph captured */
  unsigned char *step_scalars[2]; /* pinned, BP_DEVIO_STEP_SCALARS slots of 16 bytes: the
                                     scalars of a step on input buffer b */
  bp_exec_counts counts;       /* syncs and waits counted here; the rest by the trainer */
  /* streams (bp_devio_lanes_open; docs/training.md, "Streams"): lane[0] is
   * `compute`; lanes 1 and 2 further compute streams, 3 the update stream;
   * NULL where not opened (one stream: every lane is `compute`) */
  bp_abi_stream *lane[4];
  bp_abi_event *lane_fork, *lane_join[4]; /* a job's fork from and join into lane 0 */
} bp_devio;

#define BP_DEVIO_CHUNK (1u << 20)
#define BP_DEVIO_SCALAR_BYTES 4096u
#define BP_DEVIO_STEP_SCALARS 4 /* slots of a step's scalars (lr, step) */

/* Opens the io of an arena at `base` (plan's total bytes) on device index
 * `device` of `dev` (NULL: host memory). */
bp_status bp_devio_open(bp_devio *io, const bp_abi_device *dev, const char *kind, int device,
                        void *base, const bp_plan *plan);
void bp_devio_close(bp_devio *io); /* waits for the streams; a zeroed io is a no-op */

/* Synchronous: when they return the bytes are on the device (write) or in
 * dst (read), ordered after every compute work enqueued before the call. */
bp_status bp_devio_write(bp_devio *io, uint64_t offset, const void *src, uint64_t bytes);
bp_status bp_devio_read(bp_devio *io, uint64_t offset, void *dst, uint64_t bytes);
bp_status bp_devio_zero(bp_devio *io, uint64_t offset, uint64_t bytes);
/* One tensor: compact FP32 host values <-> its padded slot, converting to /
 * from its dtype (FP32, FP16, INT32, INT8 written; FP32 read). */
bp_status bp_devio_write_tensor(bp_devio *io, const bp_dtensor *d, const float *src);
bp_status bp_devio_read_tensor(bp_devio *io, const bp_dtensor *d, float *dst);

/* Asynchronous write of a few bytes (a step's scalars), ordered after the
 * compute work enqueued before it and before the compute work after it;
 * `src` is copied at once. At most BP_DEVIO_SCALAR_BYTES. */
bp_status bp_devio_write_small(bp_devio *io, uint64_t offset, const void *src, uint64_t bytes);

/* The host memory the loader fills for input buffer b: region I_A (b 0)
 * or I_B (1) laid out as in the arena. Host mode: the arena itself. */
void *bp_devio_input(bp_devio *io, int b);
/* Enqueues the upload of input buffer b's `spans` (arena offsets inside
 * that buffer's region). Host mode: nothing. */
bp_status bp_devio_upload(bp_devio *io, int b, const bp_span *spans, int count);
/* Waits until staging b may be refilled (its upload is done). */
bp_status bp_devio_staging_free(bp_devio *io, int b);

/* Around a job of the compute stream on input buffer b (device mode):
 * before, the compute stream waits for the buffer's upload and the latest
 * write; after, records consumed[b] and computed. */
bp_status bp_devio_compute_begin(bp_devio *io, int b);
bp_status bp_devio_compute_end(bp_devio *io, int b);
/* Waits for everything enqueued on the rank's streams. */
bp_status bp_devio_sync(bp_devio *io);

/* ---- step graphs (train_graph.c) ----------------------------------------------
 * In graph mode a step's input copies and scalars are part of its work on
 * the device: the host puts them at fixed pinned addresses first, the
 * copies (captured once) read them from there. */

/* The device's graph-capture extension, or NULL (host mode, none offered,
 * or one older than this header's). */
const bp_abi_device_graph_ext *bp_devio_graph_ext(const bp_abi_device *dev);
/* Allocates the fixed staging, the scalar slots and the fork/join events;
 * sets io->graph. Device mode with the extension only. */
bp_status bp_devio_graph_open(bp_devio *io);
/* Before the host refills buffer b's fixed staging and scalar slots: waits
 * for the latest job on b (event consumed[b], counted in waits), then
 * copies the loader's `spans` of input buffer b into its fixed staging. */
bp_status bp_devio_stage(bp_devio *io, int b, const bp_span *spans, int count);
/* Host address of scalar slot `slot` of buffer b (16 bytes). */
void *bp_devio_step_scalar(bp_devio *io, int b, int slot);
/* Enqueues a step's inputs: the transfer stream forks from the compute
 * stream, copies `spans` of buffer b from its fixed staging and scalar
 * slot i into arena span scalars[i] (count_s of them), and the compute
 * stream joins it. Legal inside a capture of the compute stream (the
 * transfer stream joins the capture) and outside. */
bp_status bp_devio_step_inputs(bp_devio *io, int b, const bp_span *spans, int count,
                               const bp_span *scalars, int count_s);

/* Opens the lanes of a rank with `streams` compute streams (2 or 3): the
 * further compute streams, the update stream and the fork/join events.
 * Device mode only. */
bp_status bp_devio_lanes_open(bp_devio *io, int streams);
/* The stream of lane l: its own, or `compute` where it has none. */
static inline bp_abi_stream *bp_devio_lane(const bp_devio *io, int l) {
  return io->lane[l] ? io->lane[l] : io->compute;
}
/* The native handle of lane l's stream, as bp_devio_stream_native. */
void *bp_devio_lane_native(const bp_devio *io, int l);

/* What kernels get in args->stream: the compute stream's native handle,
 * where they enqueue their work; NULL where they run synchronously (host
 * mode, and host-task kernels, already inside a task of that stream). */
void *bp_devio_stream_native(const bp_devio *io);

#endif
