/* attention.fwd and attention.bwd on the device. Math: abi/bp_abi_ops.h
 * and ops/shared/attention_math.h (the host loops); here in float, with
 * FP16 loads and stores where a tensor is FP16 (lse is always FP32).
 *
 * Both kernels run one block of ATTN_THREADS threads per (sample, head)
 * (grid min(N*heads, 65535), a grid-stride loop over the pairs) and stage
 * the head's operands in shared memory (nn_attn.c refuses shapes whose
 * stage exceeds 48 KiB, and dh > CUDA_ATTN_MAX_DH, the per-thread
 * accumulators).
 * nn_attn_fwd_k: K and V staged; thread i takes query rows i, i +
 *   ATTN_THREADS, ...: one pass over its keys with the running maximum
 *   (online softmax), then y_t = acc / l and lse_t = m + log l.
 * nn_attn_bwd_k: Q, K, V, dy, lse and D_t = dy_t . y_t staged; first a
 *   thread per query row t sums dq_t over the keys, then a thread per key
 *   u sums dk_u and dv_u over the queries (p and ds recomputed from lse a
 *   second time rather than added by atomics), so every sum runs in a
 *   fixed order and the bits never depend on timing. */
#include "nn-device.cuh"

#define ATTN_THREADS 64

/* element c of token t of sample n (tokens evenly spaced: t * s2) */
__device__ __forceinline__ int64_t attn_off(const cuda_nhwc *x, int64_t n, int64_t t, int64_t c) {
  return n * x->s0 + t * x->s2 + c * x->s3;
}

__global__ void nn_attn_fwd_k(cuda_nhwc q, const void *pq, cuda_nhwc y, void *py, cuda_nhwc l,
                              float *pl, int heads, int causal, float scale) {
  extern __shared__ float stage[];
  const int64_t T = q.h * q.w, D = q.c / 3, dh = D / heads;
  float *ks = stage, *vs = stage + T * dh;
  for (int64_t pair = blockIdx.x; pair < q.n * heads; pair += gridDim.x) {
    const int64_t n = pair / heads, j = pair % heads;
    __syncthreads(); /* the previous pair's readers are done */
    for (int64_t i = threadIdx.x; i < T * dh; i += blockDim.x) {
      const int64_t t = i / dh, c = i % dh;
      ks[i] = nn_ld(pq, q.fp16, attn_off(&q, n, t, D + j * dh + c));
      vs[i] = nn_ld(pq, q.fp16, attn_off(&q, n, t, 2 * D + j * dh + c));
    }
    __syncthreads();
    for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
      float qt[CUDA_ATTN_MAX_DH], acc[CUDA_ATTN_MAX_DH];
      for (int64_t c = 0; c < dh; c++) {
        qt[c] = nn_ld(pq, q.fp16, attn_off(&q, n, t, j * dh + c));
        acc[c] = 0.0f;
      }
      float m = -INFINITY, sum = 0.0f;
      const int64_t keys = causal ? t + 1 : T;
      for (int64_t u = 0; u < keys; u++) {
        float s = 0.0f;
        for (int64_t c = 0; c < dh; c++) s += qt[c] * ks[u * dh + c];
        s *= scale;
        const float m2 = fmaxf(m, s), rescale = expf(m - m2), p = expf(s - m2);
        sum = sum * rescale + p;
        for (int64_t c = 0; c < dh; c++) acc[c] = acc[c] * rescale + p * vs[u * dh + c];
        m = m2;
      }
      for (int64_t c = 0; c < dh; c++)
        nn_st(py, y.fp16, attn_off(&y, n, t, j * dh + c), acc[c] / sum);
      pl[attn_off(&l, n, t, j)] = m + logf(sum);
    }
  }
}

__global__ void nn_attn_bwd_k(cuda_nhwc q, const void *pq, cuda_nhwc y, const void *py,
                              cuda_nhwc l, const float *pl, cuda_nhwc dy, const void *pdy,
                              cuda_nhwc dq, void *pdq, int heads, int causal, float scale,
                              int accumulate) {
  extern __shared__ float stage[];
  const int64_t T = q.h * q.w, D = q.c / 3, dh = D / heads;
  float *qs = stage, *ks = qs + T * dh, *vs = ks + T * dh, *dys = vs + T * dh;
  float *lse = dys + T * dh, *Dt = lse + T;
  for (int64_t pair = blockIdx.x; pair < q.n * heads; pair += gridDim.x) {
    const int64_t n = pair / heads, j = pair % heads;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < T * dh; i += blockDim.x) {
      const int64_t t = i / dh, c = i % dh;
      qs[i] = nn_ld(pq, q.fp16, attn_off(&q, n, t, j * dh + c));
      ks[i] = nn_ld(pq, q.fp16, attn_off(&q, n, t, D + j * dh + c));
      vs[i] = nn_ld(pq, q.fp16, attn_off(&q, n, t, 2 * D + j * dh + c));
      dys[i] = nn_ld(pdy, dy.fp16, attn_off(&dy, n, t, j * dh + c));
    }
    for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
      lse[t] = pl[attn_off(&l, n, t, j)];
      float d = 0.0f;
      for (int64_t c = 0; c < dh; c++)
        d += nn_ld(pdy, dy.fp16, attn_off(&dy, n, t, j * dh + c)) *
             nn_ld(py, y.fp16, attn_off(&y, n, t, j * dh + c));
      Dt[t] = d;
    }
    __syncthreads();
    /* dq: a thread per query row */
    for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
      float acc[CUDA_ATTN_MAX_DH];
      for (int64_t c = 0; c < dh; c++) acc[c] = 0.0f;
      const int64_t keys = causal ? t + 1 : T;
      for (int64_t u = 0; u < keys; u++) {
        float s = 0.0f, dp = 0.0f;
        for (int64_t c = 0; c < dh; c++) {
          s += qs[t * dh + c] * ks[u * dh + c];
          dp += dys[t * dh + c] * vs[u * dh + c];
        }
        const float p = expf(s * scale - lse[t]), ds = p * (dp - Dt[t]) * scale;
        for (int64_t c = 0; c < dh; c++) acc[c] += ds * ks[u * dh + c];
      }
      for (int64_t c = 0; c < dh; c++)
        nn_st_acc(pdq, dq.fp16, attn_off(&dq, n, t, j * dh + c), acc[c], accumulate);
    }
    /* dk, dv: a thread per key */
    for (int64_t u = threadIdx.x; u < T; u += blockDim.x) {
      float ak[CUDA_ATTN_MAX_DH], av[CUDA_ATTN_MAX_DH];
      for (int64_t c = 0; c < dh; c++) ak[c] = av[c] = 0.0f;
      for (int64_t t = causal ? u : 0; t < T; t++) {
        float s = 0.0f, dp = 0.0f;
        for (int64_t c = 0; c < dh; c++) {
          s += qs[t * dh + c] * ks[u * dh + c];
          dp += dys[t * dh + c] * vs[u * dh + c];
        }
        const float p = expf(s * scale - lse[t]), ds = p * (dp - Dt[t]) * scale;
        for (int64_t c = 0; c < dh; c++) {
          ak[c] += ds * qs[t * dh + c];
          av[c] += p * dys[t * dh + c];
        }
      }
      for (int64_t c = 0; c < dh; c++) {
        nn_st_acc(pdq, dq.fp16, attn_off(&dq, n, u, D + j * dh + c), ak[c], accumulate);
        nn_st_acc(pdq, dq.fp16, attn_off(&dq, n, u, 2 * D + j * dh + c), av[c], accumulate);
      }
    }
  }
}

static unsigned attn_grid(const cuda_nhwc *q, int heads) {
  const int64_t pairs = q->n * heads;
  return (unsigned)(pairs < 65535 ? pairs : 65535);
}

extern "C" int cuda_nn_attention_fwd(void *stream, cuda_nhwc q, const void *pq, cuda_nhwc y,
                                     void *py, cuda_nhwc l, float *pl, int heads, int causal) {
  const int64_t dh = q.c / 3 / heads;
  const size_t shared = cuda_attn_fwd_shared(q.h * q.w, dh);
  nn_attn_fwd_k<<<attn_grid(&q, heads), ATTN_THREADS, shared, (cudaStream_t)stream>>>(
      q, pq, y, py, l, pl, heads, causal, (float)(1.0 / sqrt((double)dh)));
  return (int)cudaGetLastError();
}

extern "C" int cuda_nn_attention_bwd(void *stream, cuda_nhwc q, const void *pq, cuda_nhwc y,
                                     const void *py, cuda_nhwc l, const float *pl, cuda_nhwc dy,
                                     const void *pdy, cuda_nhwc dq, void *pdq, int heads,
                                     int causal, int accumulate) {
  const int64_t dh = q.c / 3 / heads;
  const size_t shared = cuda_attn_bwd_shared(q.h * q.w, dh);
  nn_attn_bwd_k<<<attn_grid(&q, heads), ATTN_THREADS, shared, (cudaStream_t)stream>>>(
      q, pq, y, py, l, pl, dy, pdy, dq, pdq, heads, causal, (float)(1.0 / sqrt((double)dh)),
      accumulate);
  return (int)cudaGetLastError();
}
