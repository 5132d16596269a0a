/* Element-wise reference kernels: ReLU, add, GELU and GELU's tanh form,
 * forward and backward.
 *
 * Every tensor of one op has the same NHWC shape; each has its own device
 * strides (padded channels skipped, never read or written). FP32, no
 * alignment beyond 4 bytes, the 16-byte tail never read. Elements are
 * visited in (n, h, w, c) order, each read before it is written, so an
 * output may be the very same elements as an input (same pointer, shape and
 * strides) where the op says "may alias"; partial overlaps are refused. */
#include <math.h>

#include "reference-impl.h"
#include "shared/elem_math.h"
#include "shared/elementwise_check.h"

/* supports(): the element-wise check of a tensor list, by its counts */
static int one_in_one_out(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return ops_ew_check(args, 1, 1, &a, reason, rs);
}
static int two_in_one_out(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return ops_ew_check(args, 2, 1, &a, reason, rs);
}
static int one_in_two_out(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return ops_ew_check(args, 1, 2, &a, reason, rs);
}

/* y = f(x0[, x1]) element by element in (n, h, w, c) order, each element
 * read before it is written, so the output may be input `alias_in` itself
 * (-1: no alias allowed); a backward op adds into y when accumulate is 1. */
static int map_elements(const bp_abi_kernel_args *args, int inputs, int alias_in, int backward,
                        float (*f)(float x0, float x1)) {
  bp_elementwise_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  const int alias_out[] = {0}, alias_ins[] = {alias_in};
  if (!ops_ew_check(args, inputs, 1, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, alias_out, alias_ins, alias_in >= 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const int second = inputs > 1;
  const bp_abi_tensor *t0 = bp_sdk_input(args, 0), *t1 = bp_sdk_input(args, second);
  const bp_abi_tensor *ty = bp_sdk_output(args, 0);
  const float *x0 = bp_sdk_input_f32(args, 0), *x1 = bp_sdk_input_f32(args, second);
  float *y = bp_sdk_output_f32(args, 0);
  const int add = backward && a.accumulate;
  for (int64_t n = 0; n < t0->shape[0]; n++)
    for (int64_t h = 0; h < t0->shape[1]; h++)
      for (int64_t w = 0; w < t0->shape[2]; w++)
        for (int64_t c = 0; c < t0->shape[3]; c++) {
          const float v =
              f(x0[bp_sdk_offset(t0, n, h, w, c)], x1[bp_sdk_offset(t1, n, h, w, c)]);
          float *o = y + bp_sdk_offset(ty, n, h, w, c);
          *o = add ? *o + v : v;
        }
  return BP_ABI_OK;
}

/* relu.fwd
 *   in: x   out: y (may be x itself)   y = x < 0 ? 0 : x
 *   y is overwritten (no accumulate). NaN passes through (NaN < 0 is
 *   false), so a NaN check downstream still sees it. */
static float relu_y(float x, float unused) {
  (void)unused;
  return bp_relu_fwd(x);
}
static int relu_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  return map_elements(args, 1, 0, 0, relu_y);
}

/* relu.bwd
 *   in: y (the forward's output), dy   out: dx (may be dy itself)
 *   dx (+)= y > 0 ? dy : 0    accumulate 0: overwritten, 1: added.
 *   The gradient at y == 0 is 0. */
static int relu_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  return map_elements(args, 2, 1, 1, bp_relu_bwd);
}

/* add.fwd
 *   in: a, b (same shape)   out: y = a + b, overwritten (no accumulate).
 *   y aliases neither input. */
static int add_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_elementwise_attrs at;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_ew_check(args, 2, 1, &at, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *ta = bp_sdk_input(args, 0), *tb = bp_sdk_input(args, 1);
  const bp_abi_tensor *ty = bp_sdk_output(args, 0);
  const float *a = bp_sdk_input_f32(args, 0), *b = bp_sdk_input_f32(args, 1);
  float *y = bp_sdk_output_f32(args, 0);
  for (int64_t n = 0; n < ta->shape[0]; n++)
    for (int64_t h = 0; h < ta->shape[1]; h++)
      for (int64_t w = 0; w < ta->shape[2]; w++)
        for (int64_t c = 0; c < ta->shape[3]; c++)
          y[bp_sdk_offset(ty, n, h, w, c)] =
              a[bp_sdk_offset(ta, n, h, w, c)] + b[bp_sdk_offset(tb, n, h, w, c)];
  return BP_ABI_OK;
}

/* add.bwd
 *   in: dy   out: da, db   da (+)= dy, db (+)= dy
 *   accumulate 0: overwritten, 1: added. da and db alias neither dy nor
 *   each other. */
static int add_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_elementwise_attrs at;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_ew_check(args, 1, 2, &at, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tdy = bp_sdk_input(args, 0);
  const bp_abi_tensor *tda = bp_sdk_output(args, 0), *tdb = bp_sdk_output(args, 1);
  const float *dy = bp_sdk_input_f32(args, 0);
  float *da = bp_sdk_output_f32(args, 0), *db = bp_sdk_output_f32(args, 1);
  for (int64_t n = 0; n < tdy->shape[0]; n++)
    for (int64_t h = 0; h < tdy->shape[1]; h++)
      for (int64_t w = 0; w < tdy->shape[2]; w++)
        for (int64_t c = 0; c < tdy->shape[3]; c++) {
          const float g = dy[bp_sdk_offset(tdy, n, h, w, c)];
          float *pa = da + bp_sdk_offset(tda, n, h, w, c);
          float *pb = db + bp_sdk_offset(tdb, n, h, w, c);
          *pa = at.accumulate ? *pa + g : g;
          *pb = at.accumulate ? *pb + g : g;
        }
  return BP_ABI_OK;
}

/* gelu.fwd
 *   in: x   out: y = x * Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2, the
 *   exact (erf) form, computed in double and rounded once. y aliases no
 *   input, overwritten (no accumulate). */
static double gelu_cdf(double x) { return 0.5 * (1.0 + erf(x * 0.70710678118654752440)); }
static float gelu_y(float x, float unused) {
  (void)unused;
  return (float)((double)x * gelu_cdf(x));
}
static int gelu_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  return map_elements(args, 1, -1, 0, gelu_y);
}

/* gelu.bwd
 *   in: x (the forward's input), dy   out: dx
 *   dx (+)= dy * (Phi(x) + x * phi(x)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
 *   accumulate 0: overwritten, 1: added. dx aliases no input. */
static float gelu_dx(float x, float dy) {
  const double pdf = exp(-0.5 * (double)x * x) * 0.39894228040143267794;
  return (float)((double)dy * (gelu_cdf(x) + x * pdf));
}
static int gelu_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  return map_elements(args, 2, -1, 1, gelu_dx);
}

/* gelu_tanh.fwd
 *   in: x   out: y = x/2 * (1 + tanh(u)), u = sqrt(2/pi) * (x + 0.044715 x^3)
 *   (PyTorch's GELU(approximate='tanh')), in double, rounded once
 *   (bp_gelu_tanh_fwd, shared/elem_math.h). y aliases no input,
 *   overwritten (no accumulate). */
static int gelu_tanh_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_elementwise_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_ew_check(args, 1, 1, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tx = bp_sdk_input(args, 0), *ty = bp_sdk_output(args, 0);
  const float *x = bp_sdk_input_f32(args, 0);
  float *y = bp_sdk_output_f32(args, 0);
  for (int64_t n = 0; n < tx->shape[0]; n++)
    for (int64_t h = 0; h < tx->shape[1]; h++)
      for (int64_t w = 0; w < tx->shape[2]; w++)
        for (int64_t c = 0; c < tx->shape[3]; c++) {
          y[bp_sdk_offset(ty, n, h, w, c)] = bp_gelu_tanh_fwd(x[bp_sdk_offset(tx, n, h, w, c)]);
        }
  return BP_ABI_OK;
}

/* gelu_tanh.bwd
 *   in: x (the forward's input), dy   out: dx
 *   dx (+)= dy * (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)),
 *   t = tanh(u) as in the forward, in double, rounded once (bp_gelu_tanh_bwd).
 *   accumulate 0: overwritten, 1: added. dx aliases no input. */
static int gelu_tanh_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_elementwise_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!ops_ew_check(args, 2, 1, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tx = bp_sdk_input(args, 0), *tdy = bp_sdk_input(args, 1);
  const bp_abi_tensor *tdx = bp_sdk_output(args, 0);
  const float *x = bp_sdk_input_f32(args, 0), *dy = bp_sdk_input_f32(args, 1);
  float *dx = bp_sdk_output_f32(args, 0);
  for (int64_t n = 0; n < tx->shape[0]; n++)
    for (int64_t h = 0; h < tx->shape[1]; h++)
      for (int64_t w = 0; w < tx->shape[2]; w++)
        for (int64_t c = 0; c < tx->shape[3]; c++) {
          const float g = bp_gelu_tanh_bwd(x[bp_sdk_offset(tx, n, h, w, c)],
                                           dy[bp_sdk_offset(tdy, n, h, w, c)]);
          float *o = dx + bp_sdk_offset(tdx, n, h, w, c);
          *o = a.accumulate ? *o + g : g;
        }
  return BP_ABI_OK;
}

#define EW_ACC offsetof(bp_elementwise_attrs, accumulate)
/* the "may alias" pairs: relu.fwd y with x, relu.bwd dx with dy */
static const ops_fp16_kernel relu_fwd16 =
    REF_FP16_ALIAS(one_in_one_out, relu_run_fwd, OPS_FP16_NO_ACCUMULATE, 1, 0, 0, 0, 0);
static const ops_fp16_kernel relu_bwd16 =
    REF_FP16_ALIAS(two_in_one_out, relu_run_bwd, EW_ACC, 1, 0, 1, 0, 0);
static const ops_fp16_kernel add_fwd16 =
    REF_FP16(two_in_one_out, add_run_fwd, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel add_bwd16 = REF_FP16(one_in_two_out, add_run_bwd, EW_ACC);
static const ops_fp16_kernel gelu_fwd16 =
    REF_FP16(one_in_one_out, gelu_run_fwd, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel gelu_bwd16 = REF_FP16(two_in_one_out, gelu_run_bwd, EW_ACC);
const bp_abi_kernel ref_relu_fwd =
    REF_KERNEL16("relu.fwd", relu_fwd16, BP_ABI_KERNEL_IN_PLACE, REF_FP16_DTYPES);
const bp_abi_kernel ref_relu_bwd =
    REF_KERNEL16("relu.bwd", relu_bwd16, BP_ABI_KERNEL_IN_PLACE, REF_FP16_DTYPES);
const bp_abi_kernel ref_add_fwd = REF_KERNEL16("add.fwd", add_fwd16, 0, REF_FP16_DTYPES);
const bp_abi_kernel ref_add_bwd = REF_KERNEL16("add.bwd", add_bwd16, 0, REF_FP16_DTYPES);
const bp_abi_kernel ref_gelu_fwd = REF_KERNEL16("gelu.fwd", gelu_fwd16, 0, REF_FP16_DTYPES);
const bp_abi_kernel ref_gelu_bwd = REF_KERNEL16("gelu.bwd", gelu_bwd16, 0, REF_FP16_DTYPES);
static const ops_fp16_kernel gelu_tanh_fwd16 =
    REF_FP16(one_in_one_out, gelu_tanh_run_fwd, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel gelu_tanh_bwd16 =
    REF_FP16(two_in_one_out, gelu_tanh_run_bwd, EW_ACC);
const bp_abi_kernel ref_gelu_tanh_fwd =
    REF_KERNEL16("gelu_tanh.fwd", gelu_tanh_fwd16, 0, REF_FP16_DTYPES);
const bp_abi_kernel ref_gelu_tanh_bwd =
    REF_KERNEL16("gelu_tanh.bwd", gelu_tanh_bwd16, 0, REF_FP16_DTYPES);
