/* The reference op module: its ABI entry (the only exported symbol) and the
 * table of kernels it registers. Every kernel is plain C, FP32 (the range
 * ops also take FP16 and other dtypes where range.c says so), device
 * "cpu", implementation "reference", flagged REFERENCE | DETERMINISTIC
 * (relu and range.scale add IN_PLACE), priority 0: the host picks one only
 * when no other kernel supports a node, and tests use them as the oracle. */
#include <stdio.h>

#include "reference-impl.h"
#ifdef BP_OPS_REFERENCE_BUILD_ID_HEADER
#include "build_id.h" /* generated: a hash of the sources and compiler settings */
#endif

#ifndef BP_OPS_REFERENCE_VERSION
#define BP_OPS_REFERENCE_VERSION "0.0.0"
#endif
#ifndef BP_OPS_REFERENCE_BUILD_ID
#define BP_OPS_REFERENCE_BUILD_ID "unknown"
#endif

static const bp_abi_kernel *const ref_kernels[] = {
    &ref_conv2d_fwd,          &ref_conv2d_bwd_data,    &ref_conv2d_bwd_filter,
    &ref_fc_fwd,              &ref_fc_bwd_data,        &ref_fc_bwd_filter,
    &ref_relu_fwd,            &ref_relu_bwd,           &ref_add_fwd,
    &ref_add_bwd,             &ref_maxpool_fwd,        &ref_maxpool_bwd,
    &ref_avgpool_fwd,         &ref_avgpool_bwd,        &ref_global_avgpool_fwd,
    &ref_global_avgpool_bwd,  &ref_batchnorm_fwd_train, &ref_batchnorm_fwd_eval,
    &ref_batchnorm_bwd,       &ref_softmax_ce_fwd_bwd,
    &ref_range_zero,          &ref_range_copy,         &ref_range_scale,
    &ref_range_cast,          &ref_range_ema,          &ref_range_nan_check,
    &ref_range_sgd,           &ref_range_adamw,        &ref_range_lars,
};

static void host_error(const bp_abi_host *host, const char *message) {
  if (host->struct_size >= offsetof(bp_abi_host, error) + sizeof host->error && host->error)
    host->error(host->ctx, message);
}

/* Registers every kernel of the table, in order. The host stages the
 * registrations and keeps none of them when init fails. */
static int ref_init(const bp_abi_host *host) {
  if (!host) return BP_ABI_ERR_INVALID;
  if (host->struct_size < offsetof(bp_abi_host, register_kernel) + sizeof host->register_kernel ||
      !host->register_kernel) {
    host_error(host, "ops-reference: the host offers no register_kernel");
    return BP_ABI_ERR_UNSUPPORTED;
  }
  if (host->abi_major != BP_ABI_MAJOR) {
    char message[128];
    snprintf(message, sizeof message, "ops-reference: host ABI major %u, module built for %d",
             (unsigned)host->abi_major, BP_ABI_MAJOR);
    host_error(host, message);
    return BP_ABI_ERR_UNSUPPORTED;
  }
  for (size_t i = 0; i < sizeof ref_kernels / sizeof ref_kernels[0]; i++) {
    const int rc = host->register_kernel(host->ctx, ref_kernels[i]);
    if (rc != BP_ABI_OK) {
      char message[160];
      snprintf(message, sizeof message, "ops-reference: registering %s (%s, %s) failed with %d",
               ref_kernels[i]->op, ref_kernels[i]->impl, ref_kernels[i]->device, rc);
      host_error(host, message);
      return rc;
    }
  }
  return BP_ABI_OK;
}

static const bp_abi_module ref_module = {
    sizeof(bp_abi_module),    BP_ABI_MAJOR, BP_ABI_MINOR, 0, 0, "ops-reference",
    BP_OPS_REFERENCE_VERSION, BP_OPS_REFERENCE_BUILD_ID, ref_init, NULL,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &ref_module; }
