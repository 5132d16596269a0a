/* A module layer type whose backward validate must check against finite
 * differences of its own forward (issue 31, item 4): "tgelu", the exact
 * GELU, as a module author would write it.
 *
 *   tgelu.fwd  in: x [N,H,W,C] fp32   out: y = x * Phi(x)
 *   tgelu.bwd  in: x, y, dy           out: dx (+)= dy * (Phi(x) + x * phi(x))
 *
 * Phi is the standard normal CDF, phi its density. Two backward kernels,
 * the wrong one registered first (a module's first kernel is what plain
 * selection and a module without a reference kernel lean on):
 *   tgelu.bwd/noterm  misses the x * phi(x) term: dx = dy * Phi(x)
 *   tgelu.bwd/exact   right
 * and an op of no layer type, "tgelu.scale" (y = 2x), whose gradient check
 * row must say why there is none. Tensors in any NHWC layout
 * (bp_sdk_offset); the forward kernel is tgelu.fwd/tm (no reference flag). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "bp_abi_sdk.h"
#include "test_module.h"

typedef struct tgelu_attrs {
  int32_t accumulate;
} tgelu_attrs;

#define FP32 BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32)

static int same_shape(const void *attrs, const bp_abi_tensor *in, bp_abi_tensor *out,
                      char *reason, size_t reason_size) {
  (void)attrs;
  (void)reason;
  (void)reason_size;
  out[0].dtype = in[0].dtype;
  memcpy(out[0].shape, in[0].shape, sizeof out[0].shape);
  return 0;
}

static double cdf(double x) { return 0.5 * (1.0 + erf(x / sqrt(2.0))); }
static double pdf(double x) { return exp(-0.5 * x * x) / sqrt(2.0 * 3.14159265358979323846); }

static int fwd_run(void *user, const bp_abi_kernel_args *a) {
  const int scale = user != NULL; /* tgelu.scale */
  const bp_abi_tensor *tx = &a->inputs[0], *ty = &a->outputs[0];
  const float *x = a->input_ptrs[0];
  float *y = a->output_ptrs[0];
  for (int64_t n = 0; n < tx->shape[0]; n++)
    for (int64_t h = 0; h < tx->shape[1]; h++)
      for (int64_t w = 0; w < tx->shape[2]; w++)
        for (int64_t c = 0; c < tx->shape[3]; c++) {
          const double v = x[bp_sdk_offset(tx, n, h, w, c)];
          y[bp_sdk_offset(ty, n, h, w, c)] = (float)(scale ? 2 * v : v * cdf(v));
        }
  return BP_ABI_OK;
}

static int bwd_run(void *user, const bp_abi_kernel_args *a) {
  const int exact = user != NULL;
  const bp_abi_tensor *tx = &a->inputs[0], *tdy = &a->inputs[2], *tdx = &a->outputs[0];
  tgelu_attrs at = {0};
  if (a->attrs && a->attr_size >= sizeof at) memcpy(&at, a->attrs, sizeof at);
  const float *x = a->input_ptrs[0], *dy = a->input_ptrs[2];
  float *dx = a->output_ptrs[0];
  for (int64_t n = 0; n < tx->shape[0]; n++)
    for (int64_t h = 0; h < tx->shape[1]; h++)
      for (int64_t w = 0; w < tx->shape[2]; w++)
        for (int64_t c = 0; c < tx->shape[3]; c++) {
          const double v = x[bp_sdk_offset(tx, n, h, w, c)];
          const double d = cdf(v) + (exact ? v * pdf(v) : 0.0);
          const double g = d * dy[bp_sdk_offset(tdy, n, h, w, c)];
          float *o = dx + bp_sdk_offset(tdx, n, h, w, c);
          *o = at.accumulate ? *o + (float)g : (float)g;
        }
  return BP_ABI_OK;
}

static int one = 1;

static const bp_abi_op ops[] = {
    {.struct_size = sizeof(bp_abi_op), .name = "tgelu.fwd", .num_inputs = 1, .num_outputs = 1,
     .attr_size = sizeof(tgelu_attrs), .attr_version = 1, .infer_shape = same_shape},
    {.struct_size = sizeof(bp_abi_op), .name = "tgelu.bwd", .num_inputs = 3, .num_outputs = 1,
     .attr_size = sizeof(tgelu_attrs), .attr_version = 1},
    {.struct_size = sizeof(bp_abi_op), .name = "tgelu.scale", .num_inputs = 1, .num_outputs = 1,
     .attr_size = sizeof(tgelu_attrs), .attr_version = 1, .infer_shape = same_shape},
};

static const bp_abi_kernel kernels[] = {
    {.struct_size = sizeof(bp_abi_kernel), .op = "tgelu.fwd", .impl = "tm", .device = "cpu",
     .dtypes = FP32, .run = fwd_run},
    {.struct_size = sizeof(bp_abi_kernel), .op = "tgelu.bwd", .impl = "noterm", .device = "cpu",
     .dtypes = FP32, .run = bwd_run},
    {.struct_size = sizeof(bp_abi_kernel), .op = "tgelu.bwd", .impl = "exact", .device = "cpu",
     .dtypes = FP32, .run = bwd_run, .user = &one},
    {.struct_size = sizeof(bp_abi_kernel), .op = "tgelu.scale", .impl = "tm", .device = "cpu",
     .dtypes = FP32, .run = fwd_run, .user = &one},
};

static const bp_abi_layer layer = {
    .struct_size = sizeof(bp_abi_layer),
    .type = "tgelu",
    .forward_op = "tgelu.fwd",
    .backward_op = "tgelu.bwd",
    .num_inputs = 1,
    .attr_size = sizeof(tgelu_attrs),
    .accumulate_offset = offsetof(tgelu_attrs, accumulate),
};

static int init(const bp_abi_host *host) {
  int rc = BP_ABI_OK;
  for (size_t i = 0; rc == BP_ABI_OK && i < sizeof ops / sizeof ops[0]; i++)
    rc = host->register_op(host->ctx, &ops[i]);
  for (size_t i = 0; rc == BP_ABI_OK && i < sizeof kernels / sizeof kernels[0]; i++)
    rc = host->register_kernel(host->ctx, &kernels[i]);
  if (rc == BP_ABI_OK) rc = host->register_layer(host->ctx, &layer);
  return rc;
}

TM_MODULE("test-gelu-layer", init)
