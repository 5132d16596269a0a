/* The cuDNN op module (bp_ops_cudnn.so): its ABI entry (the only exported
 * symbol), the per-registry context (the settings read at init_ctx and
 * the heuristics handle, cudnn-impl.h) and status reasons. Kernels: conv2d.c (README.md).
 *
 * Init refuses the module, with the reason `blueprint plugins` prints,
 * where there is no CUDA driver or device (ops/shared/cuda_probe.h), where
 * the cuDNN library found at load time is not of the major version the
 * module was built against, or where cuDNN cannot make a handle and a
 * convolution descriptor (its convolution library, libcudnn_cnn, is loaded
 * on first use: a missing one shows here, not at the first run). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "cudnn-impl.h"
#include "module_register.h"
#include "shared/cuda_probe.h"
#include "shared/cuda_weighted.h"
#ifdef BP_OPS_CUDNN_BUILD_ID_HEADER
#include "build_id.h" /* generated: a hash of the sources and compiler settings */
#endif

#ifndef BP_OPS_CUDNN_VERSION
#define BP_OPS_CUDNN_VERSION "0.0.0"
#endif
#ifndef BP_OPS_CUDNN_BUILD_ID
#define BP_OPS_CUDNN_BUILD_ID "unknown"
#endif

#define CUDNN_MODULE_NAME "ops-cudnn"

int cudnn_fail(char *reason, size_t rs, const char *what, cudnnStatus_t st) {
  char detail[256] = "";
  cudnnGetLastErrorString(detail, sizeof detail);
  return bp_sdk_fail(reason, rs, "cuDNN %s: %s%s%s%s", what, cudnnGetErrorString(st),
                     detail[0] ? " (" : "", detail, detail[0] ? ")" : "");
}

int cudnn_with_shared_handle(const cudnn_ctx *cctx, int (*fn)(cudnnHandle_t handle, void *arg),
                             void *arg, char *reason, size_t rs) {
  cudnn_ctx *ctx = (cudnn_ctx *)cctx; /* the handle and its lock are the mutable part */
  pthread_mutex_lock(&ctx->shared_lock);
  int ok = 1;
  if (!ctx->shared_handle) {
    const cudnnStatus_t st = cudnnCreate(&ctx->shared_handle);
    if (st != CUDNN_STATUS_SUCCESS) {
      ctx->shared_handle = NULL;
      ok = cudnn_fail(reason, rs, "cudnnCreate", st);
    }
  }
  if (ok) ok = fn(ctx->shared_handle, arg);
  pthread_mutex_unlock(&ctx->shared_lock);
  return ok;
}

static int cudnn_refuse(const bp_abi_host *host, const char *what) {
  char message[512];
  snprintf(message, sizeof message, "%s: %s", CUDNN_MODULE_NAME, what);
  if (host->error) host->error(host->ctx, message);
  return BP_ABI_ERR_UNSUPPORTED;
}

/* The library loads, is of our major version, and makes a handle and a
 * convolution descriptor. */
static int cudnn_check_library(const bp_abi_host *host) {
  char what[448];
  const size_t version = cudnnGetVersion();
  if (version / 10000 != CUDNN_MAJOR) {
    snprintf(what, sizeof what, "cuDNN %zu.%zu.%zu is loaded, the module needs major %d",
             version / 10000, version / 100 % 100, version % 100, CUDNN_MAJOR);
    return cudnn_refuse(host, what);
  }
  cudnnHandle_t handle = NULL;
  cudnnStatus_t st = cudnnCreate(&handle);
  if (st != CUDNN_STATUS_SUCCESS) {
    cudnn_fail(what, sizeof what, "cudnnCreate", st);
    return cudnn_refuse(host, what);
  }
  cudnnConvolutionDescriptor_t conv = NULL;
  st = cudnnCreateConvolutionDescriptor(&conv);
  if (st == CUDNN_STATUS_SUCCESS) cudnnDestroyConvolutionDescriptor(conv);
  cudnnDestroy(handle);
  if (st != CUDNN_STATUS_SUCCESS) {
    cudnn_fail(what, sizeof what, "cudnnCreateConvolutionDescriptor (libcudnn_cnn)", st);
    return cudnn_refuse(host, what);
  }
  return BP_ABI_OK;
}

static void cudnn_fini_ctx(void *p) {
  cudnn_ctx *ctx = p;
  if (ctx->shared_handle) cudnnDestroy(ctx->shared_handle);
  pthread_mutex_destroy(&ctx->shared_lock);
  free(ctx);
}

static int cudnn_init_ctx(const bp_abi_host *host, void **ctx_out) {
  int rc = ops_cuda_probe(host, CUDNN_MODULE_NAME);
  if (rc != BP_ABI_OK) return rc;
  rc = cudnn_check_library(host);
  if (rc != BP_ABI_OK) return rc;
  cudnn_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx || pthread_mutex_init(&ctx->shared_lock, NULL) != 0) {
    free(ctx);
    return cudnn_refuse(host, "out of memory for the context");
  }
  ctx->deterministic = ops_cuda_option_deterministic(host);
  ctx->tf32 = ops_cuda_option_tf32(host);
  const uint32_t det = ctx->deterministic ? BP_ABI_KERNEL_DETERMINISTIC : 0;
  const bp_abi_kernel *const templates[3] = {&cudnn_conv2d_fwd, &cudnn_conv2d_bwd_data,
                                             &cudnn_conv2d_bwd_filter};
  static const ops_pass passes[3] = {OPS_PASS_FWD, OPS_PASS_BWD_DATA, OPS_PASS_BWD_FILTER};
  bp_abi_kernel kernels[3];
  const bp_abi_kernel *table[3];
  for (int i = 0; i < 3; i++) {
    ctx->users[i] = (cudnn_user){ctx, passes[i]};
    kernels[i] = *templates[i];
    kernels[i].user = &ctx->users[i];
    if (passes[i] != OPS_PASS_FWD) kernels[i].flags |= det;
    table[i] = &kernels[i];
  }
  rc = ops_register_kernels(host, CUDNN_MODULE_NAME, table, 3);
  if (rc != BP_ABI_OK) {
    cudnn_fini_ctx(ctx); /* a failed init_ctx frees its own context */
    return rc;
  }
  const size_t v = cudnnGetVersion();
  char message[256];
  snprintf(message, sizeof message, "%s: cuDNN %zu.%zu.%zu, FP32 TF32 %s, %s backward algorithms",
           CUDNN_MODULE_NAME, v / 10000, v / 100 % 100, v % 100,
           ctx->tf32 ? "on" : "off (BP_TF32=0)",
           ctx->deterministic ? "deterministic (BP_DETERMINISTIC=1)" : "any");
  ops_host_log(host, BP_ABI_LOG_INFO, message);
  *ctx_out = ctx;
  return BP_ABI_OK;
}

static const bp_abi_module cudnn_module = {
    .struct_size = sizeof(bp_abi_module),
    .abi_major = BP_ABI_MAJOR,
    .abi_minor_built = BP_ABI_MINOR,
    .abi_minor_required = 6, /* init_ctx; per-node state (1.4) */
    .name = CUDNN_MODULE_NAME,
    .version = BP_OPS_CUDNN_VERSION,
    .build_id = BP_OPS_CUDNN_BUILD_ID,
    .init_ctx = cudnn_init_ctx,
    .fini_ctx = cudnn_fini_ctx,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &cudnn_module; }
