/* The XNNPACK op module (ops/xnnpack) inside the executor and the trainer:
 * every forward op it has serves a small network and gives the reference
 * kernels' results; its operators pack the weights once per parameter
 * generation and follow every change the host announces; a training run's
 * per-epoch test pass and `blueprint eval` on XNNPACK see the updated
 * weights (the same loss as the reference kernels on the checkpoint). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blueprint/arena.h"
#include "blueprint/exec.h"
#include "blueprint/graph.h"
#include "blueprint/threads.h"
#include "blueprint/train.h"
#include "graph_util.h"
#include "run_util.h"

/* Every op the module has a kernel for, on FP32 tensors it accepts. */
static const char net[] =
    "input: {height: 8, width: 8, channels: 3, classes: 5}\n"
    "layers:\n"
    "  - {type: conv, name: c1, filters: 6, kernel: 3, pad: 1}\n"
    "  - {type: relu, name: r1}\n"
    "  - {type: conv, name: c2, filters: 6, kernel: 3, pad: 1}\n"
    "  - {type: add, name: a1, inputs: [c2, r1]}\n"
    "  - {type: maxpool, name: p1, kernel: 2}\n"
    "  - {type: avgpool, name: p2, kernel: 2}\n"
    "  - {type: conv, name: c3, filters: 4, kernel: 1}\n"
    "  - {type: global_avgpool, name: g}\n"
    "  - {type: fc, name: f, units: 5}\n"
    "  - {type: softmax_ce, name: loss}\n";

static const char xnn_pins[] =
    "conv2d.fwd=xnnpack,relu.fwd=xnnpack,add.fwd=xnnpack,maxpool.fwd=xnnpack,"
    "avgpool.fwd=xnnpack,global_avgpool.fwd=xnnpack,fc.fwd=xnnpack";

#define BATCH 4

typedef struct rig {
  bp_model *model;
  bp_plan *plan;
  bp_graph *graph;
  bp_registry *registry;
} rig;

static void open_rig(rig *g) {
  memset(g, 0, sizeof *g);
  graph_util_build(net, "net.yaml", BATCH, &g->model, &g->plan, &g->graph);
  ck_assert_int_eq(bp_registry_create(&g->registry), BP_OK);
  ck_assert_msg(bp_registry_discover(g->registry, NULL, 0) == BP_OK, "%s", bp_last_error());
}

static void close_rig(rig *g) {
  bp_registry_destroy(g->registry);
  graph_util_free(g->model, g->plan, g->graph);
}

/* One rank bound with `pins`: parameters from seed 7, a fixed input. */
typedef struct rank_rig {
  bp_arena *arena;
  char *base;
  bp_exec *exec;
} rank_rig;

static void bind_rank(const rig *g, const char *pins, const bp_abi_threads *threads,
                      rank_rig *x) {
  memset(x, 0, sizeof *x);
  ck_assert_int_eq(bp_arena_create(g->plan, bp_host_allocator(), 0, &x->arena), BP_OK);
  x->base = bp_arena_base(x->arena);
  bp_exec_options eo = {.device = "cpu", .pins = pins, .rank = 0, .world = 1, .threads = threads};
  ck_assert_msg(bp_exec_create(g->graph, g->registry, x->base, &eo, &x->exec) == BP_OK, "%s",
                bp_last_error());
  for (int32_t id = 0; id < bp_plan_tensor_count(g->plan); id++) {
    const bp_dtensor *t = bp_plan_tensor(g->plan, 0, id);
    if (t->init.kind == BP_INIT_NONE || t->dtype != BP_DTYPE_FP32) continue;
    ck_assert_int_eq(bp_dtensor_init_fill(t, 7, (float *)(x->base + t->offset)), BP_OK);
  }
  const bp_dtensor *in = bp_plan_tensor(g->plan, 0, bp_plan_find_tensor(g->plan, "input.a"));
  float *input = (float *)(x->base + in->offset);
  for (uint64_t i = 0; i < bp_dtensor_host_elems(in); i++)
    input[i] = (float)((int)(i * 7 % 11) - 5) / 5.0f;
  int32_t *labels = (int32_t *)(x->base +
                                bp_plan_tensor(g->plan, 0, bp_plan_find_tensor(g->plan, "label.a"))
                                    ->offset);
  for (int i = 0; i < BATCH; i++) labels[i] = i % 5;
}

static void close_rank(rank_rig *x) {
  bp_exec_destroy(x->exec);
  bp_arena_destroy(x->arena);
}

static float *tensor(const rig *g, rank_rig *x, const char *name, int64_t *count) {
  const int32_t id = bp_plan_find_tensor(g->plan, name);
  ck_assert_msg(id >= 0, "no tensor %s", name);
  const bp_dtensor *t = bp_plan_tensor(g->plan, 0, id);
  if (count) *count = (int64_t)bp_dtensor_host_elems(t);
  return (float *)(x->base + t->offset);
}

/* One forward pass; copies the logits (f.out) into out[BATCH*5]. */
static void forward(const rig *g, rank_rig *x, float *out) {
  const bp_segment segs[] = {BP_SEGMENT_RESET, BP_SEGMENT_FORWARD, BP_SEGMENT_LOSS};
  for (int i = 0; i < 3; i++) {
    const bp_status st = bp_exec_run(x->exec, 0, segs[i], 0);
    ck_assert_msg(st == BP_OK, "%s: %s", bp_segment_name(segs[i]), bp_last_error());
  }
  int64_t n;
  const float *y = tensor(g, x, "f.out", &n);
  ck_assert_int_eq(n, BATCH * 5);
  memcpy(out, y, sizeof(float) * BATCH * 5);
}

/* max |a - b| / max(1, max |b|), as `blueprint validate` measures. */
static double rel_error(const float *a, const float *b, int n) {
  double err = 0, scale = 1;
  for (int i = 0; i < n; i++) {
    err = fmax(err, fabs((double)a[i] - b[i]));
    scale = fmax(scale, fabs((double)b[i]));
  }
  return err / scale;
}

/* Forward nodes of the train variant bound to impl. */
static int forward_nodes_of(const bp_exec *exec, const char *impl) {
  int n = 0;
  for (int k = 0;; k++) {
    const bp_registered_kernel *rk = bp_exec_kernel(exec, 0, BP_SEGMENT_FORWARD, k);
    if (!rk) break;
    n += strcmp(rk->kernel.impl, impl) == 0;
  }
  return n;
}

START_TEST(every_xnnpack_forward_kernel_gives_the_reference_result_on_a_network) {
  rig g;
  open_rig(&g);
  rank_rig ref, xnn;
  bind_rank(&g, "*=reference", NULL, &ref);
  bp_threads *threads = NULL;
  ck_assert_int_eq(bp_threads_create(3, &threads), BP_OK); /* a pool of 3 under XNNPACK */
  bind_rank(&g, xnn_pins, bp_threads_abi(threads), &xnn);
  ck_assert_int_eq(forward_nodes_of(xnn.exec, "xnnpack"), 9); /* every forward node */
  float want[BATCH * 5], got[BATCH * 5];
  forward(&g, &ref, want);
  forward(&g, &xnn, got);
  const double err = rel_error(got, want, BATCH * 5);
  ck_assert_msg(err <= 1e-5, "logits differ from the reference by %g", err);
  forward(&g, &xnn, got); /* again, operators and setups reused */
  ck_assert_double_le(rel_error(got, want, BATCH * 5), 1e-5);
  close_rank(&xnn);
  close_rank(&ref);
  bp_threads_destroy(threads);
  close_rig(&g);
}
END_TEST

/* Weights written through the executor's memory reach the packed
 * operators with the next generation (bp_exec_params_changed, what the
 * trainer calls after every update and load), and only then: the packed
 * copy is a cache keyed by the generation, so the generation is what keeps
 * it current. */
START_TEST(changed_weights_are_repacked_when_the_generation_moves) {
  rig g;
  open_rig(&g);
  rank_rig ref, xnn;
  bind_rank(&g, "*=reference", NULL, &ref);
  bind_rank(&g, xnn_pins, NULL, &xnn);
  float before[BATCH * 5], got[BATCH * 5], want[BATCH * 5];
  forward(&g, &xnn, before);
  const char *params[] = {"c1.w", "c2.b", "f.w"};
  for (int p = 0; p < 3; p++) {
    int64_t n;
    float *a = tensor(&g, &xnn, params[p], &n), *b = tensor(&g, &ref, params[p], NULL);
    for (int64_t i = 0; i < n; i++) a[i] = b[i] = -1.5f * a[i] + 0.01f * (float)(i % 3);
  }
  forward(&g, &ref, want);
  ck_assert_double_gt(rel_error(want, before, BATCH * 5), 1e-2); /* the change shows */
  forward(&g, &xnn, got);
  ck_assert_msg(rel_error(got, before, BATCH * 5) == 0,
                "without a new generation the operators keep their packed weights");
  const uint64_t gen = bp_exec_params_generation(xnn.exec);
  bp_exec_params_changed(xnn.exec);
  ck_assert_uint_eq(bp_exec_params_generation(xnn.exec), gen + 1);
  forward(&g, &xnn, got);
  const double err = rel_error(got, want, BATCH * 5);
  ck_assert_msg(err <= 1e-5, "after params_changed the logits differ from the reference by %g",
                err);
  close_rank(&xnn);
  close_rank(&ref);
  close_rig(&g);
}
END_TEST

/* ---- training, then evaluation ----------------------------------------------- */

/* every forward op of TOY_BN_MODEL_LAYERS that XNNPACK has */
static const char toy_pins[] = "conv2d.fwd=xnnpack,relu.fwd=xnnpack,maxpool.fwd=xnnpack,fc.fwd=xnnpack";

#define TOY_TRAIN "train: {batch: 32, eval_batch: 50, epochs: 2, optimizer: sgd, lr: 0.05}\n"

/* "test loss X  test accuracy Y%" of `blueprint eval`'s output. */
static void eval_numbers(const run_result *r, double *loss, double *acc) {
  const char *p = strstr(r->out, "test loss ");
  ck_assert_msg(p != NULL, "no test loss in: %s%s", r->out, r->err);
  ck_assert_int_eq(sscanf(p, "test loss %lf test accuracy %lf%%", loss, acc), 2);
}

START_TEST(the_test_pass_and_eval_after_training_use_the_updated_weights) {
  toy_env e = toy_env_open(TOY_BN_MODEL_LAYERS TOY_TRAIN, 640, 200, 3);
  char *ck = path_in(e.dir, "ck.bin"), *metrics = path_in(e.dir, "m.jsonl");
  /* training with XNNPACK's forward kernels pinned: they serve the forward
   * ops of both variants (training and the per-epoch test pass) */
  run_result r = RUN("train", e.model, "--data", e.data, "--checkpoint", ck, "--metrics", metrics,
                     "--kernels", toy_pins, "--quiet");
  ck_assert_msg(r.status == 0, "train: %s", r.err);
  run_free(&r);
  size_t size;
  char *m = (char *)read_file(metrics, &size);
  ck_assert_ptr_nonnull(m);
  ck_assert_msg(strstr(m, "\"variant\":\"eval\",\"segment\":\"eval\",\"node\":\"conv1.fwd\","
                          "\"op\":\"conv2d.fwd\",\"impl\":\"xnnpack\"") != NULL,
                "the test pass did not run conv2d.fwd on XNNPACK: %s", m);
  free(m);
  int lines = 0;
  const double train_test_loss = jsonl_number(metrics, "epoch", 1, "test_loss", &lines);
  const double train_test_acc = jsonl_number(metrics, "epoch", 1, "test_accuracy", NULL);
  ck_assert_int_eq(lines, 2);

  /* the checkpoint through the reference kernels, then through XNNPACK */
  double ref_loss, ref_acc, xnn_loss, xnn_acc;
  r = RUN("eval", e.model, "--data", e.data, "--checkpoint", ck, "--kernels", "*=reference",
          "--quiet");
  ck_assert_msg(r.status == 0, "eval: %s", r.err);
  eval_numbers(&r, &ref_loss, &ref_acc);
  run_free(&r);
  r = RUN("eval", e.model, "--data", e.data, "--checkpoint", ck, "--kernels", toy_pins, "--quiet");
  ck_assert_msg(r.status == 0, "eval: %s", r.err);
  eval_numbers(&r, &xnn_loss, &xnn_acc);
  run_free(&r);
  /* the printed loss has 4 decimals */
  ck_assert_msg(fabs(xnn_loss - ref_loss) <= 1e-4 + 1e-9, "eval loss %f on XNNPACK, %f reference",
                xnn_loss, ref_loss);
  ck_assert_double_eq_tol(xnn_acc, ref_acc, 1e-9);
  ck_assert_msg(fabs(train_test_loss - ref_loss) <= 1e-4 + 1e-9,
                "the last test pass of training measured %f, the reference on its weights %f",
                train_test_loss, ref_loss);
  ck_assert_double_eq_tol(train_test_acc * 100, ref_acc, 1e-6);

  /* a stale pack would have measured the initial weights: they differ */
  r = RUN("train", e.model, "--data", e.data, "--epochs", "1", "--train-limit", "32", "--quiet",
          "--lr", "0", "--metrics", metrics);
  ck_assert_msg(r.status == 0, "train: %s", r.err);
  run_free(&r);
  const double init_loss = jsonl_number(metrics, "epoch", 0, "test_loss", NULL);
  ck_assert_msg(fabs(init_loss - ref_loss) > 0.05, "initial %f and trained %f losses are alike",
                init_loss, ref_loss);
  free(ck);
  free(metrics);
  toy_env_close(&e);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("ops_xnnpack");
  TCase *c = tcase_create("core");
  tcase_set_timeout(c, 300);
  tcase_add_test(c, every_xnnpack_forward_kernel_gives_the_reference_result_on_a_network);
  tcase_add_test(c, changed_weights_are_repacked_when_the_generation_moves);
  tcase_add_test(c, the_test_pass_and_eval_after_training_use_the_updated_weights);
  suite_add_tcase(s, c);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(suite());
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
