/* Shared module init (module_register.h). */
#include "module_register.h"

#include <stdio.h>

static void host_error(const bp_abi_host *host, const char *message) {
  if (host->struct_size >= offsetof(bp_abi_host, error) + sizeof host->error && host->error)
    host->error(host->ctx, message);
}

void ops_host_log(const bp_abi_host *host, int level, const char *message) {
  if (host->struct_size >= offsetof(bp_abi_host, log) + sizeof host->log && host->log)
    host->log(host->ctx, level, message);
}

int ops_register_kernels(const bp_abi_host *host, const char *module,
                         const bp_abi_kernel *const *kernels, size_t count) {
  if (!host) return BP_ABI_ERR_INVALID;
  char message[256];
  if (host->struct_size < offsetof(bp_abi_host, register_kernel) + sizeof host->register_kernel ||
      !host->register_kernel) {
    snprintf(message, sizeof message, "%s: the host offers no register_kernel", module);
    host_error(host, message);
    return BP_ABI_ERR_UNSUPPORTED;
  }
  if (host->abi_major != BP_ABI_MAJOR) {
    snprintf(message, sizeof message, "%s: host ABI major %u, module built for %d", module,
             (unsigned)host->abi_major, BP_ABI_MAJOR);
    host_error(host, message);
    return BP_ABI_ERR_UNSUPPORTED;
  }
  for (size_t i = 0; i < count; i++) {
    const int rc = host->register_kernel(host->ctx, kernels[i]);
    if (rc != BP_ABI_OK) {
      snprintf(message, sizeof message, "%s: registering %s (%s, %s) failed with %d", module,
               kernels[i]->op, kernels[i]->impl, kernels[i]->device, rc);
      host_error(host, message);
      return rc;
    }
  }
  return BP_ABI_OK;
}
