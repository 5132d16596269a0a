/* Internal to the cuBLAS module (ops/cublas): the switch init reads, status
 * reasons and the kernel descriptors (fc.c). Nothing here is exported. */
#ifndef BP_OPS_CUBLAS_IMPL_H
#define BP_OPS_CUBLAS_IMPL_H

#include <stddef.h>

#include <cublas_v2.h>

#include "bp_abi.h"

/* Read once at init (ops/shared/cuda_weighted.h: the module option tf32,
 * the CLI's BP_TF32): 1 lets FP32
 * GEMMs run on TF32 Tensor Cores (CUBLAS_COMPUTE_32F_FAST_TF32). */
extern int cublas_tf32;

/* Writes "cuBLAS <what>: <status name>: <status text>" into reason[rs]
 * (reason may be NULL); returns 0. */
int cublas_fail(char *reason, size_t rs, const char *what, cublasStatus_t st);

extern const bp_abi_kernel cublas_fc_fwd, cublas_fc_bwd_data, cublas_fc_bwd_filter;

#endif
