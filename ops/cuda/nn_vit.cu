/* The ViT ops' kernels (nn_vit.c has their descriptors).
 *
 * gelu_tanh, pos_embed.fwd: one thread per logical element (grid-stride
 * loop, c fastest), the reference's per-element formulas (elem_math.h:
 * gelu_tanh in double with the device's tanh, rounded once).
 * pos_embed.bwd: one thread per element of P, walking the samples in
 * order: dx (+)= dy and the double sum of dy, so dP's order is the
 * reference's.
 * layernorm: one thread per position (the statistics and dx in the
 * reference's order: channel c into double lane c % 8, lanes added in
 * order); dgain and dbias in two launches: one thread per (chunk,
 * channel) sums its chunk of positions into the workspace, then one
 * thread per channel adds the chunks in order, the chunks of
 * ops/shared/layernorm_steps.h. No atomics: every order is fixed, so the
 * results are deterministic, and with --fmad=false (CMakeLists.txt) they
 * take the reference's roundings (tanh aside: CUDA's double tanh is within
 * 2 ulp, not libm's bits). FP16 elements are widened exactly and each
 * result rounded once. */
#include "nn-device.cuh"

#define LN_LANES 8

__device__ __forceinline__ double ln_lanes_total(const double lane[LN_LANES]) {
  double s = 0.0;
  for (int j = 0; j < LN_LANES; j++) s += lane[j];
  return s;
}

/* ---- gelu_tanh ------------------------------------------------------------- */

__global__ void nn_gelu_tanh_fwd_k(cuda_nhwc x, const void *px, cuda_nhwc y, void *py) {
  NN_GRID_LOOP(i, nn_count(&x)) {
    int64_t n, h, w, c;
    nn_coords(&x, i, &n, &h, &w, &c);
    nn_st(py, y.fp16, nn_off(&y, n, h, w, c),
          bp_gelu_tanh_fwd(nn_ld(px, x.fp16, nn_off(&x, n, h, w, c))));
  }
}

__global__ void nn_gelu_tanh_bwd_k(cuda_nhwc x, const void *px, cuda_nhwc dy, const void *pdy,
                                   cuda_nhwc dx, void *pdx, int accumulate) {
  NN_GRID_LOOP(i, nn_count(&x)) {
    int64_t n, h, w, c;
    nn_coords(&x, i, &n, &h, &w, &c);
    const float g = bp_gelu_tanh_bwd(nn_ld(px, x.fp16, nn_off(&x, n, h, w, c)),
                                     nn_ld(pdy, dy.fp16, nn_off(&dy, n, h, w, c)));
    nn_st_acc(pdx, dx.fp16, nn_off(&dx, n, h, w, c), g, accumulate);
  }
}

/* ---- pos_embed --------------------------------------------------------------- */

__global__ void nn_pos_embed_fwd_k(cuda_nhwc x, const void *px, cuda_nhwc P, const void *pP,
                                   cuda_nhwc y, void *py) {
  NN_GRID_LOOP(i, nn_count(&x)) {
    int64_t n, h, w, c;
    nn_coords(&x, i, &n, &h, &w, &c);
    const float v =
        nn_ld(px, x.fp16, nn_off(&x, n, h, w, c)) + nn_ld(pP, P.fp16, nn_off(&P, 0, h, w, c));
    nn_st(py, y.fp16, nn_off(&y, n, h, w, c), v);
  }
}

__global__ void nn_pos_embed_bwd_k(cuda_nhwc dy, const void *pdy, cuda_nhwc dx, void *pdx,
                                   cuda_nhwc dP, void *pdP, int accumulate) {
  NN_GRID_LOOP(i, nn_count(&dP)) {
    int64_t n0, h, w, c;
    nn_coords(&dP, i, &n0, &h, &w, &c);
    double sum = 0.0;
    for (int64_t n = 0; n < dy.n; n++) {
      const float g = nn_ld(pdy, dy.fp16, nn_off(&dy, n, h, w, c));
      nn_st_acc(pdx, dx.fp16, nn_off(&dx, n, h, w, c), g, accumulate);
      sum += g;
    }
    const int64_t o = nn_off(&dP, 0, h, w, c);
    nn_st(pdP, dP.fp16, o,
          bp_bn_param_grad(accumulate ? nn_ld(pdP, dP.fp16, o) : 0.0f, sum, accumulate));
  }
}

/* ---- layernorm ---------------------------------------------------------------- */

__global__ void nn_ln_fwd_k(cuda_nhwc x, const void *px, cuda_chan gain, cuda_chan bias,
                            cuda_nhwc y, void *py, cuda_nhwc sm, float *psm, cuda_nhwc si,
                            float *psi, float eps) {
  NN_GRID_LOOP(p, x.n * x.h * x.w) {
    int64_t n, h, w;
    nn_pixel(&x, p, &n, &h, &w);
    const int64_t xo = nn_off(&x, n, h, w, 0);
    double lane[LN_LANES] = {0}, dev[LN_LANES] = {0};
    for (int64_t c = 0; c < x.c; c++) lane[c % LN_LANES] += (double)nn_ld(px, x.fp16, xo + c * x.s3);
    const double mean = ln_lanes_total(lane) / (double)x.c;
    for (int64_t c = 0; c < x.c; c++) {
      const double d = (double)nn_ld(px, x.fp16, xo + c * x.s3) - mean;
      dev[c % LN_LANES] += d * d;
    }
    const double invstd = bp_ln_invstd(ln_lanes_total(dev) / (double)x.c, eps);
    const int64_t yo = nn_off(&y, n, h, w, 0);
    for (int64_t c = 0; c < x.c; c++) {
      const double xhat = bp_ln_xhat(nn_ld(px, x.fp16, xo + c * x.s3), mean, invstd);
      nn_st(py, y.fp16, yo + c * y.s3, bp_ln_apply(xhat, nn_ch_ld(&gain, c), nn_ch_ld(&bias, c)));
    }
    psm[nn_off(&sm, n, h, w, 0)] = (float)mean;
    psi[nn_off(&si, n, h, w, 0)] = (float)invstd;
  }
}

/* dx, one thread per position. */
__global__ void nn_ln_bwd_dx_k(cuda_nhwc x, const void *px, cuda_nhwc dy, const void *pdy,
                               cuda_chan gain, cuda_nhwc sm, const float *psm, cuda_nhwc si,
                               const float *psi, cuda_nhwc dx, void *pdx, int accumulate) {
  NN_GRID_LOOP(p, x.n * x.h * x.w) {
    int64_t n, h, w;
    nn_pixel(&x, p, &n, &h, &w);
    const int64_t xo = nn_off(&x, n, h, w, 0), dyo = nn_off(&dy, n, h, w, 0);
    const double mean = psm[nn_off(&sm, n, h, w, 0)], invstd = psi[nn_off(&si, n, h, w, 0)];
    double sg[LN_LANES] = {0}, sgx[LN_LANES] = {0};
    for (int64_t c = 0; c < x.c; c++) {
      const double g = bp_ln_g(nn_ld(pdy, dy.fp16, dyo + c * dy.s3), nn_ch_ld(&gain, c));
      sg[c % LN_LANES] += g;
      sgx[c % LN_LANES] += g * bp_ln_xhat(nn_ld(px, x.fp16, xo + c * x.s3), mean, invstd);
    }
    const double mg = ln_lanes_total(sg) / (double)x.c, mgx = ln_lanes_total(sgx) / (double)x.c;
    const int64_t dxo = nn_off(&dx, n, h, w, 0);
    for (int64_t c = 0; c < x.c; c++) {
      const double xhat = bp_ln_xhat(nn_ld(px, x.fp16, xo + c * x.s3), mean, invstd);
      const double g = bp_ln_g(nn_ld(pdy, dy.fp16, dyo + c * dy.s3), nn_ch_ld(&gain, c));
      nn_st_acc(pdx, dx.fp16, dxo + c * dx.s3, bp_ln_dx(invstd, g, mg, xhat, mgx), accumulate);
    }
  }
}

/* The chunk sums of dy * xhat and dy: thread (k, c) into ws[k][0][c] and ws[k][1][c]. */
__global__ void nn_ln_bwd_chunks_k(cuda_nhwc x, const void *px, cuda_nhwc dy, const void *pdy,
                                   cuda_nhwc sm, const float *psm, cuda_nhwc si, const float *psi,
                                   int64_t len, int64_t chunks, double *ws) {
  const int64_t M = x.n * x.h * x.w;
  NN_GRID_LOOP(i, chunks * x.c) {
    const int64_t k = i / x.c, c = i % x.c, p1 = M - k * len < len ? M : k * len + len;
    double syx = 0.0, sy = 0.0;
    for (int64_t p = k * len; p < p1; p++) {
      int64_t n, h, w;
      nn_pixel(&x, p, &n, &h, &w);
      const double mean = psm[nn_off(&sm, n, h, w, 0)], invstd = psi[nn_off(&si, n, h, w, 0)];
      const double d = nn_ld(pdy, dy.fp16, nn_off(&dy, n, h, w, c));
      syx += d * bp_ln_xhat(nn_ld(px, x.fp16, nn_off(&x, n, h, w, c)), mean, invstd);
      sy += d;
    }
    ws[k * 2 * x.c + c] = syx;
    ws[k * 2 * x.c + x.c + c] = sy;
  }
}

/* dgain, dbias: the chunk sums added in chunk order, one thread per channel. */
__global__ void nn_ln_bwd_params_k(int64_t C, int64_t chunks, const double *ws, cuda_chan dgain,
                                   cuda_chan dbias, int accumulate) {
  NN_GRID_LOOP(c, C) {
    double syx = 0.0, sy = 0.0;
    for (int64_t k = 0; k < chunks; k++) {
      syx += ws[k * 2 * C + c];
      sy += ws[k * 2 * C + C + c];
    }
    nn_ch_st(&dgain, c,
             bp_bn_param_grad(accumulate ? nn_ch_ld(&dgain, c) : 0.0f, syx, accumulate));
    nn_ch_st(&dbias, c, bp_bn_param_grad(accumulate ? nn_ch_ld(&dbias, c) : 0.0f, sy, accumulate));
  }
}

/* ---- launchers ------------------------------------------------------------------ */

extern "C" int cuda_nn_gelu_tanh_fwd(void *stream, cuda_nhwc x, const void *px, cuda_nhwc y,
                                     void *py) {
  nn_gelu_tanh_fwd_k<<<cuda_grid_for(nn_count(&x)), CUDA_BLOCK, 0, (cudaStream_t)stream>>>(
      x, px, y, py);
  return nn_launched();
}

extern "C" int cuda_nn_gelu_tanh_bwd(void *stream, cuda_nhwc x, const void *px, cuda_nhwc dy,
                                     const void *pdy, cuda_nhwc dx, void *pdx, int accumulate) {
  nn_gelu_tanh_bwd_k<<<cuda_grid_for(nn_count(&x)), CUDA_BLOCK, 0, (cudaStream_t)stream>>>(
      x, px, dy, pdy, dx, pdx, accumulate);
  return nn_launched();
}

extern "C" int cuda_nn_pos_embed_fwd(void *stream, cuda_nhwc x, const void *px, cuda_nhwc P,
                                     const void *pP, cuda_nhwc y, void *py) {
  nn_pos_embed_fwd_k<<<cuda_grid_for(nn_count(&x)), CUDA_BLOCK, 0, (cudaStream_t)stream>>>(
      x, px, P, pP, y, py);
  return nn_launched();
}

extern "C" int cuda_nn_pos_embed_bwd(void *stream, cuda_nhwc dy, const void *pdy, cuda_nhwc dx,
                                     void *pdx, cuda_nhwc dP, void *pdP, int accumulate) {
  nn_pos_embed_bwd_k<<<cuda_grid_for(nn_count(&dP)), CUDA_BLOCK, 0, (cudaStream_t)stream>>>(
      dy, pdy, dx, pdx, dP, pdP, accumulate);
  return nn_launched();
}

extern "C" int cuda_nn_ln_fwd(void *stream, cuda_nhwc x, const void *px, cuda_chan gain,
                              cuda_chan bias, cuda_nhwc y, void *py, cuda_nhwc sm, void *psm,
                              cuda_nhwc si, void *psi, float eps) {
  nn_ln_fwd_k<<<cuda_grid_for(x.n * x.h * x.w), CUDA_BLOCK, 0, (cudaStream_t)stream>>>(
      x, px, gain, bias, y, py, sm, (float *)psm, si, (float *)psi, eps);
  return nn_launched();
}

extern "C" int cuda_nn_ln_bwd(void *stream, cuda_nhwc x, const void *px, cuda_nhwc dy,
                              const void *pdy, cuda_chan gain, cuda_nhwc sm, const void *psm,
                              cuda_nhwc si, const void *psi, cuda_nhwc dx, void *pdx,
                              cuda_chan dgain, cuda_chan dbias, int64_t chunk_len, int64_t chunks,
                              int accumulate, void *ws) {
  cudaStream_t s = (cudaStream_t)stream;
  double *sums = (double *)nn_ws_base(ws);
  nn_ln_bwd_dx_k<<<cuda_grid_for(x.n * x.h * x.w), CUDA_BLOCK, 0, s>>>(
      x, px, dy, pdy, gain, sm, (const float *)psm, si, (const float *)psi, dx, pdx, accumulate);
  int st = nn_launched();
  if (st) return st;
  nn_ln_bwd_chunks_k<<<cuda_grid_for(chunks * x.c), CUDA_BLOCK, 0, s>>>(
      x, px, dy, pdy, sm, (const float *)psm, si, (const float *)psi, chunk_len, chunks, sums);
  if ((st = nn_launched())) return st;
  nn_ln_bwd_params_k<<<cuda_grid_for(x.c), CUDA_BLOCK, 0, s>>>(x.c, chunks, sums, dgain, dbias,
                                                                accumulate);
  return nn_launched();
}
