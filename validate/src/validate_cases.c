/* The built-in case table of kernel validation: for every op of
 * abi/bp_abi_ops.h, odd sizes, batch 1, channels that are not a multiple
 * of 8 laid out with padded_c > C, stride / pad / dilation / groups
 * variants and every dtype the op takes. The same table drives
 * `blueprint validate`, the conformance suite (tests/test_conformance.c)
 * and nothing else: a case added here is checked for every kernel. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "blueprint/dtensor.h"
#include "blueprint/op_table.h"
#include "validate-impl.h"

bp_abi_tensor vc_tensor_desc(int32_t dtype, int64_t n, int64_t h, int64_t w, int64_t c,
                             int64_t padded_c) {
  bp_abi_tensor t;
  memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  t.dtype = dtype;
  t.shape[0] = n;
  t.shape[1] = h;
  t.shape[2] = w;
  t.shape[3] = c;
  t.padded_c = padded_c > c ? padded_c : c;
  t.stride[3] = 1;
  t.stride[2] = t.padded_c;
  t.stride[1] = t.padded_c * w;
  t.stride[0] = t.padded_c * w * h;
  /* the plan's slot rule on the padded shape (region B pads nothing) */
  uint64_t slot = 0;
  if (bp_dtensor_slot_bytes((bp_dtype)dtype, BP_REGION_B, (bp_shape){n, h, w, t.padded_c},
                            &slot) != BP_OK)
    slot = 0;
  t.slot_bytes = slot;
  return t;
}

bp_abi_tensor vc_span_desc(int32_t dtype, int64_t elements) {
  bp_abi_tensor t = vc_tensor_desc(dtype, 1, 1, 1, elements, elements);
  t.slot_bytes = (uint64_t)elements * vt_elem_size(dtype);
  return t;
}

#define TABLE_MAX 1024
/* the batch sizes of the batch cases of conv2d and fc: past a block of 16,
 * every residue mod 16 (so mod 8) */
#define BATCH_FIRST 17
#define BATCH_LAST 33
static vc_case table[TABLE_MAX];
static int table_count;
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

void vc_case_init(vc_case *c, const char *op) {
  memset(c, 0, sizeof *c);
  c->op = op;
  c->skip_in = -1;
  for (int i = 0; i < VC_MAX; i++) {
    c->alias[i] = -1;
    c->in[i].fill = c->out[i].fill = VC_FILL_UNSET;
  }
}

static vc_case *add(const char *op, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static vc_case *add(const char *op, const char *fmt, ...) {
  if (table_count == TABLE_MAX) return NULL;
  vc_case *c = &table[table_count++];
  vc_case_init(c, op);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->name, sizeof c->name, fmt, ap);
  va_end(ap);
  return c;
}

static void in(vc_case *c, bp_abi_tensor d) { c->in[c->num_inputs++].d = d; }
static void out(vc_case *c, bp_abi_tensor d) { c->out[c->num_outputs++].d = d; }
static void attrs(vc_case *c, const void *a, uint32_t size) {
  memcpy(c->attrs, a, size);
  c->attr_size = size;
}

#define F32 BP_ABI_DTYPE_FP32
#define F16 BP_ABI_DTYPE_FP16
#define I8 BP_ABI_DTYPE_INT8
#define I32 BP_ABI_DTYPE_INT32

/* The three ops of a layer with weights (conv2d, fc; ops[] names them in
 * this order), wired as the plan wires them:
 *   fwd         x, w [, b] -> y
 *   bwd_data    dy, w -> dx          (dy as y, dx as x)
 *   bwd_filter  x, dy -> dw [, db]   (dw as w, db as b) */
static void weighted_cases(const char *const ops[3], const char *name, bp_abi_tensor x,
                           bp_abi_tensor w, const bp_abi_tensor *b, bp_abi_tensor y,
                           const void *a, uint32_t attr_size) {
  vc_case *c = add(ops[0], "%s", name);
  in(c, x);
  in(c, w);
  if (b) in(c, *b);
  out(c, y);
  attrs(c, a, attr_size);
  c = add(ops[1], "%s", name);
  in(c, y);
  in(c, w);
  out(c, x);
  attrs(c, a, attr_size);
  c = add(ops[2], "%s", name);
  in(c, x);
  in(c, y);
  out(c, w);
  if (b) out(c, *b);
  attrs(c, a, attr_size);
}

/* ---- conv2d ------------------------------------------------------------------ */

typedef struct conv_geo {
  int64_t n, h, w, c, k;
  int32_t kh, kw, sh, sw, ph, pw, dh, dw, groups, bias;
  int64_t xpad, ypad; /* padded_c of x (and dx) and of y (and dy); 0: compact */
  int64_t wpad, bpad; /* padded_c of w (and dw) and of b (and db); 0: compact */
} conv_geo;

static const conv_geo conv_geos[] = {
    {2, 5, 7, 3, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0},
    {1, 6, 5, 8, 5, 3, 3, 2, 2, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0},
    {2, 7, 6, 4, 4, 3, 3, 1, 1, 2, 2, 2, 2, 1, 1, 0, 0, 0, 0},
    {1, 5, 5, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 2, 1, 0, 0, 0, 0},
    {2, 4, 5, 5, 6, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 8, 8, 8, 8},
    {7, 6, 5, 5, 7, 3, 3, 2, 1, 1, 1, 1, 1, 1, 1, 8, 8, 0, 8},
    {3, 5, 6, 3, 2, 2, 3, 2, 1, 1, 0, 1, 1, 1, 0, 4, 0, 0, 0},
    {1, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 3, 1, 0, 0, 0, 0},
    {2, 9, 9, 16, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0},
    /* the geometries GEMM paths branch on (im2col or not, chunks, groups) */
    {1, 6, 5, 4, 4, 3, 3, 2, 2, 1, 1, 1, 1, 4, 1, 0, 0, 0, 0},    /* depthwise, stride 2 */
    {2, 7, 7, 8, 8, 3, 3, 1, 1, 2, 2, 2, 2, 8, 0, 0, 0, 0, 0},    /* depthwise, dilation 2 */
    {1, 5, 5, 4, 6, 1, 1, 1, 1, 0, 0, 1, 1, 2, 1, 0, 0, 0, 0},    /* 1x1, groups 2 */
    {2, 6, 6, 3, 5, 1, 1, 2, 2, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0},    /* 1x1, stride 2 */
    {1, 5, 5, 3, 4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0},    /* 1x1, padding 1 */
    {2, 8, 7, 3, 2, 2, 2, 3, 3, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0},    /* stride 3 > kernel */
    {1, 4, 6, 9, 5, 2, 3, 1, 2, 1, 2, 2, 1, 1, 1, 0, 0, 0, 0},    /* mixed stride, pad, dilation */
    {1, 11, 13, 16, 8, 5, 5, 1, 1, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0}, /* 5x5 */
    {2, 3, 3, 2, 3, 3, 3, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0},    /* the kernel covers the input */
    {1, 9, 9, 6, 9, 3, 3, 2, 1, 0, 1, 1, 2, 3, 1, 0, 0, 0, 0},    /* groups 3, uneven */
    {2, 7, 7, 6, 4, 3, 3, 1, 1, 2, 1, 2, 1, 2, 1, 0, 0, 0, 0},    /* K < C, groups 2 */
    {1, 9, 8, 8, 8, 3, 5, 1, 1, 1, 2, 1, 1, 1, 1, 0, 0, 0, 0},    /* K = C, 3x5 */
    {1, 14, 14, 32, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0}, /* the CNN's conv3 */
    {1, 28, 28, 1, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0}, /* the CNN's conv1 */
};

static void conv_cases(void) {
  for (size_t i = 0; i < sizeof conv_geos / sizeof conv_geos[0]; i++) {
    const conv_geo *g = &conv_geos[i];
    const int64_t oh = (g->h + 2 * g->ph - (g->dh * (g->kh - 1) + 1)) / g->sh + 1;
    const int64_t ow = (g->w + 2 * g->pw - (g->dw * (g->kw - 1) + 1)) / g->sw + 1;
    char name[96];
    snprintf(name, sizeof name,
             "N%lld %lldx%lld C%lld%s->K%lld%s k%dx%d%s s%d,%d p%d,%d d%d,%d g%d%s",
             (long long)g->n, (long long)g->h, (long long)g->w, (long long)g->c,
             g->xpad ? "(p)" : "", (long long)g->k, g->ypad ? "(p)" : "", g->kh, g->kw,
             g->wpad ? "(p)" : "", g->sh, g->sw, g->ph, g->pw, g->dh, g->dw, g->groups,
             g->bias ? (g->bpad ? " bias(p)" : " bias") : "");
    const bp_conv2d_attrs a = {.kernel_h = g->kh, .kernel_w = g->kw, .stride_h = g->sh,
                               .stride_w = g->sw, .pad_h = g->ph, .pad_w = g->pw,
                               .dilation_h = g->dh, .dilation_w = g->dw, .groups = g->groups,
                               .has_bias = g->bias, .accumulate = 0};
    const bp_abi_tensor x = vc_tensor_desc(F32, g->n, g->h, g->w, g->c, g->xpad);
    const bp_abi_tensor y = vc_tensor_desc(F32, g->n, oh, ow, g->k, g->ypad);
    const bp_abi_tensor w = vc_tensor_desc(F32, g->k, g->kh, g->kw, g->c / g->groups, g->wpad);
    const bp_abi_tensor b = vc_tensor_desc(F32, 1, 1, 1, g->k, g->bpad);
    static const char *const ops[3] = {"conv2d.fwd", "conv2d.bwd_data", "conv2d.bwd_filter"};
    weighted_cases(ops, name, x, w, g->bias ? &b : NULL, y, &a, sizeof a);
  }
  /* batches: every residue mod 8 and mod 16 past a full block (N = 17 ..
   * 33), on a small geometry, so a kernel whose batch tail is wrong fails */
  for (int64_t n = BATCH_FIRST; n <= BATCH_LAST; n++) {
    char name[96];
    snprintf(name, sizeof name, "N%lld 3x3 C3->K5 k3x3 s1,1 p1,1 d1,1 g1 bias (batch)",
             (long long)n);
    const bp_conv2d_attrs a = {.kernel_h = 3, .kernel_w = 3, .stride_h = 1, .stride_w = 1,
                               .pad_h = 1, .pad_w = 1, .dilation_h = 1, .dilation_w = 1,
                               .groups = 1, .has_bias = 1, .accumulate = 0};
    const bp_abi_tensor x = vc_tensor_desc(F32, n, 3, 3, 3, 0);
    const bp_abi_tensor y = vc_tensor_desc(F32, n, 3, 3, 5, 0);
    const bp_abi_tensor w = vc_tensor_desc(F32, 5, 3, 3, 3, 0);
    const bp_abi_tensor b = vc_tensor_desc(F32, 1, 1, 1, 5, 0);
    static const char *const ops[3] = {"conv2d.fwd", "conv2d.bwd_data", "conv2d.bwd_filter"};
    weighted_cases(ops, name, x, w, &b, y, &a, sizeof a);
    for (int i = 1; i <= 3; i++) table[table_count - i].batch_sweep = 1;
  }
}

/* ---- fc ------------------------------------------------------------------------ */

typedef struct fc_geo {
  int64_t n, h, w, c, o;
  int32_t bias;
  int64_t xpad, ypad, wpad, bpad; /* padded_c of x, y, w, b; 0: compact */
} fc_geo;

static const fc_geo fc_geos[] = {
    {3, 1, 1, 7, 5, 1, 0, 0, 0, 0}, {1, 2, 3, 5, 4, 0, 0, 0, 0, 0},
    {4, 1, 1, 9, 6, 1, 16, 8, 16, 8}, {7, 1, 1, 5, 3, 1, 8, 4, 8, 4},
    {2, 2, 2, 3, 4, 1, 4, 0, 0, 0}, {8, 3, 3, 4, 10, 1, 0, 0, 0, 0},
    {16, 1, 1, 64, 33, 1, 0, 0, 0, 0}, {7, 2, 5, 3, 1, 0, 0, 0, 0, 0},
    {2, 7, 7, 64, 10, 1, 0, 0, 0, 0}, {1, 1, 1, 300, 129, 1, 0, 0, 0, 0},
};

static void fc_cases(void) {
  for (size_t i = 0; i < sizeof fc_geos / sizeof fc_geos[0]; i++) {
    const fc_geo *g = &fc_geos[i];
    char name[96];
    snprintf(name, sizeof name, "N%lld %lldx%lldx%lld%s->%lld%s%s%s", (long long)g->n,
             (long long)g->h, (long long)g->w, (long long)g->c, g->xpad ? "(p)" : "",
             (long long)g->o, g->ypad ? "(p)" : "", g->wpad ? " w(p)" : "",
             g->bias ? (g->bpad ? " bias(p)" : " bias") : "");
    const bp_fc_attrs a = {.has_bias = g->bias, .accumulate = 0};
    const bp_abi_tensor x = vc_tensor_desc(F32, g->n, g->h, g->w, g->c, g->xpad);
    const bp_abi_tensor y = vc_tensor_desc(F32, g->n, 1, 1, g->o, g->ypad);
    const bp_abi_tensor w = vc_tensor_desc(F32, g->o, 1, 1, g->h * g->w * g->c, g->wpad);
    const bp_abi_tensor b = vc_tensor_desc(F32, 1, 1, 1, g->o, g->bpad);
    static const char *const ops[3] = {"fc.fwd", "fc.bwd_data", "fc.bwd_filter"};
    weighted_cases(ops, name, x, w, g->bias ? &b : NULL, y, &a, sizeof a);
  }
  /* batches: every residue mod 8 and mod 16 past a full block */
  for (int64_t n = BATCH_FIRST; n <= BATCH_LAST; n++) {
    char name[96];
    snprintf(name, sizeof name, "N%lld 1x1x12->10 bias (batch)", (long long)n);
    const bp_fc_attrs a = {.has_bias = 1, .accumulate = 0};
    const bp_abi_tensor x = vc_tensor_desc(F32, n, 1, 1, 12, 0);
    const bp_abi_tensor y = vc_tensor_desc(F32, n, 1, 1, 10, 0);
    const bp_abi_tensor w = vc_tensor_desc(F32, 10, 1, 1, 12, 0);
    const bp_abi_tensor b = vc_tensor_desc(F32, 1, 1, 1, 10, 0);
    static const char *const ops[3] = {"fc.fwd", "fc.bwd_data", "fc.bwd_filter"};
    weighted_cases(ops, name, x, w, &b, y, &a, sizeof a);
    for (int i = 1; i <= 3; i++) table[table_count - i].batch_sweep = 1;
  }
}

/* ---- elementwise, global average pool, batch norm ------------------------------- */

typedef struct plain_geo {
  int64_t n, h, w, c, pad;
} plain_geo;

static const plain_geo plain_geos[] = {
    {2, 3, 5, 7, 0}, {1, 1, 1, 13, 0}, {2, 3, 3, 5, 8}, {1, 2, 2, 16, 0}, {4, 6, 6, 12, 0},
};

static void plain_name(const plain_geo *g, char *buf, size_t size) {
  snprintf(buf, size, "%lldx%lldx%lldx%lld%s", (long long)g->n, (long long)g->h,
           (long long)g->w, (long long)g->c, g->pad ? " padded" : "");
}

/* Per plain geometry: every op of the table's same-shape family (each
 * tensor that shape), then global average pooling. */
static void elementwise_cases(void) {
  const bp_elementwise_attrs a = {.accumulate = 0};
  int count = 0;
  const bp_op_info *ops = bp_op_table(&count);
  for (size_t i = 0; i < sizeof plain_geos / sizeof plain_geos[0]; i++) {
    const plain_geo *g = &plain_geos[i];
    char name[96];
    plain_name(g, name, sizeof name);
    const bp_abi_tensor t = vc_tensor_desc(F32, g->n, g->h, g->w, g->c, g->pad);
    const bp_abi_tensor pooled = vc_tensor_desc(F32, g->n, 1, 1, g->c, g->pad);
    for (int k = 0; k < count; k++) {
      if (ops[k].cases != BP_OP_CASES_SAME_SHAPE) continue;
      vc_case *c = add(ops[k].abi.name, "%s", name);
      for (int j = 0; j < ops[k].abi.num_inputs; j++) in(c, t);
      for (int j = 0; j < ops[k].abi.num_outputs; j++) out(c, t);
      attrs(c, &a, sizeof a);
    }
    vc_case *c = add("global_avgpool.fwd", "%s", name);
    in(c, t);
    out(c, pooled);
    attrs(c, &a, sizeof a);
    c = add("global_avgpool.bwd", "%s", name);
    in(c, pooled);
    out(c, t);
    attrs(c, &a, sizeof a);
  }
}

static const plain_geo bn_geos[] = {
    {4, 3, 3, 5, 0}, {2, 1, 1, 7, 8}, {1, 2, 3, 4, 0}, {8, 4, 4, 16, 0},
};

/* batchnorm.* and, with relu, batchnorm_relu.* (whose bwd also reads y) */
static void batchnorm_op_cases(int relu) {
  const bp_batchnorm_attrs a = {.eps = 1e-5f, .momentum = 0.1f, .accumulate = 0};
  const char *train = relu ? "batchnorm_relu.fwd_train" : "batchnorm.fwd_train";
  const char *eval = relu ? "batchnorm_relu.fwd_eval" : "batchnorm.fwd_eval";
  const char *bwd = relu ? "batchnorm_relu.bwd" : "batchnorm.bwd";
  for (size_t i = 0; i < sizeof bn_geos / sizeof bn_geos[0]; i++) {
    const plain_geo *g = &bn_geos[i];
    char name[96];
    plain_name(g, name, sizeof name);
    const bp_abi_tensor x = vc_tensor_desc(F32, g->n, g->h, g->w, g->c, g->pad);
    const bp_abi_tensor p = vc_tensor_desc(F32, 1, 1, 1, g->c, g->pad);
    vc_case *c = add(train, "%s", name);
    for (int k = 0; k < 5; k++) in(c, k ? p : x);
    for (int k = 0; k < 5; k++) out(c, k ? p : x);
    attrs(c, &a, sizeof a);
    c = add(eval, "%s", name);
    for (int k = 0; k < 5; k++) in(c, k ? p : x);
    out(c, x);
    attrs(c, &a, sizeof a);
    c = add(bwd, "%s", name);
    in(c, x);
    in(c, x);
    for (int k = 0; k < 3; k++) in(c, p);
    if (relu) in(c, x);
    out(c, x);
    out(c, p);
    out(c, p);
    attrs(c, &a, sizeof a);
  }
}
static void batchnorm_cases(void) {
  batchnorm_op_cases(0);
  batchnorm_op_cases(1);
}

/* pos_embed.fwd and .bwd: P [1,H,W,C] broadcast over the batch */
static void pos_embed_cases(void) {
  const bp_elementwise_attrs a = {.accumulate = 0};
  for (size_t i = 0; i < sizeof plain_geos / sizeof plain_geos[0]; i++) {
    const plain_geo *g = &plain_geos[i];
    char name[96];
    plain_name(g, name, sizeof name);
    const bp_abi_tensor x = vc_tensor_desc(F32, g->n, g->h, g->w, g->c, g->pad);
    const bp_abi_tensor p = vc_tensor_desc(F32, 1, g->h, g->w, g->c, g->pad);
    vc_case *c = add("pos_embed.fwd", "%s", name);
    in(c, x);
    in(c, p);
    out(c, x);
    attrs(c, &a, sizeof a);
    c = add("pos_embed.bwd", "%s", name);
    in(c, x);
    out(c, x);
    out(c, p);
    attrs(c, &a, sizeof a);
  }
}

/* layernorm.fwd and .bwd: statistics per position ([N,H,W,1]), gain and
 * bias per channel; one or eight channels, padded ones, many positions */
static const plain_geo ln_geos[] = {
    {4, 3, 3, 5, 0}, {2, 1, 1, 7, 8}, {1, 2, 3, 4, 0}, {8, 4, 4, 16, 0}, {2, 7, 7, 64, 0},
    {3, 2, 2, 1, 0}, {1, 3, 5, 13, 16},
};
static void layernorm_cases(void) {
  const bp_layernorm_attrs a = {.eps = 1e-5f, .accumulate = 0};
  for (size_t i = 0; i < sizeof ln_geos / sizeof ln_geos[0]; i++) {
    const plain_geo *g = &ln_geos[i];
    char name[96];
    plain_name(g, name, sizeof name);
    const bp_abi_tensor x = vc_tensor_desc(F32, g->n, g->h, g->w, g->c, g->pad);
    const bp_abi_tensor p = vc_tensor_desc(F32, 1, 1, 1, g->c, g->pad);
    const bp_abi_tensor s = vc_tensor_desc(F32, g->n, g->h, g->w, 1, 0);
    vc_case *c = add("layernorm.fwd", "%s", name);
    in(c, x);
    in(c, p);
    in(c, p);
    out(c, x);
    out(c, s);
    out(c, s);
    attrs(c, &a, sizeof a);
    c = add("layernorm.bwd", "%s", name);
    in(c, x);
    in(c, x);
    in(c, p);
    in(c, s);
    in(c, s);
    out(c, x);
    out(c, p);
    out(c, p);
    attrs(c, &a, sizeof a);
  }
}

/* ---- pools ------------------------------------------------------------------------ */

typedef struct pool_geo {
  int64_t n, h, w, c;
  int32_t kh, kw, sh, sw, ph, pw, include_pad;
  int64_t pad;
} pool_geo;

static const pool_geo pool_geos[] = {
    {2, 6, 7, 3, 2, 2, 2, 2, 0, 0, 0, 0}, {1, 7, 7, 5, 3, 3, 2, 2, 1, 1, 0, 8},
    {2, 5, 6, 4, 3, 3, 1, 1, 1, 1, 1, 0}, {1, 4, 5, 3, 2, 3, 1, 2, 0, 1, 1, 4},
    {2, 8, 8, 16, 2, 2, 2, 2, 0, 0, 0, 0},
};

static void pool_cases(void) {
  for (size_t i = 0; i < sizeof pool_geos / sizeof pool_geos[0]; i++) {
    const pool_geo *g = &pool_geos[i];
    const int64_t oh = (g->h + 2 * g->ph - g->kh) / g->sh + 1;
    const int64_t ow = (g->w + 2 * g->pw - g->kw) / g->sw + 1;
    char name[96];
    snprintf(name, sizeof name, "%lldx%lldx%lldx%lld%s k%dx%d s%d,%d p%d,%d", (long long)g->n,
             (long long)g->h, (long long)g->w, (long long)g->c, g->pad ? " padded" : "", g->kh,
             g->kw, g->sh, g->sw, g->ph, g->pw);
    const bp_pool_attrs a = {.kernel_h = g->kh, .kernel_w = g->kw, .stride_h = g->sh,
                             .stride_w = g->sw, .pad_h = g->ph, .pad_w = g->pw,
                             .count_include_pad = g->include_pad, .accumulate = 0};
    const bp_abi_tensor x = vc_tensor_desc(F32, g->n, g->h, g->w, g->c, g->pad);
    const bp_abi_tensor y = vc_tensor_desc(F32, g->n, oh, ow, g->c, g->pad);
    /* the mask as the plan lays it out: INT8, channels padded to 8 */
    const bp_abi_tensor mask = vc_tensor_desc(I8, g->n, oh, ow, g->c, (g->c + 7) / 8 * 8);
    vc_case *c = add("maxpool.fwd", "%s", name);
    in(c, x);
    out(c, y);
    out(c, mask);
    attrs(c, &a, sizeof a);
    c = add("maxpool.bwd", "%s", name);
    in(c, y);
    in(c, mask);
    out(c, x);
    attrs(c, &a, sizeof a);
    c = add("avgpool.fwd", "%s%s", name, g->include_pad ? " include_pad" : "");
    in(c, x);
    out(c, y);
    attrs(c, &a, sizeof a);
    c = add("avgpool.bwd", "%s%s", name, g->include_pad ? " include_pad" : "");
    in(c, y);
    out(c, x);
    attrs(c, &a, sizeof a);
  }
}

/* ---- softmax cross-entropy ----------------------------------------------------------- */

static void softmax_cases(void) {
  static const struct {
    int64_t n, k, pad;
    float smoothing;
  } geos[] = {{5, 10, 0, 0.1f}, {1, 3, 0, 0.0f}, {4, 7, 8, 0.1f}, {16, 10, 0, 0.0f}};
  for (size_t i = 0; i < sizeof geos / sizeof geos[0]; i++) {
    const bp_softmax_ce_attrs a = {.label_smoothing = geos[i].smoothing,
                                   .grad_scale = 1.0f / (float)geos[i].n, .compute_grad = 1};
    vc_case *c = add("softmax_ce.fwd_bwd", "N%lld K%lld%s smoothing %.1f", (long long)geos[i].n,
                     (long long)geos[i].k, geos[i].pad ? " padded" : "", (double)geos[i].smoothing);
    const bp_abi_tensor logits = vc_tensor_desc(F32, geos[i].n, 1, 1, geos[i].k, geos[i].pad);
    in(c, logits);
    in(c, vc_tensor_desc(I32, geos[i].n, 1, 1, 1, 0));
    out(c, vc_tensor_desc(F32, 1, 1, 1, 1, 0));
    out(c, vc_tensor_desc(F32, 1, 1, 1, 1, 0));
    out(c, logits);
    attrs(c, &a, sizeof a);
  }
  /* (1.5) the loss scale S as input 2: dlogits scaled by it (as large as
   * FP16 dlogits of the AMP twin hold) */
  for (size_t i = 0; i < sizeof geos / sizeof geos[0]; i++) {
    const double scale = geos[i].n >= 4 ? 65536 : 1024;
    const bp_softmax_ce_attrs a = {.label_smoothing = geos[i].smoothing,
                                   .grad_scale = 1.0f / (float)geos[i].n, .compute_grad = 1,
                                   .has_loss_scale = 1};
    vc_case *c = add("softmax_ce.fwd_bwd", "N%lld K%lld%s smoothing %.1f loss scale %g",
                     (long long)geos[i].n, (long long)geos[i].k, geos[i].pad ? " padded" : "",
                     (double)geos[i].smoothing, scale);
    const bp_abi_tensor logits = vc_tensor_desc(F32, geos[i].n, 1, 1, geos[i].k, geos[i].pad);
    in(c, logits);
    in(c, vc_tensor_desc(I32, geos[i].n, 1, 1, 1, 0));
    in(c, vc_tensor_desc(F32, 1, 1, 1, 1, 0));
    c->in[2].fill = VC_FILL_CONST;
    c->in[2].lo = scale;
    out(c, vc_tensor_desc(F32, 1, 1, 1, 1, 0));
    out(c, vc_tensor_desc(F32, 1, 1, 1, 1, 0));
    out(c, logits);
    attrs(c, &a, sizeof a);
  }
}

/* ---- range ops: spans [1,1,1,E] ------------------------------------------------------ */

static const char *dtname(int32_t d) {
  return d == F32 ? "fp32" : d == F16 ? "fp16" : d == I8 ? "int8" : "int32";
}

/* The skip input (has_skip) of range.ema and the optimizers: 0 must give
 * what the op gives without it, 1 must leave every output as it was. */
static void skip_cases(int64_t e) {
  const bp_range_attrs ra = {.decay = 0.9f, .has_skip = 1};
  const bp_optimizer_attrs sgd = {.momentum = 0.9f, .weight_decay = 5e-4f, .has_skip = 1};
  const bp_optimizer_attrs adam = {.weight_decay = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f,
                                   .eps = 1e-8f, .has_skip = 1};
  const bp_optimizer_attrs lars = {.momentum = 0.9f, .weight_decay = 5e-4f, .eta = 0.001f,
                                   .has_skip = 1};
  const bp_abi_tensor one = vc_tensor_desc(F32, 1, 1, 1, 1, 0);
  for (int skip = 0; skip < 2; skip++) {
    vc_case *c[4];
    c[0] = add("range.ema", "E%lld skip %d", (long long)e, skip);
    in(c[0], vc_span_desc(F32, e));
    out(c[0], vc_span_desc(F32, e));
    attrs(c[0], &ra, sizeof ra);
    c[1] = add("range.sgd", "E%lld skip %d", (long long)e, skip);
    in(c[1], vc_span_desc(F32, e));
    in(c[1], one);
    for (int k = 0; k < 2; k++) out(c[1], vc_span_desc(F32, e));
    attrs(c[1], &sgd, sizeof sgd);
    c[2] = add("range.adamw", "E%lld skip %d", (long long)e, skip);
    in(c[2], vc_span_desc(F32, e));
    in(c[2], one);
    in(c[2], one);
    for (int k = 0; k < 3; k++) out(c[2], vc_span_desc(F32, e));
    attrs(c[2], &adam, sizeof adam);
    c[3] = add("range.lars", "E%lld S2 skip %d", (long long)e, skip);
    in(c[3], vc_span_desc(F32, e));
    in(c[3], one);
    in(c[3], vc_tensor_desc(I32, 1, 1, 1, 3, 0));
    for (int k = 0; k < 2; k++) out(c[3], vc_span_desc(F32, e));
    out(c[3], vc_tensor_desc(F32, 1, 1, 1, 4, 0));
    attrs(c[3], &lars, sizeof lars);
    for (int k = 0; k < 4; k++) {
      in(c[k], one);
      c[k]->in[c[k]->num_inputs - 1].fill = VC_FILL_CONST;
      c[k]->in[c[k]->num_inputs - 1].lo = skip;
    }
  }
}

/* (1.5) Mixed precision's range ops: range.unscale (FP16 gradients to FP32
 * by the loss scale) and range.loss_scale (the scale's update). */
static void amp_range_cases(void) {
  static const int64_t sizes[] = {64, 1000, 4133};
  const bp_range_attrs ra = {0};
  for (size_t s = 0; s < 3; s++)
    for (int v = 0; v < (s ? 2 : 1); v++) { /* E64: scale 65536; then also NaN, scale 3000 */
      const int nan = v && s == 1, odd = v && s == 2;
      vc_case *c = add("range.unscale", "E%lld scale %s%s", (long long)sizes[s],
                       odd ? "3000" : "65536", nan ? " NaN last" : "");
      in(c, vc_span_desc(F16, sizes[s]));
      in(c, vc_tensor_desc(F32, 1, 1, 1, 1, 0));
      out(c, vc_span_desc(F32, sizes[s]));
      attrs(c, &ra, sizeof ra);
      c->in[0].fill = nan ? VC_FILL_NAN_LAST : VC_FILL_UNSET;
      c->in[0].lo = -1000;
      c->in[0].hi = 1000;
      c->in[1].fill = VC_FILL_CONST;
      c->in[1].lo = odd ? 3000 : 65536;
    }
  static const struct {
    const char *name;
    double found_inf, scale, good_steps;
    int32_t interval;
  } ls[] = {
      {"clean", 0, 65536, 5, 2000},
      {"clean, growth at the interval", 0, 65536, 1999, 2000},
      {"overflow, backoff", 1, 65536, 1999, 2000},
      {"static, clean", 0, 1024, 5, 0},
      {"static, overflow", 1, 1024, 5, 0},
      {"clean, growth not finite", 0, 3e38, 1999, 2000},
  };
  for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++) {
    const bp_loss_scale_attrs a = {.growth_factor = 2.0f, .backoff_factor = 0.5f,
                                   .growth_interval = ls[i].interval};
    vc_case *c = add("range.loss_scale", "%s", ls[i].name);
    in(c, vc_tensor_desc(F32, 1, 1, 1, 1, 0));
    for (int k = 0; k < 4; k++) out(c, vc_tensor_desc(F32, 1, 1, 1, 1, 0));
    attrs(c, &a, sizeof a);
    c->in[0].fill = VC_FILL_CONST;
    c->in[0].lo = ls[i].found_inf;
    c->out[0].fill = c->out[1].fill = VC_FILL_CONST;
    c->out[0].lo = ls[i].scale;
    c->out[1].lo = ls[i].good_steps;
  }
  skip_cases(1000);
  skip_cases(4133);
}

static void range_cases(void) {
  static const int64_t sizes[] = {64, 1000, 4133};
  static const int32_t all[] = {F32, F16, I8, I32};
  const bp_range_attrs ra = {.scale = 0.5f, .decay = 0.9f};
  for (size_t s = 0; s < 3; s++) {
    const int64_t e = sizes[s];
    for (size_t d = 0; d < 4; d++) {
      vc_case *c = add("range.zero", "E%lld %s", (long long)e, dtname(all[d]));
      out(c, vc_span_desc(all[d], e));
      c = add("range.copy", "E%lld %s", (long long)e, dtname(all[d]));
      in(c, vc_span_desc(all[d], e));
      out(c, vc_span_desc(all[d], e));
    }
    vc_case *c = add("range.scale", "E%lld", (long long)e);
    in(c, vc_span_desc(F32, e));
    out(c, vc_span_desc(F32, e));
    attrs(c, &ra, sizeof ra);
    for (int to16 = 0; to16 < 2; to16++) {
      c = add("range.cast", "E%lld %s", (long long)e, to16 ? "fp32->fp16" : "fp16->fp32");
      in(c, vc_span_desc(to16 ? F32 : F16, e));
      out(c, vc_span_desc(to16 ? F16 : F32, e));
      c->in[0].fill = VC_FILL_UNIFORM;
      /* to FP16: beyond its range too (the overflow rule) */
      c->in[0].lo = to16 ? -70000 : -60000;
      c->in[0].hi = to16 ? 70000 : 60000;
    }
    c = add("range.ema", "E%lld", (long long)e);
    in(c, vc_span_desc(F32, e));
    out(c, vc_span_desc(F32, e));
    attrs(c, &ra, sizeof ra);
    for (int d = 0; d < 2; d++)
      for (int nan = 0; nan < 2; nan++) {
        c = add("range.nan_check", "E%lld %s%s", (long long)e, d ? "fp16" : "fp32",
                nan ? " NaN last" : " clean");
        in(c, vc_span_desc(d ? F16 : F32, e));
        out(c, vc_tensor_desc(F32, 1, 1, 1, 1, 0));
        c->in[0].fill = nan ? VC_FILL_NAN_LAST : VC_FILL_UNIFORM;
        c->in[0].lo = -1;
        c->in[0].hi = 1;
      }
    for (int nesterov = 0; nesterov < 2; nesterov++) {
      const bp_optimizer_attrs oa = {.momentum = 0.9f, .weight_decay = 5e-4f,
                                     .nesterov = nesterov};
      c = add("range.sgd", "E%lld%s", (long long)e, nesterov ? " nesterov" : "");
      in(c, vc_span_desc(F32, e));
      in(c, vc_tensor_desc(F32, 1, 1, 1, 1, 0));
      out(c, vc_span_desc(F32, e));
      out(c, vc_span_desc(F32, e));
      attrs(c, &oa, sizeof oa);
    }
    const bp_optimizer_attrs adam = {.weight_decay = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f,
                                     .eps = 1e-8f};
    c = add("range.adamw", "E%lld", (long long)e);
    in(c, vc_span_desc(F32, e));
    in(c, vc_tensor_desc(F32, 1, 1, 1, 1, 0));
    in(c, vc_tensor_desc(F32, 1, 1, 1, 1, 0));
    for (int k = 0; k < 3; k++) out(c, vc_span_desc(F32, e));
    attrs(c, &adam, sizeof adam);
    const bp_optimizer_attrs lars = {.momentum = 0.9f, .weight_decay = 5e-4f, .eta = 0.001f};
    const int64_t segs = s + 1;
    c = add("range.lars", "E%lld S%lld", (long long)e, (long long)segs);
    in(c, vc_span_desc(F32, e));
    in(c, vc_tensor_desc(F32, 1, 1, 1, 1, 0));
    in(c, vc_tensor_desc(I32, 1, 1, 1, segs + 1, 0));
    out(c, vc_span_desc(F32, e));
    out(c, vc_span_desc(F32, e));
    out(c, vc_tensor_desc(F32, 1, 1, 1, 2 * segs, 0));
    attrs(c, &lars, sizeof lars);
  }
  amp_range_cases();
  /* collectives: listed so validate can say why they are skipped */
  static const char *const collectives[] = {"allreduce.sum", "allreduce.reduce_scatter",
                                            "allreduce.all_gather"};
  for (size_t i = 0; i < 3; i++) {
    vc_case *c = add(collectives[i], "E1000");
    in(c, vc_span_desc(F32, 1000));
    out(c, vc_span_desc(F32, 1000));
    c->alias[0] = 0;
  }
}

/* ---- attention --------------------------------------------------------------------- */

typedef struct attn_geo {
  int64_t n, h, w, d, heads, pad; /* pad: padded_c of qkv and dqkv (0: compact) */
  int32_t causal;
} attn_geo;

/* T = 49 (the ViT's 7x7 tokens) with heads 1, 2 and 4, causal or not,
 * batches of every small residue, one token, padded channels */
static const attn_geo attn_geos[] = {
    {2, 7, 7, 16, 4, 0, 0}, {3, 7, 7, 16, 4, 0, 1}, {1, 7, 7, 8, 1, 0, 0},
    {5, 7, 7, 12, 2, 0, 1}, {3, 2, 3, 6, 2, 24, 0}, {2, 1, 5, 4, 1, 16, 1},
    {1, 1, 1, 4, 2, 0, 0},  {4, 7, 7, 64, 4, 0, 0},
};

/* fwd: qkv -> y, lse | bwd: qkv, y, lse, dy -> dqkv */
static void attention_cases(void) {
  for (size_t i = 0; i < sizeof attn_geos / sizeof attn_geos[0]; i++) {
    const attn_geo *g = &attn_geos[i];
    const bp_attention_attrs a = {(int32_t)g->heads, g->causal, 0};
    const bp_abi_tensor qkv = vc_tensor_desc(F32, g->n, g->h, g->w, 3 * g->d, g->pad);
    const bp_abi_tensor y = vc_tensor_desc(F32, g->n, g->h, g->w, g->d, 0);
    const bp_abi_tensor lse = vc_tensor_desc(F32, g->n, g->h, g->w, g->heads, 0);
    char name[96];
    snprintf(name, sizeof name, "N%lld T%lldx%lld D%lld heads %lld%s%s", (long long)g->n,
             (long long)g->h, (long long)g->w, (long long)g->d, (long long)g->heads,
             g->causal ? " causal" : "", g->pad ? " padded" : "");
    vc_case *c = add("attention.fwd", "%s", name);
    in(c, qkv);
    out(c, y);
    out(c, lse);
    attrs(c, &a, sizeof a);
    c = add("attention.bwd", "%s", name);
    in(c, qkv);
    in(c, y);
    in(c, lse);
    in(c, y);
    out(c, qkv);
    attrs(c, &a, sizeof a);
  }
}

static void build(void) {
  conv_cases();
  fc_cases();
  elementwise_cases();
  pool_cases();
  batchnorm_cases();
  layernorm_cases(); /* ViT ops */
  pos_embed_cases();
  softmax_cases();
  range_cases();
  attention_cases();
  for (int i = 0; i < table_count; i++) vc_op_complete(&table[i]);
}

const vc_case *vc_builtin_cases(int *count_out) {
  pthread_once(&table_once, build);
  *count_out = table_count;
  return table;
}

/* ---- module ops with infer_shape ------------------------------------------------------ */

void vc_layer_complete(const bp_registry *r, vc_case *c, int defaults) {
  for (int i = 0; r && i < bp_registry_layer_count(r); i++) {
    const bp_registered_layer *l = bp_registry_layer(r, i);
    const int fwd = l->layer.forward_op && strcmp(l->layer.forward_op, c->op) == 0;
    const int bwd = l->layer.backward_op && strcmp(l->layer.backward_op, c->op) == 0;
    if (!fwd && !bwd) continue;
    for (int k = 0; defaults && k < l->layer.num_attrs; k++) {
      const bp_abi_layer_attr *a = &l->attrs[k];
      if ((uint64_t)a->offset + 4 > c->attr_size) continue;
      if (a->type == BP_ABI_LAYER_ATTR_FLOAT) {
        const float v = (float)a->default_value;
        memcpy(c->attrs + a->offset, &v, 4);
      } else {
        const int32_t v = (int32_t)a->default_value;
        memcpy(c->attrs + a->offset, &v, 4);
      }
    }
    if (bwd && l->layer.accumulate_offset != UINT32_MAX &&
        (uint64_t)l->layer.accumulate_offset + 4 <= c->attr_size)
      c->accumulate_offset = (int)l->layer.accumulate_offset;
    return;
  }
}

/* The saved tensors of a module layer type whose forward op is op, as
 * outputs 1..S (the host plans them from their declarations, never from
 * infer_shape: bp_abi_layer_saved): per channel [1,1,1,C_out], per sample
 * [N,H_out,W_out,channels or C_out], in their declared dtypes. */
static void saved_shapes(const bp_registry *r, const bp_abi_op *op, bp_abi_tensor *outs) {
  for (int j = 0; j < bp_registry_layer_count(r); j++) {
    const bp_registered_layer *l = bp_registry_layer(r, j);
    if (strcmp(l->layer.forward_op, op->name) != 0 || !l->saved) continue;
    for (int k = 0; k < l->layer.num_saved && 1 + k < op->num_outputs && 1 + k < VC_MAX; k++) {
      const bp_abi_layer_saved *d = &l->saved[k];
      bp_abi_tensor *t = &outs[1 + k];
      t->dtype = d->dtype;
      if (d->per_channel) {
        t->shape[0] = t->shape[1] = t->shape[2] = 1;
      } else {
        t->shape[0] = outs[0].shape[0];
        t->shape[1] = outs[0].shape[1];
        t->shape[2] = outs[0].shape[2];
      }
      t->shape[3] = !d->per_channel && d->channels > 0 ? d->channels : outs[0].shape[3];
    }
    return;
  }
}

int vc_infer_cases(const bp_registry *r, const bp_abi_op *op, vc_case *out_cases, int cap) {
  static const plain_geo geos[] = {{2, 3, 5, 7, 0}, {1, 1, 1, 13, 0}, {2, 3, 3, 5, 8}};
  int count = 0;
  if (!op->infer_shape || op->num_inputs < 1 || op->num_inputs > VC_MAX || op->num_outputs < 1 ||
      op->num_outputs > VC_MAX || op->attr_size > sizeof out_cases[0].attrs)
    return 0;
  for (size_t i = 0; i < sizeof geos / sizeof geos[0] && count < cap; i++) {
    vc_case *c = &out_cases[count];
    vc_case_init(c, op->name);
    plain_name(&geos[i], c->name, sizeof c->name);
    bp_abi_tensor ins[VC_MAX], outs[VC_MAX];
    for (int k = 0; k < op->num_inputs; k++)
      ins[k] = vc_tensor_desc(F32, geos[i].n, geos[i].h, geos[i].w, geos[i].c, geos[i].pad);
    memset(outs, 0, sizeof outs);
    for (int k = 0; k < op->num_outputs; k++) outs[k].struct_size = sizeof outs[k];
    c->attr_size = op->attr_size;
    vc_layer_complete(r, c, 1);
    char reason[256] = "";
    if (op->infer_shape(op->attr_size ? c->attrs : NULL, ins, outs, reason, sizeof reason) != 0)
      continue;
    saved_shapes(r, op, outs);
    c->num_inputs = op->num_inputs;
    c->num_outputs = op->num_outputs;
    int ok = 1;
    for (int k = 0; k < op->num_inputs; k++) c->in[k].d = ins[k];
    for (int k = 0; k < op->num_outputs; k++) {
      c->out[k].d = vc_tensor_desc(outs[k].dtype, outs[k].shape[0], outs[k].shape[1],
                                   outs[k].shape[2], outs[k].shape[3], 0);
      ok &= c->out[k].d.slot_bytes > 0;
    }
    if (!ok) continue;
    vc_op_complete(c);
    vc_layer_complete(r, c, 0); /* the accumulate flag, which vc_op_complete does not know */
    count++;
  }
  return count;
}
