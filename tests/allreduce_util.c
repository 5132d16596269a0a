/* Helpers of the all-reduce tests (allreduce_util.h). */
#include "allreduce_util.h"

#include <math.h>
#include <string.h>

const bp_abi_kernel *ar_kernel(bp_registry *registry, const char *op, const char *impl) {
  for (int i = 0; i < bp_registry_kernel_count(registry); i++) {
    const bp_abi_kernel *k = &bp_registry_kernel(registry, i)->kernel;
    if (strcmp(k->op, op) == 0 && strcmp(k->impl, impl) == 0) return k;
  }
  return NULL;
}

float ar_value_of(int r, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(r + 1) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  const float m = (float)(x & 0xFFFFFF) / (float)0x1000000 - 0.5f; /* [-0.5, 0.5) */
  const int e = (int)((x >> 24) % 24) - 12;
  return ldexpf(m, e);
}

int ar_expected(const char *op, int world, int r, uint64_t count, uint64_t i, float scale,
                float *want) {
  int owner = 0;
  while (i >= bp_abi_chunk_start(count, world, owner + 1)) owner++;
  if (strcmp(op, "allreduce.all_gather") == 0) {
    *want = ar_value_of(owner, i);
    return 1;
  }
  if (strcmp(op, "allreduce.reduce_scatter") == 0 && owner != r) return 0;
  float s = ar_value_of(0, i);
  for (int k = 1; k < world; k++) s += ar_value_of(k, i);
  *want = s * scale;
  return 1;
}

void ar_node_init(ar_node *n, float *data, uint64_t count, float scale, const bp_abi_comm *c) {
  memset(n, 0, sizeof *n);
  n->span = (bp_abi_tensor){sizeof n->span, BP_ABI_DTYPE_FP32, {1, 1, 1, (int64_t)count},
                            (int64_t)count, {(int64_t)count, (int64_t)count, (int64_t)count, 1},
                            count * sizeof(float)};
  n->attrs.scale = scale;
  n->ptr = data;
  if (c) n->comm = *c;
  bp_abi_kernel_args *a = &n->args;
  a->struct_size = sizeof *a;
  a->num_inputs = a->num_outputs = 1;
  a->inputs = a->outputs = &n->span;
  a->input_ptrs = (const void *const *)&n->ptr;
  a->output_ptrs = &n->ptr;
  a->attrs = &n->attrs;
  a->attr_size = sizeof n->attrs;
  a->attr_version = BP_ABI_ATTR_VERSION;
  a->rank = c ? c->rank : 0;
  a->world_size = c ? c->world : 1;
  a->comm = c ? &n->comm : NULL;
}
