/* relu.bwd/<TM_IMPL>/cpu at priority 7: two builds (x, y) tie, so load
 * order decides. */
#include "test_module.h"

#ifndef TM_IMPL
#define TM_IMPL "x"
#endif

static int run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  (void)a;
  return BP_ABI_OK;
}

static const bp_abi_kernel kernel = {sizeof(bp_abi_kernel), "relu.bwd", TM_IMPL, "cpu",
                                     BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), 7, 0, NULL, NULL, run,
                                     NULL};

static int init(const bp_abi_host *host) { return host->register_kernel(host->ctx, &kernel); }

TM_MODULE("test-tie-" TM_IMPL, init)
