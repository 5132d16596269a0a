/* Batches: normalization statistics, the per-epoch permutation, sharding of
 * a global batch over ranks, augmentation draws, FP16 conversion and the
 * batch fill into strided (arena-layout) tensors. See data.h for the rules.
 *
 * Randomness. One documented generator, SplitMix64 (Steele, Lea & Flood,
 * "Fast splittable pseudorandom number generators", OOPSLA 2014; the
 * generator of java.util.SplittableRandom):
 *     mix(z)  = z ^= z >> 30, z *= 0xBF58476D1CE4E5B9,
 *               z ^= z >> 27, z *= 0x94D049BB133111EB, z ^ (z >> 31)
 *     h(x)    = mix(x + GOLDEN), GOLDEN = 0x9E3779B97F4A7C15
 *     key     = h(h(h(h(seed) ^ domain) ^ a) ^ b)
 *     draw k  = mix(key + (k + 1) * GOLDEN)          (k = 0, 1, 2, ...)
 * Draw k is a pure function of (key, k): the generator is counter-based, a
 * stream never depends on another stream or on how many draws were made
 * elsewhere. Streams: domain 1 = permutation (a = epoch), domain 2 = crop
 * (a = epoch, b = sample index), domain 3 = flip (same), domains 4 and 5 =
 * a synthetic sample's bytes and label (a = split, b = sample index; seed
 * 0, data_synthetic.c). The functions are in data-impl.h. A bounded draw in
 * [0, n) rejects draws below 2^64 mod n, then takes draw mod n (unbiased). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data-impl.h"

#define MAX_CROP_PAD 65535

/* ---- permutation and sharding ------------------------------------------- */

bp_status bp_data_permutation(uint64_t seed, uint64_t epoch, int shuffle, int64_t n,
                              int64_t *perm_out) {
  if (n < 0 || (n > 0 && !perm_out))
    return bp_fail(BP_ERR_INVALID, "bp_data_permutation: n %lld or a NULL output", (long long)n);
  for (int64_t i = 0; i < n; i++) perm_out[i] = i;
  if (!shuffle) return BP_OK;
  bp_data_rng r = bp_data_rng_stream_(seed, BP_DATA_DOMAIN_PERMUTATION, epoch, 0);
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)bp_data_rng_below_(&r, (uint64_t)i + 1);
    int64_t t = perm_out[i];
    perm_out[i] = perm_out[j];
    perm_out[j] = t;
  }
  return BP_OK;
}

int64_t bp_data_steps_per_epoch(int64_t n, int64_t global_batch, int drop_last) {
  if (n < 1 || global_batch < 1) return 0;
  return n / global_batch + (!drop_last && n % global_batch != 0 ? 1 : 0);
}

bp_status bp_data_shard(int64_t count, int world, int rank, int64_t *offset_out,
                        int64_t *count_out) {
  if (count < 0 || world < 1 || rank < 0 || rank >= world || !offset_out || !count_out)
    return bp_fail(BP_ERR_INVALID, "cannot shard %lld samples to rank %d of %d", (long long)count,
                   rank, world);
  int64_t q = count / world, r = count % world;
  *count_out = q + (rank < r ? 1 : 0);
  *offset_out = rank * q + (rank < r ? rank : r);
  return BP_OK;
}

int64_t bp_data_rank_capacity(int64_t global_batch, int world) {
  if (global_batch < 1 || world < 1) return 0;
  return global_batch / world + (global_batch % world != 0 ? 1 : 0);
}

bp_status bp_data_step_slice(int64_t n, int64_t global_batch, int drop_last, int64_t step,
                             int world, int rank, bp_data_slice *slice_out) {
  int64_t steps = bp_data_steps_per_epoch(n, global_batch, drop_last);
  if (!slice_out || steps == 0 || step < 0 || step >= steps)
    return bp_fail(BP_ERR_INVALID,
                   "step %lld is outside the %lld steps of an epoch of %lld samples in batches "
                   "of %lld",
                   (long long)step, (long long)steps, (long long)n, (long long)global_batch);
  int64_t begin = step * global_batch;
  int64_t global = n - begin < global_batch ? n - begin : global_batch;
  int64_t off = 0, cnt = 0;
  bp_status st = bp_data_shard(global, world, rank, &off, &cnt);
  if (st != BP_OK) return st;
  slice_out->first = begin + off;
  slice_out->count = cnt;
  slice_out->global_count = global;
  return BP_OK;
}

/* ---- augmentation ------------------------------------------------------- */

/* The draws of one (seed, epoch, augmentation) for any sample index, with
 * everything that does not depend on the index computed once: the stream
 * keys up to the last hash (key = h(prefix ^ index)) and the rejection
 * threshold of the crop offsets. bp_data_augment_params and bp_data_fill
 * both draw through it, so they cannot disagree. */
typedef struct augment_plan {
  int crop_pad;                 /* 0: no crop */
  int flip;                     /* 0: no flip */
  uint64_t crop_prefix, flip_prefix;
  uint64_t crop_n, crop_threshold; /* 2P + 1 and 2^64 mod (2P + 1) */
} augment_plan;

static void augment_plan_init(augment_plan *p, uint64_t seed, uint64_t epoch,
                              const bp_data_augment *augment) {
  memset(p, 0, sizeof *p);
  if (!augment) return;
  if (augment->crop_pad > 0 && augment->crop_pad <= MAX_CROP_PAD) {
    p->crop_pad = augment->crop_pad;
    p->crop_prefix = bp_data_stream_prefix_(seed, BP_DATA_DOMAIN_CROP, epoch);
    p->crop_n = 2 * (uint64_t)p->crop_pad + 1;
    p->crop_threshold = (0 - p->crop_n) % p->crop_n;
  }
  if (augment->flip) {
    p->flip = 1;
    p->flip_prefix = bp_data_stream_prefix_(seed, BP_DATA_DOMAIN_FLIP, epoch);
  }
}

static void augment_plan_draw(const augment_plan *p, int64_t index, bp_data_augment_draw *d) {
  d->dy = d->dx = d->flip = 0;
  if (p->crop_pad) {
    bp_data_rng r = {bp_data_hash64_(p->crop_prefix ^ (uint64_t)index)};
    d->dy = (int)bp_data_rng_below_t_(&r, p->crop_n, p->crop_threshold) - p->crop_pad;
    d->dx = (int)bp_data_rng_below_t_(&r, p->crop_n, p->crop_threshold) - p->crop_pad;
  }
  if (p->flip) {
    bp_data_rng r = {bp_data_hash64_(p->flip_prefix ^ (uint64_t)index)};
    d->flip = (int)(bp_data_rng_next_(&r) >> 63);
  }
}

void bp_data_augment_params(uint64_t seed, uint64_t epoch, int64_t index,
                            const bp_data_augment *augment, bp_data_augment_draw *draw_out) {
  if (!draw_out) return;
  memset(draw_out, 0, sizeof *draw_out);
  augment_plan p;
  augment_plan_init(&p, seed, epoch, augment);
  augment_plan_draw(&p, index, draw_out);
}

/* ---- normalization statistics ------------------------------------------- */

bp_status bp_dataset_stats(const bp_dataset *dataset, bp_data_norm *norm_out) {
  if (!dataset || !norm_out) return bp_fail(BP_ERR_INVALID, "bp_dataset_stats: NULL argument");
  const bp_dataset_info *in = &dataset->info;
  const int c = (int)in->channels;
  if (dataset->synthetic) { /* uniform bytes: the distribution's exact values */
    bp_data_norm out;
    memset(&out, 0, sizeof out);
    out.channels = c;
    for (int k = 0; k < c; k++) {
      out.mean[k] = 0.5f;
      out.std[k] = (float)(sqrt(65535.0 / 12.0) / 255.0);
    }
    *norm_out = out;
    return BP_OK;
  }
  uint64_t(*hist)[256] = calloc((size_t)c, sizeof *hist);
  if (!hist) return bp_fail(BP_ERR_NOMEM, "out of memory computing dataset statistics");
  const uint64_t pixels = (uint64_t)in->count * (uint64_t)in->height * (uint64_t)in->width;
  const uint8_t *p = dataset->images;
  for (uint64_t i = 0; i < pixels; i++)
    for (int k = 0; k < c; k++) hist[k][*p++]++;
  bp_data_norm out;
  memset(&out, 0, sizeof out);
  out.channels = c;
  for (int k = 0; k < c; k++) {
    double sum = 0;
    for (int v = 0; v < 256; v++) sum += (double)hist[k][v] * v;
    double mean = sum / 255.0 / (double)pixels, var = 0;
    for (int v = 0; v < 256; v++) {
      double d = v / 255.0 - mean;
      var += (double)hist[k][v] * d * d;
    }
    var /= (double)pixels;
    out.mean[k] = (float)mean;
    out.std[k] = var > 0 ? (float)sqrt(var) : 1.0f; /* a constant channel: scale 1 */
  }
  free(hist);
  *norm_out = out;
  return BP_OK;
}

/* ---- batch filling ------------------------------------------------------ */

/* Index of the last element of a [n, h, w, pc] tensor with strides s, plus
 * one; false on overflow or strides that make elements alias. */
static bool strided_extent(int64_t n, int64_t h, int64_t w, int64_t pc, const int64_t s[4],
                           int64_t *extent) {
  int64_t inner;
  if (s[3] < 1 || __builtin_mul_overflow(pc, s[3], &inner) || s[2] < inner ||
      __builtin_mul_overflow(w, s[2], &inner) || s[1] < inner ||
      __builtin_mul_overflow(h, s[1], &inner) || s[0] < inner)
    return false;
  int64_t last = 0, t;
  const int64_t ext[4] = {n, h, w, pc};
  for (int d = 0; d < 4; d++) {
    if (__builtin_mul_overflow(ext[d] - 1, s[d], &t) || __builtin_add_overflow(last, t, &last))
      return false;
  }
  *extent = last + 1;
  return true;
}

bp_status bp_data_check_targets_(const bp_dataset_info *info, int64_t rows, const char *what,
                                 const bp_dtensor *image_desc, const void *images,
                                 const bp_dtensor *label_desc, const void *labels) {
  if (!image_desc || !images)
    return bp_fail(BP_ERR_INVALID, "%s: no image tensor or pointer", what);
  const bp_dtensor *t = image_desc;
  if (t->dtype != BP_DTYPE_FP32 && t->dtype != BP_DTYPE_FP16)
    return bp_fail(BP_ERR_UNSUPPORTED, "%s: image tensor %s is %s; fp32 or fp16 expected", what,
                   t->name, bp_dtype_name(t->dtype));
  if (t->shape.h != info->height || t->shape.w != info->width || t->shape.c != info->channels)
    return bp_fail(BP_ERR_SHAPE,
                   "%s: image tensor %s is [%lld,%lld,%lld,%lld] but the images are %lldx%lldx%lld",
                   what, t->name, (long long)t->shape.n, (long long)t->shape.h,
                   (long long)t->shape.w, (long long)t->shape.c, (long long)info->height,
                   (long long)info->width, (long long)info->channels);
  if (t->shape.n < rows)
    return bp_fail(BP_ERR_SHAPE, "%s: image tensor %s holds %lld rows, %lld needed", what,
                   t->name, (long long)t->shape.n, (long long)rows);
  size_t es = bp_dtype_size(t->dtype);
  int64_t extent = 0;
  uint64_t bytes = 0;
  if (t->padded_c < t->shape.c ||
      !strided_extent(t->shape.n, t->shape.h, t->shape.w, t->padded_c, t->dev_stride, &extent) ||
      __builtin_mul_overflow((uint64_t)extent, (uint64_t)es, &bytes) || bytes > t->slot_bytes)
    return bp_fail(BP_ERR_SHAPE,
                   "%s: image tensor %s: padded_c %lld and device strides [%lld,%lld,%lld,%lld] "
                   "do not fit its shape in its %llu-byte slot",
                   what, t->name, (long long)t->padded_c, (long long)t->dev_stride[0],
                   (long long)t->dev_stride[1], (long long)t->dev_stride[2],
                   (long long)t->dev_stride[3], (unsigned long long)t->slot_bytes);
  if ((uintptr_t)images % es != 0)
    return bp_fail(BP_ERR_INVALID, "%s: image pointer %p is not aligned to %zu bytes", what,
                   images, es);
  if (!label_desc != !labels)
    return bp_fail(BP_ERR_INVALID, "%s: a label tensor without a pointer or the reverse", what);
  if (!label_desc) return BP_OK;
  const bp_dtensor *l = label_desc;
  if (l->dtype != BP_DTYPE_INT32)
    return bp_fail(BP_ERR_UNSUPPORTED, "%s: label tensor %s is %s; int32 expected", what,
                   l->name, bp_dtype_name(l->dtype));
  if (l->shape.h != 1 || l->shape.w != 1 || l->shape.c != 1 || l->shape.n < rows)
    return bp_fail(BP_ERR_SHAPE, "%s: label tensor %s is [%lld,%lld,%lld,%lld]; [n >= %lld,1,1,1] "
                                 "expected",
                   what, l->name, (long long)l->shape.n, (long long)l->shape.h,
                   (long long)l->shape.w, (long long)l->shape.c, (long long)rows);
  int64_t lextent = 0;
  uint64_t lbytes = 0;
  if (l->padded_c < 1 ||
      !strided_extent(l->shape.n, 1, 1, l->padded_c, l->dev_stride, &lextent) ||
      __builtin_mul_overflow((uint64_t)lextent, (uint64_t)4, &lbytes) || lbytes > l->slot_bytes)
    return bp_fail(BP_ERR_SHAPE,
                   "%s: label tensor %s: device stride %lld does not fit its %llu-byte slot",
                   what, l->name, (long long)l->dev_stride[0], (unsigned long long)l->slot_bytes);
  if ((uintptr_t)labels % 4 != 0)
    return bp_fail(BP_ERR_INVALID, "%s: label pointer %p is not aligned to 4 bytes", what, labels);
  uintptr_t i0 = (uintptr_t)images, i1 = i0 + (uintptr_t)bytes;
  uintptr_t l0 = (uintptr_t)labels, l1 = l0 + (uintptr_t)lbytes;
  if (i0 < l1 && l0 < i1)
    return bp_fail(BP_ERR_INVALID, "%s: the image tensor %s and the label tensor %s overlap", what,
                   t->name, l->name);
  return BP_OK;
}

bp_status bp_data_check_fill_options_(const bp_dataset_info *info,
                                      const bp_data_fill_options *o) {
  if (o->augment.crop_pad < 0 || o->augment.crop_pad > MAX_CROP_PAD)
    return bp_fail(BP_ERR_INVALID, "crop padding %d is outside [0, %d]", o->augment.crop_pad,
                   MAX_CROP_PAD);
  const bp_data_norm *n = o->norm;
  if (!n) return BP_OK;
  if (n->channels != info->channels)
    return bp_fail(BP_ERR_SHAPE, "normalization has %d channels, the images %lld", n->channels,
                   (long long)info->channels);
  for (int c = 0; c < n->channels; c++)
    if (!isfinite(n->mean[c]) || !isfinite(n->std[c]) || !(n->std[c] > 0))
      return bp_fail(BP_ERR_INVALID, "normalization of channel %d: mean %g, std %g (std must be "
                                     "finite and > 0)",
                     c, (double)n->mean[c], (double)n->std[c]);
  return BP_OK;
}

/* One sample's geometry: H x W x C source bytes, padded_c output channels
 * at element strides s (s[0] is applied by the caller). */
typedef struct sample_geometry {
  int64_t h, w;
  int c;
  int64_t pc;
  const int64_t *s;
} sample_geometry;

/* Writes one sample (rows y, columns x, channels 0..pc-1) at `out`:
 * out(y, x) = in(y + dy, x' + dx) with x' = flip ? W-1-x : x, the value of
 * raw byte 0 outside the image, 0 in padded channels; all 0 when src is
 * NULL. One copy per output type. */
#define DEFINE_FILL_SAMPLE(NAME, T)                                                          \
  static void NAME(T *out, const sample_geometry *g, const uint8_t *src,                    \
                   const bp_data_augment_draw *d, T lut[][256]) {                           \
    const int64_t H = g->h, W = g->w, PC = g->pc, s1 = g->s[1], s2 = g->s[2], s3 = g->s[3];  \
    const int C = g->c;                                                                      \
    for (int64_t y = 0; y < H; y++) {                                                        \
      const int64_t sy = y + d->dy;                                                          \
      const int row_in = src && sy >= 0 && sy < H;                                           \
      for (int64_t x = 0; x < W; x++) {                                                      \
        T *o = out + y * s1 + x * s2;                                                        \
        int64_t c = 0;                                                                       \
        if (src) {                                                                           \
          const int64_t sx = (d->flip ? W - 1 - x : x) + d->dx;                              \
          if (row_in && sx >= 0 && sx < W) {                                                 \
            const uint8_t *px = src + (sy * W + sx) * C;                                     \
            for (; c < C; c++) o[c * s3] = lut[c][px[c]];                                    \
          } else {                                                                           \
            for (; c < C; c++) o[c * s3] = lut[c][0];                                        \
          }                                                                                  \
        }                                                                                    \
        for (; c < PC; c++) o[c * s3] = 0;                                                   \
      }                                                                                      \
    }                                                                                        \
  }

DEFINE_FILL_SAMPLE(fill_sample_fp32, float)
DEFINE_FILL_SAMPLE(fill_sample_fp16, uint16_t)

/* The dense layout: channels adjacent (s[3] == 1) and pixels adjacent
 * (s[2] == PC), so a row of the output is W * PC adjacent elements and a row
 * of the source W * C adjacent bytes. Each output row is at most three runs:
 * columns whose source lies left or right of the image (raw byte 0, i.e.
 * lut[c][0]), and between them the columns that read a contiguous run of
 * source pixels, forwards, or backwards when flipped. A row whose source row
 * lies outside the image is one run of byte-0 pixels. The same elements as
 * the generic loop get the same values; the loops are just simpler:
 * outside(n) writes n byte-0 pixels, inside(n) converts n source pixels
 * s, s + step, s + 2 step, ... (step = +C or -C bytes). */
#define DEFINE_FILL_DENSE(SUF, T)                                                            \
  static inline __attribute__((always_inline)) void fill_outside_##SUF(                      \
      T *restrict o, int64_t n, int C, int64_t PC, T lut[][256]) {                          \
    if (C == 1 && PC == 1) {                                                                 \
      const T v = lut[0][0];                                                                 \
      for (int64_t i = 0; i < n; i++) o[i] = v;                                              \
      return;                                                                                \
    }                                                                                        \
    for (int64_t i = 0; i < n; i++, o += PC) {                                               \
      int64_t c = 0;                                                                         \
      for (; c < C; c++) o[c] = lut[c][0];                                                   \
      for (; c < PC; c++) o[c] = 0;                                                          \
    }                                                                                        \
  }                                                                                          \
                                                                                             \
  static inline __attribute__((always_inline)) void fill_inside_##SUF(                       \
      T *restrict o, const uint8_t *restrict s, int64_t n, int64_t step, int C, int64_t PC,  \
      T lut[][256]) {                                                                        \
    if (C == 1) {                                                                            \
      const T *restrict l = lut[0];                                                          \
      if (PC == 1 && step == 1) {                                                            \
        int64_t i = 0;                                                                       \
        for (; i + 4 <= n; i += 4) {                                                         \
          const T v0 = l[s[i]], v1 = l[s[i + 1]], v2 = l[s[i + 2]], v3 = l[s[i + 3]];        \
          o[i] = v0;                                                                         \
          o[i + 1] = v1;                                                                     \
          o[i + 2] = v2;                                                                     \
          o[i + 3] = v3;                                                                     \
        }                                                                                    \
        for (; i < n; i++) o[i] = l[s[i]];                                                   \
        return;                                                                              \
      }                                                                                      \
      if (PC == 1) { /* step == -1: the source row backwards */                              \
        int64_t i = 0;                                                                       \
        for (; i + 4 <= n; i += 4) {                                                         \
          const T v0 = l[s[-i]], v1 = l[s[-i - 1]], v2 = l[s[-i - 2]], v3 = l[s[-i - 3]];    \
          o[i] = v0;                                                                         \
          o[i + 1] = v1;                                                                     \
          o[i + 2] = v2;                                                                     \
          o[i + 3] = v3;                                                                     \
        }                                                                                    \
        for (; i < n; i++) o[i] = l[s[-i]];                                                  \
        return;                                                                              \
      }                                                                                      \
      for (int64_t i = 0; i < n; i++, o += PC, s += step) {                                  \
        o[0] = l[*s];                                                                        \
        for (int64_t c = 1; c < PC; c++) o[c] = 0;                                           \
      }                                                                                      \
      return;                                                                                \
    }                                                                                        \
    for (int64_t i = 0; i < n; i++, o += PC, s += step) {                                    \
      int64_t c = 0;                                                                         \
      for (; c < C; c++) o[c] = lut[c][s[c]];                                                \
      for (; c < PC; c++) o[c] = 0;                                                          \
    }                                                                                        \
  }                                                                                          \
                                                                                             \
  static inline __attribute__((always_inline)) void fill_dense_body_##SUF(                  \
      T *out, const sample_geometry *g, const uint8_t *src, const bp_data_augment_draw *d,   \
      T lut[][256], int C, int64_t PC) {                                                     \
    const int64_t H = g->h, W = g->w, s1 = g->s[1];                                          \
    if (!src) { /* an unused row: all 0 */                                                   \
      if (s1 == W * PC)                                                                      \
        memset(out, 0, (size_t)(H * W * PC) * sizeof(T));                                   \
      else                                                                                   \
        for (int64_t y = 0; y < H; y++) memset(out + y * s1, 0, (size_t)(W * PC) * sizeof(T)); \
      return;                                                                                \
    }                                                                                        \
    const int64_t dy = d->dy, dx = d->dx;                                                    \
    /* output rows [y0, y1) read source rows y + dy, inside the image */                     \
    const int64_t y0 = clamp64(-dy, 0, H), y1 = clamp64(H - dy, y0, H);                      \
    /* output columns [x0, x1) read source columns inside the image, the */                  \
    /* first of them sx0, then every next one step pixels on */                              \
    int64_t x0, x1, sx0, step;                                                               \
    if (!d->flip) { /* sx = x + dx */                                                        \
      x0 = clamp64(-dx, 0, W);                                                               \
      x1 = clamp64(W - dx, x0, W);                                                           \
      sx0 = x0 + dx;                                                                         \
      step = 1;                                                                              \
    } else { /* sx = W - 1 - x + dx */                                                       \
      x0 = clamp64(dx, 0, W);                                                                \
      x1 = clamp64(W + dx, x0, W);                                                           \
      sx0 = W - 1 - x0 + dx;                                                                 \
      step = -1;                                                                             \
    }                                                                                        \
    if (x0 == 0 && x1 == W && step == 1 && s1 == W * PC) {                                   \
      /* whole source rows, adjacent output rows: the sample is three runs */                \
      fill_outside_##SUF(out, y0 * W, C, PC, lut);                                           \
      if (y1 > y0)                                                                           \
        fill_inside_##SUF(out + y0 * W * PC, src + (y0 + dy) * W * C, (y1 - y0) * W, C, C,   \
                          PC, lut);                                                          \
      fill_outside_##SUF(out + y1 * W * PC, (H - y1) * W, C, PC, lut);                       \
      return;                                                                                \
    }                                                                                        \
    for (int64_t y = 0; y < H; y++) {                                                        \
      T *o = out + y * s1;                                                                   \
      if (y < y0 || y >= y1) {                                                               \
        fill_outside_##SUF(o, W, C, PC, lut);                                                \
        continue;                                                                            \
      }                                                                                      \
      fill_outside_##SUF(o, x0, C, PC, lut);                                                 \
      if (x1 > x0)                                                                           \
        fill_inside_##SUF(o + x0 * PC, src + ((y + dy) * W + sx0) * C, x1 - x0, step * C, C, \
                          PC, lut);                                                          \
      fill_outside_##SUF(o + x1 * PC, W - x1, C, PC, lut);                                   \
    }                                                                                        \
  }                                                                                          \
                                                                                             \
  /* one copy of the body per common channel layout, with C and PC known */                  \
  static __attribute__((noinline)) void fill_dense_##SUF(                                   \
      T *out, const sample_geometry *g, const uint8_t *src, const bp_data_augment_draw *d,   \
      T lut[][256]) {                                                                        \
    if (g->c == 1 && g->pc == 1)                                                             \
      fill_dense_body_##SUF(out, g, src, d, lut, 1, 1);                                      \
    else if (g->c == 1 && g->pc == 4)                                                        \
      fill_dense_body_##SUF(out, g, src, d, lut, 1, 4);                                      \
    else                                                                                     \
      fill_dense_body_##SUF(out, g, src, d, lut, g->c, g->pc);                               \
  }

static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

DEFINE_FILL_DENSE(fp32, float)
DEFINE_FILL_DENSE(fp16, uint16_t)

bp_status bp_data_fill(const bp_dataset *dataset, const int64_t *indices, int64_t count,
                       const bp_data_fill_options *options, const bp_dtensor *image_desc,
                       void *images, const bp_dtensor *label_desc, void *labels) {
  static const bp_data_fill_options defaults;
  if (!dataset || count < 0 || (count > 0 && !indices))
    return bp_fail(BP_ERR_INVALID, "bp_data_fill: NULL dataset or indices, or count %lld",
                   (long long)count);
  const bp_dataset_info *in = &dataset->info;
  const bp_data_fill_options *o = options ? options : &defaults;
  bp_status st = bp_data_check_targets_(in, count, "batch fill", image_desc, images, label_desc,
                                        labels);
  if (st != BP_OK) return st;
  st = bp_data_check_fill_options_(in, o);
  if (st != BP_OK) return st;
  for (int64_t i = 0; i < count; i++)
    if (indices[i] < 0 || indices[i] >= in->count)
      return bp_fail(BP_ERR_INVALID, "sample index %lld (row %lld) is outside the %lld samples",
                     (long long)indices[i], (long long)i, (long long)in->count);

  /* value of each byte per channel, computed as torchvision does in FP32:
   * ToTensor (p / 255), then Normalize ((x - mean) / std); only the table
   * of the output type is built */
  const bp_dtensor *t = image_desc;
  const bool fp16 = t->dtype == BP_DTYPE_FP16;
  const int C = (int)in->channels;
  float lut[BP_DATA_MAX_CHANNELS][256];
  uint16_t lut16[BP_DATA_MAX_CHANNELS][256];
  for (int c = 0; c < C; c++) {
    for (int p = 0; p < 256; p++) {
      float x = (float)p / 255.0f;
      if (o->norm) x = (x - o->norm->mean[c]) / o->norm->std[c];
      if (fp16)
        lut16[c][p] = bp_fp16_from_fp32(x);
      else
        lut[c][p] = x;
    }
  }
  const sample_geometry g = {in->height, in->width, C, t->padded_c, t->dev_stride};
  const bool dense = g.s[3] == 1 && g.s[2] == g.pc;
  augment_plan aug;
  augment_plan_init(&aug, o->seed, o->epoch, &o->augment);
  const size_t image_bytes = (size_t)(in->height * in->width * C);
  /* a synthetic sample is computed into `scratch`, then filled as a stored one */
  uint8_t *scratch = NULL;
  if (dataset->synthetic && count > 0 && !(scratch = malloc(image_bytes)))
    return bp_fail(BP_ERR_NOMEM, "out of memory for a synthetic sample of %zu bytes", image_bytes);
  for (int64_t i = 0; i < t->shape.n; i++) {
    bp_data_augment_draw d = {0, 0, 0};
    const uint8_t *src = NULL; /* NULL: an unused row, written 0 */
    if (i < count && scratch) {
      augment_plan_draw(&aug, indices[i], &d);
      bp_data_synthetic_sample_(dataset, indices[i], scratch, NULL);
      src = scratch;
    } else if (i < count) {
      augment_plan_draw(&aug, indices[i], &d);
      src = dataset->images + (size_t)indices[i] * image_bytes;
      /* the samples of a shuffled batch lie anywhere in the dataset: fetch
       * (the start of) the next one while this one is converted; this
       * halves the time of a batch of random 28x28 images */
      if (i + 1 < count) {
        const uint8_t *next = dataset->images + (size_t)indices[i + 1] * image_bytes;
        const size_t ahead = image_bytes < 4096 ? image_bytes : 4096;
        for (size_t b = 0; b < ahead; b += 64) __builtin_prefetch(next + b);
        __builtin_prefetch(next + ahead - 1);
      }
    }
    if (fp16) {
      uint16_t *out = (uint16_t *)images + i * g.s[0];
      if (dense)
        fill_dense_fp16(out, &g, src, &d, lut16);
      else
        fill_sample_fp16(out, &g, src, &d, lut16);
    } else {
      float *out = (float *)images + i * g.s[0];
      if (dense)
        fill_dense_fp32(out, &g, src, &d, lut);
      else
        fill_sample_fp32(out, &g, src, &d, lut);
    }
  }
  free(scratch);
  if (label_desc) {
    int32_t *lab = labels;
    for (int64_t i = 0; i < label_desc->shape.n; i++) {
      int32_t v = 0;
      if (i < count && dataset->synthetic)
        bp_data_synthetic_sample_(dataset, indices[i], NULL, &v);
      else if (i < count)
        v = dataset->labels[indices[i]];
      lab[i * label_desc->dev_stride[0]] = v;
    }
  }
  return BP_OK;
}
