/* Synthetic data (data.h, "synthetic data") and the one entry that opens
 * whatever a --data value names. A synthetic dataset stores nothing: sample
 * i of split s is computed when a batch is filled, from two streams of
 * data_batch.c's generator keyed by (s, first + i) under the fixed data key
 * 0: domain 4 gives the pixel bytes (draw k is bytes 8k..8k+7, least
 * significant first), domain 5 the label (a bounded draw in [0, classes)). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data-impl.h"

#define SYNTH_KEY 0 /* the data's own key: never the run's seed */

void bp_data_synthetic_sample_(const bp_dataset *d, int64_t index, uint8_t *image,
                               int32_t *label) {
  const uint64_t stream = (uint64_t)(d->first + index);
  if (image) {
    const size_t n = (size_t)(d->info.height * d->info.width * d->info.channels);
    bp_data_rng r =
        bp_data_rng_stream_(SYNTH_KEY, BP_DATA_DOMAIN_SYNTH_IMAGE, (uint64_t)d->split, stream);
    size_t k = 0;
    for (; k + 8 <= n; k += 8) {
      const uint64_t x = bp_data_rng_next_(&r);
      for (int b = 0; b < 8; b++) image[k + (size_t)b] = (uint8_t)(x >> (8 * b));
    }
    if (k < n) {
      const uint64_t x = bp_data_rng_next_(&r);
      for (int b = 0; k < n; k++, b++) image[k] = (uint8_t)(x >> (8 * b));
    }
  }
  if (label) {
    bp_data_rng r =
        bp_data_rng_stream_(SYNTH_KEY, BP_DATA_DOMAIN_SYNTH_LABEL, (uint64_t)d->split, stream);
    *label = (int32_t)bp_data_rng_below_(&r, (uint64_t)d->info.classes);
  }
}

bp_status bp_dataset_sample(const bp_dataset *dataset, int64_t index, uint8_t *image_out,
                            int32_t *label_out) {
  if (!dataset) return bp_fail(BP_ERR_INVALID, "bp_dataset_sample: NULL dataset");
  const bp_dataset_info *in = &dataset->info;
  if (index < 0 || index >= in->count)
    return bp_fail(BP_ERR_INVALID, "sample index %lld is outside the %lld samples",
                   (long long)index, (long long)in->count);
  if (dataset->synthetic) {
    bp_data_synthetic_sample_(dataset, index, image_out, label_out);
    return BP_OK;
  }
  const size_t per = (size_t)(in->height * in->width * in->channels);
  if (image_out) memcpy(image_out, dataset->images + (size_t)index * per, per);
  if (label_out) *label_out = dataset->labels[index];
  return BP_OK;
}

/* ---- parsing ------------------------------------------------------------------ */

int bp_data_is_synthetic(const char *data) {
  const size_t n = strlen(BP_DATA_SYNTHETIC);
  return data && strncmp(data, BP_DATA_SYNTHETIC, n) == 0 && (data[n] == '\0' || data[n] == ':');
}

/* A decimal number of 1 to 10 digits in [1, max] at *p, which moves past it. */
static int read_count(const char **p, int64_t max, int64_t *out) {
  int64_t v = 0;
  int digits = 0;
  while (**p >= '0' && **p <= '9' && digits < 11) {
    v = v * 10 + (**p - '0');
    (*p)++;
    digits++;
  }
  if (digits == 0 || digits > 10 || v < 1 || v > max) return -1;
  *out = v;
  return 0;
}

bp_status bp_data_synthetic_parse(const char *data, bp_data_synthetic_spec *spec_out) {
  static const char form[] =
      "expected synthetic, synthetic:HxWxC or synthetic:HxWxC:CLASSES (e.g. "
      "synthetic:224x224x3:1000)";
  if (!spec_out) return bp_fail(BP_ERR_INVALID, "bp_data_synthetic_parse: NULL argument");
  if (!bp_data_is_synthetic(data))
    return bp_fail(BP_ERR_INVALID, "data '%.64s' is not synthetic data: %s", data ? data : "(null)",
                   form);
  bp_data_synthetic_spec s = {0, 0, 0, 0};
  const char *p = data + strlen(BP_DATA_SYNTHETIC);
  if (*p == '\0') {
    *spec_out = s;
    return BP_OK;
  }
  p++; /* ':' */
  if (read_count(&p, BP_DATA_SYNTHETIC_MAX_DIM, &s.height) != 0 || *p++ != 'x' ||
      read_count(&p, BP_DATA_SYNTHETIC_MAX_DIM, &s.width) != 0 || *p++ != 'x' ||
      read_count(&p, BP_DATA_MAX_CHANNELS, &s.channels) != 0)
    return bp_fail(BP_ERR_INVALID,
                   "data '%.64s': the image shape is not HxWxC with H and W in [1, %d] and C in "
                   "[1, %d]: %s",
                   data, BP_DATA_SYNTHETIC_MAX_DIM, BP_DATA_MAX_CHANNELS, form);
  if (*p == ':') {
    p++;
    if (read_count(&p, BP_DATA_SYNTHETIC_MAX_CLASSES, &s.classes) != 0 || *p != '\0')
      return bp_fail(BP_ERR_INVALID, "data '%.64s': the classes are not an integer in [1, %d]: %s",
                     data, BP_DATA_SYNTHETIC_MAX_CLASSES, form);
  } else if (*p != '\0') {
    return bp_fail(BP_ERR_INVALID, "data '%.64s': unexpected '%.16s' after the shape: %s", data, p,
                   form);
  }
  *spec_out = s;
  return BP_OK;
}

/* ---- datasets -------------------------------------------------------------------- */

bp_status bp_dataset_synthetic(const bp_dataset_info *info, bp_data_split split,
                               bp_dataset **dataset_out) {
  if (!info || !dataset_out) return bp_fail(BP_ERR_INVALID, "bp_dataset_synthetic: NULL argument");
  if (split != BP_DATA_TRAIN && split != BP_DATA_TEST)
    return bp_fail(BP_ERR_INVALID, "unknown data split %d", (int)split);
  if (info->count < 1 || info->height < 1 || info->height > BP_DATA_SYNTHETIC_MAX_DIM ||
      info->width < 1 || info->width > BP_DATA_SYNTHETIC_MAX_DIM || info->channels < 1 ||
      info->channels > BP_DATA_MAX_CHANNELS || info->classes < 1)
    return bp_fail(BP_ERR_INVALID,
                   "synthetic data of %lld images of %lldx%lldx%lld, %d classes: counts must be "
                   ">= 1, H and W at most %d, C at most %d",
                   (long long)info->count, (long long)info->height, (long long)info->width,
                   (long long)info->channels, info->classes, BP_DATA_SYNTHETIC_MAX_DIM,
                   BP_DATA_MAX_CHANNELS);
  bp_dataset *d = calloc(1, sizeof *d);
  if (!d) return bp_fail(BP_ERR_NOMEM, "out of memory creating a dataset");
  d->info = *info;
  d->synthetic = 1;
  d->split = (int)split;
  d->first = 0;
  *dataset_out = d;
  return BP_OK;
}

bp_status bp_dataset_open(const char *data, bp_data_split split, const bp_dataset_info *model,
                          bp_dataset **dataset_out) {
  if (!bp_data_is_synthetic(data)) return bp_dataset_load_mnist(data, split, dataset_out);
  if (!model || !dataset_out) return bp_fail(BP_ERR_INVALID, "bp_dataset_open: NULL argument");
  bp_data_synthetic_spec s;
  bp_status st = bp_data_synthetic_parse(data, &s);
  if (st != BP_OK) return st;
  bp_dataset_info info = *model;
  if (s.height) {
    info.height = s.height;
    info.width = s.width;
    info.channels = s.channels;
  }
  if (s.classes) info.classes = (int)s.classes;
  if (split == BP_DATA_TEST) info.count = BP_DATA_SYNTHETIC_TEST_COUNT;
  return bp_dataset_synthetic(&info, split, dataset_out);
}
