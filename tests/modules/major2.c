/* A module of ABI major 2. By default it exports the major-2 entry
 * (bp_abi_module_entry_v2), as a real one would; with TM_EXPORT_V1 it
 * exports the major-1 entry but states major 2 in its descriptor. Both
 * are refused at the version stage. */
#include "test_module.h"

static int init(const bp_abi_host *host) {
  (void)host;
  return BP_ABI_OK;
}

static const bp_abi_module module = {sizeof(bp_abi_module), 2, 0, 0, 0, "test-major2", "2.0",
                                     "test", init, NULL};

#ifdef TM_EXPORT_V1
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &module; }
#else
BP_ABI_EXPORT const bp_abi_module *bp_abi_module_entry_v2(void);
BP_ABI_EXPORT const bp_abi_module *bp_abi_module_entry_v2(void) { return &module; }
#endif
