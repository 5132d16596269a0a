/* Datasets and batches: the IDX reader (MNIST, Fashion-MNIST), per-channel
 * normalization, a seeded permutation per epoch, sharding of each global
 * batch across ranks, augmentation, batch filling into the arena's input
 * double buffers (I_A, I_B) and a loader that fills them (a thread one
 * batch ahead, or inline in the consumer's thread).
 *
 * Determinism. Every random decision is a pure function of the run seed and
 * of counters, never of threads or timing:
 *  - the permutation of epoch e is f(seed, e) (Fisher-Yates driven by a
 *    counter-based SplitMix64 stream, see bp_data_permutation);
 *  - the augmentation of a sample is f(seed, e, sample index), where the
 *    index is the sample's position in the dataset, not in a batch, so the
 *    same sample gets the same crop and flip on any rank, in any buffer, at
 *    any batch position, whatever the thread that fills it.
 * The whole "RNG state" of the data pipeline is therefore (seed, epoch,
 * step): a checkpoint stores those and resumes exactly.
 *
 * Sharding (docs/architecture.md, "Ranks and sharding"). An epoch of n samples runs
 * steps = ceil(n / B) global batches of B samples (floor with drop_last);
 * step s takes positions [s*B, min((s+1)*B, n)) of the epoch's permutation.
 * A global batch of b samples (b = B, or the shorter last batch) is split
 * over R ranks in rank order by one rule: rank r takes
 *     b / R + (r < b % R ? 1 : 0)
 * samples starting at position r * (b / R) + min(r, b % R) of the batch, so
 * the first (b mod R) ranks take one more. The ranks' slices are disjoint,
 * adjacent, in rank order, and cover the batch exactly once. A full batch
 * therefore runs per-rank batches of ceil(B/R) and floor(B/R) samples; the
 * last partial batch of an epoch is split by the same rule, and when it
 * holds fewer samples than ranks, ranks r >= b get 0 samples (they still take
 * the step, so collective operations stay in lockstep; use drop_last when an
 * empty batch cannot run). Each distinct per-rank batch size is a plan
 * variant with the same offsets; nothing is re-planned.
 *
 * Status of a bad file (the message names the file and what is wrong):
 *  BP_ERR_IO        missing or unreadable file, a directory, a read error
 *  BP_ERR_PARSE     wrong magic, truncated data (fewer bytes than the header
 *                   promises), trailing bytes, corrupt gzip data, a label
 *                   out of range, a zero extent in the header
 *  BP_ERR_SHAPE     image count != label count ("mislabeled count")
 *  BP_ERR_OVERFLOW  absurd dimensions (a product that does not fit in 64
 *                   bits or exceeds BP_IDX_MAX_BYTES); checked before any
 *                   allocation, and the data buffer only grows as bytes
 *                   actually arrive
 *  BP_ERR_UNSUPPORTED more channels than BP_DATA_MAX_CHANNELS */
#ifndef BLUEPRINT_DATA_H
#define BLUEPRINT_DATA_H

#include <stdint.h>

#include "blueprint/dtensor.h"
#include "blueprint/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where Debian's dataset-fashion-mnist package installs its four files. */
#ifndef BP_DATA_DEFAULT_DIR
#define BP_DATA_DEFAULT_DIR "/usr/share/datasets/fashion-mnist"
#endif

#define BP_DATA_MAX_CHANNELS 16          /* channels of an image, at most */
#define BP_IDX_MAX_BYTES (1ULL << 40)    /* data bytes one IDX file may hold */

/* Per-pixel mean and std of the Fashion-MNIST training set, pixels scaled to
 * [0, 1] (bp_dataset_stats on the 60000 training images gives 0.28604 and
 * 0.35302). */
#define BP_FASHION_MNIST_MEAN 0.2860f
#define BP_FASHION_MNIST_STD 0.3530f

/* ---- datasets --------------------------------------------------------- */

typedef struct bp_dataset bp_dataset; /* opaque; immutable once created */

/* Shape of a dataset: `count` images of height x width x channels bytes
 * (NHWC, compact) and one label per image in [0, classes). */
typedef struct bp_dataset_info {
  int64_t count;
  int64_t height, width, channels;
  int classes;
} bp_dataset_info;

typedef enum bp_data_split {
  BP_DATA_TRAIN = 0, /* train-images-idx3-ubyte, train-labels-idx1-ubyte */
  BP_DATA_TEST = 1,  /* t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte */
} bp_data_split;

/* Reads an IDX image file and its IDX label file. Each may be gzip'd or
 * plain (zlib reads both). Images: magic 0x00000803 (count, rows, cols;
 * one channel) or 0x00000804 (count, rows, cols, channels); labels: magic
 * 0x00000801 (count); dimensions big-endian uint32, then unsigned bytes.
 * `classes` > 0 bounds the labels (a label >= classes is an error);
 * 0 takes max label + 1. The paths are borrowed. */
bp_status bp_dataset_load_idx(const char *images_path, const char *labels_path, int classes,
                              bp_dataset **dataset_out);
/* Reads an IDX image file alone (the same formats and checks, no label
 * file), for inference on unlabeled images: every label 0, classes 1. */
bp_status bp_dataset_load_idx_images(const char *images_path, bp_dataset **dataset_out);
/* The same, reading only the first `limit` images when limit > 0 and the
 * file holds more (its header is still checked; the bytes after them are
 * not read, so a file that inflates to gigabytes costs `limit` images). */
bp_status bp_dataset_load_idx_images_first(const char *images_path, int64_t limit,
                                           bp_dataset **dataset_out);

/* Reads one split of an MNIST-format directory: the four standard file
 * names, each as NAME.gz or else NAME. `dir` NULL means
 * BP_DATA_DEFAULT_DIR (Fashion-MNIST). Ten classes. */
bp_status bp_dataset_load_mnist(const char *dir, bp_data_split split, bp_dataset **dataset_out);

/* A dataset from memory: copies info->count * height * width * channels
 * image bytes and info->count labels (each < info->classes). Borrowed. */
bp_status bp_dataset_create(const bp_dataset_info *info, const uint8_t *images,
                            const uint8_t *labels, bp_dataset **dataset_out);

/* A copy of samples [first, first + count) (e.g. a subset for a short CI run). */
bp_status bp_dataset_subset(const bp_dataset *dataset, int64_t first, int64_t count,
                            bp_dataset **dataset_out);

void bp_dataset_destroy(bp_dataset *dataset); /* NULL is a no-op */

/* Borrowed; valid until the dataset is destroyed. */
const bp_dataset_info *bp_dataset_get_info(const bp_dataset *dataset);
/* count*H*W*C, NHWC; NULL for a synthetic dataset (bp_dataset_sample) */
const uint8_t *bp_dataset_images(const bp_dataset *dataset);
/* count; NULL for a synthetic dataset (bp_dataset_sample) */
const uint8_t *bp_dataset_labels(const bp_dataset *dataset);

/* Sample `index` of any dataset: its H*W*C bytes (NHWC) into image_out and
 * its label into *label_out; either output may be NULL. */
bp_status bp_dataset_sample(const bp_dataset *dataset, int64_t index, uint8_t *image_out,
                            int32_t *label_out);

/* ---- synthetic data --------------------------------------------------- */

/* Synthetic data, for speed runs (`--data synthetic[:HxWxC:CLASSES]`):
 * every pixel byte uniform in [0, 255], every label uniform in
 * [0, classes). Sample i of a split is a pure function of (split, i): its
 * bytes are draws of a SplitMix64 stream keyed by the split and i alone
 * (domains 4 and 5 of data_batch.c's generator, under the fixed data key
 * 0, never the run's seed), so every run, every rank layout, every batch
 * and every resume sees the same bits, and `eval` sees the test set
 * `train` saw. Nothing is stored: a batch fill computes its samples. */
#define BP_DATA_SYNTHETIC "synthetic"
#define BP_DATA_SYNTHETIC_TEST_COUNT 10000 /* samples of the test split */
#define BP_DATA_SYNTHETIC_MAX_DIM 65536    /* H and W at most */
#define BP_DATA_SYNTHETIC_MAX_CLASSES 2147483647

/* 1 when `data` (a --data value) names synthetic data: "synthetic" or
 * "synthetic:..." (a directory of that name is reached as ./synthetic). */
int bp_data_is_synthetic(const char *data);

/* What "synthetic", "synthetic:HxWxC" or "synthetic:HxWxC:CLASSES" asks
 * for; 0 where the value is left to the model. */
typedef struct bp_data_synthetic_spec {
  int64_t height, width, channels;
  int64_t classes;
} bp_data_synthetic_spec;

/* Parses a synthetic data value; BP_ERR_INVALID with one line naming the
 * part that is wrong. */
bp_status bp_data_synthetic_parse(const char *data, bp_data_synthetic_spec *spec_out);

/* A synthetic dataset of info->count samples of info's shape and classes
 * (1 to BP_DATA_SYNTHETIC_MAX_CLASSES; labels are not bytes here). Its
 * statistics (bp_dataset_stats) are the exact ones of uniform bytes:
 * mean 0.5, std sqrt(65535 / 12) / 255 per channel. */
bp_status bp_dataset_synthetic(const bp_dataset_info *info, bp_data_split split,
                               bp_dataset **dataset_out);

/* The data set a run names by its --data value `data`: NULL is
 * Fashion-MNIST (BP_DATA_DEFAULT_DIR), a synthetic value
 * (bp_data_is_synthetic) a synthetic dataset, anything else an
 * MNIST-format directory. `model` gives the synthetic defaults: its height,
 * width, channels and classes where the value leaves them out, and its
 * count is the training split's size (the test split has
 * BP_DATA_SYNTHETIC_TEST_COUNT). */
bp_status bp_dataset_open(const char *data, bp_data_split split, const bp_dataset_info *model,
                          bp_dataset **dataset_out);

/* ---- normalization ---------------------------------------------------- */

/* A pixel p of channel c becomes (p / 255 - mean[c]) / std[c]. */
typedef struct bp_data_norm {
  int channels;                      /* entries used; equals the dataset's */
  float mean[BP_DATA_MAX_CHANNELS];
  float std[BP_DATA_MAX_CHANNELS];   /* each > 0 */
} bp_data_norm;

/* Per-channel mean and population std of every pixel of `dataset`, scaled to
 * [0, 1] (compute it on the training set, use it for both splits). Exact up
 * to float rounding: it counts byte values, then sums in double. */
bp_status bp_dataset_stats(const bp_dataset *dataset, bp_data_norm *norm_out);

/* ---- permutation and sharding ----------------------------------------- */

/* perm_out[0..n) = the order of epoch `epoch`: a uniform permutation of
 * 0..n-1 drawn by Durstenfeld's Fisher-Yates (for i = n-1 down to 1, swap i
 * with j uniform in [0, i]) from a SplitMix64 stream keyed by (seed, epoch)
 * and unbiased by rejection; identity when `shuffle` is 0. The same
 * (seed, epoch, n) gives the same permutation on every machine. */
bp_status bp_data_permutation(uint64_t seed, uint64_t epoch, int shuffle, int64_t n,
                              int64_t *perm_out);

/* Global batches in an epoch of n samples: ceil(n / B), or floor(n / B) with
 * drop_last. 0 for invalid arguments. */
int64_t bp_data_steps_per_epoch(int64_t n, int64_t global_batch, int drop_last);

/* Rank `rank`'s slice of a global batch of `count` samples: first
 * count / world + (rank < count % world) samples at *offset_out (relative to
 * the batch). BP_ERR_INVALID unless count >= 0 and 0 <= rank < world. */
bp_status bp_data_shard(int64_t count, int world, int rank, int64_t *offset_out,
                        int64_t *count_out);

/* Samples a rank receives at most per step: ceil(B / world). Size the
 * per-rank image and label tensors (the training variant) with it. */
int64_t bp_data_rank_capacity(int64_t global_batch, int world);

/* Where step `step` of an epoch puts rank `rank`'s samples. */
typedef struct bp_data_slice {
  int64_t first;        /* position in the epoch permutation of its first sample */
  int64_t count;        /* its samples (0 allowed, see Sharding above) */
  int64_t global_count; /* samples of the whole step, all ranks */
} bp_data_slice;

bp_status bp_data_step_slice(int64_t n, int64_t global_batch, int drop_last, int64_t step,
                             int world, int rank, bp_data_slice *slice_out);

/* ---- augmentation ----------------------------------------------------- */

typedef struct bp_data_augment {
  int crop_pad; /* random crop: pad each side by this many zero pixels (raw
                   value 0, i.e. before normalization, as torchvision's
                   RandomCrop(padding=P) before Normalize), then crop back to
                   H x W at a uniform offset; 0: off */
  int flip;     /* horizontal flip with probability 1/2 (after the crop); 0: off */
} bp_data_augment;

/* The draw of one sample: out(y, x) = in(y + dy, x + dx), zero outside the
 * image, then x -> W - 1 - x when flip. dy, dx uniform in [-P, P]. */
typedef struct bp_data_augment_draw {
  int dy, dx;
  int flip;
} bp_data_augment_draw;

/* The draw for sample `index` of epoch `epoch` (all zero when `augment` is
 * NULL or off). A pure function of its arguments. */
void bp_data_augment_params(uint64_t seed, uint64_t epoch, int64_t index,
                            const bp_data_augment *augment, bp_data_augment_draw *draw_out);

/* ---- batch filling ---------------------------------------------------- */

typedef struct bp_data_fill_options {
  const bp_data_norm *norm; /* borrowed; NULL: p / 255 (no normalization) */
  bp_data_augment augment;
  uint64_t seed, epoch;     /* the augmentation draws; ignored when off */
} bp_data_fill_options;

/* Writes samples indices[0..count) of `dataset` as rows 0..count-1 of an
 * image tensor and a label tensor.
 *
 * images: `image_desc` NHWC [n >= count, H, W, C] of the dataset's H, W, C,
 *   FP32 or FP16 (rounded to nearest even); element (i, y, x, c) is written
 *   at images + (i*s0 + y*s1 + x*s2 + c*s3) elements with s = dev_stride
 *   (the arena layout), channels C..padded_c-1 are written 0, rows
 *   count..n-1 are written 0 entirely. Every byte written lies inside
 *   image_desc->slot_bytes (checked). Overwrites; no read.
 * labels: `label_desc` INT32 [n >= count, 1, 1, 1]; label i at
 *   labels + i * dev_stride[0]; rows count..n-1 get 0. May be NULL (both
 *   label_desc and labels) to skip labels.
 * The buffers are host memory, borrowed, and must not overlap. Validates
 * every argument (indices in range, shapes, dtypes, strides within the
 * slot) before writing anything. Thread-safe for disjoint buffers. */
bp_status bp_data_fill(const bp_dataset *dataset, const int64_t *indices, int64_t count,
                       const bp_data_fill_options *options, const bp_dtensor *image_desc,
                       void *images, const bp_dtensor *label_desc, void *labels);

/* ---- the loader (a prefetch thread, or inline) ------------------------- */

typedef struct bp_data_loader bp_data_loader; /* opaque */

typedef struct bp_data_loader_options {
  int64_t global_batch;       /* B: samples per step over all ranks, >= 1 */
  int world;                  /* ranks, >= 1 */
  int rank;                   /* this loader's rank, [0, world) */
  uint64_t seed;              /* run seed */
  int shuffle;                /* 1: a new permutation each epoch; 0: file order */
  int drop_last;              /* 1: drop the last partial batch of each epoch */
  bp_data_augment augment;
  const bp_data_norm *norm;   /* copied at create; NULL: p / 255 */
  int64_t first_epoch;        /* where to start (resume): epoch ... */
  int64_t first_step;         /* ... and step within it, < steps per epoch */
  int64_t epochs;             /* epochs to deliver from first_epoch; 0: no end */
  int inline_fill;            /* 1: no thread; next() fills each batch in the
                                 caller's thread (when every core already runs
                                 a rank, a prefetch thread only preempts one) */
} bp_data_loader_options;

/* One of the two input buffers (I_A or I_B of a rank): host pointers and
 * their descriptors (the training variant's: n >= ceil(B / world)). */
typedef struct bp_data_buffer {
  void *images;                 /* borrowed; written by the loader */
  const bp_dtensor *image_desc; /* copied at create */
  void *labels;                 /* borrowed; NULL to skip labels */
  const bp_dtensor *label_desc; /* copied at create; NULL with labels */
} bp_data_buffer;

/* What bp_data_loader_next hands over. */
typedef struct bp_data_batch {
  int buffer;            /* 0: buffer A, 1: buffer B; batch k (from 0) is in k % 2 */
  int64_t count;         /* this rank's samples, rows 0..count-1 (may be 0) */
  int64_t global_count;  /* samples of this step over all ranks */
  int64_t epoch;
  int64_t step;          /* within the epoch */
  int64_t steps;         /* steps per epoch */
  int64_t first;         /* permutation position of this rank's first sample */
  const int64_t *indices;/* the dataset indices of rows 0..count-1; borrowed,
                            valid until the next call */
  int last_in_epoch;     /* 1 on an epoch's last step */
  int done;              /* 1: every requested epoch was delivered; nothing
                            else is set (buffer -1, count 0) */
} bp_data_batch;

/* Starts a thread that fills buffers[0] (A) and buffers[1] (B) in turn, one
 * batch ahead of the consumer. `dataset` is borrowed and must outlive the
 * loader; `options` and the descriptors are copied; the buffers are borrowed.
 * Validates everything a fill needs up front. */
bp_status bp_data_loader_create(const bp_dataset *dataset, const bp_data_loader_options *options,
                                const bp_data_buffer buffers[2], bp_data_loader **loader_out);

/* Hands back the buffer the previous call returned (the loader may now
 * refill it) and waits for the next batch. The consumer owns the returned
 * buffer until its next call to bp_data_loader_next (or _release); it must
 * have finished reading the buffer (device copies included) by then.
 * Returns the loader thread's failure, if any, once the batches before it
 * are consumed. Call from one consumer thread. Inline: fills the next
 * batch first, in this thread (the same batches, buffers and bytes). */
bp_status bp_data_loader_next(bp_data_loader *loader, bp_data_batch *batch_out);

/* Hands back the held buffer early (optional; next() does it too). */
void bp_data_loader_release(bp_data_loader *loader);

/* Stops the thread (waking it if it waits), joins it and frees everything.
 * NULL is a no-op. */
void bp_data_loader_destroy(bp_data_loader *loader);

#ifdef __cplusplus
}
#endif
#endif
