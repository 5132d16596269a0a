/* A module written against an older minor: its structs end earlier. The
 * module descriptor stops before `fini`, the kernel before `user`; the
 * bytes that follow in this file hold poison (a fini that aborts, a user
 * pointer that is not NULL). The host must read them as absent: never call
 * fini, and pass user == NULL to supports() and run(). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "test_module.h"

static int poison;

static void poisoned_fini(void) { abort(); }

static int supports(void *user, const bp_abi_kernel_args *a, char *reason, size_t size) {
  (void)a;
  if (user == NULL) return 1;
  snprintf(reason, size, "user beyond struct_size was read: %p", user);
  return 0;
}

static int run(void *user, const bp_abi_kernel_args *a) {
  (void)a;
  return user == NULL ? BP_ABI_OK : BP_ABI_ERR_INVALID;
}

static const bp_abi_kernel kernel = {offsetof(bp_abi_kernel, user), "relu.fwd", "older", "cpu",
                                     BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), 1, 0, supports, NULL,
                                     run, &poison};

static int init(const bp_abi_host *host) { return host->register_kernel(host->ctx, &kernel); }

static const bp_abi_module module = {offsetof(bp_abi_module, fini), BP_ABI_MAJOR, 0, 0, 0,
                                     "test-older", "0.9", "test", init, poisoned_fini};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &module; }
