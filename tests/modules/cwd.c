/* A fine module, placed where a test makes it the current directory: it
 * must never be found there. */
#include "test_module.h"

static int run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  (void)a;
  return BP_ABI_OK;
}

static const bp_abi_kernel kernel = {sizeof(bp_abi_kernel), "relu.fwd", "cwd", "cpu",
                                     BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), 0, 0, NULL, NULL, run,
                                     NULL};

static int init(const bp_abi_host *host) { return host->register_kernel(host->ctx, &kernel); }

TM_MODULE("test-cwd", init)
