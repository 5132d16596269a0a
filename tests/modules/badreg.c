/* One refused registration per build, chosen by TM_CASE:
 *  1 a kernel for an op nobody registered
 *  2 a new op kind under a built-in op's name
 *  3 an implementation name with a space
 *  4 a kernel without run()
 *  5 a kernel with an empty dtype mask
 *  6 a device plugin missing functions that are not optional
 * Each module is refused at the register stage and leaves nothing. */
#include "bp_abi_device.h"
#include "test_module.h"

#ifndef TM_CASE
#define TM_CASE 1
#endif

static int run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  (void)a;
  return BP_ABI_OK;
}

static int count(int *n) {
  *n = 1;
  return BP_ABI_OK;
}
static int alloc(int device, uint64_t bytes, uint64_t alignment, void **ptr) {
  (void)device;
  (void)bytes;
  (void)alignment;
  *ptr = NULL;
  return BP_ABI_ERR_NOMEM;
}
static void release(int device, void *ptr, uint64_t bytes) {
  (void)device;
  (void)ptr;
  (void)bytes;
}

#define FP32 BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32)

static int init(const bp_abi_host *host) {
  /* A fine kernel first, so "leaves nothing" is tested too. */
  static const bp_abi_kernel fine = {sizeof(bp_abi_kernel), "relu.bwd", "badreg", "cpu", FP32, 0,
                                     0, NULL, NULL, run, NULL};
  static const bp_abi_kernel unknown_op = {sizeof(bp_abi_kernel), "no.such.op", "badreg", "cpu",
                                           FP32, 0, 0, NULL, NULL, run, NULL};
  static const bp_abi_op builtin_again = {sizeof(bp_abi_op), "conv2d.fwd", 2, 1, 0, 0, NULL};
  static const bp_abi_kernel spaced = {sizeof(bp_abi_kernel), "relu.fwd", "bad name", "cpu",
                                       FP32, 0, 0, NULL, NULL, run, NULL};
  static const bp_abi_kernel no_run = {sizeof(bp_abi_kernel), "relu.fwd", "norun", "cpu", FP32, 0,
                                       0, NULL, NULL, NULL, NULL};
  static const bp_abi_kernel no_dtypes = {sizeof(bp_abi_kernel), "relu.fwd", "nodtypes", "cpu", 0,
                                          0, 0, NULL, NULL, run, NULL};
  static const bp_abi_device broken = {.struct_size = sizeof(bp_abi_device),
                                       .kind = "broken",
                                       .device_count = count,
                                       .arena_alloc = alloc,
                                       .arena_free = release};
  int rc = host->register_kernel(host->ctx, &fine);
  if (rc != BP_ABI_OK) return rc;
  switch (TM_CASE) {
  case 1: return host->register_kernel(host->ctx, &unknown_op);
  case 2: return host->register_op(host->ctx, &builtin_again);
  case 3: return host->register_kernel(host->ctx, &spaced);
  case 4: return host->register_kernel(host->ctx, &no_run);
  case 5: return host->register_kernel(host->ctx, &no_dtypes);
  default: return host->register_device(host->ctx, &broken);
  }
}

TM_MODULE("test-badreg", init)
