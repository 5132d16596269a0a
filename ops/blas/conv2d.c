/* conv2d through im2col / col2im and the provider's SGEMM: forward, backward-data,
 * backward-filter, with stride, zero padding, dilation, groups and an
 * optional bias. Same contract and results (within float rounding) as
 * ops/reference/conv2d.c.
 *
 * Shape legend (bp_abi_ops.h):
 *   x  [N, H, W, C]          input; group g owns channels [g*C/G, (g+1)*C/G)
 *   w  [K, kh, kw, C/G]      filters; group g owns filters [g*K/G, (g+1)*K/G)
 *   b  [1, 1, 1, K]          bias (has_bias)
 *   y  [N, OH, OW, K]        OH = (H + 2*pad_h - (dil_h*(kh-1)+1)) / stride_h + 1
 *
 * As matrices (blas-impl.h): Y = y as [N*OH*OW, K] (leading dimension the
 * pixel stride, so channel padding is skipped), Wg = the rows of group g's
 * filters as [K/G, kh*kw*C/G], and the column buffer
 *   col[m, g, ky, kx, c] = x[n, oh*sh - ph + ky*dh, ow*sw - pw + kx*dw, g*C/G + c]
 * (0 outside the image), one row m per output pixel (n, oh, ow), kh*kw*C
 * values a row, group g's block of kh*kw*C/G values starting at g*kh*kw*C/G.
 * Then per group g:
 *   forward          Y[:, g]  = col_g * Wg^T  (+ bias)
 *   backward-filter  dWg     (+)= dY[:, g]^T * col_g,  db (+)= column sums of dY
 *   backward-data, stride 1 and K <= C ("flipped"): a convolution of dy with
 *     the filters turned around,
 *       dcol[m, g, ky, kx, k] = dy[n, ih + ph - ky*dh, iw + pw - kx*dw, g*K/G + k]
 *     one row m per input pixel (n, ih, iw), and dX[:, g] (+)= dcol_g * Vg
 *     with Vg[(ky, kx, k), c] = w[g*K/G + k, ky, kx, c] (rearranged into the
 *     workspace): dx is written once, by the GEMM.
 *   backward-data, other strides (or a dx that is no matrix): dcol_g =
 *     dY[:, g] * Wg, then dx (+)= col2im(dcol), adding each row's taps.
 * A 1x1 kernel with stride 1 and no padding needs no col: x (or dx) itself
 * is the [N*H*W, C] matrix, when its strides allow (the "direct" path).
 *
 * Workspace: the col buffer for `images` whole images at a time (the
 * chunk, blas-impl.h): images * (OH*OW or, flipped, H*W) rows, plus Vg
 * (K*kh*kw*C/G floats) when flipped; 0 on the direct path. run() needs at
 * least workspace_size() bytes, 4-byte aligned, overlapping no tensor.
 *
 * All tensors FP32; x, dx, dy through any strides the reference accepts
 * when a gather or col2im reads them; y, dy, w, dw (and dx on the direct
 * and flipped paths) as matrices (blas-impl.h lists what is refused). No
 * alignment beyond 4 bytes; the 16-byte tail is never read. Outputs never
 * alias inputs. Every sum runs in a fixed order. */
#include <string.h>

#include "blas-impl.h"

/* Everything a pass needs, checked. */
typedef struct conv_geom {
  ops_conv_geom r; /* the checked geometry (ops/shared/weighted_check.h) */
  blas_mat ym, wm; /* y as [N*OH*OW, K]; w as [K, kh*kw*C/G] */
  blas_mat xm;     /* x as [N*H*W, C] when `x_matrix` (else zeros) */
  int x_matrix;    /* x's strides allow xm */
  int direct;      /* no col: 1x1, stride 1, no padding, x a matrix */
  int flipped;     /* bwd_data as a convolution of dy: stride 1, dx a matrix */
  int64_t pix;     /* col rows of one image: OH*OW, or H*W when flipped */
  int64_t row;     /* values of one col row: kh*kw*C, or kh*kw*K when flipped */
  int64_t images;  /* images per chunk: N on the direct path */
  uint64_t ws_bytes; /* images * pix * row floats (+ Vg when flipped), or 0 */
} conv_geom;

/* The validity checks of the reference (the same messages), then what this
 * module adds: matrix layouts, BLAS int range, the workspace. */
static int conv_check(const bp_abi_kernel_args *args, ops_pass pass, conv_geom *g, char *reason,
                      size_t rs) {
  if (!ops_conv_check(args, pass, &g->r, reason, rs)) return 0;
  const char *xname = pass == OPS_PASS_BWD_DATA ? "dx" : "x";
  const char *wname = pass == OPS_PASS_BWD_FILTER ? "dw" : "w";
  const char *yname = pass == OPS_PASS_FWD ? "y" : "dy";

  /* ---- this module's own limits ---- */
  if (!blas_view(g->r.y, 3, yname, "N*OH*OW rows of K channels", &g->ym, reason, rs) ||
      !blas_view(g->r.w, 1, wname, "K rows of kh*kw*C/groups filter values", &g->wm, reason, rs))
    return 0;
  g->x_matrix = blas_view(g->r.x, 3, xname, "", &g->xm, NULL, 0);
  if (!g->x_matrix) memset(&g->xm, 0, sizeof g->xm);
  g->direct = g->x_matrix && g->r.kh == 1 && g->r.kw == 1 && g->r.sh == 1 && g->r.sw == 1 &&
              g->r.ph == 0 && g->r.pw == 0;
  /* The flipped gather moves kh*kw*K values a row, col2im kh*kw*C (each
   * added into dx): flipped when K <= C (measured on the CNN's shapes:
   * 1.25-1.4x faster at K = C, slower at K = 2C and K = 32C). */
  g->flipped = pass == OPS_PASS_BWD_DATA && !g->direct && g->x_matrix && g->r.sh == 1 && g->r.sw == 1 &&
               g->r.k <= g->r.c;
  g->pix = g->flipped ? g->r.h * g->r.w_ : g->r.oh * g->r.ow;
  g->row = g->r.kh * g->r.kw * (g->flipped ? g->r.k : g->r.c);
  if (!blas_check_int(g->ym.rows, "N*OH*OW", reason, rs) ||
      !blas_check_int(g->ym.ld, "the pixel stride of y", reason, rs) ||
      !blas_check_int(g->wm.ld, "the filter stride of w", reason, rs) ||
      !blas_check_int(g->row, "the values of one im2col row", reason, rs) ||
      (g->x_matrix && (!blas_check_int(g->xm.rows, "N*H*W", reason, rs) ||
                       !blas_check_int(g->xm.ld, "the pixel stride of x", reason, rs))))
    return 0;
  g->images = g->r.n;
  g->ws_bytes = 0;
  if (!g->direct) {
    /* row and pix are below 2^31 (checked above): no overflow */
    const uint64_t image_bytes = (uint64_t)g->pix * (uint64_t)g->row * sizeof(float);
    if (image_bytes > BLAS_COL_MAX_BYTES)
      return bp_sdk_fail(reason, rs,
                         "im2col of one image needs %llu bytes, more than the %llu this kernel "
                         "allows",
                         (unsigned long long)image_bytes, (unsigned long long)BLAS_COL_MAX_BYTES);
    const uint64_t fit = BLAS_COL_TARGET_BYTES / image_bytes;
    g->images = fit < 1 ? 1 : fit > (uint64_t)g->r.n ? g->r.n : (int64_t)fit;
    g->ws_bytes = (uint64_t)g->images * image_bytes;
    if (g->flipped) g->ws_bytes += (uint64_t)(g->r.k * g->r.kh * g->r.kw * g->r.cg) * sizeof(float);
  }
  return 1;
}

/* What run() adds to the checks: pointers, and a workspace of the size
 * workspace_size() announced. */
static int conv_check_run(const bp_abi_kernel_args *args, ops_pass pass, conv_geom *g) {
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  if (!conv_check(args, pass, g, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return 0;
  return g->ws_bytes == 0 || blas_check_workspace(args, g->ws_bytes, reason, rs);
}

#define CONV_SUPPORTS(fn, pass)                                                             \
  static int fn(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {      \
    (void)user;                                                                             \
    conv_geom g;                                                                            \
    return conv_check(args, pass, &g, reason, rs);                                          \
  }
CONV_SUPPORTS(conv_supports_fwd, OPS_PASS_FWD)
CONV_SUPPORTS(conv_supports_bwd_data, OPS_PASS_BWD_DATA)
CONV_SUPPORTS(conv_supports_bwd_filter, OPS_PASS_BWD_FILTER)

#define CONV_WORKSPACE(fn, pass)                                                            \
  static uint64_t fn(void *user, const bp_abi_kernel_args *args) {                          \
    (void)user;                                                                             \
    conv_geom g;                                                                            \
    return conv_check(args, pass, &g, NULL, 0) ? g.ws_bytes : 0;                            \
  }
CONV_WORKSPACE(conv_workspace_fwd, OPS_PASS_FWD)
CONV_WORKSPACE(conv_workspace_bwd_data, OPS_PASS_BWD_DATA)
CONV_WORKSPACE(conv_workspace_bwd_filter, OPS_PASS_BWD_FILTER)

/* The in-bounds taps [*lo, *hi) of a window: tap t reads position
 * i0 + t*dil (dil < 0 walks backwards), in bounds when in [0, limit). */
static void conv_taps(int64_t i0, int64_t dil, int64_t taps, int64_t limit, int64_t *lo,
                      int64_t *hi) {
  int64_t a = 0, b = taps;
  if (dil > 0) {
    if (i0 < 0) a = (-i0 + dil - 1) / dil;
    if (i0 >= limit) b = 0;
    else if (i0 + (taps - 1) * dil >= limit) b = (limit - 1 - i0) / dil + 1;
  } else {
    const int64_t e = -dil;
    if (i0 >= limit) a = (i0 - limit + e) / e;
    if (i0 < 0) b = 0;
    else if (i0 / e + 1 < taps) b = i0 / e + 1;
  }
  if (b < a) b = a;
  *lo = a, *hi = b;
}

/* What a gather reads: the tensor t, and for col row (n, r, s) the taps
 * t[n, r*step_h + off_h + ky*dil_h, s*step_w + off_w + kx*dil_w, gi*tap + c]
 * of every group gi, ky < kh, kx < kw, c < tap, laid out [gi][ky][kx][c]. */
typedef struct gather {
  const bp_abi_tensor *t;
  int64_t rows_h, rows_w;                 /* col rows of one image: rows_h * rows_w */
  int64_t step_h, step_w, off_h, off_w, dil_h, dil_w;
  int64_t kh, kw, groups, tap;
} gather;

/* The col rows of images [n0, n0 + images): im2col (gather of x for the
 * forward and backward-filter) and its flipped twin (gather of dy for the
 * backward-data). Out-of-bounds taps are zeros. When a group's channels
 * are adjacent, each tap is one memcpy; with one group, dilation +1 and
 * adjacent pixels, the in-bounds taps of a kernel row are one memcpy. */
static void gather_rows(const gather *q, const float *src, int64_t n0, int64_t images,
                        float *col) {
  const bp_abi_tensor *t = q->t;
  const int64_t cs = t->stride[3], ps = t->stride[2], tap = q->tap;
  const int64_t group_len = q->kh * q->kw * tap, row_len = q->groups * group_len;
  const int adjacent = cs == 1 || tap == 1;
  const int run_rows = q->groups == 1 && q->dil_w == 1 && adjacent &&
                       (t->shape[2] == 1 || ps == tap);
  float *row = col;
  for (int64_t n = n0; n < n0 + images; n++)
    for (int64_t r = 0; r < q->rows_h; r++)
      for (int64_t s = 0; s < q->rows_w; s++, row += row_len) {
        const int64_t i0 = r * q->step_h + q->off_h, j0 = s * q->step_w + q->off_w;
        int64_t y0, y1, x0, x1;
        conv_taps(i0, q->dil_h, q->kh, t->shape[1], &y0, &y1);
        conv_taps(j0, q->dil_w, q->kw, t->shape[2], &x0, &x1);
        for (int64_t gi = 0; gi < q->groups; gi++) {
          float *grow = row + gi * group_len;
          if (y0 > 0) memset(grow, 0, sizeof(float) * (size_t)(y0 * q->kw * tap));
          if (y1 < q->kh)
            memset(grow + y1 * q->kw * tap, 0, sizeof(float) * (size_t)((q->kh - y1) * q->kw * tap));
          for (int64_t ky = y0; ky < y1; ky++) {
            float *dst = grow + ky * q->kw * tap;
            if (x0 > 0) memset(dst, 0, sizeof(float) * (size_t)(x0 * tap));
            if (x1 < q->kw) memset(dst + x1 * tap, 0, sizeof(float) * (size_t)((q->kw - x1) * tap));
            if (x1 <= x0) continue;
            const float *in =
                src + bp_sdk_offset(t, n, i0 + ky * q->dil_h, j0 + x0 * q->dil_w, gi * tap);
            const int64_t step = q->dil_w * ps; /* from one tap to the next */
            if (run_rows) {
              memcpy(dst + x0 * tap, in, sizeof(float) * (size_t)((x1 - x0) * tap));
            } else if (adjacent) {
              for (int64_t kx = x0; kx < x1; kx++)
                memcpy(dst + kx * tap, in + (kx - x0) * step, sizeof(float) * (size_t)tap);
            } else {
              for (int64_t kx = x0; kx < x1; kx++) {
                const float *p = in + (kx - x0) * step;
                for (int64_t c = 0; c < tap; c++) dst[kx * tap + c] = p[c * cs];
              }
            }
          }
        }
      }
}

static gather im2col_of(const conv_geom *g) {
  const gather q = {g->r.x,  g->r.oh,  g->r.ow,  g->r.sh,     g->r.sw, -g->r.ph, -g->r.pw,
                    g->r.dh, g->r.dw,  g->r.kh,  g->r.kw, g->r.groups, g->r.cg};
  return q;
}

/* The flipped gather of dy: row (n, ih, iw), tap (ky, kx) reads
 * dy[n, ih + ph - ky*dh, iw + pw - kx*dw]. */
static gather flipped_of(const conv_geom *g) {
  const gather q = {g->r.y,   g->r.h,   g->r.w_,  1,     1,         g->r.ph, g->r.pw,
                    -g->r.dh, -g->r.dw, g->r.kh,  g->r.kw, g->r.groups, g->r.kg};
  return q;
}

/* d[i] += s[i], i < n: the inner loop of col2im (restrict lets it vectorize). */
static inline void add_run(float *restrict d, const float *restrict s, int64_t n) {
  for (int64_t i = 0; i < n; i++) d[i] += s[i];
}

/* dx (+)= col2im of the dcol rows of images [n0, n0 + images): every
 * in-bounds tap of every row added to its input element, rows in order,
 * then groups, taps and channels in order (a fixed order: deterministic). */
static void col2im(const conv_geom *g, const float *col, int64_t n0, int64_t images, float *dx) {
  const int64_t xs = g->r.x->stride[3], tap = g->r.cg, group_len = g->r.kh * g->r.kw * g->r.cg;
  const float *row = col;
  for (int64_t n = n0; n < n0 + images; n++)
    for (int64_t oh = 0; oh < g->r.oh; oh++)
      for (int64_t ow = 0; ow < g->r.ow; ow++, row += g->row) {
        const int64_t ih0 = oh * g->r.sh - g->r.ph, iw0 = ow * g->r.sw - g->r.pw;
        int64_t y0, y1, x0, x1;
        conv_taps(ih0, g->r.dh, g->r.kh, g->r.h, &y0, &y1);
        conv_taps(iw0, g->r.dw, g->r.kw, g->r.w_, &x0, &x1);
        for (int64_t gi = 0; gi < g->r.groups; gi++)
          for (int64_t ky = y0; ky < y1; ky++)
            for (int64_t kx = x0; kx < x1; kx++) {
              const float *s = row + gi * group_len + (ky * g->r.kw + kx) * tap;
              float *d =
                  dx + bp_sdk_offset(g->r.x, n, ih0 + ky * g->r.dh, iw0 + kx * g->r.dw, gi * g->r.cg);
              if (xs == 1)
                add_run(d, s, tap);
              else
                for (int64_t c = 0; c < tap; c++) d[c * xs] += s[c];
            }
      }
}

/* Vg for every group, into v: v[g][ky][kx][k][c] = w[g*K/G + k, ky, kx, c]. */
static void flip_filters(const conv_geom *g, const float *w, float *v) {
  for (int64_t gi = 0; gi < g->r.groups; gi++)
    for (int64_t ky = 0; ky < g->r.kh; ky++)
      for (int64_t kx = 0; kx < g->r.kw; kx++)
        for (int64_t k = 0; k < g->r.kg; k++, v += g->r.cg)
          memcpy(v, w + (gi * g->r.kg + k) * g->wm.ld + (ky * g->r.kw + kx) * g->r.cg,
                 sizeof(float) * (size_t)g->r.cg);
}

/* conv2d.fwd
 *   in:  x [N,H,W,C], w [K,kh,kw,C/G], b [1,1,1,K] (has_bias)   out: y [N,OH,OW,K]
 *   y is overwritten (accumulate is ignored: the forward has no accumulate):
 *   rows set to the bias and the GEMM adds (beta 1), or the GEMM writes
 *   (beta 0, y never read). */
static int conv_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  conv_geom g;
  if (!conv_check_run(args, OPS_PASS_FWD, &g)) return BP_ABI_ERR_INVALID;
  const float *x = bp_sdk_input_f32(args, 0), *w = bp_sdk_input_f32(args, 1);
  const float *b = g.r.has_bias ? bp_sdk_input_f32(args, 2) : NULL;
  float *y = bp_sdk_output_f32(args, 0), *col = args->workspace;
  const gather q = im2col_of(&g);
  for (int64_t n0 = 0; n0 < g.r.n; n0 += g.images) {
    const int64_t images = g.r.n - n0 < g.images ? g.r.n - n0 : g.images, rows = images * g.pix;
    float *yc = y + n0 * g.pix * g.ym.ld;
    const float *a = x; /* direct: the chunk is every image */
    int64_t lda = g.xm.ld, a_group = g.r.cg;
    if (!g.direct) {
      gather_rows(&q, x, n0, images, col);
      a = col, lda = g.row, a_group = g.r.kh * g.r.kw * g.r.cg;
    }
    if (b) blas_fill_rows(yc, g.ym.ld, rows, g.r.k, b, g.r.b->stride[3]);
    for (int64_t gi = 0; gi < g.r.groups; gi++)
      BLAS_TRY(blas_sgemm(0, 1, rows, g.r.kg, g.r.kh * g.r.kw * g.r.cg, a + gi * a_group, lda,
                          w + gi * g.r.kg * g.wm.ld, g.wm.ld, b ? 1.0f : 0.0f, yc + gi * g.r.kg,
                          g.ym.ld));
  }
  return BP_ABI_OK;
}

/* conv2d.bwd_data
 *   in:  dy [N,OH,OW,K], w [K,kh,kw,C/G]   out: dx [N,H,W,C]
 *   accumulate 0: dx is overwritten; 1: the gradient is added to dx.
 *   Direct: one GEMM per group into dx (beta = accumulate). Flipped: per
 *   chunk the flipped gather of dy, then one GEMM per group into dx (beta =
 *   accumulate). Else dx is zeroed first (accumulate 0), then per chunk
 *   dcol = dY * Wg into the workspace and col2im adds it to dx. */
static int conv_run_bwd_data(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  conv_geom g;
  if (!conv_check_run(args, OPS_PASS_BWD_DATA, &g)) return BP_ABI_ERR_INVALID;
  const float *dy = bp_sdk_input_f32(args, 0), *w = bp_sdk_input_f32(args, 1);
  float *dx = bp_sdk_output_f32(args, 0), *col = args->workspace;
  const float beta = g.r.accumulate ? 1.0f : 0.0f;
  const int64_t kkg = g.r.kh * g.r.kw * g.r.cg;
  if (g.direct) {
    for (int64_t gi = 0; gi < g.r.groups; gi++)
      BLAS_TRY(blas_sgemm(0, 0, g.ym.rows, g.r.cg, g.r.kg, dy + gi * g.r.kg, g.ym.ld,
                          w + gi * g.r.kg * g.wm.ld, g.wm.ld, beta, dx + gi * g.r.cg, g.xm.ld));
    return BP_ABI_OK;
  }
  if (g.flipped) {
    float *v = col + g.images * g.pix * g.row; /* after the col rows */
    const gather q = flipped_of(&g);
    const int64_t kkk = g.r.kh * g.r.kw * g.r.kg; /* values of one group's block */
    flip_filters(&g, w, v);
    for (int64_t n0 = 0; n0 < g.r.n; n0 += g.images) {
      const int64_t images = g.r.n - n0 < g.images ? g.r.n - n0 : g.images, rows = images * g.pix;
      gather_rows(&q, dy, n0, images, col);
      for (int64_t gi = 0; gi < g.r.groups; gi++)
        BLAS_TRY(blas_sgemm(0, 0, rows, g.r.cg, kkk, col + gi * kkk, g.row, v + gi * kkk * g.r.cg,
                            g.r.cg, beta, dx + n0 * g.pix * g.xm.ld + gi * g.r.cg, g.xm.ld));
    }
    return BP_ABI_OK;
  }
  if (!g.r.accumulate) bp_sdk_fill_f32(g.r.x, dx, 0.0f);
  for (int64_t n0 = 0; n0 < g.r.n; n0 += g.images) {
    const int64_t images = g.r.n - n0 < g.images ? g.r.n - n0 : g.images, rows = images * g.pix;
    const float *dyc = dy + n0 * g.pix * g.ym.ld;
    for (int64_t gi = 0; gi < g.r.groups; gi++)
      BLAS_TRY(blas_sgemm(0, 0, rows, kkg, g.r.kg, dyc + gi * g.r.kg, g.ym.ld,
                          w + gi * g.r.kg * g.wm.ld, g.wm.ld, 0.0f, col + gi * kkg, g.row));
    col2im(&g, col, n0, images, dx);
  }
  return BP_ABI_OK;
}

/* conv2d.bwd_filter
 *   in:  x [N,H,W,C], dy [N,OH,OW,K]   out: dw [K,kh,kw,C/G], db [1,1,1,K] (has_bias)
 *   dWg (+)= dY[:, g]^T * col_g over the chunks in order: the first chunk's
 *   GEMM has beta = accumulate, the others beta 1. db (+)= the column sums
 *   of dY (double, row order, rounded once, as the reference).
 *   accumulate 0: overwritten; 1: added. */
static int conv_run_bwd_filter(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  conv_geom g;
  if (!conv_check_run(args, OPS_PASS_BWD_FILTER, &g)) return BP_ABI_ERR_INVALID;
  const float *x = bp_sdk_input_f32(args, 0), *dy = bp_sdk_input_f32(args, 1);
  float *dw = bp_sdk_output_f32(args, 0), *db = g.r.has_bias ? bp_sdk_output_f32(args, 1) : NULL;
  float *col = args->workspace;
  const gather q = im2col_of(&g);
  const int64_t kkg = g.r.kh * g.r.kw * g.r.cg;
  for (int64_t n0 = 0; n0 < g.r.n; n0 += g.images) {
    const int64_t images = g.r.n - n0 < g.images ? g.r.n - n0 : g.images, rows = images * g.pix;
    const float *dyc = dy + n0 * g.pix * g.ym.ld;
    const float *a = x; /* direct: the chunk is every image */
    int64_t lda = g.xm.ld, a_group = g.r.cg;
    if (!g.direct) {
      gather_rows(&q, x, n0, images, col);
      a = col, lda = g.row, a_group = kkg;
    }
    const float beta = n0 == 0 && !g.r.accumulate ? 0.0f : 1.0f;
    for (int64_t gi = 0; gi < g.r.groups; gi++)
      BLAS_TRY(blas_sgemm(1, 0, g.r.kg, kkg, rows, dyc + gi * g.r.kg, g.ym.ld, a + gi * a_group,
                          lda, beta, dw + gi * g.r.kg * g.wm.ld, g.wm.ld));
  }
  if (db) blas_sum_rows(dy, g.ym.ld, g.ym.rows, g.r.k, db, g.r.b->stride[3], g.r.accumulate);
  return BP_ABI_OK;
}

#define CONV_ACC offsetof(bp_conv2d_attrs, accumulate)
static const ops_fp16_kernel conv_fwd16 =
    BLAS_FP16(conv_supports_fwd, conv_workspace_fwd, conv_run_fwd, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel conv_bwd_data16 =
    BLAS_FP16(conv_supports_bwd_data, conv_workspace_bwd_data, conv_run_bwd_data, CONV_ACC);
static const ops_fp16_kernel conv_bwd_filter16 = BLAS_FP16(
    conv_supports_bwd_filter, conv_workspace_bwd_filter, conv_run_bwd_filter, CONV_ACC);
const bp_abi_kernel blas_conv2d_fwd = BLAS_KERNEL("conv2d.fwd", conv_fwd16);
const bp_abi_kernel blas_conv2d_bwd_data = BLAS_KERNEL("conv2d.bwd_data", conv_bwd_data16);
const bp_abi_kernel blas_conv2d_bwd_filter = BLAS_KERNEL("conv2d.bwd_filter", conv_bwd_filter16);
