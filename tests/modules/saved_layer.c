/* A module layer type with a saved tensor whose backward validate's
 * gradient check must make and check (issue 31, item 4): "tsave", tanh
 * with its derivative saved by the forward, as a module author would
 * write it.
 *
 *   tsave.fwd  in: x [N,H,W,C] fp32   out: y = tanh(x), s = 1 - y^2 (saved, per sample)
 *   tsave.bwd  in: x, y, dy, s        out: dx (+)= dy * s
 *
 * Two backward kernels, the wrong one registered first:
 *   tsave.bwd/squared  reads s as if it held y: dx = dy * (1 - s^2)
 *   tsave.bwd/right    right
 * Tensors in any NHWC layout (bp_sdk_offset). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "bp_abi_sdk.h"
#include "test_module.h"

typedef struct tsave_attrs {
  int32_t accumulate;
} tsave_attrs;

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

static int fwd_run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  const bp_abi_tensor *tx = &a->inputs[0], *ty = &a->outputs[0], *ts = &a->outputs[1];
  const float *x = a->input_ptrs[0];
  float *y = a->output_ptrs[0], *s = a->output_ptrs[1];
  for (int64_t n = 0; n < tx->shape[0]; n++)
    for (int64_t h = 0; h < tx->shape[1]; h++)
      for (int64_t w = 0; w < tx->shape[2]; w++)
        for (int64_t c = 0; c < tx->shape[3]; c++) {
          const double v = tanh(x[bp_sdk_offset(tx, n, h, w, c)]);
          y[bp_sdk_offset(ty, n, h, w, c)] = (float)v;
          s[bp_sdk_offset(ts, n, h, w, c)] = (float)(1.0 - v * v);
        }
  return BP_ABI_OK;
}

static int bwd_run(void *user, const bp_abi_kernel_args *a) {
  const int right = user != NULL;
  const bp_abi_tensor *tx = &a->inputs[0], *tdy = &a->inputs[2], *ts = &a->inputs[3];
  const bp_abi_tensor *tdx = &a->outputs[0];
  tsave_attrs at = {0};
  if (a->attrs && a->attr_size >= sizeof at) memcpy(&at, a->attrs, sizeof at);
  const float *dy = a->input_ptrs[2], *s = a->input_ptrs[3];
  float *dx = a->output_ptrs[0];
  for (int64_t n = 0; n < tx->shape[0]; n++)
    for (int64_t h = 0; h < tx->shape[1]; h++)
      for (int64_t w = 0; w < tx->shape[2]; w++)
        for (int64_t c = 0; c < tx->shape[3]; c++) {
          const double sv = s[bp_sdk_offset(ts, n, h, w, c)];
          const double d = right ? sv : 1.0 - sv * sv;
          const double g = d * dy[bp_sdk_offset(tdy, n, h, w, c)];
          float *o = dx + bp_sdk_offset(tdx, n, h, w, c);
          *o = at.accumulate ? *o + (float)g : (float)g;
        }
  return BP_ABI_OK;
}

static int one = 1;

static const bp_abi_op ops[] = {
    {.struct_size = sizeof(bp_abi_op), .name = "tsave.fwd", .num_inputs = 1, .num_outputs = 2,
     .attr_size = sizeof(tsave_attrs), .attr_version = 1, .infer_shape = same_shape},
    {.struct_size = sizeof(bp_abi_op), .name = "tsave.bwd", .num_inputs = 4, .num_outputs = 1,
     .attr_size = sizeof(tsave_attrs), .attr_version = 1},
};

static const bp_abi_kernel kernels[] = {
    {.struct_size = sizeof(bp_abi_kernel), .op = "tsave.fwd", .impl = "tm", .device = "cpu",
     .dtypes = FP32, .run = fwd_run},
    {.struct_size = sizeof(bp_abi_kernel), .op = "tsave.bwd", .impl = "squared", .device = "cpu",
     .dtypes = FP32, .run = bwd_run},
    {.struct_size = sizeof(bp_abi_kernel), .op = "tsave.bwd", .impl = "right", .device = "cpu",
     .dtypes = FP32, .run = bwd_run, .user = &one},
};

static const bp_abi_layer_saved saved[] = {
    {.struct_size = sizeof(bp_abi_layer_saved), .dtype = BP_ABI_DTYPE_FP32, .per_channel = 0,
     .channels = 0},
};

static const bp_abi_layer layer = {
    .struct_size = sizeof(bp_abi_layer),
    .type = "tsave",
    .forward_op = "tsave.fwd",
    .backward_op = "tsave.bwd",
    .num_inputs = 1,
    .attr_size = sizeof(tsave_attrs),
    .accumulate_offset = offsetof(tsave_attrs, accumulate),
    .saved = saved,
    .num_saved = 1,
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

TM_MODULE("test-saved-layer", init)
