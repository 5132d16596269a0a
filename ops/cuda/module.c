/* The CUDA op module: its ABI entry (the only exported symbol). Init
 * refuses the module, with the runtime's reason, where no driver or device
 * exists (ops/shared/cuda_probe.h); otherwise it registers the range
 * family (range.c) and the layer family (nn.c), device "cuda",
 * implementation "cuda". */
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "cuda-impl.h"
#include "module_register.h"
#include "shared/cuda_probe.h"
#ifdef BP_OPS_CUDA_BUILD_ID_HEADER
#include "build_id.h" /* generated: a hash of the sources and compiler settings */
#endif

#ifndef BP_OPS_CUDA_VERSION
#define BP_OPS_CUDA_VERSION "0.0.0"
#endif
#ifndef BP_OPS_CUDA_BUILD_ID
#define BP_OPS_CUDA_BUILD_ID "unknown"
#endif

int cuda_launch_result(const bp_abi_kernel_args *args, const char *what, int cuda_error) {
  if (cuda_error == 0) return BP_ABI_OK;
  const cudaError_t err = (cudaError_t)cuda_error;
  if (args->reason && args->reason_size)
    snprintf(args->reason, args->reason_size, "%s: %s (%s)", what, cudaGetErrorString(err),
             cudaGetErrorName(err));
  return err == cudaErrorMemoryAllocation ? BP_ABI_ERR_NOMEM : BP_ABI_ERR_DEVICE;
}

static int cuda_init(const bp_abi_host *host) {
  int rc = ops_cuda_probe(host, "ops-cuda");
  if (rc == BP_ABI_OK)
    rc = ops_register_kernels(host, "ops-cuda", cuda_range_kernels, cuda_range_kernel_count);
  if (rc == BP_ABI_OK)
    rc = ops_register_kernels(host, "ops-cuda", cuda_nn_kernels, cuda_nn_kernel_count);
  return rc;
}

static const bp_abi_module cuda_module = {
    .struct_size = sizeof(bp_abi_module),
    .abi_major = BP_ABI_MAJOR,
    .abi_minor_built = BP_ABI_MINOR,
    .abi_minor_required = 5, /* the AMP ops and inputs (range.unscale, loss_scale, skip) */
    .name = "ops-cuda",
    .version = BP_OPS_CUDA_VERSION,
    .build_id = BP_OPS_CUDA_BUILD_ID,
    .init = cuda_init,
    .fini = NULL,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &cuda_module; }
