/* Model files: the shipped models parse into the layers they describe, and
 * every kind of bad input is refused with one line naming
 * "file:line:column", the field and the value at fault. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/model.h"
#include "blueprint/model_yaml.h"

/* ---- helpers ---------------------------------------------------------- */

static bp_model *load_shipped(const char *file) {
  const char *src = getenv("BP_SOURCE_DIR");
  ck_assert_msg(src != NULL, "BP_SOURCE_DIR is not set (run through CTest)");
  char path[4096];
  snprintf(path, sizeof path, "%s/models/%s", src, file);
  bp_model *m = NULL;
  bp_status st = bp_model_load(path, &m);
  ck_assert_msg(st == BP_OK, "%s: %s", path, bp_last_error());
  return m;
}

static bp_status parse(const char *text, bp_model **m) {
  return bp_model_parse(text, strlen(text), "x.yaml", m);
}

/* Parsing `text` fails with `want`, leaves the output alone, and the one-line
 * message contains every needle. */
static void expect_fail_(const char *text, size_t length, bp_status want,
                         const char *const *needles, int line) {
  bp_model *m = (bp_model *)(uintptr_t)0x1;
  bp_status st = bp_model_parse(text, length, "x.yaml", &m);
  const char *msg = bp_last_error();
  ck_assert_msg(st == want, "line %d: status %s, want %s (%s)", line, bp_status_str(st),
                bp_status_str(want), msg);
  ck_assert_msg(m == (bp_model *)(uintptr_t)0x1, "line %d: output written on failure", line);
  ck_assert_msg(strchr(msg, '\n') == NULL, "line %d: message is not one line: %s", line, msg);
  for (int i = 0; needles[i]; i++)
    ck_assert_msg(strstr(msg, needles[i]) != NULL, "line %d: message lacks \"%s\": %s", line,
                  needles[i], msg);
}

#define EXPECT_FAIL(text, want, ...)                                                               \
  do {                                                                                             \
    const char *needles_[] = {__VA_ARGS__, NULL};                                                  \
    expect_fail_((text), strlen(text), (want), needles_, __LINE__);                                \
  } while (0)

/* A valid header; the layers follow from line 3, column 3 ("  - ..."). */
#define HEAD "input: {height: 8, width: 8, channels: 1, classes: 10}\nlayers:\n"
#define LOSS "  - {type: softmax_ce}\n"

/* ---- shipped models ---------------------------------------------------- */

START_TEST(mlp_parses) {
  bp_model *m = load_shipped("mlp.yaml");
  ck_assert_str_eq(m->name, "mlp");
  ck_assert_int_eq(m->height, 28);
  ck_assert_int_eq(m->width, 28);
  ck_assert_int_eq(m->channels, 1);
  ck_assert_int_eq(m->classes, 10);
  ck_assert_int_eq(m->layer_count, 6);
  const bp_layer_type types[] = {BP_LAYER_FC,   BP_LAYER_RELU, BP_LAYER_FC,
                                 BP_LAYER_RELU, BP_LAYER_FC,   BP_LAYER_SOFTMAX_CE};
  const int64_t units[] = {512, 0, 512, 0, 10, 0};
  for (int i = 0; i < 6; i++) {
    ck_assert_int_eq(m->layers[i].type, types[i]);
    ck_assert_int_eq(m->layers[i].input_count, 1);
    ck_assert_int_eq(m->layers[i].inputs[0], i - 1); /* -1: the model input */
    ck_assert_int_gt(m->layers[i].line, 0);
    if (units[i]) {
      ck_assert_int_eq(m->layers[i].units, units[i]);
      ck_assert_int_eq(m->layers[i].bias, 1);
    }
  }
  ck_assert_str_eq(m->layers[0].name, "fc1");
  ck_assert_int_eq(m->layers[0].line, 6);
  ck_assert_int_eq(m->layers[0].column, 5);
  ck_assert_int_eq(m->train.batch, 128);
  ck_assert_int_eq(m->train.eval_batch, 200);
  ck_assert_int_eq(m->train.train_size, 60000);
  ck_assert_int_eq(m->train.epochs, 3);
  ck_assert_int_eq(m->train.optimizer, BP_OPT_SGD);
  ck_assert_double_eq(m->train.lr, 0.05);
  ck_assert_double_eq(m->train.momentum, 0.9);
  ck_assert_double_eq(m->train.weight_decay, 5e-4);
  ck_assert_int_eq(m->train.amp, 0);
  ck_assert_int_eq(m->train.ema, 0);
  ck_assert_int_eq(m->train.schedule, BP_LR_CONSTANT);
  ck_assert_double_eq(m->train.warmup_epochs, 0.0);
  bp_model_destroy(m);
}
END_TEST

START_TEST(cnn_parses) {
  bp_model *m = load_shipped("cnn.yaml");
  ck_assert_int_eq(m->layer_count, 16);
  const bp_layer_type types[] = {
      BP_LAYER_CONV,      BP_LAYER_BATCHNORM, BP_LAYER_RELU,    BP_LAYER_CONV,
      BP_LAYER_BATCHNORM, BP_LAYER_RELU,      BP_LAYER_MAXPOOL, BP_LAYER_CONV,
      BP_LAYER_BATCHNORM, BP_LAYER_RELU,      BP_LAYER_CONV,    BP_LAYER_BATCHNORM,
      BP_LAYER_RELU,      BP_LAYER_MAXPOOL,   BP_LAYER_FC,      BP_LAYER_SOFTMAX_CE};
  const int64_t filters[] = {32, 0, 0, 32, 0, 0, 0, 64, 0, 0, 64};
  for (int i = 0; i < 16; i++) {
    const bp_layer *l = &m->layers[i];
    ck_assert_int_eq(l->type, types[i]);
    ck_assert_int_eq(l->inputs[0], i - 1);
    if (l->type == BP_LAYER_CONV) {
      ck_assert_int_eq(l->units, filters[i]);
      ck_assert_int_eq(l->kernel_h, 3);
      ck_assert_int_eq(l->kernel_w, 3);
      ck_assert_int_eq(l->stride, 1);
      ck_assert_int_eq(l->pad, 1);
      ck_assert_int_eq(l->dilation, 1);
      ck_assert_int_eq(l->groups, 1);
      ck_assert_int_eq(l->bias, 0);
    }
    if (l->type == BP_LAYER_MAXPOOL) {
      ck_assert_int_eq(l->kernel_h, 2);
      ck_assert_int_eq(l->stride, 2); /* defaults to the kernel */
      ck_assert_int_eq(l->pad, 0);
    }
    if (l->type == BP_LAYER_BATCHNORM) {
      ck_assert_float_eq_tol(l->eps, 1e-5f, 1e-12f);
      ck_assert_float_eq_tol(l->momentum, 0.1f, 1e-7f);
    }
  }
  ck_assert_str_eq(m->layers[14].name, "fc");
  ck_assert_int_eq(m->layers[14].units, 10);
  ck_assert_int_eq(m->layers[14].bias, 1);
  ck_assert_float_eq(m->layers[15].label_smoothing, 0.0f);
  bp_model_destroy(m);
}
END_TEST

static int index_of(const bp_model *m, const char *name) {
  for (int i = 0; i < m->layer_count; i++)
    if (strcmp(m->layers[i].name, name) == 0) return i;
  ck_abort_msg("no layer '%s'", name);
  return -2;
}

START_TEST(resnet8_parses) {
  bp_model *m = load_shipped("resnet8.yaml");
  ck_assert_int_eq(m->layer_count, 31);
  int convs = 0, adds = 0;
  for (int i = 0; i < m->layer_count; i++) {
    convs += m->layers[i].type == BP_LAYER_CONV;
    adds += m->layers[i].type == BP_LAYER_ADD;
  }
  ck_assert_int_eq(convs, 9); /* 7 on the main path + 2 projections */
  ck_assert_int_eq(adds, 3);
  /* identity shortcut */
  const bp_layer *a1 = &m->layers[index_of(m, "b1_add")];
  ck_assert_int_eq(a1->input_count, 2);
  ck_assert_int_eq(a1->inputs[0], index_of(m, "b1_bn2"));
  ck_assert_int_eq(a1->inputs[1], index_of(m, "stem_relu"));
  /* projection shortcut reads the previous block's output, not the layer before it */
  const bp_layer *p2 = &m->layers[index_of(m, "b2_proj")];
  ck_assert_int_eq(p2->inputs[0], index_of(m, "b1_out"));
  ck_assert_int_eq(p2->kernel_h, 1);
  ck_assert_int_eq(p2->stride, 2);
  ck_assert_int_eq(p2->pad, 0);
  ck_assert_int_eq(m->layers[index_of(m, "b2_conv1")].stride, 2);
  const bp_layer *a3 = &m->layers[index_of(m, "b3_add")];
  ck_assert_int_eq(a3->inputs[0], index_of(m, "b3_bn2"));
  ck_assert_int_eq(a3->inputs[1], index_of(m, "b3_proj_bn"));
  ck_assert_int_eq(m->layers[index_of(m, "pool")].type, BP_LAYER_GLOBAL_AVGPOOL);
  ck_assert_int_eq(m->layers[30].type, BP_LAYER_SOFTMAX_CE);
  bp_model_destroy(m);
}
END_TEST

/* ---- good inline models: defaults and forms ---------------------------- */

START_TEST(defaults_and_forms) {
  const char *text = HEAD "  - {type: conv, filters: 4, kernel: [3, 1], dilation: 2, groups: 1}\n"
                          "  - {type: batchnorm, eps: 1e-3, momentum: 0.01}\n"
                          "  - type: maxpool\n"
                          "    kernel: 2\n"
                          "    stride: 1\n"
                          "  - {type: avgpool, kernel: [2, 1], stride: 1}\n"
                          "  - {type: relu, input: conv0}\n"
                          "  - {type: add, inputs: [relu4, conv0]}\n"
                          "  - {type: global_avgpool}\n"
                          "  - {type: fc, units: 10, bias: False}\n"
                          "  - {type: softmax_ce, label_smoothing: 0.1}\n";
  bp_model *m = NULL;
  ck_assert_msg(parse(text, &m) == BP_OK, "%s", bp_last_error());
  ck_assert_str_eq(m->name, "x"); /* from the display name */
  ck_assert_int_eq(m->layer_count, 9);
  ck_assert_str_eq(m->layers[0].name, "conv0"); /* "<type><index>" */
  ck_assert_str_eq(m->layers[1].name, "batchnorm1");
  ck_assert_str_eq(m->layers[8].name, "softmax_ce8");
  ck_assert_int_eq(m->layers[0].kernel_h, 3);
  ck_assert_int_eq(m->layers[0].kernel_w, 1);
  ck_assert_int_eq(m->layers[0].dilation, 2);
  ck_assert_int_eq(m->layers[0].bias, 1); /* default on */
  ck_assert_int_eq(m->layers[0].inputs[0], BP_MODEL_INPUT);
  ck_assert_float_eq_tol(m->layers[1].eps, 1e-3f, 1e-9f);
  ck_assert_float_eq_tol(m->layers[1].momentum, 0.01f, 1e-9f);
  ck_assert_int_eq(m->layers[2].line, 5); /* block mapping: where its first key is */
  ck_assert_int_eq(m->layers[2].column, 5);
  ck_assert_int_eq(m->layers[2].stride, 1);
  ck_assert_int_eq(m->layers[3].kernel_w, 1);
  ck_assert_int_eq(m->layers[4].inputs[0], 0);
  ck_assert_int_eq(m->layers[5].inputs[0], 4);
  ck_assert_int_eq(m->layers[5].inputs[1], 0);
  ck_assert_int_eq(m->layers[7].bias, 0);
  ck_assert_float_eq_tol(m->layers[8].label_smoothing, 0.1f, 1e-7f);
  /* no train section: the documented defaults */
  ck_assert_int_eq(m->train.batch, 128);
  ck_assert_int_eq(m->train.eval_batch, 200);
  ck_assert_int_eq(m->train.train_size, 60000);
  ck_assert_double_eq(m->train.lr, 0.05);
  bp_model_destroy(m);

  /* "input" as a reference is the model's input; settings parse */
  text = "name: tiny\n" HEAD "  - {type: relu}\n  - {type: add, inputs: [input, relu0]}\n"
         "  - {type: fc, units: 10}\n" LOSS
         "train: {batch: 1000000000000000, optimizer: lars, amp: true, ema: TRUE, lr: 1,"
         " weight_decay: 0}\n";
  ck_assert_msg(parse(text, &m) == BP_OK, "%s", bp_last_error());
  ck_assert_str_eq(m->name, "tiny");
  ck_assert_int_eq(m->layers[1].inputs[0], BP_MODEL_INPUT);
  ck_assert_int_eq(m->layers[1].inputs[1], 0);
  ck_assert_int_eq(m->train.batch, 1000000000000000LL);
  ck_assert_int_eq(m->train.optimizer, BP_OPT_LARS);
  ck_assert_int_eq(m->train.amp, 1);
  ck_assert_int_eq(m->train.ema, 1);
  ck_assert_double_eq(m->train.lr, 1.0);
  bp_model_destroy(m);
  bp_model_destroy(NULL); /* a no-op */
}
END_TEST

/* ---- bad input ------------------------------------------------------------ */

START_TEST(yaml_syntax_errors) {
  EXPECT_FAIL(HEAD "  - {type: relu\n", BP_ERR_PARSE, "x.yaml:4:1: YAML syntax error");
  EXPECT_FAIL("input: {height: 8\nlayers: ]\n", BP_ERR_PARSE, "x.yaml:2:", "YAML syntax error");
  EXPECT_FAIL("a: b: c\n", BP_ERR_PARSE, "x.yaml:1:5: YAML syntax error");
  EXPECT_FAIL(HEAD "\t- {type: relu}\n", BP_ERR_PARSE, "x.yaml:3:1: YAML syntax error");
  EXPECT_FAIL("layers: *nothing\n", BP_ERR_PARSE, "x.yaml:1:9:", "undefined alias");
  /* not UTF-8: a reader error, positioned from its byte offset */
  EXPECT_FAIL(HEAD "  - {type: \xff}\n", BP_ERR_PARSE, "x.yaml:3:", "YAML syntax error");
  const char nul[] = "input: {height: 8}\0\n";
  const char *needles[] = {"x.yaml:1:", "YAML syntax error", NULL};
  expect_fail_(nul, sizeof nul - 1, BP_ERR_PARSE, needles, __LINE__);
  /* a second document is refused, and so is a syntax error inside it */
  EXPECT_FAIL(HEAD LOSS "---\nname: again\n", BP_ERR_INVALID,
              "x.yaml:5:1:", "second YAML document");
  EXPECT_FAIL(HEAD LOSS "---\n[\n", BP_ERR_PARSE, "x.yaml:", "YAML syntax error");
}
END_TEST

START_TEST(empty_and_wrong_top_level) {
  EXPECT_FAIL("", BP_ERR_INVALID, "x.yaml:1:1:", "no YAML document");
  EXPECT_FAIL("   \n\n", BP_ERR_INVALID, "x.yaml:1:1:", "no YAML document");
  EXPECT_FAIL("# only a comment\n", BP_ERR_INVALID, "x.yaml:1:1:", "no YAML document");
  EXPECT_FAIL("---\n", BP_ERR_INVALID, "x.yaml:", "document is empty");
  EXPECT_FAIL("hello\n", BP_ERR_INVALID, "x.yaml:1:1:", "expected a mapping", "'hello'");
  EXPECT_FAIL("- 1\n- 2\n", BP_ERR_INVALID, "x.yaml:1:1:", "got a sequence");
  EXPECT_FAIL("layers: []\n", BP_ERR_INVALID, "x.yaml:1:1:", "missing required field 'input'");
  EXPECT_FAIL("input: {height: 8, width: 8, channels: 1, classes: 10}\n", BP_ERR_INVALID,
              "x.yaml:1:1:", "missing required field 'layers'");
  EXPECT_FAIL(HEAD "  []\n", BP_ERR_INVALID, "x.yaml:3:3:", "'layers' is empty");
  EXPECT_FAIL("input: {height: 8, width: 8, channels: 1, classes: 10}\nlayers: {type: relu}\n",
              BP_ERR_INVALID, "x.yaml:2:9:", "'layers' must be a sequence", "got a mapping");
  EXPECT_FAIL(HEAD LOSS "optimizer: sgd\n", BP_ERR_INVALID,
              "x.yaml:4:1:", "unknown top-level field 'optimizer'");
  EXPECT_FAIL(HEAD LOSS "layers: []\n", BP_ERR_INVALID, "x.yaml:4:1:", "duplicate field 'layers'");
  EXPECT_FAIL("? [a, b]\n: c\n", BP_ERR_INVALID, "x.yaml:1:3:", "field names", "got a sequence");
  EXPECT_FAIL("name: a/b\n" HEAD LOSS, BP_ERR_INVALID, "x.yaml:1:7:", "model name 'a/b'");
  EXPECT_FAIL("name: [m]\n" HEAD LOSS, BP_ERR_INVALID, "x.yaml:1:7:", "'name' of the model",
              "must be a string");
}
END_TEST

START_TEST(input_section) {
  EXPECT_FAIL("input: {height: 8, width: 8, channels: 1}\nlayers:\n" LOSS, BP_ERR_INVALID,
              "x.yaml:1:8:", "'input' is missing required field 'classes'");
  EXPECT_FAIL("input: 28\nlayers:\n" LOSS, BP_ERR_INVALID,
              "x.yaml:1:8:", "'input' must be a mapping", "'28'");
  EXPECT_FAIL("input: {height: 8, width: 8, channels: 1, classes: 10, depth: 3}\nlayers:\n" LOSS,
              BP_ERR_INVALID, "x.yaml:1:56:", "unknown field 'depth' in 'input'");
  EXPECT_FAIL("input: {height: 0, width: 8, channels: 1, classes: 10}\nlayers:\n" LOSS,
              BP_ERR_INVALID, "x.yaml:1:17:", "'height' of 'input' must be >= 1, got 0");
  EXPECT_FAIL("input: {height: -28, width: 8, channels: 1, classes: 10}\nlayers:\n" LOSS,
              BP_ERR_INVALID, "x.yaml:1:17:", "'height' of 'input' must be >= 1, got -28");
  EXPECT_FAIL("input: {height: 8, width: 8.5, channels: 1, classes: 10}\nlayers:\n" LOSS,
              BP_ERR_INVALID, "x.yaml:1:27:", "'width' of 'input' must be an integer, got '8.5'");
  EXPECT_FAIL("input: {height: 8, width: 8, channels: 1, classes: 10, classes: 3}\nlayers:\n" LOSS,
              BP_ERR_INVALID, "x.yaml:1:56:", "duplicate field 'classes'");
}
END_TEST

START_TEST(unknown_layer_type_and_fields) {
  EXPECT_FAIL(HEAD "  - {type: convv}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:12:", "unknown layer type 'convv'", "conv, batchnorm");
  EXPECT_FAIL(HEAD "  - {name: c}\n" LOSS, BP_ERR_INVALID, "x.yaml:3:5:", "layer 0 has no 'type'");
  EXPECT_FAIL(HEAD "  - {type: [conv]}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:12:", "unknown layer type a sequence");
  EXPECT_FAIL(HEAD "  - {type: conv, name: conv1, filtres: 32, kernel: 3}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:31:", "unknown field 'filtres' in conv layer 'conv1'", "filters");
  EXPECT_FAIL(HEAD "  - {type: relu, units: 3}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:18:", "inapplicable field 'units' in relu layer 'relu0'");
  EXPECT_FAIL(HEAD "  - {type: conv, inputs: [input, input], filters: 1, kernel: 1}\n" LOSS,
              BP_ERR_INVALID, "x.yaml:3:18:", "inapplicable field 'inputs' in conv layer 'conv0'");
  EXPECT_FAIL(HEAD "  - {type: relu, type: relu}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:18:", "duplicate field 'type' in layer 0");
  EXPECT_FAIL(HEAD "  - relu\n" LOSS, BP_ERR_INVALID, "x.yaml:3:5:", "layer 0 must be a mapping",
              "got 'relu'");
  EXPECT_FAIL(HEAD "  - [relu]\n" LOSS, BP_ERR_INVALID, "x.yaml:3:5:", "layer 0 must be a mapping",
              "got a sequence");
}
END_TEST

START_TEST(required_fields) {
  EXPECT_FAIL(HEAD "  - {type: conv, name: c1, kernel: 3}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:5:", "conv layer 'c1' is missing required field 'filters'");
  EXPECT_FAIL(HEAD "  - {type: conv, filters: 3}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:5:", "missing required field 'kernel'");
  EXPECT_FAIL(HEAD "  - {type: fc}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:5:", "fc layer 'fc0' is missing required field 'units'");
  EXPECT_FAIL(HEAD "  - {type: maxpool}\n" LOSS, BP_ERR_INVALID, "missing required field 'kernel'");
  EXPECT_FAIL(HEAD "  - {type: add}\n" LOSS, BP_ERR_INVALID, "missing required field 'inputs'");
  EXPECT_FAIL(HEAD "  - {type: maxpool, kernel: [2, 3]}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:5:", "2x3 kernel: give its 'stride'");
}
END_TEST

START_TEST(wrong_value_types) {
  EXPECT_FAIL(HEAD "  - {type: conv, name: c, filters: abc, kernel: 3}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:36:", "'filters' of conv layer 'c' must be an integer, got 'abc'");
  EXPECT_FAIL(HEAD "  - {type: conv, name: c, filters: \"32\", kernel: 3}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:36:", "must be an integer, got the string '32'");
  EXPECT_FAIL(HEAD "  - {type: conv, name: c, filters: [32], kernel: 3}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:36:", "must be an integer, got a sequence");
  EXPECT_FAIL(HEAD "  - {type: conv, name: c, filters: {n: 3}, kernel: 3}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:36:", "must be an integer, got a mapping");
  EXPECT_FAIL(HEAD "  - {type: conv, name: c, filters: , kernel: 3}\n" LOSS, BP_ERR_INVALID,
              "'filters' of conv layer 'c' must be an integer, got nothing");
  EXPECT_FAIL(HEAD "  - {type: conv, name: c, filters: 0x10, kernel: 3}\n" LOSS, BP_ERR_INVALID,
              "must be an integer, got '0x10'");
  EXPECT_FAIL(HEAD "  - {type: conv, name: c, filters: 3, kernel: 3, bias: maybe}\n" LOSS,
              BP_ERR_INVALID, "x.yaml:3:56:", "'bias' of conv layer 'c' must be true or false",
              "'maybe'");
  EXPECT_FAIL(HEAD "  - {type: conv, name: c, filters: 3, kernel: [3]}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:47:", "one integer or [height, width], got 1 items");
  EXPECT_FAIL(HEAD "  - {type: batchnorm, eps: small}\n" LOSS, BP_ERR_INVALID, "x.yaml:3:28:",
              "'eps' of batchnorm layer 'batchnorm0' must be a number, got 'small'");
  EXPECT_FAIL(HEAD "  - {type: batchnorm, eps: .inf}\n" LOSS, BP_ERR_INVALID,
              "must be a number, got '.inf'");
  EXPECT_FAIL(HEAD "  - {type: batchnorm, eps: 1e999}\n" LOSS, BP_ERR_INVALID,
              "'1e999' is out of range");
  EXPECT_FAIL(HEAD "  - {type: relu, name: [r]}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:24:", "must be a string, got a sequence");
  EXPECT_FAIL(HEAD "  - {type: relu, input: [a, b]}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:25:", "'input' of relu layer 'relu0' must name one layer");
  EXPECT_FAIL(HEAD "  - {type: add, inputs: input}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:25:", "must list two layers like [a, b], got 'input'");
  EXPECT_FAIL(HEAD "  - {type: add, inputs: [input]}\n" LOSS, BP_ERR_INVALID, "got 1 item");
  EXPECT_FAIL(HEAD "  - {type: add, inputs: [input, [x]]}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:33:", "must list layer names, got a sequence");
}
END_TEST

START_TEST(values_out_of_range) {
  EXPECT_FAIL(HEAD "  - {type: conv, name: c, filters: 3, kernel: -3}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:47:", "'kernel' of conv layer 'c' must be >= 1, got -3");
  EXPECT_FAIL(HEAD "  - {type: conv, name: c, filters: 3, kernel: [3, 0]}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:51:", "'kernel' of conv layer 'c' must be >= 1, got 0");
  EXPECT_FAIL(HEAD "  - {type: conv, name: c, filters: 0, kernel: 3}\n" LOSS, BP_ERR_INVALID,
              "'filters' of conv layer 'c' must be >= 1, got 0");
  EXPECT_FAIL(HEAD "  - {type: conv, name: c, filters: 3, kernel: 3, stride: 0}\n" LOSS,
              BP_ERR_INVALID, "'stride' of conv layer 'c' must be >= 1, got 0");
  EXPECT_FAIL(HEAD "  - {type: conv, name: c, filters: 3, kernel: 3, pad: -1}\n" LOSS,
              BP_ERR_INVALID, "'pad' of conv layer 'c' must be >= 0, got -1");
  EXPECT_FAIL(HEAD "  - {type: conv, name: c, filters: 3, kernel: 3, groups: 0}\n" LOSS,
              BP_ERR_INVALID, "'groups' of conv layer 'c' must be >= 1");
  EXPECT_FAIL(HEAD "  - {type: conv, name: c, filters: 3, kernel: 3, dilation: 0}\n" LOSS,
              BP_ERR_INVALID, "'dilation' of conv layer 'c' must be >= 1");
  EXPECT_FAIL(HEAD "  - {type: fc, units: -10}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:23:", "'units' of fc layer 'fc0' must be >= 1, got -10");
  /* huge numbers: beyond 64 bits, and beyond the extent limit */
  EXPECT_FAIL(HEAD "  - {type: fc, units: 99999999999999999999999}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:23:", "'99999999999999999999999' does not fit in 64 bits");
  EXPECT_FAIL(HEAD "  - {type: fc, units: -99999999999999999999999}\n" LOSS, BP_ERR_INVALID,
              "does not fit in 64 bits");
  EXPECT_FAIL(HEAD "  - {type: fc, units: 3000000000}\n" LOSS, BP_ERR_INVALID,
              "must be <= 2147483647, got 3000000000");
  EXPECT_FAIL(HEAD "  - {type: maxpool, kernel: 2, pad: 2}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:5:", "pad 2 is more than half of the 2x2 kernel");
  EXPECT_FAIL(HEAD "  - {type: batchnorm, eps: 0}\n" LOSS, BP_ERR_INVALID, "'eps'", "must be > 0");
  EXPECT_FAIL(HEAD "  - {type: batchnorm, eps: 1e-60}\n" LOSS, BP_ERR_INVALID,
              "too small for a float");
  EXPECT_FAIL(HEAD "  - {type: batchnorm, momentum: 1.5}\n" LOSS, BP_ERR_INVALID,
              "'momentum' of batchnorm layer 'batchnorm0' must be <= 1, got 1.5");
  EXPECT_FAIL(HEAD "  - {type: softmax_ce, label_smoothing: 1.5}\n", BP_ERR_INVALID, "x.yaml:3:41:",
              "'label_smoothing' of softmax_ce layer 'softmax_ce0' must be < 1, got 1.5");
  EXPECT_FAIL(HEAD "  - {type: softmax_ce, label_smoothing: -0.1}\n", BP_ERR_INVALID,
              "must be >= 0, got -0.1");
}
END_TEST

START_TEST(names_and_references) {
  EXPECT_FAIL(HEAD "  - {type: relu, name: a}\n  - {type: relu, name: a}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:4:24:", "duplicate layer name 'a'", "line 3");
  /* an explicit name that a later unnamed layer would get by default */
  EXPECT_FAIL(HEAD "  - {type: relu, name: relu1}\n  - {type: relu}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:4:5:", "duplicate layer name 'relu1'", "by default");
  EXPECT_FAIL(HEAD "  - {type: relu, name: a.b}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:24:", "layer name 'a.b'");
  EXPECT_FAIL(HEAD "  - {type: relu, name: input}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:24:", "layer name 'input'", "reserved");
  EXPECT_FAIL(HEAD
              "  - {type: relu, name: abcdefghijabcdefghijabcdefghijabcdefghijabcdefghij}\n" LOSS,
              BP_ERR_INVALID, "x.yaml:3:24:", "longer than 47 characters");
  EXPECT_FAIL(HEAD "  - {type: relu, name: r1}\n  - {type: add, inputs: [bn2, r1]}\n" LOSS,
              BP_ERR_INVALID, "x.yaml:4:26:", "unknown input 'bn2' for add layer 'add1'");
  EXPECT_FAIL(HEAD "  - {type: relu, input: later}\n  - {type: relu, name: later}\n" LOSS,
              BP_ERR_INVALID,
              "x.yaml:3:25:", "relu layer 'relu0' reads 'later', which comes later");
  EXPECT_FAIL(HEAD "  - {type: relu, name: me, input: me}\n" LOSS, BP_ERR_INVALID,
              "x.yaml:3:35:", "reads 'me', which is itself");
}
END_TEST

START_TEST(loss_placement) {
  EXPECT_FAIL(HEAD "  - {type: fc, units: 10}\n", BP_ERR_INVALID,
              "x.yaml:3:5:", "the last layer must be softmax_ce");
  EXPECT_FAIL(HEAD LOSS "  - {type: relu}\n", BP_ERR_INVALID,
              "x.yaml:3:5:", "softmax_ce is the loss and must be the last layer");
}
END_TEST

START_TEST(train_section) {
  EXPECT_FAIL(HEAD LOSS "train: {batch: 0}\n", BP_ERR_INVALID,
              "x.yaml:4:16:", "'batch' of 'train' must be >= 1, got 0");
  EXPECT_FAIL(HEAD LOSS "train: {optimizer: adam}\n", BP_ERR_INVALID,
              "x.yaml:4:20:", "'optimizer' of 'train' must be sgd, adamw or lars, got 'adam'");
  EXPECT_FAIL(HEAD LOSS "train: {amp: yes}\n", BP_ERR_INVALID,
              "'amp' of 'train' must be true or false");
  EXPECT_FAIL(HEAD LOSS "train: {lr: -1}\n", BP_ERR_INVALID,
              "'lr' of 'train' must be >= 0, got -1");
  EXPECT_FAIL(HEAD LOSS "train: {momentum: 1}\n", BP_ERR_INVALID,
              "'momentum' of 'train' must be < 1");
  EXPECT_FAIL(HEAD LOSS "train: {lr: fast}\n", BP_ERR_INVALID,
              "'lr' of 'train' must be a number, got 'fast'");
  EXPECT_FAIL(HEAD LOSS "train: {batchsize: 3}\n", BP_ERR_INVALID,
              "x.yaml:4:9:", "unknown field 'batchsize' in 'train'", "eval_batch");
  EXPECT_FAIL(HEAD LOSS "train: [1]\n", BP_ERR_INVALID, "x.yaml:4:8:", "'train' must be a mapping");
}
END_TEST

/* schedule and warmup_epochs: the trainer's --schedule and --warmup-epochs,
 * read into the settings; a bad value is one line at its position. */
START_TEST(train_schedule) {
  bp_model *m = NULL;
  const char *text = HEAD LOSS "train: {schedule: cosine, warmup_epochs: 1.5}\n";
  ck_assert_msg(parse(text, &m) == BP_OK, "%s", bp_last_error());
  ck_assert_int_eq(m->train.schedule, BP_LR_COSINE);
  ck_assert_double_eq(m->train.warmup_epochs, 1.5);
  bp_model_destroy(m);
  ck_assert_msg(parse(HEAD LOSS "train:\n  schedule: step\n", &m) == BP_OK, "%s",
                bp_last_error());
  ck_assert_int_eq(m->train.schedule, BP_LR_STEP);
  ck_assert_double_eq(m->train.warmup_epochs, 0.0);
  bp_model_destroy(m);

  EXPECT_FAIL(HEAD LOSS "train: {schedule: linear}\n", BP_ERR_INVALID, "x.yaml:4:19:",
              "'schedule' of 'train' must be constant, step or cosine, got 'linear'");
  EXPECT_FAIL(HEAD LOSS "train: {schedule: [cosine]}\n", BP_ERR_INVALID, "x.yaml:4:19:",
              "'schedule' of 'train' must be constant, step or cosine");
  EXPECT_FAIL(HEAD LOSS "train: {schedule: cosineannealing}\n", BP_ERR_INVALID, "x.yaml:4:19:",
              "'schedule' of 'train' must be constant, step or cosine");
  EXPECT_FAIL(HEAD LOSS "train: {warmup_epochs: -1}\n", BP_ERR_INVALID, "x.yaml:4:24:",
              "'warmup_epochs' of 'train' must be >= 0, got -1");
  EXPECT_FAIL(HEAD LOSS "train: {warmup_epochs: two}\n", BP_ERR_INVALID, "x.yaml:4:24:",
              "'warmup_epochs' of 'train' must be a number, got 'two'");
  EXPECT_FAIL(HEAD LOSS "train: {warmup_epochs: \"1\"}\n", BP_ERR_INVALID, "x.yaml:4:24:",
              "'warmup_epochs' of 'train' must be a number");
  EXPECT_FAIL(HEAD LOSS "train: {warmup_epochs: 1e999}\n", BP_ERR_INVALID, "x.yaml:4:24:",
              "'warmup_epochs' of 'train': '1e999' is out of range");
  EXPECT_FAIL(HEAD LOSS "train: {warmup: 1}\n", BP_ERR_INVALID, "x.yaml:4:9:",
              "unknown field 'warmup' in 'train'", "schedule", "warmup_epochs");
  EXPECT_FAIL(HEAD LOSS "train: {schedule: cosine, schedule: step}\n", BP_ERR_INVALID,
              "duplicate");
}
END_TEST

START_TEST(missing_file) {
  bp_model *m = NULL;
  ck_assert_int_eq(bp_model_load("/nonexistent/dir/model.yaml", &m), BP_ERR_IO);
  ck_assert_ptr_null(m);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "/nonexistent/dir/model.yaml"));
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "No such file or directory"));
  const char *src = getenv("BP_SOURCE_DIR");
  ck_assert_ptr_nonnull(src);
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/models", src);
  ck_assert_int_eq(bp_model_load(dir, &m), BP_ERR_IO); /* a directory is not a file */
  ck_assert_ptr_nonnull(strstr(bp_last_error(), dir));
  ck_assert_ptr_null(m);
}
END_TEST

/* Every prefix of a shipped file, and seeded random byte edits of it, are
 * either a model or one clear line: never a crash (the sanitizer build makes
 * this a memory check too). */
START_TEST(no_crash_on_mangled_input) {
  const char *src = getenv("BP_SOURCE_DIR");
  ck_assert_ptr_nonnull(src);
  char path[4096];
  snprintf(path, sizeof path, "%s/models/resnet8.yaml", src);
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  static char text[1 << 16], copy[1 << 16];
  size_t n = fread(text, 1, sizeof text, f);
  fclose(f);
  ck_assert_uint_gt(n, 100);
  int ok = 0;
  for (size_t len = 0; len <= n; len++) {
    bp_model *m = NULL;
    bp_status st = bp_model_parse(text, len, "cut.yaml", &m);
    if (st == BP_OK) {
      ok++;
      ck_assert_int_gt(m->layer_count, 0);
      bp_model_destroy(m);
    } else {
      ck_assert_str_ne(bp_last_error(), "");
      ck_assert_ptr_null(strchr(bp_last_error(), '\n'));
    }
  }
  ck_assert_int_ge(ok, 1); /* the whole file, at least */
  static const char junk[] = "{}[]:,-#&*!|>'\"%@` \n\t0x9-.e";
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (int round = 0; round < 3000; round++) {
    memcpy(copy, text, n);
    for (int k = 0; k < 1 + round % 4; k++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      size_t at = (size_t)(s >> 33) % n;
      copy[at] = junk[(s >> 20) % (sizeof junk - 1)];
    }
    bp_model *m = NULL;
    bp_status st = bp_model_parse(copy, n, "mangled.yaml", &m);
    if (st == BP_OK) {
      bp_model_destroy(m);
    } else {
      ck_assert_str_ne(bp_last_error(), "");
      ck_assert_ptr_null(strchr(bp_last_error(), '\n'));
    }
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("model");
  TCase *good = tcase_create("good");
  tcase_add_test(good, mlp_parses);
  tcase_add_test(good, cnn_parses);
  tcase_add_test(good, resnet8_parses);
  tcase_add_test(good, defaults_and_forms);
  suite_add_tcase(s, good);
  TCase *bad = tcase_create("bad");
  tcase_add_test(bad, yaml_syntax_errors);
  tcase_add_test(bad, empty_and_wrong_top_level);
  tcase_add_test(bad, input_section);
  tcase_add_test(bad, unknown_layer_type_and_fields);
  tcase_add_test(bad, required_fields);
  tcase_add_test(bad, wrong_value_types);
  tcase_add_test(bad, values_out_of_range);
  tcase_add_test(bad, names_and_references);
  tcase_add_test(bad, loss_placement);
  tcase_add_test(bad, train_section);
  tcase_add_test(bad, train_schedule);
  tcase_add_test(bad, missing_file);
  tcase_add_test(bad, no_crash_on_mangled_input);
  tcase_set_timeout(bad, 60);
  suite_add_tcase(s, bad);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
