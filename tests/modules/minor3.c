/* A module built against ABI 1.3: its module descriptor says minor 3, its
 * kernel descriptor ends before prepare (the 1.4 fields that follow in this
 * file hold poison: a prepare and a release that abort), and run() reads
 * the arguments as 1.3 defined them: the fields up to `comm`, copied by
 * the struct_size rule (min of the writer's and its own size), nothing
 * after. The host must call neither poisoned function and must hand the
 * 1.3 fields as before. run() computes relu.fwd and counts in the
 * tm_state_stats that is its user. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "state_module.h"
#include "test_module.h"

/* bp_abi_kernel_args as ABI 1.3 declared it: everything up to comm. */
typedef struct args_1_3 {
  uint32_t struct_size;
  int32_t num_inputs, num_outputs;
  const bp_abi_tensor *inputs;
  const bp_abi_tensor *outputs;
  const void *const *input_ptrs;
  void *const *output_ptrs;
  const void *attrs;
  uint32_t attr_size;
  uint32_t attr_version;
  void *workspace;
  uint64_t workspace_bytes;
  void *stream;
  int32_t rank, world_size;
  const bp_abi_comm *comm;
} args_1_3;
_Static_assert(sizeof(args_1_3) == offsetof(bp_abi_kernel_args, state),
               "1.4 appended to the 1.3 arguments");

static tm_state_stats stats;

static int poisoned_prepare(void *user, const bp_abi_kernel_args *a, void **state_out) {
  (void)user, (void)a, (void)state_out;
  abort();
}

static void poisoned_release(void *user, void *state) {
  (void)user, (void)state;
  abort();
}

static int run(void *user, const bp_abi_kernel_args *args) {
  tm_state_stats *s = user;
  __atomic_add_fetch(&s->runs, 1, __ATOMIC_RELAXED);
  args_1_3 a;
  memset(&a, 0, sizeof a);
  if (args->struct_size < sizeof a) { /* a host older than this module */
    __atomic_add_fetch(&s->bad_run_args, 1, __ATOMIC_RELAXED);
    return BP_ABI_ERR_INVALID;
  }
  memcpy(&a, args, sizeof a);
  if (a.num_inputs != 1 || a.num_outputs != 1 || a.rank != 0 || a.world_size != 1 || a.comm ||
      !a.input_ptrs || !a.output_ptrs || a.inputs[0].dtype != BP_ABI_DTYPE_FP32) {
    __atomic_add_fetch(&s->bad_run_args, 1, __ATOMIC_RELAXED);
    return BP_ABI_ERR_INVALID;
  }
  const bp_abi_tensor *x = &a.inputs[0], *y = &a.outputs[0];
  const float *xp = a.input_ptrs[0];
  float *yp = a.output_ptrs[0];
  for (int64_t n = 0; n < x->shape[0]; n++)
    for (int64_t h = 0; h < x->shape[1]; h++)
      for (int64_t w = 0; w < x->shape[2]; w++)
        for (int64_t c = 0; c < x->shape[3]; c++) {
          const float v =
              xp[n * x->stride[0] + h * x->stride[1] + w * x->stride[2] + c * x->stride[3]];
          yp[n * y->stride[0] + h * y->stride[1] + w * y->stride[2] + c * y->stride[3]] =
              v > 0.0f ? v : 0.0f;
        }
  return BP_ABI_OK;
}

static const bp_abi_kernel kernel = {
    .struct_size = offsetof(bp_abi_kernel, prepare),
    .op = "relu.fwd",
    .impl = "minor3",
    .device = "cpu",
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32),
    .priority = 1,
    .run = run,
    .user = &stats,
    .prepare = poisoned_prepare, /* beyond struct_size: never read */
    .release = poisoned_release,
};

static int init(const bp_abi_host *host) { return host->register_kernel(host->ctx, &kernel); }

static const bp_abi_module module = {
    .struct_size = sizeof(bp_abi_module),
    .abi_major = BP_ABI_MAJOR,
    .abi_minor_built = 3,
    .abi_minor_required = 0,
    .name = "test-minor3",
    .version = "1.3",
    .build_id = TM_BUILD_ID,
    .init = init,
};

BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void);
BP_ABI_EXPORT const bp_abi_module *BP_ABI_ENTRY(void) { return &module; }
