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

/* What tests/modules/ctx.c (a module with init_ctx, ABI 1.6) records of
 * the host's calls; the test reads it through the exported
 * tm_ctx_record(), holding the library open across registries. */
#define TM_CTX_MAX 16
typedef struct tm_ctx_log {
  int init_ctx_calls;          /* init_ctx calls */
  int init_ctx_ok;             /* of them, returned BP_ABI_OK */
  int fini_ctx_calls;          /* fini_ctx calls */
  int fini_ctx_unknown;        /* fini_ctx with a pointer no successful init_ctx made, or twice */
  int init_calls, fini_calls;  /* the plain init/fini (the 1.5-sized build) */
  void *live[TM_CTX_MAX];      /* contexts made and not yet finished */
  int live_count;
  void *finished[TM_CTX_MAX];  /* contexts finished, in order */
  int finished_count;
} tm_ctx_log;
typedef tm_ctx_log *(*tm_ctx_record_fn)(void);

/* The descriptor and the exported entry of a module built against this
 * header's ABI version. */
#define TM_MODULE(name, init_fn)                                                             \
  static const bp_abi_module tm_module = {sizeof(bp_abi_module), BP_ABI_MAJOR, BP_ABI_MINOR, \
                                          0, 0, name, "1.0", TM_BUILD_ID, init_fn, NULL};    \
  BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);                                     \
  BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &tm_module; }

#endif
