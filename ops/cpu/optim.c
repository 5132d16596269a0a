/* range.sgd and range.adamw, vectorized; bit-identical to sgd_run and
 * adamw_run of ops/reference/range.c (the formulas, the checks and the
 * spans are described there and in bp_abi_ops.h).
 *
 * Each element takes the reference's float operations in the reference's
 * order: both call the same inline formulas (bp_sgd, bp_adamw of
 * ops/shared/elem_math.h). The per-element branches of the reference that
 * depend only on attributes (weight_decay != 0, nesterov) become constant
 * arguments of one of four loops instead, so each loop is straight-line
 * code the compiler vectorizes. The scalar factors of AdamW (bias
 * corrections, decay, step size) are the reference's bp_adamw_factors_of. grad, w, m and v never
 * overlap (bp_sdk_check_ptrs), hence restrict. The checks are the
 * reference's own (ops/shared/range_check.h), the skip input (ABI 1.5)
 * included: a nonzero skip returns before anything is read or written.
 * Threads: big spans are cut into tasks (OPTIM_TASK_ELEMS below). */
#include <math.h>
#include <string.h>

#include "cpu-impl.h"
#include "shared/range_check.h"

/* ---- loops ---------------------------------------------------------------- */

/* One SGD mode: decay (weight_decay != 0) and nesterov fixed at compile time. */
CPU_INLINE void sgd_mode(float *restrict w, float *restrict m, const float *restrict grad,
                         int64_t n, float lr, float mu, float wd, int decay, int nesterov) {
  for (int64_t i = 0; i < n; i++) bp_sgd(grad[i], &w[i], &m[i], lr, mu, wd, decay, nesterov);
}

CPU_INLINE void sgd_loop_body(float *restrict w, float *restrict m, const float *restrict grad,
                              int64_t n, float lr, float mu, float wd, int nesterov) {
  if (wd != 0.0f) {
    if (nesterov) sgd_mode(w, m, grad, n, lr, mu, wd, 1, 1);
    else sgd_mode(w, m, grad, n, lr, mu, wd, 1, 0);
  } else {
    if (nesterov) sgd_mode(w, m, grad, n, lr, mu, wd, 0, 1);
    else sgd_mode(w, m, grad, n, lr, mu, wd, 0, 0);
  }
}
CPU_DISPATCH(sgd_loop,
             (float *restrict w, float *restrict m, const float *restrict grad, int64_t n,
              float lr, float mu, float wd, int nesterov),
             (w, m, grad, n, lr, mu, wd, nesterov))

/* The scalar factors of one AdamW step: bp_adamw_factors (elem_math.h). */
CPU_INLINE void adamw_loop_body(float *restrict w, float *restrict m, float *restrict v,
                                const float *restrict grad, int64_t n, bp_adamw_factors f) {
  for (int64_t i = 0; i < n; i++) bp_adamw(&f, grad[i], &w[i], &m[i], &v[i]);
}
CPU_DISPATCH(adamw_loop,
             (float *restrict w, float *restrict m, float *restrict v, const float *restrict grad,
              int64_t n, bp_adamw_factors f),
             (w, m, v, grad, n, f))

/* ---- tasks -------------------------------------------------------------------- */

/* One update cut into tasks of OPTIM_TASK_ELEMS elements; each element's
 * update does not depend on the cut. An update reads and writes 3-4
 * floats an element in under a nanosecond, so a task takes about 0.1 ms:
 * several times what waking a sleeping thread costs (20-30 us on the
 * 2-core VM). A span of a small model (around 10^5 parameters) stays one
 * task on the calling thread; the MLP's 668,672 weights are 6 tasks (its
 * update 0.48 -> 0.34 ms a step on 2 threads against one task, and no
 * slower with another process busy on one core: bench/RESULTS.md). */
#define OPTIM_TASK_ELEMS (2 * CPU_TASK_ELEMS)
typedef struct optim_job {
  float *w, *m, *v;
  const float *grad;
  int64_t n;
  float lr, mu, wd; /* sgd */
  int nesterov;     /* sgd */
  bp_adamw_factors f; /* adamw */
  cpu_isa_level isa;  /* the context's (cpu_user) */
} optim_job;

static void sgd_task(void *p, int64_t i) {
  const optim_job *j = p;
  int64_t end;
  const int64_t lo = cpu_task_items(i, OPTIM_TASK_ELEMS, j->n, &end);
  sgd_loop(j->isa, j->w + lo, j->m + lo, j->grad + lo, end - lo, j->lr, j->mu, j->wd, j->nesterov);
}

static void adamw_task(void *p, int64_t i) {
  const optim_job *j = p;
  int64_t end;
  const int64_t lo = cpu_task_items(i, OPTIM_TASK_ELEMS, j->n, &end);
  adamw_loop(j->isa, j->w + lo, j->m + lo, j->v + lo, j->grad + lo, end - lo, j->f);
}

/* ---- kernels ---------------------------------------------------------------- */

/* supports(): the reference's checks (spans are always one dense run). */
static int sgd_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_optimizer_attrs a;
  return ops_sgd_check(args, &a, reason, rs);
}
static int adamw_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_optimizer_attrs a;
  return ops_adamw_check(args, &a, reason, rs);
}

/* range.sgd  in: grad, lr, [skip]   out: w, m (sgd_run). */
static int sgd_run(void *user, const bp_abi_kernel_args *args) {
  bp_optimizer_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  float lr, step;
  if (!ops_sgd_check(args, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  if (ops_skip_set(args, a.has_skip)) return BP_ABI_OK;
  if (!ops_update_scalars(args, -1, &lr, &step)) return BP_ABI_ERR_INVALID;
  optim_job j = {.w = bp_sdk_output_f32(args, 0), .m = bp_sdk_output_f32(args, 1),
                 .grad = bp_sdk_input_f32(args, 0), .n = bp_sdk_input(args, 0)->shape[3],
                 .lr = lr, .mu = a.momentum, .wd = a.weight_decay, .nesterov = a.nesterov,
                 .isa = cpu_user_isa(user)};
  bp_sdk_parallel_for(args, sgd_task, &j, cpu_task_count(j.n, OPTIM_TASK_ELEMS));
  return BP_ABI_OK;
}

/* range.adamw  in: grad, lr, step, [skip]   out: w, m, v (adamw_run). */
static int adamw_run(void *user, const bp_abi_kernel_args *args) {
  bp_optimizer_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  float lr, step;
  if (!ops_adamw_check(args, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  if (ops_skip_set(args, a.has_skip)) return BP_ABI_OK;
  if (!ops_update_scalars(args, 2, &lr, &step)) return BP_ABI_ERR_INVALID;
  const bp_adamw_factors f =
      bp_adamw_factors_of(lr, step, a.beta1, a.beta2, a.weight_decay, a.eps);
  optim_job j = {.w = bp_sdk_output_f32(args, 0), .m = bp_sdk_output_f32(args, 1),
                 .v = bp_sdk_output_f32(args, 2), .grad = bp_sdk_input_f32(args, 0),
                 .n = bp_sdk_input(args, 0)->shape[3], .f = f,
                 .isa = cpu_user_isa(user)};
  bp_sdk_parallel_for(args, adamw_task, &j, cpu_task_count(j.n, OPTIM_TASK_ELEMS));
  return BP_ABI_OK;
}

const bp_abi_kernel cpu_range_sgd = CPU_KERNEL("range.sgd", sgd_supports, sgd_run, 0);
const bp_abi_kernel cpu_range_adamw = CPU_KERNEL("range.adamw", adamw_supports, adamw_run, 0);
