/* Argument checks of the range ops (bp_abi_ops.h: spans [1,1,1,E] of
 * regions, FP32 scalars): every range op's attribute and tensor checks,
 * the skip input, and the run-time scalar checks of the host kernels,
 * shared by the in-tree implementations (ops/reference/range.c,
 * ops/cpu/optim.c and range_fp16.c, ops/cuda/range.c), so all accept the
 * same nodes with the same reasons. The run-time conditions themselves
 * (lr, step, scale, skip) are ops/shared/elem_math.h's, which a CUDA
 * kernel evaluates on the device. Header-only (static inline), on the
 * module SDK. */
#ifndef BP_OPS_SHARED_RANGE_CHECK_H
#define BP_OPS_SHARED_RANGE_CHECK_H

#include <math.h>

#include "bp_abi_sdk.h"
#include "shared/elem_math.h"

/* The dtype masks of the descriptors: range.zero and range.copy take any
 * dtype; range.cast, range.nan_check and range.unscale FP32 and FP16. */
#define OPS_RANGE_ALL_DTYPES                                                               \
  (BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP16) |             \
   BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_INT8) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_INT32) |            \
   BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_BF16))
#define OPS_RANGE_FLOAT_DTYPES \
  (BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP16))

/* A span of `dtype` (any known dtype when dtype < 0): a valid tensor
 * (bp_sdk_check_tensor) shaped [1,1,1,E], contiguous. */
static inline int ops_span_check(const bp_abi_tensor *t, const char *name, int32_t dtype,
                                 char *reason, size_t rs) {
  if (dtype < 0) {
    if (bp_sdk_dtype_size(t->dtype) == 0)
      return bp_sdk_fail(reason, rs, "%s: unknown dtype %d", name, (int)t->dtype);
    dtype = t->dtype;
  }
  if (!bp_sdk_check_tensor(t, name, dtype, reason, rs)) return 0;
  if (t->shape[0] != 1 || t->shape[1] != 1 || t->shape[2] != 1)
    return bp_sdk_fail(reason, rs, "%s: a span is [1,1,1,elements], got [%lld,%lld,%lld,%lld]",
                       name, (long long)t->shape[0], (long long)t->shape[1],
                       (long long)t->shape[2], (long long)t->shape[3]);
  if (t->shape[3] > 1 && t->stride[3] != 1)
    return bp_sdk_fail(reason, rs, "%s: a span is contiguous, got element stride %lld", name,
                       (long long)t->stride[3]);
  return 1;
}

/* An FP32 scalar [1,1,1,1]. */
static inline int ops_scalar_check(const bp_abi_tensor *t, const char *name, char *reason,
                                   size_t rs) {
  return bp_sdk_check_tensor(t, name, BP_ABI_DTYPE_FP32, reason, rs) &&
         bp_sdk_check_shape(t, name, 1, 1, 1, 1, reason, rs);
}

/* Two spans of the same element count. */
static inline int ops_same_count(const bp_abi_tensor *a, const char *an, const bp_abi_tensor *b,
                                 const char *bn, char *reason, size_t rs) {
  if (a->shape[3] != b->shape[3])
    return bp_sdk_fail(reason, rs, "%s has %lld elements, %s has %lld; they must be equal", an,
                       (long long)a->shape[3], bn, (long long)b->shape[3]);
  return 1;
}

/* The byte just past `field` of struct `type`. */
#define OPS_FIELD_END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))

/* The attribute block, which must reach at least `needed` bytes (the end
 * of the last field the op reads): an op whose attribute would silently
 * read as zero (a scale of 0, an eps of 0) is refused instead. */
static inline int ops_attrs_check(const bp_abi_kernel_args *args, void *dst, size_t dst_size,
                                  size_t needed, const char *field, char *reason, size_t rs) {
  if (!bp_sdk_read_attrs(args, dst, dst_size, reason, rs)) return 0;
  if (args->attr_size < needed)
    return bp_sdk_fail(reason, rs, "attribute block of %u bytes lacks %s (needs %zu bytes)",
                       (unsigned)args->attr_size, field, needed);
  return 1;
}

static inline int ops_finite_at_least(float v, float lo, const char *name, char *reason,
                                      size_t rs) {
  if (!isfinite(v) || v < lo)
    return bp_sdk_fail(reason, rs, "%s %g must be finite and >= %g", name, (double)v,
                       (double)lo);
  return 1;
}

/* v in [0, 1] (closed_top) or [0, 1). */
static inline int ops_in_unit(float v, int closed_top, const char *name, char *reason,
                              size_t rs) {
  if (!(v >= 0.0f && (closed_top ? v <= 1.0f : v < 1.0f)))
    return bp_sdk_fail(reason, rs, "%s %g must be in [0, 1%c", name, (double)v,
                       closed_top ? ']' : ')');
  return 1;
}

/* The FP32 scalar input i (run() only). */
static inline float ops_scalar_in(const bp_abi_kernel_args *args, int i) {
  float v;
  memcpy(&v, args->input_ptrs[i], sizeof v);
  return v;
}

/* The spans of an update: grad (input 0), the scalar lr (input 1) and the
 * outputs 0..nout_spans-1, all FP32 with grad's E. */
static inline int ops_update_spans(const bp_abi_kernel_args *args, const char *const *out_names,
                                   int nout_spans, char *reason, size_t rs) {
  const bp_abi_tensor *g = bp_sdk_input(args, 0);
  if (!ops_span_check(g, "grad", BP_ABI_DTYPE_FP32, reason, rs) ||
      !ops_scalar_check(bp_sdk_input(args, 1), "lr", reason, rs))
    return 0;
  for (int o = 0; o < nout_spans; o++)
    if (!ops_span_check(bp_sdk_output(args, o), out_names[o], BP_ABI_DTYPE_FP32, reason, rs) ||
        !ops_same_count(g, "grad", bp_sdk_output(args, o), out_names[o], reason, rs))
      return 0;
  return 1;
}

typedef int (*ops_range_check_fn)(const bp_abi_kernel_args *args, char *reason, size_t rs);

/* The supports() of a range op whose whole check is `check`. */
#define OPS_RANGE_SUPPORTS(name, check)                                                    \
  static int name(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) { \
    (void)user;                                                                          \
    return check(args, reason, rs);                                                      \
  }

/* run()'s checks of a range op: its own, then no output overlapping an
 * input; the reason goes to args->reason. */
static inline int ops_range_run_checks(const bp_abi_kernel_args *args, ops_range_check_fn check) {
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  return check(args, reason, rs) && bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs);
}

/* range.zero  out: x, a span of any dtype. */
static inline int ops_zero_check(const bp_abi_kernel_args *args, char *reason, size_t rs) {
  bp_range_attrs a;
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  return bp_sdk_read_attrs(args, &a, sizeof a, reason, rs) &&
         bp_sdk_check_args(args, 0, 1, reason, rs) &&
         ops_span_check(bp_sdk_output(args, 0), "x", -1, reason, rs);
}

/* range.cast  in: src   out: dst: one FP32 span and one FP16 span of one E. */
static inline int ops_cast_check(const bp_abi_kernel_args *args, char *reason, size_t rs) {
  bp_range_attrs a;
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  if (!bp_sdk_read_attrs(args, &a, sizeof a, reason, rs) ||
      !bp_sdk_check_args(args, 1, 1, reason, rs))
    return 0;
  const bp_abi_tensor *src = bp_sdk_input(args, 0), *dst = bp_sdk_output(args, 0);
  const int32_t sd = src->dtype, dd = dst->dtype;
  if (!((sd == BP_ABI_DTYPE_FP32 && dd == BP_ABI_DTYPE_FP16) ||
        (sd == BP_ABI_DTYPE_FP16 && dd == BP_ABI_DTYPE_FP32)))
    return bp_sdk_fail(reason, rs,
                       "casts fp32 to fp16 or fp16 to fp32, got src dtype %d and dst dtype %d "
                       "(fp32 = %d, fp16 = %d)",
                       (int)sd, (int)dd, BP_ABI_DTYPE_FP32, BP_ABI_DTYPE_FP16);
  return ops_span_check(src, "src", sd, reason, rs) && ops_span_check(dst, "dst", dd, reason, rs) &&
         ops_same_count(src, "src", dst, "dst", reason, rs);
}

/* range.nan_check  in: x, an FP32 or FP16 span   out: flag, an FP32 scalar. */
static inline int ops_nan_check_check(const bp_abi_kernel_args *args, char *reason, size_t rs) {
  bp_range_attrs a;
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  if (!bp_sdk_read_attrs(args, &a, sizeof a, reason, rs) ||
      !bp_sdk_check_args(args, 1, 1, reason, rs))
    return 0;
  const bp_abi_tensor *x = bp_sdk_input(args, 0);
  if (x->dtype != BP_ABI_DTYPE_FP32 && x->dtype != BP_ABI_DTYPE_FP16)
    return bp_sdk_fail(reason, rs, "x: dtype %d, expected fp32 (%d) or fp16 (%d)", (int)x->dtype,
                       BP_ABI_DTYPE_FP32, BP_ABI_DTYPE_FP16);
  return ops_span_check(x, "x", x->dtype, reason, rs) &&
         ops_scalar_check(bp_sdk_output(args, 0), "flag", reason, rs);
}

/* range.unscale  in: src FP16 span, scale FP32 scalar   out: dst FP32 span
 * of src's E. */
static inline int ops_unscale_check(const bp_abi_kernel_args *args, char *reason, size_t rs) {
  bp_range_attrs a;
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  if (!bp_sdk_read_attrs(args, &a, sizeof a, reason, rs) ||
      !bp_sdk_check_args(args, 2, 1, reason, rs))
    return 0;
  const bp_abi_tensor *src = bp_sdk_input(args, 0), *dst = bp_sdk_output(args, 0);
  return ops_span_check(src, "src", BP_ABI_DTYPE_FP16, reason, rs) &&
         ops_scalar_check(bp_sdk_input(args, 1), "scale", reason, rs) &&
         ops_span_check(dst, "dst", BP_ABI_DTYPE_FP32, reason, rs) &&
         ops_same_count(src, "src", dst, "dst", reason, rs);
}

/* The trailing skip input (bp_abi_ops.h, ABI 1.5): has_skip is 0 or 1,
 * the op takes exactly `base_inputs` + has_skip inputs and `outputs`
 * outputs, and with has_skip the last input is an FP32 scalar named
 * "skip". */
static inline int ops_skip_args_check(const bp_abi_kernel_args *args, int32_t has_skip,
                                      int base_inputs, int outputs, char *reason, size_t rs) {
  if (!bp_sdk_check_flag(has_skip, "has_skip", reason, rs) ||
      !bp_sdk_check_args(args, base_inputs + has_skip, outputs, reason, rs))
    return 0;
  return !has_skip || ops_scalar_check(bp_sdk_input(args, base_inputs), "skip", reason, rs);
}

/* 1 when the op has a skip input (the last one) holding a nonzero value
 * (a NaN counts as nonzero): run() then returns BP_ABI_OK having written
 * nothing. run() only, after the checks. */
static inline int ops_skip_set(const bp_abi_kernel_args *args, int32_t has_skip) {
  return has_skip && bp_skip_set(ops_scalar_in(args, args->num_inputs - 1));
}

/* range.sgd  in: grad, lr, [skip]   out: w, m: momentum and weight_decay
 * finite and >= 0, nesterov 0 or 1 (and then momentum > 0). */
static inline int ops_sgd_check(const bp_abi_kernel_args *args, bp_optimizer_attrs *a,
                                char *reason, size_t rs) {
  static const char *const outs[] = {"w", "m"};
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  if (!ops_attrs_check(args, a, sizeof *a, OPS_FIELD_END(bp_optimizer_attrs, nesterov),
                       "momentum, weight_decay and nesterov", reason, rs) ||
      !ops_finite_at_least(a->momentum, 0.0f, "momentum", reason, rs) ||
      !ops_finite_at_least(a->weight_decay, 0.0f, "weight_decay", reason, rs) ||
      !bp_sdk_check_flag(a->nesterov, "nesterov", reason, rs))
    return 0;
  if (a->nesterov && a->momentum <= 0.0f)
    return bp_sdk_fail(reason, rs, "nesterov needs momentum > 0, got %g", (double)a->momentum);
  return ops_skip_args_check(args, a->has_skip, 2, 2, reason, rs) &&
         ops_update_spans(args, outs, 2, reason, rs);
}

/* range.adamw  in: grad, lr, step, [skip]   out: w, m, v: beta1, beta2 in [0, 1);
 * eps finite and > 0 (eps = 0 would turn zero padding into 0/0);
 * weight_decay finite and >= 0. */
static inline int ops_adamw_check(const bp_abi_kernel_args *args, bp_optimizer_attrs *a,
                                  char *reason, size_t rs) {
  static const char *const outs[] = {"w", "m", "v"};
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  if (!ops_attrs_check(args, a, sizeof *a, OPS_FIELD_END(bp_optimizer_attrs, eps),
                       "weight_decay, beta1, beta2 and eps", reason, rs) ||
      !ops_finite_at_least(a->weight_decay, 0.0f, "weight_decay", reason, rs) ||
      !ops_in_unit(a->beta1, 0, "beta1", reason, rs) ||
      !ops_in_unit(a->beta2, 0, "beta2", reason, rs))
    return 0;
  if (!isfinite(a->eps) || !(a->eps > 0.0f))
    return bp_sdk_fail(reason, rs, "eps %g must be finite and > 0", (double)a->eps);
  return ops_skip_args_check(args, a->has_skip, 3, 3, reason, rs) &&
         ops_update_spans(args, outs, 3, reason, rs) &&
         ops_scalar_check(bp_sdk_input(args, 2), "step", reason, rs);
}

/* range.copy  in: src   out: dst; spans of one dtype (any) and one E. */
static inline int ops_copy_check(const bp_abi_kernel_args *args, char *reason, size_t rs) {
  bp_range_attrs a;
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  if (!bp_sdk_read_attrs(args, &a, sizeof a, reason, rs) ||
      !bp_sdk_check_args(args, 1, 1, reason, rs))
    return 0;
  const bp_abi_tensor *src = bp_sdk_input(args, 0), *dst = bp_sdk_output(args, 0);
  if (!ops_span_check(src, "src", -1, reason, rs) ||
      !ops_span_check(dst, "dst", src->dtype, reason, rs))
    return 0;
  return ops_same_count(src, "src", dst, "dst", reason, rs);
}

/* range.scale  in: x   out: y (normally x: in place): FP32 spans of one E;
 * the attribute scale finite (0 allowed). */
static inline int ops_scale_check(const bp_abi_kernel_args *args, bp_range_attrs *a,
                                  char *reason, size_t rs) {
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  const size_t needed = OPS_FIELD_END(bp_range_attrs, scale);
  if (!ops_attrs_check(args, a, sizeof *a, needed, "scale", reason, rs))
    return 0;
  if (!isfinite(a->scale))
    return bp_sdk_fail(reason, rs, "scale %g must be finite", (double)a->scale);
  if (!bp_sdk_check_args(args, 1, 1, reason, rs)) return 0;
  const bp_abi_tensor *x = bp_sdk_input(args, 0), *y = bp_sdk_output(args, 0);
  return ops_span_check(x, "x", BP_ABI_DTYPE_FP32, reason, rs) &&
         ops_span_check(y, "y", BP_ABI_DTYPE_FP32, reason, rs) &&
         ops_same_count(x, "x", y, "y", reason, rs);
}

/* range.ema  in: w, [skip]   out: e: FP32 spans of one E; decay in [0, 1]. */
static inline int ops_ema_check(const bp_abi_kernel_args *args, bp_range_attrs *a, char *reason,
                                size_t rs) {
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  const size_t needed = OPS_FIELD_END(bp_range_attrs, decay);
  if (!ops_attrs_check(args, a, sizeof *a, needed, "decay", reason, rs) ||
      !ops_in_unit(a->decay, 1, "decay", reason, rs) ||
      !ops_skip_args_check(args, a->has_skip, 1, 1, reason, rs))
    return 0;
  const bp_abi_tensor *w = bp_sdk_input(args, 0), *e = bp_sdk_output(args, 0);
  return ops_span_check(w, "w", BP_ABI_DTYPE_FP32, reason, rs) &&
         ops_span_check(e, "e", BP_ABI_DTYPE_FP32, reason, rs) &&
         ops_same_count(w, "w", e, "e", reason, rs);
}

/* range.loss_scale  in: found_inf   out: scale, good_steps, step, skipped
 * (FP32 scalars): the whole bp_loss_scale_attrs block; growth_interval
 * >= 0; with growth_interval > 0, growth_factor finite and >= 1 and
 * backoff_factor in (0, 1]. */
static inline int ops_loss_scale_check(const bp_abi_kernel_args *args, bp_loss_scale_attrs *a,
                                       char *reason, size_t rs) {
  static const char *const outs[] = {"scale", "good_steps", "step", "skipped"};
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  if (!ops_attrs_check(args, a, sizeof *a, OPS_FIELD_END(bp_loss_scale_attrs, growth_interval),
                       "growth_factor, backoff_factor and growth_interval", reason, rs))
    return 0;
  if (a->growth_interval < 0)
    return bp_sdk_fail(reason, rs, "growth_interval %d must be >= 0", (int)a->growth_interval);
  if (a->growth_interval > 0) {
    if (!ops_finite_at_least(a->growth_factor, 1.0f, "growth_factor", reason, rs)) return 0;
    if (!(a->backoff_factor > 0.0f && a->backoff_factor <= 1.0f))
      return bp_sdk_fail(reason, rs, "backoff_factor %g must be in (0, 1]",
                         (double)a->backoff_factor);
  }
  if (!bp_sdk_check_args(args, 1, 4, reason, rs) ||
      !ops_scalar_check(bp_sdk_input(args, 0), "found_inf", reason, rs))
    return 0;
  for (int o = 0; o < 4; o++)
    if (!ops_scalar_check(bp_sdk_output(args, o), outs[o], reason, rs)) return 0;
  return 1;
}

/* range.lars  in: grad, lr, segments, [skip]   out: w, m, norms: FP32 spans
 * of one E, segments INT32 [1,1,1,S+1] with S >= 1, norms FP32 [1,1,1,2S];
 * eta finite and > 0, momentum and weight_decay finite and >= 0, nesterov
 * refused (the contract defines no Nesterov form of LARS). The offsets'
 * order is a run-time check (bp_lars_offset_ok). */
static inline int ops_lars_check(const bp_abi_kernel_args *args, bp_optimizer_attrs *a,
                                 char *reason, size_t rs) {
  static const char *const outs[] = {"w", "m"};
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  if (!ops_attrs_check(args, a, sizeof *a, OPS_FIELD_END(bp_optimizer_attrs, eta),
                       "momentum, weight_decay and eta", reason, rs) ||
      !ops_finite_at_least(a->momentum, 0.0f, "momentum", reason, rs) ||
      !ops_finite_at_least(a->weight_decay, 0.0f, "weight_decay", reason, rs) ||
      !bp_sdk_check_flag(a->nesterov, "nesterov", reason, rs))
    return 0;
  if (a->nesterov)
    return bp_sdk_fail(reason, rs, "nesterov is not defined for range.lars");
  if (!isfinite(a->eta) || !(a->eta > 0.0f))
    return bp_sdk_fail(reason, rs, "eta %g must be finite and > 0", (double)a->eta);
  if (!ops_skip_args_check(args, a->has_skip, 3, 3, reason, rs) ||
      !ops_update_spans(args, outs, 2, reason, rs))
    return 0;
  const bp_abi_tensor *seg = bp_sdk_input(args, 2), *norms = bp_sdk_output(args, 2);
  if (!ops_span_check(seg, "segments", BP_ABI_DTYPE_INT32, reason, rs) ||
      !ops_span_check(norms, "norms", BP_ABI_DTYPE_FP32, reason, rs))
    return 0;
  if (seg->shape[3] < 2)
    return bp_sdk_fail(reason, rs, "segments has %lld offsets; it needs S+1 >= 2",
                       (long long)seg->shape[3]);
  if (norms->shape[3] != 2 * (seg->shape[3] - 1))
    return bp_sdk_fail(reason, rs, "norms has %lld elements, expected 2*S = %lld",
                       (long long)norms->shape[3], (long long)(2 * (seg->shape[3] - 1)));
  return 1;
}

/* range.unscale's factor: inv = 1.0f / scale, one FP32 division, from the
 * scalar input `scale_input`, which must be finite and > 0; 0 with a
 * reason in the host's buffer otherwise (run() only). */
static inline int ops_unscale_factor(const bp_abi_kernel_args *args, int scale_input,
                                     float *inv) {
  const float scale = ops_scalar_in(args, scale_input);
  if (!bp_unscale_scale_ok(scale)) {
    bp_sdk_set_reason(args, "scale %g must be finite and > 0", (double)scale);
    return 0;
  }
  *inv = bp_unscale_inv(scale);
  return 1;
}

/* The run-time scalars of an update, checked before anything is written:
 * lr finite; step (AdamW, step_input >= 0) finite and >= 1. 0 with a
 * reason in the host's buffer otherwise. */
static inline int ops_update_scalars(const bp_abi_kernel_args *args, int step_input, float *lr,
                                     float *step) {
  *lr = ops_scalar_in(args, 1);
  if (!bp_lr_ok(*lr)) {
    bp_sdk_set_reason(args, "lr %g must be finite", (double)*lr);
    return 0;
  }
  if (step_input < 0) return 1;
  *step = ops_scalar_in(args, step_input);
  if (!bp_step_ok(*step)) {
    bp_sdk_set_reason(args, "step %g must be finite and >= 1", (double)*step);
    return 0;
  }
  return 1;
}

#endif
