/* ops/cuda internals shared by its C files (descriptors and checks) and its
 * .cu files (kernels and launchers). Launchers have C linkage, take plain
 * pointers and sizes (the C side has checked the arguments), enqueue on the
 * given stream and return 0 or the cudaError_t of the launch. Nothing here
 * allocates, synchronizes or reads device memory on the host, so every
 * kernel may be captured in a CUDA graph (flag GRAPH_CAPTURABLE). */
#ifndef BP_OPS_CUDA_IMPL_H
#define BP_OPS_CUDA_IMPL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef __CUDACC__
#include "bp_abi.h"

/* The kernel tables module.c registers, one per family file. */
extern const bp_abi_kernel *const cuda_range_kernels[];
extern const size_t cuda_range_kernel_count;
extern const bp_abi_kernel *const cuda_nn_kernels[];
extern const size_t cuda_nn_kernel_count;

/* Turns a launcher's result into the kernel's: BP_ABI_OK for 0, else
 * BP_ABI_ERR_DEVICE with "<what>: <CUDA error name and text>" in
 * args->reason (module.c). */
int cuda_launch_result(const bp_abi_kernel_args *args, const char *what, int cuda_error);
#endif

/* Threads per block and the grid for a grid-stride loop over n elements on
 * the current device (at most 65535 * 8 blocks, so n up to 2^40 loops). */
#define CUDA_BLOCK 256
static inline unsigned cuda_grid_for(int64_t n) {
  int64_t blocks = (n + CUDA_BLOCK - 1) / CUDA_BLOCK;
  if (blocks < 1) blocks = 1;
  if (blocks > 65535 * 8) blocks = 65535 * 8;
  return (unsigned)blocks;
}

#ifdef __cplusplus
}
#endif

#endif
