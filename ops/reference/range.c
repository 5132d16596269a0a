/* Range reference kernels: zero, copy, scale, cast FP32<->FP16, EMA,
 * NaN/Inf check, unscale and loss-scale update (mixed precision), and the
 * SGD (momentum, Nesterov), AdamW and LARS updates.
 *
 * Spans (bp_abi_ops.h): every span is one tensor shaped [1,1,1,E] with
 * stride[3] = 1, E elements from its pointer. The host makes one span of
 * several neighbouring region slots, so the E elements include each slot's
 * padding: the 16-byte tail and the rounding up to 256 bytes between one
 * tensor and the next. These kernels treat a span as a flat array of E
 * elements and never look at where one tensor ends; slot_bytes beyond the
 * E elements is neither read nor written. An FP32 span and its FP16 twin
 * hold the same E (the 2:1 byte ratio of the slots), so range.cast covers
 * the whole of both.
 *
 * Padding is harmless because the executor keeps it zero: arenas start
 * zeroed, range.zero clears whole gradient spans, and no compute kernel
 * writes a slot tail. With w = g = m = v = 0 at an element, every update
 * below leaves all of them 0 (AdamW: 0 / (sqrt(0) + eps) with eps > 0,
 * which supports() insists on; LARS: zeros add nothing to a norm).
 *
 * Arithmetic: each element is updated in FP32 in the order PyTorch's
 * single-tensor CPU optimizers use (torch.optim.SGD / AdamW with
 * foreach=False, the CPU default); factors that depend only on scalars
 * (bias corrections, 1 - lr*wd, 1 - beta) are formed in double and rounded
 * to float once. No fused multiply-add is asked for, so results can differ
 * from PyTorch's vectorized (FMA) kernels by an ulp per operation (against
 * Debian's PyTorch 1.13 on AVX2, 20 steps of 4096 weights: within 2.5e-7
 * of 1 + |w| for SGD, Nesterov and AdamW, and plain SGD bit-identical
 * once PyTorch's FMA is emulated); the tests compare against a double
 * re-implementation of PyTorch's formulas.
 *
 * Scalar inputs (lr, step) are FP32 [1,1,1,1] tensors read at run time;
 * run() checks them (finite lr, step >= 1, segment offsets in order)
 * before writing anything and returns BP_ABI_ERR_INVALID with every
 * output untouched when one is off. No output aliases an input, except
 * range.scale, whose output may be its input (the op is in place).
 *
 * Mixed precision (ABI 1.5): range.unscale and range.loss_scale below; and
 * range.ema and the three updates take, with has_skip, one more trailing
 * input skip (FP32 [1,1,1,1]): when it holds anything but 0 (a NaN counts
 * as nonzero), run() returns BP_ABI_OK right after the argument and pointer
 * checks, having read no scalar and written nothing (ops_skip_set). */
#include <math.h>
#include <string.h>

#include "reference-impl.h"
#include "shared/range_check.h"

/* ---- checks ------------------------------------------------------------- */

/* Every op's argument checks, the skip input and the run-time scalar
 * checks are ops/shared/range_check.h (shared with ops/cpu and ops/cuda);
 * the per-element formulas are ops/shared/elem_math.h's (shared with the
 * CUDA kernels), called here in the order described below. */

/* ---- range.zero --------------------------------------------------------- */

/* range.zero  out: x, a span of any dtype; all E elements set to zero bits
 * (0.0 for the float types). */
OPS_RANGE_SUPPORTS(zero_supports, ops_zero_check)
static int zero_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  if (!ops_range_run_checks(args, ops_zero_check)) return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *t = bp_sdk_output(args, 0);
  memset(args->output_ptrs[0], 0, (size_t)(t->shape[3] * bp_sdk_dtype_size(t->dtype)));
  return BP_ABI_OK;
}

/* ---- range.copy --------------------------------------------------------- */

/* range.copy  in: src   out: dst; spans of one dtype (any) and one E; the
 * bytes are copied as they are (NaN payloads included). */
OPS_RANGE_SUPPORTS(copy_supports, ops_copy_check)
static int copy_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  if (!ops_range_run_checks(args, ops_copy_check)) return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *t = bp_sdk_input(args, 0);
  memcpy(args->output_ptrs[0], args->input_ptrs[0],
         (size_t)(t->shape[3] * bp_sdk_dtype_size(t->dtype)));
  return BP_ABI_OK;
}

/* ---- range.scale -------------------------------------------------------- */

/* range.scale  in: x   out: y (normally x itself: the op is in place)
 *   y = x * scale, FP32 spans of one E; scale finite (0 allowed). */
static int scale_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_range_attrs a;
  return ops_scale_check(args, &a, reason, rs);
}
static int scale_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_range_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  static const int alias_out[] = {0}, alias_in[] = {0};
  if (!ops_scale_check(args, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, alias_out, alias_in, 1, reason, rs))
    return BP_ABI_ERR_INVALID;
  const float *x = bp_sdk_input_f32(args, 0);
  float *y = bp_sdk_output_f32(args, 0);
  const int64_t n = bp_sdk_input(args, 0)->shape[3];
  for (int64_t i = 0; i < n; i++) y[i] = bp_scale(x[i], a.scale);
  return BP_ABI_OK;
}

/* ---- range.cast --------------------------------------------------------- */

/* range.cast  in: src   out: dst; one is FP32 and the other FP16, same E
 *   (so the FP32 span is exactly twice the bytes of the FP16 one).
 *   The project's one conversion, bp_sdk_fp32_to_fp16 / bp_sdk_fp16_to_fp32
 *   (abi/bp_abi_sdk.h: rounding to nearest even, overflow to Inf, NaNs kept
 *   as quiet NaNs of the same sign and payload); FP16 -> FP32 is exact. */
OPS_RANGE_SUPPORTS(cast_supports, ops_cast_check)
static int cast_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  if (!ops_range_run_checks(args, ops_cast_check)) return BP_ABI_ERR_INVALID;
  const int64_t n = bp_sdk_input(args, 0)->shape[3];
  if (bp_sdk_input(args, 0)->dtype == BP_ABI_DTYPE_FP32) {
    const float *src = bp_sdk_input_f32(args, 0);
    uint16_t *dst = (uint16_t *)args->output_ptrs[0];
    for (int64_t i = 0; i < n; i++) dst[i] = bp_fp32_to_fp16(src[i]);
  } else {
    const uint16_t *src = (const uint16_t *)args->input_ptrs[0];
    float *dst = bp_sdk_output_f32(args, 0);
    for (int64_t i = 0; i < n; i++) dst[i] = bp_fp16_to_fp32(src[i]);
  }
  return BP_ABI_OK;
}

/* ---- range.ema ---------------------------------------------------------- */

/* range.ema  in: w, [skip]   out: e (read and written); FP32 spans of one E
 *   e = decay*e + (1-decay)*w, decay in [0, 1], (1-decay) rounded once;
 *   with has_skip, nothing is written when skip != 0 (ops_skip_set). */
static int ema_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_range_attrs a;
  return ops_ema_check(args, &a, reason, rs);
}
static int ema_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_range_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_ema_check(args, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  if (ops_skip_set(args, a.has_skip)) return BP_ABI_OK;
  const float *w = bp_sdk_input_f32(args, 0);
  float *e = bp_sdk_output_f32(args, 0);
  const float d = a.decay, one_minus_d = bp_one_minus(a.decay);
  const int64_t n = bp_sdk_input(args, 0)->shape[3];
  for (int64_t i = 0; i < n; i++) e[i] = bp_ema(e[i], w[i], d, one_minus_d);
  return BP_ABI_OK;
}

/* ---- range.nan_check ---------------------------------------------------- */

/* range.nan_check  in: x, an FP32 or FP16 span   out: flag, FP32 [1,1,1,1]
 *   flag = 1 when any of the E elements is NaN or +-Inf, else left as it
 *   was, so one flag collects several spans. FP32 is classified on
 *   its bits (all exponent bits set: the same answer as !isfinite, no
 *   compare, no exception even for a signalling NaN), FP16 likewise. */
OPS_RANGE_SUPPORTS(nan_check_supports, ops_nan_check_check)
static int nan_check_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  if (!ops_range_run_checks(args, ops_nan_check_check)) return BP_ABI_ERR_INVALID;
  const int64_t n = bp_sdk_input(args, 0)->shape[3];
  int found = 0;
  if (bp_sdk_input(args, 0)->dtype == BP_ABI_DTYPE_FP32) {
    const float *x = bp_sdk_input_f32(args, 0);
    for (int64_t i = 0; i < n && !found; i++) found = bp_fp32_nonfinite(x[i]);
  } else {
    const uint16_t *x = (const uint16_t *)args->input_ptrs[0];
    for (int64_t i = 0; i < n && !found; i++) found = bp_fp16_nonfinite(x[i]);
  }
  if (found) *bp_sdk_output_f32(args, 0) = 1.0f;
  return BP_ABI_OK;
}

/* ---- range.unscale ------------------------------------------------------ */

/* range.unscale  in: src FP16 span, scale FP32 [1,1,1,1]   out: dst FP32 span
 *   (same E): dst = (float)src * inv with inv = 1.0f / scale, one FP32
 *   division (as PyTorch's GradScaler; exact for a power-of-two scale).
 *   The widening is exact and the product rounded once, so an Inf or NaN
 *   in src stays Inf or NaN in dst, and FP16's finite range times inv
 *   never overflows for scale >= 1. scale is read at run time and must be
 *   finite and > 0 (ops_unscale_factor); otherwise nothing is written. */
OPS_RANGE_SUPPORTS(unscale_supports, ops_unscale_check)
static int unscale_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  float inv;
  if (!ops_range_run_checks(args, ops_unscale_check) || !ops_unscale_factor(args, 1, &inv))
    return BP_ABI_ERR_INVALID;
  const uint16_t *src = (const uint16_t *)args->input_ptrs[0];
  float *dst = bp_sdk_output_f32(args, 0);
  const int64_t n = bp_sdk_input(args, 0)->shape[3];
  for (int64_t i = 0; i < n; i++) dst[i] = bp_unscale(src[i], inv);
  return BP_ABI_OK;
}

/* ---- range.loss_scale --------------------------------------------------- */

/* range.loss_scale  in: found_inf   out: scale, good_steps, step, skipped
 *   All FP32 [1,1,1,1]; the outputs are read and written (in place; no
 *   input aliases them). Once per step, after the update (PyTorch's
 *   GradScaler.update, torch._amp_update_scale_):
 *     found_inf != 0 (a NaN counts as nonzero):
 *       skipped += 1; good_steps = 0;
 *       scale *= backoff_factor when growth_interval > 0 (else unchanged)
 *     found_inf == 0:
 *       step += 1; good_steps += 1;
 *       when growth_interval > 0 and good_steps >= growth_interval:
 *         good_steps = 0; scale *= growth_factor when that product is
 *         finite (else scale stays: it never grows to Inf)
 *   Products and sums are FP32 (the counts are exact up to 2^24).
 *   Attributes: the whole bp_loss_scale_attrs block; growth_interval >= 0;
 *   with growth_interval > 0, growth_factor finite and >= 1 and
 *   backoff_factor in (0, 1] (a static scale, growth_interval 0, reads
 *   neither). run() refuses, writing nothing, a scale that is not finite
 *   and > 0 or a count that is not finite and >= 0. */
static int loss_scale_supports(void *user, const bp_abi_kernel_args *args, char *reason,
                               size_t rs) {
  (void)user;
  bp_loss_scale_attrs a;
  return ops_loss_scale_check(args, &a, reason, rs);
}
static int loss_scale_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  static const char *const outs[] = {"scale", "good_steps", "step", "skipped"};
  bp_loss_scale_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_loss_scale_check(args, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  float v[4]; /* scale, good_steps, step, skipped */
  for (int o = 0; o < 4; o++) memcpy(&v[o], args->output_ptrs[o], sizeof v[o]);
  const int bad = bp_loss_scale_bad(v);
  if (bad >= 0) {
    bp_sdk_set_reason(args, "%s %g must be finite and %s", outs[bad], (double)v[bad],
                      bad == 0 ? "> 0" : ">= 0");
    return BP_ABI_ERR_INVALID;
  }
  bp_loss_scale_update(ops_scalar_in(args, 0), v, a.growth_factor, a.backoff_factor,
                       a.growth_interval);
  for (int o = 0; o < 4; o++) memcpy(args->output_ptrs[o], &v[o], sizeof v[o]);
  return BP_ABI_OK;
}

/* ---- range.sgd ---------------------------------------------------------- */

/* range.sgd  in: grad, lr, [skip]   out: w, m (FP32 spans of one E; m read
 *   and written)
 *   As torch.optim.SGD (dampening 0, weight decay coupled into the gradient):
 *     g = grad + weight_decay*w          (skipped when weight_decay == 0)
 *     m = momentum*m + g                 (PyTorch starts its buffer at g on
 *                                         the first step: momentum*0 + g)
 *     u = nesterov ? g + momentum*m : m
 *     w = w - lr*u
 *   momentum == 0 gives plain SGD (m then holds the last g). Nesterov needs
 *   momentum > 0, as in PyTorch (ops_sgd_check). */
static int sgd_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_optimizer_attrs a;
  return ops_sgd_check(args, &a, reason, rs);
}
static int sgd_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_optimizer_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_sgd_check(args, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  if (ops_skip_set(args, a.has_skip)) return BP_ABI_OK;
  float lr, step;
  if (!ops_update_scalars(args, -1, &lr, &step)) return BP_ABI_ERR_INVALID;
  const float *grad = bp_sdk_input_f32(args, 0);
  float *w = bp_sdk_output_f32(args, 0), *m = bp_sdk_output_f32(args, 1);
  const float mu = a.momentum, wd = a.weight_decay;
  const int64_t n = bp_sdk_input(args, 0)->shape[3];
  for (int64_t i = 0; i < n; i++)
    bp_sgd(grad[i], &w[i], &m[i], lr, mu, wd, wd != 0.0f, a.nesterov);
  return BP_ABI_OK;
}

/* ---- range.adamw -------------------------------------------------------- */

/* range.adamw  in: grad, lr, step, [skip]   out: w, m, v (FP32 spans of one E)
 *   As torch.optim.AdamW (single-tensor path), t = step >= 1:
 *     w  = w * (1 - lr*weight_decay)                  (decoupled decay)
 *     m  = m*beta1 + (1-beta1)*g                      (mul_, add_ with alpha;
 *          PyTorch 1.13, Debian's; 2.x writes lerp(m, g, 1-beta1), the
 *          same value up to rounding)
 *     v  = v*beta2 + ((1-beta2)*g)*g                  (mul_, addcmul_)
 *     bc1 = 1 - beta1^t, bc2 = 1 - beta2^t, step_size = lr/bc1   (double)
 *     denom = sqrt(v) / sqrt(bc2) + eps
 *     w  = w + ((-step_size)*m) / denom               (addcdiv)
 *   which is w -= lr * (m/bc1) / (sqrt(v/bc2) + eps) of bp_abi_ops.h with
 *   PyTorch's placement of the bias corrections: eps is added after the
 *   division by sqrt(bc2), and 1/bc1 is folded into the step size.
 *   beta1, beta2 in [0, 1); eps > 0 (eps = 0 would turn zero padding into
 *   0/0); weight_decay >= 0 (ops_adamw_check). */
static int adamw_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_optimizer_attrs a;
  return ops_adamw_check(args, &a, reason, rs);
}
static int adamw_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_optimizer_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_adamw_check(args, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  if (ops_skip_set(args, a.has_skip)) return BP_ABI_OK;
  float lr, step;
  if (!ops_update_scalars(args, 2, &lr, &step)) return BP_ABI_ERR_INVALID;
  const bp_adamw_factors f =
      bp_adamw_factors_of(lr, step, a.beta1, a.beta2, a.weight_decay, a.eps);
  const float *grad = bp_sdk_input_f32(args, 0);
  float *w = bp_sdk_output_f32(args, 0), *m = bp_sdk_output_f32(args, 1);
  float *v = bp_sdk_output_f32(args, 2);
  const int64_t n = bp_sdk_input(args, 0)->shape[3];
  for (int64_t i = 0; i < n; i++) bp_adamw(&f, grad[i], &w[i], &m[i], &v[i]);
  return BP_ABI_OK;
}

/* ---- range.lars --------------------------------------------------------- */

/* range.lars  in: grad, lr, segments, [skip]   out: w, m, norms
 *   grad, w, m: FP32 spans of one E; segments: INT32 [1,1,1,S+1], S >= 1,
 *   offsets 0 <= s_0 <= s_1 <= ... <= s_S <= E (checked at run time),
 *   parameter j being elements [s_j, s_{j+1}) (its slot padding included);
 *   elements outside [s_0, s_S) are left untouched. norms: FP32
 *   [1,1,1,2S], overwritten: norms[2j] = |w_j|, norms[2j+1] = |g_j|, the
 *   L2 norms of the weights before the update and of the raw gradient,
 *   each summed in double in element order.
 *   Per parameter j:
 *     trust = eta*|w_j| / (|g_j| + weight_decay*|w_j|)   (1 when |w_j| or
 *             |g_j| is 0), in double; r = (float)(lr*trust)
 *     g' = grad + weight_decay*w         (skipped when weight_decay == 0)
 *     m = momentum*m + r*g';  w = w - m
 *   eta > 0, momentum and weight_decay >= 0, finite; nesterov is refused
 *   (the contract defines no Nesterov form of LARS). */
static int lars_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_optimizer_attrs a;
  return ops_lars_check(args, &a, reason, rs);
}
static int lars_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_optimizer_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_lars_check(args, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  if (ops_skip_set(args, a.has_skip)) return BP_ABI_OK; /* norms keep their last values too */
  float lr, step;
  if (!ops_update_scalars(args, -1, &lr, &step)) return BP_ABI_ERR_INVALID;
  const int32_t *seg = (const int32_t *)args->input_ptrs[2];
  const int64_t n = bp_sdk_input(args, 0)->shape[3], segs = bp_sdk_input(args, 2)->shape[3] - 1;
  for (int64_t j = 0; j <= segs; j++)
    if (!bp_lars_offset_ok(seg, j, n)) {
      bp_sdk_set_reason(args, "segments: offset %lld is %d, outside [%d, %lld]", (long long)j,
                        (int)seg[j], j ? (int)seg[j - 1] : 0, (long long)n);
      return BP_ABI_ERR_INVALID;
    }

  const float *grad = bp_sdk_input_f32(args, 0);
  float *w = bp_sdk_output_f32(args, 0), *m = bp_sdk_output_f32(args, 1);
  float *norms = bp_sdk_output_f32(args, 2);
  const float mu = a.momentum, wd = a.weight_decay;
  for (int64_t j = 0; j < segs; j++) {
    const int64_t lo = seg[j], hi = seg[j + 1];
    double ww = 0.0, gg = 0.0;
    for (int64_t i = lo; i < hi; i++) {
      ww += (double)w[i] * w[i];
      gg += (double)grad[i] * grad[i];
    }
    const double wn = sqrt(ww), gn = sqrt(gg);
    norms[2 * j] = (float)wn;
    norms[2 * j + 1] = (float)gn;
    const float r = bp_lars_rate(wn, gn, a.eta, wd, lr);
    for (int64_t i = lo; i < hi; i++) bp_lars(grad[i], &w[i], &m[i], r, mu, wd, wd != 0.0f);
  }
  return BP_ABI_OK;
}

/* ---- descriptors -------------------------------------------------------- */

const bp_abi_kernel ref_range_zero =
    REF_KERNEL_DT("range.zero", zero_supports, zero_run, 0, OPS_RANGE_ALL_DTYPES);
const bp_abi_kernel ref_range_copy =
    REF_KERNEL_DT("range.copy", copy_supports, copy_run, 0, OPS_RANGE_ALL_DTYPES);
const bp_abi_kernel ref_range_scale =
    REF_KERNEL("range.scale", scale_supports, scale_run, BP_ABI_KERNEL_IN_PLACE);
const bp_abi_kernel ref_range_cast =
    REF_KERNEL_DT("range.cast", cast_supports, cast_run, 0, OPS_RANGE_FLOAT_DTYPES);
const bp_abi_kernel ref_range_ema = REF_KERNEL("range.ema", ema_supports, ema_run, 0);
const bp_abi_kernel ref_range_nan_check =
    REF_KERNEL_DT("range.nan_check", nan_check_supports, nan_check_run, 0,
                  OPS_RANGE_FLOAT_DTYPES);
const bp_abi_kernel ref_range_unscale =
    REF_KERNEL_DT("range.unscale", unscale_supports, unscale_run, 0, OPS_RANGE_FLOAT_DTYPES);
const bp_abi_kernel ref_range_loss_scale =
    REF_KERNEL("range.loss_scale", loss_scale_supports, loss_scale_run, 0);
const bp_abi_kernel ref_range_sgd = REF_KERNEL("range.sgd", sgd_supports, sgd_run, 0);
const bp_abi_kernel ref_range_adamw = REF_KERNEL("range.adamw", adamw_supports, adamw_run, 0);
const bp_abi_kernel ref_range_lars =
    REF_KERNEL_DT("range.lars", lars_supports, lars_run, 0,
                  BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_INT32));
