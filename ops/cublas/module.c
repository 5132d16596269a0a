/* The cuBLAS op module (bp_ops_cublas.so): its ABI entry (the only
 * exported symbol), the TF32 switch read at init and status reasons.
 * Kernels: fc.c (README.md).
 *
 * Init refuses the module, with the reason `blueprint plugins` prints,
 * where there is no CUDA driver or device (ops/shared/cuda_probe.h) or
 * where cuBLAS cannot make a handle. */
#include <stdio.h>
#include <stdlib.h>

#include "cublas-impl.h"
#include "module_register.h"
#include "shared/cuda_probe.h"
#include "shared/cuda_weighted.h"
#ifdef BP_OPS_CUBLAS_BUILD_ID_HEADER
#include "build_id.h" /* generated: a hash of the sources and compiler settings */
#endif

#ifndef BP_OPS_CUBLAS_VERSION
#define BP_OPS_CUBLAS_VERSION "0.0.0"
#endif
#ifndef BP_OPS_CUBLAS_BUILD_ID
#define BP_OPS_CUBLAS_BUILD_ID "unknown"
#endif

#define CUBLAS_MODULE_NAME "ops-cublas"

int cublas_fail(char *reason, size_t rs, const char *what, cublasStatus_t st) {
  return bp_sdk_fail(reason, rs, "cuBLAS %s: %s: %s", what, cublasGetStatusName(st),
                     cublasGetStatusString(st));
}

static const bp_abi_kernel *const cublas_kernels[] = {
    &cublas_fc_fwd,
    &cublas_fc_bwd_data,
    &cublas_fc_bwd_filter,
};

/* One registry's view of the module: one kernel user per pass. */
typedef struct cublas_ctx {
  cublas_user users[3];
} cublas_ctx;

static void cublas_fini_ctx(void *ctx) { free(ctx); }

static int cublas_init_ctx(const bp_abi_host *host, void **ctx_out) {
  int rc = ops_cuda_probe(host, CUBLAS_MODULE_NAME);
  if (rc != BP_ABI_OK) return rc;
  cublasHandle_t handle = NULL;
  const cublasStatus_t st = cublasCreate(&handle);
  char message[320];
  if (st != CUBLAS_STATUS_SUCCESS) {
    char what[256];
    cublas_fail(what, sizeof what, "cublasCreate", st);
    snprintf(message, sizeof message, "%s: %s", CUBLAS_MODULE_NAME, what);
    if (host->error) host->error(host->ctx, message);
    return BP_ABI_ERR_UNSUPPORTED;
  }
  int version = 0;
  if (cublasGetVersion(handle, &version) != CUBLAS_STATUS_SUCCESS) version = 0;
  cublasDestroy(handle);
  cublas_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) {
    snprintf(message, sizeof message, "%s: out of memory for the context", CUBLAS_MODULE_NAME);
    if (host->error) host->error(host->ctx, message);
    return BP_ABI_ERR_NOMEM;
  }
  const int tf32 = ops_cuda_option_tf32(host);
  static const ops_pass passes[3] = {OPS_PASS_FWD, OPS_PASS_BWD_DATA, OPS_PASS_BWD_FILTER};
  bp_abi_kernel kernels[3];
  const bp_abi_kernel *table[3];
  for (int i = 0; i < 3; i++) {
    ctx->users[i] = (cublas_user){tf32, passes[i]};
    kernels[i] = *cublas_kernels[i];
    kernels[i].user = &ctx->users[i];
    table[i] = &kernels[i];
  }
  rc = ops_register_kernels(host, CUBLAS_MODULE_NAME, table, 3);
  if (rc != BP_ABI_OK) {
    free(ctx); /* a failed init_ctx frees its own context */
    return rc;
  }
  snprintf(message, sizeof message, "%s: cuBLAS %d.%d.%d, FP32 TF32 %s", CUBLAS_MODULE_NAME,
           version / 10000, version / 100 % 100, version % 100, tf32 ? "on" : "off (BP_TF32=0)");
  ops_host_log(host, BP_ABI_LOG_INFO, message);
  *ctx_out = ctx;
  return BP_ABI_OK;
}

static const bp_abi_module cublas_module = {
    .struct_size = sizeof(bp_abi_module),
    .abi_major = BP_ABI_MAJOR,
    .abi_minor_built = BP_ABI_MINOR,
    .abi_minor_required = 6, /* init_ctx; per-node state (1.4) */
    .name = CUBLAS_MODULE_NAME,
    .version = BP_OPS_CUBLAS_VERSION,
    .build_id = BP_OPS_CUBLAS_BUILD_ID,
    .init_ctx = cublas_init_ctx,
    .fini_ctx = cublas_fini_ctx,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &cublas_module; }
