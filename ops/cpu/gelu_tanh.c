/* gelu_tanh.fwd and gelu_tanh.bwd (PyTorch's GELU(approximate='tanh')),
 * threaded; bit-identical to gelu_tanh_run_fwd and gelu_tanh_run_bwd of
 * ops/reference/elementwise.c: every element goes through the same
 * bp_gelu_tanh_fwd / bp_gelu_tanh_bwd (ops/shared/elem_math.h: double,
 * libm's tanh, rounded once), and dx (+)= that float.
 *
 * tanh has no vector form with libm's bits, so the loops stay scalar; the
 * speed comes from the host's threads: the elements, one dense run per
 * tensor (cpu_dense; other layouts are refused and go to the reference),
 * are cut into tasks of CPU_TASK_ELEMS / 16 elements (tanh in double
 * costs about as much as sixteen element-wise additions). No output
 * aliases an input (bp_sdk_check_ptrs), as the op says. The checks are the
 * reference's (ops/shared/elementwise_check.h). */
#include "cpu-impl.h"
#include "shared/elem_math.h"
#include "shared/elementwise_check.h"

#define GT_TASK_ELEMS (CPU_TASK_ELEMS / 16)

typedef struct gt_job {
  const float *x, *dy; /* dy: bwd only */
  float *out;          /* fwd: y; bwd: dx */
  int64_t n;
  int accumulate;
} gt_job;

static void gt_fwd_task(void *p, int64_t i) {
  const gt_job *j = p;
  int64_t end;
  for (int64_t k = cpu_task_items(i, GT_TASK_ELEMS, j->n, &end); k < end; k++)
    j->out[k] = bp_gelu_tanh_fwd(j->x[k]);
}

static void gt_bwd_task(void *p, int64_t i) {
  const gt_job *j = p;
  int64_t end;
  for (int64_t k = cpu_task_items(i, GT_TASK_ELEMS, j->n, &end); k < end; k++) {
    const float g = bp_gelu_tanh_bwd(j->x[k], j->dy[k]);
    j->out[k] = j->accumulate ? j->out[k] + g : g;
  }
}

/* The reference's checks (nin inputs: 1 forward, 2 backward), then every
 * tensor one dense run. */
static int gt_check(int nin, const bp_abi_kernel_args *args, bp_elementwise_attrs *a,
                    char *reason, size_t rs) {
  static const char *const in_names[] = {"input 0", "input 1"};
  if (!ops_ew_check(args, nin, 1, a, reason, rs)) return 0;
  for (int i = 0; i < nin; i++)
    if (!cpu_dense(bp_sdk_input(args, i), in_names[i], reason, rs)) return 0;
  return cpu_dense(bp_sdk_output(args, 0), "output 0", reason, rs);
}

static int gt_supports_fwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return gt_check(1, args, &a, reason, rs);
}
static int gt_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return gt_check(2, args, &a, reason, rs);
}

static int64_t count_of(const bp_abi_tensor *t) {
  return t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
}

/* gelu_tanh.fwd  in: x   out: y (overwritten) */
static int gt_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  bp_elementwise_attrs a;
  if (!gt_check(1, args, &a, reason, rs) || !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  gt_job j = {bp_sdk_input_f32(args, 0), NULL, bp_sdk_output_f32(args, 0),
              count_of(bp_sdk_input(args, 0)), 0};
  bp_sdk_parallel_for(args, gt_fwd_task, &j, cpu_task_count(j.n, GT_TASK_ELEMS));
  return BP_ABI_OK;
}

/* gelu_tanh.bwd  in: x, dy   out: dx (accumulate 0: overwritten, 1: added) */
static int gt_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  bp_elementwise_attrs a;
  if (!gt_check(2, args, &a, reason, rs) || !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  gt_job j = {bp_sdk_input_f32(args, 0), bp_sdk_input_f32(args, 1), bp_sdk_output_f32(args, 0),
              count_of(bp_sdk_input(args, 0)), a.accumulate};
  bp_sdk_parallel_for(args, gt_bwd_task, &j, cpu_task_count(j.n, GT_TASK_ELEMS));
  return BP_ABI_OK;
}

static const ops_fp16_kernel gt_fwd16 =
    CPU_FP16(gt_supports_fwd, gt_run_fwd, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel gt_bwd16 =
    CPU_FP16(gt_supports_bwd, gt_run_bwd, offsetof(bp_elementwise_attrs, accumulate));
const bp_abi_kernel cpu_gelu_tanh_fwd =
    CPU_KERNEL16("gelu_tanh.fwd", gt_fwd16, 0, CPU_FP16_DTYPES);
const bp_abi_kernel cpu_gelu_tanh_bwd =
    CPU_KERNEL16("gelu_tanh.bwd", gt_bwd16, 0, CPU_FP16_DTYPES);
