/* Element-wise reference kernels: ReLU forward/backward, add forward/backward.
 *
 * Every tensor of one op has the same NHWC shape; each has its own device
 * strides (padded channels skipped, never read or written). FP32, no
 * alignment beyond 4 bytes, the 16-byte tail never read. Elements are
 * visited in (n, h, w, c) order, each read before it is written, so an
 * output may be the very same elements as an input (same pointer, shape and
 * strides) where the op says "may alias"; partial overlaps are refused. */
#include "reference-impl.h"

/* Counts, dtypes, one common shape, the attribute block. */
static int ew_check(const bp_abi_kernel_args *args, int nin, int nout, bp_elementwise_attrs *a,
                    char *reason, size_t rs) {
  static const char *const names[] = {"input 0", "input 1", "output 0", "output 1"};
  if (!args) return ref_fail(reason, rs, "no args");
  if (!ref_read_attrs(args, a, sizeof *a, reason, rs) ||
      !ref_check_flag(a->accumulate, "accumulate", reason, rs) ||
      !ref_check_args(args, nin, nout, reason, rs))
    return 0;
  const bp_abi_tensor *first = &args->inputs[0];
  for (int i = 0; i < nin + nout; i++) {
    const bp_abi_tensor *t = i < nin ? &args->inputs[i] : &args->outputs[i - nin];
    const char *name = names[i < nin ? i : 2 + i - nin];
    if (!ref_check_tensor(t, name, BP_ABI_DTYPE_FP32, reason, rs) ||
        !ref_check_shape(t, name, first->shape[0], first->shape[1], first->shape[2],
                         first->shape[3], reason, rs))
      return 0;
  }
  return 1;
}

static int relu_supports_fwd(void *user, const bp_abi_kernel_args *args, char *reason,
                             size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return ew_check(args, 1, 1, &a, reason, rs);
}
static int relu_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason,
                             size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return ew_check(args, 2, 1, &a, reason, rs);
}
static int add_supports_fwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return ew_check(args, 2, 1, &a, reason, rs);
}
static int add_supports_bwd(void *user, const bp_abi_kernel_args *args, char *reason, size_t rs) {
  (void)user;
  bp_elementwise_attrs a;
  return ew_check(args, 1, 2, &a, reason, rs);
}

/* relu.fwd
 *   in: x   out: y (may be x itself)   y = x < 0 ? 0 : x
 *   y is overwritten (no accumulate). NaN passes through (NaN < 0 is
 *   false), so a NaN check downstream still sees it. */
static int relu_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_elementwise_attrs a;
  char reason[REF_REASON_MAX];
  static const int alias_out[] = {0}, alias_in[] = {0};
  if (!ew_check(args, 1, 1, &a, reason, sizeof reason) ||
      !ref_check_ptrs(args, alias_out, alias_in, 1))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tx = &args->inputs[0], *ty = &args->outputs[0];
  const float *x = ref_in(args, 0);
  float *y = ref_out(args, 0);
  for (int64_t n = 0; n < tx->shape[0]; n++)
    for (int64_t h = 0; h < tx->shape[1]; h++)
      for (int64_t w = 0; w < tx->shape[2]; w++)
        for (int64_t c = 0; c < tx->shape[3]; c++) {
          const float v = x[ref_off(tx, n, h, w, c)];
          y[ref_off(ty, n, h, w, c)] = v < 0.0f ? 0.0f : v;
        }
  return BP_ABI_OK;
}

/* relu.bwd
 *   in: y (the forward's output), dy   out: dx (may be dy itself)
 *   dx (+)= y > 0 ? dy : 0    accumulate 0: overwritten, 1: added.
 *   The gradient at y == 0 is 0. */
static int relu_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_elementwise_attrs a;
  char reason[REF_REASON_MAX];
  static const int alias_out[] = {0}, alias_in[] = {1};
  if (!ew_check(args, 2, 1, &a, reason, sizeof reason) ||
      !ref_check_ptrs(args, alias_out, alias_in, 1))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *ty = &args->inputs[0], *tdy = &args->inputs[1], *tdx = &args->outputs[0];
  const float *y = ref_in(args, 0), *dy = ref_in(args, 1);
  float *dx = ref_out(args, 0);
  for (int64_t n = 0; n < ty->shape[0]; n++)
    for (int64_t h = 0; h < ty->shape[1]; h++)
      for (int64_t w = 0; w < ty->shape[2]; w++)
        for (int64_t c = 0; c < ty->shape[3]; c++) {
          const float g = y[ref_off(ty, n, h, w, c)] > 0.0f ? dy[ref_off(tdy, n, h, w, c)] : 0.0f;
          float *o = dx + ref_off(tdx, n, h, w, c);
          *o = a.accumulate ? *o + g : g;
        }
  return BP_ABI_OK;
}

/* add.fwd
 *   in: a, b (same shape)   out: y = a + b, overwritten (no accumulate).
 *   y aliases neither input. */
static int add_run_fwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_elementwise_attrs at;
  char reason[REF_REASON_MAX];
  if (!ew_check(args, 2, 1, &at, reason, sizeof reason) || !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *ta = &args->inputs[0], *tb = &args->inputs[1], *ty = &args->outputs[0];
  const float *a = ref_in(args, 0), *b = ref_in(args, 1);
  float *y = ref_out(args, 0);
  for (int64_t n = 0; n < ta->shape[0]; n++)
    for (int64_t h = 0; h < ta->shape[1]; h++)
      for (int64_t w = 0; w < ta->shape[2]; w++)
        for (int64_t c = 0; c < ta->shape[3]; c++)
          y[ref_off(ty, n, h, w, c)] = a[ref_off(ta, n, h, w, c)] + b[ref_off(tb, n, h, w, c)];
  return BP_ABI_OK;
}

/* add.bwd
 *   in: dy   out: da, db   da (+)= dy, db (+)= dy
 *   accumulate 0: overwritten, 1: added. da and db alias neither dy nor
 *   each other. */
static int add_run_bwd(void *user, const bp_abi_kernel_args *args) {
  (void)user;
  bp_elementwise_attrs at;
  char reason[REF_REASON_MAX];
  if (!ew_check(args, 1, 2, &at, reason, sizeof reason) || !ref_check_ptrs(args, NULL, NULL, 0))
    return BP_ABI_ERR_INVALID;
  const bp_abi_tensor *tdy = &args->inputs[0], *tda = &args->outputs[0], *tdb = &args->outputs[1];
  const float *dy = ref_in(args, 0);
  float *da = ref_out(args, 0), *db = ref_out(args, 1);
  for (int64_t n = 0; n < tdy->shape[0]; n++)
    for (int64_t h = 0; h < tdy->shape[1]; h++)
      for (int64_t w = 0; w < tdy->shape[2]; w++)
        for (int64_t c = 0; c < tdy->shape[3]; c++) {
          const float g = dy[ref_off(tdy, n, h, w, c)];
          float *pa = da + ref_off(tda, n, h, w, c), *pb = db + ref_off(tdb, n, h, w, c);
          *pa = at.accumulate ? *pa + g : g;
          *pb = at.accumulate ? *pb + g : g;
        }
  return BP_ABI_OK;
}

const bp_abi_kernel ref_relu_fwd =
    REF_KERNEL("relu.fwd", relu_supports_fwd, relu_run_fwd, BP_ABI_KERNEL_IN_PLACE);
const bp_abi_kernel ref_relu_bwd =
    REF_KERNEL("relu.bwd", relu_supports_bwd, relu_run_bwd, BP_ABI_KERNEL_IN_PLACE);
const bp_abi_kernel ref_add_fwd = REF_KERNEL("add.fwd", add_supports_fwd, add_run_fwd, 0);
const bp_abi_kernel ref_add_bwd = REF_KERNEL("add.bwd", add_supports_bwd, add_run_bwd, 0);
