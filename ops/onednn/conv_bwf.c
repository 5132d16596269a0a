/* conv2d backward-filter, direct AVX2/FMA kernel over NHWC: conv_bwf.h says
 * what it computes and how the work is split. The workspace holds, each
 * piece 64-byte aligned, per chunk:
 *   part [k][kh][lenp]  the chunk's dw, filter rows padded to whole vectors
 *        (kvec: [kh][len][k], filters along the vectors)
 *   bias [k rounded to 8]
 * then per work item (a chunk's images for one block of filters):
 *   xbuf [in_rows][wp][c] + slack: the group's input rows, zero-padded left
 *        and right (the pad columns are zeroed once per item and never
 *        written), so every window is a plain run of kw*C floats. */
#include "conv_bwf.h"

#include <immintrin.h>
#include <string.h>

#define BWF_TARGET __attribute__((target("avx2,fma")))
#define BWF_INLINE static inline __attribute__((always_inline)) BWF_TARGET

/* floats read past a window's len (the last vector of a row) */
#define BWF_SLACK 16
/* L1 share for what the tiles of one filter row r sweep in a group: its
 * dy rows and one input row per output row */
#define BWF_L1_BYTES (32 * 1024)
/* pixels a tile visit should sweep (amortizes its 2*12 loads/stores; more
 * rows per group measured 5-10% faster on the CNN's shapes, up to L1) */
#define BWF_MIN_PIXELS 112
/* the chunks' partials together stay under this (fewer, larger chunks
 * for large filters), and there are at most BWF_MAX_CHUNKS */
#define BWF_PART_BUDGET ((size_t)16 << 20)
#define BWF_MAX_CHUNKS 16
/* filters per work item: more filters than this are split into blocks,
 * which keeps large filters (few chunks) spread over the threads */
#define BWF_KBLOCK 64

static size_t round64(size_t bytes) { return (bytes + 63) / 64 * 64; }

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static void layout(bwf_plan *p) {
  p->in_rows = (p->group_rows - 1) * p->sh + p->kh;
  p->part_floats = (size_t)(p->k * p->kh * (p->kvec ? p->len : p->lenp));
  p->bias_floats = (size_t)(p->k + 7) / 8 * 8;
  p->xbuf_floats = (size_t)(p->in_rows * p->wp * p->c) + BWF_SLACK;
  p->chunks = (p->n + p->chunk_images - 1) / p->chunk_images;
  p->kblocks = p->kvec ? 1 : (p->k + BWF_KBLOCK - 1) / BWF_KBLOCK;
  p->items = p->chunks * p->kblocks;
  p->chunk_bytes = round64(p->part_floats * sizeof(float)) +
                   round64(p->bias_floats * sizeof(float));
  p->xbuf_bytes = round64(p->xbuf_floats * sizeof(float));
}

int bwf_plan_make(bwf_plan *p, int64_t n, int64_t h, int64_t w, int64_t c, int64_t k,
                  int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                  int64_t ph, int64_t pw, int has_bias) {
  memset(p, 0, sizeof *p);
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
  if (n < 1 || h < 1 || w < 1 || c < 1 || k < 1 || oh < 1 || ow < 1 || kh < 1 || kw < 1)
    return 0;
  p->n = n, p->h = h, p->w = w, p->c = c, p->k = k, p->oh = oh, p->ow = ow;
  p->kh = kh, p->kw = kw, p->sh = sh, p->sw = sw, p->ph = ph, p->pw = pw;
  p->has_bias = has_bias;
  p->len = kw * c;
  p->lenp = (p->len + 7) / 8 * 8;
  p->kvec = p->len < BWF_SHORT_ROW && k % 8 == 0;
  p->wp = w + 2 * pw;
  /* output rows per group: enough pixels per tile visit, within L1 */
  int64_t rows = min64(oh, (BWF_MIN_PIXELS + ow - 1) / ow);
  for (; rows > 1; rows--)
    if (rows * (ow * min64(k, BWF_KBLOCK) + p->wp * c) * (int64_t)sizeof(float) <= BWF_L1_BYTES)
      break;
  p->group_rows = rows;
  /* chunks: up to BWF_MAX_CHUNKS, the partials within BWF_PART_BUDGET */
  const size_t part_bytes = (size_t)(k * kh * (p->kvec ? p->len : p->lenp)) * sizeof(float);
  int64_t chunks = (int64_t)(BWF_PART_BUDGET / (part_bytes ? part_bytes : 1));
  chunks = chunks < 1 ? 1 : min64(chunks, BWF_MAX_CHUNKS);
  chunks = min64(chunks, n);
  p->chunk_images = (n + chunks - 1) / chunks;
  layout(p);
  return 1;
}

uint64_t bwf_workspace_bytes(const bwf_plan *p) {
  return (uint64_t)p->chunks * p->chunk_bytes + (uint64_t)p->items * p->xbuf_bytes;
}

/* The pixel loop of both tile shapes, inside tile() and ktile(), on their
 * p, xb, dyimg, oh0, oh1, r, k (dy's row length) and ow_n: every output row
 * oh0..oh1-1 of the group whose input row for filter row r lies inside the
 * image, and each of its pixels, with xr at float xoff of the pixel's window
 * in the group's padded rows xb and dr at filter koff of the pixel's dy; the
 * rest of the arguments is the body. A macro, so that the accumulators the
 * body names stay in registers (the code compiled is the same as with the
 * loop written out in each). */
#define BWF_FOR_PIXELS(xoff, koff, ...)                                      \
  do {                                                                       \
    const int64_t xstep = p->sw * p->c, rowstride = p->wp * p->c;            \
    for (int64_t oh = oh0; oh < oh1; oh++) {                                 \
      const int64_t ih = oh * p->sh - p->ph + r;                             \
      if (ih < 0 || ih >= p->h) continue;                                    \
      const float *xr = xb + ((oh - oh0) * p->sh + r) * rowstride + (xoff);  \
      const float *dr = dyimg + oh * ow_n * k + (koff);                      \
      for (int64_t ow = 0; ow < ow_n; ow++, xr += xstep, dr += k) {          \
        __VA_ARGS__                                                          \
      }                                                                      \
    }                                                                        \
  } while (0)

/* One tile: filters k0..k0+KT-1 of filter row r, vectors v0..v0+V-1 of the
 * row, over the group's output rows oh0..oh1-1 of one image. Named
 * accumulators (an array of them stays in memory with GCC). */
#define BWF_ACC(i, j) a##i##j
#define BWF_FOR_TILE(X) X(0, 0) X(0, 1) X(0, 2) X(1, 0) X(1, 1) X(1, 2) \
                        X(2, 0) X(2, 1) X(2, 2) X(3, 0) X(3, 1) X(3, 2)
BWF_INLINE void tile(const bwf_plan *p, float *part, const float *xb, const float *dyimg,
                     int64_t oh0, int64_t oh1, int64_t r, int64_t k0, int64_t v0, const int KT,
                     const int V) {
  const int64_t kh = p->kh, lenp = p->lenp, k = p->k, ow_n = p->ow;
  float *dst = part + (k0 * kh + r) * lenp + v0 * 8;
#define BWF_LOAD(i, j) \
  __m256 BWF_ACC(i, j) = KT > i && V > j ? _mm256_load_ps(dst + i * kh * lenp + j * 8) \
                                         : _mm256_setzero_ps();
  BWF_FOR_TILE(BWF_LOAD)
#undef BWF_LOAD
#define BWF_ROW(i)                                                  \
  if (KT > i) {                                                     \
    const __m256 b = _mm256_broadcast_ss(dr + i);                   \
    BWF_ACC(i, 0) = _mm256_fmadd_ps(b, x0, BWF_ACC(i, 0));          \
    if (V > 1) BWF_ACC(i, 1) = _mm256_fmadd_ps(b, x1, BWF_ACC(i, 1)); \
    if (V > 2) BWF_ACC(i, 2) = _mm256_fmadd_ps(b, x2, BWF_ACC(i, 2)); \
  }
  BWF_FOR_PIXELS(v0 * 8, k0,
                 const __m256 x0 = _mm256_loadu_ps(xr);
                 const __m256 x1 = V > 1 ? _mm256_loadu_ps(xr + 8) : x0;
                 const __m256 x2 = V > 2 ? _mm256_loadu_ps(xr + 16) : x0;
                 BWF_ROW(0) BWF_ROW(1) BWF_ROW(2) BWF_ROW(3));
#undef BWF_ROW
#define BWF_STORE(i, j) \
  if (KT > i && V > j) _mm256_store_ps(dst + i * kh * lenp + j * 8, BWF_ACC(i, j));
  BWF_FOR_TILE(BWF_STORE)
#undef BWF_STORE
}

/* tile() and ktile() at each size of their grids, as functions the tables
 * below pick at run time. */
#define BWF_SIZED(fn, A, B)                                                                   \
  static BWF_TARGET void fn##_##A##_##B(const bwf_plan *p, float *part, const float *xb,     \
                                        const float *dyimg, int64_t oh0, int64_t oh1,        \
                                        int64_t r, int64_t i0, int64_t j0) {                 \
    fn(p, part, xb, dyimg, oh0, oh1, r, i0, j0, A, B);                                       \
  }
#define BWF_SIZED3(fn, A) BWF_SIZED(fn, A, 1) BWF_SIZED(fn, A, 2) BWF_SIZED(fn, A, 3)
#define BWF_SIZED4(fn, A) BWF_SIZED3(fn, A) BWF_SIZED(fn, A, 4)
BWF_SIZED3(tile, 1)
BWF_SIZED3(tile, 2)
BWF_SIZED3(tile, 3)
BWF_SIZED3(tile, 4)

typedef void (*tile_fn)(const bwf_plan *, float *, const float *, const float *, int64_t,
                        int64_t, int64_t, int64_t, int64_t);
static const tile_fn tiles[4][3] = {{tile_1_1, tile_1_2, tile_1_3},
                                    {tile_2_1, tile_2_2, tile_2_3},
                                    {tile_3_1, tile_3_2, tile_3_3},
                                    {tile_4_1, tile_4_2, tile_4_3}};

/* kvec: one tile of T floats t0.. of filter row r's window times VK
 * vectors of filters from k0, over the group's output rows (the 3
 * broadcasts stay in registers, the filters' dy is read by the FMAs). */
#define BWF_FOR_KTILE(X) X(0, 0) X(0, 1) X(0, 2) X(0, 3) X(1, 0) X(1, 1) X(1, 2) X(1, 3) \
                         X(2, 0) X(2, 1) X(2, 2) X(2, 3)
BWF_INLINE void ktile(const bwf_plan *p, float *part, const float *xb, const float *dyimg,
                      int64_t oh0, int64_t oh1, int64_t r, int64_t t0, int64_t k0, const int T,
                      const int VK) {
  const int64_t k = p->k, ow_n = p->ow;
  float *dst = part + (r * p->len + t0) * k + k0;
#define BWF_KLOAD(t, v) \
  __m256 BWF_ACC(t, v) = T > t && VK > v ? _mm256_loadu_ps(dst + t * k + v * 8) : _mm256_setzero_ps();
  BWF_FOR_KTILE(BWF_KLOAD)
#undef BWF_KLOAD
#define BWF_KCOL(v)                                                    \
  if (VK > v) {                                                        \
    const __m256 d = _mm256_loadu_ps(dr + v * 8);                      \
    BWF_ACC(0, v) = _mm256_fmadd_ps(b0, d, BWF_ACC(0, v));             \
    if (T > 1) BWF_ACC(1, v) = _mm256_fmadd_ps(b1, d, BWF_ACC(1, v));  \
    if (T > 2) BWF_ACC(2, v) = _mm256_fmadd_ps(b2, d, BWF_ACC(2, v));  \
  }
  BWF_FOR_PIXELS(t0, k0,
                 const __m256 b0 = _mm256_broadcast_ss(xr);
                 const __m256 b1 = T > 1 ? _mm256_broadcast_ss(xr + 1) : b0;
                 const __m256 b2 = T > 2 ? _mm256_broadcast_ss(xr + 2) : b0;
                 BWF_KCOL(0) BWF_KCOL(1) BWF_KCOL(2) BWF_KCOL(3));
#undef BWF_KCOL
#define BWF_KSTORE(t, v) \
  if (T > t && VK > v) _mm256_storeu_ps(dst + t * k + v * 8, BWF_ACC(t, v));
  BWF_FOR_KTILE(BWF_KSTORE)
#undef BWF_KSTORE
}

BWF_SIZED4(ktile, 1)
BWF_SIZED4(ktile, 2)
BWF_SIZED4(ktile, 3)
static const tile_fn ktiles[3][4] = {{ktile_1_1, ktile_1_2, ktile_1_3, ktile_1_4},
                                     {ktile_2_1, ktile_2_2, ktile_2_3, ktile_2_4},
                                     {ktile_3_1, ktile_3_2, ktile_3_3, ktile_3_4}};

/* db partial [k0, k1) += the image's dy summed over its pixels, in pixel
 * order. */
static BWF_TARGET void bias_image(const bwf_plan *p, float *pb, const float *dyimg, int64_t k0,
                                  int64_t k1) {
  const int64_t k = p->k, pixels = p->oh * p->ow;
  for (int64_t q = 0; q < pixels; q++) {
    const float *d = dyimg + q * k;
    int64_t j = k0;
    for (; j + 8 <= k1; j += 8)
      _mm256_storeu_ps(pb + j, _mm256_add_ps(_mm256_loadu_ps(pb + j), _mm256_loadu_ps(d + j)));
    for (; j < k1; j++) pb[j] += d[j];
  }
}

BWF_TARGET void bwf_item(const bwf_plan *p, const float *x, const float *dy, void *ws,
                         int64_t i) {
  const int64_t chunk = i / p->kblocks, kb = i % p->kblocks;
  const int64_t kblock = p->kblocks == 1 ? p->k : BWF_KBLOCK; /* kvec: one block */
  const int64_t kbeg = kb * kblock, kend = min64(p->k, kbeg + kblock);
  char *base = (char *)ws + (size_t)chunk * p->chunk_bytes;
  float *part = (float *)(void *)base;
  float *pb = (float *)(void *)(base + round64(p->part_floats * sizeof(float)));
  float *xb = (float *)(void *)((char *)ws + (size_t)p->chunks * p->chunk_bytes +
                                (size_t)i * p->xbuf_bytes);
  /* this item's rows of the partial (kvec: one block, all of it) */
  const size_t row = p->part_floats / (size_t)p->k;
  memset(part + (size_t)kbeg * row, 0, (size_t)(kend - kbeg) * row * sizeof(float));
  memset(pb + kbeg, 0, (size_t)(kend - kbeg) * sizeof(float));
  memset(xb, 0, p->xbuf_floats * sizeof(float));
  const int64_t nv = p->lenp / 8, c = p->c, wc = p->w * c;
  const int64_t n0 = chunk * p->chunk_images, n1 = min64(p->n, n0 + p->chunk_images);
  for (int64_t n = n0; n < n1; n++) {
    const float *ximg = x + n * p->h * wc, *dyimg = dy + n * p->oh * p->ow * p->k;
    for (int64_t oh0 = 0; oh0 < p->oh; oh0 += p->group_rows) {
      const int64_t oh1 = min64(p->oh, oh0 + p->group_rows);
      const int64_t rows = (oh1 - 1 - oh0) * p->sh + p->kh;
      for (int64_t j = 0; j < rows; j++) {
        const int64_t ih = oh0 * p->sh - p->ph + j;
        if (ih >= 0 && ih < p->h)
          memcpy(xb + (j * p->wp + p->pw) * c, ximg + ih * wc, (size_t)wc * sizeof(float));
      }
      if (p->kvec) {
        const int64_t kv = p->k / 8;
        for (int64_t r = 0; r < p->kh; r++)
          for (int64_t t0 = 0; t0 < p->len; t0 += 3)
            for (int64_t v0 = 0; v0 < kv; v0 += 4)
              ktiles[min64(3, p->len - t0) - 1][min64(4, kv - v0) - 1](p, part, xb, dyimg, oh0,
                                                                       oh1, r, t0, v0 * 8);
        continue;
      }
      for (int64_t r = 0; r < p->kh; r++)
        for (int64_t k0 = kbeg; k0 < kend; k0 += 4) {
          const int64_t kt = min64(4, kend - k0);
          for (int64_t v0 = 0; v0 < nv; v0 += 3)
            tiles[kt - 1][min64(3, nv - v0) - 1](p, part, xb, dyimg, oh0, oh1, r, k0, v0);
        }
    }
    if (p->has_bias) bias_image(p, pb, dyimg, kbeg, kend);
  }
}

void bwf_reduce(const bwf_plan *p, const void *ws, float *dw, float *db, int accumulate,
                int64_t i, int64_t parts) {
  const char *base = ws;
  const int64_t rows = p->k * p->kh, len = p->len, lenp = p->lenp;
  const int64_t r0 = rows * i / parts, r1 = rows * (i + 1) / parts;
  for (int64_t row = r0; row < r1 && p->kvec; row++) { /* part [kh][len][k] */
    const int64_t f = row / p->kh, r = row % p->kh;
    for (int64_t e = 0; e < len; e++) {
      const size_t at = (size_t)((r * len + e) * p->k + f);
      float s = ((const float *)(const void *)base)[at];
      for (int64_t ch = 1; ch < p->chunks; ch++)
        s += ((const float *)(const void *)(base + (size_t)ch * p->chunk_bytes))[at];
      dw[row * len + e] = accumulate ? dw[row * len + e] + s : s;
    }
  }
  for (int64_t row = r0; row < r1 && !p->kvec; row++) {
    float *d = dw + row * len;
    for (int64_t e0 = 0; e0 < len; e0 += 64) {
      const int64_t m = min64(64, len - e0);
      float s[64];
      const float *src = (const float *)(const void *)base + row * lenp + e0;
      for (int64_t e = 0; e < m; e++) s[e] = src[e];
      for (int64_t ch = 1; ch < p->chunks; ch++) {
        src = (const float *)(const void *)(base + (size_t)ch * p->chunk_bytes) + row * lenp + e0;
        for (int64_t e = 0; e < m; e++) s[e] += src[e];
      }
      if (accumulate)
        for (int64_t e = 0; e < m; e++) d[e0 + e] += s[e];
      else
        for (int64_t e = 0; e < m; e++) d[e0 + e] = s[e];
    }
  }
  if (i == 0 && db && p->has_bias) {
    const size_t off = round64(p->part_floats * sizeof(float));
    for (int64_t j = 0; j < p->k; j++) {
      float s = ((const float *)(const void *)(base + off))[j];
      for (int64_t ch = 1; ch < p->chunks; ch++)
        s += ((const float *)(const void *)(base + (size_t)ch * p->chunk_bytes + off))[j];
      db[j] = accumulate ? db[j] + s : s;
    }
  }
}

/* the bench's knobs (bench/conv_bwf.c): group rows and chunk size */
void bwf_plan_tune(bwf_plan *p, int64_t group_rows, int64_t chunk_images) {
  if (group_rows > 0) p->group_rows = min64(group_rows, p->oh);
  if (chunk_images > 0) p->chunk_images = min64(chunk_images, p->n);
  layout(p);
}
