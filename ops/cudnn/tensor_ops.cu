/* The staging and bias-gradient kernels this module shares with ops/cublas
 * (ops/shared/cuda_tensor_ops.h), compiled into this module. */
#include "shared/cuda_tensor_ops.cuh"
