/* Thread services for kernel tests: the same tasks run in the calling
 * thread in order, in reverse order, and spread over four real threads, so
 * a kernel whose bits depend on task order or placement fails its
 * comparison in one of the modes. */
#ifndef BP_TESTS_THREAD_MODES_H
#define BP_TESTS_THREAD_MODES_H

#include "bp_abi.h"

enum { NO_THREADS, REVERSE, FOUR_THREADS, MODES };
extern const char *const mode_names[MODES];

/* The service of `mode` (4 threads claimed in REVERSE and FOUR_THREADS),
 * or NULL for NO_THREADS. */
const bp_abi_threads *thread_mode_service(int mode);

#endif
