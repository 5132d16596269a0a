/* ops/cuda: the range family's kernel descriptors and argument checks,
 * device "cuda", implementation "cuda". Each op accepts exactly the nodes
 * the reference accepts, with the reference's reasons (the checks are
 * ops/shared/range_check.h), and has the reference's semantics
 * (ops/reference/range.c, bp_abi_ops.h); the kernels and the launch
 * shapes are range_kernels.cu.
 *
 * run() checks the arguments and the pointers on the host (shapes and
 * attributes only: no device memory is read here), then enqueues the
 * launch on args->stream. The scalar inputs (lr, step, scale, found_inf,
 * skip, the loss-scale state, LARS's offsets) are read by the kernels on
 * the device, so the host never synchronizes and every kernel may be
 * captured in a CUDA graph. What the reference refuses at run time from
 * those scalars (lr not finite, step < 1, ...) the kernels answer by
 * writing nothing (range-impl.h); run() cannot report it.
 *
 * Bits: every element goes through the reference's formula
 * (ops/shared/elem_math.h) with no contracted multiply-add, so every op
 * but range.lars gives the reference's bits (AdamW's factors use the
 * device's pow(), which may differ from the host libm's in the last bit
 * of a double; see elem_math.h). range.lars sums its norms in a fixed
 * tree (deterministic on every GPU) instead of the reference's element
 * order, so its norms and rates match the reference's to rounding. */
#include "cuda-impl.h"
#include "range-impl.h"
#include "shared/range_check.h"

/* Custom CUDA kernels (ops/README.md's priority scale: above the CPU
 * modules, below a vendor library's kernel of the same op). */
#define RANGE_PRIORITY 15
#define RANGE_FLAGS (BP_ABI_KERNEL_DETERMINISTIC | BP_ABI_KERNEL_GRAPH_CAPTURABLE)
#define RANGE_KERNEL(op_name, supports_fn, run_fn, ws_fn, extra_flags, dtype_mask)                 \
  {                                                                                                \
    .struct_size = sizeof(bp_abi_kernel), .op = (op_name), .impl = "cuda", .device = "cuda",       \
    .dtypes = (dtype_mask), .priority = RANGE_PRIORITY, .flags = RANGE_FLAGS | (extra_flags),      \
    .supports = (supports_fn), .workspace_size = (ws_fn), .run = (run_fn)                          \
  }
#define RANGE_FP32 BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32)

/* The elements of the span input i. */
static int64_t in_n(const bp_abi_kernel_args *args, int i) {
  return bp_sdk_input(args, i)->shape[3];
}

/* The FP32 scalar input i as a device pointer. */
static const float *in_f32(const bp_abi_kernel_args *args, int i) {
  return (const float *)args->input_ptrs[i];
}

/* Output i as an FP32 device pointer. */
static float *out_f32(const bp_abi_kernel_args *args, int i) {
  return (float *)args->output_ptrs[i];
}

/* The skip input (the last one) when the op has one, else NULL. */
static const float *skip_ptr(const bp_abi_kernel_args *args, int32_t has_skip) {
  return has_skip ? in_f32(args, args->num_inputs - 1) : NULL;
}

/* run()'s check with an attribute block: the op's check, then no output
 * overlapping an input except the listed in-place pairs. */
static int run_ok(const bp_abi_kernel_args *args, int checked, const int *alias_out,
                  const int *alias_in, int alias_count) {
  return checked && bp_sdk_check_ptrs(args, alias_out, alias_in, alias_count,
                                      bp_sdk_args_reason(args), bp_sdk_args_reason_size(args));
}

/* ---- range.zero, range.copy ------------------------------------------------ */

OPS_RANGE_SUPPORTS(zero_supports, ops_zero_check)
static int zero_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  if (!ops_range_run_checks(args, ops_zero_check)) return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *t = bp_sdk_output(args, 0);
  const uint64_t bytes = (uint64_t)t->shape[3] * bp_sdk_dtype_size(t->dtype);
  return cuda_launch_result(args, "range.zero",
                            cuda_range_zero(args->output_ptrs[0], bytes, args->stream));
}

OPS_RANGE_SUPPORTS(copy_supports, ops_copy_check)
static int copy_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  if (!ops_range_run_checks(args, ops_copy_check)) return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *t = bp_sdk_input(args, 0);
  const uint64_t bytes = (uint64_t)t->shape[3] * bp_sdk_dtype_size(t->dtype);
  return cuda_launch_result(
      args, "range.copy",
      cuda_range_copy(args->output_ptrs[0], args->input_ptrs[0], bytes, args->stream));
}

/* ---- range.scale (in place) ------------------------------------------------ */

static int scale_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_range_attrs a;
  return ops_scale_check(args, &a, reason, rs);
}
static int scale_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_range_attrs a;
  static const int alias_out[] = {0}, alias_in[] = {0};
  if (!run_ok(args,
              ops_scale_check(args, &a, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args)),
              alias_out, alias_in, 1))
    return BP_ABI_ERR_INVALID;
  return cuda_launch_result(args, "range.scale",
                            cuda_range_scale(in_f32(args, 0), (float *)args->output_ptrs[0],
                                             in_n(args, 0), a.scale, args->stream));
}

/* ---- range.cast ------------------------------------------------------------ */

OPS_RANGE_SUPPORTS(cast_supports, ops_cast_check)
static int cast_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  if (!ops_range_run_checks(args, ops_cast_check)) return BP_ABI_ERR_INVALID;
  const int64_t n = in_n(args, 0);
  const int rc =
      bp_sdk_input(args, 0)->dtype == BP_ABI_DTYPE_FP32
          ? cuda_range_narrow(in_f32(args, 0), (uint16_t *)args->output_ptrs[0], n, args->stream)
          : cuda_range_widen((const uint16_t *)args->input_ptrs[0], (float *)args->output_ptrs[0],
                             n, args->stream);
  return cuda_launch_result(args, "range.cast", rc);
}

/* ---- range.ema ------------------------------------------------------------- */

static int ema_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_range_attrs a;
  return ops_ema_check(args, &a, reason, rs);
}
static int ema_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_range_attrs a;
  if (!run_ok(args,
              ops_ema_check(args, &a, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args)),
              NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  return cuda_launch_result(args, "range.ema",
                            cuda_range_ema(in_f32(args, 0), (float *)args->output_ptrs[0],
                                           in_n(args, 0), a.decay, bp_one_minus(a.decay),
                                           skip_ptr(args, a.has_skip), args->stream));
}

/* ---- range.nan_check, range.unscale ------------------------------------------ */

OPS_RANGE_SUPPORTS(nan_check_supports, ops_nan_check_check)
static int nan_check_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  if (!ops_range_run_checks(args, ops_nan_check_check)) return BP_ABI_ERR_INVALID;
  return cuda_launch_result(
      args, "range.nan_check",
      cuda_range_nan_check(args->input_ptrs[0], bp_sdk_input(args, 0)->dtype == BP_ABI_DTYPE_FP16,
                           in_n(args, 0), (float *)args->output_ptrs[0], args->stream));
}

OPS_RANGE_SUPPORTS(unscale_supports, ops_unscale_check)
static int unscale_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  if (!ops_range_run_checks(args, ops_unscale_check)) return BP_ABI_ERR_INVALID;
  return cuda_launch_result(args, "range.unscale",
                            cuda_range_unscale((const uint16_t *)args->input_ptrs[0],
                                               in_f32(args, 1), (float *)args->output_ptrs[0],
                                               in_n(args, 0), args->stream));
}

/* ---- range.loss_scale ------------------------------------------------------ */

static int loss_scale_supports(void *user, const bp_abi_kernel_args *args, char *reason,
                               size_t rs) {
  (void)user;
  bp_loss_scale_attrs a;
  return ops_loss_scale_check(args, &a, reason, rs);
}
static int loss_scale_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_loss_scale_attrs a;
  if (!run_ok(
          args,
          ops_loss_scale_check(args, &a, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args)),
          NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  return cuda_launch_result(
      args, "range.loss_scale",
      cuda_range_loss_scale(in_f32(args, 0), out_f32(args, 0), out_f32(args, 1), out_f32(args, 2),
                            out_f32(args, 3), a.growth_factor, a.backoff_factor, a.growth_interval,
                            args->stream));
}

/* ---- range.sgd, range.adamw -------------------------------------------------- */

static int sgd_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_optimizer_attrs a;
  return ops_sgd_check(args, &a, reason, rs);
}
static int sgd_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_optimizer_attrs a;
  if (!run_ok(args,
              ops_sgd_check(args, &a, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args)),
              NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  return cuda_launch_result(args, "range.sgd",
                            cuda_range_sgd(in_f32(args, 0), in_f32(args, 1),
                                           skip_ptr(args, a.has_skip), out_f32(args, 0),
                                           out_f32(args, 1), in_n(args, 0), a.momentum,
                                           a.weight_decay, a.nesterov, args->stream));
}

static int adamw_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_optimizer_attrs a;
  return ops_adamw_check(args, &a, reason, rs);
}
static int adamw_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_optimizer_attrs a;
  if (!run_ok(args,
              ops_adamw_check(args, &a, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args)),
              NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  return cuda_launch_result(args, "range.adamw",
                            cuda_range_adamw(in_f32(args, 0), in_f32(args, 1), in_f32(args, 2),
                                             skip_ptr(args, a.has_skip), out_f32(args, 0),
                                             out_f32(args, 1), out_f32(args, 2), in_n(args, 0),
                                             a.beta1, a.beta2, a.weight_decay, a.eps,
                                             args->stream));
}

/* ---- range.lars -------------------------------------------------------------- */

static int lars_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_optimizer_attrs a;
  return ops_lars_check(args, &a, reason, rs);
}

/* The partial sums, rates and flag of cuda_lars_workspace_bytes for the
 * S of the segments input (0 for args the checks refuse). */
static uint64_t lars_workspace(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_optimizer_attrs a;
  if (!ops_lars_check(args, &a, NULL, 0)) return 0;
  return cuda_lars_workspace_bytes(in_n(args, 2) - 1);
}

static int lars_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_optimizer_attrs a;
  if (!run_ok(args,
              ops_lars_check(args, &a, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args)),
              NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const int64_t segs = in_n(args, 2) - 1;
  const uint64_t need = cuda_lars_workspace_bytes(segs);
  if (!args->workspace || args->workspace_bytes < need ||
      (uintptr_t)args->workspace % sizeof(double) != 0) {
    bp_sdk_set_reason(args,
                      "range.lars: workspace of %llu bytes at %p, needs %llu bytes, "
                      "8-byte aligned",
                      (unsigned long long)(args->workspace ? args->workspace_bytes : 0),
                      args->workspace, (unsigned long long)need);
    return BP_ABI_ERR_INVALID;
  }
  return cuda_launch_result(
      args, "range.lars",
      cuda_range_lars(in_f32(args, 0), in_f32(args, 1), (const int32_t *)args->input_ptrs[2], segs,
                      skip_ptr(args, a.has_skip), out_f32(args, 0), out_f32(args, 1),
                      out_f32(args, 2), in_n(args, 0), a.momentum, a.weight_decay, a.eta,
                      args->workspace, args->stream));
}

/* ---- descriptors ------------------------------------------------------------- */

static const bp_abi_kernel range_zero =
    RANGE_KERNEL("range.zero", zero_supports, zero_run, NULL, 0, OPS_RANGE_ALL_DTYPES);
static const bp_abi_kernel range_copy =
    RANGE_KERNEL("range.copy", copy_supports, copy_run, NULL, 0, OPS_RANGE_ALL_DTYPES);
static const bp_abi_kernel range_scale = RANGE_KERNEL("range.scale", scale_supports, scale_run,
                                                      NULL, BP_ABI_KERNEL_IN_PLACE, RANGE_FP32);
static const bp_abi_kernel range_cast =
    RANGE_KERNEL("range.cast", cast_supports, cast_run, NULL, 0, OPS_RANGE_FLOAT_DTYPES);
static const bp_abi_kernel range_ema =
    RANGE_KERNEL("range.ema", ema_supports, ema_run, NULL, 0, RANGE_FP32);
static const bp_abi_kernel range_nan_check = RANGE_KERNEL(
    "range.nan_check", nan_check_supports, nan_check_run, NULL, 0, OPS_RANGE_FLOAT_DTYPES);
static const bp_abi_kernel range_unscale =
    RANGE_KERNEL("range.unscale", unscale_supports, unscale_run, NULL, 0, OPS_RANGE_FLOAT_DTYPES);
static const bp_abi_kernel range_loss_scale =
    RANGE_KERNEL("range.loss_scale", loss_scale_supports, loss_scale_run, NULL, 0, RANGE_FP32);
static const bp_abi_kernel range_sgd =
    RANGE_KERNEL("range.sgd", sgd_supports, sgd_run, NULL, 0, RANGE_FP32);
static const bp_abi_kernel range_adamw =
    RANGE_KERNEL("range.adamw", adamw_supports, adamw_run, NULL, 0, RANGE_FP32);
static const bp_abi_kernel range_lars =
    RANGE_KERNEL("range.lars", lars_supports, lars_run, lars_workspace, 0,
                 RANGE_FP32 | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_INT32));

const bp_abi_kernel *const cuda_range_kernels[] = {
    &range_zero,    &range_copy,       &range_scale, &range_cast,  &range_ema,  &range_nan_check,
    &range_unscale, &range_loss_scale, &range_sgd,   &range_adamw, &range_lars,
};
const size_t cuda_range_kernel_count = sizeof cuda_range_kernels / sizeof cuda_range_kernels[0];
