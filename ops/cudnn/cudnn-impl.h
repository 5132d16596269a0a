/* Internal to the cuDNN module (ops/cudnn): the switches init reads, the
 * process-wide handle the algorithm heuristics use outside a node's state,
 * status reasons, and the kernel descriptors (conv2d.c). Nothing here is
 * exported. */
#ifndef BP_OPS_CUDNN_IMPL_H
#define BP_OPS_CUDNN_IMPL_H

#include <stddef.h>

#include <cudnn.h>

#include "bp_abi.h"

#include <pthread.h>

#include "shared/weighted_check.h" /* ops_pass */

/* One registry's view of the module (module.c's init_ctx makes it,
 * fini_ctx frees it): the settings read from that registry's options
 * (ops/shared/cuda_weighted.h: the module options deterministic and tf32,
 * the CLI's BP_DETERMINISTIC and BP_TF32) and its heuristics handle. */
typedef struct cudnn_ctx cudnn_ctx;
/* A kernel's user: its context and pass. */
typedef struct cudnn_user {
  const cudnn_ctx *ctx;
  ops_pass pass;
} cudnn_user;
struct cudnn_ctx {
  int deterministic; /* 1: only deterministic algorithms, kernels so flagged */
  int tf32;          /* 1: FP32 convolutions may run on TF32 Tensor Cores */
  pthread_mutex_t shared_lock; /* guards shared_handle */
  cudnnHandle_t shared_handle; /* made on first use (cudnn_with_shared_handle) */
  cudnn_user users[3];         /* fwd, bwd_data, bwd_filter */
};

/* Writes "cuDNN <what>: <status text> (<cuDNN's last error message>)"
 * into reason[rs] (reason may be NULL); returns 0. */
int cudnn_fail(char *reason, size_t rs, const char *what, cudnnStatus_t st);

/* Runs fn(handle, arg) with the module's shared handle (made on first
 * use, on the calling thread's current device), one caller at a time.
 * For the heuristics of workspace_size(), which has no state. Returns
 * fn's result, or 0 with a reason when the handle cannot be made. */
int cudnn_with_shared_handle(const cudnn_ctx *ctx, int (*fn)(cudnnHandle_t handle, void *arg),
                             void *arg, char *reason, size_t rs);

/* The kernels (conv2d.c), as templates: init_ctx registers copies whose
 * user is the context's cudnn_user and adds BP_ABI_KERNEL_DETERMINISTIC to
 * the backward ones under the context's deterministic. */
extern const bp_abi_kernel cudnn_conv2d_fwd, cudnn_conv2d_bwd_data, cudnn_conv2d_bwd_filter;

#endif
