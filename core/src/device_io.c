/* A rank's reads and writes of its arena through the device plugin
 * (device-io-impl.h). */
#include <stdlib.h>
#include <string.h>

#include "blueprint/dtype.h"
#include "blueprint/region.h"
#include "bp_abi_sdk.h"
#include "device-io-impl.h"

/* A plugin failure as a status, with the plugin's reason. */
static bp_status dev_fail(const bp_devio *io, const char *what) {
  const char *why = io->dev->last_error ? io->dev->last_error() : NULL;
  return bp_fail(BP_ERR_DEVICE, "device '%s' %d: %s failed: %s", io->kind, io->device, what,
                 why && why[0] ? why : "no reason given");
}

#define DEV(io, call, what)                                            \
  do {                                                                 \
    if ((call) != BP_ABI_OK) return dev_fail((io), (what));            \
  } while (0)

/* The host's waits for the device, counted (bp_exec_counts.syncs). */
static int sync_stream(bp_devio *io, bp_abi_stream *s) {
  io->counts.syncs++;
  return io->dev->stream_synchronize(s);
}

static int sync_event(bp_devio *io, bp_abi_event *e) {
  io->counts.syncs++;
  return io->dev->event_synchronize(e);
}

bp_status bp_devio_open(bp_devio *io, const bp_abi_device *dev, const char *kind, int device,
                        void *base, const bp_plan *plan) {
  memset(io, 0, sizeof *io);
  io->dev = dev;
  io->kind = kind;
  io->device = device;
  io->base = base;
  io->bytes = bp_plan_total_bytes(plan);
  io->input[0] = bp_plan_region_span(plan, BP_REGION_I_A);
  io->input[1] = bp_plan_region_span(plan, BP_REGION_I_B);
  io->host = !dev || (dev->flags & BP_ABI_DEVICE_HOST_ACCESSIBLE);
  io->host_tasks = dev && !io->host && (dev->flags & BP_ABI_DEVICE_HOST_TASK_KERNELS);
  if (io->host) return BP_OK;
  DEV(io, dev->stream_create(device, BP_ABI_STREAM_COMPUTE, &io->compute), "stream_create");
  DEV(io, dev->stream_create(device, BP_ABI_STREAM_TRANSFER, &io->transfer), "stream_create");
  bp_abi_event **events[6] = {&io->computed,   &io->transferred, &io->loaded[0],
                              &io->loaded[1],  &io->consumed[0], &io->consumed[1]};
  for (int i = 0; i < 6; i++) DEV(io, dev->event_create(device, events[i]), "event_create");
  void *p = NULL;
  DEV(io, dev->host_alloc_pinned(BP_DEVIO_CHUNK, &p), "host_alloc_pinned");
  io->staging = p;
  DEV(io, dev->host_alloc_pinned(BP_DEVIO_SCALAR_BYTES, &p), "host_alloc_pinned");
  io->scalars = p;
  for (int b = 0; b < 2; b++) {
    if (!io->input[b].bytes) continue;
    DEV(io, dev->host_alloc_pinned(io->input[b].bytes, &p), "host_alloc_pinned");
    memset(p, 0, (size_t)io->input[b].bytes);
    io->inputs[b] = p;
  }
  return BP_OK;
}

void bp_devio_close(bp_devio *io) {
  if (!io->dev || io->host) return;
  const bp_abi_device *d = io->dev;
  if (io->compute) d->stream_synchronize(io->compute);
  if (io->transfer) d->stream_synchronize(io->transfer);
  for (int l = 1; l < 4; l++)
    if (io->lane[l]) d->stream_synchronize(io->lane[l]);
  for (int l = 1; l < 4; l++) d->stream_destroy(io->lane[l]);
  d->event_destroy(io->lane_fork);
  for (int l = 0; l < 4; l++) d->event_destroy(io->lane_join[l]);
  d->stream_destroy(io->compute);
  d->stream_destroy(io->transfer);
  bp_abi_event *events[8] = {io->computed,  io->transferred, io->loaded[0], io->loaded[1],
                             io->consumed[0], io->consumed[1], io->fork,    io->joined};
  for (int i = 0; i < 8; i++) d->event_destroy(events[i]);
  for (int b = 0; b < 2; b++) {
    if (io->fixed[b]) d->host_free_pinned(io->fixed[b]);
    if (io->step_scalars[b]) d->host_free_pinned(io->step_scalars[b]);
  }
  if (io->staging) d->host_free_pinned(io->staging);
  if (io->scalars) d->host_free_pinned(io->scalars);
  for (int b = 0; b < 2; b++)
    if (io->inputs[b]) d->host_free_pinned(io->inputs[b]);
  memset(io, 0, sizeof *io);
}

static bp_status check_range(const bp_devio *io, uint64_t offset, uint64_t bytes,
                             const char *what) {
  if (offset > io->bytes || bytes > io->bytes - offset)
    return bp_fail(BP_ERR_INVALID, "%s of %llu bytes at %llu: outside the %llu-byte arena", what,
                   (unsigned long long)bytes, (unsigned long long)offset,
                   (unsigned long long)io->bytes);
  return BP_OK;
}

/* The transfer stream starts after the compute work enqueued so far. */
static bp_status transfer_after_compute(bp_devio *io) {
  DEV(io, io->dev->event_record(io->computed, io->compute), "event_record");
  DEV(io, io->dev->stream_wait_event(io->transfer, io->computed), "stream_wait_event");
  return BP_OK;
}

/* Compute work enqueued from now on starts after the transfers so far. */
static bp_status compute_after_transfer(bp_devio *io) {
  DEV(io, io->dev->event_record(io->transferred, io->transfer), "event_record");
  DEV(io, io->dev->stream_wait_event(io->compute, io->transferred), "stream_wait_event");
  return BP_OK;
}

/* Writes `bytes` at `offset` from src, or zeros when src is NULL. */
static bp_status write_bytes(bp_devio *io, uint64_t offset, const void *src, uint64_t bytes) {
  bp_status st = check_range(io, offset, bytes, "arena write");
  if (st != BP_OK) return st;
  if (io->host) {
    if (src)
      memcpy(io->base + offset, src, (size_t)bytes);
    else
      memset(io->base + offset, 0, (size_t)bytes);
    return BP_OK;
  }
  if ((st = transfer_after_compute(io)) != BP_OK) return st;
  if (!src) memset(io->staging, 0, BP_DEVIO_CHUNK);
  for (uint64_t at = 0; at < bytes; at += BP_DEVIO_CHUNK) {
    const uint64_t n = bytes - at < BP_DEVIO_CHUNK ? bytes - at : BP_DEVIO_CHUNK;
    if (src) {
      /* the previous chunk's copy must be done before staging is reused */
      if (at) DEV(io, sync_stream(io, io->transfer), "stream_synchronize");
      memcpy(io->staging, (const unsigned char *)src + at, (size_t)n);
    }
    DEV(io, io->dev->copy_h2d(io->base + offset + at, io->staging, n, io->transfer), "copy_h2d");
  }
  if ((st = compute_after_transfer(io)) != BP_OK) return st;
  DEV(io, sync_stream(io, io->transfer), "stream_synchronize");
  return BP_OK;
}

bp_status bp_devio_write(bp_devio *io, uint64_t offset, const void *src, uint64_t bytes) {
  if (!src && bytes) return bp_fail(BP_ERR_INVALID, "arena write: NULL source");
  return write_bytes(io, offset, src, bytes);
}

bp_status bp_devio_zero(bp_devio *io, uint64_t offset, uint64_t bytes) {
  return write_bytes(io, offset, NULL, bytes);
}

bp_status bp_devio_read(bp_devio *io, uint64_t offset, void *dst, uint64_t bytes) {
  bp_status st = check_range(io, offset, bytes, "arena read");
  if (st != BP_OK) return st;
  if (io->host) {
    memcpy(dst, io->base + offset, (size_t)bytes);
    return BP_OK;
  }
  if ((st = transfer_after_compute(io)) != BP_OK) return st;
  for (uint64_t at = 0; at < bytes; at += BP_DEVIO_CHUNK) {
    const uint64_t n = bytes - at < BP_DEVIO_CHUNK ? bytes - at : BP_DEVIO_CHUNK;
    DEV(io, io->dev->copy_d2h(io->staging, io->base + offset + at, n, io->transfer), "copy_d2h");
    DEV(io, sync_stream(io, io->transfer), "stream_synchronize");
    memcpy((unsigned char *)dst + at, io->staging, (size_t)n);
  }
  return BP_OK;
}

/* ---- tensors ------------------------------------------------------------------- */

/* Compact FP32 `src` into the slot image `slot` (d's device strides and dtype). */
static void to_slot(const bp_dtensor *d, const float *src, unsigned char *slot) {
  uint64_t k = 0;
  for (int64_t n = 0; n < d->shape.n; n++)
    for (int64_t h = 0; h < d->shape.h; h++)
      for (int64_t w = 0; w < d->shape.w; w++) {
        const int64_t row = n * d->dev_stride[0] + h * d->dev_stride[1] + w * d->dev_stride[2];
        for (int64_t c = 0; c < d->shape.c; c++, k++) {
          const int64_t e = row + c * d->dev_stride[3];
          switch (d->dtype) {
          case BP_DTYPE_FP32: ((float *)(void *)slot)[e] = src[k]; break;
          case BP_DTYPE_FP16: ((uint16_t *)(void *)slot)[e] = bp_fp16_from_fp32(src[k]); break;
          case BP_DTYPE_INT32: ((int32_t *)(void *)slot)[e] = (int32_t)src[k]; break;
          case BP_DTYPE_INT8: ((int8_t *)(void *)slot)[e] = (int8_t)src[k]; break;
          default: break; /* refused by the caller */
          }
        }
      }
}

static void from_slot(const bp_dtensor *d, const unsigned char *slot, float *dst) {
  const float *f = (const float *)(const void *)slot;
  uint64_t k = 0;
  for (int64_t n = 0; n < d->shape.n; n++)
    for (int64_t h = 0; h < d->shape.h; h++)
      for (int64_t w = 0; w < d->shape.w; w++)
        for (int64_t c = 0; c < d->shape.c; c++)
          dst[k++] = f[n * d->dev_stride[0] + h * d->dev_stride[1] + w * d->dev_stride[2] +
                       c * d->dev_stride[3]];
}

bp_status bp_devio_write_tensor(bp_devio *io, const bp_dtensor *d, const float *src) {
  if (d->dtype != BP_DTYPE_FP32 && d->dtype != BP_DTYPE_FP16 && d->dtype != BP_DTYPE_INT32 &&
      d->dtype != BP_DTYPE_INT8)
    return bp_fail(BP_ERR_UNSUPPORTED, "tensor '%s': writing %s from the host", d->name,
                   bp_dtype_name(d->dtype));
  bp_status st = check_range(io, d->offset, d->slot_bytes, "tensor write");
  if (st != BP_OK) return st;
  if (io->host) { /* in place: the padding keeps what it holds */
    to_slot(d, src, (unsigned char *)io->base + d->offset);
    return BP_OK;
  }
  unsigned char *slot = calloc(1, (size_t)d->slot_bytes); /* padding written as 0 */
  if (!slot) return bp_fail(BP_ERR_NOMEM, "out of memory writing tensor '%s'", d->name);
  to_slot(d, src, slot);
  st = bp_devio_write(io, d->offset, slot, d->slot_bytes);
  free(slot);
  return st;
}

bp_status bp_devio_read_tensor(bp_devio *io, const bp_dtensor *d, float *dst) {
  if (d->dtype != BP_DTYPE_FP32)
    return bp_fail(BP_ERR_UNSUPPORTED, "tensor '%s': reading %s into FP32", d->name,
                   bp_dtype_name(d->dtype));
  bp_status st = check_range(io, d->offset, d->slot_bytes, "tensor read");
  if (st != BP_OK) return st;
  if (io->host) {
    from_slot(d, (const unsigned char *)io->base + d->offset, dst);
    return BP_OK;
  }
  unsigned char *slot = malloc((size_t)d->slot_bytes);
  if (!slot) return bp_fail(BP_ERR_NOMEM, "out of memory reading tensor '%s'", d->name);
  if ((st = bp_devio_read(io, d->offset, slot, d->slot_bytes)) == BP_OK) from_slot(d, slot, dst);
  free(slot);
  return st;
}

/* ---- the step: scalars and input buffers ------------------------------------------ */

bp_status bp_devio_write_small(bp_devio *io, uint64_t offset, const void *src, uint64_t bytes) {
  bp_status st = check_range(io, offset, bytes, "arena write");
  if (st != BP_OK) return st;
  if (io->host) {
    memcpy(io->base + offset, src, (size_t)bytes);
    return BP_OK;
  }
  if (bytes > BP_DEVIO_SCALAR_BYTES)
    return bp_fail(BP_ERR_INVALID, "a small arena write of %llu bytes (at most %u)",
                   (unsigned long long)bytes, BP_DEVIO_SCALAR_BYTES);
  const uint64_t at = (io->scalar_used + 15) / 16 * 16;
  if (at + bytes > BP_DEVIO_SCALAR_BYTES) { /* wrapped: the earlier copies must be done */
    DEV(io, sync_stream(io, io->transfer), "stream_synchronize");
    io->scalar_used = 0;
    return bp_devio_write_small(io, offset, src, bytes);
  }
  memcpy(io->scalars + at, src, (size_t)bytes);
  io->scalar_used = at + bytes;
  if ((st = transfer_after_compute(io)) != BP_OK) return st;
  DEV(io, io->dev->copy_h2d(io->base + offset, io->scalars + at, bytes, io->transfer), "copy_h2d");
  return compute_after_transfer(io);
}

void *bp_devio_input(bp_devio *io, int b) {
  return io->host ? io->base + io->input[b].offset : (void *)io->inputs[b];
}

bp_status bp_devio_upload(bp_devio *io, int b, const bp_span *spans, int count) {
  if (io->host) return BP_OK;
  const bp_span r = io->input[b];
  /* the arena's buffer b is free once the latest job that read it is done */
  DEV(io, io->dev->stream_wait_event(io->transfer, io->consumed[b]), "stream_wait_event");
  for (int i = 0; i < count; i++) {
    if (spans[i].offset < r.offset || spans[i].bytes > r.bytes ||
        spans[i].offset - r.offset > r.bytes - spans[i].bytes)
      return bp_fail(BP_ERR_INVALID, "upload of input buffer %d: span at %llu outside it", b,
                     (unsigned long long)spans[i].offset);
    DEV(io,
        io->dev->copy_h2d(io->base + spans[i].offset, io->inputs[b] + (spans[i].offset - r.offset),
                          spans[i].bytes, io->transfer),
        "copy_h2d");
  }
  DEV(io, io->dev->event_record(io->loaded[b], io->transfer), "event_record");
  io->pending[b] = 1;
  return BP_OK;
}

bp_status bp_devio_staging_free(bp_devio *io, int b) {
  if (io->host || !io->pending[b]) return BP_OK;
  DEV(io, sync_event(io, io->loaded[b]), "event_synchronize");
  io->pending[b] = 0;
  return BP_OK;
}

bp_status bp_devio_compute_begin(bp_devio *io, int b) {
  if (io->host) return BP_OK;
  DEV(io, io->dev->stream_wait_event(io->compute, io->loaded[b]), "stream_wait_event");
  return BP_OK;
}

bp_status bp_devio_compute_end(bp_devio *io, int b) {
  if (io->host) return BP_OK;
  DEV(io, io->dev->event_record(io->consumed[b], io->compute), "event_record");
  DEV(io, io->dev->event_record(io->computed, io->compute), "event_record");
  return BP_OK;
}

bp_status bp_devio_sync(bp_devio *io) {
  if (io->host) return BP_OK;
  DEV(io, sync_stream(io, io->compute), "stream_synchronize");
  DEV(io, sync_stream(io, io->transfer), "stream_synchronize");
  /* every job joins its lanes into the compute stream: they are idle now,
   * and the drain (not counted) only makes their last event marks done */
  for (int l = 1; l < 4; l++)
    if (io->lane[l]) DEV(io, io->dev->stream_synchronize(io->lane[l]), "stream_synchronize");
  return BP_OK;
}

bp_status bp_devio_lanes_open(bp_devio *io, int streams) {
  BP_ASSERT(!io->host && io->dev && streams >= 2);
  const bp_abi_device *d = io->dev;
  io->lane[0] = io->compute;
  for (int l = 1; l < 4; l++) {
    if (l == 2 && streams < 3) continue;
    const int role = l == 3 ? BP_ABI_STREAM_UPDATE : BP_ABI_STREAM_COMPUTE;
    DEV(io, d->stream_create(io->device, role, &io->lane[l]), "stream_create");
  }
  DEV(io, d->event_create(io->device, &io->lane_fork), "event_create");
  for (int l = 1; l < 4; l++) DEV(io, d->event_create(io->device, &io->lane_join[l]), "event_create");
  return BP_OK;
}

void *bp_devio_lane_native(const bp_devio *io, int l) {
  if (io->host || io->host_tasks || !io->dev->stream_native) return NULL; /* synchronous */
  return io->dev->stream_native(bp_devio_lane(io, l));
}

void *bp_devio_stream_native(const bp_devio *io) {
  if (io->host || io->host_tasks || !io->dev->stream_native) return NULL; /* synchronous */
  return io->dev->stream_native(io->compute);
}

/* ---- step graphs ---------------------------------------------------------------------- */

const bp_abi_device_graph_ext *bp_devio_graph_ext(const bp_abi_device *dev) {
  if (!dev || (dev->flags & BP_ABI_DEVICE_HOST_ACCESSIBLE)) return NULL;
  for (const bp_abi_ext_header *e = dev->extensions; e; e = e->next)
    if (e->type == BP_ABI_EXT_GRAPH_CAPTURE && e->struct_size >= sizeof(bp_abi_device_graph_ext)) {
      const bp_abi_device_graph_ext *g = (const bp_abi_device_graph_ext *)(const void *)e;
      if (g->capture_begin && g->capture_end && g->instantiate && g->launch && g->graph_destroy &&
          g->exec_destroy)
        return g;
    }
  return NULL;
}

bp_status bp_devio_graph_open(bp_devio *io) {
  BP_ASSERT(!io->host && io->dev);
  const bp_abi_device *dev = io->dev;
  DEV(io, dev->event_create(io->device, &io->fork), "event_create");
  DEV(io, dev->event_create(io->device, &io->joined), "event_create");
  for (int b = 0; b < 2; b++) {
    void *p = NULL;
    if (io->input[b].bytes) {
      DEV(io, dev->host_alloc_pinned(io->input[b].bytes, &p), "host_alloc_pinned");
      memset(p, 0, (size_t)io->input[b].bytes);
      io->fixed[b] = p;
    }
    DEV(io, dev->host_alloc_pinned(16 * BP_DEVIO_STEP_SCALARS, &p), "host_alloc_pinned");
    memset(p, 0, 16 * BP_DEVIO_STEP_SCALARS);
    io->step_scalars[b] = p;
  }
  io->graph = bp_devio_graph_ext(dev);
  return BP_OK;
}

/* Checks that span s lies in input buffer b's region. */
static bp_status in_buffer(const bp_devio *io, int b, bp_span s) {
  const bp_span r = io->input[b];
  if (s.offset < r.offset || s.bytes > r.bytes || s.offset - r.offset > r.bytes - s.bytes)
    return bp_fail(BP_ERR_INVALID, "input buffer %d: span at %llu outside it", b,
                   (unsigned long long)s.offset);
  return BP_OK;
}

bp_status bp_devio_stage(bp_devio *io, int b, const bp_span *spans, int count) {
  io->counts.waits++;
  DEV(io, io->dev->event_synchronize(io->consumed[b]), "event_synchronize");
  const uint64_t base = io->input[b].offset;
  for (int i = 0; i < count; i++) {
    bp_status st = in_buffer(io, b, spans[i]);
    if (st != BP_OK) return st;
    memcpy(io->fixed[b] + (spans[i].offset - base), io->inputs[b] + (spans[i].offset - base),
           (size_t)spans[i].bytes);
  }
  return BP_OK;
}

void *bp_devio_step_scalar(bp_devio *io, int b, int slot) {
  BP_ASSERT(slot >= 0 && slot < BP_DEVIO_STEP_SCALARS);
  return io->step_scalars[b] + 16 * slot;
}

bp_status bp_devio_step_inputs(bp_devio *io, int b, const bp_span *spans, int count,
                               const bp_span *scalars, int count_s) {
  BP_ASSERT(count_s <= BP_DEVIO_STEP_SCALARS);
  const bp_abi_device *d = io->dev;
  const uint64_t base = io->input[b].offset;
  DEV(io, d->event_record(io->fork, io->compute), "event_record");
  DEV(io, d->stream_wait_event(io->transfer, io->fork), "stream_wait_event");
  for (int i = 0; i < count; i++) {
    bp_status st = in_buffer(io, b, spans[i]);
    if (st != BP_OK) return st;
    DEV(io,
        d->copy_h2d(io->base + spans[i].offset, io->fixed[b] + (spans[i].offset - base),
                    spans[i].bytes, io->transfer),
        "copy_h2d");
  }
  for (int i = 0; i < count_s; i++) {
    bp_status st = check_range(io, scalars[i].offset, scalars[i].bytes, "scalar write");
    if (st != BP_OK) return st;
    BP_ASSERT(scalars[i].bytes <= 16);
    DEV(io, d->copy_h2d(io->base + scalars[i].offset, io->step_scalars[b] + 16 * i,
                        scalars[i].bytes, io->transfer),
        "copy_h2d");
  }
  DEV(io, d->event_record(io->joined, io->transfer), "event_record");
  DEV(io, d->stream_wait_event(io->compute, io->joined), "stream_wait_event");
  return BP_OK;
}
