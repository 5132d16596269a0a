/* An out-of-tree op module for blueprint (see README.md). It registers
 *   (a) a kernel "custom" for the built-in op relu.fwd on the "cpu" device,
 *   (b) a new op kind "scale_shift.fwd" (y = x * scale + shift) and its
 *       kernel "custom" on the "cpu" device,
 *   (c) a layer type "leaky_relu" that model files can use, with its two
 *       op kinds (leaky_relu.fwd, leaky_relu.bwd) and their kernels.
 * It includes only the ABI headers (with the header-only module SDK,
 * bp_abi_sdk.h: checks with reasons, struct_size-strided tensor arrays, NHWC
 * walking) and links nothing from blueprint. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <bp_abi.h>
#include <bp_abi_ops.h>
#include <bp_abi_sdk.h>

#ifndef CUSTOM_OPS_VERSION
#define CUSTOM_OPS_VERSION "1.0.0"
#endif

/* ---- shared checks ------------------------------------------------------------ */

/* One FP32 tensor this module can walk: a whole descriptor, unit channel
 * stride, and valid (bp_sdk_check_tensor: extents, strides that nest, every
 * logical element inside slot_bytes). Reasons are written with bp_sdk_fail
 * (printf into reason[reason_size], NULL-safe; returns 0). */
static int check_tensor(const bp_abi_tensor *t, const char *name, char *reason,
                        size_t reason_size) {
  if (t->struct_size < sizeof *t)
    return bp_sdk_fail(reason, reason_size, "%s: short tensor descriptor", name);
  if (t->stride[3] != 1)
    return bp_sdk_fail(reason, reason_size, "%s: channel stride %lld (this kernel needs 1)",
                       name, (long long)t->stride[3]);
  return bp_sdk_check_tensor(t, name, BP_ABI_DTYPE_FP32, reason, reason_size);
}

/* The common shape of both ops: one input x, one output y of x's shape.
 * Tensors are read through bp_sdk_input / bp_sdk_output, which step by
 * the host's struct_size (rule 6 of bp_abi_ops.h). */
static int check_unary(const bp_abi_kernel_args *args, char *reason, size_t reason_size) {
  if (!bp_sdk_check_args(args, 1, 1, reason, reason_size)) return 0;
  const bp_abi_tensor *x = bp_sdk_input(args, 0), *y = bp_sdk_output(args, 0);
  return check_tensor(x, "x", reason, reason_size) && check_tensor(y, "y", reason, reason_size) &&
         bp_sdk_check_shape(y, "y", x->shape[0], x->shape[1], x->shape[2], x->shape[3], reason,
                            reason_size);
}

/* Walks every logical element of x and y (NHWC, device strides; channel
 * padding untouched, rule 2) and sets y = f(x). In place (y the very same
 * elements as x) is fine: each element is read before it is written;
 * bp_sdk_check_ptrs refuses any other overlap. A refusal's reason goes to
 * the host (args->reason), which prints it with the node. */
typedef float (*unary_fn)(float x, const void *ctx);

static int run_unary(const bp_abi_kernel_args *args, unary_fn f, const void *ctx) {
  static const int alias_out[] = {0}, alias_in[] = {0};
  if (!bp_sdk_check_ptrs(args, alias_out, alias_in, 1, bp_sdk_args_reason(args),
                         bp_sdk_args_reason_size(args)))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *xt = bp_sdk_input(args, 0), *yt = bp_sdk_output(args, 0);
  const float *x = bp_sdk_input_f32(args, 0);
  float *y = bp_sdk_output_f32(args, 0);
  BP_SDK_FOR_EACH_PIXEL(xt, n, h, w) {
    const float *xr = x + bp_sdk_offset(xt, n, h, w, 0);
    float *yr = y + bp_sdk_offset(yt, n, h, w, 0);
    for (int64_t c = 0; c < xt->shape[3]; c++) yr[c] = f(xr[c], ctx);
  }
  return BP_ABI_OK;
}

/* ---- (a) relu.fwd, implementation "custom" ---------------------------------- */

/* relu.fwd  in: x[N,H,W,C] fp32   out: y[N,H,W,C] fp32, y = max(x, 0),
 * overwritten; may alias x (IN_PLACE); any strides with unit channel
 * stride; no workspace; runs synchronously on the calling thread (the cpu
 * device runs kernels as tasks of its streams). */
static float relu(float x, const void *ctx) {
  (void)ctx;
  return x > 0.0f ? x : 0.0f;
}

static int relu_supports(void *user, const bp_abi_kernel_args *args, char *reason,
                         size_t reason_size) {
  (void)user;
  return check_unary(args, reason, reason_size);
}

static int relu_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  if (!check_unary(args, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args)))
    return BP_ABI_ERR_INVALID;
  return run_unary(args, relu, NULL);
}

/* infer_shape of every op here: y has x's dtype and shape (rule 7 of
 * bp_abi_ops.h: dtype and shape only, the host lays y out). */
static int same_as_x(const void *attrs, const bp_abi_tensor *inputs, bp_abi_tensor *outputs,
                     char *reason, size_t reason_size) {
  (void)attrs;
  if (!inputs || !outputs) {
    bp_sdk_fail(reason, reason_size, "no tensors");
    return 1;
  }
  outputs[0].dtype = inputs[0].dtype;
  memcpy(outputs[0].shape, inputs[0].shape, sizeof outputs[0].shape);
  return 0;
}

static const bp_abi_kernel relu_custom = {
    .struct_size = sizeof(bp_abi_kernel),
    .op = "relu.fwd",
    .impl = "custom",
    .device = "cpu",
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32),
    .priority = 10,
    .flags = BP_ABI_KERNEL_DETERMINISTIC | BP_ABI_KERNEL_IN_PLACE,
    .supports = relu_supports,
    .workspace_size = NULL, /* none */
    .run = relu_run,
    .user = NULL,
};

/* ---- (b) a new op kind: scale_shift.fwd ----------------------------------- */

/* scale_shift.fwd  in: x[N,H,W,C]   out: y[N,H,W,C], y = x * scale + shift.
 * Attribute block, version 1. A later version may only append fields (and
 * bump SCALE_SHIFT_ATTR_VERSION); kernels read min(attr_size, sizeof). */
typedef struct scale_shift_attrs {
  float scale;
  float shift;
} scale_shift_attrs;
#define SCALE_SHIFT_ATTR_VERSION 1

static const bp_abi_op scale_shift_op = {
    .struct_size = sizeof(bp_abi_op),
    .name = "scale_shift.fwd",
    .num_inputs = 1,
    .num_outputs = 1,
    .attr_size = sizeof(scale_shift_attrs),
    .attr_version = SCALE_SHIFT_ATTR_VERSION,
    .infer_shape = same_as_x,
};

/* The attribute block as this build knows it; 0 with a reason if absent. */
static int read_scale_shift(const bp_abi_kernel_args *args, scale_shift_attrs *out, char *reason,
                            size_t reason_size) {
  if (!args->attrs || args->attr_size < sizeof(scale_shift_attrs))
    return bp_sdk_fail(reason, reason_size,
                       "scale_shift attributes missing (%u bytes, want %zu)",
                       (unsigned)args->attr_size, sizeof(scale_shift_attrs));
  memcpy(out, args->attrs, sizeof *out); /* newer blocks are longer: ignore the rest */
  return 1;
}

static float scale_shift(float x, const void *ctx) {
  const scale_shift_attrs *a = ctx;
  return x * a->scale + a->shift;
}

static int scale_shift_supports(void *user, const bp_abi_kernel_args *args, char *reason,
                                size_t reason_size) {
  (void)user;
  scale_shift_attrs a;
  return check_unary(args, reason, reason_size) && read_scale_shift(args, &a, reason, reason_size);
}

static int scale_shift_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  scale_shift_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t reason_size = bp_sdk_args_reason_size(args);
  if (!check_unary(args, reason, reason_size) || !read_scale_shift(args, &a, reason, reason_size))
    return BP_ABI_ERR_INVALID;
  return run_unary(args, scale_shift, &a);
}

static const bp_abi_kernel scale_shift_custom = {
    .struct_size = sizeof(bp_abi_kernel),
    .op = "scale_shift.fwd",
    .impl = "custom",
    .device = "cpu",
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32),
    .priority = 0,
    .flags = BP_ABI_KERNEL_DETERMINISTIC | BP_ABI_KERNEL_IN_PLACE,
    .supports = scale_shift_supports,
    .workspace_size = NULL,
    .run = scale_shift_run,
    .user = NULL,
};

/* ---- (c) a layer type: leaky_relu ------------------------------------------- */

/* Two new op kinds and a layer type that runs them, so a model file can
 * say `{type: leaky_relu, slope: 0.1}` (mlp_leaky.yaml beside this file).
 *   leaky_relu.fwd  in: x[N,H,W,C] fp32        out: y, y = x > 0 ? x : slope*x
 *   leaky_relu.bwd  in: x, y, dy (x's shape)   out: dx = dy * (x > 0 ? 1 : slope)
 *                   (accumulate: dx += instead of dx =)
 * Reference quality: plain loops over the logical elements with each
 * tensor's own device strides (channel padding untouched), no workspace,
 * outputs never alias inputs. Attribute block, version 1. */
typedef struct leaky_relu_attrs {
  float slope;        /* YAML `slope`, in [0, 1], default 0.01 */
  int32_t accumulate; /* backward: 1 adds into dx (the host sets it) */
} leaky_relu_attrs;
#define LEAKY_RELU_ATTR_VERSION 1

/* Every input and output has x's shape (fp32, unit channel stride). */
static int leaky_check(const bp_abi_kernel_args *args, int inputs, char *reason,
                       size_t reason_size) {
  if (!bp_sdk_check_args(args, inputs, 1, reason, reason_size)) return 0;
  if (!args->attrs || args->attr_size < sizeof(leaky_relu_attrs))
    return bp_sdk_fail(reason, reason_size,
                       "leaky_relu attributes missing (%u bytes, want %zu)",
                       (unsigned)args->attr_size, sizeof(leaky_relu_attrs));
  for (int i = 0; i <= inputs; i++) {
    const bp_abi_tensor *t = i < inputs ? bp_sdk_input(args, i) : bp_sdk_output(args, 0);
    if (!check_tensor(t, i < inputs ? "input" : "output", reason, reason_size)) return 0;
    for (int d = 0; d < 4; d++)
      if (t->shape[d] != bp_sdk_input(args, 0)->shape[d])
        return bp_sdk_fail(reason, reason_size, "tensor %d differs from x in dim %d", i, d);
  }
  return 1;
}

static int leaky_fwd_supports(void *user, const bp_abi_kernel_args *args, char *reason,
                              size_t reason_size) {
  (void)user;
  return leaky_check(args, 1, reason, reason_size);
}

static int leaky_bwd_supports(void *user, const bp_abi_kernel_args *args, char *reason,
                              size_t reason_size) {
  (void)user;
  return leaky_check(args, 3, reason, reason_size);
}

static float leaky(float x, const void *ctx) {
  const leaky_relu_attrs *a = ctx;
  return x > 0.0f ? x : a->slope * x;
}

/* The forward is one more unary op: run_unary walks x and y. */
static int leaky_fwd_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  if (!leaky_check(args, 1, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args)))
    return BP_ABI_ERR_INVALID;
  leaky_relu_attrs a;
  memcpy(&a, args->attrs, sizeof a);
  return run_unary(args, leaky, &a);
}

static int leaky_bwd_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  if (!leaky_check(args, 3, NULL, 0) || !args->input_ptrs || !args->output_ptrs)
    return BP_ABI_ERR_INVALID;
  leaky_relu_attrs a;
  memcpy(&a, args->attrs, sizeof a);
  const bp_abi_tensor *xt = bp_sdk_input(args, 0), *dyt = bp_sdk_input(args, 2);
  const bp_abi_tensor *dxt = bp_sdk_output(args, 0);
  const float *x = bp_sdk_input_f32(args, 0), *dy = bp_sdk_input_f32(args, 2);
  float *dx = bp_sdk_output_f32(args, 0);
  BP_SDK_FOR_EACH_PIXEL(xt, n, h, w) {
    const float *xr = x + bp_sdk_offset(xt, n, h, w, 0);
    const float *dyr = dy + bp_sdk_offset(dyt, n, h, w, 0);
    float *dxr = dx + bp_sdk_offset(dxt, n, h, w, 0);
    for (int64_t c = 0; c < xt->shape[3]; c++) {
      const float g = dyr[c] * (xr[c] > 0.0f ? 1.0f : a.slope);
      dxr[c] = a.accumulate ? dxr[c] + g : g;
    }
  }
  return BP_ABI_OK;
}

static const bp_abi_op leaky_fwd_op = {
    .struct_size = sizeof(bp_abi_op),
    .name = "leaky_relu.fwd",
    .num_inputs = 1,
    .num_outputs = 1,
    .attr_size = sizeof(leaky_relu_attrs),
    .attr_version = LEAKY_RELU_ATTR_VERSION,
    .infer_shape = same_as_x,
};

static const bp_abi_op leaky_bwd_op = {
    .struct_size = sizeof(bp_abi_op),
    .name = "leaky_relu.bwd",
    .num_inputs = 3,
    .num_outputs = 1,
    .attr_size = sizeof(leaky_relu_attrs),
    .attr_version = LEAKY_RELU_ATTR_VERSION,
    .infer_shape = same_as_x, /* dx has x's shape */
};

static const bp_abi_kernel leaky_fwd_kernel = {
    .struct_size = sizeof(bp_abi_kernel),
    .op = "leaky_relu.fwd",
    .impl = "custom",
    .device = "cpu",
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32),
    .priority = BP_ABI_PRIORITY_REFERENCE,
    .flags = BP_ABI_KERNEL_REFERENCE | BP_ABI_KERNEL_DETERMINISTIC,
    .supports = leaky_fwd_supports,
    .run = leaky_fwd_run,
};

static const bp_abi_kernel leaky_bwd_kernel = {
    .struct_size = sizeof(bp_abi_kernel),
    .op = "leaky_relu.bwd",
    .impl = "custom",
    .device = "cpu",
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32),
    .priority = BP_ABI_PRIORITY_REFERENCE,
    .flags = BP_ABI_KERNEL_REFERENCE | BP_ABI_KERNEL_DETERMINISTIC,
    .supports = leaky_bwd_supports,
    .run = leaky_bwd_run,
};

/* The YAML keys: `slope` only. */
static const bp_abi_layer_attr leaky_keys[] = {
    {
        .struct_size = sizeof(bp_abi_layer_attr),
        .key = "slope",
        .type = BP_ABI_LAYER_ATTR_FLOAT,
        .offset = offsetof(leaky_relu_attrs, slope),
        .default_value = 0.01,
        .min = 0.0,
        .max = 1.0,
        .required = 0,
    },
};

static const bp_abi_layer leaky_layer = {
    .struct_size = sizeof(bp_abi_layer),
    .type = "leaky_relu",
    .forward_op = "leaky_relu.fwd",
    .backward_op = "leaky_relu.bwd",
    .num_inputs = 1,
    .attr_size = sizeof(leaky_relu_attrs),
    .accumulate_offset = offsetof(leaky_relu_attrs, accumulate),
    .attrs = leaky_keys,
    .num_attrs = sizeof leaky_keys / sizeof leaky_keys[0],
};

/* ---- the module --------------------------------------------------------------- */

/* Registers everything or fails as a whole: the host stages registrations
 * and keeps none of them if any call fails or init returns an error. */
static int custom_init(const bp_abi_host *host) {
  int rc = host->register_op(host->ctx, &scale_shift_op);
  if (rc == BP_ABI_OK) rc = host->register_kernel(host->ctx, &relu_custom);
  if (rc == BP_ABI_OK) rc = host->register_kernel(host->ctx, &scale_shift_custom);
  if (rc == BP_ABI_OK) rc = host->register_op(host->ctx, &leaky_fwd_op);
  if (rc == BP_ABI_OK) rc = host->register_op(host->ctx, &leaky_bwd_op);
  if (rc == BP_ABI_OK) rc = host->register_kernel(host->ctx, &leaky_fwd_kernel);
  if (rc == BP_ABI_OK) rc = host->register_kernel(host->ctx, &leaky_bwd_kernel);
  /* layer types arrived in ABI 1.4: an older host has no register_layer
   * (bp_abi.h: read a struct only up to its struct_size) */
  if (rc == BP_ABI_OK && host->struct_size >= offsetof(bp_abi_host, register_layer) +
                                                  sizeof host->register_layer &&
      host->register_layer)
    rc = host->register_layer(host->ctx, &leaky_layer);
  if (rc != BP_ABI_OK) host->error(host->ctx, "custom-ops: a registration was refused");
  return rc;
}

static const bp_abi_module custom_module = {
    .struct_size = sizeof(bp_abi_module),
    .abi_major = BP_ABI_MAJOR,
    .abi_minor_built = BP_ABI_MINOR,
    .abi_minor_required = 0, /* uses nothing added after 1.0 */
    .name = "custom-ops",
    .version = CUSTOM_OPS_VERSION,
    .build_id = "custom-ops " CUSTOM_OPS_VERSION " " __DATE__ " " __TIME__,
    .init = custom_init,
    .fini = NULL,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &custom_module; }
