/* FP16 kernels of the compute ops (conv2d, fc, relu, add, the pools, batch
 * norm) in every in-tree module that has them (reference, cpu, and blas /
 * dnnl where built), all served by the FP16 adapter
 * (ops/shared/fp16_adapter.h), and the F16C conversions
 * (ops/shared/fp16_convert_x86.h).
 *
 * The oracle: the FP32 reference kernel run on FP32 copies of the same
 * FP16-exact inputs, with accumulate 0; the expected FP16 output is that
 * result rounded once to nearest even, and with accumulate 1
 * round16(float(old) + result). The mixed-precision contract fixes those
 * bits, so:
 *  - reference and cpu (whose FP32 kernels are bit-identical to the
 *    reference's, and whose F16C conversions give the scalar bits) must
 *    match them exactly, bit for bit, FP16 and FP32 outputs alike;
 *  - blas / dnnl sum in another order (their FP32 kernels are within 1e-4
 *    of the reference, tests/test_ops_blas.c), which can move a rounding
 *    boundary by one FP16 ulp: err = max|got - expected| / max(1,
 *    max|expected|) < FP16_GEMM_TOL = 2e-3 (two FP16 ulps at 1).
 * Every call uses the mixed-precision layouts of `blueprint plan --amp`:
 * FP16 features with channel padding, FP16 weights and gradients, FP32
 * batch-norm statistics, INT8 masks. Output channel padding and the
 * 16-byte tail must stay untouched (sentinel bytes). Also: in-place relu
 * and batch-norm statistics, selection of the fast kernels for padded
 * FP16 features that their FP32 forms refuse, refusals with reasons, and
 * the conversions' bits for every FP16 value and a sweep of FP32 ones. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bp_abi_sdk.h"
#include "ops_ref_util.h"
#include "shared/fp16_convert_x86.h"

#define FP16_GEMM_TOL 2e-3

/* ---- modules ----------------------------------------------------------------- */

static const char *const gemm_paths[] = {
#ifdef BP_OPS_BLAS_PATH
    BP_OPS_BLAS_PATH,
#endif
#ifdef BP_OPS_DNNL_PATH
    BP_OPS_DNNL_PATH,
#endif
    NULL};

/* The reference module (ops_ref_util.c), then cpu, blas and dnnl (a GEMM
 * module whose library is missing is left out). */
static void load_all(void) {
  static int loaded;
  if (loaded) return;
  bp_registry *r = ops_registry_with(BP_OPS_CPU_PATH);
  for (int i = 0; gemm_paths[i]; i++)
    if (bp_registry_load(r, gemm_paths[i]) != BP_OK)
      fprintf(stderr, "test_ops_fp16: %s not loaded: %s\n", gemm_paths[i], bp_last_error());
  loaded = 1;
}

/* The kernel of op in impl, or NULL. */
static const bp_abi_kernel *find_kernel(const char *op, const char *impl) {
  load_all();
  const bp_registry *r = ops_registry_get();
  for (int i = 0; i < bp_registry_kernel_count(r); i++) {
    const bp_abi_kernel *k = &bp_registry_kernel(r, i)->kernel;
    if (strcmp(k->op, op) == 0 && strcmp(k->impl, impl) == 0) return k;
  }
  return NULL;
}

static const char *const impls[] = {"reference", "cpu", "blas", "dnnl"};
#define IMPLS 4

/* ---- tensors of any dtype -------------------------------------------------------- */

static size_t esize(const tt *t) { return bp_sdk_dtype_size(t->d.dtype); }

/* Logical element i (compact NHWC order) of t. */
static void *elem(const tt *t, int64_t i) {
  const int64_t c = i % t->d.shape[3];
  i /= t->d.shape[3];
  const int64_t w = i % t->d.shape[2];
  i /= t->d.shape[2];
  const int64_t h = i % t->d.shape[1], n = i / t->d.shape[1];
  return (char *)t->data + (size_t)bp_sdk_offset(&t->d, n, h, w, c) * esize(t);
}

static float get(const tt *t, int64_t i) {
  const void *p = elem(t, i);
  switch (t->d.dtype) {
    case BP_ABI_DTYPE_FP16: {
      uint16_t h;
      memcpy(&h, p, 2);
      return bp_sdk_fp16_to_fp32(h);
    }
    case BP_ABI_DTYPE_INT8: return (float)*(const int8_t *)p;
    default: {
      float f;
      memcpy(&f, p, 4);
      return f;
    }
  }
}

static void set(const tt *t, int64_t i, float v) {
  void *p = elem(t, i);
  switch (t->d.dtype) {
    case BP_ABI_DTYPE_FP16: {
      const uint16_t h = bp_sdk_fp32_to_fp16(v);
      memcpy(p, &h, 2);
      break;
    }
    case BP_ABI_DTYPE_INT8: *(int8_t *)p = (int8_t)v; break;
    default: memcpy(p, &v, 4); break;
  }
}

/* ---- cases ------------------------------------------------------------------------- */

/* One tensor: dtype, shape, extra (padding) channels, values uniform in
 * [lo, hi) rounded to FP16 (integers for INT8: [lo, hi)). An output with
 * alias > 0 is input alias-1 itself (in place). */
typedef struct spec {
  int32_t dtype;
  int64_t n, h, w, c, extra;
  double lo, hi;
  int alias;
} spec;

typedef struct fcase {
  const char *name, *op;
  int nin, nout;
  spec in[5], out[5];
  const void *attrs;
  uint32_t attr_size;
  size_t acc_offset; /* of the accumulate flag; SIZE_MAX: a forward op */
} fcase;

#define F16 BP_ABI_DTYPE_FP16
#define F32 BP_ABI_DTYPE_FP32
#define I8 BP_ABI_DTYPE_INT8
#define NO_ACC SIZE_MAX

static const bp_conv2d_attrs conv_a = {3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0};      /* 3x3 pad 1, bias */
static const bp_conv2d_attrs conv_s2 = {3, 3, 2, 2, 1, 1, 1, 1, 1, 0, 0}; /* stride 2 */
static const bp_fc_attrs fc_a = {1, 0};
static const bp_elementwise_attrs ew_a = {0};
static const bp_pool_attrs maxp_a = {2, 2, 2, 2, 0, 0, 0, 0};
static const bp_pool_attrs avgp_a = {3, 3, 2, 2, 1, 1, 0, 0};
static const bp_batchnorm_attrs bn_a = {1e-5f, 0.1f, 0};

#define CONV_ACC offsetof(bp_conv2d_attrs, accumulate)
#define FC_ACC offsetof(bp_fc_attrs, accumulate)
#define EW_ACC offsetof(bp_elementwise_attrs, accumulate)
#define POOL_ACC offsetof(bp_pool_attrs, accumulate)
#define BN_ACC offsetof(bp_batchnorm_attrs, accumulate)

/* x [2,5,6,3] padded to 8 (as an FP16 feature), w [4,3,3,3], y [2,5,6,4] padded to 8 */
#define X16 {F16, 2, 5, 6, 3, 5, -2, 2, 0}
#define W16 {F16, 4, 3, 3, 3, 0, -1, 1, 0}
#define B16 {F16, 1, 1, 1, 4, 0, -1, 1, 0}
#define Y16 {F16, 2, 5, 6, 4, 4, -1, 1, 0}
#define Y16S2 {F16, 2, 3, 3, 4, 4, -1, 1, 0}
/* fc: x [3,2,2,5] padded to 8 (H*W > 1: the FP32 GEMM path refuses it), w [7,1,1,20] */
#define FX16 {F16, 3, 2, 2, 5, 3, -2, 2, 0}
#define FW16 {F16, 7, 1, 1, 20, 0, -1, 1, 0}
#define FB16 {F16, 1, 1, 1, 7, 0, -1, 1, 0}
#define FY16 {F16, 3, 1, 1, 7, 1, -1, 1, 0}
/* element-wise and pooling: [2,6,6,5] padded to 8 */
#define E16 {F16, 2, 6, 6, 5, 3, -2, 2, 0}
#define P16 {F16, 2, 3, 3, 5, 3, -2, 2, 0}
#define MASK {I8, 2, 3, 3, 5, 3, 0, 4, 0}
#define G16 {F16, 2, 1, 1, 5, 3, -2, 2, 0}
/* batch norm: x [4,3,3,6] padded to 8; per channel [1,1,1,6] */
#define BX16 {F16, 4, 3, 3, 6, 2, -2, 2, 0}
#define BC16(lo, hi) {F16, 1, 1, 1, 6, 0, lo, hi, 0}
#define BC32(lo, hi) {F32, 1, 1, 1, 6, 0, lo, hi, 0}

static const fcase cases[] = {
    {"conv fwd", "conv2d.fwd", 3, 1, {X16, W16, B16}, {Y16}, &conv_a, sizeof conv_a, NO_ACC},
    {"conv fwd stride 2", "conv2d.fwd", 2, 1, {X16, W16}, {Y16S2}, &conv_s2, sizeof conv_s2,
     NO_ACC},
    {"conv bwd_data", "conv2d.bwd_data", 2, 1, {Y16, W16}, {X16}, &conv_a, sizeof conv_a, CONV_ACC},
    {"conv bwd_data stride 2", "conv2d.bwd_data", 2, 1, {Y16S2, W16}, {X16}, &conv_s2,
     sizeof conv_s2, CONV_ACC},
    {"conv bwd_filter", "conv2d.bwd_filter", 2, 2, {X16, Y16}, {W16, B16}, &conv_a, sizeof conv_a,
     CONV_ACC},
    {"fc fwd", "fc.fwd", 3, 1, {FX16, FW16, FB16}, {FY16}, &fc_a, sizeof fc_a, NO_ACC},
    {"fc bwd_data", "fc.bwd_data", 2, 1, {FY16, FW16}, {FX16}, &fc_a, sizeof fc_a, FC_ACC},
    {"fc bwd_filter", "fc.bwd_filter", 2, 2, {FX16, FY16}, {FW16, FB16}, &fc_a, sizeof fc_a,
     FC_ACC},
    {"relu fwd", "relu.fwd", 1, 1, {E16}, {E16}, &ew_a, sizeof ew_a, NO_ACC},
    {"relu fwd in place", "relu.fwd", 1, 1, {E16}, {{F16, 2, 6, 6, 5, 3, 0, 0, 1}}, &ew_a,
     sizeof ew_a, NO_ACC},
    {"relu bwd", "relu.bwd", 2, 1, {E16, E16}, {E16}, &ew_a, sizeof ew_a, EW_ACC},
    {"relu bwd in place", "relu.bwd", 2, 1, {E16, E16}, {{F16, 2, 6, 6, 5, 3, 0, 0, 2}}, &ew_a,
     sizeof ew_a, EW_ACC},
    {"add fwd", "add.fwd", 2, 1, {E16, E16}, {E16}, &ew_a, sizeof ew_a, NO_ACC},
    {"add bwd", "add.bwd", 1, 2, {E16}, {E16, E16}, &ew_a, sizeof ew_a, EW_ACC},
    {"maxpool fwd", "maxpool.fwd", 1, 2, {E16}, {P16, MASK}, &maxp_a, sizeof maxp_a, NO_ACC},
    {"maxpool bwd", "maxpool.bwd", 2, 1, {P16, MASK}, {E16}, &maxp_a, sizeof maxp_a, POOL_ACC},
    {"avgpool fwd", "avgpool.fwd", 1, 1, {E16}, {P16}, &avgp_a, sizeof avgp_a, NO_ACC},
    {"avgpool bwd", "avgpool.bwd", 1, 1, {P16}, {E16}, &avgp_a, sizeof avgp_a, POOL_ACC},
    {"global_avgpool fwd", "global_avgpool.fwd", 1, 1, {E16}, {G16}, &ew_a, sizeof ew_a, NO_ACC},
    {"global_avgpool bwd", "global_avgpool.bwd", 1, 1, {G16}, {E16}, &ew_a, sizeof ew_a, EW_ACC},
    /* AMP: running statistics FP32, updated in place; save_* FP32 */
    {"batchnorm fwd_train",
     "batchnorm.fwd_train",
     5,
     5,
     {BX16, BC16(0.5, 2), BC16(-1, 1), BC32(-1, 1), BC32(0.5, 2)},
     {BX16, BC32(0, 0), BC32(0, 0), {F32, 1, 1, 1, 6, 0, 0, 0, 4}, {F32, 1, 1, 1, 6, 0, 0, 0, 5}},
     &bn_a,
     sizeof bn_a,
     NO_ACC},
    /* every tensor FP16, the running statistics in place (the adapter shares the copies) */
    {"batchnorm fwd_train all fp16",
     "batchnorm.fwd_train",
     5,
     5,
     {BX16, BC16(0.5, 2), BC16(-1, 1), BC16(-1, 1), BC16(0.5, 2)},
     {BX16, BC16(0, 0), BC16(0, 0), {F16, 1, 1, 1, 6, 0, 0, 0, 4}, {F16, 1, 1, 1, 6, 0, 0, 0, 5}},
     &bn_a,
     sizeof bn_a,
     NO_ACC},
    {"batchnorm fwd_eval", "batchnorm.fwd_eval", 5, 1,
     {BX16, BC16(0.5, 2), BC16(-1, 1), BC32(-1, 1), BC32(0.5, 2)}, {BX16}, &bn_a, sizeof bn_a,
     NO_ACC},
    {"batchnorm bwd", "batchnorm.bwd", 5, 3,
     {BX16, BX16, BC16(0.5, 2), BC32(-0.5, 0.5), BC32(0.5, 2)}, {BX16, BC16(0, 0), BC16(0, 0)},
     &bn_a, sizeof bn_a, BN_ACC},
};
#define CASES ((int)(sizeof cases / sizeof cases[0]))

/* ---- running a case ------------------------------------------------------------------ */

static tt make(const spec *s, int32_t dtype, int64_t extra) {
  return tt_new(dtype, s->n, s->h, s->w, s->c, extra);
}

static void fill(const tt *t, const spec *s, uint64_t *rng) {
  for (int64_t i = 0; i < tt_count(t); i++) {
    const double u = tt_rand_unit(rng);
    double v = s->lo + (s->hi - s->lo) * u;
    if (t->d.dtype == BP_ABI_DTYPE_INT8) v = floor(v);
    set(t, i, bp_sdk_fp16_to_fp32(bp_sdk_fp32_to_fp16((float)v))); /* FP16-exact */
  }
}

/* supports(), workspace_size() and run() of k on the call; 0 and the
 * reason when it refuses. */
static int call_kernel(const bp_abi_kernel *k, const ops_call *c, char *reason, size_t rs) {
  if (!ops_kernel_supports(k, c, reason, rs)) return 0;
  ops_args a;
  ops_args_make(&a, c, 0);
  const uint64_t need = k->workspace_size ? k->workspace_size(k->user, &a.args) : 0;
  void *ws = need ? malloc((size_t)need) : NULL;
  if (need) ck_assert_ptr_nonnull(ws);
  ops_args_make(&a, c, 1);
  a.args.workspace = ws, a.args.workspace_bytes = need;
  a.args.reason = reason, a.args.reason_size = rs;
  const int rc = k->run(k->user, &a.args);
  free(ws);
  ck_assert_msg(rc == BP_ABI_OK, "%s/%s run() returned %d: %s", c->op, k->impl, rc, reason);
  return 1;
}

/* Runs case c with accumulate `acc` on implementation `impl` and checks
 * it against the FP32 reference; 0 when impl has no such kernel. */
static int check_case(const fcase *c, const char *impl, int acc, uint64_t seed) {
  const bp_abi_kernel *k = find_kernel(c->op, impl);
  const bp_abi_kernel *ref = find_kernel(c->op, "reference");
  ck_assert_ptr_nonnull(ref);
  if (!k) return 0;
  ck_assert_msg(k->dtypes & BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP16), "%s/%s: no FP16 in its mask",
                c->op, impl);
  unsigned char attrs[64], attrs0[64];
  memcpy(attrs, c->attrs, c->attr_size);
  memcpy(attrs0, c->attrs, c->attr_size);
  if (c->acc_offset != NO_ACC) {
    const int32_t flag = acc;
    memcpy(attrs + c->acc_offset, &flag, sizeof flag);
  }
  tt in[5], out[5], in32[5], out32[5], old[5];
  uint64_t rng = seed;
  for (int i = 0; i < c->nin; i++) {
    in[i] = make(&c->in[i], c->in[i].dtype, c->in[i].extra);
    fill(&in[i], &c->in[i], &rng);
    const int32_t wide = c->in[i].dtype == F16 ? F32 : c->in[i].dtype;
    in32[i] = make(&c->in[i], wide, 0);
    for (int64_t e = 0; e < tt_count(&in[i]); e++) set(&in32[i], e, get(&in[i], e));
  }
  for (int o = 0; o < c->nout; o++) {
    const spec *s = &c->out[o];
    const int32_t wide = s->dtype == F16 ? F32 : s->dtype;
    out32[o] = make(s, wide, 0);
    old[o] = make(s, s->dtype, 0);
    if (s->alias) {
      for (int64_t e = 0; e < tt_count(&old[o]); e++) set(&old[o], e, get(&in[s->alias - 1], e));
      continue;
    }
    out[o] = make(s, s->dtype, s->extra);
    const spec values = {s->dtype, s->n, s->h, s->w, s->c, 0, -3, 3, 0};
    fill(&out[o], &values, &rng); /* what accumulate adds to (overwritten otherwise) */
    for (int64_t e = 0; e < tt_count(&old[o]); e++) set(&old[o], e, get(&out[o], e));
  }
  /* the oracle: FP32 reference, accumulate 0 */
  ops_call c32 = {c->op, {0}, {0}, c->nin, c->nout, attrs0, c->attr_size};
  for (int i = 0; i < c->nin; i++) c32.in[i] = &in32[i];
  for (int o = 0; o < c->nout; o++) c32.out[o] = &out32[o];
  char reason[256] = "";
  ck_assert_msg(call_kernel(ref, &c32, reason, sizeof reason), "%s: FP32 reference refused: %s",
                c->name, reason);
  /* the FP16 kernel */
  ops_call c16 = {c->op, {0}, {0}, c->nin, c->nout, attrs, c->attr_size};
  for (int i = 0; i < c->nin; i++) c16.in[i] = &in[i];
  for (int o = 0; o < c->nout; o++)
    c16.out[o] = c->out[o].alias ? &in[c->out[o].alias - 1] : &out[o];
  ck_assert_msg(call_kernel(k, &c16, reason, sizeof reason), "%s/%s (accumulate %d) refused: %s",
                c->name, impl, acc, reason);
  const int exact = strcmp(impl, "reference") == 0 || strcmp(impl, "cpu") == 0;
  for (int o = 0; o < c->nout; o++) {
    const tt *got = c16.out[o];
    double diff = 0.0, scale = 1.0;
    for (int64_t e = 0; e < tt_count(got); e++) {
      const float r = get(&out32[o], e), prior = get(&old[o], e);
      float expect = acc && got->d.dtype != I8 ? prior + r : r;
      if (got->d.dtype == F16) expect = bp_sdk_fp16_to_fp32(bp_sdk_fp32_to_fp16(expect));
      const float g = get(got, e);
      if (exact) {
        if (bits_of(g) != bits_of(expect))
          ck_abort_msg("%s/%s (accumulate %d) output %d[%lld] = %.9g, expected %.9g", c->name,
                       impl, acc, o, (long long)e, (double)g, (double)expect);
      } else {
        const double d = fabs((double)g - expect);
        if (!(d <= diff)) diff = d;
        if (fabs(expect) > scale) scale = fabs(expect);
      }
    }
    ck_assert_msg(diff / scale < FP16_GEMM_TOL, "%s/%s (accumulate %d) output %d: err %.3g",
                  c->name, impl, acc, o, diff / scale);
    ck_assert_msg(tt_padding_intact(got), "%s/%s: output %d padding or tail written", c->name,
                  impl, o);
  }
  for (int i = 0; i < c->nin; i++) tt_free(&in[i]), tt_free(&in32[i]);
  for (int o = 0; o < c->nout; o++) {
    if (!c->out[o].alias) tt_free(&out[o]);
    tt_free(&out32[o]), tt_free(&old[o]);
  }
  return 1;
}

START_TEST(fp16_kernels_match_the_fp32_reference_rounded_once) {
  const fcase *c = &cases[_i];
  int ran = 0;
  for (int m = 0; m < IMPLS; m++)
    for (int acc = 0; acc <= (c->acc_offset != NO_ACC); acc++)
      ran += check_case(c, impls[m], acc, 1000u + (uint64_t)_i * 7u + (uint64_t)acc);
  ck_assert_msg(ran >= 1, "%s: no kernel ran", c->name);
}
END_TEST

/* The cpu module has relu, maxpool and batch norm; blas / dnnl conv2d and
 * fc (where built): each must serve its FP16 ops. */
START_TEST(fast_modules_take_fp16) {
  static const char *const cpu_ops[] = {"relu.fwd",           "relu.bwd",           "maxpool.fwd",
                                        "maxpool.bwd",        "batchnorm.fwd_train",
                                        "batchnorm.fwd_eval", "batchnorm.bwd"};
  for (size_t i = 0; i < sizeof cpu_ops / sizeof cpu_ops[0]; i++) {
    const bp_abi_kernel *k = find_kernel(cpu_ops[i], "cpu");
    ck_assert_ptr_nonnull(k);
    ck_assert(k->dtypes & BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP16));
  }
  static const char *const gemm_ops[] = {"conv2d.fwd", "conv2d.bwd_data", "conv2d.bwd_filter",
                                         "fc.fwd",     "fc.bwd_data",     "fc.bwd_filter"};
  for (int m = 2; m < IMPLS; m++)
    for (size_t i = 0; i < sizeof gemm_ops / sizeof gemm_ops[0]; i++) {
      const bp_abi_kernel *k = find_kernel(gemm_ops[i], impls[m]);
      if (k) ck_assert(k->dtypes & BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP16));
    }
}
END_TEST

/* The registry picks the fast kernels for padded FP16 features, layouts
 * that the same kernels refuse in FP32 (a padded 3x3 filter, a padded fc
 * input with H*W > 1, relu over a padded tensor). */
START_TEST(selection_prefers_fast_kernels_for_padded_fp16) {
  load_all();
  const char *gemm = find_kernel("conv2d.fwd", "dnnl")  ? "dnnl"
                     : find_kernel("conv2d.fwd", "blas") ? "blas"
                                                         : "reference";
  for (int fp16 = 0; fp16 <= 1; fp16++) {
    const int32_t dt = fp16 ? F16 : F32;
    tt x = tt_new(dt, 2, 5, 6, 3, 5), w = tt_new(dt, 4, 3, 3, 3, 5), y = tt_new(dt, 2, 5, 6, 4, 4);
    const bp_conv2d_attrs a = {3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0};
    const ops_call conv = {"conv2d.fwd", {&x, &w}, {&y}, 2, 1, &a, sizeof a};
    tt fx = tt_new(dt, 3, 2, 2, 5, 3), fw = tt_new(dt, 7, 1, 1, 20, 0);
    tt fy = tt_new(dt, 3, 1, 1, 7, 1);
    const bp_fc_attrs fa = {0, 0};
    const ops_call fc = {"fc.fwd", {&fx, &fw}, {&fy}, 2, 1, &fa, sizeof fa};
    tt e = tt_new(dt, 2, 6, 6, 5, 3), r = tt_new(dt, 2, 6, 6, 5, 3);
    const ops_call relu = {"relu.fwd", {&e}, {&r}, 1, 1, &ew_a, sizeof ew_a};
    char report[1024];
    ck_assert_str_eq(ops_selected_impl(&conv, NULL, report, sizeof report),
                     fp16 ? gemm : "reference");
    ck_assert_str_eq(ops_selected_impl(&fc, NULL, report, sizeof report),
                     fp16 ? gemm : "reference");
    ck_assert_str_eq(ops_selected_impl(&relu, NULL, report, sizeof report),
                     fp16 ? "cpu" : "reference");
    tt_free(&x), tt_free(&w), tt_free(&y), tt_free(&fx), tt_free(&fw), tt_free(&fy);
    tt_free(&e), tt_free(&r);
  }
}
END_TEST

/* Bad FP16 calls are refused with a reason, by supports() and run(). */
START_TEST(bad_fp16_calls_are_refused_with_reasons) {
  for (int m = 0; m < 2; m++) {
    const bp_abi_kernel *k = find_kernel("relu.bwd", impls[m]);
    tt y = tt_new(F16, 2, 6, 6, 5, 3), dy = tt_new(F16, 2, 6, 6, 5, 3);
    tt dx = tt_new(F16, 2, 6, 6, 5, 3);
    ops_call c = {"relu.bwd", {&y, &dy}, {&dx}, 2, 1, &ew_a, sizeof ew_a};
    char reason[256];
    /* a slot too small for its FP16 tensor */
    y.d.slot_bytes = 64;
    ck_assert_int_eq(ops_kernel_supports(k, &c, reason, sizeof reason), 0);
    ck_assert_msg(strstr(reason, "input 0") && strstr(reason, "slot_bytes"), "reason: %s", reason);
    ck_assert_int_eq(ops_kernel_run(k, &c, NULL, 0), BP_ABI_ERR_INVALID);
    y.d.slot_bytes = dy.d.slot_bytes;
    /* a shape the FP32 kernel refuses keeps its reason */
    dx.d.shape[3] = 4;
    ck_assert_int_eq(ops_kernel_supports(k, &c, reason, sizeof reason), 0);
    ck_assert_msg(strstr(reason, "shape"), "reason: %s", reason);
    dx.d.shape[3] = 5;
    /* no workspace */
    ck_assert_int_eq(ops_kernel_supports(k, &c, reason, sizeof reason), 1);
    ops_args a;
    ops_args_make(&a, &c, 1);
    a.args.reason = reason, a.args.reason_size = sizeof reason;
    reason[0] = '\0';
    ck_assert_int_eq(k->run(k->user, &a.args), BP_ABI_ERR_INVALID);
    ck_assert_msg(strstr(reason, "workspace"), "reason: %s", reason);
    /* an output overlapping an input without being it */
    dx.d.shape[0] = 1;
    ops_args_make(&a, &c, 1);
    a.args.output_ptrs = a.out_ptrs;
    a.out_ptrs[0] = (uint16_t *)y.data + 8;
    a.args.reason = reason, a.args.reason_size = sizeof reason;
    ck_assert_int_eq(k->run(k->user, &a.args), BP_ABI_ERR_INVALID);
    ck_assert_msg(strstr(reason, "overlaps"), "reason: %s", reason);
    tt_free(&y), tt_free(&dy), tt_free(&dx);
  }
  /* a dtype the op cannot take beside FP16 ones keeps the FP32 check's reason */
  tt x = tt_new(F16, 3, 2, 2, 5, 3), w = tt_new(F16, 7, 1, 1, 20, 0);
  tt b = tt_new(BP_ABI_DTYPE_INT32, 1, 1, 1, 7, 0), y = tt_new(F16, 3, 1, 1, 7, 1);
  const ops_call fc = {"fc.fwd", {&x, &w, &b}, {&y}, 3, 1, &fc_a, sizeof fc_a};
  for (int m = 0; m < IMPLS; m++) {
    const bp_abi_kernel *k = find_kernel("fc.fwd", impls[m]);
    if (!k) continue;
    char reason[256];
    ck_assert_int_eq(ops_kernel_supports(k, &fc, reason, sizeof reason), 0);
    ck_assert_msg(strstr(reason, "b: dtype int32"), "%s: reason %s", impls[m], reason);
  }
  tt_free(&x), tt_free(&w), tt_free(&b), tt_free(&y);
}
END_TEST

/* A thread service that runs the chunks backwards on the calling thread:
 * the adapter's conversions must not depend on the order or the split. */
static void backwards(void *ctx, void (*fn)(void *arg, int64_t i), void *arg, int64_t n) {
  *(int64_t *)ctx += n;
  for (int64_t i = n - 1; i >= 0; i--) fn(arg, i);
}

START_TEST(conversions_split_over_threads_give_the_same_bits) {
  for (int extra = 0; extra <= 3; extra += 3) { /* dense, then padded */
    tt y = tt_new(F16, 4, 32, 32, 5, extra), dy = tt_new(F16, 4, 32, 32, 5, extra);
    tt dx[2] = {tt_new(F16, 4, 32, 32, 5, extra), tt_new(F16, 4, 32, 32, 5, extra)};
    const spec values = {F16, 4, 32, 32, 5, 0, -2, 2, 0};
    uint64_t rng = 5;
    fill(&y, &values, &rng), fill(&dy, &values, &rng), fill(&dx[0], &values, &rng);
    for (int64_t e = 0; e < tt_count(&dx[0]); e++) set(&dx[1], e, get(&dx[0], e));
    const bp_elementwise_attrs acc = {1};
    for (int m = 0; m < 2; m++) {
      const bp_abi_kernel *k = find_kernel("relu.bwd", impls[m]);
      int64_t chunks = 0;
      const bp_abi_threads threads = {sizeof threads, 4, &chunks, backwards};
      for (int run = 0; run < 2; run++) {
        const ops_call c = {"relu.bwd", {&y, &dy}, {&dx[run]}, 2, 1, &acc, sizeof acc};
        ops_args a;
        ops_args_make(&a, &c, 0);
        const uint64_t need = k->workspace_size(k->user, &a.args);
        void *ws = malloc((size_t)need);
        ck_assert_ptr_nonnull(ws);
        ops_args_make(&a, &c, 1);
        a.args.workspace = ws, a.args.workspace_bytes = need;
        if (run) a.args.threads = &threads;
        ck_assert_int_eq(k->run(k->user, &a.args), BP_ABI_OK);
        free(ws);
      }
      /* y, dy and dx: 4*32*32 pixels of 5 channels, 2 chunks each */
      ck_assert_msg(chunks == 6, "%s: %lld chunks", impls[m], (long long)chunks);
      for (int64_t e = 0; e < tt_count(&dx[0]); e++)
        ck_assert_uint_eq(*(uint16_t *)elem(&dx[0], e), *(uint16_t *)elem(&dx[1], e));
      ck_assert(tt_padding_intact(&dx[1]));
    }
    tt_free(&y), tt_free(&dy), tt_free(&dx[0]), tt_free(&dx[1]);
  }
}
END_TEST

/* ---- conversions ------------------------------------------------------------------- */

/* Float bit patterns around every FP16 rounding boundary and the special
 * values: each boundary (midpoint between two adjacent halves) and the
 * floats one ulp on either side, plus a stride over all 2^32 patterns. */
static uint32_t *sweep(size_t *count) {
  const size_t cap = 65536u * 6u + 65537u + 64u;
  uint32_t *v = malloc(cap * sizeof *v);
  ck_assert_ptr_nonnull(v);
  size_t n = 0;
  for (uint32_t h = 0; h < 0x7c00u; h++) { /* finite positive halves and the next one up */
    const double lo = bp_sdk_fp16_to_fp32((uint16_t)h);
    const double hi = h + 1 == 0x7c00u ? 65536.0 : bp_sdk_fp16_to_fp32((uint16_t)(h + 1));
    const uint32_t mid = bp_sdk_bits_of_float((float)((lo + hi) / 2));
    const uint32_t near[3] = {mid - 1, mid, mid + 1};
    for (int j = 0; j < 3; j++) v[n++] = near[j], v[n++] = near[j] | 0x80000000u;
  }
  for (uint64_t i = 0; i <= 65536u; i++) v[n++] = (uint32_t)(i * 65537u + (i >> 3));
  static const uint32_t special[] = {
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
      0x7f800001u, 0xff800001u, 0x7fa00000u, 0x7fbfffffu, 0x7fffffffu, 0xffffe000u,
      0x7f801fffu, 0x7fc02000u, 0x00000001u, 0x807fffffu, 0x477fe000u, 0x477fefffu,
      0x477ff000u, 0x477ff001u, 0x33000000u, 0x33000001u, 0x32ffffffu, 0x33800000u,
      0x387fffffu, 0x38800000u, 0x387fe000u, 0x387ff000u, 0x4f800000u, 0x7f7fffffu};
  for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) v[n++] = special[i];
  ck_assert(n <= cap);
  *count = n;
  return v;
}

/* The table `cv` gives the SDK's bits: every FP16 value widened, the sweep
 * narrowed, sums narrowed, at every run length's tail. */
static void check_table(const ops_fp16_convert *cv) {
  uint16_t *h = malloc(65536 * sizeof *h), *h2 = malloc(65536 * sizeof *h2);
  float *f = malloc(65536 * sizeof *f);
  ck_assert(h && h2 && f);
  for (uint32_t i = 0; i < 65536u; i++) h[i] = (uint16_t)i;
  cv->widen(h, f, 65536);
  for (uint32_t i = 0; i < 65536u; i++)
    if (bp_sdk_bits_of_float(f[i]) != bp_sdk_bits_of_float(bp_sdk_fp16_to_fp32((uint16_t)i)))
      ck_abort_msg("%s widen(0x%04x) = 0x%08x, expected 0x%08x", cv->name, i,
                   bp_sdk_bits_of_float(f[i]),
                   bp_sdk_bits_of_float(bp_sdk_fp16_to_fp32((uint16_t)i)));
  size_t n;
  uint32_t *bits = sweep(&n);
  float *src = malloc(n * sizeof *src);
  uint16_t *dst = malloc(n * sizeof *dst);
  ck_assert(src && dst);
  for (size_t i = 0; i < n; i++) src[i] = bp_sdk_float_of_bits(bits[i]);
  /* every offset and length mod 8 meets the scalar tail and the vector body */
  for (size_t start = 0; start < 8; start++) {
    cv->narrow(src + start, dst + start, (int64_t)(n - start));
    for (size_t i = start; i < n; i++)
      if (dst[i] != bp_sdk_fp32_to_fp16(src[i]))
        ck_abort_msg("%s narrow(0x%08x) = 0x%04x, expected 0x%04x", cv->name, bits[i], dst[i],
                     bp_sdk_fp32_to_fp16(src[i]));
  }
  /* add_narrow: dst = round16(float(dst) + src) over every half and a sweep value */
  for (uint32_t i = 0; i < 65536u; i++) h2[i] = (uint16_t)i;
  for (uint32_t i = 0; i < 65536u; i++) f[i] = src[(i * 7u) % n];
  cv->add_narrow(f, h2, 65536 - 3);
  for (uint32_t i = 0; i < 65536u - 3; i++) {
    const uint16_t expect = bp_sdk_fp32_to_fp16(bp_sdk_fp16_to_fp32((uint16_t)i) + f[i]);
    if (h2[i] != expect)
      ck_abort_msg("%s add_narrow(0x%04x, 0x%08x) = 0x%04x, expected 0x%04x", cv->name, i,
                   bp_sdk_bits_of_float(f[i]), h2[i], expect);
  }
  ck_assert_uint_eq(h2[65535], 65535); /* past the run: untouched */
  free(bits), free(src), free(dst), free(h), free(h2), free(f);
}

START_TEST(conversions_give_the_sdk_bits) {
  check_table(ops_fp16_convert_scalar());
  if (!ops_fp16_cpu_has_f16c()) {
    fprintf(stderr, "test_ops_fp16: no F16C on this CPU; the F16C loops were not run\n");
    ck_assert_ptr_eq(ops_fp16_convert_fast(), ops_fp16_convert_scalar());
    return;
  }
#if OPS_FP16_HAVE_F16C
  ck_assert_ptr_eq(ops_fp16_convert_fast(), ops_fp16_convert_f16c());
  check_table(ops_fp16_convert_f16c());
#endif
  /* the plain span calls, both ways */
  uint16_t h[37];
  float a[37], b[37];
  for (int i = 0; i < 37; i++) h[i] = (uint16_t)(0x3c00 + 97 * i) ^ (i % 3 ? 0 : 0x8000);
  for (int use = 0; use <= 1; use++) {
    ops_fp16_widen_mul(h, a, 37, 0.125f, use);
    ops_fp16_widen(h, b, 37, use);
    for (int i = 0; i < 37; i++) {
      ck_assert_uint_eq(bp_sdk_bits_of_float(a[i]),
                        bp_sdk_bits_of_float(bp_sdk_fp16_to_fp32(h[i]) * 0.125f));
      ck_assert_uint_eq(bp_sdk_bits_of_float(b[i]),
                        bp_sdk_bits_of_float(bp_sdk_fp16_to_fp32(h[i])));
    }
    uint16_t back[37];
    ops_fp16_narrow(b, back, 37, use);
    for (int i = 0; i < 37; i++) ck_assert_uint_eq(back[i], h[i]);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops_fp16");
  TCase *tc = tcase_create("fp16");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, fp16_kernels_match_the_fp32_reference_rounded_once, 0, CASES);
  tcase_add_test(tc, fast_modules_take_fp16);
  tcase_add_test(tc, selection_prefers_fast_kernels_for_padded_fp16);
  tcase_add_test(tc, bad_fp16_calls_are_refused_with_reasons);
  tcase_add_test(tc, conversions_split_over_threads_give_the_same_bits);
  tcase_add_test(tc, conversions_give_the_sdk_bits);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
