/* DTensor: a pure descriptor of one tensor in the arena. It owns no memory
 * and holds no pointer; a pointer is arena base + offset on each rank.
 *
 * Rules (docs/architecture.md, "DTensor rules", says why):
 *  - NHWC shape; an FC weight [out, in] is [out, 1, 1, in]; a scalar [1,1,1,1].
 *  - alignment(dtype, region): FP16 in I_A/I_B: 4; FP16 in F16: 8; INT8 in
 *    S_MASK: 8; everything else 1. Never depends on build flags.
 *  - padded_c = align_up(C, alignment); device strides use padded_c, host
 *    strides are compact (C).
 *  - elems = N*H*W*padded_c; slot_bytes: FP16 align_up(2*elems + 16, 256);
 *    INT8 align_up(elems + 16, 256); FP32/INT32 2*align_up(2*elems + 16, 256).
 *    The 16 tail bytes let XNNPACK-style kernels read past the end.
 *  - every offset and slot is a multiple of 256. */
#ifndef BLUEPRINT_DTENSOR_H
#define BLUEPRINT_DTENSOR_H

#include <stdbool.h>
#include <stdint.h>

#include "blueprint/dtype.h"
#include "blueprint/region.h"
#include "blueprint/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BP_NAME_MAX 64      /* bytes of a tensor name, NUL included */
#define BP_SLOT_ALIGN 256   /* every offset and slot_bytes is a multiple */
#define BP_TAIL_BYTES 16    /* readable bytes past the end (XNN_EXTRA_BYTES) */

/* NHWC extents, each >= 1. */
typedef struct bp_shape {
  int64_t n, h, w, c;
} bp_shape;

/* How a tensor's host data is filled before training. Fan-in and fan-out
 * come from the NHWC shape of a weight [out, kh, kw, in]: fan_in = kh*kw*in,
 * fan_out = out*kh*kw. */
typedef enum bp_init_kind {
  BP_INIT_NONE = 0,       /* left as is (features, temporaries) */
  BP_INIT_ZEROS,
  BP_INIT_ONES,
  BP_INIT_CONSTANT,       /* a */
  BP_INIT_UNIFORM,        /* U[a, b) */
  BP_INIT_NORMAL,         /* N(mean a, std b) */
  BP_INIT_KAIMING_NORMAL, /* N(0, gain/sqrt(fan_in)), gain a (0: sqrt 2) */
  BP_INIT_KAIMING_UNIFORM,/* U(+-gain*sqrt(3/fan_in)), gain a (0: sqrt 2) */
  BP_INIT_XAVIER_NORMAL,  /* N(0, gain*sqrt(2/(fan_in+fan_out))), gain a (0: 1) */
  BP_INIT_XAVIER_UNIFORM, /* U(+-gain*sqrt(6/(fan_in+fan_out))), gain a (0: 1) */
} bp_init_kind;

typedef struct bp_init {
  bp_init_kind kind;
  float a, b;    /* parameters, as listed per kind */
  uint64_t seed; /* mixed with the run seed; tensors with equal seeds and
                    rules get equal data */
} bp_init;

typedef struct bp_dtensor {
  int32_t id;                /* index in the plan, equal in every variant */
  char name[BP_NAME_MAX];    /* "conv1.w", unique in the plan */
  bp_shape shape;            /* this variant's NHWC shape */
  bp_dtype dtype;
  bp_region region;
  int64_t padded_c;          /* align_up(c, alignment(dtype, region)) */
  uint64_t offset;           /* bytes from the arena base; multiple of 256 */
  uint64_t slot_bytes;       /* bytes reserved; max over variants */
  int64_t dev_stride[4];     /* NHWC element strides in the arena (padded_c) */
  int64_t host_stride[4];    /* NHWC element strides on the host (compact) */
  bp_init init;
} bp_dtensor;

/* Channel alignment of a dtype in a region (1, 4 or 8). */
int bp_dtensor_alignment(bp_dtype dtype, bp_region region);

/* slot_bytes of a shape by the rules above; BP_ERR_OVERFLOW when it does
 * not fit in 64 bits, BP_ERR_UNSUPPORTED for BF16/ANY. */
bp_status bp_dtensor_slot_bytes(bp_dtype dtype, bp_region region, bp_shape shape,
                                uint64_t *slot_bytes_out);

/* Fills `out` with a descriptor at offset 0. `slot_bytes` 0 means the
 * shape's own slot; a larger value (the max across variants) is kept; a
 * smaller one is BP_ERR_INVALID. Name is truncated to BP_NAME_MAX-1. */
bp_status bp_dtensor_make(bp_dtensor *out, int32_t id, const char *name, bp_shape shape,
                          bp_dtype dtype, bp_region region, uint64_t slot_bytes,
                          bp_init init);

/* True when padded_c == c: device and host layouts are the same. */
bool bp_dtensor_is_compact(const bp_dtensor *t);

/* N*H*W*C and N*H*W*padded_c. */
uint64_t bp_dtensor_host_elems(const bp_dtensor *t);
uint64_t bp_dtensor_device_elems(const bp_dtensor *t);

/* Fan-in and fan-out of a weight shape [out, kh, kw, in]. */
void bp_shape_fans(bp_shape shape, double *fan_in, double *fan_out);

/* Writes host_elems FP32 values of the init rule into `dst` (compact NHWC),
 * deterministically from (run_seed, t->init.seed). NONE leaves dst as is. */
bp_status bp_dtensor_init_fill(const bp_dtensor *t, uint64_t run_seed, float *dst);

#ifdef __cplusplus
}
#endif
#endif
