/* The op kinds the host knows before any module loads (abi/bp_abi_ops.h is
 * their contract: tensor lists and attribute blocks). Modules register
 * kernels for these, or add kinds of their own. Counts are the most
 * tensors an op takes: optional trailing tensors (a bias and its
 * gradient, dlogits) are present only when the attribute block says so,
 * and kernels check the exact list in supports(). Entries are only
 * appended. */
#include "bp_abi_ops.h"
#include "registry-impl.h"

#define BP_OP(name, in, out, attrs) \
  {sizeof(bp_abi_op), name, in, out, sizeof(attrs), BP_ABI_ATTR_VERSION, NULL}

static const bp_abi_op builtin_ops[] = {
    /* x, w, [b] -> y | dy, w -> dx | x, dy -> dw, [db] */
    BP_OP("conv2d.fwd", 3, 1, bp_conv2d_attrs),
    BP_OP("conv2d.bwd_data", 2, 1, bp_conv2d_attrs),
    BP_OP("conv2d.bwd_filter", 2, 2, bp_conv2d_attrs),
    BP_OP("fc.fwd", 3, 1, bp_fc_attrs),
    BP_OP("fc.bwd_data", 2, 1, bp_fc_attrs),
    BP_OP("fc.bwd_filter", 2, 2, bp_fc_attrs),
    /* x -> y | y, dy -> dx | a, b -> y | dy -> da, db */
    BP_OP("relu.fwd", 1, 1, bp_elementwise_attrs),
    BP_OP("relu.bwd", 2, 1, bp_elementwise_attrs),
    BP_OP("add.fwd", 2, 1, bp_elementwise_attrs),
    BP_OP("add.bwd", 1, 2, bp_elementwise_attrs),
    /* x -> y, mask | dy, mask -> dx | x -> y | dy -> dx */
    BP_OP("maxpool.fwd", 1, 2, bp_pool_attrs),
    BP_OP("maxpool.bwd", 2, 1, bp_pool_attrs),
    BP_OP("avgpool.fwd", 1, 1, bp_pool_attrs),
    BP_OP("avgpool.bwd", 1, 1, bp_pool_attrs),
    BP_OP("global_avgpool.fwd", 1, 1, bp_elementwise_attrs),
    BP_OP("global_avgpool.bwd", 1, 1, bp_elementwise_attrs),
    /* x, gamma, beta, running_mean, running_var -> y, save_mean,
     * save_invstd, running_mean, running_var | ... -> y |
     * x, dy, gamma, save_mean, save_invstd -> dx, dgamma, dbeta */
    BP_OP("batchnorm.fwd_train", 5, 5, bp_batchnorm_attrs),
    BP_OP("batchnorm.fwd_eval", 5, 1, bp_batchnorm_attrs),
    BP_OP("batchnorm.bwd", 5, 3, bp_batchnorm_attrs),
    /* logits, labels, [loss_scale] -> loss, correct, [dlogits] */
    BP_OP("softmax_ce.fwd_bwd", 3, 3, bp_softmax_ce_attrs),
    /* spans, each one tensor [1,1,1,elements] */
    BP_OP("range.zero", 0, 1, bp_range_attrs),
    BP_OP("range.copy", 1, 1, bp_range_attrs),
    BP_OP("range.scale", 1, 1, bp_range_attrs),
    BP_OP("range.cast", 1, 1, bp_range_attrs),
    BP_OP("range.ema", 2, 1, bp_range_attrs), /* w, [skip] -> e */
    BP_OP("range.nan_check", 1, 1, bp_range_attrs),
    /* grad, lr, [skip] -> w, m | grad, lr, step, [skip] -> w, m, v |
     * grad, lr, segments, [skip] -> w, m, norms */
    BP_OP("range.sgd", 3, 2, bp_optimizer_attrs),
    BP_OP("range.adamw", 4, 3, bp_optimizer_attrs),
    BP_OP("range.lars", 4, 3, bp_optimizer_attrs),
    /* x -> x, summed over ranks */
    BP_OP("allreduce.sum", 1, 1, bp_allreduce_attrs),
    /* x -> x: this rank's chunk summed | every chunk from its owner */
    BP_OP("allreduce.reduce_scatter", 1, 1, bp_allreduce_attrs),
    {sizeof(bp_abi_op), "allreduce.all_gather", 1, 1, 0, BP_ABI_ATTR_VERSION, NULL},
    /* (1.5) mixed precision: fp16 src, scale -> fp32 dst | found_inf ->
     * scale, good_steps, step, skipped */
    BP_OP("range.unscale", 2, 1, bp_range_attrs),
    BP_OP("range.loss_scale", 1, 4, bp_loss_scale_attrs),
    /* batch norm then relu in one pass: as batchnorm.*, y = relu(BN(x));
     * bwd: x, dy, gamma, save_mean, save_invstd, y -> dx, dgamma, dbeta */
    BP_OP("batchnorm_relu.fwd_train", 5, 5, bp_batchnorm_attrs),
    BP_OP("batchnorm_relu.fwd_eval", 5, 1, bp_batchnorm_attrs),
    BP_OP("batchnorm_relu.bwd", 6, 3, bp_batchnorm_attrs),
};

const bp_abi_op *bp_builtin_ops(int *count_out) {
  *count_out = (int)(sizeof builtin_ops / sizeof builtin_ops[0]);
  return builtin_ops;
}
