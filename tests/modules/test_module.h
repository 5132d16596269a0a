/* Shared by the purpose-built test modules (tests/modules/) and the
 * tests that read them: the module boilerplate and the counters a module
 * exposes through its kernels' `user` pointer. Only abi/ is included:
 * like real modules, these link nothing from the core. */
#ifndef BP_TESTS_TEST_MODULE_H
#define BP_TESTS_TEST_MODULE_H

#include "bp_abi.h"

#ifndef TM_BUILD_ID
#define TM_BUILD_ID "test"
#endif

/* Counters of a module; a kernel's user points at its module's copy, so
 * a test sees what the module did (and that a reloaded module starts at 0). */
typedef struct tm_stats {
  int runs[4];       /* run() calls per kernel slot */
  int supports;      /* supports() calls */
  int event_records; /* device event_record calls */
  int last_device;   /* device index of the last event_create or arena_alloc (tune.c) */
} tm_stats;

/* The descriptor and the exported entry of a module built against this
 * header's ABI version. */
#define TM_MODULE(name, init_fn)                                                             \
  static const bp_abi_module tm_module = {sizeof(bp_abi_module), BP_ABI_MAJOR, BP_ABI_MINOR, \
                                          0, 0, name, "1.0", TM_BUILD_ID, init_fn, NULL};    \
  BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);                                     \
  BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &tm_module; }

#endif
