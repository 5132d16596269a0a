/* Element types of DTensors. */
#ifndef BLUEPRINT_DTYPE_H
#define BLUEPRINT_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Values are only ever appended. */
typedef enum bp_dtype {
  BP_DTYPE_FP32 = 0,
  BP_DTYPE_FP16 = 1,
  BP_DTYPE_INT8 = 2,
  BP_DTYPE_INT32 = 3,
  BP_DTYPE_BF16 = 4, /* reserved: named, but no slot rule yet (planning it fails) */
  BP_DTYPE_ANY = 5,  /* only in the region catalog: "several dtypes" */
} bp_dtype;

/* Bytes per element (0 for BP_DTYPE_ANY). */
size_t bp_dtype_size(bp_dtype dtype);

/* "fp32", "fp16", "int8", "int32", "bf16", "any"; "?" when out of range. */
const char *bp_dtype_name(bp_dtype dtype);

/* Parses a name as printed by bp_dtype_name; returns 0 on success. */
int bp_dtype_from_name(const char *name, bp_dtype *out);

/* IEEE binary16 bits of `f`, rounded to nearest, ties to even; overflow
 * gives infinity, NaN stays NaN (quiet, sign kept), subnormals are kept.
 * These are the module SDK's conversions (bp_sdk_fp32_to_fp16 and
 * bp_sdk_fp16_to_fp32, abi/bp_abi_sdk.h, which states the rules), the
 * project's one conversion: range.cast uses the same functions. */
uint16_t bp_fp16_from_fp32(float f);
/* The exact float value of binary16 bits `h`. */
float bp_fp16_to_fp32(uint16_t h);

#ifdef __cplusplus
}
#endif
#endif
