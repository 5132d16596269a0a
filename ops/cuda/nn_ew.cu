/* relu.fwd / relu.bwd / add.fwd / add.bwd on the device.
 *
 * One thread per logical element (grid-stride loop over N*H*W*C, c
 * fastest, so a warp reads consecutive channels), block CUDA_BLOCK, grid
 * cuda_grid_for(count), no shared memory, no reduction. Each element is
 * read before it is written by the same thread, so the in-place forms
 * (relu.fwd y == x, relu.bwd dx == dy) are safe. The per-element formulas
 * are the reference's (elem_math.h); FP16 elements are widened exactly and
 * each result rounded once, so every output equals the reference's bit for
 * bit (NaN payloads aside). */
#include "nn-device.cuh"

__global__ void nn_relu_fwd_k(cuda_nhwc x, const void *px, cuda_nhwc y, void *py) {
  NN_GRID_LOOP(i, nn_count(&x)) {
    int64_t n, h, w, c;
    nn_coords(&x, i, &n, &h, &w, &c);
    const float v = nn_ld(px, x.fp16, nn_off(&x, n, h, w, c));
    nn_st(py, y.fp16, nn_off(&y, n, h, w, c), bp_relu_fwd(v));
  }
}

__global__ void nn_relu_bwd_k(cuda_nhwc y, const void *py, cuda_nhwc dy, const void *pdy,
                              cuda_nhwc dx, void *pdx, int accumulate) {
  NN_GRID_LOOP(i, nn_count(&y)) {
    int64_t n, h, w, c;
    nn_coords(&y, i, &n, &h, &w, &c);
    const float g = bp_relu_bwd(nn_ld(py, y.fp16, nn_off(&y, n, h, w, c)),
                                nn_ld(pdy, dy.fp16, nn_off(&dy, n, h, w, c)));
    nn_st_acc(pdx, dx.fp16, nn_off(&dx, n, h, w, c), g, accumulate);
  }
}

__global__ void nn_add_fwd_k(cuda_nhwc a, const void *pa, cuda_nhwc b, const void *pb, cuda_nhwc y,
                             void *py) {
  NN_GRID_LOOP(i, nn_count(&a)) {
    int64_t n, h, w, c;
    nn_coords(&a, i, &n, &h, &w, &c);
    const float v =
        nn_ld(pa, a.fp16, nn_off(&a, n, h, w, c)) + nn_ld(pb, b.fp16, nn_off(&b, n, h, w, c));
    nn_st(py, y.fp16, nn_off(&y, n, h, w, c), v);
  }
}

__global__ void nn_add_bwd_k(cuda_nhwc dy, const void *pdy, cuda_nhwc da, void *pda, cuda_nhwc db,
                             void *pdb, int accumulate) {
  NN_GRID_LOOP(i, nn_count(&dy)) {
    int64_t n, h, w, c;
    nn_coords(&dy, i, &n, &h, &w, &c);
    const float g = nn_ld(pdy, dy.fp16, nn_off(&dy, n, h, w, c));
    nn_st_acc(pda, da.fp16, nn_off(&da, n, h, w, c), g, accumulate);
    nn_st_acc(pdb, db.fp16, nn_off(&db, n, h, w, c), g, accumulate);
  }
}

extern "C" int cuda_nn_relu_fwd(void *stream, cuda_nhwc x, const void *px, cuda_nhwc y, void *py) {
  nn_relu_fwd_k<<<cuda_grid_for(nn_count(&x)), CUDA_BLOCK, 0, (cudaStream_t)stream>>>(x, px,
                                                                                          y, py);
  return nn_launched();
}

extern "C" int cuda_nn_relu_bwd(void *stream, cuda_nhwc y, const void *py, cuda_nhwc dy,
                                const void *pdy, cuda_nhwc dx, void *pdx, int accumulate) {
  nn_relu_bwd_k<<<cuda_grid_for(nn_count(&y)), CUDA_BLOCK, 0, (cudaStream_t)stream>>>(
      y, py, dy, pdy, dx, pdx, accumulate);
  return nn_launched();
}

extern "C" int cuda_nn_add_fwd(void *stream, cuda_nhwc a, const void *pa, cuda_nhwc b,
                               const void *pb, cuda_nhwc y, void *py) {
  nn_add_fwd_k<<<cuda_grid_for(nn_count(&a)), CUDA_BLOCK, 0, (cudaStream_t)stream>>>(
      a, pa, b, pb, y, py);
  return nn_launched();
}

extern "C" int cuda_nn_add_bwd(void *stream, cuda_nhwc dy, const void *pdy, cuda_nhwc da,
                               void *pda, cuda_nhwc db, void *pdb, int accumulate) {
  nn_add_bwd_k<<<cuda_grid_for(nn_count(&dy)), CUDA_BLOCK, 0, (cudaStream_t)stream>>>(
      dy, pdy, da, pda, db, pdb, accumulate);
  return nn_launched();
}
