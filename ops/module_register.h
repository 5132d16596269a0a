/* What every op module's init does (compiled into each module; nothing
 * here is exported): check the host, then register a table of kernels in
 * order. The host stages the registrations and keeps none of them when init
 * fails (abi/README.md rule 7). */
#ifndef BP_OPS_MODULE_REGISTER_H
#define BP_OPS_MODULE_REGISTER_H

#include <stddef.h>

#include "bp_abi.h"

/* Registers kernels[0..count) through host; BP_ABI_OK, or the error with
 * host->error called with "<module>: <what failed>". */
int ops_register_kernels(const bp_abi_host *host, const char *module,
                         const bp_abi_kernel *const *kernels, size_t count);

/* host->log when the host offers it. */
void ops_host_log(const bp_abi_host *host, int level, const char *message);

#endif
