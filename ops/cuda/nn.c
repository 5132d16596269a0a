/* ops/cuda: the layer family's kernel table (registered by module.c) and
 * the tensor views its run() functions hand to the launchers. The kernels
 * are in nn_ew.c (relu, add), nn_pool.c (max, avg and global-avg pooling),
 * nn_bn.c (batch norm), nn_ce.c (softmax cross-entropy) and nn_vit.c
 * (gelu_tanh, layernorm, pos_embed), each with its
 * .cu file; nn-impl.h says what they share. */
#include "nn-impl.h"

const bp_abi_kernel *const cuda_nn_kernels[] = {
    &cuda_relu_fwd_kernel,     &cuda_relu_bwd_kernel,     &cuda_add_fwd_kernel,
    &cuda_add_bwd_kernel,      &cuda_maxpool_fwd_kernel,  &cuda_maxpool_bwd_kernel,
    &cuda_avgpool_fwd_kernel,  &cuda_avgpool_bwd_kernel,  &cuda_gap_fwd_kernel,
    &cuda_gap_bwd_kernel,      &cuda_bn_fwd_train_kernel, &cuda_bn_fwd_eval_kernel,
    &cuda_bn_bwd_kernel,       &cuda_softmax_ce_kernel,   &cuda_attention_fwd_kernel,
    &cuda_attention_bwd_kernel,
    &cuda_bn_bwd_kernel,       &cuda_softmax_ce_kernel,
    /* the ViT ops (nn_vit.c) */
    &cuda_gelu_tanh_fwd_kernel, &cuda_gelu_tanh_bwd_kernel, &cuda_ln_fwd_kernel,
    &cuda_ln_bwd_kernel,        &cuda_pos_embed_fwd_kernel, &cuda_pos_embed_bwd_kernel,
};
const size_t cuda_nn_kernel_count = sizeof cuda_nn_kernels / sizeof cuda_nn_kernels[0];

cuda_nhwc cuda_nn_tensor(const bp_abi_tensor *t) {
  cuda_nhwc v = {t->shape[0],  t->shape[1],  t->shape[2],  t->shape[3],
                 t->stride[0], t->stride[1], t->stride[2], t->stride[3],
                 t->dtype == BP_ABI_DTYPE_FP16};
  return v;
}

cuda_chan cuda_nn_channels(const bp_abi_tensor *t, const void *p) {
  cuda_chan v = {(void *)(uintptr_t)p, t->stride[3], t->dtype == BP_ABI_DTYPE_FP16};
  return v;
}

int cuda_nn_run_ok(void *user, const bp_abi_kernel_args *args) {
  const ops_fp16_kernel *k = (const ops_fp16_kernel *)user;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  return ops_fp16_supports(user, args, reason, rs) &&
         bp_sdk_check_ptrs(args, k->alias_out, k->alias_in, k->alias_count, reason, rs);
}

int cuda_nn_workspace_ok(const bp_abi_kernel_args *args, uint64_t need) {
  if (args->workspace && args->workspace_bytes >= need) return 1;
  bp_sdk_set_reason(args, "workspace of %llu bytes, needs %llu",
                    (unsigned long long)(args->workspace ? args->workspace_bytes : 0),
                    (unsigned long long)need);
  return 0;
}
