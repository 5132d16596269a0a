/* An out-of-tree op module for blueprint (see README.md). It registers
 *   (a) a kernel "custom" for the built-in op relu.fwd on the "cpu" device,
 *   (b) a new op kind "scale_shift.fwd" (y = x * scale + shift) and its
 *       kernel "custom" on the "cpu" device.
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

/* ---- the module --------------------------------------------------------------- */

/* Registers everything or fails as a whole: the host stages registrations
 * and keeps none of them if any call fails or init returns an error. */
static int custom_init(const bp_abi_host *host) {
  int rc = host->register_op(host->ctx, &scale_shift_op);
  if (rc == BP_ABI_OK) rc = host->register_kernel(host->ctx, &relu_custom);
  if (rc == BP_ABI_OK) rc = host->register_kernel(host->ctx, &scale_shift_custom);
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
