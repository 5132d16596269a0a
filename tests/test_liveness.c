/* Liveness packing of the feature and gradient slots (core/src/liveness.c,
 * plan.h invariant 8, docs/plan.md): every shipped model under every
 * option packs and passes the check, a corrupted layout or a graph that
 * does not fit the ranges is refused, and training on a packed plan ends
 * with the same bits as on the plan without reuse. */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/graph.h"
#include "blueprint/model.h"
#include "blueprint/model_yaml.h"
#include "blueprint/plan.h"
#include "blueprint/train.h"
#include "plan-impl.h"
#include "run_util.h"
#include "test_env.h"

static bp_model *load(const char *path) {
  bp_model *m = NULL;
  ck_assert_msg(bp_model_load(path, &m) == BP_OK, "%s", bp_last_error());
  return m;
}

static bp_plan *compile(const bp_model *m, bp_plan_options po, int no_reuse) {
  bp_compile_options o = bp_compile_options_from_model(m);
  o.plan = po;
  o.no_reuse = no_reuse;
  o.eval_size = 10001; /* an eval_last variant too */
  bp_plan *p = NULL;
  ck_assert_msg(bp_model_compile(m, &o, &p) == BP_OK, "%s", bp_last_error());
  return p;
}

static bp_graph *graph_of(const bp_model *m, const bp_plan *p, bp_status *st) {
  bp_graph_options go;
  bp_graph_options_init(&go);
  go.global_batch = m->train.batch;
  go.train_size = m->train.train_size;
  bp_graph *g = NULL;
  *st = bp_graph_build(m, p, &go, &g);
  return g;
}

static int live_at(bp_live_range r, int32_t k) { return r.first >= 0 && r.first <= k && k <= r.last; }

/* By brute force, apart from bp_plan_check: two packed tensors that share
 * a byte are never live together, and every node of the unpacked plan's
 * graph touches its packed tensors inside their live ranges. */
static void assert_sound(const bp_model *m, const bp_plan *packed, const bp_plan *plain) {
  const int32_t n = bp_plan_tensor_count(packed);
  const int nv = bp_plan_variant_count(packed);
  for (int32_t a = 0; a < n; a++) {
    const bp_dtensor *x = bp_plan_tensor(packed, 0, a);
    if (!bp_region_is_packed(x->region)) {
      ck_assert_msg(bp_plan_live_range(packed, 0, a).first == -1, "'%s' has a range", x->name);
      continue;
    }
    for (int32_t b = a + 1; b < n; b++) {
      const bp_dtensor *y = bp_plan_tensor(packed, 0, b);
      if (!bp_region_is_packed(y->region) || y->offset >= x->offset + x->slot_bytes ||
          x->offset >= y->offset + y->slot_bytes)
        continue;
      for (int v = 0; v < nv; v++) {
        const bp_live_range rx = bp_plan_live_range(packed, v, a),
                            ry = bp_plan_live_range(packed, v, b);
        ck_assert_msg(rx.first < 0 || ry.first < 0 || rx.last < ry.first || ry.last < rx.first,
                      "'%s' and '%s' share bytes and are live together in '%s'", x->name,
                      y->name, bp_plan_variant(packed, v)->name);
      }
    }
  }
  bp_status st;
  bp_graph *g = graph_of(m, plain, &st);
  ck_assert_msg(st == BP_OK, "%s", bp_last_error());
  for (int v = 0; v < nv; v++) {
    int32_t k = 0;
    for (int s = 0; s < BP_SEGMENT_COUNT; s++)
      for (int i = 0; i < bp_graph_node_count(g, v, (bp_segment)s); i++, k++) {
        const bp_node *node = bp_graph_node(g, v, (bp_segment)s, i);
        for (int j = 0; j < node->num_inputs + node->num_outputs; j++) {
          const bp_node_tensor *t =
              j < node->num_inputs ? &node->inputs[j] : &node->outputs[j - node->num_inputs];
          if (t->id < 0 || !bp_region_is_packed(bp_plan_tensor(plain, 0, t->id)->region)) continue;
          ck_assert_msg(live_at(bp_plan_live_range(packed, v, t->id), k),
                        "node '%s' (%s, node %d) touches '%s' outside its range", node->name,
                        bp_plan_variant(packed, v)->name, (int)k,
                        bp_plan_tensor(plain, 0, t->id)->name);
        }
      }
  }
  bp_graph_destroy(g);
  /* and the graph of the packed plan builds: bp_liveness_check_graph passes */
  g = graph_of(m, packed, &st);
  ck_assert_msg(st == BP_OK, "%s", bp_last_error());
  bp_graph_destroy(g);
}

START_TEST(every_shipped_model_packs_under_every_option) {
  char **models = shipped_models();
  static const bp_plan_options opts[] = {
      {0, 0, BP_OPT_SGD},   {1, 0, BP_OPT_SGD},   {0, 1, BP_OPT_SGD}, {1, 1, BP_OPT_SGD},
      {0, 0, BP_OPT_ADAMW}, {1, 1, BP_OPT_ADAMW}, {0, 0, BP_OPT_LARS}, {1, 0, BP_OPT_LARS},
  };
  for (int i = 0; models[i]; i++) {
    bp_model *m = load(models[i]);
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; k++) {
      bp_plan *packed = compile(m, opts[k], 0), *plain = compile(m, opts[k], 1);
      ck_assert_msg(bp_plan_check(packed) == BP_OK, "%s", bp_last_error());
      ck_assert(bp_plan_is_packed(packed));
      ck_assert(!bp_plan_is_packed(plain));
      ck_assert_uint_eq(bp_plan_unpacked_bytes(packed), bp_plan_total_bytes(plain));
      ck_assert_uint_eq(bp_plan_unpacked_bytes(plain), bp_plan_total_bytes(plain));
      ck_assert_uint_lt(bp_plan_total_bytes(packed), bp_plan_total_bytes(plain));
      /* only the F regions change */
      for (int r = 0; r < BP_REGION_COUNT; r++)
        if (!bp_region_is_packed((bp_region)r))
          ck_assert_uint_eq(bp_plan_region_span(packed, (bp_region)r).bytes,
                            bp_plan_region_span(plain, (bp_region)r).bytes);
      assert_sound(m, packed, plain);
      printf("%-8s %-5s amp %d ema %d: arena %" PRIu64 " bytes (%.2f MiB), without reuse %" PRIu64
             " (%.2f MiB)\n",
             m->name, bp_optimizer_name(opts[k].optimizer), opts[k].amp, opts[k].ema,
             bp_plan_total_bytes(packed), (double)bp_plan_total_bytes(packed) / 1048576.0,
             bp_plan_total_bytes(plain), (double)bp_plan_total_bytes(plain) / 1048576.0);
      /* the CNN's arena drops to 40% or less */
      if (strcmp(m->name, "cnn") == 0 && !opts[k].amp && !opts[k].ema &&
          opts[k].optimizer == BP_OPT_SGD)
        ck_assert_uint_le(bp_plan_total_bytes(packed) * 10, bp_plan_total_bytes(plain) * 4);
      bp_plan_destroy(packed);
      bp_plan_destroy(plain);
    }
    bp_model_destroy(m);
  }
  shipped_models_free(models);
}
END_TEST

/* The packed offsets of `p` (region-relative) and its ranges, malloc'ed. */
static uint64_t *packed_offsets(const bp_plan *p, bp_live_range **live_out) {
  const int32_t n = bp_plan_tensor_count(p);
  const int nv = bp_plan_variant_count(p);
  uint64_t *rel = calloc((size_t)n, sizeof *rel);
  bp_live_range *live = calloc((size_t)n * (size_t)nv, sizeof *live);
  for (int32_t id = 0; id < n; id++) {
    const bp_dtensor *t = bp_plan_tensor(p, 0, id);
    rel[id] = t->offset - bp_plan_region_span(p, t->region).offset;
    for (int v = 0; v < nv; v++) live[(size_t)v * (size_t)n + (size_t)id] = bp_plan_live_range(p, v, id);
  }
  *live_out = live;
  return rel;
}

static void expect_invariant_8(bp_status st) {
  ck_assert_int_eq(st, BP_ERR_STATE);
  ck_assert_msg(strstr(bp_last_error(), "invariant 8") != NULL, "%s", bp_last_error());
}

/* bp_plan_pack reproduces the compiler's layout, and refuses one where two
 * tensors live together share bytes: everything at 0, or one tensor moved
 * onto another it is live with. */
START_TEST(a_corrupt_layout_fails_the_check) {
  char **models = shipped_models();
  for (int i = 0; models[i]; i++) {
    bp_model *m = load(models[i]);
    const bp_plan_options po = {0, 0, BP_OPT_SGD};
    bp_plan *packed = compile(m, po, 0);
    bp_live_range *live;
    uint64_t *rel = packed_offsets(packed, &live);
    bp_plan *again = compile(m, po, 1);
    ck_assert_msg(bp_plan_pack(again, rel, live) == BP_OK, "%s", bp_last_error());
    ck_assert_uint_eq(bp_plan_total_bytes(again), bp_plan_total_bytes(packed));
    bp_plan_destroy(again);

    const int32_t n = bp_plan_tensor_count(packed);
    uint64_t *zero = calloc((size_t)n, sizeof *zero);
    bp_plan *bad = compile(m, po, 1);
    expect_invariant_8(bp_plan_pack(bad, zero, live));
    bp_plan_destroy(bad);

    /* the first two F32 tensors live together at one node: b onto a */
    int32_t a = -1, b = -1;
    for (int32_t x = 0; x < n && b < 0; x++)
      for (int32_t y = x + 1; y < n && b < 0; y++)
        if (bp_plan_tensor(packed, 0, x)->region == BP_REGION_F32 &&
            bp_plan_tensor(packed, 0, y)->region == BP_REGION_F32 &&
            bp_live_overlap(live[x], live[y]))
          a = x, b = y;
    ck_assert_int_ge(b, 0);
    rel[b] = rel[a];
    bad = compile(m, po, 1);
    expect_invariant_8(bp_plan_pack(bad, rel, live));
    bp_plan_destroy(bad);
    free(zero);
    free(rel);
    free(live);
    bp_plan_destroy(packed);
    bp_model_destroy(m);
  }
  shipped_models_free(models);
}
END_TEST

/* A packed plan whose ranges do not cover what the graph touches: the
 * graph build (bind time) refuses it, naming invariant 8. */
START_TEST(a_graph_outside_the_ranges_is_refused) {
  char **models = shipped_models();
  bp_model *m = load(models[0]);
  const bp_plan_options po = {0, 0, BP_OPT_SGD};
  bp_plan *p = compile(m, po, 1);
  const int32_t n = bp_plan_tensor_count(p);
  const size_t cells = (size_t)n * (size_t)bp_plan_variant_count(p);
  uint64_t *rel = calloc((size_t)n, sizeof *rel);
  bp_live_range *never = malloc(cells * sizeof *never);
  for (size_t c = 0; c < cells; c++) never[c] = (bp_live_range){-1, -1};
  for (int32_t id = 0; id < n; id++) /* every slot its own bytes: the layout itself is fine */
    rel[id] = bp_plan_tensor(p, 0, id)->offset -
              bp_plan_region_span(p, bp_plan_tensor(p, 0, id)->region).offset;
  ck_assert_msg(bp_plan_pack(p, rel, never) == BP_OK, "%s", bp_last_error());
  bp_status st;
  bp_graph *g = graph_of(m, p, &st);
  ck_assert_ptr_null(g);
  expect_invariant_8(st);
  free(rel);
  free(never);
  bp_plan_destroy(p);
  bp_model_destroy(m);
  shipped_models_free(models);
}
END_TEST

/* `blueprint plan` prints the bytes with and without reuse; its SVG draws
 * the packed slots and marks the ones that share bytes. */
START_TEST(plan_shows_bytes_with_and_without_reuse) {
  const char *src = getenv("BP_SOURCE_DIR");
  ck_assert_ptr_nonnull(src);
  char *cnn = path_in(src, "models/cnn.yaml");
  char *dir = tmp_dir_create();
  char *svg = path_in(dir, "cnn.svg");
  bp_model *m = load(cnn);
  bp_plan *plain = compile(m, (bp_plan_options){0, 0, BP_OPT_SGD}, 1);
  char want[160];
  snprintf(want, sizeof want, "without reuse (--no-reuse): %" PRIu64 " (",
           bp_plan_total_bytes(plain));
  run_result r = RUN("plan", cnn, "--svg", svg);
  ck_assert_msg(r.status == 0, "%s", r.err);
  ck_assert_msg(strstr(r.out, "liveness reuse: on, ") != NULL, "%s", r.out);
  ck_assert_msg(strstr(r.out, want) != NULL, "no '%s' in %s", want, r.out);
  run_free(&r);
  size_t size = 0;
  char *text = (char *)read_file(svg, &size);
  ck_assert_ptr_nonnull(text);
  ck_assert_ptr_nonnull(strstr(text, "liveness reuse: "));
  ck_assert_ptr_nonnull(strstr(text, "conv1.out: "));
  ck_assert_ptr_nonnull(strstr(text, ", shares bytes</title>"));
  free(text);
  snprintf(want, sizeof want, "total arena bytes per rank: %" PRIu64 " (",
           bp_plan_total_bytes(plain));
  r = RUN("plan", cnn, "--no-reuse", "--svg", svg);
  ck_assert_msg(r.status == 0, "%s", r.err);
  ck_assert_msg(strstr(r.out, want) != NULL, "no '%s' in %s", want, r.out);
  ck_assert_msg(strstr(r.out, "liveness reuse: off") != NULL, "%s", r.out);
  run_free(&r);
  text = (char *)read_file(svg, &size);
  ck_assert_ptr_nonnull(text);
  ck_assert_ptr_null(strstr(text, "shares bytes"));
  free(text);
  bp_plan_destroy(plain);
  bp_model_destroy(m);
  free(svg);
  tmp_dir_remove(dir);
  free(cnn);
}
END_TEST

/* ---- training: the same bits with and without reuse ----------------------------- */

typedef struct run_cfg {
  const char *name;
  int amp, ema, optimizer;
} run_cfg;

/* Two steps of batch 32 and one evaluation batch: small enough for the
 * sanitizer builds, and every node of every variant runs. */
static bp_train_options run_options(const char *data, const run_cfg *c, int no_reuse) {
  bp_train_options o;
  bp_train_options_init(&o);
  o.threads = bp_test_threads(); /* ci/test.sh thread: 1 */
  o.registry_options = bp_test_registry_options(); /* module switches */
  o.data_dir = data;
  o.batch = 32;
  o.eval_batch = 32;
  o.train_limit = 64;
  o.test_limit = 32;
  o.epochs = 1;
  o.seed = 3;
  o.amp = c->amp;
  o.ema = c->ema;
  o.optimizer = c->optimizer;
  o.no_reuse = no_reuse;
  return o;
}

static bp_trainer *train(const char *model, const char *data, const run_cfg *c, int no_reuse,
                         bp_epoch_report *report) {
  const bp_train_options o = run_options(data, c, no_reuse);
  bp_trainer *t = NULL;
  ck_assert_msg(bp_trainer_create_from_file(model, &o, &t) == BP_OK, "%s %s: %s", model, c->name,
                bp_last_error());
  ck_assert_int_eq(bp_plan_is_packed(bp_trainer_plan(t)), !no_reuse);
  ck_assert_msg(bp_trainer_train_epoch(t, report) == BP_OK, "%s %s: %s", model, c->name,
                bp_last_error());
  return t;
}

/* Every FP32 tensor outside the packed regions, of both trainers, bit for bit. */
static void assert_same_state(const bp_trainer *a, const bp_trainer *b, const char *what) {
  const bp_plan *p = bp_trainer_plan(a);
  int compared = 0;
  for (int32_t id = 0; id < bp_plan_tensor_count(p); id++) {
    const bp_dtensor *d = bp_plan_tensor(p, 0, id);
    if (d->dtype != BP_DTYPE_FP32 || bp_region_is_packed(d->region)) continue;
    const uint64_t count = bp_dtensor_host_elems(d);
    float *x = malloc((size_t)count * sizeof *x), *y = malloc((size_t)count * sizeof *y);
    ck_assert_int_eq(bp_trainer_read_tensor(a, d->name, x, count), BP_OK);
    ck_assert_int_eq(bp_trainer_read_tensor(b, d->name, y, count), BP_OK);
    ck_assert_msg(memcmp(x, y, (size_t)count * sizeof *x) == 0, "%s: '%s' differs", what, d->name);
    free(x);
    free(y);
    compared++;
  }
  ck_assert_int_gt(compared, 4);
}

static bp_status resume(const char *model, const char *data, const run_cfg *c, int no_reuse,
                        const char *path) {
  bp_train_options o = run_options(data, c, no_reuse);
  o.resume_path = path;
  bp_trainer *t = NULL;
  bp_status st = bp_trainer_create_from_file(model, &o, &t);
  bp_trainer_destroy(t);
  return st;
}

/* A checkpoint loads into a plan with either reuse setting: it holds the
 * state spans only, which packing does not move (docs/checkpoint-format.md). */
static void check_checkpoints(const char *model, const char *dir, const char *data,
                              const run_cfg *c, bp_trainer *packed, bp_trainer *plain) {
  char *pa = path_in(dir, "packed.ckpt"), *pb = path_in(dir, "plain.ckpt");
  ck_assert_msg(bp_trainer_save(packed, pa) == BP_OK, "%s", bp_last_error());
  ck_assert_msg(bp_trainer_save(plain, pb) == BP_OK, "%s", bp_last_error());
  ck_assert_msg(resume(model, data, c, 0, pa) == BP_OK, "%s", bp_last_error());
  ck_assert_msg(resume(model, data, c, 1, pb) == BP_OK, "%s", bp_last_error());
  ck_assert_msg(resume(model, data, c, 0, pb) == BP_OK, "%s", bp_last_error());
  ck_assert_msg(resume(model, data, c, 1, pa) == BP_OK, "%s", bp_last_error());
  free(pa);
  free(pb);
}

START_TEST(training_ends_with_the_same_bits) {
  static const run_cfg cfgs[] = {
      {"sgd", 0, 0, BP_OPT_SGD},
      {"amp", 1, 0, BP_OPT_SGD},
      {"ema adamw", 0, 1, BP_OPT_ADAMW},
      {"amp ema", 1, 1, BP_OPT_SGD},
  };
  toy_env e = toy_env_open("", 64, 32, 11);
  char **models = shipped_models();
  for (int i = 0; models[i]; i++) {
    /* the toy data is 28x28x1: the 224x224 ImageNet-sized models (their
     * plans are checked above) would take minutes per step here */
    bp_model *m = load(models[i]);
    const int toy_sized = m->height == 28 && m->width == 28 && m->channels == 1;
    bp_model_destroy(m);
    if (!toy_sized) {
      printf("%s: not trained here (input is not 28x28x1)\n", models[i]);
      continue;
    }
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
      char what[4200];
      snprintf(what, sizeof what, "%s, %s", models[i], cfgs[c].name);
      bp_epoch_report ra, rb;
      bp_trainer *a = train(models[i], e.data, &cfgs[c], 0, &ra);
      bp_trainer *b = train(models[i], e.data, &cfgs[c], 1, &rb);
      ck_assert_int_ge(ra.steps, 1);
      ck_assert_int_eq(ra.steps, rb.steps);
      ck_assert_msg(memcmp(&ra.train_loss, &rb.train_loss, sizeof ra.train_loss) == 0,
                    "%s: train loss %.9g with reuse, %.9g without", what, ra.train_loss,
                    rb.train_loss);
      ck_assert_msg(memcmp(&ra.test_loss, &rb.test_loss, sizeof ra.test_loss) == 0,
                    "%s: test loss %.9g with reuse, %.9g without", what, ra.test_loss, rb.test_loss);
      ck_assert(ra.test_accuracy == rb.test_accuracy);
      assert_same_state(a, b, what);
      if (i == 0 && c == 0) check_checkpoints(models[i], e.dir, e.data, &cfgs[c], a, b);
      printf("%s: same bits with and without reuse (arena %" PRIu64 " vs %" PRIu64 " bytes)\n",
             what, bp_plan_total_bytes(bp_trainer_plan(a)), bp_plan_total_bytes(bp_trainer_plan(b)));
      bp_trainer_destroy(a);
      bp_trainer_destroy(b);
    }
  }
  shipped_models_free(models);
  toy_env_close(&e);
}
END_TEST

int main(void) {
  Suite *s = suite_create("liveness");
  TCase *tc = tcase_create("plan");
  tcase_add_test(tc, every_shipped_model_packs_under_every_option);
  tcase_add_test(tc, a_corrupt_layout_fails_the_check);
  tcase_add_test(tc, a_graph_outside_the_ranges_is_refused);
  tcase_add_test(tc, plan_shows_bytes_with_and_without_reuse);
  tcase_set_timeout(tc, 300);
  suite_add_tcase(s, tc);
  TCase *train = tcase_create("train"); /* CK_RUN_CASE=plan skips it */
  tcase_add_test(train, training_ends_with_the_same_bits);
  tcase_set_timeout(train, 900);
  suite_add_tcase(s, train);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
