/* Checkpoint writes that fail as a full disk or a broken file system does
 * (tests/faults/io_faults.c, an LD_PRELOAD shim): ENOSPC, a short write, a
 * failing fsync, a failing rename. Each time the previous checkpoint stays
 * byte for byte, no temporary is left, stderr holds one line and the exit
 * status is non-zero. Sanitizer builds skip it (their runtime must come
 * first in the process, before any preloaded library). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run_util.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define BP_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define BP_SANITIZED 1
#endif

#define MODEL TOY_BN_MODEL_LAYERS "train: {batch: 16, epochs: 2}\n"

START_TEST(failed_checkpoint_writes_keep_the_previous_checkpoint) {
#ifdef BP_SANITIZED
  printf("SKIP: sanitizer build\n");
  return;
#endif
  toy_env e = toy_env_open(MODEL, 64, 32, 3);
  char *ck = path_in(e.dir, "ck.bin");
  run_result r = RUN("train", e.model, "--data", e.data, "--quiet", "--epochs", "1",
                     "--checkpoint", ck);
  ck_assert_msg(r.status == 0, "%s", r.err);
  run_free(&r);
  size_t n0 = 0;
  unsigned char *before = read_file(ck, &n0);
  ck_assert_ptr_nonnull(before);
  static const char *const faults[] = {"enospc", "short", "fsync", "rename"};
  static const char *const needles[] = {"No space left", "No space left", "Input/output error",
                                        "Input/output error"};
  setenv("LD_PRELOAD", BP_IO_FAULTS_SHIM, 1);
  for (size_t k = 0; k < sizeof faults / sizeof faults[0]; k++) {
    setenv("BP_IO_FAULT", faults[k], 1);
    r = RUN("train", e.model, "--data", e.data, "--quiet", "--resume", ck, "--checkpoint", ck);
    expect_one_line_error(&r, "blueprint train:", needles[k]);
    run_free(&r);
    size_t n1 = 0;
    unsigned char *after = read_file(ck, &n1);
    ck_assert_msg(n1 == n0 && memcmp(before, after, n0) == 0,
                  "fault %s changed the previous checkpoint", faults[k]);
    free(after);
    ck_assert_msg(temps_in(e.dir) == 0, "fault %s left a temporary", faults[k]);
  }
  unsetenv("LD_PRELOAD");
  unsetenv("BP_IO_FAULT");
  /* and the checkpoint still resumes */
  r = RUN("train", e.model, "--data", e.data, "--quiet", "--resume", ck, "--checkpoint", ck);
  ck_assert_msg(r.status == 0, "%s", r.err);
  run_free(&r);
  free(before);
  free(ck);
  toy_env_close(&e);
}
END_TEST

int main(void) {
  Suite *s = suite_create("io_faults");
  TCase *tc = tcase_create("io_faults");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, failed_checkpoint_writes_keep_the_previous_checkpoint);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
