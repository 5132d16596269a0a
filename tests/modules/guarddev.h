/* The "guarded" test device's extension (guarddev.c): counters a test
 * reads through bp_abi_device.extensions to see how the host used the
 * device. Test-only; not part of the ABI. */
#ifndef BP_TESTS_GUARDDEV_H
#define BP_TESTS_GUARDDEV_H

#include <stdint.h>

#include "bp_abi.h"

#define GUARD_EXT_TYPE 0x67756172u /* "guar" */

typedef struct guard_stats {
  uint64_t arenas;                    /* live arena allocations */
  uint64_t h2d_transfer, h2d_other;   /* copy_h2d on transfer streams, on others */
  uint64_t d2h, d2d;
  uint64_t compute_host_tasks;        /* stream_enqueue_host on compute streams */
  uint64_t other_host_tasks;
  uint64_t compute_waits_on_transfer; /* a compute stream waits on a transfer stream's event */
  uint64_t uploads_during_compute;    /* transfer-stream copy_h2d enqueued after a compute
                                         task and run before that task was done */
  uint64_t captures;                  /* graphs captured (capture_end succeeded) */
  uint64_t graph_launches;            /* launch() calls */
  uint64_t capture_errors;            /* calls refused because of a capture (as CUDA would) */
  uint64_t comm_opens;                /* the device's collective transport opened a group */
  uint64_t comm_closes;               /* ... and closed one */
} guard_stats;

typedef struct guard_ext {
  bp_abi_ext_header header; /* type GUARD_EXT_TYPE */
  void (*read_stats)(guard_stats *out);
  /* 1: the transport's next opens fail with a reason (0: they work again) */
  void (*fail_comm_open)(int fail);
} guard_ext;

#endif
