/* The reference op module: its ABI entry (the only exported symbol) and the
 * table of kernels it registers. Every kernel is plain C, FP32 (the range
 * ops also take FP16 and other dtypes where range.c says so; the compute
 * ops take FP16 through shared/fp16_adapter.h, reference-impl.h), device
 * "cpu", implementation "reference", flagged REFERENCE | DETERMINISTIC
 * (relu and range.scale add IN_PLACE), priority 0: the host picks one only
 * when no other kernel supports a node, and tests use them as the oracle. */
#include "module_register.h"
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
    &ref_batchnorm_relu_fwd_train, &ref_batchnorm_relu_fwd_eval, &ref_batchnorm_relu_bwd,
    &ref_range_zero,          &ref_range_copy,         &ref_range_scale,
    &ref_range_cast,          &ref_range_ema,          &ref_range_nan_check,
    &ref_range_sgd,           &ref_range_adamw,        &ref_range_lars,
    &ref_range_unscale,       &ref_range_loss_scale,    &ref_gelu_fwd,
    &ref_gelu_bwd,
    &ref_attention_fwd,       &ref_attention_bwd,
    /* the ViT ops */
    &ref_gelu_tanh_fwd,       &ref_gelu_tanh_bwd,
    &ref_layernorm_fwd,       &ref_layernorm_bwd,
    &ref_pos_embed_fwd,       &ref_pos_embed_bwd,
};

static int ref_init(const bp_abi_host *host) {
  return ops_register_kernels(host, "ops-reference", ref_kernels,
                              sizeof ref_kernels / sizeof ref_kernels[0]);
}

static const bp_abi_module ref_module = {
    .struct_size = sizeof(bp_abi_module),
    .abi_major = BP_ABI_MAJOR,
    .abi_minor_built = BP_ABI_MINOR,
    .abi_minor_required = 0,
    .name = "ops-reference",
    .version = BP_OPS_REFERENCE_VERSION,
    .build_id = BP_OPS_REFERENCE_BUILD_ID,
    .init = ref_init,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &ref_module; }
