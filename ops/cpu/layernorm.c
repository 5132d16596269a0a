/* layernorm.fwd and layernorm.bwd, vectorized across channels and threaded
 * over positions; bit-identical to ln_run_fwd and ln_run_bwd of
 * ops/reference/layernorm.c (formulas, shapes and the order of every sum:
 * ops/shared/layernorm_steps.h).
 *
 * Per position, the channel sums run in OPS_LN_LANES double lanes (lane j
 * takes channels j, j+8, ... in order; the lanes are added in lane order),
 * written as blocks of eight so the compiler keeps each lane in a vector
 * element: the reference's ops_ln_stats / ops_ln_bwd_means order exactly.
 * The per-channel loops (y, dx) run the same bp_ln_* formulas (double,
 * rounded once) and vectorize. dgain and dbias: the positions are cut into
 * the chunks of ops_ln_chunk_len, one task each; a task sums its own
 * positions per channel in double (from 0, in order) into its slice of
 * the workspace, and the calling thread adds the slices in chunk order, as
 * the reference does. So no bit depends on the thread count.
 *
 * Layouts: any strides the reference takes, provided every tensor's
 * channels are contiguous (cpu_channels_contiguous: stride[3] 1, padded
 * channels allowed); others are refused with a reason and the reference
 * serves them. No output overlaps an input (bp_sdk_check_ptrs). The
 * checks are the reference's (ops_ln_check). */
#include "cpu-impl.h"
#include "shared/layernorm_steps.h"

#define LANES OPS_LN_LANES

/* ---- per position ---------------------------------------------------------- */

/* Mean and invstd of one position (ops_ln_stats with stride 1). */
CPU_INLINE void ln_stats_body(const float *restrict x, int64_t C, float eps, double *mean,
                              double *invstd) {
  double lane[LANES] = {0}, dev[LANES] = {0};
  const int64_t C8 = C / LANES * LANES;
  for (int64_t c = 0; c < C8; c += LANES)
    for (int j = 0; j < LANES; j++) lane[j] += (double)x[c + j];
  for (int64_t c = C8; c < C; c++) lane[c - C8] += (double)x[c];
  const double m = ops_ln_lanes_total(lane) / (double)C;
  for (int64_t c = 0; c < C8; c += LANES)
    for (int j = 0; j < LANES; j++) {
      const double d = (double)x[c + j] - m;
      dev[j] += d * d;
    }
  for (int64_t c = C8; c < C; c++) {
    const double d = (double)x[c] - m;
    dev[c - C8] += d * d;
  }
  *mean = m;
  *invstd = bp_ln_invstd(ops_ln_lanes_total(dev) / (double)C, eps);
}

/* y of one position. */
CPU_INLINE void ln_apply_body(const float *restrict x, const float *restrict gain,
                              const float *restrict bias, float *restrict y, int64_t C,
                              double mean, double invstd) {
  for (int64_t c = 0; c < C; c++) y[c] = bp_ln_apply(bp_ln_xhat(x[c], mean, invstd), gain[c], bias[c]);
}

CPU_INLINE void ln_fwd_position_body(const float *restrict x, const float *restrict gain,
                                     const float *restrict bias, float *restrict y, int64_t C,
                                     float eps, float *restrict mean_out,
                                     float *restrict invstd_out) {
  double mean, invstd;
  ln_stats_body(x, C, eps, &mean, &invstd);
  ln_apply_body(x, gain, bias, y, C, mean, invstd);
  *mean_out = (float)mean;
  *invstd_out = (float)invstd;
}
CPU_DISPATCH(ln_fwd_position,
             (const float *restrict x, const float *restrict gain, const float *restrict bias,
              float *restrict y, int64_t C, float eps, float *restrict mean_out,
              float *restrict invstd_out),
             (x, gain, bias, y, C, eps, mean_out, invstd_out))

/* dx of one position (overwrite or add), and the position's terms added
 * into the chunk's dgain / dbias sums (sdyx, sdy). */
CPU_INLINE void ln_bwd_mode(const float *restrict x, const float *restrict dy,
                            const float *restrict gain, float *restrict dx, double *restrict sdyx,
                            double *restrict sdy, int64_t C, double mean, double invstd,
                            int accumulate) {
  double sg[LANES] = {0}, sgx[LANES] = {0};
  const int64_t C8 = C / LANES * LANES;
  for (int64_t c = 0; c < C8; c += LANES)
    for (int j = 0; j < LANES; j++) {
      const double g = bp_ln_g(dy[c + j], gain[c + j]);
      sg[j] += g;
      sgx[j] += g * bp_ln_xhat(x[c + j], mean, invstd);
    }
  for (int64_t c = C8; c < C; c++) {
    const double g = bp_ln_g(dy[c], gain[c]);
    sg[c - C8] += g;
    sgx[c - C8] += g * bp_ln_xhat(x[c], mean, invstd);
  }
  const double mg = ops_ln_lanes_total(sg) / (double)C, mgx = ops_ln_lanes_total(sgx) / (double)C;
  for (int64_t c = 0; c < C; c++) {
    const double xhat = bp_ln_xhat(x[c], mean, invstd);
    const float v = bp_ln_dx(invstd, bp_ln_g(dy[c], gain[c]), mg, xhat, mgx);
    dx[c] = accumulate ? dx[c] + v : v;
    const double d = dy[c];
    sdyx[c] += d * xhat;
    sdy[c] += d;
  }
}
CPU_INLINE void ln_bwd_position_body(const float *restrict x, const float *restrict dy,
                                     const float *restrict gain, float *restrict dx,
                                     double *restrict sdyx, double *restrict sdy, int64_t C,
                                     double mean, double invstd, int accumulate) {
  if (accumulate) ln_bwd_mode(x, dy, gain, dx, sdyx, sdy, C, mean, invstd, 1);
  else ln_bwd_mode(x, dy, gain, dx, sdyx, sdy, C, mean, invstd, 0);
}
CPU_DISPATCH(ln_bwd_position,
             (const float *restrict x, const float *restrict dy, const float *restrict gain,
              float *restrict dx, double *restrict sdyx, double *restrict sdy, int64_t C,
              double mean, double invstd, int accumulate),
             (x, dy, gain, dx, sdyx, sdy, C, mean, invstd, accumulate))

/* ---- tasks ------------------------------------------------------------------ */

typedef struct ln_job {
  const bp_abi_kernel_args *args;
  bp_layernorm_attrs a;
  int64_t M, C, len; /* positions, channels, positions per chunk */
  double *ws;        /* bwd: [chunks][2][C] (sdyx, sdy) */
  cpu_isa_level isa;
} ln_job;

/* Position p (in (n, h, w) order) of t, channel 0. */
static int64_t ln_at(const bp_abi_tensor *t, int64_t p) {
  const int64_t H = t->shape[1], W = t->shape[2];
  return bp_sdk_offset(t, p / (H * W), p / W % H, p % W, 0);
}

static void ln_fwd_task(void *p, int64_t i) {
  const ln_job *j = p;
  const bp_abi_kernel_args *args = j->args;
  const bp_abi_tensor *tx = bp_sdk_input(args, 0), *ty = bp_sdk_output(args, 0);
  const bp_abi_tensor *tm = bp_sdk_output(args, 1), *ts = bp_sdk_output(args, 2);
  const float *x = bp_sdk_input_f32(args, 0), *gain = bp_sdk_input_f32(args, 1);
  const float *bias = bp_sdk_input_f32(args, 2);
  float *y = bp_sdk_output_f32(args, 0), *sm = bp_sdk_output_f32(args, 1);
  float *si = bp_sdk_output_f32(args, 2);
  int64_t end;
  for (int64_t q = cpu_task_items(i, j->len, j->M, &end); q < end; q++)
    ln_fwd_position(j->isa, x + ln_at(tx, q), gain, bias, y + ln_at(ty, q), j->C, j->a.eps,
                    sm + ln_at(tm, q), si + ln_at(ts, q));
}

static void ln_bwd_task(void *p, int64_t i) {
  const ln_job *j = p;
  const bp_abi_kernel_args *args = j->args;
  const bp_abi_tensor *tx = bp_sdk_input(args, 0), *tdy = bp_sdk_input(args, 1);
  const bp_abi_tensor *tm = bp_sdk_input(args, 3), *ts = bp_sdk_input(args, 4);
  const bp_abi_tensor *tdx = bp_sdk_output(args, 0);
  const float *x = bp_sdk_input_f32(args, 0), *dy = bp_sdk_input_f32(args, 1);
  const float *gain = bp_sdk_input_f32(args, 2), *sm = bp_sdk_input_f32(args, 3);
  const float *si = bp_sdk_input_f32(args, 4);
  float *dx = bp_sdk_output_f32(args, 0);
  double *sdyx = j->ws + i * 2 * j->C, *sdy = sdyx + j->C;
  for (int64_t c = 0; c < 2 * j->C; c++) sdyx[c] = 0.0;
  int64_t end;
  for (int64_t q = cpu_task_items(i, j->len, j->M, &end); q < end; q++)
    ln_bwd_position(j->isa, x + ln_at(tx, q), dy + ln_at(tdy, q), gain, dx + ln_at(tdx, q), sdyx,
                    sdy, j->C, sm[ln_at(tm, q)], si[ln_at(ts, q)], j->a.accumulate);
}

/* ---- kernels ---------------------------------------------------------------- */

/* The reference's checks, then contiguous channels in every tensor. */
static int ln_check(ops_ln_pass pass, const bp_abi_kernel_args *args, bp_layernorm_attrs *a,
                    char *reason, size_t rs) {
  static const char *const fwd_names[] = {"x", "gain", "bias", "y", "save_mean", "save_invstd"};
  static const char *const bwd_names[] = {"x",  "dy",    "gain", "save_mean",
                                          "save_invstd", "dx", "dgain", "dbias"};
  if (!ops_ln_check(args, pass, a, reason, rs)) return 0;
  const int nin = pass == OPS_LN_FWD ? 3 : 5;
  const char *const *names = pass == OPS_LN_FWD ? fwd_names : bwd_names;
  for (int i = 0; i < nin + 3; i++) {
    const bp_abi_tensor *t = i < nin ? bp_sdk_input(args, i) : bp_sdk_output(args, i - nin);
    if (!cpu_channels_contiguous(t, names[i], reason, rs)) return 0;
  }
  return 1;
}

static int ln_supports_fwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_layernorm_attrs a;
  return ln_check(OPS_LN_FWD, args, &a, reason, rs);
}
static int ln_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_layernorm_attrs a;
  return ln_check(OPS_LN_BWD, args, &a, reason, rs);
}

static int64_t positions_of(const bp_abi_kernel_args *args) {
  const bp_abi_tensor *x = bp_sdk_input(args, 0);
  return x->shape[0] * x->shape[1] * x->shape[2];
}

/* bwd: the per-chunk sums, [chunks][2][C] doubles. */
static uint64_t ln_workspace_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  const int64_t M = positions_of(args), C = bp_sdk_input(args, 0)->shape[3];
  return (uint64_t)(ops_ln_chunk_count(M) * 2 * C) * sizeof(double);
}

/* layernorm.fwd  in: x, gain, bias   out: y, save_mean, save_invstd */
static int ln_run_fwd(void *user, const bp_abi_kernel_args *args) {
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  ln_job j = {.args = args, .isa = cpu_user_isa(user)};
  if (!ln_check(OPS_LN_FWD, args, &j.a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  j.M = positions_of(args), j.C = bp_sdk_input(args, 0)->shape[3];
  j.len = cpu_items_per_task(j.C);
  bp_sdk_parallel_for(args, ln_fwd_task, &j, cpu_task_count(j.M, j.len));
  return BP_ABI_OK;
}

/* layernorm.bwd  in: x, dy, gain, save_mean, save_invstd   out: dx, dgain, dbias */
static int ln_run_bwd(void *user, const bp_abi_kernel_args *args) {
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  ln_job j = {.args = args, .isa = cpu_user_isa(user)};
  if (!ln_check(OPS_LN_BWD, args, &j.a, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  if (!args->workspace || args->workspace_bytes < ln_workspace_bwd(user, args)) {
    bp_sdk_fail(reason, rs, "workspace of %llu bytes, %llu needed",
                (unsigned long long)args->workspace_bytes,
                (unsigned long long)ln_workspace_bwd(user, args));
    return BP_ABI_ERR_INVALID;
  }
  j.M = positions_of(args), j.C = bp_sdk_input(args, 0)->shape[3];
  j.len = ops_ln_chunk_len(j.M), j.ws = args->workspace;
  const int64_t chunks = ops_ln_chunk_count(j.M);
  bp_sdk_parallel_for(args, ln_bwd_task, &j, chunks);
  const bp_abi_tensor *tdg = bp_sdk_output(args, 1), *tdb = bp_sdk_output(args, 2);
  float *dgain = bp_sdk_output_f32(args, 1), *dbias = bp_sdk_output_f32(args, 2);
  for (int64_t c = 0; c < j.C; c++) {
    double syx = 0.0, sy = 0.0;
    for (int64_t k = 0; k < chunks; k++) {
      syx += j.ws[k * 2 * j.C + c];
      sy += j.ws[k * 2 * j.C + j.C + c];
    }
    float *pg = dgain + c * tdg->stride[3], *pb = dbias + c * tdb->stride[3];
    *pg = bp_bn_param_grad(*pg, syx, j.a.accumulate);
    *pb = bp_bn_param_grad(*pb, sy, j.a.accumulate);
  }
  return BP_ABI_OK;
}

static const ops_fp16_kernel ln_fwd16 =
    CPU_FP16(ln_supports_fwd, ln_run_fwd, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel ln_bwd16 = {
    .supports = ln_supports_bwd,
    .workspace_size = ln_workspace_bwd,
    .run = ln_run_bwd,
    .accumulate_offset = offsetof(bp_layernorm_attrs, accumulate),
    .convert = ops_fp16_convert_fast,
};
const bp_abi_kernel cpu_layernorm_fwd =
    CPU_KERNEL16("layernorm.fwd", ln_fwd16, 0, CPU_FP16_DTYPES);
const bp_abi_kernel cpu_layernorm_bwd =
    CPU_KERNEL16("layernorm.bwd", ln_bwd16, 0, CPU_FP16_DTYPES);
