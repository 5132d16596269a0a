/* batchnorm.fwd_train, batchnorm.fwd_eval and batchnorm.bwd, vectorized
 * across channels; bit-identical to bn_run_train, bn_run_eval and
 * bn_run_bwd of ops/reference/batchnorm.c (formulas and shapes there).
 *
 * The reference already walks the pixels in (n, h, w) order with the
 * channels of a block of up to 64 innermost, summing in double per
 * channel; here that channel loop runs over contiguous memory, so each
 * SIMD lane is one channel and every per-channel sum still takes its
 * pixels in the reference's order. Every per-element formula is the
 * reference's, with the same double and float operations in the same
 * order (no contraction: -ffp-contract=off); the per-channel scalars
 * (sqrt, running statistics, dgamma and dbeta) are the reference's own
 * functions (ops_bn_*, ops/shared/batchnorm_steps.h), and so are the checks.
 *
 * Layouts: any strides the reference takes, provided the x-shaped tensors
 * (x, y, dy, dx) have contiguous channels (stride[3] 1, padded channels
 * allowed; or C 1); others are refused with a reason and the reference
 * serves them. The [1,1,1,C] tensors may have any channel stride. No
 * x-shaped output overlaps an input (bp_sdk_check_ptrs), hence restrict; the
 * running statistics (which may be updated in place) are only touched by
 * the scalar code. Threads: see "tasks" below; no bit depends on them. */
#include "cpu-impl.h"
#include "shared/batchnorm_steps.h"

#define BN_BLOCK OPS_BN_BLOCK /* channels per pass over the pixels, as in the reference */

/* The pixels of the x-shaped tensors: extents and the strides of up to
 * three of them (a: x, b: y or dy, c: dx). */
typedef struct bn_pixels {
  int64_t n, h, w;
  const bp_abi_tensor *a, *b, *c;
  int64_t p0, p1; /* the pixels the elementwise loops take: index (n * H + h) * W + w */
} bn_pixels;

/* Walks the pixels [p0, p1) of p as (n, h, w), starting from p0's. */
#define BN_FOR_PIXELS(p, n, h, w)                                                        \
  for (int64_t pix = (p)->p0, n = pix / ((p)->h * (p)->w), h = pix / (p)->w % (p)->h,     \
               w = pix % (p)->w;                                                          \
       pix < (p)->p1;                                                                     \
       pix++, w = w + 1 < (p)->w ? w + 1 : 0, h = w ? h : h + 1 < (p)->h ? h + 1 : 0,     \
               n = w || h ? n : n + 1)

/* The reference's checks (the same reasons), then contiguous channels in
 * the x-shaped tensors. */
static int bn_check(const bp_abi_kernel_args *args, ops_bn_pass pass, bp_batchnorm_attrs *a,
                    char *reason, size_t rs) {
  if (!ops_bn_check(args, pass, a, reason, rs) ||
      !cpu_channels_contiguous(bp_sdk_input(args, 0), "x", reason, rs))
    return 0;
  if (pass == OPS_BN_BWD && !cpu_channels_contiguous(bp_sdk_input(args, 1), "dy", reason, rs))
    return 0;
  return cpu_channels_contiguous(bp_sdk_output(args, 0), pass == OPS_BN_BWD ? "dx" : "y", reason,
                                 rs);
}

/* ---- loops ---------------------------------------------------------------- */

/* Pass 0 of the statistics: sum[j] += x over the pixels. */
CPU_INLINE void bn_sum_loop_body(const bn_pixels *p, const float *restrict x, int64_t nb,
                                 double *restrict sum) {
  for (int64_t n = 0; n < p->n; n++)
    for (int64_t h = 0; h < p->h; h++)
      for (int64_t w = 0; w < p->w; w++) {
        const float *xr = x + bp_sdk_offset(p->a, n, h, w, 0);
        for (int64_t j = 0; j < nb; j++) sum[j] += (double)xr[j];
      }
}
CPU_DISPATCH(bn_sum_loop,
             (const bn_pixels *p, const float *restrict x, int64_t nb, double *restrict sum),
             (p, x, nb, sum))

/* Pass 1: var[j] += (x - mean)^2, as the reference writes it. */
CPU_INLINE void bn_sqdev_loop_body(const bn_pixels *p, const float *restrict x, int64_t nb,
                                   const double *restrict mean, double *restrict var) {
  for (int64_t n = 0; n < p->n; n++)
    for (int64_t h = 0; h < p->h; h++)
      for (int64_t w = 0; w < p->w; w++) {
        const float *xr = x + bp_sdk_offset(p->a, n, h, w, 0);
        for (int64_t j = 0; j < nb; j++) {
          const double v = xr[j];
          var[j] += (v - mean[j]) * (v - mean[j]);
        }
      }
}
CPU_DISPATCH(bn_sqdev_loop,
             (const bn_pixels *p, const float *restrict x, int64_t nb,
              const double *restrict mean, double *restrict var),
             (p, x, nb, mean, var))

/* y = x * scale + shift in double, rounded once (the reference's bn_apply). */
CPU_INLINE void bn_apply_loop_body(const bn_pixels *p, const float *restrict x,
                                   float *restrict y, int64_t nb, const double *restrict scale,
                                   const double *restrict shift) {
  BN_FOR_PIXELS(p, n, h, w) {
    const float *xr = x + bp_sdk_offset(p->a, n, h, w, 0);
    float *yr = y + bp_sdk_offset(p->b, n, h, w, 0);
    for (int64_t j = 0; j < nb; j++) yr[j] = bp_bn_apply(xr[j], scale[j], shift[j]);
  }
}
CPU_DISPATCH(bn_apply_loop,
             (const bn_pixels *p, const float *restrict x, float *restrict y, int64_t nb,
              const double *restrict scale, const double *restrict shift),
             (p, x, y, nb, scale, shift))

/* The backward's sums: sdy += dy, sdyx += dy * (x - mean) * invstd. */
CPU_INLINE void bn_bwd_sums_loop_body(const bn_pixels *p, const float *restrict x,
                                      const float *restrict dy, int64_t nb,
                                      const double *restrict mean, const double *restrict invstd,
                                      double *restrict sdy, double *restrict sdyx) {
  for (int64_t n = 0; n < p->n; n++)
    for (int64_t h = 0; h < p->h; h++)
      for (int64_t w = 0; w < p->w; w++) {
        const float *xr = x + bp_sdk_offset(p->a, n, h, w, 0);
        const float *dyr = dy + bp_sdk_offset(p->b, n, h, w, 0);
        for (int64_t j = 0; j < nb; j++) {
          const double g = dyr[j];
          sdy[j] += g;
          sdyx[j] += bp_bn_dy_xhat(g, xr[j], mean[j], invstd[j]);
        }
      }
}
CPU_DISPATCH(bn_bwd_sums_loop,
             (const bn_pixels *p, const float *restrict x, const float *restrict dy, int64_t nb,
              const double *restrict mean, const double *restrict invstd, double *restrict sdy,
              double *restrict sdyx),
             (p, x, dy, nb, mean, invstd, sdy, sdyx))

/* dx (+)= (float)(k * (dy - sdy/M - xhat * sdyx/M)); one loop per mode. */
CPU_INLINE void bn_bwd_dx_mode(const bn_pixels *p, const float *restrict x,
                               const float *restrict dy, float *restrict dx, int64_t nb,
                               const double *restrict mean, const double *restrict invstd,
                               const double *restrict k, const double *restrict sdy,
                               const double *restrict sdyx, int accumulate) {
  BN_FOR_PIXELS(p, n, h, w) {
    const float *xr = x + bp_sdk_offset(p->a, n, h, w, 0);
    const float *dyr = dy + bp_sdk_offset(p->b, n, h, w, 0);
    float *dxr = dx + bp_sdk_offset(p->c, n, h, w, 0);
    for (int64_t j = 0; j < nb; j++) {
      const double xhat = bp_bn_xhat(xr[j], mean[j], invstd[j]);
      const float g = bp_bn_dx(k[j], dyr[j], xhat, sdy[j], sdyx[j]);
      dxr[j] = accumulate ? dxr[j] + g : g;
    }
  }
}
CPU_INLINE void bn_bwd_dx_loop_body(const bn_pixels *p, const float *restrict x,
                                    const float *restrict dy, float *restrict dx, int64_t nb,
                                    const double *restrict mean, const double *restrict invstd,
                                    const double *restrict k, const double *restrict sdy,
                                    const double *restrict sdyx, int accumulate) {
  if (accumulate) bn_bwd_dx_mode(p, x, dy, dx, nb, mean, invstd, k, sdy, sdyx, 1);
  else bn_bwd_dx_mode(p, x, dy, dx, nb, mean, invstd, k, sdy, sdyx, 0);
}
CPU_DISPATCH(bn_bwd_dx_loop,
             (const bn_pixels *p, const float *restrict x, const float *restrict dy,
              float *restrict dx, int64_t nb, const double *restrict mean,
              const double *restrict invstd, const double *restrict k,
              const double *restrict sdy, const double *restrict sdyx, int accumulate),
             (p, x, dy, dx, nb, mean, invstd, k, sdy, sdyx, accumulate))

/* ---- tasks -------------------------------------------------------------------- */

/* A call runs in two rounds of tasks. First the per-channel sums, one task
 * per block of BN_BLOCK channels, each doing its channels' passes over
 * every pixel in the reference's order and the reference's per-channel
 * step (so a call of up to 64 channels sums on the calling thread: a
 * channel's sum is one sequential chain, and splitting its pixels would
 * change its bits; narrower channel groups on several threads were tried
 * and measured slower, strided and with few tasks to share). Then the
 * outputs y or dx, elementwise from the per-channel factors, in tasks of
 * whole pixels (cpu_items_per_task), which no two tasks share. Neither cut
 * depends on the thread count. The factors of every channel live on the
 * calling thread's stack, up to BN_SPLIT_C channels; wider calls do both
 * rounds in the channel-block tasks. */
#define BN_SPLIT_C 512

typedef struct bn_job {
  const bp_abi_kernel_args *args;
  const bp_batchnorm_attrs *a;
  bn_pixels px;      /* p0, p1: every pixel */
  int64_t c;         /* channels */
  int64_t pixels, per; /* pixels, pixels per output task */
  int whole;         /* 1: the group tasks write the outputs too (C > BN_SPLIT_C) */
  /* [C] per-channel factors (split calls): train, eval: scale, shift;
   * bwd: mean, invstd, k, sdy, sdyx */
  double *f[5];
} bn_job;

static void bn_job_init(bn_job *j, const bp_abi_kernel_args *args, const bp_batchnorm_attrs *a,
                        const bp_abi_tensor *b, const bp_abi_tensor *c) {
  const bp_abi_tensor *x = bp_sdk_input(args, 0);
  j->args = args;
  j->a = a;
  j->pixels = x->shape[0] * x->shape[1] * x->shape[2];
  j->px = (bn_pixels){x->shape[0], x->shape[1], x->shape[2], x, b, c, 0, j->pixels};
  j->c = x->shape[3];
  j->per = cpu_items_per_task(j->c);
  j->whole = j->c > BN_SPLIT_C;
}

/* Channels [c0, c0 + nb) of channel-block task i. */
static int64_t bn_task_channels(const bn_job *j, int64_t i, int64_t *nb) {
  int64_t end;
  const int64_t c0 = cpu_task_items(i, BN_BLOCK, j->c, &end);
  *nb = end - c0;
  return c0;
}

static void bn_group_tasks(bn_job *j, void (*task)(void *, int64_t)) {
  bp_sdk_parallel_for(j->args, task, j, cpu_task_count(j->c, BN_BLOCK));
}
static void bn_pixel_tasks(bn_job *j, void (*task)(void *, int64_t)) {
  bp_sdk_parallel_for(j->args, task, j, cpu_task_count(j->pixels, j->per));
}

/* The pixels of output task i, every channel in blocks of BN_BLOCK. */
static bn_pixels bn_task_pixels(const bn_job *j, int64_t i) {
  bn_pixels p = j->px;
  p.p0 = cpu_task_items(i, j->per, j->pixels, &p.p1);
  return p;
}

/* y from scale and shift: the channels [c0, c0 + nb) over the pixels of p. */
static void bn_apply(const bn_job *j, const bn_pixels *p, int64_t c0, int64_t nb,
                     const double *scale, const double *shift) {
  bn_apply_loop(p, bp_sdk_input_f32(j->args, 0) + c0, bp_sdk_output_f32(j->args, 0) + c0, nb,
                scale, shift);
}

static void bn_apply_task(void *p, int64_t i) {
  const bn_job *j = p;
  const bn_pixels px = bn_task_pixels(j, i);
  for (int64_t c0 = 0; c0 < j->c; c0 += BN_BLOCK) {
    const int64_t nb = j->c - c0 < BN_BLOCK ? j->c - c0 : BN_BLOCK;
    bn_apply(j, &px, c0, nb, j->f[0] + c0, j->f[1] + c0);
  }
}

static void bn_train_task(void *p, int64_t i) {
  const bn_job *j = p;
  int64_t nb;
  const int64_t c0 = bn_task_channels(j, i, &nb);
  const float *x = bp_sdk_input_f32(j->args, 0);
  const double M = (double)j->pixels;
  double mean[BN_BLOCK] = {0}, var[BN_BLOCK] = {0}, sc[BN_BLOCK], sh[BN_BLOCK];
  double *scale = j->whole ? sc : j->f[0] + c0, *shift = j->whole ? sh : j->f[1] + c0;
  bn_sum_loop(&j->px, x + c0, nb, mean);
  for (int64_t k = 0; k < nb; k++) mean[k] /= M;
  bn_sqdev_loop(&j->px, x + c0, nb, mean, var);
  for (int64_t k = 0; k < nb; k++) var[k] /= M;
  ops_bn_train_channels(j->args, j->a, c0, nb, mean, var, scale, shift); /* the reference's own */
  if (j->whole) bn_apply(j, &j->px, c0, nb, scale, shift);
}

static void bn_eval_task(void *p, int64_t i) {
  const bn_job *j = p;
  int64_t nb;
  const int64_t c0 = bn_task_channels(j, i, &nb);
  double scale[BN_BLOCK], shift[BN_BLOCK];
  ops_bn_eval_channels(j->args, j->a, c0, nb, scale, shift);
  bn_apply(j, &j->px, c0, nb, scale, shift);
}

/* dx for the channels [c0, c0 + nb) over the pixels of p; f: mean, invstd,
 * k, sdy, sdyx of those channels. */
static void bn_dx(const bn_job *j, const bn_pixels *p, int64_t c0, int64_t nb,
                  double *const f[5]) {
  const bp_abi_kernel_args *args = j->args;
  bn_bwd_dx_loop(p, bp_sdk_input_f32(args, 0) + c0, bp_sdk_input_f32(args, 1) + c0,
                 bp_sdk_output_f32(args, 0) + c0, nb, f[0], f[1], f[2], f[3], f[4],
                 j->a->accumulate);
}

static void bn_bwd_task(void *p, int64_t i) {
  const bn_job *j = p;
  const bp_abi_kernel_args *args = j->args;
  int64_t nb;
  const int64_t c0 = bn_task_channels(j, i, &nb);
  double mean[BN_BLOCK], invstd[BN_BLOCK], sdy[BN_BLOCK], sdyx[BN_BLOCK], k[BN_BLOCK];
  double *f[5] = {mean, invstd, k, sdy, sdyx};
  if (!j->whole)
    for (int q = 0; q < 5; q++) f[q] = j->f[q] + c0;
  for (int64_t q = 0; q < nb; q++) f[3][q] = 0.0, f[4][q] = 0.0;
  ops_bn_saved_stats(args, c0, nb, f[0], f[1]);
  bn_bwd_sums_loop(&j->px, bp_sdk_input_f32(args, 0) + c0, bp_sdk_input_f32(args, 1) + c0, nb,
                   f[0], f[1], f[3], f[4]);
  ops_bn_bwd_channels(args, j->a, c0, nb, f[1], f[3], f[4], f[2]); /* the reference's own */
  if (j->whole) bn_dx(j, &j->px, c0, nb, f);
}

static void bn_dx_task(void *p, int64_t i) {
  const bn_job *j = p;
  const bn_pixels px = bn_task_pixels(j, i);
  for (int64_t c0 = 0; c0 < j->c; c0 += BN_BLOCK) {
    const int64_t nb = j->c - c0 < BN_BLOCK ? j->c - c0 : BN_BLOCK;
    double *f[5];
    for (int q = 0; q < 5; q++) f[q] = j->f[q] + c0;
    bn_dx(j, &px, c0, nb, f);
  }
}

/* ---- kernels ---------------------------------------------------------------- */

static int bn_supports_train(void *user, const bp_abi_kernel_args *args, char *reason,
                             size_t rs) {
  (void)user;
  bp_batchnorm_attrs a;
  return bn_check(args, OPS_BN_TRAIN, &a, reason, rs);
}
static int bn_supports_eval(void *user, const bp_abi_kernel_args *args, char *reason,
                            size_t rs) {
  (void)user;
  bp_batchnorm_attrs a;
  return bn_check(args, OPS_BN_EVAL, &a, reason, rs);
}
static int bn_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_batchnorm_attrs a;
  return bn_check(args, OPS_BN_BWD, &a, reason, rs);
}

/* batchnorm.fwd_train  in: x, gamma, beta, running_mean, running_var
 *                      out: y, save_mean, save_invstd, running_mean, running_var
 * (outputs 3 and 4 may be inputs 3 and 4 themselves). */
static int bn_run_train(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_batchnorm_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  static const int alias_out[] = {3, 4}, alias_in[] = {3, 4};
  if (!bn_check(args, OPS_BN_TRAIN, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, alias_out, alias_in, 2, reason, rs))
    return BP_ABI_ERR_INVALID;
  bn_job j;
  bn_job_init(&j, args, &a, bp_sdk_output(args, 0), NULL);
  double scale[BN_SPLIT_C], shift[BN_SPLIT_C];
  j.f[0] = scale, j.f[1] = shift;
  bn_group_tasks(&j, bn_train_task);
  if (!j.whole) bn_pixel_tasks(&j, bn_apply_task);
  return BP_ABI_OK;
}

/* batchnorm.fwd_eval  in: x, gamma, beta, running_mean, running_var   out: y. */
static int bn_run_eval(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_batchnorm_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!bn_check(args, OPS_BN_EVAL, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  bn_job j;
  bn_job_init(&j, args, &a, bp_sdk_output(args, 0), NULL);
  if (j.whole) {
    bn_group_tasks(&j, bn_eval_task);
    return BP_ABI_OK;
  }
  double scale[BN_SPLIT_C], shift[BN_SPLIT_C];
  j.f[0] = scale, j.f[1] = shift;
  ops_bn_eval_channels(args, &a, 0, j.c, scale, shift);
  bn_pixel_tasks(&j, bn_apply_task);
  return BP_ABI_OK;
}

/* batchnorm.bwd  in: x, dy, gamma, save_mean, save_invstd
 *                out: dx, dgamma, dbeta (accumulate 0: overwritten, 1: added). */
static int bn_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_batchnorm_attrs a;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!bn_check(args, OPS_BN_BWD, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  bn_job j;
  bn_job_init(&j, args, &a, bp_sdk_input(args, 1), bp_sdk_output(args, 0));
  double f[5][BN_SPLIT_C];
  for (int q = 0; q < 5; q++) j.f[q] = f[q];
  bn_group_tasks(&j, bn_bwd_task);
  if (!j.whole) bn_pixel_tasks(&j, bn_dx_task);
  return BP_ABI_OK;
}

/* FP16 through the adapter; fwd_train may update the running statistics
 * in place (outputs 3, 4 the very same elements as inputs 3, 4) */
static const ops_fp16_kernel bn_train16 =
    CPU_FP16_ALIAS(bn_supports_train, bn_run_train, OPS_FP16_NO_ACCUMULATE, 2, 3, 3, 4, 4);
static const ops_fp16_kernel bn_eval16 =
    CPU_FP16(bn_supports_eval, bn_run_eval, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel bn_bwd16 =
    CPU_FP16(bn_supports_bwd, bn_run_bwd, offsetof(bp_batchnorm_attrs, accumulate));
const bp_abi_kernel cpu_batchnorm_fwd_train =
    CPU_KERNEL16("batchnorm.fwd_train", bn_train16, 0, CPU_FP16_DTYPES);
const bp_abi_kernel cpu_batchnorm_fwd_eval =
    CPU_KERNEL16("batchnorm.fwd_eval", bn_eval16, 0, CPU_FP16_DTYPES);
const bp_abi_kernel cpu_batchnorm_bwd = CPU_KERNEL16("batchnorm.bwd", bn_bwd16, 0, CPU_FP16_DTYPES);
