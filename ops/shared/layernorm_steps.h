/* Layer normalization pieces shared by the in-tree implementations
 * (ops/reference, ops/cpu): the argument checks, so both accept the same
 * nodes with the same reasons, and the order of every sum, so both do the
 * very same double operations (their outputs are bit-identical; the loops
 * around these are each module's own). The per-element formulas are
 * ops/shared/elem_math.h's (bp_ln_*), which ops/cuda's kernels call too.
 * Header-only (static inline), on the module SDK.
 *
 * Shape legend (bp_abi_ops.h): x, y, dy, dx [N,H,W,C]; gain, bias, dgain,
 * dbias [1,1,1,C]; save_mean, save_invstd [N,H,W,1] FP32. Statistics are
 * per position (n, h, w) over its C channels:
 *   mean = sum x / C     var = sum (x - mean)^2 / C (biased; two passes)
 *   invstd = 1 / sqrt(var + eps)
 *   y = (x - mean) * invstd * gain + bias
 * The backward reads the saved mean and invstd (FP32, widened). */
#ifndef BP_OPS_SHARED_LAYERNORM_STEPS_H
#define BP_OPS_SHARED_LAYERNORM_STEPS_H

#include <math.h>

#include "bp_abi_sdk.h"
#include "elem_math.h"

/* The order of the channel sums of one position: channel c goes to lane
 * c % OPS_LN_LANES, each lane summed in channel order from 0 in double,
 * then the lanes added in lane order from 0. Eight lanes keep a loop over
 * dense channels vectorizable (two AVX2 or one AVX-512 register of
 * doubles) with the bits of the plain loop. */
#define OPS_LN_LANES 8

/* The order of the parameter-gradient sums (dgain, dbias per channel over
 * the M = N*H*W positions): the positions, in (n, h, w) order, are cut
 * into chunks of ops_ln_chunk_len(M) (the last one shorter), at most
 * OPS_LN_MAX_CHUNKS of at least OPS_LN_MIN_CHUNK positions, a function of
 * M alone. Each chunk sums its positions in order in double from 0; the
 * chunk sums are added in chunk order from 0. A chunk is a task any
 * thread can run. */
#define OPS_LN_MAX_CHUNKS 64
#define OPS_LN_MIN_CHUNK 16

static inline int64_t ops_ln_chunk_len(int64_t M) {
  const int64_t len = (M + OPS_LN_MAX_CHUNKS - 1) / OPS_LN_MAX_CHUNKS;
  return len > OPS_LN_MIN_CHUNK ? len : OPS_LN_MIN_CHUNK;
}
static inline int64_t ops_ln_chunk_count(int64_t M) {
  const int64_t len = ops_ln_chunk_len(M);
  return (M + len - 1) / len;
}

/* Lanes added in lane order. */
static inline double ops_ln_lanes_total(const double lane[OPS_LN_LANES]) {
  double s = 0.0;
  for (int j = 0; j < OPS_LN_LANES; j++) s += lane[j];
  return s;
}

/* Mean and invstd of one position: x[c * xs] for c < C. */
static inline void ops_ln_stats(const float *x, int64_t xs, int64_t C, float eps, double *mean,
                                double *invstd) {
  double lane[OPS_LN_LANES] = {0};
  for (int64_t c = 0; c < C; c++) lane[c % OPS_LN_LANES] += (double)x[c * xs];
  const double m = ops_ln_lanes_total(lane) / (double)C;
  double dev[OPS_LN_LANES] = {0};
  for (int64_t c = 0; c < C; c++) {
    const double d = (double)x[c * xs] - m;
    dev[c % OPS_LN_LANES] += d * d;
  }
  *mean = m;
  *invstd = bp_ln_invstd(ops_ln_lanes_total(dev) / (double)C, eps);
}

/* The backward's channel means of one position: mg of g = dy * gain and
 * mgx of g * xhat (xhat from the saved mean and invstd). */
static inline void ops_ln_bwd_means(const float *x, int64_t xs, const float *dy, int64_t dys,
                                    const float *gain, int64_t gs, int64_t C, double mean,
                                    double invstd, double *mg, double *mgx) {
  double sg[OPS_LN_LANES] = {0}, sgx[OPS_LN_LANES] = {0};
  for (int64_t c = 0; c < C; c++) {
    const double g = bp_ln_g(dy[c * dys], gain[c * gs]);
    sg[c % OPS_LN_LANES] += g;
    sgx[c % OPS_LN_LANES] += g * bp_ln_xhat(x[c * xs], mean, invstd);
  }
  *mg = ops_ln_lanes_total(sg) / (double)C;
  *mgx = ops_ln_lanes_total(sgx) / (double)C;
}

typedef enum ops_ln_pass { OPS_LN_FWD, OPS_LN_BWD } ops_ln_pass;

/* Counts, dtypes (all FP32), shapes and attributes of a pass:
 *   fwd  in: x, gain, bias                          out: y, save_mean, save_invstd
 *   bwd  in: x, dy, gain, save_mean, save_invstd    out: dx, dgain, dbias */
static inline int ops_ln_check(const bp_abi_kernel_args *args, ops_ln_pass pass,
                               bp_layernorm_attrs *a, char *reason, size_t rs) {
  static const char *const fwd_in[] = {"x", "gain", "bias"};
  static const char *const fwd_out[] = {"y", "save_mean", "save_invstd"};
  static const char *const bwd_in[] = {"x", "dy", "gain", "save_mean", "save_invstd"};
  static const char *const bwd_out[] = {"dx", "dgain", "dbias"};
  /* 0: x-shaped, 1: per channel, 2: per position */
  static const int fwd_kind[] = {0, 1, 1, 0, 2, 2}, bwd_kind[] = {0, 0, 1, 2, 2, 0, 1, 1};
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  if (!bp_sdk_read_attrs(args, a, sizeof *a, reason, rs)) return 0;
  if (!isfinite(a->eps) || a->eps <= 0.0f)
    return bp_sdk_fail(reason, rs, "eps %g must be finite and > 0", (double)a->eps);
  if (!bp_sdk_check_flag(a->accumulate, "accumulate", reason, rs)) return 0;
  const int nin = pass == OPS_LN_FWD ? 3 : 5, nout = 3;
  if (!bp_sdk_check_args(args, nin, nout, reason, rs)) return 0;
  const char *const *in_names = pass == OPS_LN_FWD ? fwd_in : bwd_in;
  const char *const *out_names = pass == OPS_LN_FWD ? fwd_out : bwd_out;
  const int *kind = pass == OPS_LN_FWD ? fwd_kind : bwd_kind;
  const bp_abi_tensor *x = bp_sdk_input(args, 0);
  for (int i = 0; i < nin + nout; i++) {
    const bp_abi_tensor *t = i < nin ? bp_sdk_input(args, i) : bp_sdk_output(args, i - nin);
    const char *name = i < nin ? in_names[i] : out_names[i - nin];
    if (!bp_sdk_check_tensor(t, name, BP_ABI_DTYPE_FP32, reason, rs)) return 0;
    const int ok = kind[i] == 0   ? bp_sdk_check_shape(t, name, x->shape[0], x->shape[1],
                                                       x->shape[2], x->shape[3], reason, rs)
                   : kind[i] == 1 ? bp_sdk_check_shape(t, name, 1, 1, 1, x->shape[3], reason, rs)
                                  : bp_sdk_check_shape(t, name, x->shape[0], x->shape[1],
                                                       x->shape[2], 1, reason, rs);
    if (!ok) return 0;
  }
  return 1;
}

#endif
