/* Shared by nccl.c and nccl_scale.cu (the "nccl" collectives): the scale
 * launcher, with C linkage, plain pointers and the stream as void *. */
#ifndef BP_OPS_ALLREDUCE_NCCL_IMPL_H
#define BP_OPS_ALLREDUCE_NCCL_IMPL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AR_NCCL_BLOCK 256         /* threads per block */
#define AR_NCCL_MAX_BLOCKS 4096u  /* grid-stride beyond: a scale is memory-bound */

/* Enqueues x[i] = x[i] * scale for i < n on `stream` (a cudaStream_t, or
 * NULL for the legacy default stream) on the current device. 0, or the
 * cudaError_t of the launch. */
int ar_nccl_scale(float *x, uint64_t n, float scale, void *stream);

#ifdef __cplusplus
}
#endif
#endif
