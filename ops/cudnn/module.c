/* The cuDNN op module (bp_ops_cudnn.so): its ABI entry (the only exported
 * symbol), the settings read at init, the shared heuristics handle and
 * status reasons. Kernels: conv2d.c (README.md).
 *
 * Init refuses the module, with the reason `blueprint plugins` prints,
 * where there is no CUDA driver or device (ops/shared/cuda_probe.h), where
 * the cuDNN library found at load time is not of the major version the
 * module was built against, or where cuDNN cannot make a handle and a
 * convolution descriptor (its convolution library, libcudnn_cnn, is loaded
 * on first use: a missing one shows here, not at the first run). */
#include <pthread.h>
#include <stdio.h>

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

int cudnn_deterministic = 0;
int cudnn_tf32 = 1;

int cudnn_fail(char *reason, size_t rs, const char *what, cudnnStatus_t st) {
  char detail[256] = "";
  cudnnGetLastErrorString(detail, sizeof detail);
  return bp_sdk_fail(reason, rs, "cuDNN %s: %s%s%s%s", what, cudnnGetErrorString(st),
                     detail[0] ? " (" : "", detail, detail[0] ? ")" : "");
}

static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;
static cudnnHandle_t shared_handle;

int cudnn_with_shared_handle(int (*fn)(cudnnHandle_t handle, void *arg), void *arg,
                             char *reason, size_t rs) {
  pthread_mutex_lock(&shared_lock);
  int ok = 1;
  if (!shared_handle) {
    const cudnnStatus_t st = cudnnCreate(&shared_handle);
    if (st != CUDNN_STATUS_SUCCESS) {
      shared_handle = NULL;
      ok = cudnn_fail(reason, rs, "cudnnCreate", st);
    }
  }
  if (ok) ok = fn(shared_handle, arg);
  pthread_mutex_unlock(&shared_lock);
  return ok;
}

void cudnn_shared_handle_release(void) {
  pthread_mutex_lock(&shared_lock);
  if (shared_handle) cudnnDestroy(shared_handle);
  shared_handle = NULL;
  pthread_mutex_unlock(&shared_lock);
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

static int cudnn_init(const bp_abi_host *host) {
  int rc = ops_cuda_probe(host, CUDNN_MODULE_NAME);
  if (rc != BP_ABI_OK) return rc;
  rc = cudnn_check_library(host);
  if (rc != BP_ABI_OK) return rc;
  cudnn_deterministic = ops_cuda_option_deterministic(host);
  cudnn_tf32 = ops_cuda_option_tf32(host);
  const uint32_t det = cudnn_deterministic ? BP_ABI_KERNEL_DETERMINISTIC : 0;
  cudnn_conv2d_bwd_data.flags = BP_ABI_KERNEL_GRAPH_CAPTURABLE | det;
  cudnn_conv2d_bwd_filter.flags = BP_ABI_KERNEL_GRAPH_CAPTURABLE | det;
  const bp_abi_kernel *const kernels[] = {&cudnn_conv2d_fwd, &cudnn_conv2d_bwd_data,
                                          &cudnn_conv2d_bwd_filter};
  rc = ops_register_kernels(host, CUDNN_MODULE_NAME, kernels, sizeof kernels / sizeof kernels[0]);
  if (rc == BP_ABI_OK) {
    const size_t v = cudnnGetVersion();
    char message[256];
    snprintf(message, sizeof message,
             "%s: cuDNN %zu.%zu.%zu, FP32 TF32 %s, %s backward algorithms", CUDNN_MODULE_NAME,
             v / 10000, v / 100 % 100, v % 100, cudnn_tf32 ? "on" : "off (BP_TF32=0)",
             cudnn_deterministic ? "deterministic (BP_DETERMINISTIC=1)" : "any");
    ops_host_log(host, BP_ABI_LOG_INFO, message);
  }
  return rc;
}

static void cudnn_fini(void) { cudnn_shared_handle_release(); }

static const bp_abi_module cudnn_module = {
    .struct_size = sizeof(bp_abi_module),
    .abi_major = BP_ABI_MAJOR,
    .abi_minor_built = BP_ABI_MINOR,
    .abi_minor_required = 4, /* needs per-node state */
    .name = CUDNN_MODULE_NAME,
    .version = BP_OPS_CUDNN_VERSION,
    .build_id = BP_OPS_CUDNN_BUILD_ID,
    .init = cudnn_init,
    .fini = cudnn_fini,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &cudnn_module; }
