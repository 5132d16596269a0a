/* The ViT layer types (pos_embed, layernorm, gelu_tanh) in a small model
 * trained by the executable on toy data: FP32 and mixed precision learn,
 * and a checkpoint holds what evaluation needs (P, the layer norms' gain
 * and bias: eval of the saved file gives the run's own test loss). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run_util.h"

static const char vit_model[] =
    "name: tinyvit\n"
    "input: {height: 28, width: 28, channels: 1, classes: 10}\n"
    "layers:\n"
    "  - {type: conv, name: patch, filters: 16, kernel: 4, stride: 4}\n"
    "  - {type: pos_embed, name: pos}\n"
    "  - {type: layernorm, name: n1}\n"
    "  - {type: conv, name: up, filters: 32, kernel: 1}\n"
    "  - {type: gelu_tanh, name: g}\n"
    "  - {type: conv, name: down, filters: 16, kernel: 1}\n"
    "  - {type: add, name: res, inputs: [down, pos]}\n"
    "  - {type: layernorm, name: n2, eps: 1e-6}\n"
    "  - {type: global_avgpool, name: mean}\n"
    "  - {type: fc, name: head, units: 10}\n"
    "  - {type: softmax_ce, name: loss}\n"
    "train: {batch: 32, eval_batch: 64, epochs: 2, optimizer: adamw, lr: 0.003, "
    "weight_decay: 0.05}\n";

/* Trains the model (extra: "--amp" or NULL) and returns its metrics path. */
static char *train(const toy_env *e, const char *tag, const char *extra, const char *ckpt) {
  char name[64];
  snprintf(name, sizeof name, "%s.jsonl", tag);
  char *metrics = path_in(e->dir, name);
  run_result rr = extra ? RUN("train", e->model, "--data", e->data, "--quiet", "--train-limit",
                              "640", "--test-limit", "128", "--metrics", metrics, "--log-every",
                              "1", "--checkpoint", ckpt, extra)
                        : RUN("train", e->model, "--data", e->data, "--quiet", "--train-limit",
                              "640", "--test-limit", "128", "--metrics", metrics, "--log-every",
                              "1", "--checkpoint", ckpt);
  ck_assert_msg(rr.status == 0, "%s: status %d: %s", tag, rr.status, rr.err);
  run_free(&rr);
  return metrics;
}

/* The mean train loss of steps [lo, hi). */
static double mean_loss(const char *metrics, int lo, int hi) {
  double s = 0;
  for (int i = lo; i < hi; i++) s += jsonl_number(metrics, "step", i, "train_loss", NULL);
  return s / (hi - lo);
}

static void trains_and_restores(const char *extra) {
  toy_env e = toy_env_open(vit_model, 640, 128, 5);
  char *ckpt = path_in(e.dir, "vit.ckpt");
  char *metrics = train(&e, extra ? "amp" : "fp32", extra, ckpt);
  int steps = 0;
  jsonl_number(metrics, "step", 0, "train_loss", &steps);
  ck_assert_int_eq(steps, 40);
  const double first = mean_loss(metrics, 0, 5), last = mean_loss(metrics, 35, 40);
  printf("tiny vit%s: mean train loss of steps 0-4 %.4f, of steps 35-39 %.4f, test accuracy %.4f\n",
         extra ? " (amp)" : "", first, last,
         jsonl_number(metrics, "epoch", 1, "test_accuracy", NULL));
  ck_assert_msg(last < 0.95 * first, "loss %g -> %g: not learning", first, last);
  /* evaluation of the checkpoint reproduces the last epoch's test loss */
  run_result rr = extra ? RUN("eval", e.model, "--checkpoint", ckpt, "--data", e.data,
                              "--test-limit", "128", extra)
                        : RUN("eval", e.model, "--checkpoint", ckpt, "--data", e.data,
                              "--test-limit", "128");
  ck_assert_msg(rr.status == 0, "eval: status %d: %s", rr.status, rr.err);
  char want[64];
  snprintf(want, sizeof want, "test loss %.4f",
           jsonl_number(metrics, "epoch", 1, "test_loss", NULL));
  ck_assert_msg(strstr(rr.out, want), "eval printed '%s', the run's last epoch had '%s'", rr.out,
                want);
  run_free(&rr);
  free(metrics);
  free(ckpt);
  toy_env_close(&e);
}

START_TEST(a_tiny_vit_trains_and_its_checkpoint_evaluates) { trains_and_restores(NULL); }
END_TEST

START_TEST(a_tiny_vit_trains_under_amp) { trains_and_restores("--amp"); }
END_TEST

int main(void) {
  Suite *s = suite_create("vit_layers");
  TCase *tc = tcase_create("vit_layers");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, a_tiny_vit_trains_and_its_checkpoint_evaluates);
  tcase_add_test(tc, a_tiny_vit_trains_under_amp);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
