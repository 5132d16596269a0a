/* Internal to the Winograd convolution module (ops/winograd): the
 * convolutions its kernels run, and the AVX2/FMA routines that compute
 * them (wino_avx2.c, the only file built with -mavx2 -mfma; module.c
 * refuses the module on a CPU without them). Nothing here is exported.
 *
 * The convolution: 3x3 filters, stride 1, padding 1, no dilation, one
 * group, FP32, NHWC with channels contiguous (channel stride 1); the
 * output has the input's height and width. By F(4x4,3x3) (README.md):
 *  - U = G g G^T, the filters transformed to 6x6 per (input channel ci,
 *    output channel co), laid out for the multiply as 36 positions p, each
 *    cin_pad x cout_pad in panels of WINO_NR output channels: U[p] holds
 *    panel j (output channels 16j..) as [cin_pad][width] at 16j*cin_pad
 *    (the last panel may be 8 wide; pad rows and columns are zero);
 *  - per block of up to WINO_BLOCK 4x4 output tiles: V = B^T d B of every
 *    tile's 6x6 input window into V[p][tile][cin_pad] (pad lanes zero),
 *    M[p] = V[p] U[p] (36 small GEMMs) into M[p][tile][cout_pad], then
 *    y = A^T M A (+ bias, or + the old y with accumulate) written to the
 *    output's logical elements only.
 * Each output element is computed by one block with the same operations
 * in the same order whatever thread runs it: the bits do not depend on
 * the thread count.
 *
 * The filter gradient (F(3x3,4x4)): per block of WINO_GRAD_BLOCK tiles, V
 * as above and Y = A e A^T of every tile's 4x4 dy window into
 * Y[p][tile][cout_pad]; mw[p] += V[p]^T Y[p], summed over the tiles in
 * order; dw = G^T mw G per (c, k). */
#ifndef BP_OPS_WINOGRAD_IMPL_H
#define BP_OPS_WINOGRAD_IMPL_H

#include <stdint.h>

#include "bp_abi.h"
#include "bp_abi_ops.h"
#include "bp_abi_sdk.h"

#define WINO_P 36  /* positions of a 6x6 transformed tile */
#define WINO_NR 16 /* output channels per panel of U (the micro-kernel's width) */
/* Tiles per block: a multiple of the micro-kernel's 6 rows. 6 to 36
 * measured the same within the noise here (V and M of a block live in L2
 * either way); 18 keeps them near 330 KB at 64 channels. */
#define WINO_BLOCK 18
/* Tiles per block of the filter gradient: each block adds its products
 * into the 36 cin x cout sums, so a longer block reads and writes them
 * less often; 64 and 96 measured slower than 32 (V and Y leave L2). */
#define WINO_GRAD_BLOCK 32
#define WINO_BLOCK_MAX 32 /* the scratch is sized for it */
#define WINO_POS_PAD 16   /* most floats after each position (wino_pos_floats) */
/* Fixed tile groups of the filter gradient, each summed into its own
 * partial sums, which are then added in group order: the bits do not
 * depend on the thread count. */
#define WINO_GRAD_GROUPS 8

/* Channels rounded up to the vector width. */
static inline int64_t wino_pad8(int64_t c) { return (c + 7) / 8 * 8; }

/* One convolution as the routines see it. src/dst strides are NHWC
 * element strides of n, h, w (channel stride 1). */
typedef struct wino_conv {
  int64_t n, h, w;                 /* images, rows, columns (input = output) */
  int64_t cin, cout;               /* logical channels */
  int64_t cin_pad, cout_pad;       /* rounded up to 8 */
  int64_t tiles_h, tiles_w, tiles; /* 4x4 output tiles: per column, per row, in all */
  const float *src;
  int64_t src_stride[3];
  float *dst;
  int64_t dst_stride[3];
  const float *bias; /* cout_pad floats (zero past cout), or NULL */
  int accumulate;    /* 1: dst += result */
  const float *u;    /* the transformed filters (wino_u_floats) */
  int64_t block;     /* tiles per block, 1..WINO_BLOCK_MAX */
  int64_t pos_pad;   /* floats after each position's tiles, 0..WINO_POS_PAD */
  /* filter gradient only: dy [n, h, w, cout] (dst is unused) */
  const float *grad;
  int64_t grad_stride[3];
} wino_conv;

/* Floats of U. */
static inline int64_t wino_u_floats(int64_t cin_pad, int64_t cout_pad) {
  return WINO_P * cin_pad * cout_pad;
}

/* Floats of one task's scratch: V and M (or V and the transformed dy) of
 * one block, then max(cin_pad, cout_pad) zeros (what pixels outside the
 * image read), in whole 64-byte lines. */
static inline int64_t wino_scratch_floats(int64_t cin_pad, int64_t cout_pad) {
  const int64_t zeros = cin_pad > cout_pad ? cin_pad : cout_pad;
  return ((int64_t)WINO_P * (WINO_BLOCK_MAX * (cin_pad + cout_pad) + 2 * WINO_POS_PAD) + zeros +
          15) / 16 * 16;
}

/* Floats between two positions of V, M or Y (c channels per tile): the
 * block's tiles and then pos_pad floats, so the 36 positions of one tile
 * do not fall into a few cache sets (a stride of a multiple of 256 bytes
 * would put them 8 or 16 to a set). */
static inline int64_t wino_pos_floats(const wino_conv *cv, int64_t c) {
  return cv->block * c + cv->pos_pad;
}

/* Transforms the filters of input channel ci: g holds its 3x3 taps for
 * every output channel, g[tap * cout_pad + co] (tap = ky*3 + kx, zero for
 * co >= cout); writes row ci of every position of U. */
void wino_filter_row(const float *g, int64_t ci, int64_t cin_pad, int64_t cout_pad, float *u);

/* Computes tiles [tile0, tile0 + count) (count <= cv->block) into cv->dst,
 * with scratch of wino_scratch_floats floats (64-byte aligned). */
void wino_block(const wino_conv *cv, int64_t tile0, int64_t count, float *scratch);

/* Filter gradient, F(3x3,4x4) (the transposed forward): for tiles
 * [tile0, tile0 + count) (count <= cv->block) of x (cv->src, cin
 * channels) and dy (cv->grad, cout channels) adds
 * (B^T d B)[p][c] * (A dy A^T)[p][k] summed over the tiles in order into
 * mw[p][c][k] (WINO_P x cin_pad x cout_pad floats), or writes that sum
 * there when `first` (every element of mw is written). */
void wino_grad_block(const wino_conv *cv, int64_t tile0, int64_t count, float *scratch, float *mw,
                     int first);

/* dw taps of input channel ci from the sums of `groups` partial mw
 * (added in order, `group_floats` apart): out[tap * cout_pad + k] =
 * (G^T M G)[ky][kx], tap = ky*3 + kx. */
void wino_grad_row(const float *mw, int groups, int64_t group_floats, int64_t ci,
                   int64_t cin_pad, int64_t cout_pad, float *out);

/* Priority 14: above ops/onednn (13), whose direct convolutions serve
 * what supports() here declines (the shapes where they measured faster). */
#define WINO_PRIORITY (BP_ABI_PRIORITY_LIBRARY + 4)

extern const bp_abi_kernel wino_conv2d_fwd, wino_conv2d_bwd_data, wino_conv2d_bwd_filter;

#endif
