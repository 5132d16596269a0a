/* A "threads" communicator: the ranks of one process, as threads, share a
 * barrier and one published pointer per rank (bp_abi_comm_threads), so the
 * "threads" collective kernels serve them. A device plugin makes one for
 * its own transport (bp_abi_device.h, collective transports) and the
 * trainer for ranks on host memory (trainer/src/comm_threads.c). It
 * depends on abi/ and pthreads alone and is compiled into each user with
 * hidden symbols, linking nothing from the core. */
#ifndef BP_PLUGINS_THREADS_GROUP_H
#define BP_PLUGINS_THREADS_GROUP_H

#include <stddef.h>
#include <stdint.h>

#include "bp_abi.h"

#define THREADS_GROUP_MAX 256

typedef struct threads_group threads_group;

/* `world` ranks, all in this process (first rank 0). BP_ABI_OK, or an error
 * with `reason` written. */
int threads_group_open(int32_t world, threads_group **out, char *reason, size_t reason_size);
/* Rank k's view: backend "threads", handle the shared bp_abi_comm_threads. */
int threads_group_comm(threads_group *g, int32_t k, bp_abi_comm *comm_out);
void threads_group_close(threads_group *g); /* NULL is a no-op */

#endif
