/* A well-behaved module: a kernel for a built-in op (relu.fwd) and a new
 * op kind (test.double) with its kernel. */
#include "test_module.h"

static tm_stats stats;

static int64_t elements(const bp_abi_tensor *t) {
  return t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
}

/* y = max(x, 0); fp32, compact, may run in place. */
static int relu_run(void *user, const bp_abi_kernel_args *a) {
  ((tm_stats *)user)->runs[0]++;
  const float *x = a->input_ptrs[0];
  float *y = a->output_ptrs[0];
  for (int64_t i = 0; i < elements(&a->inputs[0]); i++) y[i] = x[i] > 0 ? x[i] : 0;
  return BP_ABI_OK;
}

/* y = 2x; fp32, compact. */
static int double_run(void *user, const bp_abi_kernel_args *a) {
  ((tm_stats *)user)->runs[1]++;
  const float *x = a->input_ptrs[0];
  float *y = a->output_ptrs[0];
  for (int64_t i = 0; i < elements(&a->inputs[0]); i++) y[i] = 2 * x[i];
  return BP_ABI_OK;
}

static const bp_abi_op double_op = {sizeof(bp_abi_op), "test.double", 1, 1, 0, 0, NULL};

static const bp_abi_kernel kernels[] = {
    {sizeof(bp_abi_kernel), "relu.fwd", "good", "cpu", BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), 5,
     BP_ABI_KERNEL_DETERMINISTIC | BP_ABI_KERNEL_IN_PLACE, NULL, NULL, relu_run, &stats},
    {sizeof(bp_abi_kernel), "test.double", "plain", "cpu", BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), 0,
     BP_ABI_KERNEL_DETERMINISTIC, NULL, NULL, double_run, &stats},
};

static int init(const bp_abi_host *host) {
  int rc = host->register_op(host->ctx, &double_op);
  for (size_t i = 0; rc == BP_ABI_OK && i < sizeof kernels / sizeof kernels[0]; i++)
    rc = host->register_kernel(host->ctx, &kernels[i]);
  return rc;
}

TM_MODULE("test-good", init)
