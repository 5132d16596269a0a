/* Private helpers of the reference op module (ops/reference/). Nothing here
 * is exported: the module is built with -fvisibility=hidden and only the
 * ABI entry (module.c) is visible.
 *
 * Conventions shared by every kernel of the module:
 *  - Element (n,h,w,c) of a tensor t lives at ptr + ref_off(t, n, h, w, c),
 *    in elements; the strides are the device strides the host passes, so a
 *    padded channel dimension (padded_c > shape[3]) is skipped, never read
 *    and never written. No kernel reads the 16-byte tail. (The range ops
 *    of range.c take spans [1,1,1,E] whose E elements include the padding
 *    of every slot inside the span; see there.)
 *  - Every tensor is checked by ref_check_tensor: dtype, extents >= 1,
 *    strides >= 0 nesting in NHWC order without overlap, and the whole
 *    logical extent inside slot_bytes.
 *  - supports() and run() share one check function per op; run() repeats
 *    it and returns BP_ABI_ERR_INVALID instead of a reason. */
#ifndef BP_OPS_REFERENCE_IMPL_H
#define BP_OPS_REFERENCE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "bp_abi.h"
#include "bp_abi_ops.h"

#define REF_IMPL "reference"
#define REF_DEVICE "cpu"
#define REF_FLAGS (BP_ABI_KERNEL_REFERENCE | BP_ABI_KERNEL_DETERMINISTIC)
#define REF_REASON_MAX 256 /* bytes of the reason run() collects and drops */

/* Offset in elements of (n, h, w, c). */
static inline int64_t ref_off(const bp_abi_tensor *t, int64_t n, int64_t h, int64_t w,
                              int64_t c) {
  return n * t->stride[0] + h * t->stride[1] + w * t->stride[2] + c * t->stride[3];
}

/* Writes a reason (printf format) into reason[reason_size] when reason is
 * not NULL; returns 0 so a check reads `return ref_fail(...)`. */
int ref_fail(char *reason, size_t reason_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The args themselves: struct_size, tensor counts, tensor arrays and each
 * tensor's struct_size. */
int ref_check_args(const bp_abi_kernel_args *args, int num_inputs, int num_outputs, char *reason,
                   size_t reason_size);

/* One tensor: dtype, extents, strides and slot_bytes (see above). `name`
 * names it in the reason ("x", "dy", ...). */
int ref_check_tensor(const bp_abi_tensor *t, const char *name, int32_t dtype, char *reason,
                     size_t reason_size);

/* t's shape equals {n, h, w, c}. */
int ref_check_shape(const bp_abi_tensor *t, const char *name, int64_t n, int64_t h, int64_t w,
                    int64_t c, char *reason, size_t reason_size);

/* Copies the attribute block into `dst` (sizeof dst_size): fields the
 * writer did not send (attr_size smaller) read as zero, fields it sent
 * beyond ours are ignored. 0 with a reason when attrs is NULL with a
 * non-zero attr_size. */
int ref_read_attrs(const bp_abi_kernel_args *args, void *dst, size_t dst_size, char *reason,
                   size_t reason_size);

/* A flag attribute is 0 or 1. */
int ref_check_flag(int32_t value, const char *name, char *reason, size_t reason_size);

/* Pointers for run(): every tensor pointer present and 4-byte aligned
 * (1 for INT8), and no output overlapping an input or another output,
 * except output `alias_out[i]` with input `alias_in[i]` (i < alias_count)
 * when both describe the very same elements (same pointer, shape and
 * strides). 1 if fine. */
int ref_check_ptrs(const bp_abi_kernel_args *args, const int *alias_out, const int *alias_in,
                   int alias_count);

/* Input and output pointers, typed. */
static inline const float *ref_in(const bp_abi_kernel_args *args, int i) {
  return (const float *)args->input_ptrs[i];
}
static inline float *ref_out(const bp_abi_kernel_args *args, int i) {
  return (float *)args->output_ptrs[i];
}

/* Dot product of n floats a[i*as] . b[i*bs], summed in a fixed order
 * (eight float lanes when both strides are 1, then the tail and the lanes
 * in double), so the result is the same on every run. Inline: it is the
 * inner loop of the conv and fc forwards. */
static inline double ref_dot(const float *a, int64_t as, const float *b, int64_t bs, int64_t n) {
  double sum = 0.0;
  if (as == 1 && bs == 1) {
    float lane[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int j = 0; j < 8; j++) lane[j] += a[i + j] * b[i + j];
    for (; i < n; i++) sum += (double)a[i] * b[i];
    for (int j = 0; j < 8; j++) sum += lane[j];
    return sum;
  }
  for (int64_t i = 0; i < n; i++) sum += (double)a[i * as] * b[i * bs];
  return sum;
}

/* y[i*ys] += alpha * x[i*xs] for i < n, in float, in index order; y and x
 * never overlap. Inline: the inner loop of the backward passes. */
static inline void ref_axpy(float *restrict y, int64_t ys, float alpha, const float *restrict x,
                            int64_t xs, int64_t n) {
  if (ys == 1 && xs == 1) {
    for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
    return;
  }
  for (int64_t i = 0; i < n; i++) y[i * ys] += alpha * x[i * xs];
}

/* Sets every logical element of t (padding untouched) to 0. */
void ref_zero(const bp_abi_tensor *t, float *p);

/* The kernels, one descriptor each (defined in the family files). */
extern const bp_abi_kernel ref_conv2d_fwd, ref_conv2d_bwd_data, ref_conv2d_bwd_filter;
extern const bp_abi_kernel ref_fc_fwd, ref_fc_bwd_data, ref_fc_bwd_filter;
extern const bp_abi_kernel ref_relu_fwd, ref_relu_bwd, ref_add_fwd, ref_add_bwd;
extern const bp_abi_kernel ref_maxpool_fwd, ref_maxpool_bwd, ref_avgpool_fwd, ref_avgpool_bwd;
extern const bp_abi_kernel ref_global_avgpool_fwd, ref_global_avgpool_bwd;
extern const bp_abi_kernel ref_batchnorm_fwd_train, ref_batchnorm_fwd_eval, ref_batchnorm_bwd;
extern const bp_abi_kernel ref_softmax_ce_fwd_bwd;
extern const bp_abi_kernel ref_range_zero, ref_range_copy, ref_range_scale, ref_range_cast;
extern const bp_abi_kernel ref_range_ema, ref_range_nan_check;
extern const bp_abi_kernel ref_range_sgd, ref_range_adamw, ref_range_lars;

/* A descriptor of this module: op name, supports, run, extra flags. The
 * dtype mask names every dtype among the op's tensors (the registry
 * requires each to be in it): FP32, plus INT8 for the maxpool mask,
 * INT32 for the softmax_ce labels and the LARS segments, FP16 for the
 * cast and the NaN check, every dtype for range.zero and range.copy
 * (REF_KERNEL_DT). */
#define REF_KERNEL_DT(op_name, supports_fn, run_fn, extra_flags, dtype_mask)                  \
  {                                                                                          \
    .struct_size = sizeof(bp_abi_kernel), .op = (op_name), .impl = REF_IMPL,                \
    .device = REF_DEVICE, .dtypes = (dtype_mask), .priority = BP_ABI_PRIORITY_REFERENCE,     \
    .flags = REF_FLAGS | (extra_flags), .supports = (supports_fn), .run = (run_fn)           \
  }
#define REF_KERNEL(op_name, supports_fn, run_fn, extra_flags)                                 \
  REF_KERNEL_DT(op_name, supports_fn, run_fn, extra_flags, BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32))


/* ---- weighted ops (weighted.c): conv2d and fc share their tensor roles ----
 *   forward          in: x, w, b (has_bias)   out: y
 *   backward-data    in: dy, w                out: dx
 *   backward-filter  in: x, dy                out: dw, db (has_bias)
 * The checks below validate attributes, tensor counts, dtypes and shapes
 * once, for this module and for every module that compiles weighted.c in
 * (ops/blas), so all accept the same nodes with the same reasons. */
typedef enum ref_pass { REF_PASS_FWD, REF_PASS_BWD_DATA, REF_PASS_BWD_FILTER } ref_pass;

/* Everything a pass needs, checked. */
typedef struct ref_conv_geom {
  const bp_abi_tensor *x, *w, *b, *y; /* y stands for dy in the backward passes */
  int64_t n, h, w_, c, k, oh, ow;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw, groups, cg, kg;
  int has_bias, accumulate;
} ref_conv_geom;

int ref_conv_check(const bp_abi_kernel_args *args, ref_pass pass, ref_conv_geom *g, char *reason,
                   size_t rs);

typedef struct ref_fc_geom {
  const bp_abi_tensor *x, *w, *b, *y; /* y stands for dy in the backward passes */
  int64_t n, h, w_, c, f, o;
  int has_bias, accumulate;
} ref_fc_geom;

int ref_fc_check(const bp_abi_kernel_args *args, ref_pass pass, ref_fc_geom *g, char *reason,
                 size_t rs);

/* The per-channel steps of batch norm (batchnorm.c), shared with ops/cpu so
 * both do the very same double operations: for channels c0 .. c0+nb-1 of
 * a checked call, fwd_train from the channel sums (mean, var: already
 * divided by M) writes save_mean, save_invstd and the running statistics
 * and gives the affine scale and shift; fwd_eval gives scale and shift
 * from the running statistics; bwd reads save_mean and save_invstd
 * (saved_stats), then from the sums of dy and dy*xhat writes dgamma and
 * dbeta, gives k = gamma * invstd and divides both sums by M. */
void ref_bn_train_channels(const bp_abi_kernel_args *args, const bp_batchnorm_attrs *a,
                           int64_t c0, int64_t nb, const double *mean, const double *var,
                           double *scale, double *shift);
void ref_bn_eval_channels(const bp_abi_kernel_args *args, const bp_batchnorm_attrs *a,
                          int64_t c0, int64_t nb, double *scale, double *shift);
void ref_bn_saved_stats(const bp_abi_kernel_args *args, int64_t c0, int64_t nb, double *mean,
                        double *invstd);
void ref_bn_bwd_channels(const bp_abi_kernel_args *args, const bp_batchnorm_attrs *a, int64_t c0,
                         int64_t nb, const double *invstd, double *sdy, double *sdyx, double *k);

#endif
