/* Built-in op kinds: their names, tensor lists and attribute blocks. The
 * host registers these kinds; modules provide kernels for them (and may add
 * kinds of their own). Same versioning rules as bp_abi.h: an attribute
 * block only grows at its end, with its BP_ABI_ATTR_VERSION bumped, and a
 * kernel reads it up to min(attr_size, sizeof its own definition).
 *
 * Conventions for every op (1.4 states them as rules; `blueprint validate`
 * checks each one):
 *  1. Tensors are NHWC with device strides (bp_abi_tensor.stride).
 *  2. Channel padding (channels shape[3] .. padded_c-1 of a pixel) of an
 *     input holds unspecified values and never changes a result. Channel
 *     padding of an output must stay untouched: a kernel writes exactly
 *     the elements of the logical extent (n < N, h < H, w < W, c < C).
 *  3. The tail: a kernel may read up to slot_bytes from a tensor's pointer
 *     (the 16 bytes past the last element included, XNNPACK-style), never
 *     further, and never writes past the last element. Range ops work on
 *     spans [1,1,1,E] whose E elements include every slot's padding and
 *     tail inside the span: there every element is data.
 *  4. "accumulate" in an attribute block: 1 adds into the outputs it names
 *     (out += result; gradient slots reached by several consumers), 0
 *     overwrites. Only backward ops have it: forward ops ignore an
 *     accumulate field (the host sets it to 0 there).
 *  5. Outputs never alias inputs unless the kernel has
 *     BP_ABI_KERNEL_IN_PLACE and the op says "may alias".
 *  6. Arrays of ABI structs (args->inputs, args->outputs, a layer's attrs)
 *     are strided by the struct_size of their first element (the writer's
 *     sizeof), which every element shares; readers step by it, never by
 *     their own sizeof (bp_abi_sdk.h: bp_sdk_input, bp_sdk_output).
 *  7. infer_shape (bp_abi_op) receives outputs zeroed with struct_size set
 *     and fills dtype and shape[4] of each; the host derives padded_c,
 *     strides and slot_bytes from the plan's rules. */
#ifndef BP_ABI_OPS_H
#define BP_ABI_OPS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version of every block below, for now. 2 (ABI 1.5): softmax_ce,
 * range and optimizer blocks gained their (1.5) fields; new block
 * bp_loss_scale_attrs. */
#define BP_ABI_ATTR_VERSION 2

/* conv2d.fwd       in: x[N,H,W,C], w[K,kh,kw,C/groups], b[1,1,1,K] (has_bias)
 *                  out: y[N,OH,OW,K]             OH = (H + 2*pad_h - (dil_h*(kh-1)+1))/stride_h + 1
 * conv2d.bwd_data  in: dy[N,OH,OW,K], w          out: dx[N,H,W,C]        (accumulate: dx)
 * conv2d.bwd_filter in: x, dy                    out: dw, db (has_bias)  (accumulate: dw, db) */
typedef struct bp_conv2d_attrs {
  int32_t kernel_h, kernel_w;
  int32_t stride_h, stride_w;
  int32_t pad_h, pad_w;
  int32_t dilation_h, dilation_w;
  int32_t groups;
  int32_t has_bias;
  int32_t accumulate;
} bp_conv2d_attrs;

/* fc.fwd        in: x[N,H,W,C] (read as [N, H*W*C]), w[out,1,1,H*W*C], b[1,1,1,out] (has_bias)
 *               out: y[N,1,1,out]
 * fc.bwd_data   in: dy[N,1,1,out], w       out: dx (x's shape)     (accumulate: dx)
 * fc.bwd_filter in: x, dy                  out: dw, db (has_bias)  (accumulate: dw, db) */
typedef struct bp_fc_attrs {
  int32_t has_bias;
  int32_t accumulate;
} bp_fc_attrs;

/* relu.fwd  in: x            out: y (may alias x)
 * relu.bwd  in: y, dy        out: dx (may alias dy)  (accumulate: dx)
 *           (for relu.bwd, BP_ABI_KERNEL_IN_PLACE means dx may be dy, input 1)
 * add.fwd   in: a, b (same shape)  out: y
 * add.bwd   in: dy           out: da, db            (accumulate: da, db)
 * gelu.fwd  in: x            out: y = x * Phi(x) = x/2 * (1 + erf(x/sqrt 2)) (the exact form)
 * gelu.bwd  in: x, dy        out: dx = dy * (Phi(x) + x * phi(x))  (accumulate: dx)
 *           (phi the standard normal density; neither output may alias)
 * gelu_tanh.fwd  in: x       out: y = x/2 * (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
 *                (PyTorch's GELU(approximate='tanh'))
 * gelu_tanh.bwd  in: x, dy   out: dx = dy * dy/dx of the above  (accumulate: dx)
 *                (neither output may alias)
 * pos_embed.fwd  in: x[N,H,W,C], P[1,H,W,C]   out: y = x + P (P added to every sample)
 * pos_embed.bwd  in: dy          out: dx = dy, dP = sum over n of dy  (accumulate: dx, dP)
 *                (no output may alias an input) */
typedef struct bp_elementwise_attrs {
  int32_t accumulate;
} bp_elementwise_attrs;

/* maxpool.fwd  in: x        out: y, mask[y's shape] int8: argmax index ky*kw+kx in its window
 * maxpool.bwd  in: dy, mask out: dx   (accumulate: dx)
 * avgpool.fwd  in: x        out: y
 * avgpool.bwd  in: dy       out: dx   (accumulate: dx)
 * Padding never wins a max; avg divides by the whole window when
 * count_include_pad, else by the in-bounds count. */
typedef struct bp_pool_attrs {
  int32_t kernel_h, kernel_w;
  int32_t stride_h, stride_w;
  int32_t pad_h, pad_w;
  int32_t count_include_pad;
  int32_t accumulate;
} bp_pool_attrs;

/* global_avgpool.fwd  in: x[N,H,W,C]   out: y[N,1,1,C]
 * global_avgpool.bwd  in: dy[N,1,1,C]  out: dx[N,H,W,C]  (accumulate: dx)
 * uses bp_elementwise_attrs */

/* batchnorm.fwd_train  in: x, gamma[1,1,1,C], beta, running_mean, running_var
 *                      out: y, save_mean[1,1,1,C], save_invstd, running_mean, running_var
 *                      (the running statistics are updated in place:
 *                       r = (1-momentum)*r + momentum*batch, var unbiased)
 * batchnorm.fwd_eval   in: x, gamma, beta, running_mean, running_var   out: y
 * batchnorm.bwd        in: x, dy, gamma, save_mean, save_invstd
 *                      out: dx, dgamma, dbeta  (accumulate: dx, dgamma, dbeta)
 * batchnorm_relu.fwd_train, .fwd_eval  as batchnorm's, y = relu(BN(x))
 * batchnorm_relu.bwd   in: x, dy, gamma, save_mean, save_invstd, y
 *                      (y: the relu output; dy: the gradient w.r.t. it)
 *                      out: dx, dgamma, dbeta, as batchnorm.bwd on
 *                      relu.bwd(y, dy) (each element that float) */
typedef struct bp_batchnorm_attrs {
  float eps;
  float momentum;
  int32_t accumulate;
} bp_batchnorm_attrs;

/* ViT ops */
/* layernorm.fwd  in: x[N,H,W,C], gain[1,1,1,C], bias[1,1,1,C]
 *                out: y, save_mean[N,H,W,1] fp32, save_invstd[N,H,W,1] fp32
 * layernorm.bwd  in: x, dy, gain, save_mean, save_invstd
 *                out: dx, dgain, dbias  (accumulate: dx, dgain, dbias)
 * Per position (n, h, w), over its C channels (as PyTorch's
 * LayerNorm(C) on [N, H*W, C]):
 *   mean = sum x / C, var = sum (x - mean)^2 / C (biased),
 *   invstd = 1 / sqrt(var + eps), xhat = (x - mean) * invstd,
 *   y = xhat * gain + bias
 *   g = dy * gain: dx = invstd * (g - mean_C(g) - xhat * mean_C(g * xhat))
 *   dgain = sum over positions of dy * xhat, dbias = sum of dy
 * The backward reads the forward's saved statistics. No output aliases an
 * input. */
typedef struct bp_layernorm_attrs {
  float eps;
  int32_t accumulate;
} bp_layernorm_attrs;
/* end of the ViT ops */

/* softmax_ce.fwd_bwd  in: logits[N,1,1,K], labels[N,1,1,1] int32,
 *                         loss_scale[1,1,1,1] fp32 (has_loss_scale, 1.5)
 *                     out: loss[1,1,1,1], correct[1,1,1,1], dlogits[N,1,1,K] (compute_grad)
 * loss += sum over the batch of the (label-smoothed) cross-entropy and
 * correct += the count of argmax == label (both accumulate across steps,
 * zeroed by the executor); dlogits = (softmax - target) * grad_scale,
 * overwritten. grad_scale is 1 / global batch, so gradients summed across
 * ranks are the gradient of the global mean loss.
 * (1.5) Mixed precision: logits and dlogits may be FP16 (loss and correct
 * stay FP32); the arithmetic is FP32 and each dlogits element is rounded
 * to FP16 once, to nearest even. With has_loss_scale, input 2 is the
 * dynamic loss scale S and dlogits = (softmax - target) * grad_scale * S
 * (loss and correct are never scaled). */
typedef struct bp_softmax_ce_attrs {
  float label_smoothing;
  float grad_scale;
  int32_t compute_grad;
  int32_t has_loss_scale; /* (1.5) input 2: the loss scale */
} bp_softmax_ce_attrs;

/* Range ops work on spans of regions, each passed as one tensor shaped
 * [1,1,1,elements] (FP32 unless stated). Scalars (lr, step) are FP32
 * [1,1,1,1] tensors in the S region, so schedules change them without
 * rebinding.
 *
 * range.zero   out: x
 * range.copy   in: src                  out: dst
 * range.scale  in: x                    out: x (in place): x *= scale
 * range.cast   in: src (fp32 or fp16)   out: dst (the other; elements equal)
 * range.ema    in: w, [skip]            out: e: e = decay*e + (1-decay)*w
 * range.nan_check  in: x                out: flag[1,1,1,1]: 1 if any NaN/Inf, else unchanged
 * range.unscale (1.5)  in: src fp16, scale[1,1,1,1] fp32   out: dst fp32 (same E)
 *   dst = (float)src * inv, inv = 1.0f / scale rounded to FP32 once (as
 *   PyTorch's GradScaler; exact for the power-of-two scales it keeps).
 *   An Inf or NaN in src stays one in dst (nan_check finds it after).
 *
 * (1.5) "skip": with has_skip, the op takes one more trailing input,
 * skip[1,1,1,1] fp32 in S: when it is nonzero the kernel returns without
 * writing anything (mixed precision skips the update of a step whose
 * gradients overflowed; the decision stays on the device, so a captured
 * step needs no host read). range.ema and the optimizer ops take it. */
typedef struct bp_range_attrs {
  float scale;      /* range.scale */
  float decay;      /* range.ema */
  int32_t has_skip; /* (1.5) range.ema: input 1 is skip */
} bp_range_attrs;

/* range.loss_scale (1.5)  in: found_inf[1,1,1,1]
 *                         out: scale, good_steps, step, skipped (each [1,1,1,1], in place)
 * All FP32 in S (counts exact to 2^24). Dynamic loss scaling with the rule
 * of PyTorch's GradScaler, applied once per step after the update:
 *   found_inf != 0: skipped += 1; good_steps = 0; scale *= backoff_factor
 *                   (unchanged when growth_interval is 0: a static scale)
 *   found_inf == 0: step += 1; good_steps += 1; when growth_interval > 0 and
 *                   good_steps >= growth_interval: good_steps = 0 and
 *                   scale *= growth_factor, unless that product is not finite
 * `step` is the optimizer's step counter (range.adamw's input), so a
 * skipped step leaves it where it was. */
typedef struct bp_loss_scale_attrs {
  float growth_factor;     /* 2 */
  float backoff_factor;    /* 0.5 */
  int32_t growth_interval; /* 2000; 0: static scale */
} bp_loss_scale_attrs;

/* range.sgd    in: grad, lr, [skip]     out: w, m
 *   g = grad + weight_decay*w (coupled, as PyTorch's SGD)
 *   m = momentum*m + g;  w -= lr * (nesterov ? g + momentum*m : m)
 * range.adamw  in: grad, lr, step, [skip]   out: w, m, v   (step counts from 1)
 *   w -= lr*weight_decay*w (decoupled); m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2
 *   w -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)
 * range.lars   in: grad, lr, segments[1,1,1,S+1] int32 (element offsets of
 *              each parameter in the span), [skip]   out: w, m, norms[1,1,1,2S]
 *   per parameter: trust = eta*|w| / (|g| + weight_decay*|w|) (1 if a norm is 0),
 *   g' = g + weight_decay*w, m = momentum*m + lr*trust*g', w -= m */
typedef struct bp_optimizer_attrs {
  float momentum;
  float weight_decay;
  int32_t nesterov;
  float beta1, beta2, eps; /* adamw */
  float eta;               /* lars trust coefficient */
  int32_t has_skip;        /* (1.5) the trailing skip input (range attrs above) */
} bp_optimizer_attrs;

/* Collectives over one FP32 span [1,1,1,E] of every rank, in place. Kernels
 * are flagged BP_ABI_KERNEL_COLLECTIVE and reach the other ranks through
 * args->comm (bp_abi_comm). The span is cut into `world` chunks: rank k
 * owns chunk k, elements [bp_abi_chunk_start(E, world, k),
 * bp_abi_chunk_start(E, world, k + 1)).
 *
 * allreduce.sum             in: x   out: x   every element summed over the
 *                           ranks, then multiplied by scale (1/world for a
 *                           mean); every rank ends with the same bits.
 * allreduce.reduce_scatter  in: x   out: x   only the chunk this rank owns
 *                           is summed and scaled, with exactly the bits
 *                           allreduce.sum gives it; the other chunks keep
 *                           undefined values (a sharded update reads only
 *                           its own chunk, see below).
 * allreduce.all_gather      in: x   out: x   (no attributes) every rank's
 *                           chunk is copied from its owner into every
 *                           rank's span, bit for bit.
 * A host shards an elementwise optimizer over the ranks with these:
 * reduce_scatter the gradient span, let every rank update the slice of the
 * parameter and moment spans its chunk covers, all_gather the parameters
 * (and the moments before a checkpoint). The result is bit-identical to
 * allreduce.sum followed by the update on every rank, at half the update's
 * memory traffic per rank for two ranks.
 * Implementations: ops/allreduce ("threads", "mpi"; "nccl" takes the same
 * contract on the CUDA device). */
typedef struct bp_allreduce_attrs {
  float scale;
} bp_allreduce_attrs;

/* ---- attention (multi-head self-attention) ---------------------------------
 * attention.fwd  in: qkv[N,H,W,3D]   out: y[N,H,W,D], lse[N,H,W,heads] FP32
 * attention.bwd  in: qkv, y, lse, dy[N,H,W,D]   out: dqkv[N,H,W,3D]  (accumulate: dqkv)
 * T = H*W tokens per sample, token t = h*W + w. Each position's channels
 * are [q (D) | k (D) | v (D)]; head j uses channels j*dh .. j*dh+dh-1 of
 * each (dh = D/heads, heads must divide D) and writes its result to
 * channels j*dh.. of y. scores s_tu = q_t . k_u / sqrt(dh), softmax over
 * the keys u (with causal: only u <= t), y_t = sum_u p_tu v_u: PyTorch's
 * softmax(q k^T / sqrt(dh)) v per head. lse_t = log sum_u exp(s_tu), per
 * token and head, is what the backward needs to recompute p_tu (it never
 * sees the [T,T] probabilities); the backward also reads y (for
 * D_t = dy_t . y_t). qkv, y, dy, dqkv may be FP16 (float arithmetic); lse
 * is always FP32. Rows of tokens must be evenly spaced (stride[1] ==
 * W*stride[2]), as every plan tensor is. */
typedef struct bp_attention_attrs {
  int32_t heads;
  int32_t causal; /* 1: token t attends to tokens u <= t only */
  int32_t accumulate;
} bp_attention_attrs;

/* First element of chunk k of a span of `count` elements cut into `world`
 * chunks (count * k / world, without overflow): chunk sizes differ by at
 * most one, the larger ones last. */
static inline uint64_t bp_abi_chunk_start(uint64_t count, int world, int k) {
  const uint64_t w = (uint64_t)world, q = count / w, r = count % w;
  return q * (uint64_t)k + r * (uint64_t)k / w;
}

#ifdef __cplusplus
}
#endif
#endif
