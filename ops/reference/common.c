/* Checks and small loops shared by the reference kernels. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "reference-impl.h"

#define REF_MAX_EXTENT (INT64_C(1) << 31) /* per dimension; keeps products in int64 */

int ref_fail(char *reason, size_t reason_size, const char *fmt, ...) {
  if (reason && reason_size > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, reason_size, fmt, ap);
    va_end(ap);
  }
  return 0;
}

static const char *dtype_name(int32_t dtype) {
  switch (dtype) {
    case BP_ABI_DTYPE_FP32: return "fp32";
    case BP_ABI_DTYPE_FP16: return "fp16";
    case BP_ABI_DTYPE_INT8: return "int8";
    case BP_ABI_DTYPE_INT32: return "int32";
    case BP_ABI_DTYPE_BF16: return "bf16";
    default: return "unknown";
  }
}

static int64_t dtype_bytes(int32_t dtype) {
  switch (dtype) {
    case BP_ABI_DTYPE_FP32:
    case BP_ABI_DTYPE_INT32: return 4;
    case BP_ABI_DTYPE_FP16:
    case BP_ABI_DTYPE_BF16: return 2;
    case BP_ABI_DTYPE_INT8: return 1;
    default: return 0;
  }
}

int ref_check_args(const bp_abi_kernel_args *args, int num_inputs, int num_outputs, char *reason,
                   size_t reason_size) {
  if (!args) return ref_fail(reason, reason_size, "no args");
  if (args->struct_size < offsetof(bp_abi_kernel_args, workspace))
    return ref_fail(reason, reason_size, "args struct_size %u is too small",
                    (unsigned)args->struct_size);
  if (args->num_inputs != num_inputs || args->num_outputs != num_outputs)
    return ref_fail(reason, reason_size, "expects %d inputs and %d outputs, got %d and %d",
                    num_inputs, num_outputs, (int)args->num_inputs, (int)args->num_outputs);
  if ((num_inputs > 0 && !args->inputs) || (num_outputs > 0 && !args->outputs))
    return ref_fail(reason, reason_size, "tensor descriptors missing");
  for (int i = 0; i < num_inputs + num_outputs; i++) {
    const bp_abi_tensor *t = i < num_inputs ? &args->inputs[i] : &args->outputs[i - num_inputs];
    if (t->struct_size < sizeof(bp_abi_tensor))
      return ref_fail(reason, reason_size, "%s %d: tensor struct_size %u is too small",
                      i < num_inputs ? "input" : "output", i < num_inputs ? i : i - num_inputs,
                      (unsigned)t->struct_size);
  }
  return 1;
}

/* Elements spanned by the logical extent (last offset + 1); the tensor has
 * passed ref_check_tensor. */
static int64_t span_elems(const bp_abi_tensor *t) {
  int64_t span = 1;
  for (int d = 0; d < 4; d++) span += (t->shape[d] - 1) * t->stride[d];
  return span;
}

int ref_check_tensor(const bp_abi_tensor *t, const char *name, int32_t dtype, char *reason,
                     size_t reason_size) {
  if (t->dtype != dtype)
    return ref_fail(reason, reason_size, "%s: dtype %s, expected %s", name, dtype_name(t->dtype),
                    dtype_name(dtype));
  for (int d = 0; d < 4; d++)
    if (t->shape[d] < 1 || t->shape[d] > REF_MAX_EXTENT)
      return ref_fail(reason, reason_size, "%s: extent %lld of dimension %d is out of range",
                      name, (long long)t->shape[d], d);
  if (t->padded_c < t->shape[3])
    return ref_fail(reason, reason_size, "%s: padded_c %lld < channels %lld", name,
                    (long long)t->padded_c, (long long)t->shape[3]);
  /* Strides nest in NHWC order: each is at least the span of the
   * dimensions inside it, so no two elements share an address. A
   * dimension of extent 1 may carry any stride. */
  int64_t span = 1;
  for (int d = 3; d >= 0; d--) {
    if (t->shape[d] == 1) continue;
    if (t->stride[d] < span)
      return ref_fail(reason, reason_size,
                      "%s: stride %lld of dimension %d overlaps the inner dimensions (span %lld)",
                      name, (long long)t->stride[d], d, (long long)span);
    if (t->stride[d] > (INT64_MAX / 8 - span) / (t->shape[d] - 1))
      return ref_fail(reason, reason_size, "%s: extent overflows", name);
    span += (t->shape[d] - 1) * t->stride[d];
  }
  uint64_t bytes = (uint64_t)span * (uint64_t)dtype_bytes(dtype);
  if (bytes > t->slot_bytes)
    return ref_fail(reason, reason_size, "%s: needs %llu bytes, slot_bytes is %llu", name,
                    (unsigned long long)bytes, (unsigned long long)t->slot_bytes);
  return 1;
}

int ref_check_shape(const bp_abi_tensor *t, const char *name, int64_t n, int64_t h, int64_t w,
                    int64_t c, char *reason, size_t reason_size) {
  if (t->shape[0] != n || t->shape[1] != h || t->shape[2] != w || t->shape[3] != c)
    return ref_fail(reason, reason_size, "%s: shape [%lld,%lld,%lld,%lld], expected [%lld,%lld,%lld,%lld]",
                    name, (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2],
                    (long long)t->shape[3], (long long)n, (long long)h, (long long)w,
                    (long long)c);
  return 1;
}

int ref_read_attrs(const bp_abi_kernel_args *args, void *dst, size_t dst_size, char *reason,
                   size_t reason_size) {
  memset(dst, 0, dst_size);
  if (!args) return ref_fail(reason, reason_size, "no args");
  if (args->struct_size < offsetof(bp_abi_kernel_args, workspace))
    return ref_fail(reason, reason_size, "args struct_size %u is too small",
                    (unsigned)args->struct_size);
  if (args->attr_size == 0) return 1;
  if (!args->attrs)
    return ref_fail(reason, reason_size, "attr_size %u but no attribute block",
                    (unsigned)args->attr_size);
  memcpy(dst, args->attrs, args->attr_size < dst_size ? args->attr_size : dst_size);
  return 1;
}

int ref_check_flag(int32_t value, const char *name, char *reason, size_t reason_size) {
  if (value != 0 && value != 1)
    return ref_fail(reason, reason_size, "attribute %s is %d, expected 0 or 1", name, (int)value);
  return 1;
}

static int same_elements(const bp_abi_tensor *a, const void *pa, const bp_abi_tensor *b,
                         const void *pb) {
  if (pa != pb || a->dtype != b->dtype) return 0;
  for (int d = 0; d < 4; d++)
    if (a->shape[d] != b->shape[d] || (a->shape[d] > 1 && a->stride[d] != b->stride[d])) return 0;
  return 1;
}

static int overlaps(const bp_abi_tensor *a, const void *pa, const bp_abi_tensor *b,
                    const void *pb) {
  uintptr_t a0 = (uintptr_t)pa, b0 = (uintptr_t)pb;
  uintptr_t a1 = a0 + (uintptr_t)(span_elems(a) * dtype_bytes(a->dtype));
  uintptr_t b1 = b0 + (uintptr_t)(span_elems(b) * dtype_bytes(b->dtype));
  return a0 < b1 && b0 < a1;
}

static int aligned(const bp_abi_tensor *t, const void *p) {
  return p && (uintptr_t)p % (uintptr_t)dtype_bytes(t->dtype) == 0;
}

int ref_check_ptrs(const bp_abi_kernel_args *args, const int *alias_out, const int *alias_in,
                   int alias_count) {
  if (!args->input_ptrs && args->num_inputs > 0) return 0;
  if (!args->output_ptrs) return 0;
  for (int i = 0; i < args->num_inputs; i++)
    if (!aligned(&args->inputs[i], args->input_ptrs[i])) return 0;
  for (int o = 0; o < args->num_outputs; o++) {
    const bp_abi_tensor *t = &args->outputs[o];
    const void *p = args->output_ptrs[o];
    if (!aligned(t, p)) return 0;
    for (int i = 0; i < args->num_inputs; i++) {
      if (!overlaps(t, p, &args->inputs[i], args->input_ptrs[i])) continue;
      int allowed = 0;
      for (int a = 0; a < alias_count; a++)
        if (alias_out[a] == o && alias_in[a] == i &&
            same_elements(t, p, &args->inputs[i], args->input_ptrs[i]))
          allowed = 1;
      if (!allowed) return 0;
    }
    for (int o2 = 0; o2 < o; o2++)
      if (overlaps(t, p, &args->outputs[o2], args->output_ptrs[o2])) return 0;
  }
  return 1;
}

void ref_zero(const bp_abi_tensor *t, float *p) {
  for (int64_t n = 0; n < t->shape[0]; n++)
    for (int64_t h = 0; h < t->shape[1]; h++)
      for (int64_t w = 0; w < t->shape[2]; w++) {
        float *row = p + ref_off(t, n, h, w, 0);
        for (int64_t c = 0; c < t->shape[3]; c++) row[c * t->stride[3]] = 0.0f;
      }
}
