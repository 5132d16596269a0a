/* The executor (core/src/bind.c): binding a graph to an arena with kernels
 * from the op modules found beside libblueprint.so, the bind-time error for
 * a node no kernel supports, and the gradients a whole backward segment
 * produces, against central finite differences of the loss segment (with
 * no ZERO_GRAD before it: the backward overwrites every gradient). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/arena.h"
#include "blueprint/exec.h"
#include "blueprint/graph.h"
#include "blueprint/model_yaml.h"

static bp_registry *shared_registry(void) {
  static bp_registry *r = NULL;
  if (!r) {
    ck_assert_int_eq(bp_registry_create(&r), BP_OK);
    ck_assert_msg(bp_registry_discover(r, NULL, 0) == BP_OK, "%s", bp_last_error());
    ck_assert_msg(bp_registry_default_kernel(r, "range.sgd", "cpu") != NULL,
                  "no range kernels found beside libblueprint.so");
  }
  return r;
}

typedef struct xrig {
  bp_model *model;
  bp_plan *plan;
  bp_graph *graph;
  bp_arena *arena;
  char *base;
  bp_exec *exec;
} xrig;

static uint64_t rng_state = 88172645463325252ull;
static double unit(void) { /* xorshift64: a fixed stream for the tests */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) * 0x1.0p-53;
}

static float *f32(const xrig *x, const char *name) {
  int32_t id = bp_plan_find_tensor(x->plan, name);
  ck_assert_msg(id >= 0, "no tensor '%s'", name);
  return (float *)(x->base + bp_plan_tensor(x->plan, 0, id)->offset);
}

static const bp_dtensor *desc(const xrig *x, const char *name) {
  int32_t id = bp_plan_find_tensor(x->plan, name);
  ck_assert_msg(id >= 0, "no tensor '%s'", name);
  return bp_plan_tensor(x->plan, 0, id);
}

/* Compiles `text` for one batch of `batch`, binds it (pins, NULL: none) and
 * fills parameters by their rules, the input uniformly in [-1, 1) and the
 * labels with i % classes. Returns the bind status; the rig is usable only
 * on BP_OK. */
static bp_status open_xrig(xrig *x, const char *text, int64_t batch, int amp, const char *pins) {
  memset(x, 0, sizeof *x);
  ck_assert_msg(bp_model_parse(text, strlen(text), "x.yaml", &x->model) == BP_OK, "%s",
                bp_last_error());
  bp_compile_options co = bp_compile_options_from_model(x->model);
  co.batch = co.eval_batch = co.train_size = batch;
  co.plan.amp = amp;
  ck_assert_msg(bp_model_compile(x->model, &co, &x->plan) == BP_OK, "%s", bp_last_error());
  bp_graph_options go;
  bp_graph_options_init(&go);
  go.global_batch = batch;
  go.train_size = batch;
  ck_assert_msg(bp_graph_build(x->model, x->plan, &go, &x->graph) == BP_OK, "%s", bp_last_error());
  ck_assert_int_eq(bp_arena_create(x->plan, bp_host_allocator(), 0, &x->arena), BP_OK);
  x->base = bp_arena_base(x->arena);
  /* "" rather than NULL: no default pins of the registry may steer the test */
  bp_exec_options eo = {.device = "cpu", .pins = pins ? pins : "", .rank = 0, .world = 1};
  bp_status st = bp_exec_create(x->graph, shared_registry(), x->base, &eo, &x->exec);
  if (st != BP_OK) return st;
  for (int32_t id = 0; id < bp_plan_tensor_count(x->plan); id++) {
    const bp_dtensor *t = bp_plan_tensor(x->plan, 0, id);
    if (t->init.kind == BP_INIT_NONE || t->dtype != BP_DTYPE_FP32) continue;
    ck_assert(bp_dtensor_is_compact(t));
    ck_assert_int_eq(bp_dtensor_init_fill(t, 7, (float *)(x->base + t->offset)), BP_OK);
  }
  const bp_dtensor *in = desc(x, "input.a");
  float *input = f32(x, "input.a");
  for (uint64_t i = 0; i < bp_dtensor_host_elems(in); i++) input[i] = (float)(2.0 * unit() - 1.0);
  int32_t *labels = (int32_t *)f32(x, "label.a");
  for (int64_t i = 0; i < batch; i++) labels[i] = (int32_t)(i % x->model->classes);
  return BP_OK;
}

static void close_xrig(xrig *x) {
  bp_exec_destroy(x->exec);
  bp_arena_destroy(x->arena);
  bp_graph_destroy(x->graph);
  bp_plan_destroy(x->plan);
  bp_model_destroy(x->model);
}

static void run(xrig *x, bp_segment s) {
  bp_status st = bp_exec_run(x->exec, 0, s, 0);
  ck_assert_msg(st == BP_OK, "%s: %s", bp_segment_name(s), bp_last_error());
}

/* The summed loss of one forward pass. */
static double loss_of(xrig *x) {
  bp_exec_params_changed(x->exec); /* W was changed by hand: kernels repack */
  run(x, BP_SEGMENT_RESET);
  run(x, BP_SEGMENT_FORWARD);
  run(x, BP_SEGMENT_LOSS);
  return *f32(x, "loss");
}

/* Every parameter's gradient (d mean loss / d w, as the backward leaves
 * it in G) against central differences with step h at a few elements
 * each. ReLU and max-pool kinks bound h from above (a step that moves an
 * activation across zero, or changes a pooling winner, is not a
 * derivative); FP32 rounding of the loss bounds it from below. */
static void check_gradients(xrig *x, int64_t batch, int samples, float h) {
  run(x, BP_SEGMENT_RESET);
  /* no ZERO_GRAD (a step with samples skips it): the G span holds NaN, and
   * the backward must overwrite every element of every gradient */
  const bp_span gs = bp_graph_node(x->graph, 0, BP_SEGMENT_ZERO_GRAD, 0)->outputs[0].span;
  for (uint64_t i = 0; i < gs.bytes / sizeof(float); i++)
    ((float *)(x->base + gs.offset))[i] = NAN;
  run(x, BP_SEGMENT_FORWARD);
  run(x, BP_SEGMENT_LOSS);
  run(x, BP_SEGMENT_BACKWARD);
  int checked = 0;
  for (int32_t id = 0; id < bp_plan_tensor_count(x->plan); id++) {
    const bp_dtensor *w = bp_plan_tensor(x->plan, 0, id);
    if (w->region < BP_REGION_W_BN_BIAS || w->region > BP_REGION_W_CONV_DEEP) continue;
    char gname[BP_NAME_MAX + 8];
    snprintf(gname, sizeof gname, "%s.grad", w->name);
    const float *g = f32(x, gname);
    float *p = (float *)(x->base + w->offset);
    const uint64_t n = bp_dtensor_host_elems(w);
    for (uint64_t e = 0; e < n; e++)
      if (!isfinite(g[e])) ck_abort_msg("%s[%llu] = %g: not written by the backward", gname,
                                        (unsigned long long)e, g[e]);
    for (int k = 0; k < samples; k++) {
      const uint64_t e = (uint64_t)(unit() * (double)n) % n;
      const float keep = p[e];
      p[e] = keep + h;
      const double up = loss_of(x);
      p[e] = keep - h;
      const double down = loss_of(x);
      p[e] = keep;
      const double numeric = (up - down) / (2.0 * h) / (double)batch;
      const double analytic = g[e];
      ck_assert_msg(fabs(numeric - analytic) <= 2e-3 + 0.05 * fabs(numeric),
                    "d loss / d %s[%llu]: backward %.6g, finite differences %.6g", w->name,
                    (unsigned long long)e, analytic, numeric);
      checked++;
    }
  }
  ck_assert_int_gt(checked, 0);
}

/* Residual branches (r1 and r2 feed two layers each), batch norm, max and
 * average pooling, a strided 1x1 conv, biases and an fc. */
static const char residual_net[] =
    "input: {height: 6, width: 6, channels: 2, classes: 3}\n"
    "layers:\n"
    "  - {type: conv, name: c1, filters: 4, kernel: 3, pad: 1, bias: false}\n"
    "  - {type: batchnorm, name: b1}\n"
    "  - {type: relu, name: r1}\n"
    "  - {type: conv, name: c2, filters: 4, kernel: 3, pad: 1}\n"
    "  - {type: add, name: a1, inputs: [c2, r1]}\n"
    "  - {type: relu, name: r2}\n"
    "  - {type: maxpool, name: p1, kernel: 2}\n"
    "  - {type: conv, name: c3, input: r2, filters: 4, kernel: 1, stride: 2}\n"
    "  - {type: add, name: a2, inputs: [p1, c3]}\n"
    "  - {type: avgpool, name: p2, kernel: 3}\n"
    "  - {type: fc, name: f, units: 3}\n"
    "  - {type: softmax_ce, name: loss, label_smoothing: 0.1}\n";

START_TEST(residual_gradients_match_finite_differences) {
  xrig x;
  ck_assert_msg(open_xrig(&x, residual_net, 4, 0, NULL) == BP_OK, "%s", bp_last_error());
  check_gradients(&x, 4, 4, 1e-2f);
  close_xrig(&x);
}
END_TEST

/* GELU layers after a conv, an fc and a residual add; g1's output feeds
 * two layers, so its gradient accumulates before g1's backward reads it. */
START_TEST(gelu_gradients_match_finite_differences) {
  static const char gelu_net[] =
      "input: {height: 4, width: 4, channels: 2, classes: 3}\n"
      "layers:\n"
      "  - {type: conv, name: c1, filters: 3, kernel: 3, pad: 1}\n"
      "  - {type: gelu, name: g1}\n"
      "  - {type: conv, name: c2, filters: 3, kernel: 3, pad: 1}\n"
      "  - {type: add, name: a1, inputs: [c2, g1]}\n"
      "  - {type: gelu, name: g2}\n"
      "  - {type: fc, name: f1, units: 5}\n"
      "  - {type: gelu, name: g3}\n"
      "  - {type: fc, name: f2, units: 3}\n"
      "  - {type: softmax_ce, name: loss}\n";
  xrig x;
  ck_assert_msg(open_xrig(&x, gelu_net, 4, 0, NULL) == BP_OK, "%s", bp_last_error());
  check_gradients(&x, 4, 4, 1e-2f);
  close_xrig(&x);
}
END_TEST

/* The same network with gelu_tanh layers. */
START_TEST(gelu_tanh_gradients_match_finite_differences) {
  static const char net[] =
      "input: {height: 4, width: 4, channels: 2, classes: 3}\n"
      "layers:\n"
      "  - {type: conv, name: c1, filters: 3, kernel: 3, pad: 1}\n"
      "  - {type: gelu_tanh, name: g1}\n"
      "  - {type: conv, name: c2, filters: 3, kernel: 3, pad: 1}\n"
      "  - {type: add, name: a1, inputs: [c2, g1]}\n"
      "  - {type: gelu_tanh, name: g2}\n"
      "  - {type: fc, name: f1, units: 5}\n"
      "  - {type: gelu_tanh, name: g3}\n"
      "  - {type: fc, name: f2, units: 3}\n"
      "  - {type: softmax_ce, name: loss}\n";
  xrig x;
  ck_assert_msg(open_xrig(&x, net, 4, 0, NULL) == BP_OK, "%s", bp_last_error());
  check_gradients(&x, 4, 4, 1e-2f);
  close_xrig(&x);
}
END_TEST

/* Layer norms over conv channels (per position) and over fc units, one
 * of them on a residual sum: dx, dgain and dbias of every layernorm
 * against central differences of the loss. */
START_TEST(layernorm_gradients_match_finite_differences) {
  static const char net[] =
      "input: {height: 4, width: 4, channels: 2, classes: 3}\n"
      "layers:\n"
      "  - {type: conv, name: c1, filters: 5, kernel: 2, stride: 2}\n"
      "  - {type: layernorm, name: n1}\n"
      "  - {type: conv, name: c2, filters: 5, kernel: 1}\n"
      "  - {type: gelu_tanh, name: g1}\n"
      "  - {type: add, name: a1, inputs: [g1, c1]}\n"
      "  - {type: layernorm, name: n2, eps: 1e-3}\n"
      "  - {type: fc, name: f1, units: 6}\n"
      "  - {type: layernorm, name: n3}\n"
      "  - {type: fc, name: f2, units: 3}\n"
      "  - {type: softmax_ce, name: loss}\n";
  xrig x;
  ck_assert_msg(open_xrig(&x, net, 4, 0, NULL) == BP_OK, "%s", bp_last_error());
  /* gain and bias start at 1 and 0; other values make their gradients matter */
  static const char *const params[] = {"n1.weight", "n1.bias", "n2.weight", "n2.bias",
                                       "n3.weight", "n3.bias"};
  for (size_t k = 0; k < sizeof params / sizeof params[0]; k++) {
    float *p = f32(&x, params[k]);
    for (uint64_t i = 0; i < bp_dtensor_host_elems(desc(&x, params[k])); i++)
      p[i] += (float)(unit() - 0.5);
  }
  check_gradients(&x, 4, 4, 1e-2f);
  close_xrig(&x);
}
END_TEST

/* A ViT block in small: patch conv, pos_embed, layernorm, token-wise
 * 1x1 convs with gelu_tanh, a residual add, mean over tokens: every
 * parameter's gradient (P's included) against central differences. */
START_TEST(vit_block_gradients_match_finite_differences) {
  static const char net[] =
      "input: {height: 4, width: 4, channels: 1, classes: 3}\n"
      "layers:\n"
      "  - {type: conv, name: patch, filters: 4, kernel: 2, stride: 2}\n"
      "  - {type: pos_embed, name: pos}\n"
      "  - {type: layernorm, name: n1}\n"
      "  - {type: conv, name: up, filters: 8, kernel: 1}\n"
      "  - {type: gelu_tanh, name: g}\n"
      "  - {type: conv, name: down, filters: 4, kernel: 1}\n"
      "  - {type: add, name: res, inputs: [down, pos]}\n"
      "  - {type: layernorm, name: n2}\n"
      "  - {type: global_avgpool, name: mean}\n"
      "  - {type: fc, name: head, units: 3}\n"
      "  - {type: softmax_ce, name: loss}\n";
  xrig x;
  ck_assert_msg(open_xrig(&x, net, 4, 0, NULL) == BP_OK, "%s", bp_last_error());
  const bp_dtensor *p = desc(&x, "pos.weight");
  ck_assert_int_eq(p->shape.n, 1);
  ck_assert_int_eq(p->shape.h, 2);
  ck_assert_int_eq(p->shape.w, 2);
  ck_assert_int_eq(p->shape.c, 4);
  ck_assert_int_eq(p->region, BP_REGION_W_BN_WEIGHT);
  /* P scaled up from its 0.02 so its effect on the loss rises above FP32 rounding */
  float *pw = f32(&x, "pos.weight");
  for (int i = 0; i < 16; i++) pw[i] *= 25.0f;
  check_gradients(&x, 4, 6, 1e-2f);
  close_xrig(&x);
}
END_TEST

/* pos_embed's P starts as normal(0, 0.02), from its name's seed: the same
 * values in two compiles, and a sample whose mean and spread fit. */
START_TEST(pos_embed_starts_normal_with_std_0_02) {
  static const char net[] =
      "input: {height: 16, width: 16, channels: 16, classes: 2}\n"
      "layers:\n"
      "  - {type: pos_embed, name: pos}\n"
      "  - {type: global_avgpool, name: mean}\n"
      "  - {type: fc, name: head, units: 2}\n"
      "  - {type: softmax_ce, name: loss}\n";
  xrig a, b;
  ck_assert_msg(open_xrig(&a, net, 2, 0, NULL) == BP_OK, "%s", bp_last_error());
  ck_assert_msg(open_xrig(&b, net, 2, 0, NULL) == BP_OK, "%s", bp_last_error());
  const float *pa = f32(&a, "pos.weight"), *pb = f32(&b, "pos.weight");
  const int n = 16 * 16 * 16;
  double sum = 0, sq = 0;
  for (int i = 0; i < n; i++) {
    ck_assert(pa[i] == pb[i]);
    sum += pa[i], sq += (double)pa[i] * pa[i];
  }
  const double mean = sum / n, sd = sqrt(sq / n - mean * mean);
  ck_assert_msg(fabs(mean) < 0.002 && fabs(sd - 0.02) < 0.001, "mean %g, sd %g", mean, sd);
  close_xrig(&a);
  close_xrig(&b);
}
END_TEST

/* The shipped cnn's layer sequence, at 8x8 so the check stays quick. */
START_TEST(cnn_gradients_match_finite_differences) {
  static const char cnn_small[] =
      "input: {height: 8, width: 8, channels: 1, classes: 10}\n"
      "layers:\n"
      "  - {type: conv, name: conv1, filters: 4, kernel: 3, pad: 1, bias: false}\n"
      "  - {type: batchnorm, name: bn1}\n"
      "  - {type: relu, name: relu1}\n"
      "  - {type: conv, name: conv2, filters: 4, kernel: 3, pad: 1, bias: false}\n"
      "  - {type: batchnorm, name: bn2}\n"
      "  - {type: relu, name: relu2}\n"
      "  - {type: maxpool, name: pool1, kernel: 2}\n"
      "  - {type: conv, name: conv3, filters: 8, kernel: 3, pad: 1, bias: false}\n"
      "  - {type: batchnorm, name: bn3}\n"
      "  - {type: relu, name: relu3}\n"
      "  - {type: maxpool, name: pool2, kernel: 2}\n"
      "  - {type: fc, name: fc, units: 10}\n"
      "  - {type: softmax_ce, name: loss}\n";
  xrig x;
  ck_assert_msg(open_xrig(&x, cnn_small, 6, 0, NULL) == BP_OK, "%s", bp_last_error());
  /* 384 activations per channel feed each max pool: a small step keeps
   * the winners */
  check_gradients(&x, 6, 3, 3e-4f);
  close_xrig(&x);
}
END_TEST

/* One SGD step through the update segment equals the formula. */
START_TEST(update_segment_applies_sgd) {
  xrig x;
  ck_assert_msg(open_xrig(&x, residual_net, 4, 0, NULL) == BP_OK, "%s", bp_last_error());
  run(&x, BP_SEGMENT_RESET);
  run(&x, BP_SEGMENT_ZERO_GRAD);
  run(&x, BP_SEGMENT_FORWARD);
  run(&x, BP_SEGMENT_LOSS);
  run(&x, BP_SEGMENT_BACKWARD);
  *f32(&x, "lr") = 0.1f;
  const float w0 = f32(&x, "c2.w")[5], g = f32(&x, "c2.w.grad")[5];
  const float b0 = f32(&x, "c2.b")[1], gb = f32(&x, "c2.b.grad")[1];
  run(&x, BP_SEGMENT_UPDATE);
  /* first step: m = g + wd*w; w -= lr*m (weights decay, biases do not) */
  ck_assert_float_eq_tol(f32(&x, "c2.w")[5], w0 - 0.1f * (g + 5e-4f * w0), 1e-6f);
  ck_assert_float_eq_tol(f32(&x, "c2.b")[1], b0 - 0.1f * gb, 1e-6f);
  ck_assert_float_eq_tol(f32(&x, "c2.w.m")[5], g + 5e-4f * w0, 1e-6f);
  close_xrig(&x);
}
END_TEST

START_TEST(unsupported_node_is_a_bind_error) {
  static const char net[] =
      "input: {height: 4, width: 4, channels: 1, classes: 2}\n"
      "layers:\n"
      "  - {type: conv, name: c1, filters: 2, kernel: 3, pad: 1}\n"
      "  - {type: fc, name: f, units: 2}\n"
      "  - {type: softmax_ce}\n";
  xrig x;
  bp_status st;
  /* a pin naming a kernel that does not exist */
  st = open_xrig(&x, net, 2, 0, "conv2d.*=nosuch");
  ck_assert_int_eq(st, BP_ERR_UNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "names no registered kernel 'nosuch'"));
  close_xrig(&x);

  /* a node a kernel refuses in supports(): batch norm over one value */
  static const char one[] =
      "input: {height: 1, width: 1, channels: 2, classes: 2}\n"
      "layers:\n"
      "  - {type: batchnorm, name: b}\n"
      "  - {type: fc, name: f, units: 2}\n"
      "  - {type: softmax_ce}\n";
  st = open_xrig(&x, one, 1, 0, NULL);
  ck_assert_int_eq(st, BP_ERR_UNSUPPORTED);
  const char *msg = bp_last_error();
  ck_assert_msg(strchr(msg, '\n') == NULL, "not one line: %s", msg);
  /* the variant, the node, its op, its tensors and every candidate's reason */
  const char *needles[] = {"variant 'train'", "node 'b.fwd' (batchnorm.fwd_train)", "fp32[1,1,1,2]",
                           "reference:", "more than one value per channel", NULL};
  for (int i = 0; needles[i]; i++)
    ck_assert_msg(strstr(msg, needles[i]) != NULL, "message lacks \"%s\": %s", needles[i], msg);
  ck_assert_ptr_null(x.exec);
  close_xrig(&x);
}
END_TEST

START_TEST(pins_choose_the_kernel) {
  static const char net[] =
      "input: {height: 4, width: 4, channels: 1, classes: 2}\n"
      "layers:\n"
      "  - {type: fc, name: f, units: 2}\n"
      "  - {type: softmax_ce}\n";
  xrig x;
  ck_assert_msg(open_xrig(&x, net, 2, 0, "*=reference") == BP_OK, "%s", bp_last_error());
  const bp_registered_kernel *k = bp_exec_kernel(x.exec, 0, BP_SEGMENT_FORWARD, 0);
  ck_assert_ptr_nonnull(k);
  ck_assert_str_eq(k->kernel.op, "fc.fwd");
  ck_assert_str_eq(k->kernel.impl, "reference");
  ck_assert_ptr_null(bp_exec_kernel(x.exec, 0, BP_SEGMENT_FORWARD, 1));
  ck_assert_int_eq(bp_exec_run(x.exec, 0, BP_SEGMENT_COUNT, 0), BP_ERR_INVALID);
  ck_assert_int_eq(bp_exec_run(x.exec, 0, BP_SEGMENT_FORWARD, 2), BP_ERR_INVALID);
  close_xrig(&x);
  bp_exec_destroy(NULL);
}
END_TEST

int main(void) {
  Suite *s = suite_create("exec");
  TCase *tc = tcase_create("exec");
  tcase_add_test(tc, residual_gradients_match_finite_differences);
  tcase_add_test(tc, cnn_gradients_match_finite_differences);
  tcase_add_test(tc, gelu_gradients_match_finite_differences);
  tcase_add_test(tc, gelu_tanh_gradients_match_finite_differences);
  tcase_add_test(tc, layernorm_gradients_match_finite_differences);
  tcase_add_test(tc, vit_block_gradients_match_finite_differences);
  tcase_add_test(tc, pos_embed_starts_normal_with_std_0_02);
  tcase_add_test(tc, update_segment_applies_sgd);
  tcase_add_test(tc, unsupported_node_is_a_bind_error);
  tcase_add_test(tc, pins_choose_the_kernel);
  tcase_set_timeout(tc, 120);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
