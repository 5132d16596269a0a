/* `blueprint plugins` through the built binary (BP_BINARY_DIR), with
 * --plugin pointing at the purpose-built modules. */
#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "bp_abi.h"

static char out_text[1 << 16];

/* Runs `blueprint plugins ARGS` through the shell, stdout into out_text
 * and stderr into err_file; returns the exit status. */
static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...) {
  char args[2048], cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof cmd, "cd /tmp && '%s/blueprint' plugins %s 2>'%s/plugins.err'",
           getenv("BP_BINARY_DIR"), args, BP_TEST_MODULES);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  size_t n = fread(out_text, 1, sizeof out_text - 1, p);
  out_text[n] = '\0';
  int rc = pclose(p);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static const char *err_text(void) {
  static char text[4096];
  char path[1024];
  snprintf(path, sizeof path, "%s/plugins.err", BP_TEST_MODULES);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = '\0';
  fclose(f);
  return text;
}

static void has(const char *needle) {
  ck_assert_msg(strstr(out_text, needle) != NULL, "output lacks '%s':\n%s", needle, out_text);
}

START_TEST(lists_modules_kernels_and_default_picks) {
  unsetenv("BP_PLUGIN_PATH");
  ck_assert_int_eq(run("--plugin '%s/registry'", BP_TEST_MODULES), 0);
  char text[256];
  snprintf(text, sizeof text, "host ABI %d.%d", BP_ABI_MAJOR, BP_ABI_MINOR);
  has(text);
  has("explicit");
  has("/registry/good.so");
  snprintf(text, sizeof text,
           "name test-good, version 1.0, ABI built %d.%d, requires %d.0 (host %d.%d)",
           BP_ABI_MAJOR, BP_ABI_MINOR, BP_ABI_MAJOR, BP_ABI_MAJOR, BP_ABI_MINOR);
  has(text);
  has("[stage version]");
  snprintf(text, sizeof text,
           "module requires ABI %d.%d or newer (built with %d.%d); this host has ABI %d.%d",
           BP_ABI_MAJOR, BP_ABI_MINOR + 1, BP_ABI_MAJOR, BP_ABI_MINOR + 1, BP_ABI_MAJOR,
           BP_ABI_MINOR);
  has(text);
  has("[stage open]");
  has("bp_test_missing_function");
  has("duplicate kernel relu.fwd/good/cpu");
  has("test.double");
  has("relu.fwd");
  has("deterministic,in_place");
  has("default picks");
  ck_assert_str_eq(err_text(), "");
}
END_TEST

START_TEST(json_is_valid_and_complete) {
  unsetenv("BP_PLUGIN_PATH");
  ck_assert_int_eq(run("--json --plugin '%s/registry' --plugin='%s/select/sel.so'",
                       BP_TEST_MODULES, BP_TEST_MODULES),
                   0);
  has("\"format_version\": 1");
  has("\"status\": \"refused\", \"stage\": \"version\"");
  has("\"op\": \"relu.fwd\", \"impl\": \"good\", \"device\": \"cpu\", \"dtypes\": [\"fp32\"], "
      "\"priority\": 5, \"flags\": [\"deterministic\", \"in_place\"]");
  /* a default served only by a reference kernel (add.fwd has faster
   * kernels where ops/xnnpack is built) */
  has("\"op\": \"range.copy\", \"device\": \"cpu\", \"impl\": \"reference\"");
  has("\"reference\": true");
  if (system("command -v python3 >/dev/null 2>&1") != 0) return; /* no validator here */
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "cd /tmp && '%s/blueprint' plugins --json --plugin '%s/registry' | python3 -c '"
           "import json,sys; d=json.load(sys.stdin); "
           "assert d[\"host_abi\"]=={\"major\":%d,\"minor\":%d}; "
           "m={x[\"path\"].rsplit(\"/\",1)[-1]:x for x in d[\"modules\"]}; "
           "assert m[\"good.so\"][\"status\"]==\"loaded\"; "
           "assert m[\"newer.so\"][\"abi_minor_required\"]==%d; "
           "assert m[\"noentry.so\"][\"stage\"]==\"symbol\"; "
           "assert any(o[\"name\"]==\"test.double\" for o in d[\"ops\"]); "
           "assert any(k[\"impl\"]==\"older\" for k in d[\"kernels\"]); "
           "assert all(set(x)>={\"op\",\"device\",\"impl\"} for x in d[\"defaults\"])'",
           getenv("BP_BINARY_DIR"), BP_TEST_MODULES, BP_ABI_MAJOR, BP_ABI_MINOR,
           BP_ABI_MINOR + 1);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(works_with_no_module_given) {
  unsetenv("BP_PLUGIN_PATH");
  ck_assert_int_eq(run("%s", ""), 0);
  has("modules:");
  ck_assert_int_eq(run("--json"), 0);
  has("\"modules\": [");
  if (system("command -v python3 >/dev/null 2>&1") == 0) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s/blueprint' plugins --json | python3 -m json.tool >/dev/null",
             getenv("BP_BINARY_DIR"));
    ck_assert_int_eq(system(cmd), 0);
  }
}
END_TEST

START_TEST(kernels_for_a_device_no_plugin_provides_are_reported) {
  unsetenv("BP_PLUGIN_PATH");
  /* tests/modules/plugins/nodev.so: two kernels on "npu", one on cpu */
  ck_assert_int_eq(run("--plugin '%s/plugins'", BP_TEST_MODULES), 0);
  has("device kinds with kernels but no device plugin: 1\n");
  has("  npu        2 kernels, no device plugin of this kind loaded\n");
  /* (cpu is not counted: its plugin loads from beside the library) */
  ck_assert_int_eq(run("--json --plugin '%s/plugins'", BP_TEST_MODULES), 0);
  has("\"devices_without_plugin\": [\n    {\"kind\": \"npu\", \"kernels\": 2}\n  ]");
  has("\"source\": \"explicit\"");
  /* every kind has a plugin: the section is absent, the JSON list empty */
  ck_assert_int_eq(run("--json --plugin '%s/select/sel.so'", BP_TEST_MODULES), 0);
  has("\"devices_without_plugin\": []");
  ck_assert_int_eq(run("--plugin '%s/select/sel.so'", BP_TEST_MODULES), 0);
  ck_assert_ptr_null(strstr(out_text, "no device plugin"));
}
END_TEST

/* tests/modules/guarddev.c offers one transport, "threads", for ranks on
 * several devices or several on one; the cpu device offers none (the host's
 * communicators serve it) */
START_TEST(devices_list_their_collective_transports) {
  unsetenv("BP_PLUGIN_PATH");
  ck_assert_int_eq(run("--plugin '%s/guarded/guarddev.so'", BP_TEST_MODULES), 0);
  has("  guarded    ");
  has("\n             collective transport threads: ranks on several devices; several ranks on "
      "one device\n");
  ck_assert_int_eq(run("--json --plugin '%s/guarded/guarddev.so'", BP_TEST_MODULES), 0);
  has("\"transports\": [{\"backend\": \"threads\", \"spans_processes\": false, "
      "\"spans_devices\": true, \"shares_device\": true}]}");
  has("bp_device_cpu.so\", \"transports\": []}");
}
END_TEST

START_TEST(refused_explicit_module_fails_after_listing) {
  ck_assert_int_eq(run("--plugin '%s/registry/bad.so'", BP_TEST_MODULES), 1);
  has("refused");
  const char *e = err_text();
  ck_assert_ptr_nonnull(strstr(e, "blueprint plugins: "));
  ck_assert_ptr_nonnull(strstr(e, "bad.so"));
  ck_assert_ptr_eq(strchr(e, '\n'), e + strlen(e) - 1); /* one line */
}
END_TEST

START_TEST(bad_command_lines_exit_2) {
  ck_assert_int_eq(run("--bogus"), 2);
  ck_assert_ptr_nonnull(strstr(err_text(), "unknown argument '--bogus'"));
  ck_assert_int_eq(run("--plugin"), 2);
  ck_assert_ptr_nonnull(strstr(err_text(), "--plugin needs a path"));
  ck_assert_int_eq(run("--help"), 0);
  has("usage: blueprint plugins");
}
END_TEST

#ifdef BP_TEST_GPU_MODULES
/* The cuDNN and cuBLAS modules (built with CUDA) are discovered beside the
 * library: loaded where a GPU is usable, else refused at init with their
 * own reason (no device, driver or library), and the listing still exits
 * 0. */
START_TEST(gpu_modules_are_loaded_or_refused_with_their_reason) {
  unsetenv("BP_PLUGIN_PATH");
  ck_assert_int_eq(run("%s", ""), 0);
  static const char *const mods[][2] = {{"/bp_ops_cudnn.so", "ops-cudnn: "},
                                        {"/bp_ops_cublas.so", "ops-cublas: "},
                                        {"/bp_ops_allreduce_cuda.so", "ops-allreduce-cuda: "},
#ifdef BP_TEST_NCCL_MODULE /* built where NCCL was found */
                                        {"/bp_ops_allreduce_nccl.so", "ops-allreduce-nccl: "},
#endif
  };
  for (size_t i = 0; i < sizeof mods / sizeof mods[0]; i++) {
    const char *at = strstr(out_text, mods[i][0]);
    ck_assert_msg(at != NULL, "%s is not listed:\n%s", mods[i][0], out_text);
    const char *line = at;
    while (line > out_text && line[-1] != '\n') line--;
    if (strncmp(line, "  refused", 9) == 0) {
      char reason[96];
      snprintf(reason, sizeof reason, "init failed with status %d: %s", BP_ABI_ERR_UNSUPPORTED,
               mods[i][1]);
      ck_assert_msg(strstr(at, reason) != NULL, "%s refused without its reason:\n%s",
                    mods[i][0], out_text);
    } else {
      ck_assert_msg(strncmp(line, "  loaded", 8) == 0, "%s: %.80s", mods[i][0], line);
    }
  }
}
END_TEST
#endif

int main(void) {
  Suite *s = suite_create("cmd_plugins");
  TCase *tc = tcase_create("cmd_plugins");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, lists_modules_kernels_and_default_picks);
  tcase_add_test(tc, json_is_valid_and_complete);
  tcase_add_test(tc, works_with_no_module_given);
  tcase_add_test(tc, kernels_for_a_device_no_plugin_provides_are_reported);
  tcase_add_test(tc, devices_list_their_collective_transports);
  tcase_add_test(tc, refused_explicit_module_fails_after_listing);
  tcase_add_test(tc, bad_command_lines_exit_2);
#ifdef BP_TEST_GPU_MODULES
  tcase_add_test(tc, gpu_modules_are_loaded_or_refused_with_their_reason);
#endif
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
