/* conv2d backward-filter, direct AVX2/FMA kernel over NHWC (conv_bwf.c):
 *   dw[k, r, s, c] (+)= sum over n, oh, ow of dy[n, oh, ow, k] * x[n, ih, iw, c]
 *   with ih = oh*sh - ph + r, iw = ow*sw - pw + s (zero outside the image),
 *   db[k] (+)= sum over n, oh, ow of dy[n, oh, ow, k].
 * Groups 1, dilation 1, any kernel size, stride and padding; FP32.
 *
 * For a fixed filter row r and output pixel, the window x[n, ih, iw0 ..
 * iw0+kw-1, :] is kw*C contiguous floats, and so is dw[k, r, :, :]: each
 * pixel adds dy[k] times that window to the row. The kernel keeps a tile of
 * 4 filters x 3 vectors of a row in 12 registers and sweeps a few output
 * rows (a group that stays in L1) per visit: 12 FMAs per 3 loads and 4
 * broadcasts.
 *
 * Threads and bits: the images are cut into chunks whose size depends only
 * on the shape (bwf_plan_make); each chunk sums its images in order into a
 * partial of its own in the workspace, and the partials are added in chunk
 * order. A work item is one chunk for one block of filters (blocks only
 * for many filters; they write disjoint rows of the partial). The result
 * is the same for any thread count and schedule. */
#ifndef BP_OPS_ONEDNN_CONV_BWF_H
#define BP_OPS_ONEDNN_CONV_BWF_H

#include <stddef.h>
#include <stdint.h>

/* Filter rows (kw*C floats) shorter than this fill too little of a vector:
 * with k % 8 == 0 the kernel runs its vectors along the filters instead
 * (kvec); else a caller has better kernels for them. */
#define BWF_SHORT_ROW 16

typedef struct bwf_plan {
  int64_t n, h, w, c, k, oh, ow, kh, kw, sh, sw, ph, pw;
  int has_bias;
  int64_t len, lenp;     /* a filter row: kw*C floats; padded to whole vectors */
  int kvec;              /* rows shorter than BWF_SHORT_ROW (a first layer's
                            few channels) and k a multiple of 8: the vectors
                            run along the filters, the row's floats are
                            broadcast */
  int64_t group_rows;    /* output rows per visit of a tile */
  int64_t in_rows, wp;   /* the group's padded input rows: count, width in pixels */
  int64_t chunk_images, chunks;
  int64_t kblocks, items; /* filter blocks; work items = chunks * kblocks */
  size_t part_floats;    /* one chunk's partial dw: k * kh * lenp */
  size_t bias_floats;    /* one chunk's partial db: k rounded up to 8 */
  size_t xbuf_floats;    /* one item's padded input rows */
  size_t chunk_bytes;    /* one chunk's partials in the workspace (64-byte multiple) */
  size_t xbuf_bytes;     /* one item's xbuf in the workspace (64-byte multiple) */
} bwf_plan;

/* 1 when the kernel serves this shape on this CPU (AVX2 and FMA), else 0.
 * n..pw as in ops_conv_geom (groups 1, dilation 1 assumed checked). */
int bwf_plan_make(bwf_plan *p, int64_t n, int64_t h, int64_t w, int64_t c, int64_t k,
                  int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                  int64_t ph, int64_t pw, int has_bias);

/* Workspace bytes (64-byte aligned base assumed). */
uint64_t bwf_workspace_bytes(const bwf_plan *p);

/* Work item i of [0, p->items): its part of a chunk's partial dw (and db)
 * from x and dy. */
void bwf_item(const bwf_plan *p, const float *x, const float *dy, void *ws, int64_t i);

/* Part i of [0, parts) of dw's elements (and db's): the chunks' partials
 * added in chunk order, into dw (db) or onto it when accumulate. */
void bwf_reduce(const bwf_plan *p, const void *ws, float *dw, float *db, int accumulate,
                int64_t i, int64_t parts);

/* Overrides the output rows per group and the images per chunk (values
 * <= 0 keep bwf_plan_make's): for bench/conv_bwf.c only. */
void bwf_plan_tune(bwf_plan *p, int64_t group_rows, int64_t chunk_images);

#endif
