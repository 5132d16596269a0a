/* gelu_tanh.fwd and gelu_tanh.bwd (PyTorch's GELU(approximate='tanh'),
 * ops/shared/elem_math.h) in FP32, vectorized, on the host's threads:
 * within the op's validate tolerance of the reference (which runs libm's
 * tanh in double), not bit-identical to it.
 *
 * tanh(u) = 1 - 2 / (1 + exp(2u)) with blas_expf (blas-simd.h): no branch,
 * so the loops vectorize (AVX2 + FMA where the CPU has them, BLAS_SIMD).
 * Absolute error of t about 1e-7 (the rounding of 1 - 2/(1+e) near
 * u = 0); blas_expf's clamp makes t exactly +-1 for |u| above about 9
 * (exp(2u) neither overflows to inf nor underflows to 0). x is clamped to
 * [-GT_CLAMP, GT_CLAMP] inside u and the slope's polynomial: beyond it t
 * is already exactly +-1 in float, and without it x^3 overflows to inf for
 * |x| above about 1e12 and (1 - t^2) * inf would give NaN where the
 * reference's double gives 0. y = x/2 (1 + t) uses x itself.
 * tests/test_ops_blas_vit.c sweeps x over [-20, 20] and the extremes.
 *
 * Layout: every tensor one dense run (blas_view with no row dimensions);
 * others are refused and go to the reference. Tasks of GT_TASK_ELEMS
 * elements (a function of the size only). FP16 through the FP16 adapter
 * (blas-impl.h). The checks are the reference's
 * (ops/shared/elementwise_check.h). */
#include "blas-impl.h"
#include "blas-simd.h"
#include "shared/elem_math.h"
#include "shared/elementwise_check.h"

#define GT_TASK_ELEMS ((int64_t)1 << 14)
#define GT_CLAMP 20.0f

typedef struct gt_job {
  const float *x, *dy; /* dy: bwd only */
  float *out;          /* fwd: y; bwd: dx */
  int64_t n;
  int accumulate;
} gt_job;

/* t = tanh(K (x + A x^3)) of the clamped x */
BLAS_SIMD_INLINE float gt_tanh_of(float xc) {
  const float u = (float)BP_GELU_TANH_K * (xc + (float)BP_GELU_TANH_A * xc * xc * xc);
  return 1.0f - 2.0f / (1.0f + blas_expf(2.0f * u));
}

BLAS_SIMD_INLINE float gt_clamp(float x) {
  x = x < -GT_CLAMP ? -GT_CLAMP : x;
  return x > GT_CLAMP ? GT_CLAMP : x;
}

BLAS_SIMD_INLINE void gt_fwd_task_body(void *p, int64_t i) {
  const gt_job *j = p;
  const int64_t lo = i * GT_TASK_ELEMS, hi = j->n - lo < GT_TASK_ELEMS ? j->n : lo + GT_TASK_ELEMS;
  const float *restrict x = j->x;
  float *restrict y = j->out;
  for (int64_t k = lo; k < hi; k++) {
    const float t = gt_tanh_of(gt_clamp(x[k]));
    y[k] = 0.5f * x[k] * (1.0f + t);
  }
}
BLAS_SIMD(gt_fwd_task, (void *p, int64_t i), (p, i))

BLAS_SIMD_INLINE void gt_bwd_task_body(void *p, int64_t i) {
  const gt_job *j = p;
  const int64_t lo = i * GT_TASK_ELEMS, hi = j->n - lo < GT_TASK_ELEMS ? j->n : lo + GT_TASK_ELEMS;
  const float *restrict x = j->x, *restrict dy = j->dy;
  float *restrict dx = j->out;
  const float k = (float)BP_GELU_TANH_K, a3 = 3.0f * (float)BP_GELU_TANH_A;
  for (int64_t e = lo; e < hi; e++) {
    const float xc = gt_clamp(x[e]), t = gt_tanh_of(xc);
    const float slope = 0.5f * (1.0f + t) + 0.5f * xc * (1.0f - t * t) * k * (1.0f + a3 * xc * xc);
    const float g = dy[e] * slope;
    dx[e] = j->accumulate ? dx[e] + g : g;
  }
}
BLAS_SIMD(gt_bwd_task, (void *p, int64_t i), (p, i))

/* The reference's checks (nin inputs: 1 forward, 2 backward), then every
 * tensor one dense run. */
static int gt_check(int nin, const bp_abi_kernel_args *args, bp_elementwise_attrs *a,
                    char *reason, size_t rs) {
  static const char *const names[] = {"input 0", "input 1", "output 0"};
  if (!ops_ew_check(args, nin, 1, a, reason, rs)) return 0;
  blas_mat m;
  for (int i = 0; i <= nin; i++) {
    const bp_abi_tensor *t = i < nin ? bp_sdk_input(args, i) : bp_sdk_output(args, 0);
    if (!blas_view(t, 0, i < nin ? names[i] : names[2], "all elements", &m, reason, rs))
      return 0;
  }
  return 1;
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
static uint64_t gt_workspace(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  (void)args;
  return 0;
}

/* gelu_tanh.fwd (nin 1: x -> y) and gelu_tanh.bwd (nin 2: x, dy -> dx, (+)=) */
static int gt_run(int nin, const bp_abi_kernel_args *args) {
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  bp_elementwise_attrs a;
  if (!gt_check(nin, args, &a, reason, rs) || !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *x = bp_sdk_input(args, 0);
  gt_job j = {bp_sdk_input_f32(args, 0), nin == 2 ? bp_sdk_input_f32(args, 1) : NULL,
              bp_sdk_output_f32(args, 0), x->shape[0] * x->shape[1] * x->shape[2] * x->shape[3],
              nin == 2 ? a.accumulate : 0};
  bp_sdk_parallel_for(args, nin == 2 ? gt_bwd_task : gt_fwd_task, &j,
                      (j.n + GT_TASK_ELEMS - 1) / GT_TASK_ELEMS);
  return BP_ABI_OK;
}
static int gt_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  return gt_run(1, args);
}
static int gt_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  return gt_run(2, args);
}

static const ops_fp16_kernel gt_fwd16 =
    BLAS_FP16(gt_supports_fwd, gt_workspace, gt_run_fwd, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel gt_bwd16 = BLAS_FP16(gt_supports_bwd, gt_workspace, gt_run_bwd,
                                                  offsetof(bp_elementwise_attrs, accumulate));
const bp_abi_kernel blas_gelu_tanh_fwd = BLAS_KERNEL("gelu_tanh.fwd", gt_fwd16);
const bp_abi_kernel blas_gelu_tanh_bwd = BLAS_KERNEL("gelu_tanh.bwd", gt_bwd16);
