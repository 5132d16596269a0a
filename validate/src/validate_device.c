/* Validation through a device plugin (validate --device KIND): a run's
 * tensors live in memory of the device, which the host never touches. The
 * checks build the same host images as on the host path (poisoned outputs,
 * NaN input padding, prior contents); here they are copied into one
 * scratch arena of the device, the kernel runs on the device's compute
 * stream (or in a host task on it, BP_ABI_DEVICE_HOST_TASK_KERNELS), and
 * every slot is copied back into its image, where the host path's checks
 * read it. Everything goes through bp_abi_device: arena_alloc, copy_h2d /
 * copy_d2h through pinned staging, stream_native, stream_enqueue_host and
 * stream_synchronize. One stream serves the copies and the kernel, so
 * their order is the stream's.
 *
 * The scratch arena and its staging grow to the largest run seen and are
 * reused; every run rewrites every byte it uses (gaps and the workspace
 * hold 0xa5 bytes). There are no guard pages on a device: a read past a
 * slot lands in the next slot or the arena's end, unseen. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "validate-impl.h"

#define SLOT_ALIGN 256u
#define ARENA_GRAIN (64u << 10) /* the scratch arena grows in these steps */

struct vc_device {
  const bp_abi_device *dev;
  int index;
  int host_tasks;         /* kernels run in stream_enqueue_host tasks */
  bp_abi_stream *stream;  /* a compute stream: copies and kernels */
  void *arena;            /* device memory, arena_bytes */
  unsigned char *staging; /* pinned host memory, arena_bytes */
  uint64_t arena_bytes;
  uint64_t used; /* bytes of the arena the current run uses */
};

static const char *plugin_error(const bp_abi_device *dev) {
  const char *e = dev->last_error ? dev->last_error() : NULL;
  return e && e[0] ? e : "no reason given";
}

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

bp_status vc_device_open(const bp_abi_device *dev, int index, vc_device **out) {
  *out = NULL;
  const int host_tasks = (dev->flags & BP_ABI_DEVICE_HOST_TASK_KERNELS) != 0;
  if (!dev->stream_create || !dev->stream_destroy || !dev->stream_synchronize ||
      !dev->arena_alloc || !dev->arena_free || !dev->copy_h2d || !dev->copy_d2h ||
      !dev->host_alloc_pinned || !dev->host_free_pinned ||
      (host_tasks ? !dev->stream_enqueue_host : !dev->stream_native))
    return bp_fail(BP_ERR_UNSUPPORTED,
                   "device '%s': the plugin lacks a function validation needs (streams, arena, "
                   "copies, pinned memory)",
                   dev->kind);
  vc_device *d = calloc(1, sizeof *d);
  if (!d) return bp_fail(BP_ERR_NOMEM, "out of memory opening device '%s'", dev->kind);
  d->dev = dev;
  d->index = index;
  d->host_tasks = host_tasks;
  if (dev->stream_create(index, BP_ABI_STREAM_COMPUTE, &d->stream) != BP_ABI_OK || !d->stream) {
    const bp_status st = bp_fail(BP_ERR_DEVICE, "device '%s' %d: stream_create failed: %s",
                                 dev->kind, index, plugin_error(dev));
    free(d);
    return st;
  }
  *out = d;
  return BP_OK;
}

static void release_scratch(vc_device *d) {
  if (d->arena) d->dev->arena_free(d->index, d->arena, d->arena_bytes);
  if (d->staging) d->dev->host_free_pinned(d->staging);
  d->arena = NULL;
  d->staging = NULL;
  d->arena_bytes = 0;
}

void vc_device_close(vc_device *d) {
  if (!d) return;
  (void)d->dev->stream_synchronize(d->stream);
  release_scratch(d);
  d->dev->stream_destroy(d->stream);
  free(d);
}

const char *vc_device_kind(const vc_device *d) { return d->dev->kind; }
int vc_device_index(const vc_device *d) { return d->index; }

void *vc_device_stream(const vc_device *d) {
  return d->host_tasks ? NULL : d->dev->stream_native(d->stream);
}

/* The arena and its staging hold at least `bytes`; 0, or -1 and why. */
static int reserve(vc_device *d, uint64_t bytes, char *why, size_t why_size) {
  if (bytes <= d->arena_bytes) return 0;
  const uint64_t want = align_up(bytes, ARENA_GRAIN);
  /* nothing may still use the old ones */
  if (d->dev->stream_synchronize(d->stream) != BP_ABI_OK) {
    snprintf(why, why_size, "device '%s' %d: stream_synchronize failed: %s", d->dev->kind,
             d->index, plugin_error(d->dev));
    return -1;
  }
  release_scratch(d);
  void *arena = NULL, *staging = NULL;
  if (d->dev->arena_alloc(d->index, want, SLOT_ALIGN, &arena) != BP_ABI_OK || !arena) {
    snprintf(why, why_size, "device '%s' %d: arena_alloc of %llu bytes failed: %s", d->dev->kind,
             d->index, (unsigned long long)want, plugin_error(d->dev));
    return -1;
  }
  if (d->dev->host_alloc_pinned(want, &staging) != BP_ABI_OK || !staging) {
    snprintf(why, why_size, "device '%s' %d: host_alloc_pinned of %llu bytes failed: %s",
             d->dev->kind, d->index, (unsigned long long)want, plugin_error(d->dev));
    d->dev->arena_free(d->index, arena, want);
    return -1;
  }
  d->arena = arena;
  d->staging = staging;
  d->arena_bytes = want;
  return 0;
}

int vc_device_upload(vc_device *d, vc_slot *slots, int n, uint64_t ws_bytes, void **ws_out,
                     char *why, size_t why_size) {
  uint64_t end = 0;
  for (int i = 0; i < n; i++) {
    slots[i].offset = align_up(end, SLOT_ALIGN);
    end = slots[i].offset + slots[i].bytes;
  }
  const uint64_t ws_off = align_up(end, SLOT_ALIGN);
  if (ws_bytes) end = ws_off + ws_bytes;
  if (end == 0) end = SLOT_ALIGN;
  if (reserve(d, end, why, why_size) != 0) return -1;
  d->used = end;
  memset(d->staging, 0xa5, (size_t)end);
  for (int i = 0; i < n; i++) {
    if (slots[i].bytes) memcpy(d->staging + slots[i].offset, slots[i].host, (size_t)slots[i].bytes);
    slots[i].dev = (unsigned char *)d->arena + slots[i].offset;
  }
  *ws_out = ws_bytes ? (unsigned char *)d->arena + ws_off : NULL;
  if (d->dev->copy_h2d(d->arena, d->staging, end, d->stream) != BP_ABI_OK) {
    snprintf(why, why_size, "device '%s' %d: copy_h2d of %llu bytes failed: %s", d->dev->kind,
             d->index, (unsigned long long)end, plugin_error(d->dev));
    return -1;
  }
  return 0;
}

/* A call of a kernel's prepare() (state set) or run() in a host task of
 * the compute stream. */
typedef struct host_call {
  const bp_abi_kernel *k;
  const bp_abi_kernel_args *a;
  void **state;
  int rc;
} host_call;

static void host_call_run(void *arg) {
  host_call *h = arg;
  h->rc = h->state ? h->k->prepare(h->k->user, h->a, h->state) : h->k->run(h->k->user, h->a);
}

/* Runs h in a host task and waits: 0, or -1 and why. */
static int in_task(vc_device *d, host_call *h, const char *what, char *why, size_t why_size) {
  if (d->dev->stream_enqueue_host(d->stream, host_call_run, h) != BP_ABI_OK) {
    snprintf(why, why_size, "device '%s' %d: stream_enqueue_host of %s failed: %s",
             d->dev->kind, d->index, what, plugin_error(d->dev));
    return -1;
  }
  if (d->dev->stream_synchronize(d->stream) != BP_ABI_OK) {
    snprintf(why, why_size, "device '%s' %d: stream_synchronize after %s failed: %s",
             d->dev->kind, d->index, what, plugin_error(d->dev));
    return -1;
  }
  return 0;
}

int vc_device_prepare(vc_device *d, const bp_abi_kernel *k, bp_abi_kernel_args *a, void **state,
                      int *krc_out, char *why, size_t why_size) {
  a->stream = vc_device_stream(d);
  if (!d->host_tasks) {
    *krc_out = k->prepare(k->user, a, state);
    return 0;
  }
  host_call h = {k, a, state, BP_ABI_ERR_DEVICE};
  *krc_out = BP_ABI_ERR_DEVICE;
  if (in_task(d, &h, "prepare()", why, why_size) != 0) return -1;
  *krc_out = h.rc;
  return 0;
}

int vc_device_launch(vc_device *d, const bp_abi_kernel *k, bp_abi_kernel_args *a, int *krc_out,
                     char *why, size_t why_size) {
  *krc_out = BP_ABI_ERR_DEVICE;
  a->stream = vc_device_stream(d);
  if (d->host_tasks) {
    host_call h = {k, a, NULL, BP_ABI_ERR_DEVICE};
    if (in_task(d, &h, "run()", why, why_size) != 0) return -1;
    *krc_out = h.rc;
    return 0;
  }
  *krc_out = k->run(k->user, a);
  /* the work run() enqueued fails here, when it fails on the device */
  if (d->dev->stream_synchronize(d->stream) != BP_ABI_OK) {
    snprintf(why, why_size,
             "device '%s' %d: the work run() enqueued failed (stream_synchronize: %s)",
             d->dev->kind, d->index, plugin_error(d->dev));
    return -1;
  }
  return 0;
}

int vc_device_download(vc_device *d, const vc_slot *slots, int n, char *why, size_t why_size) {
  if (d->dev->copy_d2h(d->staging, d->arena, d->used, d->stream) != BP_ABI_OK) {
    snprintf(why, why_size, "device '%s' %d: copy_d2h of %llu bytes failed: %s", d->dev->kind,
             d->index, (unsigned long long)d->used, plugin_error(d->dev));
    return -1;
  }
  if (d->dev->stream_synchronize(d->stream) != BP_ABI_OK) {
    snprintf(why, why_size, "device '%s' %d: stream_synchronize after copy_d2h failed: %s",
             d->dev->kind, d->index, plugin_error(d->dev));
    return -1;
  }
  for (int i = 0; i < n; i++)
    if (slots[i].bytes) memcpy(slots[i].host, d->staging + slots[i].offset, (size_t)slots[i].bytes);
  return 0;
}
