/* What the kernel-state test modules (state.c, minor3.c) tell the test
 * (tests/test_kernel_state.c) through their kernel's `user` pointer, and
 * how the test steers them. Only abi/ is included. */
#ifndef BP_TESTS_STATE_MODULE_H
#define BP_TESTS_STATE_MODULE_H

#include <stdint.h>

#define TM_STATE_MAX_RANKS 4

typedef struct tm_state_stats {
  /* counted by the module */
  int prepares, releases, runs;
  int prepares_by_rank[TM_STATE_MAX_RANKS];
  int runs_by_rank[TM_STATE_MAX_RANKS];
  int bad_prepare_args; /* prepare() saw a state, or no reason/threads/generation */
  int bad_run_args;     /* run() saw no state of its own, or no reason/threads/generation */
  int generation_changes; /* run() found *params_generation past its state's */
  uint64_t last_generation; /* *params_generation at the last run() */
  int threads_count;        /* args->threads->count at the last run() */
  /* set by the test */
  int fail_prepare; /* the prepare() call that makes `prepares` this value fails, with a
                       reason (0: none fails) */
  int fail_run;     /* run() returns this ABI status (0: succeeds) ... */
  int fail_silent;  /* ... without writing a reason */
} tm_state_stats;

#endif
