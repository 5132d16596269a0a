/* relu.fwd and add.fwd through XNNPACK's clamp_nc and add_nd operators,
 * FP32 and FP16; created at prepare, set up again only when a pointer or
 * the batch changes.
 *
 * relu.fwd: clamp to [0, +inf] over N*H*W rows of C channels, rows
 * padded_c apart (XNNPACK's input_stride / output_stride), so padded
 * channels are neither used nor written. y may be x (IN_PLACE). One
 * difference from the reference (v < 0 ? 0 : v): XNNPACK's clamp is a
 * max(), which turns a NaN into 0 and -0.0 into +0.0; numbers are equal.
 *
 * add.fwd: one flat add over the tensors when all three are dense (no
 * channel padding): XNNPACK's add takes no strides, and over padded
 * tensors it would write y's padding (rule 2 of bp_abi_ops.h), so those
 * are refused and another implementation serves them. */
#include <math.h>

#include "shared/elementwise_check.h"
#include "xnn-impl.h"

static int ew_check(const bp_abi_kernel_args *args, int nin, int *dtype, char *reason,
                    size_t rs) {
  xnnp_args_view v;
  bp_elementwise_attrs a;
  *dtype = xnnp_view_as_fp32(args, &v, reason, rs);
  if (*dtype < 0 || !ops_ew_check(&v.args, nin, 1, &a, reason, rs)) return 0;
  if (*dtype == BP_ABI_DTYPE_FP16 && !xnnp_fp16_available())
    return bp_sdk_fail(reason, rs, "%s", xnnp_fp16_reason());
  static const char *const names[] = {"input 0", "input 1"};
  for (int i = 0; i < nin; i++)
    if (!xnnp_standard_nhwc(bp_sdk_input(args, i), names[i], reason, rs)) return 0;
  return xnnp_standard_nhwc(bp_sdk_output(args, 0), "output 0", reason, rs);
}



/* ---- relu.fwd ------------------------------------------------------------------------ */

static int relu_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  int dtype;
  return ew_check(args, 1, &dtype, reason, rs);
}

static int relu_create(xnn_node *s, const bp_abi_kernel_args *args) {
  int dtype;
  if (!ew_check(args, 1, &dtype, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args)))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *x = bp_sdk_input(args, 0), *y = bp_sdk_output(args, 0);
  const size_t c = (size_t)x->shape[3];
  const enum xnn_status st =
      dtype == BP_ABI_DTYPE_FP32
          ? xnn_create_clamp_nc_f32(c, (size_t)x->padded_c, (size_t)y->padded_c, 0.0f, INFINITY,
                                    0, &s->op)
          : xnn_create_clamp_nc_f16(c, (size_t)x->padded_c, (size_t)y->padded_c, 0.0f, INFINITY,
                                    0, &s->op);
  if (st != xnn_status_success) {
    s->op = NULL;
    return xnnp_fail(args, "clamp create", st);
  }
  return BP_ABI_OK;
}

static int relu_prepare(void *user, const bp_abi_kernel_args *args, void **state_out) {
  return xnn_node_prepare(user, args, state_out, relu_create);
}

static int relu_run(void *user, const bp_abi_kernel_args *args) {
  int dtype;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  static const int alias_out[] = {0}, alias_in[] = {0};
  if (!ew_check(args, 1, &dtype, reason, rs) ||
      !bp_sdk_check_ptrs(args, alias_out, alias_in, 1, reason, rs))
    return BP_ABI_ERR_INVALID;
  xnn_node *s, *tmp;
  int rc = xnn_node_for_run(user, args, &s, &tmp, relu_create);
  if (rc != BP_ABI_OK) return rc;
  const bp_abi_tensor *x = bp_sdk_input(args, 0);
  const void *xp = args->input_ptrs[0];
  void *yp = args->output_ptrs[0];
  const int64_t rows = x->shape[0] * x->shape[1] * x->shape[2];
  pthreadpool_t pool = xnnp_pool_handle(s->pool);
  if (!xnn_node_setup_current(s, xp, NULL, yp, NULL, rows)) {
    const enum xnn_status st =
        dtype == BP_ABI_DTYPE_FP32
            ? xnn_setup_clamp_nc_f32(s->op, (size_t)rows, xp, yp, pool)
            : xnn_setup_clamp_nc_f16(s->op, (size_t)rows, xp, yp, pool);
    if (st != xnn_status_success) {
      s->set_batch = -1;
      rc = xnnp_fail(args, "clamp setup", st);
      goto out;
    }
  }
  const enum xnn_status st = xnn_run_operator(s->op, pool);
  if (st != xnn_status_success) rc = xnnp_fail(args, "clamp run", st);
out:
  xnn_node_release(NULL, tmp);
  return rc;
}

const bp_abi_kernel xnnp_relu_fwd = {
    .struct_size = sizeof(bp_abi_kernel),
    .op = "relu.fwd",
    .impl = "xnnpack",
    .device = "cpu",
    .dtypes = XNNP_DTYPES,
    .priority = XNNP_PRIORITY_BELOW_CPU,
    .flags = XNNP_FLAGS | BP_ABI_KERNEL_IN_PLACE,
    .supports = relu_supports,
    .run = relu_run,
    .prepare = relu_prepare,
    .release = xnn_node_release,
};

/* ---- add.fwd ------------------------------------------------------------------------- */

static int add_check(const bp_abi_kernel_args *args, int *dtype, char *reason, size_t rs) {
  if (!ew_check(args, 2, dtype, reason, rs)) return 0;
  const bp_abi_tensor *t[3] = {bp_sdk_input(args, 0), bp_sdk_input(args, 1),
                               bp_sdk_output(args, 0)};
  static const char *const names[] = {"input 0", "input 1", "output 0"};
  for (int i = 0; i < 3; i++)
    if (t[i]->padded_c != t[i]->shape[3])
      return bp_sdk_fail(reason, rs,
                         "%s: channels padded (%lld of %lld): XNNPACK's add takes dense tensors "
                         "and would write the output's padding",
                         names[i], (long long)t[i]->shape[3], (long long)t[i]->padded_c);
  return 1;
}

static int add_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  int dtype;
  return add_check(args, &dtype, reason, rs);
}

static int add_create(xnn_node *s, const bp_abi_kernel_args *args) {
  int dtype;
  if (!add_check(args, &dtype, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args)))
    return BP_ABI_ERR_INVALID;
  const enum xnn_status st = dtype == BP_ABI_DTYPE_FP32
                                 ? xnn_create_add_nd_f32(-INFINITY, INFINITY, 0, &s->op)
                                 : xnn_create_add_nd_f16(-INFINITY, INFINITY, 0, &s->op);
  if (st != xnn_status_success) {
    s->op = NULL;
    return xnnp_fail(args, "add create", st);
  }
  return BP_ABI_OK;
}

static int add_prepare(void *user, const bp_abi_kernel_args *args, void **state_out) {
  return xnn_node_prepare(user, args, state_out, add_create);
}

static int add_run(void *user, const bp_abi_kernel_args *args) {
  int dtype;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!add_check(args, &dtype, reason, rs) || !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  xnn_node *s, *tmp;
  int rc = xnn_node_for_run(user, args, &s, &tmp, add_create);
  if (rc != BP_ABI_OK) return rc;
  const size_t count[1] = {(size_t)bp_sdk_count(bp_sdk_input(args, 0))};
  const void *a = args->input_ptrs[0], *b = args->input_ptrs[1];
  void *y = args->output_ptrs[0];
  pthreadpool_t pool = xnnp_pool_handle(s->pool);
  if (!xnn_node_setup_current(s, a, b, y, NULL, (int64_t)count[0])) {
    const enum xnn_status st =
        dtype == BP_ABI_DTYPE_FP32
            ? xnn_setup_add_nd_f32(s->op, 1, count, 1, count, a, b, y, pool)
            : xnn_setup_add_nd_f16(s->op, 1, count, 1, count, a, b, y, pool);
    if (st != xnn_status_success) {
      s->set_batch = -1;
      rc = xnnp_fail(args, "add setup", st);
      goto out;
    }
  }
  const enum xnn_status st = xnn_run_operator(s->op, pool);
  if (st != xnn_status_success) rc = xnnp_fail(args, "add run", st);
out:
  xnn_node_release(NULL, tmp);
  return rc;
}

const bp_abi_kernel xnnp_add_fwd = {
    .struct_size = sizeof(bp_abi_kernel),
    .op = "add.fwd",
    .impl = "xnnpack",
    .device = "cpu",
    .dtypes = XNNP_DTYPES,
    .priority = XNNP_PRIORITY,
    .flags = XNNP_FLAGS,
    .supports = add_supports,
    .run = add_run,
    .prepare = add_prepare,
    .release = xnn_node_release,
};
