/* Threads: the parallel-for service the host lends each rank's kernels
 * (bp_abi_threads, ABI 1.4). One pool per rank: count - 1 persistent
 * worker threads plus the thread that calls parallel_for. */
#ifndef BLUEPRINT_THREADS_H
#define BLUEPRINT_THREADS_H

#include "blueprint/status.h"
#include "bp_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bp_threads bp_threads; /* opaque: one per rank */

/* Starts a pool of `count` threads (1 <= count <= 1024): count - 1 workers
 * that sleep until parallel_for hands them work. count 1 starts no thread;
 * parallel_for then runs every index inline on the caller. */
bp_status bp_threads_create(int count, bp_threads **out);

/* Stops and joins the workers. NULL is a no-op. No parallel_for may be
 * running. */
void bp_threads_destroy(bp_threads *t);

/* The ABI view handed to kernels in args->threads. Borrowed: valid until
 * bp_threads_destroy. Its parallel_for calls fn(arg, i) for every i in
 * [0, n) exactly once, spread dynamically (in chunks) over the pool, and
 * returns when all calls are done. Callers from several threads are
 * served one at a time; a parallel_for from inside fn runs inline. */
const bp_abi_threads *bp_threads_abi(const bp_threads *t);

/* Threads per rank when `ranks_in_process` ranks share this process: the
 * cores this process may run on (its CPU affinity) divided by the ranks,
 * at least 1. Callers that take a count from their user pass it instead
 * (bp_train_options.threads; the CLI reads BP_THREADS, which
 * ThreadSanitizer runs set to 1 since libraries' own worker threads are
 * invisible to it). */
int bp_threads_share(int ranks_in_process);

#ifdef __cplusplus
}
#endif
#endif
