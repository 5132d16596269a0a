/* The fast CPU op module (ops/cpu/) against the reference module: both
 * loaded through the registry (ops_ref_util.c loads the reference, this
 * file adds the cpu module to the same registry), every cpu kernel run on
 * the same inputs as the reference kernel, and the outputs required to be
 * bit-identical: the whole buffer, the 16-byte tail included, compared
 * with memcmp.
 *
 * Sizes 1, 3, 15, 16, 17, 1000 and 100003 (below, at and around a vector
 * width, and long runs with a remainder), each at an aligned start and one
 * float off it. Data: mostly uniform values, with -0.0, +0.0, subnormals,
 * tiny normals and huge values (products overflow to Inf, and Inf - Inf
 * makes NaNs) mixed in, plus Infs and NaNs with assorted payloads and
 * signs (quiet and signalling) for relu. One case is left out: relu.bwd
 * with accumulate adding a NaN dy into a NaN dx, whose payload IEEE 754
 * leaves to the operand order the compiler picks (cpu-impl.h).
 *   sgd: plain, momentum, Nesterov, weight decay 0 and 5e-4 (and a huge
 * one), three steps each; adamw: weight decay 0 and 1e-2, four beta/eps
 * settings, steps 1..4 and 1000, from zero moments and from any state;
 * relu.fwd out of place and in place; relu.bwd accumulate 0 and 1, out of
 * place and in place (dx is dy); relu over dense 4-D shapes too.
 *   maxpool.fwd and .bwd: windows 2x2 stride 2, 3x3 stride 2 and 1 with
 * padding, a rectangular one, one larger than the input; odd H and W;
 * C 1, 3, 16, 17, 32, 64, 130 (with and without padded channels); batch
 * 1 to 5; x with ties, signed zeros, Infs and NaNs (ties and NaNs also by
 * hand); outputs prefilled with NaN (overwritten), the backward with
 * accumulate 0 and 1 (dx with NaNs when added to; dy without, see the
 * NaN + NaN case above); y, mask and dx compared byte for byte; the
 * backward's mask check.
 *   batchnorm.fwd_train (running statistics in place and not, momentum
 * 0.1, 0 and 1), .fwd_eval and .bwd (accumulate 0 and 1): C 1, 3, 5, 16,
 * 17, 32, 64, 130, batch 1 to 5, padded channels, outputs prefilled with
 * NaN, every output compared bit for bit.
 *
 * Then: refusals (a relu layout that is not one dense run, a maxpool or
 * batchnorm tensor whose channels are not contiguous, each with a reason, which the
 * reference serves; bad arguments give the reference's very
 * reason; run() checks), the descriptors, the instruction set in use
 * (BP_CPU_ISA; CTest runs this suite for each set), and selection: the
 * registry picks "cpu" over "reference" for dense nodes, pins override it,
 * and a node the cpu kernel refuses goes to the reference. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops_ref_util.h"

#define FP32 BP_ABI_DTYPE_FP32

static const int64_t sizes[] = {1, 3, 15, 16, 17, 1000, 100003};
#define SIZES ((int)(sizeof sizes / sizeof sizes[0]))

/* ---- the two modules ------------------------------------------------------ */

/* What the module logged while loading (log level info), for the ISA check. */
static char load_log[4096];

static bp_registry *both_modules(void) {
  static int loaded;
  bp_registry *r = ops_registry_get(); /* the reference module */
  if (!loaded) {
    /* capture stderr around the load to read the module's info line */
    ck_assert_int_eq(bp_registry_set_log_level(r, BP_ABI_LOG_INFO), BP_OK);
    fflush(stderr);
    FILE *tmp = tmpfile();
    ck_assert_ptr_nonnull(tmp);
    const int saved = dup(STDERR_FILENO);
    ck_assert_int_ge(saved, 0);
    dup2(fileno(tmp), STDERR_FILENO);
    const bp_status st = bp_registry_load(r, BP_OPS_CPU_PATH);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    rewind(tmp);
    const size_t got = fread(load_log, 1, sizeof load_log - 1, tmp);
    load_log[got] = '\0';
    fclose(tmp);
    ck_assert_int_eq(bp_registry_set_log_level(r, BP_ABI_LOG_WARN), BP_OK);
    if (st != BP_OK)
      ck_abort_msg("bp_registry_load(%s): %s (log: %s)", BP_OPS_CPU_PATH, bp_last_error(),
                   load_log);
    loaded = 1;
  }
  return r;
}

static const bp_abi_kernel *kernel_of(const char *op, const char *impl) {
  both_modules();
  return ops_kernel_impl(op, impl);
}

/* ---- calling a kernel directly ------------------------------------------- */

/* supports() asserted, then run() asserted to succeed. */
static void k_run(const char *impl, const ops_call *c) {
  const bp_abi_kernel *k = kernel_of(c->op, impl);
  char reason[256];
  if (ops_kernel_supports(k, c, reason, sizeof reason) != 1)
    ck_abort_msg("%s/%s refused: %s", c->op, impl, reason);
  const int rc = ops_kernel_run(k, c, NULL, 0);
  if (rc != BP_ABI_OK) ck_abort_msg("%s/%s run() returned %d", c->op, impl, rc);
}

/* ---- tensors and data ----------------------------------------------------- */

/* A span [1,1,1,n] whose data starts `offset` floats into its allocation
 * (so the loops meet unaligned starts); `base` is what to free. The 16
 * bytes after the n elements are tt_new's sentinel tail. */
typedef struct vec {
  tt t;
  void *base;
} vec;

static vec vec_new(int64_t n, int64_t offset) {
  vec v;
  v.t = tt_new(FP32, 1, 1, 1, n + offset, 0);
  v.base = v.t.data;
  v.t.data = (float *)v.base + offset;
  v.t.d.shape[3] = n;
  v.t.d.padded_c = n;
  v.t.d.stride[2] = v.t.d.stride[1] = v.t.d.stride[0] = n;
  v.t.d.slot_bytes = (uint64_t)n * sizeof(float) + 16;
  return v;
}
static void vec_free(vec *v) {
  free(v->base);
  v->base = v->t.data = NULL;
}
static float *fp(const tt *t) { return (float *)t->data; }

/* One value of the mix; `nonfinite` adds Infs and NaNs. */
static float special(uint64_t *rng, int nonfinite) {
  const double u = tt_rand_unit(rng);
  const float sign = tt_rand_unit(rng) < 0.5 ? -1.0f : 1.0f;
  const int kind = (int)(tt_rand_unit(rng) * 20.0);
  switch (kind) {
    case 0: return -0.0f;
    case 1: return 0.0f;
    case 2: return sign * (float)(u * 1e-38); /* mostly subnormal */
    case 3: return sign * float_of(1u + (uint32_t)(u * 64.0)); /* the smallest subnormals */
    case 4: return sign * (float)(FLT_MIN * (1.0 + u)); /* tiny normal */
    case 5: return sign * (float)(1e30 + u * 3e38);     /* huge */
    case 6: return sign * FLT_MAX;
    case 7:
      if (nonfinite) return sign * INFINITY;
      return sign * (float)(1e-6 * u);
    case 8:
      if (nonfinite) { /* a quiet or signalling NaN with a payload */
        const uint32_t payload = 1u + (uint32_t)(u * 0x3ffffe);
        const uint32_t quiet = tt_rand_unit(rng) < 0.5 ? 0x400000u : 0u;
        return float_of((sign < 0 ? 0x80000000u : 0u) | 0x7f800000u | quiet | payload);
      }
      return sign * (float)(1e3 * u);
    default: return (float)(4.0 * u - 2.0);
  }
}

static void fill(tt *t, uint64_t *rng, int nonfinite) {
  const int64_t n = tt_count(t);
  for (int64_t i = 0; i < n; i++) *tt_at(t, i) = special(rng, nonfinite);
}

/* The whole slot of b made equal to a's (same layout). */
static void same_bytes(tt *b, const tt *a) { memcpy(b->data, a->data, a->d.slot_bytes); }

/* The whole slots equal (logical elements, padding and tail, any dtype);
 * else fails naming `what`, `context` and the first differing 4-byte word
 * of each side. */
static void expect_same_bytes(const tt *cpu, const tt *ref, const char *what,
                              const char *context) {
  if (memcmp(cpu->data, ref->data, ref->d.slot_bytes) == 0) return;
  const unsigned char *a = cpu->data, *b = ref->data;
  uint64_t i = 0;
  while (a[i] == b[i]) i++;
  uint32_t wa = 0, wb = 0;
  const uint64_t w = i & ~(uint64_t)3, left = ref->d.slot_bytes - w;
  memcpy(&wa, a + w, left < 4 ? left : 4), memcpy(&wb, b + w, left < 4 ? left : 4);
  ck_abort_msg("%s (%s): byte %llu of %llu differs: cpu word %08x, reference word %08x", what,
               context, (unsigned long long)i, (unsigned long long)ref->d.slot_bytes,
               (unsigned)wa, (unsigned)wb);
}

/* expect_same_bytes for the range, relu and batch-norm runs. */
static void expect_identical(const tt *cpu, const tt *ref, const char *what, int64_t n,
                             int64_t offset, const char *mode) {
  char context[160];
  snprintf(context, sizeof context, "%s, n %lld, offset %lld", mode, (long long)n,
           (long long)offset);
  expect_same_bytes(cpu, ref, what, context);
}

static tt scalar(float v) {
  tt t = tt_new(FP32, 1, 1, 1, 1, 0);
  fp(&t)[0] = v;
  return t;
}

/* ---- range.sgd ------------------------------------------------------------ */

typedef struct sgd_cfg {
  float momentum, weight_decay;
  int nesterov;
  const char *name;
} sgd_cfg;

static const sgd_cfg sgd_cfgs[] = {
    {0.0f, 0.0f, 0, "plain"},
    {0.9f, 0.0f, 0, "momentum"},
    {0.9f, 0.0f, 1, "nesterov"},
    {0.0f, 5e-4f, 0, "plain, weight decay 5e-4"},
    {0.9f, 5e-4f, 0, "momentum, weight decay 5e-4"},
    {0.9f, 5e-4f, 1, "nesterov, weight decay 5e-4"},
    {0.5f, 1e30f, 1, "nesterov, huge weight decay"},
};

START_TEST(sgd_matches_reference) {
  const int64_t n = sizes[_i];
  static const float lrs[] = {0.1f, 0.01f, -3.0f};
  for (size_t ci = 0; ci < sizeof sgd_cfgs / sizeof sgd_cfgs[0]; ci++) {
    const sgd_cfg *cfg = &sgd_cfgs[ci];
    bp_optimizer_attrs a;
    memset(&a, 0, sizeof a);
    a.momentum = cfg->momentum, a.weight_decay = cfg->weight_decay, a.nesterov = cfg->nesterov;
    for (int64_t off = 0; off <= 1; off++) {
      uint64_t rng = 1000u * (uint64_t)ci + (uint64_t)(n + off);
      vec g = vec_new(n, off), wr = vec_new(n, off), mr = vec_new(n, off);
      vec wc = vec_new(n, off), mc = vec_new(n, off);
      fill(&wr.t, &rng, 0);
      fill(&mr.t, &rng, 0);
      if (off == 0) memset(mr.t.data, 0, (size_t)n * sizeof(float)); /* a first step */
      same_bytes(&wc.t, &wr.t), same_bytes(&mc.t, &mr.t);
      for (int step = 0; step < 3; step++) {
        fill(&g.t, &rng, 0);
        tt lr = scalar(lrs[step]);
        const ops_call ref = {"range.sgd", {&g.t, &lr}, {&wr.t, &mr.t}, 2, 2, &a, sizeof a};
        const ops_call cpu = {"range.sgd", {&g.t, &lr}, {&wc.t, &mc.t}, 2, 2, &a, sizeof a};
        k_run("reference", &ref);
        k_run("cpu", &cpu);
        expect_identical(&wc.t, &wr.t, "sgd w", n, off, cfg->name);
        expect_identical(&mc.t, &mr.t, "sgd m", n, off, cfg->name);
        tt_free(&lr);
      }
      vec_free(&g), vec_free(&wr), vec_free(&mr), vec_free(&wc), vec_free(&mc);
    }
  }
}
END_TEST

/* ---- range.adamw ---------------------------------------------------------- */

typedef struct adamw_cfg {
  float weight_decay, beta1, beta2, eps;
  const char *name;
} adamw_cfg;

static const adamw_cfg adamw_cfgs[] = {
    {0.0f, 0.9f, 0.999f, 1e-8f, "defaults, no weight decay"},
    {1e-2f, 0.9f, 0.999f, 1e-8f, "defaults, weight decay 1e-2"},
    {1e-2f, 0.5f, 0.75f, 1e-3f, "beta 0.5/0.75, eps 1e-3"},
    {0.0f, 0.0f, 0.0f, 1e-30f, "betas 0, tiny eps"},
};

START_TEST(adamw_matches_reference) {
  const int64_t n = sizes[_i];
  static const float steps[] = {1, 2, 3, 4, 1000};
  static const float lrs[] = {1e-3f, 0.1f, 1e-3f, 2.0f, 1e-4f};
  for (size_t ci = 0; ci < sizeof adamw_cfgs / sizeof adamw_cfgs[0]; ci++) {
    const adamw_cfg *cfg = &adamw_cfgs[ci];
    bp_optimizer_attrs a;
    memset(&a, 0, sizeof a);
    a.weight_decay = cfg->weight_decay, a.beta1 = cfg->beta1, a.beta2 = cfg->beta2;
    a.eps = cfg->eps;
    for (int64_t off = 0; off <= 1; off++) {
      uint64_t rng = 7000u * (uint64_t)ci + (uint64_t)(n + off);
      vec g = vec_new(n, off), wr = vec_new(n, off), mr = vec_new(n, off), vr = vec_new(n, off);
      vec wc = vec_new(n, off), mc = vec_new(n, off), vc = vec_new(n, off);
      fill(&wr.t, &rng, 0);
      if (off == 0) { /* from the start: m = v = 0 */
        memset(mr.t.data, 0, (size_t)n * sizeof(float));
        memset(vr.t.data, 0, (size_t)n * sizeof(float));
      } else { /* any state, negative v included (its sqrt is a NaN in both) */
        fill(&mr.t, &rng, 0);
        fill(&vr.t, &rng, 0);
      }
      same_bytes(&wc.t, &wr.t), same_bytes(&mc.t, &mr.t), same_bytes(&vc.t, &vr.t);
      for (int s = 0; s < 5; s++) {
        fill(&g.t, &rng, 0);
        tt lr = scalar(lrs[s]), step = scalar(steps[s]);
        const ops_call ref = {"range.adamw", {&g.t, &lr, &step}, {&wr.t, &mr.t, &vr.t},
                              3, 3, &a, sizeof a};
        const ops_call cpu = {"range.adamw", {&g.t, &lr, &step}, {&wc.t, &mc.t, &vc.t},
                              3, 3, &a, sizeof a};
        k_run("reference", &ref);
        k_run("cpu", &cpu);
        expect_identical(&wc.t, &wr.t, "adamw w", n, off, cfg->name);
        expect_identical(&mc.t, &mr.t, "adamw m", n, off, cfg->name);
        expect_identical(&vc.t, &vr.t, "adamw v", n, off, cfg->name);
        tt_free(&lr), tt_free(&step);
      }
      vec_free(&g), vec_free(&wr), vec_free(&mr), vec_free(&vr);
      vec_free(&wc), vec_free(&mc), vec_free(&vc);
    }
  }
}
END_TEST

/* ---- relu ----------------------------------------------------------------- */

static const bp_elementwise_attrs overwrite = {0}, accumulate = {1};

/* Both relu ops, every mode, on tensors shaped like `like` (dense). */
static void relu_compare(const tt *like, int64_t offset, uint64_t seed) {
  const int64_t n = tt_count(like);
  uint64_t rng = seed;
  const int64_t *s = like->d.shape;
  /* spans of n floats `offset` floats into their allocations, reshaped
   * to like's dense layout */
  vec xs = vec_new(n, offset), yr = vec_new(n, offset), yc = vec_new(n, offset);
  vec dy = vec_new(n, offset), dxr = vec_new(n, offset), dxc = vec_new(n, offset);
  vec xr = vec_new(n, offset), xc = vec_new(n, offset);
  tt *all[] = {&xs.t, &yr.t, &yc.t, &dy.t, &dxr.t, &dxc.t, &xr.t, &xc.t};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    for (int d = 0; d < 4; d++) { /* like's shape, dense */
      all[i]->d.shape[d] = s[d];
      all[i]->d.stride[d] = like->d.stride[d];
      all[i]->d.padded_c = s[3];
    }
  char mode[64];

  /* forward, out of place: y starts as garbage, is overwritten */
  fill(&xs.t, &rng, 1);
  fill(&yr.t, &rng, 1);
  same_bytes(&yc.t, &yr.t);
  const ops_call fr = {"relu.fwd", {&xs.t}, {&yr.t}, 1, 1, &overwrite, sizeof overwrite};
  const ops_call fc = {"relu.fwd", {&xs.t}, {&yc.t}, 1, 1, &overwrite, sizeof overwrite};
  k_run("reference", &fr);
  k_run("cpu", &fc);
  expect_identical(&yc.t, &yr.t, "relu.fwd y", n, offset, "out of place");

  /* forward, in place */
  same_bytes(&xr.t, &xs.t), same_bytes(&xc.t, &xs.t);
  const ops_call fir = {"relu.fwd", {&xr.t}, {&xr.t}, 1, 1, &overwrite, sizeof overwrite};
  const ops_call fic = {"relu.fwd", {&xc.t}, {&xc.t}, 1, 1, &overwrite, sizeof overwrite};
  k_run("reference", &fir);
  k_run("cpu", &fic);
  expect_identical(&xc.t, &xr.t, "relu.fwd x", n, offset, "in place");
  expect_identical(&xc.t, &yr.t, "relu.fwd in place vs out of place", n, offset, "in place");

  /* backward: y from a mix with NaNs and signed zeros (not only relu's
   * outputs: the kernel must not assume y >= 0) */
  fill(&yr.t, &rng, 1);
  for (int acc = 0; acc <= 1; acc++) {
    const bp_elementwise_attrs *at = acc ? &accumulate : &overwrite;
    fill(&dy.t, &rng, 1);
    fill(&dxr.t, &rng, 1);
    if (acc) /* no NaN + NaN (see the top) */
      for (int64_t i = 0; i < n; i++)
        if (isnan(fp(&dxr.t)[i]) && isnan(fp(&dy.t)[i])) fp(&dxr.t)[i] = 1.5f;
    same_bytes(&dxc.t, &dxr.t);
    snprintf(mode, sizeof mode, "accumulate %d, out of place", acc);
    const ops_call br = {"relu.bwd", {&yr.t, &dy.t}, {&dxr.t}, 2, 1, at, sizeof *at};
    const ops_call bc = {"relu.bwd", {&yr.t, &dy.t}, {&dxc.t}, 2, 1, at, sizeof *at};
    k_run("reference", &br);
    k_run("cpu", &bc);
    expect_identical(&dxc.t, &dxr.t, "relu.bwd dx", n, offset, mode);

    /* in place: dx is dy */
    same_bytes(&xr.t, &dy.t), same_bytes(&xc.t, &dy.t);
    snprintf(mode, sizeof mode, "accumulate %d, in place", acc);
    const ops_call bir = {"relu.bwd", {&yr.t, &xr.t}, {&xr.t}, 2, 1, at, sizeof *at};
    const ops_call bic = {"relu.bwd", {&yr.t, &xc.t}, {&xc.t}, 2, 1, at, sizeof *at};
    k_run("reference", &bir);
    k_run("cpu", &bic);
    expect_identical(&xc.t, &xr.t, "relu.bwd dx (= dy)", n, offset, mode);
  }
  vec *vs[] = {&xs, &yr, &yc, &dy, &dxr, &dxc, &xr, &xc};
  for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) vec_free(vs[i]);
}

START_TEST(relu_matches_reference) {
  const int64_t n = sizes[_i];
  tt flat = tt_new(FP32, 1, 1, 1, n, 0), column = tt_new(FP32, n, 1, 1, 1, 0);
  for (int64_t off = 0; off <= 1; off++) {
    relu_compare(&flat, off, 11u + (uint64_t)n + (uint64_t)off);
    relu_compare(&column, off, 97u + (uint64_t)n + (uint64_t)off);
  }
  tt_free(&flat), tt_free(&column);
}
END_TEST

START_TEST(relu_dense_shapes_match_reference) {
  static const int64_t shapes[][4] = {{128, 1, 1, 512}, {2, 3, 5, 7}, {4, 7, 7, 32}, {3, 1, 9, 1}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    tt like = tt_new(FP32, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], 0);
    relu_compare(&like, 0, 5u + i);
    relu_compare(&like, 1, 6u + i);
    tt_free(&like);
  }
}
END_TEST

/* ---- maxpool -------------------------------------------------------------- */

/* One maxpool case: shape of x, the window, and extra (padded) channels. */
typedef struct pool_case {
  int64_t n, h, w, c;
  bp_pool_attrs a; /* kernel, stride, pad (h, w), count_include_pad 0, accumulate set per run */
  int64_t extra_c;
} pool_case;

#define POOL_A(kh, kw, sh, sw, ph, pw) {kh, kw, sh, sw, ph, pw, 0, 0}
static const pool_case pool_cases[] = {
    {1, 7, 7, 1, POOL_A(2, 2, 2, 2, 0, 0), 0},   /* odd H and W, one channel */
    {5, 9, 7, 3, POOL_A(2, 2, 2, 2, 0, 0), 0},   /* batch 5, C 3 */
    {2, 8, 8, 16, POOL_A(2, 2, 2, 2, 0, 0), 0},  /* one vector of channels */
    {5, 7, 9, 17, POOL_A(3, 3, 2, 2, 1, 1), 0},  /* overlapping windows with padding */
    {1, 6, 6, 64, POOL_A(3, 3, 2, 2, 1, 1), 0},  /* one full block of channels */
    {2, 5, 5, 17, POOL_A(3, 3, 1, 1, 1, 1), 3},  /* stride 1, padded channels */
    {1, 4, 6, 130, POOL_A(2, 2, 2, 2, 0, 0), 2}, /* three channel blocks, padded */
    {3, 5, 4, 16, POOL_A(2, 2, 1, 1, 1, 1), 0},  /* windows mostly at the edges */
    {2, 8, 7, 32, POOL_A(3, 2, 1, 2, 1, 0), 1},  /* rectangular window, mixed strides */
    {1, 5, 5, 3, POOL_A(5, 5, 5, 5, 2, 2), 0},   /* windows larger than the input */
    {5, 28, 28, 32, POOL_A(2, 2, 2, 2, 0, 0), 0}, /* the CNN's shapes (batch cut to 5) */
    {5, 14, 14, 64, POOL_A(2, 2, 2, 2, 0, 0), 0},
    {3, 6, 4, 7, POOL_A(2, 2, 2, 2, 0, 0), 2},   /* tiling 2x2, odd C, padded channels */
    {2, 9, 6, 5, POOL_A(3, 3, 3, 3, 0, 0), 1},   /* tiling 3x3 */
    {2, 6, 6, 5, POOL_A(2, 2, 2, 2, 1, 1), 1},   /* 2x2 stride 2 with padding: edge windows */
};
#define POOL_CASES ((int)(sizeof pool_cases / sizeof pool_cases[0]))

/* x for the forward: half the values from a small set (ties in a window,
 * +0.0 against -0.0), the rest from the mix with Infs and NaNs. */
static void pool_fill_x(tt *t, uint64_t *rng) {
  static const float few[] = {-1.0f, 0.0f, -0.0f, 1.0f, 2.0f, -3.0f};
  const int64_t n = tt_count(t);
  for (int64_t i = 0; i < n; i++) {
    const double u = tt_rand_unit(rng);
    *tt_at(t, i) = u < 0.5 ? few[(int)(u * 12.0)] : special(rng, 1);
  }
}

/* Every logical element of t set to the same NaN (an output that must be
 * overwritten). */
static void fill_nan(tt *t) {
  const int64_t n = tt_count(t);
  for (int64_t i = 0; i < n; i++) *tt_at(t, i) = float_of(0x7fc12345u);
}

/* expect_same_bytes for the pool runs. */
static void expect_same_slot(const tt *cpu, const tt *ref, const char *what, int ci, int acc) {
  char context[160];
  const int64_t *s = ref->d.shape;
  snprintf(context, sizeof context, "pool case %d, accumulate %d, shape [%lld,%lld,%lld,%lld]", ci,
           acc, (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3]);
  expect_same_bytes(cpu, ref, what, context);
}

START_TEST(maxpool_matches_reference) {
  const pool_case *pc = &pool_cases[_i];
  const int64_t oh = (pc->h + 2 * pc->a.pad_h - pc->a.kernel_h) / pc->a.stride_h + 1;
  const int64_t ow = (pc->w + 2 * pc->a.pad_w - pc->a.kernel_w) / pc->a.stride_w + 1;
  const int64_t e = pc->extra_c;
  uint64_t rng = 500u + (uint64_t)_i;
  bp_pool_attrs a = pc->a;
  tt x = tt_new(FP32, pc->n, pc->h, pc->w, pc->c, e);
  tt yr = tt_new(FP32, pc->n, oh, ow, pc->c, e), yc = tt_new(FP32, pc->n, oh, ow, pc->c, e);
  tt mr = tt_new(BP_ABI_DTYPE_INT8, pc->n, oh, ow, pc->c, e);
  tt mc = tt_new(BP_ABI_DTYPE_INT8, pc->n, oh, ow, pc->c, e);
  tt dy = tt_new(FP32, pc->n, oh, ow, pc->c, e);
  tt dxr = tt_new(FP32, pc->n, pc->h, pc->w, pc->c, e);
  tt dxc = tt_new(FP32, pc->n, pc->h, pc->w, pc->c, e);

  /* forward: y holds NaNs and the mask garbage; both get overwritten */
  pool_fill_x(&x, &rng);
  fill_nan(&yr);
  memset(mr.data, 0x77, (size_t)mr.d.slot_bytes - 16);
  same_bytes(&yc, &yr), same_bytes(&mc, &mr);
  const ops_call fr = {"maxpool.fwd", {&x}, {&yr, &mr}, 1, 2, &a, sizeof a};
  const ops_call fc = {"maxpool.fwd", {&x}, {&yc, &mc}, 1, 2, &a, sizeof a};
  k_run("reference", &fr);
  k_run("cpu", &fc);
  expect_same_slot(&yc, &yr, "maxpool.fwd y", _i, 0);
  expect_same_slot(&mc, &mr, "maxpool.fwd mask", _i, 0);

  /* backward through that mask. dy without NaNs (its huge values still
   * make Infs and NaNs in the sums): a NaN dy added to a NaN dx is the
   * payload case IEEE 754 leaves open (see the top). */
  fill(&dy, &rng, 0);
  for (int acc = 0; acc <= 1; acc++) {
    a.accumulate = acc;
    if (acc) { /* NaNs too, quiet ones: compilers assume no signalling NaN, and
                * clang builds the untouched lanes' select as dx + -0.0f,
                * which quiets one (a real gradient never holds an sNaN) */
      fill(&dxr, &rng, 1);
      for (int64_t i = 0; i < tt_count(&dxr); i++)
        if (isnan(*tt_at(&dxr, i))) *tt_at(&dxr, i) = float_of(bits_of(*tt_at(&dxr, i)) | 0x400000u);
    } else {
      fill_nan(&dxr);
    }
    same_bytes(&dxc, &dxr);
    const ops_call br = {"maxpool.bwd", {&dy, &mr}, {&dxr}, 2, 1, &a, sizeof a};
    const ops_call bc = {"maxpool.bwd", {&dy, &mr}, {&dxc}, 2, 1, &a, sizeof a};
    k_run("reference", &br);
    k_run("cpu", &bc);
    expect_same_slot(&dxc, &dxr, "maxpool.bwd dx", _i, acc);
  }
  tt *all[] = {&x, &yr, &yc, &mr, &mc, &dy, &dxr, &dxc};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

/* Ties, signed zeros and NaNs by hand, over 17 channels (a vector and a
 * remainder), each channel its own case: the first tap wins a tie, +0.0
 * and -0.0 tie, the first NaN wins over numbers, a number never displaces
 * a NaN. */
START_TEST(maxpool_ties_and_nans_by_hand) {
  const float qn = float_of(0x7fc00001u), sn = float_of(0xff800002u); /* quiet, signalling */
  static const int64_t C = 17;
  /* the four taps of one 2x2 window per channel, row-major */
  const float taps[17][4] = {
      {1, 1, 1, 1},       {-0.0f, 0.0f, 0, 0}, {0.0f, -0.0f, 0, 0}, {1, 2, 2, 1},
      {qn, 5, 6, 7},      {5, qn, 6, sn},      {5, 6, sn, qn},      {-INFINITY, -INFINITY, -5, -5},
      {INFINITY, qn, 1, 1}, {-2, -1, -1, -2},  {3, 3, 3, 4},        {sn, sn, 1, 1},
      {-0.0f, -0.0f, -0.0f, -0.0f}, {7, 7, 8, 8}, {1, qn, qn, 9},   {0, 0, 0, -0.0f},
      {FLT_MAX, INFINITY, INFINITY, 1}};
  tt x = tt_new(FP32, 1, 2, 2, C, 0);
  tt yr = tt_new(FP32, 1, 1, 1, C, 0), yc = tt_new(FP32, 1, 1, 1, C, 0);
  tt mr = tt_new(BP_ABI_DTYPE_INT8, 1, 1, 1, C, 0), mc = tt_new(BP_ABI_DTYPE_INT8, 1, 1, 1, C, 0);
  for (int64_t c = 0; c < C; c++)
    for (int t = 0; t < 4; t++) *tt_f(&x, 0, t / 2, t % 2, c) = taps[c][t];
  bp_pool_attrs a = POOL_A(2, 2, 2, 2, 0, 0);
  const ops_call fr = {"maxpool.fwd", {&x}, {&yr, &mr}, 1, 2, &a, sizeof a};
  const ops_call fc = {"maxpool.fwd", {&x}, {&yc, &mc}, 1, 2, &a, sizeof a};
  k_run("reference", &fr);
  k_run("cpu", &fc);
  expect_same_slot(&yc, &yr, "maxpool.fwd y", 0, 0);
  expect_same_slot(&mc, &mr, "maxpool.fwd mask", 0, 0);
  /* what the reference defines: spot checks */
  static const int8_t want[17] = {0, 0, 0, 1, 0, 1, 2, 2, 1, 1, 3, 0, 0, 2, 1, 0, 1};
  for (int64_t c = 0; c < C; c++)
    ck_assert_msg(*tt_i8(&mc, 0, 0, 0, c) == want[c], "channel %lld: mask %d, expected %d",
                  (long long)c, *tt_i8(&mc, 0, 0, 0, c), want[c]);
  ck_assert_uint_eq(bits_of(*tt_f(&yc, 0, 0, 0, 1)), 0x80000000u); /* -0.0 first, kept */
  ck_assert_uint_eq(bits_of(*tt_f(&yc, 0, 0, 0, 6)), bits_of(sn));  /* sNaN bits kept */
  tt *all[] = {&x, &yr, &yc, &mr, &mc};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

/* A mask value that is not an in-bounds tap of its window: run() fails
 * before dx is touched, in a full window and in an edge window. */
START_TEST(maxpool_bwd_checks_the_mask) {
  tt dy = tt_new(FP32, 1, 2, 2, 5, 0), m = tt_new(BP_ABI_DTYPE_INT8, 1, 2, 2, 5, 0);
  tt dx = tt_new(FP32, 1, 3, 3, 5, 0), dx0 = tt_new(FP32, 1, 3, 3, 5, 0);
  uint64_t rng = 77;
  fill(&dx, &rng, 0);
  same_bytes(&dx0, &dx);
  const bp_abi_kernel *k = kernel_of("maxpool.bwd", "cpu");
  /* 2x2 windows, stride 1, no padding: every window full */
  bp_pool_attrs a = POOL_A(2, 2, 1, 1, 0, 0);
  const ops_call b = {"maxpool.bwd", {&dy, &m}, {&dx}, 2, 1, &a, sizeof a};
  static const int8_t bad_full[] = {4, -1, 127, -128};
  for (size_t i = 0; i < sizeof bad_full; i++) {
    *tt_i8(&m, 0, 1, 0, 3) = bad_full[i];
    ck_assert_int_eq(ops_kernel_run(k, &b, NULL, 0), BP_ABI_ERR_INVALID);
    ck_assert_int_eq(memcmp(dx.data, dx0.data, dx.d.slot_bytes), 0);
  }
  *tt_i8(&m, 0, 1, 0, 3) = 3;
  ck_assert_int_eq(ops_kernel_run(k, &b, NULL, 0), BP_ABI_OK);
  /* 2x2 windows, stride 2, padding 1 on a 3x3 input: window (0,0) has
   * only tap 3 in bounds, (0,1) taps 2 and 3, (1,0) taps 1 and 3, (1,1)
   * all four */
  same_bytes(&dx, &dx0);
  bp_pool_attrs p = POOL_A(2, 2, 2, 2, 1, 1);
  const ops_call bp = {"maxpool.bwd", {&dy, &m}, {&dx}, 2, 1, &p, sizeof p};
  memset(m.data, 3, 20); /* tap 3 (bottom right) is inside every window */
  ck_assert_int_eq(ops_kernel_run(k, &bp, NULL, 0), BP_ABI_OK);
  same_bytes(&dx, &dx0);
  *tt_i8(&m, 0, 0, 0, 4) = 0; /* the padding corner of window (0,0) */
  ck_assert_int_eq(ops_kernel_run(k, &bp, NULL, 0), BP_ABI_ERR_INVALID);
  *tt_i8(&m, 0, 0, 0, 4) = 3;
  *tt_i8(&m, 0, 0, 1, 2) = 1; /* window (0,1): row -1 is padding */
  ck_assert_int_eq(ops_kernel_run(k, &bp, NULL, 0), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(memcmp(dx.data, dx0.data, dx.d.slot_bytes), 0);
  tt_free(&dy), tt_free(&m), tt_free(&dx), tt_free(&dx0);
}
END_TEST

/* ---- batchnorm ------------------------------------------------------------ */

/* x shapes: C 1, 3, 16, 17, 64 and 130 (three blocks), batch 1 and 5, odd
 * H and W, padded channels, the CNN's feature maps (batch cut to 5; 4 and
 * 1 chunks of the statistics' order), more pixels than 32 chunks of 1024
 * (longer chunks, the last one shorter), and one whose x-shaped tensors
 * leave a gap after every image row (pixels not evenly strided). */
static const int64_t bn_shapes[][5] = {
    {1, 3, 5, 1, 0},  {5, 3, 3, 3, 0},  {2, 4, 4, 16, 0}, {5, 5, 7, 17, 3},
    {1, 7, 7, 64, 0}, {2, 3, 5, 130, 2}, {1, 1, 2, 5, 0}, {5, 28, 28, 32, 0},
    {5, 14, 14, 64, 0}, {41, 29, 31, 3, 1}, {3, 9, 11, 40, 1}};
#define BN_SHAPES ((int)(sizeof bn_shapes / sizeof bn_shapes[0]))
#define BN_ROW_GAP_SHAPE (BN_SHAPES - 1)

/* An x-shaped tensor of shape s; gap: 2 unused pixels after every row. */
static tt bn_x_tensor(const int64_t *s, int gap) {
  tt t = tt_new(FP32, s[0], s[1], s[2] + (gap ? 2 : 0), s[3], s[4]);
  t.d.shape[2] = s[2];
  return t;
}

/* Finite values: the mix without Infs and NaNs, scaled to stay finite
 * through the double sums (the reference's NaN handling is the plain
 * arithmetic, which the same operations reproduce anyway). */
static void bn_fill(tt *t, uint64_t *rng, double lo, double hi) {
  const int64_t n = tt_count(t);
  for (int64_t i = 0; i < n; i++) {
    const double u = tt_rand_unit(rng);
    float v = (float)(lo + (hi - lo) * tt_rand_unit(rng));
    if (u < 0.05) v = -0.0f;
    else if (u < 0.1) v = 0.0f;
    else if (u < 0.15) v = special(rng, 0) * 1e-3f;
    *tt_at(t, i) = v;
  }
}

START_TEST(batchnorm_matches_reference) {
  const int64_t *s = bn_shapes[_i];
  const int64_t C = s[3];
  uint64_t rng = 900u + (uint64_t)_i;
  const int gap = _i == BN_ROW_GAP_SHAPE;
  tt x = bn_x_tensor(s, gap), dy = bn_x_tensor(s, gap);
  tt yr = bn_x_tensor(s, gap), yc = bn_x_tensor(s, gap);
  tt dxr = bn_x_tensor(s, gap), dxc = bn_x_tensor(s, gap);
  /* the [1,1,1,C] tensors, some with padded channels; reference and cpu
   * sides in the same layout */
  tt g = tt_new(FP32, 1, 1, 1, C, 1), b = tt_new(FP32, 1, 1, 1, C, 0);
  tt rm0 = tt_new(FP32, 1, 1, 1, C, 0), rv0 = tt_new(FP32, 1, 1, 1, C, 2);
  tt smr = tt_new(FP32, 1, 1, 1, C, 1), smc = tt_new(FP32, 1, 1, 1, C, 1);
  tt sir = tt_new(FP32, 1, 1, 1, C, 0), sic = tt_new(FP32, 1, 1, 1, C, 0);
  tt rmr = tt_new(FP32, 1, 1, 1, C, 2), rmc = tt_new(FP32, 1, 1, 1, C, 2);
  tt rvr = tt_new(FP32, 1, 1, 1, C, 0), rvc = tt_new(FP32, 1, 1, 1, C, 0);
  tt dgr = tt_new(FP32, 1, 1, 1, C, 3), dgc = tt_new(FP32, 1, 1, 1, C, 3);
  tt dbr = tt_new(FP32, 1, 1, 1, C, 0), dbc = tt_new(FP32, 1, 1, 1, C, 0);
  tt *gamma = &g, *beta = &b;
  bn_fill(&x, &rng, -3, 5), bn_fill(&dy, &rng, -1, 1);
  bn_fill(gamma, &rng, 0.5, 2), bn_fill(beta, &rng, -1, 1);
  bn_fill(&rm0, &rng, -1, 1), bn_fill(&rv0, &rng, 0.5, 2);
  for (int64_t c = 0; c < C; c++) *tt_f(&rv0, 0, 0, 0, c) = fabsf(*tt_f(&rv0, 0, 0, 0, c));
  const float moms[] = {0.1f, 0.0f, 1.0f};
  for (int it = 0; it < 3; it++) {
    bp_batchnorm_attrs a = {it == 2 ? 1e-3f : 1e-5f, moms[it], 0};
    char mode[64];
    snprintf(mode, sizeof mode, "shape %d, momentum %g", _i, (double)a.momentum);
    /* training forward: y and the saved statistics prefilled with NaN;
     * the running statistics updated in place on the first round */
    fill_nan(&yr), same_bytes(&yc, &yr);
    fill_nan(&smr), fill_nan(&sir), same_bytes(&smc, &smr), same_bytes(&sic, &sir);
    tt_copy(&rmr, &rm0), tt_copy(&rvr, &rv0), tt_copy(&rmc, &rm0), tt_copy(&rvc, &rv0);
    const int inplace = it == 0;
    tt rmr_out = tt_new(FP32, 1, 1, 1, C, 0), rvr_out = tt_new(FP32, 1, 1, 1, C, 0);
    tt rmc_out = tt_new(FP32, 1, 1, 1, C, 0), rvc_out = tt_new(FP32, 1, 1, 1, C, 0);
    const ops_call tr = {"batchnorm.fwd_train", {&x, gamma, beta, &rmr, &rvr},
                         {&yr, &smr, &sir, inplace ? &rmr : &rmr_out, inplace ? &rvr : &rvr_out},
                         5, 5, &a, sizeof a};
    const ops_call tc = {"batchnorm.fwd_train", {&x, gamma, beta, &rmc, &rvc},
                         {&yc, &smc, &sic, inplace ? &rmc : &rmc_out, inplace ? &rvc : &rvc_out},
                         5, 5, &a, sizeof a};
    k_run("reference", &tr);
    k_run("cpu", &tc);
    expect_identical(&yc, &yr, "batchnorm.fwd_train y", C, 0, mode);
    expect_identical(&smc, &smr, "batchnorm.fwd_train save_mean", C, 0, mode);
    expect_identical(&sic, &sir, "batchnorm.fwd_train save_invstd", C, 0, mode);
    expect_identical(inplace ? &rmc : &rmc_out, inplace ? &rmr : &rmr_out, "running_mean", C, 0,
                     mode);
    expect_identical(inplace ? &rvc : &rvc_out, inplace ? &rvr : &rvr_out, "running_var", C, 0,
                     mode);
    tt_free(&rmr_out), tt_free(&rvr_out), tt_free(&rmc_out), tt_free(&rvc_out);

    /* evaluation forward with the initial running statistics */
    fill_nan(&yr), same_bytes(&yc, &yr);
    const ops_call er = {"batchnorm.fwd_eval", {&x, gamma, beta, &rm0, &rv0}, {&yr},
                         5, 1, &a, sizeof a};
    const ops_call ec = {"batchnorm.fwd_eval", {&x, gamma, beta, &rm0, &rv0}, {&yc},
                         5, 1, &a, sizeof a};
    k_run("reference", &er);
    k_run("cpu", &ec);
    expect_identical(&yc, &yr, "batchnorm.fwd_eval y", C, 0, mode);

    /* backward through the saved statistics, accumulate 0 and 1 */
    for (int acc = 0; acc <= 1; acc++) {
      a.accumulate = acc;
      if (acc) bn_fill(&dxr, &rng, -2, 2), bn_fill(&dgr, &rng, -2, 2), bn_fill(&dbr, &rng, -2, 2);
      else fill_nan(&dxr), fill_nan(&dgr), fill_nan(&dbr);
      same_bytes(&dxc, &dxr), same_bytes(&dgc, &dgr), same_bytes(&dbc, &dbr);
      const ops_call br = {"batchnorm.bwd", {&x, &dy, gamma, &smr, &sir}, {&dxr, &dgr, &dbr},
                           5, 3, &a, sizeof a};
      const ops_call bc = {"batchnorm.bwd", {&x, &dy, gamma, &smr, &sir}, {&dxc, &dgc, &dbc},
                           5, 3, &a, sizeof a};
      k_run("reference", &br);
      k_run("cpu", &bc);
      snprintf(mode, sizeof mode, "shape %d, momentum %g, accumulate %d", _i,
               (double)moms[it], acc);
      expect_identical(&dxc, &dxr, "batchnorm.bwd dx", C, 0, mode);
      expect_identical(&dgc, &dgr, "batchnorm.bwd dgamma", C, 0, mode);
      expect_identical(&dbc, &dbr, "batchnorm.bwd dbeta", C, 0, mode);
    }
  }
  tt *all[] = {&x,   &dy,  &yr,  &yc,  &dxr, &dxc, &g,   &b,   &rm0, &rv0, &smr, &smc,
               &sir, &sic, &rmr, &rmc, &rvr, &rvc, &dgr, &dgc, &dbr, &dbc};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

/* The statistics' sums follow the chunk order of batchnorm_steps.h in both
 * modules. M = 2048 pixels of one channel are two chunks of 1024; x is 0
 * at pixel 0 (the shift K), 2^53 at pixel 1, then 1, 1 and -2^53 at
 * pixels 1024 to 1026, 0 elsewhere. The chunk sums are 2^53 and 2 - 2^53
 * (both exact), whose sum is 2: the mean is 2/2048. One running sum over
 * the pixels would lose each 1 against 2^53 (a tie, to even) and give 0.
 * The backward sums dy the same way (dbeta 2, not 0). */
START_TEST(batchnorm_sums_in_chunk_order) {
  const float big = 9007199254740992.0f; /* 2^53 */
  tt x = tt_new(FP32, 2, 32, 32, 1, 0), y = tt_new(FP32, 2, 32, 32, 1, 0);
  tt dx = tt_new(FP32, 2, 32, 32, 1, 0), c[8];
  for (int i = 0; i < 8; i++) c[i] = tt_new(FP32, 1, 1, 1, 1, 0);
  *tt_at(&c[0], 0) = 1.0f, *tt_at(&c[3], 0) = 1.0f; /* gamma, running_var */
  *tt_at(&x, 1) = big, *tt_at(&x, 1024) = 1.0f, *tt_at(&x, 1025) = 1.0f;
  *tt_at(&x, 1026) = -big;
  bp_batchnorm_attrs a = {1e-5f, 0.1f, 0};
  /* in: x, gamma, beta, running mean, var; out: y, save_mean, save_invstd,
   * running mean, var (in place) */
  const ops_call t = {"batchnorm.fwd_train", {&x, &c[0], &c[1], &c[2], &c[3]},
                      {&y, &c[4], &c[5], &c[2], &c[3]}, 5, 5, &a, sizeof a};
  /* in: x, dy (x again), gamma, save_mean, save_invstd; out: dx, dgamma, dbeta */
  const ops_call b = {"batchnorm.bwd", {&x, &x, &c[0], &c[4], &c[5]}, {&dx, &c[6], &c[7]}, 5, 3,
                      &a, sizeof a};
  static const char *const impls[] = {"reference", "cpu"};
  for (int i = 0; i < 2; i++) {
    k_run(impls[i], &t);
    ck_assert_msg(*tt_at(&c[4], 0) == 2.0f / 2048.0f, "%s: save_mean %g, want 2/2048", impls[i],
                  (double)*tt_at(&c[4], 0));
    k_run(impls[i], &b);
    ck_assert_msg(*tt_at(&c[7], 0) == 2.0f, "%s: dbeta %g, want 2", impls[i],
                  (double)*tt_at(&c[7], 0));
  }
  tt_free(&x), tt_free(&y), tt_free(&dx);
  for (int i = 0; i < 8; i++) tt_free(&c[i]);
}
END_TEST

/* ---- refusals ------------------------------------------------------------- */

/* The cpu kernel refuses with a reason containing `needle`; run() says
 * BP_ABI_ERR_INVALID; the reference kernel accepts and serves it. */
static void expect_cpu_refuses_layout(const ops_call *c, const char *needle) {
  const bp_abi_kernel *k = kernel_of(c->op, "cpu");
  char reason[256];
  ck_assert_msg(ops_kernel_supports(k, c, reason, sizeof reason) == 0, "%s accepted, expected refusal",
                c->op);
  ck_assert_msg(strstr(reason, needle) != NULL, "%s: reason '%s' lacks '%s'", c->op, reason,
                needle);
  ck_assert_int_eq(ops_kernel_run(k, c, NULL, 0), BP_ABI_ERR_INVALID);
  k_run("reference", c);
}

START_TEST(relu_refuses_layouts_that_are_not_one_run) {
  /* padded channels: the reference skips the padding, the flat loop cannot */
  tt x = tt_new(FP32, 2, 3, 3, 5, 3), y = tt_new(FP32, 2, 3, 3, 5, 3);
  tt xd = tt_new(FP32, 2, 3, 3, 5, 0), yd = tt_new(FP32, 2, 3, 3, 5, 0);
  tt dy = tt_new(FP32, 2, 3, 3, 5, 0);
  uint64_t rng = 3;
  tt_rand(&x, &rng, -1, 1), tt_rand(&xd, &rng, -1, 1), tt_rand(&dy, &rng, -1, 1);
  const ops_call f = {"relu.fwd", {&x}, {&y}, 1, 1, &overwrite, sizeof overwrite};
  expect_cpu_refuses_layout(&f, "input 0: elements are not one dense run");
  /* one padded tensor among dense ones is enough */
  const ops_call f2 = {"relu.fwd", {&xd}, {&y}, 1, 1, &overwrite, sizeof overwrite};
  expect_cpu_refuses_layout(&f2, "output 0: elements are not one dense run");
  const ops_call b = {"relu.bwd", {&yd, &dy}, {&x}, 2, 1, &accumulate, sizeof accumulate};
  expect_cpu_refuses_layout(&b, "output 0: elements are not one dense run");
  const ops_call b2 = {"relu.bwd", {&yd, &y}, {&xd}, 2, 1, &overwrite, sizeof overwrite};
  expect_cpu_refuses_layout(&b2, "input 1: elements are not one dense run");
  /* a gap between images, channels compact */
  tt g = tt_new(FP32, 3, 2, 2, 4, 0), gy = tt_new(FP32, 2, 2, 2, 4, 0);
  g.d.shape[0] = 2;
  g.d.stride[0] += 4;
  const ops_call f3 = {"relu.fwd", {&g}, {&gy}, 1, 1, &overwrite, sizeof overwrite};
  expect_cpu_refuses_layout(&f3, "the reference kernel serves it");
  /* padding is fine where it is not crossed: [1,1,1,C] with padded_c > C */
  tt p = tt_new(FP32, 1, 1, 1, 6, 2), py = tt_new(FP32, 1, 1, 1, 6, 0);
  const ops_call f4 = {"relu.fwd", {&p}, {&py}, 1, 1, &overwrite, sizeof overwrite};
  char reason[256];
  ck_assert_int_eq(ops_kernel_supports(kernel_of("relu.fwd", "cpu"), &f4, reason, sizeof reason), 1);
  tt *all[] = {&x, &y, &xd, &yd, &dy, &g, &gy, &p, &py};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

/* A layout the channel loops of maxpool and batchnorm do not take: refused
 * with a reason, and the reference serves it. One channel with any stride
 * is accepted. */
START_TEST(pool_and_batchnorm_refuse_strided_channels) {
  bp_pool_attrs a = POOL_A(2, 2, 2, 2, 0, 0);
  /* [.,.,.,3] views with channel stride 2 of [.,.,.,6] tensors */
  tt xs = tt_new(FP32, 1, 4, 4, 6, 0), ys = tt_new(FP32, 1, 2, 2, 6, 0);
  tt ms = tt_new(BP_ABI_DTYPE_INT8, 1, 2, 2, 6, 0);
  tt *strided[] = {&xs, &ys, &ms};
  for (int i = 0; i < 3; i++) strided[i]->d.shape[3] = 3, strided[i]->d.stride[3] = 2;
  tt x = tt_new(FP32, 1, 4, 4, 3, 0), y = tt_new(FP32, 1, 2, 2, 3, 0);
  tt m = tt_new(BP_ABI_DTYPE_INT8, 1, 2, 2, 3, 0);
  ops_call f = {"maxpool.fwd", {&xs}, {&y, &m}, 1, 2, &a, sizeof a};
  expect_cpu_refuses_layout(&f, "x: channels are not contiguous");
  f.in[0] = &x, f.out[0] = &ys;
  expect_cpu_refuses_layout(&f, "y: channels are not contiguous");
  f.out[0] = &y, f.out[1] = &ms;
  expect_cpu_refuses_layout(&f, "mask: channels are not contiguous");
  ops_call b = {"maxpool.bwd", {&ys, &m}, {&x}, 2, 1, &a, sizeof a};
  expect_cpu_refuses_layout(&b, "dy: channels are not contiguous");
  b.in[0] = &y, b.out[0] = &xs;
  expect_cpu_refuses_layout(&b, "dx: channels are not contiguous");
  /* one channel: its stride does not matter */
  tt x1 = tt_new(FP32, 1, 4, 4, 2, 0), y1r = tt_new(FP32, 1, 2, 2, 1, 0);
  tt y1c = tt_new(FP32, 1, 2, 2, 1, 0), m1r = tt_new(BP_ABI_DTYPE_INT8, 1, 2, 2, 1, 0);
  tt m1c = tt_new(BP_ABI_DTYPE_INT8, 1, 2, 2, 1, 0);
  x1.d.shape[3] = 1, x1.d.stride[3] = 5;
  uint64_t rng = 8;
  pool_fill_x(&x1, &rng);
  const ops_call f1r = {"maxpool.fwd", {&x1}, {&y1r, &m1r}, 1, 2, &a, sizeof a};
  const ops_call f1c = {"maxpool.fwd", {&x1}, {&y1c, &m1c}, 1, 2, &a, sizeof a};
  k_run("reference", &f1r);
  k_run("cpu", &f1c);
  expect_same_slot(&y1c, &y1r, "maxpool.fwd y, one channel", 0, 0);
  expect_same_slot(&m1c, &m1r, "maxpool.fwd mask, one channel", 0, 0);
  /* batchnorm: y, dy and dx with channel stride 2 */
  tt c6[7];
  for (int i = 0; i < 7; i++) c6[i] = tt_new(FP32, 1, 1, 1, 3, 0);
  tt bx = tt_new(FP32, 1, 2, 2, 3, 0), bs = tt_new(FP32, 1, 2, 2, 6, 0);
  tt by = tt_new(FP32, 1, 2, 2, 3, 0);
  bs.d.shape[3] = 3, bs.d.stride[3] = 2;
  for (int i = 0; i < 7; i++) *tt_f(&c6[i], 0, 0, 0, 0) = 1.0f;
  const bp_batchnorm_attrs bn = {1e-5f, 0.1f, 0};
  ops_call ev = {"batchnorm.fwd_eval", {&bx, &c6[0], &c6[1], &c6[2], &c6[3]}, {&bs}, 5, 1, &bn,
                 sizeof bn};
  expect_cpu_refuses_layout(&ev, "y: channels are not contiguous");
  ops_call bb = {"batchnorm.bwd", {&bx, &bs, &c6[0], &c6[2], &c6[3]}, {&by, &c6[4], &c6[5]},
                 5, 3, &bn, sizeof bn};
  expect_cpu_refuses_layout(&bb, "dy: channels are not contiguous");
  bb.in[1] = &by, bb.out[0] = &bs;
  expect_cpu_refuses_layout(&bb, "dx: channels are not contiguous");
  for (int i = 0; i < 7; i++) tt_free(&c6[i]);
  tt_free(&bx), tt_free(&bs), tt_free(&by);
  tt *all[] = {&xs, &ys, &ms, &x, &y, &m, &x1, &y1r, &y1c, &m1r, &m1c};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

/* Both kernels refuse with the very same reason. */
static void expect_same_refusal(const ops_call *c, const char *needle) {
  char rr[256], rc[256];
  ck_assert_msg(ops_kernel_supports(kernel_of(c->op, "reference"), c, rr, sizeof rr) == 0,
                "%s: the reference accepted (%s)", c->op, needle);
  ck_assert_msg(ops_kernel_supports(kernel_of(c->op, "cpu"), c, rc, sizeof rc) == 0,
                "%s: cpu accepted (%s)", c->op, needle);
  ck_assert_str_eq(rc, rr);
  ck_assert_msg(strstr(rc, needle) != NULL, "%s: reason '%s' lacks '%s'", c->op, rc, needle);
  ck_assert_int_eq(ops_kernel_run(kernel_of(c->op, "cpu"), c, NULL, 0), BP_ABI_ERR_INVALID);
}

START_TEST(bad_args_get_the_reference_reasons) {
  tt g = tt_new(FP32, 1, 1, 1, 10, 0), w = tt_new(FP32, 1, 1, 1, 10, 0);
  tt m = tt_new(FP32, 1, 1, 1, 10, 0), v = tt_new(FP32, 1, 1, 1, 10, 0);
  tt short_m = tt_new(FP32, 1, 1, 1, 9, 0), square = tt_new(FP32, 1, 1, 2, 5, 0);
  tt gi = tt_new(BP_ABI_DTYPE_INT32, 1, 1, 1, 10, 0);
  tt lr = scalar(0.1f), step = scalar(1.0f);
  bp_optimizer_attrs a;
  memset(&a, 0, sizeof a);
  a.momentum = 0.9f, a.beta1 = 0.9f, a.beta2 = 0.999f, a.eps = 1e-8f;
  bp_optimizer_attrs bad = a;
  ops_call sgd = {"range.sgd", {&g, &lr}, {&w, &m}, 2, 2, &bad, sizeof bad};
  char reason[256];
  ck_assert_int_eq(ops_kernel_supports(kernel_of("range.sgd", "cpu"), &sgd, reason, sizeof reason), 1);
  bad.momentum = 0.0f, bad.nesterov = 1;
  expect_same_refusal(&sgd, "nesterov needs momentum > 0");
  bad = a, bad.weight_decay = -1.0f;
  expect_same_refusal(&sgd, "weight_decay");
  bad = a, bad.nesterov = 2;
  expect_same_refusal(&sgd, "nesterov");
  bad = a, sgd.attr_size = 4;
  expect_same_refusal(&sgd, "attribute block");
  sgd.attr_size = sizeof bad;
  sgd.out[1] = &short_m;
  expect_same_refusal(&sgd, "must be equal");
  sgd.out[1] = &square;
  expect_same_refusal(&sgd, "a span is [1,1,1,elements]");
  sgd.out[1] = &m, sgd.in[0] = &gi;
  expect_same_refusal(&sgd, "grad");
  sgd.in[0] = &g, sgd.nin = 1;
  expect_same_refusal(&sgd, "input");

  bad = a;
  ops_call adamw = {"range.adamw", {&g, &lr, &step}, {&w, &m, &v}, 3, 3, &bad, sizeof bad};
  ck_assert_int_eq(ops_kernel_supports(kernel_of("range.adamw", "cpu"), &adamw, reason, sizeof reason),
                   1);
  bad.eps = 0.0f;
  expect_same_refusal(&adamw, "eps");
  bad = a, bad.beta1 = 1.0f;
  expect_same_refusal(&adamw, "beta1");
  bad = a, adamw.in[2] = &g;
  expect_same_refusal(&adamw, "step");

  tt x = tt_new(FP32, 2, 3, 4, 5, 0), y = tt_new(FP32, 2, 3, 4, 5, 0);
  tt y2 = tt_new(FP32, 2, 3, 5, 4, 0);
  const bp_elementwise_attrs acc2 = {2};
  ops_call relu = {"relu.fwd", {&x}, {&y}, 1, 1, &acc2, sizeof acc2};
  expect_same_refusal(&relu, "accumulate");
  relu.attrs = &overwrite, relu.out[0] = &y2;
  expect_same_refusal(&relu, "shape");
  relu.out[0] = &y, relu.attrs = NULL;
  expect_same_refusal(&relu, "attribute block");
  ops_call relub = {"relu.bwd", {&x, &y}, {&y2}, 2, 1, &overwrite, sizeof overwrite};
  expect_same_refusal(&relub, "shape");
  relub.nin = 1;
  expect_same_refusal(&relub, "input");

  tt px = tt_new(FP32, 1, 6, 6, 4, 0), py = tt_new(FP32, 1, 3, 3, 4, 0);
  tt pm = tt_new(BP_ABI_DTYPE_INT8, 1, 3, 3, 4, 0);
  bp_pool_attrs pa = POOL_A(2, 2, 2, 2, 0, 0);
  ops_call pool = {"maxpool.fwd", {&px}, {&py, &pm}, 1, 2, &pa, sizeof pa};
  ck_assert_int_eq(ops_kernel_supports(kernel_of("maxpool.fwd", "cpu"), &pool, reason, sizeof reason),
                   1);
  pa.pad_h = 2;
  expect_same_refusal(&pool, "padding");
  pa = (bp_pool_attrs)POOL_A(12, 12, 2, 2, 0, 0);
  expect_same_refusal(&pool, "the mask is int8");
  pa = (bp_pool_attrs)POOL_A(2, 2, 2, 2, 0, 0);
  pool.out[1] = &py;
  expect_same_refusal(&pool, "mask: dtype");
  pool.out[1] = &pm, pool.out[0] = &y2;
  expect_same_refusal(&pool, "shape");
  ops_call poolb = {"maxpool.bwd", {&py, &pm}, {&px}, 2, 1, &pa, sizeof pa};
  pa.accumulate = 2;
  expect_same_refusal(&poolb, "accumulate");
  pa.accumulate = 0, poolb.nin = 1;
  expect_same_refusal(&poolb, "input");

  tt *all[] = {&g, &w, &m, &v, &short_m, &square, &gi, &lr, &step, &x, &y, &y2, &px, &py, &pm};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

START_TEST(run_checks_scalars_and_pointers) {
  tt g = tt_new(FP32, 1, 1, 1, 40, 0), w = tt_new(FP32, 1, 1, 1, 40, 0);
  tt m = tt_new(FP32, 1, 1, 1, 40, 0), v = tt_new(FP32, 1, 1, 1, 40, 0);
  tt lr = scalar(NAN), step = scalar(1.0f);
  uint64_t rng = 9;
  fill(&g, &rng, 0), fill(&w, &rng, 0), fill(&m, &rng, 0);
  tt w0 = tt_new(FP32, 1, 1, 1, 40, 0), m0 = tt_new(FP32, 1, 1, 1, 40, 0);
  same_bytes(&w0, &w), same_bytes(&m0, &m);
  bp_optimizer_attrs a;
  memset(&a, 0, sizeof a);
  a.momentum = 0.9f, a.beta1 = 0.9f, a.beta2 = 0.999f, a.eps = 1e-8f;
  const bp_abi_kernel *sgd = kernel_of("range.sgd", "cpu");
  const bp_abi_kernel *adamw = kernel_of("range.adamw", "cpu");
  ops_call c = {"range.sgd", {&g, &lr}, {&w, &m}, 2, 2, &a, sizeof a};
  /* a NaN or infinite lr: refused at run time, nothing written */
  ck_assert_int_eq(ops_kernel_run(sgd, &c, NULL, 0), BP_ABI_ERR_INVALID);
  fp(&lr)[0] = INFINITY;
  ck_assert_int_eq(ops_kernel_run(sgd, &c, NULL, 0), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(memcmp(w.data, w0.data, w.d.slot_bytes), 0);
  ck_assert_int_eq(memcmp(m.data, m0.data, m.d.slot_bytes), 0);
  fp(&lr)[0] = 0.1f;
  ops_call ca = {"range.adamw", {&g, &lr, &step}, {&w, &m, &v}, 3, 3, &a, sizeof a};
  fp(&step)[0] = 0.0f; /* steps count from 1 */
  ck_assert_int_eq(ops_kernel_run(adamw, &ca, NULL, 0), BP_ABI_ERR_INVALID);
  fp(&step)[0] = NAN;
  ck_assert_int_eq(ops_kernel_run(adamw, &ca, NULL, 0), BP_ABI_ERR_INVALID);
  ck_assert_int_eq(memcmp(w.data, w0.data, w.d.slot_bytes), 0);
  fp(&step)[0] = 1.0f;
  ck_assert_int_eq(ops_kernel_run(adamw, &ca, NULL, 0), BP_ABI_OK);
  /* pointers: w overlapping m, grad being w, misaligned, missing. Views
   * of 30 elements into m's buffer: lo at element 0, hi at element 3. */
  tt lo = m, hi = m;
  lo.d.shape[3] = hi.d.shape[3] = 30;
  lo.d.padded_c = hi.d.padded_c = 30;
  lo.d.stride[0] = lo.d.stride[1] = lo.d.stride[2] = 30;
  hi.d.stride[0] = hi.d.stride[1] = hi.d.stride[2] = 30;
  hi.data = fp(&m) + 3;
  hi.d.slot_bytes -= 12;
  tt g30 = tt_new(FP32, 1, 1, 1, 30, 0), m30 = tt_new(FP32, 1, 1, 1, 30, 0);
  ops_call co = {"range.sgd", {&g30, &lr}, {&hi, &m30}, 2, 2, &a, sizeof a};
  ck_assert_int_eq(ops_kernel_run(sgd, &co, NULL, 0), BP_ABI_OK); /* apart: fine */
  co.out[1] = &lo; /* w and m overlap */
  ck_assert_int_eq(ops_kernel_run(sgd, &co, NULL, 0), BP_ABI_ERR_INVALID);
  co.out[1] = &m30, co.in[0] = &hi; /* grad is w */
  ck_assert_int_eq(ops_kernel_run(sgd, &co, NULL, 0), BP_ABI_ERR_INVALID);
  co.in[0] = &g30;
  tt mis = g30;
  mis.data = (char *)g30.data + 2;
  co.in[0] = &mis;
  ck_assert_int_eq(ops_kernel_run(sgd, &co, NULL, 0), BP_ABI_ERR_INVALID);
  mis.data = NULL;
  ck_assert_int_eq(ops_kernel_run(sgd, &co, NULL, 0), BP_ABI_ERR_INVALID);
  /* relu: a partial overlap of y with x */
  tt x = tt_new(FP32, 1, 1, 1, 8, 0);
  tt y = x;
  y.data = fp(&x) + 1;
  y.d.slot_bytes -= 4;
  const ops_call f = {"relu.fwd", {&x}, {&y}, 1, 1, &overwrite, sizeof overwrite};
  ck_assert_int_eq(ops_kernel_run(kernel_of("relu.fwd", "cpu"), &f, NULL, 0), BP_ABI_ERR_INVALID);
  /* relu.bwd: dx may be dy, never y */
  tt dy = tt_new(FP32, 1, 1, 1, 8, 0);
  const ops_call b = {"relu.bwd", {&x, &dy}, {&x}, 2, 1, &overwrite, sizeof overwrite};
  ck_assert_int_eq(ops_kernel_run(kernel_of("relu.bwd", "cpu"), &b, NULL, 0), BP_ABI_ERR_INVALID);
  tt *all[] = {&g, &w, &m, &v, &lr, &step, &w0, &m0, &g30, &m30, &x, &dy};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tt_free(all[i]);
}
END_TEST

/* ---- descriptors, instruction set, selection ------------------------------ */

static const char *const cpu_ops[] = {"range.sgd",           "range.adamw",        "relu.fwd",
                                      "relu.bwd",            "maxpool.fwd",        "maxpool.bwd",
                                      "batchnorm.fwd_train", "batchnorm.fwd_eval", "batchnorm.bwd"};
#define CPU_OPS ((int)(sizeof cpu_ops / sizeof cpu_ops[0]))

START_TEST(descriptors) {
  for (int i = 0; i < CPU_OPS; i++) {
    const bp_abi_kernel *k = kernel_of(cpu_ops[i], "cpu");
    const bp_abi_kernel *r = kernel_of(cpu_ops[i], "reference");
    ck_assert_str_eq(k->device, "cpu");
    ck_assert_int_eq(k->priority, 5);
    ck_assert_uint_eq(k->dtypes, r->dtypes); /* FP32, plus INT8 for the maxpool mask */
    ck_assert(k->dtypes & BP_ABI_DTYPE_BIT(BP_ABI_DTYPE_FP32));
    ck_assert(k->flags & BP_ABI_KERNEL_DETERMINISTIC);
    ck_assert(!(k->flags & BP_ABI_KERNEL_REFERENCE));
    ck_assert_uint_eq(k->flags & BP_ABI_KERNEL_IN_PLACE, r->flags & BP_ABI_KERNEL_IN_PLACE);
    ck_assert_ptr_nonnull(k->supports);
    ck_assert_ptr_nonnull(k->run);
    const bp_registered_kernel *d = bp_registry_default_kernel(both_modules(), cpu_ops[i], "cpu");
    ck_assert_ptr_nonnull(d);
    ck_assert_str_eq(d->kernel.impl, "cpu");
  }
  ck_assert(kernel_of("relu.fwd", "cpu")->flags & BP_ABI_KERNEL_IN_PLACE);
  /* the module is recorded as loaded, with a build id */
  const bp_registry *r = both_modules();
  int found = 0;
  for (int i = 0; i < bp_registry_record_count(r); i++) {
    const bp_load_record *rec = bp_registry_record(r, i);
    if (strcmp(rec->name, "ops-cpu") != 0) continue;
    found = 1;
    ck_assert_int_eq(rec->outcome, BP_LOAD_LOADED);
    ck_assert_int_eq((int)strlen(rec->build_id), 16);
  }
  ck_assert(found);
}
END_TEST

/* The set the module says it runs: the best the machine has, lowered by
 * BP_CPU_ISA (CTest runs this suite with avx2 and default too). */
START_TEST(instruction_set_follows_bp_cpu_isa) {
  both_modules();
  int best = 0;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  best = __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0;
#endif
  static const char *const names[] = {"default", "avx2", "avx512f"};
  int want = best;
  const char *env = getenv("BP_CPU_ISA");
  for (int i = 0; env && i < 3; i++)
    if (strcmp(env, names[i]) == 0 && i < best) want = i;
  char line[64];
  snprintf(line, sizeof line, "ops-cpu: %s loops", names[want]);
  ck_assert_msg(strstr(load_log, line) != NULL, "expected '%s' in the load log:\n%s", line,
                load_log);
  printf("test_ops_cpu: BP_CPU_ISA=%s: %s\n", env ? env : "(unset)", line);
}
END_TEST

/* The args of one small dense node of `op` (no pointers); padded: x or y
 * with padded channels. */
typedef struct node {
  tt t[9];
  int nt;
  ops_call call;
  bp_optimizer_attrs oa;
} node;

static const bp_pool_attrs pool2x2 = POOL_A(2, 2, 2, 2, 0, 0);

static void node_make(node *nd, const char *op, int padded) {
  memset(nd, 0, sizeof *nd);
  nd->oa.momentum = 0.9f, nd->oa.beta1 = 0.9f, nd->oa.beta2 = 0.999f, nd->oa.eps = 1e-8f;
  nd->call.op = op;
  if (strncmp(op, "maxpool.", 8) == 0) {
    /* x (dx) [2,8,8,6] with padded channels, y (dy) and mask [2,4,4,6];
     * `padded` makes x's channel stride 2 instead (a view of 12 channels) */
    nd->t[0] = tt_new(FP32, 2, 8, 8, padded ? 12 : 6, padded ? 0 : 2);
    if (padded) nd->t[0].d.shape[3] = 6, nd->t[0].d.stride[3] = 2;
    nd->t[1] = tt_new(FP32, 2, 4, 4, 6, 0);
    nd->t[2] = tt_new(BP_ABI_DTYPE_INT8, 2, 4, 4, 6, 0);
    nd->nt = 3;
    if (strcmp(op, "maxpool.fwd") == 0) {
      nd->call.in[0] = &nd->t[0], nd->call.out[0] = &nd->t[1], nd->call.out[1] = &nd->t[2];
      nd->call.nin = 1, nd->call.nout = 2;
    } else {
      nd->call.in[0] = &nd->t[1], nd->call.in[1] = &nd->t[2], nd->call.out[0] = &nd->t[0];
      nd->call.nin = 2, nd->call.nout = 1;
    }
    nd->call.attrs = &pool2x2, nd->call.attr_size = sizeof pool2x2;
  } else if (strncmp(op, "batchnorm.", 10) == 0) {
    /* t0 x, t1 dy, t2 y or dx [2,4,4,6] (`padded`: x's channel stride 2);
     * t3..t6 the [1,1,1,6] inputs, t7 and t8 the other [1,1,1,6] outputs
     * (fwd_train updates the running statistics t5 and t6 in place) */
    nd->t[0] = tt_new(FP32, 2, 4, 4, padded ? 12 : 6, 0);
    if (padded) nd->t[0].d.shape[3] = 6, nd->t[0].d.stride[3] = 2;
    nd->t[1] = tt_new(FP32, 2, 4, 4, 6, 1), nd->t[2] = tt_new(FP32, 2, 4, 4, 6, 0);
    for (int i = 3; i < 9; i++) nd->t[i] = tt_new(FP32, 1, 1, 1, 6, 0);
    nd->nt = 9;
    static const bp_batchnorm_attrs bn = {1e-5f, 0.1f, 0};
    nd->call.attrs = &bn, nd->call.attr_size = sizeof bn;
    nd->call.nin = 5;
    for (int i = 0; i < 5; i++) nd->call.in[i] = &nd->t[i == 0 ? 0 : 2 + i];
    nd->call.out[0] = &nd->t[2];
    if (strcmp(op, "batchnorm.bwd") == 0) {
      nd->call.in[1] = &nd->t[1];
      nd->call.out[1] = &nd->t[7], nd->call.out[2] = &nd->t[8];
      nd->call.nout = 3;
    } else if (strcmp(op, "batchnorm.fwd_train") == 0) {
      nd->call.out[1] = &nd->t[7], nd->call.out[2] = &nd->t[8];
      nd->call.out[3] = &nd->t[5], nd->call.out[4] = &nd->t[6];
      nd->call.nout = 5;
    } else {
      nd->call.nout = 1;
    }
  } else if (strncmp(op, "relu.", 5) == 0) {
    const int bwd = strcmp(op, "relu.bwd") == 0;
    for (int i = 0; i < 3; i++) nd->t[i] = tt_new(FP32, 2, 4, 4, 6, padded && i == 0 ? 2 : 0);
    nd->nt = 3;
    nd->call.in[0] = &nd->t[0];
    nd->call.in[1] = &nd->t[1];
    nd->call.out[0] = &nd->t[2];
    nd->call.nin = bwd ? 2 : 1, nd->call.nout = 1;
    nd->call.attrs = &overwrite, nd->call.attr_size = sizeof overwrite;
  } else {
    const int adamw = strcmp(op, "range.adamw") == 0;
    for (int i = 0; i < 4; i++) nd->t[i] = tt_new(FP32, 1, 1, 1, 4096, 0);
    nd->t[4] = scalar(0.1f);
    nd->nt = 5;
    nd->call.in[0] = &nd->t[0], nd->call.in[1] = &nd->t[4], nd->call.in[2] = &nd->t[4];
    nd->call.out[0] = &nd->t[1], nd->call.out[1] = &nd->t[2], nd->call.out[2] = &nd->t[3];
    nd->call.nin = nd->call.nout = adamw ? 3 : 2;
    nd->call.attrs = &nd->oa, nd->call.attr_size = sizeof nd->oa;
  }
}

static void node_free(node *nd) {
  for (int i = 0; i < nd->nt; i++) tt_free(&nd->t[i]);
}

/* The impl bp_registry_select picks (pins NULL: the registry's, none here). */
static const char *selected(const char *op, const char *pins, int padded, char *report,
                            size_t report_size) {
  both_modules();
  node nd;
  node_make(&nd, op, padded);
  const char *impl = ops_selected_impl(&nd.call, pins, report, report_size);
  node_free(&nd);
  return impl;
}

START_TEST(select_prefers_cpu_and_pins_override) {
  for (int i = 0; i < CPU_OPS; i++) ck_assert_str_eq(selected(cpu_ops[i], NULL, 0, NULL, 0), "cpu");
  static const char *const relu_ref = "relu.*=reference";
  ck_assert_str_eq(selected("relu.fwd", relu_ref, 0, NULL, 0), "reference");
  ck_assert_str_eq(selected("relu.bwd", relu_ref, 0, NULL, 0), "reference");
  ck_assert_str_eq(selected("range.sgd", relu_ref, 0, NULL, 0), "cpu");
  ck_assert_str_eq(selected("range.adamw", "range.*@cpu=reference", 0, NULL, 0), "reference");
  /* a node the cpu kernel refuses goes to the reference, and the report
   * says why */
  char report[2048] = "";
  ck_assert_str_eq(selected("relu.fwd", NULL, 1, report, sizeof report), "reference");
  ck_assert_msg(strstr(report, "not one dense run") != NULL, "report: %s", report);
  report[0] = '\0';
  ck_assert_str_eq(selected("relu.bwd", NULL, 1, report, sizeof report), "reference");
  ck_assert_msg(strstr(report, "not one dense run") != NULL, "report: %s", report);
  for (int bwd = 0; bwd <= 1; bwd++) {
    report[0] = '\0';
    const char *op = bwd ? "maxpool.bwd" : "maxpool.fwd";
    ck_assert_str_eq(selected(op, NULL, 1, report, sizeof report), "reference");
    ck_assert_msg(strstr(report, "channels are not contiguous") != NULL, "report: %s", report);
  }
  for (int i = 6; i < CPU_OPS; i++) { /* batchnorm */
    report[0] = '\0';
    ck_assert_str_eq(selected(cpu_ops[i], NULL, 1, report, sizeof report), "reference");
    ck_assert_msg(strstr(report, "x: channels are not contiguous") != NULL, "report: %s", report);
  }
  ck_assert_str_eq(selected("maxpool.fwd", "maxpool.*=reference", 0, NULL, 0), "reference");
}
END_TEST

int main(void) {
  Suite *s = suite_create("ops_cpu");
  TCase *tc = tcase_create("cpu");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, sgd_matches_reference, 0, SIZES);
  tcase_add_loop_test(tc, adamw_matches_reference, 0, SIZES);
  tcase_add_loop_test(tc, relu_matches_reference, 0, SIZES);
  tcase_add_test(tc, relu_dense_shapes_match_reference);
  tcase_add_loop_test(tc, maxpool_matches_reference, 0, POOL_CASES);
  tcase_add_test(tc, maxpool_ties_and_nans_by_hand);
  tcase_add_test(tc, maxpool_bwd_checks_the_mask);
  tcase_add_loop_test(tc, batchnorm_matches_reference, 0, BN_SHAPES);
  tcase_add_test(tc, batchnorm_sums_in_chunk_order);
  tcase_add_test(tc, relu_refuses_layouts_that_are_not_one_run);
  tcase_add_test(tc, pool_and_batchnorm_refuse_strided_channels);
  tcase_add_test(tc, bad_args_get_the_reference_reasons);
  tcase_add_test(tc, run_checks_scalars_and_pointers);
  tcase_add_test(tc, descriptors);
  tcase_add_test(tc, instruction_set_follows_bp_cpu_isa);
  tcase_add_test(tc, select_prefers_cpu_and_pins_override);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
