/* Kernels for a device kind no plugin provides ("npu"), beside one cpu
 * kernel: `blueprint plugins` must name the kind and count its kernels.
 * The kernels are only listed, never run. */
#include "test_module.h"

static int run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  (void)a;
  return BP_ABI_OK;
}

#define FP32 BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32)

static const bp_abi_kernel kernels[] = {
    {.struct_size = sizeof(bp_abi_kernel), .op = "relu.fwd", .impl = "npu", .device = "npu",
     .dtypes = FP32, .priority = 10, .run = run},
    {.struct_size = sizeof(bp_abi_kernel), .op = "relu.bwd", .impl = "npu", .device = "npu",
     .dtypes = FP32, .priority = 10, .run = run},
    {.struct_size = sizeof(bp_abi_kernel), .op = "add.fwd", .impl = "nodev", .device = "cpu",
     .dtypes = FP32, .priority = 1, .run = run},
};

static int init(const bp_abi_host *host) {
  int rc = BP_ABI_OK;
  for (size_t i = 0; rc == BP_ABI_OK && i < sizeof kernels / sizeof kernels[0]; i++)
    rc = host->register_kernel(host->ctx, &kernels[i]);
  return rc;
}

TM_MODULE("test-nodev", init)
