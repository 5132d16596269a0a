/* relu.fwd and relu.bwd, vectorized; bit-identical to relu_run_fwd and
 * relu_run_bwd of ops/reference/elementwise.c:
 *   relu.fwd  in: x         out: y (may be x)    y = x < 0 ? 0 : x
 *   relu.bwd  in: y, dy     out: dx (may be dy)  dx (+)= y > 0 ? dy : 0
 * The same comparisons and the same addition per element (NaN passes the
 * forward as it is; -0.0 stays -0.0), over tensors whose logical elements
 * are one dense run each (cpu_dense; others are refused and go to the
 * reference), so element i of every tensor is ptr[i]. The in-place forms
 * (y is x; dx is dy) run loops with one pointer for the shared tensor, so
 * every restrict promise holds; otherwise the output overlaps no input
 * (bp_sdk_check_ptrs). The checks are the reference's own
 * (ops/shared/elementwise_check.h). Threads: the elements are cut into
 * tasks of CPU_TASK_ELEMS (cpu-impl.h); each element's value does not
 * depend on the cut. */
#include "cpu-impl.h"
#include "shared/elem_math.h"
#include "shared/elementwise_check.h"

/* ---- layout --------------------------------------------------------------- */

int cpu_dense(const bp_abi_tensor *t, const char *name, char *reason, size_t rs) {
  int64_t inner = 1;
  for (int d = 3; d >= 0; d--) {
    if (t->shape[d] > 1 && t->stride[d] != inner)
      return bp_sdk_fail(reason, rs,
                         "%s: elements are not one dense run (shape [%lld,%lld,%lld,%lld], "
                         "strides [%lld,%lld,%lld,%lld], padded_c %lld); the fast loop needs "
                         "compact NHWC, the reference kernel serves it",
                         name, (long long)t->shape[0], (long long)t->shape[1],
                         (long long)t->shape[2], (long long)t->shape[3], (long long)t->stride[0],
                         (long long)t->stride[1], (long long)t->stride[2], (long long)t->stride[3],
                         (long long)t->padded_c);
    inner *= t->shape[d];
  }
  return 1;
}

static int64_t count_of(const bp_abi_tensor *t) {
  return t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3];
}

/* ---- loops ---------------------------------------------------------------- */

CPU_INLINE void relu_fwd_loop_body(const float *restrict x, float *restrict y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = bp_relu_fwd(x[i]);
}
CPU_DISPATCH(relu_fwd_loop, (const float *restrict x, float *restrict y, int64_t n), (x, y, n))

CPU_INLINE void relu_fwd_inplace_loop_body(float *restrict x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = bp_relu_fwd(x[i]);
}
CPU_DISPATCH(relu_fwd_inplace_loop, (float *restrict x, int64_t n), (x, n))

/* dy is read whatever y holds (the reference reads it only where y > 0; the
 * selected value is the same), which lets the loop vectorize. */
CPU_INLINE void relu_bwd_mode(const float *restrict y, const float *restrict dy,
                              float *restrict dx, int64_t n, int accumulate) {
  for (int64_t i = 0; i < n; i++) {
    const float d = dy[i];
    const float g = bp_relu_bwd(y[i], d);
    dx[i] = accumulate ? dx[i] + g : g;
  }
}
CPU_INLINE void relu_bwd_loop_body(const float *restrict y, const float *restrict dy,
                                   float *restrict dx, int64_t n, int accumulate) {
  if (accumulate) relu_bwd_mode(y, dy, dx, n, 1);
  else relu_bwd_mode(y, dy, dx, n, 0);
}
CPU_DISPATCH(relu_bwd_loop,
             (const float *restrict y, const float *restrict dy, float *restrict dx, int64_t n,
              int accumulate),
             (y, dy, dx, n, accumulate))

/* dx is dy: d holds dy on entry and dx on return. */
CPU_INLINE void relu_bwd_inplace_mode(const float *restrict y, float *restrict d, int64_t n,
                                      int accumulate) {
  for (int64_t i = 0; i < n; i++) {
    const float o = d[i];
    const float g = bp_relu_bwd(y[i], o);
    d[i] = accumulate ? o + g : g;
  }
}
CPU_INLINE void relu_bwd_inplace_loop_body(const float *restrict y, float *restrict d, int64_t n,
                                           int accumulate) {
  if (accumulate) relu_bwd_inplace_mode(y, d, n, 1);
  else relu_bwd_inplace_mode(y, d, n, 0);
}
CPU_DISPATCH(relu_bwd_inplace_loop,
             (const float *restrict y, float *restrict d, int64_t n, int accumulate),
             (y, d, n, accumulate))

/* ---- tasks -------------------------------------------------------------------- */

/* One call cut into tasks of CPU_TASK_ELEMS elements; element i of every
 * tensor is ptr[i], so a task is the same loop over its own range. */
typedef struct relu_job {
  const float *x;  /* fwd: x; bwd: y */
  const float *dy; /* bwd only */
  float *out;      /* fwd: y; bwd: dx */
  int64_t n;
  int accumulate;
  cpu_isa_level isa; /* the context's (cpu_user) */
} relu_job;

static void relu_fwd_task(void *p, int64_t i) {
  const relu_job *j = p;
  int64_t end;
  const int64_t lo = cpu_task_items(i, CPU_TASK_ELEMS, j->n, &end);
  if ((const void *)j->out == (const void *)j->x) relu_fwd_inplace_loop(j->isa, j->out + lo, end - lo);
  else relu_fwd_loop(j->isa, j->x + lo, j->out + lo, end - lo);
}

static void relu_bwd_task(void *p, int64_t i) {
  const relu_job *j = p;
  int64_t end;
  const int64_t lo = cpu_task_items(i, CPU_TASK_ELEMS, j->n, &end);
  if ((const void *)j->out == (const void *)j->dy)
    relu_bwd_inplace_loop(j->isa, j->x + lo, j->out + lo, end - lo, j->accumulate);
  else relu_bwd_loop(j->isa, j->x + lo, j->dy + lo, j->out + lo, end - lo, j->accumulate);
}

/* ---- kernels ---------------------------------------------------------------- */

/* The reference's checks (nin inputs: 1 forward, 2 backward), then every
 * tensor one dense run. */
static int relu_check(int nin, const bp_abi_kernel_args *args, bp_elementwise_attrs *a,
                      char *reason, size_t rs) {
  static const char *const in_names[] = {"input 0", "input 1"};
  if (!ops_ew_check(args, nin, 1, a, reason, rs)) return 0;
  for (int i = 0; i < nin; i++)
    if (!cpu_dense(bp_sdk_input(args, i), in_names[i], reason, rs)) return 0;
  return cpu_dense(bp_sdk_output(args, 0), "output 0", reason, rs);
}

static int relu_supports_fwd(void *user, const bp_abi_kernel_args *args, char *reason,
                             size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return relu_check(1, args, &a, reason, rs);
}
static int relu_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason,
                             size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return relu_check(2, args, &a, reason, rs);
}

/* relu.fwd  in: x   out: y (may be x itself). */
static int relu_run_fwd(void *user, const bp_abi_kernel_args *args) {
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  bp_elementwise_attrs a;
  static const int alias_out[] = {0}, alias_in[] = {0};
  if (!relu_check(1, args, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, alias_out, alias_in, 1, reason, rs))
    return BP_ABI_ERR_INVALID;
  relu_job j = {bp_sdk_input_f32(args, 0), NULL, bp_sdk_output_f32(args, 0),
                count_of(bp_sdk_input(args, 0)), 0, cpu_user_isa(user)};
  bp_sdk_parallel_for(args, relu_fwd_task, &j, cpu_task_count(j.n, CPU_TASK_ELEMS));
  return BP_ABI_OK;
}

/* relu.bwd  in: y, dy   out: dx (may be dy itself). */
static int relu_run_bwd(void *user, const bp_abi_kernel_args *args) {
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  bp_elementwise_attrs a;
  static const int alias_out[] = {0}, alias_in[] = {1};
  if (!relu_check(2, args, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, alias_out, alias_in, 1, reason, rs))
    return BP_ABI_ERR_INVALID;
  relu_job j = {bp_sdk_input_f32(args, 0), bp_sdk_input_f32(args, 1), bp_sdk_output_f32(args, 0),
                count_of(bp_sdk_input(args, 0)), a.accumulate, cpu_user_isa(user)};
  bp_sdk_parallel_for(args, relu_bwd_task, &j, cpu_task_count(j.n, CPU_TASK_ELEMS));
  return BP_ABI_OK;
}

/* FP16 through the adapter; the "may alias" pairs: y with x, dx with dy */
static const ops_fp16_kernel relu_fwd16 =
    CPU_FP16_ALIAS(relu_supports_fwd, relu_run_fwd, OPS_FP16_NO_ACCUMULATE, 1, 0, 0, 0, 0);
static const ops_fp16_kernel relu_bwd16 = CPU_FP16_ALIAS(
    relu_supports_bwd, relu_run_bwd, offsetof(bp_elementwise_attrs, accumulate), 1, 0, 1, 0, 0);
const bp_abi_kernel cpu_relu_fwd =
    CPU_KERNEL16("relu.fwd", relu_fwd16, BP_ABI_KERNEL_IN_PLACE, CPU_FP16_DTYPES);
const bp_abi_kernel cpu_relu_bwd =
    CPU_KERNEL16("relu.bwd", relu_bwd16, BP_ABI_KERNEL_IN_PLACE, CPU_FP16_DTYPES);
