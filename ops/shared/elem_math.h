/* Per-element formulas that the CPU kernels and the CUDA kernels share:
 * optimizer updates, casts, loss-scale logic, batch-norm and loss steps.
 * Each is a static inline function that compiles as C11 (the reference
 * and ops/cpu call it, so the CPU suites test the math) and under nvcc as
 * __host__ __device__ (ops/cuda's kernels call it, so a GPU run tests only
 * the indexing around it). Same expression, same operation order: the CPU
 * and the GPU round the same way wherever the hardware does (no FMA
 * contraction is assumed: CUDA builds pass --fmad=false for files that
 * need the CPU's bits).
 *
 * Keep every function free of libc calls other than the <math.h> ones
 * that CUDA provides as device functions (sqrtf, fabsf, expf, logf, tanh). */
#ifndef BP_OPS_SHARED_ELEM_MATH_H
#define BP_OPS_SHARED_ELEM_MATH_H

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define BP_HD __host__ __device__ static inline
#else
#define BP_HD static inline
#endif

/* ---- range ops: casts, unscale, optimizer updates, EMA, loss scale ------- */

/* The formulas of the range ops (bp_abi_ops.h), as ops/reference/range.c
 * defines their bits: FP32 arithmetic in the reference's order; factors
 * that depend only on scalars formed in double and rounded to float once.
 * The per-span factors (bp_adamw_factors_of, bp_lars_rate, bp_one_minus)
 * are functions too, so a CUDA kernel forms them on the device from the
 * scalars it reads there, with the same double operations (IEEE
 * division and square root on both). Only pow() (AdamW's bias
 * corrections) is not correctly rounded on every libm (CUDA's is within
 * 2 ulp), so the host's and the device's double may differ in a last bit;
 * the factor, rounded to float, then differs only when that double lies
 * next to a float rounding boundary. */

#include <string.h> /* memcpy: the host's bit casts */

/* A float's bits and back, without aliasing games. */
BP_HD uint32_t bp_bits_of_fp32(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  return b;
#endif
}
BP_HD float bp_fp32_of_bits(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
#endif
}

/* FP32 -> FP16 and back: the bits of bp_sdk_fp32_to_fp16 and
 * bp_sdk_fp16_to_fp32 (abi/bp_abi_sdk.h says what they do: round to
 * nearest even, overflow to Inf, NaN quieted with its sign and top payload
 * bits kept; widening exact), the same integer steps, so the device's
 * casts give the SDK's bits (tests/test_elem_math.c checks every FP16 and
 * a sweep of FP32 values). CUDA's __float2half_rn is not used: it does not
 * keep NaN payloads. */
BP_HD uint16_t bp_fp32_to_fp16(float f) {
  const uint32_t x = bp_bits_of_fp32(f);
  const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) /* NaN */
    return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax >= 0x477ff000u) /* >= 65520: Inf */
    return (uint16_t)(sign | 0x7c00u);
  if (ax >= 0x38800000u) { /* a normal half */
    uint32_t h = (ax >> 13) - ((127u - 15u) << 10);
    const uint32_t rest = ax & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
  }
  if (ax <= 0x33000000u) /* <= 2^-25: a signed zero */
    return (uint16_t)sign;
  const uint32_t e = ax >> 23, mant = (ax & 0x7fffffu) | 0x800000u; /* a subnormal half */
  const uint32_t shift = 126u - e;
  uint32_t m = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
  if (rest > halfway || (rest == halfway && (m & 1u))) m++;
  return (uint16_t)(sign | m);
}

BP_HD float bp_fp16_to_fp32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
  if (e == 0x1fu) {
    x = sign | 0x7f800000u | (m << 13); /* Inf, or NaN made quiet */
    if (m) x |= 0x00400000u;
  } else if (e != 0) {
    x = sign | ((e + 112u) << 23) | (m << 13);
  } else if (m == 0) {
    x = sign;
  } else { /* subnormal: normalize */
    e = 113u;
    while (!(m & 0x400u)) {
      m <<= 1;
      e--;
    }
    x = sign | (e << 23) | ((m & 0x3ffu) << 13);
  }
  return bp_fp32_of_bits(x);
}

/* NaN or +-Inf, on the bits (all exponent bits set): the same answer as
 * !isfinite(), without a comparison that could trap on a signalling NaN. */
BP_HD int bp_fp32_nonfinite(float x) {
  return (bp_bits_of_fp32(x) & 0x7f800000u) == 0x7f800000u;
}
BP_HD int bp_fp16_nonfinite(uint16_t h) { return (h & 0x7c00u) == 0x7c00u; }

/* The skip input: any value but 0 skips (a NaN counts as nonzero). */
BP_HD int bp_skip_set(float skip) { return skip != 0.0f; }

/* The run-time scalars an update or unscale accepts: lr finite; step
 * finite and >= 1; an unscale's scale finite and > 0. */
BP_HD int bp_lr_ok(float lr) { return !bp_fp32_nonfinite(lr); }
BP_HD int bp_step_ok(float step) { return !bp_fp32_nonfinite(step) && step >= 1.0f; }
BP_HD int bp_unscale_scale_ok(float scale) { return !bp_fp32_nonfinite(scale) && scale > 0.0f; }

/* range.unscale: inv = 1.0f / scale, one FP32 division; each element
 * dst = widened src * inv, rounded once (Inf and NaN stay so). */
BP_HD float bp_unscale_inv(float scale) { return 1.0f / scale; }
BP_HD float bp_unscale(uint16_t src, float inv) { return bp_fp16_to_fp32(src) * inv; }

/* range.scale: y = x * scale. */
BP_HD float bp_scale(float x, float scale) { return x * scale; }

/* 1 - x formed in double, rounded once (EMA's 1 - decay, AdamW's 1 - beta). */
BP_HD float bp_one_minus(float x) { return (float)(1.0 - (double)x); }

/* range.ema: e = d*e + (1-d)*w with one_minus_d = bp_one_minus(d). */
BP_HD float bp_ema(float e, float w, float d, float one_minus_d) {
  return d * e + one_minus_d * w;
}

/* range.sgd of one element (torch.optim.SGD, dampening 0): decay says
 * whether weight_decay applies (the reference: weight_decay != 0; the
 * skipped addition matters for -0 and Inf weights).
 *   g = grad + wd*w;  m = mu*m + g;  w = w - lr * (nesterov ? g + mu*m : m) */
BP_HD void bp_sgd(float grad, float *w, float *m, float lr, float mu, float wd, int decay,
                  int nesterov) {
  float g = grad;
  if (decay) g = g + wd * *w;
  const float buf = mu * *m + g;
  *m = buf;
  const float u = nesterov ? g + mu * buf : buf;
  *w = *w - lr * u;
}

/* range.adamw's per-span factors for lr and step t (torch.optim.AdamW,
 * single-tensor path): bc1 = 1 - beta1^t, bc2 = 1 - beta2^t in double;
 * decay = 1 - lr*wd; neg_step_size = -(lr / bc1); bc2_sqrt = sqrt(bc2);
 * c1 = 1 - beta1, c2 = 1 - beta2; each rounded to float once. */
typedef struct bp_adamw_factors {
  float decay, neg_step_size, bc2_sqrt, c1, c2, b1, b2, eps;
} bp_adamw_factors;

BP_HD bp_adamw_factors bp_adamw_factors_of(float lr, float step, float beta1, float beta2,
                                           float weight_decay, float eps) {
  bp_adamw_factors f;
  const double t = step;
  const double bc1 = 1.0 - pow((double)beta1, t), bc2 = 1.0 - pow((double)beta2, t);
  f.decay = (float)(1.0 - (double)lr * (double)weight_decay);
  f.neg_step_size = (float)(-((double)lr / bc1));
  f.bc2_sqrt = (float)sqrt(bc2);
  f.c1 = bp_one_minus(beta1);
  f.c2 = bp_one_minus(beta2);
  f.b1 = beta1;
  f.b2 = beta2;
  f.eps = eps;
  return f;
}

/* range.adamw of one element:
 *   w = w*decay;  m = m*b1 + c1*g;  v = v*b2 + (c2*g)*g
 *   w = w + neg_step_size*m / (sqrt(v)/bc2_sqrt + eps) */
BP_HD void bp_adamw(const bp_adamw_factors *f, float g, float *w, float *m, float *v) {
  const float wi = *w * f->decay;
  const float mi = *m * f->b1 + f->c1 * g;
  const float vi = *v * f->b2 + f->c2 * g * g;
  const float denom = sqrtf(vi) / f->bc2_sqrt + f->eps;
  *m = mi;
  *v = vi;
  *w = wi + f->neg_step_size * mi / denom;
}

/* range.lars: the rate r = lr * trust of one parameter from its norms
 * |w| and |g| (double square roots of double sums of squares):
 * trust = eta*|w| / (|g| + wd*|w|), 1 when either norm is 0; in double,
 * rounded once. */
BP_HD float bp_lars_rate(double wn, double gn, float eta, float weight_decay, float lr) {
  const double trust =
      wn > 0.0 && gn > 0.0 ? (double)eta * wn / (gn + (double)weight_decay * wn) : 1.0;
  return (float)((double)lr * trust);
}

/* range.lars: offset j of segments[0..S] is in order: seg[j-1] (0 for
 * j = 0) <= seg[j] <= n, n the span's elements. */
BP_HD int bp_lars_offset_ok(const int32_t *seg, int64_t j, int64_t n) {
  return !(seg[j] < (j ? seg[j - 1] : 0) || seg[j] > n);
}

/* range.lars of one element at rate r: g = grad + wd*w (when decay);
 * m = mu*m + r*g;  w = w - m. */
BP_HD void bp_lars(float grad, float *w, float *m, float r, float mu, float wd, int decay) {
  float g = grad;
  if (decay) g = g + wd * *w;
  *m = mu * *m + r * g;
  *w = *w - *m;
}

/* range.loss_scale's state: v[0] = scale finite and > 0, v[1..3]
 * (good_steps, step, skipped) finite and >= 0; the first value that is
 * not, or -1. */
BP_HD int bp_loss_scale_bad(const float v[4]) {
  for (int o = 0; o < 4; o++)
    if (bp_fp32_nonfinite(v[o]) || !(o == 0 ? v[o] > 0.0f : v[o] >= 0.0f)) return o;
  return -1;
}

/* range.loss_scale's rule (PyTorch's GradScaler.update) on v = {scale,
 * good_steps, step, skipped}, FP32:
 *   found_inf != 0 (NaN too): skipped += 1; good = 0; scale *= backoff
 *                             (when growth_interval > 0)
 *   found_inf == 0: step += 1; good += 1; when growth_interval > 0 and
 *                   good >= growth_interval: good = 0 and scale *= growth,
 *                   unless that product is not finite */
BP_HD void bp_loss_scale_update(float found_inf, float v[4], float growth_factor,
                                float backoff_factor, int32_t growth_interval) {
  float scale = v[0], good = v[1], step = v[2], skipped = v[3];
  if (found_inf != 0.0f) {
    skipped += 1.0f;
    good = 0.0f;
    if (growth_interval > 0) scale *= backoff_factor;
  } else {
    step += 1.0f;
    good += 1.0f;
    if (growth_interval > 0 && good >= (float)growth_interval) {
      good = 0.0f;
      const float grown = scale * growth_factor;
      if (!bp_fp32_nonfinite(grown)) scale = grown;
    }
  }
  v[0] = scale;
  v[1] = good;
  v[2] = step;
  v[3] = skipped;
}

/* ---- layer ops: batch norm, relu, pooling, softmax cross-entropy -------- */

/* relu.fwd: x < 0 ? 0 : x. NaN passes (NaN < 0 is false); -0.0 stays -0.0. */
BP_HD float bp_relu_fwd(float x) { return x < 0.0f ? 0.0f : x; }

/* relu.bwd: dy where the forward's output y is > 0, else 0 (also at y == 0). */
BP_HD float bp_relu_bwd(float y, float dy) { return y > 0.0f ? dy : 0.0f; }

/* Max pooling's scan: tap value v replaces the running best when it is
 * strictly larger, or a NaN over a number (the first NaN wins), so among
 * ties the first tap in row-major order wins and NaN propagates. The first
 * in-bounds tap is taken as it is. */
BP_HD int bp_maxpool_takes(float v, float best) { return v > best || (v != v && best == best); }

/* Pooling windows: the in-bounds taps [k0, k1) of the window of output o
 * along one side (the window starts at o*stride - pad and has `kernel`
 * taps; the input has `extent` rows or columns). */
BP_HD void bp_pool_taps(int64_t o, int64_t stride, int64_t pad, int64_t kernel, int64_t extent,
                        int64_t *k0, int64_t *k1) {
  const int64_t start = o * stride - pad;
  *k0 = start < 0 ? -start : 0;
  *k1 = start + kernel > extent ? extent - start : kernel;
}

/* Average pooling and global average pooling: a window's sum (or one dy,
 * widened) divided by its divisor in double, rounded once to float. */
BP_HD float bp_avg_of(double sum, double divisor) { return (float)(sum / divisor); }

/* Batch norm, per channel over M = N*H*W values, in double as the
 * reference (ops/shared/batchnorm_steps.h has the formulas and the checks;
 * its per-channel steps call these):
 *   invstd = 1 / sqrt(var + eps)   (var biased: sum (x - mean)^2 / M) */
BP_HD double bp_bn_invstd(double var, float eps) { return 1.0 / sqrt(var + (double)eps); }

/* fwd_train: y = x * scale + shift with scale = gamma * invstd (the same
 * product is the backward's k) and shift = beta - mean * scale. */
BP_HD double bp_bn_gain(double gamma, double invstd) { return gamma * invstd; }
BP_HD double bp_bn_shift(double beta, double mean, double scale) { return beta - mean * scale; }

/* fwd_eval: scale = gamma / sqrt(running_var + eps) (shift as above, with
 * the running mean). */
BP_HD double bp_bn_eval_scale(double gamma, double running_var, float eps) {
  return gamma / sqrt(running_var + (double)eps);
}

/* y of one element, rounded once. */
BP_HD float bp_bn_apply(float x, double scale, double shift) { return (float)(x * scale + shift); }

/* Running statistics, r = (1 - momentum) * r + momentum * batch, the
 * variance unbiased (var * M / (M - 1)); rounded once to float. */
BP_HD float bp_bn_running_mean(double r, float momentum, double mean) {
  const double m = momentum;
  return (float)((1.0 - m) * r + m * mean);
}
BP_HD float bp_bn_running_var(double r, float momentum, double var, int64_t count) {
  const double m = momentum;
  return (float)((1.0 - m) * r + m * var * (double)count / (double)(count - 1));
}

/* bwd: the summand of sum(dy * xhat) (as (dy * (x - mean)) * invstd), the
 * normalized x, and dx of one element from k = gamma * invstd and the two
 * sums already divided by M (mdy = sum dy / M, mdyx = sum dy*xhat / M):
 *   dx = k * (dy - mdy - xhat * mdyx), rounded once. */
BP_HD double bp_bn_dy_xhat(double dy, float x, double mean, double invstd) {
  return dy * (x - mean) * invstd;
}
BP_HD double bp_bn_xhat(float x, double mean, double invstd) { return (x - mean) * invstd; }
BP_HD float bp_bn_dx(double k, float dy, double xhat, double mdy, double mdyx) {
  return (float)(k * (dy - mdy - xhat * mdyx));
}

/* dgamma or dbeta from its double sum: overwritten, or added to the FP32
 * output in double and rounded once (accumulate). */
BP_HD float bp_bn_param_grad(float out, double sum, int accumulate) {
  return accumulate ? (float)(out + sum) : (float)sum;
}

/* Softmax cross-entropy with label smoothing s over K classes: the target
 * of the label is on = 1 - s + s/K, of every other class off = s/K. */
BP_HD void bp_ce_targets(float smoothing, int64_t classes, double *on, double *off) {
  const double s = smoothing;
  *off = s / (double)classes;
  *on = 1.0 - s + *off;
}

/* A class's loss term t * (lse - z), lse = max z + log sum exp(z - max z);
 * callers skip it where t == 0 (a -inf logit off target adds nothing). */
BP_HD double bp_ce_loss_term(double t, double lse, float z) { return t * (lse - z); }

/* dlogits of one class from p = exp(z - lse): (p - t) * grad_scale * S (S
 * the loss scale, 1 without), in double, rounded once to float (an FP16
 * dlogits rounds that float once more, to nearest even). */
BP_HD float bp_ce_dlogit(double p, double t, float grad_scale, double loss_scale) {
  return (float)((p - t) * grad_scale * loss_scale);
}

/* ---- ViT layer ops: gelu_tanh, layer norm ------------------------------- */

/* GELU's tanh form (PyTorch's GELU(approximate='tanh')), in double:
 * y = x/2 (1 + t), t = tanh(sqrt(2/pi) (x + 0.044715 x^3)), and its slope
 * 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2). */
#define BP_GELU_TANH_K 0.79788456080286535588 /* sqrt(2/pi) */
#define BP_GELU_TANH_A 0.044715
BP_HD double bp_gelu_tanh_t(double x) {
  return tanh(BP_GELU_TANH_K * (x + BP_GELU_TANH_A * x * x * x));
}
BP_HD float bp_gelu_tanh_fwd(float x) {
  const double v = x;
  return (float)(0.5 * v * (1.0 + bp_gelu_tanh_t(v)));
}
BP_HD float bp_gelu_tanh_bwd(float x, float dy) {
  const double v = x, t = bp_gelu_tanh_t(v);
  const double slope = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * BP_GELU_TANH_K *
                                             (1.0 + 3.0 * BP_GELU_TANH_A * v * v);
  return (float)((double)dy * slope);
}

/* Layer norm at one position over its C channels (bp_abi_ops.h): the
 * statistics are in double (ops/shared/layernorm_steps.h sums them);
 * xhat = (x - mean) * invstd, y = xhat * gain + bias rounded once;
 * backward with g = dy * gain and the channel means mg of g and mgx of
 * g * xhat: dx = invstd * (g - mg - xhat * mgx), rounded once. */
BP_HD double bp_ln_invstd(double var, float eps) { return 1.0 / sqrt(var + (double)eps); }
BP_HD double bp_ln_xhat(float x, double mean, double invstd) {
  return ((double)x - mean) * invstd;
}
BP_HD float bp_ln_apply(double xhat, float gain, float bias) {
  return (float)(xhat * (double)gain + (double)bias);
}
BP_HD double bp_ln_g(float dy, float gain) { return (double)dy * (double)gain; }
BP_HD float bp_ln_dx(double invstd, double g, double mg, double xhat, double mgx) {
  return (float)(invstd * (g - mg - xhat * mgx));
}

#endif
