/* Kernels for selection tests, registered in an order that is not the
 * priority order:
 *   relu.fwd/ref   REFERENCE, priority 0, fp32+fp16, supports everything
 *   relu.fwd/fast  priority 10, fp32, supports C % 8 == 0
 *   relu.fwd/mid   priority 5, fp32, supports N <= 64
 *   relu.fwd/half  priority 20, fp16 only
 *   add.fwd/ref    REFERENCE, the only add kernel
 * None of them run in the tests that only select; run() counts calls. */
#include <stdio.h>

#include "test_module.h"

static tm_stats stats;

static int run(void *user, const bp_abi_kernel_args *a) {
  (void)a;
  ((tm_stats *)user)->runs[0]++;
  return BP_ABI_OK;
}

static int fast_supports(void *user, const bp_abi_kernel_args *a, char *reason, size_t size) {
  ((tm_stats *)user)->supports++;
  if (a->inputs[0].shape[3] % 8 == 0) return 1;
  snprintf(reason, size, "C=%lld is not a multiple of 8", (long long)a->inputs[0].shape[3]);
  return 0;
}

static int mid_supports(void *user, const bp_abi_kernel_args *a, char *reason, size_t size) {
  ((tm_stats *)user)->supports++;
  if (a->inputs[0].shape[0] <= 64) return 1;
  snprintf(reason, size, "batch N=%lld is over 64", (long long)a->inputs[0].shape[0]);
  return 0;
}

#define BIT(d) BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_##d)

static const bp_abi_kernel kernels[] = {
    {sizeof(bp_abi_kernel), "relu.fwd", "ref", "cpu", BIT(FP32) | BIT(FP16), 0,
     BP_ABI_KERNEL_REFERENCE | BP_ABI_KERNEL_DETERMINISTIC, NULL, NULL, run, &stats},
    {sizeof(bp_abi_kernel), "relu.fwd", "fast", "cpu", BIT(FP32), 10, 0, fast_supports, NULL, run,
     &stats},
    {sizeof(bp_abi_kernel), "relu.fwd", "mid", "cpu", BIT(FP32), 5, 0, mid_supports, NULL, run,
     &stats},
    {sizeof(bp_abi_kernel), "relu.fwd", "half", "cpu", BIT(FP16), 20, 0, NULL, NULL, run, &stats},
    {sizeof(bp_abi_kernel), "add.fwd", "ref", "cpu", BIT(FP32), 0, BP_ABI_KERNEL_REFERENCE, NULL,
     NULL, run, &stats},
};

static int init(const bp_abi_host *host) {
  int rc = BP_ABI_OK;
  for (size_t i = 0; rc == BP_ABI_OK && i < sizeof kernels / sizeof kernels[0]; i++)
    rc = host->register_kernel(host->ctx, &kernels[i]);
  return rc;
}

TM_MODULE("test-select", init)
