/* batchnorm.fwd_train, batchnorm.fwd_eval and batchnorm.bwd, vectorized
 * across channels; bit-identical to bn_run_train, bn_run_eval and
 * bn_run_bwd of ops/reference/batchnorm.c (formulas and shapes there).
 *
 * The statistics are summed in the chunked order of
 * ops/shared/batchnorm_steps.h, which the reference takes too: every
 * chunk of pixels sums its pixels in order, in double, and the chunk sums
 * are added in chunk order; here a chunk is a task, its sums vectorized
 * with one SIMD lane per channel (the channels of a pixel are
 * contiguous). Every per-element formula is the reference's, with the same
 * double and float operations in the same order (no contraction:
 * -ffp-contract=off); the per-channel scalars (moments, sqrt, running
 * statistics, dgamma and dbeta) are the reference's own functions (ops_bn_*,
 * ops/shared/batchnorm_steps.h), and so are the checks.
 *
 * Passes over the x-shaped tensors: fwd_train reads x once for the
 * statistics (shifted sums of x and x*x), then reads x and writes y; bwd
 * reads x and dy once for its two sums, then reads them again and writes
 * dx. No pass keeps a tensor-sized intermediate.
 *
 * Layouts: any strides the reference takes, provided the x-shaped tensors
 * (x, y, dy, dx) have contiguous channels (stride[3] 1, padded channels
 * allowed; or C 1); others are refused with a reason and the reference
 * serves them. The [1,1,1,C] tensors may have any channel stride. No
 * x-shaped output overlaps an input (bp_sdk_check_ptrs), hence restrict; the
 * running statistics (which may be updated in place) are only touched by
 * the scalar code. Threads: see "tasks" below; no bit depends on them.
 *
 * batchnorm_relu.fwd_train, .fwd_eval and .bwd (y = relu(BN(x))) run the
 * same rounds with a relu flag, bit-identical to ops/reference's: the
 * forwards write bp_relu_fwd of each value; the backward reads the relu
 * output y (input 5) and uses bp_relu_bwd(y, dy), the float an unfused
 * relu.bwd would store, wherever batchnorm.bwd reads dy. So the fused ops
 * give batchnorm-then-relu's bits with one pass less each way. FP32 only. */
#include "cpu-impl.h"
#include "shared/batchnorm_steps.h"

#define BN_BLOCK OPS_BN_BLOCK /* channels per statistics round (the chunk sums live on the stack) */

/* The pixels of the x-shaped tensors (a: x, b: y or dy, c: dx, d: the relu
 * output y of the fused backward), walked in
 * runs of pixels that are equally spaced in every tensor: one image row
 * each, or the whole range when every tensor's pixels are evenly strided
 * (dense N, H, W; channel padding allowed). */
typedef struct bn_pixels {
  int64_t h, w;
  const bp_abi_tensor *t[4];
  int nt;   /* tensors in t */
  int flat; /* pixel p of every tensor at p * stride[2] */
} bn_pixels;

static bn_pixels bn_pixels_of(const bp_abi_tensor *a, const bp_abi_tensor *b,
                              const bp_abi_tensor *c, const bp_abi_tensor *d) {
  bn_pixels p = {a->shape[1], a->shape[2], {a, b, c, d}, d ? 4 : c ? 3 : b ? 2 : 1, 1};
  for (int i = 0; i < p.nt; i++) {
    const int64_t *st = p.t[i]->stride;
    if ((p.h > 1 && st[1] != p.w * st[2]) || (a->shape[0] > 1 && st[0] != p.h * p.w * st[2]))
      p.flat = 0;
  }
  return p;
}

/* Splits pixels [p0, p1) into runs and runs the statement that follows
 * once per run: `cnt` pixels from pixel (n, h, w), pixel k of the run at
 * that pixel's offset + k * stride[2] in every tensor. */
#define BN_FOR_RUNS(px, p0, p1, n, h, w, cnt)                                                 \
  for (int64_t p_ = (p0), n = 0, h = 0, w = 0, cnt = 0; p_ < (p1); p_ += cnt)               \
    if (n = p_ / ((px)->h * (px)->w), h = p_ / (px)->w % (px)->h, w = p_ % (px)->w,          \
        cnt = (px)->flat || (p1) - p_ < (px)->w - w ? (p1) - p_ : (px)->w - w, 1)

/* The reference's checks (the same reasons), then contiguous channels in
 * the x-shaped tensors. */
static int bn_check(const bp_abi_kernel_args *args, ops_bn_pass pass, int relu,
                    bp_batchnorm_attrs *a, char *reason, size_t rs) {
  if (!ops_bn_check_relu(args, pass, relu, a, reason, rs) ||
      !cpu_channels_contiguous(bp_sdk_input(args, 0), "x", reason, rs))
    return 0;
  if (pass == OPS_BN_BWD && !cpu_channels_contiguous(bp_sdk_input(args, 1), "dy", reason, rs))
    return 0;
  if (pass == OPS_BN_BWD && relu &&
      !cpu_channels_contiguous(bp_sdk_input(args, 5), "y", reason, rs))
    return 0;
  return cpu_channels_contiguous(bp_sdk_output(args, 0), pass == OPS_BN_BWD ? "dx" : "y", reason,
                                 rs);
}

/* ---- loops: one run of cnt pixels, xs (ys, ...) floats apart ------------------ */

/* The shifted sums: sd += x - K, sdd += (x - K)^2. */
CPU_INLINE void bn_stats_loop_body(const float *restrict x, int64_t xs, int64_t cnt, int64_t nb,
                                   const double *restrict K, double *restrict sd,
                                   double *restrict sdd) {
  for (int64_t i = 0; i < cnt; i++, x += xs)
    for (int64_t j = 0; j < nb; j++) {
      const double d = (double)x[j] - K[j];
      sd[j] += d;
      sdd[j] += d * d;
    }
}
CPU_DISPATCH(bn_stats_loop,
             (const float *restrict x, int64_t xs, int64_t cnt, int64_t nb,
              const double *restrict K, double *restrict sd, double *restrict sdd),
             (x, xs, cnt, nb, K, sd, sdd))

/* y = x * scale + shift in double, rounded once (the reference's bn_apply);
 * then relu'd, with relu. One loop per mode. */
CPU_INLINE void bn_apply_mode(const float *restrict x, int64_t xs, float *restrict y, int64_t ys,
                              int64_t cnt, int64_t nb, const double *restrict scale,
                              const double *restrict shift, int relu) {
  for (int64_t i = 0; i < cnt; i++, x += xs, y += ys)
    for (int64_t j = 0; j < nb; j++) {
      const float v = bp_bn_apply(x[j], scale[j], shift[j]);
      y[j] = relu ? bp_relu_fwd(v) : v;
    }
}
CPU_INLINE void bn_apply_loop_body(const float *restrict x, int64_t xs, float *restrict y,
                                   int64_t ys, int64_t cnt, int64_t nb,
                                   const double *restrict scale, const double *restrict shift,
                                   int relu) {
  if (relu) bn_apply_mode(x, xs, y, ys, cnt, nb, scale, shift, 1);
  else bn_apply_mode(x, xs, y, ys, cnt, nb, scale, shift, 0);
}
CPU_DISPATCH(bn_apply_loop,
             (const float *restrict x, int64_t xs, float *restrict y, int64_t ys, int64_t cnt,
              int64_t nb, const double *restrict scale, const double *restrict shift, int relu),
             (x, xs, y, ys, cnt, nb, scale, shift, relu))

/* The gradient the normalization sees: dy, or with relu bp_relu_bwd(y, dy)
 * (y > 0 ? dy : +0), here as dy's bits masked by the compare: the same
 * float, and no branch, which GCC would not if-convert inside these loops
 * (measured: scalar code, ten times slower). */
CPU_INLINE float bn_grad(const float *restrict y, int64_t j, float dy, int relu) {
  if (!relu) return dy;
  const uint32_t keep = 0u - (uint32_t)(y[j] > 0.0f);
  return bp_fp32_of_bits(bp_bits_of_fp32(dy) & keep);
}

/* The backward's sums: sdy += g, sdyx += g * (x - mean) * invstd (g:
 * bn_grad; y, ys only with relu). One loop per mode. */
CPU_INLINE void bn_bwd_sums_mode(const float *restrict x, int64_t xs, const float *restrict dy,
                                 int64_t dys, const float *restrict y, int64_t ys, int64_t cnt,
                                 int64_t nb, const double *restrict mean,
                                 const double *restrict invstd, double *restrict sdy,
                                 double *restrict sdyx, int relu) {
  for (int64_t i = 0; i < cnt; i++, x += xs, dy += dys) {
    const float *restrict yi = relu ? y + i * ys : y; /* y is NULL without relu */
    for (int64_t j = 0; j < nb; j++) {
      const double g = bn_grad(yi, j, dy[j], relu);
      sdy[j] += g;
      sdyx[j] += bp_bn_dy_xhat(g, x[j], mean[j], invstd[j]);
    }
  }
}
CPU_INLINE void bn_bwd_sums_loop_body(const float *restrict x, int64_t xs,
                                      const float *restrict dy, int64_t dys,
                                      const float *restrict y, int64_t ys, int64_t cnt,
                                      int64_t nb, const double *restrict mean,
                                      const double *restrict invstd, double *restrict sdy,
                                      double *restrict sdyx) {
  if (y) bn_bwd_sums_mode(x, xs, dy, dys, y, ys, cnt, nb, mean, invstd, sdy, sdyx, 1);
  else bn_bwd_sums_mode(x, xs, dy, dys, y, ys, cnt, nb, mean, invstd, sdy, sdyx, 0);
}
CPU_DISPATCH(bn_bwd_sums_loop,
             (const float *restrict x, int64_t xs, const float *restrict dy, int64_t dys,
              const float *restrict y, int64_t ys, int64_t cnt, int64_t nb,
              const double *restrict mean, const double *restrict invstd, double *restrict sdy,
              double *restrict sdyx),
             (x, xs, dy, dys, y, ys, cnt, nb, mean, invstd, sdy, sdyx))

/* dx (+)= (float)(k * (g - sdy/M - xhat * sdyx/M)), g: bn_grad (y, ys only
 * with relu); one loop per mode. f: mean, invstd, k, sdy/M, sdyx/M. */
CPU_INLINE void bn_bwd_dx_mode(const float *restrict x, int64_t xs, const float *restrict dy,
                               int64_t dys, const float *restrict y, int64_t ys,
                               float *restrict dx, int64_t dxs, int64_t cnt, int64_t nb,
                               const double *restrict mean, const double *restrict invstd,
                               const double *restrict k, const double *restrict sdy,
                               const double *restrict sdyx, int accumulate, int relu) {
  for (int64_t i = 0; i < cnt; i++, x += xs, dy += dys, dx += dxs) {
    const float *restrict yi = relu ? y + i * ys : y; /* y is NULL without relu */
    for (int64_t j = 0; j < nb; j++) {
      const double xhat = bp_bn_xhat(x[j], mean[j], invstd[j]);
      const float g = bp_bn_dx(k[j], bn_grad(yi, j, dy[j], relu), xhat, sdy[j], sdyx[j]);
      dx[j] = accumulate ? dx[j] + g : g;
    }
  }
}
#define BN_DX_MODE(acc, relu)                                                                  \
  bn_bwd_dx_mode(x, xs, dy, dys, y, ys, dx, dxs, cnt, nb, f[0], f[1], f[2], f[3], f[4], acc, \
                 relu)
CPU_INLINE void bn_bwd_dx_loop_body(const float *restrict x, int64_t xs, const float *restrict dy,
                                    int64_t dys, const float *restrict y, int64_t ys,
                                    float *restrict dx, int64_t dxs, int64_t cnt, int64_t nb,
                                    const double *const *f, int accumulate) {
  if (accumulate) {
    if (y) BN_DX_MODE(1, 1);
    else BN_DX_MODE(1, 0);
  } else {
    if (y) BN_DX_MODE(0, 1);
    else BN_DX_MODE(0, 0);
  }
}
#undef BN_DX_MODE
CPU_DISPATCH(bn_bwd_dx_loop,
             (const float *restrict x, int64_t xs, const float *restrict dy, int64_t dys,
              const float *restrict y, int64_t ys, float *restrict dx, int64_t dxs, int64_t cnt,
              int64_t nb, const double *const *f, int accumulate),
             (x, xs, dy, dys, y, ys, dx, dxs, cnt, nb, f, accumulate))

/* ---- tasks -------------------------------------------------------------------- */

/* A call runs in rounds of tasks on the host's threads. For each block of
 * up to BN_BLOCK channels, a statistics round: the chunks of
 * batchnorm_steps.h (grouped so a task holds about CPU_TASK_ELEMS
 * elements; a small call is one task on the calling thread), each chunk
 * summing its pixels into its own row of sums (rows 512 bytes apart, so
 * no two tasks share a cache line); the calling thread then adds the rows
 * in chunk order and runs the reference's per-channel step. Then an
 * elementwise round writes y or dx from the per-channel factors, in tasks
 * of whole pixels (cpu_items_per_task) over every channel. The factors of
 * every channel live on the calling thread's stack, up to BN_SPLIT_C
 * channels; a wider call runs an elementwise round after each block's
 * statistics, over that block's channels. No cut depends on the thread
 * count. */
#define BN_SPLIT_C 512

typedef struct bn_job {
  const bp_abi_kernel_args *args;
  const bp_batchnorm_attrs *a;
  int relu;                /* batchnorm_relu.*: forward relu'd; bwd reads y (input 5) */
  bn_pixels px;
  int64_t m, c;            /* pixels, channels */
  int64_t len, chunks;     /* pixels per chunk, chunks */
  int64_t per_task;        /* statistics round: chunks per task */
  int64_t per;             /* elementwise round: pixels per task */
  int64_t c0, nb;          /* the channels of the current round */
  const double *f[5];      /* their per-channel factors (train, eval: scale, shift;
                            * bwd: mean, invstd, k, sdy/M, sdyx/M), from channel c0 */
  const double *shift_k;   /* train statistics: K of channels c0.. */
  _Alignas(64) double part[2][OPS_BN_MAX_CHUNKS][BN_BLOCK]; /* the chunk sums */
  cpu_isa_level isa; /* the context's (cpu_user) */
} bn_job;

static void bn_job_init(bn_job *j, const void *user, const bp_abi_kernel_args *args,
                        const bp_batchnorm_attrs *a, int relu, const bp_abi_tensor *b,
                        const bp_abi_tensor *c, const bp_abi_tensor *d) {
  const bp_abi_tensor *x = bp_sdk_input(args, 0);
  j->isa = cpu_user_isa(user);
  j->args = args;
  j->a = a;
  j->relu = relu;
  j->m = x->shape[0] * x->shape[1] * x->shape[2];
  j->c = x->shape[3];
  j->px = bn_pixels_of(x, b, c, d);
  j->len = ops_bn_chunk_len(j->m);
  j->chunks = ops_bn_chunk_count(j->m);
  j->per = cpu_items_per_task(j->c);
}

/* Channel c of pixel (n, h, w) of input `input` (bn_in) or output 0
 * (bn_out), whose layout is px.t[i]. */
static const float *bn_in(const bn_job *j, int input, int i, int64_t n, int64_t h, int64_t w,
                          int64_t c) {
  return bp_sdk_input_f32(j->args, input) + bp_sdk_offset(j->px.t[i], n, h, w, c);
}
static float *bn_out(const bn_job *j, int i, int64_t n, int64_t h, int64_t w, int64_t c) {
  return bp_sdk_output_f32(j->args, 0) + bp_sdk_offset(j->px.t[i], n, h, w, c);
}

/* Runs task(j, i) over the chunks of the current block, CPU_TASK_ELEMS
 * elements or more per task. */
static void bn_stats_round(bn_job *j, void (*task)(void *, int64_t)) {
  const int64_t chunk_elems = j->len * j->nb;
  j->per_task = chunk_elems >= CPU_TASK_ELEMS ? 1 : (CPU_TASK_ELEMS + chunk_elems - 1) / chunk_elems;
  bp_sdk_parallel_for(j->args, task, j, cpu_task_count(j->chunks, j->per_task));
}

/* The sums of the rows of q (chunk order) for the current block. */
static void bn_add_chunks(const bn_job *j, int q, double *sum) {
  for (int64_t k = 0; k < j->nb; k++) sum[k] = 0.0;
  for (int64_t i = 0; i < j->chunks; i++)
    for (int64_t k = 0; k < j->nb; k++) sum[k] += j->part[q][i][k];
}

/* Chunk ci's pixels [*p1 - len, *p1). */
static int64_t bn_chunk(const bn_job *j, int64_t ci, int64_t *p1) {
  const int64_t p0 = ci * j->len;
  *p1 = j->m - p0 < j->len ? j->m : p0 + j->len;
  return p0;
}

static void bn_train_stats_task(void *p, int64_t i) {
  bn_job *j = p;
  int64_t c1;
  const int64_t c0 = cpu_task_items(i, j->per_task, j->chunks, &c1);
  for (int64_t ci = c0; ci < c1; ci++) {
    double *sd = j->part[0][ci], *sdd = j->part[1][ci];
    for (int64_t k = 0; k < j->nb; k++) sd[k] = 0.0, sdd[k] = 0.0;
    int64_t p1;
    const int64_t p0 = bn_chunk(j, ci, &p1);
    BN_FOR_RUNS(&j->px, p0, p1, n, h, w, cnt)
    bn_stats_loop(j->isa, bn_in(j, 0, 0, n, h, w, j->c0), j->px.t[0]->stride[2], cnt, j->nb, j->shift_k,
                  sd, sdd);
  }
}

static void bn_bwd_sums_task(void *p, int64_t i) {
  bn_job *j = p;
  int64_t c1;
  const int64_t c0 = cpu_task_items(i, j->per_task, j->chunks, &c1);
  for (int64_t ci = c0; ci < c1; ci++) {
    double *sdy = j->part[0][ci], *sdyx = j->part[1][ci];
    for (int64_t k = 0; k < j->nb; k++) sdy[k] = 0.0, sdyx[k] = 0.0;
    int64_t p1;
    const int64_t p0 = bn_chunk(j, ci, &p1);
    BN_FOR_RUNS(&j->px, p0, p1, n, h, w, cnt)
    bn_bwd_sums_loop(j->isa, bn_in(j, 0, 0, n, h, w, j->c0), j->px.t[0]->stride[2],
                     bn_in(j, 1, 1, n, h, w, j->c0), j->px.t[1]->stride[2],
                     j->relu ? bn_in(j, 5, 3, n, h, w, j->c0) : NULL,
                     j->relu ? j->px.t[3]->stride[2] : 0, cnt, j->nb, j->f[0], j->f[1], sdy,
                     sdyx);
  }
}

/* The pixels of elementwise task i: the last ones first, which the
 * statistics round read last, so some may still be in cache. */
static int64_t bn_pixel_task(const bn_job *j, int64_t i, int64_t *p1) {
  return cpu_task_items(cpu_task_count(j->m, j->per) - 1 - i, j->per, j->m, p1);
}

/* The elementwise round: pixels of task i, channels [c0, c0 + nb). */
static void bn_apply_task(void *p, int64_t i) {
  const bn_job *j = p;
  int64_t p1;
  const int64_t p0 = bn_pixel_task(j, i, &p1);
  BN_FOR_RUNS(&j->px, p0, p1, n, h, w, cnt)
  bn_apply_loop(j->isa, bn_in(j, 0, 0, n, h, w, j->c0), j->px.t[0]->stride[2],
                bn_out(j, 1, n, h, w, j->c0), j->px.t[1]->stride[2], cnt, j->nb, j->f[0],
                j->f[1], j->relu);
}

static void bn_dx_task(void *p, int64_t i) {
  const bn_job *j = p;
  int64_t p1;
  const int64_t p0 = bn_pixel_task(j, i, &p1);
  BN_FOR_RUNS(&j->px, p0, p1, n, h, w, cnt)
  bn_bwd_dx_loop(j->isa, bn_in(j, 0, 0, n, h, w, j->c0), j->px.t[0]->stride[2],
                 bn_in(j, 1, 1, n, h, w, j->c0), j->px.t[1]->stride[2],
                 j->relu ? bn_in(j, 5, 3, n, h, w, j->c0) : NULL,
                 j->relu ? j->px.t[3]->stride[2] : 0, bn_out(j, 2, n, h, w, j->c0),
                 j->px.t[2]->stride[2], cnt, j->nb, j->f, j->a->accumulate);
}

static void bn_pixel_round(bn_job *j, void (*task)(void *, int64_t), int64_t c0, int64_t nb) {
  j->c0 = c0, j->nb = nb;
  bp_sdk_parallel_for(j->args, task, j, cpu_task_count(j->m, j->per));
}

/* ---- kernels ---------------------------------------------------------------- */

/* user: a cpu_user (cpu-impl.h) whose bn_relu is 1 for batchnorm_relu.* */
#define BN_RELU(user) ((user) != NULL && ((const cpu_user *)(user))->bn_relu)

static int bn_supports_train(void *user, const bp_abi_kernel_args *args, char *reason,
                             size_t rs) {
  bp_batchnorm_attrs a;
  return bn_check(args, OPS_BN_TRAIN, BN_RELU(user), &a, reason, rs);
}
static int bn_supports_eval(void *user, const bp_abi_kernel_args *args, char *reason,
                            size_t rs) {
  bp_batchnorm_attrs a;
  return bn_check(args, OPS_BN_EVAL, BN_RELU(user), &a, reason, rs);
}
static int bn_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  bp_batchnorm_attrs a;
  return bn_check(args, OPS_BN_BWD, BN_RELU(user), &a, reason, rs);
}

/* batchnorm.fwd_train  in: x, gamma, beta, running_mean, running_var
 *                      out: y, save_mean, save_invstd, running_mean, running_var
 * (outputs 3 and 4 may be inputs 3 and 4 themselves). */
static int bn_run_train(void *user, const bp_abi_kernel_args *args) {
  bp_batchnorm_attrs a;
  const int relu = BN_RELU(user);
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  static const int alias_out[] = {3, 4}, alias_in[] = {3, 4};
  if (!bn_check(args, OPS_BN_TRAIN, relu, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, alias_out, alias_in, 2, reason, rs))
    return BP_ABI_ERR_INVALID;
  bn_job j;
  bn_job_init(&j, user, args, &a, relu, bp_sdk_output(args, 0), NULL, NULL);
  const int whole = j.c > BN_SPLIT_C;
  const float *x0 = bn_in(&j, 0, 0, 0, 0, 0, 0);
  double scale[BN_SPLIT_C], shift[BN_SPLIT_C];
  for (int64_t c0 = 0; c0 < j.c; c0 += BN_BLOCK) {
    const int64_t nb = j.c - c0 < BN_BLOCK ? j.c - c0 : BN_BLOCK;
    double K[BN_BLOCK], sd[BN_BLOCK], sdd[BN_BLOCK], mean[BN_BLOCK], var[BN_BLOCK];
    for (int64_t k = 0; k < nb; k++) K[k] = x0[c0 + k];
    j.c0 = c0, j.nb = nb, j.shift_k = K;
    bn_stats_round(&j, bn_train_stats_task);
    bn_add_chunks(&j, 0, sd);
    bn_add_chunks(&j, 1, sdd);
    for (int64_t k = 0; k < nb; k++) ops_bn_moments(K[k], sd[k], sdd[k], j.m, &mean[k], &var[k]);
    const int64_t at = whole ? 0 : c0; /* the reference's own per-channel step: */
    ops_bn_train_channels(args, &a, c0, nb, mean, var, scale + at, shift + at);
    if (whole) {
      j.f[0] = scale, j.f[1] = shift;
      bn_pixel_round(&j, bn_apply_task, c0, nb);
    }
  }
  if (!whole) {
    j.f[0] = scale, j.f[1] = shift;
    bn_pixel_round(&j, bn_apply_task, 0, j.c);
  }
  return BP_ABI_OK;
}

/* batchnorm.fwd_eval  in: x, gamma, beta, running_mean, running_var   out: y. */
static int bn_run_eval(void *user, const bp_abi_kernel_args *args) {
  bp_batchnorm_attrs a;
  const int relu = BN_RELU(user);
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!bn_check(args, OPS_BN_EVAL, relu, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  bn_job j;
  bn_job_init(&j, user, args, &a, relu, bp_sdk_output(args, 0), NULL, NULL);
  double scale[BN_SPLIT_C], shift[BN_SPLIT_C];
  j.f[0] = scale, j.f[1] = shift;
  const int64_t step = j.c > BN_SPLIT_C ? BN_SPLIT_C : j.c;
  for (int64_t c0 = 0; c0 < j.c; c0 += step) {
    const int64_t nb = j.c - c0 < step ? j.c - c0 : step;
    ops_bn_eval_channels(args, &a, c0, nb, scale, shift);
    bn_pixel_round(&j, bn_apply_task, c0, nb);
  }
  return BP_ABI_OK;
}

/* batchnorm.bwd  in: x, dy, gamma, save_mean, save_invstd
 *                out: dx, dgamma, dbeta (accumulate 0: overwritten, 1: added). */
static int bn_run_bwd(void *user, const bp_abi_kernel_args *args) {
  bp_batchnorm_attrs a;
  const int relu = BN_RELU(user);
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!bn_check(args, OPS_BN_BWD, relu, &a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  bn_job j;
  bn_job_init(&j, user, args, &a, relu, bp_sdk_input(args, 1), bp_sdk_output(args, 0),
              relu ? bp_sdk_input(args, 5) : NULL);
  const int whole = j.c > BN_SPLIT_C;
  double f[5][BN_SPLIT_C]; /* mean, invstd, k, sdy/M, sdyx/M */
  for (int64_t c0 = 0; c0 < j.c; c0 += BN_BLOCK) {
    const int64_t nb = j.c - c0 < BN_BLOCK ? j.c - c0 : BN_BLOCK;
    const int64_t at = whole ? 0 : c0;
    double *mean = f[0] + at, *invstd = f[1] + at, *k = f[2] + at, *sdy = f[3] + at;
    double *sdyx = f[4] + at;
    ops_bn_saved_stats(args, c0, nb, mean, invstd);
    j.c0 = c0, j.nb = nb, j.f[0] = mean, j.f[1] = invstd;
    bn_stats_round(&j, bn_bwd_sums_task);
    bn_add_chunks(&j, 0, sdy);
    bn_add_chunks(&j, 1, sdyx);
    ops_bn_bwd_channels(args, &a, c0, nb, invstd, sdy, sdyx, k); /* the reference's own */
    if (whole) {
      for (int q = 0; q < 5; q++) j.f[q] = f[q];
      bn_pixel_round(&j, bn_dx_task, c0, nb);
    }
  }
  if (!whole) {
    for (int q = 0; q < 5; q++) j.f[q] = f[q];
    bn_pixel_round(&j, bn_dx_task, 0, j.c);
  }
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
/* the fused ops: FP32 only (the graph fuses only FP32 features) */
const bp_abi_kernel cpu_batchnorm_relu_fwd_train = {
    .struct_size = sizeof(bp_abi_kernel), .op = "batchnorm_relu.fwd_train", .impl = CPU_IMPL,
    .device = CPU_DEVICE, .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), .priority = CPU_PRIORITY,
    .flags = CPU_FLAGS, .supports = bn_supports_train, .run = bn_run_train,
    .user = (void *)&cpu_relu_tag};
const bp_abi_kernel cpu_batchnorm_relu_fwd_eval = {
    .struct_size = sizeof(bp_abi_kernel), .op = "batchnorm_relu.fwd_eval", .impl = CPU_IMPL,
    .device = CPU_DEVICE, .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), .priority = CPU_PRIORITY,
    .flags = CPU_FLAGS, .supports = bn_supports_eval, .run = bn_run_eval,
    .user = (void *)&cpu_relu_tag};
const bp_abi_kernel cpu_batchnorm_relu_bwd = {
    .struct_size = sizeof(bp_abi_kernel), .op = "batchnorm_relu.bwd", .impl = CPU_IMPL,
    .device = CPU_DEVICE, .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32), .priority = CPU_PRIORITY,
    .flags = CPU_FLAGS, .supports = bn_supports_bwd, .run = bn_run_bwd, .user = (void *)&cpu_relu_tag};
