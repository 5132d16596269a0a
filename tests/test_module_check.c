/* The module file pre-check (core/src/elf_check.c, run by the loader before
 * dlopen): truncated and corrupted copies of a built module are refused or
 * load cleanly; none may kill the process (each load runs in a child). */
#include <check.h>
#include <elf.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blueprint/registry.h"
#include "blueprint/status.h"
#include "elf-check-impl.h"
#include "run_util.h"

/* A built module: tests/modules/registry/good.so. */
static unsigned char *module(size_t *size) {
  unsigned char *data = read_file(BP_TEST_MODULES "/registry/good.so", size);
  ck_assert_ptr_nonnull(data);
  return data;
}

/* Loads `path` in a child: 0 loaded, 1 refused at stage open by the
 * pre-check, 2 refused otherwise, 128 + signal when the child died. */
static int load_in_child(const char *path) {
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    alarm(20);
    bp_registry *r = NULL;
    if (bp_registry_create(&r) != BP_OK) _exit(3);
    int rc = 0;
    if (bp_registry_load(r, path) != BP_OK) {
      const bp_load_record *rec = bp_registry_record(r, bp_registry_record_count(r) - 1);
      rc = rec->stage == BP_LOAD_STAGE_OPEN && strstr(rec->message, "before dlopen") ? 1 : 2;
    }
    bp_registry_destroy(r);
    _exit(rc);
  }
  int ws;
  ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
  return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

/* The end of the farthest PT_LOAD's file bytes. */
static size_t loads_end(const unsigned char *data) {
  ElfW(Ehdr) eh;
  memcpy(&eh, data, sizeof eh);
  size_t end = 0;
  for (int i = 0; i < eh.e_phnum; i++) {
    ElfW(Phdr) ph;
    memcpy(&ph, data + eh.e_phoff + (size_t)i * sizeof ph, sizeof ph);
    if (ph.p_type == PT_LOAD && ph.p_offset + ph.p_filesz > end) end = ph.p_offset + ph.p_filesz;
  }
  return end;
}

START_TEST(the_built_module_passes_the_check_and_loads) {
  size_t size;
  unsigned char *data = module(&size);
  char why[256] = "";
  ck_assert_msg(bp_elf_check_mem(data, size, why, sizeof why) == 0, "%s", why);
  ck_assert_int_eq(load_in_child(BP_TEST_MODULES "/registry/good.so"), 0);
  free(data);
}
END_TEST

START_TEST(truncated_copies_are_refused_before_dlopen_and_none_crash) {
  size_t size;
  unsigned char *data = module(&size);
  size_t need = loads_end(data);
  char *dir = tmp_dir_create();
  char *path = path_in(dir, "cut.so");
  int points = 0, refused = 0;
  /* every 8 bytes of the headers, then about 200 points over the rest */
  for (size_t cut = 0; cut < size; cut += cut < 4096 ? 8 : (size / 200 + 1)) {
    write_file(path, data, cut);
    int rc = load_in_child(path);
    ck_assert_msg(rc < 128, "a copy cut at %zu of %zu bytes killed the loader (signal %d)", cut,
                  size, rc - 128);
    if (cut < need)
      ck_assert_msg(rc == 1, "a copy cut at %zu (segments need %zu) was not refused by the check",
                    cut, need);
    points++;
    refused += rc != 0;
  }
  ck_assert_int_gt(points, 100);
  ck_assert_int_gt(refused, 100);
  fprintf(stderr, "truncations: %d cases, %d refused, %d loaded, none crashed\n", points, refused,
          points - refused);
  free(path);
  tmp_dir_remove(dir);
  free(data);
}
END_TEST

START_TEST(flipped_header_bytes_are_refused_or_load_and_none_crash) {
  size_t size;
  unsigned char *data = module(&size);
  ElfW(Ehdr) eh;
  memcpy(&eh, data, sizeof eh);
  size_t span = eh.e_phoff + (size_t)eh.e_phnum * sizeof(ElfW(Phdr));
  ck_assert_uint_lt(span, size);
  char *dir = tmp_dir_create();
  char *path = path_in(dir, "flip.so");
  static const unsigned char masks[] = {0xff, 0x01, 0x10, 0x80};
  int cases = 0, refused = 0;
  for (size_t at = 0; at < span; at++)
    for (size_t m = 0; m < sizeof masks; m++) {
      data[at] ^= masks[m];
      write_file(path, data, size);
      int rc = load_in_child(path);
      data[at] ^= masks[m];
      ck_assert_msg(rc < 128, "flipping byte %zu with 0x%02x killed the loader (signal %d)", at,
                    masks[m], rc - 128);
      cases++;
      refused += rc != 0;
    }
  ck_assert_int_gt(cases, 1000);
  fprintf(stderr, "header flips: %d cases, %d refused, %d loaded, none crashed\n", cases, refused,
          cases - refused);
  free(path);
  tmp_dir_remove(dir);
  free(data);
}
END_TEST

START_TEST(a_fifo_is_refused_without_blocking) {
  char *dir = tmp_dir_create();
  char *path = path_in(dir, "fifo.so");
  ck_assert_int_eq(mkfifo(path, 0600), 0);
  int rc = load_in_child(path);
  ck_assert_msg(rc == 1 || rc == 2, "a FIFO module: %d", rc);
  free(path);
  tmp_dir_remove(dir);
}
END_TEST

START_TEST(plugin_dir_whose_modules_are_all_refused_fails_with_a_line) {
  char *dir = tmp_dir_create();
  char *a = path_in(dir, "a.so"), *b = path_in(dir, "b.so");
  write_file(a, "not an ELF file", 15);
  size_t size;
  unsigned char *data = module(&size);
  write_file(b, data, 100);
  run_result r = RUN("plugins", "--plugin", dir);
  ck_assert_int_ne(r.status, 0);
  ck_assert_int_lt(r.status, 128);
  ck_assert_msg(strstr(r.err, "no module") != NULL, "stderr: %s", r.err);
  run_free(&r);
  free(data);
  free(a);
  free(b);
  tmp_dir_remove(dir);
}
END_TEST

int main(void) {
  Suite *s = suite_create("module_check");
  TCase *tc = tcase_create("module_check");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, the_built_module_passes_the_check_and_loads);
  tcase_add_test(tc, truncated_copies_are_refused_before_dlopen_and_none_crash);
  tcase_add_test(tc, flipped_header_bytes_are_refused_or_load_and_none_crash);
  tcase_add_test(tc, a_fifo_is_refused_without_blocking);
  tcase_add_test(tc, plugin_dir_whose_modules_are_all_refused_fails_with_a_line);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
