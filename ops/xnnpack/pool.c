/* maxpool.fwd, avgpool.fwd and global_avgpool.fwd through XNNPACK's
 * argmax_pooling2d_nhwc, average_pooling2d_nhwc and
 * global_average_pooling_nwc operators. The operators hold no weights:
 * they are created at prepare and only set up again when a pointer or the
 * batch changes.
 *
 * maxpool.fwd (FP32; this XNNPACK has no FP16 argmax pooling). The op
 * needs y and an INT8 mask naming the winning tap ky*kw + kx of each
 * window, the first one in row-major order among equal values (a NaN
 * over any number), padding never winning. XNNPACK's argmax pooling has no
 * stride (windows are the pooling size apart: stride = kernel is
 * required), numbers its taps column by column (index kx*kh + ky), keeps
 * the first of equal values in that order, never picks a NaN after a
 * number, and fills padding taps with the nearest edge pixel. So its max
 * value is right (edge copies repeat in-bounds values) but its index is
 * not the op's on ties, NaNs and padded edges: after it runs, one pass over
 * each window's in-bounds taps in row-major order picks the first NaN, else
 * the first tap equal to XNNPACK's max, and writes that tap and its bits.
 * The indices go to the workspace (uint32, dense [N, OH, OW, C]).
 *
 * avgpool.fwd (FP32; no FP16 average pooling here). XNNPACK divides a
 * padded window by its in-bounds count, which is count_include_pad = 0;
 * count_include_pad = 1 with padding is refused, as is a 1x1 window (which
 * XNNPACK rejects).
 *
 * global_avgpool.fwd (FP32, FP16): N rows of H*W pixels. */
#include <math.h>
#include <string.h>

#include "shared/pool_check.h"
#include "xnn-impl.h"



/* ---- maxpool.fwd ------------------------------------------------------------------ */

static int maxpool_check(const bp_abi_kernel_args *args, ops_pool_geom *g, char *reason,
                         size_t rs) {
  if (!ops_pool_check(args, OPS_POOL_MAX_FWD, g, reason, rs)) return 0;
  if (g->sh != g->kh || g->sw != g->kw)
    return bp_sdk_fail(reason, rs,
                       "stride %lldx%lld differs from the window %lldx%lld: XNNPACK's argmax "
                       "pooling moves by the window size",
                       (long long)g->sh, (long long)g->sw, (long long)g->kh, (long long)g->kw);
  if (g->kh * g->kw < 2)
    return bp_sdk_fail(reason, rs, "a 1x1 window: XNNPACK's argmax pooling needs 2 taps or more");
  if (g->mask->shape[3] > 1 && g->mask->stride[3] != 1)
    return bp_sdk_fail(reason, rs, "mask: channels are not contiguous");
  return xnnp_standard_nhwc(g->x, "x", reason, rs) && xnnp_standard_nhwc(g->y, "y", reason, rs);
}

static int maxpool_supports(void *user, const bp_abi_kernel_args *args, char *reason,
                            size_t rs) {
  (void)user;
  ops_pool_geom g = {0};
  return maxpool_check(args, &g, reason, rs);
}

static uint64_t maxpool_workspace(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  ops_pool_geom g = {0};
  if (!maxpool_check(args, &g, NULL, 0)) return 0;
  return (uint64_t)(g.n * g.oh * g.ow * g.c) * sizeof(uint32_t);
}

static int maxpool_create(xnn_node *s, const bp_abi_kernel_args *args) {
  ops_pool_geom g = {0};
  if (!maxpool_check(args, &g, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args)))
    return BP_ABI_ERR_INVALID;
  const enum xnn_status st = xnn_create_argmax_pooling2d_nhwc_f32(
      (uint32_t)g.ph, (uint32_t)g.pw, (uint32_t)g.ph, (uint32_t)g.pw, (uint32_t)g.kh,
      (uint32_t)g.kw, (size_t)g.c, (size_t)g.x->padded_c, (size_t)g.y->padded_c, 0, &s->op);
  if (st != xnn_status_success) {
    s->op = NULL;
    return xnnp_fail(args, "argmax pooling create", st);
  }
  return BP_ABI_OK;
}

static int maxpool_prepare(void *user, const bp_abi_kernel_args *args, void **state_out) {
  return xnn_node_prepare(user, args, state_out, maxpool_create);
}

/* The op's winner of every window (see the top of the file): the first
 * NaN among the in-bounds taps in row-major order, else the first tap
 * equal to XNNPACK's max. Taps outer, a block of contiguous channels inner
 * (x and y are dense NHWC, the mask's channels contiguous), branch-free so
 * the channel loop vectorizes. */
#define FIXUP_BLOCK 64

/* One tap over nb channels: the first NaN, and the first value equal to
 * the max (m), of each channel so far. */
static inline void fixup_tap(const float *restrict xr, const float *restrict m,
                             int32_t *restrict eq, int32_t *restrict nan, float *restrict nanv,
                             int32_t tap, int64_t nb) {
  for (int64_t j = 0; j < nb; j++) {
    const float v = xr[j];
    const int first_nan = (v != v) & (nan[j] < 0);
    nan[j] = first_nan ? tap : nan[j];
    nanv[j] = first_nan ? v : nanv[j];
    eq[j] = ((v == m[j]) & (eq[j] < 0)) ? tap : eq[j];
  }
}

static void maxpool_fixup(const ops_pool_geom *g, const float *x, float *y, int8_t *mask) {
  for (int64_t n = 0; n < g->n; n++)
    for (int64_t oh = 0; oh < g->oh; oh++)
      for (int64_t ow = 0; ow < g->ow; ow++) {
        int64_t ky0, ky1, kx0, kx1;
        ops_pool_taps(oh, g->sh, g->ph, g->kh, g->h, &ky0, &ky1);
        ops_pool_taps(ow, g->sw, g->pw, g->kw, g->w, &kx0, &kx1);
        const int64_t ih = oh * g->sh - g->ph, iw = ow * g->sw - g->pw;
        float *yr = y + bp_sdk_offset(g->y, n, oh, ow, 0);
        int8_t *mr = mask + bp_sdk_offset(g->mask, n, oh, ow, 0);
        for (int64_t c0 = 0; c0 < g->c; c0 += FIXUP_BLOCK) {
          const int64_t nb = g->c - c0 < FIXUP_BLOCK ? g->c - c0 : FIXUP_BLOCK;
          int32_t eq[FIXUP_BLOCK], nan[FIXUP_BLOCK];
          float nanv[FIXUP_BLOCK];
          for (int64_t j = 0; j < nb; j++) eq[j] = nan[j] = -1, nanv[j] = 0;
          for (int64_t ky = ky0; ky < ky1; ky++)
            for (int64_t kx = kx0; kx < kx1; kx++) {
              fixup_tap(x + bp_sdk_offset(g->x, n, ih + ky, iw + kx, c0), yr + c0, eq, nan, nanv,
                        (int32_t)(ky * g->kw + kx), nb);
            }
          /* eq < 0 only when XNNPACK's max is a NaN it took from its first
           * tap while no in-bounds tap is NaN, which cannot happen; the
           * first in-bounds tap is named then */
          const int32_t first = (int32_t)(ky0 * g->kw + kx0);
          for (int64_t j = 0; j < nb; j++) {
            const int32_t tap = nan[j] >= 0 ? nan[j] : eq[j] >= 0 ? eq[j] : first;
            if (nan[j] >= 0) yr[c0 + j] = nanv[j];
            mr[c0 + j] = (int8_t)tap;
          }
        }
      }
}

static int maxpool_run(void *user, const bp_abi_kernel_args *args) {
  ops_pool_geom g = {0};
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!maxpool_check(args, &g, reason, rs) || !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const uint64_t need = (uint64_t)(g.n * g.oh * g.ow * g.c) * sizeof(uint32_t);
  if (!args->workspace || args->workspace_bytes < need) {
    bp_sdk_set_reason(args, "workspace of %llu bytes, %llu needed",
                      (unsigned long long)args->workspace_bytes, (unsigned long long)need);
    return BP_ABI_ERR_INVALID;
  }
  xnn_node *s, *tmp;
  int rc = xnn_node_for_run(user, args, &s, &tmp, maxpool_create);
  if (rc != BP_ABI_OK) return rc;
  const float *x = args->input_ptrs[0];
  float *y = args->output_ptrs[0];
  pthreadpool_t pool = xnnp_pool_handle(s->pool);
  if (!xnn_node_setup_current(s, x, NULL, y, args->workspace, g.n)) {
    const enum xnn_status st = xnn_setup_argmax_pooling2d_nhwc_f32(
        s->op, (size_t)g.n, (size_t)g.h, (size_t)g.w, x, y, args->workspace, pool);
    if (st != xnn_status_success) {
      s->set_batch = -1;
      rc = xnnp_fail(args, "argmax pooling setup", st);
      goto out;
    }
  }
  const enum xnn_status st = xnn_run_operator(s->op, pool);
  if (st != xnn_status_success) {
    rc = xnnp_fail(args, "argmax pooling run", st);
    goto out;
  }
  maxpool_fixup(&g, x, y, args->output_ptrs[1]);
out:
  xnn_node_release(NULL, tmp);
  return rc;
}

const bp_abi_kernel xnnp_maxpool_fwd = {
    .struct_size = sizeof(bp_abi_kernel),
    .op = "maxpool.fwd",
    .impl = "xnnpack",
    .device = "cpu",
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32) | BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_INT8),
    .priority = XNNP_PRIORITY_BELOW_CPU,
    .flags = XNNP_FLAGS,
    .supports = maxpool_supports,
    .workspace_size = maxpool_workspace,
    .run = maxpool_run,
    .prepare = maxpool_prepare,
    .release = xnn_node_release,
};

/* ---- avgpool.fwd ------------------------------------------------------------------ */

static int avgpool_check(const bp_abi_kernel_args *args, ops_pool_geom *g, char *reason,
                         size_t rs) {
  if (!ops_pool_check(args, OPS_POOL_AVG_FWD, g, reason, rs)) return 0;
  if (g->count_include_pad && (g->ph > 0 || g->pw > 0))
    return bp_sdk_fail(reason, rs,
                       "count_include_pad with padding: XNNPACK's average pooling divides by the "
                       "in-bounds count");
  if (g->kh * g->kw < 2)
    return bp_sdk_fail(reason, rs, "a 1x1 window: XNNPACK's average pooling rejects it");
  return xnnp_standard_nhwc(g->x, "x", reason, rs) && xnnp_standard_nhwc(g->y, "y", reason, rs);
}

static int avgpool_supports(void *user, const bp_abi_kernel_args *args, char *reason,
                            size_t rs) {
  (void)user;
  ops_pool_geom g = {0};
  return avgpool_check(args, &g, reason, rs);
}

static int avgpool_create(xnn_node *s, const bp_abi_kernel_args *args) {
  ops_pool_geom g = {0};
  if (!avgpool_check(args, &g, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args)))
    return BP_ABI_ERR_INVALID;
  const enum xnn_status st = xnn_create_average_pooling2d_nhwc_f32(
      (uint32_t)g.ph, (uint32_t)g.pw, (uint32_t)g.ph, (uint32_t)g.pw, (uint32_t)g.kh,
      (uint32_t)g.kw, (uint32_t)g.sh, (uint32_t)g.sw, (size_t)g.c, (size_t)g.x->padded_c,
      (size_t)g.y->padded_c, -INFINITY, INFINITY, 0, &s->op);
  if (st != xnn_status_success) {
    s->op = NULL;
    return xnnp_fail(args, "average pooling create", st);
  }
  return BP_ABI_OK;
}

static int avgpool_prepare(void *user, const bp_abi_kernel_args *args, void **state_out) {
  return xnn_node_prepare(user, args, state_out, avgpool_create);
}

static int avgpool_run(void *user, const bp_abi_kernel_args *args) {
  ops_pool_geom g = {0};
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!avgpool_check(args, &g, reason, rs) || !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  xnn_node *s, *tmp;
  int rc = xnn_node_for_run(user, args, &s, &tmp, avgpool_create);
  if (rc != BP_ABI_OK) return rc;
  const float *x = args->input_ptrs[0];
  float *y = args->output_ptrs[0];
  pthreadpool_t pool = xnnp_pool_handle(s->pool);
  if (!xnn_node_setup_current(s, x, NULL, y, NULL, g.n)) {
    const enum xnn_status st = xnn_setup_average_pooling2d_nhwc_f32(
        s->op, (size_t)g.n, (size_t)g.h, (size_t)g.w, x, y, pool);
    if (st != xnn_status_success) {
      s->set_batch = -1;
      rc = xnnp_fail(args, "average pooling setup", st);
      goto out;
    }
  }
  const enum xnn_status st = xnn_run_operator(s->op, pool);
  if (st != xnn_status_success) rc = xnnp_fail(args, "average pooling run", st);
out:
  xnn_node_release(NULL, tmp);
  return rc;
}

const bp_abi_kernel xnnp_avgpool_fwd = {
    .struct_size = sizeof(bp_abi_kernel),
    .op = "avgpool.fwd",
    .impl = "xnnpack",
    .device = "cpu",
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32),
    .priority = XNNP_PRIORITY,
    .flags = XNNP_FLAGS,
    .supports = avgpool_supports,
    .run = avgpool_run,
    .prepare = avgpool_prepare,
    .release = xnn_node_release,
};

/* ---- global_avgpool.fwd ------------------------------------------------------------- */

static int gap_check(const bp_abi_kernel_args *args, int *dtype, char *reason, size_t rs) {
  bp_elementwise_attrs a;
  if (!bp_sdk_read_attrs(args, &a, sizeof a, reason, rs) ||
      !bp_sdk_check_args(args, 1, 1, reason, rs))
    return 0;
  const bp_abi_tensor *x = bp_sdk_input(args, 0), *y = bp_sdk_output(args, 0);
  *dtype = x->dtype;
  if (*dtype != BP_ABI_DTYPE_FP32 && *dtype != BP_ABI_DTYPE_FP16)
    return bp_sdk_fail(reason, rs, "x: dtype %s, expected fp32 or fp16",
                       bp_sdk_dtype_name(*dtype));
  if (*dtype == BP_ABI_DTYPE_FP16 && !xnnp_fp16_available())
    return bp_sdk_fail(reason, rs, "%s", xnnp_fp16_reason());
  return bp_sdk_check_tensor(x, "x", *dtype, reason, rs) &&
         bp_sdk_check_tensor(y, "y", *dtype, reason, rs) &&
         bp_sdk_check_shape(y, "y", x->shape[0], 1, 1, x->shape[3], reason, rs) &&
         xnnp_standard_nhwc(x, "x", reason, rs) &&
         (y->shape[3] == 1 || y->stride[3] == 1 ||
          bp_sdk_fail(reason, rs, "y: channels are not contiguous"));
}

static int gap_supports(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  int dtype;
  return gap_check(args, &dtype, reason, rs);
}

static int gap_create(xnn_node *s, const bp_abi_kernel_args *args) {
  int dtype;
  if (!gap_check(args, &dtype, bp_sdk_args_reason(args), bp_sdk_args_reason_size(args)))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *x = bp_sdk_input(args, 0), *y = bp_sdk_output(args, 0);
  const size_t c = (size_t)x->shape[3], in_stride = (size_t)x->padded_c;
  const size_t out_stride = y->shape[0] > 1 ? (size_t)y->stride[0] : c;
  const enum xnn_status st =
      dtype == BP_ABI_DTYPE_FP32
          ? xnn_create_global_average_pooling_nwc_f32(c, in_stride, out_stride, -INFINITY,
                                                      INFINITY, 0, &s->op)
          : xnn_create_global_average_pooling_nwc_f16(c, in_stride, out_stride, -INFINITY,
                                                      INFINITY, 0, &s->op);
  if (st != xnn_status_success) {
    s->op = NULL;
    return xnnp_fail(args, "global average pooling create", st);
  }
  return BP_ABI_OK;
}

static int gap_prepare(void *user, const bp_abi_kernel_args *args, void **state_out) {
  return xnn_node_prepare(user, args, state_out, gap_create);
}

static int gap_run(void *user, const bp_abi_kernel_args *args) {
  int dtype;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!gap_check(args, &dtype, reason, rs) || !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  xnn_node *s, *tmp;
  int rc = xnn_node_for_run(user, args, &s, &tmp, gap_create);
  if (rc != BP_ABI_OK) return rc;
  const bp_abi_tensor *x = bp_sdk_input(args, 0);
  const void *xp = args->input_ptrs[0];
  void *yp = args->output_ptrs[0];
  const size_t n = (size_t)x->shape[0], width = (size_t)(x->shape[1] * x->shape[2]);
  pthreadpool_t pool = xnnp_pool_handle(s->pool);
  if (!xnn_node_setup_current(s, xp, NULL, yp, NULL, (int64_t)n)) {
    const enum xnn_status st =
        dtype == BP_ABI_DTYPE_FP32
            ? xnn_setup_global_average_pooling_nwc_f32(s->op, n, width, xp, yp, pool)
            : xnn_setup_global_average_pooling_nwc_f16(s->op, n, width, xp, yp, pool);
    if (st != xnn_status_success) {
      s->set_batch = -1;
      rc = xnnp_fail(args, "global average pooling setup", st);
      goto out;
    }
  }
  const enum xnn_status st = xnn_run_operator(s->op, pool);
  if (st != xnn_status_success) rc = xnnp_fail(args, "global average pooling run", st);
out:
  xnn_node_release(NULL, tmp);
  return rc;
}

const bp_abi_kernel xnnp_global_avgpool_fwd = {
    .struct_size = sizeof(bp_abi_kernel),
    .op = "global_avgpool.fwd",
    .impl = "xnnpack",
    .device = "cpu",
    .dtypes = XNNP_DTYPES,
    .priority = XNNP_PRIORITY,
    .flags = XNNP_FLAGS,
    .supports = gap_supports,
    .run = gap_run,
    .prepare = gap_prepare,
    .release = xnn_node_release,
};
