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
 *   s_tu = scale * q_t . k_u      lse_t = m_t + log sum_u exp(s_tu - m_t)
 *   p_tu = exp(s_tu - lse_t)      y_t = sum_u p_tu v_u
 * Backward (probabilities recomputed from lse, flash-style; D_t = dy_t . y_t):
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
#define OPS_ATTN_MAX_TASKS 64

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

/* Doubles of scratch one task needs: a row of scores, the D_t column, and
 * the dq row, dk and dv accumulators of the backward. */
static inline uint64_t ops_attn_scratch(const ops_attn_geo *g) {
  return (uint64_t)(2 * g->T + g->dh + 2 * g->T * g->dh);
}
static inline uint64_t ops_attn_tasks(const ops_attn_geo *g) {
  const int64_t items = g->N * g->heads;
  return (uint64_t)(items < OPS_ATTN_MAX_TASKS ? items : OPS_ATTN_MAX_TASKS);
}
static inline uint64_t ops_attn_workspace(const ops_attn_geo *g) {
  return ops_attn_tasks(g) * ops_attn_scratch(g) * sizeof(double);
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

static inline double ops_attn_dot(const float *a, int64_t as, const float *b, int64_t bs,
                                  int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += (double)a[i * as] * (double)b[i * bs];
  return s;
}

/* Keys row t sees: [0, ops_attn_keys). */
static inline int64_t ops_attn_keys(const ops_attn_geo *g, int64_t t) {
  return g->causal ? t + 1 : g->T;
}

/* Forward of one head; scratch: ops_attn_scratch doubles. */
static inline void ops_attn_head_fwd(const ops_attn_geo *g, const ops_attn_head *h,
                                     double *scratch) {
  const int64_t T = g->T, dh = g->dh;
  double *s = scratch, *acc = scratch + 2 * T;
  for (int64_t t = 0; t < T; t++) {
    const int64_t keys = ops_attn_keys(g, t);
    double m = -INFINITY;
    for (int64_t u = 0; u < keys; u++) {
      s[u] = g->scale * ops_attn_dot(h->q + t * h->ts, h->cs, h->k + u * h->ts, h->cs, dh);
      if (s[u] > m) m = s[u];
    }
    double sum = 0.0;
    for (int64_t u = 0; u < keys; u++) sum += exp(s[u] - m);
    const double lse = m + log(sum);
    for (int64_t c = 0; c < dh; c++) acc[c] = 0.0;
    for (int64_t u = 0; u < keys; u++) {
      const double p = exp(s[u] - lse);
      if (h->probs) h->probs[t * T + u] = (float)p;
      const float *vu = h->v + u * h->ts;
      for (int64_t c = 0; c < dh; c++) acc[c] += p * (double)vu[c * h->cs];
    }
    if (h->probs)
      for (int64_t u = keys; u < T; u++) h->probs[t * T + u] = 0.0f;
    for (int64_t c = 0; c < dh; c++) h->y[t * h->yts + c * h->ycs] = (float)acc[c];
    h->lse[t * h->lts] = (float)lse;
  }
}

/* out (+)= value, rounded once. */
static inline void ops_attn_store(float *out, double value, int accumulate) {
  *out = accumulate ? (float)((double)*out + value) : (float)value;
}

/* Backward of one head: dq, dk, dv (+)=; scratch: ops_attn_scratch doubles.
 * With h->probs, p_tu is read there instead of exp(s_tu - lse_t). */
static inline void ops_attn_head_bwd(const ops_attn_geo *g, const ops_attn_head *h,
                                     double *scratch) {
  const int64_t T = g->T, dh = g->dh;
  double *Dt = scratch + T, *dq = scratch + 2 * T, *dk = dq + dh, *dv = dk + T * dh;
  for (int64_t i = 0; i < 2 * T * dh; i++) dk[i] = 0.0;
  for (int64_t t = 0; t < T; t++)
    Dt[t] = ops_attn_dot(h->dy + t * h->dts, h->dcs, h->y + t * h->yts, h->ycs, dh);
  for (int64_t t = 0; t < T; t++) {
    const int64_t keys = ops_attn_keys(g, t);
    const float *qt = h->q + t * h->ts, *dyt = h->dy + t * h->dts;
    const double lse = h->lse[t * h->lts];
    for (int64_t c = 0; c < dh; c++) dq[c] = 0.0;
    for (int64_t u = 0; u < keys; u++) {
      const float *ku = h->k + u * h->ts, *vu = h->v + u * h->ts;
      const double p = h->probs ? (double)h->probs[t * T + u]
                                : exp(g->scale * ops_attn_dot(qt, h->cs, ku, h->cs, dh) - lse);
      const double dp = ops_attn_dot(dyt, h->dcs, vu, h->cs, dh);
      const double ds = p * (dp - Dt[t]) * g->scale;
      double *dku = dk + u * dh, *dvu = dv + u * dh;
      for (int64_t c = 0; c < dh; c++) {
        dq[c] += ds * (double)ku[c * h->cs];
        dku[c] += ds * (double)qt[c * h->cs];
        dvu[c] += p * (double)dyt[c * h->dcs];
      }
    }
    for (int64_t c = 0; c < dh; c++)
      ops_attn_store(h->dq + t * h->gts + c * h->gcs, dq[c], g->accumulate);
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

static inline void ops_attn_task(void *arg, int64_t task) {
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
 * (sample, head) in ops_attn_tasks tasks, on the host's threads when
 * `threaded`, else in order on the calling thread. The bits are the same
 * either way. */
static inline int ops_attn_run(const bp_abi_kernel_args *args, int bwd, int threaded) {
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
  const int64_t tasks = (int64_t)ops_attn_tasks(&job.g), items = job.g.N * job.g.heads;
  job.per_task = (items + tasks - 1) / tasks;
  if (threaded) bp_sdk_parallel_for(args, ops_attn_task, &job, tasks);
  else
    for (int64_t t = 0; t < tasks; t++) ops_attn_task(&job, t);
  return BP_ABI_OK;
}

static inline uint64_t ops_attn_workspace_size(const bp_abi_kernel_args *args, int bwd) {
  ops_attn_geo g = {0};
  return ops_attn_check(args, bwd, &g, NULL, 0) ? ops_attn_workspace(&g) : 0;
}

#endif
