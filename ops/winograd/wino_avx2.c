/* F(4x4,3x3) Winograd transforms and the per-position multiplies on AVX2
 * and FMA (winograd-impl.h has the layouts). Every loop runs over eight
 * channels at a time: NHWC keeps a pixel's channels contiguous, so each
 * vector lane is one channel and the transforms are the same adds and
 * multiplies in every lane. Channel tails are read and written with masks,
 * so channel padding and the bytes past the last element are never
 * touched. The matrices (Lavin and Gray, interpolation points 0, +-1, +-2
 * and infinity):
 *
 *   B^T = [4  0 -5  0 1 0]   G = [ 1/4     0    0 ]   A^T = [1 1  1 1  1 0]
 *         [0 -4 -4  1 1 0]       [-1/6  -1/6 -1/6 ]         [0 1 -1 2 -2 0]
 *         [0  4 -4 -1 1 0]       [-1/6   1/6 -1/6 ]         [0 1  1 4  4 0]
 *         [0 -2 -1  2 1 0]       [ 1/24 1/12  1/6 ]         [0 1 -1 8 -8 1]
 *         [0  2 -1 -2 1 0]       [ 1/24 -1/12 1/6 ]
 *         [0  4  0 -5 0 1]       [ 0      0    1  ]                          */
#include <immintrin.h>

#include "winograd-impl.h"

#define WINO_INLINE static inline __attribute__((always_inline))

/* Lanes [0, rem) set (rem in 1..8). */
WINO_INLINE __m256i tail_mask(int64_t rem) {
  static const int32_t bits[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256((const __m256i *)(const void *)(bits + 8 - rem));
}

/* r = B^T d over six vectors. */
WINO_INLINE void bt6(const __m256 d0, const __m256 d1, const __m256 d2, const __m256 d3,
                     const __m256 d4, const __m256 d5, __m256 r[6]) {
  const __m256 four = _mm256_set1_ps(4.0f), five = _mm256_set1_ps(5.0f);
  const __m256 t0 = _mm256_fnmadd_ps(four, d2, d4); /* d4 - 4 d2 */
  const __m256 t1 = _mm256_fnmadd_ps(four, d1, d3); /* d3 - 4 d1 */
  const __m256 t2 = _mm256_sub_ps(d4, d2);
  const __m256 t3 = _mm256_add_ps(_mm256_sub_ps(d3, d1), _mm256_sub_ps(d3, d1));
  r[0] = _mm256_fmadd_ps(four, d0, _mm256_fnmadd_ps(five, d2, d4));
  r[1] = _mm256_add_ps(t0, t1);
  r[2] = _mm256_sub_ps(t0, t1);
  r[3] = _mm256_add_ps(t2, t3);
  r[4] = _mm256_sub_ps(t2, t3);
  r[5] = _mm256_fmadd_ps(four, d1, _mm256_fnmadd_ps(five, d3, d5));
}

/* r = A^T m over six vectors (four results). */
WINO_INLINE void at6(const __m256 m0, const __m256 m1, const __m256 m2, const __m256 m3,
                     const __m256 m4, const __m256 m5, __m256 r[4]) {
  const __m256 a = _mm256_add_ps(m1, m2), b = _mm256_sub_ps(m1, m2);
  const __m256 c = _mm256_add_ps(m3, m4), d = _mm256_sub_ps(m3, m4);
  r[0] = _mm256_add_ps(_mm256_add_ps(m0, a), c);
  r[1] = _mm256_fmadd_ps(_mm256_set1_ps(2.0f), d, b);
  r[2] = _mm256_fmadd_ps(_mm256_set1_ps(4.0f), c, a);
  r[3] = _mm256_add_ps(_mm256_fmadd_ps(_mm256_set1_ps(8.0f), d, b), m5);
}

/* r = G g over three vectors (six results). */
WINO_INLINE void g3(const __m256 g0, const __m256 g1, const __m256 g2, __m256 r[6]) {
  const __m256 s = _mm256_add_ps(g0, g2);
  const __m256 q = _mm256_fmadd_ps(_mm256_set1_ps(1.0f / 24.0f), g0,
                                   _mm256_mul_ps(_mm256_set1_ps(1.0f / 6.0f), g2));
  const __m256 h = _mm256_mul_ps(_mm256_set1_ps(1.0f / 12.0f), g1);
  r[0] = _mm256_mul_ps(_mm256_set1_ps(0.25f), g0);
  r[1] = _mm256_mul_ps(_mm256_set1_ps(-1.0f / 6.0f), _mm256_add_ps(s, g1));
  r[2] = _mm256_mul_ps(_mm256_set1_ps(-1.0f / 6.0f), _mm256_sub_ps(s, g1));
  r[3] = _mm256_add_ps(q, h);
  r[4] = _mm256_sub_ps(q, h);
  r[5] = g2;
}

void wino_filter_row(const float *g, int64_t ci, int64_t cin_pad, int64_t cout_pad, float *u) {
  for (int64_t co0 = 0; co0 < cout_pad; co0 += 8) {
    __m256 t[6][3], r[6];
    for (int kx = 0; kx < 3; kx++) {
      g3(_mm256_loadu_ps(g + (0 + kx) * cout_pad + co0),
         _mm256_loadu_ps(g + (3 + kx) * cout_pad + co0),
         _mm256_loadu_ps(g + (6 + kx) * cout_pad + co0), r);
      for (int i = 0; i < 6; i++) t[i][kx] = r[i];
    }
    const int64_t panel = co0 / WINO_NR, nr = cout_pad - panel * WINO_NR < WINO_NR
                                                  ? cout_pad - panel * WINO_NR
                                                  : WINO_NR;
    float *row = u + panel * WINO_NR * cin_pad + ci * nr + (co0 - panel * WINO_NR);
    for (int i = 0; i < 6; i++) {
      g3(t[i][0], t[i][1], t[i][2], r);
      for (int j = 0; j < 6; j++) _mm256_storeu_ps(row + (i * 6 + j) * cin_pad * cout_pad, r[j]);
    }
  }
}

/* The zeros after a task's V and M (or Y) in its scratch
 * (wino_scratch_floats): nothing writes them. */
static const float *scratch_zeros(const float *scratch, int64_t cin_pad, int64_t cout_pad) {
  return scratch + WINO_P * (WINO_BLOCK_MAX * (cin_pad + cout_pad) + 2 * WINO_POS_PAD);
}

/* Tile t's place: image, first output row and column. */
WINO_INLINE void tile_place(const wino_conv *cv, int64_t t, int64_t *n, int64_t *oh0,
                            int64_t *ow0) {
  const int64_t per_image = cv->tiles_h * cv->tiles_w, r = t % per_image;
  *n = t / per_image;
  *oh0 = r / cv->tiles_w * 4;
  *ow0 = r % cv->tiles_w * 4;
}

/* V[p][tl] = B^T d B of tile t's 6x6 input window (rows oh0-1 .. oh0+4):
 * pixels outside the image read `zeros` (cin_pad zero floats), pad lanes
 * are masked to zero. */
static void input_tile(const wino_conv *cv, int64_t t, float *v, int64_t tl, const float *zeros) {
  int64_t n, oh0, ow0;
  tile_place(cv, t, &n, &oh0, &ow0);
  const float *px[36];
  for (int i = 0; i < 6; i++) {
    const int64_t ih = oh0 - 1 + i;
    for (int j = 0; j < 6; j++) {
      const int64_t iw = ow0 - 1 + j;
      px[i * 6 + j] = ih < 0 || ih >= cv->h || iw < 0 || iw >= cv->w
                          ? zeros
                          : cv->src + n * cv->src_stride[0] + ih * cv->src_stride[1] +
                                iw * cv->src_stride[2];
    }
  }
  const int64_t vstride = wino_pos_floats(cv, cv->cin_pad); /* between positions */
  for (int64_t c0 = 0; c0 < cv->cin_pad; c0 += 8) {
    const int full = cv->cin - c0 >= 8;
    const __m256i mask = tail_mask(full ? 8 : cv->cin - c0);
    __m256 s[6][6], r[6];
    for (int j = 0; j < 6; j++) { /* B^T d: down every column */
      __m256 d[6];
      for (int i = 0; i < 6; i++)
        d[i] = full ? _mm256_loadu_ps(px[i * 6 + j] + c0)
                    : _mm256_maskload_ps(px[i * 6 + j] + c0, mask);
      bt6(d[0], d[1], d[2], d[3], d[4], d[5], r);
      for (int i = 0; i < 6; i++) s[i][j] = r[i];
    }
    float *out = v + tl * cv->cin_pad + c0;
    for (int i = 0; i < 6; i++) { /* (B^T d) B: along every row */
      bt6(s[i][0], s[i][1], s[i][2], s[i][3], s[i][4], s[i][5], r);
      for (int j = 0; j < 6; j++) _mm256_storeu_ps(out + (i * 6 + j) * vstride, r[j]);
    }
  }
}

/* One output vector: + bias, + the old value with accumulate; masked
 * store of the logical channels when not full. */
WINO_INLINE void put(float *o, __m256 val, const wino_conv *cv, __m256 bias, int full,
                     __m256i mask) {
  if (cv->bias) val = _mm256_add_ps(val, bias);
  if (full) {
    if (cv->accumulate) val = _mm256_add_ps(_mm256_loadu_ps(o), val);
    _mm256_storeu_ps(o, val);
  } else {
    if (cv->accumulate) val = _mm256_add_ps(_mm256_maskload_ps(o, mask), val);
    _mm256_maskstore_ps(o, mask, val);
  }
}

/* y = A^T M A of tile t (+ bias, or + y with accumulate), its in-image
 * outputs and logical channels only. */
static void output_tile(const wino_conv *cv, int64_t t, const float *m, int64_t tl) {
  int64_t n, oh0, ow0;
  tile_place(cv, t, &n, &oh0, &ow0);
  const int64_t rows = cv->h - oh0 < 4 ? cv->h - oh0 : 4, cols = cv->w - ow0 < 4 ? cv->w - ow0 : 4;
  float *base = cv->dst + n * cv->dst_stride[0] + oh0 * cv->dst_stride[1] + ow0 * cv->dst_stride[2];
  const int64_t mstride = wino_pos_floats(cv, cv->cout_pad), s1 = cv->dst_stride[1],
                s2 = cv->dst_stride[2];
  const float *in = m + tl * cv->cout_pad;
  for (int64_t k0 = 0; k0 < cv->cout_pad; k0 += 8) {
    const int full = cv->cout - k0 >= 8;
    const __m256i mask = tail_mask(full ? 8 : cv->cout - k0);
    __m256 s[4][6], r[4];
    for (int j = 0; j < 6; j++) { /* A^T M: down every column */
      const float *c = in + j * mstride + k0;
      at6(_mm256_loadu_ps(c), _mm256_loadu_ps(c + 6 * mstride), _mm256_loadu_ps(c + 12 * mstride),
          _mm256_loadu_ps(c + 18 * mstride), _mm256_loadu_ps(c + 24 * mstride),
          _mm256_loadu_ps(c + 30 * mstride), r);
      for (int i = 0; i < 4; i++) s[i][j] = r[i];
    }
    const __m256 bias = cv->bias ? _mm256_loadu_ps(cv->bias + k0) : _mm256_setzero_ps();
    float *o = base + k0;
    if (rows == 4 && cols == 4 && full) { /* a whole tile: no bounds, no masks */
      for (int i = 0; i < 4; i++) {
        at6(s[i][0], s[i][1], s[i][2], s[i][3], s[i][4], s[i][5], r);
        for (int j = 0; j < 4; j++) put(o + i * s1 + j * s2, r[j], cv, bias, 1, mask);
      }
      continue;
    }
    for (int64_t i = 0; i < rows; i++) { /* (A^T M) A: along every row */
      at6(s[i][0], s[i][1], s[i][2], s[i][3], s[i][4], s[i][5], r);
      for (int64_t j = 0; j < cols; j++) put(o + i * s1 + j * s2, r[j], cv, bias, full, mask);
    }
  }
}

/* c[mr x 8*nv] = a[mr x kc] b[kc x 8*nv]: a's rows lda apart, b's rows
 * 8*nv wide and contiguous, c's rows ldc apart. Each output a sum over kc
 * in order, by FMA. The accumulators are named variables, not an array,
 * so they stay in registers (12 of the 16). */
#define WINO_ROW(r)                                                  \
  if (mr > r) {                                                      \
    const __m256 ar = _mm256_broadcast_ss(a + r * lda + k);          \
    c##r##0 = _mm256_fmadd_ps(ar, b0, c##r##0);                      \
    if (nv == 2) c##r##1 = _mm256_fmadd_ps(ar, b1, c##r##1);         \
  }
#define WINO_STORE(r)                                                \
  if (mr > r) {                                                      \
    _mm256_storeu_ps(c + r * ldc, c##r##0);                          \
    if (nv == 2) _mm256_storeu_ps(c + r * ldc + 8, c##r##1);         \
  }
WINO_INLINE void gemm_tile(const int mr, const int nv, int64_t kc, const float *a, int64_t lda,
                           const float *b, float *c, int64_t ldc) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t k = 0; k < kc; k++) {
    const __m256 b0 = _mm256_loadu_ps(b + k * 8 * nv);
    const __m256 b1 = nv == 2 ? _mm256_loadu_ps(b + k * 8 * nv + 8) : b0;
    WINO_ROW(0)
    WINO_ROW(1)
    WINO_ROW(2)
    WINO_ROW(3)
    WINO_ROW(4)
    WINO_ROW(5)
  }
  WINO_STORE(0)
  WINO_STORE(1)
  WINO_STORE(2)
  WINO_STORE(3)
  WINO_STORE(4)
  WINO_STORE(5)
}

#define WINO_GEMM_CASE(mr)                                    \
  case mr:                                                    \
    if (nv == 2) gemm_tile(mr, 2, kc, a, lda, b, c, ldc);     \
    else gemm_tile(mr, 1, kc, a, lda, b, c, ldc);             \
    break;

static void gemm(int mr, int nv, int64_t kc, const float *a, int64_t lda, const float *b,
                 float *c, int64_t ldc) {
  switch (mr) {
    WINO_GEMM_CASE(1)
    WINO_GEMM_CASE(2)
    WINO_GEMM_CASE(3)
    WINO_GEMM_CASE(4)
    WINO_GEMM_CASE(5)
    WINO_GEMM_CASE(6)
    default: BP_ASSERT(0);
  }
}

void wino_block(const wino_conv *cv, int64_t tile0, int64_t count, float *scratch) {
  const int64_t ci = cv->cin_pad, co = cv->cout_pad;
  float *v = scratch, *m = v + WINO_P * wino_pos_floats(cv, ci);
  const float *zeros = scratch_zeros(scratch, ci, co);
  for (int64_t tl = 0; tl < count; tl++) input_tile(cv, tile0 + tl, v, tl, zeros);
  for (int p = 0; p < WINO_P; p++) {
    const float *up = cv->u + p * ci * co;
    const float *vp = v + p * wino_pos_floats(cv, ci);
    float *mp = m + p * wino_pos_floats(cv, co);
    for (int64_t panel = 0; panel * WINO_NR < co; panel++) {
      const int64_t k0 = panel * WINO_NR;
      const int nv = co - k0 >= WINO_NR ? 2 : 1;
      for (int64_t r0 = 0; r0 < count; r0 += 6)
        gemm(count - r0 < 6 ? (int)(count - r0) : 6, nv, ci, vp + r0 * ci, ci, up + k0 * ci,
             mp + r0 * co + k0, co);
    }
  }
  for (int64_t tl = 0; tl < count; tl++) output_tile(cv, tile0 + tl, m, tl);
}

/* ---- filter gradient -------------------------------------------------------------- */

/* r = A e over four vectors (six results; A = (A^T)^T). */
WINO_INLINE void a4(const __m256 e0, const __m256 e1, const __m256 e2, const __m256 e3,
                    __m256 r[6]) {
  const __m256 s = _mm256_add_ps(e0, e2), t = _mm256_add_ps(e1, e3);
  const __m256 s4 = _mm256_fmadd_ps(_mm256_set1_ps(4.0f), e2, e0);
  const __m256 t8 = _mm256_fmadd_ps(_mm256_set1_ps(8.0f), e3, _mm256_add_ps(e1, e1));
  r[0] = e0;
  r[1] = _mm256_add_ps(s, t);
  r[2] = _mm256_sub_ps(s, t);
  r[3] = _mm256_add_ps(s4, t8);
  r[4] = _mm256_sub_ps(s4, t8);
  r[5] = e3;
}

/* r = G^T m over six vectors (three results). */
WINO_INLINE void gt6(const __m256 m0, const __m256 m1, const __m256 m2, const __m256 m3,
                     const __m256 m4, const __m256 m5, __m256 r[3]) {
  const __m256 a = _mm256_add_ps(m1, m2), b = _mm256_sub_ps(m1, m2);
  const __m256 c = _mm256_add_ps(m3, m4), d = _mm256_sub_ps(m3, m4);
  const __m256 sixth = _mm256_set1_ps(1.0f / 6.0f);
  r[0] = _mm256_fmadd_ps(_mm256_set1_ps(0.25f), m0,
                         _mm256_fmadd_ps(_mm256_set1_ps(1.0f / 24.0f), c,
                                         _mm256_mul_ps(_mm256_set1_ps(-1.0f / 6.0f), a)));
  r[1] = _mm256_fmadd_ps(_mm256_set1_ps(1.0f / 12.0f), d,
                         _mm256_mul_ps(_mm256_set1_ps(-1.0f / 6.0f), b));
  r[2] = _mm256_add_ps(_mm256_mul_ps(sixth, _mm256_sub_ps(c, a)), m5);
}

/* Y[p][tl] = A e A^T of tile t's 4x4 dy window (zero outside the image). */
static void grad_tile(const wino_conv *cv, int64_t t, float *y, int64_t tl, const float *zeros) {
  int64_t n, oh0, ow0;
  tile_place(cv, t, &n, &oh0, &ow0);
  const float *px[16];
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++)
      px[i * 4 + j] = oh0 + i >= cv->h || ow0 + j >= cv->w
                          ? zeros
                          : cv->grad + n * cv->grad_stride[0] + (oh0 + i) * cv->grad_stride[1] +
                                (ow0 + j) * cv->grad_stride[2];
  const int64_t ystride = wino_pos_floats(cv, cv->cout_pad);
  for (int64_t k0 = 0; k0 < cv->cout_pad; k0 += 8) {
    const int full = cv->cout - k0 >= 8;
    const __m256i mask = tail_mask(full ? 8 : cv->cout - k0);
    __m256 s[6][4], r[6], e[4];
    for (int j = 0; j < 4; j++) { /* A e: down every column */
      for (int i = 0; i < 4; i++)
        e[i] = full ? _mm256_loadu_ps(px[i * 4 + j] + k0)
                    : _mm256_maskload_ps(px[i * 4 + j] + k0, mask);
      a4(e[0], e[1], e[2], e[3], r);
      for (int i = 0; i < 6; i++) s[i][j] = r[i];
    }
    float *out = y + tl * cv->cout_pad + k0;
    for (int i = 0; i < 6; i++) { /* (A e) A^T: along every row */
      a4(s[i][0], s[i][1], s[i][2], s[i][3], r);
      for (int j = 0; j < 6; j++) _mm256_storeu_ps(out + (i * 6 + j) * ystride, r[j]);
    }
  }
}

/* c[mr x 8*nv] (+)= sum over t < depth of a[t*lda + r] b[t*ldb + ...]:
 * the rows of c are input channels, its columns output channels; each sum
 * in t order by FMA, then added to c, or stored when `first`. */
#define WINO_GROW(r)                                                 \
  if (mr > r) {                                                      \
    const __m256 ar = _mm256_broadcast_ss(a + t * lda + r);          \
    c##r##0 = _mm256_fmadd_ps(ar, b0, c##r##0);                      \
    if (nv == 2) c##r##1 = _mm256_fmadd_ps(ar, b1, c##r##1);         \
  }
#define WINO_GADD(r)                                                                      \
  if (mr > r) {                                                                           \
    if (!first) c##r##0 = _mm256_add_ps(_mm256_loadu_ps(c + r * ldc), c##r##0);           \
    _mm256_storeu_ps(c + r * ldc, c##r##0);                                               \
    if (nv == 2) {                                                                        \
      if (!first) c##r##1 = _mm256_add_ps(_mm256_loadu_ps(c + r * ldc + 8), c##r##1);     \
      _mm256_storeu_ps(c + r * ldc + 8, c##r##1);                                         \
    }                                                                                     \
  }
WINO_INLINE void grad_tile_gemm(const int mr, const int nv, int64_t depth, const float *a,
                                int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc,
                                int first) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t t = 0; t < depth; t++) {
    const __m256 b0 = _mm256_loadu_ps(b + t * ldb);
    const __m256 b1 = nv == 2 ? _mm256_loadu_ps(b + t * ldb + 8) : b0;
    WINO_GROW(0)
    WINO_GROW(1)
    WINO_GROW(2)
    WINO_GROW(3)
    WINO_GROW(4)
    WINO_GROW(5)
  }
  WINO_GADD(0)
  WINO_GADD(1)
  WINO_GADD(2)
  WINO_GADD(3)
  WINO_GADD(4)
  WINO_GADD(5)
}

#define WINO_GGEMM_CASE(mr)                                                 \
  case mr:                                                                  \
    if (nv == 2) grad_tile_gemm(mr, 2, depth, a, lda, b, ldb, c, ldc, first); \
    else grad_tile_gemm(mr, 1, depth, a, lda, b, ldb, c, ldc, first);         \
    break;

static void grad_gemm(int mr, int nv, int64_t depth, const float *a, int64_t lda, const float *b,
                      int64_t ldb, float *c, int64_t ldc, int first) {
  switch (mr) {
    WINO_GGEMM_CASE(1)
    WINO_GGEMM_CASE(2)
    WINO_GGEMM_CASE(3)
    WINO_GGEMM_CASE(4)
    WINO_GGEMM_CASE(5)
    WINO_GGEMM_CASE(6)
    default: BP_ASSERT(0);
  }
}

void wino_grad_block(const wino_conv *cv, int64_t tile0, int64_t count, float *scratch, float *mw,
                     int first) {
  const int64_t ci = cv->cin_pad, co = cv->cout_pad;
  float *v = scratch, *y = v + WINO_P * wino_pos_floats(cv, ci);
  const float *zeros = scratch_zeros(scratch, ci, co);
  for (int64_t tl = 0; tl < count; tl++) {
    input_tile(cv, tile0 + tl, v, tl, zeros);
    grad_tile(cv, tile0 + tl, y, tl, zeros);
  }
  for (int p = 0; p < WINO_P; p++) {
    const float *vp = v + p * wino_pos_floats(cv, ci), *yp = y + p * wino_pos_floats(cv, co);
    float *mp = mw + p * ci * co;
    for (int64_t c0 = 0; c0 < ci; c0 += 6)
      for (int64_t k0 = 0; k0 < co; k0 += WINO_NR)
        grad_gemm(ci - c0 < 6 ? (int)(ci - c0) : 6, co - k0 >= WINO_NR ? 2 : 1, count, vp + c0, ci,
                  yp + k0, co, mp + c0 * co + k0, co, first);
  }
}

void wino_grad_row(const float *mw, int groups, int64_t group_floats, int64_t ci,
                   int64_t cin_pad, int64_t cout_pad, float *out) {
  const int64_t pstride = cin_pad * cout_pad;
  for (int64_t k0 = 0; k0 < cout_pad; k0 += 8) {
    __m256 m[WINO_P], s[3][6], r[3];
    for (int p = 0; p < WINO_P; p++) {
      const float *src = mw + p * pstride + ci * cout_pad + k0;
      m[p] = _mm256_loadu_ps(src);
      for (int g = 1; g < groups; g++)
        m[p] = _mm256_add_ps(m[p], _mm256_loadu_ps(src + g * group_floats));
    }
    for (int j = 0; j < 6; j++) { /* G^T M: down every column */
      gt6(m[j], m[6 + j], m[12 + j], m[18 + j], m[24 + j], m[30 + j], r);
      for (int i = 0; i < 3; i++) s[i][j] = r[i];
    }
    for (int i = 0; i < 3; i++) { /* (G^T M) G: along every row */
      gt6(s[i][0], s[i][1], s[i][2], s[i][3], s[i][4], s[i][5], r);
      for (int j = 0; j < 3; j++) _mm256_storeu_ps(out + (i * 3 + j) * cout_pad + k0, r[j]);
    }
  }
}
