/* Internal to the cuBLAS module (ops/cublas): the per-registry kernel user, status
 * reasons and the kernel descriptors (fc.c). Nothing here is exported. */
#ifndef BP_OPS_CUBLAS_IMPL_H
#define BP_OPS_CUBLAS_IMPL_H

#include <stddef.h>

#include <cublas_v2.h>

#include "bp_abi.h"

#include "shared/weighted_check.h" /* ops_pass */

/* A kernel's user: what module.c's init_ctx keeps per registry (its
 * context holds one per pass). tf32 is read at init_ctx from that
 * registry's module option tf32 (ops/shared/cuda_weighted.h, the CLI's
 * BP_TF32): 1 lets FP32 GEMMs run on TF32 Tensor Cores
 * (CUBLAS_COMPUTE_32F_FAST_TF32). */
typedef struct cublas_user {
  int tf32;
  ops_pass pass;
} cublas_user;

/* Writes "cuBLAS <what>: <status name>: <status text>" into reason[rs]
 * (reason may be NULL); returns 0. */
int cublas_fail(char *reason, size_t rs, const char *what, cublasStatus_t st);

/* Templates (user NULL); init_ctx registers copies pointing at a context. */
extern const bp_abi_kernel cublas_fc_fwd, cublas_fc_bwd_data, cublas_fc_bwd_filter;

#endif
