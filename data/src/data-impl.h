/* Private to the data layer (data_idx.c, data_batch.c, data_loader.c). */
#ifndef BLUEPRINT_DATA_IMPL_H
#define BLUEPRINT_DATA_IMPL_H

#include <stdint.h>

#include "blueprint/data.h"

struct bp_dataset {
  bp_dataset_info info;
  uint8_t *images; /* info.count * H * W * C bytes, NHWC, owned; NULL when synthetic */
  uint8_t *labels; /* info.count bytes, each < info.classes, owned; NULL when synthetic */
  int synthetic;   /* 1: samples computed from (split, first + index) */
  int split;       /* synthetic: the bp_data_split of the stream keys */
  int64_t first;   /* synthetic: the stream index of sample 0 (subsets) */
};

/* ---- the generator (data_batch.c states it) ------------------------------ */

#define BP_DATA_GOLDEN 0x9E3779B97F4A7C15ULL

typedef struct bp_data_rng {
  uint64_t state;
} bp_data_rng;

static inline uint64_t bp_data_mix64_(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

static inline uint64_t bp_data_hash64_(uint64_t x) { return bp_data_mix64_(x + BP_DATA_GOLDEN); }

/* h(h(h(seed) ^ domain) ^ a): a stream key before its last hash with b. */
static inline uint64_t bp_data_stream_prefix_(uint64_t seed, uint64_t domain, uint64_t a) {
  return bp_data_hash64_(bp_data_hash64_(bp_data_hash64_(seed) ^ domain) ^ a);
}

static inline bp_data_rng bp_data_rng_stream_(uint64_t seed, uint64_t domain, uint64_t a,
                                              uint64_t b) {
  bp_data_rng r = {bp_data_hash64_(bp_data_stream_prefix_(seed, domain, a) ^ b)};
  return r;
}

static inline uint64_t bp_data_rng_next_(bp_data_rng *r) {
  r->state += BP_DATA_GOLDEN;
  return bp_data_mix64_(r->state);
}

/* Uniform in [0, n), n >= 1, rejecting draws below `threshold` = 2^64 mod n. */
static inline uint64_t bp_data_rng_below_t_(bp_data_rng *r, uint64_t n, uint64_t threshold) {
  for (;;) {
    uint64_t x = bp_data_rng_next_(r);
    if (x >= threshold) return x % n;
  }
}

/* Uniform in [0, n), n >= 1. */
static inline uint64_t bp_data_rng_below_(bp_data_rng *r, uint64_t n) {
  return bp_data_rng_below_t_(r, n, (0 - n) % n);
}

/* Stream domains: one per kind of draw, so no two kinds share a stream. */
enum {
  BP_DATA_DOMAIN_PERMUTATION = 1, /* a = epoch */
  BP_DATA_DOMAIN_CROP = 2,        /* a = epoch, b = sample index */
  BP_DATA_DOMAIN_FLIP = 3,        /* the same */
  BP_DATA_DOMAIN_SYNTH_IMAGE = 4, /* a = split, b = sample index: the pixel bytes */
  BP_DATA_DOMAIN_SYNTH_LABEL = 5, /* the same: the label */
};

/* Synthetic sample `index` (dataset_sample's index, before `first`): its
 * bytes into image (H*W*C, may be NULL) and its label (may be NULL). */
void bp_data_synthetic_sample_(const bp_dataset *d, int64_t index, uint8_t *image,
                               int32_t *label);

/* Allocates a dataset of `info`'s shape with uninitialized bytes. */
bp_status bp_dataset_alloc_(const bp_dataset_info *info, bp_dataset **dataset_out);

/* Checks that a fill of up to `rows` samples of a dataset shaped `info` into
 * (image_desc, images) and (label_desc, labels) stays inside the slots; the
 * checks bp_data_fill makes, minus the indices. `what` names the caller's
 * buffer in messages ("buffer A"). */
bp_status bp_data_check_targets_(const bp_dataset_info *info, int64_t rows, const char *what,
                                 const bp_dtensor *image_desc, const void *images,
                                 const bp_dtensor *label_desc, const void *labels);

/* Checks fill options against a dataset shaped `info` (norm, crop). */
bp_status bp_data_check_fill_options_(const bp_dataset_info *info,
                                      const bp_data_fill_options *options);

#endif
