/* ops/cuda: the nn family's kernel descriptors and argument checks. */
#include "cuda-impl.h"

const bp_abi_kernel *const cuda_nn_kernels[] = {NULL};
const size_t cuda_nn_kernel_count = 0;
