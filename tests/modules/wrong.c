/* Kernels that each break one rule, for `blueprint validate` and autotune
 * tests: validate must name each with a failing case, and autotune must
 * never pick one. Device "cpu", FP32, priority BP_ABI_PRIORITY_USER (so
 * plain selection would prefer them), flagged DETERMINISTIC:
 *   fc.bwd_data/noacc     correct dx, but overwrites when accumulate = 1
 *   fc.bwd_data/offset    honours accumulate, but adds 1e-3 to every dx
 *   relu.fwd/padwrite     correct y, but also writes y's channel padding
 *   relu.fwd/overread     correct y, but reads the element right after
 *                         x's slot (past slot_bytes)
 *   add.fwd/trunc16       FP16 only: the FP32 sum truncated toward zero,
 *                         not rounded to nearest (caught by the FP16
 *                         tolerance: one rounding)
 *   range.sgd/noskip      FP32 SGD (no nesterov) that ignores the skip input
 * The fc kernels take compact tensors only (supports() says so). One kernel
 * is right, to show FP16 cases against the FP32 reference pass:
 *   relu.fwd/half         FP16 only, correct */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bp_abi_ops.h"
#include "bp_abi_sdk.h"
#include "test_module.h"

/* ---- fc.bwd_data: dx[n, f] (+)= sum_o dy[n, o] * w[o, f] (+ offset) -------- */

static int fc_supports(void *user, const bp_abi_kernel_args *a, char *reason, size_t size) {
  (void)user;
  if (a->num_inputs != 2 || a->num_outputs != 1) {
    snprintf(reason, size, "wants 2 inputs and 1 output");
    return 0;
  }
  const bp_abi_tensor *dy = &a->inputs[0], *w = &a->inputs[1], *dx = &a->outputs[0];
  if (dy->padded_c != dy->shape[3] || dx->padded_c != dx->shape[3] ||
      w->padded_c != w->shape[3]) {
    snprintf(reason, size, "compact tensors only");
    return 0;
  }
  if (w->shape[3] != dx->shape[1] * dx->shape[2] * dx->shape[3] || w->shape[0] != dy->shape[3]) {
    snprintf(reason, size, "shapes do not fit");
    return 0;
  }
  return 1;
}

static int fc_bwd_data(const bp_abi_kernel_args *a, int honour_accumulate, float offset) {
  const bp_abi_tensor *dyt = &a->inputs[0], *dxt = &a->outputs[0];
  const float *dy = a->input_ptrs[0], *w = a->input_ptrs[1];
  float *dx = a->output_ptrs[0];
  bp_fc_attrs at = {0, 0};
  if (a->attrs && a->attr_size >= sizeof at) at = *(const bp_fc_attrs *)a->attrs;
  const int64_t n = dyt->shape[0], o = dyt->shape[3];
  const int64_t f = dxt->shape[1] * dxt->shape[2] * dxt->shape[3];
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < f; j++) {
      double s = offset;
      for (int64_t k = 0; k < o; k++) s += (double)dy[i * o + k] * w[k * f + j];
      if (honour_accumulate && at.accumulate) dx[i * f + j] += (float)s;
      else dx[i * f + j] = (float)s;
    }
  return BP_ABI_OK;
}

static int noacc_run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  return fc_bwd_data(a, 0, 0.0f);
}

static int offset_run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  return fc_bwd_data(a, 1, 1e-3f);
}

/* ---- relu.fwd ----------------------------------------------------------------- */

static int relu_supports(void *user, const bp_abi_kernel_args *a, char *reason, size_t size) {
  (void)user;
  if (a->num_inputs != 1 || a->num_outputs != 1) {
    snprintf(reason, size, "wants 1 input and 1 output");
    return 0;
  }
  return 1;
}

/* Every element of the padded layout, padding included. */
static int padwrite_run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  const bp_abi_tensor *t = &a->inputs[0];
  const float *x = a->input_ptrs[0];
  float *y = a->output_ptrs[0];
  const int64_t count = t->shape[0] * t->stride[0];
  for (int64_t i = 0; i < count; i++) y[i] = x[i] > 0 ? x[i] : 0; /* NaN padding: 0 */
  return BP_ABI_OK;
}

/* The logical elements, after a look at the float right past x's slot. */
static int overread_run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  const bp_abi_tensor *t = &a->inputs[0], *yt = &a->outputs[0];
  const float *x = a->input_ptrs[0];
  float *y = a->output_ptrs[0];
  const volatile float *past = x + t->slot_bytes / sizeof(float);
  (void)*past;
  for (int64_t n = 0; n < t->shape[0]; n++)
    for (int64_t h = 0; h < t->shape[1]; h++)
      for (int64_t w = 0; w < t->shape[2]; w++)
        for (int64_t c = 0; c < t->shape[3]; c++) {
          const float v = x[n * t->stride[0] + h * t->stride[1] + w * t->stride[2] + c];
          y[n * yt->stride[0] + h * yt->stride[1] + w * yt->stride[2] + c] = v > 0 ? v : 0;
        }
  return BP_ABI_OK;
}

/* y = max(x, 0) in FP16, over the logical elements. */
static int half_run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  const bp_abi_tensor *t = &a->inputs[0], *yt = &a->outputs[0];
  const uint16_t *x = a->input_ptrs[0];
  uint16_t *y = a->output_ptrs[0];
  for (int64_t n = 0; n < t->shape[0]; n++)
    for (int64_t h = 0; h < t->shape[1]; h++)
      for (int64_t w = 0; w < t->shape[2]; w++)
        for (int64_t c = 0; c < t->shape[3]; c++) {
          const float v = bp_sdk_fp16_to_fp32(x[bp_sdk_offset(t, n, h, w, c)]);
          y[bp_sdk_offset(yt, n, h, w, c)] = bp_sdk_fp32_to_fp16(v > 0 ? v : 0);
        }
  return BP_ABI_OK;
}

/* ---- add.fwd/trunc16 ------------------------------------------------------ */

static int add_supports(void *user, const bp_abi_kernel_args *a, char *reason, size_t size) {
  (void)user;
  if (a->num_inputs != 2 || a->num_outputs != 1) {
    snprintf(reason, size, "wants 2 inputs and 1 output");
    return 0;
  }
  return 1;
}

static int trunc16_run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  const bp_abi_tensor *t = &a->outputs[0];
  const uint16_t *x = a->input_ptrs[0], *z = a->input_ptrs[1];
  uint16_t *y = a->output_ptrs[0];
  for (int64_t n = 0; n < t->shape[0]; n++)
    for (int64_t h = 0; h < t->shape[1]; h++)
      for (int64_t w = 0; w < t->shape[2]; w++)
        for (int64_t c = 0; c < t->shape[3]; c++) {
          const float v = bp_sdk_fp16_to_fp32(x[bp_sdk_offset(&a->inputs[0], n, h, w, c)]) +
                          bp_sdk_fp16_to_fp32(z[bp_sdk_offset(&a->inputs[1], n, h, w, c)]);
          uint16_t r = bp_sdk_fp32_to_fp16(v);
          if (fabsf(bp_sdk_fp16_to_fp32(r)) > fabsf(v)) r--; /* one step toward zero */
          y[bp_sdk_offset(t, n, h, w, c)] = r;
        }
  return BP_ABI_OK;
}

/* ---- range.sgd/noskip ------------------------------------------------------ */

static int sgd_supports(void *user, const bp_abi_kernel_args *a, char *reason, size_t size) {
  (void)user;
  bp_optimizer_attrs at = {0};
  if (a->attrs) memcpy(&at, a->attrs, a->attr_size < sizeof at ? a->attr_size : sizeof at);
  if (at.nesterov || a->num_outputs != 2 || a->num_inputs < 2) {
    snprintf(reason, size, "no nesterov");
    return 0;
  }
  return 1;
}

static int noskip_run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  bp_optimizer_attrs at = {0};
  if (a->attrs) memcpy(&at, a->attrs, a->attr_size < sizeof at ? a->attr_size : sizeof at);
  const float *g = a->input_ptrs[0], lr = *(const float *)a->input_ptrs[1];
  float *w = a->output_ptrs[0], *m = a->output_ptrs[1];
  for (int64_t i = 0; i < a->inputs[0].shape[3]; i++) {
    const float d = g[i] + at.weight_decay * w[i];
    m[i] = at.momentum * m[i] + d;
    w[i] -= lr * m[i];
  }
  return BP_ABI_OK;
}

#define WRONG(op_name, impl_name, supports_fn, run_fn)                                       \
  {                                                                                          \
    .struct_size = sizeof(bp_abi_kernel), .op = op_name, .impl = impl_name, .device = "cpu", \
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), .priority = BP_ABI_PRIORITY_USER,         \
    .flags = BP_ABI_KERNEL_DETERMINISTIC, .supports = supports_fn, .run = run_fn             \
  }

static const bp_abi_kernel kernels[] = {
    WRONG("fc.bwd_data", "noacc", fc_supports, noacc_run),
    WRONG("fc.bwd_data", "offset", fc_supports, offset_run),
    WRONG("relu.fwd", "padwrite", relu_supports, padwrite_run),
    WRONG("relu.fwd", "overread", relu_supports, overread_run),
    {.struct_size = sizeof(bp_abi_kernel), .op = "relu.fwd", .impl = "half", .device = "cpu",
     .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP16), .priority = BP_ABI_PRIORITY_USER,
     .flags = BP_ABI_KERNEL_DETERMINISTIC, .supports = relu_supports, .run = half_run},
    {.struct_size = sizeof(bp_abi_kernel), .op = "add.fwd", .impl = "trunc16", .device = "cpu",
     .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP16), .priority = BP_ABI_PRIORITY_USER,
     .flags = BP_ABI_KERNEL_DETERMINISTIC, .supports = add_supports, .run = trunc16_run},
    WRONG("range.sgd", "noskip", sgd_supports, noskip_run),
};

static int init(const bp_abi_host *host) {
  int rc = BP_ABI_OK;
  for (size_t i = 0; rc == BP_ABI_OK && i < sizeof kernels / sizeof kernels[0]; i++)
    rc = host->register_kernel(host->ctx, &kernels[i]);
  return rc;
}

TM_MODULE("test-wrong", init)
