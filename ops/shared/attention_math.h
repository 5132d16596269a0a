/* Multi-head self-attention on the host: the argument checks and the
 * per-(sample, head) arithmetic shared by ops/reference and ops/cpu, so both
 * accept the same nodes with the same reasons and give the same bits (each
 * head is one independent task whatever the thread count). Header-only
 * (static inline), on the module SDK. The contract is abi/bp_abi_ops.h
 * (attention.fwd, attention.bwd).
 *
 * Shape legend, per sample n (T = H*W tokens, token t = h*W + w):
 *   qkv  [N,H,W,3D]: q = channels 0..D-1, k = D..2D-1, v = 2D..3D-1;
 *        head j reads channels j*dh .. j*dh+dh-1 of each (dh = D/heads)
 *   y    [N,H,W,D]    head j's result in channels j*dh ..
 *   lse  [N,H,W,heads] FP32: log sum_u exp(s_tu) of token t's row of head j
 *   dy, dqkv: as y, qkv
 *
 * Math of one head (scale = 1/sqrt(dh); u runs over the keys a row sees:
 * all T, or u <= t when causal):
 *   s_tu = scale * q_t . k_u      e_tu = exp(s_tu - m_t), m_t = max_u s_tu
 *   p_tu = e_tu * (1 / sum_u e_tu)   y_t = sum_u p_tu v_u
 *   lse_t = m_t + log sum_u e_tu
 * Backward (probabilities recomputed from lse, flash-style: p_tu =
 * exp(s_tu - lse_t), equal to the forward's up to rounding; D_t = dy_t . y_t):
 *   dp_tu = dy_t . v_u            ds_tu = p_tu (dp_tu - D_t)
 *   dq_t = scale sum_u ds_tu k_u  dk_u = scale sum_t ds_tu q_t
 *   dv_u = sum_t p_tu dy_t
 * Every sum is in double, in index order, and each output is rounded to
 * float once (added to the old value once under accumulate).
 *
 * The probabilities may also be kept instead (`probs`, [T,T] floats per
 * head, as a plan holding them would): the forward writes them and the
 * backward reads them instead of recomputing q.k and exp. No op does that;
 * bench/attention_backward.c times both ways on these very loops
 * (docs/plan.md, "Attention"). */
#ifndef BP_OPS_SHARED_ATTENTION_MATH_H
#define BP_OPS_SHARED_ATTENTION_MATH_H

#include <math.h>

#include "bp_abi_sdk.h"

/* Tasks the host-side kernels cut (sample, head) pairs into: at most this
 * many, each with its own scratch in the workspace, so the workspace does
 * not grow with the batch. A function of the shape only. */
#define OPS_ATTN_MAX_TASKS 32

/* One call's geometry, from the checked tensors. */
typedef struct ops_attn_geo {
  int64_t N, T, D, heads, dh, W;
  int causal, accumulate;
  double scale;
} ops_attn_geo;

/* Tokens evenly spaced (stride[1] == W*stride[2], or H == 1): token t of a
 * sample is at t * stride[2]. */
static inline int ops_attn_tokens_even(const bp_abi_tensor *t, const char *name, char *reason,
                                       size_t rs) {
  if (t->shape[1] > 1 && t->stride[1] != t->shape[2] * t->stride[2])
    return bp_sdk_fail(reason, rs, "%s: rows of tokens are not evenly spaced (stride[1] %lld, "
                       "W*stride[2] %lld)", name, (long long)t->stride[1],
                       (long long)(t->shape[2] * t->stride[2]));
  return 1;
}

/* attention.fwd (bwd 0): qkv -> y, lse; attention.bwd (bwd 1): qkv, y,
 * lse, dy -> dqkv. Every tensor FP32 here: the FP16 adapter hands the
 * kernels an FP32 view of FP16 calls (lse stays FP32 in both). */
static inline int ops_attn_check(const bp_abi_kernel_args *args, int bwd, ops_attn_geo *g,
                                 char *reason, size_t rs) {
  bp_attention_attrs a;
  memset(g, 0, sizeof *g);
  if (!args) return bp_sdk_fail(reason, rs, "no args");
  if (!bp_sdk_read_attrs(args, &a, sizeof a, reason, rs) ||
      !bp_sdk_check_flag(a.causal, "causal", reason, rs) ||
      !bp_sdk_check_flag(a.accumulate, "accumulate", reason, rs) ||
      !bp_sdk_check_args(args, bwd ? 4 : 1, bwd ? 1 : 2, reason, rs))
    return 0;
  const bp_abi_tensor *qkv = bp_sdk_input(args, 0);
  if (!bp_sdk_check_tensor(qkv, "qkv", BP_ABI_DTYPE_FP32, reason, rs)) return 0;
  const int64_t N = qkv->shape[0], H = qkv->shape[1], W = qkv->shape[2], C = qkv->shape[3];
  if (C % 3 != 0)
    return bp_sdk_fail(reason, rs, "qkv: %lld channels, expected a multiple of 3 ([q | k | v])",
                       (long long)C);
  if (a.heads < 1 || (C / 3) % a.heads != 0)
    return bp_sdk_fail(reason, rs, "attribute heads is %d, expected a divisor of D = %lld",
                       (int)a.heads, (long long)(C / 3));
  const int64_t D = C / 3;
  const bp_abi_tensor *y = bwd ? bp_sdk_input(args, 1) : bp_sdk_output(args, 0);
  const bp_abi_tensor *lse = bwd ? bp_sdk_input(args, 2) : bp_sdk_output(args, 1);
  if (!bp_sdk_check_tensor(y, "y", BP_ABI_DTYPE_FP32, reason, rs) ||
      !bp_sdk_check_shape(y, "y", N, H, W, D, reason, rs) ||
      !bp_sdk_check_tensor(lse, "lse", BP_ABI_DTYPE_FP32, reason, rs) ||
      !bp_sdk_check_shape(lse, "lse", N, H, W, a.heads, reason, rs) ||
      !ops_attn_tokens_even(qkv, "qkv", reason, rs) || !ops_attn_tokens_even(y, "y", reason, rs) ||
      !ops_attn_tokens_even(lse, "lse", reason, rs))
    return 0;
  if (bwd) {
    const bp_abi_tensor *dy = bp_sdk_input(args, 3), *dqkv = bp_sdk_output(args, 0);
    if (!bp_sdk_check_tensor(dy, "dy", BP_ABI_DTYPE_FP32, reason, rs) ||
        !bp_sdk_check_shape(dy, "dy", N, H, W, D, reason, rs) ||
        !bp_sdk_check_tensor(dqkv, "dqkv", BP_ABI_DTYPE_FP32, reason, rs) ||
        !bp_sdk_check_shape(dqkv, "dqkv", N, H, W, C, reason, rs) ||
        !ops_attn_tokens_even(dy, "dy", reason, rs) ||
        !ops_attn_tokens_even(dqkv, "dqkv", reason, rs))
      return 0;
  }
  g->N = N;
  g->T = H * W;
  g->W = W;
  g->D = D;
  g->heads = a.heads;
  g->dh = D / a.heads;
  g->causal = a.causal;
  g->accumulate = bwd ? a.accumulate : 0;
  g->scale = 1.0 / sqrt((double)g->dh);
  return 1;
}

/* One head's operands: element c of token t of q at q[t*ts + c*cs] (k, v
 * likewise), of y at y[t*yts + c*ycs], lse_t at lse[t*lts]. */
typedef struct ops_attn_head {
  const float *q, *k, *v;
  int64_t ts, cs;
  const float *dy; /* backward */
  int64_t dts, dcs;
  float *dq, *dk, *dv; /* backward */
  int64_t gts, gcs;
  float *y; /* forward writes it, backward reads it */
  int64_t yts, ycs;
  float *lse;
  int64_t lts;
  float *probs; /* NULL, or [T,T] kept probabilities (bench only) */
} ops_attn_head;

/* The loops below are written so the compiler vectorizes them without
 * changing a bit: a head's operands are first copied (exactly) into
 * doubles, K and V also transposed, and every sum runs across lanes of
 * independent outputs (the scores of one row over its keys, the channels
 * of one output), each output summed in index order as a scalar loop
 * would. always_inline: ops/cpu instantiates them per instruction set. */
#define OPS_ATTN_INLINE static inline __attribute__((always_inline))

/* Doubles of scratch one task needs: the backward's seven [T,dh] copies
 * and accumulators, four rows of T and dq (the forward uses less). */
static inline uint64_t ops_attn_scratch(const ops_attn_geo *g) {
  return (uint64_t)(7 * g->T * g->dh + 4 * g->T + g->dh);
}
static inline uint64_t ops_attn_tasks(const ops_attn_geo *g) {
  const int64_t items = g->N * g->heads;
  return (uint64_t)(items < OPS_ATTN_MAX_TASKS ? items : OPS_ATTN_MAX_TASKS);
}
static inline uint64_t ops_attn_workspace(const ops_attn_geo *g) {
  return ops_attn_tasks(g) * ops_attn_scratch(g) * sizeof(double);
}

/* Keys row t sees: [0, ops_attn_keys). */
static inline int64_t ops_attn_keys(const ops_attn_geo *g, int64_t t) {
  return g->causal ? t + 1 : g->T;
}

/* dst[t*dh + c] = src[t*ts + c*cs] (rows), or dst[c*T + t] (transposed) */
OPS_ATTN_INLINE void ops_attn_gather(double *restrict dst, const float *src, int64_t ts,
                                     int64_t cs, int64_t T, int64_t dh, int transposed) {
  for (int64_t t = 0; t < T; t++)
    for (int64_t c = 0; c < dh; c++)
      dst[transposed ? c * T + t : t * dh + c] = (double)src[t * ts + c * cs];
}

/* s[u] = scale * sum_c a[c] * bT[c*T + u] for u < keys, each in c order */
OPS_ATTN_INLINE void ops_attn_row_dots(double *restrict s, const double *restrict a,
                                       const double *restrict bT, int64_t T, int64_t dh,
                                       int64_t keys, double scale) {
  for (int64_t u = 0; u < keys; u++) s[u] = 0.0;
  for (int64_t c = 0; c < dh; c++) {
    const double ac = a[c];
    const double *restrict b = bT + c * T;
    for (int64_t u = 0; u < keys; u++) s[u] += ac * b[u];
  }
  for (int64_t u = 0; u < keys; u++) s[u] *= scale;
}

/* acc[c] += sum_u w[u] * rows[u*dh + c] for u < keys, in u order */
OPS_ATTN_INLINE void ops_attn_row_mix(double *restrict acc, const double *restrict w,
                                      const double *restrict rows, int64_t dh, int64_t keys) {
  for (int64_t u = 0; u < keys; u++) {
    const double wu = w[u];
    const double *restrict r = rows + u * dh;
    for (int64_t c = 0; c < dh; c++) acc[c] += wu * r[c];
  }
}

/* Forward of one head; scratch: ops_attn_scratch doubles. */
OPS_ATTN_INLINE void ops_attn_head_fwd(const ops_attn_geo *g, const ops_attn_head *h,
                                       double *scratch) {
  const int64_t T = g->T, dh = g->dh;
  double *restrict q = scratch, *restrict kT = q + T * dh, *restrict v = kT + T * dh;
  double *restrict s = v + T * dh, *restrict acc = s + T;
  ops_attn_gather(q, h->q, h->ts, h->cs, T, dh, 0);
  ops_attn_gather(kT, h->k, h->ts, h->cs, T, dh, 1);
  ops_attn_gather(v, h->v, h->ts, h->cs, T, dh, 0);
  for (int64_t t = 0; t < T; t++) {
    const int64_t keys = ops_attn_keys(g, t);
    ops_attn_row_dots(s, q + t * dh, kT, T, dh, keys, g->scale);
    double m = -INFINITY;
    for (int64_t u = 0; u < keys; u++) m = s[u] > m ? s[u] : m;
    double sum = 0.0;
    for (int64_t u = 0; u < keys; u++) {
      s[u] = exp(s[u] - m);
      sum += s[u];
    }
    const double lse = m + log(sum), inv = 1.0 / sum;
    for (int64_t u = 0; u < keys; u++) s[u] *= inv;
    if (h->probs)
      for (int64_t u = 0; u < T; u++) h->probs[t * T + u] = u < keys ? (float)s[u] : 0.0f;
    for (int64_t c = 0; c < dh; c++) acc[c] = 0.0;
    ops_attn_row_mix(acc, s, v, dh, keys);
    for (int64_t c = 0; c < dh; c++) h->y[t * h->yts + c * h->ycs] = (float)acc[c];
    h->lse[t * h->lts] = (float)lse;
  }
}

/* out (+)= value, rounded once. */
OPS_ATTN_INLINE void ops_attn_store(float *out, double value, int accumulate) {
  *out = accumulate ? (float)((double)*out + value) : (float)value;
}

/* Backward of one head: dq, dk, dv (+)=; scratch: ops_attn_scratch doubles.
 * With h->probs, p_tu is read there instead of exp(s_tu - lse_t). */
OPS_ATTN_INLINE void ops_attn_head_bwd(const ops_attn_geo *g, const ops_attn_head *h,
                                       double *scratch) {
  const int64_t T = g->T, dh = g->dh;
  double *restrict q = scratch, *restrict kT = q + T * dh, *restrict k = kT + T * dh;
  double *restrict vT = k + T * dh, *restrict dy = vT + T * dh, *restrict dk = dy + T * dh;
  double *restrict dv = dk + T * dh, *restrict p = dv + T * dh, *restrict ds = p + T;
  double *restrict dp = ds + T, *restrict Dt = dp + T, *restrict dq = Dt + T;
  ops_attn_gather(q, h->q, h->ts, h->cs, T, dh, 0);
  ops_attn_gather(kT, h->k, h->ts, h->cs, T, dh, 1);
  ops_attn_gather(k, h->k, h->ts, h->cs, T, dh, 0);
  ops_attn_gather(vT, h->v, h->ts, h->cs, T, dh, 1);
  ops_attn_gather(dy, h->dy, h->dts, h->dcs, T, dh, 0);
  for (int64_t i = 0; i < 2 * T * dh; i++) dk[i] = 0.0;
  for (int64_t t = 0; t < T; t++) {
    double d = 0.0;
    for (int64_t c = 0; c < dh; c++) d += dy[t * dh + c] * (double)h->y[t * h->yts + c * h->ycs];
    Dt[t] = d;
  }
  for (int64_t t = 0; t < T; t++) {
    const int64_t keys = ops_attn_keys(g, t);
    const double *restrict qt = q + t * dh, *restrict dyt = dy + t * dh;
    if (h->probs) {
      for (int64_t u = 0; u < keys; u++) p[u] = (double)h->probs[t * T + u];
    } else {
      const double lse = h->lse[t * h->lts];
      ops_attn_row_dots(p, qt, kT, T, dh, keys, g->scale);
      for (int64_t u = 0; u < keys; u++) p[u] = exp(p[u] - lse);
    }
    ops_attn_row_dots(dp, dyt, vT, T, dh, keys, 1.0);
    for (int64_t u = 0; u < keys; u++) ds[u] = p[u] * (dp[u] - Dt[t]) * g->scale;
    for (int64_t c = 0; c < dh; c++) dq[c] = 0.0;
    ops_attn_row_mix(dq, ds, k, dh, keys);
    for (int64_t c = 0; c < dh; c++)
      ops_attn_store(h->dq + t * h->gts + c * h->gcs, dq[c], g->accumulate);
    for (int64_t u = 0; u < keys; u++) {
      double *restrict dku = dk + u * dh, *restrict dvu = dv + u * dh;
      const double du = ds[u], pu = p[u];
      for (int64_t c = 0; c < dh; c++) {
        dku[c] += du * qt[c];
        dvu[c] += pu * dyt[c];
      }
    }
  }
  for (int64_t u = 0; u < T; u++)
    for (int64_t c = 0; c < dh; c++) {
      ops_attn_store(h->dk + u * h->gts + c * h->gcs, dk[u * dh + c], g->accumulate);
      ops_attn_store(h->dv + u * h->gts + c * h->gcs, dv[u * dh + c], g->accumulate);
    }
}

/* ---- one call over every (sample, head) ---------------------------------- */

typedef struct ops_attn_job {
  const bp_abi_kernel_args *args;
  ops_attn_geo g;
  int bwd;
  double *workspace;
  int64_t per_task; /* (sample, head) items per task */
  int isa;          /* the caller's instruction set (ops/cpu), carried to its tasks */
} ops_attn_job;

/* The head operands of item i = n*heads + j. */
static inline ops_attn_head ops_attn_head_of(const ops_attn_job *job, int64_t i) {
  const bp_abi_kernel_args *args = job->args;
  const ops_attn_geo *g = &job->g;
  const int64_t n = i / g->heads, j = i % g->heads;
  const bp_abi_tensor *tq = bp_sdk_input(args, 0);
  const bp_abi_tensor *ty = job->bwd ? bp_sdk_input(args, 1) : bp_sdk_output(args, 0);
  const bp_abi_tensor *tl = job->bwd ? bp_sdk_input(args, 2) : bp_sdk_output(args, 1);
  const float *qkv = (const float *)args->input_ptrs[0];
  float *y = job->bwd ? (float *)args->input_ptrs[1] : (float *)args->output_ptrs[0];
  float *lse = job->bwd ? (float *)args->input_ptrs[2] : (float *)args->output_ptrs[1];
  ops_attn_head h = {0};
  const int64_t base = bp_sdk_offset(tq, n, 0, 0, j * g->dh);
  h.q = qkv + base;
  h.k = qkv + base + g->D * tq->stride[3];
  h.v = qkv + base + 2 * g->D * tq->stride[3];
  h.ts = tq->stride[2];
  h.cs = tq->stride[3];
  h.y = y + bp_sdk_offset(ty, n, 0, 0, j * g->dh);
  h.yts = ty->stride[2];
  h.ycs = ty->stride[3];
  h.lse = lse + bp_sdk_offset(tl, n, 0, 0, j);
  h.lts = tl->stride[2];
  if (job->bwd) {
    const bp_abi_tensor *td = bp_sdk_input(args, 3), *tg = bp_sdk_output(args, 0);
    h.dy = (const float *)args->input_ptrs[3] + bp_sdk_offset(td, n, 0, 0, j * g->dh);
    h.dts = td->stride[2];
    h.dcs = td->stride[3];
    float *dqkv = (float *)args->output_ptrs[0] + bp_sdk_offset(tg, n, 0, 0, j * g->dh);
    h.dq = dqkv;
    h.dk = dqkv + g->D * tg->stride[3];
    h.dv = dqkv + 2 * g->D * tg->stride[3];
    h.gts = tg->stride[2];
    h.gcs = tg->stride[3];
  }
  return h;
}

OPS_ATTN_INLINE void ops_attn_task(void *arg, int64_t task) {
  const ops_attn_job *job = (const ops_attn_job *)arg;
  const int64_t items = job->g.N * job->g.heads;
  double *scratch = job->workspace + (uint64_t)task * ops_attn_scratch(&job->g);
  const int64_t lo = task * job->per_task;
  const int64_t hi = lo + job->per_task < items ? lo + job->per_task : items;
  for (int64_t i = lo; i < hi; i++) {
    const ops_attn_head h = ops_attn_head_of(job, i);
    if (job->bwd) ops_attn_head_bwd(&job->g, &h, scratch);
    else ops_attn_head_fwd(&job->g, &h, scratch);
  }
}

/* run() of either op: checks (reasons into the host's buffer), then every
 * (sample, head) in ops_attn_tasks tasks: task(job, i) for each, on the
 * host's threads when `threaded`, else in order on the calling thread
 * (task is ops_attn_task, or ops/cpu's instantiation of it for `isa`).
 * The bits are the same either way. */
static inline int ops_attn_run(const bp_abi_kernel_args *args, int bwd, int threaded,
                               void (*task)(void *job, int64_t i), int isa) {
  char *reason = bp_sdk_args_reason(args);
  const size_t rs = bp_sdk_args_reason_size(args);
  ops_attn_job job = {0};
  if (!ops_attn_check(args, bwd, &job.g, reason, rs) ||
      !bp_sdk_check_ptrs(args, NULL, NULL, 0, reason, rs))
    return BP_ABI_ERR_INVALID;
  const uint64_t need = ops_attn_workspace(&job.g);
  if (!args->workspace || args->workspace_bytes < need ||
      (uintptr_t)args->workspace % sizeof(double) != 0) {
    bp_sdk_fail(reason, rs, "workspace of %llu bytes (8-byte aligned) needed",
                (unsigned long long)need);
    return BP_ABI_ERR_INVALID;
  }
  job.args = args;
  job.bwd = bwd;
  job.workspace = (double *)args->workspace;
  job.isa = isa;
  const int64_t tasks = (int64_t)ops_attn_tasks(&job.g), items = job.g.N * job.g.heads;
  job.per_task = (items + tasks - 1) / tasks;
  if (threaded) bp_sdk_parallel_for(args, task, &job, tasks);
  else
    for (int64_t t = 0; t < tasks; t++) task(&job, t);
  return BP_ABI_OK;
}

static inline uint64_t ops_attn_workspace_size(const bp_abi_kernel_args *args, int bwd) {
  ops_attn_geo g = {0};
  return ops_attn_check(args, bwd, &g, NULL, 0) ? ops_attn_workspace(&g) : 0;
}

/* The ABI's supports() and workspace_size() of attention.fwd / .bwd, the
 * same in every CPU module (the reference, ops/cpu, ops/blas). */
static inline int ops_attn_supports_fwd(void *user, const bp_abi_kernel_args *args, char *reason,
                                        size_t rs) {
  (void)user;
  ops_attn_geo g;
  return ops_attn_check(args, 0, &g, reason, rs);
}
static inline int ops_attn_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason,
                                        size_t rs) {
  (void)user;
  ops_attn_geo g;
  return ops_attn_check(args, 1, &g, reason, rs);
}
static inline uint64_t ops_attn_workspace_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  return ops_attn_workspace_size(args, 0);
}
static inline uint64_t ops_attn_workspace_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  return ops_attn_workspace_size(args, 1);
}

#endif
