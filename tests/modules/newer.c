/* A module built against a newer minor (BP_ABI_MINOR + 1): its descriptor
 * and kernel are longer than the host's. TM_REQUIRED is the oldest minor
 * it accepts: BP_ABI_MINOR + 1 (newer.so, refused naming both versions)
 * or BP_ABI_MINOR (newer_ok.so, loads; the host reads its own part). */
#include "test_module.h"

#ifndef TM_REQUIRED
#define TM_REQUIRED (BP_ABI_MINOR + 1)
#endif

static int run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  (void)a;
  return BP_ABI_OK;
}

/* The newer minor appended one field to each struct. */
typedef struct newer_kernel {
  bp_abi_kernel k;
  uint64_t appended;
} newer_kernel;
typedef struct newer_module {
  bp_abi_module m;
  const char *appended;
} newer_module;

static const newer_kernel kernel = {{sizeof(newer_kernel), "relu.fwd", "newer", "cpu",
                                     BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), 2, 0, NULL, NULL, run,
                                     NULL},
                                    0xfeedu};

static int init(const bp_abi_host *host) { return host->register_kernel(host->ctx, &kernel.k); }

static const newer_module module = {{sizeof(newer_module), BP_ABI_MAJOR, BP_ABI_MINOR + 1,
                                     TM_REQUIRED, 0, "test-newer", "1.1", "test", init, NULL},
                                    "appended"};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &module.m; }
