/* batchnorm.fwd_train, batchnorm.fwd_eval and batchnorm.bwd on the device.
 * Formulas and shapes: ops/shared/batchnorm_steps.h; every per-channel and
 * per-element step is its elem_math.h function in double, as the
 * reference's, so only the order of the statistics' sums differs.
 *
 * Statistics (double, deterministic): the M = N*H*W pixels are cut into S =
 * cuda_bn_slices(M) runs of `slice` pixels (a function of M alone).
 * nn_bn_partial_k, grid (ceil(C/32), S), block (32, 8), 4 KiB of shared
 * memory: thread (tx, ty) of block (bx, s) takes channel bx*32 + tx and
 * the pixels s*slice + ty, + 8, ... of the run (a warp reads 32
 * consecutive channels of one pixel), summing in double; the 8 rows are
 * then added by a fixed tree (4, 2, 1) and row 0 writes the block's partial
 * sum of each channel to the workspace. One thread per channel
 * (nn_bn_*_channels_k, grid cuda_grid_for(C), block CUDA_BLOCK) then adds
 * the S partials in slice order. No atomics: the same inputs give the same
 * bits on every run.
 *   fwd_train: partial sums of x -> mean; partial sums of (x - mean)^2 ->
 *   var (two passes; ops/cpu and the reference take one, of shifted sums,
 *   batchnorm_steps.h); per channel invstd, scale, shift,
 *   save_mean, save_invstd and the running statistics (read and written by
 *   the same thread, so updating them in place is safe); then y
 *   elementwise. 5 launches.
 *   fwd_eval: per channel scale and shift from the running statistics, then
 *   y elementwise. 2 launches.
 *   bwd: mean and invstd from save_mean / save_invstd, partial sums of dy and
 *   dy*xhat, per channel dgamma, dbeta (accumulate) and k, mdy, mdyx, then
 *   dx elementwise. 4 launches.
 * Elementwise kernels: grid-stride over N*H*W*C, block CUDA_BLOCK, grid
 * cuda_grid_for(count).
 *
 * Workspace (cuda_bn_workspace_bytes, from its first 256-byte boundary),
 * doubles: mean[C], invstd[C], f0[C] (scale or k), f1[C] (shift or mdy),
 * f2[C] (mdyx), part_a[S*C], part_b[S*C]. */
#include "nn-device.cuh"

#define BN_TX 32 /* channels per block */
#define BN_TY 8  /* pixel rows per block */

typedef struct nn_bn_ws {
  double *mean, *invstd, *f0, *f1, *f2, *part_a, *part_b;
} nn_bn_ws;

static nn_bn_ws nn_bn_carve(void *ws, int64_t channels, int64_t slices) {
  double *d = (double *)nn_ws_base(ws);
  nn_bn_ws w;
  w.mean = d;
  w.invstd = d + channels;
  w.f0 = d + 2 * channels;
  w.f1 = d + 3 * channels;
  w.f2 = d + 4 * channels;
  w.part_a = d + 5 * channels;
  w.part_b = w.part_a + slices * channels;
  return w;
}

enum { NN_BN_SUM_X = 0, NN_BN_SUM_SQDEV = 1, NN_BN_SUM_BWD = 2 };

/* Partial sums over pixel run blockIdx.y of the channels of block
 * blockIdx.x: SUM_X: x; SUM_SQDEV: (x - mean)^2; SUM_BWD: dy (part_a) and
 * dy * (x - mean) * invstd (part_b). */
__global__ void nn_bn_partial_k(int mode, cuda_nhwc x, const void *px, cuda_nhwc dy,
                                const void *pdy, const double *mean, const double *invstd,
                                int64_t slice, double *part_a, double *part_b) {
  __shared__ double sa[BN_TY][BN_TX], sb[BN_TY][BN_TX];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = (int64_t)blockIdx.x * BN_TX + tx, s = blockIdx.y;
  const int64_t pixels = x.n * x.h * x.w;
  const int64_t p0 = s * slice, p1 = p0 + slice < pixels ? p0 + slice : pixels;
  double a = 0.0, b = 0.0;
  if (c < x.c) {
    const double m = mode == NN_BN_SUM_X ? 0.0 : mean[c];
    const double is = mode == NN_BN_SUM_BWD ? invstd[c] : 0.0;
    for (int64_t p = p0 + ty; p < p1; p += BN_TY) {
      int64_t n, h, w;
      nn_pixel(&x, p, &n, &h, &w);
      const double v = nn_ld(px, x.fp16, nn_off(&x, n, h, w, c));
      if (mode == NN_BN_SUM_X) {
        a += v;
      } else if (mode == NN_BN_SUM_SQDEV) {
        a += (v - m) * (v - m);
      } else {
        const double g = nn_ld(pdy, dy.fp16, nn_off(&dy, n, h, w, c));
        a += g;
        b += bp_bn_dy_xhat(g, (float)v, m, is);
      }
    }
  }
  sa[ty][tx] = a;
  sb[ty][tx] = b;
  __syncthreads();
  for (int half = BN_TY / 2; half > 0; half /= 2) {
    if (ty < half) {
      sa[ty][tx] += sa[ty + half][tx];
      sb[ty][tx] += sb[ty + half][tx];
    }
    __syncthreads();
  }
  if (ty == 0 && c < x.c) {
    part_a[s * x.c + c] = sa[0][tx];
    if (mode == NN_BN_SUM_BWD) part_b[s * x.c + c] = sb[0][tx];
  }
}

/* The S partial sums of channel c, in slice order. */
__device__ __forceinline__ double nn_bn_total(const double *part, int64_t slices,
                                              int64_t channels, int64_t c) {
  double sum = 0.0;
  for (int64_t s = 0; s < slices; s++) sum += part[s * channels + c];
  return sum;
}

__global__ void nn_bn_mean_k(int64_t channels, int64_t pixels, int64_t slices, nn_bn_ws w) {
  NN_GRID_LOOP(c, channels) w.mean[c] = nn_bn_total(w.part_a, slices, channels, c) / (double)pixels;
}

/* fwd_train per channel. p: gamma, beta, rm_in, rv_in, save_mean,
 * save_invstd, rm_out, rv_out. */
typedef struct nn_bn_train_params {
  cuda_chan p[8];
} nn_bn_train_params;

__global__ void nn_bn_train_channels_k(int64_t channels, int64_t pixels, int64_t slices,
                                       nn_bn_ws w, nn_bn_train_params t, float eps,
                                       float momentum) {
  NN_GRID_LOOP(c, channels) {
    const double mean = w.mean[c];
    const double var = nn_bn_total(w.part_a, slices, channels, c) / (double)pixels;
    const double invstd = bp_bn_invstd(var, eps);
    const double scale = bp_bn_gain(nn_ch_ld(&t.p[0], c), invstd);
    w.f0[c] = scale;
    w.f1[c] = bp_bn_shift(nn_ch_ld(&t.p[1], c), mean, scale);
    const double rm = nn_ch_ld(&t.p[2], c), rv = nn_ch_ld(&t.p[3], c);
    nn_ch_st(&t.p[4], c, (float)mean);
    nn_ch_st(&t.p[5], c, (float)invstd);
    nn_ch_st(&t.p[6], c, bp_bn_running_mean(rm, momentum, mean));
    nn_ch_st(&t.p[7], c, bp_bn_running_var(rv, momentum, var, pixels));
  }
}

/* fwd_eval per channel. p: gamma, beta, running_mean, running_var. */
typedef struct nn_bn_eval_params {
  cuda_chan p[4];
} nn_bn_eval_params;

__global__ void nn_bn_eval_channels_k(int64_t channels, nn_bn_ws w, nn_bn_eval_params t,
                                      float eps) {
  NN_GRID_LOOP(c, channels) {
    const double scale = bp_bn_eval_scale(nn_ch_ld(&t.p[0], c), nn_ch_ld(&t.p[3], c), eps);
    w.f0[c] = scale;
    w.f1[c] = bp_bn_shift(nn_ch_ld(&t.p[1], c), nn_ch_ld(&t.p[2], c), scale);
  }
}

/* y = x * scale + shift (f0, f1). */
__global__ void nn_bn_apply_k(cuda_nhwc x, const void *px, cuda_nhwc y, void *py, nn_bn_ws w) {
  NN_GRID_LOOP(i, nn_count(&x)) {
    int64_t n, h, ww, c;
    nn_coords(&x, i, &n, &h, &ww, &c);
    const float v = nn_ld(px, x.fp16, nn_off(&x, n, h, ww, c));
    nn_st(py, y.fp16, nn_off(&y, n, h, ww, c), bp_bn_apply(v, w.f0[c], w.f1[c]));
  }
}

/* bwd per channel. p: gamma, save_mean, save_invstd, dgamma, dbeta. */
typedef struct nn_bn_bwd_params {
  cuda_chan p[5];
} nn_bn_bwd_params;

__global__ void nn_bn_saved_k(int64_t channels, nn_bn_ws w, nn_bn_bwd_params t) {
  NN_GRID_LOOP(c, channels) {
    w.mean[c] = nn_ch_ld(&t.p[1], c);
    w.invstd[c] = nn_ch_ld(&t.p[2], c);
  }
}

/* dgamma, dbeta from the sums; k (f0), mdy (f1) and mdyx (f2) for dx. In
 * an all-FP32 call an output adds in double (the reference); in a call
 * with an FP16 tensor (any16) it is out + (float)sum, rounded once to its
 * dtype, as the reference's FP16 adapter adds a result. */
__device__ __forceinline__ void nn_bn_param_store(const cuda_chan *t, int64_t c, double sum,
                                                  int accumulate, int any16) {
  if (t->fp16 || any16)
    nn_st_acc(t->p, t->fp16, c * t->stride, (float)sum, accumulate);
  else
    nn_ch_st(t, c, bp_bn_param_grad(accumulate ? nn_ch_ld(t, c) : 0.0f, sum, accumulate));
}

__global__ void nn_bn_bwd_channels_k(int64_t channels, int64_t pixels, int64_t slices,
                                     nn_bn_ws w, nn_bn_bwd_params t, int accumulate,
                                     int any16) {
  NN_GRID_LOOP(c, channels) {
    const double sdy = nn_bn_total(w.part_a, slices, channels, c);
    const double sdyx = nn_bn_total(w.part_b, slices, channels, c);
    nn_bn_param_store(&t.p[3], c, sdyx, accumulate, any16);
    nn_bn_param_store(&t.p[4], c, sdy, accumulate, any16);
    w.f0[c] = bp_bn_gain(nn_ch_ld(&t.p[0], c), w.invstd[c]);
    w.f1[c] = sdy / (double)pixels;
    w.f2[c] = sdyx / (double)pixels;
  }
}

__global__ void nn_bn_dx_k(cuda_nhwc x, const void *px, cuda_nhwc dy, const void *pdy,
                           cuda_nhwc dx, void *pdx, nn_bn_ws w, int accumulate) {
  NN_GRID_LOOP(i, nn_count(&x)) {
    int64_t n, h, ww, c;
    nn_coords(&x, i, &n, &h, &ww, &c);
    const double xhat = bp_bn_xhat(nn_ld(px, x.fp16, nn_off(&x, n, h, ww, c)), w.mean[c],
                                   w.invstd[c]);
    const float g = bp_bn_dx(w.f0[c], nn_ld(pdy, dy.fp16, nn_off(&dy, n, h, ww, c)), xhat,
                             w.f1[c], w.f2[c]);
    nn_st_acc(pdx, dx.fp16, nn_off(&dx, n, h, ww, c), g, accumulate);
  }
}

/* One launch of the partial sums. */
static int nn_bn_partials(cudaStream_t st, int mode, const cuda_nhwc *x, const void *px,
                          const cuda_nhwc *dy, const void *pdy, const nn_bn_ws *w) {
  const int64_t pixels = x->n * x->h * x->w, slices = cuda_bn_slices(pixels);
  const int64_t slice = (pixels + slices - 1) / slices;
  const dim3 grid((unsigned)((x->c + BN_TX - 1) / BN_TX), (unsigned)slices);
  const dim3 block(BN_TX, BN_TY);
  nn_bn_partial_k<<<grid, block, 0, st>>>(mode, *x, px, *dy, pdy, w->mean, w->invstd, slice,
                                          w->part_a, w->part_b);
  return nn_launched();
}

#define NN_CH_LAUNCH(channels, st) <<<cuda_grid_for(channels), CUDA_BLOCK, 0, (st)>>>

extern "C" int cuda_nn_bn_fwd_train(void *stream, cuda_nhwc x, const void *px, cuda_nhwc y,
                                    void *py, const cuda_chan p[8], float eps, float momentum,
                                    void *ws) {
  const cudaStream_t st = (cudaStream_t)stream;
  const int64_t C = x.c, M = x.n * x.h * x.w, S = cuda_bn_slices(M);
  const nn_bn_ws w = nn_bn_carve(ws, C, S);
  nn_bn_train_params t;
  for (int i = 0; i < 8; i++) t.p[i] = p[i];
  int rc = nn_bn_partials(st, NN_BN_SUM_X, &x, px, &x, px, &w);
  if (rc) return rc;
  nn_bn_mean_k NN_CH_LAUNCH(C, st)(C, M, S, w);
  if ((rc = nn_launched())) return rc;
  if ((rc = nn_bn_partials(st, NN_BN_SUM_SQDEV, &x, px, &x, px, &w))) return rc;
  nn_bn_train_channels_k NN_CH_LAUNCH(C, st)(C, M, S, w, t, eps, momentum);
  if ((rc = nn_launched())) return rc;
  nn_bn_apply_k<<<cuda_grid_for(nn_count(&x)), CUDA_BLOCK, 0, st>>>(x, px, y, py, w);
  return nn_launched();
}

extern "C" int cuda_nn_bn_fwd_eval(void *stream, cuda_nhwc x, const void *px, cuda_nhwc y,
                                   void *py, const cuda_chan p[4], float eps, void *ws) {
  const cudaStream_t st = (cudaStream_t)stream;
  const int64_t C = x.c;
  const nn_bn_ws w = nn_bn_carve(ws, C, cuda_bn_slices(x.n * x.h * x.w));
  nn_bn_eval_params t;
  for (int i = 0; i < 4; i++) t.p[i] = p[i];
  nn_bn_eval_channels_k NN_CH_LAUNCH(C, st)(C, w, t, eps);
  int rc = nn_launched();
  if (rc) return rc;
  nn_bn_apply_k<<<cuda_grid_for(nn_count(&x)), CUDA_BLOCK, 0, st>>>(x, px, y, py, w);
  return nn_launched();
}

extern "C" int cuda_nn_bn_bwd(void *stream, cuda_nhwc x, const void *px, cuda_nhwc dy,
                              const void *pdy, cuda_nhwc dx, void *pdx, const cuda_chan p[5],
                              int accumulate, void *ws) {
  const cudaStream_t st = (cudaStream_t)stream;
  const int64_t C = x.c, M = x.n * x.h * x.w, S = cuda_bn_slices(M);
  const nn_bn_ws w = nn_bn_carve(ws, C, S);
  nn_bn_bwd_params t;
  int any16 = x.fp16 || dy.fp16 || dx.fp16;
  for (int i = 0; i < 5; i++) t.p[i] = p[i], any16 |= p[i].fp16;
  nn_bn_saved_k NN_CH_LAUNCH(C, st)(C, w, t);
  int rc = nn_launched();
  if (rc) return rc;
  if ((rc = nn_bn_partials(st, NN_BN_SUM_BWD, &x, px, &dy, pdy, &w))) return rc;
  nn_bn_bwd_channels_k NN_CH_LAUNCH(C, st)(C, M, S, w, t, accumulate, any16);
  if ((rc = nn_launched())) return rc;
  nn_bn_dx_k<<<cuda_grid_for(nn_count(&x)), CUDA_BLOCK, 0, st>>>(x, px, dy, pdy, dx, pdx, w,
                                                                 accumulate);
  return nn_launched();
}
