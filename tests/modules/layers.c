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
 * Every case but 0 is refused at the register stage and leaves nothing. */
#include <stddef.h>
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
  if (rc == BP_ABI_OK) rc = host->register_layer(host->ctx, &layer);
  if (rc == BP_ABI_OK && TM_CASE == 0) rc = host->register_layer(host->ctx, &stop);
  return rc;
}

TM_MODULE("layers", init)
