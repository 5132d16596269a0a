/* softmax_ce.fwd_bwd on the device. Formulas: ops/reference/softmax_ce.c
 * (per sample, in double: lse = max z + log sum exp(z - max z), loss_n =
 * sum_k t_k (lse - z_k), dlogits_k = (exp(z_k - lse) - t_k) * grad_scale *
 * S, hit = argmax == label with the first largest k winning), each step
 * its elem_math.h function.
 *
 * nn_ce_rows_k: one block of CE_THREADS (256) threads per sample (grid
 * min(N, 65535), a grid-stride loop over samples), 5 KiB of shared
 * memory. Thread j takes the classes j, j + 256, ...; the argmax (value,
 * then the smaller index on a tie), the sum of the exponentials and the
 * loss are combined by a fixed tree over the 256 threads, so the bits
 * never depend on timing. The block writes its row of dlogits (rounded
 * once to float, then once to FP16 for an FP16 dlogits, as the reference)
 * and its loss and hit into the workspace. The loss scale S is read on the
 * device from its FP32 scalar.
 * nn_ce_total_k: one thread adds the per-sample losses and hits in sample
 * order in double (the reference's order) and adds them once into loss and
 * correct (never scaled by S).
 *
 * What the reference refuses at run time cannot be refused on the device:
 * a sample whose label is outside [0, K), or any sample when S is not
 * finite and > 0, gets a NaN loss (so loss becomes NaN) and NaN dlogits,
 * and counts no hit. The reference's result on such inputs is an error
 * with every output untouched; a NaN is what a device run can show. With a
 * NaN among a sample's logits the loss is NaN on both sides, but the argmax
 * (hence `correct`) may differ from the reference's sequential scan. */
#include <math_constants.h>

#include "nn-device.cuh"

#define CE_THREADS 256

/* Adds the CE_THREADS values of v by a fixed tree; every thread gets the
 * total. */
__device__ double nn_ce_block_sum(double *v, double mine) {
  const int t = threadIdx.x;
  v[t] = mine;
  __syncthreads();
  for (int half = CE_THREADS / 2; half > 0; half /= 2) {
    if (t < half) v[t] += v[t + half];
    __syncthreads();
  }
  const double total = v[0];
  __syncthreads(); /* v is reused by the next call */
  return total;
}

__global__ void nn_ce_rows_k(cuda_nhwc z, const void *pz, const int32_t *plab, int64_t lab_stride,
                             const float *loss_scale, cuda_nhwc dz, void *pdz,
                             float label_smoothing, float grad_scale, double *sample_loss,
                             double *sample_hit) {
  __shared__ double sum[CE_THREADS];
  __shared__ float best_v[CE_THREADS];
  __shared__ int64_t best_k[CE_THREADS];
  const int t = threadIdx.x;
  const int64_t K = z.c;
  double on, off;
  bp_ce_targets(label_smoothing, K, &on, &off);
  const double S = loss_scale ? (double)*loss_scale : 1.0;
  const int bad_scale = loss_scale && !(isfinite(*loss_scale) && *loss_scale > 0.0f);
  for (int64_t n = blockIdx.x; n < z.n; n += gridDim.x) {
    const int64_t row = nn_off(&z, n, 0, 0, 0);
    const int32_t y = plab[n * lab_stride];
    if (bad_scale || y < 0 || y >= K) { /* uniform over the block */
      if (pdz)
        for (int64_t k = t; k < K; k += CE_THREADS)
          nn_st(pdz, dz.fp16, nn_off(&dz, n, 0, 0, k), CUDART_NAN_F);
      if (t == 0) sample_loss[n] = CUDART_NAN, sample_hit[n] = 0.0;
      continue;
    }
    /* argmax: strictly larger wins within a thread (ascending k), then the
     * tree keeps the larger value, or the smaller k on a tie */
    float bv = 0.0f;
    int64_t bk = -1;
    for (int64_t k = t; k < K; k += CE_THREADS) {
      const float v = nn_ld(pz, z.fp16, row + k * z.s3);
      if (bk < 0 || v > bv) bv = v, bk = k;
    }
    best_v[t] = bv;
    best_k[t] = bk;
    __syncthreads();
    for (int half = CE_THREADS / 2; half > 0; half /= 2) {
      if (t < half) {
        const float ov = best_v[t + half];
        const int64_t ok = best_k[t + half];
        if (ok >= 0 && (best_k[t] < 0 || ov > best_v[t] || (ov == best_v[t] && ok < best_k[t])))
          best_v[t] = ov, best_k[t] = ok;
      }
      __syncthreads();
    }
    const int64_t arg = best_k[0];
    const double m = best_v[0];
    __syncthreads(); /* best_* are rewritten by the next sample */
    double e = 0.0;
    for (int64_t k = t; k < K; k += CE_THREADS) e += exp(nn_ld(pz, z.fp16, row + k * z.s3) - m);
    const double lse = m + log(nn_ce_block_sum(sum, e));
    double ln = 0.0;
    for (int64_t k = t; k < K; k += CE_THREADS) {
      const double tk = k == y ? on : off;
      const float zk = nn_ld(pz, z.fp16, row + k * z.s3);
      if (tk != 0.0) ln += bp_ce_loss_term(tk, lse, zk);
      if (pdz)
        nn_st(pdz, dz.fp16, nn_off(&dz, n, 0, 0, k),
              bp_ce_dlogit(exp(zk - lse), tk, grad_scale, S));
    }
    const double loss = nn_ce_block_sum(sum, ln);
    if (t == 0) sample_loss[n] = loss, sample_hit[n] = arg == y ? 1.0 : 0.0;
  }
}

__global__ void nn_ce_total_k(int64_t samples, const double *sample_loss,
                              const double *sample_hit, float *loss, float *correct) {
  double l = 0.0, h = 0.0;
  for (int64_t n = 0; n < samples; n++) l += sample_loss[n], h += sample_hit[n];
  *loss = (float)(*loss + l);
  *correct = (float)(*correct + h);
}

extern "C" int cuda_nn_softmax_ce(void *stream, cuda_nhwc z, const void *pz, const int32_t *plab,
                                  int64_t lab_stride, const float *loss_scale, float *loss,
                                  float *correct, cuda_nhwc dz, void *pdz, float label_smoothing,
                                  float grad_scale, void *ws) {
  const cudaStream_t st = (cudaStream_t)stream;
  double *sample_loss = (double *)nn_ws_base(ws), *sample_hit = sample_loss + z.n;
  const unsigned grid = (unsigned)(z.n < 65535 ? z.n : 65535);
  nn_ce_rows_k<<<grid, CE_THREADS, 0, st>>>(z, pz, plab, lab_stride, loss_scale, dz, pdz,
                                            label_smoothing, grad_scale, sample_loss, sample_hit);
  const int rc = nn_launched();
  if (rc) return rc;
  nn_ce_total_k<<<1, 1, 0, st>>>(z.n, sample_loss, sample_hit, loss, correct);
  return nn_launched();
}
