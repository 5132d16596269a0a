/* The fuzz corpora (fuzz/corpus/<target>/: seeds and every input a fuzzer
 * ever found) replayed through the same entry functions (fuzz/entries.h)
 * in the normal build, so a fixed finding stays fixed. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "entries.h"

static unsigned char *slurp(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, n = 0;
  unsigned char *buf = malloc(cap);
  for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
    n += got;
    if (n == cap) buf = realloc(buf, cap *= 2);
  }
  fclose(f);
  *size = n;
  return buf;
}

START_TEST(every_corpus_input_runs_cleanly_through_its_target) {
  const char *src = getenv("BP_SOURCE_DIR");
  ck_assert_msg(src != NULL, "BP_SOURCE_DIR is not set (run through ctest)");
  int total = 0;
  for (const bp_fuzz_target *t = bp_fuzz_targets; t->name; t++) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/fuzz/corpus/%s", src, t->name);
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "no corpus %s", dir);
    int files = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      if (e->d_name[0] == '.') continue;
      char path[8192];
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      size_t size = 0;
      unsigned char *data = slurp(path, &size);
      ck_assert_ptr_nonnull(data);
      ck_assert_int_eq(t->run(data, size), 0);
      free(data);
      files++;
    }
    closedir(d);
    ck_assert_msg(files > 0, "corpus %s is empty", dir);
    total += files;
  }
  fprintf(stderr, "%d corpus inputs replayed\n", total);
}
END_TEST

int main(void) {
  Suite *s = suite_create("fuzz_corpus");
  TCase *tc = tcase_create("fuzz_corpus");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, every_corpus_input_runs_cleanly_through_its_target);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
