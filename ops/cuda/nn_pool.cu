/* maxpool, avgpool and global_avgpool, forward and backward, on the device.
 * Geometry as ops/shared/pool_check.h: window (oh, ow) covers input rows
 * oh*sh - ph + ky (ky < kh) and columns ow*sw - pw + kx (kx < kw); rows and
 * columns outside the input are padding (pad < kernel, so every window has
 * an in-bounds tap).
 *
 * Every kernel: one thread per output element in a grid-stride loop over
 * the logical elements (c fastest), block CUDA_BLOCK, grid
 * cuda_grid_for(count), no shared memory, no atomics.
 *  - Forwards visit the in-bounds taps of their window in the reference's
 *    row-major order with the reference's rule (elem_math.h): the same
 *    max, tie-break, NaN and mask (tap ky*kw + kx, int8), and the same
 *    double sum for the averages: bit-identical to ops/reference/pool.c.
 *  - Backwards gather instead of scattering: each dx element walks the
 *    windows that cover it in output order (oh, then ow, ascending), which
 *    is the order in which the reference's scatter adds into it, and adds
 *    in float from 0 (an all-FP32 call with accumulate: from the old dx,
 *    as the reference; with an FP16 dx or dy the sum is added once, as
 *    the reference's FP16 adapter), so the bits equal the reference's and no two threads
 *    write one element. Max pool adds dy where the window's mask names
 *    this element's tap; a mask value that names no in-bounds tap (which
 *    the reference refuses before writing) names no element here and is
 *    dropped, since a kernel cannot report on the device.
 *  - global_avgpool.fwd: one thread per (n, c), H*W summed in double in
 *    (h, w) order as the reference. */
#include "nn-device.cuh"

/* Outputs [o0, o1] whose windows cover input index i along one side
 * (empty when o0 > o1). */
__device__ __forceinline__ void nn_covering(int64_t i, int64_t stride, int64_t pad, int64_t kernel,
                                            int64_t outputs, int64_t *o0, int64_t *o1) {
  /* o*stride - pad <= i < o*stride - pad + kernel */
  const int64_t lo = i + pad - kernel; /* o*stride > lo */
  *o0 = lo < 0 ? 0 : lo / stride + 1;
  const int64_t hi = (i + pad) / stride; /* i + pad >= 0 */
  *o1 = hi < outputs - 1 ? hi : outputs - 1;
}

__global__ void nn_maxpool_fwd_k(cuda_pool g, cuda_nhwc x, const void *px, cuda_nhwc y, void *py,
                                 cuda_nhwc mask, int8_t *pmask) {
  NN_GRID_LOOP(i, nn_count(&y)) {
    int64_t n, oh, ow, c, ky0, ky1, kx0, kx1;
    nn_coords(&y, i, &n, &oh, &ow, &c);
    bp_pool_taps(oh, g.sh, g.ph, g.kh, x.h, &ky0, &ky1);
    bp_pool_taps(ow, g.sw, g.pw, g.kw, x.w, &kx0, &kx1);
    float best = 0.0f;
    int64_t arg = -1;
    for (int64_t ky = ky0; ky < ky1; ky++)
      for (int64_t kx = kx0; kx < kx1; kx++) {
        const int64_t ih = oh * g.sh - g.ph + ky, iw = ow * g.sw - g.pw + kx;
        const float v = nn_ld(px, x.fp16, nn_off(&x, n, ih, iw, c));
        if (arg < 0 || bp_maxpool_takes(v, best)) {
          best = v;
          arg = ky * g.kw + kx;
        }
      }
    nn_st(py, y.fp16, nn_off(&y, n, oh, ow, c), best);
    pmask[nn_off(&mask, n, oh, ow, c)] = (int8_t)arg;
  }
}

__global__ void nn_maxpool_bwd_k(cuda_pool g, cuda_nhwc dy, const void *pdy, cuda_nhwc mask,
                                 const int8_t *pmask, cuda_nhwc dx, void *pdx, int accumulate) {
  NN_GRID_LOOP(i, nn_count(&dx)) {
    int64_t n, ih, iw, c, oh0, oh1, ow0, ow1;
    nn_coords(&dx, i, &n, &ih, &iw, &c);
    nn_covering(ih, g.sh, g.ph, g.kh, dy.h, &oh0, &oh1);
    nn_covering(iw, g.sw, g.pw, g.kw, dy.w, &ow0, &ow1);
    const int64_t at = nn_off(&dx, n, ih, iw, c);
    /* all FP32: add onto the old dx as the reference; with an FP16 tensor
     * (the reference's FP16 adapter): the sum from 0, added once (nn_st_acc) */
    const int from_old = accumulate && !dx.fp16 && !dy.fp16;
    float acc = from_old ? nn_ld(pdx, 0, at) : 0.0f;
    for (int64_t oh = oh0; oh <= oh1; oh++) {
      const int64_t ky = ih - (oh * g.sh - g.ph);
      for (int64_t ow = ow0; ow <= ow1; ow++) {
        const int64_t kx = iw - (ow * g.sw - g.pw);
        if ((int64_t)pmask[nn_off(&mask, n, oh, ow, c)] == ky * g.kw + kx)
          acc += nn_ld(pdy, dy.fp16, nn_off(&dy, n, oh, ow, c));
      }
    }
    nn_st_acc(pdx, dx.fp16, at, acc, accumulate && !from_old);
  }
}

/* The divisor of window (oh, ow): the whole window, or its in-bounds taps. */
__device__ __forceinline__ double nn_avg_divisor(const cuda_pool *g, int64_t ky0, int64_t ky1,
                                                 int64_t kx0, int64_t kx1) {
  return g->count_include_pad ? (double)(g->kh * g->kw) : (double)((ky1 - ky0) * (kx1 - kx0));
}

__global__ void nn_avgpool_fwd_k(cuda_pool g, cuda_nhwc x, const void *px, cuda_nhwc y,
                                 void *py) {
  NN_GRID_LOOP(i, nn_count(&y)) {
    int64_t n, oh, ow, c, ky0, ky1, kx0, kx1;
    nn_coords(&y, i, &n, &oh, &ow, &c);
    bp_pool_taps(oh, g.sh, g.ph, g.kh, x.h, &ky0, &ky1);
    bp_pool_taps(ow, g.sw, g.pw, g.kw, x.w, &kx0, &kx1);
    double sum = 0.0;
    for (int64_t ky = ky0; ky < ky1; ky++)
      for (int64_t kx = kx0; kx < kx1; kx++)
        sum += nn_ld(px, x.fp16, nn_off(&x, n, oh * g.sh - g.ph + ky, ow * g.sw - g.pw + kx, c));
    nn_st(py, y.fp16, nn_off(&y, n, oh, ow, c),
          bp_avg_of(sum, nn_avg_divisor(&g, ky0, ky1, kx0, kx1)));
  }
}

__global__ void nn_avgpool_bwd_k(cuda_pool g, cuda_nhwc dy, const void *pdy, cuda_nhwc dx,
                                 void *pdx, int accumulate) {
  NN_GRID_LOOP(i, nn_count(&dx)) {
    int64_t n, ih, iw, c, oh0, oh1, ow0, ow1;
    nn_coords(&dx, i, &n, &ih, &iw, &c);
    nn_covering(ih, g.sh, g.ph, g.kh, dy.h, &oh0, &oh1);
    nn_covering(iw, g.sw, g.pw, g.kw, dy.w, &ow0, &ow1);
    const int64_t at = nn_off(&dx, n, ih, iw, c);
    const int from_old = accumulate && !dx.fp16 && !dy.fp16;
    float acc = from_old ? nn_ld(pdx, 0, at) : 0.0f;
    for (int64_t oh = oh0; oh <= oh1; oh++) {
      int64_t ky0, ky1;
      bp_pool_taps(oh, g.sh, g.ph, g.kh, dx.h, &ky0, &ky1);
      for (int64_t ow = ow0; ow <= ow1; ow++) {
        int64_t kx0, kx1;
        bp_pool_taps(ow, g.sw, g.pw, g.kw, dx.w, &kx0, &kx1);
        acc += bp_avg_of(nn_ld(pdy, dy.fp16, nn_off(&dy, n, oh, ow, c)),
                         nn_avg_divisor(&g, ky0, ky1, kx0, kx1));
      }
    }
    nn_st_acc(pdx, dx.fp16, at, acc, accumulate && !from_old);
  }
}

/* y [N,1,1,C]: thread i is (n, c) = (i / C, i % C). */
__global__ void nn_gap_fwd_k(cuda_nhwc x, const void *px, cuda_nhwc y, void *py) {
  NN_GRID_LOOP(i, x.n * x.c) {
    const int64_t n = i / x.c, c = i % x.c;
    double sum = 0.0;
    for (int64_t h = 0; h < x.h; h++)
      for (int64_t w = 0; w < x.w; w++) sum += nn_ld(px, x.fp16, nn_off(&x, n, h, w, c));
    nn_st(py, y.fp16, nn_off(&y, n, 0, 0, c), bp_avg_of(sum, (double)(x.h * x.w)));
  }
}

__global__ void nn_gap_bwd_k(cuda_nhwc dy, const void *pdy, cuda_nhwc dx, void *pdx,
                             int accumulate) {
  NN_GRID_LOOP(i, nn_count(&dx)) {
    int64_t n, h, w, c;
    nn_coords(&dx, i, &n, &h, &w, &c);
    const float share =
        bp_avg_of(nn_ld(pdy, dy.fp16, nn_off(&dy, n, 0, 0, c)), (double)(dx.h * dx.w));
    nn_st_acc(pdx, dx.fp16, nn_off(&dx, n, h, w, c), share, accumulate);
  }
}

#define NN_LAUNCH(count, stream) <<<cuda_grid_for(count), CUDA_BLOCK, 0, (cudaStream_t)(stream)>>>

extern "C" int cuda_nn_maxpool_fwd(void *stream, cuda_pool g, cuda_nhwc x, const void *px,
                                   cuda_nhwc y, void *py, cuda_nhwc mask, void *pmask) {
  nn_maxpool_fwd_k NN_LAUNCH(nn_count(&y), stream)(g, x, px, y, py, mask, (int8_t *)pmask);
  return nn_launched();
}

extern "C" int cuda_nn_maxpool_bwd(void *stream, cuda_pool g, cuda_nhwc dy, const void *pdy,
                                   cuda_nhwc mask, const void *pmask, cuda_nhwc dx, void *pdx,
                                   int accumulate) {
  nn_maxpool_bwd_k NN_LAUNCH(nn_count(&dx), stream)(g, dy, pdy, mask, (const int8_t *)pmask, dx,
                                                     pdx, accumulate);
  return nn_launched();
}

extern "C" int cuda_nn_avgpool_fwd(void *stream, cuda_pool g, cuda_nhwc x, const void *px,
                                   cuda_nhwc y, void *py) {
  nn_avgpool_fwd_k NN_LAUNCH(nn_count(&y), stream)(g, x, px, y, py);
  return nn_launched();
}

extern "C" int cuda_nn_avgpool_bwd(void *stream, cuda_pool g, cuda_nhwc dy, const void *pdy,
                                   cuda_nhwc dx, void *pdx, int accumulate) {
  nn_avgpool_bwd_k NN_LAUNCH(nn_count(&dx), stream)(g, dy, pdy, dx, pdx, accumulate);
  return nn_launched();
}

extern "C" int cuda_nn_gap_fwd(void *stream, cuda_nhwc x, const void *px, cuda_nhwc y, void *py) {
  nn_gap_fwd_k NN_LAUNCH(x.n * x.c, stream)(x, px, y, py);
  return nn_launched();
}

extern "C" int cuda_nn_gap_bwd(void *stream, cuda_nhwc dy, const void *pdy, cuda_nhwc dx,
                               void *pdx, int accumulate) {
  nn_gap_bwd_k NN_LAUNCH(nn_count(&dx), stream)(dy, pdy, dx, pdx, accumulate);
  return nn_launched();
}
