/* Checkpoints of `blueprint train` on a small generated MNIST-format set
 * (--data): the same seed gives byte-identical checkpoints; a run
 * interrupted mid-epoch (--stop-after-steps) and resumed ends with the very
 * bytes of an uninterrupted one (BN statistics, momentum, AdamW moments,
 * EMA copies and the last partial batch included); a corrupt, truncated or
 * mismatched checkpoint is refused with one line and left as it was; the
 * metrics file holds the documented lines. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "blueprint/train.h"
#include "run_util.h"
#include "test_env.h"

/* conv + batch norm + pooling + fc: every kind of state a checkpoint holds */
static const char small_model[] =
    TOY_BN_MODEL_LAYERS
    "train: {batch: 50, eval_batch: 40, epochs: 3, lr: 0.02}\n";

/* 130 = 2 batches of 50 + one of 30 */
static toy_env env_open(void) { return toy_env_open(small_model, 130, 100, 5); }

#define TRAIN_OK(...)                                                                     \
  do {                                                                                    \
    run_result r_ = RUN("train", __VA_ARGS__);                                            \
    ck_assert_msg(r_.status == 0, "line %d: status %d: %s", __LINE__, r_.status, r_.err); \
    run_free(&r_);                                                                        \
  } while (0)

START_TEST(same_seed_same_bytes) {
  toy_env e = env_open();
  char *a = path_in(e.dir, "a.ckpt"), *b = path_in(e.dir, "b.ckpt"), *c = path_in(e.dir, "c.ckpt");
  TRAIN_OK(e.model, "--data", e.data, "--epochs", "2", "--seed", "9", "--checkpoint", a);
  TRAIN_OK(e.model, "--data", e.data, "--epochs", "2", "--seed", "9", "--checkpoint", b);
  ck_assert_msg(same_file(a, b), "two runs with seed 9 wrote different checkpoints");
  TRAIN_OK(e.model, "--data", e.data, "--epochs", "2", "--seed", "10", "--checkpoint", c);
  ck_assert_msg(!same_file(a, c), "seeds 9 and 10 wrote the same checkpoint");
  free(a);
  free(b);
  free(c);
  toy_env_close(&e);
}
END_TEST

/* Uninterrupted vs stopped at `stop` and resumed, for one set of options
 * that makes `spe` steps per epoch. */
static void check_resume(const toy_env *e, const char *model, const char *const *extra, int stop,
                         int spe) {
  char *full = path_in(e->dir, "full.ckpt"), *part = path_in(e->dir, "part.ckpt");
  char *mfull = path_in(e->dir, "full.jsonl"), *mpart = path_in(e->dir, "part.jsonl");
  char stop_text[16];
  snprintf(stop_text, sizeof stop_text, "%d", stop);
  const char *base[] = {"train", model, "--data", e->data, "--epochs", "3"};
  const char *args[40];
  for (int pass = 0; pass < 3; pass++) {
    int n = 0;
    for (size_t k = 0; k < sizeof base / sizeof base[0]; k++) args[n++] = base[k];
    for (int k = 0; extra[k]; k++) args[n++] = extra[k];
    args[n++] = "--checkpoint";
    args[n++] = pass == 0 ? full : part;
    args[n++] = "--metrics";
    args[n++] = pass == 0 ? mfull : mpart;
    if (pass == 1) args[n++] = "--stop-after-steps", args[n++] = stop_text;
    if (pass == 2) args[n++] = "--resume", args[n++] = part;
    args[n] = NULL;
    run_result r = run_exe("blueprint", args);
    ck_assert_msg(r.status == 0, "pass %d: status %d: %s", pass, r.status, r.err);
    if (pass == 1) ck_assert_ptr_nonnull(strstr(r.out, "stopped after step"));
    if (pass == 2) ck_assert_ptr_nonnull(strstr(r.out, "resumed at epoch"));
    run_free(&r);
  }
  ck_assert_msg(same_file(full, part),
                "stopped at step %d and resumed, the run ends with other "
                "bytes than an uninterrupted one",
                stop);
  /* the last epoch's evaluation is the same too */
  int n_full = 0, n_part = 0;
  jsonl_number(mfull, "epoch", 0, "epoch", &n_full);
  jsonl_number(mpart, "epoch", 0, "epoch", &n_part);
  ck_assert_int_eq(n_full, 3);
  const int mid = stop % spe != 0;
  ck_assert_int_eq(n_part, 3 + mid); /* a stopped epoch has a line of its own */
  ck_assert_double_eq(jsonl_number(mfull, "epoch", 2, "test_accuracy", NULL),
                      jsonl_number(mpart, "epoch", 2 + mid, "test_accuracy", NULL));
  const double stopped_acc = jsonl_number(mpart, "epoch", stop / spe - !mid, "test_accuracy", NULL);
  ck_assert_msg(mid ? isnan(stopped_acc) : isfinite(stopped_acc),
                "the stopped epoch's line: test accuracy %g", stopped_acc);
  free(full);
  free(part);
  free(mfull);
  free(mpart);
}

START_TEST(resume_mid_epoch_is_exact) {
  toy_env e = env_open();
  /* 3 steps per epoch (the last one short); stop in epoch 2 after its step 1 */
  const char *sgd[] = {"--nesterov", "--schedule", "cosine", "--warmup-epochs", "1", "--ema", NULL};
  check_resume(&e, e.model, sgd, 4, 3);
  /* AdamW moments and step counter: 3 steps per epoch (64, 64, 2); stop mid-epoch 3 */
  const char *adamw[] = {"--optimizer", "adamw", "--lr", "0.001", "--batch", "64", NULL};
  check_resume(&e, e.mlp, adamw, 8, 3);
  toy_env_close(&e);
}
END_TEST

/* Ranks with the sharded update: each rank's moments are current only in
 * its own chunks until a save gathers them, and a resume gives every rank
 * all of them; the run still ends with the uninterrupted bytes. */
START_TEST(resume_with_ranks_is_exact) {
  toy_env e = env_open();
  const char *adamw[] = {"--optimizer", "adamw", "--lr", "0.001", "--batch", "64",
                         "--ranks", "3", NULL};
  check_resume(&e, e.mlp, adamw, 8, 3);
  const char *sgd[] = {"--ranks", "2", "--nesterov", "--ema", NULL};
  check_resume(&e, e.model, sgd, 4, 3);
  toy_env_close(&e);
}
END_TEST

START_TEST(resume_at_epoch_end_is_exact) {
  toy_env e = env_open();
  const char *step[] = {"--schedule", "step", "--step-gamma", "0.5", NULL};
  check_resume(&e, e.model, step, 3, 3);
  toy_env_close(&e);
}
END_TEST

/* `train --resume X --checkpoint X` and `eval --checkpoint X` both refuse
 * X with one line, and X keeps its bytes. */
static void expect_refused(const toy_env *e, const char *model, const char *ck,
                           const char *needle) {
  size_t before_size = 0, after_size = 0;
  unsigned char *before = read_file(ck, &before_size);
  ck_assert_ptr_nonnull(before);
  run_result r = RUN("train", model, "--data", e->data, "--resume", ck, "--checkpoint", ck);
  expect_one_line_error(&r, "blueprint train: ", needle);
  run_free(&r);
  r = RUN("eval", model, "--data", e->data, "--checkpoint", ck);
  expect_one_line_error(&r, "blueprint eval: ", needle);
  run_free(&r);
  unsigned char *after = read_file(ck, &after_size);
  ck_assert_msg(after && after_size == before_size && !memcmp(before, after, before_size),
                "the refused checkpoint %s was changed", ck);
  free(before);
  free(after);
}

START_TEST(bad_checkpoints_are_refused_and_kept) {
  toy_env e = env_open();
  char *good = path_in(e.dir, "good.ckpt"), *bad = path_in(e.dir, "bad.ckpt");
  TRAIN_OK(e.model, "--data", e.data, "--epochs", "1", "--checkpoint", good);
  size_t size = 0;
  unsigned char *bytes = read_file(good, &size);
  ck_assert_ptr_nonnull(bytes);
  ck_assert_uint_gt(size, 1000);

  bytes[size / 2] ^= 0x40; /* one flipped bit in the data */
  write_file(bad, bytes, size);
  expect_refused(&e, e.model, bad, "bad.ckpt");
  bytes[size / 2] ^= 0x40;

  write_file(bad, bytes, size / 3); /* truncated */
  expect_refused(&e, e.model, bad, "bad.ckpt");

  write_file(bad, "not a checkpoint\n", 17);
  expect_refused(&e, e.model, bad, "bad.ckpt");

  write_file(bad, bytes, size); /* a checkpoint of another model */
  expect_refused(&e, e.mlp, bad, "bad.ckpt");
  run_result r = RUN("train", e.model, "--data", e.data, "--batch", "25", "--resume", bad);
  expect_one_line_error(&r, "blueprint train: ", "bad.ckpt"); /* of another batch: another plan */
  ck_assert_ptr_nonnull(strstr(r.err, "written for another plan")); /* named before the counters */
  run_free(&r);
  ck_assert(same_file(good, bad));

  r = RUN("train", e.model, "--data", e.data, "--resume", "/nonexistent/x.ckpt");
  expect_one_line_error(&r, "blueprint train: ", "/nonexistent/x.ckpt");
  run_free(&r);
  free(bytes);
  free(good);
  free(bad);
  toy_env_close(&e);
}
END_TEST

/* A diverged run's checkpoint, properly sealed (saved through the trainer
 * after a NaN was written into conv1's weights): `train --resume` and
 * `eval` refuse it with one line naming the file and the tensor. */
START_TEST(a_checkpoint_holding_nan_weights_is_refused) {
  toy_env e = env_open();
  bp_train_options o;
  bp_train_options_init(&o);
  o.threads = bp_test_threads(); /* ci/test.sh thread: 1 */
  o.registry_options = bp_test_registry_options(); /* module switches */
  o.data_dir = e.data;
  bp_trainer *t = NULL;
  ck_assert_msg(bp_trainer_create_from_file(e.model, &o, &t) == BP_OK, "%s", bp_last_error());
  float w[4 * 3 * 3 * 1];
  ck_assert_int_eq(bp_trainer_read_tensor(t, "conv1.w", w, 36), BP_OK);
  w[17] = NAN;
  ck_assert_int_eq(bp_trainer_write_tensor(t, "conv1.w", w, 36), BP_OK);
  char *ck = path_in(e.dir, "diverged.ckpt");
  ck_assert_msg(bp_trainer_save(t, ck) == BP_OK, "%s", bp_last_error());
  bp_trainer_destroy(t);
  expect_refused(&e, e.model, ck, "diverged.ckpt holds non-finite values in 'conv1.w'");
  free(ck);
  toy_env_close(&e);
}
END_TEST

START_TEST(metrics_lines) {
  toy_env e = env_open();
  char *m = path_in(e.dir, "m.jsonl");
  TRAIN_OK(e.model, "--data", e.data, "--epochs", "2", "--metrics", m, "--log-every", "2");
  int epochs = 0, steps = 0;
  ck_assert_double_eq(jsonl_number(m, "epoch", 1, "epoch", &epochs), 2.0);
  ck_assert_int_eq(epochs, 2);
  ck_assert_double_eq(jsonl_number(m, "step", 0, "global_step", &steps), 2.0);
  ck_assert_int_eq(steps, 3); /* 6 steps, a line every 2 */
  ck_assert_double_eq(jsonl_number(m, "epoch", 0, "samples", NULL), 130.0);
  ck_assert_double_eq(jsonl_number(m, "epoch", 0, "test_samples", NULL), 100.0);
  ck_assert_double_eq(jsonl_number(m, "epoch", 1, "global_step", NULL), 6.0);
  const char *keys[] = {"train_loss",        "train_accuracy", "test_loss", "test_accuracy",
                        "images_per_second", "seconds",        "lr",        "train_seconds",
                        "eval_seconds"};
  for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
    ck_assert_msg(isfinite(jsonl_number(m, "epoch", 0, keys[k], NULL)), "no '%s'", keys[k]);
  ck_assert_double_eq_tol(jsonl_number(m, "epoch", 0, "lr", NULL), 0.02, 1e-9);
  ck_assert(isfinite(jsonl_number(m, "step", 2, "train_loss", NULL)));
  free(m);
  toy_env_close(&e);
}
END_TEST

/* The C API: save and load through a trainer, read a tensor, refuse bad
 * options. */
START_TEST(c_api_save_load_read) {
  toy_env e = env_open();
  bp_train_options o;
  bp_train_options_init(&o);
  o.threads = bp_test_threads(); /* ci/test.sh thread: 1 */
  o.registry_options = bp_test_registry_options(); /* module switches */
  o.data_dir = e.data;
  o.epochs = 2;
  bp_trainer *t = NULL;
  ck_assert_msg(bp_trainer_create_from_file(e.model, &o, &t) == BP_OK, "%s", bp_last_error());
  ck_assert_int_eq(bp_trainer_steps_per_epoch(t), 3);
  ck_assert_int_eq(bp_trainer_train_samples(t), 130);
  ck_assert_int_eq(bp_trainer_test_samples(t), 100);
  bp_epoch_report r;
  ck_assert_msg(bp_trainer_train_epoch(t, &r) == BP_OK, "%s", bp_last_error());
  ck_assert_int_eq(r.epoch, 1);
  ck_assert_int_eq(r.steps, 3);
  ck_assert_int_eq(r.samples, 130);
  ck_assert_int_eq(r.complete, 1);
  ck_assert(isfinite(r.test_accuracy));
  float w[10 * 14 * 14 * 4], again[10 * 14 * 14 * 4];
  ck_assert_int_eq(bp_trainer_read_tensor(t, "fc.w", w, 7840), BP_OK);
  ck_assert_int_eq(bp_trainer_read_tensor(t, "fc.w", w, 7), BP_ERR_INVALID);
  ck_assert_int_eq(bp_trainer_read_tensor(t, "nosuch", w, 7840), BP_ERR_INVALID);
  char *ck = path_in(e.dir, "api.ckpt");
  ck_assert_int_eq(bp_trainer_save(t, ck), BP_OK);
  ck_assert_msg(bp_trainer_train_epoch(t, &r) == BP_OK, "%s", bp_last_error());
  ck_assert(bp_trainer_done(t));
  ck_assert_int_eq(bp_trainer_train_epoch(t, &r), BP_ERR_STATE);
  ck_assert_int_eq(bp_trainer_read_tensor(t, "fc.w", again, 7840), BP_OK);
  ck_assert(memcmp(w, again, sizeof w) != 0);
  ck_assert_int_eq(bp_trainer_load(t, ck), BP_OK);
  ck_assert_int_eq(bp_trainer_state(t).epoch, 1);
  ck_assert(!bp_trainer_done(t));
  ck_assert_int_eq(bp_trainer_read_tensor(t, "fc.w", again, 7840), BP_OK);
  ck_assert(memcmp(w, again, sizeof w) == 0);
  bp_eval_report ev;
  ck_assert_int_eq(bp_trainer_evaluate(t, &ev), BP_OK);
  ck_assert_int_eq(ev.samples, 100);
  bp_trainer_destroy(t);
  bp_trainer_destroy(NULL);

  o.ranks = 3; /* batch 50 over 3 ranks: an uneven split (17 + 17 + 16) is fine */
  ck_assert_msg(bp_trainer_create_from_file(e.model, &o, &t) == BP_OK, "%s", bp_last_error());
  ck_assert_int_eq(bp_trainer_world(t), 3);
  bp_trainer_destroy(t);
  t = (bp_trainer *)(uintptr_t)1;
  o.ranks = 1000;
  ck_assert_int_eq(bp_trainer_create_from_file(e.model, &o, &t), BP_ERR_UNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(bp_last_error(), "at most 64 ranks"));
  o.ranks = 1;
  o.eval_only = 1;
  ck_assert_int_eq(bp_trainer_create_from_file(e.model, &o, &t), BP_ERR_INVALID);
  o.eval_only = 0;
  o.lr = NAN;
  ck_assert_int_eq(bp_trainer_create_from_file(e.model, &o, &t), BP_ERR_INVALID);
  ck_assert_ptr_eq(t, (bp_trainer *)(uintptr_t)1);
  free(ck);
  toy_env_close(&e);
}
END_TEST

int main(void) {
  Suite *s = suite_create("train_resume");
  TCase *tc = tcase_create("train_resume");
  tcase_add_test(tc, same_seed_same_bytes);
  tcase_add_test(tc, resume_mid_epoch_is_exact);
  tcase_add_test(tc, resume_at_epoch_end_is_exact);
  tcase_add_test(tc, resume_with_ranks_is_exact);
  tcase_add_test(tc, bad_checkpoints_are_refused_and_kept);
  tcase_add_test(tc, a_checkpoint_holding_nan_weights_is_refused);
  tcase_add_test(tc, metrics_lines);
  tcase_add_test(tc, c_api_save_load_read);
  tcase_set_timeout(tc, 600);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
