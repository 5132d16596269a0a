/* Two kernels for add.fwd whose speed differs, on "cpu" and on a test
 * device "tunedev" whose events stamp CLOCK_MONOTONIC when recorded:
 *   quick  priority 0, returns at once
 *   slow   priority 10 (picked without autotune), busy-waits 3 ms and
 *          needs 1 KiB of workspace
 * runs[0..1] count quick/slow on cpu, runs[2..3] on tunedev;
 * event_records counts the device's event records. Built twice with
 * different TM_BUILD_ID to invalidate an autotune cache. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bp_abi_device.h"
#include "test_module.h"

static tm_stats stats;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Counts a run in slot: 0 quick/cpu, 1 slow/cpu, 2 quick/tunedev, 3 slow/tunedev. */
static int quick(void *user, int slot) {
  ((tm_stats *)user)->runs[slot]++;
  return BP_ABI_OK;
}

static int slow(void *user, const bp_abi_kernel_args *a, int slot) {
  if (!a->workspace || a->workspace_bytes < 1024) return BP_ABI_ERR_INVALID;
  memset(a->workspace, 0, 1024);
  ((tm_stats *)user)->runs[slot]++;
  double end = now_ms() + 3.0;
  while (now_ms() < end) {
  }
  return BP_ABI_OK;
}

static int quick_cpu(void *user, const bp_abi_kernel_args *a) {
  (void)a;
  return quick(user, 0);
}
static int slow_cpu(void *user, const bp_abi_kernel_args *a) { return slow(user, a, 1); }
static int quick_dev(void *user, const bp_abi_kernel_args *a) {
  (void)a;
  return quick(user, 2);
}
static int slow_dev(void *user, const bp_abi_kernel_args *a) { return slow(user, a, 3); }

static uint64_t slow_workspace(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  (void)a;
  return 1024;
}

#define FP32 BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32)

static const bp_abi_kernel kernels[] = {
    {sizeof(bp_abi_kernel), "add.fwd", "quick", "cpu", FP32, 0, 0, NULL, NULL, quick_cpu, &stats},
    {sizeof(bp_abi_kernel), "add.fwd", "slow", "cpu", FP32, 10, 0, NULL, slow_workspace, slow_cpu,
     &stats},
    {sizeof(bp_abi_kernel), "add.fwd", "quick", "tunedev", FP32, 0, 0, NULL, NULL, quick_dev,
     &stats},
    {sizeof(bp_abi_kernel), "add.fwd", "slow", "tunedev", FP32, 10, 0, NULL, slow_workspace,
     slow_dev, &stats},
};

/* ---- the "tunedev" device: host memory, inline streams, clock events ---- */

struct bp_abi_stream {
  int unused;
};
struct bp_abi_event {
  double ms;
};

static int dev_count(int *n) {
  *n = 2;
  return BP_ABI_OK;
}
static int dev_alloc(int device, uint64_t bytes, uint64_t alignment, void **ptr) {
  stats.last_device = device;
  return posix_memalign(ptr, (size_t)alignment, (size_t)bytes) == 0 ? BP_ABI_OK
                                                                      : BP_ABI_ERR_NOMEM;
}
static void dev_free(int device, void *ptr, uint64_t bytes) {
  (void)device;
  (void)bytes;
  free(ptr);
}
static int stream_create(int device, int role, bp_abi_stream **out) {
  (void)device;
  (void)role;
  *out = calloc(1, sizeof **out);
  return *out ? BP_ABI_OK : BP_ABI_ERR_NOMEM;
}
static void stream_destroy(bp_abi_stream *s) { free(s); }
static int stream_sync(bp_abi_stream *s) {
  (void)s;
  return BP_ABI_OK;
}
static int enqueue_host(bp_abi_stream *s, void (*fn)(void *), void *arg) {
  (void)s;
  fn(arg);
  return BP_ABI_OK;
}
static void *stream_native(bp_abi_stream *s) { return s; }
static int event_create(int device, bp_abi_event **out) {
  stats.last_device = device;
  *out = calloc(1, sizeof **out);
  return *out ? BP_ABI_OK : BP_ABI_ERR_NOMEM;
}
static void event_destroy(bp_abi_event *e) { free(e); }
static int event_record(bp_abi_event *e, bp_abi_stream *s) {
  (void)s;
  stats.event_records++;
  e->ms = now_ms();
  return BP_ABI_OK;
}
static int stream_wait(bp_abi_stream *s, bp_abi_event *e) {
  (void)s;
  (void)e;
  return BP_ABI_OK;
}
static int event_sync(bp_abi_event *e) {
  (void)e;
  return BP_ABI_OK;
}
static int event_elapsed(bp_abi_event *start, bp_abi_event *end, float *ms) {
  *ms = (float)(end->ms - start->ms);
  return BP_ABI_OK;
}
static int copy(void *dst, const void *src, uint64_t bytes, bp_abi_stream *s) {
  (void)s;
  memcpy(dst, src, (size_t)bytes);
  return BP_ABI_OK;
}
static int pinned_alloc(uint64_t bytes, void **ptr) {
  *ptr = malloc((size_t)bytes);
  return *ptr ? BP_ABI_OK : BP_ABI_ERR_NOMEM;
}

static const bp_abi_device device = {
    .struct_size = sizeof(bp_abi_device),
    .kind = "tunedev",
    .device_count = dev_count,
    .arena_alloc = dev_alloc,
    .arena_free = dev_free,
    .stream_create = stream_create,
    .stream_destroy = stream_destroy,
    .stream_synchronize = stream_sync,
    .stream_enqueue_host = enqueue_host,
    .stream_native = stream_native,
    .event_create = event_create,
    .event_destroy = event_destroy,
    .event_record = event_record,
    .stream_wait_event = stream_wait,
    .event_synchronize = event_sync,
    .event_elapsed_ms = event_elapsed,
    .copy_h2d = copy,
    .copy_d2h = copy,
    .copy_d2d = copy,
    .host_alloc_pinned = pinned_alloc,
    .host_free_pinned = free,
};

static int init(const bp_abi_host *host) {
  int rc = host->register_device(host->ctx, &device);
  for (size_t i = 0; rc == BP_ABI_OK && i < sizeof kernels / sizeof kernels[0]; i++)
    rc = host->register_kernel(host->ctx, &kernels[i]);
  return rc;
}

TM_MODULE("test-tune", init)
