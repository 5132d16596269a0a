/* An op module built against an *installed* blueprint's headers only
 * (pkg-config blueprint-abi, CMake blueprint::abi): one relu.fwd kernel
 * that `blueprint plugins` lists once the module sits in the module
 * directory the package names. */
#include <bp_abi.h>

#ifndef ABI_MODULE_IMPL
#define ABI_MODULE_IMPL "installed"
#endif

static int run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  (void)args;
  return BP_ABI_OK;
}

static const bp_abi_kernel kernel = {.struct_size = sizeof(bp_abi_kernel),
                                     .op = "relu.fwd",
                                     .impl = ABI_MODULE_IMPL,
                                     .device = "cpu",
                                     .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32),
                                     .priority = 0,
                                     .run = run};

static int init(const bp_abi_host *host) { return host->register_kernel(host->ctx, &kernel); }

static const bp_abi_module module = {.struct_size = sizeof(bp_abi_module),
                                     .abi_major = BP_ABI_MAJOR,
                                     .abi_minor_built = BP_ABI_MINOR,
                                     .abi_minor_required = 0,
                                     .name = "abi-only",
                                     .version = "1.0",
                                     .build_id = "install-test",
                                     .init = init};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &module; }
