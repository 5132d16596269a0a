/* A shared object without the entry symbol: it exports a misspelled one. */
#include "test_module.h"

BP_ABI_EXPORT int bp_abi_module_entry(void);
BP_ABI_EXPORT int bp_abi_module_entry(void) { return 0; }
