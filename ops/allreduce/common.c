/* Argument checks and the one summation shared by the all-reduce modules
 * (allreduce-impl.h). */
#include <string.h>

#include "allreduce-impl.h"

static int is_span(const bp_abi_tensor *t) {
  return t->struct_size >= sizeof *t && t->dtype == BP_ABI_DTYPE_FP32 && t->shape[0] == 1 &&
         t->shape[1] == 1 && t->shape[2] == 1 && t->shape[3] >= 0 &&
         t->slot_bytes >= (uint64_t)t->shape[3] * sizeof(float);
}

int ar_check(const bp_abi_kernel_args *a, ar_op op, const char *backend, int max_world,
             uint64_t *count, float *scale, char *reason, size_t size) {
  if (!a || !BP_SDK_HAS_FIELD(a, bp_abi_kernel_args, comm))
    return bp_sdk_fail(reason, size, "the host passes no communicator (ABI older than 1.1)");
  if (a->num_inputs != 1 || a->num_outputs != 1 || !a->inputs || !a->outputs)
    return bp_sdk_fail(reason, size, "needs one input span and one output span");
  if (!is_span(bp_sdk_input(a, 0)) || !is_span(bp_sdk_output(a, 0)) ||
      bp_sdk_input(a, 0)->shape[3] != bp_sdk_output(a, 0)->shape[3])
    return bp_sdk_fail(reason, size, "needs one FP32 span [1,1,1,E], the same span in and out");
  if (AR_REDUCES(op) && (!a->attrs || a->attr_size < sizeof(bp_allreduce_attrs)))
    return bp_sdk_fail(reason, size, "needs the allreduce attribute block (scale)");
  const bp_abi_comm *c = a->comm;
  if (!c || c->struct_size < sizeof *c || !c->backend)
    return bp_sdk_fail(reason, size, "no communicator (a run of one rank has no all-reduce)");
  if (strcmp(c->backend, backend) != 0)
    return bp_sdk_fail(reason, size, "communicator backend '%s', not '%s'", c->backend, backend);
  if (c->world < 1 || c->world > max_world || c->rank < 0 || c->rank >= c->world || !c->handle)
    return bp_sdk_fail(reason, size, "rank %d of world %d (at most %d ranks)", c->rank,
                       c->world, max_world);
  *count = (uint64_t)bp_sdk_output(a, 0)->shape[3];
  *scale = AR_REDUCES(op) ? ((const bp_allreduce_attrs *)a->attrs)->scale : 1.0f;
  return 1;
}

/* Three flat passes per block, each its own scope with its own restrict
 * pointer (dst may be a src: each pass touches it through one pointer
 * only), so the compiler vectorizes them (-O3, CMakeLists.txt); the float
 * operations per element stay the ones written in allreduce-impl.h. */
void ar_reduce_chunk(float *dst, const float *const *src, int world, uint64_t n, float scale) {
  float acc[AR_BLOCK];
  for (uint64_t b = 0; b < n; b += AR_BLOCK) {
    const uint64_t m = n - b < AR_BLOCK ? n - b : AR_BLOCK;
    {
      const float *restrict s = src[0] + b;
      for (uint64_t i = 0; i < m; i++) acc[i] = s[i];
    }
    for (int r = 1; r < world; r++) {
      const float *restrict s = src[r] + b;
      for (uint64_t i = 0; i < m; i++) acc[i] += s[i];
    }
    {
      float *restrict d = dst + b;
      for (uint64_t i = 0; i < m; i++) d[i] = acc[i] * scale;
    }
  }
}

void ar_copy_in(const bp_abi_kernel_args *a, uint64_t count) {
  if (a->input_ptrs[0] != a->output_ptrs[0] && count)
    memmove(a->output_ptrs[0], a->input_ptrs[0], (size_t)count * sizeof(float));
}
