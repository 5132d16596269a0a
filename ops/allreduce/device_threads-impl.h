/* Shared by device_threads.c and device_threads.cu (the "threads"
 * collectives over device memory): the rank-order sum's launcher, with C
 * linkage, plain pointers and the stream as void *. */
#ifndef BP_OPS_ALLREDUCE_DEVICE_THREADS_IMPL_H
#define BP_OPS_ALLREDUCE_DEVICE_THREADS_IMPL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AR_DT_MAX_WORLD 16        /* peers' pointers travel in the launch's parameters */
#define AR_DT_BLOCK 256           /* threads per block */
#define AR_DT_MAX_BLOCKS 4096u    /* grid-stride beyond: the sum is memory-bound */

/* The source spans of one chunk, by value in the kernel's parameters. */
typedef struct ar_dt_sources {
  const float *src[AR_DT_MAX_WORLD];
} ar_dt_sources;

/* Enqueues dst[i] = scale * (src[0][i] + ... + src[world-1][i]) for i < n on
 * `stream` (a cudaStream_t) on the current device: one float accumulator
 * from src[0], summed in rank order, then scaled, as ar_reduce_chunk
 * (allreduce-impl.h), so the bits are the CPU's. dst may be one of the
 * sources. 0, or the cudaError_t of the launch. */
int ar_dt_reduce(float *dst, const ar_dt_sources *sources, int world, uint64_t n, float scale,
                 void *stream);

#ifdef __cplusplus
}
#endif
#endif
