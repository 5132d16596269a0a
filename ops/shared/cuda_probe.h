/* What a CUDA op module's init checks before it registers anything: that
 * the CUDA runtime finds a driver and at least one device. Without them
 * the module refuses itself with the runtime's reason, which the loader
 * records and `blueprint plugins` prints, and registers nothing (so a
 * machine without a GPU still loads every other module and trains on the
 * CPU). Plain C calling cudart; compiled into ops/cuda, ops/cudnn and
 * ops/cublas. */
#ifndef BP_OPS_SHARED_CUDA_PROBE_H
#define BP_OPS_SHARED_CUDA_PROBE_H

#include <stdio.h>

#include <cuda_runtime_api.h>

#include "bp_abi.h"

/* BP_ABI_OK when a device is usable; else host->error gets
 * "<module>: <why>" and the result is BP_ABI_ERR_UNSUPPORTED. */
static inline int ops_cuda_probe(const bp_abi_host *host, const char *module) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  char message[320];
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(message, sizeof message, "%s: no usable CUDA device: %s (%s)", module,
             cudaGetErrorString(err), cudaGetErrorName(err));
  } else if (count == 0) {
    snprintf(message, sizeof message, "%s: no usable CUDA device: the driver reports 0 devices",
             module);
  } else {
    return BP_ABI_OK;
  }
  if (host->error) host->error(host->ctx, message);
  return BP_ABI_ERR_UNSUPPORTED;
}

#endif
