/* Internal to the cuDNN module (ops/cudnn): the switches init reads, the
 * process-wide handle the algorithm heuristics use outside a node's state,
 * status reasons, and the kernel descriptors (conv2d.c). Nothing here is
 * exported. */
#ifndef BP_OPS_CUDNN_IMPL_H
#define BP_OPS_CUDNN_IMPL_H

#include <stddef.h>

#include <cudnn.h>

#include "bp_abi.h"

/* Read once at init (ops/shared/cuda_weighted.h: the module options
 * deterministic and tf32, the CLI's BP_DETERMINISTIC and BP_TF32). */
extern int cudnn_deterministic; /* 1: only deterministic algorithms, kernels so flagged */
extern int cudnn_tf32;          /* 1: FP32 convolutions may run on TF32 Tensor Cores */

/* Writes "cuDNN <what>: <status text> (<cuDNN's last error message>)"
 * into reason[rs] (reason may be NULL); returns 0. */
int cudnn_fail(char *reason, size_t rs, const char *what, cudnnStatus_t st);

/* Runs fn(handle, arg) with the module's shared handle (made on first
 * use, on the calling thread's current device), one caller at a time.
 * For the heuristics of workspace_size(), which has no state. Returns
 * fn's result, or 0 with a reason when the handle cannot be made. */
int cudnn_with_shared_handle(int (*fn)(cudnnHandle_t handle, void *arg), void *arg,
                             char *reason, size_t rs);

/* Frees the shared handle (module fini). */
void cudnn_shared_handle_release(void);

/* The kernels (conv2d.c); init adds BP_ABI_KERNEL_DETERMINISTIC to the
 * backward ones under cudnn_deterministic, before registering them. */
extern bp_abi_kernel cudnn_conv2d_fwd, cudnn_conv2d_bwd_data, cudnn_conv2d_bwd_filter;

#endif
