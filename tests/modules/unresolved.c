/* Calls a function nothing defines. Linked with undefined symbols allowed,
 * it must fail at dlopen (RTLD_NOW), not at the first call of run(). */
#include "test_module.h"

extern int bp_test_missing_function(void);

static int run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  (void)a;
  return bp_test_missing_function();
}

static const bp_abi_kernel kernel = {sizeof(bp_abi_kernel), "relu.fwd", "unresolved", "cpu",
                                     BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), 0, 0, NULL, NULL, run,
                                     NULL};

static int init(const bp_abi_host *host) { return host->register_kernel(host->ctx, &kernel); }

TM_MODULE("test-unresolved", init)
