/* Registers a fine kernel, then one that good.so registers too
 * (relu.fwd/good/cpu), and ignores the failure: the host must refuse the
 * whole module anyway, naming both files, and keep neither kernel. */
#include "test_module.h"

static int run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  (void)a;
  return BP_ABI_OK;
}

static const bp_abi_kernel fine = {sizeof(bp_abi_kernel), "relu.bwd", "twin", "cpu",
                                   BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), 0, 0, NULL, NULL, run,
                                   NULL};
static const bp_abi_kernel clash = {sizeof(bp_abi_kernel), "relu.fwd", "good", "cpu",
                                    BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), 0, 0, NULL, NULL, run,
                                    NULL};

static int init(const bp_abi_host *host) {
  host->register_kernel(host->ctx, &fine);
  host->register_kernel(host->ctx, &clash);
  return BP_ABI_OK; /* a careless module: the refusal above still counts */
}

TM_MODULE("test-good-twin", init)
