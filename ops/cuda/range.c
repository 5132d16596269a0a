/* ops/cuda: the range family's kernel descriptors and argument checks. */
#include "cuda-impl.h"

const bp_abi_kernel *const cuda_range_kernels[] = {NULL};
const size_t cuda_range_kernel_count = 0;
