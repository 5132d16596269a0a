/* maxpool.fwd and maxpool.bwd, vectorized across channels; bit-identical
 * to maxpool_run_fwd and maxpool_run_bwd of ops/reference/pool.c:
 *   x, dx [N,H,W,C]   y, dy, mask [N,OH,OW,C] (mask INT8: tap ky*kw + kx)
 *   maxpool.fwd  in: x         out: y, mask (overwritten)
 *   maxpool.bwd  in: dy, mask  out: dx (accumulate 0: zeroed, then the
 *                scatter; 1: added to)
 * The reference loops over channels innermost too, one window at a time;
 * here that channel loop runs over contiguous memory, so it vectorizes.
 * Each output element still sees the in-bounds taps of its window in the
 * reference's row-major order through the reference's test (the first tap,
 * then a strictly larger value, or the first NaN over a number), so the
 * value, the tie-breaking (first tap wins) and the NaN chosen are the
 * same, and the selects copy bits (-0.0 and NaN payloads kept). In the
 * backward each dx element receives its dy values in the reference's
 * output order (n, oh, ow) through the same float addition dx + dy.
 *
 * Layouts: any strides the reference takes, provided the channels of every
 * tensor are contiguous (stride[3] 1, padded channels allowed; or C 1);
 * others are refused with a reason and the reference serves them. Outputs
 * never overlap inputs (bp_sdk_check_ptrs), hence restrict. The checks and
 * the window geometry are the reference's own (ops/shared/pool_check.h).
 *
 * Threads (cpu-impl.h): the forward is cut by output rows, each output
 * element computed whole inside one task; the backward by images, since
 * overlapping windows of one image add into the same dx elements and must
 * keep their order, while images share nothing. The mask check runs over
 * the whole mask, on the same tasks, before any dx element is written. */
#include <stdatomic.h>
#include <string.h>

#include "cpu-impl.h"
#include "shared/pool_check.h"

/* ---- layout --------------------------------------------------------------- */

int cpu_channels_contiguous(const bp_abi_tensor *t, const char *name, char *reason, size_t rs) {
  if (t->shape[3] == 1 || t->stride[3] == 1) return 1;
  return bp_sdk_fail(reason, rs,
                     "%s: channels are not contiguous (channel stride %lld); the fast loop needs "
                     "NHWC with channel stride 1, the reference kernel serves it",
                     name, (long long)t->stride[3]);
}

/* The checked geometry of one call (x stands for dx and y for dy in the
 * backward). */
typedef ops_pool_geom pool_dims;

/* The reference's checks (the same reasons), then contiguous channels in
 * x, y and mask. */
static int pool_check(ops_pool_kind kind, const bp_abi_kernel_args *args, pool_dims *d,
                      char *reason, size_t rs) {
  if (!ops_pool_check(args, kind, d, reason, rs)) return 0;
  const int fwd = kind == OPS_POOL_MAX_FWD;
  return cpu_channels_contiguous(d->x, fwd ? "x" : "dx", reason, rs) &&
         cpu_channels_contiguous(d->y, fwd ? "y" : "dy", reason, rs) &&
         cpu_channels_contiguous(d->mask, "mask", reason, rs);
}

/* The window of output (oh, ow): its in-bounds taps [ky0, ky1) x [kx0,
 * kx1) and the input pixel of tap (0, 0), (ih, iw). */
typedef struct pool_window {
  int64_t ky0, ky1, kx0, kx1, ih, iw;
} pool_window;

static inline pool_window window_of(const pool_dims *d, int64_t oh, int64_t ow) {
  pool_window w;
  ops_pool_taps(oh, d->sh, d->ph, d->kh, d->h, &w.ky0, &w.ky1);
  ops_pool_taps(ow, d->sw, d->pw, d->kw, d->w, &w.kx0, &w.kx1);
  w.ih = oh * d->sh - d->ph, w.iw = ow * d->sw - d->pw;
  return w;
}

/* ---- loops ---------------------------------------------------------------- */

#define POOL_BLOCK 64 /* channels per pass over a window: the running max stays in L1 */

/* One tap of a window over nb channels: the reference's update, as a
 * select (no branch) so it vectorizes. */
CPU_INLINE void maxpool_tap(float *restrict best, int32_t *restrict arg, const float *restrict x,
                            int32_t tap, int64_t nb) {
  for (int64_t j = 0; j < nb; j++) {
    const float v = x[j], b = best[j];
    const int take = (v > b) | ((v != v) & (b == b));
    best[j] = take ? v : b;
    arg[j] = take ? tap : arg[j];
  }
}

/* A whole 2x2 window (the common pooling), taps 0..3 at a, b, c, e in the
 * reference's order: maxpool_tap's updates, with tap 0 folded into tap
 * 1's loop and tap 3 into the one that writes y and the mask. (The general
 * loop's first-tap copy and output copy become memcpy calls, whose start-up
 * cost dwarfs a window of 32 channels.) */
CPU_INLINE void maxpool_2x2(const float *restrict a, const float *restrict b,
                            const float *restrict c, const float *restrict e, float *restrict y,
                            int8_t *restrict mask, int64_t nc) {
  for (int64_t c0 = 0; c0 < nc; c0 += POOL_BLOCK) {
    const int64_t nb = nc - c0 < POOL_BLOCK ? nc - c0 : POOL_BLOCK;
    float best[POOL_BLOCK];
    int32_t arg[POOL_BLOCK];
    for (int64_t j = 0; j < nb; j++) { /* taps 0 and 1 (a loop that is no copy) */
      const float v = b[c0 + j], m = a[c0 + j];
      const int take = (v > m) | ((v != v) & (m == m));
      best[j] = take ? v : m;
      arg[j] = take;
    }
    maxpool_tap(best, arg, c + c0, 2, nb);
    for (int64_t j = 0; j < nb; j++) { /* tap 3, then the outputs */
      const float v = e[c0 + j], m = best[j];
      const int take = (v > m) | ((v != v) & (m == m));
      y[c0 + j] = take ? v : m;
      mask[c0 + j] = (int8_t)(take ? 3 : arg[j]);
    }
  }
}

/* Output rows [r0, r1) of the n * oh rows (row r: image r / oh, row r % oh). */
CPU_INLINE void maxpool_fwd_loop_body(const pool_dims *d, const float *restrict x,
                                      float *restrict y, int8_t *restrict mask, int64_t r0,
                                      int64_t r1) {
  for (int64_t r = r0; r < r1; r++) {
    const int64_t n = r / d->oh, oh = r % d->oh;
    for (int64_t ow = 0; ow < d->ow; ow++) {
      const pool_window wi = window_of(d, oh, ow);
      const int64_t ky0 = wi.ky0, ky1 = wi.ky1, kx0 = wi.kx0, kx1 = wi.kx1, ih = wi.ih, iw = wi.iw;
      float *yr = y + bp_sdk_offset(d->y, n, oh, ow, 0);
      int8_t *mr = mask + bp_sdk_offset(d->mask, n, oh, ow, 0);
      if (d->kh == 2 && d->kw == 2 && ky1 - ky0 == 2 && kx1 - kx0 == 2) {
        const float *a = x + bp_sdk_offset(d->x, n, ih, iw, 0), *c = a + d->x->stride[1];
        maxpool_2x2(a, a + d->x->stride[2], c, c + d->x->stride[2], yr, mr, d->c);
        continue;
      }
      for (int64_t c0 = 0; c0 < d->c; c0 += POOL_BLOCK) {
        const int64_t nb = d->c - c0 < POOL_BLOCK ? d->c - c0 : POOL_BLOCK;
        float best[POOL_BLOCK];
        int32_t arg[POOL_BLOCK];
        /* the first in-bounds tap is taken as it is (the reference's arg < 0) */
        const float *first = x + bp_sdk_offset(d->x, n, ih + ky0, iw + kx0, c0);
        const int32_t first_tap = (int32_t)(ky0 * d->kw + kx0);
        for (int64_t j = 0; j < nb; j++) best[j] = first[j], arg[j] = first_tap;
        for (int64_t ky = ky0; ky < ky1; ky++)
          for (int64_t kx = ky == ky0 ? kx0 + 1 : kx0; kx < kx1; kx++)
            maxpool_tap(best, arg, x + bp_sdk_offset(d->x, n, ih + ky, iw + kx, c0),
                        (int32_t)(ky * d->kw + kx), nb);
        for (int64_t j = 0; j < nb; j++) yr[c0 + j] = best[j], mr[c0 + j] = (int8_t)arg[j];
      }
    }
  }
}
CPU_DISPATCH(maxpool_fwd_loop,
             (const pool_dims *d, const float *restrict x, float *restrict y,
              int8_t *restrict mask, int64_t r0, int64_t r1),
             (d, x, y, mask, r0, r1))

/* The reference's mask check: every value a tap of its window inside the
 * input. Sets *bad to 1 if one is not. A window with every tap in bounds
 * only needs 0 <= m < kh*kw (a comparison that vectorizes); the edge
 * windows of a padded pool take the reference's test as it is. */
CPU_INLINE void maxpool_mask_check_body(const pool_dims *d, const int8_t *restrict mask,
                                        int *restrict bad, int64_t n0, int64_t n1) {
  const int taps = (int)(d->kh * d->kw);
  int any = 0;
  for (int64_t n = n0; n < n1; n++)
    for (int64_t oh = 0; oh < d->oh; oh++)
      for (int64_t ow = 0; ow < d->ow; ow++) {
        const pool_window wi = window_of(d, oh, ow);
        const int64_t ky0 = wi.ky0, ky1 = wi.ky1, kx0 = wi.kx0, kx1 = wi.kx1;
        const int8_t *mr = mask + bp_sdk_offset(d->mask, n, oh, ow, 0);
        if (ky0 == 0 && ky1 == d->kh && kx0 == 0 && kx1 == d->kw) {
          for (int64_t c = 0; c < d->c; c++) any |= (int)(uint8_t)mr[c] >= taps;
        } else {
          for (int64_t c = 0; c < d->c; c++) {
            const int64_t m = mr[c];
            any |= m < 0 || m >= taps || m / d->kw < ky0 || m / d->kw >= ky1 ||
                   m % d->kw < kx0 || m % d->kw >= kx1;
          }
        }
        if (any) {
          *bad = 1;
          return;
        }
      }
  *bad = 0;
}
CPU_DISPATCH(maxpool_mask_check,
             (const pool_dims *d, const int8_t *restrict mask, int *restrict bad, int64_t n0,
              int64_t n1),
             (d, mask, bad, n0, n1))

/* The scatter, one tap at a time: the channels whose mask names this tap
 * add their dy; the others keep dx as it is (a select, not + 0.0f, which
 * would turn a -0.0 into +0.0). Within one window the taps are distinct
 * elements, so every dx element still gets its additions in window order. */
CPU_INLINE void maxpool_scatter_tap(float *restrict dx, const float *restrict dy,
                                    const int32_t *restrict m, int32_t tap, int64_t nb) {
  for (int64_t j = 0; j < nb; j++) {
    /* the sum is formed in every lane and picked bitwise: a float ?: here
     * stays a branch (the add may trap). A compiler that assumes no
     * signalling NaNs (clang) may still build this as dx + -0.0f in the
     * lanes not picked, which quiets an sNaN the reference leaves alone:
     * the same bits for every other value (gradients never hold sNaNs) */
    const float o = dx[j], sum = o + dy[j];
    uint32_t ob, sb;
    memcpy(&ob, &o, sizeof ob);
    memcpy(&sb, &sum, sizeof sb);
    const uint32_t pick = 0u - (uint32_t)(m[j] == tap);
    const uint32_t r = (sb & pick) | (ob & ~pick);
    memcpy(&dx[j], &r, sizeof r);
  }
}

/* Images [n0, n1): each owns its dx, and the windows of one image, which
 * may share dx elements, stay in the reference's order. */
CPU_INLINE void maxpool_bwd_loop_body(const pool_dims *d, const float *restrict dy,
                                      const int8_t *restrict mask, float *restrict dx,
                                      int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; n++)
    for (int64_t oh = 0; oh < d->oh; oh++)
      for (int64_t ow = 0; ow < d->ow; ow++) {
        const pool_window wi = window_of(d, oh, ow);
        const int64_t ky0 = wi.ky0, ky1 = wi.ky1, kx0 = wi.kx0, kx1 = wi.kx1, ih = wi.ih, iw = wi.iw;
        const float *dyr = dy + bp_sdk_offset(d->y, n, oh, ow, 0);
        const int8_t *mr = mask + bp_sdk_offset(d->mask, n, oh, ow, 0);
        for (int64_t c0 = 0; c0 < d->c; c0 += POOL_BLOCK) {
          const int64_t nb = d->c - c0 < POOL_BLOCK ? d->c - c0 : POOL_BLOCK;
          int32_t m[POOL_BLOCK]; /* widened: the select below then has one lane width */
          for (int64_t j = 0; j < nb; j++) m[j] = mr[c0 + j];
          for (int64_t ky = ky0; ky < ky1; ky++)
            for (int64_t kx = kx0; kx < kx1; kx++)
              maxpool_scatter_tap(dx + bp_sdk_offset(d->x, n, ih + ky, iw + kx, c0), dyr + c0, m,
                                  (int32_t)(ky * d->kw + kx), nb);
        }
      }
}
CPU_DISPATCH(maxpool_bwd_loop,
             (const pool_dims *d, const float *restrict dy, const int8_t *restrict mask,
              float *restrict dx, int64_t n0, int64_t n1),
             (d, dy, mask, dx, n0, n1))

/* Windows that tile the input (stride = kernel, no padding, no pixel left
 * over) and accumulate 0: every dx element is one tap of one window, so
 * the reference's zeroing and its one addition give dx = (the mask names
 * the tap) ? 0.0f + dy : +0.0f, written here in one pass instead of a
 * zeroing pass and a read-modify-write one. The sum is kept (a -0.0 dy
 * becomes +0.0 there too) and picked bitwise, as in maxpool_scatter_tap. */
static int maxpool_tiles(const pool_dims *d) {
  return !d->accumulate && d->sh == d->kh && d->sw == d->kw && d->ph == 0 && d->pw == 0 &&
         d->h == d->oh * d->kh && d->w == d->ow * d->kw;
}

CPU_INLINE void maxpool_put_tap(float *restrict dx, const float *restrict dy,
                                const int8_t *restrict m, int32_t tap, int64_t nc) {
  for (int64_t j = 0; j < nc; j++) {
    const float sum = 0.0f + dy[j];
    uint32_t sb;
    memcpy(&sb, &sum, sizeof sb);
    const uint32_t r = sb & (0u - (uint32_t)(m[j] == tap));
    memcpy(&dx[j], &r, sizeof r);
  }
}

/* Images [n0, n1) of a tiling pool (maxpool_tiles). */
CPU_INLINE void maxpool_bwd_put_loop_body(const pool_dims *d, const float *restrict dy,
                                          const int8_t *restrict mask, float *restrict dx,
                                          int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; n++)
    for (int64_t oh = 0; oh < d->oh; oh++)
      for (int64_t ow = 0; ow < d->ow; ow++) {
        const float *dyr = dy + bp_sdk_offset(d->y, n, oh, ow, 0);
        const int8_t *mr = mask + bp_sdk_offset(d->mask, n, oh, ow, 0);
        for (int64_t ky = 0; ky < d->kh; ky++)
          for (int64_t kx = 0; kx < d->kw; kx++)
            maxpool_put_tap(dx + bp_sdk_offset(d->x, n, oh * d->kh + ky, ow * d->kw + kx, 0),
                            dyr, mr, (int32_t)(ky * d->kw + kx), d->c);
      }
}
CPU_DISPATCH(maxpool_bwd_put_loop,
             (const pool_dims *d, const float *restrict dy, const int8_t *restrict mask,
              float *restrict dx, int64_t n0, int64_t n1),
             (d, dy, mask, dx, n0, n1))

/* ---- tasks -------------------------------------------------------------------- */

/* One call cut into tasks: the forward by output rows (each output element
 * is its own window), the backward and its mask check by images. */
typedef struct pool_job {
  const pool_dims *d;
  const float *in;     /* fwd: x; bwd: dy */
  float *out;          /* fwd: y; bwd: dx */
  const int8_t *mask;  /* bwd */
  int8_t *mask_out;    /* fwd */
  int64_t items, per;  /* rows (fwd) or images (bwd) and items per task */
  atomic_int bad;      /* bwd: a mask value out of its window */
  cpu_isa_level isa; /* the context's (cpu_user) */
} pool_job;

static void pool_job_init(pool_job *j, const void *user, const pool_dims *d, int64_t items,
                          int64_t item_elems) {
  j->isa = cpu_user_isa(user);
  j->d = d;
  j->items = items;
  j->per = cpu_items_per_task(item_elems);
  atomic_init(&j->bad, 0);
}

static int64_t pool_tasks(const pool_job *j) { return cpu_task_count(j->items, j->per); }

static void maxpool_fwd_task(void *p, int64_t i) {
  pool_job *j = p;
  int64_t r1;
  const int64_t r0 = cpu_task_items(i, j->per, j->items, &r1);
  maxpool_fwd_loop(j->isa, j->d, j->in, j->out, j->mask_out, r0, r1);
}

static void maxpool_mask_task(void *p, int64_t i) {
  pool_job *j = p;
  int64_t n1;
  const int64_t n0 = cpu_task_items(i, j->per, j->items, &n1);
  int bad = 1;
  maxpool_mask_check(j->isa, j->d, j->mask, &bad, n0, n1);
  if (bad) atomic_store_explicit(&j->bad, 1, memory_order_relaxed);
}

/* accumulate 0: the images' dx zeroed first (+0.0f is all zero bits;
 * padded channels untouched), then the scatter; a tiling pool writes dx in
 * one pass instead. */
static void maxpool_bwd_task(void *p, int64_t i) {
  pool_job *j = p;
  const pool_dims *d = j->d;
  int64_t n1;
  const int64_t n0 = cpu_task_items(i, j->per, j->items, &n1);
  if (maxpool_tiles(d)) {
    maxpool_bwd_put_loop(j->isa, d, j->in, j->mask, j->out, n0, n1);
    return;
  }
  if (!d->accumulate)
    for (int64_t n = n0; n < n1; n++)
      for (int64_t h = 0; h < d->h; h++)
        for (int64_t w = 0; w < d->w; w++)
          memset(j->out + bp_sdk_offset(d->x, n, h, w, 0), 0, (size_t)d->c * sizeof(float));
  maxpool_bwd_loop(j->isa, d, j->in, j->mask, j->out, n0, n1);
}

/* ---- kernels ---------------------------------------------------------------- */

static int maxpool_supports_fwd(void *user, const bp_abi_kernel_args *args, char *reason,
                                size_t rs) {
  (void)user;
  pool_dims d;
  return pool_check(OPS_POOL_MAX_FWD, args, &d, reason, rs);
}
static int maxpool_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason,
                                size_t rs) {
  (void)user;
  pool_dims d;
  return pool_check(OPS_POOL_MAX_BWD, args, &d, reason, rs);
}

/* maxpool.fwd  in: x   out: y, mask. */
static int maxpool_run_fwd(void *user, const bp_abi_kernel_args *args) {
  pool_dims d;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!pool_check(OPS_POOL_MAX_FWD, args, &d, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  pool_job j;
  pool_job_init(&j, user, &d, d.n * d.oh, d.ow * d.c * d.kh * d.kw);
  j.in = bp_sdk_input_f32(args, 0);
  j.out = bp_sdk_output_f32(args, 0);
  j.mask_out = (int8_t *)args->output_ptrs[1];
  bp_sdk_parallel_for(args, maxpool_fwd_task, &j, pool_tasks(&j));
  return BP_ABI_OK;
}

/* maxpool.bwd  in: dy, mask   out: dx. A bad mask value makes run() return
 * BP_ABI_ERR_INVALID before dx is touched, as in the reference. */
static int maxpool_run_bwd(void *user, const bp_abi_kernel_args *args) {
  pool_dims d;
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!pool_check(OPS_POOL_MAX_BWD, args, &d, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  pool_job j;
  pool_job_init(&j, user, &d, d.n, d.oh * d.ow * d.c * d.kh * d.kw);
  j.in = bp_sdk_input_f32(args, 0);
  j.mask = (const int8_t *)args->input_ptrs[1];
  j.out = bp_sdk_output_f32(args, 0);
  bp_sdk_parallel_for(args, maxpool_mask_task, &j, pool_tasks(&j));
  if (atomic_load_explicit(&j.bad, memory_order_relaxed)) {
    bp_sdk_set_reason(args, "mask: a value is no in-bounds tap of its %lldx%lld window",
                      (long long)d.kh, (long long)d.kw);
    return BP_ABI_ERR_INVALID;
  }
  bp_sdk_parallel_for(args, maxpool_bwd_task, &j, pool_tasks(&j));
  return BP_ABI_OK;
}

/* FP16 through the adapter (the mask stays INT8) */
static const ops_fp16_kernel maxpool_fwd16 =
    CPU_FP16(maxpool_supports_fwd, maxpool_run_fwd, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel maxpool_bwd16 =
    CPU_FP16(maxpool_supports_bwd, maxpool_run_bwd, offsetof(bp_pool_attrs, accumulate));
const bp_abi_kernel cpu_maxpool_fwd =
    CPU_KERNEL16("maxpool.fwd", maxpool_fwd16, 0, CPU_POOL_DTYPES | CPU_FP16_DTYPES);
const bp_abi_kernel cpu_maxpool_bwd =
    CPU_KERNEL16("maxpool.bwd", maxpool_bwd16, 0, CPU_POOL_DTYPES | CPU_FP16_DTYPES);
