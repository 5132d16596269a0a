/* Files that are not what they should be (docs/reliability.md): output
 * paths that are FIFOs or devices are refused and left intact, temporaries
 * of killed writers do not pile up, FIFOs given as inputs are refused
 * without blocking, and gzip/plain IDX files follow one trailing-bytes
 * rule. Each command runs under `timeout`, so a hang fails the test. */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "blueprint/checkpoint.h"
#include "blueprint/data.h"
#include "blueprint/model.h"
#include "blueprint/model_yaml.h"
#include "blueprint/outfile.h"
#include "run_util.h"

#define SMALL_MODEL TOY_BN_MODEL_LAYERS "train: {batch: 8, epochs: 1}\n"

static int is_fifo(const char *path) {
  struct stat sb;
  return lstat(path, &sb) == 0 && S_ISFIFO(sb.st_mode);
}

START_TEST(train_checkpoint_to_a_fifo_is_refused_and_the_fifo_stays) {
  toy_env e = toy_env_open(SMALL_MODEL, 64, 32, 1);
  char *fifo = path_in(e.dir, "ck.fifo");
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  run_result r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--checkpoint", fifo);
  expect_one_line_error(&r, "blueprint train:", "is a FIFO");
  ck_assert(is_fifo(fifo));
  run_free(&r);
  free(fifo);
  toy_env_close(&e);
}
END_TEST

START_TEST(plan_svg_and_metrics_to_a_fifo_or_dev_null_are_refused) {
  toy_env e = toy_env_open(SMALL_MODEL, 64, 32, 1);
  char *fifo = path_in(e.dir, "out.fifo"), *null_link = path_in(e.dir, "null.svg");
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  ck_assert_int_eq(symlink("/dev/null", null_link), 0);
  run_result r = RUN_T("plan", e.model, "--svg", fifo);
  ck_assert_msg(r.status != 0 && r.status < 124, "status %d", r.status);
  ck_assert_msg(strstr(r.err, "is a FIFO") != NULL, "stderr: %s", r.err);
  ck_assert(is_fifo(fifo));
  run_free(&r);
  r = RUN_T("plan", e.model, "--svg", null_link);
  ck_assert_msg(strstr(r.err, "is a character device") != NULL, "stderr: %s", r.err);
  run_free(&r);
  r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--metrics", fifo);
  expect_one_line_error(&r, "blueprint train:", "is a FIFO");
  ck_assert(is_fifo(fifo));
  run_free(&r);
  r = RUN_T("train", e.model, "--data", e.data, "--quiet", "--metrics", null_link);
  expect_one_line_error(&r, "blueprint train:", "is a character device");
  char target[64] = "";
  ck_assert_int_gt(readlink(null_link, target, sizeof target - 1), 0);
  ck_assert_str_eq(target, "/dev/null");
  run_free(&r);
  free(fifo);
  free(null_link);
  toy_env_close(&e);
}
END_TEST

static bp_plan *small_plan(void) {
  bp_model *m = NULL;
  ck_assert_int_eq(bp_model_parse(SMALL_MODEL, strlen(SMALL_MODEL), "small.yaml", &m), BP_OK);
  bp_compile_options co = bp_compile_options_from_model(m);
  bp_plan *p = NULL;
  ck_assert_msg(bp_model_compile(m, &co, &p) == BP_OK, "%s", bp_last_error());
  bp_model_destroy(m);
  return p;
}

START_TEST(a_killed_checkpoint_writer_leaves_no_temporary_behind) {
  bp_plan *p = small_plan();
  uint64_t total = bp_plan_total_bytes(p);
  unsigned char *arena = calloc(1, (size_t)total);
  ck_assert_ptr_nonnull(arena);
  bp_train_state s = {.seed = 1, .loss_scale = 1.0};
  char *dir = tmp_dir_create();
  char *ck = path_in(dir, "ck.bin");
  ck_assert_int_eq(bp_checkpoint_save(ck, p, arena, &s), BP_OK);
  /* writers killed mid-save: children that save in a loop, killed at
   * several moments; whatever each leaves, the next save sweeps it */
  int left = 0;
  for (int k = 0; k < 6; k++) {
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
      for (;;) (void)bp_checkpoint_save(ck, p, arena, &s);
    }
    usleep(2000 + 3000 * k);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    left += temps_in(dir);
  }
  /* and one that surely died holding a temporary: its pid, now free */
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, NULL, 0);
  char stale[4200];
  snprintf(stale, sizeof stale, "%s.tmp.%ld", ck, (long)dead);
  write_file(stale, "half", 4);
  ck_assert_int_ge(temps_in(dir), 1);
  ck_assert_int_eq(bp_checkpoint_save(ck, p, arena, &s), BP_OK);
  ck_assert_int_eq(temps_in(dir), 0);
  bp_checkpoint_info info;
  ck_assert_int_eq(bp_checkpoint_read_info(ck, &info), BP_OK);
  fprintf(stderr, "temporaries seen after kills: %d (all swept)\n", left);
  free(ck);
  tmp_dir_remove(dir);
  free(arena);
  bp_plan_destroy(p);
}
END_TEST

START_TEST(a_fifo_as_data_file_or_eval_checkpoint_is_refused_without_blocking) {
  toy_env e = toy_env_open(SMALL_MODEL, 64, 32, 1);
  char *images = path_in(e.data, "t10k-images-idx3-ubyte");
  ck_assert_int_eq(unlink(images), 0);
  ck_assert_int_eq(mkfifo(images, 0600), 0);
  alarm(30); /* a blocking open would hang here */
  bp_dataset *d = NULL;
  ck_assert_int_eq(bp_dataset_load_mnist(e.data, BP_DATA_TEST, &d), BP_ERR_IO);
  ck_assert_msg(strstr(bp_last_error(), "not a regular file") != NULL, "%s", bp_last_error());
  alarm(0);
  char *fifo = path_in(e.dir, "ck.fifo");
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  run_result r = RUN_T("eval", e.model, "--data", e.data, "--checkpoint", fifo);
  expect_one_line_error(&r, "blueprint eval:", "not a regular file");
  run_free(&r);
  free(fifo);
  free(images);
  toy_env_close(&e);
}
END_TEST

/* Gzips `path` into path.gz with `junk` bytes appended; removes `path`. */
static void gzip_with_junk(const char *path, const char *junk) {
  size_t n = 0;
  unsigned char *raw = read_file(path, &n);
  ck_assert_ptr_nonnull(raw);
  char gz[4200];
  snprintf(gz, sizeof gz, "%s.gz", path);
  gzFile g = gzopen(gz, "wb");
  ck_assert_ptr_nonnull(g);
  ck_assert_int_eq(gzwrite(g, raw, (unsigned)n), (int)n);
  ck_assert_int_eq(gzclose(g), Z_OK);
  if (junk[0]) {
    FILE *f = fopen(gz, "ab");
    fputs(junk, f);
    fclose(f);
  }
  unlink(path);
  free(raw);
}

START_TEST(gzip_and_plain_idx_files_follow_one_trailing_bytes_rule) {
  toy_env e = toy_env_open(SMALL_MODEL, 64, 32, 1);
  char *images = path_in(e.data, "t10k-images-idx3-ubyte");
  char *labels = path_in(e.data, "t10k-labels-idx1-ubyte");
  bp_dataset *d = NULL;
  /* a clean .gz loads, as does a .gz of two members */
  gzip_with_junk(images, "");
  ck_assert_int_eq(bp_dataset_load_mnist(e.data, BP_DATA_TEST, &d), BP_OK);
  bp_dataset_destroy(d);
  d = NULL;
  /* junk after the gzip member: refused, as trailing bytes of a plain file are */
  char gz[4200];
  snprintf(gz, sizeof gz, "%s.gz", images);
  FILE *f = fopen(gz, "ab");
  fputs("JUNK", f);
  fclose(f);
  ck_assert_int_eq(bp_dataset_load_mnist(e.data, BP_DATA_TEST, &d), BP_ERR_PARSE);
  ck_assert_msg(strstr(bp_last_error(), "trailing bytes") != NULL, "%s", bp_last_error());
  f = fopen(labels, "ab");
  fputs("JUNK", f);
  fclose(f);
  unlink(gz);
  symlink(gz, gz); /* a .gz that is a symlink loop: the loop is reported */
  ck_assert_int_eq(bp_dataset_load_mnist(e.data, BP_DATA_TEST, &d), BP_ERR_IO);
  ck_assert_msg(strstr(bp_last_error(), strerror(ELOOP)) != NULL, "%s", bp_last_error());
  free(images);
  free(labels);
  toy_env_close(&e);
}
END_TEST

START_TEST(output_check_accepts_regular_files_and_refuses_the_rest) {
  char *dir = tmp_dir_create();
  char *file = path_in(dir, "f"), *link = path_in(dir, "l"), *loop = path_in(dir, "loop");
  write_file(file, "x", 1);
  ck_assert_int_eq(symlink(file, link), 0);
  ck_assert_int_eq(symlink(loop, loop), 0);
  ck_assert_int_eq(bp_output_check(file, "test"), BP_OK);
  ck_assert_int_eq(bp_output_check(link, "test"), BP_OK);
  ck_assert_int_eq(bp_output_check("/nonexistent-dir-bp/x", "test"), BP_OK);
  ck_assert_int_eq(bp_output_check(dir, "test"), BP_ERR_IO);
  ck_assert_int_eq(bp_output_check("/dev/null", "test"), BP_ERR_IO);
  ck_assert_int_eq(bp_output_check(loop, "test"), BP_ERR_IO);
  ck_assert_int_eq(bp_output_open("/dev/null", "test", 0), -1);
  struct stat sb;
  ck_assert_int_eq(stat("/dev/null", &sb), 0);
  ck_assert(S_ISCHR(sb.st_mode));
  free(file);
  free(link);
  free(loop);
  tmp_dir_remove(dir);
}
END_TEST

START_TEST(a_path_of_kilobytes_is_shortened_and_the_reason_kept) {
  char path[3200] = "/nonexistent-bp";
  char part[202] = "/";
  memset(part + 1, 'a', 200);
  part[201] = '\0';
  for (int i = 0; i < 12; i++) strcat(path, part);
  strcat(path, "/model.yaml");
  ck_assert_uint_gt(strlen(path), 2048);
  run_result r = RUN_T("train", path);
  expect_one_line_error(&r, "blueprint train:", "...");
  ck_assert_msg(strstr(r.err, strerror(ENOENT)) != NULL, "the reason was lost: %s", r.err);
  ck_assert_uint_lt(strlen(r.err), 1100);
  run_free(&r);
  r = RUN_T("train", path, "--data", path, "--checkpoint", path);
  ck_assert_msg(strstr(r.err, strerror(ENOENT)) != NULL, "the reason was lost: %s", r.err);
  run_free(&r);
}
END_TEST

int main(void) {
  Suite *s = suite_create("hostile_files");
  TCase *tc = tcase_create("hostile_files");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, train_checkpoint_to_a_fifo_is_refused_and_the_fifo_stays);
  tcase_add_test(tc, plan_svg_and_metrics_to_a_fifo_or_dev_null_are_refused);
  tcase_add_test(tc, a_killed_checkpoint_writer_leaves_no_temporary_behind);
  tcase_add_test(tc, a_fifo_as_data_file_or_eval_checkpoint_is_refused_without_blocking);
  tcase_add_test(tc, gzip_and_plain_idx_files_follow_one_trailing_bytes_rule);
  tcase_add_test(tc, output_check_accepts_regular_files_and_refuses_the_rest);
  tcase_add_test(tc, a_path_of_kilobytes_is_shortened_and_the_reason_kept);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
