/* A test-only op module for mixed precision (tests/test_amp_train.c): an
 * FP16 relu.bwd kernel ("inf_grad", USER priority, so it wins over every
 * shipped one) that computes the op as the reference does, "FP16 storage,
 * FP32 arithmetic" (dx = y > 0 ? dy : 0, accumulated as
 * round16(float(dx) + result)), and then, at the steps and ranks the test
 * asks for, writes +Inf into the first element of dx: a gradient overflow
 * on demand, on one rank only if the test wants.
 *
 * Which steps: the environment variable BP_TEST_INF_GRAD, read when a node
 * is bound (prepare), a comma-separated list of STEP:RANK pairs, STEP
 * counting the runs of that bound node from 1 (one run per training step
 * of its variant, in this process), RANK the global rank (args->rank).
 * Unset or empty: never. Each bound node counts its own runs in its state,
 * so ranks as threads never share a counter. Links nothing from the core. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bp_abi_ops.h"
#include "bp_abi_sdk.h"
#include "test_module.h"

#define MAX_POINTS 16
#define FP16_INF 0x7c00u

typedef struct node_state {
  int64_t runs;                  /* of this bound node so far */
  int count;                     /* points below */
  int64_t step[MAX_POINTS];      /* runs at which ... */
  int32_t rank[MAX_POINTS];      /* ... this rank writes the Inf */
} node_state;

/* Parses "S:R,S:R"; 0 (with a reason) on anything else. */
static int parse_points(const char *text, node_state *s, char *reason, size_t size) {
  s->count = 0;
  for (const char *p = text; p && *p;) {
    char *end;
    const long long step = strtoll(p, &end, 10);
    if (end == p || *end != ':' || step < 1 || s->count == MAX_POINTS)
      return bp_sdk_fail(reason, size, "BP_TEST_INF_GRAD '%s': want STEP:RANK[,STEP:RANK]", text);
    p = end + 1;
    const long rank = strtol(p, &end, 10);
    if (end == p || (*end && *end != ',') || rank < 0)
      return bp_sdk_fail(reason, size, "BP_TEST_INF_GRAD '%s': want STEP:RANK[,STEP:RANK]", text);
    s->step[s->count] = step;
    s->rank[s->count++] = (int32_t)rank;
    p = *end ? end + 1 : end;
  }
  return 1;
}

/* in: y, dy (FP16, same shape)   out: dx (FP16)   bp_elementwise_attrs */
static int check(const bp_abi_kernel_args *a, char *reason, size_t size) {
  if (!bp_sdk_check_args(a, 2, 1, reason, size)) return 0;
  const bp_abi_tensor *y = bp_sdk_input(a, 0), *dy = bp_sdk_input(a, 1), *dx = bp_sdk_output(a, 0);
  if (!bp_sdk_check_tensor(y, "y", BP_ABI_DTYPE_FP16, reason, size) ||
      !bp_sdk_check_tensor(dy, "dy", BP_ABI_DTYPE_FP16, reason, size) ||
      !bp_sdk_check_tensor(dx, "dx", BP_ABI_DTYPE_FP16, reason, size) ||
      !bp_sdk_check_shape(dy, "dy", y->shape[0], y->shape[1], y->shape[2], y->shape[3], reason,
                          size) ||
      !bp_sdk_check_shape(dx, "dx", y->shape[0], y->shape[1], y->shape[2], y->shape[3], reason,
                          size))
    return 0;
  bp_elementwise_attrs at;
  return bp_sdk_read_attrs(a, &at, sizeof at, reason, size) &&
         bp_sdk_check_flag(at.accumulate, "accumulate", reason, size);
}

static int supports(void *user, const bp_abi_kernel_args *a, char *reason, size_t size) {
  (void)user;
  return check(a, reason, size);
}

static int prepare(void *user, const bp_abi_kernel_args *a, void **state_out) {
  (void)user;
  node_state *s = calloc(1, sizeof *s);
  if (!s) return BP_ABI_ERR_NOMEM;
  if (!parse_points(getenv("BP_TEST_INF_GRAD"), s, a->reason, a->reason_size)) {
    free(s);
    return BP_ABI_ERR_INVALID;
  }
  *state_out = s;
  return BP_ABI_OK;
}

static void release(void *user, void *state) {
  (void)user;
  free(state);
}

static int run(void *user, const bp_abi_kernel_args *a) {
  (void)user;
  char *reason = bp_sdk_args_reason(a);
  const size_t size = bp_sdk_args_reason_size(a);
  node_state *s = bp_sdk_args_state(a);
  if (!check(a, reason, size)) return BP_ABI_ERR_INVALID;
  if (!s) {
    bp_sdk_fail(reason, size, "no state: prepare() did not run");
    return BP_ABI_ERR_INVALID;
  }
  const bp_abi_tensor *ty = bp_sdk_input(a, 0), *tdy = bp_sdk_input(a, 1), *tdx = bp_sdk_output(a, 0);
  const uint16_t *y = bp_sdk_input_data(a, 0), *dy = bp_sdk_input_data(a, 1);
  uint16_t *dx = bp_sdk_output_data(a, 0);
  bp_elementwise_attrs at;
  bp_sdk_read_attrs(a, &at, sizeof at, reason, size);
  BP_SDK_FOR_EACH_NHWC(ty, n, h, w, c) {
    const float g = bp_sdk_fp16_to_fp32(y[bp_sdk_offset(ty, n, h, w, c)]) > 0.0f
                        ? bp_sdk_fp16_to_fp32(dy[bp_sdk_offset(tdy, n, h, w, c)])
                        : 0.0f;
    uint16_t *o = &dx[bp_sdk_offset(tdx, n, h, w, c)];
    *o = bp_sdk_fp32_to_fp16(at.accumulate ? bp_sdk_fp16_to_fp32(*o) + g : g);
  }
  s->runs++;
  for (int k = 0; k < s->count; k++)
    if (s->step[k] == s->runs && s->rank[k] == a->rank) dx[0] = FP16_INF;
  return BP_ABI_OK;
}

static const bp_abi_kernel relu_bwd = {
    .struct_size = sizeof(bp_abi_kernel),
    .op = "relu.bwd",
    .impl = "inf_grad",
    .device = "cpu",
    .dtypes = BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP16),
    .priority = BP_ABI_PRIORITY_USER,
    .flags = BP_ABI_KERNEL_DETERMINISTIC,
    .supports = supports,
    .run = run,
    .prepare = prepare,
    .release = release,
};

static int init(const bp_abi_host *host) {
  return host->register_kernel(host->ctx, &relu_bwd);
}

TM_MODULE("test-inf-grad", init)
