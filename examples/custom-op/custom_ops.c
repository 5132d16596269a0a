/* An out-of-tree op module for blueprint (see README.md). It registers
 *   (a) a kernel "custom" for the built-in op relu.fwd on the "cpu" device,
 *   (b) a new op kind "scale_shift.fwd" (y = x * scale + shift) and its
 *       kernel "custom" on the "cpu" device,
 *   (c) a layer type "leaky_relu" that model files can use, with its two
 *       op kinds (leaky_relu.fwd, leaky_relu.bwd) and their kernels.
 * It includes only the ABI headers and links nothing from blueprint. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <bp_abi.h>
#include <bp_abi_ops.h>

#ifndef CUSTOM_OPS_VERSION
#define CUSTOM_OPS_VERSION "1.0.0"
#endif

/* ---- shared checks ------------------------------------------------------------ */

/* printf into reason[reason_size] (either may be 0/NULL); returns 0 so a
 * check reads `return say_no(...)`. */
static int say_no(char *reason, size_t reason_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int say_no(char *reason, size_t reason_size, const char *fmt, ...) {
  if (reason && reason_size) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, reason_size, fmt, ap);
    va_end(ap);
  }
  return 0;
}

/* One FP32 tensor this module can walk: extents >= 1, strides >= 0, unit
 * channel stride, and every logical element inside slot_bytes. */
static int check_tensor(const bp_abi_tensor *t, const char *name, char *reason,
                        size_t reason_size) {
  if (!t || t->struct_size < offsetof(bp_abi_tensor, slot_bytes) + sizeof t->slot_bytes)
    return say_no(reason, reason_size, "%s: missing or short tensor descriptor", name);
  if (t->dtype != BP_ABI_DTYPE_FP32) return say_no(reason, reason_size, "%s: not fp32", name);
  uint64_t last = 0; /* offset of the last element, in elements */
  for (int d = 0; d < 4; d++) {
    if (t->shape[d] < 1 || t->stride[d] < 0)
      return say_no(reason, reason_size, "%s: extent %lld / stride %lld in dim %d", name,
                    (long long)t->shape[d], (long long)t->stride[d], d);
    last += (uint64_t)(t->shape[d] - 1) * (uint64_t)t->stride[d];
  }
  if (t->stride[3] != 1)
    return say_no(reason, reason_size, "%s: channel stride %lld (this kernel needs 1)", name,
                  (long long)t->stride[3]);
  if ((last + 1) * sizeof(float) > t->slot_bytes)
    return say_no(reason, reason_size, "%s: %llu elements reach past slot_bytes %llu", name,
                  (unsigned long long)(last + 1), (unsigned long long)t->slot_bytes);
  return 1;
}

/* The common shape of both ops: one input x, one output y of x's shape. */
static int check_unary(const bp_abi_kernel_args *args, char *reason, size_t reason_size) {
  if (!args || args->struct_size < offsetof(bp_abi_kernel_args, outputs) + sizeof args->outputs)
    return say_no(reason, reason_size, "missing or short args");
  if (args->num_inputs != 1 || args->num_outputs != 1)
    return say_no(reason, reason_size, "%d inputs, %d outputs (want 1, 1)", args->num_inputs,
                  args->num_outputs);
  if (!check_tensor(&args->inputs[0], "x", reason, reason_size) ||
      !check_tensor(&args->outputs[0], "y", reason, reason_size))
    return 0;
  for (int d = 0; d < 4; d++)
    if (args->inputs[0].shape[d] != args->outputs[0].shape[d])
      return say_no(reason, reason_size, "x and y differ in dim %d", d);
  return 1;
}

/* Walks every logical element of x and y (NHWC, device strides; channel
 * padding untouched) and sets y = f(x). In place (y == x with the same
 * strides) is fine: each element is read before it is written. */
typedef float (*unary_fn)(float x, const void *ctx);

static int run_unary(const bp_abi_kernel_args *args, unary_fn f, const void *ctx) {
  const bp_abi_tensor *xt = &args->inputs[0], *yt = &args->outputs[0];
  if (args->struct_size < offsetof(bp_abi_kernel_args, output_ptrs) + sizeof args->output_ptrs ||
      !args->input_ptrs || !args->output_ptrs || !args->input_ptrs[0] || !args->output_ptrs[0])
    return BP_ABI_ERR_INVALID;
  const float *x = args->input_ptrs[0];
  float *y = args->output_ptrs[0];
  if ((const void *)x == (void *)y && memcmp(xt->stride, yt->stride, sizeof xt->stride) != 0)
    return BP_ABI_ERR_INVALID; /* aliased with different layouts */
  for (int64_t n = 0; n < xt->shape[0]; n++)
    for (int64_t h = 0; h < xt->shape[1]; h++)
      for (int64_t w = 0; w < xt->shape[2]; w++) {
        const float *xr = x + n * xt->stride[0] + h * xt->stride[1] + w * xt->stride[2];
        float *yr = y + n * yt->stride[0] + h * yt->stride[1] + w * yt->stride[2];
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
  if (!check_unary(args, NULL, 0)) return BP_ABI_ERR_INVALID;
  return run_unary(args, relu, NULL);
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

static int scale_shift_infer(const void *attrs, const bp_abi_tensor *inputs,
                             bp_abi_tensor *outputs, char *reason, size_t reason_size) {
  (void)attrs;
  if (!inputs || !outputs) {
    say_no(reason, reason_size, "no tensors");
    return 1;
  }
  outputs[0] = inputs[0]; /* same dtype, shape and layout */
  outputs[0].struct_size = sizeof(bp_abi_tensor);
  return 0;
}

static const bp_abi_op scale_shift_op = {
    .struct_size = sizeof(bp_abi_op),
    .name = "scale_shift.fwd",
    .num_inputs = 1,
    .num_outputs = 1,
    .attr_size = sizeof(scale_shift_attrs),
    .attr_version = SCALE_SHIFT_ATTR_VERSION,
    .infer_shape = scale_shift_infer,
};

/* The attribute block as this build knows it; 0 with a reason if absent. */
static int read_scale_shift(const bp_abi_kernel_args *args, scale_shift_attrs *out, char *reason,
                            size_t reason_size) {
  if (!args->attrs || args->attr_size < sizeof(scale_shift_attrs))
    return say_no(reason, reason_size, "scale_shift attributes missing (%u bytes, want %zu)",
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
  if (!check_unary(args, NULL, 0) || !read_scale_shift(args, &a, NULL, 0))
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
 * say `{type: leaky_relu, slope: 0.1}` (leaky_relu.yaml beside this file).
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
  if (!args || args->struct_size < offsetof(bp_abi_kernel_args, attr_size) + sizeof args->attr_size)
    return say_no(reason, reason_size, "missing or short args");
  if (args->num_inputs != inputs || args->num_outputs != 1)
    return say_no(reason, reason_size, "%d inputs, %d outputs (want %d, 1)", args->num_inputs,
                  args->num_outputs, inputs);
  if (!args->attrs || args->attr_size < sizeof(leaky_relu_attrs))
    return say_no(reason, reason_size, "leaky_relu attributes missing (%u bytes, want %zu)",
                  (unsigned)args->attr_size, sizeof(leaky_relu_attrs));
  for (int i = 0; i <= inputs; i++) {
    const bp_abi_tensor *t = i < inputs ? &args->inputs[i] : &args->outputs[0];
    if (!check_tensor(t, i < inputs ? "input" : "output", reason, reason_size)) return 0;
    for (int d = 0; d < 4; d++)
      if (t->shape[d] != args->inputs[0].shape[d])
        return say_no(reason, reason_size, "tensor %d differs from x in dim %d", i, d);
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

/* Offset, in elements, of pixel (n,h,w) of tensor t. */
static int64_t at(const bp_abi_tensor *t, int64_t n, int64_t h, int64_t w) {
  return n * t->stride[0] + h * t->stride[1] + w * t->stride[2];
}

static int leaky_fwd_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  if (!leaky_check(args, 1, NULL, 0) || !args->input_ptrs || !args->output_ptrs)
    return BP_ABI_ERR_INVALID;
  leaky_relu_attrs a;
  memcpy(&a, args->attrs, sizeof a);
  const bp_abi_tensor *xt = &args->inputs[0], *yt = &args->outputs[0];
  const float *x = args->input_ptrs[0];
  float *y = args->output_ptrs[0];
  for (int64_t n = 0; n < xt->shape[0]; n++)
    for (int64_t h = 0; h < xt->shape[1]; h++)
      for (int64_t w = 0; w < xt->shape[2]; w++) {
        const float *xr = x + at(xt, n, h, w);
        float *yr = y + at(yt, n, h, w);
        for (int64_t c = 0; c < xt->shape[3]; c++) yr[c] = xr[c] > 0.0f ? xr[c] : a.slope * xr[c];
      }
  return BP_ABI_OK;
}

static int leaky_bwd_run(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  if (!leaky_check(args, 3, NULL, 0) || !args->input_ptrs || !args->output_ptrs)
    return BP_ABI_ERR_INVALID;
  leaky_relu_attrs a;
  memcpy(&a, args->attrs, sizeof a);
  const bp_abi_tensor *xt = &args->inputs[0], *dyt = &args->inputs[2], *dxt = &args->outputs[0];
  const float *x = args->input_ptrs[0], *dy = args->input_ptrs[2];
  float *dx = args->output_ptrs[0];
  for (int64_t n = 0; n < xt->shape[0]; n++)
    for (int64_t h = 0; h < xt->shape[1]; h++)
      for (int64_t w = 0; w < xt->shape[2]; w++) {
        const float *xr = x + at(xt, n, h, w), *dyr = dy + at(dyt, n, h, w);
        float *dxr = dx + at(dxt, n, h, w);
        for (int64_t c = 0; c < xt->shape[3]; c++) {
          const float g = dyr[c] * (xr[c] > 0.0f ? 1.0f : a.slope);
          dxr[c] = a.accumulate ? dxr[c] + g : g;
        }
      }
  return BP_ABI_OK;
}

/* Both ops give x's dtype and shape (rule 7 of bp_abi_ops.h). */
static int leaky_infer(const void *attrs, const bp_abi_tensor *inputs, bp_abi_tensor *outputs,
                       char *reason, size_t reason_size) {
  (void)attrs;
  if (!inputs || !outputs) {
    say_no(reason, reason_size, "no tensors");
    return 1;
  }
  outputs[0].dtype = inputs[0].dtype;
  memcpy(outputs[0].shape, inputs[0].shape, sizeof outputs[0].shape);
  return 0;
}

static const bp_abi_op leaky_fwd_op = {
    .struct_size = sizeof(bp_abi_op),
    .name = "leaky_relu.fwd",
    .num_inputs = 1,
    .num_outputs = 1,
    .attr_size = sizeof(leaky_relu_attrs),
    .attr_version = LEAKY_RELU_ATTR_VERSION,
    .infer_shape = leaky_infer,
};

static const bp_abi_op leaky_bwd_op = {
    .struct_size = sizeof(bp_abi_op),
    .name = "leaky_relu.bwd",
    .num_inputs = 3,
    .num_outputs = 1,
    .attr_size = sizeof(leaky_relu_attrs),
    .attr_version = LEAKY_RELU_ATTR_VERSION,
    .infer_shape = leaky_infer,
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
