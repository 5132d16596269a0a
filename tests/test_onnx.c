/* ONNX files (model_onnx.h, docs/onnx.md): a model exported with known
 * weights parses back into the same layers with the same initial values;
 * the file holds ONNX's layouts (OIHW convolutions, NCHW-flattened fc
 * weights) and the input's normalization; an op, an attribute or a file
 * blueprint cannot read is refused with one line naming the node and the
 * op. The agreement with ONNX Runtime and PyTorch is tests/onnx/. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blueprint/model_onnx.h"
#include "blueprint/model_yaml.h"
#include "onnx.pb-c.h"
#include "run_util.h"

/* ---- helpers ---------------------------------------------------------- */

static bp_model *load_shipped(const char *file) {
  const char *src = getenv("BP_SOURCE_DIR");
  ck_assert_msg(src != NULL, "BP_SOURCE_DIR is not set (run through CTest)");
  char path[4096];
  snprintf(path, sizeof path, "%s/models/%s", src, file);
  bp_model *m = NULL;
  ck_assert_msg(bp_model_load(path, &m) == BP_OK, "%s: %s", path, bp_last_error());
  return m;
}

/* The "trained" value of element i of tensor `name`: distinct per tensor
 * and position, so a permutation or a swap of two tensors shows. */
static float value_of(const char *name, uint64_t i) {
  uint32_t h = 2166136261u;
  for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 16777619u;
  return (float)((h % 1000) + 1) + (float)i * 0.001f;
}

static bp_status fake_read(void *user, const char *name, float *dst, uint64_t count) {
  (void)user;
  for (uint64_t i = 0; i < count; i++) dst[i] = value_of(name, i);
  if (strstr(name, "running_var")) /* variances are positive; keep them so */
    for (uint64_t i = 0; i < count; i++) dst[i] = 1.0f + (float)i;
  return BP_OK;
}

static const bp_onnx_export_options norm = {
    .channels = 1, .mean = {0.286f}, .std = {0.353f}, .weights = "master", .source = "test"};

static char *temp_path(const char *tag) {
  static char buf[4][256];
  static int k;
  char *p = buf[k++ % 4];
  snprintf(p, 256, "%s/test_onnx_%s_%ld.onnx", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", tag,
           (long)getpid());
  return p;
}

static uint8_t *slurp(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc((size_t)n + 1);
  ck_assert(b && fread(b, 1, (size_t)n, f) == (size_t)n);
  fclose(f);
  *size = (size_t)n;
  return b;
}

static const Onnx__TensorProto *find_initializer(const Onnx__ModelProto *mp, const char *name) {
  for (size_t i = 0; i < mp->graph->n_initializer; i++)
    if (strcmp(mp->graph->initializer[i]->name, name) == 0) return mp->graph->initializer[i];
  return NULL;
}

/* Exports model m (named `file` in messages) with fake_read, reads it
 * back: the same layers, every initial value equal. Takes m. */
static void round_trip_model(bp_model *m, const char *file) {
  const char *path = temp_path("rt");
  ck_assert_msg(bp_onnx_save(m, fake_read, NULL, &norm, path) == BP_OK, "%s", bp_last_error());
  bp_model *back = NULL;
  ck_assert_msg(bp_onnx_load(path, &back) == BP_OK, "%s", bp_last_error());
  ck_assert_int_eq(back->layer_count, m->layer_count);
  ck_assert_int_eq(back->height, m->height);
  ck_assert_int_eq(back->width, m->width);
  ck_assert_int_eq(back->channels, m->channels);
  ck_assert_int_eq(back->classes, m->classes);
  int params = 0;
  for (int i = 0; i < m->layer_count; i++) {
    const bp_layer *a = &m->layers[i], *b = &back->layers[i];
    ck_assert_msg(a->type == b->type, "%s: layer %d is %s, read back as %s", file, i,
                  bp_layer_type_name(a->type), bp_layer_type_name(b->type));
    ck_assert_str_eq(a->name, b->name); /* the exporter names nodes after the layers */
    ck_assert_int_eq(a->input_count, b->input_count);
    for (int k = 0; k < a->input_count; k++) ck_assert_int_eq(a->inputs[k], b->inputs[k]);
    if (a->type == BP_LAYER_CONV || a->type == BP_LAYER_FC) {
      ck_assert_int_eq(a->units, b->units);
      ck_assert_int_eq(a->bias, b->bias);
    }
    if (a->type != BP_LAYER_FC && a->type != BP_LAYER_SOFTMAX_CE) {
      ck_assert_int_eq(a->kernel_h, b->kernel_h);
      ck_assert_int_eq(a->kernel_w, b->kernel_w);
      ck_assert_int_eq(a->stride, b->stride);
      ck_assert_int_eq(a->pad, b->pad);
      ck_assert_int_eq(a->groups, b->groups);
    }
    if (a->type == BP_LAYER_LAYERNORM) ck_assert_float_eq(a->eps, b->eps);
    if (a->type == BP_LAYER_ATTENTION) {
      ck_assert_int_eq(a->heads, b->heads);
      ck_assert_int_eq(a->causal, b->causal);
    }
    if (a->type == BP_LAYER_BATCHNORM) {
      ck_assert_float_eq_tol(a->eps, b->eps, 1e-9);
      ck_assert_float_eq_tol(a->momentum, b->momentum, 1e-6);
    }
  }
  /* every initial value is exactly what the reader gave, in blueprint's layout */
  for (int i = 0; i < back->init_count; i++) {
    const bp_model_init *v = &back->inits[i];
    float *want = malloc((size_t)v->count * sizeof *want);
    fake_read(NULL, v->name, want, v->count);
    for (uint64_t k = 0; k < v->count; k++)
      ck_assert_msg(v->values[k] == want[k], "%s: %s[%llu] = %g, want %g", file, v->name,
                    (unsigned long long)k, (double)v->values[k], (double)want[k]);
    free(want);
    params++;
  }
  ck_assert_int_gt(params, 0);
  unlink(path);
  bp_model_destroy(back);
  bp_model_destroy(m);
}

static void round_trip(const char *file) { round_trip_model(load_shipped(file), file); }

/* ---- export, read back ---------------------------------------------------- */

START_TEST(mlp_round_trips_with_equal_weights) { round_trip("mlp.yaml"); }
END_TEST
START_TEST(cnn_round_trips_with_equal_weights) { round_trip("cnn.yaml"); }
END_TEST
START_TEST(resnet8_round_trips_with_equal_weights) { round_trip("resnet8.yaml"); }
END_TEST

START_TEST(vit_round_trips_with_equal_weights) { round_trip("vit.yaml"); }
END_TEST

/* causal attention (its mask), gelu_tanh and layernorm on 4 tokens of 8 */
START_TEST(causal_attention_round_trips) {
  static const char text[] =
      "name: causal\n"
      "input: {height: 8, width: 8, channels: 1, classes: 3}\n"
      "layers:\n"
      "  - {type: conv, name: patch, filters: 8, kernel: 4, stride: 4}\n"
      "  - {type: pos_embed, name: pos}\n"
      "  - {type: layernorm, name: ln, eps: 1e-6}\n"
      "  - {type: conv, name: qkv, filters: 24, kernel: 1}\n"
      "  - {type: attention, name: attn, heads: 2, causal: true}\n"
      "  - {type: gelu_tanh, name: act}\n"
      "  - {type: global_avgpool, name: pool}\n"
      "  - {type: fc, name: head, units: 3}\n"
      "  - {type: softmax_ce, name: loss}\n";
  bp_model *m = NULL;
  ck_assert_msg(bp_model_parse(text, strlen(text), "causal.yaml", &m) == BP_OK, "%s",
                bp_last_error());
  round_trip_model(m, "causal.yaml");
}
END_TEST

/* The vit's file: opset 17, P as [1, C, H, W], a LayerNormalization over
 * NHWC per layernorm, GELU's tanh form and attention decomposed. */
START_TEST(vit_file_holds_the_decompositions) {
  bp_model *m = load_shipped("vit.yaml");
  const char *path = temp_path("vitfile");
  ck_assert_msg(bp_onnx_save(m, fake_read, NULL, &norm, path) == BP_OK, "%s", bp_last_error());
  size_t size = 0;
  uint8_t *bytes = slurp(path, &size);
  Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, size, bytes);
  ck_assert(mp != NULL);
  ck_assert_int_eq(mp->opset_import[0]->version, 17);
  ck_assert_int_eq(mp->ir_version, 8);
  /* pos: blueprint [1, 7, 7, 64] -> ONNX [1, 64, 7, 7] */
  const Onnx__TensorProto *p = find_initializer(mp, "pos.weight");
  ck_assert(p && p->n_dims == 4 && p->dims[0] == 1 && p->dims[1] == 64 && p->dims[2] == 7 &&
            p->dims[3] == 7);
  const float *pv = (const float *)(const void *)p->raw_data.data;
  for (int c = 0; c < 64; c += 5)
    for (int y = 0; y < 7; y++)
      for (int x = 0; x < 7; x += 2)
        ck_assert_float_eq(pv[(c * 7 + y) * 7 + x],
                           value_of("pos.weight", (uint64_t)((y * 7 + x) * 64 + c)));
  const Onnx__TensorProto *g = find_initializer(mp, "b2_ln1.weight");
  ck_assert(g && g->n_dims == 1 && g->dims[0] == 64);
  ck_assert_float_eq(((const float *)(const void *)g->raw_data.data)[3],
                     value_of("b2_ln1.weight", 3));
  int ln = 0, split = 0, softmax = 0, tanh_ = 0, conv = 0;
  for (size_t i = 0; i < mp->graph->n_node; i++) {
    const char *op = mp->graph->node[i]->op_type;
    ln += !strcmp(op, "LayerNormalization");
    split += !strcmp(op, "Split") && mp->graph->node[i]->n_output == 3;
    softmax += !strcmp(op, "Softmax");
    tanh_ += !strcmp(op, "Tanh");
    conv += !strcmp(op, "Conv");
  }
  ck_assert_int_eq(ln, 9);
  ck_assert_int_eq(split, 4);
  ck_assert_int_eq(softmax, 4);
  ck_assert_int_eq(tanh_, 4);
  ck_assert_int_eq(conv, 17); /* the patch conv and 16 token-wise 1x1 convs */
  onnx__model_proto__free_unpacked(mp, NULL);
  free(bytes);
  unlink(path);
  bp_model_destroy(m);
}
END_TEST

/* The file itself: OIHW conv weights, the fc weight in NCHW flattening,
 * BatchNormalization with the running statistics, the metadata. */
START_TEST(file_holds_onnx_layouts_and_the_normalization) {
  bp_model *m = load_shipped("cnn.yaml");
  const char *path = temp_path("layout");
  ck_assert_msg(bp_onnx_save(m, fake_read, NULL, &norm, path) == BP_OK, "%s", bp_last_error());
  size_t size = 0;
  uint8_t *bytes = slurp(path, &size);
  Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, size, bytes);
  ck_assert_msg(mp != NULL, "the exported file does not parse as an ONNX ModelProto");
  ck_assert_int_eq(mp->n_opset_import, 1);
  ck_assert_int_eq(mp->opset_import[0]->version, 17);
  /* conv2: blueprint [32, 3, 3, 32] -> ONNX [32, 32, 3, 3] */
  const Onnx__TensorProto *w = find_initializer(mp, "conv2.w");
  ck_assert(w && w->n_dims == 4 && w->dims[0] == 32 && w->dims[1] == 32 && w->dims[2] == 3 &&
            w->dims[3] == 3);
  const float *wv = (const float *)(const void *)w->raw_data.data;
  for (int o = 0; o < 32; o += 7)
    for (int c = 0; c < 32; c += 5)
      for (int y = 0; y < 3; y++)
        for (int x = 0; x < 3; x++)
          ck_assert_float_eq(wv[((o * 32 + c) * 3 + y) * 3 + x],
                             value_of("conv2.w", (uint64_t)(((o * 3 + y) * 3 + x) * 32 + c)));
  /* fc: blueprint [10, 7*7*64] in (h, w, c) order -> ONNX [10, 64*7*7] in (c, h, w) */
  const Onnx__TensorProto *f = find_initializer(mp, "fc.w");
  ck_assert(f && f->n_dims == 2 && f->dims[0] == 10 && f->dims[1] == 3136);
  const float *fv = (const float *)(const void *)f->raw_data.data;
  for (int o = 0; o < 10; o += 3)
    for (int c = 0; c < 64; c += 9)
      for (int y = 0; y < 7; y += 2)
        for (int x = 0; x < 7; x += 3)
          ck_assert_float_eq(fv[o * 3136 + (c * 7 + y) * 7 + x],
                             value_of("fc.w", (uint64_t)(o * 3136 + (y * 7 + x) * 64 + c)));
  int bn = 0, flatten = 0;
  for (size_t i = 0; i < mp->graph->n_node; i++) {
    const Onnx__NodeProto *n = mp->graph->node[i];
    if (strcmp(n->op_type, "BatchNormalization") == 0) {
      ck_assert_int_eq(n->n_input, 5);
      bn++;
    }
    flatten += strcmp(n->op_type, "Flatten") == 0;
  }
  ck_assert_int_eq(bn, 4);
  ck_assert_int_eq(flatten, 1);
  int seen = 0;
  for (size_t i = 0; i < mp->n_metadata_props; i++) {
    const Onnx__StringStringEntryProto *e = mp->metadata_props[i];
    if (strcmp(e->key, "input_mean") == 0) seen += fabs(atof(e->value) - 0.286) < 1e-6;
    if (strcmp(e->key, "input_std") == 0) seen += fabs(atof(e->value) - 0.353) < 1e-6;
  }
  ck_assert_int_eq(seen, 2);
  onnx__model_proto__free_unpacked(mp, NULL);
  free(bytes);
  unlink(path);
  bp_model_destroy(m);
}
END_TEST

/* ---- refusals ------------------------------------------------------------- */

/* cnn exported, then `edit` applied to its message; parsing the result
 * fails with `want` and a one-line message holding every needle. */
static void expect_refused_(const char *file, void (*edit)(Onnx__ModelProto *), bp_status want,
                            const char *const *needles, int line) {
  bp_model *m = load_shipped(file);
  const char *path = temp_path("edit");
  ck_assert(bp_onnx_save(m, fake_read, NULL, &norm, path) == BP_OK);
  size_t size = 0;
  uint8_t *bytes = slurp(path, &size);
  Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, size, bytes);
  ck_assert(mp != NULL);
  edit(mp);
  size_t n = onnx__model_proto__get_packed_size(mp);
  uint8_t *out = malloc(n);
  onnx__model_proto__pack(mp, out);
  bp_model *got = (bp_model *)(uintptr_t)0x1;
  bp_status st = bp_onnx_parse(out, n, "edited.onnx", &got);
  const char *msg = bp_last_error();
  ck_assert_msg(st == want, "line %d: status %s, want %s (%s)", line, bp_status_str(st),
                bp_status_str(want), msg);
  ck_assert_msg(got == (bp_model *)(uintptr_t)0x1, "line %d: output written on failure", line);
  ck_assert_msg(strchr(msg, '\n') == NULL, "line %d: not one line: %s", line, msg);
  for (int i = 0; needles[i]; i++)
    ck_assert_msg(strstr(msg, needles[i]) != NULL, "line %d: message lacks \"%s\": %s", line,
                  needles[i], msg);
  free(out);
  /* the edits point into static storage: free only what unpack made */
  onnx__model_proto__free_unpacked(mp, NULL);
  free(bytes);
  unlink(path);
  bp_model_destroy(m);
}

#define EXPECT_REFUSED_IN(file, edit, want, ...)                 \
  do {                                                           \
    const char *needles_[] = {__VA_ARGS__, NULL};                \
    expect_refused_((file), (edit), (want), needles_, __LINE__); \
  } while (0)
#define EXPECT_REFUSED(edit, want, ...) EXPECT_REFUSED_IN("cnn.yaml", edit, want, __VA_ARGS__)

static Onnx__NodeProto *node_of(Onnx__ModelProto *mp, const char *op) {
  for (size_t i = 0; i < mp->graph->n_node; i++)
    if (strcmp(mp->graph->node[i]->op_type, op) == 0) return mp->graph->node[i];
  ck_abort_msg("no %s node", op);
  return NULL;
}

/* Replacing a string a message owns: copy, so free_unpacked frees ours. */
static char *str_copy(const char *s) {
  char *d = malloc(strlen(s) + 1);
  strcpy(d, s);
  return d;
}

static void relu_to_sigmoid(Onnx__ModelProto *mp) {
  Onnx__NodeProto *n = node_of(mp, "Relu");
  free(n->op_type);
  n->op_type = str_copy("Sigmoid");
}

static void maxpool_ceil_mode(Onnx__ModelProto *mp) {
  Onnx__NodeProto *n = node_of(mp, "MaxPool");
  for (size_t i = 0; i < n->n_attribute; i++)
    if (strcmp(n->attribute[i]->name, "strides") == 0) { /* strides -> ceil_mode = 1 */
      Onnx__AttributeProto *a = n->attribute[i];
      free(a->name);
      a->name = str_copy("ceil_mode");
      a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
      a->has_i = 1, a->i = 1;
      free(a->ints);
      a->ints = NULL, a->n_ints = 0;
    }
}

static void conv_unknown_attribute(Onnx__ModelProto *mp) {
  Onnx__NodeProto *n = node_of(mp, "Conv");
  free(n->attribute[0]->name);
  n->attribute[0]->name = str_copy("frobnicate");
}

static void conv_asymmetric_pads(Onnx__ModelProto *mp) {
  Onnx__NodeProto *n = node_of(mp, "Conv");
  for (size_t i = 0; i < n->n_attribute; i++)
    if (strcmp(n->attribute[i]->name, "pads") == 0) n->attribute[i]->ints[3] = 0;
}

static void conv_weight_not_an_initializer(Onnx__ModelProto *mp) {
  Onnx__NodeProto *n = node_of(mp, "Conv");
  free(n->input[1]);
  n->input[1] = str_copy("nowhere");
}

static void no_output(Onnx__ModelProto *mp) {
  for (size_t i = 0; i < mp->graph->n_output; i++)
    onnx__value_info_proto__free_unpacked(mp->graph->output[i], NULL);
  mp->graph->n_output = 0;
}

/* ---- the vit's decompositions, malformed ---- */

static Onnx__NodeProto *node_named(Onnx__ModelProto *mp, const char *name) {
  for (size_t i = 0; i < mp->graph->n_node; i++)
    if (strcmp(mp->graph->node[i]->name, name) == 0) return mp->graph->node[i];
  ck_abort_msg("no node %s", name);
  return NULL;
}

static float *initializer_floats(Onnx__ModelProto *mp, const char *name) {
  const Onnx__TensorProto *t = find_initializer(mp, name);
  ck_assert_msg(t && t->has_raw_data, "no initializer %s", name);
  return (float *)(void *)t->raw_data.data;
}

static void attention_scale_wrong(Onnx__ModelProto *mp) {
  *initializer_floats(mp, "b1_attn.scale") = 0.5f; /* 1/sqrt(16) = 0.25 */
}

static void attention_perm_wrong(Onnx__ModelProto *mp) {
  Onnx__NodeProto *n = node_named(mp, "b2_attn.q_tokens");
  n->attribute[0]->ints[2] = 2, n->attribute[0]->ints[3] = 3;
}

static void attention_softmax_replaced(Onnx__ModelProto *mp) {
  Onnx__NodeProto *n = node_named(mp, "b1_attn.probs");
  free(n->op_type);
  n->op_type = str_copy("Relu");
}

static void attention_heads_not_dividing(Onnx__ModelProto *mp) {
  const Onnx__TensorProto *t = find_initializer(mp, "b1_attn.shape_heads");
  ((int64_t *)(void *)t->raw_data.data)[1] = 5; /* 5 heads of 64 channels */
}

static void attention_step_read_outside(Onnx__ModelProto *mp) {
  Onnx__NodeProto *n = node_named(mp, "b1_proj"); /* reads the probabilities, not the result */
  free(n->input[0]);
  n->input[0] = str_copy("b1_attn.probs");
}

static void layernorm_axis_wrong(Onnx__ModelProto *mp) {
  Onnx__NodeProto *n = node_named(mp, "b1_ln2.norm");
  for (size_t i = 0; i < n->n_attribute; i++)
    if (!strcmp(n->attribute[i]->name, "axis")) n->attribute[i]->i = 1;
}

static void layernorm_alone(Onnx__ModelProto *mp) {
  Onnx__NodeProto *n = node_named(mp, "b1_ln1.nhwc"); /* the Transpose becomes an Identity */
  free(n->op_type);
  n->op_type = str_copy("Identity");
  for (size_t i = 0; i < n->n_attribute; i++)
    onnx__attribute_proto__free_unpacked(n->attribute[i], NULL);
  n->n_attribute = 0;
}

static void gelu_constant_wrong(Onnx__ModelProto *mp) {
  *initializer_floats(mp, "b3_gelu.c_cube") = 0.05f;
}

START_TEST(malformed_vit_patterns_name_node_op_and_what_is_missing) {
  EXPECT_REFUSED_IN("vit.yaml", attention_scale_wrong, BP_ERR_UNSUPPORTED,
                    "'b1_attn.scaled' (Mul): attention", "1/sqrt(D/heads)");
  EXPECT_REFUSED_IN("vit.yaml", attention_perm_wrong, BP_ERR_UNSUPPORTED,
                    "'b2_attn.q_tokens' (Transpose): attention", "perm must be [0, 1, 3, 2]");
  EXPECT_REFUSED_IN("vit.yaml", attention_softmax_replaced, BP_ERR_UNSUPPORTED,
                    "'b1_attn.probs' (Relu): attention", "expected Softmax");
  EXPECT_REFUSED_IN("vit.yaml", attention_heads_not_dividing, BP_ERR_UNSUPPORTED,
                    "'b1_attn.q_heads' (Reshape)", "heads dividing D");
  EXPECT_REFUSED_IN("vit.yaml", attention_step_read_outside, BP_ERR_UNSUPPORTED,
                    "'b1_proj' (Conv): reads 'b1_attn.probs', a step inside attention");
  EXPECT_REFUSED_IN("vit.yaml", layernorm_axis_wrong, BP_ERR_UNSUPPORTED,
                    "'b1_ln2.norm' (LayerNormalization): layer norm", "axis must be the last");
  EXPECT_REFUSED_IN("vit.yaml", layernorm_alone, BP_ERR_UNSUPPORTED,
                    "'b1_ln1.norm' (LayerNormalization): layer norm", "expected Transpose");
  EXPECT_REFUSED_IN("vit.yaml", gelu_constant_wrong, BP_ERR_UNSUPPORTED,
                    "'b3_gelu.cube_scaled' (Mul): GELU's tanh form", "0.044715");
}
END_TEST

/* b1_gelu's nine nodes replaced by one Gelu (opset 20) with `approximate`. */
static Onnx__ModelProto *vit_with_gelu_node(uint8_t **bytes, const char *approximate) {
  bp_model *m = load_shipped("vit.yaml");
  const char *path = temp_path("gelu");
  ck_assert(bp_onnx_save(m, fake_read, NULL, &norm, path) == BP_OK);
  bp_model_destroy(m);
  size_t size = 0;
  *bytes = slurp(path, &size);
  unlink(path);
  Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, size, *bytes);
  ck_assert(mp != NULL);
  Onnx__GraphProto *g = mp->graph;
  size_t first = 0, kept = 0;
  while (strcmp(g->node[first]->name, "b1_gelu.square") != 0) first++;
  Onnx__NodeProto *n = g->node[first];
  free(n->op_type);
  n->op_type = str_copy("Gelu");
  n->n_input = 1; /* x, x -> x */
  free(n->input[1]);
  free(n->output[0]);
  n->output[0] = str_copy("b1_gelu");
  Onnx__AttributeProto *a = malloc(sizeof *a);
  onnx__attribute_proto__init(a);
  a->name = str_copy("approximate");
  a->has_type = 1, a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
  a->has_s = 1, a->s.len = strlen(approximate), a->s.data = (uint8_t *)str_copy(approximate);
  n->attribute = malloc(sizeof *n->attribute);
  n->attribute[0] = a, n->n_attribute = 1;
  for (size_t i = 0; i < g->n_node; i++) {
    if (i > first && i <= first + 8)
      onnx__node_proto__free_unpacked(g->node[i], NULL);
    else
      g->node[kept++] = g->node[i];
  }
  g->n_node = kept;
  return mp;
}

static bp_status parse_message(Onnx__ModelProto *mp, bp_model **out) {
  size_t n = onnx__model_proto__get_packed_size(mp);
  uint8_t *b = malloc(n);
  onnx__model_proto__pack(mp, b);
  bp_status st = bp_onnx_parse(b, n, "gelu.onnx", out);
  free(b);
  return st;
}

START_TEST(gelu_node_of_opset_20_is_read) {
  uint8_t *bytes;
  Onnx__ModelProto *mp = vit_with_gelu_node(&bytes, "tanh");
  bp_model *m = NULL;
  ck_assert_msg(parse_message(mp, &m) == BP_OK, "%s", bp_last_error());
  int tanh_form = 0;
  for (int i = 0; i < m->layer_count; i++) tanh_form += m->layers[i].type == BP_LAYER_GELU_TANH;
  ck_assert_int_eq(tanh_form, 4);
  ck_assert_int_eq(m->layers[9].type, BP_LAYER_GELU_TANH);
  ck_assert_str_eq(m->layers[9].name, "b1_gelu_square"); /* named after the Gelu node */
  bp_model_destroy(m);
  onnx__model_proto__free_unpacked(mp, NULL);
  free(bytes);
  mp = vit_with_gelu_node(&bytes, "erf");
  m = NULL;
  ck_assert_int_eq(parse_message(mp, &m), BP_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(bp_last_error(), "'b1_gelu.square' (Gelu): approximate must be"),
                "%s", bp_last_error());
  ck_assert(m == NULL);
  onnx__model_proto__free_unpacked(mp, NULL);
  free(bytes);
}
END_TEST

START_TEST(unsupported_op_names_node_and_op) {
  EXPECT_REFUSED(relu_to_sigmoid, BP_ERR_UNSUPPORTED, "edited.onnx: node 2 'relu1' (Sigmoid)",
                 "no such op", "Conv, BatchNormalization");
}
END_TEST

START_TEST(unsupported_attribute_names_node_op_and_attribute) {
  EXPECT_REFUSED(maxpool_ceil_mode, BP_ERR_UNSUPPORTED, "node 6 'pool1' (MaxPool)", "ceil_mode=1");
  EXPECT_REFUSED(conv_unknown_attribute, BP_ERR_UNSUPPORTED, "'conv1' (Conv)",
                 "attribute 'frobnicate' is not supported", "kernel_shape");
  EXPECT_REFUSED(conv_asymmetric_pads, BP_ERR_UNSUPPORTED, "'conv1' (Conv)", "pads");
  EXPECT_REFUSED(conv_weight_not_an_initializer, BP_ERR_UNSUPPORTED, "'conv1' (Conv)",
                 "'nowhere' must be an initializer");
  EXPECT_REFUSED(no_output, BP_ERR_UNSUPPORTED, "edited.onnx", "one output");
}
END_TEST

START_TEST(malformed_files_are_parse_errors) {
  bp_model *m = (bp_model *)(uintptr_t)0x1;
  static const char junk[] = "\xff\xff\xff\xff not a protobuf";
  ck_assert_int_eq(bp_onnx_parse(junk, sizeof junk, "junk.onnx", &m), BP_ERR_PARSE);
  ck_assert_msg(strstr(bp_last_error(), "junk.onnx: not an ONNX model"), "%s", bp_last_error());
  ck_assert_int_eq(bp_onnx_parse("", 0, "empty.onnx", &m), BP_ERR_PARSE); /* no graph */
  /* every truncation of a real file fails cleanly (or, if protobuf accepts
   * the prefix, is refused as a graph) and never crashes */
  bp_model *cnn = load_shipped("cnn.yaml");
  const char *path = temp_path("trunc");
  ck_assert(bp_onnx_save(cnn, fake_read, NULL, &norm, path) == BP_OK);
  size_t size = 0;
  uint8_t *bytes = slurp(path, &size);
  for (size_t cut = 1; cut < size; cut += size / 97 + 1) {
    bp_status st = bp_onnx_parse(bytes, cut, "cut.onnx", &m);
    ck_assert_msg(st != BP_OK, "a file cut at %zu of %zu bytes parsed", cut, size);
  }
  ck_assert(m == (bp_model *)(uintptr_t)0x1);
  bp_model *missing = NULL;
  ck_assert_int_eq(bp_onnx_load("/nonexistent/x.onnx", &missing), BP_ERR_IO);
  free(bytes);
  unlink(path);
  bp_model_destroy(cnn);
}
END_TEST

START_TEST(model_files_dispatch_on_the_extension) {
  ck_assert(bp_model_path_is_onnx("a/b.onnx"));
  ck_assert(!bp_model_path_is_onnx("a/b.yaml"));
  ck_assert(!bp_model_path_is_onnx(".onnx"));
  ck_assert(bp_onnx_available());
}
END_TEST

/* Training settings come from "<name>.train.yaml" beside the file. */
START_TEST(settings_beside_the_file_are_read) {
  bp_model *m = load_shipped("mlp.yaml");
  char path[300], settings[320];
  snprintf(path, sizeof path, "%s", temp_path("settings"));
  snprintf(settings, sizeof settings, "%.*s.train.yaml", (int)(strlen(path) - 5), path);
  ck_assert(bp_onnx_save(m, fake_read, NULL, &norm, path) == BP_OK);
  bp_model *got = NULL;
  ck_assert_msg(bp_model_load_file(path, NULL, &got) == BP_OK, "%s", bp_last_error());
  ck_assert_int_eq(got->train.batch, 128); /* none beside it: the defaults */
  bp_model_destroy(got);
  FILE *f = fopen(settings, "w");
  ck_assert(f != NULL);
  fputs("train: {batch: 64, lr: 0.01, optimizer: adamw}\n", f);
  fclose(f);
  ck_assert_msg(bp_model_load_file(path, NULL, &got) == BP_OK, "%s", bp_last_error());
  ck_assert_int_eq(got->train.batch, 64);
  ck_assert_int_eq(got->train.optimizer, BP_OPT_ADAMW);
  ck_assert(fabs(got->train.lr - 0.01) < 1e-12);
  ck_assert_int_eq(got->train.eval_batch, 200);
  bp_model_destroy(got);
  f = fopen(settings, "w");
  fputs("layers: []\n", f);
  fclose(f);
  got = NULL;
  ck_assert_int_eq(bp_model_load_file(path, NULL, &got), BP_ERR_INVALID);
  ck_assert_msg(strstr(bp_last_error(), "take only 'train'") != NULL, "%s", bp_last_error());
  ck_assert(got == NULL);
  unlink(settings);
  unlink(path);
  bp_model_destroy(m);
}
END_TEST

/* ---- the command line ------------------------------------------------------ */

/* export, then eval of the ONNX file (its initializers) and of the
 * checkpoint print the same loss and accuracy; train of an edited file
 * refuses the node in one line; export's own mistakes are exit 2. */
START_TEST(cli_export_round_trips_and_refuses_in_one_line) {
  static const char model[] =
      "name: small\n"
      "input: {height: 28, width: 28, channels: 1, classes: 10}\n"
      "layers:\n"
      "  - {type: conv, name: conv1, filters: 4, kernel: 3, pad: 1, bias: false}\n"
      "  - {type: batchnorm, name: bn1}\n"
      "  - {type: relu, name: relu1}\n"
      "  - {type: maxpool, name: pool1, kernel: 2}\n"
      "  - {type: fc, name: fc, units: 10}\n"
      "  - {type: softmax_ce, name: loss}\n" /* no label smoothing: an ONNX file has no loss */
      "train: {batch: 32, eval_batch: 50, epochs: 1}\n";
  toy_env e = toy_env_open(model, 256, 100, 7);
  char *ck = path_in(e.dir, "m.ckpt"), *onnx = path_in(e.dir, "m.onnx");
  run_result r = RUN("train", e.model, "--data", e.data, "--checkpoint", ck, "--quiet");
  ck_assert_msg(r.status == 0, "train: %s", r.err);
  run_free(&r);
  r = RUN("export", e.model, "--checkpoint", ck, "--data", e.data, "-o", onnx);
  ck_assert_msg(r.status == 0, "export: %s", r.err);
  ck_assert_msg(strstr(r.out, "wrote ") != NULL, "%s", r.out);
  run_free(&r);
  run_result a = RUN("eval", e.model, "--checkpoint", ck, "--data", e.data, "--quiet");
  run_result b =
      RUN("eval", onnx, "--data", e.data, "--quiet", "--batch", "32", "--eval-batch", "50");
  ck_assert_msg(a.status == 0 && b.status == 0, "eval: %s / %s", a.err, b.err);
  const char *la = strstr(a.out, "test loss"), *lb = strstr(b.out, "test loss");
  ck_assert(la && lb);
  ck_assert_msg(strncmp(la, lb, strcspn(la, "(")) == 0, "checkpoint: %s\nONNX file: %s", la, lb);
  run_free(&a);
  run_free(&b);
  /* the ONNX file's normalization is the toy set's own, in its metadata */
  size_t size = 0;
  uint8_t *bytes = slurp(onnx, &size);
  Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, size, bytes);
  ck_assert(mp != NULL);
  int mean_seen = 0;
  for (size_t i = 0; i < mp->n_metadata_props; i++)
    mean_seen += strcmp(mp->metadata_props[i]->key, "input_mean") == 0 &&
                 fabs(atof(mp->metadata_props[i]->value) - 0.286) > 1e-3;
  ck_assert_msg(mean_seen == 1, "the toy set's mean is not Fashion-MNIST's");
  /* an op blueprint lacks: one line naming the node and the op */
  relu_to_sigmoid(mp);
  size_t n = onnx__model_proto__get_packed_size(mp);
  uint8_t *out = malloc(n);
  onnx__model_proto__pack(mp, out);
  char *bad = path_in(e.dir, "bad.onnx");
  write_file(bad, out, n);
  r = RUN("train", bad, "--data", e.data);
  ck_assert_int_eq(r.status, 1);
  expect_one_line_error(&r, "blueprint train: ", "'relu1' (Sigmoid): blueprint has no such op");
  run_free(&r);
  r = RUN("eval", bad, "--data", e.data);
  ck_assert_int_eq(r.status, 1);
  expect_one_line_error(&r, "blueprint eval: ", "(Sigmoid)");
  run_free(&r);
  /* export's own mistakes */
  r = RUN("export", e.model, "--checkpoint", ck);
  ck_assert_int_eq(r.status, 2);
  expect_one_line_error(&r, "blueprint export: ", "-o FILE is required");
  run_free(&r);
  r = RUN("export", e.model, "--checkpoint", ck, "-o", ck);
  ck_assert_int_eq(r.status, 2);
  expect_one_line_error(&r, "blueprint export: ", "nothing was written");
  run_free(&r);
  r = RUN("export", e.model, "-o", onnx);
  ck_assert_int_eq(r.status, 2);
  expect_one_line_error(&r, "blueprint export: ", "--checkpoint");
  run_free(&r);
  free(out);
  free(bad);
  onnx__model_proto__free_unpacked(mp, NULL);
  free(bytes);
  free(ck);
  free(onnx);
  toy_env_close(&e);
}
END_TEST

int main(void) {
  Suite *s = suite_create("onnx");
  TCase *good = tcase_create("export_import");
  tcase_add_test(good, mlp_round_trips_with_equal_weights);
  tcase_add_test(good, cnn_round_trips_with_equal_weights);
  tcase_add_test(good, resnet8_round_trips_with_equal_weights);
  tcase_add_test(good, vit_round_trips_with_equal_weights);
  tcase_add_test(good, causal_attention_round_trips);
  tcase_add_test(good, vit_file_holds_the_decompositions);
  tcase_add_test(good, gelu_node_of_opset_20_is_read);
  tcase_add_test(good, file_holds_onnx_layouts_and_the_normalization);
  tcase_add_test(good, model_files_dispatch_on_the_extension);
  tcase_add_test(good, settings_beside_the_file_are_read);
  tcase_set_timeout(good, 120);
  suite_add_tcase(s, good);
  TCase *bad = tcase_create("refusals");
  tcase_add_test(bad, unsupported_op_names_node_and_op);
  tcase_add_test(bad, unsupported_attribute_names_node_op_and_attribute);
  tcase_add_test(bad, malformed_files_are_parse_errors);
  tcase_add_test(bad, malformed_vit_patterns_name_node_op_and_what_is_missing);
  tcase_set_timeout(bad, 120);
  suite_add_tcase(s, bad);
  TCase *cli = tcase_create("cli"); /* runs the built blueprint and its modules */
  tcase_add_test(cli, cli_export_round_trips_and_refuses_in_one_line);
  tcase_set_timeout(cli, 300);
  suite_add_tcase(s, cli);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
