/* Compiling models into plans: totals computed by hand, variants that differ
 * in batch and resolution, the regions each option switches on, the arena
 * tiling, and every shape or size error with its file, layer and variant. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/model.h"
#include "blueprint/model_yaml.h"

/* ---- helpers ---------------------------------------------------------- */

static void model_path(const char *file, char *out, size_t size) {
  const char *src = getenv("BP_SOURCE_DIR");
  ck_assert_msg(src != NULL, "BP_SOURCE_DIR is not set (run through CTest)");
  snprintf(out, size, "%s/models/%s", src, file);
}

static bp_model *load_shipped(const char *file) {
  char path[4096];
  model_path(file, path, sizeof path);
  bp_model *m = NULL;
  ck_assert_msg(bp_model_load(path, &m) == BP_OK, "%s", bp_last_error());
  return m;
}

static bp_model *parse(const char *text) {
  bp_model *m = NULL;
  ck_assert_msg(bp_model_parse(text, strlen(text), "x.yaml", &m) == BP_OK, "%s", bp_last_error());
  return m;
}

static bp_plan *compile_ok(const bp_model *m, const bp_compile_options *o) {
  bp_plan *p = NULL;
  bp_status st = bp_model_compile(m, o, &p);
  ck_assert_msg(st == BP_OK, "%s: %s", bp_status_str(st), bp_last_error());
  ck_assert_ptr_nonnull(p);
  return p;
}

/* Compiling fails with `want`, writes no plan, and the one-line message
 * contains every needle. */
static void expect_refused_(const bp_model *m, const bp_compile_options *o, bp_status want,
                            const char *const *needles, int line) {
  bp_plan *p = (bp_plan *)(uintptr_t)0x1;
  bp_status st = bp_model_compile(m, o, &p);
  const char *msg = bp_last_error();
  ck_assert_msg(st == want, "line %d: status %s, want %s (%s)", line, bp_status_str(st),
                bp_status_str(want), msg);
  ck_assert_msg(p == (bp_plan *)(uintptr_t)0x1, "line %d: plan written on failure", line);
  ck_assert_msg(strchr(msg, '\n') == NULL, "line %d: message is not one line: %s", line, msg);
  for (int i = 0; needles[i]; i++)
    ck_assert_msg(strstr(msg, needles[i]) != NULL, "line %d: message lacks \"%s\": %s", line,
                  needles[i], msg);
}

#define EXPECT_REFUSED(m, o, want, ...)                                                            \
  do {                                                                                             \
    const char *needles_[] = {__VA_ARGS__, NULL};                                                  \
    expect_refused_((m), (o), (want), needles_, __LINE__);                                         \
  } while (0)

static const bp_dtensor *tensor(const bp_plan *p, int variant, const char *name) {
  int32_t id = bp_plan_find_tensor(p, name);
  ck_assert_msg(id >= 0, "no tensor '%s'", name);
  return bp_plan_tensor(p, variant, id);
}

static void assert_shape(const bp_dtensor *t, int64_t n, int64_t h, int64_t w, int64_t c) {
  ck_assert_msg(t->shape.n == n && t->shape.h == h && t->shape.w == w && t->shape.c == c,
                "'%s' is [%lld,%lld,%lld,%lld], want [%lld,%lld,%lld,%lld]", t->name,
                (long long)t->shape.n, (long long)t->shape.h, (long long)t->shape.w,
                (long long)t->shape.c, (long long)n, (long long)h, (long long)w, (long long)c);
}

static uint64_t span_bytes(const bp_plan *p, bp_region first, bp_region last) {
  bp_span s;
  ck_assert_int_eq(bp_plan_resolve(p, first, last, &s), BP_OK);
  return s.bytes;
}

/* Every offset is a multiple of 256, the regions tile the arena in enum
 * order, and the tensors of each region tile it (checked here by hand, not
 * only through bp_plan_check); in a packed plan the F regions' tensors
 * lie inside their region instead, the last end closing it. */
static void assert_tiled(const bp_plan *p) {
  ck_assert_msg(bp_plan_check(p) == BP_OK, "%s", bp_last_error());
  uint64_t cursor = 0;
  for (int r = 0; r < BP_REGION_COUNT; r++) {
    bp_span s = bp_plan_region_span(p, (bp_region)r);
    ck_assert_uint_eq(s.offset, cursor);
    ck_assert_uint_eq(s.offset % 256, 0);
    uint64_t inside = s.offset;
    int32_t count = 0;
    const int packed = bp_plan_is_packed(p) && bp_region_is_packed((bp_region)r);
    for (int32_t id = 0; id < bp_plan_tensor_count(p); id++) {
      const bp_dtensor *t = bp_plan_tensor(p, 0, id);
      if ((int)t->region != r) continue;
      count++;
      if (packed) {
        ck_assert_uint_ge(t->offset, s.offset);
        if (t->offset + t->slot_bytes > inside) inside = t->offset + t->slot_bytes;
        continue;
      }
      ck_assert_uint_eq(t->offset, inside);
      inside += t->slot_bytes;
    }
    ck_assert_uint_eq(inside, s.offset + s.bytes);
    ck_assert_int_eq(count, bp_plan_region_tensor_count(p, (bp_region)r));
    cursor = inside;
  }
  ck_assert_uint_eq(cursor, bp_plan_total_bytes(p));
  for (int v = 0; v < bp_plan_variant_count(p); v++)
    for (int32_t id = 0; id < bp_plan_tensor_count(p); id++) {
      const bp_dtensor *t = bp_plan_tensor(p, v, id);
      ck_assert_uint_eq(t->offset % 256, 0);
      ck_assert_uint_eq(t->slot_bytes % 256, 0);
      ck_assert_uint_le(t->offset + t->slot_bytes, bp_plan_total_bytes(p));
    }
}

/* ---- totals by hand ------------------------------------------------------- */

/* One fc layer: input 8x8x3, 5 classes; batch 4, train_size 6 (a last batch
 * of 2), eval batch 10. Slots by docs/architecture.md "DTensor rules", e = elements:
 *   FP16: align256(2e+16); INT8: align256(e+16); FP32/INT32: 2*align256(2e+16). */
static const char *tiny_fc = "name: tiny\n"
                             "input: {height: 8, width: 8, channels: 3, classes: 5}\n"
                             "layers:\n"
                             "  - {type: fc, name: fc, units: 5}\n"
                             "  - {type: softmax_ce, name: ce}\n"
                             "train: {batch: 4, eval_batch: 10, train_size: 6}\n";

START_TEST(tiny_fc_total_by_hand) {
  bp_model *m = parse(tiny_fc);
  bp_compile_options o = bp_compile_options_from_model(m);
  bp_plan *p = compile_ok(m, &o);
  ck_assert_int_eq(bp_plan_variant_count(p), 3);
  ck_assert_int_eq(bp_plan_variant(p, 1)->batch, 2); /* train_last: 6 % 4 */
  /* input.a/.b FP32 [N,8,8,3]: the eval batch is the largest,
   *   N=10: e=1920, 2e+16=3856 -> 4096, x2 = 8192 each           16384
   *   (N=4 alone: e=768 -> 1552 -> 1792 -> 3584; the max wins)
   * label.a/.b INT32 [10,1,1,1]: 36 -> 256 -> 512 each              1024
   * lr, loss_scale FP32, step INT32: 512 each                        1536
   * fc.w [5,1,1,192] e=960: 1936 -> 2048 -> 4096; W, G, M          12288
   * fc.b [1,1,1,5]: 26 -> 256 -> 512; W, G, M                        1536
   * fc.out, fc.dout FP32 [10,1,1,5] e=50: 116 -> 256 -> 512 each     1024
   * ce.prob FP32 [10,1,1,5] (T)                                       512
   * loss, correct FP32 [1,1,1,1] (R)                                 1024
   *                                                          total  35328 */
  ck_assert_uint_eq(bp_plan_total_bytes(p), 35328u);
  ck_assert_uint_eq(tensor(p, 0, "input.a")->slot_bytes, 8192u);
  ck_assert_uint_eq(bp_plan_region_span(p, BP_REGION_I_A).bytes, 8192u + 512u);
  ck_assert_uint_eq(bp_plan_region_span(p, BP_REGION_W_FC_WEIGHT).bytes, 4096u);
  ck_assert_uint_eq(bp_plan_region_span(p, BP_REGION_S_SCALAR).bytes, 1536u);
  /* W_FC_BIAS starts after B and the BN W regions, all empty */
  ck_assert_uint_eq(bp_plan_region_span(p, BP_REGION_W_FC_BIAS).offset, 0u);
  ck_assert_uint_eq(tensor(p, 0, "fc.w")->offset, 512u);
  assert_tiled(p);
  bp_plan_destroy(p);

  /* Under AMP: input FP16 in I with C padded to 4, features FP16 in F16 with
   * C padded to 8, FP16 twins of every parameter (A, G16), and the loss
   * scaling's scalars found_inf, good_steps, skipped.
   *   input.a/.b FP16 [10,8,8,4] e=2560: 5136 -> 5376 each            10752
   *   label 1024, scalars 6 x 512                                       4096
   *   fc.w: W 4096, A 2048, G 4096, G16 2048, M 4096                   16384
   *   fc.b: W 512, A 256, G 512, G16 256, M 512                         2048
   *   fc.out, fc.dout FP16 [10,1,1,8] e=80: 176 -> 256 each              512
   *   ce.prob 512, R 1024                                               1536
   *                                                           total    35328 */
  o.plan.amp = 1;
  p = compile_ok(m, &o);
  ck_assert_uint_eq(bp_plan_total_bytes(p), 35328u);
  ck_assert_uint_eq(bp_plan_region_span(p, BP_REGION_S_SCALAR).bytes, 6u * 512u);
  ck_assert_int_eq(tensor(p, 2, "input.a")->padded_c, 4);
  ck_assert_int_eq(tensor(p, 2, "fc.out")->padded_c, 8);
  assert_tiled(p);
  bp_plan_destroy(p);
  bp_model_destroy(m);
}
END_TEST

/* ---- variants --------------------------------------------------------- */

START_TEST(variants_differ_in_batch_and_resolution) {
  bp_model *m = load_shipped("resnet8.yaml");
  bp_compile_options o = bp_compile_options_from_model(m);
  const bp_variant_spec extra[] = {
      {"res32", 64, 32, 32}, /* another resolution and batch */
      {"big", 512, 0, 0}, /* another batch at the model's resolution */
      {"res20", 0, 20, 12}, /* the training batch, non-square */
  };
  o.extra = extra;
  o.extra_count = 3;
  bp_plan *p = compile_ok(m, &o);
  const char *names[] = {"train", "train_last", "eval", "res32", "big", "res20"};
  const int64_t batch[] = {128, 60000 % 128, 200, 64, 512, 128};
  const int64_t height[] = {28, 28, 28, 32, 28, 20}, width[] = {28, 28, 28, 32, 28, 12};
  ck_assert_int_eq(bp_plan_variant_count(p), 6);
  for (int v = 0; v < 6; v++) {
    const bp_variant_info *vi = bp_plan_variant(p, v);
    ck_assert_str_eq(vi->name, names[v]);
    ck_assert_int_eq(vi->batch, batch[v]);
    ck_assert_int_eq(vi->height, height[v]);
    ck_assert_int_eq(vi->width, width[v]);
    ck_assert_int_eq(bp_plan_find_variant(p, names[v]), v);
  }
  /* every id: one offset and slot everywhere, the slot is the max of each
   * variant's own, strides follow each variant's own shape */
  for (int32_t id = 0; id < bp_plan_tensor_count(p); id++) {
    const bp_dtensor *t0 = bp_plan_tensor(p, 0, id);
    uint64_t max_own = 0;
    for (int v = 0; v < 6; v++) {
      const bp_dtensor *t = bp_plan_tensor(p, v, id);
      ck_assert_int_eq(t->id, id);
      ck_assert_str_eq(t->name, t0->name);
      ck_assert_int_eq(t->region, t0->region);
      ck_assert_int_eq(t->dtype, t0->dtype);
      ck_assert_uint_eq(t->offset, t0->offset);
      ck_assert_uint_eq(t->slot_bytes, t0->slot_bytes);
      uint64_t own = 0;
      ck_assert_int_eq(bp_dtensor_slot_bytes(t->dtype, t->region, t->shape, &own), BP_OK);
      ck_assert_uint_le(own, t->slot_bytes);
      if (own > max_own) max_own = own;
      ck_assert_int_eq(t->dev_stride[3], 1);
      ck_assert_int_eq(t->dev_stride[2], t->padded_c);
      ck_assert_int_eq(t->dev_stride[1], t->padded_c * t->shape.w);
      ck_assert_int_eq(t->dev_stride[0], t->padded_c * t->shape.w * t->shape.h);
      ck_assert_int_eq(t->host_stride[2], t->shape.c);
      ck_assert_int_eq(t->host_stride[0], t->shape.c * t->shape.w * t->shape.h);
    }
    ck_assert_uint_eq(t0->slot_bytes, max_own);
  }
  /* shapes follow each variant: 28 -> 14 -> 7, 32 -> 16 -> 8, 20x12 -> 10x6 -> 5x3 */
  assert_shape(tensor(p, 0, "stem.out"), 128, 28, 28, 16);
  assert_shape(tensor(p, 1, "stem.out"), 96, 28, 28, 16);
  assert_shape(tensor(p, 3, "stem.out"), 64, 32, 32, 16);
  assert_shape(tensor(p, 0, "b3_out.out"), 128, 7, 7, 64);
  assert_shape(tensor(p, 3, "b3_out.out"), 64, 8, 8, 64);
  assert_shape(tensor(p, 5, "b2_proj.out"), 128, 10, 6, 32);
  assert_shape(tensor(p, 5, "b3_add.out"), 128, 5, 3, 64);
  assert_shape(tensor(p, 3, "input.a"), 64, 32, 32, 1);
  assert_shape(tensor(p, 4, "label.b"), 512, 1, 1, 1);
  /* the largest variant sets the slot: big (512 x 28 x 28) for stem.out */
  uint64_t big_slot = 0;
  ck_assert_int_eq(
      bp_dtensor_slot_bytes(BP_DTYPE_FP32, BP_REGION_F32, (bp_shape){512, 28, 28, 16}, &big_slot),
      BP_OK);
  ck_assert_uint_eq(tensor(p, 3, "stem.out")->slot_bytes, big_slot);
  /* parameters keep one shape */
  for (int v = 0; v < 6; v++) {
    assert_shape(tensor(p, v, "fc.w"), 10, 1, 1, 64);
    assert_shape(tensor(p, v, "b2_proj.w"), 32, 1, 1, 16);
    assert_shape(tensor(p, v, "stem_bn.running_mean"), 1, 1, 1, 16);
  }
  assert_tiled(p);
  bp_plan_destroy(p);
  bp_model_destroy(m);
}
END_TEST

START_TEST(last_batch_only_when_needed) {
  bp_model *m = load_shipped("mlp.yaml");
  bp_compile_options o = bp_compile_options_from_model(m);
  ck_assert_int_eq(o.batch, 128);
  ck_assert_int_eq(o.eval_batch, 200);
  ck_assert_int_eq(o.train_size, 60000);
  ck_assert_int_eq(o.extra_count, 0);
  o.batch = 100; /* 60000 % 100 == 0 */
  bp_plan *p = compile_ok(m, &o);
  ck_assert_int_eq(bp_plan_variant_count(p), 2);
  ck_assert_int_eq(bp_plan_find_variant(p, "train_last"), -1);
  ck_assert_int_eq(bp_plan_variant(p, 1)->batch, 200);
  bp_plan_destroy(p);
  o.batch = 70000; /* bigger than the data: one short batch */
  p = compile_ok(m, &o);
  ck_assert_int_eq(bp_plan_variant(p, bp_plan_find_variant(p, "train_last"))->batch, 60000);
  bp_plan_destroy(p);
  bp_model_destroy(m);
}
END_TEST

/* ---- the allocation scheme ------------------------------------------------ */

START_TEST(tensors_land_in_their_regions) {
  bp_model *m = load_shipped("cnn.yaml");
  bp_compile_options o = bp_compile_options_from_model(m);
  o.plan.amp = 1;
  bp_plan *p = compile_ok(m, &o);
  const struct {
    const char *name;
    bp_region region;
    bp_dtype dtype;
    bp_init_kind init;
  } rows[] = {
      {"input.a", BP_REGION_I_A, BP_DTYPE_FP16, BP_INIT_NONE},
      {"input.b", BP_REGION_I_B, BP_DTYPE_FP16, BP_INIT_NONE},
      {"label.a", BP_REGION_I_A, BP_DTYPE_INT32, BP_INIT_NONE},
      {"lr", BP_REGION_S_SCALAR, BP_DTYPE_FP32, BP_INIT_CONSTANT},
      {"loss_scale", BP_REGION_S_SCALAR, BP_DTYPE_FP32, BP_INIT_ONES},
      {"step", BP_REGION_S_SCALAR, BP_DTYPE_FP32, BP_INIT_ZEROS},
      {"conv1.w", BP_REGION_W_CONV_FIRST, BP_DTYPE_FP32, BP_INIT_KAIMING_NORMAL},
      {"conv1.w.fp16", BP_REGION_A_CONV_FIRST, BP_DTYPE_FP16, BP_INIT_NONE},
      {"conv2.w", BP_REGION_W_CONV_DEEP, BP_DTYPE_FP32, BP_INIT_KAIMING_NORMAL},
      {"conv2.w.grad", BP_REGION_G_CONV_DEEP, BP_DTYPE_FP32, BP_INIT_ZEROS},
      {"conv2.w.grad16", BP_REGION_G16_CONV_DEEP, BP_DTYPE_FP16, BP_INIT_NONE},
      {"conv2.w.m", BP_REGION_M_CONV_DEEP, BP_DTYPE_FP32, BP_INIT_ZEROS},
      {"bn1.weight", BP_REGION_W_BN_WEIGHT, BP_DTYPE_FP32, BP_INIT_ONES},
      {"bn1.bias", BP_REGION_W_BN_BIAS, BP_DTYPE_FP32, BP_INIT_ZEROS},
      {"bn1.running_mean", BP_REGION_B, BP_DTYPE_FP32, BP_INIT_ZEROS},
      {"bn1.running_var", BP_REGION_B, BP_DTYPE_FP32, BP_INIT_ONES},
      {"bn1.save_mean", BP_REGION_F32, BP_DTYPE_FP32, BP_INIT_NONE},
      {"bn1.save_invstd", BP_REGION_F32, BP_DTYPE_FP32, BP_INIT_NONE},
      {"bn1.out", BP_REGION_F16, BP_DTYPE_FP16, BP_INIT_NONE},
      {"relu1.dout", BP_REGION_F16, BP_DTYPE_FP16, BP_INIT_NONE},
      {"pool1.mask", BP_REGION_S_MASK, BP_DTYPE_INT8, BP_INIT_NONE},
      {"fc.w", BP_REGION_W_FC_WEIGHT, BP_DTYPE_FP32, BP_INIT_KAIMING_NORMAL},
      {"fc.b", BP_REGION_W_FC_BIAS, BP_DTYPE_FP32, BP_INIT_ZEROS},
      {"loss.prob", BP_REGION_T, BP_DTYPE_FP32, BP_INIT_NONE},
      {"loss", BP_REGION_R, BP_DTYPE_FP32, BP_INIT_ZEROS},
      {"correct", BP_REGION_R, BP_DTYPE_FP32, BP_INIT_ZEROS},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    const bp_dtensor *t = tensor(p, 0, rows[i].name);
    ck_assert_msg(t->region == rows[i].region && t->dtype == rows[i].dtype &&
                      t->init.kind == rows[i].init,
                  "'%s': region %s dtype %s init %d", t->name, bp_region_get(t->region)->name,
                  bp_dtype_name(t->dtype), (int)t->init.kind);
  }
  ck_assert_float_eq_tol(tensor(p, 0, "lr")->init.a, 0.05f, 1e-9f);
  ck_assert_uint_ne(tensor(p, 0, "conv1.w")->init.seed, tensor(p, 0, "conv2.w")->init.seed);
  /* shapes: weights [out, kh, kw, in], fc flattens 7*7*64 */
  assert_shape(tensor(p, 0, "conv1.w"), 32, 3, 3, 1);
  assert_shape(tensor(p, 0, "conv3.w"), 64, 3, 3, 32);
  assert_shape(tensor(p, 0, "fc.w"), 10, 1, 1, 3136);
  assert_shape(tensor(p, 0, "fc.b"), 1, 1, 1, 10);
  assert_shape(tensor(p, 0, "pool1.mask"), 128, 14, 14, 32);
  assert_shape(tensor(p, 0, "pool2.out"), 128, 7, 7, 64);
  assert_shape(tensor(p, 2, "loss.prob"), 200, 1, 1, 10);
  assert_shape(tensor(p, 0, "bn4.save_invstd"), 1, 1, 1, 64);
  ck_assert_int_eq(bp_plan_find_tensor(p, "conv1.b"), -1); /* bias: false */
  ck_assert_int_eq(bp_plan_find_tensor(p, "loss.out"), -1); /* the loss has no feature */
  /* 16 layers; 15 with out+dout, 4 BN with 2 saved statistics: 38 features */
  ck_assert_int_eq(bp_plan_region_tensor_count(p, BP_REGION_F16), 30);
  ck_assert_int_eq(bp_plan_region_tensor_count(p, BP_REGION_F32), 8);
  bp_plan_destroy(p);
  bp_model_destroy(m);

  /* a conv bias is bias-like: FC_BIAS regions, no weight decay */
  m = parse("input: {height: 4, width: 4, channels: 2, classes: 3}\nlayers:\n"
            "  - {type: conv, name: c, filters: 3, kernel: 4}\n"
            "  - {type: softmax_ce}\n");
  o = bp_compile_options_from_model(m);
  p = compile_ok(m, &o);
  ck_assert_int_eq(tensor(p, 0, "c.b")->region, BP_REGION_W_FC_BIAS);
  ck_assert_int_eq(tensor(p, 0, "c.w")->region, BP_REGION_W_CONV_FIRST);
  ck_assert_int_eq(bp_plan_region_tensor_count(p, BP_REGION_S_MASK), 0);
  bp_plan_destroy(p);
  bp_model_destroy(m);
}
END_TEST

START_TEST(options_switch_exactly_their_regions) {
  const char *files[] = {"mlp.yaml", "cnn.yaml"};
  /* a parameter kind each model certainly has */
  const bp_param_kind used[] = {BP_PARAM_FC_WEIGHT, BP_PARAM_CONV_DEEP};
  for (int f = 0; f < 2; f++) {
    bp_model *m = load_shipped(files[f]);
    for (int amp = 0; amp < 2; amp++)
      for (int ema = 0; ema < 2; ema++)
        for (int opt = BP_OPT_SGD; opt <= BP_OPT_LARS; opt++) {
          bp_compile_options o = bp_compile_options_from_model(m);
          o.plan.amp = amp;
          o.plan.ema = ema;
          o.plan.optimizer = (bp_optimizer)opt;
          bp_plan *p = compile_ok(m, &o);
          for (int r = 0; r < BP_REGION_COUNT; r++)
            if (!bp_region_enabled(&o.plan, (bp_region)r))
              ck_assert_uint_eq(bp_plan_region_span(p, (bp_region)r).bytes, 0);
          bp_param_kind k = used[f];
          uint64_t w = bp_plan_region_span(p, bp_region_of_param(BP_FAMILY_W, k)).bytes;
          ck_assert_uint_gt(w, 0);
#define BYTES(family) bp_plan_region_span(p, bp_region_of_param(family, k)).bytes
          ck_assert_uint_eq(BYTES(BP_FAMILY_E), ema ? w : 0); /* E only with ema */
          ck_assert_uint_eq(BYTES(BP_FAMILY_A), amp ? w / 2 : 0); /* A only with amp */
          ck_assert_uint_eq(BYTES(BP_FAMILY_G), w);
          ck_assert_uint_eq(BYTES(BP_FAMILY_G16), amp ? w / 2 : 0); /* G16 only with amp */
          ck_assert_uint_eq(BYTES(BP_FAMILY_M), w); /* every optimizer */
          ck_assert_uint_eq(BYTES(BP_FAMILY_V), opt == BP_OPT_ADAMW ? w : 0);
#undef BYTES
          ck_assert_int_eq(bp_plan_region_span(p, BP_REGION_N).bytes > 0, opt == BP_OPT_LARS);
          ck_assert_int_eq(bp_plan_region_span(p, BP_REGION_F16).bytes > 0, amp);
          ck_assert_uint_gt(bp_plan_region_span(p, BP_REGION_R).bytes, 0);
          /* LARS: one [1,1,1,2] FP32 norm pair (512 bytes) per parameter */
          if (opt == BP_OPT_LARS)
            ck_assert_uint_eq(bp_plan_region_span(p, BP_REGION_N).bytes,
                              512u * (uint64_t)bp_plan_region_tensor_count(p, BP_REGION_N));
          /* the whole W span is exactly twice the A span under AMP */
          uint64_t wspan = span_bytes(p, BP_REGION_W_BN_BIAS, BP_REGION_W_CONV_DEEP);
          uint64_t aspan = span_bytes(p, BP_REGION_A_BN_BIAS, BP_REGION_A_CONV_DEEP);
          ck_assert_uint_eq(aspan, amp ? wspan / 2 : 0);
          if (amp) ck_assert_uint_eq(wspan, 2 * aspan);
          uint64_t gspan = span_bytes(p, BP_REGION_G_BN_BIAS, BP_REGION_G_CONV_DEEP);
          ck_assert_uint_eq(gspan, wspan);
          assert_tiled(p);
          bp_plan_destroy(p);
        }
    bp_model_destroy(m);
  }
}
END_TEST

START_TEST(shipped_models_tile_their_arenas) {
  const char *files[] = {"mlp.yaml", "cnn.yaml", "resnet8.yaml"};
  for (int f = 0; f < 3; f++) {
    bp_model *m = load_shipped(files[f]);
    bp_compile_options o = bp_compile_options_from_model(m);
    bp_plan *p = compile_ok(m, &o);
    ck_assert_int_eq(bp_plan_variant_count(p), 3); /* 60000 % 128 = 96: train_last */
    assert_tiled(p);
    bp_plan_destroy(p);
    bp_model_destroy(m);
  }
}
END_TEST

/* ---- ranks ------------------------------------------------------------------ */

/* Every tensor of every variant of `p` at variant 0's offset and slot; the
 * images and labels of each variant hold its batch. */
static void assert_offsets_shared(const bp_plan *p) {
  const int32_t in = bp_plan_find_tensor(p, "input.a"), lab = bp_plan_find_tensor(p, "label.b");
  ck_assert(in >= 0 && lab >= 0);
  for (int v = 0; v < bp_plan_variant_count(p); v++) {
    for (int32_t id = 0; id < bp_plan_tensor_count(p); id++) {
      const bp_dtensor *a = bp_plan_tensor(p, 0, id), *b = bp_plan_tensor(p, v, id);
      ck_assert_msg(a->offset == b->offset && a->slot_bytes == b->slot_bytes,
                    "variant '%s': '%s' at %llu (%llu bytes), variant 0 at %llu (%llu)",
                    bp_plan_variant(p, v)->name, b->name, (unsigned long long)b->offset,
                    (unsigned long long)b->slot_bytes, (unsigned long long)a->offset,
                    (unsigned long long)a->slot_bytes);
    }
    ck_assert_int_eq(bp_plan_tensor(p, v, in)->shape.n, bp_plan_variant(p, v)->batch);
    ck_assert_int_eq(bp_plan_tensor(p, v, lab)->shape.n, bp_plan_variant(p, v)->batch);
  }
}

/* The names and batches of p's variants, "name:batch ..." */
static void variants_of(const bp_plan *p, char *buf, size_t size) {
  size_t at = 0;
  buf[0] = '\0';
  for (int v = 0; v < bp_plan_variant_count(p) && at < size; v++)
    at += (size_t)snprintf(buf + at, size - at, "%s%s:%lld", v ? " " : "",
                           bp_plan_variant(p, v)->name, (long long)bp_plan_variant(p, v)->batch);
}

/* model.h: world R compiles one rank's share of each global batch by
 * data.h's rule (the first b % R ranks take one more), "train" ceil(B/R),
 * "train_small" floor(B/R), "train_last" ceil(L/R), "train_last_small"
 * floor(L/R), each only when needed, all at the offsets of variant 0; the
 * plan is that of one rank of ceil(B/R); world 0 and 1 are today's plan
 * (the shipped totals at batch 128 unchanged). */
START_TEST(world_compiles_rank_share_variants) {
  static const struct {
    int world;
    int64_t batch, train_size;
    const char *want;
  } cases[] = {
      {3, 64, 64 * 5 + 2, "train:22 train_small:21 train_last:1 eval:200"}, /* 1, 1, 0 */
      {3, 64, 64 * 5 + 44, "train:22 train_small:21 train_last:15 train_last_small:14 eval:200"},
      {3, 64, 64 * 5 + 63, "train:22 train_small:21 train_last:21 eval:200"}, /* 21 each */
      {4, 64, 64 * 5 + 6, "train:16 train_last:2 train_last_small:1 eval:200"},
      {4, 64, 64 * 5, "train:16 eval:200"},
      {5, 3, 100, "train:1 train_last:1 eval:200"}, /* 1,1,1,0,0; the last 1: 1,0,0,0,0 */
      {1, 64, 64 * 5 + 2, "train:64 train_last:2 eval:200"},
      {0, 64, 64 * 5 + 2, "train:64 train_last:2 eval:200"},
  };
  const char *files[] = {"mlp.yaml", "cnn.yaml"};
  const uint64_t totals[] = {12611072u, 380684288u}; /* `blueprint plan --no-reuse` at batch 128 */
  const uint64_t packed[] = {10962432u, 149857792u};  /* `blueprint plan`: liveness packing */
  char got[512];
  for (int f = 0; f < 2; f++) {
    bp_model *m = load_shipped(files[f]);
    bp_compile_options o = bp_compile_options_from_model(m);
    ck_assert_int_eq(o.world, 1);
    ck_assert_int_eq(o.batch, 128);
    bp_plan *one = compile_ok(m, &o);
    ck_assert_uint_eq(bp_plan_unpacked_bytes(one), totals[f]);
    ck_assert_uint_eq(bp_plan_total_bytes(one), packed[f]);
    variants_of(one, got, sizeof got);
    ck_assert_str_eq(got, "train:128 train_last:96 eval:200");
    bp_plan_destroy(one);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      o = bp_compile_options_from_model(m);
      o.world = cases[c].world;
      o.batch = cases[c].batch;
      o.train_size = cases[c].train_size;
      bp_plan *p = compile_ok(m, &o);
      variants_of(p, got, sizeof got);
      ck_assert_msg(strcmp(got, cases[c].want) == 0, "%s, world %d: %s, want %s", files[f],
                    cases[c].world, got, cases[c].want);
      assert_offsets_shared(p);
      assert_tiled(p);
      /* the same layout as one rank at the largest share (the eval batch
       * and the largest training batch set every slot) */
      bp_compile_options r = bp_compile_options_from_model(m);
      r.batch = bp_plan_variant(p, 0)->batch;
      r.train_size = r.batch;
      bp_plan *ref = compile_ok(m, &r);
      ck_assert_uint_eq(bp_plan_total_bytes(p), bp_plan_total_bytes(ref));
      ck_assert_int_eq(bp_plan_tensor_count(p), bp_plan_tensor_count(ref));
      for (int32_t id = 0; id < bp_plan_tensor_count(p); id++)
        ck_assert_uint_eq(bp_plan_tensor(p, 0, id)->offset, bp_plan_tensor(ref, 0, id)->offset);
      bp_plan_destroy(ref);
      bp_plan_destroy(p);
    }
    o = bp_compile_options_from_model(m);
    o.world = -2;
    EXPECT_REFUSED(m, &o, BP_ERR_INVALID, "world -2 must be >= 1");
    bp_model_destroy(m);
  }
}
END_TEST

/* ---- refusals ------------------------------------------------------------- */

START_TEST(fc_after_conv_refuses_resolution_variant) {
  bp_model *m = load_shipped("cnn.yaml");
  bp_compile_options o = bp_compile_options_from_model(m);
  const bp_variant_spec extra[] = {{"r32", 128, 32, 32}};
  o.extra = extra;
  o.extra_count = 1;
  char where[4200];
  const bp_layer *fc = &m->layers[14];
  ck_assert_str_eq(fc->name, "fc");
  snprintf(where, sizeof where, "%s:%d:%d: layer 'fc' (variant 'r32')", m->path, fc->line,
           fc->column);
  EXPECT_REFUSED(m, &o, BP_ERR_SHAPE, where, "fc.w", "[10,1,1,4096]", "[10,1,1,3136]",
                 "global_avgpool");
  /* the same resolution at another batch is fine */
  const bp_variant_spec batch_only[] = {{"b7", 7, 28, 28}};
  o.extra = batch_only;
  bp_plan *p = compile_ok(m, &o);
  bp_plan_destroy(p);
  bp_model_destroy(m);
}
END_TEST

START_TEST(kernel_larger_than_padded_input) {
  bp_model *m = parse("input: {height: 4, width: 4, channels: 1, classes: 10}\nlayers:\n"
                      "  - {type: conv, name: c, filters: 10, kernel: 5}\n"
                      "  - {type: global_avgpool}\n"
                      "  - {type: softmax_ce}\n");
  bp_compile_options o = bp_compile_options_from_model(m);
  EXPECT_REFUSED(m, &o, BP_ERR_SHAPE,
                 "x.yaml:3:5: layer 'c' (variant 'train'): 5x5 kernel (dilation 1) is larger "
                 "than its padded input 4x4 (pad 0)");
  bp_model_destroy(m);

  /* dilation widens the kernel: 3 taps at dilation 3 span 7 > 6 */
  m = parse("input: {height: 6, width: 9, channels: 1, classes: 10}\nlayers:\n"
            "  - {type: conv, name: c, filters: 10, kernel: 3, dilation: 3}\n"
            "  - {type: global_avgpool}\n"
            "  - {type: softmax_ce}\n");
  o = bp_compile_options_from_model(m);
  EXPECT_REFUSED(m, &o, BP_ERR_SHAPE, "x.yaml:3:5: layer 'c' (variant 'train')",
                 "3x3 kernel (dilation 3) is larger than its padded input 6x9 (pad 0)");
  bp_model_destroy(m);

  /* fits at the model's resolution, not in a smaller variant; pools too */
  m = parse("input: {height: 8, width: 8, channels: 1, classes: 10}\nlayers:\n"
            "  - {type: conv, name: c, filters: 10, kernel: 3, pad: 1}\n"
            "  - {type: maxpool, name: p, kernel: 4}\n"
            "  - {type: global_avgpool}\n"
            "  - {type: softmax_ce}\n");
  o = bp_compile_options_from_model(m);
  const bp_variant_spec small[] = {{"small", 2, 3, 3}};
  o.extra = small;
  o.extra_count = 1;
  EXPECT_REFUSED(m, &o, BP_ERR_SHAPE, "x.yaml:4:5: layer 'p' (variant 'small')",
                 "4x4 kernel (dilation 1) is larger than its padded input 3x3 (pad 0)");
  bp_model_destroy(m);
}
END_TEST

START_TEST(channel_and_shape_mismatches) {
  bp_model *m = parse("input: {height: 8, width: 8, channels: 3, classes: 10}\nlayers:\n"
                      "  - {type: conv, name: c, filters: 10, kernel: 3, groups: 2}\n"
                      "  - {type: global_avgpool}\n"
                      "  - {type: softmax_ce}\n");
  bp_compile_options o = bp_compile_options_from_model(m);
  EXPECT_REFUSED(m, &o, BP_ERR_SHAPE, "x.yaml:3:5: layer 'c' (variant 'train')",
                 "groups 2 must divide both its 3 input channels and its 10 filters");
  bp_model_destroy(m);

  m = parse("input: {height: 8, width: 8, channels: 3, classes: 10}\nlayers:\n"
            "  - {type: conv, name: c, filters: 10, kernel: 3}\n"
            "  - {type: add, name: sum, inputs: [c, input]}\n"
            "  - {type: global_avgpool}\n"
            "  - {type: softmax_ce}\n");
  o = bp_compile_options_from_model(m);
  EXPECT_REFUSED(m, &o, BP_ERR_SHAPE, "x.yaml:4:5: layer 'sum' (variant 'train')",
                 "inputs 'c' [128,6,6,10] and 'input' [128,8,8,3] must have the same shape");
  bp_model_destroy(m);

  /* the loss needs one score per class, on a 1x1 map */
  m = parse("input: {height: 8, width: 8, channels: 3, classes: 10}\nlayers:\n"
            "  - {type: fc, name: f, units: 7}\n"
            "  - {type: softmax_ce, name: ce}\n");
  o = bp_compile_options_from_model(m);
  EXPECT_REFUSED(m, &o, BP_ERR_SHAPE, "x.yaml:4:5: layer 'ce' (variant 'train')",
                 "its input 'f' is [128,1,1,7]; softmax_ce needs [N,1,1,10]");
  bp_model_destroy(m);
  m = parse("input: {height: 8, width: 8, channels: 10, classes: 10}\nlayers:\n"
            "  - {type: relu}\n"
            "  - {type: softmax_ce}\n");
  o = bp_compile_options_from_model(m);
  EXPECT_REFUSED(m, &o, BP_ERR_SHAPE, "its input 'relu0' is [128,8,8,10]");
  bp_model_destroy(m);
}
END_TEST

START_TEST(overflow_is_refused_with_context) {
  bp_model *m = load_shipped("mlp.yaml");
  bp_compile_options o = bp_compile_options_from_model(m);
  o.batch = 1000000000000000LL; /* 10^15 */
  EXPECT_REFUSED(m, &o, BP_ERR_OVERFLOW, m->path, "model 'mlp'", "cannot be laid out");
  bp_model_destroy(m);

  /* here one feature alone has more than 2^64 elements */
  m = load_shipped("cnn.yaml");
  o = bp_compile_options_from_model(m);
  o.batch = 1000000000000000LL;
  char where[4200];
  snprintf(where, sizeof where, "%s:%d:%d: layer 'conv1' (variant 'train')", m->path,
           m->layers[0].line, m->layers[0].column);
  EXPECT_REFUSED(m, &o, BP_ERR_OVERFLOW, where, "conv1.out", "overflows");
  bp_model_destroy(m);

  /* and from the file itself */
  m = parse(
      "input: {height: 2147483647, width: 2147483647, channels: 2147483647, classes: 1}\n"
      "layers:\n  - {type: global_avgpool}\n  - {type: fc, units: 1}\n  - {type: softmax_ce}\n"
      "train: {batch: 9223372036854775807}\n");
  o = bp_compile_options_from_model(m);
  EXPECT_REFUSED(m, &o, BP_ERR_OVERFLOW, "x.yaml", "variant 'train'", "input.a");
  bp_model_destroy(m);
}
END_TEST

START_TEST(bad_options_are_refused) {
  bp_model *m = parse(tiny_fc);
  bp_compile_options o = bp_compile_options_from_model(m);
  o.batch = 0;
  EXPECT_REFUSED(m, &o, BP_ERR_INVALID, "x.yaml", "batch 0");
  o = bp_compile_options_from_model(m);
  o.eval_batch = -5;
  EXPECT_REFUSED(m, &o, BP_ERR_INVALID, "eval batch -5");
  o = bp_compile_options_from_model(m);
  const bp_variant_spec neg[] = {{"neg", 1, -2, 8}};
  o.extra = neg;
  o.extra_count = 1;
  EXPECT_REFUSED(m, &o, BP_ERR_INVALID, "extra variant 'neg'");
  const bp_variant_spec twice[] = {{"eval", 3, 8, 8}};
  o.extra = twice;
  EXPECT_REFUSED(m, &o, BP_ERR_INVALID, "x.yaml", "variant 'eval'", "defined twice");
  const bp_variant_spec unnamed[] = {{"", 3, 8, 8}};
  o.extra = unnamed;
  EXPECT_REFUSED(m, &o, BP_ERR_INVALID, "extra variant 0 has no name");
  o.extra = NULL;
  EXPECT_REFUSED(m, &o, BP_ERR_INVALID, "without their list");
  o = bp_compile_options_from_model(m);
  o.plan.optimizer = (bp_optimizer)42;
  EXPECT_REFUSED(m, &o, BP_ERR_INVALID, "unknown optimizer 42");
  bp_plan *p = NULL;
  ck_assert_int_eq(bp_model_compile(NULL, &o, &p), BP_ERR_INVALID);
  ck_assert_int_eq(bp_model_compile(m, NULL, &p), BP_ERR_INVALID);
  ck_assert_int_eq(bp_model_compile(m, &o, NULL), BP_ERR_INVALID);
  bp_model_destroy(m);
}
END_TEST

/* Models built in C go through the same checks; messages name the model. */
START_TEST(models_built_in_c) {
  bp_layer layers[3];
  memset(layers, 0, sizeof layers);
  layers[0] = (bp_layer){.type = BP_LAYER_FC,
                         .name = "f",
                         .inputs = {BP_MODEL_INPUT, 0},
                         .input_count = 1,
                         .units = 4,
                         .kernel_h = 1,
                         .kernel_w = 1,
                         .stride = 1,
                         .dilation = 1,
                         .groups = 1,
                         .bias = 1};
  layers[1] = layers[0];
  strcpy(layers[1].name, "g");
  layers[1].inputs[0] = 0;
  layers[2] =
      (bp_layer){.type = BP_LAYER_SOFTMAX_CE, .name = "ce", .inputs = {1, 0}, .input_count = 1};
  bp_model m;
  memset(&m, 0, sizeof m);
  strcpy(m.name, "handmade");
  m.height = m.width = 2;
  m.channels = 1;
  m.classes = 4;
  m.layers = layers;
  m.layer_count = 3;
  m.train =
      (bp_train_settings){.batch = 2, .eval_batch = 2, .train_size = 4, .epochs = 1, .lr = 0.1};
  bp_compile_options o = bp_compile_options_from_model(&m);
  bp_plan *p = compile_ok(&m, &o);
  assert_shape(tensor(p, 0, "g.w"), 4, 1, 1, 4);
  bp_plan_destroy(p);

  layers[1].inputs[0] = 1; /* reads itself */
  EXPECT_REFUSED(&m, &o, BP_ERR_INVALID, "model 'handmade': fc layer 'g'",
                 "does not come before it");
  layers[1].inputs[0] = 0;
  layers[1].kernel_h = 0; /* irrelevant to fc: ignored */
  layers[1].units = 0;
  EXPECT_REFUSED(&m, &o, BP_ERR_INVALID, "fc layer 'g'",
                 "'units' must be in [1, 2147483647], got 0");
  layers[1].units = 4;
  strcpy(layers[1].name, "f");
  EXPECT_REFUSED(&m, &o, BP_ERR_INVALID, "duplicate layer name");
  strcpy(layers[1].name, "g.x");
  EXPECT_REFUSED(&m, &o, BP_ERR_INVALID, "invalid name");
  strcpy(layers[1].name, "g");
  layers[2].type = BP_LAYER_RELU;
  EXPECT_REFUSED(&m, &o, BP_ERR_INVALID, "the last layer must be softmax_ce");
  layers[2].type = (bp_layer_type)99;
  EXPECT_REFUSED(&m, &o, BP_ERR_INVALID, "unknown layer type 99");
  layers[2].type = BP_LAYER_SOFTMAX_CE;
  m.classes = 0;
  EXPECT_REFUSED(&m, &o, BP_ERR_INVALID, "'classes' must be in [1, 2147483647], got 0");
  m.classes = 4;
  m.layer_count = 0;
  EXPECT_REFUSED(&m, &o, BP_ERR_INVALID, "no layers");
}
END_TEST

int main(void) {
  Suite *s = suite_create("compile");
  TCase *tc = tcase_create("compile");
  tcase_add_test(tc, tiny_fc_total_by_hand);
  tcase_add_test(tc, variants_differ_in_batch_and_resolution);
  tcase_add_test(tc, last_batch_only_when_needed);
  tcase_add_test(tc, tensors_land_in_their_regions);
  tcase_add_test(tc, options_switch_exactly_their_regions);
  tcase_add_test(tc, shipped_models_tile_their_arenas);
  tcase_add_test(tc, world_compiles_rank_share_variants);
  tcase_add_test(tc, fc_after_conv_refuses_resolution_variant);
  tcase_add_test(tc, kernel_larger_than_padded_input);
  tcase_add_test(tc, channel_and_shape_mismatches);
  tcase_add_test(tc, overflow_is_refused_with_context);
  tcase_add_test(tc, bad_options_are_refused);
  tcase_add_test(tc, models_built_in_c);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
