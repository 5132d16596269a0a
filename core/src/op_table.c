/* The built-in op table (blueprint/op_table.h): one entry per op kind the
 * host knows before any module loads. abi/bp_abi_ops.h is each op's
 * contract (tensor lists, attribute block); an entry adds what the host,
 * validate and the profile need to know about it. Counts are the most
 * tensors an op takes: optional trailing tensors (a bias and its
 * gradient, dlogits, a skip input) are present only when the attribute
 * block says so, and kernels check the exact list in supports(). Entries
 * are only appended. */
#include <stddef.h>
#include <string.h>

#include "blueprint/graph.h"
#include "blueprint/op_table.h"
#include "bp_abi_ops.h"
#include "registry-impl.h"

_Static_assert(BP_OP_MAX_TENSORS == BP_NODE_MAX_TENSORS, "one tensor limit");

#define ABI(name, in, out, attrs) \
  .abi = {sizeof(bp_abi_op), name, in, out, sizeof(attrs), BP_ABI_ATTR_VERSION, NULL}
#define ACCUMULATES(attrs) .accumulates = 1, .accumulate_offset = offsetof(attrs, accumulate)
#define INPLACE(i) .has_inplace = 1, .inplace_in = i
#define SKIP(i, attrs) .has_skip = 1, .skip_in = i, .skip_flag_offset = offsetof(attrs, has_skip)
#define IN(i, kind, lo, hi) {0, i, BP_OP_FILL_##kind, 0, lo, hi}
#define RMW(o, kind, lo, hi) {1, o, BP_OP_FILL_##kind, 1, lo, hi}
#define FLOPS(rows, weight) .has_flops = 1, .flops_rows = rows, .flops_weight = weight
#define I(i) {0, i}
#define O(i) {1, i}
#define GRAD_OF(fwd, ...) .grad_of = fwd, .grad_in = {__VA_ARGS__}
#define BIT(i) (1u << (i))
#define FROM(i) ((BP_OP_ALL << (i)) & BP_OP_ALL) /* tensors i and after */

/* batch norm's value ranges: positive scales and variances */
#define BN_FWD_FILLS .fills = {IN(1, UNIFORM, 0.5, 1.5), IN(4, UNIFORM, 0.5, 1.5)}
#define BN_BWD_FILLS IN(2, UNIFORM, 0.5, 1.5), IN(4, UNIFORM, 0.5, 2.0)
/* an optimizer's weight and momentum: read, then written */
#define OPT_STATE RMW(0, UNIFORM, -1, 1), RMW(1, UNIFORM, -0.1, 0.1)

static const bp_op_info table[] = {
    /* x, w, [b] -> y | dy, w -> dx | x, dy -> dw, [db] */
    {ABI("conv2d.fwd", 3, 1, bp_conv2d_attrs), .amp_param_in = FROM(1), .amp_first_in = BIT(0),
     FLOPS(O(0), I(1)), .grad_check = 1},
    {ABI("conv2d.bwd_data", 2, 1, bp_conv2d_attrs), ACCUMULATES(bp_conv2d_attrs),
     .amp_param_in = BIT(1), FLOPS(I(0), I(1)), GRAD_OF("conv2d.fwd", {'r', 0}, {'x', 1}),
     .grad_out = {0}},
    {ABI("conv2d.bwd_filter", 2, 2, bp_conv2d_attrs), ACCUMULATES(bp_conv2d_attrs),
     .amp_param_out = BP_OP_ALL, .amp_first_in = BIT(0), FLOPS(I(1), O(0)),
     GRAD_OF("conv2d.fwd", {'x', 0}, {'r', 0}), .grad_out = {1, 2}},
    {ABI("fc.fwd", 3, 1, bp_fc_attrs), .amp_param_in = FROM(1), .amp_first_in = BIT(0),
     FLOPS(O(0), I(1)), .grad_check = 1},
    {ABI("fc.bwd_data", 2, 1, bp_fc_attrs), ACCUMULATES(bp_fc_attrs), .amp_param_in = BIT(1),
     FLOPS(I(0), I(1)), GRAD_OF("fc.fwd", {'r', 0}, {'x', 1}), .grad_out = {0}},
    {ABI("fc.bwd_filter", 2, 2, bp_fc_attrs), ACCUMULATES(bp_fc_attrs),
     .amp_param_out = BP_OP_ALL, .amp_first_in = BIT(0), FLOPS(I(1), O(0)),
     GRAD_OF("fc.fwd", {'x', 0}, {'r', 0}), .grad_out = {1, 2}},
    /* x -> y | y, dy -> dx (may alias dy) | a, b -> y | dy -> da, db */
    {ABI("relu.fwd", 1, 1, bp_elementwise_attrs), .cases = BP_OP_CASES_SAME_SHAPE, INPLACE(0),
     .fp16_tolerance = BP_OP_TOL_SELECT, .grad_check = 1, .grad_kink = 1},
    {ABI("relu.bwd", 2, 1, bp_elementwise_attrs), .cases = BP_OP_CASES_SAME_SHAPE,
     ACCUMULATES(bp_elementwise_attrs), INPLACE(1), .fills = {IN(0, RELU_Y, -1, 1)},
     .fp16_tolerance = BP_OP_TOL_SELECT, GRAD_OF("relu.fwd", {'y', 0}, {'r', 0}), .grad_out = {0}},
    {ABI("add.fwd", 2, 1, bp_elementwise_attrs), .cases = BP_OP_CASES_SAME_SHAPE,
     .fp16_tolerance = BP_OP_TOL_SELECT, .grad_check = 1},
    {ABI("add.bwd", 1, 2, bp_elementwise_attrs), .cases = BP_OP_CASES_SAME_SHAPE,
     ACCUMULATES(bp_elementwise_attrs), .fp16_tolerance = BP_OP_TOL_SELECT,
     GRAD_OF("add.fwd", {'r', 0}), .grad_out = {0, 1}},
    /* x -> y, mask | dy, mask -> dx | x -> y | dy -> dx */
    {ABI("maxpool.fwd", 1, 2, bp_pool_attrs), .fp16_tolerance = BP_OP_TOL_SELECT,
     .grad_check = 1, .grad_kink = 2},
    {ABI("maxpool.bwd", 2, 1, bp_pool_attrs), ACCUMULATES(bp_pool_attrs),
     .fills = {IN(1, POOL_MASK, 0, 0)}, .fp16_tolerance = BP_OP_TOL_SELECT,
     GRAD_OF("maxpool.fwd", {'r', 0}, {'y', 1}), .grad_out = {0}},
    {ABI("avgpool.fwd", 1, 1, bp_pool_attrs), .fp16_tolerance = BP_OP_TOL_WINDOW,
     .grad_check = 1},
    {ABI("avgpool.bwd", 1, 1, bp_pool_attrs), ACCUMULATES(bp_pool_attrs),
     .fp16_tolerance = BP_OP_TOL_WINDOW, GRAD_OF("avgpool.fwd", {'r', 0}), .grad_out = {0}},
    {ABI("global_avgpool.fwd", 1, 1, bp_elementwise_attrs), .fp16_tolerance = BP_OP_TOL_WINDOW,
     .grad_check = 1},
    {ABI("global_avgpool.bwd", 1, 1, bp_elementwise_attrs), ACCUMULATES(bp_elementwise_attrs),
     .fp16_tolerance = BP_OP_TOL_WINDOW, GRAD_OF("global_avgpool.fwd", {'r', 0}),
     .grad_out = {0}},
    /* x, gamma, beta, running_mean, running_var -> y, save_mean,
     * save_invstd, running_mean, running_var (in place) | ... -> y |
     * x, dy, gamma, save_mean, save_invstd -> dx, dgamma, dbeta */
    {ABI("batchnorm.fwd_train", 5, 5, bp_batchnorm_attrs), BN_FWD_FILLS,
     .alias_outputs = BIT(3) | BIT(4), .fp16_tolerance = BP_OP_TOL_REDUCTION,
     .amp_fp32_in = FROM(3), .amp_fp32_out = FROM(1), .amp_param_in = BIT(1) | BIT(2),
     .grad_check = 1, .grad_kink = 3},
    {ABI("batchnorm.fwd_eval", 5, 1, bp_batchnorm_attrs), BN_FWD_FILLS,
     .fp16_tolerance = BP_OP_TOL_REDUCTION, .amp_fp32_in = FROM(3),
     .amp_param_in = BIT(1) | BIT(2)},
    {ABI("batchnorm.bwd", 5, 3, bp_batchnorm_attrs), ACCUMULATES(bp_batchnorm_attrs),
     .fills = {BN_BWD_FILLS}, .fp16_tolerance = BP_OP_TOL_REDUCTION, .amp_fp32_in = FROM(3),
     .amp_param_in = BIT(2), .amp_param_out = FROM(1),
     GRAD_OF("batchnorm.fwd_train", {'x', 0}, {'r', 0}, {'x', 1}, {'y', 1}, {'y', 2}),
     .grad_out = {0, 1, 2}},
    /* logits, labels, [loss_scale] -> loss, correct (both accumulate
     * across steps), [dlogits] */
    {ABI("softmax_ce.fwd_bwd", 3, 3, bp_softmax_ce_attrs),
     .fills = {IN(1, CLASS, 0, 0), IN(0, UNIFORM, -3, 3), RMW(0, UNIFORM, 0, 4), RMW(1, INT, 0, 5),
               IN(2, CONST, 1024, 0)},
     .fp16_tolerance = BP_OP_TOL_REDUCTION, .amp_fp32_in = FROM(2),
     .amp_fp32_out = BIT(0) | BIT(1), .grad_check = 1},
    /* spans, each one tensor [1,1,1,elements] */
    {ABI("range.zero", 0, 1, bp_range_attrs), .fp16_tolerance = BP_OP_TOL_EXACT, .amp_none = 1},
    {ABI("range.copy", 1, 1, bp_range_attrs), .fp16_tolerance = BP_OP_TOL_EXACT, .amp_none = 1},
    {ABI("range.scale", 1, 1, bp_range_attrs), .alias_outputs = BIT(0),
     .fp16_tolerance = BP_OP_TOL_EXACT, .amp_none = 1},
    {ABI("range.cast", 1, 1, bp_range_attrs), .fp16_tolerance = BP_OP_TOL_EXACT, .amp_none = 1},
    /* w, [skip] -> e (read, then written) */
    {ABI("range.ema", 2, 1, bp_range_attrs), SKIP(1, bp_range_attrs),
     .fills = {RMW(0, UNIFORM, -1, 1)}, .fp16_tolerance = BP_OP_TOL_EXACT, .amp_none = 1},
    {ABI("range.nan_check", 1, 1, bp_range_attrs), .fills = {RMW(0, CONST, 0, 0)},
     .fp16_tolerance = BP_OP_TOL_EXACT, .amp_none = 1},
    /* grad, lr, [skip] -> w, m | grad, lr, step, [skip] -> w, m, v |
     * grad, lr, segments, [skip] -> w, m, norms */
    {ABI("range.sgd", 3, 2, bp_optimizer_attrs), SKIP(2, bp_optimizer_attrs),
     .fills = {IN(1, CONST, 0.1, 0), OPT_STATE}, .fp16_tolerance = BP_OP_TOL_EXACT,
     .amp_none = 1},
    {ABI("range.adamw", 4, 3, bp_optimizer_attrs), SKIP(3, bp_optimizer_attrs),
     .fills = {IN(1, CONST, 0.01, 0), IN(2, CONST, 3, 0), OPT_STATE, RMW(2, UNIFORM, 0, 0.01)},
     .fp16_tolerance = BP_OP_TOL_EXACT, .amp_none = 1},
    {ABI("range.lars", 4, 3, bp_optimizer_attrs), SKIP(3, bp_optimizer_attrs),
     .fills = {IN(1, CONST, 0.1, 0), IN(2, SEGMENTS, 0, 0), OPT_STATE},
     .fp16_tolerance = BP_OP_TOL_EXACT, .amp_none = 1},
    /* x -> x, summed over ranks */
    {ABI("allreduce.sum", 1, 1, bp_allreduce_attrs), .collective = 1,
     .fp16_tolerance = BP_OP_TOL_EXACT, .amp_none = 1},
    /* x -> x: this rank's chunk summed | every chunk from its owner */
    {ABI("allreduce.reduce_scatter", 1, 1, bp_allreduce_attrs), .collective = 1,
     .fp16_tolerance = BP_OP_TOL_EXACT, .amp_none = 1},
    {.abi = {sizeof(bp_abi_op), "allreduce.all_gather", 1, 1, 0, BP_ABI_ATTR_VERSION, NULL},
     .collective = 1, .fp16_tolerance = BP_OP_TOL_EXACT, .amp_none = 1},
    /* (1.5) mixed precision: fp16 src (gradients times the scale), scale
     * -> fp32 dst | found_inf -> scale, good_steps, step, skipped (each
     * read, then written) */
    {ABI("range.unscale", 2, 1, bp_range_attrs),
     .fills = {IN(0, UNIFORM, -1000, 1000), IN(1, CONST, 65536, 0)},
     .fp16_tolerance = BP_OP_TOL_EXACT, .amp_none = 1},
    {ABI("range.loss_scale", 1, 4, bp_loss_scale_attrs),
     .fills = {IN(0, CONST, 0, 0), RMW(0, CONST, 65536, 0), RMW(1, CONST, 5, 0),
               RMW(2, CONST, 10, 0), RMW(3, CONST, 2, 0)},
     .fp16_tolerance = BP_OP_TOL_EXACT, .amp_none = 1},
    /* batch norm then relu in one pass: as batchnorm.*, y = relu(BN(x));
     * bwd: x, dy, gamma, save_mean, save_invstd, y -> dx, dgamma, dbeta.
     * FP32 only: the graph fuses FP32 features */
    {ABI("batchnorm_relu.fwd_train", 5, 5, bp_batchnorm_attrs), BN_FWD_FILLS,
     .alias_outputs = BIT(3) | BIT(4), .fp16_tolerance = BP_OP_TOL_REDUCTION, .amp_none = 1},
    {ABI("batchnorm_relu.fwd_eval", 5, 1, bp_batchnorm_attrs), BN_FWD_FILLS,
     .fp16_tolerance = BP_OP_TOL_REDUCTION, .amp_none = 1},
    {ABI("batchnorm_relu.bwd", 6, 3, bp_batchnorm_attrs), ACCUMULATES(bp_batchnorm_attrs),
     .fills = {BN_BWD_FILLS, IN(5, RELU_Y, -1, 1)}, /* y: a relu output */
     .fp16_tolerance = BP_OP_TOL_REDUCTION, .amp_none = 1},
    /* x -> y | x, dy -> dx */
    {ABI("gelu.fwd", 1, 1, bp_elementwise_attrs), .cases = BP_OP_CASES_SAME_SHAPE,
     .fp16_tolerance = BP_OP_TOL_SELECT, .grad_check = 1},
    {ABI("gelu.bwd", 2, 1, bp_elementwise_attrs), ACCUMULATES(bp_elementwise_attrs),
     .cases = BP_OP_CASES_SAME_SHAPE, .fp16_tolerance = BP_OP_TOL_SELECT,
     GRAD_OF("gelu.fwd", {'x', 0}, {'r', 0}), .grad_out = {0}},
    /* multi-head self-attention: qkv -> y, lse (FP32) | qkv, y, lse, dy
     * -> dqkv (the backward recomputes the probabilities from lse) */
    {ABI("attention.fwd", 1, 2, bp_attention_attrs), .amp_fp32_out = BIT(1),
     .fp16_tolerance = BP_OP_TOL_REDUCTION, .grad_check = 1},
    {ABI("attention.bwd", 4, 1, bp_attention_attrs), ACCUMULATES(bp_attention_attrs),
     .amp_fp32_in = BIT(2), .fp16_tolerance = BP_OP_TOL_REDUCTION,
     GRAD_OF("attention.fwd", {'x', 0}, {'y', 0}, {'y', 1}, {'r', 0}), .grad_out = {0}},
    /* ViT ops (layernorm, gelu_tanh, pos_embed) */
    /* x -> y | x, dy -> dx */
    {ABI("gelu_tanh.fwd", 1, 1, bp_elementwise_attrs), .cases = BP_OP_CASES_SAME_SHAPE,
     .fp16_tolerance = BP_OP_TOL_SELECT, .grad_check = 1},
    {ABI("gelu_tanh.bwd", 2, 1, bp_elementwise_attrs), ACCUMULATES(bp_elementwise_attrs),
     .cases = BP_OP_CASES_SAME_SHAPE, .fp16_tolerance = BP_OP_TOL_SELECT,
     GRAD_OF("gelu_tanh.fwd", {'x', 0}, {'r', 0}), .grad_out = {0}},
    /* x, gain, bias -> y, save_mean, save_invstd (per position) |
     * x, dy, gain, save_mean, save_invstd -> dx, dgain, dbias */
    {ABI("layernorm.fwd", 3, 3, bp_layernorm_attrs), .fills = {IN(1, UNIFORM, 0.5, 1.5)},
     .fp16_tolerance = BP_OP_TOL_REDUCTION, .amp_fp32_out = FROM(1),
     .amp_param_in = BIT(1) | BIT(2), .grad_check = 1, .grad_kink = 3},
    {ABI("layernorm.bwd", 5, 3, bp_layernorm_attrs), ACCUMULATES(bp_layernorm_attrs),
     .fills = {IN(2, UNIFORM, 0.5, 1.5), IN(4, UNIFORM, 0.5, 2.0)},
     .fp16_tolerance = BP_OP_TOL_REDUCTION, .amp_fp32_in = FROM(3), .amp_param_in = BIT(2),
     .amp_param_out = FROM(1),
     GRAD_OF("layernorm.fwd", {'x', 0}, {'r', 0}, {'x', 1}, {'y', 1}, {'y', 2}),
     .grad_out = {0, 1, 2}},
    /* x, P -> y = x + P | dy -> dx, dP */
    {ABI("pos_embed.fwd", 2, 1, bp_elementwise_attrs), .fp16_tolerance = BP_OP_TOL_SELECT,
     .amp_param_in = BIT(1), .grad_check = 1},
    {ABI("pos_embed.bwd", 1, 2, bp_elementwise_attrs), ACCUMULATES(bp_elementwise_attrs),
     .fp16_tolerance = BP_OP_TOL_SELECT, .amp_param_out = BIT(1),
     GRAD_OF("pos_embed.fwd", {'r', 0}), .grad_out = {0, 1}},
    /* end of the ViT ops */
};

const bp_op_info *bp_op_table(int *count_out) {
  *count_out = (int)(sizeof table / sizeof table[0]);
  return table;
}

const bp_op_info *bp_op_find(const char *op) {
  if (!op) return NULL;
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strcmp(table[i].abi.name, op) == 0) return &table[i];
  return NULL;
}
