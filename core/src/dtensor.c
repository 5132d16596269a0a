/* DTensor descriptors: alignment, slot sizes and strides (dtensor.h). */
#include "blueprint/dtensor.h"

#include <string.h>

int bp_dtensor_alignment(bp_dtype dtype, bp_region region) {
  if (dtype == BP_DTYPE_FP16 && (region == BP_REGION_I_A || region == BP_REGION_I_B)) return 4;
  if (dtype == BP_DTYPE_FP16 && region == BP_REGION_F16) return 8;
  if (dtype == BP_DTYPE_INT8 && region == BP_REGION_S_MASK) return 8;
  return 1;
}

/* x rounded up to a multiple of a (a > 0); false on overflow. */
static bool align_up_u64(uint64_t x, uint64_t a, uint64_t *out) {
  uint64_t sum;
  if (__builtin_add_overflow(x, a - 1, &sum)) return false;
  *out = sum / a * a;
  return true;
}

static bp_status shape_valid(bp_shape s) {
  if (s.n < 1 || s.h < 1 || s.w < 1 || s.c < 1)
    return bp_fail(BP_ERR_SHAPE, "shape [%lld,%lld,%lld,%lld] has an extent below 1",
                   (long long)s.n, (long long)s.h, (long long)s.w, (long long)s.c);
  return BP_OK;
}

/* elems = N*H*W*padded_c, checked. */
static bp_status padded_elems(bp_dtype dtype, bp_region region, bp_shape s, int64_t *padded_c,
                              uint64_t *elems) {
  bp_status st = shape_valid(s);
  if (st != BP_OK) return st;
  uint64_t pc = 0, e = 0;
  if (!align_up_u64((uint64_t)s.c, (uint64_t)bp_dtensor_alignment(dtype, region), &pc) ||
      __builtin_mul_overflow((uint64_t)s.n, (uint64_t)s.h, &e) ||
      __builtin_mul_overflow(e, (uint64_t)s.w, &e) || __builtin_mul_overflow(e, pc, &e))
    return bp_fail(BP_ERR_OVERFLOW, "shape [%lld,%lld,%lld,%lld] overflows 64-bit element count",
                   (long long)s.n, (long long)s.h, (long long)s.w, (long long)s.c);
  *padded_c = (int64_t)pc;
  *elems = e;
  return BP_OK;
}

bp_status bp_dtensor_slot_bytes(bp_dtype dtype, bp_region region, bp_shape shape,
                                uint64_t *slot_bytes_out) {
  if (dtype != BP_DTYPE_FP32 && dtype != BP_DTYPE_FP16 && dtype != BP_DTYPE_INT8 &&
      dtype != BP_DTYPE_INT32)
    return bp_fail(BP_ERR_UNSUPPORTED, "dtype %s has no slot rule", bp_dtype_name(dtype));
  int64_t pc = 0;
  uint64_t elems = 0;
  bp_status st = padded_elems(dtype, region, shape, &pc, &elems);
  if (st != BP_OK) return st;
  /* INT8 counts one byte an element; FP16, FP32 and INT32 count the FP16
   * size, FP32/INT32 then double it so a slot is exactly twice its twin. */
  uint64_t unit = dtype == BP_DTYPE_INT8 ? 1 : 2;
  uint64_t bytes, slot;
  if (__builtin_mul_overflow(elems, unit, &bytes) ||
      __builtin_add_overflow(bytes, (uint64_t)BP_TAIL_BYTES, &bytes) ||
      !align_up_u64(bytes, BP_SLOT_ALIGN, &slot) ||
      ((dtype == BP_DTYPE_FP32 || dtype == BP_DTYPE_INT32) &&
       __builtin_mul_overflow(slot, (uint64_t)2, &slot)))
    return bp_fail(BP_ERR_OVERFLOW, "slot of shape [%lld,%lld,%lld,%lld] %s overflows 64 bits",
                   (long long)shape.n, (long long)shape.h, (long long)shape.w,
                   (long long)shape.c, bp_dtype_name(dtype));
  *slot_bytes_out = slot;
  return BP_OK;
}

/* NHWC element strides for channel extent c. */
static void nhwc_strides(bp_shape s, int64_t c, int64_t stride[4]) {
  stride[3] = 1;
  stride[2] = c;
  stride[1] = c * s.w;
  stride[0] = c * s.w * s.h;
}

bp_status bp_dtensor_make(bp_dtensor *out, int32_t id, const char *name, bp_shape shape,
                          bp_dtype dtype, bp_region region, uint64_t slot_bytes, bp_init init) {
  uint64_t own;
  bp_status st = bp_dtensor_slot_bytes(dtype, region, shape, &own);
  if (st != BP_OK) return st;
  if (slot_bytes != 0 && slot_bytes < own)
    return bp_fail(BP_ERR_INVALID, "tensor '%s': slot of %llu bytes is smaller than its %llu",
                   name, (unsigned long long)slot_bytes, (unsigned long long)own);
  bp_dtensor t;
  memset(&t, 0, sizeof t);
  t.id = id;
  memcpy(t.name, name, strnlen(name, BP_NAME_MAX - 1));
  t.shape = shape;
  t.dtype = dtype;
  t.region = region;
  int64_t align = bp_dtensor_alignment(dtype, region);
  t.padded_c = (shape.c + align - 1) / align * align; /* cannot overflow: slot checked */
  t.slot_bytes = slot_bytes ? slot_bytes : own;
  nhwc_strides(shape, t.padded_c, t.dev_stride);
  nhwc_strides(shape, shape.c, t.host_stride);
  t.init = init;
  *out = t;
  return BP_OK;
}

bool bp_dtensor_is_compact(const bp_dtensor *t) { return t->padded_c == t->shape.c; }

uint64_t bp_dtensor_host_elems(const bp_dtensor *t) {
  return (uint64_t)t->shape.n * (uint64_t)t->shape.h * (uint64_t)t->shape.w *
         (uint64_t)t->shape.c;
}

uint64_t bp_dtensor_device_elems(const bp_dtensor *t) {
  return (uint64_t)t->shape.n * (uint64_t)t->shape.h * (uint64_t)t->shape.w *
         (uint64_t)t->padded_c;
}
