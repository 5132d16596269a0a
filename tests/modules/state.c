/* An ABI 1.4 module whose relu.fwd kernel ("stateful") keeps per-node
 * state: prepare() makes it, run() checks it and "repacks" when the
 * parameter generation moved, release() frees it. It counts every call in
 * a tm_state_stats (its kernel's user) and fails on the test's request,
 * with or without a reason. run() computes relu through the host's
 * parallel_for, so a model that uses it trains as with any relu. Counters
 * are atomic: ranks as threads share the module. */
#include <stdio.h>
#include <stdlib.h>

#include "state_module.h"
#include "test_module.h"

#define STATE_MAGIC 0x5747u

static tm_state_stats stats;

typedef struct node_state {
  unsigned magic;
  uint64_t generation; /* what the "packed" copy was made at */
} node_state;

#define BUMP(field) __atomic_add_fetch(&(field), 1, __ATOMIC_RELAXED)

static int services_ok(const bp_abi_kernel_args *a) {
  return a->struct_size >= sizeof *a && a->reason && a->reason_size > 0 && a->threads &&
         a->threads->count >= 1 && a->threads->parallel_for && a->params_generation;
}

static int rank_slot(const bp_abi_kernel_args *a) {
  return a->rank >= 0 && a->rank < TM_STATE_MAX_RANKS ? a->rank : 0;
}

static int prepare(void *user, const bp_abi_kernel_args *a, void **state_out) {
  tm_state_stats *s = user;
  const int n = BUMP(s->prepares);
  BUMP(s->prepares_by_rank[rank_slot(a)]);
  if (!services_ok(a) || a->state != NULL) BUMP(s->bad_prepare_args);
  if (n == s->fail_prepare) {
    snprintf(a->reason, a->reason_size, "cannot pack %lld channels",
             (long long)a->inputs[0].shape[3]);
    return BP_ABI_ERR_UNSUPPORTED;
  }
  node_state *st = malloc(sizeof *st);
  if (!st) return BP_ABI_ERR_NOMEM;
  st->magic = STATE_MAGIC;
  st->generation = *a->params_generation;
  *state_out = st;
  return BP_ABI_OK;
}

static void release(void *user, void *state) {
  tm_state_stats *s = user;
  BUMP(s->releases);
  node_state *st = state;
  if (st->magic != STATE_MAGIC) abort(); /* not a state prepare() made */
  st->magic = 0;
  free(st);
}

typedef struct relu_job {
  const bp_abi_tensor *x, *y;
  const float *xp;
  float *yp;
} relu_job;

static void relu_row(void *arg, int64_t n) {
  const relu_job *j = arg;
  for (int64_t h = 0; h < j->x->shape[1]; h++)
    for (int64_t w = 0; w < j->x->shape[2]; w++)
      for (int64_t c = 0; c < j->x->shape[3]; c++) {
        const float v = j->xp[n * j->x->stride[0] + h * j->x->stride[1] + w * j->x->stride[2] +
                              c * j->x->stride[3]];
        j->yp[n * j->y->stride[0] + h * j->y->stride[1] + w * j->y->stride[2] +
              c * j->y->stride[3]] = v > 0.0f ? v : 0.0f;
      }
}

static int run(void *user, const bp_abi_kernel_args *a) {
  tm_state_stats *s = user;
  BUMP(s->runs);
  BUMP(s->runs_by_rank[rank_slot(a)]);
  node_state *st = a->state;
  if (!services_ok(a) || !st || st->magic != STATE_MAGIC) {
    BUMP(s->bad_run_args);
    return BP_ABI_ERR_INVALID;
  }
  __atomic_store_n(&s->last_generation, *a->params_generation, __ATOMIC_RELAXED);
  __atomic_store_n(&s->threads_count, a->threads->count, __ATOMIC_RELAXED);
  if (st->generation != *a->params_generation) { /* parameters moved: "repack" */
    BUMP(s->generation_changes);
    st->generation = *a->params_generation;
  }
  if (s->fail_run) {
    if (!s->fail_silent)
      snprintf(a->reason, a->reason_size, "the packed weights went stale at generation %llu",
               (unsigned long long)*a->params_generation);
    return s->fail_run;
  }
  relu_job j = {&a->inputs[0], &a->outputs[0], a->input_ptrs[0], a->output_ptrs[0]};
  a->threads->parallel_for(a->threads->ctx, relu_row, &j, a->inputs[0].shape[0]);
  return BP_ABI_OK;
}

static const bp_abi_kernel kernel = {
    .struct_size = sizeof(bp_abi_kernel),
    .op = "relu.fwd",
    .impl = "stateful",
    .device = "cpu",
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32),
    .priority = 1,
    .flags = 0,
    .run = run,
    .user = &stats,
    .prepare = prepare,
    .release = release,
};

static int init(const bp_abi_host *host) { return host->register_kernel(host->ctx, &kernel); }

TM_MODULE("test-state", init)
