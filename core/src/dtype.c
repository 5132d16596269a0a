/* Element type names and sizes. */
#include "blueprint/dtype.h"

#include "bp_abi_sdk.h"

#include <string.h>

static const struct {
  const char *name;
  size_t size;
} dtype_rows[] = {
    [BP_DTYPE_FP32] = {"fp32", 4}, [BP_DTYPE_FP16] = {"fp16", 2}, [BP_DTYPE_INT8] = {"int8", 1},
    [BP_DTYPE_INT32] = {"int32", 4}, [BP_DTYPE_BF16] = {"bf16", 2}, [BP_DTYPE_ANY] = {"any", 0},
};

#define DTYPE_COUNT ((int)(sizeof dtype_rows / sizeof dtype_rows[0]))

size_t bp_dtype_size(bp_dtype dtype) {
  return (int)dtype >= 0 && (int)dtype < DTYPE_COUNT ? dtype_rows[dtype].size : 0;
}

const char *bp_dtype_name(bp_dtype dtype) {
  return (int)dtype >= 0 && (int)dtype < DTYPE_COUNT ? dtype_rows[dtype].name : "?";
}

int bp_dtype_from_name(const char *name, bp_dtype *out) {
  for (int i = 0; i < DTYPE_COUNT; i++) {
    if (strcmp(name, dtype_rows[i].name) == 0) {
      *out = (bp_dtype)i;
      return 0;
    }
  }
  return -1;
}

uint16_t bp_fp16_from_fp32(float f) { return bp_sdk_fp32_to_fp16(f); }

float bp_fp16_to_fp32(uint16_t h) { return bp_sdk_fp16_to_fp32(h); }
