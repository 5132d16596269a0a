/* Registers an op and a kernel, then fails: nothing may stay registered. */
#include "test_module.h"

static int run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  (void)a;
  return BP_ABI_OK;
}

static const bp_abi_op op = {sizeof(bp_abi_op), "test.failed", 1, 1, 0, 0, NULL};
static const bp_abi_kernel kernel = {sizeof(bp_abi_kernel), "relu.fwd", "initfail", "cpu",
                                     BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), 0, 0, NULL, NULL, run,
                                     NULL};

static int init(const bp_abi_host *host) {
  if (host->register_op(host->ctx, &op) != BP_ABI_OK) return BP_ABI_ERR_INVALID;
  if (host->register_kernel(host->ctx, &kernel) != BP_ABI_OK) return BP_ABI_ERR_INVALID;
  host->error(host->ctx, "initfail: the device it needs is not there");
  return BP_ABI_ERR_DEVICE;
}

TM_MODULE("test-initfail", init)
