/* Layer types (host->register_layer, ABI 1.4), one case per build, chosen
 * by TM_CASE:
 *  0 a good type "tl_act": ops tl.fwd / tl.bwd with kernels, keys
 *    `width` (int, required), `gain` (float, default 0.5) and `flip`
 *    (bool); tl.fwd's infer_shape gives [N,H,W,width]; and "tl_stop",
 *    the same forward op without a backward op
 *  1 a type under a built-in layer type's name ("relu")
 *  2 a type whose forward op nobody registered
 *  3 a key outside the attribute block
 *  4 a key whose default lies outside its range
 *  5 a backward op without an accumulate flag
 *  6 case 0 again from another file: "tl_act" is already registered
 *  7 a saved tensor the forward op has no output for
 *  8 a saved tensor of dtype BF16
 *  9 a per-channel saved tensor that also gives a channel count
 * 10 five saved tensors
 * Every case but 0 is refused at the register stage and leaves nothing.
 * Case 0 also registers the types with saved tensors (memory needs):
 *  "tl_mrelu"  a ReLU whose forward records an INT8 mask of y's shape
 *              ("<l>.saved0") and whose backward reads it: dx = mask ? dy : 0,
 *              with kernels, to train bit for bit like the built-in relu
 *  "tl_save"   three saved tensors, one of each placement: FP32 per channel,
 *              INT32 of 7 channels, FP16 of y's channels (ops without
 *              kernels: compiled and built, never run) */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "test_module.h"

#ifndef TM_CASE
#define TM_CASE 0
#endif

typedef struct tl_attrs {
  int32_t width;
  float gain;
  int32_t flip;
  int32_t accumulate;
} tl_attrs;

static int run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  (void)a;
  return BP_ABI_OK;
}

/* [N,H,W,width] in x0's dtype (bp_abi_ops.h rule 7). */
static int infer(const void *attrs, const bp_abi_tensor *in, bp_abi_tensor *out, char *reason,
                 size_t reason_size) {
  tl_attrs a;
  memcpy(&a, attrs, sizeof a);
  if (a.width == 3) { /* a value the op refuses, for the error path */
    if (reason && reason_size) strncpy(reason, "width 3 is not supported", reason_size - 1);
    return 1;
  }
  out[0].dtype = in[0].dtype;
  memcpy(out[0].shape, in[0].shape, sizeof out[0].shape);
  out[0].shape[3] = a.width;
  return 0;
}

#define FP32 BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32)

static const bp_abi_op fwd = {.struct_size = sizeof(bp_abi_op), .name = "tl.fwd",
                              .num_inputs = 1, .num_outputs = 1,
                              .attr_size = sizeof(tl_attrs), .attr_version = 1,
                              .infer_shape = infer};
static const bp_abi_op bwd = {.struct_size = sizeof(bp_abi_op), .name = "tl.bwd",
                              .num_inputs = 3, .num_outputs = 1,
                              .attr_size = sizeof(tl_attrs), .attr_version = 1};
static const bp_abi_kernel kfwd = {.struct_size = sizeof(bp_abi_kernel), .op = "tl.fwd",
                                   .impl = "tm", .device = "cpu", .dtypes = FP32, .run = run};
static const bp_abi_kernel kbwd = {.struct_size = sizeof(bp_abi_kernel), .op = "tl.bwd",
                                   .impl = "tm", .device = "cpu", .dtypes = FP32, .run = run};

static const bp_abi_layer_attr keys[] = {
    {.struct_size = sizeof(bp_abi_layer_attr), .key = "width", .type = BP_ABI_LAYER_ATTR_INT,
     .offset = offsetof(tl_attrs, width), .min = 1, .max = 64, .required = 1},
    {.struct_size = sizeof(bp_abi_layer_attr), .key = "gain", .type = BP_ABI_LAYER_ATTR_FLOAT,
     .offset = TM_CASE == 3 ? 64 : offsetof(tl_attrs, gain), .default_value = TM_CASE == 4 ? 7 : 0.5,
     .min = 0, .max = 2},
    {.struct_size = sizeof(bp_abi_layer_attr), .key = "flip", .type = BP_ABI_LAYER_ATTR_BOOL,
     .offset = offsetof(tl_attrs, flip)},
};

static const bp_abi_layer layer = {
    .struct_size = sizeof(bp_abi_layer),
    .type = TM_CASE == 1 ? "relu" : "tl_act",
    .forward_op = TM_CASE == 2 ? "tl.nothing" : "tl.fwd",
    .backward_op = "tl.bwd",
    .num_inputs = 1,
    .attr_size = sizeof(tl_attrs),
    .accumulate_offset = TM_CASE == 5 ? UINT32_MAX : offsetof(tl_attrs, accumulate),
    .attrs = keys,
    .num_attrs = 3,
};

/* ---- saved tensors ------------------------------------------------------------------ */

#define INT8 BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_INT8)

typedef struct mr_attrs {
  int32_t accumulate;
} mr_attrs;

/* The element (n,h,w,c) of tensor t, strided (padded channels skipped). */
static int64_t at(const bp_abi_tensor *t, int64_t n, int64_t h, int64_t w, int64_t c) {
  return n * t->stride[0] + h * t->stride[1] + w * t->stride[2] + c * t->stride[3];
}

/* tl.mrelu.fwd  in: x  out: y, mask   y = x < 0 ? 0 : x; mask = x > 0 */
static int mrelu_fwd(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  const bp_abi_tensor *tx = &a->inputs[0], *ty = &a->outputs[0], *tm = &a->outputs[1];
  if (a->num_outputs != 2 || tm->dtype != BP_ABI_DTYPE_INT8) return BP_ABI_ERR_INVALID;
  const float *x = a->input_ptrs[0];
  float *y = a->output_ptrs[0];
  int8_t *m = a->output_ptrs[1];
  for (int64_t n = 0; n < tx->shape[0]; n++)
    for (int64_t h = 0; h < tx->shape[1]; h++)
      for (int64_t w = 0; w < tx->shape[2]; w++)
        for (int64_t c = 0; c < tx->shape[3]; c++) {
          const float v = x[at(tx, n, h, w, c)];
          y[at(ty, n, h, w, c)] = v < 0.0f ? 0.0f : v;
          m[at(tm, n, h, w, c)] = v > 0.0f;
        }
  return BP_ABI_OK;
}

/* tl.mrelu.bwd  in: x, y, dy, mask  out: dx   dx (+)= mask ? dy : 0 (x and
 * y unread: the mask alone decides) */
static int mrelu_bwd(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  if (a->num_inputs != 4 || a->inputs[3].dtype != BP_ABI_DTYPE_INT8) return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tdy = &a->inputs[2], *tm = &a->inputs[3], *tdx = &a->outputs[0];
  mr_attrs attrs;
  memcpy(&attrs, a->attrs, sizeof attrs);
  const float *dy = a->input_ptrs[2];
  const int8_t *m = a->input_ptrs[3];
  float *dx = a->output_ptrs[0];
  for (int64_t n = 0; n < tdy->shape[0]; n++)
    for (int64_t h = 0; h < tdy->shape[1]; h++)
      for (int64_t w = 0; w < tdy->shape[2]; w++)
        for (int64_t c = 0; c < tdy->shape[3]; c++) {
          const float g = m[at(tm, n, h, w, c)] ? dy[at(tdy, n, h, w, c)] : 0.0f;
          float *o = dx + at(tdx, n, h, w, c);
          *o = attrs.accumulate ? *o + g : g;
        }
  return BP_ABI_OK;
}

static const bp_abi_op mr_fwd = {.struct_size = sizeof(bp_abi_op), .name = "tl.mrelu.fwd",
                                 .num_inputs = 1, .num_outputs = TM_CASE == 7 ? 1 : 2,
                                 .attr_size = sizeof(mr_attrs), .attr_version = 1};
static const bp_abi_op mr_bwd = {.struct_size = sizeof(bp_abi_op), .name = "tl.mrelu.bwd",
                                 .num_inputs = 4, .num_outputs = 1,
                                 .attr_size = sizeof(mr_attrs), .attr_version = 1};
static const bp_abi_kernel kmr_fwd = {.struct_size = sizeof(bp_abi_kernel), .op = "tl.mrelu.fwd",
                                      .impl = "tm", .device = "cpu", .dtypes = FP32 | INT8,
                                      .run = mrelu_fwd};
static const bp_abi_kernel kmr_bwd = {.struct_size = sizeof(bp_abi_kernel), .op = "tl.mrelu.bwd",
                                      .impl = "tm", .device = "cpu", .dtypes = FP32 | INT8,
                                      .run = mrelu_bwd};

static const bp_abi_layer_saved mask = {
    .struct_size = sizeof(bp_abi_layer_saved),
    .dtype = TM_CASE == 8 ? BP_ABI_DTYPE_BF16 : BP_ABI_DTYPE_INT8,
    .per_channel = TM_CASE == 9,
    .channels = TM_CASE == 9 ? 3 : 0,
};

static const bp_abi_layer mrelu = {
    .struct_size = sizeof(bp_abi_layer),
    .type = "tl_mrelu",
    .forward_op = "tl.mrelu.fwd",
    .backward_op = "tl.mrelu.bwd",
    .num_inputs = 1,
    .attr_size = sizeof(mr_attrs),
    .accumulate_offset = offsetof(mr_attrs, accumulate),
    .saved = &mask,
    .num_saved = TM_CASE == 10 ? 5 : 1,
};

/* tl_save: [1,1,1,C] FP32, [N,H,W,7] INT32, [N,H,W,C] FP16 */
static const bp_abi_layer_saved three[] = {
    {.struct_size = sizeof(bp_abi_layer_saved), .dtype = BP_ABI_DTYPE_FP32, .per_channel = 1},
    {.struct_size = sizeof(bp_abi_layer_saved), .dtype = BP_ABI_DTYPE_INT32, .channels = 7},
    {.struct_size = sizeof(bp_abi_layer_saved), .dtype = BP_ABI_DTYPE_FP16},
};
static const bp_abi_op sv_fwd = {.struct_size = sizeof(bp_abi_op), .name = "tl.save.fwd",
                                 .num_inputs = 1, .num_outputs = 4,
                                 .attr_size = sizeof(mr_attrs), .attr_version = 1};
static const bp_abi_op sv_bwd = {.struct_size = sizeof(bp_abi_op), .name = "tl.save.bwd",
                                 .num_inputs = 6, .num_outputs = 1,
                                 .attr_size = sizeof(mr_attrs), .attr_version = 1};
static const bp_abi_layer save = {
    .struct_size = sizeof(bp_abi_layer),
    .type = "tl_save",
    .forward_op = "tl.save.fwd",
    .backward_op = "tl.save.bwd",
    .num_inputs = 1,
    .attr_size = sizeof(mr_attrs),
    .accumulate_offset = offsetof(mr_attrs, accumulate),
    .saved = three,
    .num_saved = 3,
};

/* case 0 also: "tl_stop", the same forward op and no backward op */
static const bp_abi_layer stop = {
    .struct_size = sizeof(bp_abi_layer),
    .type = "tl_stop",
    .forward_op = "tl.fwd",
    .num_inputs = 1,
    .attr_size = sizeof(tl_attrs),
    .accumulate_offset = UINT32_MAX,
    .attrs = keys,
    .num_attrs = 3,
};

static int init(const bp_abi_host *host) {
  int rc = BP_ABI_OK;
  if (TM_CASE != 6) { /* case 6 finds the ops case 0 registered */
    rc = host->register_op(host->ctx, &fwd);
    if (rc == BP_ABI_OK) rc = host->register_op(host->ctx, &bwd);
    if (rc == BP_ABI_OK) rc = host->register_kernel(host->ctx, &kfwd);
    if (rc == BP_ABI_OK) rc = host->register_kernel(host->ctx, &kbwd);
  }
  if (TM_CASE >= 7) { /* the saved-tensor refusals */
    rc = host->register_op(host->ctx, &mr_fwd);
    if (rc == BP_ABI_OK) rc = host->register_op(host->ctx, &mr_bwd);
    if (rc == BP_ABI_OK) rc = host->register_layer(host->ctx, &mrelu);
    return rc;
  }
  if (rc == BP_ABI_OK) rc = host->register_layer(host->ctx, &layer);
  if (rc == BP_ABI_OK && TM_CASE == 0) rc = host->register_layer(host->ctx, &stop);
  if (TM_CASE != 0) return rc;
  const bp_abi_op *ops[] = {&mr_fwd, &mr_bwd, &sv_fwd, &sv_bwd};
  for (int i = 0; i < 4 && rc == BP_ABI_OK; i++) rc = host->register_op(host->ctx, ops[i]);
  if (rc == BP_ABI_OK) rc = host->register_kernel(host->ctx, &kmr_fwd);
  if (rc == BP_ABI_OK) rc = host->register_kernel(host->ctx, &kmr_bwd);
  if (rc == BP_ABI_OK) rc = host->register_layer(host->ctx, &mrelu);
  if (rc == BP_ABI_OK) rc = host->register_layer(host->ctx, &save);
  return rc;
}

TM_MODULE("layers", init)
