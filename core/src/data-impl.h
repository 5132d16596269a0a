/* Private to the data layer (data_idx.c, data_batch.c, data_loader.c). */
#ifndef BLUEPRINT_DATA_IMPL_H
#define BLUEPRINT_DATA_IMPL_H

#include "blueprint/data.h"

struct bp_dataset {
  bp_dataset_info info;
  uint8_t *images; /* info.count * H * W * C bytes, NHWC, owned */
  uint8_t *labels; /* info.count bytes, each < info.classes, owned */
};

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
