/* Multi-head self-attention in FP32 on the host's threads: attention.fwd
 * and attention.bwd (abi/bp_abi_ops.h), the math of
 * ops/shared/attention_math.h (its checks, its (sample, head) tasks, its
 * head operands) with every sum in float instead of double and exp from
 * blas_expf (blas-simd.h) instead of libm: within the op's validate
 * tolerance of the reference, not bit-identical to it.
 *
 * Per head (T tokens, dh channels; the ViT's T = 49, dh = 16) the three
 * GEMMs are T x T x dh; a library SGEMM per head would spend more on the
 * call and its packing than on the 38K multiply-adds (and its threads
 * would nest in the host's), so each task copies its head's q, k, v (and
 * dy) into contiguous float scratch, k and v also transposed, and runs row
 * loops the compiler vectorizes across keys or channels (AVX2 + FMA where
 * the CPU has them, BLAS_SIMD; the loops are built with dh as a constant
 * for 8, 16, 32 and 64, and for dh = 16, the ViT's, the key sums and the
 * dK, dV updates are written on 8-float vectors, kept in registers):
 *   forward, row t:  s = scale q_t K^T; p = exp(s - max) / sum;
 *                    y_t = p V; lse_t = max + log sum
 *   backward, row t: p = exp(scale q_t K^T - lse_t); dp = dy_t V^T;
 *                    ds = scale p (dp - dy_t . y_t); dq_t = ds K;
 *                    dK += ds^T q_t; dV += p^T dy_t
 * causal rows see keys u <= t only. dq, dk, dv are stored (or added, with
 * accumulate) once per element. Workspace: ops_attn_workspace (sized for
 * doubles; the float scratch uses half). FP16 through the FP16 adapter
 * (blas-impl.h), lse FP32. Bits: a function of the inputs and the
 * instruction set (each head is one task, summed in a fixed order). */
#include <math.h>
#include <string.h>

#include "blas-impl.h"
#include "blas-simd.h"
#include "shared/attention_math.h"

/* dst[t*dh + c] = src[t*ts + c*cs], or dst[c*T + t] when transposed */
BLAS_SIMD_INLINE void attn_gather(float *restrict dst, const float *src, int64_t ts, int64_t cs,
                                  int64_t T, int64_t dh, int transposed) {
  for (int64_t t = 0; t < T; t++)
    for (int64_t c = 0; c < dh; c++) dst[transposed ? c * T + t : t * dh + c] = src[t * ts + c * cs];
}

/* s[u] = scale * a . bT[:, u] for u < keys (bT: dh rows of ld) */
BLAS_SIMD_INLINE void attn_row_dots(float *restrict s, const float *restrict a,
                                    const float *restrict bT, int64_t ld, int64_t dh, int64_t keys,
                                    float scale) {
  for (int64_t u = 0; u < keys; u++) {
    float acc = 0.0f;
    for (int64_t c = 0; c < dh; c++) acc += a[c] * bT[c * ld + u];
    s[u] = acc * scale;
  }
}

/* Sums over keys run in ATTN_LANES interleaved partial sums (key u into
 * partial u % ATTN_LANES, added up in lane order at the end): a float
 * chain of one add per key would wait on the adder's latency at every
 * step; the order is still fixed, so the bits are too. */
#define ATTN_LANES 8

/* Eight floats in one vector register (a GCC / clang vector type: a ymm
 * register under BLAS_SIMD's AVX2 build, two xmm ones in the baseline). */
typedef float attn_v8 __attribute__((vector_size(32)));
/* (macros: a function passing a vector type by value would change its ABI
 * with the instruction set) */
#define ATTN_LOAD8(v, p) memcpy(&(v), (p), sizeof(attn_v8))
#define ATTN_STORE8(p, v) memcpy((p), &(v), sizeof(attn_v8))

/* attn_row_mix for dh = 16 (the ViT's heads) with its sums held in
 * registers: two vectors per partial sum, four partials (key u into
 * partial u % 4), added up as the general loop does; the compiler keeps
 * an array of partials in memory instead, and every add then waits on a
 * store and a load. */
BLAS_SIMD_INLINE void attn_row_mix16(float *restrict acc, const float *restrict w,
                                     const float *restrict rows, int64_t keys) {
  const attn_v8 zero = {0};
  attn_v8 lo[4] = {zero, zero, zero, zero}, hi[4] = {zero, zero, zero, zero}, r;
  int64_t u = 0;
  for (; u + 4 <= keys; u += 4)
    for (int l = 0; l < 4; l++) {
      ATTN_LOAD8(r, rows + (u + l) * 16);
      lo[l] += w[u + l] * r;
      ATTN_LOAD8(r, rows + (u + l) * 16 + 8);
      hi[l] += w[u + l] * r;
    }
  for (int l = 0; u < keys; u++, l++) {
    ATTN_LOAD8(r, rows + u * 16);
    lo[l] += w[u] * r;
    ATTN_LOAD8(r, rows + u * 16 + 8);
    hi[l] += w[u] * r;
  }
  r = (lo[0] + lo[1]) + (lo[2] + lo[3]);
  ATTN_STORE8(acc, r);
  r = (hi[0] + hi[1]) + (hi[2] + hi[3]);
  ATTN_STORE8(acc + 8, r);
}

/* acc[c] = sum_u w[u] * rows[u*dh + c] for u < keys (dh <= ATTN_MIX_MAX:
 * four partial sums per channel; wider heads one) */
#define ATTN_MIX_MAX 64
BLAS_SIMD_INLINE void attn_row_mix(float *restrict acc, const float *restrict w,
                                   const float *restrict rows, int64_t dh, int64_t keys) {
  if (dh > ATTN_MIX_MAX) {
    for (int64_t c = 0; c < dh; c++) acc[c] = 0.0f;
    for (int64_t u = 0; u < keys; u++)
      for (int64_t c = 0; c < dh; c++) acc[c] += w[u] * rows[u * dh + c];
    return;
  }
  if (dh == 16) {
    attn_row_mix16(acc, w, rows, keys);
    return;
  }
  float part[4][ATTN_MIX_MAX];
  for (int l = 0; l < 4; l++)
    for (int64_t c = 0; c < dh; c++) part[l][c] = 0.0f;
  int64_t u = 0;
  for (; u + 4 <= keys; u += 4)
    for (int l = 0; l < 4; l++)
      for (int64_t c = 0; c < dh; c++) part[l][c] += w[u + l] * rows[(u + l) * dh + c];
  for (int l = 0; u < keys; u++, l++)
    for (int64_t c = 0; c < dh; c++) part[l][c] += w[u] * rows[u * dh + c];
  for (int64_t c = 0; c < dh; c++) acc[c] = (part[0][c] + part[1][c]) + (part[2][c] + part[3][c]);
}

/* max_u s[u] for u < keys (keys >= 1), in ATTN_LANES lanes */
BLAS_SIMD_INLINE float attn_row_max(const float *restrict s, int64_t keys) {
  float m[ATTN_LANES];
  for (int l = 0; l < ATTN_LANES; l++) m[l] = s[0];
  int64_t u = 0;
  for (; u + ATTN_LANES <= keys; u += ATTN_LANES)
    for (int l = 0; l < ATTN_LANES; l++) m[l] = s[u + l] > m[l] ? s[u + l] : m[l];
  for (int l = 0; u < keys; u++, l++) m[l] = s[u] > m[l] ? s[u] : m[l];
  float r = m[0];
  for (int l = 1; l < ATTN_LANES; l++) r = m[l] > r ? m[l] : r;
  return r;
}

/* s[u] = exp(s[u] - m) for u < keys; returns their sum, in ATTN_LANES lanes */
BLAS_SIMD_INLINE float attn_row_exp(float *restrict s, int64_t keys, float m) {
  float sum[ATTN_LANES] = {0};
  int64_t u = 0;
  for (; u + ATTN_LANES <= keys; u += ATTN_LANES)
    for (int l = 0; l < ATTN_LANES; l++) {
      s[u + l] = blas_expf(s[u + l] - m);
      sum[l] += s[u + l];
    }
  for (int l = 0; u < keys; u++, l++) {
    s[u] = blas_expf(s[u] - m);
    sum[l] += s[u];
  }
  float r = 0.0f;
  for (int l = 0; l < ATTN_LANES; l++) r += sum[l];
  return r;
}

BLAS_SIMD_INLINE void attn_head_fwd(const ops_attn_geo *g, const ops_attn_head *h,
                                    float *scratch, int64_t dh) {
  const int64_t T = g->T;
  const float scale = (float)g->scale;
  float *restrict q = scratch, *restrict kT = q + T * dh, *restrict v = kT + T * dh;
  float *restrict s = v + T * dh, *restrict acc = s + T;
  attn_gather(q, h->q, h->ts, h->cs, T, dh, 0);
  attn_gather(kT, h->k, h->ts, h->cs, T, dh, 1);
  attn_gather(v, h->v, h->ts, h->cs, T, dh, 0);
  for (int64_t t = 0; t < T; t++) {
    const int64_t keys = ops_attn_keys(g, t);
    attn_row_dots(s, q + t * dh, kT, T, dh, keys, scale);
    const float m = attn_row_max(s, keys), sum = attn_row_exp(s, keys, m);
    const float inv = 1.0f / sum;
    for (int64_t u = 0; u < keys; u++) s[u] *= inv;
    attn_row_mix(acc, s, v, dh, keys);
    for (int64_t c = 0; c < dh; c++) h->y[t * h->yts + c * h->ycs] = acc[c];
    h->lse[t * h->lts] = m + logf(sum);
  }
}

/* dk[u] += ds[u] q_t and dv[u] += p[u] dy_t for u < keys, dh = 16, in
 * vector registers (left to itself, the compiler vectorizes this across
 * keys, with strided accesses) */
BLAS_SIMD_INLINE void attn_outer16(float *restrict dk, float *restrict dv,
                                   const float *restrict ds, const float *restrict p,
                                   const float *restrict qt, const float *restrict dyt,
                                   int64_t keys) {
  attn_v8 qlo, qhi, ylo, yhi, r;
  ATTN_LOAD8(qlo, qt);
  ATTN_LOAD8(qhi, qt + 8);
  ATTN_LOAD8(ylo, dyt);
  ATTN_LOAD8(yhi, dyt + 8);
  for (int64_t u = 0; u < keys; u++) {
    float *restrict dku = dk + u * 16, *restrict dvu = dv + u * 16;
    ATTN_LOAD8(r, dku);
    r += ds[u] * qlo;
    ATTN_STORE8(dku, r);
    ATTN_LOAD8(r, dku + 8);
    r += ds[u] * qhi;
    ATTN_STORE8(dku + 8, r);
    ATTN_LOAD8(r, dvu);
    r += p[u] * ylo;
    ATTN_STORE8(dvu, r);
    ATTN_LOAD8(r, dvu + 8);
    r += p[u] * yhi;
    ATTN_STORE8(dvu + 8, r);
  }
}

/* out (+)= value */
BLAS_SIMD_INLINE void attn_store(float *out, float value, int accumulate) {
  *out = accumulate ? *out + value : value;
}

BLAS_SIMD_INLINE void attn_head_bwd(const ops_attn_geo *g, const ops_attn_head *h,
                                    float *scratch, int64_t dh) {
  const int64_t T = g->T;
  const float scale = (float)g->scale;
  float *restrict q = scratch, *restrict kT = q + T * dh, *restrict k = kT + T * dh;
  float *restrict vT = k + T * dh, *restrict dy = vT + T * dh, *restrict dk = dy + T * dh;
  float *restrict dv = dk + T * dh, *restrict p = dv + T * dh, *restrict ds = p + T;
  float *restrict dp = ds + T, *restrict dq = dp + T;
  attn_gather(q, h->q, h->ts, h->cs, T, dh, 0);
  attn_gather(kT, h->k, h->ts, h->cs, T, dh, 1);
  attn_gather(k, h->k, h->ts, h->cs, T, dh, 0);
  attn_gather(vT, h->v, h->ts, h->cs, T, dh, 1);
  attn_gather(dy, h->dy, h->dts, h->dcs, T, dh, 0);
  for (int64_t i = 0; i < 2 * T * dh; i++) dk[i] = 0.0f;
  for (int64_t t = 0; t < T; t++) {
    const int64_t keys = ops_attn_keys(g, t);
    const float *restrict qt = q + t * dh, *restrict dyt = dy + t * dh;
    float dt = 0.0f; /* dy_t . y_t */
    for (int64_t c = 0; c < dh; c++) dt += dyt[c] * h->y[t * h->yts + c * h->ycs];
    const float lse = h->lse[t * h->lts];
    attn_row_dots(p, qt, kT, T, dh, keys, scale);
    for (int64_t u = 0; u < keys; u++) p[u] = blas_expf(p[u] - lse);
    attn_row_dots(dp, dyt, vT, T, dh, keys, 1.0f);
    for (int64_t u = 0; u < keys; u++) ds[u] = p[u] * (dp[u] - dt) * scale;
    attn_row_mix(dq, ds, k, dh, keys);
    for (int64_t c = 0; c < dh; c++) attn_store(h->dq + t * h->gts + c * h->gcs, dq[c], g->accumulate);
    if (dh == 16) {
      attn_outer16(dk, dv, ds, p, qt, dyt, keys);
      continue;
    }
    for (int64_t u = 0; u < keys; u++) {
      float *restrict dku = dk + u * dh, *restrict dvu = dv + u * dh;
      const float du = ds[u], pu = p[u];
      for (int64_t c = 0; c < dh; c++) {
        dku[c] += du * qt[c];
        dvu[c] += pu * dyt[c];
      }
    }
  }
  for (int64_t u = 0; u < T; u++)
    for (int64_t c = 0; c < dh; c++) {
      attn_store(h->dk + u * h->gts + c * h->gcs, dk[u * dh + c], g->accumulate);
      attn_store(h->dv + u * h->gts + c * h->gcs, dv[u * dh + c], g->accumulate);
    }
}

/* One head, its loops built for the common head widths as constants (the
 * compiler then unrolls the loops over channels and keeps a row's sums in
 * registers), else for any dh. */
BLAS_SIMD_INLINE void attn_head(const ops_attn_geo *g, const ops_attn_head *h, float *scratch,
                                int bwd) {
#define ATTN_DH(width)                                          \
  do {                                                          \
    if (bwd) attn_head_bwd(g, h, scratch, (width));             \
    else attn_head_fwd(g, h, scratch, (width));                 \
  } while (0)
  switch (g->dh) {
    case 8: ATTN_DH(8); break;
    case 16: ATTN_DH(16); break;
    case 32: ATTN_DH(32); break;
    case 64: ATTN_DH(64); break;
    default: ATTN_DH(g->dh); break;
  }
#undef ATTN_DH
}

/* One task's (sample, head) items, as ops_attn_task cuts them; the float
 * scratch of task i starts where attention_math.h's double scratch would
 * (twice what it needs). */
BLAS_SIMD_INLINE void attn_task_body(void *arg, int64_t task) {
  const ops_attn_job *job = (const ops_attn_job *)arg;
  const int64_t items = job->g.N * job->g.heads;
  float *scratch = (float *)(job->workspace + (uint64_t)task * ops_attn_scratch(&job->g));
  const int64_t lo = task * job->per_task;
  const int64_t hi = lo + job->per_task < items ? lo + job->per_task : items;
  for (int64_t i = lo; i < hi; i++) {
    const ops_attn_head h = ops_attn_head_of(job, i);
    attn_head(&job->g, &h, scratch, job->bwd);
  }
}
BLAS_SIMD(attn_task, (void *arg, int64_t task), (arg, task))

static int attn_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  return ops_attn_run(args, 0, 1, attn_task, 0);
}
static int attn_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  return ops_attn_run(args, 1, 1, attn_task, 0);
}

static const ops_fp16_kernel attn_fwd16 =
    BLAS_FP16(ops_attn_supports_fwd, ops_attn_workspace_fwd, attn_run_fwd, OPS_FP16_NO_ACCUMULATE);
static const ops_fp16_kernel attn_bwd16 =
    BLAS_FP16(ops_attn_supports_bwd, ops_attn_workspace_bwd, attn_run_bwd,
              offsetof(bp_attention_attrs, accumulate));
const bp_abi_kernel blas_attention_fwd = BLAS_KERNEL("attention.fwd", attn_fwd16);
const bp_abi_kernel blas_attention_bwd = BLAS_KERNEL("attention.bwd", attn_bwd16);
